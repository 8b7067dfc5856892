"""Shared fixtures: real ZooKeeper servers, kazoo clients, free ports, brokers, a process
reaper, and (from ``tests/support/fixtures.py``) the module's ``bootstrap`` and ``admin``.

Rules every fixture here follows (and later fixtures should too): real components, free
ports from the kernel, a private temp dir, and the processes a test started are killed by
PID (checked against a command-line marker) in teardown even when the test fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kazoo.client import KazooClient

from procs import free_port, kill_pid
from tests.support.broker_process import BrokerProcess
from tests.support.fixtures import admin, bootstrap, pipelines  # noqa: F401  (shared fixtures)
from zookeeper.launcher import ZooKeeperServer

#: The JVM options of every Spark driver the suite starts, in this process and in the
#: ``strata`` / notebook subprocesses that inherit the environment (spark-submit adds
#: ``SPARK_SUBMIT_OPTS`` to the driver's command line; an operator's own value wins).
#: A test's driver lives seconds and moves little data, so the C2 compiler's and the
#: parallel collector's threads are mostly start-up cost: with the client compiler only
#: and the serial collector a session start with a small job took 20-26 s instead of 38 s
#: on this 2-core machine under the suite's load (2026-11-29). Production sessions keep
#: the JVM's defaults; the benchmarks run outside the suite.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
#: The same for the other short-lived JVMs: ZooKeeper (``SERVER_JVMFLAGS``, read by
#: zookeeper/launcher.py as zkServer.sh does; a server started and queried 4,000 times
#: spent 2.2-2.6 CPU-s instead of 3.7-4.0, and the suite starts one or more per module)
#: and the small launcher JVM spark-class runs before each Spark JVM. On 2026-11-30 the
#: suite kept both cores busy from start to end, so CPU saved is time saved.
os.environ.setdefault("SERVER_JVMFLAGS", "-XX:TieredStopAtLevel=1")
os.environ.setdefault("SPARK_LAUNCHER_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

#: Seconds a test waits for a kazoo connection before failing.
KAZOO_CONNECT_TIMEOUT = 15.0

#: The modules that take half a minute or more (Spark, Delta, whole stacks, fault
#: schedules), longest first, as measured in a full run (2026-11-29). They run before the
#: others: `make test` hands whole modules to the workers (pytest-xdist, ``--dist
#: loadfile --no-loadscope-reorder``; without the latter xdist orders modules by their
#: number of tests, which put most of these last) in collection order, and a long module
#: started last would leave the other workers idle until it ends.
LONGEST_MODULES_FIRST = (
    "test_faults", "test_spark_cluster", "test_spark_exactly_once", "test_tiering",
    "test_tier_s3",
    "test_notebooks", "test_cli_stack", "test_txn_faults", "test_spark_txn",
    "test_replication", "test_group_faults", "test_franz_go", "test_cli_client",
    "test_network_partitions",
    "test_spark_source", "test_consumer_groups", "test_spark_typed", "test_transactions",
    "test_security", "test_kafka_clients", "test_spark_sink", "test_perf_spark",
    "test_package", "test_cli_cluster",
    "test_spark_tier_replay", "test_cli_transactions", "test_gateway",
    "test_stack_rolling_restart", "test_perf_scale", "test_warehouse_s3", "test_sink_protocol",
    "test_typed_topics", "test_gateway_schema", "test_spark_kafka", "test_kafka_security",
    "test_kafka_faults",
)


#: The test tiers. Every test module declares exactly one, with a module-level marker
#: (``pytestmark = pytest.mark.unit``, alone or in the list of its marks); a module that
#: declares none, or two, fails collection (``_TieredModule``), so a new module cannot
#: silently land in a tier. ``unit``: pure logic, no ZooKeeper, broker, Spark or HTTP
#: process (``make unit``, under a minute). ``integration``: real ZooKeeper, broker and
#: gateway processes over TCP (``make integration``). ``system``: faults and nemeses,
#: Spark and Delta end to end, whole stacks, the benchmarks' smoke runs (``make
#: system``). ``make test`` runs all three.
TIERS = ("unit", "integration", "system")


def tiers_of(module: ModuleType) -> list[str]:
    """The tier markers ``module`` declares at module level."""
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return [mark.name for mark in marks if getattr(mark, "name", None) in TIERS]


class _TieredModule(pytest.Module):
    """A test module that must declare its tier before its tests are collected."""

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        tiers = tiers_of(self.obj)
        if len(tiers) != 1:
            found = f"declares {' and '.join(tiers)}" if tiers else "declares none"
            raise self.CollectError(
                f"{self.path.name}: every test module declares exactly one tier, e.g. "
                f"`pytestmark = pytest.mark.integration` ({', '.join(TIERS)}; see "
                f"tests/conftest.py), and this one {found}")
        return super().collect()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module:
    return _TieredModule.from_parent(parent, path=module_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests (a stable sort): see ``LONGEST_MODULES_FIRST``."""
    rank = {name: i for i, name in enumerate(LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


class ProcessReaper:
    """Remembers (pid, cmdline marker) pairs and kills the survivors at teardown."""

    def __init__(self) -> None:
        self._tracked: list[tuple[int, str]] = []

    def track(self, pid: int, marker: str) -> None:
        self._tracked.append((pid, marker))

    def reap(self) -> None:
        for pid, marker in reversed(self._tracked):
            kill_pid(pid, grace=5.0, expect=marker)
        self._tracked.clear()


@pytest.fixture
def reaper() -> Iterator[ProcessReaper]:
    """Track PIDs a test starts (e.g. via a CLI subprocess); they die at teardown."""
    r = ProcessReaper()
    try:
        yield r
    finally:
        r.reap()


@pytest.fixture
def free_tcp_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A started standalone ZooKeeper shared by the tests of one module."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), free_port(), start_timeout=60)
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=5.0)


@pytest.fixture
def kazoo_factory() -> Iterator[Callable[[str], KazooClient]]:
    """Make connected kazoo clients for a ``host:port``; all are closed at teardown."""
    clients: list[KazooClient] = []

    def connect(hosts: str) -> KazooClient:
        client = KazooClient(hosts=hosts, timeout=10.0)
        clients.append(client)
        client.start(timeout=KAZOO_CONNECT_TIMEOUT)
        return client

    try:
        yield connect
    finally:
        for client in clients:
            try:
                client.stop()
            finally:
                client.close()


@pytest.fixture
def zk_client(
    zookeeper_server: ZooKeeperServer, kazoo_factory: Callable[[str], KazooClient]
) -> KazooClient:
    """A kazoo client connected to the module's ZooKeeper."""
    return kazoo_factory(zookeeper_server.connect_string)


@pytest.fixture
def broker_factory(
    zookeeper_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., BrokerProcess]]:
    """Start real broker processes against the module's ZooKeeper; all die at teardown."""
    started: list[BrokerProcess] = []

    def start(broker_id: int = 0, overrides: dict[str, str] | None = None,
              data_dir: Path | None = None) -> BrokerProcess:
        process = BrokerProcess(zookeeper_server.connect_string,
                                data_dir or tmp_path_factory.mktemp(f"broker{broker_id}"),
                                broker_id, overrides=overrides)
        started.append(process)
        return process.start()

    try:
        yield start
    finally:
        for process in started:
            process.kill()


@pytest.fixture(scope="module")
def broker(
    zookeeper_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker shared by a module's tests (each test should use its own topics)."""
    process = BrokerProcess(zookeeper_server.connect_string, tmp_path_factory.mktemp("broker"))
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module")
def strata_broker(
    zookeeper_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker per module whose retention runs every 200 ms, so a test that waits for a
    log start to move (data loss, tiering) polls for a bounded time."""
    process = BrokerProcess(zookeeper_server.connect_string, tmp_path_factory.mktemp("broker"),
                            overrides={"log.retention.check.interval.ms": "200"})
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SparkSession per test module (``conf/spark-defaults.conf``, ``local[2]``),
    stopped when the module is done so the next module starts from a clean JVM state.
    Its catalog lives in a temp dir: Spark's default ``./spark-warehouse`` would put the
    tier job's ``strata`` databases into the checkout."""
    from strata.spark import spark_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = spark_session(f"strata-{request.module.__name__.rsplit('.', 1)[-1]}",
                            {"spark.sql.warehouse.dir": str(warehouse)})
    try:
        yield session
    finally:
        session.stop()
