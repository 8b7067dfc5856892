"""A partition replica hosted by this broker: its log, producer state, leadership and HW.

Sits between the request handlers and the log. Knows the partition's leader epoch and
in-sync replica set (from ZooKeeper, through the broker), keeps the high watermark, and
wakes long-polling fetches when data arrives.

High watermark: the largest offset every in-sync replica has. With a single replica
(this issue) it equals the log end offset after each append; replication (issue 4)
advances it from follower fetch positions. Consumers never read at or past it.

Thread-safety: every method runs on the broker's event loop, except the fsync wait
under ``flush.policy=always``, which ``wait_durable`` runs in a worker thread (the log's
group commit is thread-safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from brokers.errors import OffsetOutOfRangeError
from brokers.log import AppendInfo, FileSlice, FlushPolicy, LogConfig, PartitionLog
from brokers.producer_state import ProducerStateManager

__all__ = ["LeaderAppend", "Partition"]

log = logging.getLogger("strata.brokers.partition")

METADATA_FILE: Final = "partition.metadata"

# Threads that wait for group-commit fsyncs (flush.policy=always). Separate from the
# default executor so slow disks never starve ZooKeeper calls made via to_thread.
_DURABILITY_WAITS: Final = ThreadPoolExecutor(max_workers=64,
                                              thread_name_prefix="strata-durability")


@dataclass(frozen=True, slots=True)
class LeaderAppend:
    """The outcome of a produce to this partition."""

    first_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool


class Partition:
    def __init__(self, topic: str, partition: int, topic_id: str, directory: Path,
                 config: LogConfig, broker_id: int) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.directory = directory
        self.broker_id = broker_id
        self.leader_id = -1
        self.leader_epoch = 0
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self.log = PartitionLog(directory, config)
        (directory / METADATA_FILE).write_text(json.dumps({"version": 1, "topic_id": topic_id}))
        self.producers = ProducerStateManager(directory)
        snapshot = self.producers.load(self.log.log_end_offset)
        self.producers.replay(self.log.batch_headers(max(snapshot, self.log.log_start_offset)))
        self.high_watermark = self.log.log_end_offset
        self._data_arrived = asyncio.Event()

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, leader={self.leader_id})"

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def config(self) -> LogConfig:
        return self.log.config

    def set_config(self, config: LogConfig) -> None:
        self.log.config = config

    def set_state(self, leader: int, leader_epoch: int, isr: list[int], replicas: list[int]
                  ) -> None:
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.isr = list(isr)
        self.replicas = list(replicas)
        self._advance_high_watermark()

    # ------------------------------------------------------------------ writes
    def append_as_leader(self, batch: memoryview | bytes) -> LeaderAppend:
        """Validate, deduplicate and append one produced batch (no fsync wait).

        Raises the log's validation errors and the producer-state errors; nothing is
        written when one is raised.
        """
        header = self.log.validate(batch)
        duplicate = self.producers.check(header)
        if duplicate is not None:
            return LeaderAppend(duplicate.first_offset, duplicate.last_offset, -1, True)
        info: AppendInfo = self.log.append(batch, leader_epoch=self.leader_epoch,
                                           validated=header, wait_for_flush=False)
        self.producers.update(header, info.first_offset)
        self._advance_high_watermark()
        return LeaderAppend(info.first_offset, info.last_offset, info.log_append_time, False)

    async def wait_durable(self, end_offset: int) -> None:
        if self.log.config.flush_policy is FlushPolicy.ALWAYS:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(_DURABILITY_WAITS, self.log.wait_durable, end_offset)

    def _advance_high_watermark(self) -> None:
        # One replica (or an ISR of just the leader): everything appended is committed.
        if self.isr in ([], [self.broker_id]):
            new = self.log.log_end_offset
            if new != self.high_watermark:
                self.high_watermark = new
        self._notify()

    def _notify(self) -> None:
        self._data_arrived.set()
        self._data_arrived = asyncio.Event()

    def wake_waiters(self) -> None:
        """Answer every parked long poll now (shutdown)."""
        self._notify()

    async def wait_for_data(self) -> None:
        """Return when the next append (or HW move) happens; callers add the timeout."""
        await self._data_arrived.wait()

    # ------------------------------------------------------------------ reads
    def read(self, offset: int, max_bytes: int, *, for_follower: bool = False) -> FileSlice | None:
        """Whole batches from ``offset``; consumers see only committed data (< HW)."""
        upper = None if for_follower else self.high_watermark
        if offset > (self.log.log_end_offset if for_follower else self.high_watermark) \
                or offset < self.log.log_start_offset:
            raise OffsetOutOfRangeError(offset, self.log.log_start_offset,
                                        self.log.log_end_offset if for_follower
                                        else self.high_watermark)
        return self.log.read(offset, max_bytes, upper_offset=upper)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.producers.write_snapshot(self.log.log_end_offset)
        self.log.close()

    def delete(self) -> None:
        try:
            self.log.close()
        finally:  # a disk error while closing must not keep a deleted topic's files
            shutil.rmtree(self.directory, ignore_errors=True)


def read_topic_id(directory: Path) -> str | None:
    try:
        return str(json.loads((directory / METADATA_FILE).read_text())["topic_id"])
    except (OSError, ValueError, KeyError):
        return None
