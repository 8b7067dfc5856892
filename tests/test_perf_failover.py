"""``strata perf failover`` runs end to end against a real 3-broker stack (`strata up`) on
a tiny workload: one leader kill (its figures are for ``make bench``; here only that it
works, kills exactly the stack's processes and reports sane numbers).

The brokers get a 4 s ZooKeeper session (the server's minimum, 2 ticks) instead of the
default 10 s, through ``STRATA_ZOOKEEPER_SESSION_TIMEOUT_MS`` in the environment of
``strata up`` and of the benchmark (whose restarts run ``strata up`` and inherit it), so
one round takes about 10 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strata.client import Admin, NewTopic
from strata_tools.perf_failover import bench_failover
from tests.test_cli_stack import _track_recorded, ok, strata, up_on_free_ports

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]


def test_failover_benchmark_kills_leaders_and_reports_recovery_times(
        tmp_path: Path, reaper: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_ZOOKEEPER_SESSION_TIMEOUT_MS", "4000")
    data_dir = tmp_path / "stack"
    try:
        _, info = up_on_free_ports(data_dir, tmp_path, reaper, brokers=3)
        before = {p["name"]: p["pid"] for p in info["processes"]}
        with Admin(info["bootstrap"]) as admin:
            admin.create_topics([NewTopic("failover", num_partitions=2, replication_factor=3,
                                          configs={"min.insync.replicas": "2"})])
        lines: list[str] = []

        result = bench_failover(data_dir, "failover", kills=1, timeout=40, isr_timeout=40,
                                log=lines.append)

        assert [k.kill for k in result.kills] == [1] and len(lines) == 1
        first = result.kills[0]
        assert first.pid == before[f"broker-{first.victim}"]  # a PID the stack recorded
        for k in result.kills:
            assert k.partition in k.led and k.new_leader not in (None, k.victim)
            # The session (4 s) must expire before the controller moves leadership; the
            # watches' notifications may trail the acknowledgement by a moment.
            assert k.registration_gone_s is not None and k.new_leader_s is not None
            assert 2.0 < k.registration_gone_s <= k.new_leader_s < k.recovered_s + 1.0
            assert k.recovered_s < 40
            assert 0 < k.first_ack_s <= k.recovered_s
            assert k.restart_s > 0 and k.isr_full_s >= 0
        summary = result.summary()["recovered_s"]
        assert summary["n"] == 1 and 0 < summary["p50"] <= summary["p99"] <= summary["max"]
        # Every killed broker was restarted: the whole stack runs again.
        status = ok(strata("status", "--data-dir", str(data_dir), cwd=tmp_path))
        assert f"pid {before['zookeeper']} " in status  # ZooKeeper was never touched
    finally:
        if (data_dir / "stack.json").exists():
            _track_recorded(reaper, data_dir)  # the restarted brokers have new PIDs
            strata("down", "--data-dir", str(data_dir), "--grace", "10", cwd=tmp_path)
