"""The read side: offset planning on the driver, Arrow reads on the executors.

How a micro-batch flows through the PySpark 4.2 Python Data Source API, and where each
piece lives:

* ``StrataStreamReader`` runs on the driver, in the long-lived Python worker Spark keeps
  for the query's source. ``initialOffset`` resolves ``startingOffsets`` /
  ``startingTimestamp`` to concrete offsets; ``latestOffset(start, limit)`` asks the
  cluster for every subscribed partition's high watermark (new partitions and new topics
  matching ``subscribePattern`` start at their earliest offset), applies
  ``maxOffsetsPerTrigger`` (``ReadMaxRows``) and the ``Trigger.AvailableNow`` target, and
  returns the batch's end offsets; ``partitions(start, end)`` cuts ``[start, end)`` per
  partition into ``OffsetRange`` s, split further to honour ``minPartitions``.
* Spark checkpoints ``end`` in its offset log before the batch runs, so a re-run batch
  (after a crash) gets the same ranges: the source needs no state of its own and
  ``commit`` has nothing to do.
* ``read(range)`` runs in an executor's Python worker (on a copy of the reader unpickled
  there, which is why the reader opens no connection before it is used). It reads exactly
  ``[start, end)`` from the partition leader with a ``strata.client.Consumer`` (manual
  assignment + seek; it follows leader changes through metadata, and the broker serves
  only committed records, below the high watermark) and yields ``pyarrow.RecordBatch``es
  built column-wise from the fetched batches: no per-record Python.

Arrow types: Spark checks the first batch's Arrow schema against
``to_arrow_schema(schema, timezone="UTC")`` exactly (field names, types and nullability),
so ``SPARK_ARROW_SCHEMA`` spells that out: ``timestamp`` is ``timestamp[us, tz=UTC]``
(the client's ``int64`` milliseconds are reinterpreted as ``timestamp[ms]`` and widened
by Arrow), ``partition`` / ``timestampType`` stay ``int32``, every field is nullable, and
the headers list's item field is called ``element``.

Delta tier (issue [6/7]): a tiering job copies old records of each partition into one
Delta table per topic, after which brokers delete them, so a broker's log start offset
moves up. ``ClusterView`` learns per partition where the tier starts and ends
(``TierInfo``, from ``Admin.describe_tier``, asked only where a read may start below a
log start); ``earliest`` then means the tier's start, and a planned range that starts
below the log start is cut in two at it (``split_tiered``): the part below is read from
the Delta table (``_tier``, delta-rs in the executor), the rest from the brokers.
Offsets the tier holds that are still on a broker are read from the broker. A read that
finds the log start moved up after planning (retention deleted what the tiering job had
already copied) falls back to the tier for those offsets before anything counts as
lost.

Data loss (records gone from both the brokers and the Delta tier before the query read
them, or a topic deleted or recreated): with ``failOnDataLoss=true`` the query fails with
``StrataSparkDataLossError`` naming the partition and offsets; with ``false`` the reader
logs a warning and reads on from the next offset either tier still holds.

Typed topics (docs/typed-topics.md): ``value`` is a struct of the topic's value schema,
straight from the consumer's Arrow columns (no per-record decoding). ``describe_value``
runs on the driver when Spark asks the source for its schema: it finds the subscribed
topics' ``value.schema.subject`` and the subject's latest version, refuses a
subscription whose topics do not share one subject (or mix typed and bytes topics) for
struct values, and returns the Spark schema with the subject, version and schema on the
``value`` field's metadata. ``with_value_shape`` turns that schema, which Spark hands to
``reader``/``streamReader``, back into ``SourceOptions`` fields, so every task reads
under that very version (``Consumer(value_schema_version=N)``) and casts ``value`` to
the Arrow type Spark checks. ``valueFormat=binary``/``json`` keep the bytes schema.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_source._errors import StrataSparkDataLossError, StrataSparkOptionError
from spark_source._options import (
    CONSUMER_VALUE_FORMAT,
    EARLIEST,
    LATEST,
    Offsets,
    OffsetsJson,
    SourceOptions,
    describe,
    offsets_from_json,
    offsets_to_json,
)
from strata.client import (
    Admin,
    Consumer,
    IdleTimer,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    TopicPartition,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "SPARK_ARROW_SCHEMA",
    "SPARK_BATCH_ROWS",
    "PACK_RECORDS",
    "OffsetRange",
    "RangeGroup",
    "TierInfo",
    "ValueShape",
    "describe_value",
    "fetch_bytes_for",
    "pack_ranges",
    "PartitionOffsets",
    "StrataBatchReader",
    "StrataStreamReader",
    "plan_ranges",
    "rate_limit",
    "read_range",
    "read_ranges",
    "split_tiered",
    "to_spark_table",
    "with_value_shape",
]

if TYPE_CHECKING:  # pragma: no cover - imported where used: deltalake loads slowly
    from spark_source._tier import TierTable

log = logging.getLogger("spark_source")

#: The Arrow form of the source schema that Spark accepts from ``read()`` (see the module
#: docstring; a test checks it against ``pyspark.sql.pandas.types.to_arrow_schema``).
_HEADERS_TYPE: Final = pa.list_(pa.field("element", pa.struct([
    pa.field("key", pa.string()), pa.field("value", pa.binary())])))
SPARK_ARROW_SCHEMA: Final = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", _HEADERS_TYPE),
])

#: Per-fetch size for one range. Big fetches amortise the per-request and per-yield cost;
#: the consumer buffers about two of them (one being handed out, one in flight). A short
#: range gets smaller fetches (``fetch_bytes_for``): the consumer fetches ahead, and
#: whatever lies past the range's end is decoded for nothing.
FETCH_BYTES: Final = 8 << 20
MIN_FETCH_BYTES: Final = 1 << 20
#: Bytes per record assumed when sizing a short range's fetches (generous: a fetch
#: always returns at least one whole batch, so a low guess costs round trips, not
#: progress).
_BYTES_PER_RECORD_GUESS: Final = 512
#: Rows per Arrow batch handed to Spark. A fetch decodes into one small chunk per wire
#: batch (about 1,000 records with the producer's defaults); the JVM pays per batch, so
#: each poll's records are combined into one contiguous table, then cut into batches of
#: this size (on this machine Spark took rows from ~16k-row batches faster than from
#: 1k- or 64k-row ones).
SPARK_BATCH_ROWS: Final = 16384
#: A read that makes no progress this long fails the task (Kafka's source waits
#: ``spark.network.timeout``, 120 s, too): the leader is gone or the log was truncated.
STALL_TIMEOUT_S: Final = 120.0
_POLL_MS: Final = 500


def fetch_bytes_for(records: int) -> int:
    """Fetch size for a range of ``records`` records (see ``FETCH_BYTES``)."""
    return max(MIN_FETCH_BYTES, min(FETCH_BYTES, records * _BYTES_PER_RECORD_GUESS))


def to_spark_table(table: pa.Table, value_type: pa.DataType | None = None) -> pa.Table:
    """A ``CONSUMER_SCHEMA`` table in ``SPARK_ARROW_SCHEMA`` (``value_type``: a typed
    topic's struct ``value`` as Spark expects it): whole-column casts only."""
    timestamps = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")) \
        .cast(pa.timestamp("us", tz="UTC"))
    return pa.Table.from_arrays([
        table.column("key"),
        spark_value(table, value_type),
        table.column("topic"),
        table.column("partition"),
        table.column("offset"),
        timestamps,
        table.column("timestampType"),
        table.column("headers").cast(_HEADERS_TYPE),
    ], schema=spark_arrow_schema(value_type))


def spark_arrow_schema(value_type: pa.DataType | None) -> pa.Schema:
    """``SPARK_ARROW_SCHEMA``, with ``value_type`` (a typed topic's) as ``value``'s type."""
    if value_type is None:
        return SPARK_ARROW_SCHEMA
    return SPARK_ARROW_SCHEMA.set(1, pa.field("value", value_type))


def spark_value(table: pa.Table, value_type: pa.DataType | None) -> pa.ChunkedArray:
    """``table``'s value column as Spark expects it: binary, or ``value_type`` (a struct,
    cast from the schema's Arrow type: microsecond timestamps, binary for fixed, Spark's
    names for list and map fields). A topic whose values do not have that shape (a topic
    that joined a pattern subscription since the query started) fails the task with
    what to do."""
    values = table.column("value")
    topic = table.column("topic")[0].as_py() if table.num_rows else "?"
    if value_type is None:
        if pa.types.is_binary(values.type):
            return values
        raise StrataSparkOptionError(
            "subscribe", f"topic {topic} is typed, but this query was planned with binary "
            "values (none of its topics was typed when it started); restart the query so "
            "that its schema is worked out again, or set valueFormat=binary")
    if not pa.types.is_struct(values.type):
        raise StrataSparkOptionError(
            "subscribe", f"topic {topic} is not typed (its values are bytes), but this query "
            "reads struct values of a typed topic; subscribe to typed topics of one value "
            "subject only, or set valueFormat=binary")
    try:
        return values.cast(value_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise StrataSparkOptionError(
            "subscribe", f"the values of topic {topic} ({values.type}) do not have the struct "
            f"type this query was planned with ({value_type}): {err}; subscribe to topics of "
            "one value subject, and restart the query after the subject changes") from None


# ----------------------------------------------------------------------------- planning


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


# ----------------------------------------------------------------------------- the cluster


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition's readable range right now: ``[log_start, high_watermark)`` on the
    brokers, plus what its Delta tier holds below that (``tier``).

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
        out = dict(sorted(out.items()))
        return self.with_tiers(out, described) if tiers else out

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


def _data_loss(options: SourceOptions, message: str) -> None:
    """Fail with ``message`` (failOnDataLoss=true) or log it as a warning (false)."""
    if options.fail_on_data_loss:
        raise StrataSparkDataLossError(
            f"{message}. Set the source option failOnDataLoss=false to skip the lost records "
            "with a warning, or restart the query from a new checkpointLocation")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


# ----------------------------------------------------------------------------- typed values

#: Keys of the ``value`` field's metadata in the schema ``describe_value`` returns.
META_SUBJECT: Final = "strata.value.subject"
META_VERSION: Final = "strata.value.version"
META_SCHEMA: Final = "strata.value.schema"
META_SCHEMA_TYPE: Final = "strata.value.schemaType"


@dataclass(frozen=True, slots=True)
class ValueShape:
    """The value schema a query over typed topics reads under: ``subject`` at ``version``
    (``schema``/``schema_type``: its text), or no subject at all (bytes topics only)."""

    subject: str | None = None
    version: int | None = None
    schema: str | None = None
    schema_type: str = "AVRO"


def describe_value(options: SourceOptions) -> tuple[ValueShape, Any]:
    """On the driver: which value schema the subscription's topics share, and the Spark
    schema of the source for it (a ``StructType``). Raises ``StrataSparkOptionError`` when
    struct values are asked of topics that do not share one value subject."""
    from pyspark.sql.types import StructField, StructType

    from spark_source._datasource import SCHEMA_DDL
    from wire.schema import parse_schema

    admin = Admin(options.bootstrap, client_id="strata-spark-source",
                  security=options.security)
    try:
        existing = admin.list_topics()
        topics = sorted(t for t in existing if options.subscribes_to(t))
        # From the metadata, not DESCRIBE_CONFIGS, which a reader need not be allowed.
        subjects = admin.value_subjects(topics) if topics else {}
        typed = {topic: subject for topic, subject in subjects.items() if subject}
        if not typed:
            return ValueShape(), SCHEMA_DDL
        distinct = sorted(set(typed.values()))
        if options.value_format != "struct":
            if len(distinct) > 1:  # frames name their schema ids; no version to pin
                return ValueShape(), SCHEMA_DDL
            registered = admin.get_schema(distinct[0], options.value_schema_version or "latest")
            return ValueShape(distinct[0], registered.version, registered.schema,
                              registered.schema_type), SCHEMA_DDL
        if len(distinct) > 1:
            listed = "; ".join(f"{t}: {s}" for t, s in sorted(typed.items()))
            raise StrataSparkOptionError(
                "subscribe", f"{options.subscription} covers typed topics of different value "
                f"subjects ({listed}), and a struct value column has one type; read each "
                "subject in its own query (and union the results), or set "
                "valueFormat=binary for Confluent-framed bytes")
        untyped = sorted(t for t in topics if t not in typed)
        if untyped:
            raise StrataSparkOptionError(
                "subscribe", f"{options.subscription} mixes typed topics "
                f"({', '.join(sorted(typed))}, subject {distinct[0]}) with bytes topics "
                f"({', '.join(untyped)}), whose values cannot be a struct; read them in "
                "separate queries, or set valueFormat=binary to read every value as bytes")
        registered = admin.get_schema(distinct[0], options.value_schema_version or "latest")
    finally:
        admin.close()
    shape = ValueShape(distinct[0], registered.version, registered.schema,
                       registered.schema_type)
    value_type = spark_struct_type(parse_schema(shape.schema or "", shape.schema_type)
                                   .arrow_type)
    metadata = {META_SUBJECT: shape.subject, META_VERSION: shape.version,
                META_SCHEMA: shape.schema, META_SCHEMA_TYPE: shape.schema_type}
    bytes_schema = _bytes_struct_type()
    fields = [StructField("value", value_type, True, metadata) if f.name == "value" else f
              for f in bytes_schema.fields]
    return shape, StructType(fields)


def spark_struct_type(arrow_type: pa.DataType) -> Any:
    """The Spark type of a schema's Arrow struct: ``wire.schema.spark_arrow_type`` (the
    types Spark's Arrow interchange has), then pyspark's own mapping, so that the Arrow
    type Spark checks (``to_arrow_type`` of it) is what ``spark_value`` casts to."""
    from pyspark.sql.pandas.types import from_arrow_type

    from wire.schema import spark_arrow_type

    return from_arrow_type(spark_arrow_type(arrow_type))


def _bytes_struct_type() -> Any:
    """``SCHEMA_DDL`` as a ``StructType`` (built in Python: no JVM here)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(SPARK_ARROW_SCHEMA)


def with_value_shape(options: SourceOptions, schema: Any) -> SourceOptions:
    """``options`` completed from the schema Spark planned the query with (``schema()``'s,
    or one the user gave): the pinned subject version, and the Arrow type of a struct
    ``value``. A user-given struct value without the source's metadata is checked against
    the subscription's current schema."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    names = [f.name for f in schema.fields]
    if "value" not in names:
        return options
    value = schema.fields[names.index("value")]
    metadata = value.metadata or {}
    if not isinstance(value.dataType, StructType):
        if options.value_format == "struct":
            return options  # no typed topic when the query was planned
        # binary/json: pin the version here (one subject), so every task frames alike.
        shape, _ = describe_value(options)
        return _pinned(options, shape, None)
    if META_VERSION not in metadata:
        shape, planned = describe_value(options)
        if not isinstance(planned, StructType) or \
                planned["value"].dataType != value.dataType:
            raise StrataSparkOptionError(
                "schema", f"the schema given to spark.read.schema(...) has value "
                f"{value.dataType.simpleString()}, which is not the value type of "
                f"{options.subscription} ({_simple(planned)}); drop .schema(...): the "
                "source works its schema out from the topics' value subject")
    else:
        shape = ValueShape(metadata[META_SUBJECT], metadata[META_VERSION],
                           metadata.get(META_SCHEMA), metadata.get(META_SCHEMA_TYPE, "AVRO"))
    return _pinned(options, shape, to_arrow_type(value.dataType, timezone="UTC"))


def _pinned(options: SourceOptions, shape: ValueShape, arrow_type: pa.DataType | None
            ) -> SourceOptions:
    text = None if shape.schema is None else (shape.schema, shape.schema_type)
    return replace(options, value_schema_version=shape.version, value_schema=text,
                   value_arrow_type=arrow_type)


def _simple(schema: Any) -> str:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return str(schema["value"].dataType.simpleString())
    return "binary"


# ----------------------------------------------------------------------------- reading


def _consumer(options: SourceOptions, records: int) -> Consumer:
    fetch_bytes = fetch_bytes_for(records)
    version = options.value_schema_version
    return Consumer(options.bootstrap, client_id="strata-spark-source", security=options.security,
                    auto_offset_reset="none", max_partition_fetch_bytes=fetch_bytes,
                    fetch_max_bytes=fetch_bytes,
                    value_format=CONSUMER_VALUE_FORMAT[options.value_format],  # type: ignore[arg-type]
                    value_schema_version="latest" if version is None else version)


def read_ranges(options: SourceOptions, ranges: tuple[OffsetRange, ...]
                ) -> Iterator[pa.RecordBatch]:
    """Read several ranges in order through one consumer (a ``RangeGroup``'s task); a
    group of Delta tier ranges only opens none."""
    hot = [r.end - r.start for r in ranges if r.source == "log"]
    consumer = _consumer(options, max(hot)) if hot else None
    try:
        for rng in ranges:
            yield from read_range(options, rng, consumer)
    finally:
        if consumer is not None:
            consumer.close()


def read_range(options: SourceOptions, rng: OffsetRange,
               shared: Consumer | None = None) -> Iterator[pa.RecordBatch]:
    """Yield records ``[rng.start, rng.end)`` of one partition as Spark Arrow batches.

    A ``tier`` range is read from the Delta table. In a ``log`` range, offsets below the
    log start (deleted since the batch was planned) are read from the Delta tier where it
    holds them and are data loss where it does not; a partition whose log now ends
    before the range (topic recreated) is data loss too. ``shared``: a consumer to
    (re)assign instead of opening one (kept open).
    """
    if rng.source == "tier":
        yield from _read_below_log(options, rng, rng.start, rng.end, log_start=None)
        return
    tp = rng.topic_partition
    consumer = shared if shared is not None else _consumer(options, rng.end - rng.start)
    try:
        consumer.assign([tp])
        position = rng.start
        consumer.seek(tp, position)
        # Only time inside empty polls is a stall: Spark may take any time with what
        # this generator yielded before it asks for more.
        idle = IdleTimer(STALL_TIMEOUT_S * 1000)
        while position < rng.end:
            try:
                idle.start()
                table = consumer.poll_arrow(timeout_ms=_POLL_MS)
            except OffsetOutOfRangeError as err:
                idle.progress()
                if 0 <= position < err.log_start_offset:
                    below = min(err.log_start_offset, rng.end)
                    yield from _read_below_log(options, rng, position, below,
                                               log_start=err.log_start_offset)
                    position = below
                else:
                    position = _skip_lost(options, rng, position, err)
                if position < rng.end:
                    consumer.seek(tp, position)
                continue
            idle.stop(table.num_rows)
            if table.num_rows == 0:
                if idle.expired:
                    raise RequestTimedOutError(
                        f"no records of {tp} arrived for {STALL_TIMEOUT_S:.0f} s while "
                        f"offsets [{position}, {rng.end}) were still to be read; check that "
                        f"the partition has a live leader (strata topic describe {rng.topic})")
                continue
            offsets = table.column("offset")
            last = offsets[-1].as_py()
            if last >= rng.end:  # offsets ascend: keep the rows below the end
                table = table.slice(0, pc.sum(pc.less(offsets, rng.end)).as_py() or 0)
            position = min(last + 1, rng.end)
            if table.num_rows:
                yield from to_spark_table(table, options.value_arrow_type).combine_chunks() \
                    .to_batches(max_chunksize=SPARK_BATCH_ROWS)
    finally:
        if shared is None:
            consumer.close()


def _read_below_log(options: SourceOptions, rng: OffsetRange, start: int, end: int, *,
                    log_start: int | None) -> Iterator[pa.RecordBatch]:
    """Offsets ``[start, end)`` of ``rng``'s partition, which the broker no longer has
    (``log_start``: its log start as it just reported it; ``None`` for a range planned
    from the tier): from the Delta tier where it holds them; the runs it does not hold
    are data loss (``failOnDataLoss``).

    The tier's extent is asked of the cluster again (``_current_tier``): the tiering job
    may have copied more, or tier retention deleted some, since the batch was planned.
    """
    tp = rng.topic_partition
    tier = _current_tier(options, rng)
    if log_start is None:
        where = "" if tier is None else f"; its Delta tier {tier.table} holds offsets " \
            f"{tier.start}..{tier.end - 1}"
    else:
        where = f"; the log now starts at offset {log_start}" + (
            "" if tier is None else f" and its Delta tier {tier.table} holds offsets "
            f"{tier.start}..{tier.end - 1}")
    if tier is None or not tier.holds_records:
        _data_loss(options, f"records {start}..{end - 1} of {tp} were deleted (retention or "
                   f"a topic deletion) before the query read them{where}")
        return
    low, high = max(start, tier.start), min(end, tier.end)
    if start < min(low, end):
        _data_loss(options, f"records {start}..{min(low, end) - 1} of {tp} were deleted "
                   "from the brokers and from the Delta tier (its retention) before the "
                   f"query read them{where}")
    if low < high:
        from spark_source._tier import read_tier_range

        yield from read_tier_range(tier.table, rng.topic, rng.partition, low, high,
                                   batch_rows=SPARK_BATCH_ROWS,
                                   value_type=options.value_arrow_type,
                                   value_schema=options.value_schema)
    if max(start, high) < end:
        _data_loss(options, f"records {max(start, high)}..{end - 1} of {tp} were deleted "
                   "from the brokers before the tiering job copied them to the Delta tier"
                   f"{where}")


def _current_tier(options: SourceOptions, rng: OffsetRange) -> TierInfo | None:
    """``rng``'s partition's Delta tier as the cluster describes it now (the planned one
    if the cluster cannot say: an executor has only the range and the options)."""
    admin = Admin(options.bootstrap, client_id="strata-spark-source",
                  security=options.security)
    try:
        return describe_tiers(admin, [rng.topic]).get(rng.topic_partition, rng.tier)
    except UnknownTopicOrPartitionError:
        return rng.tier
    finally:
        admin.close()


def _skip_lost(options: SourceOptions, rng: OffsetRange, position: int,
               err: OffsetOutOfRangeError) -> int:
    """Where to go on after an out-of-range fetch at ``position`` past the log's end (or
    raise); offsets below the log start are ``_read_below_log``'s."""
    tp = rng.topic_partition
    if 0 <= err.log_end_offset < position:
        _data_loss(options, f"{tp} now ends at offset {err.log_end_offset}, before offset "
                   f"{position} where the query was to read on (the topic was probably "
                   f"deleted and recreated); records {position}..{rng.end - 1} are not there")
        return rng.end
    raise err


class _ReadsRanges:
    """``read`` for both readers: an ``OffsetRange`` becomes Arrow batches."""

    options: SourceOptions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangeGroup):
            return read_ranges(self.options, partition.ranges)
        if not isinstance(partition, OffsetRange):
            # Spark turns an empty plan into one InputPartition(None): nothing to read.
            return iter(())
        return read_range(self.options, partition)


# ----------------------------------------------------------------------------- batch


class StrataBatchReader(_ReadsRanges, DataSourceReader):
    """``spark.read.format("strata")``: ``startingOffsets`` .. ``endingOffsets``, once.

    The offsets are resolved when Spark plans the read (``partitions``), on the driver.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[OffsetRange]:
        view = ClusterView(self.options)
        try:
            snapshot = view.snapshot(require_topics=True)
            begin = _starting_offsets(self.options, view, snapshot)
            assert self.options.ending_offsets is not None
            end = resolve_offsets("endingOffsets", self.options.ending_offsets, snapshot)
        finally:
            view.close()
        for tp in sorted(end):
            if begin[tp] > end[tp]:
                raise StrataSparkOptionError(
                    "endingOffsets", f"ends {tp} at offset {end[tp]}, before its starting "
                    f"offset {begin[tp]}; choose an end at or after the start")
            lost = snapshot[tp].lost(begin[tp], end[tp])
            if lost is not None and self.options.fail_on_data_loss:
                _data_loss(self.options, f"records {lost[0]}..{lost[1] - 1} of {tp} were "
                           "deleted (retention) before this query could read them; "
                           f"{snapshot[tp].describe_tiers()}")
        return split_tiered(plan_ranges(begin, end, self.options.min_partitions), snapshot)


def _starting_offsets(options: SourceOptions, view: ClusterView,
                      snapshot: Mapping[TopicPartition, PartitionOffsets]) -> Offsets:
    if options.starting_timestamp is not None:
        timestamp = options.starting_timestamp
        found = view.offsets_for_timestamp(list(snapshot), timestamp)
        out: Offsets = {}
        tables: dict[str, TierTable] = {}
        for tp, offset in found.items():
            bounds = snapshot[tp]
            tier = bounds.tier
            # The broker's first record is late enough (or it has none): earlier ones may
            # be in the Delta tier, whose time the broker's index does not cover.
            if tier is not None and bounds.earliest < bounds.log_start \
                    and offset <= bounds.log_start:
                if tier.table not in tables:
                    from spark_source._tier import TierTable

                    tables[tier.table] = TierTable(tier.table)
                in_tier = tables[tier.table].first_offset_at(
                    tp.partition, tier.start, min(tier.end, bounds.log_start), timestamp)
                if in_tier is not None:
                    out[tp] = in_tier
                    continue
            # No record that late: start at the end, so only newer records are read.
            out[tp] = offset if offset >= 0 else bounds.high_watermark
        return out
    assert options.starting_offsets is not None
    return resolve_offsets("startingOffsets", options.starting_offsets, snapshot)


# ----------------------------------------------------------------------------- streaming


class StrataStreamReader(_ReadsRanges, DataSourceStreamReader,
                         SupportsTriggerAvailableNow):
    """``spark.readStream.format("strata")``: micro-batches of offset ranges.

    State kept between calls (all of it recomputable, so a restart loses nothing):
    the last high watermarks seen (``reportLatestOffset``), the begin offsets chosen for
    partitions discovered by ``latestOffset`` (so ``partitions`` plans exactly the range
    that was admitted), the last cluster snapshot (log starts and Delta tiers, to cut
    ranges between the tiers without asking again) and the ``Trigger.AvailableNow``
    target.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._view = ClusterView(options)
        self._latest: Offsets | None = None
        self._new_begins: Offsets = {}
        self._snapshot: dict[TopicPartition, PartitionOffsets] | None = None
        self._available_now: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options (read); driver-side state stays behind.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._view = ClusterView(self.options)
        self._latest = None
        self._new_begins = {}
        self._snapshot = None
        self._available_now = None

    # -------------------------------------------------------------- offsets
    def initialOffset(self) -> OffsetsJson:
        """Where a new query starts (a restarted one starts from its checkpoint)."""
        snapshot = self._view.snapshot(require_topics=True)
        start = _starting_offsets(self.options, self._view, snapshot)
        self._latest = {tp: o.high_watermark for tp, o in snapshot.items()}
        self._snapshot = snapshot
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as Spark's admission control (4.2) sees it."""
        if self.options.max_offsets_per_trigger is None:
            return super().getDefaultReadLimit()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def latestOffset(self, start: OffsetsJson, limit: ReadLimit) -> OffsetsJson:
        """End offsets of the next batch: the high watermarks, capped by the
        ``Trigger.AvailableNow`` target and by ``limit``."""
        begin = offsets_from_json(start, "start offset")
        snapshot = self._view.snapshot(require_topics=False, tiers=False)
        latest = {tp: o.high_watermark for tp, o in snapshot.items()}
        self._latest = latest

        for tp in sorted(set(begin) - set(snapshot)):
            if not self.options.subscribes_to(tp.topic):
                # The query was restarted with another subscription: not data loss.
                log.info("%s is no longer subscribed (%s); not reading it any more", tp,
                         self.options.subscription)
                del begin[tp]
                continue
            _data_loss(self.options, f"{tp} no longer exists (its topic was deleted); "
                       f"records from offset {begin[tp]} on may never have been read")
            del begin[tp]
        new = sorted(set(snapshot) - set(begin))
        if self._available_now is not None:
            new = [tp for tp in new if tp in self._available_now]
        # The Delta tier matters only where reading starts below a log start: new
        # partitions (read from their earliest offset), a recreated topic, a checkpoint
        # that fell behind retention. At the head of the log no DescribeTier is sent.
        behind = {tp.topic for tp, offset in begin.items() if tp in snapshot and (
            offset < snapshot[tp].log_start
            or offset > max(snapshot[tp].high_watermark, snapshot[tp].log_end))}
        snapshot = self._view.with_tiers(snapshot, behind | {tp.topic for tp in new})
        self._snapshot = snapshot
        self._new_begins = {tp: snapshot[tp].earliest for tp in new}
        if new:
            log.info("reading new partitions %s from their earliest offsets", describe(new))
        begin.update(self._new_begins)

        for tp, offset in sorted(begin.items()):
            bounds = snapshot[tp]
            if offset > max(bounds.high_watermark, bounds.log_end):
                _data_loss(self.options, f"{tp} now ends at offset {bounds.high_watermark}, "
                           f"before offset {offset} where the query was to read on (the "
                           "topic was probably deleted and recreated)")
                self._new_begins[tp] = bounds.earliest
                begin[tp] = bounds.earliest
            elif self.options.fail_on_data_loss and \
                    (lost := bounds.lost(offset, bounds.log_start)) is not None:
                _data_loss(self.options, f"records {lost[0]}..{lost[1] - 1} of {tp} were "
                           "deleted (retention) before the query read them; "
                           f"{bounds.describe_tiers()}")

        target = {tp: latest[tp] for tp in begin}
        if self._available_now is not None:
            target = {tp: min(hw, self._available_now.get(tp, begin[tp]))
                      for tp, hw in target.items()}
        target = {tp: max(offset, begin[tp]) for tp, offset in target.items()}
        if isinstance(limit, ReadMaxRows):
            return offsets_to_json(rate_limit(begin, target, limit.max_rows))
        return offsets_to_json(target)

    def reportLatestOffset(self) -> OffsetsJson | None:
        """The newest offsets seen (uncapped), so query progress shows the lag."""
        return None if self._latest is None else offsets_to_json(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: today's high watermarks. Later records, and partitions created
        later, wait for the next run, so the query stops once it has caught up."""
        snapshot = self._view.snapshot(require_topics=False, tiers=False)
        self._available_now = {tp: o.high_watermark for tp, o in snapshot.items()}

    def partitions(self, start: OffsetsJson, end: OffsetsJson) -> list[OffsetRange | RangeGroup]:
        begin = offsets_from_json(start, "start offset")
        until = offsets_from_json(end, "end offset")
        # Partitions that latestOffset discovered (or reset after a recreation) begin
        # where it admitted them. A restarted query re-plans its last batch without a
        # latestOffset call; those begin at today's earliest offset, as they would have.
        moved = [tp for tp, offset in until.items() if tp not in begin or begin[tp] > offset]
        unknown = [tp for tp in moved if tp not in self._new_begins]
        if self._snapshot is None or unknown:
            # A restart re-plans its last batch without latestOffset: ask again, with the
            # tiers of the topics whose ranges may begin below a log start.
            fresh = self._view.snapshot(require_topics=False, tiers=False)
            self._snapshot = self._view.with_tiers(fresh, {
                tp.topic for tp in until
                if tp in fresh and (tp in moved or begin[tp] < fresh[tp].log_start)})
        snapshot = self._snapshot
        for tp in moved:
            earliest = snapshot[tp].earliest if tp in snapshot else until[tp]
            begin[tp] = self._new_begins.get(tp, earliest)
        ranges = split_tiered(plan_ranges(begin, until, self.options.min_partitions),
                              snapshot)
        if self.options.min_partitions is not None:
            return list[OffsetRange | RangeGroup](ranges)
        return pack_ranges(ranges)

    def commit(self, end: OffsetsJson) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets; brokers keep no state for
        this reader."""

    def stop(self) -> None:
        self._view.close()
