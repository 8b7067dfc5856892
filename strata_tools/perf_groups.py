"""``strata perf group``: consumer group rebalance pauses and group consume throughput.

Every consumer is a process of its own (``python -m strata_tools.perf_groups worker``), as in
production: a member is its own interpreter, so one member's GIL never delays another's
heartbeats. A worker subscribes with the real ``strata.client.Consumer``, commits after
each poll (at-least-once) and reports what happens as JSON lines on stdout::

    {"ev": "subscribe", "t": <unix s>}                 (just before Consumer.subscribe)
    {"ev": "assign" | "revoke" | "lost", "t": <unix s>, "tps": [[topic, p], ...]}
    {"ev": "records", "t": <unix s>, "ranges": [[topic, p, first, last, count], ...]}
    {"ev": "commit-result", "error": <code or null>, "message": ...}   (stdin "commit T P O")
    {"ev": "stall", "t": ..., "s": S} / {"ev": "stalled", "t": ...}   (stdin "stall S": the
        application is stuck for S seconds after its next poll that returned records,
        before it commits them, while its heartbeats go on)
    {"ev": "closed", "t": ...}

The consumer-group tests (tests/test_consumer_groups.py) drive the same workers (kill -9,
SIGSTOP), so what the benchmark measures and what the tests prove run the same code.

Rebalance (``--phase rebalance``): ``--consumers`` workers share a ``--partitions`` topic
while a producer writes ``--rate`` records/s spread over every partition. Once the group
is stable, one more worker joins. Reported per assignor: ``first_record_s`` (from the
new member's ``subscribe`` call, after its interpreter started, until its first
record), ``moved`` (partitions that changed owner), and over the partitions that kept
their owner: ``revoked`` (how many were revoked at all) and
``max_pause_s`` (longest time one of them was not owned by anyone: revoke to re-assign;
0 when none was revoked). ``max_gap_s`` is the longest time between two deliveries of an
unmoved partition in the 10 s after the join, next to ``baseline_gap_s``, the same before
the join (the poll cadence at that record rate).

Throughput (``--phase throughput``): ``--records`` 100-byte records are written first,
then a group of 1 and a group of ``--consumers`` read them from the earliest offset;
records/s is records over the time from the first record any worker reported until
the workers together reported every record (``startup_s``, process start to the first
record, is reported beside it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = ["Worker", "add_group_arguments", "run_group", "worker_main"]


# ----------------------------------------------------------------------------- worker


def _emit(out: TextIO, lock: threading.Lock, event: dict[str, Any]) -> None:
    with lock:
        out.write(json.dumps(event) + "\n")
        out.flush()


def worker_main(argv: Sequence[str] | None = None) -> int:
    """One group member: subscribe, poll, commit after each poll, report on stdout."""
    from strata.client import Consumer, StrataError, TopicPartition

    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_groups worker")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True, action="append")
    parser.add_argument("--assignor", default="cooperative-sticky")
    parser.add_argument("--session-timeout-ms", type=int, default=-1)
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--process-ms", type=float, default=0.0,
                        help="pretend each poll takes this long to process")
    parser.add_argument("--no-commit", action="store_true")
    parser.add_argument("--max-poll-interval-ms", type=int, default=300_000)
    args = parser.parse_args(argv)
    out, lock = sys.stdout, threading.Lock()

    def tps(partitions: Any) -> list[list[Any]]:
        return sorted([tp.topic, tp.partition] for tp in partitions)

    consumer = Consumer(args.bootstrap, group_id=args.group, assignor=args.assignor,
                        session_timeout_ms=args.session_timeout_ms,
                        group_instance_id=args.instance_id, auto_offset_reset="earliest",
                        max_poll_interval_ms=args.max_poll_interval_ms,
                        enable_auto_commit=False, client_id=f"perf-{os.getpid()}")
    stall_s = 0.0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    commands: list[str] = []

    def read_stdin() -> None:
        for line in sys.stdin:
            with lock:
                commands.append(line.strip())

    threading.Thread(target=read_stdin, daemon=True).start()

    def revoked(partitions: Any) -> None:
        if not args.no_commit:
            try:
                consumer.commit()
            except StrataError as err:
                _emit(out, lock, {"ev": "commit-failed", "t": time.time(), "error": err.code})
        _emit(out, lock, {"ev": "revoke", "t": time.time(), "tps": tps(partitions)})

    _emit(out, lock, {"ev": "subscribe", "t": time.time()})
    consumer.subscribe(args.topic,
                       on_assign=lambda p: _emit(out, lock, {
                           "ev": "assign", "t": time.time(), "tps": tps(p),
                           "member": consumer.member_id}),
                       on_revoke=revoked,
                       on_lost=lambda p: _emit(out, lock, {"ev": "lost", "t": time.time(),
                                                            "tps": tps(p)}))
    try:
        while not stop.is_set():
            records = consumer.poll(timeout_ms=100)
            if records:
                ranges: dict[tuple[str, int], list[int]] = {}
                for r in records:
                    span = ranges.setdefault((r.topic, r.partition), [r.offset, r.offset, 0])
                    span[1] = r.offset
                    span[2] += 1
                _emit(out, lock, {"ev": "records", "t": time.time(),
                                  "ranges": [[t, p, *span] for (t, p), span in ranges.items()]})
                if args.process_ms:
                    time.sleep(args.process_ms / 1000)
                if stall_s:
                    _emit(out, lock, {"ev": "stall", "t": time.time(), "s": stall_s})
                    time.sleep(stall_s)
                    stall_s = 0.0
                    _emit(out, lock, {"ev": "stalled", "t": time.time()})
                if not args.no_commit:
                    try:
                        consumer.commit()
                    except StrataError as err:
                        _emit(out, lock, {"ev": "commit-failed", "t": time.time(),
                                          "error": err.code, "message": err.message})
            with lock:
                pending, commands[:] = list(commands), []
            for command in pending:
                parts = command.split()
                if len(parts) == 2 and parts[0] == "stall":
                    stall_s = float(parts[1])
                if len(parts) == 4 and parts[0] == "commit":
                    try:
                        consumer.commit({TopicPartition(parts[1], int(parts[2])): int(parts[3])})
                        _emit(out, lock, {"ev": "commit-result", "error": None})
                    except StrataError as err:
                        _emit(out, lock, {"ev": "commit-result", "error": err.code,
                                          "name": err.name, "message": err.message})
    finally:
        consumer.close()
        _emit(out, lock, {"ev": "closed", "t": time.time()})
    return 0


@dataclass
class Worker:
    """A worker process started by a benchmark or a test, and what it reported so far."""

    args: list[str]
    process: subprocess.Popen[str] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: float = 0.0

    def start(self) -> Worker:
        self.started = time.time()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "strata_tools.perf_groups", "worker", *self.args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append(event)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)

    def owned(self) -> set[tuple[str, int]]:
        owned: set[tuple[str, int]] = set()
        for event in self.snapshot():
            if event["ev"] == "assign":
                owned |= {(t, p) for t, p in event["tps"]}
            elif event["ev"] in ("revoke", "lost"):
                owned -= {(t, p) for t, p in event["tps"]}
        return owned

    def records(self) -> int:
        return sum(r[4] for e in self.snapshot() if e["ev"] == "records" for r in e["ranges"])

    def send(self, line: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the worker leaves the group cleanly), SIGKILL if it does not exit."""
        if self.process is None or self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


# ----------------------------------------------------------------------------- benchmark


@dataclass
class RebalanceResult:
    assignor: str
    partitions: int
    consumers_before: int
    first_record_s: float
    moved: int
    unmoved: int
    revoked: int
    max_pause_s: float
    max_gap_s: float
    baseline_gap_s: float


@dataclass
class ThroughputResult:
    consumers: int
    records: int
    startup_s: float  # worker start until the first record (process start, join, assign)
    seconds: float  # first record until the last
    records_per_sec: float


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _delivery_times(worker: Worker) -> dict[tuple[str, int], list[float]]:
    times: dict[tuple[str, int], list[float]] = {}
    for event in worker.snapshot():
        if event["ev"] == "records":
            for t, p, *_ in event["ranges"]:
                times.setdefault((t, p), []).append(event["t"])
    return times


def _max_gap(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    points = [start, *inside, end]
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def bench_rebalance(bootstrap: str, topic: str, partitions: int, consumers: int,
                    assignor: str, rate: int) -> RebalanceResult:
    from strata.client import Producer

    group = f"perf-{assignor}-{uuid.uuid4().hex[:8]}"
    args = ["--bootstrap", bootstrap, "--group", group, "--topic", topic,
            "--assignor", assignor]
    workers = [Worker(args).start() for _ in range(consumers)]
    producer = Producer(bootstrap, acks=1, linger_ms=5)
    stop = threading.Event()

    def produce() -> None:
        tick = 0.01
        per_tick = max(rate * tick / partitions, 1)
        carry = 0.0
        while not stop.is_set():
            carry += per_tick
            n = int(carry)
            carry -= n
            for p in range(partitions):
                for _ in range(n):
                    producer.send(topic, b"x" * 100, partition=p)
            time.sleep(tick)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    everything = {(topic, p) for p in range(partitions)}
    try:
        _wait(lambda: set().union(*(w.owned() for w in workers)) == everything
              and sum(len(w.owned()) for w in workers) == partitions, 120,
              f"{consumers} consumers to own all {partitions} partitions")
        time.sleep(3.0)  # steady state before the join
        before = {w.pid: w.owned() for w in workers}
        t0 = time.time()
        newcomer = Worker(args).start()
        workers.append(newcomer)
        _wait(lambda: newcomer.records() > 0, 120, "the new member's first record")
        events = newcomer.snapshot()
        first = next(e["t"] for e in events if e["ev"] == "records") - \
            next(e["t"] for e in events if e["ev"] == "subscribe")
        _wait(lambda: sum(len(w.owned()) for w in workers) == partitions
              and set().union(*(w.owned() for w in workers)) == everything
              and all(w.owned() for w in workers), 120, "the group to settle")
        time.sleep(max(0.0, t0 + 10.0 - time.time()))
        unmoved = {(pid, tp) for pid, tps in before.items() for tp in tps
                   if tp in next(w for w in workers if w.pid == pid).owned()}
        revoked = 0
        max_pause = 0.0
        max_gap = 0.0
        baseline = 0.0
        for w in workers[:-1]:
            times = _delivery_times(w)
            events = w.snapshot()
            for pid, tp in unmoved:
                if pid != w.pid:
                    continue
                revokes = [e["t"] for e in events if e["ev"] == "revoke"
                           and list(tp) in e["tps"] and e["t"] >= t0]
                if revokes:
                    revoked += 1
                    back = [e["t"] for e in events if e["ev"] == "assign"
                            and list(tp) in e["tps"] and e["t"] >= revokes[0]]
                    max_pause = max(max_pause, (back[0] if back else time.time()) - revokes[0])
                max_gap = max(max_gap, _max_gap(times.get(tp, []), t0, t0 + 10.0))
                baseline = max(baseline, _max_gap(times.get(tp, []), t0 - 3.0, t0))
        return RebalanceResult(assignor, partitions, consumers, round(first, 3),
                               partitions - len(unmoved), len(unmoved), revoked,
                               round(max_pause, 3), round(max_gap, 3), round(baseline, 3))
    finally:
        stop.set()
        thread.join(5)
        for w in workers:
            w.stop()
        producer.close()


def bench_throughput(bootstrap: str, topic: str, consumers: int, records: int
                     ) -> ThroughputResult:
    group = f"perf-tput-{uuid.uuid4().hex[:8]}"
    args = ["--bootstrap", bootstrap, "--group", group, "--topic", topic]
    t0 = time.time()
    workers = [Worker(args).start() for _ in range(consumers)]
    try:
        _wait(lambda: sum(w.records() for w in workers) >= records, 600,
              f"{records} records read by {consumers} consumer(s)")
        times = [e["t"] for w in workers for e in w.snapshot() if e["ev"] == "records"]
        seconds = max(times) - min(times)
        return ThroughputResult(consumers, records, round(min(times) - t0, 3),
                                round(seconds, 3), round(records / seconds))
    finally:
        for w in workers:
            w.stop()


def add_group_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--phase", choices=["rebalance", "throughput", "all"], default="all")
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rate", type=int, default=3200,
                        help="records/s produced during the rebalance phase")
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records read in the throughput phase")
    parser.add_argument("--format", choices=["text", "json"], default="text")


def run_group(args: argparse.Namespace) -> int:
    from strata.client import Admin, NewTopic, Producer

    results: list[dict[str, Any]] = []
    suffix = uuid.uuid4().hex[:6]
    with Admin(args.bootstrap) as admin:
        if args.phase in ("rebalance", "all"):
            for assignor in ("cooperative-sticky", "range"):
                # A topic per assignor: the second group must not start on a backlog.
                topic = f"perf-rebalance-{assignor}-{suffix}"
                admin.create_topics([NewTopic(topic, args.partitions, 1)])
                result = bench_rebalance(args.bootstrap, topic, args.partitions,
                                         args.consumers, assignor, args.rate)
                results.append({"benchmark": "rebalance", **asdict(result)})
                _print(args.format, results[-1])
        if args.phase in ("throughput", "all"):
            topic = f"perf-group-read-{suffix}"
            admin.create_topics([NewTopic(topic, args.partitions, 1)])
            with Producer(args.bootstrap, acks=1, linger_ms=20) as producer:
                import pyarrow as pa

                chunk = 50_000
                value = pa.array([b"v" * 100] * chunk, pa.binary())
                for _ in range(args.records // chunk):
                    producer.send_batch(topic, value)
                producer.flush()
            for consumers in (1, args.consumers):
                read = bench_throughput(args.bootstrap, topic, consumers,
                                        args.records // chunk * chunk)
                results.append({"benchmark": "throughput", **asdict(read)})
                _print(args.format, results[-1])
    return 0


def _print(fmt: str, row: dict[str, Any]) -> None:
    if fmt == "json":
        print(json.dumps(row), flush=True)
    else:
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit("usage: python -m strata_tools.perf_groups worker ...")
