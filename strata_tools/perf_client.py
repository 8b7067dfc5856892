"""``strata perf produce`` and ``strata perf consume``: client throughput and latency.

Modelled on Kafka's ``kafka-producer-perf-test`` / ``kafka-consumer-perf-test``.

produce: sends ``--num-records`` records of ``--record-size`` random bytes (null keys, so
the sticky partitioner spreads batches over the partitions). ``--api batch`` (default)
hands the producer whole Arrow columns of ``--chunk-records`` records (``send_batch``,
no per-record Python); ``--api send`` awaits the asyncio ``send`` once per record (a
future per record); ``--api produce`` is the loop a Python application writes,
``for ...: producer.produce(topic, value)`` on the blocking ``Producer`` (no future per
record; every failure would still be raised by the final ``flush``, which fails the
run); ``--api produce-callback`` the same loop with an ``on_delivery`` callback on every
record (confluent-kafka's usual loop; the run fails unless every callback came);
``--api blocking-send`` the same loop with the blocking ``send``, keeping every
future and checking each at the end. Latency is measured from the moment a record is
handed to the producer to its acknowledgement (per chunk for ``--api batch``, every
64th record for ``produce`` and ``blocking-send``). ``--throughput`` caps records/s.
``batch`` and ``send`` use the asyncio client: one thread, so no GIL hand-off between
the caller and the client's I/O loop sits inside the measured latency.

``--transactional-id ID`` runs the records in transactions (Kafka's
``--transactional-id``; implies ``--acks all``): one every ``--transaction-records``
records or, as Kafka's ``--transaction-duration-ms``, every that many milliseconds
(default 100 ms). The result adds the transactions committed and the commit latency
(``commit_transaction`` from call to return: flush of what is left, EndTxn, answer).
After the timed run, outside its figures, ``LSO_PROBES`` small transactions (one record
to each partition) measure how soon a commit becomes readable: ``lso_lag_ms``, from
``commit_transaction``'s return until ListOffsets at read_committed (the last stable
offset) equals the log end on every partition (the coordinator answers EndTxn once the
PrepareCommit is durable and writes the markers after), next to ``append_ms``, one
acks=all record's round trip (one replicated append), the yardstick of both. The
probe's records (``b"lso-probe"``) land in the topic too.

consume: reads ``--num-records`` records from the start of every partition with
``poll_arrow`` (columns, no per-record Python) and reports throughput. Its latency is
each record's age when it was consumed (now - record timestamp): run it while a
producer is writing to measure end-to-end latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from wire.security import ClientSecurity

__all__ = ["add_consume_arguments", "add_produce_arguments", "percentile", "run_consume",
           "run_produce", "summarize"]


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--command-config", default=None, metavar="FILE",
                        help="client security settings (as for every client command; "
                        "docs/security.md)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--num-records", type=_positive, required=True)
    parser.add_argument("--format", choices=("text", "json"), default="text")


def add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--record-size", type=_positive, default=100)
    parser.add_argument("--throughput", type=float, default=-1,
                        help="records/s cap; -1 for as fast as possible")
    parser.add_argument("--acks", choices=("0", "1", "all"), default=None,
                        help="default 1, or all with --transactional-id")
    parser.add_argument("--batch-size", type=_positive, default=512 << 10,
                        help="producer batch_size in bytes (default 512 KiB: a 1,000-record "
                        "chunk of 100-byte records travels as one batch, and batches stay "
                        "below the default max.message.bytes of 1 MiB)")
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--compression", choices=("none", "lz4", "zstd"), default="none")
    parser.add_argument("--api", choices=("batch", "send", "produce", "produce-callback",
                                          "blocking-send"),
                        default="batch")
    parser.add_argument("--chunk-records", type=_positive, default=1000,
                        help="records per send_batch call with --api batch")
    parser.add_argument("--transactional-id", default=None, metavar="ID",
                        help="write in transactions with this transactional id "
                        "(implies --acks all; docs/transactions.md)")
    parser.add_argument("--transaction-duration-ms", type=_positive, default=None,
                        metavar="MS", help="commit a transaction every MS ms (Kafka's "
                        "option; default 100 when --transaction-records is not given)")
    parser.add_argument("--transaction-records", type=_positive, default=None, metavar="N",
                        help="commit a transaction every N records")


def add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--timeout-ms", type=_positive, default=60_000,
                        help="give up once polls that together waited this long came "
                        "back empty")
    parser.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                        default="read_uncommitted",
                        help="read_committed: only committed transactions, up to the "
                        "last stable offset")
    parser.add_argument("--api", choices=("arrow", "records", "async-records"),
                        default="arrow",
                        help="arrow: AsyncConsumer.poll_arrow, columns (default); records: "
                        "the blocking Consumer.poll, one record object at a time, as a "
                        "per-record Python loop reads; async-records: the same loop over "
                        "AsyncConsumer.poll")


def percentile(ordered: list[float], q: float, digits: int) -> float:
    """The ``q`` quantile (nearest rank) of ascending ``ordered``, rounded."""
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)


def summarize(records: int, value_bytes: int, seconds: float,
              latencies_ms: list[float] | None, cpu_s: float | None = None) -> dict[str, Any]:
    """The figures of a run. ``cpu_s``: this process's CPU time (every thread: the
    caller's and the client's I/O thread) over the same interval, reported with its
    cost per million records (issue [3.7]: CPU at a given rate, not only speed)."""
    out: dict[str, Any] = {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_sec": round(records / seconds) if seconds > 0 else 0,
        "mb_per_sec": round(value_bytes / seconds / 1e6, 2) if seconds > 0 else 0,
    }
    if cpu_s is not None:
        out["cpu_s"] = round(cpu_s, 3)
        out["cpu_s_per_million"] = round(cpu_s / records * 1e6, 2) if records else 0
    if latencies_ms:
        ordered = sorted(latencies_ms)

        def pct(q: float) -> float:
            return percentile(ordered, q, 3)

        out["latency_ms"] = {
            "avg": round(sum(ordered) / len(ordered), 3), "p50": pct(0.50), "p95": pct(0.95),
            "p99": pct(0.99), "p999": pct(0.999), "max": round(ordered[-1], 3),
        }
    return out


def _print(result: dict[str, Any], fmt: str, what: str) -> None:
    if fmt == "json":
        print(json.dumps(result))
        return
    line = (f"{what}: {result['records']} records in {result['seconds']} s, "
            f"{result['records_per_sec']:,} records/s, {result['mb_per_sec']} MB/s")
    if "cpu_s" in result:
        line += f", CPU {result['cpu_s']} s ({result['cpu_s_per_million']} s per million)"
    latency = result.get("latency_ms")
    if latency:
        line += (f", latency ms avg {latency['avg']} p50 {latency['p50']} p95 "
                 f"{latency['p95']} p99 {latency['p99']} p99.9 {latency['p999']} "
                 f"max {latency['max']}")
    commits = result.get("commit_ms")
    if "transactions" in result:
        line += f"; {result['transactions']} transactions"
        if commits:
            line += (f", commit ms p50 {commits['p50']} p99 {commits['p99']} "
                     f"max {commits['max']}")
    lso, append = result.get("lso_lag_ms"), result.get("append_ms")
    if lso and append:
        line += (f"; commit to LSO = log end ms p50 {lso['p50']} max {lso['max']}; one "
                 f"acks=all append ms p50 {append['p50']}")
    print(line)


#: Transactions the LSO probe runs after a transactional ``perf produce``.
LSO_PROBES = 20


def lso_probe(args: argparse.Namespace) -> dict[str, Any]:
    """``lso_lag_ms`` and ``append_ms`` (module docstring), ``LSO_PROBES`` samples each."""
    from strata.client import Admin, Producer, TopicPartition

    topic = args.topic
    lags: list[float] = []
    appends: list[float] = []
    with Producer(_bootstrap(args), security=_security(args), acks="all", linger_ms=0,
                  transactional_id=f"{args.transactional_id}-lso-probe") as producer, \
            Admin(_bootstrap(args), security=_security(args)) as admin:
        partitions = list(range(producer.partitions_for(topic)))
        tps = [TopicPartition(topic, p) for p in partitions]
        producer.init_transactions()
        for _ in range(LSO_PROBES):
            producer.begin_transaction()
            began = time.perf_counter()
            producer.send(topic, b"lso-probe", partition=partitions[0]).result()
            appends.append((time.perf_counter() - began) * 1000)
            for p in partitions[1:]:
                producer.send(topic, b"lso-probe", partition=p)
            producer.commit_transaction()
            committed = time.perf_counter()
            while True:
                stable = admin.list_offsets(dict.fromkeys(tps, "latest"),
                                            isolation_level="read_committed")
                ends = admin.list_offsets(dict.fromkeys(tps, "latest"))
                if all(stable[tp].offset == ends[tp].offset for tp in tps):
                    break
                if time.perf_counter() - committed > 30:
                    raise RuntimeError("the last stable offset did not reach the log end "
                                       "within 30 s of a commit")
            lags.append((time.perf_counter() - committed) * 1000)

    def figures(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"p50": percentile(ordered, 0.5, 3), "max": round(ordered[-1], 3)}

    return {"lso_lag_ms": figures(lags), "append_ms": figures(appends)}


def _security(args: argparse.Namespace) -> ClientSecurity:
    from strata_tools.commands.common import security_of_args

    return security_of_args(args)


def _bootstrap(args: argparse.Namespace) -> str:
    from strata_tools.commands.common import bootstrap_of

    return bootstrap_of(args)


class _Transactions:
    """When to commit (``--transaction-records`` / ``--transaction-duration-ms``) and how
    long each commit took."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.records: int | None = args.transaction_records
        self.duration_s = None if self.records else (args.transaction_duration_ms or 100) / 1000
        self.opened_at = 0.0
        self.in_txn = 0
        self.commits_ms: list[float] = []

    def opened(self) -> None:
        self.opened_at = time.perf_counter()
        self.in_txn = 0

    def due(self, added: int) -> bool:
        """Count ``added`` records; True when the open transaction should commit."""
        self.in_txn += added
        if self.records is not None and self.in_txn >= self.records:
            return True
        return self.duration_s is not None and \
            time.perf_counter() - self.opened_at >= self.duration_s

    def chunk(self, wanted: int) -> int:
        """Records to hand over in one call so no transaction exceeds its count."""
        return wanted if self.records is None else min(wanted, self.records - self.in_txn)

    def result(self) -> dict[str, Any]:
        ordered = sorted(self.commits_ms)
        out: dict[str, Any] = {"transactions": len(ordered)}
        if ordered:
            out["commit_ms"] = {"p50": percentile(ordered, 0.5, 3),
                                "p99": percentile(ordered, 0.99, 3),
                                "max": round(ordered[-1], 3)}
        return out


def _check_transactional(args: argparse.Namespace) -> str | None:
    """Resolve ``--acks`` (default 1, or all with transactions); the problem, if any."""
    transactional = args.transactional_id is not None
    if args.acks is None:
        args.acks = "all" if transactional else "1"
    if not transactional:
        if args.transaction_records or args.transaction_duration_ms:
            return ("--transaction-records and --transaction-duration-ms need "
                    "--transactional-id ID")
        return None
    if args.acks != "all":
        return "--transactional-id needs --acks all (transactions are idempotent, acks=all)"
    if args.transaction_records and args.transaction_duration_ms:
        return "give --transaction-records or --transaction-duration-ms, not both"
    return None


def run_produce(args: argparse.Namespace) -> int:
    problem = _check_transactional(args)
    if problem is not None:
        print(f"strata perf produce: [INVALID_CONFIG] {problem}")
        return 2
    if args.api in ("produce", "produce-callback", "blocking-send"):
        return _produce_records(args)
    return asyncio.run(_produce(args))


#: ``--api produce`` times every LATENCY_SAMPLE-th record (a callback per record would
#: measure the callbacks).
LATENCY_SAMPLE = 64


def _produce_records(args: argparse.Namespace) -> int:
    """The per-record loop on the blocking producer: ``produce`` without a future, or
    (``blocking-send``) ``send`` keeping every record's future, all checked at the end.
    Latency: every ``LATENCY_SAMPLE``-th record's acknowledgement."""
    from strata.client import Producer

    acks: int | str = "all" if args.acks == "all" else int(args.acks)
    payload = os.urandom(args.record_size)
    latencies: list[float] = []
    errors: list[BaseException] = []
    delivered = [0]  # callbacks that reported success (the producer's I/O thread only)

    def counted(_meta: Any, error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)
        else:
            delivered[0] += 1

    def timed(started: float) -> Any:
        def done(meta: Any, error: BaseException | None) -> None:
            counted(meta, error)
            if error is None:
                latencies.append((time.perf_counter() - started) * 1000)
        return done

    topic, n, throughput = args.topic, args.num_records, args.throughput

    def pace(i: int, start: float) -> None:
        if throughput > 0:
            ahead = i / throughput - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)

    txn = _Transactions(args) if args.transactional_id else None

    def maybe_commit(producer: Any, i: int) -> None:
        if txn is not None and txn.due(1):
            began = time.perf_counter()
            producer.commit_transaction()
            txn.commits_ms.append((time.perf_counter() - began) * 1000)
            txn.in_txn = 0
            if i + 1 < n:
                producer.begin_transaction()
                txn.opened()

    def finish(producer: Any) -> None:
        """Commit the last, partly filled transaction."""
        assert txn is not None
        began = time.perf_counter()
        producer.commit_transaction()
        txn.commits_ms.append((time.perf_counter() - began) * 1000)

    with Producer(_bootstrap(args), security=_security(args), acks=acks,
                  batch_size=args.batch_size, linger_ms=args.linger_ms,
                  compression=args.compression, transactional_id=args.transactional_id,
                  enable_idempotence=None if args.acks == "all" else False) as producer:
        producer.partitions_for(topic)  # metadata before the clock starts
        if txn is not None:
            producer.init_transactions()
        start, cpu_start = time.perf_counter(), time.process_time()
        if txn is not None:
            producer.begin_transaction()
            txn.opened()
        if args.api in ("produce", "produce-callback"):
            from strata.client import DeliveryFailedError

            produce = producer.produce
            every = counted if args.api == "produce-callback" else None
            try:
                for i in range(n):
                    if i % LATENCY_SAMPLE == 0:
                        pace(i, start)
                        produce(topic, payload, on_delivery=timed(time.perf_counter()))
                    else:
                        produce(topic, payload, on_delivery=every)
                    if txn is not None:
                        maybe_commit(producer, i)
                if txn is not None and txn.in_txn:
                    finish(producer)
                producer.flush()
            except DeliveryFailedError as err:
                errors.append(err)
        else:
            send = producer.send
            futures = []
            for i in range(n):
                if i % LATENCY_SAMPLE == 0:
                    pace(i, start)
                    future = send(topic, payload)
                    future.add_done_callback(_sampled(timed(time.perf_counter())))
                    futures.append(future)
                else:
                    futures.append(send(topic, payload))
                if txn is not None:
                    maybe_commit(producer, i)
            if txn is not None and txn.in_txn:
                finish(producer)
            producer.flush()
            errors.extend(e for f in futures if (e := f.exception()) is not None)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    if errors:
        print(f"strata perf produce: {len(errors)} delivery failure(s), first: {errors[0]}")
        return 1
    if args.api == "produce-callback" and delivered[0] != n:
        print(f"strata perf produce: [UNKNOWN_SERVER_ERROR] {n - delivered[0]} of {n} "
              "delivery callbacks never came after flush(); report this as a bug")
        return 1
    result = summarize(n, n * args.record_size, seconds, latencies, cpu)
    result.update({"api": args.api, "acks": args.acks, "record_size": args.record_size})
    if txn is not None:
        result.update(txn.result())
        result.update(lso_probe(args))
    _print(result, args.format, "produce")
    return 0


def _sampled(done: Any) -> Any:
    """A future's done-callback reporting to ``done(metadata, error)``."""
    def callback(future: Any) -> None:
        done(None, future.exception())
    return callback


async def _produce(args: argparse.Namespace) -> int:
    from strata.client import AsyncProducer

    acks: int | str = "all" if args.acks == "all" else int(args.acks)
    payload = os.urandom(args.record_size)
    latencies: list[float] = []
    errors: list[BaseException] = []

    def on_done(started: float, count: int) -> Any:
        def done(future: asyncio.Future[Any]) -> None:
            elapsed = (time.perf_counter() - started) * 1000
            error = future.exception()
            if error is not None:
                errors.append(error)
            else:
                latencies.extend([elapsed] * count)
        return done

    txn = _Transactions(args) if args.transactional_id else None

    async def maybe_commit(producer: Any, added: int, more: bool) -> None:
        if txn is not None and txn.due(added):
            began = time.perf_counter()
            await producer.commit_transaction()
            txn.commits_ms.append((time.perf_counter() - began) * 1000)
            txn.in_txn = 0
            if more:
                await producer.begin_transaction()
                txn.opened()

    async with AsyncProducer(_bootstrap(args), security=_security(args), acks=acks,
                             batch_size=args.batch_size, linger_ms=args.linger_ms,
                             compression=args.compression,
                             transactional_id=args.transactional_id,
                             enable_idempotence=None if args.acks == "all" else False
                             ) as producer:
        await producer.partitions_for(args.topic)  # metadata before the clock starts
        if txn is not None:
            await producer.init_transactions()
        if args.api == "batch":
            # The column sent over and over, built before the clock starts (pa.array
            # makes pyarrow import pandas, a one-time cost that is not the producer's).
            chunk = pa.array([payload] * args.chunk_records, pa.binary())
        start, cpu_start = time.perf_counter(), time.process_time()
        if txn is not None:
            await producer.begin_transaction()
            txn.opened()
        sent = 0
        if args.api == "batch":
            while sent < args.num_records:
                n = min(args.chunk_records, args.num_records - sent)
                if txn is not None:
                    n = txn.chunk(n)
                await _pace(args.throughput, sent, start)
                began = time.perf_counter()
                future = await producer.send_batch(args.topic, chunk.slice(0, n))
                future.add_done_callback(on_done(began, n))
                sent += n
                if txn is not None:
                    await maybe_commit(producer, n, sent < args.num_records)
        else:
            for i in range(args.num_records):
                if i % 100 == 0:
                    await _pace(args.throughput, i, start)
                acked = await producer.send(args.topic, payload)
                acked.add_done_callback(on_done(time.perf_counter(), 1))
                if txn is not None:
                    await maybe_commit(producer, 1, i + 1 < args.num_records)
        if txn is not None and txn.in_txn:
            began = time.perf_counter()
            await producer.commit_transaction()
            txn.commits_ms.append((time.perf_counter() - began) * 1000)
        await producer.flush()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    if errors:
        print(f"strata perf produce: {len(errors)} send(s) failed, first: {errors[0]}")
        return 1
    result = summarize(len(latencies), len(latencies) * args.record_size, seconds, latencies,
                       cpu)
    result.update({"api": args.api, "acks": args.acks, "record_size": args.record_size})
    if txn is not None:
        result.update(txn.result())
        result.update(lso_probe(args))
    _print(result, args.format, "produce")
    return 0


async def _pace(throughput: float, sent: int, start: float) -> None:
    if throughput <= 0:
        await asyncio.sleep(0)  # let the sender run between chunks
        return
    ahead = sent / throughput - (time.perf_counter() - start)
    await asyncio.sleep(max(0.0, ahead))


def run_consume(args: argparse.Namespace) -> int:
    if args.api == "records":
        return _consume_records(args)
    return asyncio.run(_consume(args))


def _read_each(batch: Any, wanted: int, latencies: list[float]) -> tuple[int, int]:
    """The per-record loop of both faces: touch each of (at most ``wanted``) records'
    value, note the newest record's age; the records and value bytes read."""
    records = value_bytes = 0
    for record in batch[:wanted]:
        records += 1
        value_bytes += len(record.value or b"")
    latencies.append(time.time() * 1000 - batch[-1].timestamp)
    return records, value_bytes


def _consume_records(args: argparse.Namespace) -> int:
    """The per-record path: ``for record in consumer.poll(...)``, touching each value."""
    from strata.client import Admin, Consumer, IdleTimer, TopicPartition

    bootstrap = _bootstrap(args)
    with Admin(bootstrap, security=_security(args)) as admin:
        description = admin.describe_topics([args.topic])[args.topic]
    partitions = [TopicPartition(args.topic, p.partition) for p in description.partitions]
    records = value_bytes = 0
    latencies: list[float] = []
    with Consumer(bootstrap, security=_security(args), auto_offset_reset="earliest",
                  max_partition_fetch_bytes=4 << 20,
                  isolation_level=args.isolation_level) as consumer:
        consumer.assign(partitions)
        consumer.seek_to_beginning(partitions)
        start = last = time.perf_counter()
        cpu_start = time.process_time()
        idle = IdleTimer(args.timeout_ms)  # only time inside empty polls is silence
        while records < args.num_records and not idle.expired:
            idle.start()
            batch = consumer.poll(timeout_ms=200)
            idle.stop(len(batch))
            if not batch:
                continue
            last = time.perf_counter()
            count, size = _read_each(batch, args.num_records - records, latencies)
            records += count
            value_bytes += size
        seconds, cpu = last - start, time.process_time() - cpu_start
    if records < args.num_records:
        print(f"strata perf consume: only {records} of {args.num_records} records arrived "
              f"within --timeout-ms {args.timeout_ms}")
        return 1
    result = summarize(records, value_bytes, seconds, latencies, cpu)
    result["api"] = "records"
    _print(result, args.format, "consume")
    return 0


async def _consume(args: argparse.Namespace) -> int:
    from strata.client import AsyncAdmin, AsyncConsumer, IdleTimer, TopicPartition

    bootstrap = _bootstrap(args)
    admin = AsyncAdmin(bootstrap, security=_security(args))
    try:
        description = (await admin.describe_topics([args.topic]))[args.topic]
    finally:
        await admin.close()
    partitions = [TopicPartition(args.topic, p.partition) for p in description.partitions]
    latencies: list[float] = []
    records = 0
    value_bytes = 0
    async with AsyncConsumer(bootstrap, security=_security(args), auto_offset_reset="earliest",
                             max_partition_fetch_bytes=4 << 20,
                             isolation_level=args.isolation_level) as consumer:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(partitions)
        start = time.perf_counter()
        last, cpu_start = start, time.process_time()
        idle = IdleTimer(args.timeout_ms)  # only time inside empty polls is silence
        while records < args.num_records and not idle.expired:
            if args.api == "async-records":
                idle.start()
                batch = await consumer.poll(timeout_ms=200)
                idle.stop(len(batch))
                if not batch:
                    continue
                last = time.perf_counter()
                count, size = _read_each(batch, args.num_records - records, latencies)
                records += count
                value_bytes += size
                continue
            idle.start()
            table = await consumer.poll_arrow(timeout_ms=200)
            idle.stop(table.num_rows)
            if table.num_rows == 0:
                continue
            last = time.perf_counter()
            table = table.slice(0, args.num_records - records)
            records += table.num_rows
            value_bytes += pc.sum(pc.binary_length(table.column("value"))).as_py() or 0
            now_ms = time.time_ns() // 1_000_000
            # About 64 samples per poll keep the percentile arithmetic cheap and the
            # loop free of per-record Python. (Ages in Python, not pc.subtract with a
            # pa.scalar: a Python scalar makes pyarrow import pandas, 0.2-0.5 CPU-s
            # that would count as the consumer's.)
            picks = pa.arange(0, table.num_rows, max(1, table.num_rows // 64))
            latencies.extend(float(now_ms - stamp) for stamp
                             in table.column("timestamp").take(picks).to_pylist())
        seconds, cpu = last - start, time.process_time() - cpu_start
    if records < args.num_records:
        print(f"strata perf consume: only {records} of {args.num_records} records arrived "
              f"within --timeout-ms {args.timeout_ms}")
        return 1
    result = summarize(records, value_bytes, seconds, latencies, cpu)
    result["api"] = args.api
    result["isolation_level"] = args.isolation_level
    _print(result, args.format, "consume")
    return 0
