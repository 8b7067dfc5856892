"""Replication between real broker processes (issue [4/7] sections 1 and 2).

Each test runs its own ZooKeeper and three brokers (tests/support/cluster.py), so a
controller or a registration left by another test can never interfere. What is
checked: followers hold byte-identical copies; a killed leader is replaced by an in-sync
replica with a new epoch and nothing acknowledged is lost; ``min.insync.replicas``
refuses acks=all writes when too few replicas are in sync; a returning leader truncates
the tail only it had, by OffsetForLeaderEpoch, not by its high watermark; unclean leader
election happens only when the topic allows it; the controller role moves when its
broker dies.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokers.log.checkpoint import PartitionOffsetsCheckpoint
from brokers.log_manager import HIGH_WATERMARK_CHECKPOINT_FILE
from strata.client import Consumer, Producer, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.cluster import Cluster
from tests.test_broker_api import call, produce, run
from wire.errors import (
    InvalidReplicationFactorError,
    NotEnoughReplicasError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    AlterPartitionReassignmentsRequest,
    ApiKey,
    ConfigEntry,
    CreatableTopic,
    CreateTopicsRequest,
    ElectionTopic,
    ElectLeadersRequest,
    ListPartitionReassignmentsRequest,
    MetadataRequest,
    ReassignablePartition,
    ReassignableTopic,
    ReplicaAssignment,
)
from wire.record_batch import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, brokers=3) as running:
        yield running


def create_assigned(cluster: Cluster, name: str, assignment: dict[int, list[int]],
                    configs: dict[str, str] | None = None) -> None:
    """CreateTopics with explicit replica lists (first = preferred leader)."""
    broker = next(b for b in cluster.brokers.values() if b.running)
    response = run(call(broker, ApiKey.CREATE_TOPICS, CreateTopicsRequest([CreatableTopic(
        name, -1, -1, [ConfigEntry(k, v) for k, v in (configs or {}).items()],
        [ReplicaAssignment(p, r) for p, r in assignment.items()])])))
    assert response.topics[0].error_code == 0, response
    cluster.wait_for(f"{name} has leaders", lambda: cluster.leaders(name),
                     lambda leaders: all(leader >= 0 for leader in leaders.values()), 30)


def segment_bytes(directory: Path) -> bytes:
    """Every record byte of a replica, segments in offset order."""
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def read_all(cluster: Cluster, topic: str, partition: int, count: int) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, partition)])
        consumer.seek(TopicPartition(topic, partition), 0)
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                values.append(record.value)
    return values


def test_followers_hold_byte_identical_copies(cluster: Cluster) -> None:
    cluster.create_topic("copies", 3, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy("copies")
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [producer.send("copies", f"v{i}".encode(), partition=i % 3)
                   for i in range(900)]
        producer.flush()
        assert all(f.result(timeout=30).offset >= 0 for f in futures)
    watermarks = cluster.high_watermarks("copies")
    assert watermarks == {0: 300, 1: 300, 2: 300}
    cluster.stop_all()
    for p in range(3):
        copies = {b: segment_bytes(cluster.partition_dir(b, "copies", p)) for b in range(3)}
        assert len(set(copies.values())) == 1, f"partition {p}: replicas differ"
        assert len(copies[0]) > 0


def test_a_killed_leader_is_replaced_by_an_in_sync_replica(cluster: Cluster) -> None:
    cluster.create_topic("failover", 1, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy("failover")
    before = cluster.partition_state("failover", 0)
    with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=60_000) as producer:
        for i in range(200):
            producer.send("failover", f"a{i}".encode(), partition=0)
        producer.flush()
        cluster.kill(before.leader)
        after = cluster.wait_for(
            "a new leader", lambda: cluster.partition_state("failover", 0),
            lambda s: s.leader not in (-1, before.leader), 30)
        assert after.leader in before.isr
        assert after.leader_epoch == before.leader_epoch + 1
        assert before.leader not in after.isr
        futures = [producer.send("failover", f"b{i}".encode(), partition=0)
                   for i in range(100)]
        producer.flush()
        offsets = [f.result(timeout=60).offset for f in futures]
    assert offsets == list(range(200, 300))
    expected = [f"a{i}".encode() for i in range(200)] + [f"b{i}".encode() for i in range(100)]
    assert read_all(cluster, "failover", 0, 300) == expected
    # What an operator's dashboard sees on the new leader: the partition is under-
    # replicated while the old leader is down, and nothing is offline.
    leader = cluster.brokers[after.leader]
    shown = cluster.wait_for(
        "the under-replicated gauge", lambda: scrape(leader),
        lambda m: m.get('strata_partition_under_replicated{partition="0",topic="failover"}')
        == 1.0, 30)
    assert shown["strata_offline_partitions"] == 0.0
    cluster.restart(before.leader)
    cluster.wait_until_healthy("failover")
    healed = cluster.wait_for(
        "the gauge back at 0", lambda: scrape(leader),
        lambda m: m.get('strata_partition_under_replicated{partition="0",topic="failover"}')
        == 0.0, 30)
    assert healed["strata_isr_expands_total"] >= 1.0, healed


def scrape(broker: BrokerProcess) -> dict[str, float]:
    """The broker's /metrics as ``{"name{labels}": value}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_min_insync_replicas_refuses_acks_all_when_too_few_replicas_are_in_sync(
        cluster: Cluster) -> None:
    create_assigned(cluster, "guarded", {0: [0, 1, 2]}, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy("guarded")
    cluster.kill(1)
    cluster.kill(2)
    cluster.wait_for("ISR [0]", lambda: cluster.isr_of("guarded", 0),
                     lambda isr: tuple(isr) == (0,), 30)
    leader = cluster.brokers[0]
    # ZooKeeper has the shrunk ISR a moment before the leader has applied it (the state
    # comes back to it by watch): wait until the leader's own metadata says [0], or an
    # acks=all write in that moment is appended and refused only after the append.
    cluster.wait_for("the leader's ISR [0]", lambda: run(call(
        leader, ApiKey.METADATA, MetadataRequest(["guarded"]))).topics[0].partitions[0].isr,
        lambda isr: list(isr) == [0], 30)
    refused = produce(leader, "guarded", 0, build_batch([b"x"]), acks=-1)
    assert refused.error_code == NotEnoughReplicasError.code, refused
    assert "min.insync.replicas is 2" in refused.error_message
    # acks=1 does not promise replication: it is still taken.
    assert produce(leader, "guarded", 0, build_batch([b"y"]), acks=1).error_code == 0
    cluster.restart(1)
    cluster.wait_for("ISR back to two", lambda: cluster.isr_of("guarded", 0),
                     lambda isr: len(isr) >= 2, 30)
    assert produce(leader, "guarded", 0, build_batch([b"z"]), acks=-1).error_code == 0


def test_a_returning_leader_truncates_the_tail_only_it_had(cluster: Cluster) -> None:
    """KIP-279: the old leader's records that no follower got (acks=1, then a crash) go;
    the records the new leader took in the meantime take their offsets."""
    create_assigned(cluster, "diverge", {0: [0, 1, 2]})
    cluster.wait_until_healthy("diverge")
    old = cluster.brokers[0]
    assert produce(old, "diverge", 0, build_batch([b"kept-1", b"kept-2"])).error_code == 0
    cluster.wait_for("followers caught up", lambda: cluster.high_watermarks("diverge"),
                     lambda hw: hw == {0: 2}, 30)
    cluster.pause(1)
    cluster.pause(2)
    try:
        # Parked follower fetches time out (replica.fetch.wait.max.ms) and are answered
        # empty before the write, so no follower can receive it.
        time.sleep(1.0)
        lonely = produce(old, "diverge", 0, build_batch([b"lost-1", b"lost-2", b"lost-3"]),
                         acks=1)
        assert lonely.error_code == 0 and lonely.base_offset == 2
        cluster.kill(0)
    finally:
        cluster.resume(1)
        cluster.resume(2)
    state = cluster.wait_for("a new leader", lambda: cluster.partition_state("diverge", 0),
                             lambda s: s.leader in (1, 2), 40)
    new_leader = cluster.brokers[state.leader]
    answer = cluster.wait_for(
        "the new leader takes writes",
        lambda: produce(new_leader, "diverge", 0, build_batch([b"new-1", b"new-2"])),
        lambda a: a.error_code == 0, 30)
    assert answer.base_offset == 2  # the offsets the lost records had
    cluster.restart(0)
    cluster.wait_for("broker 0 back in sync", lambda: cluster.isr_of("diverge", 0),
                     lambda isr: 0 in isr, 40)
    assert "truncating the divergent tail 2..5" in cluster.broker_log(0)
    assert read_all(cluster, "diverge", 0, 4) == [b"kept-1", b"kept-2", b"new-1", b"new-2"]
    cluster.stop_all()
    copies = {b: segment_bytes(cluster.partition_dir(b, "diverge", 0)) for b in range(3)}
    assert len(set(copies.values())) == 1, "replicas differ after truncation"


def test_unclean_leader_election_only_where_the_topic_allows_it(cluster: Cluster) -> None:
    create_assigned(cluster, "clean", {0: [0, 1]})
    create_assigned(cluster, "unclean", {0: [0, 1]},
                    {"unclean.leader.election.enable": "true"})
    for topic in ("clean", "unclean"):
        cluster.wait_until_healthy(topic)
    cluster.stop(1)  # the follower leaves; the ISR shrinks to the leader
    for topic in ("clean", "unclean"):
        cluster.wait_for(f"{topic} ISR [0]", lambda t=topic: cluster.isr_of(t, 0),
                         lambda isr: tuple(isr) == (0,), 30)
        assert produce(cluster.brokers[0], topic, 0, build_batch([b"only-on-0"])
                       ).error_code == 0
    cluster.kill(0)
    cluster.restart(1)
    unclean = cluster.wait_for("unclean elects broker 1",
                               lambda: cluster.partition_state("unclean", 0),
                               lambda s: s.leader == 1, 40)
    assert unclean.isr == (1,)
    clean = cluster.partition_state("clean", 0)
    assert clean.leader == -1, clean  # waits for broker 0, the last in-sync replica
    assert list(clean.isr) == [0]
    cluster.restart(0)
    cluster.wait_for("clean led by broker 0 again", lambda: cluster.partition_state("clean", 0),
                     lambda s: s.leader == 0, 40)


def test_the_controller_role_moves_when_its_broker_dies(cluster: Cluster) -> None:
    cluster.create_topic("ctl", 3, 3)
    cluster.wait_until_healthy("ctl")
    first = cluster.controller()
    assert first is not None
    cluster.kill(first[0])
    second = cluster.wait_for("a new controller", cluster.controller,
                              lambda c: c is not None and c[0] != first[0], 30)
    assert second[1] > first[1]  # a newer controller epoch fences the old one
    # The new controller does the job: the dead broker's leaderships moved.
    leaders = cluster.wait_for("no partition led by the dead broker",
                               lambda: cluster.leaders("ctl"),
                               lambda ls: all(v not in (-1, first[0]) for v in ls.values()), 30)
    assert set(leaders.values()) <= set(cluster.brokers) - {first[0]}


def test_preferred_leader_election_moves_leadership_back(cluster: Cluster) -> None:
    create_assigned(cluster, "preferred", {0: [0, 1, 2], 1: [1, 2, 0]})
    cluster.wait_until_healthy("preferred")
    cluster.stop(0)
    cluster.wait_for("p0 led by another broker", lambda: cluster.leader_of("preferred", 0),
                     lambda leader: leader in (1, 2), 30)
    cluster.restart(0)
    cluster.wait_for("broker 0 in sync again", lambda: cluster.isr_of("preferred", 0),
                     lambda isr: 0 in isr, 40)
    assert cluster.leader_of("preferred", 0) != 0  # no automatic move back
    response = run(call(cluster.brokers[2], ApiKey.ELECT_LEADERS, ElectLeadersRequest(
        [ElectionTopic("preferred", [0, 1, 7])], timeout_ms=20_000)))
    answers = {(t.name, a.partition): a for t in response.topics for a in t.partitions}
    assert answers[("preferred", 0)].error_code == 0
    assert answers[("preferred", 0)].leader == 0
    assert answers[("preferred", 1)].leader == 1  # already preferred: unchanged
    assert answers[("preferred", 7)].error_code == UnknownTopicOrPartitionError.code
    assert cluster.leader_of("preferred", 0) == 0


def test_reassignment_copies_the_log_then_switches_replicas(cluster: Cluster) -> None:
    create_assigned(cluster, "moving", {0: [0, 1]}, {"min.insync.replicas": "1"})
    cluster.wait_until_healthy("moving")
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(500):
            producer.send("moving", f"m{i}".encode(), partition=0)
        producer.flush()
    response = run(call(cluster.brokers[1], ApiKey.ALTER_PARTITION_REASSIGNMENTS,
                        AlterPartitionReassignmentsRequest([ReassignableTopic(
                            "moving", [ReassignablePartition(0, [2, 1])])])))
    assert response.topics[0].partitions[0].error_code == 0, response
    cluster.wait_for("replicas [2, 1]", lambda: cluster.replicas("moving"),
                     lambda r: r == {0: [2, 1]}, 60)
    # The leader keeps the ISR: one that saw the new replica set late may have taken
    # broker 0 back in just before; it drops it again once it sees the set.
    state = cluster.wait_for("ISR {1, 2} led by 1 or 2",
                             lambda: cluster.partition_state("moving", 0),
                             lambda s: s.leader in (1, 2) and set(s.isr) == {1, 2}, 30)
    assert state.leader_epoch >= 1  # broker 0 led; leadership moved with a new epoch
    cluster.wait_for("broker 0's copy deleted",
                     lambda: cluster.partition_dir(0, "moving", 0).exists(),
                     lambda exists: not exists, 30)
    listed = run(call(cluster.brokers[1], ApiKey.LIST_PARTITION_REASSIGNMENTS,
                      ListPartitionReassignmentsRequest()))
    assert listed.reassignments == []
    assert read_all(cluster, "moving", 0, 500) == [f"m{i}".encode() for i in range(500)]
    cluster.stop_all()
    assert segment_bytes(cluster.partition_dir(2, "moving", 0)) == \
        segment_bytes(cluster.partition_dir(1, "moving", 0))


def test_reassignment_to_a_dead_broker_is_refused(cluster: Cluster) -> None:
    create_assigned(cluster, "nowhere", {0: [0]})
    response = run(call(cluster.brokers[0], ApiKey.ALTER_PARTITION_REASSIGNMENTS,
                        AlterPartitionReassignmentsRequest([ReassignableTopic(
                            "nowhere", [ReassignablePartition(0, [0, 9]),
                                        ReassignablePartition(0, [1, 1]),
                                        ReassignablePartition(3, [1])])])))
    codes = [(a.error_code, a.error_message) for a in response.topics[0].partitions]
    assert codes[0][0] == InvalidReplicationFactorError.code and "[9]" in codes[0][1]
    assert codes[1][0] == InvalidReplicationFactorError.code and "twice" in codes[1][1]
    assert codes[2][0] == UnknownTopicOrPartitionError.code
    assert cluster.replicas("nowhere") == {0: [0]}


def test_a_short_zookeeper_stall_changes_no_leadership(cluster: Cluster) -> None:
    """SIGSTOP ZooKeeper for less than the session timeout: brokers see their sessions
    SUSPENDED, decide nothing, keep taking acks=all writes, and carry on with the same
    sessions, leaders and epochs once ZooKeeper answers again."""
    cluster.create_topic("stall", 2, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy("stall")
    before = {p: cluster.partition_state("stall", p) for p in range(2)}
    zookeeper = cluster.zk_nodes[0]
    pid = zookeeper.pid
    assert pid is not None
    with Producer(cluster.bootstrap, acks="all") as producer:
        # Producer ids come from ZooKeeper: get one before it stalls.
        producer.send("stall", b"first", partition=0).result(timeout=30)
        # Resumed by a timer, not after the writes: however slow this machine is, the
        # stall stays well inside the 6 s session timeout.
        resume = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
        os.kill(pid, signal.SIGSTOP)
        resume.start()
        try:
            time.sleep(1.0)
            futures = [producer.send("stall", f"s{i}".encode(), partition=i % 2)
                       for i in range(200)]
            producer.flush()
            assert all(f.result(timeout=30).offset >= 0 for f in futures)
        finally:
            resume.join()
            os.kill(pid, signal.SIGCONT)  # in case the timer could not
    time.sleep(2.0)  # give the brokers time to act if they (wrongly) wanted to
    after = {p: cluster.partition_state("stall", p) for p in range(2)}
    assert {p: (s.leader, s.leader_epoch) for p, s in after.items()} == \
        {p: (s.leader, s.leader_epoch) for p, s in before.items()}
    for broker_id in cluster.brokers:
        assert "registered again after a lost session" not in cluster.broker_log(broker_id)
    assert read_all(cluster, "stall", 0, 101) == \
        [b"first"] + [f"s{i}".encode() for i in range(0, 200, 2)]


def test_every_replicas_high_watermark_is_checkpointed_and_survives_a_crash(
        cluster: Cluster) -> None:
    """The ISR upkeep writes each broker's ``replication-offset-checkpoint`` (one file per
    data directory, Kafka's) with the HW of every replica it hosts, leaders and followers
    alike, and nothing per partition. After SIGKILL of every broker (no close: only the
    routine writes count) the files hold the acknowledged HWs, and the restarted cluster
    serves them."""
    cluster.create_topic("hwfile", 3, 3, {"min.insync.replicas": "2"})
    cluster.wait_until_healthy("hwfile")
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [producer.send("hwfile", b"v%d" % i, partition=i % 3) for i in range(90)]
        producer.flush()
        assert all(f.result(timeout=30).offset >= 0 for f in futures)
    expected = {("hwfile", p): 30 for p in range(3)}

    def checkpointed() -> dict[int, dict[tuple[str, int], int]]:
        return {b: {k: v for k, v in PartitionOffsetsCheckpoint(
                    broker.data_dir / HIGH_WATERMARK_CHECKPOINT_FILE).read().items()
                    if k[0] == "hwfile"}
                for b, broker in cluster.brokers.items()}

    cluster.wait_for("every broker's checkpoint to hold HW 30 for each of its replicas",
                     checkpointed, lambda files: all(f == expected for f in files.values()), 30)
    for broker_id in list(cluster.brokers):
        cluster.kill(broker_id)
    assert all(files == expected for files in checkpointed().values())
    assert not any((cluster.partition_dir(b, "hwfile", p) / "high-watermark").exists()
                   for b in cluster.brokers for p in range(3))
    for broker_id in list(cluster.brokers):
        cluster.restart(broker_id)
    cluster.wait_until_healthy("hwfile")
    assert cluster.high_watermarks("hwfile") == {0: 30, 1: 30, 2: 30}
