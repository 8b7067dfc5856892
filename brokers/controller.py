"""The controller: one broker at a time elects partition leaders for the whole cluster.

Election: every eligible broker watches ``/strata/controller``; when it is empty, each
tries ``ZooKeeperClient.try_become_controller``, which creates the ephemeral znode and bumps
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

* a broker in a controlled shutdown (its ephemeral request under
  ``/strata/admin/controlled_shutdown``) is *leaving*: its leaderships go to another
  in-sync replica, it leaves the ISRs, and it is never elected (see :func:`elect`).

Every write is conditional on the state version read (a conflict: decide again on the
state now there) and on the lease (``ControllerMovedError``: stop acting). Nothing is
decided while the ZooKeeper session is suspended.

Scale: a round decides every partition at once (:func:`plan_elections`) on this
broker's view of the states (followed through change notifications, and reloaded with
multi-reads right after the first round of a new controller), writes them in pipelined multi-ops of
up to 500 partitions (``ZooKeeperClient.write_partition_states``), and logs one line.

Thread-safety: rounds run one at a time (an asyncio lock) on the broker's event loop;
the blocking ZooKeeper calls run in a worker thread. Brokers, this one included, apply
the results through their state watchers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from brokers.coordination import ControllerLease, PartitionKey, PartitionState, TopicDefinition
from wire.errors import (
    ConcurrentUpdateError,
    ControllerMovedError,
    InvalidConfigError,
    StrataError,
)

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.coordination import ZooKeeperClient
    from brokers.services import ControllerHost, MetadataCache

__all__ = ["Controller", "assign_replicas", "elect", "plan_elections"]

log = logging.getLogger("strata.brokers.controller")

_RETRIES: Final = 5
#: How often the controller looks at reassignments in progress.
_REASSIGN_POLL_S: Final = 0.5
#: How often an active controller scans every partition even without an event: a scan
#: that failed (ZooKeeper trouble) or was skipped (session suspended) is made up for.
_RESCAN_S: Final = 5.0
#: Rescans between removals of old partition-state change notifications.
_PRUNE_EVERY: Final = 12


def elect(state: PartitionState, replicas: Sequence[int], live: Collection[int], *,
          unclean: bool = False, preferred: bool = False,
          leaving: Collection[int] = ()) -> PartitionState | None:
    """The partition state the controller should write, or None to leave it.

    ``leaving``: brokers in a controlled shutdown. They lead nothing another in-sync
    replica can lead, are never elected, and leave every ISR that keeps a member
    without them (acks=all must not wait for a broker about to stop).

    Pure, so that the election rules can be tested without a cluster.
    """
    live_isr = [b for b in state.isr if b in live]
    staying_isr = [b for b in live_isr if b not in leaving]
    if state.leader >= 0 and state.leader in live:
        if state.leader in leaving:
            successors = [b for b in replicas if b in staying_isr]
            if successors:
                return PartitionState(successors[0], state.leader_epoch + 1, staying_isr,
                                      zk_version=state.zk_version)
            isr = live_isr  # nobody else is in sync: it leads until it stops
        else:
            isr = staying_isr
            if preferred and replicas and replicas[0] != state.leader \
                    and replicas[0] in staying_isr:
                return PartitionState(replicas[0], state.leader_epoch + 1, isr,
                                      zk_version=state.zk_version)
        if isr != list(state.isr) and isr:
            return PartitionState(state.leader, state.leader_epoch, isr,
                                  zk_version=state.zk_version)
        return None
    candidates = [b for b in replicas if b in staying_isr]
    if candidates:
        return PartitionState(candidates[0], state.leader_epoch + 1, staying_isr,
                              zk_version=state.zk_version)
    if unclean:
        alive = [b for b in replicas if b in live and b not in leaving]
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


def plan_elections(topics: Mapping[str, TopicDefinition],
                   states: Mapping[PartitionKey, PartitionState], live: Collection[int], *,
                   leaving: Collection[int] = (), unclean: Collection[str] = (),
                   preferred: Collection[PartitionKey] | None = None
                   ) -> dict[PartitionKey, PartitionState]:
    """:func:`elect` over every partition of ``topics`` whose state is known: the states
    to write. ``unclean``: topics with unclean leader election enabled; ``preferred``:
    partitions to move to their preferred replica (empty: all; None: none)."""
    plan: dict[PartitionKey, PartitionState] = {}
    for name, topic in topics.items():
        allow_unclean = name in unclean
        for p, replicas in topic.assignment.items():
            state = states.get((name, p))
            if state is None:
                continue
            new = elect(state, replicas, live, unclean=allow_unclean, leaving=leaving,
                        preferred=preferred is not None and (not preferred
                                                             or (name, p) in preferred))
            if new is not None:
                plan[(name, p)] = new
    return plan


class Controller:
    """Controller duties of one broker; acts only while it holds the lease."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache, zookeeper: ZooKeeperClient,
                 host: ControllerHost) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.zookeeper = zookeeper
        self.host = host
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
        self.zookeeper.watch_controller(
            self.host.threadsafe(self._on_controller_changed))
        if not self.config.controller_eligible:
            log.info("broker %d is not eligible to be controller", self.broker_id)
            return
        self.zookeeper.watch_preferred_election(
            self.host.threadsafe(self._on_preferred_election))
        self.zookeeper.watch_reassignments(
            self.host.threadsafe(self._on_reassignments))

    async def _on_controller_changed(self, holder: tuple[int, int] | None) -> None:
        self.current = holder
        if not self.config.controller_eligible:
            return
        if holder is None:
            await self._try_elect()
        elif self.lease is not None and holder != (self.lease.broker_id, self.lease.epoch):
            log.info("broker %d is no longer controller (broker %d, epoch %d is)",
                     self.broker_id, holder[0], holder[1])
            self.lease = None

    async def _try_elect(self) -> None:
        if self.host.stopping or self.host.zookeeper_suspended:
            return
        try:
            lease = await asyncio.to_thread(self.zookeeper.try_become_controller,
                                            self.broker_id)
        except Exception as err:
            # The multi-op may have committed before the connection dropped: then
            # /controller is ours but we hold no lease. Give it up so that someone
            # (maybe us, through the watch) wins cleanly.
            log.warning("controller election failed: %r", err)
            try:
                await asyncio.to_thread(self.zookeeper.resign_controller,
                                        self.broker_id)
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
        # Decide at once on the view this broker's watcher keeps current (a stale state
        # only costs a conflict and a retry: every write is conditional), then read
        # everything again and decide once more, in case the view missed something.
        await self.elect_leaders()
        try:
            await self.reload_states()
        except Exception as err:  # the periodic rescan decides again later
            log.warning("reloading partition states failed: %r", err)
        await self.elect_leaders()
        # Requests left by a previous controller: finish them.
        if await asyncio.to_thread(self.zookeeper.preferred_election_pending):
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
            await asyncio.to_thread(self.zookeeper.finish_preferred_election)

    def _read_preferred_request(self) -> Collection[tuple[str, int]] | None:
        """The partitions named by the pending request (empty: all), None if none."""
        pending, partitions = self.zookeeper.preferred_election_request()
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
        while self.lease is not None and not self.host.stopping:
            lease = self.lease
            if not self.host.zookeeper_suspended:
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
        zookeeper = self.zookeeper
        pending, version = zookeeper.reassignments()
        done: list[tuple[str, int]] = []
        for (name, p), target in pending.items():
            if self._advance_reassignment(lease, name, p, target):
                done.append((name, p))
        if done:
            left = {k: v for k, v in pending.items() if k not in done}
            try:
                zookeeper.write_reassignments(left, version)
            except ConcurrentUpdateError:
                return 1  # a new request arrived meanwhile: look again next round
            for name, p in done:
                log.info("reassignment of %s-%d to %s is complete", name, p, pending[(name, p)])
            return len(left)
        return len(pending)

    def _advance_reassignment(self, lease: ControllerLease, name: str, p: int,
                              target: list[int]) -> bool:
        """One step of one partition's reassignment; True once it is complete."""
        zookeeper = self.zookeeper
        found = zookeeper.topic_with_version(name)
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
        state = zookeeper.partition_state(name, p)
        if not set(target) <= set(state.isr):
            return False  # the new replicas are still copying the log
        if state.leader not in target or any(b not in target for b in state.isr):
            leader = state.leader if state.leader in target \
                else next(b for b in target if b in state.isr)
            new = PartitionState(leader, state.leader_epoch + (leader != state.leader),
                                 [b for b in state.isr if b in target],
                                 zk_version=state.zk_version)
            zookeeper.update_partition_state_as_controller(lease, name, p, new)
        if current != target:
            self._write_assignment(lease, topic, p, list(target), version)
        # A leader that had not seen the new replica set yet may have taken a leaving
        # replica back into the ISR meanwhile: not done until the ISR is within the target.
        state = zookeeper.partition_state(name, p)
        if any(b not in target for b in state.isr):
            zookeeper.update_partition_state_as_controller(lease, name, p, PartitionState(
                state.leader, state.leader_epoch, [b for b in state.isr if b in target],
                zk_version=state.zk_version))
        return True

    def _write_assignment(self, lease: ControllerLease, topic: TopicDefinition, p: int,
                          replicas: list[int], version: int) -> None:
        assignment = dict(topic.assignment)
        assignment[p] = replicas
        self.zookeeper.set_assignment_as_controller(
            lease, TopicDefinition(topic.name, topic.topic_id, assignment), version)

    def resign(self) -> None:
        """Forget the lease (session lost: the ephemeral znode is gone with it)."""
        self.lease = None

    async def session_restored(self) -> None:
        """After a reconnect: run for controller if nobody holds it, and (if we are
        controller) make up for decisions skipped while the session was suspended."""
        try:
            holder = await asyncio.to_thread(self.zookeeper.controller)
        except Exception as err:
            log.warning("reading the controller after a reconnect failed: %r", err)
            return
        if holder is not None and holder[0] == self.broker_id and self.lease is None \
                and self.config.controller_eligible:
            await asyncio.to_thread(self.zookeeper.resign_controller,
                                    self.broker_id)
            return  # the watch sees /controller vanish and runs the election
        await self._on_controller_changed(holder)
        await self.elect_leaders()

    async def _rescan_loop(self) -> None:
        """While controller: scan every few seconds, and finish leftover requests."""
        rounds = 0
        while self.lease is not None and not self.host.stopping:
            await asyncio.sleep(_RESCAN_S)
            await self.elect_leaders()
            rounds += 1
            try:
                if rounds % _PRUNE_EVERY == 0:
                    await asyncio.to_thread(self.zookeeper.prune_state_changes)
                if await asyncio.to_thread(self.zookeeper.preferred_election_pending):
                    await self._run_preferred_election()
                pending, _ = await asyncio.to_thread(self.zookeeper.reassignments)
                await self._on_reassignments(bool(pending))
            except Exception as err:
                log.warning("controller rescan failed: %r", err)

    async def elect_leaders(self, *, preferred: Collection[PartitionKey] | None = None
                            ) -> dict[PartitionKey, PartitionState]:
        """Decide every partition and write the states :func:`elect` asks for.

        ``preferred``: partitions whose leadership should move to their preferred
        replica (an empty collection: every partition). Returns the states written.

        Decisions are made on this broker's view of the partition states (kept current
        by its state watches, and reloaded in bulk when it becomes controller), then
        written in pipelined, epoch-fenced multi-ops. A state that moved since it was
        seen comes back as a conflict with its current value and is decided again, so a
        stale view costs a retry, never a wrong write.
        """
        lease = self.lease
        if lease is None or self.host.zookeeper_suspended:
            return {}
        async with self._lock:
            try:
                return await self._elect(lease, preferred)
            except ControllerMovedError as err:
                log.info("%s", err)
                if self.lease is lease:
                    self.lease = None
                return {}
            except Exception as err:  # ZooKeeper trouble: the periodic rescan retries
                log.warning("leader election scan failed: %r; the next rescan retries",
                            err)
                return {}

    async def _elect(self, lease: ControllerLease, preferred: Collection[PartitionKey] | None
                     ) -> dict[PartitionKey, PartitionState]:
        zookeeper = self.zookeeper
        started = time.monotonic()
        live, leaving = await asyncio.to_thread(
            lambda: (zookeeper.live_broker_ids(), zookeeper.shutting_down_brokers()))
        self.cluster.shutting_down = leaving
        topics = dict(self.cluster.topics)
        unclean = {name for name in topics if self._unclean_allowed(name)}
        base = dict(self.cluster.partition_states)
        plan = plan_elections(topics, base, live, leaving=leaving, unclean=unclean,
                              preferred=preferred)
        written: dict[PartitionKey, PartitionState] = {}
        conflicts = leader_changes = 0
        for _ in range(_RETRIES):
            if not plan:
                break
            outcome = await asyncio.to_thread(zookeeper.write_partition_states, plan,
                                              lease=lease)
            for (name, p), state in outcome.written.items():
                before = base.get((name, p))
                if before is None or before.leader != state.leader:
                    leader_changes += 1
                    log.debug("%s-%d: leader %d -> %d, epoch %d, isr %s", name, p,
                              -1 if before is None else before.leader, state.leader,
                              state.leader_epoch, state.isr)
                self.host.apply_partition_state(name, p, state, quiet=True)
            written.update(outcome.written)
            conflicts += len(outcome.conflicts)
            base.update(outcome.conflicts)
            # Someone (a leader's ISR write) got there first: decide again on what is there.
            plan = plan_elections(
                {name: topics[name] for name, _ in outcome.conflicts if name in topics},
                outcome.conflicts, live, leaving=leaving, unclean=unclean,
                preferred=preferred)
        if written:
            # One line per decision round, not per partition: at ten thousand partitions
            # the log lines alone would cost seconds.
            log.info("controller epoch %d wrote %d partition states (%d new leaders; live "
                     "brokers %s, leaving %s; %d conflicts decided again) in %.2f s",
                     lease.epoch, len(written), leader_changes, sorted(live),
                     sorted(leaving), conflicts, time.monotonic() - started)
        return written

    async def reload_states(self) -> None:
        """Read every partition's state in one pipelined batch into this broker's view
        (on becoming controller: decide on ZooKeeper's truth, not on a view that may
        have missed events while another broker was controller)."""
        keys = [(name, p) for name, topic in self.cluster.topics.items()
                for p in topic.assignment]
        states = await asyncio.to_thread(self.zookeeper.read_partition_states, keys)
        for (name, p), state in states.items():
            self.host.apply_partition_state(name, p, state, quiet=True)

    def _unclean_allowed(self, topic: str) -> bool:
        try:
            return self.host.log_config_for(topic).unclean_leader_election_enable
        except (InvalidConfigError, StrataError):
            return False


def assign_replicas(live: list[int], partitions: int, replication: int) -> dict[int, list[int]]:
    """Replica lists for a new topic: leaders (first replicas) spread evenly over the live
    brokers, the followers of each partition on distinct brokers after its leader.

    Kafka's rack-unaware scheme: a random start, then round robin; the follower offset
    shifts every full round so the followers of one leader are spread out too.
    """
    count = len(live)
    start = random.randrange(count)
    shift = random.randrange(count)
    assignment: dict[int, list[int]] = {}
    for p in range(partitions):
        if p > 0 and p % count == 0:
            shift += 1
        first = (start + p) % count
        replicas = [live[first]]
        for r in range(replication - 1):
            step = 1 + (shift + r) % (count - 1) if count > 1 else 0
            replicas.append(live[(first + step) % count])
        assignment[p] = replicas
    return assignment
