"""The log of one partition: an ordered list of segments in one directory.

Directory layout::

    <dir>/00000000000000000000.log        segments, named by base offset (20 digits)
    <dir>/00000000000000000000.index      sparse offset index of that segment
    <dir>/00000000000000000000.timeindex  sparse time index of that segment
    <dir>/00000000000000000000.txnindex   aborted transactions whose ABORT marker is in
                                          that segment (brokers/log/txn_index.py; only
                                          once it has one)
    <dir>/recovery-point                  offset below which everything is fsynced
                                          and CRC-checked (``OffsetCheckpoint``)
    <dir>/log-start-offset                first readable offset (``OffsetCheckpoint``)
    <dir>/leader-epoch-checkpoint         first offset of each leader epoch
                                          (``LeaderEpochCache``, brokers/log/leader_epoch.py)
    <dir>/.clean-shutdown                 present only between a clean close and the
                                          next open (``CleanShutdownMarker``)
    <dir>/compacted-below                 offsets below it may have gaps (compaction;
                                          ``OffsetCheckpoint``; absent: none may)
    <dir>/<base>.log.cleaned, .log.swap   a cleaner's rewrite of a segment in progress
                                          (brokers/log/cleaner.py); finished or
                                          discarded on open

Invariants:
- segments are sorted by base offset; each starts where the previous one ends; only
  the last ("active") segment is appended to;
- ``log_start_offset <= log_end_offset``; offsets below ``log_start_offset`` are never
  served, even while their segment still exists;
- ``recovery_point <= log_end_offset`` and every byte below it is durable.
- offsets are contiguous from ``compacted_below`` on; below it a batch may start after
  a gap (records the cleaner removed, or a follower's copy of a compacted leader), and
  a closed segment then covers ``[base offset, next segment's base offset)`` even when
  its last batch ends earlier (``next_offset`` is that coverage). A read at an offset
  inside a gap returns the next batch. Offsets never change and never go backwards.
- the leader-epoch cache has one entry per epoch found in the batches from the log
  start on (its first offset, or the log start for the epoch covering it); it is
  updated on every append that brings a larger epoch (written at the next flush or
  close), on truncation, delete-records and retention (written at once). On open it
  is loaded, and rebuilt from the batch headers when the file is missing, malformed or
  disagrees with the log; after a crash the batches from the recovery point on are
  re-checked for epochs the file missed (all of them for a log never flushed, which has
  no file yet).

Opening never deletes data that was durable. After a clean shutdown every segment is
loaded through its indexes (``LogSegment.load``: bad indexes are rebuilt); a segment
whose batch headers do not line up, segments that do not follow each other, or a log
that ends below the recovery point raise ``CorruptRecordError`` naming the file and
byte position, and nothing is modified: the owner keeps the partition offline until
an operator restores it. After an unclean shutdown the segments entirely below the
recovery point are opened the same way (they were fsynced: damage there is damage at
rest and raises too); only the segments at or after the recovery point are recovered
(CRC, contiguous offsets), and a torn tail there is truncated. Segments that can no
longer follow such a truncation are renamed ``<name>.log.corrupt`` (kept for
inspection, invisible to the log) and logged at ERROR, never deleted. Stray temporary
files are removed, and a cleaner swap a crash interrupted is completed (its ``.log.swap``
exists: committed) or discarded (``.cleaned`` files, ``.swap`` indexes) first.

Retention deletes whole closed segments, oldest first, and stops at the first one that
must stay (the log start only ever moves forward over contiguous segments). Without
tiering it applies ``retention.ms`` / ``retention.bytes``. With ``tier.enable=true`` the
tiering job owns the total retention (it trims the Delta table), and a local segment
may go only once it is in the table (``next_offset <= tiered_up_to``, which the broker
reads from ZooKeeper) and it is past ``local.retention.ms`` or the log is over
``local.retention.bytes``; without known progress nothing is deleted, since the local
copy may be the only one.

Thread-safety: one ``RLock`` serialises mutations (append, roll, truncate, retention,
delete-records, flush bookkeeping, close). ``read`` takes the lock only to snapshot the
segment list and runs concurrently with appends. With ``flush.policy=always`` the fsync
runs outside the lock through ``GroupCommit``, so appends keep flowing while a sync is
in progress and concurrent appenders share it. The log cleaner (``cleaner.py``) reads
and writes outside the lock and takes it only in ``replace_segment`` for the swap.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from brokers.log import durability
from brokers.log.checkpoint import CleanShutdownMarker, OffsetCheckpoint, fsync_directory
from brokers.log.config import FlushPolicy, LogConfig, TimestampTypeConfig
from brokers.log.group_commit import GroupCommit, OffsetsTruncatedError
from brokers.log.leader_epoch import LEADER_EPOCH_FILE, EpochEntry, LeaderEpochCache
from brokers.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    TIME_INDEX_SUFFIX,
    FileSlice,
    GapBound,
    LogSegment,
    segment_file_name,
)
from brokers.log.txn_index import TXN_INDEX_SUFFIX, AbortedTxn
from wire.errors import (
    CorruptRecordError,
    InvalidRecordBatchError,
    LogClosedError,
    LogStorageError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from wire.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    ControlType,
    parse_control,
    peek_header,
    set_base_offset,
    set_log_append_time,
    validate,
)

__all__ = ["AppendInfo", "PartitionLog", "SegmentSummary"]

log = logging.getLogger("strata.brokers.log")

RECOVERY_POINT_FILE: Final = "recovery-point"
LOG_START_FILE: Final = "log-start-offset"
CLEAN_SHUTDOWN_FILE: Final = ".clean-shutdown"
CORRUPT_SUFFIX: Final = ".corrupt"  # segments set aside by recovery: <base>.log.corrupt
COMPACTED_BELOW_FILE: Final = "compacted-below"
CLEANED_SUFFIX: Final = ".cleaned"  # a cleaner's output being written: <base>.log.cleaned
SWAP_SUFFIX: Final = ".swap"  # a complete cleaner output being swapped in: <base>.log.swap
_SEGMENT_SUFFIXES: Final = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
# The order a swap renames a segment's files in: the indexes first, the ``.log`` (the
# commit point) last.
_SWAP_ORDER: Final = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an append landed: offsets ``[first_offset, last_offset]``."""

    first_offset: int
    last_offset: int
    record_count: int
    max_timestamp: int
    log_append_time: int  # -1 unless the log stamps LogAppendTime
    size: int


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """A closed segment as the tiering job sees it: offsets ``[base_offset, next_offset)``,
    the newest record's timestamp (ms; the file's mtime for a segment without
    timestamps, as retention uses) and its size on disk."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    size_bytes: int


class PartitionLog:
    """A partition's segments, checkpoints and policies; see the module docstring."""

    def __init__(self, directory: Path | str, config: LogConfig | None = None,
                 *, clock: Callable[[], int] = _now_ms, new: bool = False) -> None:
        """Open the log in ``directory`` (created if missing; recovered if needed).

        ``new``: the caller knows ``directory`` does not exist (it listed the parent):
        the log is created without looking for files a new directory cannot hold (one
        ``mkdir`` and one file creation, where an open of an empty directory costs a
        dozen calls). If the directory exists after all, it is opened as usual."""
        self.directory = Path(directory)
        self.config = config or LogConfig()
        self._clock = clock
        self._lock = threading.RLock()
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        self._closed = False
        self._closed_intact = False  # closed with everything flushed (marker may follow)
        self._offline: BaseException | None = None
        # Always replaced atomically, never in place: on ext4 a rename is ordered after
        # the log data appended before it, an overwrite in place is not, and a recovery
        # point ahead of the durable data would make recovery refuse the log.
        self._recovery_checkpoint = OffsetCheckpoint(self.directory / RECOVERY_POINT_FILE)
        self._start_checkpoint = OffsetCheckpoint(self.directory / LOG_START_FILE)
        self._clean_marker = CleanShutdownMarker(self.directory / CLEAN_SHUTDOWN_FILE)
        self._epochs = LeaderEpochCache(self.directory / LEADER_EPOCH_FILE)
        self._gaps_checkpoint = OffsetCheckpoint(self.directory / COMPACTED_BELOW_FILE)
        self._gaps = GapBound(0)  # shared by every segment of this log
        self._gaps_persisted = 0
        self.epoch_cache_rebuilt = False  # True when open rebuilt it from batch headers
        self.recovered_bytes_truncated = 0
        self.set_aside: list[Path] = []  # segment files recovery renamed to *.corrupt
        self.opened_cleanly = False
        # Bumped by every truncation: a group-commit flush whose log-end snapshot
        # predates one must not move the recovery point.
        self._truncations = 0
        self.recovery_point = 0
        self.log_start_offset = 0
        #: The log was created in a new directory (``new`` and it did not exist).
        self.created_new = new and self._make_directory()
        if self.created_new:
            self._open_new()
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._open()
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self._last_flush_ms = self._clock()
        self._group_commit = GroupCommit(self._flush_for_group_commit, self.recovery_point)

    # ------------------------------------------------------------------ opening
    def _make_directory(self) -> bool:
        """Create the log's directory; ``False`` if it exists already."""
        try:
            os.mkdir(self.directory)
        except FileExistsError:
            return False
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
        return True

    def _open_new(self) -> None:
        """The state ``_open`` finds in an empty directory, without reading it: one
        empty segment at offset 0, checkpoints absent (they read as 0), no epochs, no
        clean-shutdown marker to remove."""
        self._recovery_checkpoint.absent(reads_as=0)
        self._start_checkpoint.absent(reads_as=0)
        segment = LogSegment(self.directory, 0, self.config.index_interval_bytes,
                             create=True, gaps=self._gaps, in_new_directory=True)
        if self.config.flush_policy is not FlushPolicy.NONE:
            fsync_directory(self.directory)
        self._segments = [segment]
        self._base_offsets = [0]
        self._epochs = LeaderEpochCache(self.directory / LEADER_EPOCH_FILE)

    def _open(self) -> None:
        # One listing of the directory instead of a glob per file kind: opening ten
        # thousand logs (a broker's start, a burst of topic creations) is mostly this.
        names = os.listdir(self.directory)
        for name in names:
            if name.endswith(".tmp"):
                (self.directory / name).unlink()
        present = set(names)  # checkpoints that are absent are not opened (10,000 logs)
        self._gaps.below = self._gaps_persisted = (
            self._gaps_checkpoint.read() if COMPACTED_BELOW_FILE in present else None) or 0
        if any(name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for name in names):
            self._finish_swaps()
            names = os.listdir(self.directory)
        stems = (name[: -len(LOG_SUFFIX)] for name in names if name.endswith(LOG_SUFFIX))
        bases = sorted(int(stem) for stem in stems if stem.isdigit())
        live = {f"{b:020d}" for b in bases}
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            for name in names:
                if name.endswith(suffix) and name[: -len(suffix)] not in live:
                    (self.directory / name).unlink()
        self.opened_cleanly = CLEAN_SHUTDOWN_FILE in present
        stored_recovery_point = self._recovery_checkpoint.read() \
            if RECOVERY_POINT_FILE in present else None
        checkpointed_start = self._start_checkpoint.read() if LOG_START_FILE in present \
            else None
        # Absent, both read as 0 (below): a new log's close need not write them.
        if RECOVERY_POINT_FILE not in present:
            self._recovery_checkpoint.absent(reads_as=0)
        if LOG_START_FILE not in present:
            self._start_checkpoint.absent(reads_as=0)
        recovery_point = stored_recovery_point or 0
        checkpointed_recovery_point = recovery_point
        segments = [LogSegment(self.directory, b, self.config.index_interval_bytes, create=False,
                               gaps=self._gaps) for b in bases]
        if self.opened_cleanly:
            segments = self._load_clean(segments, recovery_point)
        else:
            segments = self._recover(segments, recovery_point)
            recovery_point = segments[-1].next_offset if segments else 0
        if not segments:
            start = checkpointed_start or 0
            segments = [self._new_segment(start)]
        self._segments = segments
        self._base_offsets = [s.base_offset for s in segments]
        self.recovery_point = recovery_point
        self.log_start_offset = max(segments[0].base_offset, checkpointed_start or 0)
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        self._load_epochs(scan_from=None if self.opened_cleanly else checkpointed_recovery_point)
        # From here on a crash must be detected at the next open.
        self._clean_marker.remove()
        # Unchanged (a clean reopen, a brand-new log): the file already says so, and a
        # missing one reads as 0. Skipping the rewrite saves two fsyncs per log, which
        # is most of opening ten thousand of them.
        if self.recovery_point != (stored_recovery_point or 0):
            self._epochs.sync()  # what recovery assigned, before the point covers it
            self._recovery_checkpoint.write(self.recovery_point)

    def _load_epochs(self, scan_from: int | None) -> None:
        """Load the leader-epoch cache, or rebuild it from the batch headers.

        ``scan_from`` (after a crash: the recovery point) re-reads the headers from
        there on, since an append may have reached the segment but not the checkpoint.
        """
        path = self.directory / LEADER_EPOCH_FILE
        loaded = LeaderEpochCache.load(path)
        start, end = self.log_start_offset, self.log_end_offset
        covered_from = start
        if start < min(end, self._gaps.below):  # the first batch may follow a gap
            first = next(self.batch_headers(start), None)
            covered_from = start if first is None else max(start, first.base_offset)
        if loaded is not None and self._epochs_consistent(loaded.entries, covered_from, end):
            self._epochs = loaded
            self._epochs.truncate_from_start(start)  # a crash may have cut delete-records short
            if scan_from is not None and scan_from < end:
                for header in self.batch_headers(max(scan_from, start)):
                    self._epochs.assign(header.leader_epoch, max(header.base_offset, start))
            return
        entries: list[EpochEntry] = []
        if start < end:
            for header in self.batch_headers(start):
                if header.leader_epoch >= 0 and (
                        not entries or header.leader_epoch > entries[-1].epoch):
                    offset = max(header.base_offset, start)
                    while entries and entries[-1].start_offset >= offset:
                        entries.pop()
                    entries.append(EpochEntry(header.leader_epoch, offset))
        # A crash before the log's first flush leaves no file (new epochs are written
        # at flush or close) and recovery reads every header anyway: the normal case.
        never_flushed = not path.exists() and scan_from is not None and scan_from <= covered_from
        if (path.exists() or entries) and not never_flushed:
            log.warning("leader-epoch checkpoint of %s was %s; rebuilt it from the batch "
                        "headers: %s", self.directory,
                        "missing" if loaded is None and not path.exists() else
                        "malformed" if loaded is None else "inconsistent with the log",
                        entries)
        self._epochs = LeaderEpochCache(path)
        if entries or path.exists():
            self._epochs.replace(entries)
            self.epoch_cache_rebuilt = not never_flushed
        # else a new, empty log: nothing to write until its first batch assigns an epoch

    @staticmethod
    def _epochs_consistent(entries: tuple[EpochEntry, ...], start: int, end: int) -> bool:
        """No entry past the log end; a non-empty log has an entry covering its start."""
        if not entries:
            return start == end
        if entries[-1].start_offset > end:
            return False
        return start == end or entries[0].start_offset <= start

    def _load_clean(self, segments: list[LogSegment], recovery_point: int) -> list[LogSegment]:
        """Open after a clean shutdown: everything was flushed, so any damage is at rest.

        Raises ``CorruptRecordError`` rather than truncating or dropping anything.
        """
        for segment in segments:
            segment.load()
        self._check_contiguous(segments)
        self._check_reaches(segments, recovery_point)
        return segments

    def _recover(self, segments: list[LogSegment], recovery_point: int) -> list[LogSegment]:
        """Open after a crash: recover (and maybe truncate) only what follows the
        recovery point; everything below it is durable and opened like a clean log.

        A torn tail cuts the log: the segments after it are set aside (renamed to
        ``*.log.corrupt``), not deleted. Damage below the recovery point raises
        ``CorruptRecordError`` before anything is modified.
        """
        kept: list[LogSegment] = []
        for i, segment in enumerate(segments):
            if kept and kept[-1].next_offset < segment.base_offset <= self._gaps.below \
                    and not self.recovered_bytes_truncated:
                kept[-1].next_offset = segment.base_offset  # a compacted gap, not a torn tail
            if kept and segment.base_offset != kept[-1].next_offset:
                previous = kept[-1]
                if min(previous.next_offset, segment.base_offset) < recovery_point:
                    self._check_contiguous([previous, segment])  # raises: durable data
                break  # the previous segment lost a torn tail: the rest cannot follow
            following_base = segments[i + 1].base_offset if i + 1 < len(segments) else None
            if following_base is not None and following_base <= recovery_point:
                segment.load()  # entirely below the recovery point: fsynced data
            else:
                truncated = segment.recover(durable_below=recovery_point)
                segment.flush()
                self.recovered_bytes_truncated += truncated
                if truncated:
                    log.warning("recovery truncated a torn tail of %d bytes from %s "
                                "(offsets from %d on)", truncated, segment.log_path,
                                segment.next_offset)
            kept.append(segment)
        dropped = segments[len(kept):]
        for segment in dropped:
            self.recovered_bytes_truncated += segment.size
            self.set_aside.append(self._set_aside(segment))
        if dropped:
            log.error(
                "recovery of %s set aside %d segment(s) that no longer continue the log, "
                "which now ends at offset %d (a torn tail after the recovery point): %s "
                "(renamed, not deleted; inspect them, then remove them or restore the "
                "partition from a replica)",
                self.directory, len(dropped), kept[-1].next_offset,
                ", ".join(str(p) for p in self.set_aside))
            fsync_directory(self.directory)
        if len(kept) > 1 and kept[-1].is_empty and kept[-1].base_offset > self._gaps.below:
            # (At or below compacted-below the one before may cover a gap up to it: it
            # must stay, or the log would end where that segment's last batch does.)
            kept.pop().delete()  # an empty active segment holds no data
        self._check_reaches(kept, recovery_point)
        return kept

    def _set_aside(self, segment: LogSegment) -> Path:
        """Rename a segment's ``.log`` out of the log (``*.log.corrupt``); drop its indexes."""
        target = segment.log_path.with_name(segment.log_path.name + CORRUPT_SUFFIX)
        for n in itertools.count(1):
            if not target.exists():
                break
            target = segment.log_path.with_name(f"{segment.log_path.name}.{n}{CORRUPT_SUFFIX}")
        segment.log_path.rename(target)
        segment.offset_index.delete()
        segment.time_index.delete()
        segment.txn_index.delete()
        segment.close(seal=False)
        return target

    def _check_contiguous(self, segments: list[LogSegment]) -> None:
        """Each segment starts where the previous one ends; below ``compacted_below`` a
        closed segment whose last batches were compacted away is extended to cover the
        gap up to the next segment's base offset."""
        for before, after in itertools.pairwise(segments):
            if before.next_offset < after.base_offset <= self._gaps.below:
                before.next_offset = after.base_offset
            if before.next_offset != after.base_offset:
                raise CorruptRecordError(
                    f"segment {after.log_path.name} starts at {after.base_offset} but the "
                    f"previous one ends at {before.next_offset}", segment=str(after.log_path),
                    position=0)

    def _check_reaches(self, segments: list[LogSegment], recovery_point: int) -> None:
        """Every offset below the recovery point was fsynced: the log must still hold it."""
        if segments and segments[-1].next_offset < recovery_point:
            last = segments[-1]
            raise CorruptRecordError(
                f"the log ends at offset {last.next_offset} but the recovery point says "
                f"offsets up to {recovery_point} were fsynced: durable data is missing",
                segment=str(last.log_path), position=last.size)

    def _new_segment(self, base_offset: int) -> LogSegment:
        """Create an empty segment file; with a flush policy, make its name durable too."""
        segment = LogSegment(self.directory, base_offset, self.config.index_interval_bytes,
                             create=True, gaps=self._gaps)
        if self.config.flush_policy is not FlushPolicy.NONE:
            fsync_directory(self.directory)
        return segment

    # ------------------------------------------------------------------ state
    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        with self._lock:
            return tuple(self._segments)

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_offline(self) -> bool:
        """True after a disk error: the log refuses writes until the broker restarts."""
        return self._offline is not None

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed; reopen it to write")
        if self._offline is not None:
            raise LogStorageError(
                f"log {self.directory} went offline after a disk error ({self._offline}); "
                "fix the disk and restart the broker")

    # ------------------------------------------------------------------ append
    def append(self, batch: bytes | bytearray | memoryview, *, leader_epoch: int = 0,
               validated: BatchHeader | None = None, wait_for_flush: bool = True) -> AppendInfo:
        """Validate ``batch``, assign its offsets, write it; honour the flush policy.

        Nothing is written when validation fails (``InvalidRecordBatchError``,
        ``RecordTooLargeError``). A caller that already ran ``record_batch.validate``
        passes its header as ``validated`` to skip a second CRC pass. With
        ``wait_for_flush=False`` an append under ``flush.policy=always`` returns before
        the fsync; the caller must then ``wait_durable(info.last_offset + 1)`` before it
        acknowledges (the broker does that off its event loop).
        """
        header = self._check_size(batch) if validated is not None else self.validate(batch)
        data = bytearray(batch)
        log_append_time = -1
        with self._lock:
            self._check_writable()
            base_offset = self.log_end_offset
            set_base_offset(data, base_offset, leader_epoch)
            if self.config.message_timestamp_type is TimestampTypeConfig.LOG_APPEND_TIME:
                log_append_time = self._clock()
                set_log_append_time(data, log_append_time)
            header = peek_header(data)
            self._write(data, header)
            self._assign_epoch(header)
            end = self.log_end_offset
        if wait_for_flush:
            self._after_append(end)
        elif self.config.flush_policy is FlushPolicy.INTERVAL:
            self.flush_if_due()
        return AppendInfo(base_offset, header.last_offset, header.record_count,
                          header.max_timestamp, log_append_time, len(data))

    def append_group(self, batches: Sequence[bytearray | memoryview], *, leader_epoch: int
                     ) -> AppendInfo:
        """Append already-validated ``batches`` as one unit (a sink commit's group).

        They get consecutive offsets and land in one segment with nothing between them,
        so the group is never split by a roll, by retention or by another append (a
        torn group can only be the log's tail after a crash; the partition removes it on
        open). Each batch is stamped in place. Neither flushes nor waits for the flush
        policy's fsync: the caller runs ``flush_if_due`` / ``wait_durable`` after it has
        recorded the group.
        """
        if not batches:
            raise ValueError("append_group needs at least one batch")
        log_append_time = -1
        with self._lock:
            self._check_writable()
            base_offset = offset = self.log_end_offset
            headers: list[BatchHeader] = []
            stamp_time = self.config.message_timestamp_type is TimestampTypeConfig.LOG_APPEND_TIME
            if stamp_time:
                log_append_time = self._clock()
            for data in batches:
                set_base_offset(data, offset, leader_epoch)
                if stamp_time:
                    set_log_append_time(data, log_append_time)
                header = peek_header(data)
                headers.append(header)
                offset = header.next_offset
            total = sum(len(b) for b in batches)
            try:
                if self._should_roll(headers[-1], total):
                    self._roll_locked()
                if self.active_segment.is_empty:
                    self.active_segment.rolled_at_ms = self._clock()
                for data, header in zip(batches, headers, strict=True):
                    self.active_segment.append(data, header)
            except OSError as err:
                raise self._storage_failed(
                    f"write to {self.active_segment.log_path}", err) from err
            self._assign_epoch(headers[0])
        # No flush here: the caller records the group in producer state first, so a
        # failing fsync cannot leave a written group that the state does not know.
        return AppendInfo(base_offset, headers[-1].last_offset, offset - base_offset,
                          max(h.max_timestamp for h in headers), log_append_time, total)

    def wait_durable(self, end_offset: int) -> None:
        """Block until every offset below ``end_offset`` is fsynced (flush.policy=always).

        Raises ``NotLeaderError`` if a truncation removed those offsets meanwhile.
        """
        if self.config.flush_policy is FlushPolicy.ALWAYS:
            self._wait_durable(end_offset)

    def _wait_durable(self, end_offset: int) -> None:
        try:
            self._group_commit.wait_durable(end_offset)
        except OffsetsTruncatedError as err:
            raise NotLeaderError(
                f"log {self.directory} was truncated to offset {err.truncated_to} before "
                f"offsets below {end_offset} were fsynced: those records are not in the log "
                "(the partition's leadership changed); retry on the current leader") from err

    def append_as_follower(self, batch: bytes | bytearray | memoryview) -> AppendInfo:
        """Append a batch whose offsets the leader already assigned (replication).

        The batch must start at the log end offset, or (``cleanup.policy`` with
        ``compact`` only) after it when the leader's log has a compacted gap there
        (``compacted_below`` then moves up to the batch's base offset, persisted with
        the next flush: before that a crash treats the gap as a torn tail and cuts it,
        and the follower fetches again). ``max.message.bytes`` is not checked: the
        leader accepted the batch, and a copy must hold what the leader holds
        (the limit may also have been lowered since).
        """
        header = validate(batch)
        with self._lock:
            self._check_writable()
            if header.base_offset > self.log_end_offset \
                    and self.config.cleanup_policy.compacts:
                self._gaps.below = max(self._gaps.below, header.base_offset)
            elif header.base_offset != self.log_end_offset:
                raise InvalidRecordBatchError(
                    f"replicated batch starts at {header.base_offset} but the log ends at "
                    f"{self.log_end_offset}; truncate or fetch from the log end")
            self._write(batch, header)
            self._assign_epoch(header)
            end = self.log_end_offset
        self._after_append(end)
        return AppendInfo(header.base_offset, header.last_offset, header.record_count,
                          header.max_timestamp, -1, header.size)

    def validate(self, batch: bytes | bytearray | memoryview) -> BatchHeader:
        """Check a batch as ``append`` would (size limit, header, CRC) without writing it."""
        self._check_size(batch)
        return validate(batch)

    def _check_size(self, batch: bytes | bytearray | memoryview) -> BatchHeader:
        if len(batch) > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {len(batch)} bytes exceeds max.message.bytes="
                f"{self.config.max_message_bytes}; send smaller batches or raise the topic's "
                "max.message.bytes")
        return peek_header(batch)

    def _write(self, data: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        try:
            if self._should_roll(header, len(data)):
                self._roll_locked()  # fsyncs the old segment and creates a file: may fail
            if self.active_segment.is_empty:
                self.active_segment.rolled_at_ms = self._clock()
            self.active_segment.append(data, header)
        except OSError as err:
            raise self._storage_failed(f"write to {self.active_segment.log_path}", err) from err

    def _assign_epoch(self, header: BatchHeader) -> None:
        """After a write: a batch from a newer leader epoch starts that epoch."""
        if header.leader_epoch > self._epochs.latest_epoch:
            try:
                self._epochs.assign(header.leader_epoch, header.base_offset)
            except OSError as err:
                raise self._storage_failed(f"write of {self._epochs.path}", err) from err

    # ------------------------------------------------------------------ leader epochs
    @property
    def latest_epoch(self) -> int:
        """The largest leader epoch in the log's epoch cache (-1: none)."""
        with self._lock:
            return self._epochs.latest_epoch

    @property
    def leader_epochs(self) -> tuple[EpochEntry, ...]:
        """The leader-epoch cache: ``(epoch, start_offset)`` in increasing order."""
        with self._lock:
            return self._epochs.entries

    def start_epoch(self, epoch: int) -> bool:
        """A leader taking over with ``epoch`` records that it starts at the log end.

        Kafka does this on becoming leader, not on the first append, so that
        OffsetForLeaderEpoch answers for the new epoch at once (a follower asking before
        any new record would otherwise be told the previous epoch's end). Returns False
        when ``epoch`` is not newer than the latest one.
        """
        with self._lock:
            self._check_writable()
            try:
                return self._epochs.assign(epoch, self.log_end_offset)
            except OSError as err:
                raise self._storage_failed(f"write of {self._epochs.path}", err) from err

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """``(epoch, end offset)`` answering OffsetForLeaderEpoch; see
        ``LeaderEpochCache.end_offset_for``. ``(-1, -1)`` when the epoch is unknown."""
        self._check_open()
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    def _storage_failed(self, what: str, err: OSError) -> LogStorageError:
        """Take the log offline after a disk error; the error for the caller to raise."""
        self._offline = err
        log.error("%s failed: %s; log %s is now offline", what, err, self.directory)
        return LogStorageError(f"{what} failed: {err}; the log is now offline, fix the disk "
                               "and restart the broker")

    def _should_roll(self, header: BatchHeader, size: int) -> bool:
        segment = self.active_segment
        if segment.is_empty:
            return False
        return (
            segment.size + size > self.config.segment_bytes
            or self._clock() - segment.rolled_at_ms >= self.config.segment_ms
            or header.last_offset - segment.base_offset > MAX_RELATIVE_OFFSET
        )

    def _after_append(self, end_offset: int) -> None:
        policy = self.config.flush_policy
        if policy is FlushPolicy.ALWAYS:
            self._wait_durable(end_offset)
        elif policy is FlushPolicy.INTERVAL:
            self.flush_if_due()

    # ------------------------------------------------------------------ flushing
    def _flush_for_group_commit(self) -> int:
        with self._lock:
            self._check_writable()
            end = self.log_end_offset
            segment = self.active_segment
            file = segment.file
            truncations = self._truncations
        try:
            durability.fdatasync(file.fd)
        except OSError as err:
            with self._lock:
                raise self._storage_failed(f"fsync of {segment.log_path}", err) from err
        with self._lock:
            if self._truncations == truncations:  # else ``end`` may name truncated offsets
                self.recovery_point = max(self.recovery_point, end)
        return end

    def flush(self) -> None:
        """Force every appended byte and the indexes to disk; advance the recovery point.

        A disk error takes the log offline and raises ``LogStorageError``: an fsync
        failure must never be ignored (the page cache may have dropped the data).
        """
        with self._lock:
            self._check_writable()
            end = self.log_end_offset
            try:
                for segment in self._segments:
                    if (segment.next_offset > self.recovery_point
                            or segment is self.active_segment):
                        segment.flush()
                self._persist_gaps()  # before a recovery point that covers gaps
                self._epochs.sync()  # the epochs of every batch below the recovery point
                self._recovery_checkpoint.write(end)
            except OSError as err:
                raise self._storage_failed(f"flush of {self.directory}", err) from err
            self.recovery_point = end
            self._last_flush_ms = self._clock()
            self._group_commit.advance(end)

    def flush_if_due(self) -> bool:
        """With ``flush.policy=interval``, flush when ``flush.ms`` passed since the last one."""
        if self.config.flush_policy is not FlushPolicy.INTERVAL:
            return False
        if self._clock() - self._last_flush_ms < self.config.flush_ms:
            return False
        self.flush()
        return True

    # ------------------------------------------------------------------ segments
    def roll(self) -> LogSegment:
        """Close the active segment and start a new one at the log end (no-op if empty)."""
        with self._lock:
            self._check_writable()
            if not self.active_segment.is_empty:
                self._roll_locked()
            return self.active_segment

    def _roll_locked(self) -> None:
        old = self.active_segment
        old.seal()
        # A closed segment is flushed once, so the recovery point can pass it and a
        # crash never re-scans it.
        if self.config.flush_policy is not FlushPolicy.NONE:
            old.flush()
        new = self._new_segment(old.next_offset)
        self._segments.append(new)
        self._base_offsets.append(new.base_offset)

    # ------------------------------------------------------------------ reading
    def read(
        self, offset: int, max_bytes: int, *, upper_offset: int | None = None
    ) -> FileSlice | None:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one).

        ``upper_offset`` (the high watermark, later) bounds what is visible. Returns
        ``None`` at the end of the visible log. Raises ``OffsetOutOfRangeError`` outside
        ``[log_start_offset, log_end_offset]`` and ``CorruptRecordError`` for damaged data.
        """
        self._check_open()
        with self._lock:
            segments = list(self._segments)
            bases = list(self._base_offsets)
            start, end = self.log_start_offset, self.log_end_offset
        if not start <= offset <= end:
            raise OffsetOutOfRangeError(offset, start, end)
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        limit = end if upper_offset is None else min(end, upper_offset)
        if offset >= limit:
            return None
        i = max(0, bisect_right(bases, offset) - 1)
        while i < len(segments):
            segment = segments[i]
            found = segment.read(offset, max_bytes, limit)
            if found is not None:
                return found
            if segment.next_offset > offset and offset >= self._gaps.below:
                # The segment claims the offset but no batch holds it: never skip ahead
                # (below ``compacted_below`` the offset is in a gap: the next segment
                # holds the next batch).
                raise CorruptRecordError(
                    f"no batch holds offset {offset} although the segment ends at "
                    f"{segment.next_offset}", segment=str(segment.log_path), position=0,
                    offset=offset)
            i += 1
        return None

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """First offset whose record timestamp is >= ``timestamp`` (``None``: none is)."""
        found = self.find_by_timestamp(timestamp)
        return None if found is None else found[0]

    def find_by_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, record timestamp)`` of the first record at or after ``timestamp``."""
        self._check_open()
        for segment in self.segments:
            if segment.next_offset <= self.log_start_offset:
                continue
            found = segment.find_by_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------ transactions
    @property
    def txn_index_lost(self) -> bool:
        """A segment's aborted-transaction index could not be read at open: the owner
        must replay the whole log (from its start) to rebuild it."""
        return any(s.txn_index_lost for s in self.segments)

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Record an aborted transaction in the segment holding its ABORT marker."""
        with self._lock:
            segment = self._segment_holding(entry.last_offset)
            if segment is not None:
                segment.add_aborted(entry)

    def _segment_holding(self, offset: int) -> LogSegment | None:
        i = bisect_right(self._base_offsets, offset) - 1
        return self._segments[i] if i >= 0 else None

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping ``[start, end)``, from the segments whose
        markers may describe it (the one holding ``start`` and every later one: a
        transaction that began in the range may end later)."""
        segments = self.segments
        i = max(bisect_right([s.base_offset for s in segments], start) - 1, 0)
        found: list[AbortedTxn] = []
        for segment in segments[i:]:
            found += segment.txn_index.aborted_in(start, end)
        return found

    def persist_txn_indexes(self) -> None:
        """Write and fsync every segment's aborted-transaction entries not yet on disk
        (before a producer-state snapshot, so a replay after it never needs the entries
        before; only indexes with new entries cost an fsync)."""
        with self._lock:
            for segment in self._segments:
                if segment.txn_index.unpersisted:
                    segment.txn_index.persist(fsync=True)

    def read_control(self, offset: int) -> tuple[ControlType, int]:
        """``(type, coordinator epoch)`` of the control batch at ``offset``."""
        found = self.read(offset, HEADER_SIZE + 64)
        if found is None:
            raise InvalidRecordBatchError(f"no batch at offset {offset}")
        data = found.read_bytes()
        return parse_control(data[:peek_header(data).size])

    def batch_headers(self, from_offset: int) -> Iterator[BatchHeader]:
        """Headers of every batch from the one holding ``from_offset`` to the log end."""
        self._check_open()
        for segment in self.segments:
            if segment.next_offset <= from_offset:
                continue
            start = 0
            if segment.base_offset < from_offset:
                start = segment.position_of(from_offset) or 0
            for _, header in segment.iter_headers(start, segment.size):
                yield header

    def verify(self) -> None:
        """Scrub: CRC-check every segment now; raises ``CorruptRecordError`` on damage."""
        self._check_open()
        for segment in self.segments:
            segment.verify_all()

    # ------------------------------------------------------------------ removal
    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is >= ``offset``; return the new log end.

        Whole batches only, so the new end may be below ``offset``. Truncating at or
        below the log start empties the log and restarts it at ``offset``.
        """
        with self._lock:
            self._check_writable()
            if offset >= self.log_end_offset:
                return self.log_end_offset
            self._truncations += 1
            new_end = self._end_after_truncation(offset)
            if self.recovery_point > new_end:
                # First: a crash half-way must never find a recovery point above the
                # data that is left (the next open would report durable data missing).
                self.recovery_point = new_end
                self._recovery_checkpoint.write(new_end)
            if offset <= self.log_start_offset:
                self._restart_at(offset)
            else:
                while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                    self._segments.pop().delete()
                self.active_segment.truncate_to(offset)
                if self.log_end_offset < self.log_start_offset:
                    # The batch holding ``offset`` began below the log start: nothing
                    # readable is left, so the log restarts empty at ``offset``.
                    self._restart_at(offset)
            self._base_offsets = [s.base_offset for s in self._segments]
            end = self.log_end_offset
            self._epochs.truncate_from_end(end)
            if self.recovery_point > end:
                self.recovery_point = end
                self._recovery_checkpoint.write(end)
            self._group_commit.reset(min(self._group_commit.durable_offset, end),
                                     truncated_to=end)
            return end

    def restart_at(self, offset: int) -> None:
        """Drop everything and start the log over, empty, at ``offset`` (>= the log end).

        What a follower does when the leader's log starts past this log's end: nothing
        here can be joined to what the leader still has.
        """
        with self._lock:
            self._check_writable()
            if offset < self.log_end_offset:
                raise ValueError(f"restart_at({offset}) is below the log end "
                                 f"{self.log_end_offset}; use truncate_to")
            self._truncations += 1
            self._restart_at(offset)
            self._base_offsets = [s.base_offset for s in self._segments]
            self.recovery_point = offset
            self._recovery_checkpoint.write(offset)
            self._group_commit.reset(offset, truncated_to=offset)

    def _end_after_truncation(self, offset: int) -> int:
        """The log end ``truncate_to(offset)`` leaves (``offset`` < log end), or for an
        offset in a compacted gap a lower bound of it (the end is the last batch before
        the gap; a recovery point below the data is safe, one above it is not)."""
        if offset <= self.log_start_offset:
            return offset
        i = max(0, bisect_right(self._base_offsets, offset) - 1)
        base = self._segments[i].batch_holding(offset)
        if offset <= self._gaps.below and (base is None or base > offset):
            return self._segments[i].base_offset
        if base is None or base < self.log_start_offset:
            return offset  # the log restarts empty at ``offset``
        return base

    def _restart_at(self, offset: int) -> None:
        for segment in self._segments:
            segment.delete()
        self._segments = [self._new_segment(offset)]
        self.log_start_offset = offset
        self._start_checkpoint.write(offset)
        self._epochs.clear()  # nothing is left that any epoch wrote

    def delete_records(self, new_start_offset: int) -> int:
        """Advance the log start offset (records below it become unreadable)."""
        with self._lock:
            self._check_writable()
            if not self.log_start_offset <= new_start_offset <= self.log_end_offset:
                raise OffsetOutOfRangeError(new_start_offset, self.log_start_offset,
                                            self.log_end_offset)
            self.log_start_offset = new_start_offset
            self._start_checkpoint.write(new_start_offset)
            self._epochs.truncate_from_start(new_start_offset)
            self._delete_segments_below(new_start_offset)
            return self.log_start_offset

    def _delete_segments_below(self, offset: int) -> list[int]:
        deleted: list[int] = []
        while len(self._segments) > 1 and self._segments[0].next_offset <= offset:
            segment = self._segments.pop(0)
            segment.delete()
            deleted.append(segment.base_offset)
        self._base_offsets = [s.base_offset for s in self._segments]
        return deleted

    def closed_segments(self) -> list[SegmentSummary]:
        """Every closed segment (never the active one), oldest first, read under the lock
        so the list is one consistent snapshot (what DescribeTier reports)."""
        self._check_open()
        with self._lock:
            return [SegmentSummary(s.base_offset, s.next_offset, _segment_timestamp(s), s.size)
                    for s in self._segments[:-1]]

    # ------------------------------------------------------------------ compaction
    @property
    def compacted_below(self) -> int:
        """Offsets below this may have gaps (see the module docstring); 0: none may."""
        return self._gaps.below

    def _persist_gaps(self) -> None:
        """Write ``compacted-below`` if it moved (lock held)."""
        below = self._gaps.below
        if below > self._gaps_persisted:
            self._gaps_checkpoint.write(below)
            self._gaps_persisted = below

    @property
    def truncations(self) -> int:
        """How many truncations this log has seen: a cleaner pass that started before
        one must not swap in what it read (``replace_segment``)."""
        return self._truncations

    def cleanable_segments(self, upper_offset: int) -> list[LogSegment]:
        """Closed segments that end at or below ``upper_offset``, oldest first (never the
        active one): what the cleaner may rewrite. One snapshot, taken under the lock."""
        self._check_open()
        with self._lock:
            return [s for s in self._segments[:-1] if s.next_offset <= upper_offset]

    def replace_segment(self, old: LogSegment, compacted_below: int, *,
                        truncations: int | None = None) -> int | None:
        """Swap in the cleaner's rewrite of ``old``: ``<base>.log.cleaned`` and its
        ``.cleaned`` indexes (offset and time index; the aborted-transaction index too
        when ``old`` had one or the rewrite has entries), complete and fsynced. Takes
        the lock only for the renames.

        Order (each step durable before the next): ``compacted-below`` is raised to
        ``compacted_below`` (it only relaxes checks, so raising it early is harmless);
        the indexes, then the log, are renamed ``.cleaned`` -> ``.swap`` (the rename of
        the log is the commit point); the ``.swap`` files are renamed over the live
        names. The ``.txnindex`` thus changes together with the markers it describes: a
        crash leaves the old segment with its old index, or the new one with its new
        index, never a mix. ``_finish_swaps`` completes a committed swap on open and discards an
        uncommitted one. A rewrite that came out empty replaces a segment other than the
        first by nothing: ``old``'s files are deleted (the ``.log`` first: the commit
        point) and the previous segment covers its offsets, as a reopen also concludes
        from ``compacted-below``; the first segment stays, even empty, so the log start
        never moves. Readers holding ``old`` (or a ``FileSlice`` of it) keep reading
        the old file, which stays open until they let go; its bytes are as valid as
        ever. Returns the size of what is now in place (0: removed), or ``None``
        (cleaned files removed) when ``old``
        is no longer a closed segment of this log (retention, truncation, close), or
        the log was truncated since ``truncations`` (what ``truncations`` said when the
        cleaner started reading ``old``).
        """
        base = old.base_offset
        with self._lock:
            if (self._closed or self._offline is not None or old not in self._segments
                    or old is self.active_segment
                    or truncations not in (None, self._truncations)):
                _remove_cleaned(self.directory, base)
                return None
            i = self._segments.index(old)
            try:
                self._gaps.below = max(self._gaps.below, compacted_below)
                self._persist_gaps()
                cleaned = self.directory / (segment_file_name(base, LOG_SUFFIX) + CLEANED_SUFFIX)
                if i > 0 and cleaned.stat().st_size == 0:
                    old.log_path.unlink()
                    old.offset_index.delete()
                    old.time_index.delete()
                    old.txn_index.delete()
                    _remove_cleaned(self.directory, base)
                    fsync_directory(self.directory)
                    old.detach()
                    self._segments[i - 1].next_offset = old.next_offset
                    del self._segments[i]
                    self._base_offsets = [s.base_offset for s in self._segments]
                    return 0
                for suffix in _SWAP_ORDER:
                    name = self.directory / segment_file_name(base, suffix)
                    if suffix == TXN_INDEX_SUFFIX and \
                            not os.path.exists(f"{name}{CLEANED_SUFFIX}"):
                        continue  # neither the old segment nor the rewrite has one
                    os.replace(f"{name}{CLEANED_SUFFIX}", f"{name}{SWAP_SUFFIX}")
                fsync_directory(self.directory)
                _complete_swap(self.directory, base)
                new = LogSegment(self.directory, base, self.config.index_interval_bytes,
                                 create=False, gaps=self._gaps)
                new.load()
            except OSError as err:
                raise self._storage_failed(f"swap of the cleaned segment {base}", err) from err
            except CorruptRecordError as err:
                self._offline = err
                log.error("the cleaned segment %d of %s does not load: %s; log offline",
                          base, self.directory, err)
                raise
            new.next_offset = old.next_offset  # its coverage, up to the next segment
            new.rolled_at_ms = old.rolled_at_ms
            self._segments[i] = new
            old.detach()
            return new.size

    def _finish_swaps(self) -> None:
        """On open: complete the cleaner's committed swaps, discard the rest."""
        changed = False
        for path in self.directory.glob("*" + CLEANED_SUFFIX):
            path.unlink()
            changed = True
        committed = self.directory.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}")
        for stem in sorted(p.name[: -len(LOG_SUFFIX + SWAP_SUFFIX)] for p in committed):
            if stem.isdigit():
                log.warning("%s: completing the cleaner's swap of segment %s interrupted by "
                            "a crash", self.directory, stem)
                _complete_swap(self.directory, int(stem))
                changed = True
        for path in self.directory.glob("*" + SWAP_SUFFIX):
            path.unlink()  # an index whose log never reached .swap: not committed
            changed = True
        if changed:
            fsync_directory(self.directory)

    def apply_retention(self, tiered_up_to: int | None = None, *,
                        before_delete: Callable[[], None] | None = None) -> list[int]:
        """Delete whole closed segments that retention lets go; see the module docstring.

        Without tiering: those past ``retention.ms`` or over ``retention.bytes``. With
        ``tier.enable=true``: ``tiered_up_to`` is the exclusive end offset of what the
        Delta table holds for this partition (``None``: unknown, so nothing is deleted),
        and a segment goes only if it ends at or below it and is past the effective
        ``local.retention.ms`` or the log is over the effective ``local.retention.bytes``.
        The active segment is never deleted. Returns the base offsets deleted.
        ``before_delete``: called (lock held) only when something is about to go, e.g.
        to snapshot state whose only other record is in the doomed segments.
        """
        with self._lock:
            self._check_writable()
            if self.config.tier_enable:
                if tiered_up_to is None:
                    return []
                return self._delete_oldest(self._tiered_doomed(tiered_up_to), before_delete)
            if not self.config.cleanup_policy.deletes:
                return []  # cleanup.policy=compact: the cleaner, not retention, trims it
            now = self._clock()
            closed = self._segments[:-1]
            doomed = 0
            if self.config.retention_ms >= 0:
                while doomed < len(closed) and (
                    _segment_timestamp(closed[doomed]) < now - self.config.retention_ms
                ):
                    doomed += 1
            if self.config.retention_bytes >= 0:
                total = sum(s.size for s in self._segments)
                excess = total - self.config.retention_bytes
                removed = sum(s.size for s in closed[:doomed])
                while doomed < len(closed) and excess - removed >= closed[doomed].size:
                    removed += closed[doomed].size
                    doomed += 1
            return self._delete_oldest(doomed, before_delete)

    def _tiered_doomed(self, tiered_up_to: int) -> int:
        """How many of the oldest closed segments tiered retention deletes (lock held)."""
        now = self._clock()
        local_ms = self.config.effective_local_retention_ms
        local_bytes = self.config.effective_local_retention_bytes
        closed = self._segments[:-1]
        excess = sum(s.size for s in self._segments) - local_bytes
        doomed = removed = 0
        while doomed < len(closed):
            segment = closed[doomed]
            if segment.next_offset > tiered_up_to:
                break  # not (entirely) in the table yet: the local copy is the only one
            expired = local_ms >= 0 and _segment_timestamp(segment) < now - local_ms
            over = local_bytes >= 0 and excess - removed >= segment.size
            if not (expired or over):
                break
            removed += segment.size
            doomed += 1
        return doomed

    def _delete_oldest(self, doomed: int, before_delete: Callable[[], None] | None = None
                       ) -> list[int]:
        """Delete the ``doomed`` oldest segments and move the log start past them."""
        if not doomed:
            return []
        if before_delete is not None:
            before_delete()
        new_start = self._segments[doomed - 1].next_offset
        if new_start > self.log_start_offset:
            self.log_start_offset = new_start
            self._start_checkpoint.write(new_start)
            self._epochs.truncate_from_start(new_start)
        return self._delete_segments_below(new_start)

    # ------------------------------------------------------------------ closing
    def close(self, *, mark_clean: bool = True) -> None:
        """Flush everything, write the checkpoints and the clean-shutdown marker.

        Segments let go of their files without closing them: a ``FileSlice`` still being
        sent keeps its descriptor until it is dropped. After a disk error (the log is
        offline, or this flush fails) nothing more is written, no clean-shutdown marker
        either, and the error is raised once the log is closed.

        ``mark_clean=False`` leaves the marker to :meth:`mark_clean`, for a caller that
        closes many logs with their fsyncs deferred (``durability.deferred_fsyncs``):
        the marker vouches for the files, so it is written only once a file-system sync
        made them durable.
        """
        with self._lock:
            if self._closed:
                return
            try:
                if self._offline is None:
                    try:
                        self.active_segment.seal()  # the final time-index entry gets fsynced
                        self.flush()  # raises LogStorageError itself
                        self._start_checkpoint.write(self.log_start_offset)
                        for segment in self._segments:
                            segment.close()
                        self._closed_intact = True
                        if mark_clean:
                            self._clean_marker.write()
                    except OSError as err:
                        raise self._storage_failed(f"close of {self.directory}", err) from err
            finally:
                for segment in self._segments:
                    segment.close(seal=False)
                self._closed = True

    def mark_clean(self) -> None:
        """Write the clean-shutdown marker of a log closed with ``mark_clean=False``
        (nothing if that close failed); call once its files are durable."""
        with self._lock:
            if not (self._closed and self._closed_intact):
                return
            try:
                self._clean_marker.write()
            except OSError as err:
                log.error("%s: the clean-shutdown marker could not be written (%s): the "
                          "next start recovers this log", self.directory, err)

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove_cleaned(directory: Path, base_offset: int) -> None:
    for suffix in _SEGMENT_SUFFIXES:
        (directory / (segment_file_name(base_offset, suffix) + CLEANED_SUFFIX)).unlink(
            missing_ok=True)


def _complete_swap(directory: Path, base_offset: int) -> None:
    """Rename a committed swap's ``.swap`` files over the live names, indexes first."""
    for suffix in _SWAP_ORDER:
        name = directory / segment_file_name(base_offset, suffix)
        swap = Path(f"{name}{SWAP_SUFFIX}")
        if swap.exists():
            os.replace(swap, name)
    fsync_directory(directory)


def _segment_timestamp(segment: LogSegment) -> int:
    if segment.max_timestamp >= 0:
        return segment.max_timestamp
    return int(os.stat(segment.log_path).st_mtime * 1000)
