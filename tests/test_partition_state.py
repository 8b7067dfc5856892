"""A broker follows partition-state changes a controller writes to ZooKeeper (issue [4/7]
groundwork): a new leader epoch is recorded at the log end at once, new batches carry
it, and losing leadership stops writes immediately and across a restart.

The controller here is a test-side ``ZooKeeperClient`` holding the controller lease, so the
writes are fenced exactly as the future controller loop's will be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from brokers.coordination import ControllerLease, PartitionState, ZooKeeperClient
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for
from tests.test_broker_api import call, create, fetch, produce, run
from wire.errors import NotLeaderError, raise_for_code
from wire.protocol import (
    ApiKey,
    MetadataRequest,
    OffsetForLeaderEpochPartition,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochTopic,
)
from wire.record_batch import build_batch, iter_batches
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def controller(zookeeper_server: ZooKeeperServer) -> Iterator[ZooKeeperClient]:
    coordinator = ZooKeeperClient(zookeeper_server.connect_string, session_timeout_ms=10_000)
    coordinator.start()
    try:
        yield coordinator
    finally:
        coordinator.stop()


def _epoch_in_metadata(broker: BrokerProcess, topic: str) -> tuple[int, int]:
    response = run(call(broker, ApiKey.METADATA, MetadataRequest([topic])))
    meta = response.topics[0].partitions[0]
    return meta.leader, meta.leader_epoch


def _move(controller: ZooKeeperClient, lease: ControllerLease, topic: str, leader: int,
          epoch: int) -> None:
    state = controller.partition_state(topic, 0)
    controller.update_partition_state_as_controller(
        lease, topic, 0, PartitionState(leader, epoch, [leader], zk_version=state.zk_version))


def test_a_new_epoch_and_a_lost_leadership_take_effect_without_a_restart(
        broker_factory: Callable[..., BrokerProcess], controller: ZooKeeperClient) -> None:
    # Not eligible: the controller here is the test itself (the lease below).
    broker = broker_factory(broker_id=51, overrides={"controller.eligible": "false"})
    topic = "state-follow"
    create(broker, topic)
    assert produce(broker, topic, 0, build_batch([b"a", b"b", b"c"])).error_code == 0
    lease = controller.try_become_controller(99)
    assert lease is not None

    _move(controller, lease, topic, leader=51, epoch=3)
    wait_for("epoch 3 in metadata", lambda: _epoch_in_metadata(broker, topic),
             lambda found: found == (51, 3), timeout=20)

    def end_for(epoch: int) -> tuple[int, int]:
        response = run(call(broker, ApiKey.OFFSET_FOR_LEADER_EPOCH, OffsetForLeaderEpochRequest(
            [OffsetForLeaderEpochTopic(topic, [OffsetForLeaderEpochPartition(0, -1, epoch)])])))
        answer = response.topics[0].partitions[0]
        assert answer.error_code == 0, answer
        return answer.leader_epoch, answer.end_offset

    # Before any new record: epoch 3 is known and starts at the log end (3).
    wait_for("epoch 3 in the leader-epoch cache", lambda: end_for(3),
             lambda found: found == (3, 3), timeout=20)
    assert end_for(0) == (0, 3)
    assert produce(broker, topic, 0, build_batch([b"d"])).error_code == 0
    stored = fetch(broker, topic, 0, 3)
    assert [h.leader_epoch for h, _ in iter_batches(stored.records)] == [3]

    # The controller moves leadership to a broker that is not this one: writes stop.
    _move(controller, lease, topic, leader=7, epoch=4)
    wait_for("epoch 4 in metadata", lambda: _epoch_in_metadata(broker, topic),
             lambda found: found[1] == 4, timeout=20)
    answer = produce(broker, topic, 0, build_batch([b"e"]))
    with pytest.raises(NotLeaderError, match="leader is 7"):
        raise_for_code(answer.error_code, answer.error_message)

    broker.stop()
    broker.start()
    answer = produce(broker, topic, 0, build_batch([b"f"]))
    with pytest.raises(NotLeaderError):
        raise_for_code(answer.error_code, answer.error_message)
