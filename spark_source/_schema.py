"""The source's schema as Spark DDL: Spark's Kafka source schema, column for column.

Its own module, below everything else in the package, because two sides need it:
``_datasource`` (the schema of writes and of reads of bytes topics; Spark's data source
lookup imports that module in every session, so this one imports nothing, not even
pyarrow) and ``_values`` (typed topics' schemas are the same columns with a struct
``value``). The Arrow form of the same columns is ``_arrow.SPARK_ARROW_SCHEMA``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SCHEMA_DDL"]

#: Spark's Kafka source schema, column for column (spark_source/README.md, "Schema"), so
#: queries written for ``format("kafka")`` work unchanged.
SCHEMA_DDL: Final = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)
