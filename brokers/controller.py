"""The controller: one broker at a time elects partition leaders for the whole cluster.

Election: every eligible broker watches ``/strata/controller``; when it is empty, each
tries ``Coordinator.try_become_controller``, which creates the ephemeral znode and bumps
``/strata/controller_epoch`` in one multi-op. The winner's :class:`ControllerLease` is
the fencing token: every partition-state write it makes is a multi-op that checks the
epoch znode's version, so a deposed controller (paused, partitioned, session lost)
cannot write anything once another has won.

Duties, run on every change of the live broker set, on becoming controller, and on
request (preferred leaders):

* a partition whose leader is not live gets a new leader: the first replica, in
  assignment order, that is alive and in the ISR; the leader epoch is bumped and dead
  brokers leave the ISR. No such replica: with ``unclean.leader.election.enable`` the
  first live replica leads (acknowledged records it lacks are lost; off by default),
  otherwise the partition stays leaderless (leader -1) with its last ISR, so the last
  in-sync replica takes over when it comes back;
* a partition whose leader is live drops dead followers from its ISR (so acks=all does
  not wait ``replica.lag.time.max.ms`` for them);
* preferred-leader election (``/strata/admin/preferred_replica_election``, written by
  any broker on an ElectLeaders request) moves leadership back to the first assigned
  replica where it is alive and in sync;
* reassignment (``/strata/admin/reassign_partitions``) moves replicas in four steps,
  each a fenced conditional write, each safe to repeat after a controller failover:
  (1) the assignment becomes target + leaving replicas, so the new replicas start
  copying the log from the leader; (2) wait until every target replica is in the ISR;
  (3) if the leader is not kept, a target replica in the ISR leads (epoch bumped) and
  leaving replicas leave the ISR; (4) the assignment becomes the target, the leaving
  brokers delete their copies, and the partition's entry is removed.

Every write is conditional on the state version read (``ConcurrentUpdateError``: read
again and decide again) and on the lease (``ControllerMovedError``: stop acting).
Nothing is decided while the ZooKeeper session is suspended.

Thread-safety: the scans run in a worker thread (blocking kazoo calls), one at a time
(an asyncio lock); results are applied by the brokers through their state watches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Final

from brokers.coordination import ControllerLease, PartitionState, TopicDefinition
from brokers.errors import (
    ConcurrentUpdateError,
    ControllerMovedError,
    InvalidConfigError,
    StrataError,
    UnknownTopicOrPartitionError,
)
from brokers.log import LogConfig

if TYPE_CHECKING:
    from brokers.broker import Broker

__all__ = ["Controller", "elect"]

log = logging.getLogger("strata.brokers.controller")

_RETRIES: Final = 5
#: How often the controller looks at reassignments in progress.
_REASSIGN_POLL_S: Final = 0.5
#: How often an active controller scans every partition even without an event: a scan
#: that failed (ZooKeeper trouble) or was skipped (session suspended) is made up for.
_RESCAN_S: Final = 5.0


def elect(state: PartitionState, replicas: Sequence[int], live: Collection[int], *,
          unclean: bool = False, preferred: bool = False) -> PartitionState | None:
    """The partition state the controller should write, or None to leave it.

    Pure, so that the election rules can be tested without a cluster.
    """
    live_isr = [b for b in state.isr if b in live]
    if state.leader >= 0 and state.leader in live:
        if preferred and replicas and replicas[0] != state.leader and replicas[0] in live_isr:
            return PartitionState(replicas[0], state.leader_epoch + 1, live_isr,
                                  zk_version=state.zk_version)
        if live_isr != list(state.isr) and live_isr:
            return PartitionState(state.leader, state.leader_epoch, live_isr,
                                  zk_version=state.zk_version)
        return None
    candidates = [b for b in replicas if b in live_isr]
    if candidates:
        return PartitionState(candidates[0], state.leader_epoch + 1, live_isr,
                              zk_version=state.zk_version)
    if unclean:
        alive = [b for b in replicas if b in live]
        if alive:
            log.warning("unclean leader election: broker %d leads although it was not in the "
                        "ISR %s; acknowledged records it lacks are lost", alive[0], state.isr)
            return PartitionState(alive[0], state.leader_epoch + 1, [alive[0]],
                                  zk_version=state.zk_version)
    if state.leader != -1:
        # Keep the last ISR: its members are the only safe leaders when they return.
        return PartitionState(-1, state.leader_epoch + 1, list(state.isr),
                              zk_version=state.zk_version)
    return None


class Controller:
    """Controller duties of one broker; acts only while it holds the lease."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.lease: ControllerLease | None = None
        self._lock = asyncio.Lock()
        self._reassigning: asyncio.Task[None] | None = None
        self._rescanning: asyncio.Task[None] | None = None
        #: ``(broker id, epoch)`` of the controller as last seen in ZooKeeper.
        self.current: tuple[int, int] | None = None

    @property
    def is_active(self) -> bool:
        return self.lease is not None

    def start(self) -> None:
        self.broker.coordinator.watch_controller(
            self.broker._threadsafe(self._on_controller_changed))
        if not self.broker.config.controller_eligible:
            log.info("broker %d is not eligible to be controller", self.broker.broker_id)
            return
        self.broker.coordinator.watch_preferred_election(
            self.broker._threadsafe(self._on_preferred_election))
        self.broker.coordinator.watch_reassignments(
            self.broker._threadsafe(self._on_reassignments))

    async def _on_controller_changed(self, holder: tuple[int, int] | None) -> None:
        self.current = holder
        if not self.broker.config.controller_eligible:
            return
        if holder is None:
            await self._try_elect()
        elif self.lease is not None and holder != (self.lease.broker_id, self.lease.epoch):
            log.info("broker %d is no longer controller (broker %d, epoch %d is)",
                     self.broker.broker_id, holder[0], holder[1])
            self.lease = None

    async def _try_elect(self) -> None:
        if self.broker.stopping or self.broker.zookeeper_suspended:
            return
        try:
            lease = await asyncio.to_thread(self.broker.coordinator.try_become_controller,
                                            self.broker.broker_id)
        except Exception as err:
            # The multi-op may have committed before the connection dropped: then
            # /controller is ours but we hold no lease. Give it up so that someone
            # (maybe us, through the watch) wins cleanly.
            log.warning("controller election failed: %r", err)
            try:
                await asyncio.to_thread(self.broker.coordinator.resign_controller,
                                        self.broker.broker_id)
            except Exception as resign_err:
                log.warning("giving up a half-won controller election failed: %r",
                            resign_err)
            return
        if lease is None:
            return
        self.lease = lease
        log.info("broker %d is controller (epoch %d)", lease.broker_id, lease.epoch)
        if self._rescanning is None or self._rescanning.done():
            self._rescanning = asyncio.get_running_loop().create_task(self._rescan_loop())
        await self.elect_leaders()
        # Requests left by a previous controller: finish them.
        if await asyncio.to_thread(self.broker.coordinator.preferred_election_pending):
            await self._run_preferred_election()
        await self._on_reassignments(True)

    async def _on_preferred_election(self, requested: bool) -> None:
        if requested and self.lease is not None:
            await self._run_preferred_election()

    async def _run_preferred_election(self) -> None:
        try:
            holder = await asyncio.to_thread(self._read_preferred_request)
        except Exception as err:
            log.warning("reading the preferred-leader request failed: %r", err)
            return
        if holder is None:
            return
        await self.elect_leaders(preferred=holder)
        if self.lease is not None:
            await asyncio.to_thread(self.broker.coordinator.finish_preferred_election)

    def _read_preferred_request(self) -> Collection[tuple[str, int]] | None:
        """The partitions named by the pending request (empty: all), None if none."""
        pending, partitions = self.broker.coordinator.preferred_election_request()
        if not pending:
            return None
        return set() if partitions is None else set(partitions)

    async def _on_reassignments(self, pending: bool) -> None:
        if not pending or self.lease is None:
            return
        if self._reassigning is None or self._reassigning.done():
            self._reassigning = asyncio.get_running_loop().create_task(self._reassign_loop())

    async def _reassign_loop(self) -> None:
        """Drive every reassignment in progress until none is left or the lease is lost."""
        while self.lease is not None and not self.broker.stopping:
            lease = self.lease
            if not self.broker.zookeeper_suspended:
                try:
                    async with self._lock:
                        left = await asyncio.to_thread(self._reassign_step, lease)
                except ControllerMovedError as err:
                    log.info("%s", err)
                    if self.lease is lease:
                        self.lease = None
                    return
                except Exception as err:
                    log.warning("reassignment step failed: %r; retrying", err)
                    left = 1
                if left == 0:
                    return
            await asyncio.sleep(_REASSIGN_POLL_S)

    def _reassign_step(self, lease: ControllerLease) -> int:
        """Advance every pending reassignment by what is possible now; return how many
        are still pending."""
        coordinator = self.broker.coordinator
        pending, version = coordinator.reassignments()
        done: list[tuple[str, int]] = []
        for (name, p), target in pending.items():
            if self._advance_reassignment(lease, name, p, target):
                done.append((name, p))
        if done:
            left = {k: v for k, v in pending.items() if k not in done}
            try:
                coordinator.write_reassignments(left, version)
            except ConcurrentUpdateError:
                return 1  # a new request arrived meanwhile: look again next round
            for name, p in done:
                log.info("reassignment of %s-%d to %s is complete", name, p, pending[(name, p)])
            return len(left)
        return len(pending)

    def _advance_reassignment(self, lease: ControllerLease, name: str, p: int,
                              target: list[int]) -> bool:
        """One step of one partition's reassignment; True once it is complete."""
        coordinator = self.broker.coordinator
        found = coordinator.topic_with_version(name)
        if found is None or p not in found[0].assignment:
            return True  # the topic or partition is gone: nothing left to move
        topic, version = found
        current = topic.assignment[p]
        if not target:
            return True
        if not set(target) <= set(current):
            moving = target + [b for b in current if b not in target]
            self._write_assignment(lease, topic, p, moving, version)
            log.info("%s-%d: adding replicas %s (replica set now %s)", name, p,
                     [b for b in target if b not in current], moving)
            return False
        state = coordinator.partition_state(name, p)
        if not set(target) <= set(state.isr):
            return False  # the new replicas are still copying the log
        if state.leader not in target or any(b not in target for b in state.isr):
            leader = state.leader if state.leader in target \
                else next(b for b in target if b in state.isr)
            new = PartitionState(leader, state.leader_epoch + (leader != state.leader),
                                 [b for b in state.isr if b in target],
                                 zk_version=state.zk_version)
            coordinator.update_partition_state_as_controller(lease, name, p, new)
        if current != target:
            self._write_assignment(lease, topic, p, list(target), version)
        # A leader that had not seen the new replica set yet may have taken a leaving
        # replica back into the ISR meanwhile: not done until the ISR is within the target.
        state = coordinator.partition_state(name, p)
        if any(b not in target for b in state.isr):
            coordinator.update_partition_state_as_controller(lease, name, p, PartitionState(
                state.leader, state.leader_epoch, [b for b in state.isr if b in target],
                zk_version=state.zk_version))
        return True

    def _write_assignment(self, lease: ControllerLease, topic: TopicDefinition, p: int,
                          replicas: list[int], version: int) -> None:
        assignment = dict(topic.assignment)
        assignment[p] = replicas
        self.broker.coordinator.set_assignment_as_controller(
            lease, TopicDefinition(topic.name, topic.topic_id, assignment), version)

    def resign(self) -> None:
        """Forget the lease (session lost: the ephemeral znode is gone with it)."""
        self.lease = None

    async def session_restored(self) -> None:
        """After a reconnect: run for controller if nobody holds it, and (if we are
        controller) make up for decisions skipped while the session was suspended."""
        try:
            holder = await asyncio.to_thread(self.broker.coordinator.controller)
        except Exception as err:
            log.warning("reading the controller after a reconnect failed: %r", err)
            return
        if holder is not None and holder[0] == self.broker.broker_id and self.lease is None \
                and self.broker.config.controller_eligible:
            await asyncio.to_thread(self.broker.coordinator.resign_controller,
                                    self.broker.broker_id)
            return  # the watch sees /controller vanish and runs the election
        await self._on_controller_changed(holder)
        await self.elect_leaders()

    async def _rescan_loop(self) -> None:
        """While controller: scan every few seconds, and finish leftover requests."""
        while self.lease is not None and not self.broker.stopping:
            await asyncio.sleep(_RESCAN_S)
            await self.elect_leaders()
            try:
                if await asyncio.to_thread(self.broker.coordinator.preferred_election_pending):
                    await self._run_preferred_election()
                pending, _ = await asyncio.to_thread(self.broker.coordinator.reassignments)
                await self._on_reassignments(bool(pending))
            except Exception as err:
                log.warning("controller rescan failed: %r", err)

    async def elect_leaders(self, *, preferred: Collection[tuple[str, int]] | None = None
                            ) -> dict[tuple[str, int], PartitionState]:
        """Scan every partition and write the states :func:`elect` asks for.

        ``preferred``: partitions whose leadership should move to their preferred
        replica (an empty collection: every partition). Returns the states written.
        """
        lease = self.lease
        if lease is None or self.broker.zookeeper_suspended:
            return {}
        async with self._lock:
            try:
                return await asyncio.to_thread(self._scan, lease, preferred)
            except ControllerMovedError as err:
                log.info("%s", err)
                if self.lease is lease:
                    self.lease = None
                return {}
            except Exception as err:  # ZooKeeper trouble: the periodic rescan retries
                log.warning("leader election scan failed: %r; the next rescan retries",
                            err)
                return {}

    def _scan(self, lease: ControllerLease, preferred: Collection[tuple[str, int]] | None
              ) -> dict[tuple[str, int], PartitionState]:
        coordinator = self.broker.coordinator
        live = {b.broker_id for b in coordinator.live_brokers()}
        written: dict[tuple[str, int], PartitionState] = {}
        for name in coordinator.list_topics():
            topic = coordinator.get_topic(name)
            if topic is None:
                continue
            unclean = self._unclean_allowed(name)
            for p, replicas in topic.assignment.items():
                want_preferred = preferred is not None and (not preferred
                                                            or (name, p) in preferred)
                for _ in range(_RETRIES):
                    try:
                        state = coordinator.partition_state(name, p)
                    except UnknownTopicOrPartitionError:
                        break
                    new = elect(state, replicas, live, unclean=unclean,
                                preferred=want_preferred)
                    if new is None:
                        break
                    try:
                        written[(name, p)] = coordinator.update_partition_state_as_controller(
                            lease, name, p, new)
                        log.info("%s-%d: leader %d -> %d, epoch %d, isr %s", name, p,
                                 state.leader, new.leader, new.leader_epoch, new.isr)
                        break
                    except ConcurrentUpdateError:
                        continue  # a leader's ISR write got there first: decide again
                    except UnknownTopicOrPartitionError:
                        break
        return written

    def _unclean_allowed(self, topic: str) -> bool:
        try:
            overrides, _ = self.broker.coordinator.topic_configs(topic)
            config = LogConfig.from_mapping(overrides, base=self.broker.config.log_defaults)
        except (InvalidConfigError, StrataError):
            return False
        return config.unclean_leader_election_enable
