"""The Spark half of ``strata perf typed --spark`` (see ``perf_typed``).

1. Both topics are filled up to ``--spark-records`` records (``send_batch``, acks=1).
2. The same aggregation, ``sum(amount)`` per ``customer`` into ``noop``, runs as a Spark
   batch read of each whole topic, alternating, ``--spark-runs`` times: the typed topic
   through its struct ``value`` (``value.customer``, ``value.amount``), the JSON topic
   through ``from_json(cast(value as string), <schema>)``. rows/s = records / wall
   seconds of the action; the best run of each is the figure, and every run is printed.
3. Both topics are tiered into Delta by one ``TierJob`` pass each; bytes per record =
   the tables' Parquet files over the records copied.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from strata_tools.perf_typed_orders import ORDER_SCHEMA, json_values, order_table

__all__ = ["bench_spark"]

_CHUNK = 1000
# The Spark schema of the JSON documents (what from_json parses them with).
_JSON_DDL = ("id BIGINT, customer STRING, amount DOUBLE, quantity INT, status STRING, "
             "at TIMESTAMP")


async def _fill(bootstrap: str, security: Any, topic: str, have: int, want: int,
                typed: bool) -> None:
    from strata.client import AsyncProducer

    async with AsyncProducer(bootstrap, security=security, acks=1, linger_ms=5,
                             batch_size=512 << 10, enable_idempotence=False) as producer:
        for start in range(have, want, 10 * _CHUNK):
            n = min(10 * _CHUNK, want - start)
            table = order_table(start, n)
            values: Any = table if typed else json_values(table)
            for offset in range(0, n, _CHUNK):
                await producer.send_batch(topic, values.slice(offset, _CHUNK))
            await asyncio.sleep(0)
        await producer.flush()


def _records(bootstrap: str, security: Any, topic: str) -> int:
    from strata.client import Admin, TopicPartition

    with Admin(bootstrap, security=security) as admin:
        partitions = admin.describe_topics([topic])[topic].num_partitions
        ends = admin.list_offsets({TopicPartition(topic, p): "latest"
                                   for p in range(partitions)})
    return sum(e.offset for e in ends.values())


def _aggregate(spark: Any, bootstrap: str, topic: str, typed: bool) -> float:
    from pyspark.sql import functions as F

    frame = (spark.read.format("strata").option("bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("minPartitions", "4").load())
    if typed:
        rows = frame.select(F.col("value.customer").alias("customer"),
                            F.col("value.amount").alias("amount"))
    else:
        parsed = frame.select(F.from_json(F.col("value").cast("string"), _JSON_DDL)
                              .alias("v"))
        rows = parsed.select(F.col("v.customer").alias("customer"),
                             F.col("v.amount").alias("amount"))
    began = time.perf_counter()
    (rows.groupBy("customer").agg(F.sum("amount").alias("total"))
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - began


def bench_spark(bootstrap: str, security: Any, args: argparse.Namespace) -> dict[str, Any]:
    from spark_jobs import TierJob, TierSettings, table_path
    from strata_spark import spark_session

    plain, typed = f"{args.prefix}-json", f"{args.prefix}-typed"
    for topic, is_typed in ((plain, False), (typed, True)):
        have = _records(bootstrap, security, topic)
        if have < args.spark_records:
            asyncio.run(_fill(bootstrap, security, topic, have, args.spark_records,
                              is_typed))
    counts = {name: _records(bootstrap, security, name) for name in (plain, typed)}
    spark = spark_session("strata-perf-typed", {"spark.sql.shuffle.partitions": "2"})
    runs: dict[str, list[int]] = {"typed": [], "json": []}
    try:
        _aggregate(spark, bootstrap, typed, True)  # warm-up: JIT, the source's workers
        for _ in range(args.spark_runs):
            runs["typed"].append(round(counts[typed] / _aggregate(spark, bootstrap, typed,
                                                                   True)))
            runs["json"].append(round(counts[plain] / _aggregate(spark, bootstrap, plain,
                                                                  False)))
        warehouse = Path(args.warehouse or tempfile.mkdtemp(prefix="strata-perf-typed-"))
        delta: dict[str, float] = {}
        with TierJob(spark, TierSettings(bootstrap, warehouse)) as job:
            for key, topic in (("bytes", plain), ("typed", typed)):
                report = job.run_once([topic])
                files = table_path(warehouse.resolve(), topic).rglob("*.parquet")
                size = sum(f.stat().st_size for f in files)
                delta[key] = round(size / report.records, 1) if report.records else 0.0
    finally:
        spark.stop()
    best = {k: max(v) for k, v in runs.items()}
    return {"records": counts[typed], "runs": runs,
            "typed_rows_per_sec": best["typed"], "json_rows_per_sec": best["json"],
            "speedup": round(best["typed"] / best["json"], 2),
            "delta_bytes_per_record": delta, "schema": ORDER_SCHEMA}
