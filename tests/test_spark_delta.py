"""conf/spark-defaults.conf really gives a Delta-capable session (via strata_spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strata_spark import IVY_SETTINGS

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(300)]


def test_session_comes_from_the_repo_conf(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.master") == "local[2]"
    assert conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf.get("spark.jars.packages") == "io.delta:delta-spark_4.2_2.13:4.4.0"
    # Resolution goes through the local-only Ivy settings (no network at run time).
    assert conf.get("spark.jars.ivySettings") == str(IVY_SETTINGS)
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"


def test_delta_write_append_read_and_time_travel(spark: Any, tmp_path: Path) -> None:
    table = str(tmp_path / "events")
    first = [(0, "a"), (1, "b"), (2, "c")]
    second = [(3, "d"), (4, "e")]
    spark.createDataFrame(first, "id long, value string").write.format("delta").save(table)
    spark.createDataFrame(second, "id long, value string").write.format("delta").mode(
        "append"
    ).save(table)

    latest = spark.read.format("delta").load(table)
    assert sorted(tuple(r) for r in latest.collect()) == first + second

    version0 = spark.read.format("delta").option("versionAsOf", 0).load(table)
    assert sorted(tuple(r) for r in version0.collect()) == first

    # SQL on a path table needs the Delta extension + catalog from spark-defaults.conf.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "operation")
    assert sorted(tuple(r) for r in history.collect()) == [(0, "WRITE"), (1, "WRITE")]
