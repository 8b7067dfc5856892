"""A `strata gateway` process for tests: started on a free port with its output kept,
stopped by its own Popen handle (SIGTERM for the graceful drain, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from procs import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
#: The --max-request-bytes of every gateway started here (tests check the 413 at it).
MAX_REQUEST_BYTES = 65536


@dataclass
class Gateway:
    url: str
    cluster_id: str
    bootstrap: str
    process: subprocess.Popen[str]
    output: deque[str]

    def topic_url(self, topic: str) -> str:
        return f"{self.url}/v3/clusters/{self.cluster_id}/topics/{topic}"


@contextlib.contextmanager
def running_gateway(bootstrap: str, *extra: str) -> Iterator[Gateway]:
    """`strata gateway` as a subprocess on a free port, killed by its Popen handle."""
    port = free_port()
    args = [sys.executable, "-m", "strata_tools.cli", "gateway", "--bootstrap", bootstrap,
            "--port", str(port), "--delivery-timeout-ms", "4000",
            "--max-request-bytes", str(MAX_REQUEST_BYTES), "--shutdown-grace-s", "5",
            "--log-level", "warning", *extra]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                               start_new_session=True)
    output: deque[str] = deque(maxlen=500)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)

    threading.Thread(target=pump, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> int:
            if process.poll() is not None:
                raise AssertionError("gateway exited:\n" + "".join(output))
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code
            except httpx.HTTPError:
                return -1

        wait_for("gateway up", healthy, lambda s: s == 200, timeout=30)
        yield Gateway(url, "", bootstrap, process, output)
    finally:
        stop_child(process)


def stop_child(process: subprocess.Popen[Any]) -> None:
    """Our own un-reaped child: SIGTERM (graceful drain), then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
