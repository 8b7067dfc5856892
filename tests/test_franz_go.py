"""Another project's client test suite against Strata (issue [3.6], item 4): franz-go's
own ``pkg/kgo`` tests, the ones its CI runs against Apache Kafka and Redpanda.

``make setup`` compiles them (``go test -c``) at the version ``tests/franz_go/go.mod``
pins, from the Go module proxy, into ``~/.cache/strata``; here the binary runs against
a three-broker cluster's Kafka listeners (``KGO_SEEDS``), replication factor 3, as
franz-go's CI does against Kafka: topic admin, idempotent produce of every codec, the
consumer in all its modes (direct, regex, pause, purge, fetch limits), consumer groups
with the range and cooperative-sticky balancers chaining records through ETL stages
with members joining and leaving, transactional ETL (``TestTxnEtl``: read-process-
write with aborts, read_committed), and SCRAM-SHA-256 logins (right and wrong) on a
second, KAFKA_SASL_PLAINTEXT listener. The allow-list is the binary's whole test list
minus ``tests/franz_go/excluded.txt``, where each exclusion has its reason; every test
run must PASS, none may skip itself, and a stale exclusion fails too.

``KGO_TEST_RECORDS`` makes the ETL tests move 500 records instead of 500,000 (the
only knob franz-go offers; the code paths are the same).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.client import Admin
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent / "franz_go"
VERSION = re.search(r"^require github\.com/twmb/franz-go (v\S+)$",
                    (HERE / "go.mod").read_text(), re.M).group(1)  # type: ignore[union-attr]
BUILT = Path.home() / ".cache" / "strata" / f"franz-go-{VERSION}"
BINARY = BUILT / "kgo.test"
RECORDS = 500
SCRAM_USER, SCRAM_PASSWORD = "franz", "franz-go-scram-secret"
_RESULT = re.compile(r"^--- (PASS|FAIL|SKIP): (\S+) \(")


def excluded() -> dict[str, str]:
    """``tests/franz_go/excluded.txt``: test name -> why Strata does not run it."""
    out: dict[str, str] = {}
    for line in (HERE / "excluded.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.strip().partition("  ")
            assert why.strip(), f"excluded.txt: {name} has no reason"
            assert name not in out, f"excluded.txt: {name} twice"
            out[name] = why.strip()
    return out


def verdict(listed: list[str], skipped: dict[str, str], output: str) -> list[str]:
    """What is wrong with a run: every listed test not excluded must have PASSed (top
    level; franz-go's own subtests for KIP-848 and static members skip themselves);
    every exclusion must name a listed test."""
    results: dict[str, str] = {}
    for line in output.splitlines():
        match = _RESULT.match(line)
        if match:
            results[match.group(2)] = match.group(1)
    problems = [f"excluded.txt names {name}, which franz-go {VERSION} does not have"
                for name in skipped if name not in listed]
    for name in listed:
        if name in skipped:
            if name in results:
                problems.append(f"{name} is excluded but ran")
            continue
        got = results.get(name, "not run")
        if got != "PASS":
            problems.append(f"{name}: {got}")
    return problems


@pytest.fixture(scope="module")
def binary() -> Path:
    assert BINARY.is_file() and (BUILT / "source").is_file(), (
        f"franz-go {VERSION}'s tests are not built: run `make setup` (scripts/setup.sh "
        f"compiles them into {BUILT})")
    return BINARY


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("franz-go"), brokers=3, kafka=True,
                 kafka_sasl=True) as c:
        with Admin(c.bootstrap) as admin:  # the SCRAM tests' user (KGO_TEST_SCRAM)
            admin.upsert_scram_credential(SCRAM_USER, SCRAM_PASSWORD)
        yield c


def test_the_checker_fails_bad_runs() -> None:
    """``verdict`` is what passes or fails the suite: shown failing each way."""
    listed = ["TestA", "TestB", "TestC"]
    good = "--- PASS: TestA (0.01s)\n    --- SKIP: TestA/848 (0.00s)\n--- PASS: TestB (1s)\n"
    assert verdict(listed, {"TestC": "why"}, good) == []
    assert verdict(listed, {"TestC": "why"}, good.replace("PASS: TestB", "FAIL: TestB")) \
        == ["TestB: FAIL"]
    assert verdict(listed, {"TestC": "why"}, good.replace("PASS: TestB", "SKIP: TestB")) \
        == ["TestB: SKIP"]
    assert verdict(listed, {"TestC": "why"}, good.replace("--- PASS: TestB (1s)\n", "")) \
        == ["TestB: not run"]
    assert verdict(listed, {"TestC": "why", "TestGone": "why"}, good) \
        == [f"excluded.txt names TestGone, which franz-go {VERSION} does not have"]
    assert verdict(listed, {"TestB": "why", "TestC": "why"}, good) == ["TestB is excluded but ran"]
    noisy = ("    --- PASS: TestA/seed#1 (0.00s)\n    helpers_test.go:12: boom\n"
             "--- FAIL: TestB (3.2s)\n    --- FAIL: TestB/sub (1s)\nFAIL\n")
    assert failures(noisy).splitlines() == [
        "    helpers_test.go:12: boom", "--- FAIL: TestB (3.2s)",
        "    --- FAIL: TestB/sub (1s)", "FAIL"]


def test_franz_go_integration_suite_passes(binary: Path, cluster: Cluster,
                                          tmp_path: Path) -> None:
    # Run where `go test` would (the package's source directory: one test reads its
    # config.go), read-only in Go's module cache; the binary writes nothing there.
    source = Path((BUILT / "source").read_text().strip()) / "pkg" / "kgo"
    listed = [name for name in subprocess.run(
        [str(binary), "-test.list", "."], cwd=source, check=True, capture_output=True,
        text=True, timeout=60).stdout.split() if not name.startswith("Benchmark")]
    assert len(listed) > 100, listed
    skipped = excluded()
    env = {**os.environ, "KGO_SEEDS": cluster.kafka_bootstrap,
           "KGO_TEST_SCRAM_SEEDS": cluster.kafka_sasl_bootstrap,
           "KGO_TEST_SCRAM": f"{SCRAM_USER}:{SCRAM_PASSWORD}:256",
           "KGO_TEST_RECORDS": str(RECORDS), "KGO_LOG_LEVEL": "none"}
    run = subprocess.run(
        [str(binary), "-test.v", "-test.timeout", "480s", "-test.count", "1", "-test.parallel", "8",
         "-test.skip", "^(" + "|".join(map(re.escape, skipped)) + ")$"],
        cwd=source, env=env, capture_output=True, text=True, timeout=540)
    output = run.stdout + run.stderr
    (tmp_path / "franz-go.log").write_text(output)
    problems = verdict(listed, skipped, output)
    if run.returncode != 0 or problems:
        raise AssertionError(
            f"franz-go {VERSION} against Strata: exit {run.returncode}; "
            f"{'; '.join(problems) or 'see the output'}\n" + failures(output)
            + f"\n(whole output: {tmp_path / 'franz-go.log'}); "
            + ("; ".join(problems) or f"exit {run.returncode}"))


def failures(output: str) -> str:
    """The lines of ``output`` that say what failed: ``--- FAIL`` lines (any depth), the
    ``file_test.go:N:`` messages and panics, at most 80, not the thousands of passing
    subtests' lines (which once pushed the verdict out of CI's view)."""
    wanted = re.compile(r"^\s*(--- FAIL|panic|FAIL\b)|^\s+\S+_test\.go:\d+:")
    lines = [line for line in output.splitlines()
             if wanted.match(line) and "deleting topic" not in line]
    return "\n".join(lines[-80:])
