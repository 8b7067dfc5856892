"""HTTP ingest gateway: the Confluent REST Proxy v3 produce API over Strata brokers.

    from ingest_gateway import GatewayConfig, create_app, run

    # what `strata gateway --auth-config auth.toml` does
    run(GatewayConfig(bootstrap="127.0.0.1:2191", port=8082, auth_config="auth.toml"))

``GatewayConfigError`` is what ``run``/``create_app`` raise for a bad auth file or TLS
files; ``generate_dev_key`` (with ``DEV_KEY_ID`` and ``ALL_ACCESS``, the rules of a key
that may do everything) makes a development API key, as ``strata up`` does for the local
stack.

See ``ingest_gateway/README.md`` and ``docs/gateway.md``.
"""

from ingest_gateway._app import create_app, run
from ingest_gateway._auth import ALL_ACCESS, DEV_KEY_ID, GatewayConfigError, generate_dev_key
from ingest_gateway._config import GatewayConfig

__all__ = ["ALL_ACCESS", "DEV_KEY_ID", "GatewayConfig", "GatewayConfigError", "create_app",
           "generate_dev_key", "run"]
