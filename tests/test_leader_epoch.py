"""The leader-epoch cache: ``LeaderEpochCache`` alone, and wired into ``PartitionLog``.

Unit tests pin down Kafka's ``endOffsetFor`` semantics, the truncations, the checkpoint
file and its recovery; a seeded random test drives a log through appends with increasing
epochs, truncations, delete-records and reopens, and checks the cache against a model
derived from the batches that are left.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from brokers.log import LogConfig, PartitionLog
from brokers.log.leader_epoch import LEADER_EPOCH_FILE, EpochEntry, LeaderEpochCache
from wire.record_batch import build_batch, set_base_offset

pytestmark = pytest.mark.unit


def cache_at(tmp_path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path / LEADER_EPOCH_FILE)
    for epoch, start in entries:
        assert cache.assign(epoch, start)
    return cache


def follower_batch(base_offset: int, epoch: int, count: int = 1) -> bytes:
    data = bytearray(build_batch([b"v"] * count))
    set_base_offset(data, base_offset, epoch)
    return bytes(data)


# --------------------------------------------------------------------------- the cache


def test_assign_ignores_non_increasing_epochs_and_replaces_later_starts(
        tmp_path: Path) -> None:
    cache = cache_at(tmp_path, (0, 0), (2, 10))
    assert not cache.assign(2, 20)  # same epoch
    assert not cache.assign(1, 30)  # older epoch
    assert not cache.assign(-1, 40)
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(2, 10))
    assert cache.assign(5, 10)  # same start: replaces epoch 2
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(5, 10))
    assert cache.assign(6, 5)  # earlier start: replaces epoch 5 too
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(6, 5))
    assert cache.latest_epoch == 6


def test_end_offset_for_follows_kafka(tmp_path: Path) -> None:
    assert cache_at(tmp_path).end_offset_for(0, 100) == (-1, -1)  # nothing known
    cache = cache_at(tmp_path, (2, 0), (4, 10), (7, 25))
    assert cache.end_offset_for(7, 40) == (7, 40)  # latest: the log end
    assert cache.end_offset_for(4, 40) == (4, 25)  # next epoch's start
    assert cache.end_offset_for(2, 40) == (2, 10)
    assert cache.end_offset_for(5, 40) == (4, 25)  # unknown: the largest epoch below
    assert cache.end_offset_for(6, 40) == (4, 25)
    assert cache.end_offset_for(1, 40) == (1, 0)  # older than all: first start
    assert cache.end_offset_for(8, 40) == (-1, -1)  # newer than any
    assert cache.end_offset_for(-1, 40) == (-1, -1)


def test_truncate_from_end_drops_entries_at_or_after_the_new_end(tmp_path: Path) -> None:
    cache = cache_at(tmp_path, (0, 0), (1, 10), (2, 20))
    cache.truncate_from_end(30)
    assert [e.epoch for e in cache.entries] == [0, 1, 2]
    cache.truncate_from_end(20)
    assert cache.entries == (EpochEntry(0, 0), EpochEntry(1, 10))
    cache.truncate_from_end(5)
    assert cache.entries == (EpochEntry(0, 0),)
    cache.truncate_from_end(0)
    assert cache.entries == ()
    assert LeaderEpochCache.read(cache.path) == []


def test_truncate_from_start_keeps_the_covering_entry(tmp_path: Path) -> None:
    cache = cache_at(tmp_path, (0, 0), (1, 10), (2, 20))
    cache.truncate_from_start(0)
    assert len(cache.entries) == 3
    cache.truncate_from_start(15)
    assert cache.entries == (EpochEntry(1, 15), EpochEntry(2, 20))
    cache.truncate_from_start(20)
    assert cache.entries == (EpochEntry(2, 20),)
    cache.truncate_from_start(50)
    assert cache.entries == (EpochEntry(2, 50),)
    assert LeaderEpochCache.read(cache.path) == [EpochEntry(2, 50)]


def test_new_epochs_are_written_at_sync_not_at_assign(tmp_path: Path) -> None:
    """A new epoch costs no file until the log syncs (before a recovery point, at
    close): becoming leader of, or taking the first record of, ten thousand partitions
    must not create ten thousand files."""
    cache = cache_at(tmp_path, (0, 0))
    assert not cache.path.exists() and cache.unwritten
    cache.sync()
    assert cache.path.read_text() == "0\n1\n0 0\n" and not cache.unwritten
    assert cache.assign(2, 5)
    assert LeaderEpochCache.read(cache.path) == [EpochEntry(0, 0)]
    cache.truncate_from_start(3)  # rewrites at once, the new epoch with it
    assert LeaderEpochCache.read(cache.path) == [EpochEntry(0, 3), EpochEntry(2, 5)]
    assert not cache.unwritten


def test_checkpoint_layout_and_round_trip(tmp_path: Path) -> None:
    cache = cache_at(tmp_path, (0, 0), (3, 17))
    cache.sync()
    assert cache.path.read_text() == "0\n2\n0 0\n3 17\n"
    assert not cache.path.with_name(LEADER_EPOCH_FILE + ".tmp").exists()
    loaded = LeaderEpochCache.load(cache.path)
    assert loaded is not None and loaded.entries == cache.entries


@pytest.mark.parametrize("text", [
    "", "1\n0\n", "0\n", "0\nx\n", "0\n2\n0 0\n", "0\n1\n0 0\n1 5\n", "0\n1\n0 -1\n",
    "0\n2\n1 0\n1 5\n", "0\n2\n0 5\n1 5\n", "0\n2\n2 0\n1 5\n", "0\n1\n0  0\n", "0\n1\n0 0",
    "\xff",
])
def test_malformed_checkpoints_read_as_none(tmp_path: Path, text: str) -> None:
    path = tmp_path / LEADER_EPOCH_FILE
    path.write_bytes(text.encode("latin-1"))
    assert LeaderEpochCache.read(path) is None
    assert LeaderEpochCache.read(tmp_path / "missing") is None


# --------------------------------------------------------------------------- in the log


def test_appends_stamp_and_assign_epochs(tmp_path: Path) -> None:
    with PartitionLog(tmp_path / "p") as log:
        assert log.latest_epoch == -1 and log.end_offset_for_epoch(0) == (-1, -1)
        log.append(build_batch([b"a", b"b"]), leader_epoch=0)
        log.append(build_batch([b"c"]), leader_epoch=0)
        log.append(build_batch([b"d"]), leader_epoch=3)
        log.append_as_follower(follower_batch(4, 5, 2))
        log.append_as_follower(follower_batch(6, 4))  # an older epoch starts nothing
        assert log.leader_epochs == ((0, 0), (3, 3), (5, 4))
        assert log.end_offset_for_epoch(0) == (0, 3)
        assert log.end_offset_for_epoch(4) == (3, 4)
        assert log.end_offset_for_epoch(5) == (5, 7)
        assert [h.leader_epoch for h in log.batch_headers(0)] == [0, 0, 3, 5, 4]
    assert LeaderEpochCache.read(tmp_path / "p" / LEADER_EPOCH_FILE) == [
        (0, 0), (3, 3), (5, 4)]


def test_truncate_delete_records_and_reopen_keep_the_cache_consistent(
        tmp_path: Path) -> None:
    directory = tmp_path / "p"
    with PartitionLog(directory) as log:
        for epoch in (0, 0, 1, 1, 2, 2):
            log.append(build_batch([b"x", b"y"]), leader_epoch=epoch)
        assert log.leader_epochs == ((0, 0), (1, 4), (2, 8))
        assert log.truncate_to(9) == 8  # whole batches: epoch 2 is gone
        assert log.leader_epochs == ((0, 0), (1, 4))
        log.delete_records(5)
        assert log.leader_epochs == ((1, 5),)
        assert log.end_offset_for_epoch(0) == (0, 5)
    with PartitionLog(directory) as log:
        assert not log.epoch_cache_rebuilt
        assert log.leader_epochs == ((1, 5),)
        log.delete_records(8)  # everything: the latest epoch is still known
        assert log.leader_epochs == ((1, 8),)
        assert log.end_offset_for_epoch(1) == (1, 8)
    with PartitionLog(directory) as log:
        assert log.leader_epochs == ((1, 8),)
        log.truncate_to(3)  # below the log start: the log restarts empty
        assert log.leader_epochs == ()
        log.append(build_batch([b"z"]), leader_epoch=7)
        assert log.leader_epochs == ((7, 3),)


def test_retention_moves_the_first_epoch_up(tmp_path: Path) -> None:
    now = [1_000_000]
    config = LogConfig(segment_bytes=1, retention_ms=1000)
    with PartitionLog(tmp_path / "p", config, clock=lambda: now[0]) as log:
        for epoch in (0, 0, 1, 1):
            log.append(build_batch([b"x"], now_ms=now[0]), leader_epoch=epoch)
        now[0] += 10_000
        assert log.apply_retention() == [0, 1, 2]
        assert log.log_start_offset == 3
        assert log.leader_epochs == ((1, 3),)


@pytest.mark.parametrize("damage", ["missing", "malformed", "past the end", "empty"])
def test_a_bad_checkpoint_is_rebuilt_from_batch_headers(tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "p"
    with PartitionLog(directory) as log:
        for epoch in (0, 2, 2, 5):
            log.append(build_batch([b"x", b"y"]), leader_epoch=epoch)
        log.delete_records(1)
        expected = log.leader_epochs
    assert expected == ((0, 1), (2, 2), (5, 6))
    path = directory / LEADER_EPOCH_FILE
    if damage == "missing":
        path.unlink()
    elif damage == "malformed":
        path.write_text("0\n3\n0 1\ngarbage\n")
    elif damage == "past the end":
        path.write_text("0\n2\n0 1\n9 100\n")
    else:
        path.write_text("0\n0\n")
    with PartitionLog(directory) as log:
        assert log.epoch_cache_rebuilt
        assert log.leader_epochs == expected
    assert LeaderEpochCache.read(path) == list(expected)


def test_a_crash_after_the_write_before_the_checkpoint_is_repaired(tmp_path: Path) -> None:
    """The batch reached the segment but not the epoch checkpoint: the crash recovery
    re-reads the headers after the recovery point."""
    directory = tmp_path / "p"
    log = PartitionLog(directory)
    log.append(build_batch([b"a"]), leader_epoch=0)
    log.flush()
    stale = (directory / LEADER_EPOCH_FILE).read_bytes()
    log.append(build_batch([b"b"]), leader_epoch=4)
    log.active_segment.flush()
    (directory / LEADER_EPOCH_FILE).write_bytes(stale)
    del log  # no close: a crash
    with PartitionLog(directory) as reopened:
        assert not reopened.opened_cleanly and not reopened.epoch_cache_rebuilt
        assert reopened.leader_epochs == ((0, 0), (4, 1))


def test_a_crash_before_the_first_flush_recovers_the_epochs_without_a_repair(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A log killed before its first flush has no checkpoint: recovery reads every
    header anyway, so that is the normal path, not a rebuild worth a warning."""
    directory = tmp_path / "p"
    log = PartitionLog(directory)
    log.append(build_batch([b"a"]), leader_epoch=0)
    log.append_as_follower(follower_batch(1, 3, 2))
    log.active_segment.flush()
    assert not (directory / LEADER_EPOCH_FILE).exists()
    del log  # no close: a crash
    with caplog.at_level(logging.WARNING, logger="strata.brokers.log"):
        reopened = PartitionLog(directory)
    with reopened:
        assert not reopened.opened_cleanly and not reopened.epoch_cache_rebuilt
        assert reopened.leader_epochs == ((0, 0), (3, 1))
        assert not [r for r in caplog.records if "leader-epoch" in r.getMessage()]
        # Recovery moved the recovery point, so the epochs below it are on disk now.
        assert LeaderEpochCache.read(directory / LEADER_EPOCH_FILE) == [(0, 0), (3, 1)]


# --------------------------------------------------------------------------- against a model


def model_epochs(headers: list[tuple[int, int]], log_start: int) -> list[tuple[int, int]]:
    """Kafka's cache, from the (base offset, epoch) of the batches left: the first offset
    of every epoch larger than all before it, clamped to the log start."""
    entries: list[tuple[int, int]] = []
    for base, epoch in headers:
        if not entries or epoch > entries[-1][0]:
            entries.append((epoch, max(base, log_start)))
    return entries


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_agree_with_the_model(tmp_path: Path, seed: int) -> None:
    """Appends (leader and follower) with non-decreasing epochs, truncations,
    delete-records (never to the very end: then the cache keeps the latest epoch at the
    log end, which the header-derived model cannot see; see the unit test above) and
    reopens, some after a crash."""
    rng = random.Random(seed)
    directory = tmp_path / "p"
    config = LogConfig(segment_bytes=rng.choice([200, 600, 100_000]))
    log = PartitionLog(directory, config)
    epoch = 0
    last_expected: list[tuple[int, int]] = []
    for _ in range(120):
        op = rng.random()
        if op < 0.55:
            epoch += rng.choice([0, 0, 0, 1, 2])
            count = rng.randint(1, 4)
            if rng.random() < 0.5:
                log.append(build_batch([b"v"] * count), leader_epoch=epoch)
            else:
                log.append_as_follower(follower_batch(log.log_end_offset, epoch, count))
        elif op < 0.7:
            log.truncate_to(rng.randint(0, log.log_end_offset + 2))
        elif op < 0.8 and log.log_end_offset > log.log_start_offset:
            log.delete_records(rng.randint(log.log_start_offset, log.log_end_offset - 1))
        elif op < 0.9:
            if rng.random() < 0.5:
                log.close()
            else:
                log.flush()
                del log  # a crash after everything was fsynced
            stored = LeaderEpochCache.read(directory / LEADER_EPOCH_FILE)
            # Flushed or closed: the file holds every entry (a log that never had a
            # batch has none yet, which reads as empty).
            assert stored == last_expected or (stored is None and last_expected == []), \
                stored
            log = PartitionLog(directory, config)
            assert not log.epoch_cache_rebuilt
        headers = [(h.base_offset, h.leader_epoch)
                   for h in log.batch_headers(log.log_start_offset)] \
            if log.log_end_offset > log.log_start_offset else []
        expected = last_expected = model_epochs(headers, log.log_start_offset)
        assert [tuple(e) for e in log.leader_epochs] == expected
        for asked in range(-1, epoch + 2):
            model = LeaderEpochCache(tmp_path / "scratch", [EpochEntry(*e) for e in expected])
            assert log.end_offset_for_epoch(asked) == model.end_offset_for(
                asked, log.log_end_offset)
    log.close()
