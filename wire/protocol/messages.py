"""Every Strata request and response, as plain dataclasses with their wire schema.

``docs/protocol.md`` renders the same schemas byte by byte. A frame on the wire is::

    int32   size of what follows
    ...     RequestHeader + request body   (client -> broker)
            ResponseHeader + response body (broker -> client)

Requests on one connection may be pipelined; the broker may answer them in any order
and the client matches answers to requests by ``correlation_id``. Produce with
``acks=0`` gets no response at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, Final, TypeVar

from wire.protocol.codec import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_LONG_STRING,
    NULLABLE_STRING,
    RECORDS,
    STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
    "StagePartition",
    "StageTopic",
    "StageRecordsRequest",
    "StagePartitionResponse",
    "StageTopicResponse",
    "StageRecordsResponse",
    "StagedPartEntry",
    "CommitPartition",
    "CommitTopic",
    "CommitStagedRequest",
    "CommitPartitionResponse",
    "CommitTopicResponse",
    "CommitStagedResponse",
    "AbortPartition",
    "AbortTopic",
    "AlterPartitionReassignmentsRequest",
    "AlterPartitionReassignmentsResponse",
    "ElectLeadersRequest",
    "ElectLeadersResponse",
    "ElectionPartitionResult",
    "ElectionTopic",
    "ElectionTopicResult",
    "ListPartitionReassignmentsRequest",
    "ListPartitionReassignmentsResponse",
    "OngoingReassignment",
    "ReassignablePartition",
    "ReassignableTopic",
    "AbortStagedRequest",
    "AbortPartitionResponse",
    "AbortTopicResponse",
    "AbortStagedResponse",
    "API_VERSIONS",
    "ApiKey",
    "ApiVersionRange",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "BrokerInfo",
    "ConfigEntry",
    "CreatableTopic",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribeConfigsRequest",
    "DescribeConfigsResponse",
    "DescribedConfig",
    "DescribeTierPartitionResponse",
    "DescribeTierRequest",
    "DescribeTierResponse",
    "DescribeTierTopic",
    "DescribeTierTopicResponse",
    "TierSegment",
    "ErrorResponse",
    "FetchPartition",
    "FetchPartitionResponse",
    "FetchRequest",
    "ForgottenTopic",
    "FetchResponse",
    "FetchTopic",
    "FetchTopicResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "AlterConfigsRequest",
    "AlterConfigsResponse",
    "AlterConfigsTopic",
    "MetadataRequest",
    "OffsetForLeaderEpochPartition",
    "OffsetForLeaderEpochPartitionResponse",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderEpochTopic",
    "OffsetForLeaderEpochTopicResponse",
    "MetadataResponse",
    "PartitionMetadata",
    "ProducePartition",
    "ProducePartitionResponse",
    "ProduceRequest",
    "ProduceResponse",
    "ProduceTopic",
    "ProduceTopicResponse",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "ReplicaAssignment",
    "RequestHeader",
    "ResponseHeader",
    "TopicConfigs",
    "TopicMetadata",
    "TopicResult",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "NO_MEMBER_EPOCH",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "GroupTopicPartitions",
    "group_by_topic",
    "group_topic_partitions",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
    "OffsetCommitPartition",
    "OffsetCommitTopic",
    "OffsetCommitRequest",
    "OffsetCommitPartitionResponse",
    "OffsetCommitTopicResponse",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchPartitionResponse",
    "OffsetFetchTopicResponse",
    "OffsetFetchResponse",
    "ListGroupsRequest",
    "ListedGroup",
    "ListGroupsResponse",
    "DescribeGroupsRequest",
    "DescribedMember",
    "DescribedGroup",
    "DescribeGroupsResponse",
    "DeleteGroupsRequest",
    "DeleteGroupResult",
    "DeleteGroupsResponse",
    "CompactionProgress",
    "TierLeaseRequest",
    "TierLeaseResponse",
    "TierProgressUpdate",
    "UpdateTierRequest",
    "UpdateTierResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "ScramCredentialInfo",
    "DescribeUserScramCredentialsRequest",
    "UserScramCredentials",
    "DescribeUserScramCredentialsResponse",
    "ScramCredentialDeletion",
    "ScramCredentialUpsertion",
    "AlterUserScramCredentialsRequest",
    "AlterUserScramCredentialsResult",
    "AlterUserScramCredentialsResponse",
    "AclEntry",
    "AclFilterEntry",
    "AclResult",
    "CreateAclsRequest",
    "CreateAclsResponse",
    "DescribeAclsRequest",
    "DescribeAclsResponse",
    "DeleteAclsRequest",
    "DeleteAclsResult",
    "DeleteAclsResponse",
    "QuotaValue",
    "QuotaEntry",
    "DescribeClientQuotasRequest",
    "DescribeClientQuotasResponse",
    "QuotaAlteration",
    "AlterClientQuotasRequest",
    "AlterClientQuotasResponse",
    "SCHEMA_OPERATIONS",
    "SCHEMAS_TOPIC",
    "SchemaRegistryRequest",
    "SchemaRegistryResponse",
]

# ListOffsets special timestamps (Kafka's values).
EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1


class ApiKey(IntEnum):
    API_VERSIONS = 0
    METADATA = 1
    CREATE_TOPICS = 2
    DELETE_TOPICS = 3
    DESCRIBE_CONFIGS = 4
    ALTER_CONFIGS = 5
    PRODUCE = 6
    FETCH = 7
    LIST_OFFSETS = 8
    INIT_PRODUCER_ID = 9
    OFFSET_FOR_LEADER_EPOCH = 10
    STAGE_RECORDS = 11
    COMMIT_STAGED = 12
    ABORT_STAGED = 13
    ELECT_LEADERS = 14
    ALTER_PARTITION_REASSIGNMENTS = 15
    LIST_PARTITION_REASSIGNMENTS = 16
    DESCRIBE_TIER = 17
    FIND_COORDINATOR = 18
    CONSUMER_GROUP_HEARTBEAT = 19
    OFFSET_COMMIT = 20
    OFFSET_FETCH = 21
    LIST_GROUPS = 22
    DESCRIBE_GROUPS = 23
    DELETE_GROUPS = 24
    TIER_LEASE = 25
    UPDATE_TIER = 26
    SASL_HANDSHAKE = 27
    SASL_AUTHENTICATE = 28
    DESCRIBE_USER_SCRAM_CREDENTIALS = 29
    ALTER_USER_SCRAM_CREDENTIALS = 30
    CREATE_ACLS = 31
    DESCRIBE_ACLS = 32
    DELETE_ACLS = 33
    DESCRIBE_CLIENT_QUOTAS = 34
    ALTER_CLIENT_QUOTAS = 35
    SCHEMA_REGISTRY = 36


# ----------------------------------------------------------------------------- headers


@dataclass(slots=True)
class RequestHeader(Message):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    FIELDS: ClassVar = (
        Field("api_key", INT16),
        Field("api_version", INT16),
        Field("correlation_id", INT32),
        Field("client_id", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ResponseHeader(Message):
    """``error_code`` 0: the API's response body follows. Otherwise the request failed as
    a whole (unsupported API or version, malformed body, or UNKNOWN_SERVER_ERROR for a
    broker fault) and an ``ErrorResponse`` follows."""

    correlation_id: int
    error_code: int = 0
    FIELDS: ClassVar = (Field("correlation_id", INT32), Field("error_code", INT16))


@dataclass(slots=True)
class ErrorResponse(Message):
    """Body after a ``ResponseHeader`` whose ``error_code`` is not 0."""

    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_message", NULLABLE_STRING),)


# ----------------------------------------------------------------------------- ApiVersions


@dataclass(slots=True)
class ApiVersionsRequest(Message):
    """Asks which API versions the broker speaks; the body is empty.

    A request whose version is outside a range in ``ApiVersionsResponse`` fails as a
    whole: the response header carries UNSUPPORTED_VERSION.
    """

    FIELDS: ClassVar = ()


@dataclass(slots=True)
class ApiVersionRange(Message):
    api_key: int
    min_version: int
    max_version: int
    FIELDS: ClassVar = (
        Field("api_key", INT16), Field("min_version", INT16), Field("max_version", INT16)
    )


@dataclass(slots=True)
class ApiVersionsResponse(Message):
    """``error_code`` is always 0; ``apis`` holds one range per API key this broker serves."""

    error_code: int = 0
    apis: list[ApiVersionRange] = field(default_factory=list)
    FIELDS: ClassVar = (Field("error_code", INT16), Field("apis", Array(Struct(ApiVersionRange))))


# ----------------------------------------------------------------------------- Metadata


@dataclass(slots=True)
class MetadataRequest(Message):
    """``topics`` null: every topic; an empty list: no topics (brokers and cluster id only).

    Topics are never created by a Metadata request. Any broker answers from its own view
    of ZooKeeper, which watches keep current; right after a change it may lag briefly.
    """

    topics: list[str] | None = None  # None: every topic
    FIELDS: ClassVar = (Field("topics", Array(STRING, nullable=True)),)


@dataclass(slots=True)
class BrokerInfo(Message):
    """A live broker: registered in ZooKeeper, at the host and port it advertises."""

    node_id: int
    host: str
    port: int
    FIELDS: ClassVar = (Field("node_id", INT32), Field("host", STRING), Field("port", INT32))


@dataclass(slots=True)
class PartitionMetadata(Message):
    """``replicas`` is the assignment, preferred leader first. ``leader`` is -1 when the
    leader recorded in ZooKeeper is not a live broker (send nothing to it; refresh
    later). ``leader_epoch`` -1 and an empty ``isr``: the broker has no partition state.
    ``error_code`` is always 0.
    """

    error_code: int
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("partition", INT32),
        Field("leader", INT32),
        Field("leader_epoch", INT32),
        Field("replicas", Array(INT32)),
        Field("isr", Array(INT32)),
    )


@dataclass(slots=True)
class TopicMetadata(Message):
    """A topic that does not exist: ``error_code`` UNKNOWN_TOPIC_OR_PARTITION and no
    partitions. ``value_subject`` (version 1): a typed topic's ``value.schema.subject``
    (docs/typed-topics.md), null for a bytes topic; here so that every client that may
    describe the topic knows how to read it, without DESCRIBE_CONFIGS."""

    error_code: int
    name: str
    partitions: list[PartitionMetadata]
    value_subject: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("name", STRING),
        Field("partitions", Array(Struct(PartitionMetadata))),
        Field("value_subject", NULLABLE_STRING, since=1),
    )


@dataclass(slots=True)
class MetadataResponse(Message):
    """``brokers``: every live broker, by id. ``controller_id``: no controller is elected
    yet, so it is the id of the broker that answered. ``cluster_id``: from ZooKeeper.
    """

    brokers: list[BrokerInfo]
    controller_id: int
    topics: list[TopicMetadata]
    cluster_id: str | None = None
    FIELDS: ClassVar = (
        Field("brokers", Array(Struct(BrokerInfo))),
        Field("controller_id", INT32),
        Field("topics", Array(Struct(TopicMetadata))),
        Field("cluster_id", NULLABLE_STRING),
    )


# ----------------------------------------------------------------------------- topics admin


@dataclass(slots=True)
class ConfigEntry(Message):
    """A topic config key and its value (docs/configuration.md); null is not a valid value."""

    name: str
    value: str | None
    FIELDS: ClassVar = (Field("name", STRING), Field("value", NULLABLE_STRING))


@dataclass(slots=True)
class ReplicaAssignment(Message):
    """The brokers holding one partition's replicas; the first one is the initial leader."""

    partition: int
    broker_ids: list[int]
    FIELDS: ClassVar = (Field("partition", INT32), Field("broker_ids", Array(INT32)))


@dataclass(slots=True)
class CreatableTopic(Message):
    """One topic to create. ``name``: 1 to 249 characters from ``[a-zA-Z0-9._-]``, not
    ``.`` or ``..`` (else INVALID_TOPIC_EXCEPTION); names starting with ``__`` are
    reserved (POLICY_VIOLATION); an existing name gives TOPIC_ALREADY_EXISTS.

    ``num_partitions`` / ``replication_factor`` -1: the broker's ``num.partitions`` /
    ``default.replication.factor``. A partition count outside 1..4096 gives
    INVALID_PARTITIONS, a replication factor outside 1..(live brokers)
    INVALID_REPLICATION_FACTOR. The replicas are spread over the live brokers
    round-robin from a random start.

    A non-empty ``assignments`` places every replica explicitly; then both counts must
    be -1 (else INVALID_REQUEST), the partitions must be 0..n-1 (else
    INVALID_PARTITIONS), and every partition needs the same non-zero number of
    distinct, live brokers (else INVALID_REPLICATION_FACTOR).

    ``configs``: topic config overrides, checked over the broker defaults; an unknown
    key or a bad value gives INVALID_CONFIG.
    """

    name: str
    num_partitions: int
    replication_factor: int
    configs: list[ConfigEntry] = field(default_factory=list)
    assignments: list[ReplicaAssignment] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("num_partitions", INT32),
        Field("replication_factor", INT16),
        Field("configs", Array(Struct(ConfigEntry))),
        Field("assignments", Array(Struct(ReplicaAssignment))),
    )


@dataclass(slots=True)
class CreateTopicsRequest(Message):
    """Creates each topic on its own: each gets its own result, in request order.

    ``validate_only``: run every check, write nothing. Otherwise the topic, its config
    overrides and every partition's initial state (leader: the first replica, leader
    epoch 0, ISR: all replicas) are written to ZooKeeper in one transaction, and the
    broker then waits up to ``timeout_ms`` until its own view holds the topic. If it
    does not in time, the result is REQUEST_TIMED_OUT although the topic was created;
    with ``timeout_ms`` <= 0 there is no wait, so that is the usual answer.
    """

    topics: list[CreatableTopic]
    timeout_ms: int = 30_000
    validate_only: bool = False
    FIELDS: ClassVar = (
        Field("topics", Array(Struct(CreatableTopic))),
        Field("timeout_ms", INT32),
        Field("validate_only", BOOL),
    )


@dataclass(slots=True)
class TopicResult(Message):
    """The outcome for one topic: ``error_code`` 0, or the error and a message."""

    name: str
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("name", STRING), Field("error_code", INT16), Field("error_message", NULLABLE_STRING)
    )


@dataclass(slots=True)
class CreateTopicsResponse(Message):
    topics: list[TopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TopicResult))),)


@dataclass(slots=True)
class DeleteTopicsRequest(Message):
    """Deletes each topic on its own (its znodes: definition, partition states, config
    overrides); every broker drops its replicas' logs when its ZooKeeper watch fires.
    The answering broker waits up to ``timeout_ms`` until its own view no longer holds
    the topic (else REQUEST_TIMED_OUT, although the topic is deleted). A topic that does
    not exist gives UNKNOWN_TOPIC_OR_PARTITION.
    """

    topics: list[str]
    timeout_ms: int = 30_000
    FIELDS: ClassVar = (Field("topics", Array(STRING)), Field("timeout_ms", INT32))


@dataclass(slots=True)
class DeleteTopicsResponse(Message):
    topics: list[TopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TopicResult))),)


@dataclass(slots=True)
class DescribeConfigsRequest(Message):
    """Every topic config key of each named topic, with its effective value."""

    topics: list[str]
    FIELDS: ClassVar = (Field("topics", Array(STRING)),)


@dataclass(slots=True)
class DescribedConfig(Message):
    """``is_default``: the topic has no override for this key, so ``value`` is the
    broker's ``log.<key>`` default."""

    name: str
    value: str | None
    is_default: bool
    FIELDS: ClassVar = (
        Field("name", STRING), Field("value", NULLABLE_STRING), Field("is_default", BOOL)
    )


@dataclass(slots=True)
class TopicConfigs(Message):
    """One topic's configs; a topic that does not exist has ``error_code``
    UNKNOWN_TOPIC_OR_PARTITION and no configs."""

    name: str
    error_code: int
    error_message: str | None
    configs: list[DescribedConfig]
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("configs", Array(Struct(DescribedConfig))),
    )


@dataclass(slots=True)
class DescribeConfigsResponse(Message):
    topics: list[TopicConfigs]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TopicConfigs))),)


@dataclass(slots=True)
class AlterConfigsTopic(Message):
    """Changes to one topic's config overrides: ``set`` adds or replaces keys,
    ``delete`` removes overrides (the key falls back to the broker default). Keys not
    named keep their overrides. The resulting set is validated as a whole; an unknown
    key or a bad value gives INVALID_CONFIG and nothing is written.
    """

    name: str
    set: list[ConfigEntry] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("set", Array(Struct(ConfigEntry))),
        Field("delete", Array(STRING)),
    )


@dataclass(slots=True)
class AlterConfigsRequest(Message):
    """Alters each topic on its own (UNKNOWN_TOPIC_OR_PARTITION if it does not exist).
    ``validate_only``: check, write nothing.

    The write is a compare-and-set of the topic's config znode, retried when another
    writer got there first (REQUEST_TIMED_OUT after five lost races). Every broker
    applies the new configs through its ZooKeeper watch.
    """

    topics: list[AlterConfigsTopic]
    validate_only: bool = False
    FIELDS: ClassVar = (
        Field("topics", Array(Struct(AlterConfigsTopic))), Field("validate_only", BOOL)
    )


@dataclass(slots=True)
class AlterConfigsResponse(Message):
    topics: list[TopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TopicResult))),)


# ----------------------------------------------------------------------------- Produce


@dataclass(slots=True)
class ProducePartition(Message):
    """``records`` must hold exactly ONE record batch (docs/format.md): a second batch
    in the same field, or any other bytes after the first batch, is rejected with
    INVALID_RECORD. Null records give INVALID_REQUEST. A field larger than the topic's
    ``max.message.bytes`` gives MESSAGE_TOO_LARGE (checked first), a checksum mismatch
    CORRUPT_MESSAGE. The leader assigns the offsets.

    Idempotence: a batch carrying a producer id (from InitProducerId) is checked against
    the last 5 batches of that producer on this partition. A retry of one of them is not
    written again: it answers error 0 with the original ``base_offset``. A sequence gap
    gives OUT_OF_ORDER_SEQUENCE_NUMBER, an older producer epoch INVALID_PRODUCER_EPOCH,
    and a producer the partition does not know whose batch does not start at sequence 0
    UNKNOWN_PRODUCER_ID (a producer idle for ``producer.id.expiration.ms`` is forgotten).

    When a partition answers with one of these errors, nothing of its batch was written.
    """

    partition: int
    records: Any  # bytes of exactly one record batch
    FIELDS: ClassVar = (Field("partition", INT32), Field("records", RECORDS))


@dataclass(slots=True)
class ProduceTopic(Message):
    """The partitions of one topic to write to; each is handled on its own."""

    name: str
    partitions: list[ProducePartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(ProducePartition))))


@dataclass(slots=True)
class ProduceRequest(Message):
    """Appends one batch per partition on the partition's leader.

    ``acks``:

    - ``0``: no response at all, so partition errors are not reported either (a request
      that fails as a whole still gets an error response);
    - ``1``: answer once the leader has appended the batch (with ``flush.policy=always``,
      once it is also fsynced);
    - ``-1`` (all): before appending, the partition needs at least
      ``min.insync.replicas`` in-sync replicas (else NOT_ENOUGH_REPLICAS and nothing is
      written); answer once the high watermark has passed the batch (every in-sync
      replica has it). If the ISR shrank below ``min.insync.replicas`` while the batch
      waited, the answer is NOT_ENOUGH_REPLICAS_AFTER_APPEND: the batch is in the log
      (``base_offset`` is set) but not acknowledged; retry with idempotence. If this
      broker stopped leading meanwhile, NOT_LEADER_OR_FOLLOWER (it may or may not be
      kept);
    - anything else: every partition answers INVALID_REQUIRED_ACKS.

    ``timeout_ms``: how long ``acks`` 1 and -1 wait for the fsync and for the high
    watermark. When it runs out the partition answers REQUEST_TIMED_OUT, but the batch
    was appended (``base_offset`` is set) and may still be committed: retry with
    idempotence.

    Partitions are independent: each one answers with its own error code and message,
    and an error in one does not stop the others from being written. A partition not
    led by this broker answers NOT_LEADER_OR_FOLLOWER; an unknown one
    UNKNOWN_TOPIC_OR_PARTITION; one whose log could not be opened STORAGE_ERROR.
    """

    acks: int  # 0, 1 or -1 (all)
    timeout_ms: int
    topics: list[ProduceTopic]
    FIELDS: ClassVar = (
        Field("acks", INT16),
        Field("timeout_ms", INT32),
        Field("topics", Array(Struct(ProduceTopic))),
    )


@dataclass(slots=True)
class ProducePartitionResponse(Message):
    """``base_offset``: offset of the batch's first record; for a retried duplicate, the
    offset it got the first time. -1 when the batch was not written.
    ``log_append_time``: the broker's timestamp when the topic uses ``LogAppendTime``,
    else -1. ``log_start_offset``: the partition's first offset after the append.
    """

    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("base_offset", INT64),
        Field("log_append_time", INT64),
        Field("log_start_offset", INT64),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ProduceTopicResponse(Message):
    name: str
    partitions: list[ProducePartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ProducePartitionResponse)))
    )


@dataclass(slots=True)
class ProduceResponse(Message):
    """One answer per requested partition. ``throttle_time_ms``: how long the client must
    wait before its next request to this broker (a quota was exceeded; 0: none)."""

    topics: list[ProduceTopicResponse]
    throttle_time_ms: int = 0
    FIELDS: ClassVar = (
        Field("topics", Array(Struct(ProduceTopicResponse))), Field("throttle_time_ms", INT32)
    )


# ----------------------------------------------------------------------------- Fetch


@dataclass(slots=True)
class FetchPartition(Message):
    """``fetch_offset``: the first offset wanted. The records start at the batch that
    holds it, so the first batch may begin before ``fetch_offset``: the client skips
    the records below it. The end of what a reader may see is the high watermark for a
    consumer and the log end offset for a follower: at the end there are no records and
    no error; outside ``[log_start_offset, end]`` the partition answers
    OFFSET_OUT_OF_RANGE.

    ``partition_max_bytes``: the most bytes of records this partition returns, except
    that its first batch is returned whole even when larger (see ``FetchRequest``).

    ``current_leader_epoch`` is accepted but not checked yet.
    """

    partition: int
    fetch_offset: int
    partition_max_bytes: int = 1 << 20
    current_leader_epoch: int = -1  # -1: do not check
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("fetch_offset", INT64),
        Field("partition_max_bytes", INT32),
        Field("current_leader_epoch", INT32),
    )


@dataclass(slots=True)
class FetchTopic(Message):
    """The partitions of one topic to read; they are read in request order."""

    name: str
    partitions: list[FetchPartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(FetchPartition))))


@dataclass(slots=True)
class ForgottenTopic(Message):
    """Partitions an incremental fetch session stops fetching (version 1)."""

    name: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(INT32)))


@dataclass(slots=True)
class FetchRequest(Message):
    """Reads record batches from partition leaders, with a long poll.

    ``replica_id`` -1: a consumer; reads stop at the high watermark (committed data
    only; ``ProduceRequest`` says when it moves). A broker id (>= 0): a follower, for
    replication; reads go up to the log end offset. The broker id is not authenticated
    yet: any client that sends one reads uncommitted data.

    ``max_wait_ms`` / ``min_bytes``: the broker answers once the records it would return
    add up to ``min_bytes`` (a value <= 0 counts as 1), once ``max_wait_ms`` has passed
    (capped by the broker's ``fetch.max.wait.ms``), or at once when any partition has an
    error or the broker is shutting down. While it waits, an append to any requested
    partition makes it read again.

    ``max_bytes`` and ``partition_max_bytes``: partitions are read in order; each returns
    whole batches up to its ``partition_max_bytes`` or what is left of ``max_bytes``,
    whichever is smaller, but at least one batch when it has data, even a batch larger
    than both limits, so that a consumer always makes progress. A response can therefore
    exceed ``max_bytes``. Once ``max_bytes`` is used up, the partitions after it return
    no records (and no error).

    ``isolation_level`` is accepted but not checked yet.

    Fetch sessions (version 1, followers only; Kafka's KIP-227 in small): a follower
    fetching thousands of partitions from one leader would otherwise send, and get back,
    every one of them each round. ``session_epoch`` -1: no session (version 0
    behaviour). 0: open a session (``session_id`` 0) with the partitions listed,
    replacing this follower's previous one at this broker; the answer lists them all and
    carries the new ``session_id``. N > 0: the N-th incremental fetch of ``session_id``:
    ``topics`` lists only partitions added or whose fetch offset or epoch changed, the
    others keep what the session holds, and ``forgotten_topics`` leaves some; the answer
    lists only partitions with records, an error, or offsets that changed since the
    session last answered them. An unknown session answers FETCH_SESSION_ID_NOT_FOUND,
    another epoch than the next INVALID_FETCH_SESSION_EPOCH (top-level ``error_code``):
    the follower then opens a new session. Every request of a session also counts as a
    fetch, at the offset the session holds, of each partition it does not list: an
    idle, caught-up follower stays in the ISR without naming its partitions again.
    """

    topics: list[FetchTopic]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 << 20
    replica_id: int = -1  # -1: a consumer; a broker id: a follower
    isolation_level: int = 0
    session_id: int = 0
    session_epoch: int = -1  # -1: no session; 0: open one; N: the N-th incremental fetch
    forgotten_topics: list[ForgottenTopic] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("max_wait_ms", INT32),
        Field("min_bytes", INT32),
        Field("max_bytes", INT32),
        Field("isolation_level", INT8),
        Field("topics", Array(Struct(FetchTopic))),
        Field("session_id", INT32, since=1),
        Field("session_epoch", INT32, since=1),
        Field("forgotten_topics", Array(Struct(ForgottenTopic)), since=1),
    )


@dataclass(slots=True)
class FetchPartitionResponse(Message):
    """``high_watermark``, ``log_start_offset``, ``log_end_offset``: the partition's
    offsets when it was read. With OFFSET_OUT_OF_RANGE, ``log_start_offset`` and
    ``high_watermark`` hold the ends of the valid range (for a follower the upper end
    is the log end offset). When the partition is unknown, not led by this broker or
    offline, all three are -1.
    ``records``: whole batches, sent straight from the segment files; null when there
    is nothing to return.
    """

    partition: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    records: Any = None  # whole batches (bytes / memoryview; a FileSlice on the server)
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("high_watermark", INT64),
        Field("log_start_offset", INT64),
        Field("log_end_offset", INT64),
        Field("error_message", NULLABLE_STRING),
        Field("records", RECORDS),
    )


@dataclass(slots=True)
class FetchTopicResponse(Message):
    """One answer per requested partition, in request order."""

    name: str
    partitions: list[FetchPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(FetchPartitionResponse)))
    )


@dataclass(slots=True)
class FetchResponse(Message):
    """``throttle_time_ms``: how long the client must wait before its next request to
    this broker (a quota was exceeded; 0: none). ``error_code`` is 0 (errors are per partition)
    except for a fetch session that cannot go on (FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH), which lists no partitions. ``session_id`` (version 1):
    the session the request opened or continued (0: none)."""

    topics: list[FetchTopicResponse]
    error_code: int = 0
    throttle_time_ms: int = 0
    session_id: int = 0
    FIELDS: ClassVar = (
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("topics", Array(Struct(FetchTopicResponse))),
        Field("session_id", INT32, since=1),
    )


# ----------------------------------------------------------------------------- ListOffsets


@dataclass(slots=True)
class ListOffsetsPartition(Message):
    """``timestamp`` -2 (earliest): the log start offset. -1 (latest): the high
    watermark, the offset the next committed record will get. A time in ms since the
    epoch (>= 0): the first committed record, in offset order, whose timestamp is at or
    after it. Any other negative value gives INVALID_REQUEST.
    """

    partition: int
    timestamp: int  # EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, or ms
    FIELDS: ClassVar = (Field("partition", INT32), Field("timestamp", INT64))


@dataclass(slots=True)
class ListOffsetsTopic(Message):
    """The partitions of one topic to look up, on their leader."""

    name: str
    partitions: list[ListOffsetsPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ListOffsetsPartition)))
    )


@dataclass(slots=True)
class ListOffsetsRequest(Message):
    """Looks up offsets by time on partition leaders. ``replica_id`` and
    ``isolation_level`` are accepted but not used yet."""

    topics: list[ListOffsetsTopic]
    replica_id: int = -1
    isolation_level: int = 0
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("isolation_level", INT8),
        Field("topics", Array(Struct(ListOffsetsTopic))),
    )


@dataclass(slots=True)
class ListOffsetsPartitionResponse(Message):
    """``offset``: the offset found. For a timestamp query, ``timestamp`` is that
    record's timestamp, and both are -1 when no committed record is that recent; for -2
    and -1 ``timestamp`` is -1. ``leader_epoch``: the partition's current leader epoch.
    """

    partition: int
    error_code: int
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("timestamp", INT64),
        Field("offset", INT64),
        Field("leader_epoch", INT32),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ListOffsetsTopicResponse(Message):
    """One answer per requested partition."""

    name: str
    partitions: list[ListOffsetsPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ListOffsetsPartitionResponse)))
    )


@dataclass(slots=True)
class ListOffsetsResponse(Message):
    """One entry per requested topic; errors are per partition."""

    topics: list[ListOffsetsTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(ListOffsetsTopicResponse))),)


# ----------------------------------------------------------------------------- InitProducerId


@dataclass(slots=True)
class InitProducerIdRequest(Message):
    """Gets an id for an idempotent producer.

    ``transactional_id`` must be null: transactions are not supported yet (else
    INVALID_REQUEST). ``transaction_timeout_ms`` is ignored. ``producer_id`` and
    ``producer_epoch`` must both be -1, which requests a new id (anything else is
    INVALID_REQUEST: bumping the epoch of an existing id needs transactions).
    """

    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    producer_id: int = -1
    producer_epoch: int = -1
    FIELDS: ClassVar = (
        Field("transactional_id", NULLABLE_STRING),
        Field("transaction_timeout_ms", INT32),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
    )


@dataclass(slots=True)
class InitProducerIdResponse(Message):
    """A new producer id with epoch 0, unique in the cluster: brokers claim ids from
    ZooKeeper in blocks of ``producer.id.block.size``. ZooKeeper trouble gives
    BROKER_NOT_AVAILABLE. On an error, ``producer_id`` and ``producer_epoch`` are -1.
    """

    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("error_message", NULLABLE_STRING),
    )


# ----------------------------------------------------------------------------- OffsetForLeaderEpoch


@dataclass(slots=True)
class OffsetForLeaderEpochPartition(Message):
    """``leader_epoch``: the epoch of the last batch in the asker's log (from its
    leader-epoch cache). ``current_leader_epoch``: the partition's leader epoch as the
    asker knows it; -1 skips the check, anything else must equal the leader's current
    epoch (older: FENCED_LEADER_EPOCH, newer: UNKNOWN_LEADER_EPOCH; both retriable
    after a metadata refresh).
    """

    partition: int
    current_leader_epoch: int
    leader_epoch: int
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("current_leader_epoch", INT32),
        Field("leader_epoch", INT32),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochTopic(Message):
    """The partitions of one topic to ask about, on their leader."""

    name: str
    partitions: list[OffsetForLeaderEpochPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(OffsetForLeaderEpochPartition)))
    )


@dataclass(slots=True)
class OffsetForLeaderEpochRequest(Message):
    """Asks a partition leader where an epoch ends in its log (Kafka KIP-101/KIP-279).

    A replica that becomes a follower sends the epoch of its last batch and truncates
    its log to ``min(its log end, end_offset)`` of the answer, then fetches from there:
    this removes a divergent tail without losing records the new leader also has
    (truncating to the high watermark would). ``replica_id``: the asking broker's id,
    -1 for a client (debugging tools); not used yet.
    """

    topics: list[OffsetForLeaderEpochTopic]
    replica_id: int = -1
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("topics", Array(Struct(OffsetForLeaderEpochTopic))),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochPartitionResponse(Message):
    """From the leader's leader-epoch cache: for the leader's latest epoch, its log end
    offset; for an older epoch, the start offset of the next larger epoch it knows,
    with ``leader_epoch`` the largest epoch it knows at or below the requested one
    (the requested one itself if it is older than all). ``leader_epoch`` and
    ``end_offset`` are -1 when the epoch is newer than any the leader knows, when it
    knows none, and on an error (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
    KAFKA_STORAGE_ERROR for an offline partition, FENCED_LEADER_EPOCH,
    UNKNOWN_LEADER_EPOCH).
    """

    partition: int
    error_code: int
    leader_epoch: int = -1
    end_offset: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("leader_epoch", INT32),
        Field("end_offset", INT64),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochTopicResponse(Message):
    """One answer per requested partition."""

    name: str
    partitions: list[OffsetForLeaderEpochPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("partitions", Array(Struct(OffsetForLeaderEpochPartitionResponse))),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochResponse(Message):
    """One entry per requested topic; errors are per partition."""

    topics: list[OffsetForLeaderEpochTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(OffsetForLeaderEpochTopicResponse))),)


# ----------------------------------------------------------------------------- sink commits


@dataclass(slots=True)
class StagePartition(Message):
    """One chunk for one partition. ``records`` holds exactly ONE record batch with
    producer id -1 and none of the transactional, control or commit-end attribute bits
    (else INVALID_RECORD); size and CRC are checked as for Produce.
    ``chunk_sequence``: 0 for the staging id's first chunk in this partition, then +1 per
    chunk. A resend of an already staged chunk answers ``duplicate`` true without
    writing; a gap gives OUT_OF_ORDER_SEQUENCE_NUMBER.
    """

    partition: int
    chunk_sequence: int
    records: Any
    FIELDS: ClassVar = (
        Field("partition", INT32), Field("chunk_sequence", INT32), Field("records", RECORDS)
    )


@dataclass(slots=True)
class StageTopic(Message):
    name: str
    partitions: list[StagePartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(StagePartition))))


@dataclass(slots=True)
class StageRecordsRequest(Message):
    """Stages records of a sink writer on partition leaders, invisible to consumers until
    a CommitStaged names them (docs/spark.md, "Exactly-once protocol").

    ``staging_id``: 1-64 characters from ``[A-Za-z0-9_-]``, unique per writer task
    attempt (a random id); the staged chunks of one id form one file per partition.
    Staged data not committed or aborted within ``sink.staging.retention.ms`` is deleted.
    """

    staging_id: str
    topics: list[StageTopic]
    FIELDS: ClassVar = (Field("staging_id", STRING), Field("topics", Array(Struct(StageTopic))))


@dataclass(slots=True)
class StagePartitionResponse(Message):
    partition: int
    error_code: int
    duplicate: bool = False
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("duplicate", BOOL),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class StageTopicResponse(Message):
    name: str
    partitions: list[StagePartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(StagePartitionResponse)))
    )


@dataclass(slots=True)
class StageRecordsResponse(Message):
    """One answer per requested partition; errors are per partition."""

    topics: list[StageTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(StageTopicResponse))),)


@dataclass(slots=True)
class StagedPartEntry(Message):
    """A staging id and the counts its writer saw acknowledged in this partition."""

    staging_id: str
    chunks: int
    records: int
    FIELDS: ClassVar = (
        Field("staging_id", STRING), Field("chunks", INT32), Field("records", INT64)
    )


@dataclass(slots=True)
class CommitPartition(Message):
    partition: int
    parts: list[StagedPartEntry]
    FIELDS: ClassVar = (
        Field("partition", INT32), Field("parts", Array(Struct(StagedPartEntry)))
    )


@dataclass(slots=True)
class CommitTopic(Message):
    name: str
    partitions: list[CommitPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(CommitPartition)))
    )


@dataclass(slots=True)
class CommitStagedRequest(Message):
    """Makes staged records visible: per partition, the named staged files are appended
    as one group (consecutive offsets, all or nothing, also across a broker crash),
    stamped with ``producer_id`` and ``batch_id``.

    ``producer_id``: the sink's id, at least 2^62, derived from the sink id by hashing
    (``strata.client.sink_producer_id``). ``batch_id``: 0..2^31-1, increasing per sink;
    a commit whose ``batch_id`` is at or below the sink's last commit in a partition is a
    replay: its staged files are discarded, nothing is appended, and the partition
    answers error 0 with ``duplicate`` true. Before appending, each staged file must
    hold exactly ``chunks`` chunks and ``records`` records, else STAGED_DATA_MISSING and
    nothing is appended in that partition. The answer waits (up to ``timeout_ms``) until
    the group is fsynced under ``flush.policy=always`` and below the high watermark.
    """

    producer_id: int
    batch_id: int
    timeout_ms: int
    topics: list[CommitTopic]
    FIELDS: ClassVar = (
        Field("producer_id", INT64),
        Field("batch_id", INT64),
        Field("timeout_ms", INT32),
        Field("topics", Array(Struct(CommitTopic))),
    )


@dataclass(slots=True)
class CommitPartitionResponse(Message):
    """``base_offset``/``last_offset``: the group's offsets (-1 for a replay or an
    error). ``last_committed_batch``: the sink's last committed batch id in this
    partition after the request (-1: none)."""

    partition: int
    error_code: int
    duplicate: bool = False
    base_offset: int = -1
    last_offset: int = -1
    last_committed_batch: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("duplicate", BOOL),
        Field("base_offset", INT64),
        Field("last_offset", INT64),
        Field("last_committed_batch", INT64),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class CommitTopicResponse(Message):
    name: str
    partitions: list[CommitPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(CommitPartitionResponse)))
    )


@dataclass(slots=True)
class CommitStagedResponse(Message):
    """One answer per requested partition; errors are per partition."""

    topics: list[CommitTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(CommitTopicResponse))),)


@dataclass(slots=True)
class AbortPartition(Message):
    partition: int
    staging_ids: list[str]
    FIELDS: ClassVar = (Field("partition", INT32), Field("staging_ids", Array(STRING)))


@dataclass(slots=True)
class AbortTopic(Message):
    name: str
    partitions: list[AbortPartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(AbortPartition))))


@dataclass(slots=True)
class AbortStagedRequest(Message):
    """Deletes staged files that will never be committed (a failed Spark batch).
    Unknown staging ids are ignored."""

    topics: list[AbortTopic]
    FIELDS: ClassVar = (Field("topics", Array(Struct(AbortTopic))),)


@dataclass(slots=True)
class AbortPartitionResponse(Message):
    """``discarded``: how many of the named staging ids had files here."""

    partition: int
    error_code: int
    discarded: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("discarded", INT32),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class AbortTopicResponse(Message):
    name: str
    partitions: list[AbortPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(AbortPartitionResponse)))
    )


@dataclass(slots=True)
class AbortStagedResponse(Message):
    """One answer per requested partition; errors are per partition."""

    topics: list[AbortTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(AbortTopicResponse))),)


# ----------------------------------------------------------------------------- cluster admin


@dataclass(slots=True)
class ElectionTopic(Message):
    name: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(INT32)))


@dataclass(slots=True)
class ElectLeadersRequest(Message):
    """Moves leadership back to each partition's preferred replica (the first assigned)
    where that replica is alive and in sync. ``topics`` null: every partition.

    Any broker takes the request and hands it to the controller through ZooKeeper; the
    answer comes once the controller has acted or ``timeout_ms`` has passed
    (REQUEST_TIMED_OUT: the election may still happen).
    """

    topics: list[ElectionTopic] | None = None
    timeout_ms: int = 30_000
    FIELDS: ClassVar = (Field("topics", Array(Struct(ElectionTopic), nullable=True)),
                        Field("timeout_ms", INT32))


@dataclass(slots=True)
class ElectionPartitionResult(Message):
    """``leader``: the partition's leader after the election (-1: none). The error is
    ELECTION_NOT_NEEDED-like information only in the message: a partition already led
    by its preferred replica, or whose preferred replica is not in sync, keeps its
    leader and answers 0 with a message saying why."""

    partition: int
    error_code: int
    leader: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("leader", INT32),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ElectionTopicResult(Message):
    name: str
    partitions: list[ElectionPartitionResult]
    FIELDS: ClassVar = (Field("name", STRING),
                        Field("partitions", Array(Struct(ElectionPartitionResult))))


@dataclass(slots=True)
class ElectLeadersResponse(Message):
    topics: list[ElectionTopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(ElectionTopicResult))),)


@dataclass(slots=True)
class ReassignablePartition(Message):
    """``replicas``: the wanted replica list, first = preferred leader; an empty list
    cancels a reassignment in progress (the partition keeps the replicas it had)."""

    partition: int
    replicas: list[int]
    FIELDS: ClassVar = (Field("partition", INT32), Field("replicas", Array(INT32)))


@dataclass(slots=True)
class ReassignableTopic(Message):
    name: str
    partitions: list[ReassignablePartition]
    FIELDS: ClassVar = (Field("name", STRING),
                        Field("partitions", Array(Struct(ReassignablePartition))))


@dataclass(slots=True)
class AlterPartitionReassignmentsRequest(Message):
    """Moves replicas: the controller adds the new replicas, waits until they are in
    sync (they copy the log from the leader), moves leadership if the leader is not
    kept, then drops the replicas no longer wanted. The answer comes as soon as the
    reassignment is recorded; ListPartitionReassignments shows what is still moving."""

    topics: list[ReassignableTopic]
    timeout_ms: int = 30_000
    FIELDS: ClassVar = (Field("topics", Array(Struct(ReassignableTopic))),
                        Field("timeout_ms", INT32))


@dataclass(slots=True)
class AlterPartitionReassignmentsResponse(Message):
    """One ``TopicResult``-like answer per partition (topic, partition, error)."""

    topics: list[ElectionTopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(ElectionTopicResult))),)


@dataclass(slots=True)
class ListPartitionReassignmentsRequest(Message):
    """Reassignments still in progress (all topics)."""

    FIELDS: ClassVar = ()


@dataclass(slots=True)
class OngoingReassignment(Message):
    """``replicas``: the replica set while it moves (target first, then the leaving ones);
    ``adding`` / ``removing``: the brokers joining and leaving."""

    topic: str
    partition: int
    replicas: list[int]
    adding: list[int]
    removing: list[int]
    FIELDS: ClassVar = (
        Field("topic", STRING),
        Field("partition", INT32),
        Field("replicas", Array(INT32)),
        Field("adding", Array(INT32)),
        Field("removing", Array(INT32)),
    )


@dataclass(slots=True)
class ListPartitionReassignmentsResponse(Message):
    reassignments: list[OngoingReassignment]
    FIELDS: ClassVar = (Field("reassignments", Array(Struct(OngoingReassignment))),)


# ----------------------------------------------------------------------------- DescribeTier


@dataclass(slots=True)
class DescribeTierTopic(Message):
    """``partitions``: the partitions to describe; empty: every partition of the topic."""

    name: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(INT32)))


@dataclass(slots=True)
class DescribeTierRequest(Message):
    """What the tiering job needs to plan a pass: per partition, the closed segments
    the leader holds and how far ZooKeeper says the Delta table goes.

    Send each partition to its leader: a broker answers only for the partitions it
    leads (NOT_LEADER_OR_FOLLOWER otherwise, so the client refreshes metadata and
    retries there). Works for any topic; ``tier_enabled`` says whether it is tiered.
    """

    topics: list[DescribeTierTopic]
    FIELDS: ClassVar = (Field("topics", Array(Struct(DescribeTierTopic))),)


@dataclass(slots=True)
class TierSegment(Message):
    """One closed segment: offsets ``[base_offset, next_offset)``, the timestamp (ms) of
    its newest record (the file's modification time when no record carries one) and its
    size in bytes."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    size_bytes: int
    FIELDS: ClassVar = (
        Field("base_offset", INT64),
        Field("next_offset", INT64),
        Field("max_timestamp", INT64),
        Field("size_bytes", INT64),
    )


@dataclass(slots=True)
class DescribeTierPartitionResponse(Message):
    """``segments``: the closed segments (never the active one) that end at or below the
    high watermark, oldest first; the first may begin below ``log_start_offset`` (after
    DeleteRecords) and the records below it are not served. ``tiered_up_to``: exclusive
    end offset of the records in the Delta table, ``tier_start_offset``: the first one
    still there (both from ZooKeeper, 0 when nothing was tiered; ``log_start_offset``
    may be above ``tiered_up_to``, e.g. after retention before tiering was enabled).

    Errors: NOT_LEADER_OR_FOLLOWER (this broker does not lead the partition: retry on
    the leader), UNKNOWN_TOPIC_OR_PARTITION (no such partition), STORAGE_ERROR.
    """

    partition: int
    error_code: int
    log_start_offset: int = -1
    high_watermark: int = -1
    tiered_up_to: int = 0
    tier_start_offset: int = 0
    segments: list[TierSegment] = field(default_factory=list)
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("log_start_offset", INT64),
        Field("high_watermark", INT64),
        Field("tiered_up_to", INT64),
        Field("tier_start_offset", INT64),
        Field("segments", Array(Struct(TierSegment))),
    )


@dataclass(slots=True)
class DescribeTierTopicResponse(Message):
    """``tier_enabled`` / ``tier_after_ms``: the topic's ``tier.enable`` and
    ``tier.after.ms``; ``table``: its Delta table as recorded in ZooKeeper (null: none
    yet). Topic errors: UNKNOWN_TOPIC_OR_PARTITION, BROKER_NOT_AVAILABLE (ZooKeeper could
    not be read; retry); the partition list is empty then."""

    name: str
    error_code: int
    error_message: str | None = None
    tier_enabled: bool = False
    tier_after_ms: int = -1
    table: str | None = None
    partitions: list[DescribeTierPartitionResponse] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("tier_enabled", BOOL),
        Field("tier_after_ms", INT64),
        Field("table", NULLABLE_STRING),
        Field("partitions", Array(Struct(DescribeTierPartitionResponse))),
    )


@dataclass(slots=True)
class DescribeTierResponse(Message):
    """One entry per requested topic."""

    topics: list[DescribeTierTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(DescribeTierTopicResponse))),)


# ----------------------------------------------------------------------------- tier lease


@dataclass(slots=True)
class TierLeaseRequest(Message):
    """Take, renew or give up the tiering lease of one topic (one tiering job per topic).

    ``lease_id`` null: take the lease (free, or expired: its holder did not renew it
    within its ``ttl_ms``); otherwise renew it (``release`` false) or give it up
    (``release`` true). ``ttl_ms``: how long the lease lasts without a renewal (1 s to
    10 min); a job renews it well within that. ``owner``: who holds it, shown to a job
    that finds the topic busy. Any broker answers: the lease is kept in ZooKeeper, and
    its expiry is judged by the answering broker's clock (keep broker clocks within a
    small part of the TTL, e.g. NTP).

    Errors: TIER_JOB_BUSY (another job holds an unexpired lease; the message names it),
    TIER_LEASE_LOST (renew or release of a lease that is no longer this one: it expired
    and another job took it, or the topic was deleted), UNKNOWN_TOPIC_OR_PARTITION,
    INVALID_REQUEST (bad ``ttl_ms``), BROKER_NOT_AVAILABLE (ZooKeeper unreachable: retry).
    """

    topic: str
    owner: str
    lease_id: str | None
    ttl_ms: int
    release: bool = False
    FIELDS: ClassVar = (
        Field("topic", STRING),
        Field("owner", STRING),
        Field("lease_id", NULLABLE_STRING),
        Field("ttl_ms", INT32),
        Field("release", BOOL),
    )


@dataclass(slots=True)
class CompactionProgress(Message):
    """How far the topic's compacted Delta table has merged one partition."""

    partition: int
    merged_up_to: int
    FIELDS: ClassVar = (Field("partition", INT32), Field("merged_up_to", INT64))


@dataclass(slots=True)
class TierLeaseResponse(Message):
    """``lease_id``: the lease held (null after a release or an error); ``topic_id``:
    the topic the lease is for (writes under the lease name it, so a job never writes
    the progress of a deleted topic onto a new one of the same name); ``compacted``:
    the compacted table's progress per partition (stable while the lease is held: only
    its holder writes it)."""

    error_code: int
    error_message: str | None = None
    lease_id: str | None = None
    topic_id: str | None = None
    compacted: list[CompactionProgress] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("lease_id", NULLABLE_STRING),
        Field("topic_id", NULLABLE_STRING),
        Field("compacted", Array(Struct(CompactionProgress))),
    )


@dataclass(slots=True)
class TierProgressUpdate(Message):
    """Progress of one partition to record: ``tiered_up_to`` / ``tier_start`` (both -1:
    leave the tier progress alone) and ``merged_up_to`` (-1: leave the compaction
    progress alone). Offsets never move back: a smaller value keeps the stored one."""

    partition: int
    tiered_up_to: int = -1
    tier_start: int = -1
    merged_up_to: int = -1
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("tiered_up_to", INT64),
        Field("tier_start", INT64),
        Field("merged_up_to", INT64),
    )


@dataclass(slots=True)
class UpdateTierRequest(Message):
    """Record a tiering job's progress, fenced by its lease: each write is one ZooKeeper
    transaction that also checks the lease is still ``lease_id`` and the topic still
    ``topic_id``, so a job whose lease lapsed can never move progress (brokers delete
    local segments below ``tiered_up_to``). ``table`` (not null): record the topic's
    Delta table first. Any broker answers.

    Errors (topic level): TIER_LEASE_LOST, UNKNOWN_TOPIC_OR_PARTITION (deleted, or
    re-created under another id), INVALID_REQUEST (``tier_start > tiered_up_to``, a
    negative offset, or a partition the topic lacks), BROKER_NOT_AVAILABLE (retry).
    """

    topic: str
    lease_id: str
    topic_id: str
    table: str | None = None
    partitions: list[TierProgressUpdate] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("topic", STRING),
        Field("lease_id", STRING),
        Field("topic_id", STRING),
        Field("table", NULLABLE_STRING),
        Field("partitions", Array(Struct(TierProgressUpdate))),
    )


@dataclass(slots=True)
class UpdateTierResponse(Message):
    """What is stored afterwards, per partition of the request (``merged_up_to`` -1:
    not asked), so a job continues from the stored values, never from its own."""

    error_code: int
    error_message: str | None = None
    partitions: list[TierProgressUpdate] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("partitions", Array(Struct(TierProgressUpdate))),
    )


# ----------------------------------------------------------------------------- SASL
#
# Kafka's flow: on a SASL_PLAINTEXT or SASL_SSL listener a connection may send only
# ApiVersions, SaslHandshake and SaslAuthenticate until it is authenticated; anything
# else, or a handshake after authentication, is ILLEGAL_SASL_STATE and the broker closes
# the connection. SaslHandshake picks the mechanism; SaslAuthenticate carries the
# mechanism's messages (one for PLAIN, two for SCRAM).


@dataclass(slots=True)
class SaslHandshakeRequest(Message):
    """``mechanism``: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""

    mechanism: str
    FIELDS: ClassVar = (Field("mechanism", STRING),)


@dataclass(slots=True)
class SaslHandshakeResponse(Message):
    """``mechanisms``: what this listener offers (also on UNSUPPORTED_SASL_MECHANISM)."""

    error_code: int
    mechanisms: list[str] = field(default_factory=list)
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("mechanisms", Array(STRING)),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class SaslAuthenticateRequest(Message):
    """One message of the mechanism chosen by SaslHandshake."""

    auth_bytes: bytes
    FIELDS: ClassVar = (Field("auth_bytes", BYTES),)


@dataclass(slots=True)
class SaslAuthenticateResponse(Message):
    """The mechanism's answer. ``session_lifetime_ms`` (once authenticated, 0: none):
    the broker closes the connection after that long (``connections.max.reauth.ms``),
    so a deleted user or changed password takes effect on open connections too.
    Errors: SASL_AUTHENTICATION_FAILED (the connection is closed after the answer),
    ILLEGAL_SASL_STATE."""

    error_code: int
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("auth_bytes", BYTES),
        Field("session_lifetime_ms", INT64),
    )


@dataclass(slots=True)
class ScramCredentialInfo(Message):
    mechanism: str
    iterations: int
    FIELDS: ClassVar = (Field("mechanism", STRING), Field("iterations", INT32))


@dataclass(slots=True)
class DescribeUserScramCredentialsRequest(Message):
    """``users`` null: every user with a SCRAM credential."""

    users: list[str] | None
    FIELDS: ClassVar = (Field("users", Array(STRING, nullable=True)),)


@dataclass(slots=True)
class UserScramCredentials(Message):
    """One user's credentials (mechanism and iterations only: never a key or salt).
    RESOURCE_NOT_FOUND (91) when the user has none."""

    user: str
    error_code: int
    error_message: str | None = None
    credentials: list[ScramCredentialInfo] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("user", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("credentials", Array(Struct(ScramCredentialInfo))),
    )


@dataclass(slots=True)
class DescribeUserScramCredentialsResponse(Message):
    users: list[UserScramCredentials]
    FIELDS: ClassVar = (Field("users", Array(Struct(UserScramCredentials))),)


@dataclass(slots=True)
class ScramCredentialDeletion(Message):
    user: str
    mechanism: str
    FIELDS: ClassVar = (Field("user", STRING), Field("mechanism", STRING))


@dataclass(slots=True)
class ScramCredentialUpsertion(Message):
    """As Kafka's AlterUserScramCredentials: the client sends the salt and the salted
    password (PBKDF2 of the password), never the password; the broker derives and
    stores StoredKey and ServerKey from it."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes
    FIELDS: ClassVar = (
        Field("user", STRING),
        Field("mechanism", STRING),
        Field("iterations", INT32),
        Field("salt", BYTES),
        Field("salted_password", BYTES),
    )


@dataclass(slots=True)
class AlterUserScramCredentialsRequest(Message):
    deletions: list[ScramCredentialDeletion] = field(default_factory=list)
    upsertions: list[ScramCredentialUpsertion] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("deletions", Array(Struct(ScramCredentialDeletion))),
        Field("upsertions", Array(Struct(ScramCredentialUpsertion))),
    )


@dataclass(slots=True)
class AlterUserScramCredentialsResult(Message):
    user: str
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("user", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class AlterUserScramCredentialsResponse(Message):
    """One result per user named (deletions and upsertions of one user share it)."""

    results: list[AlterUserScramCredentialsResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(AlterUserScramCredentialsResult))),)


# ----------------------------------------------------------------------------- ACLs


@dataclass(slots=True)
class AclEntry(Message):
    """One ACL binding (Kafka's names): ``resource_type`` TOPIC, GROUP or CLUSTER;
    ``pattern_type`` LITERAL or PREFIXED; ``principal`` ``User:<name>`` or ``User:*``;
    ``host`` an address or ``*``; ``operation`` ALL, READ, WRITE, CREATE, DELETE, ALTER,
    DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS or IDEMPOTENT_WRITE;
    ``permission`` ALLOW or DENY."""

    resource_type: str
    pattern_type: str
    resource_name: str
    principal: str
    host: str
    operation: str
    permission: str
    FIELDS: ClassVar = (
        Field("resource_type", STRING),
        Field("pattern_type", STRING),
        Field("resource_name", STRING),
        Field("principal", STRING),
        Field("host", STRING),
        Field("operation", STRING),
        Field("permission", STRING),
    )


@dataclass(slots=True)
class AclFilterEntry(Message):
    """Which bindings: a null field matches any value; ``pattern_type`` MATCH takes every
    pattern that applies to ``resource_name`` (LITERAL, ``*`` and PREFIXED)."""

    resource_type: str | None = None
    pattern_type: str | None = None
    resource_name: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None
    FIELDS: ClassVar = (
        Field("resource_type", NULLABLE_STRING),
        Field("pattern_type", NULLABLE_STRING),
        Field("resource_name", NULLABLE_STRING),
        Field("principal", NULLABLE_STRING),
        Field("host", NULLABLE_STRING),
        Field("operation", NULLABLE_STRING),
        Field("permission", NULLABLE_STRING),
    )


@dataclass(slots=True)
class CreateAclsRequest(Message):
    """Needs ALTER on the CLUSTER. Every binding is checked first; a bad one is refused
    (INVALID_REQUEST) and only the good ones are added."""

    creations: list[AclEntry]
    FIELDS: ClassVar = (Field("creations", Array(Struct(AclEntry))),)


@dataclass(slots=True)
class AclResult(Message):
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_code", INT16), Field("error_message", NULLABLE_STRING))


@dataclass(slots=True)
class CreateAclsResponse(Message):
    """One result per creation, in order."""

    results: list[AclResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(AclResult))),)


@dataclass(slots=True)
class DescribeAclsRequest(Message):
    """Needs DESCRIBE on the CLUSTER."""

    filter: AclFilterEntry
    FIELDS: ClassVar = (Field("filter", Struct(AclFilterEntry)),)


@dataclass(slots=True)
class DescribeAclsResponse(Message):
    error_code: int
    error_message: str | None = None
    acls: list[AclEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("acls", Array(Struct(AclEntry))),
    )


@dataclass(slots=True)
class DeleteAclsRequest(Message):
    """Needs ALTER on the CLUSTER; each filter removes every binding it matches."""

    filters: list[AclFilterEntry]
    FIELDS: ClassVar = (Field("filters", Array(Struct(AclFilterEntry))),)


@dataclass(slots=True)
class DeleteAclsResult(Message):
    error_code: int
    error_message: str | None = None
    deleted: list[AclEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("deleted", Array(Struct(AclEntry))),
    )


@dataclass(slots=True)
class DeleteAclsResponse(Message):
    results: list[DeleteAclsResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(DeleteAclsResult))),)


# ----------------------------------------------------------------------------- client quotas


@dataclass(slots=True)
class QuotaValue(Message):
    """``key``: producer_byte_rate, consumer_byte_rate (bytes/s) or request_rate
    (requests/s)."""

    key: str
    value: int
    FIELDS: ClassVar = (Field("key", STRING), Field("value", INT64))


@dataclass(slots=True)
class QuotaEntry(Message):
    """The quotas of one entity: ``user`` or ``client_id`` (the other null);
    ``<default>`` is the default for every user or client id."""

    user: str | None
    client_id: str | None
    values: list[QuotaValue]
    FIELDS: ClassVar = (
        Field("user", NULLABLE_STRING),
        Field("client_id", NULLABLE_STRING),
        Field("values", Array(Struct(QuotaValue))),
    )


@dataclass(slots=True)
class DescribeClientQuotasRequest(Message):
    """Every quota set; needs DESCRIBE on the cluster."""

    FIELDS: ClassVar = ()


@dataclass(slots=True)
class DescribeClientQuotasResponse(Message):
    error_code: int
    error_message: str | None = None
    entries: list[QuotaEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("entries", Array(Struct(QuotaEntry))),
    )


@dataclass(slots=True)
class QuotaAlteration(Message):
    """Set ``key`` of the entity to ``value`` (``remove``: drop it)."""

    user: str | None
    client_id: str | None
    key: str
    value: int = 0
    remove: bool = False
    FIELDS: ClassVar = (
        Field("user", NULLABLE_STRING),
        Field("client_id", NULLABLE_STRING),
        Field("key", STRING),
        Field("value", INT64),
        Field("remove", BOOL),
    )


@dataclass(slots=True)
class AlterClientQuotasRequest(Message):
    """Needs ALTER on the cluster; every alteration is checked before any is stored."""

    alterations: list[QuotaAlteration]
    FIELDS: ClassVar = (Field("alterations", Array(Struct(QuotaAlteration))),)


@dataclass(slots=True)
class AlterClientQuotasResponse(Message):
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_code", INT16), Field("error_message", NULLABLE_STRING))


# ----------------------------------------------------------------------------- consumer groups
#
# Groups follow Kafka's KIP-848 ("next generation" consumer rebalance protocol): the
# coordinator computes the assignment on the server and each member converges to it
# through heartbeats, giving partitions up before anyone else is handed them. The
# member epoch values a heartbeat may carry:

JOIN_EPOCH: Final = 0  # a new member (member_id null) or a member that lost its place
LEAVE_EPOCH: Final = -1  # leave the group now; its partitions move at once
STATIC_LEAVE_EPOCH: Final = -2  # a static member leaves for a restart: its partitions wait
NO_MEMBER_EPOCH: Final = -1  # OffsetCommit outside any membership (admin tools; empty group)


@dataclass(slots=True)
class FindCoordinatorRequest(Message):
    """Which broker coordinates group ``key``: the leader of partition
    ``crc32(key) mod N`` of the internal topic ``__consumer_offsets`` (N partitions).
    Any broker answers; the first request creates ``__consumer_offsets`` if needed.

    Errors: COORDINATOR_NOT_AVAILABLE (the partition has no live leader yet, or the
    topic is being created: retry after a short back-off), INVALID_GROUP_ID (empty).
    """

    key: str
    FIELDS: ClassVar = (Field("key", STRING),)


@dataclass(slots=True)
class FindCoordinatorResponse(Message):
    error_code: int
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("node_id", INT32),
        Field("host", STRING),
        Field("port", INT32),
    )


@dataclass(slots=True)
class GroupTopicPartitions(Message):
    """Partitions of one topic: owned by a member, assigned to it, or asked about."""

    topic: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("topic", STRING), Field("partitions", Array(INT32)))


_T = TypeVar("_T")


def group_by_topic(items: Iterable[tuple[str, _T]]) -> dict[str, list[_T]]:
    """``(topic, item)`` pairs as ``{topic: [item, ...]}``, the per-topic lists of a
    request or answer: ``[FetchTopic(t, ps) for t, ps in group_by_topic(...).items()]``.

    Topics, and each topic's items, keep the order they are first seen in (sort the
    pairs first for a sorted result); duplicates are kept and no topic is empty.
    """
    out: dict[str, list[_T]] = {}
    for topic, item in items:
        out.setdefault(topic, []).append(item)
    return out


def group_topic_partitions(pairs: Iterable[tuple[str, int]]) -> list[GroupTopicPartitions]:
    """``(topic, partition)`` pairs in the wire shape, topics and partitions sorted."""
    return [GroupTopicPartitions(t, sorted(ps)) for t, ps in sorted(group_by_topic(pairs).items())]


@dataclass(slots=True)
class ConsumerGroupHeartbeatRequest(Message):
    """Join (``member_epoch`` 0, ``member_id`` null), stay (the member's id and epoch,
    every ``heartbeat_interval_ms``), or leave (``member_epoch`` -1; -2 for a static
    member that will come back: its partitions stay put until its session times out).

    ``owned``: the partitions the member holds right now (it has finished revoking what
    it was told to give up). ``subscribed_topics`` and ``assignor`` ("range": eager, every
    member gives up everything on a change; "cooperative-sticky": only moving partitions
    are revoked) are used on join and whenever they change; the group takes the assignor
    of its first member. ``instance_id`` (``group.instance.id``): a static member; a
    join with the id of an existing member takes its place and its partitions, with no
    rebalance. ``session_timeout_ms`` -1: the broker's ``group.session.timeout.ms``.

    Errors: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS
    (find the coordinator again and resend), UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH
    (the member was removed, e.g. its session expired: its partitions are lost, it must
    rejoin with epoch 0), FENCED_INSTANCE_ID (a newer consumer with this member's
    instance id replaced it: fatal, close the consumer), UNRELEASED_INSTANCE_ID
    (another live process uses this instance id; retry after a back-off, it is let in
    once the other is silent),
    UNSUPPORTED_ASSIGNOR, INVALID_SESSION_TIMEOUT, GROUP_MAX_SIZE_REACHED,
    INVALID_REQUEST.
    """

    group_id: str
    member_id: str | None
    member_epoch: int
    instance_id: str | None = None
    rebalance_timeout_ms: int = 60_000
    session_timeout_ms: int = -1
    subscribed_topics: list[str] = field(default_factory=list)
    assignor: str | None = None
    owned: list[GroupTopicPartitions] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("member_id", NULLABLE_STRING),
        Field("member_epoch", INT32),
        Field("instance_id", NULLABLE_STRING),
        Field("rebalance_timeout_ms", INT32),
        Field("session_timeout_ms", INT32),
        Field("subscribed_topics", Array(STRING)),
        Field("assignor", NULLABLE_STRING),
        Field("owned", Array(Struct(GroupTopicPartitions))),
    )


@dataclass(slots=True)
class ConsumerGroupHeartbeatResponse(Message):
    """``assignment``: every partition the member may own now. Partitions it owns but
    are missing here must be revoked (commit, stop, report without them); partitions
    here it does not own are new (read from the committed offset). Partitions moving to
    it from another member appear only once that member gave them up, so no partition
    is ever held by two members. ``member_epoch`` rises when the member's assignment
    reaches a new group epoch; ``heartbeat_interval_ms``: when to send the next one
    (sooner when something is pending)."""

    error_code: int
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: list[GroupTopicPartitions] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("member_id", NULLABLE_STRING),
        Field("member_epoch", INT32),
        Field("heartbeat_interval_ms", INT32),
        Field("assignment", Array(Struct(GroupTopicPartitions))),
    )


@dataclass(slots=True)
class OffsetCommitPartition(Message):
    partition: int
    offset: int
    metadata: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32), Field("offset", INT64), Field("metadata", NULLABLE_STRING)
    )


@dataclass(slots=True)
class OffsetCommitTopic(Message):
    name: str
    partitions: list[OffsetCommitPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(OffsetCommitPartition)))
    )


@dataclass(slots=True)
class OffsetCommitRequest(Message):
    """Store ``offset`` (the next record to process) per partition for the group, in
    ``__consumer_offsets`` with acks=all; answered once replicated.

    A member commits with its ``member_id`` and ``member_epoch``: accepted only for
    partitions it owns or is assigned now, so a fenced (zombie) member, one whose
    session expired or that was replaced, or one committing a partition that moved
    away, is refused. ``member_id`` null with ``member_epoch`` -1: a commit outside any
    membership (``strata group reset-offsets``), accepted only while the group has no
    members.

    Errors per partition (the same code on every partition for a group-level error):
    NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS (find
    the coordinator and retry), UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH (the member is
    no longer in the group), FENCED_INSTANCE_ID (a newer consumer with the member's
    group instance id replaced it), STALE_MEMBER_EPOCH (the partition is not the member's now),
    NON_EMPTY_GROUP (a membership-less commit to an active group),
    OFFSET_METADATA_TOO_LARGE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST (a negative
    offset), NOT_ENOUGH_REPLICAS / REQUEST_TIMED_OUT (not stored; retry).
    """

    group_id: str
    member_id: str | None
    member_epoch: int
    topics: list[OffsetCommitTopic]
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("member_id", NULLABLE_STRING),
        Field("member_epoch", INT32),
        Field("topics", Array(Struct(OffsetCommitTopic))),
    )


@dataclass(slots=True)
class OffsetCommitPartitionResponse(Message):
    partition: int
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class OffsetCommitTopicResponse(Message):
    name: str
    partitions: list[OffsetCommitPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("partitions", Array(Struct(OffsetCommitPartitionResponse))),
    )


@dataclass(slots=True)
class OffsetCommitResponse(Message):
    topics: list[OffsetCommitTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(OffsetCommitTopicResponse))),)


@dataclass(slots=True)
class OffsetFetchRequest(Message):
    """The group's committed offsets; ``topics`` null: every committed partition."""

    group_id: str
    topics: list[GroupTopicPartitions] | None = None
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("topics", Array(Struct(GroupTopicPartitions), nullable=True)),
    )


@dataclass(slots=True)
class OffsetFetchPartitionResponse(Message):
    """``offset`` -1: nothing committed. ``commit_timestamp``: ms since the epoch."""

    partition: int
    offset: int
    metadata: str | None = None
    commit_timestamp: int = -1
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("offset", INT64),
        Field("metadata", NULLABLE_STRING),
        Field("commit_timestamp", INT64),
    )


@dataclass(slots=True)
class OffsetFetchTopicResponse(Message):
    name: str
    partitions: list[OffsetFetchPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("partitions", Array(Struct(OffsetFetchPartitionResponse))),
    )


@dataclass(slots=True)
class OffsetFetchResponse(Message):
    """Errors: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS."""

    error_code: int
    error_message: str | None = None
    topics: list[OffsetFetchTopicResponse] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("topics", Array(Struct(OffsetFetchTopicResponse))),
    )


@dataclass(slots=True)
class ListGroupsRequest(Message):
    """The groups this broker coordinates (ask every broker for the whole cluster)."""

    FIELDS: ClassVar = ()


@dataclass(slots=True)
class ListedGroup(Message):
    """``state``: Empty, Assigning (waiting for members to give partitions up),
    Reconciling (partitions moving), Stable."""

    group_id: str
    state: str
    assignor: str
    members: int
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("state", STRING),
        Field("assignor", STRING),
        Field("members", INT32),
    )


@dataclass(slots=True)
class ListGroupsResponse(Message):
    error_code: int
    groups: list[ListedGroup] = field(default_factory=list)
    FIELDS: ClassVar = (Field("error_code", INT16), Field("groups", Array(Struct(ListedGroup))))


@dataclass(slots=True)
class DescribeGroupsRequest(Message):
    """Send to each group's coordinator."""

    group_ids: list[str]
    FIELDS: ClassVar = (Field("group_ids", Array(STRING)),)


@dataclass(slots=True)
class DescribedMember(Message):
    """``assignment``: what the member may own now; ``target``: where the assignor wants
    it to end up (they differ while partitions move)."""

    member_id: str
    instance_id: str | None
    client_id: str
    member_epoch: int
    subscribed_topics: list[str]
    assignment: list[GroupTopicPartitions]
    target: list[GroupTopicPartitions]
    FIELDS: ClassVar = (
        Field("member_id", STRING),
        Field("instance_id", NULLABLE_STRING),
        Field("client_id", STRING),
        Field("member_epoch", INT32),
        Field("subscribed_topics", Array(STRING)),
        Field("assignment", Array(Struct(GroupTopicPartitions))),
        Field("target", Array(Struct(GroupTopicPartitions))),
    )


@dataclass(slots=True)
class DescribedGroup(Message):
    """Errors: NOT_COORDINATOR (and the other coordinator errors), GROUP_ID_NOT_FOUND
    (no members and no committed offsets)."""

    group_id: str
    error_code: int
    error_message: str | None = None
    state: str = ""
    assignor: str = ""
    group_epoch: int = 0
    members: list[DescribedMember] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("state", STRING),
        Field("assignor", STRING),
        Field("group_epoch", INT32),
        Field("members", Array(Struct(DescribedMember))),
    )


@dataclass(slots=True)
class DescribeGroupsResponse(Message):
    groups: list[DescribedGroup]
    FIELDS: ClassVar = (Field("groups", Array(Struct(DescribedGroup))),)


@dataclass(slots=True)
class DeleteGroupsRequest(Message):
    """Delete groups with no members: their committed offsets are removed (tombstones
    in ``__consumer_offsets``). Send to each group's coordinator."""

    group_ids: list[str]
    FIELDS: ClassVar = (Field("group_ids", Array(STRING)),)


@dataclass(slots=True)
class DeleteGroupResult(Message):
    """Errors: NON_EMPTY_GROUP (stop its consumers first), GROUP_ID_NOT_FOUND, and the
    coordinator errors."""

    group_id: str
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class DeleteGroupsResponse(Message):
    results: list[DeleteGroupResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(DeleteGroupResult))),)


# ----------------------------------------------------------------------------- schemas

#: The internal topic the schema registry is stored in (its partition 0's leader serves
#: it); brokers create it, clients look its leader up.
SCHEMAS_TOPIC: Final = "__schemas"

#: SchemaRegistryRequest.operation values, each one Confluent Schema Registry call (the
#: gateway's REST routes map onto them one to one; docs/typed-topics.md).
SCHEMA_OPERATIONS: Final = (
    "register",            # POST /subjects/{subject}/versions
    "lookup",              # POST /subjects/{subject}
    "list_subjects",       # GET /subjects
    "list_versions",       # GET /subjects/{subject}/versions
    "get_version",         # GET /subjects/{subject}/versions/{version}
    "delete_subject",      # DELETE /subjects/{subject}
    "delete_version",      # DELETE /subjects/{subject}/versions/{version}
    "get_by_id",           # GET /schemas/ids/{id}
    "id_versions",         # GET /schemas/ids/{id}/versions
    "check_compatibility",  # POST /compatibility/subjects/{subject}/versions/{version}
    "get_config",          # GET /config, GET /config/{subject}
    "set_config",          # PUT /config, PUT /config/{subject}
    "delete_config",       # DELETE /config/{subject}
    "subject_schemas",     # brokers and clients: every version of a subject, with its text
)


@dataclass(slots=True)
class SchemaRegistryRequest(Message):
    """One schema registry operation, answered by the broker that leads ``__schemas``
    partition 0 (any other broker answers NOT_COORDINATOR: look the leader up in the
    metadata of ``__schemas`` and retry there; COORDINATOR_NOT_AVAILABLE while the topic
    is being created).

    ``version``: -1 the latest, 0 not given. ``schema_id``: 0 not given. ``subject``
    null with get/set_config: the global setting. ``permanent``: a hard delete (the
    version must be soft-deleted first, as Confluent's). ``include_deleted``: list
    soft-deleted subjects and versions too. ``default_to_global``: get_config of a
    subject without its own setting answers the global one (else SCHEMA_NOT_FOUND, 40408).

    Errors: INVALID_SCHEMA, INCOMPATIBLE_SCHEMA, SCHEMA_NOT_FOUND, INVALID_REQUEST (an
    unknown operation or compatibility level), the coordinator errors, and
    TOPIC/CLUSTER_AUTHORIZATION_FAILED (reads need DESCRIBE and writes ALTER on the
    subject's topic, ``<topic>-value``/``<topic>-key``, or on the cluster).
    """

    operation: str
    subject: str | None = None
    version: int = 0
    schema_id: int = 0
    schema: str | None = None
    schema_type: str | None = None
    compatibility: str | None = None
    permanent: bool = False
    include_deleted: bool = False
    default_to_global: bool = False
    FIELDS: ClassVar = (
        Field("operation", STRING),
        Field("subject", NULLABLE_STRING),
        Field("version", INT32),
        Field("schema_id", INT32),
        Field("schema", NULLABLE_LONG_STRING),
        Field("schema_type", NULLABLE_STRING),
        Field("compatibility", NULLABLE_STRING),
        Field("permanent", BOOL),
        Field("include_deleted", BOOL),
        Field("default_to_global", BOOL),
    )


@dataclass(slots=True)
class SchemaRegistryResponse(Message):
    """``body``: the answer as the JSON Confluent's REST API returns for the operation.
    ``registry_code``: Confluent's error code on an error (40401 subject not found,
    40402 version not found, 40403 schema not found, 40404/40405/40406/40407 delete
    states, 40408 no subject config, 409 incompatible, 42201 invalid schema, 42202
    invalid version, 42203 invalid compatibility level), 0 otherwise; its first three
    digits are the HTTP status the gateway answers with."""

    error_code: int
    error_message: str | None = None
    registry_code: int = 0
    body: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("registry_code", INT32),
        Field("body", NULLABLE_LONG_STRING),
    )


# ----------------------------------------------------------------------------- registry

REQUEST_TYPES: Final[dict[ApiKey, type[Message]]] = {
    ApiKey.API_VERSIONS: ApiVersionsRequest,
    ApiKey.METADATA: MetadataRequest,
    ApiKey.CREATE_TOPICS: CreateTopicsRequest,
    ApiKey.DELETE_TOPICS: DeleteTopicsRequest,
    ApiKey.DESCRIBE_CONFIGS: DescribeConfigsRequest,
    ApiKey.ALTER_CONFIGS: AlterConfigsRequest,
    ApiKey.PRODUCE: ProduceRequest,
    ApiKey.FETCH: FetchRequest,
    ApiKey.LIST_OFFSETS: ListOffsetsRequest,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdRequest,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: OffsetForLeaderEpochRequest,
    ApiKey.STAGE_RECORDS: StageRecordsRequest,
    ApiKey.COMMIT_STAGED: CommitStagedRequest,
    ApiKey.ABORT_STAGED: AbortStagedRequest,
    ApiKey.ELECT_LEADERS: ElectLeadersRequest,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: AlterPartitionReassignmentsRequest,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: ListPartitionReassignmentsRequest,
    ApiKey.DESCRIBE_TIER: DescribeTierRequest,
    ApiKey.TIER_LEASE: TierLeaseRequest,
    ApiKey.UPDATE_TIER: UpdateTierRequest,
    ApiKey.SASL_HANDSHAKE: SaslHandshakeRequest,
    ApiKey.SASL_AUTHENTICATE: SaslAuthenticateRequest,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: DescribeUserScramCredentialsRequest,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: AlterUserScramCredentialsRequest,
    ApiKey.CREATE_ACLS: CreateAclsRequest,
    ApiKey.DESCRIBE_ACLS: DescribeAclsRequest,
    ApiKey.DELETE_ACLS: DeleteAclsRequest,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: DescribeClientQuotasRequest,
    ApiKey.ALTER_CLIENT_QUOTAS: AlterClientQuotasRequest,
    ApiKey.FIND_COORDINATOR: FindCoordinatorRequest,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: ConsumerGroupHeartbeatRequest,
    ApiKey.OFFSET_COMMIT: OffsetCommitRequest,
    ApiKey.OFFSET_FETCH: OffsetFetchRequest,
    ApiKey.LIST_GROUPS: ListGroupsRequest,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsRequest,
    ApiKey.DELETE_GROUPS: DeleteGroupsRequest,
    ApiKey.SCHEMA_REGISTRY: SchemaRegistryRequest,
}

RESPONSE_TYPES: Final[dict[ApiKey, type[Message]]] = {
    ApiKey.API_VERSIONS: ApiVersionsResponse,
    ApiKey.METADATA: MetadataResponse,
    ApiKey.CREATE_TOPICS: CreateTopicsResponse,
    ApiKey.DELETE_TOPICS: DeleteTopicsResponse,
    ApiKey.DESCRIBE_CONFIGS: DescribeConfigsResponse,
    ApiKey.ALTER_CONFIGS: AlterConfigsResponse,
    ApiKey.PRODUCE: ProduceResponse,
    ApiKey.FETCH: FetchResponse,
    ApiKey.LIST_OFFSETS: ListOffsetsResponse,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdResponse,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: OffsetForLeaderEpochResponse,
    ApiKey.STAGE_RECORDS: StageRecordsResponse,
    ApiKey.COMMIT_STAGED: CommitStagedResponse,
    ApiKey.ABORT_STAGED: AbortStagedResponse,
    ApiKey.ELECT_LEADERS: ElectLeadersResponse,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: AlterPartitionReassignmentsResponse,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: ListPartitionReassignmentsResponse,
    ApiKey.DESCRIBE_TIER: DescribeTierResponse,
    ApiKey.TIER_LEASE: TierLeaseResponse,
    ApiKey.UPDATE_TIER: UpdateTierResponse,
    ApiKey.SASL_HANDSHAKE: SaslHandshakeResponse,
    ApiKey.SASL_AUTHENTICATE: SaslAuthenticateResponse,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: DescribeUserScramCredentialsResponse,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: AlterUserScramCredentialsResponse,
    ApiKey.CREATE_ACLS: CreateAclsResponse,
    ApiKey.DESCRIBE_ACLS: DescribeAclsResponse,
    ApiKey.DELETE_ACLS: DeleteAclsResponse,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: DescribeClientQuotasResponse,
    ApiKey.ALTER_CLIENT_QUOTAS: AlterClientQuotasResponse,
    ApiKey.FIND_COORDINATOR: FindCoordinatorResponse,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: ConsumerGroupHeartbeatResponse,
    ApiKey.OFFSET_COMMIT: OffsetCommitResponse,
    ApiKey.OFFSET_FETCH: OffsetFetchResponse,
    ApiKey.LIST_GROUPS: ListGroupsResponse,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsResponse,
    ApiKey.DELETE_GROUPS: DeleteGroupsResponse,
    ApiKey.SCHEMA_REGISTRY: SchemaRegistryResponse,
}

# Versions this build speaks, per API: (min, max). Bump max when a field is added.
API_VERSIONS: Final[dict[ApiKey, tuple[int, int]]] = {
    **{key: (0, 0) for key in ApiKey},
    ApiKey.FETCH: (0, 1),  # 1: fetch sessions
    ApiKey.METADATA: (0, 1),  # 1: a topic's value subject
}
