"""The producer against real ZooKeeper and broker processes over TCP.

Records are read back with raw ``FetchRequest``s through ``BrokerConnection`` and
``batches_to_table`` (not through the consumer), so what is checked is what the broker
stored. Fault injection uses ``ChaosProxy``: a TCP proxy between producer and broker
that can read a produce response from the broker and then *drop the connection instead
of delivering it* (the broker wrote the batch; the producer never hears so), or refuse
connections while a broker is killed and restarted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import random
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, TypeAlias

import pyarrow as pa
import pytest

import strata.client._accumulator as accumulator_module
from strata.client._accumulator import Accumulator, Chunks, Wakeup
from strata.client._cluster import Cluster
from strata.client._delivery import SendBatchGroup
from strata.client._schemas import typed_column
from strata.client._sync import EventLoopThread
from strata.client.producer import (
    AsyncProducer,
    BufferFullError,
    DeliveryFailedError,
    DeliveryTimeoutError,
    Producer,
    ProducerClosedError,
    ProducerConfig,
    RecordMetadata,
)
from tests.support.broker_process import BrokerProcess
from wire.connection import BrokerConnection
from wire.errors import (
    InvalidRecordBatchError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    UnknownTopicOrPartitionError,
    raise_for_code,
)
from wire.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)
from wire.protocol import (
    FRAME_PREFIX,
    ApiKey,
    ConfigEntry,
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    MetadataResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    ReplicaAssignment,
    decode,
    encode_response,
    read_response_header,
)
from wire.record_batch import (
    BatchHeader,
    Compression,
    batches_to_table,
    build_batch,
    iter_batches,
)

pytestmark = pytest.mark.integration

_names = itertools.count()


def _topic(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns() % 1_000_000}"


# --------------------------------------------------------------------------- helpers


async def _create_topic(bootstrap: str, name: str, partitions: int = 1,
                        configs: dict[str, str] | None = None) -> None:
    cluster = Cluster(bootstrap)
    try:
        entries = [ConfigEntry(k, v) for k, v in (configs or {}).items()]
        response = await cluster.send_any(ApiKey.CREATE_TOPICS, CreateTopicsRequest(
            [CreatableTopic(name, partitions, 1, entries)]))
        assert isinstance(response, CreateTopicsResponse)
        for topic in response.topics:
            raise_for_code(topic.error_code, topic.error_message)
    finally:
        await cluster.close()


def create_topic(bootstrap: str, name: str, partitions: int = 1,
                 configs: dict[str, str] | None = None) -> str:
    asyncio.run(_create_topic(bootstrap, name, partitions, configs))
    return name


async def _read_partition(bootstrap: str, topic: str, partition: int
                          ) -> tuple[pa.Table, list[BatchHeader]]:
    """Every committed record of one partition, plus the headers of the batches they came in."""
    cluster = Cluster(bootstrap)
    try:
        leader = await cluster.leader_for(topic, partition)
        connection = await cluster.connection(leader)
        offset = 0
        tables: list[pa.Table] = []
        headers: list[BatchHeader] = []
        while True:
            response = await connection.request(ApiKey.FETCH, FetchRequest(
                [FetchTopic(topic, [FetchPartition(partition, offset, 4 << 20)])],
                max_wait_ms=0))
            assert isinstance(response, FetchResponse)
            answer = response.topics[0].partitions[0]
            raise_for_code(answer.error_code, answer.error_message)
            if offset >= answer.high_watermark or not answer.records:
                break
            data = bytes(answer.records)
            for header, _ in iter_batches(data):
                if header.next_offset > offset:
                    headers.append(header)
            tables.append(batches_to_table(data, topic=topic, partition=partition,
                                           start_offset=offset))
            offset = headers[-1].next_offset
        table = pa.concat_tables(tables) if tables else batches_to_table(
            b"", topic=topic, partition=partition)
        return table, headers
    finally:
        await cluster.close()


def read_partition(bootstrap: str, topic: str, partition: int
                   ) -> tuple[pa.Table, list[BatchHeader]]:
    return asyncio.run(_read_partition(bootstrap, topic, partition))


def results(futures: list[concurrent.futures.Future[RecordMetadata]],
            timeout: float = 30) -> list[RecordMetadata]:
    return [f.result(timeout) for f in futures]


class ChaosProxy:
    """A TCP proxy in front of one broker, with response loss on demand.

    - ``drop_every = n``: the response to every n-th produce request is read from the
      broker and thrown away, and both TCP connections are closed (a real disconnect
      after the broker has written the batch).
    - ``drop_next(block=True)``: drop the next produce response, then refuse every new
      connection (accept + close) until ``unblock()``.
    Metadata responses are rewritten so the broker is advertised at the proxy's port,
    so every request of the client goes through the proxy.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.drop_every = 0
        self.produce_requests = 0
        self.dropped = 0
        self.refusing = False
        self._block_after_drop = False
        self._drop_next = False
        self.dropped_event = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = EventLoopThread("chaos-proxy")
        self.port = self._thread.run(self._start())

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def drop_next(self, *, block: bool) -> None:
        self.dropped_event.clear()
        self._block_after_drop = block
        self._drop_next = True

    def unblock(self) -> None:
        self.refusing = False

    def disconnect_all(self) -> None:
        """Close every proxied connection now."""
        async def close_all() -> None:
            for writer in list(self._writers):
                writer.close()

        self._thread.run(close_all())

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _on_client(self, client_reader: asyncio.StreamReader,
                         client_writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        self._writers |= {client_writer, upstream_writer}
        apis: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)
        doomed: set[int] = set()

        async def read_frame(reader: asyncio.StreamReader) -> bytes:
            (size,) = FRAME_PREFIX.unpack(await reader.readexactly(FRAME_PREFIX.size))
            return await reader.readexactly(size)

        async def requests() -> None:
            while True:
                frame = await read_frame(client_reader)
                api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
                apis[correlation_id] = (api_key, api_version)
                if api_key == ApiKey.PRODUCE:
                    self.produce_requests += 1
                    if self._drop_next or (self.drop_every and
                                           self.produce_requests % self.drop_every == 0):
                        self._drop_next = False
                        doomed.add(correlation_id)
                upstream_writer.write(FRAME_PREFIX.pack(len(frame)) + frame)
                await upstream_writer.drain()

        async def responses() -> None:
            while True:
                frame = await read_frame(upstream_reader)
                (correlation_id,) = struct.unpack_from(">i", frame)
                api_key, api_version = apis.pop(correlation_id, (None, 0))
                if correlation_id in doomed:
                    self.dropped += 1
                    if self._block_after_drop:
                        self._block_after_drop = False
                        self.refusing = True
                    self.dropped_event.set()
                    return  # the broker answered; the client never hears it
                if api_key == ApiKey.METADATA:
                    client_writer.write(self._rewrite_metadata(frame, api_version))
                else:
                    client_writer.write(FRAME_PREFIX.pack(len(frame)) + frame)
                await client_writer.drain()

        tasks = [asyncio.create_task(requests()), asyncio.create_task(responses())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_writer, upstream_writer):
            writer.close()
            self._writers.discard(writer)

    def _rewrite_metadata(self, frame: bytes, version: int) -> bytes:
        header, reader = read_response_header(frame)
        if header.error_code:
            return FRAME_PREFIX.pack(len(frame)) + frame
        body = decode(MetadataResponse, reader, version)
        for broker in body.brokers:
            if broker.port == self.upstream_port:
                broker.port = self.port
        chunks = encode_response(header.correlation_id, body, version)
        return b"".join(c if isinstance(c, bytes) else c.read_bytes() for c in chunks)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()

        self._thread.run(stop())
        self._thread.close()


@pytest.fixture
def proxy_factory() -> Iterator[Any]:
    proxies: list[ChaosProxy] = []

    def make(port: int) -> ChaosProxy:
        proxy = ChaosProxy(port)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()


# --------------------------------------------------------------------------- unit


KAFKA_MURMUR2 = {  # Kafka UtilsTest.testMurmur2, plus librdkafka's rdmurmur2.c vectors
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
    b"kafka": -798503068,
    b"giberish123456789": -1890243828,
    b"1234": -1614185708,
    b"234": -406844982,
    b"34": -2026295078,
}


def test_murmur2_matches_kafka_vectors() -> None:
    for data, expected in KAFKA_MURMUR2.items():
        assert murmur2(data) == expected, data
        assert murmur2(bytearray(data)) == expected
    assert to_positive(-(2**31)) == 0
    # partition = (murmur2 & 0x7fffffff) % n, as Kafka's BuiltInPartitioner.partitionForKey.
    assert partition_for_key(b"foobar", 50) == 16
    assert partition_for_key(b"599999", 12) == 3
    assert partition_for_key(b"1039-36302-36840-2-9f138052", 12) == 4
    assert partition_for_key(b"1388-20023-36900-2-c9985f66", 12) == 0


def test_sticky_partitioner_moves_only_when_its_batch_closes() -> None:
    import random

    sticky = StickyPartitioner(random.Random(7))
    first = sticky.partition("t", 4)
    assert all(sticky.partition("t", 4) == first for _ in range(10))
    sticky.batch_closed("t", (first + 1) % 4, 4)  # another partition's batch: no move
    assert sticky.partition("t", 4) == first
    seen = {first}
    previous = first
    for _ in range(40):
        sticky.batch_closed("t", previous, 4)
        current = sticky.partition("t", 4)
        assert current != previous
        seen.add(current)
        previous = current
    assert seen == {0, 1, 2, 3}
    sticky.batch_closed("one", sticky.partition("one", 1), 1)
    assert sticky.partition("one", 1) == 0


def test_config_validation() -> None:
    assert ProducerConfig.from_options("h:1", {}).idempotent
    assert ProducerConfig.from_options("h:1", {}).acks == -1
    # Like Kafka: idempotence left at its default is switched off by acks 0/1 ...
    assert not ProducerConfig.from_options("h:1", {"acks": 1}).idempotent
    assert not ProducerConfig.from_options("h:1", {"acks": "all", "retries": 0}).idempotent
    # ... but asked for explicitly with them it is an error.
    with pytest.raises(ValueError, match="requires acks='all'"):
        ProducerConfig.from_options("h:1", {"acks": 1, "enable_idempotence": True})
    with pytest.raises(ValueError, match="requires acks='all'"):
        ProducerConfig.from_options("h:1", {"acks": 0, "enable_idempotence": True})
    with pytest.raises(ValueError, match="compression"):
        ProducerConfig.from_options("h:1", {"compression": "gzip"})
    with pytest.raises(ValueError, match="acks"):
        ProducerConfig.from_options("h:1", {"acks": 2})
    with pytest.raises(ValueError, match="batch_size"):
        ProducerConfig.from_options("h:1", {"batch_size": 0})
    with pytest.raises(ValueError, match="unknown producer option"):
        ProducerConfig.from_options("h:1", {"lingerms": 3})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(ValueError, match="host:port"):
        Producer("nonsense")
    assert ProducerConfig.from_options("h:1", {"compression": "zstd"}).compression \
        is Compression.ZSTD


# --------------------------------------------------------------------------- round trips


def test_sync_round_trip(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("sync"), partitions=3)
    base_ts = 1_700_000_000_000
    records: list[dict[str, Any]] = []
    for i in range(60):
        records.append({
            "value": None if i == 7 else f"value-{i}".encode(),
            "key": None if i % 5 == 0 else f"key-{i}".encode(),
            "headers": [("trace", f"t{i}".encode()), ("n", None)] if i % 3 == 0 else None,
            "timestamp_ms": base_ts + i,
        })
    called: list[RecordMetadata] = []
    with Producer(broker.bootstrap, linger_ms=2) as producer:
        futures = [producer.send(topic, partition=1, **r) for r in records]
        for future in futures:
            future.add_done_callback(lambda f: called.append(f.result()))
        producer.send(topic, "as str", key="k-str", partition=1, headers={"h": b"v"},
                      timestamp_ms=base_ts + 100).result(30)
        _, pending = concurrent.futures.wait(futures, timeout=30)
        assert not pending and not futures[0].cancel()  # a queued record cannot be recalled
        metas = [f.result() for f in concurrent.futures.as_completed(futures, timeout=30)]
        metas.sort(key=lambda m: m.offset)
    assert sorted(called) == sorted(metas)
    assert [m.partition for m in metas] == [1] * 60
    assert [m.offset for m in metas] == list(range(60))
    assert [m.timestamp for m in metas] == [base_ts + i for i in range(60)]
    assert all(m.topic == topic for m in metas)

    table, _ = read_partition(broker.bootstrap, topic, 1)
    assert table.num_rows == 61
    assert table.column("offset").to_pylist() == list(range(61))
    assert table.column("value").to_pylist()[:60] == [r["value"] for r in records]
    assert table.column("key").to_pylist()[:60] == [r["key"] for r in records]
    assert table.column("timestamp").to_pylist()[:60] == [r["timestamp_ms"] for r in records]
    headers = table.column("headers").to_pylist()
    for r, h in zip(records, headers[:60], strict=True):
        expected = None if r["headers"] is None else [{"key": k, "value": v}
                                                      for k, v in r["headers"]]
        assert h == expected
    assert table.column("value")[60].as_py() == b"as str"
    assert table.column("key")[60].as_py() == b"k-str"
    assert headers[60] == [{"key": "h", "value": b"v"}]
    for other in (0, 2):
        assert read_partition(broker.bootstrap, topic, other)[0].num_rows == 0


def test_send_errors_are_typed(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("errors"), partitions=2,
                         configs={"max.message.bytes": "4000"})
    producer = Producer(broker.bootstrap, max_block_ms=2000, linger_ms=1)
    try:
        with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
            producer.send(_topic("missing"), b"x")
        with pytest.raises(ValueError, match="partition 5 does not exist"):
            producer.send(topic, b"x", partition=5)
        with pytest.raises(TypeError, match="must be bytes"):
            producer.send(topic, 12345)  # type: ignore[arg-type]
        # A broker-side, non-retriable error fails that batch's futures with its type ...
        assert producer.send(topic, b"small", partition=0).result(30).offset == 0
        with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
            producer.send(topic, b"L" * 10_000, partition=0).result(30)
        # ... and the partition goes on (under a fresh producer id: the failed batch used
        # up sequence numbers the broker never saw).
        assert producer.send(topic, b"small again", partition=0).result(30).offset == 1
    finally:
        producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send(topic, b"x")
    _, headers = read_partition(broker.bootstrap, topic, 0)
    assert [h.base_sequence for h in headers] == [0, 0]
    assert headers[0].producer_id != headers[1].producer_id


def test_async_round_trip_and_log_append_time(broker: BrokerProcess) -> None:
    create_time_topic = create_topic(broker.bootstrap, _topic("async"), partitions=2)
    append_topic = create_topic(broker.bootstrap, _topic("append"),
                                configs={"message.timestamp.type": "LogAppendTime"})

    async def main() -> tuple[list[RecordMetadata], list[RecordMetadata], float, float]:
        async with AsyncProducer(broker.bootstrap, linger_ms=1) as producer:
            futures = [await producer.send(create_time_topic, f"v{i}".encode(),
                                           key=f"k{i}".encode(), headers=[("i", str(i).encode())],
                                           timestamp_ms=1_000 + i) for i in range(40)]
            created = list(await asyncio.gather(*futures))
            before = time.time() * 1000
            appended = [await f for f in [await producer.send(append_topic, b"x",
                                                              timestamp_ms=5)
                                          for _ in range(10)]]
            after = time.time() * 1000
            return created, appended, before, after

    created, appended, before, after = asyncio.run(main())
    for meta, i in zip(created, range(40), strict=True):
        assert meta.partition == partition_for_key(f"k{i}".encode(), 2)
        assert meta.timestamp == 1_000 + i
    for partition in (0, 1):
        table, _ = read_partition(broker.bootstrap, create_time_topic, partition)
        mine = [(m.offset, i) for i, m in enumerate(created) if m.partition == partition]
        assert table.column("offset").to_pylist() == [o for o, _ in mine]
        assert table.column("value").to_pylist() == [f"v{i}".encode() for _, i in mine]
        assert table.column("headers").to_pylist() == [
            [{"key": "i", "value": str(i).encode()}] for _, i in mine]
    # LogAppendTime: the broker's clock, not the 5 ms the producer stamped.
    assert all(before - 1000 <= m.timestamp <= after + 1000 for m in appended)
    table, _ = read_partition(broker.bootstrap, append_topic, 0)
    assert table.column("timestamp").to_pylist() == [m.timestamp for m in appended]
    assert set(table.column("timestampType").to_pylist()) == {1}


def test_acks_levels(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("acks"))
    with Producer(broker.bootstrap, acks=1) as producer:
        assert not producer.config.idempotent
        metas = results([producer.send(topic, f"one-{i}".encode()) for i in range(10)])
        assert [m.offset for m in metas] == list(range(10))
    with Producer(broker.bootstrap, acks=0) as producer:
        metas = results([producer.send(topic, f"zero-{i}".encode()) for i in range(10)])
        assert {m.offset for m in metas} == {-1}
    deadline = time.monotonic() + 10
    while read_partition(broker.bootstrap, topic, 0)[0].num_rows < 20:
        assert time.monotonic() < deadline, "acks=0 records never arrived"
        time.sleep(0.05)
    _, headers = read_partition(broker.bootstrap, topic, 0)
    assert {h.producer_id for h in headers} == {-1}  # not idempotent with acks 0/1


# --------------------------------------------------------------------------- partitioning


def test_keys_land_on_kafka_partitions(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("keys"), partitions=6)
    keys = [f"user-{i}".encode() for i in range(60)]
    with Producer(broker.bootstrap) as producer:
        first = results([producer.send(topic, b"a", key=k) for k in keys])
        second = results([producer.send(topic, b"b", key=k) for k in keys])
    for key, a, b in zip(keys, first, second, strict=True):
        assert a.partition == b.partition == partition_for_key(key, 6)
    assert len({m.partition for m in first}) == 6
    for partition in range(6):
        table, _ = read_partition(broker.bootstrap, topic, partition)
        assert all(partition_for_key(k, 6) == partition for k in table.column("key").to_pylist())


def test_sticky_partitioning_for_null_keys(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("sticky"), partitions=4)
    with Producer(broker.bootstrap, linger_ms=2000, batch_size=1 << 20) as producer:
        futures = [producer.send(topic, b"x" * 100) for _ in range(20)]
        producer.flush()
        assert len({m.partition for m in results(futures)}) == 1  # one batch, one partition
    with Producer(broker.bootstrap, linger_ms=2000, batch_size=1000) as producer:
        futures = [producer.send(topic, b"y" * 100) for _ in range(100)]
        producer.flush()
        partitions = [m.partition for m in results(futures)]
    runs = [(p, len(list(group))) for p, group in itertools.groupby(partitions)]
    # Each batch (8 records of 116 estimated bytes under batch_size=1000) fills one
    # partition, then the sticky partition moves to a different one.
    assert [n for _, n in runs] == [8] * 12 + [4]
    assert all(a != b for (a, _), (b, _) in itertools.pairwise(runs))
    assert len(set(partitions)) > 1


# --------------------------------------------------------------------------- batching


def test_linger_and_batch_size_form_batches(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("batching"), partitions=2)
    # linger_ms=1000: the 300 sends fit in few batches even when the machine is slow
    # (len(headers) <= 3 below leaves them up to ~3 s).
    with Producer(broker.bootstrap, linger_ms=1000, batch_size=1 << 20) as producer:
        started = time.monotonic()
        futures = [producer.send(topic, f"{i:04d}".encode(), partition=0) for i in range(300)]
        metas = results(futures)
        waited = time.monotonic() - started
    assert [m.offset for m in metas] == list(range(300))
    assert waited >= 0.95  # nothing left before linger expired
    _, headers = read_partition(broker.bootstrap, topic, 0)
    assert sum(h.record_count for h in headers) == 300
    assert len(headers) <= 3 and max(h.record_count for h in headers) >= 100

    # A linger (60 s) longer than results()'s 30 s wait: batches that waited for it
    # would time out there, however fast or slow the machine.
    with Producer(broker.bootstrap, linger_ms=60_000, batch_size=1000) as producer:
        futures = [producer.send(topic, b"z" * 100, partition=1) for i in range(96)]
        # 8 records of 116 estimated bytes fill a batch: the 9th does not fit in 1000.
        # The first 11 batches went out full without waiting for linger ...
        results(futures[:88], timeout=30)
        # ... the 12th holds 8 records too but waits for its linger (or a flush).
        assert not futures[-1].done()
        producer.flush()
        assert [m.offset for m in results(futures)] == list(range(96))
    _, headers = read_partition(broker.bootstrap, topic, 1)
    assert [h.record_count for h in headers] == [8] * 12


def test_compression(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("compress"), partitions=3)
    values = [(f"record {i} " * 40).encode() for i in range(200)]
    sizes: dict[str, int] = {}
    for partition, codec in enumerate(("none", "lz4", "zstd")):
        with Producer(broker.bootstrap, compression=codec, linger_ms=50) as producer:
            results([producer.send(topic, v, partition=partition) for v in values])
        table, headers = read_partition(broker.bootstrap, topic, partition)
        assert table.column("value").to_pylist() == values
        assert {h.compression for h in headers} == {Compression.parse(codec)}
        sizes[codec] = sum(h.size for h in headers)
    assert sizes["lz4"] < sizes["none"] / 3
    assert sizes["zstd"] < sizes["none"] / 3


def test_send_batch_columnar_fast_path(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("columnar"), partitions=4)
    values = pa.array([f"{i:08d}".encode() for i in range(20_000)], pa.binary())
    with Producer(broker.bootstrap, batch_size=64 * 1024) as producer:
        parts = producer.send_batch(topic, values, partition=2,
                                    timestamp_ms=1_700_000_000_123).result(30)
        assert sum(p.record_count for p in parts) == 20_000 and len(parts) > 1
        assert [p.base_offset for p in parts] == list(itertools.accumulate(
            [0] + [p.record_count for p in parts[:-1]]))
        sticky = producer.send_batch(topic, pa.array(["s"] * 5000)).result(30)
        keys = [f"k{i}".encode() for i in range(500)]
        keyed = producer.send_batch(topic, [b"v"] * 500, keys=keys).result(30)
    table, headers = read_partition(broker.bootstrap, topic, 2)
    own = table.slice(0, 20_000)
    assert own.column("value").equals(pa.chunked_array([values]))
    mine = [h for h in headers if h.base_offset < 20_000]
    assert [h.record_count for h in mine] == [p.record_count for p in parts]
    # Every row and each batch header's bounds carry the one timestamp given.
    assert set(own.column("timestamp").to_pylist()) == {1_700_000_000_123}
    assert {(h.first_timestamp, h.max_timestamp) for h in mine} == \
        {(1_700_000_000_123, 1_700_000_000_123)}
    # Chunks hold about batch_size estimated bytes (8-byte values + 16 = 24 each) and
    # their encoding carries only their own rows, not the whole input column.
    assert all(h.record_count <= 64 * 1024 // 24 + 1 for h in mine)
    assert all(h.size < 2 * 64 * 1024 for h in mine)
    assert sum(p.record_count for p in sticky) == 5000
    if len(sticky) > 1:  # chunks rotate over the partitions like sticky batches
        assert all(a.partition != b.partition for a, b in itertools.pairwise(sticky))
    for meta in keyed:
        table, _ = read_partition(broker.bootstrap, topic, meta.partition)
        got = table.slice(meta.base_offset, meta.record_count).column("key").to_pylist()
        assert all(partition_for_key(k, 4) == meta.partition for k in got)
    assert sum(p.record_count for p in keyed) == 500


def test_small_send_batch_calls_share_wire_batches_under_load(broker: BrokerProcess) -> None:
    """Chunks that queue behind a partition's in-flight batch join one wire batch (up to
    batch_size); each call's future still names exactly its own rows' offsets."""
    topic = create_topic(broker.bootstrap, _topic("merged"), partitions=1)
    calls = [[f"{c:04d}-{i:02d}".encode() for i in range(1 + c % 7)] for c in range(300)]

    async def send_all() -> list[list[Any]]:
        async with AsyncProducer(broker.bootstrap, linger_ms=0,
                                 batch_size=4 * 1024) as producer:
            futures = [await producer.send_batch(topic, pa.array(values, pa.binary()),
                                                 partition=0, timestamp_ms=1_000 + c)
                       for c, values in enumerate(calls)]
            return [await future for future in futures]

    results = asyncio.run(send_all())
    table, headers = read_partition(broker.bootstrap, topic, 0)
    stored = table.column("value").to_pylist()
    stamps = table.column("timestamp").to_pylist()
    assert len(stored) == sum(map(len, calls))
    for c, (values, parts) in enumerate(zip(calls, results, strict=True)):
        got = [v for p in parts for v in stored[p.base_offset:p.base_offset + p.record_count]]
        assert got == values, f"call {c}: its futures name other rows"
        assert all(stamps[p.base_offset] == 1_000 + c for p in parts)
    assert len(headers) < len(calls) // 4, "the small calls were not merged"
    assert all(h.size <= 2 * 4 * 1024 for h in headers)
    for h in headers:  # each batch's timestamp bounds cover its merged chunks
        own = stamps[h.base_offset:h.base_offset + h.record_count]
        assert (h.first_timestamp, h.max_timestamp) == (min(own), max(own))


# --------------------------------------------------------------------------- produce()

Call: TypeAlias = tuple[tuple[Any, ...], dict[str, Any]]


def _produce(face: str, bootstrap: str, calls: list[Call], **options: Any
             ) -> DeliveryFailedError | None:
    """``produce`` every call on the blocking or the asyncio face, then flush; what the
    flush raised (a delivery report), if anything. The same body for both faces."""
    if face == "sync":
        with Producer(bootstrap, **options) as producer:
            for args, kwargs in calls:
                producer.produce(*args, **kwargs)
            try:
                producer.flush()
            except DeliveryFailedError as err:
                return err
            return None

    async def on_loop() -> DeliveryFailedError | None:
        async with AsyncProducer(bootstrap, **options) as producer:
            for args, kwargs in calls:
                await producer.produce(*args, **kwargs)
            try:
                await producer.flush()
            except DeliveryFailedError as err:
                return err
            return None

    return asyncio.run(on_loop())


@pytest.mark.parametrize("face", ["sync", "async"])
def test_produce_mixes_plain_and_rich_records(broker: BrokerProcess, face: str) -> None:
    """``produce`` (no future per record): bare values take the fast path, records with
    a key, headers, timestamp, partition or callback the full one, and all of them land
    in one order with every column aligned (keys and headers are kept sparse)."""
    topic = create_topic(broker.bootstrap, _topic(f"produce-{face}"), partitions=2)
    heard: list[tuple[RecordMetadata | None, BaseException | None]] = []
    before = int(time.time() * 1000)
    calls: list[Call] = [
        ((topic, b"p0"), {"partition": 1}),  # pins nothing: explicit partition
        ((topic, b"k1"), {"key": b"key1", "partition": 1}),
        ((topic, b"p2"), {"partition": 1}),
        ((topic, "s3"), {"headers": {"h": b"v"}, "partition": 1}),
        ((topic, b"p4"), {"timestamp_ms": 1234, "partition": 1}),
        ((topic, None), {"partition": 1,
                         "on_delivery": lambda meta, err: heard.append((meta, err))}),
        ((topic, b"p6"), {"partition": 1}),
    ]
    calls += [((topic, f"bulk-{i}".encode()), {}) for i in range(3000)]  # sticky
    assert _produce(face, broker.bootstrap, calls, linger_ms=20) is None
    after = int(time.time() * 1000)
    table, _ = read_partition(broker.bootstrap, topic, 1)
    rich = table.slice(0, 7)
    assert rich.column("value").to_pylist() == [b"p0", b"k1", b"p2", b"s3", b"p4", None,
                                                b"p6"]
    assert rich.column("key").to_pylist() == [None, b"key1", None, None, None, None, None]
    assert rich.column("headers").to_pylist() == [None, None, None,
                                                  [{"key": "h", "value": b"v"}],
                                                  None, None, None]
    stamps = rich.column("timestamp").to_pylist()
    assert stamps[4] == 1234
    assert all(before <= t <= after for i, t in enumerate(stamps) if i != 4)
    assert len(heard) == 1 and heard[0][1] is None
    assert heard[0][0] == RecordMetadata(topic, 1, 5, stamps[5])
    bulk = [v for p in (0, 1)
            for v in read_partition(broker.bootstrap, topic, p)[0].column("value").to_pylist()
            if v is not None and v.startswith(b"bulk-")]
    assert sorted(bulk) == sorted(f"bulk-{i}".encode() for i in range(3000))


@pytest.mark.parametrize("face", ["sync", "async"])
def test_produce_failures_are_heard(broker: BrokerProcess, face: str) -> None:
    """A failed ``produce`` record reaches its callback, or, without one, the next
    ``flush`` as ``DeliveryFailedError`` (once), or ``close``; a block's own exception
    is not replaced by the report."""
    topic = create_topic(broker.bootstrap, _topic(f"fail-{face}"), partitions=2,
                         configs={"max.message.bytes": "4000"})
    heard: list[tuple[RecordMetadata | None, BaseException | None]] = []
    calls: list[Call] = [
        ((topic, b"fine"), {"partition": 0}),
        ((topic, b"L" * 10_000), {"partition": 1}),  # too large for the broker
        ((topic, b"L" * 10_000), {"partition": 1,
                                  "on_delivery": lambda meta, err: heard.append((meta, err))}),
    ]
    report = _produce(face, broker.bootstrap, calls, linger_ms=50)
    assert isinstance(report, DeliveryFailedError)
    assert report.code == 1003 and report.name == "DELIVERY_FAILED"
    assert report.records == 1 and "1 record(s)" in str(report)
    assert [(f.topic, f.partition, f.records) for f in report.failures] == [(topic, 1, 1)]
    assert isinstance(report.failures[0].error, RecordTooLargeError)
    assert len(heard) == 1 and heard[0][0] is None
    assert isinstance(heard[0][1], RecordTooLargeError)
    assert read_partition(broker.bootstrap, topic, 0)[0].column("value").to_pylist() == [
        b"fine"]

    with Producer(broker.bootstrap, linger_ms=50) as producer:
        producer.produce(topic, b"L" * 10_000, partition=1)
        with pytest.raises(DeliveryFailedError):
            producer.flush()
        producer.flush()  # reported once: nothing new
        producer.produce(topic, b"L" * 10_000, partition=1)
        with pytest.raises(DeliveryFailedError, match="1 record"):
            producer.close()  # close reports what flush did not
    with pytest.raises(KeyError), Producer(broker.bootstrap) as producer:
        producer.produce(topic, b"L" * 10_000, partition=1)
        raise KeyError("the block's own error wins")


def test_produce_callbacks_of_a_whole_batch(broker: BrokerProcess,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Callbacks on most records of one batch (the ``callbacks`` column), records
    without one and records sent with a future between them: every callback once, in
    offset order, with its record's own offset and timestamp; one that raises is logged
    and the rest still run; a failed batch gives every callback the error and leaves
    only the records without one to ``DeliveryFailedError``; acks=0 gives offset -1."""
    topic = create_topic(broker.bootstrap, _topic("callbacks"), partitions=1)
    heard: list[tuple[int, RecordMetadata | None, BaseException | None]] = []

    def hear(i: int) -> Any:
        def on_delivery(meta: RecordMetadata | None, err: BaseException | None) -> None:
            heard.append((i, meta, err))
            if i == 7:
                raise RuntimeError("a callback that raises")
        return on_delivery

    futures: dict[int, concurrent.futures.Future[RecordMetadata]] = {}
    with Producer(broker.bootstrap, linger_ms=200) as producer:
        for i in range(60):
            if i % 10 == 3:
                producer.produce(topic, b"v%d" % i)  # no callback
            elif i % 10 == 5:
                futures[i] = producer.send(topic, b"v%d" % i)
            elif i == 41:
                producer.produce(topic, b"v%d" % i, timestamp_ms=1234, on_delivery=hear(i))
            else:
                producer.produce(topic, b"v%d" % i, on_delivery=hear(i))
    table, _ = read_partition(broker.bootstrap, topic, 0)
    values = table.column("value").to_pylist()
    stamps = table.column("timestamp").to_pylist()
    assert values == [b"v%d" % i for i in range(60)]
    called = [i for i in range(60) if i % 10 not in (3, 5)]
    assert [i for i, _, _ in heard] == called  # each once, in record order
    for i, meta, err in heard:
        assert err is None and meta == RecordMetadata(topic, 0, i, stamps[i])
    assert stamps[41] == 1234
    assert {i: f.result(0).offset for i, f in futures.items()} == {i: i for i in futures}
    assert "a callback that raises" in caplog.text

    small = create_topic(broker.bootstrap, _topic("callbacks-fail"), partitions=1,
                         configs={"max.message.bytes": "4000"})
    heard.clear()
    with Producer(broker.bootstrap, linger_ms=200) as producer:
        for i in range(40):
            producer.produce(small, b"L" * 200, on_delivery=None if i % 4 == 0 else hear(i))
        with pytest.raises(DeliveryFailedError) as report:
            producer.flush()
    assert report.value.records == 10
    assert [i for i, _, _ in heard] == [i for i in range(40) if i % 4]
    assert all(meta is None and isinstance(err, RecordTooLargeError)
               for _, meta, err in heard)

    heard.clear()
    with Producer(broker.bootstrap, acks=0, enable_idempotence=False) as producer:
        for i in range(5):
            producer.produce(topic, b"zero", on_delivery=hear(i + 100))
    assert [(i, meta.offset if meta else None, err) for i, meta, err in heard] == [
        (i + 100, -1, None) for i in range(5)]


def test_produce_from_many_threads_keeps_each_threads_order(broker: BrokerProcess) -> None:
    """The blocking face's fast path under contention: four threads, one partition,
    idempotent acks=all: every record once, each thread's records in its order."""
    topic = create_topic(broker.bootstrap, _topic("threads"))
    per_thread = 20_000
    with Producer(broker.bootstrap, linger_ms=2, batch_size=64 * 1024) as producer:
        def work(thread: int) -> None:
            for i in range(per_thread):
                producer.produce(topic, struct.pack(">II", thread, i))
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        producer.flush()
    values = read_partition(broker.bootstrap, topic, 0)[0].column("value").to_pylist()
    assert len(values) == 4 * per_thread
    seen: dict[int, list[int]] = {t: [] for t in range(4)}
    for value in values:
        thread, i = struct.unpack(">II", value)
        seen[thread].append(i)
    assert all(seen[t] == list(range(per_thread)) for t in range(4))

# ----------------------------------------------------------------- the C fast path


def _python_path(producer: Producer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``producer`` take the pure-Python path, as where the C helper is not built."""
    vars(producer).pop("produce", None)  # the class's method again
    monkeypatch.setattr(accumulator_module, "_binary_column", None)


def test_produce_c_path_is_built_and_used(broker: BrokerProcess) -> None:
    """`make setup` builds strata/client/_fastproduce.c; a plain producer answers
    ``produce`` with it, a transactional one keeps the method (each record checks the
    transaction), and batches are built by its column helper."""
    from strata.client import _fastproduce

    assert _fastproduce.AVAILABLE and accumulator_module.native_columns()
    with Producer(broker.bootstrap) as producer:
        assert type(producer.produce) is _fastproduce.FastProduce
        assert producer.produce.slow == Producer.produce.__get__(producer, Producer)
    with Producer(broker.bootstrap, transactional_id=_topic("fast-txn")) as producer:
        assert "produce" not in vars(producer)


@pytest.mark.parametrize("path", ["c", "python"])
def test_produce_paths_write_the_same(broker: BrokerProcess, path: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way of calling ``produce`` lands the same on the C path and the Python
    one: positional and keyword forms, callbacks on some records (a sparse column),
    rich records (the Python path either way), tombstones, records that do not fit the
    open batch; one partition, so one order."""
    topic = create_topic(broker.bootstrap, _topic(f"paths-{path}"), partitions=1)
    heard: list[tuple[int, RecordMetadata | None, BaseException | None]] = []

    def hear(i: int) -> Any:
        return lambda meta, err: heard.append((i, meta, err))

    expected: list[tuple[bytes | None, bytes | None]] = []
    with Producer(broker.bootstrap, linger_ms=100, batch_size=4096) as producer:
        if path == "python":
            _python_path(producer, monkeypatch)
        produce = producer.produce
        for i in range(300):
            value = b"v%d" % i + b"." * (i % 50)
            form = i % 10
            if form == 0:
                produce(topic, value)
            elif form == 1:
                produce(topic, value, on_delivery=hear(i))
            elif form == 2:
                produce(topic, value, None, None, None, None, hear(i))
            elif form == 3:
                produce(topic, value, key=None, headers=None, partition=None,
                        timestamp_ms=None, on_delivery=None)
            elif form == 4:
                produce(topic, value, b"k%d" % i, on_delivery=hear(i))
            elif form == 5:
                produce(topic, value, headers={"h": b"x"})
            elif form == 6:
                produce(topic, None, on_delivery=hear(i))  # a tombstone
            elif form == 7:
                produce(topic, value, partition=0, on_delivery=hear(i))
            elif form == 8:
                produce(topic, value, timestamp_ms=1_000 + i)
            else:
                produce(topic, bytearray(value), on_delivery=hear(i))  # not exact bytes
            expected.append((None if form == 6 else value,
                             b"k%d" % i if form == 4 else None))
    table, _ = read_partition(broker.bootstrap, topic, 0)
    assert list(zip(table.column("value").to_pylist(), table.column("key").to_pylist(),
                    strict=True)) == expected
    stamps = table.column("timestamp").to_pylist()
    assert [stamps[i] for i in range(8, 300, 10)] == [1_000 + i for i in range(8, 300, 10)]
    called = [i for i in range(300) if i % 10 in (1, 2, 4, 6, 7, 9)]
    assert [i for i, _, _ in heard] == called
    assert all(err is None and meta == RecordMetadata(topic, 0, i, stamps[i])
               for i, meta, err in heard)
    headers = table.column("headers").to_pylist()
    assert [i for i, h in enumerate(headers) if h] == list(range(5, 300, 10))


@pytest.mark.parametrize("path", ["c", "python"])
def test_produce_rejects_bad_calls_before_queueing(broker: BrokerProcess, path: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad call raises on either path and queues nothing: an unknown keyword, a
    parameter given twice, a callback that is not callable, a value of no bytes type."""
    topic = create_topic(broker.bootstrap, _topic(f"bad-calls-{path}"), partitions=1)
    with Producer(broker.bootstrap, linger_ms=50) as producer:
        if path == "python":
            _python_path(producer, monkeypatch)
        producer.produce(topic, b"first")  # an open sticky batch for the C path
        with pytest.raises(TypeError, match="unexpected keyword"):
            producer.produce(topic, b"x", colour=None)
        with pytest.raises(TypeError, match="multiple values"):
            producer.produce(topic, b"x", None, key=None)
        with pytest.raises(TypeError, match="multiple values"):
            producer.produce(topic, b"x", None, None, None, None, None, on_delivery=None)
        with pytest.raises(TypeError, match="on_delivery must be a callable"):
            producer.produce(topic, b"x", on_delivery=42)
        with pytest.raises(TypeError):
            producer.produce(topic, 42)
        with pytest.raises(TypeError):
            producer.produce(topic)
        producer.produce(topic, b"last")
    table, _ = read_partition(broker.bootstrap, topic, 0)
    assert table.column("value").to_pylist() == [b"first", b"last"]


def test_produce_c_path_waits_for_the_accumulator_lock(broker: BrokerProcess) -> None:
    """The C path appends only while no thread holds the accumulator's lock: with the
    lock held (as the I/O thread holds it while it seals batches), a ``produce`` of the
    common record waits for it, as the Python path does, instead of appending under
    the holder's feet."""
    topic = create_topic(broker.bootstrap, _topic("lock"), partitions=1)
    with Producer(broker.bootstrap, linger_ms=50) as producer:
        producer.produce(topic, b"opens the batch")
        done = threading.Event()

        def worker() -> None:
            producer.produce(topic, b"waits")
            done.set()

        with producer._accumulator.lock:
            thread = threading.Thread(target=worker)
            thread.start()
            assert not done.wait(0.5)  # blocked behind the lock, not appended
        assert done.wait(10)
        thread.join(10)
    table, _ = read_partition(broker.bootstrap, topic, 0)
    assert table.column("value").to_pylist() == [b"opens the batch", b"waits"]


def test_produce_and_consume_never_import_pandas(broker: BrokerProcess) -> None:
    """pyarrow imports pandas (0.2-0.5 CPU-s) the first time it converts a Python list
    or scalar; the per-record produce path (with keys and callbacks) and the consumer's
    fetch path build their columns and scalars without that, in a fresh process."""
    topic = create_topic(broker.bootstrap, _topic("no-pandas"), partitions=2)
    script = f"""
import sys
from strata.client import Consumer, Producer, TopicPartition
heard = []
with Producer({broker.bootstrap!r}, linger_ms=5) as producer:
    for i in range(500):
        producer.produce({topic!r}, b"v%d" % i, key=b"k%d" % (i % 7) if i % 3 else None,
                         on_delivery=lambda meta, err: heard.append(err))
assert len(heard) == 500 and not any(heard), heard[:3]
parts = [TopicPartition({topic!r}, p) for p in (0, 1)]
with Consumer({broker.bootstrap!r}, auto_offset_reset="earliest") as consumer:
    consumer.assign(parts)
    rows = 0
    for _ in range(50):
        rows += consumer.poll_arrow(timeout_ms=200).num_rows
        if rows == 500:
            break
assert rows == 500, rows
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False"


def test_binary_column_matches_arrow() -> None:
    """``binary_array`` (the C helper's buffers) equals ``pa.array`` for lists of bytes
    and None of every shape, and hands back anything else untouched."""
    from strata.client._accumulator import binary_array

    rng = random.Random(7)
    cases: list[list[bytes | None]] = [[], [b""], [None], [None] * 9, [b"a"] * 8,
                                       [b"x" * 70_000, None, b""]]
    cases += [[None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 40))
               for _ in range(rng.randrange(1, 200))] for _ in range(50)]
    for items in cases:
        built = binary_array(items)
        assert isinstance(built, pa.Array)
        built.validate(full=True)
        assert built.equals(pa.array(items, pa.binary()))
    for other in (["text"], [b"a", bytearray(b"b")], [b"a", 1]):
        assert binary_array(other) is other  # type: ignore[arg-type]



def test_accumulator_reservations_and_sparse_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffer accounting under reservations: an open batch holds a reservation its
    records count down; closing it gives the rest back, so once every batch is closed
    ``buffered`` is exactly the records' size estimate. Sparse keys/headers are padded
    to the batch on close, and no batch passes ``batch_size`` or the record limit."""
    import strata.client._accumulator as accumulator_module

    monkeypatch.setattr(accumulator_module, "MAX_RECORDS_PER_BATCH", 50)
    loop = asyncio.new_event_loop()
    try:
        wakeup = Wakeup(loop)
        accumulator = Accumulator(ProducerConfig.from_options(
            "h:1", {"batch_size": 4000, "buffer_memory": 1 << 20}), wakeup,
            {"t": {0: None, 1: None}})
        loop.call_soon(wakeup.start)
        loop.run_until_complete(asyncio.sleep(0))
        expected = 0
        for i in range(400):
            key = f"k{i}".encode() if i % 7 == 3 else None
            headers = {"n": b"x"} if i % 11 == 5 else None
            value = b"v" * (i % 90)
            assert accumulator.add("t", value, key, headers, None, None, None, True)
            expected += 16 + len(value) + (len(key) if key else 0) + (2 if headers else 0)
        assert accumulator.buffered >= expected  # open batches hold reservations
        accumulator.ready(time.monotonic(), True, None)  # force: close every batch
        batches = accumulator.batches()
        assert accumulator.buffered == expected == sum(b.size for b in batches)
        assert sum(b.count for b in batches) == 400
        for batch in batches:
            assert batch.size <= 4000 and batch.count <= 50
            for column in (batch.keys, batch.headers):
                assert column is None or len(column) == batch.count
    finally:
        loop.close()


def test_a_sender_pass_looks_only_at_partitions_with_batches() -> None:
    """``ready`` visits the queues that hold a batch, not every partition ever written
    (after a first write to 10,000 partitions, every pass of the I/O thread visited all
    of them); a queue emptied by its acknowledgement drops out and comes back with its
    next record, which is then sent as before."""
    loop = asyncio.new_event_loop()
    try:
        wakeup = Wakeup(loop)
        accumulator = Accumulator(ProducerConfig.from_options("h:1", {}), wakeup,
                                  {"t": dict.fromkeys(range(1000))})
        loop.call_soon(wakeup.start)
        loop.run_until_complete(asyncio.sleep(0))
        for p in range(1000):
            assert accumulator.add("t", b"x", None, None, p, None, None, True)
        ready, _, _ = accumulator.ready(time.monotonic(), True, None)
        assert len(ready) == 1000 and len(accumulator._active) == 1000
        for st in ready:  # every batch acknowledged
            assert accumulator.release(st, st.queue[0])
        assert accumulator.ready(time.monotonic(), True, None)[0] == []
        assert accumulator._active == {} and len(accumulator.partitions) == 1000
        assert accumulator.add("t", b"y", None, None, 7, None, None, True)
        ready, _, _ = accumulator.ready(time.monotonic(), True, None)
        assert [st.key for st in ready] == [("t", 7)]
        assert [b.values for b in ready[0].queue] == [[b"y"]]
        assert accumulator.buffered == ready[0].queue[0].size
    finally:
        loop.close()


def test_a_typed_batch_never_mixes_schema_versions() -> None:
    """Records converted under another schema version (the subject's latest moved while
    a batch was open) start a new batch, whatever the ids' order: a text keeps the id it
    got in another subject, so a newer version may have a lower id, and rewriting the
    batch under the "highest" id would drop the newer version's fields."""
    from strata.client._schemas import TypedValue
    from wire.schema import parse_schema, records_to_arrow

    v1 = parse_schema('{"type": "record", "name": "R", "fields": [{"name": "id", '
                      '"type": "long"}]}')
    v2 = parse_schema('{"type": "record", "name": "R", "fields": [{"name": "id", '
                      '"type": "long"}, {"name": "note", "type": ["null", "string"], '
                      '"default": null}]}')
    loop = asyncio.new_event_loop()
    try:
        wakeup = Wakeup(loop)
        accumulator = Accumulator(ProducerConfig.from_options("h:1", {}), wakeup,
                                  {"t": {0: None}})
        loop.call_soon(wakeup.start)
        loop.run_until_complete(asyncio.sleep(0))
        sent = [(5, v1, {"id": 1}), (5, v1, {"id": 2}), (3, v2, {"id": 3, "note": "n"}),
                (3, v2, {"id": 4, "note": None}), (5, v1, {"id": 5})]
        for schema_id, schema, record in sent:
            value = TypedValue(schema_id, schema, records_to_arrow([record], schema))
            assert accumulator.add("t", value, None, None, 0, None, None, True)
        accumulator.ready(time.monotonic(), True, None)
        batches = accumulator.batches()
        assert [b.count for b in batches] == [2, 2, 1]
        columns = [typed_column(b.values) for b in batches]
        assert [schema_id for schema_id, _ in columns] == [5, 3, 5]
        assert [row for _, column in columns for row in column.to_pylist()] == \
            [record for _, _, record in sent]
        with pytest.raises(InvalidRecordBatchError, match="schema ids"):
            typed_column([*batches[0].values, *batches[1].values])
    finally:
        loop.close()


def test_produce_rejects_bad_records_before_queueing(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("reject"))
    with Producer(broker.bootstrap) as producer:
        for bad, error in ((-1, "must be in 0.."), (1 << 63, "must be in 0..")):
            with pytest.raises(ValueError, match=error):
                producer.produce(topic, b"x", timestamp_ms=bad)
            with pytest.raises(ValueError, match=error):
                producer.send_batch(topic, [b"x", b"y"], timestamp_ms=bad)
        with pytest.raises(TypeError, match="must be bytes"):
            producer.produce(topic, 5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="partition 3 does not exist"):
            producer.produce(topic, b"x", partition=3)
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.produce(_topic("missing"), b"x")
        assert producer._accumulator.buffered == 0  # nothing of them was queued
        # Any int64 of ms is a timestamp, as in Kafka: far past what the clock's
        # nanoseconds (kept for the records that take "now") could hold.
        far = (1 << 63) - 1
        year_9999 = 253_402_300_799_999
        metas = [producer.send(topic, b"late", timestamp_ms=ts) for ts in (year_9999, far)]
        producer.produce(topic, b"now")
        producer.flush()
        assert [m.result(30).timestamp for m in metas] == [year_9999, far]
    stamps = read_partition(broker.bootstrap, topic, 0)[0].column("timestamp").to_pylist()
    assert stamps[:2] == [year_9999, far] and 0 < stamps[2] < year_9999
    with pytest.raises(ProducerClosedError):
        producer.produce(topic, b"x")


# --------------------------------------------------------------------------- back-pressure


def test_back_pressure_raise(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, _topic("raise"))
    with Producer(broker.bootstrap, buffer_memory=2000, linger_ms=60_000,
                  batch_size=1 << 20, on_buffer_full="raise") as producer:
        futures = [producer.send(topic, b"r" * 100) for _ in range(17)]  # 17 * 116 bytes
        with pytest.raises(BufferFullError) as caught:
            producer.send(topic, b"r" * 100)
        assert caught.value.code == 1000 and caught.value.name == "BUFFER_FULL"
        assert "buffer_memory=2000" in str(caught.value) and caught.value.retriable
        producer.flush()
        assert [m.offset for m in results(futures)] == list(range(17))
        after = producer.send(topic, b"after")  # room again
        producer.flush()
        assert after.result(30).offset == 17


def test_back_pressure_block(broker: BrokerProcess) -> None:
    """A full buffer blocks ``send`` (both faces) until acknowledgements free it, and
    for no longer than ``max_block_ms``. The broker is paused (SIGSTOP) while the
    buffer is full so nothing is acknowledged meanwhile: a full buffer sends its
    batches at once, whatever ``linger_ms`` says (as Kafka's does)."""
    topic = create_topic(broker.bootstrap, _topic("block"))
    options: dict[str, Any] = {"buffer_memory": 2000, "linger_ms": 60_000,
                               "batch_size": 1 << 20}
    with Producer(broker.bootstrap, max_block_ms=10_000, **options) as producer:
        producer.send(topic, b"first")
        producer.flush()  # metadata and producer id are in
        broker.pause()
        try:
            for _ in range(17):  # 17 * 116 bytes of the 2,000
                producer.send(topic, b"b" * 100)
            blocked: list[concurrent.futures.Future[RecordMetadata]] = []
            sender = threading.Thread(
                target=lambda: blocked.append(producer.send(topic, b"l" * 100)))
            sender.start()
            time.sleep(0.3)
            assert sender.is_alive() and not blocked  # waiting for buffer space
        finally:
            broker.resume()
        sender.join(10)  # acknowledgements free the buffer
        assert not sender.is_alive()
        producer.flush()
        assert blocked[0].result(10).offset == 18
    with Producer(broker.bootstrap, max_block_ms=200, **options) as producer:
        producer.send(topic, b"first")
        producer.flush()
        broker.pause()
        try:
            for _ in range(17):
                producer.send(topic, b"b" * 100)
            started = time.monotonic()
            with pytest.raises(BufferFullError, match="max_block_ms=200"):
                producer.send(topic, b"b" * 100)
            assert time.monotonic() - started >= 0.19
        finally:
            broker.resume()

    async def async_block() -> None:
        async with AsyncProducer(broker.bootstrap, **options) as producer:
            await producer.produce(topic, b"first")
            await producer.flush()
            broker.pause()
            try:
                for _ in range(17):
                    await producer.produce(topic, b"a" * 100)
                late = asyncio.create_task(producer.produce(topic, b"l" * 100))
                await asyncio.sleep(0.2)
                assert not late.done()
            finally:
                broker.resume()
            await asyncio.wait_for(late, 10)
            await producer.flush()  # nothing failed: flush raises no DeliveryFailedError

    asyncio.run(async_block())


def _full_accumulator(**options: Any) -> tuple[asyncio.AbstractEventLoop, Accumulator, Chunks]:
    """An accumulator bound to a fresh loop (this thread is its loop thread), with room
    for two of the four 500-byte ``send_batch`` chunks returned; nothing drains it."""
    loop = asyncio.new_event_loop()
    wakeup = Wakeup(loop)
    accumulator = Accumulator(ProducerConfig.from_options(
        "h:1", {"buffer_memory": 1000, "batch_size": 500, **options}), wakeup, {"t": {0: None}})
    loop.call_soon(wakeup.start)
    loop.run_until_complete(asyncio.sleep(0))
    chunks = accumulator.plan_columns("t", 1, pa.array([b"v" * 84] * 20), None, 0, 0)
    assert [(rows.num_rows, size, ts) for _, rows, size, ts in chunks] == [(5, 500, 0)] * 4
    return loop, accumulator, chunks


def test_send_batch_back_pressure_in_both_faces() -> None:
    """One queueing for both faces: a full buffer raises, naming what was queued before
    it (``raise``; ``block`` past ``max_block_ms`` or on the loop thread, e.g. from a
    delivery callback), and freed space lets a waiting call go on."""
    def release_two(accumulator: Accumulator) -> None:
        queue = accumulator.partitions[("t", 0)]
        for _ in range(2):
            accumulator.release(queue, queue.queue[0])

    def in_thread(accumulator: Accumulator, chunks: Chunks, group: SendBatchGroup,
                  free: bool) -> None:
        caller = concurrent.futures.ThreadPoolExecutor(1)
        done = caller.submit(accumulator.append_chunks_blocking, "t", 1, chunks, group)
        time.sleep(0.3)
        assert done.done() != free  # still waiting for space when it will be freed
        if free:
            release_two(accumulator)
        try:
            done.result(10)
        finally:
            caller.shutdown()

    async def on_loop(accumulator: Accumulator, chunks: Chunks, group: SendBatchGroup,
                      free: bool) -> None:
        task = asyncio.ensure_future(accumulator.append_chunks_async("t", 1, chunks, group))
        await asyncio.sleep(0.3)
        assert task.done() != free
        if free:
            release_two(accumulator)
        await asyncio.wait_for(task, 10)

    raise_now = {"on_buffer_full": "raise"}
    cases: list[tuple[str, dict[str, Any], bool, str | None]] = [
        ("thread", raise_now, False, "buffer full: 1000 of buffer_memory=1000"),
        ("thread", {"max_block_ms": 100}, False, "for max_block_ms=100"),
        ("thread", {"max_block_ms": 10_000}, True, None),
        ("loop thread", raise_now, False, "buffer full: 1000 of buffer_memory=1000"),
        ("loop thread", {}, False, "loop thread, e.g. a delivery callback, cannot block"),
        ("async", raise_now, False, "buffer full: 1000 of buffer_memory=1000"),
        ("async", {"max_block_ms": 100}, False, "for max_block_ms=100"),
        ("async", {"max_block_ms": 10_000}, True, None),
    ]
    for face, options, free, message in cases:
        loop, accumulator, chunks = _full_accumulator(**options)
        group = SendBatchGroup(loop.create_future() if face == "async"
                               else concurrent.futures.Future())
        error: BufferFullError | None = None
        try:
            if face == "thread":
                in_thread(accumulator, chunks, group, free)
            elif face == "loop thread":
                accumulator.append_chunks_blocking("t", 1, chunks, group)
            else:
                loop.run_until_complete(on_loop(accumulator, chunks, group, free))
        except BufferFullError as err:
            error = err
        loop.run_until_complete(asyncio.sleep(0))  # the group is sealed on the loop
        loop.close()
        assert group.sealed and group.expected == (4 if free else 2), (face, options)
        if message is None:
            assert error is None, (face, options)
        else:
            assert error is not None and message in str(error), (face, options, error)
            assert "the first 10 record(s) of this send_batch were queued" in str(error)
            assert error.records_accepted == 10 and error.accepted is group.future


# --------------------------------------------------------------------------- idempotence


def _check_exactly_once(bootstrap: str, topic: str, sent: dict[int, list[bytes]],
                        metas: dict[int, list[RecordMetadata]]) -> None:
    for partition, values in sent.items():
        table, _ = read_partition(bootstrap, topic, partition)
        assert table.column("value").to_pylist() == values  # every record once, in order
        assert table.column("offset").to_pylist() == list(range(len(values)))  # no gaps
        assert [m.offset for m in metas[partition]] == list(range(len(values)))


def test_idempotent_producer_under_response_loss(broker: BrokerProcess, proxy_factory: Any
                                                 ) -> None:
    topic = create_topic(broker.bootstrap, _topic("lossy"), partitions=2)
    proxy: ChaosProxy = proxy_factory(broker.port)
    proxy.drop_every = 3
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    futures: dict[int, list[concurrent.futures.Future[RecordMetadata]]] = {0: [], 1: []}
    with Producer(proxy.bootstrap, batch_size=600, linger_ms=2, retry_backoff_ms=20,
                  request_timeout_ms=5000) as producer:
        assert producer.config.idempotent
        for i in range(1500):
            partition = i % 2
            value = f"{partition}-{i:05d}".encode()
            sent[partition].append(value)
            futures[partition].append(producer.send(topic, value, partition=partition))
        producer.flush()
        metas = {p: results(f) for p, f in futures.items()}
    assert proxy.dropped >= 5, proxy.dropped
    _check_exactly_once(broker.bootstrap, topic, sent, metas)

    # The same faults without idempotence do write duplicates: the check above has teeth.
    control = create_topic(broker.bootstrap, _topic("lossy-control"))
    proxy.dropped = 0
    with Producer(proxy.bootstrap, enable_idempotence=False, batch_size=600, linger_ms=2,
                  retry_backoff_ms=20) as producer:
        plain = [f"c-{i:05d}".encode() for i in range(300)]
        results([producer.send(control, v) for v in plain])
    table, _ = read_partition(broker.bootstrap, control, 0)
    assert proxy.dropped >= 1
    assert table.num_rows > len(plain)


def test_async_idempotent_producer_under_response_loss(broker: BrokerProcess,
                                                       proxy_factory: Any) -> None:
    topic = create_topic(broker.bootstrap, _topic("lossy-async"))
    proxy: ChaosProxy = proxy_factory(broker.port)
    proxy.drop_every = 2

    async def main() -> list[RecordMetadata]:
        async with AsyncProducer(proxy.bootstrap, batch_size=400, linger_ms=1,
                                 retry_backoff_ms=10) as producer:
            futures = [await producer.send(topic, f"{i:05d}".encode()) for i in range(400)]
            return list(await asyncio.gather(*futures))

    metas = asyncio.run(main())
    assert proxy.dropped >= 3
    _check_exactly_once(broker.bootstrap, topic, {0: [f"{i:05d}".encode() for i in range(400)]},
                        {0: metas})


def test_delivery_timeout_when_the_broker_is_unreachable(broker: BrokerProcess,
                                                         proxy_factory: Any) -> None:
    topic = create_topic(broker.bootstrap, _topic("unreachable"))
    proxy: ChaosProxy = proxy_factory(broker.port)
    with Producer(proxy.bootstrap, delivery_timeout_ms=1500, request_timeout_ms=500,
                  retry_backoff_ms=50, linger_ms=1) as producer:
        assert producer.send(topic, b"first").result(30).offset == 0
        proxy.refusing = True
        proxy.disconnect_all()
        started = time.monotonic()
        lost = producer.send(topic, b"lost")
        with pytest.raises(DeliveryTimeoutError, match="delivery_timeout_ms=1500") as caught:
            lost.result(60)
        # Not before the delivery timeout, and once it passed, not much later: 20 s
        # allows for a slow machine; a batch nobody expires runs into result(60).
        assert 1.2 < time.monotonic() - started < 20
        assert caught.value.last_error is not None and caught.value.last_error.retriable
        proxy.unblock()
        assert producer.send(topic, b"back").result(30).offset == 1
    table, _ = read_partition(broker.bootstrap, topic, 0)
    assert table.column("value").to_pylist() == [b"first", b"back"]


def test_out_of_order_sequence_fails_the_partition_then_recovers(broker: BrokerProcess
                                                                  ) -> None:
    topic = create_topic(broker.bootstrap, _topic("gap"))
    with Producer(broker.bootstrap, linger_ms=1) as producer:
        results([producer.send(topic, f"a{i}".encode()) for i in range(5)])
        assert producer._sender.idempotence is not None
        state = producer._sender.idempotence.sequences[(topic, 0)]
        pid, epoch = state.producer_id, state.producer_epoch
        assert state.next_sequence == 5

        async def steal_sequences() -> None:
            # Another writer with the same producer id takes sequences 5..14, so the
            # producer's next batch (5..7) is a gap from the broker's point of view.
            cluster = Cluster(broker.bootstrap)
            try:
                connection = await cluster.connection(await cluster.leader_for(topic, 0))
                batch = build_batch([b"intruder"] * 10, producer_id=pid, producer_epoch=epoch,
                                    base_sequence=5)
                response = await connection.request(ApiKey.PRODUCE, ProduceRequest(
                    -1, 5000, [ProduceTopic(topic, [ProducePartition(0, batch)])]))
                assert isinstance(response, ProduceResponse)
                assert response.topics[0].partitions[0].error_code == 0
            finally:
                await cluster.close()

        asyncio.run(steal_sequences())
        doomed = [producer.send(topic, f"b{i}".encode()) for i in range(3)]
        for future in doomed:
            with pytest.raises(OutOfOrderSequenceError, match="were not written"):
                future.result(30)
        # The partition continues under a fresh producer id.
        after = results([producer.send(topic, f"c{i}".encode()) for i in range(3)])
        assert [m.offset for m in after] == [15, 16, 17]
        assert state.producer_id != pid
    table, headers = read_partition(broker.bootstrap, topic, 0)
    assert table.column("value").to_pylist() == (
        [f"a{i}".encode() for i in range(5)] + [b"intruder"] * 10 +
        [f"c{i}".encode() for i in range(3)])
    assert headers[-1].base_sequence == 0


def test_broker_kill_and_restart_keeps_acked_records_and_producer_state(
        broker_factory: Any, proxy_factory: Any) -> None:
    crashing = broker_factory(broker_id=1, overrides={"log.flush.policy": "always"})

    async def leader_partition(topic: str) -> int:
        cluster = Cluster(crashing.bootstrap)
        try:
            partitions = await cluster.partitions_for(topic)
            return next(p for p, info in partitions.items() if info.leader == 1)
        finally:
            await cluster.close()

    # Two partitions: if another broker lives in this ZooKeeper, one lands on each.
    topic = create_topic(crashing.bootstrap, _topic("crash"), partitions=2)
    partition = asyncio.run(leader_partition(topic))
    proxy: ChaosProxy = proxy_factory(crashing.port)
    sent: list[bytes] = []
    futures: list[concurrent.futures.Future[RecordMetadata]] = []

    def send(prefix: str, count: int) -> list[concurrent.futures.Future[RecordMetadata]]:
        batch = []
        for i in range(count):
            sent.append(f"{prefix}-{i:04d}".encode())
            batch.append(producer.send(topic, sent[-1], partition=partition))
        futures.extend(batch)
        return batch

    with Producer(proxy.bootstrap, linger_ms=5, retry_backoff_ms=50,
                  request_timeout_ms=5000, delivery_timeout_ms=90_000) as producer:
        results(send("before", 200))
        # The broker writes (and fsyncs) this batch, but its answer is lost and the proxy
        # refuses the retries until the broker has been SIGKILLed and restarted.
        proxy.drop_next(block=True)
        unanswered = send("unanswered", 10)
        assert proxy.dropped_event.wait(15), "the produce request never reached the broker"
        crashing.kill()
        queued = send("while-down", 50)  # queued while nothing is reachable
        crashing.restart()
        proxy.unblock()
        # The retry is the same batch with the same sequence: the restarted broker
        # rebuilt its producer state from the log and answers with the original offsets.
        assert [m.offset for m in results(unanswered, 60)] == list(range(200, 210))
        assert [m.offset for m in results(queued, 60)] == list(range(210, 260))
        results(send("after", 200))
    metas = results(futures)
    assert [m.offset for m in metas] == list(range(len(sent)))
    table, _ = read_partition(crashing.bootstrap, topic, partition)
    assert table.column("value").to_pylist() == sent  # every ack present, once, in order


async def _call(broker: BrokerProcess, api: ApiKey, body: Any) -> Any:
    async with BrokerConnection("127.0.0.1", broker.port) as connection:
        return await connection.request(api, body)


def _metadata_requests(broker: BrokerProcess) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("strata_requests_total{") and 'api="METADATA"' in line)


def test_first_sends_to_many_topics_share_one_metadata_request(broker: BrokerProcess) -> None:
    names = [_topic(f"many{i}") for i in range(40)]
    # On this broker explicitly: another test's broker (id 1) may still be registered
    # for a few seconds after it was killed, and must not be given these partitions.
    request = CreateTopicsRequest([CreatableTopic(name, -1, -1, [], [
        ReplicaAssignment(p, [broker.broker_id]) for p in range(2)]) for name in names])
    created = asyncio.run(_call(broker, ApiKey.CREATE_TOPICS, request))
    assert all(t.error_code == 0 for t in created.topics), created

    async def send_all() -> list[RecordMetadata]:
        async with AsyncProducer(broker.bootstrap, linger_ms=5) as producer:
            queued = await asyncio.gather(*(producer.send(name, b"x", partition=1)
                                            for name in names))
            return list(await asyncio.wait_for(asyncio.gather(*queued), 30))

    before = _metadata_requests(broker)
    metas = asyncio.run(send_all())
    asked = _metadata_requests(broker) - before
    assert sorted(m.topic for m in metas) == sorted(names)
    # 40 topics the producer had never seen, asked for at once: one round trip (a second
    # at most, for a send that arrived while the first was in flight), not 40.
    assert 1 <= asked <= 2, asked


@pytest.mark.parametrize("records", [1, 5, 32, 33, 400])
def test_a_batch_encodes_the_same_timestamps_whatever_its_size(records: int) -> None:
    """``Batch.encode`` turns a batch of up to ``_SMALL_BATCH`` records' nanosecond
    timestamps into milliseconds in Python and a larger one with pyarrow's cast: both
    truncate, and the header's bounds match the column."""
    from strata.client._accumulator import _SMALL_BATCH, Batch
    from wire.record_batch import Compression, decode_batch, validate

    batch = Batch("t", 0, 0.0, 30.0)
    stamps = [1_700_000_000_123_456_789 + (i * 7_919_000_003) % 50_000_000_000
              for i in range(records)]
    batch.values.extend(b"v%d" % i for i in range(records))
    batch.timestamps.extend(stamps)
    encoded = batch.encode(Compression.NONE, -1, -1, -1)
    header = validate(encoded)
    _, payload = decode_batch(encoded)
    expected = [t // 1_000_000 for t in stamps]
    assert payload.column(2).to_pylist() == expected
    assert (header.first_timestamp, header.max_timestamp) == (min(expected), max(expected))
    assert (records <= _SMALL_BATCH) == (records in (1, 5, 32))

