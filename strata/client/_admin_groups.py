"""Admin API family: consumer groups.

Part of the admin client (``strata.client.admin`` is the face).

``find_coordinator``, ``describe_groups``, ``list_group_offsets``, ``group_lag``,
``reset_group_offsets`` and ``delete_groups`` go to each group's coordinator (found with
``FindCoordinator``; a coordinator that moved is looked up again and the request resent
until the request timeout: ``CoordinatorLink``). ``list_groups`` asks every live broker,
since each one only knows the groups it coordinates, and merges the answers.
``reset_group_offsets`` plans first (``execute=False`` changes nothing) and writes only
into a group with no members: the members' own commits would overwrite the reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

from strata.client._admin_common import AdminContext
from strata.client._admin_topics import TopicAdmin
from strata.client._common import TopicPartition, error_from_code, is_transient
from strata.client._group import CoordinatorAddress, CoordinatorLink
from strata.client._offsets import list_offsets
from wire.errors import (
    GroupIdNotFoundError,
    NetworkError,
    NonEmptyGroupError,
    StrataError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ApiKey,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    Message,
    group_by_topic,
)

__all__ = [
    "CommittedOffset",
    "GroupAdmin",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "OffsetReset",
    "PartitionLag",
    "ResetPlan",
    "ResetTarget",
    "reset_target_text",
]


log = logging.getLogger("strata.client.admin")

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


class GroupAdmin:
    """Consumer groups, each asked of its coordinator."""

    def __init__(self, context: AdminContext, topics: TopicAdmin) -> None:
        self.context = context
        self._cluster = context.cluster
        self.topics = topics
        self._links: dict[str, CoordinatorLink] = {}

    def _link(self, group_id: str) -> CoordinatorLink:
        if not isinstance(group_id, str) or not group_id:
            raise ValueError(f"group id {group_id!r} is not valid; give a non-empty name")
        link = self._links.get(group_id)
        if link is None:
            link = self._links[group_id] = CoordinatorLink(
                self._cluster, group_id, request_timeout_ms=self.context.request_timeout_ms,
                retry_backoff_ms=self.context.retry_backoff_ms)
        return link

    async def find_coordinator(self, group_id: str) -> CoordinatorAddress:
        link = self._link(group_id)
        link.invalidate()
        return await link.find()

    async def list_groups(self) -> list[GroupListing]:
        await self._cluster.refresh([])
        deadline = time.monotonic() + self.context.request_timeout_s

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
        wanted = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        if wanted == []:
            return {}
        response = await self._link(group_id).fetch_offsets(wanted)
        out = {TopicPartition(t.name, a.partition):
               CommittedOffset(a.offset, a.metadata, a.commit_timestamp)
               for t in response.topics for a in t.partitions if a.offset >= 0}
        return dict(sorted(out.items()))

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
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
                                             timeout_s=self.context.request_timeout_s)
            except StrataError as err:
                if is_transient(err) and not isinstance(err, UnknownTopicOrPartitionError):
                    raise
                continue  # the topic (or partition) no longer exists
            out.update({tp: a.offset for tp, a in answers.items()})
        return out

    async def reset_group_offsets(
            self, group_id: str, topic: str, to: ResetTarget, *,
            partitions: Iterable[int] | None = None, execute: bool = False) -> ResetPlan:
        target_text = reset_target_text(to)
        if isinstance(to, bool) or not (to in ("earliest", "latest") or isinstance(
                to, datetime) or (isinstance(to, int) and to >= 0)):
            raise ValueError(f"reset target {to!r} is not valid; use 'earliest', 'latest', "
                             "an offset >= 0 or a datetime")
        link = self._link(group_id)
        description = (await self.topics.describe_topics([topic]))[topic]
        existing = [p.partition for p in description.partitions]
        chosen = existing if partitions is None else list(dict.fromkeys(partitions))
        missing = sorted(set(chosen) - set(existing))
        if missing:
            raise UnknownTopicOrPartitionError(
                f"{topic} has partitions 0..{len(existing) - 1}; "
                f"{', '.join(map(str, missing))} do(es) not exist")
        tps = [TopicPartition(topic, p) for p in sorted(chosen)]
        timeout = self.context.request_timeout_s
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
