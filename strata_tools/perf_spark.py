"""``strata perf spark-read``: how fast Spark Structured Streaming reads a Strata topic.

What is measured: a streaming query ``readStream.format("strata")`` from the earliest
offsets of a topic into Spark's ``noop`` sink with ``trigger(availableNow=True)``, so the
query reads everything there is and stops. Everything between the broker's socket and
Spark's rows is inside the figure: fetches, Arrow decoding, the cast to Spark's Arrow
schema, the Arrow hand-over to the JVM. The sink does nothing, so nothing after that is.

Two figures per run: ``records/s`` over the query's batches (the sum of Spark's
``triggerExecution`` durations from the query progress, which leaves out the one-off
query start-up: JVM code generation, planning, starting the source's Python worker) and
``wall records/s`` from ``start()`` to termination. The first run of a fresh session
pays JIT warm-up, so ``--runs`` (default 2) repeats the query and the best run is the
headline. Spark's own ceiling for a Python source handing over Arrow batches of this
schema on this 2-core machine is 1.0-1.45M rows/s (docs/benchmarks.md, "Spark source and
sink").

If the topic does not exist it is created with ``--partitions`` partitions and filled
with ``--num-records`` records of ``--record-size`` random bytes (``send_batch``, acks=1);
if it exists with fewer records the missing ones are added. The query reads the whole
topic, so use a fresh topic for an exact record count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

__all__ = ["SparkReadResult", "add_spark_read_arguments", "bench_spark_read",
           "run_spark_read"]


@dataclass(frozen=True, slots=True)
class SparkReadResult:
    run: int
    records: int
    batches: int
    seconds: float  # sum of the batches' triggerExecution durations
    wall_seconds: float  # start() to termination
    records_per_sec: float
    wall_records_per_sec: float


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_spark_read_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--topic", default="bench-spark-read",
                        help="topic to read; created and filled if missing "
                        "(default bench-spark-read)")
    parser.add_argument("--num-records", type=_positive, default=5_000_000)
    parser.add_argument("--record-size", type=_positive, default=100)
    parser.add_argument("--partitions", type=_positive, default=8,
                        help="partitions of a topic this command creates (default 8)")
    parser.add_argument("--max-offsets-per-trigger", type=_positive, default=None,
                        help="source option maxOffsetsPerTrigger (default: none, so one "
                        "batch reads everything)")
    parser.add_argument("--runs", type=_positive, default=2)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def run_spark_read(args: argparse.Namespace) -> int:
    """CLI entry point: prints one line (or JSON object) per run, then the best."""
    from strata_tools.commands.common import bootstrap_of

    results = bench_spark_read(
        bootstrap_of(args), args.topic, args.num_records, record_size=args.record_size,
        partitions=args.partitions, max_offsets_per_trigger=args.max_offsets_per_trigger,
        runs=args.runs)
    best = max(results, key=lambda r: r.records_per_sec)
    for result in results:
        if args.format == "json":
            print(json.dumps(asdict(result)))
        else:
            print(f"spark-read run {result.run}: {result.records:,} records in "
                  f"{result.batches} batch(es), {result.seconds:.2f} s, "
                  f"{result.records_per_sec:,.0f} records/s "
                  f"(wall {result.wall_seconds:.2f} s, "
                  f"{result.wall_records_per_sec:,.0f} records/s)")
    if args.format == "text":
        print(f"spark-read: {best.records_per_sec:,.0f} records/s (best of {len(results)})")
    return 0 if all(r.records >= args.num_records for r in results) else 1


def bench_spark_read(bootstrap: str, topic: str, num_records: int, *, record_size: int = 100,
                     partitions: int = 8, max_offsets_per_trigger: int | None = None,
                     runs: int = 2) -> list[SparkReadResult]:
    """Fill ``topic`` up to ``num_records`` if needed, then time ``runs`` AvailableNow
    streaming reads of the whole topic into the ``noop`` sink (a topic that already held
    more records is read whole: ``records`` says how many)."""
    asyncio.run(_fill(bootstrap, topic, num_records, record_size, partitions))

    from strata_spark import spark_session

    spark = spark_session("strata-perf-spark-read")
    results = []
    try:
        for run in range(1, runs + 1):
            with tempfile.TemporaryDirectory(prefix="strata-perf-spark-") as checkpoint:
                reader = (spark.readStream.format("strata")
                          .option("bootstrap.servers", bootstrap)
                          .option("subscribe", topic)
                          .option("startingOffsets", "earliest"))
                if max_offsets_per_trigger is not None:
                    reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
                started = time.perf_counter()
                query = (reader.load().writeStream.format("noop")
                         .option("checkpointLocation", checkpoint)
                         .trigger(availableNow=True).start())
                query.awaitTermination()
                wall = time.perf_counter() - started
                progress: list[dict[str, Any]] = list(query.recentProgress)
            records = sum(int(p["numInputRows"]) for p in progress)
            seconds = sum(int(p["durationMs"].get("triggerExecution", 0))
                          for p in progress) / 1000
            batches = sum(1 for p in progress if int(p["numInputRows"]) > 0)
            results.append(SparkReadResult(
                run, records, batches, round(seconds, 3), round(wall, 3),
                round(records / seconds if seconds else 0.0),
                round(records / wall if wall else 0.0)))
    finally:
        spark.stop()
    return results


async def _fill(bootstrap: str, topic: str, num_records: int, record_size: int,
                partitions: int) -> None:
    from strata.client import AsyncAdmin, AsyncProducer, NewTopic

    admin = AsyncAdmin(bootstrap)
    try:
        if topic not in await admin.list_topics():
            await admin.create_topics([NewTopic(topic, partitions, 1)])
        described = (await admin.describe_topics([topic]))[topic]
    finally:
        await admin.close()
    have = sum(p.high_watermark - p.log_start_offset for p in described.partitions)
    missing = num_records - have
    if missing <= 0:
        return
    chunk = pa.array([os.urandom(record_size)] * 1000, pa.binary())
    async with AsyncProducer(bootstrap, acks=1, batch_size=512 << 10,
                             enable_idempotence=False) as producer:
        futures = []
        sent = 0
        while sent < missing:
            n = min(1000, missing - sent)
            futures.append(await producer.send_batch(topic, chunk.slice(0, n)))
            sent += n
        await producer.flush()
        for future in futures:
            await future
