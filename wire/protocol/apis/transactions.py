"""Transactions (docs/transactions.md): AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
WriteTxnMarkers, TxnOffsetCommit, DescribeTransactions, ListTransactions,
DescribeProducers. (InitProducerId, FindCoordinator, Produce and Fetch carry their
transaction fields in their own families.)

Kafka's model and error codes (KIP-98, KIP-447, KIP-890), in Strata's encoding. Part of
``wire.protocol.messages`` (one module per API family; that module keeps the registry
of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from wire.protocol.codec import (
    BOOL,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
    "TxnTopic",
    "TxnPartitionResult",
    "TxnTopicResult",
    "AddPartitionsToTxnRequest",
    "AddPartitionsToTxnResponse",
    "AddOffsetsToTxnRequest",
    "AddOffsetsToTxnResponse",
    "EndTxnRequest",
    "EndTxnResponse",
    "TxnMarker",
    "WriteTxnMarkersRequest",
    "TxnMarkerResult",
    "WriteTxnMarkersResponse",
    "TxnOffsetCommitPartition",
    "TxnOffsetCommitTopic",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitResponse",
    "DescribeTransactionsRequest",
    "DescribedTransaction",
    "DescribeTransactionsResponse",
    "ListTransactionsRequest",
    "ListedTransaction",
    "ListTransactionsResponse",
    "DescribeProducersRequest",
    "ActiveProducer",
    "ProducersPartitionResult",
    "ProducersTopicResult",
    "DescribeProducersResponse",
]


@dataclass(slots=True)
class TxnTopic(Message):
    name: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(INT32)))


@dataclass(slots=True)
class TxnPartitionResult(Message):
    partition: int
    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class TxnTopicResult(Message):
    name: str
    partitions: list[TxnPartitionResult]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(TxnPartitionResult))))


# ----------------------------------------------------------------------------- coordinator


@dataclass(slots=True)
class AddPartitionsToTxnRequest(Message):
    """Partitions join producer ``producer_id``/``producer_epoch``'s transaction, to the
    coordinator of ``transactional_id``; ONGOING is persisted before the answer.
    ``verify_only``: a partition leader asks, before the first transactional write of
    this producer to these partitions, whether they are in its open transaction (KIP-890
    part 1); nothing is written, and a partition that is not gets TRANSACTION_ABORTABLE.
    ``tag``: an opaque label of the transaction (Strata; the Spark sink's micro-batch
    id), kept with it.

    Errors per partition (every partition gets a request-level error): NOT_COORDINATOR /
    COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS (find the coordinator and
    retry), CONCURRENT_TRANSACTIONS (retry shortly), INVALID_PRODUCER_ID_MAPPING,
    PRODUCER_FENCED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION (then the others get OPERATION_NOT_ATTEMPTED and nothing
    is added), TRANSACTION_ABORTABLE (verification only).
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    topics: list[TxnTopic]
    verify_only: bool = False
    tag: str | None = None
    FIELDS: ClassVar = (
        Field("transactional_id", STRING),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("topics", Array(Struct(TxnTopic))),
        Field("verify_only", BOOL),
        Field("tag", NULLABLE_STRING),
    )


@dataclass(slots=True)
class AddPartitionsToTxnResponse(Message):
    topics: list[TxnTopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TxnTopicResult))),)


@dataclass(slots=True)
class AddOffsetsToTxnRequest(Message):
    """Group ``group_id``'s offsets join the transaction (its ``__consumer_offsets``
    partition is added, as AddPartitionsToTxn does); the producer then sends
    TxnOffsetCommit to the group's coordinator. Errors as AddPartitionsToTxn's, plus
    GROUP_AUTHORIZATION_FAILED."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    FIELDS: ClassVar = (
        Field("transactional_id", STRING),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("group_id", STRING),
    )


@dataclass(slots=True)
class AddOffsetsToTxnResponse(Message):
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_code", INT16), Field("error_message", NULLABLE_STRING))


@dataclass(slots=True)
class EndTxnRequest(Message):
    """Commit (``committed``) or abort the producer's open transaction. PREPARE_COMMIT /
    PREPARE_ABORT is persisted, then answered; the coordinator writes the markers and
    then COMPLETE_*. The epoch is bumped (KIP-890 part 2): the answer's
    ``producer_id``/``producer_epoch`` are the next transaction's. A retry of an EndTxn
    that went through gets the same answer again.

    Errors: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS,
    CONCURRENT_TRANSACTIONS (retry), INVALID_TXN_STATE (nothing open to commit, or the
    opposite of a decision already taken), INVALID_PRODUCER_ID_MAPPING,
    PRODUCER_FENCED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    FIELDS: ClassVar = (
        Field("transactional_id", STRING),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("committed", BOOL),
    )


@dataclass(slots=True)
class EndTxnResponse(Message):
    error_code: int
    error_message: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
    )


# ----------------------------------------------------------------------------- markers


@dataclass(slots=True)
class TxnMarker(Message):
    """End producer ``producer_id``'s transaction in these partitions: a COMMIT or ABORT
    control batch with ``producer_epoch`` (the bumped epoch) and the coordinator's
    ``coordinator_epoch`` (the leader epoch of its transaction log partition)."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    topics: list[TxnTopic]
    FIELDS: ClassVar = (
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("committed", BOOL),
        Field("coordinator_epoch", INT32),
        Field("topics", Array(Struct(TxnTopic))),
    )


@dataclass(slots=True)
class WriteTxnMarkersRequest(Message):
    """From a transaction coordinator to partition leaders (CLUSTER_ACTION): each marker
    is appended acks=all. Errors per partition: NOT_LEADER_OR_FOLLOWER /
    UNKNOWN_TOPIC_OR_PARTITION / NOT_ENOUGH_REPLICAS / REQUEST_TIMED_OUT (the coordinator
    retries at the current leader), TRANSACTION_COORDINATOR_FENCED (a newer coordinator
    owns the transaction), INVALID_PRODUCER_EPOCH (the producer moved past this
    marker's epoch). A repeat of a marker already written is answered with no error and
    not written again."""

    markers: list[TxnMarker]
    FIELDS: ClassVar = (Field("markers", Array(Struct(TxnMarker))),)


@dataclass(slots=True)
class TxnMarkerResult(Message):
    producer_id: int
    topics: list[TxnTopicResult]
    FIELDS: ClassVar = (
        Field("producer_id", INT64), Field("topics", Array(Struct(TxnTopicResult))))


@dataclass(slots=True)
class WriteTxnMarkersResponse(Message):
    markers: list[TxnMarkerResult]
    FIELDS: ClassVar = (Field("markers", Array(Struct(TxnMarkerResult))),)


# ----------------------------------------------------------------------------- group offsets


@dataclass(slots=True)
class TxnOffsetCommitPartition(Message):
    partition: int
    offset: int
    metadata: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32), Field("offset", INT64),
        Field("metadata", NULLABLE_STRING))


@dataclass(slots=True)
class TxnOffsetCommitTopic(Message):
    name: str
    partitions: list[TxnOffsetCommitPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(TxnOffsetCommitPartition))))


@dataclass(slots=True)
class TxnOffsetCommitRequest(Message):
    """Offsets committed inside producer ``producer_id``'s transaction, to the group's
    coordinator (KIP-447): held as pending until the transaction's marker reaches the
    group's ``__consumer_offsets`` partition (COMMIT: they become the committed offsets;
    ABORT: dropped). Checked like a member's commit against ``member_id`` /
    ``member_epoch`` (the consumer's ``group_metadata()``; -1 and null outside any
    membership), so a zombie member's transaction cannot commit the group's offsets.

    Errors per partition: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE /
    COORDINATOR_LOAD_IN_PROGRESS, UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH /
    FENCED_INSTANCE_ID / STALE_MEMBER_EPOCH (the member lost the partition: abort),
    TRANSACTION_ABORTABLE (the group was not added with AddOffsetsToTxn),
    PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, GROUP_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION,
    OFFSET_METADATA_TOO_LARGE."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    member_id: str | None
    member_epoch: int
    instance_id: str | None
    topics: list[TxnOffsetCommitTopic]
    FIELDS: ClassVar = (
        Field("transactional_id", STRING),
        Field("group_id", STRING),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("member_id", NULLABLE_STRING),
        Field("member_epoch", INT32),
        Field("instance_id", NULLABLE_STRING),
        Field("topics", Array(Struct(TxnOffsetCommitTopic))),
    )


@dataclass(slots=True)
class TxnOffsetCommitResponse(Message):
    topics: list[TxnTopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TxnTopicResult))),)


# ----------------------------------------------------------------------------- describe


@dataclass(slots=True)
class DescribeTransactionsRequest(Message):
    """The state of each transactional id, from its coordinator (DESCRIBE on it)."""

    transactional_ids: list[str]
    FIELDS: ClassVar = (Field("transactional_ids", Array(STRING)),)


@dataclass(slots=True)
class DescribedTransaction(Message):
    """``state``: Kafka's name (Empty, Ongoing, PrepareCommit, ...). ``start_ms``: when
    the open (or last) transaction began, -1 if none. ``two_phase`` and ``tag``: Strata's
    (docs/transactions.md)."""

    transactional_id: str
    error_code: int = 0
    error_message: str | None = None
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = -1
    start_ms: int = -1
    topics: list[TxnTopic] = field(default_factory=list)
    two_phase: bool = False
    tag: str | None = None
    FIELDS: ClassVar = (
        Field("transactional_id", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("state", STRING),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("timeout_ms", INT32),
        Field("start_ms", INT64),
        Field("topics", Array(Struct(TxnTopic))),
        Field("two_phase", BOOL),
        Field("tag", NULLABLE_STRING),
    )


@dataclass(slots=True)
class DescribeTransactionsResponse(Message):
    transactions: list[DescribedTransaction]
    FIELDS: ClassVar = (Field("transactions", Array(Struct(DescribedTransaction))),)


@dataclass(slots=True)
class ListTransactionsRequest(Message):
    """The transactional ids this broker coordinates (ask every broker for all),
    filtered by state names and producer ids (empty: no filter), and with
    ``min_duration_ms`` >= 0 only transactions open at least that long."""

    state_filters: list[str] = field(default_factory=list)
    producer_id_filters: list[int] = field(default_factory=list)
    min_duration_ms: int = -1
    FIELDS: ClassVar = (
        Field("state_filters", Array(STRING)),
        Field("producer_id_filters", Array(INT64)),
        Field("min_duration_ms", INT64),
    )


@dataclass(slots=True)
class ListedTransaction(Message):
    transactional_id: str
    producer_id: int
    state: str
    FIELDS: ClassVar = (
        Field("transactional_id", STRING), Field("producer_id", INT64), Field("state", STRING))


@dataclass(slots=True)
class ListTransactionsResponse(Message):
    error_code: int
    transactions: list[ListedTransaction] = field(default_factory=list)
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("transactions", Array(Struct(ListedTransaction))),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class DescribeProducersRequest(Message):
    """The producers with state in each partition, from its leader (READ on the topic):
    for ``strata transactions describe-producers`` and finding hanging transactions."""

    topics: list[TxnTopic]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TxnTopic))),)


@dataclass(slots=True)
class ActiveProducer(Message):
    """``current_txn_start_offset``: the first offset of its open transaction here, -1
    if none."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int
    FIELDS: ClassVar = (
        Field("producer_id", INT64),
        Field("producer_epoch", INT32),
        Field("last_sequence", INT32),
        Field("last_timestamp", INT64),
        Field("coordinator_epoch", INT32),
        Field("current_txn_start_offset", INT64),
    )


@dataclass(slots=True)
class ProducersPartitionResult(Message):
    partition: int
    error_code: int = 0
    error_message: str | None = None
    producers: list[ActiveProducer] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("producers", Array(Struct(ActiveProducer))),
    )


@dataclass(slots=True)
class ProducersTopicResult(Message):
    name: str
    partitions: list[ProducersPartitionResult]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ProducersPartitionResult))))


@dataclass(slots=True)
class DescribeProducersResponse(Message):
    topics: list[ProducersTopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(ProducersTopicResult))),)
