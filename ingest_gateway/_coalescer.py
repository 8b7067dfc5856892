"""The coalescer: records of concurrent produce requests gathered into one ``send_batch``.

Job: records without headers and without their own timestamp (what a ``Plan`` marks
coalescable) of all requests of one process are gathered per ``(acks, topic, partition or
None)`` and handed to the shared ``AsyncProducer`` with one columnar ``send_batch``, so the
brokers see large batches and the gateway pays no Python future per record. Each
request waits for its gathering's outcome (``Gathering.future``): parts of
``(start, end, list[BatchMetadata] | SendFailed)`` that the route turns into per-record
reports (``part_of``, ``locate``).

Invariants:

- A gathering is sent ``linger_ms`` after its first record, as soon as it holds
  ``batch_size`` bytes (counted as ``send_batch`` counts them, ``SLICE_OVERHEAD``), or
  before a request's records that would take it past that (they open the next one), so
  a full gathering travels as one wire batch; a larger request goes alone, in slices.
- **Order**: gatherings of one ``(acks, topic, partition)`` enter the producer in the
  order they were opened (one lock each), and a request's records keep their order in
  their gathering, so records that land on one partition get increasing offsets in
  arrival order. A slice that fails stops the slices after it (sending them would put
  them before the failed ones).
- A failure is reported only for the records it concerns: ``SendFailed.sent`` is False
  when nothing of the part was queued (so nothing was written).

Thread-safety: event loop only (no locking beyond the per-partition order locks).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from strata.client import RECORD_OVERHEAD, BatchMetadata, BufferFullError

if TYPE_CHECKING:
    from ingest_gateway._config import GatewayConfig
    from ingest_gateway._metrics import GatewayMetrics
    from strata.client import AsyncProducer

__all__ = ["SLICE_OVERHEAD", "Coalescer", "Gathering", "Part", "ProducerPool", "SendFailed",
           "byte_slices", "locate", "part_of"]


class ProducerPool(Protocol):
    """What the coalescer uses of its process's shared state (``_state.GatewayState``):
    the settings, the metrics and the shared producer per ``acks`` value. A protocol, so
    the state can own the coalescer without either module importing the other."""

    config: GatewayConfig
    metrics: GatewayMetrics

    async def producer(self, acks: str) -> AsyncProducer: ...


@dataclass(slots=True)
class Gathering:
    """Records of concurrent requests bound for the producer together. Its future
    resolves to ``(parts, timestamp)``: each part ``(start, end, outcome)`` covers the
    records ``start .. end-1``, sent as one ``send_batch`` of at most ``batch_size``
    bytes, so a failure (a partition's leader down, a full buffer) is reported only for
    the records it concerns."""

    future: asyncio.Future[tuple[list[Part], int]]
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    has_keys: bool = False
    size: int = 0
    timer: asyncio.TimerHandle | None = None


#: Bytes per record that ``send_batch`` adds to the key and value bytes when it checks
#: whether a chunk fits ``batch_size`` in one go: ``RECORD_OVERHEAD`` plus its Arrow
#: columns' nbytes (4-byte key and value offsets, 8-byte timestamp, validity bits).
#: Slices cut with this are taken whole; a slice over it sends the same records but
#: through the producer's slower per-chunk size computation (~2x the CPU per call).
SLICE_OVERHEAD = RECORD_OVERHEAD + 17


def byte_slices(sizes: list[int], total: int, limit: int,
            overhead: int = RECORD_OVERHEAD) -> list[tuple[int, int]]:
    """``(start, end)`` index ranges of at most ``limit`` bytes (with ``overhead`` bytes
    per record); at least one record each. Cut by bisection over the running total, not
    a Python step per record (a gathering can hold thousands)."""
    n = len(sizes)
    if total + n * overhead <= limit:
        return [(0, n)]
    costs = list(itertools.accumulate(map(overhead.__add__, sizes)))
    out = []
    start = 0
    while start < n:
        before = costs[start - 1] if start else 0
        end = max(start + 1, bisect.bisect_right(costs, before + limit, start))
        out.append((start, end))
        start = end
    return out


class SendFailed(Exception):
    """A gathering's ``send_batch`` failed; ``sent`` is False when nothing was queued."""

    def __init__(self, error: BaseException, sent: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.sent = sent


class Coalescer:
    """Gathers coalescable records of all requests of one process into ``send_batch``
    calls, one gathering per ``(acks, topic, partition or None)``.

    A gathering is sent ``linger_ms`` after its first record, as soon as it holds
    ``batch_size`` bytes (counted as ``send_batch`` counts them, ``SLICE_OVERHEAD``), or
    before a request's records that would take it past that (they open the next one), so
    a full gathering travels as one wire batch. Sends of one ``(acks, topic, partition)``
    enter the producer in gathering order (one lock each), so per-partition order is the
    order records arrived in. Runs on the event loop only (no locking beyond that).
    """

    def __init__(self, state: ProducerPool) -> None:
        self.state = state
        self.linger_s = state.config.linger_ms / 1000
        self.batch_size = state.config.batch_size
        self._open: dict[tuple[str, str, int | None], Gathering] = {}
        self._order: dict[tuple[str, str, int | None], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, acks: str, topic: str, partition: int | None, keys: list[bytes | None],
            values: list[bytes | None], sizes: list[int]) -> tuple[Gathering, int]:
        """Queue records; returns their gathering and the index of the first of them."""
        where = (acks, topic, partition)
        gathering = self._open.get(where)
        incoming = sum(sizes)
        if gathering is not None and gathering.values and (
                gathering.size + incoming + (len(gathering.values) + len(values))
                * SLICE_OVERHEAD > self.batch_size):
            # these records would take it past one wire batch: send it as it is
            self._close(where, gathering)
            gathering = None
        loop = asyncio.get_running_loop()
        if gathering is None:
            gathering = self._open[where] = Gathering(loop.create_future())
            if self.linger_s > 0:
                gathering.timer = loop.call_later(self.linger_s, self._close, where, gathering)
            else:
                gathering.timer = loop.call_soon(self._close, where, gathering)  # type: ignore[assignment]
        start = len(gathering.values)
        gathering.values += values
        gathering.keys += keys
        gathering.sizes += sizes
        if not gathering.has_keys:
            gathering.has_keys = keys.count(None) != len(keys)
        gathering.size += incoming
        if gathering.size + len(gathering.values) * SLICE_OVERHEAD >= self.batch_size:
            self._close(where, gathering)
        return gathering, start

    def _close(self, where: tuple[str, str, int | None], gathering: Gathering) -> None:
        if self._open.get(where) is not gathering:
            return
        del self._open[where]
        if gathering.timer is not None:
            gathering.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._send(where, gathering))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, where: tuple[str, str, int | None], gathering: Gathering) -> None:
        acks, topic, partition = where
        values, keys = gathering.values, gathering.keys if gathering.has_keys else None
        slices = byte_slices(gathering.sizes, gathering.size, self.batch_size, SLICE_OVERHEAD)
        parts: list[Part] = []
        queued: list[tuple[int, int, asyncio.Future[list[BatchMetadata]]]] = []
        timestamp = time.time_ns() // 1_000_000
        try:
            producer = await self.state.producer(acks)
            lock = self._order.get(where)
            if lock is None:
                lock = self._order[where] = asyncio.Lock()
            async with lock:
                for number, (start, end) in enumerate(slices):
                    try:
                        delivery = await producer.send_batch(
                            topic, values[start:end] if len(slices) > 1 else values,
                            keys=(keys[start:end] if len(slices) > 1 else keys)
                            if keys is not None else None,
                            partition=partition, timestamp_ms=timestamp)
                    except BufferFullError as err:
                        accepted = err.records_accepted
                        if accepted and err.accepted is not None:
                            queued.append((start, start + accepted, err.accepted))
                        parts.append((start + accepted, end, SendFailed(err, False)))
                        raise _Stop(slices[number + 1:], err) from None
                    except Exception as err:
                        parts.append((start, end, SendFailed(err, False)))
                        raise _Stop(slices[number + 1:], err) from None
                    queued.append((start, end, delivery))
                    self.state.metrics.batch(end - start)
        except _Stop as stop:
            # later slices stay unsent: sending them would put them before the failed ones
            parts += [(start, end, SendFailed(stop.error, False)) for start, end in stop.rest]
        except Exception as err:  # no producer (shutting down, brokers unreachable)
            parts = [(start, end, SendFailed(err, False)) for start, end in slices]
        for start, end, delivery in queued:
            try:
                parts.append((start, end, await delivery))
            except Exception as err:
                parts.append((start, end, SendFailed(err, True)))
        if not gathering.future.done():
            gathering.future.set_result((sorted(parts, key=lambda part: part[0]), timestamp))

    async def close(self, timeout: float) -> None:
        """Send every open gathering now; wait up to ``timeout`` s for their outcomes
        (closing the producer afterwards delivers or fails whatever is still out)."""
        for where, gathering in list(self._open.items()):
            self._close(where, gathering)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


class _Stop(Exception):
    def __init__(self, rest: list[tuple[int, int]], error: BaseException) -> None:
        super().__init__(str(error))
        self.rest = rest
        self.error = error


#: ``(start, end, outcome)`` of one ``send_batch`` of a gathering.
Part = tuple[int, int, "list[BatchMetadata] | SendFailed"]


def part_of(parts: list[Part], index: int) -> tuple[list[BatchMetadata] | SendFailed, int]:
    """The outcome covering record ``index`` of a gathering and the record's index in it."""
    for start, end, outcome in parts:
        if start <= index < end:
            return outcome, index - start
    raise LookupError(f"record {index} is in no part of its gathering")


def locate(metas: list[BatchMetadata], index: int) -> tuple[BatchMetadata, int] | None:
    """The wire batch holding record ``index`` of a gathering, and the record's index
    within it (a gathering larger than ``batch_size`` travels as several batches)."""
    for meta in metas:
        if index < meta.record_count:
            return meta, index
        index -= meta.record_count
    return None

