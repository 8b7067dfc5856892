"""The Strata consumer: consumer groups or manual assignment, positions, pipelined fetches.

Two faces over one implementation: ``AsyncConsumer`` (asyncio) and ``Consumer`` (blocking;
runs an ``AsyncConsumer`` on its own event-loop thread). Either the caller chooses the
partitions (``assign``, ``seek*``, ``auto_offset_reset``), or the consumer joins a
consumer group (``group_id=...``, ``subscribe``) whose coordinator shares the topics'
partitions among its members (``docs/consumer-groups.md``).

Groups, and why it is built this way:

* Heartbeats run in a background task on the consumer's event loop (``_group.py``), so
  a slow caller does not lose its session; each reports the partitions the consumer
  owns now. The answer's assignment is reached in ``poll``, on the caller's thread:
  ``on_revoke`` for partitions to give up (their positions auto-committed first), then
  ``on_assign`` for new ones (positioned at the group's committed offset, else
  ``auto_offset_reset``, unless the callback seeks), then a heartbeat at once. A member
  the coordinator removed (session expired) gets ``on_lost``, drops everything and
  joins again; its commits raise ``CommitFailedError``.
* At-least-once by default: auto-commit (every ``auto_commit_interval_ms``, inside
  ``poll`` before it hands out new records, and before revocation and ``close``) commits
  only the positions after records ``poll`` already returned. So finish processing a
  poll's records before polling again::

      with Consumer(bootstrap, group_id="billing", auto_offset_reset="earliest") as c:
          c.subscribe(["events"])
          while running:
              for record in c.poll(timeout_ms=1000):
                  process(record)  # done before the next poll(), which commits it

  A blocking ``poll`` interrupted by Ctrl-C puts back the records it had taken but not
  returned, so ``close`` never commits records nobody processed.

How a poll works, and why:

* Every assigned partition has a *position*: the offset of the next record ``poll``
  returns. Buffered, already-decoded records (``_Chunk``) always start exactly at the
  position, so the *fetch offset* of the next request is the end of the buffer.
* Partitions are grouped by leader and each broker gets **one** ``FetchRequest`` covering
  all its eligible partitions, with at most one fetch in flight per broker.
* Fetch pipelining: before ``poll`` returns records it sends the next fetch for every
  broker that has none in flight, starting where the buffer ends. While the caller
  processes the records the broker answers, and the next ``poll`` usually finds data
  already decoded with no round trip left to wait for. A partition is left out of a
  fetch while it already buffers ``max_partition_fetch_bytes`` or more, which bounds the
  memory to about two fetches per partition.
* ``seek`` (and every ``seek_to_*``) bumps the partition's *generation*: buffered data is
  dropped, a not-yet-answered fetch that includes the partition is cancelled (so the new
  position is fetched at once instead of after a long poll), and an answer that does
  arrive for an older generation or fetch offset is discarded.
* The broker returns whole batches starting with the batch that holds the fetch offset;
  ``batches_to_table`` slices records below it away. The broker only serves offsets
  below the high watermark, so only committed records are ever returned.
* ``NOT_LEADER_OR_FOLLOWER``, ``UNKNOWN_TOPIC_OR_PARTITION``, a broken connection, a
  request timeout and other retriable errors are transient: the partition backs off for
  ``retry_backoff_ms``, metadata is refreshed, and ``poll`` keeps going until its
  timeout (returning ``[]`` rather than raising). Anything else is raised from ``poll``.
* ``OFFSET_OUT_OF_RANGE`` (and an unknown position after ``assign``) applies
  ``auto_offset_reset``: ``"earliest"`` / ``"latest"`` re-resolve the position with
  ``ListOffsets``; ``"none"`` raises ``OffsetOutOfRangeError`` carrying the valid range.

Arrow: ``poll_arrow`` returns a ``pyarrow.Table`` in ``CONSUMER_SCHEMA`` (Spark's Kafka
source columns) built column-wise: topic/partition/offset columns come from Arrow's
``repeat``/``arange``, never from a per-record Python loop. ``poll`` is the same table
turned into ``ConsumerRecord`` tuples, so the two are equivalent by construction.

Layering (DESIGN-NOTES §9): this module imports only the record-batch codec, the
protocol definitions, the error table and the client core.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, ParamSpec, TypeAlias, TypeVar, overload

import pyarrow as pa

from strata.client._cluster import Cluster
from strata.client._common import (
    TopicPartition,
    as_strata_error,
    error_from_code,
    is_transient,
    topic_partitions,
)
from strata.client._group import (
    ASSIGNORS,
    AutoCommitTimer,
    CommitFailedError,
    GroupMember,
)
from strata.client._sync import EventLoopThread
from wire.errors import (
    NetworkError,
    OffsetOutOfRangeError,
    StrataError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ApiKey,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
)
from wire.record_batch import CONSUMER_SCHEMA, TimestampType, batches_to_table

__all__ = [
    "AsyncConsumer",
    "CommitFailedError",
    "Consumer",
    "ConsumerRecord",
    "CommitCallback",
    "OffsetResetStrategy",
    "OffsetsToCommit",
    "PartitionsCallback",
    "TopicPartition",
    "error_from_code",
    "is_transient",
]

log = logging.getLogger("strata.client.consumer")

OffsetResetStrategy: TypeAlias = Literal["earliest", "latest", "none"]
_RESET_STRATEGIES: Final = ("earliest", "latest", "none")
_TIMESTAMP_TYPES: Final = {int(t): t for t in TimestampType}

#: ``on_assign`` / ``on_revoke`` / ``on_lost``: called with a set of partitions. On an
#: ``AsyncConsumer`` it may also be a coroutine function (awaited inside ``poll``).
PartitionsCallback: TypeAlias = Callable[[set[TopicPartition]], Any]
#: ``commit(offsets)``: per partition, the offset of the next record to process.
OffsetsToCommit: TypeAlias = Mapping[TopicPartition, int] | Mapping[tuple[str, int], int]
#: ``commit(asynchronous=True, callback=...)``: ``callback(offsets, error)``, error None
#: on success.
CommitCallback: TypeAlias = Callable[[dict[TopicPartition, int], StrataError | None], Any]

T = TypeVar("T")
P = ParamSpec("P")


class ConsumerRecord(NamedTuple):
    """One record as ``poll`` returns it.

    ``timestamp`` is milliseconds since the epoch: the producer's create time, or the
    broker's append time when ``timestamp_type`` is ``LOG_APPEND_TIME``. ``headers`` is a
    list of ``(key, value)`` pairs (empty when the record has none).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


# ----------------------------------------------------------------------------- helpers


async def list_offsets_once(
    cluster: Cluster, specs: Mapping[TopicPartition, int], timeout_s: float
) -> dict[TopicPartition, ListOffsetsPartitionResponse | StrataError]:
    """One ``ListOffsets`` round per leader, in parallel; per-partition answer or error.

    ``specs`` maps a partition to ``EARLIEST_TIMESTAMP``, ``LATEST_TIMESTAMP`` or a
    timestamp in ms. Nothing is retried here: callers decide what is transient.
    """
    out: dict[TopicPartition, ListOffsetsPartitionResponse | StrataError] = {}
    by_leader: dict[int, list[TopicPartition]] = {}
    for tp in specs:
        try:
            leader = await cluster.leader_for(tp.topic, tp.partition)
        except StrataError as err:
            out[tp] = err
            continue
        by_leader.setdefault(leader, []).append(tp)

    async def ask(node: int, tps: list[TopicPartition]) -> None:
        topics: dict[str, list[ListOffsetsPartition]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(ListOffsetsPartition(tp.partition, specs[tp]))
        request = ListOffsetsRequest([ListOffsetsTopic(t, ps) for t, ps in topics.items()])
        try:
            connection = await cluster.connection(node)
            response = await asyncio.wait_for(
                connection.request(ApiKey.LIST_OFFSETS, request), timeout_s)
        except (StrataError, TimeoutError) as err:
            for tp in tps:
                out[tp] = as_strata_error(err)
            return
        assert isinstance(response, ListOffsetsResponse)
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                if tp in specs:
                    out[tp] = answer if answer.error_code == 0 else \
                        error_from_code(answer.error_code, answer.error_message)
        for tp in tps:
            out.setdefault(tp, NetworkError(f"{tp}: the broker's answer left it out"))

    await asyncio.gather(*(ask(node, tps) for node, tps in by_leader.items()))
    return out


async def list_offsets(
    cluster: Cluster, specs: Mapping[TopicPartition, int], *, timeout_s: float
) -> dict[TopicPartition, ListOffsetsPartitionResponse]:
    """``ListOffsets`` with retries: transient errors (leader moved, connection lost,
    broker still loading the partition) are retried with a metadata refresh and back-off
    until ``timeout_s``; a topic or partition missing from the cluster's metadata and any
    non-retriable error are raised at once, typed."""
    deadline = time.monotonic() + timeout_s
    pending = dict(specs)
    results: dict[TopicPartition, ListOffsetsPartitionResponse] = {}
    attempt = 0
    refreshed = False
    while pending:
        remaining = max(deadline - time.monotonic(), 0.001)
        answers = await list_offsets_once(cluster, pending, remaining)
        last_error: StrataError | None = None
        for tp, answer in answers.items():
            if isinstance(answer, ListOffsetsPartitionResponse):
                results[tp] = answer
                del pending[tp]
                continue
            if not is_transient(answer):
                raise answer
            if isinstance(answer, UnknownTopicOrPartitionError) and refreshed and \
                    tp.partition not in cluster.topics.get(tp.topic, {}):
                raise answer  # fresh metadata agrees: the topic or partition does not exist
            last_error = answer
        if not pending:
            break
        if time.monotonic() >= deadline:
            assert last_error is not None
            raise last_error
        if attempt:  # the first retry only refreshes metadata; later ones back off too
            await cluster.backoff(attempt)
        attempt += 1
        with contextlib.suppress(StrataError, TimeoutError):
            await cluster.refresh(sorted({tp.topic for tp in pending}))
            refreshed = True
    return results


# ----------------------------------------------------------------------------- state


@dataclass(slots=True, eq=False)
class _Chunk:
    """Decoded records of one fetch answer for one partition, not yet all returned."""

    table: pa.Table
    end_offset: int  # offset after the last record in ``table``
    wire_bytes: int
    index: int = 0  # next row to hand out

    @property
    def remaining(self) -> int:
        return int(self.table.num_rows) - self.index

    @property
    def remaining_bytes(self) -> int:
        return self.wire_bytes * self.remaining // max(int(self.table.num_rows), 1)


@dataclass(slots=True, eq=False)
class _PartitionState:
    position: int | None = None  # None: resolve (committed offset, auto_offset_reset)
    use_committed: bool = False  # resolve from the group's committed offset first
    generation: int = 0  # bumped by every seek: older fetch answers are discarded
    chunks: deque[_Chunk] = field(default_factory=deque)
    retry_at: float = 0.0  # monotonic time before which the partition is backing off
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1

    def fetch_offset(self) -> int | None:
        """Where the next fetch starts: after whatever is already buffered."""
        return self.chunks[-1].end_offset if self.chunks else self.position

    def buffered_bytes(self) -> int:
        return sum(c.remaining_bytes for c in self.chunks)

    def reposition(self, position: int | None) -> None:
        self.position = position
        self.chunks.clear()
        self.generation += 1
        self.retry_at = 0.0


@dataclass(slots=True, eq=False)
class _InFlight:
    node: int
    task: asyncio.Task[FetchResponse]
    specs: dict[TopicPartition, tuple[int, int]]  # tp -> (fetch offset, generation)


def _check_group_options(group_id: str | None, instance_id: str | None,
                         session_timeout_ms: int, rebalance_timeout_ms: int, assignor: str,
                         enable_auto_commit: bool, auto_commit_interval_ms: int) -> None:
    """``ValueError`` naming the option, before anything is sent."""
    if group_id is not None and (not isinstance(group_id, str) or not group_id.strip()):
        raise ValueError(f"group_id={group_id!r} is not valid; give a non-empty name")
    if instance_id is not None:
        if group_id is None:
            raise ValueError("group_instance_id needs a group_id: it names this member "
                             "inside a group")
        if not isinstance(instance_id, str) or not instance_id.strip():
            raise ValueError(f"group_instance_id={instance_id!r} is not valid; give a "
                             "non-empty name, unique per consumer of the group")
    if not isinstance(session_timeout_ms, int) or (session_timeout_ms != -1
                                                   and session_timeout_ms < 1):
        raise ValueError(f"session_timeout_ms={session_timeout_ms!r} is not valid; use ms "
                         ">= 1, or -1 for the broker's group.session.timeout.ms")
    if not isinstance(rebalance_timeout_ms, int) or rebalance_timeout_ms < 1:
        raise ValueError(f"rebalance_timeout_ms={rebalance_timeout_ms!r} is not valid; use "
                         "ms >= 1")
    if assignor not in ASSIGNORS:
        raise ValueError(f"assignor={assignor!r} is not valid; use one of "
                         f"{', '.join(ASSIGNORS)}")
    if not isinstance(enable_auto_commit, bool):
        raise ValueError(f"enable_auto_commit={enable_auto_commit!r} is not valid; use True "
                         "or False")
    if not isinstance(auto_commit_interval_ms, int) or auto_commit_interval_ms < 1:
        raise ValueError(f"auto_commit_interval_ms={auto_commit_interval_ms!r} is not "
                         "valid; use ms >= 1")


@dataclass(frozen=True, slots=True)
class _GroupEvent:
    """A rebalance step whose callback the caller's thread runs inside ``poll``."""

    kind: Literal["assign", "revoke", "lost"]
    partitions: frozenset[TopicPartition]
    callback: PartitionsCallback | None


@dataclass(slots=True, eq=False)
class _MergedCommit:
    """Asynchronous commits asked for while another was on its way, sent as one."""

    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    outcome: asyncio.Future[dict[TopicPartition, int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def __post_init__(self) -> None:
        self.outcome.add_done_callback(lambda f: f.cancelled() or f.exception())


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (it is reported another way)."""
    if not task.cancelled():
        task.exception()


def records_from_table(table: pa.Table) -> list[ConsumerRecord]:
    """Rows of a ``CONSUMER_SCHEMA`` table as ``ConsumerRecord`` tuples."""
    if table.num_rows == 0:
        return []
    cols = table.to_pydict()
    return [
        ConsumerRecord(topic, partition, offset, ts, _TIMESTAMP_TYPES[ts_type], key, value,
                       [(h["key"], h["value"]) for h in headers] if headers else [])
        for key, value, topic, partition, offset, ts, ts_type, headers in zip(
            cols["key"], cols["value"], cols["topic"], cols["partition"], cols["offset"],
            cols["timestamp"], cols["timestampType"], cols["headers"], strict=True)
    ]


# ----------------------------------------------------------------------------- async face


class AsyncConsumer:
    """asyncio consumer: manual assignment or a consumer group. Use on one event loop;
    close() when done.

    Parameters (Kafka's names where Kafka has the knob):

    ``bootstrap``: ``"host:port[,host:port]"`` or a list of them.
    ``auto_offset_reset``: where to start when a partition has no position yet or its
    position is out of range: ``"earliest"``, ``"latest"`` (default, as in Kafka) or
    ``"none"`` (raise ``OffsetOutOfRangeError`` with the valid range).
    ``fetch_min_bytes`` / ``fetch_max_wait_ms``: the broker holds a fetch until this many
    bytes are available or this long has passed (long poll; it wakes as soon as data
    arrives). ``max_partition_fetch_bytes`` / ``fetch_max_bytes``: per-partition and
    per-request response size limits (the broker always returns at least one whole
    batch, so an oversized batch cannot stall the consumer). ``max_poll_records``: the
    default ``max_records`` of ``poll``. ``request_timeout_ms``: how long a request may
    go unanswered (a fetch gets ``fetch_max_wait_ms`` on top). ``retry_backoff_ms``:
    pause before retrying a partition after a transient error.

    Groups (``subscribe``; see ``docs/consumer-groups.md``): ``group_id`` names the
    group; ``group_instance_id`` makes the member static (a restart within the session
    timeout keeps its partitions, no rebalance); ``session_timeout_ms`` (-1: the
    broker's ``group.session.timeout.ms``) is how long the coordinator waits for a
    heartbeat before it gives the member's partitions away; ``rebalance_timeout_ms``
    bounds how long ``on_revoke`` may take; ``assignor``: ``"cooperative-sticky"``
    (default: only moving partitions are revoked) or ``"range"`` (eager).
    ``enable_auto_commit`` (default on, with a ``group_id``) commits, every
    ``auto_commit_interval_ms`` inside ``poll`` and before partitions are revoked or the
    consumer closes, the positions of the records ``poll`` has returned: processing a
    poll's records must be finished before the next ``poll``.
    """

    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        client_id: str = "strata-consumer",
        auto_offset_reset: OffsetResetStrategy = "latest",
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        max_partition_fetch_bytes: int = 1 << 20,
        fetch_max_bytes: int = 50 << 20,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        session_timeout_ms: int = -1,
        rebalance_timeout_ms: int = 60_000,
        assignor: str = "cooperative-sticky",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
    ) -> None:
        _check_group_options(group_id, group_instance_id, session_timeout_ms,
                             rebalance_timeout_ms, assignor, enable_auto_commit,
                             auto_commit_interval_ms)
        if auto_offset_reset not in _RESET_STRATEGIES:
            raise ValueError(f"auto_offset_reset={auto_offset_reset!r} is not valid; use one "
                             f"of {', '.join(_RESET_STRATEGIES)}")
        for name, value, low in (("fetch_min_bytes", fetch_min_bytes, 0),
                                 ("fetch_max_wait_ms", fetch_max_wait_ms, 0),
                                 ("max_partition_fetch_bytes", max_partition_fetch_bytes, 1),
                                 ("fetch_max_bytes", fetch_max_bytes, 1),
                                 ("max_poll_records", max_poll_records, 1),
                                 ("request_timeout_ms", request_timeout_ms, 1),
                                 ("retry_backoff_ms", retry_backoff_ms, 0)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is not valid; use an integer >= {low}")
        self.auto_offset_reset: OffsetResetStrategy = auto_offset_reset
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_poll_records = max_poll_records
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._cluster = Cluster(bootstrap, client_id=client_id,
                                request_timeout_ms=request_timeout_ms,
                                retry_backoff_ms=retry_backoff_ms)
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._inflight: dict[int, _InFlight] = {}
        self._inflight_tps: dict[TopicPartition, int] = {}
        self._errors: list[StrataError] = []
        self._metadata_due = True
        self._metadata_next_at = 0.0
        self._rotation = 0
        self._fetch_requests_sent = 0
        self._closed = False
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.assignor = assignor
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._mode: Literal["assign", "subscribe"] | None = None
        self._wakeup = asyncio.Event()
        self._group: GroupMember | None = None
        if group_id is not None:
            self._group = GroupMember(
                self._cluster, group_id, instance_id=group_instance_id,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms, assignor=assignor,
                request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
                wakeup=self._wakeup.set)
        self._on_assign: PartitionsCallback | None = None
        self._on_revoke: PartitionsCallback | None = None
        self._on_lost: PartitionsCallback | None = None
        self._auto_commit = AutoCommitTimer(auto_commit_interval_ms)
        self._auto_commit_task: asyncio.Task[None] | None = None
        self._last_committed: dict[TopicPartition, int] = {}
        self._async_commit_errors: list[StrataError] = []
        self._async_commits: set[asyncio.Task[dict[TopicPartition, int]]] = set()
        self._async_next: _MergedCommit | None = None  # not sent yet (see _commit_in_background)
        self._async_sender: asyncio.Task[None] | None = None
        self._commit_callbacks: deque[tuple[CommitCallback, dict[TopicPartition, int],
                                            StrataError | None]] = deque()
        self._undelivered: pa.Table | None = None
        self._before_drain: dict[TopicPartition, int] = {}  # positions before the last poll
        self._last_poll_abandoned = False

    # ------------------------------------------------------------------ assignment
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment. Partitions that stay assigned keep their position and
        buffered records; new ones start without a position (``auto_offset_reset``)."""
        self._check_open()
        if self._mode == "subscribe":
            raise RuntimeError("this consumer subscribed to topics of group "
                               f"{self.group_id!r}: its partitions come from the group, so "
                               "assign() cannot be used; use one consumer per way of "
                               "assigning, or unsubscribe() first")
        tps = topic_partitions(partitions)
        self._mode = "assign" if tps else None
        self._states = {tp: self._states.get(tp) or
                        _PartitionState(use_committed=self.group_id is not None) for tp in tps}
        self._cancel_fetches(None)
        self._errors.clear()
        self._metadata_due = True
        self._metadata_next_at = 0.0

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads: what ``assign`` gave, or what the group
        gave it (``on_assign`` has run for them, ``on_revoke`` not yet)."""
        return set(self._states)

    def subscribe(self, topics: str | Iterable[str], *,
                  on_assign: PartitionsCallback | None = None,
                  on_revoke: PartitionsCallback | None = None,
                  on_lost: PartitionsCallback | None = None) -> None:
        """Join the group (``group_id``) and read the partitions of ``topics`` it gives
        this consumer; a second call replaces the topics and callbacks.

        The callbacks run inside ``poll`` (on the caller's thread), never concurrently
        with the caller's processing. ``on_revoke(partitions)``: the partitions are about
        to go to another member; with auto-commit their positions were committed just
        before, and the callback may commit too (``commit()``). ``on_assign(partitions)``:
        new partitions; they start at the group's committed offset (else
        ``auto_offset_reset``) unless the callback ``seek``s. ``on_lost(partitions)``
        (default: ``on_revoke``): the coordinator already gave them away (the session
        timed out); committing them would fail. Callbacks with an empty set are skipped.
        """
        self._check_open()
        if self._group is None:
            raise ValueError("subscribe() needs a consumer group: create the consumer with "
                             "group_id=\"...\" (or use assign() for manual assignment)")
        if self._mode == "assign":
            raise RuntimeError("this consumer has partitions from assign(); subscribe() and "
                               "assign() cannot be mixed: call assign([]) first or use "
                               "another consumer")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or any(not isinstance(t, str) or not t for t in names):
            raise ValueError(f"subscribe() expects one or more topic names, got {topics!r}")
        for name, callback in (("on_assign", on_assign), ("on_revoke", on_revoke),
                               ("on_lost", on_lost)):
            if callback is not None and not callable(callback):
                raise ValueError(f"{name} must be callable, got {callback!r}")
        self._mode = "subscribe"
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        self._group.subscribe(names)

    def subscription(self) -> set[str]:
        """The subscribed topics (empty when not subscribed)."""
        if self._mode != "subscribe" or self._group is None:
            return set()
        return set(self._group.membership.subscription)

    async def unsubscribe(self) -> None:
        """Leave the group: commit (with auto-commit), ``on_revoke``, leave heartbeat."""
        if self._mode != "subscribe":
            return
        await self._leave_group()
        self._mode = None

    @property
    def member_id(self) -> str | None:
        """The id the coordinator gave this member (None: not in the group now)."""
        return self._group.membership.member_id if self._group is not None else None

    @property
    def member_epoch(self) -> int:
        return self._group.membership.member_epoch if self._group is not None else -1

    def _state(self, tp: TopicPartition | tuple[str, int]) -> _PartitionState:
        state = self._states.get(TopicPartition(*tp))
        if state is None:
            raise ValueError(f"{tp[0]}-{tp[1]} is not assigned to this consumer; assign() it "
                             "first")
        return state

    def _targets(self, partitions: Iterable[TopicPartition | tuple[str, int]] | None
                 ) -> list[TopicPartition]:
        if partitions is None:
            return list(self._states)
        tps = topic_partitions(partitions)
        for tp in tps:
            self._state(tp)
        return tps

    # ------------------------------------------------------------------ positions
    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Make ``offset`` the next record ``poll`` returns for ``partition``.

        No round trip: an offset outside the log is found by the next fetch and handled
        by ``auto_offset_reset``.
        """
        self._check_open()
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset {offset!r} is not valid; use an integer >= 0")
        tp = TopicPartition(*partition)
        state = self._state(tp)
        state.reposition(offset)
        state.use_committed = False
        self._cancel_fetches({tp})

    async def seek_to_beginning(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, int]:
        """Seek to the log start offset (all assigned partitions by default).

        Resolved now with one ``ListOffsets`` per leader; returns the new positions.
        """
        return await self._seek_to({tp: EARLIEST_TIMESTAMP for tp in self._targets(partitions)})

    async def seek_to_end(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, int]:
        """Seek to the high watermark: only records produced from now on are returned."""
        return await self._seek_to({tp: LATEST_TIMESTAMP for tp in self._targets(partitions)})

    async def seek_to_timestamp(
            self,
            partitions: Iterable[TopicPartition | tuple[str, int]]
            | Mapping[TopicPartition, int] | None,
            timestamp_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Seek each partition to its first record with timestamp >= ``timestamp_ms``.

        ``partitions`` is a list (with one ``timestamp_ms`` for all; ``None`` = every
        assigned partition) or a ``{partition: timestamp_ms}`` mapping. A partition with
        no such record is positioned at its end (so only new records follow).
        """
        if isinstance(partitions, Mapping):
            if timestamp_ms is not None:
                raise ValueError("pass either a {partition: timestamp} mapping or "
                                 "timestamp_ms, not both")
            wanted = {TopicPartition(*tp): ts for tp, ts in partitions.items()}
            self._targets(wanted)
        else:
            if timestamp_ms is None:
                raise ValueError("timestamp_ms is required when partitions is not a mapping")
            wanted = {tp: timestamp_ms for tp in self._targets(partitions)}
        for tp, ts in wanted.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp {ts!r} for {tp} is not valid; use ms >= 0")
        return await self._seek_to(wanted)

    async def _seek_to(self, specs: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        self._check_open()
        if not specs:
            return {}
        timeout = self.request_timeout_ms / 1000
        answers = await list_offsets(self._cluster, specs, timeout_s=timeout)
        offsets = {tp: a.offset for tp, a in answers.items()}
        past_end = [tp for tp, offset in offsets.items() if offset < 0]
        if past_end:
            ends = await list_offsets(self._cluster, dict.fromkeys(past_end, LATEST_TIMESTAMP),
                                      timeout_s=timeout)
            offsets.update({tp: a.offset for tp, a in ends.items()})
        for tp, offset in offsets.items():
            if tp in self._states:
                self.seek(tp, offset)
        return offsets

    async def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` will return for ``partition``.

        Resolves an unknown position with ``auto_offset_reset`` first (a round trip).
        """
        self._check_open()
        tp = TopicPartition(*partition)
        while True:
            state = self._state(tp)  # re-read: an assign() meanwhile may drop the partition
            if state.position is not None:
                return state.position
            await self._resolve_positions({tp: state}, retry=True)

    def highwater(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """The partition's high watermark as of the last fetch answer (``None``: none yet).

        ``highwater - position`` is the consumer's lag, with no extra request.
        """
        hw = self._state(partition).high_watermark
        return None if hw < 0 else hw

    @property
    def fetch_requests_sent(self) -> int:
        """How many FetchRequests this consumer has sent (tests and diagnostics)."""
        return self._fetch_requests_sent

    # ------------------------------------------------------------------ poll
    async def poll(self, timeout_ms: int = 0, max_records: int | None = None
                   ) -> list[ConsumerRecord]:
        """Return buffered records, waiting up to ``timeout_ms`` for some to arrive.

        At most ``max_records`` (default ``max_poll_records``), in offset order within
        each partition; partitions take turns across polls. ``[]`` on timeout.
        """
        limit = self.max_poll_records if max_records is None else max_records
        return records_from_table(await self._poll_table(timeout_ms, limit))

    async def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None
                         ) -> pa.Table:
        """Like ``poll`` but returns a ``pyarrow.Table`` in ``CONSUMER_SCHEMA``.

        ``max_records=None`` returns everything buffered (bounded by the fetch sizes),
        because the point of the Arrow path is large columnar batches.
        """
        return await self._poll_table(timeout_ms, max_records)

    async def _poll_table(self, timeout_ms: int, max_records: int | None, *,
                          inline_callbacks: bool = True) -> pa.Table:
        self._check_open()
        if max_records is not None and (not isinstance(max_records, int) or max_records < 1):
            raise ValueError(f"max_records={max_records!r} is not valid; use an integer >= 1")
        if not self._states and self._mode != "subscribe":
            raise RuntimeError("no partitions are assigned; call assign() or subscribe() "
                               "first")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            if self._mode == "subscribe":
                self._wakeup.clear()
                if inline_callbacks:
                    await self._run_group_events()
                elif self._group_work_pending():
                    return CONSUMER_SCHEMA.empty_table()  # the sync face runs the callbacks
            self._maybe_auto_commit()
            self._collect_fetches()
            if self._metadata_due and time.monotonic() >= self._metadata_next_at:
                await self._refresh_metadata()
            await self._resolve_positions(
                {tp: s for tp, s in self._states.items() if s.position is None}, retry=False)
            self._before_drain = {tp: st.position for tp, st in self._states.items()
                                  if st.position is not None}
            table = self._drain(max_records)
            self._send_fetches()  # pipelining: the next fetch flies while the caller works
            remaining = deadline - time.monotonic()
            if table is not None:
                if not inline_callbacks:
                    self._undelivered = table  # until the sync face has it (see _rewind)
                return table
            if remaining <= 0:
                return CONSUMER_SCHEMA.empty_table()
            await self._wait(remaining)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this consumer is closed")

    async def _refresh_metadata(self) -> None:
        self._metadata_next_at = time.monotonic() + self.retry_backoff_ms / 1000
        if not self._states:
            self._metadata_due = False
            return
        try:
            await self._cluster.refresh(sorted({tp.topic for tp in self._states}))
            self._metadata_due = False
        except (StrataError, TimeoutError) as err:
            if not is_transient(err):
                raise
            log.debug("metadata refresh failed, will retry: %s", err)

    async def _resolve_positions(self, states: dict[TopicPartition, _PartitionState], *,
                                 retry: bool) -> None:
        """Give partitions without a position one, per ``auto_offset_reset``.

        With ``retry`` (an explicit ``position()``), transient errors are retried until
        the request timeout; from ``poll`` they only back the partition off.
        """
        now = time.monotonic()
        todo = {tp: s for tp, s in states.items() if retry or s.retry_at <= now}
        if not todo:
            return
        lookup = {tp: s for tp, s in todo.items() if s.use_committed}
        if lookup:
            await self._position_at_committed(lookup, retry)
            todo = {tp: s for tp, s in todo.items()
                    if s.position is None and not s.use_committed and self._states.get(tp) is s}
            if not todo:
                return
        generations = {tp: s.generation for tp, s in todo.items()}
        if self.auto_offset_reset == "none":
            earliest, latest = await asyncio.gather(
                self._list(dict.fromkeys(todo, EARLIEST_TIMESTAMP), retry),
                self._list(dict.fromkeys(todo, LATEST_TIMESTAMP), retry))
            for tp in todo:
                start, end = earliest.get(tp), latest.get(tp)
                if start is not None and end is not None:
                    err = OffsetOutOfRangeError(-1, start, end)
                    committed = "" if self.group_id is None else \
                        f" and group {self.group_id!r} has no committed offset for it"
                    StrataError.__init__(
                        err, f"{tp} has no position{committed} and auto_offset_reset='none'; "
                        f"seek to an offset in [{start}, {end}] (earliest={start}, "
                        f"latest={end})")
                    raise err
            return
        spec = EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else LATEST_TIMESTAMP
        found = await self._list(dict.fromkeys(todo, spec), retry)
        for tp, offset in found.items():
            state = self._states.get(tp)
            if state is not None and state.generation == generations[tp] \
                    and state.position is None:
                state.reposition(offset)

    async def _position_at_committed(self, lookup: dict[TopicPartition, _PartitionState],
                                     retry: bool) -> None:
        """Position partitions at the group's committed offsets; the ones with none go on
        to ``auto_offset_reset``. From ``poll`` (no ``retry``) a failed lookup only backs
        the partitions off."""
        assert self._group is not None
        generations = {tp: s.generation for tp, s in lookup.items()}
        try:
            found = await self._group.link.committed(
                list(lookup), timeout_s=self.request_timeout_ms / 1000 if retry
                else self.retry_backoff_ms / 1000 + 1.0)
        except StrataError as err:
            if retry or not is_transient(err):
                raise
            log.debug("group %s: committed offsets not fetched yet: %s", self.group_id, err)
            # Back off without a metadata refresh: the coordinator did not answer, the
            # partitions' leaders are not in question (in a large group's rebalance every
            # member would re-read the whole topic's metadata for nothing).
            retry_at = time.monotonic() + self.retry_backoff_ms / 1000
            for tp in lookup:
                state = self._states.get(tp)
                if state is not None:
                    state.retry_at = retry_at
            return
        for tp, offset in found.items():
            state = self._states.get(tp)
            if state is not lookup[tp] or state.generation != generations[tp] \
                    or state.position is not None:
                continue  # dropped, or seek()ed meanwhile: the seek wins
            state.use_committed = False
            if offset is not None:
                state.reposition(offset)
                self._last_committed[tp] = offset

    async def _list(self, specs: dict[TopicPartition, int], retry: bool) -> dict[TopicPartition,
                                                                                 int]:
        if retry:
            answers = await list_offsets(self._cluster, specs,
                                         timeout_s=self.request_timeout_ms / 1000)
            return {tp: a.offset for tp, a in answers.items()}
        found: dict[TopicPartition, int] = {}
        raw = await list_offsets_once(self._cluster, specs, self.request_timeout_ms / 1000)
        for tp, answer in raw.items():
            if isinstance(answer, ListOffsetsPartitionResponse):
                found[tp] = answer.offset
            elif is_transient(answer):
                self._back_off(tp)
            else:
                raise answer
        return found

    def _back_off(self, tp: TopicPartition) -> None:
        state = self._states.get(tp)
        if state is not None:
            state.retry_at = time.monotonic() + self.retry_backoff_ms / 1000
        self._metadata_due = True

    # ------------------------------------------------------------------ fetching
    def _send_fetches(self) -> None:
        now = time.monotonic()
        by_node: dict[int, dict[TopicPartition, tuple[int, int]]] = {}
        for tp, state in self._states.items():
            offset = state.fetch_offset()
            if offset is None or tp in self._inflight_tps or state.retry_at > now:
                continue
            if state.buffered_bytes() >= self.max_partition_fetch_bytes:
                continue
            info = self._cluster.topics.get(tp.topic, {}).get(tp.partition)
            if info is None or info.leader < 0:
                self._metadata_due = True
                continue
            if info.leader in self._inflight:
                continue
            by_node.setdefault(info.leader, {})[tp] = (offset, state.generation)
        for node, specs in by_node.items():
            task = asyncio.create_task(self._fetch(node, specs), name=f"strata-fetch-{node}")
            self._inflight[node] = _InFlight(node, task, specs)
            for tp in specs:
                self._inflight_tps[tp] = node

    async def _fetch(self, node: int, specs: dict[TopicPartition, tuple[int, int]]
                     ) -> FetchResponse:
        topics: dict[str, list[FetchPartition]] = {}
        for tp, (offset, _) in specs.items():
            info = self._cluster.topics.get(tp.topic, {}).get(tp.partition)
            topics.setdefault(tp.topic, []).append(FetchPartition(
                tp.partition, offset, self.max_partition_fetch_bytes,
                info.leader_epoch if info is not None else -1))
        request = FetchRequest([FetchTopic(name, parts) for name, parts in topics.items()],
                               max_wait_ms=self.fetch_max_wait_ms,
                               min_bytes=self.fetch_min_bytes, max_bytes=self.fetch_max_bytes)
        connection = await self._cluster.connection(node)
        self._fetch_requests_sent += 1
        response = await asyncio.wait_for(
            connection.request(ApiKey.FETCH, request),
            (self.request_timeout_ms + self.fetch_max_wait_ms) / 1000)
        assert isinstance(response, FetchResponse)
        if response.error_code:
            raise error_from_code(response.error_code, None)
        return response

    def _cancel_fetches(self, partitions: set[TopicPartition] | None) -> None:
        """Cancel unanswered fetches that include ``partitions`` (``None``: all), so a new
        position is fetched now instead of after the broker's long poll. Answered ones are
        kept: their other partitions' data is still good, the rest is discarded later."""
        for node, inflight in list(self._inflight.items()):
            if inflight.task.done():
                continue
            if partitions is not None and partitions.isdisjoint(inflight.specs):
                continue
            inflight.task.cancel()
            del self._inflight[node]
            for tp in inflight.specs:
                if self._inflight_tps.get(tp) == node:
                    del self._inflight_tps[tp]

    def _collect_fetches(self) -> None:
        for node, inflight in list(self._inflight.items()):
            if inflight.task.done():
                del self._inflight[node]
                for tp in inflight.specs:
                    if self._inflight_tps.get(tp) == node:
                        del self._inflight_tps[tp]
                self._handle_answer(inflight)
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error

    def _handle_answer(self, inflight: _InFlight) -> None:
        try:
            response = inflight.task.result()
        except asyncio.CancelledError:
            return
        except (StrataError, TimeoutError) as err:
            if not is_transient(err):
                self._errors.append(as_strata_error(err))
                return
            log.debug("fetch from broker %d failed, will retry: %s", inflight.node, err)
            for tp in inflight.specs:
                self._back_off(tp)
            return
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                spec = inflight.specs.get(tp)
                state = self._states.get(tp)
                if spec is None or state is None:
                    continue
                fetch_offset, generation = spec
                if state.generation != generation or state.fetch_offset() != fetch_offset:
                    continue  # the position moved (seek) while the fetch was in flight
                if answer.high_watermark >= 0:
                    state.high_watermark = answer.high_watermark
                if answer.log_start_offset >= 0:
                    state.log_start_offset = answer.log_start_offset
                if answer.log_end_offset >= 0:
                    state.log_end_offset = answer.log_end_offset
                if answer.error_code == 0:
                    self._buffer(tp, state, fetch_offset, answer.records)
                else:
                    self._partition_error(tp, state, fetch_offset,
                                          error_from_code(answer.error_code,
                                                          answer.error_message),
                                          answer.log_start_offset, answer.high_watermark)

    def _buffer(self, tp: TopicPartition, state: _PartitionState, fetch_offset: int,
                records: Any) -> None:
        if not records:
            return
        try:
            table = batches_to_table(records, topic=tp.topic, partition=tp.partition,
                                     start_offset=fetch_offset)
        except StrataError as err:
            self._errors.append(err)
            return
        if table.num_rows:
            end = int(table.column("offset")[-1].as_py()) + 1
            state.chunks.append(_Chunk(table, end, len(records)))

    def _partition_error(self, tp: TopicPartition, state: _PartitionState, fetch_offset: int,
                         err: StrataError, log_start: int, high_watermark: int) -> None:
        if isinstance(err, OffsetOutOfRangeError):
            if state.chunks:
                self._back_off(tp)  # hand out what is buffered; the refetch decides
            elif self.auto_offset_reset == "none":
                self._errors.append(OffsetOutOfRangeError(fetch_offset, log_start,
                                                          high_watermark))
            else:
                log.info("%s: offset %d is out of range [%d, %d]; resetting to %s", tp,
                         fetch_offset, log_start, high_watermark, self.auto_offset_reset)
                state.reposition(None)
        elif is_transient(err):
            self._back_off(tp)
        else:
            self._errors.append(err)

    def _drain(self, max_records: int | None) -> pa.Table | None:
        """Take up to ``max_records`` buffered records, partitions taking turns."""
        budget = max_records
        parts: list[pa.Table] = []
        order = list(self._states.items())
        if order:
            start = self._rotation % len(order)
            order = order[start:] + order[:start]
            self._rotation += 1
        for _, state in order:
            while state.chunks and (budget is None or budget > 0):
                chunk = state.chunks[0]
                n = chunk.remaining if budget is None else min(chunk.remaining, budget)
                piece = chunk.table.slice(chunk.index, n)
                chunk.index += n
                parts.append(piece)
                if budget is not None:
                    budget -= n
                if chunk.remaining == 0:
                    state.chunks.popleft()
                    state.position = chunk.end_offset
                else:
                    state.position = int(chunk.table.column("offset")[chunk.index - 1]
                                         .as_py()) + 1
            if budget is not None and budget <= 0:
                break
        if not parts:
            return None
        return pa.concat_tables(parts)

    async def _wait(self, remaining: float) -> None:
        """Sleep until a fetch is answered, a back-off ends, or ``remaining`` runs out."""
        now = time.monotonic()
        wake = [s.retry_at for s in self._states.values() if s.retry_at > now]
        if self._metadata_due:
            wake.append(self._metadata_next_at)
        timeout = remaining
        if wake:
            timeout = min(timeout, max(min(wake) - now, 0.001))
        tasks: list[asyncio.Future[Any]] = [inflight.task for inflight in
                                            self._inflight.values()]
        woken: asyncio.Task[Any] | None = None
        if self._mode == "subscribe":
            woken = asyncio.create_task(self._wakeup.wait())
            tasks.append(woken)
        if tasks:
            try:
                await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if woken is not None:
                    woken.cancel()
        else:
            await asyncio.sleep(timeout)

    # ------------------------------------------------------------------ groups
    def _require_group(self, what: str) -> GroupMember:
        if self._group is None:
            raise ValueError(f"{what} needs a consumer group: create the consumer with "
                             "group_id=\"...\"")
        return self._group

    def _offsets_to_commit(self, offsets: OffsetsToCommit
                           | None) -> dict[TopicPartition, int]:
        if offsets is None:
            return self._commit_positions(None, changed_only=False)
        out: dict[TopicPartition, int] = {}
        for tp, offset in offsets.items():
            [key] = topic_partitions([tp])
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset {offset!r} for {key} is not valid; commit the offset "
                                 "of the next record to process (an integer >= 0)")
            out[key] = offset
        return out

    def _owned(self) -> set[TopicPartition]:
        if self._mode == "subscribe" and self._group is not None:
            return set(self._group.membership.owned)
        return set(self._states)

    @overload
    async def commit(
            self, offsets: OffsetsToCommit | None = None, *,
            asynchronous: Literal[False] = False, callback: CommitCallback | None = None
    ) -> dict[TopicPartition, int]: ...

    @overload
    async def commit(
            self, offsets: OffsetsToCommit | None = None, *,
            asynchronous: Literal[True], callback: CommitCallback | None = None
    ) -> asyncio.Task[dict[TopicPartition, int]]: ...

    async def commit(
            self, offsets: OffsetsToCommit | None = None, *,
            asynchronous: bool = False, callback: CommitCallback | None = None
    ) -> dict[TopicPartition, int] | asyncio.Task[dict[TopicPartition, int]]:
        """Commit offsets for the group: per partition, the offset of the next record to
        process.

        ``offsets`` None: the current positions of this consumer's partitions, i.e. just
        after the last records ``poll`` returned, so call it once those are processed.
        Waits for the coordinator and returns what was committed; raises
        ``CommitFailedError`` when the member was removed from the group (never retry
        that: the partitions are another member's now), for partitions that moved away
        (``STALE_MEMBER_EPOCH``) and for other refusals, after retrying transient errors
        (coordinator moved, connection lost) until ``request_timeout_ms``.

        ``asynchronous=True`` returns at once with a task; commits stay in order. Its
        outcome goes to ``callback(offsets, error)`` (run inside a later ``poll`` or
        ``commit``), or, with no callback, a failure is raised by the next ``commit``.
        With ``assign()`` instead of ``subscribe()`` the commit is made outside any
        membership, which the coordinator accepts only while the group has no members.
        """
        self._require_group("commit()")
        self._check_open()
        wanted = self._offsets_to_commit(offsets)
        if asynchronous:
            return self._commit_in_background(wanted, callback)
        await self._run_commit_callbacks()
        self._raise_async_commit_error()
        return await self._commit(wanted)

    def _raise_async_commit_error(self) -> None:
        if self._async_commit_errors:
            error, self._async_commit_errors = self._async_commit_errors[0], []
            raise error

    async def _commit(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Commit now (commit(), auto-commit, before a revocation, at close), after the
        asynchronous commits asked for earlier, so a committed offset never goes back."""
        await self._async_commits_sent()
        return await self._send_commit(offsets)

    async def _send_commit(self, offsets: dict[TopicPartition, int]
                           ) -> dict[TopicPartition, int]:
        group = self._require_group("commit()")
        try:
            done = await group.commit(offsets, member=self._mode == "subscribe",
                                      timeout_s=self.request_timeout_ms / 1000)
        except CommitFailedError as err:
            self._last_committed.update(err.committed)
            raise
        self._last_committed.update(done)
        return done

    def _commit_in_background(self, offsets: dict[TopicPartition, int],
                              callback: CommitCallback | None
                              ) -> asyncio.Task[dict[TopicPartition, int]]:
        """Queue an asynchronous commit. At most one is sent at a time: requests made
        while one is on its way are merged (the newest offset per partition wins) and go
        out together next, so a caller committing after every poll cannot build a queue
        at the coordinator that later commits (a revocation's) wait behind. Each call
        still gets its own task and callback, with its own partitions' outcome."""
        if self._async_next is None:
            self._async_next = _MergedCommit()
        batch = self._async_next
        batch.offsets.update(offsets)
        if self._async_sender is None or self._async_sender.done():
            self._async_sender = asyncio.create_task(self._send_async_commits(),
                                                     name=f"strata-commit-{self.group_id}")
            self._async_sender.add_done_callback(_retrieve)

        async def run() -> dict[TopicPartition, int]:
            try:
                done = await asyncio.shield(batch.outcome)
            except StrataError as err:
                if callback is not None:
                    self._commit_callbacks.append((callback, offsets, err))
                else:
                    self._async_commit_errors.append(err)
                raise
            mine = {tp: done[tp] for tp in offsets if tp in done}
            if callback is not None:
                self._commit_callbacks.append((callback, mine, None))
            return mine

        task = asyncio.create_task(run(), name=f"strata-commit-{self.group_id}")
        task.add_done_callback(_retrieve)
        self._async_commits.add(task)  # close() waits for it, then cancels it
        task.add_done_callback(self._async_commits.discard)
        return task

    async def _send_async_commits(self) -> None:
        """Send the merged asynchronous commits one after the other, in order."""
        while (batch := self._async_next) is not None:
            self._async_next = None
            try:
                done = await self._send_commit(batch.offsets)
            except StrataError as err:
                log.warning("group %s: asynchronous commit failed: %s", self.group_id, err)
                batch.outcome.set_exception(err)
            except BaseException:  # cancelled by close(): nobody may wait for ever
                closed = NetworkError(
                    f"group {self.group_id!r}: the consumer closed before the commit was "
                    "confirmed; it may or may not have been stored")
                for unsent in (batch, self._async_next):
                    if unsent is not None and not unsent.outcome.done():
                        unsent.outcome.set_exception(closed)
                self._async_next = None
                raise
            else:
                batch.outcome.set_result(done)

    async def _async_commits_sent(self) -> None:
        """Wait until every asynchronous commit asked for so far was answered (a
        synchronous commit goes after them, so commits stay in order)."""
        sender = self._async_sender
        if sender is not None and not sender.done():
            await asyncio.wait({sender})

    async def _run_commit_callbacks(self) -> None:
        while self._commit_callbacks:
            callback, offsets, error = self._commit_callbacks.popleft()
            result = callback(offsets, error)
            if inspect.isawaitable(result):
                await result

    async def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]]
                        ) -> dict[TopicPartition, int | None]:
        """The group's committed offset per partition (None: nothing committed)."""
        group = self._require_group("committed()")
        self._check_open()
        return await group.link.committed(topic_partitions(partitions),
                                          timeout_s=self.request_timeout_ms / 1000)

    def _changed_positions(self, partitions: Iterable[TopicPartition] | None = None
                           ) -> dict[TopicPartition, int]:
        """Positions of owned partitions that differ from what was last committed (see
        ``_commit_positions``)."""
        return self._commit_positions(partitions, changed_only=True)

    def _commit_positions(self, partitions: Iterable[TopicPartition] | None, *,
                          changed_only: bool) -> dict[TopicPartition, int]:
        """The positions a commit without explicit offsets commits: owned partitions'
        positions (``changed_only``: those that differ from the last commit). After
        ``_abandon_last_poll`` (a ``with`` block left by an exception) a partition's
        position is taken from before the last poll: its records may be unprocessed.
        Shared by auto-commit and ``commit()`` (e.g. from ``on_revoke`` during close),
        so neither commits records the caller never processed."""
        owned = self._owned()
        wanted = owned if partitions is None else owned & set(partitions)
        out: dict[TopicPartition, int] = {}
        for tp, state in self._states.items():
            position = state.position
            if tp not in wanted or position is None:
                continue
            if self._last_poll_abandoned and tp in self._before_drain:
                position = min(position, self._before_drain[tp])
            if not changed_only or self._last_committed.get(tp) != position:
                out[tp] = position
        return out

    def _abandon_last_poll(self) -> None:
        """The caller failed while processing the last poll's records: commits from now
        on (``close``) stop before them."""
        self._last_poll_abandoned = True

    def _maybe_auto_commit(self) -> None:
        """Inside poll, before records are handed out: commit, in the background, the
        positions reached by the previous polls (records the caller has processed)."""
        if not self.enable_auto_commit or self._mode is None or not self._auto_commit.due():
            return
        if self._auto_commit_task is not None and not self._auto_commit_task.done():
            return
        self._auto_commit.reset()
        if self._mode == "subscribe" and (self._group is None
                                          or not self._group.membership.joined):
            return
        offsets = self._changed_positions()
        if offsets:
            self._auto_commit_task = asyncio.create_task(self._auto_commit_now(offsets),
                                                         name="strata-auto-commit")

    async def _auto_commit_now(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await self._commit(offsets)
        except StrataError as err:
            log.warning("group %s: auto-commit failed: %s", self.group_id, err)

    async def _commit_before_revoke(self, partitions: Iterable[TopicPartition]) -> None:
        offsets = self._changed_positions(partitions)
        if not offsets:
            return
        try:
            await self._commit(offsets)
        except StrataError as err:
            log.warning("group %s: auto-commit before revoking %s failed: %s", self.group_id,
                        ", ".join(str(tp) for tp in sorted(offsets)), err)

    def _group_work_pending(self) -> bool:
        return (self._mode == "subscribe" and self._group is not None
                and self._group.membership.has_work())

    async def _next_group_event(self) -> _GroupEvent | None:
        """The next callback the caller must run, with the work that comes before it
        done: revocations first (auto-commit of their positions), then lost partitions,
        then new ones (added without a position: the committed offset is looked up on
        the next poll unless the callback seeks)."""
        group = self._group
        if self._mode != "subscribe" or group is None:
            return None
        m = group.membership
        if m.fatal is not None:
            raise m.fatal
        plan = m.pending()
        committed: set[TopicPartition] = set()
        while self.enable_auto_commit and not m.lost and not plan.revoke <= committed:
            # The answer may change while this commit waits: commit what it adds too.
            await self._commit_before_revoke(plan.revoke - committed)  # may find us fenced
            committed |= plan.revoke
            plan = m.pending()
        if m.lost:
            return _GroupEvent("lost", frozenset(m.owned | set(self._states)),
                               self._on_lost or self._on_revoke)
        if plan.revoke:
            return _GroupEvent("revoke", plan.revoke, self._on_revoke)
        if plan.assign:
            m.taking |= plan.assign  # reported as owned from now on (see reported())
            for tp in plan.assign:
                if tp not in self._states:
                    self._states[tp] = _PartitionState(use_committed=True)
            # Metadata only for a partition whose leader is not known yet: in a large
            # group every assignment step of every member would otherwise re-read the
            # whole topic's metadata from the brokers (a stale leader is caught by the
            # fetch, which backs off and refreshes).
            if any(self._leader_unknown(tp) for tp in plan.assign):
                self._metadata_due = True
                self._metadata_next_at = 0.0
            return _GroupEvent("assign", plan.assign, self._on_assign)
        return None

    def _leader_unknown(self, tp: TopicPartition) -> bool:
        info = self._cluster.topics.get(tp.topic, {}).get(tp.partition)
        return info is None or info.leader < 0

    async def _finish_group_event(self, event: _GroupEvent) -> None:
        """After the callback: own the new partitions, or drop the revoked / lost ones
        (positions, buffers, fetches in flight), and tell the coordinator at once."""
        group = self._group
        assert group is not None
        m = group.membership
        if event.kind == "assign":
            m.owned |= {tp for tp in event.partitions if tp in self._states}
            m.taking -= event.partitions
        else:
            self._drop(event.partitions)
            m.owned -= event.partitions
            m.taking -= event.partitions
            if event.kind == "lost" and not m.closing:
                m.rejoin()
        group.heartbeat_now()

    def _drop(self, partitions: Iterable[TopicPartition]) -> None:
        tps = set(partitions)
        self._cancel_fetches(tps)
        for tp in tps:
            self._states.pop(tp, None)
            self._last_committed.pop(tp, None)

    async def _invoke(self, event: _GroupEvent) -> None:
        if event.callback is not None and event.partitions:
            result = event.callback(set(event.partitions))
            if inspect.isawaitable(result):
                await result

    async def _run_group_events(self) -> None:
        await self._run_commit_callbacks()
        while (event := await self._next_group_event()) is not None:
            try:
                await self._invoke(event)
            finally:
                await self._finish_group_event(event)

    async def _leave_event(self) -> _GroupEvent | None:
        """Before leaving: stop taking assignments, auto-commit, then the callback to
        run. Heartbeats go on (reporting what is still held) until ``GroupMember.leave``
        sends the leave request: a slow ``on_revoke`` or a commit retrying through a
        coordinator move must not let the session expire while records are processed."""
        group = self._group
        if self._mode != "subscribe" or group is None:
            return None
        m = group.membership
        m.closing = True
        owned = frozenset(m.owned | set(self._states))
        if self.enable_auto_commit and owned and not m.lost:
            await self._commit_before_revoke(owned)  # may find the member fenced
        if m.lost:
            return _GroupEvent("lost", owned, self._on_lost or self._on_revoke)
        return _GroupEvent("revoke", owned, self._on_revoke)

    async def _leave_group(self) -> None:
        event = await self._leave_event()
        if event is not None:
            try:
                await self._invoke(event)
            finally:
                await self._finish_group_event(event)
        if self._group is not None:
            await self._group.leave()
        self._mode = None

    def _rewind(self, table: pa.Table) -> None:
        """Put records a caller never received back: each partition's position returns
        to the first of them (a blocking poll interrupted by Ctrl-C)."""
        if table.num_rows == 0:
            return
        firsts: dict[TopicPartition, int] = {}
        for topic, partition, offset in zip(table.column("topic").to_pylist(),
                                            table.column("partition").to_pylist(),
                                            table.column("offset").to_pylist(), strict=True):
            tp = TopicPartition(topic, partition)
            firsts[tp] = min(offset, firsts.get(tp, offset))
        for tp, offset in firsts.items():
            state = self._states.get(tp)
            if state is not None:
                state.reposition(offset)
                state.use_committed = False
        self._cancel_fetches(set(firsts))

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Leave the group (auto-commit, ``on_revoke``, leave heartbeat) or, with
        ``assign`` and auto-commit, commit the positions; then cancel outstanding fetches
        and close every broker connection (idempotent)."""
        if self._closed:
            return
        try:
            if self._mode == "subscribe":
                await self._leave_group()
            elif self._mode == "assign" and self.enable_auto_commit:
                offsets = self._changed_positions()
                if offsets:
                    await self._auto_commit_now(offsets)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        if self._group is not None:
            await self._group.stop()
        # Commits still under way (auto-commit, commit(asynchronous=True)) may finish
        # within the request timeout; what is left is cancelled, so nobody waits on it
        # forever and nothing reopens a connection once the cluster is closed.
        commits: set[asyncio.Task[Any]] = set(self._async_commits)
        if self._async_sender is not None:
            commits.add(self._async_sender)
        if self._auto_commit_task is not None:
            commits.add(self._auto_commit_task)
        commits = {task for task in commits if not task.done()}
        if commits:
            with contextlib.suppress(BaseException):
                await asyncio.wait(commits, timeout=self.request_timeout_ms / 1000)
            for task in commits:
                task.cancel()
            await asyncio.gather(*commits, return_exceptions=True)
        tasks = [inflight.task for inflight in self._inflight.values()]
        self._inflight.clear()
        self._inflight_tps.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cluster.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self._abandon_last_poll()  # at-least-once: its records may not be processed
        await self.close()


# ----------------------------------------------------------------------------- sync face


class Consumer:
    """Blocking consumer: an ``AsyncConsumer`` on a private event-loop thread.

    Takes the same arguments as ``AsyncConsumer``. Every call runs on that loop, so
    fetches already in flight (and a group member's heartbeats) keep going while the
    caller processes records, and the consumer's state is only ever touched by one
    thread. Group callbacks (``on_assign``, ``on_revoke``, ``on_lost``, commit
    callbacks) run on the thread that calls ``poll`` (or ``close``), so they may call
    the consumer's methods (``commit``, ``seek``).
    """

    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        client_id: str = "strata-consumer",
        auto_offset_reset: OffsetResetStrategy = "latest",
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        max_partition_fetch_bytes: int = 1 << 20,
        fetch_max_bytes: int = 50 << 20,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        session_timeout_ms: int = -1,
        rebalance_timeout_ms: int = 60_000,
        assignor: str = "cooperative-sticky",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
    ) -> None:
        self._consumer = AsyncConsumer(
            bootstrap, client_id=client_id, auto_offset_reset=auto_offset_reset,
            fetch_min_bytes=fetch_min_bytes, fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_bytes=fetch_max_bytes, max_poll_records=max_poll_records,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
            group_id=group_id, group_instance_id=group_instance_id,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            assignor=assignor, enable_auto_commit=enable_auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms)
        self._thread = EventLoopThread("strata-consumer")

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        async def call() -> T:
            return fn(*args, **kwargs)

        return self._thread.run(call())

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._thread.run(coroutine)

    @property
    def auto_offset_reset(self) -> OffsetResetStrategy:
        return self._consumer.auto_offset_reset

    @property
    def fetch_requests_sent(self) -> int:
        return self._consumer.fetch_requests_sent

    @property
    def group_id(self) -> str | None:
        return self._consumer.group_id

    @property
    def group_instance_id(self) -> str | None:
        return self._consumer.group_instance_id

    @property
    def session_timeout_ms(self) -> int:
        return self._consumer.session_timeout_ms

    @property
    def assignor(self) -> str:
        return self._consumer.assignor

    @property
    def enable_auto_commit(self) -> bool:
        return self._consumer.enable_auto_commit

    @property
    def member_id(self) -> str | None:
        return self._consumer.member_id

    @property
    def member_epoch(self) -> int:
        return self._consumer.member_epoch

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment (see ``AsyncConsumer.assign``)."""
        self._call(self._consumer.assign, list(partitions))

    def subscribe(self, topics: str | Iterable[str], *,
                  on_assign: PartitionsCallback | None = None,
                  on_revoke: PartitionsCallback | None = None,
                  on_lost: PartitionsCallback | None = None) -> None:
        """Join the group and read its share of ``topics`` (see
        ``AsyncConsumer.subscribe``); the callbacks run on the thread calling ``poll``."""
        names = topics if isinstance(topics, str) else list(topics)
        self._call(self._consumer.subscribe, names, on_assign=on_assign, on_revoke=on_revoke,
                   on_lost=on_lost)

    def subscription(self) -> set[str]:
        return self._call(self._consumer.subscription)

    def unsubscribe(self) -> None:
        """Leave the group: auto-commit, ``on_revoke`` (on this thread), leave heartbeat."""
        self._leave(close=False)

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._consumer.assignment)

    @overload
    def commit(
            self, offsets: OffsetsToCommit | None = None, *,
            asynchronous: Literal[False] = False, callback: CommitCallback | None = None
    ) -> dict[TopicPartition, int]: ...

    @overload
    def commit(
            self, offsets: OffsetsToCommit | None = None, *,
            asynchronous: Literal[True], callback: CommitCallback | None = None
    ) -> Future[dict[TopicPartition, int]]: ...

    def commit(
            self, offsets: OffsetsToCommit | None = None, *,
            asynchronous: bool = False, callback: CommitCallback | None = None
    ) -> dict[TopicPartition, int] | Future[dict[TopicPartition, int]]:
        """Commit offsets (see ``AsyncConsumer.commit``). ``asynchronous=True`` returns a
        ``concurrent.futures.Future``; ``callback(offsets, error)`` then runs on this
        thread inside a later ``poll`` or ``commit``."""
        if asynchronous:
            async def start() -> dict[TopicPartition, int]:
                task = await self._consumer.commit(offsets, asynchronous=True,
                                                   callback=callback)
                return await task

            self._run_commit_callbacks()
            if self._consumer._async_commit_errors:
                self._call(self._consumer._raise_async_commit_error)
            return self._thread.submit(start())
        self._run_commit_callbacks()
        return self._run(self._consumer.commit(offsets))

    def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]]
                  ) -> dict[TopicPartition, int | None]:
        """The group's committed offset per partition (None: nothing committed)."""
        return self._run(self._consumer.committed(list(partitions)))

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._call(self._consumer.seek, partition, offset)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition | tuple[str, int]]
                          | None = None) -> dict[TopicPartition, int]:
        """Seek to the log start offsets; returns the new positions."""
        return self._run(self._consumer.seek_to_beginning(
            None if partitions is None else list(partitions)))

    def seek_to_end(self, partitions: Iterable[TopicPartition | tuple[str, int]]
                    | None = None) -> dict[TopicPartition, int]:
        """Seek to the high watermarks; returns the new positions."""
        return self._run(self._consumer.seek_to_end(
            None if partitions is None else list(partitions)))

    def seek_to_timestamp(
            self,
            partitions: Iterable[TopicPartition | tuple[str, int]]
            | Mapping[TopicPartition, int] | None,
            timestamp_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Seek to the first record at/after a timestamp, or to the end if none is."""
        if partitions is not None and not isinstance(partitions, Mapping):
            partitions = list(partitions)
        return self._run(self._consumer.seek_to_timestamp(partitions, timestamp_ms))

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` returns for ``partition``."""
        return self._run(self._consumer.position(partition))

    def highwater(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        return self._call(self._consumer.highwater, partition)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None
             ) -> list[ConsumerRecord]:
        """Records in offset order per partition, waiting up to ``timeout_ms``."""
        limit = self._consumer.max_poll_records if max_records is None else max_records
        return records_from_table(self._poll_table(timeout_ms, limit))

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> pa.Table:
        """Records as a ``CONSUMER_SCHEMA`` table (everything buffered by default)."""
        return self._poll_table(timeout_ms, max_records)

    def _poll_table(self, timeout_ms: int, max_records: int | None) -> pa.Table:
        """The loop thread fetches; group callbacks run here, between its rounds."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            self._run_group_callbacks()
            remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            table = self._poll_once(remaining_ms, max_records)
            if table.num_rows or (time.monotonic() >= deadline
                                  and not self._consumer._group_work_pending()):
                return table

    def _poll_once(self, timeout_ms: int, max_records: int | None) -> pa.Table:
        future = self._thread.submit(self._consumer._poll_table(
            timeout_ms, max_records, inline_callbacks=False))
        try:
            table = future.result()
        except Exception:
            raise
        except BaseException:
            # Ctrl-C while the loop polls: records it drained for this call never reach
            # the caller, so their partitions go back to the first of them (else an
            # auto-commit on close would commit records nobody processed).
            future.cancel()
            with contextlib.suppress(BaseException):
                self._call(self._rewind_undelivered)
            raise
        self._consumer._undelivered = None
        return table

    def _rewind_undelivered(self) -> None:
        table, self._consumer._undelivered = self._consumer._undelivered, None
        if table is not None:
            self._consumer._rewind(table)

    def _run_commit_callbacks(self) -> None:
        callbacks = self._consumer._commit_callbacks
        while callbacks:
            callback, offsets, error = callbacks.popleft()
            callback(offsets, error)

    def _run_group_callbacks(self) -> None:
        self._run_commit_callbacks()
        consumer = self._consumer
        if consumer._mode != "subscribe" or not consumer._group_work_pending():
            return  # (read from this thread: a change missed here ends the next poll round)
        while (event := self._run(consumer._next_group_event())) is not None:
            try:
                self._invoke(event)
            finally:
                self._run(self._consumer._finish_group_event(event))

    @staticmethod
    def _invoke(event: _GroupEvent) -> None:
        if event.callback is not None and event.partitions:
            result = event.callback(set(event.partitions))
            if inspect.isawaitable(result):
                raise TypeError(f"{event.callback!r} returned an awaitable: callbacks of the "
                                "blocking Consumer must be plain functions (coroutine "
                                "callbacks are for AsyncConsumer)")

    def _leave(self, *, close: bool) -> None:
        try:
            event = self._run(self._consumer._leave_event())
            if event is not None:
                try:
                    self._invoke(event)
                finally:
                    self._run(self._consumer._finish_group_event(event))
        finally:
            if close:
                self._run(self._consumer.close())
            else:
                self._run(self._consumer.unsubscribe())

    def close(self) -> None:
        """Leave the group (auto-commit, ``on_revoke`` on this thread, leave heartbeat),
        close the connections and stop the loop thread (idempotent)."""
        if self._thread.loop.is_closed():
            return
        try:
            self._leave(close=True)
        finally:
            self._thread.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and not self._thread.loop.is_closed():
            self._call(self._consumer._abandon_last_poll)  # its records may be unprocessed
        self.close()
