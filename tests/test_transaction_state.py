"""The transaction coordinator's state machine (brokers/transaction_state.py), no broker.

Each test drives ``TxnMetadata`` the way the coordinator does: a method returns a
``Step``; a record to persist is begun, then completed (the write succeeded). The cases
are Kafka's (KIP-98, KIP-360, KIP-890) plus the ones Jepsen found in Kafka-compatible
systems: a delayed EndTxn of one transaction must not end the next.
"""

from __future__ import annotations

import itertools

import pytest

from brokers.transaction_state import (
    MAX_EPOCH,
    Step,
    TxnMetadata,
    TxnRecord,
    TxnState,
    check_timeout,
    decode_record,
    encode_key,
    encode_record,
)
from wire.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionAbortableError,
)

pytestmark = pytest.mark.unit

T0, T1, T2 = ("t", 0), ("t", 1), ("t", 2)
_ids = itertools.count(100)


def allocate() -> int:
    return next(_ids)


def apply(meta: TxnMetadata, step: Step) -> Step:
    """What the coordinator does with a step: persist its record (here: at once)."""
    if step.record is not None:
        meta.begin(step.record)
        meta.complete(step.record)
    return step


def ready(timeout_ms: int = 60_000, two_phase: bool = False) -> TxnMetadata:
    meta = TxnMetadata.new("app-1", 7, timeout_ms, now_ms=0, two_phase=two_phase)
    step, _ = meta.init_producer_id(timeout_ms=timeout_ms, now_ms=1, allocate=allocate,
                                    two_phase=two_phase)
    apply(meta, step)
    assert (step.producer_id, step.producer_epoch, meta.state) == (7, 0, TxnState.EMPTY)
    return meta


def test_a_transaction_commits_and_the_epoch_moves_on() -> None:
    meta = ready()
    step = apply(meta, meta.add_partitions(7, 0, [T0, T1], now_ms=10, tag="batch-3"))
    assert step.error is None and meta.state is TxnState.ONGOING
    assert (meta.record.partitions, meta.record.start_ms, meta.record.tag) == \
        ({T0, T1}, 10, "batch-3")
    # The same partitions again: nothing to write.
    assert meta.add_partitions(7, 0, [T1], now_ms=11).record is None
    step = meta.end_txn(7, 0, True, now_ms=20, allocate=allocate)
    assert (step.error, step.markers, step.producer_id, step.producer_epoch) == \
        (None, True, 7, 1)
    assert step.record is not None and step.record.state is TxnState.PREPARE_COMMIT
    assert step.record.producer_epoch == 1  # the markers carry the next epoch
    apply(meta, step)
    done = meta.complete_txn(now_ms=30)
    apply(meta, Step(done))
    assert (meta.state, meta.record.partitions, meta.record.producer_epoch,
            meta.record.tag) == (TxnState.COMPLETE_COMMIT, frozenset(), 1, "batch-3")
    # The next transaction runs at epoch 1.
    assert apply(meta, meta.add_partitions(7, 1, [T2], now_ms=40)).error is None
    assert meta.record.tag is None  # a new transaction starts without the old tag


def test_requests_during_a_write_wait() -> None:
    meta = ready()
    step = meta.add_partitions(7, 0, [T0], now_ms=10)
    assert step.record is not None
    meta.begin(step.record)
    for busy in (meta.add_partitions(7, 0, [T1], now_ms=11),
                 meta.end_txn(7, 0, True, now_ms=11, allocate=allocate),
                 meta.init_producer_id(timeout_ms=1000, now_ms=11, allocate=allocate)[0]):
        assert isinstance(busy.error, ConcurrentTransactionsError)
    meta.abandon()  # the write failed: nothing changed
    assert meta.state is TxnState.EMPTY and meta.pending is None


def test_a_delayed_end_txn_cannot_end_the_next_transaction() -> None:
    """KAFKA-17754 / Jepsen Bufstream 0.1: transaction N's EndTxn is held up until N+1
    has begun. With the epoch bumped at every EndTxn it is a retry or fenced, never a
    decision about N+1."""
    meta = ready()
    apply(meta, meta.add_partitions(7, 0, [T0], now_ms=1))
    apply(meta, meta.end_txn(7, 0, True, now_ms=2, allocate=allocate))  # N: commit
    apply(meta, Step(meta.complete_txn(now_ms=3)))
    apply(meta, meta.add_partitions(7, 1, [T1], now_ms=4))  # N+1 open at epoch 1
    late_abort = meta.end_txn(7, 0, False, now_ms=5, allocate=allocate)
    assert isinstance(late_abort.error, ProducerFencedError) and late_abort.record is None
    late_commit = meta.end_txn(7, 0, True, now_ms=5, allocate=allocate)
    assert isinstance(late_commit.error, ProducerFencedError)
    assert meta.state is TxnState.ONGOING and meta.record.partitions == {T1}
    # A late AddPartitions or a leader's verification with epoch 0 is fenced as well.
    assert isinstance(meta.add_partitions(7, 0, [T2], now_ms=6).error, ProducerFencedError)
    assert isinstance(meta.verify(7, 0, [T1])[T1], ProducerFencedError)


def test_end_txn_retries_are_answered_again_and_the_opposite_is_refused() -> None:
    meta = ready()
    apply(meta, meta.add_partitions(7, 0, [T0], now_ms=1))
    apply(meta, meta.end_txn(7, 0, True, now_ms=2, allocate=allocate))
    # While the markers are written: the same again waits, the opposite is refused.
    assert isinstance(meta.end_txn(7, 0, True, 3, allocate).error,
                      ConcurrentTransactionsError)
    assert isinstance(meta.end_txn(7, 0, False, 3, allocate).error, InvalidTxnStateError)
    apply(meta, Step(meta.complete_txn(now_ms=4)))
    again = meta.end_txn(7, 0, True, 5, allocate)
    assert (again.error, again.record, again.producer_epoch) == (None, None, 1)
    assert isinstance(meta.end_txn(7, 0, False, 5, allocate).error, InvalidTxnStateError)


def test_commit_with_nothing_open_is_refused_an_empty_abort_bumps() -> None:
    meta = ready()
    assert isinstance(meta.end_txn(7, 0, True, 1, allocate).error, InvalidTxnStateError)
    step = apply(meta, meta.end_txn(7, 0, False, 1, allocate))
    assert (step.error, step.markers, step.producer_epoch) == (None, False, 1)
    apply(meta, Step(meta.complete_txn(now_ms=2)))
    assert (meta.state, meta.record.producer_epoch) == (TxnState.COMPLETE_ABORT, 1)


def test_the_wrong_producer_is_told_so() -> None:
    meta = ready()
    assert isinstance(meta.add_partitions(8, 0, [T0], 1).error,
                      InvalidProducerIdMappingError)
    assert isinstance(meta.add_partitions(7, 3, [T0], 1).error, ProducerFencedError)
    assert isinstance(meta.end_txn(8, 0, True, 1, allocate).error,
                      InvalidProducerIdMappingError)


def test_leaders_verify_that_a_partition_is_in_the_open_transaction() -> None:
    meta = ready()
    assert isinstance(meta.verify(7, 0, [T0])[T0], TransactionAbortableError)  # none open
    apply(meta, meta.add_partitions(7, 0, [T0], now_ms=1))
    answers = meta.verify(7, 0, [T0, T1])
    assert answers[T0] is None and isinstance(answers[T1], TransactionAbortableError)
    assert isinstance(meta.verify(9, 0, [T0])[T0], InvalidProducerIdMappingError)
    apply(meta, meta.end_txn(7, 0, True, now_ms=2, allocate=allocate))
    assert isinstance(meta.verify(7, 1, [T0])[T0], ConcurrentTransactionsError)
    assert meta.pending is None  # verification never writes


def test_a_new_producer_fences_the_old_and_aborts_its_transaction() -> None:
    meta = ready()
    apply(meta, meta.add_partitions(7, 0, [T0, T1], now_ms=1))
    step, answer = meta.init_producer_id(timeout_ms=60_000, now_ms=2, allocate=allocate)
    assert answer.state is TxnState.ONGOING
    assert isinstance(step.error, ConcurrentTransactionsError) and step.markers
    assert step.record is not None
    assert (step.record.state, step.record.producer_epoch) == (TxnState.PREPARE_ABORT, 2)
    apply(meta, step)
    # The zombie (epoch 0) is fenced everywhere meanwhile.
    for commit in (True, False):
        assert isinstance(meta.end_txn(7, 0, commit, 3, allocate).error, ProducerFencedError)
    assert isinstance(meta.add_partitions(7, 0, [T2], 3).error, ProducerFencedError)
    apply(meta, Step(meta.complete_txn(now_ms=4)))
    step, _ = meta.init_producer_id(timeout_ms=60_000, now_ms=5, allocate=allocate)
    apply(meta, step)
    assert (step.error, step.producer_id, step.producer_epoch, meta.state) == \
        (None, 7, 3, TxnState.EMPTY)


def test_init_producer_id_with_an_expected_epoch_recovers_or_is_fenced() -> None:
    meta = ready()
    step, _ = meta.init_producer_id(timeout_ms=1000, now_ms=1, allocate=allocate,
                                    expected_id=7, expected_epoch=0)
    apply(meta, step)
    assert step.producer_epoch == 1  # KIP-360: the producer recovers, the epoch moves on
    retry, _ = meta.init_producer_id(timeout_ms=1000, now_ms=2, allocate=allocate,
                                     expected_id=7, expected_epoch=0)
    assert (retry.record, retry.producer_epoch) == (None, 1)  # a retry of that bump
    stale, _ = meta.init_producer_id(timeout_ms=1000, now_ms=3, allocate=allocate,
                                     expected_id=7, expected_epoch=5)
    assert isinstance(stale.error, ProducerFencedError)
    half, _ = meta.init_producer_id(timeout_ms=1000, now_ms=3, allocate=allocate,
                                    expected_id=7)
    assert isinstance(half.error, InvalidRequestError)


def test_a_two_phase_transaction_survives_its_timeout_and_is_handed_back() -> None:
    meta = ready(timeout_ms=100, two_phase=True)
    apply(meta, meta.add_partitions(7, 0, [T0], now_ms=10, tag="batch-9"))
    assert not meta.timed_out(now_ms=10_000)  # never aborted by the timeout
    step, answer = meta.init_producer_id(timeout_ms=100, now_ms=10_001, allocate=allocate,
                                         two_phase=True, keep_prepared=True)
    assert (step.record, step.error, step.producer_id, step.producer_epoch) == \
        (None, None, 7, 0)
    assert (answer.state, answer.tag) == (TxnState.ONGOING, "batch-9")
    # Its owner commits it.
    apply(meta, meta.end_txn(7, 0, True, now_ms=10_002, allocate=allocate))
    assert meta.state is TxnState.PREPARE_COMMIT
    refused, _ = meta.init_producer_id(timeout_ms=100, now_ms=1, allocate=allocate,
                                       keep_prepared=True)
    assert isinstance(refused.error, InvalidRequestError)  # only for two-phase ids


def test_an_ordinary_transaction_past_its_timeout_is_aborted_with_a_fence() -> None:
    meta = ready(timeout_ms=100)
    apply(meta, meta.add_partitions(7, 0, [T0], now_ms=10))
    assert not meta.timed_out(now_ms=110) and meta.timed_out(now_ms=111)
    step = apply(meta, meta.abort_timed_out(now_ms=111))
    assert (meta.state, meta.record.producer_epoch, step.markers) == \
        (TxnState.PREPARE_ABORT, 2, True)
    for commit in (True, False):  # the fenced producer, whatever it asks
        assert isinstance(meta.end_txn(7, 0, commit, 112, allocate).error,
                          ProducerFencedError)
    apply(meta, Step(meta.complete_txn(now_ms=113)))
    assert meta.expired(now_ms=113 + 1000, expiration_ms=1000)
    assert not meta.expired(now_ms=113 + 999, expiration_ms=1000)


def test_the_epoch_overflows_to_a_new_producer_id() -> None:
    meta = ready()
    meta.record = meta.record.replace(producer_epoch=MAX_EPOCH)
    apply(meta, meta.add_partitions(7, MAX_EPOCH, [T0], now_ms=1))
    step = apply(meta, meta.end_txn(7, MAX_EPOCH, True, now_ms=2, allocate=allocate))
    assert step.producer_epoch == 0 and step.producer_id != 7
    new_id = step.producer_id
    apply(meta, Step(meta.complete_txn(now_ms=3)))
    assert (meta.record.producer_id, meta.record.producer_epoch,
            meta.record.previous_producer_id) == (new_id, 0, 7)
    # A retry of that EndTxn from the old id is answered, not fenced.
    again = meta.end_txn(7, MAX_EPOCH, True, 4, allocate)
    assert (again.error, again.producer_id) == (None, new_id)


def test_kafkas_older_end_txn_does_not_bump() -> None:
    meta = ready()
    apply(meta, meta.add_partitions(7, 0, [T0], now_ms=1))
    step = apply(meta, meta.end_txn(7, 0, False, now_ms=2, allocate=allocate, tv2=False))
    assert (step.producer_epoch, meta.state) == (0, TxnState.PREPARE_ABORT)
    apply(meta, Step(meta.complete_txn(now_ms=3)))
    assert meta.end_txn(7, 0, False, 4, allocate, tv2=False).error is None  # a retry
    assert isinstance(meta.end_txn(7, 0, True, 4, allocate, tv2=False).error,
                      InvalidTxnStateError)


def test_invalid_transitions_are_bugs() -> None:
    meta = ready()
    with pytest.raises(AssertionError, match="not a valid transition"):
        meta.begin(meta.record.replace(state=TxnState.COMPLETE_COMMIT))
    with pytest.raises(AssertionError, match="complete_txn"):
        meta.complete_txn(now_ms=1)


def test_timeouts_are_checked() -> None:
    check_timeout(1, 900_000)
    check_timeout(900_000, 900_000)
    for bad in (0, -5, 900_001):
        with pytest.raises(InvalidTransactionTimeoutError, match=r"transaction\.max\.timeout"):
            check_timeout(bad, 900_000)


def test_records_round_trip_through_the_log() -> None:
    record = TxnRecord("app-1", 7, 3, 60_000, TxnState.ONGOING, frozenset({T0, T2}),
                       start_ms=5, last_update_ms=6, previous_producer_id=2,
                       two_phase=True, tag="batch-1")
    key = encode_key("app-1")
    assert decode_record(key, encode_record(record)) == ("app-1", record)
    assert decode_record(key, None) == ("app-1", None)
    with pytest.raises(ValueError, match="not a transaction log key"):
        decode_record(b'{"type": "group"}', None)


# ----------------------------------------------------------------------------- client


def test_the_clients_transaction_manager_follows_kafkas_states() -> None:
    from strata.client import TopicPartition
    from strata.client._transactions import (
        AbortableTransactionError,
        FatalTransactionError,
        TransactionManager,
        TransactionStateError,
        TxnClientState,
        classify,
    )

    tm = TransactionManager("app-1", 60_000)
    with pytest.raises(TransactionStateError, match="init_transactions"):
        tm.begin()
    with pytest.raises(TransactionStateError, match="begin_transaction"):
        tm.require_open("send()")
    tm.begin_init()
    tm.initialized(7, 0)
    tm.begin()
    with pytest.raises(TransactionStateError, match="no transaction open"):
        tm.begin()
    tp = TopicPartition("t", 0)
    tm.wrote([tp, tp])
    assert tm.new_partitions == {tp} and not tm.started
    tm.added([tp])
    assert tm.started and not tm.new_partitions
    tm.begin_commit()
    tm.completed(7, 1)  # KIP-890: the next transaction's epoch
    assert (tm.state, tm.producer_epoch, tm.partitions) == (TxnClientState.READY, 1, set())

    # An abortable error: the producer stays usable after abort_transaction().
    tm.begin()
    error = tm.fail(TransactionAbortableError("partition not added"))
    assert isinstance(error, AbortableTransactionError)
    assert isinstance(error.cause, TransactionAbortableError)
    with pytest.raises(AbortableTransactionError, match="abort_transaction"):
        tm.require_open("send()")
    with pytest.raises(TransactionStateError, match="abort_transaction"):
        tm.begin_commit()
    tm.begin_abort()
    tm.completed(7, 2)
    tm.begin()
    # A leader's INVALID_PRODUCER_EPOCH on a write is abortable; PRODUCER_FENCED is fatal.
    assert isinstance(tm.write_failed(InvalidProducerIdMappingError("x")),
                      AbortableTransactionError)
    fatal = tm.fail(ProducerFencedError("a newer instance"))
    assert isinstance(fatal, FatalTransactionError) and tm.state is TxnClientState.FATAL_ERROR
    with pytest.raises(TransactionStateError, match="fatal error"):
        tm.begin_abort()
    assert classify(ConcurrentTransactionsError("x")) == "retry"
    assert classify(InvalidTxnStateError("x")) == "fatal"
    assert classify(TransactionAbortableError("x")) == "abortable"
