"""Tiering: DescribeTier, TierLease and UpdateTier, what the tiering job asks of the
brokers (docs/spark.md).

DescribeTier answers from the leader's log (closed segments below the last stable
offset, through the replica manager) and ZooKeeper (the table and the progress); TierLease and
UpdateTier are ZooKeeper writes fenced by the job's lease. Each needs DESCRIBE or ALTER
on the topic.
"""

from __future__ import annotations

import asyncio

from brokers.answers import error_fields
from brokers.coordination import TierProgress
from brokers.handlers.context import (
    ApiContext,
    ApiFamily,
    Handler,
)
from wire.errors import (
    InvalidRequestError,
    StrataError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    ApiKey,
    CompactionProgress,
    DescribeTierPartitionResponse,
    DescribeTierRequest,
    DescribeTierResponse,
    DescribeTierTopicResponse,
    TierLeaseRequest,
    TierLeaseResponse,
    TierProgressUpdate,
    TierSegment,
    UpdateTierRequest,
    UpdateTierResponse,
)

__all__ = ["TierApis"]

# A tier lease's TTL: long enough to ride out a GC pause or a ZooKeeper election between
# renewals, short enough that a dead job frees its topics soon.
_MIN_TIER_LEASE_MS = 1_000
_MAX_TIER_LEASE_MS = 600_000


class TierApis(ApiFamily):
    """The tiering job's APIs."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.replicas = context.replicas

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.DESCRIBE_TIER: self.describe_tier,
            ApiKey.TIER_LEASE: self.tier_lease,
            ApiKey.UPDATE_TIER: self.update_tier,
        }

    async def describe_tier(self, request: DescribeTierRequest) -> DescribeTierResponse:
        """Closed segments and tier progress of the partitions this broker leads.

        The segment list comes from the leader's log (under its lock, one snapshot per
        partition); the table and progress from ZooKeeper, read once per topic.
        """
        topics = []
        for topic in request.topics:
            definition = self.cluster.topics.get(topic.name)
            try:
                self._require("DESCRIBE", "TOPIC", topic.name)
                if definition is None:
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic.name!r} does not exist; check the name (strata topic "
                        "list)")
                config = self.host.log_config_for(topic.name)
                table, progress = await asyncio.to_thread(self._tier_records, topic.name)
            except StrataError as err:
                topics.append(DescribeTierTopicResponse(topic.name, *error_fields(err)))
                continue
            partitions = topic.partitions or list(definition.assignment)
            topics.append(DescribeTierTopicResponse(
                topic.name, 0, None, config.tier_enable, config.tier_after_ms, table,
                [self._describe_tier_partition(topic.name, p, progress.get(p))
                 for p in partitions]))
        return DescribeTierResponse(topics)

    def _tier_records(self, topic: str) -> tuple[str | None, dict[int, TierProgress]]:
        zookeeper = self.zookeeper
        return zookeeper.tier_table(topic), zookeeper.tier_progress(topic)

    def _describe_tier_partition(self, topic: str, p: int, progress: TierProgress | None
                                 ) -> DescribeTierPartitionResponse:
        answer = DescribeTierPartitionResponse(p, 0)
        try:
            partition = self.replicas.leader_partition(topic, p)
            high_watermark = partition.high_watermark
            # Closed segments only, and only below the last stable offset (at most the
            # high watermark): a segment a follower could still lose, the active one
            # (still growing), or one holding a record of a transaction not decided yet
            # (the Delta tier holds committed records only) is never offered.
            stable = partition.last_stable_offset
            answer.segments = [
                TierSegment(s.base_offset, s.next_offset, s.max_timestamp, s.size_bytes)
                for s in partition.log.closed_segments() if s.next_offset <= stable]
            answer.log_start_offset = partition.log.log_start_offset
            answer.high_watermark = high_watermark
            if progress is not None:
                answer.tiered_up_to = progress.tiered_up_to
                answer.tier_start_offset = progress.tier_start
        except StrataError as err:
            answer.error_code, answer.error_message = error_fields(err)
        return answer

    async def tier_lease(self, request: TierLeaseRequest) -> TierLeaseResponse:
        """Take, renew or give up a tiering job's lease (kept in ZooKeeper, any broker)."""
        try:
            self._require("ALTER", "TOPIC", request.topic)
            if request.release:
                if request.lease_id is None:
                    raise InvalidRequestError("release needs the lease_id being given up")
                await asyncio.to_thread(self.zookeeper.release_tier_lease, request.topic,
                                        request.lease_id)
                return TierLeaseResponse(0)
            if not _MIN_TIER_LEASE_MS <= request.ttl_ms <= _MAX_TIER_LEASE_MS:
                raise InvalidRequestError(
                    f"ttl_ms={request.ttl_ms} is out of range; use {_MIN_TIER_LEASE_MS}.."
                    f"{_MAX_TIER_LEASE_MS} ms and renew well within it")
            if request.lease_id is None:
                lease_id, topic_id, compacted = await asyncio.to_thread(
                    self.zookeeper.acquire_tier_lease, request.topic, request.owner,
                    request.ttl_ms)
                return TierLeaseResponse(0, None, lease_id, topic_id, [
                    CompactionProgress(p, merged) for p, merged in sorted(compacted.items())])
            await asyncio.to_thread(self.zookeeper.renew_tier_lease, request.topic,
                                    request.lease_id, request.ttl_ms)
            return TierLeaseResponse(0, None, request.lease_id)
        except StrataError as err:
            return TierLeaseResponse(*error_fields(err))

    async def update_tier(self, request: UpdateTierRequest) -> UpdateTierResponse:
        """Record a job's progress, every write fenced by its lease (see the request)."""
        try:
            self._require("ALTER", "TOPIC", request.topic)
            definition = self.cluster.topics.get(request.topic)
            for update in request.partitions:
                if definition is not None and update.partition not in definition.assignment:
                    raise InvalidRequestError(
                        f"{request.topic} has no partition {update.partition}")
                touched = update.tiered_up_to >= 0 or update.tier_start >= 0
                if touched and not 0 <= update.tier_start <= update.tiered_up_to:
                    raise InvalidRequestError(
                        f"{request.topic}-{update.partition}: tier progress needs 0 <= "
                        f"tier_start ({update.tier_start}) <= tiered_up_to "
                        f"({update.tiered_up_to})")
                if update.merged_up_to < -1:
                    raise InvalidRequestError(
                        f"{request.topic}-{update.partition}: merged_up_to "
                        f"{update.merged_up_to} is negative (-1: leave it)")
            stored = await asyncio.to_thread(self._write_tier, request)
        except StrataError as err:
            return UpdateTierResponse(*error_fields(err))
        return UpdateTierResponse(0, None, stored)

    def _write_tier(self, request: UpdateTierRequest) -> list[TierProgressUpdate]:
        zookeeper, topic, lease = self.zookeeper, request.topic, request.lease_id
        if request.table is not None:
            zookeeper.set_tier_table(topic, request.table, lease_id=lease)
        out = []
        for update in request.partitions:
            answer = TierProgressUpdate(update.partition)
            if update.tiered_up_to >= 0:
                saved = zookeeper.advance_tier_progress(
                    topic, update.partition, tiered_up_to=update.tiered_up_to,
                    tier_start=update.tier_start, topic_id=request.topic_id, lease_id=lease)
                answer.tiered_up_to, answer.tier_start = saved.tiered_up_to, saved.tier_start
            if update.merged_up_to >= 0:
                answer.merged_up_to = zookeeper.advance_compaction_progress(
                    topic, update.partition, update.merged_up_to, lease_id=lease)
            out.append(answer)
        return out
