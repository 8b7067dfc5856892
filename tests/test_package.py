"""The installable package (issue [2.5] section 1): `python -m build` makes a wheel and an
sdist, and the wheel installed into a new virtual environment outside the checkout runs
a broker, a produce/consume round trip and a Spark batch read. The build runs on a copy
of the checkout in a temp dir, so its ``build/`` and ``*.egg-info`` never land in the
checkout.

The new environment gets the wheel with ``pip install --no-deps --no-index`` and sees the
third-party packages through a ``.pth`` line naming this environment's site-packages:
nothing is downloaded at test time (pyspark alone is 400 MB), and that directory holds no
Strata module (the development install is a path entry to the checkout, in a ``.pth``
file a path line does not process). Every process runs with the checkout neither on
``PYTHONPATH`` nor as its working directory, and the test checks that each Strata module
is imported from the new environment. The wheel's own requirements are checked against
what the environment provides.

A broker host installs only the core: the broker, the CLI's client commands and the
client run with the extras' modules made unimportable (a ``sitecustomize`` that refuses
them), and the commands that need an extra say which one to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from procs import free_port
from strata_tools.extras import EXTRA_MODULES
from tests.support.broker_process import REPO, BrokerProcess
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

CORE = {"pyarrow", "kazoo", "crc32c", "prometheus-client", "cryptography", "fastavro",
        "kafka-python"}
#: What a broker host must not need (each extra's heavy packages).
NOT_IN_CORE = {"pyspark", "delta-spark", "deltalake", "fastapi", "uvicorn", "matplotlib",
               "ipykernel", "pandas"}
STRATA_MODULES = ("wire", "procs", "brokers", "strata", "strata_tools", "zookeeper",
                  "spark_source", "spark_jobs", "ingest_gateway", "strata_spark", "strata.spark",
                  "pyspark_strata")

#: Makes every extra's modules unimportable, as on a host with only the core installed.
BLOCKER = """\
import importlib.abc
import sys

BLOCKED = {blocked!r}


class _OnlyTheCore(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _OnlyTheCore())
"""


def run(args: list[str | Path], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL)


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    sdist: Path
    home: Path  # a working directory outside the checkout

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def strata(self) -> Path:
        return self.venv / "bin" / "strata"

    def env(self, core_only: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_CONF_DIR", "PYSPARK_PYTHON",
                            "STRATA_BOOTSTRAP", "STRATA_COMMAND_CONFIG")}
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}"
        if core_only:
            env["PYTHONPATH"] = str(self.home / "core-only")
        return env


#: What the build's copy of the checkout leaves out: hidden entries (version control,
#: the virtual environment, caches, the local stack's data) and earlier build output.
NOT_SOURCES = shutil.ignore_patterns(".*", "__pycache__", "*.pyc", "*.so", "*.egg-info", "build",
                                     "dist", "spark-warehouse", "metastore_db", "derby.log")


def source_copy(into: Path) -> Path:
    """The checkout's sources, copied to ``into``. setuptools writes ``build/`` and
    ``strata.egg-info`` beside the sources it builds (``--outdir`` moves only the
    archives), so the build runs on this copy and writes nothing into the checkout."""
    shutil.copytree(REPO, into, symlinks=True, ignore=NOT_SOURCES)
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    out = tmp_path_factory.mktemp("dist")
    source = source_copy(tmp_path_factory.mktemp("source") / "strata")
    built = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source],
                cwd=source)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("strata-*.whl")
    (sdist,) = out.glob("strata-*.tar.gz")
    home = tmp_path_factory.mktemp("elsewhere")
    venv = home / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    site = Path(run([venv / "bin" / "python", "-c",
                     "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                    ).stdout.strip())
    (site / "zz_third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install",
               "--no-deps", "--no-index", "--quiet", wheel])
    assert pip.returncode == 0, pip.stderr
    blocker = home / "core-only"
    blocker.mkdir()
    blocked = sorted({m for modules in EXTRA_MODULES.values() for m in modules})
    (blocker / "sitecustomize.py").write_text(BLOCKER.format(blocked=blocked))
    yield Installed(venv, wheel, sdist, home)


def _metadata(wheel: Path) -> tuple[dict[str, str], list[Requirement], set[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(meta_name).decode())
    fields = {k: str(v) for k, v in message.items()}
    return fields, [Requirement(r) for r in message.get_all("Requires-Dist") or []], names


def test_the_wheel_ships_what_runs_and_splits_its_dependencies(installed: Installed) -> None:
    fields, requirements, names = _metadata(installed.wheel)
    assert fields["Requires-Python"] == ">=3.11"
    core = {r.name for r in requirements if r.marker is None}
    assert core == CORE, core
    extras = {}
    for requirement in requirements:
        if requirement.marker is not None:
            for extra in ("spark", "gateway", "notebooks", "all", "dev"):
                if requirement.marker.evaluate({"extra": extra}):
                    extras.setdefault(extra, set()).add(requirement.name)
    assert {"pyspark", "delta-spark", "deltalake"} <= extras["spark"]
    assert not extras["spark"] & {"fastapi", "uvicorn", "matplotlib", "ipykernel"}
    assert {"fastapi", "uvicorn", "msgspec"} <= extras["gateway"]
    assert {"matplotlib", "ipykernel", "strata"} <= extras["notebooks"]
    assert not core & NOT_IN_CORE
    # What the code reads at run time ships inside the package; the tests do not.
    for needed in ("strata_spark/conf/spark-defaults.conf", "strata_spark/conf/ivysettings.xml",
                   "strata_spark/conf/log4j2.properties", "zookeeper/zoo.cfg.template",
                   "pyspark_strata.py", "strata_tools/cli.py", "brokers/__main__.py"):
        assert needed in names, needed
    # The C extensions (pyproject's ext-modules), compiled into the wheel: the Kafka
    # listener's record codec and the blocking producer's fast path (with its types).
    for extension in ("brokers/kafka/_v2codec", "strata/client/_fastproduce"):
        assert [n for n in names if n.startswith(extension) and n.endswith(".so")], extension
    assert "strata/client/_fastproduce.pyi" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert "import_contracts.py" not in names  # make lint's contract types, not the package's
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(installed.wheel) as archive:
        assert "strata = strata_tools.cli:main" in archive.read(entry_points).decode()


def test_the_environment_provides_what_the_wheel_requires(installed: Installed) -> None:
    check = run([installed.python, "-c", """
import importlib.metadata as md, json
from packaging.requirements import Requirement
missing = []
for text in md.requires("strata"):
    req = Requirement(text)
    if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in ("spark", "gateway", "notebooks")):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        missing.append(text)
        continue
    if not req.specifier.contains(version, prereleases=True):
        missing.append(f"{text} (found {version})")
print(json.dumps(missing))
"""], env=installed.env(), cwd=installed.home)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout) == []


def test_strata_modules_come_from_the_new_environment(installed: Installed) -> None:
    probe = run([installed.python, "-c", f"""
import importlib, json
from strata_spark import REPO_CONF_DIR
print(json.dumps({{"modules": {{m: importlib.import_module(m).__file__
                               for m in {STRATA_MODULES!r}}},
                  "conf": str(REPO_CONF_DIR)}}))
"""], env=installed.env(), cwd=installed.home)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    outside = {m: f for m, f in found["modules"].items()
               if not f.startswith(str(installed.venv))}
    assert not outside, f"imported from outside the new environment: {outside}"
    assert Path(found["conf"], "spark-defaults.conf").is_file()
    assert Path(found["conf"]).is_relative_to(installed.venv)


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path / "zookeeper", free_port(), start_timeout=60)
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=5.0)


@contextlib.contextmanager
def installed_broker(installed: Installed, zookeeper: ZooKeeperServer, data_dir: Path,
                     env: dict[str, str], topic: str) -> Iterator[BrokerProcess]:
    """A broker run by the installed package, with ``topic`` made by its `strata`
    command; ``env`` gets ``STRATA_BOOTSTRAP``. Killed by PID at the end."""
    broker = BrokerProcess(zookeeper.connect_string, data_dir,
                           python=str(installed.python), environment=env)
    try:
        broker.start()
        env["STRATA_BOOTSTRAP"] = broker.bootstrap
        made = run([installed.strata, "topic", "create", topic, "-p", "2", "-r", "1"],
                   env=env, cwd=installed.home)
        assert made.returncode == 0, made.stderr
        yield broker
    finally:
        broker.kill()


def test_a_broker_host_runs_on_the_core_alone(installed: Installed,
                                              zookeeper: ZooKeeperServer,
                                              tmp_path: Path) -> None:
    env = installed.env(core_only=True)
    refused = run([installed.python, "-c", "import pyspark"], env=env, cwd=installed.home)
    assert refused.returncode == 1 and "No module named 'pyspark'" in refused.stderr
    with installed_broker(installed, zookeeper, tmp_path / "broker", env, "installed"):
        lines = [f"k{i}:value-{i}" for i in range(100)]
        produced = subprocess.run(
            [str(installed.strata), "produce", "installed", "--key-separator", ":",
             "--acks", "all"], input="\n".join(lines) + "\n", capture_output=True,
            text=True, timeout=120, env=env, cwd=installed.home, check=False)
        assert produced.returncode == 0, produced.stderr
        consumed = run([installed.strata, "consume", "installed", "--from-beginning", "-n",
                        "100", "--timeout-ms", "20000"], env=env, cwd=installed.home)
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.split()) == sorted(f"value-{i}" for i in range(100))
        # The parts a broker host does not install say what to install.
        for command, extra in ((["up", "--data-dir", str(tmp_path / "stack")], "spark"),
                               (["gateway", "--no-auth"], "gateway"),
                               (["tier", "run", "--once"], "spark")):
            answer = run([installed.strata, *command], env=env, cwd=installed.home)
            assert answer.returncode == 1, (command, answer.stdout, answer.stderr)
            assert f"pip install 'strata[{extra}]'" in answer.stderr, answer.stderr
            assert "Traceback" not in answer.stderr, answer.stderr


SPARK_READ = """
import json, sys
from strata_spark import spark_session
spark = spark_session("installed-package")
rows = (spark.read.format("strata").option("bootstrap.servers", sys.argv[1])
        .option("subscribe", "spark-read").load())
values = sorted(r.value.decode() for r in rows.select("value").collect())
print(json.dumps({"values": values, "master": spark.conf.get("spark.master"),
                  "extensions": spark.conf.get("spark.sql.extensions")}))
spark.stop()
"""


def test_spark_reads_through_the_installed_package(installed: Installed,
                                                   zookeeper: ZooKeeperServer,
                                                   tmp_path: Path) -> None:
    env = installed.env()
    with installed_broker(installed, zookeeper, tmp_path / "broker", env,
                          "spark-read") as broker:
        produced = subprocess.run(
            [str(installed.strata), "produce", "spark-read"],
            input="".join(f"row-{i}\n" for i in range(50)), capture_output=True, text=True,
            timeout=120, env=env, cwd=installed.home, check=False)
        assert produced.returncode == 0, produced.stderr
        read = run([installed.python, "-c", SPARK_READ, broker.bootstrap], env=env,
                   cwd=installed.home, timeout=240)
        assert read.returncode == 0, read.stderr[-4000:]
        result = json.loads(read.stdout.strip().splitlines()[-1])
        assert result["values"] == sorted(f"row-{i}" for i in range(50))
        # The package's own conf/spark-defaults.conf configured the session.
        assert result["master"] == "local[2]"
        assert "DeltaSparkSessionExtension" in result["extensions"]
