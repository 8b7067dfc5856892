"""At-most-once production for requests carrying an ``Idempotency-Key`` header.

The first request with a key runs; a retry with the same key (same principal and path)
within the window gets the first answer, also while the first is still running (it waits
for it). A retry with a different body is refused with 422. Answers that certainly wrote
nothing (``not_written``) are forgotten, so a retry runs again.

Within one process, answers and waiting retries are coordinated in memory. With several
uvicorn workers the store is also backed by one SQLite file that every worker opens
(``shared_path``): the first worker to claim a key produces, the others wait for its answer
there. A claim whose worker died is given up after ``pending_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

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


_MISMATCH = ("Idempotency-Key was already used with a different request body or acks; use "
             "a new key for a new request")


def _encode(answer: Answer) -> bytes:
    return json.dumps({"status": answer.status, "body": answer.body.decode("utf-8"),
                       "media_type": answer.media_type, "headers": answer.headers}).encode()


def _decode(blob: bytes) -> Answer:
    data: dict[str, Any] = json.loads(blob)
    return Answer(int(data["status"]), str(data["body"]).encode("utf-8"),
                  str(data["media_type"]), dict(data["headers"]))


class _SharedKeys:
    """The cross-process part: one row per key in a SQLite file (WAL mode), touched only
    from one helper thread per process. Times are wall-clock (shared between processes)."""

    def __init__(self, path: str, window_s: float, pending_timeout_s: float) -> None:
        self.window_s = window_s
        self.pending_timeout_s = pending_timeout_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gateway-idempotency")
        self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, "
                         "fingerprint TEXT NOT NULL, answer BLOB, expires REAL NOT NULL)")
        self._last_sweep = 0.0

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _claim(self, key: str, fingerprint: str) -> tuple[str, Answer | None]:
        """("owner", None) | ("done", answer) | ("pending", None); raises on mismatch."""
        now = time.time()
        db = self._db
        if now - self._last_sweep > 10.0:
            self._last_sweep = now
            db.execute("DELETE FROM idempotency WHERE expires < ?", (now,))
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT fingerprint, answer, expires FROM idempotency "
                             "WHERE key = ?", (key,)).fetchone()
            if row is None or row[2] < now:
                db.execute("INSERT OR REPLACE INTO idempotency VALUES (?, ?, NULL, ?)",
                           (key, fingerprint, now + self.pending_timeout_s))
                return "owner", None
            if row[0] != fingerprint:
                raise HttpError(422, _MISMATCH)
            return ("pending", None) if row[1] is None else ("done", _decode(row[1]))
        finally:
            db.execute("COMMIT")

    def _finish(self, key: str, answer: Answer | None) -> None:
        if answer is None or answer.not_written:
            self._db.execute("DELETE FROM idempotency WHERE key = ?", (key,))
        else:
            self._db.execute("UPDATE idempotency SET answer = ?, expires = ? WHERE key = ?",
                             (_encode(answer), time.time() + self.window_s, key))

    async def claim(self, key: str, fingerprint: str) -> Answer | None:
        """None: this process owns the key and must call ``finish``; else the answer of
        the worker that did (waiting while it runs)."""
        deadline = time.monotonic() + self.pending_timeout_s
        while True:
            result: tuple[str, Answer | None] = await self._call(self._claim, key, fingerprint)
            state, answer = result
            if state == "owner":
                return None
            if answer is not None:
                return answer
            if time.monotonic() > deadline:
                raise HttpError(503, "the first request with this Idempotency-Key is still "
                                     "running in another worker; retry later",
                                headers={"Retry-After": "1"}, not_written=True)
            await asyncio.sleep(0.05)

    async def finish(self, key: str, answer: Answer | None) -> None:
        await self._call(self._finish, key, answer)

    def close(self) -> None:
        self._executor.submit(self._db.close).result()
        self._executor.shutdown()


class IdempotencyStore:
    def __init__(self, window_s: float, max_keys: int, *, shared_path: str | None = None,
                 pending_timeout_s: float = 120.0) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._shared = (None if shared_path is None
                        else _SharedKeys(shared_path, window_s, pending_timeout_s))

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()

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
                raise HttpError(422, _MISMATCH)
            return await asyncio.shield(entry.future), True
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        entry = _Entry(fingerprint, future, now + self.window_s)
        self._entries[key] = entry
        owner = False
        try:
            stored = None if self._shared is None else await self._shared.claim(key, fingerprint)
            if stored is not None:
                entry.expires = time.monotonic() + self.window_s
                future.set_result(stored)
                return stored, True
            owner = self._shared is not None
            answer = await compute()
            if self._shared is not None:
                await self._shared.finish(key, answer)
        except BaseException as exc:
            if self._entries.get(key) is entry:
                del self._entries[key]
            if owner and self._shared is not None:
                await asyncio.shield(self._shared.finish(key, None))
            future.set_exception(exc)
            future.exception()  # retrieved: waiting retries get it, nobody else must
            raise
        if answer.not_written or answer.status >= 500:
            # Not final: nothing was written, or nobody knows (a 503 after the send); a
            # retry must run again rather than get this answer replayed for the window.
            if self._entries.get(key) is entry:
                del self._entries[key]
        else:
            entry.expires = time.monotonic() + self.window_s
        future.set_result(answer)
        return answer, False
