"""The ZooKeeper launcher against a real server (JVM from the pyspark jars) and kazoo."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, WatchedEvent

from strata.procs import PortInUseError, free_port, pid_alive
from zookeeper.launcher import (
    EnsembleMember,
    ZooKeeperError,
    ZooKeeperServer,
    ZooKeeperStartError,
    four_letter_word,
)

pytestmark = pytest.mark.timeout(120)


def test_ephemeral_znode_vanishes_with_its_session_and_stop_kills_the_pid(
    tmp_path: Path, kazoo_factory: Callable[[str], KazooClient]
) -> None:
    server = ZooKeeperServer(tmp_path / "zk", free_port())
    try:
        server.start()
        pid = server.pid
        assert pid is not None and pid_alive(pid)
        assert four_letter_word(server.host, server.client_port, "ruok") == "imok"
        assert "Mode: standalone" in four_letter_word(server.host, server.client_port, "srvr")

        owner = kazoo_factory(server.connect_string)
        observer = kazoo_factory(server.connect_string)
        owner.ensure_path("/strata-test")
        owner.create("/strata-test/eph", b"owner", ephemeral=True)

        deleted = threading.Event()

        def on_change(event: WatchedEvent) -> None:
            if event.type == EventType.DELETED:
                deleted.set()

        assert observer.exists("/strata-test/eph", watch=on_change) is not None
        data, stat = observer.get("/strata-test/eph")
        assert data == b"owner"
        assert stat.ephemeralOwner == owner.client_id[0]

        owner.stop()  # closes the session: the server deletes its ephemeral nodes at once
        owner.close()
        assert deleted.wait(timeout=15), "ephemeral znode still there after its session closed"
        assert observer.exists("/strata-test/eph") is None
        assert observer.exists("/strata-test") is not None  # persistent parent stays
    finally:
        server.stop(grace=5.0)
    assert not pid_alive(pid)
    assert not server.is_running()
    assert not server.pid_path.exists()


def test_running_server_is_found_through_its_directory(
    zookeeper_server: ZooKeeperServer, zk_client: KazooClient
) -> None:
    """What `strata up`/`down` rely on: a second object for the same dir sees the server."""
    zk_client.ensure_path("/strata-test/persistent")
    same_dir = ZooKeeperServer(zookeeper_server.directory, zookeeper_server.client_port)
    assert same_dir.is_running()
    assert same_dir.pid == zookeeper_server.pid
    assert same_dir.healthy()
    with pytest.raises(ZooKeeperError, match="already running"):
        same_dir.start()
    assert zookeeper_server.is_running()  # the failed start did not disturb it


def test_port_in_use_is_a_clear_error_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = ZooKeeperServer(tmp_path / "zk", port)
        with pytest.raises(PortInUseError) as info:
            server.start()
    message = str(info.value)
    assert f"port {port}" in message and "already in use" in message
    assert not server.is_running()
    assert not server.pid_path.exists()


def test_early_exit_reports_the_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_home = tmp_path / "not-a-zookeeper"
    empty_home.mkdir()
    monkeypatch.setenv("ZOOKEEPER_HOME", str(empty_home))
    server = ZooKeeperServer(tmp_path / "zk", free_port(), start_timeout=30)
    try:
        with pytest.raises(ZooKeeperStartError) as info:
            server.start()
        assert "exited during start-up" in str(info.value)
        assert "ZooKeeperServerMain" in info.value.log_tail
        assert not server.is_running()
    finally:
        server.stop(grace=1.0)


def test_ensemble_config_has_server_lines(tmp_path: Path) -> None:
    """Only rendering is checked: a 3-node ensemble is a later issue's job."""
    members = [EnsembleMember(i, "127.0.0.1", 2180 + i, 2880 + i, 3880 + i) for i in (1, 2, 3)]
    server = ZooKeeperServer(tmp_path / "zk2", 2182, ensemble=members, server_id=2)
    cfg = server.render_config()
    assert "server.1=127.0.0.1:2881:3881;2181" in cfg
    assert "server.3=127.0.0.1:2883:3883;2183" in cfg
    assert "clientPort=2182" in cfg
    assert "QuorumPeerMain" in " ".join(server.command())
    with pytest.raises(ValueError):
        ZooKeeperServer(tmp_path / "zk4", 2184, ensemble=members, server_id=4)
