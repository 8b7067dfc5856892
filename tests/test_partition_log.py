"""Unit tests of ``PartitionLog``: offsets, reads, rolling, retention, truncation,
checkpoints and reopen, flush policies, bad input and configuration.

Real directories in ``tmp_path``; time is controlled with the ``clock=`` parameter.
"""

from __future__ import annotations

import errno
import gc
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from brokers.log import FlushPolicy, LogConfig, PartitionLog, TimestampTypeConfig
from brokers.log import partition_log as partition_log_module
from brokers.log.checkpoint import OffsetCheckpoint
from brokers.log.group_commit import GroupCommit, OffsetsTruncatedError
from brokers.log.segment import LogSegment
from wire.errors import (
    InvalidConfigError,
    InvalidRecordBatchError,
    LogClosedError,
    LogStorageError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from wire.record_batch import (
    MAX_RECORDS_PER_BATCH,
    TimestampType,
    batches_to_table,
    build_batch,
    iter_batches,
    peek_header,
    set_base_offset,
    validate,
)

pytestmark = pytest.mark.unit

BIG = 10**9


class FakeClock:
    """Milliseconds that move only when told (far from the wall clock on purpose)."""

    def __init__(self, now: int = 5_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _batch(n: int = 3, *, tag: str = "r", ts: int | list[int] = 1_000, pad: int = 40) -> bytes:
    timestamps = ts if isinstance(ts, list) else [ts] * n
    return build_batch([f"{tag}-{i}".encode() + b"." * pad for i in range(len(timestamps))],
                       keys=[b"key"] * len(timestamps), timestamps=timestamps)


def _stored(batch: bytes, base_offset: int, leader_epoch: int = 0) -> bytes:
    """What the log holds for ``batch`` once the leader assigned its offsets."""
    data = bytearray(batch)
    set_base_offset(data, base_offset, leader_epoch)
    return bytes(data)


def _read_all(log: PartitionLog, start: int | None = None) -> list[bytes]:
    """Every whole batch from ``start`` (default: log start) to the end, following slices."""
    out: list[bytes] = []
    offset = log.log_start_offset if start is None else start
    while True:
        found = log.read(offset, BIG)
        if found is None:
            return out
        out.extend(bytes(v) for _, v in iter_batches(found.read_bytes(), allow_partial_tail=False))
        offset = found.next_offset


def _log_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.log"))


# ----------------------------------------------------------------------- append and read

def test_append_assigns_contiguous_offsets(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    batches = [_batch(3), _batch(1), _batch(5)]
    infos = [log.append(b, leader_epoch=4) for b in batches]
    assert [(i.first_offset, i.last_offset, i.record_count) for i in infos] == \
        [(0, 2, 3), (3, 3, 1), (4, 8, 5)]
    assert [i.size for i in infos] == [len(b) for b in batches]
    assert all(i.log_append_time == -1 for i in infos)
    assert log.log_end_offset == 9
    stored = _read_all(log)
    assert stored == [_stored(b, i.first_offset, 4) for b, i in zip(batches, infos, strict=True)]
    assert [peek_header(s).leader_epoch for s in stored] == [4, 4, 4]
    # The caller's bytes are never modified.
    assert peek_header(batches[1]).base_offset == 0


def test_read_across_segments_returns_containing_batch(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1500))
    expected: list[tuple[int, int, bytes]] = []  # first, next, stored bytes
    for i in range(24):
        batch = _batch(1 + i % 4, tag=f"b{i}")
        info = log.append(batch)
        stored = _stored(batch, info.first_offset)
        expected.append((info.first_offset, info.last_offset + 1, stored))
    segments = log.segments
    assert len(segments) >= 6
    for before, after in itertools.pairwise(segments):
        assert before.next_offset == after.base_offset
        assert before.size <= 4096
    assert _log_files(tmp_path) == [f"{s.base_offset:020d}.log" for s in segments]
    for first, nxt, data in expected:
        for offset in range(first, nxt):
            found = log.read(offset, 1)
            assert found is not None
            assert (found.first_offset, found.next_offset) == (first, nxt)
            assert found.read_bytes() == data
    # A big read stops at its segment's end (one file per slice) and follows on.
    found = log.read(0, BIG)
    assert found is not None and found.next_offset == segments[1].base_offset
    assert _read_all(log) == [d for _, _, d in expected]


def test_offset_out_of_range_carries_the_valid_range(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096))
    for _ in range(6):
        log.append(_batch(3))
    log.delete_records(7)
    with pytest.raises(OffsetOutOfRangeError) as below:
        log.read(6, BIG)
    assert (below.value.offset, below.value.log_start_offset, below.value.log_end_offset) == \
        (6, 7, 18)
    assert below.value.code == 1
    with pytest.raises(OffsetOutOfRangeError) as above:
        log.read(19, BIG)
    assert (above.value.offset, above.value.log_start_offset, above.value.log_end_offset) == \
        (19, 7, 18)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, BIG)
    assert log.read(18, BIG) is None  # the log end itself is a valid position: nothing yet
    found = log.read(7, 1)
    assert found is not None and found.first_offset == 6  # the batch holding offset 7
    with pytest.raises(ValueError):
        log.read(7, 0)


def test_upper_offset_hides_batches_at_or_after_it(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    for _ in range(4):
        log.append(_batch(2))
    found = log.read(0, BIG, upper_offset=4)
    assert found is not None and found.next_offset == 4
    assert log.read(4, BIG, upper_offset=4) is None


# ----------------------------------------------------------------------- rolling

def test_roll_by_segment_bytes(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=5000))
    size = len(_batch(2))
    for _ in range(10):
        log.append(_batch(2))
    per_segment = 5000 // size
    assert [s.size for s in log.segments[:-1]] == [per_segment * size] * (len(log.segments) - 1)
    assert [s.base_offset for s in log.segments] == \
        list(range(0, 20, 2 * per_segment))
    # A batch larger than segment.bytes still goes in, alone in a fresh segment.
    big = build_batch([b"x" * 6000], now_ms=1)
    info = log.append(big)
    assert log.active_segment.base_offset == info.first_offset
    assert log.active_segment.size == len(big)
    log.append(_batch(1))
    assert log.active_segment.base_offset == info.first_offset + 1


def test_roll_by_segment_ms_uses_the_log_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, LogConfig(segment_ms=1000), clock=clock)
    log.append(_batch(1, ts=clock.now))
    clock.now += 999
    log.append(_batch(1, ts=clock.now))
    assert len(log.segments) == 1
    clock.now += 1  # the first record is now segment.ms old
    log.append(_batch(1, ts=clock.now))
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_by_segment_ms_after_reopen(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, LogConfig(segment_ms=1000), clock=clock)
    log.append(_batch(1, ts=clock.now))
    log.close()
    clock.now += 500
    log = PartitionLog(tmp_path, LogConfig(segment_ms=1000), clock=clock)
    log.append(_batch(1, ts=clock.now))
    assert len(log.segments) == 1
    clock.now += 500
    log.append(_batch(1, ts=clock.now))
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_explicit_roll(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    assert log.roll().base_offset == 0  # empty active segment: no-op
    log.append(_batch(2))
    assert log.roll().base_offset == 2
    assert log.roll().base_offset == 2
    assert _log_files(tmp_path) == ["00000000000000000000.log", "00000000000000000002.log"]


# ----------------------------------------------------------------------- retention

def _three_closed_segments(tmp_path: Path, clock: FakeClock,
                           config: LogConfig) -> tuple[PartitionLog, list[int]]:
    log = PartitionLog(tmp_path, config, clock=clock)
    stamps = [clock.now - 50_000, clock.now - 30_000, clock.now - 10_000, clock.now]
    for i, ts in enumerate(stamps):
        log.append(_batch(2, ts=ts))
        log.append(_batch(2, ts=ts - 5))
        if i < 3:
            log.roll()
    assert len(log.segments) == 4
    return log, stamps


def test_retention_by_time_deletes_whole_closed_segments(tmp_path: Path) -> None:
    clock = FakeClock(10_000_000)
    log, _ = _three_closed_segments(tmp_path, clock, LogConfig(retention_ms=20_000))
    assert log.apply_retention() == [0, 4]  # newest records 50 s and 30 s old
    assert log.log_start_offset == 8
    assert [s.base_offset for s in log.segments] == [8, 12]
    assert _log_files(tmp_path) == ["00000000000000000008.log", "00000000000000000012.log"]
    assert not (tmp_path / "00000000000000000000.index").exists()
    assert not (tmp_path / "00000000000000000000.timeindex").exists()
    with pytest.raises(OffsetOutOfRangeError):
        log.read(7, BIG)
    assert OffsetCheckpoint(tmp_path / "log-start-offset").read() == 8
    assert log.apply_retention() == []
    clock.now += 10**9  # everything expired: the active segment still stays
    assert log.apply_retention() == [8]
    assert [s.base_offset for s in log.segments] == [12]
    assert log.log_start_offset == 12 and log.log_end_offset == 16
    assert len(_read_all(log)) == 2


def test_retention_by_time_boundary(tmp_path: Path) -> None:
    """A closed segment goes once its newest record is *older* than retention.ms."""
    clock = FakeClock(10_000_000)
    log = PartitionLog(tmp_path, LogConfig(retention_ms=20_000), clock=clock)
    log.append(_batch(2, ts=[clock.now - 5, clock.now]))
    log.roll()
    log.append(_batch(1, ts=clock.now))
    clock.now += 20_000  # the newest record is exactly retention.ms old: kept
    assert log.apply_retention() == []
    clock.now += 1
    assert log.apply_retention() == [0]


def test_retention_by_time_only_deletes_a_prefix(tmp_path: Path) -> None:
    clock = FakeClock(10_000_000)
    log = PartitionLog(tmp_path, LogConfig(retention_ms=20_000), clock=clock)
    log.append(_batch(1, ts=clock.now))  # fresh segment first ...
    log.roll()
    log.append(_batch(1, ts=clock.now - 100_000))  # ... an old one behind it
    log.roll()
    log.append(_batch(1, ts=clock.now))
    assert log.apply_retention() == []
    assert log.log_start_offset == 0


def test_retention_by_bytes(tmp_path: Path) -> None:
    clock = FakeClock()
    log, _ = _three_closed_segments(tmp_path, clock, LogConfig(retention_ms=-1))
    sizes = [s.size for s in log.segments]
    log.close()
    # Keep the log at or above the limit once the oldest segment goes, not below it.
    config = LogConfig(retention_ms=-1, retention_bytes=sum(sizes[1:]))
    log = PartitionLog(tmp_path, config, clock=clock)
    assert log.apply_retention() == [0]
    assert log.size_bytes == sum(sizes[1:])
    assert log.apply_retention() == []
    log.close()
    config = LogConfig(retention_ms=-1, retention_bytes=sizes[3] + sizes[2] - 1)
    log = PartitionLog(tmp_path, config, clock=clock)
    assert log.apply_retention() == [4]  # deleting 8 as well would go below the limit
    assert log.size_bytes == sizes[2] + sizes[3]
    log.close()
    log = PartitionLog(tmp_path, LogConfig(retention_ms=-1, retention_bytes=0), clock=clock)
    assert log.apply_retention() == [8]  # never the active segment
    assert log.log_start_offset == 12
    assert [s.base_offset for s in log.segments] == [12]
    log.close()
    reopened = PartitionLog(tmp_path, clock=clock)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (12, 16)


# ----------------------------------------------------------------------- removal

def test_delete_records_moves_log_start(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096))
    for _ in range(9):
        log.append(_batch(3))
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    target = bases[1] + 1  # inside the second segment
    assert log.delete_records(target) == target
    assert log.log_start_offset == target
    assert [s.base_offset for s in log.segments] == bases[1:]  # whole segments below go
    found = log.read(target, 1)
    assert found is not None and found.first_offset == bases[1]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, BIG)
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(target - 1)  # the log start never moves back
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(log.log_end_offset + 1)
    assert log.delete_records(log.log_end_offset) == 27
    assert log.read(27, BIG) is None
    log.append(_batch(1))
    assert log.read(27, BIG) is not None
    log.close()
    assert PartitionLog(tmp_path).log_start_offset == 27


def test_truncate_to_drops_whole_batches_and_later_segments(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1))
    batches = [_batch(3, tag=str(i)) for i in range(10)]
    for b in batches:
        log.append(b)
    bases = [s.base_offset for s in log.segments]
    cut = bases[1] + 4  # inside the second batch of the second segment
    new_end = log.truncate_to(cut)
    assert new_end == bases[1] + 3
    assert log.log_end_offset == new_end
    assert [s.base_offset for s in log.segments] == bases[:2]
    assert _log_files(tmp_path) == [f"{b:020d}.log" for b in bases[:2]]
    assert _read_all(log) == [_stored(b, 3 * i) for i, b in enumerate(batches[: new_end // 3])]
    assert log.recovery_point <= new_end
    assert log.truncate_to(BIG) == new_end  # past the end: nothing happens
    info = log.append(_batch(2, tag="new"))
    assert info.first_offset == new_end
    log.close()
    reopened = PartitionLog(tmp_path)
    assert reopened.log_end_offset == new_end + 2
    assert len(_read_all(reopened)) == new_end // 3 + 1


def test_truncate_to_at_a_segment_base(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096))
    for _ in range(8):
        log.append(_batch(2))
    bases = [s.base_offset for s in log.segments]
    assert log.truncate_to(bases[1]) == bases[1]
    assert [s.base_offset for s in log.segments] == [0]
    assert log.append(_batch(1)).first_offset == bases[1]


def test_truncate_to_below_log_start_restarts_the_log(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096))
    for _ in range(8):
        log.append(_batch(2))
    log.delete_records(6)
    assert log.truncate_to(4) == 4
    assert (log.log_start_offset, log.log_end_offset) == (4, 4)
    assert _log_files(tmp_path) == ["00000000000000000004.log"]
    assert log.append(_batch(2)).first_offset == 4
    log.close()
    reopened = PartitionLog(tmp_path)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 6)


def test_truncate_into_the_batch_holding_log_start_keeps_start_le_end(tmp_path: Path) -> None:
    """delete-records inside a batch, then truncation inside that same batch.

    The whole batch goes, so the log end would drop below the log start; the log must
    keep ``log_start_offset <= log_end_offset`` and hand out no offset below its start.
    """
    log = PartitionLog(tmp_path)
    log.append(_batch(10))
    log.delete_records(5)
    log.truncate_to(7)
    assert log.log_start_offset <= log.log_end_offset
    info = log.append(_batch(1))
    assert info.first_offset >= log.log_start_offset
    found = log.read(log.log_start_offset, BIG)
    assert found is not None and found.next_offset == info.last_offset + 1


# ----------------------------------------------------------------------- reopen

def _populated(tmp_path: Path, **config: object) -> tuple[PartitionLog, list[bytes]]:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1200,
                                           **config))  # type: ignore[arg-type]
    for i in range(15):
        log.append(_batch(1 + i % 3, tag=f"p{i}"))
    log.delete_records(5)
    return log, _read_all(log)


def test_close_then_reopen_is_clean_and_preserves_everything(tmp_path: Path) -> None:
    log, content = _populated(tmp_path)
    bases = [s.base_offset for s in log.segments]
    end = log.log_end_offset
    log.close()
    assert (tmp_path / ".clean-shutdown").exists()
    with pytest.raises(LogClosedError):
        log.append(_batch(1))
    with pytest.raises(LogClosedError):
        log.read(5, BIG)
    log.close()  # idempotent
    reopened = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1200))
    assert reopened.opened_cleanly
    assert not (tmp_path / ".clean-shutdown").exists()  # a crash from now on is detected
    assert reopened.recovered_bytes_truncated == 0
    assert [s.base_offset for s in reopened.segments] == bases
    assert (reopened.log_start_offset, reopened.log_end_offset) == (5, end)
    assert reopened.recovery_point == end
    assert _read_all(reopened) == content
    assert reopened.append(_batch(1)).first_offset == end


def test_reopen_without_close_recovers(tmp_path: Path) -> None:
    log, content = _populated(tmp_path)
    bases = [s.base_offset for s in log.segments]
    end = log.log_end_offset
    del log  # dropped without close: no marker, indexes of the active segment unwritten
    gc.collect()
    reopened = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1200))
    assert not reopened.opened_cleanly
    assert reopened.recovered_bytes_truncated == 0
    assert [s.base_offset for s in reopened.segments] == bases
    assert (reopened.log_start_offset, reopened.log_end_offset) == (5, end)
    assert _read_all(reopened) == content
    # Recovery flushed what it checked: the recovery point is the end.
    assert OffsetCheckpoint(tmp_path / "recovery-point").read() == end


def test_reopen_without_close_truncates_garbage_tail(tmp_path: Path) -> None:
    log, content = _populated(tmp_path)
    end = log.log_end_offset
    active = log.active_segment.log_path
    del log
    gc.collect()
    with open(active, "ab") as f:
        f.write(_batch(4)[:-20])  # a torn batch
    reopened = PartitionLog(tmp_path)
    assert reopened.recovered_bytes_truncated == len(_batch(4)) - 20
    assert reopened.log_end_offset == end
    assert _read_all(reopened) == content


def test_stray_files_are_cleaned_on_open(tmp_path: Path) -> None:
    log, content = _populated(tmp_path)
    log.close()
    (tmp_path / "recovery-point.tmp").write_text("junk")
    (tmp_path / "00000000000000099999.index").write_bytes(b"\x00" * 8)
    (tmp_path / "00000000000000099999.timeindex").write_bytes(b"\x00" * 12)
    reopened = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1200))
    assert not (tmp_path / "recovery-point.tmp").exists()
    assert not (tmp_path / "00000000000000099999.index").exists()
    assert not (tmp_path / "00000000000000099999.timeindex").exists()
    assert _read_all(reopened) == content


# ----------------------------------------------------------------------- flush policies

def _slow_group_commit_flush(log: PartitionLog, seconds: float) -> None:
    """Make each group-commit fsync take ``seconds`` more, as on a real disk.

    On tmpfs an fsync is nearly free, so appenders rarely overlap one and the flush
    sharing under test would not be exercised (the test failed there 3 times in 3).
    """
    flush = log._group_commit._flush

    def slow() -> int:
        end = flush()
        time.sleep(seconds)
        return end

    log._group_commit._flush = slow


def test_flush_policy_always_group_commit(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    _slow_group_commit_flush(log, 0.002)
    threads, per_thread = 8, 40
    results: dict[tuple[int, int], tuple[int, int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                info = log.append(build_batch([f"{t}:{i}:{j}".encode() for j in range(2)],
                                              now_ms=1))
                # Durable before append returned.
                assert log._group_commit.durable_offset >= info.last_offset + 1
                results[(t, i)] = (info.first_offset, info.last_offset)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    appends = threads * per_thread
    ranges = sorted(results.values())
    assert len(ranges) == appends
    assert ranges == [(2 * k, 2 * k + 1) for k in range(appends)]  # distinct, contiguous
    flushes = log._group_commit.flush_count
    assert 1 <= flushes < appends // 2, flushes  # appenders shared fsyncs
    assert log.recovery_point == log.log_end_offset == 2 * appends
    # Every acknowledged append holds what its thread wrote.
    table = batches_to_table(b"".join(_read_all(log)), topic="t", partition=0)
    values = table.column("value").to_pylist()
    for (t, i), (first, _) in results.items():
        assert values[first] == f"{t}:{i}:0".encode()


def test_group_commit_shares_flushes_and_propagates_errors() -> None:
    """``GroupCommit`` on its own, with a real (slow) flush function."""
    end = [0]
    lock = threading.Lock()
    fail = threading.Event()

    def flush() -> int:
        with lock:
            snapshot = end[0]
        time.sleep(0.005)  # an fsync that takes a while
        if fail.is_set():
            raise OSError("disk gone")
        return snapshot

    commit = GroupCommit(flush, durable_offset=0)

    def appender(n: int) -> None:
        for _ in range(n):
            with lock:
                end[0] += 1
                mine = end[0]
            commit.wait_durable(mine)
            assert commit.durable_offset >= mine

    threads = [threading.Thread(target=appender, args=(10,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert commit.durable_offset == 80
    assert commit.flush_count <= 40, commit.flush_count  # 80 appends, far fewer fsyncs
    count = commit.flush_count
    commit.wait_durable(80)  # already durable: no flush
    assert commit.flush_count == count

    fail.set()
    errors: list[BaseException] = []

    def doomed() -> None:
        with lock:
            end[0] += 1
            mine = end[0]
        try:
            commit.wait_durable(mine)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=doomed) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 4 and all("disk gone" in str(e) for e in errors)
    assert commit.durable_offset == 80
    fail.clear()
    commit.wait_durable(84)  # the next flush succeeds again
    assert commit.durable_offset == 84


def test_group_commit_reset_voids_a_flush_that_started_before_it() -> None:
    """A truncation while a flush is in flight: the flush's log-end snapshot names
    offsets that no longer exist (and that later appends reuse), so publishing it would
    let those appends be acknowledged without an fsync."""
    end = [100]
    in_flush, release = threading.Event(), threading.Event()
    flushed: list[int] = []

    def flush() -> int:
        snapshot = end[0]
        if not release.is_set():
            in_flush.set()
            release.wait(10)
        flushed.append(snapshot)
        return snapshot

    commit = GroupCommit(flush, durable_offset=50)
    errors: list[BaseException] = []

    def waiter(offset: int) -> None:
        try:
            commit.wait_durable(offset)
        except OffsetsTruncatedError as exc:
            errors.append(exc)

    truncated = threading.Thread(target=waiter, args=(100,))  # its offsets get cut below
    truncated.start()
    assert in_flush.wait(10)
    survivor = threading.Thread(target=waiter, args=(55,))  # below the truncation point
    survivor.start()
    end[0] = 60
    commit.reset(min(commit.durable_offset, 60), truncated_to=60)
    release.set()
    truncated.join(10)
    survivor.join(10)
    assert not truncated.is_alive() and not survivor.is_alive()
    assert commit.durable_offset == 60  # from a flush that started after the reset
    assert flushed == [100, 60] and commit.discarded_flushes == 1
    assert len(errors) == 1 and (errors[0].offset, errors[0].truncated_to) == (100, 60)
    # New appends at the reused offsets wait for a fresh flush.
    end[0] = 90
    commit.wait_durable(90)
    assert commit.durable_offset == 90 and flushed[-1] == 90


def test_truncation_during_a_group_commit_flush_never_acknowledges_unsynced_appends(
    tmp_path: Path,
) -> None:
    log = PartitionLog(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    for _ in range(3):
        log.append(_batch())  # offsets 0..8, durable
    flush = log._group_commit._flush
    in_flush, release = threading.Event(), threading.Event()

    def slow_flush() -> int:  # the fsync of the next append is still running when...
        end = flush()
        if not release.is_set():
            in_flush.set()
            release.wait(10)
        return end

    log._group_commit._flush = slow_flush
    outcome: list[object] = []

    def appender() -> None:
        try:
            outcome.append(log.append(_batch(tag="doomed")))  # offsets 9..11
        except NotLeaderError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=appender)
    thread.start()
    assert in_flush.wait(10)
    assert log.truncate_to(9) == 9  # ... the log is truncated under it
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], NotLeaderError), outcome
    assert log._group_commit.durable_offset <= log.log_end_offset == 9
    assert log.recovery_point <= log.log_end_offset
    flushes = log._group_commit.flush_count
    info = log.append(_batch(tag="new"))  # reuses offsets 9..11
    assert info.first_offset == 9
    assert log._group_commit.flush_count == flushes + 1  # fsynced before acknowledged
    assert log._group_commit.durable_offset == 12


def _break_fsync(segment: LogSegment) -> None:
    """Point the segment's descriptor at a pipe: fdatasync fails (EINVAL) like a dying
    disk. The descriptor number stays the segment's, so nothing else is disturbed."""
    r, w = os.pipe()
    os.dup2(r, segment.file.fd)
    os.close(r)
    os.close(w)


def test_failed_flush_takes_the_log_offline(tmp_path: Path) -> None:
    """``flush.policy=interval``: the periodic flush (``flush_if_due``) must not swallow
    or leak a raw OSError; the log goes offline as after a failed write."""
    clock = FakeClock()
    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_ms=1000)
    log = PartitionLog(tmp_path, config, clock=clock)
    stored = [_stored(_batch(), 0)]
    log.append(_batch())
    recovery_point = log.recovery_point
    _break_fsync(log.active_segment)
    clock.now += 1000
    with pytest.raises(LogStorageError, match="offline"):
        log.flush_if_due()
    assert log.recovery_point == recovery_point  # nothing was made durable
    with pytest.raises(LogStorageError):
        log.append(_batch())
    with pytest.raises(LogStorageError):
        log.flush()
    log.close()  # offline: no flush, no clean-shutdown marker
    assert not (tmp_path / ".clean-shutdown").exists()
    reopened = PartitionLog(tmp_path, config, clock=clock)
    assert not reopened.opened_cleanly
    assert _read_all(reopened) == stored


def test_failed_fsync_on_close_reports_and_still_closes(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    log.append(_batch())
    _break_fsync(log.active_segment)
    with pytest.raises(LogStorageError):
        log.close()
    assert not (tmp_path / ".clean-shutdown").exists()
    log.close()  # closed already: a no-op
    with pytest.raises(LogClosedError):
        log.read(0, BIG)


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_new_segment_files_are_made_durable_with_a_directory_fsync(
    tmp_path: Path, policy: FlushPolicy, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new file's name lives in the directory: without fsyncing the directory a power
    loss can lose the whole segment even though its data was fsynced."""
    synced: list[list[str]] = []
    real = partition_log_module.fsync_directory

    def recording(directory: Path) -> None:
        synced.append(_log_files(directory))
        real(directory)

    monkeypatch.setattr(partition_log_module, "fsync_directory", recording)
    log = PartitionLog(tmp_path, LogConfig(flush_policy=policy, segment_bytes=1024))
    synced.clear()
    while len(log.segments) < 3:
        log.append(_batch(pad=200))
    rolled = _log_files(tmp_path)
    log.truncate_to(0)  # restarts the log in a new file
    if policy is FlushPolicy.NONE:
        assert synced == []
    else:
        # Each fsync ran once the new file existed: two rolls, then the restart.
        assert synced == [rolled[:2], rolled, ["00000000000000000000.log"]]


@pytest.mark.parametrize("how", ["clean", "offline"])
def test_a_file_slice_stays_valid_after_the_log_is_closed(tmp_path: Path, how: str) -> None:
    """The network layer may still be sending a slice (``os.sendfile``) when the log is
    closed; closing used to close the descriptor under it (and the number could then be
    reused by any file opened next)."""
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=1024))
    while len(log.segments) < 3:
        log.append(_batch(pad=200))
    found = log.read(0, BIG)  # from the first, closed segment
    assert found is not None
    expected = found.read_bytes()
    fd = found.fileno()
    if how == "offline":
        _break_fsync(log.active_segment)
        with pytest.raises(LogStorageError):
            log.flush()
    log.close()
    other = os.open(tmp_path / "unrelated", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert other != fd
        assert found.fileno() == fd and found.read_bytes() == expected
    finally:
        os.close(other)
    calls: list[Callable[[PartitionLog], object]] = [
        lambda lg: lg.read(0, 1), lambda lg: list(lg.batch_headers(0)),
        lambda lg: lg.find_by_timestamp(0), PartitionLog.verify]
    for call in calls:
        with pytest.raises(LogClosedError):
            call(log)
    del log
    gc.collect()
    os.fstat(fd)  # the slice alone keeps it open
    del found
    gc.collect()
    with pytest.raises(OSError) as info:
        os.fstat(fd)
    assert info.value.errno == errno.EBADF


def test_flush_policy_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_ms=1000),
                       clock=clock)
    checkpoint = OffsetCheckpoint(tmp_path / "recovery-point")
    log.append(_batch(2))
    clock.now += 999
    log.append(_batch(2))
    assert log.flush_if_due() is False
    # Not flushed yet: nothing recorded (a brand-new log has no checkpoint; missing is 0).
    assert log.recovery_point == 0 and checkpoint.read() is None
    clock.now += 1
    log.append(_batch(2))  # due: this append flushes
    assert log.recovery_point == 6 and checkpoint.read() == 6
    log.append(_batch(2))
    assert log.flush_if_due() is False
    clock.now += 1000
    assert log.flush_if_due() is True
    assert log.recovery_point == 8 and checkpoint.read() == 8
    assert log._group_commit.flush_count == 0


def test_flush_policy_none(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, LogConfig(flush_policy=FlushPolicy.NONE, flush_ms=1),
                       clock=clock)
    for _ in range(5):
        log.append(_batch(2))
        clock.now += 10_000
    assert log.flush_if_due() is False
    assert log.recovery_point == 0
    assert OffsetCheckpoint(tmp_path / "recovery-point").read() is None  # never written
    assert log._group_commit.flush_count == 0
    log.flush()  # an explicit flush still works
    assert log.recovery_point == 10
    assert OffsetCheckpoint(tmp_path / "recovery-point").read() == 10


# ----------------------------------------------------------------------- bad input

def _with(batch: bytes, fmt: str, at: int, value: int, *, fix_crc: bool) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">" + fmt, out, at, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _invalid_batches() -> dict[str, bytes]:
    good = _batch(3)
    flipped = bytearray(good)
    flipped[-30] ^= 0x04
    return {
        "bad crc": bytes(flipped),
        "wrong magic": _with(good, "b", 16, 7, fix_crc=False),
        "truncated header": good[:40],
        "length longer than bytes": _with(good, "i", 8, len(good) - 12 + 100, fix_crc=False),
        "length shorter than bytes": _with(good, "i", 8, len(good) - 12 - 100, fix_crc=False),
        "trailing bytes": good + b"\x00" * 5,
        "record count 0": _with(_with(good, "i", 57, 0, fix_crc=True), "i", 23, -1,
                                fix_crc=True),
        "record count above max": _with(
            _with(good, "i", 57, MAX_RECORDS_PER_BATCH + 1, fix_crc=True), "i", 23,
            MAX_RECORDS_PER_BATCH, fix_crc=True),
        "record count vs last offset delta": _with(good, "i", 23, 0, fix_crc=True),
        "unknown attributes": _with(good, "h", 21, 0x200, fix_crc=True),
    }


@pytest.mark.parametrize("case", sorted(_invalid_batches()))
def test_invalid_batches_write_nothing(tmp_path: Path, case: str) -> None:
    log = PartitionLog(tmp_path)
    log.append(_batch(2))
    before = (log.log_end_offset, log.size_bytes, log.active_segment.log_path.read_bytes())
    with pytest.raises(InvalidRecordBatchError):
        log.append(_invalid_batches()[case])
    assert (log.log_end_offset, log.size_bytes, log.active_segment.log_path.read_bytes()) == \
        before
    assert log.append(_batch(1)).first_offset == 2  # the log is still fine


def test_record_too_large_writes_nothing(tmp_path: Path) -> None:
    batch = _batch(3)
    log = PartitionLog(tmp_path, LogConfig(max_message_bytes=len(batch)))
    log.append(batch)  # exactly at the limit
    size = log.size_bytes
    too_big = _batch(4)
    assert len(too_big) > len(batch)
    with pytest.raises(RecordTooLargeError) as info:
        log.append(too_big)
    assert info.value.code == 10
    assert "max.message.bytes" in str(info.value)
    assert (log.log_end_offset, log.size_bytes) == (3, size)
    assert os.path.getsize(log.active_segment.log_path) == size
    # A follower copies what its leader accepted, even above its own (maybe lowered)
    # limit: a copy that refused it would stall replication of the whole partition.
    log.append_as_follower(_stored(too_big, 3))
    assert log.log_end_offset == 7


def test_append_as_follower_requires_base_at_log_end(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    log.append(_batch(3))
    replicated = _stored(_batch(2, tag="f"), 3, leader_epoch=9)
    with pytest.raises(InvalidRecordBatchError, match="log ends at 3"):
        log.append_as_follower(_stored(_batch(2), 4, leader_epoch=9))
    with pytest.raises(InvalidRecordBatchError, match="log ends at 3"):
        log.append_as_follower(_stored(_batch(2), 2, leader_epoch=9))
    assert log.log_end_offset == 3
    info = log.append_as_follower(replicated)
    assert (info.first_offset, info.last_offset) == (3, 4)
    assert _read_all(log)[-1] == replicated  # stored as given, leader epoch included
    damaged = bytearray(_stored(_batch(1), 5))
    damaged[-10] ^= 1
    with pytest.raises(InvalidRecordBatchError):
        log.append_as_follower(bytes(damaged))
    assert log.log_end_offset == 5


# ----------------------------------------------------------------------- timestamps

def test_log_append_time_topic_stamps_batches(tmp_path: Path) -> None:
    clock = FakeClock(42_000)
    config = LogConfig(message_timestamp_type=TimestampTypeConfig.LOG_APPEND_TIME)
    log = PartitionLog(tmp_path, config, clock=clock)
    info = log.append(_batch(3, ts=[5, 6, 7]))
    assert info.log_append_time == 42_000 and info.max_timestamp == 42_000
    (stored,) = _read_all(log)
    header = validate(stored)  # CRC recomputed after the stamp
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 42_000
    table = batches_to_table(stored, topic="t", partition=0)
    assert table.column("timestamp").to_pylist() == [42_000] * 3
    assert log.offset_for_timestamp(6) == 0
    assert log.offset_for_timestamp(42_000) == 0
    assert log.offset_for_timestamp(42_001) is None
    log.close()
    reopened = PartitionLog(tmp_path, config, clock=clock)
    reopened.verify()


def test_offset_for_timestamp_across_segments(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig(segment_bytes=4096, index_interval_bytes=1))
    for i in range(12):
        log.append(_batch(2, ts=[100 * i, 100 * i + 50]))
    assert len(log.segments) >= 3
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(51) == 2
    assert log.offset_for_timestamp(750) == 15
    assert log.offset_for_timestamp(751) == 16
    assert log.offset_for_timestamp(1150) == 23
    assert log.offset_for_timestamp(1151) is None
    log.delete_records(9)
    assert log.offset_for_timestamp(0) == 9


def test_offset_for_timestamp_respects_log_start_inside_a_batch(tmp_path: Path) -> None:
    """Log start inside a batch whose early records carry the later timestamps."""
    log = PartitionLog(tmp_path)
    log.append(_batch(ts=[900, 10, 10, 10]))  # offsets 0-3
    log.append(_batch(ts=[950]))  # offset 4
    log.delete_records(2)
    # Offsets 2 and 3 have timestamp 10; the first record at or after 500 is offset 4.
    assert log.offset_for_timestamp(500) == 4


# ----------------------------------------------------------------------- configuration

@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "abc"),
        ("segment.bytes", "100"),
        ("segment.bytes", str(2**31)),
        ("segment.ms", "0"),
        ("retention.ms", "-2"),
        ("retention.bytes", "-5"),
        ("index.interval.bytes", "0"),
        ("max.message.bytes", "10"),
        ("flush.policy", "sometimes"),
        ("flush.ms", "1.5"),
        ("cleanup.policy", "shred"),
        ("min.insync.replicas", "0"),
        ("message.timestamp.type", "Now"),
    ],
)
def test_log_config_rejects_bad_values_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"flush.ms": "10", key: value})
    assert key in str(info.value)
    assert "accepted" in str(info.value)
    assert info.value.code == 40


def test_log_config_rejects_unknown_keys() -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"retention.hours": "5"})
    assert "retention.hours" in str(info.value)
    assert "retention.ms" in str(info.value)  # lists the known keys


def test_log_config_parses_and_round_trips() -> None:
    config = LogConfig.from_mapping({
        "segment.bytes": "2048", "segment.ms": 60_000, "retention.ms": "-1",
        "retention.bytes": " 1000 ", "flush.policy": "always",
        "message.timestamp.type": "LogAppendTime", "cleanup.policy": "delete",
    })
    assert config.segment_bytes == 2048 and config.segment_ms == 60_000
    assert config.retention_ms == -1 and config.retention_bytes == 1000
    assert config.flush_policy is FlushPolicy.ALWAYS
    assert config.message_timestamp_type is TimestampTypeConfig.LOG_APPEND_TIME
    assert LogConfig.from_mapping(config.to_mapping()) == config
    layered = LogConfig.from_mapping({"flush.ms": "5"}, base=config)
    assert layered.flush_ms == 5 and layered.segment_bytes == 2048
    assert LogConfig.from_mapping({}) == LogConfig()


def test_timestamp_lookup_over_an_undecodable_payload_answers_the_batch_start(
        tmp_path: Path) -> None:
    """A producer may send a CRC-valid batch whose payload is not Arrow (the broker does not
    decode payloads). Timestamp lookups must not report that as disk damage."""
    from wire.record_batch import HEADER_SIZE, crc_of

    log = PartitionLog(tmp_path, LogConfig())
    log.append(build_batch([b"a", b"b"], timestamps=[1000, 2000]))
    junk = bytearray(build_batch([b"c", b"d"], timestamps=[3000, 4000]))
    junk[HEADER_SIZE:] = b"\x07" * (len(junk) - HEADER_SIZE)
    junk[17:21] = crc_of(junk).to_bytes(4, "big")
    log.append(bytes(junk))
    assert log.find_by_timestamp(2500) == (2, 3000)  # the junk batch's first offset
    assert log.find_by_timestamp(1500) == (1, 2000)  # decodable batches stay exact
    log.close()


def test_an_offset_checkpoint_is_durable_and_skips_rewriting_its_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``OffsetCheckpoint.write`` replaces the file atomically and fsyncs the file and
    its directory; writing the value already on disk does nothing."""
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    checkpoint = OffsetCheckpoint(tmp_path / "recovery-point")
    checkpoint.write(3)
    assert len(synced) == 2 and OffsetCheckpoint(tmp_path / "recovery-point").read() == 3
    checkpoint.write(3)
    assert len(synced) == 2
    checkpoint.write(12_345_678_901)
    assert len(synced) == 4
    assert OffsetCheckpoint(tmp_path / "recovery-point").read() == 12_345_678_901
    assert os.listdir(tmp_path) == ["recovery-point"]
