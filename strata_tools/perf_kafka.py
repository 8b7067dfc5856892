"""Stock Kafka clients against Strata's Kafka listener and against Apache Kafka, one run.

    python -m strata_tools.perf_kafka [--rounds 2] [--scale 1.0] [--markdown FILE]
    (``scripts/bench.sh kafka``; ``make bench`` runs it)

Starts a three-broker Strata stack (``strata up --brokers 3 --no-tier``: every broker
opens its Kafka listener) and a three-node Apache Kafka 4.1 cluster
(``strata_tools.kafka_local``) on free ports, creates the same topics on both, then runs
each case with **the same client** against Strata's Kafka listener and against Kafka,
and the matching ``strata perf produce|consume`` against Strata's own protocol, A, B, C,
A, B, C (this machine's speed drifts within a run). The clients: Kafka's
ProducerPerformance and ConsumerPerformance (the Java client, kafka-tools from Maven
Central) and confluent-kafka's ``produce`` loop (librdkafka;
``strata_tools.perf_peer``). Cases: 100-byte and 1 KiB records, acks=1 on a topic of one
replica and acks=all on three (min ISR 2), 8 partitions each; consume 100-byte records,
three times: the acks=1 topic from its start (the same records round after round: after
their first read the listener serves them from its converted-batch cache, as it does a
second consumer group, brokers/kafka/fetch_cache.py), and a new topic per run, read for
the first time, written beforehand (outside the measurement) by ProducerPerformance
(through the listener, which keeps the batches as the producer sent them: what a Kafka
user's consumers read) and by Strata's own client (on Kafka: ProducerPerformance; every
batch converted on its first read). "Strata, own protocol" is ``strata perf
produce|consume`` on the same topic and record size: beside the Java tools, the Python
client's columnar path (``send_batch``, ``poll_arrow``), so that ratio compares two
protocols *and* two clients (the Java tool is client-bound well below either broker's
limit); beside confluent-kafka's loops, the Python client's loop of the same shape
(``--api produce``: one ``produce`` call per record; ``--api records``: one record
object per record from ``poll``), so that ratio compares the two protocols under two
per-record Python loops, one over librdkafka and one over Strata's client. The table
gives the median of the rounds, Strata's Kafka listener against Kafka (the issue's
target: at least 1.0x) and against Strata's own protocol (at least 0.8x). Both stacks
are stopped at the end (only their own PIDs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_tools.perf_cpu import broker_cpu_seconds, kafka_stack, strata_stack
from strata_tools.perf_standing import PARTITIONS, Stacks, kafka_tool, machine, strata_cli

__all__ = ["main"]

_PRODUCER = ["linger.ms=5", "batch.size=524288"]


class KafkaStacks(Stacks):
    """The standing's two stacks, plus the Strata brokers' Kafka listeners."""

    kafka_listener = ""

    def up(self) -> None:
        super().up()
        status = json.loads(strata_cli("status", "--data-dir", str(self.strata_dir),
                                       "--format", "json"))
        self.kafka_listener = status["kafka_bootstrap"]
        for name, size in (("k-1", 1), ("k-3", 3)):
            configs = ["min.insync.replicas=2"] if size == 3 else []
            for system in ("strata", "kafka"):
                if system == "strata":
                    strata_cli("topic", "create", name, "-p", str(PARTITIONS), "-r", str(size),
                               *[x for c in configs for x in ("-c", c)],
                               "--bootstrap", self.strata)
                else:
                    kafka_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                               self.kafka, "--create", "--topic", name, "--partitions",
                               str(PARTITIONS), "--replication-factor", str(size),
                               *[x for c in configs for x in ("--config", c)])


def _java_produce(bootstrap: str, topic: str, n: int, size: int, acks: str) -> dict[str, float]:
    from strata_tools.perf_standing import PERF_LINE

    out = kafka_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                     "--num-records", str(n), "--record-size", str(size), "--throughput", "-1",
                     "--producer-props", f"bootstrap.servers={bootstrap}", f"acks={acks}",
                     *_PRODUCER)
    found = list(PERF_LINE.finditer(out))
    if not found:
        raise RuntimeError(f"ProducerPerformance printed no summary:\n{out[-2000:]}")
    return {"rate": float(found[-1]["rate"]), "p99_ms": float(found[-1]["p99"])}


def _java_consume(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    out = kafka_tool("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server",
                     bootstrap, "--topic", topic, "--messages", str(n), "--timeout", "60000",
                     "--group", f"perf-kafka-{time.time_ns()}")
    lines = [line for line in out.splitlines() if line.strip()]
    row = dict(zip([h.strip() for h in lines[-2].split(",")],
                   [v.strip() for v in lines[-1].split(",")], strict=False))
    return {"rate": float(row.get("fetch.nMsg.sec") or row["nMsg.sec"])}


def _confluent_produce(bootstrap: str, topic: str, n: int, size: int,
                       acks: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "strata_tools.perf_kafka", "--confluent-run", bootstrap, topic,
         str(n), str(size), acks], check=True, capture_output=True, text=True,
        timeout=900).stdout
    return {"rate": float(json.loads(out)["records_per_sec"])}


def _confluent_run(bootstrap: str, topic: str, n: int, size: int, acks: str) -> dict[str, Any]:
    import os

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks,
                         "enable.idempotence": acks == "all", "linger.ms": 5})
    producer.list_topics(topic, timeout=10)
    value = os.urandom(size)
    produce, poll = producer.produce, producer.poll
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:
                poll(0.001)
    if producer.flush(300) != 0:
        raise SystemExit("confluent-kafka: records left undelivered after 300 s")
    return {"records_per_sec": round(n / (time.perf_counter() - start))}


def _confluent_consume(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "strata_tools.perf_kafka", "--confluent-consume", bootstrap,
         topic, str(n)], check=True, capture_output=True, text=True, timeout=900).stdout
    return {"rate": float(json.loads(out)["records_per_sec"])}


def _confluent_consume_run(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    """confluent-kafka's ``Consumer.consume()`` loop (its batch call: up to 10,000
    message objects a call, each touched; a ``poll()`` loop, one a call, measured the
    same, about 157,000 a second on the listener on 2026-11-30), the peer of ``strata
    perf consume --api records``: every partition of ``topic`` assigned from its start
    (no group), timed from the assignment to the ``n``-th record, as ``strata perf
    consume`` times its own."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"perf-{time.time_ns()}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        consume = consumer.consume
        got, start = 0, time.perf_counter()
        deadline = time.monotonic() + 300
        while got < n:
            messages = consume(min(10_000, n - got), 1.0)
            if not messages and time.monotonic() > deadline:
                raise SystemExit(f"confluent-kafka: {got} of {n} records in 300 s")
            for message in messages:
                if message.error() is not None:
                    raise SystemExit(f"confluent-kafka: {message.error()}")
                message.value()
            got += len(messages)
        return {"records_per_sec": round(n / (time.perf_counter() - start))}
    finally:
        consumer.close()


def _own_produce(bootstrap: str, topic: str, n: int, size: int, acks: str,
                 api: str = "batch") -> dict[str, float]:
    result = json.loads(strata_cli("perf", "produce", "--bootstrap", bootstrap, "--topic",
                                   topic, "--num-records", str(n), "--record-size", str(size),
                                   "--acks", acks, "--api", api, "--format", "json"))
    return {"rate": float(result["records_per_sec"]),
            "p99_ms": float(result["latency_ms"]["p99"])}


def _own_consume(bootstrap: str, topic: str, n: int, api: str = "arrow") -> dict[str, float]:
    result = json.loads(strata_cli("perf", "consume", "--bootstrap", bootstrap, "--topic",
                                   topic, "--num-records", str(n), "--api", api,
                                   "--format", "json"))
    return {"rate": float(result["records_per_sec"])}


Run = Callable[[KafkaStacks], dict[str, float]]


@dataclass(frozen=True)
class Case:
    """One line of the table: the client against Strata's Kafka listener and against
    Kafka, and Strata's own client against Strata (``own`` None: no counterpart)."""

    name: str
    listener: Run
    kafka: Run
    own: Run | None
    records: int = 0  # per run: the brokers' CPU is reported per million of them
    #: Run before each side's measurement, outside its time and CPU (side: "listener",
    #: "kafka" or "own").
    prepare: Callable[[KafkaStacks, str], None] | None = None


def _fresh_topic(stacks: KafkaStacks, side: str, n: int, into: dict[str, str],
                 java_writes: bool = False) -> None:
    """A new 8-partition RF 1 topic holding ``n`` 100-byte records, written by
    ProducerPerformance on Kafka and, on Strata, by ``strata perf produce`` (Strata's
    own protocol: nothing in the listener's cache of v2 batches, every batch converted
    on its first read) or, with ``java_writes``, by ProducerPerformance through the
    Kafka listener (which keeps the batches as sent: a Kafka user's first read). Its
    name goes to ``into["topic"]``."""
    name = f"k-fresh-{side}-{time.time_ns()}"
    if side == "kafka":
        kafka_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", stacks.kafka,
                   "--create", "--topic", name, "--partitions", str(PARTITIONS),
                   "--replication-factor", "1")
        _java_produce(stacks.kafka, name, n, 100, "1")
    else:
        strata_cli("topic", "create", name, "-p", str(PARTITIONS), "-r", "1",
                   "--bootstrap", stacks.strata)
        if java_writes:
            _java_produce(stacks.kafka_listener, name, n, 100, "1")
        else:
            _own_produce(stacks.strata, name, n, 100, "1")
    into["topic"] = name


def cases(scale: float) -> list[Case]:
    def n(count: int) -> int:
        return max(1000, int(count * scale))

    out: list[Case] = []
    for size, count in ((100, 1_000_000), (1024, 300_000)):
        for acks, topic in (("1", "k-1"), ("all", "k-3")):
            rf = "RF 1" if topic == "k-1" else "RF 3"
            label = f"{size} B, acks={acks}, {rf}"

            def java(which: str, topic: str = topic, size: int = size, acks: str = acks,
                     count: int = count) -> Run:
                return lambda s: _java_produce(getattr(s, which), topic, n(count), size, acks)

            def own(topic: str = topic, size: int = size, acks: str = acks,
                    count: int = count, api: str = "batch") -> Run:
                return lambda s: _own_produce(s.strata, topic, n(count), size, acks, api)

            out.append(Case(f"ProducerPerformance, {label}", java("kafka_listener"),
                            java("kafka"), own(), n(count)))
            if size == 100:
                def conf(which: str, topic: str = topic, acks: str = acks,
                         count: int = count) -> Run:
                    return lambda s: _confluent_produce(getattr(s, which), topic, n(count),
                                                        100, acks)

                out.append(Case(f"confluent-kafka produce loop, {label}",
                                conf("kafka_listener"), conf("kafka"), own(api="produce"),
                                n(count)))
    out.append(Case("ConsumerPerformance, 100 B (the acks=1 topic, from the start)",
                    lambda s: _java_consume(s.kafka_listener, "k-1", n(1_000_000)),
                    lambda s: _java_consume(s.kafka, "k-1", n(1_000_000)),
                    lambda s: _own_consume(s.strata, "k-1", n(1_000_000)), n(1_000_000)))
    fresh: dict[str, str] = {}
    written: dict[str, str] = {}
    out.append(Case(
        "ConsumerPerformance, 100 B, first read of a new topic ProducerPerformance wrote",
        lambda s: _java_consume(s.kafka_listener, written["topic"], n(1_000_000)),
        lambda s: _java_consume(s.kafka, written["topic"], n(1_000_000)),
        None, n(1_000_000),
        prepare=lambda s, side: _fresh_topic(s, side, n(1_000_000), written, True)))
    out.append(Case(
        "ConsumerPerformance, 100 B, first read of a new topic Strata's client wrote "
        "(every batch converted)",
        lambda s: _java_consume(s.kafka_listener, fresh["topic"], n(1_000_000)),
        lambda s: _java_consume(s.kafka, fresh["topic"], n(1_000_000)),
        lambda s: _own_consume(s.strata, fresh["topic"], n(1_000_000)), n(1_000_000),
        prepare=lambda s, side: _fresh_topic(s, side, n(1_000_000), fresh)))
    out.append(Case("confluent-kafka consume loop, 100 B (the acks=1 topic, from the start)",
                    lambda s: _confluent_consume(s.kafka_listener, "k-1", n(1_000_000)),
                    lambda s: _confluent_consume(s.kafka, "k-1", n(1_000_000)),
                    lambda s: _own_consume(s.strata, "k-1", n(1_000_000), "records"),
                    n(1_000_000)))
    return out


def markdown(results: dict[str, dict[str, list[dict[str, float]]]], case_list: list[Case],
             rounds: int, started: str) -> str:
    lines = [
        f"Measured {started} UTC on {machine()}; `python -m strata_tools.perf_kafka --rounds "
        f"{rounds}` (`scripts/bench.sh kafka`): the same client against Strata's Kafka "
        "listener (3 brokers, `strata up`), against Apache Kafka 4.1.2 (3 KRaft nodes) and, "
        "where it has one, Strata's own client against Strata's own protocol, in turn, "
        "round after round; the median of the rounds; records/s; 8 partitions.",
        "",
        "| case | Strata, Kafka listener | Apache Kafka | Strata, own protocol | listener / "
        "Kafka | listener / own |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in case_list:
        got = results[case.name]
        listener = statistics.median(f["rate"] for f in got["listener"])
        kafka = statistics.median(f["rate"] for f in got["kafka"])
        own = statistics.median(f["rate"] for f in got["own"]) if got["own"] else None
        lines.append(
            f"| {case.name} | {listener:,.0f} | {kafka:,.0f} | "
            f"{'-' if own is None else f'{own:,.0f}'} | {listener / kafka:.2f}x | "
            f"{'-' if own is None else f'{listener / own:.2f}x'} |")
    lines += [
        "",
        "The brokers' CPU over the same runs (user + system from `/proc/<pid>/stat`, the "
        "three brokers together, CPU seconds per million records; the median of the "
        "rounds): what each protocol costs the brokers, whichever client is the faster. "
        "Efficiency = the other side's CPU per record / the listener's.",
        "",
        "| case | Strata, Kafka listener | Apache Kafka | Strata, own protocol | efficiency "
        "/ Kafka | efficiency / own |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in case_list:
        got = results[case.name]
        cpu = {side: statistics.median(f["broker_cpu_s_per_million"] for f in runs)
               for side, runs in got.items() if runs}
        listener_cpu, kafka_cpu, own_cpu = cpu["listener"], cpu["kafka"], cpu.get("own")
        lines.append(
            f"| {case.name} | {listener_cpu:.2f} | {kafka_cpu:.2f} | "
            f"{'-' if own_cpu is None else f'{own_cpu:.2f}'} | "
            f"{kafka_cpu / listener_cpu:.2f}x | "
            f"{'-' if own_cpu is None else f'{own_cpu / listener_cpu:.2f}x'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--confluent-run"]:
        bootstrap, topic, n, size, acks = args_in[1:6]
        print(json.dumps(_confluent_run(bootstrap, topic, int(n), int(size), acks)))
        return 0
    if args_in[:1] == ["--confluent-consume"]:
        bootstrap, topic, n = args_in[1:4]
        print(json.dumps(_confluent_consume_run(bootstrap, topic, int(n))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_kafka",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every record count (0.1 for a quick look)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the cases whose name contains TEXT (repeatable)")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(args_in)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    case_list = [c for c in cases(args.scale)
                 if not args.only or any(text in c.name for text in args.only)]
    if not case_list:
        parser.error("--only matches no case; the cases are: "
                     + "; ".join(c.name for c in cases(args.scale)))
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        c.name: {"listener": [], "kafka": [], "own": []} for c in case_list}
    stacks = KafkaStacks()
    try:
        stacks.up()
        print(f"strata {stacks.strata} (Kafka listener {stacks.kafka_listener}); "
              f"kafka {stacks.kafka}", flush=True)
        pids = {"strata": strata_stack(stacks.strata_dir)[1],
                "kafka": kafka_stack(stacks.kafka_dir)[1]}
        for round_ in range(args.rounds):
            for case in case_list:
                for side, run in (("listener", case.listener), ("kafka", case.kafka),
                                  ("own", case.own)):
                    if run is None:
                        continue
                    if case.prepare is not None:
                        case.prepare(stacks, side)
                    brokers = pids["kafka" if side == "kafka" else "strata"]
                    before = sum(broker_cpu_seconds(pid) for pid in brokers)
                    figures = run(stacks)
                    spent = sum(broker_cpu_seconds(pid) for pid in brokers) - before
                    figures["broker_cpu_s_per_million"] = round(spent / case.records * 1e6, 2)
                    results[case.name][side].append(figures)
                    print(f"round {round_ + 1} {side:8} {case.name}: {figures}", flush=True)
    finally:
        stacks.down()
    table = markdown(results, case_list, args.rounds, started)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
