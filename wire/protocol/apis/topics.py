"""Topic admin: CreateTopics, DeleteTopics, DescribeConfigs, AlterConfigs.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from wire.protocol.codec import (
    BOOL,
    INT16,
    INT32,
    NULLABLE_STRING,
    STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
    "ConfigEntry",
    "CreatableTopic",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribeConfigsRequest",
    "DescribeConfigsResponse",
    "DescribedConfig",
    "AlterConfigsRequest",
    "AlterConfigsResponse",
    "AlterConfigsTopic",
    "ReplicaAssignment",
    "TopicConfigs",
    "TopicResult",
]


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
