"""``strata up`` that fails half-way still records every process it leaves running.

Three small TCP listener processes stand in for services (the real stack is covered by
tests/test_cli_stack.py): when the second one stops answering, ``up`` fails, and
``down`` must still find the third, which was running before and that ``up`` never
reached.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from procs import free_port, kill_pid, pid_alive
from strata_tools.stack import Launched, ServiceSpec, Stack, StackContext, StackError

pytestmark = pytest.mark.integration

_LISTENER = ("import socket, sys, time; s = socket.socket(); "
             "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)")


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def test_a_failed_up_keeps_the_services_it_did_not_reach_recorded(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("a", "b", "c")}
    unhealthy: set[str] = set()
    started: list[int] = []
    markers: dict[int, str] = {}

    def spec(name: str) -> ServiceSpec:
        def start(ctx: StackContext, base: int) -> Launched:
            marker = f"strata-test-listener-{name}-{tmp_path.name}"
            process = subprocess.Popen([sys.executable, "-c", _LISTENER, str(ports[name]),
                                        marker], start_new_session=True)
            started.append(process.pid)
            markers[process.pid] = marker
            for _ in range(100):
                if _answers(ports[name]):
                    break
                subprocess.run(["sleep", "0.05"], check=True)
            return Launched(process.pid, ports[name], marker, f"127.0.0.1:{ports[name]}",
                            str(tmp_path / f"{name}.log"))

        return ServiceSpec(name, 0, "bootstrap", start,
                           lambda host, port, name=name: name not in unhealthy
                           and _answers(ports[name]))

    stack = Stack(tmp_path / "stack", services=[spec(n) for n in ("a", "b", "c")],
                  health_wait=1.0)
    try:
        stack.up(base_port=free_port())
        assert len(started) == 3
        unhealthy.add("b")  # b runs but stops answering: the next `up` fails there
        with pytest.raises(StackError, match="not answering"):
            stack.up()
        recorded = json.loads((tmp_path / "stack" / "stack.json").read_text())["processes"]
        assert sorted(r["name"] for r in recorded) == ["a", "b", "c"]
        stack.down(grace=5.0)
        assert not any(pid_alive(pid) for pid in started)
    finally:
        for pid in started:
            if pid_alive(pid):
                kill_pid(pid, 5.0, expect=markers[pid])
