"""The import contracts in pyproject.toml (``[tool.importlinter]``, run by ``make lint``)
hold on the tree, and they catch a deliberate violation (between the top-level packages,
between the client's own layers and between the brokers' modules, whose README drawing
must match the contract); every test module declares one tier, and one that
does not fails collection.

The violation is made in a copy: the packages' Python files, pyproject.toml and our own
contract types (import_contracts.py) are copied to a temp dir, one forbidden import is
added there, and ``lint-imports`` runs on the copy (``PYTHONPATH`` puts the copy first,
ahead of the editable install).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

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
    # Inside brokers/: the connections' security sits below the handlers that use it,
    # a partition below the replica manager, and siblings stay apart.
    ("brokers/security.py", "import brokers.handlers", "brokers modules import downward only"),
    ("brokers/partition.py", "import brokers.replica_manager",
     "brokers modules import downward only"),
    ("brokers/network.py", "import brokers.handlers.dispatch",
     "brokers modules import downward only"),
    ("brokers/log/segment.py", "import brokers.metrics", "brokers modules import downward only"),
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


def test_a_brokers_module_outside_every_layer_breaks_the_layers(tmp_path: Path) -> None:
    """The brokers layers are exhaustive: a new module must be placed in one."""
    root = _copy_tree(tmp_path)
    (root / "brokers" / "newcomer.py").write_text('"""A module no layer names."""\n')
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    assert "newcomer" in result.stdout, result.stdout


def _brokers_layers_contract() -> list[set[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"]
                   if c["id"] == "brokers-layers"]
    assert contract["containers"] == ["brokers"] and contract["exhaustive"]
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def _brokers_readme_layers() -> list[list[str]]:
    """The modules brokers/README.md draws inside brokers/, layer by layer (top first):
    a module line starts with ``name.py`` or ``name/``; a line of ``▼`` ends a layer."""
    text = (REPO / "brokers" / "README.md").read_text()
    start = text.index("Inside `brokers/`")
    block = text[text.index("```\n", start) + 4:]
    block = block[:block.index("```")]
    layers: list[list[str]] = [[]]
    for line in block.splitlines():
        if line.strip() == "▼":
            layers.append([])
        elif (found := re.match(r"([A-Za-z_]+)(?:\.py|/)\s", line)) is not None:
            layers[-1].append(found.group(1))
    return layers


def test_the_brokers_readme_draws_the_layers_contract() -> None:
    drawn = _brokers_readme_layers()
    listed = [name for layer in drawn for name in layer]
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(listed)}"
    modules = {path.stem for path in (REPO / "brokers").glob("*.py")} - {"__init__"}
    modules |= {path.parent.name for path in (REPO / "brokers").glob("*/__init__.py")}
    assert set(listed) - modules == set(), "the README lists modules that do not exist"
    assert modules - set(listed) == set(), "brokers modules missing from the README"
    assert [set(layer) for layer in drawn] == _brokers_layers_contract(), \
        "brokers/README.md and the brokers-layers contract in pyproject.toml disagree"


def test_private_means_a_leading_underscore_below_the_top_level() -> None:
    from import_contracts import is_private

    assert is_private("strata.client._accumulator") and is_private("wire.schema._convert")
    assert is_private("spark_source._reader") and is_private("brokers.log._x.y")
    assert not is_private("strata.client.producer") and not is_private("brokers.__main__")
    assert not is_private("_top_level_module") and not is_private("spark_jobs.metrics")


def _declared_tiers(path: Path) -> list[str]:
    """The tier markers a test module's ``pytestmark`` names, read from its source."""
    from tests.conftest import TIERS

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return [n.attr for n in ast.walk(node.value)
                    if isinstance(n, ast.Attribute) and n.attr in TIERS
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"]
    return []


def test_every_test_module_declares_one_tier_and_the_schedule_names_real_modules() -> None:
    from tests.conftest import LONGEST_MODULES_FIRST

    paths = {path.stem: path for path in (REPO / "tests").glob("test_*.py")}
    tiers = {stem: _declared_tiers(path) for stem, path in paths.items()}
    assert {stem: t for stem, t in tiers.items() if len(t) != 1} == {}
    assert set(LONGEST_MODULES_FIRST) <= set(paths), sorted(set(LONGEST_MODULES_FIRST) - set(paths))
    assert tiers["test_layers"] == ["unit"] and tiers["test_faults"] == ["system"]
    assert tiers["test_replication"] == ["integration"]
    # The long modules scheduled first are never unit tests.
    assert not [m for m in LONGEST_MODULES_FIRST if tiers[m] == ["unit"]]


TIERED = {
    "test_marked.py": "pytestmark = pytest.mark.unit\n",
    "test_listed.py": "pytestmark = [pytest.mark.timeout(5), pytest.mark.system]\n",
    "test_unmarked.py": "",
    "test_twice.py": "pytestmark = [pytest.mark.unit, pytest.mark.integration]\n",
}


def test_a_test_module_without_exactly_one_tier_fails_collection(tmp_path: Path) -> None:
    """tests/conftest.py's collection hook, run by a pytest of its own on modules in a
    temp dir: the marked ones are collected, the others are collection errors."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_pycollect_makemodule  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    unit\n    integration\n"
        "    system\n")
    for name, mark in TIERED.items():
        (tmp_path / name).write_text(f"import pytest\n\n{mark}\n\ndef test_it():\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "test_marked.py::test_it" in out and "test_listed.py::test_it" in out, out
    assert "ERROR collecting test_unmarked.py" in out and "declares none" in out, out
    assert "ERROR collecting test_twice.py" in out and "declares unit and integration" in out
