"""Deferred fsyncs (``brokers.log.durability``) and the two-step close that uses them:
a log closed without its marker is recovered at the next open, one marked after the
sync opens cleanly, a failed close is never marked, and deferral is per thread.

The fsync counts come from wrapping ``os.fsync``/``os.fdatasync`` in this process (the
storage code calls them through ``durability``): the property under test is how many
of those system calls a close makes, which a file's contents cannot show.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from brokers.config import BrokerConfig
from brokers.coordination import TopicDefinition
from brokers.log import LogConfig, PartitionLog, durability
from brokers.log.checkpoint import PartitionOffsetsCheckpoint
from brokers.log.partition_log import CLEAN_SHUTDOWN_FILE
from brokers.log_manager import HIGH_WATERMARK_CHECKPOINT_FILE, LogManager
from brokers.partition import Partition, read_topic_id
from brokers.services import PartitionRegistry
from wire.errors import LogStorageError
from wire.record_batch import build_batch

pytestmark = pytest.mark.unit


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every fsync/fdatasync this process makes, by thread name."""
    calls: list[str] = []

    def counting(real: Callable[[int], None]) -> Callable[[int], None]:
        def call(fd: int) -> None:
            calls.append(threading.current_thread().name)
            real(fd)
        return call

    monkeypatch.setattr(os, "fsync", counting(os.fsync))
    monkeypatch.setattr(os, "fdatasync", counting(os.fdatasync))
    return calls


def _log_with_records(directory: Path) -> PartitionLog:
    log = PartitionLog(directory, LogConfig(segment_bytes=4096))
    for i in range(20):
        log.append(build_batch([b"x" * 300, str(i).encode()]))
    return log


def test_a_close_inside_deferred_fsyncs_makes_no_fsync(tmp_path: Path,
                                                       fsyncs: list[str]) -> None:
    log = _log_with_records(tmp_path / "deferred")
    fsyncs.clear()
    with durability.deferred_fsyncs():
        log.close(mark_clean=False)
    assert fsyncs == []
    assert not (tmp_path / "deferred" / CLEAN_SHUTDOWN_FILE).exists()

    other = _log_with_records(tmp_path / "direct")
    fsyncs.clear()
    other.close()  # the ordinary close: a dozen or so
    assert len(fsyncs) >= 5
    assert (tmp_path / "direct" / CLEAN_SHUTDOWN_FILE).exists()


def test_deferral_is_per_thread(tmp_path: Path, fsyncs: list[str]) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"data")
    fd = os.open(path, os.O_RDONLY)
    try:
        with durability.deferred_fsyncs():
            durability.fsync(fd)  # skipped here
            worker = threading.Thread(target=durability.fsync, args=(fd,), name="other")
            worker.start()
            worker.join()
            with durability.deferred_fsyncs():  # nested: still deferred after the inner
                pass
            durability.fsync(fd)
        durability.fsync(fd)  # after the block: real again
    finally:
        os.close(fd)
    assert fsyncs == ["other", threading.current_thread().name]


def test_unmarked_logs_recover_and_marked_ones_open_cleanly(tmp_path: Path) -> None:
    log = _log_with_records(tmp_path / "p")
    end = log.log_end_offset
    with durability.deferred_fsyncs():
        log.close(mark_clean=False)
    durability.sync_filesystem(tmp_path)
    reopened = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=4096))
    assert not reopened.opened_cleanly  # no marker: recovered, and nothing was lost
    assert reopened.log_end_offset == end
    reopened.close(mark_clean=False)
    reopened.mark_clean()
    again = PartitionLog(tmp_path / "p", LogConfig(segment_bytes=4096))
    assert again.opened_cleanly and again.log_end_offset == end
    again.close()


def test_a_log_whose_close_failed_is_never_marked(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log_with_records(tmp_path / "p")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(Exception, match="Input/output error"):
        log.close(mark_clean=False)
    monkeypatch.undo()
    log.mark_clean()
    assert not (tmp_path / "p" / CLEAN_SHUTDOWN_FILE).exists()


def test_sync_filesystem_reports_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        durability.sync_filesystem(tmp_path / "absent")
    durability.sync_filesystem(tmp_path)  # and works on a real one


def _manager(data_dir: Path) -> LogManager:
    # open_logs/close_logs touch only the data dir and the registry: the cluster view,
    # ZooKeeper and metrics are not used on these paths.
    config = BrokerConfig(broker_id=0, log_dir=str(data_dir))
    return LogManager(config, None, PartitionRegistry(), None, None)  # type: ignore[arg-type]


def test_opening_new_and_clean_logs_is_one_sync_and_recovery_fsyncs(
        tmp_path: Path, fsyncs: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[Path] = []
    real_sync = durability.sync_filesystem

    def counted_sync(path: Path) -> None:
        syncs.append(path)
        real_sync(path)

    monkeypatch.setattr(durability, "sync_filesystem", counted_sync)
    manager = _manager(tmp_path)
    topic = TopicDefinition("t", "id-1", {p: [0] for p in range(30)})
    hosted = [(topic, p, LogConfig(segment_bytes=4096)) for p in range(30)]

    opened = asyncio.run(manager.open_logs(hosted))  # thirty new logs
    assert all(isinstance(p, Partition) for p in opened)
    assert fsyncs == [] and syncs == [tmp_path]
    for partition in opened:
        assert isinstance(partition, Partition)
        partition.log.append(build_batch([b"v"]))
    syncs.clear()
    asyncio.run(manager.close_logs([p for p in opened if isinstance(p, Partition)]))
    assert fsyncs == [] and syncs == [tmp_path, tmp_path]  # data, then the markers
    assert all((tmp_path / f"t-{p}" / CLEAN_SHUTDOWN_FILE).exists() for p in range(30))

    (tmp_path / "t-7" / CLEAN_SHUTDOWN_FILE).unlink()  # as after a crash
    syncs.clear()
    # All three kinds at once (clean, recovered, new: each on its own threads), the
    # answers in the order asked.
    grown = TopicDefinition("t", "id-1", {p: [0] for p in range(32)})
    again = asyncio.run(manager.open_logs(
        [(grown, 31, LogConfig(segment_bytes=4096)), *hosted,
         (grown, 30, LogConfig(segment_bytes=4096))]))
    assert syncs == [tmp_path]
    assert fsyncs, "recovering t-7 fsyncs as it goes"
    assert all(isinstance(p, Partition) for p in again)
    assert [p.partition for p in again if isinstance(p, Partition)] == [31, *range(31)]
    assert [p.log.opened_cleanly for p in again if isinstance(p, Partition)] == \
        [False] + [p != 7 for p in range(30)] + [False]
    assert [p.log.log_end_offset for p in again if isinstance(p, Partition)] == \
        [0] + [1] * 30 + [0]
    asyncio.run(manager.close_logs([p for p in again if isinstance(p, Partition)]))


def test_a_bulk_close_writes_only_what_a_reopen_needs(tmp_path: Path) -> None:
    """Closing in bulk (fsyncs deferred): a log that never held a record gets nothing
    but its marker (its missing checkpoints, snapshot and indexes read as empty), a
    written log gets its checkpoints; every high watermark goes into the data
    directory's one checkpoint file, none into a partition's directory; both reopen
    cleanly to the same state."""
    manager = _manager(tmp_path)
    topic = TopicDefinition("t", "id-1", {p: [0] for p in range(2)})
    hosted = [(topic, p, LogConfig(segment_bytes=4096)) for p in range(2)]
    empty, written = asyncio.run(manager.open_logs(hosted))
    assert isinstance(empty, Partition) and isinstance(written, Partition)
    for i in range(3):
        written.log.append(build_batch([str(i).encode()]))
    written.high_watermark = 2  # as replication would have moved it
    before = set(os.listdir(tmp_path / "t-0"))
    asyncio.run(manager.close_logs([empty, written]))
    assert set(os.listdir(tmp_path / "t-0")) - before == {CLEAN_SHUTDOWN_FILE}
    files = set(os.listdir(tmp_path / "t-1"))
    assert {"recovery-point", "leader-epoch-checkpoint",
            f"{3:020d}.snapshot", f"{0:020d}.index", f"{0:020d}.timeindex"} <= files
    assert "high-watermark" not in files
    assert (tmp_path / "t-1" / "recovery-point").read_text() == "0\n3\n"  # atomic
    assert (tmp_path / HIGH_WATERMARK_CHECKPOINT_FILE).read_text() == "0\n2\nt 0 0\nt 1 2\n"
    assert not any(name.endswith(".tmp") for name in [*files, *os.listdir(tmp_path)])

    again = asyncio.run(manager.open_logs(hosted))
    assert all(isinstance(p, Partition) and p.log.opened_cleanly for p in again)
    empty, written = (p for p in again if isinstance(p, Partition))
    assert (empty.log.log_end_offset, empty.high_watermark, empty.log.log_start_offset) == \
        (0, 0, 0)
    assert (written.log.log_end_offset, written.high_watermark,
            written.log.recovery_point) == (3, 2, 3)
    written.log.append(build_batch([b"more"]))  # the reopened logs take writes
    empty.log.append(build_batch([b"first"]))
    asyncio.run(manager.close_logs([empty, written]))
    reopened = asyncio.run(manager.open_logs(hosted))
    assert [p.log.log_end_offset for p in reopened if isinstance(p, Partition)] == [1, 4]
    asyncio.run(manager.close_logs([p for p in reopened if isinstance(p, Partition)]))


def test_a_failed_sync_leaves_no_marker_and_keeps_opened_logs_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A ``syncfs`` that fails: a close writes no clean-shutdown marker (the next start
    recovers every log), and an open answers each log with a storage error instead of
    serving files that may not be on disk."""
    manager = _manager(tmp_path)
    topic = TopicDefinition("t", "id-1", {p: [0] for p in range(3)})
    hosted = [(topic, p, LogConfig(segment_bytes=4096)) for p in range(3)]
    opened = asyncio.run(manager.open_logs(hosted))
    for partition in opened:
        assert isinstance(partition, Partition)
        partition.log.append(build_batch([b"v"]))

    def failing(path: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(durability, "sync_filesystem", failing)
    phases = asyncio.run(manager.close_logs([p for p in opened if isinstance(p, Partition)]))
    assert phases.startswith("close ") and "markers" not in phases
    assert not any((tmp_path / f"t-{p}" / CLEAN_SHUTDOWN_FILE).exists() for p in range(3))
    assert "no clean-shutdown markers are written" in caplog.text

    again = asyncio.run(manager.open_logs(hosted))
    assert all(isinstance(p, LogStorageError) for p in again), again
    assert "check the disk" in str(again[0])


def test_the_high_watermark_checkpoint_is_one_file_per_data_directory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``PartitionOffsetsCheckpoint``: entries round-trip; a missing, truncated or
    malformed file reads as empty (reported), so every replica falls back as for a
    missing value; the writer leaves no temporary file."""
    path = tmp_path / HIGH_WATERMARK_CHECKPOINT_FILE
    checkpoint = PartitionOffsetsCheckpoint(path)
    assert checkpoint.read() == {}
    entries = {("a.b-c_d", 0): 0, ("a.b-c_d", 17): 12_345_678_901, ("x", 3): 5}
    checkpoint.write(entries)
    assert PartitionOffsetsCheckpoint(path).read() == entries
    assert os.listdir(tmp_path) == [HIGH_WATERMARK_CHECKPOINT_FILE]
    good = path.read_bytes()
    for bad in (good[:-3], b"1" + good[1:], good.replace(b"\n3\n", b"\n4\n", 1),
                good.replace(b" 5\n", b" -5\n"), good.replace(b" 5\n", b" five\n"),
                b"0\n1\nt 0\n", b"\xff\n", b""):
        path.write_bytes(bad)
        caplog.clear()
        assert checkpoint.read() == {}, bad
        assert "taken as missing" in caplog.text, bad


def test_high_watermarks_come_from_the_data_directory_file_then_the_old_per_log_file(
        tmp_path: Path) -> None:
    """At open a replica's HW is its entry in the data directory's checkpoint; a log
    without one (written by an older version) reads its old per-partition file; with
    neither it is the log end. The entry is capped at the log end."""
    manager = _manager(tmp_path)
    topic = TopicDefinition("t", "id-1", {p: [0] for p in range(4)})
    hosted = [(topic, p, LogConfig()) for p in range(4)]
    logs = [p for p in asyncio.run(manager.open_logs(hosted)) if isinstance(p, Partition)]
    for partition in logs:
        for i in range(5):
            partition.log.append(build_batch([str(i).encode()]))
    asyncio.run(manager.close_logs(logs))
    # The close recorded the HW each replica had (0: nothing replicated yet).
    assert PartitionOffsetsCheckpoint(tmp_path / HIGH_WATERMARK_CHECKPOINT_FILE).read() == \
        {("t", p): 0 for p in range(4)}
    PartitionOffsetsCheckpoint(tmp_path / HIGH_WATERMARK_CHECKPOINT_FILE).write(
        {("t", 0): 3, ("t", 1): 99})
    # Partition 2 has only an older version's file; 3 has nothing.
    (tmp_path / "t-2" / "high-watermark").write_text(f"0\n{4:020d}\n")
    (tmp_path / "t-0" / "high-watermark").write_text(f"0\n{1:020d}\n")  # the file wins
    reopened = [p for p in asyncio.run(_manager(tmp_path).open_logs(hosted))
                if isinstance(p, Partition)]
    assert [p.high_watermark for p in reopened] == [3, 5, 4, 5]
    asyncio.run(manager.close_logs(reopened))


def test_a_new_log_is_created_without_reading_and_opens_like_any_other(
        tmp_path: Path) -> None:
    """``new=True`` (the caller listed the data directory): the log is created with one
    ``mkdir`` and its ``.log`` and metadata files, in the state an open of an empty
    directory finds; when the directory exists after all it is opened as usual."""
    config = LogConfig(segment_bytes=4096)
    fresh = Partition("t", 0, "id-1", tmp_path / "t-0", config, 0, new=True)
    assert fresh.log.created_new
    assert sorted(os.listdir(tmp_path / "t-0")) == [f"{0:020d}.log", "partition.metadata"]
    assert read_topic_id(tmp_path / "t-0") == "id-1"
    state = (fresh.log.log_end_offset, fresh.log.log_start_offset, fresh.log.recovery_point,
             fresh.high_watermark, fresh.log.leader_epochs, fresh.log.opened_cleanly)
    assert state == (0, 0, 0, 0, (), False)
    fresh.log.append(build_batch([b"a", b"b"]))
    fresh.close()
    again = Partition("t", 0, "id-1", tmp_path / "t-0", config, 0, new=True)
    assert not again.log.created_new and again.log.opened_cleanly
    assert again.log.log_end_offset == 2
    again.close()
