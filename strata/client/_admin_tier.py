"""Admin API family: what the Delta tiering job plans from and records its progress with.

Part of the admin client (``strata.client.admin`` is the face).

``describe_tier`` asks each partition's leader with ``DescribeTier``: only the leader
knows which segments are closed and below its high watermark. A partition whose leader
moved (``NOT_LEADER_OR_FOLLOWER``), has none right now, or did not answer is retried
after a metadata refresh until the request timeout, as ``list_offsets`` does; a topic
that does not exist raises at once. The lease calls (``acquire_tier_lease``,
``renew_tier_lease``, ``release_tier_lease``) and ``update_tier`` go to any broker, which
checks the lease in ZooKeeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from strata.client._admin_common import AdminContext
from strata.client._common import TopicPartition, error_from_code, is_transient
from wire.errors import NetworkError, StrataError
from wire.protocol import (
    ApiKey,
    DescribeTierPartitionResponse,
    DescribeTierRequest,
    DescribeTierResponse,
    DescribeTierTopic,
    DescribeTierTopicResponse,
    TierLeaseRequest,
    TierLeaseResponse,
    TierProgressUpdate,
    UpdateTierRequest,
    UpdateTierResponse,
    group_by_topic,
)

__all__ = [
    "PartitionTier",
    "SegmentInfo",
    "StoredTierProgress",
    "TierAdmin",
    "TierLease",
    "TopicTier",
]


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

    ``segments``: the closed segments that end at or below the last stable offset (at
    most the high watermark; never past a transaction not decided yet), oldest first
    (never the active one). ``tiered_up_to``: exclusive end offset of the records
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


class TierAdmin:
    """The tiering job's APIs: segments and tier progress, leases, progress updates."""

    def __init__(self, context: AdminContext) -> None:
        self.context = context
        self._cluster = context.cluster

    async def describe_tier(self, names: Iterable[str]) -> dict[str, TopicTier]:
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        response = await self.context.existing_topics(wanted)
        pending = {TopicPartition(t.name, p.partition)
                   for t in response.topics for p in t.partitions}
        topics: dict[str, DescribeTierTopicResponse] = {}
        answers: dict[TopicPartition, DescribeTierPartitionResponse] = {}
        deadline = time.monotonic() + self.context.request_timeout_s
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

    async def acquire_tier_lease(self, topic: str, owner: str, ttl_ms: int) -> TierLease:
        response = await self._cluster.send_any(
            ApiKey.TIER_LEASE, TierLeaseRequest(topic, owner, None, ttl_ms))
        assert isinstance(response, TierLeaseResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        assert response.lease_id is not None and response.topic_id is not None
        return TierLease(topic, response.lease_id, response.topic_id,
                         {c.partition: c.merged_up_to for c in response.compacted})

    async def renew_tier_lease(self, topic: str, lease_id: str, ttl_ms: int) -> None:
        response = await self._cluster.send_any(
            ApiKey.TIER_LEASE, TierLeaseRequest(topic, "", lease_id, ttl_ms))
        assert isinstance(response, TierLeaseResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)

    async def release_tier_lease(self, topic: str, lease_id: str) -> None:
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
