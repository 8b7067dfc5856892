"""Spark on a real cluster (issue [2.5] section 3): a standalone master and worker
(tests/support/spark_standalone.py), so every task runs in an executor JVM and Python
worker of its own, not in the driver, against a real broker:

- the streaming pipeline strata -> strata with the exactly-once sink
  (tests/support/spark_pipeline.py), its driver SIGKILLed once mid-run and resumed from
  the checkpoint: the sink topic holds exactly one transformed copy of every record;
- in one driver: a pass of the tiering job (what `strata tier run --once` does) into a
  Delta warehouse, a batch read, and a notebook's query over the tiered table
  (`notebook_spark`, `register_tables`).

Each driver is a process of its own whose ``PYSPARK_SUBMIT_ARGS`` name the master; the
executors reach the broker at the address metadata advertises (127.0.0.1 here) and run
the code from this environment (on other machines: docs/spark.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import cmdline
from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.support.broker_process import REPO, BrokerProcess
from tests.support.spark_standalone import SparkStandalone

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

RECORDS = 6_000
PARTITIONS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    standalone = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield standalone.start()
    finally:
        standalone.stop()


def driver(cluster: SparkStandalone, args: list[str], timeout: float = 240
           ) -> subprocess.CompletedProcess[str]:
    env = cluster.driver_env(PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


TIER_READ_AND_QUERY = """
import json, sys
from pathlib import Path
from spark_jobs import TierJob, TierSettings, catalog_name, register_tables
from strata_tools.notebook import notebook_spark
bootstrap, topic, warehouse = sys.argv[1], sys.argv[2], Path(sys.argv[3])
spark = notebook_spark("cluster-tier-read-query")
# The tiering job's pass (what `strata tier run --once` does), on the cluster.
with TierJob(spark, TierSettings(bootstrap, warehouse, lease_wait_s=60)) as job:
    report = job.run_once([topic])
assert not any(t.error for t in report.topics), report.to_json()
# A batch read.
rows = (spark.read.format("strata").option("bootstrap.servers", bootstrap)
        .option("subscribe", topic).load())
read = rows.count()
distinct = rows.select("partition", "offset").distinct().count()
# Where the tasks ran: executor JVMs, not the driver.
executors = spark.sparkContext._jsc.sc().getExecutorIds().size()
# A notebook's query over the tiered table.
register_tables(spark, warehouse)
table = f"strata.{catalog_name(topic)}"
tiered = spark.sql(f"SELECT count(*) AS n, count(DISTINCT value) AS d FROM {table}").first()
print(json.dumps({"master": spark.sparkContext.master, "executors": executors,
                  "read": read, "distinct": distinct, "tiered": tiered.n,
                  "tiered_distinct": tiered.d}))
spark.stop()
"""


def test_tiering_a_batch_read_and_a_notebook_query_run_on_executors(
        cluster: SparkStandalone, broker: BrokerProcess, tmp_path: Path) -> None:
    topic = "cluster-history"
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1, {
            "segment.bytes": "4096", "tier.enable": "true", "tier.after.ms": "0"})])
    with Producer(broker.bootstrap, acks="all") as producer:
        for i in range(RECORDS):
            producer.send(topic, f"h{i}".encode(), partition=i % PARTITIONS)
        producer.flush()
    run = driver(cluster, ["-c", TIER_READ_AND_QUERY, broker.bootstrap, topic,
                           str(tmp_path / "warehouse")])
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["master"] == cluster.url and result["executors"] >= 1, result
    assert result["read"] == result["distinct"] == RECORDS, result
    # Closed segments went to Delta: most of the history, each record once.
    assert 0 < result["tiered"] == result["tiered_distinct"] <= RECORDS, result


class Pipeline:
    """One run of the exactly-once pipeline's driver, killed by process group."""

    def __init__(self, cluster: SparkStandalone, bootstrap: str, checkpoint: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.spark_pipeline", "--bootstrap", bootstrap,
             "--source", "cluster-a", "--sink", "cluster-b", "--checkpoint", str(checkpoint),
             "--max-offsets", "1000"],
            cwd=REPO, env=cluster.driver_env(PYTHONPATH=str(REPO)), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        self.done = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("pipeline done"):
                self.done.set()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


def _sink_records(bootstrap: str) -> list[bytes]:
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        consumer.assign([TopicPartition("cluster-b", p) for p in range(PARTITIONS)])
        values: list[bytes] = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 2.0:
            batch = consumer.poll(timeout_ms=300)
            if batch:
                quiet_since = time.monotonic()
            values += [r.value for r in batch if r.value is not None]
        return values


def test_exactly_once_pipeline_survives_its_driver_killed(
        cluster: SparkStandalone, broker: BrokerProcess, tmp_path: Path) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("cluster-a", PARTITIONS, 1),
                             NewTopic("cluster-b", PARTITIONS, 1)])
    values = [f"e{i:05d}".encode() for i in range(RECORDS)]
    with Producer(broker.bootstrap, acks="all") as producer:
        for i, value in enumerate(values):
            producer.send("cluster-a", value, partition=i % PARTITIONS)
        producer.flush()
    checkpoint = tmp_path / "checkpoint"
    first = Pipeline(cluster, broker.bootstrap, checkpoint)
    try:
        # Kill the driver once the sink has some, but not all, of the records.
        deadline = time.monotonic() + 180
        while len(_sink_records(broker.bootstrap)) == 0:
            assert first.process.poll() is None, "".join(first.lines[-60:])
            assert time.monotonic() < deadline, "".join(first.lines[-60:])
            time.sleep(0.5)
    finally:
        first.kill()
    partial = len(_sink_records(broker.bootstrap))
    second = Pipeline(cluster, broker.bootstrap, checkpoint)
    try:
        assert second.done.wait(240), "".join(second.lines[-60:])
    finally:
        second.kill()
    got = _sink_records(broker.bootstrap)
    assert 0 < partial < RECORDS or partial == RECORDS, partial
    assert sorted(got) == sorted(b"T:" + v for v in values), \
        f"{len(got)} records in the sink, {len(set(got))} distinct, of {RECORDS}"
    # The executors the killed driver had are gone; only the worker's idle state remains.
    deadline = time.monotonic() + 60
    while cluster.executors():
        assert time.monotonic() < deadline, "executors left running: " + "; ".join(
            f"{pid} {(cmdline(pid) or '')[-300:]}" for pid in cluster.executors())
        time.sleep(0.5)
