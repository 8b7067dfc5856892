"""Exactly-once sink writes: stage records on partition leaders, then commit them once.

The building blocks the Spark sink (``spark_source``) is made of, usable by any
framework with a "tasks write, one coordinator commits" shape:

- ``StagingWriter`` (one per writer task attempt): ``stage(topic, partition, batch)``
  sends encoded record batches to partition leaders under a fresh staging id, where no
  consumer sees them. ``parts()`` reports what was acknowledged; the task hands that to
  the coordinator.
- ``commit_staged`` (the coordinator, once per batch id): appends every partition's
  staged files as one group stamped with the sink's producer id and ``batch_id``. It is
  safe to call again with the same batch id (a re-run batch, a retried request): the
  broker recognises the replay and appends nothing. ``abort_staged`` drops staged files.
- ``sink_producer_id(sink_id)``: the sink's stable producer id, derived by hashing so
  every process and every broker agree without coordination.
- ``TransactionalSinkCommitter`` (the coordinator, once per batch id): the same commit
  inside ONE transaction across every partition (``sink_transactional_id(sink_id)``,
  two-phase), so a read_committed consumer sees a batch all at once or not at all, and
  a batch whose driver died before the transaction ended is resumed and completed by
  the next driver (``commit_batch``; see its docstring for every case).

docs/spark.md describes the protocol and its failure cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Final

from strata.client._cluster import Cluster
from strata.client._common import TopicPartition, error_from_code, is_transient
from strata.client._config import ProducerConfig
from strata.client._group import CoordinatorLink
from strata.client._sender import Sender
from strata.client._sync import EventLoopThread
from strata.client._transactions import Transactions
from wire.errors import (
    NetworkError,
    StrataError,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    AbortPartition,
    AbortStagedRequest,
    AbortStagedResponse,
    AbortTopic,
    ApiKey,
    CommitPartition,
    CommitStagedRequest,
    CommitStagedResponse,
    CommitTopic,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    StagedPartEntry,
    StagePartition,
    StageRecordsRequest,
    StageRecordsResponse,
    StageTopic,
    group_by_topic,
)
from wire.record_batch import SINK_PRODUCER_ID_BASE, peek_header
from wire.security import PLAINTEXT, ClientSecurity

__all__ = [
    "SinkCommitResult",
    "SinkCommitter",
    "SinkTransactionResult",
    "StagedPart",
    "StagingWriter",
    "TransactionalSinkCommitter",
    "TxnCommit",
    "abort_staged",
    "commit_staged",
    "sink_producer_id",
    "sink_transactional_id",
]

log = logging.getLogger("strata.client.sink")

_SINK_ID_SPACE = (1 << 62) - 1


def sink_producer_id(sink_id: str) -> int:
    """The producer id of sink ``sink_id``: ``2^62 + (first 62 bits of SHA-256(sink_id))``.

    Stable across processes and restarts (a re-run batch must carry the same id), and
    disjoint from the ids ``InitProducerId`` hands out (counted up from 0).
    """
    if not sink_id:
        raise ValueError("a sink id must not be empty")
    digest = hashlib.sha256(sink_id.encode("utf-8")).digest()
    return SINK_PRODUCER_ID_BASE + (int.from_bytes(digest[:8], "big") & _SINK_ID_SPACE)


def sink_transactional_id(sink_id: str) -> str:
    """The transactional id the sink's transactions run under: ``strata-sink:<sink id>``
    (readable in ``DescribeTransactions`` and ACLs: grant WRITE on the PREFIXED
    TRANSACTIONAL_ID ``strata-sink:``)."""
    if not sink_id:
        raise ValueError("a sink id must not be empty")
    return f"strata-sink:{sink_id}"


@dataclass(frozen=True, slots=True)
class TxnCommit:
    """A commit inside a transaction: its transactional id and the open transaction's
    producer id and epoch (CommitStaged version 1)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class StagedPart:
    """What one writer staged in one partition: the commit checks these counts."""

    staging_id: str
    chunks: int
    records: int


@dataclass(frozen=True, slots=True)
class SinkCommitResult:
    """One partition's commit: ``duplicate`` when the broker had this batch id already."""

    first_offset: int
    last_offset: int
    duplicate: bool


# ----------------------------------------------------------------------------- staging


class _PartitionStage:
    __slots__ = ("acked_chunks", "acked_records", "lock", "next_chunk")

    def __init__(self) -> None:
        self.next_chunk = 0
        self.acked_chunks = 0
        self.acked_records = 0
        self.lock = asyncio.Lock()


class StagingWriter:
    """Stages batches for one writer task attempt (thread-safe facade, own I/O thread).

    ``stage`` returns at once with a future and keeps chunks of one partition in order
    (one in flight per partition, many partitions in parallel); ``flush`` waits for all.
    At most ``max_pending`` chunks are outstanding; ``stage`` blocks beyond that, so a
    fast producer of batches cannot run out of memory.
    """

    def __init__(self, bootstrap_servers: str | list[str], *, staging_id: str | None = None,
                 request_timeout_ms: int = 30_000, delivery_timeout_ms: int = 120_000,
                 max_pending: int = 32, client_id: str = "strata-sink",
                 direct: bool = False, security: ClientSecurity = PLAINTEXT) -> None:
        self.staging_id = staging_id or uuid.uuid4().hex
        # direct: produce (acks=all) instead of staging, for at-least-once sinks. Records
        # are visible at once; a retry after a lost answer may write a batch twice.
        self.direct = direct
        self.delivery_timeout_ms = delivery_timeout_ms
        self._thread = EventLoopThread("strata-sink-writer")
        self._cluster = Cluster(bootstrap_servers, client_id=client_id,
                                request_timeout_ms=request_timeout_ms, security=security)
        self._partitions: dict[TopicPartition, _PartitionStage] = {}
        self._pending: list[Future[None]] = []
        self._max_pending = max_pending
        self._closed = False

    def stage(self, topic: str, partition: int, batch: bytes) -> Future[None]:
        """Queue one encoded record batch (``wire.record_batch``) for ``topic-partition``."""
        if self._closed:
            raise RuntimeError("stage() after close(): create a new StagingWriter")
        tp = TopicPartition(topic, partition)
        state = self._partitions.get(tp)
        if state is None:
            state = self._partitions[tp] = _PartitionStage()
        chunk = state.next_chunk
        state.next_chunk += 1
        records = peek_header(batch).record_count
        while len(self._pending) >= self._max_pending:
            self._pending.pop(0).result()
        future = self._thread.submit(self._send(tp, state, chunk, records, batch))
        self._pending.append(future)
        return future

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` (metadata; ``UnknownTopicOrPartitionError`` if absent)."""
        return len(self._thread.run(self._cluster.partitions_for(topic), timeout=60))

    def flush(self) -> None:
        """Wait until every queued chunk is acknowledged; raise the first failure."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def parts(self) -> dict[TopicPartition, StagedPart]:
        """Acknowledged chunks per partition (call after ``flush``)."""
        return {tp: StagedPart(self.staging_id, s.acked_chunks, s.acked_records)
                for tp, s in self._partitions.items() if s.acked_chunks}

    async def _send(self, tp: TopicPartition, state: _PartitionStage, chunk: int,
                    records: int, batch: bytes) -> None:
        # asyncio.Lock wakes waiters in FIFO order and run_coroutine_threadsafe schedules
        # in submission order, so chunks of a partition go out in chunk order.
        async with state.lock:
            request: StageRecordsRequest | ProduceRequest
            if self.direct:
                request = ProduceRequest(-1, self._cluster.request_timeout_ms, [ProduceTopic(
                    tp.topic, [ProducePartition(tp.partition, batch)])])
            else:
                request = StageRecordsRequest(self.staging_id, [StageTopic(
                    tp.topic, [StagePartition(tp.partition, chunk, batch)])])
            deadline = time.monotonic() + self.delivery_timeout_ms / 1000
            attempt = 0
            while True:
                try:
                    leader = await self._cluster.leader_for(tp.topic, tp.partition)
                    connection = await self._cluster.connection(leader)
                    api = ApiKey.PRODUCE if self.direct else ApiKey.STAGE_RECORDS
                    response = await asyncio.wait_for(
                        connection.request(api, request),
                        self._cluster.request_timeout_ms / 1000)
                    assert isinstance(response, StageRecordsResponse | ProduceResponse)
                    answer = response.topics[0].partitions[0]
                    if answer.error_code:
                        raise error_from_code(answer.error_code, answer.error_message)
                    break
                except (StrataError, TimeoutError) as err:
                    if not is_transient(err) or time.monotonic() >= deadline:
                        raise
                    attempt += 1
                    await self._cluster.backoff(attempt)
                    with contextlib.suppress(StrataError, TimeoutError):
                        await self._cluster.refresh([tp.topic])
            state.acked_chunks = chunk + 1
            state.acked_records += records

    def abort(self) -> None:
        """Drop everything this writer staged (best effort: expiry cleans up otherwise)."""
        # Every partition a chunk was sent to, acknowledged or not: an unanswered chunk
        # may still have been staged.
        parts = {tp: [self.staging_id] for tp, s in self._partitions.items() if s.next_chunk}
        if parts:
            with contextlib.suppress(StrataError, TimeoutError):
                self._thread.run(abort_staged(self._cluster, parts), timeout=30)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._cluster.close(), timeout=10)
        finally:
            self._thread.close()

    def __enter__(self) -> StagingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- commit


async def commit_staged(cluster: Cluster, producer_id: int, batch_id: int,
                        parts: Mapping[TopicPartition, Iterable[StagedPart]], *,
                        timeout_ms: int = 60_000, txn: TxnCommit | None = None
                        ) -> dict[TopicPartition, SinkCommitResult]:
    """Commit ``batch_id`` of sink ``producer_id`` in every partition of ``parts``.

    Retries transient errors (leader moved, connection lost, timeouts) until
    ``timeout_ms``; a retry is safe because a partition that already holds the commit
    answers ``duplicate``. A non-transient error (e.g. ``StagedDataMissingError``) is
    raised; partitions committed before it stay committed, and re-running the batch
    completes the rest exactly once.

    ``txn``: append inside that open transaction (every partition of ``parts`` must
    have been added to it); its marker then decides the groups.
    """
    pending = {tp: list(ps) for tp, ps in parts.items() if ps}
    results: dict[TopicPartition, SinkCommitResult] = {}
    deadline = time.monotonic() + timeout_ms / 1000
    attempt = 0
    while pending:
        by_leader: dict[int, list[TopicPartition]] = {}
        errors: list[StrataError] = []
        for tp in pending:
            try:
                by_leader.setdefault(await cluster.leader_for(tp.topic, tp.partition),
                                     []).append(tp)
            except UnknownTopicOrPartitionError:
                raise
            except StrataError as err:
                errors.append(err)

        asks = [_commit_on(cluster, node, producer_id, batch_id, timeout_ms,
                           {tp: pending[tp] for tp in tps}, txn)
                for node, tps in by_leader.items()]
        for answers in await asyncio.gather(*asks):
            for tp, outcome in answers:
                if isinstance(outcome, SinkCommitResult):
                    results[tp] = outcome
                    pending.pop(tp, None)
                else:
                    errors.append(outcome)
        if not pending:
            break
        fatal = [e for e in errors if not is_transient(e)]
        if fatal:
            raise fatal[0]
        if time.monotonic() >= deadline:
            raise errors[0] if errors else NetworkError(
                f"commit of batch {batch_id} did not complete in {timeout_ms} ms")
        attempt += 1
        await cluster.backoff(attempt)
        with contextlib.suppress(StrataError, TimeoutError):
            await cluster.refresh(sorted({tp.topic for tp in pending}))
    return results


async def _commit_on(cluster: Cluster, node: int, producer_id: int, batch_id: int,
                     timeout_ms: int, parts: Mapping[TopicPartition, list[StagedPart]],
                     txn: TxnCommit | None = None
                     ) -> list[tuple[TopicPartition, SinkCommitResult | StrataError]]:
    """One CommitStaged request to broker ``node``; an outcome per partition."""
    topics = group_by_topic(
        (tp.topic, CommitPartition(tp.partition, [
            StagedPartEntry(p.staging_id, p.chunks, p.records) for p in staged]))
        for tp, staged in parts.items())
    request = CommitStagedRequest(producer_id, batch_id, timeout_ms,
                                  [CommitTopic(t, ps) for t, ps in topics.items()])
    if txn is not None:
        request.transactional_id = txn.transactional_id
        request.txn_producer_id, request.txn_producer_epoch = txn.producer_id, \
            txn.producer_epoch
    try:
        connection = await cluster.connection(node)
        response = await asyncio.wait_for(
            connection.request(ApiKey.COMMIT_STAGED, request,
                               version=0 if txn is None else 1),
            cluster.request_timeout_ms / 1000 + timeout_ms / 1000)
    except (StrataError, TimeoutError) as err:
        failure = err if isinstance(err, StrataError) else \
            NetworkError(f"broker {node} did not answer the commit in time")
        return [(tp, failure) for tp in parts]
    assert isinstance(response, CommitStagedResponse)
    out: list[tuple[TopicPartition, SinkCommitResult | StrataError]] = []
    for topic in response.topics:
        for answer in topic.partitions:
            tp = TopicPartition(topic.name, answer.partition)
            if answer.error_code:
                out.append((tp, error_from_code(answer.error_code, answer.error_message)))
            else:
                out.append((tp, SinkCommitResult(answer.base_offset, answer.last_offset,
                                                 answer.duplicate)))
    return out


async def abort_staged(cluster: Cluster, parts: Mapping[TopicPartition, Iterable[str]]
                       ) -> None:
    """Delete staged files by staging id (best effort per leader; unknown ids are fine)."""
    by_leader: dict[int, list[tuple[str, AbortPartition]]] = {}
    for tp, ids in parts.items():
        try:
            leader = await cluster.leader_for(tp.topic, tp.partition)
        except StrataError:
            continue
        by_leader.setdefault(leader, []).append(
            (tp.topic, AbortPartition(tp.partition, list(ids))))
    for node, aborts in by_leader.items():
        with contextlib.suppress(StrataError, TimeoutError):
            connection = await cluster.connection(node)
            response = await asyncio.wait_for(connection.request(
                ApiKey.ABORT_STAGED, AbortStagedRequest(
                    [AbortTopic(t, ps) for t, ps in group_by_topic(aborts).items()])),
                cluster.request_timeout_ms / 1000)
            assert isinstance(response, AbortStagedResponse)


class SinkCommitter:
    """Blocking facade for the coordinator side: ``commit`` and ``abort`` (own I/O thread)."""

    def __init__(self, bootstrap_servers: str | list[str], *,
                 request_timeout_ms: int = 30_000,
                 client_id: str = "strata-sink-committer",
                 security: ClientSecurity = PLAINTEXT) -> None:
        self._thread = EventLoopThread("strata-sink-committer")
        self._cluster = Cluster(bootstrap_servers, client_id=client_id,
                                request_timeout_ms=request_timeout_ms, security=security)

    def commit(self, producer_id: int, batch_id: int,
               parts: Mapping[TopicPartition, Iterable[StagedPart]], *,
               timeout_ms: int = 60_000) -> dict[TopicPartition, SinkCommitResult]:
        return self._thread.run(commit_staged(self._cluster, producer_id, batch_id, parts,
                                              timeout_ms=timeout_ms))

    def abort(self, parts: Mapping[TopicPartition, Iterable[str]]) -> None:
        self._thread.run(abort_staged(self._cluster, parts), timeout=60)

    def close(self) -> None:
        try:
            self._thread.run(self._cluster.close(), timeout=10)
        finally:
            self._thread.close()

    def __enter__(self) -> SinkCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- transactions

#: A sink transaction's tag: its batch id, and ``;prepared`` once every partition's
#: commit is in it (the durable mark of phase one, written before EndTxn).
_TAG: Final = re.compile(r"^batch=(\d+)(;prepared)?$")
_ONGOING: Final = "Ongoing"
_COMMITTED: Final = ("CompleteCommit", "PrepareCommit")


def _tag(batch_id: int, *, prepared: bool = False) -> str:
    return f"batch={batch_id}" + (";prepared" if prepared else "")


def _parse_tag(tag: str | None) -> tuple[int, bool] | None:
    """``(batch id, prepared)`` of a sink transaction's tag; None: not a sink tag."""
    match = _TAG.match(tag or "")
    return None if match is None else (int(match.group(1)), match.group(2) is not None)


def _already_committed(state: str, tag: str | None, batch_id: int) -> bool:
    """Whether the transactional id's last transaction (``state``, ``tag``; not an open
    one) shows ``batch_id`` as committed: a committed transaction of ``batch_id`` or a
    later one, or any transaction of a later batch (Spark starts a batch only once the
    previous one's commit returned, which means its transaction committed)."""
    held = _parse_tag(tag)
    if held is None or state == _ONGOING:
        return False
    return held[0] > batch_id or (held[0] == batch_id and state in _COMMITTED)


@dataclass(frozen=True, slots=True)
class SinkTransactionResult:
    """What ``TransactionalSinkCommitter.commit_batch`` did.

    ``outcome``: ``"committed"`` (the batch's transaction committed now),
    ``"already-committed"`` (an earlier commit of this batch id, or of a later one,
    committed: nothing appended, the new staged files dropped) or ``"nothing"`` (no
    staged parts, and no open transaction of this batch to finish). ``results``: per
    partition, what its CommitStaged answered (``duplicate``: the transaction held the
    batch there already). ``resumed``: the batch's transaction had been left open by an
    earlier driver and was completed by this call. ``settled``: an open transaction of
    another batch an earlier driver left, ended by this call: ``(batch id, committed)``.
    """

    batch_id: int
    outcome: str
    results: dict[TopicPartition, SinkCommitResult] = field(default_factory=dict)
    resumed: bool = False
    settled: tuple[int, bool] | None = None


class TransactionalSinkCommitter:
    """The exactly-once sink's driver-side commit: one transaction per batch id across
    every partition it writes (blocking facade, own I/O thread; one per commit call).

    The transactional id is ``sink_transactional_id(sink_id)``, initialised two-phase
    with ``keep_prepared`` (docs/transactions.md, "Two-phase"): the coordinator never
    aborts its transaction by timeout, and a new driver gets an open one back with its
    tag instead of aborting it. Per batch, ``commit_batch``:

    1. asks the coordinator (DescribeTransactions, a read) for the last transaction's
       state and tag: committed for this batch id or a later one means a re-run batch,
       so nothing is appended (``already-committed``);
    2. InitProducerId(two_phase, keep_prepared) fences any earlier driver. An open
       transaction handed back is an earlier driver's that died before EndTxn: of this
       batch id, it is resumed (below); of another batch, it is committed if its tag
       says ``prepared`` (every partition's commit is in it) and aborted otherwise;
    3. opens the transaction: AddPartitionsToTxn for every partition with tag
       ``batch=<id>``, then CommitStaged inside it (a partition whose transaction holds
       the batch already, after a resume, answers ``duplicate``), then tags it
       ``batch=<id>;prepared`` (durable phase one), then EndTxn(commit).

    Any failure before EndTxn aborts the transaction (best effort: a transaction left
    open is resolved by the next driver as in 2). The batch's staged files a commit
    does not need (a re-run of a committed batch) are dropped.

    ``on_prepared(batch_id)``: called after phase one, before EndTxn (on the I/O
    thread; tests use it to stop a driver exactly there).
    """

    def __init__(self, bootstrap_servers: str | list[str], sink_id: str, *,
                 request_timeout_ms: int = 30_000, commit_timeout_ms: int = 60_000,
                 client_id: str = "strata-sink-committer",
                 security: ClientSecurity = PLAINTEXT,
                 on_prepared: Callable[[int], None] | None = None) -> None:
        self.sink_id = sink_id
        self.on_prepared = on_prepared
        self.producer_id = sink_producer_id(sink_id)
        self.transactional_id = sink_transactional_id(sink_id)
        self.commit_timeout_ms = commit_timeout_ms
        config = ProducerConfig(bootstrap_servers, client_id=client_id, security=security,
                                request_timeout_ms=request_timeout_ms,
                                transactional_id=self.transactional_id)
        self._thread = EventLoopThread("strata-sink-committer")
        try:
            self._sender = self._thread.run(self._start(config), timeout=30)
        except BaseException:
            self._thread.close()
            raise
        assert self._sender.transactions is not None
        self._txn: Transactions = self._sender.transactions
        self._link = CoordinatorLink(self._sender.cluster, self.transactional_id,
                                     request_timeout_ms=request_timeout_ms,
                                     retry_backoff_ms=config.retry_backoff_ms, key_type=1)

    @staticmethod
    async def _start(config: ProducerConfig) -> Sender:
        sender = Sender(config, asyncio.get_running_loop())
        sender.start()
        return sender

    def commit_batch(self, batch_id: int,
                     parts: Mapping[TopicPartition, Iterable[StagedPart]]
                     ) -> SinkTransactionResult:
        """Commit ``batch_id`` (its staged ``parts``) as one transaction, exactly once
        (see the class docstring). ``parts`` may be empty: an open transaction of this
        batch left by an earlier driver is then still ended."""
        staged = {tp: list(ps) for tp, ps in parts.items() if ps}
        return self._thread.run(self._commit_batch(batch_id, staged))

    def describe(self) -> tuple[str, str | None] | None:
        """The transactional id's state and tag at its coordinator (None: no state)."""
        return self._thread.run(self._describe())

    async def _describe(self) -> tuple[str, str | None] | None:
        def check(response: object) -> StrataError | None:
            assert isinstance(response, DescribeTransactionsResponse)
            found = response.transactions[0]
            if found.error_code and \
                    found.error_code != TransactionalIdNotFoundError.code:
                return error_from_code(found.error_code, found.error_message)
            return None

        answer = await self._link.request(
            ApiKey.DESCRIBE_TRANSACTIONS, DescribeTransactionsRequest([self.transactional_id]),
            check=check)
        assert isinstance(answer, DescribeTransactionsResponse)
        found = answer.transactions[0]
        return None if found.error_code else (found.state, found.tag)

    async def _commit_batch(self, batch_id: int, parts: dict[TopicPartition, list[StagedPart]]
                            ) -> SinkTransactionResult:
        txn = self._txn
        described = await self._describe()
        if described is not None and _already_committed(*described, batch_id):
            await self._drop(parts)
            return SinkTransactionResult(batch_id, "already-committed")
        if not parts and (described is None or described[0] != _ONGOING):
            return SinkTransactionResult(batch_id, "nothing")
        await txn.init(two_phase=True, keep_prepared=True)
        resumed = False
        settled: tuple[int, bool] | None = None
        if txn.init_state == _ONGOING:
            held = _parse_tag(txn.init_tag)
            prepared = held is not None and held[1]
            if held is not None and held[0] == batch_id and parts and not prepared:
                resumed = True  # an earlier driver died in this batch's commit: finish it
            else:
                # Prepared: every partition's commit is in it, so it commits (the batch
                # it holds is whole). Not prepared: some partitions may lack their
                # commit, so it aborts (nothing of it was ever visible).
                await (txn.commit() if prepared else txn.abort())
                settled = (-1 if held is None else held[0], prepared)
                log.warning("sink %s: an earlier driver left the transaction of batch %s "
                            "open; %s it", self.sink_id, settled[0],
                            "committed" if prepared else "aborted")
                if held is not None and held[0] == batch_id:
                    await self._drop(parts)
                    return SinkTransactionResult(
                        batch_id, "committed" if prepared else "nothing", resumed=True,
                        settled=settled)
                if prepared and held is not None and held[0] > batch_id:
                    await self._drop(parts)
                    return SinkTransactionResult(batch_id, "already-committed",
                                                 settled=settled)
        elif _already_committed(txn.init_state, txn.init_tag, batch_id):
            await self._drop(parts)  # committed between the describe and the init
            return SinkTransactionResult(batch_id, "already-committed")
        if not parts:
            return SinkTransactionResult(batch_id, "nothing", settled=settled)
        results = await self._transaction(batch_id, parts, resumed)
        return SinkTransactionResult(batch_id, "committed", results, resumed, settled)

    async def _transaction(self, batch_id: int, parts: dict[TopicPartition, list[StagedPart]],
                           resumed: bool) -> dict[TopicPartition, SinkCommitResult]:
        txn = self._txn
        if not resumed:
            txn.tm.begin()
        keys = sorted((tp.topic, tp.partition) for tp in parts)
        try:
            await txn.add_partitions_now(keys, tag=_tag(batch_id))
            ids = TxnCommit(self.transactional_id, txn.tm.producer_id, txn.tm.producer_epoch)
            results = await commit_staged(self._sender.cluster, self.producer_id, batch_id,
                                          parts, timeout_ms=self.commit_timeout_ms, txn=ids)
            # Phase one done: every partition holds the batch in the transaction. From
            # here on a driver that dies leaves a transaction the next one commits.
            await txn.add_partitions_now(keys, tag=_tag(batch_id, prepared=True))
        except BaseException:
            with contextlib.suppress(StrataError, TimeoutError):
                await txn.abort()  # nothing of the batch becomes visible
            raise
        if self.on_prepared is not None:
            self.on_prepared(batch_id)
        await txn.commit()
        return results

    async def _drop(self, parts: Mapping[TopicPartition, list[StagedPart]]) -> None:
        """Delete staged files no commit will name (best effort: they expire anyway)."""
        if parts:
            with contextlib.suppress(StrataError, TimeoutError):
                await abort_staged(self._sender.cluster,
                                   {tp: [p.staging_id for p in ps] for tp, ps in parts.items()})

    def close(self) -> None:
        try:
            self._thread.run(self._sender.close(5), timeout=15)
        finally:
            self._thread.close()

    def __enter__(self) -> TransactionalSinkCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
