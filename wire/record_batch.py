"""The Strata record batch: a fixed binary header followed by an Arrow IPC stream.

This module is the bottom layer of Strata. The broker, the log and every client share
it; it imports nothing from the rest of the project except the error types.

Byte layout (all integers big-endian, 61-byte header; modelled on Kafka's RecordBatch v2
so the fields a Kafka operator knows sit where they expect them)::

    offset size field                   meaning
    ------ ---- ----------------------- ----------------------------------------------
     0      8   base_offset    int64    offset of the first record (assigned by the leader)
     8      4   batch_length   int32    bytes that follow this field (= total size - 12)
    12      4   leader_epoch   int32    partition leader epoch that appended the batch
    16      1   magic          int8     format version, always 1 (MAGIC)
    17      4   crc            uint32   CRC32C of bytes [21, end): attributes .. payload
    21      2   attributes     int16    bits 0-2 compression (0 none, 1 lz4, 2 zstd),
                                        bit 3 timestamp type (0 create, 1 log-append),
                                        bit 4 transactional (a transaction's batch, or a
                                        sink commit's), bit 5 control (a transaction
                                        marker), bit 6 ends a sink commit, bit 7 delete
                                        horizon (a control batch only: the log cleaner
                                        stamped it, first_timestamp holds the horizon),
                                        bit 8 a sink commit inside a transaction;
                                        others 0
    23      4   last_offset_delta int32 record_count - 1
    27      8   first_timestamp int64   smallest record timestamp, ms since the epoch
    35      8   max_timestamp  int64    largest record timestamp (log-append time when
                                        the timestamp type bit is set)
    43      8   producer_id    int64    idempotent producer id, -1 when none
    51      2   producer_epoch int16    producer epoch, -1 when none
    53      4   base_sequence  int32    sequence number of the first record, -1 when none
    57      4   record_count   int32    number of records, 1 .. MAX_RECORDS_PER_BATCH
    61      n   payload                 Arrow IPC stream: one schema message, one record
                                        batch of PAYLOAD_SCHEMA with record_count rows,
                                        end-of-stream marker

Why the CRC starts at ``attributes``: the leader assigns ``base_offset`` and stamps
``leader_epoch`` on every append. Keeping both outside the checksum (as Kafka does) lets
the broker rewrite 12 bytes in place and never recompute a CRC on the produce path.
Only log-append-time topics rewrite a covered field (``max_timestamp``); that path
recomputes the CRC (about 20 GB/s with the ``crc32c`` package, so cheap either way).

The broker never decodes the payload. Validation (``validate``) checks magic, lengths,
record count bounds, attribute bits and the CRC, touching only the bytes it was given.
Producers and consumers build and read whole Arrow columns (``build_batch``,
``decode_batch``, ``batches_to_table``); there is no per-record Python loop on the hot path.

Compression is Arrow's own IPC buffer compression (LZ4_FRAME or ZSTD), so a compressed
batch is still a self-describing Arrow stream and the broker still never opens it.

Control batches (transaction markers, docs/transactions.md) are the one exception to
the Arrow payload: a COMMIT or ABORT marker is one record whose payload is Kafka's
control record, 10 bytes (key: int16 version 0, int16 type, 0 ABORT / 1 COMMIT; value:
int16 version 0, int32 coordinator epoch), with the transactional and control bits set
and the transaction's producer id and epoch. Readers never hand a control batch to an
application: ``batches_to_table`` skips it, and with ``aborted`` (a read_committed
fetch's aborted transactions) also skips the batches of aborted transactions, batch by
batch, as Kafka's consumer does.
"""

from __future__ import annotations

import array
import contextlib
import functools
import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, TypeAlias

import crc32c as _crc32c
import pyarrow as pa
import pyarrow.compute as pc

from wire.errors import CorruptRecordError, InvalidRecordBatchError, SchemaMismatchError

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAX_RECORDS_PER_BATCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "PAYLOAD_SCHEMA",
    "SINK_PRODUCER_ID_BASE",
    "CONSUMER_SCHEMA",
    "BROKER_ONLY_ATTRIBUTE_BITS",
    "AbortedFilter",
    "AbortedTransaction",
    "BatchHeader",
    "Compression",
    "ControlType",
    "build_control_batch",
    "parse_control",
    "TimestampType",
    "batches_to_table",
    "build_batch",
    "payload_schema_of",
    "schema_message",
    "typed_payload_schema",
    "value_schema_id",
    "VALUE_SCHEMA_ID_KEY",
    "crc_of",
    "decode_batch",
    "encode_record_batch",
    "iter_batches",
    "peek_header",
    "set_base_offset",
    "set_log_append_time",
    "stamp_delete_horizon",
    "stamp_sink_commit",
    "validate",
    "warm_up_encoder",
]

# One struct for the whole header; field comments give the byte offsets above.
HEADER: Final = struct.Struct(
    ">"
    "q"  # 0  base_offset
    "i"  # 8  batch_length: bytes after this field
    "i"  # 12 leader_epoch
    "b"  # 16 magic
    "I"  # 17 crc (CRC32C of [21, end))
    "h"  # 21 attributes
    "i"  # 23 last_offset_delta
    "q"  # 27 first_timestamp
    "q"  # 35 max_timestamp
    "q"  # 43 producer_id
    "h"  # 51 producer_epoch
    "i"  # 53 base_sequence
    "i"  # 57 record_count
)
HEADER_SIZE: Final = HEADER.size  # 61
# base_offset + batch_length: the bytes that precede what batch_length counts.
LOG_OVERHEAD: Final = 12
MAGIC: Final = 1
MAX_RECORDS_PER_BATCH: Final = 1 << 20

_BASE_OFFSET = struct.Struct(">q")  # at 0
_LEADER_EPOCH = struct.Struct(">i")  # at 12
_LENGTH_PREFIX = struct.Struct(">qi")  # base_offset, batch_length: enough to walk a log
_MAGIC_AT: Final = 16
_CRC_AT: Final = 17
_CRC_FROM: Final = 21
_ATTRIBUTES_AT: Final = 21
_FIRST_TIMESTAMP_AT: Final = 27
_MAX_TIMESTAMP_AT: Final = 35

NO_PRODUCER_ID: Final = -1
# Producer ids from this value up belong to sinks (derived from the sink id by hashing,
# so every broker agrees without coordination); InitProducerId allocates ids counting up
# from 0 and never gets near it.
SINK_PRODUCER_ID_BASE: Final = 1 << 62
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1

_COMPRESSION_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20
# The last batch of one sink commit's group in a partition (see brokers/staging.py): a
# group without it at the log's tail is a torn commit, which recovery removes.
_COMMIT_END_BIT: Final = 0x40
# Set by the log cleaner (brokers/log/cleaner.py) on a transaction marker whose
# transaction has no data left in the log; ``first_timestamp`` then holds the marker's
# delete horizon (ms since the epoch), from which a later pass may remove it (Kafka's
# KIP-534 delete horizon, bit 6 there). Only ever on a control batch.
_DELETE_HORIZON_BIT: Final = 0x80
# A batch of a sink commit made inside a transaction (the exactly-once Spark sink): it
# carries the transactional producer's id and epoch, so the transaction's marker commits
# or aborts it, and ``base_sequence`` is the sink's batch id (see ``stamp_sink_commit``).
_TXN_SINK_BIT: Final = 0x100
_KNOWN_ATTRIBUTE_BITS: Final = 0x1FF
# Bits only the broker may set (a sink commit, a marker, the cleaner's horizon); a
# produced or staged batch carrying one is refused (the transactional bit is allowed in
# Produce from a transactional producer), so no client can forge a commit or hide
# records from the dedupe.
BROKER_ONLY_ATTRIBUTE_BITS: Final = (_TRANSACTIONAL_BIT | _CONTROL_BIT | _COMMIT_END_BIT
                                     | _DELETE_HORIZON_BIT | _TXN_SINK_BIT)

PAYLOAD_SCHEMA: Final = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field(
            "headers",
            pa.list_(
                pa.struct(
                    [pa.field("key", pa.string(), nullable=False),
                     pa.field("value", pa.binary(), nullable=True)]
                )
            ),
            nullable=True,
        ),
    ]
)


class Compression(IntEnum):
    """Codec of the Arrow IPC buffers (attributes bits 0-2)."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2

    @classmethod
    def parse(cls, name: str | None) -> Compression:
        """``None``/``"none"``/``"lz4"``/``"zstd"`` to a codec; anything else is an error."""
        if name is None:
            return cls.NONE
        try:
            return cls[name.upper()]
        except KeyError:
            raise InvalidRecordBatchError(
                f"unknown compression {name!r}; use one of none, lz4, zstd"
            ) from None

    @property
    def arrow_codec(self) -> str | None:
        return {Compression.NONE: None, Compression.LZ4: "lz4", Compression.ZSTD: "zstd"}[self]


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(IntEnum):
    """A control record's type (Kafka's numbers)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """An aborted transaction a read_committed fetch covers: its producer and the offset
    of its first batch in the partition (Kafka's FetchResponse AbortedTransaction)."""

    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded 61-byte header. ``size`` is the whole batch in bytes."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & _COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def ends_commit(self) -> bool:
        """The last batch of a sink commit's group (``base_sequence`` is its batch id)."""
        return bool(self.attributes & _COMMIT_END_BIT)

    @property
    def in_txn_sink_commit(self) -> bool:
        """A batch of a sink commit's group appended inside a transaction: the producer
        id and epoch are the transaction's, ``base_sequence`` the sink's batch id."""
        return bool(self.attributes & _TXN_SINK_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the log cleaner may remove this transaction marker (ms since the epoch),
        once it stamped one (``stamp_delete_horizon``); ``None``: not stamped."""
        return self.first_timestamp if self.attributes & _DELETE_HORIZON_BIT else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return self.base_sequence + self.last_offset_delta


_CONTROL_RECORD = struct.Struct(">hhhi")  # key version, type; value version, coord epoch
_CONTROL_ATTRIBUTES: Final = _TRANSACTIONAL_BIT | _CONTROL_BIT


def build_control_batch(producer_id: int, producer_epoch: int, control_type: ControlType,
                        coordinator_epoch: int, timestamp_ms: int) -> bytes:
    """A transaction marker: one control record ending ``producer_id``'s transaction in a
    partition (base offset 0 and leader epoch -1, as the leader stamps them on append)."""
    payload = _CONTROL_RECORD.pack(0, int(control_type), 0, coordinator_epoch)
    batch = bytearray(HEADER_SIZE + len(payload))
    HEADER.pack_into(batch, 0, 0, len(batch) - LOG_OVERHEAD, -1, MAGIC, 0,
                     _CONTROL_ATTRIBUTES, 0, timestamp_ms, timestamp_ms, producer_id,
                     producer_epoch, NO_SEQUENCE, 1)
    batch[HEADER_SIZE:] = payload
    struct.pack_into(">I", batch, _CRC_AT, crc_of(batch))
    return bytes(batch)


def parse_control(batch: bytes | bytearray | memoryview) -> tuple[ControlType, int]:
    """``(type, coordinator_epoch)`` of a whole control batch (``InvalidRecordBatchError``
    if it is not one this build writes)."""
    header = peek_header(batch)
    if not header.is_control or header.record_count != 1 or \
            header.size - HEADER_SIZE != _CONTROL_RECORD.size or len(batch) < header.size:
        raise InvalidRecordBatchError("not a transaction marker (control batch)")
    key_version, kind, value_version, coordinator_epoch = _CONTROL_RECORD.unpack_from(
        batch, HEADER_SIZE)
    if key_version != 0 or value_version != 0 or kind not in (0, 1):
        raise InvalidRecordBatchError(
            f"unknown control record (key version {key_version}, type {kind}, value "
            f"version {value_version})")
    return ControlType(kind), coordinator_epoch


def stamp_delete_horizon(batch: bytearray, horizon_ms: int) -> None:
    """Mark a whole control batch with the log cleaner's delete horizon (in place):
    the delete-horizon bit, ``first_timestamp = horizon_ms``, a new CRC. The marker's
    own time stays in ``max_timestamp`` (the time index and retention read that)."""
    header = peek_header(batch)
    if not header.is_control:
        raise InvalidRecordBatchError("only a transaction marker gets a delete horizon")
    struct.pack_into(">h", batch, _ATTRIBUTES_AT, header.attributes | _DELETE_HORIZON_BIT)
    struct.pack_into(">q", batch, _FIRST_TIMESTAMP_AT, horizon_ms)
    struct.pack_into(">I", batch, _CRC_AT, crc_of(batch))


def crc_of(batch: bytes | bytearray | memoryview) -> int:
    """CRC32C of the checksummed region of a whole batch."""
    return int(_crc32c.crc32c(memoryview(batch)[_CRC_FROM:]))


def peek_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Decode the header at ``position`` without checking the CRC or the payload.

    Raises ``InvalidRecordBatchError`` when fewer than ``HEADER_SIZE`` bytes remain or the
    fields are impossible (bad magic, length below the header, count out of bounds).
    """
    if len(buf) - position < HEADER_SIZE:
        raise InvalidRecordBatchError(
            f"truncated batch header: {len(buf) - position} bytes, need {HEADER_SIZE}"
        )
    header = BatchHeader(*HEADER.unpack_from(buf, position))
    _check_header_fields(header)
    return header


def _check_header_fields(h: BatchHeader) -> None:
    if h.magic != MAGIC:
        raise InvalidRecordBatchError(
            f"unsupported batch magic {h.magic} (this build reads magic {MAGIC}); "
            "upgrade the reader or re-encode the batch"
        )
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatchError(
            f"batch_length {h.batch_length} is smaller than the header "
            f"({HEADER_SIZE - LOG_OVERHEAD} bytes after the length field)"
        )
    if not 1 <= h.record_count <= MAX_RECORDS_PER_BATCH:
        raise InvalidRecordBatchError(
            f"record_count {h.record_count} is outside 1..{MAX_RECORDS_PER_BATCH}; "
            "split the batch"
        )
    if h.last_offset_delta != h.record_count - 1:
        raise InvalidRecordBatchError(
            f"last_offset_delta {h.last_offset_delta} disagrees with record_count "
            f"{h.record_count}"
        )
    if h.attributes & ~_KNOWN_ATTRIBUTE_BITS or (h.attributes & _COMPRESSION_MASK) > 2:
        raise InvalidRecordBatchError(f"unknown attribute bits 0x{h.attributes & 0xFFFF:04x}")
    if h.attributes & _DELETE_HORIZON_BIT and not h.attributes & _CONTROL_BIT:
        raise InvalidRecordBatchError(
            "the delete-horizon attribute bit (7) is set on a batch that is not a "
            "transaction marker; only the log cleaner sets it, on control batches")
    if h.max_timestamp < h.first_timestamp and \
            not h.attributes & (_TIMESTAMP_TYPE_BIT | _DELETE_HORIZON_BIT):
        raise InvalidRecordBatchError(
            f"max_timestamp {h.max_timestamp} is before first_timestamp {h.first_timestamp}"
        )


def validate(buf: bytes | bytearray | memoryview, *, exact: bool = True) -> BatchHeader:
    """Check one whole batch at the start of ``buf``: header fields, length, CRC.

    With ``exact`` (the produce path) ``buf`` must hold exactly one batch; otherwise
    trailing bytes are allowed. Touches only ``buf``: no allocation depends on the
    lengths the bytes claim. Raises ``InvalidRecordBatchError`` (its subclass
    ``CorruptRecordError``, wire code CORRUPT_MESSAGE, for a checksum mismatch).
    """
    header = peek_header(buf)
    if header.size > len(buf) or (exact and header.size != len(buf)):
        raise InvalidRecordBatchError(
            f"batch_length {header.batch_length} says the batch is {header.size} bytes "
            f"but {len(buf)} bytes were given"
        )
    actual = int(_crc32c.crc32c(memoryview(buf)[_CRC_FROM:header.size]))
    if actual != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch: header says 0x{header.crc:08x}, bytes give 0x{actual:08x}; "
            "the batch was damaged in transit, resend it", offset=header.base_offset
        )
    return header


def set_base_offset(batch: bytearray | memoryview, base_offset: int, leader_epoch: int) -> None:
    """Stamp the leader-assigned base offset and leader epoch in place (outside the CRC)."""
    _BASE_OFFSET.pack_into(batch, 0, base_offset)
    _LEADER_EPOCH.pack_into(batch, 12, leader_epoch)


def set_log_append_time(batch: bytearray | memoryview, timestamp_ms: int) -> None:
    """Mark the batch log-append-time, set max_timestamp, recompute the CRC (in place)."""
    (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
    struct.pack_into(">h", batch, _ATTRIBUTES_AT, attributes | _TIMESTAMP_TYPE_BIT)
    struct.pack_into(">q", batch, _MAX_TIMESTAMP_AT, timestamp_ms)
    struct.pack_into(">I", batch, _CRC_AT, crc_of(batch))


_SINK_FIELDS = struct.Struct(">qhi")  # at 43: producer_id, producer_epoch, base_sequence


def stamp_sink_commit(batch: bytearray | memoryview, producer_id: int, batch_id: int,
                      *, ends_commit: bool, producer_epoch: int | None = None) -> None:
    """Mark a staged batch as part of sink commit ``batch_id`` of ``producer_id`` (in place).

    Sets the transactional bit (and the commit-end bit on the group's last batch), the
    producer id, ``base_sequence = batch_id`` and the epoch, then recomputes the CRC.
    Producer state reads these fields back from the log to recognise a replayed commit.

    ``producer_epoch`` None: a sink's own commit (``producer_id`` the sink's, >= 2^62,
    epoch 0). Given: a commit inside a transaction, whose marker decides it
    (``producer_id``/``producer_epoch`` the transactional producer's; the transactional
    sink bit is set too).
    """
    (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
    attributes = (attributes & ~BROKER_ONLY_ATTRIBUTE_BITS) | _TRANSACTIONAL_BIT
    if ends_commit:
        attributes |= _COMMIT_END_BIT
    if producer_epoch is not None:
        attributes |= _TXN_SINK_BIT
    struct.pack_into(">h", batch, _ATTRIBUTES_AT, attributes)
    _SINK_FIELDS.pack_into(batch, 43, producer_id,
                           0 if producer_epoch is None else producer_epoch, batch_id)
    struct.pack_into(">I", batch, _CRC_AT, crc_of(batch))


def iter_batches(
    buf: bytes | bytearray | memoryview, *, allow_partial_tail: bool = True
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Walk consecutive batches in ``buf`` (a fetch response or a segment slice).

    Every batch is CRC-checked; a failure raises ``CorruptRecordError`` naming the byte
    position. A trailing partial batch (a fetch cut by ``max_bytes``) is skipped when
    ``allow_partial_tail`` is true and is an error otherwise.
    """
    view = memoryview(buf)
    position = 0
    end = len(view)
    while position < end:
        if end - position < HEADER_SIZE:
            if allow_partial_tail:
                return
            raise CorruptRecordError(f"truncated batch header at byte {position}")
        (base_offset, batch_length) = _LENGTH_PREFIX.unpack_from(view, position)
        cut_off = position + LOG_OVERHEAD + batch_length > end
        if batch_length >= HEADER_SIZE - LOG_OVERHEAD and cut_off:
            if allow_partial_tail:
                return
            raise CorruptRecordError(
                f"batch of {batch_length + LOG_OVERHEAD} bytes is cut off after "
                f"{end - position} bytes", position=position, offset=base_offset)
        try:
            header = validate(view[position:], exact=False)
        except InvalidRecordBatchError as err:
            raise CorruptRecordError(err.message, position=position, offset=base_offset) from err
        yield header, view[position:position + header.size]
        position += header.size


# --------------------------------------------------------------------------- typed payloads
#
# A typed topic (docs/typed-topics.md) keeps the payload's four columns, but ``value`` is
# a struct of the registered schema's fields instead of bytes, and the payload schema's
# metadata carries the registry id of that schema under VALUE_SCHEMA_ID_KEY. The id
# travels inside the Arrow schema message, so the broker's check (one dictionary look-up
# keyed by the schema message's bytes) and every reader see the same thing.

VALUE_SCHEMA_ID_KEY: Final = b"strata.value.schema_id"
_IPC_CONTINUATION: Final = 0xFFFFFFFF
_IPC_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length (little-endian)
# A schema message is small; a claimed length past this is hostile, not a big schema.
_MAX_SCHEMA_MESSAGE: Final = 16 << 20


@functools.lru_cache(maxsize=1024)
def typed_payload_schema(value_type: pa.StructType, schema_id: int) -> pa.Schema:
    """The payload schema of a typed topic's batches: ``value`` is ``value_type``
    (nullable: a null value is a tombstone) and the metadata names ``schema_id``.
    (Cached: a producer builds the same one for every batch.)"""
    return pa.schema(
        [PAYLOAD_SCHEMA.field("key"), pa.field("value", value_type, nullable=True),
         PAYLOAD_SCHEMA.field("timestamp"), PAYLOAD_SCHEMA.field("headers")],
        metadata={VALUE_SCHEMA_ID_KEY: str(schema_id).encode()})


def value_schema_id(schema: pa.Schema) -> int | None:
    """The registry id a typed payload schema names (None: a bytes payload)."""
    raw = (schema.metadata or {}).get(VALUE_SCHEMA_ID_KEY)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRecordBatchError(
            f"payload metadata {VALUE_SCHEMA_ID_KEY.decode()}={raw[:20]!r} is not a schema "
            "id") from None


def _check_payload_schema(schema: pa.Schema) -> None:
    if schema.equals(PAYLOAD_SCHEMA) or _known_typed_schema(schema):
        return
    raise InvalidRecordBatchError(
        f"payload schema {schema} is neither {PAYLOAD_SCHEMA} nor a typed payload "
        "(the same columns with a struct value and a schema id)")


@functools.lru_cache(maxsize=1024)
def _known_typed_schema(schema: pa.Schema) -> bool:
    """Whether ``schema`` is a typed payload schema (cached: every batch of a typed
    topic has one of a few)."""
    try:
        typed = value_schema_id(schema)
    except InvalidRecordBatchError:
        return False
    value_type = schema.field("value").type if schema.get_field_index("value") == 1 else None
    return typed is not None and isinstance(value_type, pa.StructType) and schema.equals(
        typed_payload_schema(value_type, typed), check_metadata=False)


def schema_message(batch: bytes | bytearray | memoryview) -> bytes:
    """The bytes of the Arrow schema message at the start of a batch's payload.

    Equal bytes mean an equal payload schema (ids included), so a reader of many batches
    parses each distinct schema once. Raises ``InvalidRecordBatchError`` when the
    payload does not start with one.
    """
    view = memoryview(batch)
    if len(view) < HEADER_SIZE + _IPC_PREFIX.size:
        raise InvalidRecordBatchError("batch too short to hold an Arrow schema message")
    marker, length = _IPC_PREFIX.unpack_from(view, HEADER_SIZE)
    end = HEADER_SIZE + _IPC_PREFIX.size + length
    if marker != _IPC_CONTINUATION or not 0 < length <= _MAX_SCHEMA_MESSAGE or end > len(view):
        raise InvalidRecordBatchError(
            "the payload does not start with an Arrow IPC schema message; encode batches "
            "with the Strata client (build_batch)")
    return bytes(view[HEADER_SIZE:end])


def payload_schema_of(message: bytes) -> pa.Schema:
    """Parse a ``schema_message``'s bytes (``InvalidRecordBatchError`` when they are not
    an Arrow schema)."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(message))
    except (pa.ArrowException, OSError) as err:
        raise InvalidRecordBatchError(f"the payload's Arrow schema message is invalid: {err}") \
            from err


# --------------------------------------------------------------------------- encoding

_BinaryInput: TypeAlias = Sequence[bytes | None] | pa.Array
_HEADERS_TYPE: Final = PAYLOAD_SCHEMA.field("headers").type


#: An uncompressed ``PAYLOAD_SCHEMA`` stream is this, the batch's IPC message, then
#: ``_END_OF_STREAM`` (what ``pa.ipc.new_stream`` writes; tests/test_record_batch.py
#: checks the bytes are the same).
_PAYLOAD_SCHEMA_MESSAGE: Final = PAYLOAD_SCHEMA.serialize().to_pybytes()
_END_OF_STREAM: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def warm_up_encoder() -> None:
    """Pay ``build_batch``'s one-time cost now: pyarrow imports pandas (when it is
    installed) at its first conversion of a Python list, 0.4-0.7 s on the 2-core VM.
    Producers call this on a worker thread when they start, so that cost overlaps their
    first metadata round trip instead of delaying their first batch."""
    pa.array([b""], type=pa.binary())


def _as_array(values: Any, arrow_type: pa.DataType, name: str) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.type != arrow_type:
            try:
                values = values.cast(arrow_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise InvalidRecordBatchError(
                    f"column {name!r} has type {values.type}, need {arrow_type}"
                ) from err
        return values
    if type(values) is list or type(values) is tuple:
        built = _sequence_array(values, arrow_type)
        if built is not None:
            return built
    try:
        return pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
        raise InvalidRecordBatchError(f"column {name!r} cannot be encoded as {arrow_type}: {err}") \
            from err


def _sequence_array(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array | None:
    """A binary column of bytes/None, or an int64 one of ints, from a Python list
    without ``pa.array``: pyarrow's conversion of Python sequences imports pandas the
    first time it runs (0.3-1 s of CPU and 60 MB in a broker, which never needs it: the
    group and transaction coordinators write their records as lists). ``None`` for any
    other input (``pa.array`` then converts it, and says what is wrong)."""
    n = len(values)
    if arrow_type == pa.int64():
        if not all(type(v) is int for v in values):
            return None  # (bools, None, numpy ints: pa.array's answer, as before)
        try:
            data = array.array("q", values)
        except (TypeError, OverflowError):
            return None
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(data)])
    if arrow_type != pa.binary() or not all(
            type(v) is bytes or v is None for v in values):
        return None
    present = [b"" if v is None else v for v in values]
    offsets = array.array("i", [0])
    try:
        offsets.extend(itertools.accumulate(map(len, present)))
    except OverflowError:  # over 2 GiB: pa.array chunks or refuses it
        return None
    validity = None
    if None in values:
        bits = 0
        for i, v in enumerate(values):
            if v is not None:
                bits |= 1 << i
        validity = pa.py_buffer(bits.to_bytes((n + 7) // 8, "little"))
    return pa.Array.from_buffers(arrow_type, n, [
        validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(present))])


def build_batch(
    values: _BinaryInput,
    *,
    keys: _BinaryInput | None = None,
    timestamps: Sequence[int] | pa.Array | None = None,
    headers: Sequence[Any] | pa.Array | None = None,
    compression: Compression | str | None = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    now_ms: int | None = None,
    base_offset: int = 0,
    value_schema_id: int | None = None,
    transactional: bool = False,
    timestamp_bounds: tuple[int, int] | None = None,
) -> bytes:
    """Encode whole columns into one batch (header + Arrow IPC stream).

    ``timestamp_bounds``: the smallest and largest of ``timestamps``, when the caller
    knows them (``encode_record_batch``).

    ``transactional``: the batch belongs to its producer's open transaction (the
    transactional bit; docs/transactions.md).

    ``value_schema_id`` set: a typed topic's batch; ``values`` is then a StructArray of
    that registered schema's Arrow type (``typed_payload_schema``).

    ``values`` (and optional ``keys``) are bytes/None sequences or Arrow binary arrays;
    ``timestamps`` default to ``now_ms`` (or the wall clock) for every record;
    ``headers`` is a list of ``[(key, value), ...]`` per record or an Arrow array of
    ``list<struct<key: string, value: binary>>``. The base offset is a placeholder
    until the leader assigns one.
    """
    if value_schema_id is None:
        value_array = _as_array(values, pa.binary(), "value")
        payload_schema = PAYLOAD_SCHEMA
    else:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not isinstance(values, pa.StructArray):
            raise InvalidRecordBatchError(
                "a typed batch's values are a pyarrow StructArray of the schema's fields "
                "(convert records with wire.schema.records_to_arrow)")
        value_array = values
        payload_schema = typed_payload_schema(values.type, value_schema_id)
    n = len(value_array)
    if not 1 <= n <= MAX_RECORDS_PER_BATCH:
        raise InvalidRecordBatchError(
            f"a batch holds 1..{MAX_RECORDS_PER_BATCH} records, got {n}"
        )
    key_array = pa.nulls(n, pa.binary()) if keys is None else _as_array(keys, pa.binary(), "key")
    if timestamps is None:
        if now_ms is None:
            import time

            now_ms = time.time_ns() // 1_000_000
        ts_array = pa.repeat(int_scalar(now_ms, pa.int64()), n)
    else:
        ts_array = _as_array(timestamps, pa.int64(), "timestamp")
        if ts_array.null_count:
            raise InvalidRecordBatchError("column 'timestamp' must not contain nulls")
    if headers is None:
        header_array = pa.nulls(n, _HEADERS_TYPE)
    elif isinstance(headers, pa.Array | pa.ChunkedArray):
        header_array = _as_array(headers, _HEADERS_TYPE, "headers")
    else:
        header_array = _as_array(
            [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
            _HEADERS_TYPE,
            "headers",
        )
    for name, column in (("key", key_array), ("timestamp", ts_array), ("headers", header_array)):
        if len(column) != n:
            raise InvalidRecordBatchError(f"column {name!r} has {len(column)} rows, value has {n}")
    record_batch = pa.RecordBatch.from_arrays(
        [key_array, value_array, ts_array, header_array], schema=payload_schema
    )
    return encode_record_batch(
        record_batch,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
        transactional=transactional,
        timestamp_bounds=timestamp_bounds,
    )


def encode_record_batch(
    record_batch: pa.RecordBatch,
    *,
    compression: Compression | str | None = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    base_offset: int = 0,
    transactional: bool = False,
    timestamp_bounds: tuple[int, int] | None = None,
) -> bytes:
    """Encode an Arrow record batch already in ``PAYLOAD_SCHEMA`` (or a typed payload
    schema, ``typed_payload_schema``) into a Strata batch. ``timestamp_bounds``: the
    smallest and largest timestamp, when the caller knows them (else computed)."""
    _check_payload_schema(record_batch.schema)
    codec = compression if isinstance(compression, Compression) else Compression.parse(compression)
    n = record_batch.num_rows
    if not 1 <= n <= MAX_RECORDS_PER_BATCH:
        raise InvalidRecordBatchError(f"a batch holds 1..{MAX_RECORDS_PER_BATCH} records, got {n}")
    if timestamp_bounds is None:
        bounds = pc.min_max(record_batch.column(2))
        first_ts = bounds["min"].as_py()
        max_ts = bounds["max"].as_py()
    else:
        first_ts, max_ts = timestamp_bounds
    if codec is Compression.NONE \
            and record_batch.schema.equals(PAYLOAD_SCHEMA, check_metadata=True):
        # The stream new_stream writes, byte for byte, without its writer's set-up (a
        # fixed cost that counts for batches of a record or a few): the schema message,
        # the batch message, the end-of-stream marker.
        payload = record_batch.serialize()
        out = bytearray(HEADER_SIZE + len(_PAYLOAD_SCHEMA_MESSAGE) + payload.size
                        + len(_END_OF_STREAM))
        at = HEADER_SIZE + len(_PAYLOAD_SCHEMA_MESSAGE)
        out[HEADER_SIZE:at] = _PAYLOAD_SCHEMA_MESSAGE
        out[at:at + payload.size] = payload
        out[at + payload.size:] = _END_OF_STREAM
    else:
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=codec.arrow_codec)
        with pa.ipc.new_stream(sink, record_batch.schema, options=options) as writer:
            writer.write_batch(record_batch)
        stream = sink.getvalue()
        out = bytearray(HEADER_SIZE + stream.size)
        out[HEADER_SIZE:] = stream
    HEADER.pack_into(
        out, 0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        -1,  # leader epoch: stamped by the leader
        MAGIC,
        0,  # crc: filled below
        int(codec) | (_TRANSACTIONAL_BIT if transactional else 0),
        n - 1,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        n,
    )
    struct.pack_into(">I", out, _CRC_AT, crc_of(out))
    return bytes(out)


# --------------------------------------------------------------------------- decoding


def decode_batch(
    batch: bytes | bytearray | memoryview, *, verify: bool = True
) -> tuple[BatchHeader, pa.RecordBatch]:
    """Decode one whole batch into its header and Arrow payload (zero-copy when uncompressed).

    Raises ``InvalidRecordBatchError`` if the header or CRC is bad, or if the payload is
    not one ``PAYLOAD_SCHEMA`` record batch of ``record_count`` rows.
    """
    header = validate(batch, exact=True) if verify else peek_header(batch)
    view = memoryview(batch)
    schema_end = HEADER_SIZE + len(_PAYLOAD_SCHEMA_MESSAGE)
    try:
        if view[HEADER_SIZE:schema_end] == _PAYLOAD_SCHEMA_MESSAGE:
            # The common payload: its stream opens with PAYLOAD_SCHEMA's own message
            # (byte for byte, as build_batch writes it), so the batch message after it
            # is read against the known schema: no stream reader, no schema to parse
            # and compare (20-30 us a batch -> 5-14).
            record_batch = pa.ipc.read_record_batch(
                pa.py_buffer(view[schema_end:header.size]), PAYLOAD_SCHEMA)
        else:
            reader = pa.ipc.open_stream(pa.py_buffer(view[HEADER_SIZE:header.size]))
            _check_payload_schema(reader.schema)
            record_batch = reader.read_next_batch()
        # Arrow's IPC reader checks buffer sizes, not contents: offsets that run
        # backwards or past their data would make later reads go out of bounds.
        # Full validation is linear but cheap (about 5 us per 1,000 records here).
        record_batch.validate(full=True)
    except (pa.ArrowException, OSError, StopIteration) as err:  # Arrow raises all three
        raise InvalidRecordBatchError(f"payload is not a valid Arrow IPC stream: {err}") from err
    if record_batch.num_rows != header.record_count:
        raise InvalidRecordBatchError(
            f"payload holds {record_batch.num_rows} rows, header says {header.record_count}"
        )
    return header, record_batch


CONSUMER_SCHEMA: Final = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),
        pa.field("headers", _HEADERS_TYPE),
    ]
)


class AbortedFilter:
    """Which transactional batches of a read_committed fetch belong to aborted
    transactions (Kafka's consumer algorithm): walking the batches in offset order, a
    producer joins the aborted set when the walk reaches the first offset of one of its
    aborted transactions, its transactional batches are skipped while it is in the set,
    and its ABORT marker takes it out again. One decision per batch, no record is looked
    at. ``aborted`` is what the fetch answered for this partition."""

    __slots__ = ("_active", "_pending")

    def __init__(self, aborted: Sequence[AbortedTransaction]) -> None:
        self._pending = sorted(aborted, key=lambda a: a.first_offset, reverse=True)
        self._active: set[int] = set()

    def skip(self, header: BatchHeader, batch: memoryview) -> bool:
        """Whether this batch is not for the application (an aborted transaction's
        batch, or any control batch)."""
        pending = self._pending
        while pending and pending[-1].first_offset <= header.last_offset:
            self._active.add(pending.pop().producer_id)
        if header.is_control:
            if header.producer_id in self._active:
                # A malformed marker is skipped like any control batch; its producer
                # stays aborted until a well-formed ABORT marker.
                with contextlib.suppress(InvalidRecordBatchError):
                    if parse_control(batch)[0] is ControlType.ABORT:
                        self._active.discard(header.producer_id)
            return True
        return header.is_transactional and header.producer_id in self._active


_SCALAR_FORMATS: Final = {pa.int32(): "<i", pa.int64(): "<q"}


def int_scalar(value: int, arrow_type: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, arrow_type)`` for int32/int64 without ``pa.scalar``: that
    call costs about 19 us (its Python-object conversion) and makes pyarrow import
    pandas the first time (0.2-0.5 s); a one-element array's item costs 1.5 us."""
    return pa.Array.from_buffers(arrow_type, 1, [
        None, pa.py_buffer(struct.pack(_SCALAR_FORMATS[arrow_type], value))])[0]


@functools.lru_cache(maxsize=65536)
def _partition_scalars(topic: str, partition: int) -> tuple[pa.Scalar, pa.Scalar]:
    """The topic and partition columns' scalars of a fetched table (``int_scalar``'s
    reasons), kept per partition: every fetch of it repeats them."""
    name = topic.encode()
    topic_scalar = pa.Array.from_buffers(pa.string(), 1, [
        None, pa.py_buffer(struct.pack("<ii", 0, len(name))), pa.py_buffer(name)])[0]
    return topic_scalar, int_scalar(partition, pa.int32())


_CREATE_TIME: Final = int_scalar(int(TimestampType.CREATE_TIME), pa.int32())


def batches_to_table(
    buf: bytes | bytearray | memoryview,
    *,
    topic: str,
    partition: int,
    start_offset: int = 0,
    end_offset: int | None = None,
    resolve_value: Callable[[int, pa.StructArray], pa.Array] | None = None,
    aborted: Sequence[AbortedTransaction] | None = None,
) -> pa.Table:
    """Decode every whole batch in ``buf`` into one table in ``CONSUMER_SCHEMA``.

    Control batches (transaction markers) are never returned. ``aborted`` (a
    read_committed fetch's aborted transactions for this partition; None or empty at
    read_uncommitted) also drops the batches of aborted transactions (``AbortedFilter``):
    their offsets, like the markers', have no row.

    A typed topic's batches give a table whose ``value`` is a struct: each batch's values
    go through ``resolve_value(schema_id, values)`` (the client's: read them under the
    reader's schema version), so batches written with several versions stitch into one
    column. Without it, typed batches must all share one value type.

    Records below ``start_offset`` or at/after ``end_offset`` are sliced away (a fetch
    starts at the batch containing the wanted offset). The payloads are stitched into
    one table without copying; offsets, topic, partition and timestamp-type columns are
    built once for the whole fetch by Arrow (``arange``/``repeat``), never row by row.
    """
    payloads: list[pa.RecordBatch] = []
    headers: list[BatchHeader] = []
    skip = AbortedFilter(aborted).skip if aborted else None
    for header, view in iter_batches(buf):
        if skip is not None and skip(header, view):
            continue
        if header.next_offset <= start_offset:
            continue
        if end_offset is not None and header.base_offset >= end_offset:
            break
        if header.is_control:
            continue
        payloads.append(decode_batch(view, verify=False)[1])
        headers.append(header)
    if not payloads:
        return CONSUMER_SCHEMA.empty_table()
    total = sum(h.record_count for h in headers)
    first = headers[0].base_offset
    contiguous = headers[-1].next_offset - first == total
    offsets: pa.Array = pa.arange(first, first + total) if contiguous else pa.concat_arrays(
        [pa.arange(h.base_offset, h.next_offset) for h in headers])
    consumer_schema = CONSUMER_SCHEMA
    if all(p.schema is PAYLOAD_SCHEMA or p.schema.equals(PAYLOAD_SCHEMA) for p in payloads):
        payload = pa.Table.from_batches(payloads, schema=PAYLOAD_SCHEMA)
    else:
        try:
            payload, value_type = _typed_payload(payloads, resolve_value)
        except SchemaMismatchError as err:
            # Name where: the resolver knows neither the partition nor the offsets.
            located = SchemaMismatchError(
                f"{topic}-{partition}, a batch in offsets {first}.."
                f"{headers[-1].next_offset - 1}: {err.message}. Read it under the version "
                "it was written with (value_schema_version / valueSchemaVersion), or as "
                "JSON (value_format='json')")
            vars(located).update({k: v for k, v in vars(err).items()
                                  if k in ("field", "reason")})
            raise located from None
        consumer_schema = CONSUMER_SCHEMA.set(1, pa.field("value", value_type))
    append_time = [h.timestamp_type is TimestampType.LOG_APPEND_TIME for h in headers]
    if not any(append_time):
        timestamps: pa.ChunkedArray | pa.Array = payload.column(2)
        types: pa.Array = pa.repeat(_CREATE_TIME, total)
    else:
        timestamps = pa.chunked_array([
            pa.repeat(int_scalar(h.max_timestamp, pa.int64()), h.record_count) if log_time
            else p.column(2) for h, p, log_time in zip(headers, payloads, append_time,
                                                        strict=True)], pa.int64())
        types = pa.chunked_array([
            pa.repeat(int_scalar(int(h.timestamp_type), pa.int32()), h.record_count)
            for h in headers], pa.int32())
    topic_scalar, partition_scalar = _partition_scalars(topic, partition)
    table = pa.Table.from_arrays(
        [
            payload.column(0),
            payload.column(1),
            pa.repeat(topic_scalar, total),
            pa.repeat(partition_scalar, total),
            offsets,
            timestamps,
            types,
            payload.column(3),
        ],
        schema=consumer_schema,
    )
    if not contiguous:  # offsets with gaps (a compacted log): select by value
        keep = pc.greater_equal(offsets, int_scalar(start_offset, pa.int64()))
        if end_offset is not None:
            keep = pc.and_(keep, pc.less(offsets, int_scalar(end_offset, pa.int64())))
        return table.filter(keep)
    lo = max(0, start_offset - first)
    hi = total if end_offset is None else min(total, end_offset - first)
    if lo or hi < total:
        table = table.slice(lo, hi - lo)
    return table


def _typed_payload(payloads: list[pa.RecordBatch],
                   resolve_value: Callable[[int, pa.StructArray], pa.Array] | None
                   ) -> tuple[pa.Table, pa.DataType]:
    """The payloads of a typed topic's batches as one table, values resolved per batch."""
    values: list[pa.Array] = []
    for p in payloads:
        schema_id = value_schema_id(p.schema)
        if schema_id is None:
            raise InvalidRecordBatchError(
                "a fetch mixes bytes and typed batches; a topic is typed from its creation, "
                "so this is not one partition's data")
        column = p.column(1)
        values.append(column if resolve_value is None else resolve_value(schema_id, column))
    value_type = values[0].type
    if any(v.type != value_type for v in values):
        raise InvalidRecordBatchError(
            "typed batches of several schema versions need a resolver to be read as one "
            "table (pass resolve_value; the Strata consumer does)")
    columns = [pa.chunked_array([p.column(i) for p in payloads], PAYLOAD_SCHEMA.field(i).type)
               if i != 1 else pa.chunked_array(values, value_type) for i in range(4)]
    schema = PAYLOAD_SCHEMA.set(1, pa.field("value", value_type))
    return pa.Table.from_arrays(columns, schema=schema), value_type

