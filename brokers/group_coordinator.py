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

    A request changes the group in memory, writes the records of what changed (one
    batch), and answers only once they are replicated; if the write fails the change is
    rolled back, so memory is never ahead of the log and a retry starts from what is
    stored. A member's record is rewritten only when that member changed (or its target
    did), so a heartbeat of a stable group writes nothing.

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
    it. A zombie (paused past its session, replaced by a static twin, or committing a
    partition that has moved) gets UNKNOWN_MEMBER_ID or STALE_MEMBER_EPOCH.

Thread-safety: everything runs on the broker's event loop; one asyncio lock per group
serialises its heartbeats, commits and deletes (a write's replication wait holds it, so
a heartbeat's arrival time, not its turn at the lock, is what keeps its session alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from kazoo.exceptions import KazooException, NodeExistsError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from brokers.coordination import TopicDefinition
from brokers.errors import (
    CoordinatorNotAvailableError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    OffsetMetadataTooLargeError,
    RequestTimedOutError,
    StaleMemberEpochError,
    StrataError,
    TopicAlreadyExistsError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)
from brokers.group_assignors import (
    ASSIGNORS,
    COOPERATIVE_STICKY,
    EAGER_ASSIGNORS,
    TopicPartition,
    assign,
)
from brokers.protocol import (
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
    group_topic_partitions,
)
from brokers.record_batch import batches_to_table, build_batch

if TYPE_CHECKING:
    from brokers.broker import Broker
    from brokers.partition import Partition

__all__ = ["GroupCoordinator", "OFFSETS_TOPIC", "coordinator_partition"]

log = logging.getLogger("strata.brokers.groups")

OFFSETS_TOPIC: Final = "__consumer_offsets"
OFFSETS_SEGMENT_BYTES: Final = 100 * 1024 * 1024
MAX_GROUP_ID_LENGTH: Final = 249
# While something is moving, members come back this soon instead of after a full interval.
_BUSY_HEARTBEAT_MS: Final = 100
_WRITE_TIMEOUT_S: Final = 10.0
_EXPIRY_TICK_S: Final = 0.1
_LOAD_READ_BYTES: Final = 4 << 20


def coordinator_partition(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition that holds ``group_id`` (stable across builds:
    clients and tools may compute it too)."""
    return zlib.crc32(group_id.encode("utf-8")) % partitions


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


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    subscribed: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_epoch: int = 0
    assigned: set[TopicPartition] = field(default_factory=set)  # may own now
    owned: set[TopicPartition] = field(default_factory=set)  # reported, within what it got
    ready_epoch: int = 0  # eager: the target epoch at which it owned nothing
    away: bool = False  # a static member that left for a restart
    last_seen: float = 0.0  # monotonic; not stored
    revoking_since: float | None = None  # not stored

    def stored(self, target: set[TopicPartition]) -> dict[str, Any]:
        return {"member_id": self.member_id, "instance_id": self.instance_id,
                "client_id": self.client_id, "subscribed": self.subscribed,
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "member_epoch": self.member_epoch, "assigned": sorted(self.assigned),
                "owned": sorted(self.owned), "ready_epoch": self.ready_epoch,
                "away": self.away, "target": sorted(target)}

    @classmethod
    def from_stored(cls, data: dict[str, Any], now: float) -> Member:
        return cls(data["member_id"], data["instance_id"], data["client_id"],
                   list(data["subscribed"]), data["session_timeout_ms"],
                   data["rebalance_timeout_ms"], data["member_epoch"],
                   _tps(data["assigned"]), _tps(data["owned"]), data["ready_epoch"],
                   data["away"], last_seen=now)

    def copy(self) -> Member:
        return Member(self.member_id, self.instance_id, self.client_id, list(self.subscribed),
                      self.session_timeout_ms, self.rebalance_timeout_ms, self.member_epoch,
                      set(self.assigned), set(self.owned), self.ready_epoch, self.away,
                      self.last_seen, self.revoking_since)

    def restore_from(self, other: Member) -> None:
        for name in ("subscribed", "member_epoch", "assigned", "owned", "ready_epoch", "away",
                     "revoking_since"):
            setattr(self, name, getattr(other, name))


@dataclass(slots=True)
class Group:
    group_id: str
    assignor: str = COOPERATIVE_STICKY
    group_epoch: int = 0
    target_epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, set[TopicPartition]] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

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
        if any(m.assigned != self.target.get(m.member_id, set()) or m.owned != m.assigned
               for m in self.members.values() if not m.away):
            return "Reconciling"
        return "Stable"

    def ordered_members(self) -> list[str]:
        return sorted(self.members, key=lambda m: (self.members[m].instance_id or "\uffff", m))

    def stored(self) -> dict[str, Any]:
        return {"assignor": self.assignor, "group_epoch": self.group_epoch,
                "target_epoch": self.target_epoch, "partition_counts": self.partition_counts}


@dataclass(slots=True)
class _Snapshot:
    """What one request may change in a group, taken before it changes anything: the
    records to write are the difference, and a failed write restores it."""

    members: dict[str, Member]
    member: Member | None  # a copy of the one member the request changes in place
    scalars: dict[str, Any]
    target: dict[str, set[TopicPartition]]

    @classmethod
    def take(cls, group: Group, member: Member | None) -> _Snapshot:
        return cls(dict(group.members), member.copy() if member is not None else None,
                   group.stored(), dict(group.target))

    def restore(self, group: Group) -> None:
        if self.member is not None and self.member.member_id in self.members:
            self.members[self.member.member_id].restore_from(self.member)
        group.members = self.members
        group.target = self.target
        group.assignor = self.scalars["assignor"]
        group.group_epoch = self.scalars["group_epoch"]
        group.target_epoch = self.scalars["target_epoch"]
        group.partition_counts = self.scalars["partition_counts"]

    def changes(self, group: Group) -> list[tuple[bytes, bytes | None]]:
        g = group.group_id
        records: list[tuple[bytes, bytes | None]] = []
        if group.stored() != self.scalars:
            records.append((_key(group=g, type="group"), _value(group.stored())))
        for member_id in sorted(self.members.keys() - group.members.keys()):
            records.append((_key(group=g, member=member_id, type="member"), None))
        before = self.member.stored(self.target.get(self.member.member_id, set())) \
            if self.member is not None else None
        for member_id, m in sorted(group.members.items()):
            target = group.target.get(member_id, set())
            if member_id not in self.members or self.target.get(member_id) != target or \
                    (before is not None and member_id == before["member_id"]
                     and m.stored(target) != before):
                records.append((_key(group=g, member=member_id, type="member"),
                                _value(m.stored(target))))
        return records


@dataclass(slots=True)
class _Shard:
    """The groups of one ``__consumer_offsets`` partition, as loaded at ``leader_epoch``."""

    partition: int
    leader_epoch: int
    groups: dict[str, Group] = field(default_factory=dict)


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

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self._shards: dict[int, _Shard] = {}
        self._loading: dict[int, asyncio.Lock] = {}
        self._load_failures: dict[int, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self.lag: dict[tuple[str, str, int], int] = {}
        broker.metrics.registry.register(_LagCollector(self))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._expire_loop())
        self._lag_task = asyncio.create_task(self._lag_loop())

    async def stop(self) -> None:
        for task in (self._task, self._lag_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ------------------------------------------------------------------ FindCoordinator
    async def find(self, group_id: str) -> tuple[int, str, int]:
        """(node id, host, port) of the group's coordinator."""
        self._check_group_id(group_id)
        topic = self.broker.topics.get(OFFSETS_TOPIC)
        if topic is None:
            await self._create_offsets_topic()
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC} is being created; retry in a moment")
        p = coordinator_partition(group_id, topic.partition_count)
        state = self.broker.partition_states.get((OFFSETS_TOPIC, p))
        leader = self.broker.live_brokers.get(state.leader) if state is not None else None
        if leader is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{p} (group {group_id!r}) has no live leader right now; "
                "retry after a short back-off")
        return leader.broker_id, leader.host, leader.port

    async def _create_offsets_topic(self) -> None:
        b = self.broker
        if not b.live_brokers:
            await b.refresh_brokers()
        live = sorted(b.live_brokers)
        replication = self.config.offsets_topic_replication_factor
        if len(live) < replication:
            # Created once, with this factor for good: a single copy of every group's
            # offsets would quietly undo the cluster's replication. Kafka waits too.
            await b.refresh_brokers()
            live = sorted(b.live_brokers)
            if len(live) < replication:
                raise CoordinatorNotAvailableError(
                    f"{OFFSETS_TOPIC} is created with offsets.topic.replication.factor="
                    f"{replication} replicas and only {len(live)} broker(s) are live: start "
                    "more brokers, or lower offsets.topic.replication.factor on every broker "
                    "(a single-broker cluster needs 1)")
        from brokers.handlers import assign_replicas

        definition = TopicDefinition(
            OFFSETS_TOPIC, uuid.uuid4().hex,
            assign_replicas(live, self.config.offsets_topic_num_partitions, replication))
        try:
            # 100 MiB segments (Kafka's choice for this topic): compaction only ever
            # cleans closed segments, and 1 GiB ones would rarely close.
            await asyncio.to_thread(b.coordinator.create_topic, definition,
                                    {"cleanup.policy": "compact",
                                     "segment.bytes": str(OFFSETS_SEGMENT_BYTES)})
            log.info("created %s: %d partitions, replication factor %d", OFFSETS_TOPIC,
                     definition.partition_count, replication)
        except (NodeExistsError, TopicAlreadyExistsError):
            pass  # another broker created it first
        except KazooException as err:
            log.warning("creating %s failed (%r); the next FindCoordinator retries",
                        OFFSETS_TOPIC, err)
        with contextlib.suppress(StrataError, KazooException):
            await b.sync_topics()

    # ------------------------------------------------------------------ shards
    def _check_group_id(self, group_id: str) -> None:
        if not group_id or len(group_id) > MAX_GROUP_ID_LENGTH:
            raise InvalidGroupIdError(
                f"group id {group_id!r} is not valid: use 1..{MAX_GROUP_ID_LENGTH} characters")

    def _leader_partition(self, p: int) -> Partition:
        partition = self.broker.partitions.get((OFFSETS_TOPIC, p))
        if partition is None or not partition.is_leader or partition.fenced:
            raise NotCoordinatorError(
                f"broker {self.broker.broker_id} does not lead {OFFSETS_TOPIC}-{p}; find the "
                "group's coordinator again (FindCoordinator)")
        return partition

    async def _shard(self, group_id: str) -> _Shard:
        self._check_group_id(group_id)
        topic = self.broker.topics.get(OFFSETS_TOPIC)
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
            parsed: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
            while offset < end:
                chunk = partition.log.read(offset, _LOAD_READ_BYTES)
                if chunk is None or chunk.next_offset <= offset:
                    break
                data = await asyncio.to_thread(chunk.read_bytes)
                parsed += await asyncio.to_thread(self._decode_chunk, data, p, offset)
                offset = chunk.next_offset
            # Sessions start now, after the load: a long load must not expire everyone.
            now = time.monotonic()
            for key, value in parsed:
                self._replay(shard, key, value, now)
                records += 1
            self._shards[p] = shard
            log.info("loaded %s-%d at leader epoch %d: %d groups from %d records in %.3f s",
                     OFFSETS_TOPIC, p, shard.leader_epoch, len(shard.groups), records,
                     time.monotonic() - started)
            return shard

    @staticmethod
    def _decode_chunk(data: bytes, p: int, offset: int
                      ) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        """Records of one read, parsed (runs in a worker thread: JSON for a large
        partition must not stall the event loop)."""
        table = batches_to_table(data, topic=OFFSETS_TOPIC, partition=p, start_offset=offset)
        parsed: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        for key, value in zip(table.column("key").to_pylist(),
                              table.column("value").to_pylist(), strict=True):
            if key is None:
                continue
            try:
                parsed.append((json.loads(key), None if value is None else json.loads(value)))
            except ValueError as err:
                log.error("%s-%d: skipping an unreadable record %r: %r", OFFSETS_TOPIC, p,
                          key[:200], err)
        return parsed

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
                    group.target[k["member"]] = _tps(v["target"])
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
        if len(partition.isr) < partition.config.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{partition.name} has {len(partition.isr)} in-sync replicas, "
                f"min.insync.replicas is {partition.config.min_insync_replicas}; the group "
                "state was not stored: retry")
        batch = build_batch([v for _, v in records], keys=[k for k, _ in records])
        result = partition.append_as_leader(batch)
        end = result.last_offset + 1
        try:
            await asyncio.wait_for(partition.wait_durable(end), _WRITE_TIMEOUT_S)
            if not await partition.wait_replicated(end, _WRITE_TIMEOUT_S):
                raise NotCoordinatorError(
                    f"broker {self.broker.broker_id} stopped leading {partition.name} "
                    "before the group state was replicated; find the coordinator again "
                    "and retry")
        except TimeoutError:
            raise RequestTimedOutError(
                f"{partition.name}: the in-sync replicas did not confirm the group state "
                f"within {_WRITE_TIMEOUT_S:.0f} s; retry") from None

    async def _apply(self, shard: _Shard, group: Group, snapshot: _Snapshot) -> None:
        """Store what changed since ``snapshot``; on failure put the group back as it was."""
        records = snapshot.changes(group)
        if not records:
            return
        try:
            await self._write(shard, records)
        except BaseException:
            snapshot.restore(group)
            raise

    # ------------------------------------------------------------------ heartbeat
    async def heartbeat(self, request: ConsumerGroupHeartbeatRequest, client_id: str
                        ) -> ConsumerGroupHeartbeatResponse:
        arrived = time.monotonic()  # a wait for the group's lock must not age the session
        try:
            shard = await self._shard(request.group_id)
            current = shard.groups.get(request.group_id)
            known = current.members.get(request.member_id or "") if current else None
            if known is not None:
                known.last_seen = max(known.last_seen, arrived)
            async with self._locked(shard, request.group_id) as group:
                return await self._heartbeat(shard, group, request, client_id, arrived)
        except StrataError as err:
            return ConsumerGroupHeartbeatResponse(err.code, err.message)

    @contextlib.asynccontextmanager
    async def _locked(self, shard: _Shard, group_id: str) -> AsyncIterator[Group]:
        """The group (created in memory if new) with its lock held. A group nothing was
        stored for (a join or commit that failed) is dropped again on the way out."""
        group = shard.groups.setdefault(group_id, Group(group_id))
        async with group.lock:
            if shard.groups.get(group_id) is not group:
                raise NotCoordinatorError(
                    f"group {group_id!r} was deleted or reloaded while this request waited; "
                    "find the coordinator again and retry")
            try:
                yield group
            finally:
                if not group.members and not group.offsets and group.group_epoch == 0:
                    shard.groups.pop(group_id, None)

    async def _heartbeat(self, shard: _Shard, group: Group,
                         request: ConsumerGroupHeartbeatRequest, client_id: str,
                         arrived: float) -> ConsumerGroupHeartbeatResponse:
        if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return await self._leave(shard, group, request)
        existing = group.members.get(request.member_id or "")
        snapshot = _Snapshot.take(group, existing)
        reported = _from_wire(request.owned)
        if request.member_epoch == JOIN_EPOCH and existing is None:
            member = self._join(group, request, client_id, arrived)
        else:
            if request.member_id is None or request.member_epoch < 0:
                raise InvalidRequestError(
                    f"member epoch {request.member_epoch} needs a member id (0 to join, -1 "
                    "to leave, -2 for a static member's temporary leave)")
            if existing is None:
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
            member.owned = reported & (member.owned | member.assigned)
        member.away = False
        member.last_seen = max(member.last_seen, arrived)
        self._refresh_target(group)
        self._reconcile(group, member, time.monotonic())
        await self._apply(shard, group, snapshot)
        target = group.target.get(member.member_id, set())
        busy = member.assigned != target or member.owned != member.assigned
        return ConsumerGroupHeartbeatResponse(
            0, None, member.member_id, member.member_epoch,
            _BUSY_HEARTBEAT_MS if busy else self.config.group_heartbeat_interval_ms,
            group_topic_partitions(member.assigned))

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
        twin = next((m for m in group.members.values()
                     if request.instance_id is not None and m.instance_id == request.instance_id),
                    None)
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
            current = twin.member_epoch >= group.target_epoch
            member.member_epoch = twin.member_epoch if current else 0
            member.assigned = set(twin.assigned) if current or not group.eager else set()
            member.ready_epoch = twin.ready_epoch
            group.target[member_id] = group.target.pop(twin.member_id, set())
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

    async def _leave(self, shard: _Shard, group: Group, request: ConsumerGroupHeartbeatRequest
                     ) -> ConsumerGroupHeartbeatResponse:
        member = group.members.get(request.member_id or "")
        if member is None:  # already gone: leaving is idempotent
            return ConsumerGroupHeartbeatResponse(0, None, request.member_id,
                                                  request.member_epoch, 0, [])
        snapshot = _Snapshot.take(group, member)
        if request.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # It stopped consuming (the client revoked everything before leaving); its
            # assignment stays reserved for it until its session times out.
            member.away = True
            member.owned = set()
            member.revoking_since = None
            log.info("group %s: static member %s left for a restart; its partitions wait "
                     "%d ms for it", group.group_id, member.instance_id,
                     member.session_timeout_ms)
        else:
            self._remove(group, member, "left")
            self._refresh_target(group)
        await self._apply(shard, group, snapshot)
        return ConsumerGroupHeartbeatResponse(0, None, member.member_id, request.member_epoch,
                                              0, [])

    @staticmethod
    def _remove(group: Group, member: Member, why: str) -> None:
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        group.group_epoch += 1
        log.info("group %s: member %s %s (epoch %d)", group.group_id, member.member_id, why,
                 group.group_epoch)

    def _refresh_target(self, group: Group) -> None:
        counts = {t: self.broker.topics[t].partition_count
                  for t in sorted({t for m in group.members.values() for t in m.subscribed})
                  if t in self.broker.topics}
        if counts != group.partition_counts:
            group.partition_counts = counts
            if group.group_epoch <= group.target_epoch:
                group.group_epoch += 1
        if group.group_epoch <= group.target_epoch:
            return
        order = group.ordered_members()
        group.target = assign(group.assignor, order,
                              {m: group.members[m].subscribed for m in order},
                              counts, group.target)
        group.target_epoch = group.group_epoch

    def _reconcile(self, group: Group, member: Member, now: float) -> None:
        """Move ``member`` one step towards its target (see the module docstring)."""
        target = group.target.get(member.member_id, set())
        if group.eager:
            if member.member_epoch >= group.target_epoch:
                member.assigned = set(target)
                return
            member.assigned = set()
            if member.owned:
                if member.revoking_since is None:
                    member.revoking_since = now
                return
            member.revoking_since = None
            member.ready_epoch = group.target_epoch
            # Away static members own nothing (they revoked before leaving).
            if all(m.away or m.ready_epoch >= group.target_epoch
                   or m.member_epoch >= group.target_epoch for m in group.members.values()):
                member.assigned = set(target)
                member.member_epoch = group.target_epoch
            return
        revoke = member.owned - target
        if revoke:
            member.assigned = member.owned & target
            if member.revoking_since is None:
                member.revoking_since = now
            return
        member.revoking_since = None
        held = set().union(*(m.owned | m.assigned for m in group.members.values()
                             if m is not member))
        member.assigned = member.owned | {tp for tp in target - member.owned if tp not in held}
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
        topic = self.broker.topics.get(OFFSETS_TOPIC)
        if topic is None:
            return
        for p in range(topic.partition_count):
            partition = self.broker.partitions.get((OFFSETS_TOPIC, p))
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
                    async with group.lock:
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
        if shard.groups.get(group.group_id) is not group:
            return
        snapshot = _Snapshot.take(group, None)
        now = time.monotonic()
        for member in list(group.members.values()):
            why = self._expired(member, now)
            if why is not None:
                self._remove(group, member, why)
        self._refresh_target(group)
        try:
            await self._apply(shard, group, snapshot)
        except StrataError as err:
            log.warning("group %s: storing a removal failed (%s); retrying on the next pass",
                        group.group_id, err)

    # ------------------------------------------------------------------ offsets
    async def commit(self, request: OffsetCommitRequest) -> OffsetCommitResponse:
        answers: dict[str, list[OffsetCommitPartitionResponse]] = {}
        accepted: list[tuple[str, int, int, str | None]] = []
        try:
            shard = await self._shard(request.group_id)
            async with self._locked(shard, request.group_id) as group:
                await self._commit_locked(shard, group, request, answers, accepted)
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

    async def _commit_locked(self, shard: _Shard, group: Group, request: OffsetCommitRequest,
                             answers: dict[str, list[OffsetCommitPartitionResponse]],
                             accepted: list[tuple[str, int, int, str | None]]) -> None:
        member = self._check_committer(group, request)
        for topic in request.topics:
            out = answers.setdefault(topic.name, [])
            for part in topic.partitions:
                try:
                    self._check_commit(member, topic.name, part.partition, part.offset,
                                       part.metadata)
                    accepted.append((topic.name, part.partition, part.offset, part.metadata))
                    out.append(OffsetCommitPartitionResponse(part.partition, 0))
                except StrataError as err:
                    out.append(OffsetCommitPartitionResponse(part.partition, err.code,
                                                             err.message))
        if accepted:
            now_ms = int(time.time() * 1000)
            ids = {t: self.broker.topics[t].topic_id for t, *_ in accepted}
            await self._write(shard, [
                (_key(group=group.group_id, partition=p, topic=t, type="offset"),
                 _value({"offset": o, "metadata": m, "timestamp": now_ms,
                         "topic_id": ids[t]}))
                for t, p, o, m in accepted])
            for t, p, o, m in accepted:
                group.offsets[(t, p)] = CommittedOffset(o, m, now_ms, ids[t])

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
            raise UnknownMemberIdError(
                f"member {request.member_id} is not in group {group.group_id!r} (its session "
                "expired or it was replaced): the commit is refused; rejoin and re-process")
        if request.member_epoch > member.member_epoch:
            raise FencedMemberEpochError(
                f"member {member.member_id} committed with epoch {request.member_epoch}, the "
                f"coordinator gave it {member.member_epoch}; rejoin")
        return member

    def _check_commit(self, member: Member | None, topic: str, p: int, offset: int,
                      metadata: str | None) -> None:
        definition = self.broker.topics.get(topic)
        if definition is None or p not in definition.assignment:
            raise UnknownTopicOrPartitionError(f"{topic}-{p} does not exist")
        if offset < 0:
            raise InvalidRequestError(f"{topic}-{p}: offset {offset} is negative")
        if metadata is not None and \
                len(metadata.encode("utf-8")) > self.config.offset_metadata_max_bytes:
            raise OffsetMetadataTooLargeError(
                f"{topic}-{p}: metadata is longer than offset.metadata.max.bytes "
                f"({self.config.offset_metadata_max_bytes})")
        if member is not None and (topic, p) not in member.owned | member.assigned:
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
        by_topic: dict[str, list[OffsetFetchPartitionResponse]] = {}
        for topic, p in wanted:
            found = offsets.get((topic, p))
            by_topic.setdefault(topic, []).append(
                OffsetFetchPartitionResponse(p, -1) if found is None else
                OffsetFetchPartitionResponse(p, found.offset, found.metadata, found.timestamp))
        return OffsetFetchResponse(0, None, [OffsetFetchTopicResponse(t, ps)
                                             for t, ps in by_topic.items()])

    def _current_offsets(self, group: Group) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets, less those of a topic that was deleted and
        created again since (as Kafka drops a deleted topic's offsets): a consumer of
        the new topic must start at its auto_offset_reset, not at the old topic's
        positions, which would skip (or refetch out of range) its first records."""
        current: dict[TopicPartition, CommittedOffset] = {}
        for tp, committed in group.offsets.items():
            definition = self.broker.topics.get(tp[0])
            if committed.topic_id is not None and definition is not None \
                    and definition.topic_id != committed.topic_id:
                continue
            current[tp] = committed
        return current

    # ------------------------------------------------------------------ admin
    def list_groups(self) -> list[ListedGroup]:
        listed = []
        for p, shard in sorted(self._shards.items()):
            partition = self.broker.partitions.get((OFFSETS_TOPIC, p))
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
        async with group.lock:
            if group.members:
                raise NonEmptyGroupError(
                    f"group {group_id!r} has {len(group.members)} active member(s); stop its "
                    "consumers first")
            records: list[tuple[bytes, bytes | None]] = [
                (_key(group=group_id, partition=p, topic=t, type="offset"), None)
                for t, p in sorted(group.offsets)]
            records.append((_key(group=group_id, type="group"), None))
            await self._write(shard, records)
            shard.groups.pop(group_id, None)
            for key in [k for k in self.lag if k[0] == group_id]:
                del self.lag[key]
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
            partition = self.broker.partitions.get(tp)
            if partition is not None and partition.is_leader:
                ends[tp] = partition.high_watermark
                continue
            state = self.broker.partition_states.get(tp)
            if state is not None and state.leader in self.broker.live_brokers:
                remote.setdefault(state.leader, []).append(tp)
        for answer in await asyncio.gather(*(self._remote_ends(node, tps)
                                             for node, tps in remote.items())):
            ends.update(answer)
        self.lag = {(g, t, p): max(ends[(t, p)] - offset, 0)
                    for (t, p), commits in wanted.items() if (t, p) in ends
                    for g, offset in commits}

    async def _remote_ends(self, node: int, tps: list[tuple[str, int]]
                           ) -> dict[tuple[str, int], int]:
        from strata.client._connection import BrokerConnection

        registration = self.broker.live_brokers.get(node)
        if registration is None:
            return {}
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        connection = BrokerConnection(registration.host, registration.port,
                                      client_id=f"broker-{self.broker.broker_id}-group-lag")
        try:
            # A paused leader accepts the connection and never answers: bound both steps,
            # or the gauge would freeze for good.
            await connection.connect(timeout=2.0)
            response = await asyncio.wait_for(connection.request(
                ApiKey.LIST_OFFSETS, ListOffsetsRequest([
                    ListOffsetsTopic(t, [ListOffsetsPartition(p, LATEST_TIMESTAMP) for p in ps])
                    for t, ps in by_topic.items()])), 2.0)
        except (StrataError, OSError, TimeoutError) as err:
            log.debug("group lag: broker %d did not answer ListOffsets: %r", node, err)
            return {}
        finally:
            await connection.close()
        assert isinstance(response, ListOffsetsResponse)
        return {(t.name, p.partition): p.offset for t in response.topics for p in t.partitions
                if p.error_code == 0}
