"""The FastAPI application: Confluent REST Proxy v3 routes over one shared producer.

One ``AsyncProducer`` per ``acks`` value per process, created lazily and closed (flushed)
when the app shuts down, so concurrent requests share batches (``linger_ms``). A record
is reported as written only after its future resolved with the broker's
acknowledgement; every other outcome is an error answer naming the record.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from brokers.errors import OffsetOutOfRangeError, StrataError
from ingest_gateway._access import AccessLogMiddleware, access_info, configure_access_log
from ingest_gateway._auth import (
    Action,
    Authenticator,
    GatewayConfigError,
    GatewayHttpError,
    Principal,
    RateLimiter,
    load_auth_config,
)
from ingest_gateway._codec import decode_record, encode_data, iso_timestamp
from ingest_gateway._config import CONFIG_ENV, GatewayConfig
from ingest_gateway._errors import HttpError, from_strata_error, unavailable
from ingest_gateway._idempotency import Answer, IdempotencyStore
from ingest_gateway._metrics import GatewayMetrics
from strata.client import (
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    NewTopic,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
)

__all__ = ["app_from_env", "create_app", "run"]

log = logging.getLogger("ingest_gateway")

_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}
_ACKS_PATTERN = "^(all|-1|1|0)$"
_SSE_KEEPALIVE_S = 15.0


# ---------------------------------------------------------------------------- state
@dataclass(slots=True)
class _Pending:
    """One record of a produce request: its decoded form and its delivery future, or the
    error that stopped it."""

    label: str
    #: What the report needs once acknowledged: (size, key info, value info); the record's
    #: bytes are not kept (a long stream holds one of these per record).
    summary: tuple[int, dict[str, Any] | None, dict[str, Any] | None] | None = None
    future: asyncio.Future[RecordMetadata] | None = None
    error: HttpError | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _State:
    def __init__(self, config: GatewayConfig, auth: _Auth | None) -> None:
        self.config = config
        self.auth = auth
        self.metrics = GatewayMetrics()
        self.idempotency = IdempotencyStore(
            config.idempotency_window_s, config.idempotency_max_keys,
            shared_path=config.idempotency_db,
            # a claim outlives the longest produce: buffer wait plus delivery, plus slack
            pending_timeout_s=(config.max_block_ms + config.delivery_timeout_ms) / 1000 + 30)
        self.admin = AsyncAdmin(config.bootstrap, client_id="strata-gateway-admin",
                                request_timeout_ms=max(1000, config.request_timeout_ms))
        self.producers: dict[str, AsyncProducer] = {}
        self._producer_lock = asyncio.Lock()
        self._cluster_id: tuple[str, float] | None = None
        self._limits: dict[str, tuple[int, float]] = {}
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
                    client_id=f"strata-gateway-acks-{acks}")
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
        self._limits[topic] = (limit, now + self.config.metadata_ttl_s)
        return limit

    def forget_topic(self, topic: str) -> None:
        self._limits.pop(topic, None)

    async def close(self) -> None:
        self.closing = True
        for acks, producer in list(self.producers.items()):
            try:
                await producer.close(timeout=self.config.shutdown_grace_s)
            except Exception:
                log.exception("closing the producer for acks=%s failed", acks)
        await self.admin.close()
        self.idempotency.close()


class _MetricsMiddleware:
    """Requests and latency by route and status, as plain ASGI middleware.

    Not ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware runs every request
    through an extra task and stream, which showed up in gateway profiles.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def watching_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        finally:
            gateway = getattr(scope["app"].state, "gateway", None)
            if gateway is not None:
                route = getattr(scope.get("route"), "path", "unmatched")
                method = scope.get("method", "")
                gateway.metrics.requests.labels(method, route, str(status[0])).inc()
                gateway.metrics.latency.labels(method, route).observe(
                    time.perf_counter() - start)


def _state(request: Request) -> _State:
    state: _State = request.app.state.gateway
    return state


# ---------------------------------------------------------------------------- auth
@dataclass(slots=True)
class _Auth:
    authenticator: Authenticator
    rate_limiter: RateLimiter
    #: PBKDF2 verification is slow on purpose: it runs here, one at a time, off the loop.
    executor: ThreadPoolExecutor


def _load_auth(config: GatewayConfig) -> _Auth | None:
    """The auth objects for ``config.auth_config`` (None: ``--no-auth``, every request is
    allowed). Raises ``GatewayConfigError`` naming the file and the fix."""
    if config.auth_config is None:
        return None
    auth_config = load_auth_config(Path(config.auth_config))
    return _Auth(Authenticator(auth_config), RateLimiter(auth_config),
                 ThreadPoolExecutor(1, thread_name_prefix="gateway-auth"))


def _guard(action: Action) -> Callable[[Request], Awaitable[Principal | None]]:
    """The one auth dependency of a route: authenticate the Authorization header,
    authorize ``action`` on the route's topic (None: cluster-level), then charge the
    key's rate limit one request."""

    async def dependency(request: Request) -> Principal | None:
        auth = _state(request).auth
        if auth is None:
            return None
        topic = request.path_params.get("topic_name")
        principal = await asyncio.get_running_loop().run_in_executor(
            auth.executor, auth.authenticator.authenticate, request.headers.get("authorization"))
        access_info(request.scope)["key_id"] = principal.key_id
        auth.authenticator.authorize(principal, action, topic)
        auth.rate_limiter.check(principal, 1)
        return principal

    return dependency


#: The produce routes' principal (module level: FastAPI resolves the annotation here).
_ProducePrincipal = Annotated[Principal | None, Depends(_guard(Action.PRODUCE))]


def _principal_name(principal: Principal | None) -> str:
    return "-" if principal is None else principal.key_id


# ---------------------------------------------------------------------------- helpers
def _check_json(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in ("application/json", "application/x-ndjson") and not (
            media.startswith("application/") and media.endswith("+json")):
        raise HttpError(415, f"unsupported Content-Type {media or '(none)'!r}: send "
                             "records as Content-Type: application/json")


def _acks(value: str) -> str:
    acks = _ACKS.get(value.strip().lower())
    if acks is None:
        raise HttpError(422, f"acks: must be all, -1, 1 or 0, got {value!r}")
    return acks


async def _read_body(request: Request, limit: int) -> bytes:
    _check_length(request, limit)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise HttpError(413, f"request body is larger than the gateway's limit of {limit} "
                                 "bytes; split it into several requests")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(body: bytes, what: str = "body") -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HttpError(422, f"{what}: not valid JSON ({err})") from None


def _parse_concatenated(text: str, first_index: int = 0) -> tuple[list[Any], HttpError | None]:
    """JSON values one after another (whitespace between); the error after the last.
    ``first_index`` numbers the values in error messages (``records[i]``)."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            return out, None
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            index = first_index + len(out)
            return out, HttpError(422, f"records[{index}]: not valid JSON ({err.msg})")
        out.append(value)


def _encoded_size(text: str, start: int, end: int) -> int:
    """UTF-8 size of ``text[start:end]`` (each character is 1 to 4 bytes)."""
    return end - start if text.isascii() else len(text[start:end].encode())


async def _stream_objects(request: Request, limit: int) -> AsyncIterator[Any | HttpError]:
    """Top-level JSON values of the body as they arrive (streaming mode); a value larger
    than ``limit`` bytes, or invalid JSON, ends the stream with an ``HttpError``.

    Linear in the body size: values are decoded in place from an index and the buffer is
    cut once per chunk. After a failed attempt (a value not complete yet) the next one
    waits until the text ends with ``}`` or ``]`` or the pending text has doubled, so a
    large record arriving in many chunks is not re-parsed for every chunk.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    buf = ""
    count = 0
    failed_at = 0  # length of the pending text at the last failed attempt
    async for chunk in request.stream():
        try:
            buf += utf8.decode(chunk)
        except UnicodeDecodeError as err:
            yield HttpError(422, f"records[{count}]: not valid UTF-8 ({err})")
            return
        pos = 0
        if len(buf) >= 2 * failed_at or buf.rstrip(" \t\r\n")[-1:] in ("}", "]"):
            failed_at = 0
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos >= len(buf):
                    break
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    failed_at = len(buf) - pos  # incomplete (invalid: reported at the end)
                    break
                if end - pos > limit or (4 * (end - pos) > limit
                                         and _encoded_size(buf, pos, end) > limit):
                    yield _too_large_record(limit, count)
                    return
                pos = end
                count += 1
                yield value
        buf = buf[pos:]
        if len(buf) > limit or (4 * len(buf) > limit and _encoded_size(buf, 0, len(buf)) > limit):
            yield _too_large_record(limit, count)
            return
    try:
        buf += utf8.decode(b"", final=True)
    except UnicodeDecodeError as err:
        yield HttpError(422, f"records[{count}]: not valid UTF-8 ({err})")
        return
    values, error = _parse_concatenated(buf, count)
    for value in values:
        yield value
    if error is not None:
        yield error


def _too_large_record(limit: int, index: int) -> HttpError:
    return HttpError(413, f"records[{index}] is larger than {limit} bytes, the gateway's "
                          "limit per record in streaming mode; send smaller records",
                     not_written=True)


def _check_length(request: Request, limit: int) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise HttpError(413, f"request body of {length} bytes is larger than the gateway's "
                             f"limit of {limit} bytes; split it into several requests "
                             "(or stream the records with chunked transfer encoding)")


def _to_response(answer: Answer, replayed: bool = False) -> Response:
    headers = dict(answer.headers)
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(answer.body, status_code=answer.status, media_type=answer.media_type,
                    headers=headers)


def _data_info(data: bytes | None, kind: str | None) -> dict[str, Any] | None:
    if kind is None:
        return None
    return {"size": len(data or b""), "type": kind}


class _Producing:
    """Submits the records of one request in order and turns outcomes into reports."""

    def __init__(self, state: _State, cluster_id: str, topic: str, acks: str,
                 limit: int, access: dict[str, Any] | None = None) -> None:
        self.state = state
        #: The request's access-log fields: ``records`` counts acknowledged records.
        self.access = access if access is not None else {}
        self.cluster_id = cluster_id
        self.topic = topic
        self.acks = acks
        self.limit = limit

    async def submit(self, obj: Any, label: str, path: str) -> _Pending:
        pending = _Pending(label)
        try:
            record = decode_record(obj, path)
            pending.summary = (record.size, _data_info(record.key, record.key_type),
                               _data_info(record.value, record.value_type))
            if record.size > self.limit:
                raise HttpError(413, f"{label}: {record.size} bytes of key, value and headers "
                                     f"exceed the topic's max.message.bytes={self.limit}; "
                                     "send a smaller record or raise the topic's limit",
                                not_written=True)
            producer = await self.state.producer(self.acks)
            try:
                pending.future = await producer.send(
                    self.topic, record.value, key=record.key, headers=record.headers or None,
                    partition=record.partition, timestamp_ms=record.timestamp_ms)
            except ValueError as err:
                raise HttpError(404, f"{label}: partition_id {record.partition} does not exist "
                                     f"in topic {self.topic!r} ({err})",
                                not_written=True) from None
            except StrataError as err:
                raise from_strata_error(err, topic=self.topic, record=label,
                                        sent=False) from None
        except HttpError as err:
            pending.error = err
        except Exception as err:  # never a 500 for the whole request: this record only
            log.exception("%s: producing failed", label)
            pending.error = from_strata_error(err, topic=self.topic, record=label,
                                              sent=pending.future is not None)
        return pending

    async def report(self, pending: _Pending) -> tuple[int, dict[str, Any], HttpError | None]:
        """(status, report, error) once the record is acknowledged or failed."""
        error = pending.error
        if error is None:
            assert pending.future is not None and pending.summary is not None
            try:
                meta = await asyncio.shield(pending.future)
            except StrataError as err:
                error = from_strata_error(err, topic=self.topic, record=pending.label)
            except Exception as err:
                log.exception("%s: unexpected delivery failure", pending.label)
                error = from_strata_error(err, record=pending.label)
            else:
                size, key_info, value_info = pending.summary
                metrics = self.state.metrics
                metrics.records.labels(self.topic).inc()
                metrics.bytes.labels(self.topic).inc(size)
                self.access["records"] = self.access.get("records", 0) + 1
                return 200, {
                    "error_code": 200, "cluster_id": self.cluster_id, "topic_name": self.topic,
                    "partition_id": meta.partition, "offset": meta.offset,
                    "timestamp": iso_timestamp(meta.timestamp) if meta.timestamp >= 0 else None,
                    "key": key_info, "value": value_info,
                }, None
        self.state.metrics.errors.labels(str(error.error_code)).inc()
        if error.status >= 500:
            log.warning("%s on topic %s not written or unconfirmed: %s", pending.label,
                        self.topic, error.message)
        return error.status, error.body(), error


# ---------------------------------------------------------------------------- app
# ---------------------------------------------------------------------------- OpenAPI
#: The Confluent v3 error body every error status answers with.
_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error_code", "message"],
    "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}},
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the error statuses a route can answer (docs/gateway.md)."""
    return {status: {"description": _STATUS_TEXT[status],
                     "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
            for status in statuses}


_STATUS_TEXT = {
    400: "bad request", 401: "no or wrong credentials", 403: "the key may not do this",
    404: "unknown cluster id, topic or partition", 409: "the topic already exists",
    413: "request or record too large", 415: "unsupported Content-Type",
    416: "offset outside the partition's log", 422: "invalid field (named in message)",
    429: "rate limited (see Retry-After)", 503: "brokers unavailable; retry (Retry-After)",
}
#: Errors any /v3 route can answer.
_V3_ERRORS = (400, 401, 403, 404, 422, 429, 503)

def create_app(config: GatewayConfig) -> FastAPI:
    """The gateway's ASGI app (serve it with uvicorn; see ``run``)."""
    auth = _load_auth(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = _State(config, auth)
        app.state.gateway = state
        log.info("gateway ready for brokers %s (auth %s)", config.bootstrap,
                 "on" if auth is not None else "off")
        try:
            yield
        finally:
            log.info("gateway shutting down: flushing in-flight records")
            await state.close()
            if auth is not None:
                auth.executor.shutdown(wait=False)

    app = FastAPI(title="Strata ingest gateway", version="1",
                  description="Confluent REST Proxy v3 compatible produce API over Strata "
                              "brokers.", lifespan=lifespan)
    _install_handlers(app)
    _install_routes(app, config)
    app.add_middleware(_MetricsMiddleware)
    app.add_middleware(AccessLogMiddleware)  # outermost of the app's own middleware
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory for worker processes: the config comes from ``STRATA_GATEWAY_CONFIG``."""
    config = GatewayConfig.from_env()
    configure_access_log(config.access_log)
    return create_app(config)


def _install_handlers(app: FastAPI) -> None:
    def error_response(err: HttpError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HttpError)
    async def http_error(request: Request, err: HttpError) -> JSONResponse:
        _state(request).metrics.errors.labels(str(err.error_code)).inc()
        return error_response(err)

    @app.exception_handler(GatewayHttpError)
    async def auth_error(request: Request, err: GatewayHttpError) -> JSONResponse:
        _state(request).metrics.errors.labels(str(err.error_code)).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = []
        for item in err.errors():
            where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("query", "path"))
            problems.append(f"{where}: {item.get('msg')}")
        return error_response(HttpError(422, "; ".join(problems) or "invalid request"))

    @app.exception_handler(StarletteHTTPException)
    async def starlette_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = str(err.detail)
        if err.status_code == 404:
            message = f"no such endpoint {request.url.path}; see /docs"
        elif err.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; see /docs"
        return JSONResponse({"error_code": err.status_code, "message": message},
                            status_code=err.status_code, headers=err.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(HttpError(500, f"internal error ({type(err).__name__}); "
                                             "see the gateway log"))



def _topic_json(cluster_id: str, description: TopicDescription) -> dict[str, Any]:
    partitions = description.partitions
    return {
        "kind": "KafkaTopic", "cluster_id": cluster_id, "topic_name": description.name,
        "is_internal": description.name.startswith("__"),
        "partitions_count": len(partitions),
        "replication_factor": len(partitions[0].replicas) if partitions else 0,
    }


async def _describe(state: _State, topic: str) -> TopicDescription:
    try:
        return (await state.admin.describe_topics([topic]))[topic]
    except StrataError as err:
        raise from_strata_error(err, topic=topic, sent=False) from err


def _install_routes(app: FastAPI, config: GatewayConfig) -> None:
    consume, admin = _guard(Action.CONSUME), _guard(Action.ADMIN)
    base = "/v3/clusters/{cluster_id}"

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: a broker answered and the cluster metadata is loaded."""
        state = _state(request)
        try:
            description = await asyncio.wait_for(state.admin.describe_cluster(), 5.0)
        except (StrataError, TimeoutError) as err:
            raise unavailable(f"brokers unreachable ({err}); check --bootstrap and "
                              "`strata status`") from err
        if not description.brokers or state.closing:
            raise unavailable("no live brokers in the cluster metadata" if not state.closing
                              else "the gateway is shutting down")
        return JSONResponse({"status": "ready", "cluster_id": description.cluster_id,
                             "brokers": sorted(description.brokers)})

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics(request: Request) -> Response:
        """Prometheus metrics of this process."""
        return Response(_state(request).metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v3/clusters", tags=["clusters"], dependencies=[Depends(admin)],
             responses=_errors(*_V3_ERRORS))
    async def list_clusters(request: Request) -> dict[str, Any]:
        state = _state(request)
        try:
            description = await state.admin.describe_cluster()
        except StrataError as err:
            raise from_strata_error(err, sent=False) from err
        cid = description.cluster_id or "strata"
        return {"kind": "KafkaClusterList", "data": [{
            "kind": "KafkaCluster", "cluster_id": cid,
            "controller": ({"broker_id": description.controller_id}
                           if description.controller_id >= 0 else None),
            "brokers": [{"broker_id": b, "host": h, "port": p}
                        for b, (h, p) in sorted(description.brokers.items())],
        }]}

    @app.get(base + "/topics", tags=["topics"], dependencies=[Depends(admin)],
             responses=_errors(*_V3_ERRORS))
    async def list_topics(request: Request, cluster_id: str) -> dict[str, Any]:
        state = _state(request)
        cid = await state.check_cluster(cluster_id)
        try:
            described = await state.admin.describe_topics(None)
        except StrataError as err:
            raise from_strata_error(err, sent=False) from err
        return {"kind": "KafkaTopicList",
                "data": [_topic_json(cid, d) for d in described.values()]}

    @app.post(base + "/topics", tags=["topics"], status_code=201,
              dependencies=[Depends(admin)], responses=_errors(*_V3_ERRORS, 409, 413, 415))
    async def create_topic(request: Request, cluster_id: str) -> JSONResponse:
        """Body: ``{topic_name, partitions_count?, replication_factor?,
        configs?: [{name, value}]}``."""
        state = _state(request)
        _check_json(request)
        cid = await state.check_cluster(cluster_id)
        body = _parse_json(await _read_body(request, state.config.max_request_bytes))
        if not isinstance(body, dict):
            raise HttpError(422, "body: expected a JSON object {topic_name, ...}")
        name = body.get("topic_name")
        if not isinstance(name, str) or not name:
            raise HttpError(422, "topic_name: required, a non-empty string")
        counts: dict[str, int] = {}
        for fld in ("partitions_count", "replication_factor"):
            value = body.get(fld, -1)
            if isinstance(value, bool) or not isinstance(value, int):
                raise HttpError(422, f"{fld}: must be an integer")
            counts[fld] = value
        configs: dict[str, str] = {}
        raw_configs = body.get("configs", [])
        if not isinstance(raw_configs, list):
            raise HttpError(422, "configs: expected a list of {name, value}")
        for i, item in enumerate(raw_configs):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise HttpError(422, f"configs[{i}].name: required, a string")
            if not isinstance(item.get("value"), str | int):
                raise HttpError(422, f"configs[{i}].value: required, a string")
            configs[item["name"]] = str(item["value"])
        try:
            await state.admin.create_topics([NewTopic(
                name, num_partitions=counts["partitions_count"],
                replication_factor=counts["replication_factor"], configs=configs)])
        except StrataError as err:
            raise from_strata_error(err, topic=name, sent=False) from err
        state.forget_topic(name)
        return JSONResponse(_topic_json(cid, await _describe(state, name)), status_code=201)

    @app.get(base + "/topics/{topic_name}", tags=["topics"], dependencies=[Depends(admin)],
             responses=_errors(*_V3_ERRORS))
    async def get_topic(request: Request, cluster_id: str, topic_name: str) -> dict[str, Any]:
        state = _state(request)
        cid = await state.check_cluster(cluster_id)
        return _topic_json(cid, await _describe(state, topic_name))

    @app.delete(base + "/topics/{topic_name}", tags=["topics"], status_code=204,
                dependencies=[Depends(admin)], responses=_errors(*_V3_ERRORS))
    async def delete_topic(request: Request, cluster_id: str, topic_name: str) -> Response:
        state = _state(request)
        await state.check_cluster(cluster_id)
        try:
            await state.admin.delete_topics([topic_name])
        except StrataError as err:
            raise from_strata_error(err, topic=topic_name, sent=False) from err
        state.forget_topic(topic_name)
        return Response(status_code=204)

    @app.get(base + "/topics/{topic_name}/partitions", tags=["topics"],
             dependencies=[Depends(admin)], responses=_errors(*_V3_ERRORS))
    async def list_partitions(request: Request, cluster_id: str,
                              topic_name: str) -> dict[str, Any]:
        state = _state(request)
        cid = await state.check_cluster(cluster_id)
        description = await _describe(state, topic_name)
        return {"kind": "KafkaPartitionList", "data": [{
            "kind": "KafkaPartition", "cluster_id": cid, "topic_name": topic_name,
            "partition_id": p.partition,
            "leader": {"broker_id": p.leader} if p.leader >= 0 else None,
            "leader_epoch": p.leader_epoch, "replicas": list(p.replicas), "isr": list(p.isr),
            "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
            "high_watermark": p.high_watermark,
        } for p in description.partitions]}

    @app.post(base + "/topics/{topic_name}/records", tags=["records"],
              responses=_errors(*_V3_ERRORS, 413, 415))
    async def produce_records(
        request: Request, cluster_id: str, topic_name: str,
        principal: _ProducePrincipal,
        acks: str = Query("all", description="all (-1), 1 or 0", pattern=_ACKS_PATTERN),
    ) -> Response:
        """Produce one record (a JSON object), or several concatenated in one (chunked)
        body: streaming mode, answered with one delivery report per line, in order."""
        state = _state(request)
        _check_json(request)
        acks = _acks(acks)
        cid = await state.check_cluster(cluster_id)
        limit = await state.max_message_bytes(topic_name)
        producing = _Producing(state, cid, topic_name, acks, limit, access_info(request.scope))
        key = request.headers.get("idempotency-key")
        if key:
            body = await _read_body(request, state.config.max_request_bytes)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as err:
                raise HttpError(422, f"body: not valid UTF-8 ({err})") from None
            values, error = _parse_concatenated(text)

            async def compute() -> Answer:
                many = len(values) > 1 or error is not None
                items = [await producing.submit(v, f"records[{i}]" if many else "record",
                                                f"records[{i}]" if many else "")
                         for i, v in enumerate(values)]
                if error is not None:
                    items.append(_Pending(f"records[{len(items)}]", error=error))
                return await _produce_answer(producing, items)

            answer, replayed = await state.idempotency.run(
                _scope(principal, request, key), _fingerprint(acks, body), compute)
            return _to_response(answer, replayed)
        # The first record waits for the second (or the end of the body): only then is it
        # known whether this is one record (fields named "value.data") or a stream
        # ("records[0].value.data").
        _check_length(request, state.config.max_request_bytes)
        items: list[_Pending] = []
        held: list[Any] = []
        async for value in _stream_objects(request, state.config.max_request_bytes):
            if held:
                items.append(await producing.submit(held.pop(), "records[0]", "records[0]"))
            label = f"records[{len(items)}]"
            if isinstance(value, HttpError):
                items.append(_Pending(label, error=value))
                break
            if not items:
                held.append(value)
            else:
                items.append(await producing.submit(value, label, label))
        if held:
            items.append(await producing.submit(held.pop(), "record", ""))
        if len(items) <= 1:
            return _to_response(await _produce_answer(producing, items))

        async def reports() -> AsyncIterator[bytes]:
            for item in items:
                _, report, _ = await producing.report(item)
                yield json.dumps(report).encode() + b"\n"

        return StreamingResponse(reports(), media_type="application/x-ndjson")

    @app.post(base + "/topics/{topic_name}/records:batch", tags=["records"],
              responses={207: {"description": "one answer per entry"},
                         **_errors(*_V3_ERRORS, 413, 415)})
    async def produce_batch(
        request: Request, cluster_id: str, topic_name: str,
        principal: _ProducePrincipal,
        acks: str = Query("all", description="all (-1), 1 or 0", pattern=_ACKS_PATTERN),
    ) -> Response:
        """Body ``{"entries": [{"id", ...record}]}``; answer 207
        ``{"successes": [...], "failures": [...]}``, one per entry, with its ``id``."""
        state = _state(request)
        _check_json(request)
        acks = _acks(acks)
        cid = await state.check_cluster(cluster_id)
        limit = await state.max_message_bytes(topic_name)
        body = await _read_body(request, state.config.max_request_bytes)
        parsed = _parse_json(body)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("entries"), list):
            raise HttpError(422, "entries: required, a list of records")
        entries: list[Any] = parsed["entries"]
        extra = sorted(set(parsed) - {"entries"})
        if extra:
            raise HttpError(422, f"{extra[0]}: unknown field; expected only entries")
        producing = _Producing(state, cid, topic_name, acks, limit, access_info(request.scope))

        async def compute() -> Answer:
            items = []
            for i, entry in enumerate(entries):
                item = await producing.submit(entry, f"entries[{i}]", f"entries[{i}]")
                item.extra["id"] = (str(entry.get("id", i)) if isinstance(entry, dict)
                                    else str(i))
                items.append(item)
            successes: list[dict[str, Any]] = []
            failures: list[dict[str, Any]] = []
            all_not_written = True
            for item in items:
                status, report, error = await producing.report(item)
                report = {"id": item.extra["id"], **report}
                (successes if status == 200 else failures).append(report)
                all_not_written &= error is not None and error.not_written
            return Answer(207, json.dumps({"successes": successes,
                                           "failures": failures}).encode(),
                          not_written=all_not_written and bool(items))

        key = request.headers.get("idempotency-key")
        if key:
            answer, replayed = await state.idempotency.run(
                _scope(principal, request, key), _fingerprint(acks, body), compute)
            return _to_response(answer, replayed)
        return _to_response(await compute())

    @app.get(base + "/topics/{topic_name}/partitions/{partition_id}/records", tags=["read"],
             dependencies=[Depends(consume)], responses=_errors(*_V3_ERRORS, 416))
    async def read_records(
        request: Request, cluster_id: str, topic_name: str, partition_id: int,
        offset: int | None = Query(None, ge=0, description="first offset (default: log start)"),
        max_records: int = Query(100, ge=1, le=config.max_read_records),
        timeout_ms: int = Query(1000, ge=0, le=30000),
    ) -> dict[str, Any]:
        """Committed records of one partition from ``offset`` on (debugging, light use)."""
        state = _state(request)
        cid = await state.check_cluster(cluster_id)
        if max_records > state.config.max_read_records:
            raise HttpError(422, f"max_records: at most {state.config.max_read_records}")
        description = await _describe(state, topic_name)
        partitions = {p.partition: p for p in description.partitions}
        if partition_id not in partitions:
            raise HttpError(404, f"partition_id {partition_id} does not exist in topic "
                                 f"{topic_name!r} (partitions 0..{len(partitions) - 1})")
        tp = TopicPartition(topic_name, partition_id)
        consumer = AsyncConsumer(state.config.bootstrap, client_id="strata-gateway-read",
                                 auto_offset_reset="none")
        out: list[dict[str, Any]] = []
        try:
            consumer.assign([tp])
            if offset is None:
                await consumer.seek_to_beginning([tp])
            else:
                consumer.seek(tp, offset)
            position = await consumer.position(tp)
            deadline = time.monotonic() + timeout_ms / 1000
            while len(out) < max_records:
                high = consumer.highwater(tp)
                if high is not None and position >= high:
                    break
                remaining = int(max(0.0, deadline - time.monotonic()) * 1000)
                records = await consumer.poll(timeout_ms=remaining,
                                              max_records=max_records - len(out))
                if not records:
                    break
                for r in records:
                    out.append(_record_json(r))
                    position = r.offset + 1
        except OffsetOutOfRangeError as err:
            raise HttpError(416, f"offset: {err.message}") from err
        except StrataError as err:
            raise from_strata_error(err, topic=topic_name, sent=False) from err
        finally:
            await consumer.close()
        return {"kind": "KafkaRecordList", "cluster_id": cid, "topic_name": topic_name,
                "partition_id": partition_id, "next_offset": position, "data": out}

    @app.get(base + "/topics/{topic_name}/tail", tags=["read"],
             dependencies=[Depends(consume)], responses=_errors(*_V3_ERRORS))
    async def tail(
        request: Request, cluster_id: str, topic_name: str,
        start: str = Query("end", alias="from", pattern="^(end|beginning)$"),
    ) -> StreamingResponse:
        """Server-Sent Events: an ``event: ready`` once positioned, then one
        ``event: record`` per committed record of every partition as it arrives."""
        state = _state(request)
        await state.check_cluster(cluster_id)
        description = await _describe(state, topic_name)
        tps = [TopicPartition(topic_name, p.partition) for p in description.partitions]

        async def events() -> AsyncIterator[bytes]:
            consumer = AsyncConsumer(state.config.bootstrap, client_id="strata-gateway-tail")
            try:
                consumer.assign(tps)
                if start == "end":
                    positions = await consumer.seek_to_end(tps)
                else:
                    positions = await consumer.seek_to_beginning(tps)
                ready = {str(tp.partition): off for tp, off in positions.items()}
                yield _sse("ready", {"topic_name": topic_name, "positions": ready})
                quiet_since = time.monotonic()
                while not state.closing:
                    records = await consumer.poll(timeout_ms=1000)
                    for r in records:
                        yield _sse("record", _record_json(r))
                    if records:
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since > _SSE_KEEPALIVE_S:
                        quiet_since = time.monotonic()
                        yield b": keepalive\n\n"
            except StrataError as err:
                yield _sse("error", from_strata_error(err, topic=topic_name).body())
            finally:
                await consumer.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})


async def _produce_answer(producing: _Producing, items: list[_Pending]) -> Answer:
    """One item: its report with its own status; several: NDJSON reports, 200."""
    if not items:
        return Answer(422, json.dumps(HttpError(422, "body: expected a JSON record "
                                                     "{key?, value?, ...}").body()).encode(),
                      not_written=True)
    if len(items) == 1:
        status, report, error = await producing.report(items[0])
        return Answer(status, json.dumps(report).encode(),
                      headers=error.headers if error is not None else {},
                      not_written=error is not None and error.not_written)
    lines = []
    all_not_written = True
    for item in items:
        _, report, error = await producing.report(item)
        lines.append(json.dumps(report).encode() + b"\n")
        all_not_written &= error is not None and error.not_written
    return Answer(200, b"".join(lines), media_type="application/x-ndjson",
                  not_written=all_not_written)


def _scope(principal: Any, request: Request, key: str) -> str:
    return f"{_principal_name(principal)}\x00{request.url.path}\x00{key}"


def _fingerprint(acks: str, body: bytes) -> str:
    return hashlib.sha256(acks.encode() + b"\x00" + body).hexdigest()


def _record_json(r: Any) -> dict[str, Any]:
    return {
        "partition_id": r.partition, "offset": r.offset,
        "timestamp": iso_timestamp(r.timestamp), "timestamp_ms": r.timestamp,
        "key": encode_data(r.key), "value": encode_data(r.value),
        "headers": [{"name": k, "value": None if v is None else encode_data(v)["data"]}  # type: ignore[index]
                    for k, v in r.headers],
    }


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


# ---------------------------------------------------------------------------- run
def check_tls(cert: str, key: str) -> None:
    """Raise ``GatewayConfigError`` unless ``cert`` and ``key`` are a readable PEM
    certificate and its private key (so a bad file fails before the server starts)."""
    for what, path in (("certificate", cert), ("private key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            raise GatewayConfigError(
                f"TLS {what} {path} cannot be read ({err.strerror or err}); pass an existing, "
                "readable PEM file") from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as err:
        raise GatewayConfigError(
            f"TLS certificate {cert} and key {key} do not load ({err}); both must be PEM and "
            "the key must belong to the certificate (an encrypted key is not supported)"
        ) from None


def run(config: GatewayConfig, *, log_level: str = "info") -> None:
    """Serve the gateway with uvicorn until SIGINT/SIGTERM (in-flight produces drain)."""
    common: dict[str, Any] = {
        "host": config.host, "port": config.port, "log_level": log_level,
        "timeout_graceful_shutdown": math.ceil(config.shutdown_grace_s), "access_log": False,
    }
    if config.tls_cert is not None and config.tls_key is not None:
        check_tls(config.tls_cert, config.tls_key)
        common.update(ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key)
    configure_access_log(config.access_log)
    if config.workers == 1:
        uvicorn.run(create_app(config), **common)
        return
    _load_auth(config)  # fail here, once, rather than in every worker
    with tempfile.TemporaryDirectory(prefix="strata-gateway-") as private:
        if config.idempotency_db is None:
            # Every worker must see every Idempotency-Key: one SQLite file for all of them.
            config = dataclasses.replace(
                config, idempotency_db=os.path.join(private, "idempotency.sqlite3"))
        os.environ[CONFIG_ENV] = config.to_json()
        uvicorn.run("ingest_gateway._app:app_from_env", factory=True,
                    workers=config.workers, **common)
