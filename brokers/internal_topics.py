"""What the brokers' internal, compacted topics share: creating one, writing to it, and
asking the broker that leads one (a one-off request over the inter-broker listener).

``__consumer_offsets`` (the groups' state, ``group_coordinator.py``),
``__transaction_state`` (``transaction_coordinator.py``) and ``__schemas`` (the schema
registry, ``schema_registry.py``) are all stored the way Kafka stores its
internal topics: a compacted topic whose partition leader is the one broker that
writes it, and whose every write waits for the in-sync replicas (acks=all) before
anything is answered, so a new leader that loads the partition sees every answer
given.

Thread-safety: the event loop's; ZooKeeper calls go through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING

from wire.errors import (
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    RequestTimedOutError,
    StrataError,
    TopicAlreadyExistsError,
)

if TYPE_CHECKING:  # pragma: no cover
    from brokers.config import BrokerConfig
    from brokers.coordination import BrokerRegistration, ZooKeeperClient
    from brokers.partition import Partition
    from brokers.services import InternalTopicHost, MetadataCache
    from wire.protocol import ApiKey, Message

__all__ = ["KeyedTopic", "append_replicated", "ask_broker", "create_internal_topic"]

log = logging.getLogger("strata.brokers.internal_topics")


class KeyedTopic:
    """An internal topic whose partition leaders coordinate keys (group ids, transactional
    ids): ``find`` answers FindCoordinator. The topic is created on first use, one
    creation at a time (a thousand clients starting together must not each go to
    ZooKeeper, nor hold their FindCoordinator that long)."""

    def __init__(self, name: str, noun: str, cluster: MetadataCache,
                 partition_of: Callable[[str, int], int],
                 create: Callable[[], Coroutine[object, object, None]]) -> None:
        self.name, self.noun, self.cluster = name, noun, cluster
        self.partition_of = partition_of
        self._create = create
        self._creating: asyncio.Task[None] | None = None

    async def find(self, key: str, listener: str = "") -> tuple[int, str, int]:
        """(node id, host, port on ``listener``) of the live leader of ``key``'s partition
        (a client is sent to the listener it came in on; "": the broker's first address);
        retriable
        COORDINATOR_NOT_AVAILABLE while the topic is created or the partition has none."""
        topic = self.cluster.topics.get(self.name)
        if topic is None:
            if self._creating is None or self._creating.done():
                self._creating = asyncio.create_task(self._create())
            await asyncio.shield(self._creating)
            raise CoordinatorNotAvailableError(f"{self.name} is being created; retry in a "
                                               "moment")
        p = self.partition_of(key, topic.partition_count)
        state = self.cluster.partition_states.get((self.name, p))
        leader = self.cluster.live_brokers.get(state.leader) if state is not None else None
        if leader is None:
            raise CoordinatorNotAvailableError(
                f"{self.name}-{p} ({self.noun} {key!r}) has no live leader right now; "
                "retry after a short back-off")
        return (leader.broker_id, *leader.endpoint(listener))


async def create_internal_topic(name: str, partitions: int, *, config: BrokerConfig,
                                cluster: MetadataCache, zookeeper: ZooKeeperClient,
                                host: InternalTopicHost, topic_config: dict[str, str]) -> None:
    """Create compacted internal topic ``name`` with ``offsets.topic.replication.factor``
    replicas, unless another broker did first. Raises COORDINATOR_NOT_AVAILABLE when too
    few brokers are live: created once with its factor for good, a single copy would
    quietly undo the cluster's replication (Kafka waits too). ZooKeeper trouble is
    logged, not raised: the caller's next request retries."""
    from brokers.controller import assign_replicas
    from brokers.coordination import TopicDefinition

    if not cluster.live_brokers:
        await host.refresh_brokers()
    live = sorted(cluster.live_brokers)
    replication = config.offsets_topic_replication_factor
    if len(live) < replication:
        await host.refresh_brokers()
        live = sorted(cluster.live_brokers)
        if len(live) < replication:
            raise CoordinatorNotAvailableError(
                f"{name} is created with offsets.topic.replication.factor={replication} "
                f"replicas and only {len(live)} broker(s) are live: start more brokers, or "
                "lower offsets.topic.replication.factor on every broker (a single-broker "
                "cluster needs 1)")
    definition = TopicDefinition(name, uuid.uuid4().hex,
                                 assign_replicas(live, partitions, replication))
    try:
        await asyncio.to_thread(zookeeper.create_topic, definition,
                                {"cleanup.policy": "compact", **topic_config})
        log.info("created %s: %d partitions, replication factor %d", name, partitions,
                 replication)
    except TopicAlreadyExistsError:
        pass  # another broker created it first
    except StrataError as err:  # ZooKeeper trouble (ZooKeeperUnavailableError) and such
        log.warning("creating %s failed (%r); the next request retries", name, err)
    with contextlib.suppress(StrataError):
        await host.sync_topics()


async def append_replicated(partition: Partition, batch: bytes, *, what: str,
                            timeout_s: float) -> int:
    """Append ``batch`` as the partition's leader and wait until every in-sync replica
    has it (acks=all); the offset after it. ``what`` names the state in the errors."""
    if len(partition.isr) < partition.config.min_insync_replicas:
        raise NotEnoughReplicasError(
            f"{partition.name} has {len(partition.isr)} in-sync replicas, "
            f"min.insync.replicas is {partition.config.min_insync_replicas}; {what} was "
            "not stored: retry")
    result = partition.append_as_leader(batch)
    end = result.last_offset + 1
    try:
        await asyncio.wait_for(partition.wait_durable(end), timeout_s)
        if not await partition.wait_replicated(end, timeout_s):
            raise NotCoordinatorError(
                f"this broker stopped leading {partition.name} before {what} was "
                "replicated; find the coordinator again and retry")
    except TimeoutError:
        raise RequestTimedOutError(
            f"{partition.name}: the in-sync replicas did not confirm {what} within "
            f"{timeout_s:.0f} s; retry") from None
    return end


async def ask_broker(registration: BrokerRegistration, config: BrokerConfig, api: ApiKey,
                     request: Message, *, purpose: str, timeout_s: float) -> Message:
    """One request to another broker on a connection of its own, closed afterwards.

    For rare requests (the groups' lag gauge, a schema look-up the produce check could
    not answer from its cache): a paused broker accepts the connection and never
    answers, so connecting and answering are both bounded by ``timeout_s``. Raises
    ``StrataError``, ``OSError`` or ``TimeoutError``."""
    from wire.connection import BrokerConnection

    connection = BrokerConnection(registration.host, registration.port,
                                  client_id=f"broker-{config.broker_id}-{purpose}",
                                  security=config.inter_broker_security())
    try:
        await connection.connect(timeout=timeout_s)
        return await asyncio.wait_for(connection.request(api, request), timeout_s)
    finally:
        await connection.close()
