"""The example deployment files (deploy/, docs/deployment.md) match the code: the
Prometheus configuration parses and scrapes every kind of Strata process, every metric
the Grafana dashboard queries is one the code exports, and every `strata` command line
in the systemd units is one the CLI accepts."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from strata_tools.cli import build_parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
#: The modules that register Prometheus metrics.
METRIC_SOURCES = ("brokers/metrics.py", "brokers/group_coordinator.py",
                  "ingest_gateway/_metrics.py", "spark_jobs/metrics.py")


def exported_metrics() -> set[str]:
    names: set[str] = set()
    for source in METRIC_SOURCES:
        names |= set(re.findall(r'"(strata_[a-z_]+)"', (REPO / source).read_text()))
    return names


def test_prometheus_scrapes_every_kind_of_process() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"strata-broker", "strata-gateway", "strata-tier"}
    assert all(job["static_configs"][0]["targets"] for job in jobs.values())


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exported = exported_metrics()
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"strata_[a-z_]+", target["expr"])}
    assert queried, "the dashboard queries nothing"
    unknown = {name for name in queried if not any(
        name.removesuffix(suffix) in exported for suffix in ("", "_total", "_bucket"))}
    assert unknown == set(), f"the dashboard queries metrics nobody exports: {unknown}"
    # Everything the operator must watch (docs/deployment.md, "Monitoring") is on it.
    for needed in ("strata_partition_under_replicated", "strata_offline_partitions",
                   "strata_isr_shrinks_total", "strata_request_latency_seconds_bucket",
                   "strata_group_lag_records", "strata_tier_lag_records"):
        assert needed in queried, needed


@pytest.mark.parametrize("unit", sorted((DEPLOY / "systemd").glob("*.service")),
                         ids=lambda p: p.stem)
def test_systemd_units_run_commands_the_cli_accepts(unit: Path) -> None:
    text = unit.read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", text, re.MULTILINE)
    assert "[Install]" in text and "Restart=on-failure" in text
    words = shlex.split(exec_start)
    if unit.stem == "strata-zookeeper":  # a java command line, not the CLI
        assert "org.apache.zookeeper.server.quorum.QuorumPeerMain" in exec_start
        return
    assert Path(words[0]).name == "strata", exec_start
    args = build_parser().parse_args(words[1:])
    assert callable(args.handler)
