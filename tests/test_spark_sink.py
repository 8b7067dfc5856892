"""The Spark sink (``format("strata")`` writes) with a real SparkSession and real brokers.

Checked: batch and streaming writes store exactly the rows given (keys, values, headers,
partitions, timestamps, topic column); a batch Spark re-runs after a crash between the
sink's commit and Spark's own commit log is not written twice; ``commit`` called twice
is a no-op; aborted batches leave nothing; at-least-once mode writes straight through;
every bad option or column fails at query start with a message naming it.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_source._errors import StrataSparkOptionError
from spark_source._sink import (
    StrataStreamWriter,
    _write_task,
    checkpoint_identity,
    parse_sink_options,
)
from strata.client import Admin, Consumer, ConsumerRecord, NewTopic, TopicPartition
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(300)]


def _create(bootstrap: str, *topics: tuple[str, int]) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=n, replication_factor=1)
                             for name, n in topics])


def _records(bootstrap: str, topic: str, partitions: int, expect: int,
             timeout: float = 30.0) -> list[ConsumerRecord]:
    """Every record of ``topic`` once ``expect`` have arrived (then a short settle)."""
    out: list[ConsumerRecord] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < expect:
            out.extend(consumer.poll(timeout_ms=200))
        out.extend(consumer.poll(timeout_ms=500))  # anything beyond ``expect`` shows up too
    return out


def _schema(ddl: str) -> Any:
    """A StructType from ``"name type, ..."`` without a SparkContext (Spark's own DDL
    parser needs one, and these tests run without the session)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    types = {"string": StringType(), "binary": BinaryType(), "int": IntegerType(),
             "long": LongType(), "array<string>": ArrayType(StringType())}
    return StructType([StructField(name, types[kind]) for name, kind in
                       (part.strip().split(" ", 1) for part in ddl.split(","))])


def _stream_options(bootstrap: str, checkpoint: Path, topic: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "topic": topic,
            "checkpointLocation": str(checkpoint)}


def test_batch_write_stores_every_column(spark: Any, broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, ("sink-batch", 3))
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    rows = [(f"k{i}", f"v{i}".encode(), [("h", f"x{i}".encode())], i % 3 if i % 2 else None,
             when) for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value binary, headers "
                               "array<struct<key:string,value:binary>>, partition int, "
                               "timestamp timestamp")
    df.write.format("strata").option("bootstrap.servers", bootstrap) \
        .option("topic", "sink-batch").mode("append").save()
    got = _records(bootstrap, "sink-batch", 3, 300)
    assert len(got) == 300
    by_value = {r.value: r for r in got}
    assert set(by_value) == {f"v{i}".encode() for i in range(300)}
    from wire.partitioner import partition_for_key
    for i in range(300):
        record = by_value[f"v{i}".encode()]
        assert record.key == f"k{i}".encode()
        assert record.headers == [("h", f"x{i}".encode())]
        assert record.timestamp == int(when.timestamp() * 1000)
        # Explicit partition wins; rows without one follow the key's murmur2 hash.
        expected = i % 3 if i % 2 else partition_for_key(f"k{i}".encode(), 3)
        assert record.partition == expected
    # Per partition, offsets are dense from 0: every record was appended exactly once.
    for p in range(3):
        offsets = sorted(r.offset for r in got if r.partition == p)
        assert offsets == list(range(len(offsets)))


def test_topic_column_routes_rows_and_the_option_overrides_it(
        spark: Any, broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, ("sink-route-a", 1), ("sink-route-b", 1), ("sink-route-c", 1))
    df = spark.createDataFrame([("sink-route-a", "1"), ("sink-route-b", "2"),
                                ("sink-route-a", "3")], "topic string, value string")
    df.write.format("strata").option("bootstrap.servers", bootstrap).mode("append").save()
    assert sorted(r.value for r in _records(bootstrap, "sink-route-a", 1, 2)) == [b"1", b"3"]
    assert [r.value for r in _records(bootstrap, "sink-route-b", 1, 1)] == [b"2"]
    df.write.format("strata").option("bootstrap.servers", bootstrap) \
        .option("topic", "sink-route-c").mode("append").save()
    assert sorted(r.value for r in _records(bootstrap, "sink-route-c", 1, 3)) == \
        [b"1", b"2", b"3"]


def test_a_batch_rerun_after_a_crash_is_not_written_twice(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """The window exactly-once exists for: the sink committed batch N, then the driver
    died before Spark wrote N to its commit log, so Spark runs N again on restart."""
    bootstrap = broker.bootstrap
    _create(bootstrap, ("sink-eo-in", 2), ("sink-eo-out", 2))
    values = [f"r{i}" for i in range(2000)]
    spark.createDataFrame([(f"k{i}", v) for i, v in enumerate(values)],
                          "key string, value string") \
        .write.format("strata").option("bootstrap.servers", bootstrap) \
        .option("topic", "sink-eo-in").mode("append").save()
    checkpoint = tmp_path / "checkpoint"

    def run() -> Any:
        query = (spark.readStream.format("strata").option("bootstrap.servers", bootstrap)
                 .option("subscribe", "sink-eo-in").option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", "500").load()
                 .selectExpr("key", "concat(CAST('T:' AS BINARY), value) AS value")
                 .writeStream.format("strata")
                 .options(**_stream_options(bootstrap, checkpoint, "sink-eo-out"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None
        return query

    run()
    commits = sorted((p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    assert len(commits) >= 4  # maxOffsetsPerTrigger split the input
    # Forget the last batch in Spark's commit log, as a crash would have.
    lost = commits[-1]
    lost.unlink()
    (lost.parent / f".{lost.name}.crc").unlink(missing_ok=True)
    query = run()
    assert lost.exists()  # Spark really ran the forgotten batch again and committed it
    assert query.lastProgress is not None and query.lastProgress["batchId"] == int(lost.name)
    got = _records(bootstrap, "sink-eo-out", 2, len(values))
    assert sorted(r.value for r in got) == sorted(f"T:{v}".encode() for v in values)


def test_commit_twice_and_abort(broker: BrokerProcess) -> None:
    """Spark may call commit(messages, batchId) again; abort leaves nothing visible.

    The writer runs in-process here (the executor side needs no SparkContext)."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    bootstrap = broker.bootstrap
    _create(bootstrap, ("sink-twice", 2))
    schema = StructType([StructField("value", BinaryType())])
    options = parse_sink_options({"bootstrap.servers": bootstrap, "topic": "sink-twice",
                                  "sinkId": "twice"}, schema, streaming=True)
    writer = StrataStreamWriter(options)
    batch = pa.record_batch([pa.array([f"t{i}".encode() for i in range(10)])],
                            names=["value"])
    message = _write_task(options, iter([batch]))
    assert _records(bootstrap, "sink-twice", 2, 1, timeout=1) == []  # staged, invisible
    writer.commit([message], 0)
    writer.commit([message], 0)
    rerun = _write_task(options, iter([batch]))
    writer.commit([rerun], 0)
    assert sorted(r.value for r in _records(bootstrap, "sink-twice", 2, 10)) == \
        sorted(f"t{i}".encode() for i in range(10))
    aborted = _write_task(options, iter([batch]))
    writer.abort([aborted], 1)
    with pytest.raises(Exception, match="STAGED_DATA_MISSING"):
        writer.commit([aborted], 1)
    assert len(_records(bootstrap, "sink-twice", 2, 11, timeout=2)) == 10


def test_at_least_once_writes_straight_through(spark: Any, broker: BrokerProcess,
                                               tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    _create(bootstrap, ("sink-alo", 2))
    query = (spark.readStream.format("rate").option("rowsPerSecond", "200").load()
             .selectExpr("CAST(value AS STRING) AS value")
             .writeStream.format("strata")
             .options(**_stream_options(bootstrap, tmp_path / "ck", "sink-alo"))
             .option("deliveryGuarantee", "at-least-once")
             .trigger(processingTime="500 milliseconds").start())
    try:
        got = _records(bootstrap, "sink-alo", 2, 100, timeout=60)
    finally:
        query.stop()
    assert len(got) >= 100
    values = [int(r.value) for r in got]
    assert len(set(values)) == len(values)


@pytest.mark.parametrize(("options", "columns", "match"), [
    ({"topic": "t", "acks": "all"}, "value string", "option acks: is not a strata sink option"),
    ({}, "value string", "option topic: is not set and the DataFrame has no topic column"),
    ({"topic": "t", "deliveryGuarantee": "maybe"}, "value string",
     "option deliveryGuarantee: 'maybe' is not valid"),
    ({"topic": "t", "compression": "gzip"}, "value string", "option compression"),
    ({"topic": "t", "maxRecordsPerBatch": "0"}, "value string", "maxRecordsPerBatch"),
    ({"topic": "t"}, "value int", "column value has type int"),
    ({"topic": "t"}, "key string", "has no value column"),
    ({"topic": "t"}, "value string, offset long", r"column\(s\) \['offset'\]"),
    ({"topic": "t"}, "value string, headers array<string>", "column headers has type"),
    ({"topic": "t"}, "value string, partition long", "column partition has type bigint"),
])
def test_bad_options_and_columns_are_rejected_before_writing(
        options: dict[str, str], columns: str, match: str) -> None:
    schema = _schema(columns)
    with pytest.raises(StrataSparkOptionError, match=match):
        parse_sink_options({"bootstrap.servers": "127.0.0.1:9", **options}, schema,
                           streaming=False)


def test_streaming_exactly_once_needs_a_stable_sink_id() -> None:
    schema = _schema("value string")
    with pytest.raises(StrataSparkOptionError, match="option checkpointLocation"):
        parse_sink_options({"bootstrap.servers": "127.0.0.1:9", "topic": "t"}, schema,
                           streaming=True)
    parsed = parse_sink_options({"bootstrap.servers": "127.0.0.1:9", "topic": "t",
                                 "checkpointLocation": "rel/ck"}, schema, streaming=True)
    assert parsed.sink_id is not None and parsed.sink_id.endswith("/rel/ck")
    # One checkpoint, one identity, whatever the spelling or the driver's directory.
    assert checkpoint_identity("/data/ck/") == checkpoint_identity("file:/data/ck") \
        == checkpoint_identity("file:///data/ck") == "/data/ck"
    assert checkpoint_identity("hdfs://nn:8020/ck/q1/") == "hdfs://nn:8020/ck/q1"
    assert checkpoint_identity("s3a://bucket/ck") == "s3a://bucket/ck"


def test_spark_reports_sink_errors_at_query_start(spark: Any, broker: BrokerProcess,
                                                  tmp_path: Path) -> None:
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="topic 'sink-no-such-topic' does not exist"):
        df.write.format("strata").option("bootstrap.servers", broker.bootstrap) \
            .option("topic", "sink-no-such-topic").mode("append").save()
    _create(broker.bootstrap, ("sink-overwrite", 1))
    with pytest.raises(Exception, match="overwrite is not supported"):
        df.write.format("strata").option("bootstrap.servers", broker.bootstrap) \
            .option("topic", "sink-overwrite").mode("overwrite").save()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_named_batch_write_runs_at_most_once(spark: Any, broker: BrokerProcess) -> None:
    """With sinkId, a batch write is batch 0 of that sink: running the job again (e.g. a
    retried pipeline step) writes nothing the second time."""
    bootstrap = broker.bootstrap
    _create(bootstrap, ("sink-named", 2))
    df = spark.createDataFrame([(f"n{i}",) for i in range(50)], "value string")
    for _ in range(2):
        df.write.format("strata").option("bootstrap.servers", bootstrap) \
            .option("topic", "sink-named").option("sinkId", "nightly-load-2026-11-22") \
            .mode("append").save()
    assert len(_records(bootstrap, "sink-named", 2, 51, timeout=5)) == 50
