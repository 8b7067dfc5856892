"""Spark's own Kafka connector reads and writes Strata topics (issue [3.6], section 4).

``spark-sql-kafka-0-10`` (kafka-clients 3.9 inside, as Spark 4.2 ships it) points at a
broker's Kafka listener: its driver lists offsets through the Admin client (ListOffsets,
Metadata), its executors fetch with assigned consumers, and its sink is an idempotent
acks=all KafkaProducer (InitProducerId). The job runs in its own process
(``tests/support/spark_kafka_job.py``): its JVM needs the connector on the classpath from
the start. Records written by librdkafka are read by Spark with the same partitions,
offsets, keys, values and headers, by a batch query and by a streaming one; what Spark
writes is read back by Strata's consumer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer as KProducer
from confluent_kafka.admin import AdminClient, NewTopic

from strata.client import Consumer
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[1]
COUNT = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("spark-kafka"), brokers=1, kafka=True) as c:
        yield c


def test_spark_kafka_connector_reads_and_writes_strata_topics(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    kafka = cluster.kafka_bootstrap
    admin = AdminClient({"bootstrap.servers": kafka})
    for name, partitions in (("spark-in", 3), ("spark-out", 2)):
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    time.sleep(1)
    producer = KProducer({"bootstrap.servers": kafka, "acks": "all",
                          "enable.idempotence": True, "compression.type": "lz4"})
    sent: list[list[object]] = []
    errors: list[object] = []

    def delivered(err: object, msg: object, i: int) -> None:
        if err is not None:
            errors.append(err)
        else:
            sent.append([msg.partition(), msg.offset(), f"k{i}", f"v{i}",  # type: ignore[attr-defined]
                         ["n", str(i)]])

    for i in range(COUNT):
        producer.produce("spark-in", key=f"k{i}".encode(), value=f"v{i}".encode(),
                         partition=i % 3, headers=[("n", str(i).encode())],
                         on_delivery=lambda e, m, i=i: delivered(e, m, i))
    assert producer.flush(30) == 0 and not errors and len(sent) == COUNT
    job = subprocess.run(
        [sys.executable, "-m", "tests.support.spark_kafka_job", kafka, "spark-in", "spark-out",
         str(COUNT), str(tmp_path / "checkpoint")],
        cwd=REPO, capture_output=True, text=True, timeout=360, check=False)
    (tmp_path / "job.err").write_text(job.stderr)
    assert job.returncode == 0, job.stderr[-4000:]
    report = json.loads(job.stdout.strip().splitlines()[-1])
    assert report["read"] == sorted(sent)
    assert (report["batch_rows"], report["stream_rows"], report["stream_distinct"]) == \
        (COUNT, COUNT, COUNT)
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    consumer.assign([("spark-out", 0), ("spark-out", 1)])
    out = []
    deadline = time.monotonic() + 30
    while len(out) < COUNT and time.monotonic() < deadline:
        out += consumer.poll(timeout_ms=300)
    consumer.close()
    assert sorted((r.key, r.value) for r in out) == \
        sorted((f"k{i}".encode(), f"V{i}".encode()) for i in range(COUNT))
