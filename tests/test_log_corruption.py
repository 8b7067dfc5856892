"""Damage at rest: flipped bytes, truncated files and bad indexes are reported or
repaired, never silently served.

Every test damages real files of a real ``PartitionLog`` in ``tmp_path`` and reopens
the directory, cleanly (after ``close``) or uncleanly (the old object is dropped).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from brokers.errors import CorruptRecordError
from brokers.log import LogConfig, PartitionLog
from brokers.log.segment import LogSegment
from brokers.record_batch import HEADER_SIZE, build_batch, iter_batches, peek_header

CONFIG = LogConfig(segment_bytes=8192, index_interval_bytes=2000)
BIG = 10**9


def _fill(directory: Path, batches: int = 24) -> PartitionLog:
    log = PartitionLog(directory, CONFIG)
    for i in range(batches):
        log.append(build_batch([f"v{i}-{j}".encode() * 5 for j in range(1 + i % 3)],
                               timestamps=[1_000 + i] * (1 + i % 3)))
    assert len(log.segments) >= 2
    return log


def _batches(segment: LogSegment) -> list[tuple[int, int, int, int]]:
    """``(position, size, base_offset, next_offset)`` of every batch of a segment."""
    data = segment.log_path.read_bytes()
    out = []
    position = 0
    while position < len(data):
        header = peek_header(data, position)
        out.append((position, header.size, header.base_offset, header.next_offset))
        position += header.size
    return out


def _flip(path: Path, position: int, mask: int = 0x20) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def _content(log: PartitionLog, start: int, stop: int) -> list[bytes]:
    """Whole batches from ``start`` while their base offset is below ``stop``."""
    out: list[bytes] = []
    offset = start
    while offset < stop:
        found = log.read(offset, BIG, upper_offset=stop)
        if found is None:
            break
        out.extend(bytes(v) for _, v in iter_batches(found.read_bytes(), allow_partial_tail=False))
        offset = found.next_offset
    return out


# ----------------------------------------------------------------------- closed segments

@pytest.mark.parametrize("where", ["payload", "covered-header-field", "crc-field"])
def test_flipped_byte_in_closed_segment_is_reported_on_read(tmp_path: Path, where: str) -> None:
    log = _fill(tmp_path)
    first = log.segments[0]
    position, size, base, nxt = _batches(first)[1]  # the second batch of the first segment
    before = _content(log, 0, base)
    log.close()
    # covered-header-field: a producer_id byte, inside the CRC but still a plausible header.
    at = {"payload": position + size - 25, "covered-header-field": position + 45,
          "crc-field": position + 18}[where]
    _flip(first.log_path, at)

    log = PartitionLog(tmp_path, CONFIG)
    assert log.opened_cleanly  # a clean open reads headers only: the flip is found on read
    for offset in (base, nxt - 1):
        with pytest.raises(CorruptRecordError) as info:
            log.read(offset, BIG)
        assert info.value.segment == str(first.log_path)
        assert info.value.position == position
        assert first.log_path.name in str(info.value)
    with pytest.raises(CorruptRecordError):  # asked again: still reported, never served
        log.read(0, BIG)
    # The batches before it are served when the read stops short of the damage...
    assert _content(log, 0, base) == before
    # ... and the other segments are unaffected.
    second = log.segments[1]
    found = log.read(second.base_offset, BIG)
    assert found is not None and found.first_offset == second.base_offset
    # A scrub finds it too.
    with pytest.raises(CorruptRecordError) as scrub:
        log.verify()
    assert (scrub.value.segment, scrub.value.position) == (str(first.log_path), position)


def test_verify_passes_on_a_healthy_log_and_reports_later_segments(tmp_path: Path) -> None:
    log = _fill(tmp_path)
    log.verify()
    third = log.segments[2]
    position, size, _, _ = _batches(third)[-1]
    log.close()
    _flip(third.log_path, position + size - 3)
    log = PartitionLog(tmp_path, CONFIG)
    with pytest.raises(CorruptRecordError) as info:
        log.verify()
    assert (info.value.segment, info.value.position) == (str(third.log_path), position)


def test_flipped_base_offset_in_closed_segment_is_not_served(tmp_path: Path) -> None:
    """``base_offset`` sits outside the CRC: the offset walk must catch the damage.

    Reading an offset of the damaged batch must report it, not answer with some other
    batch (e.g. the first batch of the next segment, silently skipping records).
    """
    log = _fill(tmp_path)
    first = log.segments[0]
    batches = _batches(first)
    position, _, base, nxt = batches[2]
    log.close()
    _flip(first.log_path, position + 7, 0x40)  # base offset += 64
    log = PartitionLog(tmp_path, CONFIG)
    for offset in range(base, nxt):
        try:
            found = log.read(offset, 1)
        except CorruptRecordError as err:
            assert err.segment == str(first.log_path)
            continue
        assert found is not None
        assert found.first_offset <= offset < found.next_offset, (
            f"asked for offset {offset}, got the batch "
            f"{found.first_offset}..{found.next_offset - 1}")
        assert peek_header(found.read_bytes()).base_offset == base
    with pytest.raises(CorruptRecordError):
        log.verify()


def test_truncated_closed_segment_after_clean_shutdown(tmp_path: Path) -> None:
    """A closed segment lost its tail while the log was down (a bad restore, a bad disk)."""
    log = _fill(tmp_path)
    first, second = log.segments[0], log.segments[1]
    batches = _batches(first)
    position, _, base, _ = batches[-2]
    kept = _content(log, 0, base)
    log.close()
    os.truncate(first.log_path, position + 30)  # inside the second to last batch
    log = PartitionLog(tmp_path, CONFIG)
    assert log.log_end_offset == base
    assert [s.base_offset for s in log.segments] == [0]
    assert not second.log_path.exists()  # cannot be attached to the gap
    assert _content(log, 0, base) == kept
    log.verify()
    assert log.append(build_batch([b"after"], now_ms=1)).first_offset == base


# ----------------------------------------------------------------------- unclean shutdown

def test_unclean_shutdown_truncates_at_a_corrupt_batch_after_the_recovery_point(
    tmp_path: Path,
) -> None:
    log = _fill(tmp_path, batches=10)
    log.flush()  # the recovery point: everything so far
    recovery_point = log.log_end_offset
    log.roll()
    for i in range(20):
        log.append(build_batch([f"late{i}".encode() * 10] * 3, now_ms=2_000 + i))
    later = [s for s in log.segments if s.base_offset >= recovery_point]
    assert len(later) >= 3
    damaged_segment = later[1]
    position, _, base, _ = _batches(damaged_segment)[2]
    kept = _content(log, 0, base)
    doomed = [s.log_path for s in later[2:]]
    del log  # crash: no close, no clean-shutdown marker
    gc.collect()
    _flip(damaged_segment.log_path, position + HEADER_SIZE + 100)

    log = PartitionLog(tmp_path, CONFIG)
    assert not log.opened_cleanly
    assert log.log_end_offset == base  # truncated at the damaged batch
    assert log.recovered_bytes_truncated > 0
    assert os.path.getsize(damaged_segment.log_path) == position
    for path in doomed:
        assert not path.exists()
    assert log.segments[-1].base_offset == damaged_segment.base_offset
    assert _content(log, 0, log.log_end_offset) == kept
    log.verify()
    assert log.append(build_batch([b"next"], now_ms=1)).first_offset == base


def test_unclean_shutdown_corruption_below_recovery_point_is_reported_on_read(
    tmp_path: Path,
) -> None:
    log = _fill(tmp_path)
    log.flush()
    first = log.segments[0]
    position, size, base, _ = _batches(first)[0]
    del log
    gc.collect()
    _flip(first.log_path, position + size - 40)
    log = PartitionLog(tmp_path, CONFIG)
    assert not log.opened_cleanly
    with pytest.raises(CorruptRecordError) as info:
        log.read(base, 1)
    assert (info.value.segment, info.value.position) == (str(first.log_path), position)


# ----------------------------------------------------------------------- indexes

def test_index_entry_off_a_batch_boundary_is_repaired_on_clean_open(tmp_path: Path) -> None:
    log = _fill(tmp_path)
    first = log.segments[0]
    everything = _content(log, 0, log.log_end_offset)
    log.close()
    index = first.offset_index.path
    raw = bytearray(index.read_bytes())
    assert raw, "the first segment should have index entries"
    raw[-1] ^= 0x01  # the last entry's position moves one byte: mid-batch
    index.write_bytes(bytes(raw))
    log = PartitionLog(tmp_path, CONFIG)
    assert _content(log, 0, log.log_end_offset) == everything
    log.verify()
    for segment in log.segments:
        for relative, pos in zip(segment.offset_index.keys, segment.offset_index.values,
                                 strict=True):
            header = peek_header(os.pread(segment.file.fd, HEADER_SIZE, pos))
            assert header.base_offset == segment.base_offset + relative


def test_consistent_looking_wrong_index_entry_never_serves_the_wrong_batch(
    tmp_path: Path,
) -> None:
    """A middle index entry points at a later batch (still sorted, still in the file).

    A read through it must return the batch holding the offset, or report the damage;
    it must not return a batch that starts after the offset asked for.
    """
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=60_000, index_interval_bytes=3000))
    for i in range(30):
        log.append(build_batch([f"x{i}".encode()] * 2, now_ms=1))
    segment = log.segments[0]
    entries = list(zip(segment.offset_index.keys, segment.offset_index.values, strict=True))
    assert len(entries) >= 4
    batches = _batches(segment)
    positions = [b[0] for b in batches]
    log.close()
    k = 1  # a middle entry: the last one would be cross-checked on load
    relative, position = entries[k]
    following = positions[positions.index(position) + 1]
    assert following < entries[k + 1][1]
    raw = bytearray(segment.offset_index.path.read_bytes())
    raw[8 * k + 4: 8 * k + 8] = following.to_bytes(4, "big")
    segment.offset_index.path.write_bytes(bytes(raw))

    log = PartitionLog(tmp_path, LogConfig(segment_bytes=60_000, index_interval_bytes=3000))
    offset = segment.base_offset + relative
    try:
        found = log.read(offset, 1)
    except CorruptRecordError:
        return
    assert found is not None
    assert found.first_offset <= offset < found.next_offset, (
        f"asked for offset {offset}, got the batch {found.first_offset}..{found.next_offset - 1}")
