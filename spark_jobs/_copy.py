"""The tier copy: ranges of several partitions into one Delta commit, Arrow end to end.

Why not ``spark.read.format("strata") ... .write.format("delta")``: that path turns every
record's Arrow columns into JVM rows and back into Parquet, and it cost one Spark job
and one commit per partition range. Measured on the 2-core machine (docs/benchmarks.md,
"Tier copy into Delta"): 186,000 records/s copied. Here each Spark task reads its piece of a range
with the Strata client (Arrow), writes it with Arrow's Parquet writer straight into the
table's directory, and hands back what Delta needs to know of the files; the driver
then commits every file of every range in **one** Delta commit (delta-rs), so Spark
schedules the work and no record goes through the JVM.

Exactly once, as before (spark_jobs/README.md): the commit carries one
``txnAppId=strata-tier/<topic>/<partition>``, ``txnVersion=<end offset>`` per range
(Delta's ``txn`` actions, as many as the commit covers), so a rerun reads each
partition's copied end back from the table (``committed_offsets``). Files written by a
job that dies before the commit are in no commit: no reader sees them, and ``VACUUM``
removes them once they are older than its retention. A failed commit deletes them at
once.

Files: ``partition=<p>/date=<yyyy-mm-dd>/part-<piece>-<uuid>.c000.snappy.parquet``,
the table's columns without the partition columns (Delta keeps those in the log);
dictionary encoding only where values repeat (topic, key, timestamp type); Parquet and
Delta statistics only for ``offset`` and ``timestamp``, the columns readers filter on
(tier reads prune by offset, retention cuts by timestamp). ``date`` is the record's
date in the Spark session's time zone, as ``to_date(timestamp)`` gives it.

Typed topics: the tasks read under one version of the value subject, pinned by the
driver for the pass (``TierValue``; ``Consumer(value_schema_version=N)``), and write
``value`` as a struct in the Arrow types Spark reads back as the table's column types
(microsecond timestamps, binary for fixed, Spark's list and map field names).

Transactions (docs/spark.md, "Transactions and the tier"): the tasks read at
read_committed, so a table holds committed records only. The brokers offer only
segments below the last stable offset (DescribeTier), so every range is decided when it
is copied, and the consumer drops aborted transactions batch by batch with the aborted
list of the same fetch answer that carried the batches (never another source's).
Markers and aborted records get no row: their offsets are gaps in the table, and a
piece is done when the consumer's position (which moves past them) reaches its end,
not its last row.

Thread-safety: the driver functions run in the job's thread; ``write_pieces`` runs in
Spark's Python workers, one call per task, and shares nothing. A task that fails
deletes the files it had open; one killed outright leaves them to ``VACUUM``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs._errors import TierGapError, TierLeaseLostError, TierTableMismatchError
from spark_jobs._plan import TierRange
from spark_jobs._tables import TableLocation, app_id
from wire.security import ClientSecurity

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["OFFSETS_PER_PIECE", "CopyPiece", "TierValue", "WrittenFile", "commit_files",
           "copy_ranges", "file_value_type", "write_pieces"]

#: Offsets per Spark task: small enough to spread a range over every core, big enough
#: (about 30 MB of 100-byte records) that a task's fixed cost does not show.
OFFSETS_PER_PIECE: Final = 250_000
#: A piece whose reads make no progress this long fails its task (the leader is gone).
STALL_TIMEOUT_S: Final = 120.0
#: The columns with Parquet and Delta statistics (``delta.dataSkippingStatsColumns``).
STATS_COLUMNS: Final = ("offset", "timestamp")
#: Rows per Parquet row group (about 30 MB of 100-byte records): what a task holds of a
#: file in memory before writing it out.
ROW_GROUP_ROWS: Final = 262_144
#: A task starts a new file after this many rows (a file's last row group may take it a
#: little past). The Spark source reads the tier file by file, each whole, so files of
#: a few tens of MB keep a replay streaming: measured, one 100 MB file per partition
#: replayed 10 % slower than files of this size.
FILE_ROWS: Final = 262_144
#: The columns dictionary-encoded (values repeat); random values and headers are not.
DICTIONARY_COLUMNS: Final = ["topic", "key", "timestampType"]
#: The data file's columns, in the table's order (``partition`` and ``date`` live in
#: the Delta log as partition values).
_FILE_SCHEMA: Final = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()),
                                            pa.field("value", pa.binary())]))),
])


@dataclass(frozen=True, slots=True)
class TierValue:
    """A typed topic's value for one pass: read under ``version`` of its subject, written
    as ``file_type`` (``file_value_type`` of the schema's Arrow type)."""

    version: int
    file_type: pa.DataType


def file_value_type(arrow_type: pa.DataType) -> pa.DataType:
    """The Arrow type a data file holds a typed ``value`` in: the schema's type as Spark's
    Arrow interchange has it (``strata_spark.spark_type``), then Spark's own Arrow form of that
    (binary for fixed, ``element`` list items, non-null map keys)."""
    from pyspark.sql.pandas.types import to_arrow_type

    from strata_spark import spark_type

    return to_arrow_type(spark_type(arrow_type), timezone="UTC")


def _file_schema(value: TierValue | None) -> pa.Schema:
    if value is None:
        return _FILE_SCHEMA
    return _FILE_SCHEMA.set(1, pa.field("value", value.file_type))


@dataclass(frozen=True, slots=True)
class CopyPiece:
    """Offsets ``[start, end)`` of one partition: one Spark task's share of a range."""

    topic: str
    partition: int
    start: int
    end: int
    index: int  # unique within the copy: part of the file names


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """One Parquet file a task wrote into the table's directory, as Delta records it."""

    path: str  # relative to the table root
    size: int
    partition: int
    date: str
    records: int
    stats: str  # Delta's per-file statistics JSON


def pieces_of(ranges: Sequence[TierRange], parallelism: int) -> list[CopyPiece]:
    """Cut the ranges into about ``parallelism`` pieces (a Spark task each costs tens of
    ms: fewer, bigger ones win), but none above ``max(OFFSETS_PER_PIECE, total /
    parallelism)`` offsets, so every core gets work."""
    total = sum(rng.offsets for rng in ranges)
    target = max(OFFSETS_PER_PIECE, math.ceil(total / max(1, parallelism)))
    pieces: list[CopyPiece] = []
    for rng in ranges:
        count = max(1, math.ceil(rng.offsets / target))
        step = math.ceil(rng.offsets / count)
        for start in range(rng.start, rng.end, step):
            pieces.append(CopyPiece(rng.topic, rng.partition, start,
                                    min(rng.end, start + step), len(pieces)))
    return pieces


def copy_ranges(spark: SparkSession, table: TableLocation, ranges: Sequence[TierRange], *,
                bootstrap: str, security: ClientSecurity,
                value: TierValue | None = None) -> list[WrittenFile]:
    """Write the records of ``ranges`` as Parquet files under ``table`` (one Spark job, a
    task per piece); the files, not yet in any commit. ``value``: a typed topic's. The
    tasks reach an object store with their own process's AWS environment."""
    context = spark.sparkContext
    pieces = pieces_of(ranges, context.defaultParallelism)
    if not pieces:
        return []
    writer = partial(write_pieces, root=table.uri, bootstrap=bootstrap, security=security,
                     time_zone=spark.conf.get("spark.sql.session.timeZone") or "UTC",
                     value=value)
    topics = sorted({r.topic for r in ranges})
    context.setJobDescription(f"strata tier copy: {', '.join(topics)} "
                              f"({sum(r.offsets for r in ranges):,} offsets)")
    try:
        return context.parallelize(pieces, len(pieces)).mapPartitions(writer).collect()
    finally:
        context.setJobDescription(None)  # type: ignore[arg-type]


def commit_files(table: TableLocation, ranges: Sequence[TierRange],
                 files: Sequence[WrittenFile]) -> dict[int, int]:
    """Commit ``files`` in one Delta commit carrying every range's ``txnAppId`` and
    ``txnVersion``; records written per partition.

    Refuses (``TierLeaseLostError``) if the table already holds any range's offsets
    (another job wrote meanwhile); the files are then deleted, as after a failed
    commit, since no commit will ever name them.
    """
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

    try:
        delta: DeltaTable = table.open()
        for rng in ranges:
            done = delta.transaction_version(app_id(rng.topic, rng.partition)) or 0
            if done > rng.start:
                raise TierLeaseLostError(
                    f"{rng.topic}-{rng.partition}: the table already holds offsets up to "
                    f"{done}, past this write's start {rng.start}: another job wrote "
                    "meanwhile; this pass stops, and the next one starts from what the "
                    "table holds")
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.size, {"partition": str(f.partition), "date": f.date},
                      now_ms, True, f.stats) for f in files]
        delta.create_write_transaction(
            actions, "append", delta.schema(),
            partition_by=list(delta.metadata().partition_columns),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id(r.topic, r.partition), r.end, now_ms)
                                  for r in ranges],
                custom_metadata={
                    "strata.tier": json.dumps(
                        {f"{r.topic}-{r.partition}": [r.start, r.end] for r in ranges}),
                    # What Spark's Delta writer records for a WRITE (strings, as there),
                    # so DESCRIBE HISTORY and time-travel arithmetic read the same.
                    "operationMetrics": {
                        "numFiles": str(len(files)),
                        "numOutputRows": str(sum(f.records for f in files)),
                        "numOutputBytes": str(sum(f.size for f in files))}}))
    except BaseException:
        # VACUUM removes whatever is left: a store that does not answer ends the clean-up
        # at its first failure (it would fail every file, each after its retries).
        with contextlib.suppress(Exception):
            filesystem, root = table.filesystem()
            for written in files:
                with contextlib.suppress(FileNotFoundError):
                    filesystem.delete_file(f"{root}/{written.path}")
        raise
    records: dict[int, int] = {}
    for written in files:
        records[written.partition] = records.get(written.partition, 0) + written.records
    return records


# --------------------------------------------------------------------------- in the tasks


def write_pieces(pieces: Iterable[CopyPiece], *, root: str, bootstrap: str,
                 security: ClientSecurity, time_zone: str,
                 value: TierValue | None = None) -> Iterator[WrittenFile]:
    """A Spark task: read each piece with the client and stream it into Parquet under
    ``root``: a new file every ``FILE_ROWS`` rows and for each date the piece spans
    (memory: about one row group a date). ``root``: the table's ``TableLocation.uri``."""
    from pyarrow import fs

    filesystem, base = fs.FileSystem.from_uri(root)
    for piece in pieces:
        files: dict[str, _FileWriter] = {}
        try:
            for table in _read_piece(piece, bootstrap, security, value):
                local = table.column("timestamp").cast(pa.timestamp("us", tz=time_zone))
                dates = pc.local_timestamp(local).cast(pa.date32())
                days = pc.unique(dates).to_pylist()
                for day in days:
                    rows = table if len(days) == 1 else \
                        table.filter(pc.equal(dates, pa.scalar(day, pa.date32())))
                    name = day.isoformat()
                    writer = files.get(name)
                    if writer is None:
                        writer = files[name] = _FileWriter(filesystem, base, piece, name,
                                                           _file_schema(value))
                    writer.add(rows)
                    if writer.records >= FILE_ROWS:  # roll: replays read file by file
                        yield writer.close()
                        del files[name]
            for writer in files.values():
                yield writer.close()
        finally:
            for writer in files.values():
                writer.abandon()


def _read_piece(piece: CopyPiece, bootstrap: str, security: ClientSecurity,
                value: TierValue | None = None) -> Iterator[pa.Table]:
    """Offsets ``[start, end)`` of the piece's partition, as they arrive, in the file's
    columns: committed records only (read_committed; the piece lies below the last
    stable offset)."""
    from strata.client import Consumer, IdleTimer, TopicPartition
    from wire.errors import OffsetOutOfRangeError

    tp = TopicPartition(piece.topic, piece.partition)
    fetch_bytes = max(1 << 20, min(64 << 20, (piece.end - piece.start) * 256))
    with Consumer(bootstrap, client_id="strata-tier", security=security,
                  auto_offset_reset="none", max_partition_fetch_bytes=fetch_bytes,
                  fetch_max_bytes=fetch_bytes, isolation_level="read_committed",
                  value_schema_version="latest" if value is None else value.version
                  ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, piece.start)
        position = piece.start
        # Only time inside empty polls is a stall: writing what this generator yielded
        # (a slow object store) may take any time.
        idle = IdleTimer(STALL_TIMEOUT_S * 1000)
        while position < piece.end:
            try:
                idle.start()
                polled = consumer.poll_arrow(timeout_ms=500)
            except OffsetOutOfRangeError as err:
                raise TierGapError(
                    f"{tp.topic}-{tp.partition}: offsets from {position} left the brokers "
                    f"while they were being tiered ({err.message}); the next pass stops "
                    "at the gap") from None
            idle.stop(polled.num_rows)
            if polled.num_rows == 0:
                # Markers and aborted transactions have no row; the consumer's position
                # moves past them all the same (maybe to the end of the piece).
                moved = min(consumer.position(tp), piece.end)
                if moved > position:
                    position = moved
                    idle.progress()
                    continue
                if idle.expired:
                    raise TimeoutError(
                        f"no records of {tp.topic}-{tp.partition} arrived for "
                        f"{STALL_TIMEOUT_S:.0f} s while offsets [{position}, {piece.end}) "
                        "were still to be tiered; check the partition has a live leader")
                continue
            offsets = polled.column("offset")
            last = offsets[-1].as_py()
            if last >= piece.end:
                polled = polled.slice(0, pc.sum(pc.less(offsets, piece.end)).as_py() or 0)
            position = min(last + 1, piece.end)
            if position < piece.end:  # rows may be followed by markers up to the end
                position = max(position, min(consumer.position(tp), piece.end))
            if polled.num_rows:
                yield _file_columns(polled, value)


def _file_columns(polled: pa.Table, value: TierValue | None = None) -> pa.Table:
    """A ``CONSUMER_SCHEMA`` table in the data file's columns (whole-column casts)."""
    schema = _file_schema(value)
    timestamps = polled.column("timestamp").cast(pa.timestamp("ms", tz="UTC")) \
        .cast(pa.timestamp("us", tz="UTC"))
    values = polled.column("value")
    if values.type != schema.field("value").type:
        if pa.types.is_struct(values.type) != pa.types.is_struct(schema.field("value").type):
            raise TierTableMismatchError(
                f"{polled.column('topic')[0]}-{polled.column('partition')[0]}: its values "
                f"are {values.type}, not what the table holds ({schema.field('value').type}); "
                "the topic's typing does not match its table")
        values = values.cast(schema.field("value").type)
    return pa.Table.from_arrays(
        [polled.column("key"), values, polled.column("topic"),
         polled.column("offset"), timestamps, polled.column("timestampType"),
         polled.column("headers").cast(schema.field("headers").type)],
        schema=schema)


class _FileWriter:
    """One data file of a piece: rows gathered into row groups of ``ROW_GROUP_ROWS``,
    statistics kept as they pass; ``abandon`` deletes a file never closed."""

    def __init__(self, filesystem: Any, root: str, piece: CopyPiece, day: str,
                 schema: pa.Schema = _FILE_SCHEMA) -> None:
        import pyarrow.parquet as pq

        self.piece = piece
        self.day = day
        self.relative = (f"partition={piece.partition}/date={day}/"
                         f"part-{piece.index:05d}-{uuid.uuid4()}.c000.snappy.parquet")
        self.full = f"{root}/{self.relative}"
        self._fs = filesystem
        if filesystem.type_name == "local":  # an object store has no directories to make
            os.makedirs(os.path.dirname(self.full), exist_ok=True)
        self._writer: Any = pq.ParquetWriter(
            self.full, schema, filesystem=filesystem, compression="snappy",
            use_dictionary=DICTIONARY_COLUMNS, write_statistics=list(STATS_COLUMNS))
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.records = 0
        self._bounds: list[tuple[int, int, Any, Any]] = []
        self._closed = False

    def add(self, rows: pa.Table) -> None:
        offsets = pc.min_max(rows.column("offset"))
        stamps = pc.min_max(rows.column("timestamp"))
        self._bounds.append((offsets["min"].as_py(), offsets["max"].as_py(),
                             stamps["min"].as_py(), stamps["max"].as_py()))
        self.records += rows.num_rows
        self._pending.append(rows)
        self._pending_rows += rows.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.concat_tables(self._pending),
                                     row_group_size=ROW_GROUP_ROWS)
            self._pending, self._pending_rows = [], 0

    def close(self) -> WrittenFile:
        self._flush()
        self._writer.close()
        self._closed = True
        low = min(b[0] for b in self._bounds)
        high = max(b[1] for b in self._bounds)
        first = min(b[2] for b in self._bounds)
        last = max(b[3] for b in self._bounds)
        stats = json.dumps({
            "numRecords": self.records,
            "minValues": {"offset": low, "timestamp": _delta_timestamp(first)},
            "maxValues": {"offset": high, "timestamp": _delta_timestamp(last)},
            "nullCount": {"offset": 0, "timestamp": 0},
        })
        return WrittenFile(self.relative, self._fs.get_file_info(self.full).size,
                           self.piece.partition,
                           self.day, self.records, stats)

    def abandon(self) -> None:
        """Delete the file unless it was closed (a failed task leaves nothing behind)."""
        if not self._closed:
            with contextlib.suppress(Exception):
                self._writer.close()
            with contextlib.suppress(OSError):
                self._fs.delete_file(self.full)


def _delta_timestamp(value: Any) -> str:
    """A timestamp as Delta's statistics write it: ISO 8601 UTC with milliseconds."""
    moment: datetime = value.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
