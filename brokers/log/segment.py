"""One segment of a partition log: ``<base offset>.log`` plus its two sparse indexes.

Byte layout of the ``.log`` file: record batches (``wire.record_batch``) back to back,
no file header, no padding. The file name is the segment's base offset as 20 digits.

Invariants:
- the first batch's base offset is the segment's base offset; every next batch starts
  at the previous batch's ``next_offset`` (offsets are contiguous); except, after log
  compaction, for batches starting at or below ``GapBound.below``, which may follow a
  gap (never an overlap);
- every batch passed ``record_batch.validate`` before it was written;
- ``size`` only grows by whole batches; a reader that snapshots ``size`` sees whole
  batches only;
- relative offsets fit in uint32 and positions in uint32 (the log rolls before either
  would overflow: ``segment.bytes`` is capped at 2 GiB - 1).

Opening: ``load()`` is the path for data that is known to be durable (after a clean
shutdown, or below the recovery point): it loads the indexes, checks them, and walks
the batch headers after the last offset-index entry. An index that fails its check or
does not match the headers is rebuilt from the batch headers (indexes are disposable);
damage to the log itself (headers that do not line up) raises ``CorruptRecordError``
naming the file and byte position, and nothing is changed in the ``.log``.
``recover(durable_below)`` is for bytes that may be a torn tail after a crash: it
re-reads every batch, checks its CRC and offset continuity, truncates the file at the
first invalid byte and rebuilds both indexes; an invalid batch at an offset below
``durable_below`` (the recovery point: fsynced, so not torn) raises instead.

Every error about stored bytes is a ``CorruptRecordError`` with ``segment`` and
``position`` set, whichever path found it (open, index rebuild, header walk, read,
timestamp lookup, scrub).

Detection of damage that happened at rest: each segment remembers which byte ranges
this process has CRC-checked (``verified_ranges``: a short list of merged intervals;
bytes appended or recovered by this process count as checked). ``read`` checks only
the batches of the range it returns that are not covered yet (CRC of each batch,
offset continuity), so a flipped byte is reported as ``CorruptRecordError`` (with
segment and position) instead of being served, each byte is checked once per process,
and the first fetch near the end of a large closed segment costs only what it returns.
``verify_all`` re-checks the whole segment (a scrub).

Descriptor lifetime: the ``.log`` descriptor lives in a ``SegmentFile`` shared by the
segment and every ``FileSlice`` handed out. Nothing closes it explicitly: ``close`` and
``delete`` only drop the segment's reference, and the descriptor is closed by
``SegmentFile.__del__`` once the last holder is gone (CPython reference counting), so
an in-flight ``sendfile`` never sees its descriptor closed or its number reused.

Thread-safety: mutations (append, truncate, roll, close, delete) run under the owning
``PartitionLog``'s lock. ``read`` may run concurrently with ``append`` on other
threads: it works on a snapshot of ``size`` and of the file, and only ever sees whole
batches; the verified ranges are updated under the segment's own lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from brokers.log import durability
from brokers.log.index_file import IndexCorruptError
from brokers.log.offset_index import OffsetIndex
from brokers.log.time_index import TimeIndex
from brokers.log.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex
from wire.errors import CorruptRecordError, InvalidRecordBatchError, LogClosedError
from wire.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    TimestampType,
    decode_batch,
    int_scalar,
    peek_header,
    validate,
)

__all__ = ["FileSlice", "GapBound", "LogSegment", "SegmentFile", "segment_file_name"]

log = logging.getLogger("strata.brokers.log")

#: A boolean scalar made without ``pa.scalar`` (which imports pandas the first time).
_TRUE: Final = pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(b"\x01")])[0]

MAX_RELATIVE_OFFSET: Final = 2**32 - 1
_VERIFY_CHUNK: Final = 8 << 20  # bytes read per step when verifying
LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class GapBound:
    """Below which offset a batch may follow an offset gap (shared by a log's segments).

    Offsets are contiguous in a log that was never compacted; the cleaner
    (``brokers/log/cleaner.py``) and a follower copying a compacted leader leave gaps.
    ``below`` is the ``compacted-below`` checkpoint of the owning ``PartitionLog``: a
    batch whose base offset is at or below it may start after a gap (and a segment's
    first batch after its base offset); above it every offset-continuity check of this
    module stays strict, so damage in data that was never compacted is still found.
    """

    __slots__ = ("below",)

    def __init__(self, below: int = 0) -> None:
        self.below = below

    def follows(self, expected: int, base_offset: int) -> bool:
        """May a batch starting at ``base_offset`` come where ``expected`` was next?"""
        return base_offset == expected or expected < base_offset <= self.below


class SegmentFile:
    """An open ``.log`` file descriptor, closed when the last holder lets go.

    The segment and every ``FileSlice`` hold a reference. There is deliberately no
    ``close`` method: the descriptor is closed in ``__del__`` only, when CPython's
    reference count drops to zero, so a slice being sent with ``os.sendfile`` keeps a
    valid descriptor (and, for a deleted segment, its inode) until the send is done,
    and the descriptor number can never be reused under it.
    """

    __slots__ = ("fd", "path")

    def __init__(self, path: Path, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.path = path
        self.fd = -1  # so __del__ is safe when os.open raises (e.g. FileExistsError)
        self.fd = os.open(path, flags, 0o644)

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Whole batches ``[position, position + length)`` of one segment file.

    ``first_offset`` is the base offset of the first batch, which may be below the
    offset that was asked for; ``next_offset`` follows the last batch. A server sends
    it with ``os.sendfile(sock, slice.fileno(), slice.position, slice.length)``; the
    descriptor stays open while the slice exists, even if the log is closed or the
    segment deleted meanwhile.
    """

    file: SegmentFile
    position: int
    length: int
    first_offset: int
    next_offset: int

    def fileno(self) -> int:
        return self.file.fd

    def read_bytes(self) -> bytes:
        """The slice's bytes (for clients and tests; servers use ``sendfile``)."""
        return os.pread(self.file.fd, self.length, self.position)


class LogSegment:
    """A ``.log`` file with its offset and time indexes; see the module docstring."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int,
                 *, create: bool, gaps: GapBound | None = None,
                 log_path: Path | None = None, in_new_directory: bool = False) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.gaps = gaps if gaps is not None else GapBound()
        self.index_interval_bytes = index_interval_bytes
        self.log_path = log_path or directory / segment_file_name(base_offset, LOG_SUFFIX)
        # A cleaner's work file (``<base>.log.cleaned``) gets ``<base>.index.cleaned`` etc.
        extra = self.log_path.name[len(segment_file_name(base_offset, LOG_SUFFIX)):]
        self.offset_index = OffsetIndex(
            directory / (segment_file_name(base_offset, INDEX_SUFFIX) + extra))
        self.time_index = TimeIndex(
            directory / (segment_file_name(base_offset, TIME_INDEX_SUFFIX) + extra))
        # Aborted transactions whose ABORT marker is in this segment (brokers/log/
        # txn_index.py): derived data, rebuilt from the log if lost.
        self.txn_index = TransactionIndex(
            directory / (segment_file_name(base_offset, TXN_INDEX_SUFFIX) + extra))
        #: The txn index could not be read at load: the partition must replay its whole
        #: log to rebuild it (``PartitionLog.txn_index_lost``).
        self.txn_index_lost = False
        self._file: SegmentFile | None = SegmentFile(self.log_path, create=create)
        # A segment created in a directory made a moment ago (a new log) is empty and
        # has no stale index files to remove: no ``fstat``, no ``unlink``s (a burst of
        # ten thousand new logs is mostly file-system calls).
        self.size = 0 if create and in_new_directory else os.fstat(self._file.fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._relative_offset_of_max_timestamp = 0
        self._bytes_since_index = 0
        # Byte ranges [start, end) CRC- and continuity-checked by this process: sorted,
        # disjoint and never touching (adjacent ranges are merged). The list is never
        # mutated in place, only replaced under _lock, so readers may use a snapshot.
        self._verified: list[tuple[int, int]] = []
        self._lock = threading.RLock()
        self._detached = False
        self.rolled_at_ms = time.time_ns() // 1_000_000
        if create and not in_new_directory:
            self.offset_index.clear()
            self.time_index.clear()
            self.txn_index.clear()

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path.name}, size={self.size}, next={self.next_offset})"

    @property
    def file(self) -> SegmentFile:
        """The open ``.log`` file; ``LogClosedError`` once the segment is closed or deleted."""
        file = self._file
        if file is None:
            raise LogClosedError(f"segment {self.log_path} is closed")
        return file

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    @property
    def verified_ranges(self) -> tuple[tuple[int, int], ...]:
        """Byte ranges ``[start, end)`` this process has CRC-checked (merged, sorted)."""
        return tuple(self._verified)

    @property
    def verified_position(self) -> int:
        """End of the checked prefix ``[0, n)`` of the file (0 if byte 0 is unchecked)."""
        ranges = self._verified
        return ranges[0][1] if ranges and ranges[0][0] == 0 else 0

    def _corrupt(self, message: str, position: int,
                 offset: int | None = None) -> CorruptRecordError:
        return CorruptRecordError(message, segment=str(self.log_path), position=position,
                                  offset=offset)

    # ------------------------------------------------------------------ opening
    def load(self) -> None:
        """Open durable data through the indexes; rebuild indexes that do not match.

        Raises ``CorruptRecordError`` (file and byte position) when the batch headers
        themselves do not line up; the ``.log`` is never modified here.
        """
        self._load_txn_index()
        self._load_log_indexes()
        self._check_txn_index()

    def _load_log_indexes(self) -> None:
        try:
            if self.size and not (self.offset_index.path.exists()
                                  and self.time_index.path.exists()):
                raise IndexCorruptError("an index file is missing")
            self.offset_index.load()
            self.time_index.load()
            limit = MAX_RELATIVE_OFFSET + 1
            self.offset_index.check(limit, self.size)
            self.time_index.check(2**63 - 1, limit)
            self._load_tail()
        except IndexCorruptError as err:
            log.info("%s: %s; rebuilding the indexes", self.log_path.name, err)
            self.rebuild_indexes()
            return
        except CorruptRecordError as err:
            # The last index entry may be what is wrong (indexes are disposable): a
            # rebuild walks every header from byte 0 and raises if the log is damaged.
            log.warning("%s: the headers after the last index entry do not line up (%s); "
                        "rebuilding the indexes from the whole file", self.log_path.name, err)
            self.rebuild_indexes()
            return
        self._set_rolled_at_from_first_batch()

    def _load_txn_index(self) -> None:
        try:
            self.txn_index.load()
        except IndexCorruptError as err:
            self._lose_txn_index(err)

    def _check_txn_index(self) -> None:
        """Once the segment's extent is known: every entry's marker lies in it, in order
        (a duplicate or stray entry makes the whole index be rebuilt from the log)."""
        try:
            self.txn_index.check(self.base_offset, self.next_offset)
        except IndexCorruptError as err:
            self._lose_txn_index(err)

    def _lose_txn_index(self, err: IndexCorruptError) -> None:
        log.warning("%s: %s; the aborted-transaction index is rebuilt from the log",
                    self.log_path.name, err)
        self.txn_index.clear()
        self.txn_index_lost = True

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Record an aborted transaction whose ABORT marker this segment holds (a repeat
        of the newest entry, as a log replay makes, is skipped)."""
        entries = self.txn_index.entries
        if entries and entries[-1].last_offset >= entry.last_offset:
            return
        with self._lock:
            self.txn_index.append(entry)

    def _load_tail(self) -> None:
        """Walk the headers after the last offset-index entry to find the segment's end."""
        relative, position = self.offset_index.lookup(MAX_RELATIVE_OFFSET)
        self.next_offset = self.base_offset + relative
        self.max_timestamp = self.time_index.last_timestamp
        self._relative_offset_of_max_timestamp = (
            self.time_index.values[-1] if self.time_index else 0)
        self._bytes_since_index = 0
        for pos, header in self.iter_headers(position, self.size):
            if not self.gaps.follows(self.next_offset, header.base_offset):
                raise self._corrupt(
                    f"offset gap: batch starts at {header.base_offset}, expected "
                    f"{self.next_offset}", pos, header.base_offset)
            self.next_offset = header.next_offset
            self._track_timestamp(header)
            self._bytes_since_index += header.size

    def rebuild_indexes(self) -> None:
        """Recreate both index files from the batch headers (no CRC check).

        Raises ``CorruptRecordError`` when the headers do not line up.
        """
        with self._lock:
            self._rebuild_indexes()

    def _rebuild_indexes(self) -> None:
        self.offset_index.clear()
        self.time_index.clear()
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self._relative_offset_of_max_timestamp = 0
        self._bytes_since_index = 0
        for pos, header in self.iter_headers(0, self.size):
            if not self.gaps.follows(self.next_offset, header.base_offset):
                raise self._corrupt(
                    f"offset gap: batch starts at {header.base_offset}, expected "
                    f"{self.next_offset}", pos, header.base_offset)
            self._index_batch(header, pos)
            self.next_offset = header.next_offset
        self._set_rolled_at_from_first_batch()

    def recover(self, durable_below: int = 0) -> int:
        """Validate every batch, truncate at the first bad byte, rebuild the indexes.

        Returns the number of bytes truncated (0 for a healthy segment). Only a torn
        tail may be cut: when the first bad batch starts below ``durable_below`` (the
        recovery point, below which everything was fsynced) nothing is truncated and
        ``CorruptRecordError`` names the file and position.
        """
        with self._lock:
            # The aborted-transaction index on disk holds every entry persisted before
            # the crash (a replay from the producer snapshot adds the later ones).
            self._load_txn_index()
            file = self.file
            self.offset_index.clear()
            self.time_index.clear()
            self.next_offset = self.base_offset
            self.max_timestamp = -1
            self._relative_offset_of_max_timestamp = 0
            self._bytes_since_index = 0
            position = 0
            size = self.size
            while position < size:
                header, problem = self._check_batch_at(file, position, size)
                if header is None:
                    if self.next_offset < durable_below:
                        raise self._corrupt(
                            f"{problem}; offsets below the recovery point {durable_below} "
                            "were fsynced before the crash, so this is damage at rest, not "
                            "a torn write, and recovery does not truncate it", position,
                            self.next_offset)
                    log.warning("%s: torn tail at byte %d (%s)", self.log_path.name,
                                position, problem)
                    break
                self._index_batch(header, position)
                self.next_offset = header.next_offset
                position += header.size
            truncated = size - position
            if truncated:
                os.ftruncate(file.fd, position)
                self.size = position
            self.txn_index.truncate_to(self.next_offset)  # markers of the torn tail
            self._check_txn_index()
            self._verified = [(0, self.size)] if self.size else []
            self._set_rolled_at_from_first_batch()
            return truncated

    def _check_batch_at(self, file: SegmentFile, position: int,
                        size: int) -> tuple[BatchHeader | None, str]:
        """``(header, "")`` for a fully valid batch at ``position``, else ``(None, why)``."""
        try:
            header = peek_header(os.pread(file.fd, HEADER_SIZE, position))
        except InvalidRecordBatchError as err:
            return None, err.message
        if position + header.size > size:
            return None, f"batch of {header.size} bytes runs past the end of the file ({size})"
        if not self.gaps.follows(self.next_offset, header.base_offset):
            return None, (f"offset gap: batch starts at {header.base_offset}, expected "
                          f"{self.next_offset}")
        try:
            validate(os.pread(file.fd, header.size, position))
        except InvalidRecordBatchError as err:
            return None, err.message
        return header, ""

    def _set_rolled_at_from_first_batch(self) -> None:
        if not self.size:
            return
        try:
            header = peek_header(os.pread(self.file.fd, HEADER_SIZE, 0))
        except InvalidRecordBatchError as err:
            raise self._corrupt(err.message, 0) from err
        if not self.gaps.follows(self.base_offset, header.base_offset):
            raise self._corrupt(
                f"the first batch starts at offset {header.base_offset} but the segment's "
                f"file name says {self.base_offset}", 0, header.base_offset)
        self.rolled_at_ms = min(self.rolled_at_ms, header.max_timestamp)

    # ------------------------------------------------------------------ writing
    def append(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> int:
        """Write one validated batch whose offsets are already assigned; return its position.

        The owner sets ``rolled_at_ms`` (its clock) before the first append, for ``segment.ms``.
        """
        with self._lock:
            fd = self.file.fd
            position = self.size
            view = memoryview(batch)
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], position + written)
            self._index_batch(header, position)
            self.next_offset = header.next_offset
            self.size = position + len(view)
            self._mark_verified(position, self.size)  # validated before it was written
            return position

    def _track_timestamp(self, header: BatchHeader) -> None:
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self._relative_offset_of_max_timestamp = header.base_offset - self.base_offset

    def _index_batch(self, header: BatchHeader, position: int) -> None:
        self._track_timestamp(header)
        if self._bytes_since_index >= self.index_interval_bytes:
            self.offset_index.append(header.base_offset - self.base_offset, position)
            self._maybe_append_time_entry()
            self._bytes_since_index = 0
        self._bytes_since_index += header.size

    def _maybe_append_time_entry(self) -> None:
        if self.max_timestamp > self.time_index.last_timestamp and (
            not self.time_index
            or self._relative_offset_of_max_timestamp > self.time_index.values[-1]
        ):
            self.time_index.append(self.max_timestamp, self._relative_offset_of_max_timestamp)

    def flush(self) -> None:
        """fdatasync the log and persist + fsync the indexes (in a bulk close, an empty
        segment without index entries gets no index files: the first close of ten
        thousand new logs would otherwise create twenty thousand empty files)."""
        durability.fdatasync(self.file.fd)
        if self._nothing_to_index():
            return
        self.offset_index.persist(fsync=True)
        self.time_index.persist(fsync=True)
        self.txn_index.persist(fsync=True)

    def seal(self) -> None:
        """The segment stops being active: record the final max timestamp in the time index."""
        self._maybe_append_time_entry()
        if self._nothing_to_index():
            return
        self.offset_index.persist(fsync=False)
        self.time_index.persist(fsync=False)
        self.txn_index.persist(fsync=False)

    def _nothing_to_index(self) -> bool:
        """Empty, no entries, and closing (or opening) in bulk: ``load`` takes absent
        index files as empty. (The cleaner's ``.cleaned`` files are always created: its
        swap renames each of them.)"""
        return self.size == 0 and not self.offset_index and not self.time_index \
            and not self.txn_index and durability.deferring()

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= ``offset`` (whole batches only)."""
        position = self.position_of(offset)
        if position is None:
            if offset <= self.gaps.below and self.next_offset >= offset:
                # A closed segment that covered a compacted gap up to the next segment
                # (gone now) becomes the last one: it ends where its last batch does,
                # as a reopen will find.
                with self._lock:
                    self._rebuild_indexes()
            return
        with self._lock:
            os.ftruncate(self.file.fd, position)
            self.size = position
            self._verified = [(s, min(e, position)) for s, e in self._verified if s < position]
            self._rebuild_indexes()
            self.txn_index.truncate_to(offset)

    def close(self, *, seal: bool = True) -> None:
        """Stop using the segment: seal it (skipped after a disk error), drop the file.

        The descriptor is not closed here: ``FileSlice``s still being sent keep it open,
        and ``SegmentFile.__del__`` closes it when the last of them is gone.
        """
        if seal and self._file is not None:
            self.seal()
        self._file = None

    def detach(self) -> None:
        """The cleaner swapped a rewritten file in under this segment's names: keep
        serving readers that still hold this object from the old (unlinked) file, but
        never touch the files that now carry those names again."""
        self._detached = True
        self.offset_index.path = self.time_index.path = Path(os.devnull)
        self.txn_index.path = Path(os.devnull)

    def delete(self) -> None:
        """Unlink the files; open ``FileSlice``s keep the descriptor until they are gone."""
        if self._detached:
            self._file = None
            return
        self.log_path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        self._file = None

    # ------------------------------------------------------------------ reading
    def iter_headers(self, position: int, end: int,
                     file: SegmentFile | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """Headers of the batches in ``[position, end)``; damage raises with its position."""
        fd = (file or self.file).fd
        while position < end:
            head = os.pread(fd, HEADER_SIZE, position)
            try:
                header = peek_header(head)
            except InvalidRecordBatchError as err:
                raise self._corrupt(err.message, position) from err
            if position + header.size > end:
                raise self._corrupt(
                    f"batch of {header.size} bytes runs past the end of the file ({end})",
                    position, header.base_offset)
            yield position, header
            position += header.size

    def _headers_from_index(self, offset: int, size: int, file: SegmentFile | None = None
                            ) -> Iterator[tuple[int, BatchHeader]]:
        """Headers from the index entry at or before ``offset``, checking the entry.

        An entry that does not point at the batch it names (a damaged index that still
        looked sane at load) triggers a rebuild from the log, then one more try. Every
        header yielded continues the offsets of the one before.
        """
        for attempt in range(2):
            relative, start = self.offset_index.lookup(max(0, offset - self.base_offset))
            headers = self.iter_headers(start, size, file)
            first = next(headers, None)
            if first is None:
                return
            if first[1].base_offset == self.base_offset + relative or (
                    start == 0 and self.gaps.follows(self.base_offset, first[1].base_offset)):
                yield first
                expected = first[1].next_offset
                for position, header in headers:
                    # base_offset is outside the CRC: a damaged one must not be believed.
                    if not self.gaps.follows(expected, header.base_offset):
                        raise self._corrupt(
                            f"offset gap: batch starts at {header.base_offset}, expected "
                            f"{expected}", position, header.base_offset)
                    expected = header.next_offset
                    yield position, header
                return
            if attempt == 0:
                log.warning("%s: index entry %d -> %d points at batch %d; rebuilding indexes",
                            self.log_path.name, relative, start, first[1].base_offset)
                self.rebuild_indexes()
        raise self._corrupt(f"index and log disagree at offset {offset} even after a rebuild",
                            0)

    def _batch_holding(self, offset: int) -> tuple[int, BatchHeader] | None:
        for position, header in self._headers_from_index(offset, self.size):
            if header.last_offset >= offset:
                return position, header
        return None

    def position_of(self, offset: int) -> int | None:
        """Position of the first batch whose last offset is >= ``offset`` (None: none)."""
        found = self._batch_holding(offset)
        return None if found is None else found[0]

    def batch_holding(self, offset: int) -> int | None:
        """Base offset of the first batch whose last offset is >= ``offset`` (None: none)."""
        found = self._batch_holding(offset)
        return None if found is None else found[1].base_offset

    def read(
        self, offset: int, max_bytes: int, upper_offset: int | None = None
    ) -> FileSlice | None:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one).

        Batches starting at or after ``upper_offset`` (the high watermark) are left out.
        ``None`` when the segment holds nothing at or after ``offset`` below the bound.
        The batches of the returned range not yet checked by this process are CRC- and
        continuity-checked first; nothing outside the range is read.
        """
        file = self.file
        size = self.size
        headers = self._headers_from_index(offset, size, file)
        first: tuple[int, BatchHeader] | None = None
        for position, header in headers:
            if header.last_offset >= offset:
                first = (position, header)
                break
        if first is None:
            return None
        position, header = first
        if upper_offset is not None and header.base_offset >= upper_offset:
            return None
        # Base offset of every batch of the range, by position: where a check starts.
        starts = {position: header.base_offset}
        end = position + header.size
        next_offset = header.next_offset
        for pos, h in headers:
            if end - position + h.size > max_bytes:
                break
            if upper_offset is not None and h.base_offset >= upper_offset:
                break
            starts[pos] = h.base_offset
            end = pos + h.size
            next_offset = h.next_offset
        gaps = self._unverified(position, end)
        if any(start not in starts for start, _ in gaps):
            gaps = [(position, end)]  # a boundary this walk did not see: check it all
        for start, stop in gaps:
            self._verify_range(file, start, stop, starts[start])
            self._mark_verified(start, stop)
        return FileSlice(file, position, end - position, header.base_offset, next_offset)

    # ------------------------------------------------------------------ verification
    def _unverified(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not covered by a verified range."""
        gaps: list[tuple[int, int]] = []
        at = start
        for s, e in self._verified:
            if e <= at:
                continue
            if s >= end:
                break
            if s > at:
                gaps.append((at, s))
            at = e
            if at >= end:
                break
        if at < end:
            gaps.append((at, end))
        return gaps

    def _mark_verified(self, start: int, end: int) -> None:
        if start >= end:
            return
        with self._lock:
            ranges = self._verified
            if ranges and ranges[-1][1] == start:  # the common case: appends in order
                self._verified = [*ranges[:-1], (ranges[-1][0], end)]
                return
            merged: list[tuple[int, int]] = []
            for s, e in ranges:
                if e < start or s > end:
                    merged.append((s, e))
                else:
                    start, end = min(s, start), max(e, end)
            merged.append((start, end))
            merged.sort()
            self._verified = merged

    def _verify_range(self, file: SegmentFile, start: int, end: int, expected: int) -> None:
        """Check every batch of ``[start, end)``: CRC, and offsets contiguous from ``expected``.

        Reads at most ``_VERIFY_CHUNK`` bytes per step (or one batch, if larger), so
        memory stays bounded whatever the range.
        """
        position = start
        while position < end:
            view = memoryview(os.pread(file.fd, min(_VERIFY_CHUNK, end - position), position))
            done = 0
            while done < len(view):
                if done and len(view) - done < HEADER_SIZE:
                    break  # the chunk ends inside a header: read on from there
                at = position + done
                try:
                    header = peek_header(view, done)
                except InvalidRecordBatchError as err:
                    raise self._corrupt(err.message, at) from err
                if at + header.size > end:
                    raise self._corrupt(
                        f"batch of {header.size} bytes runs past the end of the checked "
                        f"range ({end})", at, header.base_offset)
                if done + header.size > len(view):
                    if done:
                        break  # read on from this batch
                    view = memoryview(os.pread(file.fd, header.size, at))  # one big batch
                try:
                    validate(view[done:done + header.size])
                except InvalidRecordBatchError as err:
                    raise self._corrupt(err.message, at, header.base_offset) from err
                if not self.gaps.follows(expected, header.base_offset):
                    raise self._corrupt(
                        f"offset gap: batch starts at {header.base_offset}, expected "
                        f"{expected}", at, header.base_offset)
                expected = header.next_offset
                done += header.size
            position += done

    def verify_all(self) -> None:
        """CRC-check the whole segment now (a scrub); raises ``CorruptRecordError``."""
        file = self.file
        size = self.size
        if size:
            self._verify_range(file, 0, size, self.base_offset)
            self._mark_verified(0, size)

    # ------------------------------------------------------------------ timestamps
    def offset_for_timestamp(self, timestamp: int, min_offset: int = 0) -> int | None:
        """First offset >= ``min_offset`` whose record timestamp is >= ``timestamp``."""
        found = self.find_by_timestamp(timestamp, min_offset)
        return None if found is None else found[0]

    def find_by_timestamp(self, timestamp: int, min_offset: int = 0) -> tuple[int, int] | None:
        """``(offset, record timestamp)`` of the first record >= ``min_offset`` at or
        after ``timestamp``; ``None`` if the segment has none."""
        if self.max_timestamp < timestamp:
            return None
        file = self.file
        start_offset = max(self.base_offset + self.time_index.start_for(timestamp), min_offset)
        for position, header in self._headers_from_index(start_offset, self.size, file):
            if header.max_timestamp < timestamp or header.last_offset < min_offset \
                    or header.is_control:
                continue  # (a transaction marker is no record an application reads)
            skip = max(0, min_offset - header.base_offset)
            if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
                return header.base_offset + skip, header.max_timestamp
            data = os.pread(file.fd, header.size, position)
            try:
                validate(data)
            except InvalidRecordBatchError as err:
                raise self._corrupt(err.message, position, header.base_offset) from err
            self._mark_verified(position, position + header.size)
            try:
                _, payload = decode_batch(data, verify=False)
            except InvalidRecordBatchError as err:
                # The bytes are what the producer sent (the CRC holds): the broker never
                # decodes payloads at produce time, so an undecodable one is the
                # producer's, not damage. Answer conservatively with the batch's first
                # record rather than fail every timestamp lookup on this partition.
                log.warning("%s: batch at offset %d has a payload that is not Arrow (%s); "
                            "timestamp lookup answers its first offset", self.log_path.name,
                            header.base_offset, err.message)
                return header.base_offset + skip, header.first_timestamp
            candidates = payload.column(2).slice(skip)
            # An Arrow scalar, not a Python int: pyarrow retries a failing optional import
            # on every call given a Python scalar (about 70 us here); and not
            # ``pa.scalar``, which imports pandas the first time (wire's int_scalar).
            at_or_after = pc.greater_equal(candidates, int_scalar(timestamp, pa.int64()))
            index: int = pc.index(at_or_after, _TRUE).as_py()
            if index >= 0:
                return header.base_offset + skip + index, int(candidates[index].as_py())
        return None
