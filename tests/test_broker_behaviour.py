"""Broker behaviour over time, against real broker processes: live config changes and
the periodic retention task, seen through the raw protocol, the admin client and a
consumer.

Retention tests start their own broker (``broker_factory``) with
``log.retention.check.interval.ms=200`` so the background task runs several times a
second, and wait for it with bounded polls, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from strata.client import Admin, Consumer, OffsetOutOfRangeError, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for
from wire.connection import BrokerConnection
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AlterConfigsRequest,
    AlterConfigsTopic,
    ApiKey,
    ConfigEntry,
    CreatableTopic,
    CreateTopicsRequest,
    DescribeConfigsRequest,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    Message,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    ReplicaAssignment,
)
from wire.record_batch import TimestampType, batches_to_table, build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

T = TypeVar("T")
_names = itertools.count()

OFFSET_OUT_OF_RANGE = 1
MESSAGE_TOO_LARGE = 10
INVALID_CONFIG = 40
RETENTION_CHECK = {"log.retention.check.interval.ms": "200"}
#: 2001-09-09: long expired under any retention.ms used here.
LONG_AGO_MS = 1_000_000_000_000


# --------------------------------------------------------------------------- raw helpers


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 60)

    return asyncio.run(bounded())


async def call(broker: BrokerProcess, api: ApiKey, body: Message) -> Any:
    async with BrokerConnection("127.0.0.1", broker.port) as connection:
        return await connection.request(api, body)


def topic_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}-{int(time.time() * 1000) % 100000}"


def create(broker: BrokerProcess, name: str, configs: dict[str, str] | None = None) -> None:
    response = run(call(broker, ApiKey.CREATE_TOPICS, CreateTopicsRequest([CreatableTopic(
        name, -1, -1, [ConfigEntry(k, v) for k, v in (configs or {}).items()],
        [ReplicaAssignment(0, [broker.broker_id])])])))
    assert response.topics[0].error_code == 0, response


def alter(broker: BrokerProcess, name: str, set_: dict[str, str],
          delete: list[str] | None = None) -> int:
    response = run(call(broker, ApiKey.ALTER_CONFIGS, AlterConfigsRequest([AlterConfigsTopic(
        name, [ConfigEntry(k, v) for k, v in set_.items()], delete or [])])))
    return int(response.topics[0].error_code)


def produce(broker: BrokerProcess, name: str, batch: bytes) -> Any:
    response = run(call(broker, ApiKey.PRODUCE, ProduceRequest(-1, 5000, [
        ProduceTopic(name, [ProducePartition(0, batch)])])))
    return response.topics[0].partitions[0]


def fetch(broker: BrokerProcess, name: str, offset: int) -> Any:
    response = run(call(broker, ApiKey.FETCH, FetchRequest(
        [FetchTopic(name, [FetchPartition(0, offset, 1 << 20)])], max_wait_ms=0)))
    return response.topics[0].partitions[0]


def values_from(broker: BrokerProcess, name: str, offset: int) -> list[bytes]:
    """Values of every record at or after ``offset`` (one fetch; the tests stay small)."""
    answer = fetch(broker, name, offset)
    assert answer.error_code == 0, answer
    table = batches_to_table(answer.records, topic=name, partition=0, start_offset=offset)
    return table.column("value").to_pylist()


def list_offset_answer(broker: BrokerProcess, name: str, timestamp: int) -> Any:
    response = run(call(broker, ApiKey.LIST_OFFSETS, ListOffsetsRequest([ListOffsetsTopic(
        name, [ListOffsetsPartition(0, timestamp)])])))
    return response.topics[0].partitions[0]


def list_offset(broker: BrokerProcess, name: str, timestamp: int) -> int:
    answer = list_offset_answer(broker, name, timestamp)
    assert answer.error_code == 0, answer
    return int(answer.offset)


def restart_and_lead(broker: BrokerProcess, name: str) -> None:
    """Restart ``broker`` and wait until it leads ``name``-0 again. Another broker of the
    module's ZooKeeper may be controller: it made the partition leaderless when this one
    stopped (its only replica) and elects it again once it has registered, a moment after
    it is ready (it registers once its logs are open)."""
    broker.restart()
    wait_for(f"broker {broker.broker_id} leading {name}-0 after its restart",
             lambda: list_offset_answer(broker, name, EARLIEST_TIMESTAMP),
             lambda answer: answer.error_code == 0, timeout=30)


def segment_bases(broker: BrokerProcess, name: str) -> list[int]:
    return sorted(int(p.stem) for p in Path(broker.data_dir, f"{name}-0").glob("*.log"))


def old_batch(index: int, records: int = 3, timestamp: int = LONG_AGO_MS) -> tuple[list[bytes],
                                                                                    bytes]:
    values = [f"rec-{index}-{j}-".encode() * 12 for j in range(records)]
    return values, build_batch(values, timestamps=[timestamp + j for j in range(records)])


# --------------------------------------------------------------------------- AlterConfigs


def test_alter_configs_max_message_bytes_applies_to_the_live_log(broker: BrokerProcess) -> None:
    name, neighbour = topic_name("maxmsg"), topic_name("maxmsg-other")
    create(broker, name)
    create(broker, neighbour)
    big = build_batch([b"B" * 3000])
    small = build_batch([b"s" * 100])
    assert len(big) > 2048 > len(small)
    first = produce(broker, name, big)  # fits the default (1 MiB)
    assert (first.error_code, first.base_offset) == (0, 0)

    assert alter(broker, name, {"max.message.bytes": "2048"}) == 0
    refused = produce(broker, name, big)  # at once: no restart, no reload
    assert refused.error_code == MESSAGE_TOO_LARGE, refused
    assert "max.message.bytes=2048" in (refused.error_message or "")
    accepted = produce(broker, name, small)
    assert (accepted.error_code, accepted.base_offset) == (0, 1)
    assert produce(broker, neighbour, big).error_code == 0  # other topics keep the default
    assert values_from(broker, name, 0) == [b"B" * 3000, b"s" * 100]  # nothing else written

    described = run(call(broker, ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest([name])))
    configs = {c.name: c for c in described.topics[0].configs}
    assert configs["max.message.bytes"].value == "2048"

    # An invalid value changes nothing; removing the override restores the default.
    assert alter(broker, name, {"max.message.bytes": "12"}) == INVALID_CONFIG
    assert produce(broker, name, big).error_code == MESSAGE_TOO_LARGE
    assert alter(broker, name, {}, delete=["max.message.bytes"]) == 0
    again = produce(broker, name, big)
    assert (again.error_code, again.base_offset) == (0, 2)


def test_alter_configs_segment_bytes_rolls_the_live_log(broker: BrokerProcess) -> None:
    name = topic_name("segbytes")
    create(broker, name)
    for i in range(3):
        assert produce(broker, name, old_batch(i, timestamp=int(time.time() * 1000))[1]) \
            .error_code == 0
    assert segment_bases(broker, name) == [0]
    assert alter(broker, name, {"segment.bytes": "1024"}) == 0
    for i in range(3, 9):
        assert produce(broker, name, old_batch(i, timestamp=int(time.time() * 1000))[1]) \
            .error_code == 0
    bases = segment_bases(broker, name)
    assert len(bases) >= 3 and bases[0] == 0, bases  # rolled at the new size
    assert len(values_from(broker, name, 0)) >= 3
    assert list_offset(broker, name, LATEST_TIMESTAMP) == 27


def test_alter_configs_timestamp_type_applies_to_the_live_log(broker: BrokerProcess) -> None:
    name = topic_name("tstype")
    create(broker, name)
    before = produce(broker, name, build_batch([b"create-time"], timestamps=[LONG_AGO_MS]))
    assert (before.error_code, before.log_append_time) == (0, -1)
    assert alter(broker, name, {"message.timestamp.type": "LogAppendTime"}) == 0
    now = int(time.time() * 1000)
    after = produce(broker, name, build_batch([b"append-time"], timestamps=[LONG_AGO_MS]))
    assert after.error_code == 0 and abs(after.log_append_time - now) < 60_000, after
    table = batches_to_table(fetch(broker, name, 0).records, topic=name, partition=0)
    assert table.column("value").to_pylist() == [b"create-time", b"append-time"]
    # The earlier batch keeps its CreateTime stamp; the new one carries the broker's.
    assert table.column("timestamp").to_pylist() == [LONG_AGO_MS, after.log_append_time]
    assert table.column("timestampType").to_pylist() == [
        int(TimestampType.CREATE_TIME), int(TimestampType.LOG_APPEND_TIME)]


def test_altered_configs_survive_a_restart(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=34)
    name = topic_name("altered-restart")
    create(process, name)
    assert alter(process, name, {"max.message.bytes": "2048"}) == 0
    big = build_batch([b"B" * 3000])
    assert produce(process, name, big).error_code == MESSAGE_TOO_LARGE
    assert process.stop() == 0
    restart_and_lead(process, name)
    assert produce(process, name, big).error_code == MESSAGE_TOO_LARGE
    assert produce(process, name, build_batch([b"small"])).error_code == 0


# --------------------------------------------------------------------------- retention


def test_periodic_retention_deletes_expired_segments(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=31, overrides=RETENTION_CHECK)
    name = topic_name("retention")
    create(process, name, {"segment.bytes": "1024", "retention.ms": "1"})
    written: list[bytes] = []
    for i in range(12):
        values, batch = old_batch(i)
        answer = produce(process, name, batch)
        assert (answer.error_code, answer.base_offset) == (0, len(written)), answer
        written += values
    end = len(written)
    assert list_offset(process, name, LATEST_TIMESTAMP) == end

    # Every closed segment is expired; only the active one may stay.
    start = wait_for("log start offset", lambda: list_offset(process, name, EARLIEST_TIMESTAMP),
                     lambda s: s > 0)
    wait_for("segments on disk", lambda: segment_bases(process, name), lambda b: len(b) == 1)
    start = list_offset(process, name, EARLIEST_TIMESTAMP)
    assert segment_bases(process, name) == [start]
    assert 0 < start < end

    below = fetch(process, name, 0)
    assert below.error_code == OFFSET_OUT_OF_RANGE, below
    assert below.log_start_offset == start and below.records is None
    assert fetch(process, name, start - 1).error_code == OFFSET_OUT_OF_RANGE
    assert values_from(process, name, start) == written[start:]
    # A timestamp lookup never answers a deleted offset: the oldest stamps now live at
    # the log start offset.
    assert list_offset(process, name, 0) == start
    assert list_offset(process, name, LONG_AGO_MS + 1) == start + 1  # stamps +0, +1, +2

    # The log start offset is checkpointed: a restart keeps it (and the data above it).
    assert process.stop() == 0
    restart_and_lead(process, name)
    assert list_offset(process, name, EARLIEST_TIMESTAMP) == start
    assert fetch(process, name, 0).error_code == OFFSET_OUT_OF_RANGE
    assert values_from(process, name, start) == written[start:]
    # New records go on at the end; the active segment is never deleted.
    fresh = produce(process, name, build_batch([b"fresh"]))
    assert (fresh.error_code, fresh.base_offset) == (0, end)


def test_clients_see_the_log_start_after_retention(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=32, overrides=RETENTION_CHECK)
    name = topic_name("retention-view")
    create(process, name, {"segment.bytes": "1024", "retention.ms": "1"})
    written: list[bytes] = []
    for i in range(8):
        values, batch = old_batch(i)
        assert produce(process, name, batch).error_code == 0
        written += values
    # Once only the active segment is left, nothing more can expire: the log start
    # offset is fixed for the clients below.
    wait_for("segments on disk", lambda: segment_bases(process, name), lambda b: len(b) == 1)
    start = list_offset(process, name, EARLIEST_TIMESTAMP)
    assert 0 < start < len(written)

    with Admin(process.bootstrap) as admin:
        (partition,) = admin.describe_topics([name])[name].partitions
        assert partition.log_start_offset == start
        assert partition.log_end_offset == partition.high_watermark == len(written)
        earliest = admin.list_offsets({TopicPartition(name, 0): "earliest"})
        assert earliest[TopicPartition(name, 0)].offset == start
    tp = TopicPartition(name, 0)

    with Consumer(process.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning([tp])
        assert consumer.position(tp) == start
        records = _poll_until(consumer, len(written) - start)
        assert [r.offset for r in records] == list(range(start, len(written)))
        assert [r.value for r in records] == written[start:]
        # A position below the log start (deleted data) is reset to the earliest offset.
        consumer.seek(tp, 0)
        again = _poll_until(consumer, len(written) - start)
        assert [r.offset for r in again][:1] == [start]

    with Consumer(process.bootstrap, auto_offset_reset="none") as strict:
        strict.assign([tp])
        strict.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError):
            _poll_until(strict, 1, timeout=10)


def _poll_until(consumer: Consumer, count: int, timeout: float = 30.0) -> list[Any]:
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"polled {len(records)} of {count} records in {timeout:.0f}s")
        records += consumer.poll(timeout_ms=200, max_records=count - len(records))
    return records


def test_lowering_retention_ms_on_a_live_topic_deletes_old_segments(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=33, overrides=RETENTION_CHECK)
    name = topic_name("retention-alter")
    create(process, name, {"segment.bytes": "1024"})  # default retention: 7 days
    hour_ago = int(time.time() * 1000) - 3600_000
    for i in range(6):
        assert produce(process, name, old_batch(i, timestamp=hour_ago)[1]).error_code == 0
    rolled = segment_bases(process, name)
    assert len(rolled) >= 3, rolled
    time.sleep(1.0)  # five retention runs: a week's retention keeps hour-old data
    assert list_offset(process, name, EARLIEST_TIMESTAMP) == 0
    assert segment_bases(process, name) == rolled

    assert alter(process, name, {"retention.ms": "60000"}) == 0
    wait_for("segments on disk", lambda: segment_bases(process, name), lambda b: len(b) == 1)
    start = list_offset(process, name, EARLIEST_TIMESTAMP)
    assert segment_bases(process, name) == [start] == [rolled[-1]]
    assert fetch(process, name, 0).error_code == OFFSET_OUT_OF_RANGE
