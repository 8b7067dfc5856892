"""One TCP connection to one broker: frames requests, matches responses by correlation id.

It knows nothing of what requests mean: ``request(api, body)`` sends a frame and returns
the decoded response; several requests may be in flight at once. When the connection
breaks, every pending request fails with ``NetworkError`` and the connection is marked
closed; the cluster layer opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any

from wire.errors import NetworkError, StrataError, error_for_code
from wire.protocol import (
    FRAME_PREFIX,
    RESPONSE_TYPES,
    ApiKey,
    ErrorResponse,
    Message,
    RequestHeader,
    decode,
    encode_request,
    read_response_header,
)

__all__ = ["BrokerConnection"]

log = logging.getLogger("strata.client.connection")


class BrokerConnection:
    def __init__(self, host: str, port: int, *, client_id: str = "strata-python",
                 max_frame_bytes: int = 256 * 1024 * 1024) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.max_frame_bytes = max_frame_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, tuple[asyncio.Future[Message], type[Message], int]] = {}
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self._closed_error: StrataError | None = None

    def __repr__(self) -> str:
        return f"BrokerConnection({self.host}:{self.port})"

    @property
    def is_open(self) -> bool:
        return self._writer is not None and self._closed_error is None

    async def connect(self, timeout: float = 10.0) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 20), timeout)
        except (OSError, TimeoutError) as err:
            raise NetworkError(
                f"cannot connect to broker {self.host}:{self.port} ({err}); check that it "
                "runs (strata status) and the address is right") from err
        self._read_task = asyncio.create_task(self._read_loop())

    async def request(self, api: ApiKey, body: Message, *, version: int = 0,
                      expect_response: bool = True) -> Message:
        """Send one request; return its response (``None``-like empty message if none)."""
        if not self.is_open or self._writer is None:
            raise self._closed_error or NetworkError(f"{self} is not connected")
        correlation_id = next(self._ids) & 0x7FFFFFFF
        frame = encode_request(RequestHeader(int(api), version, correlation_id, self.client_id),
                               body)
        future: asyncio.Future[Message] | None = None
        if expect_response:
            future = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = (future, RESPONSE_TYPES[api], version)
        try:
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
                        future.set_result(decode(response_type, reader, version))
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
