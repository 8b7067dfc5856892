"""Strata's Spark jobs: tiering aged segments into Delta, retention and compaction there.

Public API::

    from spark_jobs import TierJob, TierSettings
    with TierJob(spark, TierSettings(bootstrap, Path("warehouse"))) as job:
        report = job.run_once()          # every tier.enable=true topic, or run_once(["t"])

``TierSettings`` takes the brokers' bootstrap servers and the warehouse (a directory,
``file:///path`` or ``s3://bucket[/prefix]``: ``strata_spark.Warehouse``; then
batch size, retention and lease settings, ``security``); the job reaches ZooKeeper only
through the brokers (its lease and progress: TierLease, UpdateTier).

``register_tables(spark, warehouse)`` registers ``strata.<topic>`` (and
``strata_compacted.<topic>``) in a session's catalog; ``tier_table(warehouse, topic)``
is where a topic's history is (a ``TableLocation``: its delta-rs and Spark URIs).
``spark_jobs.metrics.JobMetrics`` exports a long-running job's Prometheus metrics.
See spark_jobs/README.md.
"""

from spark_jobs._errors import (
    TierConfigError,
    TierGapError,
    TierLeaseLostError,
    TierNotEnabledError,
    TierStoreUnreachableError,
    TierTableMismatchError,
)
from spark_jobs._job import PartitionReport, TierJob, TierReport, TierSettings, TopicReport
from spark_jobs._plan import TierRange, plan_partition
from spark_jobs._tables import (
    CATALOG_DB,
    COMPACTED_DB,
    TableLocation,
    app_id,
    catalog_name,
    compacted_path,
    compacted_table,
    register_tables,
    table_path,
    tier_table,
    tiered_topics,
)

__all__ = [
    "CATALOG_DB",
    "COMPACTED_DB",
    "PartitionReport",
    "TableLocation",
    "TierConfigError",
    "TierGapError",
    "TierJob",
    "TierLeaseLostError",
    "TierNotEnabledError",
    "TierRange",
    "TierReport",
    "TierSettings",
    "TierStoreUnreachableError",
    "TierTableMismatchError",
    "TopicReport",
    "app_id",
    "catalog_name",
    "compacted_path",
    "compacted_table",
    "plan_partition",
    "register_tables",
    "table_path",
    "tier_table",
    "tiered_topics",
]
