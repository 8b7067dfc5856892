"""Everything Strata keeps in ZooKeeper, behind one small typed interface.

Znode layout (every value is UTF-8 JSON with a ``"version": 1`` field)::

    /strata/cluster/id                          {"id": "<uuid>"}            persistent
    /strata/brokers/ids/<broker id>             BrokerRegistration          EPHEMERAL
    /strata/brokers/topics/<topic>              TopicDefinition (id, replica assignment)
    /strata/brokers/topics/<topic>/partitions/<p>/state
                                                PartitionState {leader, leader_epoch,
                                                isr, controller_epoch}; versioned writes
    /strata/config/topics/<topic>               {"config": {key: value}}  (overrides only)
    /strata/latest_producer_id_block            {"broker", "block_start", "block_end"}
    /strata/controller                          {"broker_id", "epoch"}     EPHEMERAL
    /strata/controller_epoch                    {"epoch"}: bumped with /controller in one
                                                multi-op; every controller write checks it
    /strata/admin/preferred_replica_election    {"partitions": [[topic, p], ...] | null}
                                                a request for the controller (it deletes
                                                the znode once done; null: every partition)
    /strata/admin/reassign_partitions           {"partitions": {topic: {p: [replicas]}}}
                                                reassignments in progress (the controller
                                                removes each once it is complete)
    /strata/tier/topics/<topic>                 {"table": "<Delta table uri>"} (set by the
                                                tiering job; empty until it is)
    /strata/tier/topics/<topic>/partitions/<p>  TierProgress {tiered_up_to, tier_start,
                                                updated_ms}; versioned compare-and-set,
                                                neither offset ever decreases
    /strata/tier/topics/<topic>/compacted/<p>   {"merged_up_to"}: offsets below it are in
                                                the compacted table (compact topics)
    /strata/tier/locks/<topic>                  {"owner"}  EPHEMERAL: the lease of the one
                                                tiering job working on the topic

Why a ``/strata`` root: several clusters, or Strata beside other tenants, can share one
ensemble. Topic definitions and configs are persistent, so restarting any process
loses nothing; a broker registration is ephemeral, so it vanishes with the broker's
session and two live brokers can never hold the same id.

Threading: kazoo runs its callbacks on its own thread. This module's methods are
blocking; the asyncio broker calls them through ``asyncio.to_thread`` and receives
watch events through callbacks it re-schedules with ``loop.call_soon_threadsafe``.
Conditional (versioned) writes are used wherever two writers could race: a lost race
raises ``ConcurrentUpdateError`` and the caller re-reads instead of guessing.

Tiering: the brokers delete a tier-enabled topic's local segments only below the
partition's ``tiered_up_to``, so that value must never move back (a stale job would
otherwise let a broker think un-copied data was safe, or re-copy ranges); hence the
monotonic compare-and-set in ``advance_tier_progress``. The lease is ephemeral so a
job that dies frees its topics when its session expires, without an operator.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

from brokers.errors import (
    BrokerIdInUseError,
    BrokerNotAvailableError,
    ConcurrentUpdateError,
    ControllerMovedError,
    TierJobBusyError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "BrokerIdInUseError",
    "ControllerLease",
    "ControllerMovedError",
    "BrokerRegistration",
    "ConcurrentUpdateError",
    "Coordinator",
    "PartitionState",
    "ROOT",
    "TierJobBusyError",
    "TierProgress",
    "TopicDefinition",
]

log = logging.getLogger("strata.brokers.coordination")

ROOT: Final = "/strata"
_CLUSTER_ID = f"{ROOT}/cluster/id"
_BROKER_IDS = f"{ROOT}/brokers/ids"
_TOPICS = f"{ROOT}/brokers/topics"
_TOPIC_CONFIGS = f"{ROOT}/config/topics"
_PRODUCER_ID_BLOCK = f"{ROOT}/latest_producer_id_block"
_CONTROLLER = f"{ROOT}/controller"
_CONTROLLER_EPOCH = f"{ROOT}/controller_epoch"
_PREFERRED_ELECTION = f"{ROOT}/admin/preferred_replica_election"
_REASSIGNMENTS = f"{ROOT}/admin/reassign_partitions"
_TIER_TOPICS = f"{ROOT}/tier/topics"
_TIER_LOCKS = f"{ROOT}/tier/locks"




@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    host: str
    port: int
    start_epoch: int  # ms since the epoch at registration: tells restarts apart


@dataclass(frozen=True, slots=True)
class TopicDefinition:
    name: str
    topic_id: str
    # partition -> replica broker ids, the first being the preferred leader
    assignment: dict[int, list[int]]

    @property
    def partition_count(self) -> int:
        return len(self.assignment)


@dataclass(frozen=True, slots=True)
class ControllerLease:
    """Proof of being controller: the epoch won and the ``/controller_epoch`` znode version
    it was written at. Every controller write is conditional on that version, so a
    deposed controller's writes fail (``ControllerMovedError``) instead of landing."""

    broker_id: int
    epoch: int
    epoch_zk_version: int



@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int = 0
    zk_version: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class TierProgress:
    """How far a partition is in its topic's Delta table.

    ``tiered_up_to``: exclusive end offset of the records copied (0: nothing yet); the
    brokers delete local segments only below it. ``tier_start``: the first offset still
    in the table (equal to ``tiered_up_to`` when the table holds none of this
    partition, e.g. after retention there removed everything). ``updated_ms``: when
    either last changed (ms since the epoch).
    """

    tiered_up_to: int
    tier_start: int
    updated_ms: int


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps({"version": 1, **value}, sort_keys=True).encode()


def _load(data: bytes) -> dict[str, Any]:
    value = json.loads(data.decode())
    if not isinstance(value, dict):
        raise ValueError("znode value is not a JSON object")
    return value


class Coordinator:
    """A broker's (or an admin tool's) session with ZooKeeper."""

    def __init__(self, hosts: str, *, session_timeout_ms: int = 4_000,
                 connect_timeout_s: float = 15.0) -> None:
        self.hosts = hosts
        self.session_timeout_ms = session_timeout_ms
        self._connect_timeout_s = connect_timeout_s
        # Reconnect quickly and forever: kazoo's default backoff doubles up to 60 s, which
        # can outlast the session during a ZooKeeper leader election and lose it.
        self.zk = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000,
                              connection_retry={"max_tries": -1, "max_delay": 1.0})
        self._state_listeners: list[Callable[[str], None]] = []
        self.zk.add_listener(self._on_state)

    # ------------------------------------------------------------------ session
    def start(self) -> None:
        try:
            self.zk.start(timeout=self._connect_timeout_s)
        except Exception as err:
            raise BrokerNotAvailableError(
                f"cannot reach ZooKeeper at {self.hosts} ({err}); start it (`strata up`) or "
                "fix zookeeper.connect") from err
        for path in (_BROKER_IDS, _TOPICS, _TOPIC_CONFIGS):
            self.zk.ensure_path(path)

    def stop(self) -> None:
        try:
            self.zk.stop()
        finally:
            self.zk.close()

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """``listener("SUSPENDED" | "LOST" | "CONNECTED")`` on kazoo's thread."""
        self._state_listeners.append(listener)

    def _on_state(self, state: str) -> None:
        name = {KazooState.LOST: "LOST", KazooState.SUSPENDED: "SUSPENDED"}.get(state, "CONNECTED")
        log.info("ZooKeeper session state: %s", name)
        for listener in self._state_listeners:
            listener(name)

    def cluster_id(self) -> str:
        """The cluster id, created by the first process that asks."""
        try:
            return str(_load(self.zk.get(_CLUSTER_ID)[0])["id"])
        except NoNodeError:
            pass
        with contextlib.suppress(NodeExistsError):
            self.zk.create(_CLUSTER_ID, _dump({"id": uuid.uuid4().hex}), makepath=True)
        return str(_load(self.zk.get(_CLUSTER_ID)[0])["id"])

    # ------------------------------------------------------------------ brokers
    def register_broker(self, registration: BrokerRegistration, *,
                        wait_for_stale_s: float | None = None) -> None:
        """Create the ephemeral ``/brokers/ids/<id>``.

        A node left by a previous, dead session of the same broker disappears once that
        session times out, so this waits up to ``wait_for_stale_s`` (default: the
        session timeout plus a margin) before giving up with ``BrokerIdInUseError``.
        """
        path = f"{_BROKER_IDS}/{registration.broker_id}"
        data = _dump({k: v for k, v in asdict(registration).items()})
        wait = (self.session_timeout_ms / 1000 + 2) if wait_for_stale_s is None \
            else wait_for_stale_s
        deadline = time.monotonic() + wait
        while True:
            try:
                self.zk.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                if time.monotonic() >= deadline:
                    try:
                        holder = _load(self.zk.get(path)[0])
                    except NoNodeError:
                        continue
                    raise BrokerIdInUseError(
                        f"broker id {registration.broker_id} is registered by a live broker "
                        f"at {holder.get('host')}:{holder.get('port')}; stop it or pick "
                        "another broker.id") from None
                time.sleep(0.25)

    def live_brokers(self) -> list[BrokerRegistration]:
        children = self.zk.get_children(_BROKER_IDS)
        out: list[BrokerRegistration] = []
        for child in sorted(children, key=int):
            try:
                value = _load(self.zk.get(f"{_BROKER_IDS}/{child}")[0])
            except NoNodeError:
                continue
            value.pop("version", None)
            out.append(BrokerRegistration(**value))
        return out

    def watch_brokers(self, callback: Callable[[list[int]], None]) -> None:
        """``callback(sorted live broker ids)`` now and on every change (kazoo's thread)."""
        self.zk.ChildrenWatch(_BROKER_IDS)(lambda ids: callback(sorted(int(i) for i in ids)))

    # ------------------------------------------------------------------ topics
    def create_topic(self, topic: TopicDefinition, configs: dict[str, str]) -> None:
        """Create the topic, its config and every partition's initial state atomically."""
        states = {p: PartitionState(leader=replicas[0], leader_epoch=0, isr=list(replicas))
                  for p, replicas in topic.assignment.items()}
        tx = self.zk.transaction()
        tx.create(f"{_TOPICS}/{topic.name}", _dump(
            {"topic_id": topic.topic_id,
             "partitions": {str(p): r for p, r in sorted(topic.assignment.items())}}))
        tx.create(f"{_TOPICS}/{topic.name}/partitions", b"")
        for p, state in sorted(states.items()):
            tx.create(f"{_TOPICS}/{topic.name}/partitions/{p}", b"")
            tx.create(f"{_TOPICS}/{topic.name}/partitions/{p}/state", _state_bytes(state))
        config_path = f"{_TOPIC_CONFIGS}/{topic.name}"
        if self.zk.exists(config_path):
            tx.set_data(config_path, _dump({"config": configs}))
        else:
            tx.create(config_path, _dump({"config": configs}))
        results = tx.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            if any(isinstance(r, NodeExistsError) for r in failures) and \
                    self.zk.exists(f"{_TOPICS}/{topic.name}"):
                raise TopicAlreadyExistsError(f"topic {topic.name!r} already exists")
            raise ConcurrentUpdateError(f"creating topic {topic.name!r} failed: {failures}")

    def list_topics(self) -> list[str]:
        return sorted(self.zk.get_children(_TOPICS))

    def get_topic(self, name: str) -> TopicDefinition | None:
        try:
            value = _load(self.zk.get(f"{_TOPICS}/{name}")[0])
        except NoNodeError:
            return None
        assignment = {int(p): [int(b) for b in r] for p, r in value["partitions"].items()}
        return TopicDefinition(name, str(value["topic_id"]), dict(sorted(assignment.items())))

    def topic_with_version(self, name: str) -> tuple[TopicDefinition, int] | None:
        """The topic definition and its znode version (for conditional writes)."""
        try:
            data, stat = self.zk.get(f"{_TOPICS}/{name}")
        except NoNodeError:
            return None
        value = _load(data)
        assignment = {int(p): [int(b) for b in r] for p, r in value["partitions"].items()}
        return TopicDefinition(name, str(value["topic_id"]), dict(sorted(assignment.items()))), \
            stat.version

    def watch_topic(self, name: str, callback: Callable[[TopicDefinition | None], None]
                    ) -> None:
        """``callback(definition)`` now and whenever the topic's replica assignment changes
        (``None`` once the topic is gone, which ends the watch)."""
        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if data is None:
                callback(None)
                return False
            value = _load(data)
            assignment = {int(p): [int(b) for b in r] for p, r in value["partitions"].items()}
            callback(TopicDefinition(name, str(value["topic_id"]),
                                     dict(sorted(assignment.items()))))
            return None

        self.zk.DataWatch(f"{_TOPICS}/{name}")(on_data)

    def set_assignment_as_controller(self, lease: ControllerLease, topic: TopicDefinition,
                                     expected_version: int) -> None:
        """Rewrite a topic's replica assignment, fenced by the lease and the version."""
        self._write_as_controller(
            lease, f"{_TOPICS}/{topic.name}",
            _dump({"topic_id": topic.topic_id,
                   "partitions": {str(p): r for p, r in sorted(topic.assignment.items())}}),
            expected_version, f"the assignment of topic {topic.name!r}",
            f"topic {topic.name!r}")

    def require_topic(self, name: str) -> TopicDefinition:
        topic = self.get_topic(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} does not exist; create it with `strata topic create {name}`")
        return topic

    def delete_topic(self, name: str) -> None:
        """Remove the topic's znodes; brokers watching the topic list drop its logs."""
        if self.get_topic(name) is None:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} does not exist, so there is nothing to delete; check the "
                "name with `strata topic list`")
        for _ in range(5):
            try:
                self.zk.delete(f"{_TOPICS}/{name}", recursive=True)
                break
            except NotEmptyError:
                continue
            except NoNodeError:
                break
        with contextlib.suppress(NoNodeError):
            self.zk.delete(f"{_TOPIC_CONFIGS}/{name}")
        # The tiering records go with the topic: a topic re-created under this name must
        # not inherit progress that would let brokers delete segments never copied. The
        # Delta table itself is left in place (it may be all that is left of the data).
        self._delete_tree(f"{_TIER_TOPICS}/{name}")

    def _delete_tree(self, path: str) -> None:
        for _ in range(5):
            try:
                self.zk.delete(path, recursive=True)
                return
            except NotEmptyError:
                continue  # a child was created meanwhile: delete again
            except NoNodeError:
                return

    def watch_topics(self, callback: Callable[[list[str]], None]) -> None:
        """``callback(sorted topic names)`` now and on every change (kazoo's thread)."""
        self.zk.ChildrenWatch(_TOPICS)(lambda names: callback(sorted(names)))

    def topic_configs(self, name: str) -> tuple[dict[str, str], int]:
        """The topic's config overrides and the znode version (for conditional writes)."""
        try:
            data, stat = self.zk.get(f"{_TOPIC_CONFIGS}/{name}")
        except NoNodeError:
            self.require_topic(name)
            return {}, -1
        return {str(k): str(v) for k, v in _load(data)["config"].items()}, stat.version

    def set_topic_configs(self, name: str, configs: dict[str, str], expected_version: int) -> None:
        path = f"{_TOPIC_CONFIGS}/{name}"
        try:
            if expected_version < 0:
                self.zk.create(path, _dump({"config": configs}), makepath=True)
            else:
                self.zk.set(path, _dump({"config": configs}), version=expected_version)
        except (BadVersionError, NodeExistsError) as err:
            raise ConcurrentUpdateError(
                f"the configs of topic {name!r} changed meanwhile; re-read and retry") from err

    def watch_topic_configs(self, name: str, callback: Callable[[dict[str, str] | None], None]
                            ) -> None:
        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if data is None:
                callback(None)
                return False
            callback({str(k): str(v) for k, v in _load(data)["config"].items()})
            return None

        self.zk.DataWatch(f"{_TOPIC_CONFIGS}/{name}")(on_data)

    # ------------------------------------------------------------------ partition state
    def watch_partition_state(self, topic: str, partition: int,
                              callback: Callable[[PartitionState | None], None]) -> None:
        """Call ``callback`` with the partition's state now and after every change
        (``None`` once the znode is gone, which ends the watch)."""
        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if data is None:
                callback(None)
                return False
            value = _load(data)
            callback(PartitionState(int(value["leader"]), int(value["leader_epoch"]),
                                    [int(b) for b in value["isr"]],
                                    int(value["controller_epoch"]), stat.version))
            return None

        self.zk.DataWatch(f"{_TOPICS}/{topic}/partitions/{partition}/state")(on_data)

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        try:
            data, stat = self.zk.get(f"{_TOPICS}/{topic}/partitions/{partition}/state")
        except NoNodeError:
            raise UnknownTopicOrPartitionError(
                f"partition {topic}-{partition} does not exist") from None
        value = _load(data)
        return PartitionState(int(value["leader"]), int(value["leader_epoch"]),
                              [int(b) for b in value["isr"]], int(value["controller_epoch"]),
                              stat.version)

    def update_partition_state(self, topic: str, partition: int, state: PartitionState
                               ) -> PartitionState:
        """Conditional write against ``state.zk_version``; returns the state, new version."""
        path = f"{_TOPICS}/{topic}/partitions/{partition}/state"
        try:
            stat = self.zk.set(path, _state_bytes(state), version=state.zk_version)
        except BadVersionError as err:
            raise ConcurrentUpdateError(
                f"state of {topic}-{partition} changed meanwhile; re-read it") from err
        return PartitionState(state.leader, state.leader_epoch, list(state.isr),
                              state.controller_epoch, stat.version)

    # ------------------------------------------------------------------ controller
    def try_become_controller(self, broker_id: int) -> ControllerLease | None:
        """Create the ephemeral ``/controller`` and bump ``/controller_epoch`` atomically.

        Returns the lease when this broker won, ``None`` when another broker already
        holds ``/controller``. The epoch is the fencing token (Kafka's ZooKeeper era).
        """
        for _ in range(10):
            try:
                data, stat = self.zk.get(_CONTROLLER_EPOCH)
                epoch, version = int(_load(data)["epoch"]), stat.version
            except NoNodeError:
                epoch, version = 0, -1
            tx = self.zk.transaction()
            tx.create(_CONTROLLER, _dump({"broker_id": broker_id, "epoch": epoch + 1,
                                          "timestamp": time.time_ns() // 1_000_000}),
                      ephemeral=True)
            if version < 0:
                tx.create(_CONTROLLER_EPOCH, _dump({"epoch": epoch + 1}))
            else:
                tx.set_data(_CONTROLLER_EPOCH, _dump({"epoch": epoch + 1}), version=version)
            results = tx.commit()
            if not any(isinstance(r, Exception) for r in results):
                return ControllerLease(broker_id, epoch + 1, version + 1)
            if self.zk.exists(_CONTROLLER):
                return None  # someone else is controller
            # The epoch moved between our read and our write: read again.
        raise ConcurrentUpdateError("controller election kept racing; retry")

    def resign_controller(self, broker_id: int) -> None:
        """Delete ``/controller`` if this session created it for ``broker_id``."""
        try:
            data, stat = self.zk.get(_CONTROLLER)
        except NoNodeError:
            return
        if int(_load(data)["broker_id"]) == broker_id \
                and stat.ephemeralOwner == self.zk.client_id[0]:
            with contextlib.suppress(NoNodeError, BadVersionError):
                self.zk.delete(_CONTROLLER, version=stat.version)

    def controller(self) -> tuple[int, int] | None:
        """``(broker id, epoch)`` of the current controller, or ``None``."""
        try:
            value = _load(self.zk.get(_CONTROLLER)[0])
        except NoNodeError:
            return None
        return int(value["broker_id"]), int(value["epoch"])

    def watch_controller(self, callback: Callable[[tuple[int, int] | None], None]) -> None:
        """``callback((broker id, epoch) | None)`` now and whenever the controller changes."""
        def on_data(data: bytes | None, stat: Any) -> None:
            if data is None:
                callback(None)
            else:
                value = _load(data)
                callback((int(value["broker_id"]), int(value["epoch"])))

        self.zk.DataWatch(_CONTROLLER)(on_data)

    def update_partition_state_as_controller(self, lease: ControllerLease, topic: str,
                                             partition: int, state: PartitionState
                                             ) -> PartitionState:
        """Write partition state only if ``lease`` is still the newest controller epoch
        and the state is unchanged since it was read (``state.zk_version``)."""
        path = f"{_TOPICS}/{topic}/partitions/{partition}/state"
        stamped = PartitionState(state.leader, state.leader_epoch, list(state.isr), lease.epoch,
                                 state.zk_version)
        self._write_as_controller(lease, path, _state_bytes(stamped), state.zk_version,
                                  f"state of {topic}-{partition}",
                                  f"partition {topic}-{partition}")
        return self.partition_state(topic, partition)

    def _write_as_controller(self, lease: ControllerLease, path: str, data: bytes,
                             expected_version: int, what: str, thing: str) -> None:
        """``set(path, data)`` if ``lease`` is still the newest controller epoch and the
        znode is still at ``expected_version``, in one multi-op."""
        tx = self.zk.transaction()
        tx.check(_CONTROLLER_EPOCH, lease.epoch_zk_version)
        tx.set_data(path, data, version=expected_version)
        results = tx.commit()
        # In a failed multi-op the failing operation carries its own error and the
        # others come back as RolledBackError.
        if isinstance(results[0], BadVersionError | NoNodeError):
            raise ControllerMovedError(
                f"controller epoch {lease.epoch} of broker {lease.broker_id} is no longer "
                "current; another broker is controller now")
        if isinstance(results[1], BadVersionError):
            raise ConcurrentUpdateError(f"{what} changed meanwhile; re-read it")
        if isinstance(results[1], NoNodeError):
            raise UnknownTopicOrPartitionError(f"{thing} does not exist")

    # ------------------------------------------------------------------ admin requests
    def request_preferred_election(self, partitions: list[tuple[str, int]] | None) -> None:
        """Ask the controller for a preferred-leader election (None: every partition)."""
        value = None if partitions is None else [[t, p] for t, p in partitions]
        try:
            self.zk.create(_PREFERRED_ELECTION, _dump({"partitions": value}), makepath=True)
        except NodeExistsError:
            raise ConcurrentUpdateError(
                "a preferred-leader election is already in progress; wait for it to finish "
                "and retry") from None

    def preferred_election_pending(self) -> bool:
        return self.zk.exists(_PREFERRED_ELECTION) is not None

    def preferred_election_request(self) -> tuple[bool, list[tuple[str, int]] | None]:
        """``(pending, partitions)``: is an election requested, and for which partitions
        (None: every partition)."""
        try:
            data, _ = self.zk.get(_PREFERRED_ELECTION)
        except NoNodeError:
            return False, None
        value = _load(data)["partitions"]
        return True, None if value is None else [(str(t), int(p)) for t, p in value]

    def watch_preferred_election(self, callback: Callable[[bool], None]) -> None:
        """``callback(requested)`` now and whenever the election request znode changes."""
        self.zk.DataWatch(_PREFERRED_ELECTION)(lambda data, stat: callback(data is not None))

    def finish_preferred_election(self) -> None:
        with contextlib.suppress(NoNodeError):
            self.zk.delete(_PREFERRED_ELECTION)

    def reassignments(self) -> tuple[dict[tuple[str, int], list[int]], int]:
        """Reassignments in progress (partition -> target replicas) and the znode version
        (-1: none recorded)."""
        try:
            data, stat = self.zk.get(_REASSIGNMENTS)
        except NoNodeError:
            return {}, -1
        value = _load(data)["partitions"]
        return {(str(t), int(p)): [int(b) for b in r]
                for t, parts in value.items() for p, r in parts.items()}, stat.version

    def write_reassignments(self, pending: dict[tuple[str, int], list[int]],
                            expected_version: int) -> None:
        """Replace the reassignments in progress (conditional; empty: delete the znode)."""
        nested: dict[str, dict[str, list[int]]] = {}
        for (topic, p), replicas in sorted(pending.items()):
            nested.setdefault(topic, {})[str(p)] = replicas
        try:
            if not pending:
                if expected_version >= 0:
                    self.zk.delete(_REASSIGNMENTS, version=expected_version)
            elif expected_version < 0:
                self.zk.create(_REASSIGNMENTS, _dump({"partitions": nested}), makepath=True)
            else:
                self.zk.set(_REASSIGNMENTS, _dump({"partitions": nested}),
                            version=expected_version)
        except (BadVersionError, NodeExistsError, NoNodeError) as err:
            raise ConcurrentUpdateError(
                "the reassignments in progress changed meanwhile; re-read and retry") from err

    def watch_reassignments(self, callback: Callable[[bool], None]) -> None:
        """``callback(any pending)`` now and whenever the reassignments znode changes."""
        self.zk.DataWatch(_REASSIGNMENTS)(lambda data, stat: callback(data is not None))

    # ------------------------------------------------------------------ tiering
    def tier_table(self, topic: str) -> str | None:
        """The Delta table the topic is tiered into (``None``: not recorded yet)."""
        try:
            data = self.zk.get(f"{_TIER_TOPICS}/{topic}")[0]
        except NoNodeError:
            return None
        if not data:
            return None  # created as a parent of a progress record, before the table
        table = _load(data).get("table")
        return None if table is None else str(table)

    def set_tier_table(self, topic: str, uri: str) -> None:
        """Record the topic's Delta table (creating the parents)."""
        path = f"{_TIER_TOPICS}/{topic}"
        data = _dump({"table": uri})
        try:
            self.zk.create(path, data, makepath=True)
        except NodeExistsError:
            self.zk.set(path, data)

    def tier_progress(self, topic: str) -> dict[int, TierProgress]:
        """Each partition's progress; partitions with none recorded are absent."""
        base = f"{_TIER_TOPICS}/{topic}/partitions"
        try:
            children = self.zk.get_children(base)
        except NoNodeError:
            return {}
        out: dict[int, TierProgress] = {}
        for child in sorted(children, key=int):
            try:
                out[int(child)] = _progress(self.zk.get(f"{base}/{child}")[0])
            except NoNodeError:
                continue  # the topic is being deleted
        return out

    def advance_tier_progress(self, topic: str, partition: int, *, tiered_up_to: int,
                              tier_start: int, topic_id: str | None = None) -> TierProgress:
        """Move the partition's progress forward; returns what is stored afterwards.

        Neither offset ever decreases: a smaller value than the stored one keeps the
        stored one (a job that lost a race, or re-runs an old range, cannot undo
        progress brokers may already have deleted segments against). A compare-and-set
        loop on the znode version makes concurrent writers safe. Raises
        ``UnknownTopicOrPartitionError`` when the topic does not exist, or (``topic_id``
        given) when the topic of that name is another one than the job planned for: a
        job still running across a deletion and re-creation must not leave the old
        topic's progress on the new one, which brokers would delete segments against.
        """
        if not 0 <= tier_start <= tiered_up_to:
            raise ValueError(f"tier progress of {topic}-{partition} must satisfy 0 <= "
                             f"tier_start ({tier_start}) <= tiered_up_to ({tiered_up_to})")
        path = f"{_TIER_TOPICS}/{topic}/partitions/{partition}"
        while True:
            try:
                data, stat = self.zk.get(path)
                stored: TierProgress | None = _progress(data)
                version = stat.version
            except NoNodeError:
                stored, version = None, -1
            if stored is not None and stored.tiered_up_to >= tiered_up_to \
                    and stored.tier_start >= tier_start:
                return stored  # nothing moves forward
            merged = TierProgress(
                max(tiered_up_to, stored.tiered_up_to if stored else 0),
                max(tier_start, stored.tier_start if stored else 0),
                time.time_ns() // 1_000_000)
            value = _dump(asdict(merged))
            tx = self.zk.transaction()
            topic_version = -1
            if topic_id is not None:
                found = self.topic_with_version(topic)
                if found is None or found[0].topic_id != topic_id:
                    raise _no_topic_to_tier(topic)
                topic_version = found[1]
            tx.check(f"{_TOPICS}/{topic}", topic_version)  # still exists (still this one)
            if version < 0:
                if self.zk.exists(f"{_TOPICS}/{topic}") is None:
                    raise _no_topic_to_tier(topic)
                self.zk.ensure_path(f"{_TIER_TOPICS}/{topic}/partitions")
                tx.create(path, value)
            else:
                tx.set_data(path, value, version=version)
            results = tx.commit()
            if not any(isinstance(r, Exception) for r in results):
                return merged
            if isinstance(results[0], NoNodeError):
                raise _no_topic_to_tier(topic)
            # Another writer moved the znode between our read and our write (or the topic
            # definition changed, e.g. a reassignment): read again.

    def compaction_progress(self, topic: str) -> dict[int, int]:
        """Per partition, the end offset up to which the compacted table has merged."""
        base = f"{_TIER_TOPICS}/{topic}/compacted"
        try:
            children = self.zk.get_children(base)
        except NoNodeError:
            return {}
        out: dict[int, int] = {}
        for child in children:
            with contextlib.suppress(NoNodeError):
                out[int(child)] = int(_load(self.zk.get(f"{base}/{child}")[0])["merged_up_to"])
        return dict(sorted(out.items()))

    def advance_compaction_progress(self, topic: str, partition: int, merged_up_to: int) -> int:
        """Record that offsets below ``merged_up_to`` are in the compacted table (never
        moves back); returns the stored value."""
        path = f"{_TIER_TOPICS}/{topic}/compacted/{partition}"
        while True:
            try:
                data, stat = self.zk.get(path)
                stored, version = int(_load(data)["merged_up_to"]), stat.version
            except NoNodeError:
                stored, version = -1, -1
            if stored >= merged_up_to:
                return stored
            value = _dump({"merged_up_to": merged_up_to})
            try:
                if version < 0:
                    if self.zk.exists(f"{_TOPICS}/{topic}") is None:
                        raise _no_topic_to_tier(topic)
                    self.zk.create(path, value, makepath=True)
                else:
                    self.zk.set(path, value, version=version)
                return merged_up_to
            except (NodeExistsError, BadVersionError):
                continue  # another writer: read again

    def holds_tier_lease(self, topic: str) -> bool:
        """Whether this session still holds ``topic``'s lease right now.

        A session that expired (a long GC pause, a network partition) lost its ephemeral
        lease, and another job may have taken it: a job checks this before every write.
        """
        try:
            _, stat = self.zk.get(f"{_TIER_LOCKS}/{topic}")
        except KazooException:
            return False
        return bool(self.zk.connected and stat.ephemeralOwner == self.zk.client_id[0])

    @contextlib.contextmanager
    def tier_lease(self, topic: str, owner: str) -> Iterator[None]:
        """Hold the topic's tiering lease (an ephemeral znode) for the ``with`` block.

        Raises ``TierJobBusyError`` when another job holds it. Released on exit, and by
        ZooKeeper when this session ends (a crashed job frees the topic by itself); see
        ``holds_tier_lease`` for checking it is still held.
        """
        path = f"{_TIER_LOCKS}/{topic}"
        try:
            self.zk.create(path, _dump({"owner": owner}), ephemeral=True, makepath=True)
        except NodeExistsError:
            try:
                holder = str(_load(self.zk.get(path)[0]).get("owner"))
            except NoNodeError:
                holder = "a job that has just finished"
            raise TierJobBusyError(
                f"another tiering job ({holder}) holds topic {topic!r}; wait for it to finish "
                "or stop it (a crashed job's lease expires with its ZooKeeper session)"
            ) from None
        try:
            yield
        finally:
            # No node, or no session any more: the ephemeral lease is gone either way.
            with contextlib.suppress(KazooException):
                _, stat = self.zk.get(path)
                if stat.ephemeralOwner == self.zk.client_id[0]:
                    self.zk.delete(path, version=stat.version)

    # ------------------------------------------------------------------ producer ids
    def allocate_producer_id_block(self, broker_id: int, block_size: int = 1000) -> range:
        """Claim the next block of producer ids with a compare-and-set loop."""
        while True:
            try:
                data, stat = self.zk.get(_PRODUCER_ID_BLOCK)
                start = int(_load(data)["block_end"])
                version = stat.version
            except NoNodeError:
                start, version = 0, -1
            value = _dump({"broker": broker_id, "block_start": start,
                           "block_end": start + block_size})
            try:
                if version < 0:
                    self.zk.create(_PRODUCER_ID_BLOCK, value, makepath=True)
                else:
                    self.zk.set(_PRODUCER_ID_BLOCK, value, version=version)
                return range(start, start + block_size)
            except (BadVersionError, NodeExistsError):
                continue


def _no_topic_to_tier(topic: str) -> UnknownTopicOrPartitionError:
    return UnknownTopicOrPartitionError(
        f"topic {topic!r} does not exist (deleted while it was being tiered?), so its tier "
        "progress is not recorded; check the name with `strata topic list`")


def _progress(data: bytes) -> TierProgress:
    value = _load(data)
    return TierProgress(int(value["tiered_up_to"]), int(value["tier_start"]),
                        int(value["updated_ms"]))


def _state_bytes(state: PartitionState) -> bytes:
    return _dump({"leader": state.leader, "leader_epoch": state.leader_epoch,
                  "isr": list(state.isr), "controller_epoch": state.controller_epoch})

