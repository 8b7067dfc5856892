"""Warehouse locations (``strata_spark.Warehouse``): the forms accepted, every refusal
with its code and a message that says what to write instead, and that the Spark
settings and delta-rs options built for S3 carry no credential."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_spark import HADOOP_AWS_PACKAGE, InvalidWarehouseError, Warehouse

pytestmark = pytest.mark.unit


def test_local_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = Warehouse.parse("wh")
    assert relative.is_local and relative.path == tmp_path / "wh"
    assert Warehouse.parse(f"file://{tmp_path}/wh") == relative
    assert Warehouse.parse(f"file://localhost{tmp_path}/wh") == relative
    assert relative.delta_uri("topics", "t") == relative.spark_uri("topics", "t") == \
        str(tmp_path / "wh" / "topics" / "t")
    assert relative.storage_options() == {} and relative.spark_conf() == {}


def test_s3_forms() -> None:
    wh = Warehouse.parse("s3://strata-lake/team/wh/")
    assert not wh.is_local and (wh.bucket, wh.prefix) == ("strata-lake", "team/wh")
    assert Warehouse.parse("s3a://strata-lake/team/wh") == wh
    assert wh.uri == str(wh) == "s3://strata-lake/team/wh"
    assert wh.delta_uri("topics", "events") == "s3://strata-lake/team/wh/topics/events"
    assert wh.spark_uri("topics", "events") == "s3a://strata-lake/team/wh/topics/events"
    root = Warehouse.parse("s3://strata-lake")
    assert root.prefix == "" and root.delta_uri("topics", "t") == "s3://strata-lake/topics/t"


@pytest.mark.parametrize(("location", "says"), [
    ("", "empty"),
    ("gs://bucket/wh", "'gs' scheme is not supported"),
    ("abfss://fs@account.dfs.core.windows.net/wh", "'abfss' scheme is not supported"),
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@strata-lake/wh", "carries credentials"),
    ("s3://strata-lake:9000/wh", "AWS_ENDPOINT_URL"),
    ("s3://Strata_Lake/wh", "not a valid S3 bucket name"),
    ("s3://ab/wh", "not a valid S3 bucket name"),
    ("s3://strata-lake/a//b", "empty, '.' or '..' segment"),
    ("s3://strata-lake/a/../b", "empty, '.' or '..' segment"),
    ("s3://strata-lake/wh?versionId=3", "query or fragment"),
    ("file://otherhost/data/wh", "mount shared storage"),
])
def test_refusals_say_what_to_do(location: str, says: str) -> None:
    with pytest.raises(InvalidWarehouseError, match=r"\[INVALID_WAREHOUSE\]") as caught:
        Warehouse.parse(location)
    assert caught.value.code == 1405
    assert says in str(caught.value)
    assert "wJalrXUtnFEMI" not in str(caught.value)  # a secret is never repeated back


def test_s3_settings_come_from_the_environment_and_hold_no_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-not-in-any-setting")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-not-in-any-setting")
    wh = Warehouse.parse("s3://strata-lake/wh")
    # AWS itself: the connector, nothing else to say; delta-rs needs no option.
    assert wh.spark_conf("io.delta:delta-spark_4.2_2.13:4.4.0") == {
        "spark.jars.packages": f"io.delta:delta-spark_4.2_2.13:4.4.0,{HADOOP_AWS_PACKAGE}"}
    assert wh.storage_options() == {}
    # An S3-compatible store over plain HTTP: endpoint, path style, no TLS, its region.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    conf = wh.spark_conf()
    assert HADOOP_AWS_PACKAGE in conf["spark.jars.packages"]
    assert "io.delta:delta-spark" in conf["spark.jars.packages"]  # the configured one kept
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
    assert wh.storage_options() == {"AWS_ALLOW_HTTP": "true"}
    # The S3-specific variable wins; HTTPS keeps TLS on and needs no option for delta-rs.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.test")
    assert wh.spark_conf()["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert wh.storage_options() == {}
    settings = [*wh.spark_conf().values(), *wh.storage_options().values()]
    assert not any("not-in-any-setting" in value for value in settings)


@pytest.mark.parametrize(("location", "code"), [
    ("gs://strata-lake/wh", "[INVALID_WAREHOUSE]"),
    ("s3://strata-lake:9000/wh", "[INVALID_WAREHOUSE]"),
    ("s3://KEY:s3cr3t-value@strata-lake/wh", "[INVALID_WAREHOUSE]"),
])
def test_tier_run_refuses_before_writing_anything(
        location: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`strata tier run --warehouse` checks the location before any I/O: a malformed
    location is refused with its code (brokers are not even asked), and nothing appears
    in the current directory (``Path("s3://b/x")`` would have made a local ``s3:/b/x``)."""
    from strata_tools.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["tier", "run", "--bootstrap", "127.0.0.1:1", "--warehouse", location,
                 "--once"]) == 1
    error = capsys.readouterr().err
    assert code in error and "s3cr3t-value" not in error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("local", [False, True])
def test_settings_that_unmake_put_if_absent_are_refused(
        local: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """UNSAFE_WAREHOUSE: delta-rs told to commit with a plain PUT, or S3A told to create
    files by overwriting, would let two writers both commit version N on a store; a local
    warehouse (atomic creates) has nothing to refuse."""
    from strata_spark import UnsafeWarehouseError

    wh = Warehouse.parse(str(tmp_path) if local else "s3://strata-lake/wh")
    wh.unsafe_settings({"spark.hadoop.fs.s3a.create.performance": "false"})
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    if local:
        wh.unsafe_settings({"spark.hadoop.fs.s3a.create.performance": "true"})
        return
    with pytest.raises(UnsafeWarehouseError, match="AWS_S3_ALLOW_UNSAFE_RENAME=true"):
        wh.unsafe_settings()
    monkeypatch.delenv("AWS_S3_ALLOW_UNSAFE_RENAME")
    with pytest.raises(UnsafeWarehouseError, match=r"fs\.s3a\.create\.performance=True"):
        wh.unsafe_settings({"spark.hadoop.fs.s3a.create.performance": "True"})


def test_tier_run_refuses_an_unsafe_store_setting_before_anything_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from strata_tools.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    assert main(["tier", "run", "--bootstrap", "127.0.0.1:1", "--warehouse",
                 "s3://strata-lake/wh", "--once"]) == 1
    error = capsys.readouterr().err
    assert "[UNSAFE_WAREHOUSE]" in error and "If-None-Match" in error, error
    assert list(tmp_path.iterdir()) == []


def test_up_refuses_a_bad_warehouse_before_starting_anything(tmp_path: Path) -> None:
    """`strata up --warehouse` (run as a user runs it) checks the location first."""
    import subprocess
    import sys

    data_dir = tmp_path / "stack"
    done = subprocess.run(
        [sys.executable, "-m", "strata_tools.cli", "up", "--data-dir", str(data_dir),
         "--warehouse", "s3://KEY:s3cr3t-value@strata-lake/wh"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    assert "[INVALID_WAREHOUSE]" in done.stderr and "s3cr3t-value" not in done.stderr, \
        done.stderr
    assert not data_dir.exists()
