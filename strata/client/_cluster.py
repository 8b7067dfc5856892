"""The client's view of the cluster: brokers, partition leaders, one connection per broker.

Metadata is fetched from any reachable broker (the bootstrap list first, then brokers
learnt since) and refreshed when a request fails with a retriable error such as
``NOT_LEADER_OR_FOLLOWER`` or a broken connection. All methods run on one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from wire.connection import BrokerConnection
from wire.errors import (
    BrokerNotAvailableError,
    NetworkError,
    StrataError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    raise_for_code,
)
from wire.protocol import ApiKey, Message, MetadataRequest, MetadataResponse
from wire.security import PLAINTEXT, ClientSecurity

__all__ = ["Cluster", "PartitionInfo", "parse_bootstrap"]

log = logging.getLogger("strata.client.cluster")


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def parse_bootstrap(bootstrap_servers: str | list[str] | tuple[str, ...]
                    ) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a list) to addresses; a clear error when malformed."""
    items = bootstrap_servers.split(",") if isinstance(bootstrap_servers, str) \
        else list(bootstrap_servers)
    out: list[tuple[str, int]] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"bootstrap server {item!r} is not host:port; give e.g. \"127.0.0.1:9092\" "
                "(several: comma-separated)")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no bootstrap servers given; give at least one \"host:port\" "
                         "(`strata up` prints the address)")
    return out


class Cluster:
    def __init__(self, bootstrap_servers: str | list[str], *,
                 client_id: str = "strata-python", request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100, security: ClientSecurity = PLAINTEXT) -> None:
        self.bootstrap_addresses = parse_bootstrap(bootstrap_servers)
        self.client_id = client_id
        self.security = security
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, dict[int, PartitionInfo]] = {}
        #: Each known topic's value subject (a typed topic's; None: bytes values).
        self.value_subjects: dict[str, str | None] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._refresh_lock = asyncio.Lock()
        self._connect_locks: dict[tuple[str, int], asyncio.Lock] = {}
        # Topics whose metadata callers are waiting for, and the one request that will
        # carry them all (see ``_refresh_together``).
        self._wanted: set[str] = set()
        self._gathering: asyncio.Future[MetadataResponse] | None = None

    # ------------------------------------------------------------------ connections
    async def connection_to(self, address: tuple[str, int]) -> BrokerConnection:
        connection = self._connections.get(address)
        if connection is not None and connection.is_open:
            return connection
        # One connect at a time per address: two tasks racing here would each open a
        # connection and the loser's would leak (its read task pending forever).
        lock = self._connect_locks.setdefault(address, asyncio.Lock())
        async with lock:
            connection = self._connections.get(address)
            if connection is not None and connection.is_open:
                return connection
            connection = BrokerConnection(*address, client_id=self.client_id,
                                          security=self.security)
            await connection.connect(timeout=self.request_timeout_ms / 1000)
            self._connections[address] = connection
            return connection

    async def connection(self, node_id: int) -> BrokerConnection:
        address = self.brokers.get(node_id)
        if address is None:
            await self.refresh()
            address = self.brokers.get(node_id)
            if address is None:
                raise NetworkError(f"broker {node_id} is not in the cluster metadata")
        return await self.connection_to(address)

    def _candidates(self) -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        for address in [*self.brokers.values(), *self.bootstrap_addresses]:
            if address not in seen:
                seen.append(address)
        return seen

    async def send_any(self, api: ApiKey, body: Message, *,
                       per_broker_timeout_s: float | None = None, version: int = 0
                       ) -> Message:
        """Send to the first broker that answers (admin and metadata requests), giving
        each one ``per_broker_timeout_s`` (default: the request timeout) to answer."""
        errors: list[str] = []
        timeout = self.request_timeout_ms / 1000 if per_broker_timeout_s is None \
            else per_broker_timeout_s
        for address in self._candidates():
            try:
                connection = await self.connection_to(address)
                return await asyncio.wait_for(connection.request(api, body, version=version),
                                              timeout)
            except (NetworkError, TimeoutError, BrokerNotAvailableError) as err:
                # BROKER_NOT_AVAILABLE: this broker is cut off from ZooKeeper (its view of
                # the cluster is stale); the next one may know better.
                errors.append(f"{address[0]}:{address[1]}: {err}")
        hint = "" if self.security.protocol != "PLAINTEXT" else (
            "; a connection closed at once may be a secured listener: set the client's "
            "security_protocol (or --command-config)")
        raise NetworkError("no broker answered: " + "; ".join(errors) +
                           " — is the cluster up (strata status)?" + hint)

    # ------------------------------------------------------------------ metadata
    async def refresh(self, topics: list[str] | None = None) -> MetadataResponse:
        async with self._refresh_lock:
            response = await self.send_any(ApiKey.METADATA, MetadataRequest(topics),
                                           version=1)
            assert isinstance(response, MetadataResponse)
            self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
            self.cluster_id = response.cluster_id
            self.controller_id = response.controller_id
            if topics is None:
                # In place, key by key: producer threads read ``topics`` without a lock
                # (``Accumulator.add``), and must never see it empty meanwhile.
                listed = {t.name for t in response.topics if not t.error_code}
                for name in [name for name in self.topics if name not in listed]:
                    self.topics.pop(name, None)
            for topic in response.topics:
                if topic.error_code:
                    self.topics.pop(topic.name, None)
                    continue
                self.value_subjects[topic.name] = topic.value_subject
                self.topics[topic.name] = {
                    p.partition: PartitionInfo(topic.name, p.partition, p.leader, p.leader_epoch,
                                               tuple(p.replicas), tuple(p.isr))
                    for p in topic.partitions
                }
            return response

    async def _refresh_together(self, topic: str) -> MetadataResponse:
        """Refresh ``topic`` in one Metadata request with every other topic asked for
        meanwhile: a producer that starts writing to 100 topics at once makes one round
        trip, not 100."""
        self._wanted.add(topic)
        if self._gathering is None:
            gathering = self._gathering = asyncio.get_running_loop().create_future()
            try:
                await asyncio.sleep(0)  # let the other callers of this moment join
                async with self._refresh_lock:  # a refresh in flight: more join meanwhile
                    pass
                wanted, self._wanted, self._gathering = sorted(self._wanted), set(), None
                response = await self.refresh(wanted)
            except BaseException as err:
                if self._gathering is gathering:
                    self._gathering = None
                if not gathering.done():
                    gathering.set_exception(err if isinstance(err, Exception)
                                            else NetworkError("metadata refresh cancelled"))
                    gathering.exception()  # retrieved: no "never retrieved" warning
                raise
            gathering.set_result(response)
            return response
        return await asyncio.shield(self._gathering)

    async def partitions_for(self, topic: str, *, refresh: bool = False
                             ) -> dict[int, PartitionInfo]:
        if refresh or topic not in self.topics:
            response = await self._refresh_together(topic)
            for t in response.topics:
                if t.name == topic and t.error_code == TopicAuthorizationFailedError.code:
                    raise TopicAuthorizationFailedError(
                        f"this client's principal may not describe topic {topic!r}; an "
                        "administrator can allow it with `strata acl add --allow-principal "
                        f"User:<name> --operation DESCRIBE --topic {topic}` (WRITE or READ "
                        "imply DESCRIBE)")
                if t.name == topic and t.error_code:
                    raise_for_code(t.error_code, f"topic {topic!r} does not exist; create it "
                                   f"with `strata topic create {topic}`")
        found = self.topics.get(topic)
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return found

    async def leader_for(self, topic: str, partition: int) -> int:
        partitions = await self.partitions_for(topic)
        info = partitions.get(partition)
        if info is None:
            raise UnknownTopicOrPartitionError(
                f"{topic} has partitions 0..{len(partitions) - 1}; {partition} does not exist")
        if info.leader < 0:
            partitions = await self.partitions_for(topic, refresh=True)
            info = partitions[partition]
            if info.leader < 0:
                raise NetworkError(f"{topic}-{partition} has no live leader right now")
        return info.leader

    async def backoff(self, attempt: int) -> None:
        await asyncio.sleep(min(self.retry_backoff_ms * (2 ** min(attempt, 6)), 2000) / 1000)

    async def close(self) -> None:
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            with contextlib.suppress(StrataError):
                await connection.close()
