"""Log compaction: keep the latest record per key on the closed segments of a log.

``LogCleaner`` does for ``cleanup.policy=compact`` (and ``compact,delete``) logs what
Kafka's LogCleaner does, in one pass per log:

1. **Cleanable range.** The closed segments that end at or below ``upper_offset``
   (``PartitionLog.cleanable_segments``): the caller passes the partition's last stable
   offset (at most the high watermark; never past the first offset of a transaction
   still open, so nothing undecided is ever rewritten), and for a topic with
   ``tier.enable=true`` at most ``tiered_up_to``, so the tiering job still copies the
   full history to Delta. The active segment is never touched.
2. **Offset map.** One scan of the range builds ``key -> offset of its latest record``,
   over the records a read_committed reader sees: transaction markers and the records
   of aborted transactions are left out, so an aborted write never shadows the
   committed record of its key.
3. **Rewrite.** Each segment of the range that holds a record to drop (or a marker to
   stamp or drop, below) is copied to ``<base>.log.cleaned`` (plus ``.index.cleaned``,
   ``.timeindex.cleaned`` and, when it has or had aborted transactions,
   ``.txnindex.cleaned``) keeping a record when it is the latest of its key, except a
   tombstone (null value) whose timestamp is older than ``delete.retention.ms`` (the
   batch's ``max_timestamp`` for a LogAppendTime batch); records without a key
   (possible only from before the topic was compacted: produce refuses them) are
   dropped, as Kafka does. The very last record of the range is always kept, so every
   gap has a record after it below the high watermark and a reader at an offset inside
   a gap always gets the next batch. Segments with nothing to change are left as they
   are.
4. **Transactions** (docs/transactions.md, Kafka's rules). A transactional batch is
   aborted when the aborted-transaction indexes (``.txnindex``, the same source a
   read_committed fetch takes its aborted list from) have an entry with the batch's
   producer id whose ``[first_offset, last_offset]`` holds the batch: such batches are
   dropped whole. A committed transaction's records compact by key like any other.
   A COMMIT or ABORT marker stays as long as this pass read any batch of its
   transaction (the producer's transactional batches since its previous marker), so
   the pass that removes a transaction's last record never removes its marker too.
   Once a pass finds no batch of its transaction, the marker is stamped with a delete
   horizon, ``now + delete.retention.ms`` (``stamp_delete_horizon``: attribute bit 7,
   the horizon in ``first_timestamp``, Kafka's KIP-534), and the first pass after the
   horizon removes it, with its ``.txnindex`` entry. So a consumer that read a
   transaction's data still finds its marker if it reads on within
   ``delete.retention.ms``, and an index entry never outlives its marker (a reader
   given an entry without its marker would skip that producer's later transactions).
   The rewritten ``.txnindex`` holds exactly the old entries whose marker stays.
5. **Swap.** ``PartitionLog.replace_segment`` swaps the fsynced files in under the log's
   lock (the only moment the cleaner holds it); an emptied segment other than the
   first is removed instead, the previous one covering its offsets.

Output format. Records carry no per-record offset (record *i* of a batch has offset
``base_offset + i``), so each maximal run of surviving records of one input batch
becomes one output batch: ``base_offset`` the run's first offset, the input's leader
epoch, producer id and epoch, attributes (compression, timestamp type, the
transactional bit; a sink commit's commit-end bit only on the batch's last run),
``base_sequence`` advanced by the run's position (a sink batch keeps its batch id), and for a
LogAppendTime batch the input's append time. Offsets never change and never go
backwards; a dropped record leaves a gap (``compacted-below``, see
``brokers/log/partition_log.py``).

Invariants after a pass, for the cleaned range ``[log start, cleaned_up_to)``:
- reading it returns, in offset order, exactly one record per key (its latest committed
  or non-transactional record in the range) except expired tombstones (and keeps the
  range's last record); no record of an aborted transaction is left in it (but the
  range's last one); a read_committed read of the log gives the same records before
  and after the pass (less the superseded ones), since the markers and index entries
  of every transaction with a record left are unchanged;
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
or ``.swap`` files, truncated or not, are deleted on open. The ``.txnindex`` goes
through the same ``.cleaned`` -> ``.swap`` renames, before the ``.log``, so after a
crash a segment has the index that matches its markers: the old pair or the new pair.
A marker's delete horizon is inside the batch, so it is swapped in (or not) with the
data it describes. The offset and time indexes are disposable and rebuilt when they
do not match; a ``.txnindex`` that does not read back, or whose entries do not lie in
their segment in order, is rebuilt by replaying the whole log (``LogSegment``,
``Partition``).

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
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa

from brokers.log.partition_log import CLEANED_SUFFIX, PartitionLog, _remove_cleaned
from brokers.log.segment import GapBound, LogSegment
from brokers.log.txn_index import AbortedTxn
from wire.errors import CorruptRecordError, InvalidRecordBatchError, LogClosedError
from wire.record_batch import (
    HEADER,
    LOG_OVERHEAD,
    MAGIC,
    NO_SEQUENCE,
    SINK_PRODUCER_ID_BASE,
    BatchHeader,
    TimestampType,
    crc_of,
    decode_batch,
    encode_record_batch,
    stamp_delete_horizon,
    validate,
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
    records_removed: int  # every record dropped (superseded, tombstones, aborted, markers)
    tombstones_removed: int
    bytes_before: int  # of the rewritten segments
    bytes_after: int
    seconds: float
    aborted_removed: int = 0  # records of aborted transactions
    markers_removed: int = 0  # transaction markers past their delete horizon


@dataclass(slots=True)
class _LogState:
    cleaned_up_to: int = 0
    # When the oldest tombstone kept by the last pass expires (ms; -1: none kept).
    tombstone_due_ms: int = -1
    # When a transaction marker kept by the last pass may be stamped or removed (ms;
    # -1: none).
    marker_due_ms: int = -1


class _Aborted:
    """The aborted transactions a pass applies, per producer id, from the
    ``.txnindex`` entries that overlap the cleaned range."""

    def __init__(self, entries: Sequence[AbortedTxn]) -> None:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for entry in entries:
            ranges.setdefault(entry.producer_id, []).append(
                (entry.first_offset, entry.last_offset))
        self._firsts = {pid: [f for f, _ in sorted(r)] for pid, r in ranges.items()}
        self._lasts = {pid: [last for _, last in sorted(r)] for pid, r in ranges.items()}

    def holds(self, header: BatchHeader) -> bool:
        """Whether ``header`` is a batch of an aborted transaction (a producer's
        transactions in one partition never overlap, so one range can hold it)."""
        if not _is_txn_data(header):
            return False
        firsts = self._firsts.get(header.producer_id)
        if firsts is None:
            return False
        i = bisect_right(firsts, header.base_offset) - 1
        return i >= 0 and self._lasts[header.producer_id][i] >= header.base_offset


@dataclass(slots=True)
class _Scan:
    aborted: _Aborted
    latest: dict[bytes, int] = field(default_factory=dict)
    last_offset: int = -1


@dataclass(slots=True)
class _Walk:
    """A pass's walk over the range in offset order, for the markers: per producer whose
    transactional batches the pass read since that producer's last marker, whether a
    record of them survives the pass."""

    now_ms: int
    retention_ms: int
    open: dict[int, bool] = field(default_factory=dict)
    due_ms: int = -1  # when the next pass has a marker to stamp or remove (-1: none)

    def data(self, header: BatchHeader, survives: bool) -> None:
        if _is_txn_data(header):
            self.open[header.producer_id] = self.open.get(header.producer_id, False) \
                or survives

    def due(self, at_ms: int) -> None:
        self.due_ms = at_ms if self.due_ms < 0 else min(self.due_ms, at_ms)


@dataclass(slots=True)
class _Plan:
    """What a rewrite does with one batch: the runs ``[i, j)`` of records that survive
    (none: dropped whole) and, for a marker, the delete horizon to stamp on it."""

    position: int
    header: BatchHeader
    runs: list[tuple[int, int]]
    stamp_ms: int | None = None


@dataclass(slots=True)
class _SegmentResult:
    removed: int = 0
    tombstones: int = 0
    aborted: int = 0
    markers: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    oldest_tombstone: int = -1
    rewritten: bool = False


class _Stopped(Exception):
    pass


def _is_txn_data(header: BatchHeader) -> bool:
    """A transactional producer's data batch (not a marker, not a sink commit)."""
    return (header.is_transactional and not header.is_control
            and 0 <= header.producer_id < SINK_PRODUCER_ID_BASE)


def _is_marker(header: BatchHeader) -> bool:
    return header.is_control and 0 <= header.producer_id < SINK_PRODUCER_ID_BASE


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
        """New closed segments below ``upper_offset`` since the last pass, a kept
        tombstone that has expired since, or a transaction marker due to be stamped or
        removed."""
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
        now = self._clock()
        return 0 <= state.tombstone_due_ms < now or 0 <= state.marker_due_ms < now

    def clean(self, partition_log: PartitionLog, upper_offset: int, *,
              force: bool = False) -> CleanerStats | None:
        """One pass over ``partition_log`` up to ``upper_offset`` (exclusive; only whole
        closed segments; the caller passes at most the last stable offset). ``None``
        when there was nothing to do (``force``: clean even if nothing changed since the
        last pass) or the log went away meanwhile."""
        if not force and not self.needs_cleaning(partition_log, upper_offset):
            return None
        started = time.monotonic()
        truncations = partition_log.truncations
        try:
            segments = partition_log.cleanable_segments(upper_offset)
            if not segments:
                return None
            end = segments[-1].next_offset
            config = partition_log.config
            # The same entries a read_committed fetch of the range is answered with:
            # every aborted transaction whose records may lie in it (its marker may
            # lie later, up to the last stable offset).
            aborted = _Aborted(partition_log.aborted_transactions(
                segments[0].base_offset, end))
            scan = self._scan(segments, aborted)
            now = self._clock()
            horizon = now - config.delete_retention_ms
            walk = _Walk(now, config.delete_retention_ms)
            total = _SegmentResult()
            rewritten = 0
            due = -1
            complete = True
            for segment in segments:
                result = self._rewrite(partition_log, segment, scan, walk, horizon, end,
                                       truncations)
                if result is None:
                    complete = False  # the next pass tries again
                    continue
                total.removed += result.removed
                total.tombstones += result.tombstones
                total.aborted += result.aborted
                total.markers += result.markers
                if result.oldest_tombstone >= 0:
                    due = result.oldest_tombstone if due < 0 else \
                        min(due, result.oldest_tombstone)
                if result.rewritten:
                    rewritten += 1
                    total.bytes_before += result.bytes_before
                    total.bytes_after += result.bytes_after
        except (_Stopped, LogClosedError):
            return None
        except OSError:
            if partition_log.is_closed:
                return None  # its directory may be gone (topic deleted under the pass)
            raise
        if complete:
            self._state[partition_log] = _LogState(
                end, -1 if due < 0 else due + config.delete_retention_ms, walk.due_ms)
        return CleanerStats(end, rewritten, total.removed, total.tombstones,
                            total.bytes_before, total.bytes_after,
                            time.monotonic() - started, total.aborted, total.markers)

    # ------------------------------------------------------------------ scanning
    def _batches(self, segment: LogSegment, undecoded: Callable[[BatchHeader], bool]
                 ) -> Iterator[tuple[int, bytes, BatchHeader, pa.RecordBatch | None]]:
        """``(position, bytes, header, payload)`` of each batch, CRC-checked; one batch
        in memory at a time. The payload is ``None`` for a marker (not Arrow) and for
        the batches ``undecoded`` names (no record of theirs is looked at)."""
        file = segment.file  # held: the descriptor outlives a concurrent delete
        size = segment.size
        for position, header in segment.iter_headers(0, size, file):
            if self._stopping.is_set():
                raise _Stopped
            data = self._read_checked(segment, file.fd, position, header)
            if header.is_control or undecoded(header):
                yield position, data, header, None
            else:
                yield position, data, header, self._decode(segment, data, position, header)

    @staticmethod
    def _read_checked(segment: LogSegment, fd: int, position: int, header: BatchHeader
                      ) -> bytes:
        data = os.pread(fd, header.size, position)
        try:
            validate(data)
        except InvalidRecordBatchError as err:
            raise CorruptRecordError(
                f"the cleaner cannot read this batch: {err.message}",
                segment=str(segment.log_path), position=position,
                offset=header.base_offset) from err
        return data

    @staticmethod
    def _decode(segment: LogSegment, data: bytes, position: int, header: BatchHeader
                ) -> pa.RecordBatch:
        try:
            _, payload = decode_batch(data, verify=False)
        except InvalidRecordBatchError as err:
            raise CorruptRecordError(
                f"the cleaner cannot decode this batch: {err.message}",
                segment=str(segment.log_path), position=position,
                offset=header.base_offset) from err
        return payload

    def _scan(self, segments: list[LogSegment], aborted: _Aborted) -> _Scan:
        scan = _Scan(aborted)
        latest = scan.latest
        for segment in segments:
            for _, _, header, payload in self._batches(segment, aborted.holds):
                scan.last_offset = header.last_offset
                if payload is None:
                    continue  # a marker, or an aborted transaction's batch: no key counts
                offset = header.base_offset
                for key in payload.column(0).to_pylist():
                    if key is not None:
                        latest[key] = offset
                    offset += 1
        return scan

    # ------------------------------------------------------------------ rewriting
    def _rewrite(self, partition_log: PartitionLog, segment: LogSegment, scan: _Scan,
                 walk: _Walk, horizon: int, end: int, truncations: int
                 ) -> _SegmentResult | None:
        """Rewrite one segment if it holds a record to drop or a marker to stamp; swap
        it in.

        A first read decides, batch by batch, which runs of records survive (only
        positions and runs are kept in memory); a second read writes them. Returns what
        changed, or ``None`` when the swap did not happen (the segment left the log, or
        the log was truncated, meanwhile).
        """
        plans: list[_Plan] = []
        result = _SegmentResult(bytes_before=segment.size, bytes_after=segment.size)
        last = scan.last_offset
        stamped = False
        dropped_markers: set[int] = set()

        def undecoded(header: BatchHeader) -> bool:  # dropped whole: no record looked at
            return scan.aborted.holds(header) and header.last_offset != last

        for position, _, header, payload in self._batches(segment, undecoded):
            if header.is_control:
                plan = self._plan_marker(position, header, walk, last)
                if plan.stamp_ms is not None:
                    stamped = True
                if not plan.runs:
                    result.removed += 1
                    result.markers += 1
                    dropped_markers.add(header.base_offset)
                plans.append(plan)
                continue
            if payload is None or scan.aborted.holds(header):
                # An aborted transaction's batch: gone whole (but the range's last record).
                keep = [(header.record_count - 1, header.record_count)] \
                    if header.last_offset == last else []
                dropped = header.record_count - len(keep)
                result.removed += dropped
                result.aborted += dropped
                walk.data(header, bool(keep))
                plans.append(_Plan(position, header, keep))
                continue
            keys = payload.column(0).to_pylist()
            null_values = payload.column(1).is_null().to_pylist()
            if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
                stamps = [header.max_timestamp] * header.record_count
            else:
                stamps = payload.column(2).to_pylist()
            keep = []  # runs [i, j) of surviving records
            for i, key in enumerate(keys):
                offset = header.base_offset + i
                kept = offset == last or (
                    key is not None and scan.latest.get(key) == offset)
                if kept and null_values[i] and offset != last:
                    if stamps[i] < horizon:
                        kept = False
                        result.tombstones += 1
                    elif result.oldest_tombstone < 0 or stamps[i] < result.oldest_tombstone:
                        result.oldest_tombstone = stamps[i]
                if not kept:
                    result.removed += 1
                elif keep and keep[-1][1] == i:
                    keep[-1] = (keep[-1][0], i + 1)
                else:
                    keep.append((i, i + 1))
            walk.data(header, bool(keep))
            plans.append(_Plan(position, header, keep))
        if not result.removed and not stamped:
            return result
        entries = [e for e in segment.txn_index.entries
                   if e.last_offset not in dropped_markers]
        self._write_cleaned(partition_log, segment, plans, entries)
        size_after = partition_log.replace_segment(segment, end, truncations=truncations)
        if size_after is None:
            return None
        result.bytes_after = size_after
        result.rewritten = True
        return result

    @staticmethod
    def _plan_marker(position: int, header: BatchHeader, walk: _Walk, last: int) -> _Plan:
        """Keep, stamp or drop a transaction marker (see the module docstring, 4.)."""
        whole = [(0, header.record_count)]
        if not _is_marker(header):
            return _Plan(position, header, whole)  # not a transaction's: left alone
        pid = header.producer_id
        if pid in walk.open:
            # The pass read batches of its transaction: the marker stays as it is. If
            # none of them survives, the next pass stamps it.
            if not walk.open.pop(pid):
                walk.due(walk.now_ms)
            return _Plan(position, header, whole)
        deadline = header.delete_horizon_ms
        if deadline is None:
            deadline = walk.now_ms + walk.retention_ms
            if header.base_offset != last:
                walk.due(deadline)
            return _Plan(position, header, whole, deadline)
        if header.base_offset == last:
            return _Plan(position, header, whole)  # the range's last record stays
        if deadline < walk.now_ms:
            return _Plan(position, header, [])
        walk.due(deadline)
        return _Plan(position, header, whole)

    def _write_cleaned(self, partition_log: PartitionLog, segment: LogSegment,
                       plans: list[_Plan], entries: list[AbortedTxn]) -> None:
        """Write and fsync ``<base>.log.cleaned`` and its indexes. A batch kept whole is
        copied byte for byte (a marker stamped with its delete horizon); one with
        dropped records is re-encoded run by run. The ``.txnindex.cleaned`` holds
        ``entries`` and is written when there are any or ``segment`` had an index file
        (its swap then replaces that file, even by an empty one)."""
        directory = partition_log.directory
        _remove_cleaned(directory, segment.base_offset)  # a failed earlier pass's leftovers
        path = Path(f"{segment.log_path}{CLEANED_SUFFIX}")
        had_index = bool(segment.txn_index.entries) or segment.txn_index.path.exists()
        out = LogSegment(directory, segment.base_offset,
                         partition_log.config.index_interval_bytes, create=True,
                         gaps=GapBound(segment.next_offset), log_path=path)
        try:
            fd = segment.file.fd
            for plan in plans:
                if self._stopping.is_set():
                    raise _Stopped
                header = plan.header
                runs = plan.runs
                if not runs:
                    continue
                data = self._read_checked(segment, fd, plan.position, header)
                if plan.stamp_ms is not None:
                    stamped = bytearray(data)
                    stamp_delete_horizon(stamped, plan.stamp_ms)
                    out.append(stamped, _header(stamped))
                    continue
                if runs == [(0, header.record_count)]:
                    out.append(data, header)
                    continue
                payload = self._decode(segment, data, plan.position, header)
                for n, (i, j) in enumerate(runs):
                    batch = _run_batch(header, payload, i, j, last=n == len(runs) - 1)
                    out.append(batch, _header(batch))
            out.seal()
            out.flush()
            if entries or had_index:
                out.txn_index.write(entries)
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
    if header.base_sequence == NO_SEQUENCE or header.producer_id >= SINK_PRODUCER_ID_BASE:
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
