"""Admin client against a real ZooKeeper and a real broker process over TCP: every call,
and every error path with its typed error and message."""

from __future__ import annotations

import asyncio
import re

import pytest

from strata.client import (
    Admin,
    AsyncAdmin,
    ConfigValue,
    ListOffsetsResult,
    NewTopic,
    PartitionDescription,
    TopicPartition,
)
from tests.test_consumer import produce
from wire.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    PolicyViolationError,
    StrataError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

pytestmark = pytest.mark.integration


def test_create_list_describe_delete(admin: Admin, bootstrap: str) -> None:
    assert admin.create_topics([NewTopic("orders", 3, 1, {"retention.ms": 3_600_000})]) == \
        {"orders": None}
    assert "orders" in admin.list_topics()
    cluster = admin.describe_cluster()
    assert list(cluster.brokers) == [0] and cluster.cluster_id

    description = admin.describe_topics(["orders"])["orders"]
    assert description.num_partitions == 3
    assert description.partitions[1] == PartitionDescription(
        partition=1, leader=0, leader_epoch=description.partitions[1].leader_epoch,
        replicas=(0,), isr=(0,), log_start_offset=0, log_end_offset=0, high_watermark=0)

    produce(bootstrap, "orders", 1, [b"a", b"b", b"c"])
    produce(bootstrap, "orders", 1, [b"d", b"e"])
    partitions = admin.describe_topics(["orders"])["orders"].partitions
    assert [(p.log_start_offset, p.log_end_offset, p.high_watermark) for p in partitions] == \
        [(0, 0, 0), (0, 5, 5), (0, 0, 0)]
    assert "orders" in admin.describe_topics()  # None: every topic
    metadata_only = admin.describe_topics(["orders"], offsets=False)["orders"].partitions
    assert [(p.leader, p.isr, p.log_end_offset, p.high_watermark) for p in metadata_only] \
        == [(0, (0,), -1, -1)] * 3

    # Broker defaults for partitions and replication factor.
    admin.create_topics([NewTopic("defaults")])
    assert admin.describe_topics(["defaults"])["defaults"].num_partitions == 1

    assert admin.delete_topics(["orders", "defaults"]) == {"orders": None, "defaults": None}
    assert not {"orders", "defaults"} & set(admin.list_topics())
    with pytest.raises(UnknownTopicOrPartitionError, match="'orders' does not exist"):
        admin.describe_topics(["orders"])


@pytest.mark.parametrize(("topic", "error", "message"), [
    (NewTopic("bad name!", 1, 1), InvalidTopicError, "is not valid"),
    (NewTopic("", 1, 1), InvalidTopicError, "is not valid"),
    (NewTopic("x" * 250, 1, 1), InvalidTopicError, "1-249 characters"),
    (NewTopic("__internal", 1, 1), PolicyViolationError, "reserved"),
    (NewTopic("zero-partitions", 0, 1), InvalidPartitionsError, "partition count 0"),
    (NewTopic("negative-partitions", -5, 1), InvalidPartitionsError, "partition count -5"),
    (NewTopic("rf-too-big", 1, 3), InvalidReplicationFactorError, "replication factor 3"),
    (NewTopic("rf-zero", 1, 0), InvalidReplicationFactorError, "replication factor 0"),
    (NewTopic("bad-key", 1, 1, {"retention.forever": "1"}), InvalidConfigError,
     "unknown topic config 'retention.forever'"),
    (NewTopic("bad-value", 1, 1, {"retention.ms": "soon"}), InvalidConfigError,
     "retention.ms='soon' is not valid"),
    (NewTopic("out-of-range", 1, 1, {"segment.bytes": 12}), InvalidConfigError,
     "segment.bytes='12' is out of range"),
    (NewTopic("bad-enum", 1, 1, {"cleanup.policy": "shred"}), InvalidConfigError,
     "cleanup.policy"),
])
def test_create_topic_errors(admin: Admin, topic: NewTopic, error: type[StrataError],
                             message: str) -> None:
    with pytest.raises(error, match=message) as info:
        admin.create_topics([topic])
    assert info.value.code == error.code
    assert topic.name not in admin.list_topics()


def test_per_topic_results_and_validate_only(admin: Admin) -> None:
    admin.create_topics([NewTopic("exists", 1, 1)])
    with pytest.raises(TopicAlreadyExistsError, match="'exists' already exists"):
        admin.create_topics([NewTopic("exists", 1, 1)])

    results = admin.create_topics([NewTopic("fresh", 2, 1), NewTopic("exists", 1, 1),
                                   NewTopic("bad name", 1, 1)], raise_errors=False)
    assert results["fresh"] is None
    assert isinstance(results["exists"], TopicAlreadyExistsError)
    assert isinstance(results["bad name"], InvalidTopicError)
    assert "fresh" in admin.list_topics()  # the good topic was created despite the others

    assert admin.create_topics([NewTopic("dry-run", 1, 1)], validate_only=True) == \
        {"dry-run": None}
    assert "dry-run" not in admin.list_topics()
    with pytest.raises(InvalidPartitionsError):
        admin.create_topics([NewTopic("dry-run", 0, 1)], validate_only=True)

    with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
        admin.delete_topics(["no-such-topic"])
    results = admin.delete_topics(["fresh", "no-such-topic"], raise_errors=False)
    assert results["fresh"] is None
    assert isinstance(results["no-such-topic"], UnknownTopicOrPartitionError)
    admin.delete_topics(["exists"])
    assert admin.create_topics([]) == {} and admin.delete_topics([]) == {}


def test_describe_and_alter_configs(admin: Admin) -> None:
    admin.create_topics([NewTopic("configured", 1, 1, {"retention.ms": "60000"})])
    configs = admin.describe_configs(["configured"])["configured"]
    assert configs["retention.ms"] == ConfigValue("retention.ms", "60000", False)
    assert configs["segment.bytes"].is_default
    assert {"retention.bytes", "cleanup.policy", "min.insync.replicas", "max.message.bytes",
            "flush.policy", "segment.ms"} <= set(configs)

    admin.alter_configs("configured", set={"segment.bytes": 1 << 20, "cleanup.policy": "delete"})
    configs = admin.describe_configs(["configured"])["configured"]
    assert configs["segment.bytes"] == ConfigValue("segment.bytes", str(1 << 20), False)
    assert configs["cleanup.policy"] == ConfigValue("cleanup.policy", "delete", False)
    assert configs["retention.ms"].value == "60000"  # untouched
    with pytest.raises(InvalidConfigError, match=r"compact,delete is not supported"):
        admin.alter_configs("configured", set={"cleanup.policy": "compact,delete",
                                               "tier.enable": "true"})

    admin.alter_configs("configured", delete=["retention.ms", "cleanup.policy"])
    configs = admin.describe_configs(["configured"])["configured"]
    assert configs["retention.ms"].is_default and configs["cleanup.policy"].value == "delete"
    assert configs["segment.bytes"].value == str(1 << 20)

    admin.alter_configs("configured", set={"retention.ms": "1"}, validate_only=True)
    assert admin.describe_configs(["configured"])["configured"]["retention.ms"].is_default

    with pytest.raises(InvalidConfigError, match=re.escape("unknown topic config 'no.such.key'")):
        admin.alter_configs("configured", set={"no.such.key": "1"})
    with pytest.raises(InvalidConfigError, match=re.escape("unknown topic config 'no.such.key'")):
        admin.alter_configs("configured", delete=["no.such.key"])
    with pytest.raises(InvalidConfigError,
                       match=re.escape("min.insync.replicas='0' is out of range")):
        admin.alter_configs("configured", set={"min.insync.replicas": 0})
    # A failed change is atomic: the valid half of it was not applied either.
    with pytest.raises(InvalidConfigError, match=re.escape("flush.policy")):
        admin.alter_configs("configured", set={"retention.ms": "5", "flush.policy": "often"})
    assert admin.describe_configs(["configured"])["configured"]["retention.ms"].is_default

    with pytest.raises(UnknownTopicOrPartitionError, match="'ghost' does not exist"):
        admin.alter_configs("ghost", set={"retention.ms": "1"})
    with pytest.raises(UnknownTopicOrPartitionError, match="'ghost' does not exist"):
        admin.describe_configs(["configured", "ghost"])
    admin.delete_topics(["configured"])


def test_list_offsets(admin: Admin, bootstrap: str) -> None:
    admin.create_topics([NewTopic("offsets", 2, 1)])
    tp0, tp1 = TopicPartition("offsets", 0), TopicPartition("offsets", 1)
    produce(bootstrap, "offsets", 0, [b"a", b"b"], timestamps=[1000, 1500])
    produce(bootstrap, "offsets", 0, [b"c", b"d", b"e"], timestamps=[2000, 2500, 3000])

    found = admin.list_offsets({tp0: "earliest", tp1: "latest"})
    assert found == {tp0: ListOffsetsResult(0, -1, found[tp0].leader_epoch),
                     tp1: ListOffsetsResult(0, -1, found[tp1].leader_epoch)}
    assert admin.list_offsets({tp0: "latest"})[tp0].offset == 5
    assert admin.list_offsets({tp0: 1200})[tp0].offset == 1
    assert admin.list_offsets({tp0: 2000})[tp0].offset == 2
    assert admin.list_offsets({tp0: 0})[tp0].offset == 0
    assert admin.list_offsets({tp0: 3001})[tp0].offset == -1  # no record that late
    assert admin.list_offsets({("offsets", 1): 1})[tp1].offset == -1  # type: ignore[dict-item]

    with pytest.raises(UnknownTopicOrPartitionError):
        admin.list_offsets({TopicPartition("offsets", 7): "latest"})
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.list_offsets({TopicPartition("nowhere", 0): "earliest"})
    with pytest.raises(ValueError, match="offset spec 'newest'"):
        admin.list_offsets({tp0: "newest"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="offset spec -3"):
        admin.list_offsets({tp0: -3})
    admin.delete_topics(["offsets"])


def test_async_admin(bootstrap: str) -> None:
    async def scenario() -> None:
        async with AsyncAdmin(bootstrap) as admin:
            await admin.create_topics([NewTopic("async-topic", 2, 1)])
            assert "async-topic" in await admin.list_topics()
            described = await admin.describe_topics(["async-topic"])
            assert described["async-topic"].num_partitions == 2
            with pytest.raises(TopicAlreadyExistsError):
                await admin.create_topics([NewTopic("async-topic", 2, 1)])
            await admin.delete_topics(["async-topic"])
            assert "async-topic" not in await admin.list_topics()

    asyncio.run(scenario())


def test_unreachable_cluster_is_a_network_error() -> None:
    from procs import free_port
    from wire.errors import NetworkError

    with Admin(f"127.0.0.1:{free_port()}", request_timeout_ms=2000) as admin, \
            pytest.raises(NetworkError, match="no broker answered"):
        admin.list_topics()
    with pytest.raises(ValueError, match="not host:port"):
        Admin("nonsense")
