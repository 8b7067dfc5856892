"""The tiering job: copy aged closed segments into Delta, then enforce retention there.

One pass (``TierJob.run_once``), per topic with ``tier.enable=true``:

1. take the topic's tiering lease from the brokers (``Admin.acquire_tier_lease``; one job
   per topic at a time; a second job waits up to ``lease_wait_s`` and then reports the
   topic busy). A thread renews it every third of ``lease_ttl_s``; a job that dies frees
   the topic when the lease expires;
2. ask each partition's leader for its closed segments (``Admin.describe_tier``) and plan
   ranges (``_plan.plan_partition``);
3. in rounds: the next range of every partition that has one (each at most its share
   of ``max_bytes_per_write``) is copied by one Spark job whose tasks read with the
   client and write Arrow Parquet files, and committed to the topic's Delta table in
   one commit carrying ``txnAppId=strata-tier/<topic>/<p>``, ``txnVersion=<end offset>``
   for each of those partitions (``_copy.py``);
4. after the commit, advance those partitions' recorded progress (``tiered_up_to``,
   ``Admin.update_tier``: the brokers write it to ZooKeeper in one transaction that also
   checks the lease, so a job whose lease lapsed cannot move it);
5. total retention (``retention.ms``): ``DELETE`` rows older than it, then ``VACUUM``;
   the first offset left per partition becomes the recorded ``tier_start``;
6. ``OPTIMIZE`` when the last one is older than ``optimize_interval_s``;
7. for ``cleanup.policy=compact`` topics, ``MERGE`` the new range into the compacted table.

Typed topics (``value.schema.subject`` set): a pass reads under the subject's latest
version (pinned for its tasks) and the table's ``value`` is a struct of it. A table made
under an older version is evolved before the pass writes rows of the new one, when the
new version only adds fields (``_commits.add_fields``; rows written before read the
added fields as null in Spark, and as the schema's default through the Spark source);
any other difference fails the topic's pass with ``TierTableMismatchError`` and writes
nothing. A typed topic with ``cleanup.policy=compact`` gets a compacted table with the
same struct ``value``, evolved the same way before each MERGE.

Why it cannot duplicate or skip, whenever it is killed:

* a Delta commit is atomic: a write is either wholly in the table or not at all;
* a write's ``txnVersion`` is its end offset, and the next plan starts at
  ``max(recorded progress, the table's txnVersion, log start)``. Killed after the commit
  but before the progress write, the rerun reads the table's txnVersion (delta-rs, from
  the Delta log) and starts exactly there; killed before the commit, nothing was written
  and the recorded progress is where the rerun starts;
* brokers delete a tiered topic's segments only below the recorded progress, which never
  runs ahead of the table, so the rerun still finds every record it must copy;
* two jobs never write one topic at once: the lease is exclusive, every progress write
  is fenced by it, and a job that cannot renew it stops writing; should a job stalled
  past its TTL still reach a Delta commit, that commit's ``txnAppId``/``txnVersion``
  conflict with the new holder's, so a range is never in the table twice;
* every commit is delta-rs's, put-if-absent on any store (``_commits``): a stalled job's
  late commit is refused or rebased on the new holder's, never written over it.

The job needs only the bootstrap servers: it reaches ZooKeeper through the brokers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_jobs._commits import (
    add_fields,
    create_table,
    delete_rows,
    optimize,
    set_properties,
    vacuum,
)
from spark_jobs._compaction import compact_range, drop_tombstones
from spark_jobs._copy import TierValue, commit_files, copy_ranges, file_value_type
from spark_jobs._errors import (
    TierConfigError,
    TierGapError,
    TierLeaseLostError,
    TierNotEnabledError,
    TierStoreUnreachableError,
    TierTableMismatchError,
)
from spark_jobs._plan import TierRange, plan_partition
from spark_jobs._tables import (
    TIER_PROPERTIES,
    TOPIC_ID_PROPERTY,
    VALUE_SUBJECT_PROPERTY,
    VALUE_VERSION_PROPERTY,
    TableLocation,
    as_warehouse,
    committed_offsets,
    compacted_table,
    register_tables,
    table_properties,
    table_topic_id,
    tier_ddl,
    tier_table,
)
from strata.client import Admin, StoredTierProgress, TierLease
from strata_spark import Warehouse, spark_type
from wire.errors import (
    BrokerNotAvailableError,
    StrataError,
    TierJobBusyError,
    UnknownTopicOrPartitionError,
)
from wire.security import PLAINTEXT, ClientSecurity

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from strata.client import PartitionTier, TopicTier

__all__ = ["PartitionReport", "TierJob", "TierReport", "TierSettings", "TopicReport"]

log = logging.getLogger("strata.spark_jobs.tier")

@dataclass(frozen=True, slots=True)
class TierSettings:
    bootstrap: str
    #: A directory, ``file:///path`` or ``s3://bucket[/prefix]`` (``strata_spark.
    #: Warehouse``); held as a ``Warehouse`` once the settings are made.
    warehouse: Warehouse | Path | str
    #: Segment bytes copied by one Delta commit at most, over all of a topic's partitions
    #: (each gets an equal share, at least one segment): a killed job redoes at most this.
    max_bytes_per_write: int = 1024 * 1024 * 1024
    #: ``VACUUM ... RETAIN`` hours (rounded up to whole hours). Below Delta's default of
    #: 168, readers of table versions older than this may miss files.
    vacuum_retain_hours: float = 168.0
    optimize_interval_s: float = 3600.0
    lease_wait_s: float = 30.0
    #: How long the topic's lease lasts without a renewal (renewed every third of it): a
    #: job that dies frees its topics after this long.
    lease_ttl_s: float = 30.0
    #: How to reach the brokers (their listener's protocol, SASL user, TLS files).
    security: ClientSecurity = PLAINTEXT
    #: After a pass that touched a table, register the warehouse's tables in the job's
    #: session catalog (``register_tables``), for a caller that goes on querying that
    #: session (a notebook's). ``strata tier run`` turns it off: its session ends with
    #: the job, and the registration (Spark reading every table's Delta log) cost
    #: seconds a pass, about 8 s on S3A.
    register_catalog: bool = True
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        # Parsed first: a location Strata cannot use is refused before anything else.
        object.__setattr__(self, "warehouse", as_warehouse(self.warehouse))
        if not self.bootstrap:
            raise TierConfigError("no brokers given: pass --bootstrap HOST:PORT")
        if self.max_bytes_per_write < 1:
            raise TierConfigError("max_bytes_per_write must be at least 1 byte")
        if self.vacuum_retain_hours < 0 or self.optimize_interval_s < 0 or self.lease_wait_s < 0:
            raise TierConfigError(
                "vacuum_retain_hours, optimize_interval_s and lease_wait_s must be >= 0")
        if not 1 <= self.lease_ttl_s <= 600:
            raise TierConfigError(f"lease_ttl_s={self.lease_ttl_s} is out of range; use 1..600")


@dataclass(slots=True)
class PartitionReport:
    topic: str
    partition: int
    segments: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    tiered_up_to: int = 0
    tier_start: int = 0
    #: Records on the leader not yet in Delta (high watermark - tiered_up_to).
    lag_records: int = 0
    #: Age of the newest record of the oldest closed segment still to tier (0: none).
    lag_ms: int = 0


@dataclass(slots=True)
class TopicReport:
    topic: str
    table: str | None = None
    busy: bool = False
    partitions: list[PartitionReport] = field(default_factory=list)
    retention_deleted_records: int = 0
    vacuumed: bool = False
    optimized: bool = False
    compacted_keys: int = 0
    #: Why this topic's pass failed (``run_once(keep_going=True)``); None when it did not.
    error: str | None = None


@dataclass(slots=True)
class TierReport:
    topics: list[TopicReport] = field(default_factory=list)
    seconds: float = 0.0
    #: Wall-clock start of the pass (epoch ms), so a log of passes is a time series.
    started_ms: int = 0

    @property
    def records(self) -> int:
        return sum(p.records for t in self.topics for p in t.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for t in self.topics for p in t.partitions)

    @property
    def segments(self) -> int:
        return sum(p.segments for t in self.topics for p in t.partitions)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(records=self.records, bytes=self.bytes, segments=self.segments)
        return out


class TierJob:
    """Tier every ``tier.enable=true`` topic (or the ones named) once per ``run_once``.

    The job holds one ``Admin`` for its lifetime (the brokers are all it talks to); close
    it (or use it as a context manager) to release it. Not thread-safe: one pass at a
    time.
    """

    def __init__(self, spark: SparkSession | Callable[[], SparkSession],
                 settings: TierSettings) -> None:
        """``spark``: a session, or a function that makes one when the first pass needs it
        (a job beside a stack whose topics are not tiered never starts a JVM)."""
        self._spark = spark
        self.settings = settings
        self._lease_held: _LeaseKeeper | None = None  # of the topic being tiered
        self.admin = Admin(settings.bootstrap, client_id="strata-tier",
                           security=settings.security)

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark):
            self._spark = self._spark()
            self._warehouse.unsafe_settings(dict(self._spark.sparkContext.getConf().getAll()))
        return self._spark

    @property
    def _warehouse(self) -> Warehouse:
        where = self.settings.warehouse
        assert isinstance(where, Warehouse)  # TierSettings.__post_init__ parsed it
        return where

    @property
    def spark_started(self) -> bool:
        return not callable(self._spark)

    def close(self) -> None:
        self.admin.close()

    def __enter__(self) -> TierJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ one pass
    def run_once(self, topics: Sequence[str] | None = None, *,
                 keep_going: bool = False) -> TierReport:
        """One pass over ``topics`` (default: every topic with ``tier.enable=true``).

        ``keep_going``: a topic whose pass fails is reported (``TopicReport.error``) and
        the others still run, as a long-running job must; otherwise the error is raised.
        Either way nothing half-done is left behind: a failed copy is retried from the
        table's txnVersion and the recorded progress by the next pass.
        """
        began = time.monotonic()
        # Before anything is read or written (UNSAFE_WAREHOUSE); a session given to the
        # job is checked here, one the job makes when it first needs it.
        self._warehouse.unsafe_settings(
            None if callable(self._spark)
            else dict(self._spark.sparkContext.getConf().getAll()))
        names = self._topics(topics)
        report = TierReport(started_ms=int(time.time() * 1000))
        for name in names:
            try:
                try:
                    report.topics.append(self._tier_topic(name))
                except Exception as err:
                    unreachable = self._store_unreachable(err)
                    if unreachable is None:
                        raise
                    raise unreachable from err
            except Exception as err:
                if not keep_going:
                    raise
                log.exception("tiering %s failed; the next pass retries it", name)
                report.topics.append(TopicReport(name, error=f"{type(err).__name__}: {err}"))
        if (self.settings.register_catalog and self.spark_started
                and any(t.table for t in report.topics)):
            register_tables(self.spark, self._warehouse)
        report.seconds = round(time.monotonic() - began, 3)
        return report

    def _store_unreachable(self, err: Exception) -> TierStoreUnreachableError | None:
        """For an object-store warehouse, what ``err`` means when the store itself does not
        answer now (one listing of the warehouse root, through pyarrow): Spark, delta-rs
        and pyarrow each word a network failure their own way, so the store is asked
        rather than the message parsed. None: the store answers (or the warehouse is
        local, or ``err`` is one of Strata's own), and ``err`` stands."""
        from pyarrow import fs

        where = self._warehouse
        if where.is_local or isinstance(err, StrataError):
            return None
        try:
            filesystem, root = fs.FileSystem.from_uri(where.delta_uri())
            filesystem.get_file_info(root)
        except Exception as probe:
            first = str(probe).strip().splitlines()[0] if str(probe).strip() else ""
            return TierStoreUnreachableError(
                f"the warehouse {where.uri} did not answer ({type(probe).__name__}: "
                f"{first[:300]}); nothing was committed by the failed step, and brokers "
                "keep every segment not yet in the table. Check the store, AWS_ENDPOINT_URL"
                " and the AWS credentials of the job and its Spark executors; the next "
                "pass catches up")
        return None

    def _topics(self, wanted: Sequence[str] | None) -> list[str]:
        if wanted:
            try:
                described = self.admin.describe_tier(list(wanted))
            except UnknownTopicOrPartitionError as err:
                raise TierNotEnabledError(
                    f"{err.message}; name existing topics with tier.enable=true") from None
            off = [t for t in wanted if not described[t].enabled]
            if off:
                raise TierNotEnabledError(
                    f"topic(s) {', '.join(off)} do not have tier.enable=true; enable it with "
                    f"`strata topic alter-config {off[0]} --set tier.enable=true`")
            return list(wanted)
        names = self.admin.list_topics()
        if not names:
            return []
        described = self.admin.describe_tier(names)
        return sorted(t.name for t in described.values() if t.enabled)

    @contextmanager
    def _lease(self, topic: str) -> Iterator[_LeaseKeeper | None]:
        """The topic's lease, kept renewed for the block (None: another job holds it for
        longer than ``lease_wait_s``); given up on exit."""
        deadline = time.monotonic() + self.settings.lease_wait_s
        ttl_ms = int(self.settings.lease_ttl_s * 1000)
        while True:
            try:
                lease = self.admin.acquire_tier_lease(topic, self.settings.owner, ttl_ms)
                break
            except (TierJobBusyError, BrokerNotAvailableError) as err:
                if time.monotonic() >= deadline:
                    if isinstance(err, TierJobBusyError):
                        log.warning("%s", err)
                        yield None
                        return
                    raise
                time.sleep(0.5)
        keeper = _LeaseKeeper(self.admin, lease, ttl_ms)
        self._lease_held = keeper
        try:
            yield keeper
        finally:
            self._lease_held = None
            keeper.stop()

    def _tier_topic(self, topic: str) -> TopicReport:
        report = TopicReport(topic)
        with self._lease(topic) as held:
            if held is None:
                report.busy = True
                return report
            lease = held.lease
            described = self.admin.describe_tier([topic])[topic]
            path = self._table_for(topic, described)
            report.table = str(path) if path.exists() else None
            configs = {k: v.value for k, v in self.admin.describe_configs([topic])[topic].items()}
            parts = sorted(described.partitions)
            committed = committed_offsets(path, topic, parts)
            now_ms = int(time.time() * 1000)
            for p in parts:
                tier = described.partitions[p]
                # A recorded progress always has tiered_up_to > 0 (it follows a write).
                stored = tier.tiered_up_to > 0
                tiered_up_to, tier_start = tier.tiered_up_to, tier.tier_start_offset
                if committed[p] > tiered_up_to:
                    # Killed between the Delta commit and the progress write: catch up.
                    # Without any record, the first write began at the log start (nothing
                    # below it was deleted: deletion waits for this very progress).
                    saved = self._advance(
                        topic, p, tiered_up_to=committed[p],
                        tier_start=tier_start if stored else tier.log_start_offset)
                    tiered_up_to, tier_start = saved.tiered_up_to, saved.tier_start
                if 0 < tiered_up_to < tier.log_start_offset:
                    raise TierGapError(
                        f"{topic}-{p}: offsets {tiered_up_to}..{tier.log_start_offset - 1} "
                        "were deleted from the brokers before they were tiered (tier.enable "
                        "was off while retention ran, or records were deleted by request), "
                        "so the Delta history would have a hole there and tiering of this "
                        f"topic stops. To start a new history, move {path} away, then "
                        "delete and re-create the topic (deleting a topic removes its tier "
                        "progress); the old table stays readable by path")
                report.partitions.append(PartitionReport(
                    topic, p, tiered_up_to=tiered_up_to, tier_start=tier_start))
            # Each round copies the next range of every partition that has one, in one
            # Spark job and one Delta commit; a range is at most this partition's share
            # of max_bytes_per_write (at least one segment).
            share = max(1, self.settings.max_bytes_per_write // max(1, len(parts)))
            subject = configs.get("value.schema.subject") or None
            value: _TypedValue | None = None
            while True:
                ranges = [rng for part in report.partitions if (rng := plan_partition(
                    topic, part.partition, described.partitions[part.partition].segments,
                    log_start=described.partitions[part.partition].log_start_offset,
                    tiered_up_to=part.tiered_up_to, committed=part.tiered_up_to,
                    tier_after_ms=described.tier_after_ms, now_ms=now_ms,
                    max_bytes=share)) is not None]
                if not ranges:
                    break
                if subject is not None and value is None:
                    value = self._typed_value(subject)
                    if report.table is not None:
                        self._evolve(topic, path, value)
                if report.table is None:
                    properties = {TOPIC_ID_PROPERTY: lease.topic_id, **TIER_PROPERTIES}
                    if value is not None:
                        properties.update({VALUE_SUBJECT_PROPERTY: value.subject,
                                           VALUE_VERSION_PROPERTY: str(value.version)})
                    create_table(self.spark, path,
                                 tier_ddl(None if value is None else value.arrow_type),
                                 ["partition", "date"], properties)
                    report.table = str(path)
                self._copy(topic, path, ranges, report,
                           None if value is None else value.tier_value)
            for part in report.partitions:
                _lag(part, described.partitions[part.partition], described.tier_after_ms,
                     now_ms)
            if report.table is not None:
                self._retention(topic, path, configs, report)
                if configs.get("cleanup.policy") == "compact":
                    if subject is not None and value is None:
                        value = self._typed_value(subject)
                    report.compacted_keys = self._compact(topic, path, report, configs,
                                                          value)
                report.optimized = self._maintain(path)
            compacted = compacted_table(self._warehouse, topic)
            if compacted.exists():
                self._maintain(compacted)
        return report

    def _advance(self, topic: str, partition: int, *, tiered_up_to: int,
                 tier_start: int) -> StoredTierProgress:
        """``_advance_all`` for one partition."""
        return self._advance_all(topic, {partition: (tiered_up_to, tier_start)})[partition]

    def _advance_all(self, topic: str, progress: dict[int, tuple[int, int]]
                     ) -> dict[int, StoredTierProgress]:
        """Write ``{partition: (tiered_up_to, tier_start)}`` in one request, only under
        this job's lease, for the topic it planned (the brokers check both in the write's
        own transaction)."""
        lease = self._check_lease(topic)
        return self.admin.update_tier(topic, lease.lease_id, lease.topic_id,
                                      progress=progress)

    def _check_lease(self, topic: str) -> TierLease:
        """The lease, if the keeper still vouches for it (renewed within its TTL)."""
        keeper = self._lease_held
        if keeper is None or keeper.lease.topic != topic:
            raise TierLeaseLostError(f"this job holds no lease on topic {topic!r}")
        keeper.check()
        return keeper.lease

    def _table_for(self, topic: str, described: TopicTier) -> TableLocation:
        path = tier_table(self._warehouse, topic)
        recorded = described.table
        if recorded is not None and recorded != path.uri:
            holder = recorded.rsplit("/", 2)[0] if recorded.count("/") >= 2 else recorded
            raise TierTableMismatchError(
                f"topic {topic!r} is tiered into {recorded}, not {path}; run the job with "
                f"the warehouse that holds that table (--warehouse {holder})")
        if recorded is None:
            lease = self._check_lease(topic)
            _refuse_earlier_topic_table(
                path, "the history", topic, lease.topic_id,
                "Move that table away, with compacted/<topic> beside it for a compacted "
                "topic (or use another --warehouse), to tier the new topic; it is never "
                "appended to the old history")
            self.admin.update_tier(topic, lease.lease_id, lease.topic_id, table=path.uri)
        return path

    # ------------------------------------------------------------------ typed topics
    def _typed_value(self, subject: str) -> _TypedValue:
        """The subject's latest version: what this pass reads and writes under."""
        from wire.schema import parse_schema

        registered = self.admin.get_schema(subject)
        parsed = parse_schema(registered.schema, registered.schema_type)
        assert registered.version is not None
        return _TypedValue(subject, registered.version, parsed.arrow_type,
                           TierValue(registered.version, file_value_type(parsed.arrow_type)))

    def _evolve(self, topic: str, path: TableLocation, value: _TypedValue) -> None:
        """Bring the table's ``value`` to ``value``'s version: add the fields it adds
        (delta-rs, each at the end of its struct: ``_commits.add_fields``), then record the
        version. Anything else is refused before a row is written."""
        from pyspark.sql.types import StructType

        properties = table_properties(path)
        recorded = properties.get(VALUE_SUBJECT_PROPERTY)
        if recorded is None or recorded != value.subject:
            raise TierTableMismatchError(
                f"{path} does not hold values of subject {value.subject} (its "
                f"{VALUE_SUBJECT_PROPERTY} is {recorded!r}): it was written before topic "
                f"{topic!r} was typed, or for another subject; move the table away so that "
                "the job starts a new one")
        if properties.get(VALUE_VERSION_PROPERTY) == str(value.version):
            return
        current = self.spark.read.format("delta").load(path.spark_uri).schema["value"].dataType
        target = spark_type(value.arrow_type)
        if not isinstance(current, StructType):
            raise TierTableMismatchError(
                f"{path}: value is {current.simpleString()}, not a struct; move the table "
                "away so that the job starts a new one")
        added: list[str] = []
        refusal = _added_fields(current, target, "value", added)
        if refusal is not None:
            raise TierTableMismatchError(
                f"{path} holds {value.subject} version "
                f"{properties.get(VALUE_VERSION_PROPERTY)} and version {value.version} "
                f"{refusal}: the table can only grow new fields, so nothing was tiered. "
                "Register a version that only adds fields (with defaults), or move the "
                "table away (and its history with it) so that the job starts a new one")
        self._check_lease(topic)
        if added:
            add_fields(path, "value", file_value_type(value.arrow_type))
        set_properties(path, {VALUE_VERSION_PROPERTY: str(value.version)})
        log.info("%s: value evolved to %s version %d (%s)", path, value.subject,
                 value.version, ", ".join(added) or "no new field")

    def _copy(self, topic: str, path: TableLocation, ranges: list[TierRange],
              report: TopicReport, value: TierValue | None = None) -> None:
        """One Delta commit for ``ranges`` (``_copy.py``), then one progress write for
        all of their partitions."""
        began = time.monotonic()
        self._check_lease(topic)
        files = copy_ranges(self.spark, path, ranges, bootstrap=self.settings.bootstrap,
                            security=self.settings.security, value=value)
        self._check_lease(topic)
        written = commit_files(path, ranges, files)
        parts = {part.partition: part for part in report.partitions}
        progress = {}
        for rng in ranges:
            part = parts[rng.partition]
            first_write = part.tier_start >= part.tiered_up_to
            progress[rng.partition] = (rng.end, rng.start if first_write else part.tier_start)
        saved = self._advance_all(topic, progress)
        elapsed = time.monotonic() - began
        offsets = sum(rng.offsets for rng in ranges) or 1
        for rng in ranges:
            part = parts[rng.partition]
            part.tiered_up_to = saved[rng.partition].tiered_up_to
            part.tier_start = saved[rng.partition].tier_start
            part.segments += rng.segments
            part.bytes += rng.bytes
            part.records += written.get(rng.partition, 0)
            # The commit's time, shared by its partitions in proportion to their offsets.
            part.seconds = round(part.seconds + elapsed * rng.offsets / offsets, 3)
        log.info("tiered %s in one commit: %s; %d records, %d files in %.2f s", topic,
                 ", ".join(f"{r.partition}:[{r.start}, {r.end})" for r in ranges),
                 sum(written.values()), len(files), elapsed)

    # ------------------------------------------------------------------ retention
    def _retention(self, topic: str, path: TableLocation, configs: dict[str, str | None],
                   report: TopicReport) -> None:
        """``retention.ms`` on the table, as Kafka applies it to segments: per partition,
        the longest run of oldest files whose every row is older than the cutoff goes.

        Deleting by each row's timestamp would punch holes wherever producer clocks
        disagree (CreateTime need not grow with offsets), and readers could not tell such
        a hole from a control record. So the cut is an offset X per partition: every
        file wholly below it is old, and ``DELETE ... offset < X`` removes exactly those
        rows. ``tier_start`` moves to X (recorded) *before* the DELETE: a reader then
        treats offsets below X as gone even while they are still being deleted, and a
        job killed in between finds the same X on its next pass and finishes the DELETE.
        """
        retention_ms = int(configs.get("retention.ms") or -1)
        if retention_ms < 0:
            return
        cutoff_ms = int(time.time() * 1000) - retention_ms
        table = path.open()
        cuts = _retention_cuts(table, cutoff_ms)
        if not cuts:
            return
        for part in report.partitions:
            if part.partition in cuts:
                saved = self._advance(topic, part.partition, tiered_up_to=part.tiered_up_to,
                                      tier_start=min(cuts[part.partition], part.tiered_up_to))
                part.tier_start = saved.tier_start
        began = time.monotonic()
        predicate = " OR ".join(f'("partition" = {p} AND "offset" < {x})'
                                for p, x in cuts.items())
        self._check_lease(topic)
        report.retention_deleted_records += delete_rows(path, predicate)
        log.info("retention DELETE on %s (%s) took %.2f s", path, predicate,
                 time.monotonic() - began)
        self._vacuum(path)
        report.vacuumed = True

    def _vacuum(self, path: TableLocation) -> None:
        began = time.monotonic()
        removed = vacuum(path, self.settings.vacuum_retain_hours)
        log.info("VACUUM of %s deleted %d files in %.2f s", path, removed,
                 time.monotonic() - began)

    def _maintain(self, path: TableLocation) -> bool:
        """OPTIMIZE then VACUUM ``path`` when its last OPTIMIZE is older than the interval
        (or none is among its last 100 commits and the table is at least that old)."""
        table = path.open()
        history = table.history(100)
        optimized = [int(h.get("timestamp", 0)) for h in history
                     if h.get("operation") == "OPTIMIZE"]
        if optimized:
            last = max(optimized)
        elif len(history) >= 100 or table.version() >= 99:
            last = 0  # a busy table: none in its last 100 commits means one is due
        else:
            last = min((int(h.get("timestamp", 0)) for h in history), default=0)
        if time.time() * 1000 - last < self.settings.optimize_interval_s * 1000:
            return False
        began = time.monotonic()
        optimize(path)
        log.info("OPTIMIZE of %s took %.2f s", path, time.monotonic() - began)
        self._vacuum(path)  # the files OPTIMIZE replaced go once the retain period passes
        return True

    # ------------------------------------------------------------------ compaction
    def _compact(self, topic: str, path: TableLocation, report: TopicReport,
                 configs: dict[str, str | None], value: _TypedValue | None = None) -> int:
        """Merge every tiered range the compacted table lacks (its own recorded progress,
        written after each MERGE, so a MERGE that failed or was killed is redone by the
        next pass; the MERGE itself ignores rows it already has). The progress read with
        the lease stays current: only the lease holder writes it. A typed topic's
        compacted table has the tier table's struct ``value`` and evolves as it does."""
        lease = self._check_lease(topic)
        merged = dict(lease.compacted)
        keys = 0
        compacted = compacted_table(self._warehouse, topic)
        _refuse_earlier_topic_table(
            compacted, "the latest record per key", topic, lease.topic_id,
            "Move that table away (or use another --warehouse) to compact the new topic; "
            "it is never merged into the old table")
        properties: dict[str, str] = {TOPIC_ID_PROPERTY: lease.topic_id}
        if value is not None:
            properties.update({VALUE_SUBJECT_PROPERTY: value.subject,
                               VALUE_VERSION_PROPERTY: str(value.version)})
            if compacted.exists():
                self._evolve(topic, compacted, value)
        for part in report.partitions:
            start = max(merged.get(part.partition, 0), part.tier_start)
            if start >= part.tiered_up_to:
                continue
            self._check_lease(topic)
            keys += compact_range(self.spark, self._warehouse, topic, path,
                                  part.partition, start, part.tiered_up_to,
                                  value_type=None if value is None else value.arrow_type,
                                  properties=properties)
            lease = self._check_lease(topic)
            self.admin.update_tier(topic, lease.lease_id, lease.topic_id,
                                   merged={part.partition: part.tiered_up_to})
            merged[part.partition] = part.tiered_up_to
        drop_tombstones(self.spark, self._warehouse, topic,
                        int(configs.get("delete.retention.ms") or 86_400_000))
        return keys


@dataclass(frozen=True, slots=True)
class _TypedValue:
    """A typed topic's value subject at the version a pass tiers under."""

    subject: str
    version: int
    arrow_type: pa.StructType
    tier_value: TierValue



def _refuse_earlier_topic_table(path: TableLocation, holding: str, topic: str, topic_id: str,
                              what_to_do: str) -> None:
    """``TierTableMismatchError`` when the table at ``path`` records another topic id (its
    ``strata.topicId``): a topic deleted and re-created never writes into its tables."""
    owner = table_topic_id(path)
    if owner is not None and owner != topic_id:
        raise TierTableMismatchError(
            f"{path} holds {holding} of an earlier topic named {topic!r} (topic id {owner}; "
            f"this one is {topic_id}): the topic was deleted and re-created. {what_to_do}")


def _added_fields(current: Any, target: Any, path: str, added: list[str]) -> str | None:
    """Collect into ``added`` the fields (as ``ADD COLUMNS`` clauses: what the log says)
    that turn struct ``current`` into ``target``; what else differs (a refusal naming the
    field), or None."""
    from pyspark.sql.types import StructType

    have = {f.name: f for f in current.fields}
    want = {f.name for f in target.fields}
    for name in have:
        if name not in want:
            return f"drops field {path}.{name}"
    previous: str | None = None
    for field_ in target.fields:
        where = f"{path}.{_quoted(field_.name)}"
        if field_.name not in have:
            place = "FIRST" if previous is None else f"AFTER {_quoted(previous)}"
            added.append(f"{where} {field_.dataType.simpleString()} {place}")
        else:
            old = have[field_.name].dataType
            if isinstance(old, StructType) and isinstance(field_.dataType, StructType):
                refusal = _added_fields(old, field_.dataType, where, added)
                if refusal is not None:
                    return refusal
            elif old.simpleString() != field_.dataType.simpleString():
                return (f"changes field {path}.{field_.name} from {old.simpleString()} to "
                        f"{field_.dataType.simpleString()}")
        previous = field_.name
    return None


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _retention_cuts(table: Any, cutoff_ms: int) -> dict[int, int]:
    """Per partition, the offset below which every file is older than ``cutoff_ms``
    (only partitions with something to delete), from the Delta log's file statistics."""
    files = pa.table(table.get_add_actions(flatten=True))
    needed = {"partition.partition", "min.offset", "max.offset", "max.timestamp"}
    if not files.num_rows or not needed <= set(files.column_names):
        return {}
    by_partition: dict[int, list[tuple[int, int, int]]] = {}
    for p, low, high, newest in zip(*(files.column(c).to_pylist() for c in (
            "partition.partition", "min.offset", "max.offset", "max.timestamp")), strict=True):
        if low is None or high is None or newest is None:
            by_partition.setdefault(int(p), []).append((-1, -1, 2**62))  # unknown: keep
            continue
        by_partition.setdefault(int(p), []).append((int(low), int(high), _epoch_ms(newest)))
    cuts: dict[int, int] = {}
    for p, spans in by_partition.items():
        spans.sort()
        cut = None
        for low, _high, newest in spans:
            if newest >= cutoff_ms:
                cut = low
                break
        if cut is None:
            cut = max(high for _, high, _ in spans) + 1
        if cut > spans[0][0] >= 0:
            cuts[p] = cut
    return cuts


def _epoch_ms(value: Any) -> int:
    """A Delta statistics timestamp (datetime, or microseconds) as epoch milliseconds."""
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value) // 1000


def _lag(part: PartitionReport, tier: PartitionTier, tier_after_ms: int, now_ms: int) -> None:
    part.lag_records = max(0, tier.high_watermark - part.tiered_up_to)
    pending = [s for s in tier.segments if s.next_offset > part.tiered_up_to]
    part.lag_ms = max(0, now_ms - pending[0].max_timestamp) if pending else 0


class _LeaseKeeper:
    """Renews a tier lease from a daemon thread every third of its TTL.

    ``check`` raises ``TierLeaseLostError`` once a renewal was refused (another job took
    the topic) or none succeeded within the TTL (the brokers or ZooKeeper unreachable:
    the lease may have expired, and the job must not act as if it still held it).
    """

    def __init__(self, admin: Admin, lease: TierLease, ttl_ms: int) -> None:
        self.lease = lease
        self._admin = admin
        self._ttl_s = ttl_ms / 1000
        self._renewed = time.monotonic()
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"strata-tier-lease-{lease.topic}")
        self._thread.start()

    def check(self) -> None:
        if self._lost is None and time.monotonic() - self._renewed > self._ttl_s:
            self._lost = (f"no renewal of the lease on {self.lease.topic!r} succeeded for "
                          f"{self._ttl_s:.0f} s (its TTL); it may have expired")
        if self._lost is not None:
            raise TierLeaseLostError(
                f"{self._lost}; nothing more is written in this pass, and the next pass "
                "starts from what the table and the recorded progress hold")

    def _run(self) -> None:
        ttl_ms = int(self._ttl_s * 1000)
        while not self._stop.wait(self._ttl_s / 3):
            try:
                self._admin.renew_tier_lease(self.lease.topic, self.lease.lease_id, ttl_ms)
                self._renewed = time.monotonic()
            except TierLeaseLostError as err:
                self._lost = err.message
                return
            except Exception as err:  # unreachable for now: the next renewal may work
                log.warning("renewing the tier lease on %s failed: %s; retrying",
                            self.lease.topic, err)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._lost is None:
            try:
                self._admin.release_tier_lease(self.lease.topic, self.lease.lease_id)
            except Exception as err:  # it expires after its TTL anyway
                log.warning("giving up the tier lease on %s failed: %s; it expires after "
                            "%.0f s", self.lease.topic, err, self._ttl_s)
