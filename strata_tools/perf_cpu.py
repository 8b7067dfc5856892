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

__all__ = ["broker_cpu_seconds", "main"]

TICKS = os.sysconf("SC_CLK_TCK")


def broker_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _stack(data_dir: Path) -> tuple[str, list[int]]:
    state = json.loads((data_dir / "stack.json").read_text())
    services = state["processes"]
    brokers = sorted((s for s in services if str(s.get("name", "")).startswith("broker")),
                     key=lambda s: s["name"])
    bootstrap = ",".join(s["endpoint"] for s in brokers)
    return bootstrap, [int(s["pid"]) for s in brokers]


def _strata(*args: str) -> list[str]:
    return [sys.executable, "-m", "strata_tools.cli", *args]


def run_case(bootstrap: str, pids: list[int], rate: int, chunk: int, acks: str,
             seconds: float, partitions: int) -> dict[str, Any]:
    topic = f"cpu-{rate}-{chunk}-{acks}-{int(time.time() * 1000)}"
    replicas = 3 if len(pids) >= 3 else 1
    create = ["topic", "create", topic, "-p", str(partitions), "-r", str(replicas),
              "--bootstrap", bootstrap]
    if replicas == 3:
        create += ["-c", "min.insync.replicas=2"]
    subprocess.run(_strata(*create), check=True, capture_output=True)
    records = int(rate * seconds)
    consumer = subprocess.Popen(
        _strata("perf", "consume", "--bootstrap", bootstrap, "--topic", topic,
                "--num-records", str(records), "--timeout-ms", "60000", "--format", "json"),
        stdout=subprocess.PIPE, text=True)
    time.sleep(2.0)  # the consumer assigned and polling before the first record
    before = [broker_cpu_seconds(pid) for pid in pids]
    # A chunk of one record is the per-record API (``Producer.produce``: the producer
    # batches); larger chunks are ``send_batch`` calls of that many records.
    api = ["--api", "produce"] if chunk == 1 else ["--chunk-records", str(chunk)]
    produced = subprocess.run(
        _strata("perf", "produce", "--bootstrap", bootstrap, "--topic", topic,
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


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| rate | chunk | acks | reached | e2e p50 / p99 ms | CPU s per million: "
             "producer | consumer | brokers |", "|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['rate']:,} | {r['chunk_records']} | {r['acks']} | {r['rate_reached']:,} | "
            f"{r['e2e_p50_ms']} / {r['e2e_p99_ms']} | {r['producer_cpu_s_per_million']} | "
            f"{r['consumer_cpu_s_per_million']} | "
            f"{', '.join(str(b) for b in r['broker_cpu_s_per_million'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_cpu",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rates", default="10000,50000,100000,200000")
    parser.add_argument("--chunks", default="1,100,1000")
    parser.add_argument("--acks", default="1")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args(argv)
    bootstrap, pids = _stack(args.data_dir)
    rows = []
    for acks in args.acks.split(","):
        for rate in (int(r) for r in args.rates.split(",")):
            for chunk in (int(c) for c in args.chunks.split(",")):
                row = run_case(bootstrap, pids, rate, chunk, acks, args.seconds,
                               args.partitions)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
