"""The group assignors and the coordinator's reconciliation rules, without a broker.

The coordinator itself runs against real brokers in tests/test_consumer_groups.py; here
the pure parts are driven through many random membership histories, which a cluster
test could never cover: every partition has exactly one target owner, no partition is
ever owned by two members, members converge, and cooperative-sticky moves only what it
must.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokers.group_assignors import COOPERATIVE_STICKY, RANGE, assign
from brokers.group_coordinator import Group, GroupCoordinator, Member, coordinator_partition
from brokers.services import MetadataCache

pytestmark = pytest.mark.unit

TOPICS = {"a": 5, "b": 3, "c": 8}


def _check_target(target: dict[str, set[tuple[str, int]]], subs: dict[str, list[str]],
                  counts: dict[str, int]) -> None:
    seen: list[tuple[str, int]] = [tp for tps in target.values() for tp in tps]
    assert len(seen) == len(set(seen)), "a partition has two target owners"
    wanted = {(t, p) for m in subs for t in subs[m] if t in counts for p in range(counts[t])}
    assert set(seen) == wanted
    for member, tps in target.items():
        assert all(t in subs[member] for t, _ in tps)


@given(st.lists(st.sampled_from(sorted(TOPICS)), min_size=1, max_size=3, unique=True),
       st.integers(1, 9), st.sampled_from([RANGE, COOPERATIVE_STICKY]))
@settings(max_examples=60, deadline=None)
def test_homogeneous_subscriptions_are_complete_and_balanced(topics: list[str], n: int,
                                                               assignor: str) -> None:
    members = [f"m{i}" for i in range(n)]
    subs = {m: topics for m in members}
    target = assign(assignor, members, subs, TOPICS, {})
    _check_target(target, subs, TOPICS)
    if assignor == COOPERATIVE_STICKY:
        sizes = [len(target[m]) for m in members]
        assert max(sizes) - min(sizes) <= 1
    else:  # range balances per topic
        for topic in topics:
            sizes = [sum(1 for t, _ in target[m] if t == topic) for m in members]
            assert max(sizes) - min(sizes) <= 1


@given(st.lists(st.lists(st.sampled_from(sorted(TOPICS)), min_size=1, max_size=3,
                         unique=True), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_heterogeneous_subscriptions_get_only_their_topics(subscriptions: list[list[str]]
                                                           ) -> None:
    members = [f"m{i}" for i in range(len(subscriptions))]
    subs = dict(zip(members, subscriptions, strict=True))
    for assignor in (RANGE, COOPERATIVE_STICKY):
        _check_target(assign(assignor, members, subs, TOPICS, {}), subs, TOPICS)


def test_sticky_moves_only_what_the_new_member_takes() -> None:
    members = ["m0", "m1", "m2", "m3"]
    subs = {m: ["t"] for m in [*members, "m4"]}
    before = assign(COOPERATIVE_STICKY, members, subs, {"t": 32}, {})
    after = assign(COOPERATIVE_STICKY, [*members, "m4"], subs, {"t": 32}, before)
    moved = {tp for m in members for tp in before[m] - after[m]}
    assert moved == after["m4"]
    assert len(after["m4"]) == 6  # 32 over 5: 7,7,6,6,6
    # range, by contrast, shifts most partitions to new owners
    r_before = assign(RANGE, members, subs, {"t": 32}, {})
    r_after = assign(RANGE, [*members, "m4"], subs, {"t": 32}, {})
    assert sum(len(r_before[m] - r_after[m]) for m in members) > len(r_after["m4"])


def test_sticky_keeps_partitions_of_a_topic_a_member_still_has() -> None:
    subs = {"m0": ["a", "b"], "m1": ["a", "b"]}
    before = assign(COOPERATIVE_STICKY, ["m0", "m1"], subs, TOPICS, {})
    subs2 = {"m0": ["a", "b"], "m1": ["a"]}
    after = assign(COOPERATIVE_STICKY, ["m0", "m1"], subs2, TOPICS, before)
    _check_target(after, subs2, TOPICS)
    assert {tp for tp in before["m1"] if tp[0] == "a"} <= after["m1"]


def test_unknown_assignor_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown assignor"):
        assign("roundrobin", ["m"], {"m": ["a"]}, TOPICS, {})


def test_coordinator_partition_is_stable() -> None:
    # Clients and tools may compute it: it must never change between builds.
    assert coordinator_partition("orders", 8) == coordinator_partition("orders", 8)
    assert {coordinator_partition(f"g{i}", 8) for i in range(100)} == set(range(8))
    assert coordinator_partition("g", 1) == 0


# ----------------------------------------------------------------------------- reconcile


def _coordinator(counts: dict[str, int]) -> GroupCoordinator:
    """A coordinator whose metadata cache is only a topic table: enough for the
    assignment rules (``_refresh_target``/``_reconcile`` read nothing else)."""
    coordinator = GroupCoordinator.__new__(GroupCoordinator)
    topics = {t: SimpleNamespace(partition_count=n) for t, n in counts.items()}
    coordinator.cluster = MetadataCache(0, topics=topics)  # type: ignore[arg-type]
    return coordinator


def _step(coordinator: GroupCoordinator, group: Group, member: Member) -> None:
    coordinator._refresh_target(group)
    coordinator._reconcile(group, member, 0.0)


def _owners(group: Group) -> dict[tuple[str, int], list[str]]:
    owners: dict[tuple[str, int], list[str]] = {}
    for m in group.members.values():
        for tp in m.owned:
            owners.setdefault(tp, []).append(m.member_id)
    return owners


@pytest.mark.parametrize("assignor", [RANGE, COOPERATIVE_STICKY])
@pytest.mark.parametrize("seed", range(25))
def test_random_histories_never_share_a_partition_and_converge(assignor: str, seed: int
                                                                 ) -> None:
    """Members are separate clients: an answer reaches a client some time after the
    coordinator computed it, and the client applies the latest answer it has only at its
    next poll, heartbeating in between (as the real consumer's background heartbeat
    does). A client reports what it owns plus what its last answer lets it take. At no
    moment may two clients hold one partition."""
    rng = random.Random(seed)
    coordinator = _coordinator({"t": 12, "u": 5})
    group = Group("g", assignor=assignor)
    clients: dict[str, dict[str, set[tuple[str, int]]]] = {}  # id -> owned, answer, inflight
    next_id = 0

    def join() -> None:
        nonlocal next_id
        member = Member(f"m{next_id:02d}", None, "c", rng.choice([["t"], ["t", "u"]]), 10_000,
                        60_000)
        next_id += 1
        group.members[member.member_id] = member
        group.group_epoch += 1
        clients[member.member_id] = {"owned": set(), "answer": set()}

    def check() -> None:
        held: dict[tuple[str, int], str] = {}
        for member_id, client in clients.items():
            for tp in client["owned"]:
                assert tp not in held, f"{tp} held by {held[tp]} and {member_id}"
                held[tp] = member_id

    def heartbeat(member: Member) -> None:
        client = clients[member.member_id]
        reported = client["owned"] | client["answer"]
        member.owned = reported & (member.owned | member.assigned)
        before = set(client["owned"])
        _step(coordinator, group, member)
        # The answer travels back while the client may poll (and apply an older one).
        client["inflight"] = set(member.assigned)
        if assignor == COOPERATIVE_STICKY:
            kept_target = group.target.get(member.member_id, set())
            assert not ((before - member.assigned) & kept_target), \
                "cooperative revoked a partition that stays"

    def deliver(member_id: str) -> None:
        client = clients[member_id]
        if "inflight" in client:
            client["answer"] = client.pop("inflight")

    def poll(member_id: str) -> None:
        clients[member_id]["owned"] = set(clients[member_id]["answer"])
        check()

    for _ in range(3):
        join()
    for _ in range(300):
        action = rng.random()
        if action < 0.05 and len(group.members) < 8:
            join()
        elif action < 0.09 and len(group.members) > 1:
            gone = rng.choice(sorted(group.members))
            coordinator._remove(group, group.members[gone], "left")
            del clients[gone]  # it stopped consuming before it left
        elif action < 0.45:
            heartbeat(group.members[rng.choice(sorted(group.members))])
        elif action < 0.75:
            deliver(rng.choice(sorted(clients)))
        else:
            poll(rng.choice(sorted(clients)))
    for _ in range(8):  # quiet period: everyone converges to the target
        for member_id in sorted(group.members):
            heartbeat(group.members[member_id])
            deliver(member_id)
            poll(member_id)
    for member_id, member in group.members.items():
        assert clients[member_id]["owned"] == member.owned == member.assigned == \
            group.target[member_id]
    assert group.state == "Stable"
    assert set(_owners(group)) == {("t", p) for p in range(12)} | (
        {("u", p) for p in range(5)}
        if any("u" in m.subscribed for m in group.members.values()) else set())


def _member(member_id: str, **kw: Any) -> Member:
    return Member(member_id, kw.pop("instance_id", None), "c", ["t"], 10_000, 60_000, **kw)


def test_eager_revokes_everything_before_anyone_gets_the_new_target() -> None:
    coordinator = _coordinator({"t": 4})
    group = Group("g", assignor=RANGE)
    a = group.members["a"] = _member("a")
    group.group_epoch = 1
    _step(coordinator, group, a)
    a.owned = set(a.assigned)
    assert a.owned == {("t", p) for p in range(4)}
    b = group.members["b"] = _member("b")
    group.group_epoch += 1
    _step(coordinator, group, b)
    assert b.assigned == set()  # a still owns everything: barrier
    _step(coordinator, group, a)
    assert a.assigned == set()  # a must give up even the partitions it keeps
    a.owned = set()
    _step(coordinator, group, a)
    assert a.assigned == {("t", 0), ("t", 1)}
    _step(coordinator, group, b)
    assert b.assigned == {("t", 2), ("t", 3)}


def test_cooperative_hands_over_only_after_the_owner_gave_up() -> None:
    coordinator = _coordinator({"t": 4})
    group = Group("g", assignor=COOPERATIVE_STICKY)
    a = group.members["a"] = _member("a")
    group.group_epoch = 1
    _step(coordinator, group, a)
    a.owned = set(a.assigned)
    b = group.members["b"] = _member("b")
    group.group_epoch += 1
    _step(coordinator, group, b)
    assert b.assigned == set()  # what b targets is still a's
    _step(coordinator, group, a)
    moving = {("t", 0), ("t", 1), ("t", 2), ("t", 3)} - group.target["a"]
    assert a.assigned == group.target["a"] and len(moving) == 2
    _step(coordinator, group, b)
    assert b.assigned == set()  # a has not reported yet
    a.owned = set(a.assigned)
    _step(coordinator, group, a)
    _step(coordinator, group, b)
    assert b.assigned == moving


# ----------------------------------------------------------------------------- large groups


def _sticky_by_scanning(members: list[str], subscriptions: dict[str, list[str]],
                        partition_counts: dict[str, int],
                        previous: dict[str, set[tuple[str, int]]]
                        ) -> dict[str, set[tuple[str, int]]]:
    """The cooperative-sticky rules written as plain scans (the assignor before it was
    indexed for large groups): the reference the indexed one must match exactly."""
    order = {m: i for i, m in enumerate(members)}
    eligible = {m: {t for t in subscriptions[m] if t in partition_counts} for m in members}
    target: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    taken: set[tuple[str, int]] = set()
    for member in members:
        for tp in sorted(previous.get(member, ())):
            if tp[0] in eligible[member] and tp[1] < partition_counts[tp[0]] and \
                    tp not in taken:
                target[member].add(tp)
                taken.add(tp)
    every = sorted((t, p) for t in sorted({t for m in members for t in eligible[m]})
                   for p in range(partition_counts[t]))
    for tp in every:
        candidates = [m for m in members if tp[0] in eligible[m]]
        if tp not in taken and candidates:
            chosen = min(candidates, key=lambda m: (len(target[m]), order[m]))
            target[chosen].add(tp)
            taken.add(tp)
    while True:
        for donor in sorted(members, key=lambda m: (-len(target[m]), order[m])):
            moves = [(tp, m) for tp in sorted(target[donor], reverse=True)
                     for m in members if tp[0] in eligible[m]
                     and len(target[m]) <= len(target[donor]) - 2]
            if moves:
                tp = moves[0][0]
                taker = min((m for t, m in moves if t == tp),
                            key=lambda m: (len(target[m]), order[m]))
                target[donor].discard(tp)
                target[taker].add(tp)
                break
        else:
            return target


@pytest.mark.parametrize("seed", range(400))
def test_indexed_sticky_assignor_matches_the_scanning_rules(seed: int) -> None:
    """Random members (in a shuffled order), subscriptions (some to a missing topic) and
    previous targets (some out of range, some shared, some of departed members)."""
    rng = random.Random(seed)
    counts = {t: rng.randint(1, 12) for t in "abcd"[:rng.randint(1, 4)]}
    members = [f"m{i}" for i in range(rng.randint(1, 9))]
    rng.shuffle(members)
    subs = {m: rng.sample([*sorted(counts), "missing"], rng.randint(1, len(counts)))
            for m in members}
    previous = {m: {(rng.choice(sorted(counts)), rng.randint(0, 14))
                    for _ in range(rng.randint(0, 6))}
                for m in [*members, "departed"] if rng.random() < 0.7}
    assert assign(COOPERATIVE_STICKY, members, subs, counts, previous) == \
        _sticky_by_scanning(members, subs, counts, previous), f"seed {seed}"


def test_sticky_assignor_on_a_large_group_keeps_what_it_can() -> None:
    """1,000 members on 2,000 partitions: a join takes two partitions from the most
    loaded and moves nothing else; a leave hands on only the leaver's partitions."""
    members = [f"m{i:04d}" for i in range(1000)]
    subs = {m: ["t"] for m in [*members, "new"]}
    before = assign(COOPERATIVE_STICKY, members, subs, {"t": 2000}, {})
    assert {len(tps) for tps in before.values()} == {2}
    joined = assign(COOPERATIVE_STICKY, [*members, "new"], subs, {"t": 2000}, before)
    assert sum(len(before[m] - joined[m]) for m in members) == len(joined["new"]) == 1
    left = assign(COOPERATIVE_STICKY, members[1:], subs, {"t": 2000}, before)
    assert sum(len(left[m] - before[m]) for m in members[1:]) == 2
    assert all(before[m] <= left[m] for m in members[1:])
