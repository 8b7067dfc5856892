"""The transactions admin API (``Admin.describe_transactions``, ``list_transactions``,
``describe_producers``, ``abort_transaction``, ``find_hanging``) and the ``strata
transactions`` / ``strata consume --isolation-level`` commands, against a real broker
over TCP (docs/transactions.md).

Argument checks run in process, with no broker. The rest runs on the module's broker,
each test with topics and transactional ids of its own. The last test makes a hanging
transaction honestly: a transactional producer leaves a transaction open, the broker is
stopped, the ``__transaction_state`` partition that coordinates its id is lost (its
directory removed: the coordinator's disk for that partition died), and the broker
starts again. The data partition still holds the open transaction (its producer state is
rebuilt from the log), but no coordinator knows it any more, so nothing will ever end it:
read_committed readers are stuck behind it until ``strata transactions abort``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from brokers.transaction_coordinator import TXN_TOPIC, txn_partition
from strata.client import (
    Admin,
    InvalidTxnStateError,
    NewTopic,
    Producer,
    TopicPartition,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
)
from strata_tools.cli import main
from tests.support.broker_process import BrokerProcess
from tests.support.reading import read_for
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[1]
#: The brokers' default transaction.state.log.num.partitions.
TXN_PARTITIONS = 8


def strata(broker: BrokerProcess | None, *args: str, timeout: float = 120
           ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("STRATA_BOOTSTRAP", None)
    if broker is not None:
        env["STRATA_BOOTSTRAP"] = broker.bootstrap
    return subprocess.run([sys.executable, "-m", "strata_tools.cli", *args],
                          capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def fails(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic(admin: Admin, partitions: int = 2) -> str:
    name = _name("txn-cli")
    admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def _read(bootstrap: str, topic: str, isolation: str, partitions: int = 1,
          seconds: float = 2.0) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of what a fresh consumer reads in ``seconds``."""
    return sorted(read_for(bootstrap, topic, partitions, isolation, seconds))


# ----------------------------------------------------------------------------- no broker


@pytest.mark.parametrize(("argv", "words"), [
    (["transactions", "describe", " "], "transactional id is empty"),
    (["transactions", "describe-producers", "--topic", "t", "--partition", "-1"],
     "--partition expects a partition number"),
    (["transactions", "describe-producers", "--topic", "", "--partition", "0"],
     "--topic is empty"),
    (["transactions", "abort", "--topic", "t", "--partition", "0", "--start-offset", "-5"],
     "--start-offset expects the transaction's first offset"),
    (["transactions", "abort", "--topic", "t", "--partition", "x", "--start-offset", "5"],
     "--partition expects a partition number"),
    (["transactions", "find-hanging", "--partition", "0"], "--partition needs --topic"),
    (["transactions", "find-hanging", "--topic", "t", "--max-transaction-timeout", "1.5"],
     "--max-transaction-timeout expects minutes"),
    (["transactions", "list", "--state", "Sleeping"], "use one of Empty, Ongoing"),
    (["transactions", "list", "--producer-id", "-2"], "--producer-id expects a producer id"),
    (["transactions", "list", "--duration-filter", "soon"],
     "--duration-filter expects milliseconds"),
    (["acl", "add", "--allow-principal", "User:a", "--operation", "READ",
      "--transactional-id", "orders"], "use WRITE, DESCRIBE, ALL"),
    (["acl", "remove", "--allow-principal", "User:a", "--operation", "ALTER",
      "--transactional-id", "orders"], "does not apply to a transactional id"),
    (["transactions", "list"], "no brokers given"),
])
def test_bad_input_is_refused_before_anything_is_sent(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATA_BOOTSTRAP", raising=False)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err
    assert err.startswith("strata: error: ")


@pytest.mark.parametrize("argv", [
    ["transactions"],
    ["transactions", "describe"],
    ["transactions", "abort", "--topic", "t", "--partition", "0"],  # no --start-offset
    ["transactions", "describe-producers", "--topic", "t"],  # no --partition
    ["consume", "t", "--isolation-level", "serializable"],
    ["acl", "add", "--transactional-id", "a", "--cluster", "--operation", "WRITE"],
])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    capsys.readouterr()


# ----------------------------------------------------------------------------- the admin API


def test_admin_describes_lists_and_sees_the_producers_of_an_open_transaction(
        broker: BrokerProcess, admin: Admin) -> None:
    topic = _topic(admin)
    txn_id = _name("admin-open")
    with Producer(broker.bootstrap) as plain:
        plain.send(topic, b"before", partition=0).result(timeout=30)
    with Producer(broker.bootstrap, transactional_id=txn_id,
                  transaction_timeout_ms=300_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"open-0", partition=0)
        producer.send(topic, b"open-1", partition=1)
        producer.flush()

        described = admin.describe_transactions([txn_id])[txn_id]
        assert described.state == "Ongoing"
        assert described.partitions == (TopicPartition(topic, 0), TopicPartition(topic, 1))
        assert described.timeout_ms == 300_000 and described.start_ms is not None
        assert described.coordinator == 0 and not described.two_phase
        pid, epoch = described.producer_id, described.producer_epoch

        listed = {t.transactional_id: t for t in admin.list_transactions()}
        assert listed[txn_id].state == "Ongoing" and listed[txn_id].producer_id == pid
        assert listed[txn_id].coordinator == 0
        assert [t.transactional_id for t in admin.list_transactions(producer_ids=[pid])] \
            == [txn_id]
        assert txn_id in {t.transactional_id for t in admin.list_transactions(["Ongoing"])}
        assert txn_id not in {t.transactional_id
                              for t in admin.list_transactions(["CompleteCommit"])}
        assert txn_id in {t.transactional_id
                          for t in admin.list_transactions(duration_ms=0)}
        assert txn_id not in {t.transactional_id
                              for t in admin.list_transactions(duration_ms=3_600_000)}

        producers = admin.describe_producers(topic, 0)
        mine = [p for p in producers if p.producer_id == pid]
        assert len(mine) == 1 and mine[0].current_txn_start_offset == 1  # after "before"
        assert mine[0].producer_epoch == epoch and mine[0].coordinator_epoch == -1
        # An open transaction its coordinator tracks is not hanging, however old.
        assert admin.find_hanging([topic], max_transaction_timeout_ms=0) == []

        # No transaction starts at offset 0 (a plain record): refused, nothing written.
        with pytest.raises(InvalidTxnStateError, match="open ones start at 1"):
            admin.abort_transaction(topic, 0, 0)
        producer.commit_transaction()

    # commit_transaction returns once PrepareCommit is durable; the markers follow.
    after = wait_for("the commit to complete",
                     lambda: admin.describe_transactions([txn_id])[txn_id],
                     lambda d: d.state != "PrepareCommit", 30)
    assert after.state == "CompleteCommit" and after.partitions == ()
    assert after.producer_epoch == epoch + 1  # KIP-890: bumped at every EndTxn
    ended = [p for p in admin.describe_producers(topic, 0) if p.producer_id == pid]
    assert ended[0].current_txn_start_offset is None and ended[0].coordinator_epoch >= 0
    assert [v for _, _, v in _read(broker.bootstrap, topic, "read_committed")] == \
        [b"before", b"open-0"]

    with pytest.raises(TransactionalIdNotFoundError, match="never used, or expired"):
        admin.describe_transactions([_name("never-used")])
    with pytest.raises(UnknownTopicOrPartitionError, match=r"partitions 0\.\.1"):
        admin.describe_producers(topic, 5)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_producers(_name("no-such-topic"), 0)
    with pytest.raises(ValueError, match="not valid"):
        admin.list_transactions(["Running"])


# ----------------------------------------------------------------------------- the CLI


def test_transactions_list_describe_and_describe_producers_commands(
        broker: BrokerProcess, admin: Admin) -> None:
    topic = _topic(admin, partitions=1)
    txn_id = _name("cli-open")
    with Producer(broker.bootstrap, transactional_id=txn_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"x", partition=0)
        producer.flush()

        text = ok(strata(broker, "transactions", "list"))
        header, *rows = text.splitlines()
        assert header.split() == ["TransactionalId", "Coordinator", "ProducerId",
                                  "TransactionState"]
        mine = [r.split() for r in rows if r.split()[0] == txn_id]
        assert mine and mine[0][1] == "0" and mine[0][3] == "Ongoing"
        pid = int(mine[0][2])
        listed = json.loads(ok(strata(broker, "transactions", "list", "--state", "ongoing",
                                      "--producer-id", str(pid), "--format", "json")))
        assert listed == [{"transactional_id": txn_id, "coordinator": 0, "producer_id": pid,
                           "state": "Ongoing"}]

        text = ok(strata(broker, "transactions", "describe", txn_id))
        header, row = text.splitlines()
        assert header.split() == [
            "CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
            "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
            "TransactionDurationMs", "TopicPartitions", "TwoPhase", "Tag"]
        cells = row.split()
        assert cells[1] == txn_id and cells[4] == "Ongoing" and cells[8] == f"{topic}-0"
        described = json.loads(ok(strata(broker, "transactions", "describe", txn_id,
                                          "--format", "json")))
        assert described["state"] == "Ongoing" and described["producer_id"] == pid
        assert described["partitions"] == [{"topic": topic, "partition": 0}]
        assert described["duration_ms"] >= 0 and described["tag"] is None

        text = ok(strata(broker, "transactions", "describe-producers", "--topic", topic,
                         "--partition", "0"))
        header, row = text.splitlines()
        assert header.split() == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch",
                                  "LastSequence", "LastTimestamp",
                                  "CurrentTransactionStartOffset"]
        assert row.split()[0] == str(pid) and row.split()[-1] == "0"
        producers = json.loads(ok(strata(broker, "transactions", "describe-producers",
                                         "--topic", topic, "--partition", "0",
                                         "--format", "json")))
        assert producers[0]["current_txn_start_offset"] == 0
        # Not hanging: its coordinator has the partition in the open transaction.
        assert json.loads(ok(strata(broker, "transactions", "find-hanging", "--topic", topic,
                                    "--max-transaction-timeout", "0", "--format",
                                    "json"))) == []
        producer.commit_transaction()

    # Bad input that needs the cluster to tell: refused before anything is written.
    fails(strata(broker, "transactions", "describe", _name("never-used")),
          "TRANSACTIONAL_ID_NOT_FOUND", "strata transactions list")
    fails(strata(broker, "transactions", "describe-producers", "--topic", topic,
                 "--partition", "3"), "UNKNOWN_TOPIC_OR_PARTITION", "partitions 0..0")
    fails(strata(broker, "transactions", "describe-producers", "--topic", _name("nope"),
                 "--partition", "0"), "UNKNOWN_TOPIC_OR_PARTITION", "strata topic list")
    fails(strata(broker, "transactions", "abort", "--topic", topic, "--partition", "0",
                 "--start-offset", "0"), "INVALID_TXN_STATE",
          "no open transaction starts at offset 0", "describe-producers", "Nothing was written")
    ended = json.loads(ok(strata(broker, "transactions", "describe-producers", "--topic",
                                 topic, "--partition", "0", "--format", "json")))
    assert ended[0]["current_txn_start_offset"] is None


def test_consume_read_committed_skips_aborted_records(broker: BrokerProcess,
                                                      admin: Admin) -> None:
    topic = _topic(admin, partitions=1)
    with Producer(broker.bootstrap, transactional_id=_name("cli-consume")) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send(topic, b"c1", partition=0)
        producer.begin_transaction()
        producer.send(topic, b"aborted", partition=0)
        producer.flush()
        producer.abort_transaction()
        with producer.transaction():
            producer.send(topic, b"c2", partition=0)

    def consume(*extra: str, timeout_ms: int = 1500) -> list[dict[str, object]]:
        out = ok(strata(broker, "consume", topic, "--from-beginning", "--timeout-ms",
                        str(timeout_ms), "--format", "json", *extra))
        return [json.loads(line) for line in out.splitlines()]

    committed = consume("--isolation-level", "read_committed")
    assert [r["value"] for r in committed] == ["c1", "c2"]
    # Offsets have gaps: the aborted record and the markers keep theirs.
    assert [r["offset"] for r in committed] == [0, 4]
    everything = consume()  # read_uncommitted, Kafka's default
    assert [r["value"] for r in everything] == ["c1", "aborted", "c2"]
    assert [r["value"] for r in consume("--isolation-level", "read_uncommitted")] == \
        ["c1", "aborted", "c2"]
    # A group member at read_committed too. Its polls wait out the group join too, which
    # takes seconds on a busy machine (as with Kafka's console consumer, whose timeout
    # also covers the join): it stops at the second record, or after 30 s of silence.
    group = _name("cli-rc-group")
    member = consume("--group", group, "--isolation-level", "read_committed", "-n", "2",
                     timeout_ms=30_000)
    assert [r["value"] for r in member] == ["c1", "c2"]


# ----------------------------------------------------------------------------- hanging


def test_find_hanging_finds_a_transaction_its_coordinator_lost_and_abort_ends_it(
        broker: BrokerProcess) -> None:
    """Last in the module: it restarts the module's broker (twice)."""
    with Admin(broker.bootstrap) as admin:
        topic = _topic(admin, partitions=2)
    txn_id = _name("lost")
    producer = Producer(broker.bootstrap, transactional_id=txn_id,
                        transaction_timeout_ms=600_000)
    try:
        producer.init_transactions()
        with producer.transaction():
            producer.send(topic, b"committed", partition=0)
        producer.begin_transaction()
        producer.send(topic, b"hanging", partition=0)
        producer.send(topic, b"open-1", partition=1)
        producer.flush()
    finally:
        producer.close()  # the transaction stays open: close() does not end it
    with Producer(broker.bootstrap) as plain:  # behind the open transaction
        plain.send(topic, b"later", partition=0).result(timeout=30)

    # A restart with the coordinator's state intact: the new coordinator lists the open
    # transaction without any client asking for its id first, so nothing is "hanging".
    broker.stop()
    broker.restart()
    with Admin(broker.bootstrap) as admin:
        assert admin.find_hanging([topic], max_transaction_timeout_ms=0) == []
        assert [t.state for t in admin.list_transactions()
                if t.transactional_id == txn_id] == ["Ongoing"]

    # The coordinator's disk for that id's __transaction_state partition is lost.
    broker.stop()
    lost = broker.data_dir / f"{TXN_TOPIC}-{txn_partition(txn_id, TXN_PARTITIONS)}"
    assert lost.is_dir(), sorted(p.name for p in broker.data_dir.iterdir())
    shutil.rmtree(lost)
    broker.restart()

    with Admin(broker.bootstrap) as admin:
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions([txn_id])
        # Stuck: "later" is committed but sits behind the open transaction's first offset.
        assert [v for _, _, v in _read(broker.bootstrap, topic, "read_committed")] == \
            [b"committed"]
        hanging = admin.find_hanging([topic], max_transaction_timeout_ms=0)
        assert [(h.partition, h.start_offset, h.transactional_id) for h in hanging] == \
            [(0, 2, None), (1, 0, None)]
        assert "no coordinator holds producer id" in hanging[0].reason
        # Only candidates older than the timeout: with Kafka's 15 minutes, none yet.
        assert admin.find_hanging([topic]) == []

    text = ok(strata(broker, "transactions", "find-hanging", "--topic", topic,
                     "--max-transaction-timeout", "0"))
    header, *rows = text.splitlines()
    assert header.split()[:8] == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                  "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                  "Duration(min)"]
    assert [[*r.split()[:2], r.split()[5]] for r in rows[:2]] == \
        [[topic, "0", "2"], [topic, "1", "0"]]
    assert f"strata transactions abort --topic {topic} --partition 0 --start-offset 2" \
        in text
    everywhere = json.loads(ok(strata(broker, "transactions", "find-hanging",
                                      "--max-transaction-timeout", "0", "--format", "json")))
    assert {(h["topic"], h["partition"]) for h in everywhere} >= {(topic, 0), (topic, 1)}

    # A wrong start offset is refused and writes nothing; the right one ends it.
    fails(strata(broker, "transactions", "abort", "--topic", topic, "--partition", "0",
                 "--start-offset", "1"), "open ones start at 2", "Nothing was written")
    aborted = json.loads(ok(strata(broker, "transactions", "abort", "--topic", topic,
                                   "--partition", "0", "--start-offset", "2",
                                   "--format", "json")))
    assert aborted["start_offset"] == 2 and aborted["coordinator_epoch"] >= 0
    text = ok(strata(broker, "transactions", "abort", "--topic", topic, "--partition", "1",
                     "--start-offset", "0"))
    assert text.startswith(f"Aborted the transaction of producer {aborted['producer_id']}")

    # The last stable offset moved past it: "later" is visible, the aborted data never.
    assert [(p, v) for p, _, v in _read(broker.bootstrap, topic, "read_committed",
                                         partitions=2)] == \
        [(0, b"committed"), (0, b"later")]
    out = ok(strata(broker, "consume", topic, "--from-beginning", "--timeout-ms", "1500",
                    "--isolation-level", "read_committed", "--format", "json"))
    assert sorted(json.loads(line)["value"] for line in out.splitlines()) == \
        ["committed", "later"]
    assert {v for _, _, v in _read(broker.bootstrap, topic, "read_uncommitted",
                                   partitions=2)} == {b"committed", b"hanging", b"open-1",
                                                      b"later"}
    with Admin(broker.bootstrap) as admin:
        assert admin.find_hanging([topic], max_transaction_timeout_ms=0) == []
        assert all(p.current_txn_start_offset is None
                   for p in admin.describe_producers(topic, 0))
