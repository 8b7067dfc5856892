"""The consumer group coordinator: membership, server-side assignment, committed offsets.

Where a group lives
    Group ``G`` belongs to partition ``crc32(G) mod N`` of the internal, replicated,
    compacted topic ``__consumer_offsets`` (N = its partition count, fixed at creation
    from ``offsets.topic.num.partitions``). The leader of that partition is G's
    coordinator. Everything the coordinator must remember is a record in that partition,
    written with acks=all before the request that caused it is answered:

    key   {"group": G, "type": "group", "v": 1}                     (JSON, sorted keys)
    value {"assignor", "group_epoch", "target_epoch", "partition_counts"}
    key   {"group": G, "member": M, "type": "member", "v": 1}
    value {"member_id", "instance_id", "client_id", "subscribed", "session_timeout_ms",
           "rebalance_timeout_ms", "member_epoch", "assigned", "owned", "ready_epoch",
           "away", "target"}
    key   {"group": G, "partition": P, "topic": T, "type": "offset", "v": 1}
    value {"metadata", "offset", "timestamp"}
    a null value (tombstone) deletes the key (a member removed, DeleteGroups).

    A request changes the group in memory, writes the records of what changed, and is
    answered only once they are replicated; if the write fails the change is rolled
    back, so memory is never ahead of the log and a retry starts from what is stored.
    Requests to one group run one at a time; those that arrive while a write is being
    replicated run together next, as one *round*, and the records of the whole round go
    out as one batch (the last value per key): a join storm of a thousand members costs
    a few replicated writes, not a thousand. Every request of a round is answered after
    the round's write (errors too, since they may rest on the round's changes); a failed
    write undoes the whole round, newest request first, and answers each with the error.
    A member's record is rewritten only when that member changed (or its target did),
    so a heartbeat of a stable group writes nothing.

    Compaction keeps the latest value per key, so the partition stays small. A broker
    that becomes the leader of an offsets partition (failover, reassignment) replays it
    from the start before it answers for those groups (COORDINATOR_LOAD_IN_PROGRESS is
    never needed: the replay runs inside the first request); state is tagged with the
    leader epoch it was loaded at, so a broker that lost and regained leadership reloads.

Membership (Kafka's KIP-848 model, simplified)
    Members heartbeat with what they own. A change of membership, of a member's
    subscription, or of a subscribed topic's partition count bumps the *group epoch*;
    the assignor then computes a new *target* (``brokers/group_assignors.py``). Each
    heartbeat moves its member one step towards its target:

    * cooperative (``cooperative-sticky``): partitions the member owns but no longer
      targets are revoked first (the answer leaves them out; the member commits, stops,
      and reports without them). Then it is given every targeted partition that no other
      member owns or is assigned. So a partition is never assigned to two members, and
      partitions that do not move are never interrupted.
    * eager (``range``): at a new target every member is first told to give up
      everything; once every member has reported owning nothing at that epoch, each is
      given its whole target.

    A member whose heartbeats stop for ``session_timeout_ms`` is removed (its partitions
    move); a member that does not finish a revocation within ``rebalance_timeout_ms``
    likewise. A static member (``instance_id``) that leaves with epoch -2 keeps its
    assignment until its session times out; a join with the same instance id takes
    its place (and partitions) with no rebalance, and fences the old member id. A join
    while the twin still heartbeats (two live processes with one instance id) is refused
    with UNRELEASED_INSTANCE_ID.

Fencing
    An OffsetCommit is accepted only from a current member, for partitions it owns or is
    assigned now; what a member reports as owned counts only where the coordinator gave
    it. A zombie (paused past its session, left after ``max_poll_interval_ms``, or
    committing a partition that has moved) gets UNKNOWN_MEMBER_ID or STALE_MEMBER_EPOCH;
    the old id of a static member that a new incarnation replaced gets
    FENCED_INSTANCE_ID (remembered in memory for the newest ``_REPLACED_KEPT``; after a
    coordinator move it is UNKNOWN_MEMBER_ID, refused all the same).

Cost (a group of M members on P partitions)
    A heartbeat costs O(its member's own partitions), whatever M and P: the group keeps
    a count of the members holding each partition (``_Holders``, kept in step by the
    setters of ``Member.owned``/``assigned`` and by ``Group.members``), so "is this
    partition free?" is one lookup; each request notes what it changed as it changes it
    (``_Change``), so finding the records to write and undoing a failed write touch only
    that; the subscribed topics and the eager barrier are cached and resumed, not
    rescanned. The target is recomputed only when the group epoch moved, and once per
    round (after its last request; a request alone in its round does it itself): the
    sticky assignor is O((P + moved partitions) log M) (``group_assignors.py``). While
    partitions move, members come back every 100 ms, but no sooner than keeps the
    group's heartbeats near ``_BUSY_HEARTBEATS_PER_S``. A commit costs O(its
    partitions). The expiry pass still looks at every member (every 100 ms).

Thread-safety: everything runs on the broker's event loop; a group's requests run one at
a time in its rounds (``GroupCoordinator._run``), a round yields to the loop every
``_ROUND_SLICE_S`` of work, and a heartbeat's arrival time, not its turn, is what keeps
its session alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from brokers.group_assignors import (
    ASSIGNORS,
    COOPERATIVE_STICKY,
    EAGER_ASSIGNORS,
    TopicPartition,
    assign,
)
from brokers.internal_topics import (
    KeyedTopic,
    append_replicated,
    ask_broker,
    create_internal_topic,
)
from wire.errors import (
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    InvalidGroupIdError,
    InvalidRecordBatchError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetMetadataTooLargeError,
    RequestTimedOutError,
    StaleMemberEpochError,
    StrataError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnreleasedInstanceIdError,
    UnstableOffsetCommitError,
    UnsupportedAssignorError,
)
from wire.protocol import (
    JOIN_EPOCH,
    LATEST_TIMESTAMP,
    LEAVE_EPOCH,
    NO_MEMBER_EPOCH,
    STATIC_LEAVE_EPOCH,
    ApiKey,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    DescribedGroup,
    DescribedMember,
    GroupTopicPartitions,
    ListedGroup,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    TxnPartitionResult,
    TxnTopicResult,
    group_by_topic,
    group_topic_partitions,
)
from wire.record_batch import (
    ControlType,
    batches_to_table,
    build_batch,
    iter_batches,
    parse_control,
)

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from brokers.config import BrokerConfig
    from brokers.coordination import ZooKeeperClient
    from brokers.partition import Partition
    from brokers.services import InternalTopicHost, MetadataCache, PartitionRegistry

__all__ = ["GroupCoordinator", "OFFSETS_TOPIC", "coordinator_partition"]

log = logging.getLogger("strata.brokers.groups")

OFFSETS_TOPIC: Final = "__consumer_offsets"
_UNSTABLE: Final = UnstableOffsetCommitError.code
#: One record of a load: key, value, the producer id of a transaction's offsets (None:
#: an ordinary record), and for a marker (key None) whether it commits.
_Event = tuple[dict[str, Any] | None, dict[str, Any] | None, Any, bool | None]
#: Asks the transaction coordinator whether partitions are in a producer's open
#: transaction (``TransactionCoordinator.verify``).
Verify = Callable[[str, int, int, list[tuple[str, int]]],
                  Awaitable[Mapping[tuple[str, int], StrataError | None]]]
OFFSETS_SEGMENT_BYTES: Final = 100 * 1024 * 1024
MAX_GROUP_ID_LENGTH: Final = 249
#: Replaced static member ids a group remembers for FENCED_INSTANCE_ID (``Group.replaced``).
_REPLACED_KEPT: Final = 1024
# While something is moving, members come back this soon instead of after a full interval.
_BUSY_HEARTBEAT_MS: Final = 100
# ... but a large group's moving members together come back about this often, at most.
_BUSY_HEARTBEATS_PER_S: Final = 2000
# A round of group operations yields to the event loop after this much work.
_ROUND_SLICE_S: Final = 0.02
_SLOW_ROUND_S: Final = 1.0  # a round slower than this is logged (INFO)
_WRITE_TIMEOUT_S: Final = 10.0
_EXPIRY_TICK_S: Final = 0.1
_LOAD_READ_BYTES: Final = 4 << 20


def coordinator_partition(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition that holds ``group_id`` (stable across builds:
    clients and tools may compute it too)."""
    return zlib.crc32(group_id.encode("utf-8")) % partitions


def _settle(future: asyncio.Future[Any] | None, result: Any = None,
            error: BaseException | None = None) -> None:
    if future is None or future.done():  # internal, or its caller gave up (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _key(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}, sort_keys=True, separators=(",", ":")).encode()


def _value(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _tps(pairs: Iterable[Any]) -> set[TopicPartition]:
    return {(str(t), int(p)) for t, p in pairs}


def _from_wire(entries: Iterable[GroupTopicPartitions]) -> set[TopicPartition]:
    return {(e.topic, p) for e in entries for p in e.partitions}


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    metadata: str | None
    timestamp: int
    # The id of the topic it was committed for (None: stored before ids were kept). A
    # topic deleted and created again has a new id: its old offsets no longer apply.
    topic_id: str | None = None


class _Holders:
    """How many members of a group own or are assigned each partition, kept up to date
    by every change of a member's ``owned``/``assigned`` and of the group's membership
    (``Member``'s setters, ``_Members``). With it a heartbeat asks "does another member
    hold this partition?" per partition of its own target, instead of taking the union
    of every member's partitions (O(partitions of the group) per heartbeat).

    ``version`` moves on every change of membership or of a member's subscription: the
    caches derived from the member list (subscribed topics, the eager barrier) are keyed
    on it."""

    __slots__ = ("counts", "version")

    def __init__(self) -> None:
        self.counts: dict[TopicPartition, int] = {}
        self.version = 0

    def held(self, tp: TopicPartition) -> int:
        return self.counts.get(tp, 0)

    def shift(self, before: frozenset[TopicPartition], after: frozenset[TopicPartition]
              ) -> None:
        counts = self.counts
        for tp in before - after:
            n = counts[tp] - 1
            if n:
                counts[tp] = n
            else:
                del counts[tp]
        for tp in after - before:
            counts[tp] = counts.get(tp, 0) + 1


_NONE: frozenset[TopicPartition] = frozenset()


class Member:
    """One member as the coordinator knows it. ``owned`` and ``assigned`` are frozen
    sets behind setters: assigning either (the only way to change them) keeps the
    group's ``_Holders`` index in step."""

    __slots__ = (
        "_assigned",
        "_index",
        "_owned",
        "_subscribed",
        "away",
        "client_id",
        "instance_id",
        "last_seen",
        "member_epoch",
        "member_id",
        "ready_epoch",
        "rebalance_timeout_ms",
        "revoking_since",
        "session_timeout_ms",
    )

    def __init__(self, member_id: str, instance_id: str | None, client_id: str,
                 subscribed: list[str], session_timeout_ms: int, rebalance_timeout_ms: int,
                 member_epoch: int = 0, assigned: Iterable[TopicPartition] = (),
                 owned: Iterable[TopicPartition] = (), ready_epoch: int = 0,
                 away: bool = False, last_seen: float = 0.0,
                 revoking_since: float | None = None) -> None:
        self._index: _Holders | None = None
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self._subscribed = list(subscribed)
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_epoch = member_epoch
        self._assigned = frozenset(assigned)  # may own now
        self._owned = frozenset(owned)  # reported, within what it got
        self.ready_epoch = ready_epoch  # eager: the target epoch at which it owned nothing
        self.away = away  # a static member that left for a restart
        self.last_seen = last_seen  # monotonic; not stored
        self.revoking_since = revoking_since  # not stored

    def __repr__(self) -> str:
        return (f"Member({self.member_id!r}, epoch={self.member_epoch}, "
                f"assigned={sorted(self._assigned)}, owned={sorted(self._owned)})")

    @property
    def owned(self) -> frozenset[TopicPartition]:
        return self._owned

    @owned.setter
    def owned(self, value: Iterable[TopicPartition]) -> None:
        new = value if isinstance(value, frozenset) else frozenset(value)
        if self._index is not None and new != self._owned:
            self._index.shift(self._owned | self._assigned, new | self._assigned)
        self._owned = new

    @property
    def assigned(self) -> frozenset[TopicPartition]:
        return self._assigned

    @assigned.setter
    def assigned(self, value: Iterable[TopicPartition]) -> None:
        new = value if isinstance(value, frozenset) else frozenset(value)
        if self._index is not None and new != self._assigned:
            self._index.shift(self._owned | self._assigned, self._owned | new)
        self._assigned = new

    @property
    def subscribed(self) -> list[str]:
        return self._subscribed

    @subscribed.setter
    def subscribed(self, value: list[str]) -> None:
        if self._index is not None and value != self._subscribed:
            self._index.version += 1
        self._subscribed = value

    def holds(self) -> frozenset[TopicPartition]:
        """What it owns or may own: what the ``_Holders`` index counts for it."""
        return self._owned | self._assigned

    def stored(self, target: Iterable[TopicPartition]) -> dict[str, Any]:
        return {"member_id": self.member_id, "instance_id": self.instance_id,
                "client_id": self.client_id, "subscribed": self.subscribed,
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "member_epoch": self.member_epoch, "assigned": sorted(self._assigned),
                "owned": sorted(self._owned), "ready_epoch": self.ready_epoch,
                "away": self.away, "target": sorted(target)}

    @classmethod
    def from_stored(cls, data: dict[str, Any], now: float) -> Member:
        return cls(data["member_id"], data["instance_id"], data["client_id"],
                   list(data["subscribed"]), data["session_timeout_ms"],
                   data["rebalance_timeout_ms"], data["member_epoch"],
                   _tps(data["assigned"]), _tps(data["owned"]), data["ready_epoch"],
                   data["away"], last_seen=now)

    def copy(self) -> Member:
        """A detached copy (not counted in any index)."""
        return Member(self.member_id, self.instance_id, self.client_id, list(self.subscribed),
                      self.session_timeout_ms, self.rebalance_timeout_ms, self.member_epoch,
                      self._assigned, self._owned, self.ready_epoch, self.away,
                      self.last_seen, self.revoking_since)

    def restore_from(self, other: Member) -> None:
        for name in ("subscribed", "member_epoch", "assigned", "owned", "ready_epoch", "away",
                     "revoking_since"):
            setattr(self, name, getattr(other, name))


class _Members(dict[str, Member]):
    """A group's members by id. Adding or removing one counts its partitions in (or out
    of) the group's ``_Holders`` and, while an operation runs, notes the change in the
    group's journal (``_Change``) so it can be written and undone."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self._group = group

    def __setitem__(self, member_id: str, member: Member) -> None:
        before = self.get(member_id)
        if before is member:
            return
        self._group._note_member(member_id, before)
        if before is not None:
            self._detach(before)
        super().__setitem__(member_id, member)
        index = self._group.holders
        if member._index is not None and member._index is not index:
            raise ValueError(f"member {member_id} already belongs to another group")
        member._index = index
        index.shift(_NONE, member.holds())
        index.version += 1

    def __delitem__(self, member_id: str) -> None:
        member = self[member_id]
        self._group._note_member(member_id, member)
        super().__delitem__(member_id)
        self._detach(member)

    def pop(self, member_id: str, *default: Any) -> Any:
        if member_id not in self:
            if default:
                return default[0]
            raise KeyError(member_id)
        member = self[member_id]
        del self[member_id]
        return member

    def _detach(self, member: Member) -> None:
        index = self._group.holders
        index.shift(member.holds(), _NONE)
        index.version += 1
        member._index = None

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("change a group's members one at a time (the index follows them)")

    clear = update = setdefault = popitem = __ior__ = _unsupported


@dataclass(eq=False, slots=True)
class Group:
    group_id: str
    assignor: str = COOPERATIVE_STICKY
    group_epoch: int = 0
    target_epoch: int = 0
    members: _Members = field(init=False)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    holders: _Holders = field(init=False, default_factory=_Holders, repr=False)
    # The operation running now (see _Change); None outside one (loading, tests).
    change: _Change | None = field(init=False, default=None, repr=False)
    # Operations waiting for their turn, and the task that runs them (GroupCoordinator._run).
    pending: list[_Op] = field(init=False, default_factory=list, repr=False)
    runner: asyncio.Task[None] | None = field(init=False, default=None, repr=False)
    # Member ids a static member's new incarnation replaced -> its instance id (the
    # newest _REPLACED_KEPT, in memory only): their heartbeats and commits get
    # FENCED_INSTANCE_ID instead of UNKNOWN_MEMBER_ID, which names the cause.
    replaced: dict[str, str] = field(init=False, default_factory=dict, repr=False)
    # Bumped by every undo and by a member coming back from away: the eager barrier's
    # cache assumes members only move towards the barrier, and starts again.
    resets: int = field(init=False, default=0, repr=False)
    # Target recomputations the running round may still make (None: no limit, outside a
    # round); see GroupCoordinator._round.
    assign_budget: int | None = field(init=False, default=None, repr=False)
    _topics: tuple[int, list[str]] = field(
        init=False, default_factory=lambda: (-1, []), repr=False)
    _barrier: tuple[tuple[int, int, int], list[str]] = field(
        init=False, default_factory=lambda: ((-1, -1, -1), []), repr=False)

    def __post_init__(self) -> None:
        self.members = _Members(self)

    @property
    def eager(self) -> bool:
        return self.assignor in EAGER_ASSIGNORS

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.eager and any(m.member_epoch < self.target_epoch and not m.away
                              for m in self.members.values()):
            return "Assigning"
        if any(m.assigned != self.target.get(m.member_id, _NONE) or m.owned != m.assigned
               for m in self.members.values() if not m.away):
            return "Reconciling"
        return "Stable"

    def ordered_members(self) -> list[str]:
        return sorted(self.members, key=lambda m: (self.members[m].instance_id or "\uffff", m))

    def stored(self) -> dict[str, Any]:
        return {"assignor": self.assignor, "group_epoch": self.group_epoch,
                "target_epoch": self.target_epoch, "partition_counts": self.partition_counts}

    def subscribed_topics(self) -> list[str]:
        """Every topic some member subscribes to, sorted (recomputed only after a change
        of membership or subscription, not on every heartbeat)."""
        version, topics = self._topics
        if version != self.holders.version:
            topics = sorted({t for m in self.members.values() for t in m.subscribed})
            self._topics = (self.holders.version, topics)
        return topics

    def set_target(self, member_id: str, tps: Iterable[TopicPartition]) -> None:
        new = tps if isinstance(tps, frozenset) else frozenset(tps)
        before = self.target.get(member_id)
        if before == new:
            return
        if self.change is not None:
            self.change.note_target(member_id, before)
        self.target[member_id] = new

    def drop_target(self, member_id: str) -> None:
        if member_id in self.target:
            if self.change is not None:
                self.change.note_target(member_id, self.target[member_id])
            del self.target[member_id]

    def _note_member(self, member_id: str, before: Member | None) -> None:
        if self.change is not None:
            self.change.note_member(member_id, before)

    def barrier_passed(self) -> bool:
        """Eager: whether every member gave everything up for the current target (or is
        past it, or away). Resumes where the previous check stopped, so the members that
        reach the barrier one after the other cost O(members) in all, not each."""
        epoch = self.target_epoch
        key = (epoch, self.holders.version, self.resets)
        if self._barrier[0] != key:
            self._barrier = (key, list(self.members))
        waiting = self._barrier[1]
        while waiting:
            m = self.members.get(waiting[-1])
            if m is not None and not (m.away or m.ready_epoch >= epoch
                                      or m.member_epoch >= epoch):
                return False
            waiting.pop()
        return True


class _Change:
    """What one operation changed in a group, noted as it happens (the first value of
    each member slot and target it touched, copies of members it changed in place, the
    group's scalars): enough to write the records of exactly what changed and to undo it.
    Cost: O(what the operation touched), whatever the group's size."""

    __slots__ = ("copies", "group", "members", "scalars", "targets")

    def __init__(self, group: Group) -> None:
        self.group = group
        self.scalars = {**group.stored(), "partition_counts": dict(group.partition_counts)}
        self.members: dict[str, Member | None] = {}
        self.targets: dict[str, frozenset[TopicPartition] | None] = {}
        self.copies: dict[str, tuple[Member, Member]] = {}  # id -> (the object, its copy)

    def touch(self, member: Member) -> None:
        """Call before changing ``member``'s fields in place."""
        if member.member_id not in self.copies:
            self.copies[member.member_id] = (member, member.copy())

    def note_member(self, member_id: str, before: Member | None) -> None:
        self.members.setdefault(member_id, before)

    def note_target(self, member_id: str, before: frozenset[TopicPartition] | None) -> None:
        if member_id not in self.targets:
            self.targets[member_id] = before

    def records(self) -> list[tuple[bytes, bytes | None]]:
        group = self.group
        g = group.group_id
        out: list[tuple[bytes, bytes | None]] = []
        if group.stored() != self.scalars:
            out.append((_key(group=g, type="group"), _value(group.stored())))
        changed = set(self.members) | set(self.targets)
        for member_id, (member, copy) in self.copies.items():
            if member_id not in changed and group.members.get(member_id) is member and \
                    member.stored(()) != copy.stored(()):
                changed.add(member_id)
        removed: list[tuple[bytes, bytes | None]] = []
        for member_id in sorted(changed):
            m = group.members.get(member_id)
            if m is None:
                if self.members.get(member_id, m) is not None or member_id in self.copies:
                    removed.append((_key(group=g, member=member_id, type="member"), None))
                continue
            out.append((_key(group=g, member=member_id, type="member"),
                        _value(m.stored(group.target.get(member_id, _NONE)))))
        # Removals last: a replay forgets a group (scalars and all) when a removal leaves
        # it without members, so a static member replacing the only one must be in first.
        return out + removed

    def undo(self) -> None:
        group = self.group
        group.change = None  # undoing is not itself noted
        for member, copy in self.copies.values():
            member.restore_from(copy)
        for member_id, before in self.members.items():
            if before is None:
                group.members.pop(member_id, None)
            else:
                group.members[member_id] = before
        for member_id, target in self.targets.items():
            if target is None:
                group.target.pop(member_id, None)
            else:
                group.target[member_id] = target
        group.assignor = self.scalars["assignor"]
        group.group_epoch = self.scalars["group_epoch"]
        group.target_epoch = self.scalars["target_epoch"]
        group.partition_counts = self.scalars["partition_counts"]
        group.resets += 1


@dataclass(eq=False, slots=True)
class _Op:
    """One request's work on a group: ``run(group, change)`` changes the group in memory
    (synchronously, noting what it changed in ``change``) and returns its answer, the
    extra records to write (offsets) and what to do once they are stored."""

    run: _Work
    future: asyncio.Future[Any] | None  # None: the round's own closing step


# A request's work on a group (see _Op): (group, change) -> (answer, extra records, then).
_Work = Callable[[Group, _Change], tuple[Any, list[tuple[bytes, bytes | None]],
                                         Callable[[], None] | None]]


def _check_replaced(group: Group, member_id: str) -> None:
    """FENCED_INSTANCE_ID for a member id a static member's new incarnation replaced."""
    instance = group.replaced.get(member_id)
    if instance is not None:
        raise FencedInstanceIdError(
            f"member {member_id} of group {group.group_id!r} was replaced by a newer "
            f"consumer with group_instance_id {instance!r}: two processes use that "
            "instance id, or this one is the old incarnation of a restarted process; "
            "close this consumer (give each process its own instance id)")


def _group(shard: _Shard, group_id: str) -> Group:
    """The group, created in memory if new (a new one is dropped again by its round if
    nothing was stored for it)."""
    group = shard.groups.get(group_id)
    if group is None:
        group = shard.groups[group_id] = Group(group_id)
    return group


@dataclass(slots=True)
class _Shard:
    """The groups of one ``__consumer_offsets`` partition, as loaded at ``leader_epoch``.

    ``pending``: offsets committed inside open transactions (TxnOffsetCommit), per
    producer id and group, not visible until the transaction's marker reaches this
    partition (COMMIT: they become committed offsets; ABORT: dropped)."""

    partition: int
    leader_epoch: int
    groups: dict[str, Group] = field(default_factory=dict)
    pending: dict[int, dict[str, dict[TopicPartition, CommittedOffset]]] = field(
        default_factory=dict)

    def complete(self, producer_id: int, committed: bool) -> None:
        for group_id, offsets in self.pending.pop(producer_id, {}).items():
            if committed:
                _group(self, group_id).offsets.update(offsets)

    def unstable(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with offsets pending in an open transaction."""
        return {tp for groups in self.pending.values() for tp in groups.get(group_id, {})}


class _LagCollector(Collector):
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    def collect(self) -> Iterator[Any]:
        lag = GaugeMetricFamily(
            "strata_group_lag_records",
            "records between a group's committed offset and the partition's high watermark "
            "(groups this broker coordinates; refreshed every group.lag.interval.ms)",
            labels=["group", "topic", "partition"])
        for (group, topic, p), behind in sorted(self._coordinator.lag.items()):
            lag.add_metric([group, topic, str(p)], behind)
        yield lag


class GroupCoordinator:
    """Coordinates the groups whose ``__consumer_offsets`` partitions this broker leads."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, zookeeper: ZooKeeperClient, host: InternalTopicHost,
                 metrics_registry: CollectorRegistry) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.zookeeper = zookeeper
        self.host = host
        self._shards: dict[int, _Shard] = {}
        self._loading: dict[int, asyncio.Lock] = {}
        self._load_failures: dict[int, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self.lag: dict[tuple[str, str, int], int] = {}
        self._runners: set[asyncio.Task[None]] = set()  # see _run
        self._topic = KeyedTopic(OFFSETS_TOPIC, "group", cluster, coordinator_partition,
                                 self._create_offsets_topic)
        metrics_registry.register(_LagCollector(self))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._expire_loop())
        self._lag_task = asyncio.create_task(self._lag_loop())

    async def stop(self) -> None:
        for task in (self._task, self._lag_task, *self._runners):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ------------------------------------------------------------------ FindCoordinator
    async def find(self, group_id: str, listener: str = "") -> tuple[int, str, int]:
        """(node id, host, port on ``listener``) of the group's coordinator."""
        self._check_group_id(group_id)
        return await self._topic.find(group_id, listener)

    async def _create_offsets_topic(self) -> None:
        # 100 MiB segments (Kafka's choice for this topic): compaction only ever cleans
        # closed segments, and 1 GiB ones would rarely close.
        await create_internal_topic(
            OFFSETS_TOPIC, self.config.offsets_topic_num_partitions, config=self.config,
            cluster=self.cluster, zookeeper=self.zookeeper, host=self.host,
            topic_config={"segment.bytes": str(OFFSETS_SEGMENT_BYTES)})

    # ------------------------------------------------------------------ shards
    def _check_group_id(self, group_id: str) -> None:
        if not group_id or len(group_id) > MAX_GROUP_ID_LENGTH:
            raise InvalidGroupIdError(
                f"group id {group_id!r} is not valid: use 1..{MAX_GROUP_ID_LENGTH} characters")

    def _leader_partition(self, p: int) -> Partition:
        partition = self.registry.hosted.get((OFFSETS_TOPIC, p))
        if partition is None or not partition.is_leader or partition.fenced:
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not lead {OFFSETS_TOPIC}-{p}; find the "
                "group's coordinator again (FindCoordinator)")
        return partition

    async def _shard(self, group_id: str) -> _Shard:
        self._check_group_id(group_id)
        topic = self.cluster.topics.get(OFFSETS_TOPIC)
        if topic is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC} does not exist yet; send FindCoordinator first")
        return await self._load(coordinator_partition(group_id, topic.partition_count))

    async def _load(self, p: int) -> _Shard:
        partition = self._leader_partition(p)
        shard = self._shards.get(p)
        if shard is not None and shard.leader_epoch == partition.leader_epoch:
            return shard
        lock = self._loading.setdefault(p, asyncio.Lock())
        async with lock:
            partition = self._leader_partition(p)
            shard = self._shards.get(p)
            if shard is not None and shard.leader_epoch == partition.leader_epoch:
                return shard
            started = time.monotonic()
            shard = _Shard(p, partition.leader_epoch)
            records = 0
            offset = partition.log.log_start_offset
            end = partition.log.log_end_offset
            parsed: list[_Event] = []
            while offset < end:
                chunk = partition.log.read(offset, _LOAD_READ_BYTES)
                if chunk is None or chunk.next_offset <= offset:
                    break
                data = await asyncio.to_thread(chunk.read_bytes)
                parsed += await asyncio.to_thread(self._decode_chunk, data, p, offset)
                offset = chunk.next_offset
            # Sessions start now, after the load: a long load must not expire everyone.
            now = time.monotonic()
            for key, value, producer_id, marker in parsed:
                if marker is not None:  # a transaction's end: its offsets apply or go
                    shard.complete(producer_id, marker)
                    continue
                assert key is not None
                if producer_id is not None:
                    self._replay_pending(shard, key, value, producer_id)
                else:
                    self._replay(shard, key, value, now)
                records += 1
            self._shards[p] = shard
            log.info("loaded %s-%d at leader epoch %d: %d groups from %d records in %.3f s",
                     OFFSETS_TOPIC, p, shard.leader_epoch, len(shard.groups), records,
                     time.monotonic() - started)
            return shard

    @staticmethod
    def _decode_chunk(data: bytes, p: int, offset: int) -> list[_Event]:
        """Records of one read, parsed (runs in a worker thread: JSON for a large
        partition must not stall the event loop), with the producer id of a
        transaction's offsets and its markers (``(None, None, pid, committed)``)."""
        parsed: list[_Event] = []
        for header, view in iter_batches(data):
            if header.next_offset <= offset:
                continue
            if header.is_control:
                with contextlib.suppress(InvalidRecordBatchError):
                    control, _ = parse_control(view)
                    parsed.append((None, None, header.producer_id,
                                   control is ControlType.COMMIT))
                continue
            table = batches_to_table(view, topic=OFFSETS_TOPIC, partition=p,
                                     start_offset=offset)
            producer = header.producer_id if header.is_transactional else None
            for key, value in zip(table.column("key").to_pylist(),
                                  table.column("value").to_pylist(), strict=True):
                if key is None:
                    continue
                try:
                    parsed.append((json.loads(key), None if value is None
                                   else json.loads(value), producer, None))
                except ValueError as err:
                    log.error("%s-%d: skipping an unreadable record %r: %r", OFFSETS_TOPIC,
                              p, key[:200], err)
        return parsed

    @staticmethod
    def _replay_pending(shard: _Shard, k: dict[str, Any], v: dict[str, Any] | None,
                        producer_id: int) -> None:
        """A transaction's offset record: pending until its marker."""
        if k.get("type") != "offset" or v is None:
            return
        with contextlib.suppress(KeyError, TypeError, ValueError):
            shard.pending.setdefault(producer_id, {}).setdefault(k["group"], {})[
                (k["topic"], int(k["partition"]))] = CommittedOffset(
                v["offset"], v["metadata"], v["timestamp"], v.get("topic_id"))

    @staticmethod
    def _replay(shard: _Shard, k: dict[str, Any], v: dict[str, Any] | None, now: float
                ) -> None:
        try:
            group = shard.groups.get(k["group"])
            if group is None:
                if v is None:
                    return
                group = shard.groups[k["group"]] = Group(k["group"])
            kind = k["type"]
            if kind == "offset":
                tp = (k["topic"], int(k["partition"]))
                if v is None:
                    group.offsets.pop(tp, None)
                else:
                    group.offsets[tp] = CommittedOffset(v["offset"], v["metadata"],
                                                        v["timestamp"], v.get("topic_id"))
            elif kind == "member":
                if v is None:
                    group.members.pop(k["member"], None)
                    group.target.pop(k["member"], None)
                else:
                    group.members[k["member"]] = Member.from_stored(v, now)
                    group.target[k["member"]] = frozenset(_tps(v["target"]))
            elif kind == "group" and v is not None:
                group.assignor = v["assignor"]
                group.group_epoch = v["group_epoch"]
                group.target_epoch = v["target_epoch"]
                group.partition_counts = dict(v["partition_counts"])
            if v is None and not group.members and not group.offsets:
                del shard.groups[group.group_id]
        except (KeyError, TypeError, ValueError) as err:
            log.error("%s-%d: skipping an unreadable record %r: %r", OFFSETS_TOPIC,
                      shard.partition, k, err)

    async def _write(self, shard: _Shard, records: list[tuple[bytes, bytes | None]]) -> None:
        """Append ``records`` to the shard's partition and wait until every in-sync
        replica has them (acks=all)."""
        partition = self._leader_partition(shard.partition)
        if partition.leader_epoch != shard.leader_epoch or \
                self._shards.get(shard.partition) is not shard:
            raise NotCoordinatorError(
                f"{OFFSETS_TOPIC}-{shard.partition} changed leader epoch; find the "
                "coordinator again")
        batch = build_batch([v for _, v in records], keys=[k for k, _ in records])
        await append_replicated(partition, batch, what="the group state",
                                timeout_s=_WRITE_TIMEOUT_S)

    # ------------------------------------------------------------------ operations
    async def _run(self, shard: _Shard, group: Group, run: _Work) -> Any:
        """Run ``run`` on ``group`` after every operation queued before it, and return its
        answer once what it changed is stored (acks=all).

        The operations that queue up while a write is being replicated run together in
        the next round: each changes the group in memory in turn, the records of all of
        them go out as one batch, and every one is answered when that batch is
        replicated (a failure undoes the whole round, newest first, and answers each
        with the error). So a group with many members pays one replicated write per
        round instead of one per request, and no answer, not even an error, is sent
        before the state it was computed from is stored."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        group.pending.append(_Op(run, future))
        if group.runner is None:
            group.runner = asyncio.create_task(self._run_rounds(shard, group),
                                               name=f"group-{group.group_id}")
            self._runners.add(group.runner)
            group.runner.add_done_callback(self._runners.discard)
        return await future

    async def _run_rounds(self, shard: _Shard, group: Group) -> None:
        try:
            while group.pending:
                ops, group.pending = group.pending, []
                await self._round(shard, group, ops)
        finally:
            group.runner = None
            for op in group.pending:  # only when cancelled (the broker stops)
                _settle(op.future, error=NotCoordinatorError(
                    f"the coordinator of group {group.group_id!r} is stopping; find it "
                    "again and retry"))
            group.pending = []
            if not group.members and not group.offsets and group.group_epoch == 0 and \
                    shard.groups.get(group.group_id) is group:
                # Nothing was ever stored for it (a join or commit that failed).
                del shard.groups[group.group_id]

    async def _round(self, shard: _Shard, group: Group, ops: list[_Op]) -> None:
        """Run ``ops`` in turn, store what they changed in one write, answer them.

        A join storm puts hundreds of joins into one round: the target is recomputed
        once, after the last op (an op alone in its round recomputes it itself, so a
        lone join is answered with its partitions). The ops of a larger round reconcile
        against the previous target, which is safe (a partition is still handed out only
        once no other member holds it) and keeps the first joiner of a storm from taking
        every partition only to give them back; their members come back soon. The event
        loop gets a turn every ``_ROUND_SLICE_S`` of work, so replication and other
        groups do not wait for a long round."""
        done: list[tuple[_Op, _Change, Any, Callable[[], None] | None]] = []
        refused: list[tuple[_Op, BaseException]] = []
        records: dict[bytes, bytes | None] = {}  # a later value of a key replaces it
        group.assign_budget = 1 if len(ops) == 1 else 0
        started = sliced = time.monotonic()
        ops = [*ops, _Op(self._retarget, None)]
        for op in ops:
            if op.future is not None and op.future.done():
                continue  # its caller gave up before its turn
            if op.future is None:
                group.assign_budget = None  # the closing recomputation
            elif time.monotonic() - sliced > _ROUND_SLICE_S:
                await asyncio.sleep(0)
                sliced = time.monotonic()
            change = group.change = _Change(group)
            try:
                if shard.groups.get(group.group_id) is not group:
                    raise NotCoordinatorError(
                        f"group {group.group_id!r} was deleted or reloaded while this "
                        "request waited; find the coordinator again and retry")
                answer, extra, after = op.run(group, change)
            except Exception as err:
                change.undo()
                refused.append((op, err))
                continue
            finally:
                group.change = None
            for key, value in (*change.records(), *extra):
                records[key] = value
            done.append((op, change, answer, after))
        group.assign_budget = None
        ran = time.monotonic()
        failure: BaseException | None = None
        if records:
            try:
                await self._write(shard, list(records.items()))
            except BaseException as err:
                for _, change, _, _ in reversed(done):
                    change.undo()
                failure = err
        if (spent := time.monotonic() - started) > _SLOW_ROUND_S:
            log.info("group %s: %d requests took %.3f s (%.3f s in memory), %d records "
                     "written%s", group.group_id, len(ops) - 1, spent, ran - started,
                     len(records), f", failed: {failure!r}" if failure else "")
        else:
            log.debug("group %s: %d requests, %.3f s, %d records", group.group_id,
                      len(ops) - 1, spent, len(records))
        if isinstance(failure, asyncio.CancelledError):
            for op, *_ in done:
                _settle(op.future, error=NotCoordinatorError(
                    f"the coordinator of group {group.group_id!r} is stopping; find it "
                    "again and retry"))
            raise failure
        for op, _, answer, after in done:
            if failure is not None:
                _settle(op.future, error=failure)
                continue
            if after is not None:
                after()
            _settle(op.future, result=answer)
        for op, why in refused:
            # Refused on a state this round may have undone: the write's error instead,
            # and the retry meets the state that is stored.
            _settle(op.future, error=failure or why)

    def _retarget(self, group: Group, change: _Change) -> tuple[None, list[Any], None]:
        """The round's closing step: the target the ops of the round left pending."""
        self._refresh_target(group)
        return None, [], None

    # ------------------------------------------------------------------ heartbeat
    async def heartbeat(self, request: ConsumerGroupHeartbeatRequest, client_id: str
                        ) -> ConsumerGroupHeartbeatResponse:
        arrived = time.monotonic()  # a wait for the group's turn must not age the session
        try:
            shard = await self._shard(request.group_id)
            current = shard.groups.get(request.group_id)
            known = current.members.get(request.member_id or "") if current else None
            if known is not None:
                known.last_seen = max(known.last_seen, arrived)
            group = _group(shard, request.group_id)
            answer: ConsumerGroupHeartbeatResponse = await self._run(
                shard, group, lambda g, change: (
                    self._heartbeat(g, change, request, client_id, arrived), [], None))
            return answer
        except StrataError as err:
            return ConsumerGroupHeartbeatResponse(err.code, err.message)

    def _heartbeat(self, group: Group, change: _Change,
                   request: ConsumerGroupHeartbeatRequest, client_id: str,
                   arrived: float) -> ConsumerGroupHeartbeatResponse:
        if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, change, request)
        existing = group.members.get(request.member_id or "")
        if existing is not None:
            change.touch(existing)
        reported = _from_wire(request.owned)
        if request.member_epoch == JOIN_EPOCH and existing is None:
            member = self._join(group, request, client_id, arrived)
        else:
            if request.member_id is None or request.member_epoch < 0:
                raise InvalidRequestError(
                    f"member epoch {request.member_epoch} needs a member id (0 to join, -1 "
                    "to leave, -2 for a static member's temporary leave)")
            if existing is None:
                _check_replaced(group, request.member_id)
                raise UnknownMemberIdError(
                    f"member {request.member_id} is not in group {group.group_id!r} (its "
                    "session expired, it left, or a static member replaced it); its "
                    "partitions are gone: rejoin with member epoch 0")
            member = existing
            if request.member_epoch > member.member_epoch:
                raise FencedMemberEpochError(
                    f"member {member.member_id} sent epoch {request.member_epoch}, the "
                    f"coordinator gave it {member.member_epoch}; rejoin with epoch 0")
            topics = sorted(set(request.subscribed_topics))
            if topics and topics != member.subscribed:
                member.subscribed = topics
                group.group_epoch += 1
            # What it says it owns counts only where the coordinator gave it: a member
            # cannot claim (and then commit) a partition that moved away.
            member.owned = reported & member.holds()
        if member.away:
            group.resets += 1  # it no longer counts as past the eager barrier
        member.away = False
        member.last_seen = max(member.last_seen, arrived)
        self._refresh_target(group)
        self._reconcile(group, member, time.monotonic())
        target = group.target.get(member.member_id, _NONE)
        busy = member.assigned != target or member.owned != member.assigned or \
            group.group_epoch > group.target_epoch  # its target comes at the round's end
        return ConsumerGroupHeartbeatResponse(
            0, None, member.member_id, member.member_epoch,
            self._busy_interval_ms(group) if busy else self.config.group_heartbeat_interval_ms,
            group_topic_partitions(member.assigned))

    def _busy_interval_ms(self, group: Group) -> int:
        """How soon a member whose partitions are moving should come back: 100 ms, but
        no sooner than lets the group's members together send about
        ``_BUSY_HEARTBEATS_PER_S`` (a thousand members all moving at once would
        otherwise send ten thousand heartbeats a second, and the coordinator would
        spend its time answering them instead of moving partitions)."""
        spread = -(-len(group.members) * 1000 // _BUSY_HEARTBEATS_PER_S)
        return min(max(_BUSY_HEARTBEAT_MS, spread), self.config.group_heartbeat_interval_ms)

    def _join(self, group: Group, request: ConsumerGroupHeartbeatRequest, client_id: str,
              arrived: float) -> Member:
        topics = sorted(set(request.subscribed_topics))
        if not topics:
            raise InvalidRequestError("a member must subscribe to at least one topic")
        assignor = request.assignor or (group.assignor if group.members else COOPERATIVE_STICKY)
        if assignor not in ASSIGNORS:
            raise UnsupportedAssignorError(
                f"assignor {assignor!r} is not supported; use one of {list(ASSIGNORS)}")
        if group.members and assignor != group.assignor:
            raise UnsupportedAssignorError(
                f"group {group.group_id!r} uses the {group.assignor!r} assignor; its members "
                f"must all use it (this one asked for {assignor!r})")
        session = request.session_timeout_ms
        if session == -1:
            session = self.config.group_session_timeout_ms
        low, high = self.config.group_min_session_timeout_ms, \
            self.config.group_max_session_timeout_ms
        if not low <= session <= high:
            raise InvalidSessionTimeoutError(
                f"session timeout {session} ms is outside the broker's range {low}..{high} ms "
                "(group.min/max.session.timeout.ms)")
        if request.rebalance_timeout_ms <= 0:
            raise InvalidRequestError("rebalance_timeout_ms must be positive")
        member_id = request.member_id or uuid.uuid4().hex
        member = Member(member_id, request.instance_id, client_id, topics, session,
                        request.rebalance_timeout_ms, last_seen=arrived)
        twin = self._twin(group, request.instance_id)
        if twin is not None:
            silent = arrived - twin.last_seen
            if not twin.away and silent < 2 * self.config.group_heartbeat_interval_ms / 1000:
                raise UnreleasedInstanceIdError(
                    f"group.instance.id {request.instance_id!r} is in use by member "
                    f"{twin.member_id}, which heartbeat {silent * 1000:.0f} ms ago: another "
                    "process runs with the same instance id. Stop it or give each process its "
                    "own id; a restarted process is let in once the old one is silent")
            # A static member back from a restart (or whose old process died): it takes
            # its twin's place and, if they are current, its partitions; the twin's id is
            # fenced. No rebalance unless the topics changed.
            del group.members[twin.member_id]
            group.replaced[twin.member_id] = twin.instance_id or ""
            while len(group.replaced) > _REPLACED_KEPT:
                del group.replaced[next(iter(group.replaced))]
            current = twin.member_epoch >= group.target_epoch
            member.member_epoch = twin.member_epoch if current else 0
            member.assigned = twin.assigned if current or not group.eager else _NONE
            member.ready_epoch = twin.ready_epoch
            group.set_target(member_id, group.target.get(twin.member_id, _NONE))
            group.drop_target(twin.member_id)
            if twin.subscribed != topics:
                group.group_epoch += 1
            log.info("group %s: static member %s rejoined as %s (replacing %s)",
                     group.group_id, request.instance_id, member_id, twin.member_id)
        else:
            if len(group.members) >= self.config.group_max_size:
                raise GroupMaxSizeReachedError(
                    f"group {group.group_id!r} already has {len(group.members)} members "
                    "(group.max.size): run fewer consumers or raise group.max.size")
            if not group.members:
                group.assignor = assignor
            group.group_epoch += 1
            log.info("group %s: member %s joined (epoch %d)", group.group_id, member_id,
                     group.group_epoch)
        group.members[member_id] = member
        return member

    @staticmethod
    def _twin(group: Group, instance_id: str | None) -> Member | None:
        if instance_id is None:
            return None  # only static members have twins: no scan of the group
        return next((m for m in group.members.values() if m.instance_id == instance_id),
                    None)

    def _leave(self, group: Group, change: _Change, request: ConsumerGroupHeartbeatRequest
               ) -> ConsumerGroupHeartbeatResponse:
        member = group.members.get(request.member_id or "")
        if member is None:  # already gone: leaving is idempotent
            return ConsumerGroupHeartbeatResponse(0, None, request.member_id,
                                                  request.member_epoch, 0, [])
        if request.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # It stopped consuming (the client revoked everything before leaving); its
            # assignment stays reserved for it until its session times out.
            change.touch(member)
            member.away = True
            member.owned = _NONE
            member.revoking_since = None
            if group.eager and member.member_epoch < group.target_epoch:
                member.assigned = _NONE  # what it kept is others' once the barrier passes
            log.info("group %s: static member %s left for a restart; its partitions wait "
                     "%d ms for it", group.group_id, member.instance_id,
                     member.session_timeout_ms)
        else:
            self._remove(group, member, "left")
            self._refresh_target(group)
        return ConsumerGroupHeartbeatResponse(0, None, member.member_id, request.member_epoch,
                                              0, [])

    @staticmethod
    def _remove(group: Group, member: Member, why: str) -> None:
        del group.members[member.member_id]
        group.drop_target(member.member_id)
        group.group_epoch += 1
        log.info("group %s: member %s %s (epoch %d)", group.group_id, member.member_id, why,
                 group.group_epoch)

    def _refresh_target(self, group: Group) -> None:
        """Recompute the target if the group epoch moved (membership, a subscription, or
        a subscribed topic's partition count changed). Otherwise, as on nearly every
        heartbeat, this only compares the partition counts of the subscribed topics."""
        counts = {t: self.cluster.topics[t].partition_count
                  for t in group.subscribed_topics() if t in self.cluster.topics}
        if counts != group.partition_counts:
            group.partition_counts = counts
            if group.group_epoch <= group.target_epoch:
                group.group_epoch += 1
        if group.group_epoch <= group.target_epoch or group.assign_budget == 0:
            return
        if group.assign_budget is not None:
            group.assign_budget -= 1
        order = group.ordered_members()
        target = assign(group.assignor, order,
                        {m: group.members[m].subscribed for m in order}, counts,
                        group.target)
        for member_id in [m for m in group.target if m not in target]:
            group.drop_target(member_id)
        for member_id, tps in target.items():
            group.set_target(member_id, tps)  # notes (and so stores) only real changes
        group.target_epoch = group.group_epoch
        if group.eager:
            # The barrier lets away static members through (they revoked before leaving),
            # so what they were assigned goes to others now: they hold nothing any more
            # (back from their restart they start from nothing, being behind the target).
            for member in group.members.values():
                if member.away and member.assigned:
                    if group.change is not None:
                        group.change.touch(member)
                    member.assigned = _NONE

    def _reconcile(self, group: Group, member: Member, now: float) -> None:
        """Move ``member`` one step towards its target (see the module docstring). Costs
        O(the member's own partitions): the holders index answers whether another member
        holds a partition, and the eager barrier resumes where it stopped."""
        target = group.target.get(member.member_id, _NONE)
        if group.eager:
            if member.member_epoch >= group.target_epoch:
                member.assigned = target
                return
            member.assigned = _NONE
            if member.owned:
                if member.revoking_since is None:
                    member.revoking_since = now
                return
            member.revoking_since = None
            member.ready_epoch = group.target_epoch
            # Away static members own nothing (they revoked before leaving).
            if group.barrier_passed():
                member.assigned = target
                member.member_epoch = group.target_epoch
            return
        revoke = member.owned - target
        if revoke:
            member.assigned = member.owned & target
            if member.revoking_since is None:
                member.revoking_since = now
            return
        member.revoking_since = None
        wanted = target - member.owned
        if wanted:
            mine = member.holds()
            holders = group.holders
            # Free: held by nobody but (perhaps, as already assigned) this member.
            member.assigned = member.owned | {
                tp for tp in wanted if holders.held(tp) == (1 if tp in mine else 0)}
        else:
            member.assigned = member.owned
        member.member_epoch = group.target_epoch

    # ------------------------------------------------------------------ expiry
    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(_EXPIRY_TICK_S)
            try:
                await self._expire_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop expiry for every group
                log.exception("group expiry pass failed")

    async def _expire_once(self) -> None:
        topic = self.cluster.topics.get(OFFSETS_TOPIC)
        if topic is None:
            return
        for p in range(topic.partition_count):
            partition = self.registry.hosted.get((OFFSETS_TOPIC, p))
            if partition is None or not partition.is_leader or partition.fenced:
                self._shards.pop(p, None)
                continue
            try:
                shard = await self._load(p)
            except StrataError as err:
                if self._load_failures.get(p) != str(err):  # once per distinct failure
                    log.warning("cannot load %s-%d yet: %s", OFFSETS_TOPIC, p, err)
                    self._load_failures[p] = str(err)
                continue
            self._load_failures.pop(p, None)
            for group in list(shard.groups.values()):
                if any(self._expired(m, time.monotonic()) for m in group.members.values()):
                    await self._expire_group(shard, group)

    @staticmethod
    def _expired(member: Member, now: float) -> str | None:
        if now - member.last_seen > member.session_timeout_ms / 1000:
            return f"timed out (no heartbeat within {member.session_timeout_ms} ms)"
        if member.revoking_since is not None and \
                now - member.revoking_since > member.rebalance_timeout_ms / 1000:
            return f"did not give up its partitions within {member.rebalance_timeout_ms} ms"
        return None

    async def _expire_group(self, shard: _Shard, group: Group) -> None:
        def expire(group: Group, change: _Change) -> tuple[None, list[Any], None]:
            now = time.monotonic()
            for member in list(group.members.values()):
                why = self._expired(member, now)
                if why is not None:
                    self._remove(group, member, why)
            self._refresh_target(group)
            return None, [], None

        if shard.groups.get(group.group_id) is not group:
            return
        try:
            await self._run(shard, group, expire)
        except StrataError as err:
            log.warning("group %s: storing a removal failed (%s); retrying on the next pass",
                        group.group_id, err)

    # ------------------------------------------------------------------ offsets
    async def commit(self, request: OffsetCommitRequest) -> OffsetCommitResponse:
        answers: dict[str, list[OffsetCommitPartitionResponse]] = {}
        try:
            shard = await self._shard(request.group_id)
            group = _group(shard, request.group_id)
            await self._run(shard, group, lambda g, change: self._commit(g, request, answers))
        except StrataError as err:
            # A group-level error, or the write failed: every partition that was not
            # already refused on its own gets it.
            refused = {(t, a.partition) for t, parts in answers.items() for a in parts
                       if a.error_code != 0}
            return OffsetCommitResponse([OffsetCommitTopicResponse(topic.name, [
                next(a for a in answers[topic.name] if a.partition == part.partition)
                if (topic.name, part.partition) in refused else
                OffsetCommitPartitionResponse(part.partition, err.code, err.message)
                for part in topic.partitions]) for topic in request.topics])
        return OffsetCommitResponse([OffsetCommitTopicResponse(name, parts)
                                     for name, parts in answers.items()])

    def _commit(self, group: Group, request: OffsetCommitRequest,
                answers: dict[str, list[OffsetCommitPartitionResponse]]
                ) -> tuple[None, list[tuple[bytes, bytes | None]], Callable[[], None] | None]:
        """Check a commit against the group as it is at its turn; its offset records go
        out with the round's write, and reach ``group.offsets`` only once stored."""
        member = self._check_committer(group, request)
        holds = member.holds() if member is not None else None
        accepted: list[tuple[str, int, int, str | None]] = []
        for topic in request.topics:
            out = answers.setdefault(topic.name, [])
            for part in topic.partitions:
                try:
                    self._check_commit(member, holds, topic.name, part.partition, part.offset,
                                       part.metadata)
                    accepted.append((topic.name, part.partition, part.offset, part.metadata))
                    out.append(OffsetCommitPartitionResponse(part.partition, 0))
                except StrataError as err:
                    out.append(OffsetCommitPartitionResponse(part.partition, err.code,
                                                             err.message))
        if not accepted:
            return None, [], None
        now_ms = int(time.time() * 1000)
        ids = {t: self.cluster.topics[t].topic_id for t, *_ in accepted}
        records: list[tuple[bytes, bytes | None]] = [
            (_key(group=group.group_id, partition=p, topic=t, type="offset"),
             _value({"offset": o, "metadata": m, "timestamp": now_ms, "topic_id": ids[t]}))
            for t, p, o, m in accepted]

        def stored() -> None:
            for t, p, o, m in accepted:
                group.offsets[(t, p)] = CommittedOffset(o, m, now_ms, ids[t])

        return None, records, stored

    @staticmethod
    def _check_committer(group: Group, request: OffsetCommitRequest) -> Member | None:
        if request.member_id is None:
            if request.member_epoch != NO_MEMBER_EPOCH:
                raise InvalidRequestError(
                    "a commit without a member id must carry member epoch -1")
            if group.members:
                raise NonEmptyGroupError(
                    f"group {group.group_id!r} has {len(group.members)} active member(s); "
                    "only its members may commit: stop its consumers first")
            return None
        member = group.members.get(request.member_id)
        if member is None:
            _check_replaced(group, request.member_id)
            raise UnknownMemberIdError(
                f"member {request.member_id} is not in group {group.group_id!r} (its session "
                "expired or it was replaced): the commit is refused; rejoin and re-process")
        if request.member_epoch > member.member_epoch:
            raise FencedMemberEpochError(
                f"member {member.member_id} committed with epoch {request.member_epoch}, the "
                f"coordinator gave it {member.member_epoch}; rejoin")
        return member

    def _check_commit(self, member: Member | None, holds: frozenset[TopicPartition] | None,
                      topic: str, p: int, offset: int, metadata: str | None) -> None:
        definition = self.cluster.topics.get(topic)
        if definition is None or p not in definition.assignment:
            raise UnknownTopicOrPartitionError(f"{topic}-{p} does not exist")
        if offset < 0:
            raise InvalidRequestError(f"{topic}-{p}: offset {offset} is negative")
        if metadata is not None and \
                len(metadata.encode("utf-8")) > self.config.offset_metadata_max_bytes:
            raise OffsetMetadataTooLargeError(
                f"{topic}-{p}: metadata is longer than offset.metadata.max.bytes "
                f"({self.config.offset_metadata_max_bytes})")
        if member is not None and holds is not None and (topic, p) not in holds:
            raise StaleMemberEpochError(
                f"{topic}-{p} is not assigned to member {member.member_id} now (it moved to "
                "another member): the commit is refused; heartbeat for the current assignment")

    async def fetch_offsets(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        try:
            shard = await self._shard(request.group_id)
        except StrataError as err:
            return OffsetFetchResponse(err.code, err.message)
        group = shard.groups.get(request.group_id)
        offsets = self._current_offsets(group) if group is not None else {}
        wanted = sorted(offsets) if request.topics is None else \
            sorted(_from_wire(request.topics))
        unstable = shard.unstable(request.group_id) if request.require_stable else set()
        by_topic = group_by_topic(
            (topic, OffsetFetchPartitionResponse(p, -1, error_code=_UNSTABLE)
             if (topic, p) in unstable else OffsetFetchPartitionResponse(p, -1)
             if found is None else
             OffsetFetchPartitionResponse(p, found.offset, found.metadata, found.timestamp))
            for topic, p in wanted for found in [offsets.get((topic, p))])
        return OffsetFetchResponse(0, None, [OffsetFetchTopicResponse(t, ps)
                                             for t, ps in by_topic.items()])

    # ------------------------------------------------------------------ transactions
    def is_offsets_topic(self, topic: str) -> bool:
        return topic == OFFSETS_TOPIC

    async def offsets_partition(self, group_id: str) -> tuple[str, int]:
        """The ``__consumer_offsets`` partition holding the group (AddOffsetsToTxn)."""
        self._check_group_id(group_id)
        topic = self.cluster.topics.get(OFFSETS_TOPIC)
        if topic is None:
            await self.find(group_id)  # creates the topic, answers "not yet"
            raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} is being created; retry")
        return OFFSETS_TOPIC, coordinator_partition(group_id, topic.partition_count)

    def complete_transaction(self, p: int, producer_id: int, committed: bool) -> None:
        """A marker of the producer's transaction reached ``__consumer_offsets-p``: its
        pending offsets become committed (COMMIT) or are dropped (ABORT)."""
        shard = self._shards.get(p)
        if shard is not None:
            shard.complete(producer_id, committed)

    async def txn_commit(self, request: TxnOffsetCommitRequest, *,
                         verify: Verify | None) -> TxnOffsetCommitResponse:
        """Offsets committed inside a transaction (KIP-447): checked like a member's
        commit, written as the producer's transactional batch (acks=all) and held
        pending until the transaction's marker (``complete_transaction``)."""
        answers: dict[str, list[TxnPartitionResult]] = {}

        def everything(err: StrataError) -> TxnOffsetCommitResponse:
            return TxnOffsetCommitResponse([TxnTopicResult(t.name, [
                TxnPartitionResult(p.partition, err.code, err.message)
                for p in t.partitions]) for t in request.topics])

        try:
            shard = await self._shard(request.group_id)
            group = _group(shard, request.group_id)
            accepted: list[tuple[str, int, int, str | None]] = await self._run(
                shard, group, lambda g, change: (self._txn_check(g, request, answers), [],
                                                 None))
            if not accepted:
                return TxnOffsetCommitResponse([TxnTopicResult(t, a)
                                                for t, a in answers.items()])
            if verify is not None:
                verdict = await verify(request.transactional_id, request.producer_id,
                                       request.producer_epoch,
                                       [(OFFSETS_TOPIC, shard.partition)])
                refused = verdict.get((OFFSETS_TOPIC, shard.partition))
                if refused is not None:
                    return everything(refused)
            now_ms = int(time.time() * 1000)
            ids = {t: self.cluster.topics[t].topic_id for t, *_ in accepted}
            offsets = {(t, p): CommittedOffset(o, m, now_ms, ids[t]) for t, p, o, m in accepted}
            batch = build_batch(
                [_value({"offset": o, "metadata": m, "timestamp": now_ms, "topic_id": ids[t]})
                 for t, p, o, m in accepted],
                keys=[_key(group=request.group_id, partition=p, topic=t, type="offset")
                      for t, p, o, m in accepted],
                producer_id=request.producer_id, producer_epoch=request.producer_epoch,
                transactional=True)
            partition = self._leader_partition(shard.partition)
            result = partition.append_as_leader(batch, verified=True, coordinator=True)
            await asyncio.wait_for(partition.wait_durable(result.last_offset + 1),
                                   _WRITE_TIMEOUT_S)
            if not await partition.wait_replicated(result.last_offset + 1, _WRITE_TIMEOUT_S):
                raise NotCoordinatorError(
                    f"{OFFSETS_TOPIC}-{shard.partition} changed leader while the offsets "
                    "were written; find the coordinator again and retry")
            shard.pending.setdefault(request.producer_id, {}).setdefault(
                request.group_id, {}).update(offsets)
        except TimeoutError:
            return everything(RequestTimedOutError(
                "the in-sync replicas did not confirm the offsets in time; retry"))
        except StrataError as err:
            return everything(err)
        return TxnOffsetCommitResponse([TxnTopicResult(t, a) for t, a in answers.items()])

    def _txn_check(self, group: Group, request: TxnOffsetCommitRequest,
                   answers: dict[str, list[TxnPartitionResult]]
                   ) -> list[tuple[str, int, int, str | None]]:
        """The member checks of a transactional commit, at the group's turn."""
        member = self._check_committer(group, OffsetCommitRequest(
            request.group_id, request.member_id, request.member_epoch, []))
        holds = member.holds() if member is not None else None
        accepted = []
        for topic in request.topics:
            out = answers.setdefault(topic.name, [])
            for part in topic.partitions:
                try:
                    self._check_commit(member, holds, topic.name, part.partition,
                                       part.offset, part.metadata)
                    accepted.append((topic.name, part.partition, part.offset, part.metadata))
                    out.append(TxnPartitionResult(part.partition))
                except StrataError as err:
                    out.append(TxnPartitionResult(part.partition, err.code, err.message))
        return accepted

    def _current_offsets(self, group: Group) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets, less those of a topic that was deleted and
        created again since (as Kafka drops a deleted topic's offsets): a consumer of
        the new topic must start at its auto_offset_reset, not at the old topic's
        positions, which would skip (or refetch out of range) its first records."""
        current: dict[TopicPartition, CommittedOffset] = {}
        for tp, committed in group.offsets.items():
            definition = self.cluster.topics.get(tp[0])
            if committed.topic_id is not None and definition is not None \
                    and definition.topic_id != committed.topic_id:
                continue
            current[tp] = committed
        return current

    # ------------------------------------------------------------------ admin
    def list_groups(self) -> list[ListedGroup]:
        listed = []
        for p, shard in sorted(self._shards.items()):
            partition = self.registry.hosted.get((OFFSETS_TOPIC, p))
            if partition is None or not partition.is_leader or \
                    partition.leader_epoch != shard.leader_epoch:
                continue
            for group in shard.groups.values():
                if not group.members and not group.offsets:
                    continue  # every member left and nothing was committed: no group
                listed.append(ListedGroup(group.group_id, group.state, group.assignor,
                                          len(group.members)))
        return sorted(listed, key=lambda g: g.group_id)

    async def describe(self, group_id: str) -> DescribedGroup:
        try:
            shard = await self._shard(group_id)
        except StrataError as err:
            return DescribedGroup(group_id, err.code, err.message)
        group = shard.groups.get(group_id)
        if group is None or (not group.members and not group.offsets):
            missing = GroupIdNotFoundError(f"group {group_id!r} has no members and no offsets")
            return DescribedGroup(group_id, missing.code, missing.message)
        members = [DescribedMember(m.member_id, m.instance_id, m.client_id, m.member_epoch,
                                   list(m.subscribed), group_topic_partitions(m.assigned),
                                   group_topic_partitions(group.target.get(m.member_id, set())))
                   for m in (group.members[i] for i in group.ordered_members())]
        return DescribedGroup(group_id, 0, None, group.state, group.assignor,
                              group.group_epoch, members)

    async def delete(self, group_id: str) -> None:
        shard = await self._shard(group_id)
        group = shard.groups.get(group_id)
        if group is None or (not group.members and not group.offsets):
            raise GroupIdNotFoundError(f"group {group_id!r} does not exist")

        def delete(group: Group, change: _Change
                   ) -> tuple[None, list[tuple[bytes, bytes | None]], Callable[[], None]]:
            if group.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has {len(group.members)} active member(s); stop its "
                    "consumers first")
            records: list[tuple[bytes, bytes | None]] = [
                (_key(group=group_id, partition=p, topic=t, type="offset"), None)
                for t, p in sorted(group.offsets)]
            records.append((_key(group=group_id, type="group"), None))

            def stored() -> None:
                if shard.groups.get(group_id) is group:
                    del shard.groups[group_id]
                for key in [k for k in self.lag if k[0] == group_id]:
                    del self.lag[key]

            return None, records, stored

        await self._run(shard, group, delete)
        log.info("group %s deleted", group_id)

    # ------------------------------------------------------------------ lag
    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.group_lag_interval_ms / 1000)
            try:
                await self.refresh_lag()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # lag is advisory: never let it stop the loop
                log.warning("refreshing group lag failed: %r", err)

    async def refresh_lag(self) -> None:
        """Recompute ``strata_group_lag_records`` for the groups this broker coordinates:
        local high watermarks directly, the others with one ListOffsets per leader."""
        wanted: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for shard in self._shards.values():
            for group in shard.groups.values():
                for tp, committed in self._current_offsets(group).items():
                    wanted.setdefault(tp, []).append((group.group_id, committed.offset))
        ends: dict[tuple[str, int], int] = {}
        remote: dict[int, list[tuple[str, int]]] = {}
        for tp in wanted:
            partition = self.registry.hosted.get(tp)
            if partition is not None and partition.is_leader:
                ends[tp] = partition.high_watermark
                continue
            state = self.cluster.partition_states.get(tp)
            if state is not None and state.leader in self.cluster.live_brokers:
                remote.setdefault(state.leader, []).append(tp)
        for answer in await asyncio.gather(*(self._remote_ends(node, tps)
                                             for node, tps in remote.items())):
            ends.update(answer)
        self.lag = {(g, t, p): max(ends[(t, p)] - offset, 0)
                    for (t, p), commits in wanted.items() if (t, p) in ends
                    for g, offset in commits}

    async def _remote_ends(self, node: int, tps: list[tuple[str, int]]
                           ) -> dict[tuple[str, int], int]:
        registration = self.cluster.live_brokers.get(node)
        if registration is None:
            return {}
        by_topic = group_by_topic(tps)
        try:
            response = await ask_broker(registration, self.config, ApiKey.LIST_OFFSETS,
                                        ListOffsetsRequest([
                                            ListOffsetsTopic(t, [ListOffsetsPartition(
                                                p, LATEST_TIMESTAMP) for p in ps])
                                            for t, ps in by_topic.items()]),
                                        purpose="group-lag", timeout_s=2.0)
        except (StrataError, OSError, TimeoutError) as err:
            log.debug("group lag: broker %d did not answer ListOffsets: %r", node, err)
            return {}
        assert isinstance(response, ListOffsetsResponse)
        return {(t.name, p.partition): p.offset for t in response.topics for p in t.partitions
                if p.error_code == 0}
