"""The broker's long-lived heap and the cyclic garbage collector.

Why: ten thousand partitions are a few million Python objects that live as long as
the broker (partitions, logs, indexes, states, follower positions). CPython's cyclic
collector walks every tracked object of the oldest generation at each full
collection, on whichever thread allocates, which is the event loop: at that scale a
full collection is a 40 to 300 ms pause, several times a minute under load, and it is
what a produce request's p99 latency measured (``docs/benchmarks.md``, "Scale").

What: objects that survived a full collection are frozen (``gc.freeze``) so later
collections skip them and look only at what was allocated since:

- after topics come or go (debounced, ``settle_soon``), the whole heap;
- after every full collection, its survivors (``gc.callbacks``, applied on the event
  loop right after the collection);
- every ``FULL_COLLECT_S``, and after topics were dropped, the heap is unfrozen and
  collected once in full before it is frozen again.

Invariant: frozen objects still die by reference count the moment nothing refers to
them; only garbage *cycles* among frozen objects wait, until the next full
collection, at most ``FULL_COLLECT_S`` later, so memory cannot grow without bound.
The price is one full pause per ``FULL_COLLECT_S`` instead of one every few seconds.

Thread-safety: the ``gc`` module's state is process-wide; every method runs on the
event loop except the ``gc.callbacks`` hook, which only reads the clock, observes a
metric and schedules work onto the loop. Several brokers in one process (tests) each
keep their own hook; freezing twice is harmless.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from brokers.metrics import BrokerMetrics

__all__ = ["FULL_COLLECT_S", "HeapKeeper"]

log = logging.getLogger("strata.brokers.heap")

#: Quiet time after topics came or went before the heap is frozen: a burst of
#: creations or deletions settles once.
SETTLE_DELAY_S: Final = 1.0
#: Longest time a garbage cycle among frozen objects waits to be collected.
FULL_COLLECT_S: Final = 600.0


class HeapKeeper:
    """Freezes the broker's long-lived heap and records collector pauses."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settle: asyncio.TimerHandle | None = None
        self._collect_due = False
        self._gc_started: float | None = None
        self._refreeze_pending = False
        self._last_full = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        gc.callbacks.append(self._on_gc)
        self._task = self._loop.create_task(self._periodic_full_collect())

    def stop(self) -> None:
        if self._settle is not None:
            self._settle.cancel()
        if self._task is not None:
            self._task.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def settle_soon(self, *, collect: bool = False) -> None:
        """Freeze the heap after a short quiet time (topics were loaded); ``collect``:
        collect in full first (topics were dropped: their cycles must go)."""
        self._collect_due |= collect
        if self._settle is not None:
            self._settle.cancel()
        self._settle = asyncio.get_running_loop().call_later(SETTLE_DELAY_S, self._settle_now)

    def _settle_now(self) -> None:
        if self._collect_due:
            self._collect_due = False
            self.full_collect()
        else:
            gc.freeze()

    def full_collect(self) -> None:
        """Unfreeze, collect everything once, freeze the survivors."""
        began = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self._last_full = time.monotonic()
        log.debug("full garbage collection: %d unreachable objects, %d frozen, %.0f ms",
                  found, gc.get_freeze_count(), (time.perf_counter() - began) * 1000)

    async def _periodic_full_collect(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self._last_full + FULL_COLLECT_S - time.monotonic()))
            if time.monotonic() - self._last_full >= FULL_COLLECT_S:
                self.full_collect()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` hook: record the pause; after a full collection, freeze its
        survivors (on the loop: the collector must not be re-entered from here)."""
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        if self._gc_started is None:
            return
        generation = info.get("generation", -1)
        self._metrics.gc_pause.labels(str(generation)).observe(
            time.perf_counter() - self._gc_started)
        self._gc_started = None
        if generation == 2 and not self._refreeze_pending and self._loop is not None \
                and not self._loop.is_closed():
            self._refreeze_pending = True
            self._loop.call_soon_threadsafe(self._refreeze)

    def _refreeze(self) -> None:
        self._refreeze_pending = False
        gc.freeze()
