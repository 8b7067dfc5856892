"""The exactly-once sink's transactional commit on real brokers over TCP (no Spark):
``TransactionalSinkCommitter`` and CommitStaged version 1.

What must hold: one batch is one transaction across its partitions, so a read_committed
reader sees none of it until EndTxn and all of it after, and the last stable offset
stays at the batch's first offset in between; a re-run of a committed batch appends
nothing; a transaction an earlier driver left open is completed by the next commit of
its batch (partitions that hold the batch answer ``duplicate``, also after a broker
SIGKILL, from the state rebuilt from the log), and an open transaction of another batch
is committed when prepared and aborted when not; a commit inside a transaction needs its
partition added to that transaction.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from strata.client import Admin, Consumer, Producer, TopicPartition
from strata.client.sink import (
    StagedPart,
    StagingWriter,
    TransactionalSinkCommitter,
    TxnCommit,
    commit_staged,
    sink_producer_id,
    sink_transactional_id,
)
from tests.support.broker_process import BrokerProcess
from tests.test_broker_api import create
from wire.errors import TransactionAbortableError
from wire.record_batch import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Parts = dict[TopicPartition, list[StagedPart]]


def _stage(bootstrap: str, topic: str, rows: dict[int, list[bytes]]) -> Parts:
    with StagingWriter(bootstrap) as writer:
        for partition, values in rows.items():
            writer.stage(topic, partition, build_batch(values))
        writer.flush()
        return {tp: [part] for tp, part in writer.parts().items()}


def _rows(batch: int, partitions: int, n: int = 3) -> dict[int, list[bytes]]:
    return {p: [f"b{batch}-p{p}-{i}".encode() for i in range(n)] for p in range(partitions)}


def _read(bootstrap: str, topic: str, partitions: int, *, committed: bool = True,
          settle_s: float = 1.0) -> dict[int, list[bytes]]:
    """Everything a reader at that isolation level gets within ``settle_s``."""
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    level = "read_committed" if committed else "read_uncommitted"
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=level) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=100):
                out[record.partition].append(record.value)
    return out


def _stable(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    with Admin(bootstrap) as admin:
        found = admin.list_offsets({TopicPartition(topic, p): "latest"
                                    for p in range(partitions)},
                                   isolation_level="read_committed")
    return {tp.partition: r.offset for tp, r in found.items()}


def _wait_visible(bootstrap: str, topic: str, partitions: int,
                  expected: dict[int, list[bytes]]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if _read(bootstrap, topic, partitions, settle_s=0.5) == expected:
            return
    assert _read(bootstrap, topic, partitions) == expected


class _Leftover:
    """What an earlier driver that died mid-commit leaves: an open two-phase transaction
    tagged with ``batch_id``, holding the batch in ``partitions`` only (``prepared``:
    tagged as holding every partition). Built from the client's own pieces."""

    def __init__(self, bootstrap: str, sink_id: str, batch_id: int, parts: Parts,
                 done: list[TopicPartition], *, prepared: bool = False,
                 timeout_ms: int = 60_000) -> None:
        producer = Producer(bootstrap, transactional_id=sink_transactional_id(sink_id),
                            transaction_timeout_ms=timeout_ms)
        try:
            producer.init_transactions(two_phase=True, keep_prepared=True)
            producer.begin_transaction()
            txn = producer._sender.transactions
            assert txn is not None
            keys = sorted((tp.topic, tp.partition) for tp in parts)

            async def run() -> None:
                await txn.add_partitions_now(keys, tag=f"batch={batch_id}")
                await commit_staged(producer._sender.cluster, sink_producer_id(sink_id),
                                    batch_id, {tp: parts[tp] for tp in done},
                                    txn=TxnCommit(txn.tm.transactional_id,
                                                  txn.tm.producer_id, txn.tm.producer_epoch))
                if prepared:
                    await txn.add_partitions_now(keys, tag=f"batch={batch_id};prepared")

            producer._thread.run(run(), timeout=60)
        finally:
            producer.close()  # no EndTxn: the "driver" is gone


@pytest.fixture
def topic(broker: BrokerProcess) -> Iterator[str]:
    name = f"stx-{uuid.uuid4().hex[:10]}"
    create(broker, name, 3)
    yield name


def test_a_batch_is_one_transaction_seen_whole_at_read_committed(
        broker: BrokerProcess, topic: str) -> None:
    bootstrap = broker.bootstrap
    rows = _rows(0, 3)
    seen_while_prepared: list[Any] = []

    def check_prepared(batch_id: int) -> None:
        # Phase one is done: every partition holds the batch, none shows it yet.
        seen_while_prepared.append((
            _read(bootstrap, topic, 3), _read(bootstrap, topic, 3, committed=False),
            _stable(bootstrap, topic, 3)))

    with TransactionalSinkCommitter(bootstrap, "q-whole", on_prepared=check_prepared) as c:
        result = c.commit_batch(0, _stage(bootstrap, topic, rows))
        assert c.describe() is not None
    assert result.outcome == "committed" and not result.resumed
    assert not any(r.duplicate for r in result.results.values())
    committed, uncommitted, stable = seen_while_prepared[0]
    assert committed == {0: [], 1: [], 2: []}
    assert uncommitted == rows  # read_uncommitted readers do see an open transaction
    assert stable == {0: 0, 1: 0, 2: 0}  # the LSO stops at the transaction's start
    _wait_visible(bootstrap, topic, 3, rows)

    # Spark re-runs the batch (a crash before its commit log) or calls commit twice:
    # the coordinator's last transaction says it committed; nothing is appended.
    with TransactionalSinkCommitter(bootstrap, "q-whole") as c:
        again = c.commit_batch(0, _stage(bootstrap, topic, rows))
        assert again.outcome == "already-committed" and not again.results
        later = c.commit_batch(1, _stage(bootstrap, topic, _rows(1, 3)))
        assert later.outcome == "committed"
        assert c.commit_batch(0, _stage(bootstrap, topic, rows)).outcome == \
            "already-committed"
        assert c.describe() in (("PrepareCommit", "batch=1;prepared"),
                                ("CompleteCommit", "batch=1;prepared"))
    expected = {p: rows[p] + _rows(1, 3)[p] for p in range(3)}
    _wait_visible(bootstrap, topic, 3, expected)
    assert _read(bootstrap, topic, 3, committed=False) == expected
    # The re-runs' staged files were dropped, not left to expire.
    assert not list(broker.data_dir.glob(f"{topic}-*/staging/*.stage"))


def test_a_batch_left_half_committed_is_resumed_by_the_next_driver(
        broker: BrokerProcess, topic: str) -> None:
    bootstrap = broker.bootstrap
    rows = _rows(4, 3)
    first = _stage(bootstrap, topic, rows)
    done = [TopicPartition(topic, 0)]
    _Leftover(bootstrap, "q-resume", 4, first, done)
    assert _read(bootstrap, topic, 3, settle_s=0.5) == {0: [], 1: [], 2: []}
    assert _stable(bootstrap, topic, 3)[0] == 0  # held back, and no timeout ends it

    # The restarted query re-runs batch 4 (new staging ids) and commits it.
    with TransactionalSinkCommitter(bootstrap, "q-resume") as c:
        result = c.commit_batch(4, _stage(bootstrap, topic, rows))
    assert result.outcome == "committed" and result.resumed
    assert {tp.partition: r.duplicate for tp, r in result.results.items()} == \
        {0: True, 1: False, 2: False}
    _wait_visible(bootstrap, topic, 3, rows)
    assert _read(bootstrap, topic, 3, committed=False) == rows  # once, not twice


@pytest.mark.parametrize("prepared", [False, True])
def test_an_earlier_batch_left_open_is_committed_if_prepared_else_aborted(
        broker: BrokerProcess, topic: str, prepared: bool) -> None:
    bootstrap = broker.bootstrap
    sink = f"q-earlier-{prepared}"
    old = _rows(7, 3)
    staged = _stage(bootstrap, topic, old)
    _Leftover(bootstrap, sink, 7, staged,
              list(staged) if prepared else [TopicPartition(topic, 1)], prepared=prepared)
    new = _rows(8, 3)
    with TransactionalSinkCommitter(bootstrap, sink) as c:
        result = c.commit_batch(8, _stage(bootstrap, topic, new))
    assert result.outcome == "committed" and result.settled == (7, prepared)
    expected = {p: (old[p] if prepared else []) + new[p] for p in range(3)}
    _wait_visible(bootstrap, topic, 3, expected)


def test_an_open_batch_with_nothing_to_commit_again_is_still_ended(
        broker: BrokerProcess, topic: str) -> None:
    """The re-run of a batch may stage nothing (all its rows filtered out): the open
    transaction of that batch must not stay open, holding back every reader."""
    bootstrap = broker.bootstrap
    staged = _stage(bootstrap, topic, _rows(2, 3))
    _Leftover(bootstrap, "q-empty", 2, staged, [TopicPartition(topic, 2)])
    with TransactionalSinkCommitter(bootstrap, "q-empty") as c:
        assert c.commit_batch(2, {}).settled == (2, False)
        # EndTxn is answered once PrepareAbort is durable; the markers follow.
        assert c.describe() in (("PrepareAbort", "batch=2"), ("CompleteAbort", "batch=2"))
        assert c.commit_batch(3, {}).outcome == "nothing"
    deadline = time.monotonic() + 20
    while _stable(bootstrap, topic, 3)[2] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stable(bootstrap, topic, 3)[2] > 0
    assert _read(bootstrap, topic, 3, settle_s=0.5) == {0: [], 1: [], 2: []}


def test_the_transaction_timeout_never_aborts_a_sink_transaction(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """Two-phase: however long the driver takes to come back, its batch is not aborted
    under it (a 1 s transaction timeout, checked every 100 ms, over 3 s)."""
    process = broker_factory(broker_id=52, overrides={
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"})
    create(process, "stx-timeout", 2)
    bootstrap = process.bootstrap
    rows = _rows(5, 2)
    _Leftover(bootstrap, "q-timeout", 5, _stage(bootstrap, "stx-timeout", rows),
              [TopicPartition("stx-timeout", 0)], timeout_ms=1000)
    time.sleep(3)
    with TransactionalSinkCommitter(bootstrap, "q-timeout") as c:
        assert c.describe() == ("Ongoing", "batch=5")
        result = c.commit_batch(5, _stage(bootstrap, "stx-timeout", rows))
    assert result.resumed and result.results[TopicPartition("stx-timeout", 0)].duplicate
    _wait_visible(bootstrap, "stx-timeout", 2, rows)


def test_a_resumed_commit_survives_a_broker_sigkill(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """The partition rebuilds "this transaction holds batch N here" from its log."""
    process = broker_factory(broker_id=51)
    create(process, "stx-sigkill", 2)
    rows = _rows(9, 2)
    staged = _stage(process.bootstrap, "stx-sigkill", rows)
    _Leftover(process.bootstrap, "q-kill", 9, staged, [TopicPartition("stx-sigkill", 0)])
    process.kill()
    process.start()
    bootstrap = process.bootstrap
    with TransactionalSinkCommitter(bootstrap, "q-kill") as c:
        result = c.commit_batch(9, _stage(bootstrap, "stx-sigkill", rows))
    assert result.resumed and {tp.partition: r.duplicate
                               for tp, r in result.results.items()} == {0: True, 1: False}
    _wait_visible(bootstrap, "stx-sigkill", 2, rows)
    assert _read(bootstrap, "stx-sigkill", 2, committed=False) == rows


def test_a_commit_in_a_transaction_needs_its_partition_added(
        broker: BrokerProcess, topic: str) -> None:
    bootstrap = broker.bootstrap
    staged = _stage(bootstrap, topic, {0: [b"x"], 1: [b"y"]})
    producer = Producer(bootstrap, transactional_id="stx-not-added")
    try:
        producer.init_transactions(two_phase=True)
        producer.begin_transaction()
        txn = producer._sender.transactions
        assert txn is not None

        async def run() -> Any:
            await txn.add_partitions_now([(topic, 0)], tag="batch=0")
            return await commit_staged(
                producer._sender.cluster, sink_producer_id("not-added"), 0, staged,
                txn=TxnCommit("stx-not-added", txn.tm.producer_id, txn.tm.producer_epoch))

        with pytest.raises(TransactionAbortableError, match="not added"):
            producer._thread.run(run(), timeout=60)
        producer.abort_transaction()
    finally:
        producer.close()
    assert _read(bootstrap, topic, 3, committed=False, settle_s=0.5)[1] == []
