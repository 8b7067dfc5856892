"""Admin API family: transactions (docs/transactions.md), as Kafka's Admin and its
``kafka-transactions`` tool see them.

Part of the admin client (``strata.client.admin`` is the face).

``describe_transactions`` asks each transactional id's coordinator (found with
``FindCoordinator`` key type 1; a coordinator that moved is looked up again until the
request timeout: ``CoordinatorLink``). ``list_transactions`` asks every live broker,
since each one lists only the ids it coordinates, and merges the answers, as
``list_groups`` does. ``describe_producers`` asks the partition's leader, which alone
knows the producers that wrote there and the first offset of each one's open
transaction; a leader that moved is retried after a metadata refresh.

``abort_transaction`` is Kafka's ``Admin.abortTransaction`` behind ``kafka-transactions
abort --start-offset``: it finds the producer whose open transaction starts at that
offset (DescribeProducers on the leader) and sends the leader the ABORT marker a
coordinator would (WriteTxnMarkers with that producer id and epoch and the coordinator
epoch the leader reports, 0 when it has seen none), retrying at the new leader when the
leader moves. It needs CLUSTER_ACTION on the cluster, as every WriteTxnMarkers does. It
is for a *hanging* transaction, one its coordinator will never end: aborting a
transaction the coordinator still tracks ends it in this partition only (its other
partitions commit or abort as the producer decides), which breaks its atomicity.

``find_hanging`` is ``kafka-transactions find-hanging``: per partition, the open
transactions whose producer has written nothing for longer than
``max_transaction_timeout_ms`` (the broker's ``transaction.max.timeout.ms``, after which
a coordinator aborts any transaction it knows of), that no coordinator lists as open
with that partition: no transactional id holds the producer id, or its transaction does
not include the partition. Such a transaction holds the partition's last stable offset,
and so every read_committed reader, until ``abort_transaction`` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from strata.client._admin_common import AdminContext
from strata.client._admin_topics import TopicAdmin
from strata.client._common import TopicPartition, error_from_code, is_transient
from strata.client._group import CoordinatorLink
from wire.errors import (
    ClusterAuthorizationFailedError,
    InvalidProducerEpochError,
    InvalidRequestError,
    InvalidTxnStateError,
    NetworkError,
    StrataError,
    TransactionalIdNotFoundError,
    TransactionCoordinatorFencedError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    ApiKey,
    DescribedTransaction,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    Message,
    TxnMarker,
    TxnTopic,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
    group_by_topic,
)

__all__ = [
    "TRANSACTION_STATES",
    "AbortTransactionSpec",
    "HangingTransaction",
    "ProducerState",
    "TransactionAdmin",
    "TransactionDescription",
    "TransactionListing",
]

#: The coordinator's state names (Kafka's), as DescribeTransactions and
#: ListTransactions give them and ``list_transactions(states=...)`` filters on.
TRANSACTION_STATES: Final = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort",
                             "CompleteCommit", "CompleteAbort", "PrepareEpochFence", "Dead")
#: Kafka's ``find-hanging`` default: the broker's default ``transaction.max.timeout.ms``.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS: Final = 15 * 60_000


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """One transactional id as its coordinator lists it (``coordinator``: node id)."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator: int


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """One transactional id, from its coordinator. ``start_ms``: when the open (or the
    last) transaction began, ms since the epoch (None: never); ``partitions``: those in
    the open transaction, or still waiting for their markers while it completes (empty
    once it completed). ``two_phase`` and ``tag`` are Strata's (docs/transactions.md)."""

    transactional_id: str
    coordinator: int
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_ms: int | None
    partitions: tuple[TopicPartition, ...]
    two_phase: bool
    tag: str | None


@dataclass(frozen=True, slots=True)
class ProducerState:
    """A producer with state in a partition, as its leader knows it.
    ``coordinator_epoch``: of the last marker it got here (-1: none);
    ``current_txn_start_offset``: first offset of its open transaction here (None: none);
    ``last_timestamp``: the largest record timestamp of its batches here (ms)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int | None


@dataclass(frozen=True, slots=True)
class AbortTransactionSpec:
    """What ``abort_transaction`` wrote: an ABORT marker for ``producer_id`` /
    ``producer_epoch`` in one partition, as coordinator epoch ``coordinator_epoch``,
    ending the transaction that started at ``start_offset`` (Kafka's
    ``AbortTransactionSpec``, plus the offset)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """An open transaction no coordinator will end (see the module docstring).
    ``transactional_id``: the id that holds the producer id now (None: none does);
    ``reason``: why it is hanging, in words."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp: int
    transactional_id: str | None
    reason: str


def _described_error(response: Message) -> StrataError | None:
    assert isinstance(response, DescribeTransactionsResponse)
    for entry in response.transactions:
        if entry.error_code:
            return error_from_code(entry.error_code, entry.error_message)
    return None


def _check_id(transactional_id: str) -> str:
    if not isinstance(transactional_id, str) or not transactional_id:
        raise ValueError(f"transactional id {transactional_id!r} is not valid; give a "
                         "non-empty id")
    return transactional_id


class TransactionAdmin:
    """Transactional ids (from their coordinators) and open transactions (from the
    partition leaders)."""

    def __init__(self, context: AdminContext, topics: TopicAdmin) -> None:
        self.context = context
        self._cluster = context.cluster
        self.topics = topics

    def _link(self, transactional_id: str) -> CoordinatorLink:
        return CoordinatorLink(self._cluster, _check_id(transactional_id),
                               request_timeout_ms=self.context.request_timeout_ms,
                               retry_backoff_ms=self.context.retry_backoff_ms, key_type=1)

    # ------------------------------------------------------------------ coordinators
    async def describe_transactions(self, transactional_ids: Iterable[str]
                                    ) -> dict[str, TransactionDescription]:
        wanted = [_check_id(t) for t in dict.fromkeys(transactional_ids)]
        found = await asyncio.gather(*(self._describe(t) for t in wanted))
        return dict(zip(wanted, found, strict=True))

    async def _describe(self, transactional_id: str) -> TransactionDescription:
        link = self._link(transactional_id)
        response = await link.request(
            ApiKey.DESCRIBE_TRANSACTIONS, DescribeTransactionsRequest([transactional_id]),
            check=_described_error)
        assert isinstance(response, DescribeTransactionsResponse)
        described: DescribedTransaction = response.transactions[0]
        coordinator = await link.find()
        return TransactionDescription(
            transactional_id, coordinator.node_id, described.state, described.producer_id,
            described.producer_epoch, described.timeout_ms,
            described.start_ms if described.start_ms >= 0 else None,
            tuple(sorted(TopicPartition(t.name, p) for t in described.topics
                         for p in t.partitions)),
            described.two_phase, described.tag)

    async def _describe_or_none(self, transactional_id: str) -> TransactionDescription | None:
        try:
            return await self._describe(transactional_id)
        except TransactionalIdNotFoundError:
            return None

    async def list_transactions(self, states: Iterable[str] | None = None,
                                producer_ids: Iterable[int] | None = None,
                                duration_ms: int | None = None) -> list[TransactionListing]:
        state_filter = sorted(set(states or ()))
        unknown = [s for s in state_filter if s not in TRANSACTION_STATES]
        if unknown:
            raise ValueError(f"transaction state(s) {unknown} are not valid; use "
                             f"{', '.join(TRANSACTION_STATES)}")
        pid_filter = sorted(set(producer_ids or ()))
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in pid_filter):
            raise ValueError(f"producer ids {pid_filter} are not valid; give ids >= 0")
        if duration_ms is not None and duration_ms < 0:
            raise ValueError(f"duration_ms={duration_ms} is not valid; give 0 or more "
                             "(None: no filter)")
        request = ListTransactionsRequest(state_filter, pid_filter,
                                          -1 if duration_ms is None else duration_ms)
        await self._cluster.refresh([])
        deadline = time.monotonic() + self.context.request_timeout_s

        async def ask(node: int) -> list[TransactionListing]:
            attempt = 0
            while True:
                try:
                    connection = await self._cluster.connection(node)
                    response = await asyncio.wait_for(
                        connection.request(ApiKey.LIST_TRANSACTIONS, request),
                        max(deadline - time.monotonic(), 0.001))
                    assert isinstance(response, ListTransactionsResponse)
                    if response.error_code == 0:
                        return [TransactionListing(t.transactional_id, t.producer_id,
                                                   t.state, node)
                                for t in response.transactions]
                    error = error_from_code(response.error_code, response.error_message)
                except (StrataError, TimeoutError) as err:
                    error = err if isinstance(err, StrataError) else \
                        NetworkError(f"broker {node} did not answer ListTransactions in time")
                if not is_transient(error) or time.monotonic() >= deadline:
                    raise error
                await self._cluster.backoff(attempt)
                attempt += 1
                with contextlib.suppress(StrataError, TimeoutError):
                    await self._cluster.refresh([])
                if node not in self._cluster.brokers:
                    return []  # it died: its ids are listed by their new coordinators

        found = await asyncio.gather(*(ask(node) for node in sorted(self._cluster.brokers)))
        merged: dict[str, TransactionListing] = {}
        for listing in (t for part in found for t in part):
            # During a coordinator move two brokers may list an id for a moment.
            merged.setdefault(listing.transactional_id, listing)
        return [merged[t] for t in sorted(merged)]

    # ------------------------------------------------------------------ partition leaders
    async def describe_producers(self, topic: str, partition: int) -> list[ProducerState]:
        tp = TopicPartition(topic, partition)
        return (await self._producers([tp]))[tp]

    async def _producers(self, partitions: Iterable[TopicPartition]
                         ) -> dict[TopicPartition, list[ProducerState]]:
        """DescribeProducers of every partition at its leader (leader moves retried)."""
        wanted = sorted(set(partitions))
        if any(p.partition < 0 for p in wanted):
            raise ValueError(f"partitions {[str(p) for p in wanted if p.partition < 0]} "
                             "are not valid; give partition numbers >= 0")
        if not wanted:
            return {}
        response = await self.context.existing_topics(sorted({tp.topic for tp in wanted}))
        existing = {TopicPartition(t.name, p.partition)
                    for t in response.topics for p in t.partitions}
        for tp in wanted:
            if tp not in existing:
                count = sum(1 for e in existing if e.topic == tp.topic)
                raise UnknownTopicOrPartitionError(
                    f"{tp.topic} has partitions 0..{count - 1}; {tp.partition} does not "
                    "exist")
        pending = set(wanted)
        out: dict[TopicPartition, list[ProducerState]] = {}
        deadline = time.monotonic() + self.context.request_timeout_s
        attempt = 0
        while True:
            last_error: StrataError | None = None
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in sorted(pending):
                try:
                    by_leader.setdefault(await self._cluster.leader_for(*tp), []).append(tp)
                except StrataError as err:
                    if not is_transient(err):
                        raise
                    last_error = err
            remaining = max(deadline - time.monotonic(), 0.001)
            rounds = await asyncio.gather(*(self._producers_at(node, tps, remaining)
                                            for node, tps in by_leader.items()))
            for found in rounds:
                for tp, answer in found.items():
                    if isinstance(answer, StrataError):
                        if not is_transient(answer):
                            raise answer
                        last_error = answer
                        continue
                    out[tp] = answer
                    pending.discard(tp)
            if not pending:
                return {tp: out[tp] for tp in wanted}
            if time.monotonic() >= deadline:
                raise last_error or NetworkError("DescribeProducers got no answer in time; "
                                                 "retry")
            if attempt:
                await self._cluster.backoff(attempt)
            attempt += 1
            with contextlib.suppress(StrataError, TimeoutError):
                await self._cluster.refresh(sorted({tp.topic for tp in pending}))

    async def _producers_at(self, node: int, tps: list[TopicPartition], timeout_s: float
                            ) -> dict[TopicPartition, list[ProducerState] | StrataError]:
        request = DescribeProducersRequest([TxnTopic(t, ps) for t, ps in
                                            group_by_topic(tps).items()])
        try:
            connection = await self._cluster.connection(node)
            response = await asyncio.wait_for(
                connection.request(ApiKey.DESCRIBE_PRODUCERS, request), timeout_s)
        except (StrataError, TimeoutError) as err:
            failed = err if isinstance(err, StrataError) else \
                NetworkError(f"broker {node} did not answer DescribeProducers in time")
            return dict.fromkeys(tps, failed)
        assert isinstance(response, DescribeProducersResponse)
        out: dict[TopicPartition, list[ProducerState] | StrataError] = {}
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                if p.error_code:
                    out[tp] = error_from_code(p.error_code, p.error_message)
                    continue
                out[tp] = [ProducerState(
                    a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp,
                    a.coordinator_epoch,
                    a.current_txn_start_offset if a.current_txn_start_offset >= 0 else None)
                    for a in p.producers]
        for tp in tps:
            out.setdefault(tp, NetworkError(f"broker {node} left {tp} out of its answer; "
                                            "retry"))
        return out

    async def abort_transaction(self, topic: str, partition: int, start_offset: int
                                ) -> AbortTransactionSpec:
        if isinstance(start_offset, bool) or not isinstance(start_offset, int) or \
                start_offset < 0:
            raise ValueError(f"start_offset={start_offset!r} is not valid; give the first "
                             "offset of the open transaction (>= 0), as describe_producers "
                             "shows it")
        producers = await self.describe_producers(topic, partition)
        found = [p for p in producers if p.current_txn_start_offset == start_offset]
        if not found:
            opened = sorted(p.current_txn_start_offset for p in producers
                            if p.current_txn_start_offset is not None)
            raise InvalidTxnStateError(
                f"no open transaction starts at offset {start_offset} of {topic}-{partition} "
                + (f"(open ones start at {', '.join(map(str, opened))})" if opened else
                   "(none is open there)")
                + f"; see `strata transactions describe-producers --topic {topic} "
                f"--partition {partition}`. Nothing was written")
        producer = found[0]
        # A producer that never got a marker here reports coordinator epoch -1: 0 is at
        # or below every coordinator epoch, so a real coordinator's marker still passes.
        spec = AbortTransactionSpec(topic, partition, producer.producer_id,
                                    producer.producer_epoch,
                                    max(producer.coordinator_epoch, 0), start_offset)
        await self._write_abort_marker(spec)
        return spec

    async def _write_abort_marker(self, spec: AbortTransactionSpec) -> None:
        request = WriteTxnMarkersRequest([TxnMarker(
            spec.producer_id, spec.producer_epoch, False, spec.coordinator_epoch,
            [TxnTopic(spec.topic, [spec.partition])])])
        what = (f"the ABORT marker of producer {spec.producer_id} (epoch "
                f"{spec.producer_epoch}, coordinator epoch {spec.coordinator_epoch}) in "
                f"{spec.topic}-{spec.partition}")
        deadline = time.monotonic() + self.context.request_timeout_s
        attempt = 0
        while True:
            error: StrataError
            try:
                node = await self._cluster.leader_for(spec.topic, spec.partition)
                connection = await self._cluster.connection(node)
                response = await asyncio.wait_for(
                    connection.request(ApiKey.WRITE_TXN_MARKERS, request),
                    max(deadline - time.monotonic(), 0.001))
                assert isinstance(response, WriteTxnMarkersResponse)
                results = [(t.name, r) for m in response.markers for t in m.topics
                           for r in t.partitions]
                if len(results) != 1 or results[0][0] != spec.topic or \
                        results[0][1].partition != spec.partition:
                    raise InvalidRequestError(f"the answer to {what} names other partitions: "
                                              f"{response!r}")
                result = results[0][1]
                if result.error_code == 0:
                    return
                error = error_from_code(result.error_code, result.error_message)
            except (StrataError, TimeoutError) as err:
                error = err if isinstance(err, StrataError) else \
                    NetworkError(f"the leader did not answer {what} in time")
            if isinstance(error, ClusterAuthorizationFailedError):
                raise ClusterAuthorizationFailedError(
                    f"writing {what} needs CLUSTER_ACTION on the cluster, as a transaction "
                    f"coordinator's markers do ({error.message})")
            if isinstance(error, InvalidProducerEpochError):
                raise InvalidProducerEpochError(
                    f"{what} was refused: the producer has moved to a newer epoch there, so "
                    "its transaction was ended (or taken over) meanwhile; run "
                    "describe-producers again before aborting anything")
            if isinstance(error, TransactionCoordinatorFencedError):
                raise TransactionCoordinatorFencedError(
                    f"{what} was refused: a newer coordinator has written markers for this "
                    "producer there, so it owns the transaction; run describe-producers "
                    "again before aborting anything")
            if not is_transient(error) or time.monotonic() >= deadline:
                raise error
            await self._cluster.backoff(attempt)
            attempt += 1
            with contextlib.suppress(StrataError, TimeoutError):
                await self._cluster.refresh([spec.topic])

    # ------------------------------------------------------------------ hanging
    async def find_hanging(self, topics: Iterable[str] | None = None, *,
                           partition: int | None = None,
                           max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
                           ) -> list[HangingTransaction]:
        if max_transaction_timeout_ms < 0:
            raise ValueError(f"max_transaction_timeout_ms={max_transaction_timeout_ms} is "
                             "not valid; give 0 or more (the brokers' "
                             "transaction.max.timeout.ms)")
        names = None if topics is None else list(dict.fromkeys(topics))
        if partition is not None and (names is None or len(names) != 1):
            raise ValueError("partition= needs exactly one topic")
        if partition is not None:
            wanted = [TopicPartition(names[0], partition)] if names else []
        else:
            if names is None:
                names = await self.topics.list_topics()
            described = await self.topics.describe_topics(names) if names else {}
            wanted = [TopicPartition(name, p.partition)
                      for name, d in described.items() for p in d.partitions]
        producers = await self._producers(wanted)
        now = time.time_ns() // 1_000_000
        # Open longer than the coordinators' largest timeout: any coordinator that knew of
        # it would have aborted it by now (Kafka's candidates).
        candidates = [(tp, p) for tp, states in producers.items() for p in states
                      if p.current_txn_start_offset is not None
                      and now - p.last_timestamp > max_transaction_timeout_ms]
        if not candidates:
            return []
        pids = sorted({p.producer_id for _, p in candidates})
        holders = {t.producer_id: t.transactional_id
                   for t in await self.list_transactions(producer_ids=pids)}
        ids = sorted(set(holders.values()))
        descriptions = dict(zip(ids, await asyncio.gather(
            *(self._describe_or_none(t) for t in ids)), strict=True))
        hanging: list[HangingTransaction] = []
        for tp, p in sorted(candidates, key=lambda c: (c[0], c[1].producer_id)):
            txn_id = holders.get(p.producer_id)
            description = descriptions.get(txn_id) if txn_id is not None else None
            if txn_id is None:
                reason = (f"no coordinator holds producer id {p.producer_id} (its "
                          "transactional id expired, or its state was lost)")
            elif description is None:
                reason = f"transactional id {txn_id!r} has no state at its coordinator"
            elif tp not in description.partitions:
                reason = (f"the coordinator of {txn_id!r} does not have {tp} in its "
                          f"transaction (state {description.state})")
            else:
                continue  # the coordinator will write the marker
            assert p.current_txn_start_offset is not None
            hanging.append(HangingTransaction(
                tp.topic, tp.partition, p.producer_id, p.producer_epoch,
                p.coordinator_epoch, p.current_txn_start_offset, p.last_timestamp, txn_id,
                reason))
        return hanging
