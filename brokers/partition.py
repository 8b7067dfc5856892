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

from brokers.errors import InvalidRecordBatchError, InvalidRequestError, OffsetOutOfRangeError
from brokers.log import AppendInfo, FileSlice, FlushPolicy, LogConfig, PartitionLog
from brokers.producer_state import ProducerStateManager
from brokers.record_batch import (
    BROKER_ONLY_ATTRIBUTE_BITS,
    SINK_PRODUCER_ID_BASE,
    peek_header,
    stamp_sink_commit,
)
from brokers.staging import StagedPart, StagingArea

__all__ = ["LeaderAppend", "Partition", "SinkCommit"]

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


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """The outcome of a sink commit in this partition.

    ``duplicate``: the sink had already committed this batch id (or a later one) here;
    nothing was appended and ``first_offset``/``last_offset`` are -1.
    """

    first_offset: int
    last_offset: int
    duplicate: bool
    last_committed_batch: int


_INT32_MAX: Final = 2**31 - 1


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
        self._load_producer_state()
        torn = self.producers.open_commit()
        if torn is not None:
            # A crash in the middle of a sink commit's group append: the group must be
            # all or nothing, so its head goes too (the commit is re-run by its writer).
            log.warning("%s-%d: removing a torn sink commit from offset %d to the log end "
                        "%d", topic, partition, torn, self.log.log_end_offset)
            self.log.truncate_to(torn)
            self._load_producer_state()
        self.staging = StagingArea(directory)
        self._high_watermark_cap: int | None = None
        self.high_watermark = self.log.log_end_offset
        self._data_arrived = asyncio.Event()

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, leader={self.leader_id})"

    def _load_producer_state(self) -> None:
        snapshot = self.producers.load(self.log.log_end_offset)
        self.producers.replay(self.log.batch_headers(max(snapshot, self.log.log_start_offset)))

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
        """Apply the partition state from ZooKeeper (at load and on every change).

        Becoming leader with a newer epoch records the epoch's start at the log end.
        Losing leadership takes effect at once: produce answers NOT_LEADER_OR_FOLLOWER
        and parked fetches are woken to notice.
        """
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.isr = list(isr)
        self.replicas = list(replicas)
        if self.is_leader and not self.log.is_offline \
                and leader_epoch > self.log.latest_epoch:
            self.log.start_epoch(leader_epoch)
        self._advance_high_watermark()

    # ------------------------------------------------------------------ writes
    def append_as_leader(self, batch: memoryview | bytes) -> LeaderAppend:
        """Validate, deduplicate and append one produced batch (no fsync wait).

        Raises the log's validation errors and the producer-state errors; nothing is
        written when one is raised.
        """
        header = self.log.validate(batch)
        if header.attributes & BROKER_ONLY_ATTRIBUTE_BITS:
            raise InvalidRecordBatchError(
                "produced batches must not set the transactional, control or commit-end "
                "attribute bits: only a sink commit (CommitStaged) writes those")
        if header.producer_id >= SINK_PRODUCER_ID_BASE:
            raise InvalidRecordBatchError(
                f"producer id {header.producer_id} is in the range reserved for sinks "
                f"(>= {SINK_PRODUCER_ID_BASE}); use the id InitProducerId returned")
        duplicate = self.producers.check(header)
        if duplicate is not None:
            return LeaderAppend(duplicate.first_offset, duplicate.last_offset, -1, True)
        info: AppendInfo = self.log.append(batch, leader_epoch=self.leader_epoch,
                                           validated=header, wait_for_flush=False)
        self.producers.update(header, info.first_offset)
        self._advance_high_watermark()
        return LeaderAppend(info.first_offset, info.last_offset, info.log_append_time, False)

    def stage(self, staging_id: str, chunk_sequence: int, batch: memoryview | bytes) -> bool:
        """Stage a sink writer's chunk (invisible until committed); True for a resend."""
        header = self.log.validate(batch)
        return self.staging.stage(staging_id, chunk_sequence, batch, header)

    def commit_staged(self, producer_id: int, batch_id: int, parts: list[StagedPart]
                      ) -> SinkCommit:
        """Append the staged ``parts`` as sink ``producer_id``'s commit ``batch_id``.

        Exactly once per (sink, batch id, partition): a batch id at or below the sink's
        last commit here is a replay; its staged files are discarded and nothing is
        appended. Otherwise the files are checked against the writers' counts
        (``STAGED_DATA_MISSING`` if they differ; nothing is appended) and appended as one
        group whose last batch ends the commit. No fsync wait: the caller does that.
        """
        if producer_id < SINK_PRODUCER_ID_BASE:
            raise InvalidRequestError(
                f"sink producer id {producer_id} is below {SINK_PRODUCER_ID_BASE}; derive it "
                "from the sink id (strata.client.sink_producer_id)")
        if not 0 <= batch_id <= _INT32_MAX:
            raise InvalidRequestError(f"batch id {batch_id} is outside 0..{_INT32_MAX}")
        if not parts:
            raise InvalidRequestError("a commit names at least one staged part")
        last = self.producers.last_commit(producer_id)
        ids = [p.staging_id for p in parts]
        if batch_id <= last:
            self.staging.discard(ids)
            return SinkCommit(-1, -1, True, last)
        if len(set(ids)) != len(ids):
            raise InvalidRequestError(
                f"a commit names a staging id twice in {self.name}; name each once")
        batches = self.staging.collect(parts)
        for i, data in enumerate(batches):
            stamp_sink_commit(data, producer_id, batch_id, ends_commit=i == len(batches) - 1)
        group_start = self.log.log_end_offset
        try:
            info = self.log.append_group(batches, leader_epoch=self.leader_epoch)
        except Exception:
            # A disk error part-way may have left whole batches of an unfinished group:
            # they must never become readable (the log is offline; the partition's next
            # open truncates them).
            self._high_watermark_cap = group_start
            raise
        for data in batches:
            header = peek_header(data)
            self.producers.update(header, header.base_offset)
        self.staging.discard(ids)
        self._advance_high_watermark()
        if self.log.config.flush_policy is FlushPolicy.INTERVAL:
            self.log.flush_if_due()
        return SinkCommit(info.first_offset, info.last_offset, False, batch_id)

    def abort_staged(self, staging_ids: list[str]) -> int:
        return self.staging.discard(staging_ids)

    async def wait_durable(self, end_offset: int) -> None:
        if self.log.config.flush_policy is FlushPolicy.ALWAYS:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(_DURABILITY_WAITS, self.log.wait_durable, end_offset)

    def _advance_high_watermark(self) -> None:
        # One replica (or an ISR of just the leader): everything appended is committed.
        if self.isr in ([], [self.broker_id]):
            new = self.log.log_end_offset
            if self._high_watermark_cap is not None:
                new = min(new, self._high_watermark_cap)
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
        # After a disk error the state in memory may not match what is on disk (a torn
        # sink group, a write that half failed): no snapshot, so the next open rebuilds
        # the state from the log itself.
        if not self.log.is_offline:
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
