"""The Spark type mapping: a typed topic's Arrow types (``wire.schema``) as Spark has them.

``spark_arrow_type``: the Arrow type Spark's Arrow interchange takes for one of the
schema mapping's types (microsecond timestamps, times as int/bigint, dictionaries
decoded); ``spark_type``: the Spark type of it (pyspark's own mapping of that Arrow
type, imported when called); ``spark_ddl``: Spark DDL for a struct, for tables and
messages. The Spark source (the ``value`` struct it hands Spark) and the tiering job
(its Delta tables' ``value`` column) both use these, so both agree on what a typed
value looks like in Spark.

Pure functions: thread-safe.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from wire.errors import InvalidSchemaError

__all__ = ["spark_arrow_type", "spark_ddl", "spark_type"]


def spark_arrow_type(t: pa.DataType) -> pa.DataType:
    types = pa.types
    if types.is_timestamp(t):
        return pa.timestamp("us", t.tz)
    if types.is_time32(t):
        return pa.int32()  # Spark has no time type: ms (or s) after midnight, as mapped
    if types.is_time64(t):
        return pa.int64()
    if types.is_dictionary(t):
        return spark_arrow_type(t.value_type)
    if types.is_struct(t):
        return pa.struct([f.with_type(spark_arrow_type(f.type)) for f in t])
    if types.is_map(t):
        return pa.map_(t.key_field.with_type(spark_arrow_type(t.key_type)),
                       t.item_field.with_type(spark_arrow_type(t.item_type)))
    if types.is_list(t):
        return pa.list_(t.value_field.with_type(spark_arrow_type(t.value_type)))
    if types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(spark_arrow_type(t.value_type)))
    return t


def spark_type(t: pa.DataType) -> Any:
    """The Spark type (a ``pyspark.sql.types.DataType``) of Arrow type ``t``:
    ``spark_arrow_type``, then pyspark's own mapping, so that the Arrow type Spark checks
    for it (``to_arrow_type`` of the result) is what data must be cast to. Built in
    Python: no JVM needed."""
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(spark_arrow_type(t))


_SIMPLE: dict[pa.DataType, str] = {
    pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT",
    pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
    pa.string(): "STRING", pa.large_string(): "STRING", pa.binary(): "BINARY",
    pa.large_binary(): "BINARY", pa.date32(): "DATE",
}


def spark_ddl(t: pa.StructType, *, not_null: bool = True) -> str:
    """``\\`name\\` TYPE [NOT NULL], ...``. Spark DDL cannot say that array items or map
    values are not null, so that is left out (Spark then takes them as nullable).

    ``not_null=False``: every field nullable, at every depth. For the Delta tables of a
    typed topic: they hold rows of several versions (a field required in one may be
    optional in the next), and Delta refuses NOT NULL inside arrays and maps."""
    return ", ".join(_column(f, " ", not_null) for f in t)


def _column(field: pa.Field, separator: str, not_null: bool = True) -> str:
    name = "`" + field.name.replace("`", "``") + "`"
    required = not_null and not field.nullable
    return f"{name}{separator}{_sql(field.type, not_null)}{' NOT NULL' if required else ''}"


def _sql(t: pa.DataType, not_null: bool = True) -> str:
    types = pa.types
    if t in _SIMPLE:
        return _SIMPLE[t]
    if types.is_dictionary(t):
        return _sql(t.value_type)
    if types.is_fixed_size_binary(t):
        return "BINARY"
    if types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if types.is_timestamp(t):
        return "TIMESTAMP" if t.tz is not None else "TIMESTAMP_NTZ"
    if types.is_time32(t) or types.is_time64(t):
        return _sql(spark_arrow_type(t))
    if types.is_list(t) or types.is_large_list(t):
        return f"ARRAY<{_sql(t.value_type, not_null)}>"
    if types.is_map(t):
        return f"MAP<{_sql(t.key_type, not_null)}, {_sql(t.item_type, not_null)}>"
    if types.is_struct(t):
        return "STRUCT<" + ", ".join(_column(f, ": ", not_null) for f in t) + ">"
    raise InvalidSchemaError(f"Arrow type {t} has no Spark type; map it to one of the "
                             "schema mapping's types first")
