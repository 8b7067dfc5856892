"""The group coordinator's wire behaviour on one real broker: every error a client can
hit, the group lifecycle, and the state a restarted broker reloads from
``__consumer_offsets`` (issue [7/7], items 1-2).

Raw protocol requests over TCP (not the consumer), so each answer is checked exactly.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from strata.client import Admin, NewTopic, Producer
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for
from wire.connection import BrokerConnection
from wire.errors import (
    CoordinatorNotAvailableError,
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotEnoughReplicasError,
    OffsetMetadataTooLargeError,
    PolicyViolationError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)
from wire.protocol import (
    LEAVE_EPOCH,
    NO_MEMBER_EPOCH,
    STATIC_LEAVE_EPOCH,
    ApiKey,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    GroupTopicPartitions,
    ListGroupsRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def group_broker(zookeeper_server: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[BrokerProcess]:
    process = BrokerProcess(zookeeper_server.connect_string, tmp_path_factory.mktemp("gb"),
                            overrides={"offsets.topic.num.partitions": "2",
                                       "group.min.session.timeout.ms": "500",
                                       "group.max.session.timeout.ms": "60000",
                                       "offset.metadata.max.bytes": "16",
                                       "log.cleaner.interval.ms": "200"})
    process.start()
    try:
        with Admin(process.bootstrap) as admin:
            admin.create_topics([NewTopic("orders", 4, 1), NewTopic("audit", 2, 1)])
        yield process
    finally:
        process.kill()


def call(broker: BrokerProcess, api: ApiKey, body: Any) -> Any:
    async def go() -> Any:
        connection = BrokerConnection("127.0.0.1", broker.port)
        try:
            await connection.connect(timeout=5)
            return await connection.request(api, body)
        finally:
            await connection.close()
    return asyncio.run(go())


def find(broker: BrokerProcess, group: str) -> FindCoordinatorResponse:
    return wait_for(f"the coordinator of {group}",
                    lambda: call(broker, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(group)),
                    lambda a: a.error_code == 0, 30)


def heartbeat(broker: BrokerProcess, group: str, member_id: str | None = None,
              epoch: int = 0, **kw: Any) -> ConsumerGroupHeartbeatResponse:
    kw.setdefault("subscribed_topics", ["orders"])
    answer = call(broker, ApiKey.CONSUMER_GROUP_HEARTBEAT,
                  ConsumerGroupHeartbeatRequest(group, member_id, epoch, **kw))
    assert isinstance(answer, ConsumerGroupHeartbeatResponse)
    return answer


def join_and_settle(broker: BrokerProcess, group: str, **kw: Any
                    ) -> ConsumerGroupHeartbeatResponse:
    find(broker, group)
    answer = heartbeat(broker, group, **kw)
    assert answer.error_code == 0, answer
    again = heartbeat(broker, group, answer.member_id, answer.member_epoch,
                      owned=answer.assignment, **kw)
    assert again.error_code == 0 and again.assignment == answer.assignment
    return again


def commit(broker: BrokerProcess, group: str, member_id: str | None, epoch: int,
           offsets: dict[tuple[str, int], int], metadata: str | None = None) -> dict[Any, int]:
    topics: dict[str, list[OffsetCommitPartition]] = {}
    for (t, p), o in offsets.items():
        topics.setdefault(t, []).append(OffsetCommitPartition(p, o, metadata))
    answer = call(broker, ApiKey.OFFSET_COMMIT, OffsetCommitRequest(
        group, member_id, epoch, [OffsetCommitTopic(t, ps) for t, ps in topics.items()]))
    assert isinstance(answer, OffsetCommitResponse)
    return {(t.name, p.partition): p.error_code for t in answer.topics for p in t.partitions}


def fetch(broker: BrokerProcess, group: str) -> dict[tuple[str, int], int]:
    answer = call(broker, ApiKey.OFFSET_FETCH, OffsetFetchRequest(group))
    assert isinstance(answer, OffsetFetchResponse) and answer.error_code == 0
    return {(t.name, p.partition): p.offset for t in answer.topics for p in t.partitions}


def test_offsets_topic_waits_for_its_replication_factor(
        zookeeper_server: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Runs first in this module (nothing has created __consumer_offsets yet): with
    offsets.topic.replication.factor=3 and one live broker no group gets a coordinator."""
    lonely = BrokerProcess(zookeeper_server.connect_string, tmp_path_factory.mktemp("rf3"),
                           broker_id=7, overrides={"offsets.topic.replication.factor": "3"})
    lonely.start()
    try:
        answer = call(lonely, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest("early"))
        assert answer.error_code == CoordinatorNotAvailableError.code
        assert "offsets.topic.replication.factor=3" in answer.error_message
        assert "start more brokers" in answer.error_message
    finally:
        lonely.stop()  # a clean stop deregisters it: the next topics must not land on it
        lonely.kill()


def test_find_coordinator_refuses_an_empty_group_id(group_broker: BrokerProcess) -> None:
    answer = call(group_broker, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(""))
    assert answer.error_code == InvalidGroupIdError.code
    assert "1..249" in answer.error_message


@pytest.mark.parametrize(("kw", "error"), [
    ({"assignor": "roundrobin"}, UnsupportedAssignorError),
    ({"session_timeout_ms": 100}, InvalidSessionTimeoutError),
    ({"session_timeout_ms": 600_000}, InvalidSessionTimeoutError),
    ({"subscribed_topics": []}, InvalidRequestError),
    ({"rebalance_timeout_ms": 0}, InvalidRequestError),
])
def test_bad_joins_are_refused_with_a_reason(group_broker: BrokerProcess, kw: dict[str, Any],
                                             error: type[Exception]) -> None:
    find(group_broker, "bad-joins")
    answer = heartbeat(group_broker, "bad-joins", **kw)
    assert answer.error_code == error.code  # type: ignore[attr-defined]
    assert answer.error_message
    listed = call(group_broker, ApiKey.LIST_GROUPS, ListGroupsRequest())
    assert "bad-joins" not in [g.group_id for g in listed.groups]


def test_member_errors(group_broker: BrokerProcess) -> None:
    member = join_and_settle(group_broker, "members")
    assert heartbeat(group_broker, "members", "nobody", 1).error_code == \
        UnknownMemberIdError.code
    assert heartbeat(group_broker, "members", member.member_id,
                     member.member_epoch + 5).error_code == FencedMemberEpochError.code
    assert heartbeat(group_broker, "members", member.member_id, 0,
                     assignor="range").error_code == 0  # a re-sent join of a known id
    other = heartbeat(group_broker, "members", assignor="range")
    assert other.error_code == UnsupportedAssignorError.code
    assert "cooperative-sticky" in other.error_message


def test_commit_rules(group_broker: BrokerProcess) -> None:
    member = join_and_settle(group_broker, "committers")
    mid, epoch = member.member_id, member.member_epoch
    assert commit(group_broker, "committers", mid, epoch, {("orders", 0): 10}) == \
        {("orders", 0): 0}
    codes = commit(group_broker, "committers", mid, epoch,
                   {("orders", 1): -1, ("orders", 9): 1, ("nope", 0): 1, ("orders", 2): 3})
    assert codes == {("orders", 1): InvalidRequestError.code,
                     ("orders", 9): UnknownTopicOrPartitionError.code,
                     ("nope", 0): UnknownTopicOrPartitionError.code, ("orders", 2): 0}
    assert commit(group_broker, "committers", mid, epoch, {("orders", 3): 1},
                  metadata="x" * 17) == {("orders", 3): OffsetMetadataTooLargeError.code}
    # A partition of a topic the member does not own (audit is not subscribed).
    assert commit(group_broker, "committers", mid, epoch, {("audit", 0): 1}) == \
        {("audit", 0): StaleMemberEpochError.code}
    assert commit(group_broker, "committers", "ghost", 1, {("orders", 0): 11}) == \
        {("orders", 0): UnknownMemberIdError.code}
    assert commit(group_broker, "committers", None, -1, {("orders", 0): 11}) == \
        {("orders", 0): NonEmptyGroupError.code}
    assert fetch(group_broker, "committers") == {("orders", 0): 10, ("orders", 2): 3}


def test_group_lifecycle_describe_leave_delete(group_broker: BrokerProcess) -> None:
    member = join_and_settle(group_broker, "lifecycle", instance_id="static-1")
    commit(group_broker, "lifecycle", member.member_id, member.member_epoch,
           {("orders", p): 5 for p in range(4)})
    described = call(group_broker, ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(
        ["lifecycle", "never-seen"]))
    assert isinstance(described, DescribeGroupsResponse)
    live, missing = described.groups
    assert (live.error_code, live.state, live.assignor) == (0, "Stable", "cooperative-sticky")
    assert [(m.member_id, m.instance_id) for m in live.members] == \
        [(member.member_id, "static-1")]
    assert live.members[0].assignment == [GroupTopicPartitions("orders", [0, 1, 2, 3])]
    assert missing.error_code == GroupIdNotFoundError.code
    # A static member's temporary leave keeps its place; deleting is refused meanwhile.
    assert heartbeat(group_broker, "lifecycle", member.member_id,
                     STATIC_LEAVE_EPOCH).error_code == 0
    deleted = call(group_broker, ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["lifecycle"]))
    assert isinstance(deleted, DeleteGroupsResponse)
    assert deleted.results[0].error_code == NonEmptyGroupError.code
    assert heartbeat(group_broker, "lifecycle", member.member_id, LEAVE_EPOCH).error_code == 0
    assert heartbeat(group_broker, "lifecycle", member.member_id, LEAVE_EPOCH).error_code == 0
    listed = {g.group_id: g for g in call(group_broker, ApiKey.LIST_GROUPS,
                                          ListGroupsRequest()).groups}
    assert (listed["lifecycle"].state, listed["lifecycle"].members) == ("Empty", 0)
    # With no members, an admin commit (reset-offsets) is allowed.
    assert commit(group_broker, "lifecycle", None, -1, {("orders", 0): 0}) == {("orders", 0): 0}
    deleted = call(group_broker, ApiKey.DELETE_GROUPS,
                   DeleteGroupsRequest(["lifecycle", "lifecycle-x"]))
    assert [r.error_code for r in deleted.results] == [0, GroupIdNotFoundError.code]
    assert fetch(group_broker, "lifecycle") == {}


def _cleaner_removed(broker: BrokerProcess) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics",
                                  timeout=5).read().decode()
    # The only compacted topic of this broker is __consumer_offsets.
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("strata_cleaner_records_removed_total"))


def test_restarted_broker_reloads_groups_and_offsets(group_broker: BrokerProcess) -> None:
    """The reload replays a compacted __consumer_offsets partition (gaps, superseded
    commits gone) and still finds every group's latest state."""
    member = join_and_settle(group_broker, "durable", session_timeout_ms=30_000)
    with Admin(group_broker.bootstrap) as admin:  # small segments: they close and get cleaned
        admin.alter_configs("__consumer_offsets", set={"segment.bytes": "2048"})
    commit(group_broker, "durable", member.member_id, member.member_epoch,
           {("orders", p): 100 + p for p in range(4)})
    for round_ in range(40):  # the same key over and over: compaction's work
        commit(group_broker, "durable", member.member_id, member.member_epoch,
               {("orders", 0): 200 + round_})
    wait_for("the cleaner compacting __consumer_offsets", lambda: _cleaner_removed(group_broker),
             lambda removed: removed > 10, 30)
    group_broker.stop()
    group_broker.start()
    find(group_broker, "durable")
    assert fetch(group_broker, "durable") == {("orders", 0): 239, ("orders", 1): 101,
                                              ("orders", 2): 102, ("orders", 3): 103}
    # The member survived the restart: same id and epoch are accepted, nothing moves.
    again = heartbeat(group_broker, "durable", member.member_id, member.member_epoch,
                      owned=member.assignment)
    assert (again.error_code, again.assignment, again.member_epoch) == \
        (0, member.assignment, member.member_epoch)
    assert heartbeat(group_broker, "durable", member.member_id, LEAVE_EPOCH).error_code == 0


def test_a_recreated_topic_does_not_inherit_old_offsets(group_broker: BrokerProcess) -> None:
    """As Kafka drops a deleted topic's committed offsets: a topic deleted and created
    again under the same name starts without committed offsets (else a consumer would
    start at the old topic's positions and skip the new topic's first records), also
    after the coordinator reloaded its state, and new commits are kept."""
    with Admin(group_broker.bootstrap) as admin:
        admin.create_topics([NewTopic("reborn", 2, 1)])
    find(group_broker, "rebirth")
    assert commit(group_broker, "rebirth", None, NO_MEMBER_EPOCH,
                  {("reborn", 0): 40, ("reborn", 1): 7, ("orders", 0): 5}) == \
        {("reborn", 0): 0, ("reborn", 1): 0, ("orders", 0): 0}
    with Admin(group_broker.bootstrap) as admin:
        admin.delete_topics(["reborn"])
        # Deleted and not created again: the offsets are still listed (nothing reads
        # them), as before.
        assert fetch(group_broker, "rebirth")[("reborn", 0)] == 40
        admin.create_topics([NewTopic("reborn", 2, 1)])
    wait_for("the new topic's offsets to be dropped",
             lambda: fetch(group_broker, "rebirth"),
             lambda found: found == {("orders", 0): 5}, 15)
    assert commit(group_broker, "rebirth", None, NO_MEMBER_EPOCH, {("reborn", 1): 3}) == \
        {("reborn", 1): 0}
    group_broker.stop()
    group_broker.start()
    find(group_broker, "rebirth")
    assert fetch(group_broker, "rebirth") == {("orders", 0): 5, ("reborn", 1): 3}


def test_internal_topic_is_protected(group_broker: BrokerProcess) -> None:
    find(group_broker, "protect")
    with Admin(group_broker.bootstrap) as admin:
        deleted = admin.delete_topics(["__consumer_offsets"], raise_errors=False)
        assert "cannot be deleted" in str(deleted)
        with pytest.raises(PolicyViolationError, match=r"must stay cleanup\.policy=compact"):
            admin.alter_configs("__consumer_offsets", set={"cleanup.policy": "delete"})
        admin.alter_configs("__consumer_offsets", set={"retention.ms": "604800000"})
    with Producer(group_broker.bootstrap, acks=1, retries=0) as producer, \
            pytest.raises(PolicyViolationError, match="only the group coordinator"):
        producer.send("__consumer_offsets", b"forged", key=b"{}").result(10)


def test_a_failed_store_leaves_no_trace(group_broker: BrokerProcess) -> None:
    """With __consumer_offsets unable to reach min.insync.replicas every group write
    fails: joins are refused (NOT_ENOUGH_REPLICAS) and their retries leave no phantom
    member behind; once writes work again exactly one member joins."""
    find(group_broker, "rollback")
    with Admin(group_broker.bootstrap) as admin:
        admin.alter_configs("__consumer_offsets", set={"min.insync.replicas": "2"})
        try:
            wait_for("group writes failing", lambda: heartbeat(group_broker, "rollback"),
                     lambda a: a.error_code == NotEnoughReplicasError.code, 30)
            for _ in range(3):
                assert heartbeat(group_broker, "rollback").error_code == \
                    NotEnoughReplicasError.code
            described = call(group_broker, ApiKey.DESCRIBE_GROUPS,
                             DescribeGroupsRequest(["rollback"])).groups[0]
            assert described.error_code == GroupIdNotFoundError.code
        finally:
            admin.alter_configs("__consumer_offsets", delete=["min.insync.replicas"])
    member = wait_for("a join once writes work", lambda: heartbeat(group_broker, "rollback"),
                      lambda a: a.error_code == 0, 30)
    described = call(group_broker, ApiKey.DESCRIBE_GROUPS,
                     DescribeGroupsRequest(["rollback"])).groups[0]
    assert [m.member_id for m in described.members] == [member.member_id]
    heartbeat(group_broker, "rollback", member.member_id, LEAVE_EPOCH)


def test_a_member_cannot_claim_a_partition_it_was_not_given(group_broker: BrokerProcess
                                                            ) -> None:
    a = join_and_settle(group_broker, "claims")
    b = heartbeat(group_broker, "claims")
    # A gives up what moves to B, then B takes it.
    a2 = heartbeat(group_broker, "claims", a.member_id, a.member_epoch, owned=a.assignment)
    a3 = heartbeat(group_broker, "claims", a.member_id, a2.member_epoch, owned=a2.assignment)
    b2 = wait_for("b's partitions", lambda: heartbeat(
        group_broker, "claims", b.member_id, b.member_epoch), lambda r: bool(r.assignment), 10)
    theirs = {(t.topic, p) for t in b2.assignment for p in t.partitions}
    assert theirs and not theirs & {(t.topic, p) for t in a3.assignment for p in t.partitions}
    # A claims to own everything: only what it was given counts, so B's commit stands.
    everything = [GroupTopicPartitions("orders", [0, 1, 2, 3])]
    heartbeat(group_broker, "claims", a.member_id, a3.member_epoch, owned=everything)
    stolen = sorted(theirs)[0]
    assert commit(group_broker, "claims", a.member_id, a3.member_epoch, {stolen: 1}) == \
        {stolen: StaleMemberEpochError.code}
    for m in (a, b):
        heartbeat(group_broker, "claims", m.member_id, LEAVE_EPOCH)


def test_a_live_static_twin_is_refused(group_broker: BrokerProcess) -> None:
    first = join_and_settle(group_broker, "twins", instance_id="pod-1")
    twin = heartbeat(group_broker, "twins", instance_id="pod-1")
    assert twin.error_code == UnreleasedInstanceIdError.code
    assert "same instance id" in twin.error_message
    # Once the first process is silent for two heartbeat intervals the twin gets in,
    # with the same partitions and no rebalance, and the first id is fenced.
    epoch = call(group_broker, ApiKey.DESCRIBE_GROUPS,
                 DescribeGroupsRequest(["twins"])).groups[0].group_epoch
    second = wait_for("the restarted twin let in",
                      lambda: heartbeat(group_broker, "twins", instance_id="pod-1"),
                      lambda a: a.error_code == 0, 10)
    assert second.assignment == first.assignment
    assert call(group_broker, ApiKey.DESCRIBE_GROUPS,
                DescribeGroupsRequest(["twins"])).groups[0].group_epoch == epoch
    # The replaced id is told why: another consumer with its instance id took its place
    # (FENCED_INSTANCE_ID), on a heartbeat and on a late commit, which moves nothing.
    stale = heartbeat(group_broker, "twins", first.member_id, first.member_epoch)
    assert stale.error_code == FencedInstanceIdError.code
    assert "pod-1" in stale.error_message
    theirs = sorted((t.topic, p) for t in first.assignment for p in t.partitions)
    assert commit(group_broker, "twins", first.member_id, first.member_epoch,
                  {theirs[0]: 7}) == {theirs[0]: FencedInstanceIdError.code}
    # A dynamic member that left (e.g. after max_poll_interval_ms) is unknown: its late
    # commit is refused the same way.
    gone = heartbeat(group_broker, "twins")
    heartbeat(group_broker, "twins", gone.member_id, LEAVE_EPOCH)
    assert commit(group_broker, "twins", gone.member_id, gone.member_epoch,
                  {theirs[0]: 3}) == {theirs[0]: UnknownMemberIdError.code}
    heartbeat(group_broker, "twins", second.member_id, LEAVE_EPOCH)


def test_repeated_topics_in_a_subscription_do_not_rebalance(group_broker: BrokerProcess
                                                            ) -> None:
    member = join_and_settle(group_broker, "dupes", subscribed_topics=["orders", "orders"])
    epoch = call(group_broker, ApiKey.DESCRIBE_GROUPS,
                 DescribeGroupsRequest(["dupes"])).groups[0].group_epoch
    for _ in range(3):
        answer = heartbeat(group_broker, "dupes", member.member_id, member.member_epoch,
                           owned=member.assignment, subscribed_topics=["orders", "orders"])
        assert answer.error_code == 0
    assert call(group_broker, ApiKey.DESCRIBE_GROUPS,
                DescribeGroupsRequest(["dupes"])).groups[0].group_epoch == epoch
    heartbeat(group_broker, "dupes", member.member_id, LEAVE_EPOCH)
