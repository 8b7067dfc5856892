"""The consumer's fetcher: pipelined fetches, decoded into per-partition buffers.

Job: keep records flowing into the assigned partitions' buffers. Partitions are grouped
by leader into two *lanes* per broker: partitions behind their last known high
watermark (catching up: the broker answers at once) and partitions at it (tailing: the
broker holds the fetch up to ``fetch_max_wait_ms`` for new records). Each lane of each
broker gets **one** ``FetchRequest`` covering its eligible partitions, at most one in
flight, so a partition that has read everything never holds back, behind its long
poll, the partitions that still have records to fetch. ``send`` is called before
``poll`` returns records, so the next answer arrives while the caller works
(pipelining). Answers are
decoded once (``batches_to_table``, records below the fetch offset sliced away) into
``Chunk``s; ``drain`` hands them out with partitions taking turns. Transient errors back
the partition off for ``retry_backoff_ms`` and schedule a metadata refresh; an offset out
of range applies ``auto_offset_reset`` (a reset to "no position", which the offsets
resolve) or is raised with ``"none"``; anything else is raised from ``collect``.

Invariants:

- At most one fetch in flight per broker and lane, and a partition is in at most one.
- A partition is left out of a fetch while it buffers ``max_partition_fetch_bytes`` or
  more, which bounds memory to about two fetches per partition.
- An answer is used only if the partition's generation and fetch offset are still the
  ones it was sent for (a ``seek`` meanwhile discards it); ``cancel`` drops unanswered
  fetches of repositioned partitions so the new position is fetched at once.
- Only records below the high watermark are ever served by the broker, so only committed
  records reach the buffers.

Thread-safety: event loop only, like the rest of an ``AsyncConsumer``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from strata.client._cluster import Cluster
from strata.client._common import TopicPartition, as_strata_error, error_from_code, is_transient
from strata.client._config import ConsumerConfig
from strata.client._schemas import MissingSchemas, SchemaSource, TopicSchemas, TypedReader
from strata.client._subscription import Chunk, PartitionState, Subscription
from wire.errors import OffsetOutOfRangeError, StrataError
from wire.protocol import (
    AbortedTransactionEntry,
    ApiKey,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    group_by_topic,
)
from wire.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    AbortedTransaction,
    batches_to_table,
    peek_header,
)

__all__ = ["Fetcher", "InFlight"]

log = logging.getLogger("strata.client.consumer")

#: A broker's fetch lane: ``(node id, tailing)``.
_Lane = tuple[int, bool]


@dataclass(slots=True, eq=False)
class InFlight:
    node: int
    tailing: bool  # the lane: partitions at their high watermark (long poll)
    task: asyncio.Task[FetchResponse]
    specs: dict[TopicPartition, tuple[int, int]]  # tp -> (fetch offset, generation)


class Fetcher:
    """Fetch requests, their answers, the buffers they fill, and metadata refreshes."""

    def __init__(self, config: ConsumerConfig, cluster: Cluster,
                 subscription: Subscription) -> None:
        self._config = config
        self._cluster = cluster
        self._subscription = subscription
        self.typed = TypedReader(TopicSchemas(SchemaSource(
            cluster, request_timeout_ms=config.request_timeout_ms,
            retry_backoff_ms=config.retry_backoff_ms)), config.value_format,
            config.value_schema_version)
        self.inflight: dict[_Lane, InFlight] = {}
        self._inflight_tps: dict[TopicPartition, _Lane] = {}
        self._errors: list[StrataError] = []
        self._metadata_due = True
        self._metadata_next_at = 0.0
        self._rotation = 0
        self.requests_sent = 0

    # ------------------------------------------------------------------ metadata
    def refresh_metadata_soon(self) -> None:
        """Refresh the partitions' leaders on the next ``poll`` round."""
        self._metadata_due = True
        self._metadata_next_at = 0.0

    def reassigned(self) -> None:
        """After ``assign``: no fetch of the old assignment survives, no old error is
        raised, and leaders are looked up at once."""
        self.cancel(None)
        self._errors.clear()
        self.refresh_metadata_soon()

    async def maybe_refresh_metadata(self) -> None:
        if self._metadata_due and time.monotonic() >= self._metadata_next_at:
            await self._refresh_metadata()

    async def _refresh_metadata(self) -> None:
        self._metadata_next_at = time.monotonic() + self._config.retry_backoff_ms / 1000
        states = self._subscription.states
        if not states:
            self._metadata_due = False
            return
        try:
            await self._cluster.refresh(sorted({tp.topic for tp in states}))
            self._metadata_due = False
        except (StrataError, TimeoutError) as err:
            if not is_transient(err):
                raise
            log.debug("metadata refresh failed, will retry: %s", err)

    def back_off(self, tp: TopicPartition) -> None:
        """A transient error for ``tp``: pause it ``retry_backoff_ms``, refresh metadata."""
        state = self._subscription.states.get(tp)
        if state is not None:
            state.retry_at = time.monotonic() + self._config.retry_backoff_ms / 1000
        self._metadata_due = True

    def leader_unknown(self, tp: TopicPartition) -> bool:
        info = self._cluster.topics.get(tp.topic, {}).get(tp.partition)
        return info is None or info.leader < 0

    # ------------------------------------------------------------------ fetching
    def send(self) -> None:
        """Send a fetch to every broker lane with none in flight, for its eligible
        partitions."""
        now = time.monotonic()
        by_lane: dict[_Lane, dict[TopicPartition, tuple[int, int]]] = {}
        for tp, state in self._subscription.states.items():
            offset = state.fetch_offset()
            if offset is None or tp in self._inflight_tps or state.retry_at > now:
                continue
            if state.buffered_bytes() >= self._config.max_partition_fetch_bytes:
                continue
            info = self._cluster.topics.get(tp.topic, {}).get(tp.partition)
            if info is None or info.leader < 0:
                self._metadata_due = True
                continue
            lane = (info.leader, 0 <= state.high_watermark <= offset)
            if lane in self.inflight:
                continue
            by_lane.setdefault(lane, {})[tp] = (offset, state.generation)
        for lane, specs in by_lane.items():
            node, tailing = lane
            task = asyncio.create_task(self._fetch(node, specs), name=f"strata-fetch-{node}")
            self.inflight[lane] = InFlight(node, tailing, task, specs)
            for tp in specs:
                self._inflight_tps[tp] = lane

    async def _fetch(self, node: int, specs: dict[TopicPartition, tuple[int, int]]
                     ) -> FetchResponse:
        config = self._config

        def wanted(tp: TopicPartition, offset: int) -> FetchPartition:
            info = self._cluster.topics.get(tp.topic, {}).get(tp.partition)
            return FetchPartition(tp.partition, offset, config.max_partition_fetch_bytes,
                                  info.leader_epoch if info is not None else -1)

        topics = group_by_topic((tp.topic, wanted(tp, offset))
                                for tp, (offset, _) in specs.items())
        committed = config.isolation_level == "read_committed"
        request = FetchRequest([FetchTopic(name, parts) for name, parts in topics.items()],
                               max_wait_ms=config.fetch_max_wait_ms,
                               min_bytes=config.fetch_min_bytes,
                               max_bytes=config.fetch_max_bytes,
                               isolation_level=1 if committed else 0)
        connection = await self._cluster.connection(node)
        self.requests_sent += 1
        response = await asyncio.wait_for(
            connection.request(ApiKey.FETCH, request, version=2 if committed else 0),
            (config.request_timeout_ms + config.fetch_max_wait_ms) / 1000)
        assert isinstance(response, FetchResponse)
        if response.error_code:
            raise error_from_code(response.error_code, None)
        return response

    def cancel(self, partitions: set[TopicPartition] | None) -> None:
        """Cancel unanswered fetches that include ``partitions`` (``None``: all), so a new
        position is fetched now instead of after the broker's long poll. Answered ones are
        kept: their other partitions' data is still good, the rest is discarded later."""
        for lane, inflight in list(self.inflight.items()):
            if inflight.task.done():
                continue
            if partitions is not None and partitions.isdisjoint(inflight.specs):
                continue
            inflight.task.cancel()
            del self.inflight[lane]
            for tp in inflight.specs:
                if self._inflight_tps.get(tp) == lane:
                    del self._inflight_tps[tp]

    def collect(self) -> None:
        """Take in every answered fetch; raise the first error ``poll`` must not absorb."""
        for lane, inflight in list(self.inflight.items()):
            if inflight.task.done():
                del self.inflight[lane]
                for tp in inflight.specs:
                    if self._inflight_tps.get(tp) == lane:
                        del self._inflight_tps[tp]
                self._handle_answer(inflight)
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error

    def _handle_answer(self, inflight: InFlight) -> None:
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
                self.back_off(tp)
            return
        states = self._subscription.states
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                spec = inflight.specs.get(tp)
                state = states.get(tp)
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
                    self._buffer(tp, state, fetch_offset, answer.records,
                                 answer.aborted_transactions)
                else:
                    self._partition_error(tp, state, fetch_offset,
                                          error_from_code(answer.error_code,
                                                          answer.error_message),
                                          answer.log_start_offset, answer.high_watermark)

    def _buffer(self, tp: TopicPartition, state: PartitionState, fetch_offset: int,
                records: Any, aborted: list[AbortedTransactionEntry] | None = None) -> None:
        if not records:
            return
        try:
            table = batches_to_table(
                records, topic=tp.topic, partition=tp.partition, start_offset=fetch_offset,
                resolve_value=self.typed.resolver(tp.topic),
                aborted=[AbortedTransaction(a.producer_id, a.first_offset)
                         for a in aborted] if aborted else None)
        except MissingSchemas:
            return  # nothing buffered: fetched again once ``typed.load`` ran
        except StrataError as err:
            self._errors.append(err)
            return
        # Past the last whole batch returned: markers and aborted transactions have no
        # row, and the position must still move past them.
        end = _batches_end(records, fetch_offset)
        if table.num_rows:
            end = max(end, int(table.column("offset")[-1].as_py()) + 1)
            state.chunks.append(Chunk(table, end, len(records)))
        elif end > fetch_offset:
            if state.chunks:
                state.chunks[-1].end_offset = end
            else:
                state.position = end

    def _partition_error(self, tp: TopicPartition, state: PartitionState, fetch_offset: int,
                         err: StrataError, log_start: int, high_watermark: int) -> None:
        reset = self._config.auto_offset_reset
        if isinstance(err, OffsetOutOfRangeError):
            if state.chunks:
                self.back_off(tp)  # hand out what is buffered; the refetch decides
            elif reset == "none":
                self._errors.append(OffsetOutOfRangeError(fetch_offset, log_start,
                                                          high_watermark))
            else:
                log.info("%s: offset %d is out of range [%d, %d]; resetting to %s", tp,
                         fetch_offset, log_start, high_watermark, reset)
                state.reposition(None)
        elif is_transient(err):
            self.back_off(tp)
        else:
            self._errors.append(err)

    # ------------------------------------------------------------------ handing out
    def drain(self, max_records: int | None) -> pa.Table | None:
        """Take up to ``max_records`` buffered records, partitions taking turns."""
        budget = max_records
        parts: list[pa.Table] = []
        order = list(self._subscription.states.items())
        if order:
            start = self._rotation % len(order)
            order = order[start:] + order[:start]
            self._rotation += 1
        for _, state in order:
            while state.chunks and (budget is None or budget > 0):
                chunk = state.chunks[0]
                if parts and chunk.table.schema != parts[0].schema:
                    break  # another topic's value type: its turn is the next poll
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

    async def wait(self, remaining: float, woken_by: asyncio.Event | None) -> None:
        """Sleep until a fetch is answered, a back-off ends, ``woken_by`` is set (the
        group has news) or ``remaining`` seconds run out."""
        now = time.monotonic()
        wake = [s.retry_at for s in self._subscription.states.values() if s.retry_at > now]
        if self._metadata_due:
            wake.append(self._metadata_next_at)
        timeout = remaining
        if wake:
            timeout = min(timeout, max(min(wake) - now, 0.001))
        tasks: list[asyncio.Future[Any]] = [inflight.task for inflight in
                                            self.inflight.values()]
        woken: asyncio.Task[Any] | None = None
        if woken_by is not None:
            woken = asyncio.create_task(woken_by.wait())
            tasks.append(woken)
        if tasks:
            try:
                await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if woken is not None:
                    woken.cancel()
        else:
            await asyncio.sleep(timeout)

    async def shutdown(self) -> None:
        """Cancel every fetch in flight and wait for the cancellations."""
        tasks = [inflight.task for inflight in self.inflight.values()]
        self.inflight.clear()
        self._inflight_tps.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _batches_end(records: Any, fetch_offset: int) -> int:
    """The offset after the last whole batch in a fetch answer (headers only)."""
    view = memoryview(records)
    position, end = 0, fetch_offset
    while len(view) - position >= HEADER_SIZE:
        (length,) = _LENGTH.unpack_from(view, position + 8)
        if position + LOG_OVERHEAD + length > len(view):
            break
        end = max(end, peek_header(view, position).next_offset)
        position += LOG_OVERHEAD + length
    return end


_LENGTH = struct.Struct(">i")
