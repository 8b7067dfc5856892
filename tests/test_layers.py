"""The import contracts in pyproject.toml (``[tool.importlinter]``, run by ``make lint``)
hold on the tree, and they catch a deliberate violation (between the top-level packages,
and between the client's own layers); the test tiers name real modules.

The violation is made in a copy: the packages' Python files, pyproject.toml and our own
contract types (import_contracts.py) are copied to a temp dir, one forbidden import is
added there, and ``lint-imports`` runs on the copy (``PYTHONPATH`` puts the copy first,
ahead of the editable install).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("wire", "procs", "brokers", "strata", "strata_tools", "zookeeper", "spark_source",
            "spark_jobs", "ingest_gateway", "strata_spark")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CLIENT_LAYERS = "the client's faces sit on its engines"


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "import_contracts.py"):
        shutil.copy(REPO / name, root / name)
    return root


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, capture_output=True,
        text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(root)))


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("wire/errors.py", "import brokers.broker", "wire imports no other Strata package"),
    ("strata/client/consumer.py", "import brokers.partition",
     "the client never imports a broker module"),
    ("brokers/log/segment.py", "import socket", "storage (the log and the batch codec)"),
    ("brokers/replication.py", "import kazoo.client", "only brokers.coordination imports kazoo"),
    ("brokers/heap.py", "import kazoo", "only brokers.coordination imports kazoo"),
    ("ingest_gateway/_app.py", "import brokers.handlers",
     "Spark code and the gateway reach the brokers only through the client"),
    # A cycle: the broker would import a package that sits above it.
    ("brokers/metrics.py", "import spark_source", "top-level packages import downward only"),
    ("spark_jobs/_job.py", "import ingest_gateway", "top-level packages import downward only"),
    # The Spark layer sits under the edges and imports none of them (nor the client).
    ("strata_spark/_types.py", "import spark_source", "top-level packages import downward only"),
    ("strata_spark/_session.py", "import strata.client",
     "top-level packages import downward only"),
    ("wire/schema/_avro.py", "import strata_spark", "wire imports no other Strata package"),
    # Inside spark_source and ingest_gateway: the circles that were, and a module left out.
    ("spark_source/_tier.py", "from spark_source._reader import StrataBatchReader",
     "spark_source's modules import downward only"),
    ("spark_source/_schema.py", "import spark_source._datasource",
     "spark_source's modules import downward only"),
    ("spark_source/_stray.py", "import spark_source._errors",
     "spark_source's modules import downward only"),
    ("ingest_gateway/_coalescer.py", "from ingest_gateway._state import GatewayState",
     "ingest_gateway's modules import downward only"),
    ("ingest_gateway/_route.py", "from ingest_gateway._app import create_app",
     "ingest_gateway's modules import downward only"),
    ("ingest_gateway/_stray.py", "import ingest_gateway._errors",
     "ingest_gateway's modules import downward only"),
    # Another package's private modules: through its exports only, wherever they are.
    ("spark_jobs/_job.py", "from wire.schema._model import identity",
     "private (_name) modules are imported only inside"),
    ("strata_tools/cli.py", "import wire.schema._convert",
     "private (_name) modules are imported only inside"),
    ("ingest_gateway/_plan.py", "from spark_source import _options",
     "private (_name) modules are imported only inside"),
    # Inside the client: faces over engines over the connection and the shared modules.
    ("strata/client/_common.py", "import strata.client._admin_topics", CLIENT_LAYERS),
    ("strata/client/_config.py", "import strata.client._group", CLIENT_LAYERS),
    ("strata/client/_cluster.py", "import strata.client._schemas", CLIENT_LAYERS),
    ("strata/client/admin.py", "import strata.client.consumer", CLIENT_LAYERS),
    ("strata/client/_stray.py", "import strata.client._common", CLIENT_LAYERS),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                 contract: str) -> None:
    root = _copy_tree(tmp_path)
    with (root / module).open("a") as source:
        source.write(f"\n{line}  # a deliberate violation\n")
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout


def test_private_means_a_leading_underscore_below_the_top_level() -> None:
    from import_contracts import is_private

    assert is_private("strata.client._accumulator") and is_private("wire.schema._convert")
    assert is_private("spark_source._reader") and is_private("brokers.log._x.y")
    assert not is_private("strata.client.producer") and not is_private("brokers.__main__")
    assert not is_private("_top_level_module") and not is_private("spark_jobs.metrics")


def test_the_tiers_and_the_schedule_name_real_test_modules() -> None:
    from tests.conftest import LONGEST_MODULES_FIRST, SYSTEM_MODULES, UNIT_MODULES, tier_of

    modules = {path.stem for path in (REPO / "tests").glob("test_*.py")}
    named = UNIT_MODULES | SYSTEM_MODULES | set(LONGEST_MODULES_FIRST)
    assert named <= modules, sorted(named - modules)
    assert not UNIT_MODULES & SYSTEM_MODULES
    assert tier_of("test_layers") == "unit" and tier_of("test_faults") == "system"
    assert tier_of("test_replication") == "integration"
    # The long modules scheduled first are never unit tests.
    assert not UNIT_MODULES & set(LONGEST_MODULES_FIRST)
