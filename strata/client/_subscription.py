"""What a consumer reads: its partitions, each one's read state, and how it got them.

Job: the consumer's assignment as one map, ``states``: ``TopicPartition`` ->
``PartitionState`` (position, buffered ``Chunk``s, generation, backoff, watermarks),
either chosen by the caller (``assign``) or given by the consumer group (``subscribe``;
the membership itself is ``_group.GroupMember``), plus the group callbacks and the
``GroupEvent``s that carry them to the caller. The fetcher (``_fetcher``) fills and drains
the states' buffers, the offsets (``_offsets``) position them and commit them; the
consumer runs the rebalance steps, which touch all three.

Invariants:

- A consumer is in one mode at a time: ``None`` (nothing to read), ``"assign"`` or
  ``"subscribe"``; ``assign`` and ``subscribe`` refuse to mix (``RuntimeError``).
- Buffered records of a partition always start exactly at its position; the next fetch
  starts where the buffer ends (``fetch_offset``).
- Every position change that is not the consumer handing out records goes through
  ``reposition``, which drops the buffer and bumps the generation, so an answer to a
  fetch sent for an older generation is recognised and discarded.
- In a group, ``states`` holds exactly the partitions whose ``on_assign`` has run and
  whose ``on_revoke`` / ``on_lost`` has not.

Thread-safety: none needed: an ``AsyncConsumer`` and everything it holds is used on one
event loop (the blocking ``Consumer`` runs it on its own loop thread).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import pyarrow as pa

from strata.client._common import TopicPartition, topic_partitions
from strata.client._group import GroupMember

__all__ = ["Chunk", "GroupEvent", "PartitionState", "PartitionsCallback", "Subscription"]

#: ``on_assign`` / ``on_revoke`` / ``on_lost``: called with a set of partitions. On an
#: ``AsyncConsumer`` it may also be a coroutine function (awaited inside ``poll``).
PartitionsCallback: TypeAlias = Callable[[set[TopicPartition]], Any]


@dataclass(slots=True, eq=False)
class Chunk:
    """Decoded records of one fetch answer for one partition, not yet all returned."""

    table: pa.Table
    end_offset: int  # offset after the last record in ``table``
    wire_bytes: int
    index: int = 0  # next row to hand out

    @property
    def remaining(self) -> int:
        return int(self.table.num_rows) - self.index

    @property
    def remaining_bytes(self) -> int:
        return self.wire_bytes * self.remaining // max(int(self.table.num_rows), 1)


@dataclass(slots=True, eq=False)
class PartitionState:
    position: int | None = None  # None: resolve (committed offset, auto_offset_reset)
    use_committed: bool = False  # resolve from the group's committed offset first
    generation: int = 0  # bumped by every seek: older fetch answers are discarded
    chunks: deque[Chunk] = field(default_factory=deque)
    retry_at: float = 0.0  # monotonic time before which the partition is backing off
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1

    def fetch_offset(self) -> int | None:
        """Where the next fetch starts: after whatever is already buffered."""
        return self.chunks[-1].end_offset if self.chunks else self.position

    def buffered_bytes(self) -> int:
        return sum(c.remaining_bytes for c in self.chunks)

    def reposition(self, position: int | None) -> None:
        self.position = position
        self.chunks.clear()
        self.generation += 1
        self.retry_at = 0.0


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A rebalance step whose callback the caller's thread runs inside ``poll``."""

    kind: Literal["assign", "revoke", "lost"]
    partitions: frozenset[TopicPartition]
    callback: PartitionsCallback | None


class Subscription:
    """The assignment (manual or the group's), its partition states and callbacks."""

    def __init__(self, group: GroupMember | None) -> None:
        self.group = group
        self.mode: Literal["assign", "subscribe"] | None = None
        self.states: dict[TopicPartition, PartitionState] = {}
        self.on_assign: PartitionsCallback | None = None
        self.on_revoke: PartitionsCallback | None = None
        self.on_lost: PartitionsCallback | None = None

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment; partitions that stay keep their state."""
        if self.mode == "subscribe":
            group_id = self.group.group_id if self.group is not None else None
            raise RuntimeError("this consumer subscribed to topics of group "
                               f"{group_id!r}: its partitions come from the group, so "
                               "assign() cannot be used; use one consumer per way of "
                               "assigning, or unsubscribe() first")
        tps = topic_partitions(partitions)
        self.mode = "assign" if tps else None
        self.states = {tp: self.states.get(tp) or
                       PartitionState(use_committed=self.group is not None) for tp in tps}

    def subscribe(self, topics: str | Iterable[str], on_assign: PartitionsCallback | None,
                  on_revoke: PartitionsCallback | None, on_lost: PartitionsCallback | None
                  ) -> None:
        """Check the arguments, then (re)subscribe the group member to ``topics``."""
        if self.group is None:
            raise ValueError("subscribe() needs a consumer group: create the consumer with "
                             "group_id=\"...\" (or use assign() for manual assignment)")
        if self.mode == "assign":
            raise RuntimeError("this consumer has partitions from assign(); subscribe() and "
                               "assign() cannot be mixed: call assign([]) first or use "
                               "another consumer")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or any(not isinstance(t, str) or not t for t in names):
            raise ValueError(f"subscribe() expects one or more topic names, got {topics!r}")
        for name, callback in (("on_assign", on_assign), ("on_revoke", on_revoke),
                               ("on_lost", on_lost)):
            if callback is not None and not callable(callback):
                raise ValueError(f"{name} must be callable, got {callback!r}")
        self.mode = "subscribe"
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self.group.subscribe(names)

    def topics(self) -> set[str]:
        """The subscribed topics (empty when not subscribed)."""
        if self.mode != "subscribe" or self.group is None:
            return set()
        return set(self.group.membership.subscription)

    def state(self, tp: TopicPartition | tuple[str, int]) -> PartitionState:
        state = self.states.get(TopicPartition(*tp))
        if state is None:
            raise ValueError(f"{tp[0]}-{tp[1]} is not assigned to this consumer; assign() it "
                             "first")
        return state

    def targets(self, partitions: Iterable[TopicPartition | tuple[str, int]] | None
                ) -> list[TopicPartition]:
        """``partitions`` (``None``: every assigned one), each checked to be assigned."""
        if partitions is None:
            return list(self.states)
        tps = topic_partitions(partitions)
        for tp in tps:
            self.state(tp)
        return tps

    def owned(self) -> set[TopicPartition]:
        """The partitions this consumer may commit: the group's view of what it holds, or
        the assigned ones."""
        if self.mode == "subscribe" and self.group is not None:
            return set(self.group.membership.owned)
        return set(self.states)

    def has_group_work(self) -> bool:
        """A rebalance step (or a fatal group error) waits for the caller's ``poll``."""
        return (self.mode == "subscribe" and self.group is not None
                and self.group.membership.has_work())

    def add_assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """New partitions from the group: no position yet, the committed offset first."""
        for tp in partitions:
            if tp not in self.states:
                self.states[tp] = PartitionState(use_committed=True)

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.states.pop(tp, None)
