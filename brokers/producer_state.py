"""Idempotent-producer state of one partition: the last sequences per producer id.

For each producer id the leader remembers its epoch and the last
``MAX_BATCHES_PER_PRODUCER`` batches it wrote (first/last sequence, first/last offset).
A batch is then either:

- new and in order (``base_sequence == last_sequence + 1``, or 0 for a new producer or
  a new epoch): appended;
- a duplicate of a remembered batch (same sequence range): acknowledged with the
  original offset, not appended again (a retry after a lost response);
- out of order (a gap): rejected with ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
- from an older epoch: rejected with ``INVALID_PRODUCER_EPOCH`` (a fenced zombie).

Sink commits (``brokers/staging.py``) are the other kind of writer: their batches carry
the transactional bit, a producer id derived from the sink's id and
``base_sequence = the sink's batch id``. For them the state is the last *completed*
commit (``last_commit``: the batch id of the last group whose commit-end batch is in the
log); a commit whose batch id is at or below it is a replay and is discarded whole.
Sink entries expire after ``sink.state.expiration.ms`` without a commit (default 7
days, far above ``producer.id.expiration.ms``): a Spark query may come back after a long
pause and re-run its last batch, but every one-off batch write is a sink of its own.

Transactions (docs/transactions.md) are the third kind of writer: a producer's
transactional batches (the transactional bit, an ordinary producer id) open a
transaction in this partition at the offset of the first one; the producer's next
marker (a control batch the coordinator has the leader write) ends it and returns a
``CompletedTxn``. Per producer the state keeps the open transaction's first offset and
the highest coordinator epoch seen: a marker from an older coordinator is refused
(TRANSACTION_COORDINATOR_FENCED), one with an older producer epoch too
(INVALID_PRODUCER_EPOCH), and one with the producer's current epoch while nothing is
open is a duplicate (a coordinator retrying), appended once only. A non-transactional
batch while the producer has a transaction open is INVALID_TXN_STATE. The first
unstable offset (``first_unstable_offset``) is the first offset of the oldest open
transaction, or of a completed one whose marker is not yet below the high watermark:
the last stable offset a read_committed fetch stops at never passes either.

The exactly-once Spark sink commits inside a transaction (docs/spark.md): its groups'
batches carry the transactional producer's id and epoch, the transactional sink bit
and ``base_sequence = the sink's batch id``. They open the producer's transaction here
like any transactional batch (the marker decides them), and the state also keeps, for
the open transaction, the batch id whose group is complete here (``txn_sink_batch``: a
driver resuming the transaction after a crash re-runs the commit, and a partition that
has the group already must not append it again) and, as for sink commits, the first
offset of a group whose end batch is missing (``open_commit``: a torn group).

Persistence: ``<offset, 20 digits>.snapshot`` files in the partition directory (JSON,
written atomically) capture the state as of ``offset``. On open the newest snapshot at
or below the log end is loaded and the batch headers after it are replayed (headers
carry producer id, epoch and sequence; a marker's 10-byte control record is read for
its type), so the state survives a restart or a crash without the record payloads ever
being decoded. Only the two newest snapshots are kept. A snapshot holds each open
transaction's first offset and the completed, not yet replicated ones, so the first
unstable offset survives a restart too.

Thread-safety: not thread-safe; the partition calls it from the event loop only.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from brokers.log.checkpoint import write_atomically
from wire.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from wire.record_batch import NO_PRODUCER_ID, SINK_PRODUCER_ID_BASE, BatchHeader, ControlType

__all__ = ["BatchMetadata", "CompletedTxn", "ProducerStateManager"]

MAX_BATCHES_PER_PRODUCER: Final = 5
SNAPSHOT_SUFFIX: Final = ".snapshot"
_INT32_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker just ended in this partition: offsets of its first batch
    and of its marker."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(slots=True)
class _ProducerEntry:
    epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=MAX_BATCHES_PER_PRODUCER))
    last_timestamp: int = -1  # largest batch max_timestamp seen (ms): drives expiry
    # Sink writers only: batch id of the last completed commit (-1: none), and the
    # first offset of a commit group whose end batch has not been seen (replay only).
    last_commit: int = -1
    open_commit_offset: int | None = None
    is_sink: bool = False
    # Transactional producers: the open transaction's first offset here (None: none
    # open) and the highest coordinator epoch a marker of theirs carried.
    txn_first_offset: int | None = None
    coordinator_epoch: int = -1
    # A sink committing inside the transaction: the batch id whose group is complete in
    # the open transaction here (None: none).
    txn_sink_batch: int | None = None

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


def _next_sequence(sequence: int) -> int:
    return 0 if sequence == _INT32_MAX else sequence + 1


class ProducerStateManager:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._producers: dict[int, _ProducerEntry] = {}
        # Completed transactions whose marker is not yet below the high watermark:
        # (first offset, marker offset), in marker order.
        self._unreplicated: deque[tuple[int, int]] = deque()
        # (offset, bytes) of the snapshot on disk as written or loaded by this process:
        # writing the same again (an idle partition at every retention pass and close)
        # would only cost fsyncs.
        self._on_disk: tuple[int, bytes] | None = None

    def __len__(self) -> int:
        return len(self._producers)

    # ------------------------------------------------------------------ checks
    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """The remembered batch if ``header`` duplicates one; raise if it must be refused."""
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(pid)
        if entry is not None and entry.txn_first_offset is not None and \
                not header.is_transactional and header.producer_epoch >= entry.epoch:
            raise InvalidTxnStateError(
                f"producer {pid} has a transaction open in this partition (since offset "
                f"{entry.txn_first_offset}); a non-transactional write is refused until "
                "it commits or aborts")
        if entry is None:
            if header.base_sequence != 0:
                raise UnknownProducerIdError(
                    f"producer {pid} is unknown to this partition and its first batch has "
                    f"sequence {header.base_sequence}, not 0; call InitProducerId and start "
                    "again at sequence 0")
            return None
        if header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {pid} epoch {header.producer_epoch} is older than the current "
                f"epoch {entry.epoch}: a newer instance fenced this producer; stop it")
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid} started epoch {header.producer_epoch} at sequence "
                    f"{header.base_sequence}, not 0")
            return None
        for batch in entry.batches:
            if batch.first_sequence == header.base_sequence \
                    and batch.last_sequence == header.last_sequence:
                return batch
        expected = _next_sequence(entry.last_sequence)
        if header.base_sequence != expected:
            raise OutOfOrderSequenceError(
                f"producer {pid} sent sequence {header.base_sequence} but {expected} was "
                "expected: an earlier batch is missing; the producer must retry in order")
        return None

    def check_epoch(self, header: BatchHeader) -> None:
        """Only the producer-epoch fence (a coordinator's own transactional write, which
        carries no sequence: TxnOffsetCommit's offsets)."""
        entry = self._producers.get(header.producer_id)
        if entry is not None and header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than "
                f"the current epoch {entry.epoch}: a newer instance fenced this producer")

    def describe(self) -> list[tuple[int, int, int, int, int, int]]:
        """Per producer: id, epoch, last sequence, last timestamp, coordinator epoch and
        the open transaction's first offset (-1: none), for DescribeProducers."""
        return [(pid, e.epoch, e.last_sequence, e.last_timestamp, e.coordinator_epoch,
                 -1 if e.txn_first_offset is None else e.txn_first_offset)
                for pid, e in sorted(self._producers.items()) if not e.is_sink]

    # ------------------------------------------------------------------ transactions
    def in_transaction(self, producer_id: int) -> bool:
        """Whether the producer has a transaction open in this partition."""
        entry = self._producers.get(producer_id)
        return entry is not None and entry.txn_first_offset is not None

    def needs_verification(self, header: BatchHeader) -> bool:
        """A transactional batch that would open a transaction here: the leader must ask
        the coordinator that this partition belongs to the producer's open transaction
        (KIP-890 part 1) before it appends."""
        return (header.is_transactional and header.producer_id < SINK_PRODUCER_ID_BASE
                and not header.is_control and not self.in_transaction(header.producer_id))

    def check_marker(self, header: BatchHeader, coordinator_epoch: int) -> bool:
        """Whether a marker for ``header.producer_id`` is to be appended (False: a
        duplicate of one already written, to be acknowledged without writing). Raises
        TRANSACTION_COORDINATOR_FENCED for an older coordinator, INVALID_PRODUCER_EPOCH
        for an older producer epoch."""
        entry = self._producers.get(header.producer_id)
        if entry is None:
            return True  # nothing of this producer here: the marker sets its epoch
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"a marker for producer {header.producer_id} from coordinator epoch "
                f"{coordinator_epoch}, after one from epoch {entry.coordinator_epoch}: a "
                "newer transaction coordinator owns this transaction")
        if header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"a marker for producer {header.producer_id} with epoch "
                f"{header.producer_epoch}, older than its current epoch {entry.epoch}")
        return not (header.producer_epoch == entry.epoch and entry.txn_first_offset is None
                    and entry.coordinator_epoch >= 0)

    def complete(self, header: BatchHeader, marker_offset: int, control: ControlType,
                 coordinator_epoch: int) -> CompletedTxn | None:
        """A marker was appended at ``marker_offset``: end the producer's transaction
        here (None: it had none open) and move the producer to the marker's epoch."""
        pid = header.producer_id
        entry = self._producers.get(pid)
        if entry is None or header.producer_epoch > entry.epoch:
            fresh = _ProducerEntry(header.producer_epoch)
            if entry is not None:
                fresh.txn_first_offset = entry.txn_first_offset
                fresh.coordinator_epoch = entry.coordinator_epoch
            entry = self._producers[pid] = fresh
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        entry.txn_sink_batch = None
        entry.open_commit_offset = None  # a torn group's head is decided by the marker too
        first, entry.txn_first_offset = entry.txn_first_offset, None
        if first is None:
            return None
        self._unreplicated.append((first, marker_offset))
        return CompletedTxn(pid, first, marker_offset, control is ControlType.ABORT)

    def first_unstable_offset(self) -> int | None:
        """The first offset a read_committed reader may not pass (None: none)."""
        starts = [e.txn_first_offset for e in self._producers.values()
                  if e.txn_first_offset is not None]
        starts += [first for first, _ in self._unreplicated]
        return min(starts) if starts else None

    def on_high_watermark(self, high_watermark: int) -> None:
        """Completed transactions whose marker is below the high watermark are stable."""
        while self._unreplicated and self._unreplicated[0][1] < high_watermark:
            self._unreplicated.popleft()

    def open_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction (DescribeProducers)."""
        return {pid: e.txn_first_offset for pid, e in self._producers.items()
                if e.txn_first_offset is not None}

    def last_commit(self, producer_id: int) -> int:
        """Batch id of the sink's last completed commit in this partition (-1: none)."""
        entry = self._producers.get(producer_id)
        return entry.last_commit if entry is not None and entry.is_sink else -1

    def txn_sink_batch(self, producer_id: int, producer_epoch: int) -> int | None:
        """The batch id of the sink commit group complete in the producer's open
        transaction here, at that epoch (None: none)."""
        entry = self._producers.get(producer_id)
        if entry is None or entry.txn_first_offset is None or \
                entry.epoch != producer_epoch:
            return None
        return entry.txn_sink_batch

    def producer_epoch(self, producer_id: int) -> int | None:
        """The producer's current epoch here (None: unknown)."""
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.epoch

    def open_commit(self) -> int | None:
        """First offset of a sink commit group without its end batch (torn), if any."""
        starts = [e.open_commit_offset for e in self._producers.values()
                  if e.open_commit_offset is not None]
        return min(starts) if starts else None

    def _update_sink(self, header: BatchHeader, first_offset: int) -> None:
        entry = self._producers.get(header.producer_id)
        if entry is None or not entry.is_sink:
            entry = _ProducerEntry(0, is_sink=True)
            self._producers[header.producer_id] = entry
        if entry.open_commit_offset is None:
            entry.open_commit_offset = first_offset
        if header.ends_commit:
            entry.last_commit = max(entry.last_commit, header.base_sequence)
            entry.open_commit_offset = None
        # The broker's clock, not the records' timestamps: a sink often writes records
        # with old event times (a replay), which must not make it look idle. A replay of
        # the log after a restart refreshes it, which only lengthens the entry's life.
        entry.last_timestamp = max(entry.last_timestamp, time.time_ns() // 1_000_000)

    def update(self, header: BatchHeader, first_offset: int) -> None:
        """Record an appended batch (leader append, follower append or log replay)."""
        pid = header.producer_id
        if pid == NO_PRODUCER_ID:
            return
        if header.is_transactional and pid >= SINK_PRODUCER_ID_BASE:
            self._update_sink(header, first_offset)
            return
        if header.is_control:
            return  # markers: ``complete``
        entry = self._producers.get(pid)
        if entry is None or header.producer_epoch > entry.epoch:
            fresh = _ProducerEntry(header.producer_epoch)
            if entry is not None:  # a new epoch keeps what a marker must still end
                fresh.txn_first_offset = entry.txn_first_offset
                fresh.coordinator_epoch = entry.coordinator_epoch
                fresh.txn_sink_batch = entry.txn_sink_batch
            entry = self._producers[pid] = fresh
        if header.is_transactional and entry.txn_first_offset is None:
            entry.txn_first_offset = first_offset
        if header.in_txn_sink_commit:
            # A sink's group in the transaction: no sequences (base_sequence is the batch
            # id); the group's end completes it here.
            if entry.open_commit_offset is None:
                entry.open_commit_offset = first_offset
            if header.ends_commit:
                entry.txn_sink_batch = header.base_sequence
                entry.open_commit_offset = None
            entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
            return
        entry.batches.append(BatchMetadata(
            header.base_sequence, header.last_sequence, first_offset,
            first_offset + header.last_offset_delta))
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)

    def expire(self, now_ms: int, max_idle_ms: int, *,
               sink_max_idle_ms: int | None = None) -> int:
        """Forget producers whose last batch is older than ``max_idle_ms``; return how many.

        Without this the map (and every snapshot) grows with each producer id ever seen.
        A forgotten producer that comes back must start again at sequence 0
        (``UNKNOWN_PRODUCER_ID`` tells it so), exactly like Kafka's
        ``producer.id.expiration.ms``. Sink entries expire only with ``sink_max_idle_ms``
        (``sink.state.expiration.ms``, default 7 days), so each one-off batch write does
        not leave state behind forever.
        """
        idle = [pid for pid, e in self._producers.items()
                if (not e.is_sink and e.txn_first_offset is None
                    and e.last_timestamp < now_ms - max_idle_ms)
                or (e.is_sink and sink_max_idle_ms is not None
                    and e.last_timestamp < now_ms - sink_max_idle_ms)]
        for pid in idle:
            del self._producers[pid]
        return len(idle)

    def replay(self, headers: Iterable[BatchHeader | tuple[BatchHeader, ControlType, int]]
               ) -> list[CompletedTxn]:
        """Rebuild from the log after a snapshot: data batch headers, and markers as
        ``(header, control type, coordinator epoch)``. Returns the transactions the
        markers completed (recovery rebuilds the aborted-transaction index from them)."""
        completed: list[CompletedTxn] = []
        for item in headers:
            if isinstance(item, tuple):
                header, control, coordinator_epoch = item
                done = self.complete(header, header.base_offset, control, coordinator_epoch)
                if done is not None:
                    completed.append(done)
            else:
                self.update(item, item.base_offset)
        return completed

    def clear(self) -> None:
        self._producers.clear()
        self._unreplicated.clear()

    def reset(self) -> None:
        """Forget everything, snapshots included (the log restarted elsewhere)."""
        self._producers.clear()
        self._unreplicated.clear()
        for offset in self.snapshot_offsets():
            self._snapshot_path(offset).unlink(missing_ok=True)

    # ------------------------------------------------------------------ snapshots
    def _snapshot_path(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def snapshot_offsets(self) -> list[int]:
        try:  # os.listdir, not Path.glob: this runs for every log a broker opens
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        stems = (n[: -len(SNAPSHOT_SUFFIX)] for n in names if n.endswith(SNAPSHOT_SUFFIX))
        return sorted(int(s) for s in stems if s.isdigit())

    def write_snapshot(self, offset: int) -> None:
        """Persist the state as of ``offset`` (the log end it reflects)."""
        state = {
            str(pid): {"epoch": e.epoch, "last_timestamp": e.last_timestamp,
                       "sink": e.is_sink, "last_commit": e.last_commit,
                       "batches": [[b.first_sequence, b.last_sequence, b.first_offset,
                                    b.last_offset] for b in e.batches],
                       **({"txn_first_offset": e.txn_first_offset}
                          if e.txn_first_offset is not None else {}),
                       **({"coordinator_epoch": e.coordinator_epoch}
                          if e.coordinator_epoch >= 0 else {}),
                       **({"txn_sink_batch": e.txn_sink_batch}
                          if e.txn_sink_batch is not None else {})}
            for pid, e in self._producers.items()
        }
        if offset == 0 and not state and not self._unreplicated \
                and not self._snapshot_path(0).exists():
            return  # a log that never held a record: ``load`` finds nothing, rightly
        snapshot = {"version": 1, "offset": offset, "producers": state}
        if self._unreplicated:
            snapshot["unreplicated"] = [list(t) for t in self._unreplicated]
        data = json.dumps(snapshot).encode("ascii")
        if self._on_disk == (offset, data) and self._snapshot_path(offset).exists():
            return
        write_atomically(self._snapshot_path(offset), data)
        self._on_disk = (offset, data)
        for old in self.snapshot_offsets()[:-2]:
            self._snapshot_path(old).unlink(missing_ok=True)

    def load(self, log_end_offset: int) -> int:
        """Load the newest usable snapshot at or below the log end; return its offset.

        Snapshots above the log end (the log was truncated) are deleted. Returns the
        log start for a replay of everything when none is usable (0).
        """
        self._producers.clear()
        for offset in reversed(self.snapshot_offsets()):
            path = self._snapshot_path(offset)
            if offset > log_end_offset:
                path.unlink(missing_ok=True)
                continue
            try:
                raw = path.read_bytes()
                value = json.loads(raw.decode("ascii"))
                for pid, entry in value["producers"].items():
                    first = entry.get("txn_first_offset")
                    sink_batch = entry.get("txn_sink_batch")
                    producer = _ProducerEntry(int(entry["epoch"]),
                                              last_timestamp=int(entry.get("last_timestamp", -1)),
                                              last_commit=int(entry.get("last_commit", -1)),
                                              is_sink=bool(entry.get("sink", False)),
                                              txn_first_offset=None if first is None
                                              else int(first),
                                              coordinator_epoch=int(
                                                  entry.get("coordinator_epoch", -1)),
                                              txn_sink_batch=None if sink_batch is None
                                              else int(sink_batch))
                    for fs, ls, fo, lo in entry["batches"]:
                        producer.batches.append(BatchMetadata(fs, ls, fo, lo))
                    self._producers[int(pid)] = producer
                self._unreplicated = deque((int(f), int(m))
                                           for f, m in value.get("unreplicated", []))
                self._on_disk = (offset, raw)
                return offset
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                path.unlink(missing_ok=True)  # a damaged snapshot: fall back to an older one
                self._producers.clear()
                self._unreplicated.clear()
        return 0
