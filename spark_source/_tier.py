"""Reading a topic's Delta tier: the records brokers no longer hold, as Spark Arrow batches.

Why this exists: the tiering job (``spark_jobs/``) copies each topic-partition's old
records into one Delta table per topic, and the brokers then delete them locally, so a
broker's log start offset moves up. A query replaying full history must read the offsets
below the log start from that table, in exactly the shape and order the broker path
(``_read.read_range``) hands Spark, so that a range read from either tier looks the
same.

Why delta-rs (``deltalake``) and not Spark: this code runs inside Spark's Python workers,
which have no SparkSession and no JVM gateway. delta-rs replays the Delta log in
process; pyarrow reads the parquet files it names.

The table's contract (written by the tiering job): the source schema's columns plus
``date`` (UTC date of ``timestamp``), partitioned by ``(partition, date)``, one row per
record, offsets unique within a partition, no deletion vectors, timestamps stored as
``TIMESTAMP_MICROS``. Offsets may have gaps (control and aborted records are never
there) and rows below the partition's tier start may be gone (tier retention).

Transactions (docs/spark.md, "Transactions and the tier"): the table holds committed
records only (the job copies below the last stable offset, at read_committed), so the
rows read here are never filtered by an aborted-transaction list: the aborted ranges a
reader applies must come from the source its data comes from, and for Delta rows that
filtering already happened when they were copied. Records read from the brokers are
filtered by the consumer with the aborted list of their own fetch. A read_uncommitted
reader gets the same committed-only rows from here.

How a range is read, and why that way:

* **Pruning from the Delta log.** The log's add actions carry each file's partition
  values and per-column min/max statistics; a file is opened only when its ``partition``
  value is the one asked for and its ``offset`` statistics overlap ``[start, end)``
  (files without statistics are kept: they might hold the rows). A partition of a
  long-retained topic has thousands of files across its ``date`` partitions, and a range
  usually touches a handful.
* **Order without sorting everything.** Files of one partition may overlap in offsets
  (the writer spreads rows over tasks, and the ``date`` split cuts by record time, which
  need not follow offsets). Files are read in order of their minimum offset; after each
  one, the rows below the next file's minimum can no longer be preceded by anything
  unread, so they are sorted and handed out. Memory stays about one file's worth when
  files do not overlap, and the result is exactly ascending either way.
* **Whole-column Arrow work only.** Each file is read with a pushed-down offset filter,
  the ``partition`` column is a repeated constant, and the other columns are cast to
  ``SPARK_ARROW_SCHEMA``: no per-record Python.

``startingTimestamp`` below a log start uses the same pruning on the ``timestamp``
statistics (``TierTable.first_offset_at``): only files whose latest record is late
enough are opened, and only their ``offset`` and ``timestamp`` columns.

Typed topics: the table's ``value`` is a struct of the value schema's fields (in the
types Spark's Arrow interchange has), and its schema grows when the subject does (the
tiering job adds the fields of a new version, spark_jobs/README.md). A file written
before such a change lacks the new fields: ``value`` is brought to the query's struct
type per file, a missing field taking the reader schema's default (or null, for an
optional field without one), and a null in a required field that has a default (a
Spark rewrite, OPTIMIZE or DELETE, stored the added column as null) taking the default
too, so a replay from Delta gives the rows the brokers give under that version.

Errors: a table that is missing, unreadable, protected by reader features delta-rs
cannot honour (deletion vectors, column mapping), not in the contract's shape, or whose
data file vanished under a read raises ``StrataSparkTierError`` (``TIER_UNAVAILABLE``),
never data loss: the records may be there, the reader just cannot get them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from spark_source._arrow import spark_arrow_schema
from spark_source._errors import StrataSparkTierError
from strata_spark import Warehouse

__all__ = [
    "TIER_COLUMNS",
    "TierFile",
    "TierTable",
    "read_tier_range",
    "tier_bounds",
]

#: The data columns read from each file, in ``SPARK_ARROW_SCHEMA`` order less
#: ``partition`` (a constant per range, taken from the partition value instead).
TIER_COLUMNS: Final = ("key", "value", "topic", "offset", "timestamp", "timestampType",
                       "headers")
#: Every column the contract requires, for the shape check when a table is opened.
_REQUIRED: Final = frozenset(TIER_COLUMNS) | {"partition", "date"}
_HINT: Final = ("check that the path exists and is readable from every Spark executor "
                "(permissions, storage credentials) and that the tiering job wrote it")


@dataclass(frozen=True, slots=True)
class TierFile:
    """One data file of the table: its path relative to the table root and its ``offset``
    and ``timestamp`` statistics (``None`` when the log has none: the file is then always
    read). ``max_timestamp_us``: microseconds since the epoch."""

    path: str
    min_offset: int | None
    max_offset: int | None
    records: int | None
    max_timestamp_us: int | None = None


class TierTable:
    """One Delta tier table, opened once (its log replayed once) for several questions.

    ``uri`` is a local path, ``file://`` URI, or ``s3://`` (``s3a://``) URI: an object
    store's credentials and endpoint come from the environment of the Spark worker
    (``strata_spark.Warehouse``: the standard AWS variables), never from the URI.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        #: How many data files the reads of this object opened (tests check pruning).
        self.files_read = 0
        try:
            from deltalake import DeltaTable
        except ImportError as err:  # pragma: no cover - a broken environment
            raise StrataSparkTierError(
                uri, f"the deltalake package is not importable in this Spark worker ({err}); "
                "install the project's dependencies in the interpreter PYSPARK_PYTHON "
                "names") from None
        try:
            location, options = _delta_location(uri)
            self._table = DeltaTable(location, storage_options=options or None)
            names = set(self._table.schema().to_arrow().names)
            actions = pa.table(self._table.get_add_actions(flatten=True))
            # Only supplies delta-rs's filesystem (local or object store, with the table's
            # storage options) for the reads; it opens no data file. It also refuses
            # reader features pyarrow cannot honour (deletion vectors, column mapping).
            self._dataset: pads.FileSystemDataset = self._table.to_pyarrow_dataset(
                file_pruning_predicate="false")
        except Exception as err:  # deltalake raises its own and OSError/ValueError kinds
            _unavailable(uri, f"cannot be opened ({_one_line(err)})", err)
        missing = sorted(_REQUIRED - names)
        if missing:
            raise StrataSparkTierError(
                uri, f"lacks the column(s) {', '.join(missing)} of a strata tier table; "
                "the topic's tier must name the table the tiering job writes (strata tier "
                "run; Admin.describe_tier shows the recorded URI), with the source's "
                "columns plus date")
        self._actions = actions

    def files(self, partition: int) -> list[TierFile]:
        """Every file of ``partition``, by minimum offset (files without statistics first)."""
        actions = self._actions
        if actions.num_rows == 0:
            return []
        if "partition.partition" not in actions.column_names:
            raise StrataSparkTierError(
                self.uri, "is not partitioned by partition; the tier contract is "
                "partitionBy(\"partition\", \"date\"): rewrite the table that way")
        mine = actions.filter(pc.equal(actions.column("partition.partition"), partition))
        paths = mine.column("path").to_pylist()
        lows = _column(mine, "min.offset")
        highs = _column(mine, "max.offset")
        counts = _column(mine, "num_records")
        if "max.timestamp" in mine.column_names:
            latest: Sequence[int | None] = \
                mine.column("max.timestamp").cast(pa.int64()).to_pylist()
        else:
            latest = [None] * mine.num_rows
        files = [TierFile(*fields)
                 for fields in zip(paths, lows, highs, counts, latest, strict=True)]
        return sorted(files, key=lambda f: (-1 if f.min_offset is None else f.min_offset,
                                            f.path))

    def files_for(self, partition: int, start: int, end: int) -> list[TierFile]:
        """The files of ``partition`` that may hold offsets in ``[start, end)``."""
        return [f for f in self.files(partition)
                if (f.min_offset is None or f.min_offset < end)
                and (f.max_offset is None or f.max_offset >= start)]

    def bounds(self, partition: int) -> tuple[int, int] | None:
        """``(lowest offset, highest offset + 1)`` of ``partition`` per the log's
        statistics, or ``None`` when the table has no file for it. Files without
        statistics are opened to find out."""
        files = self.files(partition)
        if not files:
            return None
        lows: list[int] = []
        highs: list[int] = []
        for f in files:
            if f.min_offset is not None and f.max_offset is not None:
                lows.append(f.min_offset)
                highs.append(f.max_offset)
                continue
            offsets = self._read(f, None).column("offset")
            if len(offsets):
                lows.append(pc.min(offsets).as_py())
                highs.append(pc.max(offsets).as_py())
        if not lows:
            return None
        return min(lows), max(highs) + 1

    def first_offset_at(self, partition: int, start: int, end: int, timestamp_ms: int
                        ) -> int | None:
        """The lowest offset in ``[start, end)`` of ``partition`` whose record timestamp is
        at or after ``timestamp_ms`` (``startingTimestamp`` below a log start), or
        ``None``. Files whose ``timestamp`` maximum is earlier are not opened; files are
        read by minimum offset and the search stops once no later file can hold a lower
        offset than one found."""
        # Delta keeps timestamp statistics at millisecond precision (truncated): a file's
        # true maximum may be up to 999 us above the recorded one.
        wanted_us = timestamp_ms * 1000
        files = [f for f in self.files_for(partition, start, end)
                 if f.max_timestamp_us is None or f.max_timestamp_us + 999 >= wanted_us]
        condition = (pc.field("offset") >= start) & (pc.field("offset") < end) & \
            (pc.field("timestamp") >= pa.scalar(wanted_us, pa.timestamp("us", tz="UTC")))
        best: int | None = None
        for tier_file in files:
            if best is not None and tier_file.min_offset is not None \
                    and tier_file.min_offset >= best:
                break
            offsets = self._read(tier_file, condition, columns=("offset",)).column("offset")
            if len(offsets):
                low: int = pc.min(offsets).as_py()
                best = low if best is None else min(best, low)
        return best

    def read(self, topic: str, partition: int, start: int, end: int, *,
             batch_rows: int, value_type: pa.DataType | None = None,
             value_schema: tuple[str, str] | None = None) -> Iterator[pa.RecordBatch]:
        """Rows ``start <= offset < end`` of ``partition``, ascending, in Spark's Arrow
        shape, in batches of about ``batch_rows`` (see the module docstring)."""
        if start >= end:
            return
        files = self.files_for(partition, start, end)
        if not files:
            return
        ready: list[pa.Table] = []
        ready_rows = 0
        pending: pa.Table | None = None
        in_range = (pc.field("offset") >= start) & (pc.field("offset") < end)
        shape = None if value_type is None else _ValueConformer(self.uri, value_type,
                                                                value_schema)
        for index, tier_file in enumerate(files):
            table = self._read(tier_file, in_range)
            if shape is not None:
                table = shape.conform(table)
            pending = table if pending is None else pa.concat_tables([pending, table])
            following = files[index + 1].min_offset if index + 1 < len(files) else None
            if following is None and index + 1 < len(files):
                continue  # the next file has no statistics: it may hold anything
            if following is None:
                done, pending = pending, None
            else:
                below = pc.less(pending.column("offset"), following)
                done, pending = pending.filter(below), pending.filter(pc.invert(below))
            if done.num_rows:
                ready.append(_ascending(done))
                ready_rows += done.num_rows
            if ready_rows >= batch_rows:
                yield from _batches(self.uri, topic, partition, ready, batch_rows, value_type)
                ready, ready_rows = [], 0
        if ready:
            yield from _batches(self.uri, topic, partition, ready, batch_rows, value_type)

    def _read(self, tier_file: TierFile, condition: pc.Expression | None,
              columns: Sequence[str] = TIER_COLUMNS) -> pa.Table:
        self.files_read += 1
        try:
            fragment = self._fragment(tier_file.path)
            return fragment.to_table(columns=list(columns), filter=condition)
        except StrataSparkTierError:
            raise
        except Exception as err:  # pyarrow's ArrowException, OSError, FileNotFoundError
            _unavailable(self.uri, f"data file {tier_file.path} cannot be read "
                         f"({_one_line(err)}); if the table was compacted or "
                         "vacuumed while this query ran, run the query again", err)

    def _fragment(self, path: str) -> pads.Fragment:
        dataset = self._dataset
        fragment: pads.Fragment = dataset.format.make_fragment(path, dataset.filesystem)
        return fragment


def _delta_location(uri: str) -> tuple[str, dict[str, str]]:
    """delta-rs's URI and storage options for a table URI (``s3a://`` becomes ``s3://``;
    a plain-HTTP S3-compatible endpoint is allowed). A malformed object-store URI raises
    ``InvalidWarehouseError`` before any request."""
    if uri.lower().startswith(("s3://", "s3a://")):
        table = Warehouse.parse(uri)
        return table.delta_uri(), table.storage_options()
    return uri, {}


def read_tier_range(table_uri: str, topic: str, partition: int, start: int, end: int, *,
                    batch_rows: int, value_type: pa.DataType | None = None,
                    value_schema: tuple[str, str] | None = None
                    ) -> Iterator[pa.RecordBatch]:
    """Yield the tier's rows ``start <= offset < end`` of ``partition`` in ascending offset
    order, as Spark Arrow batches exactly like ``read_range``'s (``SPARK_ARROW_SCHEMA``).

    Offsets the table does not hold are simply absent: the caller knows which of them
    are gaps of the log (control records) and which are lost. Raises
    ``StrataSparkTierError`` when the table cannot be read.
    """
    if start >= end:
        return iter(())
    return TierTable(table_uri).read(topic, partition, start, end, batch_rows=batch_rows,
                                     value_type=value_type, value_schema=value_schema)


def tier_bounds(table_uri: str, partition: int) -> tuple[int, int] | None:
    """``(min offset, max offset + 1)`` of ``partition`` in the tier, ``None`` if none."""
    return TierTable(table_uri).bounds(partition)


# ----------------------------------------------------------------------------- typed values


class _ValueConformer:
    """Brings each file's struct ``value`` to the query's type (see the module docstring):
    fields by name, missing ones from the reader schema's defaults. Whole columns only;
    a file already of the type passes through untouched."""

    def __init__(self, uri: str, value_type: pa.DataType,
                 value_schema: tuple[str, str] | None) -> None:
        self.uri = uri
        self.value_type = value_type
        self.root: Any = None
        if value_schema is not None:
            from wire.schema import parse_schema

            self.root = parse_schema(*value_schema).root

    def conform(self, table: pa.Table) -> pa.Table:
        values = table.column("value")
        if values.type == self.value_type:
            return table
        if not pa.types.is_struct(values.type):
            raise StrataSparkTierError(
                self.uri, f"holds value as {values.type}, not a struct of the topic's value "
                "schema: it was written before the topic was typed, or for another topic; "
                "move it away so the tiering job writes a new table")
        array = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        conformed = self._struct(array, self.value_type, self.root, "")
        return table.set_column(table.column_names.index("value"), "value", conformed)

    def _struct(self, array: pa.Array, target: pa.DataType, node: Any, path: str
                ) -> pa.Array:
        by_field = {} if node is None else node.by_name
        names = {array.type.field(i).name for i in range(array.type.num_fields)}
        children = []
        for wanted in target:
            where = f"{path}.{wanted.name}" if path else wanted.name
            spec = by_field.get(wanted.name)
            if wanted.name not in names:
                children.append(self._default(spec, wanted, len(array), where))
                continue
            child = self._value(array.field(wanted.name), wanted.type,
                                None if spec is None else spec.node, where)
            if spec is not None and not spec.nullable and spec.has_default \
                    and child.null_count:
                child = pc.if_else(child.is_null(), self._default(spec, wanted, len(array),
                                                                  where), child)
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(target),
                                          mask=array.is_null() if array.null_count else None)

    def _value(self, array: pa.Array, target: pa.DataType, node: Any, path: str
               ) -> pa.Array:
        if array.type == target:
            return array
        if pa.types.is_struct(target) and pa.types.is_struct(array.type):
            return self._struct(array, target, node, path)
        element = None if node is None else node.element
        # Offsets from 0 and the items of the non-null entries only, whatever the slice
        # offset and however many items null lists still hold (``list_parts``).
        from wire.schema import list_parts

        if pa.types.is_list(target) and pa.types.is_list(array.type):
            offsets, flat, mask = list_parts(array)
            items = self._value(flat, target.value_type, element, path + "[]")
            return pa.ListArray.from_arrays(offsets, items, type=target, mask=mask)
        if pa.types.is_map(target) and pa.types.is_map(array.type):
            offsets, entries, mask = list_parts(array)
            items = self._value(entries.field(1), target.item_type, element, path + "{}")
            return pa.MapArray.from_arrays(offsets, entries.field(0).cast(target.key_type),
                                           items, type=target, mask=mask)
        if not _promotable(array.type, target):
            # As the log path (wire.schema.resolve): only Avro's promotions, never a cast
            # that Arrow happens to know (a double to a long, a number to a string).
            raise StrataSparkTierError(
                self.uri, f"field value.{path} is {array.type} in a data file but the query "
                f"reads it as {target}, which is not a promotion schema resolution allows "
                "(int to long/float/double, long to float/double, float to double, string "
                "to/from bytes): pin the query to a version those rows were written with "
                "(valueSchemaVersion), or read the table as Delta")
        try:
            return array.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            raise StrataSparkTierError(
                self.uri, f"field value.{path} is {array.type} in a data file but the query "
                f"reads it as {target} ({err}); the table's value schema changed in a way "
                "the tiering job does not make: check the table's history") from None

    def _default(self, spec: Any, wanted: pa.Field, length: int, path: str) -> pa.Array:
        if spec is not None and spec.has_default and spec.default is not None:
            from wire.schema import default_array

            return default_array(spec, path).cast(wanted.type).take(pa.repeat(0, length))
        if spec is None or spec.nullable:
            return pa.nulls(length, wanted.type)
        raise StrataSparkTierError(
            self.uri, f"field value.{path} is required by the value schema but missing from "
            "a data file and has no default; the subject changed incompatibly (register a "
            "default for it)")


# ----------------------------------------------------------------------------- helpers
#: Avro's promotions, by the Arrow type's kind (see ``_kind``).
_PROMOTED: Final[dict[str, frozenset[str]]] = {
    "int": frozenset({"long", "float", "double"}), "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}), "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


def _kind(t: pa.DataType) -> str:
    """What a leaf type is, whatever its Arrow spelling (dictionary, large, a timestamp's
    unit, a decimal's precision)."""
    types = pa.types
    if types.is_dictionary(t):
        return _kind(t.value_type)
    if types.is_int8(t) or types.is_int16(t) or types.is_int32(t):
        return "int"
    if types.is_int64(t):
        return "long"
    if types.is_float32(t):
        return "float"
    if types.is_float64(t):
        return "double"
    if types.is_string(t) or types.is_large_string(t):
        return "string"
    if types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t):
        return "bytes"
    if types.is_timestamp(t):
        return f"timestamp{'' if t.tz is None else ' tz'}"
    if types.is_decimal(t):
        return f"decimal scale {t.scale}"
    return str(t)


def _promotable(source: pa.DataType, target: pa.DataType) -> bool:
    a, b = _kind(source), _kind(target)
    return a == b or b in _PROMOTED.get(a, frozenset())


def _column(table: pa.Table, name: str) -> Sequence[int | None]:
    if name not in table.column_names:
        return [None] * table.num_rows
    values: list[int | None] = table.column(name).to_pylist()
    return values


def _ascending(table: pa.Table) -> pa.Table:
    """``table`` by offset; one comparison pass when it already is (the tiering job
    writes each file from an offset-ordered read, so that is the usual case)."""
    offsets = table.column("offset")
    if len(offsets) < 2 or pc.all(pc.less(offsets[:-1], offsets[1:])).as_py():
        return table
    return table.sort_by("offset")


def _batches(uri: str, topic: str, partition: int, tables: list[pa.Table],
             batch_rows: int, value_type: pa.DataType | None = None
             ) -> Iterator[pa.RecordBatch]:
    schema = spark_arrow_schema(value_type)
    table = pa.concat_tables(tables)
    rows = table.num_rows
    try:
        spark = pa.Table.from_arrays([
            table.column("key").cast(pa.binary()),
            table.column("value").cast(schema.field("value").type),
            table.column("topic").cast(pa.string()),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            table.column("offset").cast(pa.int64()),
            table.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
            table.column("timestampType").cast(pa.int32()),
            table.column("headers").cast(schema.field("headers").type),
        ], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise StrataSparkTierError(
            uri, f"rows of {topic}-{partition} do not cast to the source schema ({err}); "
            "the tier table must have the source's column types") from None
    yield from spark.combine_chunks().to_batches(max_chunksize=batch_rows)


def _one_line(err: BaseException) -> str:
    """``Type: message`` on one line (delta-rs puts its OS error on a second line, and a
    Spark failure shows the first line of the message first)."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _unavailable(uri: str, what: str, err: BaseException) -> NoReturn:
    raise StrataSparkTierError(uri, f"{what}; {_HINT}") from err

