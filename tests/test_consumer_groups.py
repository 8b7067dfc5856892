"""Consumer groups on a real three-broker cluster (issue [7/7], item 5).

Every consumer is a separate process (``python -m strata_tools.perf_groups worker``: the real
``Consumer`` subscribing to a group and committing after each poll) that reports its
assignments, revocations and the offset ranges it processed as JSON lines, so the tests
can SIGKILL and SIGSTOP members like real deployments and still check, from what each
process reported:

* at-least-once: every produced offset was processed by some member;
* exclusivity: no partition is ever owned by two members at the same time, and no
  member processes a partition outside its ownership;
* cooperative-sticky: partitions that do not move are never revoked (no pause);
* a paused member's late commit is refused once it has been fenced;
* a member whose application stops polling (its heartbeats going on) leaves after
  ``max_poll_interval_ms``, its partitions move, its late commit is refused (issue [3.1]);
* the coordinator's broker SIGKILLed: committed offsets survive and the group goes on.

Group-protocol questions the processes cannot answer (member lists, committed offsets,
group epochs) go over the wire to the coordinator, like ``strata group describe``.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from strata.client import Producer
from strata_tools.perf_groups import Worker
from tests.support.cluster import Cluster
from tests.support.waiting import wait_for
from wire.connection import BrokerConnection
from wire.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)
from wire.protocol import (
    ApiKey,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SESSION_MS = 2500


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("groups"), 3, overrides={
            "offsets.topic.num.partitions": "4",
            "group.heartbeat.interval.ms": "200",
            "group.lag.interval.ms": "500"}) as c:
        yield c


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Worker processes a test starts; each is stopped (or killed) by PID at the end."""
    started: list[Worker] = []
    yield started
    for w in started:
        w.signal(signal.SIGCONT)
        w.kill()


def _start(workers: list[Worker], cluster: Cluster, group: str, topic: str,
           *extra: str) -> Worker:
    worker = Worker(["--bootstrap", cluster.bootstrap, "--group", group, "--topic", topic,
                     "--session-timeout-ms", str(SESSION_MS), *extra]).start()
    workers.append(worker)
    return worker


# ----------------------------------------------------------------------------- wire helpers


def _request(cluster: Cluster, api: ApiKey, body: Any, node: int | None = None) -> Any:
    async def go() -> Any:
        if node is None:
            host, port = cluster.bootstrap.split(",")[0].split(":")
        else:
            host, port = "127.0.0.1", str(cluster.brokers[node].port)
        connection = BrokerConnection(host, int(port))
        try:
            await connection.connect(timeout=5)
            return await connection.request(api, body)
        finally:
            await connection.close()
    return asyncio.run(go())


def _coordinator(cluster: Cluster, group: str, not_on: int = -1) -> int:
    """The group's coordinator; ``not_on``: wait until it is another broker (a dead
    broker stays registered, and so the answer, until its ZooKeeper session expires)."""
    def ask() -> FindCoordinatorResponse | None:
        for b, broker in cluster.brokers.items():
            if broker.running:
                try:
                    answer = _request(cluster, ApiKey.FIND_COORDINATOR,
                                      FindCoordinatorRequest(group), node=b)
                except OSError:
                    continue
                assert isinstance(answer, FindCoordinatorResponse)
                return answer
        return None
    found = wait_for(f"a coordinator for {group}", ask,
                     lambda a: a is not None and a.error_code == 0 and a.node_id != not_on, 60)
    assert found is not None
    return found.node_id


def _describe(cluster: Cluster, group: str) -> DescribedGroup:
    node = _coordinator(cluster, group)
    answer = _request(cluster, ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest([group]), node)
    assert isinstance(answer, DescribeGroupsResponse)
    return answer.groups[0]


def _committed(cluster: Cluster, group: str) -> dict[tuple[str, int], int]:
    node = _coordinator(cluster, group)
    answer = _request(cluster, ApiKey.OFFSET_FETCH, OffsetFetchRequest(group), node)
    assert isinstance(answer, OffsetFetchResponse) and answer.error_code == 0, answer
    return {(t.name, p.partition): p.offset for t in answer.topics for p in t.partitions}


#: A coordinator that is moving (its leader changed between FindCoordinator and the
#: request) or still loading: the client asks again, as a consumer would.
_COORDINATOR_MOVING = frozenset({CoordinatorLoadInProgressError.code,
                                 CoordinatorNotAvailableError.code,
                                 NotCoordinatorError.code})


def _committed_after_move(cluster: Cluster, group: str) -> dict[tuple[str, int], int]:
    """``_committed`` for a wait across a coordinator failover: {} while the coordinator
    is still moving (any other error still fails)."""
    node = _coordinator(cluster, group)
    answer = _request(cluster, ApiKey.OFFSET_FETCH, OffsetFetchRequest(group), node)
    assert isinstance(answer, OffsetFetchResponse), answer
    if answer.error_code in _COORDINATOR_MOVING:
        return {}
    assert answer.error_code == 0, answer
    return {(t.name, p.partition): p.offset for t in answer.topics for p in t.partitions}


# ----------------------------------------------------------------------------- checks


class Load:
    """A producer writing numbered records to every partition until stopped."""

    def __init__(self, cluster: Cluster, topic: str, partitions: int, rate: int = 400) -> None:
        self.producer = Producer(cluster.bootstrap, acks="all", linger_ms=5)
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.acked: dict[int, int] = {}  # partition -> highest acknowledged offset
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            futures = [self.producer.send(self.topic, str(n + p).encode(), partition=p)
                       for p in range(self.partitions)]
            n += self.partitions
            for future in futures:
                try:
                    meta = future.result(30)
                except Exception:  # a failover: the record may or may not be there
                    continue
                self.acked[meta.partition] = max(self.acked.get(meta.partition, -1),
                                                 meta.offset)
            time.sleep(self.partitions / self.rate)

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join(60)
        self.producer.close()
        return dict(self.acked)


def _processed(workers: list[Worker]) -> dict[tuple[str, int], set[int]]:
    seen: dict[tuple[str, int], set[int]] = {}
    for w in workers:
        for event in w.snapshot():
            if event["ev"] == "records":
                for t, p, first, last, _count in event["ranges"]:
                    seen.setdefault((t, p), set()).update(range(first, last + 1))
    return seen


def _ownership(workers: list[Worker]) -> dict[tuple[str, int], list[tuple[float, float, int]]]:
    """Per partition: (from, to, pid) intervals of ownership as the members reported them
    (a SIGKILLed member's interval ends at its death: the caller passes ``deaths``)."""
    intervals: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for w in workers:
        since: dict[tuple[str, int], float] = {}
        for event in w.snapshot():
            tps = [(t, p) for t, p in event.get("tps", [])]
            if event["ev"] == "assign":
                for tp in tps:
                    since[tp] = event["t"]
            elif event["ev"] in ("revoke", "lost"):
                for tp in tps:
                    if tp in since:
                        intervals.setdefault(tp, []).append((since.pop(tp), event["t"], w.pid))
        end = getattr(w, "died_at", None) or time.time()
        for tp, start in since.items():
            intervals.setdefault(tp, []).append((start, end, w.pid))
    return intervals


def _check_exclusive(workers: list[Worker]) -> None:
    for tp, spans in _ownership(workers).items():
        spans.sort()
        for (_a0, a1, pa), (b0, _b1, pb) in itertools.pairwise(spans):
            assert a1 <= b0, f"{tp} owned by {pa} until {a1:.3f} and by {pb} from {b0:.3f}"
    owned_at: dict[int, dict[tuple[str, int], list[tuple[float, float, int]]]] = {}
    for tp, spans in _ownership(workers).items():
        for span in spans:
            owned_at.setdefault(span[2], {}).setdefault(tp, []).append(span)
    for w in workers:
        for event in w.snapshot():
            if event["ev"] != "records":
                continue
            for t, p, first, _last, _count in event["ranges"]:
                spans = owned_at.get(w.pid, {}).get((t, p), [])
                assert any(s0 <= event["t"] <= s1 for s0, s1, _ in spans), \
                    f"{w.pid} processed {t}-{p}@{first} at {event['t']:.3f} without owning it"


def _settled(workers: list[Worker], topic: str, partitions: int) -> bool:
    live = [w for w in workers if w.process is not None and w.process.poll() is None]
    owned = [w.owned() for w in live]
    return sum(len(o) for o in owned) == partitions and \
        set().union(*owned) == {(topic, p) for p in range(partitions)} and all(owned)


def _wait_settled(workers: list[Worker], topic: str, partitions: int, what: str) -> None:
    wait_for(what, lambda: [sorted(w.owned()) for w in workers],
             lambda _: _settled(workers, topic, partitions), 60)


def _wait_stable(cluster: Cluster, group: str, workers: list[Worker], members: int) -> None:
    """Until the coordinator calls the group Stable with ``members`` members and every
    live worker holds exactly what the coordinator assigned it (a transient split such
    as 2,3,2,1 while donors revoke one after another does not count)."""
    def probe() -> tuple[str, list[list[tuple[str, int]]], list[list[tuple[str, int]]]]:
        described = _describe(cluster, group)
        assigned = sorted(sorted((t.topic, p) for t in m.assignment for p in t.partitions)
                          for m in described.members)
        live = [w for w in workers if w.process is not None and w.process.poll() is None]
        return described.state, assigned, sorted(sorted(w.owned()) for w in live)
    wait_for(f"group {group} stable with {members} members", probe,
             lambda v: v[0] == "Stable" and len(v[1]) == members and v[1] == v[2], 60)


def _wait_processed(workers: list[Worker], topic: str, acked: dict[int, int]) -> None:
    def missing() -> dict[int, int]:
        seen = _processed(workers)
        return {p: len(set(range(end + 1)) - seen.get((topic, p), set()))
                for p, end in acked.items() if len(seen.get((topic, p), ())) <= end}
    wait_for("every acknowledged record processed", missing, lambda m: not m, 60)


# ----------------------------------------------------------------------------- tests


def test_two_groups_read_the_same_topic_independently(cluster: Cluster,
                                                      workers: list[Worker]) -> None:
    cluster.create_topic("fanout", 4, 3)
    with Producer(cluster.bootstrap, acks="all") as producer:
        metas = [producer.send("fanout", f"r{i}".encode(), partition=i % 4) for i in range(400)]
        ends = {}
        for f in metas:
            m = f.result(30)
            ends[m.partition] = max(ends.get(m.partition, -1), m.offset)
    a = [_start(workers, cluster, "fan-a", "fanout") for _ in range(2)]
    b = [_start(workers, cluster, "fan-b", "fanout")]
    for group in (a, b):
        _wait_processed(group, "fanout", ends)
        seen = _processed(group)
        assert {tp: len(s) for tp, s in seen.items()} == \
            {("fanout", p): end + 1 for p, end in ends.items()}
    _wait_settled(a, "fanout", 4, "group fan-a to settle")
    assert all(len(w.owned()) == 2 for w in a)
    assert b[0].owned() == {("fanout", p) for p in range(4)}
    committed_a = wait_for("fan-a's commits", lambda: _committed(cluster, "fan-a"),
                           lambda c: c == {("fanout", p): e + 1 for p, e in ends.items()}, 30)
    assert committed_a == _committed(cluster, "fan-b")


def test_scale_1_4_2_while_producing_cooperative(cluster: Cluster, workers: list[Worker]
                                                 ) -> None:
    cluster.create_topic("scale", 8, 3)
    load = Load(cluster, "scale", 8)
    try:
        first = _start(workers, cluster, "scalers", "scale")
        _wait_settled(workers, "scale", 8, "one member owning all 8 partitions")
        time.sleep(0.5)
        before = first.owned()
        for _ in range(3):
            _start(workers, cluster, "scalers", "scale")
        _wait_stable(cluster, "scalers", workers, 4)
        assert [len(w.owned()) for w in workers] == [2, 2, 2, 2]
        # The rebalance, as the members saw it: from the first assignment of a newcomer
        # to the last one.
        joins = [e["t"] for w in workers[1:] for e in w.snapshot() if e["ev"] == "assign"]
        t_join, t_done = min(joins), max(joins)
        kept = first.owned()
        assert kept < before
        # The partitions the first member kept were never revoked: no pause for them.
        revoked = {(t, p) for e in first.snapshot() if e["ev"] == "revoke"
                   for t, p in e["tps"]}
        assert not (kept & revoked), f"unmoved partitions {kept & revoked} were revoked"
        gaps = []
        for tp in kept:
            times = sorted(e["t"] for e in first.snapshot() if e["ev"] == "records"
                           and any((t, p) == tp for t, p, *_ in e["ranges"]))
            window = [t for t in times if t_join - 1 <= t <= t_done + 2]
            gaps.append(max((b - a for a, b in itertools.pairwise(window)),
                            default=99.0))
        print(f"unmoved partitions {sorted(kept)}: longest gap between deliveries during "
              f"the rebalance {max(gaps):.3f} s")
        assert max(gaps) < 3.0
        time.sleep(0.5)
        for w in workers[2:]:
            w.stop()
        _wait_stable(cluster, "scalers", workers[:2], 2)
        time.sleep(0.5)
    finally:
        acked = load.stop()
    _wait_processed(workers, "scale", acked)
    _check_exclusive(workers)
    assert len(acked) == 8 and min(acked.values()) > 50


def test_range_assignor_revokes_everything_on_a_join(cluster: Cluster,
                                                     workers: list[Worker]) -> None:
    cluster.create_topic("eager", 4, 3)
    first = _start(workers, cluster, "rangers", "eager", "--assignor", "range")
    _wait_settled(workers, "eager", 4, "one range member owning everything")
    _start(workers, cluster, "rangers", "eager", "--assignor", "range")
    _wait_settled(workers, "eager", 4, "two range members")
    revoked = {(t, p) for e in first.snapshot() if e["ev"] == "revoke" for t, p in e["tps"]}
    assert revoked == {("eager", p) for p in range(4)}  # eager: even the ones it keeps
    assert len(first.owned()) == 2
    assert _describe(cluster, "rangers").assignor == "range"
    _check_exclusive(workers)


def test_killed_consumer_partitions_move_after_session_timeout(cluster: Cluster,
                                                               workers: list[Worker]) -> None:
    cluster.create_topic("crash", 4, 3)
    load = Load(cluster, "crash", 4)
    try:
        victim = _start(workers, cluster, "crashers", "crash")
        survivor = _start(workers, cluster, "crashers", "crash")
        _wait_settled(workers, "crash", 4, "two members")
        lost = victim.owned()
        victim.kill()
        died = time.time()
        victim.died_at = died  # type: ignore[attr-defined]
        wait_for("the survivor owning everything", survivor.owned,
                 lambda o: o == {("crash", p) for p in range(4)}, 30)
        took = min(e["t"] for e in survivor.snapshot() if e["ev"] == "assign"
                   and {(t, p) for t, p in e["tps"]} & lost and e["t"] > died) - died
        print(f"partitions of the SIGKILLed member moved after {took:.2f} s "
              f"(session timeout {SESSION_MS} ms)")
        assert SESSION_MS / 1000 * 0.8 <= took <= SESSION_MS / 1000 + 10
        time.sleep(0.5)
    finally:
        acked = load.stop()
    _wait_processed(workers, "crash", acked)
    _check_exclusive(workers)


def test_paused_consumer_late_commit_is_refused(cluster: Cluster, workers: list[Worker]
                                                ) -> None:
    cluster.create_topic("zombie", 2, 3)
    zombie = _start(workers, cluster, "zombies", "zombie")
    _wait_settled(workers, "zombie", 2, "the first member owning both partitions")
    member_id = next(e["member"] for e in zombie.snapshot() if e["ev"] == "assign")
    zombie.signal(signal.SIGSTOP)
    heir = _start(workers, cluster, "zombies", "zombie")
    wait_for("the second member taking over", heir.owned,
             lambda o: o == {("zombie", 0), ("zombie", 1)}, 30)
    assert [m.member_id for m in _describe(cluster, "zombies").members] != [member_id]
    # The paused process wakes up and commits: both the coordinator and its client refuse.
    node = _coordinator(cluster, "zombies")
    answer = _request(cluster, ApiKey.OFFSET_COMMIT, OffsetCommitRequest(
        "zombies", member_id, 1, [OffsetCommitTopic("zombie", [OffsetCommitPartition(0, 777)])]),
        node)
    assert isinstance(answer, OffsetCommitResponse)
    assert answer.topics[0].partitions[0].error_code == 25  # UNKNOWN_MEMBER_ID
    zombie.signal(signal.SIGCONT)
    zombie.send("commit zombie 0 999")
    result = wait_for("the zombie's commit result",
                      lambda: [e for e in zombie.snapshot() if e["ev"] == "commit-result"],
                      lambda r: bool(r), 30)[0]
    assert result["error"] is not None, result
    assert _committed(cluster, "zombies").get(("zombie", 0)) not in (777, 999)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_member_whose_application_stops_polling_leaves_and_its_partitions_move(
        cluster: Cluster, workers: list[Worker], static: bool) -> None:
    """KIP-62 with real member processes: one member's application thread is stuck for
    12 s (a sleep between its poll and its commit; its heartbeat thread runs on). With
    ``max_poll_interval_ms`` 3000 it leaves the group: the other member owns its
    partitions within the interval plus one rebalance (a static member's partitions
    wait for it until its session times out, 5 s, as in Kafka), nothing is lost, and
    the commit it makes when it wakes up is refused, so no committed offset moves back.
    Then its next poll rejoins and the partitions are shared again."""
    topic, group = f"stuck-{int(static)}", f"stuckers-{int(static)}"
    cluster.create_topic(topic, 4, 3)
    extra = ["--max-poll-interval-ms", "3000", "--session-timeout-ms", "5000"]
    load = Load(cluster, topic, 4, rate=100)
    try:
        stuck = _start(workers, cluster, group, topic, *extra,
                       *(["--instance-id", "s1"] if static else []))
        other = _start(workers, cluster, group, topic, *extra,
                       *(["--instance-id", "s2"] if static else []))
        _wait_settled(workers, topic, 4, "two members")
        had = stuck.owned()
        stuck.send("stall 12")
        stall = wait_for("the stall", lambda: [e for e in stuck.snapshot()
                                               if e["ev"] == "stall"], bool, 30)[0]
        wait_for("the other member owning everything", other.owned,
                 lambda o: o == {(topic, p) for p in range(4)}, 30)
        took = min(e["t"] for e in other.snapshot() if e["ev"] == "assign" and
                   {(t, p) for t, p in e["tps"]} & had and e["t"] > stall["t"]) - stall["t"]
        bound = 3.0 + (5.0 if static else 0.0)
        print(f"the stuck member's partitions moved {took:.2f} s after it stopped "
              f"polling (max_poll_interval_ms 3000{', session 5000' if static else ''})")
        assert bound <= took <= bound + 5.0
        before = _committed(cluster, group)
        wait_for("the stuck member waking up", lambda: [e for e in stuck.snapshot()
                                                       if e["ev"] == "stalled"], bool, 30)
        refused = wait_for("its late commit refused", lambda: [
            e for e in stuck.snapshot() if e["ev"] == "commit-failed"], bool, 30)[0]
        assert refused["error"] == 1300, refused  # COMMIT_FAILED, nothing sent
        assert "max_poll_interval_ms" in refused["message"]
        after = _committed(cluster, group)
        assert all(after[tp] >= offset for tp, offset in before.items()), (before, after)
        # Its next poll runs on_lost and rejoins: the partitions are shared again.
        wait_for("the stuck member's on_lost", lambda: [
            e for e in stuck.snapshot() if e["ev"] == "lost"], bool, 30)
        _wait_settled(workers, topic, 4, "both members again")
    finally:
        acked = load.stop()
    _wait_processed(workers, topic, acked)


def test_static_member_restart_within_session_causes_no_rebalance(
        cluster: Cluster, workers: list[Worker]) -> None:
    cluster.create_topic("static", 4, 3)
    one = _start(workers, cluster, "statics", "static", "--instance-id", "i1",
                 "--session-timeout-ms", "8000")
    two = _start(workers, cluster, "statics", "static", "--instance-id", "i2",
                 "--session-timeout-ms", "8000")
    _wait_settled(workers, "static", 4, "two static members")
    time.sleep(0.5)
    epoch = _describe(cluster, "statics").group_epoch
    had = one.owned()
    events_two = len(two.snapshot())
    one.kill()
    workers.remove(one)
    again = _start(workers, cluster, "statics", "static", "--instance-id", "i1",
                   "--session-timeout-ms", "8000")
    wait_for("the restarted static member owning its old partitions", again.owned,
             lambda o: o == had, 30)
    assert _describe(cluster, "statics").group_epoch == epoch
    assert [e["ev"] for e in two.snapshot()[events_two:]
            if e["ev"] in ("assign", "revoke", "lost")] == []


def test_coordinator_sigkill_keeps_offsets_and_the_group(cluster: Cluster,
                                                         workers: list[Worker]) -> None:
    cluster.create_topic("failover", 4, 3)
    load = Load(cluster, "failover", 4)
    victim_id = -1
    try:
        members = [_start(workers, cluster, "survivors", "failover") for _ in range(2)]
        _wait_settled(members, "failover", 4, "two members")
        wait_for("commits", lambda: _committed(cluster, "survivors"),
                 lambda c: len(c) == 4 and min(c.values()) > 20, 30)
        victim_id = _coordinator(cluster, "survivors")
        before = _committed(cluster, "survivors")
        cluster.kill(victim_id)
        _coordinator(cluster, "survivors", not_on=victim_id)
        after = wait_for("offsets from the new coordinator",
                         lambda: _committed_after_move(cluster, "survivors"),
                         lambda c: len(c) == 4, 30)
        assert all(after[tp] >= offset for tp, offset in before.items()), (before, after)
        processed = sum(w.records() for w in members)
        wait_for("the group consuming on", lambda: sum(w.records() for w in members),
                 lambda n: n > processed + 100, 60)
        time.sleep(0.5)
    finally:
        acked = load.stop()
        if victim_id >= 0:
            cluster.restart(victim_id)
    _wait_processed(workers, "failover", acked)
    final = wait_for("final commits", lambda: _committed(cluster, "survivors"),
                     lambda c: all(c.get(("failover", p), -1) == e + 1
                                   for p, e in acked.items()), 30)
    assert len(final) == 4
    _check_exclusive(workers)


def test_lag_metric(cluster: Cluster, workers: list[Worker]) -> None:
    import urllib.request

    cluster.create_topic("lagging", 2, 3)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(50):
            producer.send("lagging", b"x", partition=i % 2)
    _request(cluster, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest("laggards"))
    node = _coordinator(cluster, "laggards")
    answer = _request(cluster, ApiKey.OFFSET_COMMIT, OffsetCommitRequest(
        "laggards", None, -1, [OffsetCommitTopic("lagging", [OffsetCommitPartition(0, 5),
                                                             OffsetCommitPartition(1, 25)])]),
        node)
    assert [p.error_code for p in answer.topics[0].partitions] == [0, 0]
    port = cluster.brokers[node].metrics_port

    def scrape() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        out = {}
        for line in text.decode().splitlines():
            if line.startswith("strata_group_lag_records{") and 'group="laggards"' in line:
                out[line.split('partition="')[1].split('"')[0]] = float(line.split()[-1])
        return out
    assert wait_for("the lag gauge", scrape, lambda m: m == {"0": 20.0, "1": 0.0}, 30)
