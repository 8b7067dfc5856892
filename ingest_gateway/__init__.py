"""HTTP ingest gateway: the Confluent REST Proxy v3 produce API over Strata brokers.

    from ingest_gateway import GatewayConfig, create_app, run

    # what `strata gateway --auth-config auth.toml` does
    run(GatewayConfig(bootstrap="127.0.0.1:2191", port=8082, auth_config="auth.toml"))

See ``ingest_gateway/README.md`` and ``docs/gateway.md``.
"""

from ingest_gateway._app import create_app, run
from ingest_gateway._config import GatewayConfig

__all__ = ["GatewayConfig", "create_app", "run"]
