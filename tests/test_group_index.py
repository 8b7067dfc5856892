"""The coordinator's incremental bookkeeping for large groups, in process (no broker).

A heartbeat must cost O(what changed), not O(members) or O(partitions): the coordinator
keeps an index of who holds each partition, notes what each request changed (to write
and, on a failed store, undo exactly that), recomputes the target only when membership
changes, and stores the changes of many requests with one write. These tests drive the
real ``GroupCoordinator`` request paths against a fake ``__consumer_offsets`` write and
check, after every step of random histories, that

* the index equals the same thing computed from scratch over all members;
* what was written, replayed into an empty coordinator (as a failover does), equals
  what the coordinator has in memory: nothing changed without being stored;
* a failed write leaves the group exactly as it was before the requests of that round;
* no partition is ever owned or assigned by two members.

And with counted calls (never time): a heartbeat of a stable member in a large group
touches no other member and runs no assignor.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry

import brokers.group_coordinator as gc
from brokers.group_assignors import COOPERATIVE_STICKY, RANGE, assign
from brokers.group_coordinator import Group, GroupCoordinator, Member, _Shard
from brokers.services import MetadataCache, PartitionRegistry
from wire.errors import NotEnoughReplicasError
from wire.protocol import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    GroupTopicPartitions,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    group_by_topic,
    group_topic_partitions,
)

pytestmark = pytest.mark.unit

Record = tuple[bytes, bytes | None]


class FakeStore:
    """Stands in for ``GroupCoordinator._write``: keeps every batch, or fails on demand."""

    def __init__(self) -> None:
        self.batches: list[list[Record]] = []
        self.fail_next = 0

    async def write(self, shard: _Shard, records: list[Record]) -> None:
        await asyncio.sleep(0)  # a real write yields while it is replicated
        if self.fail_next:
            self.fail_next -= 1
            raise NotEnoughReplicasError("injected: the store is down")
        self.batches.append(list(records))


def make_coordinator(counts: dict[str, int], store: FakeStore, *, max_size: int = 100_000
                     ) -> GroupCoordinator:
    topics = {t: SimpleNamespace(partition_count=n, topic_id=f"id-{t}",
                                 assignment={p: [0] for p in range(n)})
              for t, n in counts.items()}
    topics["__consumer_offsets"] = SimpleNamespace(partition_count=1)
    config = SimpleNamespace(group_session_timeout_ms=10_000,
                             group_min_session_timeout_ms=1_000,
                             group_max_session_timeout_ms=60_000,
                             group_heartbeat_interval_ms=500, group_max_size=max_size,
                             offset_metadata_max_bytes=100, broker_id=0)
    leader = SimpleNamespace(is_leader=True, fenced=False, leader_epoch=0)
    cluster = MetadataCache(0, topics=topics)  # type: ignore[arg-type]
    registry = PartitionRegistry({("__consumer_offsets", 0): leader})  # type: ignore[dict-item]
    coordinator = GroupCoordinator(config, cluster, registry,  # type: ignore[arg-type]
                                   zookeeper=None, host=None,  # type: ignore[arg-type]
                                   metrics_registry=CollectorRegistry())
    coordinator._shards[0] = _Shard(0, 0)
    coordinator._write = store.write  # type: ignore[method-assign]
    return coordinator


def wire(tps: Any) -> list[GroupTopicPartitions]:
    return group_topic_partitions(tps)


def from_wire(entries: list[GroupTopicPartitions]) -> set[tuple[str, int]]:
    return {(e.topic, p) for e in entries for p in e.partitions}


def state_of(group: Group) -> dict[str, Any]:
    """Everything the coordinator stores about a group, as plain values."""
    return {"group": group.stored(),
            "members": {i: m.stored(group.target.get(i, ())) for i, m in group.members.items()},
            "targets": {i: sorted(t) for i, t in group.target.items()},
            "offsets": {tp: (o.offset, o.metadata) for tp, o in group.offsets.items()}}


def replayed(store: FakeStore, group_id: str) -> dict[str, Any]:
    shard = _Shard(0, 0)
    for batch in store.batches:
        for key, value in batch:
            GroupCoordinator._replay(shard, json.loads(key),
                                     None if value is None else json.loads(value), 0.0)
    group = shard.groups.get(group_id)
    return state_of(group) if group is not None else state_of(Group(group_id))


def differences(memory: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    out = []
    for part in memory:
        for key in sorted(set(memory[part]) | set(stored[part]), key=str):
            if memory[part].get(key) != stored[part].get(key):
                out.append(f"{part} {key}: memory {memory[part].get(key)}, "
                           f"stored {stored[part].get(key)}")
    return out


def check_index(group: Group) -> None:
    expected = Counter(tp for m in group.members.values() for tp in m.owned | m.assigned)
    assert group.holders.counts == dict(expected), "holders index differs from a recount"
    assert group.subscribed_topics() == sorted({t for m in group.members.values()
                                                for t in m.subscribed})
    if group.eager:
        epoch = group.target_epoch
        assert group.barrier_passed() == all(
            m.away or m.ready_epoch >= epoch or m.member_epoch >= epoch
            for m in group.members.values())
    owners: dict[tuple[str, int], str] = {}
    for m in group.members.values():
        for tp in m.owned | m.assigned:
            assert tp not in owners, f"{tp} held by {owners[tp]} and {m.member_id}"
            owners[tp] = m.member_id


class Client:
    """A member as the real consumer behaves: reports what it holds plus what its last
    answer let it take, and takes its answer only at a later step."""

    def __init__(self, instance_id: str | None, topics: list[str],
                 assignor: str = COOPERATIVE_STICKY) -> None:
        self.assignor = assignor
        self.instance_id = instance_id
        self.topics = topics
        self.member_id: str | None = None
        self.epoch = JOIN_EPOCH
        self.owned: set[tuple[str, int]] = set()
        self.answer: set[tuple[str, int]] = set()

    def request(self, group_id: str, epoch: int | None = None
                ) -> ConsumerGroupHeartbeatRequest:
        return ConsumerGroupHeartbeatRequest(
            group_id, self.member_id, self.epoch if epoch is None else epoch,
            instance_id=self.instance_id, rebalance_timeout_ms=60_000,
            session_timeout_ms=10_000, subscribed_topics=self.topics, assignor=self.assignor,
            owned=wire(self.owned | self.answer) if epoch is None else [])

    def took(self, answer: ConsumerGroupHeartbeatResponse) -> None:
        if answer.error_code:
            return
        self.member_id = answer.member_id
        self.epoch = answer.member_epoch
        self.answer = from_wire(answer.assignment)


async def random_history(seed: int, assignor: str) -> None:
    rng = random.Random(seed)
    ids = iter(range(1_000_000))
    # Member ids decide the members' order: deterministic ones make a seed replayable.
    with mock.patch("brokers.group_coordinator.uuid.uuid4",
                    lambda: SimpleNamespace(hex=f"m{next(ids):05d}")):
        await _random_history(rng, seed, assignor)


async def _random_history(rng: random.Random, seed: int, assignor: str) -> None:
    store = FakeStore()
    coordinator = make_coordinator({"t": 9, "u": 4}, store)
    shard = coordinator._shards[0]
    clients: list[Client] = []
    group_id = "g"

    async def beat(client: Client, epoch: int | None = None) -> None:
        client.took(await coordinator.heartbeat(client.request(group_id, epoch), "c"))

    for step in range(160):
        before = state_of(shard.groups["g"]) if "g" in shard.groups else None
        fail = rng.random() < 0.08
        store.fail_next = 1 if fail else 0
        action = rng.random()
        calls: list[Coroutine[Any, Any, Any]] = []
        if action < 0.15 or not clients:
            client = Client(rng.choice([None, None, f"i{rng.randint(0, 3)}"]),
                            rng.choice([["t"], ["t", "u"]]), assignor)
            clients.append(client)
            calls.append(beat(client))
        elif action < 0.22:
            client = clients.pop(rng.randrange(len(clients)))
            client.owned.clear()  # it revoked everything before leaving
            calls.append(beat(client, STATIC_LEAVE_EPOCH if client.instance_id else
                              LEAVE_EPOCH))
        elif action < 0.27:
            group = shard.groups.get(group_id)
            if group is not None and group.members:
                victim = rng.choice(sorted(group.members))
                group.members[victim].last_seen = -1e9  # its session ran out
                calls.append(coordinator._expire_group(shard, group))
        elif action < 0.32 and clients:
            client = rng.choice(clients)
            if client.member_id is not None and client.owned:
                tp = rng.choice(sorted(client.owned))
                calls.append(coordinator.commit(OffsetCommitRequest(
                    group_id, client.member_id, client.epoch,
                    [OffsetCommitTopic(tp[0], [OffsetCommitPartition(tp[1], step)])])))
        else:
            # Several requests at once: they share one round (and one write).
            for client in rng.sample(clients, min(len(clients), rng.randint(1, 4))):
                if rng.random() < 0.5:
                    client.owned = set(client.answer)  # a poll applied its answer
                calls.append(beat(client))
        if calls:
            await asyncio.gather(*calls)
        group = shard.groups.get(group_id)
        if group is None:
            continue
        check_index(group)
        if fail and before is not None:
            assert state_of(group) == before, f"seed {seed} step {step}: not undone"
        if not group.members and not group.offsets:
            continue  # replaying the last member's removal forgets the group (as before)
        stored = replayed(store, group_id)
        assert state_of(group) == stored, f"seed {seed} step {step}: memory and the " \
            f"stored records differ: {differences(state_of(group), stored)}"


@pytest.mark.parametrize("assignor", [COOPERATIVE_STICKY, RANGE])
@pytest.mark.parametrize("seed", range(30))
def test_incremental_state_matches_a_recount_and_the_log(assignor: str, seed: int) -> None:
    print(f"seed {seed}, assignor {assignor}")
    asyncio.run(random_history(seed, assignor))


def test_index_follows_direct_changes_of_members() -> None:
    group = Group("g")
    a = Member("a", None, "c", ["t"], 10_000, 60_000, assigned={("t", 0)})
    group.members["a"] = a
    b = Member("b", None, "c", ["t"], 10_000, 60_000)
    group.members["b"] = b
    a.owned = {("t", 0), ("t", 1)}  # only what it was given may count, but the index
    b.assigned = {("t", 2)}         # counts what the fields say
    check_index(group)
    del group.members["a"]
    assert group.holders.counts == {("t", 2): 1}
    a.owned = set()  # detached: no effect on the group
    assert group.holders.counts == {("t", 2): 1}
    with pytest.raises(TypeError):
        group.members.update({})
    other = Group("h")
    with pytest.raises(ValueError, match="another group"):
        other.members["b"] = b


class Touches:
    """Counts attribute reads and writes per Member object."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[int] = Counter()
        self.on = False
        counts = self.counts
        touches = self
        original_get = Member.__getattribute__
        original_set = Member.__setattr__

        def get(member: Member, name: str) -> Any:
            if touches.on:
                counts[id(member)] += 1
            return original_get(member, name)

        def set_(member: Member, name: str, value: Any) -> None:
            if touches.on:
                counts[id(member)] += 1
            original_set(member, name, value)

        monkeypatch.setattr(Member, "__getattribute__", get)
        monkeypatch.setattr(Member, "__setattr__", set_)


def test_a_stable_heartbeat_in_a_large_group_touches_only_its_member(
        monkeypatch: pytest.MonkeyPatch) -> None:
    members, partitions = 600, 1200
    store = FakeStore()
    coordinator = make_coordinator({"t": partitions}, store)
    clients = [Client(None, ["t"]) for _ in range(members)]

    async def settle() -> None:
        for client in clients:  # joins one after the other, as a slow start would
            client.took(await coordinator.heartbeat(client.request("big"), "c"))
        for _ in range(4):
            for client in clients:
                client.owned = set(client.answer)
            answers = await asyncio.gather(*(coordinator.heartbeat(c.request("big"), "c")
                                             for c in clients))
            for client, answer in zip(clients, answers, strict=True):
                client.took(answer)

    asyncio.run(settle())
    group = coordinator._shards[0].groups["big"]
    assert group.state == "Stable"
    assert sorted(len(c.owned) for c in clients) == [2] * members
    check_index(group)

    assigned = Counter[str]()
    monkeypatch.setattr(gc, "assign", lambda *a, **k: (assigned.update(["calls"]),
                                                      assign(*a, **k))[1])
    touches = Touches(monkeypatch)
    batches = len(store.batches)
    one = clients[members // 2]
    me = group.members[one.member_id or ""]

    async def one_heartbeat() -> ConsumerGroupHeartbeatResponse:
        touches.on = True
        try:
            return await coordinator.heartbeat(one.request("big"), "c")
        finally:
            touches.on = False

    answer = asyncio.run(one_heartbeat())
    assert answer.error_code == 0 and from_wire(answer.assignment) == one.owned
    assert touches.counts[id(me)] > 0
    # (The request's own undo copy of its member is a new object: not in the group.)
    others = {i: n for i, n in touches.counts.items()
              if i != id(me) and i in {id(m) for m in group.members.values()}}
    assert others == {}, f"a stable heartbeat touched {len(others)} other members"
    assert assigned["calls"] == 0, "a stable heartbeat recomputed the target"
    assert len(store.batches) == batches, "a stable heartbeat wrote something"


def test_concurrent_requests_share_one_write_and_fail_together() -> None:
    store = FakeStore()
    coordinator = make_coordinator({"t": 40}, store)
    clients = [Client(None, ["t"]) for _ in range(20)]

    async def joins() -> list[ConsumerGroupHeartbeatResponse]:
        return await asyncio.gather(*(coordinator.heartbeat(c.request("g"), "c")
                                      for c in clients))

    store.fail_next = 1
    failed = asyncio.run(joins())
    assert {a.error_code for a in failed} == {NotEnoughReplicasError.code}
    assert "g" not in coordinator._shards[0].groups  # nothing of the round is left
    assert store.batches == []
    answers = asyncio.run(joins())
    assert all(a.error_code == 0 for a in answers)
    assert len(store.batches) == 1  # twenty joins, one write
    group = coordinator._shards[0].groups["g"]
    assert len(group.members) == 20 and group.target_epoch == group.group_epoch
    assert sum(len(t) for t in group.target.values()) == 40


def test_group_by_topic_keeps_first_seen_order_and_wire_groups_sort() -> None:
    pairs = [("b", 2), ("a", 1), ("b", 0), ("a", 1)]
    grouped = group_by_topic(pairs)
    assert list(grouped.items()) == [("b", [2, 0]), ("a", [1, 1])]  # as given, duplicates too
    assert group_by_topic(iter([("t", "x"), ("t", "y")])) == {"t": ["x", "y"]}  # any items
    assert group_by_topic([]) == {}
    assert wire(pairs) == [GroupTopicPartitions("a", [1, 1]), GroupTopicPartitions("b", [0, 2])]
