"""The Strata consumer: manual partition assignment, positions, pipelined fetches.

Two faces over one implementation: ``AsyncConsumer`` (asyncio) and ``Consumer`` (blocking;
runs an ``AsyncConsumer`` on its own event-loop thread). Consumer groups and committed
offsets arrive with issue [7/7]; until then the caller chooses the partitions
(``assign``) and where to read from (``seek*`` or ``auto_offset_reset``).

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
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, ParamSpec, TypeAlias, TypeVar

import pyarrow as pa

from brokers.errors import (
    NetworkError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    StrataError,
    UnknownTopicOrPartitionError,
    raise_for_code,
)
from brokers.protocol import (
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
from brokers.record_batch import CONSUMER_SCHEMA, TimestampType, batches_to_table
from strata.client._cluster import Cluster
from strata.client._sync import EventLoopThread

__all__ = [
    "AsyncConsumer",
    "Consumer",
    "ConsumerRecord",
    "OffsetResetStrategy",
    "TopicPartition",
]

log = logging.getLogger("strata.client.consumer")

OffsetResetStrategy: TypeAlias = Literal["earliest", "latest", "none"]
_RESET_STRATEGIES: Final = ("earliest", "latest", "none")
_TIMESTAMP_TYPES: Final = {int(t): t for t in TimestampType}

T = TypeVar("T")
P = ParamSpec("P")


class TopicPartition(NamedTuple):
    """One partition of one topic; hashable, so it keys positions and offset maps."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


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


def error_from_code(code: int, message: str | None) -> StrataError:
    """The typed error for a wire ``error_code`` (the same mapping ``raise_for_code`` uses)."""
    try:
        raise_for_code(code, message)
    except StrataError as err:
        return err
    raise ValueError("error code 0 is not an error")


def is_transient(err: BaseException) -> bool:
    """Worth retrying after a metadata refresh and a back-off.

    ``LOG_CLOSED`` (what a broker answers while it shuts a partition down) is retriable;
    ``TimeoutError`` is a request the broker did not answer.
    """
    if isinstance(err, StrataError):
        return err.retriable
    return isinstance(err, TimeoutError)


def _as_strata_error(err: BaseException) -> StrataError:
    if isinstance(err, StrataError):
        return err
    if isinstance(err, TimeoutError):
        return RequestTimedOutError("the broker did not answer in time; retry")
    return NetworkError(f"request failed: {err!r}")


def _topic_partitions(partitions: Iterable[TopicPartition | tuple[str, int]]
                      ) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    for item in partitions:
        topic, partition = item
        if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"{item!r} is not a (topic, partition) pair with partition >= 0")
        out.append(TopicPartition(topic, partition))
    return out


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
                out[tp] = _as_strata_error(err)
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
    position: int | None = None  # None: resolve with auto_offset_reset before fetching
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
    """asyncio consumer with manual assignment. Use on one event loop; close() when done.

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
    ) -> None:
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

    # ------------------------------------------------------------------ assignment
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment. Partitions that stay assigned keep their position and
        buffered records; new ones start without a position (``auto_offset_reset``)."""
        self._check_open()
        tps = _topic_partitions(partitions)
        self._states = {tp: self._states.get(tp) or _PartitionState() for tp in tps}
        self._cancel_fetches(None)
        self._errors.clear()
        self._metadata_due = True
        self._metadata_next_at = 0.0

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

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
        tps = _topic_partitions(partitions)
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
        self._state(tp).reposition(offset)
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

    async def _poll_table(self, timeout_ms: int, max_records: int | None) -> pa.Table:
        self._check_open()
        if max_records is not None and (not isinstance(max_records, int) or max_records < 1):
            raise ValueError(f"max_records={max_records!r} is not valid; use an integer >= 1")
        if not self._states:
            raise RuntimeError("no partitions are assigned; call assign() first")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            self._collect_fetches()
            if self._metadata_due and time.monotonic() >= self._metadata_next_at:
                await self._refresh_metadata()
            await self._resolve_positions(
                {tp: s for tp, s in self._states.items() if s.position is None}, retry=False)
            table = self._drain(max_records)
            self._send_fetches()  # pipelining: the next fetch flies while the caller works
            remaining = deadline - time.monotonic()
            if table is not None or remaining <= 0:
                return table if table is not None else CONSUMER_SCHEMA.empty_table()
            await self._wait(remaining)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this consumer is closed")

    async def _refresh_metadata(self) -> None:
        self._metadata_next_at = time.monotonic() + self.retry_backoff_ms / 1000
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
        generations = {tp: s.generation for tp, s in todo.items()}
        if self.auto_offset_reset == "none":
            earliest, latest = await asyncio.gather(
                self._list(dict.fromkeys(todo, EARLIEST_TIMESTAMP), retry),
                self._list(dict.fromkeys(todo, LATEST_TIMESTAMP), retry))
            for tp in todo:
                start, end = earliest.get(tp), latest.get(tp)
                if start is not None and end is not None:
                    err = OffsetOutOfRangeError(-1, start, end)
                    StrataError.__init__(
                        err, f"{tp} has no position and auto_offset_reset='none'; seek to an "
                        f"offset in [{start}, {end}] (earliest={start}, latest={end})")
                    raise err
            return
        spec = EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else LATEST_TIMESTAMP
        found = await self._list(dict.fromkeys(todo, spec), retry)
        for tp, offset in found.items():
            state = self._states.get(tp)
            if state is not None and state.generation == generations[tp] \
                    and state.position is None:
                state.reposition(offset)

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
                self._errors.append(_as_strata_error(err))
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
        tasks = [inflight.task for inflight in self._inflight.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(timeout)

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Cancel outstanding fetches and close every broker connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        tasks = [inflight.task for inflight in self._inflight.values()]
        self._inflight.clear()
        self._inflight_tps.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._cluster.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ----------------------------------------------------------------------------- sync face


class Consumer:
    """Blocking consumer: an ``AsyncConsumer`` on a private event-loop thread.

    Takes the same arguments as ``AsyncConsumer``. Every call runs on that loop, so
    fetches already in flight keep going while the caller processes records, and the
    consumer's state is only ever touched by one thread.
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
    ) -> None:
        self._consumer = AsyncConsumer(
            bootstrap, client_id=client_id, auto_offset_reset=auto_offset_reset,
            fetch_min_bytes=fetch_min_bytes, fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_bytes=fetch_max_bytes, max_poll_records=max_poll_records,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms)
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

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment (see ``AsyncConsumer.assign``)."""
        self._call(self._consumer.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._consumer.assignment)

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
        return self._run(self._consumer.poll(timeout_ms, max_records))

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> pa.Table:
        """Records as a ``CONSUMER_SCHEMA`` table (everything buffered by default)."""
        return self._run(self._consumer.poll_arrow(timeout_ms, max_records))

    def close(self) -> None:
        """Close the connections and stop the loop thread (idempotent)."""
        if self._thread.loop.is_closed():
            return
        try:
            self._run(self._consumer.close())
        finally:
            self._thread.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
