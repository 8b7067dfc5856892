"""Reading: Fetch (consumers and followers), ListOffsets, OffsetForLeaderEpoch.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from wire.protocol.codec import (
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    RECORDS,
    STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
    "AbortedTransactionEntry",
    "FetchPartition",
    "FetchPartitionResponse",
    "FetchRequest",
    "ForgottenTopic",
    "FetchResponse",
    "FetchTopic",
    "FetchTopicResponse",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "OffsetForLeaderEpochPartition",
    "OffsetForLeaderEpochPartitionResponse",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderEpochTopic",
    "OffsetForLeaderEpochTopicResponse",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
]


# ----------------------------------------------------------------------------- Fetch


@dataclass(slots=True)
class FetchPartition(Message):
    """``fetch_offset``: the first offset wanted. The records start at the batch that
    holds it, so the first batch may begin before ``fetch_offset``: the client skips
    the records below it. The end of what a reader may see is the high watermark for a
    consumer and the log end offset for a follower: at the end there are no records and
    no error; outside ``[log_start_offset, end]`` the partition answers
    OFFSET_OUT_OF_RANGE.

    ``partition_max_bytes``: the most bytes of records this partition returns, except
    that its first batch is returned whole even when larger (see ``FetchRequest``).

    ``current_leader_epoch`` is accepted but not checked yet.
    """

    partition: int
    fetch_offset: int
    partition_max_bytes: int = 1 << 20
    current_leader_epoch: int = -1  # -1: do not check
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("fetch_offset", INT64),
        Field("partition_max_bytes", INT32),
        Field("current_leader_epoch", INT32),
    )


@dataclass(slots=True)
class FetchTopic(Message):
    """The partitions of one topic to read; they are read in request order."""

    name: str
    partitions: list[FetchPartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(FetchPartition))))


@dataclass(slots=True)
class ForgottenTopic(Message):
    """Partitions an incremental fetch session stops fetching (version 1)."""

    name: str
    partitions: list[int]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(INT32)))


@dataclass(slots=True)
class FetchRequest(Message):
    """Reads record batches from partition leaders, with a long poll.

    ``replica_id`` -1: a consumer; reads stop at the high watermark (committed data
    only; ``ProduceRequest`` says when it moves). A broker id (>= 0): a follower, for
    replication; reads go up to the log end offset. The broker id is not authenticated
    yet: any client that sends one reads uncommitted data.

    ``max_wait_ms`` / ``min_bytes``: the broker answers once the records it would return
    add up to ``min_bytes`` (a value <= 0 counts as 1), once ``max_wait_ms`` has passed
    (capped by the broker's ``fetch.max.wait.ms``), or at once when any partition has an
    error or the broker is shutting down. While it waits, an append to any requested
    partition makes it read again.

    ``max_bytes`` and ``partition_max_bytes``: partitions are read in order; each returns
    whole batches up to its ``partition_max_bytes`` or what is left of ``max_bytes``,
    whichever is smaller, but at least one batch when it has data, even a batch larger
    than both limits, so that a consumer always makes progress. A response can therefore
    exceed ``max_bytes``. Once ``max_bytes`` is used up, the partitions after it return
    no records (and no error).

    ``isolation_level`` 0 (read_uncommitted): consumers read up to the high watermark.
    1 (read_committed, version 2): up to the last stable offset (no further than the
    first offset of any transaction still open), and each partition's answer lists the
    aborted transactions whose batches the records returned may hold, for the consumer
    to skip (docs/transactions.md).

    Fetch sessions (version 1, followers only; Kafka's KIP-227 in small): a follower
    fetching thousands of partitions from one leader would otherwise send, and get back,
    every one of them each round. ``session_epoch`` -1: no session (version 0
    behaviour). 0: open a session (``session_id`` 0) with the partitions listed,
    replacing this follower's previous one at this broker; the answer lists them all and
    carries the new ``session_id``. N > 0: the N-th incremental fetch of ``session_id``:
    ``topics`` lists only partitions added or whose fetch offset or epoch changed, the
    others keep what the session holds, and ``forgotten_topics`` leaves some; the answer
    lists only partitions with records, an error, or offsets that changed since the
    session last answered them; it is sent as soon as one partition has records or an
    error (or a new log start or end), while a high watermark that alone moved waits for
    the next such answer or the end of ``max_wait_ms``, as Kafka's follower fetches do.
    An unknown session answers FETCH_SESSION_ID_NOT_FOUND,
    another epoch than the next INVALID_FETCH_SESSION_EPOCH (top-level ``error_code``):
    the follower then opens a new session. Every request of a session also counts as a
    fetch, at the offset the session holds, of each partition it does not list: an
    idle, caught-up follower stays in the ISR without naming its partitions again.
    """

    topics: list[FetchTopic]
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 << 20
    replica_id: int = -1  # -1: a consumer; a broker id: a follower
    isolation_level: int = 0
    session_id: int = 0
    session_epoch: int = -1  # -1: no session; 0: open one; N: the N-th incremental fetch
    forgotten_topics: list[ForgottenTopic] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("max_wait_ms", INT32),
        Field("min_bytes", INT32),
        Field("max_bytes", INT32),
        Field("isolation_level", INT8),
        Field("topics", Array(Struct(FetchTopic))),
        Field("session_id", INT32, since=1),
        Field("session_epoch", INT32, since=1),
        Field("forgotten_topics", Array(Struct(ForgottenTopic)), since=1),
    )


@dataclass(slots=True)
class AbortedTransactionEntry(Message):
    """An aborted transaction in the range a read_committed fetch returned: its producer
    and the offset of its first batch in the partition."""

    producer_id: int
    first_offset: int
    FIELDS: ClassVar = (Field("producer_id", INT64), Field("first_offset", INT64))


@dataclass(slots=True)
class FetchPartitionResponse(Message):
    """``high_watermark``, ``log_start_offset``, ``log_end_offset``: the partition's
    offsets when it was read. With OFFSET_OUT_OF_RANGE, ``log_start_offset`` and
    ``high_watermark`` hold the ends of the valid range (for a follower the upper end
    is the log end offset). When the partition is unknown, not led by this broker or
    offline, all three are -1.
    ``records``: whole batches, sent straight from the segment files; null when there
    is nothing to return. Version 2: ``last_stable_offset`` (-1 when unknown) and, at
    read_committed, ``aborted_transactions``.
    """

    partition: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    records: Any = None  # whole batches (bytes / memoryview; a FileSlice on the server)
    error_message: str | None = None
    last_stable_offset: int = -1  # version 2
    aborted_transactions: list[AbortedTransactionEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("high_watermark", INT64),
        Field("log_start_offset", INT64),
        Field("log_end_offset", INT64),
        Field("error_message", NULLABLE_STRING),
        Field("last_stable_offset", INT64, since=2),
        Field("aborted_transactions", Array(Struct(AbortedTransactionEntry)), since=2),
        Field("records", RECORDS),
    )


@dataclass(slots=True)
class FetchTopicResponse(Message):
    """One answer per requested partition, in request order."""

    name: str
    partitions: list[FetchPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(FetchPartitionResponse)))
    )


@dataclass(slots=True)
class FetchResponse(Message):
    """``throttle_time_ms``: how long the client must wait before its next request to
    this broker (a quota was exceeded; 0: none). ``error_code`` is 0 (errors are per partition)
    except for a fetch session that cannot go on (FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH), which lists no partitions. ``session_id`` (version 1):
    the session the request opened or continued (0: none)."""

    topics: list[FetchTopicResponse]
    error_code: int = 0
    throttle_time_ms: int = 0
    session_id: int = 0
    FIELDS: ClassVar = (
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("topics", Array(Struct(FetchTopicResponse))),
        Field("session_id", INT32, since=1),
    )


# ----------------------------------------------------------------------------- ListOffsets

# ListOffsets special timestamps (Kafka's values).
EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1


@dataclass(slots=True)
class ListOffsetsPartition(Message):
    """``timestamp`` -2 (earliest): the log start offset. -1 (latest): the high
    watermark, the offset the next committed record will get. A time in ms since the
    epoch (>= 0): the first committed record, in offset order, whose timestamp is at or
    after it. Any other negative value gives INVALID_REQUEST.
    """

    partition: int
    timestamp: int  # EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, or ms
    FIELDS: ClassVar = (Field("partition", INT32), Field("timestamp", INT64))


@dataclass(slots=True)
class ListOffsetsTopic(Message):
    """The partitions of one topic to look up, on their leader."""

    name: str
    partitions: list[ListOffsetsPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ListOffsetsPartition)))
    )


@dataclass(slots=True)
class ListOffsetsRequest(Message):
    """Looks up offsets by time on partition leaders. ``replica_id`` is accepted but
    not used. ``isolation_level`` 1 (read_committed): "latest" is the last stable offset
    and a timestamp lookup finds only records below it, as Kafka answers (a
    read_committed consumer's end of the log and lag)."""

    topics: list[ListOffsetsTopic]
    replica_id: int = -1
    isolation_level: int = 0
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("isolation_level", INT8),
        Field("topics", Array(Struct(ListOffsetsTopic))),
    )


@dataclass(slots=True)
class ListOffsetsPartitionResponse(Message):
    """``offset``: the offset found. For a timestamp query, ``timestamp`` is that
    record's timestamp, and both are -1 when no committed record is that recent; for -2
    and -1 ``timestamp`` is -1. ``leader_epoch``: the partition's current leader epoch.
    """

    partition: int
    error_code: int
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("timestamp", INT64),
        Field("offset", INT64),
        Field("leader_epoch", INT32),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ListOffsetsTopicResponse(Message):
    """One answer per requested partition."""

    name: str
    partitions: list[ListOffsetsPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ListOffsetsPartitionResponse)))
    )


@dataclass(slots=True)
class ListOffsetsResponse(Message):
    """One entry per requested topic; errors are per partition."""

    topics: list[ListOffsetsTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(ListOffsetsTopicResponse))),)


# ----------------------------------------------------------------------------- OffsetForLeaderEpoch


@dataclass(slots=True)
class OffsetForLeaderEpochPartition(Message):
    """``leader_epoch``: the epoch of the last batch in the asker's log (from its
    leader-epoch cache). ``current_leader_epoch``: the partition's leader epoch as the
    asker knows it; -1 skips the check, anything else must equal the leader's current
    epoch (older: FENCED_LEADER_EPOCH, newer: UNKNOWN_LEADER_EPOCH; both retriable
    after a metadata refresh).
    """

    partition: int
    current_leader_epoch: int
    leader_epoch: int
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("current_leader_epoch", INT32),
        Field("leader_epoch", INT32),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochTopic(Message):
    """The partitions of one topic to ask about, on their leader."""

    name: str
    partitions: list[OffsetForLeaderEpochPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(OffsetForLeaderEpochPartition)))
    )


@dataclass(slots=True)
class OffsetForLeaderEpochRequest(Message):
    """Asks a partition leader where an epoch ends in its log (Kafka KIP-101/KIP-279).

    A replica that becomes a follower sends the epoch of its last batch and truncates
    its log to ``min(its log end, end_offset)`` of the answer, then fetches from there:
    this removes a divergent tail without losing records the new leader also has
    (truncating to the high watermark would). ``replica_id``: the asking broker's id,
    -1 for a client (debugging tools); not used yet.
    """

    topics: list[OffsetForLeaderEpochTopic]
    replica_id: int = -1
    FIELDS: ClassVar = (
        Field("replica_id", INT32),
        Field("topics", Array(Struct(OffsetForLeaderEpochTopic))),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochPartitionResponse(Message):
    """From the leader's leader-epoch cache: for the leader's latest epoch, its log end
    offset; for an older epoch, the start offset of the next larger epoch it knows,
    with ``leader_epoch`` the largest epoch it knows at or below the requested one
    (the requested one itself if it is older than all). ``leader_epoch`` and
    ``end_offset`` are -1 when the epoch is newer than any the leader knows, when it
    knows none, and on an error (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
    KAFKA_STORAGE_ERROR for an offline partition, FENCED_LEADER_EPOCH,
    UNKNOWN_LEADER_EPOCH).
    """

    partition: int
    error_code: int
    leader_epoch: int = -1
    end_offset: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("leader_epoch", INT32),
        Field("end_offset", INT64),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochTopicResponse(Message):
    """One answer per requested partition."""

    name: str
    partitions: list[OffsetForLeaderEpochPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING),
        Field("partitions", Array(Struct(OffsetForLeaderEpochPartitionResponse))),
    )


@dataclass(slots=True)
class OffsetForLeaderEpochResponse(Message):
    """One entry per requested topic; errors are per partition."""

    topics: list[OffsetForLeaderEpochTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(OffsetForLeaderEpochTopicResponse))),)
