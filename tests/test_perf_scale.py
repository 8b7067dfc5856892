"""``strata perf scale`` runs end to end, every phase, against a real 3-broker stack
(`strata up`) at a tiny scale: 2 topics x 6 partitions, 20 idle connections, 2 s latency
runs at 1,000 records/s, 4 group members on 8 partitions. Its figures are for
``make bench``; here only that it works, prints one JSON object with every figure (sane
values, no timing bounds), and leaves the stack it was given running with its own topics
deleted.

The benchmark runs as ``strata perf scale --data-dir D`` in a session of its own, so a
timeout kills it and any ``strata up`` / ``strata down`` it is running (its process
group); the brokers it restarts are recorded in ``stack.json`` and reaped from there.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from strata.client import Admin
from strata_tools.perf_scale import USER_PATH_ROWS, user_path_table
from tests.test_cli_stack import _track_recorded, ok, strata, up_on_free_ports

pytestmark = [pytest.mark.system, pytest.mark.timeout(420)]

#: Seconds the benchmark subprocess may take before it is killed.
BENCH_TIMEOUT_S = 360


def _run_bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("STRATA_BOOTSTRAP", None)
    process = subprocess.Popen([sys.executable, "-m", "strata_tools.cli", "perf", "scale", *args],
                               cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own group: it and its children
        stdout, stderr = process.communicate()
        raise AssertionError(f"strata perf scale did not finish within {BENCH_TIMEOUT_S} s; "
                             f"stderr:\n{stderr[-4000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def test_scale_benchmark_reports_every_figure(tmp_path: Path, reaper: Any) -> None:
    data_dir = tmp_path / "stack"
    try:
        _, info = up_on_free_ports(data_dir, tmp_path, reaper, "--no-tier", brokers=3)
        before = {p["name"]: p["pid"] for p in info["processes"]}

        done = _run_bench("--data-dir", str(data_dir), "--topics", "2", "--partitions", "12",
                          "--idle-connections", "20", "--produce-rate", "1000",
                          "--produce-seconds", "2", "--background-rate", "200",
                          "--group-members", "4", "--group-partitions", "8",
                          "--timeout", "120", cwd=tmp_path)

        assert done.returncode == 0, done.stderr[-4000:]
        assert "Traceback" not in done.stderr, done.stderr
        result = json.loads(done.stdout)  # exactly one JSON object on stdout
        assert result["skipped"] == []
        assert (result["topics"], result["partitions"], result["brokers"]) == (2, 12, 3)
        for key in ("create_requests_s", "create_all_leaders_s", "produce_one_each_s",
                    "create_all_led_clients_s", "produce_one_each_user_s",
                    "controlled_shutdown_clients_s", "controlled_shutdown_up_s",
                    "sigkill_controller_clients_s", "full_restart_clients_s",
                    "controlled_shutdown_s", "controlled_shutdown_exit_s",
                    "controlled_shutdown_restart_s", "sigkill_controller_s",
                    "sigkill_controller_restart_s", "full_restart_s",
                    "full_restart_writable_s", "full_restart_up_returned_s",
                    "full_restart_rebalance_s", "produce_p50_ms_baseline",
                    "produce_p99_ms_baseline",
                    "produce_p50_ms_with_idle_connections",
                    "produce_p99_ms_with_idle_connections", "group_balance_s",
                    "group_rebalance_after_leave_s", "group_client_wall_s"):
            assert _positive(result[key]), (key, result[key])
        for key in ("produce_metadata_s", "controlled_shutdown_restart_isr_full_s",
                    "sigkill_controller_restart_isr_full_s", "group_client_cpu_s"):
            assert isinstance(result[key], int | float) and result[key] >= 0, (key, result)
        assert result["produce_p50_ms_baseline"] <= result["produce_p99_ms_baseline"]
        assert result["produce_p50_ms_with_idle_connections"] <= \
            result["produce_p99_ms_with_idle_connections"]
        # The failed requests are a count, zero or more, out of those sent in the window.
        failed = result["controlled_shutdown_failed_requests"]
        assert isinstance(failed, int) and not isinstance(failed, bool)
        assert 0 <= failed <= result["controlled_shutdown_requests"]
        assert result["controlled_shutdown_requests"] > 0
        assert {result["controlled_shutdown_victim"], result["sigkill_controller_victim"]} \
            <= {0, 1, 2}
        for key in ("broker_rss_mb", "broker_open_files"):
            assert sorted(result[key]) == ["0", "1", "2"], result[key]
            assert all(_positive(v) for v in result[key].values()), result[key]
        assert all(isinstance(v, int) for v in result["broker_open_files"].values())
        # RSS may not move at all for 20 connections: any finite number is sane.
        per_connection = result["rss_per_connection_kb"]
        assert isinstance(per_connection, int | float) and math.isfinite(per_connection)
        assert result["idle_connections"] == 20 == result["idle_connections_still_open"]
        assert isinstance(result["group_client_cpu_bound"], bool)
        # The SIGTERMed broker's own account of its stop, step by step.
        assert "stopped cleanly in" in result["controlled_shutdown_broker_said"], result
        assert "logs" in result["controlled_shutdown_broker_said"]

        # The user-path table (scripts/scale_user_path.sh) shows every row's figure.
        table = user_path_table(result).splitlines()
        assert len(table) == 4 + len(USER_PATH_ROWS)
        for line, (_, key, _) in zip(table[4:], USER_PATH_ROWS, strict=True):
            assert "skipped" not in line and "None" not in line, line
            if key.endswith("_s"):
                assert f"| {result[key]:g} s |" in line, (key, line)

        # The group again, its members spread over two worker processes.
        spread = _run_bench("--data-dir", str(data_dir), "--topics", "1", "--partitions", "1",
                            "--skip", "produce,controlled-shutdown,sigkill-controller,restart,"
                            "resources,idle-connections", "--group-members", "4",
                            "--group-processes", "2", "--group-partitions", "8",
                            "--timeout", "120", cwd=tmp_path)
        assert spread.returncode == 0, spread.stderr[-4000:]
        spread_result = json.loads(spread.stdout)
        assert spread_result["group_processes"] == 2, spread_result
        for key in ("group_balance_s", "group_rebalance_after_leave_s", "group_client_cpu_s",
                    "group_broker_cpu_s"):
            assert _positive(spread_result[key]), (key, spread_result)

        # The stack it was given runs again (every process restarted: the full restart),
        # and the topics it created are gone.
        status = json.loads(ok(strata("status", "--data-dir", str(data_dir), "--format",
                                      "json", cwd=tmp_path)))
        after = {p["name"]: p["pid"] for p in status["processes"]}
        assert sorted(after) == sorted(before)
        assert all(after[name] != before[name] for name in before)
        with Admin(status["bootstrap"]) as admin:
            deadline = time.monotonic() + 30  # every broker's metadata catches up
            while left := [t for t in admin.list_topics()
                           if t.startswith(result["topic_prefix"])]:
                assert time.monotonic() < deadline, left
                time.sleep(0.2)
    finally:
        if (data_dir / "stack.json").exists():
            _track_recorded(reaper, data_dir)  # the restarted processes have new PIDs
            strata("down", "--data-dir", str(data_dir), "--grace", "10", cwd=tmp_path)
