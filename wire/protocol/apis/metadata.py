"""Metadata: brokers, topics, partitions and their leaders.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wire.protocol.codec import (
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
    "BrokerInfo",
    "MetadataRequest",
    "MetadataResponse",
    "PartitionMetadata",
    "TopicMetadata",
]


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
