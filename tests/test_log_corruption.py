"""Damage at rest: flipped bytes, truncated files and bad indexes are reported or
repaired, never silently served.

Every test damages real files of a real ``PartitionLog`` in ``tmp_path`` and reopens
the directory, cleanly (after ``close``) or uncleanly (the old object is dropped).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from brokers.log import LogConfig, PartitionLog
from brokers.log.segment import LogSegment
from wire.errors import CorruptRecordError, InvalidRecordBatchError
from wire.record_batch import HEADER_SIZE, build_batch, iter_batches, peek_header

pytestmark = pytest.mark.unit

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


def _snapshot(directory: Path) -> dict[str, bytes]:
    """Every segment file's bytes (``.log`` and set-aside ``.corrupt`` files)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())
            if p.name.endswith((".log", ".corrupt"))}


def _crash(log: PartitionLog) -> None:
    """Drop a log without closing it: no clean-shutdown marker, as after a crash."""
    del log
    gc.collect()


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
    """A closed segment lost its tail while the log was down (a bad restore, a bad disk).

    That is damage at rest: the open reports it and changes nothing on disk (it used to
    truncate the segment and delete every later one).
    """
    log = _fill(tmp_path)
    first = log.segments[0]
    position, _, _, _ = _batches(first)[-2]
    log.close()
    os.truncate(first.log_path, position + 30)  # inside the second to last batch
    before = _snapshot(tmp_path)
    for _ in range(2):  # reported again on every open: nothing was repaired away
        with pytest.raises(CorruptRecordError) as info:
            PartitionLog(tmp_path, CONFIG)
        assert (info.value.segment, info.value.position) == (str(first.log_path), position)
        assert _snapshot(tmp_path) == before
        assert (tmp_path / ".clean-shutdown").exists()


def _damaged_segments(directory: Path, config: LogConfig, batch: int, field_at: int,
                      mask: int, *, clean: bool) -> tuple[Path, int, dict[str, bytes]]:
    """Several segments, flushed; flip one byte of batch ``batch`` of the first one."""
    log = PartitionLog(directory, config)
    for i in range(30):
        log.append(build_batch([f"v{i}-{j}".encode() * 8 for j in range(3)], now_ms=1_000 + i))
    assert len(log.segments) >= 4
    first = log.segments[0]
    position = _batches(first)[batch][0]
    if clean:
        log.close()
    else:
        log.flush()  # the recovery point: the log end, so every closed segment is below it
        _crash(log)
    _flip(first.log_path, position + field_at, mask)
    return first.log_path, position, _snapshot(directory)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_damage_at_rest_found_on_open_never_deletes_data(tmp_path: Path, clean: bool) -> None:
    """The review's reproduction: batch 2 of the first segment gets a bad magic byte.

    Opening used to fall back to recovery, truncate the first segment there and delete
    every later segment with only a WARNING. The open must raise instead, naming the
    file and byte, and leave every byte on disk as it was.
    """
    config = LogConfig(segment_bytes=8192, index_interval_bytes=10**6)  # no index entry:
    # the open walks every header, so it meets the damage
    path, position, before = _damaged_segments(tmp_path, config, 2, 16, 0x40, clean=clean)
    for _ in range(2):
        with pytest.raises(CorruptRecordError) as info:
            PartitionLog(tmp_path, config)
        assert info.value.segment == str(path)
        assert info.value.position == position
        assert path.name in str(info.value) and f"byte {position}" in str(info.value)
        assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize(("field", "at", "mask"), [("magic", 16, 0x40),
                                                   ("record_count", 57, 0x40)])
def test_bad_first_header_of_a_closed_segment_is_a_corrupt_record_error(
    tmp_path: Path, clean: bool, field: str, at: int, mask: int,
) -> None:
    """The first header is read on open (``rolled_at`` comes from it); a bad one used to
    escape as a bare ``InvalidRecordBatchError`` (no segment, no position) on a clean
    open and wipe the log on an unclean one."""
    path, _, before = _damaged_segments(tmp_path, CONFIG, 0, at, mask, clean=clean)
    with pytest.raises(CorruptRecordError) as info:
        PartitionLog(tmp_path, CONFIG)
    assert (info.value.segment, info.value.position) == (str(path), 0)
    assert _snapshot(tmp_path) == before


def _open_with_damage(directory: Path, where: str) -> tuple[PartitionLog, Path, int]:
    """A healthy log reopened (nothing checked yet by this process), then damage
    injected under it while it is open (its descriptor sees the change)."""
    _fill(directory).close()
    log = PartitionLog(directory, CONFIG)
    first = log.segments[0]
    position, size, _, _ = _batches(first)[0]
    at = {"header": position + 57, "payload": position + size - 25}[where]
    _flip(first.log_path, at, 0x40)
    return log, first.log_path, position


_PATHS: dict[str, Callable[[PartitionLog], object]] = {
    "read": lambda log: log.read(0, BIG),
    "batch_headers": lambda log: list(log.batch_headers(0)),
    "offset_for_timestamp": lambda log: log.offset_for_timestamp(0),
    "find_by_timestamp": lambda log: log.find_by_timestamp(1_000),
    "rebuild_indexes": lambda log: log.segments[0].rebuild_indexes(),
    "load": lambda log: LogSegment(log.directory, 0, 2000, create=False).load(),
    "recover-below-durable": lambda log: LogSegment(log.directory, 0, 2000,
                                                    create=False).recover(durable_below=10**6),
    "verify": lambda log: log.verify(),
}


@pytest.mark.parametrize("path", sorted(_PATHS))
@pytest.mark.parametrize("where", ["header", "payload"])
def test_every_path_reports_stored_damage_with_segment_and_position(
    tmp_path: Path, path: str, where: str,
) -> None:
    log, log_path, position = _open_with_damage(tmp_path, where)
    header_only = {"batch_headers", "rebuild_indexes", "load"}
    if where == "payload" and path in header_only:
        _PATHS[path](log)  # these read headers only: a payload flip is not theirs to find
        return
    try:
        _PATHS[path](log)
    except CorruptRecordError as err:
        assert (err.segment, err.position) == (str(log_path), position)
    except InvalidRecordBatchError as err:  # pragma: no cover - the defect being tested
        pytest.fail(f"{path} raised a bare {type(err).__name__}: {err}")
    else:
        pytest.fail(f"{path} did not report the damage")


# ----------------------------------------------------------------------- unclean shutdown

def test_unclean_shutdown_truncates_at_a_corrupt_batch_after_the_recovery_point(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
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
    doomed_bytes = {path: path.read_bytes() for path in doomed}

    with caplog.at_level(logging.ERROR, logger="strata.brokers.log"):
        log = PartitionLog(tmp_path, CONFIG)
    assert not log.opened_cleanly
    assert log.log_end_offset == base  # truncated at the damaged batch
    assert log.recovered_bytes_truncated > 0
    assert os.path.getsize(damaged_segment.log_path) == position
    # The segments that can no longer follow are set aside, not deleted, and said so.
    assert log.set_aside == [path.with_name(path.name + ".corrupt") for path in doomed]
    for path in doomed:
        assert not path.exists()
        assert path.with_name(path.name + ".corrupt").read_bytes() == doomed_bytes[path]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and all(str(path) in errors[0] for path in doomed)
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


def test_unclean_shutdown_damage_below_the_recovery_point_of_the_active_segment(
    tmp_path: Path,
) -> None:
    """The segment holding the recovery point is recovered, but its bytes below the
    recovery point were fsynced: a bad batch there is damage at rest, not a torn write,
    and is reported instead of truncated."""
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=10**6))
    for i in range(6):
        log.append(build_batch([f"early{i}".encode() * 10] * 3, now_ms=1_000))
    log.flush()
    for i in range(6):
        log.append(build_batch([f"late{i}".encode() * 10] * 3, now_ms=2_000))
    (segment,) = log.segments
    position, size, _, _ = _batches(segment)[3]  # below the recovery point
    _crash(log)
    _flip(segment.log_path, position + size - 30)
    before = _snapshot(tmp_path)
    with pytest.raises(CorruptRecordError) as info:
        PartitionLog(tmp_path, LogConfig(segment_bytes=10**6))
    assert (info.value.segment, info.value.position) == (str(segment.log_path), position)
    assert "recovery point" in str(info.value)
    assert _snapshot(tmp_path) == before


def test_unclean_open_reports_a_log_that_ends_below_the_recovery_point(tmp_path: Path) -> None:
    """A segment cut at a batch boundary below the recovery point looks healthy, but
    offsets that were fsynced are gone: reported, not silently reused for new data."""
    log = _fill(tmp_path)
    log.flush()
    last = log.segments[-1]
    cut = _batches(last)[-1][0]
    _crash(log)
    os.truncate(last.log_path, cut)
    with pytest.raises(CorruptRecordError, match="durable data is missing"):
        PartitionLog(tmp_path, CONFIG)


def test_truncate_to_then_crash_reopens_cleanly_below_the_old_recovery_point(
    tmp_path: Path,
) -> None:
    """``truncate_to`` lowers the recovery point before it cuts anything, so a crash
    right after a truncation is not mistaken for lost durable data."""
    log = _fill(tmp_path)
    log.flush()
    batches = _batches(log.segments[1])
    middle = batches[1][2] + 1  # inside the second batch of the second segment
    end = log.truncate_to(middle)
    assert end == batches[1][2]
    _crash(log)
    log = PartitionLog(tmp_path, CONFIG)
    assert not log.opened_cleanly and log.log_end_offset == end


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
