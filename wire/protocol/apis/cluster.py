"""Cluster admin: ElectLeaders, AlterPartitionReassignments,
ListPartitionReassignments.

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
]


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
