"""The Spark benchmark commands run end to end on a tiny workload (their figures are
for ``make bench``; here only that they work and report what they measured)."""

from __future__ import annotations

import pytest

from strata_tools.perf_spark import bench_spark_read
from strata_tools.perf_spark_sink import bench_spark_e2e, bench_spark_write
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(300)]


def test_spark_read_write_and_e2e_benchmarks_report_their_figures(
        broker: BrokerProcess) -> None:
    read = bench_spark_read(broker.bootstrap, "perf-read", 3000, partitions=2, runs=1)
    assert [r.records for r in read] == [3000]
    assert read[0].records_per_sec > 0

    written = bench_spark_write(broker.bootstrap, "perf-write", 3000, partitions=2, runs=1)
    assert [(r.delivery, r.records) for r in written] == [("exactly-once", 3000),
                                                          ("at-least-once", 3000)]

    # The window starts at the first record out: under a full test run's load the
    # query's first micro-batches once took longer than a whole 8-s window.
    e2e = bench_spark_e2e(broker.bootstrap, rate=500, seconds=4, warmup=1, partitions=2)
    assert e2e.records > 0
    assert 0 < e2e.p50_ms <= e2e.p99_ms <= e2e.max_ms
