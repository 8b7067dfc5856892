"""Replay from the Delta tier: ``spark_source._tier`` and the source's tier planning.

One SparkSession for the module (``local[2]``, 2 shuffle partitions, parquet timestamps
as ``TIMESTAMP_MICROS`` as the tier contract requires), used only to write Delta tables
the way the tiering job does; the reads go through delta-rs, as in Spark's Python
workers. Three layers:

* ``read_tier_range`` against tables written by Spark from generated records in the
  contract's shape: exact rows, Arrow shape, ascending order, pruning, errors.
* The planning rules (``earliest``, what counts as lost, where a range is cut) on
  ``PartitionOffsets`` values, no cluster needed.
* A real broker whose log start moved past records that a Delta table holds: the
  executor's fallback to the tier, the planner's split, ``failOnDataLoss`` only for
  offsets in neither tier; then the whole path through Spark (ZooKeeper's tier records
  via ``Admin.describe_tier``, batch and stream from earliest, ``startingTimestamp``),
  and a table written by the real tiering job (``spark_jobs.TierJob``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import pickle
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from spark_source import StrataSparkDataLossError, StrataSparkTierError
from spark_source._arrow import SPARK_ARROW_SCHEMA
from spark_source._options import parse_source_options
from spark_source._planning import (
    ClusterView,
    OffsetRange,
    PartitionOffsets,
    TierInfo,
    resolve_offsets,
    split_tiered,
)
from spark_source._read import read_range, read_ranges
from spark_source._reader import StrataBatchReader
from spark_source._tier import TierTable, read_tier_range, tier_bounds
from strata.client import Admin, NewTopic, Producer, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(180)]

_names = itertools.count()
TOPIC = "tiered"
#: Record timestamps of the generated tables: 2023-11-14T22:13:20Z + one minute per
#: offset, so a partition's rows span two UTC dates (two ``date`` partitions).
BASE_TS = 1_700_000_000_000
#: Partition 0 of the generated table holds offsets 0..1199 less these (every 50th offset
#: is a "control record", never tiered) and partition 1 holds 0..299.
GAP = 50
DELTA_WRITE = {"delta.enableDeletionVectors": "false"}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The module's session: repository defaults plus the tier contract's timestamp
    encoding (delta-rs cannot read Spark's legacy INT96)."""
    from strata_spark import spark_session

    session = spark_session("strata-test_spark_tier_replay", {
        # The catalog in a temp dir, not ./spark-warehouse in the checkout.
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    })
    try:
        yield session
    finally:
        session.stop()


def generated(partition: int, offsets: list[int]) -> pa.Table:
    """Records in ``SPARK_ARROW_SCHEMA`` with every shape the schema allows: null keys,
    empty header lists, null header values, both timestamp types."""
    n = len(offsets)
    return pa.Table.from_pydict({
        "key": [None if o % 5 == 0 else f"k{o}".encode() for o in offsets],
        "value": [f"value-{partition}-{o}".encode() * (1 + o % 3) for o in offsets],
        "topic": [TOPIC] * n,
        "partition": [partition] * n,
        "offset": offsets,
        "timestamp": [dt.datetime.fromtimestamp((BASE_TS + o * 60_000) / 1000, dt.UTC)
                      for o in offsets],
        "timestampType": [int(o % 7 == 0) for o in offsets],
        "headers": [[] if o % 3 == 0 else [{"key": "h", "value": f"v{o}".encode()},
                                           {"key": "nil", "value": None}]
                    for o in offsets],
    }, schema=SPARK_ARROW_SCHEMA)


@pytest.fixture(scope="module")
def records() -> pa.Table:
    """Everything the generated tables hold, in offset order per partition."""
    return pa.concat_tables([
        generated(0, [o for o in range(1200) if o % GAP != GAP - 1]),
        generated(1, list(range(300))),
    ])


def write_tier(spark: Any, rows: pa.Table | Any, path: Path, *, layout: str,
               mode: str = "overwrite") -> str:
    """Write ``rows`` (Arrow, or a DataFrame in the source schema) as the tiering job
    does: plus ``date``, partitioned by (partition, date), no deletion vectors.
    ``layout``: ``range`` gives files of disjoint offset ranges (8 per write),
    ``shuffled`` files that overlap (rows dealt round-robin over 3 tasks), each in
    descending offset order."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(rows) if isinstance(rows, pa.Table) else rows
    frame = frame.withColumn("date", F.to_date("timestamp"))
    frame = frame.repartitionByRange(8, "partition", "offset") if layout == "range" \
        else frame.repartition(3).sortWithinPartitions(F.col("offset").desc())
    writer = frame.write.format("delta").mode(mode).partitionBy("partition", "date")
    for key, value in DELTA_WRITE.items():
        writer = writer.option(key, value)
    writer.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def ranged(spark: Any, records: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tier(spark, records, tmp_path_factory.mktemp("tier") / "ranged",
                      layout="range")


@pytest.fixture(scope="module")
def shuffled(spark: Any, records: pa.Table, tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tier(spark, records, tmp_path_factory.mktemp("tier") / "shuffled",
                      layout="shuffled")


def expected(records: pa.Table, partition: int, start: int, end: int) -> pa.Table:
    offsets = records.column("offset")
    mask = pc.and_(pc.equal(records.column("partition"), partition),
                   pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))
    return records.filter(mask).sort_by("offset").combine_chunks()


def read_all(uri: str, partition: int, start: int, end: int, *, batch_rows: int = 100
             ) -> pa.Table:
    batches = list(read_tier_range(uri, TOPIC, partition, start, end,
                                   batch_rows=batch_rows))
    for batch in batches:
        # Spark checks every batch's schema exactly, nullability included.
        assert batch.schema.equals(SPARK_ARROW_SCHEMA, check_metadata=True)
        assert 0 < batch.num_rows <= batch_rows
    return pa.Table.from_batches(batches, schema=SPARK_ARROW_SCHEMA).combine_chunks()


# --------------------------------------------------------------------------- read_tier_range


@pytest.mark.parametrize("partition, start, end", [
    (0, 0, 1200),      # everything
    (0, 90, 613),      # cuts files at both ends, crosses the date boundary (offset 107)
    (0, 49, 50),       # only a gap: nothing
    (0, 48, 52),       # around a gap
    (0, 1150, 5000),   # past the end
    (1, 10, 290),
    (0, 500, 500),     # empty
    (0, 600, 400),     # empty (start after end)
    (7, 0, 100),       # a partition the table does not have
])
def test_read_tier_range_returns_exactly_the_rows_in_spark_arrow_shape(
        ranged: str, shuffled: str, records: pa.Table, partition: int, start: int,
        end: int) -> None:
    want = expected(records, partition, start, end)
    for uri in (ranged, shuffled):  # disjoint files and overlapping ones alike
        got = read_all(uri, partition, start, end)
        assert got.column("offset").to_pylist() == want.column("offset").to_pylist()
        assert got.equals(want), uri


def test_read_tier_range_prunes_files_by_partition_and_offset_statistics(
        ranged: str, records: pa.Table) -> None:
    table = TierTable(ranged)
    everything = table.files(0)
    assert len(everything) >= 5  # ~6 writer tasks' worth, one more for the date split
    assert all(f.min_offset is not None and f.max_offset is not None for f in everything)
    assert table.files(7) == []

    needed = table.files_for(0, 300, 320)
    assert 1 <= len(needed) <= 2 < len(everything)
    got = pa.Table.from_batches(list(table.read(TOPIC, 0, 300, 320, batch_rows=1000)))
    assert table.files_read == len(needed)
    assert got.equals(expected(records, 0, 300, 320))

    # Files are read in offset order, so a long range yields rows as it goes: a batch
    # size of one file's worth hands out rows before the last file is opened.
    reading = TierTable(ranged)
    batches = reading.read(TOPIC, 0, 0, 1200, batch_rows=100)
    next(batches)
    assert reading.files_read < len(everything)


def test_first_offset_at_a_timestamp_searches_only_files_late_enough(
        ranged: str, shuffled: str) -> None:
    minute = 60_000
    for uri in (ranged, shuffled):
        table = TierTable(uri)
        # Offset 499 is a gap: the first record at or after its time is 500.
        assert table.first_offset_at(0, 0, 1200, BASE_TS + 499 * minute) == 500
        assert table.first_offset_at(0, 0, 1200, BASE_TS + 499 * minute - 1) == 500
        assert table.first_offset_at(0, 137, 1200, BASE_TS) == 137
        assert table.first_offset_at(0, 0, 400, BASE_TS + 499 * minute) is None
        assert table.first_offset_at(0, 0, 1200, BASE_TS + 5000 * minute) is None
        assert table.first_offset_at(1, 0, 300, BASE_TS + 299 * minute) == 299
    late = TierTable(ranged)
    assert late.first_offset_at(0, 0, 1200, BASE_TS + 1100 * minute) == 1100
    assert late.files_read == 1  # the other files' timestamp maxima are earlier


def test_tier_bounds_come_from_the_log_statistics(ranged: str) -> None:
    assert tier_bounds(ranged, 0) == (0, 1199)  # 1199 is a gap: the last row is 1198
    assert tier_bounds(ranged, 1) == (0, 300)
    assert tier_bounds(ranged, 5) is None


def test_unreadable_tables_raise_tier_unavailable(ranged: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing-here")
    with pytest.raises(StrataSparkTierError, match=r"TIER_UNAVAILABLE\] Delta tier table "
                       rf"{missing}: cannot be opened .*check that the path exists"):
        list(read_tier_range(missing, TOPIC, 0, 0, 10, batch_rows=10))
    assert StrataSparkTierError.code == 1202

    other = tmp_path / "other"  # any Delta table but a tier's (written without Spark)
    write_deltalake(str(other), pa.table({"id": [1], "value": ["a"]}))
    with pytest.raises(StrataSparkTierError, match=r"lacks the column.*date.*offset"):
        tier_bounds(str(other), 0)

    # A data file gone under the reader (vacuumed after a compaction, say).
    copy = tmp_path / "copy"
    shutil.copytree(ranged, copy)
    table = TierTable(str(copy))
    victim = table.files_for(0, 0, 10)[0]
    (copy / victim.path).unlink()
    with pytest.raises(StrataSparkTierError, match=f"data file {victim.path} cannot be read"):
        list(table.read(TOPIC, 0, 0, 10, batch_rows=10))


# --------------------------------------------------------------------------- planning rules


def test_earliest_and_lost_offsets_follow_both_tiers() -> None:
    tier = TierInfo("/t", 100, 500)
    bounds = PartitionOffsets(400, 900, tier=tier)
    assert bounds.earliest == 100
    assert bounds.lost(100, 900) is None          # tier 100..499 + log 400.. cover it
    assert bounds.lost(50, 900) == (50, 100)      # below the tier start
    assert bounds.lost(450, 460) is None
    assert PartitionOffsets(400, 900).earliest == 400
    assert PartitionOffsets(400, 900).lost(300, 900) == (300, 400)
    # A gap between the tier's end and the log start: lost, and earliest is still the tier.
    gap = PartitionOffsets(600, 900, tier=tier)
    assert gap.earliest == 100
    assert gap.lost(100, 900) == (500, 600)
    assert gap.lost(100, 450) is None
    # A table that holds nothing of the partition (start == end) or only what the broker
    # still has does not change earliest.
    assert PartitionOffsets(400, 900, tier=TierInfo("/t", 300, 300)).earliest == 400
    assert PartitionOffsets(50, 900, tier=tier).earliest == 50

    tp = TopicPartition("t", 0)
    assert resolve_offsets("startingOffsets", "earliest", {tp: bounds}) == {tp: 100}
    assert resolve_offsets("startingOffsets", {tp: -2}, {tp: bounds}) == {tp: 100}


def test_ranges_below_the_log_start_are_cut_for_the_tier() -> None:
    tier = TierInfo("/t", 100, 500)
    a, b, c = (TopicPartition(t, 0) for t in "abc")
    snapshot = {a: PartitionOffsets(400, 900, tier=tier), b: PartitionOffsets(0, 50),
                c: PartitionOffsets(400, 900, tier=tier)}
    ranges = split_tiered([OffsetRange("a", 0, 100, 900), OffsetRange("b", 0, 0, 50),
                           OffsetRange("c", 0, 450, 900), OffsetRange("a", 0, 150, 300)],
                          snapshot)
    assert [(r.topic, r.start, r.end, r.source, r.tier) for r in ranges] == [
        ("a", 100, 400, "tier", tier),   # both tiers hold 400..499: the broker reads it
        ("a", 400, 900, "log", tier),
        ("b", 0, 50, "log", None),
        ("c", 450, 900, "log", tier),    # the tier travels for a fallback at read time
        ("a", 150, 300, "tier", tier),
    ]
    copy = pickle.loads(pickle.dumps(ranges[0]))  # how Spark ships it
    assert (copy.start, copy.end, copy.source, copy.tier) == (100, 400, "tier", tier)
    assert "Delta tier" in repr(copy)


# --------------------------------------------------------------------------- with a broker


@pytest.fixture(scope="module")
def bootstrap(strata_broker: BrokerProcess) -> str:
    return strata_broker.bootstrap


def log_start(admin: Admin, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    return admin.list_offsets({tp: "earliest"})[tp].offset


def produce(bootstrap: str, topic: str, batches: int, per_batch: int = 3, *,
            first: int = 0) -> None:
    """``batches`` small batches (one flush each) of records ``first`` on; 1 KiB
    segments then hold a few batches each."""
    now = int(time.time() * 1000)  # recent: retention.ms applies only once lowered
    with Producer(bootstrap, linger_ms=1) as producer:
        for b in range(batches):
            for i in range(first + b * per_batch, first + (b + 1) * per_batch):
                producer.send(topic, f"value-{i}".encode(),
                              key=None if i % 4 == 0 else f"k{i}".encode(),
                              headers=[] if i % 3 == 0 else [("h", f"{i}".encode())],
                              partition=0, timestamp_ms=now + i)
            producer.flush()


def strata_rows(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
        .option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.fixture(scope="module")
def moved(spark: Any, bootstrap: str, admin: Admin,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, pa.Table, int]:
    """A topic of 36 records, all copied to a Delta table (with a Spark batch read of the
    source, as the tiering job copies), whose broker log was then cut by retention past
    offset 24. Returns (topic, table, the 36 records as Arrow, the log start)."""
    topic = f"moved-{next(_names)}-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 1, 1, {"segment.bytes": "1024"})])
    produce(bootstrap, topic, 12)
    frame = strata_rows(spark, bootstrap, topic)
    original = frame.orderBy("offset").toArrow().cast(SPARK_ARROW_SCHEMA).combine_chunks()
    assert original.num_rows == 36
    uri = write_tier(spark, frame, tmp_path_factory.mktemp("tier") / topic, layout="range")
    admin.alter_configs(topic, {"retention.ms": "1"})
    start = wait_for(f"log start of {topic}", lambda: log_start(admin, topic),
                     lambda s: s > 24)
    return topic, uri, original, start


def offsets_of(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_reads_fall_back_to_the_tier_and_lose_only_what_neither_holds(
        moved: tuple[str, str, pa.Table, int], bootstrap: str) -> None:
    topic, uri, original, start = moved
    strict = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic},
                                  streaming=False)
    lenient = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic,
                                    "failOnDataLoss": "false"}, streaming=False)

    # A range planned for the broker whose log start moved past it: the tier fills in.
    full = TierInfo(uri, 0, 36)
    batches = list(read_range(strict, OffsetRange(topic, 0, 0, 36, tier=full)))
    got = pa.Table.from_batches(batches).combine_chunks()
    assert got.schema.equals(SPARK_ARROW_SCHEMA)
    assert got.column("offset").to_pylist() == list(range(36))
    assert got.equals(original)
    # A range planned from the tier reads the table only; packed with others into one
    # task, only the broker ranges share a consumer.
    assert offsets_of(list(read_range(strict, OffsetRange(topic, 0, 3, 20, source="tier",
                                                          tier=full)))) == list(range(3, 20))
    group = (OffsetRange(topic, 0, 0, 4, source="tier", tier=full),
             OffsetRange(topic, 0, 4, start, source="tier", tier=full),
             OffsetRange(topic, 0, start, 36, tier=full))
    assert offsets_of(list(read_ranges(strict, group))) == list(range(36))
    assert offsets_of(list(read_ranges(strict, group[:2]))) == list(range(start))

    # Offsets in neither tier: below the tier's start, and between its end and the log
    # start. Data loss with failOnDataLoss=true; skipped (the rest read) with false.
    partial = TierInfo(uri, 5, 12)
    with pytest.raises(StrataSparkDataLossError, match=rf"records 0\.\.4 of {topic}-0 were "
                       "deleted from the brokers and from the Delta tier"):
        list(read_range(strict, OffsetRange(topic, 0, 0, 36, tier=partial)))
    with pytest.raises(StrataSparkDataLossError, match=rf"records 12\.\.{start - 1} of "
                       f"{topic}-0 were deleted from the brokers before the tiering job"):
        list(read_range(strict, OffsetRange(topic, 0, 5, 36, tier=partial)))
    assert offsets_of(list(read_range(lenient, OffsetRange(topic, 0, 0, 36, tier=partial)))) \
        == list(range(5, 12)) + list(range(start, 36))
    # No tier at all: as before, everything below the log start is lost.
    with pytest.raises(StrataSparkDataLossError, match=rf"records 0\.\.{start - 1} of "):
        list(read_range(strict, OffsetRange(topic, 0, 0, 36)))


def test_batch_plan_reads_history_from_the_tier(
        moved: tuple[str, str, pa.Table, int], bootstrap: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's plan for tier extents a test cannot easily make a real cluster
    report (a gap below the log start, a table trimmed by its retention): the snapshot
    is patched, which works because the planner runs in this process."""
    topic, uri, _, start = moved
    real = ClusterView.snapshot

    def with_tier(tier: TierInfo) -> None:
        def snapshot(self: ClusterView, *, require_topics: bool
                     ) -> dict[TopicPartition, PartitionOffsets]:
            out = real(self, require_topics=require_topics)
            tp = TopicPartition(topic, 0)
            out[tp] = PartitionOffsets(out[tp].log_start, out[tp].high_watermark,
                                       out[tp].log_end, tier)
            return out
        monkeypatch.setattr(ClusterView, "snapshot", snapshot)

    def plan(**options: str) -> list[OffsetRange]:
        opts = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic,
                                     **options}, streaming=False)
        return StrataBatchReader(opts).partitions()

    with_tier(TierInfo(uri, 0, 36))
    ranges = plan()
    assert [(r.start, r.end, r.source) for r in ranges] == [(0, start, "tier"),
                                                            (start, 36, "log")]
    opts = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic},
                                streaming=False)
    batches = [b for r in ranges for b in read_range(opts, r)]
    assert offsets_of(batches) == list(range(36))

    with_tier(TierInfo(uri, 6, 36))  # tier retention removed 0..5
    assert [(r.start, r.source) for r in plan()] == [(6, "tier"), (start, "log")]
    with pytest.raises(StrataSparkDataLossError, match=rf"records 2\.\.5 of {topic}-0 .*"
                       "Delta tier .* holds offsets 6\\.\\.35"):
        plan(startingOffsets=json.dumps({topic: {"0": 2}}))

    with_tier(TierInfo(uri, 0, 12))  # a gap between the tier and the log
    with pytest.raises(StrataSparkDataLossError, match=rf"records 12\.\.{start - 1} of "):
        plan()
    lenient = plan(failOnDataLoss="false")
    assert [(r.start, r.end, r.source) for r in lenient] == [(0, start, "tier"),
                                                             (start, 36, "log")]


def test_spark_replays_full_history_across_the_tier_boundary(
        spark: Any, bootstrap: str, admin: Admin, zookeeper_server: ZooKeeperServer,
        tmp_path: Path) -> None:
    """The whole path: a tier-enabled topic whose first segments went to Delta (recorded
    in ZooKeeper as the tiering job records it) and were then deleted by the broker.
    ``startingOffsets=earliest`` returns every offset once, batch and stream (also a
    stream whose checkpoint fell behind the log start); only offsets in neither tier are
    data loss."""
    from brokers.coordination import ZooKeeperClient

    topic = f"replay-{next(_names)}-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 1, 1, {
        "segment.bytes": "1024", "tier.enable": "true", "local.retention.ms": "1"})])
    produce(bootstrap, topic, 12)
    frame = strata_rows(spark, bootstrap, topic)
    original = frame.orderBy("offset").toArrow().cast(SPARK_ARROW_SCHEMA).combine_chunks()
    assert original.column("offset").to_pylist() == list(range(36))
    tiered = strata_rows(spark, bootstrap, topic,
                         endingOffsets=json.dumps({topic: {"0": 24}}))
    uri = write_tier(spark, tiered, tmp_path / topic, layout="range")

    coordinator = ZooKeeperClient(zookeeper_server.connect_string)
    coordinator.start()
    try:
        coordinator.set_tier_table(topic, uri)
        coordinator.advance_tier_progress(topic, 0, tiered_up_to=24, tier_start=0)
        start = wait_for(f"log start of {topic}", lambda: log_start(admin, topic),
                         lambda s: s > 0)
        assert start <= 24  # only what Delta holds may go

        def arrow(frame: Any) -> pa.Table:
            return frame.orderBy("offset").toArrow().cast(SPARK_ARROW_SCHEMA).combine_chunks()

        assert arrow(strata_rows(spark, bootstrap, topic, startingOffsets="earliest")) \
            .equals(original)
        assert arrow(strata_rows(spark, bootstrap, topic, minPartitions="3")).equals(original)

        def run_stream() -> pa.Table:
            rows: list[pa.Table] = []
            query = (spark.readStream.format("strata")
                     .option("bootstrap.servers", bootstrap).option("subscribe", topic)
                     .option("startingOffsets", "earliest").load()
                     .writeStream.foreachBatch(lambda batch, _: rows.append(arrow(batch)))
                     .option("checkpointLocation", str(tmp_path / "cp"))
                     .trigger(availableNow=True).start())
            try:
                assert query.awaitTermination(120)
            finally:
                query.stop()
            return pa.concat_tables(rows).combine_chunks()

        assert run_stream().equals(original)

        # More records; the job copies [24, 60) and the broker deletes past the stream's
        # checkpoint (36): the next run reads 36.. from Delta, then the broker, no loss.
        produce(bootstrap, topic, 12, first=36)
        write_tier(spark, strata_rows(spark, bootstrap, topic, endingOffsets=json.dumps(
            {topic: {"0": 60}}), startingOffsets=json.dumps({topic: {"0": 24}})),
            tmp_path / topic, layout="range", mode="append")
        coordinator.advance_tier_progress(topic, 0, tiered_up_to=60, tier_start=0)
        wait_for(f"log start of {topic}", lambda: log_start(admin, topic), lambda s: s > 36)
        everything = arrow(strata_rows(spark, bootstrap, topic))
        assert everything.column("offset").to_pylist() == list(range(72))
        assert everything.slice(0, 36).equals(original)
        assert run_stream().equals(everything.slice(36))

        # startingTimestamp older than the log start: found in the tier.
        third = everything.column("timestamp")[3].value // 1000  # us -> ms
        assert arrow(strata_rows(spark, bootstrap, topic, startingTimestamp=str(third))) \
            .equals(everything.slice(3))

        # Tier retention removed offsets 0..5 from Delta: earliest now starts at 6, and
        # only a request for those offsets is data loss.
        coordinator.advance_tier_progress(topic, 0, tiered_up_to=60, tier_start=6)
        assert arrow(strata_rows(spark, bootstrap, topic)).equals(everything.slice(6))
        with pytest.raises(Exception, match=rf"DATA_LOSS\] records 2\.\.5 of {topic}-0 "
                           r"were deleted .* holds offsets 6\.\.59"):
            strata_rows(spark, bootstrap, topic,
                        startingOffsets=json.dumps({topic: {"0": 2}})).collect()
        lenient = strata_rows(spark, bootstrap, topic, failOnDataLoss="false",
                              startingOffsets=json.dumps({topic: {"0": 2}}))
        assert arrow(lenient).equals(everything.slice(6))
    finally:
        coordinator.stop()


def test_a_table_written_by_the_tiering_job_replays_through_the_source(
        spark: Any, bootstrap: str, admin: Admin, zookeeper_server: ZooKeeperServer,
        tmp_path: Path) -> None:
    """Interoperability with the real writer (``spark_jobs.TierJob``): what it copies
    and the broker then deletes reads back, offset for offset, as it read before."""
    from spark_jobs import TierJob, TierSettings

    topic = f"job-{next(_names)}-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 1, 1, {
        "segment.bytes": "1024", "tier.enable": "true", "tier.after.ms": "0",
        "local.retention.ms": "0"})])
    produce(bootstrap, topic, 10)

    def arrow(frame: Any) -> pa.Table:
        return frame.orderBy("offset").toArrow().cast(SPARK_ARROW_SCHEMA).combine_chunks()

    before = arrow(strata_rows(spark, bootstrap, topic))
    assert before.num_rows == 30
    with TierJob(spark, TierSettings(bootstrap, tmp_path / "warehouse",
                                     lease_wait_s=30.0)) as job:
        job.run_once([topic])
    tier = admin.describe_tier([topic])[topic]
    assert tier.table is not None and tier.partitions[0].tiered_up_to > 0
    tiered = tier.partitions[0].tiered_up_to
    wait_for(f"log start of {topic}", lambda: log_start(admin, topic),
             lambda start: start == tiered)
    assert tier_bounds(tier.table, 0) == (0, tiered)
    assert arrow(strata_rows(spark, bootstrap, topic)).equals(before)
