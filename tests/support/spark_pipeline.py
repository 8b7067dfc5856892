"""A Spark pipeline run as a child process by the exactly-once fault test.

Reads topic ``--source`` from its checkpoint, prefixes every value with ``T:`` and writes
the rows to ``--sink`` with the exactly-once sink, in small micro-batches, until caught
up (``Trigger.AvailableNow``). Prints ``pipeline started`` once the query runs and
``pipeline done <batches>`` when it finished; the test SIGKILLs it in between, at random.

    python -m tests.support.spark_pipeline --bootstrap H:P --source A --sink B \
        --checkpoint DIR [--max-offsets N]
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from strata_spark import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_pipeline(spark: SparkSession, bootstrap: str, source: str, sink: str,
                 checkpoint: str, max_offsets: str = "2000") -> int:
    """Run the query until caught up; return the last batch id."""
    query = (spark.readStream.format("strata")
             .option("bootstrap.servers", bootstrap)
             .option("subscribe", source)
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", max_offsets)
             .load()
             .selectExpr("key", "concat(CAST('T:' AS BINARY), value) AS value", "headers")
             .writeStream.format("strata")
             .option("bootstrap.servers", bootstrap)
             .option("topic", sink)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True)
             .start())
    print("pipeline started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"pipeline failed: {query.exception()}")
    batch = int(query.lastProgress["batchId"]) if query.lastProgress else -1
    print(f"pipeline done {batch}", flush=True)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets", default="2000")
    args = parser.parse_args()
    spark = spark_session("strata-exactly-once-pipeline",
                          {"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    run_pipeline(spark, args.bootstrap, args.source, args.sink, args.checkpoint,
                 args.max_offsets)
    spark.stop()


if __name__ == "__main__":
    main()
