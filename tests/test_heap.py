"""The broker's heap keeper (brokers/heap.py) with the real collector: the heap is
frozen after a settle and after each full collection, pauses are measured, and
garbage cycles among frozen objects are still freed by the next full collection."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Iterator

import pytest

from brokers import heap
from brokers.heap import HeapKeeper
from brokers.metrics import BrokerMetrics

pytestmark = pytest.mark.unit


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def clean_gc() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session must not run with a frozen heap


def _cycle() -> list[_Node]:
    """Two objects that refer to each other: only the cyclic collector frees them."""
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return [first, second]


@contextlib.asynccontextmanager
async def _keeper(metrics: BrokerMetrics) -> AsyncIterator[HeapKeeper]:
    keeper = HeapKeeper(metrics)
    keeper.start()
    try:
        yield keeper
    finally:
        keeper.stop()
    assert keeper._on_gc not in gc.callbacks


def _samples(metrics: BrokerMetrics, generation: str) -> float:
    value = metrics.registry.get_sample_value("strata_gc_pause_seconds_count",
                                              {"generation": generation})
    return value or 0.0


def test_settling_freezes_and_a_full_collection_still_frees_frozen_cycles(
        clean_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "SETTLE_DELAY_S", 0.01)
    metrics = BrokerMetrics(tuple)

    async def scenario() -> None:
        async with _keeper(metrics) as keeper:
            # A cycle that becomes garbage only after it was frozen.
            pair = _cycle()
            alive = weakref.ref(pair[0])
            keeper.settle_soon()
            await asyncio.sleep(0.1)
            assert gc.get_freeze_count() > 0, "settling freezes the heap"
            del pair
            gc.collect()  # a full collection skips frozen objects...
            assert alive() is not None
            await asyncio.sleep(0.01)
            assert gc.get_freeze_count() > 0, "its survivors are frozen again"
            keeper.settle_soon(collect=True)  # ...the keeper's unfreezes first
            await asyncio.sleep(0.1)
            assert alive() is None, "a frozen garbage cycle is freed by the full collect"
            assert gc.get_freeze_count() > 0

    asyncio.run(scenario())
    assert _samples(metrics, "2") >= 2  # the explicit collections were measured


def test_the_periodic_full_collection_runs_when_due(
        clean_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "FULL_COLLECT_S", 0.0)
    metrics = BrokerMetrics(tuple)

    async def scenario() -> None:
        async with _keeper(metrics):
            pair = _cycle()
            alive = weakref.ref(pair[0])
            gc.freeze()
            del pair
            # The loop wakes at least once a second and collects when due.
            for _ in range(30):
                await asyncio.sleep(0.1)
                if alive() is None:
                    break
            assert alive() is None

    asyncio.run(scenario())
