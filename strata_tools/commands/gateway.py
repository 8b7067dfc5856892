"""``strata gateway``: serve the HTTP ingest gateway (Confluent REST Proxy v3 shape)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    bootstrap_of,
    security_of_args,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    gateway = sub.add_parser("gateway", help="serve the HTTP ingest gateway (REST Proxy v3)")
    add_bootstrap(gateway)
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on")
    gateway.add_argument("--port", type=int, default=8082, help="port (default 8082)")
    gateway.add_argument("--workers", type=int, default=1,
                         help="uvicorn worker processes, each with its own producer")
    auth = gateway.add_mutually_exclusive_group(required=True)
    auth.add_argument("--auth-config", metavar="FILE", default=None,
                      help="API keys, ACLs and rate limits (TOML; see "
                      "ingest_gateway/auth.example.toml)")
    auth.add_argument("--no-auth", action="store_true",
                      help="accept every request without authentication")
    gateway.add_argument("--linger-ms", type=float, default=1.0,
                         help="how long records of concurrent requests are gathered for "
                         "one producer send (0: one event-loop pass)")
    gateway.add_argument("--max-request-bytes", type=int, default=16 * 1024 * 1024)
    gateway.add_argument("--delivery-timeout-ms", type=int, default=30000,
                         help="a record not acknowledged in this time is answered with 503")
    gateway.add_argument("--idempotency-window-s", type=float, default=300.0,
                         help="how long an Idempotency-Key answer is kept")
    gateway.add_argument("--shutdown-grace-s", type=float, default=30.0,
                         help="how long shutdown waits for in-flight requests")
    gateway.add_argument("--tls-cert", metavar="FILE", default=None,
                         help="PEM certificate (chain): serve HTTPS only (needs --tls-key)")
    gateway.add_argument("--tls-key", metavar="FILE", default=None,
                         help="PEM private key of --tls-cert (unencrypted)")
    gateway.add_argument("--no-access-log", dest="access_log", action="store_false",
                         help="do not write the JSON access log (one line per request, "
                         "stderr)")
    gateway.add_argument("--log-level", default="info",
                         choices=("critical", "error", "warning", "info", "debug"))
    gateway.set_defaults(handler=_gateway)


def _gateway(args: argparse.Namespace) -> int:
    from ingest_gateway import GatewayConfig, GatewayConfigError, run

    if args.workers < 1:
        raise CommandError("--workers must be >= 1")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CommandError("--tls-cert and --tls-key go together: pass both to serve HTTPS")
    config = GatewayConfig(
        bootstrap=bootstrap_of(args), security=security_of_args(args), host=args.host,
        port=args.port, workers=args.workers,
        auth_config=None if args.no_auth else args.auth_config, no_auth=args.no_auth,
        linger_ms=args.linger_ms,
        max_request_bytes=args.max_request_bytes,
        delivery_timeout_ms=args.delivery_timeout_ms,
        idempotency_window_s=args.idempotency_window_s,
        shutdown_grace_s=args.shutdown_grace_s, tls_cert=args.tls_cert,
        tls_key=args.tls_key, access_log=args.access_log)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(config, log_level=args.log_level)
    except GatewayConfigError as err:
        raise CommandError(str(err)) from err
    return 0
