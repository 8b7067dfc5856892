"""Typed topics' values (docs/typed-topics.md): which value schema a query reads under.

``value`` is a struct of the topic's value schema, straight from the consumer's Arrow
columns (no per-record decoding). ``describe_value`` runs on the driver when Spark asks
the source for its schema: it finds the subscribed topics' ``value.schema.subject`` and
the subject's latest version, refuses a subscription whose topics do not share one
subject (or mix typed and bytes topics) for struct values, and returns the Spark schema
with the subject, version and schema on the ``value`` field's metadata.
``with_value_shape`` turns that schema, which Spark hands to
``reader``/``streamReader``, back into ``SourceOptions`` fields, so every task reads
under that very version (``Consumer(value_schema_version=N)``) and casts ``value`` to
the Arrow type Spark checks. ``valueFormat=binary``/``json`` keep the bytes schema.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

import pyarrow as pa

from spark_source._arrow import bytes_struct_type
from spark_source._errors import StrataSparkOptionError
from spark_source._options import SourceOptions
from spark_source._schema import SCHEMA_DDL
from strata.client import Admin
from strata_spark import spark_type

__all__ = [
    "META_SCHEMA",
    "META_SCHEMA_TYPE",
    "META_SUBJECT",
    "META_VERSION",
    "ValueShape",
    "describe_value",
    "with_value_shape",
]

#: Keys of the ``value`` field's metadata in the schema ``describe_value`` returns.
META_SUBJECT: Final = "strata.value.subject"
META_VERSION: Final = "strata.value.version"
META_SCHEMA: Final = "strata.value.schema"
META_SCHEMA_TYPE: Final = "strata.value.schemaType"


@dataclass(frozen=True, slots=True)
class ValueShape:
    """The value schema a query over typed topics reads under: ``subject`` at ``version``
    (``schema``/``schema_type``: its text), or no subject at all (bytes topics only)."""

    subject: str | None = None
    version: int | None = None
    schema: str | None = None
    schema_type: str = "AVRO"


def describe_value(options: SourceOptions) -> tuple[ValueShape, Any]:
    """On the driver: which value schema the subscription's topics share, and the Spark
    schema of the source for it (a ``StructType``). Raises ``StrataSparkOptionError`` when
    struct values are asked of topics that do not share one value subject."""
    from pyspark.sql.types import StructField, StructType

    from wire.schema import parse_schema

    admin = Admin(options.bootstrap, client_id="strata-spark-source",
                  security=options.security)
    try:
        existing = admin.list_topics()
        topics = sorted(t for t in existing if options.subscribes_to(t))
        # From the metadata, not DESCRIBE_CONFIGS, which a reader need not be allowed.
        subjects = admin.value_subjects(topics) if topics else {}
        typed = {topic: subject for topic, subject in subjects.items() if subject}
        if not typed:
            return ValueShape(), SCHEMA_DDL
        distinct = sorted(set(typed.values()))
        if options.value_format != "struct":
            if len(distinct) > 1:  # frames name their schema ids; no version to pin
                return ValueShape(), SCHEMA_DDL
            registered = admin.get_schema(distinct[0], options.value_schema_version or "latest")
            return ValueShape(distinct[0], registered.version, registered.schema,
                              registered.schema_type), SCHEMA_DDL
        if len(distinct) > 1:
            listed = "; ".join(f"{t}: {s}" for t, s in sorted(typed.items()))
            raise StrataSparkOptionError(
                "subscribe", f"{options.subscription} covers typed topics of different value "
                f"subjects ({listed}), and a struct value column has one type; read each "
                "subject in its own query (and union the results), or set "
                "valueFormat=binary for Confluent-framed bytes")
        untyped = sorted(t for t in topics if t not in typed)
        if untyped:
            raise StrataSparkOptionError(
                "subscribe", f"{options.subscription} mixes typed topics "
                f"({', '.join(sorted(typed))}, subject {distinct[0]}) with bytes topics "
                f"({', '.join(untyped)}), whose values cannot be a struct; read them in "
                "separate queries, or set valueFormat=binary to read every value as bytes")
        registered = admin.get_schema(distinct[0], options.value_schema_version or "latest")
    finally:
        admin.close()
    shape = ValueShape(distinct[0], registered.version, registered.schema,
                       registered.schema_type)
    value_type = spark_type(parse_schema(shape.schema or "", shape.schema_type)
                                   .arrow_type)
    metadata = {META_SUBJECT: shape.subject, META_VERSION: shape.version,
                META_SCHEMA: shape.schema, META_SCHEMA_TYPE: shape.schema_type}
    bytes_schema = bytes_struct_type()
    fields = [StructField("value", value_type, True, metadata) if f.name == "value" else f
              for f in bytes_schema.fields]
    return shape, StructType(fields)


def with_value_shape(options: SourceOptions, schema: Any) -> SourceOptions:
    """``options`` completed from the schema Spark planned the query with (``schema()``'s,
    or one the user gave): the pinned subject version, and the Arrow type of a struct
    ``value``. A user-given struct value without the source's metadata is checked against
    the subscription's current schema."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    names = [f.name for f in schema.fields]
    if "value" not in names:
        return options
    value = schema.fields[names.index("value")]
    metadata = value.metadata or {}
    if not isinstance(value.dataType, StructType):
        if options.value_format == "struct":
            return options  # no typed topic when the query was planned
        # binary/json: pin the version here (one subject), so every task frames alike.
        shape, _ = describe_value(options)
        return _pinned(options, shape, None)
    if META_VERSION not in metadata:
        shape, planned = describe_value(options)
        if not isinstance(planned, StructType) or \
                planned["value"].dataType != value.dataType:
            raise StrataSparkOptionError(
                "schema", f"the schema given to spark.read.schema(...) has value "
                f"{value.dataType.simpleString()}, which is not the value type of "
                f"{options.subscription} ({_simple(planned)}); drop .schema(...): the "
                "source works its schema out from the topics' value subject")
    else:
        shape = ValueShape(metadata[META_SUBJECT], metadata[META_VERSION],
                           metadata.get(META_SCHEMA), metadata.get(META_SCHEMA_TYPE, "AVRO"))
    return _pinned(options, shape, to_arrow_type(value.dataType, timezone="UTC"))


def _pinned(options: SourceOptions, shape: ValueShape, arrow_type: pa.DataType | None
            ) -> SourceOptions:
    text = None if shape.schema is None else (shape.schema, shape.schema_type)
    return replace(options, value_schema_version=shape.version, value_schema=text,
                   value_arrow_type=arrow_type)


def _simple(schema: Any) -> str:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return str(schema["value"].dataType.simpleString())
    return "binary"
