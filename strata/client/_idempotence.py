"""The idempotent producer's state: producer ids and per-partition sequence numbers.

Job: get producer ids (``InitProducerId``, retried with backoff until it succeeds or the
producer closes) and number each partition's batches from 0, so a broker that already
wrote a batch (its response was lost) acknowledges the retry with its original offset
instead of writing it twice. The sender asks ``ready`` before it encodes a new batch,
``stamp`` for the batch's ``(producer id, epoch, base sequence)``, then ``advance``.

Invariants:

- A sequence is assigned once, when a batch is first encoded; a retry resends the same
  bytes (same sequence), so numbers are never reused or skipped within one producer id.
- Every partition starts on the producer's shared id at sequence 0. When a numbered batch
  fails for good (outcome unknown) or its sequence would pass 2^31-1, the partition gets
  a fresh id (``restart``) and starts at 0 again before it sends another new batch;
  other partitions keep theirs.

Thread-safety: loop only (the sender's ``ready`` pass, encoding and completions all run on
the producer's event loop); no lock.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from strata.client._accumulator import Wakeup
from strata.client._cluster import Cluster
from strata.client._config import ProducerConfig
from wire.errors import StrataError, raise_for_code
from wire.protocol import ApiKey, InitProducerIdRequest, InitProducerIdResponse
from wire.record_batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

__all__ = ["Idempotence", "PartitionSequence"]

log = logging.getLogger("strata.client.producer")

#: The largest sequence number a record batch can carry.
MAX_SEQUENCE: Final = 2**31 - 1


class PartitionSequence:
    """The producer id and next sequence of one partition."""

    __slots__ = ("next_sequence", "producer_epoch", "producer_id", "task", "wants_fresh_id")

    def __init__(self) -> None:
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.next_sequence = 0
        self.wants_fresh_id = False
        self.task: asyncio.Task[None] | None = None  # getting a fresh id


class Idempotence:
    """Producer ids and sequence numbering for an idempotent producer."""

    def __init__(self, cluster: Cluster, config: ProducerConfig, wakeup: Wakeup) -> None:
        self._cluster = cluster
        self._config = config
        self._wakeup = wakeup
        self._shared: tuple[int, int] | None = None
        self._shared_task: asyncio.Task[None] | None = None
        self.sequences: dict[tuple[str, int], PartitionSequence] = {}
        # A transactional producer gets its id and epoch from its transaction
        # coordinator (``use``), never by itself; a failed batch waits for the next.
        self.transactional = config.transactional_id is not None

    def start(self) -> None:
        """Fetch the shared id now, so the first batch need not wait (on the loop)."""
        if not self.transactional:
            self._shared_task = self._wakeup.loop.create_task(self._init_shared())

    def use(self, producer_id: int, producer_epoch: int) -> None:
        """A transactional producer's id and epoch from its coordinator (after
        InitProducerId, and after every EndTxn bumped the epoch): every partition starts
        again at sequence 0 with them."""
        self._shared = (producer_id, producer_epoch)
        for st in self.sequences.values():
            st.producer_id, st.producer_epoch = producer_id, producer_epoch
            st.next_sequence = 0
            st.wants_fresh_id = False

    def _sequence(self, key: tuple[str, int]) -> PartitionSequence:
        sequence = self.sequences.get(key)
        if sequence is None:
            sequence = self.sequences[key] = PartitionSequence()
        return sequence

    def ready(self, key: tuple[str, int]) -> bool:
        """Whether partition ``key`` can number a new batch; starts getting an id if not."""
        st = self._sequence(key)
        if st.producer_id != NO_PRODUCER_ID:
            return True
        loop = self._wakeup.loop
        if self.transactional:
            if self._shared is None or st.wants_fresh_id:
                return False  # until the coordinator's id (or the next transaction's)
            st.producer_id, st.producer_epoch = self._shared
            st.next_sequence = 0
            return True
        if st.wants_fresh_id:
            if st.task is None or st.task.done():
                st.task = loop.create_task(self._fresh(key, st))
            return False
        if self._shared is not None:
            st.producer_id, st.producer_epoch = self._shared
            st.next_sequence = 0
            return True
        if self._shared_task is None or self._shared_task.done():
            self._shared_task = loop.create_task(self._init_shared())
        return False

    def stamp(self, key: tuple[str, int], count: int) -> tuple[int, int, int] | None:
        """``(producer id, epoch, base sequence)`` for the next batch of ``count`` records
        of ``key``; ``None`` when the sequence would pass 2^31-1 (a fresh id is asked for)."""
        st = self._sequence(key)
        if st.next_sequence + count - 1 > MAX_SEQUENCE:
            self.restart(key)
            return None
        return st.producer_id, st.producer_epoch, st.next_sequence

    def advance(self, key: tuple[str, int], count: int) -> None:
        """The batch ``stamp`` numbered was encoded: its ``count`` sequences are used."""
        self._sequence(key).next_sequence += count

    def restart(self, key: tuple[str, int]) -> None:
        """Partition ``key`` continues with a fresh producer id (sequence 0)."""
        st = self._sequence(key)
        st.producer_id = NO_PRODUCER_ID
        st.wants_fresh_id = True

    def tasks(self) -> list[asyncio.Task[None]]:
        """The id requests under way (``close`` cancels them)."""
        tasks = [self._shared_task, *(st.task for st in self.sequences.values())]
        return [task for task in tasks if task is not None]

    async def _acquire(self) -> tuple[int, int]:
        attempt = 0
        while True:
            try:
                response = await self._cluster.send_any(ApiKey.INIT_PRODUCER_ID,
                                                        InitProducerIdRequest())
                assert isinstance(response, InitProducerIdResponse)
                raise_for_code(response.error_code, response.error_message)
                return response.producer_id, response.producer_epoch
            except (StrataError, OSError, TimeoutError) as err:
                if isinstance(err, StrataError) and not err.retriable:
                    log.error("InitProducerId failed: %s", err)
                attempt += 1
                await asyncio.sleep(self._config.backoff_s(attempt))

    async def _init_shared(self) -> None:
        self._shared = await self._acquire()
        log.debug("producer id %d epoch %d", *self._shared)
        self._wakeup.set()

    async def _fresh(self, key: tuple[str, int], st: PartitionSequence) -> None:
        pid, epoch = await self._acquire()
        st.producer_id, st.producer_epoch, st.next_sequence = pid, epoch, 0
        st.wants_fresh_id = False
        log.info("%s-%d: continuing with fresh producer id %d", *key, pid)
        self._wakeup.set()
