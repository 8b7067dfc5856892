"""The ZooKeeper coordination module against a real ZooKeeper server."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from brokers.coordination import (
    BrokerIdInUseError,
    BrokerRegistration,
    ConcurrentUpdateError,
    ControllerMovedError,
    PartitionState,
    TopicDefinition,
    ZooKeeperClient,
)
from wire.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from zookeeper.launcher import ZooKeeperServer

pytestmark = pytest.mark.integration


@pytest.fixture
def coordinators(zookeeper_server: ZooKeeperServer) -> Iterator[list[ZooKeeperClient]]:
    made: list[ZooKeeperClient] = []

    def make() -> ZooKeeperClient:
        c = ZooKeeperClient(zookeeper_server.connect_string, session_timeout_ms=4000)
        c.start()
        made.append(c)
        return c

    made_factory = [make() for _ in range(2)]
    try:
        yield made_factory
    finally:
        for c in made:
            c.stop()


def test_controller_election_fencing_and_failover(
        zookeeper_server: ZooKeeperServer, coordinators: list[ZooKeeperClient]) -> None:
    first, second = coordinators
    lease = first.try_become_controller(1)
    assert lease is not None
    assert second.try_become_controller(2) is None  # /controller is taken
    assert second.controller() == (1, lease.epoch)
    topic = TopicDefinition(f"ctl-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, {0: [1, 2]})
    first.create_topic(topic, {})
    state = first.partition_state(topic.name, 0)
    updated = first.update_partition_state_as_controller(
        lease, topic.name, 0, type(state)(2, state.leader_epoch + 1, [2], 0, state.zk_version))
    assert (updated.leader, updated.leader_epoch, updated.controller_epoch) == \
        (2, state.leader_epoch + 1, lease.epoch)
    with pytest.raises(ConcurrentUpdateError):  # written from a stale read
        first.update_partition_state_as_controller(lease, topic.name, 0, state)

    changed = threading.Event()
    seen: list[tuple[int, int] | None] = []

    def on_change(value: tuple[int, int] | None) -> None:
        seen.append(value)
        if value is not None and value[0] == 2:
            changed.set()

    second.watch_controller(on_change)
    first.stop()  # the controller's session ends: its ephemeral znode goes
    new_lease = None
    for _ in range(50):
        new_lease = second.try_become_controller(2)
        if new_lease is not None:
            break
        changed.wait(0.1)
    assert new_lease is not None and new_lease.epoch == lease.epoch + 1
    assert changed.wait(10), seen
    # The deposed controller's lease no longer writes anything, even on a new session.
    zombie = ZooKeeperClient(zookeeper_server.connect_string, session_timeout_ms=4000)
    zombie.start()
    try:
        fresh = zombie.partition_state(topic.name, 0)
        with pytest.raises(ControllerMovedError):
            zombie.update_partition_state_as_controller(lease, topic.name, 0, fresh)
        assert zombie.partition_state(topic.name, 0) == fresh
    finally:
        zombie.stop()


def test_broker_ids_topics_configs_and_producer_id_blocks(
        coordinators: list[ZooKeeperClient]) -> None:
    a, b = coordinators
    broker_id = 900 + uuid.uuid4().int % 99
    a.register_broker(BrokerRegistration(broker_id, "127.0.0.1", 1, 0))
    with pytest.raises(BrokerIdInUseError, match=f"broker id {broker_id}"):
        b.register_broker(BrokerRegistration(broker_id, "127.0.0.1", 2, 0),
                          wait_for_stale_s=0.5)
    assert broker_id in [r.broker_id for r in b.live_brokers()]

    name = f"coord-{uuid.uuid4().hex[:8]}"
    a.create_topic(TopicDefinition(name, uuid.uuid4().hex, {0: [1], 1: [1]}),
                   {"retention.ms": "5"})
    with pytest.raises(TopicAlreadyExistsError):
        b.create_topic(TopicDefinition(name, uuid.uuid4().hex, {0: [1]}), {})
    configs, version = b.topic_configs(name)
    assert configs == {"retention.ms": "5"}
    a.set_topic_configs(name, {"retention.ms": "6"}, version)
    with pytest.raises(ConcurrentUpdateError):  # b's version is stale now
        b.set_topic_configs(name, {"retention.ms": "7"}, version)
    a.delete_topic(name)
    assert b.get_topic(name) is None
    with pytest.raises(UnknownTopicOrPartitionError, match="nothing to delete"):
        b.delete_topic(name)

    blocks: list[range] = []
    lock = threading.Lock()

    def claim(c: ZooKeeperClient) -> None:
        for _ in range(5):
            block = c.allocate_producer_id_block(1, block_size=10)
            with lock:
                blocks.append(block)

    threads = [threading.Thread(target=claim, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ids = [pid for block in blocks for pid in block]
    assert len(blocks) == 10 and len(ids) == len(set(ids)), "two claims overlapped"


def test_bulk_state_writes_are_chunked_fenced_and_report_each_conflict(
        coordinators: list[ZooKeeperClient]) -> None:
    """1,200 partitions (three multi-ops of at most 500 writes): conflicts in the middle
    of a chunk cost only their own write, and a deposed controller writes nothing."""
    controller, other = coordinators
    lease = controller.try_become_controller(1)
    if lease is None:  # another test's controller is still registered: take over
        holder = controller.controller()
        assert holder is not None
        controller.zk.delete("/strata/controller")
        lease = controller.try_become_controller(1)
    assert lease is not None
    name = f"bulk-{uuid.uuid4().hex[:8]}"
    keys = [(name, p) for p in range(1200)]
    controller.create_topic(TopicDefinition(name, uuid.uuid4().hex,
                                            {p: [1, 2, 3] for _, p in keys}), {})
    before = other.read_partition_states([*keys, ("no-such-topic", 0)])
    assert set(before) == set(keys)  # what does not exist is left out
    # Another writer (a leader shrinking its ISR) gets to three partitions first, one of
    # them in the middle of the second chunk.
    for p in (0, 700, 1199):
        other.update_partition_state(name, p, PartitionState(1, 0, [1, 2], 0,
                                                             before[(name, p)].zk_version))
    wanted = {key: PartitionState(2, state.leader_epoch + 1, [2, 3],
                                  zk_version=state.zk_version)
              for key, state in before.items()}
    outcome = controller.write_partition_states(wanted, lease=lease)
    assert sorted(outcome.conflicts) == [(name, 0), (name, 700), (name, 1199)]
    assert all(s.isr == [1, 2] for s in outcome.conflicts.values())  # what is there now
    assert len(outcome.written) == 1197 and not outcome.missing
    after = other.read_partition_states(keys)
    for key, written in outcome.written.items():
        assert after[key] == written
        assert (written.leader, written.controller_epoch) == (2, lease.epoch)
        assert after[key].zk_version == written.zk_version

    # Fencing: once another broker wins the controller epoch, a batch of the old lease
    # fails as a whole and changes nothing.
    controller.zk.delete("/strata/controller")
    new_lease = other.try_become_controller(2)
    assert new_lease is not None and new_lease.epoch == lease.epoch + 1
    stale = {key: PartitionState(3, s.leader_epoch + 1, [3], zk_version=s.zk_version)
             for key, s in after.items()}
    with pytest.raises(ControllerMovedError):
        controller.write_partition_states(stale, lease=lease)
    assert other.read_partition_states(keys) == after
    # Partitions deleted meanwhile come back as missing, not as errors.
    other.delete_topic(name)
    gone = other.write_partition_states(stale, lease=new_lease)
    assert sorted(gone.missing) == sorted(keys) and not gone.written
    other.zk.delete("/strata/controller")


def test_the_state_watcher_delivers_changes_in_batches(
        coordinators: list[ZooKeeperClient]) -> None:
    writer, follower = coordinators
    name = f"watch-{uuid.uuid4().hex[:8]}"
    keys = [(name, p) for p in range(300)]
    writer.create_topic(TopicDefinition(name, uuid.uuid4().hex, {p: [1, 2] for _, p in keys}),
                        {})
    signalled = threading.Event()
    watcher = follower.state_watcher(signalled.set)
    initial = watcher.follow([*keys, ("no-such-topic", 0)])
    assert set(initial) == set(keys)
    assert watcher.take() == []  # the initial states are returned, not delivered
    ignored = (name, 299)
    watcher.forget([ignored])
    changed = {key: PartitionState(2, 1, [2], 0, state.zk_version)
               for key, state in initial.items()}
    assert not writer.write_partition_states(changed).conflicts
    seen: dict[tuple[str, int], PartitionState | None] = {}
    deadline = time.monotonic() + 30
    while len(seen) < 299 and time.monotonic() < deadline:
        signalled.wait(1)
        signalled.clear()
        for key, state in watcher.take():
            seen[key] = state
    assert set(seen) == set(keys) - {ignored}, "every followed change arrives, once each"
    assert all(s is not None and (s.leader, s.zk_version) == (2, initial[k].zk_version + 1)
               for k, s in seen.items())
    # A second change of the same partition is delivered too: the watch was re-armed.
    again = writer.read_partition_states([(name, 0)])[(name, 0)]
    writer.update_partition_state(name, 0, PartitionState(1, 2, [1, 2], 0, again.zk_version))
    got: list[tuple[tuple[str, int], PartitionState | None]] = []
    while not got and time.monotonic() < deadline:
        signalled.wait(1)
        signalled.clear()
        got = watcher.take()
    assert [(k, s.leader if s else None) for k, s in got] == [((name, 0), 1)]
    # A full re-read (the safety net, also run after a lost session) delivers only
    # states whose znode version moved, so it costs little at ten thousand partitions.
    latest = writer.read_partition_states([(name, 1)])[(name, 1)]
    writer.update_partition_state(name, 1, PartitionState(1, 2, [1, 2], 0, latest.zk_version))
    watcher.session_state("LOST")
    reread: list[tuple[tuple[str, int], PartitionState | None]] = []
    settle = time.monotonic() + 3
    while time.monotonic() < settle:
        signalled.wait(0.5)
        signalled.clear()
        reread += watcher.take()
    assert [k for k, _ in reread] == [(name, 1)], reread
    # Notifications do not pile up: the controller removes old ones.
    assert writer.prune_state_changes(older_than_s=0) >= 2
    assert follower.prune_state_changes(older_than_s=0) == 0
    watcher.close()


def _wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_controlled_shutdown_requests_end_with_the_session(
        zookeeper_server: ZooKeeperServer, coordinators: list[ZooKeeperClient]) -> None:
    observer = coordinators[0]
    seen: list[set[int]] = []
    observer.watch_shutting_down(seen.append)
    leaving = ZooKeeperClient(zookeeper_server.connect_string, session_timeout_ms=4000)
    leaving.start()
    try:
        leaving.request_controlled_shutdown(7)
        leaving.request_controlled_shutdown(7)  # asking twice is harmless
        assert observer.shutting_down_brokers() == {7}
        # The watch is told while the request stands (it re-reads the children when it
        # fires: waiting here, not after the session ends, is what lets it see {7}).
        _wait_until(lambda: {7} in seen, 10)
    finally:
        leaving.stop()
    assert observer.shutting_down_brokers() == set()
    _wait_until(lambda: seen[-1] == set(), 10)  # and told again when the session ends
    assert {7} in seen and seen[-1] == set(), seen
