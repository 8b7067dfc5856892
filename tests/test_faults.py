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
protected by ZooKeeper ACLs.

After healing, the producers stop, the checker reads every partition from offset 0 to
its high watermark and byte-compares every replica's segment files up to it, and the
test prints ``acknowledged / read / lost / duplicated / unexpected``. Writes must have
gone on during every fault (each phase acknowledged something) and after it.

``STRATA_SOAK_SECONDS=N`` (``make soak``) repeats each scenario's faults for N seconds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from procs import pid_alive
from strata.client import Admin, NewTopic
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
    if secure:
        _assert_secured(cluster, topic)
    phases = kill_leaders(cluster, workload, topic, rounds=2)  # 20-minute suite budget
    label = " secured" if secure else " typed" if typed else ""
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
