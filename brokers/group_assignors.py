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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
           previous: Mapping[str, set[TopicPartition]]) -> dict[str, set[TopicPartition]]:
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
            previous: Mapping[str, set[TopicPartition]]) -> dict[str, set[TopicPartition]]:
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
    every = sorted((t, p) for t in sorted({t for m in members for t in eligible[m]})
                   for p in range(partition_counts[t]))
    for tp in every:
        if tp in taken:
            continue
        candidates = [m for m in members if tp[0] in eligible[m]]
        if candidates:
            chosen = min(candidates, key=lambda m: (len(target[m]), order[m]))
            target[chosen].add(tp)
            taken.add(tp)
    # Balance: move from the most loaded member to an eligible one with at least two
    # fewer, one partition at a time; every move shrinks the spread, so this ends.
    while True:
        moved = False
        for donor in sorted(members, key=lambda m: (-len(target[m]), order[m])):
            for tp in sorted(target[donor], reverse=True):
                takers = [m for m in members if tp[0] in eligible[m]
                          and len(target[m]) <= len(target[donor]) - 2]
                if takers:
                    taker = min(takers, key=lambda m: (len(target[m]), order[m]))
                    target[donor].discard(tp)
                    target[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return target
