"""The Kafka listener's cache of batches already converted to RecordBatch v2.

Why: the log holds Strata batches (Arrow payloads); a Kafka client's fetch gets each one
re-encoded as RecordBatch v2 (``records.to_kafka``: the Arrow decode, the C record walk
and the CRC, 0.1-0.3 us a record, most of a listener fetch's broker time). The design
reads each record about three times for every write (1M records/s in, 3M/s out:
consumer groups fanning out over the same recent data), so every reader after the first
of a batch gets the converted bytes from here. Kafka's own brokers send the page
cache's bytes with ``sendfile``; this is that page cache for the second encoding.

Layout: an LRU map from a batch's identity to its converted bytes, bounded by the sum
of the values' lengths (``kafka.fetch.cache.bytes``; 0 turns it off).

Produced batches go in too: a batch a Kafka client produced through the listener is
kept as the client sent it (the v2 bytes Kafka's own brokers would store and serve),
with the offset and leader epoch the log gave it, under the key the stored batch has
(``KafkaApis._keep_produced``). The usual Kafka deployment, Kafka clients on both sides
reading recent data, then converts nothing: the consumer gets the producer's bytes
(and its compression), as from Kafka. Only a batch whose header the conversion would
write the same way is kept (CreateTime, the same timestamps, producer fields and
count; never a typed topic's, whose values are reframed on the way out).

Batches are also converted ahead of a reader: when a fetch's answer stops short of the
high watermark, the listener converts what that reader will fetch next while it takes
in what it got (``KafkaApis._read_ahead``), so a consumer catching up on data Strata's
own clients wrote does not wait for a conversion on each round trip.

Identity, and why a stale entry cannot be served: the key is the topic, the partition
and the batch's first 21 bytes as the log holds them: base offset, length, leader epoch,
magic and CRC-32C. The CRC covers every byte after it (attributes, producer fields,
timestamps, the payload), so a different batch at the same offset (a follower's log
truncated and rewritten after a leader change, a compacted segment, a deleted and
re-created topic) has a different key unless a CRC-32C collides on a batch of the same
length, offset and epoch. A kept produced batch is filed under the head its stored
batch was given (offset and epoch assigned by the log, length, magic and CRC of the
converted batch): if the listener's guess of that head is wrong (the leader epoch moved
during the append), the entry names no stored batch and is never served. Entries are
never invalidated; they age out.

Thread-safety: the broker's event loop only (no lock). Crash behaviour: nothing on disk.
"""

from __future__ import annotations

import functools
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from wire.record_batch import HEADER_SIZE, LOG_OVERHEAD

if TYPE_CHECKING:
    from brokers.log.segment import FileSlice

__all__ = ["ConvertedBatches", "KEY_BYTES"]

#: Base offset (8), length (4), leader epoch (4), magic (1), CRC (4).
KEY_BYTES: Final = 21

_LENGTH: Final = struct.Struct(">i")


def _read_converted(convert: Callable[[memoryview], bytes | bytearray], fd: int,
                    position: int, size: int) -> bytes | bytearray:
    return convert(memoryview(os.pread(fd, size, position)))

#: Bytes charged for an entry beyond its value (the key, the map's node).
_ENTRY_OVERHEAD: Final = 200


class ConvertedBatches:
    """Converted v2 batches by identity (see the module docstring), at most
    ``max_bytes`` of them; ``hits`` / ``misses`` count lookups, ``kept`` the produced
    batches remembered (``keep``), ``ahead`` the misses converted ahead of a reader."""

    __slots__ = ("_entries", "_key_bytes", "_max_bytes", "ahead", "bytes", "hits", "kept",
                 "misses")

    def __init__(self, max_bytes: int, *, key_bytes: int = KEY_BYTES) -> None:
        """``key_bytes``: how much of a batch's head names it (``KEY_BYTES``; the
        tests shorten it to show their check catches a key without the CRC)."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self._max_bytes = max_bytes
        self._key_bytes = key_bytes
        self._entries: OrderedDict[tuple[str, int, bytes], bytes | bytearray] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.kept = 0
        #: Of ``misses``, the batches converted ahead of their reader
        #: (``KafkaApis._read_ahead``) rather than for a fetch waiting on them.
        self.ahead = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self._max_bytes > 0

    def from_slice(self, topic: str, partition: int, found: FileSlice,
                   convert: Callable[[memoryview], bytes | bytearray]
                   ) -> list[bytes | bytearray]:
        """The whole batches of a segment slice, converted: for each, its first
        ``KEY_BYTES`` are read (``os.pread``), and the rest only when the cache does not
        have it. A partial batch at the end is dropped, as ``iter_strata_batches`` does
        (the next fetch starts at it)."""
        fd = found.fileno()
        pos, end = found.position, found.position + found.length
        out: list[bytes | bytearray] = []
        while pos + HEADER_SIZE <= end:
            head = os.pread(fd, self._key_bytes, pos)
            if len(head) < self._key_bytes:  # the file ends early: as a partial batch
                break
            (length,) = _LENGTH.unpack_from(head, 8)
            stop = pos + LOG_OVERHEAD + length
            if length < HEADER_SIZE - LOG_OVERHEAD or stop > end:
                break
            out.append(self._lookup((topic, partition, head),
                                    functools.partial(_read_converted, convert, fd, pos,
                                                      stop - pos)))
            pos = stop
        return out

    def converted(self, topic: str, partition: int, batch: memoryview,
                  convert: Callable[[memoryview], bytes | bytearray]) -> bytes | bytearray:
        """``convert(batch)``, from the cache when this batch was converted before.
        The value returned must not be changed by the caller."""
        return self._lookup((topic, partition, batch[:self._key_bytes].tobytes()),
                            lambda: convert(batch))

    def _lookup(self, key: tuple[str, int, bytes],
                make: Callable[[], bytes | bytearray]) -> bytes | bytearray:
        """The entry for ``key`` (now the most recent), or ``make()``, kept when it fits."""
        entries = self._entries
        found = entries.get(key)
        if found is not None:
            entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        value = make()
        self._insert(key, value)
        return value

    def keep(self, topic: str, partition: int, head: bytes, value: bytes | bytearray) -> None:
        """Remember ``value`` as the v2 form of the stored batch whose first bytes are
        ``head`` (a produced batch, kept by the listener as its client sent it). A
        ``head`` that names no stored batch is harmless: nothing ever looks it up."""
        key = (topic, partition, head[:self._key_bytes])
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old) + _ENTRY_OVERHEAD
        self._insert(key, value)
        self.kept += 1

    def _insert(self, key: tuple[str, int, bytes], value: bytes | bytearray) -> None:
        size = len(value) + _ENTRY_OVERHEAD
        if size > self._max_bytes:  # (always, when the cache is off)
            return
        entries = self._entries
        entries[key] = value
        self.bytes += size
        while self.bytes > self._max_bytes:
            _, old = entries.popitem(last=False)
            self.bytes -= len(old) + _ENTRY_OVERHEAD
