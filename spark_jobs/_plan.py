"""Which offsets to tier next: pure planning over what the leader reports (no Spark, no I/O).

Rules, per partition:

* Copying starts at ``max(tiered_up_to, committed, log_start)``: ``tiered_up_to`` is the
  progress in ZooKeeper, ``committed`` the end offset of the last write the Delta table
  holds for this partition (its ``txnVersion``). The two differ only when a job died
  between the Delta commit and the ZooKeeper write; the table is then ahead and wins.
* Only closed segments below the last stable offset (at most the high watermark) are
  candidates (the leader lists no others: nothing a follower may lose, nothing of a
  transaction not decided yet), taken oldest first while their newest record is older
  than ``tier.after.ms``.
  The first segment that is too young stops the plan: tiered history never has holes.
* One write covers at most ``max_bytes`` of segments (at least one segment), so a killed
  job redoes at most that much, and a write's end offset is always a segment's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["SegmentLike", "TierRange", "plan_partition"]


class SegmentLike(Protocol):
    @property
    def base_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TierRange:
    """Offsets ``[start, end)`` of one partition to copy in one Delta commit."""

    topic: str
    partition: int
    start: int
    end: int
    segments: int
    bytes: int
    newest_timestamp: int  # ms; the newest record of the range's segments

    @property
    def offsets(self) -> int:
        return self.end - self.start


def plan_partition(topic: str, partition: int, segments: Sequence[SegmentLike], *,
                   log_start: int, tiered_up_to: int, committed: int, tier_after_ms: int,
                   now_ms: int, max_bytes: int) -> TierRange | None:
    """The next range to tier for one partition, or None when nothing is due."""
    start = max(tiered_up_to, committed, log_start)
    chosen: list[SegmentLike] = []
    total = 0
    for segment in segments:
        if segment.next_offset <= start:
            continue  # already tiered
        if segment.max_timestamp >= 0 and segment.max_timestamp > now_ms - tier_after_ms:
            break
        if chosen and total + segment.size_bytes > max_bytes:
            break
        chosen.append(segment)
        total += segment.size_bytes
    if not chosen:
        return None
    return TierRange(topic, partition, start, chosen[-1].next_offset, len(chosen), total,
                     max(s.max_timestamp for s in chosen))
