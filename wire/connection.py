"""One TCP connection to one broker: frames requests, matches responses by correlation id.

It knows nothing of what requests mean: ``request(api, body)`` sends a frame and returns
the decoded response; several requests may be in flight at once. When the connection
breaks, every pending request fails with ``NetworkError`` and the connection is marked
closed; the cluster layer opens a new one.

Security (``wire/security.py``): on SSL and SASL_SSL the socket is wrapped in TLS; on
SASL_PLAINTEXT and SASL_SSL ``connect`` runs SaslHandshake and SaslAuthenticate (PLAIN,
or SCRAM with the broker's signature checked) before it returns, so no other request is
sent unauthenticated. A refused login raises ``SaslAuthenticationFailedError`` (not
retriable: the credentials are wrong); a broker that expires the session closes the
connection after ``session_lifetime_ms`` and the cluster layer reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from typing import Any

from wire.errors import (
    InvalidConfigError,
    NetworkError,
    StrataError,
    error_for_code,
)
from wire.protocol import (
    FRAME_PREFIX,
    RESPONSE_TYPES,
    ApiKey,
    ErrorResponse,
    Message,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    decode,
    encode_request,
    read_response_header,
)
from wire.sasl import ScramClient, plain_message
from wire.security import PLAINTEXT, ClientSecurity

__all__ = ["BrokerConnection"]

log = logging.getLogger("strata.client.connection")

#: TLS writes go to asyncio's TLS transport in pieces of this size: it encrypts each
#: write into an OpenSSL memory buffer in one go, and a multi-megabyte request would grow
#: (and copy) that buffer many times over.
_TLS_WRITE_BYTES = 64 * 1024


class BrokerConnection:
    def __init__(self, host: str, port: int, *, client_id: str = "strata-python",
                 max_frame_bytes: int = 256 * 1024 * 1024,
                 security: ClientSecurity = PLAINTEXT) -> None:
        self.host = host
        self.port = port
        self.security = security
        self.client_id = client_id
        self.max_frame_bytes = max_frame_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, tuple[asyncio.Future[Message], type[Message], int]] = {}
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self._closed_error: StrataError | None = None
        # A broker's quota throttle (a response's throttle_time_ms): no request before.
        self._throttled_until = 0.0
        self._tls = security.uses_tls

    def __repr__(self) -> str:
        return f"BrokerConnection({self.host}:{self.port})"

    @property
    def is_open(self) -> bool:
        return self._writer is not None and self._closed_error is None

    async def connect(self, timeout: float = 10.0) -> None:
        try:
            context = self.security.ssl_context()
        except (OSError, ssl.SSLError) as err:
            raise InvalidConfigError(
                f"cannot load the TLS files (ssl_cafile / ssl_certfile / ssl_keyfile): "
                f"{err}; check the paths and that they are PEM files") from None
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host, self.port, limit=1 << 20, ssl=context,
                    server_hostname=self.host if context is not None else None), timeout)
        except ssl.SSLCertVerificationError as err:
            raise NetworkError(
                f"TLS to broker {self.host}:{self.port} failed: {err.verify_message}; give "
                "the CA that signed the broker's certificate (ssl_cafile) or connect by a "
                "name the certificate lists") from err
        except (OSError, TimeoutError) as err:
            raise NetworkError(
                f"cannot connect to broker {self.host}:{self.port} ({err}); check that it "
                "runs (strata status), the address is right and the listener's security "
                f"protocol is {self.security.protocol}") from err
        self._read_task = asyncio.create_task(self._read_loop())
        if self.security.uses_sasl:
            try:
                await asyncio.wait_for(self._authenticate(), timeout)
            except BaseException:
                await self.close()
                raise

    async def _authenticate(self) -> None:
        mechanism = self.security.sasl_mechanism
        shake = await self.request(ApiKey.SASL_HANDSHAKE, SaslHandshakeRequest(mechanism))
        assert isinstance(shake, SaslHandshakeResponse)
        if shake.error_code:
            raise error_for_code(shake.error_code)(
                shake.error_message or f"{self} does not offer SASL {mechanism}; it offers "
                f"{', '.join(shake.mechanisms) or 'none'}")
        user, password = self.security.username, self.security.password
        if mechanism == "PLAIN":
            await self._sasl_step(plain_message(user, password))
            return
        scram = ScramClient(mechanism, user, password)
        server_first = await self._sasl_step(scram.first())
        scram.verify(await self._sasl_step(scram.final(server_first)))

    async def _sasl_step(self, message: bytes) -> bytes:
        answer = await self.request(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(message))
        assert isinstance(answer, SaslAuthenticateResponse)
        if answer.error_code:
            raise error_for_code(answer.error_code)(
                answer.error_message or "SASL authentication failed")
        return bytes(answer.auth_bytes)  # decoded as a view into the frame

    async def request(self, api: ApiKey, body: Message, *, version: int = 0,
                      expect_response: bool = True) -> Message:
        """Send one request; return its response (``None``-like empty message if none)."""
        if not self.is_open or self._writer is None:
            raise self._closed_error or NetworkError(f"{self} is not connected")
        wait = self._throttled_until - asyncio.get_running_loop().time()
        if wait > 0:  # honour the broker's throttle (it would not read us before anyway)
            await asyncio.sleep(wait)
        correlation_id = next(self._ids) & 0x7FFFFFFF
        frame = encode_request(RequestHeader(int(api), version, correlation_id, self.client_id),
                               body)
        future: asyncio.Future[Message] | None = None
        if expect_response:
            future = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = (future, RESPONSE_TYPES[api], version)
        try:
            if self._tls and len(frame) > _TLS_WRITE_BYTES:
                view = memoryview(frame)
                for start in range(0, len(frame), _TLS_WRITE_BYTES):
                    self._writer.write(view[start:start + _TLS_WRITE_BYTES])
            else:
                self._writer.write(frame)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as err:
            self._fail(NetworkError(f"lost connection to {self.host}:{self.port}: {err}"))
        if future is None:
            return ErrorResponse(None)
        return await future

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while True:
                prefix = await self._reader.readexactly(FRAME_PREFIX.size)
                (size,) = FRAME_PREFIX.unpack(prefix)
                if not 0 < size <= self.max_frame_bytes:
                    raise NetworkError(f"response frame size {size} from {self} is not valid")
                frame = await self._reader.readexactly(size)
                header, reader = read_response_header(frame)
                pending = self._pending.pop(header.correlation_id, None)
                if pending is None:
                    log.warning("%s: response for unknown correlation id %d", self,
                                header.correlation_id)
                    continue
                future, response_type, version = pending
                if future.done():
                    continue
                try:
                    if header.error_code != 0:
                        body = decode(ErrorResponse, reader)
                        cls = error_for_code(header.error_code)
                        future.set_exception(cls(body.error_message or cls.__name__))
                    else:
                        response = decode(response_type, reader, version)
                        throttle = getattr(response, "throttle_time_ms", 0)
                        if throttle > 0:
                            self._throttled_until = asyncio.get_running_loop().time() + \
                                throttle / 1000
                        future.set_result(response)
                except StrataError as err:
                    future.set_exception(err)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as err:
            self._fail(NetworkError(f"connection to {self.host}:{self.port} closed: {err!r}"))
        except StrataError as err:
            self._fail(err)
        except asyncio.CancelledError:
            self._fail(NetworkError(f"connection to {self.host}:{self.port} was closed"))
            raise

    def _fail(self, error: StrataError) -> None:
        if self._closed_error is None:
            self._closed_error = error
        pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(error)
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        self._fail(NetworkError(f"connection to {self.host}:{self.port} was closed"))
        if self._read_task is not None:
            self._read_task.cancel()
            with contextlib.suppress(BaseException):
                await self._read_task
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    async def __aenter__(self) -> BrokerConnection:
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
