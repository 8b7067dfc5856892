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
from brokers.log.partition_log import CLEAN_SHUTDOWN_FILE
from brokers.log_manager import LogManager
from brokers.partition import Partition
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
    written log gets its checkpoints, the high watermark in the fixed-length in-place
    form (the recovery point never: see checkpoint.py); both reopen cleanly to the same
    state."""
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
    assert {"high-watermark", "recovery-point", "leader-epoch-checkpoint",
            f"{3:020d}.snapshot", f"{0:020d}.index", f"{0:020d}.timeindex"} <= files
    assert (tmp_path / "t-1" / "high-watermark").read_text() == f"0\n{2:020d}\n"
    assert (tmp_path / "t-1" / "recovery-point").read_text() == "0\n3\n"  # atomic
    assert not any(name.endswith(".tmp") for name in files)

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
