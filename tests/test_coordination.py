"""The ZooKeeper coordination module against a real ZooKeeper server."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from brokers.coordination import (
    BrokerIdInUseError,
    BrokerRegistration,
    ConcurrentUpdateError,
    ControllerMovedError,
    Coordinator,
    TopicDefinition,
)
from brokers.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError
from zookeeper.launcher import ZooKeeperServer


@pytest.fixture
def coordinators(zookeeper_server: ZooKeeperServer) -> Iterator[list[Coordinator]]:
    made: list[Coordinator] = []

    def make() -> Coordinator:
        c = Coordinator(zookeeper_server.connect_string, session_timeout_ms=4000)
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
        zookeeper_server: ZooKeeperServer, coordinators: list[Coordinator]) -> None:
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
    zombie = Coordinator(zookeeper_server.connect_string, session_timeout_ms=4000)
    zombie.start()
    try:
        fresh = zombie.partition_state(topic.name, 0)
        with pytest.raises(ControllerMovedError):
            zombie.update_partition_state_as_controller(lease, topic.name, 0, fresh)
        assert zombie.partition_state(topic.name, 0) == fresh
    finally:
        zombie.stop()


def test_broker_ids_topics_configs_and_producer_id_blocks(
        coordinators: list[Coordinator]) -> None:
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

    def claim(c: Coordinator) -> None:
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
