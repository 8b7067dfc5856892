"""Replication under faults (issue [4/7] section 5): one test per nemesis scenario.

Every test runs a real cluster (tests/support/cluster.py): ZooKeeper and 3 brokers, a
topic with 4 partitions, replication factor 3 and ``min.insync.replicas=2``, and 3
idempotent ``acks=all`` producers writing numbered records to every partition
(tests/support/nemesis.py) while one nemesis scenario runs:

(a) the leader of a partition is SIGKILLed, again and again (a different partition each
    time) and restarted;
(b) the controller is SIGKILLed and restarted;
(c) a leader is SIGSTOPped for longer than its ZooKeeper session, then SIGCONTed: the
    zombie must acknowledge nothing (raw ``acks=-1`` probes are sent to it while frozen);
(d) one node of a 3-node ZooKeeper ensemble is SIGKILLed and restarted;
(e) every broker is restarted: one by one (SIGTERM), then all at once (SIGKILL).

Scenario (a) also runs on a fully secured cluster (``Cluster(secure=True)``): SASL_SSL
the only listener, replication over it, ACLs checked on every request (the producers
and the checker log in as a user who may only write and read the topic), znodes
protected by ZooKeeper ACLs. There a transactional producer, logged in as that user
with WRITE on its transactional ids and its topic, also commits transactions across two
partitions through every kill, and the transaction checker (tests/support/txn_checker.py)
reads them back at read_committed: nothing aborted read, nothing committed lost, no
transaction torn. Before the kills, the same user is refused an id it has no WRITE on
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53, naming the `strata acl add` that would allow
it), and DESCRIBE on ids decides what it may describe and list.

After healing, the producers stop, the checker reads every partition from offset 0 to
its high watermark and byte-compares every replica's segment files up to it, and the
test prints ``acknowledged / read / lost / duplicated / unexpected``. Writes must have
gone on during every fault (each phase acknowledged something) and after it.

``STRATA_SOAK_SECONDS=N`` (``make soak``) repeats each scenario's faults for N seconds.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from procs import pid_alive
from strata.client import (
    AbortableTransactionError,
    Admin,
    Consumer,
    FatalTransactionError,
    NewTopic,
    Producer,
    StrataError,
    TopicPartition,
    TransactionalIdAuthorizationFailedError,
)
from tests.support.cluster import Cluster
from tests.support.nemesis import (
    TYPED_SCHEMA,
    CheckResult,
    Phase,
    Workload,
    ZombieProbe,
    explain,
    kill_controller,
    kill_leaders,
    kill_zookeeper_node,
    pause_leader,
    restart_every_broker,
    soak_seconds,
    verify,
)
from tests.support.txn_checker import Read, Report, Txn, TxnHistory, check, encode_value
from wire.errors import NetworkError, TopicAuthorizationFailedError

BROKERS = 3
PARTITIONS = 4
PRODUCERS = 3
REPLICATION_FACTOR = 3
#: Small segments, so replicas roll (and truncate) across segment boundaries too.
TOPIC_CONFIGS = {"min.insync.replicas": "2", "segment.bytes": str(512 * 1024)}
#: Session timeout of every broker (DEFAULT_BROKER_OVERRIDES); the zombie sleeps longer.
SESSION_TIMEOUT_S = 6.0
#: Acknowledged records a test needs at least, to show the workload really ran.
MIN_ACKED = 300

pytestmark = [pytest.mark.system, pytest.mark.timeout(240 + 1.5 * soak_seconds())]


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Start ``Cluster``s; at teardown every process they started is killed by PID and
    checked dead, whatever the test did."""
    started: list[Cluster] = []

    def start(zookeeper_nodes: int = 1, secure: bool = False) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(started)}", BROKERS,
                          zookeeper_nodes=zookeeper_nodes, secure=secure)
        started.append(cluster)
        return cluster.start()

    try:
        yield start
    finally:
        pids = [pid for cluster in started for pid in cluster.pids()]
        for cluster in started:
            cluster.close()
        assert not [pid for pid in pids if pid_alive(pid)], "a cluster process survived"


def _start_workload(cluster: Cluster, typed: bool = False) -> tuple[str, Workload]:
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    configs = dict(TOPIC_CONFIGS)
    if typed:  # a typed topic: the registry is on the write path of every batch
        configs["value.schema.subject"] = f"{topic}-value"
        with Admin(cluster.bootstrap, **cluster.admin_options) as admin:
            admin.register_schema(f"{topic}-value", TYPED_SCHEMA)
    cluster.create_topic(topic, PARTITIONS, REPLICATION_FACTOR, configs)
    cluster.wait_until_healthy(topic, timeout=60)
    workload = Workload(cluster.bootstrap, topic, PARTITIONS, producers=PRODUCERS,
                        options=cluster.client_options(), typed=typed).start()
    workload.wait_for_acks(20, since=0.0, partitions=range(PARTITIONS), timeout=30)
    cluster.log(f"workload running: {workload.acked()} acknowledged")
    return topic, workload


def _assert_secured(cluster: Cluster, topic: str) -> None:
    """The secured cluster really is: no plaintext client, no anonymous znode write, and
    the workload's user may write its topic but not create one."""
    with pytest.raises(NetworkError, match="secured listener"), Admin(
            cluster.bootstrap, request_timeout_ms=3000) as anonymous:
        anonymous.describe_topics([topic])
    with pytest.raises(NoAuthError):
        cluster.zk.set(f"/strata/brokers/topics/{topic}", b"{}")
    with pytest.raises(TopicAuthorizationFailedError), Admin(
            cluster.bootstrap, **cluster.client_options("app")) as app:
        app.create_topics([NewTopic(f"faults-{uuid.uuid4().hex[:8]}", 1, 1)])


def _assert_transactions_secured(cluster: Cluster) -> None:
    """ACLs on transactional ids: ``app`` has WRITE on ``faults-*`` ids only
    (ClusterSecurity); WRITE implies DESCRIBE, which decides describe and list."""
    other = f"other-{uuid.uuid4().hex[:8]}"
    with pytest.raises(FatalTransactionError) as refused, Producer(
            cluster.bootstrap, transactional_id=other, max_block_ms=10_000,
            **cluster.client_options("app")) as producer:
        producer.init_transactions()
    cause = refused.value.cause
    assert isinstance(cause, TransactionalIdAuthorizationFailedError) and cause.code == 53
    assert f"--transactional-id {other}" in str(cause) and "strata acl add" in str(cause)
    with Producer(cluster.bootstrap, transactional_id=other,
                  **cluster.admin_options) as producer:  # a super user may
        producer.init_transactions()
    with Admin(cluster.bootstrap, **cluster.client_options("app")) as app:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            app.describe_transactions([other])
        assert other not in {t.transactional_id for t in app.list_transactions()}
    with Admin(cluster.bootstrap, **cluster.admin_options) as admin:
        assert other in {t.transactional_id for t in admin.list_transactions()}


class _TxnWriter:
    """A transactional producer committing transactions of 2 records to each of 2
    partitions (a different pair each time) while the faults run; every transaction's
    outcome as it saw it goes to the transaction checker. A transaction that failed
    before its commit was sent is aborted (by ``abort_transaction``, or by the next
    producer's ``init_transactions`` fencing this one); one whose commit failed is
    ``unknown`` (the checker decides it from the reads, whole or not at all)."""

    def __init__(self, cluster: Cluster, topic: str, partitions: int) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        # ``app`` may use the transactional ids named faults-* (ClusterSecurity).
        self.writer = f"faults-txn-{uuid.uuid4().hex[:6]}"
        self.txns: list[Txn] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txn-writer", daemon=True)

    def _producer(self) -> Producer:
        producer = Producer(self.cluster.bootstrap, transactional_id=self.writer,
                            request_timeout_ms=5000, delivery_timeout_ms=60_000,
                            max_block_ms=60_000, transaction_timeout_ms=60_000,
                            **self.cluster.client_options("app"))
        producer.init_transactions()
        return producer

    def start(self) -> _TxnWriter:
        self._thread.start()
        return self

    def committed(self) -> int:
        return sum(1 for t in self.txns if t.outcome == "committed")

    def _run(self) -> None:
        producer: Producer | None = None
        n = 0
        while not self._stop.is_set():
            try:
                if producer is None:
                    producer = self._producer()
            except StrataError as err:
                self.errors.append(f"init: {err}")
                time.sleep(1)
                continue
            first = n % self.partitions
            manifest = {first: 2, (first + 1) % self.partitions: 2}
            started, committing = time.monotonic(), False
            outcome = "aborted"
            try:
                producer.begin_transaction()
                for p, count in manifest.items():
                    for i in range(count):
                        producer.send(self.topic, encode_value(self.writer, n, p, i, manifest),
                                      partition=p)
                committing = True
                producer.commit_transaction()
                outcome = "committed"
            except AbortableTransactionError as err:
                self.errors.append(f"txn {n}: {err}")
                outcome = "unknown" if committing else "aborted"
                try:
                    producer.abort_transaction()
                    outcome = "aborted"
                except StrataError as abort_err:
                    self.errors.append(f"abort of txn {n}: {abort_err}")
                    self._discard(producer)
                    producer = None
            except StrataError as err:  # fatal, or a timeout: a new producer fences it
                self.errors.append(f"txn {n}: {err}")
                outcome = "unknown" if committing else "aborted"
                self._discard(producer)
                producer = None
            self.txns.append(Txn(self.writer, n, tuple(sorted(manifest.items())), outcome,
                                 started, time.monotonic()))
            n += 1
            time.sleep(0.05)
        if producer is not None:
            self._discard(producer)

    @staticmethod
    def _discard(producer: Producer) -> None:
        with contextlib.suppress(StrataError):
            producer.close(timeout=5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the transactional writer did not stop"

    def diagnose(self) -> str:
        """What the writer saw, its id's coordinator state, each partition's producers,
        and the brokers' transaction log lines: for a failure message."""
        outcomes = {o: sum(1 for t in self.txns if t.outcome == o)
                    for o in ("committed", "aborted", "unknown")}
        parts = [f"writer {self.writer}: {outcomes}", "last errors:",
                 *(f"  {e}" for e in self.errors[-10:])]
        try:
            with Admin(self.cluster.bootstrap, request_timeout_ms=10_000,
                       **self.cluster.admin_options) as admin:
                parts.append(f"coordinator: {admin.describe_transactions([self.writer])}")
                for p in range(self.partitions):
                    parts.append(f"p{p} producers: {admin.describe_producers(self.topic, p)}")
        except StrataError as err:
            parts.append(f"(describe failed: {err})")
        for broker_id in sorted(self.cluster.brokers):
            lines = [line for line in self.cluster.broker_log(broker_id).splitlines()
                     if "transaction" in line or "txn" in line or "harness" in line]
            parts += [f"--- broker {broker_id} ---", *lines[-40:]]
        return "\n".join(parts)

    def check(self) -> Report:
        """Read every partition at read_committed to its end, then the checker. A last
        ``init_transactions`` with the writer's id first ends whatever a discarded
        producer left open (it fences it and aborts its transaction)."""
        try:
            self._discard(self._producer())
        except StrataError as err:
            raise AssertionError(f"the last init_transactions failed: {err}\n"
                                 f"{self.diagnose()}") from err
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        with Admin(self.cluster.bootstrap, **self.cluster.admin_options) as admin:
            ends = {tp: r.offset for tp, r in
                    admin.list_offsets(dict.fromkeys(tps, "latest")).items()}
        reads: list[Read] = []
        with Consumer(self.cluster.bootstrap, isolation_level="read_committed",
                      auto_offset_reset="earliest", **self.cluster.admin_options) as consumer:
            consumer.assign(tps)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and \
                    any(consumer.position(tp) < ends[tp] for tp in tps):
                reads += [Read("final", r.partition, r.offset,
                               (r.value or b"").decode(), time.monotonic())
                          for r in consumer.poll(timeout_ms=500)]
            behind = {str(tp): (consumer.position(tp), ends[tp]) for tp in tps
                      if consumer.position(tp) < ends[tp]}
        assert not behind, f"read_committed did not reach the end (position, end): " \
            f"{behind}\n{self.diagnose()}"
        return check(TxnHistory(self.txns, reads, partitions=self.partitions))


def _finish(name: str, cluster: Cluster, workload: Workload, topic: str,
            phases: list[Phase], probes: list[ZombieProbe] | None = None) -> CheckResult:
    """Writes go on after healing; then the full check, with every assertion."""
    after = Phase("after healing", time.monotonic())
    after.expect_progress(cluster, workload, topic, range(PARTITIONS), count=50, timeout=45)
    after.acked_during, after.ended = workload.acked(after.started), time.monotonic()
    result = verify(name, cluster, workload, topic, probes=probes or [])
    for phase in [*phases, after]:
        print(f"  phase {phase.describe()}", flush=True)
    message = explain(cluster, result, [*phases, after])
    anomalies = result.anomalies()
    assert anomalies == dict.fromkeys(anomalies, 0), message
    assert result.acknowledged >= MIN_ACKED, message
    quiet = [phase.name for phase in phases if phase.acked_during == 0]
    assert not quiet, f"nothing was acknowledged during {quiet}\n{message}"
    stalls = [f"{phase.name}: {stall}" for phase in [*phases, after] for stall in phase.stalls]
    assert not stalls, "writes stalled:\n" + "\n".join(stalls) + f"\n{message}"
    return result


@pytest.mark.parametrize(("secure", "typed"), [(False, False), (True, False), (False, True)],
                         ids=["plaintext", "sasl_ssl", "typed"])
def test_a_leader_killed_repeatedly(cluster_factory: Callable[..., Cluster],
                                    secure: bool, typed: bool) -> None:
    """``typed``: the topic is typed (docs/typed-topics.md), so every batch is checked
    against the schema registry, whose ``__schemas`` leader the kills may take too."""
    cluster = cluster_factory(secure=secure)
    topic, workload = _start_workload(cluster, typed=typed)
    writer = None
    if secure:
        _assert_secured(cluster, topic)
        _assert_transactions_secured(cluster)
        txn_topic = f"faults-txn-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(txn_topic, PARTITIONS, REPLICATION_FACTOR, TOPIC_CONFIGS)
        cluster.wait_until_healthy(txn_topic, timeout=60)
        writer = _TxnWriter(cluster, txn_topic, PARTITIONS).start()
    phases = kill_leaders(cluster, workload, topic, rounds=2)  # 20-minute suite budget
    label = " secured" if secure else " typed" if typed else ""
    if writer is not None:
        before = writer.committed()
        deadline = time.monotonic() + 60
        while writer.committed() < before + 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # commits go on after healing too
        writer.stop()
        report = writer.check()
        print(f"  transactions: {report.summary()}", flush=True)
        assert report.ok, report.render() + "\nwriter errors:\n" + "\n".join(writer.errors)
        assert writer.committed() >= before + 3, \
            f"no commits after healing: {report.summary()}; errors: {writer.errors[-5:]}"
        assert report.committed >= 5, report.summary()
        during = [t for t in writer.txns if t.outcome == "committed"
                  and phases[0].started <= t.ended <= phases[-1].ended]
        print(f"  transactions committed during the kills: {len(during)}", flush=True)
        assert during, f"no transaction committed during the kills: {report.summary()}"
    _finish(f"(a) leader SIGKILL{label}", cluster, workload, topic, phases)


def test_b_controller_killed(cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory()
    topic, workload = _start_workload(cluster)
    phases = kill_controller(cluster, workload, topic, rounds=1)  # suite budget
    _finish("(b) controller SIGKILL", cluster, workload, topic, phases)


def test_c_paused_leader_is_fenced(cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory()
    topic, workload = _start_workload(cluster)
    phases, probes = pause_leader(cluster, workload, topic,
                                  pause_s=2 * SESSION_TIMEOUT_S, rounds=1)
    assert probes, "the paused broker led no partition"
    result = _finish("(c) leader SIGSTOP/SIGCONT", cluster, workload, topic, phases, probes)
    assert [p.answer for p in probes if p.answer == 0] == [], result.problems


def test_d_zookeeper_node_killed(cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory(zookeeper_nodes=3)
    topic, workload = _start_workload(cluster)
    phases = kill_zookeeper_node(cluster, workload, topic, rounds=1)
    _finish("(d) ZooKeeper node SIGKILL", cluster, workload, topic, phases)


def test_e_every_broker_restarted(cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory()
    topic, workload = _start_workload(cluster)
    phases = restart_every_broker(cluster, workload, topic, rounds=1)
    _finish("(e) every broker restarted", cluster, workload, topic, phases)
