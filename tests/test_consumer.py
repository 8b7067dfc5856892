"""Consumer against a real ZooKeeper and a real broker process over TCP.

Test data is written with raw ``ProduceRequest``s carrying ``build_batch`` batches through
``BrokerConnection``, so these tests depend on the protocol and the broker only, not on
the producer client. Every test uses its own topic on the module's shared broker; the
broker-restart test runs last because it bounces that broker.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from strata.client import (
    Admin,
    AsyncConsumer,
    Consumer,
    ConsumerRecord,
    NewTopic,
    TopicPartition,
)
from strata.client._common import error_from_code
from strata.client.consumer import records_from_table
from tests.support.broker_process import BrokerProcess
from wire.connection import BrokerConnection
from wire.errors import NetworkError, OffsetOutOfRangeError, StrataError
from wire.protocol import ApiKey, ProducePartition, ProduceRequest, ProduceResponse, ProduceTopic
from wire.record_batch import CONSUMER_SCHEMA, TimestampType, build_batch

pytestmark = pytest.mark.integration

Headers = list[tuple[str, bytes | None]] | None


# ----------------------------------------------------------------------------- helpers


def produce(bootstrap: str, topic: str, partition: int, values: Sequence[bytes | None], *,
            keys: Sequence[bytes | None] | None = None,
            timestamps: Sequence[int] | None = None,
            headers: Sequence[Headers] | None = None, timeout: float = 30.0) -> int:
    """Append one batch with acks=1; retry transient errors (leader not ready, broker
    restarting). Returns the batch's base offset."""
    batch = build_batch(list(values), keys=keys, timestamps=timestamps, headers=headers)
    host, port = bootstrap.rsplit(":", 1)

    async def send() -> int:
        deadline = time.monotonic() + timeout
        while True:
            try:
                async with BrokerConnection(host, int(port)) as connection:
                    response = await connection.request(ApiKey.PRODUCE, ProduceRequest(
                        1, 10_000, [ProduceTopic(topic, [ProducePartition(partition, batch)])]))
                assert isinstance(response, ProduceResponse)
                answer = response.topics[0].partitions[0]
                if answer.error_code == 0:
                    return answer.base_offset
                error: StrataError = error_from_code(answer.error_code, answer.error_message)
                if not error.retriable:
                    raise error
            except NetworkError as err:
                error = err
            if time.monotonic() > deadline:
                raise error
            await asyncio.sleep(0.1)

    return asyncio.run(send())


def poll_until(consumer: Consumer, count: int, timeout: float = 15.0,
               max_records: int | None = None) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(consumer.poll(timeout_ms=200, max_records=max_records))
    return out


def by_partition(records: Sequence[ConsumerRecord]) -> dict[int, list[ConsumerRecord]]:
    out: dict[int, list[ConsumerRecord]] = {}
    for record in records:
        out.setdefault(record.partition, []).append(record)
    return out


@pytest.fixture
def topic(request: pytest.FixtureRequest, admin: Admin) -> Callable[[int], str]:
    """Create a topic named after the test, with ``partitions`` partitions."""

    def create(partitions: int = 1) -> str:
        name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:200]
        admin.create_topics([NewTopic(name, partitions, 1)])
        return name

    return create


@pytest.fixture
def consumers(bootstrap: str) -> Iterator[Callable[..., Consumer]]:
    made: list[Consumer] = []

    def make(**config: Any) -> Consumer:
        consumer = Consumer(bootstrap, **config)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def _expected_batch(p: int, n: int, base_ts: int) -> tuple[list[bytes | None], list[bytes | None],
                                                          list[int], list[Headers]]:
    keys: list[bytes | None] = [None if i % 3 == 1 else f"k{p}-{i}".encode() for i in range(n)]
    values: list[bytes | None] = [None if i == 2 else f"v{p}-{i}".encode() * (i + 1)
                                  for i in range(n)]
    timestamps = [base_ts + i for i in range(n)]
    headers: list[Headers] = [
        None if i % 2 else [("h", f"{p}:{i}".encode()), ("empty", None)] for i in range(n)]
    return keys, values, timestamps, headers


# ----------------------------------------------------------------------------- tests


def test_poll_returns_exactly_what_was_produced(bootstrap: str, topic: Callable[[int], str],
                                                consumers: Callable[..., Consumer]) -> None:
    name = topic(3)
    expected: dict[int, list[tuple[Any, ...]]] = {}
    for p in range(3):
        offset = 0
        for batch_no, n in enumerate((5, 3, 7)):
            keys, values, timestamps, headers = _expected_batch(p, n, 1_700_000_000_000
                                                                + 1000 * batch_no)
            assert produce(bootstrap, name, p, values, keys=keys, timestamps=timestamps,
                           headers=headers) == offset
            for i in range(n):
                expected.setdefault(p, []).append(
                    (offset + i, keys[i], values[i], timestamps[i], headers[i] or []))
            offset += n

    consumer = consumers(auto_offset_reset="earliest")
    tps = [TopicPartition(name, p) for p in range(3)]
    consumer.assign(tps)
    assert consumer.assignment() == set(tps)
    records = poll_until(consumer, 45)
    assert len(records) == 45
    got = by_partition(records)
    for p in range(3):
        assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in got[p]] == expected[p]
        assert {(r.topic, r.timestamp_type) for r in got[p]} == {(name, TimestampType.CREATE_TIME)}
        assert consumer.position(tps[p]) == 15
        assert consumer.highwater(tps[p]) == 15
    assert consumer.poll(timeout_ms=300) == []


def test_poll_arrow_matches_poll(bootstrap: str, topic: Callable[[int], str],
                                 consumers: Callable[..., Consumer]) -> None:
    name = topic(2)
    for p in range(2):
        for batch_no in range(4):
            keys, values, timestamps, headers = _expected_batch(p, 6, 1000 * batch_no)
            produce(bootstrap, name, p, values, keys=keys, timestamps=timestamps,
                    headers=headers)
    tps = [TopicPartition(name, p) for p in range(2)]
    by_rows = consumers(auto_offset_reset="earliest")
    by_rows.assign(tps)
    records = poll_until(by_rows, 48, max_records=7)

    by_arrow = consumers(auto_offset_reset="earliest")
    by_arrow.assign(tps)
    tables: list[pa.Table] = []
    deadline = time.monotonic() + 15
    while sum(t.num_rows for t in tables) < 48 and time.monotonic() < deadline:
        table = by_arrow.poll_arrow(timeout_ms=200, max_records=7)
        assert table.schema.equals(CONSUMER_SCHEMA)
        assert table.num_rows <= 7
        tables.append(table)
    table = pa.concat_tables(tables)
    assert table.num_rows == 48
    assert table.column("topic").unique().to_pylist() == [name]
    for p in range(2):
        offsets = table.filter(pa.compute.equal(table["partition"], p))["offset"].to_pylist()
        assert offsets == list(range(24))
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(records_from_table(table), key=key) == sorted(records, key=key)
    assert by_arrow.poll_arrow(timeout_ms=100).num_rows == 0


def _eager(table: pa.Table) -> list[ConsumerRecord]:
    """The records of a table the plain way, one ``as_py`` per cell: the reference."""
    out = []
    for row in table.to_pylist():
        out.append(ConsumerRecord(
            row["topic"], row["partition"], row["offset"], row["timestamp"],
            TimestampType(row["timestampType"]), row["key"], row["value"],
            [(h["key"], h["value"]) for h in row["headers"]] if row["headers"] else []))
    return out


def test_records_view_matches_the_table() -> None:
    """``poll``'s ``Records`` is a lazy view: whatever the shape of the table (several
    partitions and topics in one batch or across batches, gaps in offsets, sparse keys
    and headers, mixed timestamp types), reading it gives exactly the rows."""
    headers_type = CONSUMER_SCHEMA.field("headers").type

    def batch(topics: list[str], partitions: list[int], offsets: list[int],
              keys: list[bytes | None], headers: list[Any], types: list[int]) -> pa.RecordBatch:
        n = len(offsets)
        return pa.RecordBatch.from_arrays([
            pa.array(keys, pa.binary()), pa.array([f"v{o}".encode() for o in offsets],
                                                  pa.binary()),
            pa.array(topics, pa.string()), pa.array(partitions, pa.int32()),
            pa.array(offsets, pa.int64()), pa.array([1000 + o for o in offsets], pa.int64()),
            pa.array(types, pa.int32()), pa.array(headers, headers_type)],
            schema=CONSUMER_SCHEMA) if n else CONSUMER_SCHEMA.empty_table().to_batches()[0]

    plain = batch(["a"] * 4, [0] * 4, [5, 6, 7, 8], [None] * 4, [None] * 4, [0] * 4)
    gaps = batch(["a"] * 3, [1] * 3, [2, 9, 10], [b"k", None, b"k3"],
                 [None, [{"key": "h", "value": b"x"}], []], [1, 1, 1])
    mixed = batch(["a", "b", "b"], [0, 0, 3], [1, 1, 2], [None] * 3, [None] * 3, [0, 1, 0])
    # Partitions' blocks whose first and last offsets span exactly their row count: the
    # middle block must keep its own offsets (they once came out as 12 and 13).
    coincident = batch(["a"] * 5, [2, 2, 5, 5, 7], [10, 11, 3, 4, 14], [None] * 5,
                       [None] * 5, [0] * 5)
    for batches in ([plain], [gaps], [mixed], [plain, gaps, mixed], [coincident]):
        table = pa.Table.from_batches(batches, schema=CONSUMER_SCHEMA)
        expected = _eager(table)
        records = records_from_table(table)
        assert len(records) == len(expected) and bool(records)
        assert list(records) == expected and records == expected
        assert [records[i] for i in range(len(expected))] == expected
        assert records[-1] == expected[-1]
        assert list(records[1:]) == expected[1:] and records[::2] == expected[::2]
        assert list(reversed(records)) == expected[::-1]
        assert all(type(r) is ConsumerRecord for r in records)
        assert all(isinstance(r.headers, list) for r in records)
        with pytest.raises(IndexError):
            records[len(expected)]
    first = next(iter(records_from_table(pa.Table.from_batches([plain]))))
    assert first.headers == [] and first.timestamp_type is TimestampType.CREATE_TIME
    a, b = list(records_from_table(pa.Table.from_batches([plain])))[:2]
    assert a.headers is not b.headers  # each record gets its own list
    empty = records_from_table(CONSUMER_SCHEMA.empty_table())
    assert len(empty) == 0 and not empty and list(empty) == [] and empty == []
    assert "Records([" in repr(records_from_table(pa.Table.from_batches([plain])))


def test_records_give_typed_values_as_dicts_with_maps_as_dicts() -> None:
    value_type = pa.struct([("id", pa.int64()), ("m", pa.map_(pa.string(), pa.int32()))])
    table = CONSUMER_SCHEMA.set(1, pa.field("value", value_type)).empty_table()
    rows = [{"key": None, "value": {"id": 1, "m": [("a", 1), ("b", 2)]}, "topic": "t",
             "partition": 0, "offset": 0, "timestamp": 5, "timestampType": 0,
             "headers": None}]
    table = pa.Table.from_pylist(rows, schema=table.schema)
    assert [r.value for r in records_from_table(table)] == [{"id": 1, "m": {"a": 1, "b": 2}}]


def test_a_partition_at_its_end_does_not_hold_back_the_others(
        bootstrap: str, topic: Callable[[int], str], consumers: Callable[..., Consumer]) -> None:
    """Partition 0 is read to its end early, so its fetches long-poll for
    ``fetch_max_wait_ms`` (here 20 s); partition 1 still has records to fetch, in many
    small fetches. Its fetches go in their own lane, never behind that long poll, so all
    of it arrives well within one long poll."""
    name = topic(2)
    produce(bootstrap, name, 0, [b"few"] * 3)
    for chunk in range(6):
        produce(bootstrap, name, 1, [f"{chunk}-{i}".encode() * 50 for i in range(400)])
    consumer = consumers(auto_offset_reset="earliest", fetch_max_wait_ms=20_000,
                         max_partition_fetch_bytes=64 * 1024)
    consumer.assign([TopicPartition(name, 0), TopicPartition(name, 1)])
    started = time.monotonic()
    records = poll_until(consumer, 3 + 2400, timeout=15, max_records=100)
    elapsed = time.monotonic() - started
    # One 20 s long poll in the way would end poll_until's 15 s before the last record.
    assert len(records) == 2403, f"only {len(records)} of 2403 records in {elapsed:.1f} s"
    assert [r.offset for r in by_partition(records)[1]] == list(range(2400))


def test_seek_variants(bootstrap: str, topic: Callable[[int], str],
                       consumers: Callable[..., Consumer]) -> None:
    name = topic(1)
    tp = TopicPartition(name, 0)
    for b in range(4):  # offsets 5b..5b+4 carry timestamps 10000(b+1) + i
        produce(bootstrap, name, 0, [f"{b}-{i}".encode() for i in range(5)],
                timestamps=[10_000 * (b + 1) + i for i in range(5)])
    consumer = consumers(auto_offset_reset="earliest")
    consumer.assign([tp])
    assert consumer.position(tp) == 0

    consumer.seek(tp, 7)
    assert consumer.position(tp) == 7
    got = poll_until(consumer, 13)
    assert [r.offset for r in got] == list(range(7, 20))

    assert consumer.seek_to_beginning() == {tp: 0}
    assert poll_until(consumer, 1, max_records=1)[0].offset == 0

    assert consumer.seek_to_end([tp]) == {tp: 20}
    assert consumer.position(tp) == 20
    assert consumer.poll(timeout_ms=300) == []
    produce(bootstrap, name, 0, [b"new-0", b"new-1"], timestamps=[50_000, 50_001])
    assert [(r.offset, r.value) for r in poll_until(consumer, 2)] == [(20, b"new-0"),
                                                                      (21, b"new-1")]

    assert consumer.seek_to_timestamp([tp], 20_002) == {tp: 7}
    first = poll_until(consumer, 1, max_records=1)[0]
    assert (first.offset, first.timestamp) == (7, 20_002)
    assert consumer.seek_to_timestamp({tp: 30_000}) == {tp: 10}
    assert consumer.position(tp) == 10
    assert poll_until(consumer, 1, max_records=1)[0].timestamp == 30_000
    # No record at or after the timestamp: positioned at the end.
    assert consumer.seek_to_timestamp([tp], 10**13) == {tp: 22}
    assert consumer.poll(timeout_ms=200) == []

    with pytest.raises(ValueError, match="not assigned"):
        consumer.seek(TopicPartition(name, 5), 0)
    with pytest.raises(ValueError, match="offset"):
        consumer.seek(tp, -1)


def test_auto_offset_reset(bootstrap: str, topic: Callable[[int], str],
                           consumers: Callable[..., Consumer]) -> None:
    name = topic(1)
    tp = TopicPartition(name, 0)
    produce(bootstrap, name, 0, [f"r{i}".encode() for i in range(10)])

    earliest = consumers(auto_offset_reset="earliest")
    earliest.assign([tp])
    assert [r.offset for r in poll_until(earliest, 10)] == list(range(10))

    latest = consumers(auto_offset_reset="latest")
    latest.assign([tp])
    assert latest.position(tp) == 10
    assert latest.poll(timeout_ms=200) == []
    produce(bootstrap, name, 0, [b"a", b"b", b"c"])
    assert [r.offset for r in poll_until(latest, 3)] == [10, 11, 12]

    # "none" with no position: the valid range is in the error.
    none = consumers(auto_offset_reset="none")
    none.assign([tp])
    with pytest.raises(OffsetOutOfRangeError) as info:
        none.poll(timeout_ms=2000)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 13)
    assert "auto_offset_reset='none'" in str(info.value)
    none.seek(tp, 5)
    assert [r.offset for r in poll_until(none, 8)] == list(range(5, 13))

    # Out of range (past the end): "none" raises with the range, every time...
    none.seek(tp, 1000)
    for _ in range(2):
        with pytest.raises(OffsetOutOfRangeError) as info:
            none.poll(timeout_ms=5000)
        assert (info.value.offset, info.value.log_start_offset,
                info.value.log_end_offset) == (1000, 0, 13)
        assert "OFFSET_OUT_OF_RANGE" in str(info.value)
    # ...while "earliest" and "latest" reset.
    earliest.seek(tp, 1000)
    assert [r.offset for r in poll_until(earliest, 13)] == list(range(13))
    latest.seek(tp, 1000)
    assert latest.poll(timeout_ms=500) == []
    assert latest.position(tp) == 13
    produce(bootstrap, name, 0, [b"d"])
    assert [r.offset for r in poll_until(latest, 1)] == [13]


def test_unknown_topic_is_transient(bootstrap: str, admin: Admin,
                                    consumers: Callable[..., Consumer]) -> None:
    name = "created-after-assign"
    consumer = consumers(auto_offset_reset="earliest", retry_backoff_ms=50)
    consumer.assign([TopicPartition(name, 0)])
    assert consumer.poll(timeout_ms=300) == []  # no error: the topic may appear later
    admin.create_topics([NewTopic(name, 1, 1)])
    produce(bootstrap, name, 0, [b"late"])
    assert [r.value for r in poll_until(consumer, 1)] == [b"late"]


def test_long_poll_returns_when_data_arrives(bootstrap: str, topic: Callable[[int], str]
                                             ) -> None:
    name = topic(1)
    tp = TopicPartition(name, 0)

    async def scenario() -> tuple[float, list[ConsumerRecord]]:
        async with AsyncConsumer(bootstrap, auto_offset_reset="latest",
                                 fetch_max_wait_ms=20_000) as consumer:
            consumer.assign([tp])
            assert await consumer.position(tp) == 0
            assert await consumer.poll(timeout_ms=100) == []  # a 20 s long poll is now open
            timer = threading.Timer(0.5, produce, (bootstrap, name, 0, [b"wake"]))
            timer.start()
            started = time.monotonic()
            records = await consumer.poll(timeout_ms=15_000)
            elapsed = time.monotonic() - started
            timer.join()
            return elapsed, records

    elapsed, records = asyncio.run(scenario())
    # A long poll that did not wake would answer after fetch_max_wait_ms (20 s), past
    # the poll's 15 s timeout: poll would return [] after 15 s. 10 s separates that
    # from a merely slow machine.
    assert [r.value for r in records] == [b"wake"]
    assert elapsed < 10, f"poll took {elapsed:.2f}s; the long poll did not wake"


def answered(consumer: Consumer) -> None:
    """Wait (on the consumer's loop) until the fetches in flight are answered."""
    fetches = [f.task for f in consumer._consumer._fetcher.inflight.values()]
    assert fetches, "no fetch in flight"

    async def wait() -> None:
        await asyncio.wait(fetches, timeout=30)

    consumer._run(wait())
    assert all(f.done() for f in fetches), "the fetch in flight was not answered"


def test_fetch_pipelining(bootstrap: str, topic: Callable[[int], str],
                          consumers: Callable[..., Consumer]) -> None:
    name = topic(1)
    tp = TopicPartition(name, 0)
    for b in range(5):
        produce(bootstrap, name, 0, [f"{b}-{i}".encode() for i in range(100)])
    # max_partition_fetch_bytes=1: each fetch answer carries exactly one whole batch.
    consumer = consumers(auto_offset_reset="earliest", max_partition_fetch_bytes=1)
    consumer.assign([tp])
    first = consumer.poll(timeout_ms=5000)
    assert [r.offset for r in first] == list(range(100))
    # poll sent the fetch for the next batch before returning the first one.
    assert consumer.fetch_requests_sent == 2
    answered(consumer)  # "the caller works"; the prefetch is answered meanwhile
    # timeout_ms=0: poll does not wait, it returns [] unless the data is already here.
    second = consumer.poll(timeout_ms=0)
    assert [r.offset for r in second] == list(range(100, 200))
    assert consumer.fetch_requests_sent == 3
    # seek discards the prefetched batch (offsets 200..299) and fetches from the new place.
    answered(consumer)
    consumer.seek(tp, 10)
    after_seek = poll_until(consumer, 1)
    assert after_seek[0].offset == 10
    assert [r.offset for r in after_seek] == list(range(10, 100))


def test_close_and_bad_config(bootstrap: str) -> None:
    with pytest.raises(ValueError, match="auto_offset_reset"):
        Consumer(bootstrap, auto_offset_reset="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fetch_max_bytes"):
        Consumer(bootstrap, fetch_max_bytes=0)
    consumer = Consumer(bootstrap)
    with pytest.raises(RuntimeError, match="assign"):
        consumer.poll()
    consumer.close()
    consumer.close()


_SHORT_SCRIPT = """
import sys
from strata.client import Admin, Consumer, Producer, TopicPartition
bootstrap, topic, close = sys.argv[1], sys.argv[2], sys.argv[3] == "close"
with Producer(bootstrap) as producer:
    producer.send(topic, b"x").result()
consumer = Consumer(bootstrap, auto_offset_reset="earliest")
consumer.assign([TopicPartition(topic, 0)])
records = consumer.poll(timeout_ms=10_000)
consumer.poll(timeout_ms=50)  # leaves a long-poll fetch in flight
admin = Admin(bootstrap)
admin.describe_topics([topic])
if close:
    consumer.close()
    admin.close()
print(len(records))
"""


@pytest.mark.parametrize("close", [True, False], ids=["closed", "never-closed"])
def test_short_script_exits_without_pending_tasks(bootstrap: str, topic: Callable[[int], str],
                                                  close: bool) -> None:
    """A script that polls (a fetch still in flight) and exits, closing its clients or
    not, leaves no task pending: Python prints nothing about destroyed tasks."""
    import subprocess
    import sys

    name = topic(1)
    done = subprocess.run([sys.executable, "-c", _SHORT_SCRIPT, bootstrap, name,
                           "close" if close else "leave"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert "Task was destroyed" not in done.stderr, done.stderr
    assert "pending" not in done.stderr.lower(), done.stderr


def test_consumer_survives_broker_restart(
        broker: BrokerProcess, broker_factory: Callable[..., BrokerProcess], admin: Admin,
        topic: Callable[[int], str], consumers: Callable[..., Consumer]) -> None:
    """Two brokers lead two partitions each; broker 1 is stopped (SIGTERM) and restarted
    on the same data dir. Broker 0's partitions keep flowing meanwhile, and afterwards
    every partition continues from its position: no loss, no duplicates."""
    second = broker_factory(broker_id=1)
    deadline = time.monotonic() + 20
    while len(admin.describe_cluster().brokers) < 2:
        assert time.monotonic() < deadline, "broker 1 did not join the cluster"
        time.sleep(0.1)
    name = topic(4)
    leaders = {p.partition: p.leader for p in admin.describe_topics([name])[name].partitions}
    assert sorted(leaders.values()) == [0, 0, 1, 1]
    address = {0: broker.bootstrap, 1: second.bootstrap}
    produced: dict[int, int] = dict.fromkeys(leaders, 0)

    def fill(partition: int, count: int) -> None:
        lo = produced[partition]
        produce(address[leaders[partition]], name, partition,
                [f"{partition}-{i}".encode() for i in range(lo, lo + count)])
        produced[partition] += count

    def check(records: list[ConsumerRecord]) -> None:
        got = by_partition(records)
        for p, n in produced.items():
            assert [r.offset for r in got.get(p, [])] == list(range(n)), "lost or duplicated"
            assert [r.value for r in got.get(p, [])] == [f"{p}-{i}".encode() for i in range(n)]

    for p in leaders:
        for _ in range(5):
            fill(p, 10)
    consumer = consumers(auto_offset_reset="earliest", retry_backoff_ms=50,
                         request_timeout_ms=5000)
    consumer.assign([TopicPartition(name, p) for p in leaders])
    assert consumer.poll(timeout_ms=0) == []
    assert consumer.fetch_requests_sent == 2  # one FetchRequest per leader, 2 partitions each
    records = poll_until(consumer, 120, max_records=30)
    # Mid-stream on purpose: 120 of the 200 at least. A poll returns at most 30 records,
    # fewer when the fetches so far brought fewer (timing), so the last one may overshoot.
    assert 120 <= len(records) < 150

    assert second.stop() == 0
    for p in (p for p, leader in leaders.items() if leader == 0):
        fill(p, 10)
    # Broker 1 is down: its partitions wait (no error), broker 0's keep coming.
    on_zero = {p for p, leader in leaders.items() if leader == 0}
    wanted = sum(produced[p] for p in on_zero)
    deadline = time.monotonic() + 15
    while sum(r.partition in on_zero for r in records) < wanted and \
            time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=200)
    assert sum(r.partition in on_zero for r in records) == wanted

    second.restart()
    for p in (p for p, leader in leaders.items() if leader == 1):
        fill(p, 10)
    records += poll_until(consumer, sum(produced.values()) - len(records), timeout=30)
    check(records)
    assert consumer.poll(timeout_ms=300) == []
