"""Arrow to Spark: the Arrow shape Spark accepts from ``read()``, and the casts into it.

Spark checks the first batch's Arrow schema against ``to_arrow_schema(schema,
timezone="UTC")`` exactly (field names, types and nullability), so
``SPARK_ARROW_SCHEMA`` spells that out: ``timestamp`` is ``timestamp[us, tz=UTC]`` (the
client's ``int64`` milliseconds are reinterpreted as ``timestamp[ms]`` and widened by
Arrow), ``partition`` / ``timestampType`` stay ``int32``, every field is nullable, and
the headers list's item field is called ``element``. A typed topic's ``value`` is a
struct, in the types Spark's Arrow interchange has (``strata_spark.spark_arrow_type``).

Both read paths end here: the brokers' (``_read.read_range``: the consumer's
``CONSUMER_SCHEMA`` tables, ``to_spark_table``) and the Delta tier's (``_tier``:
``spark_arrow_schema``), so a range read from either looks the same to Spark. Whole-
column casts only, no per-record Python. Pure functions: thread-safe.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa

from spark_source._errors import StrataSparkOptionError

__all__ = [
    "SPARK_ARROW_SCHEMA",
    "SPARK_BATCH_ROWS",
    "bytes_struct_type",
    "spark_arrow_schema",
    "spark_value",
    "to_spark_table",
]

#: The Arrow form of the source schema that Spark accepts from ``read()`` (see the module
#: docstring; a test checks it against ``pyspark.sql.pandas.types.to_arrow_schema``).
_HEADERS_TYPE: Final = pa.list_(pa.field("element", pa.struct([
    pa.field("key", pa.string()), pa.field("value", pa.binary())])))
SPARK_ARROW_SCHEMA: Final = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", _HEADERS_TYPE),
])

#: Rows per Arrow batch handed to Spark. A fetch decodes into one small chunk per wire
#: batch (about 1,000 records with the producer's defaults); the JVM pays per batch, so
#: each poll's records are combined into one contiguous table, then cut into batches of
#: this size (on this machine Spark took rows from ~16k-row batches faster than from
#: 1k- or 64k-row ones).
SPARK_BATCH_ROWS: Final = 16384


def to_spark_table(table: pa.Table, value_type: pa.DataType | None = None) -> pa.Table:
    """A ``CONSUMER_SCHEMA`` table in ``SPARK_ARROW_SCHEMA`` (``value_type``: a typed
    topic's struct ``value`` as Spark expects it): whole-column casts only."""
    timestamps = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")) \
        .cast(pa.timestamp("us", tz="UTC"))
    return pa.Table.from_arrays([
        table.column("key"),
        spark_value(table, value_type),
        table.column("topic"),
        table.column("partition"),
        table.column("offset"),
        timestamps,
        table.column("timestampType"),
        table.column("headers").cast(_HEADERS_TYPE),
    ], schema=spark_arrow_schema(value_type))


def spark_arrow_schema(value_type: pa.DataType | None) -> pa.Schema:
    """``SPARK_ARROW_SCHEMA``, with ``value_type`` (a typed topic's) as ``value``'s type."""
    if value_type is None:
        return SPARK_ARROW_SCHEMA
    return SPARK_ARROW_SCHEMA.set(1, pa.field("value", value_type))


def spark_value(table: pa.Table, value_type: pa.DataType | None) -> pa.ChunkedArray:
    """``table``'s value column as Spark expects it: binary, or ``value_type`` (a struct,
    cast from the schema's Arrow type: microsecond timestamps, binary for fixed, Spark's
    names for list and map fields). A topic whose values do not have that shape (a topic
    that joined a pattern subscription since the query started) fails the task with
    what to do."""
    values = table.column("value")
    topic = table.column("topic")[0].as_py() if table.num_rows else "?"
    if value_type is None:
        if pa.types.is_binary(values.type):
            return values
        raise StrataSparkOptionError(
            "subscribe", f"topic {topic} is typed, but this query was planned with binary "
            "values (none of its topics was typed when it started); restart the query so "
            "that its schema is worked out again, or set valueFormat=binary")
    if not pa.types.is_struct(values.type):
        raise StrataSparkOptionError(
            "subscribe", f"topic {topic} is not typed (its values are bytes), but this query "
            "reads struct values of a typed topic; subscribe to typed topics of one value "
            "subject only, or set valueFormat=binary")
    try:
        return values.cast(value_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise StrataSparkOptionError(
            "subscribe", f"the values of topic {topic} ({values.type}) do not have the struct "
            f"type this query was planned with ({value_type}): {err}; subscribe to topics of "
            "one value subject, and restart the query after the subject changes") from None



def bytes_struct_type() -> Any:
    """``SCHEMA_DDL`` as a ``StructType`` (built in Python: no JVM here)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(SPARK_ARROW_SCHEMA)
