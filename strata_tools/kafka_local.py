"""Apache Kafka on this machine, for same-run comparisons with Strata (docs/kafka-local.md).

Why this exists: several measurements compare Strata with Apache Kafka on the same 2-core
machine in the same run (A, B, A, B), and there is no Kafka distribution to download here,
only Maven Central. So ``fetch`` resolves the KRaft broker (``org.apache.kafka:kafka_2.13``)
and the tools (``org.apache.kafka:kafka-tools``: ProducerPerformance, ConsumerPerformance,
TopicCommand, ...) with ``mvn`` into a cache outside the repository; ``up`` formats and
starts N combined broker+controller nodes on 127.0.0.1; ``down`` stops exactly the PIDs
that ``up`` recorded; ``tool`` runs a tools class on the same classpath.

Only the standard library and ``procs`` (the PID/port helpers) are imported: nothing of
Strata's brokers or client, so a Strata bug can never make the Kafka side look wrong.
Never needed by the tests.

    python -m strata_tools.kafka_local fetch
    python -m strata_tools.kafka_local up --brokers 3 --data-dir /tmp/k3   # prints bootstrap
    python -m strata_tools.kafka_local tool org.apache.kafka.tools.ProducerPerformance ...
    python -m strata_tools.kafka_local down --data-dir /tmp/k3

``scripts/kafka_local.sh`` is the same command.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from procs import PortInUseError, check_port_free, child_exit_status, cmdline, pid_alive

# The newest 4.1.x that Maven Central serves here; 4.1 is what the earlier comparisons
# in docs/benchmarks.md used. STRATA_KAFKA_VERSION or --version picks another 4.x.
DEFAULT_VERSION = "4.1.2"
# Kafka 4.x logs through slf4j 1.7 and ships log4j2: the poms bring log4j-api/core but no
# slf4j binding, and without one slf4j falls back to NOP and the broker logs nothing.
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "3.6.1"

# Kafka's own scripts: kafka-server-start.sh's heap and kafka-run-class.sh's G1 options.
BROKER_HEAP = "-Xmx1g -Xms1g"
BROKER_JVM = (
    "-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 "
    "-XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true"
)
# kafka-producer-perf-test.sh and friends use 512 MB.
TOOL_HEAP = "-Xmx512m"

STATE_FILE = "kafka-local.json"
PIDS_FILE = "pids"
# After the quorum is gone, a node still shutting down cannot finish cleanly (down).
QUORUM_LOST_GRACE = 5.0
CONTROLLER_PORT_OFFSET = 100  # node i: PLAINTEXT on base+i, CONTROLLER on base+100+i
METADATA_API_KEY = 3
METADATA_VERSION = 4  # Kafka 4.0 removed v0-v3 (KIP-896); v4 is the oldest left

BROKER_LOG4J2 = """\
# Written by strata_tools/kafka_local.py: the broker logs to files in kafka.logs.dir.
status = warn
appender.server.type = RollingFile
appender.server.name = server
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.server.policies.type = Policies
appender.server.policies.size.type = SizeBasedTriggeringPolicy
appender.server.policies.size.size = 100MB
appender.server.strategy.type = DefaultRolloverStrategy
appender.server.strategy.max = 5
appender.state.type = RollingFile
appender.state.name = state
appender.state.fileName = ${sys:kafka.logs.dir}/state-change.log
appender.state.filePattern = ${sys:kafka.logs.dir}/state-change.log.%i
appender.state.layout.type = PatternLayout
appender.state.layout.pattern = [%d] %p %m (%c)%n
appender.state.policies.type = Policies
appender.state.policies.size.type = SizeBasedTriggeringPolicy
appender.state.policies.size.size = 100MB
appender.state.strategy.type = DefaultRolloverStrategy
appender.state.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.server.ref = server
logger.state.name = state.change.logger
logger.state.level = INFO
logger.state.additivity = false
logger.state.appenderRef.state.ref = state
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

TOOLS_LOG4J2 = """\
# Written by strata_tools/kafka_local.py: tools log warnings to stderr, as Kafka's do.
status = warn
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = stderr
"""


class KafkaLocalError(RuntimeError):
    """An expected problem, reported in one message that says what to do."""


def _log(message: str) -> None:
    print(f"kafka_local: {message}", file=sys.stderr, flush=True)


# --- fetch -------------------------------------------------------------------------------


def cache_root() -> Path:
    env = os.environ.get("STRATA_KAFKA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "strata-kafka"


def default_version() -> str:
    return os.environ.get("STRATA_KAFKA_VERSION", DEFAULT_VERSION)


def _pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.kafka", "kafka-tools", version),
        # Pinned together so the binding matches the log4j-core the broker brings.
        ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ]
    dep_xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by strata_tools/kafka_local.py fetch: Kafka {version} broker + tools. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.strata</groupId>
  <artifactId>strata-kafka-local</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{dep_xml}
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def _stamp(version: str) -> str:
    text = _pom(version) + BROKER_LOG4J2 + TOOLS_LOG4J2
    return hashlib.sha256(text.encode()).hexdigest()


def version_dir(version: str) -> Path:
    return cache_root() / version


def _fetched(vdir: Path, version: str) -> bool:
    stamp = vdir / "stamp"
    libs = vdir / "libs"
    return (
        stamp.is_file()
        and stamp.read_text().strip() == _stamp(version)
        and (libs / f"kafka_2.13-{version}.jar").is_file()
        and (libs / f"kafka-tools-{version}.jar").is_file()
    )


def fetch(version: str) -> Path:
    """Resolve Kafka ``version`` into the cache; no network I/O once it is there."""
    vdir = version_dir(version)
    if _fetched(vdir, version):
        return vdir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLocalError("mvn is not installed: `apt-get install maven` (and a JDK 17)")
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "pom.xml").write_text(_pom(version))
    staging = vdir / "libs.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    _log(f"resolving Kafka {version} from Maven Central into {vdir} (mvn.log there)")
    with (vdir / "mvn.log").open("w") as out:
        done = subprocess.run(
            [mvn, "-B", "-q", "-f", str(vdir / "pom.xml"),
             f"org.apache.maven.plugins:maven-dependency-plugin:{DEPENDENCY_PLUGIN}"
             ":copy-dependencies",
             f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False,
        )
    if done.returncode != 0:
        tail = (vdir / "mvn.log").read_text().splitlines()[-15:]
        raise KafkaLocalError(
            f"mvn could not resolve Kafka {version} (exit {done.returncode}); is it on "
            "Maven Central? Last lines of mvn.log:\n" + "\n".join(tail)
        )
    shutil.rmtree(vdir / "libs", ignore_errors=True)
    staging.rename(vdir / "libs")
    (vdir / "log4j2-broker.properties").write_text(BROKER_LOG4J2)
    (vdir / "log4j2-tools.properties").write_text(TOOLS_LOG4J2)
    (vdir / "stamp").write_text(_stamp(version) + "\n")
    return vdir


def classpath(vdir: Path) -> str:
    return str(vdir / "libs" / "*")


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaLocalError("java is not installed: Kafka 4.x needs a JDK 17+")
    return found


def tool_command(vdir: Path, main_class: str, args: Sequence[str]) -> list[str]:
    heap = os.environ.get("KAFKA_TOOL_HEAP_OPTS", TOOL_HEAP).split()
    return [
        java(), *heap,
        f"-Dlog4j2.configurationFile={vdir / 'log4j2-tools.properties'}",
        "-cp", classpath(vdir), main_class, *args,
    ]


# --- up ------------------------------------------------------------------------------------


def random_cluster_id() -> str:
    """Like Kafka's ``Uuid.randomUuid().toString()``: 16 random bytes in URL-safe base64
    without padding (22 characters). Kafka refuses ids that do not decode to 16 bytes and
    never hands out one that starts with '-' (it would read as a command-line option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _free(port: int) -> bool:
    try:
        check_port_free("127.0.0.1", port, "Kafka")
    except PortInUseError:
        return False
    return True


def _ports(base: int, brokers: int) -> list[int]:
    return [base + i for i in range(brokers)] + [
        base + CONTROLLER_PORT_OFFSET + i for i in range(brokers)
    ]


def pick_base(brokers: int) -> int:
    for _ in range(200):
        base = random.randrange(30000, 60000)
        if all(_free(p) for p in _ports(base, brokers)):
            return base
    raise KafkaLocalError("found no free base port; pass --base-port")


def server_properties(
    node_id: int, brokers: int, base: int, data_dir: Path, extra: Sequence[str]
) -> str:
    port = base + node_id - 1
    cport = base + CONTROLLER_PORT_OFFSET + node_id - 1
    voters = ",".join(
        f"{i}@127.0.0.1:{base + CONTROLLER_PORT_OFFSET + i - 1}" for i in range(1, brokers + 1)
    )
    rf = min(3, brokers)
    isr = min(2, brokers)
    lines = [
        "# Written by strata_tools/kafka_local.py up: one combined KRaft node.",
        "process.roles=broker,controller",
        f"node.id={node_id}",
        # A static quorum: every node knows all voters, so `format` needs no --standalone
        # / --initial-controllers and 1 and N nodes are set up the same way.
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data_dir / f'node-{node_id}' / 'data'}",
        "num.partitions=1",
        f"offsets.topic.replication.factor={rf}",
        f"transaction.state.log.replication.factor={rf}",
        f"transaction.state.log.min.isr={isr}",
        f"share.coordinator.state.topic.replication.factor={rf}",
        f"share.coordinator.state.topic.min.isr={isr}",
        "group.initial.rebalance.delay.ms=0",
        "# --config overrides",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def _encode_str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> tuple[str | None, int]:
    """(cluster id, number of live brokers) from a Metadata v4 request to ``host:port``.

    KRaft brokers leave fenced brokers out of Metadata responses, so the count reaching
    the number of nodes means every broker registered and was unfenced. Plain sockets
    and the standard library: this must not depend on Strata's own protocol code.
    """
    body = (
        struct.pack(">hhi", METADATA_API_KEY, METADATA_VERSION, 1)
        + _encode_str("strata-kafka-local")
        + struct.pack(">ib", 0, 0)  # no topics, allow_auto_topic_creation=false
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        data = _recv_exact(sock, size)
    pos = 8  # correlation id, throttle_time_ms
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    for _ in range(count):
        pos += 4  # node id
        (hlen,) = struct.unpack_from(">h", data, pos)
        pos += 2 + hlen + 4  # host, port
        (rlen,) = struct.unpack_from(">h", data, pos)
        pos += 2 + max(rlen, 0)  # rack
    (clen,) = struct.unpack_from(">h", data, pos)
    cluster = data[pos + 2 : pos + 2 + clen].decode() if clen >= 0 else None
    return cluster, count


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks += chunk
    return bytes(chunks)


def _read_state(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / STATE_FILE
    if not path.is_file():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def _write_state(data_dir: Path, state: dict[str, Any]) -> None:
    tmp = data_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(data_dir / STATE_FILE)
    pids = [str(n["pid"]) for n in state["nodes"] if n.get("pid")]
    (data_dir / PIDS_FILE).write_text("".join(p + "\n" for p in pids))


def _running(node: dict[str, Any]) -> bool:
    pid = node.get("pid")
    if not pid or not pid_alive(pid):
        return False
    line = cmdline(pid)
    return line is not None and node["config"] in line


def _tail(path: Path, lines: int = 25) -> str:
    if not path.is_file():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _format(vdir: Path, config: Path, cluster_id: str) -> None:
    done = subprocess.run(
        tool_command(vdir, "kafka.tools.StorageTool",
                     ["format", "--cluster-id", cluster_id, "--config", str(config)]),
        capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
    )
    if done.returncode != 0:
        raise KafkaLocalError(
            f"kafka-storage format failed for {config}:\n{done.stdout}{done.stderr}"
        )


def _start_node(vdir: Path, node: dict[str, Any]) -> int:
    node_dir = Path(node["config"]).parent
    logs = node_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    heap = os.environ.get("KAFKA_HEAP_OPTS", BROKER_HEAP).split()
    jvm = os.environ.get("KAFKA_JVM_PERFORMANCE_OPTS", BROKER_JVM).split()
    command = [
        java(), *heap, *jvm,
        f"-Dlog4j2.configurationFile={vdir / 'log4j2-broker.properties'}",
        f"-Dkafka.logs.dir={logs}",
        "-cp", classpath(vdir), "kafka.Kafka", node["config"],
    ]
    with (logs / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=node_dir,
        )
    return proc.pid


def up(
    data_dir: Path, brokers: int | None, base_port: int | None, version: str,
    extra: Sequence[str], timeout: float,
) -> str:
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    state = _read_state(data_dir)
    if state is None:
        brokers = 1 if brokers is None else brokers
        if brokers < 1:
            raise KafkaLocalError("--brokers must be at least 1")
        if any(data_dir.iterdir()):
            raise KafkaLocalError(
                f"{data_dir} is not empty and holds no {STATE_FILE}: `up` formats only a new "
                "or empty data dir (or restarts one it made); use another --data-dir"
            )
        base = base_port if base_port is not None else pick_base(brokers)
        state = {
            "version": version,
            "cluster_id": random_cluster_id(),
            "base_port": base,
            "bootstrap": ",".join(f"127.0.0.1:{base + i}" for i in range(brokers)),
            "nodes": [
                {
                    "node_id": i,
                    "port": base + i - 1,
                    "controller_port": base + CONTROLLER_PORT_OFFSET + i - 1,
                    "config": str(data_dir / f"node-{i}" / "server.properties"),
                    "pid": None,
                }
                for i in range(1, brokers + 1)
            ],
        }
        fresh = True
    else:
        # Restarting in a data dir that `up` made: same version, ports and cluster id; only
        # the nodes that are not running start (e.g. after `down --node`).
        if brokers is None:
            brokers = len(state["nodes"])
        if len(state["nodes"]) != brokers:
            raise KafkaLocalError(
                f"{data_dir} holds a {len(state['nodes'])}-node cluster; use that --brokers "
                "or another --data-dir"
            )
        fresh = False
    vdir = fetch(state["version"])
    to_start = [n for n in state["nodes"] if not _running(n)]
    if not to_start:
        _log(f"all {brokers} nodes already run in {data_dir}")
        return str(state["bootstrap"])
    for node in to_start:
        for port, what in ((node["port"], "PLAINTEXT"), (node["controller_port"], "CONTROLLER")):
            try:
                check_port_free("127.0.0.1", port, f"Kafka node {node['node_id']} {what}")
            except PortInUseError as exc:
                raise KafkaLocalError(str(exc)) from exc
    if fresh:
        try:
            for node in state["nodes"]:
                config = Path(node["config"])
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(server_properties(
                    node["node_id"], brokers, state["base_port"], data_dir, extra))
                _format(vdir, config, state["cluster_id"])
        except KafkaLocalError:
            # Leave the dir empty again, so that a corrected `up` can format it.
            for node in state["nodes"]:
                shutil.rmtree(Path(node["config"]).parent, ignore_errors=True)
            raise
    _log(f"starting {len(to_start)} Kafka {state['version']} node(s) in {data_dir}")
    for node in to_start:
        node["pid"] = _start_node(vdir, node)
    _write_state(data_dir, state)
    try:
        _wait_ready(state, brokers, timeout, {n["node_id"] for n in to_start})
    except KafkaLocalError:
        _stop(data_dir, state, [n["node_id"] for n in to_start], grace=5.0)
        raise
    return str(state["bootstrap"])


def _wait_ready(
    state: dict[str, Any], brokers: int, timeout: float, started: set[int]
) -> None:
    deadline = time.monotonic() + timeout
    pending = {n["node_id"] for n in state["nodes"]}
    last = ""
    while pending:
        for node in state["nodes"]:
            if node["node_id"] not in pending:
                continue
            # A node this call started is its child: waitpid says for sure whether (and
            # how) it ended. Nodes that ran before are checked by PID and command line.
            if node["node_id"] in started:
                ended = child_exit_status(node["pid"])
            else:
                ended = None if _running(node) else "is gone"
            if ended is not None:
                logs = Path(node["config"]).parent / "logs"
                raise KafkaLocalError(
                    f"Kafka node {node['node_id']} {ended} while starting; stdout.log:\n"
                    f"{_tail(logs / 'stdout.log')}\nserver.log:\n{_tail(logs / 'server.log')}"
                )
            try:
                cluster, live = metadata_brokers("127.0.0.1", node["port"])
            except (OSError, struct.error) as exc:
                last = f"node {node['node_id']}: {exc}"
                continue
            if cluster != state["cluster_id"]:
                raise KafkaLocalError(
                    f"127.0.0.1:{node['port']} answers for cluster {cluster}, not "
                    f"{state['cluster_id']}: another Kafka on that port?"
                )
            if live >= brokers:
                pending.discard(node["node_id"])
            else:
                last = f"node {node['node_id']} sees {live}/{brokers} live brokers"
        if pending and time.monotonic() >= deadline:
            raise KafkaLocalError(
                f"Kafka not ready within {timeout:.0f}s ({last}); logs in "
                f"<data-dir>/node-N/logs"
            )
        if pending:
            time.sleep(0.25)


# --- down ----------------------------------------------------------------------------------


def _stop(
    data_dir: Path, state: dict[str, Any], node_ids: Sequence[int], grace: float
) -> tuple[list[int], list[int]]:
    """Stop the chosen nodes; return (stopped node ids, those of them that needed SIGKILL).

    SIGTERM goes to every chosen node at once, so each broker's controlled shutdown runs
    while the controller quorum is still there. A combined node whose broker has not
    finished when the other nodes' controllers are gone waits for a grant that can no
    longer be committed (Kafka gives it minutes), so once fewer than a majority of the
    cluster's nodes run, the rest get QUORUM_LOST_GRACE seconds, then SIGKILL; otherwise
    SIGKILL comes after ``grace``. Each signal goes only to a PID whose command line
    still holds the node's server.properties path (PIDs are recycled)."""
    nodes = [n for n in state["nodes"] if n["node_id"] in node_ids and _running(n)]
    for node in nodes:
        _signal(node, signal.SIGTERM)
    majority = len(state["nodes"]) // 2 + 1
    deadline = time.monotonic() + grace
    quorum_lost: float | None = None
    killed: list[int] = []
    pending = list(nodes)
    while pending:
        pending = [n for n in pending if _running(n)]
        now = time.monotonic()
        if quorum_lost is None and sum(_running(n) for n in state["nodes"]) < majority:
            quorum_lost = now
        overdue = now >= deadline or (
            quorum_lost is not None and now - quorum_lost >= QUORUM_LOST_GRACE
        )
        if pending and overdue:
            for node in pending:
                if node["node_id"] not in killed and _signal(node, signal.SIGKILL):
                    killed.append(node["node_id"])
            if now >= deadline + 10.0:
                raise KafkaLocalError(
                    f"node(s) {[n['node_id'] for n in pending]} survived SIGKILL for 10s")
        if pending:
            time.sleep(0.1)
    for node in state["nodes"]:
        if node["node_id"] in node_ids:
            node["pid"] = None
    _write_state(data_dir, state)
    return [n["node_id"] for n in nodes], killed


def _signal(node: dict[str, Any], sig: signal.Signals) -> bool:
    if not _running(node):
        return False
    try:
        os.kill(node["pid"], sig)
    except ProcessLookupError:
        return False
    return True


def down(
    data_dir: Path, node_ids: Sequence[int] | None, grace: float
) -> tuple[list[int], list[int]]:
    data_dir = data_dir.resolve()
    state = _read_state(data_dir)
    if state is None:
        raise KafkaLocalError(f"no {STATE_FILE} in {data_dir}: nothing that `up` started")
    ids = list(node_ids) if node_ids else [n["node_id"] for n in state["nodes"]]
    return _stop(data_dir, state, ids, grace)


def status(data_dir: Path) -> tuple[dict[str, Any], dict[int, bool]]:
    state = _read_state(data_dir.resolve())
    if state is None:
        raise KafkaLocalError(f"no {STATE_FILE} in {data_dir}")
    return state, {n["node_id"]: _running(n) for n in state["nodes"]}


# --- command line ------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka_local", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch", help="resolve the Kafka jars into the cache (idempotent)")
    p.add_argument("--version", default=default_version())
    p = sub.add_parser("classpath", help="print the java -cp value (fetches first)")
    p.add_argument("--version", default=default_version())
    p = sub.add_parser("up", help="format and start N combined KRaft nodes; print bootstrap")
    p.add_argument("--brokers", type=int, default=None,
                   help="nodes (default 1; on a data dir `up` made: its node count)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--base-port", type=int, default=None,
                   help="node i listens on P+i-1, its controller on P+100+i-1 (default: "
                   "a random free P)")
    p.add_argument("--version", default=default_version())
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="extra server.properties line for every node (repeatable; only "
                   "when the data dir is new)")
    p.add_argument("--timeout", type=float, default=120.0)
    p = sub.add_parser("down", help="stop exactly the nodes `up` started")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--node", type=int, action="append", default=None,
                   help="stop only this node id (repeatable); `up` restarts it")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds after SIGTERM before SIGKILL")
    p = sub.add_parser("status", help="the recorded nodes and whether they run")
    p.add_argument("--data-dir", type=Path, required=True)
    sub.add_parser("tool", help="tool CLASS ARGS...: run a Kafka tools class "
                   "(e.g. org.apache.kafka.tools.ProducerPerformance)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list[:1] == ["tool"]:
            # Everything after the class goes to the tool untouched (--help included).
            if len(args_list) < 2:
                print("usage: kafka_local tool CLASS [ARGS...]", file=sys.stderr)
                return 2
            vdir = fetch(default_version())
            command = tool_command(vdir, args_list[1], args_list[2:])
            sys.stdout.flush()
            os.execv(command[0], command)
        args = _parser().parse_args(args_list)
        if args.command == "fetch":
            print(fetch(args.version))
        elif args.command == "classpath":
            print(classpath(fetch(args.version)))
        elif args.command == "up":
            for line in args.config:
                if "=" not in line:
                    raise KafkaLocalError(f"--config {line!r}: expected KEY=VALUE")
            print(up(args.data_dir, args.brokers, args.base_port, args.version, args.config,
                     args.timeout))
        elif args.command == "down":
            stopped, killed = down(args.data_dir, args.node, args.grace)
            note = f" (SIGKILL: {killed})" if killed else ""
            _log(f"stopped node(s) {stopped or 'none (none was running)'}{note}")
        elif args.command == "status":
            state, alive = status(args.data_dir)
            print(f"Kafka {state['version']} cluster {state['cluster_id']} "
                  f"bootstrap {state['bootstrap']}")
            for node in state["nodes"]:
                word = "running" if alive[node["node_id"]] else "stopped"
                print(f"node {node['node_id']} pid {node['pid']} port {node['port']} {word}")
            return 0 if all(alive.values()) else 1
    except KafkaLocalError as exc:
        _log(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
