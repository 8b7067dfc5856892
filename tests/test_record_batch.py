"""Unit and property tests of the record batch codec (``wire/record_batch.py``).

Byte offsets are checked against the layout in the module docstring with an
independent ``struct``/``crc32c`` reading, not with the module's own ``HEADER``.
"""

from __future__ import annotations

import contextlib
import struct

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wire.errors import CorruptRecordError, InvalidRecordBatchError
from wire.record_batch import (
    CONSUMER_SCHEMA,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAX_RECORDS_PER_BATCH,
    PAYLOAD_SCHEMA,
    AbortedFilter,
    AbortedTransaction,
    Compression,
    ControlType,
    TimestampType,
    batches_to_table,
    build_batch,
    build_control_batch,
    crc_of,
    decode_batch,
    iter_batches,
    parse_control,
    peek_header,
    set_base_offset,
    set_log_append_time,
    validate,
)

pytestmark = pytest.mark.unit

TYPED = (InvalidRecordBatchError, CorruptRecordError)


def _field(batch: bytes | bytearray, fmt: str, at: int) -> int:
    return int(struct.unpack_from(">" + fmt, batch, at)[0])


def _with_field(batch: bytes, fmt: str, at: int, value: int, *, fix_crc: bool = True) -> bytes:
    """A copy of ``batch`` with one header field rewritten (CRC recomputed by default)."""
    out = bytearray(batch)
    struct.pack_into(">" + fmt, out, at, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _sample(n: int = 3, **kwargs: object) -> bytes:
    return build_batch([f"value-{i}".encode() for i in range(n)],
                       keys=[f"k{i}".encode() for i in range(n)],
                       timestamps=[1_000 + i for i in range(n)], **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- round trip

@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_round_trip_all_columns(compression: str) -> None:
    values = [b"v0", None, b"", b"\x00\xff" * 100]
    keys = [None, b"k1", b"k2", b""]
    timestamps = [5_000, 1_000, 9_000, 7_000]  # not monotonic on purpose
    headers = [[("h", b"1"), ("h2", None)], None, [], [("trace", b"\x01\x02")]]
    batch = build_batch(values, keys=keys, timestamps=timestamps, headers=headers,
                        compression=compression, producer_id=42, producer_epoch=3,
                        base_sequence=17)
    header, payload = decode_batch(batch)
    assert payload.schema.equals(PAYLOAD_SCHEMA)
    assert payload.column(0).to_pylist() == keys
    assert payload.column(1).to_pylist() == values
    assert payload.column(2).to_pylist() == timestamps
    assert payload.column(3).to_pylist() == [
        [{"key": "h", "value": b"1"}, {"key": "h2", "value": None}], None, [],
        [{"key": "trace", "value": b"\x01\x02"}]]
    assert header.record_count == 4
    assert header.first_timestamp == 1_000
    assert header.max_timestamp == 9_000
    assert header.compression is Compression.parse(compression)
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 17)
    assert header.last_sequence == 20
    assert header.size == len(batch)


def test_compression_actually_compresses() -> None:
    values = [b"a" * 1000] * 50
    plain = build_batch(values, now_ms=1)
    for codec in ("lz4", "zstd"):
        packed = build_batch(values, now_ms=1, compression=codec)
        assert len(packed) < len(plain) // 4, codec
        assert decode_batch(packed)[1].column(1).to_pylist() == values


def test_round_trip_arrow_arrays_and_defaults() -> None:
    values = pa.array([b"x", b"y"], pa.binary())
    batch = build_batch(values, now_ms=123)
    header, payload = decode_batch(batch)
    assert payload.column(0).to_pylist() == [None, None]  # keys default to null
    assert payload.column(2).to_pylist() == [123, 123]  # timestamps default to now_ms
    assert payload.column(3).to_pylist() == [None, None]
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.last_sequence == -1


def test_build_rejects_bad_input() -> None:
    with pytest.raises(InvalidRecordBatchError):
        build_batch([])
    with pytest.raises(InvalidRecordBatchError):
        build_batch([b"a", b"b"], keys=[b"only-one"])
    with pytest.raises(InvalidRecordBatchError):
        build_batch([b"a"], timestamps=[None])  # type: ignore[list-item]
    with pytest.raises(InvalidRecordBatchError):
        build_batch(["not bytes", 3])  # type: ignore[list-item]
    with pytest.raises(InvalidRecordBatchError):
        build_batch([b"a"], compression="snappy")


# ----------------------------------------------------------------------- byte layout

def test_header_fields_at_documented_offsets() -> None:
    batch = build_batch([b"a", b"bb", b"ccc"], timestamps=[30, 10, 20], compression="zstd",
                        producer_id=0x0102030405060708, producer_epoch=7, base_sequence=99,
                        base_offset=12345)
    assert HEADER_SIZE == 61 and LOG_OVERHEAD == 12
    assert _field(batch, "q", 0) == 12345  # base_offset
    assert _field(batch, "i", 8) == len(batch) - 12  # batch_length
    assert _field(batch, "i", 12) == -1  # leader_epoch placeholder
    assert _field(batch, "b", 16) == MAGIC == 1  # magic
    assert _field(batch, "I", 17) == crc32c.crc32c(batch[21:])  # crc over [21, end)
    assert _field(batch, "h", 21) == int(Compression.ZSTD)  # attributes
    assert _field(batch, "i", 23) == 2  # last_offset_delta
    assert _field(batch, "q", 27) == 10  # first_timestamp = min
    assert _field(batch, "q", 35) == 30  # max_timestamp = max
    assert _field(batch, "q", 43) == 0x0102030405060708  # producer_id
    assert _field(batch, "h", 51) == 7  # producer_epoch
    assert _field(batch, "i", 53) == 99  # base_sequence
    assert _field(batch, "i", 57) == 3  # record_count
    # The payload is a self-describing Arrow IPC stream starting at byte 61.
    reader = pa.ipc.open_stream(pa.py_buffer(batch[61:]))
    assert reader.schema.equals(PAYLOAD_SCHEMA)
    assert reader.read_next_batch().num_rows == 3
    assert crc_of(batch) == _field(batch, "I", 17)


def test_set_base_offset_keeps_crc_valid() -> None:
    batch = bytearray(_sample())
    crc_before = _field(batch, "I", 17)
    tail_before = bytes(batch[16:])
    set_base_offset(batch, 987_654_321_000, leader_epoch=5)
    assert _field(batch, "q", 0) == 987_654_321_000
    assert _field(batch, "i", 12) == 5
    assert bytes(batch[16:]) == tail_before  # nothing covered by the CRC moved
    assert _field(batch, "I", 17) == crc_before
    header = validate(batch)
    assert header.base_offset == 987_654_321_000
    assert header.last_offset == 987_654_321_002
    assert header.next_offset == 987_654_321_003
    assert header.leader_epoch == 5


def test_set_log_append_time_recomputes_crc() -> None:
    batch = bytearray(_sample())
    crc_before = _field(batch, "I", 17)
    set_log_append_time(batch, 5_000_000)
    assert _field(batch, "q", 35) == 5_000_000
    assert _field(batch, "h", 21) & 0x08
    assert _field(batch, "I", 17) != crc_before
    assert _field(batch, "I", 17) == crc32c.crc32c(bytes(batch[21:]))
    header = validate(batch)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 5_000_000
    # LogAppendTime may set max below first_timestamp (clock behind producers): still valid.
    back = bytearray(_sample())
    set_log_append_time(back, 10)
    assert validate(back).max_timestamp == 10


# ----------------------------------------------------------------------- validation

def test_validate_accepts_good_batch_and_trailing_bytes_only_when_not_exact() -> None:
    batch = _sample()
    assert validate(batch).record_count == 3
    with pytest.raises(InvalidRecordBatchError):
        validate(batch + b"\x00")
    assert validate(batch + b"\x00", exact=False).size == len(batch)


def _bad_batches() -> dict[str, bytes]:
    good = _sample()
    flipped = bytearray(good)
    flipped[len(good) - 20] ^= 0x01  # a payload byte, CRC not fixed
    flipped_attr = bytearray(good)
    flipped_attr[23] ^= 0x01  # a covered header byte (last_offset_delta) -> also CRC
    return {
        "bad crc (payload byte flipped)": bytes(flipped),
        "bad crc (crc field changed)": _with_field(good, "I", 17, _field(good, "I", 17) ^ 1,
                                                   fix_crc=False),
        "wrong magic": _with_field(good, "b", 16, 2, fix_crc=False),
        "magic zero": _with_field(good, "b", 16, 0, fix_crc=False),
        "truncated header": good[:HEADER_SIZE - 1],
        "empty": b"",
        "length says longer": _with_field(good, "i", 8, len(good) - 12 + 1, fix_crc=False),
        "length says shorter": _with_field(good, "i", 8, len(good) - 12 - 1, fix_crc=False),
        "length below header": _with_field(good, "i", 8, 10, fix_crc=False),
        "negative length": _with_field(good, "i", 8, -5, fix_crc=False),
        "bytes cut short": good[:-1],
        "record_count 0": _with_field(_with_field(good, "i", 57, 0), "i", 23, -1),
        "record_count negative": _with_field(_with_field(good, "i", 57, -3), "i", 23, -4),
        "record_count over max": _with_field(
            _with_field(good, "i", 57, MAX_RECORDS_PER_BATCH + 1), "i", 23,
            MAX_RECORDS_PER_BATCH),
        "record_count vs last_offset_delta": _with_field(good, "i", 23, 5),
        "delete-horizon bit 7 on a data batch": _with_field(good, "h", 21, 0x80),
        "unknown attribute bit 9": _with_field(good, "h", 21, 0x200),
        "unknown attribute high bit": _with_field(good, "h", 21, -0x8000),
        "unknown compression 3": _with_field(good, "h", 21, 3),
        "max_timestamp before first (create time)": _with_field(good, "q", 35, 0),
    }


@pytest.mark.parametrize("case", sorted(_bad_batches()))
def test_validate_rejects(case: str) -> None:
    bad = _bad_batches()[case]
    with pytest.raises(InvalidRecordBatchError):
        validate(bad)
    with pytest.raises(InvalidRecordBatchError):
        decode_batch(bad)


def test_record_count_at_max_is_accepted_by_header_check() -> None:
    good = _sample()
    at_max = _with_field(_with_field(good, "i", 57, MAX_RECORDS_PER_BATCH), "i", 23,
                         MAX_RECORDS_PER_BATCH - 1)
    assert validate(at_max).record_count == MAX_RECORDS_PER_BATCH
    # ... but the payload does not hold that many rows, which decode_batch notices.
    with pytest.raises(InvalidRecordBatchError, match="rows"):
        decode_batch(at_max)


def test_peek_header_checks_fields_not_crc() -> None:
    good = _sample()
    damaged = bytearray(good)
    damaged[-5] ^= 0xFF
    assert peek_header(damaged).record_count == 3  # peek does not look at the CRC
    assert peek_header(b"\x00" * 7 + good, position=7).record_count == 3
    with pytest.raises(InvalidRecordBatchError, match="truncated"):
        peek_header(good, position=len(good) - HEADER_SIZE + 1)
    with pytest.raises(InvalidRecordBatchError):
        peek_header(_with_field(good, "b", 16, 9))


def test_huge_claimed_length_is_rejected_without_allocating() -> None:
    good = _sample()
    huge = _with_field(good, "i", 8, 2**31 - 1, fix_crc=False)
    with pytest.raises(InvalidRecordBatchError):
        validate(huge)
    with pytest.raises(InvalidRecordBatchError):
        validate(huge, exact=False)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(huge, allow_partial_tail=False))
    assert list(iter_batches(huge)) == []  # looks like a cut-off fetch tail


# ----------------------------------------------------------------------- iteration

def _assigned(batches: list[bytes], first: int = 0) -> list[bytes]:
    out = []
    offset = first
    for b in batches:
        data = bytearray(b)
        set_base_offset(data, offset, 0)
        offset += peek_header(data).record_count
        out.append(bytes(data))
    return out


def test_iter_batches_walks_concatenated_batches() -> None:
    batches = _assigned([_sample(3), _sample(1, compression="lz4"), _sample(5)])
    buf = b"".join(batches)
    seen = list(iter_batches(buf, allow_partial_tail=False))
    assert [h.base_offset for h, _ in seen] == [0, 3, 4]
    assert [bytes(v) for _, v in seen] == batches
    assert list(iter_batches(b"")) == []


@pytest.mark.parametrize("cut", [1, 11, 12, 60, 61, 62, -1])
def test_iter_batches_partial_tail(cut: int) -> None:
    batches = _assigned([_sample(3), _sample(2)])
    last = batches[-1]
    keep = cut if cut > 0 else len(last) + cut
    buf = batches[0] + last[:keep]
    assert [h.base_offset for h, _ in iter_batches(buf)] == [0]
    with pytest.raises(CorruptRecordError):
        list(iter_batches(buf, allow_partial_tail=False))


def test_iter_batches_reports_corrupt_batch_position() -> None:
    batches = _assigned([_sample(3), _sample(2), _sample(4)])
    buf = bytearray(b"".join(batches))
    position = len(batches[0])
    buf[position + len(batches[1]) - 3] ^= 0x10  # payload byte of the second batch
    walked = iter_batches(buf)
    assert next(walked)[0].base_offset == 0
    with pytest.raises(CorruptRecordError) as info:
        next(walked)
    assert info.value.position == position
    assert info.value.offset == 3


# ----------------------------------------------------------------------- batches_to_table

def test_batches_to_table_columns_and_slicing() -> None:
    b0 = build_batch([b"a", b"b", b"c"], keys=[b"k", None, b"k"], timestamps=[1, 2, 3])
    b1 = build_batch([b"d", b"e"], timestamps=[4, 5], headers=[[("x", b"y")], None],
                     compression="lz4")
    b2 = build_batch([b"f", b"g", b"h", b"i"], timestamps=[6, 7, 8, 9], compression="zstd")
    buf = b"".join(_assigned([b0, b1, b2], first=100))
    table = batches_to_table(buf, topic="orders", partition=7)
    assert table.schema.equals(CONSUMER_SCHEMA)
    assert table.column("offset").to_pylist() == list(range(100, 109))
    assert table.column("value").to_pylist() == [bytes([c]) for c in b"abcdefghi"]
    assert table.column("key").to_pylist()[:3] == [b"k", None, b"k"]
    assert table.column("timestamp").to_pylist() == list(range(1, 10))
    assert set(table.column("topic").to_pylist()) == {"orders"}
    assert set(table.column("partition").to_pylist()) == {7}
    assert set(table.column("timestampType").to_pylist()) == {0}
    assert table.column("headers").to_pylist()[3] == [{"key": "x", "value": b"y"}]

    mid = batches_to_table(buf, topic="orders", partition=7, start_offset=102, end_offset=106)
    assert mid.column("offset").to_pylist() == [102, 103, 104, 105]
    assert mid.column("value").to_pylist() == [b"c", b"d", b"e", b"f"]
    assert batches_to_table(buf, topic="t", partition=0, start_offset=109).num_rows == 0
    assert batches_to_table(buf, topic="t", partition=0, end_offset=100).num_rows == 0
    # A fetch cut by max_bytes: the partial tail is ignored.
    cut = batches_to_table(buf[:-10], topic="t", partition=0)
    assert cut.column("offset").to_pylist() == list(range(100, 105))


def test_control_batches_round_trip_and_are_never_records() -> None:
    marker = build_control_batch(7, 3, ControlType.COMMIT, 11, 5_000)
    header = validate(marker)
    assert (header.is_control, header.is_transactional, header.producer_id,
            header.producer_epoch, header.record_count, header.size) == \
        (True, True, 7, 3, 1, HEADER_SIZE + 10)
    assert parse_control(marker) == (ControlType.COMMIT, 11)
    assert parse_control(build_control_batch(7, 3, ControlType.ABORT, 0, 1)) == \
        (ControlType.ABORT, 0)
    with pytest.raises(InvalidRecordBatchError, match="not a transaction marker"):
        parse_control(_sample(1))
    bad = bytearray(marker)
    struct.pack_into(">h", bad, HEADER_SIZE + 2, 5)  # type 5
    struct.pack_into(">I", bad, 17, crc_of(bad))
    with pytest.raises(InvalidRecordBatchError, match="unknown control record"):
        parse_control(bad)
    # A reader never returns a marker as a record, at either isolation level.
    data = build_batch([b"a", b"b"], timestamps=[1, 2], producer_id=7, producer_epoch=3,
                       base_sequence=0, transactional=True)
    assert validate(data).is_transactional
    buf = b"".join(_assigned([data, marker, _sample(1)], first=10))
    table = batches_to_table(buf, topic="t", partition=0)
    assert table.column("offset").to_pylist() == [10, 11, 13]


def _txn(pid: int, values: list[bytes]) -> bytes:
    return build_batch(values, timestamps=[1] * len(values), producer_id=pid,
                       producer_epoch=0, base_sequence=0, transactional=True)


def test_read_committed_skips_aborted_transactions_batch_by_batch() -> None:
    """Producers 1 and 2 interleave; 1 aborts its first transaction and commits its
    second, 2 commits. Only the aborted batches and the markers leave no row."""
    batches = [
        _txn(1, [b"a1", b"a2"]),                                  # 100-101 aborted
        _txn(2, [b"c1"]),                                         # 102 committed
        _txn(1, [b"a3"]),                                         # 103 aborted
        build_control_batch(1, 0, ControlType.ABORT, 0, 1),       # 104
        _sample(1),                                               # 105 not transactional
        _txn(1, [b"d1"]),                                         # 106 committed
        build_control_batch(2, 0, ControlType.COMMIT, 0, 1),      # 107
        build_control_batch(1, 0, ControlType.COMMIT, 0, 1),      # 108
    ]
    buf = b"".join(_assigned(batches, first=100))
    aborted = [AbortedTransaction(1, 100)]
    table = batches_to_table(buf, topic="t", partition=0, aborted=aborted)
    assert table.column("offset").to_pylist() == [102, 105, 106]
    assert table.column("value").to_pylist() == [b"c1", b"value-0", b"d1"]
    # Starting inside the aborted transaction: still skipped (the filter walks from the
    # first batch of the fetch, below start_offset too).
    assert batches_to_table(buf, topic="t", partition=0, aborted=aborted,
                            start_offset=101).column("offset").to_pylist() == [102, 105, 106]
    # read_uncommitted (no aborted list): every data batch, no marker.
    assert batches_to_table(buf, topic="t", partition=0).column("offset").to_pylist() == \
        [100, 101, 102, 103, 105, 106]
    # One decision per batch: the filter never decodes a payload.
    walk = AbortedFilter(aborted)
    assert [walk.skip(h, v) for h, v in iter_batches(buf)] == \
        [True, False, True, True, False, False, True, True]


def test_batches_to_table_log_append_time() -> None:
    data = bytearray(build_batch([b"a", b"b"], timestamps=[1, 2]))
    set_log_append_time(data, 777)
    table = batches_to_table(bytes(data), topic="t", partition=0)
    assert table.column("timestamp").to_pylist() == [777, 777]
    assert table.column("timestampType").to_pylist() == [1, 1]


# ----------------------------------------------------------------------- fuzzing

_TEMPLATES = {
    codec: build_batch([b"hello" * 3, None, b"w"], keys=[b"k", None, b"z"],
                       headers=[[("a", b"1")], None, []], timestamps=[1, 2, 3],
                       compression=codec)
    for codec in ("none", "lz4", "zstd")
}


def _exercise_decoders(data: bytes) -> None:
    """Every decoder on ``data``: only typed errors, and any batch returned is sound."""
    try:
        header, payload = decode_batch(data)
    except TYPED:
        pass
    else:
        # A batch decode_batch hands out must be safe to read: schema, row count and
        # buffers (offsets inside their data, null counts, child arrays) all valid.
        assert payload.schema.equals(PAYLOAD_SCHEMA)
        assert payload.num_rows == header.record_count
        payload.validate(full=True)
    for call in (
        lambda: peek_header(data),
        lambda: validate(data),
        lambda: validate(data, exact=False),
        lambda: list(iter_batches(data)),
        lambda: list(iter_batches(data, allow_partial_tail=False)),
        lambda: batches_to_table(data, topic="t", partition=0),
    ):
        with contextlib.suppress(TYPED):
            call()


@pytest.mark.timeout(60)  # "never hang"
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_only_raise_typed_errors(data: bytes) -> None:
    _exercise_decoders(data)


@pytest.mark.timeout(60)  # "never hang"
@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=HEADER_SIZE, max_size=400))
def test_fuzz_random_bytes_behind_plausible_header(data: bytes) -> None:
    """Random bytes with a header that passes peek_header (so the CRC/payload code runs)."""
    buf = bytearray(data)
    struct.pack_into(">qiibIhiqqqhii", buf, 0, 0, len(buf) - 12, -1, 1, 0, 0, 0, 0, 0, -1, -1,
                     -1, 1)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    _exercise_decoders(bytes(buf))


@pytest.mark.timeout(60)  # "never hang"
@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(_TEMPLATES)),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6),
    st.booleans(),
)
def test_fuzz_mutated_batches_only_raise_typed_errors(
    codec: str, edits: list[tuple[int, int]], fix_crc: bool
) -> None:
    """Valid batches with random bytes overwritten, the CRC optionally made to match.

    With a matching CRC the damaged bytes reach the Arrow IPC reader, which must not
    leak Arrow's own exceptions, try allocations sized by the garbage, or hand out a
    record batch whose buffers are inconsistent ("decoders bound allocations").
    """
    buf = bytearray(_TEMPLATES[codec])
    for position, value in edits:
        buf[position % len(buf)] = value
    if fix_crc:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    _exercise_decoders(bytes(buf))


def _body_start(batch: bytes) -> int:
    """Byte position in ``batch`` of the Arrow record batch message body."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(batch[HEADER_SIZE:]))
    reader.read_next_message()  # the schema message
    message = reader.read_next_message()
    return len(batch) - 8 - message.body.size  # the 8-byte end-of-stream marker follows


def test_compressed_buffer_claiming_huge_size_is_a_typed_error() -> None:
    """LZ4 buffers whose uncompressed-length prefix claims 2**62 bytes.

    Arrow allocates what the prefix claims before decompressing; the decoder must turn
    the failure into ``InvalidRecordBatchError`` (today ``pyarrow.ArrowMemoryError``
    escapes).
    """
    batch = build_batch([b"hello" * 3, None, b"w"], timestamps=[1, 2, 3], compression="lz4")
    start = _body_start(batch)
    damaged = bytearray(batch)
    prefix = struct.pack("<q", 16)  # 16 bytes: the value data and the offsets buffers
    hits = [at for at in range(start, len(batch) - 8, 8) if batch[at:at + 8] == prefix]
    assert hits, "no uncompressed-length prefix of 16 found in the body"
    for at in hits:
        struct.pack_into("<q", damaged, at, 2**62)
    struct.pack_into(">I", damaged, 17, crc32c.crc32c(bytes(damaged[21:])))
    with pytest.raises(InvalidRecordBatchError):
        decode_batch(bytes(damaged))


# Single-byte payload edits (CRC recomputed) found by fuzzing with pyarrow 26.0.1; each
# reaches a different failure of decode_batch / batches_to_table.
_FUZZ_FINDINGS = [
    ("none", 373, 106),  # ArrowNotImplementedError: integers with more than 64 bits
    ("zstd", 376, 217),  # ArrowNotImplementedError: integers with less than 8 bits
    ("lz4", 1252, 96),  # ArrowMemoryError: malloc of ~6.9e18 bytes
    ("none", 936, 160),  # decode returns a batch whose struct child is invalid
    ("lz4", 919, 189),  # decode returns a batch whose null count exceeds its length
    ("zstd", 1255, 215),  # batches_to_table: ArrowInvalid list offset out of bounds
]


@pytest.mark.parametrize(("codec", "position", "value"), _FUZZ_FINDINGS)
def test_damaged_payload_with_valid_crc(codec: str, position: int, value: int) -> None:
    buf = bytearray(_TEMPLATES[codec])
    assert buf[position] != value
    buf[position] = value
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    _exercise_decoders(bytes(buf))


def test_batches_to_table_with_offset_gaps_selects_by_offset_value() -> None:
    """After compaction a fetch can hold batches whose offsets do not follow on."""
    first = bytearray(build_batch([b"a", b"b"], now_ms=1))
    second = bytearray(build_batch([b"c", b"d"], now_ms=2))
    set_base_offset(first, 0, 0)
    set_base_offset(second, 5, 0)
    table = batches_to_table(bytes(first + second), topic="t", partition=0, start_offset=1,
                             end_offset=6)
    assert table.column("offset").to_pylist() == [1, 5]
    assert table.column("value").to_pylist() == [b"b", b"c"]


def _stream_of(record_batch: pa.RecordBatch, codec: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, record_batch.schema, options=options) as writer:
        writer.write_batch(record_batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("rows", [1, 3, 1000])
def test_an_uncompressed_batch_is_the_stream_pyarrows_writer_makes(rows: int) -> None:
    """``encode_record_batch`` writes an uncompressed ``PAYLOAD_SCHEMA`` batch as a
    cached schema message, the batch message and the end-of-stream marker instead of
    running pyarrow's stream writer: the payload must be those bytes exactly, keys,
    nulls and headers included, and decode to the same records."""
    values = [None if i % 7 == 3 else bytes([i % 256]) * (i % 50) for i in range(rows)]
    keys = [None if i % 2 else b"k%d" % i for i in range(rows)]
    headers = [None if i % 3 else [("h", b"v%d" % i)] for i in range(rows)]
    timestamps = [1_700_000_000_000 + (i * 37) % 1000 for i in range(rows)]
    for given_bounds in (None, (min(timestamps), max(timestamps))):
        batch = build_batch(values, keys=keys, headers=headers, timestamps=timestamps,
                            timestamp_bounds=given_bounds)
        header = validate(batch)
        assert (header.first_timestamp, header.max_timestamp) == \
            (min(timestamps), max(timestamps))
        _, record_batch = decode_batch(batch)
        assert batch[HEADER_SIZE:] == _stream_of(record_batch)
        assert record_batch.column(1).to_pylist() == values
        assert record_batch.column(0).to_pylist() == keys
    # Compressed batches still go through the writer (and decode the same).
    zstd = build_batch(values, keys=keys, timestamps=timestamps, compression="zstd")
    assert decode_batch(zstd)[1].column(1).to_pylist() == values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decode_batch_rejects_mangled_bodies_behind_the_standard_schema(
        data: st.DataObject) -> None:
    """The common payload's batch message is read straight against PAYLOAD_SCHEMA once
    its stream opens with that schema's message: bytes mangled after it decode to a
    valid batch or raise InvalidRecordBatchError, never anything else (and never read
    out of bounds: the result is validated in full)."""
    from wire.record_batch import _PAYLOAD_SCHEMA_MESSAGE

    values = [None if i % 5 == 0 else bytes([i % 251]) * (i % 40) for i in range(120)]
    batch = bytearray(build_batch(values, keys=[b"k%d" % i for i in range(120)]))
    start = HEADER_SIZE + len(_PAYLOAD_SCHEMA_MESSAGE)
    for _ in range(data.draw(st.integers(1, 6))):
        batch[data.draw(st.integers(start, len(batch) - 1))] = data.draw(st.integers(0, 255))
    try:
        _, decoded = decode_batch(bytes(batch), verify=False)
    except InvalidRecordBatchError:
        return
    decoded.validate(full=True)
    assert decoded.num_rows == 120
    decoded.column("value").to_pylist()


def test_list_columns_are_refused_as_pa_array_refuses_them() -> None:
    """build_batch builds list columns without pa.array (which imports pandas); what
    pa.array refuses is still refused: bools or None as timestamps, str as values."""
    for bad in ([True, 2], [1, None]):
        with pytest.raises(InvalidRecordBatchError):
            build_batch([b"a", b"b"], timestamps=bad)
    ok = decode_batch(build_batch([b"a", None], keys=[None, b"k"], timestamps=[5, -1]))[1]
    assert ok.to_pylist() == [
        {"key": None, "value": b"a", "timestamp": 5, "headers": None},
        {"key": b"k", "value": None, "timestamp": -1, "headers": None}]
