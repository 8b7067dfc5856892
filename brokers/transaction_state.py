"""The transaction coordinator's state machine: one transactional id's metadata and every
transition the transaction APIs may make to it. Pure logic, no I/O (tested without a
broker, like the assignors); the coordinator persists each transition before it answers.

The model is Kafka's (KIP-98, KIP-447) with the defences Kafka added later built in
(docs/transactions.md):

* **Transactions V2 (KIP-890 part 2)**: every EndTxn bumps the producer epoch (``e`` to
  ``e + 1``, or a new producer id at epoch 0 when the epoch runs out), the markers carry
  the bumped epoch, and the EndTxn answer gives the client the epoch of its next
  transaction. So producer id + epoch name exactly one transaction: a delayed EndTxn or
  produce of transaction N cannot commit, abort or join transaction N + 1 (Jepsen's
  Bufstream 0.1 and KAFKA-17754 findings). ``end_txn(..., tv2=False)`` keeps Kafka's
  older rules for clients that have not moved (the Kafka listener's).
* **Verification (KIP-890 part 1)**: ``verify`` answers a partition leader asking, before
  the first transactional write of a producer to a partition, whether that partition
  belongs to the producer's open transaction. It reads and never writes.

States and the previous states each may follow (Kafka's ids, persisted as ``state``)::

    EMPTY 0               EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT
    ONGOING 1             ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT
    PREPARE_COMMIT 2      ONGOING
    PREPARE_ABORT 3       ONGOING, PREPARE_EPOCH_FENCE, EMPTY/COMPLETE_* (an empty abort)
    COMPLETE_COMMIT 4     PREPARE_COMMIT
    COMPLETE_ABORT 5      PREPARE_ABORT
    DEAD 6                EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT (expiry: a tombstone)
    PREPARE_EPOCH_FENCE 7 ONGOING (in memory only, never persisted)

How a transition runs (``TxnMetadata``): a method checks the request against the current
state and returns a ``Step``: a ``TxnRecord`` to persist (None: answer at once) and the
answer to give once it is persisted. The caller sets it as ``pending`` (every other
request then gets CONCURRENT_TRANSACTIONS), writes it to the transaction log with
acks=all, and on success calls ``complete`` (the record becomes current) or on failure
``abandon``. So memory is never ahead of the log, and an answer never promises what a
new coordinator could not reload.

Strata's additions, both persisted:

* ``two_phase`` (Kafka's KIP-939 ``enable2Pc``): the transaction is never aborted by its
  timeout, and ``init_producer_id(keep_prepared=True)`` hands an open transaction back
  to the restarted owner instead of aborting it. The exactly-once Spark sink uses it so
  a micro-batch prepared before a driver crash is completed by the restarted query.
* ``tag``: an opaque string the client attaches when the transaction starts (the sink's
  micro-batch id), kept through its completion, so a restarted owner knows which of its
  units of work the open or last transaction was.

Thread-safety: none; the coordinator touches a transactional id's metadata from the
broker's event loop only, one request at a time.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from wire.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    StrataError,
    TransactionAbortableError,
)

__all__ = [
    "MAX_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "InitAnswer",
    "Step",
    "TxnMetadata",
    "TxnRecord",
    "TxnState",
    "check_timeout",
    "decode_record",
    "encode_key",
    "encode_record",
]

#: The last epoch a producer id may use (Kafka: Short.MAX_VALUE - 1); past it the
#: coordinator moves the transactional id to a new producer id at epoch 0.
MAX_EPOCH: Final = 32766
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def label(self) -> str:
        """Kafka's name (DescribeTransactions, ListTransactions, the CLI)."""
        return _LABELS[self]


_LABELS: Final = {
    TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit", TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit", TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead", TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_COMPLETE: Final = (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
_PREPARE: Final = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
_IDLE: Final = (TxnState.EMPTY, *_COMPLETE)
_VALID_PREVIOUS: Final = {
    TxnState.EMPTY: {TxnState.EMPTY, *_COMPLETE},
    TxnState.ONGOING: {TxnState.ONGOING, *_IDLE},
    TxnState.PREPARE_COMMIT: {TxnState.ONGOING},
    TxnState.PREPARE_ABORT: {TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE, *_IDLE},
    TxnState.COMPLETE_COMMIT: {TxnState.PREPARE_COMMIT},
    TxnState.COMPLETE_ABORT: {TxnState.PREPARE_ABORT},
    TxnState.DEAD: set(_IDLE),
    TxnState.PREPARE_EPOCH_FENCE: {TxnState.ONGOING},
}

Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """What the transaction log holds for one transactional id (one record each)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[Partition] = frozenset()
    start_ms: int = -1  # when the open (or last) transaction began; -1: none
    last_update_ms: int = -1
    previous_producer_id: int = NO_PRODUCER_ID  # before a rotation to a new id
    next_producer_id: int = NO_PRODUCER_ID  # the id after an epoch overflow (TV2)
    two_phase: bool = False
    tag: str | None = None

    def replace(self, **changes: Any) -> TxnRecord:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Step:
    """What a request does: persist ``record`` (None: nothing to write), then answer.

    ``error`` is the answer's error (None: success; some errors, such as
    CONCURRENT_TRANSACTIONS after a fence, come after a write). ``producer_id`` /
    ``producer_epoch`` are what the answer carries. ``markers`` is True when, once
    ``record`` is persisted, the coordinator must write the transaction's markers
    (``record.state`` is PREPARE_COMMIT or PREPARE_ABORT) and then ``complete_txn``.
    """

    record: TxnRecord | None
    error: StrataError | None = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    markers: bool = False


@dataclass(frozen=True, slots=True)
class InitAnswer:
    """What InitProducerId with ``keep_prepared`` also tells a two-phase owner."""

    state: TxnState
    tag: str | None


def _fail(error: StrataError) -> Step:
    return Step(None, error)


class TxnMetadata:
    """One transactional id: the persisted ``record``, plus what lives in memory only
    (``pending``, ``last_producer_epoch`` for recognising retries, and whether a fence's
    write failed)."""

    __slots__ = ("has_failed_fence", "last_producer_epoch", "pending", "record")

    def __init__(self, record: TxnRecord) -> None:
        self.record = record
        self.pending: TxnRecord | None = None
        self.last_producer_epoch = NO_PRODUCER_EPOCH
        self.has_failed_fence = False

    def __repr__(self) -> str:
        return f"TxnMetadata({self.record!r}, pending={self.pending!r})"

    @classmethod
    def new(cls, transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int,
            two_phase: bool = False) -> TxnMetadata:
        """A transactional id seen for the first time (nothing persisted yet: epoch -1)."""
        return cls(TxnRecord(transactional_id, producer_id, NO_PRODUCER_EPOCH, timeout_ms,
                             TxnState.EMPTY, last_update_ms=now_ms, two_phase=two_phase))

    # ------------------------------------------------------------------ bookkeeping
    @property
    def state(self) -> TxnState:
        return self.record.state

    def begin(self, record: TxnRecord) -> None:
        """``record`` is being persisted: requests meanwhile get CONCURRENT_TRANSACTIONS."""
        if self.pending is not None:
            raise AssertionError(f"{self.record.transactional_id}: a transition to "
                                 f"{self.pending.state.label} is already in progress")
        if self.record.state not in _VALID_PREVIOUS[record.state] and \
                record.state != self.record.state:
            raise AssertionError(f"{self.record.transactional_id}: {self.record.state.label}"
                                 f" -> {record.state.label} is not a valid transition")
        self.pending = record

    def complete(self, record: TxnRecord) -> None:
        """``record`` was persisted: it is the current state now."""
        if self.pending is not None and self.pending != record:
            raise AssertionError("completed a transition that was not the pending one")
        previous = self.record
        if record.producer_id == previous.producer_id and \
                record.producer_epoch != previous.producer_epoch:
            self.last_producer_epoch = previous.producer_epoch
        self.record = record
        self.pending = None
        self.has_failed_fence = False

    def abandon(self, *, fence_failed: bool = False) -> None:
        """The write of ``pending`` failed: nothing changed."""
        self.pending = None
        self.has_failed_fence = fence_failed

    def _busy(self) -> Step | None:
        if self.pending is not None:
            return _fail(ConcurrentTransactionsError(
                f"transactional id {self.record.transactional_id!r} is changing state "
                f"({self.record.state.label} -> {self.pending.state.label}); retry shortly"))
        return None

    def _bumped(self, now_ms: int, allocate: Callable[[], int]) -> tuple[int, int, int]:
        """(producer id, epoch, previous id) after one epoch bump (a new id at the end)."""
        r = self.record
        if r.producer_epoch >= MAX_EPOCH:
            return allocate(), 0, r.producer_id
        return r.producer_id, r.producer_epoch + 1, r.previous_producer_id

    # ------------------------------------------------------------------ InitProducerId
    def init_producer_id(self, *, timeout_ms: int, now_ms: int, allocate: Callable[[], int],
                         expected_id: int = NO_PRODUCER_ID,
                         expected_epoch: int = NO_PRODUCER_EPOCH, two_phase: bool = False,
                         keep_prepared: bool = False) -> tuple[Step, InitAnswer]:
        """A producer starts (or restarts) with this transactional id.

        Empty or complete: the epoch is bumped (the previous incarnation is fenced) and
        an EMPTY record persisted. An open transaction is aborted with a fenced epoch
        (PREPARE_ABORT persisted, markers follow) and the answer is
        CONCURRENT_TRANSACTIONS: the client retries and gets the next epoch once the
        abort completed. ``keep_prepared`` (only with ``two_phase``): an open two-phase
        transaction is handed back unchanged (its id, epoch and ``tag``) for its owner
        to commit or abort."""
        r = self.record
        answer = InitAnswer(r.state, r.tag)
        if busy := self._busy():
            return busy, answer
        if (expected_id == NO_PRODUCER_ID) != (expected_epoch == NO_PRODUCER_EPOCH):
            return _fail(InvalidRequestError(
                "producer_id and producer_epoch are given together or not at all")), answer
        if expected_id != NO_PRODUCER_ID and not self._valid_expected(expected_id,
                                                                      expected_epoch):
            return _fail(ProducerFencedError(
                f"producer {expected_id} epoch {expected_epoch} is not the current "
                f"incarnation of transactional id {r.transactional_id!r} (now producer "
                f"{r.producer_id} epoch {r.producer_epoch}): another instance took over; "
                "close this producer")), answer
        if keep_prepared and not two_phase:
            return _fail(InvalidRequestError(
                "keep_prepared needs a two-phase transactional id (two_phase=True)")), answer
        if r.state in _PREPARE:
            return _fail(ConcurrentTransactionsError(
                f"transactional id {r.transactional_id!r} is completing a transaction "
                f"({r.state.label}); retry shortly")), answer
        if r.state is TxnState.ONGOING:
            if keep_prepared and r.two_phase:
                return Step(None, None, r.producer_id, r.producer_epoch), answer
            return self._fence(now_ms), answer
        if r.state not in _IDLE:
            raise AssertionError(f"InitProducerId in state {r.state.label}")
        if expected_id != NO_PRODUCER_ID and r.producer_epoch != NO_PRODUCER_EPOCH and \
                expected_epoch == self.last_producer_epoch and \
                expected_id == r.producer_id and expected_epoch != r.producer_epoch:
            # A retry of a bump that succeeded: answer it again, bump nothing.
            return Step(None, None, r.producer_id, r.producer_epoch), answer
        pid, epoch, previous = self._bumped(now_ms, allocate)
        record = r.replace(producer_id=pid, producer_epoch=epoch, timeout_ms=timeout_ms,
                           state=TxnState.EMPTY, partitions=frozenset(), start_ms=-1,
                           last_update_ms=now_ms, previous_producer_id=previous,
                           next_producer_id=NO_PRODUCER_ID, two_phase=two_phase)
        return Step(record, None, pid, epoch), answer

    def _valid_expected(self, expected_id: int, expected_epoch: int) -> bool:
        r = self.record
        if r.producer_epoch == NO_PRODUCER_EPOCH:
            return True  # just created here: a producer recovering from an unknown id
        if expected_id == r.producer_id:
            return expected_epoch in (r.producer_epoch, self.last_producer_epoch)
        return expected_id == r.previous_producer_id and expected_epoch >= MAX_EPOCH

    def _fence(self, now_ms: int) -> Step:
        """Abort the open transaction with the epoch bumped (KIP-98's epoch fence): the
        markers carry the new epoch, so the old producer's late writes are refused. As in
        Kafka under transactions V2 the bump is two (the fence, then the abort's own), so
        the fenced producer's EndTxn at ``e`` never passes for a retry of an EndTxn that
        moved the epoch to ``e + 1``."""
        r = self.record
        epoch = r.producer_epoch if self.has_failed_fence else min(r.producer_epoch + 2,
                                                                   MAX_EPOCH + 1)
        record = r.replace(producer_epoch=epoch, state=TxnState.PREPARE_ABORT,
                           last_update_ms=now_ms)
        return Step(record, ConcurrentTransactionsError(
            f"transactional id {r.transactional_id!r} had an open transaction, which is "
            "being aborted for the new producer; retry shortly"),
            r.producer_id, epoch, markers=True)

    # ------------------------------------------------------------------ partitions
    def _check_producer(self, producer_id: int, producer_epoch: int) -> Step | None:
        r = self.record
        if producer_id != r.producer_id:
            return _fail(InvalidProducerIdMappingError(
                f"producer {producer_id} does not hold transactional id "
                f"{r.transactional_id!r} (producer {r.producer_id} does): call "
                "init_transactions() again"))
        if producer_epoch != r.producer_epoch:
            return _fail(ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} was fenced by epoch "
                f"{r.producer_epoch} of transactional id {r.transactional_id!r}: another "
                "instance took over, or the coordinator aborted this transaction "
                "(transaction_timeout_ms); close this producer"))
        return None

    def add_partitions(self, producer_id: int, producer_epoch: int,
                       partitions: Iterable[Partition], now_ms: int,
                       tag: str | None = None) -> Step:
        """Partitions (a ``__consumer_offsets`` partition for AddOffsetsToTxn) join the
        producer's transaction, opening it if none is open (ONGOING persisted). Nothing
        is written when every partition is already in the open transaction."""
        if busy := self._busy():
            return busy
        if refused := self._check_producer(producer_id, producer_epoch):
            return refused
        r = self.record
        if r.state in _PREPARE:
            return _fail(ConcurrentTransactionsError(
                f"transactional id {r.transactional_id!r} is still completing its last "
                f"transaction ({r.state.label}); retry shortly"))
        wanted = frozenset(partitions)
        if r.state is TxnState.ONGOING and wanted <= r.partitions and \
                (tag is None or tag == r.tag):
            return Step(None, None, r.producer_id, r.producer_epoch)
        if r.state not in (TxnState.ONGOING, *_IDLE):
            raise AssertionError(f"AddPartitionsToTxn in state {r.state.label}")
        opening = r.state is not TxnState.ONGOING
        record = r.replace(state=TxnState.ONGOING, partitions=r.partitions | wanted,
                           start_ms=now_ms if opening else r.start_ms,
                           last_update_ms=now_ms,
                           tag=tag if tag is not None else (None if opening else r.tag))
        return Step(record, None, r.producer_id, r.producer_epoch)

    def verify(self, producer_id: int, producer_epoch: int,
               partitions: Iterable[Partition]) -> dict[Partition, StrataError | None]:
        """KIP-890 part 1, for a partition leader before the first transactional write
        of this producer: per partition, None when it is in the open transaction. Reads
        only (no pending check: it changes nothing)."""
        asked = list(partitions)
        r = self.record
        error: StrataError | None = None
        if producer_id != r.producer_id:
            error = InvalidProducerIdMappingError(
                f"producer {producer_id} does not hold transactional id "
                f"{r.transactional_id!r}")
        elif producer_epoch != r.producer_epoch:
            error = ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} is not the current epoch "
                f"{r.producer_epoch} of transactional id {r.transactional_id!r}")
        elif r.state in _PREPARE:
            error = ConcurrentTransactionsError(
                f"transactional id {r.transactional_id!r} is completing its transaction")
        if error is not None:
            return dict.fromkeys(asked, error)
        open_ = r.state is TxnState.ONGOING
        return {tp: None if open_ and tp in r.partitions else TransactionAbortableError(
            f"{tp[0]}-{tp[1]} was not added to the open transaction of "
            f"{r.transactional_id!r} (producer {producer_id} epoch {producer_epoch}): the "
            "write is refused; abort the transaction and retry it") for tp in asked}

    # ------------------------------------------------------------------ EndTxn
    def end_txn(self, producer_id: int, producer_epoch: int, commit: bool, now_ms: int,
                allocate: Callable[[], int], *, tv2: bool = True) -> Step:
        """The producer commits or aborts its open transaction: PREPARE_COMMIT or
        PREPARE_ABORT is persisted, answered, and the markers follow. With ``tv2`` the
        epoch is bumped here and the answer carries the producer id and epoch of the
        next transaction; a retry of an EndTxn that already went through gets the same
        answer again, the opposite request INVALID_TXN_STATE."""
        if busy := self._busy():
            return busy
        r = self.record
        result = "commit" if commit else "abort"
        if not tv2:
            return self._end_txn_v1(producer_id, producer_epoch, commit, now_ms)
        retry_on_bump = r.producer_epoch == producer_epoch + 1
        retry_on_overflow = (producer_id == r.previous_producer_id and
                             producer_epoch >= MAX_EPOCH and r.producer_epoch == 0)
        if producer_id != r.producer_id and not retry_on_overflow:
            return _fail(InvalidProducerIdMappingError(
                f"producer {producer_id} does not hold transactional id "
                f"{r.transactional_id!r} (producer {r.producer_id} does)"))
        current = producer_id == r.producer_id and producer_epoch == r.producer_epoch
        retry = (retry_on_bump and producer_id == r.producer_id) or retry_on_overflow
        if r.state in (TxnState.ONGOING, TxnState.EMPTY):
            valid = current
        elif r.state in _PREPARE:
            valid = retry
        else:
            valid = retry or current
        if not valid:
            return _fail(ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} cannot end a transaction "
                f"of {r.transactional_id!r}: epoch {r.producer_epoch} holds it (a newer "
                "instance, or an abort by the coordinator); close this producer"))
        if r.state is TxnState.ONGOING:
            return self._prepare_end(commit, now_ms, allocate)
        if r.state in _PREPARE:
            if (r.state is TxnState.PREPARE_COMMIT) == commit:
                return _fail(ConcurrentTransactionsError(
                    f"the {result} of {r.transactional_id!r} is already being completed; "
                    "retry shortly"))
            return _fail(self._wrong_end(result))
        # EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT
        if retry:
            if (r.state is TxnState.COMPLETE_COMMIT and commit) or \
                    (r.state is TxnState.COMPLETE_ABORT and not commit):
                return Step(None, None, r.producer_id, r.producer_epoch)  # answered again
            return _fail(self._wrong_end(result))
        if commit:
            return _fail(InvalidTxnStateError(
                f"transactional id {r.transactional_id!r} has no open transaction to "
                "commit: begin_transaction() and send first (an empty transaction needs "
                "no commit)"))
        # An abort with nothing open (the client could not know): bump the epoch anyway,
        # so producer id + epoch still name exactly one transaction.
        return self._prepare_end(False, now_ms, allocate)

    def _wrong_end(self, result: str) -> StrataError:
        r = self.record
        return InvalidTxnStateError(
            f"cannot {result} the transaction of {r.transactional_id!r}: it is "
            f"{r.state.label}; the producer's state is inconsistent, close it")

    def _prepare_end(self, commit: bool, now_ms: int, allocate: Callable[[], int]) -> Step:
        r = self.record
        pid, epoch = r.producer_id, r.producer_epoch + 1
        next_id = NO_PRODUCER_ID
        if r.producer_epoch >= MAX_EPOCH:
            next_id, epoch = allocate(), MAX_EPOCH + 1  # markers still fence (> MAX_EPOCH)
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        record = r.replace(producer_epoch=epoch, state=state, last_update_ms=now_ms,
                           next_producer_id=next_id,
                           start_ms=r.start_ms if r.state is TxnState.ONGOING else now_ms)
        # The answer: the next transaction's id and epoch.
        answer_id, answer_epoch = (next_id, 0) if next_id != NO_PRODUCER_ID else (pid, epoch)
        return Step(record, None, answer_id, answer_epoch, markers=bool(record.partitions))

    def _end_txn_v1(self, producer_id: int, producer_epoch: int, commit: bool,
                    now_ms: int) -> Step:
        """Kafka's rules before KIP-890 part 2 (no bump; the Kafka listener's older
        clients)."""
        if refused := self._check_producer(producer_id, producer_epoch):
            return refused
        r = self.record
        result = "commit" if commit else "abort"
        if r.state is TxnState.ONGOING:
            state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            record = r.replace(state=state, last_update_ms=now_ms)
            return Step(record, None, r.producer_id, r.producer_epoch,
                        markers=bool(record.partitions))
        if r.state in _PREPARE:
            if (r.state is TxnState.PREPARE_COMMIT) == commit:
                return _fail(ConcurrentTransactionsError(
                    f"the {result} of {r.transactional_id!r} is already being completed"))
            return _fail(self._wrong_end(result))
        if (r.state is TxnState.COMPLETE_COMMIT and commit) or \
                (r.state is TxnState.COMPLETE_ABORT and not commit):
            return Step(None, None, r.producer_id, r.producer_epoch)
        return _fail(self._wrong_end(result))

    # ------------------------------------------------------------------ completion
    def complete_txn(self, now_ms: int) -> TxnRecord:
        """Every marker of a PREPARE_* transaction is written: the COMPLETE_* record to
        persist (the open partitions are cleared; an overflowed epoch moves to the next
        producer id)."""
        r = self.record
        if r.state not in _PREPARE:
            raise AssertionError(f"complete_txn in state {r.state.label}")
        state = TxnState.COMPLETE_COMMIT if r.state is TxnState.PREPARE_COMMIT else \
            TxnState.COMPLETE_ABORT
        if r.next_producer_id != NO_PRODUCER_ID:
            return r.replace(state=state, partitions=frozenset(), last_update_ms=now_ms,
                             producer_id=r.next_producer_id, producer_epoch=0,
                             previous_producer_id=r.producer_id,
                             next_producer_id=NO_PRODUCER_ID)
        return r.replace(state=state, partitions=frozenset(), last_update_ms=now_ms)

    def timed_out(self, now_ms: int) -> bool:
        """An open transaction past its timeout (never a two-phase one)."""
        r = self.record
        return (self.pending is None and r.state is TxnState.ONGOING and not r.two_phase
                and r.start_ms >= 0 and now_ms > r.start_ms + r.timeout_ms)

    def abort_timed_out(self, now_ms: int) -> Step:
        """The coordinator aborts a transaction past its timeout, fencing its producer."""
        return self._fence(now_ms)

    def expired(self, now_ms: int, expiration_ms: int) -> bool:
        """Idle for ``transactional.id.expiration.ms``: the id may be forgotten."""
        r = self.record
        return (self.pending is None and r.state in _IDLE and
                r.last_update_ms <= now_ms - expiration_ms)


# ----------------------------------------------------------------------------- timeouts


def check_timeout(timeout_ms: int, max_timeout_ms: int) -> None:
    """INVALID_TRANSACTION_TIMEOUT outside ``1 .. transaction.max.timeout.ms``."""
    if not 0 < timeout_ms <= max_timeout_ms:
        raise InvalidTransactionTimeoutError(
            f"transaction timeout {timeout_ms} ms is outside 1 .. {max_timeout_ms} ms "
            "(the broker's transaction.max.timeout.ms): choose a smaller "
            "transaction_timeout_ms or raise the broker's limit")


# ----------------------------------------------------------------------------- records
#
# The transaction log (``__transaction_state``) is compacted on the key; values are JSON,
# like the group coordinator's records (docs/transactions.md gives the fields).


def encode_key(transactional_id: str) -> bytes:
    return json.dumps({"id": transactional_id, "type": "txn", "v": 1},
                      sort_keys=True, separators=(",", ":")).encode()


def encode_record(record: TxnRecord) -> bytes:
    return json.dumps({
        "producer_id": record.producer_id, "producer_epoch": record.producer_epoch,
        "timeout_ms": record.timeout_ms, "state": int(record.state),
        "partitions": sorted([t, p] for t, p in record.partitions),
        "start_ms": record.start_ms, "last_update_ms": record.last_update_ms,
        "previous_producer_id": record.previous_producer_id,
        "next_producer_id": record.next_producer_id, "two_phase": record.two_phase,
        "tag": record.tag,
    }, sort_keys=True, separators=(",", ":")).encode()


def decode_record(key: bytes, value: bytes | None) -> tuple[str, TxnRecord | None]:
    """``(transactional id, record)``; a tombstone gives ``None``. ``ValueError`` for a
    key or value this build cannot read."""
    k = json.loads(key)
    if k.get("type") != "txn" or k.get("v") != 1:
        raise ValueError(f"not a transaction log key: {key!r}")
    transactional_id = str(k["id"])
    if value is None:
        return transactional_id, None
    v = json.loads(value)
    return transactional_id, TxnRecord(
        transactional_id, int(v["producer_id"]), int(v["producer_epoch"]),
        int(v["timeout_ms"]), TxnState(int(v["state"])),
        frozenset((str(t), int(p)) for t, p in v["partitions"]), int(v["start_ms"]),
        int(v["last_update_ms"]), int(v["previous_producer_id"]),
        int(v["next_producer_id"]), bool(v["two_phase"]), v.get("tag"))

