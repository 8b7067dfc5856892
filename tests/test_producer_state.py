"""Idempotent-producer state: dedupe, gaps, fencing, expiry and snapshots (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokers.producer_state import ProducerStateManager
from wire.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from wire.record_batch import (
    SINK_PRODUCER_ID_BASE,
    BatchHeader,
    build_batch,
    peek_header,
    set_base_offset,
    stamp_sink_commit,
)


def _header(pid: int, epoch: int, seq: int, n: int = 2, ts: int = 1000,
            base: int = 0) -> BatchHeader:
    batch = bytearray(build_batch([b"v"] * n, producer_id=pid, producer_epoch=epoch,
                                  base_sequence=seq, timestamps=[ts] * n))
    set_base_offset(batch, base, 0)
    return peek_header(batch)


def test_duplicates_gaps_and_fencing(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    first = _header(7, 0, 0)
    assert state.check(first) is None
    state.update(first, 0)
    again = state.check(_header(7, 0, 0))
    assert again is not None and again.first_offset == 0
    with pytest.raises(OutOfOrderSequenceError):
        state.check(_header(7, 0, 5))
    with pytest.raises(UnknownProducerIdError):
        state.check(_header(8, 0, 3))
    state.update(_header(7, 1, 0), 2)
    with pytest.raises(InvalidProducerEpochError):
        state.check(_header(7, 0, 2))


def test_idle_producers_expire_and_snapshots_keep_their_age(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    state.update(_header(1, 0, 0, ts=1_000), 0)
    state.update(_header(2, 0, 0, ts=90_000), 2)
    state.write_snapshot(4)
    reloaded = ProducerStateManager(tmp_path)
    assert reloaded.load(4) == 4 and len(reloaded) == 2
    assert reloaded.expire(now_ms=100_000, max_idle_ms=50_000) == 1
    assert len(reloaded) == 1
    with pytest.raises(UnknownProducerIdError):  # producer 1 must start over at 0
        reloaded.check(_header(1, 0, 2))
    assert reloaded.check(_header(2, 0, 2)) is None


def _sink_header(pid: int, batch_id: int, *, ends: bool, ts: int = 1000,
                 base: int = 0) -> BatchHeader:
    batch = bytearray(build_batch([b"v"], timestamps=[ts]))
    stamp_sink_commit(batch, pid, batch_id, ends_commit=ends)
    set_base_offset(batch, base, 0)
    return peek_header(batch)


def test_sink_commits_count_only_when_their_group_ends_and_never_expire(
        tmp_path: Path) -> None:
    pid = SINK_PRODUCER_ID_BASE + 5
    state = ProducerStateManager(tmp_path)
    assert state.last_commit(pid) == -1
    state.update(_sink_header(pid, 3, ends=False, base=0), 0)
    assert state.last_commit(pid) == -1 and state.open_commit() == 0  # torn so far
    state.update(_sink_header(pid, 3, ends=True, base=1), 1)
    assert state.last_commit(pid) == 3 and state.open_commit() is None
    # A sink idle far beyond the expiry keeps its state: Spark may re-run a batch later.
    assert state.expire(now_ms=10**12, max_idle_ms=1) == 0
    state.write_snapshot(2)
    reloaded = ProducerStateManager(tmp_path)
    assert reloaded.load(2) == 2
    assert reloaded.last_commit(pid) == 3
    # Replaying a group without its end batch leaves it open (the partition truncates it).
    reloaded.replay([_sink_header(pid, 4, ends=False, base=2)])
    assert reloaded.open_commit() == 2 and reloaded.last_commit(pid) == 3
