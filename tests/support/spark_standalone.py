"""A Spark standalone cluster on this machine: a master and a worker started with
``spark-class`` from the pyspark wheel, so executors run in JVMs (and Python workers) of
their own, as on a real cluster, instead of inside the driver (``local[N]``).

Both listen on 127.0.0.1 on free ports; the master's REST submission server (a fixed
port, 6066) is off. ``driver_env()`` is the environment a driver process needs to run
on it: ``PYSPARK_SUBMIT_ARGS`` with the master URL and the driver bound to 127.0.0.1.

``stop()`` ends exactly what was started: SIGTERM to the worker (which kills the
executors it launched), then SIGKILL to any executor still running (children of the
worker, found by parent PID), then the master; it raises if a process survives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pyspark

from procs import free_port

__all__ = ["SparkStandalone"]

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def _children(pid: int) -> list[int]:
    """Running children of ``pid``; an exited child its parent has not reaped yet (state
    Z, an empty command line) is not running."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


#: JVM options of the master, the worker and the executors: they live for one test, so the
#: C2 compiler's threads would be mostly start-up cost (see SPARK_SUBMIT_OPTS in
#: tests/conftest.py).
_SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class SparkStandalone:
    def __init__(self, directory: Path, cores: int = 2, memory: str = "2g") -> None:
        self.directory = directory
        self.cores, self.memory = cores, memory
        self.port, self.worker_port = free_port(), free_port()
        self.master: subprocess.Popen[str] | None = None
        self.worker: subprocess.Popen[str] | None = None
        self.output: dict[str, list[str]] = {"master": [], "worker": []}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str], ready: str, timeout: float
               ) -> subprocess.Popen[str]:
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                   # The client compiler only, as the suite's drivers (tests/conftest.py).
                   SPARK_DAEMON_JAVA_OPTS=_SHORT_LIVED_JVM,
                   SPARK_LOG_DIR=str(self.directory / "logs"))
        env.pop("SPARK_CONF_DIR", None)
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.directory)
        seen = threading.Event()

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                self.output[name].append(line)
                if ready in line:
                    seen.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not seen.wait(0.1):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the Spark {name} did not start:\n"
                                   + "".join(self.output[name][-40:]))
        return process

    def start(self, timeout: float = 90.0) -> SparkStandalone:
        (self.directory / "work").mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._spawn("master", [
                "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.port), "--webui-port", str(free_port())],
                "I have been elected leader", timeout)
            self.worker = self._spawn("worker", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(self.worker_port), "--webui-port", str(free_port()),
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.directory / "work"), self.url],
                "Successfully registered with master", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver process that runs its jobs on this cluster."""
        # One executor with every core: a JVM of its own, and only one to start.
        submit = (f"--master {self.url} --conf spark.driver.host=127.0.0.1 "
                  "--conf spark.driver.bindAddress=127.0.0.1 "
                  f"--conf spark.executor.cores={self.cores} "
                  f"--conf spark.cores.max={self.cores} --conf spark.executor.memory=1g "
                  f"--conf 'spark.executor.extraJavaOptions={_SHORT_LIVED_JVM}' "
                  "pyspark-shell")
        return dict(os.environ, PYSPARK_SUBMIT_ARGS=submit, **extra)

    def executors(self) -> list[int]:
        """PIDs of the executor JVMs the worker runs now."""
        return [] if self.worker is None else _children(self.worker.pid)

    def stop(self) -> None:
        survivors = []
        if self.worker is not None:
            executors = self.executors()
            _terminate(self.worker)  # a worker that stops kills its executors
            for pid in executors:  # the worker's own children: ours to end
                if _running(pid):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            survivors += [pid for pid in executors if _running(pid)]
        if self.master is not None:
            _terminate(self.master)
        if survivors:
            raise AssertionError(f"executor processes survived the worker: {survivors}")


def _terminate(process: subprocess.Popen[str]) -> None:
    """SIGTERM our own child, SIGKILL it after 20 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
