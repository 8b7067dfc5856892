"""Kafka's classic consumer-group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup)
on Strata's group coordinator.

Strata's coordinator assigns partitions itself (KIP-848 style: ``ConsumerGroupHeartbeat``,
the assignor runs on the broker, a partition moves only once its owner has let it go).
A classic member is driven through the same heartbeat, the way Kafka 4 lets classic
members join a consumer group:

* JoinGroup: a heartbeat with the member's subscription and the partitions it still owns
  (both read from its ``consumer`` protocol metadata, ConsumerProtocolSubscription); the
  answer names no leader member, so every classic member is a follower and no client-side
  assignor runs; the generation is the member epoch.
* SyncGroup: a heartbeat; the member's assigned partitions, encoded as Kafka's
  ConsumerProtocolAssignment.
* Heartbeat: a heartbeat reporting what the member was given; when the coordinator's
  answer differs, REBALANCE_IN_PROGRESS, and the client rejoins (an eager client after
  giving up everything, a cooperative one after giving up what it must).
* LeaveGroup: a heartbeat with the leave epoch.

So Strata and Kafka members share one group and one assignment; the assignor is the
group's (Strata's default cooperative-sticky, or what its first Strata member chose),
whatever protocol name the classic members offer (the one they offered first is echoed).

State: per (group, member) the epoch and the partitions last handed out, in this broker's
memory. Lost when the coordinator moves: the member's next request gets
UNKNOWN_MEMBER_ID, it rejoins, and the coordinator expires the old member after its
session timeout (its partitions wait that long, as for a crashed member).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from brokers.kafka.codec import API_TYPES
from wire.protocol import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    ApiKey,
    ConsumerGroupHeartbeatRequest,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    GroupTopicPartitions,
    ListGroupsRequest,
)

if TYPE_CHECKING:
    from brokers.kafka.codec import KafkaHeader
    from brokers.security import Session

__all__ = ["ClassicGroups", "decode_subscription", "encode_assignment"]

_INCONSISTENT_GROUP_PROTOCOL: Final = 23
_ILLEGAL_GENERATION: Final = 22
_UNKNOWN_MEMBER_ID: Final = 25
_REBALANCE_IN_PROGRESS: Final = 27
_INVALID_REQUEST: Final = 42
#: Strata's member-epoch errors as a classic client acts on them (rejoin).
_EPOCH_ERRORS: Final = {110: _ILLEGAL_GENERATION, 113: _ILLEGAL_GENERATION,
                        25: _UNKNOWN_MEMBER_ID}
_NO_LEADER: Final = ""  # no member is the leader: the coordinator assigns

Call = Callable[[ApiKey, Any, "Session", "KafkaHeader"], Awaitable[Any]]
Partitions = frozenset[tuple[str, int]]


class _Malformed(ValueError):
    pass


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Malformed("truncated")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def string(self) -> str:
        n = self.take(">h")
        if n < 0 or self.pos + n > len(self.data):
            raise _Malformed("bad string")
        value = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return value

    def count(self) -> int:
        n = self.take(">i")
        if n < -1 or n > len(self.data):
            raise _Malformed("bad array length")
        return max(n, 0)


def decode_subscription(metadata: bytes) -> tuple[list[str], Partitions]:
    """(topics, owned partitions) of a ConsumerProtocolSubscription (v0-v3)."""
    c = _Cursor(bytes(metadata))
    try:
        version = c.take(">h")
        topics = [c.string() for _ in range(c.count())]
        n = c.take(">i")  # user data
        if n > 0:
            c.pos += n
        owned: set[tuple[str, int]] = set()
        if version >= 1 and c.pos < len(c.data):
            for _ in range(c.count()):
                topic = c.string()
                owned.update((topic, c.take(">i")) for _ in range(c.count()))
    except (_Malformed, UnicodeDecodeError) as err:
        raise _Malformed(f"consumer protocol subscription does not decode: {err}") from None
    return topics, frozenset(owned)


def encode_assignment(partitions: Partitions) -> bytes:
    """A ConsumerProtocolAssignment v0 of ``partitions`` (no user data)."""
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(partitions):
        by_topic.setdefault(topic, []).append(p)
    out = bytearray(struct.pack(">hi", 0, len(by_topic)))
    for topic, ps in by_topic.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(ps))
        out += struct.pack(f">{len(ps)}i", *ps)
    out += struct.pack(">i", -1)
    return bytes(out)


def _partitions(assignment: list[GroupTopicPartitions]) -> Partitions:
    return frozenset((t.topic, p) for t in assignment for p in t.partitions)


def _wire(partitions: Partitions) -> list[GroupTopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(partitions):
        by_topic.setdefault(topic, []).append(p)
    return [GroupTopicPartitions(t, ps) for t, ps in by_topic.items()]


@dataclass(slots=True)
class _Member:
    epoch: int
    protocol: str
    topics: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    instance_id: str | None
    owned: Partitions = frozenset()
    given: Partitions | None = None  # what the last SyncGroup handed out
    assigned: Partitions = field(default_factory=frozenset)


class ClassicGroups:
    """The classic group APIs over Strata's coordinator (see the module docstring)."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._members: dict[tuple[str, str], _Member] = {}

    def committer(self, group_id: str, member_id: str | None,
                  generation: int) -> tuple[str | None, int]:
        """The (member id, epoch) an OffsetCommit commits as: none for a consumer that
        assigns its own partitions (Kafka's empty member id, generation -1)."""
        if not member_id:
            return None, -1
        return member_id, generation

    @staticmethod
    def commit_code(code: int) -> int:
        return _EPOCH_ERRORS.get(code, code if code < 1000 else -1)

    async def _beat(self, group_id: str, member_id: str | None, member: _Member,
                    owned: Partitions, session: Session, header: KafkaHeader,
                    epoch: int | None = None) -> Any:
        return await self._call(ApiKey.CONSUMER_GROUP_HEARTBEAT, ConsumerGroupHeartbeatRequest(
            group_id, member_id, member.epoch if epoch is None else epoch,
            instance_id=member.instance_id, rebalance_timeout_ms=member.rebalance_timeout_ms,
            session_timeout_ms=member.session_timeout_ms, subscribed_topics=member.topics,
            assignor=None, owned=_wire(owned)), session, header)

    async def join_group(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[11][1]

        def refuse(code: int, member_id: str = "") -> Any:
            return r(throttle_time_ms=0, error_code=code, generation_id=-1,
                     protocol_type=None, protocol_name=None, leader="",
                     member_id=member_id, members=[])

        if request.protocol_type != "consumer" or not request.protocols:
            return refuse(_INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        protocol = request.protocols[0]
        try:
            topics, owned = decode_subscription(protocol.metadata)
        except _Malformed:
            return refuse(_INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        member_id = request.member_id or None
        key = (request.group_id, member_id or "")
        known = self._members.get(key)
        rebalance_ms = request.rebalance_timeout_ms if header.api_version >= 1 \
            else request.session_timeout_ms
        member = _Member(
            known.epoch if known else JOIN_EPOCH, protocol.name, sorted(set(topics)),
            request.session_timeout_ms, rebalance_ms,
            request.group_instance_id if header.api_version >= 5 else None, owned)
        answer = await self._beat(request.group_id, member_id, member, owned, session, header)
        if answer.error_code == _UNKNOWN_MEMBER_ID or answer.error_code in (110, 113):
            # Its place is gone (expired, or this coordinator restarted): a new member.
            self._members.pop(key, None)
            member.epoch = JOIN_EPOCH
            answer = await self._beat(request.group_id, None, member, owned, session, header)
        if answer.error_code:
            return refuse(self.commit_code(answer.error_code), request.member_id)
        self._members.pop(key, None)
        member.epoch = answer.member_epoch
        member.assigned = _partitions(answer.assignment)
        self._members[(request.group_id, answer.member_id)] = member
        return r(throttle_time_ms=0, error_code=0, generation_id=answer.member_epoch,
                 protocol_type="consumer", protocol_name=protocol.name, leader=_NO_LEADER,
                 skip_assignment=False, member_id=answer.member_id, members=[])

    async def sync_group(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[14][1]
        member = self._members.get((request.group_id, request.member_id))
        if member is None:
            return r(throttle_time_ms=0, error_code=_UNKNOWN_MEMBER_ID, protocol_type=None,
                     protocol_name=None, assignment=b"")
        answer = await self._beat(request.group_id, request.member_id, member, member.owned,
                                  session, header)
        if answer.error_code:
            self._members.pop((request.group_id, request.member_id), None)
            return r(throttle_time_ms=0, error_code=self.commit_code(answer.error_code),
                     protocol_type=None, protocol_name=None, assignment=b"")
        member.epoch = answer.member_epoch
        member.given = member.assigned = _partitions(answer.assignment)
        return r(throttle_time_ms=0, error_code=0, protocol_type="consumer",
                 protocol_name=member.protocol, assignment=encode_assignment(member.given))

    async def heartbeat(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[12][1]
        key = (request.group_id, request.member_id)
        member = self._members.get(key)
        if member is None:
            return r(throttle_time_ms=0, error_code=_UNKNOWN_MEMBER_ID)
        if member.given is None:  # joined, not synced yet
            return r(throttle_time_ms=0, error_code=_REBALANCE_IN_PROGRESS)
        answer = await self._beat(request.group_id, request.member_id, member, member.given,
                                  session, header)
        if answer.error_code:
            if answer.error_code in _EPOCH_ERRORS:
                self._members.pop(key, None)
            return r(throttle_time_ms=0, error_code=self.commit_code(answer.error_code))
        member.epoch = answer.member_epoch
        member.assigned = _partitions(answer.assignment)
        if member.assigned != member.given:
            return r(throttle_time_ms=0, error_code=_REBALANCE_IN_PROGRESS)
        return r(throttle_time_ms=0, error_code=0)

    async def leave_group(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[13][1]
        if header.api_version >= 3:
            ids = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            ids = [(request.member_id, None)]
        results = []
        for member_id, instance_id in ids:
            member = self._members.pop((request.group_id, member_id), None)
            if member is None:
                results.append((member_id, instance_id, _UNKNOWN_MEMBER_ID))
                continue
            answer = await self._beat(request.group_id, member_id, member, frozenset(),
                                      session, header, epoch=LEAVE_EPOCH)
            results.append((member_id, instance_id, self.commit_code(answer.error_code)))
        if header.api_version >= 3:
            return r(throttle_time_ms=0, error_code=0, members=[r.MemberResponse(
                member_id=m, group_instance_id=i, error_code=c) for m, i, c in results])
        return r(throttle_time_ms=0, error_code=results[0][2])

    async def describe_groups(self, request: Any, header: KafkaHeader,
                              session: Session) -> Any:
        answer = await self._call(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(
            list(request.groups)), session, header)
        r = API_TYPES[15][1]
        G = r.DescribedGroup
        out = []
        for g in answer.groups:
            members = [G.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                client_host="", member_metadata=b"",
                member_assignment=encode_assignment(_partitions(m.assignment)))
                for m in g.members]
            out.append(G(error_code=self.commit_code(g.error_code),
                         error_message=g.error_message, group_id=g.group_id,
                         group_state=_kafka_state(g.state), protocol_type="consumer",
                         protocol_data=g.assignor, members=members))
        return r(throttle_time_ms=0, groups=out)

    async def list_groups(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        answer = await self._call(ApiKey.LIST_GROUPS, ListGroupsRequest(), session, header)
        r = API_TYPES[16][1]
        wanted = {s.lower() for s in (getattr(request, "states_filter", None) or [])}
        groups = [g for g in answer.groups
                  if not wanted or _kafka_state(g.state).lower() in wanted]
        return r(throttle_time_ms=0, error_code=self.commit_code(answer.error_code),
                 groups=[r.ListedGroup(group_id=g.group_id, protocol_type="consumer",
                                       group_state=_kafka_state(g.state),
                                       group_type="consumer") for g in groups])

    async def delete_groups(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        answer = await self._call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(
            list(request.groups_names)), session, header)
        r = API_TYPES[42][1]
        return r(throttle_time_ms=0, results=[r.DeletableGroupResult(
            group_id=g.group_id, error_code=self.commit_code(g.error_code))
            for g in answer.results])


def _kafka_state(state: str) -> str:
    """Strata's group states in Kafka's words (Empty, Stable, PreparingRebalance, Dead)."""
    return {"empty": "Empty", "stable": "Stable", "reconciling": "PreparingRebalance",
            "assigning": "PreparingRebalance", "dead": "Dead"}.get(state.lower(), state)
