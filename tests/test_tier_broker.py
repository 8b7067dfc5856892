"""Delta tiering on the broker side: topic configs, tier-gated local retention, the
ZooKeeper progress records and lease, DescribeTier and ``Admin.describe_tier``, metrics.

The log-level tests use a fake clock; the rest run against a real ZooKeeper and real
broker processes (one small cluster for the module, each test on its own topics).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokers.coordination import Coordinator, TierProgress, TopicDefinition
from brokers.errors import InvalidConfigError, TierJobBusyError, UnknownTopicOrPartitionError
from brokers.log import LogConfig, PartitionLog
from tests.test_partition_log import FakeClock, _batch, _log_files, _three_closed_segments
from zookeeper.launcher import ZooKeeperServer

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


# ----------------------------------------------------------------------- ZooKeeper records


@pytest.fixture
def coordinator(zookeeper_server: ZooKeeperServer) -> Iterator[Coordinator]:
    c = Coordinator(zookeeper_server.connect_string, session_timeout_ms=4000)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _zk_topic(coordinator: Coordinator, partitions: int = 2) -> str:
    name = f"tierzk-{uuid.uuid4().hex[:8]}"
    coordinator.create_topic(TopicDefinition(name, uuid.uuid4().hex,
                                             {p: [1] for p in range(partitions)}), {})
    return name


def test_tier_table_and_progress_only_move_forward(coordinator: Coordinator) -> None:
    name = _zk_topic(coordinator)
    assert coordinator.tier_table(name) is None
    assert coordinator.tier_progress(name) == {}
    first = coordinator.advance_tier_progress(name, 1, tiered_up_to=100, tier_start=10)
    assert (first.tiered_up_to, first.tier_start) == (100, 10) and first.updated_ms > 0
    assert coordinator.tier_table(name) is None  # the parent exists, the table not yet
    coordinator.set_tier_table(name, "file:///tmp/t1")
    coordinator.set_tier_table(name, "file:///tmp/t2")
    assert coordinator.tier_table(name) == "file:///tmp/t2"
    # A smaller value keeps the stored one; each offset moves on its own.
    kept = coordinator.advance_tier_progress(name, 1, tiered_up_to=50, tier_start=5)
    assert kept == first
    moved = coordinator.advance_tier_progress(name, 1, tiered_up_to=60, tier_start=60)
    assert (moved.tiered_up_to, moved.tier_start) == (100, 60)
    assert coordinator.tier_progress(name) == {1: moved}
    with pytest.raises(ValueError, match="tier_start"):
        coordinator.advance_tier_progress(name, 0, tiered_up_to=5, tier_start=6)
    with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
        coordinator.advance_tier_progress("no-such-topic-x", 0, tiered_up_to=1, tier_start=0)
    assert coordinator.tier_table("no-such-topic-x") is None


def test_concurrent_progress_writers_keep_the_maximum(
        zookeeper_server: ZooKeeperServer, coordinator: Coordinator) -> None:
    name = _zk_topic(coordinator, 1)
    other = Coordinator(zookeeper_server.connect_string, session_timeout_ms=4000)
    other.start()
    try:
        def write(c: Coordinator, values: range) -> None:
            for v in values:
                c.advance_tier_progress(name, 0, tiered_up_to=v, tier_start=v // 2)

        threads = [threading.Thread(target=write, args=(c, range(k, 60, 2)))
                   for k, c in enumerate((coordinator, other))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        stored = coordinator.tier_progress(name)[0]
        assert (stored.tiered_up_to, stored.tier_start) == (59, 29)
    finally:
        other.stop()


def test_deleting_a_topic_removes_its_tier_records(coordinator: Coordinator) -> None:
    name = _zk_topic(coordinator)
    coordinator.set_tier_table(name, "file:///tmp/gone")
    coordinator.advance_tier_progress(name, 0, tiered_up_to=7, tier_start=0)
    coordinator.delete_topic(name)
    assert coordinator.tier_table(name) is None
    assert coordinator.tier_progress(name) == {}
    assert coordinator.zk.exists(f"/strata/tier/topics/{name}") is None


def test_tier_lease_is_exclusive_and_dies_with_the_session(
        zookeeper_server: ZooKeeperServer, coordinator: Coordinator) -> None:
    name = _zk_topic(coordinator, 1)
    other = Coordinator(zookeeper_server.connect_string, session_timeout_ms=4000)
    other.start()
    try:
        with coordinator.tier_lease(name, "job-a@host1"):
            with pytest.raises(TierJobBusyError, match="job-a@host1") as caught, \
                    other.tier_lease(name, "job-b"):
                pass
            assert caught.value.code == 1108 and "wait for it" in caught.value.message
        with other.tier_lease(name, "job-b"):  # released on exit
            pass
        holder = Coordinator(zookeeper_server.connect_string, session_timeout_ms=4000)
        holder.start()
        lease = holder.tier_lease(name, "job-c")
        lease.__enter__()
        holder.zk.stop()  # the session ends without releasing: ZooKeeper drops the node
        holder.zk.close()
        with other.tier_lease(name, "job-b"):
            pass
    finally:
        other.stop()


def test_tier_progress_record_type() -> None:
    assert TierProgress(5, 3, 1) == TierProgress(tiered_up_to=5, tier_start=3, updated_ms=1)
