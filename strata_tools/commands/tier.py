"""``strata tier run``: copy aged segments into Delta (spark_jobs/README.md).

    strata tier run [--topic T ...] [--once | --every SECONDS] --warehouse LOCATION
                    [--bootstrap ...] [--lease-ttl-s S] [--metrics-port P]

Each pass prints one JSON line (``--format json``) or a short table: segments, records and
bytes copied, seconds, and per partition the lag behind the hot log. With ``--every`` the
job runs until SIGTERM/SIGINT, which it honours between passes (a pass in flight finishes,
so no Delta commit is left without its recorded progress for long). The job needs only
the brokers (``--bootstrap``): its lease and progress go through them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    security_of_args,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from strata_spark import Warehouse

__all__ = ["register", "tier_spark_session"]

WAREHOUSE_ENV = "STRATA_WAREHOUSE"


def register(sub: Any) -> None:
    tier = sub.add_parser("tier", help="the Delta tier: copy aged segments, retention, compaction")
    tier_sub = tier.add_subparsers(dest="tier_command", metavar="COMMAND", required=True)
    run = tier_sub.add_parser("run", help="run the tiering job once or every N seconds")
    add_bootstrap(run)
    add_format(run)
    run.add_argument("--warehouse", default=None, metavar="LOCATION",
                     help="where the Delta tables are: a directory, file:///path or "
                     "s3://bucket[/prefix] (credentials and endpoint from the AWS "
                     f"environment, never here; default: ${WAREHOUSE_ENV})")
    run.add_argument("--topic", action="append", default=None, metavar="T",
                     help="tier only this topic (repeatable; default: every topic with "
                     "tier.enable=true)")
    when = run.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one pass, then exit (default)")
    when.add_argument("--every", type=float, default=None, metavar="SECONDS",
                      help="a pass every SECONDS until stopped")
    run.add_argument("--max-bytes-per-write", type=int, default=1024 * 1024 * 1024,
                     help="segment bytes per Delta commit at most, over all partitions of "
                     "a topic (default 1 GiB; a killed job redoes at most this)")
    run.add_argument("--vacuum-retain-hours", type=float, default=168.0,
                     help="VACUUM RETAIN hours after retention deletes (default 168, rounded up "
                     "to whole hours; below it, reads of older table versions may miss "
                     "files)")
    run.add_argument("--optimize-interval-s", type=float, default=3600.0,
                     help="OPTIMIZE a table when its last OPTIMIZE is older (default 3600)")
    run.add_argument("--lease-wait-s", type=float, default=30.0,
                     help="how long to wait for another job's lease on a topic")
    run.add_argument("--lease-ttl-s", type=float, default=30.0,
                     help="how long a topic's lease outlives this job if it dies without "
                     "giving it up (renewed every third of it; 1..600, default 30)")
    run.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics of the job on this port")
    run.add_argument("--log-level", default="info",
                     choices=("critical", "error", "warning", "info", "debug"),
                     help="the job's own log on stderr (each copy, DELETE, VACUUM, OPTIMIZE)")
    run.set_defaults(handler=_run)


def tier_spark_session(warehouse: Warehouse | None = None) -> SparkSession:
    """The job's SparkSession: ``strata_spark.spark_session`` (``conf/``, the driver on
    127.0.0.1 for a local master unless configured otherwise) with 2 shuffle partitions,
    and what an object-store ``warehouse`` needs (``Warehouse.spark_conf``: the S3A
    connector, the endpoint; no credential). The job's commits are delta-rs's, so no
    Delta commit setting (VACUUM's retention check among them) applies here."""
    from strata_spark import spark_session

    conf = {"spark.sql.shuffle.partitions": "2"}
    if warehouse is not None:
        conf.update(warehouse.spark_conf())
    return spark_session("strata-tier", conf)


def _run(args: argparse.Namespace) -> int:
    from strata_tools.extras import require

    # The job runs Spark and writes with delta-rs: say which extra is missing first.
    require("spark", "`strata tier run` (the tiering job runs Spark and delta-rs)")
    from spark_jobs import TierJob, TierSettings
    from spark_jobs.metrics import JobMetrics

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.every is not None and args.every <= 0:
        raise CommandError(f"--every must be a positive number of seconds, not {args.every}")
    warehouse = args.warehouse or os.environ.get(WAREHOUSE_ENV, "")
    if not warehouse:
        raise CommandError(f"no warehouse given: pass --warehouse LOCATION or export "
                           f"{WAREHOUSE_ENV}")
    # The location is parsed (INVALID_WAREHOUSE) before anything is read or written.
    settings = TierSettings(bootstrap_of(args), warehouse,
                            security=security_of_args(args),
                            max_bytes_per_write=args.max_bytes_per_write,
                            vacuum_retain_hours=args.vacuum_retain_hours,
                            optimize_interval_s=args.optimize_interval_s,
                            lease_wait_s=args.lease_wait_s, lease_ttl_s=args.lease_ttl_s,
                            # The session is the job's own and ends with it: nobody
                            # queries its catalog (TierSettings.register_catalog).
                            register_catalog=False)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    metrics = JobMetrics(args.metrics_port) if args.metrics_port is not None else None
    where = settings.warehouse
    assert not isinstance(where, (str, Path))  # parsed by TierSettings
    job = TierJob(lambda: tier_spark_session(where), settings)
    try:
        if args.every is not None:
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        while True:
            if args.every is None:
                report = job.run_once(args.topic)
            else:
                try:
                    report = job.run_once(args.topic, keep_going=True)
                except Exception:  # brokers unreachable: try the next pass
                    logging.getLogger("strata.spark_jobs.tier").exception(
                        "tier pass failed; the next one starts in %s s", args.every)
                    if stop.wait(args.every):
                        return 0
                    continue
            if metrics is not None:
                metrics.observe(report)
            _print(report.to_json(), args.format)
            if args.every is None:
                return 1 if any(t.error or t.busy for t in report.topics) else 0
            if stop.wait(args.every):
                return 0
    finally:
        job.close()
        if job.spark_started:
            job.spark.stop()


def _print(report: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        emit_json(report)
        return
    print(f"tier pass: {report['segments']} segments, {report['records']} records, "
          f"{report['bytes']} bytes in {report['seconds']:.2f} s", flush=True)
    for topic in report["topics"]:
        if topic["error"]:
            print(f"  {topic['topic']}: failed: {topic['error']}", flush=True)
            continue
        if topic["busy"]:
            print(f"  {topic['topic']}: busy (another job holds its lease)", flush=True)
            continue
        for p in topic["partitions"]:
            print(f"  {p['topic']}-{p['partition']}: tiered up to {p['tiered_up_to']} "
                  f"(from {p['tier_start']}), +{p['records']} records, lag "
                  f"{p['lag_records']} records / {p['lag_ms']} ms", flush=True)
