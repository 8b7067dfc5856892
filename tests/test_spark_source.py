"""The Spark source (``format("strata")``) against real ZooKeeper, a real broker and Spark.

One SparkSession for the module (``local[2]`` from conf/spark-defaults.conf) and one
broker whose retention task runs every 200 ms, so retention tests wait for it with
bounded polls. Every test uses its own topics. Checks that need no Spark (option
parsing, offset arithmetic, reader behaviour against the broker) call the source's
classes directly, which keeps the module fast; the Spark tests check what a user sees:
rows, query progress, checkpoints, and how a failing query reports itself.
"""

from __future__ import annotations

import itertools
import json
import pickle
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from spark_source import SCHEMA_DDL, StrataSparkDataLossError, StrataSparkOptionError, register
from spark_source._arrow import SPARK_ARROW_SCHEMA
from spark_source._options import offsets_to_json, parse_source_options
from spark_source._planning import OffsetRange, plan_ranges, rate_limit
from spark_source._read import read_range
from spark_source._reader import StrataBatchReader, StrataStreamReader
from strata.client import Admin, NewTopic, Producer, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(180)]

T = TypeVar("T")
_names = itertools.count()
#: Record timestamps the tests choose (2023-11-14T22:13:20Z + i ms).
BASE_TS = 1_700_000_000_000
Row = tuple[Any, ...]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bootstrap(strata_broker: BrokerProcess) -> str:
    return strata_broker.bootstrap


# --------------------------------------------------------------------------- helpers


def topic_name(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:6]}"


def create(admin: Admin, partitions: int, prefix: str = "src",
           configs: dict[str, str] | None = None, name: str | None = None) -> str:
    name = name or topic_name(prefix)
    admin.create_topics([NewTopic(name, partitions, 1, configs or {})])
    return name


def produce(bootstrap: str, topic: str, count: int, *, partitions: int = 1,
            start: int = 0, base_ts: int = BASE_TS) -> list[Row]:
    """Records ``start .. start + count - 1``, spread round-robin over ``partitions``;
    returns the rows Spark should show for them: (key, value, topic, partition, offset,
    timestamp ms, timestampType, headers). Record i has timestamp ``base_ts + i`` (the
    default lies years back: fine unless retention is on, which deletes such segments)."""
    expected: list[Row] = []
    with Producer(bootstrap, linger_ms=1) as producer:
        sent = []
        for i in range(start, start + count):
            key = None if i % 5 == 0 else f"k{i}".encode()
            headers: list[tuple[str, bytes | None]] = \
                [] if i % 3 == 0 else [("h", f"v{i}".encode()), ("nil", None)]
            value = f"value-{i}".encode()
            future = producer.send(topic, value, key=key, headers=headers,
                                   partition=i % partitions, timestamp_ms=base_ts + i)
            sent.append((future, key, value, headers))
        producer.flush()
        for future, key, value, headers in sent:
            meta = future.result()
            expected.append((key, value, topic, meta.partition, meta.offset, meta.timestamp,
                             0, tuple(headers)))
    return expected


def as_rows(frame: Any) -> list[Row]:
    """Collected rows in the ``produce`` form, sorted by (topic, partition, offset)."""
    from pyspark.sql import functions as F

    collected = frame.select("key", "value", "topic", "partition", "offset",
                             F.unix_millis("timestamp").alias("ts"), "timestampType",
                             "headers").collect()
    rows = [(None if r.key is None else bytes(r.key), bytes(r.value), r.topic, r.partition,
             r.offset, r.ts, r.timestampType,
             tuple((h.key, None if h.value is None else bytes(h.value))
                   for h in (r.headers or [])))
            for r in collected]
    return sorted(rows, key=lambda r: (r[2], r[3], r[4]))


def by_offset(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r[2], r[3], r[4]))


def stream(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.readStream.format("strata").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(frame: Any, checkpoint: Path, *, once: bool = False,
                      timeout: float = 120) -> tuple[list[Row], list[dict[str, Any]]]:
    """Run ``frame`` with AvailableNow (or Once) into a ``foreachBatch`` sink, which (unlike
    the memory sink) can resume from ``checkpoint``. Returns the rows in batch order and
    the progress of the batches that read something."""
    batches: dict[int, list[Row]] = {}

    def keep(batch: Any, batch_id: int) -> None:
        batches[batch_id] = as_rows(batch)  # a re-run batch replaces its first attempt

    writer = frame.writeStream.foreachBatch(keep) \
        .option("checkpointLocation", str(checkpoint))
    query = (writer.trigger(once=True) if once else writer.trigger(availableNow=True)).start()
    try:
        assert query.awaitTermination(timeout), f"the query did not stop within {timeout}s"
    finally:
        query.stop()
    rows = [row for batch_id in sorted(batches) for row in batches[batch_id]]
    return rows, [p for p in query.recentProgress if p["numInputRows"] > 0]


def log_start(admin: Admin, topic: str, partition: int = 0) -> int:
    tp = TopicPartition(topic, partition)
    return admin.list_offsets({tp: "earliest"})[tp].offset


def expire_old_segments(admin: Admin, topic: str, above: int) -> int:
    """Let retention delete every closed segment; wait until the log starts past
    ``above``. Returns the new log start offset."""
    admin.alter_configs(topic, {"retention.ms": "1"})
    return wait_for(f"log start of {topic}", lambda: log_start(admin, topic),
                    lambda start: start > above)


# --------------------------------------------------------------------------- registration


def test_pyspark_strata_is_visible_to_sparks_lookup(tmp_path: Path) -> None:
    """Spark's lookup (pkgutil.iter_modules in a worker) must see the module from any
    working directory, not just the repository root."""
    probe = ("import pkgutil, pyspark_strata; "
             "print(sorted(m.name for m in pkgutil.iter_modules() "
             "if m.name.startswith('pyspark_')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "pyspark_strata" in out.stdout, (
        "pyspark_strata is not importable / listed by pkgutil outside the repository: "
        "install the project with `pip install -e . --config-settings editable_mode=compat` "
        "(setuptools' default editable finder hides top-level modules from pkgutil)\n"
        + out.stdout + out.stderr)


def test_schema_is_the_kafka_source_schema(spark: Any, bootstrap: str, admin: Admin) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kafka = StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))),
    ])
    topic = create(admin, 1)
    frame = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
        .option("subscribe", topic).load()
    assert frame.schema == kafka
    assert stream(spark, bootstrap, subscribe=topic).schema == kafka
    # read() hands Spark batches in exactly the Arrow form it checks against.
    assert to_arrow_schema(kafka, timezone="UTC") == SPARK_ARROW_SCHEMA
    assert SCHEMA_DDL.startswith("key binary, value binary")


def test_register_works_alongside_auto_registration(spark: Any, bootstrap: str,
                                                    admin: Admin) -> None:
    topic = create(admin, 1)
    expected = produce(bootstrap, topic, 3)
    register(spark)
    frame = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
        .option("subscribe", topic).load()
    assert as_rows(frame) == expected


# --------------------------------------------------------------------------- batch reads


def test_batch_read_returns_exactly_what_was_produced(spark: Any, bootstrap: str,
                                                      admin: Admin) -> None:
    topic = create(admin, 3)
    expected = produce(bootstrap, topic, 60, partitions=3)
    append_time = create(admin, 1, configs={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    produce(bootstrap, append_time, 4)
    after = int(time.time() * 1000)

    rows = as_rows(spark.read.format("strata").option("bootstrap.servers", bootstrap)
                   .option("subscribe", f"{topic},{append_time}").load())
    assert [r for r in rows if r[2] == topic] == by_offset(expected)
    for partition in range(3):  # offsets 0..n-1 in order, per partition
        offsets = [r[4] for r in rows if r[2] == topic and r[3] == partition]
        assert offsets == list(range(20))
    stamped = [r for r in rows if r[2] == append_time]
    assert [r[4] for r in stamped] == [0, 1, 2, 3]
    assert all(r[6] == 1 and before <= r[5] <= after for r in stamped), stamped


def test_batch_offsets_timestamps_and_min_partitions(spark: Any, bootstrap: str,
                                                     admin: Admin) -> None:
    topic = create(admin, 2)
    expected = by_offset(produce(bootstrap, topic, 40, partitions=2))

    def read(**options: str) -> Any:
        reader = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
            .option("subscribe", topic)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    ranged = read(startingOffsets=json.dumps({topic: {"0": 5, "1": -2}}),
                  endingOffsets=json.dumps({topic: {"0": 10, "1": -1}}))
    assert as_rows(ranged) == [r for r in expected
                               if (r[3] == 0 and 5 <= r[4] < 10) or r[3] == 1]
    # Records i have timestamp BASE_TS + i; i = 2 * offset + partition.
    since = read(startingTimestamp=str(BASE_TS + 30))
    assert as_rows(since) == [r for r in expected if r[5] >= BASE_TS + 30]
    late = read(startingTimestamp=str(BASE_TS + 10_000))
    assert as_rows(late) == []
    split = read(minPartitions="7")
    assert split.rdd.getNumPartitions() >= 7
    assert as_rows(split) == expected


def test_batch_reader_checks_offsets_against_the_cluster(bootstrap: str, admin: Admin) -> None:
    topic = create(admin, 2)
    produce(bootstrap, topic, 10, partitions=2)

    def plan(**options: str) -> list[OffsetRange]:
        opts = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic,
                                     **options}, streaming=False)
        return list(StrataBatchReader(opts).partitions())

    assert {(r.partition, r.start, r.end) for r in plan()} == {(0, 0, 5), (1, 0, 5)}
    cases = {
        "subscribe": (dict(subscribe=f"{topic},missing-{topic}"), "do not exist"),
        "startingOffsets": (dict(startingOffsets=json.dumps({topic: {"0": 1}})),
                            re.escape(f"no offset for partition(s) {topic}-1")),
        "endingOffsets": (dict(endingOffsets=json.dumps({topic: {"0": 9, "1": 5}})),
                          "its latest offset is 5"),
    }
    for option, (options, text) in cases.items():
        with pytest.raises(StrataSparkOptionError, match=f"option {option}: .*{text}"):
            plan(**options)
    with pytest.raises(StrataSparkOptionError, match="which do not exist"):
        plan(startingOffsets=json.dumps({topic: {"0": 0, "1": 0, "7": 0}}))
    with pytest.raises(StrataSparkOptionError, match="before its starting offset 3"):
        plan(startingOffsets=json.dumps({topic: {"0": 3, "1": 0}}),
             endingOffsets=json.dumps({topic: {"0": 2, "1": -1}}))


def test_option_errors_fail_the_query_at_start(spark: Any, bootstrap: str,
                                               admin: Admin, tmp_path: Path) -> None:
    topic = create(admin, 1)
    produce(bootstrap, topic, 3)
    missing = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
        .option("subscribe", f"no-such-{topic}").load()
    with pytest.raises(Exception, match=r"INVALID_SPARK_OPTION\] option subscribe"):
        missing.collect()

    bad = stream(spark, bootstrap, subscribe=topic, endingOffsets="latest")
    with pytest.raises(Exception, match=r"INVALID_SPARK_OPTION\] option endingOffsets"):
        run_available_now(bad, tmp_path / "cp")


# --------------------------------------------------------------------------- streaming


def test_stream_restart_from_checkpoint_loses_and_duplicates_nothing(
        spark: Any, bootstrap: str, admin: Admin, tmp_path: Path) -> None:
    topic = create(admin, 3)
    expected = produce(bootstrap, topic, 60, partitions=3)
    batches: dict[int, list[Row]] = {}
    run_of: dict[int, int] = {}
    run = 1

    def keep(frame: Any, batch_id: int) -> None:
        batches[batch_id] = as_rows(frame)  # a re-run batch replaces its first attempt
        run_of[batch_id] = run

    def start() -> Any:
        return (stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                       maxOffsetsPerTrigger="20")
                .writeStream.foreachBatch(keep)
                .option("checkpointLocation", str(tmp_path / "cp"))
                .trigger(availableNow=True).start())

    query = start()
    wait_for("first batch", lambda: len(batches), lambda n: n >= 1)
    query.stop()  # maybe in the middle of a batch, whose offsets are already logged
    last_of_first_run = max(batches)
    expected += produce(bootstrap, topic, 30, partitions=3, start=60)
    run = 2
    query = start()
    assert query.awaitTermination(120)
    # The second run goes on from the checkpoint: it re-runs an unfinished batch under
    # its batch id, or starts with the next one.
    first_of_second_run = min(b for b, r in run_of.items() if r == 2)
    assert first_of_second_run in (last_of_first_run, last_of_first_run + 1)
    got = [row for batch_id in sorted(batches) for row in batches[batch_id]]
    assert len(got) == len(expected), "duplicates or loss across the restart"
    assert by_offset(got) == by_offset(expected)
    assert all(len(rows) <= 20 for rows in batches.values())


def test_max_offsets_per_trigger_bounds_batches_and_lag_is_reported(
        spark: Any, bootstrap: str, admin: Admin, tmp_path: Path) -> None:
    topic = create(admin, 3)
    expected = produce(bootstrap, topic, 100, partitions=3)
    frame = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                   maxOffsetsPerTrigger="30")
    rows, progress = run_available_now(frame, tmp_path / "cp")
    assert [p["numInputRows"] for p in progress] == [30, 30, 30, 10]
    assert by_offset(rows) == by_offset(expected)
    # reportLatestOffset: the broker's latest offsets, whatever the batch's end.
    latest = offsets_to_json({TopicPartition(topic, p): n
                              for p, n in ((0, 34), (1, 33), (2, 33))})
    assert all(json.loads(p["sources"][0]["latestOffset"]) == latest for p in progress)
    assert json.loads(progress[0]["sources"][0]["endOffset"]) != latest


def test_available_now_and_once_stop_when_caught_up(spark: Any, bootstrap: str,
                                                    admin: Admin, tmp_path: Path) -> None:
    topic = create(admin, 2)
    first = produce(bootstrap, topic, 10, partitions=2)
    frame = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest")
    rows, progress = run_available_now(frame, tmp_path / "cp")
    assert sum(p["numInputRows"] for p in progress) == 10
    assert by_offset(rows) == by_offset(first)

    second = produce(bootstrap, topic, 6, partitions=2, start=10)
    rows, _ = run_available_now(frame, tmp_path / "cp")  # same checkpoint: only the new
    assert by_offset(rows) == by_offset(second)

    third = produce(bootstrap, topic, 4, partitions=2, start=16)
    rows, progress = run_available_now(frame, tmp_path / "cp", once=True)
    assert len(progress) == 1 and by_offset(rows) == by_offset(third)


def test_processing_time_stream_from_latest_picks_up_new_matching_topics(
        spark: Any, bootstrap: str, admin: Admin, tmp_path: Path) -> None:
    """startingOffsets defaults to latest for a stream; a topic that starts matching
    subscribePattern later is read from its earliest offset; names must match whole."""
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    first = create(admin, 1, name=f"{prefix}-a")
    other = create(admin, 1, name=f"other{prefix}-b")
    produce(bootstrap, first, 4)  # before the query starts: not read
    query = (stream(spark, bootstrap, subscribePattern=f"{prefix}-.*")
             .writeStream.format("memory").queryName("pattern")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for("the query's first batch", lambda: query.lastProgress, bool)
        expected = produce(bootstrap, first, 3, start=4)
        produce(bootstrap, other, 2)
        wait_for("new records", lambda: spark.table("pattern").count(), lambda n: n >= 3)
        second = create(admin, 2, name=f"{prefix}-b")
        expected += produce(bootstrap, second, 6, partitions=2)
        wait_for("records of the new topic", lambda: spark.table("pattern").count(),
                 lambda n: n >= 9)
        assert as_rows(spark.table("pattern")) == by_offset(expected)
    finally:
        query.stop()


def test_fail_on_data_loss_true_fails_and_false_skips(spark: Any, bootstrap: str,
                                                      admin: Admin, tmp_path: Path) -> None:
    topic = create(admin, 1, configs={"segment.bytes": "1024"})
    now = int(time.time() * 1000)  # retention.ms is a week: these stay until lowered
    produced: list[Row] = []
    for i in range(10):  # one batch per flush: every batch closes a small segment
        produced += produce(bootstrap, topic, 3, start=3 * i, base_ts=now)
    frame = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest")
    rows, _ = run_available_now(frame, tmp_path / "cp")
    assert len(rows) == 30

    for i in range(10, 20):
        produced += produce(bootstrap, topic, 3, start=3 * i, base_ts=now)
    start = expire_old_segments(admin, topic, above=30)
    assert start < 60

    with pytest.raises(Exception, match=rf"DATA_LOSS\] records 30\.\.{start - 1} of "
                       rf"{topic}-0 were deleted.*failOnDataLoss=false"):
        run_available_now(frame, tmp_path / "cp")

    skipping = stream(spark, bootstrap, subscribe=topic, failOnDataLoss="false")
    rows, _ = run_available_now(skipping, tmp_path / "cp")  # same checkpoint: from 30
    assert by_offset(rows) == by_offset(produced)[start:]


def test_data_loss_found_by_the_executor_and_by_the_driver(bootstrap: str,
                                                            admin: Admin) -> None:
    """Retention can strike between planning and reading: read() applies failOnDataLoss
    itself. And a subscribed topic that disappears is data loss for latestOffset."""
    topic = create(admin, 1, configs={"segment.bytes": "1024"})
    now = int(time.time() * 1000)
    for i in range(8):
        produce(bootstrap, topic, 3, start=3 * i, base_ts=now)
    start = expire_old_segments(admin, topic, above=0)

    strict = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic},
                                  streaming=True)
    with pytest.raises(StrataSparkDataLossError, match=f"records 0..{start - 1} of {topic}-0"):
        list(read_range(strict, OffsetRange(topic, 0, 0, 24)))
    lenient = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic,
                                    "failOnDataLoss": "false"}, streaming=True)
    batches = list(read_range(lenient, OffsetRange(topic, 0, 0, 24)))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == \
        list(range(start, 24))
    with pytest.raises(StrataSparkOptionError, match="startingOffsets"):
        StrataBatchReader(parse_source_options(
            {"bootstrap.servers": bootstrap, "subscribe": topic,
             "startingOffsets": json.dumps({topic: {"0": 99}})}, streaming=False)).partitions()

    gone = create(admin, 1)
    reader = StrataStreamReader(parse_source_options(
        {"bootstrap.servers": bootstrap, "subscribe": gone}, streaming=True))
    try:
        begin = reader.initialOffset()
        admin.delete_topics([gone])
        with pytest.raises(StrataSparkDataLossError, match=f"{gone}-0 no longer exists"):
            reader.latestOffset(begin, ReadAllAvailable())
    finally:
        reader.stop()


def test_stream_reader_plans_new_partitions_and_pickles_without_clients(
        bootstrap: str, admin: Admin) -> None:
    topic = create(admin, 2)
    produce(bootstrap, topic, 10, partitions=2)
    reader = StrataStreamReader(parse_source_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "latest"},
        streaming=True))
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 5, "1": 5}}
        # A partition the checkpoint does not know yet (new since the last batch):
        # planned from its earliest offset.
        partial = {topic: {"0": 5}}
        end = reader.latestOffset(partial, ReadAllAvailable())
        assert end == {topic: {"0": 5, "1": 5}}
        assert [(r.partition, r.start, r.end) for r in reader.partitions(partial, end)] == \
            [(1, 0, 5)]
        copy = pickle.loads(pickle.dumps(reader))  # how Spark ships it to executors
        assert copy.options == reader.options
    finally:
        reader.stop()


# --------------------------------------------------------------------------- pure logic


def test_rate_limit_is_proportional_exact_and_does_not_starve() -> None:
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
    begin = {a: 0, b: 100, c: 7}
    assert rate_limit(begin, {a: 10, b: 110, c: 7}, 100) == {a: 10, b: 110, c: 7}
    end = rate_limit(begin, {a: 1000, b: 200, c: 8}, 100)
    assert sum(end[tp] - begin[tp] for tp in begin) == 100
    assert end[c] == 8 and end[a] - begin[a] > end[b] - begin[b] > 0
    assert rate_limit(begin, {a: 1000, b: 1100, c: 8}, 2) == {a: 1, b: 101, c: 7}
    for limit in range(1, 60):
        end = rate_limit(begin, {a: 37, b: 111, c: 20}, limit)
        assert sum(end[tp] - begin[tp] for tp in begin) == limit


def test_plan_ranges_splits_for_min_partitions() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    plain = plan_ranges({a: 0, b: 10}, {a: 100, b: 10}, None)
    assert [(r.partition, r.start, r.end) for r in plain] == [(0, 0, 100)]
    split = plan_ranges({a: 0, b: 10}, {a: 100, b: 30}, 6)
    assert [(r.partition, r.start, r.end) for r in split] == [
        (0, 0, 20), (0, 20, 40), (0, 40, 60), (0, 60, 80), (0, 80, 100), (1, 10, 30)]
    assert plan_ranges({a: 5}, {a: 5}, 4) == []


GOOD = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


@pytest.mark.parametrize(("streaming", "options", "option", "text"), [
    (True, {"foo": "1"}, "foo", "not a strata source option"),
    (True, {"assign": '{"t":[0]}'}, "assign", "Kafka source option"),
    (True, {"kafka.group.id": "g"}, "kafka.group.id", "the security options"),
    (True, {"subscribePattern": "t.*"}, "subscribe", "exactly one.*both are set"),
    (True, {"subscribe": None}, "subscribe", "exactly one.*neither is set"),
    (True, {"subscribe": "a,b c"}, "subscribe", "'b c' in 'a,b c' is not a topic name"),
    (True, {"subscribe": None, "subscribePattern": "("}, "subscribePattern",
     "not a valid regular expression"),
    (True, {"startingOffsets": "middle"}, "startingOffsets", "use earliest, latest or JSON"),
    (True, {"startingOffsets": '{"t": {"0": }'}, "startingOffsets", "not valid JSON"),
    (True, {"startingOffsets": '{"u": {"0": 1}}'}, "startingOffsets",
     "names topic 'u', which subscribe does not list"),
    (True, {"startingOffsets": '{"t": {"x": 1}}'}, "startingOffsets", "not a partition number"),
    (True, {"startingOffsets": '{"t": {"0": -3}}'}, "startingOffsets", "offset -3 of t-0"),
    (True, {"startingOffsets": '{"t": {"0": "5"}}'}, "startingOffsets", "offset '5' of t-0"),
    (True, {"startingOffsets": '{"t": {"0": true}}'}, "startingOffsets", "offset True"),
    (True, {"startingOffsets": "[]"}, "startingOffsets", "not valid; use earliest"),
    (False, {"startingOffsets": "latest"}, "startingOffsets", "not allowed for a batch"),
    (False, {"startingOffsets": '{"t": {"0": -1}}'}, "startingOffsets",
     "not allowed for a batch"),
    (True, {"startingTimestamp": "-5"}, "startingTimestamp", "whole number >= 0"),
    (True, {"startingTimestamp": "soon"}, "startingTimestamp", "whole number >= 0"),
    (True, {"startingTimestamp": "5", "startingOffsets": "earliest"}, "startingTimestamp",
     "set only one"),
    (True, {"endingOffsets": "latest"}, "endingOffsets", "batch queries .* only"),
    (False, {"endingOffsets": "earliest"}, "endingOffsets", "earliest is not allowed"),
    (False, {"endingOffsets": '{"t": {"0": -2}}'}, "endingOffsets", "offset -2 of t-0"),
    (True, {"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "whole number >= 1"),
    (True, {"maxOffsetsPerTrigger": "1.5"}, "maxOffsetsPerTrigger", "whole number >= 1"),
    (True, {"maxOffsetsPerTrigger": "-1"}, "maxOffsetsPerTrigger", "whole number >= 1"),
    (False, {"maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger", "streaming queries only"),
    (True, {"minPartitions": "0"}, "minPartitions", "whole number >= 1"),
    (True, {"failOnDataLoss": "maybe"}, "failOnDataLoss", "use true or false"),
    (True, {"includeHeaders": "false"}, "includeHeaders", "always returns the headers"),
    (True, {"path": "events"}, "path", "names no Strata topic"),
    (True, {"bootstrap.servers": None}, "bootstrap.servers", "STRATA_BOOTSTRAP"),
    (True, {"bootstrap.servers": "localhost"}, "bootstrap.servers", "not a list of host:port"),
    (True, {"kafka.bootstrap.servers": "h:1"}, "bootstrap.servers", "set only one"),
])
def test_option_errors_name_the_option(streaming: bool, options: dict[str, str | None],
                                       option: str, text: str) -> None:
    merged = {k: v for k, v in {**GOOD, **options}.items() if v is not None}
    with pytest.raises(StrataSparkOptionError, match=f"option {option}: .*{text}") as info:
        parse_source_options(merged, streaming=streaming, environ={})
    assert str(info.value).startswith("[INVALID_SPARK_OPTION] option ")
    assert info.value.code == 1200


def test_options_are_case_insensitive_and_default_sensibly() -> None:
    opts = parse_source_options({"SUBSCRIBE": "b, a,b", "StartingOffsets": "EARLIEST",
                                 "MAXOFFSETSPERTRIGGER": "5", "failondataloss": "FALSE",
                                 "Kafka.Bootstrap.Servers": "h:1, g:2", "includeHeaders": "true",
                                 "path": ""}, streaming=True, environ={})
    assert (opts.bootstrap, opts.subscribe, opts.starting_offsets) == ("h:1,g:2", ("a", "b"),
                                                                       "earliest")
    assert (opts.max_offsets_per_trigger, opts.fail_on_data_loss) == (5, False)
    stream_defaults = parse_source_options({"subscribe": "t"}, streaming=True,
                                           environ={"STRATA_BOOTSTRAP": "e:1"})
    assert (stream_defaults.bootstrap, stream_defaults.starting_offsets,
            stream_defaults.fail_on_data_loss) == ("e:1", "latest", True)
    batch = parse_source_options({"subscribePattern": "t.*", "bootstrap.servers": "h:1"},
                                 streaming=False)
    assert (batch.starting_offsets, batch.ending_offsets) == ("earliest", "latest")
    assert batch.subscribes_to("t1") and not batch.subscribes_to("xt1")
    anything = parse_source_options({"subscribePattern": ".*", "bootstrap.servers": "h:1"},
                                    streaming=True)
    assert anything.subscribes_to("t") and not anything.subscribes_to("__internal")


def test_small_ranges_are_packed_into_few_tasks() -> None:
    from spark_source._planning import RangeGroup, pack_ranges

    ranges = [OffsetRange("t", p, 0, n) for p, n in enumerate([10, 20, 30, 200, 5, 5])]
    packed = pack_ranges(ranges, max_records=60)
    shapes = [[(r.partition, r.end) for r in (g.ranges if isinstance(g, RangeGroup) else [g])]
              for g in packed]
    # Order kept, no range split, a big range alone, groups never above the limit.
    assert shapes == [[(0, 10), (1, 20), (2, 30)], [(3, 200)], [(4, 5), (5, 5)]]
    assert pack_ranges([], max_records=60) == []
