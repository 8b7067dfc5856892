"""`strata topic reassign|reassignments` and `strata cluster describe|elect-preferred-leaders`
as a user runs them: the CLI as a subprocess against ZooKeeper and three real brokers.

One cluster serves the module (each test uses its own topics); a test that stops or
pauses a broker gets it back in the ``cluster`` fixture's teardown, also when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from strata.client import Producer
from tests.support.cluster import Cluster
from tests.test_cli_client import fails, ok
from tests.test_replication import create_assigned

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def cli(bootstrap: str, *args: str, stdin: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """``strata ARGS --bootstrap BOOTSTRAP`` (``$STRATA_BOOTSTRAP`` unset)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("STRATA_BOOTSTRAP", None)
    return subprocess.run([sys.executable, "-m", "strata_tools.cli", *args,
                           "--bootstrap", bootstrap],
                          input=None if stdin is None else stdin.encode(),
                          capture_output=True, env=env, timeout=timeout, check=False)


def one_line_error(result: subprocess.CompletedProcess[bytes], *words: str) -> str:
    err = fails(result, *words)
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cluster"), brokers=3) as running:
        yield running


@pytest.fixture
def cluster(shared_cluster: Cluster) -> Iterator[Cluster]:
    yield shared_cluster
    for broker_id, broker in shared_cluster.brokers.items():
        if broker.paused:
            shared_cluster.resume(broker_id)
        if not broker.running:
            shared_cluster.restart(broker_id)
    shared_cluster.wait_for("every broker registered again", shared_cluster.live_brokers,
                            lambda live: live == set(shared_cluster.brokers), 60)


def test_reassign_with_wait_copies_the_data_then_switches(cluster: Cluster) -> None:
    create_assigned(cluster, "cli-move", {0: [0, 1]}, {"min.insync.replicas": "1"})
    cluster.wait_until_healthy("cli-move")
    lines = [f"m{i}" for i in range(300)]
    ok(cli(cluster.bootstrap, "produce", "cli-move", "--acks", "all",
           stdin="\n".join(lines) + "\n"))

    out = ok(cli(cluster.bootstrap, "topic", "reassign", "cli-move", "--replicas", "0:2,1",
                 "--wait", "--timeout", "90"))
    assert "cli-move-0: replicas 0,1 -> 2,1" in out
    assert "cli-move-0: done (replicas 2,1" in out
    assert out.rstrip().endswith("Reassignment of cli-move complete.")
    assert cluster.replicas("cli-move") == {0: [2, 1]}
    assert set(cluster.isr_of("cli-move", 0)) == {1, 2}
    assert cluster.leader_of("cli-move", 0) in (1, 2)

    assert "No partition reassignments in progress." in \
        ok(cli(cluster.bootstrap, "topic", "reassignments"))
    described = json.loads(ok(cli(cluster.bootstrap, "topic", "describe", "cli-move",
                                  "--format", "json")))
    assert described["partitions"][0]["replicas"] == [2, 1]
    consumed = ok(cli(cluster.bootstrap, "consume", "cli-move", "--from-beginning",
                      "-n", "300", "--format", "json"))
    assert [json.loads(line)["value"] for line in consumed.splitlines()] == lines
    cluster.wait_for("broker 0's copy deleted",
                     lambda: cluster.partition_dir(0, "cli-move", 0).exists(),
                     lambda exists: not exists, 30)


def test_reassignments_are_listed_while_moving_and_wait_times_out(cluster: Cluster) -> None:
    # The joining broker is frozen (SIGSTOP) so the move cannot finish: it is still
    # registered, so the reassignment is accepted, but it copies nothing until resumed.
    controller = cluster.controller_id()
    joining = next(b for b in sorted(cluster.brokers) if b != controller)
    leaving, kept = [b for b in sorted(cluster.brokers) if b != joining]
    create_assigned(cluster, "cli-slow", {0: [leaving, kept]}, {"min.insync.replicas": "1"})
    cluster.wait_until_healthy("cli-slow")
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(50):
            producer.send("cli-slow", f"s{i}".encode(), partition=0)
        producer.flush()
    reachable = cluster.brokers[kept].bootstrap  # never the frozen broker
    cluster.pause(joining)
    try:
        result = cli(reachable, "topic", "reassign", "cli-slow", "--replicas",
                     f"0:{joining},{kept}", "--wait", "--timeout", "3")
        one_line_error(result, "still moving after 3s", "cli-slow-0",
                       f"waiting for {joining} to copy the log",
                       "continues in the background", "strata topic reassignments")
        assert f"cli-slow-0: replicas {leaving},{kept} -> {joining},{kept}" in \
            result.stdout.decode()
        listed = json.loads(ok(cli(reachable, "topic", "reassignments", "--format", "json")))
        assert [(r["topic"], r["partition"]) for r in listed] == [("cli-slow", 0)]
        assert listed[0]["removing"] == [leaving]
        assert joining in listed[0]["replicas"] or listed[0]["adding"] == [joining]
        assert joining not in listed[0]["isr"]
        text = ok(cli(reachable, "topic", "reassignments"))
        assert "REMOVING" in text and "cli-slow" in text
    finally:
        cluster.resume(joining)
    cluster.wait_for("the move finished", lambda: cluster.replicas("cli-slow"),
                     lambda r: r == {0: [joining, kept]}, 90)
    cluster.wait_for("nothing left to move",
                     lambda: json.loads(ok(cli(reachable, "topic", "reassignments",
                                               "--format", "json"))),
                     lambda listed: listed == [], 30)
    # Asking again for the state it is in now completes at once.
    out = ok(cli(cluster.bootstrap, "topic", "reassign", "cli-slow", "--replicas",
                 f"0:{joining},{kept}", "--wait", "--timeout", "60", "--format", "json"))
    assert json.loads(out) == {"topic": "cli-slow", "complete": True, "partitions": [
        {"partition": 0, "from": [joining, kept], "to": [joining, kept]}]}


def test_elect_preferred_leaders_moves_leadership_back(cluster: Cluster) -> None:
    create_assigned(cluster, "cli-pref", {0: [0, 1, 2], 1: [1, 2, 0]})
    cluster.wait_until_healthy("cli-pref")
    cluster.stop(0)
    cluster.wait_for("p0 led by another broker", lambda: cluster.leader_of("cli-pref", 0),
                     lambda leader: leader in (1, 2), 30)
    # Broker 0 is down: its partition cannot move back; the command says so and exits 1.
    result = cli(cluster.bootstrap, "cluster", "elect-preferred-leaders",
                 "--topic", "cli-pref", "--partition", "0")
    one_line_error(result, "1 partition(s) not led by their preferred replica",
                   "cli-pref-0", "preferred replica 0 is not alive or not in sync")
    assert "not moved" in result.stdout.decode()

    cluster.restart(0)
    cluster.wait_for("broker 0 in sync again", lambda: cluster.isr_of("cli-pref", 0),
                     lambda isr: 0 in isr, 40)
    interim = cluster.leader_of("cli-pref", 0)
    assert interim != 0  # no automatic move back
    out = ok(cli(cluster.bootstrap, "cluster", "elect-preferred-leaders", "--topic", "cli-pref"))
    rows = {line.split()[1]: line for line in out.splitlines()
            if line.startswith("cli-pref ")}
    assert f"moved (was {interim})" in rows["0"] and rows["0"].split()[3] == "0"
    assert "unchanged: already led by its preferred replica" in rows["1"]
    assert "1 moved to their preferred replica, 1 already there, 0 could not move." in out
    assert cluster.leader_of("cli-pref", 0) == 0

    again = json.loads(ok(cli(cluster.bootstrap, "cluster", "elect-preferred-leaders",
                              "--topic", "cli-pref", "--partition", "1", "--format", "json")))
    assert again == [{"topic": "cli-pref", "partition": 1, "preferred": 1,
                      "previous_leader": 1, "leader": 1, "moved": False,
                      "preferred_leads": True, "message": None}]


def test_cluster_describe_shows_the_controller(cluster: Cluster) -> None:
    controller = cluster.controller_id()
    assert controller is not None
    out = ok(cli(cluster.bootstrap, "cluster", "describe"))
    address = cluster.brokers[controller].bootstrap
    assert f"Controller: broker {controller} ({address})" in out
    assert "Live brokers: 3" in out
    described = json.loads(ok(cli(cluster.bootstrap, "cluster", "describe", "--format", "json")))
    assert described["controller_id"] == controller
    assert described["cluster_id"]
    assert [b["id"] for b in described["brokers"]] == [0, 1, 2]
    assert {f"{b['host']}:{b['port']}" for b in described["brokers"]} == \
        set(cluster.bootstrap.split(","))


def test_bad_input_exits_1_with_one_line_and_changes_nothing(cluster: Cluster) -> None:
    create_assigned(cluster, "cli-bad", {0: [0, 1], 1: [1, 2]})
    before = cluster.replicas("cli-bad")
    boot = cluster.bootstrap
    syntax = "expects PARTITION:BROKER[,BROKER...]"
    cases: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
        (("--replicas", "0"), (syntax, "'0'")),
        (("--replicas", "0:"), (syntax,)),
        (("--replicas", "x:1"), (syntax, "'x:1'")),
        (("--replicas", "0:1,,2"), (syntax,)),
        (("--replicas", "0:-1"), (syntax,)),
        (("--replicas", "0:2,1", "--replicas", "1:1,b"), (syntax, "'1:1,b'")),
        (("--replicas", "0:1,1"), ("broker 1 is listed twice",)),
        (("--replicas", "0:2,1", "--replicas", "0:1,2"), ("gives partition 0 twice",)),
        (("--replicas", "0:9,1"), ("broker 9 is not live", "live brokers: 0,1,2")),
        # One valid partition and one invalid one: nothing is written.
        (("--replicas", "0:2,1", "--replicas", "1:0,9"), ("broker 9 is not live",)),
        (("--replicas", "5:1"), ("topic cli-bad has no partition 5", "partitions 0-1")),
        (("--replicas", "0:2,1", "--timeout", "5"), ("--timeout only applies to --wait",)),
        (("--replicas", "0:2,1", "--wait", "--timeout", "0"), ("--timeout expects",)),
        (("--replicas", "0:2,1", "--wait", "--timeout", "soon"), ("--timeout expects",)),
    ]
    elect = ("cluster", "elect-preferred-leaders")
    runs: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
        (("topic", "reassign", "cli-bad", *args), words) for args, words in cases]
    runs += [
        (("topic", "reassign", "cli-nope", "--replicas", "0:1"),
         ("UNKNOWN_TOPIC_OR_PARTITION", "cli-nope")),
        ((*elect, "--partition", "0"), ("--partition needs --topic",)),
        ((*elect, "--topic", "cli-nope"), ("UNKNOWN_TOPIC_OR_PARTITION",)),
        ((*elect, "--topic", "cli-bad", "--partition", "7"),
         ("topic cli-bad has no partition 7",)),
        ((*elect, "--topic", "cli-bad", "--partition", "x"),
         ("--partition expects a partition number",)),
    ]
    # Every command is refused and changes nothing, so they may run side by side (each
    # is a process start; one after another they took most of this test's time).
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda run: cli(boot, *run[0]), runs))
    for (_, words), result in zip(runs, results, strict=True):
        one_line_error(result, *words)

    # A broker that exists but is down.
    cluster.stop(2)
    cluster.wait_for("broker 2 unregistered", cluster.live_brokers,
                     lambda live: 2 not in live, 30)
    one_line_error(cli(boot, "topic", "reassign", "cli-bad", "--replicas", "0:2,1"),
                   "broker 2 is not live", "live brokers: 0,1")

    assert cluster.replicas("cli-bad") == before
    listed = json.loads(ok(cli(boot, "topic", "reassignments", "--format", "json")))
    assert [r for r in listed if r["topic"] == "cli-bad"] == []
