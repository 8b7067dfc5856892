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

from collections.abc import Iterable
from enum import Enum
from typing import ClassVar, Final

from strata.client._common import TopicPartition
from wire.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
    StrataError,
    TransactionalIdAuthorizationFailedError,
    UnknownProducerIdError,
)

__all__ = [
    "AbortableTransactionError",
    "FatalTransactionError",
    "TransactionManager",
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
        self.partitions: set[TopicPartition] = set()
        #: Partitions written to but not yet added (AddPartitionsToTxn goes first).
        self.new_partitions: set[TopicPartition] = set()
        #: Groups whose offsets were sent to the open transaction.
        self.groups: set[str] = set()

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

    def wrote(self, partitions: Iterable[TopicPartition]) -> None:
        """The application sent to these partitions: add those not in the transaction."""
        self.new_partitions.update(tp for tp in partitions if tp not in self.partitions)

    def added(self, partitions: Iterable[TopicPartition]) -> None:
        done = set(partitions)
        self.partitions |= done
        self.new_partitions -= done

    def begin_commit(self) -> None:
        self._to(S.COMMITTING)

    def begin_abort(self) -> None:
        self._to(S.ABORTING)

    @property
    def started(self) -> bool:
        """Whether the coordinator knows of the open transaction (an EndTxn is needed):
        a transaction that wrote nothing and sent no offsets ends locally."""
        return bool(self.partitions or self.groups)

    def completed(self, producer_id: int, producer_epoch: int) -> None:
        """EndTxn answered: the next transaction uses this id and epoch (KIP-890)."""
        if producer_id >= 0:
            self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.partitions.clear()
        self.new_partitions.clear()
        self.groups.clear()
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
