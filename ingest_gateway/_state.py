"""What one gateway worker process shares between requests: ``GatewayState``.

The shared producers (one ``AsyncProducer`` per ``acks`` value, created on first use),
the ``Coalescer`` that feeds them, the admin client and its cached cluster id, topic
limits and value subjects, the ``Idempotency-Key`` store, the metrics, and the auth
objects (``GatewayAuth``). The FastAPI app (``_app``) creates one per process in its
lifespan and puts it on ``app.state.gateway``; the produce route (``_route``) and the
schema registry routes (``_registry``) receive it from there. None of them is imported
here, so the state sits below all three and no module imports ``_app`` back.

Thread-safety: the worker's event loop; ``GatewayAuth.executor`` runs the slow PBKDF2
verifications off it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ingest_gateway._auth import HttpAuthenticator, RateLimiter, load_auth_config
from ingest_gateway._coalescer import Coalescer
from ingest_gateway._config import GatewayConfig
from ingest_gateway._errors import HttpError, from_strata_error, unavailable
from ingest_gateway._idempotency import IdempotencyStore
from ingest_gateway._metrics import GatewayMetrics
from strata.client import AsyncAdmin, AsyncProducer
from wire.errors import StrataError

__all__ = ["GatewayAuth", "GatewayState", "load_gateway_auth"]

log = logging.getLogger("strata.gateway")


@dataclass(slots=True)
class GatewayAuth:
    """The auth objects of one worker process (``--auth-config``)."""

    authenticator: HttpAuthenticator
    rate_limiter: RateLimiter
    #: PBKDF2 verification is slow on purpose: it runs here, one at a time, off the loop.
    executor: ThreadPoolExecutor


def load_gateway_auth(config: GatewayConfig) -> GatewayAuth | None:
    """The auth objects for ``config.auth_config`` (None: ``--no-auth``, every request is
    allowed). Raises ``GatewayConfigError`` naming the file and the fix."""
    if config.auth_config is None:
        return None
    auth_config = load_auth_config(Path(config.auth_config))
    return GatewayAuth(HttpAuthenticator(auth_config), RateLimiter(auth_config),
                       ThreadPoolExecutor(1, thread_name_prefix="gateway-auth"))


class GatewayState:
    """Everything one worker process shares between requests."""

    def __init__(self, config: GatewayConfig, auth: GatewayAuth | None) -> None:
        self.config = config
        self.auth = auth
        self.metrics = GatewayMetrics()
        self.idempotency = IdempotencyStore(
            config.idempotency_window_s, config.idempotency_max_keys,
            # the producing worker renews its claim while it runs (a dead one's claim lapses)
            shared_path=config.idempotency_db)
        self.admin = AsyncAdmin(config.bootstrap, client_id="strata-gateway-admin",
                                request_timeout_ms=max(1000, config.request_timeout_ms),
                                security=config.security)
        self.producers: dict[str, AsyncProducer] = {}
        self._producer_lock = asyncio.Lock()
        self._cluster_id: tuple[str, float] | None = None
        self._limits: dict[str, tuple[int, float]] = {}
        self._subjects: dict[str, str | None] = {}
        self.coalescer = Coalescer(self)
        #: Set by the SIGTERM/SIGINT handler (``GatewayApp.drain``): not ready any more.
        self.draining = False
        #: Set when the lifespan ends: the producers are being flushed and closed.
        self.closing = False

    async def producer(self, acks: str) -> AsyncProducer:
        existing = self.producers.get(acks)
        if existing is not None:
            return existing
        async with self._producer_lock:
            if acks not in self.producers:
                if self.closing:
                    raise unavailable("the gateway is shutting down; retry on another "
                                      "instance", not_written=True)
                c = self.config
                producer = AsyncProducer(
                    c.bootstrap, acks=acks, linger_ms=c.linger_ms, batch_size=c.batch_size,
                    buffer_memory=c.buffer_memory, delivery_timeout_ms=c.delivery_timeout_ms,
                    request_timeout_ms=c.request_timeout_ms, max_block_ms=c.max_block_ms,
                    enable_idempotence=None if acks == "all" else False,
                    client_id=f"strata-gateway-acks-{acks}", security=c.security)
                await producer.start()
                self.producers[acks] = producer
                log.info("started the shared producer for acks=%s", acks)
            return self.producers[acks]

    async def cluster_id(self) -> str:
        now = time.monotonic()
        if self._cluster_id is not None and self._cluster_id[1] > now:
            return self._cluster_id[0]
        try:
            description = await self.admin.describe_cluster()
        except StrataError as err:
            raise from_strata_error(err, sent=False) from err
        cid = description.cluster_id or "strata"
        self._cluster_id = (cid, now + self.config.metadata_ttl_s)
        return cid

    async def check_cluster(self, cluster_id: str) -> str:
        actual = await self.cluster_id()
        if cluster_id != actual:
            raise HttpError(404, f"cluster {cluster_id!r} is not served here; this gateway "
                                 f"serves cluster {actual!r} (GET /v3/clusters)")
        return actual

    async def max_message_bytes(self, topic: str) -> int:
        """The topic's ``max.message.bytes`` (cached); 404 if the topic does not exist."""
        now = time.monotonic()
        cached = self._limits.get(topic)
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            configs = await self.admin.describe_configs([topic])
        except StrataError as err:
            raise from_strata_error(err, topic=topic, sent=False) from err
        value = configs.get(topic, {}).get("max.message.bytes")
        limit = int(value.value) if value is not None and value.value else 1 << 20
        subject = configs.get(topic, {}).get("value.schema.subject")
        self._subjects[topic] = subject.value or None if subject is not None else None
        self._limits[topic] = (limit, now + self.config.metadata_ttl_s)
        return limit

    def value_subject(self, topic: str) -> str | None:
        """The topic's value subject, as read with ``max_message_bytes`` (call it
        first): None for a bytes topic."""
        return self._subjects.get(topic)

    def forget_topic(self, topic: str) -> None:
        self._limits.pop(topic, None)

    async def close(self) -> None:
        """Send the gathered records and close the producers (which deliver what they
        buffer), all within ``shutdown_grace_s``."""
        self.closing = True
        grace = self.config.shutdown_grace_s
        deadline = time.monotonic() + grace
        await self.coalescer.close(timeout=grace)
        for acks, producer in list(self.producers.items()):
            try:
                await producer.close(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                log.exception("closing the producer for acks=%s failed", acks)
        await self.admin.close()
        await self.idempotency.aclose()
