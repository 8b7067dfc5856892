"""The Strata admin client: create, delete, list, describe and alter topics; list offsets;
preferred-leader election and partition reassignment.

Two faces over one implementation: ``AsyncAdmin`` (asyncio) and ``Admin`` (blocking, on a
private event-loop thread).

Error reporting, and why: the topic APIs (``create_topics``, ``delete_topics``) take many
topics in one request and the broker answers per topic. By default the first failed
topic's typed error (``InvalidTopicError``, ``TopicAlreadyExistsError``,
``InvalidConfigError``, ...) is raised with the broker's message, which is what a script
creating one topic wants. The broker still acted on every other topic in the request, so
``raise_errors=False`` returns ``{name: None | error}`` for callers that create many topics
and want every outcome. Single-topic calls (``alter_configs``) and reads
(``describe_*``, ``list_offsets``, ``list_partition_reassignments``) always raise.

The partition APIs (``elect_preferred_leaders``, ``alter_partition_reassignments``) are
answered per partition and raise the first failed partition's typed error the same way
(``UnknownTopicOrPartitionError``, ``InvalidReplicationFactorError``, ...). As with the
topic APIs, the broker acted on every partition that did not fail, so a caller that
must not write anything unless every partition is valid checks the input first
(``describe_topics`` for partitions and replicas, ``describe_cluster`` for live brokers),
as ``strata topic reassign`` does. A preferred replica that cannot take over is not an
error: ``ElectionResult.message`` says why the leader stayed.

Validation lives in the broker (one source of truth for names, counts and config values);
the client sends what it is given and turns the answer into typed errors.

``describe_tier`` (what the Delta tiering job plans from) asks each partition's leader
with ``DescribeTier``: only the leader knows which segments are closed and below its high
watermark. A partition whose leader moved (``NOT_LEADER_OR_FOLLOWER``), has none right
now, or did not answer is retried after a metadata refresh until the request timeout,
as ``list_offsets`` does; a topic that does not exist raises at once.

Consumer groups: ``find_coordinator``, ``describe_groups``, ``list_group_offsets``,
``group_lag``, ``reset_group_offsets`` and ``delete_groups`` go to each group's
coordinator (found with ``FindCoordinator``; a coordinator that moved is looked up again
and the request resent until the request timeout). ``list_groups`` asks every live
broker, since each one only knows the groups it coordinates, and merges the answers.
``reset_group_offsets`` plans first (``execute=False`` changes nothing) and writes
only into a group with no members: the members' own commits would overwrite the reset.

Where each number in ``describe_topics`` comes from: leader, replicas and ISR from
``Metadata``; the high watermark from ``ListOffsets(latest)``; then one ``Fetch`` at the
high watermark with no wait (it carries no records) returns the log start offset, the log
end offset and a fresh high watermark in its partition answer. So no new API is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar, Unpack

from strata.client._cluster import Cluster
from strata.client._common import TopicPartition, error_from_code, is_transient
from strata.client._config import SecurityOptions, security_of
from strata.client._group import CoordinatorAddress, CoordinatorLink
from strata.client._offsets import list_offsets, list_offsets_once
from strata.client._schemas import RegisteredSchema, RegistryAnswer, SchemaSource
from strata.client._sync import EventLoopThread
from wire.errors import (
    GroupIdNotFoundError,
    NetworkError,
    NonEmptyGroupError,
    OffsetOutOfRangeError,
    StrataError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AclEntry,
    AclFilterEntry,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterConfigsTopic,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    ApiKey,
    ConfigEntry,
    CreatableTopic,
    CreateAclsRequest,
    CreateAclsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeTierPartitionResponse,
    DescribeTierRequest,
    DescribeTierResponse,
    DescribeTierTopic,
    DescribeTierTopicResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectionTopic,
    ElectionTopicResult,
    ElectLeadersRequest,
    ElectLeadersResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ListGroupsRequest,
    ListGroupsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    Message,
    MetadataResponse,
    QuotaAlteration,
    ReassignablePartition,
    ReassignableTopic,
    SchemaRegistryRequest,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    TierLeaseRequest,
    TierLeaseResponse,
    TierProgressUpdate,
    TopicResult,
    UpdateTierRequest,
    UpdateTierResponse,
    group_by_topic,
)
from wire.sasl import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_MECHANISMS, salted_password

__all__ = [
    "Admin",
    "AsyncAdmin",
    "ClusterDescription",
    "CommittedOffset",
    "ConfigValue",
    "Coordinator",
    "CoordinatorAddress",
    "ElectionResult",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "OffsetReset",
    "PartitionLag",
    "ResetPlan",
    "ResetTarget",
    "ListOffsetsResult",
    "NewTopic",
    "OffsetSpec",
    "PartitionDescription",
    "PartitionTier",
    "Reassignment",
    "SegmentInfo",
    "StoredTierProgress",
    "TierLease",
    "TopicDescription",
    "TopicTier",
]

T = TypeVar("T")

log = logging.getLogger("strata.client.admin")

#: The name ``CoordinatorAddress`` had before it said what it is (kept for existing code).
Coordinator: TypeAlias = CoordinatorAddress

#: ``"earliest"`` (log start offset), ``"latest"`` (high watermark) or a timestamp in ms.
OffsetSpec: TypeAlias = Literal["earliest", "latest"] | int


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. ``-1`` partitions / replication factor: the broker's defaults
    (``num.partitions``, ``default.replication.factor``). ``configs`` are per-topic
    overrides such as ``{"retention.ms": "86400000"}`` (values are sent as strings)."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition as ``describe_topics`` sees it. Offsets are ``-1`` when the leader
    could not be asked (no live leader, or it failed to answer)."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionDescription, ...]

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """A topic config's effective value; ``is_default``: no override is set for it."""

    name: str
    value: str | None
    is_default: bool


class ListOffsetsResult(NamedTuple):
    """``offset`` is ``-1`` for a timestamp after every record. ``timestamp`` is the found
    record's timestamp for a timestamp lookup (``-1`` for earliest/latest or no match)."""

    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """``controller_id``: the broker acting as controller (``-1``: none right now);
    ``brokers``: the live brokers, ``{node_id: (host, port)}``."""

    cluster_id: str | None
    controller_id: int
    brokers: dict[int, tuple[str, int]]


@dataclass(frozen=True, slots=True)
class ElectionResult:
    """One partition after a preferred-leader election.

    ``leader``: the partition's leader once the controller acted (``-1``: none).
    ``message``: ``None`` when the preferred replica (the first assigned) leads;
    otherwise why the leader stayed (the preferred replica is not alive or not in sync).
    """

    leader: int
    message: str | None = None

    @property
    def preferred_leads(self) -> bool:
        """The preferred replica leads the partition now."""
        return self.message is None


@dataclass(frozen=True, slots=True)
class Reassignment:
    """A partition whose replicas are still moving.

    ``replicas``: the partition's replica set now (while it moves: the target replicas,
    then the leaving ones); ``adding`` / ``removing``: the brokers joining / leaving.
    """

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A closed segment on the partition leader: offsets ``[base_offset, next_offset)``,
    the newest record's timestamp in ms (the file's mtime if no record has one) and its
    size on disk."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PartitionTier:
    """One partition for the tiering job, as its leader and ZooKeeper see it.

    ``segments``: the closed segments that end at or below the high watermark, oldest
    first (never the active one). ``tiered_up_to``: exclusive end offset of the records
    in the Delta table; ``tier_start_offset``: the first one still there (0 and 0
    before anything was tiered).
    """

    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    tiered_up_to: int
    tier_start_offset: int
    segments: tuple[SegmentInfo, ...]


@dataclass(frozen=True, slots=True)
class TopicTier:
    """A topic's tiering settings (``tier.enable``, ``tier.after.ms``), its Delta table
    as recorded in ZooKeeper (``None``: not yet) and every partition."""

    name: str
    enabled: bool
    tier_after_ms: int
    table: str | None
    partitions: dict[int, PartitionTier]


@dataclass(frozen=True, slots=True)
class TierLease:
    """A tiering job's lease on one topic (``Admin.acquire_tier_lease``).

    ``topic_id``: the topic the lease is for (progress writes name it, so they never
    land on a re-created topic of the same name); ``compacted``: the compacted table's
    progress per partition as of the acquisition (only the holder writes it, so it
    stays current while the lease is held).
    """

    topic: str
    lease_id: str
    topic_id: str
    compacted: dict[int, int]


@dataclass(frozen=True, slots=True)
class StoredTierProgress:
    """A partition's recorded tier progress after an ``update_tier`` (-1: not asked)."""

    partition: int
    tiered_up_to: int
    tier_start: int
    merged_up_to: int


# ----------------------------------------------------------------------------- groups

#: Where ``reset_group_offsets`` moves a group: ``"earliest"`` (log start), ``"latest"``
#: (high watermark), an offset (clamped into ``[log start, high watermark]``) or a
#: ``datetime`` (the first record at or after it; the high watermark if none is; a naive
#: datetime is UTC).
ResetTarget: TypeAlias = Literal["earliest", "latest"] | int | datetime


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One group as its coordinator lists it. ``state``: ``Empty`` (no members),
    ``Assigning`` (waiting for members to give partitions up), ``Reconciling``
    (partitions moving), ``Stable``; ``coordinator``: the broker's node id."""

    group_id: str
    state: str
    assignor: str
    members: int
    coordinator: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """A member: ``assignment`` is what it may own now, ``target`` where the assignor
    wants it to end up (they differ while partitions move)."""

    member_id: str
    instance_id: str | None
    client_id: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]
    target: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    assignor: str
    group_epoch: int
    coordinator: CoordinatorAddress
    members: tuple[MemberDescription, ...]

    def owner(self, partition: TopicPartition) -> MemberDescription | None:
        """The member that may own ``partition`` now (None: no member)."""
        return next((m for m in self.members if partition in m.assignment), None)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed offset: the next record the group will process; ``commit_timestamp``
    in ms since the epoch (-1: unknown)."""

    offset: int
    metadata: str | None
    commit_timestamp: int


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group: ``current_offset`` the committed offset (None:
    nothing committed), ``log_end_offset`` the high watermark (the end consumers can
    read; -1: unknown), ``lag`` their difference (None when either is unknown), and the
    member that owns the partition now (None: no member)."""

    topic: str
    partition: int
    current_offset: int | None
    log_end_offset: int
    lag: int | None
    member_id: str | None
    instance_id: str | None
    client_id: str | None


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """One partition of a reset: the committed offset now (None: none), the new one, and
    the valid range the new one was chosen from."""

    topic: str
    partition: int
    current_offset: int | None
    new_offset: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What ``reset_group_offsets`` does (``executed`` False: nothing was written)."""

    group_id: str
    topic: str
    target: str
    partitions: tuple[OffsetReset, ...]
    executed: bool


def _spec_timestamp(tp: TopicPartition, spec: OffsetSpec) -> int:
    if spec == "earliest":
        return EARLIEST_TIMESTAMP
    if spec == "latest":
        return LATEST_TIMESTAMP
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return spec
    raise ValueError(f"offset spec {spec!r} for {tp} is not valid; use 'earliest', 'latest' "
                     "or a timestamp in ms >= 0")


def _results(topics: list[TopicResult], raise_errors: bool) -> dict[str, StrataError | None]:
    out: dict[str, StrataError | None] = {}
    for result in topics:
        out[result.name] = None if result.error_code == 0 else \
            error_from_code(result.error_code, result.error_message)
    if raise_errors:
        for error in out.values():
            if error is not None:
                raise error
    return out


def _partition_results(topics: list[ElectionTopicResult]
                       ) -> dict[TopicPartition, tuple[int, int, str | None]]:
    """``{partition: (error code, leader, message)}`` of a per-partition answer."""
    return {TopicPartition(t.name, a.partition): (a.error_code, a.leader, a.error_message)
            for t in topics for a in t.partitions}


def _raise_first(results: dict[TopicPartition, tuple[int, int, str | None]]) -> None:
    for tp, (code, _, message) in results.items():
        if code:
            raise error_from_code(code, message or f"{tp} failed")


def _described_error(response: Message) -> StrataError | None:
    """The first group error of a Describe/DeleteGroups answer (one group each)."""
    entries = getattr(response, "groups", None) or getattr(response, "results", None) or []
    for entry in entries:
        if entry.error_code:
            return error_from_code(entry.error_code, entry.error_message)
    return None


def reset_target_text(target: ResetTarget) -> str:
    if isinstance(target, datetime):
        return f"datetime {_aware(target).isoformat()}"
    if isinstance(target, int):
        return f"offset {target}"
    return target


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class AsyncAdmin:
    """asyncio admin client. Requests that any broker can answer (topic admin, configs,
    metadata) go to the first broker that answers; offsets go to each partition's leader."""

    def __init__(self, bootstrap_servers: str | list[str], *, client_id: str = "strata-admin",
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 **security: Unpack[SecurityOptions]) -> None:
        """``security`` (or kafka-python's ``security_protocol``, ``sasl_mechanism``,
        ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_*``): how to reach the
        brokers' listener (``wire.security.ClientSecurity``)."""
        unknown = set(security) - set(SecurityOptions.__annotations__)
        if unknown:
            raise TypeError(f"unknown admin option(s) {sorted(unknown)}")
        client_security, _ = security_of(security)
        if request_timeout_ms < 1000:
            raise ValueError(f"request_timeout_ms={request_timeout_ms} is too small; "
                             "use 1000 or more")
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._cluster = Cluster(bootstrap_servers, client_id=client_id,
                                request_timeout_ms=request_timeout_ms,
                                retry_backoff_ms=retry_backoff_ms, security=client_security)
        self._links: dict[str, CoordinatorLink] = {}
        self.schemas = SchemaSource(self._cluster, request_timeout_ms=request_timeout_ms,
                                    retry_backoff_ms=retry_backoff_ms)

    @property
    def _operation_timeout_ms(self) -> int:
        # The broker must give up before the client stops waiting, or a slow but
        # successful operation would look like a lost connection.
        return self.request_timeout_ms * 3 // 4

    # ------------------------------------------------------------------ topics
    async def create_topics(self, new_topics: Iterable[NewTopic], *, validate_only: bool = False,
                            raise_errors: bool = True) -> dict[str, StrataError | None]:
        """Create topics; returns once the broker that handled the request serves them.

        ``validate_only``: check names, counts and configs without creating anything.
        """
        topics = [CreatableTopic(t.name, t.num_partitions, t.replication_factor,
                                 [ConfigEntry(k, str(v)) for k, v in t.configs.items()])
                  for t in new_topics]
        if not topics:
            return {}
        response = await self._cluster.send_any(ApiKey.CREATE_TOPICS, CreateTopicsRequest(
            topics, timeout_ms=self._operation_timeout_ms, validate_only=validate_only))
        assert isinstance(response, CreateTopicsResponse)
        return _results(response.topics, raise_errors)

    async def delete_topics(self, names: Iterable[str], *, raise_errors: bool = True
                            ) -> dict[str, StrataError | None]:
        """Delete topics and their data; returns once the answering broker dropped them."""
        wanted = list(names)
        if not wanted:
            return {}
        response = await self._cluster.send_any(ApiKey.DELETE_TOPICS, DeleteTopicsRequest(
            wanted, timeout_ms=self._operation_timeout_ms))
        assert isinstance(response, DeleteTopicsResponse)
        for name in wanted:
            self._cluster.topics.pop(name, None)
        return _results(response.topics, raise_errors)

    async def list_topics(self) -> list[str]:
        """Every topic name, sorted."""
        response = await self._cluster.refresh()
        return sorted(t.name for t in response.topics if t.error_code == 0)

    async def describe_cluster(self) -> ClusterDescription:
        response = await self._cluster.refresh([])
        return ClusterDescription(response.cluster_id, response.controller_id,
                                  dict(self._cluster.brokers))

    async def _existing_topics(self, wanted: list[str] | None) -> MetadataResponse:
        """Fresh metadata of ``wanted`` (None: every topic); a missing topic raises
        ``UnknownTopicOrPartitionError``."""
        response = await self._cluster.refresh(wanted)
        for topic in response.topics:
            if topic.error_code:
                raise error_from_code(topic.error_code, f"topic {topic.name!r} does not exist; "
                                      "check the name (strata topic list)")
        return response

    async def describe_topics(self, names: Iterable[str] | None = None
                              ) -> dict[str, TopicDescription]:
        """Per partition: leader, replicas, ISR, log start, log end and high watermark.

        ``names=None`` describes every topic. Raises ``UnknownTopicOrPartitionError`` for a
        topic that does not exist.
        """
        wanted = None if names is None else list(names)
        if wanted == []:
            return {}
        response = await self._existing_topics(wanted)
        by_leader: dict[int, list[TopicPartition]] = {}
        for topic in response.topics:
            for p in topic.partitions:
                if p.leader >= 0:
                    by_leader.setdefault(p.leader, []).append(TopicPartition(topic.name,
                                                                             p.partition))
        offsets: dict[TopicPartition, tuple[int, int, int]] = {}
        found = await asyncio.gather(*(self._log_offsets(node, tps)
                                       for node, tps in by_leader.items()))
        for part in found:
            offsets.update(part)
        out: dict[str, TopicDescription] = {}
        for topic in sorted(response.topics, key=lambda t: t.name):
            partitions = []
            for p in sorted(topic.partitions, key=lambda p: p.partition):
                start, end, hw = offsets.get(TopicPartition(topic.name, p.partition),
                                             (-1, -1, -1))
                partitions.append(PartitionDescription(
                    p.partition, p.leader, p.leader_epoch, tuple(p.replicas), tuple(p.isr),
                    start, end, hw))
            out[topic.name] = TopicDescription(topic.name, tuple(partitions))
        return out

    async def _log_offsets(self, node: int, tps: list[TopicPartition]
                           ) -> dict[TopicPartition, tuple[int, int, int]]:
        """(log start, log end, high watermark) per partition led by ``node``."""
        timeout = self.request_timeout_ms / 1000
        latest = await list_offsets_once(self._cluster, dict.fromkeys(tps, LATEST_TIMESTAMP),
                                         timeout)
        hws = {tp: a.offset for tp, a in latest.items() if not isinstance(a, StrataError)}
        out: dict[TopicPartition, tuple[int, int, int]] = {}
        if not hws:
            return out
        topics = group_by_topic((tp.topic, FetchPartition(tp.partition, hw, 1))
                                for tp, hw in hws.items())
        request = FetchRequest([FetchTopic(t, ps) for t, ps in topics.items()],
                               max_wait_ms=0, min_bytes=1, max_bytes=1)
        with contextlib.suppress(StrataError, TimeoutError):
            connection = await self._cluster.connection(node)
            response = await asyncio.wait_for(connection.request(ApiKey.FETCH, request), timeout)
            assert isinstance(response, FetchResponse)
            for topic in response.topics:
                for a in topic.partitions:
                    tp = TopicPartition(topic.name, a.partition)
                    if a.error_code == 0:
                        out[tp] = (a.log_start_offset, a.log_end_offset, a.high_watermark)
                    elif a.error_code == OffsetOutOfRangeError.code:
                        out[tp] = (a.log_start_offset, -1, a.high_watermark)
        for tp, hw in hws.items():
            out.setdefault(tp, (-1, -1, hw))
        return out

    # ------------------------------------------------------------------ tiering
    async def describe_tier(self, names: Iterable[str]) -> dict[str, TopicTier]:
        """Closed segments and Delta tier progress of every partition of ``names``.

        Each partition is asked of its leader; leader moves are retried (see the module
        docstring) until the request timeout, then the last error is raised. Raises
        ``UnknownTopicOrPartitionError`` for a topic that does not exist. Works for
        topics without ``tier.enable`` too (``TopicTier.enabled`` is then false).
        """
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        response = await self._existing_topics(wanted)
        pending = {TopicPartition(t.name, p.partition)
                   for t in response.topics for p in t.partitions}
        topics: dict[str, DescribeTierTopicResponse] = {}
        answers: dict[TopicPartition, DescribeTierPartitionResponse] = {}
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        attempt = 0
        while True:
            last_error: StrataError | None = None
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in sorted(pending):
                try:
                    by_leader.setdefault(await self._cluster.leader_for(*tp), []).append(tp)
                except StrataError as err:
                    if not is_transient(err):
                        raise
                    last_error = err
            remaining = max(deadline - time.monotonic(), 0.001)
            rounds = await asyncio.gather(*(self._describe_tier_at(node, tps, remaining)
                                            for node, tps in by_leader.items()))
            for found_topics, found in rounds:
                topics.update(found_topics)
                for tp, answer in found.items():
                    if isinstance(answer, StrataError):
                        if not is_transient(answer):
                            raise answer
                        last_error = answer
                        continue
                    answers[tp] = answer
                    pending.discard(tp)
            if not pending:
                break
            if time.monotonic() >= deadline:
                raise last_error or NetworkError("DescribeTier got no answer in time; retry")
            if attempt:  # the first retry only refreshes metadata; later ones back off too
                await self._cluster.backoff(attempt)
            attempt += 1
            with contextlib.suppress(StrataError, TimeoutError):
                await self._cluster.refresh(sorted({tp.topic for tp in pending}))
        out: dict[str, TopicTier] = {}
        for name in wanted:
            described = topics.get(name) or DescribeTierTopicResponse(name, 0)
            partitions = {
                tp.partition: PartitionTier(
                    name, tp.partition, a.log_start_offset, a.high_watermark, a.tiered_up_to,
                    a.tier_start_offset,
                    tuple(SegmentInfo(s.base_offset, s.next_offset, s.max_timestamp,
                                      s.size_bytes) for s in a.segments))
                for tp, a in sorted(answers.items()) if tp.topic == name}
            out[name] = TopicTier(name, described.tier_enabled, described.tier_after_ms,
                                  described.table, partitions)
        return out

    async def _describe_tier_at(
            self, node: int, tps: list[TopicPartition], timeout_s: float
    ) -> tuple[dict[str, DescribeTierTopicResponse],
               dict[TopicPartition, DescribeTierPartitionResponse | StrataError]]:
        """One ``DescribeTier`` to ``node``: topic answers and per-partition answers or
        errors (a failed request or topic error is every partition's error)."""
        by_topic = group_by_topic(tps)
        request = DescribeTierRequest([DescribeTierTopic(t, ps) for t, ps in by_topic.items()])
        try:
            connection = await self._cluster.connection(node)
            response = await asyncio.wait_for(
                connection.request(ApiKey.DESCRIBE_TIER, request), timeout_s)
        except (StrataError, TimeoutError) as err:
            failed = err if isinstance(err, StrataError) else \
                NetworkError(f"broker {node} did not answer DescribeTier in time")
            return {}, dict.fromkeys(tps, failed)
        assert isinstance(response, DescribeTierResponse)
        topics: dict[str, DescribeTierTopicResponse] = {}
        out: dict[TopicPartition, DescribeTierPartitionResponse | StrataError] = {}
        for topic in response.topics:
            if topic.error_code:
                error = error_from_code(topic.error_code, topic.error_message)
                out.update((TopicPartition(topic.name, p), error)
                           for p in by_topic.get(topic.name, []))
                continue
            topics[topic.name] = topic
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                out[tp] = answer if answer.error_code == 0 else \
                    error_from_code(answer.error_code, answer.error_message)
        for tp in tps:
            out.setdefault(tp, NetworkError(f"{tp}: broker {node}'s answer left it out"))
        return topics, out

    # ------------------------------------------------------------------ client quotas
    async def describe_client_quotas(self) -> dict[tuple[str | None, str | None],
                                                   dict[str, int]]:
        """Every quota: ``(user, None)`` or ``(None, client_id)`` (``"<default>"``: the
        default) -> ``{key: limit}``; needs DESCRIBE on the cluster."""
        response = await self._cluster.send_any(ApiKey.DESCRIBE_CLIENT_QUOTAS,
                                                DescribeClientQuotasRequest())
        assert isinstance(response, DescribeClientQuotasResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        return {(e.user, e.client_id): {v.key: v.value for v in e.values}
                for e in response.entries}

    async def alter_client_quotas(self, *, user: str | None = None,
                                  client_id: str | None = None,
                                  set: Mapping[str, int] | None = None,
                                  remove: Iterable[str] = ()) -> None:
        """Set and/or remove quota keys (``producer_byte_rate``, ``consumer_byte_rate``,
        ``request_rate``) of one user or one client id (``"<default>"`` for the
        default); needs ALTER on the cluster."""
        alterations = [QuotaAlteration(user, client_id, k, int(v))
                       for k, v in (set or {}).items()]
        alterations += [QuotaAlteration(user, client_id, k, 0, True) for k in remove]
        response = await self._cluster.send_any(ApiKey.ALTER_CLIENT_QUOTAS,
                                                AlterClientQuotasRequest(alterations))
        assert isinstance(response, AlterClientQuotasResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)

    # ------------------------------------------------------------------ ACLs
    async def create_acls(self, acls: Iterable[AclEntry]) -> None:
        """Add ACL bindings (Kafka's CreateAcls); needs ALTER on the cluster. A bad
        binding raises ``InvalidRequestError`` naming what is wrong (the good ones in the
        same call are added)."""
        entries = list(acls)
        response = await self._cluster.send_any(ApiKey.CREATE_ACLS, CreateAclsRequest(entries))
        assert isinstance(response, CreateAclsResponse)
        for result in response.results:
            if result.error_code:
                raise error_from_code(result.error_code, result.error_message)

    async def describe_acls(self, acl_filter: AclFilterEntry | None = None) -> list[AclEntry]:
        """The bindings ``acl_filter`` matches (default: all); needs DESCRIBE on the
        cluster."""
        response = await self._cluster.send_any(
            ApiKey.DESCRIBE_ACLS, DescribeAclsRequest(acl_filter or AclFilterEntry()))
        assert isinstance(response, DescribeAclsResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        return list(response.acls)

    async def delete_acls(self, filters: Iterable[AclFilterEntry]) -> list[AclEntry]:
        """Remove every binding each filter matches; returns the removed ones."""
        response = await self._cluster.send_any(ApiKey.DELETE_ACLS,
                                                DeleteAclsRequest(list(filters)))
        assert isinstance(response, DeleteAclsResponse)
        removed: list[AclEntry] = []
        for result in response.results:
            if result.error_code:
                raise error_from_code(result.error_code, result.error_message)
            removed.extend(result.deleted)
        return removed

    # ------------------------------------------------------------------ SCRAM users
    async def upsert_scram_credential(self, user: str, password: str, *,
                                      mechanism: str = "SCRAM-SHA-256",
                                      iterations: int = MIN_ITERATIONS) -> None:
        """Create ``user`` (or change its password) for ``mechanism``. Only a salted
        hash leaves this process (Kafka's AlterUserScramCredentials): the password is
        never sent, and never stored."""
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"mechanism={mechanism!r} is not valid; use "
                             f"{' or '.join(SCRAM_MECHANISMS)}")
        if not password:
            raise ValueError("the password is empty")
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"iterations={iterations} is not valid; use "
                             f"{MIN_ITERATIONS}..{MAX_ITERATIONS}")
        salt = secrets.token_bytes(32)
        upsert = ScramCredentialUpsertion(user, mechanism, iterations, salt,
                                          salted_password(mechanism, password, salt,
                                                          iterations))
        await self._alter_scram(AlterUserScramCredentialsRequest([], [upsert]))

    async def delete_scram_credential(self, user: str, mechanism: str = "SCRAM-SHA-256"
                                      ) -> None:
        """Remove ``user``'s credential for ``mechanism`` (the user goes with its last
        one); brokers close the connections that logged in with it."""
        await self._alter_scram(AlterUserScramCredentialsRequest(
            [ScramCredentialDeletion(user, mechanism)], []))

    async def _alter_scram(self, request: AlterUserScramCredentialsRequest) -> None:
        response = await self._cluster.send_any(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, request)
        assert isinstance(response, AlterUserScramCredentialsResponse)
        for result in response.results:
            if result.error_code:
                raise error_from_code(result.error_code, result.error_message)

    async def describe_scram_credentials(self, users: Iterable[str] | None = None
                                         ) -> dict[str, dict[str, int]]:
        """``{user: {mechanism: iterations}}`` (never a key or salt); ``users`` None:
        every user. A named user without a credential raises ``ResourceNotFoundError``."""
        response = await self._cluster.send_any(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            DescribeUserScramCredentialsRequest(None if users is None else list(users)))
        assert isinstance(response, DescribeUserScramCredentialsResponse)
        out: dict[str, dict[str, int]] = {}
        for user in response.users:
            if user.error_code:
                raise error_from_code(user.error_code, user.error_message)
            out[user.user] = {c.mechanism: c.iterations for c in user.credentials}
        return out

    # ------------------------------------------------------------------ tier lease
    async def acquire_tier_lease(self, topic: str, owner: str, ttl_ms: int) -> TierLease:
        """Take ``topic``'s tiering lease for ``ttl_ms`` (renew it well within that).

        Raises ``TierJobBusyError`` while another job holds an unexpired lease,
        ``UnknownTopicOrPartitionError``, ``InvalidRequestError`` (``ttl_ms`` outside
        1 s..10 min) or ``BrokerNotAvailableError`` (ZooKeeper unreachable: retry).
        """
        response = await self._cluster.send_any(
            ApiKey.TIER_LEASE, TierLeaseRequest(topic, owner, None, ttl_ms))
        assert isinstance(response, TierLeaseResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        assert response.lease_id is not None and response.topic_id is not None
        return TierLease(topic, response.lease_id, response.topic_id,
                         {c.partition: c.merged_up_to for c in response.compacted})

    async def renew_tier_lease(self, topic: str, lease_id: str, ttl_ms: int) -> None:
        """Extend the lease by ``ttl_ms`` from now; ``TierLeaseLostError`` when it is
        gone (expired and taken by another job, or the topic was deleted)."""
        response = await self._cluster.send_any(
            ApiKey.TIER_LEASE, TierLeaseRequest(topic, "", lease_id, ttl_ms))
        assert isinstance(response, TierLeaseResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)

    async def release_tier_lease(self, topic: str, lease_id: str) -> None:
        """Give the lease up (nothing happens when it is no longer this one)."""
        response = await self._cluster.send_any(
            ApiKey.TIER_LEASE, TierLeaseRequest(topic, "", lease_id, 0, release=True))
        assert isinstance(response, TierLeaseResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)

    async def update_tier(self, topic: str, lease_id: str, topic_id: str, *,
                          table: str | None = None,
                          progress: Mapping[int, tuple[int, int]] | None = None,
                          merged: Mapping[int, int] | None = None
                          ) -> dict[int, StoredTierProgress]:
        """Record a tiering job's progress under its lease, in one request.

        ``table``: the topic's Delta table; ``progress``: ``{partition: (tiered_up_to,
        tier_start)}``; ``merged``: ``{partition: merged_up_to}`` of the compacted
        table. Offsets never move back (the stored value wins over a smaller one); the
        brokers check the lease and ``topic_id`` in each write's own ZooKeeper
        transaction. Returns what is stored afterwards per partition named. Raises
        ``TierLeaseLostError``, ``UnknownTopicOrPartitionError`` (deleted or re-created),
        ``InvalidRequestError`` (before anything is written) or
        ``BrokerNotAvailableError``.
        """
        progress, merged = progress or {}, merged or {}
        updates = [TierProgressUpdate(p, *progress.get(p, (-1, -1)), merged.get(p, -1))
                   for p in sorted({*progress, *merged})]
        response = await self._cluster.send_any(
            ApiKey.UPDATE_TIER, UpdateTierRequest(topic, lease_id, topic_id, table, updates))
        assert isinstance(response, UpdateTierResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        return {u.partition: StoredTierProgress(u.partition, u.tiered_up_to, u.tier_start,
                                                u.merged_up_to)
                for u in response.partitions}

    # ------------------------------------------------------------------ configs
    async def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, ConfigValue]]:
        """Every topic config key with its effective value, per topic."""
        wanted = list(names)
        if not wanted:
            return {}
        response = await self._cluster.send_any(ApiKey.DESCRIBE_CONFIGS,
                                                DescribeConfigsRequest(wanted))
        assert isinstance(response, DescribeConfigsResponse)
        out: dict[str, dict[str, ConfigValue]] = {}
        for topic in response.topics:
            if topic.error_code:
                raise error_from_code(topic.error_code, topic.error_message)
            out[topic.name] = {c.name: ConfigValue(c.name, c.value, c.is_default)
                               for c in topic.configs}
        return out

    async def alter_configs(self, name: str, set: Mapping[str, str | int] | None = None,
                            delete: Iterable[str] = (), *, validate_only: bool = False) -> None:
        """Set and/or remove config overrides of one topic, atomically.

        Keys in ``delete`` fall back to the broker default. The whole change is validated
        first; on any error nothing changes and the typed error is raised.
        """
        entries = [ConfigEntry(k, str(v)) for k, v in (set or {}).items()]
        response = await self._cluster.send_any(ApiKey.ALTER_CONFIGS, AlterConfigsRequest(
            [AlterConfigsTopic(name, entries, list(delete))], validate_only=validate_only))
        assert isinstance(response, AlterConfigsResponse)
        _results(response.topics, raise_errors=True)

    # ------------------------------------------------------------------ replicas
    async def elect_preferred_leaders(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, ElectionResult]:
        """Move leadership back to each partition's preferred replica (its first assigned
        replica) where that replica is alive and in sync; ``None``: every partition.

        Returns once the controller acted, with each partition's leader after the
        election. A partition whose preferred replica could not take over keeps its
        leader; its ``ElectionResult.message`` says why (not an error). Raises the first
        failed partition's typed error (``UnknownTopicOrPartitionError`` for a partition
        that does not exist; ``RequestTimedOutError`` when the controller did not act in
        time, the election may still happen; ``ConcurrentUpdateError`` while another
        election runs); the broker still elected the other partitions.
        """
        request: list[ElectionTopic] | None = None
        if partitions is not None:
            request = [ElectionTopic(t, list(dict.fromkeys(ps)))  # each partition once
                       for t, ps in group_by_topic(partitions).items()]
            if not request:
                return {}
        response = await self._cluster.send_any(ApiKey.ELECT_LEADERS, ElectLeadersRequest(
            request, timeout_ms=self._operation_timeout_ms))
        assert isinstance(response, ElectLeadersResponse)
        results = _partition_results(response.topics)
        _raise_first(results)
        return {tp: ElectionResult(leader, message)
                for tp, (_, leader, message) in sorted(results.items())}

    async def alter_partition_reassignments(
            self, targets: Mapping[TopicPartition | tuple[str, int], Sequence[int]]) -> None:
        """Move partitions onto new replica lists (first = preferred leader).

        Returns as soon as the targets are recorded; the controller then moves each
        partition in the background: the new replicas copy the log from the leader, and
        once all of them are in the ISR leadership moves (if the leader is not kept) and
        the leaving replicas drop their copies. Follow it with
        ``list_partition_reassignments`` / ``describe_topics``. A new target for a
        partition still moving replaces the old one.

        Raises the first failed partition's typed error: ``UnknownTopicOrPartitionError``
        (no such partition), ``InvalidReplicationFactorError`` (empty list, a broker
        listed twice, a broker that is not live). The broker recorded every partition
        that did not fail.
        """
        topics = group_by_topic(
            (topic, ReassignablePartition(partition, [int(b) for b in replicas]))
            for (topic, partition), replicas in targets.items())
        if not topics:
            return
        response = await self._cluster.send_any(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS, AlterPartitionReassignmentsRequest(
                [ReassignableTopic(t, ps) for t, ps in topics.items()],
                timeout_ms=self._operation_timeout_ms))
        assert isinstance(response, AlterPartitionReassignmentsResponse)
        _raise_first(_partition_results(response.topics))

    async def list_partition_reassignments(self) -> dict[TopicPartition, Reassignment]:
        """The reassignments still in progress, every topic, sorted by partition."""
        response = await self._cluster.send_any(ApiKey.LIST_PARTITION_REASSIGNMENTS,
                                                ListPartitionReassignmentsRequest())
        assert isinstance(response, ListPartitionReassignmentsResponse)
        return {TopicPartition(r.topic, r.partition):
                Reassignment(tuple(r.replicas), tuple(r.adding), tuple(r.removing))
                for r in sorted(response.reassignments, key=lambda r: (r.topic, r.partition))}

    # ------------------------------------------------------------------ offsets
    async def list_offsets(self, specs: Mapping[TopicPartition, OffsetSpec]
                           ) -> dict[TopicPartition, ListOffsetsResult]:
        """Offsets per partition: ``"earliest"`` (log start), ``"latest"`` (high
        watermark: the next committed offset) or the first offset whose timestamp is at or
        after a timestamp in ms (``-1`` when none is)."""
        wanted = {TopicPartition(*tp): _spec_timestamp(TopicPartition(*tp), spec)
                  for tp, spec in specs.items()}
        if not wanted:
            return {}
        answers = await list_offsets(self._cluster, wanted,
                                     timeout_s=self.request_timeout_ms / 1000)
        return {tp: ListOffsetsResult(a.offset, a.timestamp, a.leader_epoch)
                for tp, a in answers.items()}

    # ------------------------------------------------------------------ groups
    def _link(self, group_id: str) -> CoordinatorLink:
        if not isinstance(group_id, str) or not group_id:
            raise ValueError(f"group id {group_id!r} is not valid; give a non-empty name")
        link = self._links.get(group_id)
        if link is None:
            link = self._links[group_id] = CoordinatorLink(
                self._cluster, group_id, request_timeout_ms=self.request_timeout_ms,
                retry_backoff_ms=self.retry_backoff_ms)
        return link

    async def find_coordinator(self, group_id: str) -> CoordinatorAddress:
        """The broker coordinating ``group_id`` now (node id, host, port)."""
        link = self._link(group_id)
        link.invalidate()
        return await link.find()

    async def list_groups(self) -> list[GroupListing]:
        """Every group of the cluster, sorted by id: each live broker lists the groups it
        coordinates. A broker that does not answer within the request timeout makes
        this raise (a partial list would hide groups)."""
        await self._cluster.refresh([])
        deadline = time.monotonic() + self.request_timeout_ms / 1000

        async def ask(node: int) -> list[GroupListing]:
            attempt = 0
            while True:
                try:
                    connection = await self._cluster.connection(node)
                    response = await asyncio.wait_for(
                        connection.request(ApiKey.LIST_GROUPS, ListGroupsRequest()),
                        max(deadline - time.monotonic(), 0.001))
                    assert isinstance(response, ListGroupsResponse)
                    if response.error_code == 0:
                        return [GroupListing(g.group_id, g.state, g.assignor, g.members, node)
                                for g in response.groups]
                    error = error_from_code(response.error_code, None)
                except (StrataError, TimeoutError) as err:
                    error = err if isinstance(err, StrataError) else \
                        NetworkError(f"broker {node} did not answer ListGroups in time")
                if not is_transient(error) or time.monotonic() >= deadline:
                    raise error
                await self._cluster.backoff(attempt)
                attempt += 1
                with contextlib.suppress(StrataError, TimeoutError):
                    await self._cluster.refresh([])
                if node not in self._cluster.brokers:
                    return []  # it died: its groups are listed by their new coordinators

        found = await asyncio.gather(*(ask(node) for node in sorted(self._cluster.brokers)))
        merged: dict[str, GroupListing] = {}
        for listing in (g for part in found for g in part):
            # During a coordinator move two brokers may list a group; the one with members
            # is the live copy.
            known = merged.get(listing.group_id)
            if known is None or listing.members > known.members:
                merged[listing.group_id] = listing
        return [merged[g] for g in sorted(merged)]

    async def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """State, assignor, epoch and members (assignment, target) of each group. Raises
        ``GroupIdNotFoundError`` for a group with no members and no committed offsets."""
        wanted = list(dict.fromkeys(group_ids))
        found = await asyncio.gather(*(self._describe_group(g) for g in wanted))
        return dict(zip(wanted, found, strict=True))

    async def describe_group(self, group_id: str) -> GroupDescription:
        return await self._describe_group(group_id)

    async def _describe_group(self, group_id: str) -> GroupDescription:
        link = self._link(group_id)
        response = await link.request(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest([group_id]),
                                      check=_described_error)
        assert isinstance(response, DescribeGroupsResponse)
        described: DescribedGroup = response.groups[0]
        coordinator = await link.find()

        def tps(topics: Iterable[Any]) -> tuple[TopicPartition, ...]:
            return tuple(sorted(TopicPartition(t.topic, p) for t in topics for p in t.partitions))

        members = tuple(MemberDescription(
            m.member_id, m.instance_id, m.client_id, m.member_epoch,
            tuple(m.subscribed_topics), tps(m.assignment), tps(m.target))
            for m in described.members)
        return GroupDescription(group_id, described.state, described.assignor,
                                described.group_epoch, coordinator, members)

    async def _describe_or_none(self, group_id: str) -> GroupDescription | None:
        try:
            return await self._describe_group(group_id)
        except GroupIdNotFoundError:
            return None

    async def list_group_offsets(
            self, group_id: str,
            partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets (``None``: every committed partition), sorted;
        partitions with nothing committed are left out."""
        wanted = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        if wanted == []:
            return {}
        response = await self._link(group_id).fetch_offsets(wanted)
        out = {TopicPartition(t.name, a.partition):
               CommittedOffset(a.offset, a.metadata, a.commit_timestamp)
               for t in response.topics for a in t.partitions if a.offset >= 0}
        return dict(sorted(out.items()))

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Per partition the group has committed or a member owns: committed offset, log
        end (high watermark), lag and owning member; sorted by topic and partition.
        Raises ``GroupIdNotFoundError`` for an unknown group."""
        description = await self._describe_group(group_id)
        committed = await self.list_group_offsets(group_id)
        partitions = set(committed)
        for member in description.members:
            partitions.update(member.assignment)
        ends = await self._high_watermarks(partitions)
        out: list[PartitionLag] = []
        for tp in sorted(partitions):
            current = committed[tp].offset if tp in committed else None
            end = ends.get(tp, -1)
            owner = description.owner(tp)
            out.append(PartitionLag(
                tp.topic, tp.partition, current, end,
                max(end - current, 0) if current is not None and end >= 0 else None,
                owner.member_id if owner else None, owner.instance_id if owner else None,
                owner.client_id if owner else None))
        return out

    async def _high_watermarks(self, partitions: Iterable[TopicPartition]
                               ) -> dict[TopicPartition, int]:
        """High watermark per partition; partitions of deleted topics are left out."""
        out: dict[TopicPartition, int] = {}
        for tps in group_by_topic((tp.topic, tp) for tp in partitions).values():
            try:
                answers = await list_offsets(self._cluster, dict.fromkeys(tps, LATEST_TIMESTAMP),
                                             timeout_s=self.request_timeout_ms / 1000)
            except StrataError as err:
                if is_transient(err) and not isinstance(err, UnknownTopicOrPartitionError):
                    raise
                continue  # the topic (or partition) no longer exists
            out.update({tp: a.offset for tp, a in answers.items()})
        return out

    async def reset_group_offsets(
            self, group_id: str, topic: str, to: ResetTarget, *,
            partitions: Iterable[int] | None = None, execute: bool = False) -> ResetPlan:
        """Plan (and with ``execute``, commit) new offsets for ``topic``'s partitions
        (``None``: all of them) in ``group_id``.

        Everything is checked before anything is written: the target, the topic and
        partitions, and, to execute, that the group has no members (``NonEmptyGroupError``
        otherwise: a member's next commit would overwrite the reset). The commit is made
        outside any membership (member epoch -1).
        """
        target_text = reset_target_text(to)
        if isinstance(to, bool) or not (to in ("earliest", "latest") or isinstance(
                to, datetime) or (isinstance(to, int) and to >= 0)):
            raise ValueError(f"reset target {to!r} is not valid; use 'earliest', 'latest', "
                             "an offset >= 0 or a datetime")
        link = self._link(group_id)
        description = (await self.describe_topics([topic]))[topic]
        existing = [p.partition for p in description.partitions]
        chosen = existing if partitions is None else list(dict.fromkeys(partitions))
        missing = sorted(set(chosen) - set(existing))
        if missing:
            raise UnknownTopicOrPartitionError(
                f"{topic} has partitions 0..{len(existing) - 1}; "
                f"{', '.join(map(str, missing))} do(es) not exist")
        tps = [TopicPartition(topic, p) for p in sorted(chosen)]
        timeout = self.request_timeout_ms / 1000
        starts = await list_offsets(self._cluster, dict.fromkeys(tps, EARLIEST_TIMESTAMP),
                                    timeout_s=timeout)
        ends = await list_offsets(self._cluster, dict.fromkeys(tps, LATEST_TIMESTAMP),
                                  timeout_s=timeout)
        by_time: dict[TopicPartition, int] = {}
        if isinstance(to, datetime):
            ms = int(_aware(to).timestamp() * 1000)
            if ms < 0:
                raise ValueError(f"{to.isoformat()} is before 1970; give a later time")
            answers = await list_offsets(self._cluster, dict.fromkeys(tps, ms),
                                         timeout_s=timeout)
            by_time = {tp: a.offset for tp, a in answers.items()}
        committed = await link.committed(tps)
        planned: list[OffsetReset] = []
        for tp in tps:
            start, end = starts[tp].offset, ends[tp].offset
            if to == "earliest":
                new = start
            elif to == "latest":
                new = end
            elif isinstance(to, datetime):
                new = by_time[tp] if by_time.get(tp, -1) >= 0 else end
            else:
                new = min(max(to, start), end)
            planned.append(OffsetReset(topic, tp.partition, committed.get(tp), new, start, end))
        if not execute:
            return ResetPlan(group_id, topic, target_text, tuple(planned), False)
        group = await self._describe_or_none(group_id)
        if group is not None and group.members:
            raise NonEmptyGroupError(
                f"group {group_id!r} has {len(group.members)} active member(s); stop its "
                "consumers first (their commits would overwrite the reset), then run the "
                "reset again. Nothing was changed")
        done, failed = await link.commit(None, -1, {TopicPartition(r.topic, r.partition):
                                                    r.new_offset for r in planned})
        if failed:
            _, error = sorted(failed.items())[0]
            if done:
                log.warning("group %s: only %s were reset", group_id,
                            ", ".join(str(tp) for tp in sorted(done)))
            raise error
        return ResetPlan(group_id, topic, target_text, tuple(planned), True)

    async def delete_groups(self, group_ids: Iterable[str], *, raise_errors: bool = True
                            ) -> dict[str, StrataError | None]:
        """Delete groups with no members and their committed offsets. Raises the first
        failure (``NonEmptyGroupError``: stop its consumers first; ``GroupIdNotFoundError``)
        unless ``raise_errors=False``, which returns ``{group: None | error}``."""
        wanted = list(dict.fromkeys(group_ids))

        async def delete(group_id: str) -> StrataError | None:
            link = self._link(group_id)

            def coordinator_error(response: Message) -> StrataError | None:
                error = _described_error(response)
                return error if error is not None and is_transient(error) else None

            response = await link.request(ApiKey.DELETE_GROUPS, DeleteGroupsRequest([group_id]),
                                          check=coordinator_error)
            assert isinstance(response, DeleteGroupsResponse)
            result = response.results[0]
            return error_from_code(result.error_code, result.error_message) \
                if result.error_code else None

        found = await asyncio.gather(*(delete(g) for g in wanted))
        out = dict(zip(wanted, found, strict=True))
        if raise_errors:
            for error in out.values():
                if error is not None:
                    raise error
        return out

    async def delete_group(self, group_id: str) -> None:
        await self.delete_groups([group_id])

    # ------------------------------------------------------------------ lifecycle
    # ------------------------------------------------------------------ schema registry
    async def schema_request(self, request: SchemaRegistryRequest) -> RegistryAnswer:
        """Any registry operation, answered as Confluent's REST API would (the gateway's
        routes pass these through); errors are in the answer, not raised."""
        return await self.schemas.ask(request)

    async def register_schema(self, subject: str, schema: str, schema_type: str = "AVRO"
                              ) -> int:
        """Register ``schema`` under ``subject`` (a new version unless it is already
        there); its global id. ``IncompatibleSchemaError`` lists each reason."""
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "register", subject, schema=schema, schema_type=schema_type))).result()
        return int(body["id"])

    async def get_schema(self, subject: str, version: int | Literal["latest"] = "latest",
                         *, include_deleted: bool = False) -> RegisteredSchema:
        number = -1 if version == "latest" else int(version)
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "get_version", subject, version=number, include_deleted=include_deleted))
        ).result()
        return RegisteredSchema(int(body["id"]), body["schema"],
                                body.get("schemaType", "AVRO"), body["subject"],
                                int(body["version"]))

    async def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "get_by_id", schema_id=schema_id))).result()
        return RegisteredSchema(schema_id, body["schema"], body.get("schemaType", "AVRO"))

    async def list_subjects(self, *, include_deleted: bool = False) -> list[str]:
        return list((await self.schemas.ask(SchemaRegistryRequest(
            "list_subjects", include_deleted=include_deleted))).result())

    async def list_schema_versions(self, subject: str, *, include_deleted: bool = False
                                   ) -> list[int]:
        return list((await self.schemas.ask(SchemaRegistryRequest(
            "list_versions", subject, include_deleted=include_deleted))).result())

    async def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Soft-delete every version (``permanent``: remove soft-deleted ones for good)."""
        return list((await self.schemas.ask(SchemaRegistryRequest(
            "delete_subject", subject, permanent=permanent))).result())

    async def delete_schema_version(self, subject: str, version: int | Literal["latest"],
                                    *, permanent: bool = False) -> int:
        number = -1 if version == "latest" else int(version)
        return int((await self.schemas.ask(SchemaRegistryRequest(
            "delete_version", subject, version=number, permanent=permanent))).result())

    async def check_schema_compatibility(
            self, subject: str, schema: str, schema_type: str = "AVRO",
            version: int | Literal["latest"] = "latest") -> list[str]:
        """Why ``schema`` could not be registered under ``subject`` (empty: it could)."""
        number = -1 if version == "latest" else int(version)
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "check_compatibility", subject, version=number, schema=schema,
            schema_type=schema_type))).result()
        return list(body["messages"])

    async def value_subjects(self, names: Iterable[str]) -> dict[str, str | None]:
        """Each topic's value subject (a typed topic's ``value.schema.subject``; None: a
        bytes topic), from the metadata: DESCRIBE on a topic is enough to see it."""
        wanted = list(names)
        if not wanted:
            return {}
        response = await self._cluster.refresh(wanted)
        out: dict[str, str | None] = {}
        for topic in response.topics:
            if topic.error_code:
                raise error_from_code(topic.error_code, f"topic {topic.name!r}: not "
                                      "described (it does not exist, or this principal "
                                      "may not DESCRIBE it)")
            out[topic.name] = topic.value_subject
        return out

    async def get_compatibility(self, subject: str | None = None) -> str:
        """The level that applies to ``subject`` (None: the global level)."""
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "get_config", subject, default_to_global=True))).result()
        return str(body["compatibilityLevel"])

    async def set_compatibility(self, level: str, subject: str | None = None) -> str:
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "set_config", subject, compatibility=level))).result()
        return str(body["compatibility"])

    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Admin:
    """Blocking admin client: an ``AsyncAdmin`` on a private event-loop thread. Same
    arguments and methods as ``AsyncAdmin``."""

    def __init__(self, bootstrap_servers: str | list[str], *, client_id: str = "strata-admin",
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 **security: Unpack[SecurityOptions]) -> None:
        self._admin = AsyncAdmin(bootstrap_servers, client_id=client_id,
                                 request_timeout_ms=request_timeout_ms,
                                 retry_backoff_ms=retry_backoff_ms, **security)
        self._thread = EventLoopThread("strata-admin")

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._thread.run(coroutine)

    def create_topics(self, new_topics: Iterable[NewTopic], *, validate_only: bool = False,
                      raise_errors: bool = True) -> dict[str, StrataError | None]:
        return self._run(self._admin.create_topics(
            list(new_topics), validate_only=validate_only, raise_errors=raise_errors))

    def delete_topics(self, names: Iterable[str], *, raise_errors: bool = True
                      ) -> dict[str, StrataError | None]:
        return self._run(self._admin.delete_topics(list(names), raise_errors=raise_errors))

    def list_topics(self) -> list[str]:
        return self._run(self._admin.list_topics())

    def describe_cluster(self) -> ClusterDescription:
        return self._run(self._admin.describe_cluster())

    def describe_topics(self, names: Iterable[str] | None = None
                        ) -> dict[str, TopicDescription]:
        return self._run(self._admin.describe_topics(None if names is None else list(names)))

    def describe_tier(self, names: Iterable[str]) -> dict[str, TopicTier]:
        return self._run(self._admin.describe_tier(list(names)))

    def acquire_tier_lease(self, topic: str, owner: str, ttl_ms: int) -> TierLease:
        return self._run(self._admin.acquire_tier_lease(topic, owner, ttl_ms))

    def create_acls(self, acls: Iterable[AclEntry]) -> None:
        self._run(self._admin.create_acls(list(acls)))

    def describe_client_quotas(self) -> dict[tuple[str | None, str | None], dict[str, int]]:
        return self._run(self._admin.describe_client_quotas())

    def alter_client_quotas(self, *, user: str | None = None, client_id: str | None = None,
                            set: Mapping[str, int] | None = None,
                            remove: Iterable[str] = ()) -> None:
        self._run(self._admin.alter_client_quotas(user=user, client_id=client_id, set=set,
                                                  remove=list(remove)))

    def describe_acls(self, acl_filter: AclFilterEntry | None = None) -> list[AclEntry]:
        return self._run(self._admin.describe_acls(acl_filter))

    def delete_acls(self, filters: Iterable[AclFilterEntry]) -> list[AclEntry]:
        return self._run(self._admin.delete_acls(list(filters)))

    def upsert_scram_credential(self, user: str, password: str, *,
                                mechanism: str = "SCRAM-SHA-256",
                                iterations: int = MIN_ITERATIONS) -> None:
        self._run(self._admin.upsert_scram_credential(user, password, mechanism=mechanism,
                                                      iterations=iterations))

    def delete_scram_credential(self, user: str, mechanism: str = "SCRAM-SHA-256") -> None:
        self._run(self._admin.delete_scram_credential(user, mechanism))

    def describe_scram_credentials(self, users: Iterable[str] | None = None
                                   ) -> dict[str, dict[str, int]]:
        return self._run(self._admin.describe_scram_credentials(
            None if users is None else list(users)))

    def renew_tier_lease(self, topic: str, lease_id: str, ttl_ms: int) -> None:
        self._run(self._admin.renew_tier_lease(topic, lease_id, ttl_ms))

    def release_tier_lease(self, topic: str, lease_id: str) -> None:
        self._run(self._admin.release_tier_lease(topic, lease_id))

    def update_tier(self, topic: str, lease_id: str, topic_id: str, *,
                    table: str | None = None,
                    progress: Mapping[int, tuple[int, int]] | None = None,
                    merged: Mapping[int, int] | None = None) -> dict[int, StoredTierProgress]:
        return self._run(self._admin.update_tier(topic, lease_id, topic_id, table=table,
                                                 progress=progress, merged=merged))

    def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, ConfigValue]]:
        return self._run(self._admin.describe_configs(list(names)))

    def alter_configs(self, name: str, set: Mapping[str, str | int] | None = None,
                      delete: Iterable[str] = (), *, validate_only: bool = False) -> None:
        self._run(self._admin.alter_configs(name, set, list(delete),
                                            validate_only=validate_only))

    def elect_preferred_leaders(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, ElectionResult]:
        return self._run(self._admin.elect_preferred_leaders(
            None if partitions is None else list(partitions)))

    def alter_partition_reassignments(
            self, targets: Mapping[TopicPartition | tuple[str, int], Sequence[int]]) -> None:
        self._run(self._admin.alter_partition_reassignments(targets))

    def list_partition_reassignments(self) -> dict[TopicPartition, Reassignment]:
        return self._run(self._admin.list_partition_reassignments())

    def list_offsets(self, specs: Mapping[TopicPartition, OffsetSpec]
                     ) -> dict[TopicPartition, ListOffsetsResult]:
        return self._run(self._admin.list_offsets(specs))

    def find_coordinator(self, group_id: str) -> CoordinatorAddress:
        return self._run(self._admin.find_coordinator(group_id))

    def list_groups(self) -> list[GroupListing]:
        return self._run(self._admin.list_groups())

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        return self._run(self._admin.describe_groups(list(group_ids)))

    def describe_group(self, group_id: str) -> GroupDescription:
        return self._run(self._admin.describe_group(group_id))

    def list_group_offsets(
            self, group_id: str,
            partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        return self._run(self._admin.list_group_offsets(
            group_id, None if partitions is None else list(partitions)))

    def group_lag(self, group_id: str) -> list[PartitionLag]:
        return self._run(self._admin.group_lag(group_id))

    def reset_group_offsets(self, group_id: str, topic: str, to: ResetTarget, *,
                            partitions: Iterable[int] | None = None,
                            execute: bool = False) -> ResetPlan:
        return self._run(self._admin.reset_group_offsets(
            group_id, topic, to, partitions=None if partitions is None else list(partitions),
            execute=execute))

    def delete_groups(self, group_ids: Iterable[str], *, raise_errors: bool = True
                      ) -> dict[str, StrataError | None]:
        return self._run(self._admin.delete_groups(list(group_ids), raise_errors=raise_errors))

    def delete_group(self, group_id: str) -> None:
        self._run(self._admin.delete_group(group_id))

    def register_schema(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        return self._run(self._admin.register_schema(subject, schema, schema_type))

    def get_schema(self, subject: str, version: int | Literal["latest"] = "latest", *,
                   include_deleted: bool = False) -> RegisteredSchema:
        return self._run(self._admin.get_schema(subject, version,
                                                include_deleted=include_deleted))

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        return self._run(self._admin.schema_by_id(schema_id))

    def list_subjects(self, *, include_deleted: bool = False) -> list[str]:
        return self._run(self._admin.list_subjects(include_deleted=include_deleted))

    def list_schema_versions(self, subject: str, *, include_deleted: bool = False
                             ) -> list[int]:
        return self._run(self._admin.list_schema_versions(subject,
                                                          include_deleted=include_deleted))

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        return self._run(self._admin.delete_subject(subject, permanent=permanent))

    def delete_schema_version(self, subject: str, version: int | Literal["latest"], *,
                              permanent: bool = False) -> int:
        return self._run(self._admin.delete_schema_version(subject, version,
                                                           permanent=permanent))

    def check_schema_compatibility(self, subject: str, schema: str,
                                   schema_type: str = "AVRO",
                                   version: int | Literal["latest"] = "latest") -> list[str]:
        return self._run(self._admin.check_schema_compatibility(subject, schema,
                                                                schema_type, version))

    def value_subjects(self, names: Iterable[str]) -> dict[str, str | None]:
        return self._run(self._admin.value_subjects(names))

    def get_compatibility(self, subject: str | None = None) -> str:
        return self._run(self._admin.get_compatibility(subject))

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        return self._run(self._admin.set_compatibility(level, subject))

    def close(self) -> None:
        if self._thread.loop.is_closed():
            return
        try:
            self._run(self._admin.close())
        finally:
            self._thread.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
