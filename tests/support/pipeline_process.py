"""``tests/support/spark_pipeline.py`` as a child process, and a reader of what it wrote.

The pipeline runs in a session of its own, so :meth:`PipelineProcess.kill` SIGKILLs its
whole process group at once: the Python driver, the Spark JVM and its Python workers (a
crash of the driver host). Its output is collected line by line; ``started`` and
``done`` are set when it prints ``pipeline started`` / ``pipeline done``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from strata.client import Consumer, TopicPartition
from tests.support.broker_process import REPO


class PipelineProcess:
    """One run of the child pipeline from ``source`` into ``sink``."""

    def __init__(self, bootstrap: str, source: str, sink: str, checkpoint: Path, *,
                 max_offsets: int, env: Mapping[str, str] | None = None,
                 env_drop: Iterable[str] = ()) -> None:
        environment = dict(os.environ, PYTHONPATH=str(REPO))
        for name in env_drop:
            environment.pop(name, None)
        environment.update(env or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.spark_pipeline", "--bootstrap", bootstrap,
             "--source", source, "--sink", sink, "--checkpoint", str(checkpoint),
             "--max-offsets", str(max_offsets)],
            cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        self.lines: list[str] = []
        self.started = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("pipeline started"):
                self.started.set()
            elif line.startswith("pipeline done"):
                self.done.set()

    def kill(self) -> None:
        """SIGKILL the pipeline's process group (a crash of the driver host)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def output(self) -> str:
        return "".join(self.lines[-60:])


def read_values(bootstrap: str, topic: str, partitions: int, isolation_level: str, *,
                idle_polls: int = 6) -> list[bytes]:
    """Every value a fresh consumer at ``isolation_level`` reads from the start of the
    topic's partitions, until ``idle_polls`` polls of 250 ms in a row came back empty."""
    out: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest",
                  isolation_level=isolation_level) as consumer:  # type: ignore[arg-type]
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        idle = 0
        while idle < idle_polls:
            records = consumer.poll(timeout_ms=250)
            out.extend(r.value for r in records if r.value is not None)
            idle = 0 if records else idle + 1
    return out
