"""The sparse offset index of one segment (``<base offset>.index``).

Byte layout: a flat array of 8-byte big-endian entries, no header::

    offset size field
     0      4   relative_offset uint32   batch base offset - segment base offset
     4      4   position        uint32   byte position of that batch in the .log file

Invariants: both columns strictly increase; every position is the start of a batch
in the segment's log and below its size. An entry is added for a batch whenever at
least ``index.interval.bytes`` of log were appended since the previous entry (none for
the first batch: an empty lookup means "scan from byte 0"), so a lookup lands at most
one interval before the wanted batch.

Recovery: the file is disposable. After a clean shutdown it is loaded and checked
(``check``); after a crash, or if the check fails, the segment rebuilds it by scanning
batch headers.
"""

from __future__ import annotations

import struct

from brokers.log.index_file import SortedEntryIndex

__all__ = ["OffsetIndex"]


class OffsetIndex(SortedEntryIndex):
    entry = struct.Struct(
        ">"
        "I"  # relative_offset
        "I"  # position
    )
    key_code = "I"
    value_code = "I"

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """``(relative_offset, position)`` of the last entry at or before the offset.

        ``(0, 0)`` when the offset precedes every entry: scan from the segment start.
        """
        i = self.floor_by_key(relative_offset)
        if i < 0:
            return 0, 0
        return self.keys[i], self.values[i]
