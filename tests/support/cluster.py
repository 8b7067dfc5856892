"""A real Strata cluster for fault tests: ZooKeeper (one server or a 3-node ensemble) and
N broker processes, each on free ports in private temp dirs.

Why a class of its own: the fault ("nemesis") tests of issue [4/7] kill, pause and restart
brokers and ZooKeeper nodes while producers write, and must then know who leads what.
Everything here reads the truth from ZooKeeper (the znode layout of
``brokers/coordination.py``), not from a broker's possibly stale metadata cache:

    /strata/brokers/ids/<id>                          ephemeral: the broker is alive
    /strata/brokers/topics/<t>                        {"partitions": {"<p>": [replicas]}}
    /strata/brokers/topics/<t>/partitions/<p>/state   {leader, leader_epoch, isr, ...}
    /strata/controller                                {"broker_id", "epoch"} (ephemeral)

Process hygiene (the rules of tests/conftest.py): every process is one this object
started; brokers are signalled through their ``Popen`` handle (our own un-reaped child,
so its PID cannot have been recycled) and ZooKeeper JVMs through ``ZooKeeperServer``,
which checks the command-line marker. ``close()`` (also ``__exit__``) SIGKILLs whatever is
still running, resuming nothing and sparing nothing, even when the test failed. Every wait
has a timeout and fails naming what it waited for and what it saw last.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from procs import free_port
from strata.client import Admin, NewTopic, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.netns import Network, NetworkNode
from tests.support.waiting import wait_for
from wire.security import PLAINTEXT, ClientSecurity
from zookeeper.launcher import EnsembleMember, ZooKeeperEnsemble, ZooKeeperServer, server_mode

__all__ = ["DEFAULT_BROKER_OVERRIDES", "Cluster", "ClusterBroker", "ClusterSecurity",
           "PartitionStateView"]

ROOT = "/strata"

#: Overrides every broker of a ``Cluster`` gets unless the caller passes its own value.
#: A short session makes a dead or paused broker lose its registration (and so its
#: leaderships) within seconds; a short lag time makes the ISR shrink and grow quickly.
DEFAULT_BROKER_OVERRIDES: Mapping[str, str] = {
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "3000",
}

#: Ports inside a network namespace (``network=True``): each node has its own address.
_ZK_CLIENT_PORT = 2181
_BROKER_PORT = 9092

#: Lines of broker output kept per broker (BrokerProcess keeps 400; a fault test wants
#: the whole story of a broker that was killed and restarted several times).
_LOG_LINES = 20_000


def _known_broker_keys() -> set[str] | None:
    """Broker config keys the checked-out broker code accepts (None if it cannot be told).

    A default override the broker does not know yet (``replica.lag.time.max.ms`` before
    replication lands) would stop every broker at start-up, so defaults are filtered;
    keys the caller passes explicitly are always sent.
    """
    try:
        from brokers.config import BROKER_KEYS
        from brokers.log.config import TOPIC_CONFIG_KEYS
    except ImportError:
        return None
    return set(BROKER_KEYS) | {f"log.{k}" for k in TOPIC_CONFIG_KEYS}


class ClusterBroker(BrokerProcess):
    """A ``BrokerProcess`` that keeps more output and knows whether it is paused."""

    def __init__(self, zookeeper: str, data_dir: Path, broker_id: int,
                 overrides: dict[str, str], listeners: tuple[str, ...] = (), *,
                 host: str = "127.0.0.1", port: int | None = None,
                 command_prefix: tuple[str, ...] = ()) -> None:
        super().__init__(zookeeper, data_dir, broker_id, overrides=overrides,
                         listeners=listeners, host=host, port=port,
                         command_prefix=command_prefix)
        self.output = deque(maxlen=_LOG_LINES)
        self.paused = False
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 60.0) -> ClusterBroker:
        self.output.append(f"--- harness: start #{self.starts + 1} of broker "
                           f"{self.broker_id} at {time.strftime('%H:%M:%S')}\n")
        super().start(timeout)
        self.starts += 1
        self.paused = False
        return self

    def signal(self, signum: int) -> None:
        """Send ``signum`` to our own live child (never to a PID we did not start)."""
        if not self.running:
            raise RuntimeError(f"broker {self.broker_id} is not running")
        assert self.process is not None
        self.process.send_signal(signum)

    def note(self, text: str) -> None:
        self.output.append(f"--- harness {time.strftime('%H:%M:%S')}: {text}\n")


class ClusterSecurity:
    """What makes a ``Cluster(secure=True)`` fully secured, as ``strata up --secure`` does:

    - one SASL_SSL listener per broker, also the inter-broker one (brokers log in to each
      other as ``broker``), with certificates from a CA made for the cluster;
    - SCRAM users ``admin`` and ``broker`` (super users) and ``app``, who may only
      write and read topics named ``faults-*`` (PREFIXED ACLs), write idempotently, and
      run transactions with transactional ids named ``faults-*``;
      ``authorizer.enable`` with ``allow.everyone.if.no.acl.found`` left false;
    - znodes owned by a digest identity (``zookeeper.set.acl``).

    Users and ACLs are written to ZooKeeper before the first broker starts (as Kafka's
    bootstrap credentials are), so every broker, restarted or not, knows them from its
    first request on.
    """

    USERS: ClassVar = {"admin": "admin-secret", "broker": "broker-secret", "app": "app-secret"}
    DIGEST = ("strata-zk", "zk-secret")
    TOPIC_PREFIX = "faults-"

    def __init__(self, directory: Path) -> None:
        from strata_tools.certs import CertificateAuthority

        self.ca = CertificateAuthority.create(directory / "ca")
        self.broker_certificate = self.ca.issue(directory / "certs", "broker")

    def broker_overrides(self) -> dict[str, str]:
        return {
            "ssl.certfile": str(self.broker_certificate.certfile),
            "ssl.keyfile": str(self.broker_certificate.keyfile),
            "ssl.cafile": str(self.ca.certfile),
            "inter.broker.sasl.username": "broker",
            "inter.broker.sasl.password": self.USERS["broker"],
            "authorizer.enable": "true",
            "super.users": "User:admin;User:broker",
            "zookeeper.set.acl": "true",
            "zookeeper.digest.username": self.DIGEST[0],
            "zookeeper.digest.password": self.DIGEST[1],
        }

    def client_security(self, user: str) -> ClientSecurity:
        """How a client logs in as ``user``."""
        return ClientSecurity("SASL_SSL", "SCRAM-SHA-512", user, self.USERS[user],
                              ssl_cafile=str(self.ca.certfile))

    def bootstrap_zookeeper(self, connect: str) -> None:
        """Users and the ``app`` ACLs, straight into ZooKeeper under the digest identity."""
        from brokers.acl import CLUSTER_NAME
        from brokers.coordination import ZooKeeperClient
        from wire.protocol import AclEntry
        from wire.sasl import scram_credential

        coordinator = ZooKeeperClient(connect, digest=self.DIGEST)
        coordinator.start()
        try:
            for user, password in self.USERS.items():
                for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                    coordinator.put_scram_credential(user, scram_credential(mechanism, password))
            coordinator.add_acls([
                *(AclEntry("TOPIC", "PREFIXED", self.TOPIC_PREFIX, "User:app", "*",
                           operation, "ALLOW") for operation in ("WRITE", "READ")),
                AclEntry("CLUSTER", "LITERAL", CLUSTER_NAME, "User:app", "*",
                         "IDEMPOTENT_WRITE", "ALLOW"),
                AclEntry("TRANSACTIONAL_ID", "PREFIXED", self.TOPIC_PREFIX, "User:app", "*",
                         "WRITE", "ALLOW")])
        finally:
            coordinator.stop()


@dataclass(frozen=True, slots=True)
class PartitionStateView:
    """One partition's state znode, as the harness reads it."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int


class Cluster:
    """ZooKeeper plus ``brokers`` broker processes (ids 0..n-1); see the module docstring.

    ``zookeeper_nodes`` is 1 (a standalone ``ZooKeeperServer``) or 3 (a
    ``ZooKeeperEnsemble``). ``overrides`` are added to ``DEFAULT_BROKER_OVERRIDES`` for
    every broker. Use as a context manager: ``with Cluster(tmp_path) as cluster: ...``.
    ``expect_controller=False`` is for brokers that elect no controller (before [4/7]).
    ``secure=True`` secures everything (``ClusterSecurity``); the harness's own clients
    then log in as ``admin`` (``admin_options``), a workload as ``app``
    (``client_options``). ``network=True`` puts every broker and ZooKeeper node in a
    network namespace of its own (tests/support/netns.py: ``self.network``), each on its
    own address with the usual ports, reached from here through a bridge; brokers
    advertise their namespace's address.
    """

    def __init__(self, base_dir: Path, brokers: int = 3, *, zookeeper_nodes: int = 1,
                 overrides: Mapping[str, str] | None = None,
                 start_timeout: float = 60.0, expect_controller: bool = True,
                 secure: bool = False, network: bool = False, kafka: bool = False,
                 kafka_sasl: bool = False) -> None:
        if zookeeper_nodes not in (1, 3):
            raise ValueError("zookeeper_nodes must be 1 or 3")
        self.base_dir = base_dir
        self.broker_count = brokers
        #: Whether start-up and health checks require ``/strata/controller`` (brokers
        #: before issue [4/7] elect no controller).
        self.expect_controller = expect_controller
        self.start_timeout = start_timeout
        known = _known_broker_keys()
        merged = {k: v for k, v in DEFAULT_BROKER_OVERRIDES.items()
                  if known is None or k in known}
        #: Default overrides left out because this broker version does not know them.
        self.dropped_overrides = sorted(set(DEFAULT_BROKER_OVERRIDES) - set(merged))
        # Group offsets replicated like a production cluster's (up to 3 copies).
        merged["offsets.topic.replication.factor"] = str(min(brokers, 3))
        self.security = ClusterSecurity(base_dir / "pki") if secure else None
        if self.security is not None:
            merged.update(self.security.broker_overrides())
        merged.update(overrides or {})
        self.overrides = merged
        self.zk_server: ZooKeeperServer | None = None
        self.zk_ensemble: ZooKeeperEnsemble | None = None
        self.network = Network() if network else None
        #: Each broker's Kafka listener port (``kafka=True``), by broker id.
        #: With ``kafka_sasl=True`` (and ``kafka=True``, not ``secure``), a second Kafka
        #: listener per broker, KAFKA_SASL_PLAINTEXT (SCRAM and PLAIN logins, no TLS),
        #: beside the plaintext one. Both sets from one draw, so no port is in both.
        ports = _distinct_free_ports(brokers * (2 if kafka_sasl else 1)) if kafka else []
        self.kafka_ports = ports[:brokers]
        self.kafka_sasl_ports = ports[brokers:]
        self.brokers: dict[int, ClusterBroker] = {}
        try:
            self._make_nodes(base_dir, brokers, zookeeper_nodes, start_timeout, secure)
        except BaseException:
            if self.network is not None:
                self.network.close()
            raise
        self._zk: KazooClient | None = None
        self._retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, deadline=20)
        self.events: list[str] = []
        self._t0 = time.monotonic()

    def _make_nodes(self, base_dir: Path, brokers: int, zookeeper_nodes: int,
                    start_timeout: float, secure: bool) -> None:
        zk_hosts: list[NetworkNode | None] = [None] * zookeeper_nodes
        broker_hosts: list[NetworkNode | None] = [None] * brokers
        if self.network is not None:
            zk_hosts = [self.network.add(f"z{k}") for k in range(zookeeper_nodes)]
            broker_hosts = [self.network.add(f"b{b}") for b in range(brokers)]
        if zookeeper_nodes == 1:
            node = zk_hosts[0]
            self.zk_server = ZooKeeperServer(
                base_dir / "zookeeper", free_port() if node is None else _ZK_CLIENT_PORT,
                host="127.0.0.1" if node is None else node.address,
                command_prefix=() if node is None else Network.prefix(node),
                start_timeout=start_timeout)
        else:
            if self.network is None:
                ports = _distinct_free_ports(9)
                members = [EnsembleMember(k + 1, "127.0.0.1", ports[k], ports[3 + k],
                                          ports[6 + k]) for k in range(3)]
                prefixes: list[tuple[str, ...]] = [()] * 3
            else:
                members = [EnsembleMember(k + 1, node.address, _ZK_CLIENT_PORT, 2888, 3888)
                           for k, node in enumerate(n for n in zk_hosts if n is not None)]
                prefixes = [Network.prefix(n) for n in zk_hosts if n is not None]
            self.zk_ensemble = ZooKeeperEnsemble(
                [base_dir / f"zookeeper{k + 1}" for k in range(3)], members,
                heap="128m", start_timeout=start_timeout, command_prefixes=prefixes)
        listeners = ("SASL_SSL",) if secure else ()
        for b in range(brokers):
            node = broker_hosts[b]
            where: dict[str, Any] = {} if node is None else {
                "host": node.address, "port": _BROKER_PORT,
                "command_prefix": Network.prefix(node)}
            overrides = dict(self.overrides)
            if self.kafka_ports:
                name = "KAFKA_SASL_SSL" if secure else "KAFKA"
                overrides["kafka.listeners"] = f"{name}://127.0.0.1:{self.kafka_ports[b]}"
                if self.kafka_sasl_ports:
                    overrides["kafka.listeners"] += (
                        f",KAFKA_SASL_PLAINTEXT://127.0.0.1:{self.kafka_sasl_ports[b]}")
            self.brokers[b] = ClusterBroker(self.zk_connect, base_dir / f"broker{b}", b,
                                            overrides, listeners, **where)

    def node_of_broker(self, broker_id: int) -> NetworkNode:
        """The network namespace of a broker (``network=True`` only)."""
        assert self.network is not None, "this cluster has no network of its own"
        return self.network.nodes[f"b{broker_id}"]

    def node_of_zookeeper(self, index: int) -> NetworkNode:
        assert self.network is not None, "this cluster has no network of its own"
        return self.network.nodes[f"z{index}"]

    # ------------------------------------------------------------------ addresses
    @property
    def zk_connect(self) -> str:
        if self.zk_server is not None:
            return self.zk_server.connect_string
        assert self.zk_ensemble is not None
        return self.zk_ensemble.connect_string

    @property
    def zk_nodes(self) -> tuple[ZooKeeperServer, ...]:
        if self.zk_server is not None:
            return (self.zk_server,)
        assert self.zk_ensemble is not None
        return self.zk_ensemble.nodes

    @property
    def bootstrap(self) -> str:
        """Every broker's address: clients find a live one whichever are down."""
        return ",".join(b.bootstrap for b in self.brokers.values())

    @property
    def kafka_sasl_bootstrap(self) -> str:
        """host:port,... of the brokers' KAFKA_SASL_PLAINTEXT listeners (``kafka_sasl``)."""
        assert self.kafka_sasl_ports, "this cluster has no SASL Kafka listeners (kafka_sasl)"
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_sasl_ports)

    @property
    def kafka_bootstrap(self) -> str:
        """host:port,... of the brokers' Kafka listeners (``kafka=True``)."""
        assert self.kafka_ports, "this cluster has no Kafka listeners (kafka=True)"
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports)

    def client_security(self, user: str = "app") -> ClientSecurity:
        """How a client logs in as ``user`` (PLAINTEXT when the cluster is not secure)."""
        return PLAINTEXT if self.security is None else self.security.client_security(user)

    def client_options(self, user: str = "app") -> dict[str, Any]:
        """Keyword options of ``Producer``/``Consumer``/``Admin`` logging in as ``user``."""
        return {} if self.security is None else {"security": self.client_security(user)}

    @property
    def admin_options(self) -> dict[str, Any]:
        return self.client_options("admin")

    @property
    def zk(self) -> KazooClient:
        if self._zk is None:
            raise RuntimeError("the cluster is not started")
        return self._zk

    def log(self, text: str) -> None:
        """Record a harness event (printed by tests, kept in ``events``)."""
        line = f"[{time.monotonic() - self._t0:6.1f}s] {text}"
        self.events.append(line)
        print(line, flush=True)

    def _zookeeper_state(self) -> str:
        """Whether the cluster's ZooKeeper servers still run, and their logs' last lines
        (why a client could not connect: a server that died says so there)."""
        servers = ([self.zk_server] if self.zk_server is not None
                   else list(self.zk_ensemble.nodes) if self.zk_ensemble is not None else [])
        return "; ".join(
            f"{server.connect_string} {'running' if server.is_running() else 'exited'} "
            f"({server.describe_pid()}), log {server.log_path} ends:\n{server.log_tail()}"
            for server in servers)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        try:
            if self.zk_server is not None:
                self.zk_server.start()
            else:
                assert self.zk_ensemble is not None
                self.zk_ensemble.start()
            self._zk = KazooClient(hosts=self.zk_connect, timeout=10.0,
                                   connection_retry={"max_tries": -1, "delay": 0.1,
                                                     "max_delay": 1.0})
            try:
                self._zk.start(timeout=15)
            except KazooTimeoutError as exc:
                raise RuntimeError(f"cannot reach ZooKeeper at {self.zk_connect}: "
                                   f"{self._zookeeper_state()}") from exc
            if self.security is not None:
                self.security.bootstrap_zookeeper(self.zk_connect)
            for broker in self.brokers.values():
                broker.start(self.start_timeout)
            self.wait_for("every broker registered", lambda: self.live_brokers(),
                          lambda live: live == set(self.brokers), 30)
            if self.expect_controller:
                self.wait_for("a controller", self.controller_id, lambda c: c is not None, 30)
        except BaseException:
            self.close()
            raise
        if self.dropped_overrides:
            self.log(f"broker config keys not known to this broker version, left out: "
                     f"{', '.join(self.dropped_overrides)}")
        self.log(f"cluster up: zookeeper {self.zk_connect}, brokers {self.bootstrap}")
        return self

    def close(self) -> None:
        """Kill every process this cluster started (SIGKILL by PID), then close kazoo.

        Safe to call more than once and after a failed ``start``.
        """
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                broker.kill()
        if self._zk is not None:
            with contextlib.suppress(Exception):
                self._zk.stop()
            with contextlib.suppress(Exception):
                self._zk.close()
            self._zk = None
        if self.zk_ensemble is not None:
            self.zk_ensemble.stop(grace=2.0)
        if self.zk_server is not None:
            self.zk_server.stop(grace=2.0)
        if self.network is not None:  # its namespaces are empty now
            self.network.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def pids(self) -> list[int]:
        """PIDs of every process of this cluster that is running now."""
        out = [b.pid for b in self.brokers.values() if b.running]
        out += [pid for node in self.zk_nodes if (pid := node.pid) is not None]
        return out

    # ------------------------------------------------------------------ brokers
    def kill(self, broker_id: int) -> None:
        """SIGKILL a broker (a crash); a paused broker dies too."""
        broker = self.brokers[broker_id]
        broker.note("SIGKILL")
        self.log(f"SIGKILL broker {broker_id}")
        broker.kill()
        broker.paused = False

    def pause(self, broker_id: int) -> None:
        """SIGSTOP: the process freezes, its sockets stay open, its session ages."""
        broker = self.brokers[broker_id]
        broker.note("SIGSTOP")
        self.log(f"SIGSTOP broker {broker_id}")
        broker.signal(signal.SIGSTOP)
        broker.paused = True

    def resume(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        self.log(f"SIGCONT broker {broker_id}")
        broker.signal(signal.SIGCONT)
        broker.paused = False
        broker.note("SIGCONT")

    def stop(self, broker_id: int, timeout: float = 30.0) -> int:
        """SIGTERM (clean shutdown) and wait; returns the exit code."""
        broker = self.brokers[broker_id]
        if broker.paused:
            self.resume(broker_id)
        broker.note("SIGTERM")
        self.log(f"SIGTERM broker {broker_id}")
        return broker.stop(timeout)

    def restart(self, broker_id: int) -> None:
        """Start a stopped or killed broker again on the same data dir and port.

        Waits until its registration is in ZooKeeper (a restart right after a SIGKILL may
        wait for the dead session's ephemeral node to expire first).
        """
        broker = self.brokers[broker_id]
        if broker.running:
            raise RuntimeError(f"broker {broker_id} is still running; kill or stop it first")
        self.log(f"restart broker {broker_id}")
        broker.start(self.start_timeout)
        self.wait_for(f"broker {broker_id} registered", self.live_brokers,
                      lambda live: broker_id in live, 30)

    def stop_all(self, timeout: float = 30.0) -> dict[int, int]:
        """SIGTERM every running broker (paused ones are resumed first); exit codes."""
        codes: dict[int, int] = {}
        for broker_id, broker in self.brokers.items():
            if broker.running:
                codes[broker_id] = self.stop(broker_id, timeout)
        return codes

    def broker_log(self, broker_id: int, tail: int | None = None) -> str:
        lines = list(self.brokers[broker_id].output)
        return "".join(lines if tail is None else lines[-tail:])

    # ------------------------------------------------------------------ zookeeper nodes
    def zk_leader_index(self) -> int | None:
        """Index in ``zk_nodes`` of the ensemble member that leads now."""
        for index, node in enumerate(self.zk_nodes):
            if server_mode(node.host, node.client_port) in ("leader", "standalone"):
                return index
        return None

    def kill_zookeeper(self, index: int) -> None:
        """SIGKILL one ZooKeeper node (checked against its command-line marker)."""
        node = self.zk_nodes[index]
        pid = node.pid
        if pid is None:
            raise RuntimeError(f"ZooKeeper node {index} is not running")
        self.log(f"SIGKILL ZooKeeper node {index} ({node.connect_string}, pid {pid})")
        os.kill(pid, signal.SIGKILL)
        node.stop(grace=1.0)  # reaps our child and forgets the pid file

    def restart_zookeeper(self, index: int, timeout: float = 60.0) -> None:
        node = self.zk_nodes[index]
        self.log(f"restart ZooKeeper node {index}")
        node.start(wait=False)
        if self.zk_ensemble is not None:
            self.zk_ensemble.wait_until_healthy(timeout)
        else:
            node.wait_until_serving(timeout)

    def wait_for_zookeeper_quorum(self, timeout: float = 30.0) -> None:
        if self.zk_ensemble is not None:
            self.zk_ensemble.wait_for_leader(timeout)
        else:
            assert self.zk_server is not None
            self.zk_server.wait_until_serving(timeout)

    # ------------------------------------------------------------------ zookeeper reads
    def _get_json(self, path: str) -> dict[str, Any] | None:
        try:
            data, _ = self._retry(self.zk.get, path)
        except NoNodeError:
            return None
        value = json.loads(data.decode())
        assert isinstance(value, dict)
        return value

    def live_brokers(self) -> set[int]:
        """Ids with a registration (``/strata/brokers/ids/<id>``) right now."""
        try:
            return {int(c) for c in self._retry(self.zk.get_children, f"{ROOT}/brokers/ids")}
        except NoNodeError:
            return set()

    def controller(self) -> tuple[int, int] | None:
        """``(broker id, epoch)`` from ``/strata/controller``, or None if nobody holds it."""
        value = self._get_json(f"{ROOT}/controller")
        return None if value is None else (int(value["broker_id"]), int(value["epoch"]))

    def controller_id(self) -> int | None:
        held = self.controller()
        return None if held is None else held[0]

    def replicas(self, topic: str) -> dict[int, list[int]]:
        """Partition -> replica broker ids (the first is the preferred leader)."""
        value = self._get_json(f"{ROOT}/brokers/topics/{topic}")
        if value is None:
            raise KeyError(f"topic {topic!r} is not in ZooKeeper")
        return {int(p): [int(b) for b in r] for p, r in value["partitions"].items()}

    def partition_state(self, topic: str, partition: int) -> PartitionStateView:
        path = f"{ROOT}/brokers/topics/{topic}/partitions/{partition}/state"
        data, stat = self._retry(self.zk.get, path)
        value = json.loads(data.decode())
        return PartitionStateView(int(value["leader"]), int(value["leader_epoch"]),
                                  tuple(int(b) for b in value["isr"]),
                                  int(value.get("controller_epoch", 0)), stat.version)

    def leader_of(self, topic: str, partition: int) -> int:
        return self.partition_state(topic, partition).leader

    def isr_of(self, topic: str, partition: int) -> tuple[int, ...]:
        return self.partition_state(topic, partition).isr

    def leaders(self, topic: str) -> dict[int, int]:
        return {p: self.leader_of(topic, p) for p in sorted(self.replicas(topic))}

    def describe(self, topic: str) -> str:
        """One line per partition (leader, epoch, ISR) plus live brokers and controller."""
        parts = []
        for p in sorted(self.replicas(topic)):
            s = self.partition_state(topic, p)
            parts.append(f"p{p}: leader {s.leader} epoch {s.leader_epoch} isr {list(s.isr)}")
        return (f"live {sorted(self.live_brokers())}, controller {self.controller()}; "
                + "; ".join(parts))

    # ------------------------------------------------------------------ topics
    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     configs: Mapping[str, str] | None = None) -> None:
        with Admin(self.bootstrap, **self.admin_options) as admin:
            admin.create_topics([NewTopic(name, partitions, replication_factor,
                                          dict(configs or {}))])
        self.log(f"created topic {name}: {partitions} partitions, RF {replication_factor}, "
                 f"configs {dict(configs or {})}")

    def _health_problems(self, topic: str) -> list[str]:
        problems: list[str] = []
        live = self.live_brokers()
        down = set(self.brokers) - live
        if down:
            problems.append(f"brokers {sorted(down)} not registered")
        if self.expect_controller and self.controller_id() is None:
            problems.append("no controller")
        for p, replicas in sorted(self.replicas(topic).items()):
            state = self.partition_state(topic, p)
            if state.leader not in live:
                problems.append(f"p{p} leader {state.leader} is not live")
            if sorted(state.isr) != sorted(replicas):
                problems.append(f"p{p} isr {list(state.isr)} != replicas {replicas}")
        return problems

    def _serving_problems(self, topic: str) -> list[str]:
        """What the brokers themselves say: every leader answers with a high watermark
        and agrees with ZooKeeper, and (no writes assumed) no replica lags the leader."""
        replicas = self.replicas(topic)
        try:
            with Admin(self.bootstrap, request_timeout_ms=5000,
                       **self.admin_options) as admin:
                described = admin.describe_topics([topic])[topic]
        except Exception as err:  # any broker error means "not yet"
            return [f"describe_topics failed: {err!r}"]
        problems = []
        for p in described.partitions:
            zk_leader = self.leader_of(topic, p.partition)
            if p.leader != zk_leader:
                problems.append(f"p{p.partition}: metadata says leader {p.leader}, "
                                f"ZooKeeper {zk_leader}")
            if p.high_watermark < 0:
                problems.append(f"p{p.partition}: leader {p.leader} gave no high watermark")
            if sorted(p.isr) != sorted(replicas[p.partition]):
                problems.append(f"p{p.partition}: metadata isr {list(p.isr)}")
        return problems

    def wait_until_healthy(self, topic: str, timeout: float = 45.0,
                           serving: bool = True) -> None:
        """Every broker registered, a controller, every partition led by a live broker with
        the full replica set in its ISR; with ``serving`` the leaders also answer."""
        def probe() -> list[str]:
            try:
                problems = self._health_problems(topic)
            except (KazooException, KeyError) as err:
                return [f"ZooKeeper read failed: {err!r}"]
            if not problems and serving:
                problems = self._serving_problems(topic)
            return problems

        started = time.monotonic()
        self.wait_for(f"topic {topic} healthy", probe, lambda problems: not problems, timeout)
        self.log(f"healthy after {time.monotonic() - started:.1f}s: {self.describe(topic)}")

    def high_watermarks(self, topic: str, timeout: float = 30.0) -> dict[int, int]:
        """The high watermark of every partition once it has settled: the leader's log end
        equals its high watermark (every ISR member has everything) and two reads a second
        apart agree. Call with the producers stopped."""
        partitions = sorted(self.replicas(topic))

        def probe() -> dict[int, tuple[int, int]] | str:
            try:
                with Admin(self.bootstrap, request_timeout_ms=5000,
                           **self.admin_options) as admin:
                    described = admin.describe_topics([topic])[topic]
            except Exception as err:
                return repr(err)
            return {p.partition: (p.high_watermark, p.log_end_offset)
                    for p in described.partitions}

        def settled(value: dict[int, tuple[int, int]] | str) -> bool:
            return isinstance(value, dict) and sorted(value) == partitions and all(
                hw >= 0 and hw == leo for hw, leo in value.values())

        previous: dict[int, tuple[int, int]] | None = None
        deadline = time.monotonic() + timeout
        while True:
            value = self.wait_for(f"high watermarks of {topic} settled", probe, settled,
                                  max(1.0, deadline - time.monotonic()))
            assert isinstance(value, dict)
            if value == previous:
                return {p: hw for p, (hw, _) in value.items()}
            previous = value
            if time.monotonic() > deadline:
                raise AssertionError(f"high watermarks of {topic} kept moving: {value}")
            time.sleep(1.0)

    def topic_partitions(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in sorted(self.replicas(topic))]

    def partition_dir(self, broker_id: int, topic: str, partition: int) -> Path:
        return self.brokers[broker_id].data_dir / f"{topic}-{partition}"

    # ------------------------------------------------------------------ waiting
    def wait_for(self, what: str, probe: Callable[[], Any], done: Callable[[Any], bool],
                 timeout: float) -> Any:
        """Poll ``probe`` every 0.2 s until ``done``; fail naming ``what`` and the last value
        (with the current cluster picture when it can be read)."""
        return wait_for(what, probe, done, timeout, interval=0.2)

    def wait_for_new_leader(self, topic: str, partition: int, old: int,
                            timeout: float = 30.0) -> PartitionStateView:
        """Until ZooKeeper names a live leader other than ``old``."""
        def probe() -> PartitionStateView | str:
            try:
                state = self.partition_state(topic, partition)
                return state if state.leader in self.live_brokers() else \
                    f"{state} (leader not live)"
            except KazooException as err:
                return repr(err)

        state = self.wait_for(f"{topic}-{partition}: a live leader other than {old}", probe,
                              lambda s: isinstance(s, PartitionStateView) and s.leader != old,
                              timeout)
        assert isinstance(state, PartitionStateView)
        return state

    def wait_for_new_controller(self, old: int, timeout: float = 30.0) -> int:
        controller = self.wait_for(f"a controller other than {old}", self.controller_id,
                                   lambda c: c is not None and c != old, timeout)
        assert isinstance(controller, int)
        return controller


def _distinct_free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)
