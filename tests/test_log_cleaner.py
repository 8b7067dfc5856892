"""Log compaction (``brokers/log/cleaner.py``) on real ``PartitionLog`` directories.

A seeded random workload is checked against a model: after a pass, reading the whole
log gives exactly the latest record per key of the cleaned range (tombstones only until
``delete.retention.ms``), then every record of the rest, offsets unchanged. Plus crash
safety (a failure at every rename of the swap, leftover files), reads during a swap,
followers copying a gapped log, and the configs. Time is a fake clock.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from brokers.log import LogConfig, PartitionLog
from brokers.log.cleaner import LogCleaner
from brokers.log.config import CleanupPolicy
from brokers.log.partition_log import COMPACTED_BELOW_FILE
from wire.errors import CorruptRecordError, InvalidConfigError, LogStorageError
from wire.record_batch import (
    TimestampType,
    batches_to_table,
    build_batch,
    iter_batches,
    peek_header,
)

pytestmark = pytest.mark.unit

Record = tuple[int, bytes | None, bytes | None, int]  # offset, key, value, timestamp


class FakeClock:
    def __init__(self, now: int = 10_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _config(**kw: object) -> LogConfig:
    values: dict[str, str | int] = {"cleanup.policy": "compact", "segment.bytes": 2048,
                                    "index.interval.bytes": 300, "delete.retention.ms": 1000}
    values.update({k.replace("_", "."): str(v) for k, v in kw.items()})
    return LogConfig.from_mapping(values)


def _append(log: PartitionLog, model: list[Record], rows: list[tuple[bytes, bytes | None]],
            clock: FakeClock, *, epoch: int = 0, producer: tuple[int, int] | None = None,
            compression: str = "none", codecs: dict[int, str] | None = None) -> None:
    keys = [k for k, _ in rows]
    values = [v for _, v in rows]
    stamps = [clock.now] * len(rows)
    pid, seq = producer if producer else (-1, -1)
    info = log.append(build_batch(values, keys=keys, timestamps=stamps, producer_id=pid,
                                  producer_epoch=0 if producer else -1, base_sequence=seq,
                                  compression=compression),
                      leader_epoch=epoch)
    for i, (k, v) in enumerate(rows):
        model.append((info.first_offset + i, k, v, clock.now))
        if codecs is not None:
            codecs[info.first_offset + i] = compression


def _read(log: PartitionLog, upper: int | None = None) -> list[Record]:
    chunks: list[bytes] = []
    offset = log.log_start_offset
    while True:
        found = log.read(offset, 1 << 20, upper_offset=upper)
        if found is None:
            break
        chunks.append(found.read_bytes())
        assert found.next_offset > offset
        offset = found.next_offset
    table = batches_to_table(b"".join(chunks), topic="t", partition=0,
                             start_offset=log.log_start_offset)
    rows = zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
               table.column("value").to_pylist(), table.column("timestamp").to_pylist(),
               strict=True)
    return [(o, k, v, t) for o, k, v, t in rows]


def _expected(model: list[Record], end: int, horizon: int) -> list[Record]:
    """The model of a cleaned log: below ``end`` the latest record per key (tombstones
    older than ``horizon`` dropped, the range's last record always kept)."""
    below = [r for r in model if r[0] < end]
    latest = {k: o for o, k, _, _ in below if k is not None}
    last = below[-1][0] if below else -1
    kept = [r for r in below if r[0] == last or (
        r[1] is not None and latest[r[1]] == r[0] and not (r[2] is None and r[3] < horizon))]
    return kept + [r for r in model if r[0] >= end]


def _random_workload(log: PartitionLog, clock: FakeClock, rng: random.Random, batches: int,
                     keys: int = 12, codecs: dict[int, str] | None = None) -> list[Record]:
    model: list[Record] = []
    for _ in range(batches):
        rows = []
        for _ in range(rng.randint(1, 6)):
            key = f"k{rng.randrange(keys)}".encode()
            value = None if rng.random() < 0.15 else f"v{rng.random():.6f}".encode() * 3
            rows.append((key, value))
        _append(log, model, rows, clock, compression=rng.choice(["none", "lz4", "zstd"]),
                codecs=codecs)
        clock.now += rng.randint(0, 400)
    return model


def _active_bytes(log: PartitionLog) -> bytes:
    return log.active_segment.log_path.read_bytes()


@pytest.mark.parametrize("seed", range(6))
def test_model_check_latest_per_key_offsets_kept(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    cleaner = LogCleaner(clock=clock)
    model: list[Record] = []
    codecs: dict[int, str] = {}
    for _ in range(3):  # several passes, the workload going on in between
        model += _random_workload(log, clock, rng, rng.randint(20, 60), codecs=codecs)
        assert len(log.segments) > 2
        active_before = _active_bytes(log)
        end = log.cleanable_segments(log.log_end_offset)[-1].next_offset
        stats = cleaner.clean(log, log.log_end_offset)
        assert stats is not None and stats.cleaned_up_to == end
        horizon = clock.now - 1000
        assert _read(log) == _expected(model, end, horizon)
        assert _active_bytes(log) == active_before
        model = _expected(model, end, horizon)
        # Every batch keeps its input's codec (the runs of a split batch included).
        for segment in log.segments:
            for _, b in iter_batches(segment.log_path.read_bytes()):
                header = peek_header(b)
                assert header.compression.name.lower() == codecs[header.base_offset]
        assert cleaner.clean(log, log.log_end_offset) is None  # nothing new: no pass
    # Every batch of the cleaned log still passes validation, and a reopen (clean
    # shutdown, then a crash) serves the same records.
    log.verify()
    log.close()
    reopened = PartitionLog(tmp_path, _config(), clock=clock)
    assert _read(reopened) == model
    reopened.flush()
    crashed = PartitionLog(tmp_path, _config(), clock=clock)  # no close: a crash
    assert not crashed.opened_cleanly
    assert _read(crashed) == model


def test_tombstones_dropped_only_after_delete_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    cleaner = LogCleaner(clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"1"), (b"b", b"1")], clock)
    _append(log, model, [(b"a", None)], clock)  # tombstone for a
    _append(log, model, [(b"c", b"1")], clock)
    log.roll()
    _append(log, model, [(b"d", b"1")], clock)  # active segment
    clock.now += 999
    cleaner.clean(log, log.log_end_offset)
    assert [(o, k, v) for o, k, v, _ in _read(log)] == \
        [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1"), (4, b"d", b"1")]
    assert cleaner.needs_cleaning(log, log.log_end_offset) is False
    clock.now += 2  # the tombstone is now older than delete.retention.ms
    assert cleaner.needs_cleaning(log, log.log_end_offset) is True
    stats = cleaner.clean(log, log.log_end_offset)
    assert stats is not None and stats.tombstones_removed == 1
    assert [o for o, *_ in _read(log)] == [1, 3, 4]


def test_a_tombstone_exactly_delete_retention_old_starts_no_pass(tmp_path: Path) -> None:
    """A pass drops only tombstones older than delete.retention.ms, so one exactly that
    old starts no pass (seed 99 of the model check found a pass that removed nothing)."""
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    cleaner = LogCleaner(clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"1")], clock)
    _append(log, model, [(b"a", None)], clock)  # a tombstone, stamped clock.now
    _append(log, model, [(b"b", b"1")], clock)
    log.roll()
    _append(log, model, [(b"c", b"1")], clock)  # active segment
    clock.now += 1000  # exactly delete.retention.ms old: kept, not yet expired
    stats = cleaner.clean(log, log.log_end_offset)
    assert stats is not None and stats.tombstones_removed == 0
    assert [(o, k, v) for o, k, v, _ in _read(log)] == \
        [(1, b"a", None), (2, b"b", b"1"), (3, b"c", b"1")]
    # Nothing new and no kept tombstone expired yet: no pass is due.
    assert cleaner.needs_cleaning(log, log.log_end_offset) is False
    clock.now += 1
    assert cleaner.needs_cleaning(log, log.log_end_offset) is True
    stats = cleaner.clean(log, log.log_end_offset)
    assert stats is not None and stats.tombstones_removed == 1


def test_last_record_of_the_range_is_kept_so_no_gap_ends_the_log(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"1"), (b"a", None)], clock)
    log.roll()
    clock.now += 10_000
    LogCleaner(clock=clock).clean(log, log.log_end_offset)
    assert [o for o, *_ in _read(log)] == [1]  # an expired tombstone, but the last record
    assert log.read(0, 100) is not None and log.read(0, 100).first_offset == 1  # type: ignore[union-attr]


def test_only_segments_below_the_upper_offset_and_never_the_active_one(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    for i in range(3):
        _append(log, model, [(b"k", b"%d" % i)], clock)
        log.roll()
    _append(log, model, [(b"k", b"active")], clock)
    closed = log.closed_segments()
    before = [s.log_path.read_bytes() for s in log.segments]
    stats = LogCleaner(clock=clock).clean(log, closed[1].next_offset)  # an HW inside
    assert stats is not None and stats.cleaned_up_to == 2
    after = [s.log_path.read_bytes() for s in log.segments]
    assert after[2:] == before[2:]  # the segment above the bound and the active one
    assert [(o, v) for o, _, v, _ in _read(log)] == [(1, b"1"), (2, b"2"), (3, b"active")]
    assert LogCleaner(clock=clock).clean(log, 0) is None


def test_an_emptied_segment_other_than_the_first_is_removed(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    for value in (b"1", b"2", b"3"):
        _append(log, model, [(b"a", value)], clock)  # one segment each: a, a, a
        log.roll()
    _append(log, model, [(b"b", b"1")], clock)
    log.roll()
    _append(log, model, [(b"c", b"active")], clock)
    before = log.segments
    stats = LogCleaner(clock=clock).clean(log, log.log_end_offset)
    assert stats is not None and stats.segments_rewritten == 2 and stats.bytes_after == 0
    # The first segment stays (empty: the log start must not move), the second goes.
    assert [s.base_offset for s in log.segments] == [0, 2, 3, 4]
    assert log.segments[0].size == 0 and log.log_start_offset == 0
    assert sorted(p.name for p in tmp_path.glob("00000000000000000001.*")) == []
    assert [(o, v) for o, _, v, _ in _read(log)] == [(2, b"3"), (3, b"1"), (4, b"active")]
    assert log.read(1, 100).first_offset == 2  # type: ignore[union-attr]
    found = before[1].read(1, 100)  # a reader that still holds the removed segment
    assert found is not None and found.first_offset == 1
    # A crash after the .log was deleted but before its indexes: they are orphans.
    log.flush()
    for suffix in (".index", ".timeindex"):
        (tmp_path / f"00000000000000000001{suffix}").write_bytes(b"")
    crashed = PartitionLog(tmp_path, _config(), clock=clock)
    assert [(o, v) for o, _, v, _ in _read(crashed)] == [(2, b"3"), (3, b"1"), (4, b"active")]
    assert not list(tmp_path.glob("00000000000000000001.*"))
    crashed.close()
    reopened = PartitionLog(tmp_path, _config(), clock=clock)
    assert [s.base_offset for s in reopened.segments] == [0, 2, 3, 4]
    assert reopened.segments[0].next_offset == 2  # covers the removed one's offsets


def test_batch_fields_survive_the_rewrite(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(**{"message_timestamp_type": "LogAppendTime"}),
                       clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", b"2")],
            clock, epoch=7, producer=(42, 10))
    log.roll()
    _append(log, model, [(b"z", b"1")], clock, epoch=8)
    epochs = log.leader_epochs
    LogCleaner(clock=clock).clean(log, log.log_end_offset)
    batches = [peek_header(b) for _, b in iter_batches(log.segments[0].log_path.read_bytes())]
    # Survivors: offsets 2, 3, 4 (one run of the one input batch).
    assert [(h.base_offset, h.record_count, h.base_sequence) for h in batches] == [(2, 3, 12)]
    h = batches[0]
    assert (h.leader_epoch, h.producer_id, h.producer_epoch) == (7, 42, 0)
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.max_timestamp == clock.now
    assert log.leader_epochs == epochs


def test_runs_of_one_batch_become_batches_at_their_own_offsets(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", b"2"), (b"c", b"1"),
                         (b"c", b"2")], clock, producer=(5, 0))
    log.roll()
    LogCleaner(clock=clock).clean(log, log.log_end_offset)
    headers = [peek_header(b) for _, b in iter_batches(log.segments[0].log_path.read_bytes())]
    assert [(h.base_offset, h.record_count, h.base_sequence) for h in headers] == \
        [(2, 2, 2), (5, 1, 5)]
    # A fetch inside a gap returns the next batch.
    assert log.read(0, 100).first_offset == 2  # type: ignore[union-attr]
    assert log.read(4, 100).first_offset == 5  # type: ignore[union-attr]


def test_fetch_during_and_after_a_swap_reads_valid_data(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    for i in range(30):
        _append(log, model, [(b"k%d" % (i % 3), b"v%d" % i * 20)], clock)
    log.roll()
    held = log.read(0, 1 << 20)  # a slice handed out before the swap (sendfile pending)
    old_segments = log.segments
    assert held is not None
    old_bytes = held.read_bytes()
    LogCleaner(clock=clock).clean(log, log.log_end_offset)
    assert held.read_bytes() == old_bytes  # the old file is still open, not reused
    assert peek_header(old_bytes).base_offset == 0  # the record the cleaner dropped
    # A reader that snapshotted the segment list before the swap reads the old file.
    found = old_segments[0].read(0, 1 << 20)
    assert found is not None and found.first_offset == 0
    assert [o for o, *_ in _read(log)] == [o for o, *_ in _expected(model, 30, 0)]


def test_appends_and_reads_go_on_while_a_pass_rewrites(tmp_path: Path) -> None:
    import threading

    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(flush_policy="always"), clock=clock)
    model = _random_workload(log, clock, random.Random(5), 30, keys=4)
    rewriting, release = threading.Event(), threading.Event()

    class Paused(LogCleaner):
        def _write_cleaned(self, *args: object, **kwargs: object) -> None:
            super()._write_cleaned(*args, **kwargs)  # type: ignore[arg-type]
            rewriting.set()
            assert release.wait(30)

    cleaner = threading.Thread(target=Paused(clock=clock).clean,
                               args=(log, log.log_end_offset))
    cleaner.start()
    try:
        assert rewriting.wait(30)
        # The pass holds no lock while it scans and writes: appends (with their fsync)
        # and reads complete while it is parked between a rewrite and its swap.
        for i in range(5):
            _append(log, model, [(b"new", b"%d" % i)], clock)
        assert _read(log) == model
    finally:
        release.set()
        cleaner.join(30)
    assert not cleaner.is_alive()
    assert [r[2] for r in _read(log)][-5:] == [b"%d" % i for i in range(5)]


def test_a_topic_deleted_under_a_pass_ends_it_quietly(tmp_path: Path) -> None:
    import shutil

    clock = FakeClock()
    log = PartitionLog(tmp_path / "t-0", _config(), clock=clock)
    _random_workload(log, clock, random.Random(9), 20, keys=3)

    class Deleting(LogCleaner):
        def _write_cleaned(self, *args: object, **kwargs: object) -> None:
            log.close()  # what Partition.delete does: close, then remove the directory
            shutil.rmtree(log.directory)
            super()._write_cleaned(*args, **kwargs)  # type: ignore[arg-type]

    assert Deleting(clock=clock).clean(log, log.log_end_offset) is None
    assert LogCleaner(clock=clock).needs_cleaning(log, 10**9) is False


def test_follower_copies_a_gapped_log_and_reopens_it(tmp_path: Path) -> None:
    clock = FakeClock()
    rng = random.Random(7)
    leader = PartitionLog(tmp_path / "leader", _config(), clock=clock)
    model = _random_workload(leader, clock, rng, 40)
    LogCleaner(clock=clock).clean(leader, leader.log_end_offset)
    expected = _read(leader)
    follower = PartitionLog(tmp_path / "follower", _config(), clock=clock)
    offset = 0
    while offset < leader.log_end_offset:
        found = leader.read(offset, 700)
        assert found is not None
        for _, batch in iter_batches(found.read_bytes()):
            follower.append_as_follower(batch)
        offset = follower.log_end_offset
    assert follower.log_end_offset == leader.log_end_offset
    assert _read(follower) == expected
    assert follower.compacted_below > 0
    follower.flush()
    crashed = PartitionLog(tmp_path / "follower", _config(), clock=clock)  # no close
    assert _read(crashed) == expected
    # Its first epoch starts at its first batch, after the leading gap: that is
    # consistent, not a reason to rebuild the checkpoint.
    assert not crashed.epoch_cache_rebuilt
    assert crashed.leader_epochs[0].start_offset == expected[0][0] > 0
    crashed.close()
    assert _read(PartitionLog(tmp_path / "follower", _config(), clock=clock)) == expected
    assert len(model) > len(expected)


def test_an_unflushed_gapped_follower_append_is_cut_as_a_torn_tail(tmp_path: Path) -> None:
    clock = FakeClock()
    leader = PartitionLog(tmp_path / "leader", _config(), clock=clock)
    model: list[Record] = []
    _append(leader, model, [(b"a", b"1"), (b"a", b"2")], clock)
    _append(leader, model, [(b"b", b"1")], clock)
    leader.roll()
    LogCleaner(clock=clock).clean(leader, leader.log_end_offset)
    follower = PartitionLog(tmp_path / "follower", _config(), clock=clock)
    while follower.log_end_offset < leader.log_end_offset:
        found = leader.read(follower.log_end_offset, 1 << 20)
        assert found is not None
        for _, batch in iter_batches(found.read_bytes()):
            follower.append_as_follower(batch)
    assert follower.log_end_offset == 3
    # A crash before any flush: compacted-below was never written, the gap looks torn.
    reopened = PartitionLog(tmp_path / "follower", _config(), clock=clock)
    assert reopened.log_end_offset == 0 and reopened.recovered_bytes_truncated > 0


def test_gaps_in_a_log_that_was_never_compacted_are_still_corruption(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, _config())
    log.append_as_follower(build_batch([b"x"], keys=[b"k"], base_offset=0))
    log.append_as_follower(build_batch([b"x"], keys=[b"k"], base_offset=5))  # a leader's gap
    assert log.compacted_below == 5
    log.close()
    PartitionLog(tmp_path, _config()).close()  # the checkpoint explains the gap
    # Damage: the compacted-below checkpoint is lost, so the gap is no longer explained.
    (tmp_path / COMPACTED_BELOW_FILE).unlink()
    with pytest.raises(CorruptRecordError, match="offset gap"):
        PartitionLog(tmp_path, _config())


def test_idempotent_producer_state_and_leader_epochs_survive_compaction(
        tmp_path: Path) -> None:
    from brokers.partition import Partition

    partition = Partition("t", 0, "topic-id", tmp_path, _config(), 0)
    partition.set_state(0, 1, [0], [0])
    sent = []
    for seq in range(0, 30, 3):
        batch = build_batch([b"v%d" % seq] * 3, keys=[b"k1", b"k2", b"k1"], producer_id=7,
                            producer_epoch=0, base_sequence=seq)
        assert not partition.append_as_leader(batch).duplicate
        sent.append(batch)
        partition.log.roll()
    partition.producers.write_snapshot(partition.log.log_end_offset)  # as the broker does
    stats = LogCleaner().clean(partition.log, partition.log.log_end_offset)
    assert stats is not None and stats.records_removed == 28
    epochs = partition.log.leader_epochs
    partition.close()
    reopened = Partition("t", 0, "topic-id", tmp_path, _config(), 0)
    reopened.set_state(0, 2, [0], [0])
    assert reopened.log.leader_epochs[: len(epochs)] == epochs
    retry = reopened.append_as_leader(sent[-1])  # a retry after a lost response
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (27, 29)
    following = build_batch([b"x"], keys=[b"k3"], producer_id=7, producer_epoch=0,
                            base_sequence=30)
    assert reopened.append_as_leader(following).first_offset == 30
    reopened.close()


def test_a_truncation_during_a_pass_cancels_its_swaps(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    for i in range(6):
        _append(log, model, [(b"k", b"%d" % i)], clock)
    log.roll()
    _append(log, model, [(b"k", b"active")], clock)
    before = _read(log)

    class Truncating(LogCleaner):
        def _write_cleaned(self, *args: object, **kwargs: object) -> object:
            written = super()._write_cleaned(*args, **kwargs)  # type: ignore[arg-type]
            if log.log_end_offset == 7:
                log.truncate_to(6)  # e.g. a follower's divergent tail
            return written

    Truncating(clock=clock).clean(log, log.log_end_offset - 1)
    assert _read(log) == before[:-1]
    assert not list(tmp_path.glob("*.cleaned"))


def test_an_emptied_segment_keeps_the_age_of_its_records(tmp_path: Path) -> None:
    clock = FakeClock()
    config = _config(cleanup_policy="compact,delete", retention_ms=60_000)
    log = PartitionLog(tmp_path, config, clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"old")], clock)
    log.roll()
    clock.now += 1000
    _append(log, model, [(b"a", b"new")], clock)
    log.roll()
    _append(log, model, [(b"b", b"active")], clock)
    LogCleaner(clock=clock).clean(log, log.log_end_offset)
    emptied = log.segments[0]
    assert emptied.size == 0
    assert emptied.log_path.stat().st_mtime_ns // 1_000_000 == clock.now - 1000
    clock.now += 59_500  # the emptied segment is past retention.ms, the next one is not
    assert log.apply_retention() == [0]
    assert [v for _, _, v, _ in _read(log)] == [b"new", b"active"]


def test_a_new_follower_partition_catches_up_on_a_compacted_leader(tmp_path: Path) -> None:
    from brokers.partition import Partition

    leader = Partition("t", 0, "topic-id", tmp_path / "leader", _config(), 0)
    leader.set_state(0, 1, [0], [0, 1])
    for i in range(40):
        leader.append_as_leader(build_batch([b"v%d" % i] * 2, keys=[b"a%d" % (i % 4), b"b"]))
    leader.log.roll()
    leader.append_as_leader(build_batch([b"tail"], keys=[b"z"]))
    LogCleaner().clean(leader.log, leader.log.log_end_offset)
    follower = Partition("t", 0, "topic-id", tmp_path / "follower", _config(), 1)
    follower.set_state(0, 1, [0], [0, 1])
    while follower.log.log_end_offset < leader.log.log_end_offset:  # the replica fetcher
        found = leader.read(follower.log.log_end_offset, 1500, for_follower=True)
        assert found is not None
        follower.append_as_follower(found.read_bytes(), leader.log.log_end_offset)
    assert _read(follower.log) == _read(leader.log)
    assert follower.high_watermark == leader.log.log_end_offset
    assert [o for o, *_ in _read(follower.log)] == [72, 74, 76, 78, 79, 80]


def test_an_undecodable_batch_fails_the_pass_naming_the_segment(tmp_path: Path) -> None:
    import struct

    from wire.record_batch import HEADER, HEADER_SIZE, crc_of

    log = PartitionLog(tmp_path, _config())
    log.append(build_batch([b"v"], keys=[b"k"]))
    junk = bytearray(build_batch([b"v"], keys=[b"k"])[:HEADER_SIZE] + b"not arrow" * 10)
    fields = list(HEADER.unpack_from(junk, 0))
    fields[1] = len(junk) - 12  # batch_length
    HEADER.pack_into(junk, 0, *fields)
    struct.pack_into(">I", junk, 17, crc_of(junk))
    log.append(bytes(junk))  # written before the topic was compacted: never decoded
    log.roll()
    before = _active_bytes(log), log.segments[0].log_path.read_bytes()
    with pytest.raises(CorruptRecordError, match="cannot decode") as caught:
        LogCleaner().clean(log, log.log_end_offset)
    assert caught.value.segment == str(log.segments[0].log_path)
    assert (_active_bytes(log), log.segments[0].log_path.read_bytes()) == before


def test_truncating_into_a_gap_ends_the_log_before_it(tmp_path: Path) -> None:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(segment_bytes=1 << 20), clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", b"1"), (b"b", b"1")], clock)
    _append(log, model, [(b"a", b"2"), (b"c", b"1"), (b"c", b"2")], clock)
    _append(log, model, [(b"b", b"2")], clock)
    log.roll()
    _append(log, model, [(b"d", b"1")], clock)
    LogCleaner(clock=clock).clean(log, log.log_end_offset)
    assert [o for o, *_ in _read(log)] == [2, 4, 5, 6]  # gaps at 0-1 and 3
    log.flush()
    assert log.truncate_to(3) == 3  # offset 3 is in a gap: the log ends after offset 2
    assert [o for o, *_ in _read(log)] == [2]
    assert log.recovery_point <= log.log_end_offset
    crashed = PartitionLog(tmp_path, _config(segment_bytes=1 << 20), clock=clock)
    assert [o for o, *_ in _read(crashed)] == [2]
    assert crashed.truncate_to(1) == 0  # inside the leading gap: nothing is left
    assert crashed.log_end_offset == 0


def test_keyless_records_are_refused_by_produce_and_by_sink_staging(tmp_path: Path) -> None:
    from brokers.partition import Partition
    from wire.errors import InvalidRecordBatchError

    partition = Partition("t", 0, "topic-id", tmp_path, _config(), 0)
    partition.set_state(0, 1, [0], [0])
    keyless = build_batch([b"a", b"b"], keys=[b"k", None])
    with pytest.raises(InvalidRecordBatchError, match=r"record 1 of the batch \(1 of 2\)"):
        partition.append_as_leader(keyless)
    with pytest.raises(InvalidRecordBatchError, match="has no key"):
        partition.stage("stage-1", 0, keyless)
    assert partition.log.log_end_offset == 0
    partition.set_config(LogConfig())  # cleanup.policy=delete: keys are optional
    assert partition.append_as_leader(keyless).first_offset == 0
    partition.close()


def test_a_covering_segment_left_last_by_a_truncation_ends_at_its_last_batch(
        tmp_path: Path) -> None:
    # Found by the state machine: the first segment, emptied, covered offset 0 up to the
    # next segment; a truncation removed every later segment, and the log end must then
    # be where the data ends (0), as a reopen after a crash finds, not the old cover.
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model: list[Record] = []
    _append(log, model, [(b"a", None)], clock)
    _append(log, model, [(b"a", None), (b"d", None)], clock)
    _append(log, model, [(b"d", None)], clock)
    _append(log, model, [(b"a", b"z" * 300)], clock)
    LogCleaner(clock=clock).clean(log, 4)
    assert [o for o, *_ in _read(log)] == [1, 3, 4]
    assert log.truncate_to(1) == 0
    assert _read(log) == [] and log.recovery_point <= log.log_end_offset
    log.flush()
    crashed = PartitionLog(tmp_path, _config(), clock=clock)  # no close
    assert crashed.log_end_offset == 0 and _read(crashed) == []
    crashed.append(build_batch([b"v"], keys=[b"k"]))
    crashed.close()
    assert [o for o, *_ in _read(PartitionLog(tmp_path, _config(), clock=clock))] == [0]


# ----------------------------------------------------------------------- crash safety

def _prepared(tmp_path: Path) -> tuple[PartitionLog, FakeClock, list[Record], list[Record]]:
    clock = FakeClock()
    log = PartitionLog(tmp_path, _config(), clock=clock)
    model = _random_workload(log, clock, random.Random(3), 40, keys=5)
    end = log.cleanable_segments(log.log_end_offset)[-1].next_offset
    log.flush()
    return log, clock, model, _expected(model, end, clock.now - 1000)


@pytest.mark.parametrize("fail_at", range(9))
def test_a_crash_at_any_rename_leaves_the_old_or_the_new_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    log, clock, model, cleaned = _prepared(tmp_path)
    real_replace = os.replace
    calls = [0]

    def replace(src: str | Path, dst: str | Path) -> None:
        if calls[0] == fail_at:
            raise OSError(5, "simulated crash")
        calls[0] += 1
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    try:
        LogCleaner(clock=clock).clean(log, log.log_end_offset)
        crashed = False
    except LogStorageError:
        crashed = True
    monkeypatch.setattr(os, "replace", real_replace)
    reopened = PartitionLog(tmp_path, _config(), clock=clock)  # no close: a crash
    records = _read(reopened)
    assert records in (model, cleaned) or _is_partial(records, model, cleaned)
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    if not crashed:
        assert records == cleaned
    # Cleaning again after the crash finishes the job.
    LogCleaner(clock=clock).clean(reopened, reopened.log_end_offset)
    assert _read(reopened) == cleaned


def _is_partial(records: list[Record], model: list[Record], cleaned: list[Record]) -> bool:
    """Some segments swapped, the rest not: every record is from the model, every record
    of the cleaned model is there, offsets increase."""
    offsets = [r[0] for r in records]
    return (offsets == sorted(set(offsets)) and set(records) <= set(model)
            and set(cleaned) <= set(records))


def test_leftover_and_truncated_cleaner_files_are_discarded_on_open(tmp_path: Path) -> None:
    log, clock, model, _ = _prepared(tmp_path)
    first = log.segments[0]
    log.close()
    name = first.log_path.name
    (tmp_path / f"{name}.cleaned").write_bytes(first.log_path.read_bytes()[:100])  # torn
    (tmp_path / f"{name.replace('.log', '.index')}.swap").write_bytes(b"\0" * 8)  # uncommitted
    reopened = PartitionLog(tmp_path, _config(), clock=clock)
    assert _read(reopened) == model
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))


def test_a_committed_swap_is_completed_on_open(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, model, cleaned = _prepared(tmp_path)
    from brokers.log import partition_log as module

    monkeypatch.setattr(module, "_complete_swap", _explode)
    with pytest.raises(LogStorageError):
        LogCleaner(clock=clock).clean(log, log.log_end_offset)
    assert list(tmp_path.glob("*.log.swap"))
    monkeypatch.undo()
    reopened = PartitionLog(tmp_path, _config(), clock=clock)
    records = _read(reopened)
    assert records != model and _is_partial(records, model, cleaned)
    assert not list(tmp_path.glob("*.swap"))


def _explode(directory: Path, base_offset: int) -> None:
    raise OSError(28, "no space left (simulated)")


# ----------------------------------------------------------------------- configuration

def test_compact_configs() -> None:
    assert LogConfig.from_mapping({"cleanup.policy": "compact"}).cleanup_policy \
        is CleanupPolicy.COMPACT
    both = LogConfig.from_mapping({"cleanup.policy": "delete,compact"})
    assert both.cleanup_policy is CleanupPolicy.COMPACT_DELETE
    assert both.to_mapping()["cleanup.policy"] == "compact,delete"
    assert both.cleanup_policy.compacts and both.cleanup_policy.deletes
    tiered = LogConfig.from_mapping({"cleanup.policy": "compact", "tier.enable": "true"})
    assert tiered.cleanup_policy.compacts
    with pytest.raises(InvalidConfigError, match="compact,delete is not supported"):
        LogConfig.from_mapping({"cleanup.policy": "compact,delete", "tier.enable": "true"})


def test_compact_topics_are_not_trimmed_by_time_but_compact_delete_ones_are(
        tmp_path: Path) -> None:
    clock = FakeClock()
    made: dict[str, PartitionLog] = {}
    for policy in ("compact", "compact,delete"):
        log = PartitionLog(tmp_path / policy, LogConfig.from_mapping(
            {"cleanup.policy": policy, "retention.ms": "1000"}), clock=clock)
        log.append(build_batch([b"v"], keys=[b"k"], timestamps=[clock.now]))
        log.roll()
        made[policy] = log
    clock.now += 5000
    assert made["compact"].apply_retention() == []
    assert made["compact,delete"].apply_retention() == [0]


def test_delete_policy_logs_are_never_cleaned(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, LogConfig())
    log.append(build_batch([b"a", b"b"], keys=[b"k", b"k"]))
    log.roll()
    assert LogCleaner().clean(log, log.log_end_offset) is None



# ----------------------------------------------------------------------- state machine

class CompactedLogMachine(RuleBasedStateMachine):
    """Appends, rolls, cleaner passes at random bounds, tail truncations (a follower's
    divergent tail, into gaps too), delete-records, time retention, clean and unclean
    reopens, a follower copy and time moving on: reading the log always gives the
    model, which applies each pass the way ``_expected`` says."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="compaction-"))
        self.clock = FakeClock()
        # compact,delete: retention (by time) runs between passes too.
        self.config = _config(cleanup_policy="compact,delete", retention_ms=3000)
        self.log = PartitionLog(self.directory, self.config, clock=self.clock)
        self.cleaner = LogCleaner(clock=self.clock)
        self.model: list[Record] = []

    @rule(rows=st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
                                  st.sampled_from([None, b"x", b"y" * 60, b"z" * 300])),
                        min_size=1, max_size=6))
    def append(self, rows: list[tuple[bytes, bytes | None]]) -> None:
        _append(self.log, self.model, rows, self.clock)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(ms=st.sampled_from([0, 400, 1001]))
    def time_passes(self, ms: int) -> None:
        self.clock.now += ms

    @rule(data=st.data())
    def clean(self, data: st.DataObject) -> None:
        upper = data.draw(st.integers(0, self.log.log_end_offset), label="upper")
        segments = self.log.cleanable_segments(upper)
        stats = self.cleaner.clean(self.log, upper, force=True)
        if not segments:
            assert stats is None
            return
        end = segments[-1].next_offset
        assert stats is not None and stats.cleaned_up_to == end
        self.model = _expected(self.model, end, self.clock.now - self.config.delete_retention_ms)

    @rule(data=st.data())
    def truncate_tail(self, data: st.DataObject) -> None:
        if not self.model:
            return
        offset = data.draw(st.integers(self.model[0][0], self.log.log_end_offset), label="to")
        end = self.log.truncate_to(offset)
        assert end <= max(offset, self.model[0][0])
        # (A batch straddling the log start goes whole: the log may restart empty.)
        self.model = [r for r in self.model if self.log.log_start_offset <= r[0] < end]
        assert all(r[0] < end for r in _read(self.log))

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(self.log.log_start_offset, self.log.log_end_offset),
                          label="start")
        self.log.delete_records(start)
        self.model = [r for r in self.model if r[0] >= start]

    @rule()
    def retention(self) -> None:
        self.log.apply_retention()
        self.model = [r for r in self.model if r[0] >= self.log.log_start_offset]

    @rule()
    def reopen_clean(self) -> None:
        self.log.close()
        self.log = PartitionLog(self.directory, self.config, clock=self.clock)
        assert self.log.opened_cleanly

    @rule()
    def reopen_after_a_crash(self) -> None:
        self.log.flush()
        self.log = PartitionLog(self.directory, self.config, clock=self.clock)  # no close

    @rule()
    def a_new_follower_copies_it(self) -> None:
        follower = PartitionLog(self.directory / "follower", self.config, clock=self.clock)
        try:
            start = self.log.log_start_offset
            first = self.log.read(start, 1)
            if first is not None and first.first_offset < start:
                return  # a log start inside a batch: replication's case, not compaction's
            if start:
                follower.restart_at(start)
            while follower.log_end_offset < self.log.log_end_offset:
                found = self.log.read(follower.log_end_offset, 2000)
                assert found is not None
                for _, batch in iter_batches(found.read_bytes()):
                    follower.append_as_follower(batch)
            assert _read(follower) == _read(self.log)
            # The follower compacts its own copy and survives a crash after a flush.
            segments = follower.cleanable_segments(follower.log_end_offset)
            expected = self.model
            if segments and LogCleaner(clock=self.clock).clean(
                    follower, follower.log_end_offset) is not None:
                expected = _expected(self.model, segments[-1].next_offset,
                                     self.clock.now - self.config.delete_retention_ms)
            follower.flush()
            crashed = PartitionLog(follower.directory, self.config, clock=self.clock)
            assert _read(crashed) == expected
            crashed.close()
        finally:
            follower.close()
            shutil.rmtree(self.directory / "follower")

    @invariant()
    def reads_give_the_model(self) -> None:
        assert _read(self.log) == self.model

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


CompactedLogMachine.TestCase.settings = settings(
    max_examples=15, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCompactedLogModel = CompactedLogMachine.TestCase
