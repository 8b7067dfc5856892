"""Driver-side planning: which offsets a batch reads, cut into Spark tasks.

What the cluster holds right now (``ClusterView.snapshot``: per partition its log start,
high watermark and log end, ``PartitionOffsets``), resolved offsets
(``resolve_offsets``), the batch's ranges (``plan_ranges``, Kafka's
``minPartitions`` rule), the admission limit (``rate_limit``), and the ranges packed into
tasks (``pack_ranges``). ``OffsetRange`` and ``RangeGroup`` are what Spark ships to the
executors (``_read``).

Delta tier (docs/spark.md, "Replay from the Delta tier"; spark_jobs/README.md): a tiering
job copies old records of each partition into one Delta table per topic, after which
brokers delete them, so a broker's log start offset moves up. ``ClusterView`` learns per
partition where the tier starts and ends (``TierInfo``, from ``Admin.describe_tier``,
asked only where a read may start below a log start); ``earliest`` then means the tier's
start, and a planned range that starts below the log start is cut in two at it
(``split_tiered``): the part below is read from the Delta table (``_tier``, delta-rs in
the executor), the rest from the brokers. Offsets the tier holds that are still on a
broker are read from the broker.

Data loss (records gone from both the brokers and the Delta tier before the query read
them, or a topic deleted or recreated): ``data_loss`` fails the query with
``StrataSparkDataLossError`` naming the partition and offsets (``failOnDataLoss=true``),
or logs a warning so that the reader reads on from the next offset either tier still
holds (``false``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from pyspark.sql.datasource import InputPartition

from spark_source._errors import StrataSparkDataLossError, StrataSparkOptionError
from spark_source._options import EARLIEST, LATEST, Offsets, SourceOptions, describe
from strata.client import Admin, TopicPartition, UnknownTopicOrPartitionError

__all__ = [
    "PACK_RECORDS",
    "ClusterView",
    "OffsetRange",
    "PartitionOffsets",
    "RangeGroup",
    "RangeSource",
    "TierInfo",
    "data_loss",
    "describe_tiers",
    "pack_ranges",
    "plan_ranges",
    "rate_limit",
    "resolve_offsets",
    "split_tiered",
]

log = logging.getLogger("strata.spark_source.reader")

@dataclass(frozen=True, slots=True)
class TierInfo:
    """Where a partition's Delta tier is: ``table`` (its URI, one table per topic) holds
    offsets ``[start, end)`` less gaps (``start``: ZooKeeper's ``tier_start_offset``, the
    first offset still in Delta; ``end``: ``tiered_up_to``, exclusive; equal when the
    table holds nothing of the partition).

    Travels inside ``OffsetRange`` to the executors, which cannot ask the driver.
    """

    table: str
    start: int
    end: int

    @property
    def holds_records(self) -> bool:
        return self.start < self.end


#: Where a range is read from: the brokers (``log``) or the Delta tier (``tier``).
RangeSource = Literal["log", "tier"]


class OffsetRange(InputPartition):
    """One Spark task's work: offsets ``[start, end)`` of one topic-partition.

    Picklable plain data: Spark ships it from the driver to an executor. ``source`` says
    which tier the planner expects to hold the range; ``tier`` (the partition's Delta
    tier when the batch was planned, if the topic has one) lets a ``log`` range fall back
    to Delta when the broker's log start moved past it after planning.
    """

    def __init__(self, topic: str, partition: int, start: int, end: int, *,
                 source: RangeSource = "log", tier: TierInfo | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.source: RangeSource = source
        self.tier = tier

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def __repr__(self) -> str:
        where = " from the Delta tier" if self.source == "tier" else ""
        return f"OffsetRange({self.topic}-{self.partition} [{self.start}, {self.end}){where})"


#: A micro-batch's ranges are packed into Spark tasks of up to this many records (a
#: range is never split): a small batch over many partitions then runs as one or two
#: tasks instead of one per partition. Every task pays a fixed start-up (Python worker
#: hand-off, client connection, metadata); on this 2-core machine a 4,000-record batch
#: over 8 partitions took ~850 ms in 8 tasks and ~300 ms in 2. ``minPartitions`` turns
#: packing off (the user asked for parallelism).
PACK_RECORDS: Final = 100_000


class RangeGroup(InputPartition):
    """Several offset ranges read one after another by one Spark task (small batches)."""

    def __init__(self, ranges: tuple[OffsetRange, ...]) -> None:
        super().__init__(tuple((r.topic, r.partition, r.start, r.end) for r in ranges))
        self.ranges = ranges

    def __repr__(self) -> str:
        return f"RangeGroup({', '.join(map(repr, self.ranges))})"


def pack_ranges(ranges: list[OffsetRange], max_records: int = PACK_RECORDS
                ) -> list[OffsetRange | RangeGroup]:
    """Consecutive ranges packed greedily into groups of at most ``max_records`` records
    (a larger range stays alone); order is kept."""
    groups: list[list[OffsetRange]] = []
    size = 0
    for rng in ranges:
        records = rng.end - rng.start
        if not groups or size + records > max_records:
            groups.append([])
            size = 0
        groups[-1].append(rng)
        size += records
    return [g[0] if len(g) == 1 else RangeGroup(tuple(g)) for g in groups]


def plan_ranges(begin: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                min_partitions: int | None) -> list[OffsetRange]:
    """One range per partition with records in ``[begin, end)``; with ``minPartitions``
    larger than that count, big ranges are cut so there are at least about that many.

    The split follows Kafka's ``KafkaOffsetRangeCalculator``: each range gets a share of
    ``minPartitions`` proportional to its size (at least one part), and the parts of a
    range are as equal as integer division allows.
    """
    ranges = [(tp, begin[tp], end[tp]) for tp in sorted(end)
              if tp in begin and end[tp] > begin[tp]]
    if min_partitions is None or min_partitions <= len(ranges):
        return [OffsetRange(tp.topic, tp.partition, lo, hi) for tp, lo, hi in ranges]
    total = sum(hi - lo for _, lo, hi in ranges)
    out: list[OffsetRange] = []
    for tp, lo, hi in ranges:
        size = hi - lo
        parts = max(round(size / total * min_partitions), 1)
        remaining, start = size, lo
        for part in range(parts):
            piece = remaining // (parts - part)
            remaining -= piece
            if piece:
                out.append(OffsetRange(tp.topic, tp.partition, start, start + piece))
            start += piece
    return out


def split_tiered(ranges: Sequence[OffsetRange],
                 snapshot: Mapping[TopicPartition, PartitionOffsets]) -> list[OffsetRange]:
    """``ranges`` with the partition's tier attached, each range that starts below its
    partition's log start (and whose topic has a Delta tier) cut there: the part below is
    read from the tier, the rest from the brokers.

    Offsets both tiers hold are read from the broker: it is the cheaper read, and it
    needs no Delta log replay. Without a tier a range is left whole for the brokers,
    which report what is gone as before.
    """
    out: list[OffsetRange] = []
    for rng in ranges:
        bounds = snapshot.get(rng.topic_partition)
        tier = None if bounds is None else bounds.tier
        if tier is None or bounds is None:
            out.append(OffsetRange(rng.topic, rng.partition, rng.start, rng.end))
            continue
        cut = min(max(rng.start, bounds.log_start), rng.end)
        if rng.start < cut:
            out.append(OffsetRange(rng.topic, rng.partition, rng.start, cut, source="tier",
                                   tier=tier))
        if cut < rng.end:
            out.append(OffsetRange(rng.topic, rng.partition, cut, rng.end, tier=tier))
    return out


def rate_limit(begin: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               max_rows: int) -> Offsets:
    """End offsets that admit at most ``max_rows`` records in total.

    The budget is split over the partitions in proportion to their backlog, as Kafka's
    source does, with two differences: the total never exceeds ``max_rows`` (exact
    integer shares, largest remainders first), and every partition with a backlog gets at
    least one record while the budget has one per partition, so a small partition is not
    starved behind a big one. Partitions without a backlog keep their begin offset.
    """
    backlog = {tp: latest[tp] - begin[tp] for tp in sorted(begin)
               if tp in latest and latest[tp] > begin[tp]}
    total = sum(backlog.values())
    end = {tp: begin[tp] for tp in begin}
    if total <= max_rows:
        end.update({tp: latest[tp] for tp in backlog})
        return end
    share: dict[TopicPartition, int] = {}
    if max_rows < len(backlog):
        # Not even one record each: the biggest backlogs go first.
        for tp in sorted(backlog, key=lambda tp: (-backlog[tp], tp))[:max_rows]:
            share[tp] = 1
    else:
        budget = max_rows - len(backlog)
        rest_total = total - len(backlog)
        remainders: list[tuple[int, TopicPartition]] = []
        for tp, size in backlog.items():
            whole, remainder = divmod(budget * (size - 1), rest_total)
            share[tp] = 1 + whole
            remainders.append((remainder, tp))
        leftover = budget - sum(share.values()) + len(backlog)
        for _, tp in sorted(remainders, key=lambda item: (-item[0], item[1]))[:leftover]:
            share[tp] += 1
    for tp, count in share.items():
        end[tp] = begin[tp] + count
    return end


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition's readable range right now: ``[log_start, high_watermark)`` on the
    brokers, plus what its Delta tier holds below that (``tier``).

    ``high_watermark`` is where a read may end: the high watermark at read_uncommitted,
    the last stable offset at read_committed (the first offset of the oldest
    transaction not decided yet, at most the high watermark), so a task never waits for
    an open transaction.

    ``log_end``: the leader's log end (-1: unknown). Right after a failover the new
    leader's high watermark can trail offsets the query already read (it catches up once
    the followers report in); only an offset past the log end means records are gone.
    ``tier``: ``None`` when the topic has no Delta table, or when the snapshot was taken
    without asking (``ClusterView.snapshot(tiers=False)``): at the head of the log it
    does not matter.
    """

    log_start: int
    high_watermark: int
    log_end: int = -1
    tier: TierInfo | None = None

    @property
    def earliest(self) -> int:
        """The first offset either tier holds: the Delta tier's start when it holds
        records below the log start, else the log start."""
        tier = self.tier
        if tier is not None and tier.holds_records and tier.start < self.log_start:
            return tier.start
        return self.log_start

    def lost(self, start: int, end: int) -> tuple[int, int] | None:
        """The first run ``[a, b)`` of offsets in ``[start, end)`` that neither the broker
        (from its log start on) nor the Delta tier holds, or ``None``: what data loss
        means once there is a tier. Gaps inside the tier (control records) are not runs."""
        below = min(end, self.log_start)
        if start >= below:
            return None
        tier = self.tier
        if tier is None or not tier.holds_records:
            return start, below
        if start < tier.start:
            return start, min(below, tier.start)
        if max(start, tier.end) < below:
            return max(start, tier.end), below
        return None

    def describe_tiers(self) -> str:
        """``the log now starts at offset N`` plus what the tier holds, for messages."""
        text = f"the log now starts at offset {self.log_start}"
        tier = self.tier
        if tier is None:
            return text
        if not tier.holds_records:
            return f"{text} and its Delta tier {tier.table} holds none of its records"
        return f"{text} and its Delta tier {tier.table} holds offsets " \
            f"{tier.start}..{tier.end - 1}"


class ClusterView:
    """What the subscription covers on the cluster, through one lazily opened ``Admin``.

    Lazy and dropped on pickling because Spark pickles readers to ship them to executors,
    and an open client (sockets, an event-loop thread) cannot travel.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: Admin | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._admin = None

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.options.bootstrap, client_id="strata-spark-source",
                                security=self.options.security)
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            admin.close()

    def snapshot(self, *, require_topics: bool, tiers: bool = True
                 ) -> dict[TopicPartition, PartitionOffsets]:
        """Every subscribed partition with its log start offset and high watermark, and
        (``tiers``) its Delta tier.

        ``require_topics``: a ``subscribe`` topic that does not exist is an option error
        (at query start); otherwise it is simply absent (the caller decides whether that
        is data loss). ``tiers=False`` skips the ``DescribeTier`` round trip: a stream
        reading at the head of the log needs no tier, and asks ``with_tiers`` for the
        topics that turn out to (see ``StrataStreamReader.latestOffset``).
        """
        opts = self.options
        if opts.subscribe is not None:
            names = list(opts.subscribe)
            try:
                described = self.admin.describe_topics(names)
            except UnknownTopicOrPartitionError:
                existing = set(self.admin.list_topics())
                missing = [name for name in names if name not in existing]
                if missing and require_topics:
                    raise StrataSparkOptionError(
                        "subscribe", f"topic(s) {', '.join(missing)} do not exist on "
                        f"{opts.bootstrap}; create them (strata topic create NAME) or fix "
                        "the names") from None
                names = [name for name in names if name in existing]
                described = self.admin.describe_topics(names) if names else {}
        else:
            names = [name for name in self.admin.list_topics() if opts.subscribes_to(name)]
            described = self.admin.describe_topics(names) if names else {}
        out: dict[TopicPartition, PartitionOffsets] = {}
        unknown: list[TopicPartition] = []
        for name, topic in described.items():
            for p in topic.partitions:
                tp = TopicPartition(name, p.partition)
                out[tp] = PartitionOffsets(p.log_start_offset, p.high_watermark,
                                           p.log_end_offset)
                if p.log_start_offset < 0 or p.high_watermark < 0:
                    unknown.append(tp)
        if unknown:  # the leader did not answer describe_topics: ask again, with retries
            earliest = self.admin.list_offsets(dict.fromkeys(unknown, "earliest"))
            latest = self.admin.list_offsets(dict.fromkeys(unknown, "latest"))
            for tp in unknown:
                out[tp] = PartitionOffsets(earliest[tp].offset, latest[tp].offset)
        if opts.isolation_level == "read_committed" and out:
            out = self._stable(out)
        out = dict(sorted(out.items()))
        return self.with_tiers(out, described) if tiers else out

    def _stable(self, snapshot: dict[TopicPartition, PartitionOffsets]
                ) -> dict[TopicPartition, PartitionOffsets]:
        """``snapshot`` with each partition's end moved down to its last stable offset
        (read_committed). A topic deleted since the snapshot is left out, as
        ``snapshot`` leaves out a topic that does not exist."""
        def ask(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            found = self.admin.list_offsets(dict.fromkeys(tps, "latest"),
                                            isolation_level="read_committed")
            return {tp: r.offset for tp, r in found.items()}

        try:
            stable = ask(list(snapshot))
        except UnknownTopicOrPartitionError:
            stable = {}
            for topic in sorted({tp.topic for tp in snapshot}):
                with contextlib.suppress(UnknownTopicOrPartitionError):
                    stable.update(ask([tp for tp in snapshot if tp.topic == topic]))
        # The stable offsets alone, all of one moment (one ListOffsets per leader), not
        # mixed with the high watermarks read before: a transaction committed in between
        # is then in the cut in every partition of a leader or in none.
        return {tp: replace(o, high_watermark=stable[tp])
                for tp, o in snapshot.items() if tp in stable}

    def with_tiers(self, snapshot: Mapping[TopicPartition, PartitionOffsets],
                   topics: Iterable[str]) -> dict[TopicPartition, PartitionOffsets]:
        """``snapshot`` with the Delta tier of every partition of ``topics`` filled in."""
        out = dict(snapshot)
        names = sorted(set(topics) & {tp.topic for tp in snapshot})
        if not names:
            return out
        try:
            tiers = describe_tiers(self.admin, names)
        except UnknownTopicOrPartitionError:
            # A topic was deleted since the snapshot: ask topic by topic, without it
            # (the caller finds it gone on its next snapshot, as without tiering).
            tiers = {}
            for name in names:
                with contextlib.suppress(UnknownTopicOrPartitionError):
                    tiers.update(describe_tiers(self.admin, [name]))
        for tp, tier in tiers.items():
            if tp in out:
                out[tp] = replace(out[tp], tier=tier)
        return out

    def offsets_for_timestamp(self, tps: Sequence[TopicPartition], timestamp_ms: int
                              ) -> dict[TopicPartition, int]:
        """First offset at or after ``timestamp_ms`` per partition (``-1``: none is)."""
        if not tps:
            return {}
        found = self.admin.list_offsets(dict.fromkeys(tps, timestamp_ms))
        return {tp: found[tp].offset for tp in tps}


def describe_tiers(admin: Admin, names: Sequence[str]) -> dict[TopicPartition, TierInfo]:
    """Each partition's Delta tier, for the topics among ``names`` that have a table.

    Partitions of topics without a table are absent. Topics whose tiering was turned off
    keep their table (and so their history) as long as ZooKeeper names it.
    """
    tiers = admin.describe_tier(names)
    out: dict[TopicPartition, TierInfo] = {}
    for name, topic in tiers.items():
        if topic.table is None:
            continue
        for number, part in topic.partitions.items():
            out[TopicPartition(name, number)] = TierInfo(
                topic.table, part.tier_start_offset, part.tiered_up_to)
    return out


def resolve_offsets(option: str, spec: str | Offsets, snapshot: Mapping[TopicPartition,
                    PartitionOffsets]) -> Offsets:
    """``startingOffsets`` / ``endingOffsets`` against the cluster: concrete offsets.

    JSON offsets must name every partition of every subscribed topic (as in Kafka's
    source), and none past the partition's latest offset.
    """
    if spec == "earliest":
        return {tp: o.earliest for tp, o in snapshot.items()}
    if spec == "latest":
        return {tp: o.high_watermark for tp, o in snapshot.items()}
    assert isinstance(spec, dict)
    unknown = [tp for tp in spec if tp not in snapshot]
    if unknown:
        raise StrataSparkOptionError(
            option, f"names partition(s) {describe(unknown)}, which do not exist; give "
            "offsets for existing partitions only (strata topic describe TOPIC)")
    topics = {tp.topic for tp in spec}
    missing = [tp for tp in snapshot if tp.topic in topics and tp not in spec]
    if missing:
        raise StrataSparkOptionError(
            option, f"gives no offset for partition(s) {describe(missing)}; list every "
            f"partition of each topic it names (use {EARLIEST} for earliest, {LATEST} for "
            "latest)")
    absent = sorted({tp.topic for tp in snapshot} - topics)
    if absent:
        raise StrataSparkOptionError(
            option, f"gives no offsets for subscribed topic(s) {', '.join(absent)}; list "
            f"every subscribed topic (use {EARLIEST} for earliest, {LATEST} for latest)")
    out: Offsets = {}
    for tp, offset in sorted(spec.items()):
        bounds = snapshot[tp]
        if offset == EARLIEST:
            out[tp] = bounds.earliest
        elif offset == LATEST:
            out[tp] = bounds.high_watermark
        elif offset > bounds.high_watermark:
            raise StrataSparkOptionError(
                option, f"asks for offset {offset} of {tp}, but its latest offset is "
                f"{bounds.high_watermark}; use an offset up to that, or {LATEST} for latest")
        else:
            out[tp] = offset
    return out


def data_loss(options: SourceOptions, message: str) -> None:
    """Fail with ``message`` (failOnDataLoss=true) or log it as a warning (false)."""
    if options.fail_on_data_loss:
        raise StrataSparkDataLossError(
            f"{message}. Set the source option failOnDataLoss=false to skip the lost records "
            "with a warning, or restart the query from a new checkpointLocation")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
