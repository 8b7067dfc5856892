"""Fetch sessions (FetchRequest version 1) against a real leader broker.

Two brokers; broker 1 is stopped (its controlled shutdown takes it out of the ISRs) and
this test fetches from broker 0 in its place, as replica 1, so that no real follower's
session gets in the way. What a session must do: answer everything when it opens, then
only partitions that changed; keep the positions it was told; forget partitions on
request; refuse an unknown session or an out-of-step epoch; stay a follower's tool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.test_broker_api import produce
from tests.test_replication import create_assigned
from wire.connection import BrokerConnection
from wire.errors import (
    FetchSessionIdNotFoundError,
    InvalidFetchSessionEpochError,
    InvalidRequestError,
)
from wire.protocol import (
    ApiKey,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ForgottenTopic,
)
from wire.record_batch import build_batch

pytestmark = pytest.mark.integration

TOPIC = "sessions"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # A long lag time: replica 1 is this test's own fetches, which a loaded machine may
    # space out by seconds; an ISR shrink mid-test would move the HW without a follower
    # and break the steps below that count on it (CI, 2026-11-30).
    with Cluster(tmp_path_factory.mktemp("sessions"), brokers=2,
                 overrides={"replica.lag.time.max.ms": "120000"}) as cluster:
        create_assigned(cluster, TOPIC, {p: [0, 1] for p in range(4)})
        assert cluster.stop(1) == 0
        yield cluster


def _answered(response: FetchResponse) -> dict[int, tuple[int, int, int]]:
    """partition -> (error code, high watermark, bytes of records) of an answer."""
    return {a.partition: (a.error_code, a.high_watermark, len(a.records or b""))
            for t in response.topics for a in t.partitions}


def _request(partitions: dict[int, int], *, epoch: int, session_id: int = 0,
             forget: list[int] | None = None, wait_ms: int = 300,
             replica: int = 1) -> FetchRequest:
    return FetchRequest(
        [FetchTopic(TOPIC, [FetchPartition(p, offset, 1 << 20) for p, offset in
                            partitions.items()])] if partitions else [],
        max_wait_ms=wait_ms, replica_id=replica, session_id=session_id, session_epoch=epoch,
        forgotten_topics=[ForgottenTopic(TOPIC, forget)] if forget else [])


def test_a_session_answers_only_what_changed(leader: Cluster) -> None:
    broker = leader.brokers[0]

    async def scenario() -> None:
        async with BrokerConnection("127.0.0.1", broker.port) as connection:
            async def fetch(request: FetchRequest) -> FetchResponse:
                response = await connection.request(ApiKey.FETCH, request, version=1)
                assert isinstance(response, FetchResponse)
                return response

            opened = await fetch(_request({p: 0 for p in range(4)}, epoch=0))
            assert opened.error_code == 0 and opened.session_id != 0
            assert _answered(opened) == {p: (0, 0, 0) for p in range(4)}  # all, at first
            session = opened.session_id

            # Nothing changed: an empty answer after the long poll.
            started = time.monotonic()
            idle = await fetch(_request({}, epoch=1, session_id=session))
            assert idle.error_code == 0 and idle.session_id == session
            assert _answered(idle) == {}
            assert time.monotonic() - started >= 0.25

            # A record on partition 2 (acks=1: the ISR is [0] alone): only it comes back,
            # with its records, and the parked fetch is woken by the append.
            parked = asyncio.ensure_future(fetch(_request({}, epoch=2, session_id=session,
                                                          wait_ms=10_000)))
            await asyncio.sleep(0.3)
            assert not parked.done()
            await asyncio.to_thread(produce, broker, TOPIC, 2, build_batch([b"x"]), 1)
            woken = await asyncio.wait_for(parked, 5)
            (code, _, size), = [v for p, v in _answered(woken).items() if p == 2]
            assert code == 0 and size > 0 and set(_answered(woken)) <= {2}

            # The follower says it has it (offset 1): the HW moves and is reported once,
            # but a moved HW alone does not end the long poll (as in Kafka, only records
            # or an error do): it is told when the poll ends.
            started = time.monotonic()
            caught_up = await fetch(_request({2: 1}, epoch=3, session_id=session))
            assert _answered(caught_up) == {2: (0, 1, 0)}
            assert time.monotonic() - started >= 0.25
            quiet = await fetch(_request({}, epoch=4, session_id=session))
            assert _answered(quiet) == {}

            # A held HW travels with the next answer that has records, however soon.
            await asyncio.to_thread(produce, broker, TOPIC, 2, build_batch([b"z"]), 1)
            second = await fetch(_request({}, epoch=5, session_id=session))
            assert [p for p, (_, _, size) in _answered(second).items() if size] == [2]
            parked = asyncio.ensure_future(fetch(_request({2: 2}, epoch=6, session_id=session,
                                                          wait_ms=10_000)))
            await asyncio.sleep(0.3)
            assert not parked.done(), "a moved HW alone answered the long poll"
            await asyncio.to_thread(produce, broker, TOPIC, 0, build_batch([b"w"]), 1)
            woken = _answered(await asyncio.wait_for(parked, 5))
            assert woken[2] == (0, 2, 0) and woken[0][2] > 0 and set(woken) == {0, 2}

            # A forgotten partition is not answered any more, even with new data.
            forgot = await fetch(_request({0: 1}, epoch=7, session_id=session, forget=[3],
                                          wait_ms=0))
            assert 3 not in _answered(forgot)
            await asyncio.to_thread(produce, broker, TOPIC, 3, build_batch([b"y"]), 1)
            after = await fetch(_request({}, epoch=8, session_id=session, wait_ms=300))
            assert 3 not in _answered(after)

            # Out of step: the session ends; unknown: refused.
            skipped = await fetch(_request({}, epoch=11, session_id=session))
            assert skipped.error_code == InvalidFetchSessionEpochError.code
            assert skipped.topics == []
            gone = await fetch(_request({}, epoch=9, session_id=session))
            assert gone.error_code == FetchSessionIdNotFoundError.code

            # A new session starts from the positions it is given.
            again = await fetch(_request({p: 0 for p in range(4)}, epoch=0))
            assert again.session_id not in (0, session)
            assert _answered(again)[3][2] > 0  # partition 3's record, from offset 0

            # Sessions are for followers: a consumer is told so.
            with pytest.raises(InvalidRequestError, match="fetch sessions are for followers"):
                await connection.request(ApiKey.FETCH, _request({0: 0}, epoch=0, replica=-1),
                                         version=1)

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_idle_followers_in_sessions_stay_in_sync_and_keep_up(tmp_path: Path) -> None:
    """Real followers, in sessions: partitions idle for longer than
    replica.lag.time.max.ms (3 s here) keep their full ISR (each request of a session
    vouches for the partitions it does not list, ``FetchSessionClock``), and a write
    still reaches them."""
    with Cluster(tmp_path, brokers=3) as cluster:
        create_assigned(cluster, "idle", {p: [p % 3, (p + 1) % 3, (p + 2) % 3]
                                          for p in range(6)})
        cluster.wait_until_healthy("idle")
        time.sleep(8)  # more than twice the lag time, with nothing written
        isrs = {p: sorted(cluster.isr_of("idle", p)) for p in range(6)}
        assert isrs == {p: [0, 1, 2] for p in range(6)}, isrs
        leader = cluster.brokers[cluster.leader_of("idle", 4)]
        answer = produce(leader, "idle", 4, build_batch([b"z"]), -1)  # acks=all
        assert answer.error_code == 0, answer
