"""Real broker processes for tests: free ports, private data dirs, killed by PID.

``BrokerProcess`` runs ``python -m brokers`` in its own session and waits for its
"ready" line; ``stop()`` sends SIGTERM (clean shutdown), ``kill()`` SIGKILL, and
``restart()`` starts it again on the same data dir and port. Every PID is checked
against a marker in its command line before it is signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from procs import free_port

REPO = Path(__file__).resolve().parents[2]


class BrokerProcess:
    def __init__(self, zookeeper: str, data_dir: Path, broker_id: int = 0,
                 port: int | None = None, overrides: dict[str, str] | None = None,
                 listeners: tuple[str, ...] = (), python: str = sys.executable,
                 environment: dict[str, str] | None = None, host: str = "127.0.0.1",
                 command_prefix: tuple[str, ...] = ()) -> None:
        """``listeners``: names (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) to serve, each
        on a free port (``ports[name]``); the first is the inter-broker one unless
        ``inter.broker.listener.name`` says otherwise. Empty: PLAINTEXT on ``port``.
        ``python`` / ``environment``: the interpreter and the whole environment to run it
        with (default: this one, with the checkout on ``PYTHONPATH``), e.g. an installed
        package's virtual environment; it then runs in ``data_dir``, outside the checkout
        (``python -m`` would import the checkout's modules from the working directory).
        ``host``: the address it listens on and advertises; ``command_prefix``: what runs
        it, e.g. ``ip netns exec NS`` (which execs it, so its PID is the broker's)."""
        self.host = host
        self.command_prefix = command_prefix
        self.python = python
        self.environment = environment
        self.zookeeper = zookeeper
        self.data_dir = data_dir
        self.broker_id = broker_id
        self.ports = {name: free_port() for name in listeners}
        self.port = port or (self.ports[listeners[0]] if listeners else free_port())
        # A port picked here may be taken by someone else's outgoing connection before the
        # broker binds it (free_port hands out ephemeral ports): the first start may then
        # move to another one. A port the caller chose, or a restart, never moves.
        self._may_move_port = port is None
        self.overrides = dict(overrides or {})
        if listeners:
            self._may_move_port = False
            self.overrides["listeners"] = ",".join(
                f"{name}://{host}:{port}" for name, port in self.ports.items())
        self.overrides.setdefault("zookeeper.session.timeout.ms", "6000")
        # Most tests run one broker; a Cluster passes its own factor.
        self.overrides.setdefault("offsets.topic.replication.factor", "1")
        self.process: subprocess.Popen[str] | None = None
        self.output: deque[str] = deque(maxlen=400)
        self._pump: threading.Thread | None = None  # reads the process's output
        self.metrics_port = -1

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def address(self, listener: str) -> str:
        return f"{self.host}:{self.ports[listener]}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def marker(self) -> str:
        return str(self.data_dir)

    def start(self, timeout: float = 60.0) -> BrokerProcess:
        for attempt in range(3):
            try:
                self._start_once(timeout)
            except RuntimeError as err:
                if self._may_move_port and "[PORT_IN_USE]" in str(err) and attempt < 2:
                    self.port = free_port()
                    continue
                raise
            self._may_move_port = False
            return self
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> BrokerProcess:
        args = [*self.command_prefix, self.python, "-m", "brokers",
                "--broker-id", str(self.broker_id),
                "--data-dir", str(self.data_dir), "--zookeeper", self.zookeeper,
                "--metrics-port", "0"]
        if not self.ports:
            args += ["--host", self.host, "--port", str(self.port)]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        env = self.environment if self.environment is not None else \
            dict(os.environ, PYTHONPATH=str(REPO))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True,
            cwd=self.data_dir if self.environment is not None else None)
        ready = threading.Event()

        def pump() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                if line.startswith(f"strata broker {self.broker_id} ready"):
                    self.metrics_port = int(line.rsplit(" ", 1)[1])
                    ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"broker {self.broker_id} did not start:\n" +
                                   "".join(self.output))
        return self

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        # Its last lines (``stopped cleanly``) may still be in the pipe: read them all.
        if self._pump is not None:
            self._pump.join(10)
        return code

    def kill(self) -> None:
        """SIGKILL (a crash), only if the PID is still this broker."""
        if self.process is not None and self.process.poll() is None:
            # Our own un-reaped child: its PID cannot have been recycled.
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def restart(self, timeout: float = 60.0) -> BrokerProcess:
        return self.start(timeout)

    def log_text(self) -> str:
        return "".join(self.output)
