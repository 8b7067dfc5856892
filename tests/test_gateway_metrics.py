"""The gateway's metrics gather observations in the worker and apply them in bulk
(``ingest_gateway/_metrics.py``): what ``/metrics`` renders must be exactly what
prometheus-client renders for the same observations made one by one."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import Counter, Histogram

from ingest_gateway._metrics import GatewayMetrics, _check_histogram_internals

pytestmark = pytest.mark.unit


def _series(text: bytes) -> dict[str, float]:
    """Every sample line but the ``_created`` timestamps, as name{labels} -> value."""
    out: dict[str, float] = {}
    for line in text.decode().splitlines():
        if line.startswith("#") or not line.strip() or "_created" in line:
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def _reference(requests: list[tuple[str, int, float]], batches: list[int]) -> GatewayMetrics:
    """The same metrics, each observation made directly on prometheus-client."""
    metrics = GatewayMetrics()
    for route, status, seconds in requests:
        metrics.requests.labels("POST", route, str(status)).inc()
        metrics.latency.labels("POST", route).observe(seconds)
    for records in batches:
        metrics.batch_records.observe(records)
    return metrics


latencies = st.one_of(
    st.sampled_from([0.0, 0.001, 0.0025, 0.005, 0.01, 30.0, 30.000001, 1e9]),
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(st.tuples(st.sampled_from(["/a", "/b"]), st.sampled_from([200, 422]),
                                   latencies), max_size=40),
       batches=st.lists(st.integers(min_value=1, max_value=20_000), max_size=20),
       flush_every=st.integers(min_value=1, max_value=50))
def test_gathered_observations_render_as_direct_ones(
        requests: list[tuple[str, int, float]], batches: list[int], flush_every: int) -> None:
    gathered = GatewayMetrics()
    for i, (route, status, seconds) in enumerate(requests):
        gathered.observe("POST", route, status, seconds)
        if i % flush_every == 0:
            gathered.flush()  # flushes in between must not lose or double anything
    for records in batches:
        gathered.batch(records)
    got = _series(gathered.render())
    want = _series(_reference(requests, batches).render())
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert math.isclose(got[name], value, rel_tol=1e-9, abs_tol=1e-9), name


def test_nothing_is_visible_before_a_flush_and_everything_after() -> None:
    metrics = GatewayMetrics()
    metrics.observe("POST", "/r", 200, 0.003)
    metrics.batch(7)
    assert metrics.latency.labels("POST", "/r")._sum.get() == 0.0  # gathered, not applied
    series = _series(metrics.render())  # render flushes first
    assert series['strata_gateway_request_seconds_bucket{le="0.005",method="POST",route="/r"}'] \
        == 1.0
    assert series['strata_gateway_batch_records_bucket{le="10.0"}'] == 1.0
    assert series["strata_gateway_batch_records_sum"] == 7.0


def test_a_histogram_without_the_expected_internals_is_refused_at_start() -> None:
    histogram = Histogram("h", "h", registry=None)
    _check_histogram_internals(histogram)  # the pinned prometheus-client passes
    with pytest.raises(RuntimeError, match="changed its internals"):
        _check_histogram_internals(Counter("c", "c", registry=None))
