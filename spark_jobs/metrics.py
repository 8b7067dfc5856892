"""Prometheus metrics of a long-running tiering job (``strata tier run --metrics-port``).

A public module outside the package's ``__init__``: whoever runs the job imports it
(``from spark_jobs.metrics import JobMetrics``), while importing ``spark_jobs`` itself,
which every Spark task of a copy does, does not load prometheus_client.

The brokers export the same lag from their side (``strata_tier_lag_records``); the job's
own figures say what it did: segments, records and bytes copied, and pass durations.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from spark_jobs._job import TierReport

__all__ = ["JobMetrics"]


class JobMetrics:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry()
        self.segments = Counter("strata_tier_job_segments", "segments copied to Delta",
                                ["topic"], registry=self.registry)
        self.records = Counter("strata_tier_job_records", "records copied to Delta",
                               ["topic"], registry=self.registry)
        self.bytes = Counter("strata_tier_job_bytes", "segment bytes copied to Delta",
                             ["topic"], registry=self.registry)
        self.passes = Histogram("strata_tier_job_pass_seconds", "duration of one job pass",
                                registry=self.registry)
        self.lag = Gauge("strata_tier_job_lag_records",
                         "records on the leader not yet in Delta, at the end of the last pass",
                         ["topic", "partition"], registry=self.registry)
        start_http_server(port, addr=host, registry=self.registry)

    def observe(self, report: TierReport) -> None:
        self.passes.observe(report.seconds)
        for topic in report.topics:
            for p in topic.partitions:
                self.segments.labels(topic.topic).inc(p.segments)
                self.records.labels(topic.topic).inc(p.records)
                self.bytes.labels(topic.topic).inc(p.bytes)
                self.lag.labels(topic.topic, str(p.partition)).set(p.lag_records)
