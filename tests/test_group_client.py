"""The consumer-group client: membership logic and callbacks against a scripted
coordinator (no broker), then a real broker process for the end-to-end paths.

The scripted part swaps the consumer's ``CoordinatorLink`` for ``FakeLink``, which
answers heartbeats with whatever assignment the test sets and records every request,
so the order of commits and callbacks is checked exactly. Bootstrap ``127.0.0.1:1``
refuses connections: metadata and fetches fail as transient errors, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pytest

from strata.client import (
    Admin,
    AsyncConsumer,
    CommitFailedError,
    Consumer,
    IdleTimer,
    NewTopic,
    StrataError,
    TopicPartition,
)
from strata.client._cluster import Cluster
from strata.client._group import (
    AutoCommitTimer,
    CoordinatorLink,
    GroupMember,
    Membership,
    PollTimer,
    group_partitions,
    reconcile,
)
from tests.support.helpers import produce
from wire.errors import (
    FencedMemberEpochError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ApiKey,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    GroupTopicPartitions,
    Message,
)
from wire.protocol.messages import (
    OffsetCommitPartitionResponse,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
)

pytestmark = pytest.mark.integration

NOWHERE = "127.0.0.1:1"
T0, T1, T2, T3 = (TopicPartition("t", p) for p in range(4))


# ----------------------------------------------------------------------------- pure logic


def test_reconcile_revokes_what_left_and_adds_what_is_new() -> None:
    plan = reconcile({T0, T1, T2}, {T1, T2, T3})
    assert plan.revoke == {T0} and plan.assign == {T3}
    assert not reconcile({T0}, {T0})
    assert not reconcile({T0}, None)  # no answer yet: keep what is owned
    eager = reconcile({T0, T1}, set())  # range: everything goes first
    assert eager.revoke == {T0, T1} and not eager.assign


def test_membership_join_heartbeat_fence_rejoin_and_leave() -> None:
    m = Membership("g", instance_id="i-1", session_timeout_ms=6000, assignor="range",
                   subscription=("t",))
    join = m.heartbeat_request()
    assert (join.member_id, join.member_epoch, join.owned) == (None, 0, [])
    assert (join.instance_id, join.session_timeout_ms, join.assignor) == ("i-1", 6000, "range")
    assert join.subscribed_topics == ["t"]
    assert m.leave_request() is None  # never joined: nothing to leave
    m.on_heartbeat(ConsumerGroupHeartbeatResponse(
        0, None, "m1", 3, 250, [GroupTopicPartitions("t", [1, 0])]))
    assert (m.member_id, m.member_epoch, m.heartbeat_interval_ms) == ("m1", 3, 250)
    assert m.pending().assign == {T0, T1} and m.has_work()
    m.owned |= {T0, T1}
    assert not m.has_work() and m.commit_identity() == ("m1", 3)
    beat = m.heartbeat_request()
    assert (beat.member_id, beat.member_epoch) == ("m1", 3)
    assert beat.owned == [GroupTopicPartitions("t", [0, 1])]
    assert m.leave_request() is not None and \
        m.leave_request().member_epoch == STATIC_LEAVE_EPOCH  # type: ignore[union-attr]

    m.fence("FENCED_MEMBER_EPOCH: test")
    assert m.lost and m.pending().revoke == {T0, T1} and not m.pending().assign
    with pytest.raises(CommitFailedError, match="no longer a member"):
        m.commit_identity()
    m.rejoin()
    again = m.heartbeat_request()
    assert (again.member_id, again.member_epoch, again.owned) == (None, 0, [])
    assert again.instance_id == "i-1"  # a static member keeps its instance id
    with pytest.raises(CommitFailedError, match="not joined"):
        m.commit_identity()

    dynamic = Membership("g", member_id="m2", member_epoch=5)
    assert dynamic.leave_request().member_epoch == LEAVE_EPOCH  # type: ignore[union-attr]


def test_heartbeats_report_what_a_pending_poll_may_still_take() -> None:
    """Owned, being taken (on_assign running) and granted by the latest answer all count
    as owned, so the coordinator never hands them on while a poll may still take them."""
    m = Membership("g", member_id="m1", member_epoch=1, subscription=("t",))
    m.on_heartbeat(ConsumerGroupHeartbeatResponse(
        0, None, "m1", 2, 100, [GroupTopicPartitions("t", [0, 1])]))
    assert m.reported() == {T0, T1}  # granted, not taken yet
    m.taking |= m.pending().assign  # the poll's on_assign is running...
    m.on_heartbeat(ConsumerGroupHeartbeatResponse(
        0, None, "m1", 3, 100, [GroupTopicPartitions("t", [1])]))  # ...when T0 moves
    assert m.reported() == {T0, T1}  # still held until the poll gives it back
    m.owned |= m.taking
    m.taking.clear()
    assert m.pending().revoke == {T0}
    m.owned.discard(T0)
    assert m.reported() == {T1}


def test_group_partitions_are_sorted_per_topic() -> None:
    tps = [TopicPartition("b", 2), TopicPartition("a", 1), TopicPartition("b", 0)]
    assert group_partitions(tps) == [GroupTopicPartitions("a", [1]),
                                     GroupTopicPartitions("b", [0, 2])]


def test_auto_commit_timer_with_a_fake_clock() -> None:
    now = [100.0]
    timer = AutoCommitTimer(5_000, clock=lambda: now[0])
    assert not timer.due()
    now[0] = 104.999
    assert not timer.due()
    now[0] = 105.0
    assert timer.due()
    timer.reset()
    now[0] = 109.0
    assert not timer.due()
    now[0] = 110.0
    assert timer.due()


def test_poll_timer_runs_only_between_polls() -> None:
    now = [100.0]
    timer = PollTimer(5_000, clock=lambda: now[0])
    assert timer.remaining_s() == 5.0 and not timer.expired()
    now[0] = 104.0
    timer.enter()  # a poll that waits a long time is the application polling
    now[0] = 200.0
    assert timer.remaining_s() == 5.0 and not timer.expired()
    timer.exit()
    now[0] = 204.999
    assert not timer.expired()
    now[0] = 205.0
    assert timer.expired()
    timer.reset()
    assert not timer.expired()
    timer.exit()  # unbalanced: never below zero
    timer.enter()
    assert timer.remaining_s() == 5.0


def test_idle_timer_counts_only_time_inside_empty_polls() -> None:
    now = [0.0]
    idle = IdleTimer(1_000, clock=lambda: now[0])
    assert not idle.expired
    idle.start()
    now[0] += 0.2
    idle.stop(3)  # records: the caller now prints them, for a long time
    now[0] += 60.0
    assert not idle.expired
    for _ in range(4):
        idle.start()
        now[0] += 0.2
        idle.stop(0)
    assert not idle.expired  # 0.8 s of empty polls
    now[0] += 30.0  # between polls: not silence either
    idle.start()
    now[0] += 0.2
    idle.stop(0)
    assert idle.expired
    idle.progress()
    assert not idle.expired
    zero = IdleTimer(0, clock=lambda: now[0])
    assert not zero.expired  # expires only after an empty poll
    zero.start()
    zero.stop(0)
    assert zero.expired
    never = IdleTimer(None, clock=lambda: now[0])
    never.start()
    now[0] += 1e6
    never.stop(0)
    assert not never.expired


# ----------------------------------------------------------------------------- options


def test_bad_group_options_are_refused_before_anything_is_sent() -> None:
    for kwargs, words in (
            ({"group_id": ""}, "group_id"),
            ({"group_instance_id": "x"}, "needs a group_id"),
            ({"group_id": "g", "group_instance_id": " "}, "group_instance_id"),
            ({"group_id": "g", "session_timeout_ms": 0}, "session_timeout_ms"),
            ({"group_id": "g", "rebalance_timeout_ms": 0}, "rebalance_timeout_ms"),
            ({"group_id": "g", "max_poll_interval_ms": 0}, "max_poll_interval_ms"),
            ({"group_id": "g", "assignor": "roundrobin"}, "cooperative-sticky, range"),
            ({"group_id": "g", "auto_commit_interval_ms": 0}, "auto_commit_interval_ms"),
            ({"group_id": "g", "enable_auto_commit": "yes"}, "enable_auto_commit")):
        with pytest.raises(ValueError, match=words):
            AsyncConsumer(NOWHERE, **kwargs)


def test_assign_and_subscribe_are_mutually_exclusive() -> None:
    async def run() -> None:
        alone = AsyncConsumer(NOWHERE)
        with pytest.raises(ValueError, match="group_id"):
            alone.subscribe(["t"])
        with pytest.raises(ValueError, match="group_id"):
            await alone.commit({T0: 1})
        await alone.close()

        manual = AsyncConsumer(NOWHERE, group_id="g")
        manual.assign([T0])
        with pytest.raises(RuntimeError, match="cannot be mixed"):
            manual.subscribe(["t"])
        manual.assign([])
        manual.subscribe("t")  # allowed once the manual assignment is gone
        with pytest.raises(RuntimeError, match="subscribed"):
            manual.assign([T0])
        for bad in ([], [""], "", [3]):
            with pytest.raises(ValueError, match="topic names"):
                manual.subscribe(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="callable"):
            manual.subscribe(["t"], on_assign="nope")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="offset"):
            await manual.commit({T0: -1})
        assert manual.subscription() == {"t"}
        await manual.close()

    asyncio.run(run())


# ----------------------------------------------------------------------------- scripted


class FakeLink:
    """Stands in for ``CoordinatorLink``: answers heartbeats with ``assignment``."""

    request_timeout_s = 5.0

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.assignment: set[TopicPartition] = set()
        self.epoch = 1
        self.joins = 0
        self.fence_next: type[StrataError] | None = None
        self.commit_errors: dict[TopicPartition, StrataError] = {}
        self.offsets: dict[TopicPartition, int] = {}
        self.heartbeats: list[ConsumerGroupHeartbeatRequest] = []

    def invalidate(self) -> None:
        pass

    async def request(self, api: ApiKey, body: Message, *, timeout_s: float | None = None,
                      check: Callable[[Message], StrataError | None] | None = None,
                      attempt_timeout_s: float | None = None) -> Message:
        assert api == ApiKey.CONSUMER_GROUP_HEARTBEAT
        assert isinstance(body, ConsumerGroupHeartbeatRequest)
        self.heartbeats.append(body)
        if body.member_epoch < 0:
            self.log.append(("leave", body.member_epoch))
            return ConsumerGroupHeartbeatResponse(0, None, body.member_id, body.member_epoch)
        if self.fence_next is not None:
            error, self.fence_next = self.fence_next, None
            raise error("scripted")
        member_id = body.member_id
        if member_id is None:
            self.joins += 1
            member_id = f"m{self.joins}"
        return ConsumerGroupHeartbeatResponse(0, None, member_id, self.epoch, 20,
                                              group_partitions(self.assignment))

    async def commit(self, member_id: str | None, member_epoch: int,
                     offsets: Mapping[TopicPartition, int], *, timeout_s: float | None = None,
                     metadata: str | None = None
                     ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, StrataError]]:
        self.log.append(("commit", member_id, dict(offsets)))
        failed = {tp: self.commit_errors[tp] for tp in offsets if tp in self.commit_errors}
        done = {tp: o for tp, o in offsets.items() if tp not in failed}
        self.offsets.update(done)
        return done, failed

    async def committed(self, partitions: Iterable[TopicPartition], *,
                        timeout_s: float | None = None,
                        require_stable: bool = False) -> dict[TopicPartition, int | None]:
        return {tp: self.offsets.get(tp) for tp in partitions}


def scripted(**kwargs: Any) -> tuple[AsyncConsumer, FakeLink, list[tuple[Any, ...]]]:
    log: list[tuple[Any, ...]] = []
    consumer = AsyncConsumer(NOWHERE, group_id="g", retry_backoff_ms=10, **kwargs)
    link = FakeLink(log)
    assert consumer._group is not None
    consumer._group.link = link  # type: ignore[assignment]
    return consumer, link, log


async def poll_until(consumer: AsyncConsumer, done: Callable[[], bool],
                     timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "condition not reached"
        await consumer.poll(timeout_ms=50)


def test_callbacks_follow_the_assignment_and_revoke_commits_first() -> None:
    async def run() -> None:
        consumer, link, log = scripted(auto_offset_reset="earliest")
        link.offsets = {T0: 5}
        link.assignment = {T0, T1}
        consumer.subscribe(["t"], on_assign=lambda ps: log.append(("assign", ps)),
                           on_revoke=lambda ps: log.append(("revoke", ps)))
        await poll_until(consumer, lambda: consumer.assignment() == {T0, T1})
        assert log == [("assign", {T0, T1})]
        # Before the member reports T0 and T1, it heartbeats owning nothing.
        await poll_until(consumer, lambda: any(
            hb.owned == [GroupTopicPartitions("t", [0, 1])] for hb in link.heartbeats))
        assert consumer.member_id == "m1"
        assert consumer._subscription.states[T0].position == 5  # the committed offset

        # Records up to 9 and 3 were returned by poll: pretend so.
        consumer._subscription.states[T0].reposition(9)
        consumer._subscription.states[T1].reposition(3)
        link.epoch = 2
        link.assignment = {T0, T2}
        await poll_until(consumer, lambda: consumer.assignment() == {T0, T2})
        # Auto-commit of the revoked partition comes before on_revoke, then the assign.
        assert log[1:] == [("commit", "m1", {T1: 3}), ("revoke", {T1}), ("assign", {T2})]
        await poll_until(consumer, lambda: link.heartbeats[-1].owned == [
            GroupTopicPartitions("t", [0, 2])])
        assert link.heartbeats[-1].member_epoch == 2

        log.clear()
        await consumer.close()
        # close: auto-commit what is owned, on_revoke, then leave (epoch -1).
        assert [entry[0] for entry in log] == ["commit", "revoke", "leave"]
        assert log[0][2] == {T0: 9}
        assert log[2] == ("leave", LEAVE_EPOCH)

    asyncio.run(run())


def test_fenced_member_loses_partitions_commit_fails_and_it_rejoins() -> None:
    async def run() -> None:
        consumer, link, log = scripted(enable_auto_commit=False, group_instance_id="box-1")
        link.assignment = {T0}
        lost: list[set[TopicPartition]] = []
        revoked: list[set[TopicPartition]] = []
        consumer.subscribe(["t"], on_revoke=revoked.append, on_lost=lost.append)
        await poll_until(consumer, lambda: consumer.assignment() == {T0})
        consumer.seek(T0, 42)

        # The coordinator fences the member: its commit must fail loudly, not pass.
        link.fence_next = FencedMemberEpochError
        assert consumer._group is not None
        consumer._group.heartbeat_now()
        await asyncio.sleep(0.1)
        with pytest.raises(CommitFailedError, match="no longer a member") as failed:
            await consumer.commit()
        assert failed.value.code == 1300 and failed.value.name == "COMMIT_FAILED"
        assert not any(entry[0] == "commit" for entry in log)

        # The next poll runs on_lost (not on_revoke) and rejoins with epoch 0.
        link.assignment = {T1}
        await poll_until(consumer, lambda: consumer.assignment() == {T1})
        assert lost == [{T0}] and revoked == []
        rejoin = next(hb for hb in link.heartbeats if hb.member_id is None and
                      hb is not link.heartbeats[0])
        assert rejoin.member_epoch == 0 and rejoin.instance_id == "box-1"
        assert consumer.member_id == "m2"

        # A commit refused by the coordinator (the member is unknown there) also fails
        # and marks the partitions lost.
        link.commit_errors = {T1: UnknownMemberIdError("gone")}
        with pytest.raises(CommitFailedError, match="UNKNOWN_MEMBER_ID") as refused:
            await consumer.commit({T1: 7})
        assert isinstance(refused.value.failed[T1], UnknownMemberIdError)
        await poll_until(consumer, lambda: lost == [{T0}, {T1}])

        # STALE_MEMBER_EPOCH: that partition moved; the others are committed.
        await poll_until(consumer, lambda: consumer.member_id == "m3" and
                         consumer.assignment() == {T1})
        link.assignment = {T1, T2}
        await poll_until(consumer, lambda: consumer.assignment() == {T1, T2})
        link.commit_errors = {T2: StaleMemberEpochError("moved")}
        with pytest.raises(CommitFailedError, match="STALE_MEMBER_EPOCH") as stale:
            await consumer.commit({T1: 8, T2: 9})
        assert stale.value.committed == {T1: 8} and set(stale.value.failed) == {T2}

        log.clear()
        await consumer.close()
        assert log[-1] == ("leave", STATIC_LEAVE_EPOCH)  # a static member's temporary leave

    asyncio.run(run())


@pytest.mark.parametrize("instance_id", [None, "box-1"], ids=["dynamic", "static"])
def test_a_member_that_stops_polling_leaves_and_its_next_poll_rejoins(
        instance_id: str | None, caplog: pytest.LogCaptureFixture) -> None:
    """KIP-62: heartbeats go on in the background, so only ``max_poll_interval_ms``
    notices an application that stopped polling. The member leaves (epoch -1; -2 for a
    static member, as Kafka's consumer does), warns naming the setting, refuses a commit
    without sending it, and its next poll runs on_lost and rejoins."""
    async def run() -> None:
        consumer, link, log = scripted(enable_auto_commit=False, max_poll_interval_ms=300,
                                       group_instance_id=instance_id)
        link.assignment = {T0, T1}
        lost: list[set[TopicPartition]] = []
        consumer.subscribe(["t"], on_lost=lost.append)
        await poll_until(consumer, lambda: consumer.assignment() == {T0, T1})
        consumer.seek(T0, 42)
        # The application is stuck (not polling) while the heartbeat task runs; a
        # poll that waits longer than the interval must not count as stuck.
        await consumer.poll(timeout_ms=600)
        assert not any(entry[0] == "leave" for entry in log)
        with caplog.at_level("WARNING", logger="strata.client.group"):
            await asyncio.sleep(0.6)
        leave = STATIC_LEAVE_EPOCH if instance_id else LEAVE_EPOCH
        assert ("leave", leave) in log
        assert "max_poll_interval_ms" in caplog.text and "300 ms" in caplog.text
        with pytest.raises(CommitFailedError, match="MAX_POLL_INTERVAL"):
            await consumer.commit()
        assert not any(entry[0] == "commit" for entry in log)
        joins = link.joins
        link.assignment = {T1}
        await poll_until(consumer, lambda: consumer.assignment() == {T1})
        assert lost == [{T0, T1}] and link.joins == joins + 1
        rejoin = [hb for hb in link.heartbeats if hb.member_id is None][-1]
        assert rejoin.member_epoch == 0 and rejoin.instance_id == instance_id
        # Polling again regularly keeps it in the group.
        log.clear()
        for _ in range(8):
            await consumer.poll(timeout_ms=50)
            await asyncio.sleep(0.05)
        assert not any(entry[0] == "leave" for entry in log)
        await consumer.close()

    asyncio.run(run())


def test_the_blocking_consumer_leaves_when_its_caller_stops_polling() -> None:
    """The same through the blocking face: the caller's thread is busy (a sleep stands
    for stuck processing) while the loop thread heartbeats."""
    log: list[tuple[Any, ...]] = []
    consumer = Consumer(NOWHERE, group_id="g", retry_backoff_ms=10, enable_auto_commit=False,
                        max_poll_interval_ms=300)
    link = FakeLink(log)
    assert consumer._consumer._group is not None
    consumer._consumer._group.link = link  # type: ignore[assignment]
    link.assignment = {T0}
    lost: list[set[TopicPartition]] = []
    try:
        consumer.subscribe(["t"], on_lost=lost.append)
        deadline = time.monotonic() + 30
        while consumer.assignment() != {T0}:
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=50)
        consumer.poll(timeout_ms=500)  # a long poll is not stuck
        assert ("leave", LEAVE_EPOCH) not in log
        time.sleep(0.8)  # stuck processing
        assert ("leave", LEAVE_EPOCH) in log
        with pytest.raises(CommitFailedError, match="max_poll_interval_ms"):
            consumer.commit({T0: 5})
        while not lost:
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=50)
        assert lost == [{T0}]
    finally:
        consumer.close()


def test_auto_commit_in_poll_commits_only_returned_positions() -> None:
    async def run() -> None:
        consumer, link, log = scripted(auto_commit_interval_ms=60_000)
        now = [0.0]
        consumer._offsets.auto_commit_timer = AutoCommitTimer(1_000, clock=lambda: now[0])
        link.offsets = {T0: 10}
        link.assignment = {T0}
        consumer.subscribe(["t"])
        await poll_until(consumer, lambda: consumer._subscription.states.get(T0) is not None and
                         consumer._subscription.states[T0].position == 10)
        await consumer.poll(timeout_ms=0)
        assert not [e for e in log if e[0] == "commit"]  # not due yet
        now[0] = 1.0
        await consumer.poll(timeout_ms=0)
        await asyncio.sleep(0.05)
        assert not [e for e in log if e[0] == "commit"]  # due, but nothing new to commit
        consumer._subscription.states[T0].reposition(17)  # poll returned records up to 16
        now[0] = 2.5
        await consumer.poll(timeout_ms=0)
        await asyncio.sleep(0.05)
        assert [e for e in log if e[0] == "commit"] == [("commit", "m1", {T0: 17})]
        await consumer.close()

    asyncio.run(run())


@pytest.mark.parametrize("fails", [False, True])
def test_close_after_a_processing_error_does_not_commit_the_last_poll(fails: bool) -> None:
    async def run() -> None:
        consumer, link, log = scripted()
        link.offsets = {T0: 5}
        link.assignment = {T0}
        with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
            async with consumer:
                consumer.subscribe(["t"])
                await poll_until(consumer, lambda: consumer._subscription.states.get(T0) is not None
                                 and consumer._subscription.states[T0].position == 5)
                await consumer.poll(timeout_ms=0)  # the last poll: "returns" 5..8
                consumer._subscription.states[T0].position = 9
                if fails:
                    raise RuntimeError("processing record 6 failed")
        commits = [entry for entry in log if entry[0] == "commit"]
        # A clean exit commits what the last poll returned; a failed one stops before it.
        assert commits == ([] if fails else [("commit", "m1", {T0: 9})])

    asyncio.run(run())


def test_commit_from_on_revoke_after_a_processing_error_stops_before_the_last_poll(
) -> None:
    """A plain ``commit()`` in ``on_revoke`` during the close of a failed ``with`` block
    applies the same limit as the auto-commit: the last poll's records are unprocessed."""
    async def run() -> None:
        consumer, link, log = scripted(enable_auto_commit=False)
        link.offsets = {T0: 5}
        link.assignment = {T0}
        with pytest.raises(RuntimeError):
            async with consumer:
                consumer.subscribe(["t"], on_revoke=lambda ps: consumer.commit())
                await poll_until(consumer, lambda: consumer._subscription.states.get(T0) is not None
                                 and consumer._subscription.states[T0].position == 5)
                await consumer.poll(timeout_ms=0)  # the last poll: "returns" 5..504
                consumer._subscription.states[T0].position = 505
                raise RuntimeError("processing record 8 failed")
        assert [e for e in log if e[0] == "commit"] == [("commit", "m1", {T0: 5})]

    asyncio.run(run())


def test_async_commit_reports_through_callback_or_next_commit() -> None:
    async def run() -> None:
        consumer, link, _ = scripted(enable_auto_commit=False)
        link.assignment = {T0}
        consumer.subscribe(["t"])
        await poll_until(consumer, lambda: consumer.assignment() == {T0}
                         and consumer._group is not None
                         and T0 in consumer._group.membership.owned)
        outcomes: list[tuple[dict[TopicPartition, int], StrataError | None]] = []
        task = await consumer.commit({T0: 3}, asynchronous=True,
                                     callback=lambda o, e: outcomes.append((o, e)))
        assert await task == {T0: 3}
        await consumer.poll(timeout_ms=0)  # callbacks run inside poll
        assert outcomes == [({T0: 3}, None)]

        link.commit_errors = {T0: StaleMemberEpochError("moved")}
        task = await consumer.commit({T0: 4}, asynchronous=True)
        with pytest.raises(CommitFailedError):
            await task
        with pytest.raises(CommitFailedError, match="STALE"):  # reported by the next one
            await consumer.commit({T0: 5})
        await consumer.close()

    asyncio.run(run())


def test_async_commits_made_while_one_is_on_its_way_are_merged() -> None:
    """A caller committing asynchronously after every poll against a slow coordinator
    must not build a queue that a later synchronous commit (e.g. a revocation's) waits
    behind: one commit is on its way at a time, the others go out merged, in order."""
    async def run() -> None:
        consumer, link, log = scripted(enable_auto_commit=False)
        link.assignment = {T0, T1}
        consumer.subscribe(["t"])
        await poll_until(consumer, lambda: consumer._group is not None
                         and consumer._group.membership.owned == {T0, T1})
        slow = link.commit

        async def slow_commit(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.2)
            return await slow(*args, **kwargs)

        link.commit = slow_commit  # type: ignore[method-assign]
        outcomes: list[tuple[dict[TopicPartition, int], StrataError | None]] = []
        tasks = []
        for i in range(1, 21):  # odd: T0 alone, even: both
            tasks.append(await consumer.commit({T0: i} if i % 2 else {T0: i, T1: 100 + i},
                                               asynchronous=True,
                                               callback=lambda o, e: outcomes.append((o, e))))
            await asyncio.sleep(0)  # the first goes out; the others arrive while it flies
        assert await consumer.commit({T1: 500}) == {T1: 500}  # after every async one
        sent = [entry[2] for entry in log if entry[0] == "commit"]
        assert sent == [{T0: 1}, {T0: 20, T1: 120}, {T1: 500}]
        assert link.offsets == {T0: 20, T1: 500}
        results = [await task for task in tasks]
        assert results[0] == {T0: 1}
        # Each call reports its own partitions, at what was stored for them.
        assert results[1] == {T0: 20, T1: 120} and results[2] == {T0: 20}
        await consumer.poll(timeout_ms=0)  # the callbacks run inside poll
        assert len(outcomes) == 20 and all(error is None for _, error in outcomes)
        await consumer.close()

    asyncio.run(run())


def test_blocking_consumer_runs_callbacks_on_the_polling_thread() -> None:
    log: list[tuple[Any, ...]] = []
    consumer = Consumer(NOWHERE, group_id="g", retry_backoff_ms=10,
                        enable_auto_commit=False)
    link = FakeLink(log)
    assert consumer._consumer._group is not None
    consumer._consumer._group.link = link  # type: ignore[assignment]
    threads: list[str] = []

    def on_revoke(partitions: set[TopicPartition]) -> None:
        threads.append(threading.current_thread().name)
        consumer.commit({tp: 1 for tp in partitions})  # a blocking call from a callback

    try:
        link.assignment = {T0, T1}
        consumer.subscribe(["t"], on_assign=lambda ps: threads.append(
            threading.current_thread().name), on_revoke=on_revoke)
        deadline = time.monotonic() + 30
        while consumer.assignment() != {T0, T1}:
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=50)
        link.assignment = {T0}
        while consumer.assignment() != {T0}:
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=50)
        assert threads == [threading.current_thread().name] * 2
        assert ("commit", "m1", {T1: 1}) in log
        done: list[tuple[Any, ...]] = []
        future = consumer.commit({T0: 2}, asynchronous=True, callback=lambda o, e: done.append(
            (o, e, threading.current_thread().name)))
        assert future.result(timeout=5) == {T0: 2}
        assert done == []  # delivered inside the next poll, on this thread
        consumer.poll(timeout_ms=0)
        assert done == [({T0: 2}, None, threading.current_thread().name)]
    finally:
        consumer.close()
    assert log[-1] == ("leave", LEAVE_EPOCH)


def test_interrupted_poll_gives_its_records_back() -> None:
    async def run() -> None:
        consumer = AsyncConsumer(NOWHERE, group_id="g", enable_auto_commit=False)
        consumer.assign([T0, T1])
        consumer.seek(T0, 10)
        consumer.seek(T1, 20)
        consumer._subscription.states[T0].position = 13  # records 10..12 drained, never delivered
        table = pa.table({"topic": ["t", "t", "t"], "partition": [0, 0, 0],
                          "offset": [10, 11, 12]})
        consumer._offsets.rewind(table)
        states = consumer._subscription.states
        assert states[T0].position == 10 and states[T1].position == 20
        await consumer.close()

    asyncio.run(run())


# ----------------------------------------------------------------------------- real broker


@pytest.fixture
def topic(bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Callable[[int], str]]:
    """Create a fresh topic with ``n`` partitions, named after the test."""
    made: list[str] = []

    def make(partitions: int) -> str:
        name = f"{request.node.name[:40]}-{len(made)}".replace("[", "-").replace("]", "")
        with Admin(bootstrap) as admin:
            admin.create_topics([NewTopic(name, partitions, 1)])
        made.append(name)
        return name

    yield make


def drain(consumers: list[Consumer], until: Callable[[], bool], timeout: float = 20.0,
          into: list[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        for consumer in consumers:
            records = consumer.poll(timeout_ms=50)
            if into is not None:
                into.extend((id(consumer), r.partition, r.offset) for r in records)


def test_two_members_split_the_partitions_and_commits_round_trip(
        bootstrap: str, topic: Callable[[int], str]) -> None:
    name = topic(4)
    produce(bootstrap, name, 200, 4)
    events: list[tuple[str, str, frozenset[int]]] = []

    def tracked(label: str) -> dict[str, Any]:
        return {"on_assign": lambda ps: events.append((label, "assign", frozenset(
                    tp.partition for tp in ps))),
                "on_revoke": lambda ps: events.append((label, "revoke", frozenset(
                    tp.partition for tp in ps)))}

    seen: list[Any] = []
    first = Consumer(bootstrap, group_id="split", auto_offset_reset="earliest",
                     enable_auto_commit=False)
    second = Consumer(bootstrap, group_id="split", auto_offset_reset="earliest",
                      enable_auto_commit=False)
    try:
        first.subscribe([name], **tracked("first"))
        drain([first], lambda: len(first.assignment()) == 4, into=seen)
        second.subscribe([name], **tracked("second"))
        drain([first, second], lambda: len(first.assignment()) == 2
              and len(second.assignment()) == 2
              and len({(p, o) for _, p, o in seen}) >= 200, into=seen)
        assert first.assignment().isdisjoint(second.assignment())
        # Every record once: the partitions moved only after on_revoke, from offset 0
        # (nothing was committed), so moved partitions may be read twice, never skipped.
        assert {(p, o) for _, p, o in seen} == {(p, o) for p in range(4) for o in range(50)}
        revoked = next(ps for who, what, ps in events if who == "first" and what == "revoke")
        given = next(ps for who, what, ps in events if who == "second" and what == "assign")
        assert revoked == given
        assert [e[:2] for e in events] == [("first", "assign"), ("first", "revoke"),
                                           ("second", "assign")]

        mine = {tp: first.position(tp) for tp in first.assignment()}
        assert first.commit() == mine
        assert first.committed(list(mine)) == mine
        assert second.committed([TopicPartition(name, p) for p in range(4)]) == \
            {TopicPartition(name, p): mine.get(TopicPartition(name, p)) for p in range(4)}
    finally:
        second.close()
        first.close()
    # A new member of the group resumes where the group committed.
    with Consumer(bootstrap, group_id="split", auto_offset_reset="earliest") as third:
        third.subscribe(name)
        drain([third], lambda: len(third.assignment()) == 4)
        for tp, offset in mine.items():
            assert third.position(tp) == offset


@pytest.mark.parametrize("how", ["auto-commit", "commit-in-on-revoke"])
def test_revoke_commits_reset_position(
        bootstrap: str, topic: Callable[[int], str], how: str) -> None:
    """As in Kafka: a member that gives up a partition it has a position for, even one
    from auto_offset_reset with no record delivered yet, commits that position, so the
    next owner starts there instead of resetting to "latest" again and skipping what was
    produced in between. Both ways a consumer commits: auto-commit, and commit() from
    on_revoke (what ``strata consume --group`` does)."""
    name = topic(2)
    produce(bootstrap, name, 10, 2)  # "latest" is 5 in each partition
    auto = how == "auto-commit"
    first = Consumer(bootstrap, group_id=f"reset-{how}", enable_auto_commit=auto)
    second = Consumer(bootstrap, group_id=f"reset-{how}", enable_auto_commit=auto)
    tps = [TopicPartition(name, p) for p in range(2)]
    try:
        first.subscribe([name], on_revoke=None if auto else lambda ps: first.commit())
        drain([first], lambda: first.assignment() == set(tps))
        assert {tp: first.position(tp) for tp in tps} == dict.fromkeys(tps, 5)
        produce(bootstrap, name, 6, 2)  # offsets 5..7 in each, never delivered to first
        second.subscribe([name])
        group = first._consumer._group
        assert group is not None
        deadline = time.monotonic() + 20
        while not group.membership.pending().revoke:  # first's heartbeats, not its polls
            assert time.monotonic() < deadline, "first was never asked to give one up"
            second.poll(timeout_ms=50)
        seen: list[Any] = []
        drain([first, second], lambda: len(second.assignment()) == 1, into=seen)
        [moved] = second.assignment()
        drain([second], lambda: len([r for r in seen if r[1] == moved.partition]) >= 3,
              into=seen)
        # The next owner read the three records produced while first held the partition.
        assert sorted(o for who, p, o in seen if p == moved.partition
                      and who == id(second)) == [5, 6, 7]
    finally:
        second.close()
        first.close()


def test_auto_commit_and_close_commit_what_poll_returned(
        bootstrap: str, topic: Callable[[int], str]) -> None:
    name = topic(2)
    produce(bootstrap, name, 40, 2)
    tps = [TopicPartition(name, p) for p in range(2)]
    returned: list[Any] = []
    with Consumer(bootstrap, group_id="auto", auto_offset_reset="earliest",
                  auto_commit_interval_ms=100, max_poll_records=5) as consumer:
        consumer.subscribe([name])
        drain([consumer], lambda: len(returned) >= 10, into=returned)
        before = {tp: consumer.position(tp) for tp in tps}
        time.sleep(0.15)
        # Due: this poll commits what the earlier polls returned, before it hands out more.
        assert len(consumer.poll(timeout_ms=1_000, max_records=1)) == 1
        deadline = time.monotonic() + 10
        while consumer.committed(tps) != before:  # the commit runs in the background
            assert time.monotonic() < deadline, consumer.committed(tps)
            time.sleep(0.05)
        drain([consumer], lambda: all(consumer.position(tp) == 20 for tp in tps))
    with Admin(bootstrap) as admin:
        final = admin.list_group_offsets("auto")
    assert {tp: c.offset for tp, c in final.items()} == dict.fromkeys(tps, 20)  # by close()


def test_fenced_member_commit_fails_and_it_rejoins(bootstrap: str,
                                                    topic: Callable[[int], str]) -> None:
    name = topic(1)
    lost: list[set[TopicPartition]] = []
    consumer = Consumer(bootstrap, group_id="fenced", session_timeout_ms=1_000,
                        enable_auto_commit=False)
    try:
        consumer.subscribe([name], on_lost=lost.append)
        drain([consumer], lambda: len(consumer.assignment()) == 1)
        old = consumer.member_id
        # Silence the heartbeats (what SIGSTOP does to a real process) past the session.
        assert consumer._consumer._group is not None
        consumer._run(consumer._consumer._group.stop())
        with Admin(bootstrap) as admin:
            deadline = time.monotonic() + 15
            while "fenced" in {g.group_id for g in admin.list_groups() if g.members}:
                assert time.monotonic() < deadline, "the member was never removed"
                time.sleep(0.2)
        with pytest.raises(CommitFailedError, match="no longer a member"):
            consumer.commit({TopicPartition(name, 0): 0})
        drain([consumer], lambda: bool(lost) and len(consumer.assignment()) == 1)
        assert lost == [{TopicPartition(name, 0)}]
        assert consumer.member_id not in (None, old)
        assert consumer.commit({TopicPartition(name, 0): 0}) == {TopicPartition(name, 0): 0}
    finally:
        consumer.close()


def test_manual_assignment_commits_outside_membership(bootstrap: str,
                                                      topic: Callable[[int], str]) -> None:
    name = topic(1)
    produce(bootstrap, name, 10, 1)
    tp = TopicPartition(name, 0)
    with Consumer(bootstrap, group_id="manual", auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        assert consumer.committed([tp]) == {tp: None}
        assert consumer.commit({tp: 4}) == {tp: 4}
    with Consumer(bootstrap, group_id="manual", auto_offset_reset="earliest") as again:
        again.assign([tp])
        assert again.position(tp) == 4  # starts at the committed offset
        records = again.poll(timeout_ms=5_000, max_records=2)
        assert [r.offset for r in records] == [4, 5]
    # close() auto-committed the position after the returned records
    with Admin(bootstrap) as admin:
        assert admin.list_group_offsets("manual")[tp].offset == 6


def test_range_assignor_revokes_everything_then_splits(bootstrap: str,
                                                       topic: Callable[[int], str]) -> None:
    name = topic(4)
    events: list[tuple[str, str, frozenset[int]]] = []

    def tracked(label: str) -> dict[str, Any]:
        return {"on_assign": lambda ps: events.append((label, "assign", frozenset(
                    tp.partition for tp in ps))),
                "on_revoke": lambda ps: events.append((label, "revoke", frozenset(
                    tp.partition for tp in ps)))}

    first = Consumer(bootstrap, group_id="eager", assignor="range")
    second = Consumer(bootstrap, group_id="eager", assignor="range")
    try:
        first.subscribe(name, **tracked("first"))
        drain([first], lambda: len(first.assignment()) == 4)
        second.subscribe(name, **tracked("second"))
        drain([first, second], lambda: len(first.assignment()) == 2
              and len(second.assignment()) == 2)
        # Eager: the first member gave up all four before anyone got any back.
        assert events[:2] == [("first", "assign", frozenset(range(4))),
                              ("first", "revoke", frozenset(range(4)))]
        assert first.assignment().isdisjoint(second.assignment())
        with pytest.raises(ValueError, match="roundrobin"):
            Consumer(bootstrap, group_id="eager", assignor="roundrobin")
        with Consumer(bootstrap, group_id="eager") as odd:  # cooperative-sticky
            odd.subscribe(name)
            with pytest.raises(StrataError, match="UNSUPPORTED_ASSIGNOR"):
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    odd.poll(timeout_ms=100)
    finally:
        second.close()
        first.close()


def test_static_member_restart_keeps_its_partitions(bootstrap: str,
                                                    topic: Callable[[int], str]) -> None:
    name = topic(2)
    with Consumer(bootstrap, group_id="static", group_instance_id="box-1",
                  session_timeout_ms=30_000) as first:
        first.subscribe(name)
        drain([first], lambda: len(first.assignment()) == 2)
    # Closed with epoch -2: the member and its partitions wait for it.
    with Admin(bootstrap) as admin:
        described = admin.describe_group("static")
        assert [m.instance_id for m in described.members] == ["box-1"]
        epoch = described.group_epoch
    assigned: list[set[TopicPartition]] = []
    with Consumer(bootstrap, group_id="static", group_instance_id="box-1",
                  session_timeout_ms=30_000) as again:
        again.subscribe(name, on_assign=assigned.append)
        drain([again], lambda: len(again.assignment()) == 2)
        with Admin(bootstrap) as admin:
            described = admin.describe_group("static")
        assert described.group_epoch == epoch  # no rebalance
        assert [m.member_id for m in described.members] == [again.member_id]
    assert assigned == [{TopicPartition(name, 0), TopicPartition(name, 1)}]


def test_unsubscribe_leaves_and_subscribe_joins_again() -> None:
    async def run() -> None:
        consumer, link, log = scripted(enable_auto_commit=False)
        link.assignment = {T0}
        revoked: list[set[TopicPartition]] = []
        consumer.subscribe(["t"], on_revoke=revoked.append)
        await poll_until(consumer, lambda: consumer.assignment() == {T0})
        await consumer.unsubscribe()
        assert revoked == [{T0}] and consumer.assignment() == set()
        assert log[-1] == ("leave", LEAVE_EPOCH) and consumer.member_id is None
        assert consumer.subscription() == set()
        consumer.assign([T1])  # free to assign by hand now
        consumer.assign([])
        consumer.subscribe(["t"])
        await poll_until(consumer, lambda: consumer.assignment() == {T0})
        assert consumer.member_id == "m2"  # a new member
        await consumer.close()

    asyncio.run(run())


def test_async_consumer_in_a_group(bootstrap: str, topic: Callable[[int], str]) -> None:
    name = topic(2)
    produce(bootstrap, name, 20, 2)

    async def run() -> None:
        assigned: list[set[TopicPartition]] = []

        async def on_assign(partitions: set[TopicPartition]) -> None:  # may be async
            await asyncio.sleep(0)
            assigned.append(partitions)

        async with AsyncConsumer(bootstrap, group_id="async-group",
                                 auto_offset_reset="earliest") as consumer:
            consumer.subscribe([name], on_assign=on_assign)
            rows = 0
            deadline = time.monotonic() + 20
            while rows < 20:
                assert time.monotonic() < deadline
                rows += (await consumer.poll_arrow(timeout_ms=200)).num_rows
            assert assigned == [{TopicPartition(name, 0), TopicPartition(name, 1)}]
            task = await consumer.commit(asynchronous=True)
            assert await task == {TopicPartition(name, 0): 10, TopicPartition(name, 1): 10}
            assert await consumer.committed([TopicPartition(name, 0)]) == \
                {TopicPartition(name, 0): 10}

    asyncio.run(run())


def test_fence_found_by_the_commit_before_a_revoke_calls_on_lost() -> None:
    async def run() -> None:
        consumer, link, log = scripted()
        link.assignment = {T0, T1}
        consumer.subscribe(["t"], on_revoke=lambda ps: log.append(("revoke", ps)),
                           on_lost=lambda ps: log.append(("lost", ps)))
        await poll_until(consumer, lambda: consumer.assignment() == {T0, T1})
        consumer.seek(T1, 4)
        link.commit_errors = {T1: FencedMemberEpochError("fenced")}
        link.assignment = {T0}
        await poll_until(consumer, lambda: any(e[0] == "lost" for e in log))
        # The auto-commit before revoking T1 found the member fenced: everything is lost,
        # on_revoke (which may commit) is not called.
        assert [e[0] for e in log] == ["commit", "lost"] and log[1][1] == {T0, T1}
        await consumer.close()

    asyncio.run(run())


def test_heartbeats_go_on_while_close_revokes_and_commits() -> None:
    """close(): the member keeps heartbeating (reporting what it still holds) through a
    slow on_revoke, until the leave request; otherwise its session could expire while
    it still processes, and another member would read the same records."""
    async def run() -> None:
        consumer, link, log = scripted(enable_auto_commit=False)
        link.assignment = {T0}
        during: list[ConsumerGroupHeartbeatRequest] = []

        async def on_revoke(partitions: set[TopicPartition]) -> None:
            link.assignment = {T0, T1}  # an answer now must not be taken any more
            first = len(link.heartbeats)
            await asyncio.sleep(0.3)
            during.extend(link.heartbeats[first:])

        consumer.subscribe(["t"], on_revoke=on_revoke)
        await poll_until(consumer, lambda: consumer._group is not None
                         and T0 in consumer._group.membership.owned)
        await consumer.close()
        assert during, "no heartbeat while on_revoke ran"
        assert all(hb.member_epoch >= 0 and hb.owned == [GroupTopicPartitions("t", [0])]
                   for hb in during)
        assert log[-1] == ("leave", LEAVE_EPOCH)
        assert consumer.assignment() == set()

    asyncio.run(run())


def test_a_deleted_topics_commit_fails_at_once_instead_of_retrying() -> None:
    async def run() -> None:
        link = CoordinatorLink(None, "g", request_timeout_ms=30_000,  # type: ignore[arg-type]
                               retry_backoff_ms=10)
        requests: list[Message] = []
        backoffs: list[int] = []

        async def request(api: ApiKey, body: Message, **_: Any) -> Message:
            requests.append(body)
            return OffsetCommitResponse([OffsetCommitTopicResponse("t", [
                OffsetCommitPartitionResponse(0, UnknownTopicOrPartitionError.code, "gone"),
                OffsetCommitPartitionResponse(1, 0)])])

        async def backoff(attempt: int, deadline: float) -> None:
            backoffs.append(attempt)
            await asyncio.sleep(0.01)

        link.request = request  # type: ignore[method-assign]
        link._backoff = backoff  # type: ignore[method-assign]
        started = time.monotonic()
        committed, failed = await link.commit("m1", 1, {T0: 3, T1: 4}, timeout_s=30)
        assert committed == {T1: 4} and isinstance(failed[T0], UnknownTopicOrPartitionError)
        # "At once": one request, no back-off before giving up, and (the 30 s timeout
        # being far beyond any slow machine) not waiting for the timeout either.
        assert len(requests) == 1 and backoffs == []
        assert time.monotonic() - started < 10

    asyncio.run(run())


def test_after_unsubscribe_a_lost_or_refused_member_leaves_nothing_pending() -> None:
    """A member lost (or refused) before unsubscribe() must not leave work behind: the
    blocking poll() loops while ``_group_work_pending()``."""
    async def run() -> None:
        consumer, link, _ = scripted(enable_auto_commit=False)
        link.assignment = {T0}
        consumer.subscribe(["t"])
        await poll_until(consumer, lambda: consumer.assignment() == {T0})
        assert consumer._group is not None
        m = consumer._group.membership
        link.fence_next = FencedMemberEpochError
        consumer._group.heartbeat_now()
        deadline = time.monotonic() + 30
        while not m.lost:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await consumer.unsubscribe()
        assert not m.lost and not consumer._group_work_pending()
        consumer.assign([T1])
        assert not consumer._group_work_pending()
        consumer.assign([])

        m.fatal = StrataError("refused")  # e.g. an assignor the coordinator lacks
        await consumer.unsubscribe()  # (not subscribed: nothing to do)
        consumer.subscribe(["t"])  # a new subscription tries again
        assert m.fatal is None
        await poll_until(consumer, lambda: consumer.assignment() == {T0})
        await consumer.close()

    asyncio.run(run())


class GatedLink(FakeLink):
    """Commits wait ``delay`` seconds (None: forever)."""

    delay: float | None = 0.0

    async def commit(self, member_id: str | None, member_epoch: int,
                     offsets: Mapping[TopicPartition, int], *, timeout_s: float | None = None,
                     metadata: str | None = None
                     ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, StrataError]]:
        if self.delay is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay or 0)
        return await super().commit(member_id, member_epoch, offsets, timeout_s=timeout_s,
                                    metadata=metadata)


@pytest.mark.parametrize("delay", [0.2, None])
def test_close_waits_for_async_commits_then_cancels_what_is_left(delay: float | None
                                                                 ) -> None:
    async def run() -> None:
        log: list[tuple[Any, ...]] = []
        consumer = AsyncConsumer(NOWHERE, group_id="g", retry_backoff_ms=10,
                                 enable_auto_commit=False, request_timeout_ms=500)
        link = GatedLink(log)
        assert consumer._group is not None
        consumer._group.link = link  # type: ignore[assignment]
        link.assignment = {T0}
        consumer.subscribe(["t"])
        await poll_until(consumer, lambda: T0 in consumer._group.membership.owned)  # type: ignore[union-attr]
        link.delay = delay
        task = await consumer.commit({T0: 3}, asynchronous=True)
        # close waits at most request_timeout_ms (0.5 s) for the commit. One that waited
        # on the never-answered commit (delay=None) would be stopped by this deadline
        # (close swallows the cancellation, so expired() is what tells); 30 s only
        # bounds a hang, it is not a speed target.
        async with asyncio.timeout(30) as deadline:
            await consumer.close()
        assert not deadline.expired(), "close waited for the commit beyond its timeout"
        assert task.done()
        if delay is not None:
            assert task.result() == {T0: 3}  # close waited for it
        else:
            assert task.cancelled()  # never answered: cancelled, nobody waits forever

    asyncio.run(run())


def test_a_join_is_not_sent_again_before_the_request_timeout() -> None:
    """A heartbeat is resent after a third of the session (a hung coordinator must not
    cost the member its session), but a join has no session yet: sent again while the
    first is still queued at a busy coordinator, it would add a second member that
    holds partitions until its session expires. It waits the whole request timeout."""
    async def go() -> tuple[float, float]:
        cluster = Cluster(NOWHERE, client_id="t", request_timeout_ms=30_000,
                          retry_backoff_ms=100)
        member = GroupMember(cluster, "g", instance_id=None, session_timeout_ms=9_000,
                             rebalance_timeout_ms=60_000, assignor="range",
                             request_timeout_ms=30_000, retry_backoff_ms=100,
                             wakeup=lambda: None)
        joining = member._heartbeat_attempt_s()
        member.membership.member_id, member.membership.member_epoch = "m1", 1
        return joining, member._heartbeat_attempt_s()

    assert asyncio.run(go()) == (30.0, 3.0)
