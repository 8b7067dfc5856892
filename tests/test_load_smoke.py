"""Smoke test of load_tests/locustfile.py: a short headless locust run (all three user
classes) against a real `strata gateway --no-auth` in front of a real broker. It checks
that the locustfile works with the gateway's API as it is, not how fast it is."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from strata.client import Admin, NewTopic
from strata.procs import free_port
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
LOCUST = Path(sys.executable).with_name("locust")
TOPIC = "load-smoke"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Our own un-reaped child (so its PID is still ours): SIGTERM, then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture
def gateway_url(broker: BrokerProcess, tmp_path: Path) -> Iterator[str]:
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])
    port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "strata.cli", "gateway", "--bootstrap", broker.bootstrap,
         "--port", str(port), "--no-auth", "--shutdown-grace-s", "5", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(REPO)),
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> int:
            if process.poll() is not None:
                raise AssertionError("gateway exited:\n" + (tmp_path / "gateway.log").read_text())
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code
            except httpx.HTTPError:
                return -1

        wait_for("gateway ready", ready, lambda s: s == 200, timeout=30)
        yield url
    finally:
        _stop(process)
        log.close()


def test_locust_headless_run_has_requests_and_no_failures(gateway_url: str,
                                                          tmp_path: Path) -> None:
    prefix = tmp_path / "smoke"
    args = [str(LOCUST), "-f", str(REPO / "load_tests" / "locustfile.py"), "--headless",
            "-u", "4", "-r", "4", "-t", "8s", "--host", gateway_url, "--topic", TOPIC,
            "--batch-size", "20", "--csv", str(prefix), "--only-summary",
            "--stop-timeout", "5"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               cwd=tmp_path, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=45)
    finally:
        _stop(process)
    text = output.decode(errors="replace")
    with (tmp_path / "smoke_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    total = rows["Aggregated"]
    assert int(total["Request Count"]) > 0, text
    assert int(total["Failure Count"]) == 0, text
    # Every user class did its part.
    for name in ("produce 1 record", "produce batch of 20", "read 1 record"):
        assert int(rows[name]["Request Count"]) > 0, (name, text)
