"""The analysts' notebooks (notebooks/*.ipynb) run top to bottom against a real stack.

One stack per module, of the shape `make up` gives (`strata up` without `--brokers`:
ZooKeeper, 3 brokers with default replication factor 3 and min.insync.replicas 2, the
gateway and the tiering job; on free ports in a temp data dir, killed by PID at
teardown even when a test fails), secured (`--secure`: SASL_SSL only, ACLs, ZooKeeper
ACLs), which the notebooks must read unchanged: they find the stack's admin credentials
through `strata status` (``find_stack``). Its warehouse is a bucket of an S3 API server
on 127.0.0.1 (``strata up --warehouse s3://...`` with the AWS variables exported, issue
[3.5]): the tier job, the notebooks' Spark (S3A) and delta-rs all reach it from the
environment. A secured stack is the stricter case; the
plaintext one differs only in those options being empty (tests/test_cli_stack.py seeds
a plaintext stack the same way). The topic is seeded with the command
notebooks/README.md gives (`python -m strata_tools.notebook seed`, run in this process: the
stack's replication factor, acks=all), a few thousand keyed records whose timestamps
span several hours. Then one kernel (nbclient, kernel ``python3``) runs one pass of the
tiering job for the topic (``TIER_CELL``, what `strata tier run --once` does, in the
Spark the notebooks reuse) and the notebooks one after the other (``%reset -f`` before
each empties the namespace; the Spark JVM is reused) with ``STRATA_DATA_DIR`` /
``STRATA_TOPIC`` pointing at that stack. Each notebook ends with assertions, so an
empty or inconsistent result fails the test.

The kernel runs without ``PYTEST_CURRENT_TEST`` in its environment: with it, ipykernel
stops forwarding what is written to file descriptors 1 and 2 (the Spark JVM's output)
into the cells, and the test would not see what an analyst sees. The cells' stream
outputs must hold no Ivy resolution or WARN lines.

The committed notebooks carry no outputs (cheap check, no kernel): results belong to
whoever runs them, not to git.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from strata.client import Admin
from strata_tools.notebook import find_stack
from strata_tools.notebook import main as notebook_main
from tests.conftest import ProcessReaper
from tests.support.s3_server import SECRET_KEY, S3Server
from tests.test_cli_stack import ok, strata, up_on_free_ports

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
#: A name with a dot and a dash: the notebooks must quote it in SQL.
TOPIC = "web.clicks-v1"
#: The typed topic of notebooks/typed_topic.ipynb (seeded with ``seed --typed``).
TYPED_TOPIC = "clicks-typed"
#: The stack's warehouse: a bucket of the suite's S3 API server (issue [3.5]); the
#: notebooks reach it through what `strata status` says and the kernel's AWS environment.
BUCKET = "strata-notebooks"
WAREHOUSE = f"s3://{BUCKET}/lake"
RECORDS = 3000
HOURS = 6.0
CELL_TIMEOUT_S = 120
#: What an analyst should never see under a cell: Ivy resolving the Delta package, the
#: JDK's incubator notice, Spark's log lines at WARN or above.
NOISE = re.compile(r":: (?:loading settings|resolving dependencies|resolution report|retrieving)"
                   r" ::|Ivy Default Cache|artifacts copied|^\s*found \S+#|\bWARN(?:ING)?\b|"
                   r"\bERROR\b|resolves to a loopback address", re.MULTILINE)


@dataclass(frozen=True)
class SeededStack:
    data_dir: Path
    info: dict[str, Any]


def test_there_are_notebooks() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"explore_history.ipynb", "throughput_and_lag.ipynb",
                                           "typed_topic.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebooks_have_no_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    assert book.metadata.get("kernelspec", {}).get("name") == "python3"
    dirty = [i for i, cell in enumerate(book.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None
                  or "execution" in cell.get("metadata", {}))]
    assert not dirty, (f"{path.name}: cells {dirty} have outputs or execution counts; clear "
                       f"them before committing (notebooks/README.md says how)")
    assert book.cells[-1].cell_type == "code" and "assert" in book.cells[-1].source, \
        f"{path.name} must end with a cell of assertions"


#: Test set-up run in the notebooks' kernel before them (not part of any notebook): one
#: pass of the tiering job for $STRATA_TOPIC, what `strata tier run --once --topic T`
#: does, on the JVM the notebooks then reuse (one JVM start instead of two); its session
#: is stopped after the pass, so the notebooks start from a fresh SparkContext. It starts
#: Spark exactly as the notebooks do (`notebook_spark`), so its output is checked too.
#: The stack's own job also passes every 60 s; if it holds the topic's lease, this pass
#: waits for it (and may then find nothing left to copy).
TIER_CELL = """\
import os as _os
from spark_jobs import TierJob as _TierJob, TierSettings as _TierSettings
from strata_tools.notebook import find_stack as _find_stack, notebook_spark as _notebook_spark

_stack = _find_stack()
with _TierJob(_notebook_spark("test-notebooks-tier", stack=_stack),
              _TierSettings(_stack.bootstrap, _stack.warehouse, lease_wait_s=240,
                            security=_stack.client_security)) as _job:
    _report = _job.run_once([_os.environ["STRATA_TOPIC"], _os.environ["STRATA_TYPED_TOPIC"]])
_job.spark.stop()  # the notebooks start their own SparkContext (on this JVM)
assert not any(t.error for t in _report.topics), _report.to_json()
"""
TIER_CELL_TIMEOUT_S = 420


def _seed(argv: list[str]) -> tuple[int, str, str]:
    """`python -m strata_tools.notebook ARGV` (notebooks/README.md), in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = notebook_main(argv)
    return code, out.getvalue(), err.getvalue()


def _seed_refuses_one_replica(data_dir: Path, bootstrap: str) -> None:
    """A topic with fewer replicas than the stack's min.insync.replicas takes no acks=all
    write: `seed` says so at once (no traceback, no two-minute delivery timeout)."""
    began = time.monotonic()
    code, _, err = _seed(["seed", "--data-dir", str(data_dir), "--topic", "one-replica",
                          "--replicas", "1", "--records", "10"])
    assert code == 1 and time.monotonic() - began < 30, (code, err)
    assert err.startswith(
        "python -m strata_tools.notebook: error: [NOT_ENOUGH_REPLICAS] topic 'one-replica' has "
        "replication factor 1 but min.insync.replicas 2 (the brokers' "
        "log.min.insync.replicas)"), err
    assert "strata topic delete one-replica" in err, err
    with Admin(bootstrap, security=find_stack(data_dir).client_security) as admin:
        admin.delete_topics(["one-replica"])  # it is tier-enabled: keep it from the tier job


def _kafka_client_reads(kafka: str, security: Any) -> None:
    """`strata up --secure`'s Kafka listeners (KAFKA_SASL_SSL): librdkafka logs in with the
    stack's SCRAM user over TLS, checking the stack's CA, and reads the seeded records."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition as KafkaPartition

    consumer = KafkaConsumer({
        "bootstrap.servers": kafka, "security.protocol": "SASL_SSL",
        "sasl.mechanisms": security.sasl_mechanism, "sasl.username": security.username,
        "sasl.password": security.password, "ssl.ca.location": security.ssl_cafile,
        "group.id": "secure-stack-kafka-check", "enable.auto.commit": False})
    try:
        consumer.assign([KafkaPartition(TOPIC, 0, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            got += [m for m in consumer.consume(10, 1.0) if m.error() is None]
    finally:
        consumer.close()
    assert [m.offset() for m in got[:10]] == list(range(10))


@pytest.fixture(scope="module")
def seeded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededStack]:
    tmp = tmp_path_factory.mktemp("notebooks")
    data_dir = tmp / "stack"
    reaper = ProcessReaper()
    # The store outlives the stack: `strata down` is done inside, then the store stops.
    with S3Server.serving(tmp, BUCKET) as store, pytest.MonkeyPatch.context() as environment:
        try:
            # The AWS variables of `strata up` (its tier job inherits them), the seeding and
            # the kernel, as a user exports them in a shell.
            for key, value in store.environment().items():
                environment.setenv(key, value)
            # No --brokers: the CLI's default, as `make up` runs it (3 brokers, RF 3, min ISR 2).
            _, info = up_on_free_ports(data_dir, tmp, reaper, "--secure", "--warehouse",
                                       WAREHOUSE, brokers=3, size_flag=False)
            assert info["warehouse"] == WAREHOUSE and SECRET_KEY not in str(info)
            assert info["security"]["security_protocol"] == "SASL_SSL"
            assert [p["name"] for p in info["processes"] if p["name"].startswith("broker-")] \
                == ["broker-0", "broker-1", "broker-2"]
            # Seeded as notebooks/README.md says, with the stack's replication factor (its
            # acks=all writes need 2 of the 3 replicas in sync).
            code, out, err = _seed(["seed", "--data-dir", str(data_dir), "--topic", TOPIC,
                                    "--records", str(RECORDS), "--partitions", "2",
                                    "--hours", str(HOURS)])
            assert code == 0 and out.startswith(f"produced {RECORDS} records to {TOPIC};") \
                and "--command-config" in out, \
                (code, out, err)
            security = find_stack(data_dir).client_security
            with Admin(info["bootstrap"], security=security) as admin:
                described = admin.describe_topics([TOPIC])[TOPIC]
                replicas = {len(p.replicas) for p in described.partitions}
                min_isr = admin.describe_configs([TOPIC])[TOPIC]["min.insync.replicas"]
            assert (replicas, min_isr.value, min_isr.is_default) == ({3}, "2", True)
            _kafka_client_reads(info["kafka_bootstrap"], security)
            _seed_refuses_one_replica(data_dir, info["bootstrap"])
            code, out, err = _seed(["seed", "--data-dir", str(data_dir), "--topic", TYPED_TOPIC,
                                    "--typed", "--records", str(RECORDS), "--partitions", "2",
                                    "--hours", str(HOURS)])
            assert code == 0 and out.startswith(f"produced {RECORDS} records to {TYPED_TOPIC};"), \
                (code, out, err)
            yield SeededStack(data_dir, info)
        finally:
            try:
                if (data_dir / "stack.json").exists():
                    ok(strata("down", "--data-dir", str(data_dir), cwd=tmp))
            finally:
                reaper.reap()


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_notebooks_run_top_to_bottom(seeded_stack: SeededStack, tmp_path: Path) -> None:
    """The tier pass (``TIER_CELL``), then every notebook, one after the other in one
    kernel, with ``%reset -f`` before each: each starts from an empty namespace (a name
    only another notebook defines fails it), while the Spark JVM is reused, which saves a
    JVM start (~10-20 s on this machine) per notebook."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    books = [nbformat.read(path, as_version=4) for path in NOTEBOOKS]
    tier_cell = nbformat.v4.new_code_cell(TIER_CELL)
    combined = nbformat.v4.new_notebook(metadata=books[0].metadata, cells=[tier_cell])
    spans: list[tuple[Path, int, int]] = []
    for path, book in zip(NOTEBOOKS, books, strict=True):
        combined.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        first = len(combined.cells)
        combined.cells.extend(book.cells)
        spans.append((path, first, len(combined.cells)))
    env = dict(os.environ)
    env.update({"STRATA_DATA_DIR": str(seeded_stack.data_dir), "STRATA_TOPIC": TOPIC,
                "STRATA_TYPED_TOPIC": TYPED_TOPIC})
    env.pop("STRATA_KEY", None)
    env.pop("PYTEST_CURRENT_TEST", None)  # else ipykernel drops the JVM's output
    client = NotebookClient(
        combined, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        timeout_func=lambda cell: TIER_CELL_TIMEOUT_S if cell.source == TIER_CELL
        else CELL_TIMEOUT_S)
    began = time.monotonic()
    try:
        client.execute(env=env)
    except CellExecutionError as err:
        failed = next((p.name for p, a, b in spans
                       if any(o.get("output_type") == "error" for c in combined.cells[a:b]
                              for o in c.get("outputs", []))), "the tier pass")
        pytest.fail(f"{failed} failed (executed copies in {tmp_path}):\n{err}", pytrace=False)
    finally:
        for path, first, last in spans:  # the executed copies, for a post-mortem
            copy = nbformat.v4.new_notebook(metadata=combined.metadata,
                                            cells=combined.cells[first:last])
            nbformat.write(copy, tmp_path / path.name)
    seconds = time.monotonic() - began
    from deltalake import DeltaTable

    # Only the active segment of each partition stays out of Delta.
    table = DeltaTable(f"{WAREHOUSE}/topics/{TOPIC}", storage_options={"AWS_ALLOW_HTTP": "true"})
    assert 0 < table.to_pyarrow_dataset().count_rows() <= RECORDS
    for path, first, last in [(Path("tier pass"), 0, 1), *spans]:
        cells = combined.cells[first:last]
        errors = [o for cell in cells if cell.cell_type == "code"
                  for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, (path.name, errors)
        # What the analyst would see under a cell: the JVM starts in the first one.
        noisy = [(index, o.get("name"), o.get("text", ""))
                 for index, cell in enumerate(cells) if cell.cell_type == "code"
                 for o in cell.get("outputs", [])
                 if o.get("output_type") == "stream" and NOISE.search(o.get("text", ""))]
        assert not noisy, (f"{path.name}: cells print start-up or log noise (executed copy "
                           f"in {tmp_path}): {noisy}")
        if path.suffix == ".ipynb":
            images = [o for cell in cells for o in cell.get("outputs", [])
                      if "image/png" in o.get("data", {})]
            assert images, f"{path.name} drew no plot"
    # A budget, not a property of the notebooks (about 50 s on a quiet 2-core machine):
    # going over it warns, with the slow cells, instead of failing a busy machine's run.
    if seconds > 400:
        warnings.warn(f"the notebooks took {seconds:.0f} s (budget 400 s):\n"
                      f"{_cell_seconds(combined)}", stacklevel=1)


def _cell_seconds(book: Any) -> str:
    """Seconds per code cell, from the timings nbclient records in the cell metadata."""
    from datetime import datetime

    lines = []
    for cell in book.cells:
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing and "shell.execute_reply" in timing:
            start, end = (datetime.fromisoformat(timing[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            first = cell.source.splitlines()[0] if cell.source else ""
            lines.append(f"{(end - start).total_seconds():7.1f} s  {first[:70]}")
    return "\n".join(lines)
