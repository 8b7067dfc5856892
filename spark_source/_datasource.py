"""``StrataDataSource``: the ``format("strata")`` entry point Spark instantiates.

Why this module stays small and imports lazily: Spark looks data sources up by importing
every top-level ``pyspark_*`` module (``pyspark_strata`` imports this one) in a fresh
Python worker the first time a session touches a Python data source, whatever its format.
Importing the reader (the client, the record-batch codec) or the sink only when a
strata query actually needs them keeps that lookup cheap for everyone else; the one
thing needed at import, ``SCHEMA_DDL``, comes from ``_schema``, which imports nothing.

Options are validated when Spark asks for a reader (``reader`` / ``streamReader``), which
is when a query starts. ``schema()`` is shared by reads and writes: without a
subscription (a write) it is ``SCHEMA_DDL`` and asks nothing; a read asks the cluster
whether the subscribed topics are typed (``_values.describe_value``), and for typed
topics read with ``valueFormat=struct`` (the default) returns the schema with ``value`` a
struct of the value schema's fields, the subject version pinned in its metadata.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from spark_source._schema import SCHEMA_DDL

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from pyspark.sql import SparkSession

__all__ = ["SCHEMA_DDL", "StrataDataSource", "register"]

class StrataDataSource(DataSource):
    """Strata topics as a Spark data source: batch and streaming reads, and writes.

    ``spark.read.format("strata")`` / ``spark.readStream.format("strata")`` read with the
    Kafka source's options and schema (``spark_source/README.md``); writes go through
    ``spark_source._sink``.
    """

    @classmethod
    def name(cls) -> str:
        return "strata"

    def schema(self) -> StructType | str:
        """``SCHEMA_DDL``, or for typed topics read as structs the same columns with a
        struct ``value`` (``spark_source/README.md``, typed topics)."""
        from spark_source._options import subscription_of

        subscription = subscription_of(self.options)
        if subscription is None:
            return SCHEMA_DDL
        from spark_source._values import describe_value

        schema: StructType | str = describe_value(subscription)[1]
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_source._options import parse_source_options
        from spark_source._reader import StrataBatchReader
        from spark_source._values import with_value_shape

        options = parse_source_options(self.options, streaming=False)
        return StrataBatchReader(with_value_shape(options, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark_source._options import parse_source_options
        from spark_source._reader import StrataStreamReader
        from spark_source._values import with_value_shape

        options = parse_source_options(self.options, streaming=True)
        return StrataStreamReader(with_value_shape(options, schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_source import _sink

        return _sink.batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_source import _sink

        return _sink.stream_writer(self.options, schema, overwrite)


def register(spark: SparkSession) -> None:
    """Register ``format("strata")`` in ``spark`` explicitly.

    Not needed where this project is installed: Spark finds the ``pyspark_strata`` module
    by itself. Useful when the module is not importable by Spark's Python workers (for
    instance a job that ships ``spark_source`` as a zip with ``--py-files``).
    """
    spark.dataSource.register(StrataDataSource)
