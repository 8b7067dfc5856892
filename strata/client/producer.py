"""The Strata producer: batching, partitioning, idempotent retries, back-pressure.

Two faces over one engine (this module keeps only the faces):

- ``AsyncProducer`` for asyncio code: ``fut = await producer.send(...)`` returns an
  ``asyncio.Future`` that resolves to a ``RecordMetadata``; ``await producer.produce(...)``
  queues a record with no future (the per-record fast path, below).
- ``Producer`` for plain threads: ``fut = producer.send(...)`` returns a
  ``concurrent.futures.Future``; the engine runs on a private event loop thread
  (``EventLoopThread``). ``send`` appends to the batch in the caller's thread under a
  lock and wakes the loop only when a batch is created or filled, so a record costs
  no thread hop.

Both take ``(bootstrap_servers, **options)`` or one ``ProducerConfig``, validated once.
The engine is split by job, one private module each: ``_config`` (the settings),
``_accumulator`` (batches per partition, buffer memory, partitioning), ``_sender`` (the
event-loop task: requests, retries, outcomes, metadata), ``_idempotence`` (producer ids
and sequence numbers) and ``_delivery`` (results, client-side errors, their futures).

No future per record: ``produce``
    A future per record costs about as much as the rest of ``send`` (made in the
    caller's thread, completed with a ``RecordMetadata`` on the loop thread).
    ``produce`` takes the same record without one: ``on_delivery(metadata, error)``
    when given, and otherwise a failed record lands in the sender's failure ledger,
    which the next ``flush`` or ``close`` raises as ``DeliveryFailedError`` (once). A
    bare value for a topic whose sticky batch has room is appended under the lock with
    one subtraction (the batch's reserved room) and two list appends.

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
``DeliveryTimeoutError`` 1002, ``DeliveryFailedError`` 1003) are never sent on the
wire; they sit above every broker code so they cannot collide with one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from array import array
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, TypeAlias, Unpack, cast

import pyarrow as pa

from strata.client._accumulator import RECORD_OVERHEAD, Headers, Key, Value, Watcher
from strata.client._common import TopicPartition
from strata.client._config import ProducerConfig, ProducerOptions, config_of
from strata.client._delivery import (
    BatchMetadata,
    BufferFullError,
    DeliveryCallback,
    DeliveryFailedError,
    DeliveryFailure,
    DeliveryFuture,
    DeliveryTimeoutError,
    ProducerClosedError,
    RecordMetadata,
    SendBatchGroup,
)
from strata.client._schemas import SchemaSource, TopicSchemas, TypedValue
from strata.client._sender import Sender
from strata.client._sync import EventLoopThread
from strata.client._transactions import (
    AbortableTransactionError,
    FatalTransactionError,
    GroupMetadata,
    Transactions,
    TransactionStateError,
    TxnClientState,
)
from wire.errors import StrataError

# The blocking producer's per-record append in C (strata/client/_fastproduce.c), built
# by `make setup` (pyproject's ext-modules); without it, or on a free-threaded CPython
# (the C path's atomicity rests on the GIL), ``Producer.produce`` stays Python.
_FastProduce: Any = None
with contextlib.suppress(ImportError):
    from strata.client._fastproduce import AVAILABLE as _FAST_AVAILABLE
    from strata.client._fastproduce import FastProduce

    if _FAST_AVAILABLE:
        _FastProduce = FastProduce

__all__ = [
    "AbortableTransactionError",
    "AsyncProducer",
    "BatchMetadata",
    "BufferFullError",
    "DeliveryCallback",
    "DeliveryFailedError",
    "DeliveryFailure",
    "DeliveryTimeoutError",
    "FatalTransactionError",
    "GroupMetadata",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerOptions",
    "RECORD_OVERHEAD",
    "RecordMetadata",
    "TransactionStateError",
]

log = logging.getLogger("strata.client.producer")


# --------------------------------------------------------------------------- faces


#: A record's value: bytes (or text) for a bytes topic, a dict for a typed topic.
RecordValue: TypeAlias = Value | Mapping[str, Any]


def _typed_input(values: Any) -> bool:
    """Values for a typed topic: a pyarrow Table/RecordBatch, a struct column, or dicts."""
    if isinstance(values, pa.Table | pa.RecordBatch):
        return True
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return bool(pa.types.is_struct(values.type))
    return isinstance(values, list | tuple) and bool(values) and isinstance(values[0], Mapping)


class AsyncProducer:
    """The asyncio producer. Use ``async with AsyncProducer(...) as p:`` or ``start``/``close``.

    ``AsyncProducer(bootstrap_servers, **options)`` or ``AsyncProducer(config)`` with a
    ``ProducerConfig``. Every method must be called from the event loop the producer
    started on.
    """

    def __init__(self, bootstrap_servers: str | list[str] | ProducerConfig,
                 **options: Unpack[ProducerOptions]) -> None:
        self.config = config_of(ProducerConfig, bootstrap_servers, options)
        self._sender: Sender | None = None

    async def start(self) -> AsyncProducer:
        """Bind to the running loop and start the sender (``send`` does it implicitly)."""
        if self._sender is None:
            self._sender = Sender(self.config, asyncio.get_running_loop())
            self._sender.start()
        return self

    def _running(self) -> Sender:
        if self._sender is None:
            raise RuntimeError("call `await producer.start()` (or use `async with`) first")
        return self._sender

    async def _partition_count(self, topic: str, partition: int | None) -> int:
        """``topic``'s partition count (starting the producer if needed); ``ValueError``
        if ``partition`` is not one of them."""
        if self._sender is None:
            await self.start()
        sender = self._running()
        num_partitions = sender.cached_partition_count(topic) or \
            await sender.partition_count(topic)
        sender.accumulator.check_partition(topic, partition, num_partitions)
        return num_partitions

    async def send(self, topic: str, value: RecordValue, key: Key = None, headers: Headers = None,
                   partition: int | None = None, timestamp_ms: int | None = None
                   ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; return the future of its ``RecordMetadata``.

        Awaiting ``send`` waits only for metadata and buffer space (back-pressure);
        await the returned future for the broker's acknowledgement. A future per record
        costs about as much as the rest of ``send``: ``produce`` is the cheaper way when
        the outcome need not be awaited record by record.
        """
        if self._sender is not None and self._sender.transactions is not None:
            self._sender.transactions.tm.require_open("send()")
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if type(value) is not bytes and isinstance(value, Mapping):
            value = await self._typed_value(topic, value)
        sender = self._sender
        if sender is None or sender.accumulator.add(topic, value, key, headers, partition,
                                                    timestamp_ms, future, False) is not True:
            await self._add_slowly(topic, value, key, headers, partition, timestamp_ms, future)
        return future

    async def produce(self, topic: str, value: RecordValue, key: Key = None,
                      headers: Headers = None, partition: int | None = None,
                      timestamp_ms: int | None = None,
                      on_delivery: DeliveryCallback | None = None) -> None:
        """Queue one record with no future: the per-record fast path.

        ``on_delivery(metadata, error)`` (optional) runs on the loop once the record's
        batch is settled; exactly one of its arguments is ``None``. A record without a
        callback that fails is still heard: the next ``flush()`` or ``close()`` raises
        ``DeliveryFailedError`` naming it. Awaiting ``produce`` waits only for metadata
        and buffer space, as ``send`` does.
        """
        if self._sender is not None and self._sender.transactions is not None:
            self._sender.transactions.tm.require_open("produce()")
        if on_delivery is not None and not callable(on_delivery):
            raise _not_callable(on_delivery)
        if type(value) is not bytes and isinstance(value, Mapping):
            value = await self._typed_value(topic, value)
        sender = self._sender
        if sender is None or sender.accumulator.add(topic, value, key, headers, partition,
                                                    timestamp_ms, on_delivery,
                                                    False) is not True:
            await self._add_slowly(topic, value, key, headers, partition, timestamp_ms,
                                   on_delivery)

    async def _add_slowly(self, topic: str, value: Value, key: Key, headers: Headers,
                          partition: int | None, timestamp_ms: int | None,
                          watcher: Watcher | None) -> None:
        """``add`` once the producer runs, the topic's metadata is in and there is space."""
        if self._sender is None:
            await self.start()
        sender = self._running()
        deadline: float | None = None
        while True:
            added = sender.accumulator.add(topic, value, key, headers, partition, timestamp_ms,
                                           watcher, False)
            if added:
                return
            if added is None:
                await sender.partition_count(topic)  # raises for a topic that does not exist
            else:
                deadline = await sender.accumulator.wait_for_space(deadline)

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

        ``values``/``keys``: Arrow binary/string arrays or lists of bytes/str/None; for a
        typed topic a pyarrow Table, RecordBatch or struct column, a list of dicts (each
        checked and converted under the subject's latest version), or a ``TypedValue``
        holding values converted already (sent as they are; the broker checks them). With
        ``partition`` given, or no keys, no Python code runs per record: the columns are
        sliced into ``batch_size`` chunks (null keys follow the sticky partitioner,
        moving on after every chunk). Keyed records are hashed one by one and grouped by
        partition with Arrow filters. Each chunk is a wire batch of its own, except that
        chunks queued behind a partition's in-flight batch (under load) join the last
        queued one up to ``batch_size``. All records share ``timestamp_ms`` (default:
        now). The future resolves to one ``BatchMetadata`` per chunk (its own rows'
        first offset and count), in send order, or fails with the first error.
        """
        if self._sender is not None and self._sender.transactions is not None:
            self._sender.transactions.tm.require_open("send_batch()")
        num_partitions = await self._partition_count(topic, partition)
        sender = self._running()
        accumulator = sender.accumulator
        schema_id = None
        if isinstance(values, TypedValue):  # converted already, under a known schema id
            schema_id, values = values.schema_id, values.row
        elif _typed_input(values):
            schema_id, values = await self._topic_schemas().to_column(topic, values)
        chunks = accumulator.plan_columns(topic, num_partitions, values, keys, partition,
                                          timestamp_ms, schema_id)
        future: asyncio.Future[list[BatchMetadata]] = sender.loop.create_future()
        await accumulator.append_chunks_async(topic, num_partitions, chunks,
                                              SendBatchGroup(future))
        return future

    def _topic_schemas(self) -> TopicSchemas:
        sender = self._running()
        if sender.topic_schemas is None:
            sender.topic_schemas = TopicSchemas(SchemaSource(
                sender.cluster, request_timeout_ms=self.config.request_timeout_ms,
                retry_backoff_ms=self.config.retry_backoff_ms))
        return sender.topic_schemas

    async def _typed_value(self, topic: str, value: Mapping[str, Any]) -> TypedValue:
        if self._sender is None:
            await self.start()
        return await self._topic_schemas().typed_value(topic, value)

    # ------------------------------------------------------------------ transactions
    def _transactions(self) -> Transactions:
        sender = self._running()
        if sender.transactions is None:
            raise TransactionStateError(
                "this producer has no transactional_id: create it with "
                "AsyncProducer(..., transactional_id='...') to use transactions")
        return sender.transactions

    async def init_transactions(self, *, two_phase: bool = False,
                                keep_prepared: bool = False) -> None:
        """Register the transactional id with its coordinator (once, before the first
        transaction): any earlier producer with the id is fenced and its open transaction
        aborted. ``two_phase`` / ``keep_prepared``: docs/transactions.md, "Two-phase
        commit" (an open transaction survives its timeout and is handed back)."""
        if self._sender is None:
            await self.start()
        await self._transactions().init(two_phase=two_phase, keep_prepared=keep_prepared)

    async def begin_transaction(self) -> None:
        """Start a transaction: what is sent until ``commit_transaction`` becomes
        visible to read_committed consumers all at once, or never."""
        self._transactions().tm.begin()

    async def commit_transaction(self) -> None:
        """Flush, then commit: every record sent in the transaction becomes visible at
        once. ``AbortableTransactionError``: abort and run it again;
        ``FatalTransactionError``: close the producer."""
        await self._transactions().commit()

    async def abort_transaction(self) -> None:
        """Abort: nothing sent in the transaction becomes visible; the producer may
        begin the next one."""
        await self._transactions().abort()

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                          group_metadata: GroupMetadata) -> None:
        """Commit a consumer group's offsets (``{partition: next offset}``) inside the
        open transaction (consume-transform-produce: the input's position moves exactly
        when the output becomes visible). ``group_metadata``: the consumer's
        ``group_metadata()``; a member that left the group cannot commit."""
        await self._transactions().send_offsets(offsets, group_metadata)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncProducer]:
        """``async with producer.transaction():`` begins, commits on success and aborts
        on an exception (which then propagates)."""
        await self.begin_transaction()
        try:
            yield self
        except BaseException:
            transactions = self._transactions()
            if transactions.tm.state is not TxnClientState.FATAL_ERROR:
                with contextlib.suppress(StrataError):
                    await self.abort_transaction()
            raise
        await self.commit_transaction()

    async def flush(self) -> None:
        """Send everything buffered now, ignoring ``linger_ms``; wait for every outcome.

        Raises ``DeliveryFailedError`` if ``produce`` records without a callback failed
        since the last report (every failure is reported once).
        """
        if self._sender is not None:
            await self._sender.flush()

    async def partitions_for(self, topic: str) -> int:
        """Number of partitions of ``topic`` (from metadata)."""
        if self._sender is None:
            await self.start()
        return await self._running().partition_count(topic)

    async def close(self, timeout: float | None = None) -> None:
        """Deliver buffered records (up to ``timeout`` seconds), then close connections.

        Records still unacknowledged when the timeout expires fail with
        ``ProducerClosedError``. Raises ``DeliveryFailedError`` after closing if
        ``produce`` records without a callback failed unreported.
        """
        if self._sender is not None:
            await self._sender.close(timeout)

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            await self.close()
        except DeliveryFailedError as err:
            if exc_type is None:
                raise
            log.error("while the block raised: %s", err)  # do not hide the block's error


def _not_callable(on_delivery: object) -> TypeError:
    return TypeError(f"on_delivery must be a callable(metadata, error), not "
                     f"{type(on_delivery).__name__}; nothing was queued")


class Producer:
    """The synchronous producer: thread-safe, backed by a private event loop thread.

    ``Producer(bootstrap_servers, **options)`` or ``Producer(config)`` with a
    ``ProducerConfig``: the same settings as ``AsyncProducer``.
    """

    def __init__(self, bootstrap_servers: str | list[str] | ProducerConfig,
                 **options: Unpack[ProducerOptions]) -> None:
        self.config = config_of(ProducerConfig, bootstrap_servers, options)
        self._thread = EventLoopThread("strata-producer")
        try:
            self._sender = self._thread.run(self._make_sender(), timeout=30)
        except BaseException:
            self._thread.close()
            raise
        self._accumulator = self._sender.accumulator
        self._closed = False
        if _FastProduce is not None and self._sender.transactions is None \
                and type(self).produce is Producer.produce:
            # The common record's append in C (strata/client/_fastproduce.c); every
            # other call goes on to the method below, unchanged. Transactional
            # producers keep the method: each record checks the transaction's state.
            self.produce = _FastProduce(  # type: ignore[method-assign]
                self._accumulator.lock, self._accumulator.sticky_batches, time.time_ns,
                array, Producer.produce.__get__(self, Producer))

    async def _make_sender(self) -> Sender:
        sender = Sender(self.config, asyncio.get_running_loop())
        sender.start()
        return sender

    def _block_s(self) -> float:
        return self.config.max_block_ms / 1000 + 5

    def _partition_count(self, topic: str) -> int:
        cached = self._sender.cached_partition_count(topic)
        if cached is not None:
            return cached
        return self._thread.run(self._sender.partition_count(topic), timeout=self._block_s())

    def send(self, topic: str, value: RecordValue, key: Key = None, headers: Headers = None,
             partition: int | None = None, timestamp_ms: int | None = None
             ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; return the future of its ``RecordMetadata``.

        Blocks only for metadata of a new topic or for buffer space (``on_buffer_full``).
        ``produce`` is the cheaper way when the outcome need not be awaited per record.
        """
        if self._sender.transactions is not None:
            self._sender.transactions.tm.require_open("send()")
        future = DeliveryFuture()
        if type(value) is not bytes and isinstance(value, Mapping):
            value = self._typed_value(topic, value)
        if self._accumulator.add(topic, value, key, headers, partition, timestamp_ms, future,
                                 True) is not True:
            self._add_slowly(topic, value, key, headers, partition, timestamp_ms, future)
        return cast("concurrent.futures.Future[RecordMetadata]", future)

    def produce(self, topic: str, value: RecordValue, key: Key = None, headers: Headers = None,
                partition: int | None = None, timestamp_ms: int | None = None,
                on_delivery: DeliveryCallback | None = None) -> None:
        """Queue one record with no future: the per-record fast path.

        ``on_delivery(metadata, error)`` (optional) runs on the producer's I/O thread
        once the record's batch is settled; exactly one argument is ``None``; keep it
        short and do not block in it. A record without a callback that fails is still
        heard: the next ``flush()`` or ``close()`` raises ``DeliveryFailedError`` for
        it. Blocks only as ``send`` does.

        Where ``strata/client/_fastproduce.c`` is built (``make setup``), a producer
        without a ``transactional_id`` answers ``produce`` with a C callable first: a
        record of a str topic and a bytes value, with no key, headers, partition or
        timestamp, goes straight into its topic's open batch (about half the cost of
        this method); every other call comes here unchanged.
        """
        if self._sender.transactions is not None:
            self._sender.transactions.tm.require_open("produce()")
        if on_delivery is not None and not callable(on_delivery):
            raise _not_callable(on_delivery)
        if type(value) is not bytes and isinstance(value, Mapping):
            value = self._typed_value(topic, value)
        if self._accumulator.add(topic, value, key, headers, partition, timestamp_ms,
                                 on_delivery, True) is not True:
            self._add_slowly(topic, value, key, headers, partition, timestamp_ms, on_delivery)

    def _add_slowly(self, topic: str, value: Value, key: Key, headers: Headers,
                    partition: int | None, timestamp_ms: int | None, watcher: Watcher | None
                    ) -> None:
        """``add`` once the topic's metadata is in (fetched on the loop thread)."""
        while True:
            if self._closed:
                raise ProducerClosedError("send() after close(): create a new producer")
            self._thread.run(self._sender.partition_count(topic), timeout=self._block_s())
            if self._accumulator.add(topic, value, key, headers, partition, timestamp_ms,
                                     watcher, True):
                return

    def send_batch(self, topic: str, values: Any, keys: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None
                   ) -> concurrent.futures.Future[list[BatchMetadata]]:
        """The columnar fast path; see ``AsyncProducer.send_batch``."""
        if self._sender.transactions is not None:
            self._sender.transactions.tm.require_open("send_batch()")
        if self._closed:
            raise ProducerClosedError("send_batch() after close(): create a new producer")
        accumulator = self._sender.accumulator
        num_partitions = self._partition_count(topic)
        accumulator.check_partition(topic, partition, num_partitions)
        schema_id = None
        if isinstance(values, TypedValue):  # converted already, under a known schema id
            schema_id, values = values.schema_id, values.row
        elif _typed_input(values):
            schema_id, values = self._thread.run(self._to_column(topic, values),
                                                 timeout=self._block_s())
        chunks = accumulator.plan_columns(topic, num_partitions, values, keys, partition,
                                          timestamp_ms, schema_id)
        future: concurrent.futures.Future[list[BatchMetadata]] = concurrent.futures.Future()
        accumulator.append_chunks_blocking(topic, num_partitions, chunks,
                                           SendBatchGroup(future))
        return future

    async def _topic_schemas(self) -> TopicSchemas:
        if self._sender.topic_schemas is None:
            self._sender.topic_schemas = TopicSchemas(SchemaSource(
                self._sender.cluster, request_timeout_ms=self.config.request_timeout_ms,
                retry_backoff_ms=self.config.retry_backoff_ms))
        return self._sender.topic_schemas

    async def _to_column(self, topic: str, values: Any) -> tuple[int, Any]:
        return await (await self._topic_schemas()).to_column(topic, values)

    async def _typed_value_async(self, topic: str, value: Mapping[str, Any]) -> TypedValue:
        return await (await self._topic_schemas()).typed_value(topic, value)

    def _typed_value(self, topic: str, value: Mapping[str, Any]) -> TypedValue:
        return self._thread.run(self._typed_value_async(topic, value), timeout=self._block_s())

    # ------------------------------------------------------------------ transactions
    def _transactions(self) -> Transactions:
        if self._sender.transactions is None:
            raise TransactionStateError(
                "this producer has no transactional_id: create it with "
                "Producer(..., transactional_id='...') to use transactions")
        return self._sender.transactions

    def init_transactions(self, *, two_phase: bool = False, keep_prepared: bool = False
                          ) -> None:
        """See ``AsyncProducer.init_transactions``."""
        transactions = self._transactions()
        self._thread.run(transactions.init(two_phase=two_phase, keep_prepared=keep_prepared),
                         timeout=self._block_s())

    def begin_transaction(self) -> None:
        """See ``AsyncProducer.begin_transaction``."""
        transactions = self._transactions()

        async def begin() -> None:
            transactions.tm.begin()

        self._thread.run(begin())

    def commit_transaction(self) -> None:
        """See ``AsyncProducer.commit_transaction``."""
        self._thread.run(self._transactions().commit())

    def abort_transaction(self) -> None:
        """See ``AsyncProducer.abort_transaction``."""
        self._thread.run(self._transactions().abort())

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                    group_metadata: GroupMetadata) -> None:
        """See ``AsyncProducer.send_offsets_to_transaction``."""
        self._thread.run(self._transactions().send_offsets(offsets, group_metadata),
                         timeout=self._block_s())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Producer]:
        """``with producer.transaction():`` begins, commits on success and aborts on an
        exception (which then propagates)."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self._transactions().tm.state is not TxnClientState.FATAL_ERROR:
                with contextlib.suppress(StrataError):
                    self.abort_transaction()
            raise
        self.commit_transaction()

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait for every outcome (``TimeoutError`` if not
        done within ``timeout`` seconds); ``DeliveryFailedError`` as ``AsyncProducer.flush``."""
        if not self._closed:
            self._thread.run(self._sender.flush(), timeout=timeout)

    def partitions_for(self, topic: str) -> int:
        return self._partition_count(topic)

    def close(self, timeout: float | None = None) -> None:
        """Deliver buffered records (up to ``timeout`` s), close connections, stop the thread;
        ``DeliveryFailedError`` as ``AsyncProducer.close``."""
        if self._closed:
            return
        if self._thread.is_loop_thread():
            raise RuntimeError(
                "Producer.close() was called from a delivery callback (the producer's own "
                "I/O thread); call it from your thread, or use flush() there")
        self._closed = True
        try:
            self._thread.run(self._sender.close(timeout))
        finally:
            self._thread.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.close()
        except DeliveryFailedError as err:
            if exc_type is None:
                raise
            log.error("while the block raised: %s", err)  # do not hide the block's error
