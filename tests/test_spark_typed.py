"""Typed topics through Spark and Delta (issue [2.7] section 3), on a real cluster.

One cluster (one broker, retention checked every 200 ms so tiered segments go quickly)
and one SparkSession for the module. Checked:

* the source: ``value`` is a struct of the subject's fields (batch and streaming reads,
  filters and aggregates on its fields), ``valueFormat=binary``/``json`` give Confluent
  frames / JSON documents, and subscriptions whose topics do not share one subject fail
  at query start;
* the sink: a struct ``value`` writes a typed topic; a DataFrame that does not match the
  subject, a binary value for a typed topic, and rows that break the schema are refused
  with nothing written;
* the tiering job: a typed topic's Delta table holds ``value`` as a struct, grows when
  the subject gets a version that adds a field, refuses any other change, and a replay
  from ``earliest`` (Delta, then the brokers) gives the rows the brokers gave;
* every row of the mapping table (an Avro and a JSON Schema covering all of them):
  producer -> broker -> consumer -> Spark -> Delta -> replay, equal at each step.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.support.cluster import Cluster
from tests.support.waiting import wait_for
from wire.schema import from_avro_bodies, parse_confluent_frame, parse_schema

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(300)]

_names = itertools.count()

ORDER_V1 = json.dumps({
    "type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]})
# v2 adds a field with a default: BACKWARD-compatible, and the table can grow it.
ORDER_V2 = json.dumps({
    "type": "record", "name": "Order", "fields": [
        *json.loads(ORDER_V1)["fields"],
        {"name": "channel", "type": "string", "default": "web"},
    ]})
# v3 changes a type: the registry takes it under NONE, the tier table must not.
ORDER_V3 = json.dumps({
    "type": "record", "name": "Order", "fields": [
        {**f, "type": "string"} if f["name"] == "amount" else f
        for f in json.loads(ORDER_V2)["fields"]]})
OTHER = json.dumps({"type": "record", "name": "Other",
                    "fields": [{"name": "x", "type": "int"}]})

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

ALL_AVRO = json.dumps({
    "type": "record", "name": "All", "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "by", "type": "bytes"},
        {"name": "s", "type": "string"},
        {"name": "rec", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "x", "type": "int"}, {"name": "y", "type": ["null", "string"]}]}},
        {"name": "e", "type": {"type": "enum", "name": "Color",
                               "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": "string"}},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "opt", "type": ["null", "long"], "default": None},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ltm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "ltu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal",
                                 "precision": 12, "scale": 3}},
        {"name": "fdec", "type": {"type": "fixed", "name": "Dec8", "size": 8,
                                  "logicalType": "decimal", "precision": 16, "scale": 2}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        # records inside arrays and maps: NOT NULL fields nested where Delta refuses them
        {"name": "recs", "type": {"type": "array", "items": {
            "type": "record", "name": "Line", "fields": [
                {"name": "sku", "type": "string"}, {"name": "q", "type": "int"}]}}},
        {"name": "mrec", "type": {"type": "map", "values": "Inner"}},
    ]})
ALL_JSON = json.dumps({
    "type": "object",
    "properties": {
        "b": {"type": "boolean"},
        "l": {"type": "integer"},
        "d": {"type": "number"},
        "by": {"type": "string", "contentEncoding": "base64"},
        "s": {"type": "string"},
        "rec": {"type": "object", "properties": {"x": {"type": "integer"},
                                                 "y": {"type": ["string", "null"]}},
                "required": ["x"]},
        "e": {"enum": ["RED", "GREEN", "BLUE"]},
        "arr": {"type": "array", "items": {"type": "integer"}},
        "m": {"type": "object", "additionalProperties": {"type": "string"}},
        "opt": {"type": ["integer", "null"]},
        "day": {"type": "string", "format": "date"},
        "ts": {"type": "string", "format": "date-time"},
        "u": {"type": "string", "format": "uuid"},
    },
    "required": ["b", "l", "d", "by", "s", "rec", "e", "arr", "m", "day", "ts", "u"],
})


def _all_avro(n: int) -> list[dict[str, Any]]:
    return [{
        "b": i % 2 == 0, "i": -i * 1000, "l": 2**40 + i, "f": 1.5 * i, "d": i / 3,
        "by": bytes([i % 256, 0, 255]), "s": f"s{i}-é",
        "rec": {"x": i, "y": None if i % 3 == 0 else f"y{i}"},
        "e": ["RED", "GREEN", "BLUE"][i % 3], "arr": list(range(i % 4)),
        "m": {f"k{j}": f"v{j}" for j in range(i % 3)}, "fx": bytes([i % 256]) * 4,
        "opt": None if i % 2 else i, "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
        "tm": 1000 * i + 7, "tu": 1_000_000 * i + 7,
        "tsm": BASE_MS + i * 1001, "tsu": BASE_MS * 1000 + i * 1_000_001,
        "ltm": BASE_MS + i * 3, "ltu": BASE_MS * 1000 + i * 5,
        "dec": Decimal(i) / 1000 - Decimal("12.5"), "fdec": Decimal(i * 7) / 100,
        "u": str(uuid.UUID(int=i + 1)),
        "recs": [{"sku": f"s{j}", "q": j} for j in range(i % 3)],
        "mrec": {f"k{j}": {"x": j, "y": None if j else "y"} for j in range(i % 2 + 1)},
    } for i in range(n)]


def _all_json(n: int) -> list[dict[str, Any]]:
    return [{
        "b": i % 2 == 1, "l": -(2**50) + i, "d": i * 0.25, "by": bytes([i, 1, 2]),
        "s": f"j{i}", "rec": {"x": i, "y": None if i % 2 else "y"},
        "e": ["BLUE", "RED", "GREEN"][i % 3], "arr": [i, -i], "m": {"a": str(i)},
        "opt": None if i % 3 else i, "day": dt.date(2025, 12, 31) - dt.timedelta(days=i),
        "ts": dt.datetime(2026, 3, 1, 12, 0, i % 60, 123456, tzinfo=dt.UTC),
        "u": str(uuid.UUID(int=2**100 + i)),
    } for i in range(n)]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("typed-spark"), brokers=1,
                 overrides={"log.retention.check.interval.ms": "200"}) as started:
        yield started


@pytest.fixture(scope="module")
def bootstrap(cluster: Cluster) -> str:
    """The shared ``admin`` fixture's address: this module's cluster."""
    return cluster.bootstrap


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from strata_spark import spark_session

    session = spark_session("strata-test_spark_typed", {
        # The catalog in a temp dir, not ./spark-warehouse in the checkout.
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.session.timeZone": "UTC",
    })
    try:
        yield session
    finally:
        session.stop()


def _topic(admin: Admin, prefix: str, schema: str | None, *, schema_type: str = "AVRO",
           partitions: int = 1, tiered: bool = False) -> str:
    name = f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:6]}"
    config = {"value.schema.subject": f"{name}-value"} if schema is not None else {}
    if tiered:
        config.update({"segment.bytes": "2048", "tier.enable": "true", "tier.after.ms": "0",
                       "local.retention.ms": "0"})
    admin.create_topics([NewTopic(name, partitions, 1, config)])
    if schema is not None:
        admin.register_schema(f"{name}-value", schema, schema_type)
    return name


def _produce(bootstrap: str, topic: str, records: list[Any], *, per_batch: int = 10,
             partitions: int = 1) -> None:
    with Producer(bootstrap, linger_ms=1) as producer:
        for n, start in enumerate(range(0, len(records), per_batch)):
            producer.send_batch(topic, records[start:start + per_batch],
                                partition=n % partitions).result(30)


def _orders(start: int, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": i, "customer": f"c{i % 3}", "amount": Decimal(i) / 100,
             "at": BASE_MS + i, "note": None if i % 2 else f"n{i}", **extra}
            for i in range(start, start + n)]


def _read(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
        .option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _spark_values(frame: Any) -> pa.Array:
    """The ``value`` column of ``frame``, by offset then partition, in the Arrow type
    Spark's interchange has (timestamps as us, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_type

    target = to_arrow_type(frame.schema["value"].dataType, timezone="UTC")
    table = frame.select("partition", "offset", "value").toArrow()
    table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
    return table.column("value").combine_chunks().cast(target)


def _expected(records: list[dict[str, Any]], schema: str, schema_type: str,
              frame: Any) -> pa.Array:
    from pyspark.sql.pandas.types import to_arrow_type

    from wire.schema import records_to_arrow

    target = to_arrow_type(frame.schema["value"].dataType, timezone="UTC")
    return records_to_arrow(records, parse_schema(schema, schema_type)).cast(target)


def _consumed(bootstrap: str, topic: str, expect: int, partitions: int = 1,
              **options: Any) -> pa.Table:
    with Consumer(bootstrap, auto_offset_reset="earliest", **options) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        tables: list[pa.Table] = []
        deadline = time.monotonic() + 60
        while sum(t.num_rows for t in tables) < expect and time.monotonic() < deadline:
            polled = consumer.poll_arrow(timeout_ms=500)
            if polled.num_rows:
                tables.append(polled)
        assert sum(t.num_rows for t in tables) == expect
        return pa.concat_tables(tables).sort_by([("partition", "ascending"),
                                                 ("offset", "ascending")])


def _tier(spark: Any, bootstrap: str, admin: Admin, topic: str, warehouse: Path) -> int:
    """One tiering pass; waits until the broker dropped what it tiered. The tiered end."""
    from spark_jobs import TierJob, TierSettings

    with TierJob(spark, TierSettings(bootstrap, warehouse, lease_wait_s=30.0)) as job:
        job.run_once([topic])
    tiered = admin.describe_tier([topic])[topic].partitions[0].tiered_up_to
    assert tiered > 0
    tp = TopicPartition(topic, 0)
    wait_for(f"log start of {topic}", lambda: admin.list_offsets({tp: "earliest"})[tp].offset,
             lambda start: start == tiered)
    return tiered


def _stream(spark: Any, bootstrap: str, topic: str, checkpoint: Path) -> pa.Array:
    frames: list[Any] = []
    query = (spark.readStream.format("strata").option("bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(
                 lambda batch, _: frames.append(batch.select("partition", "offset", "value")
                                                .toArrow()))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    table = pa.concat_tables(frames).sort_by([("partition", "ascending"),
                                              ("offset", "ascending")])
    return table.column("value").combine_chunks()


# --------------------------------------------------------------------------- the source


def test_struct_values_batch_and_stream(spark: Any, cluster: Cluster, admin: Admin,
                                        tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    bootstrap = cluster.bootstrap
    topic = _topic(admin, "orders", ORDER_V1, partitions=2)
    records = _orders(0, 40)
    _produce(bootstrap, topic, records, partitions=2)
    frame = _read(spark, bootstrap, topic)
    value_type = frame.schema["value"].dataType
    assert value_type.simpleString() == (
        "struct<id:bigint,customer:string,amount:decimal(10,2),at:timestamp,note:string>")
    assert frame.schema["key"].dataType.simpleString() == "binary"
    assert frame.schema["value"].metadata["strata.value.version"] == 1
    rows = {r["value"]["id"]: r["value"] for r in frame.collect()}
    assert sorted(rows) == list(range(40))
    assert rows[3]["amount"] == Decimal("0.03") and rows[4]["note"] == "n4"
    assert rows[5]["at"] == dt.datetime.fromtimestamp((BASE_MS + 5) / 1000, dt.UTC) \
        .replace(tzinfo=None)  # Spark hands timestamps back in the session zone (UTC)
    # Filters and aggregates on the struct's fields.
    totals = {r["customer"]: (r["n"], r["total"]) for r in frame
              .where(F.col("value.amount") > Decimal("0.05"))
              .groupBy(F.col("value.customer").alias("customer"))
              .agg(F.count("*").alias("n"), F.sum("value.amount").alias("total")).collect()}
    for customer in ("c0", "c1", "c2"):
        chosen = [o for o in records if o["customer"] == customer and o["amount"] > Decimal("0.05")]
        assert totals[customer] == (len(chosen), sum(o["amount"] for o in chosen))
    assert frame.where("value.note IS NULL").count() == 20
    # A stream, caught up once (Trigger.AvailableNow), reads the same values.
    streamed = _stream(spark, bootstrap, topic, tmp_path / "cp")
    assert streamed.cast(_spark_values(frame).type).equals(_spark_values(frame))


def test_binary_and_json_value_formats(spark: Any, cluster: Cluster, admin: Admin) -> None:
    bootstrap = cluster.bootstrap
    topic = _topic(admin, "framed", ORDER_V1)
    _produce(bootstrap, topic, _orders(0, 12))
    schema_id = admin.get_schema(f"{topic}-value").schema_id
    framed = _read(spark, bootstrap, topic, valueFormat="binary")
    assert framed.schema["value"].dataType.simpleString() == "binary"
    frames = [r["value"] for r in framed.orderBy("offset").collect()]
    parsed = [parse_confluent_frame(bytes(f)) for f in frames]
    assert {i for i, _ in parsed} == {schema_id}
    decoded = from_avro_bodies([body for _, body in parsed], parse_schema(ORDER_V1))
    assert [v["id"] for v in decoded.to_pylist()] == list(range(12))
    as_json = _read(spark, bootstrap, topic, valueFormat="json").orderBy("offset").collect()
    assert json.loads(bytes(as_json[3]["value"]))["customer"] == "c0"


def test_subscriptions_that_cannot_have_one_struct_fail_at_start(
        spark: Any, cluster: Cluster, admin: Admin) -> None:
    from spark_source import StrataSparkOptionError

    bootstrap = cluster.bootstrap
    first = _topic(admin, "mix", ORDER_V1)
    other = _topic(admin, "mix", OTHER)
    raw = _topic(admin, "mix", None)
    _produce(bootstrap, first, _orders(0, 3))
    with pytest.raises(Exception, match=r"INVALID_SPARK_OPTION\].*different value subjects"):
        _read(spark, bootstrap, f"{first},{other}").collect()
    with pytest.raises(Exception, match=r"INVALID_SPARK_OPTION\].*mixes typed topics"):
        _read(spark, bootstrap, f"{first},{raw}").collect()
    with pytest.raises(StrataSparkOptionError, match="valueFormat"):
        from spark_source._options import parse_source_options

        parse_source_options({"subscribe": first, "bootstrap.servers": bootstrap,
                              "valueFormat": "avro"}, streaming=False)
    # As bytes, any mix reads.
    assert _read(spark, bootstrap, f"{first},{raw}", valueFormat="binary").count() == 3
    # Bytes topics keep the Kafka schema.
    _produce_bytes(bootstrap, raw)
    from pyspark.sql.types import StructType

    from spark_source import SCHEMA_DDL

    assert _read(spark, bootstrap, raw).schema == StructType.fromDDL(SCHEMA_DDL)


def _produce_bytes(bootstrap: str, topic: str) -> None:
    with Producer(bootstrap) as producer:
        producer.send(topic, b"raw", partition=0)
        producer.flush(30)


# --------------------------------------------------------------------------- the sink


def test_sink_writes_typed_topics_and_refuses_mismatches(spark: Any, cluster: Cluster,
                                                          admin: Admin) -> None:
    from pyspark.sql import functions as F

    bootstrap = cluster.bootstrap
    topic = _topic(admin, "sunk", ORDER_V1)
    source = spark.createDataFrame(
        [(i, f"c{i}", Decimal(i) / 100, dt.datetime(2026, 1, 1, 0, 0, i, tzinfo=dt.UTC),
          None if i % 2 else f"n{i}") for i in range(10)],
        "id bigint, customer string, amount decimal(10,2), at timestamp, note string")
    typed = source.select(F.struct(*source.columns).alias("value"),
                          F.col("customer").alias("key"))
    target = {"bootstrap.servers": bootstrap, "topic": topic}
    typed.write.mode("append").format("strata").options(**target).save()
    got = _consumed(bootstrap, topic, 10)
    values = sorted(got.column("value").to_pylist(), key=lambda v: v["id"])
    assert [v["customer"] for v in values] == [f"c{i}" for i in range(10)]
    assert values[3]["amount"] == Decimal("0.03") and values[2]["note"] == "n2"
    assert values[4]["at"] == dt.datetime(2026, 1, 1, 0, 0, 4, tzinfo=dt.UTC)
    tp = TopicPartition(topic, 0)

    def end() -> int:
        return admin.list_offsets({tp: "latest"})[tp].offset

    # A field of the wrong type: refused when the query starts, naming the field.
    wrong = source.withColumn("customer", F.col("id"))
    with pytest.raises(Exception, match=r"SCHEMA_MISMATCH\].*customer"):
        wrong.select(F.struct(*wrong.columns).alias("value")).write.mode("append") \
            .format("strata").options(**target).save()
    # A field the schema lacks.
    extra = source.withColumn("rogue", F.lit(1))
    with pytest.raises(Exception, match=r"rogue"):
        extra.select(F.struct(*extra.columns).alias("value")).write.mode("append") \
            .format("strata").options(**target).save()
    # Bytes to a typed topic.
    with pytest.raises(Exception, match=r"SCHEMA_MISMATCH\].*is typed"):
        source.selectExpr("CAST(customer AS BINARY) AS value").write.mode("append") \
            .format("strata").options(**target).save()
    # A null in a required field: the task fails, the batch is aborted.
    nulls = source.withColumn("customer", F.when(F.col("id") == 7, None)
                              .otherwise(F.col("customer")))
    with pytest.raises(Exception, match=r"customer"):
        nulls.select(F.struct(*nulls.columns).alias("value")).write.mode("append") \
            .format("strata").options(**target).save()
    assert end() == 11  # the 10 records and their commit marker; nothing refused


# --------------------------------------------------------------------------- tiering


def test_tiered_typed_topic_evolves_and_replays(spark: Any, cluster: Cluster, admin: Admin,
                                                tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from spark_jobs import TierTableMismatchError

    bootstrap = cluster.bootstrap
    warehouse = tmp_path / "warehouse"
    topic = _topic(admin, "evolving", ORDER_V1, tiered=True)
    first = _orders(0, 40)
    _produce(bootstrap, topic, first, per_batch=5)
    under_v1 = _tier(spark, bootstrap, admin, topic, warehouse)
    table = warehouse / "topics" / topic
    delta = spark.read.format("delta").load(str(table))
    assert delta.schema["value"].dataType.simpleString().startswith(
        "struct<id:bigint,customer:string,amount:decimal(10,2),at:timestamp")

    admin.register_schema(f"{topic}-value", ORDER_V2)
    second = _orders(40, 40, channel="app")
    _produce(bootstrap, topic, second, per_batch=5)
    tiered = _tier(spark, bootstrap, admin, topic, warehouse)
    assert 40 < tiered < 80  # Delta holds some of v2's rows, the broker the rest
    props = DeltaTable(str(table)).metadata().configuration
    assert props["strata.valueSchemaVersion"] == "2"
    delta = spark.read.format("delta").load(str(table))
    assert "channel" in delta.schema["value"].dataType.fieldNames()
    # Rows tiered before the change have no channel in Delta (null to Spark); v1 rows
    # tiered after it were read under v2, so they have its default ...
    assert delta.where("value.channel IS NULL").count() == under_v1
    assert delta.where(f"value.id >= {under_v1} AND value.id < 40 AND "
                       "value.channel = 'web'").count() == 40 - under_v1
    # ... and the schema's default through the source, exactly as the brokers give them.
    replay = _read(spark, bootstrap, topic, startingOffsets="earliest")
    assert replay.schema["value"].dataType.fieldNames()[-1] == "channel"
    want = _expected([{**o, "channel": "web"} for o in first] + second, ORDER_V2, "AVRO",
                     replay)
    assert _spark_values(replay).equals(want)
    assert _stream(spark, bootstrap, topic, tmp_path / "cp").cast(want.type).equals(want)
    # valueSchemaVersion pins the columns (a restarted stream keeps its schema): v1 has
    # no channel, from Delta and from the brokers alike.
    pinned = _read(spark, bootstrap, topic, startingOffsets="earliest", valueSchemaVersion="1")
    assert "channel" not in pinned.schema["value"].dataType.fieldNames()
    assert pinned.count() == 80 and pinned.where("value.id = 50").count() == 1
    with pytest.raises(Exception, match="valueSchemaVersion"):
        _read(spark, bootstrap, topic, valueSchemaVersion="0")  # refused at load()

    # A change the table cannot follow stops the pass: nothing is written.
    admin.set_compatibility("NONE", f"{topic}-value")
    admin.register_schema(f"{topic}-value", ORDER_V3)
    _produce(bootstrap, topic, [{**o, "amount": "x", "channel": "app"}
                                for o in _orders(80, 20)], per_batch=5)
    before = DeltaTable(str(table)).version()
    from spark_jobs import TierJob, TierSettings

    with TierJob(spark, TierSettings(bootstrap, warehouse, lease_wait_s=30.0)) as job, \
            pytest.raises(TierTableMismatchError, match=r"changes field value\.amount"):
        job.run_once([topic])
    assert DeltaTable(str(table)).version() == before


def test_compacted_typed_topic_keeps_typed_latest_per_key(spark: Any, cluster: Cluster,
                                                         admin: Admin, tmp_path: Path) -> None:
    """A typed topic with cleanup.policy=compact: its compacted table holds the latest
    typed value per key, and grows the fields of a new version as the tier table does."""
    from spark_jobs import TierJob, TierSettings, compacted_path

    bootstrap = cluster.bootstrap
    warehouse = tmp_path / "warehouse"
    name = f"compacted-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(name, 1, 1, {
        "value.schema.subject": f"{name}-value", "cleanup.policy": "compact",
        "segment.bytes": "2048", "tier.enable": "true", "tier.after.ms": "0"})])
    admin.register_schema(f"{name}-value", ORDER_V1)

    def send(records: list[dict[str, Any]]) -> None:
        with Producer(bootstrap, linger_ms=1) as producer:
            for record in records:
                producer.send(name, record, key=f"k{record['id'] % 5}".encode(), partition=0)

    def tier() -> Any:
        with TierJob(spark, TierSettings(bootstrap, warehouse, lease_wait_s=30.0)) as job:
            job.run_once([name])
        return spark.read.format("delta").load(str(compacted_path(warehouse.resolve(), name)))

    send(_orders(0, 40))
    compacted = tier()
    assert "channel" not in compacted.schema["value"].dataType.fieldNames()
    rows = {r["key"]: r["value"]["id"] for r in compacted.select("key", "value").collect()}
    tiered = admin.describe_tier([name])[name].partitions[0].tiered_up_to
    # The latest of each key among the tiered offsets (records 0..tiered-1, one per id).
    want = {f"k{i % 5}".encode(): i for i in range(tiered)}
    assert rows == want
    admin.register_schema(f"{name}-value", ORDER_V2)
    send(_orders(40, 40, channel="app"))
    compacted = tier()
    assert compacted.schema["value"].dataType.fieldNames()[-1] == "channel"
    tiered = admin.describe_tier([name])[name].partitions[0].tiered_up_to
    latest = {r["key"]: (r["value"]["id"], r["value"]["channel"])
              for r in compacted.select("key", "value").collect()}
    assert {k: i for k, (i, _) in latest.items()} == {
        f"k{i % 5}".encode(): i for i in range(tiered)}
    assert all(channel == "app" for i, channel in latest.values() if i >= 40)


# --------------------------------------------------------------------------- every type


@pytest.mark.parametrize(("schema", "schema_type", "make"), [
    (ALL_AVRO, "AVRO", _all_avro), (ALL_JSON, "JSON", _all_json)], ids=["avro", "json"])
def test_every_mapped_type_round_trips(spark: Any, cluster: Cluster, admin: Admin,
                                       tmp_path: Path, schema: str, schema_type: str,
                                       make: Any) -> None:
    from strata.client.consumer import records_from_table
    from wire.schema import records_to_arrow

    bootstrap = cluster.bootstrap
    parsed = parse_schema(schema, schema_type)
    topic = _topic(admin, f"all-{schema_type.lower()}", schema, schema_type=schema_type,
                   tiered=True)
    records = make(30)
    produced = records_to_arrow(records, parsed)
    _produce(bootstrap, topic, records, per_batch=5)
    # Consumer: the schema's own Arrow type, values as produced.
    polled = _consumed(bootstrap, topic, 30)
    consumed = polled.column("value").combine_chunks()
    assert consumed.type == parsed.arrow_type
    assert consumed.equals(produced)
    # Per record (what poll() hands out): dicts, maps included, as they were sent.
    values = [r.value for r in records_from_table(polled)]
    assert values == produced.to_pylist(maps_as_pydicts="strict")
    assert [v["m"] for v in values] == [r["m"] for r in records]
    # Spark, from the brokers.
    frame = _read(spark, bootstrap, topic)
    want = _expected(records, schema, schema_type, frame)
    assert _spark_values(frame).equals(want)
    # Delta, written by the tiering job, read by Spark.
    warehouse = tmp_path / "warehouse"
    tiered = _tier(spark, bootstrap, admin, topic, warehouse)
    delta = spark.read.format("delta").load(str(warehouse / "topics" / topic))
    delta_values = _spark_values(delta.select("partition", "offset", "value"))
    assert delta_values.equals(want.slice(0, tiered).cast(delta_values.type))
    # Replay: Delta below the log start, then the brokers.
    replay = _read(spark, bootstrap, topic, startingOffsets="earliest")
    assert _spark_values(replay).equals(want)
