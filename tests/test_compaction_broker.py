"""Log compaction on real brokers: two broker processes (a leader and a follower, each
compacting its own copy) with the cleaner every 200 ms; producers with keys write a
compacted topic while a consumer re-reads it from the beginning. The final full read
equals the model (the latest record per key below the active segment, tombstones gone,
then every record of the active segment), reads never see an offset go backwards or a
record that differs from what was produced at that offset, and the logs shrink."""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest

from strata.client import Admin, Consumer, Producer, TopicPartition
from strata.client.admin import NewTopic
from tests.support.broker_process import BrokerProcess
from wire.errors import InvalidRecordBatchError

pytestmark = pytest.mark.integration

TOPIC = "compacted-events"
Produced = dict[int, tuple[bytes, bytes | None]]


def _read_all(bootstrap: str) -> list[tuple[int, bytes, bytes | None]]:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        out: list[tuple[int, bytes, bytes | None]] = []
        quiet = 0
        while quiet < 3:
            table = consumer.poll_arrow(timeout_ms=300)
            if table.num_rows == 0:
                quiet += 1
                continue
            quiet = 0
            out += zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
                       table.column("value").to_pylist(), strict=True)
        return out


def _active_base(broker: BrokerProcess) -> int:
    logs = sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))
    return int(logs[-1].name[:-4])


def _model(produced: Produced, active_base: int) -> list[tuple[int, bytes, bytes | None]]:
    below = {o: r for o, r in produced.items() if o < active_base}
    latest = {key: o for o, (key, _) in sorted(below.items())}
    last = max(below) if below else -1
    kept = [(o, k, v) for o, (k, v) in sorted(below.items())
            if o == last or (latest[k] == o and v is not None)]
    return kept + [(o, k, v) for o, (k, v) in sorted(produced.items()) if o >= active_base]


def _metric(broker: BrokerProcess, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                  timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_compaction_while_producing_and_consuming(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    overrides = {"log.cleaner.interval.ms": "200"}
    brokers = [broker_factory(i, overrides) for i in range(2)]
    bootstrap = brokers[0].bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 2, {
            "cleanup.policy": "compact", "segment.bytes": "8192",
            "delete.retention.ms": "0", "min.insync.replicas": "2"})])
        leader_id = admin.describe_topics([TOPIC])[TOPIC].partitions[0].leader
        admin.create_topics([NewTopic("both-policies", 1, 1,
                                      {"cleanup.policy": "delete,compact"})])
        configs = admin.describe_configs(["both-policies"])["both-policies"]
        assert configs["cleanup.policy"].value == "compact,delete"
    leader = next(b for b in brokers if b.broker_id == leader_id)
    follower = next(b for b in brokers if b.broker_id != leader_id)

    produced: Produced = {}
    problems: list[str] = []
    done = threading.Event()

    def reader() -> None:  # re-reads from the beginning while the cleaner works
        while not done.is_set():
            previous = -1
            for offset, key, value in _read_all(bootstrap):
                if offset <= previous:
                    problems.append(f"offset {offset} after {previous}")
                expected = produced.get(offset)
                if expected is not None and expected != (key, value):
                    problems.append(f"offset {offset}: {key!r}={value!r}, produced {expected}")
                previous = offset

    thread = threading.Thread(target=reader, daemon=True)
    rng = random.Random(11)
    with Producer(bootstrap, acks="all") as producer:
        with pytest.raises(InvalidRecordBatchError, match="has no key"):
            producer.send(TOPIC, b"keyless").result(timeout=30)
        thread.start()
        for _ in range(8):
            futures = []
            for _ in range(150):
                key = f"key-{rng.randrange(40)}".encode()
                value = None if rng.random() < 0.1 else f"{rng.random():.9f}".encode() * 4
                futures.append((key, value, producer.send(TOPIC, value, key=key)))
            producer.flush(timeout=60)
            for key, value, future in futures:
                produced[future.result(timeout=30).offset] = (key, value)
            time.sleep(0.3)  # a few cleaner passes while producing
    total = len(produced)

    # Converged: every closed segment cleaned on the leader; the read equals the model.
    deadline = time.monotonic() + 60
    while True:
        records = _read_all(bootstrap)
        expected = _model(produced, _active_base(leader))
        if records == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    done.set()
    thread.join(timeout=60)
    assert records == expected
    assert not problems, problems[:5]
    assert len(records) < total / 2
    for broker in (leader, follower):  # each replica compacted its own copy
        assert _metric(broker, "strata_cleaner_records_removed_total") > 0
        assert _metric(broker, "strata_cleaner_errors_total") == 0
        assert _metric(broker, "strata_cleaner_bytes_after_total") < \
            _metric(broker, "strata_cleaner_bytes_before_total")
    # The Spark source's executor read (plain Python, no JVM) over ranges that start,
    # end and lie wholly inside gaps returns exactly the records of each range.
    from spark_source._options import parse_source_options
    from spark_source._planning import OffsetRange
    from spark_source._read import read_range

    options = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": TOPIC},
                                   streaming=False)
    offsets = [o for o, _, _ in records]
    end = offsets[-1] + 1
    for start, stop in ((0, end), (1, end // 2), (end // 3, end // 3 + 5), (0, 1)):
        got = [o for batch in read_range(options, OffsetRange(TOPIC, 0, start, stop))
               for o in batch.column(4).to_pylist()]
        assert got == [o for o in offsets if start <= o < stop], (start, stop)

    # A restart reopens the compacted log (gaps and all); whichever replica leads then
    # serves its own compacted copy, which equals the model too.
    leader.stop()
    leader.start()
    deadline = time.monotonic() + 60
    while True:
        records = _read_all(bootstrap)
        models = [_model(produced, _active_base(b)) for b in brokers]
        if records in models or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert records in models
