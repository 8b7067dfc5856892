"""Helpers for the analysts' notebooks in ``notebooks/``: find the stack, read its signals.

Why a module instead of code cells: the notebooks should show the analysis (SQL, plots),
not plumbing, and the plumbing here is typed, linted and exercised by
``tests/test_notebooks.py``. Everything reads what ``strata up`` already exposes:

* :func:`find_stack` runs ``strata status --format json`` for the data dir named by
  ``$STRATA_DATA_DIR`` (default ``.strata`` at the repository root, what ``make up`` uses);
* :func:`pick_topic` is ``$STRATA_TOPIC``, else the first topic with a Delta table;
* :func:`tier_passes` / :func:`tier_lag_rows` parse the tier job's log (one JSON object
  per pass; Spark's own log lines in between are skipped);
* :func:`scrape` / :func:`broker_samples` read the brokers' Prometheus endpoints;
* :func:`seed_topic` creates a tier-enabled topic with generated records spread over
  several hours, for a stack that has no data of its own yet
  (``python -m strata_tools.notebook seed``). The topic gets the stack's replication factor
  (``make up``: 3 brokers, factor 3, ``min.insync.replicas`` 2), since the records are
  produced with acks=all.

Rows come back as plain dicts (``pandas.DataFrame(rows)`` in the notebook) so this module
needs neither pandas nor Spark to import.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from wire.security import ClientSecurity

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from spark_jobs import TableLocation
    from strata_spark import Warehouse

__all__ = ["DATA_DIR_ENV", "TOPIC_ENV", "Sample", "Stack", "StackNotRunningError",
           "broker_samples", "data_dir", "find_stack", "notebook_spark", "pick_topic",
           "repo_root", "scrape", "seed_topic", "tier_lag_rows", "tier_passes"]

DATA_DIR_ENV = "STRATA_DATA_DIR"
TOPIC_ENV = "STRATA_TOPIC"

#: Broker i listens on base+10+i and serves metrics on base+40+i (strata_tools/stack.py).
_BROKER_METRICS_SHIFT = 30


class StackNotRunningError(RuntimeError):
    """No running stack in the data dir (the message says how to start one)."""


def repo_root() -> Path:
    """The checkout this module runs from (``<repo>/strata_tools/notebook.py``); for an
    installed package, the site-packages directory."""
    return Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """``$STRATA_DATA_DIR``; else the nearest ``.strata`` stack directory in the current
    directory or above it (a notebook runs in ``<repo>/notebooks``, ``make up`` keeps the
    stack in ``<repo>/.strata``); else ``.strata`` at the checkout's root, or in the
    current directory when running from an installed package (``strata up``'s default)."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    for directory in (Path.cwd(), *Path.cwd().parents):
        if (directory / ".strata" / "stack.json").is_file():
            return directory / ".strata"
    root = repo_root()
    return (root if (root / "pyproject.toml").is_file() else Path.cwd()) / ".strata"


@dataclass(frozen=True)
class Stack:
    """What ``strata status --format json`` says about a running stack."""

    data_dir: Path
    bootstrap: str
    zookeeper: str | None
    gateway: str | None
    #: The tier's warehouse: a directory or ``s3://bucket[/prefix]`` (``location``).
    warehouse: str
    tier_metrics: str | None
    processes: list[dict[str, Any]] = field(default_factory=list)
    #: ``strata status``'s ``security`` object on a ``strata up --secure`` stack.
    security: dict[str, Any] | None = None

    @property
    def client_security(self) -> ClientSecurity:
        """How a notebook's clients reach the brokers (as the stack's admin if secured)."""
        if not self.security:
            return ClientSecurity()
        return ClientSecurity(self.security["security_protocol"], "SCRAM-SHA-256",
                              self.security["admin_user"], self.security["admin_password"],
                              ssl_cafile=self.security["ca"])

    @property
    def source_options(self) -> dict[str, str]:
        """The ``format("strata")`` options that reach this stack's brokers."""
        return {"bootstrap.servers": self.bootstrap, **self.client_security.to_properties()}

    @property
    def tier_log(self) -> Path:
        for proc in self.processes:
            if proc.get("name") == "tier" and proc.get("log"):
                return Path(proc["log"])
        return self.data_dir / "tier" / "tier.log"

    @property
    def broker_metrics(self) -> list[str]:
        """One ``http://host:port/metrics`` URL per running broker."""
        urls = []
        for proc in self.processes:
            if str(proc.get("name", "")).startswith("broker-") and \
                    proc.get("state") in ("started", "running"):
                host = str(proc.get("endpoint", "127.0.0.1:0")).rsplit(":", 1)[0]
                urls.append(f"http://{host}:{int(proc['port']) + _BROKER_METRICS_SHIFT}/metrics")
        return urls

    @property
    def location(self) -> Warehouse:
        """The warehouse parsed (its Spark settings: ``location.spark_conf()``)."""
        from strata_spark import Warehouse

        return Warehouse.parse(self.warehouse)

    def table(self, topic: str) -> TableLocation:
        """``topic``'s Delta table: ``.sql`` for a query, ``.spark_uri`` for a load."""
        from spark_jobs import tier_table

        return tier_table(self.location, topic)

    def table_topics(self) -> list[str]:
        """Topics that have a Delta table in the warehouse (sorted)."""
        from spark_jobs import tiered_topics

        return tiered_topics(self.location)


def _strata_command() -> list[str]:
    script = Path(sys.executable).parent / "strata"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "strata_tools.cli"]


def find_stack(directory: Path | str | None = None) -> Stack:
    """The stack of ``directory`` (default :func:`data_dir`) via ``strata status``.

    Raises :class:`StackNotRunningError` when nothing runs there or the brokers are down.
    """
    where = Path(directory).expanduser().resolve() if directory is not None else data_dir()
    result = subprocess.run([*_strata_command(), "status", "--data-dir", str(where),
                             "--format", "json"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL, check=False)
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = None
    if not isinstance(info, dict) or not info.get("bootstrap"):
        raise StackNotRunningError(
            f"no running Strata stack in {where} (`strata status` exit {result.returncode}: "
            f"{(result.stderr or result.stdout).strip()[:300]}); start one with `make up` or "
            f"`strata up --data-dir {where}`, or point ${DATA_DIR_ENV} at the right data dir")
    return Stack(data_dir=Path(info.get("data_dir") or where), bootstrap=info["bootstrap"],
                 zookeeper=info.get("zookeeper"), gateway=info.get("gateway"),
                 warehouse=str(info.get("warehouse") or where / "warehouse"),
                 tier_metrics=info.get("tier_metrics"),
                 processes=list(info.get("processes") or []),
                 security=info.get("security"))


def pick_topic(stack: Stack, default: str | None = None) -> str:
    """``$STRATA_TOPIC``, else ``default``, else the first topic with a Delta table."""
    chosen = os.environ.get(TOPIC_ENV) or default
    tables = stack.table_topics()
    if chosen:
        if chosen not in tables:
            raise LookupError(
                f"topic {chosen!r} has no Delta table in {stack.warehouse}/topics (tables: "
                f"{', '.join(tables) or 'none'}); is tier.enable=true on it and has the tier "
                f"job run (`strata tier run --once`)?")
        return chosen
    if not tables:
        raise LookupError(
            f"no tiered topic in {stack.warehouse}: create one with tier.enable=true and run "
            "`strata tier run --once`, or seed demo data with "
            "`python -m strata_tools.notebook seed`")
    return tables[0]


def notebook_spark(app_name: str, extra_conf: Mapping[str, str] | None = None, *,
                   stack: Stack | None = None) -> SparkSession:
    """A session for a notebook: ``strata_spark.spark_session`` plus

    * what ``stack``'s warehouse needs (``Warehouse.spark_conf``: for ``s3://``, the S3A
      connector and the endpoint; the credentials come from the kernel's environment);

    * a throwaway ``spark.sql.warehouse.dir``: the ``strata`` databases are empty
      directories (the tables stay where the tier job wrote them), which would otherwise
      land in the kernel's working directory;
    * 2 shuffle partitions, and Delta's log replay in 1 task instead of 50
      (``snapshotPartitions``): on a 2-core machine the first query of a small table
      otherwise spends most of its time scheduling empty tasks.
    """
    from strata_spark import spark_session

    conf = {"spark.sql.warehouse.dir": tempfile.mkdtemp(prefix="strata-notebook-"),
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "1"}
    if stack is not None:
        conf.update(stack.location.spark_conf())
    conf.update(extra_conf or {})
    return spark_session(app_name, conf)


# -- the tier job's log -------------------------------------------------------------------


def tier_passes(path: Path | str) -> list[dict[str, Any]]:
    """Every pass the tier job logged: the JSON objects with a ``topics`` list, in order.

    Lines that are not JSON objects (Spark and log4j output share the file) are skipped.
    """
    passes: list[dict[str, Any]] = []
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return passes
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("topics"), list):
            passes.append(obj)
    return passes


def tier_lag_rows(passes: Iterable[Mapping[str, Any]], topic: str | None = None
                  ) -> list[dict[str, Any]]:
    """One row per (pass, partition): ``started_ms`` (pass start, epoch ms; the pass's
    index when the job did not log it), ``topic``, ``partition``, ``lag_records``,
    ``lag_ms``, ``tiered_up_to``, ``records`` copied in that pass."""
    rows = []
    for index, one in enumerate(passes):
        started = int(one.get("started_ms") or index)
        for t in one.get("topics") or []:
            if topic is not None and t.get("topic") != topic:
                continue
            for p in t.get("partitions") or []:
                rows.append({"started_ms": started, "topic": p.get("topic", t.get("topic")),
                             "partition": int(p.get("partition", -1)),
                             "lag_records": int(p.get("lag_records", 0)),
                             "lag_ms": int(p.get("lag_ms", 0)),
                             "tiered_up_to": int(p.get("tiered_up_to", 0)),
                             "records": int(p.get("records", 0))})
    return rows


# -- Prometheus ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    source: str = ""


def scrape(url: str, timeout: float = 5.0) -> list[Sample]:
    """Every sample of one Prometheus text endpoint (no proxy: these are local ports)."""
    from prometheus_client.parser import text_string_to_metric_families

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        text = response.read().decode("utf-8", "replace")
    return [Sample(s.name, dict(s.labels), float(s.value), url)
            for family in text_string_to_metric_families(text) for s in family.samples]


def broker_samples(stack: Stack, names: Sequence[str] | None = None) -> list[Sample]:
    """Samples of every broker's endpoint, optionally only the metric ``names``.

    A broker whose endpoint does not answer is skipped (it may be restarting)."""
    out: list[Sample] = []
    for url in stack.broker_metrics:
        try:
            samples = scrape(url)
        except OSError:
            continue
        out.extend(s for s in samples if names is None or s.name in names)
    return out


# -- demo data -----------------------------------------------------------------------------

_ACTIONS = ("view", "view", "view", "click", "click", "cart", "buy")


def _records(count: int, hours: float, keys: int, now_ms: int, seed: int
             ) -> Iterator[tuple[str, bytes, int]]:
    """(key, JSON value, timestamp ms) over the ``hours`` before ``now_ms``, in time order,
    with a daily-ish bump so hourly counts are not flat."""
    rng = random.Random(seed)
    span = int(hours * 3_600_000)
    start = now_ms - span
    for i in range(count):
        # Denser towards the middle of the span: a bump, not uniform.
        frac = (i + rng.random()) / count
        frac = frac + 0.15 * (0.5 - frac) * (1 - abs(0.5 - frac) * 2)
        ts = start + int(frac * span)
        user = f"user-{rng.randrange(keys):03d}"
        action = rng.choice(_ACTIONS)
        value = {"user": user, "action": action, "seq": i,
                 "amount": round(rng.uniform(1, 200), 2) if action == "buy" else 0.0}
        yield user, json.dumps(value, separators=(",", ":")).encode(), min(ts, now_ms)


#: The value schema of a typed demo topic (``seed --typed``): the clicks' JSON fields,
#: typed (docs/typed-topics.md).
CLICK_SCHEMA: Final = json.dumps({
    "type": "record", "name": "Click", "fields": [
        {"name": "user", "type": "string"},
        {"name": "action", "type": {"type": "enum", "name": "Action",
                                    "symbols": ["view", "click", "cart", "buy"]}},
        {"name": "seq", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 10, "scale": 2}},
    ]})


def seed_topic(bootstrap: str, topic: str, *, records: int = 4000, partitions: int = 2,
               hours: float = 6.0, keys: int = 50, now_ms: int | None = None,
               segment_bytes: int = 65536, seed: int = 7, replication_factor: int = -1,
               security: ClientSecurity | None = None, typed: bool = False) -> int:
    """Create ``topic`` (if missing) with ``tier.enable=true``, ``tier.after.ms=0`` and
    small segments, then produce ``records`` keyed JSON records whose timestamps are
    spread over the last ``hours``. Returns the number of records acknowledged.

    ``replication_factor`` -1 is the cluster's ``default.replication.factor`` (what
    ``strata up`` sets for its size). The records are produced with acks=all, so a topic
    (new or existing) with fewer replicas than its ``min.insync.replicas`` is refused
    before anything is sent, with ``NotEnoughReplicasError`` saying what to do.

    Only closed segments are tiered, so the newest (active) segment stays out of Delta
    until it rolls: the table ends up with most, not all, of the records.

    ``typed``: a typed topic (docs/typed-topics.md) whose values follow ``CLICK_SCHEMA``,
    registered as ``<topic>-value``; the records are the same, as dicts.
    """
    import time

    from strata.client import (
        Admin,
        NewTopic,
        NotEnoughReplicasError,
        Producer,
        TopicAlreadyExistsError,
    )
    from strata_tools.commands.topic import acks_all_problem

    security = security or ClientSecurity()
    configs = {"tier.enable": "true", "tier.after.ms": "0", "segment.bytes": str(segment_bytes)}
    with Admin(bootstrap, security=security) as admin:
        if typed:
            admin.register_schema(f"{topic}-value", CLICK_SCHEMA)
            configs["value.schema.subject"] = f"{topic}-value"
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic, partitions, replication_factor, configs)])
        problem = acks_all_problem(admin, topic)
    if problem is not None:
        raise NotEnoughReplicasError(problem)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    with Producer(bootstrap, batch_size=16384, linger_ms=5, security=security) as producer:
        futures = [producer.send(topic, _typed(value) if typed else value, key=key,
                                 timestamp_ms=ts)
                   for key, value, ts in _records(records, hours, keys, now, seed)]
        producer.flush()
    return sum(1 for f in futures if f.result().offset >= 0)


def _typed(value: bytes) -> dict[str, Any]:
    """A click's JSON value as the typed topic's dict (``CLICK_SCHEMA``)."""
    from decimal import Decimal

    click = json.loads(value)
    return {**click, "amount": Decimal(str(click["amount"])).quantize(Decimal("0.01"))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_tools.notebook",
                                     description="notebook helpers for the local stack")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed", help="create a tier-enabled topic with generated records")
    seed.add_argument("--topic", default="clicks")
    seed.add_argument("--records", type=int, default=4000)
    seed.add_argument("--partitions", type=int, default=2)
    seed.add_argument("--hours", type=float, default=6.0)
    seed.add_argument("--replicas", type=int, default=-1,
                      help="replication factor of a new topic (default: the stack's "
                      "default.replication.factor)")
    seed.add_argument("--typed", action="store_true",
                      help="a typed topic: values follow a registered Avro schema "
                      "(docs/typed-topics.md)")
    seed.add_argument("--data-dir", default=None,
                      help=f"the stack's data dir (default ${DATA_DIR_ENV} or .strata)")
    args = parser.parse_args(argv)
    from strata.client import StrataError

    try:
        stack = find_stack(args.data_dir)
        sent = seed_topic(stack.bootstrap, args.topic, records=args.records,
                          partitions=args.partitions, hours=args.hours,
                          replication_factor=args.replicas, security=stack.client_security,
                          typed=args.typed)
    except (StackNotRunningError, StrataError) as exc:
        # Both say what to do; a traceback would only bury that.
        print(f"python -m strata_tools.notebook: error: {exc}", file=sys.stderr)
        return 1
    secured = f"--command-config {stack.security['client_config']} " if stack.security else ""
    print(f"produced {sent} records to {args.topic}; tier them now with: strata tier run "
          f"--once --bootstrap {stack.bootstrap} {secured}"
          f"--warehouse {stack.warehouse} --topic {args.topic}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
