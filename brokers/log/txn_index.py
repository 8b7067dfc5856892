"""The aborted-transaction index of one segment (``<base offset>.txnindex``).

A read_committed fetch must tell the consumer which transactions in the range it
returns were aborted, so that it skips their batches (docs/transactions.md). Scanning
the log for ABORT markers on every fetch would read the whole range twice; Kafka keeps
one entry per aborted transaction beside the segment that holds its ABORT marker, and so
does Strata.

Byte layout: a flat array of 34-byte big-endian entries, no header (Kafka's layout)::

    offset size field
     0      2   version            int16   0
     2      8   producer_id        int64   the transaction's producer
    10      8   first_offset       int64   offset of the transaction's first batch in
                                           this partition (it may lie in an earlier
                                           segment)
    18      8   last_offset        int64   offset of the ABORT marker (in this segment)
    26      8   last_stable_offset int64   the partition's last stable offset once the
                                           marker was written (informational)

Invariants: entries are in the order their markers were appended, so ``last_offset``
strictly increases and every ``last_offset`` lies in ``[segment base, next segment
base)``; ``first_offset <= last_offset``. Only aborted transactions have entries.

Lookup (``aborted_in``): the transactions whose range ``[first_offset, last_offset]``
overlaps a fetched range ``[start, end)``. A fetch asks the segments from the one holding
``start`` to the last; an entry in a later segment can still cover the range (its
transaction began earlier), so the caller also asks the segments after the range until
it finds one whose base is past every open transaction (``PartitionLog`` does this).

Recovery: the index is derived data. On every open (clean, or a segment recovered
after a crash) the file is loaded and, once the segment's extent is known, checked
(``check``); a recovered segment drops the entries of a torn tail. The entries whose
markers follow the newest producer-state snapshot are then added again by the replay
of the batch headers after it (a repeat of an entry already there is skipped); the
entries before the snapshot were written (``persist``) before the snapshot was. A file
that does not read back or fails the check is cleared and the partition replays its
whole log to rebuild every index (``PartitionLog.txn_index_lost``). Truncation drops
the entries at or above the truncation offset. The file is created lazily, at the
first ``persist`` after an entry, like the other indexes: most segments never hold one.

Compaction and retention: the log cleaner rewrites a segment's index together with its
data (``write`` into ``<base>.txnindex.cleaned``, swapped in before the ``.log``),
dropping exactly the entries whose marker it removed, so an entry lives as long as its
ABORT marker (brokers/log/cleaner.py). Retention and delete-records delete the file
with its segment: the markers of those entries are gone too, and so are their
transactions' records, which precede the markers.

Thread-safety: not thread-safe; mutated under the partition log's lock by the owning
segment. Readers take a snapshot of the entry list (entries are only appended or
cleared under the lock).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from brokers.log import durability
from brokers.log.index_file import IndexCorruptError

__all__ = ["TXN_INDEX_SUFFIX", "AbortedTxn", "TransactionIndex"]

TXN_INDEX_SUFFIX: Final = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")
_VERSION: Final = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction of a partition."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int = -1

    def overlaps(self, start: int, end: int) -> bool:
        """Whether ``[first_offset, last_offset]`` meets ``[start, end)``."""
        return self.last_offset >= start and self.first_offset < end


class TransactionIndex:
    """The ``.txnindex`` of one segment (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []
        self._persisted = 0

    def __len__(self) -> int:
        return len(self.entries)

    # ----------------------------------------------------------------- loading
    def load(self) -> None:
        """Read the file into memory; ``IndexCorruptError`` if it is malformed."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        if len(data) % _ENTRY.size:
            raise IndexCorruptError(
                f"{self.path.name}: size {len(data)} is not a multiple of {_ENTRY.size}")
        entries = []
        for version, pid, first, last, lso in _ENTRY.iter_unpack(data):
            if version != _VERSION:
                raise IndexCorruptError(f"{self.path.name}: unknown entry version {version}")
            entries.append(AbortedTxn(pid, first, last, lso))
        self.entries = entries
        self._persisted = len(entries)

    def check(self, base_offset: int, next_offset: int) -> None:
        """Every marker offset lies in ``[base_offset, next_offset)`` and increases."""
        previous = base_offset - 1
        for entry in self.entries:
            if not previous < entry.last_offset < next_offset or \
                    entry.first_offset > entry.last_offset or entry.first_offset < 0:
                raise IndexCorruptError(
                    f"{self.path.name}: entry {entry} is out of order or outside the "
                    f"segment [{base_offset}, {next_offset})")
            previous = entry.last_offset

    @property
    def unpersisted(self) -> bool:
        """Entries not written to the file yet."""
        return self._persisted < len(self.entries)

    # ----------------------------------------------------------------- mutation
    def append(self, entry: AbortedTxn) -> None:
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            raise ValueError(f"aborted transaction {entry} is not after "
                             f"{self.entries[-1]} (markers append in offset order)")
        self.entries.append(entry)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or above ``offset`` (the log was cut)."""
        keep = [e for e in self.entries if e.last_offset < offset]
        if len(keep) == len(self.entries):
            return
        self.entries = keep
        self._rewrite()

    def clear(self) -> None:
        self.entries = []
        self._persisted = 0
        self.path.unlink(missing_ok=True)

    def persist(self, fsync: bool) -> None:
        """Append the entries not yet on disk (creating the file at the first one)."""
        if self._persisted == len(self.entries) and not (fsync and self._persisted):
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            tail = b"".join(_ENTRY.pack(_VERSION, e.producer_id, e.first_offset,
                                        e.last_offset, e.last_stable_offset)
                            for e in self.entries[self._persisted:])
            if tail:
                os.write(fd, tail)
            self._persisted = len(self.entries)
            if fsync:
                durability.fsync(fd)
        finally:
            os.close(fd)

    def _rewrite(self) -> None:
        """Write the whole (shortened) index again, atomically."""
        if not self.entries:
            self.clear()
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_bytes(b"".join(
            _ENTRY.pack(_VERSION, e.producer_id, e.first_offset, e.last_offset,
                        e.last_stable_offset) for e in self.entries))
        os.replace(temporary, self.path)
        self._persisted = len(self.entries)

    def write(self, entries: list[AbortedTxn]) -> None:
        """Write the whole file with ``entries`` (none: an empty file) and fsync it: the
        log cleaner's ``.txnindex.cleaned``, which its swap renames over the live index
        (brokers/log/cleaner.py)."""
        self.entries = list(entries)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"".join(_ENTRY.pack(_VERSION, e.producer_id, e.first_offset,
                                              e.last_offset, e.last_stable_offset)
                                  for e in self.entries))
            durability.fsync(fd)
        finally:
            os.close(fd)
        self._persisted = len(self.entries)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    # ----------------------------------------------------------------- lookup
    def aborted_in(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions of this segment that overlap ``[start, end)``."""
        return [e for e in list(self.entries) if e.overlaps(start, end)]
