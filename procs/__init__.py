"""Process and port helpers shared by the launchers, the ``strata`` CLI and the tests.

Why this exists: the local stack runs real JVMs and Python servers in the background and
must stop exactly the processes it started. PIDs get recycled, so nothing here kills a PID
without first checking that ``/proc/<pid>/cmdline`` still contains a marker the caller
recorded when it started the process (for the ZooKeeper launcher: the absolute path of
its ``zoo.cfg``). Nothing here ever looks processes up by name.

A top-level package of its own, below both the CLI (``strata_tools``) and the ZooKeeper
launcher (``zookeeper``): each imports it, and neither imports the other for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import time
from pathlib import Path

__all__ = [
    "PortInUseError",
    "check_port_free",
    "cmdline",
    "free_port",
    "kill_pid",
    "pid_alive",
    "wait_for_port",
]

_POLL_INTERVAL = 0.05


class PortInUseError(RuntimeError):
    """A port we were asked to listen on is already bound by another process."""

    def __init__(self, host: str, port: int, what: str) -> None:
        self.host = host
        self.port = port
        self.what = what
        super().__init__(
            f"port {port} on {host} (wanted for {what}) is already in use by another process. "
            f"Stop whatever listens there (`ss -ltnp 'sport = :{port}'` shows it) or choose "
            "another port."
        )


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (the kernel picks it).

    There is an unavoidable race between closing the probe socket and the real server
    binding; tests accept it because the kernel hands out ephemeral ports round-robin.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise :class:`PortInUseError` if ``host:port`` cannot be bound right now.

    Binding (not connecting) is the honest test: it also catches listeners that do not
    accept connections yet and ports held on the wildcard address.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR matches what servers (the JVM included) set, so a port left in
        # TIME_WAIT by a previous run is reported free, as it is for the real server.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUseError(host, port, what) from exc
            raise


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Block until a TCP connection to ``host:port`` succeeds; raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    last_error: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"nothing accepted connections on {host}:{port} within {timeout:.0f}s "
                f"(last error: {last_error})"
            )
        time.sleep(_POLL_INTERVAL)


def cmdline(pid: int) -> str | None:
    """The command line of ``pid`` with arguments joined by spaces, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def child_exit_status(pid: int) -> str | None:
    """If ``pid`` is a child of this process that has exited, reap it and say how it ended.

    None if it is still running or not our child (then nothing is reaped).
    """
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    if reaped != pid:
        return None
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        return f"was killed by signal {signum} ({name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie.

    A child we started and that has exited stays a zombie until reaped, and ``kill(pid, 0)``
    still succeeds on it; we reap our own children here and treat other zombies as dead.
    """
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # Field 3 is the state; the command name in field 2 may contain spaces, hence rsplit.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def _matches(pid: int, expect: str) -> bool:
    line = cmdline(pid)
    return line is not None and expect in line


def kill_pid(pid: int, grace: float = 10.0, *, expect: str) -> bool:
    """Stop ``pid`` with SIGTERM, then SIGKILL after ``grace`` seconds.

    Only acts if the process is alive AND its command line contains ``expect`` (a marker
    recorded at start), so a recycled PID belonging to some other program is never
    signalled. Returns True if this call stopped the process, False if there was nothing
    (of ours) to stop. Raises ``TimeoutError`` if it survives SIGKILL for 10 seconds
    (e.g. stuck in uninterruptible I/O).
    """
    if not expect:
        raise ValueError("kill_pid needs a non-empty cmdline marker to identify the process")
    if not pid_alive(pid) or not _matches(pid, expect):
        return False
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(_POLL_INTERVAL)
    raise TimeoutError(f"pid {pid} did not exit after SIGTERM and SIGKILL")
