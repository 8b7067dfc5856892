"""At-most-once production for requests carrying an ``Idempotency-Key`` header.

The first request with a key runs; a retry with the same key (same principal and path)
within the window gets the first answer, also while the first is still running (it waits
for it). A retry with a different body is refused with 422. Answers that certainly wrote
nothing (``not_written``) are forgotten, so a retry runs again.

The store lives in the process: with several uvicorn workers a retry is recognised only
by the worker that served the first request.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ingest_gateway._errors import HttpError

__all__ = ["Answer", "IdempotencyStore"]


@dataclass(slots=True)
class Answer:
    """A complete HTTP answer: status, body bytes, media type and extra headers."""

    status: int
    body: bytes
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    #: True when nothing was written, so a retry may run again.
    not_written: bool = False


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    future: asyncio.Future[Answer]
    expires: float


class IdempotencyStore:
    def __init__(self, window_s: float, max_keys: int) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.expires > now and len(self._entries) <= self.max_keys:
                break
            if not entry.future.done() and entry.expires > now:
                break
            del self._entries[key]

    async def run(self, key: str, fingerprint: str,
                  compute: Callable[[], Awaitable[Answer]]) -> tuple[Answer, bool]:
        """(answer, replayed): the stored answer for ``key``, or ``compute()``'s."""
        now = time.monotonic()
        self._expire(now)
        entry = self._entries.get(key)
        if entry is not None:
            if entry.fingerprint != fingerprint:
                raise HttpError(422, "Idempotency-Key was already used with a different "
                                     "request body or acks; use a new key for a new request")
            return await asyncio.shield(entry.future), True
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        entry = _Entry(fingerprint, future, now + self.window_s)
        self._entries[key] = entry
        try:
            answer = await compute()
        except BaseException as exc:
            if self._entries.get(key) is entry:
                del self._entries[key]
            future.set_exception(exc)
            future.exception()  # retrieved: waiting retries get it, nobody else must
            raise
        if answer.not_written:
            if self._entries.get(key) is entry:
                del self._entries[key]
        else:
            entry.expires = time.monotonic() + self.window_s
        future.set_result(answer)
        return answer, False
