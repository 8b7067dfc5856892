"""Spark on a real cluster (issue [2.5] section 3): a standalone master and worker
(tests/support/spark_standalone.py), so every task runs in an executor JVM and Python
worker of its own, not in the driver, against a real broker:

- the streaming pipeline strata -> strata with the exactly-once sink
  (tests/support/spark_pipeline.py), its driver SIGKILLed once mid-run and resumed from
  the checkpoint: the sink topic holds exactly one transformed copy of every record;
- then, in the resumed driver's application (one driver and executor start fewer): a
  pass of the tiering job (what `strata tier run --once` does) into a Delta warehouse,
  a batch read, and a notebook's query over the tiered table (`notebook_spark`,
  `register_tables`).

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

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(900)]

RECORDS = 6_000
PARTITIONS = 2
HISTORY = "cluster-history"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    standalone = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield standalone.start()
    finally:
        standalone.stop()


#: One driver: the exactly-once pipeline; with ``all``, then (in the same application,
#: so one driver and one executor JVM start fewer) a pass of the tiering job (what `strata
#: tier run --once` does), a batch read and a notebook's query over the tiered table.
DRIVER = """
import json, sys
from pathlib import Path
from spark_jobs import TierJob, TierSettings, catalog_name, register_tables
from strata_tools.notebook import notebook_spark
from tests.support.spark_pipeline import run_pipeline
mode, bootstrap, checkpoint, topic, warehouse = sys.argv[1:6]
spark = notebook_spark("cluster-driver", {"spark.sql.shuffle.partitions": "2"})
run_pipeline(spark, bootstrap, "cluster-a", "cluster-b", checkpoint, "1000")
if mode == "all":
    with TierJob(spark, TierSettings(bootstrap, Path(warehouse), lease_wait_s=60)) as job:
        report = job.run_once([topic])
    assert not any(t.error for t in report.topics), report.to_json()
    rows = (spark.read.format("strata").option("bootstrap.servers", bootstrap)
            .option("subscribe", topic).load())
    read = rows.count()
    distinct = rows.select("partition", "offset").distinct().count()
    # Where the tasks ran: executor JVMs, not the driver.
    executors = spark.sparkContext._jsc.sc().getExecutorIds().size()
    register_tables(spark, Path(warehouse))
    table = f"strata.{catalog_name(topic)}"
    tiered = spark.sql(f"SELECT count(*) AS n, count(DISTINCT value) AS d FROM {table}").first()
    print(json.dumps({"master": spark.sparkContext.master, "executors": executors,
                      "read": read, "distinct": distinct, "tiered": tiered.n,
                      "tiered_distinct": tiered.d}))
spark.stop()
"""


class Driver:
    """One run of the driver process, killed by process group."""

    def __init__(self, cluster: SparkStandalone, mode: str, bootstrap: str, checkpoint: Path,
                 warehouse: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, mode, bootstrap, str(checkpoint), HISTORY,
             str(warehouse)],
            cwd=REPO, env=cluster.driver_env(PYTHONPATH=str(REPO)), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait(self, timeout: float) -> int:
        """The exit status; an assertion with the driver's last lines if it runs on."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the driver still runs after {timeout:.0f} s; its last "
                                 f"lines:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def tail(self) -> str:
        return "".join(self.lines[-60:])


def _sink_records(bootstrap: str) -> list[bytes]:
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200,
                  isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition("cluster-b", p) for p in range(PARTITIONS)])
        values: list[bytes] = []
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 2.0:
            batch = consumer.poll(timeout_ms=300)
            if batch:
                quiet_since = time.monotonic()
            values += [r.value for r in batch if r.value is not None]
        return values


def test_pipeline_with_its_driver_killed_tiering_a_read_and_a_query_on_executors(
        cluster: SparkStandalone, broker: BrokerProcess, tmp_path: Path) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([
            NewTopic("cluster-a", PARTITIONS, 1), NewTopic("cluster-b", PARTITIONS, 1),
            NewTopic(HISTORY, PARTITIONS, 1, {
                "segment.bytes": "4096", "tier.enable": "true", "tier.after.ms": "0"})])
    values = [f"e{i:05d}".encode() for i in range(RECORDS)]
    with Producer(broker.bootstrap, acks="all") as producer:
        for i, value in enumerate(values):
            producer.send("cluster-a", value, partition=i % PARTITIONS)
            producer.send(HISTORY, f"h{i}".encode(), partition=i % PARTITIONS)
        producer.flush()
    checkpoint, warehouse = tmp_path / "checkpoint", tmp_path / "warehouse"
    first = Driver(cluster, "pipeline", broker.bootstrap, checkpoint, warehouse)
    try:
        # SIGKILL the driver once the sink has some of the records: mid-run.
        deadline = time.monotonic() + 180
        while len(_sink_records(broker.bootstrap)) == 0:
            assert first.process.poll() is None, first.tail()
            assert time.monotonic() < deadline, first.tail()
            time.sleep(0.5)
    finally:
        first.kill()
    partial = len(_sink_records(broker.bootstrap))
    second = Driver(cluster, "all", broker.bootstrap, checkpoint, warehouse)
    try:
        assert second.wait(480) == 0, second.tail()
    finally:
        second.kill()
    got = _sink_records(broker.bootstrap)
    assert sorted(got) == sorted(b"T:" + v for v in values), \
        f"{len(got)} records in the sink, {len(set(got))} distinct, of {RECORDS} " \
        f"({partial} before the kill)"
    result = json.loads(next(line for line in reversed(second.lines)
                             if line.startswith("{")))
    assert result["master"] == cluster.url and result["executors"] >= 1, result
    assert result["read"] == result["distinct"] == RECORDS, result
    # Closed segments went to Delta: most of the history, each record once.
    assert 0 < result["tiered"] == result["tiered_distinct"] <= RECORDS, result
    # The executors of both drivers are gone with them.
    deadline = time.monotonic() + 60
    while cluster.executors():
        assert time.monotonic() < deadline, "executors left running: " + "; ".join(
            f"{pid} {(cmdline(pid) or '')[-300:]}" for pid in cluster.executors())
        time.sleep(0.5)
