"""Smoke test of load_tests/locustfile.py: a short headless locust run (all three user
classes) against a real `strata gateway --no-auth` in front of a real broker. It checks
that the locustfile works with the gateway's API as it is, not how fast it is."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from strata.client import Admin, NewTopic
from tests.support.broker_process import BrokerProcess
from tests.support.gateway import REPO, running_gateway, stop_child
from tests.support.waiting import wait_for

pytestmark = pytest.mark.system

LOCUST = Path(sys.executable).with_name("locust")
TOPIC = "load-smoke"


@pytest.fixture
def gateway_url(broker: BrokerProcess) -> Iterator[str]:
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])
    with running_gateway(broker.bootstrap, "--no-auth") as gateway:
        wait_for("gateway ready", lambda: httpx.get(f"{gateway.url}/readyz").status_code,
                 lambda s: s == 200, timeout=30)
        yield gateway.url


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
        stop_child(process)
    text = output.decode(errors="replace")
    with (tmp_path / "smoke_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    total = rows["Aggregated"]
    assert int(total["Request Count"]) > 0, text
    assert int(total["Failure Count"]) == 0, text
    # Every user class did its part.
    for name in ("produce 1 record", "produce batch of 20", "read 1 record"):
        assert int(rows[name]["Request Count"]) > 0, (name, text)
