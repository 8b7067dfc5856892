"""Prometheus metrics of the gateway, in a registry of its own.

With several workers (``serve_workers`` sets ``PROMETHEUS_MULTIPROC_DIR`` for them),
prometheus_client keeps every worker's values in files there and ``/metrics``, whichever
worker answers it, renders the sum over all workers (a worker that was replaced still
counts). Children of labelled metrics are cached: ``labels()`` takes a lock and builds a tuple,
which the produce path would otherwise pay several times per request.
"""

from __future__ import annotations

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

    def _add(self, metric: Any, amount: float, *labels: str) -> None:
        key = (metric, *labels)
        self._pending[key] = self._pending.get(key, 0.0) + amount

    def flush(self) -> None:
        """Apply the pending counter increments (the app calls this every 0.2 s and
        before rendering)."""
        pending, self._pending = self._pending, {}
        for (metric, *labels), amount in pending.items():
            self._child(metric, *labels).inc(amount)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request."""
        self._add(self.requests, 1, method, route, str(status))
        self._child(self.latency, method, route).observe(seconds)

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
