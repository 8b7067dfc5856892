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

from strata.spark import spark_session


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
    query = (spark.readStream.format("strata")
             .option("bootstrap.servers", args.bootstrap)
             .option("subscribe", args.source)
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", args.max_offsets)
             .load()
             .selectExpr("key", "concat(CAST('T:' AS BINARY), value) AS value", "headers")
             .writeStream.format("strata")
             .option("bootstrap.servers", args.bootstrap)
             .option("topic", args.sink)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True)
             .start())
    print("pipeline started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"pipeline failed: {query.exception()}")
    print(f"pipeline done {query.lastProgress['batchId'] if query.lastProgress else -1}",
          flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
