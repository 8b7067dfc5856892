"""Structured access log: one JSON line per request on the ``ingest_gateway.access`` logger.

A pure ASGI middleware (so it sees the bytes of streamed request and response bodies)
writes, once the response is complete::

    {"time": "2026-11-22T14:02:48.123Z", "request_id": "...", "method": "POST",
     "path": "/v3/clusters/c/topics/t/records", "status": 200, "duration_ms": 3.2,
     "key_id": "ingest-service", "bytes_in": 57, "bytes_out": 231, "records": 1}

``key_id`` is the authenticated API key (``-`` when there is none: auth off, or the
request was refused before a key was verified); ``records`` the records acknowledged by
the brokers for this request. ``request_id`` is the client's ``X-Request-ID`` header when
it sends a sane one, else a fresh id; it is echoed in the response's ``X-Request-ID``.
uvicorn's own access log is off (``run`` passes ``access_log=False``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ACCESS_LOGGER", "AccessLogMiddleware", "access_info", "configure_access_log"]

ACCESS_LOGGER = "ingest_gateway.access"
#: Key of the per-request dict in the ASGI scope that routes fill in (key id, records).
SCOPE_KEY = "strata.access"
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

access_log = logging.getLogger(ACCESS_LOGGER)


def access_info(scope: Scope) -> dict[str, Any]:
    """The mutable access-log fields of this request (``key_id``, ``records``)."""
    info: dict[str, Any] = scope.setdefault(SCOPE_KEY, {"key_id": "-", "records": 0})
    return info


def configure_access_log(enabled: bool = True) -> None:
    """Send the access log, bare JSON lines, to stderr and not through the root logger
    (whose format would prefix them); ``enabled=False`` silences it."""
    access_log.propagate = False
    access_log.handlers.clear()
    if not enabled:
        access_log.disabled = True
        return
    access_log.disabled = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        info = access_info(scope)
        given = dict(scope.get("headers") or ()).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID_RE.match(given) else uuid.uuid4().hex
        counts = {"in": 0, "out": 0, "status": 500}

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                counts["in"] += len(message.get("body", b""))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                counts["status"] = message["status"]
                headers = [h for h in message.get("headers", ()) if h[0].lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                counts["out"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                now = datetime.now(UTC)
                access_log.info(json.dumps({
                    "time": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z",
                    "request_id": request_id,
                    "method": scope.get("method", ""),
                    "path": scope.get("path", ""),
                    "status": counts["status"],
                    "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                    "key_id": info.get("key_id", "-"),
                    "bytes_in": counts["in"],
                    "bytes_out": counts["out"],
                    "records": info.get("records", 0),
                }, separators=(",", ":")))
