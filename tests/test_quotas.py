"""Client quotas (brokers/quotas.py) without a broker: which quota applies, the measured
rate over the sliding window, and the throttle that brings it back to the quota."""

from __future__ import annotations

import pytest

from brokers.quotas import DEFAULT, QuotaManager

pytestmark = pytest.mark.unit


def test_no_quota_no_throttle() -> None:
    assert QuotaManager().record("producer_byte_rate", "User:a", "c", 10**9, now=0) == 0


def test_the_most_specific_quota_applies() -> None:
    quotas = QuotaManager()
    quotas.replace({("a", None): {"producer_byte_rate": 1000.0},
                    (None, "c"): {"producer_byte_rate": 10.0},
                    (DEFAULT, None): {"producer_byte_rate": 100.0}})
    assert quotas.record("producer_byte_rate", "User:a", "c", 500, now=100.0) == 0  # user
    assert quotas.record("producer_byte_rate", "User:b", "c", 500, now=100.0) > 0  # client
    assert quotas.record("producer_byte_rate", "User:b", "other", 50, now=100.0) == 0
    assert quotas.record("consumer_byte_rate", "User:a", "c", 10**9, now=100.0) == 0


def test_the_throttle_brings_the_rate_back_to_the_quota() -> None:
    quotas = QuotaManager()
    quotas.replace({("a", None): {"producer_byte_rate": 100.0}})
    # 300 bytes in the first second: rate 300/s against 100/s -> wait (300-100)/100 * 1 s.
    assert quotas.record("producer_byte_rate", "User:a", "c", 300, now=50.0) == 2000
    # Three seconds later the window holds 300 bytes over 3.x s: under the quota again.
    assert quotas.record("producer_byte_rate", "User:a", "c", 1, now=53.5) == 0
    # Old samples leave the window (11 s): a burst much later is measured on its own.
    assert quotas.record("producer_byte_rate", "User:a", "c", 100, now=80.0) == 0


def test_throttles_are_capped() -> None:
    quotas = QuotaManager()
    quotas.replace({(None, "c"): {"request_rate": 1.0}})
    assert quotas.record("request_rate", "User:x", "c", 10**6, now=0.0) == 30_000
