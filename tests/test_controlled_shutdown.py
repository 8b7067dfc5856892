"""Controlled shutdown and start-up limits against real broker processes.

The success path (every leadership moved before the broker's registration vanishes,
no failed send while each broker restarts in turn) is tests/test_rolling_restart.py.
Here: what happens when the controller cannot act (the broker waits at most
``controlled.shutdown.timeout.ms``, says so and stops anyway), and a broker that
cannot hold its partitions' files refuses to start with a message saying what to do.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata.client import Admin, NewTopic
from tests.support.broker_process import REPO, BrokerProcess
from tests.support.cluster import Cluster
from zookeeper.launcher import ZooKeeperServer

pytestmark = pytest.mark.integration


def test_a_stuck_controller_delays_a_controlled_shutdown_only_up_to_its_timeout(
        tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, overrides={"controlled.shutdown.timeout.ms": "1500",
                                         "zookeeper.session.timeout.ms": "10000"}) as cluster:
        cluster.create_topic("cs", 6, 3, {"min.insync.replicas": "2"})
        cluster.wait_until_healthy("cs")
        controller = cluster.controller_id()
        assert controller is not None
        leaders = cluster.leaders("cs")
        victim = next(b for b in sorted(set(leaders.values())) if b != controller)
        led = sorted(p for p, b in leaders.items() if b == victim)
        # A paused controller keeps its session (10 s) but decides nothing.
        cluster.pause(controller)
        started = time.monotonic()
        code = cluster.stop(victim, timeout=30)
        took = time.monotonic() - started
        cluster.resume(controller)
        text = cluster.broker_log(victim)
        assert code == 0, text[-3000:]
        assert "did not finish within controlled.shutdown.timeout.ms=1500" in text, text[-3000:]
        assert took < 25, f"stopping took {took:.1f} s"  # bounded, not stuck forever
        # The controller comes back and moves what the victim led after all.
        for p in led:
            cluster.wait_for_new_leader("cs", p, victim)
        cluster.restart(victim)
        cluster.wait_until_healthy("cs")


def test_a_broker_refuses_to_start_when_its_open_file_limit_cannot_hold_its_logs(
        tmp_path: Path, zookeeper_server: ZooKeeperServer) -> None:
    broker = BrokerProcess(zookeeper_server.connect_string, tmp_path / "b0")
    broker.start()
    try:
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("many", 120, 1)])
    finally:
        assert broker.stop() == 0, broker.log_text()[-3000:]
    # The broker keeps 2,048 files spare for connections; 2,100 cannot also hold the
    # 120 logs it hosts.
    limit = 2_100

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    args = [sys.executable, "-m", "brokers", "--broker-id", "0", "--port", str(broker.port),
            "--data-dir", str(tmp_path / "b0"), "--zookeeper", zookeeper_server.connect_string,
            "--metrics-port", "0", "--override", "zookeeper.session.timeout.ms=6000",
            "--override", "offsets.topic.replication.factor=1"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, PYTHONPATH=str(REPO)),
                               preexec_fn=limit_files, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 2, output[-3000:]
    assert "would host 120 partition logs but may open only 2100 files" in output, output
    assert "ulimit -n" in output
    # With the limit it needs, the same data starts (nothing was damaged by the refusal).
    broker.start()
    try:
        with Admin(broker.bootstrap) as admin:
            assert admin.describe_topics(["many"])["many"].partitions[119].leader == 0
    finally:
        assert broker.stop() == 0
