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

docs/spark.md describes the protocol and its failure cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from strata.client._cluster import Cluster
from strata.client._common import TopicPartition, error_from_code, is_transient
from strata.client._sync import EventLoopThread
from wire.errors import (
    NetworkError,
    StrataError,
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
    "StagedPart",
    "StagingWriter",
    "abort_staged",
    "commit_staged",
    "sink_producer_id",
]

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
                        timeout_ms: int = 60_000) -> dict[TopicPartition, SinkCommitResult]:
    """Commit ``batch_id`` of sink ``producer_id`` in every partition of ``parts``.

    Retries transient errors (leader moved, connection lost, timeouts) until
    ``timeout_ms``; a retry is safe because a partition that already holds the commit
    answers ``duplicate``. A non-transient error (e.g. ``StagedDataMissingError``) is
    raised; partitions committed before it stay committed, and re-running the batch
    completes the rest exactly once.
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
                           {tp: pending[tp] for tp in tps})
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
                     timeout_ms: int, parts: Mapping[TopicPartition, list[StagedPart]]
                     ) -> list[tuple[TopicPartition, SinkCommitResult | StrataError]]:
    """One CommitStaged request to broker ``node``; an outcome per partition."""
    topics = group_by_topic(
        (tp.topic, CommitPartition(tp.partition, [
            StagedPartEntry(p.staging_id, p.chunks, p.records) for p in staged]))
        for tp, staged in parts.items())
    request = CommitStagedRequest(producer_id, batch_id, timeout_ms,
                                  [CommitTopic(t, ps) for t, ps in topics.items()])
    try:
        connection = await cluster.connection(node)
        response = await asyncio.wait_for(
            connection.request(ApiKey.COMMIT_STAGED, request),
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
