"""The compacted table of a ``cleanup.policy=compact`` topic: the latest record per key.

Kept with one ``MERGE`` per partition and pass (delta-rs: ``_commits.merge_latest``;
Spark only finds the latest row per key), from the rows of the topic's tier table
the compacted table does not have yet (so it never reads the brokers twice):

* within the range, only the newest record of each (partition, key) counts;
* ``MERGE ... ON partition AND key``: a newer offset replaces the stored row, an unknown
  key is inserted. The ``s.offset > t.offset`` guard makes a rerun of the same range a
  no-op. What is merged has its own progress in ZooKeeper (``merged_up_to``, written
  after the MERGE), so a pass that failed or was killed before or during a MERGE is
  redone from the tier table by the next pass;
* a tombstone (null value) is stored like any record, and deleted once it is older than
  ``delete.retention.ms`` (Kafka keeps tombstones that long so consumers see deletes);
* records with a null key cannot be compacted (Kafka refuses them on compacted topics)
  and are left out of the compacted table; they stay in the tier table.

Keys are matched per partition, as Kafka compacts per partition.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_jobs._commits import create_table, delete_tombstones, merge_latest
from spark_jobs._tables import TableLocation, compacted_table
from strata_spark import Warehouse

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["COMPACTED_DDL", "compact_range", "compacted_ddl", "drop_tombstones"]

COMPACTED_DDL = ("key BINARY, value BINARY, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                 "headers ARRAY<STRUCT<key: STRING, value: BINARY>>")


def compacted_ddl(value_type: pa.StructType | None) -> str:
    """``COMPACTED_DDL``, with ``value`` a typed topic's struct when ``value_type`` is
    given (the tier table's, ``tier_ddl``)."""
    if value_type is None:
        return COMPACTED_DDL
    from strata_spark import spark_arrow_type, spark_ddl

    # No NOT NULL inside value: the table holds several versions' rows (spark_ddl).
    struct = f"value STRUCT<{spark_ddl(spark_arrow_type(value_type), not_null=False)}>"
    return COMPACTED_DDL.replace("value BINARY", struct, 1)


def compact_range(spark: SparkSession, warehouse: Warehouse, topic: str,
                  tier_table: TableLocation,
                  partition: int, start: int, end: int, *,
                  value_type: pa.StructType | None = None,
                  properties: dict[str, str] | None = None) -> int:
    """Merge offsets ``[start, end)`` of ``partition`` (read from the tier table) into the
    compacted table; returns how many keys the range carried. ``value_type``: a typed
    topic's value struct (the table is created with it, and ``properties``)."""
    target = compacted_table(warehouse, topic)
    create_table(spark, target, compacted_ddl(value_type), ["partition"], properties or {})
    latest = spark.sql(f"""
        SELECT key, value, partition, offset, timestamp, headers FROM (
          SELECT *, row_number() OVER (PARTITION BY partition, key ORDER BY offset DESC) AS n
          FROM {tier_table.sql}
          WHERE partition = {partition} AND offset >= {start} AND offset < {end}
            AND key IS NOT NULL)
        WHERE n = 1""")
    # At most one row per key of the range reaches the driver, as Arrow.
    return merge_latest(target, latest.toArrow(), partition)


def drop_tombstones(spark: SparkSession, warehouse: Warehouse, topic: str,
                    delete_retention_ms: int) -> None:
    """Delete tombstones older than ``delete.retention.ms`` from the compacted table;
    skipped (no commit) when the file statistics show no null value old enough (a file
    without a null count or a minimum timestamp is read)."""
    target = compacted_table(warehouse, topic)
    if not target.exists():
        return
    cutoff_ms = int(time.time() * 1000) - delete_retention_ms
    files = pa.table(target.open().get_add_actions(flatten=True))
    if "null_count.value" in files.column_names and "min.timestamp" in files.column_names:
        candidates = [ts for nulls, ts in zip(files.column("null_count.value").to_pylist(),
                                              files.column("min.timestamp").to_pylist(),
                                              strict=True)
                      # No null count (delta-rs records none for binary): may have nulls.
                      if (nulls is None or nulls > 0)
                      and (ts is None or ts.timestamp() * 1000 < cutoff_ms)]
        if not candidates:
            return
    delete_tombstones(target, cutoff_ms)
