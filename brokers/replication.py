"""Follower replication: the followers' side of the replicas hosted here.

A broker follows a partition when ZooKeeper names another broker its leader. One
:class:`ReplicaFetcher` per leader broker replicates every partition this broker follows
from it, with one long-polling Fetch (``replica_id`` = this broker's id) for all of them,
over the same Fetch path consumers use, and appends the leader's batches unchanged.

Before a partition's first fetch under a new leader or epoch, the follower asks the
leader where its own latest epoch ends (OffsetForLeaderEpoch, KIP-101/KIP-279) and
truncates a divergent tail to that point, never to its high watermark: truncating to
the HW would drop records a new leader had already acknowledged.

:class:`ReplicaFetcherManager` (Kafka's name) owns the fetchers: it starts, moves and
stops following partitions as their states change. The leader side (appends, reads,
the followers' positions and the ISR upkeep they drive) is
:class:`brokers.replica_manager.ReplicaManager`.

The fetcher uses the client's connection class (``wire.connection``): it only
frames requests and matches correlation ids, and a second copy of that code in the
broker would drift.

Thread-safety: everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from wire.errors import (
    FencedLeaderEpochError,
    LogStorageError,
    NotLeaderError,
    OffsetOutOfRangeError,
    StrataError,
    UnknownLeaderEpochError,
    error_for_code,
)
from wire.protocol import (
    ApiKey,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ForgottenTopic,
    OffsetForLeaderEpochPartition,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderEpochTopic,
    group_by_topic,
)

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.partition import Partition
    from brokers.services import MetadataCache, PartitionRegistry, ReplicaHost
    from wire.connection import BrokerConnection as BrokerConnectionType

__all__ = ["ReplicaFetcher", "ReplicaFetcherManager", "truncate_by_epoch"]

log = logging.getLogger("strata.brokers.replication")

PartitionKey = tuple[str, int]

#: Added to the fetch's own wait: how long a follower waits for an answer before it
#: treats the connection as dead.
_REQUEST_MARGIN_S: Final = 10.0


@dataclass(slots=True)
class _Following:
    leader_epoch: int
    needs_truncation: bool = True


def truncate_by_epoch(partition: Partition, leader_epoch: int, leader_end: int) -> bool:
    """Cut the follower's divergent tail given the leader's OffsetForLeaderEpoch answer
    (``leader_epoch``, ``leader_end``) to the follower's latest epoch. True when done;
    False when the follower must ask again with the epoch it has left (KIP-279).
    """
    log_ = partition.log
    done = True
    if log_.latest_epoch < 0:
        offset = log_.log_end_offset  # an empty log has no tail
    elif leader_epoch < 0:
        # The leader knows no epoch at or below ours: only what we know to be committed
        # is safe to keep (Kafka's fallback).
        offset = partition.high_watermark
    else:
        # Cut at the end of the last epoch both logs share. When our epoch there differs
        # from the leader's, a divergent stretch of an older epoch may be left: ask again.
        own_epoch, own_end = log_.end_offset_for_epoch(leader_epoch)
        offset = min(leader_end, own_end)
        done = own_epoch == leader_epoch
    end_before = log_.log_end_offset
    partition.truncate_divergent_tail(offset)
    return done or log_.log_end_offset == end_before  # nothing cut: the logs agree


class ReplicaFetcher:
    """Replicates, from one leader broker, every partition this broker follows there."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, host: ReplicaHost, leader_id: int) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.host = host
        self.leader_id = leader_id
        self.partitions: dict[PartitionKey, _Following] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._connection: BrokerConnectionType | None = None
        # The fetch session at the leader (FetchRequest version 1): its id, the epoch of
        # the next request (0: open a new one) and what the leader holds for each
        # partition, (fetch offset, leader epoch), as this fetcher last told it.
        self._session_id = 0
        self._session_epoch = 0
        self._session_sent: dict[PartitionKey, tuple[int, int]] = {}
        self._dirty: set[PartitionKey] = set()  # partitions to look at next round

    def __repr__(self) -> str:
        return f"ReplicaFetcher(broker {self.broker_id} <- {self.leader_id})"

    def add(self, key: PartitionKey, leader_epoch: int) -> None:
        self.partitions[key] = _Following(leader_epoch)
        self._dirty.add(key)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, key: PartitionKey) -> None:
        if self.partitions.pop(key, None) is not None:
            self._dirty.add(key)  # the session forgets it with the next fetch

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        await self._disconnect()

    async def _disconnect(self) -> None:
        self._session_epoch = 0  # a new connection opens a new session
        if self._connection is not None:
            connection, self._connection = self._connection, None
            with contextlib.suppress(Exception):
                await connection.close()

    def _partition(self, key: PartitionKey) -> Partition | None:
        """The hosted partition if this fetcher should still replicate it."""
        partition = self.registry.hosted.get(key)
        following = self.partitions.get(key)
        if partition is None or following is None or partition.leader_id != self.leader_id \
                or partition.leader_epoch != following.leader_epoch \
                or partition.log.is_offline:
            return None
        return partition

    async def _run(self) -> None:
        base = self.config.replica_fetch_backoff_ms / 1000
        failures = 0
        while not self.host.stopping:
            if not self.partitions:
                await self._disconnect()  # nothing to follow here: free the connection
                self._wake.clear()
                await self._wake.wait()
                continue
            # Doubling up to 1 s: a dead leader stays dead until its session expires.
            backoff = min(base * 2 ** min(failures, 10), max(base, 1.0))
            try:
                connection = await self._connect()
                if connection is None:
                    await asyncio.sleep(backoff)
                    continue
                await self._truncate(connection)
                progressed = await self._fetch(connection)
                failures = 0
                if not progressed:
                    await asyncio.sleep(base)
            except asyncio.CancelledError:
                raise
            except (StrataError, TimeoutError) as err:
                failures += 1
                # The first failure in a row is worth an INFO line; the rest repeat it.
                log.log(logging.INFO if failures == 1 else logging.DEBUG,
                        "%r: %s; retrying in %.0f ms", self, err or "timed out", backoff * 1000)
                await self._disconnect()
                await asyncio.sleep(backoff)
            except Exception:
                failures += 1
                log.exception("%r failed; retrying", self)
                await self._disconnect()
                await asyncio.sleep(backoff)

    async def _connect(self) -> BrokerConnectionType | None:
        if self._connection is not None and self._connection.is_open:
            return self._connection
        await self._disconnect()
        registration = self.cluster.live_brokers.get(self.leader_id)
        if registration is None:
            return None  # the leader is not registered (yet, or any more)
        from wire.connection import BrokerConnection

        connection = BrokerConnection(registration.host, registration.port,
                                      client_id=f"strata-replica-{self.broker_id}",
                                      security=self.config.inter_broker_security())
        await connection.connect(timeout=5.0)
        self._connection = connection
        return connection

    async def _truncate(self, connection: BrokerConnectionType) -> None:
        """OffsetForLeaderEpoch for every partition that just got this leader."""
        # Only partitions looked at this round can have started needing it (a new one,
        # or an answer asking for it): not a scan of every partition each round.
        pending = [key for key in self._dirty
                   if (f := self.partitions.get(key)) is not None and f.needs_truncation]
        asks = group_by_topic(
            (key[0], OffsetForLeaderEpochPartition(key[1], partition.leader_epoch,
                                                   partition.log.latest_epoch))
            for key in pending if (partition := self._partition(key)) is not None)
        if not asks:
            return
        response = await asyncio.wait_for(connection.request(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            OffsetForLeaderEpochRequest([OffsetForLeaderEpochTopic(t, ps)
                                         for t, ps in asks.items()])), _REQUEST_MARGIN_S)
        assert isinstance(response, OffsetForLeaderEpochResponse)
        for topic in response.topics:
            for answer in topic.partitions:
                key = (topic.name, answer.partition)
                partition = self._partition(key)
                if partition is None:
                    continue
                if answer.error_code:
                    log.info("%s: OffsetForLeaderEpoch at broker %d: %s", partition.name,
                             self.leader_id, answer.error_message)
                    continue
                self.partitions[key].needs_truncation = not truncate_by_epoch(
                    partition, answer.leader_epoch, answer.end_offset)
                self._dirty.add(key)  # its log end may have moved: tell the leader

    async def _fetch(self, connection: BrokerConnectionType) -> bool:
        """One fetch for every partition ready to fetch; False when none could.

        In a fetch session only partitions marked as changed (``_dirty``: added,
        removed, appended to, truncated) are looked at: a round costs what changed, not
        the thousands of idle partitions this broker may follow from one leader.
        """
        config = self.config
        wanted: list[tuple[str, FetchPartition]] = []
        full = self._session_epoch == 0
        considered = list(self.partitions) if full else list(self._dirty)
        self._dirty = set()
        # Updated in place, not copied: at ten thousand partitions a copy per round was
        # most of a follower's CPU. Any failure below opens a new session (epoch 0),
        # which starts ``sent`` over, so a round that fails half-way leaves no trace.
        sent: dict[PartitionKey, tuple[int, int]] = {} if full else self._session_sent
        forgotten: list[PartitionKey] = []
        for key in considered:
            following = self.partitions.get(key)
            partition = self._partition(key)
            if partition is None or following is None or following.needs_truncation:
                if sent.pop(key, None) is not None:
                    forgotten.append(key)
                if partition is not None and following is not None:
                    self._dirty.add(key)  # still to truncate: ``_truncate`` asks again
                continue
            offset = partition.log.log_end_offset
            position = (offset, following.leader_epoch)
            if full or sent.get(key) != position:
                sent[key] = position
                # In a session only what the leader does not know yet travels.
                wanted.append((key[0], FetchPartition(
                    key[1], offset, config.replica_fetch_max_bytes, following.leader_epoch)))
        if not sent:
            self._session_sent = {}
            self._session_epoch = 0  # nothing left to follow here
            return False
        request = FetchRequest([FetchTopic(t, ps) for t, ps in group_by_topic(wanted).items()],
                               max_wait_ms=config.replica_fetch_wait_max_ms, min_bytes=1,
                               max_bytes=max(config.replica_fetch_max_bytes, 1 << 20) * 4,
                               replica_id=self.broker_id,
                               session_id=0 if full else self._session_id,
                               session_epoch=self._session_epoch,
                               forgotten_topics=[ForgottenTopic(t, ps) for t, ps
                                                 in group_by_topic(forgotten).items()])
        response = await asyncio.wait_for(
            connection.request(ApiKey.FETCH, request, version=1),
            config.replica_fetch_wait_max_ms / 1000 + _REQUEST_MARGIN_S)
        assert isinstance(response, FetchResponse)
        if response.error_code:
            # The leader lost the session (it restarted) or it went out of step: open
            # a new one with the next request.
            log.debug("%r: fetch session: %s; opening a new one", self,
                      error_for_code(response.error_code).name)
            self._session_epoch = 0
            return True
        self._session_id = response.session_id
        self._session_epoch += 1
        self._session_sent = sent
        # An answer lists only what changed, so an empty one is progress too (the
        # follower must not back off before asking again); one with errors is not (the
        # leader answers those at once, and asking again at once would spin).
        failing = any(a.error_code for t in response.topics for a in t.partitions)
        progressed = not full and not failing
        for topic in response.topics:
            for answer in topic.partitions:
                key = (topic.name, answer.partition)
                self._dirty.add(key)  # whatever happens below, look at it next round
                partition = self._partition(key)
                told = sent.get(key)
                if partition is None or told is None \
                        or partition.log.log_end_offset != told[0]:
                    continue  # the state changed while the fetch was out: drop the answer
                try:
                    progressed |= self._apply(key, partition, answer.error_code,
                                              answer.error_message, answer.records,
                                              answer.high_watermark, answer.log_start_offset,
                                              told[0])
                except LogStorageError as err:
                    log.error("%s is OFFLINE on this follower: %s", partition.name, err)
                    self.registry.offline[key] = err
                    self.remove(key)
                except StrataError as err:
                    # One partition's bad answer must not stop the others: log it and
                    # ask again from the same offset next round.
                    log.error("replicating %s from broker %d failed: %s", partition.name,
                              self.leader_id, err)
        return progressed

    def _apply(self, key: PartitionKey, partition: Partition, error_code: int,
               error_message: str | None, records: object, high_watermark: int,
               log_start_offset: int, fetch_offset: int) -> bool:
        if error_code == 0:
            if records:
                assert isinstance(records, bytes | bytearray | memoryview)
                partition.append_as_follower(records, high_watermark)
                return True
            partition.update_follower_high_watermark(high_watermark)
            return True
        error = error_for_code(error_code)
        if error is OffsetOutOfRangeError:
            if 0 <= fetch_offset < log_start_offset:
                partition.restart_at(log_start_offset)
            elif partition.log.latest_epoch < 0 and 0 <= high_watermark < fetch_offset:
                # Nothing to ask about (no epochs): an empty log that starts past the
                # leader's end starts over there (the answer's upper bound, its LEO).
                partition.truncate_divergent_tail(high_watermark)
            else:
                self.partitions[key].needs_truncation = True
            return True
        if error in (FencedLeaderEpochError, UnknownLeaderEpochError, NotLeaderError):
            log.debug("%s at broker %d: %s", partition.name, self.leader_id, error_message)
            return False  # the state watch brings the newer epoch or the new leader
        log.warning("replicating %s from broker %d: %s", partition.name, self.leader_id,
                    error_message)
        return False


class ReplicaFetcherManager:
    """This broker's followers: one fetcher per leader broker."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, host: ReplicaHost) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.host = host
        self.fetchers: dict[int, ReplicaFetcher] = {}

    async def stop(self) -> None:
        for fetcher in list(self.fetchers.values()):
            await fetcher.stop()
        self.fetchers.clear()

    # ------------------------------------------------------------------ following
    def apply(self, key: PartitionKey, partition: Partition, changed: bool) -> None:
        """Follow, stop following or keep following after a partition-state change."""
        if partition.is_leader or partition.leader_id < 0:
            self.unfollow(key)
            return
        fetcher = self.fetchers.get(partition.leader_id)
        current = fetcher.partitions.get(key) if fetcher is not None else None
        if current is not None and current.leader_epoch == partition.leader_epoch \
                and not changed:
            return
        self.unfollow(key)
        if fetcher is None:
            fetcher = self.fetchers[partition.leader_id] = ReplicaFetcher(
                self.config, self.cluster, self.registry, self.host, partition.leader_id)
        fetcher.add(key, partition.leader_epoch)

    def unfollow(self, key: PartitionKey) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove(key)

    def leader_moved(self, broker_id: int) -> None:
        """A broker re-registered (maybe on a new port): reconnect its fetcher."""
        fetcher = self.fetchers.get(broker_id)
        if fetcher is not None and fetcher._connection is not None:
            asyncio.get_running_loop().create_task(fetcher._disconnect())
