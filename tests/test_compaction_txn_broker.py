"""Log compaction of transactional data on real brokers (docs/compaction.md,
"Transactions"), written by real transactional producers (``strata.client.Producer``).

* Two brokers (leader and follower, each cleaning its own copy, every 200 ms): the
  cleaner leaves everything at and after the last stable offset alone while a
  transaction is open (superseded keys and an aborted transaction there included); once
  it commits, the aborted transactions' records go, committed transactional records
  compact by key like plain ones (an aborted write never shadows a committed record),
  and the aborted transactions' markers go too, after ``delete.retention.ms``, with
  their ``.txnindex`` entries. A read_committed read always gives the committed model.
* One broker SIGKILLed while a pass is writing ``.cleaned`` or swapping ``.swap`` files:
  it reopens with every ``.txnindex`` entry next to its ABORT marker and serves no
  aborted record at read_committed; cleaning then finishes the job.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import pytest

from brokers.log.txn_index import TransactionIndex
from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for
from wire.record_batch import BatchHeader, ControlType, iter_batches, parse_control
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: The cleaner every 200 ms; one partition of __transaction_state (the module's two
#: tests share it, and the brokers that lead it).
OVERRIDES = {"log.cleaner.interval.ms": "200", "transaction.state.log.num.partitions": "1"}

Row = tuple[int, bytes, bytes]  # offset, key, value


@dataclass
class Written:
    """Every data record written: offset -> (key, value, fate), fate being
    ``committed`` (plain records too), ``aborted`` or ``open``."""

    records: dict[int, tuple[bytes, bytes, str]] = field(default_factory=dict)

    def committed(self) -> list[Row]:
        return [(o, k, v) for o, (k, v, fate) in sorted(self.records.items())
                if fate == "committed"]

    def model(self, active_base: int, upper: int) -> list[Row]:
        """The read_committed view once every closed segment is cleaned: below the
        active segment the latest committed record per key (and the range's last record,
        if it is one); above it every committed record; nothing from ``upper`` on."""
        committed = self.committed()
        latest = {k: o for o, k, _ in committed if o < active_base}
        return [(o, k, v) for o, k, v in committed if o < upper and (
            o >= active_base or o == active_base - 1 or latest[k] == o)]


class Writer:
    """Sends one record per batch (flushed), noting each record's fate."""

    def __init__(self, producer: Producer, topic: str, written: Written) -> None:
        self.producer, self.topic, self.written = producer, topic, written
        self._open: list[int] = []

    def send(self, key: str, value: str, fate: str = "committed") -> int:
        future = self.producer.send(self.topic, value.encode(), key=key.encode(),
                                    partition=0)
        self.producer.flush()
        offset = future.result(timeout=30).offset
        self.written.records[offset] = (key.encode(), value.encode(), fate)
        if fate == "open":
            self._open.append(offset)
        return offset

    def transaction(self, rows: list[tuple[str, str]], *, commit: bool | None) -> None:
        """A whole transaction (``commit`` None: left open)."""
        self.producer.begin_transaction()
        for key, value in rows:
            self.send(key, value, "open")
        if commit is not None:
            self.end(commit)

    def end(self, commit: bool) -> None:
        if commit:
            self.producer.commit_transaction()
        else:
            self.producer.abort_transaction()
        for offset in self._open:
            key, value, _ = self.written.records[offset]
            self.written.records[offset] = (key, value, "committed" if commit else "aborted")
        self._open = []


def read(bootstrap: str, topic: str,
         isolation: Literal["read_committed", "read_uncommitted"]) -> list[Row]:
    """Everything a fresh consumer reads from the log start until it is quiet."""
    tp = TopicPartition(topic, 0)
    out: list[Row] = []
    with Consumer(bootstrap, isolation_level=isolation,
                  auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        quiet = 0
        while quiet < 3:
            records = consumer.poll(timeout_ms=300)
            quiet = 0 if records else quiet + 1
            out += [(r.offset, r.key or b"", r.value or b"") for r in records]
    return out


# ----------------------------------------------------------------------------- the files

def _retrying(read_files: Callable[[], list[tuple[Path, bytes]]]) -> list[tuple[Path, bytes]]:
    """A listing and reads that a concurrent swap may pull files from under: retried."""
    for _ in range(50):
        try:
            return read_files()
        except FileNotFoundError:
            time.sleep(0.02)
    return read_files()


def segments(directory: Path) -> list[tuple[Path, bytes]]:
    return _retrying(lambda: [(p, p.read_bytes()) for p in sorted(directory.glob("*.log"))])


def batches(directory: Path) -> Iterator[tuple[Path, BatchHeader, bytes]]:
    for path, data in segments(directory):
        for header, batch in iter_batches(data):
            yield path, header, bytes(batch)


def markers(directory: Path) -> dict[int, tuple[int, ControlType, Path]]:
    """offset -> (producer id, type, segment file) of every transaction marker."""
    return {h.base_offset: (h.producer_id, parse_control(b)[0], path)
            for path, h, b in batches(directory) if h.is_control}


def index_entries(directory: Path) -> list[tuple[Path, int, int, int]]:
    """(segment .log, producer id, first offset, marker offset) of every entry."""
    out = []
    for path in sorted(directory.glob("*.txnindex")):
        index = TransactionIndex(path)
        index.load()
        out += [(path.with_suffix(".log"), e.producer_id, e.first_offset, e.last_offset)
                for e in index.entries]
    return out


def _left_of(directory: Path, producer_id: int
             ) -> tuple[list[int], list[tuple[Path, int, int, int]]]:
    """The producer's offsets still in the log, and every aborted-index entry."""
    return offsets_of(directory, producer_id), index_entries(directory)


def check_index(directory: Path) -> list[tuple[Path, int, int, int]]:
    """Every ``.txnindex`` entry has its ABORT marker, of its producer, in its segment."""
    found = markers(directory)
    entries = index_entries(directory)
    for log, pid, _, last in entries:
        assert found.get(last) == (pid, ControlType.ABORT, log), (last, found.get(last))
    return entries


def active_base(directory: Path) -> int:
    return int(sorted(directory.glob("*.log"))[-1].name[:-4])


def values_in(directory: Path, needles: tuple[bytes, ...]) -> set[bytes]:
    """Which of ``needles`` a data batch of the log still holds."""
    return {v for _, h, b in batches(directory) if not h.is_control
            for v in needles if v in b}


def offsets_of(directory: Path, producer_id: int) -> list[int]:
    """Base offsets of the batches (markers too) of ``producer_id`` in the log."""
    return [h.base_offset for _, h, _ in batches(directory) if h.producer_id == producer_id]


def producer_id_of(directory: Path, value: bytes) -> int:
    for _, header, batch in batches(directory):
        if not header.is_control and value in batch:
            return header.producer_id
    raise AssertionError(f"{value!r} is not in {directory}")


# ----------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def brokers(zookeeper_server: ZooKeeperServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    started: list[BrokerProcess] = []
    try:
        for i in range(2):
            broker = BrokerProcess(zookeeper_server.connect_string,
                                   tmp_path_factory.mktemp(f"broker{i}"), i,
                                   overrides=OVERRIDES)
            started.append(broker)
            broker.start()
        yield started
    finally:
        for broker in started:
            broker.kill()


def test_compaction_around_open_committed_and_aborted_transactions(
        brokers: list[BrokerProcess]) -> None:
    bootstrap = ",".join(b.bootstrap for b in brokers)
    topic = f"compacted-txn-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 2, {
            "cleanup.policy": "compact", "segment.bytes": "1024",
            "delete.retention.ms": "1000", "min.insync.replicas": "2"})])
        leader_id = admin.describe_topics([topic])[topic].partitions[0].leader
    dirs = [b.data_dir / f"{topic}-0" for b in brokers]
    leader_dir = next(d for b, d in zip(brokers, dirs, strict=True) if b.broker_id == leader_id)
    written = Written()
    producers = {name: Producer(bootstrap, transactional_id=f"{name}-{uuid.uuid4().hex}",
                                transaction_timeout_ms=300_000)
                 for name in ("committer", "aborter", "holder")}
    plain_producer = Producer(bootstrap, acks="all")
    try:
        for producer in producers.values():
            producer.init_transactions()
        committer, aborter, holder = (Writer(producers[n], topic, written)
                                      for n in ("committer", "aborter", "holder"))
        plain = Writer(plain_producer, topic, written)

        plain.send("k1", "plain-1")
        committer.transaction([("k1", "committed-1"), ("k2", "committed-2")], commit=True)
        aborter.transaction([("k1", "aborted-1"), ("k3", "aborted-3")], commit=False)
        for i in range(4):
            plain.send(f"filler-{i}", "f")
        # A transaction left open; after its first record: a superseding plain record, an
        # aborted transaction, fillers (closed segments at and after the LSO).
        holder.transaction([("k4", "open-4")], commit=None)
        lso = max(written.records)
        plain.send("k2", "plain-2")
        aborter.transaction([("k5", "aborted-5")], commit=False)
        for i in range(4, 10):
            plain.send(f"filler-{i}", "f")

        def at_or_after_lso() -> list[Row]:
            return [r for r in read(bootstrap, topic, "read_uncommitted") if r[0] >= lso]

        def frozen() -> dict[str, bytes]:
            base = active_base(leader_dir)
            return {p.name: data for p, data in segments(leader_dir)
                    if int(p.name[:-4]) >= lso and int(p.name[:-4]) < base}

        after_before, files_before = at_or_after_lso(), frozen()
        assert any(v == b"aborted-5" for _, _, v in after_before)
        # Below the LSO the cleaner works: the aborted records go, and the committed
        # k1 survives the aborted write that came after it (the plain one does not).
        for directory in dirs:
            wait_for(f"the aborted records below the LSO leave {directory}",
                     partial(values_in, directory, (b"aborted-1", b"plain-1")),
                     lambda left: not left, timeout=60)
        time.sleep(1.5)  # several more passes
        uncommitted = read(bootstrap, topic, "read_uncommitted")
        values = [v for _, _, v in uncommitted]
        assert b"committed-1" in values and b"committed-2" in values
        assert at_or_after_lso() == after_before  # untouched while the transaction is open
        assert frozen() == files_before  # byte for byte (leader)
        # Each batch is a segment of its own: the cleaned range ends exactly at the LSO.
        assert read(bootstrap, topic, "read_committed") == written.model(lso, lso)

        # The transaction commits: the rest is cleaned; the aborter's markers (all its
        # transactions aborted) go once delete.retention.ms has passed, with their
        # index entries; the committer's marker stays (its records are still there).
        # The producer ids are read first: once the LSO moves, the cleaner may remove
        # aborted-5 before the test could look for it.
        aborter_pid = producer_id_of(leader_dir, b"aborted-5")
        committer_pid = producer_id_of(leader_dir, b"committed-1")
        holder.end(commit=True)
        for i in range(10, 14):
            plain.send(f"filler-{i}", "f")
        hw = max(written.records) + 1
        for directory in dirs:
            # Both gone: a segment the cleaner empties is deleted .log first, then its
            # .txnindex (an orphan index is dropped at open; a .log without its index
            # would mean replaying the log), so a look in between sees the entry alone.
            wait_for(f"the aborted transactions, their markers and index entries leave "
                     f"{directory}", partial(_left_of, directory, aborter_pid),
                     lambda left: left == ([], []), timeout=90)
            check_index(directory)
            assert any(pid == committer_pid for pid, _, _ in markers(directory).values())
        expected = written.model(active_base(leader_dir), hw)
        wait_for("the read_committed view of the cleaned log",
                 lambda: read(bootstrap, topic, "read_committed"),
                 lambda got: got == expected, timeout=60)
        # At read_uncommitted too: nothing aborted is left to see.
        assert read(bootstrap, topic, "read_uncommitted") == expected
        assert [v for _, k, v in expected if k == b"k2"] == [b"plain-2"]
        assert [v for _, k, v in expected if k == b"k1"] == [b"committed-1"]
    finally:
        for producer in (*producers.values(), plain_producer):
            producer.close()


def test_a_broker_killed_mid_clean_recovers_its_aborted_index(
        brokers: list[BrokerProcess]) -> None:
    bootstrap = ",".join(b.bootstrap for b in brokers)
    topic = f"crash-txn-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {
            "cleanup.policy": "compact", "segment.bytes": str(64 * 1024),
            "delete.retention.ms": "500"})])
        leader_id = admin.describe_topics([topic])[topic].partitions[0].leader
    broker = next(b for b in brokers if b.broker_id == leader_id)
    directory = broker.data_dir / f"{topic}-0"
    written = Written()
    txn_producer = Producer(bootstrap, transactional_id=f"crash-{uuid.uuid4().hex}",
                            linger_ms=20)
    plain_producer = Producer(bootstrap, acks="all", linger_ms=20)
    txn_producer.init_transactions()
    payload = "x" * 300

    def burst(round_: int) -> None:
        """Transactions of many records each, half aborted, over 300 keys."""
        for t in range(6):
            txn_producer.begin_transaction()
            futures = []
            for i in range(400):
                key = f"k{(round_ * 7 + t * 31 + i) % 300}"
                value = f"r{round_}-t{t}-{i}-{payload}"
                futures.append((key, value, txn_producer.send(
                    topic, value.encode(), key=key.encode(), partition=0)))
            txn_producer.flush()
            aborted = t % 2 == 1
            if aborted:
                txn_producer.abort_transaction()
            else:
                txn_producer.commit_transaction()
            for key, value, future in futures:
                written.records[future.result(timeout=30).offset] = (
                    key.encode(), value.encode(), "aborted" if aborted else "committed")
        for i in range(40):  # plain records close the last segments
            future = plain_producer.send(topic, payload.encode(), key=f"p{i}".encode(),
                                         partition=0)
            plain_producer.flush()
            written.records[future.result(timeout=30).offset] = (
                f"p{i}".encode(), payload.encode(), "committed")

    seen: list[str] = []
    try:
        for round_ in range(6):
            burst(round_)
            # Kill -9 the moment a pass is rewriting a segment with aborted transactions
            # (its .txnindex.cleaned is written) or swapping one in.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not seen:
                with contextlib.suppress(FileNotFoundError):
                    seen = [n for n in os.listdir(directory)
                            if n.endswith((".txnindex.cleaned", ".swap"))]
                if seen:
                    broker.kill()
                time.sleep(0.0005)
            if seen:
                break
        assert seen, "no cleaner pass was caught writing its files"
    finally:
        txn_producer.close()
        plain_producer.close()
    # Reopen without cleaning: the recovered log as the crash left it.
    broker.overrides["log.cleaner.interval.ms"] = str(3_600_000)
    broker.restart()
    assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
    entries = check_index(directory)
    hw = max(written.records) + 1
    committed = read(bootstrap, topic, "read_committed")
    fates = {o: fate for o, (_, _, fate) in written.records.items()}
    assert committed, "nothing read"
    assert all(fates.get(o) == "committed" for o, _, _ in committed), \
        "an aborted record was served at read_committed"
    assert [o for o, _, _ in committed] == sorted({o for o, _, _ in committed})
    # Every key's latest committed record is there (compaction never drops one).
    latest = {k: (o, v) for o, k, v in written.committed()}
    assert {k: (o, v) for o, k, v in committed if latest[k][0] == o} == latest
    # Aborted records still in the log have their entry (or the read above would have
    # shown them); entries exist only beside ABORT markers (check_index).
    still_there = {o for _, h, _ in batches(directory) if not h.is_control
                   for o in range(h.base_offset, h.next_offset)
                   if fates.get(o) == "aborted"}
    if still_there:
        assert entries
    broker.stop()

    # Cleaning resumes and converges: the committed model, no aborted record left, and
    # the aborted transactions' markers and index entries go after their horizon.
    broker.overrides["log.cleaner.interval.ms"] = OVERRIDES["log.cleaner.interval.ms"]
    broker.restart()
    expected = written.model(active_base(directory), hw)
    wait_for("the read_committed view after cleaning resumed",
             lambda: read(bootstrap, topic, "read_committed"),
             lambda got: got == expected, timeout=120)
    # (The active segment is never cleaned: an entry of a marker there stays.)
    wait_for("the aborted transactions' index entries and markers to go",
             lambda: [e for e in index_entries(directory)
                      if int(e[0].name[:-4]) < active_base(directory)],
             lambda found: found == [], timeout=60)
    check_index(directory)
    assert not any(fates.get(o) == "aborted"
                   for _, h, _ in batches(directory) if not h.is_control
                   for o in range(h.base_offset, h.next_offset)
                   if h.next_offset < active_base(directory))
