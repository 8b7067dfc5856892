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

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, Final

from brokers.protocol.codec import (
    BOOL,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    RECORDS,
    STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
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
    "ErrorResponse",
    "FetchPartition",
    "FetchPartitionResponse",
    "FetchRequest",
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
    a whole (unsupported API or version, malformed body) and an ``ErrorResponse`` follows."""

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
    error_code: int = 0
    apis: list[ApiVersionRange] = field(default_factory=list)
    FIELDS: ClassVar = (Field("error_code", INT16), Field("apis", Array(Struct(ApiVersionRange))))


# ----------------------------------------------------------------------------- Metadata


@dataclass(slots=True)
class MetadataRequest(Message):
    topics: list[str] | None = None  # None: every topic
    FIELDS: ClassVar = (Field("topics", Array(STRING, nullable=True)),)


@dataclass(slots=True)
class BrokerInfo(Message):
    node_id: int
    host: str
    port: int
    FIELDS: ClassVar = (Field("node_id", INT32), Field("host", STRING), Field("port", INT32))


@dataclass(slots=True)
class PartitionMetadata(Message):
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
    error_code: int
    name: str
    partitions: list[PartitionMetadata]
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("name", STRING),
        Field("partitions", Array(Struct(PartitionMetadata))),
    )


@dataclass(slots=True)
class MetadataResponse(Message):
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
    name: str
    value: str | None
    FIELDS: ClassVar = (Field("name", STRING), Field("value", NULLABLE_STRING))


@dataclass(slots=True)
class ReplicaAssignment(Message):
    partition: int
    broker_ids: list[int]
    FIELDS: ClassVar = (Field("partition", INT32), Field("broker_ids", Array(INT32)))


@dataclass(slots=True)
class CreatableTopic(Message):
    """``num_partitions``/``replication_factor`` -1: the broker defaults. A non-empty
    ``assignments`` places every replica explicitly (then both counts must be -1)."""

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
    topics: list[str]
    timeout_ms: int = 30_000
    FIELDS: ClassVar = (Field("topics", Array(STRING)), Field("timeout_ms", INT32))


@dataclass(slots=True)
class DeleteTopicsResponse(Message):
    topics: list[TopicResult]
    FIELDS: ClassVar = (Field("topics", Array(Struct(TopicResult))),)


@dataclass(slots=True)
class DescribeConfigsRequest(Message):
    topics: list[str]
    FIELDS: ClassVar = (Field("topics", Array(STRING)),)


@dataclass(slots=True)
class DescribedConfig(Message):
    name: str
    value: str | None
    is_default: bool
    FIELDS: ClassVar = (
        Field("name", STRING), Field("value", NULLABLE_STRING), Field("is_default", BOOL)
    )


@dataclass(slots=True)
class TopicConfigs(Message):
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
    partition: int
    records: Any  # bytes of exactly one record batch
    FIELDS: ClassVar = (Field("partition", INT32), Field("records", RECORDS))


@dataclass(slots=True)
class ProduceTopic(Message):
    name: str
    partitions: list[ProducePartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(ProducePartition))))


@dataclass(slots=True)
class ProduceRequest(Message):
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
    topics: list[ProduceTopicResponse]
    throttle_time_ms: int = 0
    FIELDS: ClassVar = (
        Field("topics", Array(Struct(ProduceTopicResponse))), Field("throttle_time_ms", INT32)
    )


# ----------------------------------------------------------------------------- Fetch


@dataclass(slots=True)
class FetchPartition(Message):
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
    name: str
    partitions: list[FetchPartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(FetchPartition))))


@dataclass(slots=True)
class FetchRequest(Message):
    topics: list[FetchTopic]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 << 20
    replica_id: int = -1  # -1: a consumer; a broker id: a follower
    isolation_level: int = 0
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("max_wait_ms", INT32),
        Field("min_bytes", INT32),
        Field("max_bytes", INT32),
        Field("isolation_level", INT8),
        Field("topics", Array(Struct(FetchTopic))),
    )


@dataclass(slots=True)
class FetchPartitionResponse(Message):
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
    name: str
    partitions: list[FetchPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(FetchPartitionResponse)))
    )


@dataclass(slots=True)
class FetchResponse(Message):
    topics: list[FetchTopicResponse]
    error_code: int = 0
    throttle_time_ms: int = 0
    FIELDS: ClassVar = (
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("topics", Array(Struct(FetchTopicResponse))),
    )


# ----------------------------------------------------------------------------- ListOffsets


@dataclass(slots=True)
class ListOffsetsPartition(Message):
    partition: int
    timestamp: int  # EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, or ms
    FIELDS: ClassVar = (Field("partition", INT32), Field("timestamp", INT64))


@dataclass(slots=True)
class ListOffsetsTopic(Message):
    name: str
    partitions: list[ListOffsetsPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ListOffsetsPartition)))
    )


@dataclass(slots=True)
class ListOffsetsRequest(Message):
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
    name: str
    partitions: list[ListOffsetsPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ListOffsetsPartitionResponse)))
    )


@dataclass(slots=True)
class ListOffsetsResponse(Message):
    topics: list[ListOffsetsTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(ListOffsetsTopicResponse))),)


# ----------------------------------------------------------------------------- InitProducerId


@dataclass(slots=True)
class InitProducerIdRequest(Message):
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
}

# Versions this build speaks, per API: (min, max). Bump max when a field is added.
API_VERSIONS: Final[dict[ApiKey, tuple[int, int]]] = {key: (0, 0) for key in ApiKey}
