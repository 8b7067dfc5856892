"""The broker's TCP front: frames in, frames out; nothing about what requests mean.

Per connection: read a 4-byte size, check it against ``socket.request.max.bytes`` and
the smallest possible header *before* reading the frame (a bad size closes that
connection only), read the frame, decode the request header, and hand the rest to the
dispatcher as its own task, so several requests can be in flight on one connection
(a long-polling fetch does not block a produce behind it). On a Kafka listener the
answers still go out in the requests' order, as Kafka's clients require. Responses are written under
a per-connection lock, whole frame by whole frame; record data goes out with
``loop.sendfile`` (``os.sendfile`` underneath) straight from the segment files, except
regions of at most ``_INLINE_REGION_BYTES``, which are read with one ``os.pread`` and
written with the rest of the frame (a sendfile round on the loop costs more than the
copy: followers of ten thousand partitions fetch one small batch from each).

A frame whose header cannot be decoded closes the connection (there is no correlation
id to answer to). An unknown API or version, or a body that does not decode, gets a
response whose header carries the error code, then the connection goes on.

Security (brokers/security.py): each connection carries a ``Session`` the dispatcher
sees. On TLS listeners record data cannot go through ``sendfile`` (the kernel would send
it unencrypted), so it is read with ``os.pread`` and written through the TLS transport in
``_TLS_COPY_BYTES`` pieces. Until the session has authenticated, a frame may be at most
``UNAUTHENTICATED_FRAME_BYTES`` and the connection is closed if no login succeeds within
the login timeout; a session the dispatcher marks ``close_after_answer`` (a failed
login, a request out of SASL order) is closed once that answer is written, and an
authenticated session with an expiry is closed when it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Any, Protocol, cast

from brokers.security import UNAUTHENTICATED_FRAME_BYTES, Session
from wire.errors import (
    BrokerNotAvailableError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    InvalidRequestError,
    StrataError,
    TopicAuthorizationFailedError,
    UnsupportedVersionError,
)
from wire.protocol import (
    FRAME_PREFIX,
    ApiKey,
    ErrorResponse,
    Message,
    Reader,
    RequestHeader,
    SendableRegion,
    encode_response,
    read_request_header,
)
from wire.protocol.codec import Chunk
from wire.protocol.framing import MIN_REQUEST_FRAME

__all__ = ["ConnectionHandler", "Dispatcher", "FrameCodec", "StrataCodec"]

log = logging.getLogger("strata.brokers.network")

_API_NAMES = {int(k): k.name for k in ApiKey}
MAX_IN_FLIGHT = 32  # requests being handled per connection

# dispatcher(header, body reader, session) -> response message, or None (acks=0)
Dispatcher = Callable[[RequestHeader, Reader, Session], Awaitable[Message | None]]


class FrameCodec(Protocol):
    """What a listener's protocol adds to the framing: how a request header reads and how
    an answer is encoded. Strata's own (``StrataCodec``) and Kafka's
    (``brokers.kafka.KafkaCodec``) share every other part of a connection."""

    def read_header(self, frame: bytes) -> tuple[Any, Any]:
        """(header, body) of one frame; raises ``StrataError`` if it cannot be read."""
        ...

    def api_name(self, header: Any) -> str: ...

    #: True: answers go out in the order the requests came (Kafka's rule); False: as
    #: each is ready (Strata's clients match them by correlation id).
    ordered: bool

    async def answer(self, header: Any, body: Any,
                     session: Session) -> Sequence[Chunk] | None:
        """The encoded answer (None: none is sent, as for acks=0); raises the
        request-level errors ``answer_error`` encodes."""
        ...

    def answer_error(self, header: Any, err: StrataError | None) -> Sequence[Chunk] | None:
        """The answer to a request that failed as a whole (``err`` None: a broker
        fault); None: the protocol has no such answer and the connection is closed."""
        ...


class StrataCodec:
    """Strata's own protocol: ``wire.protocol`` headers and messages."""

    ordered = False

    def __init__(self, dispatch: Dispatcher) -> None:
        self.dispatch = dispatch

    def read_header(self, frame: bytes) -> tuple[RequestHeader, Reader]:
        return read_request_header(frame)

    def api_name(self, header: RequestHeader) -> str:
        return _API_NAMES.get(header.api_key, "UNKNOWN")

    async def answer(self, header: RequestHeader, body: Reader,
                     session: Session) -> list[Chunk] | None:
        response = await self.dispatch(header, body, session)
        if response is None:
            return None
        return encode_response(header.correlation_id, response, header.api_version)

    def answer_error(self, header: RequestHeader, err: StrataError | None) -> list[Chunk]:
        if err is None:
            return encode_response(header.correlation_id,
                                   ErrorResponse("internal error (see the broker's log)"), 0,
                                   error_code=-1)
        return encode_response(header.correlation_id, ErrorResponse(err.message), 0,
                               error_code=err.code)
#: Errors a handler may raise for the whole request: answered with the code in the
#: response header (the client raises the matching error), the connection goes on.
_REQUEST_LEVEL = (UnsupportedVersionError, InvalidRequestError, IllegalSaslStateError,
                  ClusterAuthorizationFailedError, TopicAuthorizationFailedError,
                  GroupAuthorizationFailedError, BrokerNotAvailableError)
#: Piece size of the copying path for record data (TLS connections, small regions).
_TLS_COPY_BYTES = 256 * 1024
#: Record regions up to this size are copied into the response instead of sendfile'd.
_INLINE_REGION_BYTES = 64 * 1024


class _RegionFile:
    """The minimal file object ``loop.sendfile`` needs, over a ``SendableRegion``."""

    mode = "rb"

    def __init__(self, region: SendableRegion) -> None:
        self._region = region

    def fileno(self) -> int:
        return self._region.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return offset  # segment files are only read with pread/sendfile: no shared cursor


class ConnectionHandler:
    """Serves one client connection; see the module docstring."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 codec: FrameCodec, max_frame_bytes: int, metrics: Any,
                 on_close: Callable[[ConnectionHandler], None], *, session: Session,
                 login_timeout_s: float = 10.0) -> None:
        self.reader = reader
        self.writer = writer
        self.session = session
        self._tls = writer.get_extra_info("ssl_object") is not None
        self._login_timeout_s = login_timeout_s
        self.codec = codec
        # Kafka's clients match answers to requests by order (the Java client checks
        # each correlation id against the oldest request in flight); Strata's by id.
        self._ordered = bool(getattr(codec, "ordered", False))
        self._last_turn: asyncio.Future[None] | None = None
        self.max_frame_bytes = max_frame_bytes
        self.metrics = metrics
        self.on_close = on_close
        self.peer = writer.get_extra_info("peername")
        self._write_lock = asyncio.Lock()
        self.in_flight: set[asyncio.Task[None]] = set()
        # Back-pressure: at most MAX_IN_FLIGHT requests per connection are being
        # handled; the next frame is not read until one finishes, so one client cannot
        # pin unbounded memory (each frame can be up to socket.request.max.bytes).
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.closing = False

    async def serve(self) -> None:
        self.metrics.connections.inc()
        watchdog = asyncio.create_task(self._watch_session())
        try:
            while not self.closing:
                await self._slots.acquire()
                if self.closing:
                    return
                muted = self.session.mute_until - time.monotonic()
                if muted > 0:  # a quota was exceeded: this connection waits it out
                    await asyncio.sleep(muted)
                try:
                    prefix = await self.reader.readexactly(FRAME_PREFIX.size)
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    return
                (size,) = FRAME_PREFIX.unpack(prefix)
                limit = self.max_frame_bytes if self.session.authenticated else \
                    min(self.max_frame_bytes, UNAUTHENTICATED_FRAME_BYTES)
                if not MIN_REQUEST_FRAME <= size <= limit:
                    log.warning("closing %s: frame size %d outside %d..%d%s", self.peer, size,
                                MIN_REQUEST_FRAME, limit, "" if self.session.authenticated
                                else " (not logged in yet)")
                    return
                try:
                    frame = await self.reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    return
                self.metrics.bytes_in.inc(size + FRAME_PREFIX.size)
                try:
                    header, body = self.codec.read_header(frame)
                except StrataError as err:
                    log.warning("closing %s: undecodable request header: %s", self.peer, err)
                    return
                previous, turn = None, None
                if self._ordered:
                    previous = self._last_turn
                    turn = asyncio.get_running_loop().create_future()
                    self._last_turn = turn
                task = asyncio.create_task(self._handle(header, body, time.perf_counter(),
                                                        previous, turn))
                self.in_flight.add(task)
                task.add_done_callback(self._done)
        finally:
            watchdog.cancel()
            self.metrics.connections.dec()
            await self._drain_in_flight()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.on_close(self)

    async def _watch_session(self) -> None:
        """Close a connection that does not log in in time, or whose session expires."""
        session = self.session
        deadline = session.opened_at + self._login_timeout_s
        while not session.authenticated:
            if time.monotonic() >= deadline:
                log.info("closing %s: no SASL login within %.1f s", self.peer,
                         self._login_timeout_s)
                self.close()
                return
            await asyncio.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
        while session.expires_at:
            remaining = session.expires_at - time.monotonic()
            if remaining <= 0:
                log.info("closing %s's connection from %s: its session expired "
                         "(connections.max.reauth.ms)", session.principal, self.peer)
                self.close()
                return
            await asyncio.sleep(remaining)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._slots.release()

    async def _drain_in_flight(self) -> None:
        if self.in_flight:
            await asyncio.gather(*self.in_flight, return_exceptions=True)

    async def _handle(self, header: Any, body: Any, started: float,
                      previous: asyncio.Future[None] | None = None,
                      turn: asyncio.Future[None] | None = None) -> None:
        """Answer one request. ``previous``/``turn`` (protocols whose answers must
        follow the requests' order, ``FrameCodec.ordered``): this answer is written once
        ``previous`` is done, and ``turn`` is done once this one is written or known to
        have none; the requests themselves still run side by side."""
        try:
            await self._answer(header, body, started, previous)
        finally:
            if turn is not None and not turn.done():
                turn.set_result(None)

    async def _answer(self, header: Any, body: Any, started: float,
                      previous: asyncio.Future[None] | None) -> None:
        api = self.codec.api_name(header)
        error_name = "NONE"
        chunks: Sequence[Chunk] | None
        why = ""
        try:
            chunks = await self.codec.answer(header, body, self.session)
            if chunks is None:  # acks=0: no answer, but still counted
                if previous is not None:
                    await previous
                self.metrics.requests.labels(api, error_name).inc()
                self.metrics.latency.labels(api).observe(time.perf_counter() - started)
                return
        except _REQUEST_LEVEL as err:
            error_name, why = err.name, err.message
            chunks = self.codec.answer_error(header, err)
        except Exception:  # a handler bug must not take the broker down
            log.exception("request %s from %s failed", header, self.peer)
            error_name = "UNKNOWN_SERVER_ERROR"
            chunks = self.codec.answer_error(header, None)
        if previous is not None:
            await previous
        if chunks is None:  # the protocol cannot say it: the connection is cut
            log.info("closing %s: %s failed with %s (%s) and its protocol has no answer for "
                     "that", self.peer, api, error_name, why or "see above")
            self.metrics.requests.labels(api, error_name).inc()
            self.closing = True
            self.writer.transport.abort()
            return
        try:
            await self._write(chunks)
        except Exception as err:
            # Part of a frame may be on the wire: the stream can no longer be parsed by
            # the client, so the connection is cut rather than left desynchronised.
            log.info("could not answer %s (%r); closing the connection", self.peer, err)
            self.closing = True
            self.writer.transport.abort()
        finally:
            self.metrics.requests.labels(api, error_name).inc()
            self.metrics.latency.labels(api).observe(time.perf_counter() - started)
            if self.session.close_after_answer:
                self.close()

    async def _write(self, chunks: Sequence[Chunk]) -> None:
        loop = asyncio.get_running_loop()
        async with self._write_lock:
            total = 0
            for chunk in chunks:
                if isinstance(chunk, bytes | bytearray | memoryview):  # not a Protocol check
                    self.writer.write(chunk)
                    total += len(chunk)
                elif self._tls or chunk.length <= _INLINE_REGION_BYTES:
                    # TLS cannot sendfile; a small region is copied because one pread is
                    # cheaper than a sendfile round on the loop (a fetch of ten thousand
                    # partitions holding one batch each spent a sixth of the broker's CPU
                    # in sendfile calls).
                    await self._copy_region(chunk)
                    total += chunk.length
                else:
                    await self.writer.drain()
                    # _RegionFile is duck-typed: sendfile only calls fileno() and seek().
                    region_file = cast(IO[bytes], _RegionFile(chunk))
                    sent = await loop.sendfile(self.writer.transport, region_file,
                                               chunk.position, chunk.length, fallback=False)
                    if sent != chunk.length:  # the file shrank under us (truncation)
                        raise OSError(f"sent {sent} of {chunk.length} bytes of {chunk}")
                    total += chunk.length
            await self.writer.drain()
            self.metrics.bytes_out.inc(total)

    async def _copy_region(self, region: SendableRegion) -> None:
        """Record data read and written in pieces of ``_TLS_COPY_BYTES`` (TLS, where
        ``sendfile`` cannot encrypt, and small regions): a drain between pieces; the
        caller drains after the whole frame."""
        position, end = region.position, region.position + region.length
        while position < end:
            piece = os.pread(region.fileno(), min(_TLS_COPY_BYTES, end - position), position)
            if not piece:  # the file shrank under us (truncation)
                raise OSError(f"read {position - region.position} of {region.length} bytes "
                              f"of {region}")
            self.writer.write(piece)
            position += len(piece)
            if position < end:
                await self.writer.drain()

    def stop_reading(self) -> None:
        """Shutdown: take no new requests; the ones in flight still get their answers."""
        self.closing = True
        transport = self.writer.transport
        if isinstance(transport, asyncio.ReadTransport):
            transport.pause_reading()
        self._slots.release()  # unblock a serve loop waiting for a slot, so it can exit

    def close(self) -> None:
        self.closing = True
        self.writer.close()
