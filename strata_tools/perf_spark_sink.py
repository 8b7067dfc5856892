"""``strata perf spark-write`` and ``strata perf spark-e2e``: the Spark sink's speed.

spark-write: a DataFrame of ``--num-records`` rows with ``--record-size``-byte values
(``spark.range`` padded, cached in memory first so generating rows is not measured) is
written with ``df.write.format("strata")`` into a topic of ``--partitions`` partitions,
``--runs`` times per delivery guarantee. The figure is rows over the wall time of the
write job: Arrow hand-over to the Python workers, encoding, staging on the broker, and
(exactly-once) the driver's commit. The first run of a fresh session also pays Python
worker start-up and JIT warm-up; every run is printed and the best is the headline.

spark-e2e: a streaming pipeline ``readStream.format("strata")`` (topic ``<prefix>-in``)
-> ``select key, value, timestamp`` -> ``writeStream.format("strata")`` (topic
``<prefix>-out``, exactly once unless ``--at-least-once``) with
``trigger(processingTime="0 seconds")``. A producer sends ``--rate`` records/s to the
input, stamping each with its send time (ms); a consumer of the output computes
``receive time - create time`` per record, which the sink preserves. The clock starts
when the first record reaches the output (the query's first micro-batches start its
Python workers and, exactly once, its transactional producer: on a busy machine that
took longer than a whole window once, which then measured nothing); the next
``--warmup`` seconds are not counted, the ``--seconds`` after them are. Reported: p50,
p99, max, in ms; nothing reaching the output within ``FIRST_RECORD_TIMEOUT_S`` ends the
run with no figure (exit status 1).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

#: Seconds ``spark-e2e`` waits for the first record to reach the output topic.
FIRST_RECORD_TIMEOUT_S = 180.0

__all__ = ["FIRST_RECORD_TIMEOUT_S", "SparkE2eResult", "SparkWriteResult",
           "add_spark_e2e_arguments", "add_spark_write_arguments", "bench_spark_e2e",
           "bench_spark_write", "run_spark_e2e", "run_spark_write"]


@dataclass(frozen=True, slots=True)
class SparkWriteResult:
    delivery: str
    run: int
    records: int
    seconds: float
    records_per_sec: float


@dataclass(frozen=True, slots=True)
class SparkE2eResult:
    delivery: str
    rate: int
    records: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    batches: int


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_spark_write_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--topic", default=None,
                        help="topic to write (default: a new bench-spark-write-<id>)")
    parser.add_argument("--num-records", type=_positive, default=4_000_000)
    parser.add_argument("--record-size", type=_positive, default=100)
    parser.add_argument("--partitions", type=_positive, default=8)
    parser.add_argument("--runs", type=_positive, default=3)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def add_spark_e2e_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--rate", type=_positive, default=5000, help="records/s in")
    parser.add_argument("--seconds", type=_positive, default=30, help="measured time")
    parser.add_argument("--warmup", type=_positive, default=10,
                        help="uncounted seconds after the first record out")
    parser.add_argument("--partitions", type=_positive, default=8)
    parser.add_argument("--at-least-once", action="store_true",
                        help="sink deliveryGuarantee=at-least-once")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _create(bootstrap: str, topics: list[str], partitions: int) -> None:
    from strata.client import Admin, NewTopic

    with Admin(bootstrap) as admin:
        existing = set(admin.list_topics())
        wanted = [NewTopic(t, partitions, 1) for t in topics if t not in existing]
        if wanted:
            admin.create_topics(wanted)


def bench_spark_write(bootstrap: str, topic: str, num_records: int, *, record_size: int = 100,
                      partitions: int = 8, runs: int = 3) -> list[SparkWriteResult]:
    """Time ``runs`` batch writes per delivery guarantee of one cached DataFrame."""
    from strata_spark import spark_session

    _create(bootstrap, [topic], partitions)
    spark = spark_session("strata-perf-spark-write")
    results: list[SparkWriteResult] = []
    try:
        df = spark.range(num_records, numPartitions=2).selectExpr(
            f"CAST(lpad(CAST(id AS STRING), {record_size}, 'x') AS BINARY) AS value").cache()
        df.count()
        for delivery in ("exactly-once", "at-least-once"):
            for run in range(1, runs + 1):
                started = time.perf_counter()
                (df.write.format("strata").option("bootstrap.servers", bootstrap)
                 .option("topic", topic).option("deliveryGuarantee", delivery)
                 .mode("append").save())
                seconds = time.perf_counter() - started
                results.append(SparkWriteResult(delivery, run, num_records, round(seconds, 3),
                                                round(num_records / seconds)))
    finally:
        spark.stop()
    return results


def run_spark_write(args: argparse.Namespace) -> int:
    from strata_tools.commands.common import bootstrap_of

    topic = args.topic or f"bench-spark-write-{uuid.uuid4().hex[:8]}"
    results = bench_spark_write(bootstrap_of(args), topic, args.num_records,
                                record_size=args.record_size, partitions=args.partitions,
                                runs=args.runs)
    for r in results:
        if args.format == "json":
            print(json.dumps(asdict(r)))
        else:
            print(f"spark-write {r.delivery} run {r.run}: {r.records:,} records in "
                  f"{r.seconds:.2f} s, {r.records_per_sec:,.0f} records/s")
    if args.format == "text":
        for delivery in ("exactly-once", "at-least-once"):
            best = max((r for r in results if r.delivery == delivery),
                       key=lambda r: r.records_per_sec)
            print(f"spark-write {delivery}: {best.records_per_sec:,.0f} records/s "
                  f"(best of {args.runs})")
    return 0


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def bench_spark_e2e(bootstrap: str, *, rate: int = 5000, seconds: int = 30, warmup: int = 10,
                    partitions: int = 8, exactly_once: bool = True) -> SparkE2eResult:
    """Run the produce -> Spark -> sink -> consume pipeline; latency percentiles in ms."""
    from strata.client import Consumer, Producer, TopicPartition
    from strata_spark import spark_session

    prefix = f"bench-spark-e2e-{uuid.uuid4().hex[:8]}"
    source, sink = f"{prefix}-in", f"{prefix}-out"
    _create(bootstrap, [source, sink], partitions)
    spark = spark_session("strata-perf-spark-e2e")
    stop = threading.Event()
    sent = [0]
    failed: list[BaseException] = []  # a send that failed: the run has no figure

    def settled(future: concurrent.futures.Future[Any]) -> None:
        if (error := future.exception()) is not None:
            failed.append(error)

    def produce() -> None:
        payload = b"x" * 100
        tick = 0.01
        per_tick = max(1, round(rate * tick))
        with Producer(bootstrap, linger_ms=0) as producer:
            next_at = time.monotonic()
            while not stop.is_set():
                now_ms = time.time_ns() // 1_000_000
                producer.send_batch(source, [payload] * per_tick,
                                    timestamp_ms=now_ms).add_done_callback(settled)
                sent[0] += per_tick
                next_at += tick
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            producer.flush(30)

    latencies: list[float] = []
    with tempfile.TemporaryDirectory(prefix="strata-perf-e2e-") as checkpoint:
        query = (spark.readStream.format("strata").option("bootstrap.servers", bootstrap)
                 .option("subscribe", source).option("startingOffsets", "latest").load()
                 .selectExpr("key", "value", "timestamp")
                 .writeStream.format("strata").option("bootstrap.servers", bootstrap)
                 .option("topic", sink).option("checkpointLocation", checkpoint)
                 .option("deliveryGuarantee",
                         "exactly-once" if exactly_once else "at-least-once")
                 .trigger(processingTime="0 seconds").start())
        producer = threading.Thread(target=produce, name="e2e-producer", daemon=True)
        try:
            while not query.recentProgress:  # the query runs before records flow
                time.sleep(0.2)
            producer.start()
            # read_committed: a record counts when the exactly-once sink's transaction
            # made it visible, not when its leader appended it.
            with Consumer(bootstrap, auto_offset_reset="earliest",
                          isolation_level="read_committed") as consumer:
                consumer.assign([TopicPartition(sink, p) for p in range(partitions)])
                # Until the first record out: the start-up bound; then warmup + window.
                count_from, end = float("inf"), time.monotonic() + FIRST_RECORD_TIMEOUT_S
                while time.monotonic() < end:
                    table = consumer.poll_arrow(timeout_ms=100)
                    received = time.time_ns() / 1_000_000
                    now = time.monotonic()
                    if table.num_rows and count_from == float("inf"):
                        count_from = now + warmup
                        end = count_from + seconds
                    if table.num_rows and now >= count_from:
                        latencies.extend(received - t for t in
                                         table.column("timestamp").to_pylist())
            batches = len(query.recentProgress)
        finally:
            stop.set()
            if producer.is_alive():
                producer.join(30)
            query.stop()
            spark.stop()
    if failed:
        raise failed[0]  # e.g. a StrataError, with its code: no figure from a lossy run
    latencies.sort()
    return SparkE2eResult("exactly-once" if exactly_once else "at-least-once", rate,
                          len(latencies), round(_percentile(latencies, 0.50), 1),
                          round(_percentile(latencies, 0.99), 1),
                          round(latencies[-1] if latencies else float("nan"), 1), batches)


def run_spark_e2e(args: argparse.Namespace) -> int:
    from strata_tools.commands.common import bootstrap_of

    result = bench_spark_e2e(bootstrap_of(args), rate=args.rate, seconds=args.seconds,
                             warmup=args.warmup, partitions=args.partitions,
                             exactly_once=not args.at_least_once)
    if args.format == "json":
        print(json.dumps(asdict(result)))
    else:
        print(f"spark-e2e {result.delivery} at {result.rate:,} records/s: "
              f"{result.records:,} records, p50 {result.p50_ms:.1f} ms, "
              f"p99 {result.p99_ms:.1f} ms, max {result.max_ms:.1f} ms "
              f"({result.batches} micro-batches in the last progress window)")
    if not result.records:
        print("strata perf spark-e2e: no record reached the output topic in the measured "
              f"window (or within {FIRST_RECORD_TIMEOUT_S:.0f} s of the query's start): "
              "look for the query's error in Spark's log above, then run again",
              file=sys.stderr)
    return 0 if result.records else 1
