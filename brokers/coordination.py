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
    /strata/admin/controlled_shutdown/<id>      {"broker_id"}  EPHEMERAL: the broker is
                                                stopping; the controller moves its
                                                leaderships and takes it out of ISRs
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

Errors: kazoo's exceptions never leave this module. A public :class:`ZooKeeperClient`
method that meets one (connection loss, an expired session, a timeout) raises
:class:`ZooKeeperUnavailableError`, a ``BrokerNotAvailableError`` (retriable, code 8)
that names the call and what to do; outcomes a caller acts on have their own
``StrataError`` (``TopicAlreadyExistsError``, ``ConcurrentUpdateError``, ...). Methods
calling each other inside the module still see kazoo's exceptions and may handle them:
only the outermost call translates.

Tiering: the brokers delete a tier-enabled topic's local segments only below the
partition's ``tiered_up_to``, so that value must never move back (a stale job would
otherwise let a broker think un-copied data was safe, or re-copy ranges); hence the
monotonic compare-and-set in ``advance_tier_progress``. The job reaches ZooKeeper only
through the brokers (TierLease, UpdateTier): its lease is a znode with an expiry it
renews, so a job that dies frees its topics after its TTL, without an operator, and every
progress write checks the lease in the same transaction.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import inspect
import json
import logging
import threading
import time
import uuid
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    EXCEPTIONS,
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import (
    MultiHeader,
    bool_struct,
    int_struct,
    multiheader_struct,
    read_buffer,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, make_digest_acl

from brokers.acl import check_binding, pattern_key
from wire.errors import (
    BrokerIdInUseError,
    BrokerNotAvailableError,
    ConcurrentUpdateError,
    ControllerMovedError,
    TierJobBusyError,
    TierLeaseLostError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import AclEntry
from wire.sasl import ScramCredential

__all__ = [
    "ZooKeeperUnavailableError",
    "BrokerIdInUseError",
    "ControllerLease",
    "ControllerMovedError",
    "BrokerRegistration",
    "ConcurrentUpdateError",
    "ZooKeeperClient",
    "PartitionState",
    "ROOT",
    "TierJobBusyError",
    "TierProgress",
    "TopicDefinition",
    "read_znodes",
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
_CONTROLLED_SHUTDOWN = f"{ROOT}/admin/controlled_shutdown"
_STATE_CHANGES = f"{ROOT}/state_changes"
_TIER_TOPICS = f"{ROOT}/tier/topics"
_TIER_LOCKS = f"{ROOT}/tier/locks"
_USERS = f"{ROOT}/config/users"
_ACLS = f"{ROOT}/acls"
_ACLS_CHANGED = f"{ROOT}/acls_changed"
_QUOTAS = f"{ROOT}/config/quotas"
_QUOTAS_CHANGED = f"{ROOT}/config/quotas_changed"
# Bumped with every credential change: brokers watch this one znode, not every user.
_USERS_CHANGED = f"{ROOT}/config/users_changed"

#: ``(topic, partition)``.
PartitionKey = tuple[str, int]

# Bulk writes go out as multi-ops of at most this many operations and bytes: one
# ZooKeeper request must stay below ``jute.maxbuffer`` (about 1 MB by default), and a
# smaller transaction loses less work when one of its conditional writes fails.
_TX_MAX_OPS: Final = 500
_TX_MAX_BYTES: Final = 256 * 1024
#: How long a pipelined batch of reads or writes may take before it counts as failed.
_BULK_TIMEOUT_S: Final = 60.0
#: Paths per multiRead request (answers stay far below ``jute.maxbuffer``).
_MULTI_READ_PATHS: Final = 500
_GET_DATA: Final = 4  # ZooKeeper's getData opcode
#: A broker re-reads every state it follows this often, whatever the notifications say.
_FULL_READ_S: Final = 60.0
#: Change notifications older than this are removed by the controller. A broker reads
#: them within milliseconds; one cut off from ZooKeeper for longer has lost its session
#: (and reads everything again) long before.
STATE_CHANGE_RETENTION_S: Final = 300.0

class ZooKeeperUnavailableError(BrokerNotAvailableError):
    """ZooKeeper did not complete a request; the change may or may not have been made."""


# How deep in public ZooKeeperClient methods this thread is: only the outermost call
# translates kazoo's exceptions, so inner calls can still catch NoNodeError and the like.
_calls = threading.local()


def _translating(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_calls, "depth", 0)
        _calls.depth = depth + 1
        try:
            return method(*args, **kwargs)
        except (KazooException, KazooTimeoutError) as err:
            if depth:
                raise
            raise ZooKeeperUnavailableError(
                f"ZooKeeper did not complete {method.__name__} ({type(err).__name__}: "
                f"{err}); check the ensemble (strata status) and retry") from err
        finally:
            _calls.depth = depth

    return call


def _kazoo_errors_stay_inside(cls: type) -> type:
    """Wrap every public method of ``cls`` with :func:`_translating`."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _translating(member))
    return cls


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """``host``/``port``: the inter-broker listener's advertised endpoint;
    ``endpoints``: ``(listener name, host, port)`` of every listener (clients are told
    the one of the listener they came in on)."""

    broker_id: int
    host: str
    port: int
    start_epoch: int  # ms since the epoch at registration: tells restarts apart
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, listener: str) -> tuple[str, int]:
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return self.host, self.port


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


@dataclass(slots=True)
class StateWrites:
    """What became of a batch of conditional partition-state writes.

    ``written``: the states now in ZooKeeper, with their new znode versions.
    ``conflicts``: partitions whose state changed since it was read (someone else wrote
    first), with the state as it is now: decide again from it. ``missing``: partitions
    that no longer exist (their topic was deleted meanwhile).
    """

    written: dict[PartitionKey, PartitionState] = field(default_factory=dict)
    conflicts: dict[PartitionKey, PartitionState] = field(default_factory=dict)
    missing: list[PartitionKey] = field(default_factory=list)


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


@_kazoo_errors_stay_inside
class ZooKeeperClient:
    """A broker's (or an admin tool's) session with ZooKeeper, and every read and write
    of Strata's znodes (Kafka's ``KafkaZkClient``). Not a coordinator of anything: the
    consumer groups' is :class:`brokers.group_coordinator.GroupCoordinator`, and the
    client's ``find_coordinator`` answers where that one runs."""

    def __init__(self, hosts: str, *, session_timeout_ms: int = 4_000,
                 connect_timeout_s: float = 15.0,
                 digest: tuple[str, str] | None = None) -> None:
        """``digest``: ``(user, password)`` for ZooKeeper's digest scheme. With it, every
        znode this session creates is writable only by that identity (others may read),
        and SCRAM credentials are not even readable by others: a ZooKeeper client
        without the brokers' credentials cannot change the cluster's state."""
        self.hosts = hosts
        self.session_timeout_ms = session_timeout_ms
        self._connect_timeout_s = connect_timeout_s
        self._private_acl: list[Any] | None = None
        default_acl = None
        auth_data = None
        if digest is not None:
            owner = make_digest_acl(digest[0], digest[1], all=True)
            default_acl = [owner, READ_ACL_UNSAFE[0]]
            self._private_acl = [owner]
            auth_data = [("digest", f"{digest[0]}:{digest[1]}")]
        # Reconnect quickly and forever: kazoo's default backoff doubles up to 60 s, which
        # can outlast the session during a ZooKeeper leader election and lose it.
        self.zk = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000,
                              connection_retry={"max_tries": -1, "max_delay": 1.0},
                              default_acl=default_acl, auth_data=auth_data)
        self._state_listeners: list[Callable[[str], None]] = []
        self.zk.add_listener(self._on_state)
        self._parsed_topics: dict[str, tuple[bytes, TopicDefinition]] = {}

    # ------------------------------------------------------------------ session
    def start(self) -> None:
        try:
            self.zk.start(timeout=self._connect_timeout_s)
        except Exception as err:
            raise BrokerNotAvailableError(
                f"cannot reach ZooKeeper at {self.hosts} ({err}); start it (`strata up`) or "
                "fix zookeeper.connect") from err
        for path in (_BROKER_IDS, _TOPICS, _TOPIC_CONFIGS, _STATE_CHANGES):
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
            value["endpoints"] = tuple(tuple(e) for e in value.get("endpoints", ()))
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
            return _topic(name, self.zk.get(f"{_TOPICS}/{name}")[0])
        except NoNodeError:
            return None

    def topic_with_version(self, name: str) -> tuple[TopicDefinition, int] | None:
        """The topic definition and its znode version (for conditional writes)."""
        try:
            data, stat = self.zk.get(f"{_TOPICS}/{name}")
        except NoNodeError:
            return None
        return _topic(name, data), stat.version

    def watch_topic(self, name: str, callback: Callable[[TopicDefinition | None], None]
                    ) -> None:
        """``callback(definition)`` now and whenever the topic's replica assignment changes
        (``None`` once the topic is gone, which ends the watch)."""
        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if data is None:
                callback(None)
                return False
            callback(_topic(name, data))
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
        self._delete_tree(f"{_TIER_LOCKS}/{name}")  # a job still holding it loses it

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
    def partition_state(self, topic: str, partition: int) -> PartitionState:
        try:
            data, stat = self.zk.get(_state_path(topic, partition))
        except NoNodeError:
            raise UnknownTopicOrPartitionError(
                f"partition {topic}-{partition} does not exist") from None
        return _parse_state(data, stat)

    def update_partition_state(self, topic: str, partition: int, state: PartitionState
                               ) -> PartitionState:
        """Conditional write against ``state.zk_version``; returns the state, new version."""
        tx = self.zk.transaction()
        tx.set_data(_state_path(topic, partition), _state_bytes(state), version=state.zk_version)
        _notify(tx, [(topic, partition)])
        results = tx.commit()
        if isinstance(results[0], BadVersionError):
            raise ConcurrentUpdateError(
                f"state of {topic}-{partition} changed meanwhile; re-read it")
        if isinstance(results[0], NoNodeError):
            raise UnknownTopicOrPartitionError(f"partition {topic}-{partition} does not exist")
        return PartitionState(state.leader, state.leader_epoch, list(state.isr),
                              state.controller_epoch, results[0].version)

    # ------------------------------------------------------------------ bulk, pipelined
    def _read_many(self, paths: Iterable[str]) -> dict[str, tuple[bytes, Any]]:
        return read_znodes(self.zk, paths)

    def read_topics(self, names: Iterable[str]) -> dict[str, TopicDefinition]:
        """The definitions of the named topics that exist, read in a few multiRead
        requests. Unchanged definitions (same bytes as last read) are not parsed again:
        a broker re-reads every definition whenever the topic list changes."""
        names = list(names)
        found = self._read_many(f"{_TOPICS}/{name}" for name in names)
        out: dict[str, TopicDefinition] = {}
        for name in names:
            got = found.get(f"{_TOPICS}/{name}")
            if got is None:
                self._parsed_topics.pop(name, None)
                continue
            cached = self._parsed_topics.get(name)
            if cached is None or cached[0] != got[0]:
                cached = self._parsed_topics[name] = (got[0], _topic(name, got[0]))
            out[name] = cached[1]
        return out

    def read_topic_configs(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        """The config overrides of each named topic (``{}`` when none are recorded)."""
        names = list(names)
        found = self._read_many(f"{_TOPIC_CONFIGS}/{name}" for name in names)
        out: dict[str, dict[str, str]] = {}
        for name in names:
            got = found.get(f"{_TOPIC_CONFIGS}/{name}")
            out[name] = {} if got is None else \
                {str(k): str(v) for k, v in _load(got[0])["config"].items()}
        return out

    def read_partition_states(self, keys: Iterable[PartitionKey]
                              ) -> dict[PartitionKey, PartitionState]:
        """The state of every named partition that exists, in one pipelined batch (the
        controller's reload at failover, a broker's start-up)."""
        keys = list(keys)
        found = self._read_many(_state_path(t, p) for t, p in keys)
        out: dict[PartitionKey, PartitionState] = {}
        for key in keys:
            got = found.get(_state_path(*key))
            if got is not None:
                out[key] = _parse_state(*got)
        return out

    def write_partition_states(self, states: Mapping[PartitionKey, PartitionState], *,
                               lease: ControllerLease | None = None) -> StateWrites:
        """Conditional writes of many partition states, pipelined in chunked multi-ops.

        Each state is written only if its znode is still at ``state.zk_version``. With a
        ``lease`` (the controller) every multi-op also checks the controller epoch, so
        a deposed controller writes nothing (``ControllerMovedError``) and the states
        carry the lease's epoch. A multi-op is all or nothing: when one of its writes
        finds a newer state, the others are re-checked with one pipelined read and sent
        again; only partitions whose state really moved come back as ``conflicts``.
        """
        stamped = {key: state if lease is None else PartitionState(
            state.leader, state.leader_epoch, list(state.isr), lease.epoch, state.zk_version)
            for key, state in states.items()}
        outcome = StateWrites()
        todo = dict(stamped)
        while todo:
            retry: dict[PartitionKey, PartitionState] = {}
            for chunk, result in [(chunk, self._commit_states(chunk, lease))
                                  for chunk in _chunks(todo)]:
                results = result.get(timeout=_BULK_TIMEOUT_S)
                offset = 0
                if lease is not None:
                    if isinstance(results[0], BadVersionError | NoNodeError):
                        raise ControllerMovedError(
                            f"controller epoch {lease.epoch} of broker {lease.broker_id} is "
                            "no longer current; another broker is controller now")
                    offset = 1
                # The last answer is the change notification's.
                answers = results[offset:offset + len(chunk)]
                for (key, state), answer in zip(chunk, answers, strict=True):
                    if isinstance(answer, BadVersionError):
                        outcome.conflicts[key] = state
                    elif isinstance(answer, NoNodeError):
                        outcome.missing.append(key)
                    elif isinstance(answer, KazooException):
                        retry[key] = state  # rolled back with a failing neighbour
                    elif isinstance(answer, Exception):
                        raise answer
                    else:
                        outcome.written[key] = PartitionState(
                            state.leader, state.leader_epoch, list(state.isr),
                            state.controller_epoch, answer.version)
            if retry:
                # Only the first failing write of a multi-op names itself: re-read the
                # rolled-back ones so that every conflict is found in this one round.
                fresh = self.read_partition_states(retry)
                todo = {}
                for key, state in retry.items():
                    now = fresh.get(key)
                    if now is None:
                        outcome.missing.append(key)
                    elif now.zk_version != state.zk_version:
                        outcome.conflicts[key] = now
                    else:
                        todo[key] = state
            else:
                todo = {}
        if outcome.conflicts:
            fresh = self.read_partition_states(outcome.conflicts)
            for key in list(outcome.conflicts):
                if key in fresh:
                    outcome.conflicts[key] = fresh[key]
                else:
                    del outcome.conflicts[key]
                    outcome.missing.append(key)
        return outcome

    def _commit_states(self, chunk: list[tuple[PartitionKey, PartitionState]],
                       lease: ControllerLease | None) -> Any:
        tx = self.zk.transaction()
        if lease is not None:
            tx.check(_CONTROLLER_EPOCH, lease.epoch_zk_version)
        for (topic, p), state in chunk:
            tx.set_data(_state_path(topic, p), _state_bytes(state), version=state.zk_version)
        _notify(tx, [key for key, _ in chunk])
        return tx.commit_async()

    def state_watcher(self, deliver: Callable[[], None]) -> PartitionStateWatcher:
        """A :class:`PartitionStateWatcher` on this session."""
        watcher = PartitionStateWatcher(self, deliver)
        self.add_state_listener(watcher.session_state)
        return watcher

    def prune_state_changes(self, older_than_s: float = STATE_CHANGE_RETENTION_S) -> int:
        """Remove change notifications older than ``older_than_s`` (by ZooKeeper's
        creation time); returns how many. The controller calls it now and then."""
        try:
            children = self.zk.get_children(_STATE_CHANGES)
        except NoNodeError:
            return 0
        paths = [f"{_STATE_CHANGES}/{c}" for c in children]
        cutoff_ms = (time.time() - older_than_s) * 1000
        old = [path for path, (_, stat) in self._read_many(paths).items()
               if stat.ctime < cutoff_ms]
        for result in [self.zk.delete_async(path) for path in old]:
            with contextlib.suppress(NoNodeError):
                result.get(timeout=_BULK_TIMEOUT_S)
        return len(old)

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
                                  f"partition {topic}-{partition}", notify=(topic, partition))
        return self.partition_state(topic, partition)

    def _write_as_controller(self, lease: ControllerLease, path: str, data: bytes,
                             expected_version: int, what: str, thing: str, *,
                             notify: PartitionKey | None = None) -> None:
        """``set(path, data)`` if ``lease`` is still the newest controller epoch and the
        znode is still at ``expected_version``, in one multi-op (with the change
        notification of partition ``notify``, if given)."""
        tx = self.zk.transaction()
        tx.check(_CONTROLLER_EPOCH, lease.epoch_zk_version)
        tx.set_data(path, data, version=expected_version)
        if notify is not None:
            _notify(tx, [notify])
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

    # ------------------------------------------------------------------ controlled shutdown
    def request_controlled_shutdown(self, broker_id: int) -> None:
        """Ask the controller to move this broker's leaderships away (and take it out of
        every ISR) before it stops. The request is an ephemeral znode: it ends with this
        session, so a broker that restarts (or dies) is not left marked as leaving."""
        with contextlib.suppress(NodeExistsError):
            self.zk.create(f"{_CONTROLLED_SHUTDOWN}/{broker_id}", _dump({"broker_id": broker_id}),
                           ephemeral=True, makepath=True)

    def shutting_down_brokers(self) -> set[int]:
        """Brokers with a controlled shutdown in progress."""
        try:
            return {int(child) for child in self.zk.get_children(_CONTROLLED_SHUTDOWN)}
        except NoNodeError:
            return set()

    def live_broker_ids(self) -> set[int]:
        """Registered brokers (one read, without their registrations)."""
        return {int(child) for child in self.zk.get_children(_BROKER_IDS)}

    def watch_shutting_down(self, callback: Callable[[set[int]], None]) -> None:
        """``callback(ids of brokers shutting down)`` now and on every change."""
        self.zk.ensure_path(_CONTROLLED_SHUTDOWN)
        self.zk.ChildrenWatch(_CONTROLLED_SHUTDOWN)(
            lambda ids: callback({int(i) for i in ids}))

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

    def set_tier_table(self, topic: str, uri: str, *, lease_id: str | None = None) -> None:
        """Record the topic's Delta table (creating the parents); ``lease_id``: only
        while that tier lease holds (``TierLeaseLostError`` otherwise)."""
        path = f"{_TIER_TOPICS}/{topic}"
        data = _dump({"table": uri})
        while True:
            try:
                version = self.zk.get(path)[1].version
            except NoNodeError:
                version = -1
            tx = self.zk.transaction()
            if lease_id is not None:
                self._check_lease(tx, topic, lease_id)
            if version < 0:
                self.zk.ensure_path(_TIER_TOPICS)
                tx.create(path, data)
            else:
                tx.set_data(path, data, version=version)
            if not any(isinstance(r, Exception) for r in tx.commit()):
                return

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
                              tier_start: int, topic_id: str | None = None,
                              lease_id: str | None = None) -> TierProgress:
        """Move the partition's progress forward; returns what is stored afterwards.

        Neither offset ever decreases: a smaller value than the stored one keeps the
        stored one (a job that lost a race, or re-runs an old range, cannot undo
        progress brokers may already have deleted segments against). A compare-and-set
        loop on the znode version makes concurrent writers safe. Raises
        ``UnknownTopicOrPartitionError`` when the topic does not exist, or (``topic_id``
        given) when the topic of that name is another one than the job planned for: a
        job still running across a deletion and re-creation must not leave the old
        topic's progress on the new one, which brokers would delete segments against.
        ``lease_id`` given: the same transaction checks the topic's tier lease is still
        that one (``TierLeaseLostError`` otherwise), so a job whose lease lapsed and was
        taken over can never move progress.
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
            if lease_id is not None:
                self._check_lease(tx, topic, lease_id)
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

    def advance_compaction_progress(self, topic: str, partition: int, merged_up_to: int,
                                    *, lease_id: str | None = None) -> int:
        """Record that offsets below ``merged_up_to`` are in the compacted table (never
        moves back); returns the stored value. ``lease_id``: fenced by the tier lease,
        as in ``advance_tier_progress``."""
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
            if self.zk.exists(f"{_TOPICS}/{topic}") is None:
                raise _no_topic_to_tier(topic)
            tx = self.zk.transaction()
            if lease_id is not None:
                self._check_lease(tx, topic, lease_id)
            if version < 0:
                self.zk.ensure_path(f"{_TIER_TOPICS}/{topic}/compacted")
                tx.create(path, value)
            else:
                tx.set_data(path, value, version=version)
            if not any(isinstance(r, Exception) for r in tx.commit()):
                return merged_up_to
            # Another writer, or a renewal of the lease, between the reads and the write.

    def acquire_tier_lease(self, topic: str, owner: str, ttl_ms: int
                           ) -> tuple[str, str, dict[int, int]]:
        """Take ``topic``'s tiering lease for ``ttl_ms``; returns ``(lease id, topic id,
        compaction progress)``.

        The lease is a persistent znode ``{owner, lease_id, expires_ms}``: a job reaches
        the cluster through the brokers only, so it cannot hold an ephemeral node of its
        own session; its expiry takes that role. Free or expired (by this broker's
        clock): taken with a conditional write, so two takers cannot both win. Held by
        another: ``TierJobBusyError`` naming the holder.
        """
        found = self.topic_with_version(topic)
        if found is None:
            raise _no_topic_to_tier(topic)
        path = f"{_TIER_LOCKS}/{topic}"
        lease_id = uuid.uuid4().hex
        while True:
            now_ms = time.time_ns() // 1_000_000
            value = _dump({"owner": owner, "lease_id": lease_id, "expires_ms": now_ms + ttl_ms})
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                try:
                    self.zk.create(path, value, makepath=True)
                    break
                except NodeExistsError:
                    continue  # another job took it first: look again
            held = _load(data) if data else {}
            expires_ms = int(held.get("expires_ms", 2**62))  # an old ephemeral lock: held
            if expires_ms > now_ms:
                raise TierJobBusyError(
                    f"another tiering job ({held.get('owner', 'unknown')}) holds topic "
                    f"{topic!r} for {max(expires_ms - now_ms, 0) / 1000:.1f} s more unless "
                    "it renews; wait for it to finish or stop it (a stopped job's lease "
                    "expires after its TTL)")
            try:
                self.zk.set(path, value, version=stat.version)
                break
            except (BadVersionError, NoNodeError):
                continue
        return lease_id, found[0].topic_id, self.compaction_progress(topic)

    def renew_tier_lease(self, topic: str, lease_id: str, ttl_ms: int) -> None:
        """Extend the lease by ``ttl_ms`` from now; ``TierLeaseLostError`` when it is not
        ``lease_id`` any more (expired and taken over, or the topic was deleted). An
        expired lease nobody took is renewed: nobody else can have written meanwhile."""
        path = f"{_TIER_LOCKS}/{topic}"
        while True:
            held, version = self._lease(topic, lease_id)
            held["expires_ms"] = time.time_ns() // 1_000_000 + ttl_ms
            try:
                self.zk.set(path, _dump(held), version=version)
                return
            except (BadVersionError, NoNodeError):
                continue

    def release_tier_lease(self, topic: str, lease_id: str) -> None:
        """Give the lease up (nothing to do when it is no longer ``lease_id``)."""
        while True:
            try:
                _, version = self._lease(topic, lease_id)
            except TierLeaseLostError:
                return
            try:
                self.zk.delete(f"{_TIER_LOCKS}/{topic}", version=version)
                return
            except BadVersionError:
                continue
            except NoNodeError:
                return

    def _lease(self, topic: str, lease_id: str) -> tuple[dict[str, Any], int]:
        """The lease record and its znode version, if the lease is still ``lease_id``."""
        try:
            data, stat = self.zk.get(f"{_TIER_LOCKS}/{topic}")
        except NoNodeError:
            held: dict[str, Any] = {}
        else:
            held = _load(data) if data else {}
        if held.get("lease_id") != lease_id:
            raise TierLeaseLostError(
                f"the tiering lease {lease_id} on topic {topic!r} is gone (it expired "
                f"and {held.get('owner', 'nobody')} holds the topic now, or the topic was "
                "deleted); nothing more is written under it: the next pass plans again "
                "from what the table and the recorded progress hold")
        return held, stat.version

    def _check_lease(self, tx: Any, topic: str, lease_id: str) -> None:
        """Make ``tx`` fail unless the lease is still ``lease_id`` when it commits."""
        _, version = self._lease(topic, lease_id)
        tx.check(f"{_TIER_LOCKS}/{topic}", version)

    # ------------------------------------------------------------------ SCRAM users
    def scram_credentials(self) -> dict[str, dict[str, ScramCredential]]:
        """Every user's stored credentials, by user and mechanism."""
        try:
            names = self.zk.get_children(_USERS)
        except NoNodeError:
            return {}
        found = read_znodes(self.zk, [f"{_USERS}/{n}" for n in names])
        out: dict[str, dict[str, ScramCredential]] = {}
        for name in names:
            entry = found.get(f"{_USERS}/{name}")
            if entry is None:
                continue
            out[name] = {mechanism: ScramCredential(
                mechanism, base64.b64decode(c["salt"]), int(c["iterations"]),
                base64.b64decode(c["stored_key"]), base64.b64decode(c["server_key"]))
                for mechanism, c in _load(entry[0]).get("credentials", {}).items()}
        return out

    def put_scram_credential(self, user: str, credential: ScramCredential) -> None:
        """Create or replace ``user``'s credential for its mechanism (others stay)."""
        path = f"{_USERS}/{user}"
        self.zk.ensure_path(_USERS)
        while True:
            try:
                data, stat = self.zk.get(path)
                stored, version = _load(data).get("credentials", {}), stat.version
            except NoNodeError:
                stored, version = {}, -1
            stored[credential.mechanism] = {
                "salt": base64.b64encode(credential.salt).decode(),
                "iterations": credential.iterations,
                "stored_key": base64.b64encode(credential.stored_key).decode(),
                "server_key": base64.b64encode(credential.server_key).decode()}
            try:
                if version < 0:
                    self.zk.create(path, _dump({"credentials": stored}),
                                   acl=self._private_acl)
                else:
                    self.zk.set(path, _dump({"credentials": stored}), version=version)
                break
            except (NodeExistsError, BadVersionError):
                continue
        self._users_changed()

    def migrate_znode_acls(self, *, secure: bool) -> int:
        """Kafka's ``zookeeper-security-migration``: give every existing znode under
        ``/strata`` the ACL a cluster with ``zookeeper.set.acl`` creates it with
        (``secure``: writable only by this session's digest identity, readable by all,
        SCRAM credentials readable by it alone) or, with ``secure=False``, open it to
        everyone again (before turning ``zookeeper.set.acl`` off). Returns how many
        znodes were changed. Nodes created or deleted while it runs are fine: new ones
        already get the brokers' ACL, vanished ones are skipped."""
        if secure and self._private_acl is None:
            raise ValueError("securing znodes needs the digest identity the brokers use "
                             "(zookeeper.digest.username/password)")
        shared = self.zk.default_acl if secure else OPEN_ACL_UNSAFE
        changed, todo = 0, [ROOT]
        while todo:
            path = todo.pop()
            private = secure and path.startswith(f"{_USERS}/")
            wanted = list(self._private_acl or ()) if private else list(shared)
            try:
                current, _ = self.zk.get_acls(path)
                if sorted(map(repr, current)) != sorted(map(repr, wanted)):
                    self.zk.set_acls(path, wanted)
                    changed += 1
                todo.extend(f"{path}/{child}" for child in self.zk.get_children(path))
            except NoNodeError:
                continue
        return changed

    def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        """Remove one mechanism's credential (the user goes with its last one); False
        when there was none."""
        path = f"{_USERS}/{user}"
        while True:
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                return False
            stored = _load(data).get("credentials", {})
            if stored.pop(mechanism, None) is None:
                return False
            try:
                if stored:
                    self.zk.set(path, _dump({"credentials": stored}), version=stat.version)
                else:
                    self.zk.delete(path, version=stat.version)
                break
            except (BadVersionError, NoNodeError):
                continue
        self._users_changed()
        return True

    def _users_changed(self) -> None:
        self._bump(_USERS_CHANGED)

    def watch_users(self, callback: Callable[[object], None]) -> None:
        """``callback(_)`` now and after every credential change (kazoo's thread)."""
        self._watch_bumps(_USERS_CHANGED, callback)

    # ------------------------------------------------------------------ ACLs
    def acl_bindings(self) -> list[AclEntry]:
        """Every ACL binding: one znode per resource pattern, read together."""
        try:
            names = self.zk.get_children(_ACLS)
        except NoNodeError:
            return []
        found = read_znodes(self.zk, [f"{_ACLS}/{n}" for n in names])
        out: list[AclEntry] = []
        for name in sorted(names):
            entry = found.get(f"{_ACLS}/{name}")
            if entry is not None:
                out.extend(_acl_entries(name, entry[0]))
        return out

    def add_acls(self, bindings: Iterable[AclEntry]) -> None:
        """Add bindings (one already there stays once), per resource pattern with a
        compare-and-set on its znode. Each must pass ``brokers.acl.check_binding``
        (raises ``InvalidRequestError`` before anything is written)."""
        by_pattern: dict[tuple[str, str, str], list[AclEntry]] = {}
        for binding in [check_binding(b) for b in bindings]:
            by_pattern.setdefault(pattern_key(binding), []).append(binding)
        self.zk.ensure_path(_ACLS)
        for key, new in by_pattern.items():
            path = f"{_ACLS}/{_acl_node(*key)}"
            while True:
                try:
                    data, stat = self.zk.get(path)
                    have, version = _acl_entries(_acl_node(*key), data), stat.version
                except NoNodeError:
                    have, version = [], -1
                merged = list(have)
                for b in new:  # entries are not hashable: compared field by field
                    if b not in merged:
                        merged.append(b)
                value = _dump({"acls": [_acl_entry(b) for b in merged]})
                try:
                    if version < 0:
                        self.zk.create(path, value)
                    else:
                        self.zk.set(path, value, version=version)
                    break
                except (NodeExistsError, BadVersionError):
                    continue
        self._bump(_ACLS_CHANGED)

    def remove_acls(self, matches: Callable[[AclEntry], bool]) -> list[AclEntry]:
        """Remove every binding ``matches`` accepts; returns the ones removed."""
        removed: list[AclEntry] = []
        try:
            names = self.zk.get_children(_ACLS)
        except NoNodeError:
            return removed
        for name in names:
            path = f"{_ACLS}/{name}"
            while True:
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    break
                have = _acl_entries(name, data)
                gone = [b for b in have if matches(b)]
                if not gone:
                    break
                keep = [b for b in have if b not in gone]
                try:
                    if keep:
                        self.zk.set(path, _dump({"acls": [_acl_entry(b) for b in keep]}),
                                    version=stat.version)
                    else:
                        self.zk.delete(path, version=stat.version)
                    removed.extend(gone)
                    break
                except (BadVersionError, NoNodeError):
                    continue
        if removed:
            self._bump(_ACLS_CHANGED)
        return removed

    def watch_acls(self, callback: Callable[[object], None]) -> None:
        """``callback(_)`` now and after every ACL change (kazoo's thread)."""
        self._watch_bumps(_ACLS_CHANGED, callback)

    def _watch_bumps(self, path: str, callback: Callable[[object], None]) -> None:
        """Call ``callback`` now and after every ``_bump`` of ``path`` (kazoo's thread):
        one watch per kind of change, not per user, binding or quota."""
        self.zk.ensure_path(path)
        self.zk.DataWatch(path)(lambda data, stat: callback(data))

    def _bump(self, path: str) -> None:
        try:
            self.zk.set(path, str(time.time_ns()).encode())
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                self.zk.create(path, b"0", makepath=True)

    # ------------------------------------------------------------------ client quotas
    def client_quotas(self) -> dict[tuple[str | None, str | None], dict[str, float]]:
        """Every quota: ``(user, None)`` or ``(None, client_id)`` -> {key: limit}."""
        try:
            names = self.zk.get_children(_QUOTAS)
        except NoNodeError:
            return {}
        found = read_znodes(self.zk, [f"{_QUOTAS}/{n}" for n in names])
        out: dict[tuple[str | None, str | None], dict[str, float]] = {}
        for name in names:
            entry = found.get(f"{_QUOTAS}/{name}")
            if entry is not None:
                kind, _, encoded = name.partition(".")
                entity = _b64_name(encoded)
                values = {k: float(v) for k, v in _load(entry[0]).get("quotas", {}).items()}
                out[(entity, None) if kind == "user" else (None, entity)] = values
        return out

    def alter_client_quota(self, user: str | None, client_id: str | None,
                           changes: Mapping[str, float | None]) -> None:
        """Set (or, with None, remove) quota keys of one entity."""
        kind, entity = ("user", user) if user is not None else ("client", client_id)
        assert entity is not None
        path = f"{_QUOTAS}/{kind}.{_b64_node(entity)}"
        self.zk.ensure_path(_QUOTAS)
        while True:
            try:
                data, stat = self.zk.get(path)
                quotas, version = _load(data).get("quotas", {}), stat.version
            except NoNodeError:
                quotas, version = {}, -1
            for key, value in changes.items():
                if value is None:
                    quotas.pop(key, None)
                else:
                    quotas[key] = value
            try:
                if version < 0:
                    if quotas:
                        self.zk.create(path, _dump({"quotas": quotas}))
                elif quotas:
                    self.zk.set(path, _dump({"quotas": quotas}), version=version)
                else:
                    self.zk.delete(path, version=version)
                break
            except (NodeExistsError, BadVersionError, NoNodeError):
                continue
        self._bump(_QUOTAS_CHANGED)

    def watch_client_quotas(self, callback: Callable[[object], None]) -> None:
        """``callback(_)`` now and after every quota change (kazoo's thread)."""
        self._watch_bumps(_QUOTAS_CHANGED, callback)

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


@_kazoo_errors_stay_inside
class PartitionStateWatcher:
    """Follows many partition states at once, for a broker's view of the cluster.

    One watch per state znode would cost one ZooKeeper request per partition to arm
    and one per change to read (and kazoo sends requests one at a time: about a
    thousand per second here). Instead every state write is made in a multi-op that
    also creates a sequential *change notification* listing the partitions it wrote
    (``/strata/state_changes/change-<seq>``). This follows the notifications with one
    children watch and reads the states they name with multi-reads (``multiRead``,
    ZooKeeper 3.6+): a controller batch of thousands of partitions reaches a broker
    as a few requests. ``deliver()`` is called (on the watcher's thread) when the
    first state of a new batch is ready; the consumer takes everything that arrived
    since with :meth:`take`. States may arrive more than once and a newer state may
    arrive under an older notification: consumers keep the highest ``zk_version``.

    Deletions are not delivered: a deleted topic leaves through the topic list watch.

    Recovery: every followed state is read again after a lost session (the watch and
    the notifications created meanwhile may be gone), when notifications were removed
    before this watcher read them, and every ``_FULL_READ_S`` as a safety net.

    Thread-safety: :meth:`follow`, :meth:`forget` and :meth:`take` may be called from
    any thread; reads run on the watcher's own daemon thread, never on kazoo's.
    """

    def __init__(self, client: ZooKeeperClient, deliver: Callable[[], None]) -> None:
        self._client = client
        self._deliver = deliver
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._followed: set[PartitionKey] = set()
        # The znode version of each state delivered (watcher thread only; ``forget``
        # under the lock): a re-read that finds the same version delivers nothing.
        self._versions: dict[PartitionKey, int] = {}
        self._ready: list[tuple[PartitionKey, PartitionState | None]] = []
        self._children: list[str] | None = None
        self._last_seen = -1  # highest notification sequence read
        self._reload = False
        self._next_full_read = time.monotonic() + _FULL_READ_S
        self._closed = False
        client.zk.ensure_path(_STATE_CHANGES)
        children = client.zk.get_children(_STATE_CHANGES)
        self._last_seen = max((_sequence(c) for c in children), default=-1)
        client.zk.ChildrenWatch(_STATE_CHANGES)(self._on_children)
        threading.Thread(target=self._run, name="strata-state-watcher", daemon=True).start()

    def follow(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, PartitionState]:
        """Start following ``keys``; blocks until their current states are read and
        returns them (partitions that do not exist are absent). Later changes are
        delivered through ``deliver``/``take``."""
        keys = list(keys)
        with self._lock:
            self._followed.update(keys)
        return self._client.read_partition_states(keys)

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        """Stop delivering changes of ``keys`` (a dropped topic)."""
        keys = list(keys)
        with self._lock:
            self._followed.difference_update(keys)
            for key in keys:
                self._versions.pop(key, None)

    def take(self) -> list[tuple[PartitionKey, PartitionState | None]]:
        """Every state delivered since the last call, oldest first."""
        with self._lock:
            ready, self._ready = self._ready, []
        return ready

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()

    def session_state(self, state: str) -> None:
        """ZooKeeperClient state listener: after a lost session read everything again."""
        if state == "LOST":
            with self._lock:
                self._reload = True
                self._wake.notify()

    def _on_children(self, children: list[str]) -> bool | None:
        with self._lock:
            if self._closed:
                return False  # ends kazoo's watch
            self._children = children
            self._wake.notify()
        return None

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and self._children is None and not self._reload \
                        and time.monotonic() < self._next_full_read:
                    self._wake.wait(max(self._next_full_read - time.monotonic(), 0.01))
                if self._closed:
                    return
                children, self._children = self._children, None
                reload, self._reload = self._reload, False
            try:
                self._catch_up(children, reload)
            except Exception as err:  # ZooKeeper trouble: read everything once it is back
                log.warning("following partition-state changes failed: %r; reading every "
                            "state again shortly", err)
                with self._lock:
                    self._reload = True
                time.sleep(0.5)

    def _catch_up(self, children: list[str] | None, reload: bool) -> None:
        keys: set[PartitionKey] = set()
        if children is not None:
            fresh = sorted((seq, name) for name in children
                           if (seq := _sequence(name)) > self._last_seen)
            if fresh:
                names = [f"{_STATE_CHANGES}/{name}" for _, name in fresh]
                notes = self._client._read_many(names)
                if len(notes) < len(names):
                    reload = True  # removed before we read them: changes may be lost
                for data, _ in notes.values():
                    keys.update((str(t), int(p)) for t, p in _load(data)["partitions"])
                self._last_seen = fresh[-1][0]
        if reload or time.monotonic() >= self._next_full_read:
            self._next_full_read = time.monotonic() + _FULL_READ_S
            with self._lock:
                keys = set(self._followed)
        else:
            with self._lock:
                keys &= self._followed
        if not keys:
            return
        found = self._client._read_many(_state_path(t, p) for t, p in keys)
        states: list[tuple[PartitionKey, PartitionState | None]] = []
        seen = self._versions
        for key in keys:
            got = found.get(_state_path(*key))
            # A full re-read finds almost every state as it was delivered: compare the
            # znode version before parsing, so the safety net costs little at 10,000.
            if got is not None and seen.get(key) != got[1].version:
                seen[key] = got[1].version
                states.append((key, _parse_state(*got)))
        with self._lock:
            first = not self._ready
            self._ready.extend(states)
        if first and states:
            self._deliver()


class _MultiRead(namedtuple("_MultiRead", "paths")):
    """ZooKeeper's ``multiRead`` (opcode 22, ZooKeeper 3.6+): many ``getData`` in one
    request, which kazoo does not offer. Answers one ``(data, stat)`` or exception per
    path, in order. Wire format: like a multi-op, a ``MultiHeader`` (type, done, err)
    before each ``GetDataRequest`` (path, watch flag) and each answer."""

    type = 22

    def serialize(self) -> bytearray:
        out = bytearray()
        for path in self.paths:
            out += MultiHeader(_GET_DATA, False, -1).serialize()  # op type, not done, no error
            out += write_string(path) + bool_struct.pack(0)     # path, no watch
        out += multiheader_struct.pack(-1, True, -1)             # the closing header
        return out

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        header, offset = MultiHeader.deserialize(data, offset)
        results: list[Any] = []
        while not header.done:
            if header.type == _GET_DATA:
                value, offset = read_buffer(data, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
                results.append((value or b"", stat))
                offset += stat_struct.size
            elif header.type == -1:
                code = int_struct.unpack_from(data, offset)[0]
                offset += int_struct.size
                results.append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"unexpected multiRead answer type {header.type}")
            header, offset = MultiHeader.deserialize(data, offset)
        return results


def _acl_node(resource_type: str, pattern_type: str, name: str) -> str:
    """A znode name for a resource pattern (group ids may hold any character)."""
    return f"{resource_type}.{pattern_type}.{_b64_node(name)}"


def _b64_node(name: str) -> str:
    """``name`` as a znode name: any character (group ids, user names) made safe."""
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _b64_name(encoded: str) -> str:
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()


def _acl_entries(node: str, data: bytes) -> list[AclEntry]:
    resource_type, pattern_type, encoded = node.split(".", 2)
    name = _b64_name(encoded)
    return [check_binding(AclEntry(resource_type, pattern_type, name, e["principal"],
                                   e["host"], e["operation"], e["permission"]))
            for e in _load(data).get("acls", [])]


def _acl_entry(binding: AclEntry) -> dict[str, str]:
    return {"principal": binding.principal, "host": binding.host,
            "operation": binding.operation, "permission": binding.permission}


def _sequence(name: str) -> int:
    """The sequence number ZooKeeper appended to a sequential znode's name."""
    return int(name[-10:])


def read_znodes(zk: KazooClient, paths: Iterable[str]) -> dict[str, tuple[bytes, Any]]:
    """``(data, stat)`` of every path, in multiRead requests of 500 paths, all sent before
    the first answer is awaited (kazoo sends one request at a time: 10,000 ``get`` calls
    take seconds, 20 multiReads a fraction of one). Paths that do not exist are left out;
    any other failure (connection loss) raises. Needs ZooKeeper 3.6 or later."""
    paths = list(paths)
    pending = []
    for i in range(0, len(paths), _MULTI_READ_PATHS):
        chunk = paths[i:i + _MULTI_READ_PATHS]
        result = zk.handler.async_result()
        zk._call(_MultiRead(chunk), result)
        pending.append((chunk, result))
    out: dict[str, tuple[bytes, Any]] = {}
    for chunk, result in pending:
        for path, answer in zip(chunk, result.get(timeout=_BULK_TIMEOUT_S), strict=True):
            if isinstance(answer, NoNodeError):
                continue
            if isinstance(answer, Exception):
                raise answer
            out[path] = answer
    return out


def _notify(tx: Any, keys: list[PartitionKey]) -> None:
    """Add the change notification of ``keys`` to a multi-op writing their states."""
    tx.create(f"{_STATE_CHANGES}/change-", _dump({"partitions": [list(k) for k in keys]}),
              sequence=True)


def _state_path(topic: str, partition: int) -> str:
    return f"{_TOPICS}/{topic}/partitions/{partition}/state"


def _parse_state(data: bytes, stat: Any) -> PartitionState:
    value = _load(data)
    return PartitionState(int(value["leader"]), int(value["leader_epoch"]),
                          [int(b) for b in value["isr"]], int(value["controller_epoch"]),
                          stat.version)


def _topic(name: str, data: bytes) -> TopicDefinition:
    value = _load(data)
    assignment = {int(p): [int(b) for b in r] for p, r in value["partitions"].items()}
    return TopicDefinition(name, str(value["topic_id"]), dict(sorted(assignment.items())))


def _chunks(states: Mapping[PartitionKey, PartitionState]
            ) -> Iterator[list[tuple[PartitionKey, PartitionState]]]:
    """Split writes into multi-ops below ZooKeeper's request size limit."""
    chunk: list[tuple[PartitionKey, PartitionState]] = []
    size = 0
    for key, state in states.items():
        cost = len(_state_path(*key)) + len(_state_bytes(state)) + 16
        if chunk and (len(chunk) >= _TX_MAX_OPS or size + cost > _TX_MAX_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append((key, state))
        size += cost
    if chunk:
        yield chunk


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

