"""Prometheus metrics of the gateway, in a registry of its own.

With several workers (``serve_workers`` sets ``PROMETHEUS_MULTIPROC_DIR`` for them),
prometheus_client keeps every worker's values in files there and ``/metrics``, whichever
worker answers it, renders the sum over all workers (a worker that was replaced still
counts). Children of labelled metrics are cached: ``labels()`` takes a lock and builds a tuple,
which the produce path would otherwise pay several times per request.

Counter increments and histogram observations are gathered in the worker and applied
every 0.2 s (``flush``, which ``/metrics`` also calls first): in multiprocess mode each
``inc`` or ``observe`` is a locked write to a shared file with a pid check, which cost
about 4 % of a worker's CPU at 12,000 single-record requests/s when done per request.
A histogram's gathered observations are applied per bucket (its sum once, each bucket's
count once); prometheus-client is pinned, and ``_check_histogram_internals`` checks at
start-up that histogram children have the ``_sum`` / ``_buckets`` / ``_upper_bounds``
it relies on.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

#: Set by the worker supervisor: the workers' shared metric files.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

__all__ = ["GatewayMetrics"]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "strata_gateway_requests", "HTTP requests answered",
            ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram(
            "strata_gateway_request_seconds", "Time to answer an HTTP request",
            ["method", "route"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.records = Counter(
            "strata_gateway_records_produced", "Records acknowledged by the brokers",
            ["topic"], registry=self.registry)
        self.bytes = Counter(
            "strata_gateway_bytes_produced", "Key, value and header bytes acknowledged",
            ["topic"], registry=self.registry)
        self.errors = Counter(
            "strata_gateway_errors", "Error answers (whole requests and single records)",
            ["error_code"], registry=self.registry)
        self.batch_records = Histogram(
            "strata_gateway_batch_records",
            "Records per producer send: the records of concurrent requests gathered "
            "for one partition (see linger_ms)", registry=self.registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000))
        self._children: dict[tuple[Any, ...], Any] = {}
        #: Counter increments not yet applied (``flush``): with several workers every
        #: increment is a locked write to a shared file, a few per request otherwise.
        self._pending: dict[tuple[Any, ...], float] = {}
        #: Histogram observations not yet applied, per child: [sum, count per bucket].
        self._observed: dict[tuple[Any, ...], list[Any]] = {}
        _check_histogram_internals(self.batch_records)

    def _add(self, metric: Any, amount: float, *labels: str) -> None:
        key = (metric, *labels)
        self._pending[key] = self._pending.get(key, 0.0) + amount

    def _observe(self, metric: Any, value: float, *labels: str) -> None:
        key = (metric, *labels)
        observed = self._observed.get(key)
        if observed is None:
            bounds = self._child(metric, *labels)._upper_bounds
            observed = self._observed[key] = [0.0, [0] * len(bounds), bounds]
        observed[0] += value
        observed[1][bisect.bisect_left(observed[2], value)] += 1

    def flush(self) -> None:
        """Apply the pending counter increments and histogram observations (the app
        calls this every 0.2 s and before rendering)."""
        pending, self._pending = self._pending, {}
        for (metric, *labels), amount in pending.items():
            self._child(metric, *labels).inc(amount)
        observed, self._observed = self._observed, {}
        for (metric, *labels), (total, counts, _) in observed.items():
            child = self._child(metric, *labels)
            child._sum.inc(total)
            for bucket, count in zip(child._buckets, counts, strict=True):
                if count:
                    bucket.inc(count)

    def _child(self, metric: Any, *labels: str) -> Any:
        if not labels:
            return metric  # an unlabelled metric is its own child
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request."""
        self._add(self.requests, 1, method, route, str(status))
        self._observe(self.latency, seconds, method, route)

    def batch(self, records: int) -> None:
        """One producer send of ``records`` gathered records."""
        self._observe(self.batch_records, records)

    def record_topic(self, topic: str, size: int, records: int = 1) -> None:
        """``records`` acknowledged records of ``size`` bytes in all."""
        self._add(self.records, records, topic)
        self._add(self.bytes, size, topic)

    def error(self, error_code: int) -> None:
        self._add(self.errors, 1, str(error_code))

    def render(self) -> bytes:
        self.flush()
        path = os.environ.get(MULTIPROC_ENV)
        if not path:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined, path=path)  # type: ignore[no-untyped-call]
        return generate_latest(combined)


def _check_histogram_internals(child: Any) -> None:
    """``flush`` applies gathered observations through a histogram child's ``_sum``,
    ``_buckets`` and ``_upper_bounds`` (prometheus-client 0.26): fail at start-up, not at
    the first flush, if a new version moved them."""
    if not (hasattr(child, "_sum") and hasattr(child, "_buckets")
            and list(getattr(child, "_upper_bounds", ()))[-1:] == [float("inf")]
            and len(child._buckets) == len(child._upper_bounds)):
        raise RuntimeError("prometheus-client's Histogram changed its internals; the "
                           "gateway's metrics need updating (ingest_gateway/_metrics.py)")
