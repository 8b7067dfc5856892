"""``strata perf tier``: tiering throughput, Delta bytes per record, replay hot vs tiered.

Steps (one fresh topic, ``tier.enable=true``, ``tier.after.ms=0``, ``local.retention.ms=0``):

1. fill it with ``--num-records`` records of ``--record-size`` random bytes each (distinct
   values, so Parquet cannot compress them away: the bytes-per-record figure is honest);
2. **replay from the brokers**: a Spark batch read of the whole topic into ``noop``
   (best of ``--runs``);
3. **tier**: one ``TierJob.run_once`` pass of a new job (its first Spark job starts the
   Python workers the copy runs in), and, after step 5, a second topic of the same size
   filled and tiered by the same job, as a long-running job's later passes run;
   records/s = records copied / the seconds of the copy (Spark job + Delta commit +
   progress write) and over the whole pass (plus lease, table creation, retention and
   OPTIMIZE checks);
4. Delta bytes per record (Parquet files of the table) against the raw log's;
5. wait until the broker has deleted the tiered segments, then **replay from Delta**:
   the same read, now served below the log start from the table (best of ``--runs``).

Only closed segments are tiered; the active segment of each partition stays hot, so the
replay figures of 2 and 5 count the same records only when the topic's segments are all
closed (step 2 reads only the tiered range to keep them comparable).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:  # pragma: no cover
    from strata_spark import Warehouse

__all__ = ["TierBenchResult", "add_tier_arguments", "run_tier"]


@dataclass(frozen=True, slots=True)
class TierBenchResult:
    records: int
    partitions: int
    record_size: int
    tier_seconds: float  # the later pass: sum over partitions of their copy time
    tier_records_per_sec: float
    pass_seconds: float
    pass_records_per_sec: float
    first_tier_seconds: float  # the job's first pass (Spark's Python workers start)
    first_tier_records_per_sec: float
    first_pass_seconds: float
    first_pass_records_per_sec: float
    log_bytes_per_record: float
    delta_bytes_per_record: float
    replay_hot_records_per_sec: float
    replay_delta_records_per_sec: float


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--warehouse", default=None, metavar="LOCATION",
                        help="Delta warehouse: a directory or s3://bucket[/prefix] (the AWS "
                        "environment gives credentials and endpoint; default: a temporary "
                        "directory)")
    parser.add_argument("--topic", default="bench-tier")
    parser.add_argument("--num-records", type=_positive, default=4_000_000)
    parser.add_argument("--record-size", type=_positive, default=100)
    parser.add_argument("--partitions", type=_positive, default=4)
    parser.add_argument("--segment-bytes", type=_positive, default=32 * 1024 * 1024)
    parser.add_argument("--runs", type=_positive, default=2)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def run_tier(args: argparse.Namespace) -> int:
    from strata_spark import Warehouse
    from strata_tools.commands.common import bootstrap_of

    with tempfile.TemporaryDirectory(prefix="strata-perf-tier-") as scratch:
        warehouse = Warehouse.parse(args.warehouse or scratch)
        result = bench_tier(bootstrap_of(args), warehouse, args.topic,
                            args.num_records, args.record_size, args.partitions,
                            args.segment_bytes, args.runs)
    if args.format == "json":
        print(json.dumps(asdict(result)))
    else:
        print(f"tier: {result.records:,} records of {result.record_size} B in "
              f"{result.partitions} partitions")
        print(f"  copy     {result.tier_records_per_sec:,.0f} records/s "
              f"({result.tier_seconds:.2f} s of copying; whole pass "
              f"{result.pass_records_per_sec:,.0f} records/s, {result.pass_seconds:.2f} s)")
        print(f"  first    {result.first_tier_records_per_sec:,.0f} records/s "
              f"({result.first_tier_seconds:.2f} s of copying; whole pass "
              f"{result.first_pass_records_per_sec:,.0f} records/s, "
              f"{result.first_pass_seconds:.2f} s): the job's first pass")
        print(f"  bytes    {result.log_bytes_per_record:.1f} B/record in the log, "
              f"{result.delta_bytes_per_record:.1f} B/record in Delta")
        print(f"  replay   {result.replay_hot_records_per_sec:,.0f} records/s from brokers, "
              f"{result.replay_delta_records_per_sec:,.0f} records/s from Delta")
    return 0


def _random_values(count: int, size: int) -> pa.Array:
    data = os.urandom(count * size)
    offsets = pa.array(range(0, (count + 1) * size, size), pa.int32())
    return pa.Array.from_buffers(pa.binary(), count, [None, offsets.buffers()[1],
                                                      pa.py_buffer(data)])


def _fill(bootstrap: str, topic: str, num_records: int, record_size: int, partitions: int,
          segment_bytes: int) -> None:
    """Batches of up to 1,000 records and about 512 KiB; a topic whose
    ``max.message.bytes`` takes one batch (1 MiB values go one per batch)."""
    from strata.client import Admin, NewTopic, Producer

    per_batch = max(1, min(1000, (512 << 10) // record_size))
    configs = {"tier.enable": "true", "tier.after.ms": "0", "local.retention.ms": "0",
               "segment.bytes": str(max(segment_bytes, 2 * per_batch * record_size))}
    if per_batch * record_size > (1 << 20) - (64 << 10):
        configs["max.message.bytes"] = str(per_batch * record_size + (64 << 10))
    with Admin(bootstrap) as admin:
        if topic in admin.list_topics():
            raise SystemExit(f"topic {topic} exists; give a fresh --topic (the figures need "
                             "a topic with exactly --num-records records)")
        admin.create_topics([NewTopic(topic, partitions, 1, configs)])
    with Producer(bootstrap, acks=1, batch_size=512 << 10, enable_idempotence=False,
                  buffer_memory=max(32 << 20, 8 * per_batch * record_size)) as producer:
        futures = []
        sent = 0
        while sent < num_records:
            n = min(per_batch, num_records - sent)
            futures.append(producer.send_batch(topic, _random_values(n, record_size),
                                               partition=(sent // per_batch) % partitions))
            sent += n
        producer.flush()
        for future in futures:
            future.result(60)


def _replay(spark: Any, bootstrap: str, topic: str, ends: dict[int, int], runs: int) -> float:
    """Best records/s of a batch read of ``[earliest, ends)`` into ``noop``."""
    ending = json.dumps({topic: {str(p): e for p, e in ends.items()}})
    best = 0.0
    for _ in range(runs):
        began = time.perf_counter()
        (spark.read.format("strata").option("bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest")
         .option("endingOffsets", ending).option("minPartitions", "4").load()
         .write.format("noop").mode("overwrite").save())
        best = max(best, sum(ends.values()) / (time.perf_counter() - began))
    return best


def bench_tier(bootstrap: str, warehouse: Warehouse | Path, topic: str, num_records: int,
               record_size: int, partitions: int, segment_bytes: int,
               runs: int) -> TierBenchResult:
    from spark_jobs import TierJob, TierSettings, tier_table
    from strata.client import Admin
    from strata_spark import Warehouse, spark_session

    if not isinstance(warehouse, Warehouse):
        warehouse = Warehouse(path=Path(warehouse).resolve())

    _fill(bootstrap, topic, num_records, record_size, partitions, segment_bytes)
    with Admin(bootstrap) as admin:
        tier = admin.describe_tier([topic])[topic]
    ends = {p: (t.segments[-1].next_offset if t.segments else t.log_start_offset)
            for p, t in tier.partitions.items()}
    log_bytes = sum(s.size_bytes for t in tier.partitions.values() for s in t.segments)
    spark = spark_session("strata-perf-tier", {"spark.sql.shuffle.partitions": "2",
                                               **warehouse.spark_conf()})
    try:
        hot = _replay(spark, bootstrap, topic, ends, runs)
        with TierJob(spark, TierSettings(bootstrap, warehouse)) as job:
            first = _timed_pass(job, topic)
            delta_bytes = _parquet_bytes(tier_table(warehouse, topic).uri)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with Admin(bootstrap) as admin:
                    now = admin.describe_tier([topic])[topic]
                if all(now.partitions[p].log_start_offset >= e for p, e in ends.items()):
                    break
                time.sleep(0.5)
            cold = _replay(spark, bootstrap, topic, ends, runs)
            # The later pass comes last, so that filling its topic (and the broker then
            # deleting what it tiered) does not run beside the replays.
            later_topic = f"{topic}-later"
            _fill(bootstrap, later_topic, num_records, record_size, partitions, segment_bytes)
            later = _timed_pass(job, later_topic)
    finally:
        spark.stop()
    copied = first.records
    return TierBenchResult(
        copied, partitions, record_size, later.copy_seconds, later.copy_rate,
        later.pass_seconds, later.pass_rate, first.copy_seconds, first.copy_rate,
        first.pass_seconds, first.pass_rate,
        round(log_bytes / copied, 1) if copied else 0.0,
        round(delta_bytes / copied, 1) if copied else 0.0, round(hot), round(cold))


def _parquet_bytes(uri: str) -> int:
    """Bytes of the Parquet files under ``uri`` (a directory or an object-store prefix)."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(uri)
    infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True,
                                                     allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.path.endswith(".parquet"))


@dataclass(frozen=True, slots=True)
class _Pass:
    records: int
    copy_seconds: float
    pass_seconds: float

    @property
    def copy_rate(self) -> float:
        return round(self.records / self.copy_seconds) if self.copy_seconds else 0.0

    @property
    def pass_rate(self) -> float:
        return round(self.records / self.pass_seconds) if self.pass_seconds else 0.0


def _timed_pass(job: Any, topic: str) -> _Pass:
    began = time.perf_counter()
    report = job.run_once([topic])
    seconds = time.perf_counter() - began
    copy = sum(p.seconds for t in report.topics for p in t.partitions)
    return _Pass(report.records, round(copy, 3), round(seconds, 3))
