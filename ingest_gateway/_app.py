"""The gateway application: Confluent REST Proxy v3 routes over shared producers.

``create_app`` returns a :class:`GatewayApp` (``ingest_gateway._route``): the two
produce routes are served there as plain ASGI, everything else by the FastAPI app built
here. One ``AsyncProducer`` per ``acks`` value per process, created lazily and closed
(flushed) when the app shuts down, and one ``Coalescer`` gathering the records of
concurrent requests (``linger_ms``), so the brokers see large batches: both live in the
process's ``GatewayState`` (``_state``), which the lifespan here creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ingest_gateway._access import (
    AccessLogMiddleware,
    access_info,
    configure_access_log,
    flush_access_log,
)
from ingest_gateway._auth import Action, GatewayConfigError, Principal
from ingest_gateway._codec import as_int, encode_data, iso_timestamp
from ingest_gateway._config import CONFIG_ENV, GatewayConfig
from ingest_gateway._errors import HttpError, from_strata_error, unavailable
from ingest_gateway._openapi import (
    BATCH_ANSWERS,
    BATCH_BODY,
    CREATE_TOPIC_BODY,
    RECORD_BODY,
    RECORDS_ANSWERS,
)
from ingest_gateway._openapi import errors as _errors
from ingest_gateway._plan import check_length, check_media
from ingest_gateway._registry import install_registry_routes
from ingest_gateway._route import GatewayApp, serve_produce
from ingest_gateway._server import serve_one, serve_workers
from ingest_gateway._state import GatewayState, load_gateway_auth
from strata.client import (
    AsyncConsumer,
    IdleTimer,
    NewTopic,
    TopicDescription,
    TopicPartition,
)
from wire.errors import OffsetOutOfRangeError, StrataError
from wire.schema import subject_topic

__all__ = ["app_from_env", "create_app", "run"]

log = logging.getLogger("strata.gateway")

_ACKS_PATTERN = "^(all|-1|1|0)$"
_SSE_KEEPALIVE_S = 15.0


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
                gateway.metrics.observe(method, route, status[0], time.perf_counter() - start)


_KNOWN_QUERY: dict[int, frozenset[str]] = {}


def _query_names(dependant: Any) -> set[str]:
    """Query parameters of a route, its dependencies' included."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def _only_known_query(request: Request) -> None:
    """A query parameter a route does not take is refused (422 naming it), not ignored:
    a misspelt ``max_record`` must not silently mean the default."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    allowed = _KNOWN_QUERY.get(id(route))
    if allowed is None:
        allowed = frozenset(_query_names(dependant))
        _KNOWN_QUERY[id(route)] = allowed
    for name in request.query_params:
        if name not in allowed:
            raise HttpError(422, f"query parameter {name!r} is not known here; this route "
                                 f"takes {', '.join(sorted(allowed)) or 'none'}")


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


# ---------------------------------------------------------------------------- auth
def _guard(action: Action, topic_of: Callable[[Request], str | None] | None = None
           ) -> Callable[[Request], Awaitable[Principal | None]]:
    """The one auth dependency of a route: authenticate the Authorization header,
    authorize ``action`` on the route's topic (``topic_of``, default the ``topic_name``
    path parameter; None: cluster-level), then charge the key's rate limit one request."""

    async def dependency(request: Request) -> Principal | None:
        auth = _state(request).auth
        if auth is None:
            return None
        topic = request.path_params.get("topic_name") if topic_of is None \
            else topic_of(request)
        principal = await asyncio.get_running_loop().run_in_executor(
            auth.executor, auth.authenticator.authenticate, request.headers.get("authorization"))
        access_info(request.scope)["key_id"] = principal.key_id
        auth.authenticator.authorize(principal, action, topic)
        auth.rate_limiter.check(principal, 1)
        return principal

    return dependency


# ---------------------------------------------------------------------------- helpers
async def _read_json(request: Request, limit: int) -> Any:
    """The request's JSON body (415 for another media type, 413 past ``limit``, 422 if
    it is not JSON)."""
    check_media(request.headers.get("content-type", ""))
    check_length(request.headers.get("content-length"), limit)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise HttpError(413, f"request body is larger than the gateway's limit of {limit} "
                                 "bytes; split it into several requests")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HttpError(422, f"body: not valid JSON ({err})") from None


class _ServedByProducePath(Response):
    """A FastAPI produce route's answer: the request is served by ``serve_produce``, as
    ``GatewayApp`` does before FastAPI sees it (the routes are there for the OpenAPI
    schema, and serve the same way when the app is mounted without ``GatewayApp``)."""

    def __init__(self, request: Request, batch: bool) -> None:
        super().__init__()
        self.request = request
        self.batch = batch

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        params = self.request.path_params
        await serve_produce(_state(self.request), scope, receive, send,
                            params["cluster_id"], params["topic_name"], self.batch)


# ---------------------------------------------------------------------------- OpenAPI
#: Errors any /v3 route can answer.
_V3_ERRORS = (400, 401, 403, 404, 422, 429, 503)

def _settle_garbage_collector() -> None:
    """Move everything loaded at start-up (FastAPI, pyarrow, the app) out of the
    collector's sight and collect the young generation less often: a request allocates
    dozens of short-lived objects, and full collections over the start-up heap showed
    up as tens of milliseconds in the latency tail."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)


async def _flush_often(state: GatewayState) -> None:
    """The access log's buffered lines and the metrics' pending increments."""
    while True:
        await asyncio.sleep(0.2)
        try:
            flush_access_log()
            state.metrics.flush()
        except Exception:  # keep flushing: a lost log line must not stop the next ones
            log.exception("flushing the access log or metrics failed")


def create_app(config: GatewayConfig) -> GatewayApp:
    """The gateway's ASGI app (serve it with uvicorn; see ``run``)."""
    auth = load_gateway_auth(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = GatewayState(config, auth)
        app.state.gateway = state
        flusher = asyncio.create_task(_flush_often(state))
        _settle_garbage_collector()
        log.info("gateway ready for brokers %s (auth %s)", config.bootstrap,
                 "on" if auth is not None else "off")
        try:
            yield
        finally:
            log.info("gateway shutting down: flushing in-flight records")
            await state.close()
            flusher.cancel()
            flush_access_log()
            state.metrics.flush()
            if auth is not None:
                auth.executor.shutdown(wait=False)

    app = FastAPI(title="Strata ingest gateway", version="1",
                  description="Confluent REST Proxy v3 compatible produce API over Strata "
                              "brokers.", lifespan=lifespan,
                  dependencies=[Depends(_only_known_query)])
    _install_handlers(app)
    _install_routes(app, config)
    app.add_middleware(_MetricsMiddleware)
    app.add_middleware(AccessLogMiddleware)  # outermost of the app's own middleware
    return GatewayApp(app, drain_delay_s=config.drain_delay_s)


def app_from_env() -> GatewayApp:
    """uvicorn factory for worker processes: the config comes from the file named by
    ``STRATA_GATEWAY_CONFIG_FILE``."""
    config = GatewayConfig.from_env()
    configure_access_log(config.access_log)
    return create_app(config)


def _install_handlers(app: FastAPI) -> None:
    def error_response(err: HttpError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HttpError)  # also the auth errors (401, 403, 429): subclasses
    async def http_error(request: Request, err: HttpError) -> JSONResponse:
        _state(request).metrics.error(err.error_code)
        return error_response(err)

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


async def _describe(state: GatewayState, topic: str) -> TopicDescription:
    try:
        return (await state.admin.describe_topics([topic]))[topic]
    except StrataError as err:
        raise from_strata_error(err, topic=topic, sent=False) from err


def _check_not_draining(state: GatewayState) -> None:
    if state.draining or state.closing:
        raise unavailable("the gateway is shutting down: it finishes the requests it has "
                          "and soon takes no more; send to another instance")


def _registry_guard(action: Action, by_subject: bool
                    ) -> Callable[[Request], Awaitable[Principal | None]]:
    def topic_of(request: Request) -> str | None:
        return subject_topic(request.path_params.get("subject")) if by_subject else None

    return _guard(action, topic_of)


def _install_routes(app: FastAPI, config: GatewayConfig) -> None:
    consume, admin = _guard(Action.CONSUME), _guard(Action.ADMIN)
    install_registry_routes(app, _registry_guard, _state)
    base = "/v3/clusters/{cluster_id}"

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses=_errors(503))
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: a broker answered and the cluster metadata is loaded."""
        state = _state(request)
        _check_not_draining(state)
        try:
            description = await asyncio.wait_for(state.admin.describe_cluster(), 5.0)
        except (StrataError, TimeoutError) as err:
            _check_not_draining(state)
            raise unavailable(f"brokers unreachable ({err}); check --bootstrap and "
                              "`strata status`") from err
        _check_not_draining(state)  # the drain may have begun while the brokers answered
        if not description.brokers:
            raise unavailable("no live brokers in the cluster metadata")
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
              dependencies=[Depends(admin)], responses=_errors(*_V3_ERRORS, 409, 413, 415),
              openapi_extra=CREATE_TOPIC_BODY)
    async def create_topic(request: Request, cluster_id: str) -> JSONResponse:
        """Body: ``{topic_name, partitions_count?, replication_factor?,
        configs?: [{name, value}]}``."""
        state = _state(request)
        cid = await state.check_cluster(cluster_id)
        body = await _read_json(request, state.config.max_request_bytes)
        if not isinstance(body, dict):
            raise HttpError(422, "body: expected a JSON object {topic_name, ...}")
        name = body.get("topic_name")
        if not isinstance(name, str) or not name:
            raise HttpError(422, "topic_name: required, a non-empty string")
        counts: dict[str, int] = {}
        for fld, most in (("partitions_count", 2**31 - 1), ("replication_factor", 32767)):
            value = as_int(body.get(fld, -1))
            if value is None:
                raise HttpError(422, f"{fld}: must be an integer")
            if value != -1 and not 1 <= value <= most:
                raise HttpError(422, f"{fld}: must be -1 (the broker default) or 1..{most}")
            counts[fld] = value
        configs: dict[str, str] = {}
        raw_configs = body.get("configs", [])
        if not isinstance(raw_configs, list):
            raise HttpError(422, "configs: expected a list of {name, value}")
        for i, item in enumerate(raw_configs):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise HttpError(422, f"configs[{i}].name: required, a string")
            value = item.get("value")
            number = as_int(value)
            if not isinstance(value, str) and number is None:
                raise HttpError(422, f"configs[{i}].value: required, a string or an integer")
            configs[item["name"]] = value if isinstance(value, str) else str(number)
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
              responses=RECORDS_ANSWERS, openapi_extra=RECORD_BODY)
    async def produce_records(
        request: Request, cluster_id: str, topic_name: str,
        acks: str = Query("all", description="all (-1), 1 or 0", pattern=_ACKS_PATTERN),
    ) -> Response:
        """Produce one record ``{partition_id?, headers?, key?, value?, timestamp?}``, or
        several concatenated in one (chunked) body: streaming mode, answered with one
        delivery report per line, in order."""
        return _ServedByProducePath(request, batch=False)

    @app.post(base + "/topics/{topic_name}/records:batch", tags=["records"],
              status_code=207, responses=BATCH_ANSWERS, openapi_extra=BATCH_BODY)
    async def produce_batch(
        request: Request, cluster_id: str, topic_name: str,
        acks: str = Query("all", description="all (-1), 1 or 0", pattern=_ACKS_PATTERN),
    ) -> Response:
        """Body ``{"entries": [{"id", ...record}]}``; answer 207
        ``{"successes": [...], "failures": [...]}``, one per entry, with its ``id``."""
        return _ServedByProducePath(request, batch=True)

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
                                 auto_offset_reset="none", security=state.config.security)
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
             dependencies=[Depends(consume)], response_class=StreamingResponse,
             responses={200: {"description": "Server-Sent Events (ready, record, error)",
                              "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                        **_errors(*_V3_ERRORS)})
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
            consumer = AsyncConsumer(state.config.bootstrap, client_id="strata-gateway-tail",
                                     security=state.config.security)
            try:
                consumer.assign(tps)
                if start == "end":
                    positions = await consumer.seek_to_end(tps)
                else:
                    positions = await consumer.seek_to_beginning(tps)
                ready = {str(tp.partition): off for tp, off in positions.items()}
                yield _sse("ready", {"topic_name": topic_name, "positions": ready})
                # Quiet is time inside empty polls: a slow reader blocking the yields
                # below has just been written to, so needs no keepalive.
                quiet = IdleTimer(_SSE_KEEPALIVE_S * 1000)
                while not state.closing:
                    quiet.start()
                    records = await consumer.poll(timeout_ms=1000)
                    quiet.stop(len(records))
                    for r in records:
                        yield _sse("record", _record_json(r))
                    if quiet.expired:
                        quiet.progress()
                        yield b": keepalive\n\n"
            except StrataError as err:
                yield _sse("error", from_strata_error(err, topic=topic_name).body())
            finally:
                await consumer.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})


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
        # no X-Forwarded-* rewriting (the access log has no client address) and no
        # Server header: both cost every request something and give nothing here
        "proxy_headers": False, "server_header": False,
    }
    if config.tls_cert is not None and config.tls_key is not None:
        check_tls(config.tls_cert, config.tls_key)
        common.update(ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key)
    configure_access_log(config.access_log)
    if config.workers == 1:
        serve_one(create_app(config), common)
        return
    load_gateway_auth(config)  # fail here, once, rather than in every worker
    with tempfile.TemporaryDirectory(prefix="strata-gateway-") as private:
        if config.idempotency_db is None:
            # Every worker must see every Idempotency-Key: one SQLite file for all of them.
            config = dataclasses.replace(
                config, idempotency_db=os.path.join(private, "idempotency.sqlite3"))
        os.environ[CONFIG_ENV] = config.write_private(private)
        serve_workers(app_from_env, common, config.workers,
                      drain_delay_s=config.drain_delay_s)
