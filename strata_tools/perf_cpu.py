"""CPU per record at fixed rates (issue [3.7]): ``python -m strata_tools.perf_cpu``.

For each case (rate x chunk size x acks) on a running stack: a topic of its own, a
``strata perf consume`` process started first, then ``strata perf produce --throughput
RATE --chunk-records CHUNK`` (a chunk of 1: ``--api produce``, the per-record API) for
``--seconds`` worth of records; the producer's and the
consumer's CPU come from their own JSON (``cpu_s``: every thread of the process over
its run), each broker's from ``/proc/<pid>/stat`` (user + system) over the same span.
Reported per million records, next to the rate reached and the consumer's end-to-end
record age (p50 / p99). Same commands a user runs, so the figures are the user path's.

    python -m strata_tools.perf_cpu --data-dir D [--rates 10000,50000,100000,200000]
        [--chunks 1,100,1000] [--acks 1,all] [--seconds 10] [--partitions 8]

``--data-dir``: a stack started by ``strata up`` (its ``stack.json`` names the brokers'
pids and the bootstrap). ``--acks all`` needs three brokers (topics get RF 3, min ISR 2
there; RF 1 on a one-broker stack).

``--kafka-data-dir D``: the same rates against Apache Kafka started by
``scripts/kafka_local.sh up --data-dir D`` (its state names the brokers' pids): Kafka's
``ProducerPerformance --throughput RATE`` (``linger.ms=1``; Kafka's producer batches
itself, so there is no chunk column) and ``ConsumerPerformance``, each a JVM whose CPU is
its rusage when it exits, the brokers' from ``/proc``. Kafka's tools report no record
age, so the latency column is the producer's acknowledgement p50 / p99 there. A tool
JVM's start-up CPU (one run of each tool with one record, the first topic's) is
subtracted, as the Strata tools start their clocks once connected.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["broker_cpu_seconds", "kafka_stack", "main", "strata_command", "strata_stack"]

TICKS = os.sysconf("SC_CLK_TCK")


def broker_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def strata_stack(data_dir: Path) -> tuple[str, list[int]]:
    state = json.loads((data_dir / "stack.json").read_text())
    services = state["processes"]
    brokers = sorted((s for s in services if str(s.get("name", "")).startswith("broker")),
                     key=lambda s: s["name"])
    bootstrap = ",".join(s["endpoint"] for s in brokers)
    return bootstrap, [int(s["pid"]) for s in brokers]


def strata_command(*args: str) -> list[str]:
    """``strata ARGS`` as this interpreter runs it (the tree it runs from)."""
    return [sys.executable, "-m", "strata_tools.cli", *args]


def run_case(bootstrap: str, pids: list[int], rate: int, chunk: int, acks: str,
             seconds: float, partitions: int) -> dict[str, Any]:
    topic = f"cpu-{rate}-{chunk}-{acks}-{int(time.time() * 1000)}"
    replicas = 3 if len(pids) >= 3 else 1
    create = ["topic", "create", topic, "-p", str(partitions), "-r", str(replicas),
              "--bootstrap", bootstrap]
    if replicas == 3:
        create += ["-c", "min.insync.replicas=2"]
    subprocess.run(strata_command(*create), check=True, capture_output=True)
    records = int(rate * seconds)
    consumer = subprocess.Popen(
        strata_command("perf", "consume", "--bootstrap", bootstrap, "--topic", topic,
                "--num-records", str(records), "--timeout-ms", "60000", "--format", "json"),
        stdout=subprocess.PIPE, text=True)
    time.sleep(2.0)  # the consumer assigned and polling before the first record
    before = [broker_cpu_seconds(pid) for pid in pids]
    # A chunk of one record is the per-record API (``Producer.produce``: the producer
    # batches); larger chunks are ``send_batch`` calls of that many records.
    api = ["--api", "produce"] if chunk == 1 else ["--chunk-records", str(chunk)]
    produced = subprocess.run(
        strata_command("perf", "produce", "--bootstrap", bootstrap, "--topic", topic,
                "--num-records", str(records), "--record-size", "100", "--acks", acks,
                "--throughput", str(rate), *api, "--linger-ms", "1", "--format", "json"),
        check=True, capture_output=True, text=True)
    out, _ = consumer.communicate(timeout=seconds * 20 + 120)
    after = [broker_cpu_seconds(pid) for pid in pids]
    producer = json.loads(produced.stdout.strip().splitlines()[-1])
    consumed = json.loads(out.strip().splitlines()[-1])
    million = records / 1e6
    return {
        "rate": rate, "chunk_records": chunk, "acks": acks, "records": records,
        "rate_reached": producer["records_per_sec"],
        "e2e_p50_ms": consumed.get("latency_ms", {}).get("p50"),
        "e2e_p99_ms": consumed.get("latency_ms", {}).get("p99"),
        "producer_cpu_s_per_million": producer.get("cpu_s_per_million"),
        "consumer_cpu_s_per_million": consumed.get("cpu_s_per_million"),
        "broker_cpu_s_per_million": [round((a - b) / million, 2)
                                     for a, b in zip(after, before, strict=True)],
    }


def kafka_stack(data_dir: Path) -> tuple[str, list[int]]:
    from strata_tools import kafka_local

    state = kafka_local._read_state(data_dir.resolve())
    if state is None:
        raise SystemExit(f"no Kafka stack in {data_dir}: scripts/kafka_local.sh up first")
    nodes = state["nodes"]
    bootstrap = str(state["bootstrap"])
    return bootstrap, [int(n["pid"]) for n in nodes]


def _jvm(command: list[str]) -> tuple[str, float]:
    """Run a Kafka tool JVM to its end: its stdout and its CPU seconds (rusage)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    assert process.stdout is not None
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{command[-12:]} exited {process.returncode}: {out[-2000:]}")
    return out, usage.ru_utime + usage.ru_stime


_STARTUP: dict[str, float] = {}


def _startup_cpu(vdir: Path, bootstrap: str, topic: str) -> tuple[float, float]:
    """CPU seconds a producer and a consumer tool JVM spend on one record: start-up and
    JIT warm-up, which the Strata tools' own figures leave out (they start the clock
    once connected). Measured once per run and subtracted."""
    from strata_tools import kafka_local

    if not _STARTUP:
        _, _STARTUP["producer"] = _jvm(kafka_local.tool_command(
            vdir, "org.apache.kafka.tools.ProducerPerformance",
            ["--topic", topic, "--num-records", "1", "--record-size", "100", "--throughput",
             "-1", "--producer-props", f"bootstrap.servers={bootstrap}"]))
        _, _STARTUP["consumer"] = _jvm(kafka_local.tool_command(
            vdir, "org.apache.kafka.tools.ConsumerPerformance",
            ["--bootstrap-server", bootstrap, "--topic", topic, "--messages", "1",
             "--timeout", "60000"]))
    return _STARTUP["producer"], _STARTUP["consumer"]


def run_kafka_case(data_dir: Path, bootstrap: str, pids: list[int], rate: int, acks: str,
                   seconds: float, partitions: int) -> dict[str, Any]:
    """One fixed-rate case against Kafka (see the module docstring)."""
    import threading

    from strata_tools import kafka_local
    from strata_tools.perf_standing import PERF_LINE as _PERF_LINE

    state = kafka_local._read_state(data_dir.resolve())
    assert state is not None
    vdir = kafka_local.version_dir(state.get("version") or kafka_local.default_version())
    topic = f"cpu-{rate}-{acks}-{int(time.time() * 1000)}"
    replicas = 3 if len(pids) >= 3 else 1
    create = ["--bootstrap-server", bootstrap, "--create", "--topic", topic,
              "--partitions", str(partitions), "--replication-factor", str(replicas)]
    if replicas == 3:
        create += ["--config", "min.insync.replicas=2"]
    _jvm(kafka_local.tool_command(vdir, "org.apache.kafka.tools.TopicCommand", create))
    start_producer, start_consumer = _startup_cpu(vdir, bootstrap, topic)
    records = int(rate * seconds)
    consumed: dict[str, float] = {}

    def consume() -> None:
        _, consumed["cpu"] = _jvm(kafka_local.tool_command(
            vdir, "org.apache.kafka.tools.ConsumerPerformance",
            ["--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(records),
             "--timeout", "60000"]))

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(2.0)
    before = [broker_cpu_seconds(pid) for pid in pids]
    out, producer_cpu = _jvm(kafka_local.tool_command(
        vdir, "org.apache.kafka.tools.ProducerPerformance",
        ["--topic", topic, "--num-records", str(records), "--record-size", "100",
         "--throughput", str(rate), "--producer-props", f"bootstrap.servers={bootstrap}",
         f"acks={acks}", "linger.ms=1"]))
    consumer.join(seconds * 20 + 120)
    after = [broker_cpu_seconds(pid) for pid in pids]
    last = [m for m in _PERF_LINE.finditer(out)][-1]
    million = records / 1e6
    return {
        "rate": rate, "chunk_records": "-", "acks": acks, "records": records,
        "rate_reached": round(float(last["rate"])),
        "e2e_p50_ms": float(last["p50"]), "e2e_p99_ms": float(last["p99"]),
        "producer_cpu_s_per_million": round((producer_cpu - start_producer) / million, 2),
        "consumer_cpu_s_per_million": round(
            (consumed.get("cpu", float("nan")) - start_consumer) / million, 2),
        "broker_cpu_s_per_million": [round((a - b) / million, 2)
                                     for a, b in zip(after, before, strict=True)],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| system | rate | chunk | acks | reached | e2e p50 / p99 ms | CPU s per "
             "million: producer | consumer | brokers |",
             "|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r.get('system', 'strata')} | {r['rate']:,} | {r['chunk_records']} | "
            f"{r['acks']} | {r['rate_reached']:,} | "
            f"{r['e2e_p50_ms']} / {r['e2e_p99_ms']} | {r['producer_cpu_s_per_million']} | "
            f"{r['consumer_cpu_s_per_million']} | "
            f"{', '.join(str(b) for b in r['broker_cpu_s_per_million'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_cpu",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--kafka-data-dir", type=Path,
                        help="also run each rate against this kafka_local stack, alternating")
    parser.add_argument("--rates", default="10000,50000,100000,200000")
    parser.add_argument("--chunks", default="1,100,1000")
    parser.add_argument("--acks", default="1")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args(argv)
    bootstrap, pids = strata_stack(args.data_dir)
    kafka = None if args.kafka_data_dir is None else kafka_stack(args.kafka_data_dir)
    rows = []
    for acks in args.acks.split(","):
        for rate in (int(r) for r in args.rates.split(",")):
            for chunk in (int(c) for c in args.chunks.split(",")):
                row = run_case(bootstrap, pids, rate, chunk, acks, args.seconds,
                               args.partitions)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
            if kafka is not None:  # after the same rate's Strata cases: alternating
                row = {"system": "kafka", **run_kafka_case(
                    args.kafka_data_dir, *kafka, rate, acks, args.seconds, args.partitions)}
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
