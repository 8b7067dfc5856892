"""Consumer groups under faults (issue [2.1] section 2): member processes, a nemesis, a checker.

A real cluster (tests/support/cluster.py: ZooKeeper and 3 brokers), a topic of 8
partitions with replication factor 3 and ``min.insync.replicas=2``, and two idempotent
``acks=all`` producers writing keyed records at a fixed rate (tests/support/nemesis.py's
``Workload``). Two consumer groups read it, each member a process of its own
(tests/support/group_member.py: the real ``Consumer`` with ``group_id``, ``subscribe()``,
``on_assign`` / ``on_revoke`` / ``on_lost``, and auto-commit, synchronous or asynchronous
commits, picked at random per member) logging every delivery, commit and assignment
change to a file of its own. Each group's first member starts alone and owns every
partition before the others join, so cooperative-sticky revokes some from it while it
keeps the rest.

Half the members (at random) also print every record to stdout, a real pipe (one page
of buffer) that a harness thread drains in small steps, as ``strata consume ... |
slow-program`` would: their application blocks in a print whenever the pipe is full.

Then a nemesis, in an order and with victims drawn from a seeded random generator
(printed; ``STRATA_SEED=N`` replays it), does each of: a member joins; a member leaves
(SIGTERM); a member is SIGKILLed; a member is SIGSTOPped past its session timeout and
SIGCONTed; a member's application gets stuck on a record (its thread sleeps while its
heartbeats go on) and a printing member's reader stops reading, each for longer than
``max_poll_interval_ms`` (issue [3.1]: the member must leave, its partitions move, its
late commit is refused); the broker coordinating a group is SIGKILLed and restarted.
Every group keeps at least one live member, and more member processes than the
machine's two cores run at once throughout. An Admin client samples every group's
committed offsets once a second.

After the producers stop, the members that remain drain the topic; then the checker
(tests/support/group_checker.py, a pure function over the logs) reports per group: lost
acknowledged records, deliveries out of offset order or of partitions not owned,
committed offsets moving backwards, partitions owned by a live member (or by nobody)
that went unfetched with lag for longer than the session or poll timeout + 5 s (a member
whose application is not polling counts as not live), commits a member made after it
had left the group for not polling, and members that crashed. Every violation is
printed with its group, partition, member and time span.

``STRATA_SOAK_SECONDS=N`` (``make soak``) repeats rounds of those faults for N seconds.
The logs (with the brokers' output) stay in the test's temp dir, printed at the start;
``python -m tests.support.group_checker DIR`` checks them again. pytest keeps only its
last three temp dirs, so pass ``--basetemp DIR`` to keep a run's logs for longer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import pid_alive
from strata.client import Admin
from tests.support.broker_process import REPO
from tests.support.cluster import Cluster
from tests.support.group_checker import MemberLog, OffsetSampler, check, load
from tests.support.nemesis import Workload, soak_seconds

BROKERS = 3
PARTITIONS = 8
REPLICATION_FACTOR = 3
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
#: Member session timeout; the checker allows it + 5 s without a fetch.
SESSION_MS = 6000
#: Members' max_poll_interval_ms (not above SESSION_MS: the checker's limit is the larger).
MAX_POLL_MS = 5000
#: How long a stuck application or a blocked output lasts: well past MAX_POLL_MS, and past
#: the checker's limit, so a member that kept its partitions would be an ORPHAN.
STUCK_S = 14.0
#: First members of each group, then how many more join each (staggered) at the start.
GROUPS = {"ga": 3, "gb": 2}
#: Upper bound on member processes alive at once (joins are skipped above it).
MAX_MEMBERS = 7
PRODUCERS, RATE = 2, 50.0  # records/s per producer
FAULTS = ("join", "leave", "kill-member", "pause-member", "stall-member", "block-output",
          "kill-coordinator")
#: How long a member asked to leave may take: its last commit and close() may each wait
#: up to the client's 30 s request timeout; longer is a hang (reported as EXIT).
LEAVE_TIMEOUT_S = 70.0

pytestmark = [pytest.mark.system, pytest.mark.timeout(300 + 1.5 * soak_seconds())]


def _seed() -> int:
    raw = os.environ.get("STRATA_SEED", "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(2**31)


class SlowReader:
    """Drains a member's stdout pipe in small steps (``strata consume ... | slow-program``);
    ``block(seconds)`` stops reading for a while. The pipe holds one page, so the member
    blocks in its print whenever the reader lags."""

    STEP = 1024  # bytes per read
    PAUSE_S = 0.01  # between reads: about 100 KB/s, above the members' output rate

    def __init__(self, pipe: Any) -> None:
        self.fd = pipe.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, 4096)
        self.blocked_until = 0.0
        self.bytes = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="slow-reader")
        self._thread.start()

    def block(self, seconds: float) -> None:
        self.blocked_until = time.monotonic() + seconds

    def _run(self) -> None:
        while True:
            wait = self.blocked_until - time.monotonic()
            time.sleep(max(wait, self.PAUSE_S))
            try:
                data = os.read(self.fd, self.STEP)
            except OSError:
                return
            if not data:
                return  # the member exited
            self.bytes += len(data)


class Member(MemberLog):
    """One member process (tests/support/group_member.py) and what its log says so far."""

    def __init__(self, name: str, group: str, mode: str, log: Path,
                 process: subprocess.Popen[bytes], reader: SlowReader | None) -> None:
        super().__init__(log)
        self.name, self.group, self.mode = name, group, mode
        self.process = process
        self.reader = reader
        self.state = "running"  # running | paused | stopping | gone

    @property
    def live(self) -> bool:
        return self.state == "running"


class Harness:
    """The cluster, the members, the nemesis's own log; see the module docstring."""

    def __init__(self, directory: Path, cluster: Cluster, topic: str, seed: int) -> None:
        self.dir, self.cluster, self.topic, self.seed = directory, cluster, topic, seed
        self.rng = random.Random(seed)
        (directory / "members").mkdir(parents=True)
        self._log = (directory / "harness.jsonl").open("a")
        self.members: dict[str, Member] = {}
        self._next: dict[str, int] = dict.fromkeys(GROUPS, 0)
        self.done: list[str] = []
        self.most_at_once = 0
        # The cluster's clock, so the checker's +seconds match the harness's log lines.
        self.t0 = getattr(cluster, "_t0", time.monotonic())
        self.event("meta", topic=topic, partitions=PARTITIONS,
                   session_timeout_s=SESSION_MS / 1000,
                   max_poll_interval_s=MAX_POLL_MS / 1000, t0=self.t0, seed=seed)

    def event(self, ev: str, **fields: Any) -> None:
        self._log.write(json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n")
        self._log.flush()

    def note(self, text: str) -> None:
        self.cluster.log(text)

    # ------------------------------------------------------------------ members
    def start(self, group: str, echo: bool | None = None) -> Member:
        index = self._next[group]
        self._next[group] += 1
        name = f"{group}-m{index}"
        mode = self.rng.choice(["auto", "sync", "async"])
        drawn = self.rng.random() < 0.5
        echo = drawn if echo is None else echo
        log = self.dir / "members" / f"{name}.jsonl"
        with (self.dir / "members" / f"{name}.err").open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.group_member",
                 "--bootstrap", self.cluster.bootstrap, "--group", group, "--topic",
                 self.topic, "--member", name, "--log", str(log), "--commit", mode,
                 "--session-timeout-ms", str(SESSION_MS),
                 "--max-poll-interval-ms", str(MAX_POLL_MS), "--stall-s", str(STUCK_S),
                 *(["--echo"] if echo else [])],
                cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if echo else subprocess.DEVNULL, stderr=err,
                start_new_session=True)
        reader = SlowReader(process.stdout) if echo else None
        member = Member(name, group, mode, log, process, reader)
        self.members[name] = member
        self.event("member-start", m=name, g=group, mode=mode, pid=process.pid, echo=echo)
        self.note(f"start {name} (pid {process.pid}, {mode} commits"
                  f"{', prints to a slow pipe' if echo else ''})")
        self.most_at_once = max(self.most_at_once, len(self.running()))
        return member

    def running(self) -> list[Member]:
        return [m for m in self.members.values() if m.state != "gone"]

    def live(self, group: str) -> list[Member]:
        return [m for m in self.members.values() if m.group == group and m.live]

    def stop(self, member: Member, wait: bool = True) -> None:
        """SIGTERM: the member commits, runs on_revoke and leaves the group."""
        self.event("member-stop", m=member.name)
        self.note(f"SIGTERM {member.name}")
        member.state = "stopping"
        member.process.send_signal(signal.SIGTERM)
        if wait:
            self.reap(member, LEAVE_TIMEOUT_S)

    def reap(self, member: Member, timeout: float) -> None:
        """Wait for a stopping member's exit; SIGKILL it (recorded) if it hangs."""
        try:
            code = member.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.note(f"{member.name} did not exit {timeout:.0f}s after SIGTERM: SIGKILL")
            member.process.kill()
            code = member.process.wait(10)
        self.event("member-exit", m=member.name, code=code)
        member.state = "gone"

    def kill(self, member: Member) -> None:
        self.event("member-kill", m=member.name)
        self.note(f"SIGKILL {member.name}")
        member.process.kill()  # our own un-reaped child: the PID is still this process
        member.process.wait(10)
        member.state = "gone"
        self.event("member-exit", m=member.name, code=member.process.returncode)

    def pause(self, member: Member) -> None:
        self.event("member-pause", m=member.name)
        self.note(f"SIGSTOP {member.name}")
        member.process.send_signal(signal.SIGSTOP)
        member.state = "paused"

    def stall(self, member: Member) -> None:
        """SIGUSR1: the member's application gets stuck on its next records (a sleep of
        STUCK_S) while its heartbeats go on."""
        self.event("member-stall", m=member.name, s=STUCK_S)
        self.note(f"SIGUSR1 {member.name}: its application is stuck for {STUCK_S:.0f}s")
        member.process.send_signal(signal.SIGUSR1)

    def block_output(self, member: Member) -> None:
        """The member's reader stops reading its stdout for STUCK_S."""
        assert member.reader is not None
        self.event("member-output-blocked", m=member.name, s=STUCK_S)
        self.note(f"{member.name}'s stdout is not read for {STUCK_S:.0f}s")
        member.reader.block(STUCK_S)

    def resume(self, member: Member) -> None:
        member.process.send_signal(signal.SIGCONT)
        member.state = "running"
        self.event("member-resume", m=member.name)
        self.note(f"SIGCONT {member.name}")

    def watch(self) -> None:
        """Read the members' logs; record members that exited by themselves."""
        for member in self.members.values():
            member.refresh()
            if member.state in ("running", "paused") and member.process.poll() is not None:
                self.event("member-exit", m=member.name, code=member.process.returncode)
                self.note(f"{member.name} exited by itself: {member.process.returncode}")
                member.state = "gone"

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.watch()
            time.sleep(min(0.2, left))
        self.watch()

    def settled(self) -> bool:
        """Every group's live members own every partition between them, once each, and
        each owns some (a newcomer has its share)."""
        self.watch()
        for group in GROUPS:
            owned = [m.owned for m in self.live(group)]
            if sum(map(len, owned)) != PARTITIONS or not all(owned) or \
                    set().union(*owned) != set(range(PARTITIONS)):
                return False
        return True

    def wait_settled(self, what: str, timeout: float = 30.0) -> None:
        """Until settled; if not within ``timeout``, note it and go on (the checker
        judges stalls; the nemesis must not hang)."""
        deadline = time.monotonic() + timeout
        while not self.settled():
            if time.monotonic() > deadline:
                self.note(f"not settled {timeout:.0f}s after {what}: " + "; ".join(
                    f"{m.name} owns {sorted(m.owned)}" for m in self.running()))
                return
            time.sleep(0.2)

    def delivered(self, group: str) -> set[tuple[int, int]]:
        out: set[tuple[int, int]] = set()
        for member in self.members.values():
            if member.group == group:
                out |= member.delivered
        return out

    def close(self) -> None:
        """Kill whatever member still runs (by its own Popen handle)."""
        for member in self.members.values():
            if member.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    member.process.send_signal(signal.SIGCONT)
                member.process.kill()
                member.process.wait(10)
        self._log.close()

    # ------------------------------------------------------------------ nemesis
    def _victim(self, group: str, echo: bool = False) -> Member:
        """A live member of ``group`` that owns something (and prints to a pipe, with
        ``echo``); a newcomer joins first if it is the group's only live member, so the
        group never runs out of members."""
        if len(self.live(group)) < 2:
            self.start(group)
            self.wait_settled(f"a member joined {group} before a fault")
        candidates = [m for m in self.live(group) if m.owned and
                      (m.reader is not None or not echo)]
        if not candidates and echo:
            self.start(group, echo=True)
            self.wait_settled(f"a printing member joined {group} before a fault")
            candidates = [m for m in self.live(group) if m.owned and m.reader is not None]
        candidates = candidates or self.live(group)
        return self.rng.choice(sorted(candidates, key=lambda m: m.name))

    def fault(self, kind: str, admin: Admin) -> None:
        group = self.rng.choice(sorted(GROUPS))
        if kind == "join":
            if len(self.running()) >= MAX_MEMBERS:
                self.note(f"{MAX_MEMBERS} members run already: a member of {group} leaves "
                          "instead of joining")
                kind = "leave"
            else:
                self.start(group)
        if kind == "leave":
            self.stop(self._victim(group))
        elif kind == "kill-member":
            self.kill(self._victim(group))
        elif kind == "pause-member":
            victim = self._victim(group)
            self.pause(victim)
            self.sleep(SESSION_MS / 1000 + 2.0)
            self.resume(victim)
        elif kind in ("stall-member", "block-output"):
            victim = self._victim(group, echo=kind == "block-output")
            if kind == "stall-member":
                self.stall(victim)
            elif victim.reader is not None:
                self.block_output(victim)
            self.sleep(STUCK_S + 2.0)
        elif kind == "kill-coordinator":
            broker = admin.find_coordinator(group).node_id
            self.note(f"coordinator of {group} is broker {broker}")
            self.event("broker-kill", broker=broker, group=group)
            self.cluster.kill(broker)
            self.sleep(self.rng.uniform(1.0, 4.0))
            self.cluster.restart(broker)
            self.cluster.wait_until_healthy(self.topic, timeout=90)
            self.cluster.wait_until_healthy("__consumer_offsets", timeout=60)
            self.event("broker-healthy", broker=broker)
        self.done.append(kind)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", BROKERS, overrides={
        "offsets.topic.num.partitions": "4", "group.lag.interval.ms": "1000"})
    c.start()
    try:
        yield c
    finally:
        pids = c.pids()
        c.close()
        assert not [pid for pid in pids if pid_alive(pid)], "a cluster process survived"


def _write(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _run_faults(h: Harness, admin: Admin) -> None:
    soak = soak_seconds()
    started = time.monotonic()
    rounds = 0
    while rounds == 0 or time.monotonic() - started < soak:
        faults = list(FAULTS)
        h.rng.shuffle(faults)
        for kind in faults:
            h.wait_settled(f"the fault before {kind}")
            h.note(f"fault: {kind}")
            h.fault(kind, admin)
            h.sleep(h.rng.uniform(1.0, 3.0))
        rounds += 1


def test_groups_under_faults(cluster: Cluster, tmp_path: Path) -> None:
    seed = _seed()
    print(f"\ngroup fault test: seed {seed} (replay: STRATA_SEED={seed}); logs in "
          f"{tmp_path / 'logs'}", flush=True)
    topic = f"groups-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, REPLICATION_FACTOR, TOPIC_CONFIGS)
    cluster.wait_until_healthy(topic, timeout=60)
    h = Harness(tmp_path / "logs", cluster, topic, seed)
    workload = Workload(cluster.bootstrap, topic, PARTITIONS, producers=PRODUCERS, rate=RATE,
                        keys=256)
    sampler = OffsetSampler(cluster.bootstrap, sorted(GROUPS))
    stopped_workload = False
    try:
        sampler.start()
        # Each group's first member owns everything before the others join, so the
        # cooperative rebalance revokes some partitions from it and it keeps the rest
        # (on an empty topic, its fetches waiting in the brokers' long polls); then the
        # producers start.
        for group in GROUPS:
            first = h.start(group)
            deadline = time.monotonic() + 40
            while len(first.owned) < PARTITIONS and time.monotonic() < deadline:
                h.sleep(0.2)
        for group, count in GROUPS.items():
            for _ in range(count - 1):
                h.start(group)
                h.sleep(h.rng.uniform(0.2, 1.0))
        h.wait_settled("the start")
        workload.start()
        workload.wait_for_acks(5, since=0.0, partitions=range(PARTITIONS), timeout=30)
        with Admin(cluster.bootstrap, request_timeout_ms=10_000) as admin:
            _run_faults(h, admin)
        h.wait_settled("the last fault")
        # The drain: producers stop, the remaining members read to the end.
        for member in h.members.values():
            if member.state == "paused":
                h.resume(member)
        workload.stop(30)
        stopped_workload = True
        acked = {(o.partition, o.offset) for o in workload.snapshot() if o.offset is not None}
        limit = SESSION_MS / 1000 + 5.0
        deadline = time.monotonic() + limit + 10.0
        while time.monotonic() < deadline:
            h.watch()
            if all(acked <= h.delivered(group) for group in GROUPS):
                break
            time.sleep(0.2)
        h.event("end")
        h.note("drained" if all(acked <= h.delivered(g) for g in GROUPS)
               else "drain incomplete: the checker says what is missing")
        running = h.running()
        for member in running:
            if member.state == "running":
                h.stop(member, wait=False)
        for member in running:
            if member.state == "stopping":
                h.reap(member, LEAVE_TIMEOUT_S)
    finally:
        if not stopped_workload:
            with contextlib.suppress(Exception):
                workload.stop(10)
        sampler.stop()
        h.close()
    _write(h.dir / "records.jsonl", (
        {"p": o.partition, "v": workload.value(o.producer, o.seq).decode(), "o": o.offset,
         "t": o.acked_at} for o in workload.snapshot()))
    _write(h.dir / "samples.jsonl", sampler.samples)
    for broker_id in cluster.brokers:
        (h.dir / f"broker{broker_id}.log").write_text(cluster.broker_log(broker_id))

    report = check(load(h.dir))
    print(report.render(), flush=True)
    print(f"faults: {', '.join(h.done)}; at most {h.most_at_once} member processes at once; "
          f"{len(h.members)} started; {len(sampler.samples)} offset samples "
          f"({sampler.errors} failed)", flush=True)
    replay = (f"\nseed {seed}: replay with STRATA_SEED={seed}; logs in {h.dir} "
              f"(python -m tests.support.group_checker {h.dir})\n")
    assert report.ok, report.render() + replay + "\n".join(cluster.events)
    assert set(FAULTS) - {"join"} <= set(h.done), f"faults done: {h.done}{replay}"
    assert h.most_at_once > 2, replay
    for judged in report.groups:
        assert judged.acknowledged >= 20 * PARTITIONS, judged.summary() + replay
        assert judged.samples > 5, judged.summary() + replay
