"""``StrataDataSource``: the ``format("strata")`` entry point Spark instantiates.

Why this module stays small and imports lazily: Spark looks data sources up by importing
every top-level ``pyspark_*`` module (``pyspark_strata`` imports this one) in a fresh
Python worker the first time a session touches a Python data source, whatever its format.
Importing the reader (the client, the record-batch codec) or the sink only when a
strata query actually needs them keeps that lookup cheap for everyone else.

Options are validated when Spark asks for a reader (``reader`` / ``streamReader``), which
is when a query starts; ``schema()`` is shared by reads and writes, so it validates
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from pyspark.sql import SparkSession

__all__ = ["SCHEMA_DDL", "StrataDataSource", "register"]

#: Spark's Kafka source schema, column for column (DESIGN-NOTES §3), so queries written
#: for ``format("kafka")`` work unchanged.
SCHEMA_DDL: Final = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)


class StrataDataSource(DataSource):
    """Strata topics as a Spark data source: batch and streaming reads, and writes.

    ``spark.read.format("strata")`` / ``spark.readStream.format("strata")`` read with the
    Kafka source's options and schema (``spark_source/README.md``); writes go through
    ``spark_source._sink``.
    """

    @classmethod
    def name(cls) -> str:
        return "strata"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_source._options import parse_source_options
        from spark_source._reader import StrataBatchReader

        return StrataBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark_source._options import parse_source_options
        from spark_source._reader import StrataStreamReader

        return StrataStreamReader(parse_source_options(self.options, streaming=True))

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
