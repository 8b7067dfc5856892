"""Shared fixtures: real ZooKeeper servers, kazoo clients, free ports, and a process reaper.

Rules every fixture here follows (and later fixtures should too): real components, free
ports from the kernel, a private temp dir, and the processes a test started are killed by
PID (checked against a command-line marker) in teardown even when the test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from procs import free_port, kill_pid
from tests.support.broker_process import BrokerProcess
from zookeeper.launcher import ZooKeeperServer

#: Seconds a test waits for a kazoo connection before failing.
KAZOO_CONNECT_TIMEOUT = 15.0

#: The modules that take a minute or more (Spark, Delta, whole stacks, fault schedules),
#: longest first. They run before the others: `make test` hands whole modules to two
#: workers (pytest-xdist, ``--dist loadfile``) in collection order, and a long module
#: started last would leave the other worker idle until it ends.
LONGEST_MODULES_FIRST = (
    "test_notebooks", "test_spark_cluster", "test_tiering", "test_faults", "test_cli_stack",
    "test_network_partitions",
    "test_spark_exactly_once", "test_spark_tier_replay", "test_perf_spark",
    "test_group_faults", "test_perf_scale", "test_spark_sink", "test_spark_source",
    "test_replication", "test_cli_cluster", "test_cli_client",
)


#: The test tiers, by module; every test module is in exactly one (tests/test_layers.py
#: checks that the names below are modules). ``unit``: pure logic, no ZooKeeper,
#: broker, Spark or HTTP process (``make unit``, under a minute). ``system``: faults and
#: nemeses, Spark and Delta end to end, whole stacks, the benchmarks' smoke runs
#: (``make system``). Everything else is ``integration``: real ZooKeeper, broker and
#: gateway processes over TCP (``make integration``). ``make test`` runs all three.
UNIT_MODULES = frozenset({
    "test_record_batch", "test_log_index", "test_log_segment", "test_log_corruption",
    "test_partition_log", "test_log_properties", "test_log_cleaner", "test_leader_epoch",
    "test_producer_state", "test_replication_rules", "test_group_assignors",
    "test_fault_checker", "test_group_checker", "test_broker_config", "test_heap",
    "test_layers", "test_docs", "test_handlers_unit", "test_group_index", "test_sasl",
    "test_acl", "test_quotas", "test_deploy_files", "test_schema_mapping",
    "test_schema_registry_state", "test_txn_checker", "test_transaction_state",
})
SYSTEM_MODULES = frozenset({
    "test_faults", "test_group_faults", "test_gateway_faults", "test_rolling_restart",
    "test_log_crash", "test_spark_delta", "test_spark_exactly_once", "test_spark_loopback",
    "test_spark_sink", "test_spark_source", "test_spark_tier_replay", "test_notebooks",
    "test_tiering", "test_cli_stack", "test_perf_failover", "test_perf_scale",
    "test_perf_spark", "test_load_smoke", "test_spark_security", "test_package",
    "test_network_partitions", "test_spark_cluster", "test_spark_typed",
})


def tier_of(module: str) -> str:
    return "unit" if module in UNIT_MODULES else \
        "system" if module in SYSTEM_MODULES else "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, then order (a stable sort): see
    ``LONGEST_MODULES_FIRST``."""
    for item in items:
        item.add_marker(tier_of(item.path.stem))
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
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One SparkSession per test module (``conf/spark-defaults.conf``, ``local[2]``),
    stopped when the module is done so the next module starts from a clean JVM state."""
    from strata.spark import spark_session

    session = spark_session(f"strata-{request.module.__name__.rsplit('.', 1)[-1]}")
    try:
        yield session
    finally:
        session.stop()
