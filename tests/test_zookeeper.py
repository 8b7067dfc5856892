"""The ZooKeeper launcher against real servers (JVMs from the pyspark jars) and kazoo."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.retry import KazooRetry

from procs import PortInUseError, free_port, pid_alive
from zookeeper.launcher import (
    EnsembleHealth,
    EnsembleMember,
    ZooKeeperEnsemble,
    ZooKeeperError,
    ZooKeeperServer,
    ZooKeeperStartError,
    four_letter_word,
    server_mode,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


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


def test_server_jvmflags_reach_the_running_jvm(
    zookeeper_server: ZooKeeperServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$SERVER_JVMFLAGS`` (zkServer.sh's variable) is on the real JVM's command line,
    after the defaults; the suite's own (tests/conftest.py) shows it for every server."""
    argv = Path(f"/proc/{zookeeper_server.pid}/cmdline").read_bytes().split(b"\0")
    flags = os.environ["SERVER_JVMFLAGS"].split()
    assert flags and all(f.encode() in argv for f in flags), argv
    assert argv.index(flags[0].encode()) > argv.index(b"-XX:+UseSerialGC")
    # Quoted as a shell would; an unbalanced quote is refused before anything starts.
    monkeypatch.setenv("SERVER_JVMFLAGS", "-Xmx64m '-Dstrata.note=two words'")
    command = ZooKeeperServer(tmp_path / "zk", free_port()).command()
    assert command[command.index("-Xmx64m") + 1] == "-Dstrata.note=two words"
    monkeypatch.setenv("SERVER_JVMFLAGS", "-Dx='open")
    server = ZooKeeperServer(tmp_path / "zk-bad", free_port(), start_timeout=30)
    with pytest.raises(ZooKeeperError, match=r"SERVER_JVMFLAGS=.*fix its quoting"):
        server.start()
    assert server.pid is None and not server.is_running()
    # A flag the JVM refuses: the start fails with the JVM's own words in the log tail.
    monkeypatch.setenv("SERVER_JVMFLAGS", "-XX:+NoSuchStrataFlag")
    server = ZooKeeperServer(tmp_path / "zk-refused", free_port(), start_timeout=30)
    try:
        with pytest.raises(ZooKeeperStartError) as info:
            server.start()
        assert "NoSuchStrataFlag" in info.value.log_tail
    finally:
        server.stop(grace=1.0)


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
    members = [EnsembleMember(i, "127.0.0.1", 2180 + i, 2880 + i, 3880 + i) for i in (1, 2, 3)]
    server = ZooKeeperServer(tmp_path / "zk2", 2182, ensemble=members, server_id=2,
                             init_limit=7, sync_limit=3)
    cfg = server.render_config()
    # The client address names the host: ZooKeeper refuses a server line whose client
    # address differs from clientPortAddress (a bare ";2181" would mean 0.0.0.0).
    assert "server.1=127.0.0.1:2881:3881;127.0.0.1:2181" in cfg
    assert "server.3=127.0.0.1:2883:3883;127.0.0.1:2183" in cfg
    assert "clientPort=2182" in cfg and "clientPortAddress=127.0.0.1" in cfg
    assert "initLimit=7" in cfg and "syncLimit=3" in cfg
    assert "4lw.commands.whitelist=ruok,srvr,stat,mntr" in cfg
    assert "QuorumPeerMain" in " ".join(server.command())
    with pytest.raises(ValueError):
        ZooKeeperServer(tmp_path / "zk4", 2184, ensemble=members, server_id=4)


def test_ensemble_health_wants_every_node_serving_and_one_leader() -> None:
    def health(*modes: str | None) -> EnsembleHealth:
        return EnsembleHealth(tuple((f"h:{i}", m) for i, m in enumerate(modes)))

    assert health("follower", "leader", "follower").healthy
    assert not health("follower", None, "leader").healthy  # a node down
    assert not health("follower", "follower", "follower").healthy  # no leader (yet)
    assert not health("leader", "leader", "follower").healthy
    assert health("standalone").healthy and not health(None).healthy
    assert not health().healthy
    assert health("leader", None, "follower").leaders == ["h:0"]
    assert health("leader", None, "follower").describe() == \
        "h:0 leader, h:1 not serving, h:2 follower"


def _distinct_free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def test_three_node_ensemble_survives_its_leader_being_killed(
    tmp_path: Path, kazoo_factory: Callable[[str], KazooClient]
) -> None:
    """Start 3 nodes, SIGKILL the leader: the other two elect a new one within a bounded
    time, the same kazoo client (and session) reads and writes again, and the killed node
    rejoins as a follower with what was written while it was gone."""
    ports = _distinct_free_ports(9)
    members = [EnsembleMember(k + 1, "127.0.0.1", ports[k], ports[3 + k], ports[6 + k])
               for k in range(3)]
    ensemble = ZooKeeperEnsemble([tmp_path / f"zk{k}" for k in range(3)], members,
                                 heap="128m", start_timeout=40)
    pids: list[int] = []
    clients: list[KazooClient] = []
    try:
        assert ensemble.start() == list(ensemble.nodes)  # all launched before any waited
        pids = [pid for node in ensemble.nodes if (pid := node.pid) is not None]
        assert len(pids) == 3
        modes = [server_mode(n.host, n.client_port) for n in ensemble.nodes]
        assert sorted(m or "-" for m in modes) == ["follower", "follower", "leader"]
        for node, member in zip(ensemble.nodes, members, strict=True):
            assert (node.data_dir / "myid").read_text().strip() == str(member.server_id)
            assert all(m.cfg_line() in node.cfg_path.read_text() for m in members)

        # kazoo's default connection retry doubles its pause after every pass over the
        # hosts that finds none serving (up to 60 s), so a slow election on a busy machine
        # could push the next attempt past the session timeout. Capping the pause at 1 s
        # keeps reconnecting prompt (brokers/coordination.py should do the same).
        client = KazooClient(hosts=ensemble.connect_string, timeout=10.0,
                             connection_retry={"max_tries": -1, "delay": 0.1,
                                               "max_delay": 1.0})
        clients.append(client)
        client.start(timeout=15)
        states: list[str] = []
        client.add_listener(states.append)
        session_id = client.client_id[0]
        client.create("/ensemble-test/before", b"written before", makepath=True)
        client.create("/ensemble-test/mine", b"", ephemeral=True)

        leader = ensemble.leader()
        assert leader is not None and leader.pid is not None
        mntr = four_letter_word(leader.host, leader.client_port, "mntr")
        assert "zk_server_state\tleader" in mntr and "zk_synced_followers\t2" in mntr
        os.kill(leader.pid, signal.SIGKILL)
        killed_at = time.monotonic()

        new_leader = ensemble.wait_for_leader(timeout=20)
        elected_after = time.monotonic() - killed_at
        assert new_leader is not leader
        assert server_mode(leader.host, leader.client_port) is None  # it is dead
        print(f"new leader {new_leader.connect_string} after {elected_after:.1f}s")

        # The same client reconnects to a survivor with its session intact (ConnectionLoss
        # while it is SUSPENDED is retried; an expired session would not be).
        retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, deadline=20)
        assert retry(client.get, "/ensemble-test/before")[0] == b"written before"
        print(f"client read again {time.monotonic() - killed_at:.1f}s after the kill")
        retry(client.create, "/ensemble-test/after", b"written after the election")
        assert client.exists("/ensemble-test/mine") is not None  # its ephemeral node too
        assert client.client_id[0] == session_id
        assert KazooState.LOST not in states

        restarted_at = time.monotonic()
        leader.start(wait=False)  # same directory, same myid: it rejoins the ensemble
        pids.append(leader.pid or -1)
        ensemble.wait_until_healthy(timeout=30)
        print(f"killed node rejoined after {time.monotonic() - restarted_at:.1f}s")
        assert server_mode(leader.host, leader.client_port) == "follower"
        assert ensemble.leader() is new_leader  # a returning node does not take over
        rejoined = kazoo_factory(leader.connect_string)  # only the rejoined node
        rejoined.sync("/ensemble-test")
        assert rejoined.get("/ensemble-test/after")[0] == b"written after the election"
    finally:
        for c in clients:
            try:
                c.stop()
            finally:
                c.close()
        ensemble.stop(grace=5.0)
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(node.pid_path.exists() for node in ensemble.nodes)


def test_ensemble_start_failure_stops_what_it_started(tmp_path: Path) -> None:
    """A taken quorum port is refused up front; members launched by the call are stopped."""
    ports = _distinct_free_ports(9)
    members = [EnsembleMember(k + 1, "127.0.0.1", ports[k], ports[3 + k], ports[6 + k])
               for k in range(3)]
    ensemble = ZooKeeperEnsemble([tmp_path / f"zk{k}" for k in range(3)], members,
                                 start_timeout=30)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", members[2].peer_port))
        squatter.listen()
        try:
            with pytest.raises(PortInUseError, match="quorum port of server 3"):
                ensemble.start()
            assert not any(node.is_running() for node in ensemble.nodes)
        finally:
            ensemble.stop(grace=5.0)
