"""Reads: Fetch (consumers and followers, sessions included), ListOffsets and
OffsetForLeaderEpoch.

Thin over the replica manager (``ReplicaManager.fetch_records``: the reads, the long
poll, the followers' positions and fetch sessions); this family adds the checks: READ
on each topic for a consumer, CLUSTER_ACTION for a follower, and the consumer quota on
the bytes answered.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable

from brokers.answers import answer_each
from brokers.handlers.context import (
    ApiContext,
    ApiFamily,
    Handler,
)
from wire.errors import InvalidRequestError
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ApiKey,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    OffsetForLeaderEpochPartition,
    OffsetForLeaderEpochPartitionResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderEpochTopicResponse,
)

__all__ = ["FetchApis"]


class FetchApis(ApiFamily):
    """The read APIs, over the replica manager's reads."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.replicas = context.replicas
        # The check and the quota the replica manager calls back, made once (not a
        # bound method per request).
        self._authorize_read = functools.partial(context.require, "READ", "TOPIC")
        self._fetch_quota = functools.partial(context.throttle, "consumer_byte_rate")

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
        }

    def fetch(self, request: FetchRequest) -> Awaitable[FetchResponse]:
        if request.replica_id >= 0:  # only brokers replicate
            self._require("CLUSTER_ACTION", "CLUSTER")
        return self.replicas.fetch_records(request, authorize=self._authorize_read,
                                           quota=self._fetch_quota)

    async def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        committed = request.isolation_level == 1

        def find(topic: str, part: ListOffsetsPartition,
                 answer: ListOffsetsPartitionResponse) -> None:
            self._require("DESCRIBE", "TOPIC", topic)
            partition = self.replicas.leader_partition(topic, part.partition)
            answer.leader_epoch = partition.leader_epoch
            if part.timestamp == EARLIEST_TIMESTAMP:
                answer.offset = partition.log.log_start_offset
            elif part.timestamp == LATEST_TIMESTAMP:
                answer.offset = partition.last_stable_offset if committed \
                    else partition.high_watermark
            elif part.timestamp < 0:
                raise InvalidRequestError(
                    f"timestamp {part.timestamp} is not valid: use -2 (earliest), -1 "
                    "(latest) or milliseconds since the epoch")
            else:
                found = partition.log.find_by_timestamp(part.timestamp)
                end = partition.last_stable_offset if committed else partition.high_watermark
                if found is not None and found[0] < end:
                    answer.offset, answer.timestamp = found

        answered = answer_each(request.topics, lambda p: ListOffsetsPartitionResponse(p, 0),
                                find)
        return ListOffsetsResponse([ListOffsetsTopicResponse(t, a) for t, a in answered])

    async def offset_for_leader_epoch(
            self, request: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
        if request.replica_id >= 0:
            self._require("CLUSTER_ACTION", "CLUSTER")

        def end_of_epoch(topic: str, part: OffsetForLeaderEpochPartition,
                         answer: OffsetForLeaderEpochPartitionResponse) -> None:
            if request.replica_id < 0:
                self._require("DESCRIBE", "TOPIC", topic)
            partition = self.replicas.leader_partition(topic, part.partition)
            self.replicas.check_epoch(partition, part.current_leader_epoch)
            answer.leader_epoch, answer.end_offset = \
                partition.log.end_offset_for_epoch(part.leader_epoch)

        answered = answer_each(request.topics,
                                lambda p: OffsetForLeaderEpochPartitionResponse(p, 0),
                                end_of_epoch)
        return OffsetForLeaderEpochResponse(
            [OffsetForLeaderEpochTopicResponse(t, a) for t, a in answered])
