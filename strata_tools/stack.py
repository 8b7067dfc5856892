"""The local Strata stack: a list of background services started, tracked and stopped.

Why it looks like this: ``make up`` / ``strata up`` must work on a laptop and in CI, be
safe to run twice, and ``strata down`` must stop exactly what ``up`` started, even from
another shell much later. So every started process is recorded in
``<data-dir>/stack.json`` (name, pid, port, the command-line marker that identifies it)
right after it becomes healthy, and everything that stops a process checks that marker
against ``/proc/<pid>/cmdline`` first (see :mod:`procs`).

The stack is an ordered tuple of :class:`ServiceSpec` built by :func:`stack_services`:
ZooKeeper (one ``zookeeper`` server, or an ensemble ``zookeeper-0`` .. ``zookeeper-2``),
then ``broker-0`` .. ``broker-<N-1>``, then the HTTP ingest ``gateway``, then the ``tier``
job (``strata tier run --every 60`` into ``<data-dir>/warehouse``; it starts Spark only
once some topic has ``tier.enable=true``). A service gets its port as
``base_port + port_offset`` and sees the endpoints of the services started before it
(brokers need ZooKeeper's, comma-separated for an ensemble).

Port plan for base port P (:data:`ZOOKEEPER_PEER_OFFSET` and friends)::

    ZooKeeper node k (0-based)    client P+k, quorum P+3+k, election P+6+k  (P..P+8)
    broker i (i < 30)             P+10+i                                    (P+10..P+39)
    broker i metrics              P+40+i                                    (P+40..P+69)
    broker i Kafka listener       P+80+i                                    (P+80..P+109)
    ingest gateway (HTTP)         P+9
    tiering job metrics (HTTP)    P+70

A single ZooKeeper uses only P. Services of a *group* are launched together and only
then waited for as a whole: the members of an ensemble (no member serves before a quorum
of them runs) and the brokers (each opens its logs on its own; started one after another
a 10,000-partition cluster took the sum of their start times). ``up`` reports each broker
as it answers, and ``down`` stops a group's members in parallel.

A broker that no longer answers because it is shutting down (it writes
``broker-<i>/logs/shutting-down`` with its pid for the length of its shutdown) is waited
for, with progress, until it exits (at most ``--shutdown-wait`` seconds), then started
again: that is what a rolling restart needs (:meth:`Stack.rolling_restart`).

Layout of a data dir::

    <data-dir>/stack.json      what is running (written atomically)
    <data-dir>/stack.lock      serialises concurrent `strata up` / `strata down`
    <data-dir>/<service>/      each service's own files (data, log, pid file):
                               zookeeper/ (single server) or zookeeper-0..2/ (ensemble),
                               broker-<i>/, gateway/ (gateway.log, auth.toml and
                               dev-token: the development API key, both mode 0600),
                               tier/ (tier.log: one JSON line per pass)
    <data-dir>/warehouse/      the Delta tables of tiered topics (spark_jobs/README.md)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from procs import PortInUseError, check_port_free, cmdline, kill_pid, pid_alive
from strata_tools.secure import SecureStack
from wire.security import PLAINTEXT, ClientSecurity

if TYPE_CHECKING:
    from zookeeper.launcher import ZooKeeperEnsemble, ZooKeeperServer

__all__ = [
    "DEFAULT_BASE_PORT",
    "DEFAULT_DATA_DIR",
    "ROLLING_RESTART_GRACE_S",
    "SERVICES",
    "SHUTDOWN_WAIT_S",
    "SYNC_TIMEOUT_S",
    "ZOOKEEPER_NODE_CHOICES",
    "Launched",
    "ProcessRecord",
    "ProcessState",
    "RestartedBroker",
    "ServiceSpec",
    "Stack",
    "StackContext",
    "StackError",
    "StackStatus",
]

DEFAULT_DATA_DIR = ".strata"
DEFAULT_BASE_PORT = 2181
STATE_FILE = "stack.json"
_STATE_VERSION = 1

State = Literal["started", "running", "unhealthy", "stopped"]


class StackError(RuntimeError):
    """An expected, user-fixable problem; the message says what to do."""


@dataclass(frozen=True)
class StackContext:
    """What a service's start function needs to know about the stack."""

    data_dir: Path
    host: str
    endpoints: dict[str, str]  # endpoint key -> "host:port[,host:port]" of services so far
    base_port: int = DEFAULT_BASE_PORT
    progress: Callable[[str], None] | None = None  # one line per step, e.g. to stderr
    #: The tier's warehouse: a directory or ``s3://bucket[/prefix]`` (``Stack.warehouse``).
    warehouse: str = ""

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)


@dataclass(frozen=True)
class Launched:
    """A started, healthy process as a start function reports it."""

    pid: int
    port: int
    marker: str  # substring of /proc/<pid>/cmdline that identifies this process
    endpoint: str  # what clients connect to, "host:port"
    log: str  # path of its log file
    pid_file: str | None = None  # removed by `down` once the process is gone


@dataclass(frozen=True)
class ServiceSpec:
    """One background service of the stack.

    ``start(ctx, port)`` must start the process detached (own session, output to a log
    file), wait until it is healthy and return :class:`Launched`, or raise (a
    :class:`StackError` or the launcher's own error) leaving nothing running.
    ``healthy(host, port)`` is a quick probe used by ``status`` and by ``up`` for
    processes that are already running.

    Grouped services (``group`` set, consecutive in the stack: the members of a ZooKeeper
    ensemble, the brokers) differ: ``start`` only launches the process and returns at
    once, and once every member of the group runs (already, or launched by this ``up``),
    ``group_wait(ctx, records)`` of the first member blocks until the whole group is
    healthy or raises. If it raises, ``up`` stops the members it launched.

    ``closing(record)``, if set, says that a running process is shutting down (alive, no
    longer serving, about to exit): ``up`` then waits for it to exit and starts it again.
    """

    name: str
    port_offset: int
    endpoint_key: str  # "zookeeper", "bootstrap", "gateway" or "tier_metrics"
    start: Callable[[StackContext, int], Launched]
    healthy: Callable[[str, int], bool]
    group: str | None = None
    group_wait: Callable[[StackContext, Sequence[ProcessRecord]], None] | None = None
    closing: Callable[[ProcessRecord], bool] | None = None


@dataclass(frozen=True)
class ProcessRecord:
    """One line of stack.json."""

    name: str
    pid: int
    port: int
    marker: str
    endpoint_key: str
    endpoint: str
    log: str
    pid_file: str | None = None
    started_at: float = field(default_factory=time.time)

    def alive(self) -> bool:
        """True if the PID is alive and still runs the command we started."""
        line = cmdline(self.pid)
        return pid_alive(self.pid) and line is not None and self.marker in line


@dataclass(frozen=True)
class ProcessState:
    record: ProcessRecord
    state: State

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.record.name,
            "pid": self.record.pid,
            "port": self.record.port,
            "endpoint": self.record.endpoint,
            "state": self.state,
            "log": self.record.log,
        }


@dataclass(frozen=True)
class StackStatus:
    data_dir: Path
    processes: list[ProcessState]
    #: Bearer token of the development API key while the gateway runs, else None.
    gateway_api_key: str | None = None
    #: The tier's warehouse (``Stack.warehouse``); "" means ``<data-dir>/warehouse``.
    warehouse: str = ""

    @property
    def all_up(self) -> bool:
        return bool(self.processes) and all(
            p.state in ("started", "running") for p in self.processes
        )

    def endpoints(self) -> dict[str, str | None]:
        """Endpoint per key. ``bootstrap`` and ``kafka_bootstrap`` (the brokers' Kafka
        listeners) are "" and ``gateway`` None until they exist."""
        found: dict[str, list[str]] = {}
        for p in self.processes:
            if p.state in ("started", "running"):
                found.setdefault(p.record.endpoint_key, []).append(p.record.endpoint)
        out: dict[str, str | None] = {"bootstrap": "", "kafka_bootstrap": "",
                                      "zookeeper": None, "gateway": None,
                                      "tier_metrics": None}
        for key, values in found.items():
            out[key] = ",".join(values)
        # Each broker's Kafka listener sits at a fixed offset from its own port.
        out["kafka_bootstrap"] = ",".join(
            f"{p.record.endpoint.rpartition(':')[0]}:{kafka_port_of(p.record.port)}"
            for p in self.processes
            if p.record.endpoint_key == "bootstrap" and p.state in ("started", "running"))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "data_dir": str(self.data_dir),
            **self.endpoints(),
            "warehouse": self.warehouse or str(self.data_dir / WAREHOUSE_DIR),
            "gateway_api_key": self.gateway_api_key,
            "processes": [p.to_json() for p in self.processes],
        }


# -- services -------------------------------------------------------------------------


def _launched(server: ZooKeeperServer, port: int) -> Launched:
    pid = server.pid
    if pid is None:  # pragma: no cover - start() returned, so the JVM ran a moment ago
        raise StackError(f"ZooKeeper exited right after start-up; see {server.log_path}")
    return Launched(
        pid=pid,
        port=port,
        marker=server.marker,
        endpoint=server.connect_string,
        log=str(server.log_path),
        pid_file=str(server.pid_path),
    )


def _start_zookeeper(ctx: StackContext, port: int) -> Launched:
    from zookeeper.launcher import ZooKeeperServer

    server = ZooKeeperServer(ctx.data_dir / "zookeeper", port, host=ctx.host)
    server.start()
    return _launched(server, port)


def _zookeeper_healthy(host: str, port: int) -> bool:
    from zookeeper.launcher import is_serving

    return is_serving(host, port)


#: ``--zookeeper-nodes`` values: a single server, or a 3-node ensemble (tolerates 1 loss).
ZOOKEEPER_NODE_CHOICES = (1, 3)
ZOOKEEPER_PEER_OFFSET = 3  # node k's quorum (follower <-> leader) port: P+3+k
ZOOKEEPER_ELECTION_OFFSET = 6  # node k's leader-election port: P+6+k
ZOOKEEPER_ENSEMBLE_HEAP = "128m"  # three JVMs share two cores and the brokers' memory


def zookeeper_node_dir(data_dir: Path, nodes: int, k: int) -> Path:
    """``zookeeper/`` for a single server (the layout from before ensembles existed),
    ``zookeeper-<k>/`` for ensemble member k."""
    return data_dir / ("zookeeper" if nodes == 1 else f"zookeeper-{k}")


def zookeeper_layout(data_dir: Path) -> int | None:
    """How many ZooKeeper servers the data dir holds: the ``zookeeper-<k>`` directories,
    else 1 if it has ``zookeeper/``, else None (nothing started yet)."""
    members = [d for d in data_dir.glob("zookeeper-*")
               if d.is_dir() and d.name[len("zookeeper-"):].isdigit()]
    if members:
        return len(members)
    return 1 if (data_dir / "zookeeper").is_dir() else None


def _ensemble(ctx: StackContext, nodes: int) -> ZooKeeperEnsemble:
    from zookeeper.launcher import EnsembleMember, ZooKeeperEnsemble

    # server.N ids (data/myid) are 1-based: ZooKeeper wants 1..255; directories are 0-based
    # like the service names.
    members = [
        EnsembleMember(k + 1, ctx.host, ctx.base_port + k,
                       ctx.base_port + ZOOKEEPER_PEER_OFFSET + k,
                       ctx.base_port + ZOOKEEPER_ELECTION_OFFSET + k)
        for k in range(nodes)
    ]
    return ZooKeeperEnsemble([zookeeper_node_dir(ctx.data_dir, nodes, k) for k in range(nodes)],
                             members, heap=ZOOKEEPER_ENSEMBLE_HEAP)


def _start_ensemble_member(k: int, nodes: int) -> Callable[[StackContext, int], Launched]:
    def start(ctx: StackContext, port: int) -> Launched:
        ensemble = _ensemble(ctx, nodes)
        # Every member's directory exists before the first JVM starts: the layout on disk
        # is what tells a later `strata up` how many nodes this stack has.
        for node in ensemble.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
        server = ensemble.nodes[k]
        server.start(wait=False)  # the group is waited for once every member runs
        return _launched(server, port)

    return start


def _wait_ensemble(nodes: int) -> Callable[[StackContext, Sequence[ProcessRecord]], None]:
    def wait(ctx: StackContext, records: Sequence[ProcessRecord]) -> None:
        _ensemble(ctx, nodes).wait_until_healthy()

    return wait


def zookeeper_services(nodes: int = 1) -> tuple[ServiceSpec, ...]:
    """``zookeeper`` (one server) or the ensemble ``zookeeper-0`` .. ``zookeeper-<n-1>``."""
    if nodes not in ZOOKEEPER_NODE_CHOICES:
        raise StackError(
            f"--zookeeper-nodes must be one of {', '.join(map(str, ZOOKEEPER_NODE_CHOICES))}, "
            f"got {nodes}"
        )
    if nodes == 1:
        return (ZOOKEEPER_SERVICE,)
    wait = _wait_ensemble(nodes)
    return tuple(
        ServiceSpec(name=f"zookeeper-{k}", port_offset=k, endpoint_key="zookeeper",
                    start=_start_ensemble_member(k, nodes), healthy=_zookeeper_healthy,
                    group="zookeeper", group_wait=wait)
        for k in range(nodes)
    )


BROKER_PORT_OFFSET = 10
BROKER_METRICS_OFFSET = 40
#: Each broker's Kafka-protocol listener (stock Kafka clients; docs/kafka-compatibility.md).
KAFKA_PORT_OFFSET = 80
MAX_BROKERS = 30
#: Brokers of a new stack: the smallest cluster in which a topic survives losing a broker
#: with acks=all and min.insync.replicas=2.
DEFAULT_BROKERS = 3


def kafka_port_of(broker_port: int) -> int:
    """The port of the Kafka listener of the broker on ``broker_port``."""
    return broker_port - BROKER_PORT_OFFSET + KAFKA_PORT_OFFSET


def replication_defaults(brokers: int) -> list[str]:
    """Broker overrides so that topics created without a factor are replicated as far as
    the stack allows (Kafka's own defaults, 1 and 1, lose data with a single disk)."""
    factor = min(brokers, 3)
    overrides = [f"default.replication.factor={factor}",
                 f"offsets.topic.replication.factor={factor}"]
    if factor >= 3:
        overrides.append("log.min.insync.replicas=2")
    return [arg for item in overrides for arg in ("--override", item)]


def _start_broker(broker_id: int, brokers: int) -> Callable[[StackContext, int], Launched]:
    def start(ctx: StackContext, port: int) -> Launched:
        zookeeper = ctx.endpoints.get("zookeeper")
        if not zookeeper:
            raise StackError("brokers need ZooKeeper, which is not running")
        data = ctx.data_dir / f"broker-{broker_id}"
        data.mkdir(parents=True, exist_ok=True)
        log_path = data / "broker.log"
        metrics_port = port - BROKER_PORT_OFFSET + BROKER_METRICS_OFFSET
        check_port_free(ctx.host, metrics_port, f"broker-{broker_id} metrics")
        kafka_port = kafka_port_of(port)
        check_port_free(ctx.host, kafka_port, f"broker-{broker_id} Kafka listener")
        secure = SecureStack(ctx.data_dir)
        where = ["--host", ctx.host, "--port", str(port)]
        kafka = f"KAFKA://{ctx.host}:{kafka_port}"
        if secure.enabled:
            secure.ensure_users(zookeeper)
            where = secure.broker_overrides(ctx.host, port)
            kafka = f"KAFKA_SASL_SSL://{ctx.host}:{kafka_port}"
        where += ["--override", f"kafka.listeners={kafka}"]
        args = [sys.executable, "-m", "brokers", "--broker-id", str(broker_id), *where,
                "--data-dir", str(data / "logs"), "--zookeeper", zookeeper,
                "--metrics-port", str(metrics_port), *replication_defaults(brokers)]
        # Launched only: the brokers are waited for together (_wait_brokers).
        return _launch(args, log_path, str(data / "logs"), f"broker-{broker_id}", port,
                       f"{ctx.host}:{port}", None)

    return start


#: How long ``strata up`` waits for one service to answer. A broker serves once every
#: log it hosts is open: with ten thousand partitions that takes a while.
START_TIMEOUT_S = 300.0
#: How long ``strata up`` waits for a broker that is shutting down to exit before it
#: starts it again (``--shutdown-wait``). A broker's shutdown is bounded by its
#: controlled.shutdown.timeout.ms and shutdown.timeout.ms plus the time to close its logs.
SHUTDOWN_WAIT_S = 300.0
#: A rolling restart's SIGTERM-to-SIGKILL grace per broker: a clean shutdown (no log
#: recovery at the next start) matters more here than the time.
ROLLING_RESTART_GRACE_S = 120.0
#: How long a rolling restart waits for every partition to be back in sync.
SYNC_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RestartedBroker:
    """One step of :meth:`Stack.rolling_restart`; durations in seconds."""

    name: str
    old_pid: int
    new_pid: int
    stop_s: float  # SIGTERM until the process had exited
    start_s: float  # start until it answered
    total_s: float  # SIGTERM until every partition was in sync again


def _broker_id(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _launch(args: list[str], log_path: Path, marker: str, what: str, port: int,
            endpoint: str, healthy: Callable[[], bool] | None) -> Launched:
    """Start ``args`` in a session of its own (output appended to ``log_path``) and wait
    up to :data:`START_TIMEOUT_S` until ``healthy()`` (``None``: return at once, the
    group's wait does it). If it exits or times out first (or on Ctrl-C), it is killed:
    nothing is left running that stack.json won't know."""
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    if healthy is None:
        return Launched(pid=process.pid, port=port, marker=marker, endpoint=endpoint,
                        log=str(log_path))
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not healthy():
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                late = "" if process.poll() is not None else \
                    f" within {START_TIMEOUT_S:.0f} s"
                raise StackError(f"{what} did not start{late}; end of {log_path}:\n{tail}")
            time.sleep(0.1)
    except BaseException:
        if process.poll() is None:
            kill_pid(process.pid, 5.0, expect=marker)
        raise
    return Launched(pid=process.pid, port=port, marker=marker, endpoint=endpoint,
                    log=str(log_path))


#: How this process reaches the brokers of a secured stack (``Stack`` sets it).
_SECURE_CLIENT: list[ClientSecurity] = []


def _broker_healthy(host: str, port: int) -> bool:
    """The broker answers an ApiVersions request and is registered (Metadata lists it)."""
    if _SECURE_CLIENT:
        return _secure_broker_healthy(host, port, _SECURE_CLIENT[0])
    from wire.protocol import (
        FRAME_PREFIX,
        ApiKey,
        MetadataRequest,
        MetadataResponse,
        RequestHeader,
        decode,
        encode_request,
        read_response_header,
    )

    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(encode_request(RequestHeader(int(ApiKey.METADATA), 0, 1, "strata-up"),
                                        MetadataRequest([])))
            (size,) = FRAME_PREFIX.unpack(_recv_exactly(sock, FRAME_PREFIX.size))
            header, reader = read_response_header(_recv_exactly(sock, size))
            response = decode(MetadataResponse, reader)
    except (OSError, ValueError, RuntimeError):
        return False
    return header.error_code == 0 and any(b.port == port for b in response.brokers)


def _secure_broker_healthy(host: str, port: int, security: ClientSecurity) -> bool:
    """The same check over TLS, logged in as the stack's admin."""
    import asyncio

    from wire.connection import BrokerConnection
    from wire.protocol import ApiKey, MetadataRequest, MetadataResponse

    async def ask() -> bool:
        async with BrokerConnection(host, port, security=security,
                                    client_id="strata-up") as connection:
            answer = await connection.request(ApiKey.METADATA, MetadataRequest([]))
            return isinstance(answer, MetadataResponse) and \
                any(b.port == port for b in answer.brokers)

    try:
        return asyncio.run(asyncio.wait_for(ask(), 3))
    except Exception:
        return False


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError("connection closed")
        data += chunk
    return data


ZOOKEEPER_SERVICE = ServiceSpec(
    name="zookeeper",
    port_offset=0,
    endpoint_key="zookeeper",
    start=_start_zookeeper,
    healthy=_zookeeper_healthy,
)


#: How long ``up`` gives a recorded process that is alive but not answering (and not
#: shutting down) to exit before it takes it for a running one (``_past_last_step``).
LAST_STEP_S: Final = 3.0


def _wait_brokers(ctx: StackContext, records: Sequence[ProcessRecord]) -> None:
    """Wait until every broker of ``records`` answers, reporting each as it does; raise
    (with the end of its log) as soon as one exits, or after :data:`START_TIMEOUT_S`."""
    started = time.monotonic()
    pending = list(records)
    while pending:
        for record in list(pending):
            if _broker_healthy(ctx.host, record.port):
                pending.remove(record)
                ctx.say(f"{record.name} answers on {record.endpoint} (pid {record.pid}, "
                        f"{time.monotonic() - started:.1f} s)")
            elif not pid_alive(record.pid):
                # The pid, not ``alive()``: until the child has exec'd, its command line
                # is still this process's and would not show the marker.
                tail = Path(record.log).read_text(errors="replace")[-2000:]
                raise StackError(f"{record.name} did not start; end of {record.log}:\n{tail}")
        if not pending:
            return
        if time.monotonic() - started > START_TIMEOUT_S:
            names = ", ".join(r.name for r in pending)
            raise StackError(
                f"{names} did not answer within {START_TIMEOUT_S:.0f} s (a broker serves "
                "once every log it hosts is open); see broker-<i>/broker.log in "
                f"{ctx.data_dir}")
        time.sleep(0.1)


def _broker_closing(record: ProcessRecord) -> bool:
    """The broker of ``record`` has begun its shutdown (brokers/broker.py writes the file
    with its pid and removes it when done)."""
    try:
        text = (Path(record.marker) / "shutting-down").read_text().strip()
    except OSError:
        return False
    return text.isdigit() and int(text) == record.pid


def broker_service(broker_id: int, brokers: int = 1) -> ServiceSpec:
    """Broker ``broker_id`` of a stack of ``brokers`` (which sets its replication defaults)."""
    return ServiceSpec(name=f"broker-{broker_id}", port_offset=BROKER_PORT_OFFSET + broker_id,
                       endpoint_key="bootstrap", start=_start_broker(broker_id, brokers),
                       healthy=_broker_healthy, group="brokers", group_wait=_wait_brokers,
                       closing=_broker_closing)


# -- the ingest gateway -----------------------------------------------------------------

#: P+9: the one port below the brokers' range that ZooKeeper's plan (P..P+8) leaves free.
GATEWAY_PORT_OFFSET = 9
GATEWAY_DIR = "gateway"
GATEWAY_AUTH_FILE = "auth.toml"
GATEWAY_TOKEN_FILE = "dev-token"
#: What `down` gives in-flight requests (below its default SIGKILL grace of 30 s).
GATEWAY_SHUTDOWN_GRACE_S = 10


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable only by the user (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # also if tmp existed with looser bits
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_dev_token(data_dir: Path) -> str | None:
    """The development API key's Bearer token of the stack in ``data_dir``, if made."""
    try:
        token = (data_dir / GATEWAY_DIR / GATEWAY_TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    return token or None


def ensure_dev_key(data_dir: Path) -> Path:
    """The gateway's auth file, made on first use: one key granting all access, whose
    token is kept next to it (both 0600) so it stays the same across `down`/`up`."""
    from ingest_gateway import ALL_ACCESS, DEV_KEY_ID, generate_dev_key

    directory = data_dir / GATEWAY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    auth = directory / GATEWAY_AUTH_FILE
    if auth.is_file() and read_dev_token(data_dir) is not None:
        return auth
    token, secret_hash = generate_dev_key()
    acls = ", ".join(f'{{ action = "{rule.action.value}", '
                     f'{"prefix" if rule.prefix else "topic"} = "{rule.topic}" }}'
                     for rule in ALL_ACCESS)
    _write_private(auth, (
        "# Development API key of the local stack, made by `strata up`: all access.\n"
        f"# Its token is in {GATEWAY_TOKEN_FILE}; delete both files to get a new key.\n"
        "enabled = true\n\n[[keys]]\n"
        f'id = "{DEV_KEY_ID}"\nsecret_hash = "{secret_hash}"\nacls = [{acls}]\n'))
    # The token last: a token file only exists next to the auth file that accepts it.
    _write_private(directory / GATEWAY_TOKEN_FILE, token + "\n")
    return auth


def _start_gateway(ctx: StackContext, port: int) -> Launched:
    bootstrap = ctx.endpoints.get("bootstrap")
    if not bootstrap:
        raise StackError("the gateway needs the brokers, which are not running")
    auth = ensure_dev_key(ctx.data_dir)
    log_path = ctx.data_dir / GATEWAY_DIR / "gateway.log"
    args = [sys.executable, "-m", "strata_tools.cli", "gateway", "--bootstrap", bootstrap,
            "--host", ctx.host, "--port", str(port), "--auth-config", str(auth),
            "--shutdown-grace-s", str(GATEWAY_SHUTDOWN_GRACE_S),
            *_command_config(ctx, "gateway")]
    return _launch(args, log_path, str(auth), "the gateway", port, f"http://{ctx.host}:{port}",
                   lambda: _gateway_healthy(ctx.host, port))


def _command_config(ctx: StackContext, user: str) -> list[str]:
    """On a secured stack, the ``--command-config`` of ``user``'s own principal."""
    secure = SecureStack(ctx.data_dir)
    return ["--command-config", str(secure.config_file(user))] if secure.enabled else []


def _http_ok(url: str) -> bool:
    """``url`` answers 200 within 2 s."""
    import urllib.request

    # No proxy: an http_proxy in the environment must not route a loopback probe.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):  # URLError/HTTPError (e.g. 503) are OSErrors
        return False


def _gateway_healthy(host: str, port: int) -> bool:
    """``/readyz`` answers 200: the gateway serves and sees live brokers."""
    return _http_ok(f"http://{host}:{port}/readyz")


GATEWAY_SERVICE = ServiceSpec(
    name="gateway",
    port_offset=GATEWAY_PORT_OFFSET,
    endpoint_key="gateway",
    start=_start_gateway,
    healthy=_gateway_healthy,
)


TIER_METRICS_OFFSET = 70
TIER_DIR = "tier"
WAREHOUSE_DIR = "warehouse"
#: Seconds between two passes of the stack's tiering job.
TIER_EVERY_S = 60


def _start_tier(ctx: StackContext, port: int) -> Launched:
    bootstrap = ctx.endpoints.get("bootstrap")
    if not bootstrap:
        raise StackError("the tiering job needs the brokers, which are not running")
    (ctx.data_dir / TIER_DIR).mkdir(parents=True, exist_ok=True)
    warehouse = ctx.warehouse or str(ctx.data_dir / WAREHOUSE_DIR)
    if "://" not in warehouse:
        Path(warehouse).mkdir(parents=True, exist_ok=True)
    # An object store's credentials reach the job through its environment (inherited
    # from `strata up`'s), never through this command line.
    args = [sys.executable, "-m", "strata_tools.cli", "tier", "run", "--bootstrap", bootstrap,
            "--warehouse", warehouse, "--every",
            str(TIER_EVERY_S), "--format", "json", "--metrics-port", str(port),
            *_command_config(ctx, "tier")]
    return _launch(args, ctx.data_dir / TIER_DIR / "tier.log", warehouse, "the tiering job",
                   port, f"http://{ctx.host}:{port}/metrics",
                   lambda: _metrics_healthy(ctx.host, port))


def _metrics_healthy(host: str, port: int) -> bool:
    """The job's Prometheus endpoint answers (it opens before the first pass)."""
    return _http_ok(f"http://{host}:{port}/metrics")


TIER_SERVICE = ServiceSpec(
    name="tier",
    port_offset=TIER_METRICS_OFFSET,
    endpoint_key="tier_metrics",
    start=_start_tier,
    healthy=_metrics_healthy,
)


def stack_services(brokers: int = 1, zookeeper_nodes: int = 1,
                   tier: bool = True) -> tuple[ServiceSpec, ...]:
    """The stack in start order (``down`` stops in reverse, so the tier job first).

    ``tier=False`` (``strata up --no-tier``) leaves the tiering job out, e.g. for a
    benchmark that runs its own job on the same topics."""
    if not 1 <= brokers <= MAX_BROKERS:
        raise StackError(f"--brokers must be 1..{MAX_BROKERS}, got {brokers}")
    return (*zookeeper_services(zookeeper_nodes),
            *(broker_service(i, brokers) for i in range(brokers)),
            GATEWAY_SERVICE, *((TIER_SERVICE,) if tier else ()))


def _all_known_services() -> dict[str, ServiceSpec]:
    """Every service name any stack layout can have, for probing recorded processes."""
    known: dict[str, ServiceSpec] = {}
    for nodes in ZOOKEEPER_NODE_CHOICES:
        known.update((s.name, s) for s in stack_services(MAX_BROKERS, nodes))
    return known


#: The services of a one-broker stack (``stack_services(n)`` builds any size; ``strata up``
#: starts three brokers unless told otherwise).
SERVICES: tuple[ServiceSpec, ...] = stack_services(1)


# -- the stack ------------------------------------------------------------------------


class Stack:
    """The services of one data dir. All methods are safe to call from separate processes."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR,
        *,
        host: str = "127.0.0.1",
        services: Sequence[ServiceSpec] | None = None,
        brokers: int | None = None,
        zookeeper_nodes: int | None = None,
        health_wait: float = 30.0,
        tier: bool = True,
        secure: bool = False,
        progress: Callable[[str], None] | None = None,
        shutdown_wait: float = SHUTDOWN_WAIT_S,
        warehouse: str | None = None,
    ) -> None:
        """``brokers`` None: as many as the data dir has broker directories
        (``DEFAULT_BROKERS`` if none).
        ``zookeeper_nodes`` None: as many as it has ZooKeeper directories (1 if none).
        ``progress`` gets one line per step of a long operation (the CLI prints them to
        stderr). ``shutdown_wait``: how long ``up`` waits for a process that is shutting
        down to exit before it gives up. ``warehouse``: where the tiering job keeps the
        Delta tables (a directory, ``file:///path`` or ``s3://bucket[/prefix]``;
        ``INVALID_WAREHOUSE`` otherwise, before anything starts); None: the one recorded
        in the data dir, else ``<data-dir>/warehouse``."""
        self.data_dir = Path(data_dir).resolve()
        self._warehouse_arg: str | None = None
        if warehouse is not None:
            from strata_spark import Warehouse

            self._warehouse_arg = Warehouse.parse(warehouse).uri
        self.host = host
        self._fixed_services = tuple(services) if services is not None else None
        self.brokers = brokers
        self.zookeeper_nodes = zookeeper_nodes
        self.health_wait = health_wait
        self.tier = tier
        self.progress = progress
        self.shutdown_wait = shutdown_wait
        self.security = SecureStack(self.data_dir)
        if secure:
            self.security.ensure()
        _SECURE_CLIENT[:] = [self.security.client()] if self.security.enabled else []
        self._not_reached: list[ProcessRecord] = []
        self._warehouse_now = ""  # fixed by each `up` (Stack.warehouse), then recorded

    @property
    def services(self) -> tuple[ServiceSpec, ...]:
        if self._fixed_services is not None:
            return self._fixed_services
        count = self.brokers
        if count is None:
            # A cluster keeps its size across `down`/`up`: each broker has a directory.
            existing = list(self.data_dir.glob("broker-*"))
            count = len([d for d in existing if d.name[len("broker-"):].isdigit()]) \
                or DEFAULT_BROKERS
        nodes = self.zookeeper_nodes
        if nodes is None:
            nodes = zookeeper_layout(self.data_dir) or 1  # same for ZooKeeper's size
            if nodes not in ZOOKEEPER_NODE_CHOICES:
                raise StackError(
                    f"{self.data_dir} has {nodes} zookeeper-<k> directories, but an ensemble "
                    f"has {max(ZOOKEEPER_NODE_CHOICES)} members; restore the missing one or "
                    "start over in a new data dir"
                )
        return stack_services(count, nodes, self.tier)

    def _check_zookeeper_layout(self) -> None:
        """Refuse to switch between one ZooKeeper and an ensemble on an existing data dir."""
        on_disk = zookeeper_layout(self.data_dir)
        wanted = self.zookeeper_nodes
        if wanted is None or on_disk is None or wanted == on_disk:
            return
        have = ("a single ZooKeeper (zookeeper/)" if on_disk == 1
                else f"a {on_disk}-node ZooKeeper ensemble (zookeeper-<k>/)")
        raise StackError(
            f"{self.data_dir} already holds {have}, and --zookeeper-nodes {wanted} would "
            "start a new, empty ZooKeeper: the brokers' data belongs to the cluster recorded "
            "in the existing one, so they would refuse to start. Leave out --zookeeper-nodes "
            f"to keep {on_disk}; to start over with {wanted}, run `strata down --data-dir "
            f"{self.data_dir}` and delete that directory, or use another --data-dir."
        )

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    # -- state file ---------------------------------------------------------------------

    def _load(self) -> tuple[int | None, list[ProcessRecord]]:
        try:
            raw = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None, []
        except (OSError, ValueError) as exc:
            raise StackError(
                f"{self.state_path} is unreadable ({exc}). If nothing of the stack is "
                "running, delete that file and run `strata up` again."
            ) from exc
        try:
            records = [ProcessRecord(**p) for p in raw.get("processes", [])]
            base = raw.get("base_port")
            return (int(base) if base is not None else None), records
        except (TypeError, ValueError, AttributeError) as exc:
            raise StackError(
                f"{self.state_path} has an unexpected format ({exc}); it was written by a "
                "different Strata version. Stop the old processes, delete the file and run "
                "`strata up` again."
            ) from exc

    @property
    def warehouse(self) -> str:
        """The tier's warehouse: the one given, else the one recorded in the data dir
        (a stack keeps its warehouse across `down`/`up`), else ``<data-dir>/warehouse``."""
        if self._warehouse_arg is not None:
            return self._warehouse_arg
        try:
            recorded = json.loads(self.state_path.read_text()).get("warehouse")
        except (OSError, ValueError, AttributeError):
            recorded = None
        return str(recorded) if recorded else str(self.data_dir / WAREHOUSE_DIR)

    def _save(self, base_port: int, records: list[ProcessRecord]) -> None:
        # While `up` works through the services, the live ones it has not reached yet
        # stay recorded: if it fails half-way, `down` must still find them.
        names = {r.name for r in records}
        records = records + [r for r in self._not_reached if r.name not in names]
        payload = {
            "version": _STATE_VERSION,
            "host": self.host,
            "base_port": base_port,
            "warehouse": self._warehouse_now or self.warehouse,
            "processes": [asdict(r) for r in records],
        }
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, self.state_path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with (self.data_dir / "stack.lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StackError(
                    f"another `strata up` or `strata down` is working on {self.data_dir}; "
                    "wait for it to finish and try again"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- operations ---------------------------------------------------------------------

    def up(self, base_port: int | None = None) -> StackStatus:
        """Start every service that is not running; keep those that are (and all data).

        ``base_port`` defaults to the one recorded in the data dir, else 2181.
        """
        with self._locked():
            return self._up(base_port)

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def _context(self, base: int, endpoints: dict[str, str]) -> StackContext:
        return StackContext(self.data_dir, self.host, dict(endpoints), base, self.progress,
                            self._warehouse_now)

    def _up(self, base_port: int | None) -> StackStatus:
        recorded_base, records = self._load()
        self._warehouse_now = self.warehouse
        live = [r for r in records if r.alive()]
        if (
            base_port is not None
            and recorded_base is not None
            and base_port != recorded_base
            and live
        ):
            raise StackError(
                f"the stack in {self.data_dir} is running on base port {recorded_base}; "
                f"run `strata down --data-dir {self.data_dir}` first to move it to "
                f"{base_port}, or omit --base-port"
            )
        if base_port is not None:
            base = base_port
        elif recorded_base is not None:
            base = recorded_base
        else:
            base = DEFAULT_BASE_PORT
        self._check_zookeeper_layout()
        services = self.services
        by_name = {r.name: r for r in live}
        kept: list[ProcessRecord] = []
        states: list[ProcessState] = []
        endpoints: dict[str, str] = {}
        self._not_reached = live
        try:
            for group in _groups(services):
                if group[0].group is None:
                    (spec,) = group
                    self._up_one(spec, base, by_name.get(spec.name), kept, states,
                                 endpoints)
                else:
                    self._up_group(group, base, by_name, kept, states, endpoints)
        finally:
            self._not_reached = []
        # Live processes of services this version does not know (e.g. recorded on
        # another branch) stay recorded, so `down` can still stop them.
        known = {spec.name for spec in services}
        kept.extend(r for r in live if r.name not in known)
        self._save(base, kept)
        return self._status_of(states)

    def _up_one(self, spec: ServiceSpec, base: int, existing: ProcessRecord | None,
                kept: list[ProcessRecord], states: list[ProcessState],
                endpoints: dict[str, str]) -> None:
        state: State
        existing = self._past_shutdown(spec, existing)
        if existing is not None:
            if not self._wait_healthy(spec, existing.port):
                raise StackError(
                    f"{spec.name} (pid {existing.pid}) is running but not answering "
                    f"on port {existing.port}; see {existing.log}, then run "
                    f"`strata down --data-dir {self.data_dir}` and `strata up` again"
                )
            record, state = existing, "running"
        else:
            record = self._start(spec, base, endpoints)
            state = "started"
        kept.append(record)
        states.append(ProcessState(record, state))
        self._save(base, kept)  # record each process as soon as it runs
        _add_endpoint(endpoints, record)

    def _up_group(self, group: Sequence[ServiceSpec], base: int,
                  by_name: dict[str, ProcessRecord], kept: list[ProcessRecord],
                  states: list[ProcessState], endpoints: dict[str, str]) -> None:
        """Launch every missing member, record it, then wait for the group as a whole."""
        launched: list[ProcessRecord] = []
        added: list[ProcessRecord] = []
        try:
            for spec in group:
                existing = self._past_shutdown(spec, by_name.get(spec.name))
                state: State
                if existing is not None:
                    record, state = existing, "running"
                else:
                    record = self._start(spec, base, endpoints)
                    launched.append(record)
                    state = "started"
                added.append(record)
                kept.append(record)
                states.append(ProcessState(record, state))
                self._save(base, kept)  # recorded as soon as it runs, so `down` finds it
            wait = group[0].group_wait
            if wait is not None:
                wait(self._context(base, endpoints), added)
        except BaseException:
            # Not healthy (or Ctrl-C): stop what this call launched; members that were
            # running before stay as they were.
            for record in reversed(launched):
                with contextlib.suppress(TimeoutError):
                    kill_pid(record.pid, 5.0, expect=record.marker)
                if record.pid_file and not record.alive():
                    Path(record.pid_file).unlink(missing_ok=True)
                kept.remove(record)
            self._save(base, kept)
            raise
        for record in added:
            _add_endpoint(endpoints, record)

    def _start(self, spec: ServiceSpec, base: int, endpoints: dict[str, str]) -> ProcessRecord:
        port = base + spec.port_offset
        try:
            check_port_free(self.host, port, spec.name)
        except PortInUseError:
            raise StackError(
                f"cannot start {spec.name}: port {port} on {self.host} is already in use by "
                f"another process. Stop that process (`ss -ltnp 'sport = :{port}'` shows "
                "it) or start the stack on other ports with `strata up --base-port P` "
                f"({spec.name} uses port P+{spec.port_offset})."
            ) from None
        ctx = self._context(base, endpoints)
        try:
            launched = spec.start(ctx, port)
        except PortInUseError as exc:
            # Another port of the plan (a broker's metrics, a ZooKeeper quorum or election
            # port) is taken: the whole plan moves with --base-port.
            raise StackError(
                f"cannot start {spec.name}: {exc} `strata up --base-port P` moves every port "
                "of the stack."
            ) from None
        return ProcessRecord(
            name=spec.name,
            pid=launched.pid,
            port=launched.port,
            marker=launched.marker,
            endpoint_key=spec.endpoint_key,
            endpoint=launched.endpoint,
            log=launched.log,
            pid_file=launched.pid_file,
        )

    def _past_shutdown(self, spec: ServiceSpec, existing: ProcessRecord | None
                       ) -> ProcessRecord | None:
        """``existing``, or None once it has exited if it was shutting down: a broker
        SIGTERMed a moment ago (by hand, ``strata down`` in another shell, a rolling
        restart) no longer answers while it closes its logs, and ``up`` then waits for it
        to exit (reporting every few seconds) and starts it again."""
        if existing is None or spec.closing is None:
            return existing
        if not spec.closing(existing):
            return self._past_last_step(spec, existing)
        started = time.monotonic()
        self._say(f"{existing.name} (pid {existing.pid}) is shutting down; waiting for it "
                  "to exit to start it again")
        reported = started
        while existing.alive():
            now = time.monotonic()
            if now - started > self.shutdown_wait:
                raise StackError(
                    f"{existing.name} (pid {existing.pid}) is still shutting down after "
                    f"{self.shutdown_wait:.0f} s; see {existing.log}. Wait for it and run "
                    "`strata up` again (`--shutdown-wait S` waits longer), or stop it at once "
                    f"with `strata down --data-dir {self.data_dir} --grace 0` (its logs are "
                    "then recovered at the next start)")
            if now - reported >= 5:
                reported = now
                self._say(f"  still waiting for {existing.name} (pid {existing.pid}) to "
                          f"exit ({now - started:.0f} s)")
            time.sleep(0.1)
        self._say(f"{existing.name} exited after {time.monotonic() - started:.1f} s")
        if existing.pid_file:
            Path(existing.pid_file).unlink(missing_ok=True)
        return None

    def _past_last_step(self, spec: ServiceSpec, existing: ProcessRecord) -> ProcessRecord | None:
        """``existing`` (not closing), or None if it exits within :data:`LAST_STEP_S`
        without answering first. A broker removes its ``shutting-down`` file as the last
        step of its shutdown and exits a moment later (longer on a busy machine): caught
        in between, it is alive, not closing and no longer serving, and was taken for a
        running broker, so ``up`` failed with "did not start" when it exited. A process
        that answers, or is still alive after that short wait (one starting up), is
        ``existing`` as before."""
        deadline = time.monotonic() + LAST_STEP_S
        while existing.alive() and not spec.healthy(self.host, existing.port):
            if time.monotonic() >= deadline:
                return existing
            time.sleep(0.1)
        if existing.alive():
            return existing
        self._say(f"{existing.name} (pid {existing.pid}) had just finished shutting down; "
                  "starting it again")
        if existing.pid_file:
            Path(existing.pid_file).unlink(missing_ok=True)
        return None

    def _wait_healthy(self, spec: ServiceSpec, port: int) -> bool:
        deadline = time.monotonic() + self.health_wait
        while True:
            if spec.healthy(self.host, port):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def status(self) -> StackStatus:
        """What stack.json records, each process checked (alive + health probe)."""
        _, records = self._load()
        # Probe by the recorded name, whatever the data dir's layout says today.
        specs = ({s.name: s for s in self._fixed_services} if self._fixed_services is not None
                 else _all_known_services())
        states: list[ProcessState] = []
        for record in records:
            state: State
            if not record.alive():
                state = "stopped"
            else:
                spec = specs.get(record.name)
                ok = spec is None or spec.healthy(self.host, record.port)
                state = "running" if ok else "unhealthy"
            states.append(ProcessState(record, state))
        return self._status_of(states)

    def _status_of(self, states: list[ProcessState]) -> StackStatus:
        gateway_up = any(p.record.endpoint_key == "gateway" and p.state in ("started", "running")
                         for p in states)
        return StackStatus(self.data_dir, states,
                           read_dev_token(self.data_dir) if gateway_up else None,
                           self.warehouse)

    def down(self, grace: float = 30.0) -> list[tuple[ProcessRecord, str]]:
        """Stop exactly the recorded PIDs, last started first; data stays on disk.

        Returns each record with what happened: ``stopped``, ``not running`` or
        ``pid reused`` (the PID now belongs to another program and was left alone).
        """
        with self._locked():
            base, records = self._load()
            outcome: list[tuple[ProcessRecord, str]] = []
            for wave in self._stop_waves(records):
                if len(wave) == 1:
                    outcome.append(self._stop(wave[0], grace))
                    continue
                # A group's members at once: each broker's controlled shutdown skips the
                # others, which are leaving too, so stopping them together costs one
                # broker's shutdown instead of the sum.
                with ThreadPoolExecutor(len(wave)) as pool:
                    outcome.extend(pool.map(lambda r: self._stop(r, grace), wave))
            if base is not None:
                self._save(base, [])
            return outcome

    def rolling_restart(self, *, grace: float = ROLLING_RESTART_GRACE_S,
                        sync_timeout: float = SYNC_TIMEOUT_S) -> list[RestartedBroker]:
        """Restart each broker in turn, the controller's last, so that the cluster keeps
        serving throughout (Kafka's rolling restart).

        Before the first broker and after each one, every partition of every topic must
        be led and have all its replicas in the ISR (waited for up to ``sync_timeout``
        seconds, with progress): stopping a broker while another is still catching up
        could leave partitions below ``min.insync.replicas`` or without a leader. Each
        broker gets SIGTERM (its controlled shutdown moves its leaderships first; SIGKILL
        after ``grace`` seconds), is started again on the same data and port, and is
        waited for until it answers. At the end leaderships go back to the preferred
        replicas. Raises :class:`StackError` (saying what to do) when a broker is not
        running, does not come back, or the partitions do not get back in sync.
        """
        from strata.client import Admin
        from wire.errors import StrataError

        with self._locked():
            base, records = self._load()
            brokers = [r for r in records if r.name.startswith("broker-")]
            if base is None or not brokers:
                raise StackError(f"no brokers recorded in {self.data_dir}; start the stack "
                                 "with `strata up` first")
            for record in brokers:
                if not record.alive():
                    raise StackError(
                        f"{record.name} is not running; `strata up --data-dir "
                        f"{self.data_dir}` starts it, then run the rolling restart")
            security = self.security.client() if self.security.enabled else None
            bootstrap = ",".join(r.endpoint for r in brokers)
            done: list[RestartedBroker] = []
            with Admin(bootstrap, security=security or PLAINTEXT) as admin:
                controller = admin.describe_cluster().controller_id
                brokers.sort(key=lambda r: _broker_id(r.name) == controller)
                self._wait_in_sync(admin, sync_timeout, "before the first restart")
                for old in brokers:
                    started = time.monotonic()
                    self._say(f"{old.name}: stopping (pid {old.pid})")
                    self._stop(old, grace)
                    stopped = time.monotonic()
                    self._say(f"{old.name}: stopped in {stopped - started:.1f} s; starting it")
                    new = self._restart_broker(old, base, records)
                    records = [new if r.name == old.name else r for r in records]
                    self._save(base, records)
                    answered = time.monotonic()
                    self._wait_in_sync(admin, sync_timeout, f"after restarting {old.name}")
                    done.append(RestartedBroker(old.name, old.pid, new.pid,
                                                stopped - started, answered - stopped,
                                                time.monotonic() - started))
                try:
                    results = admin.elect_preferred_leaders()
                except StrataError as err:  # every broker is back: report, do not fail
                    self._say(f"preferred-leader election failed ({err}); run `strata "
                              "cluster elect-preferred-leaders` to spread leadership again")
                else:
                    preferred = sum(1 for r in results.values() if r.message is None)
                    self._say(f"preferred leaders elected: {preferred} of {len(results)} "
                              "partition(s) led by their preferred replica")
            return done

    def _restart_broker(self, old: ProcessRecord, base: int,
                        records: Sequence[ProcessRecord]) -> ProcessRecord:
        specs = {s.name: s for s in self.services}
        spec = specs.get(old.name)
        if spec is None:
            raise StackError(f"{old.name} is recorded but not part of this stack's layout "
                             f"in {self.data_dir}; run `strata up` to repair it")
        endpoints: dict[str, str] = {}
        for record in records:
            if record.name != old.name and record.endpoint_key == "zookeeper":
                _add_endpoint(endpoints, record)
        new = self._start(spec, base, endpoints)
        try:
            _wait_brokers(self._context(base, endpoints), [new])
        except BaseException:
            with contextlib.suppress(TimeoutError):
                kill_pid(new.pid, 5.0, expect=new.marker)
            raise
        return new

    def _wait_in_sync(self, admin: Any, timeout: float, when: str) -> None:
        """Every partition led and all its replicas in the ISR, or StackError."""
        started = time.monotonic()
        reported = started
        while True:
            lagging: list[str] = []
            try:
                topics = admin.describe_topics()
            except Exception as exc:  # a broker in the middle of a restart: ask again
                lagging = [f"(metadata unavailable: {exc})"]
            else:
                for topic in topics.values():
                    for part in topic.partitions:
                        if part.leader < 0 or not set(part.replicas) <= set(part.isr):
                            lagging.append(f"{topic.name}-{part.partition}")
            now = time.monotonic()
            if not lagging:
                self._say(f"every partition in sync {when} ({now - started:.1f} s)")
                return
            if now - started > timeout:
                raise StackError(
                    f"{len(lagging)} partition(s) are not fully in sync {when} after "
                    f"{timeout:.0f} s (e.g. {', '.join(lagging[:5])}); the rolling restart "
                    "stopped here so that no partition loses its last in-sync replica. Look "
                    "at `strata topic describe` and the brokers' logs, then run it again "
                    "(`--sync-timeout S` waits longer)")
            if now - reported >= 5:
                reported = now
                self._say(f"  waiting for {len(lagging)} partition(s) to be in sync {when} "
                          f"({now - started:.0f} s)")
            time.sleep(0.5)

    def _stop_waves(self, records: Sequence[ProcessRecord]) -> list[list[ProcessRecord]]:
        """Recorded processes last started first, consecutive members of one group (the
        brokers, an ensemble) together."""
        specs = ({s.name: s for s in self._fixed_services} if self._fixed_services is not None
                 else _all_known_services())
        waves: list[list[ProcessRecord]] = []
        last_group: str | None = None
        for record in reversed(records):
            spec = specs.get(record.name)
            group = spec.group if spec is not None else None
            if waves and group is not None and group == last_group:
                waves[-1].append(record)
            else:
                waves.append([record])
            last_group = group
        return waves

    def _stop(self, record: ProcessRecord, grace: float) -> tuple[ProcessRecord, str]:
        if record.alive():
            try:
                kill_pid(record.pid, grace, expect=record.marker)
            except TimeoutError:
                raise StackError(
                    f"{record.name} (pid {record.pid}) survived SIGKILL; it is probably "
                    "stuck in the kernel (e.g. on a hung disk). Check `ps -o stat "
                    f"{record.pid}` and run `strata down` again later."
                ) from None
            what = "stopped"
        elif pid_alive(record.pid):
            what = "pid reused"
        else:
            what = "not running"
        if record.pid_file and not record.alive():
            Path(record.pid_file).unlink(missing_ok=True)
        return record, what


def _groups(services: Sequence[ServiceSpec]) -> list[list[ServiceSpec]]:
    """Services in start order, consecutive members of one group together."""
    out: list[list[ServiceSpec]] = []
    for spec in services:
        if out and spec.group is not None and out[-1][0].group == spec.group:
            out[-1].append(spec)
        else:
            out.append([spec])
    return out


def _add_endpoint(endpoints: dict[str, str], record: ProcessRecord) -> None:
    endpoints[record.endpoint_key] = ",".join(
        filter(None, [endpoints.get(record.endpoint_key), record.endpoint])
    )
