"""The producer's sender: the event-loop task that sends batches and settles them.

Job: drain the accumulator's ready partitions, encode each head batch once (numbered by
``Idempotence`` when on), pack the batches of partitions led by the same broker into one
``ProduceRequest``, and turn every answer into an outcome: acknowledged (the batch's
futures get their ``RecordMetadata`` / ``BatchMetadata``), retried (retriable errors,
after a metadata refresh and ``retry_backoff_ms`` doubling up to 1 s, while ``retries``
and ``delivery_timeout_ms`` allow), or failed with the typed error. It also owns the
producer's ``Cluster`` (partition counts for ``send``), ``flush`` and ``close``. Both faces
run one ``Sender``; the blocking face runs it on a private event loop thread.

Invariants:

- At most ONE batch per partition is in flight; a failed batch stays at the head of its
  partition's queue and is retried (same bytes) before anything behind it is sent, so
  per-partition order holds under any pattern of retries, with or without idempotence.
  ``max_in_flight`` bounds the produce requests outstanding per broker.
- Every batch is settled exactly once (``Accumulator.release``): acknowledged, failed, or
  failed with ``ProducerClosedError`` when ``close`` gives up on it.
- ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (the broker lost a batch it had acknowledged) fails
  every pending batch of that partition, which then continues with a fresh producer id.

Thread-safety: everything here runs on ``loop``. The accumulator's lock is taken only
inside its own methods, and futures are completed outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final, cast

import pyarrow as pa

from strata.client._accumulator import (
    Accumulator,
    Batch,
    PartitionQueue,
    Wakeup,
    native_columns,
)
from strata.client._cluster import Cluster
from strata.client._config import ProducerConfig
from strata.client._delivery import (
    BatchMetadata,
    DeliveryCallback,
    DeliveryFailedError,
    DeliveryFailure,
    DeliveryFuture,
    DeliveryTimeoutError,
    ProducerClosedError,
    RecordMetadata,
    call_back,
    complete_sync,
    reject,
    resolve,
)
from strata.client._idempotence import Idempotence
from strata.client._schemas import TopicSchemas
from strata.client._transactions import Transactions
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
    RequestTimedOutError,
    SchemaMismatchError,
    StrataError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from wire.protocol import (
    ApiKey,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    group_by_topic,
)
from wire.record_batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, warm_up_encoder

__all__ = ["Sender"]

log = logging.getLogger("strata.client.producer")

#: Upper bound on the batch bytes packed into one ProduceRequest (far below the broker's
#: ``socket.request.max.bytes`` of 100 MiB; one batch always fits whatever its size).
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
_new_tuple: Final = tuple.__new__


def _settle(batch: Batch, results: list[RecordMetadata] | None,
            error: StrataError | None) -> None:
    """Tell each of ``batch``'s watchers (futures; callbacks are ``_call_back_ok``'s)
    its record's outcome: ``results[i]`` for the i-th watcher, or ``error`` for all.
    Asyncio futures one by one; the batch's ``DeliveryFuture``s together, under their
    shared condition."""
    assert batch.watchers is not None
    sync_futures: list[DeliveryFuture] = []
    sync_results: list[RecordMetadata] = []
    for i, (_, watcher) in enumerate(batch.watchers):
        meta = results[i] if results is not None else None
        if isinstance(watcher, asyncio.Future):
            if meta is not None:
                resolve(watcher, meta)
            else:
                reject(watcher, error)  # type: ignore[arg-type]  # error when no results
        else:
            sync_futures.append(cast(DeliveryFuture, watcher))  # the only kind made
            if meta is not None:
                sync_results.append(meta)
    if sync_futures and batch.condition is not None:
        complete_sync(batch.condition, sync_futures,
                      sync_results if results is not None else None, error)


def _call_back_ok(batch: Batch, base_offset: int, log_append_time: int) -> None:
    """Run the ``on_delivery`` callbacks of an acknowledged ``batch``, in record order.

    The per-record loop of a ``produce`` with a callback on every record, so it is kept
    to one ``RecordMetadata`` and one call a record (no wrapper per call: the loop
    resumes after a callback that raised, which is logged)."""
    callbacks = batch.callbacks
    assert callbacks is not None
    topic, partition = batch.topic, batch.partition
    count = len(callbacks)
    if base_offset < 0 or log_append_time >= 0 or batch.explicit_ms is not None:
        # acks=0 (no offsets), LogAppendTime, or timestamps given by the caller.
        _call_back_each(callbacks, _metadata(batch, range(count), base_offset,
                                             log_append_time), None)
        return
    stamps, new, metadata = batch.timestamps, _new_tuple, RecordMetadata
    start = 0
    while start < count:
        i = start
        try:
            for i in range(start, count):
                callback = callbacks[i]
                if callback is not None:
                    callback(new(metadata, (topic, partition, base_offset + i,
                                            stamps[i] // 1_000_000)), None)
            return
        except Exception:
            log.exception("exception in on_delivery callback %r", callbacks[i])
            start = i + 1


def _metadata(batch: Batch, indexes: Iterable[int], base_offset: int,
              log_append_time: int) -> list[RecordMetadata]:
    """The ``RecordMetadata`` of records ``indexes`` of an acknowledged ``batch``
    (``tuple.__new__``: a NamedTuple's own ``__new__`` costs three times as much)."""
    topic, partition = batch.topic, batch.partition
    fixed = log_append_time if log_append_time >= 0 and base_offset >= 0 else None
    return [_new_tuple(RecordMetadata, (
        topic, partition, -1 if base_offset < 0 else base_offset + i,
        fixed if fixed is not None else batch.timestamp_ms(i))) for i in indexes]


def _call_back_failed(batch: Batch, error: StrataError) -> None:
    """Run the ``on_delivery`` callbacks of a failed ``batch`` with ``error``."""
    assert batch.callbacks is not None
    _call_back_each(batch.callbacks, None, error)


def _call_back_each(callbacks: list[DeliveryCallback | None],
                    results: list[RecordMetadata] | None,
                    error: StrataError | None) -> None:
    for i, callback in enumerate(callbacks):
        if callback is not None:
            call_back(callback, results[i] if results is not None else None, error)


#: How long ``send`` keeps asking for metadata of a topic no broker knows.
UNKNOWN_TOPIC_GRACE_MS: Final = 500


class Sender:
    """The shared engine of both faces: accumulator, idempotence and the sending task."""

    def __init__(self, config: ProducerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.cluster = Cluster(config.bootstrap_servers, client_id=config.client_id,
                               request_timeout_ms=config.request_timeout_ms,
                               retry_backoff_ms=config.retry_backoff_ms,
                               security=config.security)
        self.wakeup = Wakeup(loop)
        self.accumulator = Accumulator(config, self.wakeup, self.cluster.topics)
        # Typed topics' schemas, made at the first dict or Table sent (producer.py).
        self.topic_schemas: TopicSchemas | None = None
        self.idempotence = Idempotence(self.cluster, config, self.wakeup) \
            if config.idempotent else None
        self.transactions: Transactions | None = None
        if config.transactional_id is not None:
            self.transactions = Transactions(self)
            assert self.idempotence is not None
            txn_ready, id_ready = self.transactions.ready, self.idempotence.ready
            self._has_id: Callable[[tuple[str, int]], bool] | None = \
                lambda key: txn_ready(key) and id_ready(key)
        else:
            self._has_id = self.idempotence.ready if self.idempotence is not None else None
        self._stopping = False
        self._flushing = 0
        self._task: asyncio.Task[None] | None = None
        self._node_in_flight: dict[int, int] = {}
        self._request_tasks: set[asyncio.Task[None]] = set()
        self._refresh_task: asyncio.Task[None] | None = None
        self._last_refresh = 0.0
        self._closed = False
        #: Failed batches of ``produce`` records without a callback, not yet reported.
        self.failures: list[DeliveryFailure] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the sender task; must run on ``loop``."""
        if self._task is not None:
            return
        self.wakeup.start()
        self._task = self.loop.create_task(self._run(), name="strata-producer-sender")
        if not native_columns():
            # pa.array imports pandas at its first Python list (0.4-0.7 s): pay it on
            # a worker thread now, beside the first metadata round trip. With the C
            # helper, records of bytes (and keys) never need it; headers and typed
            # values still do, and pay it at their first batch.
            self.loop.run_in_executor(None, warm_up_encoder)
        if self.idempotence is not None:
            self.idempotence.start()

    async def flush(self, report: bool = True) -> None:
        """Send every batch that exists now (ignoring ``linger_ms``) and wait for outcomes.

        With ``report``, then raise ``DeliveryFailedError`` for the ``produce`` records
        without a callback that failed since the last report (``report_failures``).
        """
        self._flushing += 1
        try:
            waiters: list[asyncio.Future[None]] = []
            for batch in self.accumulator.batches():
                if not batch.finished:
                    waiter = self.loop.create_future()
                    batch.done_waiters.append(waiter)
                    waiters.append(waiter)
            self.wakeup.set()
            if waiters:
                await asyncio.gather(*waiters)
        finally:
            self._flushing -= 1
        if report:
            self.report_failures()

    def report_failures(self) -> None:
        """Raise ``DeliveryFailedError`` for the unreported failures of ``produce`` records
        that had no callback, and forget them (each failure is reported once)."""
        if self.failures:
            failures, self.failures = self.failures, []
            raise DeliveryFailedError(failures)

    async def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (within ``timeout`` seconds), then release everything;
        ``DeliveryFailedError`` at the end if ``produce`` records failed unheard."""
        if self._closed:
            return
        self.accumulator.close()
        try:
            await asyncio.wait_for(self.flush(report=False), timeout)
        except TimeoutError:
            pass
        finally:
            self._stopping = True
            self.wakeup.set()
            if self._task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            id_tasks = self.idempotence.tasks() if self.idempotence is not None else []
            tasks = [*self._request_tasks, self._refresh_task, *id_tasks]
            for task in tasks:
                if task is not None and not task.done():
                    task.cancel()
            for task in tasks:
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            for batch in self.accumulator.take_all():
                self._finish_failed(None, batch, ProducerClosedError(
                    f"the producer was closed before {batch.topic}-{batch.partition} "
                    f"acknowledged {batch.count} record(s); they may not have been written"))
            await self.cluster.close()
            self._closed = True
        self.report_failures()

    # ------------------------------------------------------------------ transactions
    def use_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """The transaction coordinator's producer id and epoch (after InitProducerId and
        each EndTxn): sequences start again at 0."""
        assert self.idempotence is not None
        self.idempotence.use(producer_id, producer_epoch)
        self.wakeup.set()

    def fail_unsent(self, error: StrataError) -> None:
        """Fail every batch not sent yet (an abort drops them; the ones in flight finish
        first)."""
        for st, batch in self.accumulator.take_unsent():
            self._finish_failed(st, batch, error)

    def fail_transaction_batches(self, error: StrataError) -> None:
        """The transaction cannot commit: what was not sent yet will never be."""
        self.fail_unsent(error)

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
            backoff = self.config.backoff_s(attempt)
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
        topics = self.accumulator.topics()
        try:
            if topics:
                await self.cluster.refresh(topics)
        except (StrataError, OSError, TimeoutError) as err:
            log.debug("metadata refresh failed: %s", err)
        self.wakeup.set()

    # ------------------------------------------------------------------ sending
    async def _run(self) -> None:
        event = self.wakeup.event
        assert event is not None
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
        ready, next_wake, expired = self.accumulator.ready(now, self._flushing > 0,
                                                           self._has_id)
        for st, batch in expired:
            self._finish_failed(st, batch, DeliveryTimeoutError(
                f"{batch.count} record(s) for {batch.topic}-{batch.partition} were not "
                f"acknowledged within delivery_timeout_ms={self.config.delivery_timeout_ms}"
                + (f"; last error: {batch.last_error}" if batch.last_error else ""),
                batch.last_error))
        if ready:
            next_wake = self._dispatch(ready, now, next_wake)
        return next_wake

    def _dispatch(self, ready: list[PartitionQueue], now: float,
                  next_wake: float | None) -> float | None:
        """Encode head batches and send one ProduceRequest per leader (within limits)."""
        by_node: dict[int, list[PartitionQueue]] = {}
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
                batches: list[Batch] = []
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

    def _encode(self, st: PartitionQueue, batch: Batch) -> bool:
        """Encode ``batch`` once, numbering it when idempotent; ``False`` if it failed."""
        if batch.encoded is not None:
            return True
        compression = self.config.compression
        try:
            if self.idempotence is not None:
                stamp = self.idempotence.stamp(st.key, batch.count)
                if stamp is None:
                    return False
                batch.encoded = batch.encode(compression, *stamp,
                                             transactional=self.transactions is not None)
                batch.base_sequence = stamp[2]
                self.idempotence.advance(st.key, batch.count)
            else:
                batch.encoded = batch.encode(compression, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
                                             NO_SEQUENCE)
        except (StrataError, pa.ArrowException, TypeError, ValueError) as err:
            error = err if isinstance(err, StrataError) else InvalidRecordBatchError(
                f"cannot encode {batch.count} record(s) for {batch.topic}-{batch.partition}: "
                f"{err}")
            self._finish_failed(st, batch, error)
            return False
        return True

    async def _send(self, node: int, batches: list[Batch]) -> None:
        config = self.config
        for batch in batches:
            batch.attempts += 1
        topics = group_by_topic((b.topic, ProducePartition(b.partition, b.encoded))
                                for b in batches)
        request = ProduceRequest(config.acks, config.request_timeout_ms,
                                 [ProduceTopic(name, parts) for name, parts in topics.items()],
                                 config.transactional_id)
        version = 1 if config.transactional_id is not None else 0
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
                    connection.request(ApiKey.PRODUCE, request, version=version),
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
                st = self.accumulator.partitions.get((batch.topic, batch.partition))
                if st is not None:
                    st.in_flight = False
            self.wakeup.set()

    # ------------------------------------------------------------------ outcomes
    def _retry_all(self, batches: list[Batch], error: StrataError) -> None:
        for batch in batches:
            self._on_error(batch, error)

    def _on_error(self, batch: Batch, error: StrataError) -> None:
        """Retry ``batch`` (same bytes) if allowed, else fail it (loop thread)."""
        st = self.accumulator.partitions[(batch.topic, batch.partition)]
        now = time.monotonic()
        batch.last_error = error
        if isinstance(error, OutOfOrderSequenceError):
            self._fail_partition(st, error)
            return
        if isinstance(error, SchemaMismatchError) and self.topic_schemas is not None:
            self.topic_schemas.writer_refused(batch.topic)
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
            batch.retry_at = min(now + self.config.backoff_s(batch.attempts), batch.deadline)
            log.debug("%s-%d: retrying %d record(s) after %s", batch.topic, batch.partition,
                      batch.count, error)
            return
        self._finish_failed(st, batch, error)

    def _fail_partition(self, st: PartitionQueue, error: OutOfOrderSequenceError) -> None:
        """OUT_OF_ORDER_SEQUENCE: every pending batch of ``st`` fails; fresh id after."""
        pending = self.accumulator.pending(st)
        log.error("%s-%d: %s; failing %d pending batch(es)", *st.key, error, len(pending))
        for batch in pending:
            self._finish_failed(st, batch, OutOfOrderSequenceError(
                f"{batch.topic}-{batch.partition}: the broker reported a sequence gap "
                f"({error.message}); an earlier acknowledged batch of this partition is "
                f"missing, so these {batch.count} record(s) were not written; the producer "
                "continues with a new producer id"))

    def _finish_ok(self, batch: Batch, base_offset: int, log_append_time: int) -> None:
        st = self.accumulator.partitions.get((batch.topic, batch.partition))
        if not self.accumulator.release(st, batch):
            return
        topic, partition = batch.topic, batch.partition
        if batch.members is not None:
            for group, index, start, rows in batch.members:
                group.parts[index] = BatchMetadata(
                    topic, partition, base_offset + start, rows, log_append_time)
                group.completed += 1
                group.maybe_finish()
        else:
            if batch.watchers:
                _settle(batch, _metadata(batch, (index for index, _ in batch.watchers),
                                         base_offset, log_append_time), None)
            if batch.callbacks:
                _call_back_ok(batch, base_offset, log_append_time)
        self._done(batch)

    def _finish_failed(self, st: PartitionQueue | None, batch: Batch,
                       error: StrataError) -> None:
        if not self.accumulator.release(st, batch):
            return
        if st is not None and batch.base_sequence != NO_SEQUENCE \
                and self.idempotence is not None:
            # Outcome unknown or sequence consumed: restart this partition's numbering.
            self.idempotence.restart(st.key)
        if self.transactions is not None:
            self.transactions.batch_failed(error)
        if batch.members is not None:
            for group, *_ in batch.members:
                if not group.failed:
                    group.failed = True
                    reject(group.future, error)
                    log.warning("%s-%d: send_batch failed: %s", batch.topic, batch.partition,
                                error)
        else:
            log.warning("%s-%d: %d record(s) failed: %s", batch.topic, batch.partition,
                        batch.count, error)
            if batch.watchers:
                _settle(batch, None, error)
            if batch.callbacks:
                _call_back_failed(batch, error)
            unheard = batch.unwatched()
            if unheard:
                self.failures.append(
                    DeliveryFailure(batch.topic, batch.partition, unheard, error))
        self._done(batch)

    @staticmethod
    def _done(batch: Batch) -> None:
        for waiter in batch.done_waiters:
            resolve(waiter, None)
        batch.done_waiters.clear()
        batch.watchers = batch.callbacks = None
