"""``strata perf typed``: what typed topics cost and save (docs/benchmarks.md, typed topics).

Two topics get the same orders: ``<prefix>-json``, whose values are JSON documents
(bytes, as a Kafka pipeline would carry them), and ``<prefix>-typed``, a typed topic
whose values are the ``ORDER_SCHEMA`` struct. Every record has the same content both
ways (six fields: an id, a customer, an amount, a quantity, a status and a time).

Figures, all from one run:

- **produce**: ``send_batch`` of 1,000-record chunks, acks=1, into each topic in turn
  (``--pairs`` alternating pairs after an uncounted short one, so drift on a loaded
  machine hits both sides): the
  bytes path sends ready JSON bytes, the typed path a ready ``pyarrow.Table`` (the
  client checks it against the registered schema; the broker checks each batch's schema
  message). ``overhead %`` is ``1 - typed/bytes`` of the medians.
- **bytes/record in the log**: the encoded batches' size over their records, for one
  1,000-record batch of each (the log stores batches verbatim).
- **Spark** (``--spark``): the whole topic read by a Spark batch query, an aggregation
  over two fields (``sum(amount)`` per ``customer``) into the ``noop`` sink: typed
  columns directly, or ``from_json`` on the bytes; rows/s both ways, runs alternating.
- **bytes/record in Delta** (``--spark``): both topics tiered (``strata tier`` code,
  one pass), the tables' data files over their records.

The Spark part needs the ``spark`` extra and starts its own ``local[2]`` session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

from strata_tools.perf_typed_orders import ORDER_SCHEMA, json_values, order_table

__all__ = ["ORDER_SCHEMA", "add_typed_arguments", "order_table", "run_typed"]

_CHUNK = 1000


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_typed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--command-config", default=None, metavar="FILE")
    parser.add_argument("--prefix", default="perf-orders",
                        help="topics <prefix>-json and <prefix>-typed (created if missing)")
    parser.add_argument("--num-records", type=_positive, default=1_000_000,
                        help="records per topic and per produce run")
    parser.add_argument("--pairs", type=_positive, default=3,
                        help="alternating bytes/typed produce runs")
    parser.add_argument("--partitions", type=_positive, default=2)
    parser.add_argument("--spark", action="store_true",
                        help="also the Spark aggregation and the Delta bytes per record")
    parser.add_argument("--spark-records", type=_positive, default=5_000_000,
                        help="records per topic for the Spark figures")
    parser.add_argument("--spark-runs", type=_positive, default=2)
    parser.add_argument("--warehouse", default=None,
                        help="where the Delta tables go (default: a temporary directory)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


async def _produce(bootstrap: str, security: Any, topic: str, chunks: list[Any],
                   total: int) -> float:
    from strata.client import AsyncProducer

    async with AsyncProducer(bootstrap, security=security, acks=1, linger_ms=5,
                             batch_size=512 << 10, enable_idempotence=False) as producer:
        await producer.partitions_for(topic)
        await producer.send_batch(topic, chunks[0])  # schemas and metadata first
        await producer.flush()
        started = time.perf_counter()
        sent = 0
        while sent < total:
            await producer.send_batch(topic, chunks[(sent // _CHUNK) % len(chunks)])
            sent += _CHUNK
            await asyncio.sleep(0)
        await producer.flush()
        return sent / (time.perf_counter() - started)


def _ensure_topics(admin: Any, prefix: str, partitions: int) -> tuple[str, str]:
    from strata.client import NewTopic, TopicAlreadyExistsError

    plain, typed = f"{prefix}-json", f"{prefix}-typed"
    admin.register_schema(f"{typed}-value", ORDER_SCHEMA)
    for topic, configs in ((plain, {}), (typed, {"value.schema.subject": f"{typed}-value"})):
        with contextlib.suppress(TopicAlreadyExistsError):
            # Tiering on, with segments that close (only closed ones are tiered).
            admin.create_topics([NewTopic(topic, partitions, 1, {
                "tier.enable": "true", "tier.after.ms": "0",
                "segment.bytes": str(16 << 20), **configs})])
    return plain, typed


def bench_produce(bootstrap: str, security: Any, plain: str, typed: str, records: int,
                  pairs: int) -> dict[str, Any]:
    from wire.record_batch import build_batch
    from wire.schema import parse_schema

    orders = order_table(0, 10 * _CHUNK)
    typed_chunks = [orders.slice(i, _CHUNK) for i in range(0, orders.num_rows, _CHUNK)]
    plain_values = json_values(orders)
    plain_chunks = [plain_values.slice(i, _CHUNK) for i in range(0, len(plain_values),
                                                                  _CHUNK)]
    runs: dict[str, list[float]] = {"bytes": [], "typed": []}
    # One short pair first, not counted: the process's first producer pays one-off costs
    # (imports, Arrow kernels' first calls) that would land on whichever side runs first.
    asyncio.run(_produce(bootstrap, security, plain, plain_chunks, 100 * _CHUNK))
    asyncio.run(_produce(bootstrap, security, typed, typed_chunks, 100 * _CHUNK))
    for _ in range(pairs):
        runs["bytes"].append(asyncio.run(_produce(bootstrap, security, plain, plain_chunks,
                                                  records)))
        runs["typed"].append(asyncio.run(_produce(bootstrap, security, typed, typed_chunks,
                                                  records)))
    medians = {k: statistics.median(v) for k, v in runs.items()}
    schema = parse_schema(ORDER_SCHEMA)
    one = orders.slice(0, _CHUNK)
    log_bytes = {
        "bytes": len(build_batch(plain_values.slice(0, _CHUNK))) / _CHUNK,
        "typed": len(build_batch(one.to_struct_array().combine_chunks().cast(schema.arrow_type),
                                 value_schema_id=1)) / _CHUNK,
    }
    return {"records_per_run": records,
            "runs_records_per_sec": {k: [round(x) for x in v] for k, v in runs.items()},
            "median_records_per_sec": {k: round(v) for k, v in medians.items()},
            "typed_overhead_pct": round((1 - medians["typed"] / medians["bytes"]) * 100, 1),
            "log_bytes_per_record": {k: round(v, 1) for k, v in log_bytes.items()}}


def run_typed(args: argparse.Namespace) -> int:
    from strata.client import Admin
    from strata_tools.commands.common import bootstrap_of, security_of_args

    bootstrap, security = bootstrap_of(args), security_of_args(args)
    with Admin(bootstrap, security=security) as admin:
        plain, typed = _ensure_topics(admin, args.prefix, args.partitions)
    result: dict[str, Any] = {"produce": bench_produce(bootstrap, security, plain, typed,
                                                       args.num_records, args.pairs)}
    if args.spark:
        from strata_tools.perf_typed_spark import bench_spark

        result["spark"] = bench_spark(bootstrap, security, args)
    if args.format == "json":
        print(json.dumps(result))
        return 0
    produce = result["produce"]
    med = produce["median_records_per_sec"]
    print(f"produce send_batch, {produce['records_per_run']:,} records a run: bytes (JSON) "
          f"{med['bytes']:,}/s, typed {med['typed']:,}/s, typed overhead "
          f"{produce['typed_overhead_pct']} % (runs {produce['runs_records_per_sec']})")
    log_bytes = produce["log_bytes_per_record"]
    print(f"bytes per record in the log: JSON {log_bytes['bytes']}, typed {log_bytes['typed']}")
    if "spark" in result:
        spark = result["spark"]
        print(f"spark sum(amount) by customer over {spark['records']:,} records: typed "
              f"{spark['typed_rows_per_sec']:,} rows/s, from_json "
              f"{spark['json_rows_per_sec']:,} rows/s: {spark['speedup']}x "
              f"(runs {spark['runs']})")
        print(f"bytes per record in Delta: JSON {spark['delta_bytes_per_record']['bytes']}, "
              f"typed {spark['delta_bytes_per_record']['typed']}")
    return 0

