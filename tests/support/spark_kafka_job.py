"""Spark's own Kafka connector against a Strata Kafka listener, as a user writes it:
``python -m tests.support.spark_kafka_job KAFKA_BOOTSTRAP IN_TOPIC OUT_TOPIC COUNT CHECKPOINT``.

In one Spark session (its JVM resolves ``spark-sql-kafka-0-10`` from ~/.m2, as Delta's
package is): a batch read of IN_TOPIC with ``format("kafka")`` (headers included), a
Structured Streaming query over it with ``trigger(availableNow=True)``, and a batch
write of the read rows, transformed, to OUT_TOPIC. Prints one JSON line with what it
read (partition, offset, key, value, the first header) and how many rows each query saw.
"""

from __future__ import annotations

import json
import sys

KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"


def _first_header(headers: list[dict[str, bytes]] | None) -> list[str] | None:
    if not headers:
        return None
    return [str(headers[0]["key"]), (headers[0]["value"] or b"").decode()]


def main(argv: list[str]) -> int:
    from strata_spark import configured_packages, spark_session

    kafka, source, sink, count, checkpoint = argv[0], argv[1], argv[2], int(argv[3]), argv[4]
    packages = ",".join(p for p in (configured_packages(), KAFKA_PACKAGE) if p)
    spark = spark_session("spark-kafka-connector", {"spark.jars.packages": packages,
                                                    "spark.sql.shuffle.partitions": "2"})
    from pyspark.sql import functions as F

    frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("endingOffsets", "latest").option("includeHeaders", "true").load())
    rows = frame.select("partition", "offset", "key", "value", "headers").collect()
    read = sorted([r["partition"], r["offset"], (r["key"] or b"").decode(),
                   (r["value"] or b"").decode(),
                   _first_header(r["headers"])]
                  for r in rows)
    streamed = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka)
                .option("subscribe", source).option("startingOffsets", "earliest").load()
                .writeStream.format("memory").queryName("from_strata")
                .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    streamed.awaitTermination(120)
    stream_rows = spark.sql("select count(*) as n, count(distinct partition, offset) as d "
                            "from from_strata").collect()[0]
    (frame.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))
     .write.format("kafka").option("kafka.bootstrap.servers", kafka)
     .option("topic", sink).save())
    print(json.dumps({"read": read, "batch_rows": len(rows), "stream_rows": stream_rows["n"],
                      "stream_distinct": stream_rows["d"], "expected": count}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
