"""``strata perf scale``: what many partitions cost a three-broker cluster (docs/benchmarks.md,
"Scale: many partitions on three brokers").

Runs against a stack it starts itself (``strata up --data-dir D --base-port B --brokers
3 --no-tier`` on free ports, in a temp dir unless ``--data-dir`` names an empty one;
stopped with ``strata down`` at the end, the temp dir removed) or, when ``--data-dir``
holds a running stack, against that one (left running as found, with the topics this run
created deleted again). ``--partitions P`` partitions in total are spread over
``--topics T`` topics (RF 3, ``min.insync.replicas=2``) named ``scale-<run id>-<i>``.
Only processes recorded in the stack's ``stack.json`` are ever signalled, each after its
``/proc/<pid>/cmdline`` is checked for the marker the stack recorded. Every wait has a
timeout (``--timeout``) and fails naming what it waited for. ZooKeeper, the cluster's
truth, is read with kazoo's connection in multiRead requests of 500 znodes
(``brokers.coordination.read_znodes``; the layout is in ``brokers/coordination.py``). A partition is
*led* when its state names a leader registered under ``/strata/brokers/ids``; a poll
takes ``_POLL_S`` plus the time to read the znodes, so each time is late by at most that.

Every leadership figure comes twice: as ZooKeeper records it (``..._s``) and as clients
see it (``..._clients_s``): the leaders of a fresh Metadata answer from a broker
(``AsyncAdmin.describe_topics(offsets=False)``, the request every producer and consumer
makes), which lag ZooKeeper by the controller's propagation to the brokers. The
clients' figures are the user path of issue [3.4]; ``scripts/scale_user_path.sh`` prints
them as that issue's table.

Phases, in order (``--skip`` leaves any but the first out), and the JSON keys:

1. ``create_all_leaders_s``: create the T topics with ``Admin.create_topics``, 10 per
   request, one request after the other; time from the first request until every
   partition is led (``create_requests_s``: until the last request returned;
   ``create_all_led_clients_s``: until the clients' metadata names a leader for each).
2. ``produce``: first as a user writes: a new blocking ``Producer`` (acks=all, defaults
   otherwise) sends one 100-byte record to every new partition, then waits for the
   ``result()`` of each (``produce_one_each_user_s``, metadata lookups included). Then
   a fresh ``AsyncProducer`` (acks=all, idempotent, linger 5 ms) first looks up every
   topic (``produce_metadata_s``), then sends one more record to every partition,
   flushes and checks every acknowledgement (``produce_one_each_s``, from the first send
   to the last acknowledgement): the split of the user's figure.
3. ``controlled-shutdown``: once every ISR is full, a background ``AsyncProducer``
   (acks=all, client retries on, idempotent) writes ``--background-rate`` records/s
   round-robin over every partition; the non-controller broker that leads the most
   partitions is sent SIGTERM. ``controlled_shutdown_s``: until no partition it led
   names it as leader (``..._clients_s``: in the clients' metadata);
   ``controlled_shutdown_exit_s``: until its process is gone;
   ``controlled_shutdown_failed_requests``: records sent from the SIGTERM until the
   process exited whose ``send`` raised or whose future failed (after the client's
   retries, waited for to the end), out of ``controlled_shutdown_requests``. As soon as
   the clients see it lead nothing, ``strata up --data-dir D`` is run, as a rolling
   restart does, while the broker may still be closing: ``up`` waits for it to exit and
   starts it again (``controlled_shutdown_up_s``: the whole ``up`` call;
   ``controlled_shutdown_restart_s``: from the exit until ``up`` returned, that is until
   the new process answers). Then the run waits until it is registered and back in
   every ISR (``..._isr_full_s``, from ``up``'s return).
4. ``sigkill-controller``: once every ISR is full, the broker named by
   ``/strata/controller`` is SIGKILLed; ``sigkill_controller_s``: until every partition
   is led by a registered broker other than it (``sigkill_new_controller_s``: until
   ``/strata/controller`` names another broker; ``sigkill_controller_clients_s``: until
   the clients' metadata names another leader for every partition). Restarted (after it
   is gone) and waited for as in 3.
5. ``restart``: ``strata down`` then ``strata up`` of the whole stack;
   ``full_restart_s``: from the ``strata up`` call until every partition is led
   (``full_restart_clients_s``: in the clients' metadata; a
   broker registers before it has loaded its partitions, so also
   ``full_restart_writable_s``: until a fresh producer, started then, has one acks=all
   record acknowledged by every partition; its retry back-off, up to 1 s, is in it).
   Then, untimed by the figures above, a preferred-leader election
   (``full_restart_rebalance_s``): the broker stopped last leads everything after a
   full restart, and there is no automatic leader rebalance yet, so the phases after
   this one would otherwise measure an unbalanced cluster.
6. ``resources``: ``broker_rss_mb`` (``VmRSS`` of ``/proc/<pid>/status``) and
   ``broker_open_files`` (entries of ``/proc/<pid>/fd``) per broker id.
7. ``idle-connections``: on a topic of its own (``--latency-partitions``, RF 3) a
   producer writes ``--produce-rate`` records/s (per-record ``send``, no key, acks=all,
   linger 2 ms) for ``--produce-seconds``; latency is per record, from ``send`` to its
   acknowledgement, p50/p99 by nearest rank. First without extra connections
   (``produce_p50_ms_baseline`` / ``produce_p99_ms_baseline``), then with
   ``--idle-connections N`` idle client connections open, round-robin over the brokers
   (``produce_p50_ms_with_idle_connections`` / ``produce_p99_ms_with_idle_connections``);
   ``produce_records_per_sec_...`` is the rate reached (records over the time until the
   last acknowledgement): well below ``produce_rate_target``, the records queued in the
   producer and the latencies measure that queue.
   Each idle connection is the client's own ``BrokerConnection`` (the framing code every
   client uses, a raw TCP connection with one reader task and nothing else) that sent
   one Metadata request for that topic and then sits idle: far cheaper on this
   process's CPU than ``AsyncConsumer``\\ s, which would long-poll (a Fetch every 500 ms
   each). ``rss_per_connection_kb``: the brokers' summed RSS after opening them minus
   before, divided by N. The soft ``RLIMIT_NOFILE`` of this process is raised to the hard
   limit for them.
8. ``group`` (only with ``--group-members M`` > 0): M ``AsyncConsumer``\\ s in this
   process, one group (cooperative-sticky), on a topic of ``--group-partitions`` G
   partitions, each polling in a loop. Balanced means: the assignments the members
   report (``assignment()``: what they own, ``on_assign`` having run) cover every
   partition exactly once, none holding more than ceil(G/M). ``group_balance_s``: from
   the last member's ``subscribe`` until balanced; ``group_rebalance_after_leave_s``:
   from the moment one member is told to stop (it closes, leaving the group) until the
   others are balanced (ceil(G/(M-1))). All members share this process's one
   interpreter: ``group_client_cpu_s`` is its CPU time over the phase and
   ``group_client_cpu_bound`` is true when that is above 90 % of the wall time (then the
   figures measure this process, not the brokers). ``--group-processes P`` spreads the
   members over P worker processes instead (``strata_tools.perf_scale_group``, each
   reporting its members' assignments as JSON lines), as deployments run them; then
   ``group_client_cpu_s`` is the workers' CPU. ``group_broker_cpu_s``: the CPU the
   brokers used from the first ``subscribe`` until balanced, the coordinator's share of
   the balance time (the other brokers serve the members' fetches).

Figures of a skipped phase are ``null``; ``skipped`` lists the phases left out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from strata_tools.perf_zookeeper import Key, ZooKeeperView

__all__ = ["PHASES", "ScaleError", "ScaleOptions", "add_scale_arguments", "bench_scale",
           "run_scale", "user_path_table"]

#: Phases ``--skip`` may leave out (the topics are always created).
PHASES = ("produce", "controlled-shutdown", "sigkill-controller", "restart", "resources",
          "idle-connections", "group")
TOPICS_PER_REQUEST = 10
REPLICATION_FACTOR = 3
_POLL_S = 0.1
_CONNECT_CONCURRENCY = 50
_STRATA_UP_TIMEOUT_S = 300.0
_VIEW_REQUEST_TIMEOUT_MS = 5000


class ScaleError(RuntimeError):
    """The benchmark could not run, or a wait ran out of time; the message says which.
    ``result`` holds the figures measured before it happened."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.result: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class ScaleOptions:
    topics: int = 100  # the shape: 100 topics x 100 partitions
    partitions: int = 10_000
    idle_connections: int = 1000
    produce_rate: int = 10_000
    produce_seconds: float = 10.0
    latency_partitions: int = 8
    background_rate: int = 1000
    group_members: int = 0
    group_partitions: int = 1000
    group_processes: int = 1
    record_size: int = 100
    timeout: float = 600.0  # every single wait
    skip: frozenset[str] = field(default_factory=frozenset)
    keep_topics: bool = False

    def check(self) -> None:
        if self.topics < 1 or self.partitions < self.topics:
            raise ScaleError(f"--partitions ({self.partitions}) must be at least --topics "
                             f"({self.topics}), which must be at least 1")
        unknown = set(self.skip) - set(PHASES)
        if unknown:
            raise ScaleError(f"--skip: unknown phase(s) {', '.join(sorted(unknown))}; the "
                             f"phases are {', '.join(PHASES)}")


T = TypeVar("T")
Log = Callable[[str], None]


# -- the stack ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Stack:
    data_dir: Path
    bootstrap: str
    zookeeper: str
    tier: bool  # the stack runs the tiering job (restarts keep it so)
    started: bool  # this run started it (and stops it)
    temp: bool  # ...in a temp dir of its own (removed at the end)

    #: Every (pid, marker) stack.json recorded during the run, by pid, with its name.
    seen: dict[int, tuple[str, str]] = field(default_factory=dict)

    def up_args(self) -> list[str]:
        return ["up", "--data-dir", str(self.data_dir), *(() if self.tier else ("--no-tier",))]

    def recorded(self) -> dict[int, tuple[str, str]]:
        """pid -> (name, marker) of every process stack.json records now."""
        from strata_tools.stack import Stack

        return {p.record.pid: (p.record.name, p.record.marker)
                for p in Stack(self.data_dir).status().processes}

    def remember(self) -> None:
        self.seen.update(self.recorded())

    def orphans(self) -> dict[int, tuple[str, str]]:
        """Processes the stack recorded earlier, still running its command, that
        stack.json no longer records (a `strata up` that fails part-way rewrites it
        with only the services it got to)."""
        from procs import cmdline, pid_alive

        recorded = self.recorded()
        return {pid: (name, marker) for pid, (name, marker) in self.seen.items()
                if pid not in recorded and pid_alive(pid)
                and marker in (cmdline(pid) or "")}

    def strata(self, args: Sequence[str], timeout: float, what: str) -> str:
        """``strata ARGS`` on this stack; every process it records is remembered, and a
        failure names the processes it left running unrecorded."""
        self.remember()
        try:
            return _strata_ok(args, timeout, what)
        except ScaleError as err:
            lost = self.orphans()
            if not lost or self.started:  # a stack of ours: _close_stack stops them
                raise
            listed = ", ".join(f"{name} (pid {pid})" for pid, (name, _) in sorted(lost.items()))
            raise ScaleError(f"{err}\nStill running but no longer in {self.data_dir}/"
                             f"stack.json, so `strata down` will not stop them: {listed}; "
                             f"stop them with `kill PID`") from None
        finally:
            self.remember()


def _strata(args: Sequence[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run ``strata ARGS`` (this interpreter's); the result, whatever the exit code."""
    command = [sys.executable, "-m", "strata_tools.cli", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ScaleError(f"`strata {' '.join(args)}` ({what}) did not finish within "
                         f"{timeout:.0f} s") from None


def _strata_ok(args: Sequence[str], timeout: float, what: str) -> str:
    done = _strata(args, timeout, what)
    if done.returncode != 0:
        raise ScaleError(f"`strata {' '.join(args)}` ({what}) failed (exit {done.returncode}): "
                         f"{_excerpt(done.stderr)}")
    return done.stdout


def _excerpt(text: str) -> str:
    """The first line (what failed) and the end (e.g. the tail of a log it quotes)."""
    text = text.strip()
    if len(text) <= 2000:
        return text
    first = text.splitlines()[0][:500]
    return f"{first}\n[...]\n{text[-1500:]}"


def _brokers(data_dir: Path) -> dict[int, tuple[int, str]]:
    """Broker id -> (pid, cmdline marker) of the stack's running brokers."""
    from strata_tools.stack import Stack

    out: dict[int, tuple[int, str]] = {}
    for p in Stack(data_dir).status().processes:
        name = p.record.name
        if name.startswith("broker-") and name[len("broker-"):].isdigit() \
                and p.state in ("started", "running"):
            out[int(name[len("broker-"):])] = (p.record.pid, p.record.marker)
    return out


def _attach(data_dir: Path, started: bool, temp: bool) -> _Stack:
    from strata_tools.stack import Stack

    status = Stack(data_dir).status()
    endpoints = status.endpoints()
    tier = any(p.record.name == "tier" for p in status.processes)
    stack = _Stack(Stack(data_dir).data_dir, endpoints["bootstrap"] or "",
                   endpoints["zookeeper"] or "", tier, started, temp)
    brokers = _brokers(data_dir)
    if len(brokers) < REPLICATION_FACTOR:
        raise ScaleError(f"the stack in {data_dir} runs {len(brokers)} broker(s); this "
                         f"benchmark needs at least {REPLICATION_FACTOR} (RF 3): start one with "
                         "`strata up --brokers 3`, or leave out --data-dir")
    return stack


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_base(brokers: int) -> int:
    """A base port whose whole plan (``strata_tools.stack``'s docstring) is free now, below the
    ephemeral range so that this run's own outgoing connections never take a broker's
    port while it is down."""
    from procs import PortInUseError, check_port_free

    high = min(_ephemeral_low(), 65536) - 110
    low = max(1024, high - 12_000)
    ports = [0, 9, 70, *(10 + i for i in range(brokers)), *(40 + i for i in range(brokers)),
             *(80 + i for i in range(brokers))]
    for _ in range(500):
        base = random.randrange(low, high)
        try:
            for offset in ports:
                check_port_free("127.0.0.1", base + offset, "strata perf scale")
        except PortInUseError:
            continue
        return base
    raise ScaleError("found no base port with the stack's ports free; give --base-port")


def _open_stack(data_dir: str | None, base_port: int | None, brokers: int, log: Log) -> _Stack:
    """Attach to the running stack in ``data_dir``, or start one (there or in a temp dir)."""
    from strata_tools.stack import Stack

    if brokers < REPLICATION_FACTOR:
        raise ScaleError(f"--brokers {brokers}: the topics have replication factor "
                         f"{REPLICATION_FACTOR}, so the stack needs at least "
                         f"{REPLICATION_FACTOR} brokers")
    if data_dir is not None:
        status = Stack(data_dir).status()
        if status.processes:
            if not status.all_up:
                down = [p.record.name for p in status.processes
                        if p.state not in ("started", "running")]
                raise ScaleError(f"the stack in {data_dir} is not fully up ({', '.join(down)} "
                                 f"not running): run `strata up --data-dir {data_dir}`, or "
                                 f"`strata down --data-dir {data_dir}` to let this benchmark "
                                 "start its own stack there")
            if base_port is not None:
                raise ScaleError(f"--base-port applies to a stack this benchmark starts, but "
                                 f"{data_dir} already runs one; leave out --base-port")
            log(f"using the running stack in {data_dir}")
            stack = _attach(Path(data_dir), started=False, temp=False)
            stack.remember()
            return stack
    temp = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="strata-perf-scale.")) if data_dir is None \
        else Path(data_dir)
    try:
        last = ""
        for _ in range(3):
            base = base_port if base_port is not None else _free_base(brokers)
            log(f"starting a stack of {brokers} brokers in {directory} on base port {base}")
            done = _strata(["up", "--data-dir", str(directory), "--base-port", str(base),
                            "--brokers", str(brokers), "--no-tier"],
                           _STRATA_UP_TIMEOUT_S, "start the stack")
            if done.returncode == 0:
                stack = _attach(directory, started=True, temp=temp)
                stack.remember()
                return stack
            last = _excerpt(done.stderr)
            # What did start (stack.json records it) stops again.
            _close_stack(_Stack(directory, "", "", False, True, False), log)
            if base_port is not None or "already in use" not in last:
                break
        raise ScaleError(f"`strata up` failed: {last}")
    except BaseException:
        if (directory / "stack.json").exists():  # stop whatever did start (Ctrl-C, ...)
            with contextlib.suppress(ScaleError):
                _close_stack(_Stack(directory, "", "", False, True, temp), log)
        elif temp:
            shutil.rmtree(directory, ignore_errors=True)
        raise


def _close_stack(stack: _Stack, log: Log) -> None:
    """Stop a stack this run started: `strata down`, then every process it ever recorded
    that still runs (by pid, checked against its marker); remove its temp dir."""
    from procs import kill_pid

    if not stack.started:
        return
    log(f"stopping the stack in {stack.data_dir}")
    error: ScaleError | None = None
    try:
        stack.strata(["down", "--data-dir", str(stack.data_dir)], _STRATA_UP_TIMEOUT_S,
                     "stop the stack this benchmark started")
    except ScaleError as err:
        error = err
    survivors: list[str] = []
    for pid, (name, marker) in sorted(stack.seen.items()):
        try:
            if kill_pid(pid, grace=30.0, expect=marker):
                log(f"  stopped {name} (pid {pid}) by its pid: `strata down` had not")
        except TimeoutError:
            survivors.append(f"{name} (pid {pid})")
    if survivors:
        raise ScaleError(f"could not stop {', '.join(survivors)} of the stack in "
                         f"{stack.data_dir} (they survived SIGKILL); its data dir is kept")
    if stack.temp:
        shutil.rmtree(stack.data_dir, ignore_errors=True)
    if error is not None:
        raise error


def _signal(pid: int, marker: str, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid`` if it still runs the command the stack recorded."""
    from procs import cmdline, pid_alive

    line = cmdline(pid)
    if not pid_alive(pid) or line is None or marker not in line:
        raise ScaleError(f"pid {pid} is not the broker the stack recorded any more")
    os.kill(pid, sig)


def _proc_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ScaleError(f"/proc/{pid}/status has no VmRSS line")


def _resources(data_dir: Path) -> dict[int, tuple[int, int]]:
    """Broker id -> (RSS in kB, open file descriptors) of the stack's brokers."""
    from procs import cmdline

    out: dict[int, tuple[int, int]] = {}
    for broker, (pid, marker) in sorted(_brokers(data_dir).items()):
        line = cmdline(pid)
        if line is None or marker not in line:
            raise ScaleError(f"broker {broker} (pid {pid}) is not running any more")
        out[broker] = (_proc_rss_kb(pid), len(os.listdir(f"/proc/{pid}/fd")))
    return out


# -- ZooKeeper ----------------------------------------------------------------------------


class _ZooKeeper(ZooKeeperView):
    """The shared view (``perf_zookeeper``), with this benchmark's conditions."""

    def __init__(self, hosts: str, timeout: float) -> None:
        try:
            super().__init__(hosts, timeout)
        except Exception as err:
            raise ScaleError(f"could not connect to ZooKeeper at {hosts} within "
                             f"{timeout:.0f} s: {err!r}") from None

    def assignments(self, topics: Sequence[str]) -> dict[Key, frozenset[int]]:
        out: dict[Key, frozenset[int]] = {}
        for topic, value in self.replicas(topics).items():
            if value is None:
                raise ScaleError(f"topic {topic} has no definition in ZooKeeper")
            for p, replicas in value.items():
                out[(topic, p)] = frozenset(replicas)
        return out

    # Conditions for ``_wait``: (met, what is still missing).

    def led(self, keys: Sequence[Key], avoid: int | None = None) -> tuple[bool, str]:
        live = self.live_brokers() - ({avoid} if avoid is not None else set())
        states = self.states(keys)
        bad = [f"{t}-{p} (leader {leader})" for (t, p), (leader, _) in states.items()
               if leader not in live]
        return not bad, f"{len(bad)} partition(s) without a live leader, e.g. " \
                        f"{', '.join(bad[:3])}; registered brokers {sorted(live)}"

    def not_led_by(self, keys: Sequence[Key], broker: int) -> tuple[bool, str]:
        bad = [f"{t}-{p}" for (t, p), (leader, _) in self.states(keys).items()
               if leader == broker]
        return not bad, f"{len(bad)} partition(s) still led by broker {broker}, e.g. " \
                        f"{', '.join(bad[:3])}"

    def healthy(self, assignment: dict[Key, frozenset[int]],
                brokers: Iterable[int]) -> tuple[bool, str]:
        live = self.live_brokers()
        missing = set(brokers) - live
        states = self.states(list(assignment))
        bad = [f"{t}-{p} (leader {leader}, isr {sorted(isr)})"
               for (t, p), (leader, isr) in states.items()
               if leader not in live or frozenset(isr) != assignment[(t, p)]]
        problems = ([f"brokers {sorted(missing)} not registered"] if missing else []) + \
            ([f"{len(bad)} partition(s) without a live leader or a full ISR, e.g. "
              f"{', '.join(bad[:3])}"] if bad else [])
        return not problems, "; ".join(problems)


async def _wait(what: str, check: Callable[[], tuple[bool, str]], timeout: float,
                abort: Callable[[], None] | None = None) -> float:
    """Poll ``check`` (blocking: run in a thread) until it is met; the ``perf_counter``
    time it was seen met. ``abort()`` may raise to give up early."""
    from kazoo.exceptions import KazooException

    async def in_thread() -> tuple[bool, str]:
        try:
            return await asyncio.to_thread(check)
        except KazooException as err:
            return False, f"ZooKeeper: {err!r}"

    return await _wait_async(what, in_thread, timeout, abort)


async def _wait_async(what: str, check: Callable[[], Awaitable[tuple[bool, str]]],
                      timeout: float, abort: Callable[[], None] | None = None) -> float:
    """``_wait`` for a check that is a coroutine (the clients' view, or ``_wait``'s
    check run in a thread)."""
    deadline = time.perf_counter() + timeout
    while True:
        met, detail = await check()
        now = time.perf_counter()
        if met:
            return now
        if abort is not None:
            abort()
        if now > deadline:
            raise ScaleError(f"timed out after {timeout:.0f} s waiting for {what}: {detail}")
        await asyncio.sleep(_POLL_S)


class _Clients:
    """What a client sees: the leaders of one Metadata answer (``AsyncAdmin.describe_topics``
    with ``offsets=False``, the request every producer and consumer makes). ZooKeeper may
    name a leader before the brokers' metadata does; the benchmark reports both."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.admin: Any = None

    async def __aenter__(self) -> _Clients:
        from strata.client import AsyncAdmin

        self.admin = AsyncAdmin(self.run.stack.bootstrap, client_id="strata-perf-scale-view",
                                request_timeout_ms=_VIEW_REQUEST_TIMEOUT_MS,
                                retry_backoff_ms=50)
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.admin.close()

    async def leaders(self, topics: Sequence[str]) -> dict[Key, int] | str:
        from strata.client import StrataError

        try:
            described = await asyncio.wait_for(
                self.admin.describe_topics(topics, offsets=False),
                _VIEW_REQUEST_TIMEOUT_MS / 1000 + 1)
        except (StrataError, OSError, TimeoutError) as err:
            return f"Metadata: {err!r}"
        return {(t, p.partition): p.leader for t, d in described.items() for p in d.partitions}

    async def led(self, keys: Sequence[Key], avoid: int | None = None) -> tuple[bool, str]:
        """Every partition of ``keys`` has a leader (other than ``avoid``) in metadata."""
        leaders = await self.leaders(sorted({t for t, _ in keys}))
        if isinstance(leaders, str):
            return False, leaders
        bad = [f"{t}-{p} (leader {leaders.get((t, p))})" for t, p in keys
               if leaders.get((t, p), -1) < 0 or leaders.get((t, p)) == avoid]
        return not bad, f"{len(bad)} partition(s) without a leader in the clients' " \
                        f"metadata, e.g. {', '.join(bad[:3])}"

    async def not_led_by(self, keys: Sequence[Key], broker: int) -> tuple[bool, str]:
        leaders = await self.leaders(sorted({t for t, _ in keys}))
        if isinstance(leaders, str):
            return False, leaders
        bad = [f"{t}-{p}" for t, p in keys if leaders.get((t, p)) == broker]
        return not bad, f"{len(bad)} partition(s) still led by broker {broker} in the " \
                        f"clients' metadata, e.g. {', '.join(bad[:3])}"


async def _within(awaitable: Awaitable[T], timeout: float, what: str) -> T:
    """``awaitable``'s result, or a ScaleError naming ``what`` after ``timeout`` s."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise ScaleError(f"timed out after {timeout:.0f} s waiting for {what}") from None


# -- the phases ---------------------------------------------------------------------------


def _pct(ordered: Sequence[float], q: float) -> float:
    """Nearest rank, as ``strata perf produce`` computes its percentiles."""
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _seconds(value: float) -> float:
    return round(value, 3)


class _Run:
    """State shared by the phases of one run."""

    def __init__(self, stack: _Stack, options: ScaleOptions, log: Log) -> None:
        self.stack = stack
        self.options = options
        self.log = log
        self.prefix = f"scale-{uuid.uuid4().hex[:6]}"
        self.topics = [f"{self.prefix}-{i:04d}" for i in range(options.topics)]
        base, extra = divmod(options.partitions, options.topics)
        self.counts = {t: base + (1 if i < extra else 0) for i, t in enumerate(self.topics)}
        self.keys: list[Key] = [(t, p) for t in self.topics for p in range(self.counts[t])]
        self.created: list[str] = []  # every topic this run created (deleted at the end)
        self.assignment: dict[Key, frozenset[int]] = {}
        self.payload = b"x" * options.record_size
        self.zk: _ZooKeeper | None = None
        self.result: dict[str, Any] = {}
        #: What a `strata up` / `strata down` may take (each broker loads every partition).
        self.strata_timeout = max(_STRATA_UP_TIMEOUT_S, options.timeout)

    @property
    def z(self) -> _ZooKeeper:
        if self.zk is None:
            raise ScaleError("not connected to ZooKeeper")  # pragma: no cover - a bug
        return self.zk

    async def connect(self) -> None:
        self.zk = await asyncio.to_thread(_ZooKeeper, self.stack.zookeeper, self.options.timeout)

    async def disconnect(self) -> None:
        if self.zk is not None:
            zk, self.zk = self.zk, None
            await asyncio.to_thread(zk.close)

    def admin(self) -> Any:
        from strata.client import AsyncAdmin

        return AsyncAdmin(self.stack.bootstrap, client_id="strata-perf-scale",
                          request_timeout_ms=int(max(30.0, self.options.timeout) * 1000))

    def producer(self, **options: Any) -> Any:
        from strata.client import AsyncProducer

        return AsyncProducer(self.stack.bootstrap, acks="all", client_id="strata-perf-scale",
                             max_block_ms=int(self.options.timeout * 1000), **options)

    async def create(self, names: Sequence[str], counts: dict[str, int]) -> None:
        from strata.client import NewTopic

        async with self.admin() as admin:
            for i in range(0, len(names), TOPICS_PER_REQUEST):
                group = names[i:i + TOPICS_PER_REQUEST]
                self.created.extend(group)
                await _within(admin.create_topics(
                    [NewTopic(n, counts[n], REPLICATION_FACTOR, {"min.insync.replicas": "2"})
                     for n in group]), self.options.timeout,
                    f"the creation of topics {group[0]}..{group[-1]}")

    async def wait_led(self, keys: Sequence[Key], what: str) -> float:
        return await _wait(what, lambda: self.z.led(keys), self.options.timeout)

    async def wait_healthy(self, why: str) -> float:
        brokers = set(_brokers(self.stack.data_dir))
        return await _wait(f"every broker registered and every ISR full ({why})",
                           lambda: self.z.healthy(self.assignment, brokers),
                           self.options.timeout)

    async def restart_missing(self) -> float:
        """``strata up --data-dir D`` (starts the broker that is down); seconds it took."""
        began = time.perf_counter()
        await asyncio.to_thread(self.stack.strata, self.stack.up_args(), self.strata_timeout,
                                "restart the stopped broker")
        return time.perf_counter() - began

    async def restart_quietly(self) -> None:
        with contextlib.suppress(ScaleError):
            await self.restart_missing()

    # 1 ---------------------------------------------------------------------------------
    async def phase_create(self) -> None:
        o = self.options
        self.log(f"creating {o.topics} topics with {o.partitions} partitions in total "
                 f"(RF {REPLICATION_FACTOR}, min.insync.replicas=2), "
                 f"{TOPICS_PER_REQUEST} per request")
        began = time.perf_counter()
        await self.create(self.topics, self.counts)
        requests_done = time.perf_counter()
        done = await self.wait_led(self.keys, "every partition of the new topics to have a "
                                   "leader")
        async with _Clients(self) as clients:
            seen = await _wait_async("every partition of the new topics to have a leader in "
                                     "the clients' metadata", lambda: clients.led(self.keys),
                                     self.options.timeout)
        self.assignment = await asyncio.to_thread(self.z.assignments, self.topics)
        reading = time.perf_counter()
        await asyncio.to_thread(self.z.states, self.keys)
        read_s = time.perf_counter() - reading
        self.result["create_requests_s"] = _seconds(requests_done - began)
        self.result["create_all_leaders_s"] = _seconds(done - began)
        self.result["create_all_led_clients_s"] = _seconds(seen - began)
        self.result["zk_state_read_s"] = _seconds(read_s)
        self.log(f"  every partition led {done - began:.2f} s after the first request "
                 f"in ZooKeeper, {seen - began:.2f} s in the clients' metadata (requests "
                 f"returned after {requests_done - began:.2f} s); one pipelined "
                 f"read of the {len(self.keys)} state znodes takes {read_s:.3f} s")

    # 2 ---------------------------------------------------------------------------------
    async def produce_one_each(self, producer: Any) -> tuple[float, float]:
        """(metadata seconds, send-to-last-ack seconds) for one record per partition."""
        began = time.perf_counter()
        for topic in self.topics:
            await producer.partitions_for(topic)
        sending = time.perf_counter()
        futures = [await producer.send(t, self.payload, partition=p) for t, p in self.keys]
        await _within(producer.flush(), self.options.timeout,
                      "the acknowledgements of one record per partition")
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        done = time.perf_counter()
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise ScaleError(f"{len(failed)} of {len(futures)} records (one per partition) "
                             f"failed; first: {failed[0]}")
        return sending - began, done - sending

    def produce_as_a_user(self) -> float:
        """A new blocking ``Producer`` (acks=all, the defaults otherwise): ``send`` one
        record to every partition, then ``result()`` of each; seconds from the first
        ``send`` (the producer's metadata lookups included) to the last result."""
        from strata.client import Producer

        with Producer(self.stack.bootstrap, acks="all", client_id="strata-perf-scale-user",
                      max_block_ms=int(self.options.timeout * 1000)) as producer:
            began = time.perf_counter()
            futures = [producer.send(t, self.payload, partition=p) for t, p in self.keys]
            for future in futures:
                future.result(timeout=self.options.timeout)
            return time.perf_counter() - began

    async def phase_produce(self) -> None:
        self.log(f"one acks=all record to each of {len(self.keys)} new partitions (a new "
                 "blocking Producer: send each, then result of each)")
        user_s = await asyncio.to_thread(self.produce_as_a_user)
        self.result["produce_one_each_user_s"] = _seconds(user_s)
        self.log(f"  {user_s:.2f} s; again with an AsyncProducer, metadata first")
        async with self.producer(linger_ms=5) as producer:
            metadata_s, produce_s = await self.produce_one_each(producer)
        self.result["produce_metadata_s"] = _seconds(metadata_s)
        self.result["produce_one_each_s"] = _seconds(produce_s)
        self.log(f"  metadata of {len(self.topics)} topics {metadata_s:.2f} s, "
                 f"send to last acknowledgement {produce_s:.2f} s")

    # 3 ---------------------------------------------------------------------------------
    async def phase_controlled_shutdown(self) -> None:
        from procs import pid_alive

        o = self.options
        await self.wait_healthy("before the controlled shutdown")
        brokers = _brokers(self.stack.data_dir)
        controller = await asyncio.to_thread(self.z.controller)
        states = await asyncio.to_thread(self.z.states, self.keys)
        leads = {b: [k for k, (leader, _) in states.items() if leader == b] for b in brokers}
        candidates = [b for b in brokers if b != controller]
        if not candidates:
            raise ScaleError(f"every broker of the stack is the controller ({controller})?")
        victim = max(candidates, key=lambda b: (len(leads[b]), -b))
        led = leads[victim]
        pid, marker = brokers[victim]
        self.log(f"SIGTERM to broker {victim} (pid {pid}, leads {len(led)} partitions; "
                 f"controller is {controller}) under {o.background_rate} records/s")
        background = _Background(self.keys, o.background_rate, self.payload)
        stop = asyncio.Event()
        up: asyncio.Task[float] | None = None
        async with self.producer(linger_ms=5, retries=2_147_483_647) as producer, \
                _Clients(self) as clients:
            for topic in self.topics:
                await producer.partitions_for(topic)
            sender = asyncio.create_task(background.run(producer, stop))
            try:
                await asyncio.sleep(2.0)  # steady writing before the signal
                if sender.done():
                    await sender  # it failed: raise its error
                began = time.perf_counter()
                _signal(pid, marker, signal.SIGTERM)
                gone_at: float | None = None  # in ZooKeeper
                seen_at: float | None = None  # in the clients' metadata
                exited_at: float | None = None
                deadline = began + o.timeout
                while gone_at is None or seen_at is None or exited_at is None:
                    if exited_at is None and not pid_alive(pid):
                        exited_at = time.perf_counter()
                    if gone_at is None:
                        met, detail = await asyncio.to_thread(self.z.not_led_by, led, victim)
                        if met:
                            gone_at = time.perf_counter()
                    if seen_at is None:
                        met, seen_detail = await clients.not_led_by(led, victim)
                        if met:
                            seen_at = time.perf_counter()
                            # As a rolling restart does: `strata up` at once, while the
                            # broker may still be closing (up waits for it to exit).
                            up = asyncio.create_task(self.restart_missing())
                    now = time.perf_counter()
                    if now > deadline:
                        what = "no partition to name it as leader in ZooKeeper: " + detail \
                            if gone_at is None else "no partition to name it as leader in " \
                            "the clients' metadata: " + seen_detail if seen_at is None \
                            else "its process to exit"
                        if exited_at is None:
                            with contextlib.suppress(ScaleError, ProcessLookupError):
                                _signal(pid, marker, signal.SIGKILL)
                        raise ScaleError(f"timed out after {o.timeout:.0f} s after SIGTERM to "
                                         f"broker {victim} waiting for {what}")
                    if exited_at is None and sender.done():
                        await sender
                    if up is not None and up.done():
                        await up  # `strata up` failed: raise its error
                    await asyncio.sleep(_POLL_S / 2)
                stop.set()
                await sender
                # Every record sent in the window has its outcome (success, or failure
                # after the client's retries) before it is counted.
                await _within(producer.flush(), o.timeout,
                              "the background producer's flush after the shutdown")
                await background.settled(o.timeout)
                assert up is not None
                up_s = await up
                up_returned = time.perf_counter()
            finally:
                stop.set()
                if not sender.done():
                    sender.cancel()
                if up is None:  # leave the stack as it was found
                    await self.restart_quietly()
                elif not up.done():
                    with contextlib.suppress(Exception):
                        await up
        restarted_at = time.perf_counter()
        isr_s = await self.wait_healthy("after restarting the broker") - restarted_at
        assert gone_at is not None and exited_at is not None and seen_at is not None
        sent, failed, first = background.window(began, exited_at)
        self.result.update({
            "controlled_shutdown_broker_said": _last_line(
                self.stack.data_dir / f"broker-{victim}" / "broker.log", "stopped cleanly"),
            "controlled_shutdown_victim": victim,
            "controlled_shutdown_led_partitions": len(led),
            "controlled_shutdown_s": _seconds(gone_at - began),
            "controlled_shutdown_clients_s": _seconds(seen_at - began),
            "controlled_shutdown_exit_s": _seconds(exited_at - began),
            "controlled_shutdown_requests": sent,
            "controlled_shutdown_failed_requests": failed,
            "controlled_shutdown_first_error": first,
            "controlled_shutdown_up_s": _seconds(up_s),
            "controlled_shutdown_restart_s": _seconds(up_returned - exited_at),
            "controlled_shutdown_restart_isr_full_s": _seconds(isr_s),
        })
        self.log(f"  leaders moved off it after {gone_at - began:.2f} s in ZooKeeper, "
                 f"{seen_at - began:.2f} s in the clients' metadata; `strata up` called then; "
                 f"the process exited after {exited_at - began:.2f} s; {failed} of {sent} "
                 f"records sent in between failed; `strata up` returned (the broker answers) "
                 f"{up_returned - exited_at:.2f} s after the exit, ISRs full {isr_s:.2f} s "
                 "later")

    # 4 ---------------------------------------------------------------------------------
    async def phase_sigkill_controller(self) -> None:
        from procs import pid_alive

        await self.wait_healthy("before killing the controller")
        brokers = _brokers(self.stack.data_dir)
        controller = await asyncio.to_thread(self.z.controller)
        if controller is None or controller not in brokers:
            raise ScaleError(f"the controller ({controller}) is not a broker process of the "
                             f"stack in {self.stack.data_dir}")
        states = await asyncio.to_thread(self.z.states, self.keys)
        led = [k for k, (leader, _) in states.items() if leader == controller]
        pid, marker = brokers[controller]
        self.log(f"SIGKILL to the controller, broker {controller} (pid {pid}, leads "
                 f"{len(led)} partitions)")
        new_controller: list[float] = []

        def check() -> tuple[bool, str]:
            if not new_controller and self.z.controller() not in (None, controller):
                new_controller.append(time.perf_counter())
            met, detail = self.z.led(led, avoid=controller)
            if met:  # the partitions it did not lead kept theirs: confirm once over all
                met, detail = self.z.led(self.keys, avoid=controller)
            return met, detail

        restart_tried = False
        try:
            began = time.perf_counter()
            _signal(pid, marker, signal.SIGKILL)
            while pid_alive(pid):
                if time.perf_counter() > began + 10:
                    raise ScaleError(f"broker {controller} (pid {pid}) survived SIGKILL "
                                     "for 10 s")
                await asyncio.sleep(0.01)
            done = await _wait(f"every partition to be led by a live broker other than the "
                               f"killed controller {controller}", check, self.options.timeout)
            async with _Clients(self) as clients:
                seen = await _wait_async(
                    f"every partition to be led by a broker other than the killed controller "
                    f"{controller} in the clients' metadata",
                    lambda: clients.led(self.keys, avoid=controller), self.options.timeout)
            restart_tried = True
            restart_s = await self.restart_missing()
        finally:
            if not restart_tried:  # leave the stack as it was found
                await self.restart_quietly()
        restarted_at = time.perf_counter()
        isr_at = await self.wait_healthy("after restarting the killed controller")
        self.result.update({
            "sigkill_controller_victim": controller,
            "sigkill_controller_led_partitions": len(led),
            "sigkill_controller_s": _seconds(done - began),
            "sigkill_controller_clients_s": _seconds(seen - began),
            "sigkill_new_controller_s": _seconds(new_controller[0] - began)
            if new_controller else None,
            "sigkill_controller_restart_s": _seconds(restart_s),
            "sigkill_controller_restart_isr_full_s": _seconds(isr_at - restarted_at),
        })
        self.log(f"  every partition led by a live broker after {done - began:.2f} s in "
                 f"ZooKeeper, {seen - began:.2f} s in the clients' metadata; "
                 f"restarted in {restart_s:.2f} s, ISRs full {isr_at - restarted_at:.2f} s "
                 "later")

    # 5 ---------------------------------------------------------------------------------
    async def phase_restart(self) -> None:
        o = self.options
        await self.wait_healthy("before the full restart")
        self.log("full restart: strata down, then strata up")
        await self.disconnect()
        began_down = time.perf_counter()
        await asyncio.to_thread(self.stack.strata, ["down", "--data-dir",
                                                    str(self.stack.data_dir)],
                                self.strata_timeout, "stop the whole stack")
        down_s = time.perf_counter() - began_down
        began = time.perf_counter()
        up = asyncio.create_task(asyncio.to_thread(
            self.stack.strata, self.stack.up_args(), self.strata_timeout,
            "start the whole stack"))
        up_returned: list[float] = []
        up.add_done_callback(lambda _t: up_returned.append(time.perf_counter()))

        def abort() -> None:
            if up.done() and up.exception() is not None:
                raise ScaleError(str(up.exception()))

        try:
            deadline = began + o.timeout
            while self.zk is None:  # ZooKeeper itself is starting
                try:
                    self.zk = await asyncio.to_thread(_ZooKeeper, self.stack.zookeeper, 2.0)
                except ScaleError as err:
                    abort()
                    if time.perf_counter() > deadline:
                        raise ScaleError(f"timed out after {o.timeout:.0f} s waiting for "
                                         f"ZooKeeper to come back: {err}") from None
            led_at = await _wait("every partition to be led after the full restart",
                                 lambda: self.z.led(self.keys), o.timeout, abort)
            async with _Clients(self) as clients:
                seen_at = await _wait_async(
                    "every partition to have a leader in the clients' metadata after the "
                    "full restart", lambda: clients.led(self.keys), o.timeout, abort)
            self.log(f"  every partition led {led_at - began:.2f} s after `strata up` in "
                     f"ZooKeeper, {seen_at - began:.2f} s in the clients' metadata; writing "
                     "one record to each")
            async with self.producer(linger_ms=5) as producer:
                await self.produce_one_each(producer)
            writable_at = time.perf_counter()
            await _within(asyncio.shield(up), self.strata_timeout,
                          "`strata up` of the whole stack to return")
        finally:
            if not up.done():
                with contextlib.suppress(Exception):
                    await up
        self.result.update({
            "full_restart_down_s": _seconds(down_s),
            "full_restart_s": _seconds(led_at - began),
            "full_restart_clients_s": _seconds(seen_at - began),
            "full_restart_writable_s": _seconds(writable_at - began),
            "full_restart_up_returned_s": _seconds(up_returned[0] - began),
        })
        self.log(f"  every partition acknowledged a write {writable_at - began:.2f} s after "
                 f"`strata up`, which returned after {up_returned[0] - began:.2f} s")
        # `strata down` stops the brokers one after the other, so the last one leads
        # every partition when they come back. Strata has no automatic leader
        # rebalance (Kafka's auto.leader.rebalance.enable) yet: move the leaderships
        # back as an operator would, so that the phases after this one measure a
        # balanced cluster, as they would without the restart.
        await self.wait_healthy("before the preferred-leader election after the restart")
        rebalance_began = time.perf_counter()
        async with self.admin() as admin:
            elected = await _within(admin.elect_preferred_leaders(), o.timeout,
                                    "the preferred-leader election after the full restart")
        moved_back = sum(1 for result in elected.values() if result.preferred_leads)
        self.result["full_restart_rebalance_s"] = _seconds(
            time.perf_counter() - rebalance_began)
        self.log(f"  leadership back on the preferred replicas of {moved_back} of "
                 f"{len(elected)} partitions in {time.perf_counter() - rebalance_began:.2f} s "
                 "(`strata cluster elect-preferred-leaders`)")

    # 6 ---------------------------------------------------------------------------------
    async def phase_resources(self) -> None:
        await self.wait_healthy("before reading the brokers' memory")
        usage = _resources(self.stack.data_dir)
        self.result["broker_rss_mb"] = {str(b): round(rss / 1024, 1)
                                        for b, (rss, _) in usage.items()}
        self.result["broker_open_files"] = {str(b): files for b, (_, files) in usage.items()}
        self.log("  per broker: " + ", ".join(f"{b}: {rss / 1024:.0f} MB RSS, {files} fds"
                                              for b, (rss, files) in usage.items()))

    # 7 ---------------------------------------------------------------------------------
    async def latency(self, topic: str) -> dict[str, float]:
        """Per-record acknowledgement latency at ``--produce-rate`` records/s."""
        o = self.options
        latencies: list[float] = []
        errors: list[BaseException] = []

        def done(sent_at: float, future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                errors.append(error)
            else:
                latencies.append((time.perf_counter() - sent_at) * 1000)

        total = max(1, int(o.produce_rate * o.produce_seconds))
        async with self.producer(linger_ms=2) as producer:
            # Metadata, connections and the producer id before the clock starts.
            for p in range(await producer.partitions_for(topic)):
                await (await producer.send(topic, self.payload, partition=p))
            began = time.perf_counter()
            sent = 0
            while sent < total:
                due = min(total, int((time.perf_counter() - began) * o.produce_rate) + 1)
                while sent < due:
                    now = time.perf_counter()
                    future = await producer.send(topic, self.payload)
                    future.add_done_callback(lambda f, t=now: done(t, f))
                    sent += 1
                await asyncio.sleep(0.001)
            await _within(producer.flush(), o.timeout,
                          f"the acknowledgements of the records to {topic}")
            seconds = time.perf_counter() - began
        if errors:
            raise ScaleError(f"{len(errors)} of {total} records to {topic} failed; first: "
                             f"{errors[0]}")
        ordered = sorted(latencies)
        return {"p50": _pct(ordered, 0.50), "p99": _pct(ordered, 0.99),
                "records_per_sec": round(total / seconds)}

    async def phase_idle_connections(self) -> None:
        from strata.client import parse_bootstrap
        from wire.connection import BrokerConnection
        from wire.protocol import ApiKey, MetadataRequest

        o = self.options
        topic = f"{self.prefix}-latency"
        await self.create([topic], {topic: o.latency_partitions})
        await self.wait_led([(topic, p) for p in range(o.latency_partitions)],
                            f"every partition of {topic} to have a leader")
        self.log(f"baseline: {o.produce_rate} records/s for {o.produce_seconds:g} s to "
                 f"{topic} ({o.latency_partitions} partitions)")
        baseline = await self.latency(topic)
        self.log(f"  p50 {baseline['p50']} ms, p99 {baseline['p99']} ms, "
                 f"{baseline['records_per_sec']} records/s")
        _raise_nofile(o.idle_connections + 1000)
        addresses = parse_bootstrap(self.stack.bootstrap)
        before = sum(rss for rss, _ in _resources(self.stack.data_dir).values())
        self.log(f"opening {o.idle_connections} idle connections over {len(addresses)} "
                 "brokers (each sends one Metadata request)")
        connections: list[BrokerConnection] = []
        limit = asyncio.Semaphore(_CONNECT_CONCURRENCY)

        async def open_one(i: int) -> None:
            async with limit:
                connection = BrokerConnection(*addresses[i % len(addresses)],
                                              client_id=f"strata-perf-scale-idle-{i}")
                connections.append(connection)
                await connection.connect(timeout=o.timeout)
                await _within(connection.request(ApiKey.METADATA, MetadataRequest([topic])),
                              o.timeout, f"an idle connection's Metadata answer from "
                              f"{connection.host}:{connection.port}")

        try:
            began = time.perf_counter()
            await asyncio.gather(*(open_one(i) for i in range(o.idle_connections)))
            opened_s = time.perf_counter() - began
            await asyncio.sleep(1.0)  # let the brokers settle
            after = sum(rss for rss, _ in _resources(self.stack.data_dir).values())
            per_connection = (after - before) / max(1, o.idle_connections)
            self.log(f"  opened in {opened_s:.2f} s; brokers' RSS {before / 1024:.0f} -> "
                     f"{after / 1024:.0f} MB ({per_connection:.1f} kB per connection); "
                     "measuring again")
            loaded = await self.latency(topic)
            still_open = sum(1 for c in connections if c.is_open)
        finally:
            await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        self.log(f"  p50 {loaded['p50']} ms, p99 {loaded['p99']} ms, "
                 f"{loaded['records_per_sec']} records/s; {still_open} connections still open")
        self.result.update({
            "produce_p50_ms_baseline": baseline["p50"],
            "produce_p99_ms_baseline": baseline["p99"],
            "produce_records_per_sec_baseline": baseline["records_per_sec"],
            "produce_p50_ms_with_idle_connections": loaded["p50"],
            "produce_p99_ms_with_idle_connections": loaded["p99"],
            "produce_records_per_sec_with_idle_connections": loaded["records_per_sec"],
            "produce_rate_target": o.produce_rate,
            "idle_connections": o.idle_connections,
            "idle_connections_open_s": _seconds(opened_s),
            "idle_connections_still_open": still_open,
            "rss_per_connection_kb": round(per_connection, 2),
        })

    # 8 ---------------------------------------------------------------------------------
    async def phase_group(self) -> None:
        from strata.client import AsyncConsumer

        o = self.options
        members, partitions = o.group_members, o.group_partitions
        topic, group = f"{self.prefix}-group", f"{self.prefix}-group"
        await self.create([topic], {topic: partitions})
        await self.wait_led([(topic, p) for p in range(partitions)],
                            f"every partition of {topic} to have a leader")
        if o.group_processes > 1:
            await self.group_in_processes(topic, group)
            return
        self.log(f"{members} consumers in group {group} on {partitions} partitions")
        pids = _broker_pids(self.stack.data_dir)
        brokers_cpu = _brokers_cpu_seconds(pids)
        consumers = [AsyncConsumer(self.stack.bootstrap, group_id=group,
                                   client_id=f"strata-perf-scale-{i}",
                                   enable_auto_commit=False) for i in range(members)]
        stops = [asyncio.Event() for _ in consumers]
        tasks: list[asyncio.Task[None]] = []

        async def member(consumer: Any, stop: asyncio.Event) -> None:
            while not stop.is_set():
                await consumer.poll(timeout_ms=100)

        def balanced(active: Sequence[Any]) -> bool:
            cap = math.ceil(partitions / len(active))
            owned = [c.assignment() for c in active]
            return all(len(a) <= cap for a in owned) \
                and sum(len(a) for a in owned) == partitions \
                and set().union(*owned) == {(topic, p) for p in range(partitions)}

        async def until_balanced(active: Sequence[Any], what: str) -> float:
            deadline = time.perf_counter() + o.timeout
            while not balanced(active):
                for t in tasks:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        raise ScaleError(f"a group member failed: {t.exception()!r}")
                if time.perf_counter() > deadline:
                    sizes = sorted(len(c.assignment()) for c in active)
                    raise ScaleError(f"timed out after {o.timeout:.0f} s waiting for {what}: "
                                     f"members own {sizes} partitions")
                await asyncio.sleep(0.02)
            return time.perf_counter()

        cpu_began, wall_began = _cpu_seconds(), time.perf_counter()
        leave_s: float | None = None
        try:
            for consumer, stop in zip(consumers, stops, strict=True):
                subscribed = time.perf_counter()
                consumer.subscribe([topic])
                tasks.append(asyncio.create_task(member(consumer, stop)))
            balanced_at = await until_balanced(consumers, f"{members} members to balance "
                                               f"{partitions} partitions")
            broker_cpu = _brokers_cpu_seconds(pids) - brokers_cpu
            self.log(f"  balanced {balanced_at - subscribed:.2f} s after the last subscribe")
            if members > 1:
                leaving = time.perf_counter()
                stops[0].set()
                await _within(tasks[0], o.timeout, "the leaving member's last poll")
                await _within(consumers[0].close(), o.timeout,
                              "the leaving member's close (leave the group)")
                again = await until_balanced(consumers[1:], f"{members - 1} members to "
                                             f"balance {partitions} partitions after one left")
                leave_s = again - leaving
                self.log(f"  one member left: balanced again after {leave_s:.2f} s")
        finally:
            for stop in stops:
                stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(asyncio.wait_for(c.close(), o.timeout) for c in consumers),
                                 return_exceptions=True)
        cpu = _cpu_seconds() - cpu_began
        wall = time.perf_counter() - wall_began
        self.result.update({
            "group_members": members,
            "group_partitions": partitions,
            "group_balance_s": _seconds(balanced_at - subscribed),
            "group_rebalance_after_leave_s": None if leave_s is None else _seconds(leave_s),
            "group_client_cpu_s": _seconds(cpu),
            "group_client_wall_s": _seconds(wall),
            "group_client_cpu_bound": cpu > 0.9 * wall,
            "group_processes": 1,
            "group_broker_cpu_s": _seconds(broker_cpu),
        })

    async def group_in_processes(self, topic: str, group: str) -> None:
        """The group phase with the members spread over ``--group-processes`` worker
        processes (``strata_tools.perf_scale_group``), each reporting its members'
        assignments; balanced means the same as in one process."""
        o = self.options
        members, partitions, processes = o.group_members, o.group_partitions, \
            min(o.group_processes, o.group_members)
        shares = [members // processes + (1 if i < members % processes else 0)
                  for i in range(processes)]
        self.log(f"{members} consumers in group {group} on {partitions} partitions, in "
                 f"{processes} processes")
        owned: list[dict[str, list[int]]] = [{} for _ in shares]
        subscribed: list[float] = []
        errors: list[str] = []
        workers: list[asyncio.subprocess.Process] = []
        readers: list[asyncio.Task[None]] = []

        async def read(i: int, worker: asyncio.subprocess.Process) -> None:
            assert worker.stdout is not None
            async for line in worker.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("ev") == "owned":
                    owned[i] = event["owned"]
                elif event.get("ev") == "subscribed":
                    subscribed.append(float(event["t"]))
                elif event.get("ev") == "error":
                    errors.append(str(event.get("message")))

        def balanced(expected: int) -> bool:
            lists = [p for share in owned for p in share.values()]
            if len(lists) != expected:
                return False
            cap = math.ceil(partitions / expected)
            flat = [p for ps in lists for p in ps]
            return all(len(ps) <= cap for ps in lists) and len(flat) == partitions \
                and set(flat) == set(range(partitions))

        async def until_balanced(expected: int, what: str) -> float:
            deadline = time.perf_counter() + o.timeout
            while not balanced(expected):
                if errors:
                    raise ScaleError(f"a group member failed: {errors[0]}")
                for worker in workers:
                    if worker.returncode is not None:
                        raise ScaleError(f"a group worker process exited ({worker.returncode})")
                if time.perf_counter() > deadline:
                    sizes = sorted(len(ps) for share in owned for ps in share.values())
                    raise ScaleError(f"timed out after {o.timeout:.0f} s waiting for {what}: "
                                     f"members own {sizes} partitions")
                await asyncio.sleep(0.02)
            return time.time()

        children_before = _children_cpu_seconds()
        pids = _broker_pids(self.stack.data_dir)
        brokers_before = _brokers_cpu_seconds(pids)
        wall_began = time.perf_counter()
        leave_s: float | None = None
        try:
            for i, share in enumerate(shares):
                worker = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "strata_tools.perf_scale_group", "worker",
                    "--bootstrap", self.stack.bootstrap, "--topic", topic, "--group", group,
                    "--name", f"w{i}", "--members", str(share),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL)
                workers.append(worker)
                readers.append(asyncio.create_task(read(i, worker)))
            balanced_at = await until_balanced(members, f"{members} members in {processes} "
                                               f"processes to balance {partitions} partitions")
            broker_cpu = _brokers_cpu_seconds(pids) - brokers_before
            last_subscribe = max(subscribed)
            self.log(f"  balanced {balanced_at - last_subscribe:.2f} s after the last "
                     f"subscribe; the brokers used {broker_cpu:.1f} s of CPU meanwhile")
            if members > 1:
                leaving = time.time()
                assert workers[0].stdin is not None
                workers[0].stdin.write(b"leave\n")
                await workers[0].stdin.drain()
                again = await until_balanced(members - 1, f"{members - 1} members to balance "
                                             f"{partitions} partitions after one left")
                leave_s = again - leaving
                self.log(f"  one member left: balanced again after {leave_s:.2f} s")
        finally:
            for worker in workers:
                if worker.returncode is None and worker.stdin is not None:
                    with contextlib.suppress(OSError):
                        worker.stdin.write(b"stop\n")
                        worker.stdin.close()
            for worker in workers:
                try:
                    await asyncio.wait_for(worker.wait(), 60)
                except TimeoutError:
                    worker.kill()  # our own child, not yet reaped: its PID is its own
                    await worker.wait()
            await asyncio.gather(*readers, return_exceptions=True)
        wall = time.perf_counter() - wall_began
        self.result.update({
            "group_members": members,
            "group_partitions": partitions,
            "group_processes": processes,
            "group_balance_s": _seconds(balanced_at - last_subscribe),
            "group_rebalance_after_leave_s": None if leave_s is None else _seconds(leave_s),
            "group_client_cpu_s": _seconds(_children_cpu_seconds() - children_before),
            "group_client_wall_s": _seconds(wall),
            "group_client_cpu_bound": False,  # the members have processes of their own
            "group_broker_cpu_s": _seconds(broker_cpu),
        })

    async def delete_created(self) -> None:
        from strata.client import StrataError

        if not self.created or self.options.keep_topics or self.stack.started:
            return
        self.log(f"deleting the {len(self.created)} topics this run created")
        try:
            async with self.admin() as admin:
                for i in range(0, len(self.created), 100):
                    await asyncio.wait_for(admin.delete_topics(
                        self.created[i:i + 100], raise_errors=False), self.options.timeout)
        except (StrataError, OSError, TimeoutError) as err:
            self.log(f"could not delete them ({err}); delete the topics named "
                     f"{self.prefix}-* with `strata topic delete`")


class _Background:
    """Writes ``rate`` records/s round-robin over ``keys`` and remembers each outcome."""

    def __init__(self, keys: Sequence[Key], rate: int, payload: bytes) -> None:
        self.keys = keys
        self.rate = rate
        self.payload = payload
        self.sent: list[float] = []  # perf_counter time of each send
        self.failed: list[tuple[float, str]] = []  # (send time, error)
        self.pending: set[asyncio.Future[Any]] = set()

    async def run(self, producer: Any, stop: asyncio.Event) -> None:
        from strata.client import StrataError

        began = time.perf_counter()
        i = 0
        while not stop.is_set():
            due = int((time.perf_counter() - began) * self.rate) + 1
            while i < due and not stop.is_set():
                topic, partition = self.keys[i % len(self.keys)]
                now = time.perf_counter()
                self.sent.append(now)
                i += 1
                try:
                    future = await producer.send(topic, self.payload, partition=partition)
                except StrataError as err:
                    self.failed.append((now, str(err)))
                    continue
                self.pending.add(future)
                future.add_done_callback(lambda f, t=now: self._done(t, f))
            await asyncio.sleep(0.005)

    def _done(self, sent_at: float, future: asyncio.Future[Any]) -> None:
        self.pending.discard(future)
        if future.cancelled():
            self.failed.append((sent_at, "cancelled"))
        elif future.exception() is not None:
            self.failed.append((sent_at, str(future.exception())))

    async def settled(self, timeout: float) -> None:
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=timeout)
        if self.pending:
            raise ScaleError(f"{len(self.pending)} background records had no outcome "
                             f"{timeout:.0f} s after the producer's flush")

    def window(self, start: float, end: float) -> tuple[int, int, str | None]:
        """Records sent in [start, end], how many of them failed, the first error."""
        failed = sorted((t, e) for t, e in self.failed if start <= t <= end)
        return (sum(1 for t in self.sent if start <= t <= end), len(failed),
                failed[0][1] if failed else None)


def _last_line(path: Path, containing: str) -> str | None:
    """The last line of ``path`` containing ``containing`` (a broker's own account of a
    step, e.g. how long each part of its stop took), without its timestamp prefix."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 1_000_000))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines()
                     if containing in line]
    except OSError:
        return None
    return lines[-1].split(": ", 1)[-1] if lines else None


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _broker_pids(data_dir: Path) -> list[int]:
    return [pid for pid, _ in _brokers(data_dir).values()]


def _brokers_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) the broker processes ``pids`` have used so far (the
    pids are looked up once per phase: the stack's status probes a broker, which a
    loaded machine may not answer in time)."""
    from strata_tools.perf_cpu import broker_cpu_seconds

    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # a broker that exited counts no more
            total += broker_cpu_seconds(pid)
    return total


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _raise_nofile(needed: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit (enough for ``needed``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ScaleError(f"this process may open at most {hard} files (hard RLIMIT_NOFILE) "
                         f"but the idle connections need about {needed}: lower "
                         "--idle-connections or raise the limit (`ulimit -Hn`, as root)")
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the benchmark ------------------------------------------------------------------------


async def _bench(stack: _Stack, options: ScaleOptions, log: Log) -> dict[str, Any]:
    from strata.client import StrataError

    run = _Run(stack, options, log)
    skip = options.skip | ({"group"} if options.group_members <= 0 else set())
    phases: list[tuple[str, Callable[[], Awaitable[None]], tuple[str, ...]]] = [
        ("produce", run.phase_produce, ("produce_metadata_s", "produce_one_each_s")),
        ("controlled-shutdown", run.phase_controlled_shutdown,
         ("controlled_shutdown_s", "controlled_shutdown_exit_s",
          "controlled_shutdown_requests", "controlled_shutdown_failed_requests")),
        ("sigkill-controller", run.phase_sigkill_controller, ("sigkill_controller_s",)),
        ("restart", run.phase_restart, ("full_restart_s", "full_restart_writable_s")),
        ("resources", run.phase_resources, ("broker_rss_mb", "broker_open_files")),
        ("idle-connections", run.phase_idle_connections,
         ("produce_p50_ms_with_idle_connections", "produce_p99_ms_with_idle_connections",
          "rss_per_connection_kb")),
        ("group", run.phase_group, ("group_balance_s", "group_rebalance_after_leave_s")),
    ]
    run.result.update({"topics": options.topics, "partitions": options.partitions,
                       "brokers": len(_brokers(stack.data_dir)),
                       "replication_factor": REPLICATION_FACTOR, "topic_prefix": run.prefix})
    current = "create"
    try:
        await run.connect()
        await run.phase_create()
        for current, phase, keys in phases:
            if current in skip:
                run.result.update(dict.fromkeys(keys))
                continue
            await phase()
    except ScaleError as err:
        err.result = run.result
        raise
    except (StrataError, OSError) as err:  # a client or system call gave up
        failed = ScaleError(f"phase {current}: {err}")
        failed.result = run.result
        raise failed from err
    finally:
        try:
            await run.delete_created()
        finally:
            await run.disconnect()
    run.result["skipped"] = [name for name, _, _ in phases if name in skip]
    return run.result


def bench_scale(options: ScaleOptions, *, data_dir: str | None = None,
                base_port: int | None = None, brokers: int = 3,
                log: Log = lambda _line: None) -> dict[str, Any]:
    """Run every phase not in ``options.skip`` (see the module docstring); the figures."""
    options.check()
    kazoo_log = logging.getLogger("kazoo")
    producer_log = logging.getLogger("strata.client.producer")
    levels = kazoo_log.level, producer_log.level
    # Connection losses during the restarts, and every record that fails for good (the
    # benchmark counts them), would bury the progress lines.
    kazoo_log.setLevel(logging.ERROR)
    producer_log.setLevel(logging.ERROR)
    try:
        stack = _open_stack(data_dir, base_port, brokers, log)
        try:
            result = asyncio.run(_bench(stack, options, log))
        except BaseException:
            try:
                _close_stack(stack, log)
            except ScaleError as err:  # the first error is the one to report
                log(f"also: {err}")
            raise
        _close_stack(stack, log)
        return result
    finally:
        kazoo_log.setLevel(levels[0])
        producer_log.setLevel(levels[1])


# -- command line -------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _phases(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = names - set(PHASES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown phase(s) {', '.join(sorted(unknown))}; "
                                         f"choose from {', '.join(PHASES)}")
    return names


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ScaleOptions()
    parser.add_argument("--data-dir", default=None,
                        help="a running stack's data dir to measure (left running; the "
                        "topics this run creates are deleted again), or an empty dir to start "
                        "the stack in (default: a stack of its own in a temp dir; a stack "
                        "this command starts, it stops)")
    parser.add_argument("--base-port", type=int, default=None,
                        help="base port of the stack it starts (default: a free one)")
    parser.add_argument("--brokers", type=_positive, default=3,
                        help="brokers of the stack it starts (default 3)")
    parser.add_argument("--topics", type=_positive, default=defaults.topics,
                        help=f"topics to create (default {defaults.topics})")
    parser.add_argument("--partitions", type=_positive, default=defaults.partitions,
                        help="partitions in total, spread evenly over the topics "
                        f"(default {defaults.partitions})")
    parser.add_argument("--idle-connections", type=_positive,
                        default=defaults.idle_connections,
                        help=f"idle client connections (default {defaults.idle_connections})")
    parser.add_argument("--produce-rate", type=_positive, default=defaults.produce_rate,
                        help="records/s of the latency measurements "
                        f"(default {defaults.produce_rate})")
    parser.add_argument("--produce-seconds", type=_positive_float,
                        default=defaults.produce_seconds,
                        help="length of each latency measurement "
                        f"(default {defaults.produce_seconds:g})")
    parser.add_argument("--latency-partitions", type=_positive,
                        default=defaults.latency_partitions,
                        help="partitions of the latency topic "
                        f"(default {defaults.latency_partitions})")
    parser.add_argument("--background-rate", type=_positive, default=defaults.background_rate,
                        help="records/s written during the controlled shutdown "
                        f"(default {defaults.background_rate})")
    parser.add_argument("--group-members", type=_count, default=defaults.group_members,
                        help="consumers of the group phase (default 0: skip it)")
    parser.add_argument("--group-partitions", type=_positive,
                        default=defaults.group_partitions,
                        help="partitions of the group phase's topic "
                        f"(default {defaults.group_partitions})")
    parser.add_argument("--group-processes", type=_positive,
                        default=defaults.group_processes,
                        help="processes the group members are spread over (default 1: all "
                        "in this one)")
    parser.add_argument("--record-size", type=_positive, default=defaults.record_size)
    parser.add_argument("--timeout", type=_positive_float, default=defaults.timeout,
                        help="seconds any single wait may take before the run fails "
                        f"(default {defaults.timeout:g})")
    parser.add_argument("--skip", type=_phases, default=frozenset(),
                        metavar="PHASE[,PHASE...]",
                        help=f"phases to leave out: {', '.join(PHASES)}")
    parser.add_argument("--format", choices=("json", "user-path"), default="json",
                        help="json: every figure (default); user-path: the table of the "
                        "user's commands (issue [3.4]), clients' view beside ZooKeeper's")
    parser.add_argument("--keep-topics", action="store_true",
                        help="on a running stack given with --data-dir, keep the topics")


#: The rows of issue [3.4]'s table: (what, JSON key, target in seconds or None).
USER_PATH_ROWS: tuple[tuple[str, str, str], ...] = (
    ("create (groups of 10 topics) + every partition led (clients' metadata)",
     "create_all_led_clients_s", "<= 10 s"),
    ("one acks=all record to each new partition (one `Producer`, `send` + `result`)",
     "produce_one_each_user_s", "<= 3 s"),
    ("SIGTERM of a broker -> no partition led by it (clients' metadata)",
     "controlled_shutdown_clients_s", "<= 3 s"),
    ("failed sends meanwhile (acks=all, SIGTERM to exit)",
     "controlled_shutdown_failed_requests", "0"),
    ("SIGTERM -> the process has exited", "controlled_shutdown_exit_s", "<= 10 s"),
    ("`strata up` bringing that broker back -> it answers (from its exit)",
     "controlled_shutdown_restart_s", "<= 10 s"),
    ("SIGKILL of the controller's broker -> all led again (clients' metadata)",
     "sigkill_controller_clients_s", "<= 8 s"),
    ("`strata down`, `strata up` -> every partition led (clients' metadata)",
     "full_restart_clients_s", "<= 30 s"),
    ("`strata down`, `strata up` -> every partition took a write",
     "full_restart_writable_s", ""),
    ("broker memory (RSS, MB, per broker)", "broker_rss_mb", ""),
)


def user_path_table(result: dict[str, Any]) -> str:
    """Issue [3.4]'s table (Markdown) from a run's figures, with the ZooKeeper figure
    beside each clients' one where there is one."""
    zookeeper = {"create_all_led_clients_s": "create_all_leaders_s",
                 "controlled_shutdown_clients_s": "controlled_shutdown_s",
                 "sigkill_controller_clients_s": "sigkill_controller_s",
                 "full_restart_clients_s": "full_restart_s"}
    lines = [f"{result.get('partitions')} partitions in {result.get('topics')} topics, RF "
             f"{result.get('replication_factor')}, {result.get('brokers')} brokers", "",
             "| | measured | in ZooKeeper | target |", "|---|---:|---:|---:|"]
    for what, key, target in USER_PATH_ROWS:
        value = result.get(key)
        if isinstance(value, dict):
            shown = ", ".join(f"{v:g}" for v in value.values())
        elif value is None:
            shown = "skipped"
        else:
            shown = f"{value:g}" + (" s" if key.endswith("_s") else "")
        beside = result.get(zookeeper.get(key, ""), "")
        beside_text = f"{beside:g} s" if isinstance(beside, int | float) else ""
        lines.append(f"| {what} | {shown} | {beside_text} | {target} |")
    return "\n".join(lines)


def run_scale(args: argparse.Namespace) -> int:
    options = ScaleOptions(
        topics=args.topics, partitions=args.partitions, idle_connections=args.idle_connections,
        produce_rate=args.produce_rate, produce_seconds=args.produce_seconds,
        latency_partitions=args.latency_partitions, background_rate=args.background_rate,
        group_members=args.group_members, group_partitions=args.group_partitions,
        group_processes=args.group_processes,
        record_size=args.record_size, timeout=args.timeout, skip=args.skip,
        keep_topics=args.keep_topics)
    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:7.1f} s] {line}", file=sys.stderr, flush=True)

    # SIGTERM unwinds like Ctrl-C, so a stack this run started is stopped either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = bench_scale(options, data_dir=args.data_dir, base_port=args.base_port,
                             brokers=args.brokers, log=log)
    except ScaleError as err:
        print(f"strata perf scale: {err}", file=sys.stderr)
        if err.result:  # what was measured before it failed, and why it stopped
            print(json.dumps({**err.result, "error": str(err)}))
        return 1
    print(user_path_table(result) if args.format == "user-path" else json.dumps(result))
    return 0
