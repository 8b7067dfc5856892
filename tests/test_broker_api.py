"""Every API of the wire protocol against a real broker process over TCP.

These tests talk to the broker with raw requests (``BrokerConnection``), not through
the producer/consumer, so they pin down the protocol itself: error codes, offsets,
long-poll behaviour, idempotent deduplication, and what survives a restart.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from tests.support.broker_process import BrokerProcess
from wire.connection import BrokerConnection
from wire.errors import UnsupportedVersionError
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AlterConfigsRequest,
    AlterConfigsTopic,
    ApiKey,
    ApiVersionsRequest,
    ConfigEntry,
    CreatableTopic,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    InitProducerIdRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    Message,
    MetadataRequest,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    ReplicaAssignment,
)
from wire.record_batch import batches_to_table, build_batch

pytestmark = pytest.mark.integration

T = TypeVar("T")
_names = itertools.count()


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(_with_timeout(coro))


async def _with_timeout(coro: Awaitable[T]) -> T:
    return await asyncio.wait_for(coro, 60)


async def call(broker: BrokerProcess, api: ApiKey, body: Message, **kw: Any) -> Any:
    async with BrokerConnection("127.0.0.1", broker.port) as connection:
        return await connection.request(api, body, **kw)


def bytes_received(broker: BrokerProcess) -> float:
    """The broker's ``strata_bytes_in_total``: request bytes it has read."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("strata_bytes_in_total "))


def wait_received(broker: BrokerProcess, before: float, timeout: float = 30) -> None:
    """Wait until the broker has read a request sent after ``before`` was taken (a fetch
    is parked from then on), however slow the machine."""
    deadline = time.monotonic() + timeout
    while bytes_received(broker) <= before:
        assert time.monotonic() < deadline, "the broker never read the request"
        time.sleep(0.02)


def topic_name(prefix: str = "t") -> str:
    return f"{prefix}{next(_names)}-{int(time.time() * 1000) % 100000}"


def create(broker: BrokerProcess, name: str, partitions: int = 1,
           configs: dict[str, str] | None = None) -> None:
    """Create ``name`` with every partition on ``broker`` (other brokers may share the ZK)."""
    response = run(call(broker, ApiKey.CREATE_TOPICS, CreateTopicsRequest([CreatableTopic(
        name, -1, -1, [ConfigEntry(k, v) for k, v in (configs or {}).items()],
        [ReplicaAssignment(p, [broker.broker_id]) for p in range(partitions)])])))
    assert response.topics[0].error_code == 0, response


def produce(broker: BrokerProcess, topic: str, partition: int, batch: bytes,
            acks: int = -1) -> Any:
    response = run(call(broker, ApiKey.PRODUCE, ProduceRequest(acks, 5000, [
        ProduceTopic(topic, [ProducePartition(partition, batch)])]),
        expect_response=acks != 0))
    return None if acks == 0 else response.topics[0].partitions[0]


def fetch(broker: BrokerProcess, topic: str, partition: int, offset: int, **kw: Any) -> Any:
    response = run(call(broker, ApiKey.FETCH, FetchRequest(
        [FetchTopic(topic, [FetchPartition(partition, offset)])], max_wait_ms=0, **kw)))
    return response.topics[0].partitions[0]


def values_at(answer: Any, topic: str, partition: int, start: int = 0) -> list[bytes]:
    table = batches_to_table(answer.records, topic=topic, partition=partition,
                             start_offset=start)
    return table.column("value").to_pylist()


# --------------------------------------------------------------------------- admin APIs


def test_api_versions_lists_every_api(broker: BrokerProcess) -> None:
    response = run(call(broker, ApiKey.API_VERSIONS, ApiVersionsRequest()))
    assert {a.api_key for a in response.apis} == {int(k) for k in ApiKey}
    with pytest.raises(UnsupportedVersionError, match="version 9 is not supported"):
        run(call(broker, ApiKey.METADATA, MetadataRequest(None), version=9))


def test_create_describe_alter_delete_topic(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name, 3, {"retention.ms": "3600000"})
    metadata = run(call(broker, ApiKey.METADATA, MetadataRequest([name])))
    assert [b.node_id for b in metadata.brokers] == [0]
    (topic,) = metadata.topics
    assert topic.error_code == 0 and [p.partition for p in topic.partitions] == [0, 1, 2]
    assert all(p.leader == 0 and p.isr == [0] for p in topic.partitions)

    described = run(call(broker, ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest([name])))
    configs = {c.name: c for c in described.topics[0].configs}
    assert configs["retention.ms"].value == "3600000" and not configs["retention.ms"].is_default
    assert configs["segment.bytes"].is_default

    altered = run(call(broker, ApiKey.ALTER_CONFIGS, AlterConfigsRequest([AlterConfigsTopic(
        name, [ConfigEntry("segment.bytes", "1048576")], ["retention.ms"])])))
    assert altered.topics[0].error_code == 0
    described = run(call(broker, ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest([name])))
    configs = {c.name: c for c in described.topics[0].configs}
    assert configs["segment.bytes"].value == "1048576"
    assert configs["retention.ms"].is_default

    deleted = run(call(broker, ApiKey.DELETE_TOPICS, DeleteTopicsRequest([name])))
    assert deleted.topics[0].error_code == 0
    metadata = run(call(broker, ApiKey.METADATA, MetadataRequest([name])))
    assert metadata.topics[0].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert not (broker.data_dir / f"{name}-0").exists()


@pytest.mark.parametrize(("topic", "partitions", "replication", "configs", "code", "words"), [
    ("bad name!", 1, 1, {}, 17, "not valid"),
    ("..", 1, 1, {}, 17, "not valid"),
    ("__internal", 1, 1, {}, 44, "reserved"),
    ("ok-partitions", 0, 1, {}, 37, "partition count 0"),
    ("ok-replication", 1, 99, {}, 38, "replication factor 99"),
    ("ok-config-key", 1, 1, {"retention.mss": "1"}, 40, "unknown topic config"),
    ("ok-config-value", 1, 1, {"segment.bytes": "12"}, 40, "out of range"),
    ("ok-config-type", 1, 1, {"flush.policy": "sometimes"}, 40, "not valid"),
])
def test_create_topic_errors(broker: BrokerProcess, topic: str, partitions: int,
                             replication: int, configs: dict[str, str], code: int,
                             words: str) -> None:
    response = run(call(broker, ApiKey.CREATE_TOPICS, CreateTopicsRequest([CreatableTopic(
        topic, partitions, replication, [ConfigEntry(k, v) for k, v in configs.items()])])))
    result = response.topics[0]
    assert result.error_code == code and words in (result.error_message or "")
    metadata = run(call(broker, ApiKey.METADATA, MetadataRequest([topic])))
    assert metadata.topics[0].error_code == 3, "a rejected topic must not exist"


def test_create_existing_and_alter_unknown(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name)
    again = run(call(broker, ApiKey.CREATE_TOPICS, CreateTopicsRequest([
        CreatableTopic(name, 1, 1)])))
    assert again.topics[0].error_code == 36
    altered = run(call(broker, ApiKey.ALTER_CONFIGS, AlterConfigsRequest([
        AlterConfigsTopic("no-such-topic", [ConfigEntry("retention.ms", "1")]),
        AlterConfigsTopic(name, [ConfigEntry("retention.ms", "-7")])])))
    assert [t.error_code for t in altered.topics] == [3, 40]


# --------------------------------------------------------------------------- produce/fetch


def test_produce_fetch_round_trip_with_every_acks(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name, 2)
    first = produce(broker, name, 0, build_batch([b"a", b"b"], keys=[b"k1", None],
                                                  headers=[[("h", b"v")], None]), acks=1)
    assert first.error_code == 0 and first.base_offset == 0
    second = produce(broker, name, 0, build_batch([b"c"]), acks=-1)
    assert second.base_offset == 2
    produce(broker, name, 0, build_batch([b"d"]), acks=0)  # no response expected
    deadline = time.monotonic() + 10
    while fetch(broker, name, 0, 0).high_watermark < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    answer = fetch(broker, name, 0, 0)
    assert answer.high_watermark == 4
    table = batches_to_table(answer.records, topic=name, partition=0)
    assert table.column("value").to_pylist() == [b"a", b"b", b"c", b"d"]
    assert table.column("offset").to_pylist() == [0, 1, 2, 3]
    assert table.column("key").to_pylist()[:2] == [b"k1", None]
    assert table.column("headers").to_pylist()[0] == [{"key": "h", "value": b"v"}]
    # A fetch from inside a batch returns that whole batch; the client slices.
    assert values_at(fetch(broker, name, 0, 1), name, 0, start=1) == [b"b", b"c", b"d"]
    assert fetch(broker, name, 1, 0).records is None  # empty partition


def test_produce_errors_write_nothing(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name, 1, {"max.message.bytes": "2048"})
    good = build_batch([b"x"])
    damaged = bytearray(good)
    damaged[-5] ^= 0xFF
    assert produce(broker, name, 0, bytes(damaged)).error_code == 2  # CORRUPT_MESSAGE
    assert produce(broker, name, 0, good[:-3]).error_code == 87  # INVALID_RECORD
    assert produce(broker, name, 0, build_batch([b"y" * 4000])).error_code == 10
    assert produce(broker, name, 9, good).error_code == 3
    assert produce(broker, "missing-topic", 0, good).error_code == 3
    bad_acks = run(call(broker, ApiKey.PRODUCE, ProduceRequest(2, 1000, [
        ProduceTopic(name, [ProducePartition(0, good)])])))
    assert bad_acks.topics[0].partitions[0].error_code == 21
    answer = fetch(broker, name, 0, 0)
    assert answer.high_watermark == 0 and answer.records is None


def test_fetch_limits_and_out_of_range(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name, 2)
    for i in range(10):
        produce(broker, name, 0, build_batch([bytes([i]) * 500] * 4))
    produce(broker, name, 1, build_batch([b"p1"]))
    one_batch = fetch(broker, name, 0, 0, max_bytes=10)  # at least one whole batch
    assert len(values_at(one_batch, name, 0)) == 4
    response = run(call(broker, ApiKey.FETCH, FetchRequest([FetchTopic(name, [
        FetchPartition(0, 0, partition_max_bytes=5000), FetchPartition(1, 0)])],
        max_wait_ms=0)))
    p0, p1 = response.topics[0].partitions
    assert 4 <= len(values_at(p0, name, 0)) < 40 and values_at(p1, name, 1) == [b"p1"]
    beyond = fetch(broker, name, 0, 41)
    assert beyond.error_code == 1 and beyond.high_watermark == 40
    assert "outside the log's range [0, 40]" in beyond.error_message


def test_long_poll_wakes_as_soon_as_data_arrives(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name)

    async def scenario() -> tuple[float, Any]:
        async with BrokerConnection("127.0.0.1", broker.port) as consumer, \
                BrokerConnection("127.0.0.1", broker.port) as producer:
            # 30 s (the broker's fetch.max.wait.ms cap): a poll that does not wake on
            # data answers ~30 s later, far past the 10 s that allows for a slow machine.
            before = bytes_received(broker)
            waiting = asyncio.create_task(consumer.request(ApiKey.FETCH, FetchRequest(
                [FetchTopic(name, [FetchPartition(0, 0)])], max_wait_ms=30_000, min_bytes=1)))
            await asyncio.to_thread(wait_received, broker, before)  # the fetch is parked
            await asyncio.sleep(0.3)
            assert not waiting.done(), "fetch returned before any data existed"
            await producer.request(ApiKey.PRODUCE, ProduceRequest(1, 5000, [
                ProduceTopic(name, [ProducePartition(0, build_batch([b"wake"]))])]))
            acked = time.monotonic()
            answer = await waiting
            return time.monotonic() - acked, answer

    elapsed, answer = run(scenario())
    assert elapsed < 10, f"long poll waited {elapsed:.1f}s after data arrived"
    assert values_at(answer.topics[0].partitions[0], name, 0) == [b"wake"]
    # And with no data it waits out max_wait_ms, then answers empty (not only when the
    # broker's own 30 s cap runs out, nor never).
    started = time.monotonic()
    empty = run(call(broker, ApiKey.FETCH, FetchRequest(
        [FetchTopic(name, [FetchPartition(0, 1)])], max_wait_ms=400, min_bytes=1)))
    assert 0.35 < time.monotonic() - started < 15
    assert empty.topics[0].partitions[0].records is None


def test_list_offsets_earliest_latest_and_by_timestamp(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name)
    produce(broker, name, 0, build_batch([b"a", b"b", b"c"], timestamps=[1000, 3000, 2000]))
    produce(broker, name, 0, build_batch([b"d"], timestamps=[5000]))

    def lookup(ts: int) -> int:
        return int(lookup_with_time(ts)[0])

    def lookup_with_time(ts: int) -> tuple[int, int]:
        response = run(call(broker, ApiKey.LIST_OFFSETS, ListOffsetsRequest([ListOffsetsTopic(
            name, [ListOffsetsPartition(0, ts)])])))
        answer = response.topics[0].partitions[0]
        return answer.offset, answer.timestamp

    assert lookup(EARLIEST_TIMESTAMP) == 0
    assert lookup(LATEST_TIMESTAMP) == 4
    assert lookup(0) == 0
    assert lookup_with_time(2500) == (1, 3000)  # the first record at or after 2500
    assert lookup(4000) == 3
    assert lookup(9999) == -1  # no such record


# --------------------------------------------------------------------------- idempotence


def test_idempotent_produce_dedupes_and_rejects_gaps(broker: BrokerProcess) -> None:
    name = topic_name()
    create(broker, name)
    pid_response = run(call(broker, ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest()))
    assert pid_response.error_code == 0
    pid, epoch = pid_response.producer_id, pid_response.producer_epoch
    other = run(call(broker, ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest()))
    assert other.producer_id != pid

    def batch(seq: int, n: int = 2, producer_epoch: int = epoch) -> bytes:
        return build_batch([f"s{seq + i}".encode() for i in range(n)], producer_id=pid,
                           producer_epoch=producer_epoch, base_sequence=seq)

    assert produce(broker, name, 0, batch(0)).base_offset == 0
    assert produce(broker, name, 0, batch(2)).base_offset == 2
    retry = produce(broker, name, 0, batch(0))  # a retry after a lost response
    assert retry.error_code == 0 and retry.base_offset == 0
    gap = produce(broker, name, 0, batch(7))
    assert gap.error_code == 45 and "expected" in gap.error_message
    bumped = produce(broker, name, 0, batch(0, producer_epoch=epoch + 1))
    assert bumped.error_code == 0 and bumped.base_offset == 4
    zombie = produce(broker, name, 0, batch(4, producer_epoch=epoch))
    assert zombie.error_code == 47  # INVALID_PRODUCER_EPOCH
    stranger = build_batch([b"?"], producer_id=other.producer_id, producer_epoch=0,
                           base_sequence=5)
    assert produce(broker, name, 0, stranger).error_code == 59  # UNKNOWN_PRODUCER_ID
    assert values_at(fetch(broker, name, 0, 0), name, 0) == [b"s0", b"s1", b"s2", b"s3",
                                                              b"s0", b"s1"]


# --------------------------------------------------------------------------- process faults


def test_sigkill_restart_keeps_acknowledged_records_and_producer_state(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=7, overrides={"log.flush.policy": "always"})
    name = topic_name("crash")
    create(process, name)
    pid = run(call(process, ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest())).producer_id
    acked: list[bytes] = []
    for seq in range(0, 40, 4):
        values = [f"r{seq + i}".encode() for i in range(4)]
        answer = produce(process, name, 0, build_batch(values, producer_id=pid,
                                                        producer_epoch=0, base_sequence=seq))
        assert answer.error_code == 0
        acked += values
    process.kill()
    process.restart()
    answer = fetch(process, name, 0, 0, max_bytes=1 << 20)
    assert values_at(answer, name, 0) == acked
    # The last batch is retried after the crash: still deduplicated, same offset.
    retry = produce(process, name, 0, build_batch([f"r{36 + i}".encode() for i in range(4)],
                                                  producer_id=pid, producer_epoch=0,
                                                  base_sequence=36))
    assert retry.error_code == 0 and retry.base_offset == 36
    assert fetch(process, name, 0, 0).high_watermark == 40


def test_sigterm_is_a_clean_shutdown(broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=8)
    name = topic_name("clean")
    create(process, name)
    produce(process, name, 0, build_batch([b"kept"]))
    assert process.stop() == 0
    assert (process.data_dir / f"{name}-0" / ".clean-shutdown").exists()
    assert "stopped cleanly" in process.log_text()
    process.restart()
    assert values_at(fetch(process, name, 0, 0), name, 0) == [b"kept"]


def test_two_brokers_cannot_share_an_id_or_a_data_dir(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Any) -> None:
    first = broker_factory(broker_id=9)
    with pytest.raises(RuntimeError, match="DATA_DIR_LOCKED"):
        broker_factory(broker_id=10, data_dir=first.data_dir)
    with pytest.raises(RuntimeError, match="broker id 9 is registered by a live broker"):
        broker_factory(broker_id=9, overrides={"zookeeper.session.timeout.ms": "2000"},
                       data_dir=tmp_path / "other")


def test_metrics_endpoint_reports_requests_and_partitions(broker: BrokerProcess) -> None:
    name = topic_name("metrics")
    create(broker, name)
    produce(broker, name, 0, build_batch([b"m"] * 3))
    fetch(broker, name, 0, 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    assert f'strata_partition_log_end_offset{{partition="0",topic="{name}"}} 3.0' in text
    assert 'strata_requests_total{api="PRODUCE",error="NONE"}' in text
    assert "strata_request_latency_seconds_bucket" in text
    assert "strata_bytes_in_total" in text and "strata_connections" in text
    # Event-loop lag is probed every 100 ms; collector pauses are a histogram by
    # generation (observed whenever the collector runs).
    assert "# TYPE strata_gc_pause_seconds histogram" in text
    deadline = time.monotonic() + 10
    while "strata_event_loop_lag_seconds_count 0.0" in text \
            or "strata_event_loop_lag_seconds_count" not in text:
        assert time.monotonic() < deadline, "the event-loop lag probe never reported"
        time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                    timeout=10) as response:
            text = response.read().decode()


def test_init_producer_id_refuses_epoch_bumps_of_existing_ids(broker: BrokerProcess) -> None:
    """Bumping another producer's epoch would fence it; only a transactional id may."""
    fresh = run(call(broker, ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest()))
    bump = run(call(broker, ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest(
        producer_id=fresh.producer_id, producer_epoch=0)))
    assert bump.error_code == 42 and "producer_id=-1" in bump.error_message
    transactional = run(call(broker, ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest(
        transactional_id="tx")))
    # Transactional ids belong to their coordinator: before FindCoordinator (key_type 1)
    # has created __transaction_state, the answer says so instead of handing out an id.
    assert transactional.error_code == 15 and "FindCoordinator" in transactional.error_message
    assert transactional.producer_id == -1


def test_sigterm_answers_a_parked_long_poll_and_shuts_down_cleanly(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=11)
    name = topic_name("drain")
    create(process, name)

    async def scenario() -> tuple[float, Any]:
        async with BrokerConnection("127.0.0.1", process.port) as consumer:
            # Parked for 30 s (the broker's cap); shutdown.timeout.ms is 10 s. Not woken,
            # the fetch is cut off after 10 s (no answer) or, were the shutdown timeout
            # longer, answered after ~30 s: 15 s separates both from a slow machine.
            before = bytes_received(process)
            waiting = asyncio.create_task(consumer.request(ApiKey.FETCH, FetchRequest(
                [FetchTopic(name, [FetchPartition(0, 0)])], max_wait_ms=30_000, min_bytes=1)))
            await asyncio.to_thread(wait_received, process, before)  # the fetch is parked
            await asyncio.sleep(0.2)
            started = time.monotonic()
            process.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            answer = await waiting
            return time.monotonic() - started, answer

    elapsed, answer = run(scenario())
    assert answer.topics[0].partitions[0].error_code == 0  # answered, not cut off
    assert elapsed < 15, f"the parked fetch held shutdown for {elapsed:.1f}s"
    assert process.stop() == 0
    assert "stopped cleanly" in process.log_text()
    assert (process.data_dir / f"{name}-0" / ".clean-shutdown").exists()


def test_a_damaged_partition_goes_offline_alone(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """Damage found when a log is opened takes that partition offline, not the broker."""
    process = broker_factory(broker_id=12)
    healthy, damaged = topic_name("healthy"), topic_name("damaged")
    create(process, healthy)
    create(process, damaged)
    produce(process, healthy, 0, build_batch([b"fine"]))
    produce(process, damaged, 0, build_batch([b"soon broken"] * 3))
    assert process.stop() == 0
    segment = process.data_dir / f"{damaged}-0" / ("0" * 20 + ".log")
    data = bytearray(segment.read_bytes())
    data[16] ^= 0xFF  # the magic byte of the first batch
    segment.write_bytes(bytes(data))
    process.restart()
    assert values_at(fetch(process, healthy, 0, 0), healthy, 0) == [b"fine"]
    broken = fetch(process, damaged, 0, 0)
    assert broken.error_code == 56 and "offline" in broken.error_message
    assert produce(process, damaged, 0, build_batch([b"x"])).error_code == 56
    assert "OFFLINE" in process.log_text()


def test_offset_for_leader_epoch_answers_from_the_leaders_epoch_cache(
        broker: BrokerProcess) -> None:
    """A single broker leads with epoch 0 and stamps it on every produced batch, so
    epoch 0 ends at the log end; a newer epoch is unknown; errors are per partition."""
    from wire.protocol import (
        OffsetForLeaderEpochPartition,
        OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochTopic,
    )

    name = topic_name("epochs")
    create(broker, name)
    assert produce(broker, name, 0, build_batch([b"a", b"b"])).error_code == 0
    assert produce(broker, name, 0, build_batch([b"c"])).error_code == 0

    def ask(topic: str, partition: int, epoch: int, current: int = -1) -> Any:
        response = run(call(broker, ApiKey.OFFSET_FOR_LEADER_EPOCH, OffsetForLeaderEpochRequest(
            [OffsetForLeaderEpochTopic(topic, [
                OffsetForLeaderEpochPartition(partition, current, epoch)])], replica_id=-1)))
        assert response.topics[0].name == topic
        return response.topics[0].partitions[0]

    answer = ask(name, 0, 0)
    assert (answer.error_code, answer.leader_epoch, answer.end_offset) == (0, 0, 3)
    assert answer.error_message is None
    newer = ask(name, 0, 1)
    assert (newer.error_code, newer.leader_epoch, newer.end_offset) == (0, -1, -1)
    assert ask(name, 0, 0, current=0).error_code == 0
    assert ask(name, 0, 0, current=1).error_code == 75  # UNKNOWN_LEADER_EPOCH
    missing = ask("no-such-topic", 0, 0)
    assert (missing.error_code, missing.leader_epoch, missing.end_offset) == (3, -1, -1)
    assert ask(name, 5, 0).error_code == 3
