"""Spark sessions the project starts stay on the loopback; a user's own address wins.

The machine's hostname may resolve to 127.0.0.1 while it also has an external interface;
Spark then binds the driver (RPC endpoint, block manager) to the external address. Here
the JVM's listening sockets are read from /proc (its socket inodes matched against
/proc/net/tcp and tcp6), so a session bound elsewhere fails even if its conf looked right.

One JVM for the module (Spark keeps it for the life of the process): the tier job's
session (``strata tier run``) is a ``local[2]`` session started through
``strata_spark.spark_session``; the user-address test stops it and starts a session with
``spark.driver.host``/``bindAddress`` 127.0.0.2 in the same JVM (still the loopback
network, so no traffic leaves the machine). Each test obtains the session it needs, so
the order does not matter. Where the user's choice is an environment variable or a file
Spark reads at launch, ``loopback_defaults`` is checked directly (no second JVM). So is
the quiet start's filter; a start that fails (an unresolvable package: Ivy gives up
before Spark starts) runs in a subprocess and must print everything the JVM said.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata_spark import (
    LOOPBACK,
    REPO_CONF_DIR,
    is_startup_noise,
    loopback_defaults,
    spark_session,
)

pytestmark = pytest.mark.system

PINNED = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}
#: Another loopback address: a user's choice that is not ours, reachable only locally.
USER_ADDRESS = "127.0.0.2"


# -- the rule (no JVM) ---------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    return {"SPARK_CONF_DIR": str(REPO_CONF_DIR), **extra}


def test_a_local_session_is_pinned_to_the_loopback() -> None:
    assert loopback_defaults(None, _env()) == PINNED
    assert loopback_defaults({"spark.sql.shuffle.partitions": "2"}, _env()) == PINNED
    # A local master named by the caller counts too, whatever the defaults file says.
    assert loopback_defaults({"spark.master": "local[*]"}, _env()) == PINNED
    assert loopback_defaults({"spark.master": "local-cluster[2,1,1024]"}, _env()) == PINNED


@pytest.mark.parametrize("conf", [
    {"spark.driver.host": "10.1.2.3"},
    {"spark.driver.bindAddress": "0.0.0.0"},
    {"spark.master": "spark://10.1.2.3:7077"},
    {"spark.master": "yarn"},
    {"spark.remote": "sc://10.1.2.3"},
], ids=lambda c: "-".join(c))
def test_the_users_conf_wins(conf: dict[str, str]) -> None:
    assert loopback_defaults(conf, _env()) == {}


@pytest.mark.parametrize("env", [
    {"SPARK_LOCAL_IP": "10.1.2.3"},
    {"SPARK_LOCAL_HOSTNAME": "driver.example"},
    {"SPARK_REMOTE": "sc://10.1.2.3"},
    {"MASTER": "spark://10.1.2.3:7077", "SPARK_CONF_DIR": "/nonexistent"},
    {"PYSPARK_SUBMIT_ARGS": "--master spark://10.1.2.3:7077 pyspark-shell"},
    {"PYSPARK_SUBMIT_ARGS": "--conf spark.driver.host=10.1.2.3 pyspark-shell"},
], ids=lambda e: "-".join(e))
def test_the_users_environment_wins(env: dict[str, str]) -> None:
    assert loopback_defaults(None, _env(**env)) == {}


@pytest.mark.parametrize(("name", "text"), [
    ("spark-defaults.conf", "spark.master   spark://10.1.2.3:7077\n"),
    ("spark-defaults.conf", "# a comment\nspark.driver.host=10.1.2.3\n"),
    ("spark-defaults.conf", "spark.driver.bindAddress 0.0.0.0\n"),
    ("spark-env.sh", "#!/usr/bin/env bash\nexport SPARK_LOCAL_IP=10.1.2.3\n"),
])
def test_the_users_conf_dir_wins(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / "spark-defaults.conf").write_text("spark.master local[2]\n")
    assert loopback_defaults(None, {"SPARK_CONF_DIR": str(tmp_path)}) == PINNED
    (tmp_path / name).write_text(text)
    assert loopback_defaults(None, {"SPARK_CONF_DIR": str(tmp_path)}) == {}


def test_startup_noise_is_only_ivy_and_the_jdk_notice() -> None:
    noise = [":: loading settings :: file = /repo/conf/ivysettings.xml",
             "Ivy Default Cache set to: /root/.ivy2.5.2/cache",
             "The jars for the packages stored in: /root/.ivy2.5.2/jars",
             "io.delta#delta-spark_4.2_2.13 added as a dependency",
             ":: resolving dependencies :: org.apache.spark#spark-submit-parent-1;1.0",
             "\tconfs: [default]",
             "\tfound io.delta#delta-storage;4.4.0 in local-m2-cache",
             ":: resolution report :: resolve 873ms :: artifacts dl 33ms",
             "\t---------------------------------------------------------------------",
             "\t|      default     |   31  |   0   |   0   |   0   ||   31  |   0   |",
             "\t0 artifacts copied, 31 already retrieved (0kB/8ms)",
             "WARNING: Using incubator modules: jdk.incubator.vector"]
    kept = ["26/11/25 15:07:57 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another",
            "26/11/25 15:07:57 ERROR SparkContext: Error initializing SparkContext.",
            "\tat org.apache.spark.SparkContext.<init>(SparkContext.scala:1)",
            "Exception in thread \"main\" java.lang.RuntimeException: [unresolved dependency]"]
    assert [line for line in noise if not is_startup_noise(line + "\n")] == []
    assert [line for line in kept if is_startup_noise(line + "\n")] == []


def test_strata_spark_is_still_importable_by_its_old_name() -> None:
    """``strata.spark`` (README.md, docs/spark.md before the move) re-exports the helper."""
    import strata.spark
    import strata_spark

    for name in strata.spark.__all__:
        assert getattr(strata.spark, name) is getattr(strata_spark, name), name


def test_a_failed_start_prints_what_the_jvm_said(tmp_path: Path) -> None:
    """The start-up output held back from a successful start is all printed when the start
    fails: here Ivy cannot resolve a package, and its report is what tells the user why."""
    script = ("from strata_spark import spark_session\n"
              "spark_session('strata-test-failed-start', "
              "{'spark.jars.packages': 'io.strata.missing:nothing_2.13:0.0.1'})\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 1, (result.stdout, result.stderr)
    for told in (":: resolving dependencies ::", "UNRESOLVED DEPENDENCIES",
                 "io.strata.missing#nothing_2.13;0.0.1: not found", "JAVA_GATEWAY_EXITED"):
        assert told in result.stderr, result.stderr
    # Ivy's settings line is the JVM's only stdout line here. Twice, in full runs with
    # three Spark modules starting JVMs at once, the JVM wrote nothing to stdout at all
    # (stderr complete); when it writes the line, it must come out on stdout.
    if result.stdout:
        assert ":: loading settings :: file = " in result.stdout, result.stdout


# -- real sessions ---------------------------------------------------------------------------


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed in between
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(ordered)
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            found.add((str(address), int(hex_port, 16)))
    return found


def _bound(session: Any) -> tuple[str, set[tuple[str, int]], tuple[str, int], int]:
    """(driver host, JVM's listening sockets, block manager (host, port), driver port)."""
    sc = session.sparkContext
    pid = int(session._jvm.java.lang.ProcessHandle.current().pid())
    manager = sc._jsc.sc().env().blockManager().blockManagerId()
    return (sc.getConf().get("spark.driver.host"), _listening(pid),
            (str(manager.host()), int(manager.port())), int(sc.getConf().get("spark.driver.port")))


def _stop_active() -> None:
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.fixture(scope="module")
def _one_jvm() -> Iterator[None]:
    """Stops whatever session the module's tests left running."""
    try:
        yield
    finally:
        _stop_active()


@pytest.fixture
def tier_session(_one_jvm: None) -> Any:
    """The tiering job's session (``strata tier run``), started on the module's JVM."""
    from strata_tools.commands.tier import tier_spark_session

    return tier_spark_session()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_the_tier_jobs_session_binds_the_driver_to_the_loopback(tier_session: Any) -> None:
    conf = tier_session.sparkContext.getConf()
    assert conf.get("spark.master") == "local[2]"
    assert conf.get("spark.app.name") == "strata-tier"
    assert (conf.get("spark.driver.host"), conf.get("spark.driver.bindAddress")) == \
        (LOOPBACK, LOOPBACK)
    host, sockets, manager, driver_port = _bound(tier_session)
    assert host == LOOPBACK and manager[0] == LOOPBACK
    # The RPC endpoint and the block manager listen on 127.0.0.1, and nothing of the JVM
    # listens anywhere else (an external address or the wildcard).
    assert {(LOOPBACK, driver_port), (LOOPBACK, manager[1])} <= sockets, sockets
    assert all(ipaddress.ip_address(address).is_loopback for address, _ in sockets), sockets
    # It runs the job's queries (a local session that cannot reach itself would not).
    assert tier_session.range(100).selectExpr("sum(id)").first()[0] == 4950


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_an_address_the_user_sets_wins(_one_jvm: None) -> None:
    _stop_active()
    user = {"spark.driver.host": USER_ADDRESS, "spark.driver.bindAddress": USER_ADDRESS}
    session = spark_session("strata-test-user-address", user)
    try:
        conf = session.sparkContext.getConf()
        assert (conf.get("spark.driver.host"), conf.get("spark.driver.bindAddress")) == \
            (USER_ADDRESS, USER_ADDRESS)
        host, sockets, manager, driver_port = _bound(session)
        assert host == USER_ADDRESS and manager[0] == USER_ADDRESS
        assert {(USER_ADDRESS, driver_port), (USER_ADDRESS, manager[1])} <= sockets, sockets
        assert session.range(10).count() == 10
    finally:
        session.stop()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_local_session_reads_its_package_jars_in_place(tier_session: Any,
                                                         tmp_path: Path) -> None:
    """spark-submit lists each jar of ``spark.jars.packages`` for the executor and for
    PySpark, which would copy all of them into the session's files directory on every
    start (741 MB with the S3A connector). A local session links them instead: the
    directory holds links to Ivy's jars and no copy, Delta's classes still load in the
    executor, a Python worker still starts, and stopping the session removes the links,
    never the jars they point to."""
    from pyspark import SparkFiles
    from pyspark.sql.functions import udf

    root = Path(SparkFiles.getRootDirectory())
    conf = tier_session.sparkContext.getConf()
    packages = [p for p in (conf.get("spark.jars.packages") or "").split(",") if p]
    assert any(p.startswith("io.delta:delta-spark") for p in packages), packages
    entries = sorted(root.iterdir())
    jars = [e for e in entries if e.name.endswith(".jar")]
    delta = [e for e in jars if e.name.startswith("io.delta_delta-spark")]
    assert delta, entries
    copies = [e for e in jars if not e.is_symlink()]
    assert not copies, f"copied into {root}: {[e.name for e in copies]}"
    targets = [e.resolve() for e in jars]
    assert all(t.is_file() and t.parent != root for t in targets), targets
    for key in ("spark.jars", "spark.files", "spark.submit.pyFiles"):
        assert not {str(t) for t in targets} & {
            e.removeprefix("file://") for e in (conf.get(key) or "").split(",")}, key
    # On the Python path (driver and workers): the package jars that hold Python (Delta's
    # has its Python API), not the others, whose directories every import would read.
    # (A process that started several sessions has one entry per session's directory.)
    assert {Path(p).name for p in sys.path if p.endswith(".jar")} == {delta[0].name}

    table = str(tmp_path / "in-place")

    plus_one = udf(lambda x: x + 1, "long")
    worker_jars = udf(lambda _: ",".join(Path(p).name for p in __import__("sys").path
                                         if p.endswith(".jar")), "string")
    # A Python worker, started by the executor, runs the UDFs and reports its path.
    rows = tier_session.range(5).select(plus_one("id").alias("id"),
                                        worker_jars("id").alias("jars"))
    rows.write.format("delta").save(table)
    written = tier_session.read.format("delta").load(table).collect()
    assert sorted(r.id for r in written) == [1, 2, 3, 4, 5]
    package_jars = {e.name for e in jars}  # Spark adds its own spark-core jar: not ours
    assert {frozenset(set(r.jars.split(",")) & package_jars) for r in written} == \
        {frozenset({delta[0].name})}

    tier_session.stop()
    assert not root.exists()
    assert all(t.is_file() for t in targets), "stopping the session removed Ivy's jars"

    # A later session in the same JVM: its own files are kept, the package jars linked.
    mine = tmp_path / "lookup.csv"
    mine.write_text("a,1\n")
    later = spark_session("strata-test-later", {"spark.files": str(mine)})
    try:
        later_root = Path(SparkFiles.getRootDirectory())
        assert later_root != root
        assert Path(SparkFiles.get(mine.name)).read_text() == "a,1\n"
        assert (later_root / delta[0].name).is_symlink()
        assert later.range(3).select(plus_one("id")).count() == 3
    finally:
        later.stop()
