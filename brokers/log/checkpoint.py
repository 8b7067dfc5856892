"""Small per-partition files that remember where the log stands across restarts.

``OffsetCheckpoint`` byte layout: ASCII text, two lines::

    0\\n                 format version
    <offset>\\n          a non-negative decimal offset

Written atomically: a temporary file is written and fsynced, renamed over the old one,
and the directory is fsynced, so a crash leaves either the old or the new value, never
a torn one. A missing or unreadable checkpoint reads as ``None`` and the log falls
back to the safe default (recover everything; log start at the first segment).

``PartitionOffsetsCheckpoint`` (one per data directory, Kafka's
``replication-offset-checkpoint``): the high watermark of every replica hosted there,
one file for all of them::

    0\\n                          format version
    <count>\\n                    number of entries
    <topic> <partition> <offset>\\n   count lines (topic names have no spaces)

Written whole with ``write_atomically`` (temporary file fsynced, renamed over, the
directory fsynced): a crash leaves the old file or the new one. One write per
round for every partition, where a file per partition meant ten thousand file
creations the first time ten thousand new partitions took a record, and ten thousand
more writes at every close. A missing, unreadable or malformed file reads as empty (a
malformed one is reported): every replica then falls back as for a missing value.

``CleanShutdownMarker``: an empty file whose presence says the previous process closed
the log cleanly (all data flushed, indexes written). The log deletes it as soon as it
opens, so a crash of *this* process is detected next time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from brokers.log import durability

__all__ = ["CleanShutdownMarker", "OffsetCheckpoint", "PartitionOffsetsCheckpoint",
           "fsync_directory", "fsync_file", "write_atomically"]

log = logging.getLogger("strata.brokers.log")

_VERSION: Final = "0"


def write_atomically(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new file, never a
    torn one: write a temporary file, fsync it, rename it over, fsync the directory.

    ``sync=False`` skips both fsyncs: a process crash still leaves the old or the new
    file, a machine crash may leave the old one (or, on some file systems, an empty
    one); for files a reader can rebuild and that :func:`fsync_file` makes durable later.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            durability.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_directory(path.parent)


def fsync_file(path: Path) -> None:
    """Make a file written with ``write_atomically(sync=False)`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        durability.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(path.parent)


fsync_directory = durability.fsync_directory


class OffsetCheckpoint:
    """An offset persisted atomically and durably in ``path`` (see the module
    docstring); writing the value already on disk is skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # The value on disk as this object last read or wrote it: writing it again (idle
        # partitions at every close) would only cost two fsyncs.
        self._on_disk: int | None = None

    def read(self) -> int | None:
        try:
            lines = self.path.read_text(encoding="ascii").split("\n")
        except (FileNotFoundError, UnicodeDecodeError):
            self._on_disk = None
            return None
        if len(lines) < 2 or lines[0] != _VERSION or not lines[1].isdigit():
            self._on_disk = None
            return None
        self._on_disk = int(lines[1])
        return self._on_disk

    def absent(self, reads_as: int) -> None:
        """The file is known not to exist (its directory was listed), and its reader
        takes that as ``reads_as``: writing that value is then skipped too (a new log's
        recovery point and log start are 0 until they move)."""
        self._on_disk = reads_as

    def write(self, offset: int) -> None:
        if offset == self._on_disk:
            return
        write_atomically(self.path, f"{_VERSION}\n{offset}\n".encode("ascii"))
        self._on_disk = offset


class PartitionOffsetsCheckpoint:
    """One offset per partition, for every partition of a data directory, in one file
    (see the module docstring). Writes are serialised (a routine write still running
    in its thread when the close writes); each replaces the whole file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def read(self) -> dict[tuple[str, int], int]:
        """Every entry; empty when the file is missing or malformed (logged)."""
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as err:
            log.warning("%s is unreadable (%s); every high watermark in it is taken as "
                        "missing", self.path, err)
            return {}
        lines = text.split("\n")
        entries: dict[tuple[str, int], int] = {}
        try:
            if lines[0] != _VERSION or lines[-1] != "":
                raise ValueError("unknown version or truncated")
            count = int(lines[1])
            if len(lines) != count + 3:
                raise ValueError(f"{len(lines) - 3} entries where the header says {count}")
            for line in lines[2:2 + count]:
                topic, partition, offset = line.split(" ")
                value = int(offset)
                if value < 0 or int(partition) < 0:
                    raise ValueError(f"negative number in {line!r}")
                entries[(topic, int(partition))] = value
        except (ValueError, IndexError) as err:
            log.warning("%s is malformed (%s); every high watermark in it is taken as "
                        "missing", self.path, err)
            return {}
        return entries

    def write(self, entries: Mapping[tuple[str, int], int]) -> None:
        """Replace the file with ``entries`` (``write_atomically``: durable, or covered by
        the caller's file-system sync when it defers its fsyncs)."""
        body = "".join(f"{topic} {p} {offset}\n" for (topic, p), offset in entries.items())
        with self._lock:
            write_atomically(self.path, f"{_VERSION}\n{len(entries)}\n{body}".encode("ascii"))


class CleanShutdownMarker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.exists()

    def write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            durability.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(self.path.parent)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return  # nothing changed on disk: nothing to make durable
        fsync_directory(self.path.parent)
