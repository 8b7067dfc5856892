"""Fault tests for replication (issue [4/7] section 5): workload, nemesis, checker.

The pieces, used by tests/test_faults.py:

``Workload``
    K idempotent producers (``acks="all"``), one thread each, writing records whose value
    is ``<run id>:<producer>:<seq>`` to explicit partitions (``seq`` counts per producer
    across all partitions; the partition is ``(seq + producer) % partitions``, or with
    ``keys=N`` the partition of the record's key ``k<n>``, n cycling through N keys). Every
    ``send`` is remembered with its outcome: acknowledged (and at which offset), failed
    (outcome unknown: the broker may or may not have written it), or refused by ``send``
    itself (never handed over, so it must never be read).

Nemesis scenarios (``kill_leaders``, ``kill_controller``, ``pause_leader``,
``kill_zookeeper_node``, ``restart_every_broker``)
    Each injects one kind of fault into a ``tests.support.cluster.Cluster`` while the
    workload runs, heals it, and returns the ``Phase``s it went through with the number of
    records acknowledged during each fault (to prove writes continued). A scenario runs
    ``rounds`` times, or for ``STRATA_SOAK_SECONDS`` if that is longer (``make soak``).

``check`` and ``compare_replicas``
    After healing and stopping the producers: read every partition from offset 0 to its
    high watermark with the real ``Consumer``, and compare every replica's segment files
    byte for byte up to the high watermark (read directly from disk after a clean stop;
    ``PartitionLog`` is never opened, its recovery could write). ``CheckResult`` counts
    acknowledged / read / lost / duplicated / unexpected records, order violations, offset
    gaps, acknowledged offsets that do not hold the record, and replica divergences.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.client import Consumer, Producer, TopicPartition
from strata.client.producer import ProducerOptions
from tests.support.cluster import Cluster
from wire.connection import BrokerConnection
from wire.errors import InvalidRecordBatchError
from wire.partitioner import partition_for_key
from wire.protocol import (
    ApiKey,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
)
from wire.record_batch import HEADER_SIZE, build_batch, peek_header
from wire.security import PLAINTEXT, ClientSecurity

__all__ = [
    "CheckResult",
    "Outcome",
    "Phase",
    "Workload",
    "check",
    "compare_replica_dirs",
    "compare_replicas",
    "explain",
    "kill_controller",
    "kill_leaders",
    "kill_zookeeper_node",
    "log_prefix",
    "pause_leader",
    "probe_leader",
    "read_partitions",
    "restart_every_broker",
    "soak_seconds",
    "verify",
    "ZombieProbe",
]

#: Producer index of the raw probe records sent to a paused ("zombie") leader.
PROBE_PRODUCER = 999
_SEGMENT = re.compile(r"^\d{20}\.log$")


def soak_seconds() -> float:
    """``STRATA_SOAK_SECONDS`` (default 0): how long each nemesis keeps injecting faults."""
    raw = os.environ.get("STRATA_SOAK_SECONDS", "").strip()
    return float(raw) if raw else 0.0


# ----------------------------------------------------------------------------- workload


@dataclass(slots=True)
class Outcome:
    """What happened to one record handed to ``send``."""

    producer: int
    seq: int
    partition: int
    sent_at: float
    acked_at: float | None = None
    offset: int | None = None
    error: str | None = None

    @property
    def acked(self) -> bool:
        return self.offset is not None


#: The value schema of a typed workload (Avro).
TYPED_SCHEMA = (
    '{"type": "record", "name": "Numbered", "fields": [{"name": "run", "type": "string"}, '
    '{"name": "producer", "type": "int"}, {"name": "seq", "type": "long"}]}')


class Workload:
    """Idempotent ``acks=all`` producers writing numbered records; see the module docstring.

    ``rate`` is records per second per producer; ``max_pending`` bounds each producer's
    unacknowledged records (``send`` waits for room, so a stalled cluster slows the
    workload instead of filling memory). ``keys`` > 0 gives every record a key ``k<n>``
    (n = ``(seq * producers + producer) % keys``) and sends it to that key's partition
    (murmur2, what the producer's own partitioner picks); every partition must get a key.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, producers: int = 3,
                 rate: float = 80.0, max_pending: int = 200,
                 options: ProducerOptions | None = None, keys: int = 0,
                 typed: bool = False) -> None:
        self.bootstrap = bootstrap
        #: A typed topic (subject with ``TYPED_SCHEMA``): values are dicts, checked by
        #: the producer and the broker against the registry on every send.
        self.typed = typed
        self.topic = topic
        self.partitions = partitions
        self.producers = producers
        self.keys = keys
        if keys and len({partition_for_key(f"k{n}".encode(), partitions)
                         for n in range(keys)}) < partitions:
            raise ValueError(f"{keys} keys do not cover all {partitions} partitions; "
                             f"use more keys")
        self.rate = rate
        self.max_pending = max_pending
        self.options: ProducerOptions = {
            "acks": "all", "enable_idempotence": True, "linger_ms": 5,
            # Short request timeout: a request stuck on a paused or dead leader is
            # abandoned (and retried elsewhere) after 5 s, not Kafka's 30 s.
            "request_timeout_ms": 5000, "delivery_timeout_ms": 90_000,
            "max_block_ms": 10_000, "retry_backoff_ms": 100,
        }
        self.options.update(options or {})
        self.run_id = uuid.uuid4().hex[:8]
        self.outcomes: dict[tuple[int, int], Outcome] = {}
        #: Records ``send`` refused (never handed to the producer): must never be read.
        self.refused: dict[tuple[int, int], str] = {}
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._drain_timeout = 30.0
        self._probe_seq = 0
        # Acknowledgement times per partition, ascending (taken under the lock), so
        # progress checks cost a bisect, not a scan of every outcome of a long soak.
        self._ack_times: dict[int, list[float]] = {p: [] for p in range(partitions)}

    # ------------------------------------------------------------------ values
    def value(self, producer: int, seq: int) -> Any:
        if self.typed:
            return {"run": self.run_id, "producer": producer, "seq": seq}
        return f"{self.run_id}:{producer}:{seq}".encode()

    def parse(self, value: Any) -> tuple[int, int] | None:
        """``(producer, seq)`` of a value this run wrote, else None."""
        if value is None:
            return None
        if isinstance(value, dict):
            if value.get("run") != self.run_id:
                return None
            return int(value["producer"]), int(value["seq"])
        parts = value.split(b":")
        if len(parts) != 3 or parts[0] != self.run_id.encode():
            return None
        try:
            return int(parts[1]), int(parts[2])
        except ValueError:
            return None

    def key(self, producer: int, seq: int) -> bytes | None:
        """The record's key (None without ``keys``)."""
        if not self.keys:
            return None
        return f"k{(seq * self.producers + producer) % self.keys}".encode()

    def partition_of(self, producer: int, seq: int) -> int:
        key = self.key(producer, seq)
        if key is not None:
            return partition_for_key(key, self.partitions)
        return (seq + producer) % self.partitions

    # ------------------------------------------------------------------ running
    def start(self) -> Workload:
        for index in range(self.producers):
            thread = threading.Thread(target=self._guarded, args=(index,),
                                      name=f"nemesis-producer-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def _guarded(self, index: int) -> None:
        try:
            self._run(index)
        except BaseException as err:  # reported by stop()
            self.errors.append(err)

    def _run(self, index: int) -> None:
        """One producer's paced loop; ``_open``/``_send``/``_serve``/``_close`` are the
        client's part (a subclass may bring another client, tests/support/kafka_workload)."""
        room = threading.Semaphore(self.max_pending)
        producer = self._open(index)
        try:
            seq = 0
            interval = 1.0 / self.rate
            next_at = time.monotonic()
            while not self._stop.is_set():
                self._serve(producer)
                if not room.acquire(timeout=0.2):
                    continue
                partition = self.partition_of(index, seq)
                outcome = Outcome(index, seq, partition, time.monotonic())
                try:
                    self._send(producer, outcome, self.value(index, seq), self.key(index, seq),
                               room)
                except Exception as err:  # not handed over: it must never show up
                    with self._lock:
                        self.refused[(index, seq)] = repr(err)
                    room.release()
                else:
                    with self._lock:
                        self.outcomes[(index, seq)] = outcome
                seq += 1
                next_at += interval
                pause = next_at - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
                elif pause < -1.0:  # far behind (blocked on a stall): do not burst
                    next_at = time.monotonic()
        finally:
            self._close(producer)

    def _open(self, index: int) -> Any:
        options: ProducerOptions = {**self.options, "client_id": f"nemesis-{index}"}
        return Producer(self.bootstrap, **options)

    def _send(self, producer: Any, outcome: Outcome, value: Any, key: bytes | None,
              room: threading.Semaphore) -> None:
        """Hand one record to the client (raises if it was not taken); ``room`` is
        released once its outcome is known (``_settle``)."""
        future = producer.send(self.topic, value, key=key, partition=outcome.partition)
        future.add_done_callback(functools.partial(self._completed, outcome, room=room))

    def _serve(self, producer: Any) -> None:
        """Run the client's pending callbacks, for clients that need a call for it."""

    def _close(self, producer: Any) -> None:
        producer.close(timeout=self._drain_timeout)

    def _completed(self, outcome: Outcome, future: Any, *, room: threading.Semaphore) -> None:
        error = future.exception()
        self._settle(outcome, room, None if error is None else repr(error),
                     None if error is not None else future.result().offset)

    def _settle(self, outcome: Outcome, room: threading.Semaphore, error: str | None,
                offset: int | None) -> None:
        """Record one record's outcome: acknowledged at ``offset``, or failed."""
        try:
            if error is None:
                with self._lock:
                    outcome.offset = offset
                    outcome.acked_at = time.monotonic()
                    self._ack_times[outcome.partition].append(outcome.acked_at)
            else:
                outcome.error = error
        finally:
            room.release()

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop sending; wait up to ``drain_timeout`` for outstanding acknowledgements
        (what is still pending then fails with ``ProducerClosedError``)."""
        self._drain_timeout = drain_timeout
        self._stop.set()
        for thread in self._threads:
            thread.join(drain_timeout + 30)
            if thread.is_alive():
                raise AssertionError(f"{thread.name} did not stop within "
                                     f"{drain_timeout + 30:.0f}s")
        if self.errors:
            raise AssertionError(f"a producer thread failed: {self.errors[0]!r}") \
                from self.errors[0]

    # ------------------------------------------------------------------ probes
    def register_probe(self, partition: int) -> tuple[Outcome, bytes]:
        """A record sent outside the producers (to a zombie leader): it may be read, and
        if it is acknowledged it must be read."""
        with self._lock:
            seq = self._probe_seq
            self._probe_seq += 1
            outcome = Outcome(PROBE_PRODUCER, seq, partition, time.monotonic())
            self.outcomes[(PROBE_PRODUCER, seq)] = outcome
        return outcome, self.value(PROBE_PRODUCER, seq)

    # ------------------------------------------------------------------ progress
    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes.values())

    def snapshot_items(self) -> list[tuple[tuple[int, int], Outcome]]:
        with self._lock:
            return list(self.outcomes.items())

    def acked(self, since: float = 0.0, partition: int | None = None) -> int:
        """Records acknowledged at or after ``since`` (monotonic), optionally of one
        partition (probe records excluded)."""
        with self._lock:
            lists = [self._ack_times[partition]] if partition is not None \
                else list(self._ack_times.values())
            return sum(len(times) - bisect.bisect_left(times, since) for times in lists)

    def wait_for_acks(self, count: int, *, since: float, partitions: Iterable[int] | None = None,
                      timeout: float = 30.0) -> None:
        """Until ``count`` more records were acknowledged since ``since`` on each of
        ``partitions`` (all records together when None)."""
        wanted = None if partitions is None else list(partitions)
        deadline = time.monotonic() + timeout
        while True:
            if wanted is None:
                got: Any = self.acked(since)
                ok = got >= count
            else:
                got = {p: self.acked(since, p) for p in wanted}
                ok = all(n >= count for n in got.values())
            if ok:
                return
            if self.errors:
                raise AssertionError(f"a producer thread failed: {self.errors[0]!r}")
            if time.monotonic() > deadline:
                failed = Counter(o.error.split("(")[0] for o in self.snapshot()
                                 if o.error is not None)
                raise AssertionError(
                    f"writes did not continue: wanted {count} acknowledgements "
                    f"{'in total' if wanted is None else 'per partition'} within "
                    f"{timeout:.0f}s, got {got}; failures so far: {dict(failed)}")
            time.sleep(0.1)


# ----------------------------------------------------------------------------- nemesis


@dataclass(slots=True)
class Phase:
    """One injected fault: what it was, how long healing took, what was acknowledged
    while it lasted."""

    name: str
    started: float
    ended: float = 0.0
    acked_during: int = 0
    notes: list[str] = field(default_factory=list)
    #: Writes that did not go on when they should have (the test fails on any, after
    #: the checker ran, so one stall does not hide what else went wrong).
    stalls: list[str] = field(default_factory=list)

    def describe(self) -> str:
        extra = f" ({'; '.join(self.notes)})" if self.notes else ""
        stalls = "".join(f"\n    STALL: {s}" for s in self.stalls)
        return (f"{self.name}: {self.ended - self.started:.1f}s, "
                f"{self.acked_during} acknowledged during the fault{extra}{stalls}")

    def expect_progress(self, cluster: Cluster, workload: Workload, topic: str,
                        partitions: Iterable[int], count: int = 10,
                        timeout: float = 30.0) -> bool:
        """Wait until ``count`` new acknowledgements on each of ``partitions``; a stall is
        recorded (with the cluster's state) instead of raised."""
        try:
            workload.wait_for_acks(count, since=time.monotonic(), partitions=partitions,
                                   timeout=timeout)
            return True
        except AssertionError as err:
            try:
                state = cluster.describe(topic)
            except Exception as describe_error:
                state = f"(cluster state unreadable: {describe_error!r})"
            self.stalls.append(f"{err}; cluster: {state}")
            cluster.log(f"STALL during {self.name}: {err}")
            return False


def _rounds(rounds: int) -> Iterable[int]:
    """``range(rounds)``, extended until ``STRATA_SOAK_SECONDS`` have passed."""
    soak = soak_seconds()
    started = time.monotonic()
    index = 0
    while index < rounds or time.monotonic() - started < soak:
        yield index
        index += 1


def _heal(phase: Phase, phases: list[Phase], cluster: Cluster, workload: Workload,
          topic: str, restart: Callable[[], None]) -> None:
    """End a fault the usual way: count what was acknowledged while it lasted, undo it
    (``restart``), wait until the topic is healthy again, log the phase and keep it."""
    phase.acked_during = workload.acked(phase.started)
    restart()
    cluster.wait_until_healthy(topic, timeout=60)
    phase.ended = time.monotonic()
    cluster.log(phase.describe())
    phases.append(phase)


def kill_leaders(cluster: Cluster, workload: Workload, topic: str, *,
                 rounds: int = 3) -> list[Phase]:
    """(a) SIGKILL the leader of one partition (a different partition each round); wait
    for a new leader and for writes to that partition to go through it; restart the
    killed broker and wait until it is back in every ISR."""
    phases = []
    partitions = sorted(cluster.replicas(topic))
    for index in _rounds(rounds):
        partition = partitions[index % len(partitions)]
        victim = cluster.leader_of(topic, partition)
        phase = Phase(f"SIGKILL broker {victim}, leader of p{partition}", time.monotonic())
        cluster.kill(victim)
        state = cluster.wait_for_new_leader(topic, partition, victim, timeout=40)
        phase.notes.append(f"p{partition} led by {state.leader} (epoch {state.leader_epoch}, "
                           f"isr {list(state.isr)}) after "
                           f"{time.monotonic() - phase.started:.1f}s")
        phase.expect_progress(cluster, workload, topic, [partition], 20)
        _heal(phase, phases, cluster, workload, topic, functools.partial(cluster.restart, victim))
    return phases


def kill_controller(cluster: Cluster, workload: Workload, topic: str, *,
                    rounds: int = 2) -> list[Phase]:
    """(b) SIGKILL the controller; wait for another broker to take over and for every
    partition to accept writes again; restart the old controller and wait for a full
    ISR everywhere."""
    phases = []
    partitions = sorted(cluster.replicas(topic))
    for _ in _rounds(rounds):
        held = cluster.controller()
        assert held is not None, "no controller to kill"
        victim, epoch = held
        phase = Phase(f"SIGKILL controller {victim} (epoch {epoch})", time.monotonic())
        cluster.kill(victim)
        successor = cluster.wait_for_new_controller(victim, timeout=40)
        after = cluster.controller()
        phase.notes.append(f"controller {after} after {time.monotonic() - phase.started:.1f}s")
        assert after is not None and after[1] > epoch, \
            f"new controller {successor} did not bump the epoch: {after} after {held}"
        for partition in partitions:
            if cluster.leader_of(topic, partition) == victim:
                cluster.wait_for_new_leader(topic, partition, victim, timeout=40)
        phase.expect_progress(cluster, workload, topic, partitions)
        _heal(phase, phases, cluster, workload, topic, functools.partial(cluster.restart, victim))
    return phases


@dataclass(slots=True)
class ZombieProbe:
    """A raw ``acks=-1`` produce sent to a paused leader; ``answer`` is its error code."""

    broker: int
    partition: int
    outcome: Outcome
    answer: int | None = None
    error: str | None = None


def _send_probe(cluster: Cluster, topic: str, probe: ZombieProbe, value: bytes,
                timeout: float) -> None:
    """Runs in a thread: connect to the paused broker (the kernel completes the
    handshake and buffers the request), wait for its answer after it resumes."""
    broker = cluster.brokers[probe.broker]

    async def go() -> None:
        async with BrokerConnection(broker.host, broker.port,
                                    security=cluster.client_security()) as connection:
            response = await connection.request(ApiKey.PRODUCE, ProduceRequest(-1, 5000, [
                ProduceTopic(topic, [ProducePartition(probe.partition, build_batch([value]))])]))
        assert isinstance(response, ProduceResponse)
        answer = response.topics[0].partitions[0]
        probe.answer = answer.error_code
        if answer.error_code == 0:
            probe.outcome.offset = answer.base_offset
            probe.outcome.acked_at = time.monotonic()
        else:
            probe.outcome.error = f"error {answer.error_code}: {answer.error_message}"

    try:
        asyncio.run(asyncio.wait_for(go(), timeout))
    except Exception as err:  # the zombie closing the connection is a fine answer
        probe.error = repr(err)
        probe.outcome.error = repr(err)


def probe_leader(cluster: Cluster, workload: Workload, topic: str, victim: int,
                 partitions: list[int], probes: list[ZombieProbe], timeout: float
                 ) -> list[threading.Thread]:
    """A raw ``acks=-1`` probe to broker ``victim`` for each of ``partitions``, each on a
    thread of its own (appended to ``probes``; the checker knows their records)."""
    threads = []
    for partition in partitions:
        outcome, value = workload.register_probe(partition)
        probe = ZombieProbe(victim, partition, outcome)
        probes.append(probe)
        thread = threading.Thread(target=_send_probe,
                                  args=(cluster, topic, probe, value, timeout), daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def pause_leader(cluster: Cluster, workload: Workload, topic: str, *, pause_s: float = 12.0,
                 rounds: int = 1) -> tuple[list[Phase], list[ZombieProbe]]:
    """(c) SIGSTOP the leader of p0 for ``pause_s`` (longer than its ZooKeeper session);
    while it is frozen, send it one raw ``acks=-1`` record per partition it leads, wait
    for another leader of p0 and for writes through it, then SIGCONT. The zombie must
    answer every probe with an error (or never): an acknowledged probe is reported in
    ``ZombieProbe.answer`` and must also be readable (the checker counts it lost if not).
    """
    phases: list[Phase] = []
    probes: list[ZombieProbe] = []
    partitions = sorted(cluster.replicas(topic))
    for index in _rounds(rounds):
        partition = partitions[index % len(partitions)]
        victim = cluster.leader_of(topic, partition)
        led = [p for p in partitions if cluster.leader_of(topic, p) == victim]
        names = ", ".join(f"p{p}" for p in led)
        phase = Phase(f"SIGSTOP broker {victim} (leader of {names}) for {pause_s:.0f}s",
                      time.monotonic())
        cluster.pause(victim)
        threads = probe_leader(cluster, workload, topic, victim, led, probes, pause_s + 40)
        try:
            state = cluster.wait_for_new_leader(topic, partition, victim,
                                                timeout=pause_s + 20)
            phase.notes.append(f"p{partition} led by {state.leader} (epoch "
                               f"{state.leader_epoch}, isr {list(state.isr)}) after "
                               f"{time.monotonic() - phase.started:.1f}s")
            phase.expect_progress(cluster, workload, topic, [partition], timeout=15)
            remaining = phase.started + pause_s - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        finally:
            if cluster.brokers[victim].paused:
                cluster.resume(victim)
        phase.acked_during = workload.acked(phase.started)
        for thread in threads:
            thread.join(pause_s + 45)
        for probe in probes[-len(led):]:
            phase.notes.append(f"probe p{probe.partition}: answer {probe.answer} "
                               f"{probe.outcome.error or ''}".strip())
        cluster.wait_until_healthy(topic, timeout=60)
        phase.ended = time.monotonic()
        cluster.log(phase.describe())
        phases.append(phase)
    return phases, probes


def kill_zookeeper_node(cluster: Cluster, workload: Workload, topic: str, *,
                        rounds: int = 1, down_s: float = 8.0) -> list[Phase]:
    """(d) SIGKILL one node of the 3-node ensemble (its leader first, then followers in
    later rounds); writes must go on with the two survivors; restart it and wait until
    the ensemble and the topic are healthy."""
    phases = []
    partitions = sorted(cluster.replicas(topic))
    for index in _rounds(rounds):
        leader = cluster.zk_leader_index()
        assert leader is not None, "no ZooKeeper leader"
        victim = leader if index % 2 == 0 else (leader + 1) % len(cluster.zk_nodes)
        role = "leader" if victim == leader else "follower"
        phase = Phase(f"SIGKILL ZooKeeper node {victim} ({role})", time.monotonic())
        cluster.kill_zookeeper(victim)
        cluster.wait_for_zookeeper_quorum(timeout=40)
        phase.notes.append(f"quorum again after {time.monotonic() - phase.started:.1f}s")
        phase.expect_progress(cluster, workload, topic, partitions)
        remaining = phase.started + down_s - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        _heal(phase, phases, cluster, workload, topic,
              functools.partial(cluster.restart_zookeeper, victim))
    return phases


def restart_every_broker(cluster: Cluster, workload: Workload, topic: str, *,
                         rounds: int = 1) -> list[Phase]:
    """(e) A rolling restart (SIGTERM, start again, wait for a full ISR) of every broker,
    then every broker SIGKILLed at once and started again."""
    phases = []
    partitions = sorted(cluster.replicas(topic))
    for _ in _rounds(rounds):
        for broker_id in sorted(cluster.brokers):
            phase = Phase(f"rolling restart of broker {broker_id}", time.monotonic())
            cluster.stop(broker_id)
            for partition in partitions:
                if cluster.leader_of(topic, partition) == broker_id:
                    cluster.wait_for_new_leader(topic, partition, broker_id, timeout=40)
            phase.expect_progress(cluster, workload, topic, partitions)
            _heal(phase, phases, cluster, workload, topic,
                  functools.partial(cluster.restart, broker_id))
        phase = Phase("SIGKILL every broker at once", time.monotonic())
        for broker_id in sorted(cluster.brokers):
            cluster.kill(broker_id)
        for broker_id in sorted(cluster.brokers):
            cluster.restart(broker_id)
        cluster.wait_until_healthy(topic, timeout=60)
        phase.expect_progress(cluster, workload, topic, partitions)
        phase.ended = time.monotonic()
        phase.acked_during = workload.acked(phase.started)
        cluster.log(phase.describe())
        phases.append(phase)
    return phases


# ----------------------------------------------------------------------------- checker


def read_partitions(bootstrap: str, topic: str, high_watermarks: dict[int, int],
                    timeout: float = 60.0, security: ClientSecurity = PLAINTEXT,
                    ) -> dict[int, list[tuple[int, bytes | None]]]:
    """Every record of every partition from offset 0 to its high watermark, as
    ``(offset, value)`` in the order the consumer returned them."""
    out: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in high_watermarks}
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200,
                  request_timeout_ms=10_000, max_poll_records=5000,
                  security=security) as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(high_watermarks)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout
        todo = {p for p, hw in high_watermarks.items() if hw > 0}
        while todo:
            if time.monotonic() > deadline:
                got = {p: len(out[p]) for p in sorted(todo)}
                raise AssertionError(f"reading {topic} did not reach the high watermarks "
                                     f"{high_watermarks} within {timeout:.0f}s: {got}")
            for record in consumer.poll(timeout_ms=500):
                if record.offset < high_watermarks[record.partition]:
                    out[record.partition].append((record.offset, record.value))
            for p in list(todo):
                if consumer.position(TopicPartition(topic, p)) >= high_watermarks[p]:
                    todo.discard(p)
    return out


@dataclass(slots=True)
class CheckResult:
    """What the checker found; ``problems`` says where, ``ok`` whether all is well."""

    acknowledged: int = 0
    read: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    order_violations: int = 0
    offset_gaps: int = 0
    offset_mismatches: int = 0
    failed_sends: int = 0
    failed_but_present: int = 0
    zombie_acks: int = 0
    replica_divergences: int = 0
    high_watermarks: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    #: The counts that must all be 0 for a run to be correct.
    ANOMALIES = ("lost", "duplicated", "unexpected", "order_violations", "offset_gaps",
                 "offset_mismatches", "replica_divergences", "zombie_acks")

    @property
    def ok(self) -> bool:
        return not any(self.anomalies().values())

    def anomalies(self) -> dict[str, int]:
        """Every count of ``ANOMALIES``, so an assertion shows them all at once."""
        return {name: getattr(self, name) for name in self.ANOMALIES}

    def summary(self, name: str) -> str:
        return (f"{name}: acknowledged={self.acknowledged} read={self.read} lost={self.lost} "
                f"duplicated={self.duplicated} unexpected={self.unexpected} "
                f"order_violations={self.order_violations} offset_gaps={self.offset_gaps} "
                f"offset_mismatches={self.offset_mismatches} "
                f"replica_divergences={self.replica_divergences} "
                f"zombie_acks={self.zombie_acks} failed_sends={self.failed_sends} "
                f"(of which present={self.failed_but_present}) hw={self.high_watermarks}")

    def note(self, problem: str, limit: int = 40) -> None:
        if len(self.problems) < limit:
            self.problems.append(problem)
        elif len(self.problems) == limit:
            self.problems.append("... (more problems not listed)")


def check(workload: Workload, records: dict[int, list[tuple[int, bytes | None]]],
          high_watermarks: dict[int, int], probes: Iterable[ZombieProbe] = ()
          ) -> CheckResult:
    """Compare what was read with what was sent and acknowledged (module docstring)."""
    result = CheckResult(high_watermarks=dict(high_watermarks))
    outcomes = dict(workload.snapshot_items())
    found: dict[tuple[int, int], tuple[int, int]] = {}  # key -> (partition, offset)
    for partition in sorted(records):
        last_seq: dict[int, int] = {}
        expected = 0
        for offset, value in records[partition]:
            result.read += 1
            if offset != expected:
                if offset > expected:
                    result.offset_gaps += offset - expected
                    result.note(f"p{partition}: offsets {expected}..{offset - 1} missing")
                else:
                    result.offset_gaps += 1
                    result.note(f"p{partition}: offset {offset} read after {expected - 1}")
            expected = offset + 1
            key = workload.parse(value)
            outcome = outcomes.get(key) if key is not None else None
            if key is None or outcome is None or outcome.partition != partition:
                result.unexpected += 1
                result.note(f"p{partition}@{offset}: {value!r} was never sent to p{partition}")
                continue
            if key in found:
                result.duplicated += 1
                first = found[key]
                result.note(f"p{partition}@{offset}: producer {key[0]} seq {key[1]} again "
                            f"(first at p{first[0]}@{first[1]})")
                continue
            found[key] = (partition, offset)
            producer, seq = key
            if producer in last_seq and seq < last_seq[producer]:
                result.order_violations += 1
                result.note(f"p{partition}@{offset}: producer {producer} seq {seq} after "
                            f"seq {last_seq[producer]}")
            last_seq[producer] = max(seq, last_seq.get(producer, -1))
        hw = high_watermarks.get(partition, 0)
        if expected < hw:
            result.offset_gaps += hw - expected
            result.note(f"p{partition}: read up to {expected}, high watermark is {hw}")
    for key, outcome in outcomes.items():
        if outcome.acked:
            if outcome.producer != PROBE_PRODUCER:
                result.acknowledged += 1
            if key not in found:
                result.lost += 1
                result.note(f"lost: producer {key[0]} seq {key[1]} acknowledged at "
                            f"p{outcome.partition}@{outcome.offset}")
            elif found[key][1] != outcome.offset:
                result.offset_mismatches += 1
                result.note(f"producer {key[0]} seq {key[1]} acknowledged at "
                            f"p{outcome.partition}@{outcome.offset}, read at "
                            f"p{found[key][0]}@{found[key][1]}")
        elif outcome.error is not None and outcome.producer != PROBE_PRODUCER:
            result.failed_sends += 1
            if key in found:
                result.failed_but_present += 1
    for probe in probes:
        if probe.answer == 0:
            result.zombie_acks += 1
            result.note(f"zombie broker {probe.broker} acknowledged a write to "
                        f"p{probe.partition} at offset {probe.outcome.offset}")
    return result


def log_prefix(partition_dir: Path, high_watermark: int) -> tuple[bytes, list[str]]:
    """The bytes of a partition's segment files, concatenated in offset order, up to the
    end of the batch that ends at ``high_watermark``; plus what looked wrong (offsets
    not contiguous, a torn batch, the high watermark not on a batch boundary or beyond
    the log). Reads the files only: nothing is opened through ``PartitionLog``."""
    problems: list[str] = []
    if not partition_dir.is_dir():
        return b"", [f"{partition_dir} does not exist"]
    segments = sorted(p for p in partition_dir.iterdir() if _SEGMENT.match(p.name))
    out = bytearray()
    expected: int | None = None
    for segment in segments:
        if expected is not None and expected >= high_watermark:
            break
        data = segment.read_bytes()
        position = 0
        while position < len(data) and (expected is None or expected < high_watermark):
            try:
                header = peek_header(data, position)
            except InvalidRecordBatchError as err:
                problems.append(f"{segment.name}@{position}: {err}")
                break
            if header.size < HEADER_SIZE or position + header.size > len(data):
                problems.append(f"{segment.name}@{position}: batch of {header.size} bytes "
                                f"cut off at {len(data)}")
                break
            if expected is None and header.base_offset != 0:
                problems.append(f"log starts at offset {header.base_offset}, not 0")
            elif expected is not None and header.base_offset != expected:
                problems.append(f"{segment.name}@{position}: batch at offset "
                                f"{header.base_offset}, expected {expected}")
            out += data[position:position + header.size]
            expected = header.next_offset
            position += header.size
    end = expected or 0
    if end > high_watermark:
        problems.append(f"the high watermark {high_watermark} is not a batch boundary (the "
                        f"batch holding it ends at {end})")
    elif end < high_watermark:
        problems.append(f"log ends at offset {end}, below the high watermark "
                        f"{high_watermark}")
    return bytes(out), problems


def compare_replica_dirs(directories: dict[int, Path], high_watermark: int) -> list[str]:
    """Byte-compare the partition directories of one partition's replicas (broker id ->
    directory, the first being the reference) up to ``high_watermark``; one line per
    problem or divergence, empty when every replica is identical."""
    prefixes = {b: log_prefix(d, high_watermark) for b, d in directories.items()}
    reference = next(iter(directories))
    ref_bytes = prefixes[reference][0]
    divergences: list[str] = []
    for broker, (data, problems) in prefixes.items():
        divergences += [f"broker {broker}: {p}" for p in problems]
        if broker != reference and data != ref_bytes:
            at = next((i for i, (x, y) in enumerate(zip(data, ref_bytes, strict=False))
                       if x != y), min(len(data), len(ref_bytes)))
            divergences.append(f"broker {broker} differs from broker {reference} at byte "
                               f"{at} (sizes {len(data)} vs {len(ref_bytes)}, high "
                               f"watermark {high_watermark})")
    return divergences


def compare_replicas(cluster: Cluster, topic: str, high_watermarks: dict[int, int]
                     ) -> list[str]:
    """Byte-compare every replica of every partition up to the high watermark; call
    after the brokers stopped. Returns one line per divergence (empty: identical)."""
    divergences: list[str] = []
    for partition, replicas in sorted(cluster.replicas(topic).items()):
        directories = {b: cluster.partition_dir(b, topic, partition) for b in replicas}
        divergences += [f"p{partition} {line}" for line in
                        compare_replica_dirs(directories, high_watermarks[partition])]
    return divergences


def verify(name: str, cluster: Cluster, workload: Workload, topic: str, *,
           probes: Iterable[ZombieProbe] = (), drain_timeout: float = 30.0,
           ) -> CheckResult:
    """The whole post-fault check: stop the producers, wait for settled high watermarks,
    read everything, stop the brokers cleanly, byte-compare the replicas, print the
    summary line."""
    workload.stop(drain_timeout)
    cluster.wait_until_healthy(topic, timeout=60)
    hws = cluster.high_watermarks(topic)
    records = read_partitions(cluster.bootstrap, topic, hws,
                              security=cluster.client_security())
    cluster.stop_all()
    result = check(workload, records, hws, probes)
    divergences = compare_replicas(cluster, topic, hws)
    result.replica_divergences = len(divergences)
    for line in divergences:
        result.note(line)
    print(result.summary(name), flush=True)
    for problem in result.problems:
        print(f"  {problem}", flush=True)
    return result


def explain(cluster: Cluster, result: CheckResult, phases: Iterable[Phase],
            log_filter: Callable[[str], bool] | None = None, tail: int = 60) -> str:
    """A failure message: the summary, the phases, the problems and each broker's log
    tail (lines passing ``log_filter`` if given)."""
    parts = [result.summary("result"), "phases:"]
    parts += [f"  {phase.describe()}" for phase in phases]
    parts += ["problems:"] + [f"  {p}" for p in result.problems]
    for broker_id in sorted(cluster.brokers):
        lines = cluster.broker_log(broker_id).splitlines()
        if log_filter is not None:
            lines = [line for line in lines if log_filter(line)]
        parts.append(f"--- broker {broker_id} (last {tail} lines) ---")
        parts += lines[-tail:]
    return "\n".join(parts)

