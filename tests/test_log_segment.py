"""Unit tests of ``LogSegment``: one ``.log`` file plus its two sparse indexes.

Batches are built with offsets already assigned (as ``PartitionLog`` does before it
calls ``LogSegment.append``). Everything runs on real files in ``tmp_path``.
"""

from __future__ import annotations

import errno
import gc
import os
import random
from pathlib import Path

import pytest

from brokers.log.segment import LogSegment, segment_file_name
from wire.errors import CorruptRecordError, LogClosedError
from wire.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    build_batch,
    decode_batch,
    iter_batches,
    peek_header,
    set_log_append_time,
    validate,
)

pytestmark = pytest.mark.unit

INTERVAL = 2500  # index.interval.bytes: an entry every two or three batches below


def _batch(base: int, n: int = 3, *, timestamps: list[int] | None = None,
           pad: int = 30) -> tuple[bytes, BatchHeader]:
    values = [f"{base + i}:".encode() + b"." * pad for i in range(n)]
    ts = timestamps if timestamps is not None else [1_000 + base + i for i in range(n)]
    data = build_batch(values, timestamps=ts, base_offset=base)
    return data, validate(data)


def _fill(segment: LogSegment, counts: list[int], **kwargs: object) -> list[tuple[int, bytes]]:
    """Append batches of ``counts`` records; return ``(position, bytes)`` of each."""
    written = []
    for n in counts:
        data, header = _batch(segment.next_offset, n, **kwargs)  # type: ignore[arg-type]
        written.append((segment.append(data, header), data))
    return written


def _new(tmp_path: Path, base: int = 0, interval: int = INTERVAL) -> LogSegment:
    return LogSegment(tmp_path, base, interval, create=True)


def _reopen(tmp_path: Path, base: int = 0, interval: int = INTERVAL) -> LogSegment:
    return LogSegment(tmp_path, base, interval, create=False)


def _entries(segment: LogSegment) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    return (list(zip(segment.offset_index.keys, segment.offset_index.values, strict=True)),
            list(zip(segment.time_index.keys, segment.time_index.values, strict=True)))


def _assert_index_points_at_batches(segment: LogSegment) -> None:
    for relative, position in zip(segment.offset_index.keys, segment.offset_index.values,
                                  strict=True):
        header = peek_header(os.pread(segment.file.fd, HEADER_SIZE, position))
        assert header.base_offset == segment.base_offset + relative


# ----------------------------------------------------------------------- append / read

def test_files_named_by_base_offset(tmp_path: Path) -> None:
    segment = _new(tmp_path, base=1234)
    assert segment.log_path.name == "00000000000000001234.log"
    assert segment_file_name(1234, ".index") == "00000000000000001234.index"
    # The index files are created lazily, by the first persist (a flush, roll or close).
    assert not (tmp_path / "00000000000000001234.index").exists()
    assert not (tmp_path / "00000000000000001234.timeindex").exists()
    assert segment.is_empty and segment.next_offset == 1234
    segment.flush()
    assert (tmp_path / "00000000000000001234.index").exists()
    assert (tmp_path / "00000000000000001234.timeindex").exists()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_creating_an_existing_segment_fails_cleanly(tmp_path: Path) -> None:
    """Never clobber an existing segment, and fail without a stray error at GC time.

    ``SegmentFile.__del__`` runs for the half-built object when ``os.open`` raises; it
    must not raise ``AttributeError`` (no ``fd`` yet).
    """
    _new(tmp_path, base=7)
    with pytest.raises(FileExistsError):
        _new(tmp_path, base=7)
    gc.collect()


def test_append_and_read_whole_batches(tmp_path: Path) -> None:
    segment = _new(tmp_path, base=100)
    written = _fill(segment, [3, 1, 5, 2])
    assert segment.next_offset == 111
    assert segment.size == sum(len(b) for _, b in written)
    assert segment.log_path.read_bytes() == b"".join(b for _, b in written)
    whole = segment.read(100, 10**9)
    assert whole is not None
    assert (whole.position, whole.length) == (0, segment.size)
    assert (whole.first_offset, whole.next_offset) == (100, 111)
    assert whole.read_bytes() == b"".join(b for _, b in written)
    assert os.pread(whole.fileno(), whole.length, whole.position) == whole.read_bytes()
    assert segment.read(111, 10**9) is None  # nothing at or after the end


def test_read_from_inside_a_batch_returns_the_containing_batch(tmp_path: Path) -> None:
    segment = _new(tmp_path)
    written = _fill(segment, [3, 4, 5, 2])  # batches at 0, 3, 7, 12
    for offset, expected in [(0, 0), (2, 0), (3, 1), (6, 1), (8, 2), (11, 2), (13, 3)]:
        found = segment.read(offset, 1)
        assert found is not None
        position, data = written[expected]
        assert found.position == position
        assert found.read_bytes() == data
        assert found.first_offset <= offset < found.next_offset


def test_max_bytes_honoured_but_at_least_one_batch(tmp_path: Path) -> None:
    segment = _new(tmp_path)
    written = _fill(segment, [2, 2, 2, 2])
    sizes = [len(b) for _, b in written]
    assert segment.read(0, 1).length == sizes[0]  # type: ignore[union-attr]
    assert segment.read(0, sizes[0] + sizes[1] - 1).length == sizes[0]  # type: ignore[union-attr]
    two = segment.read(0, sizes[0] + sizes[1])
    assert two is not None and two.length == sizes[0] + sizes[1] and two.next_offset == 4
    tail = segment.read(5, sizes[2] + sizes[3])
    assert tail is not None
    assert (tail.first_offset, tail.next_offset, tail.length) == (4, 8, sizes[2] + sizes[3])


def test_upper_offset_bounds_what_is_visible(tmp_path: Path) -> None:
    segment = _new(tmp_path)
    written = _fill(segment, [3, 3, 3])  # 0-2, 3-5, 6-8
    below = segment.read(0, 10**9, upper_offset=6)
    assert below is not None and below.next_offset == 6
    assert below.length == len(written[0][1]) + len(written[1][1])
    # A batch that starts below the bound is whole: it is not cut at the bound.
    inside = segment.read(0, 10**9, upper_offset=4)
    assert inside is not None and inside.next_offset == 6
    assert segment.read(3, 10**9, upper_offset=3) is None
    assert segment.read(6, 10**9, upper_offset=6) is None


def test_index_lookup_lands_within_one_interval(tmp_path: Path) -> None:
    segment = _new(tmp_path, base=50, interval=INTERVAL)
    written = _fill(segment, [1, 3, 2, 7, 1, 1, 4, 2, 3, 9, 1, 2, 5])
    assert len(segment.offset_index) >= 3
    _assert_index_points_at_batches(segment)
    for position, data in written:
        header = peek_header(data)
        _, start = segment.offset_index.lookup(header.base_offset - segment.base_offset)
        assert start <= position
        assert position - start < INTERVAL


# ----------------------------------------------------------------------- timestamps

@pytest.mark.parametrize("interval", [1, INTERVAL, 10**9])
def test_offset_for_timestamp_exact_offset_inside_batches(tmp_path: Path, interval: int) -> None:
    segment = _new(tmp_path, interval=interval)
    for ts in ([10, 20, 30], [25, 5, 40], [35, 50], [45, 45, 45]):
        data, header = _batch(segment.next_offset, len(ts), timestamps=ts)
        segment.append(data, header)
    # offsets:    0   1   2   3   4  5   6   7   8   9   10
    # timestamps: 10  20  30  25  5  40  35  50  45  45  45
    expected = {0: 0, 10: 0, 11: 1, 20: 1, 21: 2, 26: 2, 30: 2, 31: 5, 36: 5, 40: 5,
                41: 7, 46: 7, 50: 7}
    for timestamp, offset in expected.items():
        assert segment.offset_for_timestamp(timestamp) == offset, timestamp
    assert segment.offset_for_timestamp(51) is None
    assert segment.max_timestamp == 50
    segment.seal()
    segment.close()
    reopened = _reopen(tmp_path, interval=interval)
    reopened.load()
    for timestamp, offset in expected.items():
        assert reopened.offset_for_timestamp(timestamp) == offset, timestamp
    assert reopened.offset_for_timestamp(51) is None


def test_offset_for_timestamp_log_append_time_batch(tmp_path: Path) -> None:
    segment = _new(tmp_path)
    data, _ = _batch(0, 4, timestamps=[1, 2, 3, 4])
    stamped = bytearray(data)
    set_log_append_time(stamped, 500)
    segment.append(stamped, validate(stamped))
    assert segment.offset_for_timestamp(100) == 0  # every record carries time 500
    assert segment.offset_for_timestamp(500) == 0
    assert segment.offset_for_timestamp(501) is None


# ----------------------------------------------------------------------- truncation

def test_truncate_to_whole_batches(tmp_path: Path) -> None:
    segment = _new(tmp_path, interval=1)  # an index entry per batch (after the first)
    written = _fill(segment, [3, 3, 3, 3, 3])  # 0, 3, 6, 9, 12
    segment.truncate_to(7)  # inside the batch at 6: it goes too
    assert segment.next_offset == 6
    assert segment.size == written[2][0]
    assert os.fstat(segment.file.fd).st_size == segment.size
    assert segment.log_path.read_bytes() == b"".join(b for _, b in written[:2])
    assert all(position < segment.size for position in segment.offset_index.values)
    assert all(relative < 6 for relative in segment.time_index.values)
    _assert_index_points_at_batches(segment)
    assert segment.read(6, 10**9) is None
    segment.truncate_to(100)  # past the end: nothing to do
    assert segment.next_offset == 6
    more = _fill(segment, [2])
    assert peek_header(more[0][1]).base_offset == 6
    found = segment.read(7, 10**9)
    assert found is not None and found.read_bytes() == more[0][1]
    segment.truncate_to(0)
    assert segment.size == 0 and segment.next_offset == 0


# ----------------------------------------------------------------------- recovery

@pytest.mark.parametrize("damage", ["torn-header", "torn-payload", "garbage", "zeros"])
def test_recover_truncates_a_torn_or_garbage_tail(tmp_path: Path, damage: str) -> None:
    segment = _new(tmp_path, interval=1)
    written = _fill(segment, [2, 5, 1, 3])
    good_size = segment.size
    offsets_before, times_before = _entries(segment)
    tail_batch, _ = _batch(11, 4)
    tail = {
        "torn-header": tail_batch[:40],
        "torn-payload": tail_batch[:-7],
        "garbage": random.Random(333).randbytes(333),  # fixed: a failure replays
        "zeros": b"\x00" * 4096,  # a pre-allocated or zero-filled tail
    }[damage]
    with open(segment.log_path, "ab") as f:
        f.write(tail)
    recovered = _reopen(tmp_path, interval=1)
    assert recovered.recover() == len(tail)
    assert recovered.size == good_size == os.path.getsize(recovered.log_path)
    assert recovered.next_offset == 11
    assert _entries(recovered) == (offsets_before, times_before)
    assert recovered.recover() == 0  # idempotent
    found = recovered.read(0, 10**9)
    assert found is not None and found.read_bytes() == b"".join(b for _, b in written)


def test_recover_truncates_at_a_corrupt_batch_and_at_an_offset_gap(tmp_path: Path) -> None:
    segment = _new(tmp_path)
    written = _fill(segment, [2, 2, 2, 2])
    # An otherwise valid batch that does not continue the offsets.
    gap, _ = _batch(100, 2)
    with open(segment.log_path, "ab") as f:
        f.write(gap)
    recovered = _reopen(tmp_path)
    assert recovered.recover() == len(gap)
    assert recovered.next_offset == 8
    # A flipped payload byte in the third batch: it and everything after it go.
    position, data = written[2]
    with open(recovered.log_path, "r+b") as f:
        f.seek(position + len(data) - 30)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))
    again = _reopen(tmp_path)
    assert again.recover() == len(written[2][1]) + len(written[3][1])
    assert again.next_offset == 4
    assert again.size == position


# ----------------------------------------------------------------------- load after seal

def _sealed_segment(tmp_path: Path, counts: list[int] | None = None,
                    **kwargs: object) -> tuple[list[tuple[int, bytes]], tuple[list, list], int]:
    segment = _new(tmp_path, interval=INTERVAL)
    written = _fill(segment, counts or [2, 3, 1, 4, 2, 2, 3, 1, 2], **kwargs)
    next_offset = segment.next_offset
    segment.seal()
    entries = _entries(segment)
    segment.close()
    return written, entries, next_offset


def _check_loaded(segment: LogSegment, written: list[tuple[int, bytes]],
                  entries: tuple[list, list], next_offset: int) -> None:
    assert segment.next_offset == next_offset
    assert _entries(segment)[0] == entries[0]
    # A rebuilt time index lacks the final entry until the segment is sealed again.
    segment.seal()
    assert _entries(segment)[1] == entries[1]
    assert segment.max_timestamp == max(peek_header(b).max_timestamp for _, b in written)
    _assert_index_points_at_batches(segment)
    for position, data in written:
        header = peek_header(data)
        found = segment.read(header.last_offset, 1)
        assert found is not None
        assert (found.position, found.read_bytes()) == (position, data)


def test_load_after_seal_with_indexes_present(tmp_path: Path) -> None:
    written, entries, next_offset = _sealed_segment(tmp_path)
    assert len(entries[0]) >= 2 and len(entries[1]) >= 2
    segment = _reopen(tmp_path)
    segment.load()
    assert _entries(segment) == entries  # loaded as written, final time entry included
    assert segment.verified_position == 0  # bytes are CRC-checked on first read
    _check_loaded(segment, written, entries, next_offset)


@pytest.mark.parametrize("which", [".index", ".timeindex", "both"])
def test_load_rebuilds_deleted_indexes(tmp_path: Path, which: str) -> None:
    """A missing index file is rebuilt on load, not silently replaced by an empty one."""
    written, entries, next_offset = _sealed_segment(tmp_path)
    for suffix in ([".index", ".timeindex"] if which == "both" else [which]):
        (tmp_path / segment_file_name(0, suffix)).unlink()
    segment = _reopen(tmp_path)
    segment.load()
    _check_loaded(segment, written, entries, next_offset)


def test_load_without_time_index_keeps_the_true_max_timestamp(tmp_path: Path) -> None:
    """The largest timestamp sits in an early batch (producer clocks disagree)."""
    segment = _new(tmp_path, interval=INTERVAL)
    for ts in ([100, 9_000], [200], [300], [400, 401], [500], [600], [700]):
        data, header = _batch(segment.next_offset, len(ts), timestamps=ts)
        segment.append(data, header)
    assert segment.max_timestamp == 9_000
    segment.seal()
    segment.close()
    (tmp_path / segment_file_name(0, ".timeindex")).unlink()
    reopened = _reopen(tmp_path)
    reopened.load()
    assert reopened.max_timestamp == 9_000
    assert reopened.offset_for_timestamp(5_000) == 1


@pytest.mark.parametrize("damage", ["partial-entry", "out-of-order", "past-the-log"])
def test_load_rebuilds_corrupt_indexes(tmp_path: Path, damage: str) -> None:
    written, entries, next_offset = _sealed_segment(tmp_path)
    index_path = tmp_path / segment_file_name(0, ".index")
    raw = bytearray(index_path.read_bytes())
    assert len(raw) >= 16
    if damage == "partial-entry":
        raw += b"\x00\x00\x00"
    elif damage == "out-of-order":
        raw[0:8], raw[8:16] = raw[8:16], raw[0:8]
    else:
        log_size = os.path.getsize(tmp_path / segment_file_name(0, ".log"))
        raw[-4:] = (log_size + 10).to_bytes(4, "big")
    index_path.write_bytes(bytes(raw))
    segment = _reopen(tmp_path)
    segment.load()
    _check_loaded(segment, written, entries, next_offset)
    segment.offset_index.persist(fsync=False)
    assert index_path.stat().st_size == 8 * len(entries[0])  # the file was rewritten


def test_load_rebuilds_an_index_entry_off_a_batch_boundary(tmp_path: Path) -> None:
    """The index is what is wrong, not the log: load rebuilds it and loses nothing
    (load never falls back to a recovery that could truncate durable data)."""
    written, entries, next_offset = _sealed_segment(tmp_path)
    index_path = tmp_path / segment_file_name(0, ".index")
    raw = bytearray(index_path.read_bytes())
    last_position = int.from_bytes(raw[-4:], "big")
    raw[-4:] = (last_position + 5).to_bytes(4, "big")  # still in order, still below size
    index_path.write_bytes(bytes(raw))
    log_bytes = (tmp_path / segment_file_name(0, ".log")).read_bytes()
    segment = _reopen(tmp_path)
    segment.load()
    _check_loaded(segment, written, entries, next_offset)
    assert segment.log_path.read_bytes() == log_bytes


def test_load_reports_damaged_log_headers_and_changes_nothing(tmp_path: Path) -> None:
    written, _, _ = _sealed_segment(tmp_path)
    position, data = written[-2]
    with open(tmp_path / segment_file_name(0, ".log"), "r+b") as f:
        f.truncate(position + len(data) // 2)  # the tail of a closed segment went missing
    log_bytes = (tmp_path / segment_file_name(0, ".log")).read_bytes()
    segment = _reopen(tmp_path)
    with pytest.raises(CorruptRecordError) as info:
        segment.load()
    assert (info.value.segment, info.value.position) == (str(segment.log_path), position)
    assert segment.log_path.read_bytes() == log_bytes


def test_first_read_after_load_verifies_and_later_reads_skip(tmp_path: Path) -> None:
    written, _, _ = _sealed_segment(tmp_path)
    segment = _reopen(tmp_path)
    segment.load()
    assert segment.verified_position == 0
    found = segment.read(0, 10**9)
    assert found is not None
    assert segment.verified_position == segment.size
    assert [bytes(v) for _, v in iter_batches(found.read_bytes(), allow_partial_tail=False)] == \
        [b for _, b in written]
    decode_batch(written[-1][1])


# ----------------------------------------------------------------------- range verification

def _big_closed_segment(tmp_path: Path, batches: int = 60) -> list[tuple[int, bytes]]:
    segment = _new(tmp_path, interval=INTERVAL)
    written = _fill(segment, [3] * batches, pad=200)
    segment.seal()
    segment.close()
    return written


def test_read_verifies_only_the_range_it_returns(tmp_path: Path) -> None:
    """After a restart, a fetch near the end of a closed segment checks what it returns,
    not everything from byte 0 (it used to CRC-read the whole segment first)."""
    written = _big_closed_segment(tmp_path)
    segment = _reopen(tmp_path)
    segment.load()
    assert segment.verified_ranges == ()
    position, data = written[-3]
    found = segment.read(peek_header(data).base_offset, 2 * len(data))
    assert found is not None and found.position == position
    assert segment.verified_ranges == ((position, position + found.length),)
    # Ranges merge, so each byte is checked once per process and the list stays short.
    before_position, before = written[-4]
    found = segment.read(peek_header(before).base_offset, 1)
    assert found is not None
    assert segment.verified_ranges == ((before_position, position + 2 * len(data)),)
    segment.read(0, 1)
    assert len(segment.verified_ranges) == 2
    segment.verify_all()
    assert segment.verified_ranges == ((0, segment.size),)


def test_damage_outside_the_returned_range_does_not_fail_the_read(tmp_path: Path) -> None:
    """A flipped payload byte early in a segment fails reads of that batch only; a read
    near the end used to fail too, because it verified from byte 0."""
    written = _big_closed_segment(tmp_path)
    damaged_position, damaged = written[1]
    with open(tmp_path / segment_file_name(0, ".log"), "r+b") as f:
        f.seek(damaged_position + len(damaged) - 40)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    segment = _reopen(tmp_path)
    segment.load()
    _, data = written[-1]
    found = segment.read(peek_header(data).base_offset, 1)
    assert found is not None and found.read_bytes() == data
    with pytest.raises(CorruptRecordError) as info:
        segment.read(peek_header(damaged).base_offset, 1)
    assert (info.value.segment, info.value.position) == (str(segment.log_path), damaged_position)
    with pytest.raises(CorruptRecordError):  # a multi-batch read that covers it, too
        segment.read(0, 10**9)
    with pytest.raises(CorruptRecordError):
        segment.verify_all()


# ----------------------------------------------------------------------- descriptor lifetime

def _fd_is_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as err:
        assert err.errno == errno.EBADF
        return True
    return False


def test_a_file_slice_keeps_its_descriptor_after_the_segment_is_closed(tmp_path: Path) -> None:
    """Closing a segment must not close a descriptor an in-flight ``sendfile`` uses: the
    number could be reused by another file and the send would read the wrong bytes."""
    segment = _new(tmp_path)
    written = _fill(segment, [2, 3])
    found = segment.read(0, 10**9)
    assert found is not None
    fd = found.fileno()
    segment.close()
    with pytest.raises(LogClosedError):
        segment.read(0, 1)
    other = os.open(tmp_path / "unrelated", os.O_RDWR | os.O_CREAT, 0o644)  # would take fd
    try:
        assert other != fd
        assert found.fileno() == fd and os.fstat(fd).st_size == segment.size
        assert found.read_bytes() == b"".join(data for _, data in written)
    finally:
        os.close(other)
    del segment
    gc.collect()
    assert not _fd_is_closed(fd)  # the slice still holds it
    del found
    gc.collect()
    assert _fd_is_closed(fd)


def test_a_deleted_segment_closes_its_descriptor_with_the_last_slice(tmp_path: Path) -> None:
    segment = _new(tmp_path)
    written = _fill(segment, [2])
    found = segment.read(0, 10**9)
    assert found is not None
    fd = found.fileno()
    segment.delete()
    assert not segment.log_path.exists()
    assert found.read_bytes() == written[0][1]  # the inode lives while the slice does
    with pytest.raises(LogClosedError):
        segment.read(0, 1)
    del found  # the deleted segment let go of the file: the slice was the last holder
    gc.collect()
    assert _fd_is_closed(fd)
