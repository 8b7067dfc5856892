"""Prometheus metrics of one broker, served over HTTP at ``/metrics``.

Names (all prefixed ``strata_``):

    requests_total{api, error}              counter   requests handled, by API and outcome
    request_latency_seconds{api}            histogram time from frame read to response sent
    bytes_in_total / bytes_out_total        counter   request / response frame bytes
    connections                             gauge     open client connections
    partition_log_end_offset{topic,partition}    gauge (collected live)
    partition_log_start_offset{topic,partition}  gauge
    partition_high_watermark{topic,partition}    gauge
    partition_size_bytes{topic,partition}        gauge
    partition_under_replicated{topic,partition}  gauge 1 while the ISR of a partition this
                                                      broker leads is smaller than its
                                                      replica set, else 0
    offline_partitions                      gauge     hosted partitions whose log could not
                                                      be opened or failed (STORAGE_ERROR)
    isr_shrinks_total / isr_expands_total   counter   ISR changes of partitions this broker
                                                      leads (each change counted once, by
                                                      its leader)
    tier_tiered_offset{topic,partition}          gauge (tier.enable topics this broker leads)
    tier_lag_records{topic,partition}            gauge high watermark - tiered offset
    cleaner_records_removed_total           counter   records the log cleaner dropped
    cleaner_bytes_before_total / cleaner_bytes_after_total
                                            counter   size of the segments it rewrote,
                                                      before and after
    cleaner_last_pass_seconds               gauge     duration of the last cleaner pass
    cleaner_errors_total                    counter   partitions whose cleaning failed
    event_loop_lag_seconds                  histogram how late a 100 ms timer on the event
                                                      loop fires: how long any request
                                                      waited behind other work
    gc_pause_seconds{generation}            histogram cyclic garbage-collector pauses of
                                                      the process (all its threads wait)

The two tier gauges come from the last retention pass, which reads the tiering progress
from ZooKeeper (scrapes must not hit ZooKeeper); a partition appears only while this
broker leads it and its topic has ``tier.enable=true``.

Each broker has its own registry, so several brokers in one test process do not mix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BrokerMetrics", "HealthStats", "PartitionStats", "TierStats"]

# (topic, partition, log_start, log_end, high_watermark, size_bytes)
PartitionStats = tuple[str, int, int, int, int, int]
# (topic, partition, tiered_up_to, lag in records)
TierStats = tuple[str, int, int, int]
# ([(topic, partition, under-replicated) for every partition led here], offline count)
HealthStats = tuple[list[tuple[str, int, bool]], int]

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)


class _PartitionCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[PartitionStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        families = {
            "log_end_offset": GaugeMetricFamily(
                "strata_partition_log_end_offset", "next offset to be written",
                labels=["topic", "partition"]),
            "log_start_offset": GaugeMetricFamily(
                "strata_partition_log_start_offset", "first readable offset",
                labels=["topic", "partition"]),
            "high_watermark": GaugeMetricFamily(
                "strata_partition_high_watermark", "offsets below it are committed",
                labels=["topic", "partition"]),
            "size_bytes": GaugeMetricFamily(
                "strata_partition_size_bytes", "bytes of log segments on disk",
                labels=["topic", "partition"]),
        }
        for topic, partition, start, end, hw, size in self._source():
            labels = [topic, str(partition)]
            families["log_end_offset"].add_metric(labels, end)
            families["log_start_offset"].add_metric(labels, start)
            families["high_watermark"].add_metric(labels, hw)
            families["size_bytes"].add_metric(labels, size)
        yield from families.values()


class _TierCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[TierStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        offset = GaugeMetricFamily(
            "strata_tier_tiered_offset",
            "exclusive end offset of the records copied to the Delta table",
            labels=["topic", "partition"])
        lag = GaugeMetricFamily(
            "strata_tier_lag_records",
            "records below the high watermark not yet in the Delta table",
            labels=["topic", "partition"])
        for topic, partition, tiered_up_to, behind in self._source():
            labels = [topic, str(partition)]
            offset.add_metric(labels, tiered_up_to)
            lag.add_metric(labels, behind)
        yield offset
        yield lag


class _HealthCollector(Collector):
    def __init__(self, source: Callable[[], HealthStats]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        under = GaugeMetricFamily(
            "strata_partition_under_replicated",
            "1 while the partition's ISR is smaller than its replica set (its leader reports)",
            labels=["topic", "partition"])
        offline = GaugeMetricFamily(
            "strata_offline_partitions", "hosted partitions whose log is offline")
        led, offline_count = self._source()
        for topic, partition, is_under in led:
            under.add_metric([topic, str(partition)], 1 if is_under else 0)
        offline.add_metric([], offline_count)
        yield under
        yield offline


class FetchCacheCollector(Collector):
    """The Kafka listener's converted-batch cache (brokers/kafka/fetch_cache.py):
    ``source`` returns its (hits, misses, kept, ahead, bytes)."""

    def __init__(self, source: Callable[[], tuple[int, int, int, int, int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        hits, misses, kept, ahead, size = self._source()
        yield CounterMetricFamily(
            "strata_kafka_fetch_cache_hits",
            "batches a Kafka fetch took from the converted-batch cache", value=hits)
        yield CounterMetricFamily(
            "strata_kafka_fetch_cache_misses",
            "batches a Kafka fetch converted to RecordBatch v2", value=misses)
        yield CounterMetricFamily(
            "strata_kafka_fetch_cache_kept",
            "batches Kafka clients produced, kept as sent for Kafka readers", value=kept)
        yield CounterMetricFamily(
            "strata_kafka_fetch_cache_ahead",
            "of the misses, batches converted ahead of the Kafka reader that will fetch "
            "them next", value=ahead)
        yield GaugeMetricFamily(
            "strata_kafka_fetch_cache_bytes", "bytes the converted-batch cache holds",
            value=size)


def _no_health() -> HealthStats:
    return [], 0


class BrokerMetrics:
    def __init__(self, partitions: Callable[[], Iterable[PartitionStats]],
                 tier: Callable[[], Iterable[TierStats]] = tuple,
                 health: Callable[[], HealthStats] = _no_health) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("strata_requests_total", "requests handled",
                                ["api", "error"], registry=self.registry)
        self.latency = Histogram("strata_request_latency_seconds", "request latency",
                                 ["api"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.bytes_in = Counter("strata_bytes_in_total", "request bytes received",
                                registry=self.registry)
        self.bytes_out = Counter("strata_bytes_out_total", "response bytes sent",
                                 registry=self.registry)
        self.connections = Gauge("strata_connections", "open client connections",
                                 registry=self.registry)
        self.cleaner_removed = Counter(
            "strata_cleaner_records_removed_total", "records the log cleaner dropped",
            registry=self.registry)
        self.cleaner_bytes_before = Counter(
            "strata_cleaner_bytes_before_total",
            "bytes of the segments the log cleaner rewrote, before", registry=self.registry)
        self.cleaner_bytes_after = Counter(
            "strata_cleaner_bytes_after_total",
            "bytes of the segments the log cleaner rewrote, after", registry=self.registry)
        self.cleaner_last_pass = Gauge(
            "strata_cleaner_last_pass_seconds", "duration of the last log cleaner pass",
            registry=self.registry)
        self.cleaner_errors = Counter(
            "strata_cleaner_errors_total", "partitions whose cleaning failed",
            registry=self.registry)
        self.event_loop_lag = Histogram(
            "strata_event_loop_lag_seconds",
            "how late a 100 ms timer on the broker's event loop fires", buckets=_LAG_BUCKETS,
            registry=self.registry)
        self.gc_pause = Histogram(
            "strata_gc_pause_seconds", "cyclic garbage-collector pauses of the process",
            ["generation"], buckets=_LAG_BUCKETS, registry=self.registry)
        self.isr_shrinks = Counter(
            "strata_isr_shrinks_total", "ISR shrinks of partitions this broker leads",
            registry=self.registry)
        self.isr_expands = Counter(
            "strata_isr_expands_total", "ISR expansions of partitions this broker leads",
            registry=self.registry)
        self.registry.register(_PartitionCollector(partitions))
        self.registry.register(_TierCollector(tier))
        self.registry.register(_HealthCollector(health))
        self._server: Any = None
        self.port = -1

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint in a daemon thread; return the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        self.port = int(server.server_port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
