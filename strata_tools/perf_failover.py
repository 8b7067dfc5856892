"""``strata perf failover``: how long a partition cannot take acks=all writes after its
leader is SIGKILLed.

Runs against a stack started with ``strata up --brokers N`` (the data dir names the
processes that may be killed: only a broker PID recorded in its ``stack.json`` and still
running the command the stack started is ever signalled). Each of ``--kills`` rounds:

1. waits until every partition of ``--topic`` has a leader and a full ISR (read from
   ZooKeeper, the cluster's truth) and every broker of the stack is registered;
2. takes the leader of partition ``round % partitions`` (or ``--partition``), notes every
   partition that broker leads, and writes one acks=all record to every partition (so
   the probe producer's metadata and connections are current);
3. SIGKILLs that broker and, from that instant, writes one record at a time to every
   partition with acks=all until each is acknowledged (a failed attempt is retried
   after 50 ms by a new send; the producer itself does not retry, so its backoff does
   not pad the figure);
4. restarts it with ``strata up --data-dir D`` (which starts the missing service; the
   restarted broker inherits this command's environment, so ``STRATA_*`` broker
   overrides given to ``strata up`` must be exported here too) and goes on with 1.

Figures per kill, all in seconds after the SIGKILL: ``recovered`` (the headline: every
partition the victim led has acknowledged a write), ``first_ack`` (the first of them
did), ``other_partitions`` (every partition it did not lead, where it was a follower in
the ISR, has acknowledged a write), and two ZooKeeper events watched on the side:
``registration_gone`` (the victim's ephemeral registration vanished: its session
expired) and ``new_leader`` (the controller wrote a new leader for the probed
partition). The summary gives p50/p99/max over the kills (nearest rank: with 20 kills
p99 is the largest).

Only client requests, the ``strata up`` command and ZooKeeper reads are used; nothing
of the broker's internals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strata_tools.perf_zookeeper import ROOT, ZooKeeperView

__all__ = ["FailoverError", "FailoverResult", "KillResult", "add_failover_arguments",
           "bench_failover", "run_failover"]

_PROBE_PAUSE_S = 0.05


class FailoverError(RuntimeError):
    """The benchmark could not run or a round did not finish within its timeout."""


@dataclass(frozen=True, slots=True)
class KillResult:
    kill: int
    partition: int  # the partition whose leader was chosen
    victim: int  # broker id killed
    pid: int
    was_controller: bool
    led: tuple[int, ...]  # partitions the victim led when it was killed
    recovered_s: float  # every partition in ``led`` acknowledged a write
    first_ack_s: float  # the first partition in ``led`` did
    other_partitions_s: float | None  # every other partition did (None: there were none)
    registration_gone_s: float | None  # victim's /strata/brokers/ids/<id> vanished
    new_leader_s: float | None  # state znode of ``partition`` named another leader
    new_leader: int | None
    restart_s: float  # `strata up` returned
    isr_full_s: float  # after the restart: every partition has its full ISR again


@dataclass(frozen=True, slots=True)
class FailoverResult:
    topic: str
    partitions: int
    kills: list[KillResult] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, float]]:
        """p50/p99/max (nearest rank) of every per-kill figure that was measured."""
        out: dict[str, dict[str, float]] = {}
        for name in ("recovered_s", "first_ack_s", "other_partitions_s",
                     "registration_gone_s", "new_leader_s", "restart_s", "isr_full_s"):
            values = [v for k in self.kills if (v := getattr(k, name)) is not None]
            if values:
                out[name] = {"p50": _pct(values, 0.50), "p99": _pct(values, 0.99),
                             "max": round(max(values), 3), "n": len(values)}
        return out

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partitions": self.partitions,
                "summary": self.summary(), "kills": [asdict(k) for k in self.kills]}


def _pct(values: Sequence[float], q: float) -> float:
    """Nearest rank, as ``strata perf produce`` computes its latency percentiles."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


# -- the stack and ZooKeeper ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StackView:
    bootstrap: str
    zookeeper: str
    brokers: dict[int, tuple[int, str]]  # broker id -> (pid, marker) of live brokers


def _stack_view(data_dir: Path) -> _StackView:
    """Bootstrap, ZooKeeper and the live broker PIDs recorded in the stack's data dir."""
    from strata_tools.stack import Stack

    stack = Stack(data_dir)
    status = stack.status()
    if not status.processes:
        raise FailoverError(f"no Strata stack recorded in {stack.data_dir}; start one with "
                            "`strata up --brokers 3 --data-dir ...`")
    brokers: dict[int, tuple[int, str]] = {}
    for p in status.processes:
        name = p.record.name
        if name.startswith("broker-") and name[len("broker-"):].isdigit() \
                and p.state in ("started", "running"):
            brokers[int(name[len("broker-"):])] = (p.record.pid, p.record.marker)
    endpoints = status.endpoints()
    return _StackView(endpoints["bootstrap"] or "", endpoints["zookeeper"] or "", brokers)


def _restart(data_dir: Path, timeout: float) -> None:
    """``strata up --data-dir D``: starts what is missing (the killed broker)."""
    command = [sys.executable, "-m", "strata_tools.cli", "up", "--data-dir", str(data_dir)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FailoverError(f"`strata up --data-dir {data_dir}` did not finish within "
                            f"{timeout:.0f} s") from None
    if done.returncode != 0:
        raise FailoverError(f"`strata up --data-dir {data_dir}` failed "
                            f"(exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def _sigkill(pid: int, marker: str) -> None:
    """SIGKILL ``pid`` if it still runs the command the stack recorded; wait until gone."""
    from procs import cmdline, pid_alive

    line = cmdline(pid)
    if not pid_alive(pid) or line is None or marker not in line:
        raise FailoverError(f"pid {pid} is not the broker the stack recorded any more")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise FailoverError(f"pid {pid} survived SIGKILL for 10 s")
        time.sleep(0.01)


class _ZooKeeper(ZooKeeperView):
    """The shared view (``perf_zookeeper``), with this benchmark's questions."""

    def __init__(self, hosts: str) -> None:
        super().__init__(hosts, timeout=15)

    def assignment(self, topic: str) -> dict[int, list[int]]:
        value = self.replicas([topic])[topic]
        if value is None:
            raise FailoverError(f"topic {topic!r} does not exist; create it first, e.g. "
                                f"`strata topic create {topic} -p 8 -r 3 "
                                "-c min.insync.replicas=2`")
        return value

    def state(self, topic: str, partition: int) -> tuple[int, list[int]]:
        """(leader, isr) of one partition."""
        return self.states([(topic, partition)])[(topic, partition)]

    def wait_healthy(self, topic: str, assignment: dict[int, list[int]],
                     brokers: set[int], timeout: float) -> None:
        """Every broker registered; every partition led, with its full ISR."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            live = self.live_brokers()
            problems = [f"brokers {sorted(brokers - live)} not registered"] \
                if not brokers <= live else []
            for p, replicas in assignment.items():
                leader, isr = self.state(topic, p)
                if leader < 0 or leader not in live or set(isr) != set(replicas):
                    problems.append(f"{topic}-{p}: leader {leader}, isr {isr}, "
                                    f"replicas {replicas}")
            if not problems:
                return
            last = "; ".join(problems[:4])
            if time.monotonic() > deadline:
                raise FailoverError(f"the cluster did not become healthy (every broker up, "
                                    f"every ISR full) within {timeout:.0f} s: {last}")
            time.sleep(0.1)


# -- the benchmark --------------------------------------------------------------------


async def _first_ack(producer: Any, topic: str, partition: int, payload: bytes,
                     start: float, deadline: float) -> float:
    """Seconds from ``start`` until a write to ``partition`` is acknowledged."""
    last: BaseException | None = None
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise FailoverError(f"{topic}-{partition}: no acknowledged write within the "
                                f"timeout; last error: {last!r}")
        try:
            future = await asyncio.wait_for(
                producer.send(topic, payload, partition=partition), remaining)
            await asyncio.wait_for(future, remaining)
            return time.perf_counter() - start
        except TimeoutError as err:
            last = err
        except Exception as err:  # every failed attempt is retried with a new send
            last = err
            await asyncio.sleep(_PROBE_PAUSE_S)


async def _round(producer: Any, zk: _ZooKeeper, data_dir: Path, topic: str,
                 assignment: dict[int, list[int]], kill: int, partition: int,
                 timeout: float, isr_timeout: float, payload: bytes,
                 log: Callable[[str], None]) -> KillResult:
    view = _stack_view(data_dir)
    zk.wait_healthy(topic, assignment, set(view.brokers), isr_timeout)
    states = {p: zk.state(topic, p) for p in assignment}
    victim = states[partition][0]
    if victim not in view.brokers:
        raise FailoverError(f"broker {victim} leads {topic}-{partition} but is not a "
                            f"running process of the stack in {data_dir}")
    pid, marker = view.brokers[victim]
    led = tuple(p for p, (leader, _) in states.items() if leader == victim)
    others = tuple(p for p in assignment if p not in led)
    was_controller = zk.controller() == victim
    # Every partition takes a write first: metadata and connections are current.
    warm_deadline = time.perf_counter() + timeout
    await asyncio.gather(*(_first_ack(producer, topic, p, payload, time.perf_counter(),
                                      warm_deadline) for p in assignment))

    events: dict[str, float] = {}
    leader_after: list[int] = []

    def gone() -> None:
        events.setdefault("registration_gone", time.perf_counter())

    def elected(leader: int) -> None:
        events.setdefault("new_leader", time.perf_counter())
        leader_after.append(leader)

    zk.on_gone(f"{ROOT}/brokers/ids/{victim}", gone)
    zk.on_leader_change(topic, partition, victim, elected)

    start = time.perf_counter()
    await asyncio.to_thread(_sigkill, pid, marker)
    deadline = start + timeout
    restarted = False
    try:
        # Every partition is probed from the kill on, all at once.
        times = await asyncio.gather(
            *(_first_ack(producer, topic, p, payload, start, deadline) for p in led + others))
        led_times, other_times = times[:len(led)], times[len(led):]
        restart_began = time.perf_counter()
        await asyncio.to_thread(_restart, data_dir, 180.0)
        restarted = True
        restart_s = time.perf_counter() - restart_began
    finally:
        if not restarted:  # leave the stack as it was found, whatever went wrong
            await asyncio.to_thread(_restart_quietly, data_dir)
    isr_began = time.perf_counter()
    zk.wait_healthy(topic, assignment, set(view.brokers), isr_timeout)
    isr_full_s = time.perf_counter() - isr_began

    def since(name: str) -> float | None:
        return round(events[name] - start, 3) if name in events else None

    result = KillResult(
        kill=kill, partition=partition, victim=victim, pid=pid, was_controller=was_controller,
        led=led, recovered_s=round(max(led_times), 3), first_ack_s=round(min(led_times), 3),
        other_partitions_s=round(max(other_times), 3) if other_times else None,
        registration_gone_s=since("registration_gone"), new_leader_s=since("new_leader"),
        new_leader=leader_after[0] if leader_after else None,
        restart_s=round(restart_s, 3), isr_full_s=round(isr_full_s, 3))
    log(_describe(result))
    return result


def _restart_quietly(data_dir: Path) -> None:
    try:
        _restart(data_dir, 180.0)
    except FailoverError as err:
        print(f"strata perf failover: restarting the killed broker failed: {err}",
              file=sys.stderr)


def _describe(k: KillResult) -> str:
    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    role = " (controller)" if k.was_controller else ""
    return (f"kill {k.kill:>2}: broker {k.victim}{role} led {list(k.led)}: "
            f"registration gone {s(k.registration_gone_s)}, new leader of p{k.partition} "
            f"{s(k.new_leader_s)}, first ack {s(k.first_ack_s)}, all its partitions "
            f"{s(k.recovered_s)}, other partitions {s(k.other_partitions_s)}; "
            f"restart {s(k.restart_s)}, ISR full {s(k.isr_full_s)}")


def bench_failover(data_dir: str | os.PathLike[str], topic: str, kills: int = 20, *,
                   partition: int | None = None, bootstrap: str | None = None,
                   zookeeper: str | None = None, timeout: float = 120.0,
                   isr_timeout: float = 120.0,
                   log: Callable[[str], None] = lambda _line: None) -> FailoverResult:
    """Kill the leader ``kills`` times; see the module docstring."""
    return asyncio.run(_bench(Path(data_dir), topic, kills, partition, bootstrap, zookeeper,
                              timeout, isr_timeout, log))


async def _bench(data_dir: Path, topic: str, kills: int, partition: int | None,
                 bootstrap: str | None, zookeeper: str | None, timeout: float,
                 isr_timeout: float, log: Callable[[str], None]) -> FailoverResult:
    from strata.client import AsyncProducer

    view = _stack_view(data_dir)
    if len(view.brokers) < 2:
        raise FailoverError(f"the stack in {data_dir} runs {len(view.brokers)} broker(s); "
                            "failover needs at least 2 (`strata up --brokers 3`)")
    zk = await asyncio.to_thread(_ZooKeeper, zookeeper or view.zookeeper)
    # Every failed probe is expected (the leader is dead); the producer's warning per
    # failed record would bury the figures.
    producer_log = logging.getLogger("strata.client.producer")
    level = producer_log.level
    producer_log.setLevel(logging.ERROR)
    try:
        assignment = zk.assignment(topic)
        if min(len(r) for r in assignment.values()) < 2:
            raise FailoverError(f"topic {topic!r} has a partition with one replica: nothing "
                                "to fail over to (create it with -r 3)")
        if partition is not None and partition not in assignment:
            raise FailoverError(f"topic {topic!r} has no partition {partition}")
        result = FailoverResult(topic, len(assignment))
        # One record per send, sent at once; no producer retries (the probe loop retries
        # with a new send every 50 ms), so the producer's backoff is not in the figure.
        async with AsyncProducer(bootstrap or view.bootstrap, acks="all", retries=0,
                                 linger_ms=0, retry_backoff_ms=50, request_timeout_ms=5_000,
                                 delivery_timeout_ms=10_000,
                                 client_id="strata-perf-failover") as producer:
            for kill in range(1, kills + 1):
                chosen = partition if partition is not None else \
                    sorted(assignment)[(kill - 1) % len(assignment)]
                result.kills.append(await _round(
                    producer, zk, data_dir, topic, assignment, kill, chosen, timeout,
                    isr_timeout, b"x" * 100, log))
        return result
    finally:
        producer_log.setLevel(level)
        await asyncio.to_thread(zk.close)


# -- command line ---------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_failover_arguments(parser: argparse.ArgumentParser) -> None:
    from strata_tools.stack import DEFAULT_DATA_DIR

    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="the stack's data dir: its stack.json names the broker processes "
                        f"that may be killed (default: {DEFAULT_DATA_DIR})")
    parser.add_argument("--topic", required=True,
                        help="an existing topic with replication factor >= 2")
    parser.add_argument("--kills", type=_positive, default=20)
    parser.add_argument("--partition", type=int, default=None,
                        help="always kill this partition's leader (default: partition "
                        "round %% partitions)")
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: the stack's)")
    parser.add_argument("--zookeeper", default=None, metavar="HOST:PORT[,...]",
                        help="ZooKeeper connect string (default: the stack's)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a round may wait for its acknowledged writes")
    parser.add_argument("--isr-timeout", type=float, default=120.0,
                        help="seconds to wait for a full ISR before and after each kill")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def run_failover(args: argparse.Namespace) -> int:
    text = args.format == "text"
    try:
        result = bench_failover(args.data_dir, args.topic, args.kills,
                                partition=args.partition, bootstrap=args.bootstrap,
                                zookeeper=args.zookeeper, timeout=args.timeout,
                                isr_timeout=args.isr_timeout,
                                log=(lambda line: print(line, flush=True)) if text
                                else (lambda _line: None))
    except FailoverError as err:
        print(f"strata perf failover: {err}", file=sys.stderr)
        return 1
    if not text:
        print(json.dumps(result.to_json()))
        return 0
    summary = result.summary()
    names = {"recovered_s": "SIGKILL -> every partition it led acknowledged an acks=all "
                            "write",
             "first_ack_s": "SIGKILL -> first of its partitions acknowledged",
             "other_partitions_s": "SIGKILL -> every partition it followed acknowledged",
             "registration_gone_s": "SIGKILL -> its ZooKeeper registration vanished",
             "new_leader_s": "SIGKILL -> new leader written to ZooKeeper",
             "restart_s": "restart (strata up)", "isr_full_s": "restart -> every ISR full"}
    print(f"failover: {len(result.kills)} leader kills, topic {result.topic} "
          f"({result.partitions} partitions), seconds p50 / p99 / max:")
    for name, label in names.items():
        if name in summary:
            row = summary[name]
            print(f"  {label}: {row['p50']:.2f} / {row['p99']:.2f} / {row['max']:.2f}")
    return 0
