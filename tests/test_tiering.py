"""The Delta tiering job (issue [6/7] sections 1 and 4) against real processes.

One ZooKeeper, one broker process (retention checked every 200 ms) and one SparkSession
serve the module; each test has its own topic and warehouse. What is checked: the Delta
table holds exactly the records of the closed segments (offsets contiguous, keys and
values identical, no duplicates) and ZooKeeper's progress says so; a rerun adds nothing;
a job SIGKILLed mid-write (its whole process group: driver, JVM, workers) and rerun
leaves the same exact table; a job that died between the Delta commit and the ZooKeeper
write is caught up from the table's txnVersion; the broker deletes tiered segments (and
only those) under local retention, and the history still reads back; total retention
deletes the oldest rows from Delta and moves ``tier_start``; planning rules.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokers.coordination import ZooKeeperClient
from spark_jobs import (
    TierGapError,
    TierJob,
    TierLeaseLostError,
    TierNotEnabledError,
    TierSettings,
    TierTableMismatchError,
    plan_partition,
    table_path,
)
from strata.client import Admin, NewTopic, Producer, TopicPartition
from tests.support.broker_process import REPO, BrokerProcess
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(300)]

SEGMENT_BYTES = 64 * 1024


@pytest.fixture
def coordinator(zookeeper_server: ZooKeeperServer) -> Iterator[ZooKeeperClient]:
    coord = ZooKeeperClient(zookeeper_server.connect_string)
    coord.start()
    try:
        yield coord
    finally:
        coord.stop()


def settings(broker: BrokerProcess, warehouse: Path, **kw: Any) -> TierSettings:
    return TierSettings(broker.bootstrap, warehouse,
                        lease_wait_s=kw.pop("lease_wait_s", 30.0), **kw)


def create_topic(broker: BrokerProcess, name: str, partitions: int = 2,
                 **configs: str) -> None:
    base = {"tier.enable": "true", "tier.after.ms": "0", "segment.bytes": str(SEGMENT_BYTES)}
    base.update({k.replace("_", "."): v for k, v in configs.items()})
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1, base)])


def produce(broker: BrokerProcess, topic: str, count: int, partitions: int = 2,
            timestamp_ms: int | None = None) -> dict[int, list[tuple[bytes, bytes]]]:
    """``count`` keyed records spread over the partitions; returns them per partition."""
    sent: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
    # Idempotence off for back-dated records: the broker expires a producer id by its
    # last record's timestamp, so days-old timestamps would expire it mid-stream.
    with Producer(broker.bootstrap, acks="all", linger_ms=5,
                  enable_idempotence=timestamp_ms is None) as producer:
        futures = []
        for i in range(count):
            p = i % partitions
            key, value = f"k{i % 97}".encode(), f"value-{i:07d}-{'x' * 60}".encode()
            sent[p].append((key, value))
            futures.append(producer.send(topic, value, key=key, partition=p,
                                         timestamp_ms=timestamp_ms))
        producer.flush()
        for future in futures:
            future.result(30)
    return sent


def table_rows(spark: Any, path: Path, partition: int) -> list[tuple[int, bytes, bytes]]:
    rows = spark.read.format("delta").load(str(path)).where(f"partition = {partition}") \
        .select("offset", "key", "value").orderBy("offset").collect()
    return [(r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows]


def assert_exact(spark: Any, path: Path, sent: dict[int, list[tuple[bytes, bytes]]],
                 progress: dict[int, Any]) -> None:
    """Per partition: offsets 0..tiered_up_to-1 once each, the records that were sent."""
    for p, records in sent.items():
        rows = table_rows(spark, path, p)
        end = progress[p].tiered_up_to
        assert end > 0, f"partition {p} tiered nothing"
        assert [r[0] for r in rows] == list(range(end)), f"partition {p}: offsets"
        assert [(r[1], r[2]) for r in rows] == records[:end], f"partition {p}: contents"


def closed_end(broker: BrokerProcess, topic: str) -> dict[int, int]:
    with Admin(broker.bootstrap) as admin:
        tier = admin.describe_tier([topic])[topic]
    return {p: (t.segments[-1].next_offset if t.segments else 0)
            for p, t in tier.partitions.items()}


class SimulatedCrash(BaseException):
    """Stops a job where a crash would (not an Exception, so nothing catches it)."""


# ----------------------------------------------------------------------------- planning


class Seg:
    def __init__(self, base: int, end: int, ts: int, size: int = 100) -> None:
        self.base_offset, self.next_offset, self.max_timestamp, self.size_bytes = \
            base, end, ts, size


def test_plan_takes_aged_segments_in_order_and_stops_at_the_first_young_one() -> None:
    segs = [Seg(0, 10, 1_000), Seg(10, 20, 5_000), Seg(20, 30, 1_000)]
    rng = plan_partition("t", 0, segs, log_start=0, tiered_up_to=0, committed=0,
                         tier_after_ms=1_000, now_ms=3_000, max_bytes=10**9)
    assert rng is not None and (rng.start, rng.end, rng.segments) == (0, 10, 1)


def test_plan_starts_at_the_furthest_of_progress_table_and_log_start() -> None:
    segs = [Seg(0, 10, 0), Seg(10, 20, 0), Seg(20, 30, 0)]
    kw: dict[str, Any] = {"tier_after_ms": 0, "now_ms": 10, "max_bytes": 10**9}
    plan = plan_partition("t", 0, segs, log_start=0, tiered_up_to=10, committed=20, **kw)
    assert plan is not None and (plan.start, plan.end) == (20, 30)
    plan = plan_partition("t", 0, segs, log_start=15, tiered_up_to=0, committed=0, **kw)
    assert plan is not None and (plan.start, plan.end, plan.segments) == (15, 30, 2)
    assert plan_partition("t", 0, segs, log_start=0, tiered_up_to=30, committed=0, **kw) is None


def test_plan_bounds_a_write_by_bytes_but_takes_at_least_one_segment() -> None:
    segs = [Seg(0, 10, 0, 600), Seg(10, 20, 0, 600), Seg(20, 30, 0, 600)]
    plan = plan_partition("t", 0, segs, log_start=0, tiered_up_to=0, committed=0,
                          tier_after_ms=0, now_ms=10, max_bytes=1_000)
    assert plan is not None and (plan.end, plan.bytes) == (10, 600)
    plan = plan_partition("t", 0, segs, log_start=0, tiered_up_to=0, committed=0,
                          tier_after_ms=0, now_ms=10, max_bytes=1_300)
    assert plan is not None and plan.end == 20


def test_copy_pieces_cover_each_range_once_and_feed_every_core() -> None:
    from spark_jobs._copy import OFFSETS_PER_PIECE, pieces_of
    from spark_jobs._plan import TierRange

    ranges = [TierRange("t", 0, 0, 3_000_000, 1, 1, 0), TierRange("t", 1, 500, 900, 1, 1, 0),
              TierRange("t", 2, 10, 1_000_010, 1, 1, 0)]
    pieces = pieces_of(ranges, 4)
    assert [p.index for p in pieces] == list(range(len(pieces)))
    for rng in ranges:
        mine = [p for p in pieces if p.partition == rng.partition]
        assert mine[0].start == rng.start and mine[-1].end == rng.end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
    biggest = max(p.end - p.start for p in pieces)
    assert biggest <= max(OFFSETS_PER_PIECE, -(-4_000_400 // 4))
    assert len(pieces) >= 4  # every core has a piece
    small = pieces_of([TierRange("t", 0, 0, 1000, 1, 1, 0)], 4)
    assert [(p.start, p.end) for p in small] == [(0, 1000)]  # never below the minimum


# ----------------------------------------------------------------------------- the job


def test_tiering_copies_closed_segments_exactly_and_a_rerun_adds_nothing(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    create_topic(strata_broker, "tier-exact")
    sent = produce(strata_broker, "tier-exact", 6_000)
    ends = closed_end(strata_broker, "tier-exact")
    assert all(end > 0 for end in ends.values()), "segments did not roll; raise the count"
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        report = job.run_once(["tier-exact"])
        progress = coordinator.tier_progress("tier-exact")
        assert {p: progress[p].tiered_up_to for p in ends} == ends
        assert {p: progress[p].tier_start for p in ends} == {0: 0, 1: 0}
        path = table_path(tmp_path.resolve(), "tier-exact")
        assert coordinator.tier_table("tier-exact") == str(path)
        assert_exact(spark, path, sent, progress)
        assert report.records == sum(ends.values())
        assert spark.sql("SELECT count(*) AS n FROM strata.tier_exact").first()["n"] == \
            sum(ends.values())
        again = job.run_once(["tier-exact"])
        assert again.records == 0
        assert spark.read.format("delta").load(str(path)).count() == sum(ends.values())
        lag = {p.partition: p.lag_records for p in again.topics[0].partitions}
        assert lag == {p: len(sent[p]) - ends[p] for p in ends}


def test_one_commit_per_round_covers_every_partition_with_its_own_txn(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    """The copy writes Arrow Parquet files and commits every partition's range at once:
    one Delta commit per round, one ``txn`` per partition (so reruns read each end back),
    statistics only for offset and timestamp, and ``date`` as Spark's ``to_date`` in the
    session's time zone (here not UTC, with records either side of its midnight)."""
    from deltalake import DeltaTable

    topic = "tier-one-commit"
    create_topic(strata_broker, topic, partitions=3, **{"retention.ms": "-1"})
    # 03:30 UTC on 2026-01-02 is 22:30 on 2026-01-01 in New York; 06:00 UTC is 01:00.
    late, early = 1_767_324_600_000, 1_767_333_600_000
    sent = {p: [] for p in range(3)}  # type: dict[int, list[tuple[bytes, bytes]]]
    with Producer(strata_broker.bootstrap, acks="all", linger_ms=5,
                  enable_idempotence=False) as producer:
        for i in range(3_000):
            p, key = i % 3, f"k{i % 13}".encode()
            value = f"v{i:06d}{'y' * 60}".encode()
            sent[p].append((key, value))
            producer.send(topic, value, key=key, partition=p,  # alternately, per partition
                          timestamp_ms=late if (i // 3) % 2 == 0 else early)
            if i % 300 == 299:  # several batches a partition, so that segments roll
                producer.flush()
        producer.flush()
    ends = closed_end(strata_broker, topic)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        with TierJob(spark, settings(strata_broker, tmp_path)) as job:
            report = job.run_once([topic])
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    path = table_path(tmp_path.resolve(), topic)
    progress = coordinator.tier_progress(topic)
    assert_exact(spark, path, sent, progress)
    assert report.records == sum(ends.values())
    table = DeltaTable(str(path))
    writes = [h for h in table.history() if h.get("operation") == "WRITE"]
    assert len(writes) == 1, writes  # one commit for the three partitions
    metrics = writes[0]["operationMetrics"]  # as Spark's writer records them
    assert int(metrics["numOutputRows"]) == report.records
    assert int(metrics["numFiles"]) == len(table.file_uris())
    assert {p: table.transaction_version(f"strata-tier/{topic}/{p}") for p in ends} == ends
    assert table.metadata().configuration["delta.dataSkippingStatsColumns"] == \
        "offset,timestamp"
    adds = table.get_add_actions(flatten=True)
    columns = set(adds.schema.names)
    assert {"min.offset", "max.offset", "min.timestamp", "max.timestamp"} <= columns
    assert not any(c.startswith(("min.value", "min.key", "max.value")) for c in columns)
    frame = spark.read.format("delta").load(str(path))
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        mismatched = frame.selectExpr("date", "to_date(timestamp) AS local") \
            .where("date != local").count()
        dates = sorted(r["date"].isoformat() for r in frame.select("date").distinct().collect())
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert mismatched == 0 and dates == ["2026-01-01", "2026-01-02"]


def test_a_refused_commit_leaves_no_files_behind(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        tmp_path: Path) -> None:
    """A commit refused because the table already holds the range (another job wrote
    it) deletes the files this copy wrote: no commit will ever name them."""
    from spark_jobs import tier_table
    from spark_jobs._copy import commit_files, copy_ranges
    from spark_jobs._plan import TierRange
    from strata_spark import Warehouse

    topic = "tier-refused"
    create_topic(strata_broker, topic, partitions=1)
    produce(strata_broker, topic, 2_000, partitions=1)
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        job.run_once([topic])
    path = table_path(tmp_path.resolve(), topic)
    before = sorted(path.rglob("*.parquet"))
    end = closed_end(strata_broker, topic)[0]
    again = [TierRange(topic, 0, 0, end, 1, 1, 0)]
    table = tier_table(Warehouse(path=tmp_path.resolve()), topic)
    files = copy_ranges(spark, table, again, bootstrap=strata_broker.bootstrap,
                        security=settings(strata_broker, tmp_path).security)
    assert files and sorted(path.rglob("*.parquet")) != before
    with pytest.raises(TierLeaseLostError, match="another job wrote meanwhile"):
        commit_files(table, again, files)
    assert sorted(path.rglob("*.parquet")) == before


def test_run_once_names_a_topic_without_tiering(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        tmp_path: Path) -> None:
    create_topic(strata_broker, "tier-off", **{"tier.enable": "false"})
    with TierJob(spark, settings(strata_broker, tmp_path)) as job, \
            pytest.raises(TierNotEnabledError, match=r"tier\.enable=true"):
        job.run_once(["tier-off"])


def test_a_job_that_died_after_the_commit_is_caught_up_from_the_table(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    create_topic(strata_broker, "tier-gap", partitions=1)
    sent = produce(strata_broker, "tier-gap", 4_000, partitions=1)
    with TierJob(spark, settings(strata_broker, tmp_path,
                                 max_bytes_per_write=1)) as job:
        real = job.admin.update_tier
        calls = 0

        def dies_after_first(topic: str, lease_id: str, topic_id: str, **kw: Any) -> Any:
            nonlocal calls
            if kw.get("progress"):
                calls += 1
                if calls == 1:  # the first commit is in Delta; "crash" before it is recorded
                    raise SimulatedCrash("after the Delta commit, before the progress write")
            return real(topic, lease_id, topic_id, **kw)

        job.admin.update_tier = dies_after_first  # type: ignore[method-assign]
        with pytest.raises(SimulatedCrash):
            job.run_once(["tier-gap"])
    assert coordinator.tier_progress("tier-gap") == {}
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        job.run_once(["tier-gap"])
    progress = coordinator.tier_progress("tier-gap")
    assert progress[0].tiered_up_to == closed_end(strata_broker, "tier-gap")[0]
    assert_exact(spark, table_path(tmp_path.resolve(), "tier-gap"), sent, progress)


def _tier_process(broker: BrokerProcess, warehouse: Path,
                  topic: str, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "strata_tools.cli", "tier", "run", "--once", "--topic", topic,
            "--bootstrap", broker.bootstrap, "--lease-ttl-s", "5",
            "--warehouse", str(warehouse), "--max-bytes-per-write", str(64 * SEGMENT_BYTES),
            "--format", "json"]
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=str(REPO)),
                                start_new_session=True)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def test_sigkilled_mid_write_and_rerun_leaves_the_table_exact(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    topic = "tier-kill"
    create_topic(strata_broker, topic)
    sent = produce(strata_broker, topic, 8_000)
    path = table_path(tmp_path.resolve(), topic)
    log = tmp_path / "tier.log"
    started: list[subprocess.Popen[bytes]] = []
    try:
        # Killed as soon as a task has written a data file of the first write, before its
        # commit can be in the log (the window between a commit and its ZooKeeper write
        # is test_a_job_that_died_after_the_commit_is_caught_up_from_the_table's).
        process = _tier_process(strata_broker, tmp_path, topic, log)
        started.append(process)
        deadline = time.monotonic() + 120
        while not any(path.rglob("*.parquet")) and process.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        assert process.poll() is None, "the job finished before it could be killed:\n" + \
            log.read_text(errors="replace")[-3000:]
        _kill_group(process)
        assert not (path / "_delta_log" / "00000000000000000001.json").exists(), \
            "killed too late: the first write was already committed"
    finally:
        for process in started:
            if process.poll() is None:
                _kill_group(process)
    # The rerun, in this process (one JVM start less): it waits for the killed job's
    # lease to expire (its 5 s TTL, never renewed again), then finishes the work exactly.
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        report = job.run_once([topic])
    assert report.topics[0].error is None and not report.topics[0].busy
    progress = coordinator.tier_progress(topic)
    assert {p: progress[p].tiered_up_to for p in sent} == closed_end(strata_broker, topic)
    assert_exact(spark, path, sent, progress)


def _segment_files(broker: BrokerProcess, topic: str, partition: int) -> list[Path]:
    return sorted(broker.data_dir.rglob(f"{topic}-{partition}/*.log"))


def test_local_retention_deletes_only_tiered_segments_and_history_still_reads(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    topic = "tier-local"
    create_topic(strata_broker, topic, partitions=1, **{"local.retention.ms": "0"})
    sent = produce(strata_broker, topic, 5_000, partitions=1)
    time.sleep(1.0)  # several retention checks: nothing may go before it is tiered
    before = _segment_files(strata_broker, topic, 0)
    assert len(before) > 2 and before[0].name.startswith("0000")
    bytes_before = sum(f.stat().st_size for f in before)
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        job.run_once([topic])
    tiered = coordinator.tier_progress(topic)[0].tiered_up_to
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with Admin(strata_broker.bootstrap) as admin:
            start = admin.describe_tier([topic])[topic].partitions[0].log_start_offset
        if start == tiered:
            break
        time.sleep(0.2)
    assert start == tiered, "the broker did not delete the tiered segments"
    after = _segment_files(strata_broker, topic, 0)
    assert len(after) == 1 and sum(f.stat().st_size for f in after) < bytes_before
    # The hot log no longer has offset 0, but the whole history reads back.
    with Admin(strata_broker.bootstrap) as admin:
        tp = TopicPartition(topic, 0)
        assert admin.list_offsets({tp: "earliest"})[tp].offset == tiered
    rows = (spark.read.format("strata").option("bootstrap.servers", strata_broker.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load()
            .select("offset", "key", "value").orderBy("offset").collect())
    assert [r["offset"] for r in rows] == list(range(len(sent[0])))
    assert [(bytes(r["key"]), bytes(r["value"])) for r in rows] == sent[0]


def test_total_retention_deletes_the_oldest_prefix_from_delta_and_never_a_hole(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    """Old records, new ones, then old ones again (a producer with a late clock): the
    old prefix goes, the late old records stay (deleting them would punch a hole readers
    cannot see), and ``tier_start`` moves to the first record kept."""
    topic = "tier-total"
    day = 24 * 3600 * 1000
    create_topic(strata_broker, topic, partitions=1, **{"retention.ms": str(day)})
    now = int(time.time() * 1000)
    old = produce(strata_broker, topic, 2_000, partitions=1, timestamp_ms=now - 3 * day)
    new = produce(strata_broker, topic, 3_000, partitions=1)
    late = produce(strata_broker, topic, 1_500, partitions=1, timestamp_ms=now - 3 * day)
    with TierJob(spark, settings(strata_broker, tmp_path,
                                 vacuum_retain_hours=0.0)) as job:
        report = job.run_once([topic])
    assert report.topics[0].retention_deleted_records == len(old[0])
    assert report.topics[0].vacuumed
    progress = coordinator.tier_progress(topic)[0]
    assert progress.tiered_up_to > len(old[0]) + len(new[0]), "the late records were tiered"
    rows = table_rows(spark, table_path(tmp_path.resolve(), topic), 0)
    first_new = len(old[0])
    assert [r[0] for r in rows] == list(range(first_new, progress.tiered_up_to))
    kept = (new[0] + late[0])[:progress.tiered_up_to - first_new]
    assert [(r[1], r[2]) for r in rows] == kept
    assert progress.tier_start == first_new
    # The files of the deleted prefix are gone from disk too (VACUUM RETAIN 0 HOURS).
    live = {f.name for f in table_path(tmp_path.resolve(), topic).rglob("*.parquet")}
    assert len(live) == len(spark.read.format("delta").load(
        str(table_path(tmp_path.resolve(), topic))).inputFiles())


def test_a_recreated_topic_never_appends_to_the_old_history(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    """Neither its tier table nor (a compacted topic) its latest-per-key table: each
    records the topic id it belongs to and refuses another."""
    topic = "tier-again"
    compact = {"cleanup.policy": "compact", "delete.retention.ms": str(24 * 3600 * 1000)}
    create_topic(strata_broker, topic, partitions=1, **compact)
    produce(strata_broker, topic, 1_500, partitions=1)
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        job.run_once([topic])
        old_end = coordinator.tier_progress(topic)[0].tiered_up_to
        assert old_end > 0
        with Admin(strata_broker.bootstrap) as admin:
            admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while True:  # the broker finishes deleting the old log before the name is free
            try:
                create_topic(strata_broker, topic, partitions=1, **compact)
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        produce(strata_broker, topic, 1_500, partitions=1)
        with pytest.raises(TierTableMismatchError, match="earlier topic named"):
            job.run_once([topic])
        assert coordinator.tier_progress(topic) == {}, "the new topic inherited progress"
        rows = table_rows(spark, table_path(tmp_path.resolve(), topic), 0)
        assert [r[0] for r in rows] == list(range(old_end)), "the old history changed"
        compacted = tmp_path.resolve() / "compacted" / topic
        keys_before = spark.read.format("delta").load(str(compacted)).count()
        # The tier table moved away, as the message says, but not the compacted one.
        table_path(tmp_path.resolve(), topic).rename(tmp_path / "old-tier-again")
        with pytest.raises(TierTableMismatchError, match="latest record per key of an "
                                                         "earlier topic"):
            job.run_once([topic])
        assert spark.read.format("delta").load(str(compacted)).count() == keys_before


def test_records_deleted_before_tiering_stop_the_topic_with_tier_gap(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        tmp_path: Path) -> None:
    topic = "tier-gap-hole"
    create_topic(strata_broker, topic, partitions=1)
    produce(strata_broker, topic, 1_500, partitions=1)
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        job.run_once([topic])
        with Admin(strata_broker.bootstrap) as admin:  # tiering off; plain retention deletes
            admin.alter_configs(topic, set={"tier.enable": "false", "retention.ms": "0"})
            produce(strata_broker, topic, 3_000, partitions=1)
            tiered = admin.describe_tier([topic])[topic].partitions[0].tiered_up_to
            deadline = time.monotonic() + 20
            while admin.describe_tier([topic])[topic].partitions[0].log_start_offset \
                    <= tiered:
                assert time.monotonic() < deadline, "retention did not run"
                time.sleep(0.2)
            admin.alter_configs(topic, set={"tier.enable": "true", "retention.ms": "-1"})
        with pytest.raises(TierGapError, match=rf"offsets {tiered}\.\."):
            job.run_once([topic])


def test_compacted_table_matches_a_latest_per_key_model(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    topic = "tier-compact"
    day = 24 * 3600 * 1000
    create_topic(strata_broker, topic, partitions=1,
                 **{"cleanup.policy": "compact", "delete.retention.ms": str(day)})
    rng = random.Random(20261122)
    now = int(time.time() * 1000)
    log: list[tuple[bytes, bytes | None, int]] = []  # offset order: (key, value, timestamp)

    def produce_round(count: int, timestamp_ms: int) -> None:
        with Producer(strata_broker.bootstrap, acks="all", linger_ms=5,
                      enable_idempotence=False) as producer:  # back-dated: see produce()
            futures = []
            for _ in range(count):
                key = f"key-{rng.randrange(60)}".encode()
                # ~100-byte values: each round spans several 64 KiB segments, so only a
                # small part of it can stay in the active (untiered) segment.
                value = None if rng.random() < 0.15 else f"v{len(log)}-{'x' * 96}".encode()
                log.append((key, value, timestamp_ms))
                futures.append(producer.send(topic, value, key=key, partition=0,
                                             timestamp_ms=timestamp_ms))
            producer.flush()
            for future in futures:
                future.result(30)

    def model(end: int) -> dict[bytes, bytes | None]:
        latest: dict[bytes, tuple[bytes | None, int]] = {}
        for key, value, ts in log[:end]:
            latest[key] = (value, ts)
        return {k: v for k, (v, ts) in latest.items() if v is not None or ts >= now - day}

    def compacted() -> dict[bytes, bytes | None]:
        rows = spark.read.format("delta").load(str(tmp_path.resolve() / "compacted" / topic)) \
            .select("key", "value").collect()
        out = {bytes(r["key"]): None if r["value"] is None else bytes(r["value"]) for r in rows}
        assert len(out) == len(rows), "a key is in the compacted table twice"
        return out

    produce_round(2_500, now - 3 * day)  # old: its tombstones are past delete.retention.ms
    with TierJob(spark, settings(strata_broker, tmp_path,
                                 optimize_interval_s=0.0)) as job:
        first = job.run_once([topic])
        end = coordinator.tier_progress(topic)[0].tiered_up_to
        assert compacted() == model(end)
        assert first.topics[0].optimized
    produce_round(2_500, now)  # recent: updates, new keys, tombstones that stay
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        job.run_once([topic])
        end = coordinator.tier_progress(topic)[0].tiered_up_to
        assert end > 2_500
        expected = model(end)
        assert None in expected.values(), "the data should leave a recent tombstone"
        assert compacted() == expected


def test_a_failing_topic_is_reported_and_the_others_still_tier(
        spark: Any, strata_broker: BrokerProcess, zookeeper_server: ZooKeeperServer,
        coordinator: ZooKeeperClient, tmp_path: Path) -> None:
    create_topic(strata_broker, "tier-elsewhere", partitions=1)
    create_topic(strata_broker, "tier-fine", partitions=1)
    produce(strata_broker, "tier-elsewhere", 1_500, partitions=1)
    produce(strata_broker, "tier-fine", 1_500, partitions=1)
    coordinator.set_tier_table("tier-elsewhere", str(tmp_path / "other" / "tier-elsewhere"))
    topics = ["tier-elsewhere", "tier-fine"]
    with TierJob(spark, settings(strata_broker, tmp_path)) as job:
        with pytest.raises(TierTableMismatchError, match="--warehouse"):
            job.run_once(topics)
        report = job.run_once(topics, keep_going=True)
    failed, fine = report.topics
    assert failed.error is not None and "TIER_TABLE_MISMATCH" in failed.error
    assert fine.error is None and fine.partitions[0].records > 0
    assert coordinator.tier_progress("tier-elsewhere") == {}


def test_cli_refuses_missing_settings_before_starting_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("STRATA_WAREHOUSE",)}
    env["PYTHONPATH"] = str(REPO)
    base = [sys.executable, "-m", "strata_tools.cli", "tier", "run", "--bootstrap", "127.0.0.1:1"]
    # The job needs the brokers only: --zookeeper is gone (argparse: usage, exit 2).
    for extra, code, words in (([], 1, "no warehouse given"),
                               (["--warehouse", "w", "--every", "0"], 1,
                                "--every must be a positive"),
                               (["--warehouse", "w", "--zookeeper", "127.0.0.1:2181"], 2,
                                "unrecognized arguments: --zookeeper"),
                               (["--warehouse", "w", "--lease-ttl-s", "0.5"], 1,
                                "lease_ttl_s=0.5 is out of range")):
        done = subprocess.run(base + extra, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == code and words in done.stderr, done.stderr
