"""Which partition a record goes to: Kafka's default partitioner, byte for byte.

Keyed records
    ``partition = (murmur2(key) & 0x7fffffff) % num_partitions``, where ``murmur2`` is
    exactly Kafka's ``org.apache.kafka.common.utils.Utils.murmur2`` (32-bit MurmurHash2,
    seed ``0x9747b28c``, little-endian 4-byte blocks, Java ``int`` arithmetic). So a key
    lands on the same partition number as it would with Kafka's Java client (and with
    librdkafka's ``murmur2_random`` partitioner) for the same partition count: data
    migrated between the two systems keeps its per-key order and co-partitioning.
    Adding partitions to a topic moves keys, exactly as in Kafka.

Records without a key (sticky partitioning, Kafka KIP-480)
    All null-key records of a topic go to one "sticky" partition, chosen at random, until
    the producer closes a batch for that partition (it filled up to ``batch_size`` or its
    ``linger_ms`` expired); then a new sticky partition is picked at random among the
    others. Null-key records therefore form full batches instead of one tiny batch per
    partition, while load still spreads over all partitions over time.

An explicit ``partition=`` on ``send`` bypasses both rules.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["MURMUR2_SEED", "StickyPartitioner", "key_partitions", "murmur2",
           "partition_for_key", "split_by_partition", "to_positive"]

MURMUR2_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24
_MASK32: Final = 0xFFFFFFFF


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Kafka's ``Utils.murmur2``: the signed 32-bit hash a Java client computes for ``data``.

    Python integers are unbounded, so every multiplication is masked to 32 bits to
    reproduce Java's ``int`` overflow; ``>>>`` (unsigned shift) is a plain shift of the
    masked value. The result is converted back to a signed int so it matches the Java
    value in Kafka's own test vectors.
    """
    data = bytes(data)
    length = len(data)
    h = (MURMUR2_SEED ^ length) & _MASK32
    blocks = length // 4
    if blocks:
        for (k,) in struct.iter_unpack("<I", data[: blocks * 4]):
            k = (k * _M) & _MASK32
            k ^= k >> _R
            k = (k * _M) & _MASK32
            h = ((h * _M) & _MASK32) ^ k
    tail = length & 3
    if tail:
        base = length & ~3
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def to_positive(value: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``: ``MIN_VALUE`` stays 0)."""
    return value & 0x7FFFFFFF


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null ``key``."""
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """Per-topic sticky partition for null-key records (see the module docstring).

    Not thread-safe on its own: the producer calls it under its accumulator lock.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        """The current sticky partition of ``topic`` (picked at random the first time)."""
        current = self._sticky.get(topic)
        if current is None or current >= num_partitions:
            current = self._rng.randrange(num_partitions)
            self._sticky[topic] = current
        return current

    def batch_closed(self, topic: str, partition: int, num_partitions: int) -> None:
        """A batch of ``topic``/``partition`` was closed: move on if it was the sticky one.

        The new partition is chosen at random among the *other* partitions, so two
        consecutive batches never land on the same partition when there is a choice.
        """
        if self._sticky.get(topic) != partition:
            return
        if num_partitions <= 1:
            self._sticky[topic] = 0
            return
        choice = self._rng.randrange(num_partitions - 1)
        self._sticky[topic] = choice if choice < partition else choice + 1


def key_partitions(keys: Any, num_partitions: int, null_target: int) -> list[int]:
    """The partition of each key of an Arrow binary column (murmur2, one Python call per
    key: Kafka's hash has no Arrow kernel); null keys get ``null_target``."""
    return [null_target if k is None else partition_for_key(k, num_partitions)
            for k in keys.to_pylist()]


def split_by_partition(rows: Any, targets: Sequence[int]) -> Iterator[tuple[int, Any]]:
    """``rows`` (an Arrow table or record batch) grouped by ``targets`` (one partition
    per row), in partition order, each group keeping the rows' order."""
    target_array = pa.array(targets, pa.int32())
    for partition in sorted(set(targets)):
        yield partition, rows.filter(pc.equal(target_array, pa.scalar(partition, pa.int32())))
