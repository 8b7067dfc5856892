"""Kafka's RecordBatch v2 to Strata's Arrow batch and back (the Kafka listener's records).

Layout of a Kafka v2 batch (apache/kafka ``DefaultRecordBatch``; big-endian)::

    61-byte header, field for field the one ``wire.record_batch`` documents, with
    magic 2 and Kafka's attribute bits: 0-2 compression (0 none, 1 gzip, 2 snappy,
    3 lz4, 4 zstd), 3 timestamp type, 4 transactional, 5 control, 6 delete horizon
    records (compressed as a whole when bits 0-2 are not 0), each:
        varint length, int8 attributes (0), varlong timestamp delta, varint offset
        delta, varint key length (-1: null), key, varint value length, value,
        varint header count, per header: varint key length, key (UTF-8), varint
        value length (-1: null), value

Invariants:

* One Kafka batch becomes one Strata batch with the same record count, producer id,
  epoch, base sequence, transactional bit and timestamps, so offsets, idempotence and
  transactions behave the same whichever protocol wrote it; the broker assigns the base
  offset to the converted batch exactly as to its own.
* Everything is checked before anything is built: magic, lengths, the CRC32C, each
  record's offset delta (0, 1, 2, ... as Kafka's broker requires), header keys as UTF-8,
  and that the records fill the batch exactly. A bad batch raises
  ``InvalidRecordBatchError`` (Kafka's CORRUPT_MESSAGE on the wire) and nothing is
  written.
* Control batches (transaction markers) map one to one: Strata's control payload *is*
  Kafka's control record (key: version, type; value: version, coordinator epoch).

Cost: the records are walked in C (``_v2codec.c``: one call per batch returns whole
Arrow buffers, wrapped with ``pyarrow.Array.from_buffers``; no Python object per record).
Where that extension was not built (a source tree without a compiler), the same walk
runs in Python (``_decode_py``/``_encode_py``, about 2-3 us a record), which is also the
oracle the tests compare the C codec with.

Thread-safety: pure functions.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterable
from typing import Final, cast

import crc32c as _crc32c
import pyarrow as pa

from wire.errors import InvalidRecordBatchError
from wire.record_batch import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_RECORDS_PER_BATCH,
    PAYLOAD_SCHEMA,
    build_batch,
    decode_batch,
    encode_record_batch,
    peek_header,
    set_base_offset,
)

try:
    from brokers.kafka import _v2codec  # type: ignore[attr-defined]
except ImportError:  # not built (a source tree without a C compiler): the Python walk
    _v2codec = None

_HEADERS_TYPE: Final = PAYLOAD_SCHEMA.field("headers").type
_HEADER_FIELDS: Final = tuple(_HEADERS_TYPE.value_type)

__all__ = ["KAFKA_MAGIC", "as_stored", "from_kafka", "to_kafka", "iter_strata_batches"]

KAFKA_MAGIC: Final = 2
_CRC_FROM: Final = 21
_COMPRESSION_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20
_ATTRIBUTES: Final = struct.Struct(">h")
_CODEC_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"


_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's signed varint/varlong) at ``pos``: (value, next pos)."""
    shift = 0
    raw = 0
    while True:
        try:
            byte = buf[pos]
        except IndexError:
            raise InvalidRecordBatchError("a record runs past the end of its batch") from None
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise InvalidRecordBatchError("a varint in a record is longer than 10 bytes")


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _snappy_raw_length(data: bytes) -> int:
    length, shift, pos = 0, 0, 0
    while True:
        if pos >= len(data) or shift > 35:
            raise InvalidRecordBatchError("snappy data without a valid length preamble")
        byte = data[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return length
        shift += 7


def _snappy(data: bytes, limit: int) -> bytes:
    codec = pa.Codec("snappy")
    if not data.startswith(_XERIAL_MAGIC):  # librdkafka: one raw snappy block
        size = _snappy_raw_length(data)
        if size > limit:
            raise InvalidRecordBatchError(f"snappy data would expand past {limit} bytes")
        return bytes(codec.decompress(data, decompressed_size=size))
    # The Java client's xerial framing: 16-byte header, then [int32 length, block]...
    out = bytearray()
    pos = 16
    while pos < len(data):
        if pos + 4 > len(data):
            raise InvalidRecordBatchError("truncated xerial snappy block")
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise InvalidRecordBatchError("truncated xerial snappy block")
        block = data[pos:pos + n]
        pos += n
        size = _snappy_raw_length(block)
        if len(out) + size > limit:
            raise InvalidRecordBatchError(f"snappy data would expand past {limit} bytes")
        out += codec.decompress(block, decompressed_size=size)
    return bytes(out)


def _decompress(codec: int, data: bytes, limit: int) -> bytes:
    """Kafka's record codecs; ``limit`` bounds what a hostile batch can make us allocate."""
    try:
        if codec == 1:
            inflater = zlib.decompressobj(wbits=31)
            out = inflater.decompress(data, limit + 1)
            if len(out) > limit:
                raise InvalidRecordBatchError(f"gzip data expands past {limit} bytes")
            return out
        if codec == 2:
            return _snappy(data, limit)
        if codec in (3, 4):
            return _framed(_CODEC_NAMES[codec], data, limit)
    except InvalidRecordBatchError:
        raise
    except (zlib.error, gzip.BadGzipFile, pa.ArrowException, OSError, ValueError) as err:
        raise InvalidRecordBatchError(
            f"{_CODEC_NAMES[codec]} records do not decompress: {err}") from None
    raise InvalidRecordBatchError(
        f"compression codec {codec} is unknown (Kafka's are 0 none, 1 gzip, 2 snappy, "
        "3 lz4, 4 zstd)")


def _framed(codec: str, data: bytes, limit: int) -> bytes:
    """LZ4 frame or zstd frame data (what Kafka's v2 batches use; pyarrow's "lz4" is the
    frame format), read as a stream: the one-shot decompress needs the size up front."""
    out = pa.input_stream(pa.py_buffer(data), compression=codec).read(limit + 1)
    if len(out) > limit:
        raise InvalidRecordBatchError(f"{codec} data expands past {limit} bytes")
    return bytes(out)


def from_kafka(batch: bytes | bytearray | memoryview, *, max_bytes: int) -> bytes:
    """One whole Kafka v2 batch (as a producer sends it) as one Strata batch.

    ``max_bytes``: the most the records may expand to (the broker's message.max.bytes
    bound), so a compression bomb is refused before it is inflated.
    """
    raw = bytes(batch)
    if len(raw) < HEADER_SIZE:
        raise InvalidRecordBatchError(
            f"a Kafka record batch is at least {HEADER_SIZE} bytes, got {len(raw)}")
    (_, length, _, magic, crc, attributes, last_delta, first_ts, _max_ts, producer_id,
     producer_epoch, base_sequence, count) = HEADER.unpack_from(raw, 0)
    if magic != KAFKA_MAGIC:
        raise InvalidRecordBatchError(
            f"record batch magic {magic}: this broker takes Kafka's RecordBatch v2 (magic 2) "
            "on its Kafka listener; use a client from Kafka 0.11 or later")
    if length + LOG_OVERHEAD != len(raw):
        raise InvalidRecordBatchError(
            f"batch length {length} does not match the {len(raw)} bytes sent (one whole "
            "batch per partition)")
    if int(_crc32c.crc32c(memoryview(raw)[_CRC_FROM:])) != crc:
        raise InvalidRecordBatchError("record batch CRC32C mismatch: the batch is corrupt")
    if attributes & _CONTROL_BIT:
        raise InvalidRecordBatchError("a producer may not write control batches")
    if not 1 <= count <= MAX_RECORDS_PER_BATCH or last_delta != count - 1:
        raise InvalidRecordBatchError(
            f"record count {count} with last offset delta {last_delta}: a batch holds "
            f"1..{MAX_RECORDS_PER_BATCH} records numbered from 0")
    body = raw[HEADER_SIZE:]
    codec = attributes & _COMPRESSION_MASK
    if codec:
        body = _decompress(codec, body, max_bytes)
    transactional = bool(attributes & _TRANSACTIONAL_BIT)
    if _v2codec is not None:
        try:
            columns, bounds = _decode_c(body, count, first_ts)
        except ValueError as err:
            raise InvalidRecordBatchError(str(err)) from None
        return encode_record_batch(
            pa.RecordBatch.from_arrays(columns, schema=PAYLOAD_SCHEMA),
            producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence, transactional=transactional,
            timestamp_bounds=bounds)
    return _decode_py(body, count, first_ts, producer_id, producer_epoch, base_sequence,
                      transactional)


def _bitmap(data: bytes, nulls: int) -> pa.Buffer | None:
    return None if nulls == 0 else pa.py_buffer(data)


def _decode_c(body: bytes, count: int, first_ts: int
              ) -> tuple[list[pa.Array], tuple[int, int]]:
    """The four payload columns of ``count`` records, from the C walk's buffers, and
    their (min, max) timestamp."""
    assert _v2codec is not None
    (ts, kv, ko, kd, key_nulls, vv, vo, vd, value_nulls, hv, ho, hdr_nulls, hko, hkd, hvv,
     hvo, hvd, hv_nulls, headers, min_ts, max_ts) = _v2codec.decode(body, count, first_ts)
    keys = pa.Array.from_buffers(pa.binary(), count, [_bitmap(kv, key_nulls),
                                                      pa.py_buffer(ko), pa.py_buffer(kd)],
                                 null_count=key_nulls)
    values = pa.Array.from_buffers(pa.binary(), count, [_bitmap(vv, value_nulls),
                                                        pa.py_buffer(vo), pa.py_buffer(vd)],
                                   null_count=value_nulls)
    timestamps = pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(ts)])
    header_keys = pa.Array.from_buffers(pa.string(), headers,
                                        [None, pa.py_buffer(hko), pa.py_buffer(hkd)])
    header_values = pa.Array.from_buffers(pa.binary(), headers,
                                          [_bitmap(hvv, hv_nulls), pa.py_buffer(hvo),
                                           pa.py_buffer(hvd)], null_count=hv_nulls)
    try:
        header_keys.validate(full=True)  # UTF-8, as Kafka's keys must be
    except pa.ArrowInvalid:
        raise ValueError("a header key is not UTF-8") from None
    entries = pa.StructArray.from_arrays([header_keys, header_values],
                                         fields=list(_HEADER_FIELDS))
    header_lists = pa.Array.from_buffers(_HEADERS_TYPE, count,
                                         [_bitmap(hv, hdr_nulls), pa.py_buffer(ho)],
                                         null_count=hdr_nulls, children=[entries])
    return [keys, values, timestamps, header_lists], (min_ts, max_ts)


def _decode_py(body: bytes, count: int, first_ts: int, producer_id: int,
               producer_epoch: int, base_sequence: int, transactional: bool) -> bytes:
    """``from_kafka``'s walk in Python: the fallback, and the tests' oracle for C."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    timestamps: list[int] = []
    headers: list[list[tuple[str, bytes | None]] | None] = []
    pos = 0
    end = len(body)
    read = _read_varint
    for expected in range(count):
        size, pos = read(body, pos)
        record_end = pos + size
        if size < 1 or record_end > end:
            raise InvalidRecordBatchError(f"record {expected} runs past its batch")
        pos += 1  # record attributes: unused (always 0)
        ts_delta, pos = read(body, pos)
        offset_delta, pos = read(body, pos)
        if offset_delta != expected:
            raise InvalidRecordBatchError(
                f"record {expected} has offset delta {offset_delta}")
        n, pos = read(body, pos)
        if n < 0:
            keys.append(None)
        else:
            keys.append(body[pos:pos + n])
            pos += n
        n, pos = read(body, pos)
        if n < 0:
            values.append(None)
        else:
            values.append(body[pos:pos + n])
            pos += n
        n_headers, pos = read(body, pos)
        if n_headers < 0:
            raise InvalidRecordBatchError(f"record {expected} has {n_headers} headers")
        if n_headers:
            record_headers: list[tuple[str, bytes | None]] = []
            for _ in range(n_headers):
                n, pos = read(body, pos)
                if n < 0:
                    raise InvalidRecordBatchError("a header key is null")
                try:
                    key = body[pos:pos + n].decode()
                except UnicodeDecodeError:
                    raise InvalidRecordBatchError("a header key is not UTF-8") from None
                pos += n
                n, pos = read(body, pos)
                if n < 0:
                    record_headers.append((key, None))
                else:
                    record_headers.append((key, body[pos:pos + n]))
                    pos += n
            headers.append(record_headers)
        else:
            headers.append(None)
        if pos != record_end:
            raise InvalidRecordBatchError(
                f"record {expected} is {size} bytes long but its fields take "
                f"{pos - record_end + size}")
        stamp = first_ts + ts_delta
        if not _INT64_MIN <= stamp <= _INT64_MAX:
            raise InvalidRecordBatchError(f"record {expected}: its timestamp overflows")
        timestamps.append(stamp)
    if pos != end:
        raise InvalidRecordBatchError(f"{end - pos} bytes follow the batch's last record")
    return build_batch(
        values, keys=keys, timestamps=timestamps,
        headers=headers if any(h is not None for h in headers) else None,
        producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=base_sequence, transactional=transactional,
        timestamp_bounds=(min(timestamps), max(timestamps)))


def _bytes_field(value: bytes | None) -> bytes:
    if value is None:
        return b"\x01"  # varint -1
    return _varint(len(value)) + value


def as_stored(sent: bytearray, stored: bytes, base_offset: int,
              leader_epoch: int) -> bytes | None:
    """A produced v2 batch ``sent`` made the v2 form of ``stored`` (``from_kafka(sent)``)
    as the log holds it at ``base_offset`` in ``leader_epoch``: both fields stamped into
    ``sent`` (in place), and the head (``KEY_BYTES`` of fetch_cache.py) the stored batch
    then has returned. None, with ``sent`` untouched, when ``to_kafka`` would write the
    header differently: another last offset delta, first or max timestamp, producer id,
    epoch, sequence or count (a client's max timestamp that is not its records' own),
    another transactional bit, or any attribute beyond the compression codec (a
    LogAppendTime claim). The producer's compression is kept, as Kafka keeps it."""
    if len(sent) < HEADER_SIZE or len(stored) < HEADER_SIZE or \
            sent[23:HEADER_SIZE] != stored[23:HEADER_SIZE]:
        return None
    (attributes,) = _ATTRIBUTES.unpack_from(sent, _CRC_FROM)
    (stored_attributes,) = _ATTRIBUTES.unpack_from(stored, _CRC_FROM)
    if attributes & ~_COMPRESSION_MASK != stored_attributes & _TRANSACTIONAL_BIT:
        return None
    set_base_offset(sent, base_offset, leader_epoch)
    return bytes(sent[:8]) + stored[8:12] + bytes(sent[12:16]) + stored[16:_CRC_FROM]


def to_kafka(batch: bytes | bytearray | memoryview) -> bytearray:
    """One whole Strata batch (as the log holds it) as a Kafka v2 batch with the same
    offsets, producer fields, attributes' meaning and timestamps (uncompressed)."""
    header = peek_header(batch)
    attributes = 0
    if header.attributes & _TIMESTAMP_TYPE_BIT:
        attributes |= _TIMESTAMP_TYPE_BIT
    if header.is_transactional:
        attributes |= _TRANSACTIONAL_BIT
    first_ts = header.first_timestamp
    if header.is_control:
        attributes |= _CONTROL_BIT
        control = bytes(memoryview(batch)[HEADER_SIZE:header.size])
        record = (b"\x00" + _varint(0) + _varint(0) + _bytes_field(control[:4])
                  + _bytes_field(control[4:]) + _varint(0))
        records = _varint(len(record)) + record
        if header.delete_horizon_ms is not None:
            first_ts = header.max_timestamp
        out = bytearray(HEADER_SIZE + len(records))
        out[HEADER_SIZE:] = records
    else:
        _, payload = decode_batch(batch, verify=False)
        out = _encode_records(payload, first_ts, prefix=HEADER_SIZE)
    HEADER.pack_into(out, 0, header.base_offset, len(out) - LOG_OVERHEAD, header.leader_epoch,
                     KAFKA_MAGIC, 0, attributes, header.last_offset_delta, first_ts,
                     header.max_timestamp, header.producer_id, header.producer_epoch,
                     header.base_sequence, header.record_count)
    struct.pack_into(">I", out, 17, int(_crc32c.crc32c(memoryview(out)[_CRC_FROM:])))
    return out  # (no bytes() copy: the fetch joins the batches into its answer anyway)


def _encode_records(payload: pa.RecordBatch, first_ts: int, *,
                    prefix: int = 0) -> bytearray:
    """The records as v2 bytes after ``prefix`` zero bytes (the batch header's room)."""
    value_column = payload.column("value")
    if not pa.types.is_binary(value_column.type):
        raise InvalidRecordBatchError(
            "a typed topic's batch has no Kafka encoding yet: read typed topics with the "
            "Strata client or Spark")
    if _v2codec is not None:
        return _encode_c(payload, first_ts, prefix)
    records = _encode_py(payload, first_ts)
    out = bytearray(prefix + len(records))
    out[prefix:] = records
    return out


def _encode_c(payload: pa.RecordBatch, first_ts: int, prefix: int = 0) -> bytearray:
    assert _v2codec is not None
    keys, values, timestamps, headers = (payload.column(i) for i in range(4))
    entries = headers.values  # the struct child, unsliced (offsets index into it)
    header_keys, header_values = entries.field(0), entries.field(1)
    key_valid, key_off, key_data = keys.buffers()
    value_valid, value_off, value_data = values.buffers()
    ts_data = timestamps.buffers()[1]
    hdr_valid, hdr_off = headers.buffers()[:2]
    hk_off, hk_data = header_keys.buffers()[1:3]
    hv_valid, hv_off, hv_data = header_values.buffers()
    ts_bytes = memoryview(ts_data)[timestamps.offset * 8:]
    return _v2codec.encode(  # type: ignore[no-any-return]
        len(payload), first_ts, ts_bytes,
        key_valid, key_off, key_data, keys.offset,
        value_valid, value_off, value_data, values.offset,
        hdr_valid, hdr_off, headers.offset,
        hk_off, hk_data, header_keys.offset + entries.offset,
        hv_valid, hv_off, hv_data, header_values.offset + entries.offset, prefix)


def _encode_py(payload: pa.RecordBatch, first_ts: int) -> bytes:
    """``to_kafka``'s records in Python: the fallback, and the tests' oracle for C."""
    keys = payload.column("key").to_pylist()
    values = payload.column("value").to_pylist()
    timestamps = payload.column("timestamp").to_pylist()
    header_lists = payload.column("headers").to_pylist()
    out = bytearray()
    varint = _varint
    field = _bytes_field
    for i, value in enumerate(values):
        record = bytearray(b"\x00")
        record += varint(timestamps[i] - first_ts)
        record += varint(i)
        record += field(keys[i])
        record += field(value)
        hs = header_lists[i]
        if hs:
            record += varint(len(hs))
            for h in hs:
                record += field(h["key"].encode())
                record += field(h["value"])
        else:
            record += b"\x00"
        out += varint(len(record))
        out += record
    return bytes(out)


def iter_strata_batches(records: object) -> Iterable[memoryview]:
    """The whole batches of a fetch answer's ``records`` (bytes, a file slice, or a
    list of them), in order; a partial batch at the end is dropped (the next fetch
    starts at it)."""
    parts: list[object] = list(records) if isinstance(records, list | tuple) else [records]
    for part in parts:
        if part is None:
            continue
        data = part.read_bytes() if hasattr(part, "read_bytes") \
            else bytes(cast(bytes, part))
        view = memoryview(data)  # batches as views: a slice of bytes would copy each
        pos = 0
        while pos + LOG_OVERHEAD <= len(data):
            (length,) = struct.unpack_from(">i", data, pos + 8)
            end = pos + LOG_OVERHEAD + length
            if length < HEADER_SIZE - LOG_OVERHEAD or end > len(data):
                break
            yield view[pos:end]
            pos = end
