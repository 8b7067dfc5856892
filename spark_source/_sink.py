"""The Spark sink: ``df.write.format("strata")`` and ``df.writeStream.format("strata")``.

Exactly once (the default, ``deliveryGuarantee=exactly-once``): every Spark task stages
its rows on the partition leaders under a fresh staging id (``StagingWriter``); no
consumer sees staged records. When every task of the micro-batch has succeeded, Spark
calls ``commit(messages, batchId)`` on the driver, which commits the whole batch as ONE
transaction across every partition it writes (``TransactionalSinkCommitter``): the
transactional id is ``strata-sink:<sink id>``, two-phase (never aborted by its timeout;
a restarted driver gets an open one back), AddPartitionsToTxn tags the transaction with
the batch id, each leader appends exactly the staged files the tasks reported inside it
(``CommitStaged`` version 1), the tag is marked prepared, and EndTxn commits. So a
read_committed reader sees a micro-batch all at once or not at all. The coordinator's
last transaction tells a re-run batch (Spark re-runs the last batch after a crash) from
a new one: a batch id already committed appends nothing. A driver that died before
EndTxn left the transaction open: the restarted query's commit of that batch resumes it
(partitions that hold the batch already answer ``duplicate``) and commits it; an open
transaction of another batch is committed if prepared and aborted if not. Failed
batches are aborted (staged files deleted); staged files nobody commits expire on the
broker. docs/spark.md has every failure case.

``STRATA_SPARK_SINK_TEST_HOLD_AFTER_PREPARE=1`` in the environment of the process that
starts a query (``TEST_HOLD_ENV``) is a test hook: the driver's commit stops for good
after phase one, so a test can SIGKILL it between prepare and EndTxn.

The sink's identity (``sinkId``) must be the same every time the query restarts from
its checkpoint: by default it is the ``checkpointLocation`` option's absolute path.

At least once (``deliveryGuarantee=at-least-once``): tasks produce straight to the
topic (acks=all); records are visible as soon as each task writes them, and a task
retried by Spark writes its rows again.

Rows to records, columnar throughout (no per-row Python unless keys must be hashed):
``value`` (binary or string, required), ``key`` (binary or string), ``topic`` (string;
else the ``topic`` option), ``partition`` (int; else Kafka's murmur2 of the key, and
rows without a key go to ``(task partition id + chunk number) mod partitions``, which
is the same on a re-run of the same plan), ``headers``
(``array<struct<key:string,value:binary>>``), ``timestamp`` (timestamp; else the write
time). docs/spark.md has the full option table and the failure cases.

Typed topics (docs/typed-topics.md): a ``value`` column that is a struct writes a typed
topic. When the query starts, the ``topic`` option's topic must be typed, and the
struct's fields must convert to its value subject's latest version (names, and types
``wire.schema.table_to_arrow`` converts without loss: microsecond to millisecond
timestamps, binary to fixed, ...); that version is pinned for every task. Each task
converts its rows with ``table_to_arrow`` (a null in a required field, a value that does
not fit, fail the task: the exactly-once sink then aborts the batch, so nothing is
committed) and builds typed batches (``build_batch(values, value_schema_id=...)``). A
binary or string ``value`` for a typed topic, or a struct for a bytes topic, fails at
query start. With a ``topic`` column instead of the option, each task looks the topics'
subjects up itself.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
    TimestampType,
)

from spark_source._errors import StrataSparkOptionError
from spark_source._options import SECURITY_OPTION_NAMES, _bootstrap, security_of
from wire.errors import SchemaMismatchError
from wire.security import PLAINTEXT, ClientSecurity

__all__ = ["TEST_HOLD_ENV", "SinkOptions", "StrataCommitMessage", "batch_writer",
           "checkpoint_identity", "parse_sink_options", "stream_writer"]

log = logging.getLogger("strata.spark_source.sink")

EXACTLY_ONCE: Final = "exactly-once"
AT_LEAST_ONCE: Final = "at-least-once"

#: Options the sink accepts (lower-case) -> spelling in messages and docs.
SINK_OPTION_NAMES: Final[dict[str, str]] = {
    n.lower(): n for n in ("bootstrap.servers", "kafka.bootstrap.servers", "topic",
                           "checkpointLocation", "sinkId", "deliveryGuarantee",
                           "compression", "maxRecordsPerBatch", "path")
}
SINK_OPTION_NAMES.update(SECURITY_OPTION_NAMES)
_COLUMNS: Final = ("key", "value", "topic", "partition", "headers", "timestamp")
#: Encoded chunks stay below this (the broker's default max.message.bytes is 1 MiB).
_TARGET_CHUNK_BYTES: Final = 768 * 1024
_MAX_BATCH_ID: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    sink_id: str | None
    delivery: str
    compression: str
    max_records_per_batch: int
    columns: tuple[str, ...]
    security: ClientSecurity = PLAINTEXT
    #: The DataFrame's value is a struct (for typed topics).
    struct_value: bool = False
    #: Typed targets pinned at query start: topic -> (schema id, schema text, type).
    value_schemas: tuple[tuple[str, int, str, str], ...] = ()


def parse_sink_options(options: Mapping[str, str], schema: StructType, *, streaming: bool,
                       env: Mapping[str, str] | None = None) -> SinkOptions:
    """Validate options and the DataFrame's columns; raise ``StrataSparkOptionError``."""
    opts = {k.lower(): v for k, v in options.items()}
    for key in sorted(opts):
        if key not in SINK_OPTION_NAMES:
            known = ", ".join(sorted(SINK_OPTION_NAMES.values()))
            raise StrataSparkOptionError(
                key, f"is not a strata sink option; remove it or fix its spelling (options: "
                f"{known})")
    bootstrap = _bootstrap(opts, os.environ if env is None else env)
    columns = _check_columns(schema)
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise StrataSparkOptionError("topic", "is empty; name the topic to write to")
    if topic is None and "topic" not in columns:
        raise StrataSparkOptionError(
            "topic", "is not set and the DataFrame has no topic column; set "
            "option('topic', 'name') or add a string column named topic")
    delivery = opts.get("deliveryguarantee", EXACTLY_ONCE).strip().lower()
    if delivery not in (EXACTLY_ONCE, AT_LEAST_ONCE):
        raise StrataSparkOptionError(
            "deliveryGuarantee", f"{opts['deliveryguarantee']!r} is not valid; use "
            f"{EXACTLY_ONCE} (default) or {AT_LEAST_ONCE}")
    compression = opts.get("compression", "none").strip().lower()
    if compression not in ("none", "lz4", "zstd"):
        raise StrataSparkOptionError(
            "compression", f"{opts['compression']!r} is not valid; use none, lz4 or zstd")
    raw_max = opts.get("maxrecordsperbatch", "65536").strip()
    if not raw_max.isdigit() or not 1 <= int(raw_max) <= 1 << 20:
        raise StrataSparkOptionError(
            "maxRecordsPerBatch", f"{raw_max!r} is not valid; use a whole number 1..1048576")
    sink_id = opts.get("sinkid")
    if sink_id is not None and not sink_id.strip():
        raise StrataSparkOptionError("sinkId", "is empty; give a stable name for this sink")
    if sink_id is None and opts.get("checkpointlocation"):
        sink_id = "checkpoint:" + checkpoint_identity(opts["checkpointlocation"])
    if streaming and delivery == EXACTLY_ONCE and sink_id is None:
        raise StrataSparkOptionError(
            "checkpointLocation", "is needed by the exactly-once sink to recognise a "
            "re-run batch after a restart; set .option('checkpointLocation', path) on "
            "writeStream (or option sinkId to a name that stays the same across restarts)")
    struct_value = any(f.name.lower() == "value" and isinstance(f.dataType, StructType)
                       for f in schema.fields)
    return SinkOptions(bootstrap, topic.strip() if topic else None, sink_id, delivery,
                       compression, int(raw_max), columns, security_of(opts), struct_value)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(.*)$")


def checkpoint_identity(location: str) -> str:
    """The checkpoint location as the sink's identity: equal for equal checkpoints.

    A local path becomes absolute and normalised (``file:/x``, ``file:///x`` and ``/x``
    are one checkpoint); a URI of another file system (``hdfs://nn/ck``, ``s3a://b/ck``)
    is kept as given, minus a trailing ``/``, since resolving it against the driver's
    working directory would change it whenever the driver starts elsewhere.
    """
    text = location.strip()
    match = _SCHEME.match(text)
    if match is None:
        return os.path.normpath(os.path.abspath(text))
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        return os.path.normpath("/" + rest.lstrip("/"))
    return f"{scheme}:{rest.rstrip('/') or '/'}"


def _check_columns(schema: StructType) -> tuple[str, ...]:
    names = [f.name.lower() for f in schema.fields]
    unknown = [f.name for f in schema.fields if f.name.lower() not in _COLUMNS]
    if unknown:
        raise StrataSparkOptionError(
            "columns", f"the DataFrame has column(s) {unknown} the strata sink does not "
            f"write; select only {', '.join(_COLUMNS)} (value is required)")
    if "value" not in names:
        raise StrataSparkOptionError(
            "columns", "the DataFrame has no value column; select or alias one "
            "(binary or string), e.g. selectExpr('CAST(x AS STRING) AS value')")
    expected: dict[str, tuple[str, tuple[type[DataType], ...]]] = {
        "key": ("binary or string", (BinaryType, StringType)),
        "value": ("binary or string (or a struct, for a typed topic)",
                  (BinaryType, StringType, StructType)),
        "topic": ("string", (StringType,)),
        "partition": ("int", (IntegerType,)),
        "timestamp": ("timestamp", (TimestampType,)),
    }
    for f in schema.fields:
        name = f.name.lower()
        if name == "headers":
            if not _is_headers_type(f.dataType):
                raise StrataSparkOptionError(
                    "columns", f"column headers has type {f.dataType.simpleString()}; it "
                    "must be array<struct<key:string,value:binary>>")
            continue
        label, types = expected[name]
        if not isinstance(f.dataType, types):
            raise StrataSparkOptionError(
                "columns", f"column {f.name} has type {f.dataType.simpleString()}; it must "
                f"be {label} (cast it)")
    return tuple(names)


def _is_headers_type(t: DataType) -> bool:
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    fields = t.elementType.fields
    return [f.name for f in fields] == ["key", "value"] and \
        isinstance(fields[0].dataType, StringType) and isinstance(fields[1].dataType, BinaryType)


# ----------------------------------------------------------------------------- tasks


@dataclass
class StrataCommitMessage(WriterCommitMessage):
    """What one task staged: ``(topic, partition) -> (staging id, chunks, records)``."""

    staged: dict[tuple[str, int], tuple[str, int, int]] = field(default_factory=dict)
    records: int = 0


def _write_task(options: SinkOptions, batches: Iterator[Any]) -> StrataCommitMessage:
    """Executor side: turn Arrow batches into record batches and stage (or produce) them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext

    from strata.client.sink import StagingWriter
    from wire.record_batch import build_batch

    context = TaskContext.get()
    task_partition = context.partitionId() if context is not None else 0
    typed = _TypedTargets(options)
    writer = StagingWriter(options.bootstrap, security=options.security,
                           direct=options.delivery == AT_LEAST_ONCE,
                           client_id="strata-spark-sink")
    counts: dict[str, int] = {}
    chunk_number = 0
    total = 0

    def partitions_of(topic: str) -> int:
        if topic not in counts:
            counts[topic] = writer.partition_count(topic)
        return counts[topic]

    def send(topic: str, partition: int, rows: Any) -> None:
        """Encode ``rows`` (a pa.Table/RecordBatch slice) for one partition, in chunks."""
        nonlocal chunk_number
        n = rows.num_rows
        if n == 0:
            return
        per_row = max(1, rows.nbytes // n)
        step = max(1, min(options.max_records_per_batch, _TARGET_CHUNK_BYTES // per_row))
        schema_id = None
        if options.struct_value:
            schema_id, converted = typed.convert(topic, rows.column("value"))
            rows = rows.set_column(rows.column_names.index("value"), "value", converted)
        for start in range(0, n, step):
            piece = rows.slice(start, step)
            value = piece.column("value")
            key = piece.column("key") if "key" in piece.column_names else None
            headers = piece.column("headers") if "headers" in piece.column_names else None
            timestamps = None
            if "timestamp" in piece.column_names:
                ts = piece.column("timestamp")
                if ts.null_count:
                    ts = pc.fill_null(ts, pa.scalar(time.time_ns() // 1000, ts.type))
                timestamps = pc.divide(ts.cast(pa.int64()), pa.scalar(1000, pa.int64()))
            batch = build_batch(value, keys=key, timestamps=timestamps, headers=headers,
                                compression=options.compression, value_schema_id=schema_id)
            writer.stage(topic, partition, batch)
            chunk_number += 1

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            total += batch.num_rows
            table = pa.Table.from_batches([batch])
            table = table.rename_columns([c.lower() for c in table.column_names])
            if table.column("value").null_count:
                raise StrataSparkOptionError(
                    "columns", "column value has nulls; a record needs a value (filter them "
                    "out or coalesce them)")
            for name in ("key", "value"):
                if name in table.column_names and pa.types.is_string(table.column(name).type):
                    i = table.column_names.index(name)
                    table = table.set_column(i, name, table.column(name).cast(pa.binary()))
            for topic, rows in _split_by_topic(table, options.topic):
                n_partitions = partitions_of(topic)
                for partition, part_rows in _split_by_partition(
                        rows, n_partitions, task_partition + chunk_number):
                    if not 0 <= partition < n_partitions:
                        raise StrataSparkOptionError(
                            "columns", f"partition {partition} does not exist in topic "
                            f"{topic!r} (partitions 0..{n_partitions - 1})")
                    send(topic, partition, part_rows)
        writer.flush()
        staged = {(tp.topic, tp.partition): (p.staging_id, p.chunks, p.records)
                  for tp, p in writer.parts().items()}
        return StrataCommitMessage(staged, total)
    except BaseException:
        if not writer.direct:
            writer.abort()
        raise
    finally:
        writer.close()
        typed.close()


class _TypedTargets:
    """In a task: the value schema of each typed topic written (pinned on the driver for
    the ``topic`` option; asked of the registry once per task for a ``topic`` column),
    and the conversion of a struct column to it."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self._schemas: dict[str, tuple[int, Any]] = {}
        self._admin: Any = None
        for topic, schema_id, text, kind in options.value_schemas:
            from wire.schema import parse_schema

            self._schemas[topic] = (schema_id, parse_schema(text, kind))

    def convert(self, topic: str, values: Any) -> tuple[int, Any]:
        from wire.errors import SchemaMismatchError
        from wire.schema import table_to_arrow

        if topic not in self._schemas:
            if self._admin is None:
                from strata.client import Admin

                self._admin = Admin(self.options.bootstrap, client_id="strata-spark-sink",
                                    security=self.options.security)
            self._schemas[topic] = _value_schema(self._admin, topic)
        schema_id, schema = self._schemas[topic]
        try:
            return schema_id, table_to_arrow(values.combine_chunks(), schema)
        except SchemaMismatchError as err:
            raise StrataSparkOptionError(
                "columns", f"column value does not fit the value schema of topic {topic!r} "
                f"(schema id {schema_id}): {err.message}; fix the rows or the DataFrame's "
                "types (nothing of this batch is committed)") from None

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()


def _value_schema(admin: Any, topic: str) -> tuple[int, Any]:
    """(schema id, parsed schema) of ``topic``'s value subject's latest version; a
    ``StrataSparkOptionError`` when the topic is not typed (a struct has nowhere to go)."""
    from wire.schema import parse_schema

    subject = _subject(admin, topic)
    if subject is None:
        raise StrataSparkOptionError(
            "columns", f"column value is a struct, but topic {topic!r} is not typed (it has "
            "no value.schema.subject); write binary or string values to it, or create a "
            f"typed topic (strata topic create {topic} --typed)")
    registered = admin.get_schema(subject)
    return registered.schema_id, parse_schema(registered.schema, registered.schema_type)


def _subject(admin: Any, topic: str) -> str | None:
    # From the metadata: a writer needs WRITE (which implies DESCRIBE), not
    # DESCRIBE_CONFIGS.
    subject: str | None = admin.value_subjects([topic])[topic]
    return subject


def _split_by_topic(table: Any, default_topic: str | None) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    # As in Spark's Kafka sink, the topic option overrides the topic column.
    if default_topic is not None or "topic" not in table.column_names:
        assert default_topic is not None
        if "topic" in table.column_names:
            table = table.drop_columns(["topic"])
        yield default_topic, table
        return
    topics = table.column("topic")
    if topics.null_count:
        raise StrataSparkOptionError(
            "topic", "some rows have a null topic and no topic option is set; set "
            "option('topic', ...) or fill the column")
    rest = table.drop_columns(["topic"])
    for name in pc.unique(topics).to_pylist():
        yield str(name), rest.filter(pc.equal(topics, pa.scalar(name)))


def _split_by_partition(table: Any, n_partitions: int, rotation: int
                        ) -> Iterator[tuple[int, Any]]:
    """Rows per target partition. Explicit ``partition`` wins, then murmur2 of the key;
    rows with neither go to one partition per call (``rotation mod n``), in order."""
    from wire.partitioner import key_partitions, split_by_partition

    explicit = table.column("partition") if "partition" in table.column_names else None
    if explicit is not None:
        table = table.drop_columns(["partition"])
    keys = table.column("key") if "key" in table.column_names else None
    if (explicit is None or explicit.null_count == len(explicit)) and \
            (keys is None or keys.null_count == len(keys)):
        yield rotation % n_partitions, table
        return
    fallback = rotation % n_partitions
    if explicit is not None and explicit.null_count == 0:
        targets = explicit.to_pylist()  # no key needs hashing
    else:
        targets = key_partitions(keys, n_partitions, fallback) if keys is not None \
            else [fallback] * table.num_rows
        if explicit is not None:
            targets = [t if p is None else p
                       for p, t in zip(explicit.to_pylist(), targets, strict=True)]
    yield from split_by_partition(table, targets)


# ----------------------------------------------------------------------------- driver


def _merge(messages: list[WriterCommitMessage | None]) -> dict[Any, list[Any]]:
    from strata.client import TopicPartition
    from strata.client.sink import StagedPart

    parts: dict[Any, list[Any]] = {}
    for message in messages:
        if not isinstance(message, StrataCommitMessage):
            continue
        for (topic, partition), (staging_id, chunks, records) in message.staged.items():
            parts.setdefault(TopicPartition(topic, partition), []).append(
                StagedPart(staging_id, chunks, records))
    return parts


def _commit(options: SinkOptions, sink_id: str, batch_id: int,
            messages: list[WriterCommitMessage | None]) -> None:
    """The driver's commit of one batch: one transaction across every partition it
    writes (``TransactionalSinkCommitter``; docs/spark.md, "Exactly once")."""
    from strata.client.sink import TransactionalSinkCommitter

    if options.delivery == AT_LEAST_ONCE:
        return  # the tasks' produce requests were the writes
    if not 0 <= batch_id <= _MAX_BATCH_ID:
        raise StrataSparkOptionError(
            "checkpointLocation", f"batch id {batch_id} is above {_MAX_BATCH_ID}, the "
            "largest the exactly-once sink records; start the query from a new checkpoint "
            "with a new sinkId")
    parts = _merge(messages)
    # With no parts there is nothing to append, but a transaction of this batch an
    # earlier driver left open must still be ended (else it would hold back every
    # read_committed reader of its partitions).
    with TransactionalSinkCommitter(options.bootstrap, sink_id, security=options.security,
                                    client_id="strata-spark-sink-committer",
                                    on_prepared=_test_hold()) as committer:
        result = committer.commit_batch(batch_id, parts)
    if result.outcome == "already-committed":
        log.info("sink %s batch %d was already committed; nothing appended", sink_id,
                 batch_id)
    replays = sorted(str(tp) for tp, r in result.results.items() if r.duplicate)
    if replays:
        log.info("sink %s batch %d: the resumed transaction already held it in %s",
                 sink_id, batch_id, ", ".join(replays))


#: Test hook (tests/test_spark_sink_txn.py): set in the environment of the process that
#: starts the query, it makes the driver's commit stop for good right after phase one
#: (every partition's commit is in the transaction, tagged prepared) and before EndTxn,
#: so a test can SIGKILL the driver there. Never set it in production.
TEST_HOLD_ENV: Final = "STRATA_SPARK_SINK_TEST_HOLD_AFTER_PREPARE"


def _test_hold() -> Any:
    if os.environ.get(TEST_HOLD_ENV) != "1":
        return None

    def hold(batch_id: int) -> None:
        log.warning("%s is set: holding batch %d's prepared transaction open", TEST_HOLD_ENV,
                    batch_id)
        time.sleep(3600)

    return hold


def _abort(options: SinkOptions, messages: list[WriterCommitMessage | None]) -> None:
    from strata.client.sink import SinkCommitter

    if options.delivery == AT_LEAST_ONCE:
        return
    parts = _merge(messages)
    if parts:
        with SinkCommitter(options.bootstrap, security=options.security) as committer:
            committer.abort({tp: [p.staging_id for p in ps] for tp, ps in parts.items()})


class StrataStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: one commit per micro-batch, exactly once per batch id."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        assert self.options.sink_id is not None or self.options.delivery == AT_LEAST_ONCE
        _commit(self.options, self.options.sink_id or "", batchId, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options, messages)


class StrataBatchWriter(DataSourceArrowWriter):
    """Batch write: all staged rows of the job are committed together at the end."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        # One job, one commit: a fresh sink id unless the user names one (then batch id 0
        # of that sink is written at most once, even if the job is run again).
        self.sink_id = options.sink_id or f"batch-write:{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write_task(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.options, self.sink_id, 0, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options, messages)


def _check_topic(options: SinkOptions) -> None:
    """Fail at query start, not in every task, when the ``topic`` option names no topic."""
    from strata.client import UnknownTopicOrPartitionError
    from strata.client.sink import StagingWriter

    if options.topic is None:
        return
    with StagingWriter(options.bootstrap, client_id="strata-spark-sink-check",
                       security=options.security) as probe:
        try:
            probe.partition_count(options.topic)
        except UnknownTopicOrPartitionError:
            raise StrataSparkOptionError(
                "topic", f"topic {options.topic!r} does not exist at {options.bootstrap}; "
                f"create it first (strata topic create {options.topic} --partitions N)"
            ) from None


def _check_value(options: SinkOptions, schema: StructType) -> SinkOptions:
    """At query start, for the ``topic`` option's topic: a struct value must fit its value
    subject's latest version (pinned for the tasks), and a bytes value must not go to a
    typed topic. Types only: the rows are checked by the tasks."""
    from strata.client import Admin

    if options.topic is None:
        return options
    with Admin(options.bootstrap, client_id="strata-spark-sink-check",
               security=options.security) as admin:
        if not options.struct_value:
            subject = _subject(admin, options.topic)
            if subject is not None:
                raise SchemaMismatchError(
                    f"column value: topic {options.topic!r} is typed (value subject "
                    f"{subject}), and column value is binary or string; give value as a "
                    "struct of the schema's fields (e.g. struct(col('id'), "
                    "col('name')).alias('value')); nothing was written")
            return options
        schema_id, parsed = _value_schema(admin, options.topic)
    _check_struct(schema, options.topic, schema_id, parsed)
    return replace(options, value_schemas=(
        (options.topic, schema_id, parsed.canonical, str(parsed.schema_type)),))


def _check_struct(schema: StructType, topic: str, schema_id: int, parsed: Any) -> None:
    """Whether the DataFrame's struct value converts to ``parsed`` (by type, on an empty
    column of the Arrow type Spark will hand the tasks)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    from strata_spark import spark_ddl
    from wire.schema import table_to_arrow

    value = next(f for f in schema.fields if f.name.lower() == "value")
    try:
        table_to_arrow(pa.array([], to_arrow_type(value.dataType, timezone="UTC")), parsed)
    except SchemaMismatchError as err:
        raise SchemaMismatchError(
            f"column value does not match the value schema of topic {topic!r} "
            f"(schema id {schema_id}): {err.message}. The schema's fields, as Spark types: "
            f"{spark_ddl(parsed.arrow_type)}; nothing was written") from None


def stream_writer(options: Mapping[str, str], schema: StructType, overwrite: bool
                  ) -> StrataStreamWriter:
    parsed = parse_sink_options(options, schema, streaming=True)
    _check_topic(parsed)
    return StrataStreamWriter(_check_value(parsed, schema))


def batch_writer(options: Mapping[str, str], schema: StructType, overwrite: bool
                 ) -> StrataBatchWriter:
    parsed = parse_sink_options(options, schema, streaming=False)
    if overwrite:
        raise StrataSparkOptionError(
            "mode", "overwrite is not supported: a topic is an append-only log; use "
            "mode('append')")
    _check_topic(parsed)
    return StrataBatchWriter(_check_value(parsed, schema))

