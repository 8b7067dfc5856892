"""Brokers on hosts of their own, and real network partitions (issue [2.5] section 2).

Three brokers and a three-node ZooKeeper ensemble, each in a Linux network namespace of
its own with its own address on a bridge (tests/support/netns.py); brokers listen on
that address and advertise it. The test runs in the root namespace, as the clients do:
it reaches the brokers only through the addresses metadata gives it. Idempotent
``acks=all`` producers write numbered records (tests/support/nemesis.py) and a consumer
group member commits after every poll, while a nemesis cuts links instead of sending
signals (tests/support/net_nemesis.py), one fault after another, each healed before the
next: a zombie leader (cut off from ZooKeeper and the brokers, still reachable by its
clients, probed with raw ``acks=-1`` produces once its session is over), the controller
cut off, the ZooKeeper leader cut off, a majority/minority split, and flapping links.

Then the checker of the replication fault tests: acknowledged records lost 0,
duplicates 0, replicas byte-identical up to the high watermark, no probe acknowledged by
a cut-off leader; and the group's committed offsets never moved backwards.

Added latency and packet loss (``tc netem``) need the kernel's ``sch_netem``; where it is
missing that test is skipped and says so. Where network namespaces cannot be made at
all (not root, no iproute2), every test here is skipped with the reason.
``STRATA_SOAK_SECONDS=N`` (``make soak``) repeats the faults for N seconds.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import pid_alive
from strata.client import Admin
from tests.support.cluster import Cluster
from tests.support.nemesis import Phase, Workload, ZombieProbe, explain, soak_seconds, verify
from tests.support.net_nemesis import (
    GroupOffsets,
    flap,
    isolate_controller,
    isolate_leader,
    isolate_zookeeper_node,
    split,
)
from tests.support.netns import netem_available, unavailable

WHY_NOT = unavailable()
WHY_NO_NETEM = netem_available() if WHY_NOT is None else WHY_NOT
pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(420 + 1.5 * soak_seconds()),
    pytest.mark.skipif(WHY_NOT is not None,
                       reason=f"network namespaces cannot be made here: {WHY_NOT}"),
]

PARTITIONS = 4
SESSION_TIMEOUT_S = 6.0  # tests/support/cluster.py DEFAULT_BROKER_OVERRIDES
HOLD_S = SESSION_TIMEOUT_S + 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster(tmp_path / "cluster", 3, zookeeper_nodes=3, network=True)
    pids: list[int] = []
    try:
        started.start()
        pids = started.pids()
        yield started
    finally:
        pids += started.pids()
        started.close()
        assert not [pid for pid in pids if pid_alive(pid)], "a cluster process survived"
        assert started.network is not None and not started.network.nodes


def test_partitions_lose_no_acknowledged_record(cluster: Cluster) -> None:
    # Hosts of their own: metadata gives the clients the namespaces' addresses only.
    # Every broker is registered in ZooKeeper when the cluster is up; the broker that
    # answers may still be waiting for the controller's metadata naming the last one.
    expected = {b: (cluster.node_of_broker(b).address, 9092) for b in cluster.brokers}
    with Admin(cluster.bootstrap) as admin:
        brokers = cluster.wait_for("metadata naming every broker",
                                   lambda: admin.describe_cluster().brokers,
                                   lambda seen: set(seen) == set(expected), 30)
    assert brokers == expected
    assert not any(host.startswith("127.") for host, _ in brokers.values())
    seed = int(os.environ.get("STRATA_NET_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"network nemesis seed {seed} (STRATA_NET_SEED replays it)", flush=True)
    topic = f"net-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy(topic, timeout=60)
    workload = Workload(cluster.bootstrap, topic, PARTITIONS, producers=3).start()
    group = GroupOffsets(cluster.bootstrap, topic, f"net-group-{uuid.uuid4().hex[:6]}").start()
    workload.wait_for_acks(20, since=0.0, partitions=range(PARTITIONS), timeout=30)
    probes: list[ZombieProbe] = []
    phases: list[Phase] = []
    started = time.monotonic()
    try:
        while True:
            phases.append(isolate_leader(cluster, workload, topic, probes,
                                         session_timeout_s=SESSION_TIMEOUT_S, hold_s=HOLD_S,
                                         partition=rng.randrange(PARTITIONS)))
            phases.append(isolate_controller(cluster, workload, topic, hold_s=HOLD_S))
            phases.append(isolate_zookeeper_node(cluster, workload, topic, hold_s=4.0))
            phases.append(split(cluster, workload, topic, probes,
                                session_timeout_s=SESSION_TIMEOUT_S, hold_s=HOLD_S,
                                partition=rng.randrange(PARTITIONS)))
            phases.append(flap(cluster, workload, topic, seconds=6.0, rng=rng))
            if time.monotonic() - started >= soak_seconds():
                break
        after = Phase("after healing", time.monotonic())
        after.expect_progress(cluster, workload, topic, range(PARTITIONS), count=30,
                              timeout=45)
        after.acked_during, after.ended = workload.acked(after.started), time.monotonic()
        phases.append(after)
    finally:
        group.stop()
    result = verify("network partitions", cluster, workload, topic, probes=probes)
    for phase in phases:
        print(f"  phase {phase.describe()}", flush=True)
    message = explain(cluster, result, phases)
    anomalies = result.anomalies()
    assert anomalies == dict.fromkeys(anomalies, 0), message
    assert probes, "no probe reached a cut-off leader"
    assert [p for p in probes if p.answer == 0] == [], message
    stalls = [f"{phase.name}: {stall}" for phase in phases for stall in phase.stalls]
    assert not stalls, "writes stalled:\n" + "\n".join(stalls) + f"\n{message}"
    assert result.acknowledged >= 500, message
    assert group.committed > 0 and len(group.samples) > 10, (group.committed, group.errors)
    assert group.backwards() == [], group.backwards()


@pytest.mark.skipif(WHY_NO_NETEM is not None,
                    reason=f"latency and loss need tc netem, which this machine lacks: "
                           f"{WHY_NO_NETEM}")
def test_latency_and_loss_slow_writes_but_lose_nothing(cluster: Cluster) -> None:
    network = cluster.network
    assert network is not None
    topic = f"netem-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy(topic, timeout=60)
    workload = Workload(cluster.bootstrap, topic, PARTITIONS, producers=3).start()
    workload.wait_for_acks(20, since=0.0, partitions=range(PARTITIONS), timeout=30)
    phase = Phase("20 ms latency and 2 % loss on every link", time.monotonic())
    for node in network.nodes.values():
        network.degrade(node, delay_ms=20, loss_percent=2.0)
    try:
        phase.expect_progress(cluster, workload, topic, range(PARTITIONS), count=20,
                              timeout=45)
        time.sleep(max(0.0, phase.started + 15 - time.monotonic()))
    finally:
        network.heal()
    phase.acked_during, phase.ended = workload.acked(phase.started), time.monotonic()
    cluster.wait_until_healthy(topic, timeout=60)
    result = verify("latency and loss", cluster, workload, topic)
    message = explain(cluster, result, [phase])
    anomalies = result.anomalies()
    assert anomalies == dict.fromkeys(anomalies, 0), message
    assert not phase.stalls and phase.acked_during > 0, message
