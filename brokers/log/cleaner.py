"""Log compaction: keep the latest record per key on the closed segments of a log.

``LogCleaner`` does for ``cleanup.policy=compact`` (and ``compact,delete``) logs what
Kafka's LogCleaner does, in one pass per log:

1. **Cleanable range.** The closed segments that end at or below ``upper_offset``
   (``PartitionLog.cleanable_segments``): the caller passes the high watermark, and for
   a topic with ``tier.enable=true`` at most ``tiered_up_to``, so the tiering job still
   copies the full history to Delta. The active segment is never touched.
2. **Offset map.** One scan of the range builds ``key -> offset of its latest record``.
3. **Rewrite.** Each segment of the range that holds a record to drop is copied to
   ``<base>.log.cleaned`` (plus ``.index.cleaned`` and ``.timeindex.cleaned``) keeping
   a record when it is the latest of its key, except a tombstone (null value) whose
   timestamp is older than ``delete.retention.ms`` (the batch's ``max_timestamp`` for a
   LogAppendTime batch); records without a key (possible only from before the topic
   was compacted: produce refuses them) are dropped, as Kafka does. The very last
   record of the range is always kept, so every gap has a record after it below the
   high watermark and a reader at an offset inside a gap always gets the next batch.
   Segments with nothing to drop are left as they are.
4. **Swap.** ``PartitionLog.replace_segment`` swaps the fsynced files in under the log's
   lock (the only moment the cleaner holds it); an emptied segment other than the
   first is removed instead, the previous one covering its offsets.

Output format. Records carry no per-record offset (record *i* of a batch has offset
``base_offset + i``), so each maximal run of surviving records of one input batch
becomes one output batch: ``base_offset`` the run's first offset, the input's leader
epoch, producer id and epoch, attributes (compression, timestamp type, a sink commit's
transactional bit; the commit-end bit only on the batch's last run), ``base_sequence``
advanced by the run's position (a sink batch keeps its batch id), and for a
LogAppendTime batch the input's append time. Offsets never change and never go
backwards; a dropped record leaves a gap (``compacted-below``, see
``brokers/log/partition_log.py``).

Invariants after a pass, for the cleaned range ``[log start, cleaned_up_to)``:
- reading it returns, in offset order, exactly one record per key (its latest in the
  range) except expired tombstones (and keeps the range's last record);
- every surviving record has the offset, key, value, timestamp and headers it had;
- the active segment and every segment at or above ``upper_offset`` are byte for byte
  unchanged; the log start, the log end, the leader-epoch checkpoint and the producer
  snapshots are not touched (the broker writes a producer snapshot at the log end
  before each pass, so a restart replays the headers after it, never the cleaned ones).

Crash safety: ``.cleaned`` files are written and fsynced before anything else
changes; ``compacted-below`` is raised (fsynced) before the first rename; the rename
of the ``.log.cleaned`` to ``.log.swap`` is the commit point. A ``kill -9`` at any
moment leaves the old segment, or the new one complete in ``.swap`` files that the
next open renames into place (``PartitionLog._finish_swaps``); uncommitted ``.cleaned``
or ``.swap`` files, truncated or not, are deleted on open. Indexes are disposable and
rebuilt when they do not match.

Thread-safety: ``clean`` runs on a worker thread (the broker calls it through
``asyncio.to_thread``) one log at a time; it reads segment files with ``pread``
through their shared descriptors, concurrently with appends (which never touch closed
segments) and fetches. Fetches keep working during and after the swap: a reader that
snapshotted the old segment, or holds a ``FileSlice`` of it, keeps reading the old
(unlinked) file, whose descriptor stays open until the last holder lets go. A segment
deleted by retention or truncation meanwhile makes the swap a no-op. ``shutdown()``
asks a running pass to stop at the next batch.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa

from brokers.log.partition_log import CLEANED_SUFFIX, PartitionLog, _remove_cleaned
from brokers.log.segment import GapBound, LogSegment
from wire.errors import CorruptRecordError, InvalidRecordBatchError, LogClosedError
from wire.record_batch import (
    HEADER,
    LOG_OVERHEAD,
    MAGIC,
    NO_SEQUENCE,
    BatchHeader,
    TimestampType,
    crc_of,
    decode_batch,
    encode_record_batch,
)

__all__ = ["CleanerStats", "LogCleaner", "require_keys"]

log = logging.getLogger("strata.brokers.log")

_COMMIT_END_BIT: Final = 0x40  # attributes bit 6 (docs/format.md)
_CRC = struct.Struct(">I")
_CRC_AT: Final = 17


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class CleanerStats:
    """What one pass over one log did."""

    cleaned_up_to: int  # exclusive end offset of the cleaned range
    segments_rewritten: int
    records_removed: int
    tombstones_removed: int
    bytes_before: int  # of the rewritten segments
    bytes_after: int
    seconds: float


@dataclass(slots=True)
class _LogState:
    cleaned_up_to: int = 0
    # When the oldest tombstone kept by the last pass expires (ms; -1: none kept).
    tombstone_due_ms: int = -1


@dataclass(slots=True)
class _Scan:
    latest: dict[bytes, int] = field(default_factory=dict)
    last_offset: int = -1


class _Stopped(Exception):
    pass


class LogCleaner:
    """Compacts ``PartitionLog``s; see the module docstring. One instance per broker."""

    def __init__(self, *, clock: Callable[[], int] = _now_ms) -> None:
        self._clock = clock
        # Per open log object (a re-created topic's new log starts afresh).
        self._state: weakref.WeakKeyDictionary[PartitionLog, _LogState] = \
            weakref.WeakKeyDictionary()
        self._stopping = threading.Event()

    def shutdown(self) -> None:
        """Make a running pass stop at the next batch (nothing half-swapped is left)."""
        self._stopping.set()

    def needs_cleaning(self, partition_log: PartitionLog, upper_offset: int) -> bool:
        """New closed segments below ``upper_offset`` since the last pass, or a kept
        tombstone that has expired since."""
        if not partition_log.config.cleanup_policy.compacts:
            return False
        try:
            segments = partition_log.cleanable_segments(upper_offset)
        except LogClosedError:
            return False  # closed meanwhile (shutdown, topic deletion): nothing to do
        if not segments:
            return False
        state = self._state.get(partition_log, _LogState())
        if segments[-1].next_offset > state.cleaned_up_to:
            return True
        # A pass drops tombstones older than delete.retention.ms (stamp < now - retention),
        # so the oldest kept one is droppable only once now is past its due time.
        return 0 <= state.tombstone_due_ms < self._clock()

    def clean(self, partition_log: PartitionLog, upper_offset: int, *,
              force: bool = False) -> CleanerStats | None:
        """One pass over ``partition_log`` up to ``upper_offset`` (exclusive; only whole
        closed segments). ``None`` when there was nothing to do (``force``: clean even
        if nothing changed since the last pass) or the log went away meanwhile."""
        if not force and not self.needs_cleaning(partition_log, upper_offset):
            return None
        started = time.monotonic()
        truncations = partition_log.truncations
        try:
            segments = partition_log.cleanable_segments(upper_offset)
            if not segments:
                return None
            end = segments[-1].next_offset
            scan = self._scan(segments)
            config = partition_log.config
            horizon = self._clock() - config.delete_retention_ms
            rewritten = removed = tombstones = before = after = 0
            due = -1
            complete = True
            for segment in segments:
                result = self._rewrite(partition_log, segment, scan, horizon, end,
                                       truncations)
                if result is None:
                    complete = False  # the next pass tries again
                    continue
                seg_removed, seg_tombstones, seg_before, seg_after, seg_due = result
                removed += seg_removed
                tombstones += seg_tombstones
                if seg_due >= 0:
                    due = seg_due if due < 0 else min(due, seg_due)
                if seg_before != seg_after or seg_removed:
                    rewritten += 1
                    before += seg_before
                    after += seg_after
        except (_Stopped, LogClosedError):
            return None
        except OSError:
            if partition_log.is_closed:
                return None  # its directory may be gone (topic deleted under the pass)
            raise
        if complete:
            self._state[partition_log] = _LogState(
                end, -1 if due < 0 else due + config.delete_retention_ms)
        return CleanerStats(end, rewritten, removed, tombstones, before, after,
                            time.monotonic() - started)

    # ------------------------------------------------------------------ scanning
    def _batches(self, segment: LogSegment
                 ) -> Iterator[tuple[int, bytes, BatchHeader, pa.RecordBatch]]:
        """``(position, bytes, header, payload)`` of each batch, CRC-checked; one batch
        in memory at a time."""
        file = segment.file  # held: the descriptor outlives a concurrent delete
        size = segment.size
        for position, header in segment.iter_headers(0, size, file):
            if self._stopping.is_set():
                raise _Stopped
            yield position, *self._read_batch(segment, file.fd, position, header)

    @staticmethod
    def _read_batch(segment: LogSegment, fd: int, position: int, header: BatchHeader
                    ) -> tuple[bytes, BatchHeader, pa.RecordBatch]:
        data = os.pread(fd, header.size, position)
        try:
            decoded, payload = decode_batch(data, verify=True)
        except InvalidRecordBatchError as err:
            raise CorruptRecordError(
                f"the cleaner cannot decode this batch: {err.message}",
                segment=str(segment.log_path), position=position,
                offset=header.base_offset) from err
        return data, decoded, payload

    def _scan(self, segments: list[LogSegment]) -> _Scan:
        scan = _Scan()
        latest = scan.latest
        for segment in segments:
            for _, _, header, payload in self._batches(segment):
                offset = header.base_offset
                for key in payload.column(0).to_pylist():
                    if key is not None:
                        latest[key] = offset
                    offset += 1
                scan.last_offset = header.last_offset
        return scan

    # ------------------------------------------------------------------ rewriting
    def _rewrite(self, partition_log: PartitionLog, segment: LogSegment, scan: _Scan,
                 horizon: int, end: int, truncations: int
                 ) -> tuple[int, int, int, int, int] | None:
        """Rewrite one segment if it holds a record to drop; swap it in.

        A first read decides, batch by batch, which runs of records survive (only
        positions and runs are kept in memory); a second read writes them. Returns
        ``(records removed, tombstones removed, bytes before, bytes after, oldest kept
        tombstone timestamp or -1)``, or ``None`` when the swap did not happen (the
        segment left the log, or the log was truncated, meanwhile).
        """
        plans: list[tuple[int, BatchHeader, list[tuple[int, int]]]] = []
        removed = tombstones = 0
        oldest_tombstone = -1
        for position, _, header, payload in self._batches(segment):
            keys = payload.column(0).to_pylist()
            null_values = payload.column(1).is_null().to_pylist()
            if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
                stamps = [header.max_timestamp] * header.record_count
            else:
                stamps = payload.column(2).to_pylist()
            keep: list[tuple[int, int]] = []  # runs [i, j) of surviving records
            for i, key in enumerate(keys):
                offset = header.base_offset + i
                kept = offset == scan.last_offset or (
                    key is not None and scan.latest.get(key) == offset)
                if kept and null_values[i] and offset != scan.last_offset:
                    if stamps[i] < horizon:
                        kept = False
                        tombstones += 1
                    elif oldest_tombstone < 0 or stamps[i] < oldest_tombstone:
                        oldest_tombstone = stamps[i]
                if not kept:
                    removed += 1
                elif keep and keep[-1][1] == i:
                    keep[-1] = (keep[-1][0], i + 1)
                else:
                    keep.append((i, i + 1))
            plans.append((position, header, keep))
        if not removed:
            return 0, 0, segment.size, segment.size, oldest_tombstone
        size_before = segment.size
        self._write_cleaned(partition_log, segment, plans)
        size_after = partition_log.replace_segment(segment, end, truncations=truncations)
        if size_after is None:
            return None
        return removed, tombstones, size_before, size_after, oldest_tombstone

    def _write_cleaned(self, partition_log: PartitionLog, segment: LogSegment,
                       plans: list[tuple[int, BatchHeader, list[tuple[int, int]]]]) -> None:
        """Write and fsync ``<base>.log.cleaned`` and its indexes. A batch kept whole is
        copied byte for byte; one with dropped records is re-encoded run by run."""
        directory = partition_log.directory
        _remove_cleaned(directory, segment.base_offset)  # a failed earlier pass's leftovers
        path = Path(f"{segment.log_path}{CLEANED_SUFFIX}")
        out = LogSegment(directory, segment.base_offset,
                         partition_log.config.index_interval_bytes, create=True,
                         gaps=GapBound(segment.next_offset), log_path=path)
        try:
            fd = segment.file.fd
            for position, header, runs in plans:
                if self._stopping.is_set():
                    raise _Stopped
                if not runs:
                    continue
                data, _, payload = self._read_batch(segment, fd, position, header)
                if runs == [(0, header.record_count)]:
                    out.append(data, header)
                    continue
                for n, (i, j) in enumerate(runs):
                    batch = _run_batch(header, payload, i, j, last=n == len(runs) - 1)
                    out.append(batch, _header(batch))
            out.seal()
            out.flush()
            if out.is_empty and segment.max_timestamp >= 0:
                # Time retention (compact,delete) reads an empty segment's age from its
                # mtime: the records it held, not the moment of the rewrite.
                stamp = segment.max_timestamp * 1_000_000
                os.utime(path, ns=(stamp, stamp))
        except BaseException:
            out.close(seal=False)
            _remove_cleaned(directory, segment.base_offset)
            raise
        out.close(seal=False)


def require_keys(batch: bytes | bytearray | memoryview, topic: str) -> None:
    """Refuse a batch with a record without a key for a compacted topic, as Kafka does
    (``INVALID_RECORD``): compaction keeps one record per key, so a keyless record
    could only be dropped. Decodes the payload (compacted topics only)."""
    _, payload = decode_batch(batch, verify=False)
    keys = payload.column(0)
    if keys.null_count:
        first = keys.is_null().to_pylist().index(True)
        raise InvalidRecordBatchError(
            f"topic {topic} has cleanup.policy=compact and record {first} of the batch "
            f"({keys.null_count} of {len(keys)}) has no key; give every record a key, or "
            "produce to a topic with cleanup.policy=delete")


def _header(batch: bytes | bytearray) -> BatchHeader:
    return BatchHeader(*HEADER.unpack_from(batch, 0))


def _run_batch(header: BatchHeader, payload: pa.RecordBatch, i: int, j: int, *,
               last: bool) -> bytearray:
    """Records ``[i, j)`` of a batch as a batch of their own (see the module docstring)."""
    data = bytearray(encode_record_batch(payload.slice(i, j - i),
                                         compression=header.compression))
    fresh = _header(data)
    attributes = header.attributes
    if not last:
        attributes &= ~_COMMIT_END_BIT
    if header.base_sequence == NO_SEQUENCE or header.is_transactional:
        sequence = header.base_sequence  # none, or a sink's batch id
    else:
        sequence = header.base_sequence + i
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    HEADER.pack_into(
        data, 0, header.base_offset + i, len(data) - LOG_OVERHEAD, header.leader_epoch,
        MAGIC, 0, attributes, j - i - 1, fresh.first_timestamp,
        header.max_timestamp if log_append else fresh.max_timestamp,
        header.producer_id, header.producer_epoch, sequence, j - i)
    _CRC.pack_into(data, _CRC_AT, crc_of(data))
    return data
