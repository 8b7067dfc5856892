"""Writing: Produce, and InitProducerId for idempotent producers.

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
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "ProducePartition",
    "ProducePartitionResponse",
    "ProduceRequest",
    "ProduceResponse",
    "ProduceTopic",
    "ProduceTopicResponse",
]


# ----------------------------------------------------------------------------- Produce


@dataclass(slots=True)
class ProducePartition(Message):
    """``records`` must hold exactly ONE record batch (docs/format.md): a second batch
    in the same field, or any other bytes after the first batch, is rejected with
    INVALID_RECORD. Null records give INVALID_REQUEST. A field larger than the topic's
    ``max.message.bytes`` gives MESSAGE_TOO_LARGE (checked first), a checksum mismatch
    CORRUPT_MESSAGE. The leader assigns the offsets.

    Idempotence: a batch carrying a producer id (from InitProducerId) is checked against
    the last 5 batches of that producer on this partition. A retry of one of them is not
    written again: it answers error 0 with the original ``base_offset``. A sequence gap
    gives OUT_OF_ORDER_SEQUENCE_NUMBER, an older producer epoch INVALID_PRODUCER_EPOCH,
    and a producer the partition does not know whose batch does not start at sequence 0
    UNKNOWN_PRODUCER_ID (a producer idle for ``producer.id.expiration.ms`` is forgotten).

    When a partition answers with one of these errors, nothing of its batch was written.
    """

    partition: int
    records: Any  # bytes of exactly one record batch
    FIELDS: ClassVar = (Field("partition", INT32), Field("records", RECORDS))


@dataclass(slots=True)
class ProduceTopic(Message):
    """The partitions of one topic to write to; each is handled on its own."""

    name: str
    partitions: list[ProducePartition]
    FIELDS: ClassVar = (Field("name", STRING), Field("partitions", Array(Struct(ProducePartition))))


@dataclass(slots=True)
class ProduceRequest(Message):
    """Appends one batch per partition on the partition's leader.

    ``acks``:

    - ``0``: no response at all, so partition errors are not reported either (a request
      that fails as a whole still gets an error response);
    - ``1``: answer once the leader has appended the batch (with ``flush.policy=always``,
      once it is also fsynced);
    - ``-1`` (all): before appending, the partition needs at least
      ``min.insync.replicas`` in-sync replicas (else NOT_ENOUGH_REPLICAS and nothing is
      written); answer once the high watermark has passed the batch (every in-sync
      replica has it). If the ISR shrank below ``min.insync.replicas`` while the batch
      waited, the answer is NOT_ENOUGH_REPLICAS_AFTER_APPEND: the batch is in the log
      (``base_offset`` is set) but not acknowledged; retry with idempotence. If this
      broker stopped leading meanwhile, NOT_LEADER_OR_FOLLOWER (it may or may not be
      kept);
    - anything else: every partition answers INVALID_REQUIRED_ACKS.

    ``timeout_ms``: how long ``acks`` 1 and -1 wait for the fsync and for the high
    watermark. When it runs out the partition answers REQUEST_TIMED_OUT, but the batch
    was appended (``base_offset`` is set) and may still be committed: retry with
    idempotence.

    Partitions are independent: each one answers with its own error code and message,
    and an error in one does not stop the others from being written. A partition not
    led by this broker answers NOT_LEADER_OR_FOLLOWER; an unknown one
    UNKNOWN_TOPIC_OR_PARTITION; one whose log could not be opened STORAGE_ERROR.

    ``transactional_id`` (version 1): set when the batches are transactional (the
    transactional bit, docs/transactions.md). Before the first transactional batch of a
    producer in a partition the leader asks the transaction's coordinator whether the
    partition was added to the producer's open transaction (KIP-890 part 1); one that
    was not gets TRANSACTION_ABORTABLE and nothing is written. A non-transactional
    batch while the producer has a transaction open in the partition: INVALID_TXN_STATE.
    """

    acks: int  # 0, 1 or -1 (all)
    timeout_ms: int
    topics: list[ProduceTopic]
    transactional_id: str | None = None
    FIELDS: ClassVar = (
        Field("acks", INT16),
        Field("timeout_ms", INT32),
        Field("topics", Array(Struct(ProduceTopic))),
        Field("transactional_id", NULLABLE_STRING, since=1),
    )


@dataclass(slots=True)
class ProducePartitionResponse(Message):
    """``base_offset``: offset of the batch's first record; for a retried duplicate, the
    offset it got the first time. -1 when the batch was not written.
    ``log_append_time``: the broker's timestamp when the topic uses ``LogAppendTime``,
    else -1. ``log_start_offset``: the partition's first offset after the append.
    """

    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("partition", INT32),
        Field("error_code", INT16),
        Field("base_offset", INT64),
        Field("log_append_time", INT64),
        Field("log_start_offset", INT64),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ProduceTopicResponse(Message):
    name: str
    partitions: list[ProducePartitionResponse]
    FIELDS: ClassVar = (
        Field("name", STRING), Field("partitions", Array(Struct(ProducePartitionResponse)))
    )


@dataclass(slots=True)
class ProduceResponse(Message):
    """One answer per requested partition. ``throttle_time_ms``: how long the client must
    wait before its next request to this broker (a quota was exceeded; 0: none)."""

    topics: list[ProduceTopicResponse]
    throttle_time_ms: int = 0
    FIELDS: ClassVar = (
        Field("topics", Array(Struct(ProduceTopicResponse))), Field("throttle_time_ms", INT32)
    )


# ----------------------------------------------------------------------------- InitProducerId


@dataclass(slots=True)
class InitProducerIdRequest(Message):
    """Gets an id for an idempotent or transactional producer.

    ``transactional_id`` null: a new id with epoch 0 for an idempotent producer
    (``producer_id`` and ``producer_epoch`` must both be -1; ``transaction_timeout_ms``
    is ignored). Set: to that id's transaction coordinator (FindCoordinator with
    ``key_type`` 1), which bumps the epoch (fencing the previous incarnation and aborting
    its open transaction: CONCURRENT_TRANSACTIONS, retry) and answers the id and epoch
    (docs/transactions.md). ``producer_id``/``producer_epoch``: the caller's current
    ones when it recovers (KIP-360), else -1. ``transaction_timeout_ms`` within the
    broker's ``transaction.max.timeout.ms`` (else INVALID_TRANSACTION_TIMEOUT).

    Version 1 (Strata's two-phase commit, in the spirit of Kafka's KIP-939):
    ``two_phase`` makes the transactional id's transactions immune to their timeout;
    ``keep_prepared`` (with ``two_phase``) hands an open transaction back unchanged
    instead of aborting it, and the answer's ``state`` and ``tag`` say what it is.
    """

    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    producer_id: int = -1
    producer_epoch: int = -1
    two_phase: bool = False
    keep_prepared: bool = False
    FIELDS: ClassVar = (
        Field("transactional_id", NULLABLE_STRING),
        Field("transaction_timeout_ms", INT32),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("two_phase", BOOL, since=1),
        Field("keep_prepared", BOOL, since=1),
    )


@dataclass(slots=True)
class InitProducerIdResponse(Message):
    """A new producer id with epoch 0, unique in the cluster: brokers claim ids from
    ZooKeeper in blocks of ``producer.id.block.size``. ZooKeeper trouble gives
    BROKER_NOT_AVAILABLE. On an error, ``producer_id`` and ``producer_epoch`` are -1.
    """

    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    error_message: str | None = None
    state: str = ""  # version 1: the transaction's state (with keep_prepared)
    tag: str | None = None  # version 1: its tag
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("state", STRING, since=1),
        Field("tag", NULLABLE_STRING, since=1),
    )
