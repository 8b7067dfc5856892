"""Leader-epoch cache: which leader epoch wrote which range of a partition's log.

A follower that becomes leader (or a leader that becomes follower) must find where its
log diverges from the new leader's without trusting its high watermark (truncating to
the high watermark loses acknowledged records; Kafka KIP-101, KIP-279). Every batch
carries the epoch of the leader that appended it (header offset 12); this cache keeps
one entry per epoch: the offset of the first batch that epoch wrote. The leader answers
``OffsetForLeaderEpoch(e)`` from it with ``end_offset_for``; the follower truncates to
the answer.

File ``<partition dir>/leader-epoch-checkpoint``, ASCII text (Kafka's layout)::

    0\\n                          format version
    <count>\\n                    number of entries that follow, decimal
    <epoch> <start_offset>\\n     ``count`` lines, in increasing order

Written atomically like ``OffsetCheckpoint``: a ``.tmp`` file is written, renamed over
the old one; a crash leaves the old or the new file, never a torn one. A truncation,
log start moving up or a rebuild rewrites it at once, with fsyncs. A new epoch
(``assign``) is not written at all until ``sync``, which the log calls before it records
a recovery point (as Kafka does since KAFKA-15046) and at close: a broker becoming
leader of ten thousand partitions, or taking the first record of ten thousand new
ones, must not create ten thousand files on the way. A crash (of the process or the
machine) then loses the newest entries, but only of batches above the recovery point,
which recovery scans (and assigns again) anyway, or of a log never flushed, whose
recovery scans all of it; an entry for an epoch that wrote nothing only shapes
OffsetForLeaderEpoch answers, which a follower re-asks of the current leader.

Invariants: epochs are >= 0 and strictly increasing; start offsets are >= 0 and strictly
increasing; every start offset is <= the log end offset, and the first entry starts at
the log start offset once the log start has moved past it (``truncate_from_start``).

Recovery: ``read`` returns ``None`` for a missing or malformed file (bad version, bad
count, non-decimal fields, entries not strictly increasing). The log then rebuilds the
cache from its batch headers (``PartitionLog`` owns that, see ``rebuild``); it also
rebuilds when the file disagrees with the log (an entry past the log end, no entry for
a non-empty log, or a first entry that starts after the log start).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from pathlib import Path
from typing import Final, NamedTuple

from brokers.log.checkpoint import fsync_file, write_atomically

__all__ = ["LEADER_EPOCH_FILE", "UNDEFINED_EPOCH", "UNDEFINED_OFFSET", "EpochEntry",
           "LeaderEpochCache"]

LEADER_EPOCH_FILE: Final = "leader-epoch-checkpoint"
UNDEFINED_EPOCH: Final = -1
UNDEFINED_OFFSET: Final = -1
_VERSION: Final = "0"


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The epoch -> start offset entries of one partition, persisted in ``path``.

    Not thread-safe on its own: ``PartitionLog`` calls it under its lock. Every
    mutating method rewrites the checkpoint when (and only when) something changed.
    """

    def __init__(self, path: Path, entries: Iterable[EpochEntry] = ()) -> None:
        self.path = path
        self._entries: list[EpochEntry] = list(entries)
        self._unwritten = False  # ``assign`` changed entries the file does not hold yet
        self._unsynced = False  # the file was written without fsync

    # ------------------------------------------------------------------ persistence
    @staticmethod
    def read(path: Path) -> list[EpochEntry] | None:
        """The entries stored in ``path``; ``None`` if it is missing or malformed."""
        try:
            lines = path.read_text(encoding="ascii").split("\n")
        except (FileNotFoundError, UnicodeDecodeError):
            return None
        if len(lines) < 2 or lines[0] != _VERSION or not lines[1].isdigit():
            return None
        count = int(lines[1])
        if len(lines) != count + 3 or lines[-1] != "":
            return None
        entries: list[EpochEntry] = []
        for line in lines[2:2 + count]:
            fields = line.split(" ")
            if len(fields) != 2 or not all(f.isdigit() for f in fields):
                return None
            entry = EpochEntry(int(fields[0]), int(fields[1]))
            if entries and (entry.epoch <= entries[-1].epoch
                            or entry.start_offset <= entries[-1].start_offset):
                return None
            entries.append(entry)
        return entries

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache | None:
        entries = cls.read(path)
        return None if entries is None else cls(path, entries)

    def sync(self) -> None:
        """Make the entries ``assign`` added durable (before a recovery point moves)."""
        if self._unwritten:
            self.write(sync=False)
        if self._unsynced:
            fsync_file(self.path)
            self._unsynced = False

    @property
    def unwritten(self) -> bool:
        """True while ``assign`` added entries that only ``sync`` writes."""
        return self._unwritten

    def write(self, *, sync: bool = True) -> None:
        """Persist the entries atomically (see the module docstring)."""
        body = "".join(f"{e.epoch} {e.start_offset}\n" for e in self._entries)
        write_atomically(self.path, f"{_VERSION}\n{len(self._entries)}\n{body}".encode("ascii"),
                         sync=sync)
        self._unwritten = False
        self._unsynced = not sync

    # ------------------------------------------------------------------ queries
    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The largest epoch known, ``UNDEFINED_EPOCH`` (-1) when none is."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end offset)`` for a follower whose last batch has ``epoch``.

        Kafka's ``LeaderEpochFileCache.endOffsetFor`` semantics:
        - nothing known, ``epoch`` undefined (< 0), or ``epoch`` above the latest
          epoch: ``(-1, -1)``;
        - ``epoch`` is the latest epoch: ``(epoch, log_end_offset)``;
        - otherwise the end offset is the start offset of the first epoch above
          ``epoch``, paired with the largest known epoch <= ``epoch`` (so an unknown
          epoch between two known ones answers with the one below it), or with
          ``epoch`` itself when it is older than every known epoch.
        The follower truncates to ``min(its log end, end offset)``.
        """
        if epoch < 0 or not self._entries or epoch > self._entries[-1].epoch:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self._entries[-1].epoch:
            return epoch, log_end_offset
        epochs = [e.epoch for e in self._entries]
        higher = self._entries[bisect_right(epochs, epoch)]
        floor_index = bisect_right(epochs, epoch) - 1
        floor_epoch = self._entries[floor_index].epoch if floor_index >= 0 else epoch
        return floor_epoch, higher.start_offset

    # ------------------------------------------------------------------ changes
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` (its first batch's offset).

        Ignored (returns False) unless ``epoch`` is larger than the latest epoch and
        both are non-negative. Entries starting at or after ``start_offset`` are
        replaced, so start offsets stay strictly increasing. Not written until ``sync``.
        """
        if epoch < 0 or start_offset < 0 or epoch <= self.latest_epoch:
            return False
        starts = [e.start_offset for e in self._entries]
        del self._entries[bisect_left(starts, start_offset):]
        self._entries.append(EpochEntry(epoch, start_offset))
        self._unwritten = True  # written by ``sync`` (see the module docstring)
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """The log now ends at ``end_offset``: drop entries starting at or after it."""
        starts = [e.start_offset for e in self._entries]
        keep = bisect_left(starts, end_offset)
        if keep < len(self._entries):
            del self._entries[keep:]
            self.write()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset`` (delete-records, retention).

        Entries wholly below it are dropped; the one covering it starts there instead.
        """
        starts = [e.start_offset for e in self._entries]
        covering = bisect_right(starts, start_offset) - 1
        if covering < 0 or (covering == 0 and starts[0] == start_offset):
            return
        moved = EpochEntry(self._entries[covering].epoch, start_offset)
        self._entries[:covering + 1] = [moved]
        self.write()

    def clear(self) -> None:
        if self._entries:
            self._entries.clear()
            self.write()

    def replace(self, entries: Iterable[EpochEntry]) -> None:
        """Replace every entry (after a rebuild from batch headers) and persist."""
        self._entries = list(entries)
        self.write()
