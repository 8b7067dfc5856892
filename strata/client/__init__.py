"""The Strata Python client (depends only on ``wire.record_batch``, ``wire.protocol``
and ``wire.errors``, never on the broker's server or log).

The public API is what ``__all__`` lists; modules whose names start with ``_`` are
internal. Each client has a blocking face and an asyncio face over one implementation::

    from strata.client import Admin, Consumer, NewTopic, TopicPartition

    with Admin("127.0.0.1:9092") as admin:
        admin.create_topics([NewTopic("events", num_partitions=3, replication_factor=1)])
    with Consumer("127.0.0.1:9092", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("events", p) for p in range(3)])
        for record in consumer.poll(timeout_ms=1000):
            ...

A consumer group (``docs/consumer-groups.md``): members share the topic's partitions;
with auto-commit, a poll commits what the previous polls returned, so finish
processing a poll's records before polling again (at-least-once)::

    with Consumer("127.0.0.1:9092", group_id="billing") as consumer:
        consumer.subscribe(["events"])
        while running:
            for record in consumer.poll(timeout_ms=1000):
                process(record)  # done before the next poll(), which commits it

Every client takes the bootstrap servers first (``bootstrap_servers``, positionally or by
name). The producer's and the consumer's options are one type each, shared by the blocking
and the asyncio face: keyword options (``ProducerOptions`` / ``ConsumerOptions``) are
validated once into a frozen ``ProducerConfig`` / ``ConsumerConfig``, which either face
also takes instead of the bootstrap servers.

Errors are the typed ``wire.errors`` classes (re-exported here), each with a wire
``code``, a ``name`` and a message that says what to do.

Modules, one job each: ``producer`` (the producer's faces) over ``_accumulator``,
``_sender``, ``_idempotence`` and ``_delivery``; ``consumer`` (the consumer's faces, the
poll loop and rebalance steps) over ``_subscription``, ``_fetcher``, ``_offsets`` and
``_group``; ``admin`` (the admin faces) over one module per API family,
``_admin_topics``, ``_admin_cluster``, ``_admin_groups``, ``_admin_security``,
``_admin_tier``, ``_admin_schemas`` and ``_admin_transactions``, which share
``_admin_common``; ``sink``; and the
shared ``_config``, ``_cluster``, ``_common`` and ``_sync``.
"""

from strata.client._cluster import parse_bootstrap
from strata.client._config import ValueFormat
from strata.client._schemas import RegisteredSchema, TypedValue
from strata.client.admin import (
    TRANSACTION_STATES,
    AbortTransactionSpec,
    Admin,
    AsyncAdmin,
    ClusterDescription,
    CommittedOffset,
    ConfigValue,
    Coordinator,
    CoordinatorAddress,
    ElectionResult,
    GroupDescription,
    GroupListing,
    HangingTransaction,
    ListOffsetsResult,
    MemberDescription,
    NewTopic,
    OffsetReset,
    OffsetSpec,
    PartitionDescription,
    PartitionLag,
    PartitionTier,
    ProducerState,
    Reassignment,
    ResetPlan,
    ResetTarget,
    SegmentInfo,
    StoredTierProgress,
    TierLease,
    TopicDescription,
    TopicTier,
    TransactionDescription,
    TransactionListing,
)
from strata.client.consumer import (
    AsyncConsumer,
    CommitCallback,
    CommitFailedError,
    Consumer,
    ConsumerConfig,
    ConsumerOptions,
    ConsumerRecord,
    GroupMetadata,
    IdleTimer,
    OffsetResetStrategy,
    PartitionsCallback,
    Records,
    TopicPartition,
)
from strata.client.producer import (
    RECORD_OVERHEAD,
    AbortableTransactionError,
    AsyncProducer,
    BatchMetadata,
    BufferFullError,
    DeliveryCallback,
    DeliveryFailedError,
    DeliveryFailure,
    DeliveryTimeoutError,
    FatalTransactionError,
    Producer,
    ProducerClosedError,
    ProducerConfig,
    ProducerOptions,
    RecordMetadata,
    TransactionStateError,
)
from wire.errors import (
    ClusterAuthorizationFailedError,
    ConcurrentTransactionsError,
    ConcurrentUpdateError,
    CoordinatorNotAvailableError,
    CorruptRecordError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    IncompatibleSchemaError,
    InvalidConfigError,
    InvalidGroupIdError,
    InvalidPartitionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRecordBatchError,
    InvalidReplicationFactorError,
    InvalidSchemaError,
    InvalidSessionTimeoutError,
    InvalidTopicError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    NetworkError,
    NonEmptyGroupError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PolicyViolationError,
    ProducerFencedError,
    RecordTooLargeError,
    RequestTimedOutError,
    SchemaMismatchError,
    SchemaNotFoundError,
    StaleMemberEpochError,
    StrataError,
    TierJobBusyError,
    TierLeaseLostError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionAbortableError,
    TransactionalIdAuthorizationFailedError,
    TransactionalIdNotFoundError,
    TransactionCoordinatorFencedError,
    UnknownMemberIdError,
    UnknownProducerIdError,
    UnknownTopicOrPartitionError,
    UnstableOffsetCommitError,
    UnsupportedAssignorError,
)
from wire.protocol import AclEntry, AclFilterEntry
from wire.record_batch import CONSUMER_SCHEMA, TimestampType
from wire.schema import Compatibility
from wire.security import ClientSecurity

__all__ = [
    "AclEntry",
    "AclFilterEntry",
    "ClientSecurity",
    "CONSUMER_SCHEMA",
    "AsyncProducer",
    "BatchMetadata",
    "BufferFullError",
    "DeliveryCallback",
    "DeliveryFailedError",
    "DeliveryFailure",
    "DeliveryTimeoutError",
    "Producer",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerOptions",
    "RECORD_OVERHEAD",
    "RecordMetadata",
    "parse_bootstrap",
    "RecordTooLargeError",
    "RequestTimedOutError",
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "ClusterDescription",
    "CommitCallback",
    "CommitFailedError",
    "CommittedOffset",
    "ConcurrentUpdateError",
    "Coordinator",
    "CoordinatorAddress",
    "CoordinatorNotAvailableError",
    "FencedMemberEpochError",
    "GroupDescription",
    "GroupIdNotFoundError",
    "GroupListing",
    "GroupMaxSizeReachedError",
    "InvalidGroupIdError",
    "InvalidSessionTimeoutError",
    "MemberDescription",
    "NonEmptyGroupError",
    "OffsetReset",
    "PartitionLag",
    "PartitionsCallback",
    "ResetPlan",
    "ResetTarget",
    "StaleMemberEpochError",
    "UnknownMemberIdError",
    "UnsupportedAssignorError",
    "ConfigValue",
    "Consumer",
    "ConsumerConfig",
    "ConsumerOptions",
    "ConsumerRecord",
    "GroupMetadata",
    "IdleTimer",
    "AbortableTransactionError",
    "FatalTransactionError",
    "TransactionStateError",
    "AbortTransactionSpec",
    "HangingTransaction",
    "ProducerState",
    "TRANSACTION_STATES",
    "TransactionDescription",
    "TransactionListing",
    "ClusterAuthorizationFailedError",
    "ConcurrentTransactionsError",
    "InvalidProducerIdMappingError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "ProducerFencedError",
    "TopicAuthorizationFailedError",
    "TransactionAbortableError",
    "TransactionalIdAuthorizationFailedError",
    "TransactionalIdNotFoundError",
    "TransactionCoordinatorFencedError",
    "UnstableOffsetCommitError",
    "Records",
    "ElectionResult",
    "CorruptRecordError",
    "InvalidConfigError",
    "InvalidProducerEpochError",
    "InvalidRecordBatchError",
    "InvalidPartitionsError",
    "InvalidReplicationFactorError",
    "InvalidTopicError",
    "ListOffsetsResult",
    "NetworkError",
    "NewTopic",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OffsetResetStrategy",
    "OffsetSpec",
    "OutOfOrderSequenceError",
    "PartitionDescription",
    "PartitionTier",
    "PolicyViolationError",
    "Reassignment",
    "SegmentInfo",
    "StoredTierProgress",
    "StrataError",
    "TierJobBusyError",
    "TierLease",
    "TierLeaseLostError",
    "TimestampType",
    "TopicAlreadyExistsError",
    "TopicDescription",
    "TopicTier",
    "TopicPartition",
    "UnknownProducerIdError",
    "UnknownTopicOrPartitionError",
    "IncompatibleSchemaError",
    "InvalidSchemaError",
    "RegisteredSchema",
    "SchemaMismatchError",
    "SchemaNotFoundError",
    "TypedValue",
    "ValueFormat",
    "Compatibility",
]
