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
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from procs import free_port, kill_pid, pid_alive
from strata_tools.stack import (
    Launched,
    ProcessRecord,
    ServiceSpec,
    Stack,
    StackContext,
    StackError,
)

GroupWait = Callable[[StackContext, Sequence[ProcessRecord]], None]

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


# A listener that, on SIGTERM, writes "<pid> closing" to argv[3] and the time it got the
# signal to argv[4], then takes argv[5] seconds to exit: a service with a slow shutdown.
_SLOW_CLOSER = (
    "import os, signal, socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "def closing(*_):\n"
    "    open(sys.argv[4], 'a').write(f'{time.time()}\\n')\n"
    "    s.close(); open(sys.argv[3], 'w').write(str(os.getpid()))\n"
    "    time.sleep(float(sys.argv[5])); os._exit(0)\n"
    "signal.signal(signal.SIGTERM, closing)\n"
    "time.sleep(600)\n"
)


def _slow_closer_spec(tmp_path: Path, name: str, port: int, close_s: float,
                      started: list[tuple[int, str]], group: str | None = None,
                      group_wait: GroupWait | None = None) -> ServiceSpec:
    closing_file = tmp_path / f"{name}.closing"
    term_times = tmp_path / "sigterm-times"

    def start(ctx: StackContext, base: int) -> Launched:
        closing_file.unlink(missing_ok=True)
        marker = f"strata-test-closer-{name}-{tmp_path.name}"
        process = subprocess.Popen([sys.executable, "-c", _SLOW_CLOSER, str(port), marker,
                                    str(closing_file), str(term_times), str(close_s)],
                                   start_new_session=True)
        started.append((process.pid, marker))
        for _ in range(200):
            if _answers(port):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        return Launched(process.pid, port, marker, f"127.0.0.1:{port}",
                        str(tmp_path / f"{name}.log"))

    def closing(record: ProcessRecord) -> bool:
        try:
            return int(closing_file.read_text()) == record.pid
        except (OSError, ValueError):
            return False

    def healthy(host: str, p: int) -> bool:
        return _answers(port)

    return ServiceSpec(name, 0, "bootstrap", start, healthy, group=group,
                       group_wait=group_wait, closing=closing)


def _stop_all(started: list[tuple[int, str]]) -> None:
    for pid, marker in started:
        if pid_alive(pid):
            kill_pid(pid, 5.0, expect=marker)


def test_up_waits_for_a_service_that_is_shutting_down(tmp_path: Path) -> None:
    """A service that no longer answers because it is closing is waited for (bounded,
    with progress) and started again; a hung one is still an error (test above)."""
    started: list[tuple[int, str]] = []
    said: list[str] = []
    spec = _slow_closer_spec(tmp_path, "slow", free_port(), 3.0, started)
    stack = Stack(tmp_path / "stack", services=[spec], health_wait=1.0,
                  progress=said.append, shutdown_wait=0.5)
    try:
        stack.up(base_port=free_port())
        (first, _), = started
        subprocess.run(["kill", "-TERM", str(first)], check=True)
        for _ in range(100):
            if (tmp_path / "slow.closing").exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        with pytest.raises(StackError, match=r"still shutting down after 0 s.*--shutdown-wait"):
            stack.up()
        assert pid_alive(first) and len(started) == 1  # left alone, nothing started
        stack.shutdown_wait = 30.0
        status = stack.up()
        assert not pid_alive(first)
        assert [p.state for p in status.processes] == ["started"]
        assert status.processes[0].record.pid == started[-1][0] != first
        assert any(f"slow (pid {first}) is shutting down" in line for line in said), said
        assert any(line.startswith("slow exited after") for line in said), said
    finally:
        _stop_all(started)


def test_down_stops_the_members_of_a_group_together(tmp_path: Path) -> None:
    """Each member takes 1.5 s to exit after SIGTERM: stopped one after another, the
    first would have exited before the last got its SIGTERM."""
    started: list[tuple[int, str]] = []

    def wait(ctx: StackContext, records: Sequence[ProcessRecord]) -> None:
        return None

    specs = [_slow_closer_spec(tmp_path, f"m{k}", free_port(), 1.5, started, group="g",
                               group_wait=wait) for k in range(3)]
    stack = Stack(tmp_path / "stack", services=specs, health_wait=5.0)
    try:
        stack.up(base_port=free_port())
        assert len(started) == 3
        outcome = stack.down(grace=10.0)
        assert [what for _, what in outcome] == ["stopped"] * 3
        assert [r.name for r, _ in outcome] == ["m2", "m1", "m0"]
        terms = [float(t) for t in (tmp_path / "sigterm-times").read_text().split()]
        assert len(terms) == 3
        assert max(terms) - min(terms) < 1.0, terms  # all signalled before any exited
        assert not any(pid_alive(pid) for pid, _ in started)
    finally:
        _stop_all(started)
