"""Consumer groups: FindCoordinator, ConsumerGroupHeartbeat, OffsetCommit, OffsetFetch,
ListGroups, DescribeGroups, DeleteGroups.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Final, TypeVar

from wire.protocol.codec import (
    BOOL,
    INT8,
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
]


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

    ``key_type`` (version 1): 0 a group (above), 1 a transactional id, whose coordinator
    leads partition ``java_hash(key) mod N`` of ``__transaction_state`` (Kafka's rule,
    docs/transactions.md).
    """

    key: str
    key_type: int = 0
    FIELDS: ClassVar = (Field("key", STRING), Field("key_type", INT8, since=1))


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
    """The group's committed offsets; ``topics`` null: every committed partition.

    ``require_stable`` (version 1): a partition with offsets pending in an open
    transaction (TxnOffsetCommit) answers UNSTABLE_OFFSET_COMMIT (retry shortly) instead
    of the offset committed before it, as Kafka's read_committed consumers ask."""

    group_id: str
    topics: list[GroupTopicPartitions] | None = None
    require_stable: bool = False
    FIELDS: ClassVar = (
        Field("group_id", STRING),
        Field("topics", Array(Struct(GroupTopicPartitions), nullable=True)),
        Field("require_stable", BOOL, since=1),
    )


@dataclass(slots=True)
class OffsetFetchPartitionResponse(Message):
    """``offset`` -1: nothing committed. ``commit_timestamp``: ms since the epoch.
    ``error_code`` (version 1): UNSTABLE_OFFSET_COMMIT with ``require_stable`` when a
    transaction holds offsets of the partition pending."""

    partition: int
    offset: int
    metadata: str | None = None
    commit_timestamp: int = -1
    error_code: int = 0
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("offset", INT64),
        Field("metadata", NULLABLE_STRING),
        Field("commit_timestamp", INT64),
        Field("error_code", INT16, since=1),
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
