"""A transactional producer's state, on the client side (Kafka's TransactionManager). No
I/O: the producer asks it what may happen next and tells it what the coordinator said.

States and where each may be reached from::

    UNINITIALIZED       (a new producer), READY, ABORTABLE_ERROR (to recover with a bump)
    INITIALIZING        UNINITIALIZED, ABORTING_TRANSACTION
    READY               INITIALIZING, COMMITTING_TRANSACTION, ABORTING_TRANSACTION
    IN_TRANSACTION      READY
    COMMITTING          IN_TRANSACTION
    ABORTING            IN_TRANSACTION, ABORTABLE_ERROR
    ABORTABLE_ERROR     IN_TRANSACTION, COMMITTING, ABORTABLE_ERROR, INITIALIZING
    FATAL_ERROR         any

What the application sees (docs/transactions.md, "Errors"):

* ``AbortableTransactionError``: the transaction cannot commit (a write failed, a
  partition leader refused it, a timeout inside it, ``TRANSACTION_ABORTABLE``) but the
  producer is fine: call ``abort_transaction()`` and run the transaction again.
* ``FatalTransactionError``: the producer is done (``PRODUCER_FENCED`` or
  ``INVALID_PRODUCER_EPOCH``: another instance with the transactional id took over, or
  the coordinator aborted this transaction after ``transaction_timeout_ms``;
  ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``; ``INVALID_TXN_STATE``;
  ``INVALID_PRODUCER_ID_MAPPING``): close it; a new producer with the same id fences
  whatever is left.
* ``TransactionStateError``: the call does not fit the state (``commit_transaction``
  with no ``begin_transaction``, a send outside a transaction, ...): a bug in the
  calling code; nothing was sent.

Both error types keep the broker's error as ``cause`` (and ``__cause__``).

Thread-safety: none; the producer's event loop owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar, Final

from strata.client._common import TopicPartition, error_from_code
from strata.client._group import CoordinatorLink
from wire.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
    RequestTimedOutError,
    StrataError,
    TransactionalIdAuthorizationFailedError,
    UnknownProducerIdError,
)
from wire.protocol import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    ApiKey,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    Message,
    TxnOffsetCommitPartition,
    TxnOffsetCommitRequest,
    TxnOffsetCommitTopic,
    TxnTopic,
)

if TYPE_CHECKING:
    from strata.client._sender import Sender

__all__ = [
    "AbortableTransactionError",
    "FatalTransactionError",
    "GroupMetadata",
    "TransactionManager",
    "Transactions",
    "TransactionStateError",
    "TxnClientState",
    "classify",
]


class TxnClientState(Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


S = TxnClientState
_ALLOWED: Final = {
    S.UNINITIALIZED: {S.READY, S.ABORTABLE_ERROR},
    S.INITIALIZING: {S.UNINITIALIZED, S.ABORTING},
    S.READY: {S.INITIALIZING, S.COMMITTING, S.ABORTING},
    S.IN_TRANSACTION: {S.READY},
    S.COMMITTING: {S.IN_TRANSACTION},
    S.ABORTING: {S.IN_TRANSACTION, S.ABORTABLE_ERROR},
    S.ABORTABLE_ERROR: {S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR, S.INITIALIZING},
    S.FATAL_ERROR: set(S),
}


class _TransactionError(StrataError):
    """Carries the broker's (or client's) error that caused it as ``cause``."""

    def __init__(self, message: str, cause: StrataError | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.__cause__ = cause


class AbortableTransactionError(_TransactionError):
    """The open transaction cannot commit; the producer is still usable: call
    ``abort_transaction()`` and run the transaction again. ``cause`` is why."""

    code: ClassVar[int] = 1310
    name: ClassVar[str] = "ABORTABLE_TRANSACTION_ERROR"


class FatalTransactionError(_TransactionError):
    """This producer can do nothing more (fenced by a newer instance with its
    transactional id, not authorized, or its state is inconsistent): close it. ``cause``
    is why."""

    code: ClassVar[int] = 1311
    name: ClassVar[str] = "FATAL_TRANSACTION_ERROR"


class TransactionStateError(StrataError):
    """A transactional call that does not fit the producer's state (e.g. commit with no
    transaction begun, a send outside a transaction): fix the calling code; nothing was
    sent."""

    code: ClassVar[int] = 1312
    name: ClassVar[str] = "TRANSACTION_STATE_ERROR"


#: Errors that end the producer (Kafka 4.x's classification).
_FATAL: Final = (ProducerFencedError, InvalidProducerEpochError,
                 TransactionalIdAuthorizationFailedError, InvalidTxnStateError,
                 InvalidProducerIdMappingError)
#: Errors that mean "find the coordinator again, then resend".
COORDINATOR_MOVED: Final = (NotCoordinatorError, CoordinatorNotAvailableError,
                            CoordinatorLoadInProgressError)


def classify(error: StrataError) -> str:
    """``"fatal"``, ``"retry"`` (resend, after finding the coordinator again for
    ``COORDINATOR_MOVED``) or ``"abortable"``. A partition leader's
    INVALID_PRODUCER_EPOCH on a write is abortable in Kafka since 2.7; the producer
    passes such write failures to ``write_failed``, not here."""
    if isinstance(error, _FATAL):
        return "fatal"
    if isinstance(error, ConcurrentTransactionsError | UnknownProducerIdError) or \
            error.retriable or isinstance(error, COORDINATOR_MOVED):
        return "retry"
    return "abortable"


class TransactionManager:
    """The client side of one transactional id (see the module docstring)."""

    def __init__(self, transactional_id: str, timeout_ms: int) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.state = S.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.error: StrataError | None = None  # what put it in an error state
        #: Partitions the coordinator has added to the open transaction.
        self.partitions: set[tuple[str, int]] = set()
        #: Partitions written to but not yet added (AddPartitionsToTxn goes first).
        self.new_partitions: set[tuple[str, int]] = set()
        #: Groups whose offsets were sent to the open transaction.
        self.groups: set[str] = set()
        #: The open transaction was handed back by the coordinator (two-phase).
        self.resumed = False

    def __repr__(self) -> str:
        return (f"TransactionManager({self.transactional_id!r}, {self.state.value}, "
                f"producer {self.producer_id} epoch {self.producer_epoch})")

    # ------------------------------------------------------------------ transitions
    def _to(self, state: TxnClientState) -> None:
        if self.state not in _ALLOWED[state]:
            raise TransactionStateError(self._misuse(state))
        self.state = state

    def _misuse(self, target: TxnClientState) -> str:
        if self.state is S.FATAL_ERROR:
            return (f"the producer of transactional id {self.transactional_id!r} hit a "
                    f"fatal error ({self.error}); close it and create a new one")
        if self.state is S.ABORTABLE_ERROR:
            return (f"the transaction of {self.transactional_id!r} failed ({self.error}); "
                    "call abort_transaction(), then begin a new one")
        hints = {
            S.INITIALIZING: "init_transactions() was already called",
            S.IN_TRANSACTION: "begin_transaction() needs init_transactions() first and "
                              "no transaction open (commit or abort the open one)",
            S.COMMITTING: "commit_transaction() needs an open transaction "
                          "(begin_transaction())",
            S.ABORTING: "abort_transaction() needs an open transaction",
        }
        return (f"transactional id {self.transactional_id!r} is {self.state.value}: "
                f"{hints.get(target, 'this call does not fit')}")

    def begin_init(self) -> None:
        self._to(S.INITIALIZING)

    def initialized(self, producer_id: int, producer_epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.partitions.clear()
        self.new_partitions.clear()
        self.groups.clear()
        self._to(S.READY)

    def begin(self) -> None:
        self._to(S.IN_TRANSACTION)

    def require_open(self, what: str) -> None:
        """A send (or offsets) needs an open transaction."""
        if self.state is S.IN_TRANSACTION:
            return
        if self.state in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
            raise (AbortableTransactionError if self.state is S.ABORTABLE_ERROR else
                   FatalTransactionError)(self._misuse(S.IN_TRANSACTION), self.error)
        raise TransactionStateError(
            f"{what} on transactional producer {self.transactional_id!r} needs an open "
            f"transaction: call begin_transaction() first (it is {self.state.value})")

    def wrote(self, partitions: Iterable[tuple[str, int]]) -> None:
        """The application sent to these partitions: add those not in the transaction."""
        self.new_partitions.update(tp for tp in partitions if tp not in self.partitions)

    def added(self, partitions: Iterable[tuple[str, int]]) -> None:
        done = set(partitions)
        self.partitions |= done
        self.new_partitions -= done

    def begin_commit(self) -> None:
        self._to(S.COMMITTING)

    def begin_abort(self) -> None:
        self._to(S.ABORTING)

    @property
    def failed(self) -> bool:
        """In an error state (the open transaction cannot commit)."""
        return self.state in (S.ABORTABLE_ERROR, S.FATAL_ERROR)

    @property
    def started(self) -> bool:
        """Whether the coordinator knows of the open transaction (an EndTxn is needed):
        a transaction that wrote nothing and sent no offsets ends locally."""
        return bool(self.partitions or self.groups or self.resumed)

    def completed(self, producer_id: int, producer_epoch: int) -> None:
        """EndTxn answered: the next transaction uses this id and epoch (KIP-890)."""
        if producer_id >= 0:
            self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.partitions.clear()
        self.new_partitions.clear()
        self.groups.clear()
        self.resumed = False
        self.error = None
        self._to(S.READY)

    def fail(self, error: StrataError, *, fatal: bool | None = None) -> StrataError:
        """Move to an error state for ``error`` (``fatal`` None: as ``classify`` says)
        and return the exception to raise."""
        is_fatal = classify(error) == "fatal" if fatal is None else fatal
        self.error = error
        if is_fatal or self.state is S.FATAL_ERROR:
            self.state = S.FATAL_ERROR
            return FatalTransactionError(
                f"transactional producer {self.transactional_id!r} cannot go on: "
                f"{error}. Close it (a new producer with the same transactional id "
                "fences anything left of this one)", error)
        if self.state in (S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR,
                          S.INITIALIZING):
            self.state = S.ABORTABLE_ERROR
        return AbortableTransactionError(
            f"the transaction of {self.transactional_id!r} cannot commit: {error}. Call "
            "abort_transaction() and run it again", error)

    def write_failed(self, error: StrataError) -> StrataError:
        """A transactional write was refused by a partition leader: abortable unless
        the producer itself is finished (Kafka since 2.7: INVALID_PRODUCER_EPOCH from a
        leader is abortable, PRODUCER_FENCED from the coordinator fatal)."""
        fatal = isinstance(error, ProducerFencedError |
                           TransactionalIdAuthorizationFailedError)
        return self.fail(error, fatal=fatal)


# ----------------------------------------------------------------------------- I/O


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """What a consumer in a group tells a transactional producer committing its offsets
    (``Consumer.group_metadata()``, Kafka's ConsumerGroupMetadata): the coordinator
    refuses the offsets of a member that is no longer in the group (KIP-447)."""

    group_id: str
    member_id: str | None = None
    member_epoch: int = -1
    group_instance_id: str | None = None


#: First pause before an AddPartitionsToTxn the coordinator answered with
#: CONCURRENT_TRANSACTIONS (the previous transaction is still completing), as Kafka.
_ADD_RETRY_BACKOFF_S: Final = 0.02


class Transactions:
    """The transactional producer's requests to its coordinator, over the sender.

    ``ready`` is the accumulator's hook (see ``Sender``): a partition not yet in the open
    transaction holds its batches back until an AddPartitionsToTxn (one for every new
    partition at that moment) added it. ``init``, ``send_offsets``, ``commit`` and
    ``abort`` are the producer's calls. Loop only."""

    def __init__(self, sender: Sender) -> None:
        config = sender.config
        assert config.transactional_id is not None
        self.sender = sender
        self.config = config
        self.tm = TransactionManager(config.transactional_id, config.transaction_timeout_ms)
        self.link = CoordinatorLink(sender.cluster, config.transactional_id,
                                    request_timeout_ms=config.request_timeout_ms,
                                    retry_backoff_ms=config.retry_backoff_ms, key_type=1)
        self._add_task: asyncio.Task[None] | None = None
        self.init_state = ""  # the coordinator's word on an open transaction (two-phase)
        self.init_tag: str | None = None

    # ------------------------------------------------------------------ requests
    async def _call(self, api: ApiKey, body: Message, *, deadline: float,
                    check: Callable[[Message], StrataError | None], version: int = 0,
                    backoff_s: float | None = None) -> Message:
        """A request to the coordinator: CONCURRENT_TRANSACTIONS, a moved coordinator
        and other transient errors are retried until ``deadline``; anything else is
        raised."""
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"transactional id {self.tm.transactional_id!r}: {api.name} did not "
                    f"succeed within max_block_ms={self.config.max_block_ms}")
            try:
                answer = await self.link.request(api, body, timeout_s=remaining,
                                                 check=check, version=version)
                return answer
            except StrataError as err:
                if classify(err) != "retry":
                    raise
                if isinstance(err, COORDINATOR_MOVED):
                    self.link.invalidate()
                pause = backoff_s if backoff_s is not None and attempt == 0 else \
                    self.config.backoff_s(attempt + 1)
                attempt += 1
                await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))

    def _deadline(self) -> float:
        return time.monotonic() + self.config.max_block_ms / 1000

    # ------------------------------------------------------------------ init
    async def init(self, *, two_phase: bool = False, keep_prepared: bool = False) -> None:
        """InitProducerId: fences every earlier producer with this transactional id and
        aborts its open transaction (unless ``keep_prepared`` hands a two-phase one
        back)."""
        self.tm.begin_init()
        request = InitProducerIdRequest(
            self.tm.transactional_id, self.config.transaction_timeout_ms,
            two_phase=two_phase, keep_prepared=keep_prepared)
        try:
            answer = await self._call(ApiKey.INIT_PRODUCER_ID, request,
                                      deadline=self._deadline(), check=_top_error,
                                      version=1)
        except StrataError as err:
            raise self.tm.fail(err, fatal=True) from err
        assert isinstance(answer, InitProducerIdResponse)
        self.init_state, self.init_tag = answer.state, answer.tag
        self.tm.initialized(answer.producer_id, answer.producer_epoch)
        self.sender.use_producer_id(answer.producer_id, answer.producer_epoch)
        if keep_prepared and answer.state == "Ongoing":
            # A two-phase transaction handed back: it is this producer's to end.
            self.tm.begin()
            self.tm.resumed = True

    # ------------------------------------------------------------------ partitions
    def ready(self, key: tuple[str, int]) -> bool:
        """The accumulator's hook: may partition ``key`` send a new batch now?"""
        tm = self.tm
        if tm.state not in (TxnClientState.IN_TRANSACTION, TxnClientState.COMMITTING):
            return False  # an error state: abort fails what is queued
        if key in tm.partitions:
            return True
        tm.new_partitions.add(key)
        if self._add_task is None or self._add_task.done():
            self._add_task = self.sender.loop.create_task(self._add_partitions())
        return False

    async def _add_partitions(self, tag: str | None = None) -> None:
        tm = self.tm
        while tm.new_partitions and tm.state in (TxnClientState.IN_TRANSACTION,
                                                 TxnClientState.COMMITTING):
            adding = sorted(tm.new_partitions)
            topics: dict[str, list[int]] = {}
            for topic, p in adding:
                topics.setdefault(topic, []).append(p)
            request = AddPartitionsToTxnRequest(
                tm.transactional_id, tm.producer_id, tm.producer_epoch,
                [TxnTopic(t, ps) for t, ps in topics.items()], tag=tag)
            try:
                await self._call(ApiKey.ADD_PARTITIONS_TO_TXN, request,
                                 deadline=self._deadline(), check=_partitions_error,
                                 backoff_s=_ADD_RETRY_BACKOFF_S)
            except StrataError as err:
                tm.fail(err)
                self.sender.fail_transaction_batches(tm.error or err)
                break
            tm.added(adding)
            self.sender.wakeup.set()

    async def add_partitions_now(self, partitions: list[tuple[str, int]],
                                 tag: str | None = None) -> None:
        """Add partitions before writing (the Spark sink's staged commit; ``tag`` labels
        the transaction)."""
        self.tm.require_open("add_partitions")
        self.tm.new_partitions.update(p for p in partitions if p not in self.tm.partitions)
        if not self.tm.new_partitions and tag is None:
            return
        if tag is not None and not self.tm.new_partitions:
            self.tm.new_partitions.update(partitions)  # the tag travels with an add
        await self._add_partitions(tag)
        if self.tm.state is TxnClientState.ABORTABLE_ERROR:
            raise AbortableTransactionError(
                f"the partitions could not join the transaction: {self.tm.error}",
                self.tm.error)

    # ------------------------------------------------------------------ offsets
    async def send_offsets(self, offsets: Mapping[TopicPartition, int],
                           group: GroupMetadata) -> None:
        """Commit a consumer group's offsets as part of the open transaction (KIP-447)."""
        tm = self.tm
        tm.require_open("send_offsets_to_transaction()")
        if not offsets:
            return
        deadline = self._deadline()
        try:
            if group.group_id not in tm.groups:
                await self._call(ApiKey.ADD_OFFSETS_TO_TXN, AddOffsetsToTxnRequest(
                    tm.transactional_id, tm.producer_id, tm.producer_epoch, group.group_id),
                    deadline=deadline, check=_top_error, backoff_s=_ADD_RETRY_BACKOFF_S)
                tm.groups.add(group.group_id)
            by_topic: dict[str, list[TxnOffsetCommitPartition]] = {}
            for tp, offset in sorted(offsets.items()):
                by_topic.setdefault(tp.topic, []).append(
                    TxnOffsetCommitPartition(tp.partition, offset))
            group_link = CoordinatorLink(self.sender.cluster, group.group_id,
                                         request_timeout_ms=self.config.request_timeout_ms,
                                         retry_backoff_ms=self.config.retry_backoff_ms)
            await self._call_group(group_link, TxnOffsetCommitRequest(
                tm.transactional_id, group.group_id, tm.producer_id, tm.producer_epoch,
                group.member_id, group.member_epoch, group.group_instance_id,
                [TxnOffsetCommitTopic(t, ps) for t, ps in by_topic.items()]), deadline)
        except StrataError as err:
            raise tm.fail(err) from err

    async def _call_group(self, link: CoordinatorLink, request: TxnOffsetCommitRequest,
                          deadline: float) -> None:
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError("TxnOffsetCommit did not succeed in time")
            try:
                await link.request(ApiKey.TXN_OFFSET_COMMIT, request, timeout_s=remaining,
                                   check=_partitions_error)
                return
            except StrataError as err:
                if classify(err) != "retry":
                    raise
                attempt += 1
                await asyncio.sleep(self.config.backoff_s(attempt))

    # ------------------------------------------------------------------ end
    async def commit(self) -> None:
        tm = self.tm
        if tm.state is TxnClientState.ABORTABLE_ERROR:
            raise AbortableTransactionError(
                f"the transaction of {tm.transactional_id!r} cannot commit: {tm.error}. "
                "Call abort_transaction() and run it again", tm.error)
        tm.begin_commit()
        await self.sender.flush(report=False)  # every batch acknowledged, or failed
        if self._add_task is not None:
            await asyncio.shield(self._add_task)
        if tm.failed:
            raise AbortableTransactionError(
                f"the transaction of {tm.transactional_id!r} cannot commit: {tm.error}. "
                "Call abort_transaction() and run it again", tm.error)
        await self._end(True)

    async def abort(self) -> None:
        tm = self.tm
        tm.begin_abort()
        # An AddPartitionsToTxn still being retried belongs to this transaction: were it
        # left running it would reach the coordinator after the EndTxn, with this
        # transaction's epoch, and be fenced (a fatal error for the next one).
        adding, self._add_task = self._add_task, None
        if adding is not None and not adding.done():
            adding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await adding
        # What was sent must be decided before the abort: wait for the requests in
        # flight; what was never sent is dropped.
        self.sender.fail_unsent(AbortableTransactionError(
            f"the transaction of {tm.transactional_id!r} was aborted before these records "
            "were sent"))
        await self.sender.flush(report=False)
        await self._end(False)

    async def _end(self, commit: bool) -> None:
        tm = self.tm
        if not tm.started:
            tm.completed(-1, -1)  # nothing reached the coordinator: nothing to end
            return
        try:
            answer = await self._call(ApiKey.END_TXN, EndTxnRequest(
                tm.transactional_id, tm.producer_id, tm.producer_epoch, commit),
                deadline=self._deadline(), check=_top_error)
        except StrataError as err:
            if classify(err) == "fatal":
                raise tm.fail(err) from err
            # Unknown outcome (a timeout): the coordinator may or may not have taken it.
            raise tm.fail(err, fatal=commit) from err
        assert isinstance(answer, EndTxnResponse)
        tm.completed(answer.producer_id, answer.producer_epoch)
        self.sender.use_producer_id(tm.producer_id, tm.producer_epoch)

    def batch_failed(self, error: StrataError) -> None:
        """A batch of the open transaction failed for good: the transaction cannot
        commit (abortable, or fatal for PRODUCER_FENCED)."""
        if self.tm.state in (TxnClientState.IN_TRANSACTION, TxnClientState.COMMITTING,
                             TxnClientState.ABORTABLE_ERROR):
            self.tm.write_failed(error)


def _top_error(response: Message) -> StrataError | None:
    code = getattr(response, "error_code", 0)
    return error_from_code(code, getattr(response, "error_message", None)) if code else None


def _partitions_error(response: Message) -> StrataError | None:
    """The first partition error of an AddPartitionsToTxn / TxnOffsetCommit answer."""
    for topic in getattr(response, "topics", []):
        for result in topic.partitions:
            if result.error_code:
                return error_from_code(result.error_code, result.error_message)
    return None
