"""`strata up` / `strata down` / `strata cluster rolling-restart` as a user runs them
(issue [3.4] item 4), with a real ZooKeeper, three broker processes and a producer load.

Checked:

- ``strata cluster rolling-restart`` on a 3-broker stack under an idempotent ``acks=all``
  load: every broker gets a new pid, one at a time (the controller's last), each only
  after every partition was back in sync; no send fails, and every acknowledged record
  is read back at its offset, once, in producer order (tests/support/nemesis.py's
  checker);
- ``strata up`` while a broker is in the middle of its shutdown (SIGTERM, then SIGSTOP
  once it wrote its ``shutting-down`` file, so the shutdown lasts as long as the test
  wants): ``up`` waits, says so on stderr, and starts the broker again once it has
  exited (SIGCONT); with a short ``--shutdown-wait`` it fails instead, saying what to do,
  and leaves the broker alone;
- ``strata down`` stops the three brokers in parallel and ``strata up`` starts them in
  parallel, reporting each as it answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from procs import pid_alive
from strata.client import Admin, NewTopic
from tests.support.nemesis import Workload, check, read_partitions
from tests.test_cli_stack import _strata_command, _track_recorded, ok, strata, up_on_free_ports

pytestmark = [pytest.mark.system, pytest.mark.timeout(420)]

TOPIC = "rolling"
PARTITIONS = 6


def _records(data_dir: Path) -> dict[str, dict[str, Any]]:
    state = json.loads((data_dir / "stack.json").read_text())
    return {p["name"]: p for p in state["processes"]}


def _brokers(data_dir: Path) -> dict[str, dict[str, Any]]:
    return {name: p for name, p in _records(data_dir).items() if name.startswith("broker-")}


def _marker_pid(marker: Path) -> int | None:
    try:
        text = marker.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _collect(stream: Any, lines: list[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.append(line)


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.05)


def test_rolling_restart_under_load_loses_nothing(tmp_path: Path, reaper: Any) -> None:
    data_dir = tmp_path / "stack"
    try:
        _, info = up_on_free_ports(data_dir, tmp_path, reaper, "--no-tier", brokers=3)
        bootstrap = info["bootstrap"]
        with Admin(bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
        before = _brokers(data_dir)
        workload = Workload(bootstrap, TOPIC, PARTITIONS, producers=2, rate=60.0, keys=64)
        workload.start()
        try:
            workload.wait_for_acks(100, since=0.0, timeout=60)
            result = subprocess.run(
                [*_strata_command(), "cluster", "rolling-restart", "--data-dir", str(data_dir),
                 "--format", "json", "--sync-timeout", "120"],
                cwd=tmp_path, capture_output=True, text=True, timeout=360,
                stdin=subprocess.DEVNULL)
            _track_recorded(reaper, data_dir)
            assert result.returncode == 0, (result.stdout, result.stderr)
            steps = json.loads(result.stdout)["brokers"]
            # Writes go on after the last restart.
            workload.wait_for_acks(100, since=time.monotonic(), timeout=60)
        finally:
            workload.stop()
        after = _brokers(data_dir)
        assert sorted(s["name"] for s in steps) == sorted(before)
        for step in steps:
            assert step["old_pid"] == before[step["name"]]["pid"]
            assert step["new_pid"] == after[step["name"]]["pid"] != step["old_pid"]
            assert not pid_alive(step["old_pid"])
        # One at a time, each after the partitions were back in sync (progress on stderr).
        lines = result.stderr.splitlines()
        order = [line.split(":")[0] for line in lines if line.endswith(")") and
                 ": stopping (pid" in line]
        assert order == [s["name"] for s in steps], result.stderr
        synced = [i for i, line in enumerate(lines) if line.startswith("every partition in sync")]
        stops = [i for i, line in enumerate(lines) if ": stopping (pid" in line]
        assert len(synced) == len(stops) + 1, result.stderr
        assert all(synced[k] < stops[k] < synced[k + 1] for k in range(len(stops))), \
            result.stderr

        with Admin(bootstrap) as admin:
            topic = admin.describe_topics([TOPIC])[TOPIC]
        high_watermarks = {p.partition: p.high_watermark for p in topic.partitions}
        found = check(workload, read_partitions(bootstrap, TOPIC, high_watermarks),
                      high_watermarks)
        failed = [o.error for o in workload.snapshot() if o.error is not None]
        assert failed == [], failed[:10]
        assert found.ok, (found.summary("rolling restart"), found.problems)
        assert found.acknowledged > 200
    finally:
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        reaper.reap()


def test_up_waits_for_a_broker_that_is_shutting_down(tmp_path: Path, reaper: Any) -> None:
    data_dir = tmp_path / "stack"
    try:
        _, info = up_on_free_ports(data_dir, tmp_path, reaper, "--no-tier", brokers=3)
        broker = _brokers(data_dir)["broker-1"]
        pid = broker["pid"]
        marker = Path(broker["marker"]) / "shutting-down"
        # Catch the broker inside its shutdown: with ZooKeeper stopped, it cannot close
        # its session, the last step before the file goes (a broker without partitions
        # otherwise stops in ~40 ms, faster than a poll can be sure to see the file).
        zookeeper = _records(data_dir)["zookeeper"]["pid"]
        os.kill(zookeeper, signal.SIGSTOP)
        try:
            os.kill(pid, signal.SIGTERM)
            _wait_for(lambda: _marker_pid(marker) == pid, 30,
                      "the broker wrote its shutting-down file")
            os.kill(pid, signal.SIGSTOP)  # a shutdown that takes as long as the test wants
        finally:
            os.kill(zookeeper, signal.SIGCONT)
        try:
            # Bounded: with a short --shutdown-wait, `up` gives up and says what to do.
            short = strata("up", "--data-dir", str(data_dir), "--shutdown-wait", "2",
                           cwd=tmp_path)
            assert short.returncode == 1, (short.stdout, short.stderr)
            assert "is still shutting down after 2 s" in short.stderr, short.stderr
            assert "--shutdown-wait" in short.stderr and "Traceback" not in short.stderr
            assert pid_alive(pid)  # left alone
            assert _brokers(data_dir)["broker-1"]["pid"] == pid

            waiting = subprocess.Popen(
                [*_strata_command(), "up", "--data-dir", str(data_dir), "--format", "json"],
                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                stdin=subprocess.DEVNULL)
            said: list[str] = []
            reader = threading.Thread(target=_collect, args=(waiting.stderr, said),
                                      daemon=True)
            reader.start()
            # Resume the broker only once `up` says it is waiting for it (a fixed sleep
            # was too short for a loaded machine: `up` had not looked yet, found the
            # broker gone and simply started it).
            _wait_for(lambda: any("is shutting down; waiting" in line for line in said)
                      or waiting.poll() is not None, 120, "`up` to wait for broker-1")
            time.sleep(1)
            assert waiting.poll() is None, (said, waiting.communicate())
        finally:
            os.kill(pid, signal.SIGCONT)
        waiting.wait(timeout=120)
        reader.join(10)
        assert waiting.stdout is not None
        out, err = waiting.stdout.read(), "".join(said)
        _track_recorded(reaper, data_dir)
        assert waiting.returncode == 0, (out, err)
        assert f"broker-1 (pid {pid}) is shutting down; waiting for it to exit" in err, err
        assert "broker-1 exited after" in err and "broker-1 answers on" in err, err
        assert not pid_alive(pid)
        states = {p["name"]: p for p in json.loads(out)["processes"]}
        assert states["broker-1"]["state"] == "started"
        assert states["broker-1"]["pid"] != pid
        assert states["broker-0"]["state"] == states["broker-2"]["state"] == "running"
        assert not marker.exists()  # the new process's shutdown has not begun

        # Down in parallel, up in parallel, each broker reported as it answers.
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert not any(pid_alive(p["pid"]) for p in info["processes"])
        again = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        _track_recorded(reaper, data_dir)
        assert again.returncode == 0, again.stderr
        for name in ("broker-0", "broker-1", "broker-2"):
            assert f"{name} answers on" in again.stderr, again.stderr
        launched = [p["started_at"] for p in _brokers(data_dir).values()]
        # Launched together, not each after the previous one answered (seconds apart).
        assert max(launched) - min(launched) < 1.0, launched
    finally:
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        reaper.reap()


def test_up_takes_a_broker_in_its_last_step_of_shutdown_for_one_that_stopped(
        tmp_path: Path) -> None:
    """A broker removes its shutting-down file as its shutdown's last step and exits a
    moment later; `up` caught in between saw it alive, not closing, not answering, took it
    for a running broker and failed with "did not start" once it exited (seen under a
    full test run's load). Now a recorded broker that is not answering gets a moment to
    exit, and one that does is started again; one that stays (starting up, or hung) is
    what it was."""
    import sys

    from strata_tools.stack import LAST_STEP_S, ProcessRecord, ServiceSpec, Stack

    marker = f"strata-last-step-{os.getpid()}-{time.monotonic_ns()}"
    spec = ServiceSpec(name="broker-9", port_offset=0, endpoint_key="bootstrap",
                       start=lambda ctx, port: None,  # type: ignore[arg-type,return-value]
                       healthy=lambda host, port: False, closing=lambda record: False)
    stack = Stack(tmp_path / "stack", services=[spec], progress=lambda line: None)

    def record_of(seconds: float) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
        process = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})",
                                    marker])
        time.sleep(0.2)  # exec'd: its command line carries the marker
        return process, ProcessRecord(name="broker-9", pid=process.pid, port=1, marker=marker,
                                      endpoint_key="bootstrap", endpoint="127.0.0.1:1",
                                      log=str(tmp_path / "log"))

    exiting, record = record_of(1.0)
    try:
        assert record.alive()
        started = time.monotonic()
        assert stack._past_shutdown(spec, record) is None  # it exited: start it again
        assert time.monotonic() - started < LAST_STEP_S
    finally:
        exiting.kill()
        exiting.wait()

    staying, record = record_of(60.0)
    try:
        started = time.monotonic()
        assert stack._past_shutdown(spec, record) is record  # alive all along: as before
        assert LAST_STEP_S <= time.monotonic() - started < LAST_STEP_S + 2
    finally:
        staying.kill()
        staying.wait()
