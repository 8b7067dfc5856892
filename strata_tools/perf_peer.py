"""Per-record ``produce`` beside confluent-kafka's, in one run (issue [3.7] item 4).

    python -m strata_tools.perf_peer --strata-bootstrap HOST:PORT --kafka-bootstrap HOST:PORT \\
        [--num-records 1000000] [--record-size 100] [--rounds 2]

Alternates, round after round: ``strata perf produce --api produce`` (the loop a Python
application writes on Strata's blocking ``Producer``) and confluent-kafka's
``Producer.produce`` loop against an Apache Kafka cluster (``strata_tools.kafka_local``),
then the same with a delivery callback on every record (``--api produce-callback``
against ``on_delivery=``, the peer the issue names). Both: one topic of 8 partitions,
acks=1, no idempotence (librdkafka's default; ``strata perf produce`` turns it off for
acks=1), ``--record-size`` random bytes, null keys; timed from the first ``produce`` to
the end of ``flush()``; CPU is the producing process's. Prints a Markdown table (the
median of the rounds, and Strata / confluent-kafka).

confluent-kafka is a development dependency (``make setup`` installs it; the Kafka
listener's tests use it too); where it is missing the run stops with that advice. Never
run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

TOPIC = "perf-peer"
PARTITIONS = 8


def _confluent(bootstrap: str, n: int, size: int, callback: bool) -> dict[str, Any]:
    """confluent-kafka's produce loop (run in a process of its own)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result()
        time.sleep(1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1",
                         "enable.idempotence": False})
    producer.list_topics(TOPIC, timeout=10)  # metadata before the clock starts
    value = os.urandom(size)
    delivered = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1

    produce, poll = producer.produce, producer.poll
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                if callback:
                    produce(TOPIC, value, on_delivery=on_delivery)
                else:
                    produce(TOPIC, value)
                break
            except BufferError:  # librdkafka's queue is full: serve it, then retry
                poll(0.001)
        if callback and i % 1000 == 0:
            poll(0)  # confluent-kafka runs callbacks in poll(), on this thread
    producer.flush()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    if callback and delivered[0] != n:
        raise SystemExit(f"confluent-kafka: {n - delivered[0]} of {n} deliveries failed")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"records_per_sec": round(n / seconds), "seconds": round(seconds, 3),
            "cpu_s": round(cpu, 3)}


def _strata(bootstrap: str, n: int, size: int, callback: bool) -> dict[str, Any]:
    from strata_tools.perf_cpu import strata_command

    made = subprocess.run(strata_command("topic", "create", TOPIC, "-p", str(PARTITIONS),
                                         "--bootstrap", bootstrap),
                          capture_output=True, text=True)
    if made.returncode != 0 and "TOPIC_ALREADY_EXISTS" not in made.stdout + made.stderr:
        raise SystemExit(f"perf_peer: creating {TOPIC} failed: {made.stdout}{made.stderr}")
    out = subprocess.run(
        strata_command("perf", "produce", "--bootstrap", bootstrap, "--topic", TOPIC,
                       "--num-records", str(n), "--record-size", str(size), "--acks", "1",
                       "--api", "produce-callback" if callback else "produce",
                       "--format", "json"),
        check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    return {"records_per_sec": round(result["records_per_sec"]),
            "seconds": result["seconds"], "cpu_s": result["cpu_s"]}


def _peer(bootstrap: str, n: int, size: int, callback: bool) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "strata_tools.perf_peer", "--confluent-run", bootstrap,
         str(n), str(size), "1" if callback else "0"],
        check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--confluent-run"]:
        bootstrap, n, size, callback = args[1], int(args[2]), int(args[3]), args[4] == "1"
        print(json.dumps(_confluent(bootstrap, n, size, callback)))
        return 0
    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_peer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--strata-bootstrap", required=True)
    parser.add_argument("--kafka-bootstrap", required=True)
    parser.add_argument("--num-records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args(args)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("perf_peer: confluent-kafka is not installed here; `pip install "
              "confluent-kafka` (it is not a project dependency), then run again")
        return 2
    rows: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    n, size = options.num_records, options.record_size
    for _ in range(options.rounds):
        for callback in (False, True):
            rows.setdefault(("strata", callback), []).append(
                _strata(options.strata_bootstrap, n, size, callback))
            rows.setdefault(("confluent-kafka", callback), []).append(
                _peer(options.kafka_bootstrap, n, size, callback))
    print(f"| loop ({n:,} x {size} B, acks=1) | Strata records/s | confluent-kafka "
          "records/s | Strata / confluent | CPU s: Strata | confluent |")
    print("|---|---:|---:|---:|---:|---:|")
    for callback in (False, True):
        ours, theirs = rows[("strata", callback)], rows[("confluent-kafka", callback)]
        rate = statistics.median(r["records_per_sec"] for r in ours)
        peer = statistics.median(r["records_per_sec"] for r in theirs)
        each = ", ".join(f"{r['records_per_sec']:,}" for r in ours)
        each_peer = ", ".join(f"{r['records_per_sec']:,}" for r in theirs)
        loop = "`produce` with a callback on every record" if callback else "`produce`"
        cpu = statistics.median(r["cpu_s"] for r in ours)
        cpu_peer = statistics.median(r["cpu_s"] for r in theirs)
        print(f"| {loop} | {rate:,.0f} ({each}) | {peer:,.0f} ({each_peer}) "
              f"| {rate / peer:.2f}x | {cpu:.2f} | {cpu_peer:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
