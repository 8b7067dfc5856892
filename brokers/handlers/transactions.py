"""Transactions: InitProducerId (idempotent and transactional producers),
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit,
DescribeTransactions, ListTransactions and DescribeProducers (docs/transactions.md).

Thin over the transaction coordinator (``brokers/transaction_coordinator.py``), the
replica manager (markers) and the group coordinator (offsets in a transaction); this
family decides who may do what, as Kafka does: WRITE on the TRANSACTIONAL_ID for a
transactional producer's requests (and WRITE on each topic it adds, READ on a group
whose offsets it commits), DESCRIBE on it to see it, CLUSTER_ACTION for what brokers
ask each other (markers, a leader's verification), READ on a topic to list its
producers. An idempotent producer's InitProducerId needs IDEMPOTENT_WRITE on the
cluster or WRITE on some topic.
"""

from __future__ import annotations

from brokers.acl import CLUSTER_NAME
from brokers.answers import error_fields
from brokers.handlers.context import (
    INTERNAL_SESSION,
    ApiContext,
    ApiFamily,
    Handler,
    current_session,
)
from brokers.transaction_coordinator import TransactionCoordinator
from wire.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    StrataError,
)
from wire.protocol import (
    ActiveProducer,
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    ApiKey,
    DescribedTransaction,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    ProducersPartitionResult,
    ProducersTopicResult,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    TxnPartitionResult,
    TxnTopicResult,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

__all__ = ["TransactionApis"]


class TransactionApis(ApiFamily):
    """The transaction APIs, over the transaction coordinator."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.replicas = context.replicas
        self.groups = context.groups
        self.acls = context.acls
        self._transactions = context.transactions

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            ApiKey.END_TXN: self.end_txn,
            ApiKey.WRITE_TXN_MARKERS: self.write_txn_markers,
            ApiKey.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            ApiKey.DESCRIBE_TRANSACTIONS: self.describe_transactions,
            ApiKey.LIST_TRANSACTIONS: self.list_transactions,
            ApiKey.DESCRIBE_PRODUCERS: self.describe_producers,
        }

    @property
    def transactions(self) -> TransactionCoordinator:
        if self._transactions is None:
            raise CoordinatorNotAvailableError(
                "this broker has no transaction coordinator; upgrade it")
        return self._transactions

    # ------------------------------------------------------------------ producers
    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResponse:
        if request.transactional_id is not None:
            try:
                self._require("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
                return await self.transactions.init_producer_id(request)
            except StrataError as err:
                return InitProducerIdResponse(err.code, error_message=err.message)
        session = current_session()
        if self.acls is not None and session is not INTERNAL_SESSION and not (
                self._allowed("IDEMPOTENT_WRITE", "CLUSTER", CLUSTER_NAME, audit=False)
                or self.acls.allows_any(session.principal, session.host, "WRITE", "TOPIC")):
            # Kafka's rule: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic.
            refused = self._refusal("IDEMPOTENT_WRITE", "CLUSTER", CLUSTER_NAME)
            if refused is not None:
                return InitProducerIdResponse(refused.code, error_message=refused.message)
        if request.producer_id != -1 or request.producer_epoch != -1:
            # Bumping the epoch of an existing id would let any client fence any other:
            # only a transactional id's coordinator does that.
            bad = InvalidRequestError(
                "an idempotent producer asks for a new id: send producer_id=-1 and "
                "producer_epoch=-1 (epoch bumps are for transactional ids)")
            return InitProducerIdResponse(bad.code, error_message=bad.message)
        try:
            return InitProducerIdResponse(0, await self.host.next_producer_id(), 0)
        except StrataError as err:  # ZooKeeperUnavailableError: retriable
            return InitProducerIdResponse(err.code, error_message=err.message)

    async def add_partitions_to_txn(self, request: AddPartitionsToTxnRequest
                                    ) -> AddPartitionsToTxnResponse:
        def refuse(err: StrataError) -> AddPartitionsToTxnResponse:
            return AddPartitionsToTxnResponse([TxnTopicResult(t.name, [
                TxnPartitionResult(p, *error_fields(err)) for p in t.partitions])
                for t in request.topics])

        try:
            if request.verify_only:
                # A partition leader asking (KIP-890 part 1): brokers only.
                self._require("CLUSTER_ACTION", "CLUSTER")
            else:
                self._require("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
                for topic in request.topics:
                    self._require("WRITE", "TOPIC", topic.name)
            return await self.transactions.add_partitions(request)
        except StrataError as err:
            return refuse(err)

    async def add_offsets_to_txn(self, request: AddOffsetsToTxnRequest
                                 ) -> AddOffsetsToTxnResponse:
        try:
            self._require("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            self._require("READ", "GROUP", request.group_id)
            partition = await self.groups.offsets_partition(request.group_id)
            return await self.transactions.add_offsets(request, partition)
        except StrataError as err:
            return AddOffsetsToTxnResponse(*error_fields(err))

    async def end_txn(self, request: EndTxnRequest) -> EndTxnResponse:
        try:
            self._require("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            # Kafka's clients (EndTxn before v5) keep their epoch across transactions:
            # the Kafka listener's end them by Kafka's older rules (no epoch bump).
            return await self.transactions.end_txn(
                request, tv2=not current_session().listener.kafka)
        except StrataError as err:
            return EndTxnResponse(*error_fields(err))

    # ------------------------------------------------------------------ brokers
    async def write_txn_markers(self, request: WriteTxnMarkersRequest
                                ) -> WriteTxnMarkersResponse:
        try:
            self._require("CLUSTER_ACTION", "CLUSTER")
        except StrataError as err:
            from wire.protocol import TxnMarkerResult

            return WriteTxnMarkersResponse([TxnMarkerResult(m.producer_id, [
                TxnTopicResult(t.name, [TxnPartitionResult(p, *error_fields(err))
                                        for p in t.partitions]) for t in m.topics])
                for m in request.markers])
        answer = await self.replicas.write_markers(request)
        # Offsets committed in the transactions take effect (or go) with their markers.
        for marker, result in zip(request.markers, answer.markers, strict=True):
            for topic in result.topics:
                for p in topic.partitions:
                    if p.error_code == 0 and self.groups.is_offsets_topic(topic.name):
                        self.groups.complete_transaction(p.partition, marker.producer_id,
                                                         marker.committed)
        return answer

    # ------------------------------------------------------------------ group offsets
    async def txn_offset_commit(self, request: TxnOffsetCommitRequest
                                ) -> TxnOffsetCommitResponse:
        try:
            self._require("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
            self._require("READ", "GROUP", request.group_id)
            for topic in request.topics:
                self._require("READ", "TOPIC", topic.name)
        except StrataError as err:
            return TxnOffsetCommitResponse([TxnTopicResult(t.name, [
                TxnPartitionResult(p.partition, *error_fields(err)) for p in t.partitions])
                for t in request.topics])
        verify = self.transactions.verify if self._transactions is not None else None
        return await self.groups.txn_commit(request, verify=verify)

    # ------------------------------------------------------------------ describe
    async def describe_transactions(self, request: DescribeTransactionsRequest
                                    ) -> DescribeTransactionsResponse:
        allowed, refused = [], []
        for txn_id in request.transactional_ids:
            err = self._refusal("DESCRIBE", "TRANSACTIONAL_ID", txn_id)
            if err is None:
                allowed.append(txn_id)
            else:
                refused.append(DescribedTransaction(txn_id, *error_fields(err)))
        try:
            described = await self.transactions.describe(allowed)
        except StrataError as err:
            described = [DescribedTransaction(t, *error_fields(err)) for t in allowed]
        return DescribeTransactionsResponse([*described, *refused])

    async def list_transactions(self, request: ListTransactionsRequest
                                ) -> ListTransactionsResponse:
        try:
            listed = await self.transactions.list_transactions(request)
        except StrataError as err:
            return ListTransactionsResponse(*error_fields(err)[:1], [],
                                            error_fields(err)[1])
        # DESCRIBE on the cluster lists every id; otherwise the describable ones.
        if self._allowed("DESCRIBE", "CLUSTER", CLUSTER_NAME, audit=False):
            return listed
        listed.transactions = [t for t in listed.transactions if self._allowed(
            "DESCRIBE", "TRANSACTIONAL_ID", t.transactional_id, audit=False)]
        return listed

    async def describe_producers(self, request: DescribeProducersRequest
                                 ) -> DescribeProducersResponse:
        topics = []
        for topic in request.topics:
            refused = self._refusal("READ", "TOPIC", topic.name)
            results = []
            for p in topic.partitions:
                try:
                    if refused is not None:
                        raise refused
                    partition = self.replicas.leader_partition(topic.name, p)
                    results.append(ProducersPartitionResult(p, 0, None, [
                        ActiveProducer(*entry) for entry in partition.producers.describe()]))
                except StrataError as err:
                    results.append(ProducersPartitionResult(p, *error_fields(err)))
            topics.append(ProducersTopicResult(topic.name, results))
        return DescribeProducersResponse(topics)
