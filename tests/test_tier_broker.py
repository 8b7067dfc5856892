"""Delta tiering on the broker side: topic configs, tier-gated local retention, the
ZooKeeper progress records and lease, DescribeTier and ``Admin.describe_tier``, metrics.

The log-level tests use a fake clock; the rest run against a real ZooKeeper and real
broker processes (one small cluster for the module, each test on its own topics).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from brokers.errors import InvalidConfigError
from brokers.log import LogConfig, PartitionLog
from tests.test_partition_log import FakeClock, _batch, _log_files, _three_closed_segments

# ----------------------------------------------------------------------- topic configs


def test_tier_configs_default_to_the_old_behaviour() -> None:
    config = LogConfig.from_mapping({})
    assert (config.tier_enable, config.tier_after_ms) == (False, 600_000)
    assert (config.local_retention_ms, config.local_retention_bytes) == (-2, -2)
    assert config.effective_local_retention_ms == config.retention_ms
    assert config.effective_local_retention_bytes == config.retention_bytes == -1
    # Without tiering the local.* keys are accepted but not cross-checked.
    assert LogConfig.from_mapping({"retention.ms": "10", "local.retention.ms": "-1"}) \
        .local_retention_ms == -1


@pytest.mark.parametrize(("values", "words"), [
    ({"tier.enable": "yes"}, "tier.enable='yes' is not valid; accepted: true, false"),
    ({"tier.after.ms": "-1"}, "tier.after.ms='-1' is out of range"),
    ({"local.retention.ms": "-3"}, "-2 \\(same as retention.ms\\)"),
    ({"local.retention.bytes": "x"}, "local.retention.bytes='x' is not valid"),
    ({"tier.enable": "true", "retention.ms": "1000", "local.retention.ms": "1001"},
     "local.retention.ms=1001 exceeds retention.ms=1000"),
    ({"tier.enable": "true", "retention.ms": "1000", "local.retention.ms": "-1"},
     "local.retention.ms=-1 \\(unlimited\\) exceeds retention.ms=1000"),
    ({"tier.enable": "true", "retention.bytes": "100", "local.retention.bytes": "200"},
     "local.retention.bytes=200 exceeds retention.bytes=100"),
])
def test_bad_tier_configs_are_rejected(values: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidConfigError, match=words):
        LogConfig.from_mapping(values)


def test_valid_tier_configs() -> None:
    config = LogConfig.from_mapping({"tier.enable": "true", "retention.ms": "-1",
                                     "local.retention.ms": "-1", "tier.after.ms": "0"})
    assert config.effective_local_retention_ms == -1 and config.tier_after_ms == 0
    config = LogConfig.from_mapping({"tier.enable": "true", "retention.ms": "1000",
                                     "local.retention.ms": "1000"})
    assert config.effective_local_retention_ms == 1000
    assert config.to_mapping()["tier.enable"] == "true"


# ----------------------------------------------------------------------- tiered retention

_TIERED = LogConfig(tier_enable=True, retention_ms=-1, local_retention_ms=20_000)


def test_tiered_retention_deletes_nothing_without_progress(tmp_path: Path) -> None:
    clock = FakeClock(10_000_000)
    log, _ = _three_closed_segments(tmp_path, clock, _TIERED)
    clock.now += 10**9
    assert log.apply_retention() == []
    assert log.apply_retention(None) == []
    assert log.log_start_offset == 0 and len(log.segments) == 4


def test_tiered_retention_needs_both_tiered_and_expired(tmp_path: Path) -> None:
    clock = FakeClock(10_000_000)
    # Segments [0,4) [4,8) [8,12) closed, with newest records 50 s, 30 s, 10 s old.
    log, _ = _three_closed_segments(tmp_path, clock, _TIERED)
    assert log.apply_retention(tiered_up_to=3) == []  # [0,4) is only partly in the table
    assert log.apply_retention(tiered_up_to=4) == [0]
    assert log.apply_retention(tiered_up_to=16) == [4]  # [8,12) is tiered but too young
    assert log.log_start_offset == 8
    clock.now += 10**9
    assert log.apply_retention(tiered_up_to=16) == [8]  # never the active segment
    assert [s.base_offset for s in log.segments] == [12]
    assert _log_files(tmp_path) == ["00000000000000000012.log"]


def test_tiered_retention_ignores_total_retention(tmp_path: Path) -> None:
    """retention.ms/bytes belong to the table: locally only local.retention.* counts."""
    clock = FakeClock(10_000_000)
    config = LogConfig(tier_enable=True, retention_ms=20_000, retention_bytes=0,
                       local_retention_ms=20_000, local_retention_bytes=-1)
    log, _ = _three_closed_segments(tmp_path, clock, config)
    assert log.apply_retention(tiered_up_to=0) == []  # expired by time but not tiered
    assert log.log_start_offset == 0


def test_tiered_retention_by_local_bytes_stops_at_the_first_untiered(tmp_path: Path) -> None:
    clock = FakeClock()
    log, _ = _three_closed_segments(tmp_path, clock, LogConfig(retention_ms=-1))
    sizes = [s.size for s in log.segments]
    log.close()
    config = LogConfig(tier_enable=True, retention_ms=-1, local_retention_ms=-1,
                       local_retention_bytes=0)
    log = PartitionLog(tmp_path, config, clock=clock)
    assert log.apply_retention(tiered_up_to=8) == [0, 4]
    assert log.size_bytes == sizes[2] + sizes[3]
    assert log.apply_retention(tiered_up_to=11) == []
    log.close()
    config = LogConfig(tier_enable=True, retention_ms=-1, local_retention_ms=-1,
                       local_retention_bytes=sizes[3] + 1)
    log = PartitionLog(tmp_path, config, clock=clock)
    assert log.apply_retention(tiered_up_to=16) == []  # would go below the limit
    log.close()
    config = dataclasses.replace(config, local_retention_bytes=sizes[3])
    log = PartitionLog(tmp_path, config, clock=clock)
    assert log.apply_retention(tiered_up_to=16) == [8]
    assert log.log_start_offset == 12


def test_closed_segments_reports_every_closed_segment(tmp_path: Path) -> None:
    clock = FakeClock(10_000_000)
    log, stamps = _three_closed_segments(tmp_path, clock, LogConfig(retention_ms=-1))
    summaries = log.closed_segments()
    assert [(s.base_offset, s.next_offset, s.max_timestamp) for s in summaries] == \
        [(0, 4, stamps[0]), (4, 8, stamps[1]), (8, 12, stamps[2])]
    assert [s.size_bytes for s in summaries] == [s.size for s in log.segments[:-1]]
    log.append(_batch(1, ts=clock.now))
    assert len(log.closed_segments()) == 3  # the active segment never shows
