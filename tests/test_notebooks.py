"""The analysts' notebooks (notebooks/*.ipynb) run top to bottom against a real stack.

One stack per module (`strata up` on free ports in a temp data dir, killed by PID at
teardown even when a test fails): a tier-enabled topic gets a few thousand keyed records
whose timestamps span several hours, one `strata tier run --once` copies the closed
segments into Delta, then the notebooks run one after the other in one kernel
(nbclient, kernel ``python3``; ``%reset -f`` between them empties the namespace, the
Spark JVM is reused) with ``STRATA_DATA_DIR`` / ``STRATA_TOPIC`` pointing at that stack.
Each notebook ends with assertions, so an empty or inconsistent result fails the test.

The committed notebooks carry no outputs (cheap check, no kernel): results belong to
whoever runs them, not to git.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from strata.notebook import seed_topic
from tests.conftest import ProcessReaper
from tests.test_cli_stack import ok, strata, up_on_free_ports

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
#: A name with a dot and a dash: the notebooks must quote it in SQL.
TOPIC = "web.clicks-v1"
RECORDS = 3000
HOURS = 6.0
CELL_TIMEOUT_S = 120


@dataclass(frozen=True)
class SeededStack:
    data_dir: Path
    info: dict[str, Any]
    tiered: int


def test_there_are_notebooks() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"explore_history.ipynb", "throughput_and_lag.ipynb"}


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


def _tier_once(info: dict[str, Any]) -> Any:
    """One pass of the tiering job for TOPIC, in this process.

    The stack's own job also passes every 60 s; if it holds the topic's lease, this pass
    waits for it (and may then find nothing left to copy). The session is stopped after
    the pass so the notebooks' own JVMs have the machine to themselves."""
    from spark_jobs import TierJob, TierSettings
    from strata.spark import spark_session

    spark = spark_session("test-notebooks-tier",
                          {"spark.databricks.delta.snapshotPartitions": "1"})
    try:
        settings = TierSettings(info["bootstrap"], info["zookeeper"], Path(info["warehouse"]),
                                lease_wait_s=240)
        with TierJob(spark, settings) as job:
            return job.run_once([TOPIC])
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def seeded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededStack]:
    tmp = tmp_path_factory.mktemp("notebooks")
    data_dir = tmp / "stack"
    reaper = ProcessReaper()
    try:
        _, info = up_on_free_ports(data_dir, tmp, reaper)
        sent = seed_topic(info["bootstrap"], TOPIC, records=RECORDS, partitions=2,
                          hours=HOURS, keys=40)
        assert sent == RECORDS
        report = _tier_once(info)
        table = Path(info["warehouse"]) / "topics" / TOPIC
        assert (table / "_delta_log").is_dir(), report
        from deltalake import DeltaTable

        tiered = DeltaTable(str(table)).to_pyarrow_dataset().count_rows()
        # Only the active segment of each partition stays out of Delta.
        assert 0 < tiered <= RECORDS, (tiered, report)
        yield SeededStack(data_dir, info, tiered)
    finally:
        try:
            if (data_dir / "stack.json").exists():
                ok(strata("down", "--data-dir", str(data_dir), cwd=tmp))
        finally:
            reaper.reap()


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_notebooks_run_top_to_bottom(seeded_stack: SeededStack, tmp_path: Path) -> None:
    """Every notebook, one after the other in one kernel, with ``%reset -f`` between them:
    each starts from an empty namespace (a name only another notebook defines fails it),
    while the Spark JVM the first one started is reused, which saves a JVM start (~20 s
    on this machine) per notebook."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    books = [nbformat.read(path, as_version=4) for path in NOTEBOOKS]
    combined = nbformat.v4.new_notebook(metadata=books[0].metadata)
    spans: list[tuple[Path, int, int]] = []
    for path, book in zip(NOTEBOOKS, books, strict=True):
        combined.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        first = len(combined.cells)
        combined.cells.extend(book.cells)
        spans.append((path, first, len(combined.cells)))
    env = dict(os.environ)
    env.update({"STRATA_DATA_DIR": str(seeded_stack.data_dir), "STRATA_TOPIC": TOPIC})
    env.pop("STRATA_KEY", None)
    client = NotebookClient(combined, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    began = time.monotonic()
    try:
        client.execute(env=env)
    except CellExecutionError as err:
        failed = next((p.name for p, a, b in spans
                       if any(o.get("output_type") == "error" for c in combined.cells[a:b]
                              for o in c.get("outputs", []))), "a notebook")
        pytest.fail(f"{failed} failed (executed copies in {tmp_path}):\n{err}", pytrace=False)
    finally:
        for path, first, last in spans:  # the executed copies, for a post-mortem
            copy = nbformat.v4.new_notebook(metadata=combined.metadata,
                                            cells=combined.cells[first:last])
            nbformat.write(copy, tmp_path / path.name)
    seconds = time.monotonic() - began
    for path, first, last in spans:
        cells = combined.cells[first:last]
        errors = [o for cell in cells if cell.cell_type == "code"
                  for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, (path.name, errors)
        images = [o for cell in cells for o in cell.get("outputs", [])
                  if "image/png" in o.get("data", {})]
        assert images, f"{path.name} drew no plot"
    assert seconds < 400, f"the notebooks took {seconds:.0f} s:\n{_cell_seconds(combined)}"


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
