"""Stock Kafka clients against the brokers' Kafka listeners (issue [3.6]).

One three-broker cluster whose brokers each open a Kafka listener beside Strata's own
(``kafka.listeners``), and the clients as users install them from PyPI:
confluent-kafka (librdkafka, the C client most languages wrap) and kafka-python. Each
test uses what a user would: the clients' admin, producer and consumer APIs, and checks
what the other side sees:

* admin: create, describe (metadata and configs) and delete topics;
* idempotent acks=all produce with every compression codec librdkafka has (none, gzip,
  snappy, lz4, zstd), keys, null values and headers, read back by a Kafka consumer and by
  Strata's own consumer with the same offsets, bytes and timestamps;
* records written by Strata's producer read by both Kafka clients;
* a consumer group of three processes (cooperative-sticky): every record read, the
  partitions spread over the members with no partition held by two of them;
* commit and resume; seek by offset and by timestamp (ListOffsets);
* one group mixing a Strata consumer and a Kafka consumer;
* on the wire: KIP-511's ApiVersions fallback, UNSUPPORTED_VERSION for an unknown API
  (the connection goes on), Produce v0-2 advertised but refused, an undecodable body
  closing only its connection, and random frames (hypothesis) after which the listener
  still serves.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as KConsumer
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka import Producer as KProducer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer as PyConsumer
from kafka import KafkaProducer as PyProducer

from strata.client import Consumer, Producer
from tests.support.cluster import Cluster
from tests.support.helpers import recv_exactly
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kafka"), brokers=3, kafka=True) as c:
        yield c


@pytest.fixture(scope="module")
def kafka(cluster: Cluster) -> str:
    return cluster.kafka_bootstrap


@pytest.fixture(scope="module")
def admin(kafka: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka})


def create(admin: AdminClient, name: str, partitions: int = 3, rf: int = 3,
           config: dict[str, str] | None = None) -> str:
    futures = admin.create_topics([NewTopic(name, partitions, rf, config=config or {})],
                                  operation_timeout=20)
    futures[name].result(30)
    wait_for(f"topic {name} led on every partition",
             lambda: admin.list_topics(name, timeout=5).topics[name],
             lambda t: t.error is None and len(t.partitions) == partitions
             and all(p.leader >= 0 for p in t.partitions.values()), timeout=30)
    return name


def read_kafka(kafka: str, topic: str, count: int, *, group: str | None = None,
               timeout: float = 30.0, **config: Any) -> list[Any]:
    """``count`` records of ``topic`` read by librdkafka from the beginning."""
    consumer = KConsumer({"bootstrap.servers": kafka, "group.id": group or f"r-{topic}",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False,
                          **config})
    try:
        consumer.subscribe([topic])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is None:
                    out.append(m)
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error: {m.error()}")
        return out
    finally:
        consumer.close()


def read_strata(bootstrap: str, topic: str, partitions: int, count: int,
                timeout: float = 30.0) -> list[Any]:
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, p) for p in range(partitions)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            out.extend(consumer.poll(timeout_ms=300))
        return out
    finally:
        consumer.close()


def fetch_cache_counts(cluster: Cluster) -> dict[str, int]:
    """The Kafka listeners' converted-batch cache counters, summed over the brokers from
    their own metrics endpoints: ``hits``, ``misses``, ``kept`` and ``ahead`` (of the
    misses, the batches converted ahead of their reader)."""
    totals = dict.fromkeys(("hits", "misses", "kept", "ahead"), 0.0)
    for broker in cluster.brokers.values():
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            for name in totals:
                if line.startswith(f"strata_kafka_fetch_cache_{name}_total "):
                    totals[name] += float(line.split()[1])
    return {name: int(value) for name, value in totals.items()}


# ----------------------------------------------------------------------------- admin
def test_admin_creates_describes_and_deletes_topics(admin: AdminClient) -> None:
    name = create(admin, "k-admin", partitions=4, config={"retention.ms": "3600000"})
    metadata = admin.list_topics(name, timeout=10).topics[name]
    assert sorted(metadata.partitions) == [0, 1, 2, 3]
    assert all(len(p.replicas) == 3 and len(p.isrs) >= 2
               for p in metadata.partitions.values())
    configs = admin.describe_configs([ConfigResource("topic", name)])
    (described,) = configs.values()
    entries = described.result(20)
    assert entries["retention.ms"].value == "3600000"
    with pytest.raises(Exception, match="already exists"):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(20)
    admin.delete_topics([name], operation_timeout=20)[name].result(30)
    wait_for("topic deleted", lambda: admin.list_topics(timeout=5).topics,
             lambda topics: name not in topics, timeout=30)


# ----------------------------------------------------------------------------- records
def test_every_codec_round_trips_through_both_protocols(admin: AdminClient, kafka: str,
                                                         cluster: Cluster) -> None:
    topic = create(admin, "k-codecs", partitions=3)
    kept_before = fetch_cache_counts(cluster)["kept"]
    sent: dict[tuple[str, int], tuple[bytes | None, bytes | None, list[Any], int]] = {}
    acked: dict[tuple[str, int], tuple[int, int]] = {}
    base_ts = int(time.time() * 1000) - 60_000
    for codec in CODECS:
        producer = KProducer({"bootstrap.servers": kafka, "enable.idempotence": True,
                              "acks": "all", "compression.type": codec, "linger.ms": 5})
        errors: list[Any] = []

        def delivered(err: Any, msg: Any, codec: str = codec,
                      errors: list[Any] = errors) -> None:
            if err is not None:
                errors.append(err)
            else:
                acked[(codec, int(msg.key()[1:]))] = (msg.partition(), msg.offset())

        for i in range(200):
            key = None if i % 7 == 3 else b"k%d" % i
            value = None if i % 11 == 5 else f"{codec}-{i}-".encode() * (1 + i % 13)
            headers = [("codec", codec.encode()), ("i", str(i).encode())] if i % 2 else []
            sent[(codec, i)] = (key, value, headers, base_ts + i)
            producer.produce(topic, key=b"#%d" % i if key is None else b"k%d" % i,
                             value=value, headers=headers, timestamp=base_ts + i,
                             on_delivery=delivered, partition=i % 3)
        assert producer.flush(30) == 0
        assert errors == []
    assert len(acked) == len(CODECS) * 200
    # Offsets: one per record, no gaps, no duplicates, per partition.
    per_partition: dict[int, list[int]] = {}
    for partition, offset in acked.values():
        per_partition.setdefault(partition, []).append(offset)
    for offsets in per_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))

    def expected(codec: str, i: int) -> tuple[Any, ...]:
        key, value, headers, ts = sent[(codec, i)]
        return (b"#%d" % i if key is None else key, value, [tuple(h) for h in headers], ts)

    by_offset = {v: k for k, v in acked.items()}
    # Every batch was kept as its producer sent it (each codec's own compression), under
    # the offsets and epoch the log gave it: the first Kafka read converts nothing, and
    # its records (checked below) are the ones sent.
    before = fetch_cache_counts(cluster)
    assert before["kept"] > kept_before
    kafka_read = read_kafka(kafka, topic, len(acked))
    assert len(kafka_read) == len(acked)
    after = fetch_cache_counts(cluster)
    assert after["hits"] > before["hits"] and after["misses"] == before["misses"]
    for m in kafka_read:
        codec, i = by_offset[(m.partition(), m.offset())]
        assert (m.key(), m.value(), [tuple(h) for h in (m.headers() or [])],
                m.timestamp()[1]) == expected(codec, i)
    # A second Kafka reader gets the same records from the brokers' converted-batch
    # caches (brokers/kafka/fetch_cache.py): nothing is converted again.
    before = fetch_cache_counts(cluster)
    again = read_kafka(kafka, topic, len(acked), group=f"again-{topic}")

    def seen(ms: list[Any]) -> list[tuple[Any, ...]]:
        return sorted((m.partition(), m.offset(), m.key(), m.value(), m.headers(),
                       m.timestamp()) for m in ms)

    assert seen(again) == seen(kafka_read)
    after = fetch_cache_counts(cluster)
    assert after["hits"] > before["hits"] and after["misses"] == before["misses"]
    strata_read = read_strata(cluster.bootstrap, topic, 3, len(acked))
    assert len(strata_read) == len(acked)
    for r in strata_read:
        codec, i = by_offset[(r.partition, r.offset)]
        assert (r.key, r.value, [tuple(h) for h in r.headers], r.timestamp) == \
            expected(codec, i)


def test_kafka_python_producer_and_consumer(admin: AdminClient, kafka: str,
                                            cluster: Cluster) -> None:
    topic = create(admin, "k-python", partitions=2)
    producer = PyProducer(bootstrap_servers=kafka, acks="all", enable_idempotence=True,
                          compression_type="gzip")
    futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2,
                             headers=[("n", str(i).encode())]) for i in range(100)]
    producer.flush(30)
    metas = [f.get(30) for f in futures]
    producer.close()
    assert sorted((m.partition, m.offset) for m in metas) == \
        sorted((p, o) for p in range(2) for o in range(50))
    consumer = PyConsumer(topic, bootstrap_servers=kafka, group_id="py-group",
                          auto_offset_reset="earliest", enable_auto_commit=False,
                          consumer_timeout_ms=10_000)
    got = []
    for m in consumer:
        got.append((m.partition, m.offset, m.key, m.value, m.headers))
        if len(got) == 100:
            break
    consumer.commit()
    consumer.close()
    assert sorted(got) == sorted((i % 2, i // 2, b"k%d" % i, b"v%d" % i,
                                  [("n", str(i).encode())]) for i in range(100))
    strata = read_strata(cluster.bootstrap, topic, 2, 100)
    assert sorted((r.partition, r.offset, r.value) for r in strata) == \
        sorted((i % 2, i // 2, b"v%d" % i) for i in range(100))


def test_strata_producer_read_by_kafka_clients(admin: AdminClient, kafka: str,
                                               cluster: Cluster) -> None:
    topic = create(admin, "k-from-strata", partitions=2)
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [producer.send(topic, value=b"s%d" % i, key=b"k%d" % i, partition=i % 2,
                                 headers=[("from", b"strata")] if i % 3 == 0 else None)
                   for i in range(300)]
        producer.flush()
        written = {(f.result().partition, f.result().offset): i for i, f in
                   enumerate(futures)}
    for m in read_kafka(kafka, topic, 300):
        i = written[(m.partition(), m.offset())]
        assert (m.key(), m.value()) == (b"k%d" % i, b"s%d" % i)
        assert (m.headers() or []) == ([("from", b"strata")] if i % 3 == 0 else [])
    consumer = PyConsumer(bootstrap_servers=kafka, auto_offset_reset="earliest",
                          enable_auto_commit=False, consumer_timeout_ms=10_000)
    from kafka import TopicPartition as PyTP

    consumer.assign([PyTP(topic, 0), PyTP(topic, 1)])
    got = {(m.partition, m.offset): m.value for m in consumer}
    consumer.close()
    assert got == {k: b"s%d" % i for k, i in written.items()}


def test_a_kafka_reader_of_strata_written_data_finds_its_next_batches_converted(
        admin: AdminClient, kafka: str, cluster: Cluster) -> None:
    """Data Strata's own producer wrote is converted to v2 on its first read; the
    listener converts what a reader will fetch next while it takes in what it got
    (``KafkaApis._read_ahead``), so only the reader's first fetch waits for a
    conversion. One partition, small fetches (64 KiB): many round trips, each of which
    must find its batches converted already, and the records must be the ones sent."""
    topic = create(admin, "k-ahead", partitions=1)
    count = 20_000
    with Producer(cluster.bootstrap, acks="all", batch_size=16_384) as producer:
        for start in range(0, count, 1000):
            producer.send_batch(topic, [b"v%06d-" % i + b"x" * 90
                                        for i in range(start, start + 1000)],
                                keys=[b"k%d" % (i % 7) for i in range(start, start + 1000)],
                                partition=0).result(30)
    before = fetch_cache_counts(cluster)
    got = read_kafka(kafka, topic, count, group=f"ahead-{topic}",
                     **{"max.partition.fetch.bytes": 65536})
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (i, b"k%d" % (i % 7), b"v%06d-" % i + b"x" * 90) for i in range(count)]
    after = fetch_cache_counts(cluster)
    converted_ahead = after["ahead"] - before["ahead"]
    converted_waiting = after["misses"] - before["misses"] - converted_ahead
    # ~2 MB in 64 KiB fetches: some thirty round trips. Only the first one's batches
    # (at most 1.25 x 64 KiB of them, 80-odd here) are converted while the reader waits.
    assert converted_ahead > 0 and after["hits"] > before["hits"], (before, after)
    assert converted_waiting * 10 <= converted_ahead, (converted_waiting, converted_ahead)


# ----------------------------------------------------------------------------- groups
def test_group_of_kafka_processes_shares_the_partitions(admin: AdminClient,
                                                        kafka: str) -> None:
    topic = create(admin, "k-group", partitions=6)
    stop = threading.Event()
    produced: list[tuple[int, int]] = []

    def produce() -> None:  # records keep arriving while the members join
        producer = KProducer({"bootstrap.servers": kafka, "acks": "all", "linger.ms": 2})
        i = 0
        while not stop.is_set():
            for _ in range(30):
                producer.produce(topic, value=f"g{i}".encode(), partition=i % 6,
                                 on_delivery=lambda e, m: produced.append(
                                     (m.partition(), m.offset())) if e is None else None)
                i += 1
            producer.poll(0)
            time.sleep(0.05)
        producer.flush(30)

    feeder = threading.Thread(target=produce)
    feeder.start()
    members = [subprocess.Popen(
        [sys.executable, "-m", "tests.support.kafka_member", kafka, topic, "k-group", "3"],
        cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        time.sleep(5)
    finally:
        stop.set()
        feeder.join()
    outputs = []
    for member in members:
        out, _ = member.communicate(timeout=90)
        assert member.returncode == 0
        outputs.append([json.loads(line) for line in out.splitlines()])
    read = {(p, o) for events in outputs for e in events for p, o, _ in e.get("read", [])}
    assert set(produced) <= read, f"{len(set(produced) - read)} records never read"
    # Every member was given partitions (the group spread them), and no partition was
    # held by two members at once: each member's holding of a partition runs from its
    # assignment to its revocation (or to its closing), and those spans never overlap.
    spans: dict[int, list[tuple[float, float, int]]] = {}
    for member, events in enumerate(outputs):
        assert any(e.get("assigned") for e in events), "a member was never given a partition"
        held: dict[int, float] = {}
        for e in events:
            for p in e.get("assigned", []):
                held[p] = e["at"]
            for p in e.get("revoked", []):
                if p in held:  # (close revokes again what the span already ended)
                    spans.setdefault(p, []).append((held.pop(p), e["at"], member))
            if e.get("closing"):
                for p, since in held.items():
                    spans.setdefault(p, []).append((since, e["at"], member))
                held = {}
    for p, held_by in spans.items():
        ordered = sorted(held_by)
        for (_, end, a), (start, _, b) in itertools.pairwise(ordered):
            assert a == b or end <= start, f"partition {p} held by members {a} and {b} at once"
    assert not any(e.get("error") for events in outputs for e in events)


def test_commit_resume_and_seek(admin: AdminClient, kafka: str) -> None:
    topic = create(admin, "k-resume", partitions=1)
    producer = KProducer({"bootstrap.servers": kafka, "acks": "all"})
    base = int(time.time() * 1000) - 100_000
    for i in range(100):
        producer.produce(topic, value=b"r%d" % i, partition=0, timestamp=base + 1000 * i)
    assert producer.flush(30) == 0
    first = KConsumer({"bootstrap.servers": kafka, "group.id": "resume",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    first.assign([TopicPartition(topic, 0, 0)])
    got: list[Any] = []
    while len(got) < 40:
        got.extend(m for m in first.consume(40 - len(got), 1.0) if m.error() is None)
    first.commit(offsets=[TopicPartition(topic, 0, 40)], asynchronous=False)
    first.close()
    second = KConsumer({"bootstrap.servers": kafka, "group.id": "resume",
                        "auto.offset.reset": "earliest", "enable.auto.commit": False})
    assert second.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 40
    second.subscribe([topic])
    resumed: list[Any] = []
    deadline = time.monotonic() + 30
    while not resumed and time.monotonic() < deadline:
        resumed = [m for m in second.consume(10, 1.0) if m.error() is None]
    assert resumed[0].offset() == 40 and resumed[0].value() == b"r40"
    # Seek by timestamp: the first record at or after base + 70.5 s is offset 71.
    (found,) = second.offsets_for_times([TopicPartition(topic, 0, base + 70_500)], timeout=10)
    assert found.offset == 71
    low, high = second.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    assert (low, high) == (0, 100)
    second.close()
    seeker = KConsumer({"bootstrap.servers": kafka, "group.id": "seek",
                        "enable.auto.commit": False})
    seeker.assign([TopicPartition(topic, 0, 90)])
    tail: list[Any] = []
    deadline = time.monotonic() + 30
    while len(tail) < 10 and time.monotonic() < deadline:
        tail.extend(m for m in seeker.consume(10, 1.0) if m.error() is None)
    seeker.close()
    assert [m.offset() for m in tail] == list(range(90, 100))


def test_one_group_mixes_a_strata_and_a_kafka_member(admin: AdminClient, kafka: str,
                                                     cluster: Cluster) -> None:
    topic = create(admin, "k-mixed", partitions=4)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(400):
            producer.send(topic, value=b"m%d" % i, partition=i % 4)
        producer.flush()
    strata = Consumer(cluster.bootstrap, group_id="mixed", auto_offset_reset="earliest",
                      enable_auto_commit=False)
    strata.subscribe([topic])
    kafka_member = KConsumer({"bootstrap.servers": kafka, "group.id": "mixed",
                              "auto.offset.reset": "earliest", "enable.auto.commit": False,
                              "partition.assignment.strategy": "cooperative-sticky",
                              "heartbeat.interval.ms": 500})
    kafka_member.subscribe([topic])
    read: dict[str, set[tuple[int, int]]] = {"strata": set(), "kafka": set()}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            for r in strata.poll(timeout_ms=100):
                read["strata"].add((r.partition, r.offset))
            for m in kafka_member.consume(200, 0.1):
                if m.error() is None:
                    read["kafka"].add((m.partition(), m.offset()))
            both = strata.assignment() and kafka_member.assignment()
            if both and len(read["strata"] | read["kafka"]) == 400:
                break
        strata_held = {tp.partition for tp in strata.assignment()}
        kafka_held = {tp.partition for tp in kafka_member.assignment()}
    finally:
        strata.close()
        kafka_member.close()
    assert read["strata"] | read["kafka"] == {(p, o) for p in range(4) for o in range(100)}
    assert strata_held and kafka_held, (strata_held, kafka_held)
    assert not strata_held & kafka_held


# ----------------------------------------------------------------------------- the wire
def _connect(kafka: str) -> socket.socket:
    host, port = kafka.split(",")[0].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _exchange(sock: socket.socket, frame: bytes) -> bytes:
    sock.sendall(frame)
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def _frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 3) + b"raw"
    if version >= 3 and api_key == 18:
        header += b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _v2_batches(records: bytes) -> list[tuple[int, int]]:
    """(base offset, size) of each whole RecordBatch v2 in a fetch's records."""
    out, pos = [], 0
    while pos + 12 <= len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        out.append((base, 12 + length))
        pos += 12 + length
    return out


def test_fetch_limits_count_the_bytes_the_client_receives(admin: AdminClient, kafka: str,
                                                          cluster: Cluster) -> None:
    """max.partition.fetch.bytes / fetch.max.bytes bound the RecordBatch v2 bytes a
    Kafka consumer gets, as on Kafka, not the larger Arrow batches the log holds: two
    batches of 4,600 x 100 B (about 500 KB each as v2, 560 KB as Arrow) come in one
    1 MiB fetch. KIP-74: a partition whose first batch exceeds its limit still
    returns that one batch when it is the first with data; a later one returns none."""
    from brokers.kafka.codec import API_TYPES

    FetchRequest, FetchResponse = API_TYPES[1]
    brokers = admin.list_topics(timeout=10).brokers
    host = brokers[min(brokers)]
    topic = "k-limits"
    # Both partitions on one broker, so that one request reaches both.
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[host.id], [host.id]])],
                        operation_timeout=20)[topic].result(30)
    wait_for(f"topic {topic} led", lambda: admin.list_topics(topic, timeout=5).topics[topic],
             lambda t: t.error is None and len(t.partitions) == 2
             and all(p.leader == host.id for p in t.partitions.values()), timeout=30)
    with Producer(cluster.bootstrap, acks="all", linger_ms=0,
                  batch_size=4 << 20) as producer:
        for partition in (0, 0, 1):
            values = [os.urandom(100) for _ in range(4600)]
            producer.send_batch(topic, values, partition=partition).result(30)
            producer.flush(30)

    def fetch(partition_max: int, max_bytes: int = 50 << 20) -> dict[int, list[Any]]:
        request = FetchRequest(
            replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=max_bytes,
            isolation_level=0, session_id=0, session_epoch=-1, topics=[
                FetchRequest.FetchTopic(topic=topic, partitions=[
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=p, current_leader_epoch=-1, fetch_offset=0,
                        log_start_offset=-1, partition_max_bytes=partition_max)
                    for p in (0, 1)])], forgotten_topics_data=[], rack_id="")
        with socket.create_connection((host.host, host.port), timeout=10) as sock:
            answer = _exchange(sock, _frame(1, 11, 9, request.encode(version=11)))
        decoded = FetchResponse.decode(answer[4:], version=11)
        return {p.partition_index: _v2_batches(bytes(p.records or b""))
                for t in decoded.responses for p in t.partitions}

    got = fetch(1 << 20)
    assert [b[0] for b in got[0]] == [0, 4600] and len(got[1]) == 1
    first = got[0][0][1]
    assert 480_000 < first < 520_000 and sum(s for _, s in got[0]) <= 1 << 20
    # One byte short of both batches: the first only.
    assert [b[0] for b in fetch(sum(s for _, s in got[0]) - 1)[0]] == [0]
    # Limits below a batch: the first partition still brings one (KIP-74), the second
    # none; the response budget (max_bytes) too.
    tiny = fetch(1000)
    assert [b[0] for b in tiny[0]] == [0] and tiny[1] == []
    assert fetch(1 << 20, max_bytes=first + 10) == {0: got[0][:1], 1: []}


def test_unknown_apis_and_versions_get_kafkas_answers(kafka: str) -> None:
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    with _connect(kafka) as sock:
        # KIP-511: a newer ApiVersions than ours gets the v0 format, error 35, our range.
        answer = _exchange(sock, _frame(18, 9, 1, b"\x01\x01\x00"))
        assert struct.unpack_from(">i", answer)[0] == 1
        decoded = ApiVersionsResponse.decode(answer[4:], version=0)
        assert decoded.error_code == 35 and decoded.api_keys[0].api_key == 18
        # An API key nobody serves: the header and UNSUPPORTED_VERSION; the line goes on.
        answer = _exchange(sock, _frame(999, 0, 2, b""))
        assert struct.unpack(">ih", answer) == (2, 35)
        body = ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        answer = _exchange(sock, _frame(18, 3, 3, body.encode(version=3)))
        served = ApiVersionsResponse.decode(answer[4:], version=3)
        assert served.error_code == 0
        assert {k.api_key for k in served.api_keys} >= {0, 1, 2, 3, 8, 9, 10, 11, 12, 13,
                                                         14, 18, 19, 20, 22}
        # Produce v2 is advertised (librdkafka's compression check) but refused.
        old = ProduceRequest(acks=1, timeout_ms=1000, topic_data=[
            ProduceRequest.TopicProduceData(name="k-old", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0,
                                                                     records=b"")])])
        answer = _exchange(sock, _frame(0, 2, 4, old.encode(version=2)))
        refused = ProduceResponse.decode(answer[4:], version=2)
        assert refused.responses[0].partition_responses[0].error_code == 35
    # A body that does not decode closes that connection only.
    with _connect(kafka) as sock:
        sock.sendall(_frame(3, 1, 5, b"\x00\x00\x00\x05\x00"))
        with pytest.raises((ConnectionError, OSError)):
            _exchange(sock, _frame(18, 0, 6, b""))
    with _connect(kafka) as sock:
        assert _exchange(sock, _frame(18, 0, 7, b""))[:6] == struct.pack(">ih", 7, 0)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=200).map(lambda b: struct.pack(">i", len(b)) + b),
    st.tuples(st.sampled_from([0, 1, 2, 3, 8, 9, 10, 11, 14, 18, 19, 22, 32]),
              st.integers(-1, 20), st.binary(max_size=200))
    .map(lambda t: _frame(t[0], t[1], 1, t[2]))))
def test_random_frames_hurt_nothing(kafka: str, frame: bytes) -> None:
    with _connect(kafka) as sock, contextlib.suppress(OSError):
        sock.sendall(frame)
        sock.settimeout(0.05)
        sock.recv(65536)


def test_the_listener_serves_after_the_fuzz(admin: AdminClient, kafka: str) -> None:
    topic = create(admin, "k-after-fuzz", partitions=1)
    producer = KProducer({"bootstrap.servers": kafka, "acks": "all",
                          "enable.idempotence": True})
    producer.produce(topic, value=b"still here")
    assert producer.flush(20) == 0
    (m,) = read_kafka(kafka, topic, 1)
    assert m.value() == b"still here"


# ----------------------------------------------------------------------------- transactions
def test_transactions_commit_abort_and_read_committed(admin: AdminClient, kafka: str,
                                                      cluster: Cluster) -> None:
    source = create(admin, "k-txn-in", partitions=1)
    sink = create(admin, "k-txn-out", partitions=2)
    feed = KProducer({"bootstrap.servers": kafka, "acks": "all"})
    for i in range(10):
        feed.produce(source, value=b"in%d" % i, partition=0)
    assert feed.flush(20) == 0
    producer = KProducer({"bootstrap.servers": kafka, "transactional.id": "k-txn-app",
                          "acks": "all"})
    producer.init_transactions(30)
    # An aborted transaction: nothing of it may reach a read_committed reader.
    producer.begin_transaction()
    for i in range(5):
        producer.produce(sink, value=b"aborted%d" % i, partition=i % 2)
    producer.flush(20)
    producer.abort_transaction(30)
    # Consume-transform-produce: the outputs and the input offsets commit together.
    reader = KConsumer({"bootstrap.servers": kafka, "group.id": "k-txn-group",
                        "enable.auto.commit": False, "auto.offset.reset": "earliest",
                        "isolation.level": "read_committed"})
    reader.assign([TopicPartition(source, 0, 0)])
    inputs: list[Any] = []
    deadline = time.monotonic() + 30
    while len(inputs) < 10 and time.monotonic() < deadline:
        inputs += [m for m in reader.consume(10, 1.0) if m.error() is None]
    producer.begin_transaction()
    for m in inputs:
        producer.produce(sink, value=m.value().replace(b"in", b"out"), partition=m.offset() % 2)
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 10)],
                                         reader.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    reader.close()
    committed = read_kafka(kafka, sink, 10, group="k-txn-rc",
                           **{"isolation.level": "read_committed"})
    assert sorted(m.value() for m in committed) == sorted(b"out%d" % i for i in range(10))
    everything = read_kafka(kafka, sink, 15, group="k-txn-ru",
                            **{"isolation.level": "read_uncommitted"})
    assert sorted(m.value() for m in everything) == sorted(
        [b"out%d" % i for i in range(10)] + [b"aborted%d" % i for i in range(5)])
    check = KConsumer({"bootstrap.servers": kafka, "group.id": "k-txn-group"})
    assert check.committed([TopicPartition(source, 0)], timeout=10)[0].offset == 10
    check.close()
    # Strata's own read_committed consumer agrees, offsets and all.
    strata = Consumer(cluster.bootstrap, auto_offset_reset="earliest",
                      isolation_level="read_committed")
    strata.assign([(sink, 0), (sink, 1)])
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < 10 and time.monotonic() < deadline:
        got += strata.poll(timeout_ms=300)
    strata.close()
    assert sorted((r.partition, r.offset, r.value) for r in got) == \
        sorted((m.partition(), m.offset(), m.value()) for m in committed)


def test_incremental_alter_configs(admin: AdminClient) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    topic = create(admin, "k-configs", partitions=1)
    change = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([change]).values():
        future.result(30)
    (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    entries = described.result(20)
    assert (entries["retention.ms"].value, entries["cleanup.policy"].value) == \
        ("7200000", "compact")
    undo = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    for future in admin.incremental_alter_configs([undo]).values():
        future.result(30)
    (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    assert described.result(20)["retention.ms"].is_default
    append = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(Exception, match="APPEND and SUBTRACT"):
        for future in admin.incremental_alter_configs([append]).values():
            future.result(30)


# ----------------------------------------------------------------------------- kcat
def test_kcat_produces_lists_and_consumes(admin: AdminClient, kafka: str,
                                          cluster: Cluster) -> None:
    """kcat from Debian (librdkafka 2.0, which only compresses when Produce is advertised
    from v0, KAFKA-18659) as a user runs it at a shell: -P with keys, a header and snappy,
    -L, and -C with JSON output."""
    topic = create(admin, "k-kcat", partitions=2)
    lines = "".join(f"key{i}:value {i}\n" for i in range(50))
    produced = subprocess.run(["kcat", "-b", kafka, "-t", topic, "-P", "-K:", "-z", "snappy",
                               "-H", "via=kcat", "-p", "1"], input=lines, text=True,
                              capture_output=True, timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr
    listed = subprocess.run(["kcat", "-b", kafka, "-L", "-t", topic], text=True,
                            capture_output=True, timeout=60, check=True).stdout
    assert " 3 brokers:" in listed and f'topic "{topic}" with 2 partitions' in listed
    consumed = subprocess.run(["kcat", "-b", kafka, "-t", topic, "-C", "-e", "-o", "beginning",
                               "-J"], text=True, capture_output=True, timeout=60, check=True)
    records = [json.loads(line) for line in consumed.stdout.splitlines() if line.strip()]
    assert [(r["partition"], r["offset"], r["key"], r["payload"], r["headers"])
            for r in records] == [(1, i, f"key{i}", f"value {i}", ["via", "kcat"])
                                  for i in range(50)]
    strata = read_strata(cluster.bootstrap, topic, 2, 50)
    assert [(r.offset, r.key, r.value, r.headers) for r in strata] == \
        [(i, f"key{i}".encode(), f"value {i}".encode(), [("via", b"kcat")]) for i in range(50)]


# ----------------------------------------------------------------------------- typed topics
ORDER = ('{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}, '
         '{"name": "item", "type": "string"}, {"name": "qty", "type": ["null", "int"]}]}')

def test_brokers_never_load_pandas(cluster: Cluster) -> None:
    """After this module's groups, commits, seeks by timestamp and transactions (the
    tests above; the typed topics' tests come after it), no broker has pandas loaded:
    pyarrow imports it for a conversion of Python lists or scalars, which the
    coordinators' writes and the timestamp lookup used to make (0.3-1 s of CPU inside
    the first such request, 60 MB a broker). Its C extensions would be mapped into the
    process. (A typed topic's Kafka records are converted from Python values, which
    does load it.)"""
    for broker in cluster.brokers.values():
        assert broker.running
        maps = Path(f"/proc/{broker.pid}/maps").read_text()
        assert "/pandas/" not in maps, f"broker {broker.broker_id} loaded pandas"



def test_confluent_framed_avro_lands_as_typed_columns(admin: AdminClient, kafka: str,
                                                      cluster: Cluster) -> None:
    """A Kafka producer writing a typed topic as a Confluent serializer does (magic 0,
    schema id, Avro body): the broker checks the id against the topic's subject, stores
    typed columns (what Strata's consumer and Spark read), and a Kafka consumer gets the
    framed values back. Unframed values and unknown ids are refused for that partition."""
    import io

    import fastavro

    from strata.client import Admin
    from wire.schema import confluent_frame, parse_confluent_frame

    with Admin(cluster.bootstrap) as strata_admin:
        schema_id = strata_admin.register_schema("k-orders-value", ORDER)
    topic = create(admin, "k-orders", partitions=1,
                   config={"value.schema.subject": "k-orders-value"})
    parsed = fastavro.parse_schema(json.loads(ORDER))
    orders = [{"id": i, "item": f"item-{i}", "qty": None if i % 4 == 0 else i} for i in range(30)]

    def framed(order: dict[str, Any], sid: int = schema_id) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, order)
        return confluent_frame(sid, body.getvalue())

    outcomes: list[Any] = []
    producer = KProducer({"bootstrap.servers": kafka, "acks": "all", "linger.ms": 20})
    for order in orders:
        producer.produce(topic, key=str(order["id"]).encode(), value=framed(order),
                         partition=0, on_delivery=lambda e, m: outcomes.append(e))
    assert producer.flush(30) == 0 and outcomes == [None] * 30
    for bad in (b"plain bytes", framed(orders[0], sid=schema_id + 1000)):
        refused: list[Any] = []
        single = KProducer({"bootstrap.servers": kafka, "acks": "all", "retries": 0})
        single.produce(topic, value=bad, partition=0, on_delivery=lambda e, m,
                       into=refused: into.append(e))
        single.flush(30)
        assert [e.code() for e in refused] == [KafkaError.INVALID_RECORD], refused
    back = read_kafka(kafka, topic, 30)
    assert [parse_confluent_frame(m.value())[0] for m in back] == [schema_id] * 30
    assert [fastavro.schemaless_reader(io.BytesIO(parse_confluent_frame(m.value())[1]),
                                       parsed, None) for m in back] == orders
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(topic, 0)])
    table = consumer.poll_arrow(timeout_ms=5000)
    deadline = time.monotonic() + 20
    while table.num_rows < 30 and time.monotonic() < deadline:
        more = consumer.poll_arrow(timeout_ms=500)
        if more.num_rows:
            import pyarrow as pa

            table = pa.concat_tables([table, more])
    consumer.close()
    assert table.column("value").type.names == ["id", "item", "qty"]
    assert table.column("value").to_pylist() == orders
    # In a transaction: the commit marker sits among typed batches and a read_committed
    # Kafka reader still gets every framed value.
    txn = KProducer({"bootstrap.servers": kafka, "transactional.id": "k-orders-txn"})
    txn.init_transactions(30)
    txn.begin_transaction()
    more = [{"id": 100 + i, "item": "late", "qty": i} for i in range(2)]
    for order in more:
        txn.produce(topic, value=framed(order), partition=0)
    txn.commit_transaction(30)
    committed = read_kafka(kafka, topic, 32, group="k-orders-rc",
                           **{"isolation.level": "read_committed"})
    assert [fastavro.schemaless_reader(io.BytesIO(parse_confluent_frame(m.value())[1]),
                                       parsed, None) for m in committed] == orders + more


# ----------------------------------------------------------------------------- aiokafka
def test_aiokafka_producer_group_consumer_and_commit(admin: AdminClient, kafka: str) -> None:
    """aiokafka (asyncio, its own protocol classes): idempotent acks=all sends with
    headers and lz4-free gzip compression, a group consumer that commits, and a second
    consumer of the group that resumes after the commit."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioTP

    topic = create(admin, "k-aio", partitions=2)

    async def run() -> tuple[list[Any], int, list[int]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka, acks="all",
                                    enable_idempotence=True, compression_type="gzip")
        await producer.start()
        try:
            sent = [await producer.send_and_wait(topic, f"a{i}".encode(), key=b"k",
                                                 partition=i % 2,
                                                 headers=[("n", str(i).encode())])
                    for i in range(40)]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka, group_id="aio-group",
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[Any] = []
        try:
            while len(got) < 30:
                batches = await consumer.getmany(timeout_ms=1000, max_records=30 - len(got))
                for records in batches.values():
                    got.extend(records)
            await consumer.commit({AioTP(topic, p): max(r.offset for r in got
                                                         if r.partition == p) + 1
                                   for p in {r.partition for r in got}})
        finally:
            await consumer.stop()
        resumed = AIOKafkaConsumer(topic, bootstrap_servers=kafka, group_id="aio-group",
                                   auto_offset_reset="earliest", enable_auto_commit=False)
        await resumed.start()
        rest: list[Any] = []
        try:
            deadline = time.monotonic() + 30
            while len(got) + len(rest) < 40 and time.monotonic() < deadline:
                batches = await resumed.getmany(timeout_ms=1000)
                for records in batches.values():
                    rest.extend(records)
        finally:
            await resumed.stop()
        return got + rest, len(sent), [m.offset for m in sent]

    records, sent, offsets = asyncio.run(run())
    assert sent == 40 and sorted(offsets) == sorted(list(range(20)) * 2)
    assert sorted((r.partition, r.offset, r.value, list(r.headers)) for r in records) == \
        sorted((i % 2, i // 2, f"a{i}".encode(), [("n", str(i).encode())]) for i in range(40))


def test_confluent_framed_json_schema_lands_as_typed_columns(admin: AdminClient, kafka: str,
                                                             cluster: Cluster) -> None:
    from strata.client import Admin
    from wire.schema import confluent_frame, parse_confluent_frame

    schema = json.dumps({"type": "object", "properties": {
        "sku": {"type": "string"}, "price": {"type": "number"}}, "required": ["sku"]})
    with Admin(cluster.bootstrap) as strata_admin:
        schema_id = strata_admin.register_schema("k-prices-value", schema, "JSON")
    topic = create(admin, "k-prices", partitions=1,
                   config={"value.schema.subject": "k-prices-value"})
    rows = [{"sku": f"s{i}", "price": i * 1.5} for i in range(10)]
    producer = KProducer({"bootstrap.servers": kafka, "acks": "all", "linger.ms": 20})
    for row in rows:
        producer.produce(topic, value=confluent_frame(schema_id, json.dumps(row).encode()),
                         partition=0)
    assert producer.flush(30) == 0
    back = [parse_confluent_frame(m.value()) for m in read_kafka(kafka, topic, 10)]
    assert [(sid, json.loads(body)) for sid, body in back] == [(schema_id, r) for r in rows]
    strata = read_strata(cluster.bootstrap, topic, 1, 10)
    assert [r.value for r in strata] == rows  # typed: the decoded objects

