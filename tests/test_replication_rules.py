"""The rules of replication as pure functions and in-process objects (no processes):
leader election, replica placement, the leader's HW and ISR bookkeeping, follower
truncation. The behaviour across real brokers is in tests/test_replication.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokers.controller import assign_replicas, elect, plan_elections
from brokers.coordination import PartitionState, TopicDefinition
from brokers.log import LogConfig
from brokers.partition import FetchSessionClock, Partition
from brokers.replication import truncate_by_epoch
from brokers.staging import StagedPart
from wire.errors import NotLeaderError
from wire.record_batch import SINK_PRODUCER_ID_BASE, build_batch, iter_batches

pytestmark = pytest.mark.unit


def state(leader: int, epoch: int, isr: list[int]) -> PartitionState:
    return PartitionState(leader, epoch, isr, zk_version=7)


class TestElect:
    def test_a_live_leader_with_a_live_isr_is_left_alone(self) -> None:
        assert elect(state(0, 3, [0, 1, 2]), [0, 1, 2], {0, 1, 2}) is None

    def test_a_dead_leader_is_replaced_by_the_first_live_isr_member_in_assignment_order(
            self) -> None:
        new = elect(state(0, 3, [0, 2, 1]), [0, 1, 2], {1, 2})
        assert new == PartitionState(1, 4, [2, 1])
        assert new is not None and new.zk_version == 7  # a conditional write

    def test_a_live_replica_outside_the_isr_never_leads_a_clean_partition(self) -> None:
        new = elect(state(0, 3, [0]), [0, 1, 2], {1, 2})
        assert new == PartitionState(-1, 4, [0])  # waits for 0, the last in sync

    def test_unclean_election_takes_the_first_live_replica(self) -> None:
        assert elect(state(0, 3, [0]), [0, 1, 2], {2}, unclean=True) == \
            PartitionState(2, 4, [2])

    def test_a_leaderless_partition_is_led_again_when_an_isr_member_returns(self) -> None:
        assert elect(state(-1, 4, [0]), [0, 1, 2], {1, 2}) is None
        assert elect(state(-1, 4, [0]), [0, 1, 2], {0, 1, 2}) == PartitionState(0, 5, [0])

    def test_dead_followers_leave_the_isr_without_an_epoch_bump(self) -> None:
        assert elect(state(1, 3, [1, 0, 2]), [0, 1, 2], {1, 2}) == \
            PartitionState(1, 3, [1, 2])

    def test_preferred_election_moves_to_the_first_replica_only_when_in_sync(self) -> None:
        assert elect(state(1, 3, [1, 0]), [0, 1], {0, 1}, preferred=True) == \
            PartitionState(0, 4, [1, 0])
        assert elect(state(1, 3, [1]), [0, 1], {0, 1}, preferred=True) is None
        assert elect(state(0, 3, [0, 1]), [0, 1], {0, 1}, preferred=True) is None


class TestControlledShutdownElection:
    """A broker in a controlled shutdown (``leaving``) hands its leaderships over and
    leaves the ISRs, but never below one member and never to an out-of-sync replica."""

    def test_a_leaving_leader_hands_over_to_the_first_staying_isr_member(self) -> None:
        assert elect(state(0, 3, [0, 2, 1]), [0, 1, 2], {0, 1, 2}, leaving={0}) == \
            PartitionState(1, 4, [2, 1])

    def test_a_leaving_leader_never_hands_over_to_a_replica_out_of_sync(self) -> None:
        # 1 and 2 are alive but not in the ISR: 0 keeps leading until it stops.
        assert elect(state(0, 3, [0]), [0, 1, 2], {0, 1, 2}, leaving={0}) is None

    def test_a_leaving_follower_leaves_the_isr_without_an_epoch_bump(self) -> None:
        assert elect(state(1, 3, [1, 0, 2]), [0, 1, 2], {0, 1, 2}, leaving={0}) == \
            PartitionState(1, 3, [1, 2])

    def test_a_leaving_broker_is_never_elected(self) -> None:
        # The leader died; the only other ISR member is leaving: nobody safe remains.
        assert elect(state(0, 3, [0, 1]), [0, 1, 2], {1, 2}, leaving={1}) == \
            PartitionState(-1, 4, [0, 1])
        assert elect(state(1, 3, [1, 0]), [0, 1], {0, 1}, leaving={0}, preferred=True) == \
            PartitionState(1, 3, [1])
        assert elect(state(0, 3, [0]), [0, 1, 2], {1, 2}, leaving={1}, unclean=True) == \
            PartitionState(2, 4, [2])

    def test_two_leaving_brokers_hand_over_to_the_one_that_stays(self) -> None:
        assert elect(state(0, 3, [0, 1, 2]), [0, 1, 2], {0, 1, 2}, leaving={0, 1}) == \
            PartitionState(2, 4, [2])
        # Everyone is leaving (the whole cluster stops): nothing can move.
        assert elect(state(0, 3, [0, 1]), [0, 1], {0, 1}, leaving={0, 1}) is None

    def test_plan_elections_covers_every_partition_and_only_changes(self) -> None:
        topics = {"a": TopicDefinition("a", "id-a", {0: [0, 1], 1: [0, 1], 2: [0, 1]}),
                  "b": TopicDefinition("b", "id-b", {0: [1, 0]})}
        states = {("a", 0): state(0, 1, [0, 1]), ("a", 1): state(1, 1, [1, 0]),
                  ("b", 0): state(1, 1, [1])}  # a-2 unknown yet: skipped
        plan = plan_elections(topics, states, {0, 1}, leaving={0})
        assert plan == {("a", 0): PartitionState(1, 2, [1]),
                        ("a", 1): PartitionState(1, 1, [1])}
        assert plan_elections(topics, states, {0, 1}) == {}
        assert plan_elections(topics, states, {0, 1}, preferred={("b", 0)}) == {}
        assert plan_elections(topics, states, {0, 1}, preferred=set()) == \
            {("a", 1): PartitionState(0, 2, [1, 0])}


@pytest.mark.parametrize("brokers,partitions,factor", [(3, 8, 3), (5, 40, 3), (4, 4, 2),
                                                       (1, 3, 1), (3, 3, 1)])
def test_replica_placement_spreads_leaders_and_never_doubles_a_broker(
        brokers: int, partitions: int, factor: int) -> None:
    live = list(range(10, 10 + brokers))
    assignment = assign_replicas(live, partitions, factor)
    assert sorted(assignment) == list(range(partitions))
    for replicas in assignment.values():
        assert len(replicas) == factor and len(set(replicas)) == factor
        assert set(replicas) <= set(live)
    leaders = [r[0] for r in assignment.values()]
    counts = [leaders.count(b) for b in live]
    assert max(counts) - min(counts) <= 1


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # Partition creates asyncio events; give it a loop of its own.
    new = asyncio.new_event_loop()
    asyncio.set_event_loop(new)
    try:
        yield new
    finally:
        asyncio.set_event_loop(None)
        new.close()


def leader_partition(directory: Path) -> Partition:
    partition = Partition("t", 0, "id", directory, LogConfig(), broker_id=0)
    partition.set_state(0, 1, [0, 1, 2], [0, 1, 2], version=1)
    return partition


def test_the_high_watermark_is_the_smallest_isr_position(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    partition = leader_partition(tmp_path / "p")
    partition.append_as_leader(build_batch([b"a", b"b", b"c", b"d"]))
    assert partition.high_watermark == 0  # followers not heard from yet
    partition.record_follower_fetch(1, 4)
    assert partition.high_watermark == 0
    partition.record_follower_fetch(2, 2)
    assert partition.high_watermark == 2
    partition.record_follower_fetch(2, 4)
    assert partition.high_watermark == 4
    # Replicas outside the assignment are not counted; the HW never goes back.
    partition.record_follower_fetch(9, 0)
    partition.set_state(0, 1, [0, 1], [0, 1, 2], version=2)
    assert partition.high_watermark == 4
    partition.close()


def test_a_lagging_follower_is_proposed_out_and_back_in(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    partition = leader_partition(tmp_path / "p")
    partition.append_as_leader(build_batch([b"a"]))
    partition.record_follower_fetch(1, 1)
    partition.record_follower_fetch(2, 0)
    assert partition.isr_change(lag_time_max_ms=60_000) is None
    partition.followers[2].last_caught_up_ms -= 120_000  # follower 2 stopped long ago
    assert partition.isr_change(lag_time_max_ms=60_000) == [0, 1]
    partition.set_state(0, 1, [0, 1], [0, 1, 2], version=2)  # the write succeeded
    assert partition.high_watermark == 1
    partition.record_follower_fetch(2, 1)  # caught up: back in
    # ... unless it is in a controlled shutdown: the controller took it out on purpose.
    assert partition.isr_change(lag_time_max_ms=60_000, leaving={2}) is None
    assert partition.isr_change(lag_time_max_ms=60_000) == [0, 1, 2]
    partition.close()


def test_a_fetch_session_keeps_a_caught_up_follower_in_sync_without_listing_it(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    """A session lists a partition only when its fetch offset moves; each request of
    the session (``FetchSessionClock.tick``) vouches for the unlisted ones, but only
    where the follower was at the leader's log end, and only while the session lives."""
    partition = leader_partition(tmp_path / "p")
    partition.append_as_leader(build_batch([b"a"]))
    session = FetchSessionClock()
    session.tick()
    partition.record_follower_fetch(1, 1, session)  # caught up, in a session
    partition.record_follower_fetch(2, 1)           # caught up, no session
    for follower in (1, 2):
        partition.followers[follower].last_caught_up_ms -= 120_000  # listed long ago
    session.tick()  # a later request of follower 1's session, not listing the partition
    assert partition.isr_change(lag_time_max_ms=60_000) == [0, 1]
    partition.set_state(0, 1, [0, 1], [0, 1, 2], version=2)
    # New records the follower has not fetched: its session no longer vouches for it.
    partition.append_as_leader(build_batch([b"b"]))
    session.tick()
    partition.followers[1].last_caught_up_ms -= 120_000
    assert partition.isr_change(lag_time_max_ms=60_000) == [0]
    partition.record_follower_fetch(1, 2, session)  # it fetched them: in sync again
    session.tick()
    partition.followers[1].last_caught_up_ms -= 120_000
    assert partition.isr_change(lag_time_max_ms=60_000) is None
    # A closed session's clock stops: the follower ages out as without a session.
    session.stop()
    session.last_fetch_ms -= 120_000
    session.tick()  # ignored once stopped
    assert partition.isr_change(lag_time_max_ms=60_000) == [0]
    # A session that forgets the partition stops vouching for it at once.
    live = FetchSessionClock()
    live.tick()
    partition.record_follower_fetch(1, 2, live)
    partition.followers[1].last_caught_up_ms -= 120_000
    assert partition.isr_change(lag_time_max_ms=60_000) is None
    partition.forget_follower_session(1)
    assert partition.isr_change(lag_time_max_ms=60_000) == [0]
    partition.close()


def test_a_write_to_an_idle_partition_does_not_drop_its_session_followers(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    """An idle partition's last listed fetch may be hours old; its follower was still
    caught up at its session's latest request, so a new record must not make it look
    out of sync before it had a chance to fetch."""
    partition = leader_partition(tmp_path / "p")
    partition.append_as_leader(build_batch([b"a"]))
    session = FetchSessionClock()
    session.tick()
    partition.record_follower_fetch(1, 1, session)
    partition.record_follower_fetch(2, 1, session)
    for follower in (1, 2):
        partition.followers[follower].last_caught_up_ms -= 3_600_000  # an hour idle
    session.tick()
    partition.append_as_leader(build_batch([b"b"]))  # not fetched yet by anyone
    assert partition.isr_change(lag_time_max_ms=10_000) is None
    partition.close()


def test_a_fenced_or_superseded_leader_refuses_writes(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    partition = leader_partition(tmp_path / "p")
    partition.fenced = True
    with pytest.raises(NotLeaderError, match="cut off from ZooKeeper"):
        partition.append_as_leader(build_batch([b"x"]))
    partition.set_state(1, 2, [1, 2], [0, 1, 2], version=3)
    with pytest.raises(NotLeaderError, match="leader is 1"):
        partition.append_as_leader(build_batch([b"x"]))
    assert partition.log.log_end_offset == 0
    partition.close()


def test_a_follower_appends_the_leaders_batches_unchanged_and_truncates_by_epoch(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    leader = leader_partition(tmp_path / "leader")
    leader.append_as_leader(build_batch([b"a", b"b"]))
    leader.append_as_leader(build_batch([b"c"]))
    follower = Partition("t", 0, "id", tmp_path / "follower", LogConfig(), broker_id=1)
    follower.set_state(0, 1, [0, 1, 2], [0, 1, 2], version=1)
    found = leader.read(0, 1 << 20, for_follower=True)
    assert found is not None
    data = found.read_bytes()
    assert follower.append_as_follower(data, leader_high_watermark=2) == 2
    assert follower.log.log_end_offset == 3 and follower.high_watermark == 2
    assert follower.append_as_follower(data, leader_high_watermark=3) == 0  # already there
    assert follower.high_watermark == 3
    assert follower.truncate_divergent_tail(2) == 2
    assert follower.log.log_end_offset == 2
    assert follower.high_watermark == 2
    leader.close()
    follower.close()


def partition_with_epochs(directory: Path, broker_id: int,
                          epochs: list[tuple[int, int]]) -> Partition:
    """A follower-side partition whose log has ``count`` one-record batches per epoch."""
    partition = Partition("t", 0, "id", directory, LogConfig(), broker_id=broker_id)
    for epoch, count in epochs:
        for _ in range(count):
            partition.log.append(build_batch([f"e{epoch}".encode()]), leader_epoch=epoch)
    partition.set_state(99, 9, [99], [99, broker_id], version=1)  # a follower
    return partition


def test_truncation_asks_again_until_the_logs_agree(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    """Leader epochs {1@0, 2@5, 4@15}; follower {1@0, 3@10} up to 20: the first answer
    (epoch 2 ends at 15) cuts only to 10, the second (epoch 1 ends at 5) to 5."""
    leader = partition_with_epochs(tmp_path / "leader", 0, [(1, 5), (2, 10), (4, 5)])
    follower = partition_with_epochs(tmp_path / "follower", 1, [(1, 10), (3, 10)])

    def ask() -> bool:
        epoch, end = leader.log.end_offset_for_epoch(follower.log.latest_epoch)
        return truncate_by_epoch(follower, epoch, end)

    assert ask() is False and follower.log.log_end_offset == 10
    assert ask() is True and follower.log.log_end_offset == 5
    assert ask() is True and follower.log.log_end_offset == 5  # stable
    leader.close()
    follower.close()


def test_a_growing_isr_holds_the_hw_for_the_joining_replica(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    partition = leader_partition(tmp_path / "p")
    partition.set_state(0, 1, [0, 1], [0, 1, 2], version=2)
    partition.append_as_leader(build_batch([b"a", b"b", b"c", b"d"]))
    partition.record_follower_fetch(2, 2)
    partition.pending_isr = [0, 1, 2]  # the write that adds 2 may land any moment
    partition.record_follower_fetch(1, 4)
    assert partition.high_watermark == 2
    partition.set_state(0, 1, [0, 1], [0, 1, 2], version=3)  # ZooKeeper said no
    assert partition.pending_isr is None
    partition.record_follower_fetch(1, 4)
    assert partition.high_watermark == 4
    partition.close()


def test_a_follower_fetching_past_the_leaders_end_is_not_counted(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    partition = leader_partition(tmp_path / "p")
    partition.append_as_leader(build_batch([b"a"]))
    partition.record_follower_fetch(1, 1)
    partition.record_follower_fetch(2, 7)  # a divergent longer log: truncates first
    assert partition.high_watermark == 0
    assert partition.followers[2].log_end_offset == -1
    partition.close()


def test_the_hw_never_stops_inside_a_sink_commit_group(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    partition = leader_partition(tmp_path / "p")
    partition.set_state(0, 1, [0, 1], [0, 1], version=2)
    for chunk, values in enumerate([[b"a"], [b"b", b"c"], [b"d"]]):
        partition.stage("w", chunk, build_batch(values))
    result = partition.commit_staged(SINK_PRODUCER_ID_BASE + 5, 0, [StagedPart("w", 3, 4)])
    assert (result.first_offset, result.last_offset) == (0, 3)
    partition.record_follower_fetch(1, 3)  # the follower's fetch stopped mid-group
    assert partition.high_watermark == 0
    partition.record_follower_fetch(1, 4)
    assert partition.high_watermark == 4
    partition.close()


def test_a_new_leader_drops_the_head_of_a_commit_group_it_never_finished(
        tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    leader = leader_partition(tmp_path / "leader")
    leader.set_state(0, 1, [0, 1], [0, 1], version=2)
    for chunk, values in enumerate([[b"a"], [b"b"], [b"c"]]):
        leader.stage("w", chunk, build_batch(values))
    leader.commit_staged(SINK_PRODUCER_ID_BASE + 5, 0, [StagedPart("w", 3, 3)])
    found = leader.read(0, 1 << 20, for_follower=True)
    assert found is not None
    whole = found.read_bytes()
    first_two = bytearray()
    for header, batch in iter_batches(whole):
        if header.base_offset < 2:
            first_two += batch
    follower = Partition("t", 0, "id", tmp_path / "follower", LogConfig(), broker_id=1)
    follower.set_state(0, 1, [0, 1], [0, 1], version=2)
    follower.append_as_follower(bytes(first_two), leader_high_watermark=0)
    assert follower.log.log_end_offset == 2
    follower.set_state(1, 2, [1], [0, 1], version=3)  # the leader died; 1 takes over
    assert follower.log.log_end_offset == 0
    assert follower.producers.open_commit() is None
    leader.close()
    follower.close()
