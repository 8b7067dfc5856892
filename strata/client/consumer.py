"""The Strata consumer: consumer groups or manual assignment, positions, pipelined fetches.

Two faces over one implementation: ``AsyncConsumer`` (asyncio) and ``Consumer`` (blocking;
runs an ``AsyncConsumer`` on its own event-loop thread). Both take
``(bootstrap_servers, **options)`` or one ``ConsumerConfig``, validated once. Either the
caller chooses the partitions (``assign``, ``seek*``, ``auto_offset_reset``), or the
consumer joins a consumer group (``group_id=...``, ``subscribe``) whose coordinator shares
the topics' partitions among its members (``docs/consumer-groups.md``).

This module keeps the faces, the poll loop and the rebalance steps (which touch all of
the parts); the parts are private modules with one job each: ``_subscription`` (the
assignment and each partition's read state), ``_fetcher`` (fetch requests and the
buffers they fill), ``_offsets`` (positions, ``ListOffsets``, commits) next to
``_group`` (the group membership and its heartbeats), and ``_config`` (the settings).

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

      with Consumer(bootstrap_servers, group_id="billing", auto_offset_reset="earliest") as c:
          c.subscribe(["events"])
          while running:
              for record in c.poll(timeout_ms=1000):
                  process(record)  # done before the next poll(), which commits it

  A blocking ``poll`` interrupted by Ctrl-C puts back the records it had taken but not
  returned, so ``close`` never commits records nobody processed.

How a poll works, and why:

* Every assigned partition has a *position*: the offset of the next record ``poll``
  returns. Buffered, already-decoded records (``Chunk``) always start exactly at the
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
read record by record through ``Records`` (a lazy view that makes each
``ConsumerRecord`` when it is read), so the two are equivalent by construction.

Layering (DESIGN-NOTES §9): this module imports only the record-batch codec, the
protocol definitions, the error table and the client core.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import (
    Any,
    Final,
    Generic,
    Literal,
    NamedTuple,
    ParamSpec,
    TypeAlias,
    TypeVar,
    Unpack,
    overload,
)

import pyarrow as pa

from strata.client._cluster import Cluster
from strata.client._common import IdleTimer, TopicPartition
from strata.client._config import (
    ConsumerConfig,
    ConsumerOptions,
    OffsetResetStrategy,
    config_of,
)
from strata.client._fetcher import Fetcher
from strata.client._group import CommitFailedError, GroupMember
from strata.client._offsets import CommitCallback, Offsets, OffsetsToCommit
from strata.client._subscription import GroupEvent, PartitionsCallback, Subscription
from strata.client._sync import EventLoopThread
from strata.client._transactions import GroupMetadata
from wire.protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from wire.record_batch import CONSUMER_SCHEMA, TimestampType

__all__ = [
    "AsyncConsumer",
    "CommitCallback",
    "CommitFailedError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerOptions",
    "ConsumerRecord",
    "GroupMetadata",
    "IdleTimer",
    "OffsetResetStrategy",
    "Records",
    "PartitionsCallback",
    "TopicPartition",
]

_TIMESTAMP_TYPES: Final = {int(t): t for t in TimestampType}

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


_new_record: Final = functools.partial(tuple.__new__, ConsumerRecord)
#: ``Records`` column: a Python list (a ``range`` for gapless offsets), or
#: ``(value, count)`` for a value every row shares.
_Column: TypeAlias = "list[Any] | range | tuple[Any, int]"


class Records(Sequence[ConsumerRecord]):
    """What ``poll`` returns: its records as a read-only sequence of ``ConsumerRecord``.

    A lazy view over the polled columns: each column is turned into one Python list
    (``to_pylist``, in C) or, when every row shares it (topic, partition, timestamp
    type, absent keys and headers), kept as one value; a ``ConsumerRecord`` is made
    only when it is read, by iteration or index. Why: a list of a million records is
    a million tuples alive at once, and CPython's cyclic collector, which counts live
    container allocations, then runs its full collections over them; a loop that reads
    records one by one and lets each go keeps that count flat. Holding on to the
    records (``list(records)``) costs what it costs.

    Supports ``len``, truth, iteration, ``reversed``, indexing and slicing (a slice is
    a ``Records`` too), ``==`` with any sequence of records, and ``index``/``count``.
    """

    __slots__ = ("_columns", "_length")

    def __init__(self, columns: list[_Column], length: int) -> None:
        self._columns = columns  # in ConsumerRecord's field order
        self._length = length

    @classmethod
    def from_table(cls, table: pa.Table) -> Records:
        """The records of a ``CONSUMER_SCHEMA`` table (whole columns, however chunked)."""
        n = table.num_rows
        # One array a column: a chunked array's to_pylist costs a quarter more a row.
        key, value, topic, partition, offset, timestamp, ts_type, headers = (
            c.chunk(0) if c.num_chunks == 1 else c.combine_chunks() for c in table.columns)
        ts_types = _column_of(ts_type, n)
        topics, partitions = _column_of(topic, n), _column_of(partition, n)
        one_partition = isinstance(topics, tuple) and isinstance(partitions, tuple)
        columns: list[_Column] = [
            topics,
            partitions,
            _offsets_of(offset, n) if one_partition else offset.to_pylist(),
            timestamp.to_pylist(),
            ((_TIMESTAMP_TYPES[ts_types[0]], n) if isinstance(ts_types, tuple)
             else [_TIMESTAMP_TYPES[t] for t in ts_types]),
            (None, n) if key.null_count == n else key.to_pylist(),
            # A typed value's maps as dicts, as the producer took them (Arrow's default
            # is a list of pairs); "lossy": a map with a repeated key keeps its last.
            value.to_pylist(maps_as_pydicts="lossy") if pa.types.is_struct(value.type)
            else value.to_pylist(),
            (None, n) if headers.null_count == n else [
                [(h["key"], h["value"]) for h in hs] if hs else [] for hs in headers.to_pylist()],
        ]
        return cls(columns, n)

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[ConsumerRecord]:
        iterators: list[Iterator[Any]] = [
            itertools.repeat(c[0], self._length) if isinstance(c, tuple) else iter(c)
            for c in self._columns]
        if isinstance(self._columns[7], tuple):  # no headers: each record gets its own []
            iterators[7] = iter(list, None)  # (endless: zip stops at the others' end)
        return map(_new_record, zip(*iterators, strict=False))

    @overload
    def __getitem__(self, index: int) -> ConsumerRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Records: ...

    def __getitem__(self, index: int | slice) -> ConsumerRecord | Records:
        if isinstance(index, slice):
            rows = range(self._length)[index]
            columns: list[_Column] = [
                (c[0], len(rows)) if isinstance(c, tuple) else c[index] for c in self._columns]
            return Records(columns, len(rows))
        if not -self._length <= index < self._length:
            raise IndexError(f"record index {index} out of range (0..{self._length - 1})")
        index %= self._length
        fields = [c[0] if isinstance(c, tuple) else c[index] for c in self._columns]
        if fields[7] is None:
            fields[7] = []
        return _new_record(fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(
            a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like list

    def __repr__(self) -> str:
        shown = ", ".join(repr(r) for r in self[:3])
        more = f", ... {self._length - 3} more" if self._length > 3 else ""
        return f"Records([{shown}{more}])"


def _column_of(column: pa.Array, n: int) -> _Column:
    """``column`` as a Python list, or ``(value, n)`` when all ``n`` rows hold one value.

    Deliberately no Arrow compute call here: kernels release the GIL, and on the
    blocking face the consumer's I/O thread then takes it for up to a switch interval
    per poll. ``to_pylist`` and ``list.count`` keep it.
    """
    values: list[Any] = column.to_pylist()
    first = values[0]
    if values.count(first) == n:
        return first, n
    return values


def _offsets_of(column: pa.Array, n: int) -> list[int] | range:
    """The offset column of rows from **one** partition; a ``range`` (as cheap to
    iterate, nothing to build) when the offsets run without gaps, as they do unless
    compaction removed records.

    Only for one partition: its offsets strictly increase, so ``last - first == n - 1``
    means no gap. Rows of several partitions can meet that by coincidence (blocks
    ``[10, 11]``, ``[3]``, ``[13]``) and would be labelled ``10, 11, 12, 13``.
    """
    first = column[0].as_py()
    last = column[n - 1].as_py()
    if last - first == n - 1:
        return range(first, last + 1)
    return column.to_pylist()  # type: ignore[no-any-return]


def records_from_table(table: pa.Table) -> Records:
    """Rows of a ``CONSUMER_SCHEMA`` table as ``ConsumerRecord``s (a lazy ``Records``)."""
    if table.num_rows == 0:
        return _NO_RECORDS
    return Records.from_table(table)


_NO_RECORDS: Final = Records([(None, 0)] * len(ConsumerRecord._fields), 0)


class _Setting(Generic[T]):
    """A face's read-only attribute: the setting of the same name in its ``config``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, face: None, owner: type) -> _Setting[T]: ...

    @overload
    def __get__(self, face: AsyncConsumer | Consumer, owner: type) -> T: ...

    def __get__(self, face: AsyncConsumer | Consumer | None, owner: type) -> T | _Setting[T]:
        if face is None:
            return self
        value: T = getattr(face.config, self._name)
        return value

    def __set__(self, face: AsyncConsumer | Consumer, value: object) -> None:
        raise AttributeError(f"{self._name} is a setting: pass it to the constructor (or "
                             "build a new ConsumerConfig)")


# ----------------------------------------------------------------------------- async face


class AsyncConsumer:
    """asyncio consumer: manual assignment or a consumer group. Use on one event loop;
    close() when done.

    ``AsyncConsumer(bootstrap_servers, **options)`` or ``AsyncConsumer(config)`` with a
    ``ConsumerConfig``, which documents every option (Kafka's names where Kafka has the
    knob). The settings are readable as attributes of the same names and as ``config``.
    """

    auto_offset_reset = _Setting[OffsetResetStrategy]()
    fetch_min_bytes = _Setting[int]()
    fetch_max_wait_ms = _Setting[int]()
    max_partition_fetch_bytes = _Setting[int]()
    fetch_max_bytes = _Setting[int]()
    max_poll_records = _Setting[int]()
    request_timeout_ms = _Setting[int]()
    retry_backoff_ms = _Setting[int]()
    group_id = _Setting[str | None]()
    group_instance_id = _Setting[str | None]()
    session_timeout_ms = _Setting[int]()
    rebalance_timeout_ms = _Setting[int]()
    max_poll_interval_ms = _Setting[int]()
    assignor = _Setting[str]()
    auto_commit_interval_ms = _Setting[int]()

    def __init__(self, bootstrap_servers: str | list[str] | ConsumerConfig,
                 **options: Unpack[ConsumerOptions]) -> None:
        config = self.config = config_of(ConsumerConfig, bootstrap_servers, options)
        self._cluster = Cluster(config.bootstrap_servers, client_id=config.client_id,
                                request_timeout_ms=config.request_timeout_ms,
                                retry_backoff_ms=config.retry_backoff_ms,
                                security=config.security)
        self._closed = False
        self._wakeup = asyncio.Event()
        self._group: GroupMember | None = None
        if config.group_id is not None:
            self._group = GroupMember(
                self._cluster, config.group_id, instance_id=config.group_instance_id,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.rebalance_timeout_ms, assignor=config.assignor,
                request_timeout_ms=config.request_timeout_ms,
                retry_backoff_ms=config.retry_backoff_ms, wakeup=self._wakeup.set,
                max_poll_interval_ms=config.max_poll_interval_ms)
        self._subscription = Subscription(self._group)
        self._fetcher = Fetcher(config, self._cluster, self._subscription)
        self._offsets = Offsets(config, self._cluster, self._subscription, self._fetcher,
                                self._group)
        self._undelivered: pa.Table | None = None

    @property
    def enable_auto_commit(self) -> bool:
        """Whether this consumer commits by itself (``enable_auto_commit`` and a group)."""
        return self.config.auto_commit

    # ------------------------------------------------------------------ assignment
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment. Partitions that stay assigned keep their position and
        buffered records; new ones start without a position (``auto_offset_reset``)."""
        self._check_open()
        self._subscription.assign(partitions)
        self._fetcher.reassigned()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads: what ``assign`` gave, or what the group
        gave it (``on_assign`` has run for them, ``on_revoke`` not yet)."""
        return set(self._subscription.states)

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
        self._subscription.subscribe(topics, on_assign, on_revoke, on_lost)

    def subscription(self) -> set[str]:
        """The subscribed topics (empty when not subscribed)."""
        return self._subscription.topics()

    async def unsubscribe(self) -> None:
        """Leave the group: commit (with auto-commit), ``on_revoke``, leave heartbeat."""
        if self._subscription.mode != "subscribe":
            return
        await self._leave_group()
        self._subscription.mode = None

    @property
    def member_id(self) -> str | None:
        """The id the coordinator gave this member (None: not in the group now)."""
        return self._group.membership.member_id if self._group is not None else None

    @property
    def member_epoch(self) -> int:
        return self._group.membership.member_epoch if self._group is not None else -1

    def group_metadata(self) -> GroupMetadata:
        """What a transactional producer needs to commit this consumer's offsets in its
        transaction (``send_offsets_to_transaction``, KIP-447): the group, and this
        member's id and epoch, so a member that lost its partitions cannot commit."""
        if self.config.group_id is None:
            raise ValueError("group_metadata() needs a group_id: only a group's offsets "
                             "are committed in a transaction")
        m = self._group.membership if self._group is not None else None
        member_id = m.member_id if m is not None and m.joined else None
        return GroupMetadata(self.config.group_id, member_id,
                             m.member_epoch if member_id is not None and m is not None
                             else -1, self.config.group_instance_id)

    # ------------------------------------------------------------------ positions
    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Make ``offset`` the next record ``poll`` returns for ``partition``.

        No round trip: an offset outside the log is found by the next fetch and handled
        by ``auto_offset_reset``.
        """
        self._check_open()
        self._offsets.seek(partition, offset)

    async def seek_to_beginning(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, int]:
        """Seek to the log start offset (all assigned partitions by default).

        Resolved now with one ``ListOffsets`` per leader; returns the new positions.
        """
        targets = self._subscription.targets(partitions)
        return await self._seek_to(dict.fromkeys(targets, EARLIEST_TIMESTAMP))

    async def seek_to_end(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, int]:
        """Seek to the high watermark: only records produced from now on are returned."""
        targets = self._subscription.targets(partitions)
        return await self._seek_to(dict.fromkeys(targets, LATEST_TIMESTAMP))

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
            self._subscription.targets(wanted)
        else:
            if timestamp_ms is None:
                raise ValueError("timestamp_ms is required when partitions is not a mapping")
            wanted = dict.fromkeys(self._subscription.targets(partitions), timestamp_ms)
        for tp, ts in wanted.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp {ts!r} for {tp} is not valid; use ms >= 0")
        return await self._seek_to(wanted)

    async def _seek_to(self, specs: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        self._check_open()
        if not specs:
            return {}
        offsets = await self._offsets.offsets_for(specs)
        for tp, offset in offsets.items():
            if tp in self._subscription.states:
                self.seek(tp, offset)
        return offsets

    async def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` will return for ``partition``.

        Resolves an unknown position with ``auto_offset_reset`` first (a round trip).
        """
        self._check_open()
        return await self._offsets.position(partition)

    def highwater(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """The partition's high watermark as of the last fetch answer (``None``: none yet).

        ``highwater - position`` is the consumer's lag, with no extra request.
        """
        hw = self._subscription.state(partition).high_watermark
        return None if hw < 0 else hw

    @property
    def fetch_requests_sent(self) -> int:
        """How many FetchRequests this consumer has sent (tests and diagnostics)."""
        return self._fetcher.requests_sent

    # ------------------------------------------------------------------ poll
    async def poll(self, timeout_ms: int = 0, max_records: int | None = None
                   ) -> Records:
        """Return buffered records, waiting up to ``timeout_ms`` for some to arrive.

        At most ``max_records`` (default ``max_poll_records``), in offset order within
        each partition; partitions take turns across polls. ``[]`` on timeout.
        """
        limit = self.config.max_poll_records if max_records is None else max_records
        return records_from_table(await self._polled(timeout_ms, limit))

    async def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None
                         ) -> pa.Table:
        """Like ``poll`` but returns a ``pyarrow.Table`` in ``CONSUMER_SCHEMA``.

        ``max_records=None`` returns everything buffered (bounded by the fetch sizes),
        because the point of the Arrow path is large columnar batches.
        """
        return await self._polled(timeout_ms, max_records)

    async def _polled(self, timeout_ms: int, max_records: int | None) -> pa.Table:
        """One application poll: the ``max_poll_interval_ms`` clock stands still inside."""
        timer = self._group.poll_timer if self._group is not None else None
        if timer is not None:
            timer.enter()
        try:
            return await self._poll_table(timeout_ms, max_records)
        finally:
            if timer is not None:
                timer.exit()

    async def _poll_table(self, timeout_ms: int, max_records: int | None, *,
                          inline_callbacks: bool = True) -> pa.Table:
        self._check_open()
        if max_records is not None and (not isinstance(max_records, int) or max_records < 1):
            raise ValueError(f"max_records={max_records!r} is not valid; use an integer >= 1")
        subscription, fetcher, offsets = self._subscription, self._fetcher, self._offsets
        if not subscription.states and subscription.mode != "subscribe":
            raise RuntimeError("no partitions are assigned; call assign() or subscribe() "
                               "first")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            subscribed = subscription.mode == "subscribe"
            if subscribed:
                self._wakeup.clear()
                if inline_callbacks:
                    await self._run_group_events()
                elif subscription.has_group_work():
                    return CONSUMER_SCHEMA.empty_table()  # the sync face runs the callbacks
            offsets.maybe_auto_commit()
            fetcher.collect()
            if fetcher.typed.pending:
                await fetcher.typed.load()
            await fetcher.maybe_refresh_metadata()
            await offsets.resolve_positions(
                {tp: s for tp, s in subscription.states.items() if s.position is None},
                retry=False)
            offsets.remember_positions()
            table = fetcher.drain(max_records)
            fetcher.send()  # pipelining: the next fetch flies while the caller works
            remaining = deadline - time.monotonic()
            if table is not None:
                if not inline_callbacks:
                    self._undelivered = table  # until the sync face has it (see Offsets.rewind)
                return table
            if remaining <= 0:
                return CONSUMER_SCHEMA.empty_table()
            await fetcher.wait(remaining, self._wakeup if subscription.mode == "subscribe"
                               else None)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this consumer is closed")

    # ------------------------------------------------------------------ commits
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
        self._offsets.require_group("commit()")
        self._check_open()
        return await self._offsets.commit(offsets, asynchronous=asynchronous,
                                          callback=callback)

    async def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]]
                        ) -> dict[TopicPartition, int | None]:
        """The group's committed offset per partition (None: nothing committed)."""
        self._offsets.require_group("committed()")
        self._check_open()
        return await self._offsets.committed(partitions)

    # ------------------------------------------------------------------ rebalance steps
    def _group_work_pending(self) -> bool:
        return self._subscription.has_group_work()

    async def _next_group_event(self) -> GroupEvent | None:
        """The next callback the caller must run, with the work that comes before it
        done: revocations first (auto-commit of their positions), then lost partitions,
        then new ones (added without a position: the committed offset is looked up on
        the next poll unless the callback seeks)."""
        group, subscription = self._group, self._subscription
        if subscription.mode != "subscribe" or group is None:
            return None
        m = group.membership
        if m.fatal is not None:
            raise m.fatal
        plan = m.pending()
        committed: set[TopicPartition] = set()
        while self.enable_auto_commit and not m.lost and not plan.revoke <= committed:
            # The answer may change while this commit waits: commit what it adds too.
            await self._offsets.commit_before_revoke(plan.revoke - committed)  # may fence
            committed |= plan.revoke
            plan = m.pending()
        if m.lost:
            return GroupEvent("lost", frozenset(m.owned | set(subscription.states)),
                              subscription.on_lost or subscription.on_revoke)
        if plan.revoke:
            return GroupEvent("revoke", plan.revoke, subscription.on_revoke)
        if plan.assign:
            m.taking |= plan.assign  # reported as owned from now on (see reported())
            subscription.add_assigned(plan.assign)
            # Metadata only for a partition whose leader is not known yet: in a large
            # group every assignment step of every member would otherwise re-read the
            # whole topic's metadata from the brokers (a stale leader is caught by the
            # fetch, which backs off and refreshes).
            if any(self._fetcher.leader_unknown(tp) for tp in plan.assign):
                self._fetcher.refresh_metadata_soon()
            return GroupEvent("assign", plan.assign, subscription.on_assign)
        return None

    async def _finish_group_event(self, event: GroupEvent) -> None:
        """After the callback: own the new partitions, or drop the revoked / lost ones
        (positions, buffers, fetches in flight), and tell the coordinator at once."""
        group = self._group
        assert group is not None
        m = group.membership
        if event.kind == "assign":
            m.owned |= {tp for tp in event.partitions if tp in self._subscription.states}
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
        self._fetcher.cancel(tps)
        self._subscription.drop(tps)
        self._offsets.forget(tps)

    async def _invoke(self, event: GroupEvent) -> None:
        if event.callback is not None and event.partitions:
            result = event.callback(set(event.partitions))
            if inspect.isawaitable(result):
                await result

    async def _run_group_events(self) -> None:
        await self._offsets.run_commit_callbacks()
        while (event := await self._next_group_event()) is not None:
            try:
                await self._invoke(event)
            finally:
                await self._finish_group_event(event)

    async def _leave_event(self) -> GroupEvent | None:
        """Before leaving: stop taking assignments, auto-commit, then the callback to
        run. Heartbeats go on (reporting what is still held) until ``GroupMember.leave``
        sends the leave request: a slow ``on_revoke`` or a commit retrying through a
        coordinator move must not let the session expire while records are processed."""
        group, subscription = self._group, self._subscription
        if subscription.mode != "subscribe" or group is None:
            return None
        m = group.membership
        m.closing = True
        owned = frozenset(m.owned | set(subscription.states))
        if self.enable_auto_commit and owned and not m.lost:
            await self._offsets.commit_before_revoke(owned)  # may find the member fenced
        if m.lost:
            return GroupEvent("lost", owned, subscription.on_lost or subscription.on_revoke)
        return GroupEvent("revoke", owned, subscription.on_revoke)

    async def _leave_group(self) -> None:
        event = await self._leave_event()
        if event is not None:
            try:
                await self._invoke(event)
            finally:
                await self._finish_group_event(event)
        if self._group is not None:
            await self._group.leave()
        self._subscription.mode = None

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Leave the group (auto-commit, ``on_revoke``, leave heartbeat) or, with
        ``assign`` and auto-commit, commit the positions; then cancel outstanding fetches
        and close every broker connection (idempotent)."""
        if self._closed:
            return
        try:
            mode = self._subscription.mode
            if mode == "subscribe":
                await self._leave_group()
            elif mode == "assign" and self.enable_auto_commit:
                offsets = self._offsets.changed_positions()
                if offsets:
                    await self._offsets.auto_commit_now(offsets)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        if self._group is not None:
            await self._group.stop()
        await self._offsets.shutdown()
        await self._fetcher.shutdown()
        await self._cluster.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            # at-least-once: its records may not be processed
            self._offsets.abandon_last_poll()
        await self.close()


# ----------------------------------------------------------------------------- sync face


class Consumer:
    """Blocking consumer: an ``AsyncConsumer`` on a private event-loop thread.

    Takes the same arguments as ``AsyncConsumer`` (``bootstrap_servers`` and keyword
    options, or a ``ConsumerConfig``). Every call runs on that loop, so fetches already in
    flight (and a group member's heartbeats) keep going while the caller processes
    records, and the consumer's state is only ever touched by one thread. Group callbacks
    (``on_assign``, ``on_revoke``, ``on_lost``, commit callbacks) run on the thread that
    calls ``poll`` (or ``close``), so they may call the consumer's methods (``commit``,
    ``seek``).
    """

    auto_offset_reset = _Setting[OffsetResetStrategy]()
    group_id = _Setting[str | None]()
    group_instance_id = _Setting[str | None]()
    session_timeout_ms = _Setting[int]()
    max_poll_interval_ms = _Setting[int]()
    assignor = _Setting[str]()

    def __init__(self, bootstrap_servers: str | list[str] | ConsumerConfig,
                 **options: Unpack[ConsumerOptions]) -> None:
        self._consumer = AsyncConsumer(bootstrap_servers, **options)
        self.config = self._consumer.config
        self._thread = EventLoopThread("strata-consumer")

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        async def call() -> T:
            return fn(*args, **kwargs)

        return self._thread.run(call())

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._thread.run(coroutine)

    @property
    def fetch_requests_sent(self) -> int:
        return self._consumer.fetch_requests_sent

    @property
    def enable_auto_commit(self) -> bool:
        return self._consumer.enable_auto_commit

    @property
    def member_id(self) -> str | None:
        return self._consumer.member_id

    @property
    def member_epoch(self) -> int:
        return self._consumer.member_epoch

    def group_metadata(self) -> GroupMetadata:
        """See ``AsyncConsumer.group_metadata``."""
        return self._call(self._consumer.group_metadata)

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
            if self._consumer._offsets.async_commit_errors:
                self._call(self._consumer._offsets.raise_async_commit_error)
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
             ) -> Records:
        """Records in offset order per partition, waiting up to ``timeout_ms``."""
        limit = self.config.max_poll_records if max_records is None else max_records
        return records_from_table(self._poll_table(timeout_ms, limit))

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> pa.Table:
        """Records as a ``CONSUMER_SCHEMA`` table (everything buffered by default)."""
        return self._poll_table(timeout_ms, max_records)

    def _poll_table(self, timeout_ms: int, max_records: int | None) -> pa.Table:
        """The loop thread fetches; group callbacks run here, between its rounds. The
        ``max_poll_interval_ms`` clock stands still for the whole call."""
        group = self._consumer._group
        timer = group.poll_timer if group is not None else None
        if timer is not None:
            timer.enter()
        try:
            deadline = time.monotonic() + max(timeout_ms, 0) / 1000
            while True:
                self._run_group_callbacks()
                remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
                table = self._poll_once(remaining_ms, max_records)
                if table.num_rows or (time.monotonic() >= deadline
                                      and not self._consumer._group_work_pending()):
                    return table
        finally:
            if timer is not None:
                timer.exit()

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
            self._consumer._offsets.rewind(table)

    def _run_commit_callbacks(self) -> None:
        callbacks = self._consumer._offsets.commit_callbacks
        while callbacks:
            callback, offsets, error = callbacks.popleft()
            callback(offsets, error)

    def _run_group_callbacks(self) -> None:
        self._run_commit_callbacks()
        consumer = self._consumer
        if consumer._subscription.mode != "subscribe" or not consumer._group_work_pending():
            return  # (read from this thread: a change missed here ends the next poll round)
        while (event := self._run(consumer._next_group_event())) is not None:
            try:
                self._invoke(event)
            finally:
                self._run(self._consumer._finish_group_event(event))

    @staticmethod
    def _invoke(event: GroupEvent) -> None:
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
            # its records may be unprocessed
            self._call(self._consumer._offsets.abandon_last_poll)
        self.close()
