"""Where the tier tables live, how they are created, and how Spark's catalog finds them.

Layout under the warehouse (a directory, or a prefix of an S3 bucket: ``strata_spark.
Warehouse``; one Delta table per topic)::

    <warehouse>/topics/<topic>       every tiered record: the Spark source's schema + ``date``,
                                     partitioned by (partition, date)
    <warehouse>/compacted/<topic>    cleanup.policy=compact topics only: the latest record
                                     per key (tombstones kept until delete.retention.ms)

Two directories rather than a ``<topic>_compacted`` suffix because a topic may itself be
called ``x_compacted``. Tables are created, and every commit to them made, by delta-rs
(``_commits``: put-if-absent commits on any store), with deletion vectors off.

Typed topics (docs/typed-topics.md): ``value`` is a struct of the topic's value schema
(``tier_ddl``: ``strata_spark.spark_ddl`` of the types Spark's Arrow interchange has),
and the table records the subject and version its ``value`` has in the properties
``strata.valueSubject`` / ``strata.valueSchemaVersion``. When the subject gets a new
version that only adds fields, the job adds them to the table (delta-rs, at the end of
their struct: ``_commits.add_fields``) before it writes rows of that version; any other
change of ``value`` is refused (``TierTableMismatchError``), never made silently.

Catalog names: ``strata.<name>`` and ``strata_compacted.<name>``, where ``<name>`` is the
topic with every character outside ``[A-Za-z0-9_]`` replaced by ``_`` (Spark's session
catalog accepts nothing else: ``events-v1.raw`` is ``strata.events_v1_raw``); when two
topics map to one name, the first in name order gets it and the other is left out with
a warning (query it by path: ``delta.`<warehouse>/topics/<topic>```). The local Spark
here has no Hive metastore, so the catalog lives as long as a session; the job and
``register_tables`` (used by the notebooks) register every table found in the warehouse.

A table is named by a ``TableLocation``: the same table as delta-rs and pyarrow reach it
(``uri``: a local path or ``s3://...``, with ``storage_options``), as Spark does
(``spark_uri``: the path or ``s3a://...``), and as SQL names it (``sql``). ``uri`` is
also what ZooKeeper records as the topic's table and what messages show; for a local
warehouse it is the resolved path, as it always was.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from strata_spark import Warehouse

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["CATALOG_DB", "COMPACTED_DB", "TIER_DDL", "TIER_PROPERTIES", "TOPIC_ID_PROPERTY",
           "VALUE_SUBJECT_PROPERTY", "VALUE_VERSION_PROPERTY", "TableLocation", "app_id",
           "as_warehouse", "catalog_name", "committed_offsets", "compacted_path",
           "compacted_table", "register_tables", "table_path",
           "table_properties", "table_topic_id", "tier_ddl", "tier_table", "tiered_topics"]

log = logging.getLogger("strata.spark_jobs.tables")

CATALOG_DB = "strata"
COMPACTED_DB = "strata_compacted"

#: The tier table's columns: the Spark source's schema, then the UTC date of ``timestamp``.
TIER_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
            "timestamp TIMESTAMP, timestampType INT, "
            "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, date DATE")

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


def as_warehouse(warehouse: Warehouse | str | os.PathLike[str]) -> Warehouse:
    """``warehouse`` as a ``Warehouse`` (parsed when given as text or a path; a local one
    with its path resolved, the form tables were always recorded under). Raises
    ``InvalidWarehouseError`` for a location Strata cannot use."""
    parsed = warehouse if isinstance(warehouse, Warehouse) else Warehouse.parse(warehouse)
    if parsed.path is not None:
        return Warehouse(path=parsed.path.resolve())
    return parsed


@dataclass(frozen=True, slots=True)
class TableLocation:
    """One Delta table of a warehouse (``folder`` is ``topics`` or ``compacted``).

    Immutable; every method reaches the store anew (delta-rs and pyarrow read the AWS
    environment when they are called, as the module docstring of ``strata_spark.
    Warehouse`` says)."""

    warehouse: Warehouse
    folder: str
    topic: str

    @property
    def uri(self) -> str:
        """delta-rs's and pyarrow's location: the path, or ``s3://bucket/prefix/...``."""
        return self.warehouse.delta_uri(self.folder, self.topic)

    @property
    def spark_uri(self) -> str:
        """Spark's location: the path, or ``s3a://bucket/prefix/...``."""
        return self.warehouse.spark_uri(self.folder, self.topic)

    @property
    def sql(self) -> str:
        """The table in Spark SQL: ``delta.`<spark_uri>```."""
        return "delta.`" + self.spark_uri.replace("`", "``") + "`"

    @property
    def storage_options(self) -> dict[str, str]:
        return self.warehouse.storage_options()

    def __str__(self) -> str:
        return self.uri

    def exists(self) -> bool:
        """Whether a Delta table is there."""
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options))

    def open(self) -> Any:
        """The table's latest version (delta-rs ``DeltaTable``)."""
        from deltalake import DeltaTable

        return DeltaTable(self.uri, storage_options=self.storage_options)

    def filesystem(self) -> tuple[Any, str]:
        """``(pyarrow FileSystem, path of the table's root in it)``: how the copy's tasks
        write data files and a failed commit deletes them."""
        from pyarrow import fs

        filesystem, root = fs.FileSystem.from_uri(self.uri)
        return filesystem, root


def tier_table(warehouse: Warehouse, topic: str) -> TableLocation:
    """``topic``'s tier table (``<warehouse>/topics/<topic>``)."""
    return TableLocation(warehouse, "topics", topic)


def compacted_table(warehouse: Warehouse, topic: str) -> TableLocation:
    """``topic``'s compacted table (``<warehouse>/compacted/<topic>``)."""
    return TableLocation(warehouse, "compacted", topic)


def table_properties(table: TableLocation) -> dict[str, str]:
    """The table's properties (empty: no table)."""
    if not table.exists():
        return {}
    return {k: str(v) for k, v in table.open().metadata().configuration.items()}


def table_path(warehouse: Path, topic: str) -> Path:
    """The tier table of ``topic`` in a local warehouse (``tier_table`` for any)."""
    return warehouse / "topics" / topic


def compacted_path(warehouse: Path, topic: str) -> Path:
    """The compacted table of ``topic`` in a local warehouse (``compacted_table`` for any)."""
    return warehouse / "compacted" / topic


def app_id(topic: str, partition: int) -> str:
    """The Delta ``txnAppId`` of one partition's tier writes (``txnVersion`` = end offset)."""
    return f"strata-tier/{topic}/{partition}"


def catalog_name(topic: str) -> str:
    """The table name of ``topic`` in the ``strata`` databases (see the module docstring)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", topic)


def _sql_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def table_topic_id(table: TableLocation) -> str | None:
    """The ``strata.topicId`` property of ``table`` (None: no table, or none recorded):
    which incarnation of a topic name the table's history belongs to."""
    if not table.exists():
        return None
    value = table.open().metadata().configuration.get(TOPIC_ID_PROPERTY)
    return None if value is None else str(value)


def committed_offsets(table: TableLocation, topic: str, partitions: list[int]
                      ) -> dict[int, int]:
    """Per partition, the end offset of the last write the table holds (0: none).

    Read from the Delta log's ``txn`` actions with delta-rs: no Spark job, no data read.
    """
    if not table.exists():
        return dict.fromkeys(partitions, 0)
    opened = table.open()
    return {p: opened.transaction_version(app_id(topic, p)) or 0 for p in partitions}


def tiered_topics(warehouse: Warehouse | str | os.PathLike[str]) -> list[str]:
    """The topics that have a tier table in ``warehouse`` (sorted)."""
    where = as_warehouse(warehouse)
    return [topic for topic in _topics_in(where, "topics") if tier_table(where, topic).exists()]


def _topics_in(warehouse: Warehouse, folder: str) -> list[str]:
    """The names under ``<warehouse>/<folder>/`` (directories, or S3 prefixes), sorted."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(warehouse.delta_uri(folder))
    infos = filesystem.get_file_info(fs.FileSelector(root, allow_not_found=True))
    return sorted(info.base_name for info in infos if info.type == fs.FileType.Directory)


def register_tables(spark: SparkSession,
                    warehouse: Warehouse | str | os.PathLike[str]) -> list[str]:
    """Register every tier table of ``warehouse`` (a directory, or an ``s3://`` location
    the session's S3A settings reach: ``Warehouse.spark_conf``) in the session catalog;
    returns the names."""
    where = as_warehouse(warehouse)
    names: list[str] = []
    for db, folder in ((CATALOG_DB, "topics"), (COMPACTED_DB, "compacted")):
        topics = _topics_in(where, folder)
        if not topics:
            continue
        if not spark.catalog.databaseExists(db):  # IF NOT EXISTS would warn every pass
            spark.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
        taken: dict[str, str] = {}
        for topic in topics:
            table = TableLocation(where, folder, topic)
            if not table.exists():
                continue
            short = catalog_name(topic)
            if taken.setdefault(short, topic) != topic:
                log.warning("topic %r maps to %s.%s like topic %r; query it by path: %s",
                            topic, db, short, taken[short], table.sql)
                continue
            name = f"{db}.{short}"
            spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA "
                      f"LOCATION '{_sql_literal(table.spark_uri)}'")
            names.append(name)
    return names
