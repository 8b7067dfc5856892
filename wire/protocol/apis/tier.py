"""The Delta tier: DescribeTier, TierLease, UpdateTier.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from wire.protocol.codec import (
    BOOL,
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
    "DescribeTierPartitionResponse",
    "DescribeTierRequest",
    "DescribeTierResponse",
    "DescribeTierTopic",
    "DescribeTierTopicResponse",
    "TierSegment",
    "CompactionProgress",
    "TierLeaseRequest",
    "TierLeaseResponse",
    "TierProgressUpdate",
    "UpdateTierRequest",
    "UpdateTierResponse",
]


# ----------------------------------------------------------------------------- DescribeTier


@dataclass(slots=True)
class DescribeTierTopic(Message):
    """``partitions``: the partitions to describe; empty: every partition of the topic."""

    name: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(INT32)))


@dataclass(slots=True)
class DescribeTierRequest(Message):
    """What the tiering job needs to plan a pass: per partition, the closed segments
    the leader holds and how far ZooKeeper says the Delta table goes.

    Send each partition to its leader: a broker answers only for the partitions it
    leads (NOT_LEADER_OR_FOLLOWER otherwise, so the client refreshes metadata and
    retries there). Works for any topic; ``tier_enabled`` says whether it is tiered.
    """

    topics: list[DescribeTierTopic]
    FIELDS: ClassVar = (Field("topics", Array(Struct(DescribeTierTopic))),)


@dataclass(slots=True)
class TierSegment(Message):
    """One closed segment: offsets ``[base_offset, next_offset)``, the timestamp (ms) of
    its newest record (the file's modification time when no record carries one) and its
    size in bytes."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    size_bytes: int
    FIELDS: ClassVar = (
        Field("base_offset", INT64),
        Field("next_offset", INT64),
        Field("max_timestamp", INT64),
        Field("size_bytes", INT64),
    )


@dataclass(slots=True)
class DescribeTierPartitionResponse(Message):
    """``segments``: the closed segments (never the active one) that end at or below the
    last stable offset (at most the high watermark: no segment holding a record of a
    transaction not decided yet), oldest first; the first may begin below
    ``log_start_offset`` (after DeleteRecords) and the records below it are not served.
    ``tiered_up_to``: exclusive end offset of the records in the Delta table,
    ``tier_start_offset``: the first one still there (both from ZooKeeper, 0 when
    nothing was tiered; ``log_start_offset`` may be above ``tiered_up_to``, e.g. after
    retention before tiering was enabled).

    Errors: NOT_LEADER_OR_FOLLOWER (this broker does not lead the partition: retry on
    the leader), UNKNOWN_TOPIC_OR_PARTITION (no such partition), STORAGE_ERROR.
    """

    partition: int
    error_code: int
    log_start_offset: int = -1
    high_watermark: int = -1
    tiered_up_to: int = 0
    tier_start_offset: int = 0
    segments: list[TierSegment] = field(default_factory=list)
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("log_start_offset", INT64),
        Field("high_watermark", INT64),
        Field("tiered_up_to", INT64),
        Field("tier_start_offset", INT64),
        Field("segments", Array(Struct(TierSegment))),
    )


@dataclass(slots=True)
class DescribeTierTopicResponse(Message):
    """``tier_enabled`` / ``tier_after_ms``: the topic's ``tier.enable`` and
    ``tier.after.ms``; ``table``: its Delta table as recorded in ZooKeeper (null: none
    yet). Topic errors: UNKNOWN_TOPIC_OR_PARTITION, BROKER_NOT_AVAILABLE (ZooKeeper could
    not be read; retry); the partition list is empty then."""

    name: str
    error_code: int
    error_message: str | None = None
    tier_enabled: bool = False
    tier_after_ms: int = -1
    table: str | None = None
    partitions: list[DescribeTierPartitionResponse] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("tier_enabled", BOOL),
        Field("tier_after_ms", INT64),
        Field("table", NULLABLE_STRING),
        Field("partitions", Array(Struct(DescribeTierPartitionResponse))),
    )


@dataclass(slots=True)
class DescribeTierResponse(Message):
    """One entry per requested topic."""

    topics: list[DescribeTierTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(DescribeTierTopicResponse))),)


# ----------------------------------------------------------------------------- tier lease


@dataclass(slots=True)
class TierLeaseRequest(Message):
    """Take, renew or give up the tiering lease of one topic (one tiering job per topic).

    ``lease_id`` null: take the lease (free, or expired: its holder did not renew it
    within its ``ttl_ms``); otherwise renew it (``release`` false) or give it up
    (``release`` true). ``ttl_ms``: how long the lease lasts without a renewal (1 s to
    10 min); a job renews it well within that. ``owner``: who holds it, shown to a job
    that finds the topic busy. Any broker answers: the lease is kept in ZooKeeper, and
    its expiry is judged by the answering broker's clock (keep broker clocks within a
    small part of the TTL, e.g. NTP).

    Errors: TIER_JOB_BUSY (another job holds an unexpired lease; the message names it),
    TIER_LEASE_LOST (renew or release of a lease that is no longer this one: it expired
    and another job took it, or the topic was deleted), UNKNOWN_TOPIC_OR_PARTITION,
    INVALID_REQUEST (bad ``ttl_ms``), BROKER_NOT_AVAILABLE (ZooKeeper unreachable: retry).
    """

    topic: str
    owner: str
    lease_id: str | None
    ttl_ms: int
    release: bool = False
    FIELDS: ClassVar = (
        Field("topic", STRING),
        Field("owner", STRING),
        Field("lease_id", NULLABLE_STRING),
        Field("ttl_ms", INT32),
        Field("release", BOOL),
    )


@dataclass(slots=True)
class CompactionProgress(Message):
    """How far the topic's compacted Delta table has merged one partition."""

    partition: int
    merged_up_to: int
    FIELDS: ClassVar = (Field("partition", INT32), Field("merged_up_to", INT64))


@dataclass(slots=True)
class TierLeaseResponse(Message):
    """``lease_id``: the lease held (null after a release or an error); ``topic_id``:
    the topic the lease is for (writes under the lease name it, so a job never writes
    the progress of a deleted topic onto a new one of the same name); ``compacted``:
    the compacted table's progress per partition (stable while the lease is held: only
    its holder writes it)."""

    error_code: int
    error_message: str | None = None
    lease_id: str | None = None
    topic_id: str | None = None
    compacted: list[CompactionProgress] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("lease_id", NULLABLE_STRING),
        Field("topic_id", NULLABLE_STRING),
        Field("compacted", Array(Struct(CompactionProgress))),
    )


@dataclass(slots=True)
class TierProgressUpdate(Message):
    """Progress of one partition to record: ``tiered_up_to`` / ``tier_start`` (both -1:
    leave the tier progress alone) and ``merged_up_to`` (-1: leave the compaction
    progress alone). Offsets never move back: a smaller value keeps the stored one."""

    partition: int
    tiered_up_to: int = -1
    tier_start: int = -1
    merged_up_to: int = -1
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("tiered_up_to", INT64),
        Field("tier_start", INT64),
        Field("merged_up_to", INT64),
    )


@dataclass(slots=True)
class UpdateTierRequest(Message):
    """Record a tiering job's progress, fenced by its lease: each write is one ZooKeeper
    transaction that also checks the lease is still ``lease_id`` and the topic still
    ``topic_id``, so a job whose lease lapsed can never move progress (brokers delete
    local segments below ``tiered_up_to``). ``table`` (not null): record the topic's
    Delta table first. Any broker answers.

    Errors (topic level): TIER_LEASE_LOST, UNKNOWN_TOPIC_OR_PARTITION (deleted, or
    re-created under another id), INVALID_REQUEST (``tier_start > tiered_up_to``, a
    negative offset, or a partition the topic lacks), BROKER_NOT_AVAILABLE (retry).
    """

    topic: str
    lease_id: str
    topic_id: str
    table: str | None = None
    partitions: list[TierProgressUpdate] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("topic", STRING),
        Field("lease_id", STRING),
        Field("topic_id", STRING),
        Field("table", NULLABLE_STRING),
        Field("partitions", Array(Struct(TierProgressUpdate))),
    )


@dataclass(slots=True)
class UpdateTierResponse(Message):
    """What is stored afterwards, per partition of the request (``merged_up_to`` -1:
    not asked), so a job continues from the stored values, never from its own."""

    error_code: int
    error_message: str | None = None
    partitions: list[TierProgressUpdate] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("partitions", Array(Struct(TierProgressUpdate))),
    )
