"""`strata up/status/down` as real subprocesses, with a real ZooKeeper and kazoo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from strata.procs import free_port, pid_alive

pytestmark = pytest.mark.timeout(180)


def _strata_command() -> list[str]:
    """The installed console script next to this interpreter (what `make up` runs)."""
    script = Path(sys.executable).parent / "strata"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "strata.cli"]


def strata(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_strata_command(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _track_recorded(reaper: Any, data_dir: Path) -> None:
    """Hand every PID recorded in stack.json to the reaper (killed at teardown)."""
    for rec in json.loads((data_dir / "stack.json").read_text())["processes"]:
        reaper.track(rec["pid"], rec["marker"])


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_up_status_up_again_down(
    tmp_path: Path, reaper: Any, kazoo_factory: Callable[[str], KazooClient]
) -> None:
    data_dir = tmp_path / "stack"
    port = free_port()
    try:
        up = strata(
            "up",
            "--data-dir",
            str(data_dir),
            "--base-port",
            str(port),
            "--format",
            "json",
            cwd=tmp_path,
        )
        assert up.returncode == 0, up.stderr
        _track_recorded(reaper, data_dir)  # before any assertion can fail
        info = _json(up)
        assert info["zookeeper"] == f"127.0.0.1:{port}"
        assert info["bootstrap"] == f"127.0.0.1:{port + 10}" and info["gateway"] is None
        zk, broker = info["processes"]
        assert zk["name"] == "zookeeper" and zk["port"] == port and zk["state"] == "started"
        assert broker["name"] == "broker-0" and broker["port"] == port + 10
        pid, broker_pid = zk["pid"], broker["pid"]
        assert pid_alive(pid) and pid_alive(broker_pid)

        client = kazoo_factory(info["zookeeper"])
        client.create("/strata-cli-test", b"kept")

        status = strata("status", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert [(p["pid"], p["state"]) for p in _json(status)["processes"]] == [
            (pid, "running"), (broker_pid, "running")]

        again = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        again_info = _json(again)
        assert [(p["pid"], p["state"]) for p in again_info["processes"]] == [
            (pid, "running"), (broker_pid, "running")]
        assert again_info["zookeeper"] == info["zookeeper"]

        down = strata("down", "--data-dir", str(data_dir), cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout
        assert not pid_alive(pid) and not pid_alive(broker_pid)

        after = strata("status", "--data-dir", str(data_dir), cwd=tmp_path)
        assert after.returncode == 1
        assert "strata up" in after.stdout

        # Data survives down/up: the znode written before is still there.
        client.stop()
        restarted = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert restarted.returncode == 0, restarted.stderr
        new_info = _json(restarted)
        _track_recorded(reaper, data_dir)
        assert new_info["zookeeper"] == info["zookeeper"]  # recorded base port reused
        reader = kazoo_factory(new_info["zookeeper"])
        assert reader.get("/strata-cli-test")[0] == b"kept"
        assert strata("down", "--data-dir", str(data_dir), cwd=tmp_path).returncode == 0
        assert not any(pid_alive(p["pid"]) for p in new_info["processes"])
    finally:
        reaper.reap()


def test_up_on_a_busy_port_fails_with_advice(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = strata(
            "up", "--data-dir", str(tmp_path / "stack"), "--base-port", str(port), cwd=tmp_path
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"port {port}" in result.stderr and "--base-port" in result.stderr
    assert not (tmp_path / "stack" / "stack.json").exists()  # nothing was recorded


def test_usage_errors_are_short(tmp_path: Path) -> None:
    bad_port = strata("up", "--base-port", "99999", cwd=tmp_path)
    assert bad_port.returncode == 2 and "outside 1-65535" in bad_port.stderr
    nothing = strata("down", "--data-dir", str(tmp_path / "none"), cwd=tmp_path)
    assert nothing.returncode == 0 and "Nothing to stop" in nothing.stdout
