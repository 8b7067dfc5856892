"""The Kafka listener's pure parts: RecordBatch v2 <-> Strata batches, request headers,
the KIP-511 ApiVersions answer and the classic group protocol's encodings.

Kafka batches are built by kafka-python's ``DefaultRecordBatchBuilder`` (an independent
encoder, the oracle) and, for the codecs kafka-python needs extra libraries for, are
recompressed here with the codecs' reference framings (gzip, LZ4 frame, zstd frame, raw
and xerial-framed snappy). Hostile batches: every refusal is an
``InvalidRecordBatchError`` (Kafka's CORRUPT_MESSAGE), never another exception.
"""

from __future__ import annotations

import struct
import zlib

import crc32c
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from brokers.kafka import records
from brokers.kafka.codec import VERSIONS, encode_answer, read_header, unsupported_api_versions
from brokers.kafka.groups import decode_subscription, encode_assignment
from brokers.kafka.records import as_stored, from_kafka, to_kafka
from wire.errors import InvalidRecordBatchError
from wire.record_batch import ControlType, build_control_batch, decode_batch, set_base_offset

pytestmark = pytest.mark.unit

LIMIT = 1 << 20


def kafka_batch(n: int = 5, *, producer_id: int = 42, epoch: int = 3, sequence: int = 7,
                transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=transactional,
        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
        batch_size=1 << 20)
    for i in range(n):
        builder.append(i, timestamp=1_700_000_000_000 + 3 * i,
                       key=None if i % 3 == 1 else b"key-%d" % i,
                       value=None if i == 2 else b"value-%d" % i * (i + 1),
                       headers=[(f"h{i}", b"x"), ("null", None)] if i % 2 else [])
    return bytes(builder.build())


def _crc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))


def recompress(batch: bytes, codec: int, framing: str = "") -> bytes:
    """``batch`` (uncompressed) with its records compressed by ``codec``."""
    records = batch[61:]
    if codec == 1:
        c = zlib.compressobj(wbits=31)
        body = c.compress(records) + c.flush()
    elif codec == 2:
        raw = bytes(pa.compress(records, codec="snappy", asbytes=True))
        body = raw if framing != "xerial" else (
            b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(raw)) + raw)
    elif codec == 3:
        body = bytes(pa.compress(records, codec="lz4", asbytes=True))
    else:
        body = bytes(pa.compress(records, codec="zstd", asbytes=True))
    out = bytearray(batch[:61] + body)
    struct.pack_into(">i", out, 8, len(out) - 12)
    (attributes,) = struct.unpack_from(">h", out, 21)
    struct.pack_into(">h", out, 21, attributes | codec)
    _crc(out)
    return bytes(out)


def oracle(batch: bytes) -> list[tuple[object, ...]]:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
            for r in parsed]


@pytest.mark.parametrize("codec,framing", [(0, ""), (1, ""), (2, ""), (2, "xerial"), (3, ""),
                                           (4, "")])
def test_kafka_batches_of_every_codec_become_the_same_strata_batch(codec: int,
                                                                   framing: str) -> None:
    plain = kafka_batch()
    sent = plain if codec == 0 else recompress(plain, codec, framing)
    strata = from_kafka(sent, max_bytes=LIMIT)
    header, payload = decode_batch(strata)
    assert (header.producer_id, header.producer_epoch, header.base_sequence,
            header.record_count, header.last_offset_delta) == (42, 3, 7, 5, 4)
    assert (header.first_timestamp, header.max_timestamp) == (1_700_000_000_000,
                                                              1_700_000_000_012)
    rows = payload.to_pylist()
    expected = oracle(plain)
    assert [(i, r["timestamp"], r["key"], r["value"],
             [(h["key"], h["value"]) for h in r["headers"] or []])
            for i, r in enumerate(rows)] == expected
    # Back to Kafka: an independent decoder reads the same records.
    assert oracle(to_kafka(strata)) == expected


def test_offsets_and_transactional_bit_survive_the_round_trip() -> None:
    strata = bytearray(from_kafka(kafka_batch(transactional=True), max_bytes=LIMIT))
    struct.pack_into(">q", strata, 0, 1000)  # the leader's base offset
    back = DefaultRecordBatch(to_kafka(bytes(strata)))
    assert back.is_transactional and back.base_offset == 1000
    assert [r.offset for r in back] == list(range(1000, 1005))


@pytest.mark.parametrize("transactional, codec", [(False, 0), (True, 0), (False, 1)])
def test_a_produced_batch_is_kept_as_the_v2_form_of_the_batch_stored(
        transactional: bool, codec: int) -> None:
    """``as_stored``: the producer's bytes (its compression kept) stamped with the log's
    offset and epoch, filed under the head the stored batch has; they read back as the
    records the conversion gives."""
    sent = kafka_batch(transactional=transactional)
    sent = recompress(sent, codec) if codec else sent
    stored = from_kafka(sent, max_bytes=LIMIT)
    kept = bytearray(sent)
    head = as_stored(kept, stored, 1000, 4)
    in_log = bytearray(stored)
    set_base_offset(in_log, 1000, 4)  # what the log does to the stored batch
    assert head == bytes(in_log[:21])
    assert struct.unpack_from(">qii", kept, 0)[::2] == (1000, 4)
    assert kept[8:12] == sent[8:12] and kept[16:] == sent[16:]  # nothing else touched
    assert oracle(bytes(kept)) == oracle(bytes(to_kafka(bytes(in_log))))


def test_a_produced_batch_the_conversion_would_rewrite_is_not_kept() -> None:
    """A header ``to_kafka`` would write otherwise: a max timestamp that is not the
    records' own, a LogAppendTime claim; ``sent`` is left as it was."""
    sent = bytearray(kafka_batch())
    stored = from_kafka(bytes(sent), max_bytes=LIMIT)
    wrong_max = bytearray(sent)
    struct.pack_into(">q", wrong_max, 35, 1)
    _crc(wrong_max)
    claims_append_time = bytearray(sent)
    struct.pack_into(">h", claims_append_time, 21, 0x08)
    _crc(claims_append_time)
    transactional = bytearray(kafka_batch(transactional=True))
    for other in (wrong_max, claims_append_time, transactional):
        before = bytes(other)
        assert as_stored(other, stored, 1000, 4) is None
        assert bytes(other) == before


def test_a_strata_transaction_marker_is_a_kafka_control_batch() -> None:
    marker = to_kafka(build_control_batch(9, 2, ControlType.COMMIT, 5, 1_700_000_000_000))
    parsed = DefaultRecordBatch(marker)
    assert parsed.validate_crc() and parsed.is_control_batch and parsed.is_transactional
    (record,) = list(parsed)
    assert struct.unpack(">hh", record.key) == (0, 1)  # version 0, COMMIT
    assert struct.unpack(">hi", record.value) == (0, 5)


def _refused(batch: bytes, match: str) -> None:
    with pytest.raises(InvalidRecordBatchError, match=match):
        from_kafka(batch, max_bytes=LIMIT)


def test_damaged_batches_are_refused_with_a_reason() -> None:
    good = kafka_batch()
    flipped = bytearray(good)
    flipped[-3] ^= 0x40
    _refused(bytes(flipped), "CRC")
    old = bytearray(good)
    old[16] = 1
    _refused(bytes(old), "magic 1")
    _refused(good + b"\x00", "does not match")
    _refused(good[:40], "at least 61")
    control = bytearray(good)
    struct.pack_into(">h", control, 21, 0x20)
    _crc(control)
    _refused(bytes(control), "control")
    count = bytearray(good)
    struct.pack_into(">i", count, 57, 6)
    _crc(count)
    _refused(bytes(count), "record count 6")
    # A record whose offset delta skips one.
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=1, key=None, value=b"a", headers=[])
    builder.append(2, timestamp=1, key=None, value=b"b", headers=[])
    _refused(bytes(builder.build()), "offset delta")


def test_a_compression_bomb_is_refused_before_it_is_inflated() -> None:
    big = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                    producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                    batch_size=1 << 24)
    big.append(0, timestamp=1, key=None, value=b"\x00" * (4 << 20), headers=[])
    for codec in (1, 3, 4):
        bomb = recompress(bytes(big.build()), codec)
        assert len(bomb) < 100_000
        with pytest.raises(InvalidRecordBatchError, match="expands past"):
            from_kafka(bomb, max_bytes=LIMIT)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1,
                max_size=4), st.booleans())
def test_random_damage_is_refused_or_decoded_never_crashes(
        edits: list[tuple[int, int]], fix_crc: bool) -> None:
    batch = bytearray(recompress(kafka_batch(8), 1) if edits[0][0] % 2 else kafka_batch(8))
    for position, xor in edits:
        batch[position % len(batch)] ^= xor
    if fix_crc:
        _crc(batch)
    try:
        strata = from_kafka(bytes(batch), max_bytes=LIMIT)
    except InvalidRecordBatchError:
        return
    header, payload = decode_batch(strata)  # whatever was accepted is a whole batch
    assert payload.num_rows == header.record_count


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidRecordBatchError):
        from_kafka(data, max_bytes=LIMIT)


# ----------------------------------------------------------------------------- framing
def test_request_headers_v1_and_v2_read_like_kafka_writes_them() -> None:
    request = ApiVersionsRequest(client_software_name="x", client_software_version="1")
    request.with_header(correlation_id=77, client_id="cli")
    frame = request.encode(version=3, header=True, framed=True)
    header, body = read_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id,
            header.flexible) == (18, 3, 77, "cli", True)
    assert ApiVersionsRequest.decode(bytes(body), version=3).client_software_name == "x"
    answer = ApiVersionsResponse(error_code=0, api_keys=[], throttle_time_ms=0)
    framed = b"".join(encode_answer(header, answer))
    # ApiVersions' response header is v0 even for flexible versions (no tagged fields).
    assert struct.unpack_from(">ii", framed) == (len(framed) - 4, 77)
    assert ApiVersionsResponse.decode(framed[8:], version=3).error_code == 0


def test_kip_511_answer_to_an_unknown_api_versions_version() -> None:
    request = ApiVersionsRequest(client_software_name="x", client_software_version="1")
    request.with_header(correlation_id=5, client_id="cli")
    header, _ = read_header(request.encode(version=4, header=True, framed=True)[4:])
    header.api_version = 9
    answer = unsupported_api_versions(header)
    decoded = ApiVersionsResponse.decode(answer[8:], version=0)
    assert decoded.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys] == \
        [(18, *VERSIONS[18][:2])]


def test_produce_is_advertised_from_v0_and_served_from_v3() -> None:
    assert VERSIONS[0][0] == 0 and VERSIONS[0][2] == 3


def test_group_protocol_encodings() -> None:
    subscription = (struct.pack(">hi", 1, 2) + struct.pack(">h", 1) + b"a"
                    + struct.pack(">h", 1) + b"b" + struct.pack(">i", -1)
                    + struct.pack(">i", 1) + struct.pack(">h", 1) + b"a"
                    + struct.pack(">iii", 2, 0, 3))
    topics, owned = decode_subscription(subscription)
    assert topics == ["a", "b"] and owned == {("a", 0), ("a", 3)}
    assignment = encode_assignment(frozenset({("b", 1), ("a", 2), ("a", 0)}))
    assert assignment == (struct.pack(">hi", 0, 2) + struct.pack(">h", 1) + b"a"
                          + struct.pack(">iii", 2, 0, 2) + struct.pack(">h", 1) + b"b"
                          + struct.pack(">ii", 1, 1) + struct.pack(">i", -1))


# ----------------------------------------------------------------------------- C vs Python
def test_the_c_codec_is_built() -> None:
    """`make setup` builds brokers/kafka/_v2codec.c; without it the listener falls back to
    the Python walk, which is several times slower (docs/kafka-compatibility.md)."""
    assert records._v2codec is not None


_values = st.one_of(st.none(), st.binary(max_size=40))
_headers = st.lists(st.tuples(st.text(max_size=8), _values), max_size=3)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_values, _values, st.integers(-5, 10**6), _headers), min_size=1,
                max_size=30),
       st.integers(0, 4))
def test_c_and_python_codecs_agree(rows: list[tuple[bytes | None, bytes | None, int,
                                                    list[tuple[str, bytes | None]]]],
                                   codec: int) -> None:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=5, producer_epoch=0, base_sequence=0,
                                        batch_size=1 << 20)
    base = 1_700_000_000_000
    for i, (key, value, ts, headers) in enumerate(rows):
        builder.append(i, timestamp=base + ts, key=key, value=value, headers=headers)
    plain = bytes(builder.build())
    sent = plain if codec == 0 else recompress(plain, codec)
    with_c = from_kafka(sent, max_bytes=LIMIT)
    saved = records._v2codec
    records._v2codec = None
    try:
        with_python = from_kafka(sent, max_bytes=LIMIT)
        back_python = to_kafka(with_c)
    finally:
        records._v2codec = saved
    assert decode_batch(with_c)[1].to_pylist() == decode_batch(with_python)[1].to_pylist()
    fields = ("attributes", "last_offset_delta", "first_timestamp", "max_timestamp",
              "producer_id", "producer_epoch", "base_sequence", "record_count")
    c_header, python_header = decode_batch(with_c)[0], decode_batch(with_python)[0]
    assert [getattr(c_header, f) for f in fields] == [getattr(python_header, f) for f in fields]
    assert to_kafka(with_c) == back_python
    assert oracle(to_kafka(with_c)) == oracle(plain)


def test_a_timestamp_past_int64_is_refused_by_both_walks() -> None:
    """first_ts + a record's delta beyond int64 is a corrupt batch (CORRUPT_MESSAGE), in C
    and in Python alike, never a wrapped timestamp or an internal error."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=0, key=None, value=b"a", headers=[])
    builder.append(1, timestamp=10, key=None, value=b"b", headers=[])
    batch = bytearray(builder.build())
    struct.pack_into(">q", batch, 27, (1 << 63) - 5)  # first_ts: the second record overflows
    _crc(batch)
    assert records._v2codec is not None
    with pytest.raises(InvalidRecordBatchError, match="record 1: its timestamp overflows"):
        from_kafka(bytes(batch), max_bytes=LIMIT)
    saved = records._v2codec
    records._v2codec = None
    try:
        with pytest.raises(InvalidRecordBatchError, match="record 1: its timestamp overflows"):
            from_kafka(bytes(batch), max_bytes=LIMIT)
    finally:
        records._v2codec = saved


def test_the_c_encoder_writes_past_its_size_bound_by_growing() -> None:
    """The C encoder writes into a bytearray sized once at an upper bound that arrays
    passing Arrow's validation never pass (and leaves ``prefix`` zero bytes for the batch
    header). Header lists that overlap across a null row (which that validation would
    refuse) pass the bound; the encoder then grows its output, never overruns it."""
    codec = records._v2codec
    assert codec is not None
    zeros4 = struct.pack("<4i", 0, 0, 0, 0)
    args = (3, 0, struct.pack("<3q", 0, 0, 0),
            None, zeros4, b"", 0,  # keys: three empty
            None, zeros4, b"", 0,  # values: three empty
            bytes([0b101]), struct.pack("<4i", 0, 50, 0, 50), 0,  # rows 0 and 2: [0, 50)
            struct.pack("<51i", *range(0, 5100, 100)), b"k" * 5000, 0,
            None, struct.pack("<51i", *[0] * 51), b"", 0)
    plain = codec.encode(*args)
    framed = codec.encode(*args, 61)
    assert isinstance(framed, bytearray) and framed[:61] == bytes(61)
    assert framed[61:] == plain
    # Two records of 50 headers of 100-byte keys each, past the 5,740-byte bound.
    assert len(plain) > 2 * 50 * 101 > 3 * 40 + 50 * 10 + 5000
    with pytest.raises(ValueError):
        codec.encode(*args, -1)
