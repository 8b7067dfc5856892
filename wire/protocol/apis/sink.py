"""The Spark sink's exactly-once commits: StageRecords, CommitStaged, AbortStaged.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol.codec import (
    BOOL,
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
    "StagePartition",
    "StageTopic",
    "StageRecordsRequest",
    "StagePartitionResponse",
    "StageTopicResponse",
    "StageRecordsResponse",
    "StagedPartEntry",
    "CommitPartition",
    "CommitTopic",
    "CommitStagedRequest",
    "CommitPartitionResponse",
    "CommitTopicResponse",
    "CommitStagedResponse",
    "AbortPartition",
    "AbortTopic",
    "AbortStagedRequest",
    "AbortPartitionResponse",
    "AbortTopicResponse",
    "AbortStagedResponse",
]


@dataclass(slots=True)
class StagePartition(Message):
    """One chunk for one partition. ``records`` holds exactly ONE record batch with
    producer id -1 and none of the transactional, control or commit-end attribute bits
    (else INVALID_RECORD); size and CRC are checked as for Produce.
    ``chunk_sequence``: 0 for the staging id's first chunk in this partition, then +1 per
    chunk. A resend of an already staged chunk answers ``duplicate`` true without
    writing; a gap gives OUT_OF_ORDER_SEQUENCE_NUMBER.
    """

    partition: int
    chunk_sequence: int
    records: Any
    FIELDS: ClassVar = (
        Field("partition", INT32), Field("chunk_sequence", INT32), Field("records", RECORDS)
    )


@dataclass(slots=True)
class StageTopic(Message):
    name: str
    partitions: list[StagePartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(StagePartition))))


@dataclass(slots=True)
class StageRecordsRequest(Message):
    """Stages records of a sink writer on partition leaders, invisible to consumers until
    a CommitStaged names them (docs/spark.md, "Exactly-once protocol").

    ``staging_id``: 1-64 characters from ``[A-Za-z0-9_-]``, unique per writer task
    attempt (a random id); the staged chunks of one id form one file per partition.
    Staged data not committed or aborted within ``sink.staging.retention.ms`` is deleted.
    """

    staging_id: str
    topics: list[StageTopic]
    FIELDS: ClassVar = (Field("staging_id", STRING), Field("topics", Array(Struct(StageTopic))))


@dataclass(slots=True)
class StagePartitionResponse(Message):
    partition: int
    error_code: int
    duplicate: bool = False
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("duplicate", BOOL),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class StageTopicResponse(Message):
    name: str
    partitions: list[StagePartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(StagePartitionResponse)))
    )


@dataclass(slots=True)
class StageRecordsResponse(Message):
    """One answer per requested partition; errors are per partition."""

    topics: list[StageTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(StageTopicResponse))),)


@dataclass(slots=True)
class StagedPartEntry(Message):
    """A staging id and the counts its writer saw acknowledged in this partition."""

    staging_id: str
    chunks: int
    records: int
    FIELDS: ClassVar = (
        Field("staging_id", STRING), Field("chunks", INT32), Field("records", INT64)
    )


@dataclass(slots=True)
class CommitPartition(Message):
    partition: int
    parts: list[StagedPartEntry]
    FIELDS: ClassVar = (
        Field("partition", INT32), Field("parts", Array(Struct(StagedPartEntry)))
    )


@dataclass(slots=True)
class CommitTopic(Message):
    name: str
    partitions: list[CommitPartition]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(CommitPartition)))
    )


@dataclass(slots=True)
class CommitStagedRequest(Message):
    """Makes staged records visible: per partition, the named staged files are appended
    as one group (consecutive offsets, all or nothing, also across a broker crash),
    stamped with ``producer_id`` and ``batch_id``.

    ``producer_id``: the sink's id, at least 2^62, derived from the sink id by hashing
    (``strata.client.sink_producer_id``). ``batch_id``: 0..2^31-1, increasing per sink;
    a commit whose ``batch_id`` is at or below the sink's last commit in a partition is a
    replay: its staged files are discarded, nothing is appended, and the partition
    answers error 0 with ``duplicate`` true. Before appending, each staged file must
    hold exactly ``chunks`` chunks and ``records`` records, else STAGED_DATA_MISSING and
    nothing is appended in that partition. The answer waits (up to ``timeout_ms``) until
    the group is fsynced under ``flush.policy=always`` and below the high watermark.

    Version 1, a commit inside a transaction (the exactly-once Spark sink,
    docs/spark.md): ``transactional_id`` set, and ``txn_producer_id`` /
    ``txn_producer_epoch`` the producer id and epoch of its open transaction. Needs
    WRITE on the transactional id too. Each partition must have been added to that
    transaction (AddPartitionsToTxn; the leader verifies with the coordinator before
    the transaction's first write there, as for a transactional produce). The group is
    stamped with the transaction's producer id and epoch (``base_sequence`` still the
    batch id), so it belongs to the transaction: invisible to read_committed consumers
    (it holds back the last stable offset) until the COMMIT marker, skipped by them
    after an ABORT marker. A partition where the open transaction already holds
    ``batch_id`` answers ``duplicate`` (a driver that resumes the transaction after a
    crash re-runs the commit); one where the sink (``producer_id``) committed
    ``batch_id`` or later without a transaction answers ``duplicate`` as in version 0.
    """

    producer_id: int
    batch_id: int
    timeout_ms: int
    topics: list[CommitTopic]
    transactional_id: str | None = None
    txn_producer_id: int = -1
    txn_producer_epoch: int = -1
    FIELDS: ClassVar = (
        Field("producer_id", INT64),
        Field("batch_id", INT64),
        Field("timeout_ms", INT32),
        Field("topics", Array(Struct(CommitTopic))),
        Field("transactional_id", NULLABLE_STRING, since=1),
        Field("txn_producer_id", INT64, since=1),
        Field("txn_producer_epoch", INT16, since=1),
    )


@dataclass(slots=True)
class CommitPartitionResponse(Message):
    """``base_offset``/``last_offset``: the group's offsets (-1 for a replay or an
    error). ``last_committed_batch``: the sink's last committed batch id in this
    partition after the request (-1: none)."""

    partition: int
    error_code: int
    duplicate: bool = False
    base_offset: int = -1
    last_offset: int = -1
    last_committed_batch: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("duplicate", BOOL),
        Field("base_offset", INT64),
        Field("last_offset", INT64),
        Field("last_committed_batch", INT64),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class CommitTopicResponse(Message):
    name: str
    partitions: list[CommitPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(CommitPartitionResponse)))
    )


@dataclass(slots=True)
class CommitStagedResponse(Message):
    """One answer per requested partition; errors are per partition."""

    topics: list[CommitTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(CommitTopicResponse))),)


@dataclass(slots=True)
class AbortPartition(Message):
    partition: int
    staging_ids: list[str]
    FIELDS: ClassVar = (Field("partition", INT32), Field("staging_ids", Array(STRING)))


@dataclass(slots=True)
class AbortTopic(Message):
    name: str
    partitions: list[AbortPartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(AbortPartition))))


@dataclass(slots=True)
class AbortStagedRequest(Message):
    """Deletes staged files that will never be committed (a failed Spark batch).
    Unknown staging ids are ignored."""

    topics: list[AbortTopic]
    FIELDS: ClassVar = (Field("topics", Array(Struct(AbortTopic))),)


@dataclass(slots=True)
class AbortPartitionResponse(Message):
    """``discarded``: how many of the named staging ids had files here."""

    partition: int
    error_code: int
    discarded: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("discarded", INT32),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class AbortTopicResponse(Message):
    name: str
    partitions: list[AbortPartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(AbortPartitionResponse)))
    )


@dataclass(slots=True)
class AbortStagedResponse(Message):
    """One answer per requested partition; errors are per partition."""

    topics: list[AbortTopicResponse]
    FIELDS: ClassVar = (Field("topics", Array(Struct(AbortTopicResponse))),)
