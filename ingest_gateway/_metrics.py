"""Prometheus metrics of one gateway process, in a registry of its own.

With several uvicorn workers each worker serves its own numbers on ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

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

    def render(self) -> bytes:
        return generate_latest(self.registry)
