"""Structured access log: one JSON line per request, on stderr.

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

Lines are buffered and written together (``flush_access_log``, which the app calls every
0.2 s and at shutdown, or when 256 lines wait): a ``logging`` call and a write per
request cost about as much CPU as producing the request's record, so the access log does
not go through ``logging``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ingest_gateway._metrics import GatewayMetrics

__all__ = ["AccessLogMiddleware", "AccessRecorder", "access_info",
           "configure_access_log", "flush_access_log", "new_request_id"]

#: Key of the per-request dict in the ASGI scope that routes fill in (key id, records).
SCOPE_KEY = "strata.access"
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_BUFFERED_LINES = 256
_ids = itertools.count(1)
_ID_PREFIX = f"{os.getpid():x}-{int(time.time() * 1000) & 0xFFFFFF:06x}-"
_encode = msgspec.json.Encoder().encode


class _Sink:
    """Where access lines go (``stream`` None: off), the lines not written yet, and the
    formatted current second."""

    def __init__(self) -> None:
        self.stream: TextIO | None = None
        self.lines: list[bytes] = []
        self.second = -1
        self.prefix = ""


_sink = _Sink()


def access_info(scope: Scope) -> dict[str, Any]:
    """The mutable access-log fields of this request (``key_id``, ``records``)."""
    info: dict[str, Any] = scope.setdefault(SCOPE_KEY, {"key_id": "-", "records": 0})
    return info


def new_request_id(given: str) -> str:
    """The client's ``X-Request-ID`` when sane, else one unique to this process's life."""
    if given and _REQUEST_ID_RE.match(given):
        return given
    return f"{_ID_PREFIX}{next(_ids):x}"


def configure_access_log(enabled: bool = True, stream: TextIO | None = None) -> None:
    """Write the access log to ``stream`` (default stderr); ``enabled=False`` silences it."""
    flush_access_log()
    _sink.stream = (stream or sys.stderr) if enabled else None


#: Largest write that a pipe takes in one piece (POSIX PIPE_BUF on Linux): several
#: workers share stderr, and a larger write could interleave with theirs mid-line.
_ATOMIC_WRITE = 4096


def flush_access_log() -> None:
    """Write the buffered lines now, in writes of whole lines of at most 4 KiB."""
    lines, _sink.lines = _sink.lines, []
    stream = _sink.stream
    if not lines or stream is None:
        return
    with contextlib.suppress(OSError, ValueError):  # a closed stderr loses the log only
        stream.flush()
        fd = stream.fileno()
        piece: list[bytes] = []
        size = 0
        for line in lines:
            if piece and size + len(line) + 1 > _ATOMIC_WRITE:
                _write_all(fd, b"\n".join(piece) + b"\n")
                piece, size = [], 0
            piece.append(line)
            size += len(line) + 1
        _write_all(fd, b"\n".join(piece) + b"\n")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _now_iso() -> str:
    now = time.time()
    second = int(now)
    if second != _sink.second:  # strftime once a second, not once a request
        _sink.second = second
        _sink.prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
    return f"{_sink.prefix}{int(now * 1000) % 1000:03d}Z"


def _write_line(request_id: str, method: str, path: str, status: int, seconds: float,
                key_id: str, bytes_in: int, bytes_out: int, records: int) -> None:
    if _sink.stream is None:
        return
    _sink.lines.append(_encode({
        "time": _now_iso(), "request_id": request_id, "method": method, "path": path,
        "status": status, "duration_ms": round(seconds * 1000, 3), "key_id": key_id,
        "bytes_in": bytes_in, "bytes_out": bytes_out, "records": records,
    }))
    if len(_sink.lines) >= _BUFFERED_LINES:
        flush_access_log()


class AccessRecorder:
    """One request answered without the middleware stack (the produce endpoints): sends
    the response with ``X-Request-ID``, counts bytes, then writes the access line and
    the request metrics in ``finish``."""

    __slots__ = ("bytes_in", "bytes_out", "key_id", "metrics", "path", "records",
                 "request_id", "route", "start", "started", "status")

    def __init__(self, metrics: GatewayMetrics, scope: Scope, request_id: str,
                 route: str) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.path: str = scope["path"]
        self.route = route
        self.request_id = new_request_id(request_id)
        self.key_id = "-"
        self.records = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.status = 500
        self.started = False

    async def start_response(self, send: Send, status: int,
                             headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.started = True
        headers.append((b"x-request-id", self.request_id.encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, send: Send, chunk: bytes, *, more: bool) -> None:
        self.bytes_out += len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def respond(self, send: Send, status: int, body: bytes,
                      headers: list[tuple[bytes, bytes]]) -> None:
        headers.append((b"content-length", str(len(body)).encode()))
        await self.start_response(send, status, headers)
        await self.body(send, body, more=False)

    def finish(self) -> None:
        seconds = time.perf_counter() - self.start
        self.metrics.observe("POST", self.route, self.status, seconds)
        _write_line(self.request_id, "POST", self.path, self.status, seconds, self.key_id,
                        self.bytes_in, self.bytes_out, self.records)


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
        request_id = new_request_id(given)
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
            _write_line(request_id, scope.get("method", ""), scope.get("path", ""),
                        counts["status"], time.perf_counter() - start,
                        info.get("key_id", "-"), counts["in"], counts["out"],
                        info.get("records", 0))
