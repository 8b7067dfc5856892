"""Spark Structured Streaming connector for Strata topics (``format("strata")``).

Reading mirrors Spark's Kafka source: same schema, same option names (see
``spark_source/README.md``). Spark registers the format by itself through the top-level
``pyspark_strata`` module; ``register(spark)`` does it explicitly.

Layering (brokers/README.md, "Layers"): this package talks to brokers only through
``strata.client``; its own modules' order is in spark_source/README.md.
"""

from spark_source._datasource import SCHEMA_DDL, StrataDataSource, register
from spark_source._errors import (
    StrataSparkDataLossError,
    StrataSparkOptionError,
    StrataSparkTierError,
)

__all__ = [
    "SCHEMA_DDL",
    "StrataDataSource",
    "StrataSparkDataLossError",
    "StrataSparkOptionError",
    "StrataSparkTierError",
    "register",
]
