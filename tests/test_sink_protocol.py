"""The exactly-once sink protocol (StageRecords / CommitStaged / AbortStaged) on real
brokers over TCP, plus the torn-commit recovery of a partition on disk.

What must hold: staged records are invisible until committed; a commit appends every
staged chunk once, as one group; a replayed commit (same or older batch id) appends
nothing, also after a broker restart or SIGKILL; a commit whose staged data is missing
appends nothing; clients cannot forge the broker-only commit bits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from brokers.log import LogConfig
from brokers.partition import Partition
from brokers.staging import StagedPart as BrokerStagedPart
from strata.client import Admin, Consumer, Producer, TopicPartition
from strata.client._cluster import Cluster
from strata.client.sink import (
    SinkCommitter,
    StagedPart,
    StagingWriter,
    sink_producer_id,
)
from tests.support.broker_process import BrokerProcess
from tests.test_broker_api import create
from wire.errors import (
    InvalidRecordBatchError,
    InvalidRequestError,
    OutOfOrderSequenceError,
    StagedDataMissingError,
    raise_for_code,
)
from wire.protocol import (
    ApiKey,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    StagePartition,
    StageRecordsRequest,
    StageRecordsResponse,
    StageTopic,
)
from wire.record_batch import (
    SINK_PRODUCER_ID_BASE,
    build_batch,
    stamp_sink_commit,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _read_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = {tp: consumer.highwater(tp) for tp in tps}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200):
                out[record.partition].append(record.value)
            ends = {tp: consumer.highwater(tp) for tp in tps}
            if all(e is not None and consumer.position(tp) >= e for tp, e in ends.items()):
                break
    return out


def _stage(bootstrap: str, topic: str, chunks: dict[int, list[list[bytes]]]
           ) -> dict[TopicPartition, list[StagedPart]]:
    """One writer stages ``chunks[partition]`` (a list of batches of values)."""
    with StagingWriter(bootstrap) as writer:
        for partition, batches in chunks.items():
            for values in batches:
                writer.stage(topic, partition, build_batch(values))
        writer.flush()
        return {tp: [part] for tp, part in writer.parts().items()}


def _merge(*parts: dict[TopicPartition, list[StagedPart]]
           ) -> dict[TopicPartition, list[StagedPart]]:
    out: dict[TopicPartition, list[StagedPart]] = {}
    for p in parts:
        for tp, staged in p.items():
            out.setdefault(tp, []).extend(staged)
    return out


def test_staged_records_are_invisible_until_the_commit_and_appear_once(
        broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create(broker, "sink-basic", 2)
    a = _stage(bootstrap, "sink-basic", {0: [_values("a0", 3), _values("a0b", 2)],
                                         1: [_values("a1", 4)]})
    b = _stage(bootstrap, "sink-basic", {0: [_values("b0", 1)]})
    assert _read_all(bootstrap, "sink-basic", 2) == {0: [], 1: []}

    pid = sink_producer_id("query-1")
    with SinkCommitter(bootstrap) as committer:
        results = committer.commit(pid, 0, _merge(a, b))
        assert {tp: r.duplicate for tp, r in results.items()} == {
            TopicPartition("sink-basic", 0): False, TopicPartition("sink-basic", 1): False}
        assert results[TopicPartition("sink-basic", 0)].first_offset == 0
        assert results[TopicPartition("sink-basic", 0)].last_offset == 5
        expected = {0: _values("a0", 3) + _values("a0b", 2) + _values("b0", 1),
                    1: _values("a1", 4)}
        assert _read_all(bootstrap, "sink-basic", 2) == expected

        # Spark re-runs the batch (new staging ids) or calls commit twice: nothing new.
        again = _stage(bootstrap, "sink-basic", {0: [_values("a0", 3)], 1: [_values("a1", 4)]})
        replay = committer.commit(pid, 0, again)
        assert all(r.duplicate for r in replay.values())
        assert all(r.first_offset == -1 for r in replay.values())
        # An older batch id is a replay too.
        committer.commit(pid, 1, _stage(bootstrap, "sink-basic", {1: [[b"x"]]}))
        older = committer.commit(pid, 0, _stage(bootstrap, "sink-basic", {1: [[b"y"]]}))
        assert all(r.duplicate for r in older.values())
        expected[1].append(b"x")
        assert _read_all(bootstrap, "sink-basic", 2) == expected

        # Another sink has its own batch ids.
        other = committer.commit(sink_producer_id("query-2"), 0,
                                 _stage(bootstrap, "sink-basic", {1: [[b"z"]]}))
        assert not any(r.duplicate for r in other.values())
        expected[1].append(b"z")
        assert _read_all(bootstrap, "sink-basic", 2) == expected


def test_a_commit_of_missing_or_partial_staged_data_appends_nothing(
        broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create(broker, "sink-missing")
    staged = _stage(bootstrap, "sink-missing", {0: [_values("m", 2), _values("n", 2)]})
    tp = TopicPartition("sink-missing", 0)
    part = staged[tp][0]
    pid = sink_producer_id("missing")
    with SinkCommitter(bootstrap) as committer:
        # Wrong counts for the staged file; or a good file next to one never staged
        # (the good one must not be appended alone).
        for named in ([StagedPart(part.staging_id, part.chunks + 1, part.records)],
                      [StagedPart(part.staging_id, part.chunks, part.records - 1)],
                      [part, StagedPart("never-staged", 1, 1)]):
            with pytest.raises(StagedDataMissingError, match="re-run the batch"):
                committer.commit(pid, 0, {tp: named})
        assert _read_all(bootstrap, "sink-missing", 1) == {0: []}
        # Aborted data is gone: committing it afterwards is refused.
        committer.abort({tp: [part.staging_id]})
        with pytest.raises(StagedDataMissingError):
            committer.commit(pid, 0, staged)
        assert _read_all(bootstrap, "sink-missing", 1) == {0: []}


def _send(bootstrap: str, api: ApiKey, request: Any) -> Any:
    async def go() -> Any:
        cluster = Cluster(bootstrap)
        try:
            leader = await cluster.leader_for("sink-forged", 0)
            connection = await cluster.connection(leader)
            return await connection.request(api, request)
        finally:
            await cluster.close()
    return asyncio.run(go())


def test_clients_cannot_forge_commit_bits_and_the_broker_refuses_chunk_gaps(
        broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create(broker, "sink-forged")
    forged = bytearray(build_batch([b"evil"]))
    stamp_sink_commit(forged, sink_producer_id("victim"), 5, ends_commit=True)

    produce = _send(bootstrap, ApiKey.PRODUCE, ProduceRequest(1, 5000, [ProduceTopic(
        "sink-forged", [ProducePartition(0, bytes(forged))])]))
    assert isinstance(produce, ProduceResponse)
    with pytest.raises(InvalidRecordBatchError, match="only the brokers write"):
        answer = produce.topics[0].partitions[0]
        raise_for_code(answer.error_code, answer.error_message)

    def stage(chunk: int, batch: bytes) -> Any:
        response = _send(bootstrap, ApiKey.STAGE_RECORDS, StageRecordsRequest(
            "writer-1", [StageTopic("sink-forged", [StagePartition(0, chunk, batch)])]))
        assert isinstance(response, StageRecordsResponse)
        return response.topics[0].partitions[0]

    answer = stage(0, bytes(forged))
    with pytest.raises(InvalidRecordBatchError, match="producer id -1"):
        raise_for_code(answer.error_code, answer.error_message)
    assert stage(0, build_batch([b"ok"])).error_code == 0
    assert stage(0, build_batch([b"ok"])).duplicate  # a resend is acknowledged, not written
    answer = stage(2, build_batch([b"gap"]))
    with pytest.raises(OutOfOrderSequenceError, match="chunk 1 is next"):
        raise_for_code(answer.error_code, answer.error_message)
    with SinkCommitter(bootstrap) as committer:
        committer.commit(sink_producer_id("forged"), 0,
                         {TopicPartition("sink-forged", 0): [StagedPart("writer-1", 1, 1)]})
    assert _read_all(bootstrap, "sink-forged", 1) == {0: [b"ok"]}


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_staged_data_and_commit_state_survive_broker_restarts(
        broker_factory: Callable[..., BrokerProcess], how: str) -> None:
    broker_id = 40 if how == "sigterm" else 41
    process = broker_factory(broker_id=broker_id)
    bootstrap = process.bootstrap
    topic = f"sink-restart-{how}"
    create(process, topic, 2)
    staged = _stage(bootstrap, topic, {0: [_values("r0", 3)], 1: [_values("r1", 2)]})

    def restart() -> None:
        if how == "sigterm":
            process.stop()
        else:
            process.kill()
        process.start()

    restart()  # staged, not committed: the staged files must still be there
    bootstrap = process.bootstrap
    pid = sink_producer_id(f"restart-{how}")
    with SinkCommitter(bootstrap) as committer:
        first = committer.commit(pid, 7, staged)
        assert not any(r.duplicate for r in first.values())
    restart()  # committed: the replay must still be recognised (state from the log)
    bootstrap = process.bootstrap
    with SinkCommitter(bootstrap) as committer:
        replay = committer.commit(pid, 7, _stage(bootstrap, topic, {0: [_values("r0", 3)],
                                                                      1: [_values("r1", 2)]}))
        assert all(r.duplicate for r in replay.values())
    assert _read_all(bootstrap, topic, 2) == {0: _values("r0", 3), 1: _values("r1", 2)}


def test_uncommitted_staged_data_expires(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    process = broker_factory(broker_id=42, overrides={
        "sink.staging.retention.ms": "500", "log.retention.check.interval.ms": "200"})
    create(process, "sink-expiry")
    staged = _stage(process.bootstrap, "sink-expiry", {0: [_values("e", 2)]})
    staging_dir = process.data_dir / "sink-expiry-0" / "staging"
    assert list(staging_dir.glob("*.stage"))
    deadline = time.monotonic() + 20
    while list(staging_dir.glob("*.stage")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(staging_dir.glob("*.stage"))
    with SinkCommitter(process.bootstrap) as committer, \
            pytest.raises(StagedDataMissingError):
        committer.commit(sink_producer_id("expiry"), 0, staged)


# ----------------------------------------------------------------------------- on disk


def _partition(directory: Path) -> Partition:
    p = Partition("t", 0, "id", directory, LogConfig(), broker_id=0)
    p.set_state(0, 0, [0], [0])
    return p


def _stage_local(p: Partition, staging_id: str, batches: list[list[bytes]]) -> BrokerStagedPart:
    for i, values in enumerate(batches):
        p.stage(staging_id, i, build_batch(values))
    return BrokerStagedPart(staging_id, len(batches), sum(len(v) for v in batches))


def test_a_commit_torn_by_a_crash_is_removed_whole_on_open(tmp_path: Path) -> None:
    pid = SINK_PRODUCER_ID_BASE + 99
    p = _partition(tmp_path)
    p.commit_staged(pid, 0, [_stage_local(p, "w0", [[b"a"], [b"b"]])])
    end_of_first = p.log.log_end_offset
    p.commit_staged(pid, 1, [_stage_local(p, "w1", [[b"c"], [b"d", b"e"], [b"f"]])])
    assert p.producers.last_commit(pid) == 1
    segment = p.log.active_segment.log_path
    # A crash after the group's first two batches reached the file, not the third:
    # cut the file where the last batch starts, and leave no clean-shutdown marker.
    position = p.log.active_segment.position_of(p.log.log_end_offset - 1)
    assert position is not None
    with open(segment, "r+b") as f:
        f.truncate(position)
    del p  # no close(): a crash

    reopened = _partition(tmp_path)
    assert reopened.log.log_end_offset == end_of_first  # the whole torn group is gone
    assert reopened.producers.last_commit(pid) == 0
    # The writer re-runs batch 1 and it is accepted (not taken for a replay).
    result = reopened.commit_staged(pid, 1, [_stage_local(reopened, "w1b",
                                                          [[b"c"], [b"d", b"e"], [b"f"]])])
    assert not result.duplicate
    assert reopened.log.log_end_offset == end_of_first + 4
    reopened.close()


def test_staged_file_with_a_torn_tail_keeps_whole_chunks(tmp_path: Path) -> None:
    p = _partition(tmp_path)
    _stage_local(p, "w", [[b"1"], [b"2", b"3"]])
    path = tmp_path / "staging" / "w.stage"
    with open(path, "ab") as f:
        f.write(build_batch([b"torn"])[:30])
    p.close()
    reopened = _partition(tmp_path)
    # The writer resends its third chunk: it must follow the two whole ones, not the
    # torn bytes (which recovery cut off), or the commit would find a damaged file.
    assert reopened.stage("w", 2, build_batch([b"4"])) is False
    result = reopened.commit_staged(SINK_PRODUCER_ID_BASE + 1, 0,
                                    [BrokerStagedPart("w", 3, 4)])
    assert result.last_offset - result.first_offset + 1 == 4
    reopened.close()


def test_a_staged_file_damaged_at_rest_or_named_twice_commits_nothing(tmp_path: Path) -> None:
    p = _partition(tmp_path)
    part = _stage_local(p, "w", [[b"1"], [b"2"]])
    with pytest.raises(InvalidRequestError, match="staging id twice"):
        p.commit_staged(SINK_PRODUCER_ID_BASE + 2, 0, [part, part])
    path = tmp_path / "staging" / "w.stage"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit in the last chunk's payload
    path.write_bytes(bytes(data))
    with pytest.raises(StagedDataMissingError, match="is damaged"):
        p.commit_staged(SINK_PRODUCER_ID_BASE + 2, 0, [part])
    assert p.log.log_end_offset == 0
    p.close()


def test_a_sinks_last_batch_survives_retention_and_a_sigkill(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """Retention deletes the segment holding the commit; the broker then crashes (no
    snapshot at close). The batch id must still be known: a snapshot taken before
    retention keeps it."""
    process = broker_factory(broker_id=43, overrides={"log.retention.check.interval.ms": "200"})
    topic = "sink-retention"
    create(process, topic, configs={"segment.bytes": "2048", "retention.ms": "1"})
    pid = sink_producer_id("retention")
    with SinkCommitter(process.bootstrap) as committer:
        committer.commit(pid, 3, _stage(process.bootstrap, topic, {0: [_values("c", 5)]}))
    with Producer(process.bootstrap) as producer:  # roll segments past the commit
        for i in range(60):
            producer.send(topic, f"filler-{i:04d}".encode() * 10, partition=0)
        producer.flush(30)
    deadline = time.monotonic() + 30
    with Admin(process.bootstrap) as admin:
        while time.monotonic() < deadline:
            start = admin.list_offsets({TopicPartition(topic, 0): "earliest"})
            if start[TopicPartition(topic, 0)].offset >= 5:  # offsets 0..4: the commit
                break
            time.sleep(0.2)
        assert start[TopicPartition(topic, 0)].offset >= 5, "retention did not run"
    process.kill()
    process.start()
    with SinkCommitter(process.bootstrap) as committer:
        replay = committer.commit(pid, 3, _stage(process.bootstrap, topic,
                                                 {0: [_values("c", 5)]}))
    assert all(r.duplicate for r in replay.values())
