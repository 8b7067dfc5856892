"""`strata up/status/down` as real subprocesses, with a real ZooKeeper and kazoo.

Port plan of a stack with base port P: ZooKeeper P (a 3-node ensemble: node k client P+k,
quorum P+3+k, election P+6+k), the ingest gateway P+9, broker i P+10+i, its metrics
P+40+i. Tests pick P with
:func:`free_base_port` (every port of the plan is free, and P lies below the kernel's
ephemeral range so client sockets of other tests cannot take it) and retry ``up`` on
another base if one of them is grabbed in between.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from kazoo.client import KazooClient

from procs import PortInUseError, check_port_free, cmdline, pid_alive
from strata.client import Admin, NewTopic
from zookeeper.launcher import server_mode

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]


def _strata_command() -> list[str]:
    """The installed console script next to this interpreter (what `make up` runs)."""
    script = Path(sys.executable).parent / "strata"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "strata_tools.cli"]


def strata(*args: str, cwd: Path, bootstrap: str | None = None,
           stdin: str | None = None, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    extra = env or {}
    env = dict(os.environ)
    env.pop("STRATA_BOOTSTRAP", None)
    env.pop("STRATA_COMMAND_CONFIG", None)
    env.update(extra)
    if bootstrap is not None:
        env["STRATA_BOOTSTRAP"] = bootstrap
    try:
        return subprocess.run(
            [*_strata_command(), *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:  # say what it had printed, not just the time
        def text(data: str | bytes | None) -> str:
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
        raise AssertionError(f"`strata {' '.join(args)}` did not finish within 120 s; "
                             f"stdout: {text(exc.stdout)[-3000:]!r}; "
                             f"stderr: {text(exc.stderr)[-3000:]!r}") from None


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_free(port: int) -> bool:
    try:
        check_port_free("127.0.0.1", port, "test probe")
    except PortInUseError:
        return False
    return True


def stack_ports(base: int, brokers: int = 1, zookeeper_nodes: int = 1) -> list[int]:
    """Every port a stack of ``brokers`` brokers on base port ``base`` listens on."""
    zookeeper = [base] if zookeeper_nodes == 1 else \
        [base + offset + k for offset in (0, 3, 6) for k in range(zookeeper_nodes)]
    return [*zookeeper, base + 9, *(base + 10 + i for i in range(brokers)),
            *(base + 40 + i for i in range(brokers)), base + 70,
            *(base + 80 + i for i in range(brokers))]


def free_base_port(brokers: int = 1, attempts: int = 500, zookeeper_nodes: int = 1) -> int:
    """A base port P whose whole port plan (P[..P+8], P+9, P+10+i, P+40+i, P+70, P+80+i) is
    free now.

    Taken from below the ephemeral range: outgoing connections of concurrent tests take
    ephemeral ports and could land on P+10 between this check and `strata up`.
    """
    high = min(_ephemeral_low(), 65536) - 110
    low = max(1024, high - 12000)
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(low, high)
        if all(_port_free(port) for port in stack_ports(base, brokers, zookeeper_nodes)):
            return base
    raise RuntimeError(f"no free base port with {brokers} broker(s) in {low}..{high}")


def up_on_free_ports(data_dir: Path, cwd: Path, reaper: Any, *extra: str, brokers: int = 1,
                     zookeeper_nodes: int = 1, attempts: int = 3, size_flag: bool = True
                     ) -> tuple[int, dict[str, Any]]:
    """`strata up --base-port P --format json` on a free P; retried on a port clash.

    Every PID `up` records (even of a failed attempt) is handed to ``reaper``.
    """
    last = ""
    for _ in range(attempts):
        base = free_base_port(brokers, zookeeper_nodes=zookeeper_nodes)
        try:
            # One broker unless the test says otherwise (the CLI's default is 3).
            sizing = () if "--brokers" in extra or not size_flag else ("--brokers", str(brokers))
            result = strata("up", "--data-dir", str(data_dir), "--base-port", str(base),
                            "--format", "json", *sizing, *extra, cwd=cwd)
        finally:
            # Before any assertion can fail, and even if `up` itself timed out.
            if (data_dir / "stack.json").exists():
                _track_recorded(reaper, data_dir)
        if result.returncode == 0:
            return base, _json(result)
        last = result.stderr
        assert "already in use" in last, last  # anything but a port clash is a failure
        # Another process took a port of the plan: stop what did start, try another base.
        ok(strata("down", "--data-dir", str(data_dir), cwd=cwd))
    raise AssertionError(f"`strata up` hit busy ports {attempts} times; last error:\n{last}")


def _track_recorded(reaper: Any, data_dir: Path) -> None:
    """Hand every PID recorded in stack.json to the reaper (killed at teardown)."""
    for rec in json.loads((data_dir / "stack.json").read_text())["processes"]:
        reaper.track(rec["pid"], rec["marker"])


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_up_status_up_again_down(
    tmp_path: Path, reaper: Any, kazoo_factory: Callable[[str], KazooClient]
) -> None:
    data_dir = tmp_path / "stack"
    try:
        port, info = up_on_free_ports(data_dir, tmp_path, reaper)
        assert info["zookeeper"] == f"127.0.0.1:{port}"
        assert info["bootstrap"] == f"127.0.0.1:{port + 10}"
        assert info["kafka_bootstrap"] == f"127.0.0.1:{port + 80}"
        assert info["gateway"] == f"http://127.0.0.1:{port + 9}"
        zk, broker, gateway, tier = info["processes"]
        assert zk["name"] == "zookeeper" and zk["port"] == port and zk["state"] == "started"
        assert broker["name"] == "broker-0" and broker["port"] == port + 10
        assert gateway["name"] == "gateway" and gateway["port"] == port + 9
        assert tier["name"] == "tier" and tier["port"] == port + 70
        assert info["tier_metrics"] == f"http://127.0.0.1:{port + 70}/metrics"
        assert info["warehouse"] == str((data_dir / "warehouse").resolve())
        pid, broker_pid, gateway_pid, tier_pid = zk["pid"], broker["pid"], gateway["pid"], \
            tier["pid"]
        assert all(pid_alive(p) for p in (pid, broker_pid, gateway_pid, tier_pid))
        # The tier job serves its metrics and, with no tiered topic, runs no Spark JVM.
        assert _metrics_answer(port + 70, b"strata_tier_job")
        assert not any("java" in (cmdline(child) or "") for child in _children(tier_pid))
        # Its first pass (nothing to tier) is one JSON line in tier.log.
        tier_log = data_dir / "tier" / "tier.log"
        deadline = time.monotonic() + 30
        while not any(line.startswith("{") for line in tier_log.read_text().splitlines()):
            assert time.monotonic() < deadline, tier_log.read_text()[-2000:]
            time.sleep(0.2)
        first_pass = json.loads(next(line for line in tier_log.read_text().splitlines()
                                     if line.startswith("{")))
        assert first_pass["topics"] == [] and first_pass["records"] == 0
        token = info["gateway_api_key"]
        assert token and token.startswith("dev.")
        for name in ("auth.toml", "dev-token"):  # the development key: the user's only
            assert (data_dir / "gateway" / name).stat().st_mode & 0o777 == 0o600
        _produce_through_gateway(info["gateway"], token, "via-gateway", info["bootstrap"])

        client = kazoo_factory(info["zookeeper"])
        client.create("/strata-cli-test", b"kept")

        status = strata("status", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        status_info = _json(status)
        assert [(p["pid"], p["state"]) for p in status_info["processes"]] == [
            (pid, "running"), (broker_pid, "running"), (gateway_pid, "running"),
            (tier_pid, "running")]
        assert (status_info["gateway"], status_info["gateway_api_key"]) == \
            (info["gateway"], token)
        text = ok(strata("status", "--data-dir", str(data_dir), cwd=tmp_path))
        assert f"Gateway:   {info['gateway']}" in text and token in text
        assert f"Kafka:     {info['kafka_bootstrap']}" in text
        assert status_info["kafka_bootstrap"] == info["kafka_bootstrap"]

        again = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        again_info = _json(again)
        assert [(p["pid"], p["state"]) for p in again_info["processes"]] == [
            (pid, "running"), (broker_pid, "running"), (gateway_pid, "running"),
            (tier_pid, "running")]
        assert again_info["zookeeper"] == info["zookeeper"]

        down = strata("down", "--data-dir", str(data_dir), cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout
        assert down.stdout.index("tier") < down.stdout.index("gateway") < \
            down.stdout.index("broker-0")  # reverse start order
        assert not any(pid_alive(p) for p in (pid, broker_pid, gateway_pid, tier_pid))

        after = strata("status", "--data-dir", str(data_dir), cwd=tmp_path)
        assert after.returncode == 1
        assert "strata up" in after.stdout

        # Data survives down/up: the znode written before is still there.
        client.stop()
        restarted = strata("up", "--data-dir", str(data_dir), cwd=tmp_path)  # text output
        _track_recorded(reaper, data_dir)
        assert restarted.returncode == 0, restarted.stderr
        assert f"Gateway:   {info['gateway']}" in restarted.stdout
        assert f"API key:   {token}" in restarted.stdout  # the same key after down/up
        new_info = _json(strata("status", "--data-dir", str(data_dir), "--format", "json",
                                cwd=tmp_path))
        assert new_info["zookeeper"] == info["zookeeper"]  # recorded base port reused
        assert new_info["gateway_api_key"] == token
        assert httpx.get(f"{new_info['gateway']}/v3/clusters", timeout=10,
                         headers={"Authorization": f"Bearer {token}"}).status_code == 200
        reader = kazoo_factory(new_info["zookeeper"])
        assert reader.get("/strata-cli-test")[0] == b"kept"
        assert strata("down", "--data-dir", str(data_dir), cwd=tmp_path).returncode == 0
        assert not any(pid_alive(p["pid"]) for p in new_info["processes"])
    finally:
        reaper.reap()


def _produce_through_gateway(gateway: str, token: str, topic: str, bootstrap: str) -> None:
    """The stack's gateway accepts the development token (and nothing without it)."""
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=gateway, timeout=20) as client:
        cluster_id = client.get("/v3/clusters", headers=auth).json()["data"][0]["cluster_id"]
        topics = f"/v3/clusters/{cluster_id}/topics"
        record = {"value": {"type": "STRING", "data": "through the gateway"}}
        assert client.post(f"{topics}/{topic}/records", json=record).status_code == 401
        created = client.post(topics, headers=auth,
                              json={"topic_name": topic, "partitions_count": 1})
        assert created.status_code == 201, created.text
        answer = client.post(f"{topics}/{topic}/records", json=record, headers=auth)
        assert answer.status_code == 200 and answer.json()["error_code"] == 200, answer.text
    [read] = _consume_all(bootstrap, topic, Path.cwd(), "--from-beginning", "-n", "1",
                          "--timeout-ms", "10000")
    assert read["value"] == "through the gateway"


def test_up_on_a_busy_port_fails_with_advice(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = strata(
            "up", "--data-dir", str(tmp_path / "stack"), "--base-port", str(port), cwd=tmp_path
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"port {port}" in result.stderr and "--base-port" in result.stderr
    assert not (tmp_path / "stack" / "stack.json").exists()  # nothing was recorded


def test_usage_errors_are_short(tmp_path: Path) -> None:
    bad_port = strata("up", "--base-port", "99999", cwd=tmp_path)
    assert bad_port.returncode == 2 and "outside 1-65535" in bad_port.stderr
    nothing = strata("down", "--data-dir", str(tmp_path / "none"), cwd=tmp_path)
    assert nothing.returncode == 0 and "Nothing to stop" in nothing.stdout


def _consume_all(bootstrap: str, topic: str, cwd: Path, *args: str) -> list[dict[str, Any]]:
    out = ok(strata("consume", topic, "--format", "json", *args, cwd=cwd, bootstrap=bootstrap))
    return [json.loads(line) for line in out.splitlines()]


def test_records_survive_down_and_up(tmp_path: Path, reaper: Any) -> None:
    """Broker data (not just ZooKeeper's) survives `down`/`up`, read back with the CLI."""
    data_dir = tmp_path / "stack"
    topic, count = "kept-records", 60
    lines = [f"k{i % 5}:value-{i}" for i in range(count)]
    try:
        base, info = up_on_free_ports(data_dir, tmp_path, reaper)
        bootstrap = info["bootstrap"]
        assert bootstrap == f"127.0.0.1:{base + 10}"
        ok(strata("topic", "create", topic, "-p", "2", cwd=tmp_path, bootstrap=bootstrap))
        report = json.loads(ok(strata("produce", topic, "--key-separator", ":", "--format",
                                      "json", cwd=tmp_path, bootstrap=bootstrap,
                                      stdin="\n".join(lines) + "\n")))
        assert report == {"acknowledged": count, "failed": 0, "error": None}
        before = _consume_all(bootstrap, topic, tmp_path, "--from-beginning", "-n", str(count),
                              "--timeout-ms", "10000")
        assert len(before) == count

        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert not any(pid_alive(p["pid"]) for p in info["processes"])

        restarted = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        _track_recorded(reaper, data_dir)
        assert restarted.returncode == 0, restarted.stderr
        new_info = _json(restarted)
        assert new_info["bootstrap"] == bootstrap  # the recorded base port is reused
        assert [p["state"] for p in new_info["processes"]] == ["started"] * 4

        # -n stops at `count`; --timeout-ms keeps a lost record from hanging the test.
        after = _consume_all(bootstrap, topic, tmp_path, "--from-beginning", "-n", str(count),
                             "--timeout-ms", "10000")
        assert sorted((r["key"], r["value"]) for r in after) == \
            sorted(tuple(line.split(":", 1)) for line in lines)
        assert sorted((r["partition"], r["offset"], r["value"]) for r in after) == \
            sorted((r["partition"], r["offset"], r["value"]) for r in before)
        for partition in (0, 1):
            mine = sorted((r for r in after if r["partition"] == partition),
                          key=lambda r: r["offset"])
            assert [r["offset"] for r in mine] == list(range(len(mine)))
            # One producer: each partition holds its records in the order they were sent.
            sent = [int(r["value"].split("-")[1]) for r in mine]
            assert sent == sorted(sent)
        # Exactly those records: reading without -n until idle finds no others.
        everything = _consume_all(bootstrap, topic, tmp_path, "--from-beginning",
                                  "--timeout-ms", "1500")
        assert len(everything) == count
        described = json.loads(ok(strata("topic", "describe", topic, "--format", "json",
                                         cwd=tmp_path, bootstrap=bootstrap)))
        assert sum(p["high_watermark"] for p in described["partitions"]) == count
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert not any(pid_alive(p["pid"]) for p in new_info["processes"])
    finally:
        reaper.reap()


def _metrics_answer(port: int, needle: bytes = b"strata_") -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.status == 200 and needle in response.read()


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_up_with_two_brokers_keeps_two(tmp_path: Path, reaper: Any) -> None:
    data_dir = tmp_path / "stack"
    try:
        base, info = up_on_free_ports(data_dir, tmp_path, reaper, "--brokers", "2", brokers=2)
        assert [(p["name"], p["port"], p["state"]) for p in info["processes"]] == [
            ("zookeeper", base, "started"), ("broker-0", base + 10, "started"),
            ("broker-1", base + 11, "started"), ("gateway", base + 9, "started"),
            ("tier", base + 70, "started")]
        assert info["bootstrap"] == f"127.0.0.1:{base + 10},127.0.0.1:{base + 11}"
        pids = [p["pid"] for p in info["processes"]]
        assert all(pid_alive(pid) for pid in pids)

        status = strata("status", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert status.returncode == 0, status.stdout
        assert [p["state"] for p in _json(status)["processes"]] == ["running"] * 5
        # Both brokers are registered and serve their metrics on P+40+i.
        with Admin(info["bootstrap"]) as admin:
            assert admin.describe_cluster().brokers == {
                0: ("127.0.0.1", base + 10), 1: ("127.0.0.1", base + 11)}
        assert _metrics_answer(base + 40) and _metrics_answer(base + 41)

        again = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert [(p["name"], p["pid"], p["state"]) for p in _json(again)["processes"]] == [
            ("zookeeper", pids[0], "running"), ("broker-0", pids[1], "running"),
            ("broker-1", pids[2], "running"), ("gateway", pids[3], "running"),
            ("tier", pids[4], "running")]

        # The cluster keeps its size across down/up too (no --brokers given).
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert not any(pid_alive(pid) for pid in pids)
        restarted = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        _track_recorded(reaper, data_dir)
        assert restarted.returncode == 0, restarted.stderr
        new_info = _json(restarted)
        assert [(p["name"], p["port"], p["state"]) for p in new_info["processes"]] == [
            ("zookeeper", base, "started"), ("broker-0", base + 10, "started"),
            ("broker-1", base + 11, "started"), ("gateway", base + 9, "started"),
            ("tier", base + 70, "started")]
        with Admin(new_info["bootstrap"]) as admin:
            assert set(admin.describe_cluster().brokers) == {0, 1}
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert not any(pid_alive(p["pid"]) for p in new_info["processes"])
    finally:
        reaper.reap()


def test_up_defaults_to_three_brokers_that_replicate(tmp_path: Path, reaper: Any) -> None:
    """No --brokers on a new data dir: three brokers, and topics created without a factor
    get three replicas and min.insync.replicas=2 (the stack survives losing a broker)."""
    data_dir = tmp_path / "stack"
    try:
        base, info = up_on_free_ports(data_dir, tmp_path, reaper, brokers=3, size_flag=False)
        assert [p["name"] for p in info["processes"]] == [
            "zookeeper", "broker-0", "broker-1", "broker-2", "gateway", "tier"]
        with Admin(info["bootstrap"]) as admin:
            admin.create_topics([NewTopic("replicated", 2)])
            described = admin.describe_topics(["replicated"])["replicated"]
            assert all(len(p.replicas) == 3 for p in described.partitions)
            assert sorted(p.leader for p in described.partitions) != [-1, -1]
            configs = admin.describe_configs(["replicated"])["replicated"]
            assert configs["min.insync.replicas"].value == "2"
        report = _produce(info["bootstrap"], "replicated", ["k:v"], tmp_path)
        assert report, report
        # Every broker opened its Kafka listener: a stock Kafka client reads that record
        # and writes one Strata's consumer reads back.
        from confluent_kafka import Consumer as KafkaConsumer
        from confluent_kafka import Producer as KafkaProducer

        kafka = info["kafka_bootstrap"]
        assert kafka == ",".join(f"127.0.0.1:{base + 80 + i}" for i in range(3))
        producer = KafkaProducer({"bootstrap.servers": kafka, "acks": "all"})
        producer.produce("replicated", key=b"from", value=b"kafka", partition=0)
        assert producer.flush(30) == 0
        consumer = KafkaConsumer({"bootstrap.servers": kafka, "group.id": "up-test",
                                  "auto.offset.reset": "earliest"})
        consumer.subscribe(["replicated"])
        seen: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            seen += [(m.key(), m.value()) for m in consumer.consume(10, 1.0)
                     if m.error() is None]
        consumer.close()
        assert sorted(seen) == [(b"from", b"kafka"), (b"k", b"v")]
        # The notebooks' helpers on a plaintext stack (tests/test_notebooks.py runs the
        # notebooks on a secured one): no security options, and `seed` works as the
        # notebooks' README says.
        from strata_tools.notebook import find_stack

        found = find_stack(data_dir)
        assert found.security is None and found.client_security.protocol == "PLAINTEXT"
        assert found.source_options == {"bootstrap.servers": info["bootstrap"]}
        seeded = subprocess.run(
            [sys.executable, "-m", "strata_tools.notebook", "seed", "--data-dir", str(data_dir),
             "--topic", "seeded", "--records", "50", "--partitions", "1"],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
        assert seeded.returncode == 0 and seeded.stdout.startswith(
            "produced 50 records to seeded;") and "--command-config" not in seeded.stdout, \
            seeded.stderr
        ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert not any(pid_alive(p["pid"]) for p in info["processes"])
    finally:
        reaper.reap()


def _produce(bootstrap: str, topic: str, lines: list[str], cwd: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(ok(strata(
        "produce", topic, "--key-separator", ":", "--format", "json", cwd=cwd,
        bootstrap=bootstrap,
        stdin="\n".join(lines) + "\n")))
    return report


def _wait_for_zookeeper_leader(ports: list[int], timeout: float) -> int:
    """The port of the node that leads a quorum of ``ports`` (polled until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        modes = {port: server_mode("127.0.0.1", port) for port in ports}
        leaders = [port for port, mode in modes.items() if mode == "leader"]
        if len(leaders) == 1 and sum(m is not None for m in modes.values()) >= 2:
            return leaders[0]
        assert time.monotonic() < deadline, f"no ZooKeeper leader within {timeout}s: {modes}"
        time.sleep(0.1)


def test_up_with_a_zookeeper_ensemble_rides_out_losing_its_leader(
    tmp_path: Path, reaper: Any, kazoo_factory: Callable[[str], KazooClient]
) -> None:
    """`--zookeeper-nodes 3`: three healthy members, brokers get all three addresses; with
    the ZooKeeper leader SIGKILLed the stack still produces, consumes and creates topics,
    the broker keeps its session, `up` restarts the member, `down` stops everything."""
    data_dir = tmp_path / "stack"
    try:
        base, info = up_on_free_ports(data_dir, tmp_path, reaper, "--zookeeper-nodes", "3",
                                      "--brokers", "1", zookeeper_nodes=3)
        assert [(p["name"], p["port"], p["state"]) for p in info["processes"]] == [
            ("zookeeper-0", base, "started"), ("zookeeper-1", base + 1, "started"),
            ("zookeeper-2", base + 2, "started"), ("broker-0", base + 10, "started"),
            ("gateway", base + 9, "started"), ("tier", base + 70, "started")]
        zk_ports = [base, base + 1, base + 2]
        assert info["zookeeper"] == ",".join(f"127.0.0.1:{port}" for port in zk_ports)
        modes = sorted(server_mode("127.0.0.1", port) or "-" for port in zk_ports)
        assert modes == ["follower", "follower", "leader"]
        for k in range(3):
            node = data_dir / f"zookeeper-{k}"
            assert (node / "data" / "myid").read_text().strip() == str(k + 1)
            cfg = (node / "zoo.cfg").read_text()
            assert f"server.{k + 1}=127.0.0.1:{base + 3 + k}:{base + 6 + k};" \
                f"127.0.0.1:{base + k}" in cfg
        assert not (data_dir / "zookeeper").exists()  # the single-node layout is not used
        pids = {p["name"]: p["pid"] for p in info["processes"]}
        assert f"--zookeeper {info['zookeeper']}" in (cmdline(pids["broker-0"]) or "")

        bootstrap = info["bootstrap"]
        ok(strata("topic", "create", "before", "-p", "2", cwd=tmp_path, bootstrap=bootstrap))
        first = [f"k{i % 3}:before-{i}" for i in range(20)]
        assert _produce(bootstrap, "before", first, tmp_path)["acknowledged"] == 20

        watcher = kazoo_factory(info["zookeeper"])
        owner = watcher.get("/strata/brokers/ids/0")[1].ephemeralOwner
        watcher.stop()  # this test's own client must not hold the session of interest

        leader_port = _wait_for_zookeeper_leader(zk_ports, 5)
        victim = next(p for p in info["processes"] if p["port"] == leader_port)
        os.kill(victim["pid"], signal.SIGKILL)  # the recorded PID of the leader
        killed_at = time.monotonic()
        survivors = [port for port in zk_ports if port != leader_port]
        new_leader = _wait_for_zookeeper_leader(survivors, 20)
        print(f"{victim['name']} killed; new leader on {new_leader} after "
              f"{time.monotonic() - killed_at:.1f}s")

        second = [f"k{i % 3}:after-{i}" for i in range(20)]
        assert _produce(bootstrap, "before", second, tmp_path) == \
            {"acknowledged": 20, "failed": 0, "error": None}
        records = _consume_all(bootstrap, "before", tmp_path, "--from-beginning", "-n", "40",
                               "--timeout-ms", "10000")
        assert sorted(r["value"] for r in records) == \
            sorted(line.split(":", 1)[1] for line in first + second)
        # A ZooKeeper write through the broker (CreateTopics) works once its client has
        # moved to a survivor; retried briefly while it reconnects.
        deadline = time.monotonic() + 20
        while True:
            created = strata("topic", "create", "after", cwd=tmp_path, bootstrap=bootstrap)
            if created.returncode == 0 or "already exists" in created.stderr:
                break
            assert time.monotonic() < deadline, created.stderr
            time.sleep(0.5)
        assert _produce(bootstrap, "after", ["x:1", "y:2"], tmp_path)["acknowledged"] == 2
        assert len(_consume_all(bootstrap, "after", tmp_path, "--from-beginning", "-n", "2",
                                "--timeout-ms", "10000")) == 2
        # The broker's session survived the election: same ephemeral owner as before.
        survivor = kazoo_factory(",".join(f"127.0.0.1:{port}" for port in survivors))
        assert survivor.get("/strata/brokers/ids/0")[1].ephemeralOwner == owner

        status = strata("status", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        assert status.returncode == 1  # one recorded process is down
        status_info = _json(status)
        assert {p["name"]: p["state"] for p in status_info["processes"]} == {
            **{f"zookeeper-{k}": "running" for k in range(3)}, "broker-0": "running",
            "gateway": "running", "tier": "running", victim["name"]: "stopped"}
        assert f"127.0.0.1:{leader_port}" not in status_info["zookeeper"]

        # `up` without flags keeps 3 nodes (from the data dir) and restarts only the victim.
        again = strata("up", "--data-dir", str(data_dir), "--format", "json", cwd=tmp_path)
        _track_recorded(reaper, data_dir)
        assert again.returncode == 0, again.stderr
        again_info = _json(again)
        assert {p["name"]: p["state"] for p in again_info["processes"]} == {
            **{f"zookeeper-{k}": "running" for k in range(3)}, "broker-0": "running",
            "gateway": "running", "tier": "running", victim["name"]: "started"}
        assert again_info["zookeeper"] == info["zookeeper"]
        assert server_mode("127.0.0.1", leader_port) == "follower"

        # Switching an existing data dir to a single ZooKeeper is refused, nothing changes.
        single = strata("up", "--data-dir", str(data_dir), "--zookeeper-nodes", "1",
                        cwd=tmp_path)
        assert single.returncode == 1 and "--zookeeper-nodes" in single.stderr
        assert "Traceback" not in single.stderr

        down = ok(strata("down", "--data-dir", str(data_dir), cwd=tmp_path))
        assert down.count("stopped") == 7  # 6 processes (tier too) + the closing line
        assert not any(pid_alive(p["pid"]) for p in again_info["processes"])
    finally:
        if (data_dir / "stack.json").exists():
            _track_recorded(reaper, data_dir)  # whatever the last `up` recorded
        reaper.reap()


def test_up_secure_serves_only_authenticated_clients(tmp_path: Path, reaper: Any) -> None:
    """`strata up --secure`: SASL_SSL brokers with ACLs and ZooKeeper ACLs, users made
    before the brokers start, a client config printed for the admin; the gateway and
    the CLI work through their own principals, a plaintext client gets nowhere."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    data_dir = tmp_path / "secure"
    try:
        base, info = up_on_free_ports(data_dir, tmp_path, reaper, "--secure", "--no-tier")
        security = info["security"]
        config = Path(security["client_config"])
        assert security["security_protocol"] == "SASL_SSL" and security["admin_password"]
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        assert f"sasl.password={security['admin_password']}" in config.read_text()
        env = {"STRATA_COMMAND_CONFIG": str(config)}
        made = strata("topic", "create", "secure-topic", "-p", "1", "-r", "1",
                      cwd=tmp_path, bootstrap=info["bootstrap"], env=env)
        assert made.returncode == 0, made.stderr
        # Without the client config: refused at the TLS handshake, with a hint.
        plain = strata("topic", "list", cwd=tmp_path, bootstrap=info["bootstrap"])
        assert plain.returncode == 1 and "security_protocol" in plain.stderr, plain.stderr
        # The gateway reaches the brokers with its own principal.
        token = (data_dir / "gateway" / "dev-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=info["gateway"], timeout=20) as client:
            cluster = client.get("/v3/clusters", headers=auth).json()["data"][0]["cluster_id"]
            answer = client.post(f"/v3/clusters/{cluster}/topics/secure-topic/records",
                                 headers=auth, json={"value": {"type": "STRING", "data": "x"}})
            assert answer.status_code == 200, answer.text
        # ZooKeeper: readable, not writable, without the brokers' digest identity.
        zk = KazooClient(hosts=f"127.0.0.1:{base}")
        zk.start(timeout=15)
        try:
            with pytest.raises(NoAuthError):
                zk.set("/strata/brokers/topics/secure-topic", b"{}")
        finally:
            zk.stop()
            zk.close()
        status = strata("status", "--data-dir", str(data_dir), cwd=tmp_path)
        assert status.returncode == 0 and "Secured:   SASL_SSL" in status.stdout
        # The propagation benchmark runs on it (its figures: docs/benchmarks.md), and
        # leaves no user, ACL or topic behind.
        bench = strata("perf", "propagation", "--rounds", "2", "--format", "json",
                       cwd=tmp_path, bootstrap=info["bootstrap"], env=env)
        assert bench.returncode == 0, bench.stderr
        figures = json.loads(bench.stdout)
        brokers = figures["brokers"]
        assert brokers >= 1 and all(figures[kind]["samples"] == 2 * brokers for kind in (
            "credential_create", "acl_grant", "acl_revoke", "credential_delete")), figures
        users = strata("user", "list", "--format", "json", cwd=tmp_path,
                       bootstrap=info["bootstrap"], env=env)
        assert "perf-propagation" not in users.stdout and users.returncode == 0, users.stderr
        acls = strata("acl", "list", "--format", "json", cwd=tmp_path,
                      bootstrap=info["bootstrap"], env=env)
        assert "perf-propagation" not in acls.stdout and acls.returncode == 0, acls.stderr
        topics = strata("topic", "list", cwd=tmp_path, bootstrap=info["bootstrap"], env=env)
        assert "perf-propagation" not in topics.stdout and topics.returncode == 0, topics.stderr
    finally:
        if (data_dir / "stack.json").exists():
            strata("down", "--data-dir", str(data_dir), cwd=tmp_path)
