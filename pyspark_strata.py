"""Spark's hook for ``format("strata")``: nothing to call, nothing to register.

PySpark 4 registers Python data sources by itself: the first time a session needs one,
a Python worker imports every top-level module whose name starts with ``pyspark_`` and
registers the ``DefaultSource`` it exposes under ``DefaultSource.name()``
(``pyspark/sql/worker/lookup_data_sources.py``, found with ``pkgutil.iter_modules``).
This module must therefore be a plain top-level module on the workers' ``sys.path``
(see ``spark_source/README.md``, "Registration") and must import cheaply and without
side effects: every session's lookup imports it.
"""

from spark_source import StrataDataSource

DefaultSource = StrataDataSource

__all__ = ["DefaultSource"]
