"""The transaction coordinator: transactional ids, their producer ids and epochs, and the
completion of every transaction (docs/transactions.md).

Where a transactional id lives
    Id ``T`` belongs to partition ``java_hash(T) mod N`` of the internal, replicated,
    compacted topic ``__transaction_state`` (N = ``transaction.state.log.num.partitions``,
    fixed at its creation; Java's ``String.hashCode``, as Kafka, so every broker agrees).
    The leader of that partition is T's coordinator, and its leader epoch is the
    *coordinator epoch* carried by every marker it writes. One record per id (key: the
    id, value: ``brokers/transaction_state.py``'s ``TxnRecord`` as JSON), written with
    acks=all before the request that caused it is answered; compaction keeps the latest.

What runs where
    ``TxnMetadata`` (pure, ``transaction_state.py``) decides every transition. This
    module persists them (``_persist``: the record is pending, written acks=all, then
    current; a failed write changes nothing), answers, and drives the markers: once a
    PREPARE_COMMIT / PREPARE_ABORT record is persisted, a completion task sends
    WriteTxnMarkers to the leader of every partition of the transaction (retrying a
    moved or unavailable leader; a deleted partition counts as done) and then persists
    COMPLETE_*. A broker that becomes the leader of a ``__transaction_state`` partition
    (failover, reassignment) replays it before it answers for its ids, and at the latest
    at the timeout loop's next pass (or a ListTransactions) without waiting for a
    request, and starts a completion task for every transaction it finds in a PREPARE
    state; ONGOING ones are left to their timeout.

Background work: every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``
the open transactions past their ``transaction_timeout_ms`` (never a two-phase one) are
aborted with a fenced epoch; ids idle for ``transactional.id.expiration.ms`` are
forgotten (a tombstone).

Verification (KIP-890 part 1): a partition leader asks ``verify`` before appending the
first transactional batch of a producer; locally when this broker is the coordinator,
else with AddPartitionsToTxn(verify_only) to the coordinator.

Thread-safety: the broker's event loop only. Requests to one transactional id never
interleave a transition: each computes its step and marks it pending without an await in
between; a concurrent one then gets CONCURRENT_TRANSACTIONS (the clients retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from brokers.internal_topics import KeyedTopic, append_replicated, create_internal_topic
from brokers.transaction_state import (
    Step,
    TxnMetadata,
    TxnRecord,
    TxnState,
    check_timeout,
    decode_record,
    encode_key,
    encode_record,
)
from wire.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    NetworkError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    StrataError,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from wire.protocol import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    ApiKey,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListedTransaction,
    ListTransactionsRequest,
    ListTransactionsResponse,
    TxnMarker,
    TxnPartitionResult,
    TxnTopic,
    TxnTopicResult,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from wire.record_batch import batches_to_table, build_batch

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.coordination import ZooKeeperClient
    from brokers.partition import Partition
    from brokers.services import InternalTopicHost, MetadataCache, PartitionRegistry
    from wire.connection import BrokerConnection

__all__ = ["TXN_TOPIC", "TransactionCoordinator", "java_hash", "txn_partition"]

log = logging.getLogger("strata.brokers.transactions")

TXN_TOPIC: Final = "__transaction_state"
_SEGMENT_BYTES: Final = 100 * 1024 * 1024
_WRITE_TIMEOUT_S: Final = 10.0
_LOAD_READ_BYTES: Final = 4 << 20
_MARKER_TIMEOUT_S: Final = 35.0
_MARKER_BACKOFF_S: Final = (0.02, 0.1, 0.5, 1.0)
_EXPIRY_INTERVAL_S: Final = 600.0
_VERIFY_TIMEOUT_S: Final = 5.0
#: How long an AddPartitionsToTxn waits for the previous transaction to complete
#: (``_settled``); well below a client's request timeout.
_SETTLE_WAIT_S: Final = 2.0
_PREPARE_STATES: Final = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
_LOGGED_ATTEMPTS: Final = (0, 5)

PartitionKey = tuple[str, int]
#: Writes a marker request locally (the replica manager's ``write_markers``).
LocalMarkers = Callable[[WriteTxnMarkersRequest], Awaitable[WriteTxnMarkersResponse]]


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, int32 wrap-around)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def txn_partition(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition of an id: ``abs(java_hash) mod N`` (Kafka's
    ``Utils.abs``: the one int32 whose absolute value overflows maps to 0)."""
    h = java_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@dataclass(slots=True)
class _Shard:
    """The ids of one ``__transaction_state`` partition this broker leads."""

    partition: int
    epoch: int  # the partition's leader epoch: the coordinator epoch of its markers
    txns: dict[str, TxnMetadata] = field(default_factory=dict)
    completions: set[asyncio.Task[None]] = field(default_factory=set)
    #: Set (and replaced) whenever a state write of one of its ids ends: what a request
    #: parked by ``_settled`` waits for.
    changed: asyncio.Event = field(default_factory=asyncio.Event)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TransactionCoordinator:
    """Coordinates the transactional ids whose ``__transaction_state`` partitions this
    broker leads (see the module docstring)."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, zookeeper: ZooKeeperClient, *,
                 host: InternalTopicHost, next_producer_id: Callable[[], Awaitable[int]],
                 local_markers: LocalMarkers) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.zookeeper = zookeeper
        self.host = host
        self._next_producer_id = next_producer_id
        self._local_markers = local_markers
        self._shards: dict[int, _Shard] = {}
        self._loading: dict[int, asyncio.Lock] = {}
        self._spare_ids: list[int] = []
        self._topic = KeyedTopic(TXN_TOPIC, "transactional id", cluster, txn_partition,
                                 self._create_topic)
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: dict[int, BrokerConnection] = {}
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._timeout_loop()))

    async def stop(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for shard in self._shards.values():
            tasks += shard.completions
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for connection in self._connections.values():
            with contextlib.suppress(Exception):
                await connection.close()
        self._connections.clear()

    # ------------------------------------------------------------------ FindCoordinator
    async def find(self, transactional_id: str, listener: str = "") -> tuple[int, str, int]:
        """(node id, host, port on ``listener``) of the id's coordinator."""
        self._check_id(transactional_id)
        return await self._topic.find(transactional_id, listener)

    async def _create_topic(self) -> None:
        await create_internal_topic(
            TXN_TOPIC, self.config.transaction_state_log_num_partitions, config=self.config,
            cluster=self.cluster, zookeeper=self.zookeeper, host=self.host,
            topic_config={"segment.bytes": str(_SEGMENT_BYTES),
                          "min.insync.replicas": str(
                              min(2, self.config.offsets_topic_replication_factor))})

    @staticmethod
    def _check_id(transactional_id: str) -> None:
        if not transactional_id:
            raise InvalidRequestError("a transactional id must not be empty")

    # ------------------------------------------------------------------ shards
    def _leader_partition(self, p: int) -> Partition:
        partition = self.registry.hosted.get((TXN_TOPIC, p))
        if partition is None or not partition.is_leader or partition.fenced:
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not lead {TXN_TOPIC}-{p}; find the "
                "transaction coordinator again (FindCoordinator with key_type 1)")
        return partition

    async def _shard_of(self, transactional_id: str) -> _Shard:
        self._check_id(transactional_id)
        topic = self.cluster.topics.get(TXN_TOPIC)
        if topic is None:
            raise CoordinatorNotAvailableError(
                f"{TXN_TOPIC} does not exist yet; send FindCoordinator (key_type 1) first")
        return await self._load(txn_partition(transactional_id, topic.partition_count))

    async def _load(self, p: int) -> _Shard:
        partition = self._leader_partition(p)
        shard = self._shards.get(p)
        if shard is not None and shard.epoch == partition.leader_epoch:
            return shard
        lock = self._loading.setdefault(p, asyncio.Lock())
        async with lock:
            partition = self._leader_partition(p)
            shard = self._shards.get(p)
            if shard is not None and shard.epoch == partition.leader_epoch:
                return shard
            if shard is not None:  # an older leadership of ours: its work is void
                for task in shard.completions:
                    task.cancel()
            started = time.monotonic()
            shard = _Shard(p, partition.leader_epoch)
            records: dict[str, TxnRecord | None] = {}
            offset = partition.log.log_start_offset
            end = partition.log.log_end_offset
            while offset < end:
                chunk = partition.log.read(offset, _LOAD_READ_BYTES)
                if chunk is None or chunk.next_offset <= offset:
                    break
                data = await asyncio.to_thread(chunk.read_bytes)
                for key, value in await asyncio.to_thread(self._decode, data, p, offset):
                    records[key] = value
                offset = chunk.next_offset
            for txn_id, record in records.items():
                if record is not None:
                    shard.txns[txn_id] = TxnMetadata(record)
            self._shards[p] = shard
            prepared = [m for m in shard.txns.values()
                        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
            for meta in prepared:
                self._complete_later(shard, meta)
            log.info("loaded %s-%d at coordinator epoch %d: %d transactional ids, %d "
                     "transaction(s) to complete, in %.3f s", TXN_TOPIC, p, shard.epoch,
                     len(shard.txns), len(prepared), time.monotonic() - started)
            return shard

    async def _load_led(self, *, strict: bool = False) -> None:
        """Load every ``__transaction_state`` partition this broker leads and has not
        loaded at its current leader epoch. A shard is otherwise loaded by the first
        request for one of its ids; ListTransactions (``find-hanging`` relies on it
        listing every open transaction) and the timeout loop (which completes the
        prepared transactions a new coordinator finds, and aborts the timed-out ones)
        must not wait for a client to ask. ``strict``: raise COORDINATOR_LOAD_IN_PROGRESS
        for a partition the metadata says this broker leads but that it cannot load yet
        (its replica still opening), instead of leaving its ids out."""
        topic = self.cluster.topics.get(TXN_TOPIC)
        if topic is None:
            return
        for p in range(topic.partition_count):
            state = self.cluster.partition_states.get((TXN_TOPIC, p))
            partition = self.registry.hosted.get((TXN_TOPIC, p))
            if state is None or state.leader != self.broker_id:
                continue
            shard = self._shards.get(p)
            if partition is not None and shard is not None and \
                    shard.epoch == partition.leader_epoch:
                continue
            try:
                await self._load(p)
            except (StrataError, OSError) as err:
                if strict:
                    raise CoordinatorLoadInProgressError(
                        f"{TXN_TOPIC}-{p} is not loaded on broker {self.broker_id} yet "
                        f"({err}); retry shortly") from err
                log.info("%s-%d not loaded: %s", TXN_TOPIC, p, err)

    @staticmethod
    def _decode(data: bytes, p: int, offset: int) -> list[tuple[str, TxnRecord | None]]:
        table = batches_to_table(data, topic=TXN_TOPIC, partition=p, start_offset=offset)
        out: list[tuple[str, TxnRecord | None]] = []
        for key, value in zip(table.column("key").to_pylist(),
                              table.column("value").to_pylist(), strict=True):
            if key is None:
                continue
            try:
                out.append(decode_record(key, value))
            except (ValueError, KeyError, TypeError) as err:
                log.error("%s-%d: skipping an unreadable record %r: %r", TXN_TOPIC, p,
                          key[:200], err)
        return out

    async def _persist(self, shard: _Shard, meta: TxnMetadata, record: TxnRecord, *,
                       fence: bool = False) -> None:
        """Write ``record`` (acks=all) and make it current; on failure nothing changed."""
        meta.begin(record)
        try:
            await self._write_state(shard, meta, record, fence)
        finally:
            changed, shard.changed = shard.changed, asyncio.Event()
            changed.set()

    async def _write_state(self, shard: _Shard, meta: TxnMetadata, record: TxnRecord,
                           fence: bool) -> None:
        try:
            partition = self._leader_partition(shard.partition)
            if partition.leader_epoch != shard.epoch or \
                    self._shards.get(shard.partition) is not shard:
                raise NotCoordinatorError(
                    f"{TXN_TOPIC}-{shard.partition} changed leader epoch; find the "
                    "transaction coordinator again")
            batch = build_batch([encode_record(record)],
                                keys=[encode_key(record.transactional_id)])
            await append_replicated(partition, batch, what="the transaction state",
                                    timeout_s=_WRITE_TIMEOUT_S)
        except BaseException:
            meta.abandon(fence_failed=fence)
            raise
        if self._shards.get(shard.partition) is not shard:
            meta.abandon()
            raise NotCoordinatorError(
                f"{TXN_TOPIC}-{shard.partition} moved while the state was written; find "
                "the transaction coordinator again")
        meta.complete(record)

    async def _settled(self, shard: _Shard, meta: TxnMetadata) -> None:
        """Wait (at most ``_SETTLE_WAIT_S``) while ``meta`` is between states: a state
        write in flight, or the previous transaction's markers still being written.

        A producer begins its next transaction as soon as EndTxn is answered, which is
        once PREPARE_COMMIT is durable; its first AddPartitionsToTxn then arrives while
        the markers are written. Kafka answers CONCURRENT_TRANSACTIONS and the client
        retries after 20 ms, every transaction; parked here it is answered the moment
        the transaction completes (a marker round trip). After the wait the state
        machine decides as before (CONCURRENT_TRANSACTIONS if still not settled)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SETTLE_WAIT_S
        while (meta.pending is not None or meta.record.state in _PREPARE_STATES) \
                and not self._stopping and self._shards.get(shard.partition) is shard:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shard.changed.wait(), remaining)

    async def _spare_id(self) -> None:
        """Keep one producer id at hand: a transition that needs one (a new id, an
        epoch that ran out) takes it synchronously."""
        if not self._spare_ids:
            self._spare_ids.append(await self._next_producer_id())

    def _allocate(self) -> int:
        if not self._spare_ids:
            raise CoordinatorNotAvailableError("no producer id at hand; retry")
        return self._spare_ids.pop()

    async def _apply(self, shard: _Shard, meta: TxnMetadata, step: Step, *,
                     fence: bool = False) -> None:
        """Persist a step's record (if any), then start or finish its completion."""
        if step.record is None:
            return
        await self._persist(shard, meta, step.record, fence=fence)
        if step.record.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            if step.markers:
                self._complete_later(shard, meta)
            else:  # nothing was written in the transaction: complete it now
                await self._persist(shard, meta, meta.complete_txn(_now_ms()))

    # ------------------------------------------------------------------ APIs
    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResponse:
        assert request.transactional_id is not None
        txn_id = request.transactional_id
        try:
            check_timeout(request.transaction_timeout_ms,
                          self.config.transaction_max_timeout_ms)
            shard = await self._shard_of(txn_id)
            await self._spare_id()
            meta = shard.txns.get(txn_id)
            if meta is None:
                meta = shard.txns[txn_id] = TxnMetadata.new(
                    txn_id, self._allocate(), request.transaction_timeout_ms, _now_ms(),
                    request.two_phase)
                await self._spare_id()
            step, answer = meta.init_producer_id(
                timeout_ms=request.transaction_timeout_ms, now_ms=_now_ms(),
                allocate=self._allocate, expected_id=request.producer_id,
                expected_epoch=request.producer_epoch, two_phase=request.two_phase,
                keep_prepared=request.keep_prepared)
            await self._apply(shard, meta, step, fence=step.markers)
        except StrataError as err:
            return InitProducerIdResponse(err.code, error_message=err.message)
        if step.error is not None:
            return InitProducerIdResponse(step.error.code, error_message=step.error.message)
        return InitProducerIdResponse(0, step.producer_id, step.producer_epoch,
                                      state=answer.state.label, tag=answer.tag)

    async def add_partitions(self, request: AddPartitionsToTxnRequest
                             ) -> AddPartitionsToTxnResponse:
        wanted = [(t.name, p) for t in request.topics for p in t.partitions]
        try:
            shard = await self._shard_of(request.transactional_id)
            meta = shard.txns.get(request.transactional_id)
            if meta is None:
                raise InvalidProducerIdMappingError(
                    f"transactional id {request.transactional_id!r} is not known here "
                    "(never initialized, or expired): call init_transactions() first")
            if request.verify_only:
                return _partition_answers(request.topics, meta.verify(
                    request.producer_id, request.producer_epoch, wanted))
            await self._settled(shard, meta)
            unknown = [tp for tp in wanted if not self._exists(*tp)]
            if unknown:
                return _partition_answers(request.topics, {
                    tp: UnknownTopicOrPartitionError(f"{tp[0]}-{tp[1]} does not exist")
                    if tp in unknown else OperationNotAttemptedError(
                        "not added: another partition of the request does not exist")
                    for tp in wanted})
            step = meta.add_partitions(request.producer_id, request.producer_epoch, wanted,
                                       _now_ms(), request.tag)
            if step.error is None:
                await self._apply(shard, meta, step)
        except StrataError as err:
            return _partition_answers(request.topics, dict.fromkeys(wanted, err))
        return _partition_answers(request.topics, dict.fromkeys(wanted, step.error))

    def _exists(self, topic: str, p: int) -> bool:
        definition = self.cluster.topics.get(topic)
        return definition is not None and p in definition.assignment

    async def add_offsets(self, request: AddOffsetsToTxnRequest, offsets_partition: PartitionKey
                          ) -> AddOffsetsToTxnResponse:
        """The group's ``__consumer_offsets`` partition joins the transaction."""
        topic, p = offsets_partition
        answer = await self.add_partitions(AddPartitionsToTxnRequest(
            request.transactional_id, request.producer_id, request.producer_epoch,
            [TxnTopic(topic, [p])]))
        result = answer.topics[0].partitions[0]
        return AddOffsetsToTxnResponse(result.error_code, result.error_message)

    async def end_txn(self, request: EndTxnRequest, *, tv2: bool = True) -> EndTxnResponse:
        """``tv2`` False: Kafka's rules before KIP-890 part 2 (the epoch is not bumped; the
        Kafka listener's clients)."""
        try:
            shard = await self._shard_of(request.transactional_id)
            meta = shard.txns.get(request.transactional_id)
            if meta is None:
                raise InvalidProducerIdMappingError(
                    f"transactional id {request.transactional_id!r} is not known here: "
                    "call init_transactions() first")
            await self._spare_id()
            step = meta.end_txn(request.producer_id, request.producer_epoch,
                                request.committed, _now_ms(), self._allocate, tv2=tv2)
            if step.error is None:
                await self._apply(shard, meta, step)
        except StrataError as err:
            return EndTxnResponse(err.code, err.message)
        if step.error is not None:
            return EndTxnResponse(step.error.code, step.error.message)
        return EndTxnResponse(0, None, step.producer_id, step.producer_epoch)

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[PartitionKey]
                     ) -> Mapping[PartitionKey, StrataError | None]:
        """KIP-890 part 1, for this broker's partition leaders: is each partition in the
        producer's open transaction? Asked of the coordinator, here or elsewhere."""
        try:
            node, _, _ = await self.find(transactional_id)
            if node == self.broker_id:
                shard = await self._shard_of(transactional_id)
                meta = shard.txns.get(transactional_id)
                if meta is None:
                    raise InvalidProducerIdMappingError(
                        f"transactional id {transactional_id!r} is not known to its "
                        "coordinator")
                return meta.verify(producer_id, producer_epoch, partitions)
            by_topic: dict[str, list[int]] = {}
            for topic, p in partitions:
                by_topic.setdefault(topic, []).append(p)
            answer = await self._ask(node, ApiKey.ADD_PARTITIONS_TO_TXN, AddPartitionsToTxnRequest(
                transactional_id, producer_id, producer_epoch,
                [TxnTopic(t, ps) for t, ps in by_topic.items()], verify_only=True),
                _VERIFY_TIMEOUT_S)
            assert isinstance(answer, AddPartitionsToTxnResponse)
            out: dict[PartitionKey, StrataError | None] = {}
            for answered in answer.topics:
                for result in answered.partitions:
                    out[(answered.name, result.partition)] = None if not result.error_code \
                        else error_for_code(result.error_code)(result.error_message or "")
            for tp in partitions:
                out.setdefault(tp, NetworkError(
                    f"the coordinator's answer left {tp[0]}-{tp[1]} out; retry"))
            return out
        except (StrataError, OSError, TimeoutError) as err:
            error = err if isinstance(err, StrataError) else CoordinatorNotAvailableError(
                f"the transaction coordinator of {transactional_id!r} did not answer "
                f"the verification ({err!r}); retry")
            return dict.fromkeys(partitions, error)

    # ------------------------------------------------------------------ describe
    async def describe(self, transactional_ids: Iterable[str]) -> list[DescribedTransaction]:
        out = []
        for txn_id in transactional_ids:
            try:
                shard = await self._shard_of(txn_id)
                meta = shard.txns.get(txn_id)
                if meta is None:
                    raise TransactionalIdNotFoundError(
                        f"transactional id {txn_id!r} has no state (never used, or "
                        "expired)")
            except StrataError as err:
                out.append(DescribedTransaction(txn_id, err.code, err.message))
                continue
            r = meta.record
            topics: dict[str, list[int]] = {}
            for topic, p in sorted(r.partitions):
                topics.setdefault(topic, []).append(p)
            out.append(DescribedTransaction(
                txn_id, 0, None, r.state.label, r.producer_id, r.producer_epoch, r.timeout_ms,
                r.start_ms, [TxnTopic(t, ps) for t, ps in topics.items()], r.two_phase,
                r.tag))
        return out

    async def list_transactions(self, request: ListTransactionsRequest
                                ) -> ListTransactionsResponse:
        await self._load_led(strict=True)  # every id it coordinates, loaded or not
        now = _now_ms()
        states = set(request.state_filters)
        pids = set(request.producer_id_filters)
        listed = []
        for shard in self._shards.values():
            try:
                partition = self._leader_partition(shard.partition)
            except StrataError:
                continue
            if partition.leader_epoch != shard.epoch:
                continue
            for txn_id, meta in sorted(shard.txns.items()):
                r = meta.record
                if states and r.state.label not in states:
                    continue
                if pids and r.producer_id not in pids:
                    continue
                if request.min_duration_ms >= 0 and (
                        r.state is not TxnState.ONGOING or r.start_ms < 0
                        or now - r.start_ms < request.min_duration_ms):
                    continue
                listed.append(ListedTransaction(txn_id, r.producer_id, r.state.label))
        return ListTransactionsResponse(0, listed)

    # ------------------------------------------------------------------ markers
    def _complete_later(self, shard: _Shard, meta: TxnMetadata) -> None:
        # A fresh context: the completion is the broker's own work, not the client's
        # whose EndTxn (or InitProducerId) started it. Inheriting that request's session
        # would authorize the markers this broker writes locally as that client, and a
        # client may not CLUSTER_ACTION: with ACLs on, every transaction with a
        # partition led by its coordinator would stay in PREPARE_* for ever.
        task = asyncio.create_task(self._complete(shard, meta),
                                   name=f"txn-markers-{meta.record.transactional_id}",
                                   context=contextvars.Context())
        shard.completions.add(task)
        task.add_done_callback(shard.completions.discard)

    async def _complete(self, shard: _Shard, meta: TxnMetadata) -> None:
        """Write the markers of a PREPARE_* transaction, then persist COMPLETE_*."""
        record = meta.record
        committed = record.state is TxnState.PREPARE_COMMIT
        pending = set(record.partitions)
        attempt = 0
        while pending and not self._stopping:
            if self._shards.get(shard.partition) is not shard:
                return  # not ours any more: the new coordinator completes it
            by_leader: dict[int, list[PartitionKey]] = {}
            for tp in sorted(pending):
                state = self.cluster.partition_states.get(tp)
                if tp[0] not in self.cluster.topics or state is None:
                    pending.discard(tp)  # the topic was deleted: nothing to end there
                    continue
                by_leader.setdefault(state.leader, []).append(tp)
            results = await asyncio.gather(*(
                self._send_markers(leader, record, committed, shard.epoch, tps, attempt)
                for leader, tps in by_leader.items()))
            for done in results:
                pending -= done
            if pending:
                await asyncio.sleep(_MARKER_BACKOFF_S[min(attempt, len(_MARKER_BACKOFF_S) - 1)])
                attempt += 1
        if self._stopping or self._shards.get(shard.partition) is not shard:
            return
        attempt = 0
        while True:
            try:
                await self._persist(shard, meta, meta.complete_txn(_now_ms()))
                return
            except NotCoordinatorError:
                return  # the new coordinator completes it from the log
            except StrataError as err:
                log.warning("%s: completing the transaction failed (%s); retrying",
                            record.transactional_id, err)
                await asyncio.sleep(_MARKER_BACKOFF_S[min(attempt, len(_MARKER_BACKOFF_S) - 1)])
                attempt += 1

    async def _send_markers(self, leader: int, record: TxnRecord, committed: bool,
                            coordinator_epoch: int, partitions: list[PartitionKey],
                            attempt: int = 0) -> set[PartitionKey]:
        """One WriteTxnMarkers to a leader; the partitions it is done with. A partition
        that refused is logged on the first attempts, then every 60th: a marker that
        keeps failing holds its partition's last stable offset."""
        topics: dict[str, list[int]] = {}
        for topic, p in partitions:
            topics.setdefault(topic, []).append(p)
        request = WriteTxnMarkersRequest([TxnMarker(
            record.producer_id, record.producer_epoch, committed, coordinator_epoch,
            [TxnTopic(t, ps) for t, ps in topics.items()])])
        try:
            if leader == self.broker_id:
                answer: Any = await self._local_markers(request)
            else:
                answer = await self._ask(leader, ApiKey.WRITE_TXN_MARKERS, request,
                                         _MARKER_TIMEOUT_S)
        except (StrataError, OSError, TimeoutError) as err:
            log.info("%s: markers to broker %d failed (%r); retrying",
                     record.transactional_id, leader, err)
            return set()
        assert isinstance(answer, WriteTxnMarkersResponse)
        done: set[PartitionKey] = set()
        for marker in answer.markers:
            for answered in marker.topics:
                for result in answered.partitions:
                    tp = (answered.name, result.partition)
                    if result.error_code == 0:
                        done.add(tp)
                        continue
                    error = error_for_code(result.error_code)(result.error_message or "")
                    if attempt in _LOGGED_ATTEMPTS or attempt % 60 == 0:
                        log.log(logging.INFO if attempt < 10 else logging.WARNING,
                                "%s: broker %d did not write the marker of %s-%d (attempt "
                                "%d): %s; retrying", record.transactional_id, leader, tp[0],
                                tp[1], attempt + 1, error)
                    if error.name in ("TRANSACTION_COORDINATOR_FENCED",
                                      "INVALID_PRODUCER_EPOCH"):
                        # A newer coordinator or epoch owns the partition's producer: this
                        # marker must never be written; nothing more to do there.
                        log.warning("%s: %s refused the marker: %s", record.transactional_id,
                                    tp, error)
                        done.add(tp)
        return done

    async def _ask(self, node: int, api: ApiKey, request: Any, timeout_s: float) -> Any:
        """A request to another broker on a connection kept for the next one."""
        from wire.connection import BrokerConnection

        registration = self.cluster.live_brokers.get(node)
        if registration is None:
            raise CoordinatorNotAvailableError(f"broker {node} is not live")
        connection = self._connections.get(node)
        if connection is None or not connection.is_open or \
                (connection.host, connection.port) != (registration.host, registration.port):
            if connection is not None:
                with contextlib.suppress(Exception):
                    await connection.close()
            connection = BrokerConnection(
                registration.host, registration.port,
                client_id=f"broker-{self.broker_id}-transactions",
                security=self.config.inter_broker_security())
            await connection.connect(timeout=timeout_s)
            self._connections[node] = connection
        try:
            return await asyncio.wait_for(connection.request(api, request), timeout_s)
        except BaseException:
            self._connections.pop(node, None)
            with contextlib.suppress(Exception):
                await connection.close()
            raise

    # ------------------------------------------------------------------ background
    async def _timeout_loop(self) -> None:
        interval = self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        last_expiry = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(interval / 1000)
            await self._load_led()
            now = _now_ms()
            for shard in list(self._shards.values()):
                for meta in list(shard.txns.values()):
                    if meta.timed_out(now):
                        await self._abort_timed_out(shard, meta, now)
            if time.monotonic() - last_expiry >= min(_EXPIRY_INTERVAL_S,
                                                     self.config.transactional_id_expiration_ms
                                                     / 1000):
                last_expiry = time.monotonic()
                await self._expire(now)

    async def _abort_timed_out(self, shard: _Shard, meta: TxnMetadata, now: int) -> None:
        r = meta.record
        log.info("aborting the transaction of %s (producer %d epoch %d): open for %d ms, "
                 "past its transaction_timeout_ms %d", r.transactional_id, r.producer_id,
                 r.producer_epoch, now - r.start_ms, r.timeout_ms)
        try:
            await self._apply(shard, meta, meta.abort_timed_out(now), fence=True)
        except StrataError as err:
            log.warning("aborting the timed-out transaction of %s failed (%s); the next "
                        "pass retries", r.transactional_id, err)

    async def _expire(self, now: int) -> None:
        for shard in list(self._shards.values()):
            for txn_id, meta in list(shard.txns.items()):
                if not meta.expired(now, self.config.transactional_id_expiration_ms):
                    continue
                try:
                    partition = self._leader_partition(shard.partition)
                    batch = build_batch([None], keys=[encode_key(txn_id)])
                    await append_replicated(partition, batch, what="an expired id",
                                            timeout_s=_WRITE_TIMEOUT_S)
                    if shard.txns.get(txn_id) is meta and meta.pending is None:
                        del shard.txns[txn_id]
                        log.info("transactional id %s expired (idle for %d ms)", txn_id,
                                 self.config.transactional_id_expiration_ms)
                except StrataError as err:
                    log.info("expiring %s failed (%s); the next pass retries", txn_id, err)


def _partition_answers(topics: list[TxnTopic],
                       errors: Mapping[PartitionKey, StrataError | None]
                       ) -> AddPartitionsToTxnResponse:
    results = []
    for topic in topics:
        answers = []
        for p in topic.partitions:
            error = errors.get((topic.name, p))
            answers.append(TxnPartitionResult(p) if error is None else
                           TxnPartitionResult(p, error.code, error.message))
        results.append(TxnTopicResult(topic.name, answers))
    return AddPartitionsToTxnResponse(results)

