"""The compacted table of a ``cleanup.policy=compact`` topic: the latest record per key.

Kept with one ``MERGE`` per tiered range, from the rows that range just added to the
topic's tier table (so it never reads the brokers twice):

* within the range, only the newest record of each (partition, key) counts;
* ``MERGE ... ON partition AND key``: a newer offset replaces the stored row, an unknown
  key is inserted. The ``s.offset > t.offset`` guard makes a rerun of the same range a
  no-op, so a job killed between the tier commit and this MERGE repairs itself;
* a tombstone (null value) is stored like any record, and deleted once it is older than
  ``delete.retention.ms`` (Kafka keeps tombstones that long so consumers see deletes);
* records with a null key cannot be compacted (Kafka refuses them on compacted topics)
  and are left out of the compacted table; they stay in the tier table.

Keys are matched per partition, as Kafka compacts per partition.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs._plan import TierRange
from spark_jobs._tables import compacted_path, ensure_table

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["COMPACTED_DDL", "compact_range"]

COMPACTED_DDL = ("key BINARY, value BINARY, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                 "headers ARRAY<STRUCT<key: STRING, value: BINARY>>")


def compact_range(spark: SparkSession, warehouse: Path, topic: str, tier_table: Path,
                  rng: TierRange, *, delete_retention_ms: int) -> int:
    """Merge ``rng``'s records into the compacted table; returns the keys it carried."""
    target = compacted_path(warehouse.resolve(), topic)
    ensure_table(spark, target, COMPACTED_DDL, "partition")
    view = f"strata_compact_{abs(hash((topic, rng.partition, rng.start)))}"
    latest = spark.sql(f"""
        SELECT key, value, partition, offset, timestamp, headers FROM (
          SELECT *, row_number() OVER (PARTITION BY partition, key ORDER BY offset DESC) AS n
          FROM delta.`{tier_table}`
          WHERE partition = {rng.partition} AND offset >= {rng.start} AND offset < {rng.end}
            AND key IS NOT NULL)
        WHERE n = 1""")
    latest.createOrReplaceTempView(view)
    try:
        keys = latest.count()
        spark.sql(f"""
            MERGE INTO delta.`{target}` AS t USING {view} AS s
            ON t.partition = s.partition AND t.key = s.key
            WHEN MATCHED AND s.offset > t.offset THEN UPDATE SET *
            WHEN NOT MATCHED THEN INSERT *""")
    finally:
        spark.catalog.dropTempView(view)
    cutoff_ms = int(time.time() * 1000) - delete_retention_ms
    spark.sql(f"DELETE FROM delta.`{target}` WHERE value IS NULL "
              f"AND timestamp < timestamp_millis({cutoff_ms})")
    return keys
