"""``strata.spark``: the older name of the SparkSession helper, kept so that
``from strata.spark import spark_session`` goes on working.

The helper lives in ``strata_spark`` now (the Spark layer shared by the Spark source and
the tiering job); new code imports it from there. This module only re-exports it.
"""

from strata_spark import (
    BIND_CONF_KEYS,
    BIND_ENV_VARS,
    IVY_SETTINGS,
    LOOPBACK,
    REPO_CONF_DIR,
    is_startup_noise,
    loopback_defaults,
    spark_session,
)

__all__ = ["BIND_CONF_KEYS", "BIND_ENV_VARS", "IVY_SETTINGS", "LOOPBACK", "REPO_CONF_DIR",
           "is_startup_noise", "loopback_defaults", "spark_session"]
