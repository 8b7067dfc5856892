"""Today's standing: Strata beside Apache Kafka on this machine, in one run.

    python -m strata_tools.perf_standing [--rounds 2] [--markdown FILE] [--json FILE]
    (``scripts/bench.sh standing``; ``make bench`` runs it last)

Starts a three-broker Strata stack (``strata up --brokers 3 --no-tier``) and a
three-node Apache Kafka 4.1 cluster (``strata_tools.kafka_local``, KRaft, jars from Maven
Central) side by side on free ports in temp dirs, then runs each case on Strata, then on
Kafka, then the next case, and the whole list ``--rounds`` times (A, B, A, B: this
machine's speed drifts during a run, so the two systems are measured close together).
Each system is driven by its own tool, which is what its users run: ``strata perf
produce|consume`` (the Python client's columnar path) and Kafka's ProducerPerformance /
ConsumerPerformance (the Java client). Kafka's producer is given Strata's perf defaults
(``linger.ms=5``, ``batch.size=524288``) so both batch alike.

Cases (8 partitions each): produce 100-byte records at full speed with acks=1 (RF 1)
and with acks=all (RF 3, min ISR 2); consume 100-byte records; produce 1 KiB records
acks=all RF 3 idempotent, and the same in transactions committed every 100 ms; produce
at a fixed 100,000 records/s (rate reached and p99 acknowledgement latency). The table
gives the median over the rounds and Strata's ratio (higher is better for Strata; for
latency the ratio is Kafka's / Strata's). Both stacks are stopped at the end (only the
PIDs they started).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PARTITIONS", "PERF_LINE", "Stacks", "kafka_tool", "machine", "main", "strata_cli"]

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
PARTITIONS = 8


def _free_base(offsets: Sequence[int]) -> int:
    import random

    while True:
        base = random.randrange(30000, 60000)
        ok = True
        for off in offsets:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + off))
                except OSError:
                    ok = False
                    break
        if ok:
            return base


def _run(command: list[str], timeout: float = 900) -> str:
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def _strata(*args: str, timeout: float = 900) -> str:
    return _run([PY, "-m", "strata_tools.cli", *args], timeout)


def _kafka(*args: str, timeout: float = 900) -> str:
    return _run([PY, "-m", "strata_tools.kafka_local", *args], timeout)


def strata_cli(*args: str, timeout: float = 900) -> str:
    """Run the ``strata`` command; its stdout (raises with its output if it failed)."""
    return _strata(*args, timeout=timeout)


def kafka_tool(cls: str, *args: str, timeout: float = 900) -> str:
    """Run one of Kafka's tools classes (``strata_tools.kafka_local tool``)."""
    return _kafka("tool", cls, *args, timeout=timeout)


# ----------------------------------------------------------------------------- stacks


class Stacks:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="strata-standing."))
        self.strata_dir = self.dir / "strata"
        self.kafka_dir = self.dir / "kafka"
        self.strata = ""
        self.kafka = ""

    def up(self) -> None:
        base = _free_base([0, 9, 10, 11, 12, 40, 41, 42, 70, 80, 81, 82])
        report = json.loads(_strata("up", "--data-dir", str(self.strata_dir), "--brokers", "3",
                                    "--no-tier", "--base-port", str(base), "--format", "json"))
        self.strata = report.get("bootstrap") or ",".join(
            f"127.0.0.1:{base + 10 + i}" for i in range(3))
        self.kafka = _kafka("up", "--brokers", "3", "--data-dir", str(self.kafka_dir)).strip()
        for name, rf, configs in (("s-rf1", 1, []), ("s-rf3", 3, ["min.insync.replicas=2"]),
                                  ("s-txn", 3, ["min.insync.replicas=2"])):
            _strata("topic", "create", name, "-p", str(PARTITIONS), "-r", str(rf),
                    *[x for c in configs for x in ("-c", c)], "--bootstrap", self.strata)
            _kafka("tool", "org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                   self.kafka, "--create", "--topic", name, "--partitions", str(PARTITIONS),
                   "--replication-factor", str(rf),
                   *[x for c in configs for x in ("--config", c)])

    def down(self) -> None:
        stops: list[tuple[Callable[..., str], Path]] = [(_strata, self.strata_dir),
                                                        (_kafka, self.kafka_dir)]
        for stop, directory in stops:
            try:
                stop("down", "--data-dir", str(directory))
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                print(f"stopping a stack: {err}", file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


# ----------------------------------------------------------------------------- cases

_KAFKA_PRODUCER = ["linger.ms=5", "batch.size=524288"]
PERF_LINE = re.compile(
    r"(?P<n>\d+) records sent, (?P<rate>[\d.]+) records/sec \((?P<mb>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th")


def _kafka_produce(stacks: Stacks, topic: str, n: int, size: int, acks: str,
                   throughput: int = -1, txn: str | None = None) -> dict[str, float]:
    args = ["tool", "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
            "--num-records", str(n), "--record-size", str(size), "--throughput",
            str(throughput), "--producer-props", f"bootstrap.servers={stacks.kafka}",
            f"acks={acks}", *_KAFKA_PRODUCER]
    if txn is not None:
        args += ["--transactional-id", txn, "--transaction-duration-ms", "100"]
    out = _kafka(*args)
    found = list(PERF_LINE.finditer(out))
    if not found:
        raise RuntimeError(f"ProducerPerformance printed no summary:\n{out[-2000:]}")
    m = found[-1]
    return {"rate": float(m["rate"]), "p99_ms": float(m["p99"]), "p50_ms": float(m["p50"])}


def _strata_produce(stacks: Stacks, topic: str, n: int, size: int, acks: str,
                    throughput: int = -1, txn: str | None = None) -> dict[str, float]:
    args = ["perf", "produce", "--bootstrap", stacks.strata, "--topic", topic,
            "--num-records", str(n), "--record-size", str(size), "--acks", acks,
            "--format", "json"]
    if throughput > 0:
        args += ["--throughput", str(throughput), "--chunk-records", "100", "--linger-ms", "1"]
    if txn is not None:
        args += ["--transactional-id", txn, "--transaction-duration-ms", "100"]
    result = json.loads(_strata(*args))
    return {"rate": float(result["records_per_sec"]),
            "p99_ms": float(result["latency_ms"]["p99"]),
            "p50_ms": float(result["latency_ms"]["p50"])}


def _kafka_consume(stacks: Stacks, topic: str, n: int) -> dict[str, float]:
    out = _kafka("tool", "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server",
                 stacks.kafka, "--topic", topic, "--messages", str(n), "--timeout", "60000")
    lines = [line for line in out.splitlines() if line.strip()]
    header = [h.strip() for h in lines[-2].split(",")]
    values = [v.strip() for v in lines[-1].split(",")]
    row = dict(zip(header, values, strict=False))
    # fetch.nMsg.sec: from the first record on (the group join before it is left out, as
    # Strata's figure starts at its first record too).
    return {"rate": float(row.get("fetch.nMsg.sec") or row["nMsg.sec"])}


def _strata_consume(stacks: Stacks, topic: str, n: int) -> dict[str, float]:
    result = json.loads(_strata("perf", "consume", "--bootstrap", stacks.strata, "--topic",
                                topic, "--num-records", str(n), "--format", "json"))
    return {"rate": float(result["records_per_sec"])}


@dataclass(frozen=True)
class Case:
    """One measurement per system and round; ``rows`` are the table lines it gives:
    (label, figure key, unit, lower is better)."""

    name: str
    strata: Callable[[Stacks, int], dict[str, float]]
    kafka: Callable[[Stacks, int], dict[str, float]]
    rows: tuple[tuple[str, str, str, bool], ...] = ()

    def lines(self) -> tuple[tuple[str, str, str, bool], ...]:
        return self.rows or ((self.name, "rate", "records/s", False),)


def cases(scale: float) -> list[Case]:
    def n(count: int) -> int:
        return max(1000, int(count * scale))

    def p(system: str, topic: str, count: int, size: int, acks: str, *, throughput: int = -1,
          txn: bool = False) -> Callable[[Stacks, int], dict[str, float]]:
        def run(stacks: Stacks, round_: int) -> dict[str, float]:
            fn = _strata_produce if system == "strata" else _kafka_produce
            txn_id = f"standing-{system}-{round_}-{time.time_ns()}" if txn else None
            return fn(stacks, topic, n(count), size, acks, throughput, txn_id)
        return run

    def c(system: str, topic: str, count: int) -> Callable[[Stacks, int], dict[str, float]]:
        def run(stacks: Stacks, round_: int) -> dict[str, float]:
            fn = _strata_consume if system == "strata" else _kafka_consume
            return fn(stacks, topic, n(count))
        return run

    return [
        Case("produce 100 B, acks=1, RF 1",
             p("strata", "s-rf1", 3_000_000, 100, "1"), p("kafka", "s-rf1", 3_000_000, 100, "1")),
        Case("produce 100 B, acks=all, RF 3",
             p("strata", "s-rf3", 2_000_000, 100, "all"),
             p("kafka", "s-rf3", 2_000_000, 100, "all")),
        Case("consume 100 B (the acks=1 topic, from the start)",
             c("strata", "s-rf1", 3_000_000), c("kafka", "s-rf1", 3_000_000)),
        Case("produce 1 KiB, acks=all, RF 3, idempotent",
             p("strata", "s-txn", 300_000, 1024, "all"), p("kafka", "s-txn", 300_000, 1024, "all")),
        Case("same, in transactions committed every 100 ms",
             p("strata", "s-txn", 300_000, 1024, "all", txn=True),
             p("kafka", "s-txn", 300_000, 1024, "all", txn=True)),
        Case("fixed 100,000 records/s",
             p("strata", "s-rf1", 1_000_000, 100, "1", throughput=100_000),
             p("kafka", "s-rf1", 1_000_000, 100, "1", throughput=100_000),
             rows=(("produce at a fixed 100,000 records/s, 100 B, acks=1: rate reached",
                    "rate", "records/s", False),
                   ("same: p99 acknowledgement latency", "p99_ms", "ms", True))),
    ]


# ----------------------------------------------------------------------------- report


def machine() -> str:
    """One line describing this machine (CPUs, memory, kernel, Python)."""
    cpus = os.cpu_count()
    mem = ""
    try:
        kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1048576:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{cpus} CPUs{mem}, Linux {platform.release()}, Python {platform.python_version()}"


def markdown(results: dict[str, dict[str, list[dict[str, float]]]], rounds: int,
             case_list: list[Case], started: str) -> str:
    lines = [
        f"Measured {started} UTC on {machine()}; `python -m strata_tools.perf_standing "
        f"--rounds {rounds}` (`scripts/bench.sh standing`): each case on Strata then on "
        "Apache Kafka 4.1.2, A, B, A, B; the median of the rounds. Strata: 3 brokers, "
        "`strata perf` (Python client); Kafka: 3 KRaft nodes, ProducerPerformance / "
        "ConsumerPerformance (Java client); 8 partitions.",
        "",
        "| case | Strata | Apache Kafka | Strata / Kafka |",
        "|---|---:|---:|---:|",
    ]
    for case in case_list:
        for label, key, unit, lower_is_better in case.lines():
            s = statistics.median(f[key] for f in results[case.name]["strata"])
            k = statistics.median(f[key] for f in results[case.name]["kafka"])
            ratio = (k / s if lower_is_better else s / k) if s and k else float("nan")
            fmt = "{:,.0f}" if unit == "records/s" else "{:,.1f}"
            lines.append(f"| {label} ({unit}) | {fmt.format(s)} | {fmt.format(k)} | "
                         f"{ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_standing",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every record count (0.1 for a quick look)")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the cases whose name contains TEXT (repeatable), "
                        "e.g. to measure one case again after a change")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    case_list = [c for c in cases(args.scale)
                 if not args.only or any(text in c.name for text in args.only)]
    if not case_list:
        parser.error(f"--only {args.only}: no case matches; the cases are: "
                     + "; ".join(c.name for c in cases(args.scale)))
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        c.name: {"strata": [], "kafka": []} for c in case_list}
    stacks = Stacks()
    try:
        stacks.up()
        print(f"strata {stacks.strata}; kafka {stacks.kafka}", flush=True)
        for round_ in range(args.rounds):
            for case in case_list:
                for system in ("strata", "kafka"):
                    run = case.strata if system == "strata" else case.kafka
                    figures: dict[str, Any] = run(stacks, round_)
                    results[case.name][system].append(figures)
                    print(f"round {round_ + 1} {system:6} {case.name}: {figures}", flush=True)
    finally:
        stacks.down()
    table = markdown(results, args.rounds, case_list, started)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"started": started, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
