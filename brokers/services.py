"""What the broker's parts are given, instead of the whole :class:`~brokers.broker.Broker`.

The request handlers, the controller, the replica manager, the fetcher manager, the log
manager, the group coordinator and the schema registry each receive the pieces they use
(the way Kafka's ``KafkaApis`` receives a ``ReplicaManager``, a ``GroupCoordinator`` and
a ``MetadataCache``):

* :class:`MetadataCache`: this broker's view of the cluster (topics and their config
  overrides, partition states, live brokers, brokers in a controlled shutdown, the
  cluster id), as last read from ZooKeeper;
* :class:`PartitionRegistry`: the replicas hosted here, and the ones that could not be
  opened;
* the ZooKeeper client (:class:`brokers.coordination.ZooKeeperClient`), the only path
  to ZooKeeper;
* a host: a :class:`typing.Protocol` naming the few callbacks into the broker process a
  part needs (apply a partition state, re-read the topics or the live brokers, allocate
  a producer id, schedule a callback from kazoo's thread onto the event loop).

Invariants: ``broker.py`` is the only writer of both structures (from ZooKeeper watches,
start-up and topic sync); every other part only reads them, except that a part that
finds a log failing marks it offline in the registry. None of these modules imports
``brokers.broker``, so the parts can be built and tested without a broker process
(``tests/test_handlers_unit.py``).

Thread-safety: both structures belong to the broker's event loop; kazoo's threads reach
them only through ``host.threadsafe`` callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from brokers.coordination import (
        BrokerRegistration,
        PartitionKey,
        PartitionState,
        TopicDefinition,
    )
    from brokers.log import LogConfig
    from brokers.partition import Partition
    from wire.errors import StrataError

__all__ = ["ControllerHost", "HandlerHost", "InternalTopicHost", "MetadataCache",
           "PartitionRegistry", "ReplicaHost"]


@dataclass
class MetadataCache:
    """This broker's view of the cluster metadata, kept current by ``broker.py``."""

    broker_id: int
    cluster_id: str = ""
    topics: dict[str, TopicDefinition] = field(default_factory=dict)
    #: Per-topic config overrides (``strata topic alter-config``), by topic name.
    topic_overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    partition_states: dict[PartitionKey, PartitionState] = field(default_factory=dict)
    live_brokers: dict[int, BrokerRegistration] = field(default_factory=dict)
    #: Brokers in a controlled shutdown: leaders do not take them back into an ISR, and
    #: the controller elects none of them.
    shutting_down: set[int] = field(default_factory=set)


@dataclass
class PartitionRegistry:
    """The replicas hosted on this broker, and those that could not be opened.

    A key is in at most one of the two maps: an offline partition (damaged data, a
    failed flush or disk) answers every request with its error instead of taking the
    broker down.
    """

    hosted: dict[PartitionKey, Partition] = field(default_factory=dict)
    offline: dict[PartitionKey, StrataError] = field(default_factory=dict)


class _Lifecycle(Protocol):
    @property
    def stopping(self) -> bool: ...


class ReplicaHost(_Lifecycle, Protocol):
    """What the replica manager (ISR upkeep) and the fetcher manager (followers) ask of
    the broker process."""

    @property
    def zookeeper_suspended(self) -> bool: ...

    def apply_partition_state(self, name: str, p: int, state: PartitionState, *,
                              force: bool = False, quiet: bool = False) -> bool: ...

    def high_watermark_entries(self, partitions: Iterable[Partition],
                               keep: Collection[PartitionKey]) -> dict[PartitionKey, int]:
        """``LogManager.high_watermark_entries`` (on the loop)."""
        ...

    def write_high_watermarks(self, entries: dict[PartitionKey, int]) -> None:
        """``LogManager.write_high_watermarks`` (worker thread)."""
        ...


class ControllerHost(ReplicaHost, Protocol):
    """What the controller asks of the broker process."""

    def log_config_for(self, topic: str) -> LogConfig: ...

    def threadsafe(self, callback: Callable[[Any], Coroutine[Any, Any, None]]
                   ) -> Callable[[Any], None]:
        """A function kazoo's thread may call: it schedules ``callback`` on the loop."""
        ...


class InternalTopicHost(Protocol):
    """What the owners of the brokers' internal topics (the group coordinator with
    ``__consumer_offsets``, the schema registry with ``__schemas``) ask of the broker
    process: creating such a topic needs the live brokers and, once created, the topic
    in the cache (``brokers/internal_topics.py``)."""

    async def refresh_brokers(self) -> None: ...

    async def sync_topics(self, names: list[str] | None = None) -> None: ...


class HandlerHost(InternalTopicHost, _Lifecycle, Protocol):
    """What the request handlers ask of the broker process."""

    @property
    def cut_off_from_zookeeper(self) -> bool:
        """ZooKeeper has (or must by now have) expired this broker's session."""
        ...

    def log_config_for(self, topic: str) -> LogConfig: ...

    async def next_producer_id(self) -> int: ...

    async def on_configs_changed(self, name: str, overrides: dict[str, str] | None) -> None:
        ...
