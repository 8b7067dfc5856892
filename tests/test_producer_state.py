"""Idempotent-producer state: dedupe, gaps, fencing, expiry and snapshots (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokers.producer_state import ProducerStateManager
from wire.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from wire.record_batch import (
    SINK_PRODUCER_ID_BASE,
    BatchHeader,
    ControlType,
    build_batch,
    build_control_batch,
    peek_header,
    set_base_offset,
    stamp_sink_commit,
)

pytestmark = pytest.mark.unit


def _header(pid: int, epoch: int, seq: int, n: int = 2, ts: int = 1000,
            base: int = 0, transactional: bool = False) -> BatchHeader:
    batch = bytearray(build_batch([b"v"] * n, producer_id=pid, producer_epoch=epoch,
                                  base_sequence=seq, timestamps=[ts] * n,
                                  transactional=transactional))
    set_base_offset(batch, base, 0)
    return peek_header(batch)


def _marker(pid: int, epoch: int, base: int, control: ControlType = ControlType.COMMIT
            ) -> BatchHeader:
    batch = bytearray(build_control_batch(pid, epoch, control, 0, 1000))
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


def test_transactions_open_at_their_first_batch_and_close_at_the_marker(
        tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    first = _header(7, 0, 0, base=10, transactional=True)
    assert state.needs_verification(first)  # the leader asks the coordinator first
    state.check(first)
    state.update(first, 10)
    assert not state.needs_verification(_header(7, 0, 2, base=12, transactional=True))
    state.update(_header(7, 0, 2, base=12, transactional=True), 12)
    other = _header(8, 0, 0, base=14)  # a non-transactional producer: not unstable
    state.update(other, 14)
    assert state.first_unstable_offset() == 10 and state.open_transactions() == {7: 10}
    with pytest.raises(InvalidTxnStateError, match="transaction open"):
        state.check(_header(7, 0, 4, base=16))  # a plain write inside the transaction
    marker = _marker(7, 1, 16, ControlType.ABORT)
    assert state.check_marker(marker, coordinator_epoch=3)
    done = state.complete(marker, 16, ControlType.ABORT, 3)
    assert done is not None and (done.first_offset, done.last_offset, done.aborted) == \
        (10, 16, True)
    assert state.first_unstable_offset() == 10  # until the marker is replicated
    state.on_high_watermark(16)
    assert state.first_unstable_offset() == 10
    state.on_high_watermark(17)
    assert state.first_unstable_offset() is None and state.open_transactions() == {}
    # The marker moved the producer to epoch 1: a late batch of epoch 0 is refused (a
    # delayed produce cannot join the next transaction), epoch 1 starts at sequence 0.
    with pytest.raises(InvalidProducerEpochError):
        state.check(_header(7, 0, 4, base=17, transactional=True))
    assert state.check(_header(7, 1, 0, base=17, transactional=True)) is None


def test_markers_from_old_coordinators_or_epochs_are_refused_and_repeats_skipped(
        tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    state.update(_header(7, 0, 0, base=0, transactional=True), 0)
    state.complete(_marker(7, 1, 2), 2, ControlType.COMMIT, 5)
    with pytest.raises(TransactionCoordinatorFencedError):
        state.check_marker(_marker(7, 2, 3), coordinator_epoch=4)
    with pytest.raises(InvalidProducerEpochError):
        state.check_marker(_marker(7, 0, 3), coordinator_epoch=5)
    assert not state.check_marker(_marker(7, 1, 3), coordinator_epoch=5)  # a retry
    assert state.check_marker(_marker(9, 0, 3), coordinator_epoch=0)  # unknown producer
    assert state.complete(_marker(9, 0, 3), 3, ControlType.COMMIT, 0) is None


def test_open_transactions_survive_snapshots_and_replay(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    state.update(_header(7, 0, 0, base=0, transactional=True), 0)
    state.update(_header(8, 0, 0, base=2, transactional=True), 2)
    state.complete(_marker(8, 1, 4), 4, ControlType.COMMIT, 1)
    state.write_snapshot(5)
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(5) == 5
    assert loaded.open_transactions() == {7: 0}
    assert loaded.first_unstable_offset() == 0
    loaded.on_high_watermark(5)
    assert loaded.first_unstable_offset() == 0  # 7's is still open
    # Replay after the snapshot: a marker completes 7's transaction (aborted).
    completed = loaded.replay([_header(9, 0, 0, base=5, transactional=True),
                               (_marker(7, 1, 7, ControlType.ABORT), ControlType.ABORT, 2)])
    assert [(c.producer_id, c.first_offset, c.aborted) for c in completed] == [(7, 0, True)]
    assert loaded.open_transactions() == {9: 5}


def _txn_sink_header(pid: int, epoch: int, batch_id: int, *, ends: bool,
                     base: int = 0) -> BatchHeader:
    batch = bytearray(build_batch([b"v", b"w"], timestamps=[1000, 1000]))
    stamp_sink_commit(batch, pid, batch_id, ends_commit=ends, producer_epoch=epoch)
    set_base_offset(batch, base, 0)
    return peek_header(batch)


def test_sink_commits_inside_a_transaction_open_it_and_the_marker_decides_them(
        tmp_path: Path) -> None:
    """The exactly-once Spark sink's groups in a transaction: stamped with the
    transactional producer's id and epoch, they open its transaction (the LSO stops at
    the group's first offset), the group's end records the batch id held in the open
    transaction (a resumed commit must not append it twice), a group without its end is
    torn, and the marker ends all of it."""
    state = ProducerStateManager(tmp_path)
    head = _txn_sink_header(7, 3, 12, ends=False, base=20)
    assert head.is_transactional and head.in_txn_sink_commit and head.producer_epoch == 3
    assert state.needs_verification(head)
    state.update(head, 20)
    assert state.open_transactions() == {7: 20} and state.first_unstable_offset() == 20
    assert state.open_commit() == 20 and state.txn_sink_batch(7, 3) is None  # torn so far
    state.update(_txn_sink_header(7, 3, 12, ends=True, base=22), 22)
    assert state.open_commit() is None and state.txn_sink_batch(7, 3) == 12
    assert state.txn_sink_batch(7, 2) is None  # another epoch: another transaction
    assert state.producer_epoch(7) == 3 and state.last_commit(7) == -1
    # Kept by a snapshot (a restart between the commit and the marker).
    state.write_snapshot(24)
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(24) == 24
    assert loaded.txn_sink_batch(7, 3) == 12 and loaded.open_transactions() == {7: 20}
    done = loaded.complete(_marker(7, 4, 24), 24, ControlType.COMMIT, 1)
    assert done is not None and (done.first_offset, done.aborted) == (20, False)
    assert loaded.txn_sink_batch(7, 4) is None and loaded.open_transactions() == {}
    # Rebuilt from the log alone (no snapshot): the same state.
    replayed = ProducerStateManager(tmp_path / "x")
    replayed.replay([head, _txn_sink_header(7, 3, 12, ends=True, base=22)])
    assert replayed.txn_sink_batch(7, 3) == 12 and replayed.open_transactions() == {7: 20}
