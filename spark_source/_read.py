"""Executor-side reading: an ``OffsetRange`` becomes Spark Arrow batches.

``read(range)`` runs in an executor's Python worker, on a copy of the reader unpickled
there (which is why nothing here keeps a connection between tasks). ``read_range`` reads
exactly ``[start, end)`` from the partition leader with a ``strata.client.Consumer``
(manual assignment + seek; it follows leader changes through metadata, and the broker
serves only committed records, below the high watermark) at the query's isolation
level: at read_committed the fetch stops at the last stable offset and the consumer
drops aborted transactions batch by batch, with the aborted list of the same fetch
answer; transaction markers and aborted records have no row, so a range is done when
the consumer's position (which moves past them) reaches its end, not its last row. It
yields
``pyarrow.RecordBatch``es built column-wise from the fetched batches (``_arrow``): no
per-record Python. A range planned from the Delta tier, and offsets the broker no longer
has when the task runs (retention deleted what the tiering job had already copied), are
read from the tier (``_tier``) before anything counts as lost (``_planning.data_loss``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from spark_source._arrow import SPARK_BATCH_ROWS, to_spark_table
from spark_source._options import CONSUMER_VALUE_FORMAT, SourceOptions
from spark_source._planning import (
    OffsetRange,
    RangeGroup,
    TierInfo,
    data_loss,
    describe_tiers,
)
from strata.client import (
    Admin,
    Consumer,
    IdleTimer,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

__all__ = ["FETCH_BYTES", "STALL_TIMEOUT_S", "ReadsRanges", "fetch_bytes_for", "read_range",
           "read_ranges"]

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
#: A read that makes no progress this long fails the task (Kafka's source waits
#: ``spark.network.timeout``, 120 s, too): the leader is gone or the log was truncated.
STALL_TIMEOUT_S: Final = 120.0
_POLL_MS: Final = 500



def fetch_bytes_for(records: int) -> int:
    """Fetch size for a range of ``records`` records (see ``FETCH_BYTES``)."""
    return max(MIN_FETCH_BYTES, min(FETCH_BYTES, records * _BYTES_PER_RECORD_GUESS))


def _consumer(options: SourceOptions, records: int) -> Consumer:
    fetch_bytes = fetch_bytes_for(records)
    version = options.value_schema_version
    return Consumer(options.bootstrap, client_id="strata-spark-source", security=options.security,
                    auto_offset_reset="none", max_partition_fetch_bytes=fetch_bytes,
                    fetch_max_bytes=fetch_bytes,
                    value_format=CONSUMER_VALUE_FORMAT[options.value_format],  # type: ignore[arg-type]
                    value_schema_version="latest" if version is None else version,
                    isolation_level=options.isolation_level)


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
                # Markers and aborted transactions have no row: the consumer's position
                # moves past them all the same (maybe to the end of the range).
                moved = min(consumer.position(tp), rng.end)
                if moved > position:
                    position = moved
                    idle.progress()
                    continue
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
            if position < rng.end:  # rows may be followed by markers up to the end
                position = max(position, min(consumer.position(tp), rng.end))
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
        data_loss(options, f"records {start}..{end - 1} of {tp} were deleted (retention or "
                  f"a topic deletion) before the query read them{where}")
        return
    low, high = max(start, tier.start), min(end, tier.end)
    if start < min(low, end):
        data_loss(options, f"records {start}..{min(low, end) - 1} of {tp} were deleted "
                  "from the brokers and from the Delta tier (its retention) before the "
                  f"query read them{where}")
    if low < high:
        from spark_source._tier import read_tier_range

        yield from read_tier_range(tier.table, rng.topic, rng.partition, low, high,
                                   batch_rows=SPARK_BATCH_ROWS,
                                   value_type=options.value_arrow_type,
                                   value_schema=options.value_schema)
    if max(start, high) < end:
        data_loss(options, f"records {max(start, high)}..{end - 1} of {tp} were deleted "
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
        data_loss(options, f"{tp} now ends at offset {err.log_end_offset}, before offset "
                  f"{position} where the query was to read on (the topic was probably "
                  f"deleted and recreated); records {position}..{rng.end - 1} are not there")
        return rng.end
    raise err


class ReadsRanges:
    """``read`` for both readers: an ``OffsetRange`` becomes Arrow batches."""

    options: SourceOptions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangeGroup):
            return read_ranges(self.options, partition.ranges)
        if not isinstance(partition, OffsetRange):
            # Spark turns an empty plan into one InputPartition(None): nothing to read.
            return iter(())
        return read_range(self.options, partition)
