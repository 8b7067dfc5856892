"""Replication under faults with stock Kafka clients on both ends (issue [3.6], section 4).

The nemesis of tests/test_faults.py scenario (a), leaders SIGKILLed and restarted, on a
3-broker cluster with Kafka listeners: three librdkafka producers (idempotent, acks=all)
write numbered records through the Kafka listeners while the kills go on
(``tests.support.kafka_workload``); after healing, a librdkafka consumer reads every
partition from offset 0 to its high watermark, and the same checker as the Strata runs
(``nemesis.check``, itself shown to fail on bad histories in tests/test_fault_checker.py)
compares: every acknowledged record read at the offset it was acknowledged at, nothing
lost, nothing duplicated, nothing unexpected, per-producer order kept. Strata's own
reader then reads the same partitions and must see the same records at the same offsets,
and the replicas' segment files are byte-compared.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import pid_alive
from tests.support.cluster import Cluster
from tests.support.kafka_workload import KafkaWorkload, read_partitions_kafka
from tests.support.nemesis import (
    Phase,
    check,
    compare_replicas,
    explain,
    kill_leaders,
    read_partitions,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(420)]

PARTITIONS = 4
MIN_ACKED = 300


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", 3, kafka=True)
    try:
        yield c.start()
    finally:
        pids = c.pids()
        c.close()
        assert not [pid for pid in pids if pid_alive(pid)], "a cluster process survived"


def test_leaders_killed_under_kafka_clients(cluster: Cluster) -> None:
    topic = "faults-kafka"
    cluster.create_topic(topic, PARTITIONS, 3, {"min.insync.replicas": "2",
                                                "segment.bytes": str(512 * 1024)})
    cluster.wait_until_healthy(topic, timeout=60)
    workload = KafkaWorkload(cluster.kafka_bootstrap, topic, PARTITIONS, producers=3).start()
    workload.wait_for_acks(20, since=0.0, partitions=range(PARTITIONS), timeout=30)
    phases = kill_leaders(cluster, workload, topic, rounds=1)
    after = Phase("after healing", time.monotonic())
    after.expect_progress(cluster, workload, topic, range(PARTITIONS), count=50, timeout=45)
    after.acked_during, after.ended = workload.acked(after.started), time.monotonic()
    workload.stop(30.0)
    cluster.wait_until_healthy(topic, timeout=60)
    hws = cluster.high_watermarks(topic)
    read_by_kafka = read_partitions_kafka(cluster.kafka_bootstrap, topic, hws)
    read_by_strata = read_partitions(cluster.bootstrap, topic, hws)
    cluster.stop_all()
    result = check(workload, read_by_kafka, hws)
    for line in compare_replicas(cluster, topic, hws):
        result.replica_divergences += 1
        result.note(line)
    print(result.summary("(a) leader SIGKILL, Kafka clients"), flush=True)
    message = explain(cluster, result, [*phases, after])
    assert result.anomalies() == dict.fromkeys(result.anomalies(), 0), message
    assert result.acknowledged >= MIN_ACKED, message
    assert not [p.name for p in phases if p.acked_during == 0], message
    assert read_by_strata == read_by_kafka, "Strata's reader and librdkafka disagree"
