"""The request handlers without a broker process: in-memory fakes for ZooKeeper and the
broker's callbacks, real partitions (real logs in a temp dir) in the registry.

``RequestHandlers`` is built from the parts it uses (``brokers/services.py``): the
metadata cache, the partition registry, the coordination client, a host protocol and
the replica manager (the leader side of produce and fetch), built from the same parts.
The fakes here implement the few coordination calls and callbacks each test reaches; the
same handlers run over TCP against real brokers in tests/test_broker_api.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from brokers.config import BrokerConfig
from brokers.coordination import (
    BrokerRegistration,
    PartitionState,
    TopicDefinition,
    ZooKeeperUnavailableError,
)
from brokers.handlers import RequestHandlers
from brokers.log import LogConfig
from brokers.partition import Partition
from brokers.replica_manager import ReplicaManager
from brokers.services import MetadataCache, PartitionRegistry
from wire.errors import LogStorageError, TopicAlreadyExistsError, UnsupportedVersionError
from wire.protocol import (
    ApiKey,
    CreatableTopic,
    CreateTopicsRequest,
    DescribeConfigsRequest,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    InitProducerIdRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    Reader,
    RequestHeader,
)
from wire.record_batch import build_batch, decode_batch

pytestmark = pytest.mark.unit

ME = 0


class FakeCoordinator:
    """The coordination calls the handlers make, over dicts instead of ZooKeeper."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicDefinition] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.down = False  # every call fails as ZooKeeper unreachable would

    def _check(self, call: str) -> None:
        if self.down:
            raise ZooKeeperUnavailableError(f"ZooKeeper did not complete {call} (injected)")

    def create_topic(self, topic: TopicDefinition, configs: dict[str, str]) -> None:
        self._check("create_topic")
        if topic.name in self.topics:
            raise TopicAlreadyExistsError(f"topic {topic.name!r} already exists")
        self.topics[topic.name] = topic
        self.configs[topic.name] = dict(configs)


class FakeHost:
    """The broker-process callbacks: ``sync_topics`` copies the fake ZooKeeper's topics
    into the cache, as the broker's watch would; producer ids come from a counter."""

    def __init__(self, zk: FakeCoordinator, cluster: MetadataCache) -> None:
        self.zk, self.cluster = zk, cluster
        self.stopping = False
        self.cut_off_from_zookeeper = False
        self.zookeeper_suspended = False
        self.next_id = 1000
        self.synced = 0

    async def sync_topics(self, names: list[str] | None = None) -> None:
        self.synced += 1
        self.cluster.topics.update(self.zk.topics)
        self.cluster.topic_overrides.update(self.zk.configs)

    async def refresh_brokers(self) -> None:
        pass

    def log_config_for(self, topic: str) -> LogConfig:
        return LogConfig.from_mapping(self.cluster.topic_overrides.get(topic, {}))

    async def next_producer_id(self) -> int:
        self.zk._check("allocate_producer_id_block")
        self.next_id += 1
        return self.next_id

    async def on_configs_changed(self, name: str, overrides: dict[str, str] | None) -> None:
        pass


class Setup(SimpleNamespace):
    handlers: RequestHandlers
    zk: FakeCoordinator
    host: FakeHost
    cluster: MetadataCache
    registry: PartitionRegistry


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    config = BrokerConfig.from_mapping({"broker.id": str(ME), "log.dirs": str(tmp_path)})
    cluster = MetadataCache(ME)
    cluster.cluster_id = "unit-cluster"
    for broker_id in (0, 1, 2):
        cluster.live_brokers[broker_id] = BrokerRegistration(broker_id, "127.0.0.1",
                                                             9000 + broker_id, 0)
    registry = PartitionRegistry()
    zk = FakeCoordinator()
    host = FakeHost(zk, cluster)
    controller = SimpleNamespace(current=(1, 7))
    replicas = ReplicaManager(config, cluster, registry, zk, host)  # type: ignore[arg-type]
    handlers = RequestHandlers(config, cluster, registry, zk,  # type: ignore[arg-type]
                               controller=controller, replicas=replicas,
                               groups=None, host=host)  # type: ignore[arg-type]
    yield Setup(handlers=handlers, zk=zk, host=host, cluster=cluster, registry=registry)
    for partition in registry.hosted.values():
        partition.close()


def host_topic(s: Setup, tmp_path: Path, name: str, *, leader: int = ME,
               replicas: list[int] | None = None) -> Partition | None:
    """One partition of ``name``, in the cache and, if it has a replica here, hosted."""
    replicas = replicas or [ME]
    s.cluster.topics[name] = TopicDefinition(name, f"id-{name}", {0: replicas})
    s.cluster.partition_states[(name, 0)] = PartitionState(leader, 1, [leader])
    if ME not in replicas:
        return None
    partition = Partition(name, 0, f"id-{name}", tmp_path / f"{name}-0", LogConfig(), ME)
    partition.set_state(leader, 1, [leader], replicas, version=1)
    s.registry.hosted[(name, 0)] = partition
    return partition


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_metadata_answers_from_the_cache(setup: Setup, tmp_path: Path) -> None:
    host_topic(setup, tmp_path, "led-elsewhere", leader=1, replicas=[1, 2])
    setup.cluster.partition_states[("led-elsewhere", 0)] = PartitionState(1, 4, [1, 2])
    response = run(setup.handlers.admin.metadata(MetadataRequest(None)))
    assert [b.node_id for b in response.brokers] == [0, 1, 2]
    assert response.controller_id == 1 and response.cluster_id == "unit-cluster"
    (topic,) = response.topics
    (partition,) = topic.partitions
    assert (partition.leader, partition.leader_epoch, partition.isr) == (1, 4, [1, 2])
    # A leader that is not live is reported as none, so clients wait instead of dialling.
    del setup.cluster.live_brokers[1]
    response = run(setup.handlers.admin.metadata(MetadataRequest(["led-elsewhere", "nope"])))
    assert response.topics[0].partitions[0].leader == -1
    assert response.topics[1].error_code == 3


def test_produce_then_fetch_and_list_offsets_on_a_hosted_leader(setup: Setup,
                                                                  tmp_path: Path) -> None:
    host_topic(setup, tmp_path, "t")
    batch = build_batch([b"a", b"b", b"c"])
    produced = run(setup.handlers.produce.produce(ProduceRequest(
        -1, 5_000, [ProduceTopic("t", [ProducePartition(0, batch)])])))
    answer = produced.topics[0].partitions[0]
    assert (answer.error_code, answer.base_offset) == (0, 0)
    fetched = run(setup.handlers.fetch.fetch(FetchRequest(
        [FetchTopic("t", [FetchPartition(0, 0, 1 << 20)])], max_wait_ms=0, min_bytes=1,
        max_bytes=1 << 20)))
    part = fetched.topics[0].partitions[0]
    assert part.error_code == 0 and part.high_watermark == 3
    assert part.records is not None
    _, records = decode_batch(part.records.read_bytes())
    assert records.column("value").to_pylist() == [b"a", b"b", b"c"]
    offsets = run(setup.handlers.fetch.list_offsets(ListOffsetsRequest(
        [ListOffsetsTopic("t", [ListOffsetsPartition(0, -1), ListOffsetsPartition(0, -2)])])))
    assert [p.offset for p in offsets.topics[0].partitions] == [3, 0]


def test_each_partition_gets_its_own_error(setup: Setup, tmp_path: Path) -> None:
    host_topic(setup, tmp_path, "good")
    host_topic(setup, tmp_path, "elsewhere", leader=1, replicas=[1])
    host_topic(setup, tmp_path, "follower", leader=1, replicas=[1, ME])
    host_topic(setup, tmp_path, "broken")
    broken = setup.registry.hosted.pop(("broken", 0))
    broken.close()
    setup.registry.offline[("broken", 0)] = LogStorageError("injected: disk gone")
    batch = build_batch([b"x"])
    response = run(setup.handlers.produce.produce(ProduceRequest(1, 5_000, [
        ProduceTopic(name, [ProducePartition(0, batch)])
        for name in ("good", "elsewhere", "follower", "broken", "missing", "__internal")])))
    codes = {t.name: t.partitions[0].error_code for t in response.topics}
    # 6 NOT_LEADER, 56 KAFKA_STORAGE_ERROR, 3 UNKNOWN_TOPIC_OR_PARTITION, 44 POLICY_VIOLATION
    assert codes == {"good": 0, "elsewhere": 6, "follower": 6, "broken": 56, "missing": 3,
                     "__internal": 44}
    messages = {t.name: t.partitions[0].error_message for t in response.topics}
    assert "disk gone" in (messages["broken"] or "")
    assert "strata topic describe" in (messages["missing"] or "")


def test_bad_acks_refuse_every_partition_and_write_nothing(setup: Setup,
                                                           tmp_path: Path) -> None:
    partition = host_topic(setup, tmp_path, "t")
    assert partition is not None
    response = run(setup.handlers.produce.produce(ProduceRequest(
        2, 5_000, [ProduceTopic("t", [ProducePartition(0, build_batch([b"x"]))])])))
    assert response.topics[0].partitions[0].error_code == 21  # INVALID_REQUIRED_ACKS
    assert partition.log.log_end_offset == 0


def test_create_topics_writes_once_and_waits_for_the_cache(setup: Setup) -> None:
    request = CreateTopicsRequest([CreatableTopic("fresh", 6, 3, [], [])], 5_000, False)
    response = run(setup.handlers.admin.create_topics(request))
    assert [(r.name, r.error_code) for r in response.topics] == [("fresh", 0)]
    definition = setup.zk.topics["fresh"]
    assert sorted(definition.assignment) == list(range(6))
    assert all(sorted(r) == [0, 1, 2] for r in definition.assignment.values())
    # Leaders spread evenly over the three live brokers.
    assert sorted(r[0] for r in definition.assignment.values()) == [0, 0, 1, 1, 2, 2]
    assert "fresh" in setup.cluster.topics and setup.host.synced >= 1
    again = run(setup.handlers.admin.create_topics(request))
    assert again.topics[0].error_code == 36  # TOPIC_ALREADY_EXISTS


@pytest.mark.parametrize(("topic", "code", "words"), [
    (CreatableTopic("bad name!", 1, 1, [], []), 17, "is not valid"),
    (CreatableTopic("__mine", 1, 1, [], []), 44, "reserved for internal topics"),
    (CreatableTopic("zero", 0, 1, [], []), 37, "partition count 0 is not valid"),
    (CreatableTopic("wide", 1, 4, [], []), 38, "3 live broker(s)"),
])
def test_bad_topics_are_refused_before_anything_is_written(
        setup: Setup, topic: CreatableTopic, code: int, words: str) -> None:
    response = run(setup.handlers.admin.create_topics(CreateTopicsRequest([topic], 5_000, False)))
    (result,) = response.topics
    assert result.error_code == code and words in (result.error_message or "")
    assert setup.zk.topics == {}


def test_zookeeper_trouble_is_a_retriable_error_not_a_crash(setup: Setup) -> None:
    setup.zk.down = True
    response = run(setup.handlers.admin.create_topics(CreateTopicsRequest(
        [CreatableTopic("later", 1, 1, [], [])], 5_000, False)))
    assert response.topics[0].error_code == 8  # BROKER_NOT_AVAILABLE: retry
    assert "ZooKeeper did not complete" in (response.topics[0].error_message or "")
    produced_id = run(setup.handlers.transactions.init_producer_id(
        InitProducerIdRequest(None, 60_000, -1, -1)))
    assert produced_id.error_code == 8


def test_describe_configs_marks_overrides(setup: Setup, tmp_path: Path) -> None:
    host_topic(setup, tmp_path, "t")
    setup.cluster.topic_overrides["t"] = {"retention.ms": "1000"}
    response = run(setup.handlers.admin.describe_configs(DescribeConfigsRequest(["t", "nope"])))
    entries = {c.name: c for c in response.topics[0].configs}
    assert entries["retention.ms"].value == "1000" and not entries["retention.ms"].is_default
    assert entries["segment.bytes"].is_default
    assert response.topics[1].error_code == 3


def test_dispatch_refuses_an_unknown_api_and_an_unsupported_version(setup: Setup) -> None:
    with pytest.raises(UnsupportedVersionError, match="unknown api key 999"):
        run(setup.handlers.dispatch(RequestHeader(999, 0, 1, "unit"), Reader(b"")))
    with pytest.raises(UnsupportedVersionError, match="version 99 is not supported"):
        run(setup.handlers.dispatch(RequestHeader(int(ApiKey.METADATA), 99, 1, "unit"),
                                    Reader(b"")))


def test_kazoo_exceptions_leave_coordination_as_a_strata_error() -> None:
    """A session never started behaves as a lost one: kazoo raises its own exception,
    the public method turns it into ZooKeeperUnavailableError (code 8, retriable)."""
    from kazoo.exceptions import KazooException

    from brokers.coordination import ZooKeeperClient

    coordinator = ZooKeeperClient("127.0.0.1:1")
    with pytest.raises(ZooKeeperUnavailableError, match="did not complete list_topics") as err:
        coordinator.list_topics()
    assert err.value.code == 8 and isinstance(err.value.__cause__, KazooException)
