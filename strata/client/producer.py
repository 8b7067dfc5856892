"""The Strata producer: batching, partitioning, idempotent retries, back-pressure.

Two faces over one engine:

- ``AsyncProducer`` for asyncio code: ``fut = await producer.send(...)`` returns an
  ``asyncio.Future`` that resolves to a ``RecordMetadata``.
- ``Producer`` for plain threads: ``fut = producer.send(...)`` returns a
  ``concurrent.futures.Future``; the engine runs on a private event loop thread
  (``EventLoopThread``). ``send`` appends to the batch in the caller's thread under a
  lock and wakes the loop only when a batch is created or filled, so a record costs
  no thread hop.

How a record travels
    ``send`` picks a partition (``wire.partitioner``: Kafka's murmur2 of the
    key, sticky partitioning for null keys) and appends the record to that partition's
    *open batch*: plain Python lists of keys, values, timestamps and headers. The batch
    is closed when it reaches ``batch_size`` or ``linger_ms`` after its first record (or
    at once on ``flush``/``close``). The sender task encodes a closed batch into one
    Arrow record batch (``build_batch``) when it first sends it, so each batch pays
    the columnar encoding once, not per record; batches of partitions led by the same
    broker go out in one ``ProduceRequest``.

``batch_size`` is in bytes (like Kafka's ``batch.size``): the sum over the records of
``len(key) + len(value) + len(header keys and values) + 16`` (16 approximates the Arrow
offsets, timestamp and validity bits of a row). A record larger than ``batch_size``
travels alone in its own batch. ``buffer_memory`` bounds the same estimate over every
record that is not yet acknowledged; when it is full, ``send`` blocks (up to
``max_block_ms``) or raises ``BufferFullError`` (``on_buffer_full="raise"``).

Ordering and in-flight policy
    At most ONE batch per partition is in flight at any time; the next batch of that
    partition keeps filling meanwhile. A failed batch stays at the head of its
    partition's queue and is retried (same bytes) before anything behind it is sent,
    so per-partition order holds under any pattern of retries, with or without
    idempotence. ``max_in_flight`` bounds the produce requests outstanding per broker
    (each may carry batches of many partitions), which is where the parallelism comes
    from.

Idempotence (on by default, as in Kafka 3+)
    The producer gets a producer id with ``InitProducerId`` and numbers the records of
    each partition from 0. A sequence is assigned when a batch is first sent, and a
    retry resends the *same encoded bytes* (same sequence), so a broker that already
    wrote the batch (its response was lost) acknowledges it with its original offset
    instead of writing it twice. Idempotence requires ``acks="all"``: asking for it
    explicitly with acks 0/1 is a ``ValueError``; when it is left at its default and
    acks is 0/1 (or ``retries=0``) it is turned off, as Kafka does.

    When a batch whose sequence was assigned fails for good (non-retriable error,
    retries or ``delivery_timeout_ms`` exhausted), nobody knows whether the broker wrote
    it, so the partition switches to a fresh producer id (sequence 0) before sending the
    next batch. ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (the broker lost a batch it had
    acknowledged) fails every pending batch of that partition with
    ``OutOfOrderSequenceError`` and the partition also restarts with a fresh id.

Retries
    Retriable errors (``NOT_LEADER_OR_FOLLOWER``, ``NETWORK_EXCEPTION``, connection loss,
    ``REQUEST_TIMED_OUT``, ``NOT_ENOUGH_REPLICAS``, ``UNKNOWN_TOPIC_OR_PARTITION``...)
    refresh the metadata and retry after ``retry_backoff_ms`` (doubling up to 1 s) for as
    long as ``retries`` and ``delivery_timeout_ms`` (counted from the batch's creation)
    allow. Other errors fail the batch's futures with the typed error from
    ``wire.errors`` (``RecordTooLargeError``, ``InvalidRecordBatchError``...).

Delivery results
    A record handed to ``send`` cannot be recalled (it may already be on the wire):
    the sync face's futures refuse ``cancel()``; cancelling an asyncio future only
    stops the caller from waiting for it.
    ``RecordMetadata(topic, partition, offset, timestamp)``: ``offset`` is the batch's
    base offset plus the record's index in the batch; ``timestamp`` is the record's
    create time, or the broker's log-append time for ``LogAppendTime`` topics. With
    ``acks=0`` nothing comes back and ``offset`` is -1. A duplicate acknowledged by the
    broker (a retry after a lost response) carries its original offset; the broker does
    not return the log-append time of a duplicate, so such a record reports its create
    time.

Client-side error codes (``BufferFullError`` 1000, ``ProducerClosedError`` 1001,
``DeliveryTimeoutError`` 1002) are never sent on the wire; they sit above every broker
code so they cannot collide with one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    Any,
    ClassVar,
    Final,
    Literal,
    NamedTuple,
    TypeAlias,
    TypedDict,
    Unpack,
    cast,
)

import pyarrow as pa
import pyarrow.compute as pc

from strata.client._cluster import Cluster
from strata.client._sync import EventLoopThread
from wire.errors import (
    BrokerNotAvailableError,
    DuplicateSequenceError,
    FencedLeaderEpochError,
    InvalidRecordBatchError,
    NetworkError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    RequestTimedOutError,
    StrataError,
    UnknownTopicOrPartitionError,
    error_for_code,
    raise_for_code,
)
from wire.partitioner import (
    StickyPartitioner,
    key_partitions,
    partition_for_key,
    split_by_partition,
)
from wire.protocol import (
    ApiKey,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
)
from wire.record_batch import (
    MAX_RECORDS_PER_BATCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PAYLOAD_SCHEMA,
    Compression,
    build_batch,
    encode_record_batch,
    warm_up_encoder,
)

__all__ = [
    "AsyncProducer",
    "BatchMetadata",
    "BufferFullError",
    "DeliveryTimeoutError",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerOptions",
    "RecordMetadata",
]

log = logging.getLogger("strata.client.producer")

#: Per-record bytes added to key/value/header lengths in the ``batch_size`` estimate.
RECORD_OVERHEAD: Final = 16
#: Upper bound on the batch bytes packed into one ProduceRequest (far below the broker's
#: ``socket.request.max.bytes`` of 100 MiB; one batch always fits whatever its size).
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
#: How long ``send`` keeps asking for metadata of a topic no broker knows.
UNKNOWN_TOPIC_GRACE_MS: Final = 500
#: Ceiling of the exponential retry backoff (Kafka's ``retry.backoff.max.ms``).
RETRY_BACKOFF_MAX_MS: Final = 1000
_INT32_MAX: Final = 2**31 - 1
_HEADERS_TYPE: Final = PAYLOAD_SCHEMA.field("headers").type
_ACKS_ALL: Final = -1

Key: TypeAlias = bytes | bytearray | memoryview | str | None
Value: TypeAlias = bytes | bytearray | memoryview | str | None
Headers: TypeAlias = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None
_Header = tuple[str, bytes | None]


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


# --------------------------------------------------------------------------- config


class ProducerOptions(TypedDict, total=False):
    """Keyword options shared by ``Producer`` and ``AsyncProducer`` (see ``ProducerConfig``)."""

    acks: int | str
    batch_size: int
    linger_ms: float
    compression: str | None
    enable_idempotence: bool | None
    max_in_flight: int
    buffer_memory: int
    on_buffer_full: Literal["block", "raise"]
    max_block_ms: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    retries: int
    retry_backoff_ms: int
    client_id: str


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Validated producer settings; defaults follow Kafka's producer where one exists.

    - ``acks``: 0 (fire and forget), 1 (leader wrote it), ``"all"``/-1 (every in-sync
      replica has it; the default).
    - ``batch_size``: bytes per batch (estimate in the module docstring), default 128 KiB.
      Larger than Kafka's 16 KiB because a Python producer pays a fixed cost per batch.
    - ``linger_ms``: how long a batch waits for more records after its first (default 5).
    - ``compression``: ``"none"`` (default), ``"lz4"`` or ``"zstd"`` (Arrow IPC buffer
      compression; the broker stores the batch as is).
    - ``enable_idempotence``: ``None`` = on unless acks is 0/1 or ``retries`` is 0.
    - ``max_in_flight``: produce requests outstanding per broker (default 5); per
      partition it is always one batch.
    - ``buffer_memory``: bytes of unacknowledged records (default 32 MiB);
      ``on_buffer_full``: ``"block"`` (default, up to ``max_block_ms``) or ``"raise"``.
    - ``max_block_ms``: longest ``send`` blocks for buffer space or metadata (60 s).
    - ``request_timeout_ms``: wait for one produce response (30 s); also the broker's
      replication wait.
    - ``delivery_timeout_ms``: give up on a batch this long after it was created (120 s).
    - ``retries``: resend attempts per batch (default unbounded; the delivery timeout
      bounds them). ``retry_backoff_ms``: first backoff (100 ms), doubling up to 1 s.
    """

    bootstrap_servers: str | list[str]
    acks: int = _ACKS_ALL
    batch_size: int = 128 * 1024
    linger_ms: float = 5.0
    compression: Compression = Compression.NONE
    idempotent: bool = True
    max_in_flight: int = 5
    buffer_memory: int = 32 * 1024 * 1024
    on_buffer_full: Literal["block", "raise"] = "block"
    max_block_ms: int = 60_000
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    retries: int = _INT32_MAX
    retry_backoff_ms: int = 100
    client_id: str = "strata-producer"

    @classmethod
    def from_options(cls, bootstrap_servers: str | list[str],
                     options: ProducerOptions) -> ProducerConfig:
        """Check every option and resolve idempotence; a ``ValueError`` says what is wrong."""
        known = set(ProducerOptions.__annotations__)
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown producer option(s) {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        acks = _parse_acks(options.get("acks", "all"))
        retries = options.get("retries", _INT32_MAX)
        explicit = options.get("enable_idempotence")
        if explicit is True and acks != _ACKS_ALL:
            raise ValueError(
                f"enable_idempotence=True requires acks='all' (got acks={acks}): the "
                "broker can only deduplicate retries of writes every in-sync replica has; "
                "use acks='all' or enable_idempotence=False")
        if explicit is True and retries == 0:
            raise ValueError("enable_idempotence=True requires retries > 0")
        idempotent = acks == _ACKS_ALL and retries > 0 if explicit is None else explicit
        compression_name = options.get("compression")
        try:
            compression = Compression.parse(compression_name)
        except InvalidRecordBatchError:
            raise ValueError(f"compression={compression_name!r} is not supported; use "
                             "'none', 'lz4' or 'zstd'") from None
        on_full = options.get("on_buffer_full", "block")
        if on_full not in ("block", "raise"):
            raise ValueError(f"on_buffer_full={on_full!r}: use 'block' or 'raise'")
        plain: dict[str, Any] = {
            name: value for name, value in options.items()
            if name not in ("acks", "compression", "enable_idempotence", "on_buffer_full",
                            "retries")}
        config = cls(bootstrap_servers=bootstrap_servers, acks=acks, compression=compression,
                     idempotent=idempotent, on_buffer_full=on_full, retries=retries, **plain)
        for name, minimum in (("batch_size", 1), ("max_in_flight", 1), ("buffer_memory", 1),
                              ("request_timeout_ms", 1), ("delivery_timeout_ms", 1),
                              ("linger_ms", 0), ("max_block_ms", 0), ("retries", 0),
                              ("retry_backoff_ms", 0)):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
                raise ValueError(f"{name}={value!r} is not valid; use a number >= {minimum}")
        return config


def _parse_acks(acks: int | str) -> int:
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return _ACKS_ALL
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"acks={acks!r} is not valid; use 0, 1 or 'all' (-1)")


# --------------------------------------------------------------------------- internals

_AnyFuture: TypeAlias = "asyncio.Future[Any] | concurrent.futures.Future[Any]"
_STATE_ERRORS: Final = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


def _resolve(future: _AnyFuture, result: Any) -> None:
    try:  # (try/except, not contextlib.suppress: this runs once per record)
        if not future.done():
            future.set_result(result)
    except _STATE_ERRORS:  # cancelled by its owner meanwhile
        pass


def _reject(future: _AnyFuture, error: BaseException) -> None:
    try:
        if not future.done():
            future.set_exception(error)
    except _STATE_ERRORS:
        pass


# States of ``concurrent.futures.Future`` (``concurrent.futures._base``).
_PENDING: Final = "PENDING"
_FINISHED: Final = "FINISHED"


class _DeliveryFuture(concurrent.futures.Future[Any]):
    """A ``concurrent.futures.Future`` that shares one condition with its whole batch.

    Why: a stock ``Future()`` allocates its own ``Condition`` and ``RLock`` (about
    1.6 us, a third of what a sync ``send`` costs), and completing it costs another
    2 us of locking and notifying. The records of a batch complete together, so
    ``_complete_sync`` sets every state under the shared condition and notifies once:
    no waiter can wake before its own result is in. ``cancel`` is refused (a record
    handed to the producer cannot be taken back, as in Kafka), which also rules out the
    only other notifier of the shared condition.
    """

    def __init__(self, condition: threading.Condition) -> None:
        # Deliberately not Future.__init__: the same fields, but a shared condition.
        self._condition = condition
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks: list[Callable[[concurrent.futures.Future[Any]], object]] = []

    def cancel(self) -> bool:
        return False


def _complete_sync(condition: threading.Condition, futures: Sequence[_DeliveryFuture],
                   results: Sequence[Any] | None, error: BaseException | None) -> None:
    """Finish the ``_DeliveryFuture``s of one batch: all states first, one notify."""
    done: list[_DeliveryFuture] = []
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


def _as_bytes(value: Key, what: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"record {what} must be bytes, str or None, not {type(value).__name__}; "
                    "serialize it first")


def _normalize_headers(headers: Headers) -> tuple[list[_Header] | None, int]:
    if not headers:
        return None, 0
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[_Header] = []
    size = 0
    for item in items:
        try:
            name, raw = item
        except (TypeError, ValueError):
            raise TypeError("headers must be (str, bytes) pairs or a {str: bytes} mapping") \
                from None
        if not isinstance(name, str):
            raise TypeError(f"header key {name!r} must be a str")
        value = _as_bytes(raw, f"header {name!r} value")
        out.append((name, value))
        size += len(name) + (len(value) if value is not None else 0)
    return out, size


class _Group:
    """The one future of a ``send_batch`` call, fed by the completions of its batches."""

    __slots__ = ("completed", "expected", "failed", "future", "parts", "sealed")

    def __init__(self, future: _AnyFuture) -> None:
        self.future = future
        self.parts: list[BatchMetadata | None] = []
        self.expected = 0  # batches queued (grows in the caller's thread, lock held)
        self.completed = 0  # batches acknowledged (loop thread)
        self.sealed = False  # every batch of the call is queued (set on the loop)
        self.failed = False

    def maybe_finish(self) -> None:
        if self.sealed and not self.failed and self.completed == self.expected:
            _resolve(self.future, [p for p in self.parts if p is not None])


class _Batch:
    """Records of one partition that travel together; immutable once closed."""

    __slots__ = ("arrow", "attempts", "base_sequence", "condition", "count", "created",
                 "deadline",
                 "done_waiters", "encoded", "finished", "futures", "group", "group_index",
                 "has_keys", "headers", "keys", "last_error", "partition", "retry_at", "size",
                 "timestamps", "topic", "values")

    def __init__(self, topic: str, partition: int, now: float, delivery_timeout_s: float) -> None:
        self.topic = topic
        self.partition = partition
        self.created = now
        self.deadline = now + delivery_timeout_s
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[list[_Header] | None] | None = None
        self.futures: list[_AnyFuture] = []
        self.condition: threading.Condition | None = None  # shared by _DeliveryFutures
        self.has_keys = False
        self.arrow: pa.RecordBatch | None = None
        self.group: _Group | None = None
        self.group_index = -1
        self.count = 0
        self.size = 0
        self.encoded: bytes | None = None
        self.base_sequence = NO_SEQUENCE
        self.attempts = 0
        self.retry_at = 0.0
        self.last_error: StrataError | None = None
        self.done_waiters: list[asyncio.Future[None]] = []
        self.finished = False

    def encode(self, compression: Compression, producer_id: int, producer_epoch: int,
               base_sequence: int) -> bytes:
        if self.arrow is not None:
            return encode_record_batch(self.arrow, compression=compression,
                                       producer_id=producer_id, producer_epoch=producer_epoch,
                                       base_sequence=base_sequence)
        return build_batch(self.values, keys=self.keys if self.has_keys else None,
                           timestamps=self.timestamps, headers=self.headers,
                           compression=compression, producer_id=producer_id,
                           producer_epoch=producer_epoch, base_sequence=base_sequence)


class _PartitionState:
    """Per-partition queue: ``open`` fills; ``queue[0]`` is the next (or in-flight) batch."""

    __slots__ = ("in_flight", "key", "next_sequence", "num_partitions", "open",
                 "pid_task", "producer_epoch", "producer_id", "queue", "wants_fresh_pid")

    def __init__(self, topic: str, partition: int, num_partitions: int) -> None:
        self.key = (topic, partition)
        self.num_partitions = num_partitions
        self.open: _Batch | None = None
        self.queue: deque[_Batch] = deque()
        self.in_flight = False
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.next_sequence = 0
        self.wants_fresh_pid = False
        self.pid_task: asyncio.Task[None] | None = None

    def batches(self) -> list[_Batch]:
        out = list(self.queue)
        if self.open is not None:
            out.append(self.open)
        return out


class _Engine:
    """The shared engine of both faces.

    Threading: the accumulator (``_partitions``' open batches and queues, ``_buffered``,
    the sticky partitioner) is guarded by ``_lock`` because the sync face appends from
    caller threads. Everything else (sending, retries, completions) runs on ``loop``.
    Futures are always completed *outside* the lock: a done-callback may call ``send``.
    """

    def __init__(self, config: ProducerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.cluster = Cluster(config.bootstrap_servers, client_id=config.client_id,
                               request_timeout_ms=config.request_timeout_ms,
                               retry_backoff_ms=config.retry_backoff_ms)
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._space_waiters: list[asyncio.Future[None]] = []
        self._partitions: dict[tuple[str, int], _PartitionState] = {}
        self._buffered = 0
        self._sticky = StickyPartitioner()
        self._closing = False
        self._stopping = False
        self._flushing = 0
        self._loop_thread_id: int | None = None
        self._wake_event: asyncio.Event | None = None
        self._wake_scheduled = False
        self._sender: asyncio.Task[None] | None = None
        self._node_in_flight: dict[int, int] = {}
        self._request_tasks: set[asyncio.Task[None]] = set()
        self._shared_pid: tuple[int, int] | None = None
        self._shared_pid_task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._last_refresh = 0.0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the sender task; must run on ``loop``."""
        if self._sender is not None:
            return
        self._loop_thread_id = threading.get_ident()
        self._wake_event = asyncio.Event()
        self._sender = self.loop.create_task(self._run_sender(), name="strata-producer-sender")
        self.loop.run_in_executor(None, warm_up_encoder)
        if self.config.idempotent:  # fetch the id now so the first batch need not wait
            self._shared_pid_task = self.loop.create_task(self._init_shared_pid())

    async def flush(self) -> None:
        """Send every batch that exists now (ignoring ``linger_ms``) and wait for outcomes."""
        self._flushing += 1
        try:
            with self._lock:
                batches = [b for st in self._partitions.values() for b in st.batches()]
            waiters: list[asyncio.Future[None]] = []
            for batch in batches:
                if not batch.finished:
                    waiter = self.loop.create_future()
                    batch.done_waiters.append(waiter)
                    waiters.append(waiter)
            self._wake()
            if waiters:
                await asyncio.gather(*waiters)
        finally:
            self._flushing -= 1

    async def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (within ``timeout`` seconds), then release everything."""
        if self._closed:
            return
        with self._lock:
            self._closing = True
            self._space.notify_all()
        self._wake_space_waiters()
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            pass
        finally:
            self._stopping = True
            self._wake()
            if self._sender is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sender
            with self._lock:
                pid_tasks = [st.pid_task for st in self._partitions.values()]
            tasks = [*self._request_tasks, self._refresh_task, self._shared_pid_task,
                     *pid_tasks]
            for task in tasks:
                if task is not None and not task.done():
                    task.cancel()
            for task in tasks:
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            leftovers: list[_Batch] = []
            with self._lock:
                for st in self._partitions.values():
                    leftovers.extend(st.batches())
                    st.queue.clear()
                    st.open = None
            for batch in leftovers:
                self._finish_failed(None, batch, ProducerClosedError(
                    f"the producer was closed before {batch.topic}-{batch.partition} "
                    f"acknowledged {batch.count} record(s); they may not have been written"))
            await self.cluster.close()
            self._closed = True

    # ------------------------------------------------------------------ metadata
    def cached_partition_count(self, topic: str) -> int | None:
        partitions = self.cluster.topics.get(topic)
        return len(partitions) if partitions else None

    async def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; fetches metadata (retrying up to ``max_block_ms``)."""
        cached = self.cached_partition_count(topic)
        if cached is not None:
            return cached
        start = time.monotonic()
        deadline = start + self.config.max_block_ms / 1000
        # Strata never auto-creates topics, so an unknown topic is reported quickly; the
        # short grace covers a broker whose metadata lags a creation made elsewhere.
        unknown_deadline = min(deadline, start + UNKNOWN_TOPIC_GRACE_MS / 1000)
        attempt = 0
        while True:
            attempt += 1
            backoff = self._backoff_s(attempt)
            try:
                partitions = await self.cluster.partitions_for(topic, refresh=True)
                if partitions:
                    return len(partitions)
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partitions")
            except UnknownTopicOrPartitionError as err:
                if time.monotonic() + backoff >= unknown_deadline:
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic!r} does not exist; create it first (strata topic "
                        f"create {topic})") from err
            except (NetworkError, TimeoutError) as err:
                if time.monotonic() + backoff >= deadline:
                    raise NetworkError(f"no metadata for topic {topic!r} within max_block_ms="
                                       f"{self.config.max_block_ms}: {err}") from err
            await asyncio.sleep(backoff)

    def _request_refresh(self) -> None:
        """Refresh metadata of the topics in use, at most once per backoff interval."""
        if self._refresh_task is not None and not self._refresh_task.done():
            return
        now = time.monotonic()
        delay = max(0.0, self._last_refresh + self.config.retry_backoff_ms / 1000 - now)
        self._refresh_task = self.loop.create_task(self._refresh(delay))

    async def _refresh(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        self._last_refresh = time.monotonic()
        with self._lock:  # caller threads may add partitions concurrently
            topics = sorted({topic for topic, _ in self._partitions})
        try:
            if topics:
                await self.cluster.refresh(topics)
        except (StrataError, OSError, TimeoutError) as err:
            log.debug("metadata refresh failed: %s", err)
        self._wake()

    # ------------------------------------------------------------------ accumulate
    def _record_too_large(self, size: int) -> RecordTooLargeError:
        return RecordTooLargeError(
            f"a record of about {size} bytes does not fit in buffer_memory="
            f"{self.config.buffer_memory}; raise buffer_memory or send smaller records")

    def _append_locked(self, topic: str, num_partitions: int, partition: int | None,
                       key: bytes | None, value: bytes | None, timestamp: int,
                       headers: list[_Header] | None, size: int, future: _AnyFuture | None
                       ) -> tuple[_AnyFuture | None, bool]:
        """Append one record; return ``(its future, wake_sender)``, ``None``: no space.

        ``future`` ``None`` (the sync face) makes a ``_DeliveryFuture`` on the batch.
        """
        if self._closing:
            raise ProducerClosedError("send() after close(): create a new producer")
        if self._buffered + size > self.config.buffer_memory:
            return None, False
        config = self.config
        sticky = partition is None and key is None
        if partition is None:
            partition = partition_for_key(key, num_partitions) if key is not None \
                else self._sticky.partition(topic, num_partitions)
        st = self._state(topic, partition, num_partitions)
        batch = st.open
        wake = False
        if batch is not None and (batch.size + size > config.batch_size
                                  or batch.count >= MAX_RECORDS_PER_BATCH):
            self._close_open(st)
            wake = True
            if sticky:  # the sticky partition moved on: follow it (Kafka's onNewBatch)
                partition = self._sticky.partition(topic, num_partitions)
                st = self._state(topic, partition, num_partitions)
            batch = st.open
        now = time.monotonic()
        if batch is None:
            batch = st.open = _Batch(topic, partition, now, config.delivery_timeout_ms / 1000)
            wake = True
        batch.keys.append(key)
        batch.values.append(value)
        batch.timestamps.append(timestamp)
        if key is not None:
            batch.has_keys = True
        if headers is not None:
            if batch.headers is None:
                batch.headers = [None] * batch.count
            batch.headers.append(headers)
        elif batch.headers is not None:
            batch.headers.append(None)
        if future is None:
            if batch.condition is None:
                batch.condition = threading.Condition()
            future = _DeliveryFuture(batch.condition)
        batch.futures.append(future)
        batch.count += 1
        batch.size += size
        self._buffered += size
        if batch.size >= config.batch_size or batch.count >= MAX_RECORDS_PER_BATCH:
            self._close_open(st)
            wake = True
        return future, wake

    def _state(self, topic: str, partition: int, num_partitions: int) -> _PartitionState:
        st = self._partitions.get((topic, partition))
        if st is None:
            st = self._partitions[(topic, partition)] = _PartitionState(
                topic, partition, num_partitions)
        else:
            st.num_partitions = num_partitions
        return st

    def _close_open(self, st: _PartitionState) -> None:
        """Move the open batch to the send queue (lock held); the sticky partition moves."""
        batch = st.open
        if batch is None:
            return
        st.open = None
        st.queue.append(batch)
        self._sticky.batch_closed(st.key[0], st.key[1], st.num_partitions)

    def prepare(self, key: Key, value: Value, headers: Headers, timestamp_ms: int | None
                ) -> tuple[bytes | None, bytes | None, list[_Header] | None, int, int]:
        """Type-check one record; return its parts and its size estimate."""
        k = _as_bytes(key, "key")
        v = _as_bytes(value, "value")
        hs, header_bytes = _normalize_headers(headers)
        ts = time.time_ns() // 1_000_000 if timestamp_ms is None else int(timestamp_ms)
        if ts < 0:
            raise ValueError(f"timestamp_ms={timestamp_ms} must be >= 0 (ms since the epoch)")
        size = RECORD_OVERHEAD + header_bytes + (len(k) if k is not None else 0) + \
            (len(v) if v is not None else 0)
        if size > self.config.buffer_memory:
            raise self._record_too_large(size)
        return k, v, hs, ts, size

    def check_partition(self, topic: str, partition: int | None, num_partitions: int) -> None:
        if partition is not None and not 0 <= partition < num_partitions:
            raise ValueError(f"partition {partition} does not exist: topic {topic!r} has "
                             f"{num_partitions} partition(s), 0..{num_partitions - 1}")

    def _on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread_id

    def append_blocking(self, topic: str, num_partitions: int, partition: int | None,
                        key: bytes | None, value: bytes | None, timestamp: int,
                        headers: list[_Header] | None, size: int) -> _AnyFuture:
        """Append from any thread (waiting on ``_space`` for buffer space); its future."""
        deadline: float | None = None
        with self._lock:
            while True:
                future, wake = self._append_locked(topic, num_partitions, partition, key,
                                                   value, timestamp, headers, size, None)
                if future is not None:
                    break
                deadline = self._wait_for_space_sync(deadline)
        if wake:
            self._request_wake()
        return future

    def _wait_for_space_sync(self, deadline: float | None) -> float:
        """Wait (lock held) for freed buffer space; raise ``BufferFullError`` when not allowed."""
        if self.config.on_buffer_full == "raise":
            raise self._buffer_full()
        if self._on_loop_thread():
            # Blocking the loop thread would stop the very acknowledgements that free space.
            raise self._buffer_full(" (send() from the producer's own loop thread, e.g. a "
                                    "delivery callback, cannot block)")
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.config.max_block_ms / 1000
        if now >= deadline or (not self._space.wait(deadline - now)
                               and time.monotonic() >= deadline):
            raise self._buffer_full(f" for max_block_ms={self.config.max_block_ms}")
        return deadline

    async def append_async(self, topic: str, num_partitions: int, partition: int | None,
                           key: bytes | None, value: bytes | None, timestamp: int,
                           headers: list[_Header] | None, size: int, future: _AnyFuture
                           ) -> None:
        """Append on the loop; with ``"block"``, await freed space up to ``max_block_ms``."""
        deadline: float | None = None
        while True:
            with self._lock:
                appended, wake = self._append_locked(topic, num_partitions, partition, key,
                                                     value, timestamp, headers, size, future)
            if appended is not None:
                if wake:
                    self._wake()
                return
            deadline = await self._wait_for_space_async(deadline)

    async def _wait_for_space_async(self, deadline: float | None) -> float:
        if self.config.on_buffer_full == "raise":
            raise self._buffer_full()
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.config.max_block_ms / 1000
        if now >= deadline:
            raise self._buffer_full(f" for max_block_ms={self.config.max_block_ms}")
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._space_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, deadline - now)
        except TimeoutError:
            raise self._buffer_full(f" for max_block_ms={self.config.max_block_ms}") from None
        return deadline

    def _buffer_full(self, detail: str = "", **extra: Any) -> BufferFullError:
        return BufferFullError(
            f"producer buffer full: {self._buffered} of buffer_memory="
            f"{self.config.buffer_memory} bytes await acknowledgement{detail}; slow down, "
            "flush(), or raise buffer_memory", **extra)

    # ------------------------------------------------------------------ columnar path
    def plan_columns(self, topic: str, num_partitions: int, values: Any, keys: Any,
                     partition: int | None, timestamp_ms: int | None
                     ) -> list[tuple[int | None, pa.RecordBatch, int]]:
        """Cut whole columns into ``(partition or None=sticky, payload, size)`` chunks.

        All vectorized: sizes come from ``binary_length`` and a cumulative sum, chunk
        edges from a run-end encoding of ``(cumsum - 1) // batch_size``. Only keyed
        records without an explicit partition pay a Python murmur2 call each.
        """
        value_array = _column(values, "values")
        n = len(value_array)
        if n == 0:
            return []
        key_array = pa.nulls(n, pa.binary()) if keys is None else _column(keys, "keys")
        if len(key_array) != n:
            raise ValueError(f"keys has {len(key_array)} rows but values has {n}")
        ts = time.time_ns() // 1_000_000 if timestamp_ms is None else int(timestamp_ms)
        ts_array = pa.repeat(pa.scalar(ts, pa.int64()), n)
        # The (all-null) headers column is added per chunk: Arrow's IPC writer does not
        # trim a *sliced* list array, so a slice of a big one would carry all its offsets.
        payload = pa.RecordBatch.from_arrays([key_array, value_array, ts_array],
                                             names=["key", "value", "timestamp"])
        groups: list[tuple[int | None, pa.RecordBatch]]
        if partition is not None or key_array.null_count == n:
            groups = [(partition, payload)]
        else:
            # Null keys in a keyed column follow the sticky partition, as with send().
            targets = key_partitions(key_array, num_partitions, null_target=-1)
            groups = [(None if p < 0 else p, rows)
                      for p, rows in split_by_partition(payload, targets)]
        out: list[tuple[int | None, pa.RecordBatch, int]] = []
        for target, rows in groups:
            # Common case: the rows fit one batch. Their buffer size plus the per-record
            # overhead bounds the estimate from above, so no per-row sizes are needed.
            estimate = rows.nbytes + rows.num_rows * RECORD_OVERHEAD
            if estimate <= self.config.batch_size and rows.num_rows <= MAX_RECORDS_PER_BATCH:
                out.append((target, pa.RecordBatch.from_arrays(
                    [*rows.columns, pa.nulls(rows.num_rows, _HEADERS_TYPE)],
                    schema=PAYLOAD_SCHEMA), estimate))
                continue
            # Scalars are passed as Arrow scalars: given a Python int, pyarrow retries a
            # failing optional import on every call (about 70 us each here).
            zero = pa.scalar(0, pa.int32())
            sizes = pc.add(pc.add(pc.fill_null(pc.binary_length(rows.column(0)), zero),
                                  pc.fill_null(pc.binary_length(rows.column(1)), zero)),
                           pa.scalar(RECORD_OVERHEAD, pa.int32()))
            sizes = pc.cast(sizes, pa.int64())
            cumulative = pc.cumulative_sum(sizes)
            windows = pc.divide(pc.subtract(cumulative, pa.scalar(1, pa.int64())),
                                pa.scalar(self.config.batch_size, pa.int64()))
            ends = pc.run_end_encode(windows).run_ends.to_pylist()
            start = 0
            for end in ends:
                while start < end:
                    stop = min(end, start + MAX_RECORDS_PER_BATCH)
                    part = rows.slice(start, stop - start)
                    chunk = pa.RecordBatch.from_arrays(
                        [*part.columns, pa.nulls(stop - start, _HEADERS_TYPE)],
                        schema=PAYLOAD_SCHEMA)
                    before = cumulative[start - 1].as_py() if start else 0
                    out.append((target, chunk, cumulative[stop - 1].as_py() - before))
                    start = stop
        return out

    def _append_chunk_locked(self, topic: str, num_partitions: int, target: int | None,
                             rows: pa.RecordBatch, size: int, group: _Group) -> bool:
        """Queue one pre-built chunk as its own batch (lock held); ``False``: no space."""
        if self._closing:
            raise ProducerClosedError("send_batch() after close(): create a new producer")
        if self._buffered + size > self.config.buffer_memory and self._buffered > 0:
            return False
        partition = self._sticky.partition(topic, num_partitions) if target is None else target
        st = self._state(topic, partition, num_partitions)
        self._close_open(st)  # records sent earlier to this partition go first
        batch = _Batch(topic, partition, time.monotonic(), self.config.delivery_timeout_ms / 1000)
        batch.arrow = rows
        batch.count = rows.num_rows
        batch.size = size
        batch.group = group
        batch.group_index = len(group.parts)
        group.parts.append(None)
        group.expected += 1
        st.queue.append(batch)
        self._buffered += size
        self._sticky.batch_closed(topic, partition, num_partitions)
        return True

    def append_chunks_blocking(self, topic: str, num_partitions: int,
                               chunks: list[tuple[int | None, pa.RecordBatch, int]],
                               group: _Group) -> None:
        accepted = 0
        try:
            for target, rows, size in chunks:
                deadline: float | None = None
                with self._space:
                    while not self._append_chunk_locked(topic, num_partitions, target, rows,
                                                        size, group):
                        deadline = self._wait_for_space_sync(deadline)
                accepted += rows.num_rows
                self._request_wake()
        except BufferFullError as err:
            raise self._partial(group, accepted, err) from None
        finally:
            self._seal(group)

    async def append_chunks_async(self, topic: str, num_partitions: int,
                                  chunks: list[tuple[int | None, pa.RecordBatch, int]],
                                  group: _Group) -> None:
        accepted = 0
        try:
            for target, rows, size in chunks:
                deadline: float | None = None
                while True:
                    with self._lock:
                        ok = self._append_chunk_locked(topic, num_partitions, target, rows,
                                                       size, group)
                    if ok:
                        break
                    deadline = await self._wait_for_space_async(deadline)
                accepted += rows.num_rows
                self._wake()
        except BufferFullError as err:
            raise self._partial(group, accepted, err) from None
        finally:
            self._seal(group)

    def _partial(self, group: _Group, accepted: int, err: BufferFullError) -> BufferFullError:
        return BufferFullError(
            f"{err.message}; the first {accepted} record(s) of this send_batch were queued "
            "and will be delivered (see .accepted)", records_accepted=accepted,
            accepted=group.future if accepted else None)

    def _seal(self, group: _Group) -> None:
        def seal() -> None:
            group.sealed = True
            group.maybe_finish()
        # Completions run on the loop; sealing there too avoids racing them.
        if self._on_loop_thread():
            seal()
        else:
            self.loop.call_soon_threadsafe(seal)

    # ------------------------------------------------------------------ wake-ups
    def _wake(self) -> None:
        if self._wake_event is not None:
            self._wake_event.set()

    def _wake_from_thread(self) -> None:
        self._wake_scheduled = False
        self._wake()

    def _request_wake(self) -> None:
        """Wake the sender from any thread (one ``call_soon_threadsafe`` per burst)."""
        if self._on_loop_thread():
            self._wake()
        elif not self._wake_scheduled:
            self._wake_scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._wake_from_thread)
            except RuntimeError:  # loop closed: the producer is gone
                self._wake_scheduled = False

    def _wake_space_waiters(self) -> None:
        waiters, self._space_waiters = self._space_waiters, []
        for waiter in waiters:
            _resolve(waiter, None)

    # ------------------------------------------------------------------ sender
    def _backoff_s(self, attempt: int) -> float:
        base: float = self.config.retry_backoff_ms * (2 ** min(max(attempt - 1, 0), 10))
        ceiling = max(RETRY_BACKOFF_MAX_MS, self.config.retry_backoff_ms)
        return min(base, ceiling) / 1000 * random.uniform(0.8, 1.0)

    async def _run_sender(self) -> None:
        assert self._wake_event is not None
        event = self._wake_event
        while not self._stopping:
            event.clear()
            now = time.monotonic()
            try:
                next_wake = self._sender_pass(now)
            except Exception:  # a bug here must not silently stop all delivery
                log.exception("producer sender pass failed; continuing")
                next_wake = now + self.config.retry_backoff_ms / 1000
            if event.is_set():
                continue
            handle = None
            if next_wake is not None:
                handle = self.loop.call_later(max(next_wake - time.monotonic(), 0), event.set)
            try:
                await event.wait()
            finally:
                if handle is not None:
                    handle.cancel()

    def _sender_pass(self, now: float) -> float | None:
        """One round: expire, close lingered batches, send; return the next deadline."""
        ready, next_wake, expired = self._collect(now)
        for st, batch in expired:
            self._finish_failed(st, batch, DeliveryTimeoutError(
                f"{batch.count} record(s) for {batch.topic}-{batch.partition} were not "
                f"acknowledged within delivery_timeout_ms={self.config.delivery_timeout_ms}"
                + (f"; last error: {batch.last_error}" if batch.last_error else ""),
                batch.last_error))
        if ready:
            next_wake = self._dispatch(ready, now, next_wake)
        return next_wake

    def _collect(self, now: float) -> tuple[list[_PartitionState], float | None,
                                            list[tuple[_PartitionState, _Batch]]]:
        """Close lingered batches; find the partitions whose head batch can go now."""
        linger = self.config.linger_ms / 1000
        force = self._flushing > 0 or self._closing
        ready: list[_PartitionState] = []
        expired: list[tuple[_PartitionState, _Batch]] = []
        next_wake: float | None = None

        def soon(t: float) -> None:
            nonlocal next_wake
            if next_wake is None or t < next_wake:
                next_wake = t

        with self._lock:
            for st in self._partitions.values():
                batch = st.open
                if batch is not None:
                    if force or now >= batch.created + linger:
                        self._close_open(st)
                    else:
                        soon(batch.created + linger)
                if not st.queue:
                    continue
                for i, queued in enumerate(st.queue):
                    if i == 0 and st.in_flight:
                        continue
                    if now >= queued.deadline:
                        expired.append((st, queued))
                    else:
                        soon(queued.deadline)
                if st.in_flight:
                    continue
                head = st.queue[0]
                if now >= head.deadline:
                    continue
                if head.retry_at > now:
                    soon(head.retry_at)
                    continue
                if self.config.idempotent and head.encoded is None and not self._has_pid(st):
                    continue  # a retry keeps its bytes; only a new batch needs an id
                ready.append(st)
        return ready, next_wake, expired

    def _has_pid(self, st: _PartitionState) -> bool:
        """Whether ``st`` can number a new batch; starts getting a producer id if not."""
        if st.producer_id != NO_PRODUCER_ID:
            return True
        if st.wants_fresh_pid:
            if st.pid_task is None or st.pid_task.done():
                st.pid_task = self.loop.create_task(self._fresh_pid(st))
            return False
        if self._shared_pid is not None:
            st.producer_id, st.producer_epoch = self._shared_pid
            st.next_sequence = 0
            return True
        if self._shared_pid_task is None or self._shared_pid_task.done():
            self._shared_pid_task = self.loop.create_task(self._init_shared_pid())
        return False

    async def _acquire_pid(self) -> tuple[int, int]:
        attempt = 0
        while True:
            try:
                response = await self.cluster.send_any(ApiKey.INIT_PRODUCER_ID,
                                                       InitProducerIdRequest())
                assert isinstance(response, InitProducerIdResponse)
                raise_for_code(response.error_code, response.error_message)
                return response.producer_id, response.producer_epoch
            except (StrataError, OSError, TimeoutError) as err:
                if isinstance(err, StrataError) and not err.retriable:
                    log.error("InitProducerId failed: %s", err)
                attempt += 1
                await asyncio.sleep(self._backoff_s(attempt))

    async def _init_shared_pid(self) -> None:
        self._shared_pid = await self._acquire_pid()
        log.debug("producer id %d epoch %d", *self._shared_pid)
        self._wake()

    async def _fresh_pid(self, st: _PartitionState) -> None:
        pid, epoch = await self._acquire_pid()
        st.producer_id, st.producer_epoch, st.next_sequence = pid, epoch, 0
        st.wants_fresh_pid = False
        log.info("%s-%d: continuing with fresh producer id %d", *st.key, pid)
        self._wake()

    def _dispatch(self, ready: list[_PartitionState], now: float,
                  next_wake: float | None) -> float | None:
        """Encode head batches and send one ProduceRequest per leader (within limits)."""
        by_node: dict[int, list[_PartitionState]] = {}
        need_refresh = False
        for st in ready:
            topic, partition = st.key
            info = self.cluster.topics.get(topic, {}).get(partition)
            if info is None or info.leader < 0 or info.leader not in self.cluster.brokers:
                need_refresh = True  # the refresh wakes the sender when it lands
                head = st.queue[0]
                head.retry_at = now + self.config.retry_backoff_ms / 1000
                if next_wake is None or head.retry_at < next_wake:
                    next_wake = head.retry_at
                continue
            by_node.setdefault(info.leader, []).append(st)
        if need_refresh:
            self._request_refresh()
        for node, states in by_node.items():
            while states and self._node_in_flight.get(node, 0) < self.config.max_in_flight:
                batches: list[_Batch] = []
                size = 0
                while states and (not batches or size + states[0].queue[0].size
                                  <= MAX_REQUEST_BYTES):
                    st = states.pop(0)
                    batch = st.queue[0]
                    if not self._encode(st, batch):
                        continue
                    st.in_flight = True
                    batches.append(batch)
                    size += len(batch.encoded or b"")
                if not batches:
                    continue
                self._node_in_flight[node] = self._node_in_flight.get(node, 0) + 1
                task = self.loop.create_task(self._send(node, batches))
                self._request_tasks.add(task)
                task.add_done_callback(self._request_tasks.discard)
        return next_wake

    def _encode(self, st: _PartitionState, batch: _Batch) -> bool:
        """Encode ``batch`` once, numbering it when idempotent; ``False`` if it failed."""
        if batch.encoded is not None:
            return True
        config = self.config
        try:
            if config.idempotent:
                sequence = st.next_sequence
                if sequence + batch.count - 1 > _INT32_MAX:
                    st.producer_id = NO_PRODUCER_ID
                    st.wants_fresh_pid = True
                    return False
                batch.encoded = batch.encode(config.compression, st.producer_id,
                                             st.producer_epoch, sequence)
                batch.base_sequence = sequence
                st.next_sequence = sequence + batch.count
            else:
                batch.encoded = batch.encode(config.compression, NO_PRODUCER_ID,
                                             NO_PRODUCER_EPOCH, NO_SEQUENCE)
        except (StrataError, pa.ArrowException, TypeError, ValueError) as err:
            error = err if isinstance(err, StrataError) else InvalidRecordBatchError(
                f"cannot encode {batch.count} record(s) for {batch.topic}-{batch.partition}: "
                f"{err}")
            self._finish_failed(st, batch, error)
            return False
        return True

    async def _send(self, node: int, batches: list[_Batch]) -> None:
        config = self.config
        topics: dict[str, list[ProducePartition]] = {}
        for batch in batches:
            batch.attempts += 1
            topics.setdefault(batch.topic, []).append(
                ProducePartition(batch.partition, batch.encoded))
        request = ProduceRequest(config.acks, config.request_timeout_ms,
                                 [ProduceTopic(name, parts) for name, parts in topics.items()])
        try:
            try:
                connection = await self.cluster.connection(node)
                if config.acks == 0:
                    await connection.request(ApiKey.PRODUCE, request, expect_response=False)
                    if not connection.is_open:
                        raise NetworkError(f"lost the connection to broker {node} while "
                                           "writing an acks=0 request")
                    for batch in batches:
                        self._finish_ok(batch, -1, -1)
                    return
                response = await asyncio.wait_for(
                    connection.request(ApiKey.PRODUCE, request),
                    config.request_timeout_ms / 1000 + 0.5)
            except TimeoutError:
                self._retry_all(batches, RequestTimedOutError(
                    f"no produce response from broker {node} within request_timeout_ms="
                    f"{config.request_timeout_ms}"))
                return
            except StrataError as err:
                self._retry_all(batches, err)
                return
            except OSError as err:
                self._retry_all(batches, NetworkError(f"broker {node}: {err}"))
                return
            assert isinstance(response, ProduceResponse)
            answers = {(t.name, p.partition): p for t in response.topics for p in t.partitions}
            for batch in batches:
                answer = answers.get((batch.topic, batch.partition))
                if answer is None:
                    self._on_error(batch, NetworkError(
                        f"broker {node} did not answer for {batch.topic}-{batch.partition}"))
                elif answer.error_code == 0:
                    self._finish_ok(batch, answer.base_offset, answer.log_append_time)
                elif answer.error_code == DuplicateSequenceError.code:
                    # Already written; the broker normally answers 0 with the offset.
                    self._finish_ok(batch, answer.base_offset, answer.log_append_time)
                else:
                    cls = error_for_code(answer.error_code)
                    self._on_error(batch, cls(answer.error_message or cls.__name__))
        finally:
            self._node_in_flight[node] -= 1
            for batch in batches:
                st = self._partitions.get((batch.topic, batch.partition))
                if st is not None:
                    st.in_flight = False
            self._wake()

    def _retry_all(self, batches: list[_Batch], error: StrataError) -> None:
        for batch in batches:
            self._on_error(batch, error)

    def _on_error(self, batch: _Batch, error: StrataError) -> None:
        """Retry ``batch`` (same bytes) if allowed, else fail it (loop thread)."""
        st = self._partitions[(batch.topic, batch.partition)]
        now = time.monotonic()
        batch.last_error = error
        if isinstance(error, OutOfOrderSequenceError):
            self._fail_partition(st, error)
            return
        if isinstance(error, NotLeaderError | UnknownTopicOrPartitionError | NetworkError
                      | BrokerNotAvailableError | FencedLeaderEpochError
                      | RequestTimedOutError | NotEnoughReplicasError
                      | NotEnoughReplicasAfterAppendError):
            # A timeout may be a paused or cut-off leader that has since been replaced,
            # and a shrunken ISR often means a broker died: both are worth a fresh look.
            self._request_refresh()
        if error.retriable and batch.attempts <= self.config.retries:
            # Past the delivery deadline, the sender's expiry check fails it (with
            # DeliveryTimeoutError naming this error) instead of a retry.
            batch.retry_at = min(now + self._backoff_s(batch.attempts), batch.deadline)
            log.debug("%s-%d: retrying %d record(s) after %s", batch.topic, batch.partition,
                      batch.count, error)
            return
        self._finish_failed(st, batch, error)

    def _fail_partition(self, st: _PartitionState, error: OutOfOrderSequenceError) -> None:
        """OUT_OF_ORDER_SEQUENCE: every pending batch of ``st`` fails; fresh id after."""
        with self._lock:
            pending = st.batches()
        log.error("%s-%d: %s; failing %d pending batch(es)", *st.key, error, len(pending))
        for batch in pending:
            self._finish_failed(st, batch, OutOfOrderSequenceError(
                f"{batch.topic}-{batch.partition}: the broker reported a sequence gap "
                f"({error.message}); an earlier acknowledged batch of this partition is "
                f"missing, so these {batch.count} record(s) were not written; the producer "
                "continues with a new producer id"))

    def _release(self, st: _PartitionState | None, batch: _Batch) -> bool:
        """Drop ``batch`` from the accumulator and free its buffer space; ``False`` if done."""
        if batch.finished:
            return False
        batch.finished = True
        with self._lock:
            if st is not None:
                if st.queue and st.queue[0] is batch:
                    st.queue.popleft()
                elif batch in st.queue:
                    st.queue.remove(batch)
                elif st.open is batch:
                    st.open = None
            self._buffered -= batch.size
            self._space.notify_all()
        self._wake_space_waiters()
        return True

    def _finish_ok(self, batch: _Batch, base_offset: int, log_append_time: int) -> None:
        st = self._partitions.get((batch.topic, batch.partition))
        if not self._release(st, batch):
            return
        topic, partition = batch.topic, batch.partition
        if batch.group is not None:
            group = batch.group
            group.parts[batch.group_index] = BatchMetadata(
                topic, partition, base_offset, batch.count, log_append_time)
            group.completed += 1
            group.maybe_finish()
        else:
            if base_offset < 0:
                metas = [RecordMetadata(topic, partition, -1, ts) for ts in batch.timestamps]
            elif log_append_time >= 0:
                metas = [RecordMetadata(topic, partition, offset, log_append_time)
                         for offset in range(base_offset, base_offset + batch.count)]
            else:
                metas = [RecordMetadata(topic, partition, offset, ts) for offset, ts in
                         zip(range(base_offset, base_offset + batch.count), batch.timestamps,
                             strict=True)]
            if batch.condition is not None:
                _complete_sync(batch.condition, cast("list[_DeliveryFuture]", batch.futures),
                               metas, None)
            else:
                for future, meta in zip(batch.futures, metas, strict=True):
                    _resolve(future, meta)
        self._done(batch)

    def _finish_failed(self, st: _PartitionState | None, batch: _Batch,
                       error: StrataError) -> None:
        if not self._release(st, batch):
            return
        if st is not None and batch.base_sequence != NO_SEQUENCE and self.config.idempotent:
            # Outcome unknown or sequence consumed: restart this partition's numbering.
            st.producer_id = NO_PRODUCER_ID
            st.wants_fresh_pid = True
        if batch.group is not None:
            if not batch.group.failed:
                batch.group.failed = True
                _reject(batch.group.future, error)
                log.warning("%s-%d: send_batch failed: %s", batch.topic, batch.partition, error)
        else:
            log.warning("%s-%d: %d record(s) failed: %s", batch.topic, batch.partition,
                        batch.count, error)
            if batch.condition is not None:
                _complete_sync(batch.condition, cast("list[_DeliveryFuture]", batch.futures),
                               None, error)
            else:
                for future in batch.futures:
                    _reject(future, error)
        self._done(batch)

    def _done(self, batch: _Batch) -> None:
        for waiter in batch.done_waiters:
            _resolve(waiter, None)
        batch.done_waiters.clear()
        batch.futures = []


def _column(values: Any, name: str) -> pa.Array:
    """A binary Arrow array from an Arrow array/chunked array or a list of bytes/str/None."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        try:
            values = pa.array(values, pa.binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise TypeError(f"{name} must be bytes/str/None values: {err}") from None
    if values.type != pa.binary():
        try:
            values = values.cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise TypeError(f"{name} has Arrow type {values.type}; need binary or string") \
                from err
    return values


# --------------------------------------------------------------------------- faces


class AsyncProducer:
    """The asyncio producer. Use ``async with AsyncProducer(...) as p:`` or ``start``/``close``.

    Every method must be called from the event loop the producer started on.
    """

    def __init__(self, bootstrap_servers: str | list[str],
                 **options: Unpack[ProducerOptions]) -> None:
        self.config = ProducerConfig.from_options(bootstrap_servers, options)
        self._engine: _Engine | None = None

    async def start(self) -> AsyncProducer:
        """Bind to the running loop and start the sender (``send`` does it implicitly)."""
        if self._engine is None:
            self._engine = _Engine(self.config, asyncio.get_running_loop())
            self._engine.start()
        return self

    def _running(self) -> _Engine:
        if self._engine is None:
            raise RuntimeError("call `await producer.start()` (or use `async with`) first")
        return self._engine

    async def send(self, topic: str, value: Value, key: Key = None, headers: Headers = None,
                   partition: int | None = None, timestamp_ms: int | None = None
                   ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; return the future of its ``RecordMetadata``.

        Awaiting ``send`` waits only for metadata and buffer space (back-pressure);
        await the returned future for the broker's acknowledgement.
        """
        if self._engine is None:
            await self.start()
        engine = self._running()
        num_partitions = engine.cached_partition_count(topic) or \
            await engine.partition_count(topic)
        engine.check_partition(topic, partition, num_partitions)
        k, v, hs, ts, size = engine.prepare(key, value, headers, timestamp_ms)
        future: asyncio.Future[RecordMetadata] = engine.loop.create_future()
        await engine.append_async(topic, num_partitions, partition, k, v, ts, hs, size, future)
        return future

    async def send_and_wait(self, topic: str, value: Value, key: Key = None,
                            headers: Headers = None, partition: int | None = None,
                            timestamp_ms: int | None = None) -> RecordMetadata:
        """``send`` and wait for the acknowledgement."""
        future = await self.send(topic, value, key, headers, partition, timestamp_ms)
        return await future

    async def send_batch(self, topic: str, values: Any, keys: Any = None,
                         partition: int | None = None, timestamp_ms: int | None = None
                         ) -> asyncio.Future[list[BatchMetadata]]:
        """Queue many records as whole Arrow columns (the fast path, e.g. ``strata perf``).

        ``values``/``keys``: Arrow binary/string arrays or lists of bytes/str/None. With
        ``partition`` given, or no keys, no Python code runs per record: the columns are
        sliced into ``batch_size`` chunks, each sent as one batch (null keys follow the
        sticky partitioner, moving on after every chunk). Keyed records are hashed one by
        one and grouped by partition with Arrow filters. All records share
        ``timestamp_ms`` (default: now). The future resolves to one ``BatchMetadata`` per
        wire batch, in send order, or fails with the first error.
        """
        if self._engine is None:
            await self.start()
        engine = self._running()
        num_partitions = engine.cached_partition_count(topic) or \
            await engine.partition_count(topic)
        engine.check_partition(topic, partition, num_partitions)
        chunks = engine.plan_columns(topic, num_partitions, values, keys, partition,
                                     timestamp_ms)
        future: asyncio.Future[list[BatchMetadata]] = engine.loop.create_future()
        await engine.append_chunks_async(topic, num_partitions, chunks, _Group(future))
        return future

    async def flush(self) -> None:
        """Send everything buffered now, ignoring ``linger_ms``; wait for every outcome."""
        if self._engine is not None:
            await self._engine.flush()

    async def partitions_for(self, topic: str) -> int:
        """Number of partitions of ``topic`` (from metadata)."""
        if self._engine is None:
            await self.start()
        return await self._running().partition_count(topic)

    async def close(self, timeout: float | None = None) -> None:
        """Deliver buffered records (up to ``timeout`` seconds), then close connections.

        Records still unacknowledged when the timeout expires fail with
        ``ProducerClosedError``.
        """
        if self._engine is not None:
            await self._engine.close(timeout)

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Producer:
    """The synchronous producer: thread-safe, backed by a private event loop thread."""

    def __init__(self, bootstrap_servers: str | list[str],
                 **options: Unpack[ProducerOptions]) -> None:
        self.config = ProducerConfig.from_options(bootstrap_servers, options)
        self._thread = EventLoopThread("strata-producer")
        try:
            self._engine = self._thread.run(self._make_engine(), timeout=30)
        except BaseException:
            self._thread.close()
            raise
        self._closed = False

    async def _make_engine(self) -> _Engine:
        engine = _Engine(self.config, asyncio.get_running_loop())
        engine.start()
        return engine

    def _block_s(self) -> float:
        return self.config.max_block_ms / 1000 + 5

    def _partition_count(self, topic: str) -> int:
        cached = self._engine.cached_partition_count(topic)
        if cached is not None:
            return cached
        return self._thread.run(self._engine.partition_count(topic), timeout=self._block_s())

    def send(self, topic: str, value: Value, key: Key = None, headers: Headers = None,
             partition: int | None = None, timestamp_ms: int | None = None
             ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; return the future of its ``RecordMetadata``.

        Blocks only for metadata of a new topic or for buffer space (``on_buffer_full``).
        """
        if self._closed:
            raise ProducerClosedError("send() after close(): create a new producer")
        engine = self._engine
        num_partitions = self._partition_count(topic)
        if partition is not None:
            engine.check_partition(topic, partition, num_partitions)
        k, v, hs, ts, size = engine.prepare(key, value, headers, timestamp_ms)
        future = engine.append_blocking(topic, num_partitions, partition, k, v, ts, hs, size)
        return cast("concurrent.futures.Future[RecordMetadata]", future)

    def send_batch(self, topic: str, values: Any, keys: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None
                   ) -> concurrent.futures.Future[list[BatchMetadata]]:
        """The columnar fast path; see ``AsyncProducer.send_batch``."""
        if self._closed:
            raise ProducerClosedError("send_batch() after close(): create a new producer")
        engine = self._engine
        num_partitions = self._partition_count(topic)
        engine.check_partition(topic, partition, num_partitions)
        chunks = engine.plan_columns(topic, num_partitions, values, keys, partition,
                                     timestamp_ms)
        future: concurrent.futures.Future[list[BatchMetadata]] = concurrent.futures.Future()
        engine.append_chunks_blocking(topic, num_partitions, chunks, _Group(future))
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait for every outcome (``TimeoutError`` if not
        done within ``timeout`` seconds)."""
        if not self._closed:
            self._thread.run(self._engine.flush(), timeout=timeout)

    def partitions_for(self, topic: str) -> int:
        return self._partition_count(topic)

    def close(self, timeout: float | None = None) -> None:
        """Deliver buffered records (up to ``timeout`` s), close connections, stop the thread."""
        if self._closed:
            return
        if self._thread.is_loop_thread():
            raise RuntimeError(
                "Producer.close() was called from a delivery callback (the producer's own "
                "I/O thread); call it from your thread, or use flush() there")
        self._closed = True
        try:
            self._thread.run(self._engine.close(timeout))
        finally:
            self._thread.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
