"""Every commit the tier job makes to a Delta table, through delta-rs.

One writer library for the Delta log, whatever the warehouse: the copy's commit
(``_copy.commit_files``) and everything here (create, the retention ``DELETE``,
``VACUUM``, ``OPTIMIZE``, the compacted table's ``MERGE`` and tombstone delete, adding a
typed value's fields and recording its version). Spark computes (the copy's Parquet
files, the compaction's latest row per key) and reads; it never commits.

Why: a commit is the write of ``_delta_log/<N>.json``, and two writers must never both
write version N. delta-rs writes it put-if-absent everywhere: on a local disk by an
atomic rename that refuses an existing target, on S3 by a conditional ``PUT``
(``If-None-Match: *``; S3 and the S3-compatible stores that implement it refuse the
second writer with 412). The loser re-reads the log, checks its operation against what
won (delta-rs's conflict checker) and commits N+1, or fails with ``CommitFailedError``;
it never overwrites. Spark's Delta 4.4 on ``s3a://`` uses ``S3SingleDriverLogStore``,
which checks for N and then writes it with a plain ``PUT``: a second driver between the
check and the write would replace the first's commit (and with it, say, a copy commit
whose offsets ZooKeeper already counts as tiered). The tier lease makes one job at a
time, but a job that stalls (GC, SIGSTOP, a slow store) longer than its lease between
its last lease check and its commit would be such a second driver; with every commit
put-if-absent, the stalled job's late commit is refused or rebased instead, and the lease
only saves work.

Crash behaviour: each function is one commit (``vacuum``: delta-rs's ``VACUUM START`` and
``VACUUM END``); a process killed before it leaves the table at the previous version,
and files written for a commit that never happened are unreferenced, for ``VACUUM``.

Thread-safety: none needed; every call opens the table's latest version anew.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs._tables import TableLocation

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["add_fields", "arrow_schema", "create_table", "delete_rows", "delete_tombstones",
           "merge_latest", "nullable", "optimize", "set_properties", "vacuum"]

#: Properties every table the job creates carries: deletion vectors off (total retention
#: deletes rows, and the Spark source reads with delta-rs in Spark's Python workers,
#: where plain rewritten Parquet files are the simplest thing to read correctly).
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false"}


def arrow_schema(spark: SparkSession, ddl: str) -> pa.Schema:
    """The Arrow schema of a Spark DDL column list, as Spark's Arrow interchange has it
    (``TIMESTAMP`` is microseconds in UTC, what Delta calls ``timestamp``)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = _parse_datatype_string(ddl)
    assert isinstance(struct, StructType), ddl
    _ = spark  # the parser needs a running SparkContext: the caller's
    return to_arrow_schema(struct, timezone="UTC")


def create_table(spark: SparkSession, table: TableLocation, ddl: str,
                 partitioned_by: Iterable[str], properties: Mapping[str, str]) -> None:
    """Create an empty Delta table at ``table`` unless one is there (idempotent; of two
    jobs creating it at once, one commits version 0 and the other finds it there)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    if table.exists():
        return
    try:
        DeltaTable.create(table.uri, schema=arrow_schema(spark, ddl), mode="ignore",
                          partition_by=list(partitioned_by),
                          configuration={**TABLE_PROPERTIES, **properties},
                          storage_options=table.storage_options or None,
                          raise_if_key_not_exists=False)
    except CommitFailedError:
        if not table.exists():
            raise


def delete_rows(table: TableLocation, predicate: str) -> int:
    """``DELETE FROM table WHERE predicate`` (SQL as DataFusion reads it: quote column
    names that are keywords, ``"offset"``); the rows deleted."""
    metrics = table.open().delete(predicate)
    return int(metrics.get("num_deleted_rows", 0))


def vacuum(table: TableLocation, retain_hours: float) -> int:
    """Delete the files no version younger than ``retain_hours`` needs (rounded up to
    whole hours, delta-rs's unit: never fewer hours than asked); the files deleted.

    From one hour up, also the files no commit names (a killed copy's) once they are
    that old, as Spark's ``VACUUM`` does (delta-rs's ``full``). Below an hour only the
    files commits removed: a full sweep works from this job's view of the table, and a
    job stalled past its lease would take the files another job committed meanwhile for
    unnamed ones; with at least an hour's age required, only a stall of more than that
    could (``tests/test_warehouse_s3.py`` shows both).

    The job's ``vacuum_retain_hours`` is the operator's choice, so delta-rs's check
    against ``delta.deletedFileRetentionDuration`` is not applied (Spark's
    ``retentionDurationCheck``, which the job used to turn off below a week)."""
    hours = math.ceil(retain_hours)
    removed = table.open().vacuum(retention_hours=hours, dry_run=False,
                                  enforce_retention_duration=False, full=hours >= 1)
    return len(removed)


def optimize(table: TableLocation) -> dict[str, Any]:
    """Bin-pack each partition's small files into larger ones; delta-rs's metrics."""
    return dict(table.open().optimize.compact())


def merge_latest(table: TableLocation, rows: pa.Table, partition: int) -> int:
    """Merge the latest row per key of one partition (``rows``) into a compacted table:
    a newer offset replaces the stored row, an unknown key is inserted, a row the table
    already has at that offset or later changes nothing (so a rerun is a no-op). The
    rows given (``numSourceRows``)."""
    if rows.num_rows == 0:
        return 0
    metrics = (table.open()
               .merge(rows, predicate=f"t.partition = {int(partition)} AND "
                                      "t.partition = s.partition AND t.key = s.key",
                      source_alias="s", target_alias="t")
               .when_matched_update_all(predicate="s.offset > t.offset")
               .when_not_matched_insert_all()
               .execute())
    return int(metrics.get("num_source_rows", rows.num_rows))


def delete_tombstones(table: TableLocation, cutoff_ms: int) -> int:
    """Delete the tombstones (null ``value``) of a compacted table whose ``timestamp`` is
    older than ``cutoff_ms``; the rows deleted (0: no commit).

    Found with a scan, then deleted by ``MERGE ... WHEN MATCHED DELETE`` on (partition,
    key, offset): delta-rs cannot take ``value IS NULL`` in a ``DELETE`` predicate when
    ``value`` is a typed topic's struct."""
    opened = table.open()
    cutoff = pa.scalar(cutoff_ms * 1000, pa.timestamp("us", tz="UTC"))
    found = opened.to_pyarrow_dataset().to_table(
        columns=["partition", "key", "offset"],
        filter=pc.field("value").is_null() & (pc.field("timestamp") < cutoff))
    if found.num_rows == 0:
        return 0
    partitions = ", ".join(str(p) for p in sorted(set(found.column("partition").to_pylist())))
    metrics = (opened
               .merge(found, predicate=f"t.partition IN ({partitions}) AND "
                                       "t.partition = s.partition AND t.key = s.key AND "
                                       "t.offset = s.offset",
                      source_alias="s", target_alias="t")
               .when_matched_delete()
               .execute())
    return int(metrics.get("num_target_rows_deleted", 0))


def add_fields(table: TableLocation, column: str, arrow_type: pa.DataType) -> None:
    """Widen struct ``column`` to ``arrow_type`` (which holds every field it has, and
    more), every field nullable (rows written before have none of the new ones). Delta
    appends each new field at the end of its struct; readers match fields by name, so
    the order of a data file's fields does not matter."""
    from deltalake.schema import Field

    table.open().alter.add_columns([Field.from_arrow(pa.field(column, nullable(arrow_type)))])


def nullable(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` with every nested field nullable (a map's keys stay required)."""
    if pa.types.is_struct(arrow_type):
        return pa.struct([pa.field(f.name, nullable(f.type), True, f.metadata)
                          for f in arrow_type])
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(pa.field(arrow_type.value_field.name,
                                      nullable(arrow_type.value_type), True))
    if pa.types.is_list(arrow_type):
        return pa.list_(pa.field(arrow_type.value_field.name,
                                 nullable(arrow_type.value_type), True))
    if pa.types.is_map(arrow_type):
        return pa.map_(arrow_type.key_field, pa.field(arrow_type.item_field.name,
                                                      nullable(arrow_type.item_type), True))
    return arrow_type


def set_properties(table: TableLocation, properties: Mapping[str, str]) -> None:
    """Set table properties (Strata's own ``strata.*`` keys included)."""
    table.open().alter.set_table_properties(dict(properties), raise_if_not_exists=False)
