"""One way to build a SparkSession for Strata: from the repository's ``conf/`` directory.

Why a helper instead of ``SparkSession.builder`` everywhere: the Delta settings, the Delta
JVM package coordinates and the small-machine tuning live in ``conf/spark-defaults.conf``
so notebooks, jobs and tests share one definition. Spark reads that file only through
``SPARK_CONF_DIR`` and only when the JVM starts, so the variable must be set before the
first session in the process; this module does that.

We deliberately do not use ``delta.configure_spark_with_delta_pip``: it would ask Ivy for
``io.delta:delta-spark_2.13:<pip version>`` (4.4.1), which does not exist on Maven Central
(see docs/dependencies.md). ``conf/spark-defaults.conf`` names the 4.4.0 jar built for
Spark 4.2 instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - import only for the annotation
    from pyspark.sql import SparkSession

__all__ = ["REPO_CONF_DIR", "IVY_SETTINGS", "spark_session"]

#: ``conf/`` at the repository root (this file is ``<repo>/strata/spark.py``).
REPO_CONF_DIR: Path = Path(__file__).resolve().parent.parent / "conf"

#: Ivy settings that resolve ``spark.jars.packages`` only from ``~/.m2`` and the local Ivy
#: cache, so a session starts with no network (see docs/dependencies.md, "Offline").
IVY_SETTINGS: Path = REPO_CONF_DIR / "ivysettings.xml"


def spark_session(app_name: str, extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """Return a SparkSession configured from ``conf/spark-defaults.conf``.

    ``SPARK_CONF_DIR`` is pointed at the repository's ``conf/`` unless the caller already
    set it (an operator's own configuration wins), and ``PYSPARK_PYTHON`` at this
    interpreter unless set, so Spark's Python workers run in the same environment.
    ``extra_conf`` overrides single keys, e.g. ``{"spark.sql.shuffle.partitions": "1"}``.
    If a session already exists in this process it is returned (Spark allows one
    SparkContext per JVM) with ``extra_conf`` applied to the runtime SQL settings only.
    """
    if "SPARK_CONF_DIR" not in os.environ and REPO_CONF_DIR.is_dir():
        os.environ["SPARK_CONF_DIR"] = str(REPO_CONF_DIR)
    # Spark starts its Python workers (UDFs, the strata data source) with PYSPARK_PYTHON,
    # else the first ``python3`` on PATH, which outside an activated venv is a system
    # Python without pyarrow or this project. The JVM inherits the variable at launch.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if os.environ.get("SPARK_CONF_DIR") == str(REPO_CONF_DIR) and IVY_SETTINGS.is_file():
        # Must be an absolute path; spark-defaults.conf cannot express "next to this file".
        builder = builder.config("spark.jars.ivySettings", str(IVY_SETTINGS))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session: SparkSession = builder.getOrCreate()
    return session
