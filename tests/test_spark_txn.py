"""The Spark sink's transactional commits and the source's isolation level, with real
brokers and a real SparkSession (docs/spark.md, "Exactly once" and "Isolation").

Checked:

- a read_committed reader polling while a streaming query runs never sees part of a
  micro-batch: every micro-batch writes rows to three partitions, each row carrying its
  batch's tag and row count (``tests/support/tagged_source.py``), and at every poll the
  reader holds, per tag, all of its rows or none. The reader reads each round up to the
  last stable offsets of one ListOffsets answer, as the Spark source plans a batch (a
  consumer that fetches partitions one at a time could, like Kafka's, hold one
  partition's part of a batch a poll before another's);
- a driver SIGKILLed after the batch's transaction is prepared (every partition's commit
  in it) and before EndTxn leaves it open, invisible at read_committed and never aborted
  by the transaction timeout; the restarted query completes it, and the output holds
  every input record exactly once at read_committed. The driver is held between the two
  phases by ``STRATA_SPARK_SINK_TEST_HOLD_AFTER_PREPARE`` (the window is milliseconds
  wide otherwise);
- the source's ``kafka.isolation.level`` / ``isolation.level``: read_committed (the
  default) skips an aborted transaction of a transactional Producer, stops before an
  open one and has no row for a marker's offset; read_uncommitted shows everything; a
  bad value fails the query at start.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_source._errors import StrataSparkOptionError
from spark_source._options import parse_source_options
from spark_source._sink import TEST_HOLD_ENV, checkpoint_identity
from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from strata.client.sink import TransactionalSinkCommitter, sink_transactional_id
from tests.support.broker_process import BrokerProcess
from tests.support.pipeline_process import PipelineProcess, read_values
from tests.support.tagged_source import TaggedSource, parse_value

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(600)]


def _topic(admin: Admin, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    return name


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    with Admin(broker.bootstrap) as client:
        yield client


# --------------------------------------------------------------------------- options

BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def test_isolation_options_both_names_and_the_default() -> None:
    def level(**options: str) -> str:
        return parse_source_options({**BASE, **options}, streaming=True).isolation_level

    assert level() == "read_committed"
    assert level(**{"kafka.isolation.level": "read_uncommitted"}) == "read_uncommitted"
    assert level(**{"isolation.level": " READ_UNCOMMITTED "}) == "read_uncommitted"
    assert level(**{"Kafka.Isolation.Level": "read_committed"}) == "read_committed"
    assert level(**{"kafka.isolation.level": "read_committed",
                    "isolation.level": "read_committed"}) == "read_committed"
    assert parse_source_options({**BASE, "isolation.level": "read_uncommitted"},
                                streaming=False).isolation_level == "read_uncommitted"


@pytest.mark.parametrize(("options", "option", "text"), [
    ({"kafka.isolation.level": "snapshot"}, "kafka.isolation.level",
     "'snapshot' is not valid; use read_committed .* or read_uncommitted"),
    ({"isolation.level": ""}, "isolation.level", "'' is not valid; use read_committed"),
    ({"kafka.isolation.level": "read_committed", "isolation.level": "read_uncommitted"},
     "kafka.isolation.level", "set only one of them"),
])
def test_a_bad_isolation_level_is_refused_with_what_to_do(
        options: dict[str, str], option: str, text: str) -> None:
    with pytest.raises(StrataSparkOptionError, match=f"option {option}: .*{text}") as info:
        parse_source_options({**BASE, **options}, streaming=True)
    assert str(info.value).startswith("[INVALID_SPARK_OPTION] option ")
    assert info.value.code == 1200


# --------------------------------------------------------------------------- source


def test_read_committed_skips_aborted_and_open_transactions(
        spark: Any, broker: BrokerProcess, admin: Admin, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    topic = _topic(admin, "iso", 2)

    def send(producer: Producer, prefix: str) -> None:
        for p in range(2):
            for i in range(3):
                producer.send(topic, f"{prefix}-{p}-{i}".encode(), partition=p)
        producer.flush()

    with Producer(bootstrap) as plain:
        send(plain, "plain")
    with Producer(bootstrap, transactional_id=f"iso-{topic}") as txn:
        txn.init_transactions()
        with txn.transaction():
            send(txn, "committed")
        txn.begin_transaction()
        send(txn, "aborted")
        txn.abort_transaction()
    with Producer(bootstrap) as plain:
        send(plain, "after")
    # A transaction left open (not timed out within the test) holds the LSO back.
    hanging = Producer(bootstrap, transactional_id=f"iso-open-{topic}",
                       transaction_timeout_ms=600_000)
    try:
        hanging.init_transactions()
        hanging.begin_transaction()
        send(hanging, "open")

        def values(frame: Any) -> list[str]:
            return sorted(r.value.decode() for r in frame.select("value").collect())

        def read(**options: str) -> Any:
            return (spark.read.format("strata").option("bootstrap.servers", bootstrap)
                    .option("subscribe", topic).options(**options).load())

        committed = [f"{prefix}-{p}-{i}" for prefix in ("after", "committed", "plain")
                     for p in range(2) for i in range(3)]
        assert values(read()) == sorted(committed)  # read_committed is the default
        assert values(read(**{"kafka.isolation.level": "read_committed"})) == \
            sorted(committed)
        everything = sorted(committed + [f"{prefix}-{p}-{i}" for prefix in ("aborted", "open")
                                         for p in range(2) for i in range(3)])
        assert values(read(**{"kafka.isolation.level": "read_uncommitted"})) == everything
        assert values(read(**{"isolation.level": "read_uncommitted"})) == everything
        # Offsets: 3 plain, 3 committed + COMMIT marker, 3 aborted + ABORT marker, 3
        # after, then the open transaction. Markers and aborted records have no row.
        offsets = sorted(r.offset for r in read().where("partition = 0")
                         .select("offset").collect())
        assert offsets == [0, 1, 2, 3, 4, 5, 11, 12, 13]
        # A stream at read_committed (the Strata-named option) reads the same.
        sink: list[str] = []
        query = (spark.readStream.format("strata").option("bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("startingOffsets", "earliest")
                 .option("isolation.level", "read_committed").load()
                 .writeStream.foreachBatch(lambda df, _: sink.extend(
                     r.value.decode() for r in df.select("value").collect()))
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert sorted(sink) == sorted(committed)
        # A bad value fails the query when it starts, naming the option.
        with pytest.raises(Exception, match=r"INVALID_SPARK_OPTION.*kafka\.isolation\.level"):
            read(**{"kafka.isolation.level": "committed"}).count()
        # Once the open transaction commits, read_committed sees it too.
        hanging.commit_transaction()
        deadline = time.monotonic() + 30
        while len(values(read())) < len(committed) + 6 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(values(read())) == len(committed) + 6
    finally:
        hanging.close()


# --------------------------------------------------------------------------- sink


class SnapshotReader(threading.Thread):
    """A read_committed reader polling while the query runs: each round it takes the
    last stable offsets of every partition (one ListOffsets answer) and reads up to
    them; then it checks that every tag it holds is complete."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.stop_event = threading.Event()
        self.rows: dict[int, list[int]] = {}  # tag -> indexes seen
        self.counts: dict[int, int] = {}
        self.polls = 0
        self.partial: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Admin(self.bootstrap) as admin, Consumer(
                    self.bootstrap, auto_offset_reset="earliest",
                    isolation_level="read_committed") as consumer:
                consumer.assign(self.tps)
                pending: dict[TopicPartition, list[tuple[int, bytes]]] = {
                    tp: [] for tp in self.tps}
                while not self.stop_event.is_set():
                    stable = {tp: r.offset for tp, r in admin.list_offsets(
                        dict.fromkeys(self.tps, "latest"),
                        isolation_level="read_committed").items()}
                    deadline = time.monotonic() + 10
                    while any(consumer.position(tp) < stable[tp] for tp in self.tps) and \
                            time.monotonic() < deadline:
                        table = consumer.poll_arrow(timeout_ms=100)
                        for p, offset, value in zip(table.column("partition").to_pylist(),
                                                    table.column("offset").to_pylist(),
                                                    table.column("value").to_pylist(),
                                                    strict=True):
                            pending[TopicPartition(self.topic, p)].append((offset, value))
                    for tp in self.tps:
                        now = [v for o, v in pending[tp] if o < stable[tp]]
                        pending[tp] = [(o, v) for o, v in pending[tp] if o >= stable[tp]]
                        for value in now:
                            tag, count, index = parse_value(value)
                            self.counts[tag] = count
                            self.rows.setdefault(tag, []).append(index)
                    self.polls += 1
                    for tag, seen in self.rows.items():
                        if len(seen) != self.counts[tag]:
                            self.partial.append(f"poll {self.polls}: batch {tag} has "
                                                f"{len(seen)} of {self.counts[tag]} rows")
                    time.sleep(0.05)
        except BaseException as err:  # reported by the test
            self.error = err


def test_a_read_committed_reader_never_sees_part_of_a_micro_batch(
        spark: Any, broker: BrokerProcess, admin: Admin, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    topic = _topic(admin, "atomic", 3)
    ticks, per_tick = 12, 30
    spark.dataSource.register(TaggedSource)
    reader = SnapshotReader(bootstrap, topic, 3)
    reader.start()
    query = (spark.readStream.format("strata-test-tagged").option("ticks", str(ticks))
             .option("rowsPerTick", str(per_tick)).load()
             .writeStream.format("strata").option("bootstrap.servers", bootstrap)
             .option("topic", topic).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 240
        while sum(len(v) for v in reader.rows.values()) < ticks * per_tick and \
                time.monotonic() < deadline and reader.is_alive():
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
    finally:
        query.stop()
        time.sleep(1.0)  # a duplicate would show up after the last original
        reader.stop_event.set()
        reader.join(30)
    print(f"reader: {reader.polls} polls, {len(reader.rows)} micro-batches")
    assert reader.error is None, reader.error
    assert not reader.partial, reader.partial[:5]
    # Every micro-batch, whole and once; it used every partition; the reader polled
    # through the run, not once at the end.
    assert sum(len(v) for v in reader.rows.values()) == ticks * per_tick
    assert all(sorted(seen) == list(range(reader.counts[tag]))
               for tag, seen in reader.rows.items())
    assert reader.polls > len(reader.rows)
    with Consumer(bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        partitions: set[int] = set()
        for _ in range(20):
            partitions.update(r.partition for r in consumer.poll(timeout_ms=100))
    assert partitions == {0, 1, 2}


def start_pipeline(bootstrap: str, source: str, sink: str, checkpoint: Path, *,
                   hold: bool) -> PipelineProcess:
    """The child pipeline; ``hold`` parks its driver between the two phases of a
    micro-batch's commit (``STRATA_SPARK_SINK_TEST_HOLD_AFTER_PREPARE``)."""
    return PipelineProcess(bootstrap, source, sink, checkpoint, max_offsets=300,
                           env={TEST_HOLD_ENV: "1"} if hold else None,
                           env_drop=(TEST_HOLD_ENV,))


def test_a_driver_killed_between_prepare_and_commit_is_completed_by_the_restart(
        broker: BrokerProcess, admin: Admin, tmp_path: Path,
        pipelines: list[PipelineProcess]) -> None:
    bootstrap = broker.bootstrap
    source, sink = _topic(admin, "crash-in", 2), _topic(admin, "crash-out", 3)
    values = [f"record-{i:05d}".encode() for i in range(1200)]
    with Producer(bootstrap) as producer:
        for p in range(2):
            producer.send_batch(source, values[p::2], keys=[b"k" + v for v in values[p::2]],
                                partition=p).result(60)
    checkpoint = tmp_path / "checkpoint"
    sink_id = "checkpoint:" + checkpoint_identity(str(checkpoint))
    transactional_id = sink_transactional_id(sink_id)

    held = start_pipeline(bootstrap, source, sink, checkpoint, hold=True)
    pipelines.append(held)
    deadline = time.monotonic() + 240
    state = None
    with TransactionalSinkCommitter(bootstrap, sink_id) as probe:
        while time.monotonic() < deadline and held.process.poll() is None:
            state = probe.describe()
            if state == ("Ongoing", "batch=0;prepared"):
                break
            time.sleep(0.2)
    assert state == ("Ongoing", "batch=0;prepared"), held.output()
    held.kill()  # the driver dies between the two phases

    # Prepared, not committed: in the log, invisible at read_committed, and kept open
    # (two-phase: the transaction timeout never aborts it).
    uncommitted = read_values(bootstrap, sink, 3, "read_uncommitted")
    assert uncommitted and len(uncommitted) == len(set(uncommitted)) <= 300
    assert read_values(bootstrap, sink, 3, "read_committed") == []
    with TransactionalSinkCommitter(bootstrap, sink_id) as probe:
        assert probe.describe() == ("Ongoing", "batch=0;prepared")
    stable = admin.list_offsets({TopicPartition(sink, p): "latest" for p in range(3)},
                                isolation_level="read_committed")
    assert {r.offset for r in stable.values()} == {0}  # every partition held at batch 0

    final = start_pipeline(bootstrap, source, sink, checkpoint, hold=False)
    pipelines.append(final)
    assert final.process.wait(300) == 0, final.output()
    assert any(line.startswith("pipeline done") for line in final.lines), final.output()
    committed = read_values(bootstrap, sink, 3, "read_committed")
    assert len(committed) == len(values), f"{len(committed)} rows for {len(values)}"
    assert sorted(committed) == sorted(b"T:" + v for v in values)
    # Nothing was appended twice or aborted: the resumed batch 0 kept its first commit.
    assert sorted(read_values(bootstrap, sink, 3, "read_uncommitted")) == sorted(committed)
    with TransactionalSinkCommitter(bootstrap, sink_id) as probe:
        last = probe.describe()
    assert last is not None and last[0] in ("PrepareCommit", "CompleteCommit")
    assert transactional_id == f"strata-sink:{sink_id}"
