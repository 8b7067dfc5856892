"""The tier on object storage through the user's own path (issue [3.5]): ``strata tier
run --warehouse s3://...`` with the standard AWS variables, against a real S3 API server
on 127.0.0.1 (moto's, behind a front the test can take away: tests/support/s3_server.py).

One topic, local retention 0 (a broker frees a segment as soon as it is tiered), and in
order:

1. a job SIGKILLed (its whole process group) while its tasks write data files, before
   its commit: no commit, and the broker frees nothing;
2. a long-running job (``--every 1``) whose store goes away mid-pass: the pass fails with
   ``TIER_STORE_UNREACHABLE``, nothing is committed or freed while the store is away;
   once it is back, the next pass catches up, and only then does the broker free the
   tiered segments;
3. the table holds every closed segment's record exactly once (read with delta-rs from
   the store); Spark reads it, and writes a table, through S3A; the Spark source
   replays the topic from ``earliest`` across the store and the hot log with every
   offset once and the records that were sent.

No secret reaches a job's output. Spark runs in subprocesses (its JVM needs the S3A
connector, which this worker's may not have).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strata.client import Admin, NewTopic, Producer
from tests.support.broker_process import REPO, BrokerProcess
from tests.support.s3_server import SECRET_KEY, S3Server

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(900)]

BUCKET = "strata-tier-test"
SEGMENT_BYTES = 64 * 1024
TOPIC = "tier-s3"
PARTITIONS = 2


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server.serving(tmp_path_factory.mktemp("s3"), BUCKET) as server:
        yield server


def _produce(broker: BrokerProcess, count: int) -> dict[int, list[tuple[str, str]]]:
    sent: dict[int, list[tuple[str, str]]] = {p: [] for p in range(PARTITIONS)}
    with Producer(broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = []
        for i in range(count):
            p = i % PARTITIONS
            key, value = f"k{i % 97}", f"value-{i:07d}-{'x' * 60}"
            sent[p].append((key, value))
            futures.append(producer.send(TOPIC, value.encode(), key=key.encode(), partition=p))
        producer.flush()
        for future in futures:
            future.result(30)
    return sent


def _tier_job(broker: BrokerProcess, s3: S3Server, log: Path, *when: str
              ) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "strata_tools.cli", "tier", "run", *when, "--topic", TOPIC,
            "--bootstrap", broker.bootstrap, "--lease-ttl-s", "5",
            "--warehouse", f"s3://{BUCKET}/wh", "--format", "json"]
    env = {**os.environ, **s3.environment(), "PYTHONPATH": str(REPO)}
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def _tier_state(broker: BrokerProcess) -> dict[int, tuple[int, int, int]]:
    """Per partition: (tiered_up_to, log start, end of the closed segments)."""
    with Admin(broker.bootstrap) as admin:
        tier = admin.describe_tier([TOPIC])[TOPIC]
    return {p: (t.tiered_up_to, t.log_start_offset,
                t.segments[-1].next_offset if t.segments else 0)
            for p, t in tier.partitions.items()}


def _wait(what: str, probe: object, timeout: float, process: subprocess.Popen[bytes],
          log: Path, interval: float = 0.25) -> None:
    """Poll ``probe`` (every ``interval`` s: each probe is a request to the store or the
    broker, on the cores the job needs) until it is true or ``process`` exits."""
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen (job exit {process.poll()}):\n"
                                 + log.read_text(errors="replace")[-4000:])
        time.sleep(interval)


_REPLAY = textwrap.dedent("""
    import json, sys
    from strata_spark import Warehouse, spark_session
    warehouse = Warehouse.parse(sys.argv[3])
    spark = spark_session("tier-s3-replay", warehouse.spark_conf())
    # Spark itself through S3A: reads the tier table; writes and reads back a table.
    table = warehouse.spark_uri("topics", sys.argv[2])
    print("s3a rows", spark.read.format("delta").load(table).count(), flush=True)
    scratch = warehouse.spark_uri("scratch")
    spark.range(0, 100).write.format("delta").save(scratch)
    spark.range(100, 150).write.format("delta").mode("append").save(scratch)
    print("s3a written", spark.read.format("delta").load(scratch).count(), flush=True)
    rows = (spark.read.format("strata").option("bootstrap.servers", sys.argv[1])
            .option("subscribe", sys.argv[2]).option("startingOffsets", "earliest").load()
            .select("partition", "offset", "key", "value").orderBy("partition", "offset")
            .collect())
    print(json.dumps([[r["partition"], r["offset"], bytes(r["key"]).decode(),
                       bytes(r["value"]).decode()] for r in rows]))
    spark.stop()
""")


def test_tier_to_the_object_store_survives_a_kill_and_an_outage_and_replays(
        strata_broker: BrokerProcess, s3: S3Server, tmp_path: Path) -> None:
    with Admin(strata_broker.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, {
            "tier.enable": "true", "tier.after.ms": "0", "segment.bytes": str(SEGMENT_BYTES),
            "local.retention.ms": "0"})])
    sent = _produce(strata_broker, 8_000)
    closed = {p: end for p, (_, _, end) in _tier_state(strata_broker).items()}
    assert all(0 < end < len(sent[p]) for p, end in closed.items())
    data = f"wh/topics/{TOPIC}/partition="
    first_commit = f"wh/topics/{TOPIC}/_delta_log/00000000000000000001.json"
    log = tmp_path / "tier.log"
    started: list[subprocess.Popen[bytes]] = []
    try:
        # 1. Killed once its tasks have written a data file, before the commit.
        job = _tier_job(strata_broker, s3, log, "--once")
        started.append(job)
        # The table is created (through S3A) before any data file is written: poll
        # slowly until then, then fast enough to catch the files before their commit.
        _wait("the table created", lambda: bool(s3.keys(BUCKET, f"wh/topics/{TOPIC}/")),
              180, job, log)
        _wait("a data file in the store", lambda: s3.keys(BUCKET, data), 180, job, log,
              interval=0.02)
        _kill_group(job)
        assert first_commit not in s3.keys(BUCKET, "wh/"), "killed too late: committed"
        orphans = s3.keys(BUCKET, data)
        assert all(start == 0 and tiered == 0
                   for tiered, start, _ in _tier_state(strata_broker).values())

        # 2. A long-running job; the store goes away while its tasks write.
        job = _tier_job(strata_broker, s3, log, "--every", "1", "--log-level", "warning")
        started.append(job)
        _wait("the second job's data file", lambda: s3.keys(BUCKET, data) - orphans, 180,
              job, log, interval=0.02)
        s3.outage()
        try:
            _wait("the pass failing with TIER_STORE_UNREACHABLE",
                  lambda: "TIER_STORE_UNREACHABLE" in log.read_text(errors="replace"),
                  180, job, log)
            time.sleep(1.0)  # five retention checks of the broker while the store is away
            assert all(start == 0 and tiered == 0
                       for tiered, start, _ in _tier_state(strata_broker).values()), \
                "progress moved or the broker freed segments while the store was away"
        finally:
            s3.restore()
        _wait("the next pass catching up and the broker freeing what it tiered",
              lambda: all(tiered == closed[p] == start for p, (tiered, start, _)
                          in _tier_state(strata_broker).items()), 180, job, log)
        job.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        for process in started:
            if process.poll() is None:
                _kill_group(process)
    output = log.read_text(errors="replace")
    assert SECRET_KEY not in output

    # 3. Exactly the closed segments' records in the table, read from the store.
    from deltalake import DeltaTable

    env = s3.environment()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        table = DeltaTable(f"s3://{BUCKET}/wh/topics/{TOPIC}",
                           storage_options={"AWS_ALLOW_HTTP": "true"})
        rows = pa.table(table.to_pyarrow_dataset().to_table(
            columns=["partition", "offset", "key", "value"])).to_pylist()
    state = _tier_state(strata_broker)
    for p, records in sent.items():
        mine = sorted((r["offset"], r["key"].decode(), r["value"].decode())
                      for r in rows if r["partition"] == p)
        end = state[p][0]
        assert [o for o, _, _ in mine] == list(range(end)), f"partition {p}: offsets"
        assert [(k, v) for _, k, v in mine] == records[:end], f"partition {p}: contents"

    # ... and the Spark source replays from earliest across the store and the hot log.
    replay = subprocess.run([sys.executable, "-c", _REPLAY, strata_broker.bootstrap, TOPIC,
                             f"s3://{BUCKET}/wh"],
                            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr[-4000:]
    assert f"s3a rows {len(rows)}" in replay.stdout
    assert "s3a written 150" in replay.stdout
    assert SECRET_KEY not in replay.stdout + replay.stderr
    replayed = json.loads(replay.stdout.strip().splitlines()[-1])
    for p, records in sent.items():
        mine = [(o, k, v) for q, o, k, v in replayed if q == p]
        assert [o for o, _, _ in mine] == list(range(len(records))), f"partition {p}"
        assert [(k, v) for _, k, v in mine] == records, f"partition {p}: contents"
        assert 0 < state[p][1] < len(records), "the replay did not span both tiers"

    # 4. Maintenance on the store, every commit delta-rs's: the topic made compacted and
    # more records sent, a pass copies them (a second file per partition), MERGEs the
    # latest record per key into compacted/<topic> and OPTIMIZEs and VACUUMs both tables;
    # then total retention DELETEs the tier table's rows and VACUUM (retaining 0 hours)
    # deletes their files from the store.
    with Admin(strata_broker.bootstrap) as admin:
        admin.alter_configs(TOPIC, set={"cleanup.policy": "compact"})
    more = _produce(strata_broker, 4_000)
    for p in sent:
        sent[p].extend(more[p])
    maintain = _tier_job(strata_broker, s3, log, "--once", "--optimize-interval-s", "0")
    assert maintain.wait(300) == 0, log.read_text(errors="replace")[-4000:]
    state = _tier_state(strata_broker)
    assert all(state[p][0] > closed[p] for p in sent), "the pass copied nothing new"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        options = {"AWS_ALLOW_HTTP": "true"}
        tier = DeltaTable(f"s3://{BUCKET}/wh/topics/{TOPIC}", storage_options=options)
        assert "OPTIMIZE" in [h.get("operation") for h in tier.history(10)]
        rows = pa.table(tier.to_pyarrow_dataset().to_table(
            columns=["partition", "offset", "key", "value"])).to_pylist()
        compacted = DeltaTable(f"s3://{BUCKET}/wh/compacted/{TOPIC}", storage_options=options)
        latest = {(r["partition"], r["key"].decode()): r["value"].decode() for r in pa.table(
            compacted.to_pyarrow_dataset().to_table()).to_pylist()}
    model: dict[tuple[int, str], str] = {}
    for p, records in sent.items():
        mine = sorted((r["offset"], r["key"].decode(), r["value"].decode())
                      for r in rows if r["partition"] == p)
        assert [o for o, _, _ in mine] == list(range(state[p][0])), f"partition {p}: offsets"
        assert [(k, v) for _, k, v in mine] == records[:state[p][0]], f"partition {p}"
        for key, value in records[:state[p][0]]:
            model[(p, key)] = value
    assert latest == model
    with Admin(strata_broker.bootstrap) as admin:
        admin.alter_configs(TOPIC, set={"cleanup.policy": "delete", "retention.ms": "0"})
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        tier = DeltaTable(f"s3://{BUCKET}/wh/topics/{TOPIC}", storage_options=options)
        parquet = {uri.removeprefix(f"s3://{BUCKET}/") for uri in tier.file_uris()}
    assert parquet and parquet <= s3.keys(BUCKET, f"wh/topics/{TOPIC}/")
    expire = _tier_job(strata_broker, s3, log, "--once", "--vacuum-retain-hours", "0")
    assert expire.wait(300) == 0, log.read_text(errors="replace")[-4000:]
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        tier = DeltaTable(f"s3://{BUCKET}/wh/topics/{TOPIC}", storage_options=options)
        assert tier.to_pyarrow_dataset().count_rows() == 0
        assert "DELETE" in [h.get("operation") for h in tier.history(10)]
    left = {k for k in s3.keys(BUCKET, f"wh/topics/{TOPIC}/") if k.endswith(".parquet")}
    assert not left & parquet, "VACUUM left the deleted files in the store"
    assert all(start == tiered for tiered, start, _ in _tier_state(strata_broker).values())
    assert SECRET_KEY not in log.read_text(errors="replace")
