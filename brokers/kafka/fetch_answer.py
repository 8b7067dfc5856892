"""A Fetch answer encoded as chunks, the records never copied into one buffer.

Why not kafka-python's encoder here (every other answer uses it, codec.py): a fetch
answer is megabytes of records behind a few hundred bytes of fields, and the generated
encoder copies the records into its buffer and out again, after the caller has joined
each partition's batches into one bytes object: three copies of every byte a consumer
reads (about a sixth of a listener fetch's broker time when the batches come from the
converted-batch cache). Here the fields are packed with ``struct`` and each batch stays
the object it is (the cache's own bytes); ``FetchAnswer.chunks`` hands them to the
connection, which writes them in turn.

Layout: FetchResponse v4-v12 of Apache Kafka's ``FetchResponse.json``, only the fields
this listener sets (the tagged fields DivergingEpoch, CurrentLeader and SnapshotId are
never sent; v13+ is not served). v12 is flexible: compact arrays, strings and records
(unsigned varint length + 1) and an empty tagged-field section after every struct.
tests/test_kafka_fetch_path.py checks the bytes against kafka-python's encoder for
every version served.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["Aborted", "FetchAnswer", "FetchPartition", "FetchTopic", "MIN_VERSION",
           "MAX_VERSION"]

MIN_VERSION: Final = 4
MAX_VERSION: Final = 12
_FLEXIBLE_FROM: Final = 12

#: Records at least this long are chunks of their own; shorter ones are copied into the
#: fields around them (a copy this size costs less than a ``send`` of its own).
_OWN_CHUNK: Final = 16 * 1024

_I32: Final = struct.Struct(">i")
_I16: Final = struct.Struct(">h")
_PARTITION: Final = struct.Struct(">ihqq")  # index, error, high watermark, LSO
_I64: Final = struct.Struct(">q")
_ABORTED: Final = struct.Struct(">qq")


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Aborted:
    producer_id: int
    first_offset: int


@dataclass(slots=True)
class FetchPartition:
    """One partition's answer; ``records`` are whole v2 batches in offset order."""

    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list[Aborted] | None
    records: Sequence[bytes | bytearray | memoryview] = ()


@dataclass(frozen=True, slots=True)
class FetchTopic:
    name: str
    partitions: list[FetchPartition]


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """A FetchResponse body (see the module docstring)."""

    throttle_time_ms: int
    error_code: int
    session_id: int
    topics: Sequence[FetchTopic]

    def chunks(self, version: int) -> list[bytes | bytearray | memoryview]:
        """The body at ``version`` as chunks to write in order: short runs of fields
        (with short records inside them) joined, long records on their own."""
        if not MIN_VERSION <= version <= MAX_VERSION:
            raise ValueError(f"FetchResponse v{version} is not encoded here "
                             f"({MIN_VERSION}..{MAX_VERSION})")
        flexible = version >= _FLEXIBLE_FROM
        out: list[bytes | bytearray | memoryview] = []
        run = bytearray()

        def count(n: int) -> bytes:
            return _uvarint(n + 1) if flexible else _I32.pack(n)

        run += _I32.pack(self.throttle_time_ms)
        if version >= 7:
            run += _I16.pack(self.error_code)
            run += _I32.pack(self.session_id)
        run += count(len(self.topics))
        for topic in self.topics:
            name = topic.name.encode()
            run += (_uvarint(len(name) + 1) if flexible else _I16.pack(len(name)))
            run += name
            run += count(len(topic.partitions))
            for p in topic.partitions:
                run += _PARTITION.pack(p.index, p.error_code, p.high_watermark,
                                       p.last_stable_offset)
                if version >= 5:
                    run += _I64.pack(p.log_start_offset)
                if p.aborted is None:
                    run += b"\x00" if flexible else b"\xff\xff\xff\xff"
                else:
                    run += count(len(p.aborted))
                    for a in p.aborted:
                        run += _ABORTED.pack(a.producer_id, a.first_offset)
                        if flexible:
                            run += b"\x00"
                if version >= 11:
                    run += b"\xff\xff\xff\xff"  # preferred read replica: none
                size = sum(len(r) for r in p.records)
                run += _uvarint(size + 1) if flexible else _I32.pack(size)
                for records in p.records:
                    if len(records) < _OWN_CHUNK:
                        run += records
                    else:
                        out.append(run)
                        out.append(records)
                        run = bytearray()
                if flexible:
                    run += b"\x00"  # the partition's tagged fields
            if flexible:
                run += b"\x00"  # the topic's
        if flexible:
            run += b"\x00"  # the response's
        out.append(run)
        return [chunk for chunk in out if len(chunk)]
