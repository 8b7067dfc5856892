"""Start and stop a real ZooKeeper server as a child JVM.

Why a launcher of our own: Strata's brokers keep their metadata in ZooKeeper (controller
election, broker registration, partition state; see zookeeper/README.md), and every test
and the local stack need a real server, not a mock. The pyspark wheel already ships the
ZooKeeper server jars (``pyspark/jars/zookeeper-3.9.x.jar`` + ``zookeeper-jute``), so no
extra download is needed; an operator can point ``$ZOOKEEPER_HOME`` at a ZooKeeper
installation instead.

Everything a server needs lives in its own directory::

    <dir>/zoo.cfg             rendered from zoo.cfg.template on every start
    <dir>/log4j2.properties   logging config (used with the pyspark jars)
    <dir>/data/               snapshots and transaction logs (and ``myid`` in an ensemble)
    <dir>/zookeeper.log       the JVM's stdout and stderr, appended across restarts
    <dir>/zookeeper.pid       PID of the running JVM

The process is identified by the absolute path of its ``zoo.cfg``, which appears on the
JVM's command line: :meth:`ZooKeeperServer.stop` and :meth:`ZooKeeperServer.is_running`
check ``/proc/<pid>/cmdline`` for it, so a recycled PID is never mistaken for ours, and a
fresh ``ZooKeeperServer`` object for the same directory finds a server started by another
process (that is how ``strata up`` / ``strata down`` work across invocations).

:class:`ZooKeeperEnsemble` runs several servers as one ensemble (``QuorumPeerMain``, a
``server.N`` line per member, ``data/myid``): it launches every member before waiting for
any, and calls the ensemble healthy when every member serves and exactly one leads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import socket
import string
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from procs import check_port_free, child_exit_status, cmdline, kill_pid, pid_alive

__all__ = [
    "EnsembleHealth",
    "EnsembleMember",
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "ZooKeeperServer",
    "ZooKeeperStartError",
    "ensemble_health",
    "four_letter_word",
    "is_serving",
    "server_mode",
]

_TEMPLATE_DIR = Path(__file__).resolve().parent
_STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
# An ensemble member must run the quorum peer; it falls back to standalone by itself when
# the config has no server.N lines, but we keep the plain main class for the single node.
_QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
_LOG_TAIL_LINES = 40
#: Consecutive polls (0.2 s apart) a member must be missing before an ensemble wait gives up.
_MISSES_BEFORE_DEAD = 3


class ZooKeeperError(RuntimeError):
    """ZooKeeper could not be started, reached or stopped; the message says what to do."""


class ZooKeeperStartError(ZooKeeperError):
    """The server process exited or did not become healthy; carries the log tail."""

    def __init__(self, message: str, log_tail: str) -> None:
        self.log_tail = log_tail
        super().__init__(f"{message}\n--- last lines of the ZooKeeper log ---\n{log_tail}")


@dataclass(frozen=True)
class EnsembleMember:
    """One server of a ZooKeeper ensemble, as it appears in every member's zoo.cfg.

    Ports: ``peer_port`` carries follower-leader traffic (the "quorum port"),
    ``election_port`` leader election and ``client_port`` client sessions (the one kazoo
    connects to). ``server_id`` is what the member's ``data/myid`` holds (1..255).
    """

    server_id: int
    host: str
    client_port: int
    peer_port: int
    election_port: int

    def cfg_line(self) -> str:
        """The ``server.N=...`` line ZooKeeper expects (3.5+ syntax with the client address).

        The client address carries the host, not only the port: ZooKeeper refuses to start
        when ``clientPortAddress`` (always written, ``127.0.0.1`` by default) differs from
        the client address of its own ``server.N`` line, and a bare ``;port`` means
        0.0.0.0.
        """
        return (
            f"server.{self.server_id}={self.host}:{self.peer_port}:{self.election_port}"
            f";{self.host}:{self.client_port}"
        )

    @property
    def client_address(self) -> str:
        return f"{self.host}:{self.client_port}"


def four_letter_word(host: str, port: int, word: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ...) and return the reply.

    Raises ``OSError`` if the server cannot be reached. Only the words whitelisted in
    zoo.cfg.template (``ruok,srvr,stat,mntr``) get a real answer.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(word.encode("ascii"))
        sock.shutdown(socket.SHUT_WR)
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def is_serving(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if ``ruok`` is answered with ``imok`` and ``srvr`` reports a Mode.

    ``ruok`` alone only proves the process is up: a server that lost its quorum or is still
    loading its database says ``imok`` but answers ``srvr`` with "not currently serving".
    """
    try:
        if four_letter_word(host, port, "ruok", timeout) != "imok":
            return False
    except OSError:
        return False
    return server_mode(host, port, timeout) is not None


def server_mode(host: str, port: int, timeout: float = 1.0) -> str | None:
    """The ``Mode:`` a serving server reports in ``srvr``, else None.

    ``"standalone"`` for a single server; ``"leader"`` or ``"follower"`` (``"observer"``)
    for an ensemble member that is part of a working quorum. None when the server is
    unreachable or not serving (no quorum yet, election in progress, loading its data).
    """
    try:
        reply = four_letter_word(host, port, "srvr", timeout)
    except OSError:
        return None
    for line in reply.splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip() or None
    return None


@dataclass(frozen=True)
class EnsembleHealth:
    """What every node of an ensemble reports, in node order (see :func:`ensemble_health`).

    Healthy means every node serves and exactly one of them is the leader (a single node
    is healthy when it serves as ``standalone``).
    """

    modes: tuple[tuple[str, str | None], ...]  # ("host:port", mode or None if not serving)

    @property
    def leaders(self) -> list[str]:
        return [address for address, mode in self.modes if mode == "leader"]

    @property
    def serving(self) -> list[str]:
        return [address for address, mode in self.modes if mode is not None]

    @property
    def healthy(self) -> bool:
        if len(self.serving) != len(self.modes) or not self.modes:
            return False
        if len(self.modes) == 1:
            return self.modes[0][1] in ("standalone", "leader")
        return len(self.leaders) == 1

    def describe(self) -> str:
        """E.g. ``127.0.0.1:2181 leader, 127.0.0.1:2182 follower, 127.0.0.1:2183 not
        serving``."""
        return ", ".join(f"{address} {mode or 'not serving'}" for address, mode in self.modes)


def ensemble_health(addresses: Sequence[tuple[str, int]], timeout: float = 1.0) -> EnsembleHealth:
    """Ask every ``(host, client_port)`` for its mode (``srvr``); see :class:`EnsembleHealth`."""
    return EnsembleHealth(
        tuple((f"{host}:{port}", server_mode(host, port, timeout)) for host, port in addresses)
    )


def _server_jvm_flags() -> list[str]:
    """``$SERVER_JVMFLAGS``, the variable ZooKeeper's own ``zkServer.sh`` reads for the
    server's JVM options, split as a shell would; they come after the defaults above, so
    a ``-Xmx`` there wins. E.g. ``-XX:TieredStopAtLevel=1`` (the client compiler only)
    takes a third off the CPU a short-lived server spends (2.2-2.6 CPU-s instead of
    3.7-4.0 to start and answer 4,000 requests); the test suite sets that."""
    value = os.environ.get("SERVER_JVMFLAGS", "")
    try:
        return shlex.split(value)
    except ValueError as err:
        raise ZooKeeperError(
            f"SERVER_JVMFLAGS={value!r} cannot be split into JVM options ({err}); fix its "
            "quoting or unset it") from None


def _java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperError(
            "no `java` found on PATH or in $JAVA_HOME/bin; install Java 17 "
            "(e.g. `apt-get install openjdk-17-jdk-headless`) or set JAVA_HOME"
        )
    return found


def _classpath(zookeeper_home: str | None) -> list[str]:
    """Classpath entries: a ZooKeeper installation if given, else pyspark's bundled jars."""
    if zookeeper_home:
        home = Path(zookeeper_home)
        if not home.is_dir():
            raise ZooKeeperError(
                f"ZOOKEEPER_HOME={zookeeper_home} is not a directory; unset it to use the "
                "ZooKeeper jars inside the pyspark wheel"
            )
        # conf/ first so the distribution's logback.xml is found; "dir/*" is Java's jar glob.
        return [str(home / "conf"), str(home / "lib" / "*"), str(home / "*")]
    # find_spec locates the wheel without importing pyspark (which is slow to import).
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ZooKeeperError(
            "pyspark is not installed and ZOOKEEPER_HOME is not set; run `make setup`"
        )
    jars = Path(next(iter(spec.submodule_search_locations))).resolve() / "jars"
    if not any(jars.glob("zookeeper-3*.jar")):
        raise ZooKeeperError(
            f"no zookeeper-3.*.jar in {jars}; set ZOOKEEPER_HOME to a ZooKeeper installation"
        )
    return [str(jars / "*")]


class ZooKeeperServer:
    """A ZooKeeper server process owned by this object (or found via its directory).

    ``ZooKeeperServer(dir, client_port=p).start()`` renders zoo.cfg, starts the JVM in its
    own session (so Ctrl-C in a terminal does not reach it and it outlives the caller if
    asked to) and returns once the server answers ``ruok`` with ``imok`` and ``srvr``
    reports it serving. ``stop()`` ends exactly that PID.

    For an ensemble, pass ``ensemble`` (all members, including this one) and ``server_id``,
    or use :class:`ZooKeeperEnsemble`, which starts every member before it waits for any
    (no member serves before a quorum is up) and checks that exactly one leads.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        client_port: int = 2181,
        *,
        host: str = "127.0.0.1",
        tick_time_ms: int = 1000,
        init_limit: int = 10,
        sync_limit: int = 5,
        max_client_cnxns: int = 60,
        heap: str = "256m",
        ensemble: Sequence[EnsembleMember] | None = None,
        server_id: int | None = None,
        zookeeper_home: str | None = None,
        start_timeout: float = 60.0,
        log_level: str = "INFO",
        command_prefix: Sequence[str] = (),
    ) -> None:
        """``command_prefix`` runs the JVM through another command that execs it (so the
        PID stays the server's), e.g. ``ip netns exec NS`` for a server in a network
        namespace of its own, where ``host`` is an address of that namespace; the ports
        are then not checked from here (they are the namespace's, not this one's)."""
        self.directory = Path(directory).resolve()
        self.host = host
        self.command_prefix = tuple(command_prefix)
        self.client_port = client_port
        self.tick_time_ms = tick_time_ms
        self.init_limit = init_limit
        self.sync_limit = sync_limit
        self.max_client_cnxns = max_client_cnxns
        self.heap = heap
        self.ensemble = tuple(ensemble) if ensemble else ()
        self.server_id = server_id
        self.zookeeper_home = (
            zookeeper_home if zookeeper_home is not None else os.environ.get("ZOOKEEPER_HOME")
        )
        self.start_timeout = start_timeout
        self.log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        if self.ensemble:
            ids = [m.server_id for m in self.ensemble]
            if server_id is None or server_id not in ids:
                raise ValueError(f"server_id must be one of the ensemble's ids {ids}")
            if len(set(ids)) != len(ids):
                raise ValueError(f"duplicate server ids in ensemble: {ids}")

    # -- paths and identity -------------------------------------------------------------

    @property
    def cfg_path(self) -> Path:
        return self.directory / "zoo.cfg"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    @property
    def pid_path(self) -> Path:
        return self.directory / "zookeeper.pid"

    @property
    def marker(self) -> str:
        """Substring of the JVM's command line that identifies this server."""
        return str(self.cfg_path)

    @property
    def connect_string(self) -> str:
        """``host:port`` for kazoo / broker configuration."""
        return f"{self.host}:{self.client_port}"

    @property
    def member(self) -> EnsembleMember | None:
        """This server's own entry of ``ensemble`` (None when standalone)."""
        return next((m for m in self.ensemble if m.server_id == self.server_id), None)

    @property
    def returncode(self) -> int | None:
        """Exit code of the JVM this object started, once it has exited; else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        """PID of the running server (ours or found via the pid file), else None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        recorded = self._read_pid_file()
        if recorded is not None and self._is_ours(recorded):
            return recorded
        return None

    def is_running(self) -> bool:
        """True if a JVM started for this directory's zoo.cfg is alive."""
        return self.pid is not None

    def _is_ours(self, pid: int) -> bool:
        line = cmdline(pid)
        return pid_alive(pid) and line is not None and self.marker in line

    def reap_exit_status(self) -> str | None:
        """How the recorded JVM ended, if it is a child of this process that just exited.

        Reaping here (rather than in :func:`procs.pid_alive`, which discards the
        status) lets an error say "killed by signal 9" instead of "is not running".
        """
        recorded = self._read_pid_file()
        if recorded is None or self._proc is not None:
            return None
        return child_exit_status(recorded)

    def describe_pid(self) -> str:
        """The pid file and what /proc says about it, for error messages."""
        recorded = self._read_pid_file()
        if recorded is None:
            return f"no pid in {self.pid_path}"
        line = cmdline(recorded)
        matches = "matches" if line and self.marker in line else repr((line or "")[:80])
        return f"pid file says {recorded}, alive={pid_alive(recorded)}, command line {matches}"

    def _read_pid_file(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    # -- config -------------------------------------------------------------------------

    def render_config(self) -> str:
        """The zoo.cfg text for this server (also used by tests of the ensemble layout)."""
        template = string.Template((_TEMPLATE_DIR / "zoo.cfg.template").read_text())
        return template.substitute(
            tick_time=self.tick_time_ms,
            init_limit=self.init_limit,
            sync_limit=self.sync_limit,
            data_dir=self.data_dir,
            client_port=self.client_port,
            client_host=self.host,
            max_client_cnxns=self.max_client_cnxns,
            min_session_timeout=2 * self.tick_time_ms,
            # Brokers accept 2..120 s; ZooKeeper would silently clamp outside its range.
            max_session_timeout=max(20 * self.tick_time_ms, 120_000),
            ensemble_lines="\n".join(m.cfg_line() for m in self.ensemble),
        )

    def _write_files(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.cfg_path.write_text(self.render_config())
        log_cfg = string.Template((_TEMPLATE_DIR / "log4j2.properties.template").read_text())
        (self.directory / "log4j2.properties").write_text(
            log_cfg.substitute(log_level=self.log_level, log_file=self.log_path)
        )
        if self.ensemble:
            (self.data_dir / "myid").write_text(f"{self.server_id}\n")

    def command(self) -> list[str]:
        """The full JVM command line (exposed so docs and debugging can show it)."""
        main = _QUORUM_MAIN if self.ensemble else _STANDALONE_MAIN
        return [
            _java_executable(),
            f"-Xmx{self.heap}",
            "-Xms32m",
            "-XX:+UseSerialGC",  # one GC thread: the dev machines have two cores
            *_server_jvm_flags(),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            os.pathsep.join(_classpath(self.zookeeper_home)),
            main,
            str(self.cfg_path),
        ]

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, wait: bool = True) -> None:
        """Start the JVM; with ``wait`` return only once it serves (see class docstring).

        Raises :class:`procs.PortInUseError` if the client port is taken,
        :class:`ZooKeeperStartError` (with the log tail) if the JVM exits early or is not
        healthy within ``start_timeout``, and :class:`ZooKeeperError` if a server for this
        directory is already running.
        """
        running = self.pid
        if running is not None:
            raise ZooKeeperError(
                f"a ZooKeeper for {self.directory} is already running (pid {running}); "
                "stop it first or use another directory"
            )
        member = self.member
        if not self.command_prefix:
            check_port_free(self.host, self.client_port,
                            f"ZooKeeper client port ({self.directory})")
        if member is not None and not self.command_prefix:
            # A taken quorum or election port does not stop the JVM at once: it retries,
            # then leaves the ensemble. Refuse up front instead, like the client port.
            check_port_free(member.host, member.peer_port,
                            f"ZooKeeper quorum port of server {member.server_id}")
            check_port_free(member.host, member.election_port,
                            f"ZooKeeper election port of server {member.server_id}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_files()
        cmd = [*self.command_prefix, *self.command()]
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            header = f"--- strata: starting ZooKeeper at {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
            log.write((header + " ".join(cmd) + "\n").encode())
            log.flush()
            self._proc = self._spawn(cmd, log)
        self.pid_path.write_text(f"{self._proc.pid}\n")
        if not wait:
            return
        try:
            self.wait_until_serving()
        except BaseException:
            # Never leave a half-started JVM behind, even on Ctrl-C.
            self.stop(grace=5.0)
            raise

    def _spawn(self, cmd: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
            start_new_session=True,
            close_fds=True,
        )

    def wait_until_serving(self, timeout: float | None = None) -> None:
        """Block until ``ruok`` -> ``imok`` and ``srvr`` shows a Mode (i.e. it serves)."""
        budget = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                code = self._proc.returncode
                self._forget_pid_file()
                raise ZooKeeperStartError(
                    f"ZooKeeper exited during start-up with code {code} (log: {self.log_path})",
                    self.log_tail(),
                )
            try:
                if four_letter_word(self.host, self.client_port, "ruok", timeout=1.0) == "imok":
                    srvr = four_letter_word(self.host, self.client_port, "srvr", timeout=1.0)
                    if "Mode:" in srvr:
                        return
                    last = srvr.strip() or "empty srvr reply"
                else:
                    last = "ruok not answered with imok"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise ZooKeeperStartError(
            f"ZooKeeper on {self.connect_string} was not serving after {budget:.0f}s "
            f"(last check: {last}; log: {self.log_path})",
            self.log_tail(),
        )

    def healthy(self) -> bool:
        """One quick health probe (see :func:`is_serving`)."""
        return is_serving(self.host, self.client_port)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server by PID: SIGTERM, then SIGKILL after ``grace`` seconds.

        A no-op if nothing of ours is running. Only this object's own child (not yet
        reaped, so its PID cannot belong to anyone else) or a process whose command line
        contains this directory's zoo.cfg path is ever signalled.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            # Our own child: its PID cannot be reused before we reap it, so it is ours to
            # signal even before exec has put the marker in its command line (a stop
            # right after the start, e.g. when another member's port is taken), where
            # kill_pid, which checks the marker, would leave it running.
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10.0)
        pid = self.pid
        if pid is not None:
            kill_pid(pid, grace, expect=self.marker)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)  # reap our child so no zombie remains
            self._proc = None
        self._forget_pid_file()

    def _forget_pid_file(self) -> None:
        recorded = self._read_pid_file()
        if recorded is None or not self._is_ours(recorded):
            self.pid_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines written by the most recent start (for error messages)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return "(no log file)"
        return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer({str(self.directory)!r}, client_port={self.client_port})"


class ZooKeeperEnsemble:
    """The servers of one ZooKeeper ensemble, each a :class:`ZooKeeperServer` in its own dir.

    ``ZooKeeperEnsemble(dirs, members).start()`` launches every member that is not already
    running *before* waiting for any (a member serves only once a quorum has formed, so
    starting them one by one with a wait in between would never finish), then waits until
    the ensemble is healthy: every member answers ``srvr`` with a Mode and exactly one is
    the leader. Members already running (found through their directories, as for a single
    server) are left alone, so ``start()`` also restarts the members that died.
    """

    def __init__(
        self,
        directories: Sequence[str | os.PathLike[str]],
        members: Sequence[EnsembleMember],
        *,
        tick_time_ms: int = 1000,
        init_limit: int = 10,
        sync_limit: int = 5,
        heap: str = "128m",
        zookeeper_home: str | None = None,
        start_timeout: float = 60.0,
        log_level: str = "INFO",
        command_prefixes: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """``command_prefixes``: one per member (see ``ZooKeeperServer``)."""
        if len(directories) != len(members) or not members:
            raise ValueError("an ensemble needs one directory per member, and some members")
        self.members = tuple(members)
        self.start_timeout = start_timeout
        self.nodes: tuple[ZooKeeperServer, ...] = tuple(
            ZooKeeperServer(
                directory,
                member.client_port,
                host=member.host,
                tick_time_ms=tick_time_ms,
                init_limit=init_limit,
                sync_limit=sync_limit,
                heap=heap,
                ensemble=self.members,
                server_id=member.server_id,
                zookeeper_home=zookeeper_home,
                start_timeout=start_timeout,
                log_level=log_level,
                command_prefix=prefix,
            )
            for directory, member, prefix in zip(
                directories, self.members, command_prefixes or [()] * len(self.members),
                strict=True)
        )

    @property
    def connect_string(self) -> str:
        """``host:port,host:port,...`` of every member, for kazoo and brokers."""
        return ",".join(node.connect_string for node in self.nodes)

    def health(self, timeout: float = 1.0) -> EnsembleHealth:
        return ensemble_health([(n.host, n.client_port) for n in self.nodes], timeout)

    def healthy(self) -> bool:
        return self.health().healthy

    def leader(self) -> ZooKeeperServer | None:
        """The member that reports ``Mode: leader`` right now, if any."""
        for node in self.nodes:
            if server_mode(node.host, node.client_port) == "leader":
                return node
        return None

    def start(self, wait: bool = True) -> list[ZooKeeperServer]:
        """Launch every member that is not running, then (``wait``) wait until healthy.

        Returns the members launched by this call. If any launch or the wait fails (or is
        interrupted), the members launched by this call are stopped again, members that
        were running before are left alone, and the error is raised:
        :class:`procs.PortInUseError` for a taken client, quorum or election port,
        :class:`ZooKeeperStartError` (with the log tails) for a member that exits or an
        ensemble that is not healthy within ``start_timeout``.
        """
        launched: list[ZooKeeperServer] = []
        try:
            for node in self.nodes:
                if not node.is_running():
                    node.start(wait=False)
                    launched.append(node)
            if wait:
                self.wait_until_healthy()
        except BaseException:
            for node in reversed(launched):
                node.stop(grace=5.0)
            raise
        return launched

    def wait_until_healthy(self, timeout: float | None = None) -> EnsembleHealth:
        """Block until every member serves and exactly one leads; raise if one exits."""
        budget = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        # A member counts as gone only after several looks in a row: a single miss right
        # after launch once failed CI with an empty log, and a real death stays dead.
        misses = dict.fromkeys(range(len(self.nodes)), 0)
        exits: dict[int, str] = {}
        while True:
            for index, node in enumerate(self.nodes):
                exit_status = node.reap_exit_status()
                if exit_status is not None:
                    exits[index] = exit_status
                if node.is_running():
                    misses[index] = 0
                    continue
                misses[index] += 1
                if misses[index] < _MISSES_BEFORE_DEAD and index not in exits:
                    continue
                code = node.returncode
                how = (f"exited with code {code}" if code is not None
                       else exits.get(index, "is not running"))
                raise ZooKeeperStartError(
                    f"ZooKeeper server {node.server_id} of the ensemble {how} "
                    f"(log: {node.log_path}; {node.describe_pid()})",
                    node.log_tail(),
                )
            health = self.health()
            if health.healthy:
                return health
            if time.monotonic() >= deadline:
                tails = "\n".join(
                    f"--- {node.log_path} ---\n{node.log_tail(15)}"
                    for node, (_, mode) in zip(self.nodes, health.modes, strict=True)
                    if mode != "leader"  # the leader's log rarely says why others lag
                )
                raise ZooKeeperStartError(
                    f"ZooKeeper ensemble {self.connect_string} was not healthy after "
                    f"{budget:.0f}s (want every server serving and exactly one leader; "
                    f"now: {health.describe()})",
                    tails,
                )
            time.sleep(0.2)

    def wait_for_leader(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Block until a majority of members serve and exactly one of them leads.

        Unlike :meth:`wait_until_healthy` this tolerates dead members: it is what to wait
        for after a member was killed.
        """
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            leaders = health.leaders
            if len(leaders) == 1 and len(health.serving) > len(self.nodes) // 2:
                return next(n for n in self.nodes if n.connect_string == leaders[0])
            if time.monotonic() >= deadline:
                raise ZooKeeperError(
                    f"no single ZooKeeper leader with a quorum after {timeout:.0f}s "
                    f"(now: {health.describe()})"
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """Stop every member by PID (see :meth:`ZooKeeperServer.stop`), last one first."""
        for node in reversed(self.nodes):
            node.stop(grace=grace)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperEnsemble({self.connect_string!r})"
