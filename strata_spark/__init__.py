"""The Spark layer under the Spark source (``spark_source``) and the tiering job
(``spark_jobs``): what both need of Spark and neither owns.

- ``spark_session(name)``: the one way to build a SparkSession from the package's Spark
  configuration (``strata_spark/conf/``; the checkout's ``conf/`` links there), with a
  ``local`` session's driver kept on the loopback (``loopback_defaults``) and the JVM's
  routine start-up output held back (``is_startup_noise``).
- The Spark type mapping of typed topics: ``spark_arrow_type`` (the Arrow types Spark's
  Arrow interchange takes), ``spark_type`` (the Spark type of an Arrow type) and
  ``spark_ddl`` (Spark DDL for a struct).
- ``Warehouse``: where the Delta warehouse lives (a directory or ``s3://bucket/prefix``),
  validated, with the Spark settings and delta-rs storage options it needs.

It sits below both and above ``wire`` (brokers/README.md, "Layers"), imports no other
Strata package, and imports pyspark only inside the functions that need it, so importing
it needs no Spark. ``strata.spark`` is the older name of the session helper and still
works.
"""

from strata_spark._session import (
    BIND_CONF_KEYS,
    BIND_ENV_VARS,
    IVY_SETTINGS,
    LOOPBACK,
    REPO_CONF_DIR,
    configured_packages,
    is_startup_noise,
    loopback_defaults,
    spark_session,
)
from strata_spark._types import spark_arrow_type, spark_ddl, spark_type
from strata_spark._warehouse import (
    HADOOP_AWS_PACKAGE,
    InvalidWarehouseError,
    UnsafeWarehouseError,
    Warehouse,
    s3_endpoint,
)

__all__ = [
    "BIND_CONF_KEYS",
    "BIND_ENV_VARS",
    "HADOOP_AWS_PACKAGE",
    "IVY_SETTINGS",
    "InvalidWarehouseError",
    "LOOPBACK",
    "REPO_CONF_DIR",
    "UnsafeWarehouseError",
    "Warehouse",
    "configured_packages",
    "is_startup_noise",
    "loopback_defaults",
    "s3_endpoint",
    "spark_arrow_type",
    "spark_ddl",
    "spark_session",
    "spark_type",
]
