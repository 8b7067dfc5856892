"""A nemesis that cuts network links instead of sending signals (issue [2.5] section 2),
for a ``Cluster(network=True)`` whose brokers and ZooKeeper nodes each live in a network
namespace of their own (tests/support/netns.py). The clients (the workload, the probes,
the checker) stay in the root namespace and reach the brokers only at the addresses
metadata advertises.

Each fault returns a ``Phase`` (tests/support/nemesis.py) and is healed before the next:

- ``isolate_leader``: a partition's leader loses ZooKeeper and the other brokers while
  its clients still reach it (the zombie leader). Raw ``acks=-1`` probes go to it once
  its ZooKeeper session has timed out: none may be acknowledged;
- ``isolate_controller``: the controller is cut off the same way; another broker takes
  over and writes go on;
- ``isolate_zookeeper_node``: the ZooKeeper leader is cut off from everyone; the other
  two form a quorum and writes go on;
- ``split``: a minority (one broker leading a partition and one ZooKeeper node) against
  the majority; the majority goes on writing, the minority broker acknowledges nothing;
- ``flap``: one broker after another loses every link for a moment, many times.

``GroupOffsets`` runs a consumer group member that commits after every poll and samples
the group's committed offsets; they must never move backwards.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from typing import Any

from tests.support.cluster import Cluster
from tests.support.nemesis import Phase, Workload, ZombieProbe, _heal, probe_leader
from tests.support.netns import NetworkNode

__all__ = ["GroupOffsets", "flap", "isolate_controller", "isolate_leader",
           "isolate_zookeeper_node", "split"]


def _network(cluster: Cluster) -> Any:
    assert cluster.network is not None, "a network nemesis needs Cluster(network=True)"
    return cluster.network


def _everyone_but(cluster: Cluster, *, brokers: Iterable[int] = (),
                  zookeepers: Iterable[int] = ()) -> list[NetworkNode]:
    skip_b, skip_z = set(brokers), set(zookeepers)
    return ([cluster.node_of_zookeeper(k) for k in range(len(cluster.zk_nodes))
             if k not in skip_z]
            + [cluster.node_of_broker(b) for b in cluster.brokers if b not in skip_b])


def _hold(phase: Phase, seconds: float) -> None:
    """Keep the fault until ``seconds`` after the phase started."""
    remaining = phase.started + seconds - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def _cut_off_leader(cluster: Cluster, workload: Workload, topic: str, name: str,
                    victim: int, minority: list[NetworkNode], majority: list[NetworkNode],
                    probes: list[ZombieProbe], session_timeout_s: float,
                    hold_s: float) -> Phase:
    """Cut ``minority`` (holding broker ``victim``) from ``majority``; probe the victim
    for every partition it led once its session is over; wait for new leaders and for
    writes everywhere; heal."""
    partitions = sorted(cluster.replicas(topic))
    led = [p for p in partitions if cluster.leader_of(topic, p) == victim]
    phase = Phase(f"{name}: broker {victim} (leader of "
                  f"{', '.join(f'p{p}' for p in led) or 'nothing'}) cut off", time.monotonic())
    net = _network(cluster)
    cluster.log(f"partition {[n.name for n in minority]} | {[n.name for n in majority]}")
    net.partition(minority, majority)
    threads: list[threading.Thread] = []
    phases: list[Phase] = []
    try:
        for partition in led:
            state = cluster.wait_for_new_leader(topic, partition, victim,
                                                timeout=session_timeout_s + 30)
            phase.notes.append(f"p{partition} led by {state.leader} after "
                               f"{time.monotonic() - phase.started:.1f}s")
        # Past the session timeout the cut-off broker must acknowledge nothing.
        wait = phase.started + session_timeout_s + 1.0 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        threads = probe_leader(cluster, workload, topic, victim, led, probes, hold_s + 40)
        phase.expect_progress(cluster, workload, topic, partitions, timeout=20)
        _hold(phase, hold_s)
    finally:
        _heal(phase, phases, cluster, workload, topic, net.heal)
    for thread in threads:
        thread.join(60)
    for probe in probes[-len(led):] if led else []:
        phase.notes.append(f"probe to broker {probe.broker} p{probe.partition}: answer "
                           f"{probe.answer} {probe.outcome.error or ''}".strip())
    return phase


def isolate_leader(cluster: Cluster, workload: Workload, topic: str,
                   probes: list[ZombieProbe], *, session_timeout_s: float,
                   hold_s: float, partition: int = 0) -> Phase:
    victim = cluster.leader_of(topic, partition)
    return _cut_off_leader(
        cluster, workload, topic, "zombie leader", victim,
        [cluster.node_of_broker(victim)], _everyone_but(cluster, brokers=[victim]),
        probes, session_timeout_s, hold_s)


def split(cluster: Cluster, workload: Workload, topic: str, probes: list[ZombieProbe],
          *, session_timeout_s: float, hold_s: float, partition: int = 1) -> Phase:
    victim = cluster.leader_of(topic, partition)
    zk_leader = cluster.zk_leader_index()
    lonely_zk = zk_leader if zk_leader is not None else 0
    minority = [cluster.node_of_broker(victim), cluster.node_of_zookeeper(lonely_zk)]
    majority = _everyone_but(cluster, brokers=[victim], zookeepers=[lonely_zk])
    return _cut_off_leader(cluster, workload, topic, "majority/minority split", victim,
                           minority, majority, probes, session_timeout_s, hold_s)


def isolate_controller(cluster: Cluster, workload: Workload, topic: str, *,
                       hold_s: float) -> Phase:
    held = cluster.controller()
    assert held is not None, "no controller to isolate"
    victim, epoch = held
    partitions = sorted(cluster.replicas(topic))
    phase = Phase(f"controller {victim} (epoch {epoch}) cut off", time.monotonic())
    net = _network(cluster)
    net.partition([cluster.node_of_broker(victim)], _everyone_but(cluster, brokers=[victim]))
    phases: list[Phase] = []
    try:
        successor = cluster.wait_for_new_controller(victim, timeout=40)
        phase.notes.append(f"controller {successor} after "
                           f"{time.monotonic() - phase.started:.1f}s")
        for partition in partitions:
            if cluster.leader_of(topic, partition) == victim:
                cluster.wait_for_new_leader(topic, partition, victim, timeout=40)
        phase.expect_progress(cluster, workload, topic, partitions, timeout=20)
        _hold(phase, hold_s)
    finally:
        _heal(phase, phases, cluster, workload, topic, net.heal)
    after = cluster.controller()
    assert after is not None and after[1] > epoch, \
        f"the controller epoch did not move past {epoch}: {after}"
    return phase


def isolate_zookeeper_node(cluster: Cluster, workload: Workload, topic: str, *,
                           hold_s: float) -> Phase:
    victim = cluster.zk_leader_index()
    assert victim is not None, "no ZooKeeper leader"
    partitions = sorted(cluster.replicas(topic))
    phase = Phase(f"ZooKeeper leader (node {victim}) cut off", time.monotonic())
    net = _network(cluster)
    net.partition([cluster.node_of_zookeeper(victim)], _everyone_but(cluster,
                                                                     zookeepers=[victim]))
    phases: list[Phase] = []
    try:
        deadline = time.monotonic() + 40
        while cluster.zk_leader_index() in (None, victim):
            assert time.monotonic() < deadline, "no new ZooKeeper leader within 40 s"
            time.sleep(0.2)
        phase.notes.append(f"ZooKeeper leader {cluster.zk_leader_index()} after "
                           f"{time.monotonic() - phase.started:.1f}s")
        phase.expect_progress(cluster, workload, topic, partitions, timeout=30)
        _hold(phase, hold_s)
    finally:
        _heal(phase, phases, cluster, workload, topic, net.heal)
    return phase


def flap(cluster: Cluster, workload: Workload, topic: str, *, seconds: float,
         rng: random.Random) -> Phase:
    """Brokers lose all their links for 0.2-1.5 s at a time, one after another."""
    partitions = sorted(cluster.replicas(topic))
    phase = Phase(f"flapping links for {seconds:.0f}s", time.monotonic())
    net = _network(cluster)
    phases: list[Phase] = []
    cuts = 0
    try:
        while time.monotonic() - phase.started < seconds:
            victim = rng.choice(sorted(cluster.brokers))
            net.partition([cluster.node_of_broker(victim)],
                          _everyone_but(cluster, brokers=[victim]))
            time.sleep(rng.uniform(0.2, 1.5))
            net.heal()
            cuts += 1
            time.sleep(rng.uniform(0.1, 0.8))
        phase.notes.append(f"{cuts} cuts")
    finally:
        _heal(phase, phases, cluster, workload, topic, net.heal)
    phase.expect_progress(cluster, workload, topic, partitions, timeout=30)
    return phase


class GroupOffsets:
    """A group member that commits after every poll, and a sampler of the group's
    committed offsets; ``backwards()`` lists every time a partition's committed offset
    went down between two samples (each sample starts after the previous one ended)."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.committed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._consume, daemon=True),
                         threading.Thread(target=self._sample, daemon=True)]

    def start(self) -> GroupOffsets:
        for thread in self._threads:
            thread.start()
        return self

    def _consume(self) -> None:
        from strata.client import Consumer

        with Consumer(self.bootstrap, group_id=self.group, enable_auto_commit=False,
                      auto_offset_reset="earliest", request_timeout_ms=5000,
                      session_timeout_ms=10_000) as consumer:
            consumer.subscribe([self.topic])
            while not self._stop.is_set():
                try:
                    if consumer.poll(timeout_ms=200):
                        consumer.commit()
                        self.committed += 1
                except Exception as err:  # a fault in progress: keep going
                    self.errors.append(repr(err))
                    time.sleep(0.2)

    def _sample(self) -> None:
        from strata.client import Admin

        with Admin(self.bootstrap, request_timeout_ms=5000) as admin:
            while not self._stop.wait(0.5):
                try:
                    offsets = admin.list_group_offsets(self.group)
                except Exception:  # the coordinator is moving: the next sample will do
                    continue
                self.samples.append((time.monotonic(), {
                    tp.partition: c.offset for tp, c in offsets.items() if c.offset >= 0}))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def backwards(self) -> list[str]:
        out, last = [], {}
        for at, offsets in self.samples:
            for partition, offset in offsets.items():
                if offset < last.get(partition, -1):
                    out.append(f"p{partition}: committed {last[partition]} then {offset} "
                               f"at {at:.1f}")
                last[partition] = max(offset, last.get(partition, -1))
        return out
