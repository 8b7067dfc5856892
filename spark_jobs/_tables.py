"""Where the tier tables live, how they are created, and how Spark's catalog finds them.

Layout under the warehouse directory (one Delta table per topic)::

    <warehouse>/topics/<topic>       every tiered record: the Spark source's schema + ``date``,
                                     partitioned by (partition, date)
    <warehouse>/compacted/<topic>    cleanup.policy=compact topics only: the latest record
                                     per key (tombstones kept until delete.retention.ms)

Two directories rather than a ``<topic>_compacted`` suffix because a topic may itself be
called ``x_compacted``. Tables are created with deletion vectors off: total retention
deletes rows, and the Spark source reads the tier with delta-rs in Spark's Python
workers, where plain rewritten Parquet files are the simplest thing to read correctly.

Typed topics (docs/typed-topics.md): ``value`` is a struct of the topic's value schema
(``tier_ddl``: ``strata_spark.spark_ddl`` of the types Spark's Arrow interchange has),
and the table records the subject and version its ``value`` has in the properties
``strata.valueSubject`` / ``strata.valueSchemaVersion``. When the subject gets a new
version that only adds fields, the job adds them to the table (``ALTER TABLE ... ADD
COLUMNS``) before it writes rows of that version; any other change of ``value`` is
refused (``TierTableMismatchError``), never made silently.

Catalog names: ``strata.<name>`` and ``strata_compacted.<name>``, where ``<name>`` is the
topic with every character outside ``[A-Za-z0-9_]`` replaced by ``_`` (Spark's session
catalog accepts nothing else: ``events-v1.raw`` is ``strata.events_v1_raw``); when two
topics map to one name, the first in name order gets it and the other is left out with
a warning (query it by path: ``delta.`<warehouse>/topics/<topic>```). The local Spark
here has no Hive metastore, so the catalog lives as long as a session; the job and
``register_tables`` (used by the notebooks) register every table found in the warehouse.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["CATALOG_DB", "COMPACTED_DB", "TIER_DDL", "TIER_PROPERTIES", "TOPIC_ID_PROPERTY",
           "VALUE_SUBJECT_PROPERTY", "VALUE_VERSION_PROPERTY", "app_id", "tier_ddl",
           "table_properties",
           "catalog_name", "table_topic_id",
           "committed_offsets",
           "compacted_path", "ensure_table", "register_tables", "table_path"]

log = logging.getLogger("strata.spark_jobs.tables")

CATALOG_DB = "strata"
COMPACTED_DB = "strata_compacted"

#: The tier table's columns: the Spark source's schema, then the UTC date of ``timestamp``.
TIER_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
            "timestamp TIMESTAMP, timestampType INT, "
            "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, date DATE")

_TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false"}
#: The tier table's own properties: Delta statistics only for the columns readers filter
#: on (tier reads prune by offset, retention cuts by timestamp; the partition columns
#: are in the log anyway). Statistics of the binary and nested columns cost more to
#: collect than the whole rest of a write (docs/benchmarks.md, "Tier copy into Delta").
TIER_PROPERTIES = {"delta.dataSkippingStatsColumns": "offset,timestamp"}
#: Table property naming the topic id whose history the table holds: a topic deleted and
#: re-created under the same name is another topic, and must not append to the old table.
TOPIC_ID_PROPERTY = "strata.topicId"


#: Table properties of a typed topic's table: its value subject, and the version of it
#: the table's ``value`` column has.
VALUE_SUBJECT_PROPERTY = "strata.valueSubject"
VALUE_VERSION_PROPERTY = "strata.valueSchemaVersion"


def tier_ddl(value_type: pa.StructType | None) -> str:
    """``TIER_DDL``, with ``value`` a struct of ``value_type`` (a typed topic's value
    schema, ``ParsedSchema.arrow_type``) when one is given."""
    if value_type is None:
        return TIER_DDL
    from strata_spark import spark_arrow_type, spark_ddl

    # No NOT NULL inside value: the table holds several versions' rows (spark_ddl).
    struct = f"value STRUCT<{spark_ddl(spark_arrow_type(value_type), not_null=False)}>"
    return TIER_DDL.replace("value BINARY", struct, 1)


def table_properties(path: Path) -> dict[str, str]:
    """The table's properties (empty: no table)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return {}
    return {k: str(v) for k, v in DeltaTable(str(path)).metadata().configuration.items()}


def table_path(warehouse: Path, topic: str) -> Path:
    return warehouse / "topics" / topic


def compacted_path(warehouse: Path, topic: str) -> Path:
    return warehouse / "compacted" / topic


def app_id(topic: str, partition: int) -> str:
    """The Delta ``txnAppId`` of one partition's tier writes (``txnVersion`` = end offset)."""
    return f"strata-tier/{topic}/{partition}"


def catalog_name(topic: str) -> str:
    """The table name of ``topic`` in the ``strata`` databases (see the module docstring)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", topic)


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "\\'")


def ensure_table(spark: SparkSession, path: Path, ddl: str, partitioned_by: str,
                 properties: dict[str, str] | None = None) -> None:
    """Create an empty Delta table at ``path`` unless one is there (idempotent)."""
    props = ", ".join(f"'{k}' = '{v}'" for k, v in
                      {**_TABLE_PROPERTIES, **(properties or {})}.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{_sql_path(path)}` ({ddl}) USING DELTA "
              f"PARTITIONED BY ({partitioned_by}) TBLPROPERTIES ({props})")


def table_topic_id(path: Path) -> str | None:
    """The ``strata.topicId`` property of the table at ``path`` (None: no table, or none
    recorded): which incarnation of a topic name the table's history belongs to."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return None
    value = DeltaTable(str(path)).metadata().configuration.get(TOPIC_ID_PROPERTY)
    return None if value is None else str(value)


def committed_offsets(path: Path, topic: str, partitions: list[int]) -> dict[int, int]:
    """Per partition, the end offset of the last write the table holds (0: none).

    Read from the Delta log's ``txn`` actions with delta-rs: no Spark job, no data read.
    """
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return dict.fromkeys(partitions, 0)
    table = DeltaTable(str(path))
    return {p: table.transaction_version(app_id(topic, p)) or 0 for p in partitions}


def register_tables(spark: SparkSession, warehouse: Path) -> list[str]:
    """Register every tier table of ``warehouse`` in the session catalog; returns the names."""
    from deltalake import DeltaTable

    names: list[str] = []
    for db, folder in ((CATALOG_DB, "topics"), (COMPACTED_DB, "compacted")):
        root = warehouse / folder
        if not root.is_dir():
            continue
        if not spark.catalog.databaseExists(db):  # IF NOT EXISTS would warn every pass
            spark.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
        taken: dict[str, str] = {}
        for path in sorted(root.iterdir()):
            if not DeltaTable.is_deltatable(str(path)):
                continue
            short = catalog_name(path.name)
            if taken.setdefault(short, path.name) != path.name:
                log.warning("topic %r maps to %s.%s like topic %r; query it by path: "
                            "delta.`%s`", path.name, db, short, taken[short], path)
                continue
            name = f"{db}.{short}"
            spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA "
                      f"LOCATION '{_sql_path(path)}'")
            names.append(name)
    return names
