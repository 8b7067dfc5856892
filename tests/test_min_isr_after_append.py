"""NOT_ENOUGH_REPLICAS_AFTER_APPEND: the ISR shrinks while an acks=all write waits
(issue [2.1] section 4).

Real ZooKeeper and two real broker processes (tests/support/cluster.py). Topic
``after-append`` has three partitions, each with replicas [0, 1] (broker 0 leads) and
``min.insync.replicas=2``. Broker 1 is SIGSTOPped, so no acks=all write can reach the
high watermark. Writes sent right after the stop are appended by the leader while both
replicas are still in sync, and then they wait. Once broker 1 has not caught up for
``replica.lag.time.max.ms``, the leader shrinks the ISR to [0] in ZooKeeper. The high
watermark then passes the waiting writes, and each is answered
NOT_ENOUGH_REPLICAS_AFTER_APPEND (20): the record is in the log but not acknowledged.
The next write is refused before the append (NOT_ENOUGH_REPLICAS, 19, nothing
written). After SIGCONT, broker 1 catches up and rejoins the ISR, and writes succeed
again.

Partition 0 is written with raw Produce requests, to pin down the wire answers.
Partition 1 is written by an idempotent ``Producer``: it retries, and its retry is
recognised as a duplicate, so the record is in the log once, at its first offset.
Partition 2 is written by a ``Producer`` with ``enable_idempotence=False``: its retry is
appended again, so the record is in the log twice (docs/client.md, "Retries").

Only one race depends on the machine's speed: the writes must reach the leader before it
drops broker 1 from the ISR, which is at least ``replica.lag.time.max.ms`` minus one
follower long poll after the SIGSTOP. The test does not guess whether they did. It
reads the leader's log end offsets: a write that got into the log while the follower was
stopped was appended with the full ISR, because after the shrink every append is refused.
An attempt in which a write came too late proves nothing either way, so it is repeated
with new values. Only if three attempts in a row come too late (this process stalled
for ``replica.lag.time.max.ms`` each time) does the test give up; no other assertion
depends on timing.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from strata.client import Producer, RecordMetadata
from tests.support.cluster import Cluster
from tests.test_broker_api import call, fetch, run, values_at
from tests.test_replication import create_assigned, segment_bytes
from wire.errors import NotEnoughReplicasAfterAppendError, NotEnoughReplicasError
from wire.protocol import (
    ApiKey,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceTopic,
)
from wire.record_batch import build_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "after-append"
RAW, IDEMPOTENT, PLAIN = 0, 1, 2  # partition written by each kind of writer
PARTITIONS = (RAW, IDEMPOTENT, PLAIN)
LEADER, FOLLOWER = 0, 1
#: Short, so that the ISR shrinks about 2 s after the SIGSTOP. A follower long-polls
#: every ``replica.fetch.wait.max.ms`` (500 ms), so it stays in the ISR while it runs.
LAG_TIME_MS = 2000
ATTEMPTS = 3


def produce_all(cluster: Cluster, value: bytes) -> ProducePartitionResponse:
    """One acks=all Produce of ``value`` to partition ``RAW`` on the leader."""
    response = run(call(cluster.brokers[LEADER], ApiKey.PRODUCE, ProduceRequest(
        -1, 30_000, [ProduceTopic(TOPIC, [ProducePartition(RAW, build_batch([value]))])])))
    answer = response.topics[0].partitions[0]
    assert isinstance(answer, ProducePartitionResponse)
    return answer


def leader_offsets(cluster: Cluster, partition: int) -> tuple[int, int]:
    """(high watermark, log end offset) of ``partition`` as the leader reports them."""
    answer = fetch(cluster.brokers[LEADER], TOPIC, partition, 0)
    assert answer.error_code == 0, answer
    return answer.high_watermark, answer.log_end_offset


def committed_values(cluster: Cluster, partition: int) -> list[bytes]:
    """Every record of ``partition`` below the leader's high watermark."""
    answer = fetch(cluster.brokers[LEADER], TOPIC, partition, 0)
    assert answer.error_code == 0, answer
    return values_at(answer, TOPIC, partition) if answer.records else []


def retries_seen(caplog: pytest.LogCaptureFixture, partition: int) -> list[str]:
    """The errors after which the producer retried a batch of ``partition``, in order."""
    prefix = f"{TOPIC}-{partition}: retrying"
    return [r.getMessage().split(" after ", 1)[1] for r in list(caplog.records)
            if r.name == "strata.client.producer" and r.getMessage().startswith(prefix)]


def wait_for_full_isr(cluster: Cluster) -> None:
    for p in PARTITIONS:
        cluster.wait_for(f"p{p} ISR [0, 1]", partial(cluster.isr_of, TOPIC, p),
                         lambda isr: sorted(isr) == [LEADER, FOLLOWER], 60)


def test_an_isr_shrink_under_a_waiting_acks_all_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="strata.client.producer")
    overrides = {"replica.lag.time.max.ms": str(LAG_TIME_MS)}
    with Cluster(tmp_path, brokers=2, overrides=overrides) as cluster:
        create_assigned(cluster, TOPIC, {p: [LEADER, FOLLOWER] for p in PARTITIONS},
                        {"min.insync.replicas": "2"})
        cluster.wait_until_healthy(TOPIC)
        with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=60_000) as idempotent, \
                Producer(cluster.bootstrap, acks="all", enable_idempotence=False,
                         delivery_timeout_ms=60_000) as plain, \
                ThreadPoolExecutor(max_workers=1) as pool:
            # Producer ids and metadata before the stall (InitProducerId needs the cluster).
            idempotent.send(TOPIC, b"warm-up", partition=IDEMPOTENT).result(timeout=60)
            plain.send(TOPIC, b"warm-up", partition=PLAIN).result(timeout=60)
            for attempt in range(1, ATTEMPTS + 1):
                stall = Stall(cluster, attempt, pool, idempotent, plain, caplog)
                if stall.run():
                    break
            else:
                pytest.fail(f"in {ATTEMPTS} attempts the ISR always shrank before the "
                            "writes sent right after the SIGSTOP were appended: this test "
                            f"was stalled for over {LAG_TIME_MS} ms each time")

            # Broker 1 runs again: it catches up and rejoins the ISR.
            wait_for_full_isr(cluster)
            # The idempotent producer's retry was a duplicate: answered with the first
            # offset. The plain producer's retry was appended a second time.
            assert stall.idem_future is not None and stall.plain_future is not None
            assert stall.idem_future.result(timeout=60).offset == stall.before[IDEMPOTENT]
            assert stall.plain_future.result(timeout=60).offset == stall.before[PLAIN] + 1
            accepted = produce_all(cluster, b"accepted")
            assert (accepted.error_code, accepted.base_offset) == (0, stall.before[RAW] + 1), \
                accepted

        hws = cluster.high_watermarks(TOPIC)
        logs = {p: committed_values(cluster, p) for p in PARTITIONS}
        assert len(logs[RAW]) == hws[RAW]
        assert logs[RAW][stall.before[RAW]:] == [stall.raw_value, b"accepted"]
        assert logs[IDEMPOTENT][stall.before[IDEMPOTENT]:] == [stall.idem_value]
        assert logs[IDEMPOTENT].count(stall.idem_value) == 1
        assert logs[PLAIN][stall.before[PLAIN]:] == [stall.plain_value, stall.plain_value]
        assert b"refused" not in logs[RAW]
        # The follower holds the same bytes, the unacknowledged record included.
        cluster.stop_all()
        for p in PARTITIONS:
            copies = {b: segment_bytes(cluster.partition_dir(b, TOPIC, p))
                      for b in (LEADER, FOLLOWER)}
            assert copies[LEADER] == copies[FOLLOWER], f"p{p}: the replicas differ"


class Stall:
    """One attempt: SIGSTOP broker 1, write to every partition, check the answers while
    it is stopped, SIGCONT it (always, even when a check fails).

    ``run()`` is False when a write was not appended before the ISR shrank (this process
    was too slow after the SIGSTOP); the attempt then proves nothing and its writes are
    left to finish.
    """

    def __init__(self, cluster: Cluster, attempt: int, pool: ThreadPoolExecutor,
                 idempotent: Producer, plain: Producer,
                 caplog: pytest.LogCaptureFixture) -> None:
        self.cluster = cluster
        self.attempt = attempt
        self.pool = pool
        self.producers = (idempotent, plain)
        self.caplog = caplog
        self.raw_value, self.idem_value, self.plain_value = (
            f"{kind}-{attempt}".encode() for kind in ("raw", "idempotent", "plain"))
        self.before: dict[int, int] = {}
        self.idem_future: Future[RecordMetadata] | None = None
        self.plain_future: Future[RecordMetadata] | None = None

    def run(self) -> bool:
        cluster = self.cluster
        cluster.wait_until_healthy(TOPIC)
        self.before = {p: cluster.wait_for(
            f"p{p} settled", partial(leader_offsets, cluster, p),
            lambda offsets: offsets[0] == offsets[1], 30)[1] for p in PARTITIONS}
        self.caplog.clear()
        cluster.pause(FOLLOWER)
        try:
            lucky = self._while_stopped()
        finally:
            cluster.resume(FOLLOWER)
        if not lucky:
            assert self.idem_future is not None and self.plain_future is not None
            self.idem_future.result(timeout=60)
            self.plain_future.result(timeout=60)
            wait_for_full_isr(cluster)
        return lucky

    def _while_stopped(self) -> bool:
        cluster, before = self.cluster, self.before
        idempotent, plain = self.producers
        raw_wait = self.pool.submit(produce_all, cluster, self.raw_value)
        self.idem_future = idem = idempotent.send(TOPIC, self.idem_value, partition=IDEMPOTENT)
        self.plain_future = other = plain.send(TOPIC, self.plain_value, partition=PLAIN)
        raw = raw_wait.result(timeout=90)
        # A write in the log now was appended with the full ISR (once a partition's ISR
        # is [0], every append is refused). One not in it yet came too late, or is
        # still on its way: either way this attempt proves nothing for it.
        after = {p: leader_offsets(cluster, p) for p in PARTITIONS}
        appended = {p: after[p][1] - before[p] for p in PARTITIONS}
        assert set(appended.values()) <= {0, 1}, (appended, raw)
        if raw.error_code == NotEnoughReplicasError.code:
            assert appended[RAW] == 0, f"NOT_ENOUGH_REPLICAS, yet written: {raw}"
        if not all(appended.values()):
            cluster.log(f"attempt {self.attempt}: the ISR shrank before every write was "
                        f"appended ({appended}); trying again with new values")
            return False

        # The raw write: in the leader's log, and not acknowledged.
        assert raw.error_code == NotEnoughReplicasAfterAppendError.code, raw
        assert raw.error_message is not None
        assert raw.error_message.startswith(f"{TOPIC}-{RAW}: the write is in the log, "
                                            "but only 1 replica(s) are in sync and "
                                            "min.insync.replicas is 2, so it is not "
                                            "acknowledged; retry"), raw
        assert raw.base_offset == before[RAW]
        assert cluster.isr_of(TOPIC, RAW) == (LEADER,)
        # Committed by the ISR that is left (the leader alone): readable.
        assert after[RAW] == (before[RAW] + 1, before[RAW] + 1)
        assert committed_values(cluster, RAW)[before[RAW]:] == [self.raw_value]

        # The next write is refused before the append.
        refused = produce_all(cluster, b"refused")
        assert refused.error_code == NotEnoughReplicasError.code, refused
        assert refused.error_message is not None
        assert "has 1 in-sync replica(s) [0], min.insync.replicas is 2: nothing was " \
            "written. Retry once" in refused.error_message
        assert refused.base_offset == -1
        assert leader_offsets(cluster, RAW)[1] == before[RAW] + 1

        # Both producers retried (retriable), first after AFTER_APPEND, then after
        # NOT_ENOUGH_REPLICAS for as long as broker 1 stays stopped.
        for p in (IDEMPOTENT, PLAIN):
            seen = cluster.wait_for(f"p{p}: a retry refused before the append",
                                    partial(retries_seen, self.caplog, p),
                                    lambda s: len(s) >= 2, 30)
            assert seen[0].startswith("[NOT_ENOUGH_REPLICAS_AFTER_APPEND] "), seen
            assert all(s.startswith("[NOT_ENOUGH_REPLICAS] ") for s in seen[1:]), seen
        assert not idem.done() and not other.done()
        return True
