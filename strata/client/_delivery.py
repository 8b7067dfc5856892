"""What the producer hands back: delivery results, its own errors, and their futures.

Job: the outcome side of ``send`` / ``produce`` / ``send_batch``: ``RecordMetadata``
and ``BatchMetadata``, the client-side errors (``BufferFullError`` 1000,
``ProducerClosedError`` 1001, ``DeliveryTimeoutError`` 1002, ``DeliveryFailedError``
1003 with its ``DeliveryFailure`` entries; never sent on the wire, so they sit above
every broker code), and the plumbing that completes the futures and callbacks carrying
them (``resolve`` / ``reject``, ``DeliveryFuture`` with ``complete_sync``,
``call_back`` for ``on_delivery``, and ``SendBatchGroup``, the one future of a
``send_batch`` call).

Invariants:

- A future is completed at most once; completing one its owner cancelled meanwhile is a
  no-op.
- The ``DeliveryFuture``s of one batch share one condition and are completed together
  (``complete_sync``): every state is set before the single notify, so no waiter wakes
  before its own result is in. They refuse ``cancel()``: a record handed to the producer
  cannot be taken back (as in Kafka), which also rules out the only other notifier of
  the shared condition.
- A ``SendBatchGroup`` resolves once it is sealed (every batch of the call queued) and
  every batch was acknowledged, in send order; it fails with the first failure.

Thread-safety: the producer completes futures on its event loop (asyncio futures must be)
and never while it holds a lock of its own, so a done-callback may call ``send``;
``complete_sync`` takes the batch's shared condition. ``SendBatchGroup.expected`` grows
in the caller's thread under the accumulator's lock; everything else of a group changes
on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final, NamedTuple, TypeAlias

from wire.errors import StrataError

__all__ = [
    "AnyFuture",
    "BatchMetadata",
    "BufferFullError",
    "DeliveryCallback",
    "DeliveryFailedError",
    "DeliveryFailure",
    "DeliveryFuture",
    "DeliveryTimeoutError",
    "ProducerClosedError",
    "RecordMetadata",
    "SendBatchGroup",
    "call_back",
    "complete_sync",
    "reject",
    "resolve",
]

log = logging.getLogger("strata.client.producer")


# --------------------------------------------------------------------------- errors


class BufferFullError(StrataError):
    """The producer's ``buffer_memory`` is full of records not yet acknowledged.

    Raised by ``send`` with ``on_buffer_full="raise"``, or after ``max_block_ms`` with
    ``"block"``. Retriable: the buffer drains as the brokers acknowledge. For
    ``send_batch``, ``records_accepted`` records at the front of the input were queued
    before the buffer filled (they will be delivered; ``accepted`` is their future).
    """

    code: ClassVar[int] = 1000
    name: ClassVar[str] = "BUFFER_FULL"
    retriable: ClassVar[bool] = True

    def __init__(self, message: str, *, records_accepted: int = 0,
                 accepted: Any = None) -> None:
        super().__init__(message)
        self.records_accepted = records_accepted
        self.accepted = accepted


class DeliveryFailedError(StrataError):
    """Records handed to ``produce`` without an ``on_delivery`` callback were not delivered.

    ``produce`` returns no future, so its failures are kept until someone can hear them:
    the next ``flush`` or ``close`` raises this once for every failure since the last
    report. ``failures`` lists them per batch (``DeliveryFailure``: topic, partition,
    record count, the error); ``records`` is their total. The records are not retried
    further; send them again if they must arrive.
    """

    code: ClassVar[int] = 1003
    name: ClassVar[str] = "DELIVERY_FAILED"

    def __init__(self, failures: Sequence[DeliveryFailure]) -> None:
        self.failures = list(failures)
        self.records = sum(f.records for f in self.failures)
        first = self.failures[0] if self.failures else None
        detail = f"; first: {first.topic}-{first.partition}: {first.error}" if first else ""
        super().__init__(
            f"{self.records} record(s) given to produce() in {len(self.failures)} batch(es) "
            f"were not delivered{detail}; .failures has each batch's error; send them "
            "again, or pass on_delivery= to handle failures record by record")


class ProducerClosedError(StrataError):
    """The producer was closed: ``send`` after ``close``, or records still unsent when
    ``close(timeout)`` gave up."""

    code: ClassVar[int] = 1001
    name: ClassVar[str] = "PRODUCER_CLOSED"


class DeliveryTimeoutError(StrataError):
    """A batch was not acknowledged within ``delivery_timeout_ms`` of its creation.

    The broker may or may not have written it (``last_error`` says what the last attempt
    saw); raise ``delivery_timeout_ms`` if brokers can be away that long.
    """

    code: ClassVar[int] = 1002
    name: ClassVar[str] = "DELIVERY_TIMEOUT"
    retriable: ClassVar[bool] = True

    def __init__(self, message: str, last_error: StrataError | None = None) -> None:
        super().__init__(message)
        self.last_error = last_error


# --------------------------------------------------------------------------- results


class RecordMetadata(NamedTuple):
    """Where a record was written. ``offset`` is -1 with ``acks=0``."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class DeliveryFailure(NamedTuple):
    """One failed batch of ``produce`` records that had no ``on_delivery`` callback."""

    topic: str
    partition: int
    records: int
    error: StrataError


class BatchMetadata(NamedTuple):
    """One wire batch written by ``send_batch``: offsets ``base_offset ..
    base_offset + record_count - 1`` (``base_offset`` -1 with ``acks=0``).
    ``log_append_time`` is -1 unless the topic uses ``LogAppendTime``."""

    topic: str
    partition: int
    base_offset: int
    record_count: int
    log_append_time: int

    @property
    def offsets(self) -> range:
        return range(self.base_offset, self.base_offset + self.record_count)


# --------------------------------------------------------------------------- futures

AnyFuture: TypeAlias = "asyncio.Future[Any] | concurrent.futures.Future[Any]"
#: ``produce``'s ``on_delivery(metadata, error)``: exactly one of the two is ``None``.
DeliveryCallback: TypeAlias = Callable[["RecordMetadata | None", "StrataError | None"], object]
_STATE_ERRORS: Final = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


def resolve(future: AnyFuture, result: Any) -> None:
    try:  # (try/except, not contextlib.suppress: this runs once per record)
        if not future.done():
            future.set_result(result)
    except _STATE_ERRORS:  # cancelled by its owner meanwhile
        pass


def reject(future: AnyFuture, error: BaseException) -> None:
    try:
        if not future.done():
            future.set_exception(error)
    except _STATE_ERRORS:
        pass


# States of ``concurrent.futures.Future`` (``concurrent.futures._base``).
_PENDING: Final = "PENDING"
_FINISHED: Final = "FINISHED"


#: A ``DeliveryFuture``'s condition until its record joins a batch (never waited on: the
#: future is returned only after the append bound it).
_UNBOUND: Final = threading.Condition()


class DeliveryFuture(concurrent.futures.Future[Any]):
    """A ``concurrent.futures.Future`` that shares one condition with its whole batch.

    Why: a stock ``Future()`` allocates its own ``Condition`` and ``RLock`` (about
    1.6 us, a third of what a sync ``send`` costs), and completing it costs another
    2 us of locking and notifying. The records of a batch complete together, so
    ``complete_sync`` sets every state under the shared condition and notifies once.
    """

    def __init__(self) -> None:
        # Deliberately not Future.__init__: the same fields, but the condition is the
        # batch's, bound when the record is appended (``Accumulator._watch``).
        self._condition: threading.Condition = _UNBOUND
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks: list[Callable[[concurrent.futures.Future[Any]], object]] = []

    def cancel(self) -> bool:
        return False


def complete_sync(condition: threading.Condition, futures: Sequence[DeliveryFuture],
                  results: Sequence[Any] | None, error: BaseException | None) -> None:
    """Finish the ``DeliveryFuture``s of one batch: all states first, one notify."""
    done: list[DeliveryFuture] = []
    with condition:
        for i, future in enumerate(futures):
            if future._state != _PENDING:
                continue
            if results is not None:
                future._result = results[i]
            else:
                future._exception = error
            future._state = _FINISHED
            for waiter in future._waiters:
                if results is not None:
                    waiter.add_result(future)
                else:
                    waiter.add_exception(future)
            done.append(future)
        condition.notify_all()
    for future in done:
        for callback in future._done_callbacks:
            try:
                callback(future)
            except Exception:
                log.exception("exception calling callback for %r", future)


def call_back(callback: DeliveryCallback, metadata: RecordMetadata | None,
              error: StrataError | None) -> None:
    """Run one ``on_delivery`` callback; its exceptions are logged, never propagated (the
    producer's loop must go on settling the other records)."""
    try:
        callback(metadata, error)
    except Exception:
        log.exception("exception in on_delivery callback %r", callback)


class SendBatchGroup:
    """The one future of a ``send_batch`` call, fed by the completions of its batches."""

    __slots__ = ("completed", "expected", "failed", "future", "parts", "sealed")

    def __init__(self, future: AnyFuture) -> None:
        self.future = future
        self.parts: list[BatchMetadata | None] = []
        self.expected = 0  # batches queued (grows in the caller's thread, lock held)
        self.completed = 0  # batches acknowledged (loop thread)
        self.sealed = False  # every batch of the call is queued (set on the loop)
        self.failed = False

    def maybe_finish(self) -> None:
        if self.sealed and not self.failed and self.completed == self.expected:
            resolve(self.future, [p for p in self.parts if p is not None])
