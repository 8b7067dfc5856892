"""Shared machinery of the two sparse index files (offset index, time index).

An index file is a flat array of fixed-size big-endian entries, sorted on both
columns. The whole array is also held in memory (two ``array`` columns) so lookups are
a ``bisect`` with no I/O. Entries are written to disk lazily: ``persist()`` appends the
entries not yet on disk (creating the file), and the log calls it whenever it flushes,
rolls or closes a segment; a new or cleared index has no file until then, as Kafka
creates its index files lazily (a file creation is most of what a new partition costs,
and ten thousand are created at once). A missing file reads as empty. Indexes are
disposable: a file that fails ``check()`` is rebuilt from the log.

Thread-safety: not thread-safe; the owning ``LogSegment`` serialises mutations under
the partition log's lock. Readers bisect a snapshot of the arrays' lengths, which is
safe under the GIL because entries are only appended (or cleared under the lock).
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from brokers.log import durability

__all__ = ["IndexCorruptError", "SortedEntryIndex"]


class IndexCorruptError(Exception):
    """An index file does not pass its sanity check; the caller rebuilds it."""


class SortedEntryIndex:
    """A file of ``(key, value)`` entries, both columns strictly increasing.

    ``entry`` is the on-disk struct; ``key_code``/``value_code`` the ``array`` type codes
    of the in-memory columns.
    """

    entry: struct.Struct
    key_code: str
    value_code: str

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: array[int] = array(self.key_code)
        self.values: array[int] = array(self.value_code)
        self._persisted = 0
        self._on_disk = False  # the file exists (loaded from it, or persisted)

    # ----------------------------------------------------------------- loading
    def load(self) -> None:
        """Read the file into memory; raise ``IndexCorruptError`` if it is malformed."""
        self.keys = array(self.key_code)
        self.values = array(self.value_code)
        try:
            data = self.path.read_bytes()
            self._on_disk = True
        except FileNotFoundError:
            data = b""
            self._on_disk = False
        if len(data) % self.entry.size:
            raise IndexCorruptError(
                f"{self.path.name}: size {len(data)} is not a multiple of {self.entry.size}"
            )
        for key, value in self.entry.iter_unpack(data):
            self.keys.append(key)
            self.values.append(value)
        self._persisted = len(self.keys)

    def check(self, key_limit: int, value_limit: int) -> None:
        """Entries strictly increase in both columns and stay below the limits."""
        previous_key = previous_value = -1
        for key, value in zip(self.keys, self.values, strict=True):
            if key <= previous_key or value <= previous_value:
                raise IndexCorruptError(f"{self.path.name}: entries out of order at {key}")
            if key >= key_limit or value >= value_limit:
                raise IndexCorruptError(
                    f"{self.path.name}: entry ({key}, {value}) points past the log"
                )
            previous_key, previous_value = key, value

    # ----------------------------------------------------------------- mutation
    def append(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)

    def clear(self) -> None:
        """Drop every entry, in memory and on disk (the file goes; ``persist`` makes it
        again): a new segment's indexes, and before a rebuild."""
        self.keys = array(self.key_code)
        self.values = array(self.value_code)
        self._persisted = 0
        self._on_disk = False
        self.path.unlink(missing_ok=True)

    def persist(self, fsync: bool) -> None:
        """Append the entries not yet on disk; fsync the file when asked."""
        if self._persisted == len(self.keys) and (
                not fsync or (self._on_disk and durability.deferring())):
            return  # (a deferred fsync: the file-system sync to come covers it)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if self._persisted < len(self.keys):
                tail = b"".join(
                    self.entry.pack(k, v)
                    for k, v in zip(self.keys[self._persisted:], self.values[self._persisted:],
                                    strict=True)
                )
                os.write(fd, tail)
                self._persisted = len(self.keys)
            if fsync:
                durability.fsync(fd)
        finally:
            os.close(fd)
        self._on_disk = True

    def delete(self) -> None:
        self._on_disk = False
        self.path.unlink(missing_ok=True)

    # ----------------------------------------------------------------- lookup
    def floor_by_key(self, key: int) -> int:
        """Index of the last entry whose key is <= ``key``, or -1."""
        return bisect_right(self.keys, key) - 1

    def last_below_key(self, key: int) -> int:
        """Index of the last entry whose key is < ``key``, or -1."""
        return bisect_left(self.keys, key) - 1

    def __len__(self) -> int:
        return len(self.keys)
