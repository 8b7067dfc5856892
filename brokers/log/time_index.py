"""The sparse time index of one segment (``<base offset>.timeindex``).

Byte layout: a flat array of 12-byte big-endian entries, no header::

    offset size field
     0      8   timestamp       int64    largest record timestamp seen so far (ms)
     8      4   relative_offset uint32   base offset - segment base of the batch holding it

Invariants: both columns strictly increase. An entry ``(t, o)`` promises that every
record of the segment at an offset below batch ``o``'s end has a timestamp <= ``t``, so
a search for the first record at or after time ``T`` may start at the batch of the last
entry with ``t < T``. Entries are added at the same points as offset-index entries
(when the running maximum grew), plus one final entry when the segment is closed.

Recovery: disposable, as the offset index; rebuilt from batch headers.
"""

from __future__ import annotations

import struct

from brokers.log.index_file import SortedEntryIndex

__all__ = ["TimeIndex"]


class TimeIndex(SortedEntryIndex):
    entry = struct.Struct(
        ">"
        "q"  # timestamp
        "I"  # relative_offset
    )
    key_code = "q"
    value_code = "I"

    def start_for(self, timestamp: int) -> int:
        """Relative offset where a search for the first record >= ``timestamp`` may start."""
        i = self.last_below_key(timestamp)
        return 0 if i < 0 else self.values[i]

    @property
    def last_timestamp(self) -> int:
        return self.keys[-1] if self.keys else -1
