"""One Strata broker process: ZooKeeper session, hosted partitions, server, metrics.

Start-up order: take the data-directory lock (two brokers can never share a log
directory); bind the listen and metrics ports (a taken port fails before anything is
registered); connect to ZooKeeper and read the cluster id, which must match the one
recorded in the data dir (``meta.json``); load every topic this broker hosts a replica
of (all partition states in a few multi-reads, the logs opened and if needed recovered
on a thread pool; a partition that cannot be opened stays offline alone, and a broker
whose open-file limit cannot hold its logs refuses to start); register the ephemeral
``/strata/brokers/ids/<id>`` (a second broker with the same id fails here, before it
could acknowledge anything); then start serving. Topic creation, deletion and config
changes reach every broker through ZooKeeper watches; after a lost session the broker
registers again.

Shutdown (SIGTERM or ``stop()``): first a controlled shutdown (the controller moves
every leadership another in-sync replica can take, and takes this broker out of every
ISR; bounded by ``controlled.shutdown.timeout.ms``), then stop accepting connections,
let in-flight requests finish (up to ``shutdown.timeout.ms``), close every log (flush,
producer-state snapshot, clean-shutdown marker; several at once), then close the
ZooKeeper session (the registration vanishes). For the length of the shutdown the data
dir holds ``shutting-down`` with this process's pid, so that ``strata up`` can tell a
broker on its way out from a hung one (:data:`SHUTTING_DOWN_FILE`).

Partition states reach the broker through change notifications
(:class:`~brokers.coordination.PartitionStateWatcher`) in batches, applied on the event
loop with one log line per batch that changes what this broker leads.

The broker decides which replicas it hosts and what state each is in; the parts it
wires together do the rest: the log manager (``brokers/log_manager.py``) opens, closes
and looks after the logs, the replica manager (``brokers/replica_manager.py``) is the
leaders' side and the fetcher manager (``brokers/replication.py``) the followers', and
the request handlers (``brokers/handlers/``) answer the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Collection, Iterable, Iterator
from typing import Any, Final

from brokers.acl import AclCache
from brokers.config import BrokerConfig
from brokers.controller import Controller
from brokers.coordination import (
    BrokerRegistration,
    PartitionKey,
    PartitionState,
    PartitionStateWatcher,
    TopicDefinition,
    ZooKeeperClient,
)
from brokers.group_coordinator import GroupCoordinator
from brokers.handlers import RequestHandlers
from brokers.heap import HeapKeeper
from brokers.kafka.apis import KafkaApis
from brokers.kafka.listener import KafkaCodec
from brokers.log import LogConfig
from brokers.log_manager import LogManager, raise_open_file_limit
from brokers.metrics import (
    BrokerMetrics,
    FetchCacheCollector,
    HealthStats,
    PartitionStats,
    TierStats,
)
from brokers.network import ConnectionHandler, StrataCodec
from brokers.partition import Partition
from brokers.quotas import QuotaManager
from brokers.replica_manager import ReplicaManager
from brokers.replication import ReplicaFetcherManager
from brokers.schema_registry import SchemaRegistry
from brokers.security import (
    CredentialCache,
    Listener,
    SaslAuthenticator,
    Session,
    check_mechanisms,
    server_ssl_context,
)
from brokers.services import MetadataCache, PartitionRegistry
from brokers.transaction_coordinator import TransactionCoordinator
from wire.errors import (
    ClusterIdMismatchError,
    DataDirLockedError,
    PortInUseBrokerError,
    StrataError,
)

__all__ = ["Broker", "run_broker"]

log = logging.getLogger("strata.brokers.broker")

LOCK_FILE: Final = ".lock"
#: Written (holding this process's pid) when a shutdown begins and removed when it ends:
#: it tells ``strata up`` that a broker which no longer answers is on its way out, so it
#: waits for the exit and starts it again instead of failing. A stale file (the process
#: was SIGKILLed while closing) is harmless: its pid is no longer this broker's, and the
#: next start removes it.
SHUTTING_DOWN_FILE: Final = "shutting-down"


META_FILE: Final = "meta.json"
#: Period of the event-loop lag probe (``Broker._watch_event_loop``).
_LAG_PROBE_S: Final = 0.1


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.data_dir = config.data_dir
        self.zookeeper = ZooKeeperClient(
            config.zookeeper_connect, session_timeout_ms=config.zookeeper_session_timeout_ms,
            digest=config.zookeeper_digest())
        # The cluster as this broker last read it, and the replicas it hosts: the parts
        # below get these (brokers/services.py), never the broker itself.
        self.metadata = MetadataCache(config.broker_id)
        self.registry = PartitionRegistry()
        self._state_watcher: PartitionStateWatcher | None = None
        self._shutting_down = False
        self.metrics = BrokerMetrics(self._partition_stats, self._tier_stats,
                                     self._health_stats)
        self.heap = HeapKeeper(self.metrics)
        # Opening, closing, retention, cleaning and flushing of the hosted logs.
        self.log_manager = LogManager(config, self.metadata, self.registry, self.zookeeper,
                                      self.metrics)
        self.port = config.port
        self.listeners = config.parsed_listeners()
        #: Listener name -> (advertised host, port actually bound), once serving.
        self.endpoints: dict[str, tuple[str, int]] = {}
        self._servers: list[asyncio.Server] = []
        self.credentials = CredentialCache()
        self.quotas = QuotaManager()
        self.acls = AclCache(
            super_users=[u.strip() for u in config.super_users.split(";") if u.strip()],
            allow_if_no_acl=config.allow_everyone_if_no_acl_found) \
            if config.authorizer_enable else None
        self.authenticator = SaslAuthenticator(
            self.credentials, check_mechanisms(config.sasl_enabled_mechanisms),
            plain_over_plaintext=config.sasl_plain_allow_plaintext,
            reauth_ms=config.connections_max_reauth_ms)
        self._connections: set[ConnectionHandler] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_lock = asyncio.Lock()
        self._lock_fd = -1
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._producer_ids: Iterator[int] = iter(())
        self._session_lost = False
        # While the ZooKeeper connection is suspended this broker cannot know whether its
        # session (and so its leaderships and lease) still stands: it decides nothing.
        self.zookeeper_suspended = False
        # Suspended long enough that ZooKeeper has expired the session by now (a network
        # partition keeps kazoo in SUSPENDED, never LOST, until it reaches ZooKeeper
        # again): the cluster has moved on, so this broker leads nothing and answers no
        # Metadata (its view is stale: clients ask another broker).
        self.cut_off_from_zookeeper = False
        self._presumed_expiry: asyncio.Task[None] | None = None
        self.started = False
        parts = (config, self.metadata, self.registry, self.zookeeper)
        # The leader side of the replicas hosted here, and the followers' fetchers.
        self.replicas = ReplicaManager(*parts, host=self)
        self.fetchers = ReplicaFetcherManager(config, self.metadata, self.registry, host=self)
        self.controller = Controller(config, self.metadata, self.zookeeper, host=self)
        self.groups = GroupCoordinator(*parts, host=self,
                                       metrics_registry=self.metrics.registry)
        self.schemas = SchemaRegistry(*parts, host=self)
        # Markers this broker writes as a coordinator to partitions it leads go through
        # the handlers' path too (the group coordinator sees its offsets' markers).
        self.transactions = TransactionCoordinator(
            *parts, host=self, next_producer_id=self.next_producer_id,
            local_markers=lambda request: self.handlers.transactions.write_txn_markers(
                request))
        self.handlers = RequestHandlers(*parts, controller=self.controller,
                                        replicas=self.replicas, groups=self.groups, host=self,
                                        authenticator=self.authenticator, acls=self.acls,
                                        quotas=self.quotas, schemas=self.schemas,
                                        transactions=self.transactions)
        self._strata_codec = StrataCodec(self.handlers.dispatch)
        # Kafka's protocol on the kafka.listeners: the same handlers underneath.
        self.kafka = KafkaCodec(KafkaApis(
            self.handlers, max_record_bytes=config.socket_request_max_bytes,
            fetch_cache_bytes=config.kafka_fetch_cache_bytes))
        cache = self.kafka.apis.converted
        self.metrics.registry.register(
            FetchCacheCollector(
                lambda: (cache.hits, cache.misses, cache.kept, cache.ahead,
                         cache.bytes)))

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            # Bind every port first: a port in use fails before anything is registered.
            for listener in self.listeners:
                await self._listen(listener)
            self.metrics.serve(self.config.host, self.config.metrics_port)
        except OSError as err:
            raise PortInUseBrokerError(
                f"cannot listen on {', '.join(f'{x.host}:{x.port}' for x in self.listeners)} "
                f"or metrics port {self.config.metrics_port}: {err.strerror}; stop the process "
                "using it or choose other ports (listeners or port / metrics.port)") from None
        inter = self.config.inter_broker_listener()
        self.port = self.endpoints[inter.name][1]
        raise_open_file_limit()
        await asyncio.to_thread(self.zookeeper.start)
        self.zookeeper.add_state_listener(self._threadsafe_state)
        self._state_watcher = self.zookeeper.state_watcher(self._threadsafe_watched_states)
        self.metadata.cluster_id = await asyncio.to_thread(self.zookeeper.cluster_id)
        self._check_cluster_id()
        # Load every hosted log first (the controller must not see this broker alive,
        # and elect it, before it can serve), then register before serving anything: a
        # second broker with this id fails there, before it could acknowledge a write.
        # A previous session's registration (after a crash) expires meanwhile.
        await self.sync_topics(await asyncio.to_thread(self.zookeeper.list_topics))
        await self._register()
        self.zookeeper.watch_topics(self.threadsafe(self._on_topics_changed))
        self.zookeeper.watch_brokers(self.threadsafe(self._on_brokers_changed))
        self.zookeeper.watch_shutting_down(self.threadsafe(self._on_shutting_down))
        await self.refresh_brokers()  # our own registration is in the list from now on
        await self._load_credentials()
        self.zookeeper.watch_users(self.threadsafe(self._on_users_changed))
        await self._on_quotas_changed(None)
        self.zookeeper.watch_client_quotas(self.threadsafe(self._on_quotas_changed))
        if self.acls is not None:
            await self._on_acls_changed(None)
            self.zookeeper.watch_acls(self.threadsafe(self._on_acls_changed))
        for server in self._servers:
            await server.start_serving()
        self.replicas.start()
        self.controller.start()
        self.groups.start()
        self.transactions.start()
        self.log_manager.start()
        self._tasks.append(asyncio.create_task(self._watch_event_loop()))
        self.heap.start()
        self.started = True
        await self._await_returning_leaderships()
        log.info("broker %d serving %s (metrics on %d)", self.broker_id,
                 ", ".join(f"{name}://{host}:{port}"
                           for name, (host, port) in self.endpoints.items()),
                 self.metrics.port)

    async def _await_returning_leaderships(self) -> None:
        """Partitions that waited for this broker (leaderless, and it in their last ISR:
        it was their only in-sync replica when it stopped) are given back to it by the
        controller once it has registered. Wait for that, at most a ZooKeeper session
        timeout, so that a broker that says it is ready also leads them again."""
        deadline = time.monotonic() + self.config.zookeeper_session_timeout_ms / 1000
        while True:
            waiting = [key for key, state in self.metadata.partition_states.items()
                       if state.leader < 0 and self.broker_id in state.isr
                       and key in self.registry.hosted]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                log.warning("%d partition(s) that wait for this broker (e.g. %s-%d) have no "
                            "leader yet; is a controller running? (`strata cluster "
                            "describe`)", len(waiting), *waiting[0])
                return
            await asyncio.sleep(0.05)

    async def _register(self) -> None:
        inter = self.config.inter_broker_listener()
        host, port = self.endpoints[inter.name]
        registration = BrokerRegistration(
            self.broker_id, host, port, time.time_ns() // 1_000_000,
            tuple((name, h, p) for name, (h, p) in self.endpoints.items()))
        await asyncio.to_thread(self.zookeeper.register_broker, registration)

    def _check_cluster_id(self) -> None:
        """A data dir belongs to one cluster: never serve (or delete) another's data."""
        meta = self.data_dir / META_FILE
        try:
            recorded = json.loads(meta.read_text())
        except FileNotFoundError:
            meta.write_text(json.dumps({"version": 1, "cluster_id": self.metadata.cluster_id,
                                        "broker_id": self.broker_id}))
            return
        except ValueError:
            raise ClusterIdMismatchError(
                f"{meta} is unreadable; check the data dir (log.dirs) and remove the file "
                "only if it really belongs to this cluster") from None
        if recorded.get("cluster_id") != self.metadata.cluster_id:
            raise ClusterIdMismatchError(
                f"data dir {self.data_dir} belongs to cluster {recorded.get('cluster_id')}, "
                f"but ZooKeeper at {self.config.zookeeper_connect} holds cluster "
                f"{self.metadata.cluster_id}; point zookeeper.connect at the right ensemble or use "
                "another log.dirs")
        if recorded.get("broker_id") != self.broker_id:
            raise ClusterIdMismatchError(
                f"data dir {self.data_dir} belongs to broker {recorded.get('broker_id')}, "
                f"not {self.broker_id}; give each broker its own log.dirs")

    def _threadsafe_state(self, state: str) -> None:
        loop = self._loop
        if loop is not None and not self._stopped.is_set():
            loop.call_soon_threadsafe(lambda: loop.create_task(self._on_session_state(state)))

    async def _on_session_state(self, state: str) -> None:
        if state == "SUSPENDED":
            self.zookeeper_suspended = True
            if self._presumed_expiry is None or self._presumed_expiry.done():
                self._presumed_expiry = asyncio.create_task(self._presume_expiry())
        elif state == "LOST":
            # Our ephemeral registration is gone; ZooKeeper no longer vouches for us. The
            # controller has (or will have) moved our leaderships: stop acting as leader
            # until the state is read again, so nothing more is acknowledged here.
            self._session_lost = True
            self.zookeeper_suspended = True
            self.cut_off_from_zookeeper = True
            self.controller.resign()
            for partition in self.registry.hosted.values():
                partition.fenced = True
                partition.wake_waiters()
            log.error("ZooKeeper session lost: broker %d is unregistered and leads nothing "
                      "until it reconnects", self.broker_id)
        elif state == "CONNECTED":
            self.zookeeper_suspended = False
            if self._presumed_expiry is not None:
                self._presumed_expiry.cancel()
                self._presumed_expiry = None
            if not self._session_lost:
                if self.cut_off_from_zookeeper:
                    # The session outlived the silence after all: nothing changed behind
                    # this broker's back (ZooKeeper delivers the watches it missed).
                    self.cut_off_from_zookeeper = False
                    for partition in self.registry.hosted.values():
                        partition.fenced = False
                    log.warning("broker %d reached ZooKeeper again within its session; "
                                "leading again", self.broker_id)
                await self.controller.session_restored()  # decisions skipped meanwhile
                return
            self._session_lost = False
            await self._rejoin()

    async def _presume_expiry(self) -> None:
        """Fence every leadership once ZooKeeper has been out of reach for as long as it
        takes it to expire the session: kazoo suspends after two thirds of the session
        timeout without an answer, ZooKeeper expires the session at the full timeout, so
        a third of it after the suspension the controller may already have moved this
        broker's leaderships. A zombie leader that its clients can still reach must not
        keep them writing (and asking for metadata) here."""
        await asyncio.sleep(self.config.zookeeper_session_timeout_ms / 3000)
        if not self.zookeeper_suspended or self._stopped.is_set():
            return
        self.cut_off_from_zookeeper = True
        for partition in self.registry.hosted.values():
            partition.fenced = True
            partition.wake_waiters()
        log.error("broker %d has not reached ZooKeeper for as long as its session lasts: "
                  "presumed expired, it leads nothing and answers no Metadata until it "
                  "reaches ZooKeeper again", self.broker_id)

    async def _rejoin(self) -> None:
        """Register again after a lost session, re-read everything; retried until it
        works (or the session is lost again, which starts a new attempt on reconnect)."""
        delay = 0.5
        while not self._stopped.is_set() and not self._session_lost:
            try:
                await self._register()
                await self.sync_topics()
                await self.refresh_brokers()
                await self._reload_partition_states()
                await self.controller.session_restored()
                self.cut_off_from_zookeeper = False
                log.info("broker %d registered again after a lost session", self.broker_id)
                return
            except Exception as err:
                log.error("re-registration after a lost session failed: %r; retrying in "
                          "%.1f s", err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _reload_partition_states(self) -> None:
        """Read every hosted partition's state again (after a lost session)."""
        states = await asyncio.to_thread(self.zookeeper.read_partition_states,
                                         list(self.registry.hosted))
        for (name, p), state in states.items():
            self.apply_partition_state(name, p, state, force=True, quiet=True)

    async def stop(self) -> None:
        if self._stopped.is_set() or self._shutting_down:
            return
        self._shutting_down = True
        self._mark_shutting_down(True)
        # (step, seconds[, how the time split]): logged at the end
        steps: list[tuple[str, float] | tuple[str, float, str]] = []
        clock = time.monotonic()

        def step(name: str) -> None:
            nonlocal clock
            now = time.monotonic()
            steps.append((name, now - clock))
            clock = now

        try:
            # Bounded as a whole: a ZooKeeper call that hangs must not hold the stop up.
            await asyncio.wait_for(self._controlled_shutdown(),
                                   self.config.controlled_shutdown_timeout_ms / 1000 + 1)
        except Exception as err:  # never let it keep the broker from stopping
            log.warning("controlled shutdown failed: %r; stopping without it", err)
        step("controlled shutdown")
        self._stopped.set()
        for server in self._servers:
            server.close()
        self.log_manager.stop()
        for task in self._tasks:
            task.cancel()
        self.heap.stop()
        await self.groups.stop()
        await self.transactions.stop()
        step("coordinators")
        for connection in list(self._connections):
            connection.stop_reading()
        for partition in self.registry.hosted.values():
            partition.wake_waiters()  # parked long polls answer now instead of at timeout
        await self.replicas.stop()
        await self.fetchers.stop()
        step("replication")
        await self._drain_connections()
        step("connections")
        # A topic sync running since before the SIGTERM must finish first: one that went
        # on after the partitions were closed would find their directories unhosted and
        # set them aside as strays (it re-checks ``stopping`` after every await, too).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sync_lock.acquire(),
                                   self.config.shutdown_timeout_ms / 1000)
        step("topic sync")
        closing = len(self.registry.hosted)
        phases = await self.log_manager.close_logs(list(self.registry.hosted.values()))
        self.registry.hosted.clear()
        step(f"{closing} logs")
        if phases:
            steps[-1] = (f"{closing} logs", steps[-1][1], phases)
        if self._state_watcher is not None:
            self._state_watcher.close()
        self.metrics.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.zookeeper.stop)
        step("ZooKeeper session")
        self._mark_shutting_down(False)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self.started:
            log.info("broker %d stopped cleanly in %.1f s (%s)", self.broker_id,
                     sum(entry[1] for entry in steps),
                     ", ".join(f"{entry[0]} {entry[1]:.2f} s"
                               + (f" ({entry[2]})" if len(entry) > 2 else "")
                               for entry in steps))

    async def _controlled_shutdown(self) -> None:
        """Hand every leadership another in-sync replica can take over to it, and leave
        every ISR, before closing anything (Kafka's controlled shutdown).

        The request is an ephemeral znode the controller watches; this broker keeps
        serving meanwhile (requests for partitions that moved answer NOT_LEADER, and
        clients retry at the new leader) and watches the states it gets back. Bounded
        by ``controlled.shutdown.timeout.ms``; then it stops anyway and says so.
        Partitions no other live replica is in sync for cannot move and are not waited
        for: they are unavailable until this broker is back, as without a controlled
        shutdown.
        """
        if not self.started or not self.config.controlled_shutdown_enable \
                or self._session_lost:
            return
        if self.zookeeper_suspended:
            log.warning("controlled shutdown of broker %d skipped: ZooKeeper is unreachable, "
                        "so no controller can move its leaderships", self.broker_id)
            return
        started = time.monotonic()
        deadline = started + self.config.controlled_shutdown_timeout_ms / 1000
        await asyncio.to_thread(self.zookeeper.request_controlled_shutdown, self.broker_id)
        log.info("controlled shutdown of broker %d: asking the controller to move its "
                 "leaderships", self.broker_id)
        led_at_start = sum(1 for part in self.registry.hosted.values() if part.is_leader)
        waiting: list[PartitionKey] = []
        while True:
            live, leaving = await asyncio.to_thread(
                lambda: (self.zookeeper.live_broker_ids(),
                         self.zookeeper.shutting_down_brokers()))
            waiting = self._holding_up_shutdown(live, leaving)
            if not waiting or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        stuck = sum(1 for part in self.registry.hosted.values() if part.is_leader)
        if waiting:
            log.warning("controlled shutdown of broker %d did not finish within "
                        "controlled.shutdown.timeout.ms=%d: %d partition(s) still lead or "
                        "list it in their ISR (e.g. %s); stopping anyway, clients of those "
                        "partitions wait for a new leader", self.broker_id,
                        self.config.controlled_shutdown_timeout_ms, len(waiting),
                        ", ".join(f"{t}-{p}" for t, p in waiting[:5]))
        else:
            log.info("controlled shutdown of broker %d: %d leadership(s) moved in %.2f s; "
                     "%d partition(s) have no other in-sync replica and stay here until "
                     "it stops", self.broker_id, led_at_start - stuck,
                     time.monotonic() - started, stuck)

    def _holding_up_shutdown(self, live: set[int], leaving: set[int]) -> list[PartitionKey]:
        """Partitions a controlled shutdown still waits for: led here although another
        live in-sync replica could lead, or listing this broker in the ISR of a leader
        that stays."""
        me = self.broker_id

        def holds_up(state: PartitionState) -> bool:
            if state.leader == me:
                return any(b != me and b in live and b not in leaving for b in state.isr)
            return me in state.isr and state.leader in live and state.leader not in leaving

        return [key for key, state in self.metadata.partition_states.items() if holds_up(state)]

    @property
    def stopping(self) -> bool:
        return self._stopped.is_set()

    async def _drain_connections(self) -> None:
        in_flight = [t for c in self._connections for t in c.in_flight]
        if in_flight:
            await asyncio.wait(in_flight, timeout=self.config.shutdown_timeout_ms / 1000)
        for connection in list(self._connections):
            connection.close()

    def _mark_shutting_down(self, on: bool) -> None:
        """Write or remove :data:`SHUTTING_DOWN_FILE`; only while this process holds the
        data-dir lock (it must never touch another broker's directory)."""
        if self._lock_fd < 0:
            return
        path = self.data_dir / SHUTTING_DOWN_FILE
        with contextlib.suppress(OSError):
            if on:
                # Whole or absent, never empty: `strata up` reading an empty file (created,
                # not yet written) took the broker for a hung one and waited 300 s for it.
                tmp = path.with_name(SHUTTING_DOWN_FILE + ".tmp")
                tmp.write_text(f"{os.getpid()}\n")
                os.replace(tmp, path)
            else:
                path.unlink(missing_ok=True)

    def _lock_data_dir(self) -> None:
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLockedError(
                f"data directory {self.data_dir} is in use by another broker process; stop "
                "it or give this broker its own log.dirs") from None
        self._lock_fd = fd
        self._mark_shutting_down(False)  # left by a process killed while it closed

    # ------------------------------------------------------------------ connections
    async def _listen(self, listener: Listener) -> None:
        context = None
        if listener.uses_tls:
            context = server_ssl_context(self.config.ssl_certfile, self.config.ssl_keyfile,
                                         self.config.ssl_cafile, self.config.ssl_client_auth)

        async def on_connection(reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
            await self._on_connection(listener, reader, writer)

        server = await asyncio.start_server(
            on_connection, listener.host, listener.port, limit=1 << 20, ssl=context,
            ssl_handshake_timeout=self.config.sasl_authentication_timeout_ms / 1000
            if context is not None else None, start_serving=False)
        self._servers.append(server)
        bound = server.sockets[0].getsockname()[1]
        self.endpoints[listener.name] = (listener.advertised_host,
                                         listener.advertised_port or bound)

    async def _on_connection(self, listener: Listener, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        session = Session.open(listener, f"{peer[0]}:{peer[1]}" if peer else "?",
                               writer.get_extra_info("ssl_object"))
        handler = ConnectionHandler(reader, writer,
                                    self.kafka if listener.kafka else self._strata_codec,
                                    self.config.socket_request_max_bytes, self.metrics,
                                    self._connections.discard, session=session,
                                    login_timeout_s=self.config.sasl_authentication_timeout_ms
                                    / 1000)
        self._connections.add(handler)
        await handler.serve()

    # ------------------------------------------------------------------ credentials
    async def _load_credentials(self) -> set[str]:
        users = await asyncio.to_thread(self.zookeeper.scram_credentials)
        return self.credentials.replace(users)

    async def _on_quotas_changed(self, _: object) -> None:
        try:
            self.quotas.replace(await asyncio.to_thread(self.zookeeper.client_quotas))
        except StrataError as err:
            log.warning("reading the client quotas failed: %s; the next change retries", err)

    async def _on_acls_changed(self, _: object) -> None:
        assert self.acls is not None
        try:
            self.acls.replace(await asyncio.to_thread(self.zookeeper.acl_bindings))
        except StrataError as err:
            log.warning("reading the ACLs failed: %s; the next change retries", err)

    async def _on_users_changed(self, _: object) -> None:
        """A user was created, changed or deleted: re-read, and end the sessions that
        logged in with a credential that no longer stands."""
        try:
            changed = await self._load_credentials()
        except StrataError as err:
            log.warning("reading SCRAM credentials failed: %s; the next change retries", err)
            return
        if not changed:
            return
        for connection in list(self._connections):
            session = connection.session
            if session.login is not None and not self.authenticator.still_valid(session):
                log.info("closing %s's connection from %s: the credential it logged in with "
                         "was changed or deleted", session.principal, session.peer)
                connection.close()

    # ------------------------------------------------------------------ ZooKeeper watches
    def threadsafe(self, callback: Any) -> Any:
        """Wrap a coroutine function so kazoo's thread can trigger it on our loop."""
        loop = self._loop
        assert loop is not None

        def fire(value: Any) -> None:
            if not self._stopped.is_set():
                loop.call_soon_threadsafe(lambda: loop.create_task(callback(value)))

        return fire

    async def _on_topics_changed(self, names: list[str]) -> None:
        await self.sync_topics(names)

    async def _on_brokers_changed(self, ids: list[int]) -> None:
        await self.refresh_brokers()
        await self.controller.elect_leaders()

    async def refresh_brokers(self) -> None:
        brokers = await asyncio.to_thread(self.zookeeper.live_brokers)
        before = self.metadata.live_brokers
        self.metadata.live_brokers = {b.broker_id: b for b in brokers}
        for broker_id, registration in self.metadata.live_brokers.items():
            old = before.get(broker_id)
            if old is not None and old != registration:
                self.fetchers.leader_moved(broker_id)  # restarted: connect again

    async def sync_topics(self, names: list[str] | None = None) -> None:
        """Bring hosted partitions in line with ZooKeeper's topic list."""
        async with self._sync_lock:
            if self._stopped.is_set():
                return
            if names is None:
                names = await asyncio.to_thread(self.zookeeper.list_topics)
            definitions = await asyncio.to_thread(self.zookeeper.read_topics, names)
            if self._stopped.is_set():
                return
            new: list[TopicDefinition] = []
            replaced = False
            for name, definition in sorted(definitions.items()):
                current = self.metadata.topics.get(name)
                if current is not None and current.topic_id != definition.topic_id:
                    self._drop_topic(name)  # deleted and re-created under the same name
                    current = None
                    replaced = True
                if current is None:
                    new.append(definition)
            if new:
                await self._load_topics(new)
            if self._stopped.is_set():
                return
            gone = [name for name in self.metadata.topics if name not in definitions]
            for name in gone:
                self._drop_topic(name)
            # Stray directories appear only for topics deleted while this broker was down
            # (found at start-up) or re-created under the same name (dropped above):
            # scanning ten thousand directories at every new topic is not needed.
            if gone or replaced or not self.started:
                self.log_manager.remove_stray_dirs()
            if new or gone or replaced:
                # Millions of long-lived objects came (or went): see brokers/heap.py.
                self.heap.settle_soon(collect=bool(gone or replaced))

    async def _watch_event_loop(self) -> None:
        """Event-loop lag: how late a timer fires is how long a request that arrived
        then waited behind other work (``strata_event_loop_lag_seconds``)."""
        while True:
            due = time.perf_counter() + _LAG_PROBE_S
            await asyncio.sleep(_LAG_PROBE_S)
            self.metrics.event_loop_lag.observe(max(0.0, time.perf_counter() - due))

    async def _load_topics(self, topics: list[TopicDefinition]) -> None:
        """Start hosting ``topics``: their configs and partition states in one pipelined
        read each (which also arms the state watches), then every hosted log opened on a
        small thread pool. Ten thousand partitions must not mean ten thousand round
        trips or ten thousand log opens one after the other."""
        assert self._state_watcher is not None
        names = [topic.name for topic in topics]
        overrides = await asyncio.to_thread(self.zookeeper.read_topic_configs, names)
        keys = [(topic.name, p) for topic in topics for p in topic.assignment]
        states = await asyncio.to_thread(self._state_watcher.follow, keys)
        if self._stopped.is_set():
            return  # the partitions are being closed: opening more would leak them
        hosted: list[tuple[TopicDefinition, int, LogConfig]] = []
        for topic in topics:
            self.metadata.topics[topic.name] = topic
            self.metadata.topic_overrides[topic.name] = overrides.get(topic.name, {})
            config = self.log_config_for(topic.name)
            for p, replicas in topic.assignment.items():
                state = states.get((topic.name, p))
                if state is None:
                    continue  # deleted meanwhile: the topic watch drops it
                self.metadata.partition_states[(topic.name, p)] = state
                if self.broker_id in replicas:
                    hosted.append((topic, p, config))
        too_many = self.log_manager.open_file_limit_problem(len(hosted))
        if too_many is not None:
            if not self.started:
                raise too_many  # refuse to start rather than fail on some logs later
            log.error("%s", too_many)
            opened: list[Partition | StrataError] = [too_many] * len(hosted)
        else:
            opened = await self.log_manager.open_logs(hosted)
        for (topic, p, _), partition in zip(hosted, opened, strict=True):
            if isinstance(partition, Partition):
                self._install_replica(topic, p, partition,
                                      self.metadata.partition_states[(topic.name, p)])
            else:
                self.registry.offline[(topic.name, p)] = partition
        for topic in topics:
            self.zookeeper.watch_topic_configs(topic.name, self.threadsafe(
                lambda configs, name=topic.name: self.on_configs_changed(name, configs)))
            self.zookeeper.watch_topic(topic.name, self.threadsafe(self._on_topic_changed))
        log.info("loaded %d topic(s) (%d partitions, %d replicas here; logs: %s): %s",
                 len(topics), len(keys), len(hosted), self.log_manager.last_open_timing or "-",
                 ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))

    def _open_replica(self, topic: TopicDefinition, p: int, config: LogConfig,
                      state: PartitionState) -> None:
        partition = self.log_manager.open_log(topic, p, config)
        if isinstance(partition, Partition):
            self._install_replica(topic, p, partition, state)
        else:
            self.registry.offline[(topic.name, p)] = partition

    def _install_replica(self, topic: TopicDefinition, p: int, partition: Partition,
                         state: PartitionState) -> None:
        partition.set_state(state.leader, state.leader_epoch, state.isr,
                            topic.assignment[p], state.zk_version)
        self.registry.hosted[(topic.name, p)] = partition
        self.fetchers.apply((topic.name, p), partition, True)

    async def _on_topic_changed(self, definition: TopicDefinition | None) -> None:
        """A topic's replica assignment changed (a reassignment step of the controller):
        open the replicas this broker gained, delete the ones it lost."""
        if definition is None:
            return  # deletion is handled by the topic-list watch
        async with self._sync_lock:
            current = self.metadata.topics.get(definition.name)
            if self._stopped.is_set() or current is None \
                    or current.topic_id != definition.topic_id \
                    or current.assignment == definition.assignment:
                return
            self.metadata.topics[definition.name] = definition
            config = self.log_config_for(definition.name)
            for p, replicas in definition.assignment.items():
                key = (definition.name, p)
                hosted = key in self.registry.hosted or key in self.registry.offline
                if self.broker_id in replicas and not hosted:
                    state = await asyncio.to_thread(self.zookeeper.partition_state, *key)
                    known = self.metadata.partition_states.get(key)
                    if known is not None and known.zk_version > state.zk_version:
                        state = known  # a watch event brought a newer one meanwhile
                    self.metadata.partition_states[key] = state
                    self._open_replica(definition, p, config, state)
                    log.info("%s-%d: this broker is a new replica; copying the log from "
                             "broker %d", definition.name, p, state.leader)
                elif self.broker_id not in replicas and hosted:
                    self.fetchers.unfollow(key)
                    self.registry.offline.pop(key, None)
                    removed = self.registry.hosted.pop(key, None)
                    if removed is not None:
                        removed.delete()
                    log.info("%s-%d: this broker is no longer a replica; its copy is deleted",
                             definition.name, p)
                elif key in self.registry.hosted:
                    known = self.metadata.partition_states.get(key)
                    if known is not None:
                        self.apply_partition_state(definition.name, p, known, force=True)

    async def on_configs_changed(self, name: str, overrides: dict[str, str] | None) -> None:
        if overrides is None or name not in self.metadata.topics:
            return
        self.metadata.topic_overrides[name] = overrides
        config = self.log_config_for(name)
        for (topic, _), partition in self.registry.hosted.items():
            if topic == name:
                partition.set_config(config)

    def _threadsafe_watched_states(self) -> None:
        """The state watcher has new states (kazoo's thread): apply them on the loop."""
        loop = self._loop
        if loop is not None and not self._stopped.is_set():
            loop.call_soon_threadsafe(self._apply_watched_states)

    def _apply_watched_states(self) -> None:
        """Apply every partition state the watcher delivered since the last call: a
        controller's batch of thousands arrives as a few such calls, each one log line."""
        if self._state_watcher is None or self._stopped.is_set():
            return
        batch = self._state_watcher.take()
        applied = gained = lost = 0
        for (name, p), state in batch:
            partition = self.registry.hosted.get((name, p))
            was_leader = partition is not None and partition.is_leader
            if state is not None and self.apply_partition_state(name, p, state, quiet=True):
                applied += 1
                is_leader = partition is not None and partition.is_leader
                gained += is_leader and not was_leader
                lost += was_leader and not is_leader
        if gained or lost:  # ISR-only changes are routine: not worth a line each
            led = sum(1 for part in self.registry.hosted.values() if part.is_leader)
            log.info("applied %d partition state change(s); leading %d partitions (%d "
                     "gained, %d given up)", applied, led, gained, lost)

    async def _on_shutting_down(self, ids: set[int]) -> None:
        self.metadata.shutting_down = ids
        await self.controller.elect_leaders()

    def high_watermark_entries(self, partitions: Iterable[Partition],
                               keep: Collection[PartitionKey]) -> dict[PartitionKey, int]:
        return self.log_manager.high_watermark_entries(partitions, keep)

    def write_high_watermarks(self, entries: dict[PartitionKey, int]) -> None:
        self.log_manager.write_high_watermarks(entries)

    def apply_partition_state(self, name: str, p: int, state: PartitionState, *,
                              force: bool = False, quiet: bool = False) -> bool:
        """Make ``state`` (read from ZooKeeper) this broker's view of the partition.

        Older states (a lower epoch or znode version than the one applied) are ignored:
        watch events and this broker's own ISR writes may arrive in any order. Returns
        whether the state was applied. ``quiet``: log at DEBUG (the caller logs a
        summary for a whole batch).
        """
        topic = self.metadata.topics.get(name)
        if topic is None or p not in topic.assignment:
            return False
        current = self.metadata.partition_states.get((name, p))
        if current is not None and not force and (
                state.leader_epoch < current.leader_epoch
                or (state.zk_version >= 0 and state.zk_version < current.zk_version)
                or (state.zk_version == current.zk_version and state == current)):
            return False
        self.metadata.partition_states[(name, p)] = state
        if current is not None and state.leader == self.broker_id \
                and current.leader == self.broker_id \
                and state.leader_epoch == current.leader_epoch:
            if set(state.isr) < set(current.isr):
                self.metrics.isr_shrinks.inc()
            elif set(state.isr) > set(current.isr):
                self.metrics.isr_expands.inc()
        partition = self.registry.hosted.get((name, p))
        if partition is not None:
            try:
                changed = partition.set_state(state.leader, state.leader_epoch, state.isr,
                                              topic.assignment[p], state.zk_version)
                self.fetchers.apply((name, p), partition, changed)
            except StrataError as err:
                log.error("applying the new state of %s-%d failed: %s", name, p, err)
            partition.wake_waiters()
        log.log(logging.DEBUG if quiet else logging.INFO, "%s-%d: leader %d, epoch %d, isr %s",
                name, p, state.leader, state.leader_epoch, state.isr)
        return True

    def _drop_topic(self, name: str) -> None:
        self.metadata.topics.pop(name, None)
        self.metadata.topic_overrides.pop(name, None)
        for key in [k for k in self.registry.offline if k[0] == name]:
            del self.registry.offline[key]
        dropped = [k for k in self.metadata.partition_states if k[0] == name]
        for key in dropped:
            del self.metadata.partition_states[key]
        if self._state_watcher is not None:
            self._state_watcher.forget(dropped)
        for key in [k for k in self.registry.hosted if k[0] == name]:
            self.fetchers.unfollow(key)
            self.registry.hosted.pop(key).delete()
        log.info("dropped topic %s", name)

    def log_config_for(self, topic: str) -> LogConfig:
        return LogConfig.from_mapping(self.metadata.topic_overrides.get(topic, {}),
                                      base=self.config.log_defaults)

    # ------------------------------------------------------------------ producer ids
    async def next_producer_id(self) -> int:
        for pid in self._producer_ids:
            return pid
        block = await asyncio.to_thread(self.zookeeper.allocate_producer_id_block,
                                        self.broker_id, self.config.producer_id_block_size)
        self._producer_ids = iter(block)
        return next(self._producer_ids)

    # ------------------------------------------------------------------ background work
    def _partition_stats(self) -> Iterator[PartitionStats]:
        for (topic, p), partition in list(self.registry.hosted.items()):
            lg = partition.log
            yield topic, p, lg.log_start_offset, lg.log_end_offset, partition.high_watermark, \
                lg.size_bytes

    def _health_stats(self) -> HealthStats:
        led = [(topic, p, len(partition.isr) < len(partition.replicas))
               for (topic, p), partition in list(self.registry.hosted.items())
               if partition.is_leader]
        offline = len(self.registry.offline) + sum(
            1 for partition in list(self.registry.hosted.values()) if partition.log.is_offline)
        return led, offline

    def _tier_stats(self) -> Iterator[TierStats]:
        for (topic, p), (tiered_up_to, lag) in list(self.log_manager.tier_stats.items()):
            yield topic, p, tiered_up_to, lag


async def run_broker(config: BrokerConfig) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code."""
    import signal

    broker = Broker(config)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        await broker.start()
    except StrataError as err:
        log.error("%s", err)
        await broker.stop()
        return 2
    except Exception as err:  # unexpected: log it with its traceback, exit with a code
        log.exception("broker %d failed to start: %s", config.broker_id, err)
        await broker.stop()
        return 2
    print(f"strata broker {config.broker_id} ready on {config.advertised}:{broker.port} "
          f"metrics {broker.metrics.port}", flush=True)
    await stop_requested.wait()
    await broker.stop()
    return 0
