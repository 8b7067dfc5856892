"""``GatewayConfig``: every setting of one gateway process (and how workers inherit it)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from wire.security import PLAINTEXT, ClientSecurity

__all__ = ["CONFIG_ENV", "GatewayConfig"]

#: Environment variable naming the file (mode 0600, in a 0700 directory of the parent's)
#: that carries the JSON config to uvicorn worker processes. A file, not the JSON itself:
#: the config holds the gateway's SASL password, and an environment is inherited by
#: every child process and copied into crash reports.
CONFIG_ENV = "STRATA_GATEWAY_CONFIG_FILE"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Settings of the ingest gateway.

    ``auth_config``: path of the auth file read by ``ingest_gateway._auth`` (API keys,
    ACLs, rate limits). Authentication is off only when asked for: ``no_auth=True``
    (``strata gateway --no-auth``) accepts every request; neither given is an error.
    """

    bootstrap: str
    #: How the gateway reaches the brokers: its own principal (docs/security.md).
    security: ClientSecurity = PLAINTEXT
    host: str = "127.0.0.1"
    port: int = 8082
    workers: int = 1
    auth_config: str | None = None
    #: Accept every request without authentication (development only).
    no_auth: bool = False
    #: Largest request body (and, in streaming mode, largest single JSON record) in bytes.
    max_request_bytes: int = 16 * 1024 * 1024
    #: How long the coalescer gathers concurrent requests' records for one producer send
    #: (0: until the end of the current event-loop pass), and the shared producers'
    #: settings.
    linger_ms: float = 1.0
    batch_size: int = 131072
    buffer_memory: int = 64 * 1024 * 1024
    delivery_timeout_ms: int = 30000
    request_timeout_ms: int = 10000
    max_block_ms: int = 10000
    #: How long an ``Idempotency-Key`` answer is kept, and how many keys at most.
    idempotency_window_s: float = 300.0
    idempotency_max_keys: int = 100_000
    #: SQLite file shared by the worker processes for Idempotency-Key answers (``run``
    #: makes a private one when ``workers > 1``); None keeps them in the process only.
    idempotency_db: str | None = None
    #: How long a topic's ``max.message.bytes`` and the cluster id are cached.
    metadata_ttl_s: float = 30.0
    #: Seconds uvicorn gives in-flight requests on shutdown before closing them.
    shutdown_grace_s: float = 30.0
    #: Seconds between SIGTERM and closing the listening socket: the gateway keeps serving
    #: while ``/readyz`` already answers 503, so a load balancer stops sending to it before
    #: connections are refused (0: close at once; ``/readyz`` is 503 from the signal on).
    drain_delay_s: float = 0.0
    #: Largest ``max_records`` of the read endpoint.
    max_read_records: int = 10_000
    #: PEM certificate (chain) and private key: both set serves HTTPS only.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: One JSON line per request on stderr (``_access``: written directly, not through
    #: ``logging``).
    access_log: bool = True

    def __post_init__(self) -> None:
        if self.auth_config is None and not self.no_auth:
            raise ValueError("no auth_config: pass the API key file (strata gateway "
                             "--auth-config FILE), or no_auth=True (--no-auth) to accept "
                             "every request without authentication")
        if self.auth_config is not None and self.no_auth:
            raise ValueError("auth_config and no_auth=True contradict each other: pass one")
        if not self.bootstrap.strip():
            raise ValueError("bootstrap is empty: pass the brokers as HOST:PORT[,HOST:PORT]")
        if not 1 <= self.port <= 65535 and self.port != 0:
            raise ValueError(f"port {self.port} is outside 1-65535")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        for name in ("max_request_bytes", "batch_size", "buffer_memory", "delivery_timeout_ms",
                     "request_timeout_ms", "idempotency_max_keys", "max_read_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and its private key "
                             "(--tls-cert FILE --tls-key FILE)")
        if (self.linger_ms < 0 or self.max_block_ms < 0 or self.idempotency_window_s < 0
                or self.drain_delay_s < 0):
            raise ValueError("linger_ms, max_block_ms, idempotency_window_s and drain_delay_s "
                             "must be >= 0")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GatewayConfig:
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown gateway settings: {', '.join(unknown)}")
        if isinstance(data.get("security"), dict):  # to_json writes it as a mapping
            data["security"] = ClientSecurity(**data["security"])
        return cls(**data)

    def write_private(self, directory: str) -> str:
        """Write this config for worker processes into ``directory`` (which only this
        user can enter), readable by this user only; return the file's path."""
        path = os.path.join(directory, "gateway-config.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(self.to_json())
        return path

    @classmethod
    def from_env(cls) -> GatewayConfig:
        """The config a worker process was started with (see ``write_private``)."""
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise RuntimeError(f"{CONFIG_ENV} is not set; start the gateway with `strata gateway`")
        with open(path, encoding="utf-8") as config_file:
            return cls.from_json(config_file.read())
