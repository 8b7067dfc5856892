"""Delta tiering on the broker side: topic configs, tier-gated local retention, the
ZooKeeper progress records and lease, DescribeTier and ``Admin.describe_tier``, the
lease and progress through the brokers (TierLease, UpdateTier), metrics.

The log-level tests use a fake clock; the rest run against a real ZooKeeper and real
broker processes (one small cluster for the module, each test on its own topics).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from brokers.coordination import TierProgress, TopicDefinition, ZooKeeperClient
from brokers.log import LogConfig, PartitionLog
from strata.client import Admin, NewTopic, TopicTier
from tests.support.broker_process import BrokerProcess
from tests.test_partition_log import FakeClock, _batch, _log_files, _three_closed_segments
from wire.connection import BrokerConnection
from wire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    NotLeaderError,
    TierJobBusyError,
    TierLeaseLostError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    ApiKey,
    DescribeTierRequest,
    DescribeTierResponse,
    DescribeTierTopic,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
)
from wire.record_batch import build_batch
from zookeeper.launcher import ZooKeeperServer

pytestmark = pytest.mark.integration

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
    ({"tier.enable": "true", "retention.bytes": "100", "local.retention.bytes": "50"},
     "retention.bytes=100 is not enforced on the Delta table"),
    ({"tier.enable": "true", "cleanup.policy": "compact,delete"},
     "cleanup.policy=compact,delete is not supported with tier.enable=true"),
    ({"tier.enable": "true", "delete.retention.ms": "-1"}, "delete.retention.ms='-1' is out"),
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
def coordinator(zookeeper_server: ZooKeeperServer) -> Iterator[ZooKeeperClient]:
    c = ZooKeeperClient(zookeeper_server.connect_string, session_timeout_ms=4000)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _zk_topic(coordinator: ZooKeeperClient, partitions: int = 2) -> str:
    name = f"tierzk-{uuid.uuid4().hex[:8]}"
    coordinator.create_topic(TopicDefinition(name, uuid.uuid4().hex,
                                             {p: [1] for p in range(partitions)}), {})
    return name


def test_tier_table_and_progress_only_move_forward(coordinator: ZooKeeperClient) -> None:
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
        zookeeper_server: ZooKeeperServer, coordinator: ZooKeeperClient) -> None:
    name = _zk_topic(coordinator, 1)
    other = ZooKeeperClient(zookeeper_server.connect_string, session_timeout_ms=4000)
    other.start()
    try:
        def write(c: ZooKeeperClient, values: range) -> None:
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


def test_deleting_a_topic_removes_its_tier_records(coordinator: ZooKeeperClient) -> None:
    name = _zk_topic(coordinator)
    coordinator.set_tier_table(name, "file:///tmp/gone")
    coordinator.advance_tier_progress(name, 0, tiered_up_to=7, tier_start=0)
    coordinator.delete_topic(name)
    assert coordinator.tier_table(name) is None
    assert coordinator.tier_progress(name) == {}
    assert coordinator.zk.exists(f"/strata/tier/topics/{name}") is None


def test_tier_lease_is_exclusive_expires_and_fences_progress(
        coordinator: ZooKeeperClient) -> None:
    name = _zk_topic(coordinator, 1)
    lease_a, topic_id, compacted = coordinator.acquire_tier_lease(name, "job-a@host1", 60_000)
    assert topic_id == coordinator.get_topic(name).topic_id and compacted == {}
    with pytest.raises(TierJobBusyError, match="job-a@host1") as caught:
        coordinator.acquire_tier_lease(name, "job-b", 60_000)
    assert caught.value.code == 1108 and "wait for it" in caught.value.message
    # Progress moves only under the lease that is current, in the write's transaction.
    coordinator.advance_tier_progress(name, 0, tiered_up_to=5, tier_start=0,
                                      topic_id=topic_id, lease_id=lease_a)
    with pytest.raises(TierLeaseLostError):
        coordinator.advance_tier_progress(name, 0, tiered_up_to=9, tier_start=0,
                                          topic_id=topic_id, lease_id="not-the-lease")
    with pytest.raises(TierLeaseLostError):
        coordinator.advance_compaction_progress(name, 0, 5, lease_id="not-the-lease")
    assert coordinator.tier_progress(name)[0].tiered_up_to == 5
    # A lease nobody renews expires; another job takes it, and the old one is fenced.
    coordinator.renew_tier_lease(name, lease_a, 200)
    time.sleep(0.3)
    lease_b, _, _ = coordinator.acquire_tier_lease(name, "job-b", 60_000)
    with pytest.raises(TierLeaseLostError, match="job-b holds the topic now"):
        coordinator.renew_tier_lease(name, lease_a, 60_000)
    with pytest.raises(TierLeaseLostError):
        coordinator.advance_tier_progress(name, 0, tiered_up_to=9, tier_start=0,
                                          topic_id=topic_id, lease_id=lease_a)
    coordinator.release_tier_lease(name, lease_a)  # not its lease any more: nothing happens
    assert coordinator.advance_compaction_progress(name, 0, 5, lease_id=lease_b) == 5
    coordinator.release_tier_lease(name, lease_b)
    lease_c, _, compacted = coordinator.acquire_tier_lease(name, "job-c", 60_000)
    assert compacted == {0: 5}
    # Deleting the topic takes the lease with it.
    coordinator.delete_topic(name)
    with pytest.raises(TierLeaseLostError):
        coordinator.renew_tier_lease(name, lease_c, 60_000)
    with pytest.raises(UnknownTopicOrPartitionError):
        coordinator.acquire_tier_lease(name, "job-d", 60_000)


def test_tier_progress_record_type() -> None:
    assert TierProgress(5, 3, 1) == TierProgress(tiered_up_to=5, tier_start=3, updated_ms=1)


# ----------------------------------------------------------------------- real brokers

# Each batch below is larger than segment.bytes (its minimum, 1024), so every batch gets
# a segment of its own: [0,5) [5,10) [10,15) ... with the last one active.
_RECORDS_PER_BATCH = 5
_SEGMENT_BYTES = "1024"
_BROKER_IDS = (11, 12)


@pytest.fixture(scope="module")
def brokers(zookeeper_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[int, BrokerProcess]]:
    """Two brokers for the module; retention runs every 100 ms so tests wait little."""
    started: dict[int, BrokerProcess] = {}
    try:
        for broker_id in _BROKER_IDS:
            started[broker_id] = BrokerProcess(
                zookeeper_server.connect_string, tmp_path_factory.mktemp(f"tier{broker_id}"),
                broker_id, overrides={"log.retention.check.interval.ms": "100"}).start()
        yield started
    finally:
        for process in started.values():
            process.kill()


@pytest.fixture(scope="module")
def admin(brokers: dict[int, BrokerProcess]) -> Iterator[Admin]:
    with Admin([b.bootstrap for b in brokers.values()], request_timeout_ms=15_000) as client:
        yield client


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create(admin: Admin, name: str, partitions: int = 1, replication: int = 1,
            **configs: str) -> None:
    admin.create_topics([NewTopic(name, partitions, replication, {
        "segment.bytes": _SEGMENT_BYTES, **{k.replace("_", "."): v for k, v in configs.items()}})])


def _leader(admin: Admin, brokers: dict[int, BrokerProcess], topic: str, p: int
            ) -> BrokerProcess:
    return brokers[admin.describe_topics([topic])[topic].partitions[p].leader]


def _produce(broker: BrokerProcess, topic: str, p: int, timestamps: list[int]) -> None:
    """One batch per timestamp, each of ``_RECORDS_PER_BATCH`` records, acks=all."""
    async def send() -> None:
        async with BrokerConnection("127.0.0.1", broker.port) as connection:
            for ts in timestamps:
                batch = build_batch([bytes(300)] * _RECORDS_PER_BATCH,
                                    timestamps=[ts - 5] * (_RECORDS_PER_BATCH - 1) + [ts])
                for _ in range(200):
                    response = await connection.request(ApiKey.PRODUCE, ProduceRequest(
                        -1, 10_000, [ProduceTopic(topic, [ProducePartition(p, batch)])]))
                    assert isinstance(response, ProduceResponse)
                    answer = response.topics[0].partitions[0]
                    # A leader learns of a new topic through its own ZooKeeper watch, a
                    # moment after the broker that answered CreateTopics: retriable, as
                    # UNKNOWN_TOPIC_OR_PARTITION is in Kafka, and so is NOT_LEADER
                    # while it has yet to apply the state the metadata already shows.
                    if answer.error_code not in (3, 6):
                        break
                    await asyncio.sleep(0.05)
                assert answer.error_code == 0, answer

    asyncio.run(asyncio.wait_for(send(), 30))


def _segment_files(broker: BrokerProcess, topic: str, p: int) -> list[int]:
    return sorted(int(f.name[:-4]) for f in (broker.data_dir / f"{topic}-{p}").glob("*.log"))


def _wait(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _metric(broker: BrokerProcess, name: str, topic: str, p: int) -> float | None:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()
    found = re.search(rf'^{name}{{partition="{p}",topic="{re.escape(topic)}"}} (\S+)$',
                      text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def test_describe_tier_lists_closed_segments_on_each_leader(
        admin: Admin, brokers: dict[int, BrokerProcess]) -> None:
    topic = _name("desc")
    _create(admin, topic, partitions=2, tier_enable="true", tier_after_ms="1234")
    leaders = {p: _leader(admin, brokers, topic, p) for p in (0, 1)}
    assert {b.broker_id for b in leaders.values()} == set(_BROKER_IDS)  # one on each
    now = int(time.time() * 1000)
    stamps = [now - 40_000, now - 30_000, now - 20_000, now - 10_000]
    _produce(leaders[0], topic, 0, stamps)
    _produce(leaders[1], topic, 1, stamps[:1])

    described = admin.describe_tier([topic])
    assert list(described) == [topic]
    tier = described[topic]
    assert isinstance(tier, TopicTier)
    assert (tier.name, tier.enabled, tier.tier_after_ms, tier.table) == \
        (topic, True, 1234, None)
    first = tier.partitions[0]
    assert (first.log_start_offset, first.high_watermark) == (0, 20)
    assert (first.tiered_up_to, first.tier_start_offset) == (0, 0)
    # Three closed segments; the fourth batch is in the active one and never shows.
    assert [(s.base_offset, s.next_offset, s.max_timestamp) for s in first.segments] == \
        [(0, 5, stamps[0]), (5, 10, stamps[1]), (10, 15, stamps[2])]
    directory = leaders[0].data_dir / f"{topic}-0"
    assert [s.size_bytes for s in first.segments] == \
        [(directory / f"{s.base_offset:020d}.log").stat().st_size for s in first.segments]
    assert _segment_files(leaders[0], topic, 0) == [0, 5, 10, 15]
    # A partition with only the active segment has nothing to tier.
    assert tier.partitions[1].segments == () and tier.partitions[1].high_watermark == 5

    with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
        admin.describe_tier([topic, "no-such-topic-tier"])
    # Asked directly, the broker that does not lead the partition says so.
    other = brokers[next(i for i in _BROKER_IDS if i != leaders[0].broker_id)]

    async def ask() -> DescribeTierResponse:
        async with BrokerConnection("127.0.0.1", other.port) as connection:
            response = await connection.request(
                ApiKey.DESCRIBE_TIER, DescribeTierRequest([DescribeTierTopic(topic, [0])]))
            assert isinstance(response, DescribeTierResponse)
            return response

    answer = asyncio.run(asyncio.wait_for(ask(), 30)).topics[0].partitions[0]
    assert answer.error_code == NotLeaderError.code and answer.segments == []


def test_tiered_topic_deletes_only_what_is_in_the_table(
        admin: Admin, brokers: dict[int, BrokerProcess], coordinator: ZooKeeperClient) -> None:
    topic = _name("gate")
    _create(admin, topic, replication=2, tier_enable="true", tier_after_ms="0",
            local_retention_ms="0", retention_ms="3600000")
    leader = _leader(admin, brokers, topic, 0)
    follower = brokers[next(i for i in _BROKER_IDS if i != leader.broker_id)]
    now = int(time.time() * 1000)
    _produce(leader, topic, 0, [now - 5000 + i for i in range(5)])  # [0,5) ... [20,25)
    _wait("the follower to copy the log",
          lambda: admin.describe_tier([topic])[topic].partitions[0].high_watermark == 25)
    _wait("the lag gauge", lambda: _metric(leader, "strata_tier_lag_records", topic, 0) == 25)
    assert _metric(leader, "strata_tier_tiered_offset", topic, 0) == 0
    assert _metric(follower, "strata_tier_lag_records", topic, 0) is None  # leaders only
    time.sleep(0.5)  # several retention passes: without progress nothing may go
    assert _segment_files(leader, topic, 0) == [0, 5, 10, 15, 20]
    assert _segment_files(follower, topic, 0)[0] == 0

    coordinator.advance_tier_progress(topic, 0, tiered_up_to=10, tier_start=0)
    _wait("retention on the leader", lambda: _segment_files(leader, topic, 0)[0] == 10)
    assert _segment_files(leader, topic, 0) == [10, 15, 20]
    partition = admin.describe_tier([topic])[topic].partitions[0]
    assert (partition.log_start_offset, partition.tiered_up_to, partition.tier_start_offset) \
        == (10, 10, 0)
    assert [s.base_offset for s in partition.segments] == [10, 15]
    _wait("the lag gauge to follow", lambda: _metric(
        leader, "strata_tier_lag_records", topic, 0) == 15)
    assert _metric(leader, "strata_tier_tiered_offset", topic, 0) == 10

    def follower_trimmed() -> bool:
        # The follower rolls on its own: no segment of its may end at or below 10 (they
        # are tiered and expired), and the one holding offset 10 must stay.
        bases = _segment_files(follower, topic, 0)
        return bases[0] <= 10 and (len(bases) < 2 or bases[1] > 10)

    _wait("retention on the follower", follower_trimmed)
    time.sleep(0.3)
    assert _segment_files(leader, topic, 0) == [10, 15, 20]  # untiered segments stay


def test_untiered_topic_keeps_the_old_retention(
        admin: Admin, brokers: dict[int, BrokerProcess]) -> None:
    topic = _name("plain")
    _create(admin, topic, retention_ms="0")
    leader = _leader(admin, brokers, topic, 0)
    _produce(leader, topic, 0, [int(time.time() * 1000) - 1000] * 3)
    _wait("plain retention", lambda: _segment_files(leader, topic, 0) == [10])
    tier = admin.describe_tier([topic])[topic]
    assert not tier.enabled and tier.partitions[0].segments == ()
    assert tier.partitions[0].log_start_offset == 10
    assert _metric(leader, "strata_tier_lag_records", topic, 0) is None


@pytest.mark.parametrize(("configs", "words"), [
    ({"tier.enable": "maybe"}, "tier.enable='maybe' is not valid"),
    ({"tier.after.ms": "-5"}, "tier.after.ms='-5' is out of range"),
    ({"local.retention.bytes": "-3"}, "-2 \\(same as retention.bytes\\)"),
    ({"tier.enable": "true", "retention.ms": "60000", "local.retention.ms": "120000"},
     "local.retention.ms=120000 exceeds retention.ms=60000"),
])
def test_bad_tier_configs_are_refused_at_create_and_alter(
        admin: Admin, configs: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidConfigError, match=words) as caught:
        admin.create_topics([NewTopic(_name("bad"), 1, 1, configs)])
    assert caught.value.code == 40
    topic = _name("alter")
    admin.create_topics([NewTopic(topic, 1, 1, {"retention.ms": "60000"})])
    with pytest.raises(InvalidConfigError, match=words):
        admin.alter_configs(topic, configs)


def test_tier_lease_and_progress_go_through_the_brokers(admin: Admin) -> None:
    """What the tiering job does with only the bootstrap servers: take the lease, record
    the table and progress under it, and lose it to nobody while it renews."""
    topic = _name("leased")
    _create(admin, topic, partitions=2, tier_enable="true")
    lease = admin.acquire_tier_lease(topic, "job-a@host1", 30_000)
    assert lease.topic == topic and lease.compacted == {}
    with pytest.raises(TierJobBusyError, match="job-a@host1"):
        admin.acquire_tier_lease(topic, "job-b", 30_000)
    stored = admin.update_tier(topic, lease.lease_id, lease.topic_id, table="/w/t",
                               progress={0: (10, 0), 1: (4, 0)}, merged={0: 10})
    assert (stored[0].tiered_up_to, stored[0].tier_start, stored[0].merged_up_to) == (10, 0, 10)
    assert (stored[1].tiered_up_to, stored[1].merged_up_to) == (4, -1)
    # Never backwards: the stored value wins over a smaller one.
    again = admin.update_tier(topic, lease.lease_id, lease.topic_id, progress={0: (3, 0)})
    assert again[0].tiered_up_to == 10
    described = admin.describe_tier([topic])[topic]
    assert described.table == "/w/t"
    assert described.partitions[0].tiered_up_to == 10
    admin.renew_tier_lease(topic, lease.lease_id, 30_000)
    # Bad input is refused before anything is written.
    with pytest.raises(InvalidRequestError, match="tier_start"):
        admin.update_tier(topic, lease.lease_id, lease.topic_id, progress={0: (20, 30)})
    with pytest.raises(InvalidRequestError, match="no partition 7"):
        admin.update_tier(topic, lease.lease_id, lease.topic_id, progress={7: (20, 0)})
    with pytest.raises(InvalidRequestError, match="ttl_ms=10 is out of range"):
        admin.acquire_tier_lease(topic, "job-b", 10)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.update_tier(topic, lease.lease_id, "another-topic-id", progress={0: (20, 0)})
    assert admin.describe_tier([topic])[topic].partitions[0].tiered_up_to == 10
    # Given up, the lease goes to the next job; the old one writes nothing more.
    admin.release_tier_lease(topic, lease.lease_id)
    taken = admin.acquire_tier_lease(topic, "job-b", 30_000)
    assert taken.compacted == {0: 10} and taken.topic_id == lease.topic_id
    with pytest.raises(TierLeaseLostError, match="job-b"):
        admin.update_tier(topic, lease.lease_id, lease.topic_id, progress={0: (20, 0)})
    with pytest.raises(TierLeaseLostError):
        admin.renew_tier_lease(topic, lease.lease_id, 30_000)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.acquire_tier_lease(_name("missing"), "job-c", 30_000)
