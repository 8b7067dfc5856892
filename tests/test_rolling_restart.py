"""A rolling restart under load (issue [2.2] item 6): nothing fails, nothing is lost.

One scenario (the module fixture ``rolling_restart``) runs once; two tests judge it:

Set-up
    A real cluster (tests/support/cluster.py): ZooKeeper and 3 brokers, a topic of 6
    partitions with replication factor 3 and ``min.insync.replicas=2``, and
    ``__consumer_offsets`` with 3 partitions (replication factor 3).
Load
    Two idempotent ``acks=all`` producers (tests/support/nemesis.py's ``Workload``: keyed
    records whose value carries the producer and its sequence number, so order and
    duplicates can be checked per partition) configured the way a user would for a
    rolling restart: unbounded retries within a 30 s delivery timeout. A consumer group
    of two member processes (tests/support/group_member.py, one auto-committing, one
    committing synchronously) reads and commits throughout; an Admin client samples the
    group's committed offsets every second.
Restarts
    Each broker in turn gets SIGTERM (its clean shutdown path, ``Cluster.stop``), is
    started again on the same data dir (``Cluster.restart``), and the test waits until
    it is registered and back in the ISR of every partition of both topics (and writes go
    on) before the next one. While a broker shuts down, a kazoo watch on every
    partition's state znode records each version it sees, so the leader of every
    partition *at the moment the broker's registration vanished* (the zxid of the delete
    of ``/strata/brokers/ids/<id>``) is known exactly, not guessed from timing.
Checks
    ``test_rolling_restart_loses_nothing``: no send failed (every failure is listed with
    its error), every acknowledged record is in the log when every partition is read from
    offset 0, at the acknowledged offset, with no duplicate and in producer order; the
    group consumed every acknowledged record and its committed offsets never moved back
    (tests/support/group_checker.py; the window from each SIGTERM until the cluster is
    healthy again is a "disturbed" span for its stall clocks, as for the broker kills of
    tests/test_group_faults.py).

    ``test_controlled_shutdown_moves_leadership_first`` (select it with
    ``-k controlled_shutdown``): a broker that shuts down cleanly leads no partition when
    its registration vanishes; its leaderships moved to other in-sync replicas first.
    This fails on broker code without controlled shutdown (there the controller moves
    leadership only after the broker's session is gone).

Nothing is random except the workload's run id; the logs (harness, records, offset
samples, members, brokers) stay in the temp dir printed at the start
(``python -m tests.support.group_checker DIR`` checks the group logs again).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from procs import pid_alive
from strata.client.producer import ProducerOptions
from tests.support.broker_process import REPO
from tests.support.cluster import ROOT, Cluster
from tests.support.group_checker import MemberLog, OffsetSampler, Report
from tests.support.group_checker import check as check_group
from tests.support.group_checker import load as load_group
from tests.support.nemesis import CheckResult, Outcome, Workload, read_partitions
from tests.support.nemesis import check as check_log

BROKERS = 3
PARTITIONS = 6
REPLICATION_FACTOR = 3
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 3
GROUP = "rolling"
#: Member name -> commit mode (tests/support/group_member.py).
MEMBERS = {"rolling-m0": "auto", "rolling-m1": "sync"}
SESSION_MS = 6000
PRODUCERS, RATE = 2, 40.0  # records/s per producer
#: What a user sets for a rolling restart: retries (the default: unbounded) within a
#: 30 s delivery timeout; a request to a broker going away is abandoned after 10 s.
PRODUCER_OPTIONS: ProducerOptions = {
    "acks": "all", "enable_idempotence": True, "delivery_timeout_ms": 30_000,
    "request_timeout_ms": 10_000, "max_block_ms": 30_000, "retry_backoff_ms": 100,
}
#: Seconds a broker may take to exit after SIGTERM (its shutdown.timeout.ms is 10 s).
STOP_TIMEOUT_S = 30.0

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]


# ----------------------------------------------------------------------------- leadership


@dataclass(frozen=True, slots=True)
class StateVersion:
    """One version of a partition's state znode as a watch (or a read) saw it."""

    version: int
    mzxid: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    #: When the test first saw it (``time.monotonic()``).
    seen_at: float


class StateRecorder:
    """Every version of every watched partition state znode that kazoo reported.

    A ``DataWatch`` re-reads the znode after each change, so consecutive writes can fold
    into one report; ``at_zxid`` says when that leaves the answer unknown.
    """

    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk
        self.seen: dict[tuple[str, int], dict[int, StateVersion]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{ROOT}/brokers/topics/{topic}/partitions/{partition}/state"

    def _add(self, key: tuple[str, int], data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None or stat is None:
            return
        value = json.loads(data.decode())
        seen = StateVersion(stat.version, stat.mzxid, int(value["leader"]),
                            int(value["leader_epoch"]), tuple(int(b) for b in value["isr"]),
                            time.monotonic())
        with self._lock:
            self.seen.setdefault(key, {}).setdefault(stat.version, seen)

    def _watcher(self, key: tuple[str, int]) -> Callable[..., None]:
        def changed(data: bytes | None, stat: ZnodeStat | None,
                    event: WatchedEvent | None) -> None:
            self._add(key, data, stat)
        return changed

    def watch(self, topic: str, partitions: Iterable[int]) -> None:
        for partition in partitions:
            key = (topic, partition)
            with self._lock:
                self.seen.setdefault(key, {})
            self.zk.DataWatch(self.path(topic, partition), self._watcher(key))

    def versions(self, topic: str, partition: int) -> list[StateVersion]:
        with self._lock:
            return sorted(self.seen.get((topic, partition), {}).values(),
                          key=lambda v: v.version)

    def refresh(self, txn_log_dir: Path | None = None) -> None:
        """Read every watched znode now, so versions written since are known too; and,
        given ZooKeeper's transaction log directory (``<data>/version-2``), every
        version written at all, including those a watch folded (``txn_log_states``)."""
        for key in list(self.seen):
            data, stat = self.zk.get(self.path(*key))
            self._add(key, data, stat)
        if txn_log_dir is None:
            return
        keys = {self.path(*key): key for key in self.seen}
        for path, version, zxid, data in txn_log_states(txn_log_dir):
            if path not in keys:
                continue
            key = keys[path]
            value = json.loads(data.decode())
            found = StateVersion(version, zxid, int(value["leader"]),
                                 int(value["leader_epoch"]),
                                 tuple(int(b) for b in value["isr"]), time.monotonic())
            with self._lock:
                self.seen.setdefault(key, {}).setdefault(version, found)


    def at_zxid(self, zxid: int) -> dict[tuple[str, int], StateVersion | str]:
        """Per partition: the state version in force at ``zxid`` (the last one written
        before it), or why it cannot be told (a version written around it was folded)."""
        out: dict[tuple[str, int], StateVersion | str] = {}
        with self._lock:
            snapshot = {k: dict(v) for k, v in self.seen.items()}
        for key, versions in sorted(snapshot.items()):
            before = [v for v in versions.values() if v.mzxid < zxid]
            after = sorted(v.version for v in versions.values() if v.mzxid > zxid)
            if not before:
                out[key] = f"no version written before zxid {zxid:#x} was seen"
                continue
            current = max(before, key=lambda v: v.version)
            if after and after[0] != current.version + 1:
                out[key] = (f"version {current.version} was seen before zxid {zxid:#x}, "
                            f"then version {after[0]}: the ones between were not seen")
                continue
            out[key] = current
        return out


def txn_log_states(log_dir: Path) -> list[tuple[str, int, int, bytes]]:
    """``(path, version, zxid, data)`` of every create and setData of a partition-state
    znode in ZooKeeper's transaction log files (``log.<zxid>``), in log order.

    The format (ZooKeeper 3.9, ``FileTxnLog``): a header (magic ``ZKLG``, version, dbid),
    then per transaction its checksum (8 bytes), length (4), the serialized transaction
    and an end byte; preallocated zeros end the file. A transaction is a ``TxnHeader``
    (client id, cxid, zxid, time, type: 32 bytes) and a record: setData (type 5) is path,
    data, version; the creates (1, 15, 19, 21) path and data (version 0); multi (14) a
    count of (type, record) pairs. ZooKeeper writes and syncs each transaction before it
    answers, so after a deregistration was seen the log holds every version before it.
    """
    out: list[tuple[str, int, int, bytes]] = []

    def record(kind: int, body: bytes, zxid: int) -> None:
        if kind in (1, 5, 15, 19, 21):
            (size,) = struct.unpack_from(">i", body, 0)
            path = body[4:4 + size].decode()
            (length,) = struct.unpack_from(">i", body, 4 + size)
            data = body[8 + size:8 + size + length]
            version = struct.unpack_from(">i", body, 8 + size + length)[0] if kind == 5 else 0
            if path.endswith("/state") and "/partitions/" in path:
                out.append((path, version, zxid, data))
        elif kind == 14:
            (count,) = struct.unpack_from(">i", body, 0)
            at = 4
            for _ in range(count):
                sub, length = struct.unpack_from(">ii", body, at)
                record(sub, body[at + 8:at + 8 + length], zxid)
                at += 8 + length

    for log in sorted(log_dir.glob("log.*"), key=lambda f: int(f.name[4:], 16)):
        raw = log.read_bytes()
        if len(raw) < 16 or struct.unpack_from(">i", raw, 0)[0] != 0x5A4B4C47:
            continue
        at = 16
        while at + 12 <= len(raw):
            _, length = struct.unpack_from(">qi", raw, at)
            if length <= 0 or at + 12 + length > len(raw):
                break  # the preallocated tail, or a transaction still being written
            txn = raw[at + 12:at + 12 + length]
            at += 12 + length + 1
            _, _, zxid, _, kind = struct.unpack_from(">qiqqi", txn, 0)
            record(kind, txn[32:], zxid)
    return out


@dataclass(slots=True)
class Deregistration:
    """What one clean shutdown left behind when the broker's registration vanished."""

    broker: int
    exit_code: int
    zxid: int
    stopped_after_s: float
    #: When SIGTERM was sent (``time.monotonic()``).
    sigterm_at: float
    #: Partitions whose state named this broker leader at that zxid.
    led: list[str] = field(default_factory=list)
    #: Partitions whose state at that zxid could not be told, and why.
    unknown: list[str] = field(default_factory=list)
    #: For each partition it led: how long after the deregistration the leader changed.
    moved_after: list[str] = field(default_factory=list)
    still_led: list[tuple[str, int]] = field(default_factory=list)

    def describe(self) -> str:
        return (f"broker {self.broker}: exited {self.exit_code} {self.stopped_after_s:.1f}s "
                f"after SIGTERM; registration deleted at zxid {self.zxid:#x}; led then: "
                f"{', '.join(self.led) or 'nothing'}"
                + (f"; leadership moved by the controller afterwards: "
                   f"{', '.join(self.moved_after)}" if self.moved_after else "")
                + (f"; unknown: {'; '.join(self.unknown)}" if self.unknown else ""))


# ----------------------------------------------------------------------------- group


class Member(MemberLog):
    """One group member process and what its log (group_member.py) says so far."""

    def __init__(self, name: str, mode: str, log: Path,
                 process: subprocess.Popen[bytes]) -> None:
        super().__init__(log)
        self.name, self.mode, self.process = name, mode, process


class Harness:
    """The cluster, the member processes and the log directory the group checker reads."""

    def __init__(self, directory: Path, cluster: Cluster, topic: str) -> None:
        self.dir, self.cluster, self.topic = directory, cluster, topic
        (directory / "members").mkdir(parents=True)
        self._log = (directory / "harness.jsonl").open("a")
        self.members: dict[str, Member] = {}
        self.t0 = getattr(cluster, "_t0", time.monotonic())
        self.event("meta", topic=topic, partitions=PARTITIONS,
                   session_timeout_s=SESSION_MS / 1000, t0=self.t0, seed=None)

    def event(self, ev: str, **fields: Any) -> None:
        self._log.write(json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n")
        self._log.flush()

    def start_member(self, name: str, mode: str) -> Member:
        log = self.dir / "members" / f"{name}.jsonl"
        with (self.dir / "members" / f"{name}.err").open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.group_member",
                 "--bootstrap", self.cluster.bootstrap, "--group", GROUP, "--topic",
                 self.topic, "--member", name, "--log", str(log), "--commit", mode,
                 "--session-timeout-ms", str(SESSION_MS)],
                cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        member = Member(name, mode, log, process)
        self.members[name] = member
        self.event("member-start", m=name, g=GROUP, mode=mode, pid=process.pid)
        self.cluster.log(f"start {name} (pid {process.pid}, {mode} commits)")
        return member

    def refresh(self) -> None:
        for member in self.members.values():
            member.refresh()

    def ownership(self) -> dict[str, list[int]]:
        self.refresh()
        return {m.name: sorted(m.owned) for m in self.members.values()}

    def delivered(self) -> set[tuple[int, int]]:
        self.refresh()
        out: set[tuple[int, int]] = set()
        for member in self.members.values():
            out |= member.delivered
        return out

    def stop_members(self, timeout: float = 60.0) -> None:
        """SIGTERM every member (each commits and leaves), then wait for each exit."""
        for member in self.members.values():
            if member.process.poll() is None:
                self.event("member-stop", m=member.name)
                member.process.send_signal(signal.SIGTERM)
        for member in self.members.values():
            try:
                code = member.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.cluster.log(f"{member.name} did not exit {timeout:.0f}s after SIGTERM")
                member.process.kill()
                code = member.process.wait(10)
            self.event("member-exit", m=member.name, code=code)

    def close(self) -> None:
        """Kill whatever member still runs (through its own Popen handle)."""
        for member in self.members.values():
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait(10)
        self._log.close()


def _settled(ownership: dict[str, list[int]]) -> bool:
    owned = list(ownership.values())
    return (len(owned) == len(MEMBERS) and all(owned)
            and sorted(p for ps in owned for p in ps) == list(range(PARTITIONS)))


# ----------------------------------------------------------------------------- scenario


@dataclass(slots=True)
class RollingRestart:
    """Everything the scenario saw, for the tests to judge."""

    cluster: Cluster
    workload: Workload
    log_dir: Path
    deregistrations: list[Deregistration] = field(default_factory=list)
    failed: list[Outcome] = field(default_factory=list)
    refused: dict[tuple[int, int], str] = field(default_factory=dict)
    log_check: CheckResult | None = None
    group_report: Report | None = None
    member_errors: dict[str, list[str]] = field(default_factory=dict)
    samples: int = 0
    sample_errors: int = 0
    wall_s: float = 0.0

    def timeline(self) -> str:
        return "\n".join(["cluster events:", *(f"  {e}" for e in self.cluster.events)])


def _deregister(cluster: Cluster, recorder: StateRecorder, broker_id: int) -> Deregistration:
    """SIGTERM one broker; once it exited and its registration is gone, tell which
    partitions it led at the zxid of that delete."""
    ids = f"{ROOT}/brokers/ids"
    _, before = cluster.zk.get(ids)
    sigterm_at = time.monotonic()
    try:
        code = cluster.stop(broker_id, timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # Cluster.stop SIGKILLed it
        raise AssertionError(
            f"broker {broker_id} did not exit within {STOP_TIMEOUT_S:.0f}s of SIGTERM; its "
            f"last lines:\n{cluster.broker_log(broker_id, tail=30)}") from None
    stopped = time.monotonic() - sigterm_at
    node = f"{ids}/{broker_id}"
    cluster.wait_for(f"registration {node} gone after broker {broker_id} exited",
                     lambda: cluster.zk.exists(node), lambda stat: stat is None,
                     SESSION_MS / 1000 + 5)
    _, after = cluster.zk.get(ids)
    result = Deregistration(broker_id, code, after.pzxid, stopped, sigterm_at)
    if after.cversion != before.cversion + 1:
        result.unknown.append(f"{ids} changed {after.cversion - before.cversion} times "
                              f"(not just the delete of {broker_id}): its pzxid "
                              f"{after.pzxid:#x} may not be that delete's zxid")
    # Watches fold quick writes under load; ZooKeeper's own log has every version.
    server = getattr(cluster, "zk_server", None)
    recorder.refresh(None if server is None else server.data_dir / "version-2")
    for (topic, partition), state in recorder.at_zxid(after.pzxid).items():
        name = f"{topic}-{partition}"
        if isinstance(state, str):
            result.unknown.append(f"{name}: {state}")
        elif state.leader == broker_id:
            result.led.append(f"{name} (epoch {state.leader_epoch}, isr {list(state.isr)})")
            result.still_led.append((topic, partition))
    cluster.log(result.describe())
    return result


def _moved_after(recorder: StateRecorder, result: Deregistration) -> None:
    """For the partitions still led at the delete: who took over (in a state version
    written after the delete) and when the test saw it, in seconds after the SIGTERM."""
    recorder.refresh()
    for topic, partition in result.still_led:
        moved = next((v for v in recorder.versions(topic, partition)
                      if v.mzxid > result.zxid and v.leader != result.broker), None)
        if moved is None:
            result.moved_after.append(f"{topic}-{partition}: no other leader seen")
        else:
            result.moved_after.append(
                f"{topic}-{partition} -> broker {moved.leader} (epoch "
                f"{moved.leader_epoch}) {moved.seen_at - result.sigterm_at:.1f}s after "
                f"SIGTERM")


def _write(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _run(cluster: Cluster, log_dir: Path) -> RollingRestart:
    began = time.monotonic()
    topic = f"rolling-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, REPLICATION_FACTOR, TOPIC_CONFIGS)
    cluster.wait_until_healthy(topic, timeout=30)
    h = Harness(log_dir, cluster, topic)
    workload = Workload(cluster.bootstrap, topic, PARTITIONS, producers=PRODUCERS, rate=RATE,
                        options=PRODUCER_OPTIONS, keys=64)
    run = RollingRestart(cluster, workload, log_dir)
    cluster.log(f"topic {topic}, workload run id {workload.run_id} (nothing else is random)")
    sampler = OffsetSampler(cluster.bootstrap, [GROUP])
    workload_stopped = False
    try:
        for name, mode in MEMBERS.items():
            h.start_member(name, mode)
        cluster.wait_for(f"group {GROUP}: both members own partitions, all {PARTITIONS} "
                         "owned once", h.ownership, _settled, 40)
        cluster.wait_until_healthy(OFFSETS_TOPIC, timeout=30)
        recorder = StateRecorder(cluster.zk)
        recorder.watch(topic, range(PARTITIONS))
        recorder.watch(OFFSETS_TOPIC, range(OFFSETS_PARTITIONS))
        sampler.start()
        workload.start()
        workload.wait_for_acks(5, since=0.0, partitions=range(PARTITIONS), timeout=20)
        cluster.log(f"workload running: {workload.acked()} acknowledged")
        for broker_id in sorted(cluster.brokers):
            h.event("broker-kill", broker=broker_id, how="SIGTERM")
            result = _deregister(cluster, recorder, broker_id)
            cluster.restart(broker_id)
            for name in (topic, OFFSETS_TOPIC):
                cluster.wait_until_healthy(name, timeout=45)
            _moved_after(recorder, result)
            h.event("broker-healthy", broker=broker_id)
            run.deregistrations.append(result)
            workload.wait_for_acks(5, since=time.monotonic(), partitions=range(PARTITIONS),
                                   timeout=20)
        workload.stop(drain_timeout=35)
        workload_stopped = True
        acked = {(o.partition, o.offset) for o in workload.snapshot() if o.offset is not None}

        def missing() -> list[tuple[int, int]]:
            return sorted(acked - h.delivered())[:10]

        # The group checker tells what was not delivered; this only waits for the drain.
        with contextlib.suppress(AssertionError):
            cluster.wait_for(f"group {GROUP} delivered all {len(acked)} acknowledged "
                             "records (first missing shown)", missing, lambda m: not m, 20)
        h.event("end")
        h.stop_members()
    finally:
        if not workload_stopped:
            with contextlib.suppress(Exception):
                workload.stop(drain_timeout=5)
        sampler.stop()
        h.close()
    run.samples, run.sample_errors = len(sampler.samples), sampler.errors
    run.member_errors = {m.name: m.errors for m in h.members.values() if m.errors}
    outcomes = workload.snapshot()
    # Failed, or never answered at all (neither acknowledged nor failed by the drain).
    run.failed = sorted((o for o in outcomes if o.offset is None), key=lambda o: o.sent_at)
    run.refused = dict(workload.refused)
    _write(log_dir / "records.jsonl", (
        {"p": o.partition, "v": workload.value(o.producer, o.seq).decode(), "o": o.offset,
         "t": o.acked_at} for o in outcomes))
    _write(log_dir / "samples.jsonl", sampler.samples)
    run.group_report = check_group(load_group(log_dir))

    cluster.wait_until_healthy(topic, timeout=30)
    hws = cluster.high_watermarks(topic)
    records = read_partitions(cluster.bootstrap, topic, hws, timeout=30)
    run.log_check = check_log(workload, records, hws)
    for broker_id in cluster.brokers:
        (log_dir / f"broker{broker_id}.log").write_text(cluster.broker_log(broker_id))
    run.wall_s = time.monotonic() - began
    return run


@pytest.fixture(scope="module")
def rolling_restart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RollingRestart]:
    base = tmp_path_factory.mktemp("rolling")
    print(f"\nrolling restart: logs in {base / 'logs'}", flush=True)
    started = time.monotonic()
    cluster = Cluster(base / "cluster", BROKERS,
                      overrides={"offsets.topic.num.partitions": str(OFFSETS_PARTITIONS)})
    cluster.start()
    try:
        run = _run(cluster, base / "logs")
        print(f"rolling restart scenario: {time.monotonic() - started:.1f}s in all "
              f"({run.wall_s:.1f}s after the cluster started)", flush=True)
        yield run
    finally:
        pids = cluster.pids()
        cluster.close()
        survivors = [pid for pid in pids if pid_alive(pid)]
        assert not survivors, f"cluster processes survived: {survivors}"


# ----------------------------------------------------------------------------- tests


def _outcome_line(o: Outcome, t0: float) -> str:
    return (f"producer {o.producer} seq {o.seq} p{o.partition} sent +{o.sent_at - t0:.1f}s: "
            f"{o.error or 'never answered'}")


def test_rolling_restart_loses_nothing(rolling_restart: RollingRestart) -> None:
    run = rolling_restart
    cluster, t0 = run.cluster, getattr(run.cluster, "_t0", 0.0)
    assert run.log_check is not None and run.group_report is not None
    result, report = run.log_check, run.group_report
    print(result.summary("rolling restart log"), flush=True)
    print(report.render(), flush=True)
    for d in run.deregistrations:
        print(f"  {d.describe()}", flush=True)
    print(f"  {run.samples} offset samples ({run.sample_errors} failed)", flush=True)
    context = (f"\n{result.summary('log')}\n" + "\n".join(f"  {p}" for p in result.problems)
               + f"\n{report.render()}\n{run.timeline()}\nlogs in {run.log_dir}")

    failures = [_outcome_line(o, t0) for o in run.failed]
    failures += [f"producer {k[0]} seq {k[1]}: send refused: {e}"
                 for k, e in sorted(run.refused.items())]
    assert not failures, (f"{len(failures)} sends failed after the client's retries "
                          f"(delivery timeout {PRODUCER_OPTIONS['delivery_timeout_ms']} ms):\n"
                          + "\n".join(failures) + context)
    anomalies = result.anomalies()
    assert anomalies == dict.fromkeys(anomalies, 0), f"the log is wrong: {anomalies}{context}"
    assert result.acknowledged >= 20 * PARTITIONS, f"too little was written{context}"
    assert not run.member_errors, f"a member failed: {run.member_errors}{context}"
    assert report.ok, f"the group checker found problems:{context}"
    assert report.groups and report.groups[0].acknowledged == result.acknowledged, context
    exits = {d.broker: d.exit_code for d in run.deregistrations}
    assert exits == dict.fromkeys(cluster.brokers, 0), \
        f"a broker did not exit cleanly on SIGTERM: {exits}{context}"


def test_controlled_shutdown_moves_leadership_first(rolling_restart: RollingRestart) -> None:
    """Controlled shutdown, judged by behaviour: when a cleanly stopping broker's
    registration vanishes it leads nothing (the zxid of the delete of its
    ``/strata/brokers/ids/<id>`` against the recorded versions of every partition
    state znode). Fails on broker code without controlled shutdown."""
    run = rolling_restart
    assert len(run.deregistrations) == BROKERS, run.timeline()
    lines = [d.describe() for d in run.deregistrations]
    unknown = [f"broker {d.broker}: {u}" for d in run.deregistrations for u in d.unknown]
    assert not unknown, "could not tell who led at a deregistration:\n" + "\n".join(unknown)
    led = {d.broker: d.led for d in run.deregistrations if d.led}
    assert not led, ("brokers still led partitions when their registration vanished after "
                     "SIGTERM (no controlled shutdown):\n" + "\n".join(lines)
                     + f"\n{run.timeline()}")
