"""The two Spark readers: ``StrataBatchReader`` and ``StrataStreamReader``.

How a micro-batch flows through the PySpark 4.2 Python Data Source API, and where each
piece lives:

* ``StrataStreamReader`` runs on the driver, in the long-lived Python worker Spark keeps
  for the query's source. ``initialOffset`` resolves ``startingOffsets`` /
  ``startingTimestamp`` to concrete offsets; ``latestOffset(start, limit)`` asks the
  cluster for every subscribed partition's high watermark (new partitions and new topics
  matching ``subscribePattern`` start at their earliest offset), applies
  ``maxOffsetsPerTrigger`` (``ReadMaxRows``) and the ``Trigger.AvailableNow`` target, and
  returns the batch's end offsets; ``partitions(start, end)`` cuts ``[start, end)`` per
  partition into ``OffsetRange`` s, split further to honour ``minPartitions``
  (``_planning``).
* Spark checkpoints ``end`` in its offset log before the batch runs, so a re-run batch
  (after a crash) gets the same ranges: the source needs no state of its own and
  ``commit`` has nothing to do.
* ``read(range)`` runs in an executor's Python worker (``_read``), on a copy of the
  reader unpickled there, which is why the reader opens no connection before it is used.

Both readers take ``SourceOptions`` already completed with the query's value shape
(``_values.with_value_shape``, for typed topics).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_source._errors import StrataSparkOptionError
from spark_source._options import (
    Offsets,
    OffsetsJson,
    SourceOptions,
    describe,
    offsets_from_json,
    offsets_to_json,
)
from spark_source._planning import (
    ClusterView,
    OffsetRange,
    PartitionOffsets,
    RangeGroup,
    data_loss,
    pack_ranges,
    plan_ranges,
    rate_limit,
    resolve_offsets,
    split_tiered,
)
from spark_source._read import ReadsRanges
from strata.client import TopicPartition

if TYPE_CHECKING:  # pragma: no cover - imported where used: deltalake loads slowly
    from spark_source._tier import TierTable

__all__ = ["StrataBatchReader", "StrataStreamReader"]

log = logging.getLogger("strata.spark_source.reader")


class StrataBatchReader(ReadsRanges, DataSourceReader):
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
                data_loss(self.options, f"records {lost[0]}..{lost[1] - 1} of {tp} were "
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


class StrataStreamReader(ReadsRanges, DataSourceStreamReader,
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
            data_loss(self.options, f"{tp} no longer exists (its topic was deleted); "
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
                data_loss(self.options, f"{tp} now ends at offset {bounds.high_watermark}, "
                          f"before offset {offset} where the query was to read on (the "
                          "topic was probably deleted and recreated)")
                self._new_begins[tp] = bounds.earliest
                begin[tp] = bounds.earliest
            elif self.options.fail_on_data_loss and \
                    (lost := bounds.lost(offset, bounds.log_start)) is not None:
                data_loss(self.options, f"records {lost[0]}..{lost[1] - 1} of {tp} were "
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
