"""Consumer groups on the client side: the coordinator, membership, commits.

The coordinator computes every member's assignment (KIP-848 style, see
``wire/protocol/apis/groups.py``); a member only has to

* find its group's coordinator (``FindCoordinator`` to any broker) and send every group
  request there. ``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``,
  ``COORDINATOR_LOAD_IN_PROGRESS``, a broken connection and a timeout mean "the
  coordinator moved or is starting": look it up again after ``retry_backoff_ms`` and
  resend the same request (same member id and epoch: a new coordinator reloads the group
  from ``__consumer_offsets`` and keeps its members). ``CoordinatorLink`` does that.
* heartbeat every ``heartbeat_interval_ms`` from a background task, reporting the
  partitions it holds right now (``owned``), and converge to the ``assignment`` of each
  answer: ``owned - assignment`` is revoked, ``assignment - owned`` is added
  (``reconcile``). ``Membership`` is that state, with no I/O, so it is tested without a
  broker; ``GroupMember`` runs it (heartbeat task, commits, committed-offset lookups).
* when the coordinator answers ``UNKNOWN_MEMBER_ID`` or ``FENCED_MEMBER_EPOCH`` the
  member's partitions are already somebody else's: it drops them (the consumer calls
  ``on_lost``) and only then joins again with epoch 0.
* leave the group when the application has not called ``poll`` for
  ``max_poll_interval_ms`` (Kafka's KIP-62; ``PollTimer``): heartbeats run in the
  background, so without it a member whose processing is stuck keeps its partitions
  for ever. The member sends its leave heartbeat (epoch -1; -2 for a static member,
  whose partitions then wait for it until its session times out, as in Kafka), counts
  its partitions as lost (a commit is refused from then on), and its next ``poll``
  calls ``on_lost`` and joins again.

The consumer (``strata.client.consumer``) owns the partitions' positions and runs the
user's callbacks; this module never calls user code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import ClassVar, Final

from strata.client._cluster import Cluster
from strata.client._common import TopicPartition, as_strata_error, error_from_code, is_transient
from wire.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    FencedMemberEpochError,
    NetworkError,
    NotCoordinatorError,
    StaleMemberEpochError,
    StrataError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnstableOffsetCommitError,
)
from wire.protocol import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    NO_MEMBER_EPOCH,
    STATIC_LEAVE_EPOCH,
    ApiKey,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    GroupTopicPartitions,
    Message,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    group_by_topic,
    group_topic_partitions,
)

__all__ = [
    "AutoCommitTimer",
    "CommitFailedError",
    "CoordinatorAddress",
    "CoordinatorLink",
    "GroupMember",
    "Membership",
    "PollTimer",
    "Reconciliation",
    "group_partitions",
    "reconcile",
]

log = logging.getLogger("strata.client.group")

#: Heartbeat interval used until the coordinator says otherwise (the join is sent at once).
_DEFAULT_HEARTBEAT_MS: Final = 3_000
#: Longest a leave heartbeat on close may take: a dead coordinator must not hang close().
LEAVE_TIMEOUT_S: Final = 5.0
#: Longest one broker may take to answer FindCoordinator before the next one is asked.
_FIND_TIMEOUT_S: Final = 5.0
_COORDINATOR_ERRORS: Final = (NotCoordinatorError, CoordinatorNotAvailableError,
                              CoordinatorLoadInProgressError, NetworkError, TimeoutError)
_MEMBER_GONE: Final = (UnknownMemberIdError, FencedMemberEpochError)


class CommitFailedError(StrataError):
    """Offsets were not committed, and retrying the same commit will not help.

    Raised by ``Consumer.commit`` (and a failed asynchronous commit) when the member is
    no longer in its group (its session timed out, it was fenced, or another instance
    with its ``group_instance_id`` replaced it: its partitions belong to other members
    now, which will process the uncommitted records again), when a partition is not the
    member's any more (``STALE_MEMBER_EPOCH``: it moved in a rebalance), or when the
    consumer has not joined its group yet. ``failed`` maps each partition that was not
    committed to the broker's error; ``committed`` holds the ones that were.
    """

    code: ClassVar[int] = 1300
    name: ClassVar[str] = "COMMIT_FAILED"

    def __init__(self, message: str, *,
                 failed: Mapping[TopicPartition, StrataError] | None = None,
                 committed: Mapping[TopicPartition, int] | None = None) -> None:
        super().__init__(message)
        self.failed: dict[TopicPartition, StrataError] = dict(failed or {})
        self.committed: dict[TopicPartition, int] = dict(committed or {})


# ----------------------------------------------------------------------------- pure logic


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What a member must do to reach its assignment: give up ``revoke`` first, then
    take ``assign``."""

    revoke: frozenset[TopicPartition] = frozenset()
    assign: frozenset[TopicPartition] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.revoke or self.assign)


def reconcile(owned: Set[TopicPartition], assignment: Set[TopicPartition] | None
              ) -> Reconciliation:
    """``owned - assignment`` must be revoked, ``assignment - owned`` is new.

    ``assignment`` None: the coordinator has not answered yet, nothing to do.
    """
    if assignment is None:
        return Reconciliation()
    return Reconciliation(frozenset(owned - assignment), frozenset(assignment - owned))


def group_partitions(partitions: Iterable[TopicPartition]) -> list[GroupTopicPartitions]:
    """Partitions in the wire shape, topics and partitions sorted."""
    return group_topic_partitions(partitions)


def _flatten(topics: Iterable[GroupTopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(t.topic, p) for t in topics for p in t.partitions)


class AutoCommitTimer:
    """When the next auto-commit is due: ``interval_ms`` after the previous one."""

    def __init__(self, interval_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_ms / 1000
        self.clock = clock
        self.next_at = clock() + self.interval_s

    def due(self) -> bool:
        return self.clock() >= self.next_at

    def reset(self) -> None:
        self.next_at = self.clock() + self.interval_s


class PollTimer:
    """How long the application has gone without calling ``poll`` (KIP-62). No I/O.

    ``enter``/``exit`` bracket each ``poll`` call (a poll waiting for records, and the
    group callbacks it runs, is the application polling); outside them the clock runs
    from the last ``exit``. ``expired`` once it ran ``max_poll_interval_ms``. Written by
    the thread that polls, read by the heartbeat task: plain attribute writes, each
    atomic under the GIL, and one writer.
    """

    __slots__ = ("_depth", "_last", "clock", "interval_ms")

    def __init__(self, interval_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_ms = interval_ms
        self.clock = clock
        self._depth = 0
        self._last = clock()

    def enter(self) -> None:
        self._depth += 1
        self._last = self.clock()

    def exit(self) -> None:
        self._depth = max(self._depth - 1, 0)
        self._last = self.clock()

    def reset(self) -> None:
        """The clock starts again (``subscribe``: the member has not had records yet)."""
        self._last = self.clock()

    def remaining_s(self) -> float:
        """Seconds until the interval runs out (the whole interval while polling)."""
        if self._depth:
            return self.interval_ms / 1000
        return self.interval_ms / 1000 - (self.clock() - self._last)

    def expired(self) -> bool:
        return self.remaining_s() <= 0


@dataclass(slots=True)
class Membership:
    """A member's place in its group, as its heartbeats taught it. No I/O.

    ``owned`` is what the consumer holds now (positions it may fetch and commit);
    ``target`` the coordinator's latest ``assignment`` (None before the first answer).
    ``lost``: the coordinator removed the member; the consumer must drop ``owned``
    (``on_lost``) and call ``rejoin`` before the next heartbeat. ``incarnation`` counts
    joins, so an answer to a heartbeat of an earlier incarnation is ignored.
    ``closing``: the consumer is giving everything up (close/unsubscribe: final commit,
    ``on_revoke``); heartbeats go on, reporting what it still holds, so its session
    does not expire while it finishes, but no new assignment is taken. ``leaving``: the
    leave request is being sent; heartbeats stop.
    """

    group_id: str
    instance_id: str | None = None
    session_timeout_ms: int = -1
    rebalance_timeout_ms: int = 60_000
    assignor: str = "cooperative-sticky"
    subscription: tuple[str, ...] = ()
    member_id: str | None = None
    member_epoch: int = JOIN_EPOCH
    heartbeat_interval_ms: int = _DEFAULT_HEARTBEAT_MS
    target: frozenset[TopicPartition] | None = None
    owned: set[TopicPartition] = field(default_factory=set)
    taking: set[TopicPartition] = field(default_factory=set)
    lost: bool = False
    lost_reason: str = ""
    leaving: bool = False
    closing: bool = False
    fatal: StrataError | None = None
    incarnation: int = 0

    @property
    def joined(self) -> bool:
        """The coordinator knows this member (it may commit with its id and epoch)."""
        return self.member_id is not None and not self.lost

    def heartbeat_request(self) -> ConsumerGroupHeartbeatRequest:
        return ConsumerGroupHeartbeatRequest(
            self.group_id, self.member_id, self.member_epoch if self.member_id else JOIN_EPOCH,
            instance_id=self.instance_id, rebalance_timeout_ms=self.rebalance_timeout_ms,
            session_timeout_ms=self.session_timeout_ms,
            subscribed_topics=list(self.subscription), assignor=self.assignor,
            owned=group_partitions(self.reported()))

    def reported(self) -> set[TopicPartition]:
        """What a heartbeat says the member owns: what it holds, what it is taking (an
        ``on_assign`` step in progress) and what the latest answer lets it take at its
        next poll. Reporting only what is applied would let the coordinator hand a
        partition on while this consumer's poll still takes it from an older answer
        (tests/test_group_assignors.py models that race)."""
        if self.closing:
            return set(self.owned) | self.taking  # no poll will take the target any more
        return set(self.owned) | self.taking | set(self.target or ())

    def leave_request(self) -> ConsumerGroupHeartbeatRequest | None:
        """The heartbeat that leaves (None: the member never joined, nothing to leave)."""
        if self.member_id is None or self.lost:
            return None
        epoch = STATIC_LEAVE_EPOCH if self.instance_id is not None else LEAVE_EPOCH
        return ConsumerGroupHeartbeatRequest(
            self.group_id, self.member_id, epoch, instance_id=self.instance_id,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            session_timeout_ms=self.session_timeout_ms,
            subscribed_topics=list(self.subscription), assignor=self.assignor, owned=[])

    def on_heartbeat(self, response: ConsumerGroupHeartbeatResponse) -> None:
        """Take a successful answer (``error_code`` 0)."""
        if response.member_id:
            self.member_id = response.member_id
        self.member_epoch = response.member_epoch
        if response.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = response.heartbeat_interval_ms
        self.target = _flatten(response.assignment)

    def fence(self, reason: str) -> None:
        """The coordinator no longer has this member: every owned partition is lost."""
        if self.lost:
            return
        self.lost = True
        self.lost_reason = reason
        self.target = frozenset()
        self.incarnation += 1

    def rejoin(self) -> None:
        """After the consumer dropped what it owned: join again with epoch 0, keeping
        ``instance_id`` (a static member takes its own place back)."""
        self.owned.clear()
        self.taking.clear()
        self.member_id = None
        self.member_epoch = JOIN_EPOCH
        self.target = None
        self.lost = False
        self.lost_reason = ""
        self.incarnation += 1

    def pending(self) -> Reconciliation:
        if self.closing:
            return Reconciliation()  # close/unsubscribe revokes everything itself
        if self.lost:
            return Reconciliation(frozenset(self.owned | self.taking), frozenset())
        return reconcile(self.owned | self.taking, self.target)

    def has_work(self) -> bool:
        return self.fatal is not None or self.lost or bool(self.pending())

    def commit_identity(self) -> tuple[str, int]:
        """``(member_id, member_epoch)`` to commit with; ``CommitFailedError`` when the
        member is not in the group."""
        if self.lost:
            raise CommitFailedError(
                f"group {self.group_id!r}: this consumer is no longer a member "
                f"({self.lost_reason}); its partitions were given to other members, which "
                "will process the records since the last commit again. Nothing was "
                "committed; the consumer rejoins at its next poll(), and offsets of "
                "partitions it no longer owns must not be committed")
        if self.member_id is None:
            raise CommitFailedError(
                f"group {self.group_id!r}: this consumer has not joined the group yet, so "
                "it owns no partition to commit; poll() until on_assign was called")
        return self.member_id, self.member_epoch


# ----------------------------------------------------------------------------- I/O


@dataclass(frozen=True, slots=True)
class CoordinatorAddress:
    """Where a group's coordinator is: the node id and address of the broker that
    coordinates the group now (``FindCoordinator``'s answer). Not to be confused with
    the broker-side ``GroupCoordinator`` that runs the group."""

    node_id: int
    host: str
    port: int


class CoordinatorLink:
    """Finds a group's coordinator (``key_type`` 0), or a transactional id's (1), and
    sends requests to it, retrying while it moves."""

    def __init__(self, cluster: Cluster, group_id: str, *, request_timeout_ms: int,
                 retry_backoff_ms: int, key_type: int = 0) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.key_type = key_type
        self.request_timeout_s = request_timeout_ms / 1000
        self.retry_backoff_ms = retry_backoff_ms
        self.coordinator: CoordinatorAddress | None = None

    def invalidate(self) -> None:
        self.coordinator = None

    async def find(self, timeout_s: float | None = None) -> CoordinatorAddress:
        """The coordinator (cached until a request says it moved)."""
        if self.coordinator is not None:
            return self.coordinator
        deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None
                                       else timeout_s)
        attempt = 0
        while True:
            try:
                # A broker that is up but hung (SIGSTOP) must not hold the lookup for
                # a whole request timeout while the others could answer.
                response = await asyncio.wait_for(
                    self.cluster.send_any(ApiKey.FIND_COORDINATOR,
                                          FindCoordinatorRequest(self.group_id, self.key_type),
                                          per_broker_timeout_s=min(
                                              self.request_timeout_s, _FIND_TIMEOUT_S),
                                          version=1 if self.key_type else 0),
                    max(deadline - time.monotonic(), 0.001))
                assert isinstance(response, FindCoordinatorResponse)
                if response.error_code == 0:
                    self.coordinator = CoordinatorAddress(response.node_id, response.host,
                                                          response.port)
                    return self.coordinator
                error = error_from_code(response.error_code, response.error_message)
            except (StrataError, TimeoutError) as err:
                error = as_strata_error(err)
            if not is_transient(error) or time.monotonic() >= deadline:
                if isinstance(error, CoordinatorNotAvailableError):
                    what, topic = ("transactional id", "__transaction_state") \
                        if self.key_type else ("group", "__consumer_offsets")
                    raise CoordinatorNotAvailableError(
                        f"{what} {self.group_id!r}: no broker coordinates it yet "
                        f"({error.message}); check that the brokers are up (strata "
                        f"cluster describe) and that {topic} has live leaders")
                raise error
            await self._backoff(attempt, deadline)
            attempt += 1

    async def _backoff(self, attempt: int, deadline: float) -> None:
        pause = min(self.retry_backoff_ms * (2 ** min(attempt, 4)), 1000) / 1000
        await asyncio.sleep(max(min(pause, deadline - time.monotonic()), 0))

    async def request(self, api: ApiKey, body: Message, *, timeout_s: float | None = None,
                      check: Callable[[Message], StrataError | None] | None = None,
                      attempt_timeout_s: float | None = None, version: int = 0) -> Message:
        """Send ``body`` to the coordinator and return its answer.

        ``check`` returns the error an answer carries (None: none). Coordinator errors,
        lost connections and timeouts (and any other retriable error) are retried with
        the coordinator looked up again, until ``timeout_s`` (default: the request
        timeout); anything else is raised. One attempt waits at most
        ``attempt_timeout_s`` (default: the request timeout).
        """
        per_attempt = self.request_timeout_s if attempt_timeout_s is None \
            else attempt_timeout_s
        deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None
                                       else timeout_s)
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                coordinator = await self.find(remaining)
                connection = await self.cluster.connection_to((coordinator.host,
                                                               coordinator.port))
                response = await asyncio.wait_for(
                    connection.request(api, body, version=version),
                    min(remaining, per_attempt))
                error = check(response) if check is not None else None
                if error is None:
                    return response
            except (StrataError, TimeoutError) as err:
                error = as_strata_error(err)
            if not is_transient(error):
                raise error
            log.debug("group %s: %s to the coordinator failed, retrying: %s", self.group_id,
                      api.name, error)
            self.invalidate()
            if time.monotonic() >= deadline:
                raise error
            await self._backoff(attempt, deadline)
            attempt += 1

    async def commit(self, member_id: str | None, member_epoch: int,
                     offsets: Mapping[TopicPartition, int], *, timeout_s: float | None = None,
                     metadata: str | None = None
                     ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, StrataError]]:
        """``OffsetCommit``; retriable per-partition errors are retried until the
        timeout (not ``UNKNOWN_TOPIC_OR_PARTITION``: a deleted topic's partition is
        reported as failed at once). Returns ``(committed, failed)``; nothing is raised
        for a partition."""
        deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None
                                       else timeout_s)
        pending = dict(offsets)
        committed: dict[TopicPartition, int] = {}
        failed: dict[TopicPartition, StrataError] = {}
        attempt = 0
        while pending:
            by_topic = group_by_topic(
                (tp.topic, OffsetCommitPartition(tp.partition, offset, metadata))
                for tp, offset in sorted(pending.items()))
            request = OffsetCommitRequest(
                self.group_id, member_id, member_epoch,
                [OffsetCommitTopic(t, ps) for t, ps in by_topic.items()])
            try:
                response = await self.request(
                    ApiKey.OFFSET_COMMIT, request,
                    timeout_s=max(deadline - time.monotonic(), 0.001),
                    check=_commit_coordinator_error)
            except StrataError as err:
                failed.update(dict.fromkeys(pending, err))
                break
            assert isinstance(response, OffsetCommitResponse)
            retry: dict[TopicPartition, StrataError] = {}
            for topic in response.topics:
                for answer in topic.partitions:
                    tp = TopicPartition(topic.name, answer.partition)
                    if tp not in pending:
                        continue
                    if answer.error_code == 0:
                        committed[tp] = pending.pop(tp)
                        continue
                    error = error_from_code(answer.error_code, answer.error_message)
                    # UNKNOWN_TOPIC_OR_PARTITION: the topic was deleted; retrying would
                    # only stall the caller (poll, close) until the timeout.
                    if is_transient(error) and not isinstance(
                            error, StaleMemberEpochError | UnknownTopicOrPartitionError):
                        retry[tp] = error
                    else:
                        failed[tp] = error
                        del pending[tp]
            for tp in pending:
                retry.setdefault(tp, NetworkError(f"{tp}: the coordinator's answer left it "
                                                  "out"))
            if not pending:
                break
            if time.monotonic() >= deadline:
                failed.update(retry)
                break
            await self._backoff(attempt, deadline)
            attempt += 1
        return committed, failed

    async def fetch_offsets(self, partitions: Iterable[TopicPartition] | None, *,
                            timeout_s: float | None = None,
                            require_stable: bool = False) -> OffsetFetchResponse:
        """``OffsetFetch`` (``None``: every partition the group committed).
        ``require_stable``: a partition whose offsets wait in an open transaction answers
        UNSTABLE_OFFSET_COMMIT instead of the offset committed before it (version 1)."""
        request = OffsetFetchRequest(
            self.group_id, None if partitions is None else group_partitions(partitions),
            require_stable=require_stable)
        response = await self.request(ApiKey.OFFSET_FETCH, request, timeout_s=timeout_s,
                                      check=_top_level_error,
                                      version=1 if require_stable else 0)
        assert isinstance(response, OffsetFetchResponse)
        return response

    async def committed(self, partitions: Iterable[TopicPartition], *,
                        timeout_s: float | None = None,
                        require_stable: bool = False) -> dict[TopicPartition, int | None]:
        """The committed offset per partition (None: nothing committed).

        ``require_stable`` (a read_committed consumer, KIP-447): offsets a transaction
        is still committing are waited for, so a consumer taking over a partition from a
        transactional producer starts after that producer's last transaction, not
        before it. Raises UnstableOffsetCommitError when they stay pending past
        ``timeout_s``."""
        wanted = list(partitions)
        out: dict[TopicPartition, int | None] = dict.fromkeys(wanted)
        deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None
                                       else timeout_s)
        attempt = 0
        while wanted:
            response = await self.fetch_offsets(
                wanted, timeout_s=max(deadline - time.monotonic(), 0.001),
                require_stable=require_stable)
            unstable: list[TopicPartition] = []
            for topic in response.topics:
                for answer in topic.partitions:
                    tp = TopicPartition(topic.name, answer.partition)
                    if tp not in out:
                        continue
                    if answer.error_code == UnstableOffsetCommitError.code:
                        unstable.append(tp)
                    elif answer.error_code:
                        raise error_from_code(answer.error_code, None)
                    else:
                        out[tp] = answer.offset if answer.offset >= 0 else None
            if not unstable:
                break
            if time.monotonic() >= deadline:
                raise UnstableOffsetCommitError(
                    f"group {self.group_id}: offsets of {sorted(unstable)} are still being "
                    "committed by an open transaction; retry, or raise the timeout")
            await self._backoff(attempt, deadline)
            attempt += 1
            wanted = unstable
        return out


def _top_level_error(response: Message) -> StrataError | None:
    code = getattr(response, "error_code", 0)
    return error_from_code(code, getattr(response, "error_message", None)) if code else None


def _commit_coordinator_error(response: Message) -> StrataError | None:
    """A group-level coordinator error repeated on every partition (then the whole
    request goes to the coordinator again); per-partition errors are the caller's."""
    assert isinstance(response, OffsetCommitResponse)
    for topic in response.topics:
        for answer in topic.partitions:
            if answer.error_code:
                error = error_from_code(answer.error_code, answer.error_message)
                if isinstance(error, _COORDINATOR_ERRORS):
                    return error
    return None


def member_gone_reason(error: StrataError, instance_id: str | None) -> str:
    if isinstance(error, FencedMemberEpochError):
        return f"{error.name}: the coordinator fenced it, e.g. after its session timed out"
    replaced = (f", or another consumer with group_instance_id {instance_id!r} took its "
                "place") if instance_id else ""
    return f"{error.name}: its session timed out or it left{replaced}"


class GroupMember:
    """Runs a ``Membership``: the heartbeat task, commits, committed-offset lookups.

    ``wakeup`` is called (on the event loop) whenever the consumer has something to do:
    a new assignment, lost partitions, or a fatal error.
    """

    def __init__(self, cluster: Cluster, group_id: str, *, instance_id: str | None,
                 session_timeout_ms: int, rebalance_timeout_ms: int, assignor: str,
                 request_timeout_ms: int, retry_backoff_ms: int,
                 wakeup: Callable[[], None], max_poll_interval_ms: int = 300_000) -> None:
        self.link = CoordinatorLink(cluster, group_id, request_timeout_ms=request_timeout_ms,
                                    retry_backoff_ms=retry_backoff_ms)
        self.membership = Membership(group_id, instance_id, session_timeout_ms,
                                     rebalance_timeout_ms, assignor)
        self.poll_timer = PollTimer(max_poll_interval_ms)
        self.retry_backoff_ms = retry_backoff_ms
        self._wakeup = wakeup
        self._send_now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.commit_lock = asyncio.Lock()

    @property
    def group_id(self) -> str:
        return self.membership.group_id

    def subscribe(self, topics: Iterable[str]) -> None:
        m = self.membership
        m.subscription = tuple(sorted(set(topics)))
        m.leaving = m.closing = False
        m.fatal = None  # a new subscription may be accepted: try again
        if m.lost and not (m.owned or m.taking):
            m.rejoin()  # nothing left for on_lost: join afresh
        self.poll_timer.reset()
        self.heartbeat_now()

    def heartbeat_now(self) -> None:
        """Send the next heartbeat at once (after a revoke or assign, a subscribe, a
        rejoin) instead of after a full interval; (re)starts the heartbeat task."""
        m = self.membership
        if (self._task is None or self._task.done()) and m.subscription and not m.leaving:
            self._task = asyncio.create_task(self._heartbeat_loop(),
                                             name=f"strata-heartbeat-{self.group_id}")
        self._send_now.set()

    def fence(self, error: StrataError) -> None:
        self.membership.fence(member_gone_reason(error, self.membership.instance_id))
        log.warning("group %s: member %s lost its partitions (%s); it rejoins after "
                    "on_lost", self.group_id, self.membership.member_id, error)
        self._wakeup()

    async def _heartbeat_loop(self) -> None:
        m = self.membership
        attempt = 0
        while not self._stopping:
            if m.leaving or m.lost or m.fatal is not None or not m.subscription:
                await self._sleep(3600)  # until poll() finished on_lost and rejoined, etc.
                self._send_now.clear()
                continue
            if not m.closing and self.poll_timer.expired():
                await self._leave_stuck()
                continue
            self._send_now.clear()
            incarnation = m.incarnation
            request = m.heartbeat_request()
            try:
                response = await self.link.request(
                    ApiKey.CONSUMER_GROUP_HEARTBEAT, request, check=_top_level_error,
                    attempt_timeout_s=self._heartbeat_attempt_s())
            except StrataError as err:
                if m.incarnation != incarnation or m.leaving:
                    continue
                if isinstance(err, _MEMBER_GONE):
                    self.fence(err)
                elif is_transient(err):
                    log.info("group %s: heartbeat failed, retrying: %s", self.group_id, err)
                    await self._sleep(min(self.retry_backoff_ms * (2 ** min(attempt, 4)),
                                          m.heartbeat_interval_ms) / 1000)
                    attempt += 1
                else:
                    log.error("group %s: the coordinator refused this member: %s",
                              self.group_id, err)
                    m.fatal = err
                    self._wakeup()
                continue
            except Exception:  # a bug must not silently end the heartbeats (and session)
                log.exception("group %s: heartbeat failed unexpectedly; retrying",
                              self.group_id)
                await self._sleep(m.heartbeat_interval_ms / 1000)
                continue
            attempt = 0
            if m.incarnation != incarnation or m.leaving:
                continue  # answered after a fence, a rejoin or close(): stale
            assert isinstance(response, ConsumerGroupHeartbeatResponse)
            m.on_heartbeat(response)
            if m.pending():
                self._wakeup()
            # Awake when the poll interval runs out, not a heartbeat interval later.
            await self._sleep(min(m.heartbeat_interval_ms / 1000,
                                  max(self.poll_timer.remaining_s(), 0.01)))

    async def _leave_stuck(self) -> None:
        """The application has not polled for ``max_poll_interval_ms``: leave the group
        so that the other members take the partitions (Kafka's KIP-62). The member counts
        as lost from here on (a commit is refused: the partitions are being handed on);
        its next ``poll`` calls ``on_lost`` and rejoins."""
        m = self.membership
        interval = self.poll_timer.interval_ms
        request = m.leave_request()
        static = m.instance_id is not None
        m.fence(f"MAX_POLL_INTERVAL: the application did not call poll() for {interval} ms "
                "(max_poll_interval_ms), so the member left the group")
        log.warning(
            "group %s: member %s leaves the group: the application has not called poll() "
            "for %d ms (max_poll_interval_ms), so its processing of the last records is "
            "stuck or slower than that. %s Make the processing between two polls faster, "
            "return fewer records per poll (max_poll_records) or raise "
            "max_poll_interval_ms; the next poll() calls on_lost and rejoins the group",
            self.group_id, m.member_id, interval,
            f"Its partitions wait for this static member ({m.instance_id}) until its "
            "session times out, then go to the other members." if static else
            "Its partitions go to the group's other members.")
        self._wakeup()
        if request is None:
            return
        try:
            await self.link.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, request,
                                    timeout_s=min(LEAVE_TIMEOUT_S, self.link.request_timeout_s),
                                    check=_top_level_error)
        except StrataError as err:
            log.info("group %s: leaving failed (%s); the coordinator removes the member "
                     "when its session times out", self.group_id, err)

    def _heartbeat_attempt_s(self) -> float:
        """How long one heartbeat may go unanswered before it is sent again (to the
        coordinator looked up again): well inside the session timeout, so a hung
        coordinator (its broker paused) cannot make the member miss its session at the
        one that replaced it.

        Not a join: it has no session to lose yet, and a join sent again while the first
        one is still queued at a busy coordinator would make that coordinator add two
        members (the first one then holds partitions until its session expires, and its
        expiry is one more rebalance): a join waits the whole request timeout."""
        if self.membership.member_id is None:
            return self.link.request_timeout_s
        session_ms = self.membership.session_timeout_ms
        bound = session_ms / 3000 if session_ms > 0 else _FIND_TIMEOUT_S
        return max(min(self.link.request_timeout_s, bound), 0.5)

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds`` or until ``heartbeat_now``. (Not ``wait_for``: on 3.11 it can
        swallow a cancellation that races with the event being set.)"""
        waiter = asyncio.ensure_future(self._send_now.wait())
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()

    async def commit(self, offsets: Mapping[TopicPartition, int], *, member: bool,
                     timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """Commit; ``member``: as the group member (else outside any membership, for a
        manually assigned consumer). Raises ``CommitFailedError`` naming what failed."""
        if not offsets:
            return {}
        async with self.commit_lock:
            if member:
                member_id: str | None
                member_id, epoch = self.membership.commit_identity()
            else:
                member_id, epoch = None, NO_MEMBER_EPOCH
            committed, failed = await self.link.commit(member_id, epoch, offsets,
                                                       timeout_s=timeout_s)
        if not failed:
            return committed
        gone = next((e for e in failed.values() if isinstance(e, _MEMBER_GONE)), None)
        if gone is not None and member:
            if self.membership.member_id == member_id:
                self.fence(gone)
            raise CommitFailedError(
                f"group {self.group_id!r}: offsets not committed: this consumer is no longer "
                f"a member ({member_gone_reason(gone, self.membership.instance_id)}); its "
                "partitions were given to other members, which will process the records "
                "since the last commit again. The consumer rejoins at its next poll()",
                failed=failed, committed=committed)
        listed = ", ".join(f"{tp} ({e.name})" for tp, e in sorted(failed.items()))
        stale = any(isinstance(e, StaleMemberEpochError) for e in failed.values())
        hint = (" A partition with STALE_MEMBER_EPOCH moved to another member in a "
                "rebalance: its offset is that member's to commit now." if stale else "")
        raise CommitFailedError(
            f"group {self.group_id!r}: offsets not committed for {listed}.{hint}",
            failed=failed, committed=committed)

    async def leave(self) -> None:
        """Stop heartbeating and tell the coordinator the member leaves (epoch -1, or -2
        for a static member, whose partitions then wait for it until its session times
        out). Bounded by ``LEAVE_TIMEOUT_S``; a coordinator that does not answer removes
        the member when its session times out."""
        m = self.membership
        m.leaving = True
        await self.stop()
        request = m.leave_request()
        if request is not None:
            try:
                await self.link.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, request,
                                        timeout_s=min(LEAVE_TIMEOUT_S,
                                                      self.link.request_timeout_s),
                                        check=_top_level_error)
            except StrataError as err:
                log.info("group %s: leaving failed (%s); the coordinator removes the "
                         "member when its session times out", self.group_id, err)
        # Out of the group whatever happened (also when it was lost or refused): nothing
        # is left for poll() to do until the next subscribe().
        m.lost = False
        m.lost_reason = ""
        m.fatal = None
        m.member_id = None
        m.member_epoch = JOIN_EPOCH
        m.target = None
        m.owned.clear()
        m.taking.clear()
        m.incarnation += 1

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            self._send_now.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._stopping = False
