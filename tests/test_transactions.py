"""Transactions on a real three-broker cluster (docs/transactions.md): the client API, the
broker's coordinator and partitions, and the defences of KIP-890, over TCP.

Each test uses topics of its own on one module-wide cluster (RF 3, min ISR 2). Raw
protocol requests are used where a well-behaved client never sends what is tested (a
transactional batch to a partition not in the transaction, a delayed EndTxn).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from strata.client import (
    AbortableTransactionError,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    FatalTransactionError,
    Producer,
    TopicPartition,
    TransactionStateError,
)
from tests.support.cluster import Cluster
from tests.support.reading import read_for
from tests.support.waiting import wait_for
from wire.connection import BrokerConnection
from wire.errors import ProducerFencedError, TransactionAbortableError
from wire.protocol import (
    AddPartitionsToTxnRequest,
    ApiKey,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    EndTxnRequest,
    FindCoordinatorRequest,
    InitProducerIdRequest,
    ListTransactionsRequest,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    TxnTopic,
)
from wire.record_batch import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_names = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("txn"), 3, overrides={
            "offsets.topic.num.partitions": "2",
            "transaction.state.log.num.partitions": "2",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
            "transaction.max.timeout.ms": "600000"}) as c:
        yield c


@pytest.fixture
def topic(cluster: Cluster) -> str:
    name = f"txn-{next(_names)}"
    cluster.create_topic(name, 3, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy(name, timeout=60)
    return name


def read(bootstrap: str, topic: str, isolation: str, *, partitions: int = 3,
         seconds: float = 3.0) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record a fresh consumer reads in ``seconds``."""
    return sorted(read_for(bootstrap, topic, partitions, isolation, seconds))


def values(records: list[tuple[int, int, bytes]]) -> list[bytes]:
    return sorted(v for _, _, v in records)


async def _request(bootstrap: str, api: ApiKey, body: Any, *, version: int = 0,
                   address: tuple[str, int] | None = None) -> Any:
    host, port = address or bootstrap.split(",")[0].split(":")
    connection = BrokerConnection(host, int(port))
    try:
        await connection.connect(timeout=10)
        return await connection.request(api, body, version=version)
    finally:
        await connection.close()


def request(bootstrap: str, api: ApiKey, body: Any, **kwargs: Any) -> Any:
    return asyncio.run(_request(bootstrap, api, body, **kwargs))


def coordinator_of(bootstrap: str, transactional_id: str) -> tuple[str, int]:
    answer = wait_for("the transaction coordinator", lambda: request(
        bootstrap, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(transactional_id, 1),
        version=1), lambda a: a.error_code == 0, 30)
    return answer.host, answer.port


# ----------------------------------------------------------------------------- visibility


def test_a_transaction_is_visible_all_at_once_or_never(cluster: Cluster, topic: str) -> None:
    with Producer(cluster.bootstrap, transactional_id=f"vis-{uuid.uuid4().hex}") as p:
        p.init_transactions()
        with p.transaction():
            for i in range(9):
                p.send(topic, f"c{i}".encode(), partition=i % 3)
        p.begin_transaction()
        for i in range(6):
            p.send(topic, f"a{i}".encode(), partition=i % 3)
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send(topic, b"last", partition=1)
        p.commit_transaction()
    committed = read(cluster.bootstrap, topic, "read_committed")
    assert values(committed) == sorted([f"c{i}".encode() for i in range(9)] + [b"last"])
    everything = read(cluster.bootstrap, topic, "read_uncommitted")
    # The aborted records are in the log (read_uncommitted sees them); markers never are.
    assert len(everything) == 16 and b"a0" in values(everything)
    offsets = {(p, o) for p, o, _ in everything}
    assert len(offsets) == 16  # each an offset of its own; markers' offsets have no row


def test_read_committed_never_passes_an_open_transaction(cluster: Cluster,
                                                        topic: str) -> None:
    """The last stable offset: records after an open transaction's first offset wait,
    even plain ones, until it ends; then all arrive in order."""
    txn = Producer(cluster.bootstrap, transactional_id=f"lso-{uuid.uuid4().hex}")
    try:
        txn.init_transactions()
        txn.begin_transaction()
        txn.send(topic, b"in-txn", partition=0)
        txn.flush()
        with Producer(cluster.bootstrap) as plain:
            plain.send(topic, b"after", partition=0).result()
        with Consumer(cluster.bootstrap, isolation_level="read_committed",
                      auto_offset_reset="earliest") as c:
            c.assign([TopicPartition(topic, 0)])
            got: list[bytes] = []
            end = time.monotonic() + 2
            while time.monotonic() < end:
                got += [r.value or b"" for r in c.poll(timeout_ms=200)]
            assert got == []
            tp = TopicPartition(topic, 0)
            for isolation, end_offset in (("read_committed", 0), ("read_uncommitted", 2)):
                # The end a consumer seeks to is the last stable offset at read_committed.
                with Consumer(cluster.bootstrap, isolation_level=isolation) as probe:
                    probe.assign([tp])
                    assert probe.seek_to_end([tp]) == {tp: end_offset}, isolation
            txn.commit_transaction()
            end = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < end:
                got += [r.value or b"" for r in c.poll(timeout_ms=200)]
            assert got == [b"in-txn", b"after"]
        assert values(read(cluster.bootstrap, topic, "read_uncommitted",
                           partitions=1)) == [b"after", b"in-txn"]
    finally:
        txn.close()


def test_the_async_face_commits_and_aborts(cluster: Cluster, topic: str) -> None:
    async def run() -> None:
        async with AsyncProducer(cluster.bootstrap,
                                 transactional_id=f"async-{uuid.uuid4().hex}") as p:
            await p.init_transactions()
            async with p.transaction():
                await p.send(topic, b"kept", partition=2)
            with pytest.raises(RuntimeError, match="boom"):
                async with p.transaction():
                    await p.send(topic, b"dropped", partition=2)
                    raise RuntimeError("boom")
        async with AsyncConsumer(cluster.bootstrap, isolation_level="read_committed",
                                 auto_offset_reset="earliest") as c:
            c.assign([TopicPartition(topic, 2)])
            got: list[bytes] = []
            end = time.monotonic() + 3
            while time.monotonic() < end:
                got += [r.value or b"" for r in await c.poll(timeout_ms=200)]
            assert got == [b"kept"]

    asyncio.run(run())


# ----------------------------------------------------------------------------- fencing


def test_a_new_producer_fences_the_zombie_and_aborts_its_transaction(
        cluster: Cluster, topic: str) -> None:
    txn_id = f"zombie-{uuid.uuid4().hex}"
    zombie = Producer(cluster.bootstrap, transactional_id=txn_id)
    successor = Producer(cluster.bootstrap, transactional_id=txn_id)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, b"zombie", partition=0)
        zombie.flush()
        successor.init_transactions()  # fences the zombie, aborts its transaction
        with pytest.raises(FatalTransactionError) as fenced:
            zombie.commit_transaction()
        assert isinstance(fenced.value.cause, ProducerFencedError)
        with pytest.raises(TransactionStateError, match="fatal"):
            zombie.begin_transaction()
        with successor.transaction():
            successor.send(topic, b"successor", partition=0)
    finally:
        zombie.close()  # a fenced producer still closes cleanly: nothing was left unsent
        successor.close()
    assert values(read(cluster.bootstrap, topic, "read_committed")) == [b"successor"]


def test_a_transaction_left_open_past_its_timeout_is_aborted(cluster: Cluster,
                                                            topic: str) -> None:
    p = Producer(cluster.bootstrap, transactional_id=f"slow-{uuid.uuid4().hex}",
                 transaction_timeout_ms=1000)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"too-slow", partition=1)
        p.flush()
        time.sleep(3)  # the coordinator aborts it (checks every 200 ms here)
        with pytest.raises(FatalTransactionError) as late:
            p.commit_transaction()
        assert late.value.cause is not None and late.value.cause.name == "PRODUCER_FENCED"
    finally:
        p.close()
    assert read(cluster.bootstrap, topic, "read_committed") == []


def test_bad_settings_and_calls_are_refused_before_anything_is_sent(
        cluster: Cluster, topic: str) -> None:
    for options, words in (({"acks": 1}, "acks='all'"),
                           ({"enable_idempotence": False}, "idempotent"),
                           ({"transaction_timeout_ms": 0}, "transaction_timeout_ms")):
        with pytest.raises(ValueError, match=words):
            Producer(cluster.bootstrap, transactional_id="bad", **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transactional_id"):
        Producer(cluster.bootstrap, transactional_id=" ")
    with Producer(cluster.bootstrap, transactional_id=f"calls-{uuid.uuid4().hex}",
                  transaction_timeout_ms=3_600_000) as p:
        with pytest.raises(TransactionStateError, match="init_transactions"):
            p.begin_transaction()
        with pytest.raises(FatalTransactionError, match="INVALID_TRANSACTION_TIMEOUT"):
            p.init_transactions()  # 1 h is above this cluster's 10 min maximum
    with Producer(cluster.bootstrap, transactional_id=f"calls2-{uuid.uuid4().hex}") as p:
        p.init_transactions()
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            p.send(topic, b"x", partition=0)
        with pytest.raises(TransactionStateError, match="commit_transaction"):
            p.commit_transaction()
    with Producer(cluster.bootstrap) as plain, pytest.raises(TransactionStateError,
                                                              match="no transactional_id"):
        plain.begin_transaction()


# ----------------------------------------------------------------------------- KIP-890


def test_a_leader_refuses_a_transactional_write_to_a_partition_not_added(
        cluster: Cluster, topic: str) -> None:
    """KIP-890 part 1: the first transactional batch of a producer in a partition is
    verified with the coordinator; one that was never added is refused, nothing
    written (a hanging transaction cannot start that way)."""
    txn_id = f"verify-{uuid.uuid4().hex}"
    init = request(cluster.bootstrap, ApiKey.INIT_PRODUCER_ID,
                   InitProducerIdRequest(txn_id, 60_000), version=1,
                   address=coordinator_of(cluster.bootstrap, txn_id))
    assert init.error_code == 0
    leader = cluster.brokers[cluster.leader_of(topic, 0)]
    batch = build_batch([b"sneaky"], producer_id=init.producer_id,
                        producer_epoch=init.producer_epoch, base_sequence=0,
                        transactional=True)
    answer = request(cluster.bootstrap, ApiKey.PRODUCE, ProduceRequest(
        -1, 10_000, [ProduceTopic(topic, [ProducePartition(0, batch)])], txn_id),
        version=1, address=("127.0.0.1", leader.port))
    result = answer.topics[0].partitions[0]
    assert result.error_code == TransactionAbortableError.code, result
    assert "not added" in (result.error_message or "")
    assert read(cluster.bootstrap, topic, "read_uncommitted", partitions=1) == []


def test_a_delayed_end_txn_cannot_end_the_next_transaction(cluster: Cluster,
                                                           topic: str) -> None:
    """KAFKA-17754 / Jepsen Bufstream 0.1: transaction N's EndTxn, held back until N+1
    has begun, must neither commit nor abort N+1. With the epoch bumped at every EndTxn
    it is refused (PRODUCER_FENCED), and N+1 commits as its producer decides."""
    txn_id = f"delayed-{uuid.uuid4().hex}"
    address = coordinator_of(cluster.bootstrap, txn_id)
    with Producer(cluster.bootstrap, transactional_id=txn_id) as p:
        p.init_transactions()
        assert p._sender.transactions is not None
        tm = p._sender.transactions.tm
        with p.transaction():
            p.send(topic, b"n", partition=0)
        old_id, old_epoch = tm.producer_id, tm.producer_epoch - 1  # N's epoch
        p.begin_transaction()
        p.send(topic, b"n+1", partition=1)
        p.flush()
        late = request(cluster.bootstrap, ApiKey.END_TXN,
                       EndTxnRequest(txn_id, old_id, old_epoch, False), address=address)
        assert late.error_code in (ProducerFencedError.code, 0), late
        if late.error_code == 0:  # answered as a retry of N's commit: changes nothing
            assert late.producer_epoch == tm.producer_epoch
        described = request(cluster.bootstrap, ApiKey.DESCRIBE_TRANSACTIONS,
                            DescribeTransactionsRequest([txn_id]), address=address)
        assert described.transactions[0].state == "Ongoing"
        p.commit_transaction()
    assert values(read(cluster.bootstrap, topic, "read_committed")) == [b"n", b"n+1"]


def test_the_next_transaction_is_not_sent_back_while_the_last_one_completes(
        cluster: Cluster, topic: str) -> None:
    """EndTxn is answered once PREPARE_COMMIT is durable; the markers follow. The next
    transaction's first AddPartitionsToTxn, sent the moment EndTxn answered, waits at the
    coordinator until the markers are written instead of getting
    CONCURRENT_TRANSACTIONS (Kafka's answer, which costs its clients a 20 ms back-off
    every transaction). On one connection, ten transactions back to back."""
    txn_id = f"settle-{uuid.uuid4().hex}"
    address = coordinator_of(cluster.bootstrap, txn_id)

    async def run() -> list[tuple[int, int]]:
        connection = BrokerConnection(*address)
        await connection.connect(timeout=10)
        try:
            init = await connection.request(ApiKey.INIT_PRODUCER_ID,
                                            InitProducerIdRequest(txn_id, 60_000), version=1)
            assert init.error_code == 0, init
            pid, epoch = init.producer_id, init.producer_epoch
            codes: list[tuple[int, int]] = []
            for _ in range(10):
                added = await connection.request(ApiKey.ADD_PARTITIONS_TO_TXN,
                                                 AddPartitionsToTxnRequest(
                                                     txn_id, pid, epoch,
                                                     [TxnTopic(topic, [0, 1, 2])]))
                ended = await connection.request(ApiKey.END_TXN,
                                                 EndTxnRequest(txn_id, pid, epoch, True))
                codes.append((max(r.error_code for t in added.topics for r in t.partitions),
                              ended.error_code))
                pid, epoch = ended.producer_id, ended.producer_epoch
            return codes
        finally:
            await connection.close()

    assert asyncio.run(run()) == [(0, 0)] * 10


def _ids_by_owner(bootstrap: str, address: tuple[str, int]) -> tuple[str, str]:
    """Two never-used transactional ids: one ``address`` coordinates, one it does not."""
    owned = foreign = ""
    for i in range(200):
        candidate = f"never-used-{uuid.uuid4().hex}-{i}"
        if coordinator_of(bootstrap, candidate) == address:
            owned = owned or candidate
        else:
            foreign = foreign or candidate
        if owned and foreign:
            return owned, foreign
    raise AssertionError("200 ids did not spread over the coordinators")


def test_describe_list_and_producers(cluster: Cluster, topic: str) -> None:
    txn_id = f"describe-{uuid.uuid4().hex}"
    with Producer(cluster.bootstrap, transactional_id=txn_id) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"open", partition=2)
        p.flush()
        address = coordinator_of(cluster.bootstrap, txn_id)
        # An id this coordinator owns but never saw, and one it does not own.
        owned, foreign = _ids_by_owner(cluster.bootstrap, address)
        described = request(cluster.bootstrap, ApiKey.DESCRIBE_TRANSACTIONS,
                            DescribeTransactionsRequest([txn_id, owned, foreign]),
                            address=address).transactions
        assert described[0].state == "Ongoing"
        assert [(t.name, t.partitions) for t in described[0].topics] == [(topic, [2])]
        assert described[1].error_code == 105  # TRANSACTIONAL_ID_NOT_FOUND
        assert described[2].error_code == 16  # NOT_COORDINATOR: ask FindCoordinator
        listed = request(cluster.bootstrap, ApiKey.LIST_TRANSACTIONS,
                         ListTransactionsRequest(["Ongoing"]), address=address)
        assert txn_id in {t.transactional_id for t in listed.transactions}
        leader = cluster.brokers[cluster.leader_of(topic, 2)]
        producers = request(cluster.bootstrap, ApiKey.DESCRIBE_PRODUCERS,
                            DescribeProducersRequest([TxnTopic(topic, [2])]),
                            address=("127.0.0.1", leader.port))
        active = producers.topics[0].partitions[0].producers
        assert [a.current_txn_start_offset for a in active] == [0]
        p.commit_transaction()
        # verify-only asked by a client is a broker's request: CLUSTER_ACTION is fine
        # here (no ACLs), and the answer says the partition is not in an open one.
        verified = request(cluster.bootstrap, ApiKey.ADD_PARTITIONS_TO_TXN,
                           AddPartitionsToTxnRequest(txn_id, described[0].producer_id,
                                                     described[0].producer_epoch,
                                                     [TxnTopic(topic, [2])],
                                                     verify_only=True), address=address)
        assert verified.topics[0].partitions[0].error_code != 0


# ----------------------------------------------------------------------------- offsets


def test_consume_transform_produce_commits_offsets_with_the_output(
        cluster: Cluster, topic: str) -> None:
    source = f"{topic}-in"
    cluster.create_topic(source, 2, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy(source, timeout=60)
    with Producer(cluster.bootstrap) as plain:
        for i in range(10):
            plain.send(source, f"i{i}".encode(), partition=i % 2)
        plain.flush()
    group = f"ctp-{uuid.uuid4().hex}"
    consumer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False,
                        auto_offset_reset="earliest", isolation_level="read_committed")
    producer = Producer(cluster.bootstrap, transactional_id=f"{group}-out")
    try:
        consumer.subscribe([source])
        producer.init_transactions()
        done = 0
        aborted_once = False
        deadline = time.monotonic() + 60
        while done < 10 and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=300)
            if not records:
                continue
            producer.begin_transaction()
            for r in records:
                producer.send(topic, (r.value or b"").upper(), partition=r.partition)
            producer.send_offsets_to_transaction(
                {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records},
                consumer.group_metadata())
            if not aborted_once:
                aborted_once = True
                producer.abort_transaction()  # neither the output nor the offsets stay
                for tp in {TopicPartition(r.topic, r.partition) for r in records}:
                    consumer.seek(tp, min(r.offset for r in records if r.partition ==
                                          tp.partition))
                continue
            producer.commit_transaction()
            done += len(records)
        assert done == 10
        committed = consumer.committed([TopicPartition(source, 0), TopicPartition(source, 1)])
        assert committed == {TopicPartition(source, 0): 5, TopicPartition(source, 1): 5}
    finally:
        consumer.close()
        producer.close()
    assert values(read(cluster.bootstrap, topic, "read_committed")) == \
        sorted(f"I{i}".encode() for i in range(10))


def test_offsets_of_a_member_that_left_are_refused(cluster: Cluster, topic: str) -> None:
    """KIP-447: the group coordinator checks a transaction's offsets like a member's
    commit; a member that is no longer in the group cannot commit them."""
    group = f"zombie-member-{uuid.uuid4().hex}"
    consumer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False,
                        auto_offset_reset="earliest")
    producer = Producer(cluster.bootstrap, transactional_id=f"{group}-out")
    try:
        consumer.subscribe([topic])
        wait_for("an assignment", lambda: (consumer.poll(timeout_ms=100),
                                           consumer.assignment())[1], bool, 30)
        metadata = consumer.group_metadata()
        assert metadata.member_id is not None
        consumer.unsubscribe()  # it leaves: its member id is gone
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(AbortableTransactionError, match="UNKNOWN_MEMBER_ID"):
            producer.send_offsets_to_transaction({TopicPartition(topic, 0): 3}, metadata)
        producer.abort_transaction()
    finally:
        consumer.close()
        producer.close()


# ----------------------------------------------------------------------------- restarts


def test_aborted_data_and_open_transactions_survive_a_broker_restart(
        cluster: Cluster, topic: str) -> None:
    """The aborted-transaction index and the producer state (open transactions) are
    rebuilt from the log after a SIGKILL: read_committed still skips the aborted batch
    and still stops at the open transaction's first offset on the new leader."""
    with Producer(cluster.bootstrap, transactional_id=f"restart-a-{uuid.uuid4().hex}") as a:
        a.init_transactions()
        a.begin_transaction()
        a.send(topic, b"aborted", partition=0)
        a.flush()
        a.abort_transaction()
        with a.transaction():
            a.send(topic, b"committed", partition=0)
    opener = Producer(cluster.bootstrap, transactional_id=f"restart-o-{uuid.uuid4().hex}")
    try:
        opener.init_transactions()
        opener.begin_transaction()
        opener.send(topic, b"open", partition=0)
        opener.flush()
        leader = cluster.leader_of(topic, 0)
        cluster.kill(leader)
        cluster.restart(leader)
        cluster.wait_until_healthy(topic, timeout=90)
        assert values(read(cluster.bootstrap, topic, "read_committed",
                           partitions=1)) == [b"committed"]
        opener.commit_transaction()
    finally:
        opener.close()
    assert values(read(cluster.bootstrap, topic, "read_committed",
                       partitions=1)) == [b"committed", b"open"]
