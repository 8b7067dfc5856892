"""HTTP ingest gateway: the Confluent REST Proxy v3 produce API over Strata brokers.

    from ingest_gateway import GatewayConfig, create_app, run

    run(GatewayConfig(bootstrap="127.0.0.1:2191", port=8082))   # what `strata gateway` does

See ``ingest_gateway/README.md`` and ``docs/gateway.md``.
"""

from ingest_gateway._app import create_app, run
from ingest_gateway._config import GatewayConfig

__all__ = ["GatewayConfig", "create_app", "run"]
