"""The logs of the replicas hosted here (Kafka's ``LogManager``): opening and closing
them, retention, compaction, interval flushes, and partition directories no hosted
replica owns.

:class:`LogManager` opens the logs of the replicas this broker gains (recovering them
where needed) on a small thread pool, closes them at shutdown the same way, and runs
the periodic work on every hosted log: retention every ``log.retention.check.interval.ms``
(bounded, for a tier-enabled topic, by what the Delta table holds), the log cleaner
every ``log.cleaner.interval.ms`` (docs/compaction.md), and flushes of
``flush.policy=interval`` topics every ``log.flush.scheduler.interval.ms``. Which
replicas are hosted is the broker's decision (``brokers/broker.py``, from ZooKeeper);
this class only does what it takes on disk.

Invariants:

* a partition whose log cannot be opened, or whose flush fails, stays offline alone
  (``PartitionRegistry.offline``; requests to it get ``STORAGE_ERROR``): the other
  partitions serve;
* a partition directory found whose topic no longer exists (deleted while the broker
  was down) or was re-created under the same name is set aside as
  ``<topic>-<p>.<unix time>-stray``, never deleted: if ZooKeeper lost its data, the
  logs are still on disk for an operator;
* retention snapshots a partition's producer state before it deletes a segment, so a
  sink's last committed batch id survives an unclean restart after that;
* the cleaner writes a producer snapshot at the log end before it rewrites a log, so a
  restart never replays cleaned headers.

Crash behaviour: closing writes every log's checkpoints and clean-shutdown marker; a
log not closed is recovered when it is next opened (``brokers/log/``).

Thread-safety: the broker's event loop owns the registry and every partition; opening,
closing and the cleaner's rewrites run on worker threads, each on a partition nothing
else touches meanwhile.

Its lines keep the logger they had when this was part of the broker,
``strata.brokers.broker`` (docs/compaction.md and docs/operations.md name it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from brokers.log import FlushPolicy, durability
from brokers.log.checkpoint import PartitionOffsetsCheckpoint
from brokers.log.partition_log import CLEAN_SHUTDOWN_FILE
from brokers.partition import METADATA_FILE, Partition, read_topic_id
from wire.errors import InvalidConfigError, LogStorageError, StrataError

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.coordination import PartitionKey, TierProgress, TopicDefinition, ZooKeeperClient
    from brokers.log import LogConfig
    from brokers.metrics import BrokerMetrics
    from brokers.services import MetadataCache, PartitionRegistry

__all__ = ["HIGH_WATERMARK_CHECKPOINT_FILE", "STRAY_SUFFIX", "LogManager",
           "raise_open_file_limit"]

log = logging.getLogger("strata.brokers.broker")

STRAY_SUFFIX: Final = "-stray"
#: The data directory's high-watermark checkpoint (Kafka's name for it).
HIGH_WATERMARK_CHECKPOINT_FILE: Final = "replication-offset-checkpoint"
#: Logs recovered (or closed) at once at start-up, shutdown and when many topics arrive
#: together. Recovery and closing are mostly fsyncs and writes, which release the GIL,
#: so threads overlap them (measured: 13 ms per open one at a time, 1.7 ms with 8
#: threads, 1.2 ms with 32, on this machine's virtual disk).
_LOG_OPENERS: Final = 16
#: Threads creating new logs (their fsyncs deferred): mkdir and file creation release
#: the GIL, the rest is Python. 4,000 logs on the 2-core VM, 2026-11-29: 4.5-5.0 s on
#: one thread, 3.5 s on four, 3.9-4.3 s on sixteen.
_NEW_LOG_OPENERS: Final = 4
#: Threads opening cleanly closed logs (fsyncs deferred): reading small files from the
#: page cache is Python work under the GIL, and more threads only contend for it.
#: 4,000 logs, same day: 1.9-2.0 s on one thread, 3.6 s on two, 4.9-5.0 s on sixteen.
_CLEAN_LOG_OPENERS: Final = 1
#: Clean and new logs a worker opens per task (one event-loop wake-up per task).
_OPEN_CHUNK: Final = 64
#: File descriptors kept free for connections, ZooKeeper and the metrics server when
#: checking that the open-file limit can hold every hosted log.
_SPARE_FILES: Final = 2_048


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns ``(soft, hard)``.

    Every hosted log keeps its active segment open (more with several segments), so a
    broker with ten thousand replicas needs more than the common default soft limit of
    1,024 files.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class LogManager:
    """Opens, closes and looks after the logs of the replicas hosted here."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, zookeeper: ZooKeeperClient,
                 metrics: BrokerMetrics) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.data_dir = config.data_dir
        self.cluster = cluster
        self.registry = registry
        self.zookeeper = zookeeper
        self.metrics = metrics
        # Tier gauges as of the last retention pass: {(topic, p): (tiered_up_to, lag)}.
        self.tier_stats: dict[tuple[str, int], tuple[int, int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: How the last ``open_logs`` spent its time (the broker's "loaded" line).
        self.last_open_timing = ""
        self._hw_checkpoint = PartitionOffsetsCheckpoint(
            self.data_dir / HIGH_WATERMARK_CHECKPOINT_FILE)
        # The entries of the high-watermark checkpoint as last read or written (replaced
        # whole by the writer thread, read on the loop).
        self._hw_written: dict[PartitionKey, int] = {}

    def start(self) -> None:
        """Start the periodic retention, cleaning and flushing."""
        self._tasks.append(asyncio.create_task(self._periodic_retention()))
        self._tasks.append(asyncio.create_task(self._periodic_cleaning()))
        self._tasks.append(asyncio.create_task(self._periodic_flush()))

    def stop(self) -> None:
        """Stop the periodic work (the cleaner stops at its next batch)."""
        for task in self._tasks:
            task.cancel()

    # ------------------------------------------------------------------ opening and closing
    def open_file_limit_problem(self, new_logs: int) -> InvalidConfigError | None:
        """An error when the open-file limit cannot hold ``new_logs`` more logs."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return None
        needed = len(self.registry.hosted) + new_logs + _SPARE_FILES
        if needed <= soft:
            return None
        return InvalidConfigError(
                f"broker {self.broker_id} would host {len(self.registry.hosted) + new_logs} "
                f"partition logs but may open only {soft} files (RLIMIT_NOFILE, already "
                f"raised to the hard limit; {_SPARE_FILES} are kept for connections); raise "
                "the limit (`ulimit -n`, systemd LimitNOFILE=) or spread the partitions over "
                "more brokers")

    async def open_logs(self, hosted: list[tuple[TopicDefinition, int, LogConfig]]
                        ) -> list[Partition | StrataError]:
        """Open (and where needed recover) the logs, several at once.

        A new log (its directory does not exist) or one closed cleanly (its marker is
        there) is opened with its fsyncs deferred (``durability``): creating one is a
        handful of fsyncs, opening a clean one is one (removing the marker), ten
        thousand of each on a 2-core VM took seconds. One ``syncfs`` then makes all of
        them durable before any of these logs is served, so no append can land while a
        removed marker could still come back after a machine crash. A log that needs
        recovery fsyncs as it goes, as always. Each kind is opened on as many threads
        as suits it (``_CLEAN_LOG_OPENERS``, ``_NEW_LOG_OPENERS``, ``_LOG_OPENERS``).
        """
        self.last_open_timing = ""
        if not hosted:
            return []
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        kinds = await asyncio.to_thread(self._log_kinds, hosted)
        recorded: dict[PartitionKey, int] = {}
        if any(kind != "new" for kind in kinds):
            recorded = await asyncio.to_thread(self._hw_checkpoint.read)
            if not self._hw_written:
                self._hw_written = dict(recorded)  # what the file holds, until rewritten
        opened: dict[int, Partition | StrataError] = {}  # by index into ``hosted``
        timing: list[str] = []
        # One kind at a time, each on the threads that suit it (see the constants).
        for kind, workers, open_one in (
                ("clean", _CLEAN_LOG_OPENERS, self._open_deferred),
                ("new", _NEW_LOG_OPENERS, self._create_deferred),
                ("recover", _LOG_OPENERS, self.open_log)):
            indexes = [i for i, k in enumerate(kinds) if k == kind]
            if not indexes:
                continue

            def open_chunk(chunk: list[int], open_one: Any = open_one
                           ) -> list[Partition | StrataError]:
                return [open_one(*hosted[i], recorded.get((hosted[i][0].name, hosted[i][1])))
                        for i in chunk]

            # Chunks, not one task per log: each finished task wakes the event loop
            # (measured: a tenth of a broker's CPU while it created 10,000 logs).
            size = _OPEN_CHUNK if kind != "recover" else 1
            chunks = [indexes[i:i + size] for i in range(0, len(indexes), size)]
            with ThreadPoolExecutor(max_workers=min(workers, len(chunks)),
                                    thread_name_prefix=f"strata-log-open-{kind}") as pool:
                results = await asyncio.gather(*(
                    loop.run_in_executor(pool, open_chunk, chunk) for chunk in chunks))
            opened.update(zip(indexes, (r for rs in results for r in rs), strict=True))
            timing.append(f"{len(indexes)} {kind} {time.perf_counter() - began:.2f} s")
            began = time.perf_counter()
        done = [opened[i] for i in range(len(hosted))]
        err = await self._sync("the opened logs could not be made durable; they stay offline")
        timing.append(f"sync {time.perf_counter() - began:.2f} s")
        self.last_open_timing = ", ".join(timing)
        if err is not None:
            failed = LogStorageError(f"syncing {self.data_dir} after opening logs failed: "
                                     f"{err}; check the disk, then restart the broker")
            for partition in done:
                if isinstance(partition, Partition):
                    with contextlib.suppress(Exception):
                        partition.close(mark_clean=False)
            return [failed] * len(done)
        return done

    def _log_kinds(self, hosted: list[tuple[TopicDefinition, int, LogConfig]]) -> list[str]:
        """``new`` (no directory yet), ``clean`` (its clean-shutdown marker is there) or
        ``recover``, for each of ``hosted``: one listing of the data directory and one
        ``stat`` per existing log."""
        existing = set(os.listdir(self.data_dir))
        kinds = []
        for topic, p, _ in hosted:
            name = f"{topic.name}-{p}"
            if name not in existing:
                kinds.append("new")
            elif os.path.exists(os.path.join(self.data_dir, name, CLEAN_SHUTDOWN_FILE)):
                kinds.append("clean")
            else:
                kinds.append("recover")  # fsyncs as it goes
        return kinds

    def _open_deferred(self, topic: TopicDefinition, p: int, config: LogConfig,
                       recorded_high_watermark: int | None) -> Partition | StrataError:
        with durability.deferred_fsyncs():
            return self.open_log(topic, p, config, recorded_high_watermark)

    def _create_deferred(self, topic: TopicDefinition, p: int, config: LogConfig,
                         recorded_high_watermark: int | None) -> Partition | StrataError:
        with durability.deferred_fsyncs():
            return self.open_log(topic, p, config, new=True)

    def open_log(self, topic: TopicDefinition, p: int, config: LogConfig,
                 recorded_high_watermark: int | None = None, *,
                 new: bool = False) -> Partition | StrataError:
        """Open one replica's log (on a worker thread); the error when it stays offline.
        Its writes are durable when this returns unless the caller deferred them.
        ``new``: its directory was not in the data directory's listing (nothing to
        read back; ``Partition``'s ``new``). ``recorded_high_watermark``: its entry in
        the high-watermark checkpoint, if any (when not given: the entries this manager
        last read or wrote)."""
        if recorded_high_watermark is None and not new:
            recorded_high_watermark = self._hw_written.get((topic.name, p))
        directory = self.data_dir / f"{topic.name}-{p}"
        try:
            if not new and directory.exists() \
                    and read_topic_id(directory) not in (None, topic.topic_id):
                self._set_aside(directory, "an older topic of the same name")
            return Partition(topic.name, p, topic.topic_id, directory, config, self.broker_id,
                             new=new, recorded_high_watermark=recorded_high_watermark)
        except (StrataError, OSError) as err:
            # One damaged partition must not take the broker (and every other
            # partition) down: it stays offline and answers with the error.
            log.error("partition %s-%d is OFFLINE: %s", topic.name, p, err)
            return err if isinstance(err, StrataError) else \
                LogStorageError(f"opening {directory} failed: {err}")

    async def close_logs(self, partitions: list[Partition]) -> str:
        """Close every log (snapshots, checkpoints, clean-shutdown markers), several at
        once, with two file-system syncs instead of a dozen fsyncs per log (10,000 logs:
        120,000 fsyncs, about 35 s on the 2-core VM). Nothing else touches the
        partitions any more.

        Order, so a machine crash at any point leaves no marker that lies: (1) every log
        is closed with its fsyncs deferred and no marker (``durability``); (2) one
        ``syncfs`` makes all of that durable; (3) the markers of the logs that closed
        intact are written, again deferred; (4) a second ``syncfs``. A crash before (4)
        loses some markers (those logs are recovered at the next start), never data.
        A sync that fails leaves every marker unwritten. Returns where the time went
        (for the broker's "stopped cleanly" line), e.g. ``close 4.1 s, sync 9.0 s, ...``.
        """
        def close(partition: Partition) -> None:
            try:
                with durability.deferred_fsyncs():
                    partition.close(mark_clean=False)
            except Exception:
                log.exception("closing %s failed", partition)

        def mark(chunk: list[Partition]) -> None:
            with durability.deferred_fsyncs():
                for partition in chunk:
                    partition.mark_clean()

        phases: list[str] = []
        began = time.monotonic()
        closing = {(p.topic, p.partition) for p in partitions}

        def phase(name: str) -> None:
            nonlocal began
            now = time.monotonic()
            phases.append(f"{name} {now - began:.2f} s")
            began = now

        if not partitions:
            return ""
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=min(_LOG_OPENERS, len(partitions)),
                                thread_name_prefix="strata-log-close") as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, close, partition)
                                   for partition in partitions))
            # Every closed log's HW in one file (covered by the sync below), and the
            # last written value of the replicas that are offline.
            entries = self.high_watermark_entries(
                [p for p in partitions if not p.log.is_offline],
                keep=closing | set(self.registry.offline))
            try:
                await loop.run_in_executor(pool, self._write_deferred, entries)
            except OSError as err:
                log.error("the high-watermark checkpoint %s could not be written (%s); the "
                          "next start takes each replica's HW from its log end or an "
                          "older checkpoint", self._hw_checkpoint.path, err)
            phase("close")
            if await self._sync("the logs could not be made durable; no clean-shutdown "
                                "markers are written, the next start recovers every log"):
                return ", ".join(phases)
            phase("sync")
            size = max(1, len(partitions) // _LOG_OPENERS + 1)
            await asyncio.gather(*(loop.run_in_executor(pool, mark, partitions[i:i + size])
                                   for i in range(0, len(partitions), size)))
            phase("markers")
        await self._sync("the clean-shutdown markers could not be made durable; the next "
                         "start may recover some logs")
        phase("sync")
        return ", ".join(phases)

    def high_watermark_entries(self, partitions: Iterable[Partition],
                               keep: Collection[PartitionKey]) -> dict[PartitionKey, int]:
        """(On the loop) The HW of each of ``partitions``, and the last checkpointed HW
        of the replicas in ``keep`` not among them (offline ones keep their entry)."""
        entries = {(p.topic, p.partition): p.high_watermark for p in partitions}
        for key, value in self._hw_written.items():
            if key not in entries and key in keep:
                entries[key] = value
        return entries

    def write_high_watermarks(self, entries: dict[PartitionKey, int]) -> None:
        """(Worker thread) Replace the data directory's high-watermark checkpoint
        (atomically and durably: ``PartitionOffsetsCheckpoint``)."""
        self._hw_checkpoint.write(entries)
        self._hw_written = entries

    def _write_deferred(self, entries: dict[PartitionKey, int]) -> None:
        with durability.deferred_fsyncs():  # the close's file-system sync covers it
            self.write_high_watermarks(entries)

    async def _sync(self, failure: str) -> OSError | None:
        """One ``syncfs`` of the data directory's file system (``durability``); on a
        failure, logs ``failure`` with the error and returns the error."""
        try:
            await asyncio.to_thread(durability.sync_filesystem, self.data_dir)
        except OSError as err:
            log.error("%s: %s", failure, err)
            return err
        return None

    # ------------------------------------------------------------------ stray directories
    def remove_stray_dirs(self) -> None:
        """Set aside partition dirs whose topic is gone (deleted while we were down).

        Renamed, not deleted, as Kafka does with ``-stray`` logs: if ZooKeeper lost its
        data, the logs are still on disk for an operator.
        """
        hosted = {p.directory for p in self.registry.hosted.values()}
        hosted |= {self.data_dir / f"{t}-{p}" for t, p in self.registry.offline}
        for child in self.data_dir.iterdir():
            if child.is_dir() and child not in hosted and read_topic_id(child) is not None:
                self._set_aside(child, "its topic no longer exists")

    def _set_aside(self, directory: Path, why: str) -> None:
        target = directory.with_name(f"{directory.name}.{int(time.time())}{STRAY_SUFFIX}")
        log.warning("setting %s aside as %s: %s", directory.name, target.name, why)
        (directory / METADATA_FILE).rename(directory / (METADATA_FILE + STRAY_SUFFIX))
        directory.rename(target)

    # ------------------------------------------------------------------ retention
    async def _periodic_retention(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.apply_retention(await self.read_tier_progress())

    async def read_tier_progress(self) -> dict[str, dict[int, TierProgress]]:
        """The tiering progress of every tier-enabled topic hosted here: one ZooKeeper
        read per topic per pass, not per partition. A topic whose read fails is left
        out, so its segments stay until a later pass can read it."""
        topics = sorted({topic for (topic, _), partition in self.registry.hosted.items()
                         if partition.log.config.tier_enable})
        out: dict[str, dict[int, TierProgress]] = {}
        for topic in topics:
            try:
                out[topic] = await asyncio.to_thread(self.zookeeper.tier_progress, topic)
            except Exception as err:  # ZooKeeper trouble: skip the topic this pass
                log.warning("reading the tier progress of %s failed: %r; its segments stay "
                            "until the next retention pass", topic, err)
        return out

    def apply_retention(self, tier_progress: Mapping[str, Mapping[int, TierProgress]]
                        | None = None) -> int:
        """One retention pass over every hosted replica (leaders and followers alike:
        each deletes from its own log). For a tier-enabled topic ``tier_progress`` (see
        ``read_tier_progress``) bounds what may go; a topic or partition missing from it
        keeps every segment. Also refreshes the tier gauges. Returns segments deleted."""
        deleted = 0
        now_ms = time.time_ns() // 1_000_000
        tier_progress = tier_progress or {}
        tier_stats: dict[tuple[str, int], tuple[int, int]] = {}
        for (topic, p), partition in list(self.registry.hosted.items()):
            tiered_up_to: int | None = None
            if partition.log.config.tier_enable and topic in tier_progress:
                progress = tier_progress[topic].get(p)
                tiered_up_to = None if progress is None else progress.tiered_up_to
                if partition.is_leader:
                    known = tiered_up_to or 0
                    tier_stats[(topic, p)] = (known,
                                              max(partition.high_watermark - known, 0))
            try:
                # Snapshot the producer state first: retention may delete the segments
                # whose batch headers are the only other record of it (a sink's last
                # committed batch id must survive an unclean restart after that).
                # Only when a segment goes: a pass over ten thousand partitions must not
                # rewrite (and fsync) ten thousand snapshots on the event loop.
                if not partition.log.is_offline:
                    deleted += len(partition.log.apply_retention(
                        tiered_up_to, before_delete=partition.snapshot_producer_state))
            except StrataError as err:
                log.error("retention on %s failed: %s", partition, err)
            except OSError as err:
                log.error("producer-state snapshot of %s failed: %s", partition, err)
            partition.producers.expire(now_ms, self.config.producer_id_expiration_ms,
                                       sink_max_idle_ms=self.config.sink_state_expiration_ms)
            try:
                partition.staging.expire(now_ms, self.config.sink_staging_retention_ms)
            except OSError as err:
                log.error("expiring staged sink data of %s failed: %s", partition, err)
        self.tier_stats = tier_stats
        return deleted

    # ------------------------------------------------------------------ cleaning
    async def _periodic_cleaning(self) -> None:
        """Log compaction (brokers/log/cleaner.py) every ``log.cleaner.interval.ms``; the
        cleaner stops at its next batch when the broker stops."""
        from brokers.log.cleaner import LogCleaner

        cleaner = LogCleaner()
        try:
            while True:
                await asyncio.sleep(self.config.cleaner_interval_ms / 1000)
                await self.clean_logs(cleaner)
        finally:
            cleaner.shutdown()

    async def clean_logs(self, cleaner: Any) -> int:
        """One cleaner pass over every hosted replica of a compacted topic (leaders and
        followers alike: each compacts its own copy), below its high watermark and, with
        ``tier.enable=true``, below what the Delta table holds; never at or past its
        last stable offset (the first offset of a transaction still open: the cleaner
        removes aborted transactions' records, so it must only see decided ones). The
        rewrite runs on a worker thread; a producer snapshot at the log end is written
        first (on the loop, which owns the producer state), after the aborted-
        transaction entries it covers, so a restart never replays cleaned headers and
        never needs to. Returns the records removed."""
        removed = 0
        tier_progress: dict[str, dict[int, TierProgress]] | None = None
        for (topic, p), partition in list(self.registry.hosted.items()):
            lg = partition.log
            if lg.is_offline or not lg.config.cleanup_policy.compacts:
                continue
            upper = partition.last_stable_offset  # at most the high watermark
            if lg.config.tier_enable:
                if tier_progress is None:
                    tier_progress = await self.read_tier_progress()
                progress = tier_progress.get(topic, {}).get(p)
                if progress is None:
                    continue  # unknown: the local copy may be the only one
                upper = min(upper, progress.tiered_up_to)
            try:
                if not cleaner.needs_cleaning(lg, upper):
                    continue
                partition.snapshot_producer_state()  # aborted-txn entries first
                stats = await asyncio.to_thread(cleaner.clean, lg, upper, force=True)
            except Exception as err:  # one replica's failure must not stop the others
                self.metrics.cleaner_errors.inc()
                log.error("cleaning %s failed: %s", partition.name, err,
                          exc_info=not isinstance(err, StrataError | OSError))
                continue
            if stats is None:
                continue
            self.metrics.cleaner_last_pass.set(stats.seconds)
            if stats.records_removed:
                removed += stats.records_removed
                self.metrics.cleaner_removed.inc(stats.records_removed)
                self.metrics.cleaner_bytes_before.inc(stats.bytes_before)
                self.metrics.cleaner_bytes_after.inc(stats.bytes_after)
                log.info("cleaned %s up to offset %d: %d segment(s) rewritten, %d records "
                         "removed (%d tombstones, %d aborted, %d markers), %d -> %d bytes "
                         "in %.3f s", partition.name, stats.cleaned_up_to,
                         stats.segments_rewritten, stats.records_removed,
                         stats.tombstones_removed, stats.aborted_removed,
                         stats.markers_removed, stats.bytes_before, stats.bytes_after,
                         stats.seconds)
        return removed

    # ------------------------------------------------------------------ flushing
    async def _periodic_flush(self) -> None:
        interval = self.config.flush_scheduler_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            for key, partition in self._interval_flushed():
                try:
                    partition.log.flush_if_due()
                except StrataError as err:
                    # The log refuses writes from now on; say so to every client.
                    log.error("partition %s is OFFLINE: flush failed: %s", partition.name, err)
                    self.registry.offline[key] = err

    def _interval_flushed(self) -> list[tuple[PartitionKey, Partition]]:
        """Hosted partitions of topics with ``flush.policy=interval``. The policy is a
        topic's, so one look per topic: the usual ``none`` costs a hundred checks a
        second at ten thousand partitions, not ten thousand."""
        hosted = self.registry.hosted
        out: list[tuple[PartitionKey, Partition]] = []
        for name, topic in list(self.cluster.topics.items()):
            sample = next((part for p in topic.assignment
                           if (part := hosted.get((name, p))) is not None), None)
            if sample is not None and sample.log.config.flush_policy is FlushPolicy.INTERVAL:
                out.extend(((name, p), part) for p in topic.assignment
                           if (part := hosted.get((name, p))) is not None)
        return out
