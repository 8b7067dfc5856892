"""The leader side of the replicas hosted here (Kafka's ``ReplicaManager``).

:class:`ReplicaManager` owns what happens to a partition this broker leads:

* ``append_records``: a produce's leader appends (the min-ISR check before anything is
  written), waiting for durability and, with ``acks=all``, for the in-sync replicas,
  and the answer; ``commit_staged`` appends a sink's staged data through the same
  acknowledgement path (``_await_ack``);
* ``fetch_records``: consumers' and followers' reads, the long poll, and the followers'
  incremental fetch sessions (``brokers/fetch_session.py``);
* the followers' positions their fetches report, which move the high watermark, and
  the ISR upkeep they drive: proposed changes (``Partition.isr_change``) written to
  ZooKeeper with a conditional write, batched; a lost race means the state changed
  under it, so it applies the state it re-read instead of guessing, and it makes no
  ZooKeeper decision while the session is suspended;
* the periodic high-watermark checkpoints.

The followers' side (fetchers replicating from other leaders) is
:class:`brokers.replication.ReplicaFetcherManager`. The request handlers
(``brokers/handlers/``) decide who may do what (ACLs, quotas, topic policies) and pass
their checks in as callbacks; a future listener for another wire protocol would reuse
this same object, so there is one log path.

Invariants:

* a batch is written only if every check of its partition passed (authorization, topic
  policy, leadership, schema, min ISR for ``acks=all``); one failing partition does not
  fail the others;
* an ``acks=all`` write is acknowledged only once it is durable (per ``flush.policy``),
  every in-sync replica has it, and the ISR still has ``min.insync.replicas`` replicas;
  a leader superseded while waiting answers NOT_LEADER, never success;
* a follower's fetch offset is its log end: it is recorded as its position before the
  read, so the high watermark moves with it.

Crash behaviour: the high-watermark checkpoint is a lower bound (written without fsync
every ``replica.lag.time.max.ms / 2``, and on close); a restarted replica recomputes
the HW from its followers and never exposes more than it knew to be committed.

Thread-safety: everything runs on the broker's event loop; ZooKeeper calls and the
checkpoint writes go through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

from brokers.answers import PartitionAnswer, answer_each, error_fields
from brokers.coordination import PartitionState
from brokers.fetch_session import FetchSession, FetchSessionCache
from brokers.staging import StagedPart
from wire.errors import (
    CoordinatorNotAvailableError,
    FencedLeaderEpochError,
    InvalidRequestError,
    InvalidRequiredAcksError,
    LogStorageError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    StrataError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    AbortedTransactionEntry,
    CommitPartition,
    CommitPartitionResponse,
    CommitStagedRequest,
    CommitStagedResponse,
    CommitTopicResponse,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FetchTopicResponse,
    ProducePartition,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResponse,
    TxnMarkerResult,
    TxnPartitionResult,
    TxnTopicResult,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from wire.record_batch import ControlType

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.coordination import ZooKeeperClient
    from brokers.partition import Partition
    from brokers.services import MetadataCache, PartitionRegistry, ReplicaHost

__all__ = ["ACKS_ALL", "ReplicaManager"]

# The ISR upkeep's lines keep the logger they have always had.
log = logging.getLogger("strata.brokers.replication")

PartitionKey = tuple[str, int]

#: ``acks=-1``: wait for every in-sync replica.
ACKS_ALL: Final = -1
#: Fetch ``isolation_level`` 1: read_committed (docs/transactions.md).
READ_COMMITTED: Final = 1
#: How long a marker waits for the in-sync replicas before the coordinator is told to
#: retry it.
_MARKER_TIMEOUT_MS: Final = 30_000
_VALID_ACKS: Final = (0, 1, ACKS_ALL)
#: Longest stretch of ISR upkeep before it lets waiting requests run.
_UPKEEP_SLICE_S: Final = 0.0005

#: A check the handlers make of one partition of a write before the replica manager
#: touches it (raises the partition's error: authorization, topic policy, ...).
AdmitWrite = Callable[[str, ProducePartition], None]
#: The errors the handlers found for some partitions of a produce (typed topics'
#: schemas), awaited before anything of the request is written.
Refusals = Callable[[list[ProduceTopic]], Awaitable[Mapping[PartitionKey, StrataError]]]
#: Counts a request's bytes against the caller's quota; returns the throttle (ms).
Quota = Callable[[int], int]
#: Asks the transaction coordinator of ``transactional_id`` whether these partitions are
#: in producer (id, epoch)'s open transaction (KIP-890 part 1): the error per partition
#: (None: it is).
Verify = Callable[[str, int, int, list[PartitionKey]],
                  Awaitable[Mapping[PartitionKey, StrataError | None]]]


class ReplicaManager:
    """Appends to, reads from and keeps the ISR of the partitions this broker leads."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, zookeeper: ZooKeeperClient,
                 host: ReplicaHost) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.zookeeper = zookeeper
        self.host = host
        self.fetch_sessions = FetchSessionCache()
        self._isr_writes: set[PartitionKey] = set()
        self._isr_queue: dict[PartitionKey, tuple[Partition, list[int]]] = {}
        self._isr_writer: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._maintain())

    async def stop(self) -> None:
        for task in (self._task, self._isr_writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    # ------------------------------------------------------------------ leaders
    def leader_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this broker leads it; else the error that says why not
        (offline here, unknown, not hosted or not led here)."""
        hosted = self.registry.hosted.get((topic, partition))
        offline = self.registry.offline.get((topic, partition))
        if offline is not None:
            raise LogStorageError(
                f"{topic}-{partition} is offline on broker {self.broker_id}: "
                f"{offline.message}")
        if hosted is None:
            if topic not in self.cluster.topics or \
                    partition not in self.cluster.topics[topic].assignment:
                raise UnknownTopicOrPartitionError(
                    f"{topic}-{partition} does not exist; check the topic name and its "
                    "partition count (strata topic describe)")
            raise NotLeaderError(
                f"broker {self.broker_id} does not host {topic}-{partition}; "
                "refresh metadata and send to the leader")
        hosted.check_leadership()
        return hosted

    @staticmethod
    def check_epoch(partition: Partition, asked: int) -> None:
        """A request naming a leader epoch (-1: none) must name the current one."""
        current = partition.leader_epoch
        if 0 <= asked < current:
            raise FencedLeaderEpochError(
                f"{partition.name}: leader epoch {asked} is older than the current "
                f"{current}; refresh metadata")
        if asked > current:
            raise UnknownLeaderEpochError(
                f"{partition.name}: leader epoch {asked} is newer than this broker's "
                f"{current}; retry shortly")

    # ------------------------------------------------------------------ appends
    async def append_records(self, acks: int, timeout_ms: int, topics: list[ProduceTopic],
                             *, admit: AdmitWrite, refusals: Refusals, quota: Quota,
                             transactional_id: str | None = None,
                             verify: Verify | None = None) -> ProduceResponse | None:
        """A produce: append each partition's batch as its leader and answer once every
        write is acknowledged as ``acks`` asks (None for ``acks=0``).

        Per partition, in this order: ``admit`` (the handlers' checks), leadership, the
        ``refusals`` found for it, the min-ISR check for ``acks=all``, the append. An
        invalid ``acks`` refuses every partition and writes nothing. ``quota`` gets the
        request's record bytes once the appends are done, before any wait.

        A transactional batch that would open its producer's transaction in a partition
        is appended only once ``verify`` (the transaction coordinator of
        ``transactional_id``) says the partition is in that transaction (KIP-890 part
        1): one question per request for all such partitions, asked before anything of
        the request is written.
        """
        if acks not in _VALID_ACKS:
            err: StrataError = InvalidRequiredAcksError(
                f"acks={acks} is not valid; use 0, 1 or -1 (all)")
            return ProduceResponse([ProduceTopicResponse(t.name, [
                ProducePartitionResponse(p.partition, err.code, error_message=err.message)
                for p in t.partitions]) for t in topics])
        waits: list[Awaitable[None]] = []
        refused = await refusals(topics)
        verified = await self._verify_transactional(topics, transactional_id, verify)
        if verified:
            refused = {**refused, **{tp: e for tp, e in verified.items() if e is not None}}

        def append(topic: str, part: ProducePartition, answer: ProducePartitionResponse
                   ) -> None:
            admit(topic, part)
            partition = self.leader_partition(topic, part.partition)
            if refused and (topic, part.partition) in refused:
                raise refused[(topic, part.partition)]
            if acks == ACKS_ALL and \
                    len(partition.isr) < partition.config.min_insync_replicas:
                raise NotEnoughReplicasError(
                    f"{partition.name} has {len(partition.isr)} in-sync replica(s) "
                    f"{sorted(partition.isr)}, min.insync.replicas is "
                    f"{partition.config.min_insync_replicas}: nothing was written. Retry "
                    "once the other replicas are back in sync (strata topic describe shows "
                    "the ISR); a topic whose replication factor is below "
                    "min.insync.replicas never takes acks=all writes")
            assert part.records is not None  # checked by admit
            result = partition.append_as_leader(
                part.records, verified=bool(verified) and (topic, part.partition) in verified)
            answer.base_offset = result.first_offset
            answer.log_append_time = result.log_append_time
            answer.log_start_offset = partition.log.log_start_offset
            if acks != 0:
                waits.append(self._await_ack(partition, result.last_offset + 1, acks,
                                             timeout_ms, answer))

        answered = answer_each(topics, lambda p: ProducePartitionResponse(p, 0), append)
        throttle = quota(sum(len(p.records) for t in topics for p in t.partitions
                             if p.records is not None))
        if acks == 0:
            return None
        if waits:
            await asyncio.gather(*waits)
        return ProduceResponse([ProduceTopicResponse(t, a) for t, a in answered], throttle)

    async def _verify_transactional(self, topics: list[ProduceTopic],
                                    transactional_id: str | None, verify: Verify | None
                                    ) -> dict[PartitionKey, StrataError | None]:
        """The coordinator's word on each partition whose transactional batch would open
        its producer's transaction here (empty: none needs it)."""
        wanted: dict[tuple[int, int], list[PartitionKey]] = {}
        missing_id: list[PartitionKey] = []
        for topic in topics:
            for part in topic.partitions:
                partition = self.registry.hosted.get((topic.name, part.partition))
                if partition is None or part.records is None or not partition.is_leader:
                    continue  # the append answers why
                try:
                    header = partition.needs_verification(part.records)
                except StrataError:
                    continue  # a malformed batch: the append's validation answers
                if header is None:
                    continue
                if transactional_id is None or verify is None:
                    try:
                        partition.log.validate(part.records)
                    except StrataError:
                        continue  # damaged: CORRUPT_MESSAGE or INVALID_RECORD says more
                    missing_id.append((topic.name, part.partition))
                    continue
                wanted.setdefault((header.producer_id, header.producer_epoch), []).append(
                    (topic.name, part.partition))
        out: dict[PartitionKey, StrataError | None] = dict.fromkeys(
            missing_id, InvalidRequestError(
                "a transactional batch needs the producer's transactional_id in the "
                "produce request (version 1)"))
        for (pid, epoch), tps in wanted.items():
            assert transactional_id is not None and verify is not None
            out.update(await verify(transactional_id, pid, epoch, tps))
        return out

    async def write_markers(self, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
        """The transaction coordinator's markers: each appended as the partition's leader
        and answered once acknowledged as an ``acks=all`` produce would be; a repeat of
        a marker already written is answered without writing it again."""
        waits: list[Awaitable[None]] = []
        results: list[TxnMarkerResult] = []
        for marker in request.markers:
            control = ControlType.COMMIT if marker.committed else ControlType.ABORT
            topics: list[TxnTopicResult] = []
            for topic in marker.topics:
                answers: list[TxnPartitionResult] = []
                for p in topic.partitions:
                    answer = TxnPartitionResult(p)
                    answers.append(answer)
                    try:
                        partition = self.leader_partition(topic.name, p)
                        if len(partition.isr) < partition.config.min_insync_replicas:
                            raise NotEnoughReplicasError(
                                f"{partition.name} has {len(partition.isr)} in-sync "
                                "replica(s), below min.insync.replicas: the marker waits")
                        offset = partition.append_marker(
                            marker.producer_id, marker.producer_epoch, control,
                            marker.coordinator_epoch)
                        end = partition.log.log_end_offset if offset is None else offset + 1
                        waits.append(self._await_ack(partition, end, ACKS_ALL,
                                                     _MARKER_TIMEOUT_MS, answer))
                    except StrataError as err:
                        answer.error_code, answer.error_message = error_fields(err)
                    except OSError as err:
                        answer.error_code, answer.error_message = error_fields(
                            LogStorageError(f"{topic.name}-{p}: {err}"))
                topics.append(TxnTopicResult(topic.name, answers))
            results.append(TxnMarkerResult(marker.producer_id, topics))
        if waits:
            await asyncio.gather(*waits)
        return WriteTxnMarkersResponse(results)

    async def commit_staged(self, request: CommitStagedRequest, *,
                            admit: Callable[[str], None],
                            verify: Verify | None = None) -> CommitStagedResponse:
        """A sink's commit: append each partition's staged chunks as its leader
        (``Partition.commit_staged``) and answer once each is acknowledged as an
        ``acks=all`` produce would be. ``admit(topic)`` is the handlers' check.

        A commit inside a transaction (``request.transactional_id``) that would open
        the transaction in a partition is appended only once ``verify`` (the
        transaction coordinator) says the partition is in it: one question for all such
        partitions, before anything is written."""
        waits: list[Awaitable[None]] = []
        txn: tuple[int, int] | None = None
        refused: Mapping[PartitionKey, StrataError | None] = {}
        if request.transactional_id is not None:
            txn = (request.txn_producer_id, request.txn_producer_epoch)
            refused = await self._verify_txn_commit(request, verify)

        def commit(topic: str, part: CommitPartition, answer: CommitPartitionResponse) -> None:
            admit(topic)
            partition = self.leader_partition(topic, part.partition)
            if (error := refused.get((topic, part.partition))) is not None:
                raise error
            result = partition.commit_staged(
                request.producer_id, request.batch_id,
                [StagedPart(p.staging_id, p.chunks, p.records) for p in part.parts],
                txn=txn, verified=(topic, part.partition) in refused)
            answer.duplicate = result.duplicate
            answer.base_offset = result.first_offset
            answer.last_offset = result.last_offset
            answer.last_committed_batch = result.last_committed_batch
            # A replay answers only once the first commit is durable too: its answer may
            # have been lost before the fsync finished. The log end covers it (the first
            # commit's end offset is not remembered).
            end = partition.log.log_end_offset if result.duplicate else result.last_offset + 1
            waits.append(self._await_ack(partition, end, ACKS_ALL, request.timeout_ms, answer))

        answered = answer_each(
            request.topics, lambda p: CommitPartitionResponse(p, 0), commit,
            disk_failure="reading staged data of {partition} failed: {err}; fix the disk, "
            "then re-run the batch")
        if waits:
            await asyncio.gather(*waits)
        return CommitStagedResponse([CommitTopicResponse(t, a) for t, a in answered])

    async def _verify_txn_commit(self, request: CommitStagedRequest, verify: Verify | None
                                 ) -> Mapping[PartitionKey, StrataError | None]:
        """The coordinator's word on each partition where the commit would open its
        transaction (the keys are exactly those partitions; None: verified)."""
        assert request.transactional_id is not None
        wanted: list[PartitionKey] = []
        for topic in request.topics:
            for part in topic.partitions:
                partition = self.registry.hosted.get((topic.name, part.partition))
                if partition is None or not partition.is_leader:
                    continue  # the commit answers why
                if partition.needs_txn_verification(request.txn_producer_id):
                    wanted.append((topic.name, part.partition))
        if not wanted:
            return {}
        if verify is None:
            return dict.fromkeys(wanted, CoordinatorNotAvailableError(
                "this broker has no transaction coordinator to verify the transaction "
                "with; upgrade it"))
        return await verify(request.transactional_id, request.txn_producer_id,
                            request.txn_producer_epoch, wanted)

    async def _await_ack(self, partition: Partition, end_offset: int, acks: int,
                         timeout_ms: int, answer: PartitionAnswer) -> None:
        """Wait until the write ending at ``end_offset`` may be acknowledged as ``acks``
        asks (1: durable here; all: also in every in-sync replica, with the ISR still at
        least ``min.insync.replicas``); otherwise put the reason in ``answer``."""
        try:
            await asyncio.wait_for(partition.wait_durable(end_offset), max(timeout_ms, 1) / 1000)
            if acks == ACKS_ALL:
                if not await partition.wait_replicated(end_offset, timeout_ms / 1000):
                    # Superseded while waiting: whether the write survives is up to the
                    # new leader; never claim it here.
                    raise NotLeaderError(
                        f"broker {self.broker_id} stopped leading {partition.name} "
                        "before the write was acknowledged; it may or may not be kept: "
                        "retry (idempotence removes a duplicate)")
                if len(partition.isr) < partition.config.min_insync_replicas:
                    raise NotEnoughReplicasAfterAppendError(
                        f"{partition.name}: the write is in the log, but only "
                        f"{len(partition.isr)} replica(s) are in sync and "
                        f"min.insync.replicas is {partition.config.min_insync_replicas}, so "
                        "it is not acknowledged; retry (an idempotent producer's retry "
                        "is not written twice)")
        except TimeoutError:
            err = RequestTimedOutError(
                f"{partition.name}: the write was not acknowledged by the in-sync replicas "
                f"within {timeout_ms} ms; it may still be committed, retry with idempotence")
            answer.error_code, answer.error_message = error_fields(err)
        except StrataError as err:
            answer.error_code, answer.error_message = error_fields(err)

    # ------------------------------------------------------------------ reads
    async def fetch_records(self, request: FetchRequest, *, authorize: Callable[[str], None],
                            quota: Quota) -> FetchResponse:
        """A fetch: read each partition as its leader, waiting up to ``max_wait_ms``
        (capped by ``fetch.max.wait.ms``) for ``min_bytes``. A follower's fetch
        (``replica_id`` >= 0; the handlers checked its right) records its positions
        first; in a session (``session_epoch`` >= 0) only what changed travels.
        ``authorize(topic)`` is the handlers' check of a consumer's read; ``quota`` gets
        a consumer's answered bytes."""
        if request.session_epoch >= 0:
            return await self._session_fetch(request, authorize)
        max_wait = min(max(request.max_wait_ms, 0), self.config.fetch_max_wait_ms) / 1000
        deadline = time.monotonic() + max_wait
        if request.replica_id >= 0:
            self._record_follower_positions(request)
        while True:
            response, size, partitions = self._read(request, authorize)
            remaining = deadline - time.monotonic()
            if size >= max(request.min_bytes, 1) or remaining <= 0 or not partitions \
                    or self.host.stopping:
                if request.replica_id < 0:
                    response.throttle_time_ms = quota(size)
                return response
            # As in Kafka: a partition error (out of range, not leader, ...) is answered at
            # once; waiting for data could not fix it and would delay the client's reset.
            if any(p.error_code for t in response.topics for p in t.partitions):
                if request.replica_id < 0:
                    response.throttle_time_ms = quota(size)
                return response
            # One future for every partition, registered in the same loop turn as the read
            # above: an append in between cannot be missed.
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            for partition in partitions:
                partition.watch_data(woken)
            try:
                await asyncio.wait([woken], timeout=remaining)
            finally:
                for partition in partitions:
                    partition.unwatch_data(woken)
                woken.cancel()

    async def _session_fetch(self, request: FetchRequest, authorize: Callable[[str], None]
                             ) -> FetchResponse:
        """A follower's fetch in a session (see ``FetchRequest``): only partitions that
        changed travel, either way, so a round costs a comparison per idle partition
        instead of decoding, reading and encoding each one."""
        if request.replica_id < 0:
            raise InvalidRequestError(
                "fetch sessions are for followers (replica_id >= 0); a consumer fetches "
                "with session_epoch -1")
        replica = request.replica_id
        session = self.fetch_sessions.begin(request)
        if isinstance(session, StrataError):
            return FetchResponse([], session.code)
        hosted = self.registry.hosted
        listed = session.update(request, hosted)
        # Followers' positions: the listed ones (they move the HW). The others stay where
        # they were, and the clock ticked by ``begin`` says the follower is still there.
        self._record_session_positions(replica, session, listed)
        now_ms = time.monotonic_ns() // 1_000_000
        if now_ms - session.swept_ms >= self.config.replica_lag_time_max_ms / 4:
            session.swept_ms = now_ms
            self._sweep_session(replica, session)
        max_wait = min(max(request.max_wait_ms, 0), self.config.fetch_max_wait_ms) / 1000
        deadline = time.monotonic() + max_wait
        while True:
            changed, session.dirty = session.dirty, set()
            if session.held:
                changed |= session.held
                session.held = set()
            wanted, urgent = session.candidates(changed, hosted)
            remaining = deadline - time.monotonic()
            if urgent or remaining <= 0 or not session.partitions or self.host.stopping:
                view = FetchRequest([FetchTopic(t, ps) for t, ps in wanted.items()],
                                    max_bytes=request.max_bytes, replica_id=replica)
                response, _, _ = self._read(view, authorize)
                break
            # Nothing to send, or only high watermarks that moved (held for the next
            # answer: fetch_session's docstring): park until a partition changes.
            session.held.update((t, p.partition) for t, ps in wanted.items() for p in ps)
            session.woken = asyncio.get_running_loop().create_future()
            try:
                if not session.dirty:
                    await asyncio.wait([session.woken], timeout=remaining)
            finally:
                session.woken.cancel()
                session.woken = None
        session.answered(response)
        return response

    def _read(self, request: FetchRequest, authorize: Callable[[str], None]
              ) -> tuple[FetchResponse, int, list[Partition]]:
        """One pass over the request's partitions: the answer, the bytes it carries and
        the partitions a long poll may wait on."""
        budget = max(request.max_bytes, 1)
        total = 0
        waitable: list[Partition] = []

        def read(topic: str, part: FetchPartition, answer: FetchPartitionResponse) -> None:
            nonlocal budget, total
            if request.replica_id < 0:  # a follower's right was checked for the request
                authorize(topic)
            partition = self.leader_partition(topic, part.partition)
            self.check_epoch(partition, part.current_leader_epoch)
            if request.replica_id >= 0 and request.replica_id not in partition.replicas:
                raise NotLeaderError(
                    f"broker {request.replica_id} is not a replica of {partition.name} "
                    f"(replicas {partition.replicas})")
            waitable.append(partition)
            answer.high_watermark = partition.high_watermark
            answer.log_start_offset = partition.log.log_start_offset
            answer.log_end_offset = partition.log.log_end_offset
            # As in Kafka (KIP-74): the first non-empty partition returns at least one
            # whole batch, so a consumer always gets past a batch above the limits; every
            # later partition must fit both limits.
            limit = max(1, min(part.partition_max_bytes, budget))
            if budget <= 0:
                return
            committed = request.isolation_level == READ_COMMITTED and request.replica_id < 0
            try:
                found = partition.read(part.fetch_offset, limit,
                                       for_follower=request.replica_id >= 0,
                                       committed=committed)
            except OffsetOutOfRangeError as err:
                answer.log_start_offset = err.log_start_offset
                answer.high_watermark = err.log_end_offset
                raise
            answer.last_stable_offset = partition.last_stable_offset
            if found is not None and (not total or found.length <= limit):
                answer.records = found
                total += found.length
                budget -= found.length
                if committed:
                    # Of the same log the data comes from (Redpanda's lesson: never
                    # another source's list).
                    answer.aborted_transactions = [
                        AbortedTransactionEntry(a.producer_id, a.first_offset)
                        for a in partition.aborted_transactions(found.first_offset,
                                                                found.next_offset)]

        answered = answer_each(request.topics, lambda p: FetchPartitionResponse(p, 0), read)
        return FetchResponse([FetchTopicResponse(t, a) for t, a in answered]), total, waitable

    # ------------------------------------------------------------------ follower positions
    def _record_follower_positions(self, request: FetchRequest) -> None:
        """A follower's fetch offsets are its log end: they move the HW and the ISR."""
        for topic in request.topics:
            for part in topic.partitions:
                partition = self.registry.hosted.get((topic.name, part.partition))
                if partition is None or not partition.is_leader \
                        or part.current_leader_epoch != partition.leader_epoch:
                    continue  # answered with an error by _read
                partition.record_follower_fetch(request.replica_id, part.fetch_offset)
                if request.replica_id not in partition.isr:
                    self.consider_isr((topic.name, part.partition), partition)

    def _record_session_positions(self, replica: int, session: FetchSession,
                                  keys: Iterable[PartitionKey]) -> None:
        """Record the positions of ``keys``, the partitions this request listed."""
        for name, p in keys:
            entry = session.partitions.get((name, p))
            if entry is None:
                continue
            partition = self.registry.hosted.get((name, p))
            if partition is None or not partition.is_leader \
                    or entry.leader_epoch not in (-1, partition.leader_epoch):
                continue
            partition.record_follower_fetch(replica, entry.fetch_offset, session.clock)
            if replica not in partition.isr:
                self.consider_isr((name, p), partition)

    def _sweep_session(self, replica: int, session: FetchSession) -> None:
        """Listen to partitions hosted (or re-created) since the session named them, and
        look at those once. Attach the session's clock to the follower's position where
        it is not attached yet: a partition the follower named before this broker led it
        in that epoch (it learnt of the new leader first), or one that became led here
        after it was named; the follower names it again only when its offset moves, so
        without this an idle partition would drop it from the ISR. A few attribute reads
        per partition. (A lost answer needs no resend: the follower opens a new session
        after any failed request.)"""
        hosted = self.registry.hosted
        for key, entry in session.partitions.items():
            partition = hosted.get(key)
            if session.listen(key, partition):
                session.dirty.add(key)
            if partition is None or not partition.is_leader \
                    or entry.leader_epoch not in (-1, partition.leader_epoch):
                continue
            position = partition.followers.get(replica)
            if position is not None and position.session is not session.clock:
                partition.record_follower_fetch(replica, entry.fetch_offset, session.clock)
                if replica not in partition.isr:
                    self.consider_isr(key, partition)

    # ------------------------------------------------------------------ ISR upkeep
    def consider_isr(self, key: PartitionKey, partition: Partition) -> None:
        """Propose an ISR change for ``partition`` now if it needs one (after a fetch)."""
        if key in self._isr_writes or self.host.zookeeper_suspended:
            return
        proposed = partition.isr_change(self.config.replica_lag_time_max_ms,
                                        self.cluster.shutting_down)
        if proposed is None:
            return
        if any(b not in partition.isr for b in proposed):
            # Growing: until ZooKeeper's answer is applied, the HW waits for the joining
            # replica too (it may be in the ISR, so electable, as soon as the write lands).
            partition.pending_isr = list(proposed)
        self._isr_writes.add(key)
        self._isr_queue[key] = (partition, proposed)
        if self._isr_writer is None or self._isr_writer.done():
            self._isr_writer = asyncio.get_running_loop().create_task(self._write_isrs())

    async def _maintain(self) -> None:
        interval = max(self.config.replica_lag_time_max_ms / 2000, 0.05)
        checkpointed: dict[PartitionKey, int] = {}
        while True:
            await asyncio.sleep(interval)
            try:
                changed = False
                hosted = self.registry.hosted
                sliced = time.monotonic()
                for key, partition in list(hosted.items()):
                    if time.monotonic() - sliced > _UPKEEP_SLICE_S:
                        # Ten thousand partitions in one go would hold every request up
                        # for tens of milliseconds: let them through between slices
                        # (short ones: a request waits a slice at each of its awaits).
                        await asyncio.sleep(0)
                        sliced = time.monotonic()
                    if hosted.get(key) is not partition:
                        continue  # dropped or replaced during a pause
                    if partition.is_leader:
                        self.consider_isr(key, partition)
                    if not changed and not partition.log.is_offline \
                            and checkpointed.get(key) != partition.high_watermark:
                        changed = True
                if changed or len(checkpointed) > len(hosted) + len(self.registry.offline):
                    # One file for every replica, written off the event loop, and only
                    # when a HW moved (or replicas went away).
                    entries = self.host.high_watermark_entries(
                        [p for p in hosted.values() if not p.log.is_offline],
                        keep=self.registry.offline)
                    try:
                        await asyncio.to_thread(self.host.write_high_watermarks, entries)
                        checkpointed = entries
                    except OSError as err:
                        log.error("the high-watermark checkpoint could not be written: %s; "
                                  "trying again next round", err)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("ISR upkeep round failed; trying again next round")

    async def _write_isrs(self) -> None:
        """Write the queued ISR proposals: everything queued while a batch is in flight
        goes out as the next pipelined batch (after a broker restarts, its thousands of
        partitions rejoin their ISRs in a few ZooKeeper round trips, not one each)."""
        while self._isr_queue:
            queued, self._isr_queue = self._isr_queue, {}
            states: dict[PartitionKey, PartitionState] = {}
            for key, (partition, proposed) in queued.items():
                current = self.cluster.partition_states.get(key)
                states[key] = PartitionState(partition.leader_id, partition.leader_epoch,
                                             proposed,
                                             current.controller_epoch if current else 0,
                                             partition.state_version)
            try:
                outcome = await asyncio.to_thread(
                    self.zookeeper.write_partition_states, states)
            except Exception as err:  # ZooKeeper trouble: proposed again on the next round
                log.warning("changing the ISR of %d partition(s) failed: %r", len(states), err)
                outcome = None
            finally:
                self._isr_writes.difference_update(queued)
            if outcome is None:
                continue
            for key, written in outcome.written.items():
                log.debug("%s-%d: ISR %s -> %s", key[0], key[1], queued[key][0].isr,
                          written.isr)
                self.host.apply_partition_state(key[0], key[1], written, quiet=True)
            # Someone (the controller) changed the state first: take theirs.
            for key, fresh in outcome.conflicts.items():
                self.host.apply_partition_state(key[0], key[1], fresh, quiet=True)
            if outcome.written:
                first = next(iter(outcome.written))
                log.info("ISR changed for %d partition(s) (e.g. %s-%d: %s)%s",
                         len(outcome.written), first[0], first[1],
                         outcome.written[first].isr,
                         f"; {len(outcome.conflicts)} superseded by newer states"
                         if outcome.conflicts else "")
