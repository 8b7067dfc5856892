"""At-most-once production for requests carrying an ``Idempotency-Key`` header.

The first request with a key runs; a retry with the same key (same principal and path)
within the window gets the first answer, also while the first is still running (it waits
for it). A retry with a different body is refused with 422. Answers that certainly wrote
nothing (``not_written``) or that are not final (status >= 500) are forgotten, so a retry
runs again. A key is never forgotten inside its window: when ``max_keys`` keys are live, a
request with a new key is refused with 503 and a ``Retry-After`` until the oldest expires.

Within one process, answers and waiting retries are coordinated in memory. With several
uvicorn workers the store is also backed by one SQLite file that every worker opens
(``shared_path``): the first worker to claim a key produces, the others wait for its answer
there. The producing worker renews its claim every ``pending_timeout_s / 3`` while it runs,
so a claim is only taken over when its worker stopped renewing it (died), at most
``pending_timeout_s`` after the last renewal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sqlite3
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ingest_gateway._errors import HttpError

__all__ = ["Answer", "IdempotencyStore"]

log = logging.getLogger("strata.gateway.idempotency")

#: Default seconds a claim of a dead worker blocks its key (live claims are renewed).
PENDING_TIMEOUT_S = 30.0


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


@dataclass(slots=True, eq=False)  # hashed by identity
class _Claim:
    """This process owns ``key`` in the shared file; ``renewal`` keeps the claim alive."""

    key: str
    fingerprint: str
    token: str
    renewal: asyncio.Task[None] | None = None


_MISMATCH = ("Idempotency-Key was already used with a different request body or acks; use "
             "a new key for a new request")


def _final(answer: Answer) -> bool:
    """Whether ``answer`` is kept for the window (else a retry runs again)."""
    return not answer.not_written and answer.status < 500


def _full(max_keys: int, window_s: float, wait_s: float) -> HttpError:
    retry_after = max(1, math.ceil(wait_s))
    return HttpError(
        503, f"the idempotency store holds its maximum of {max_keys} keys within the "
             f"{window_s:g} s window; retry after Retry-After seconds or raise "
             "idempotency_max_keys",
        headers={"Retry-After": str(retry_after)}, not_written=True)


def _encode(answer: Answer) -> bytes:
    return json.dumps({"status": answer.status, "body": answer.body.decode("utf-8"),
                       "media_type": answer.media_type, "headers": answer.headers}).encode()


def _decode(blob: bytes) -> Answer:
    data: dict[str, Any] = json.loads(blob)
    return Answer(int(data["status"]), str(data["body"]).encode("utf-8"),
                  str(data["media_type"]), dict(data["headers"]))


class _SharedKeys:
    """The cross-process part: one row per key in a SQLite file (WAL mode), opened and
    touched only from one helper thread per process, never from the event loop. Times are
    wall-clock (shared between processes). A row with ``answer`` NULL is a claim, owned by
    ``owner`` until ``expires``; a row with an answer is kept until ``expires``."""

    def __init__(self, path: str, window_s: float, max_keys: int,
                 pending_timeout_s: float) -> None:
        self.path = path
        self.window_s = window_s
        self.max_keys = max_keys
        self.pending_timeout_s = pending_timeout_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gateway-idempotency")
        self._db: sqlite3.Connection | None = None  # opened by the helper thread
        self._claims: set[_Claim] = set()
        self._closed = False

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _conn(self) -> sqlite3.Connection:
        """The connection, opened on first use (in the helper thread)."""
        if self._db is None:
            # a renewal waits behind other statements on the one helper thread: their lock
            # waits stay well below the claim timeout (renewed every third of it)
            db = sqlite3.connect(self.path, timeout=3.0, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("BEGIN IMMEDIATE")  # one worker at a time creates or upgrades
                db.execute("CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, "
                           "fingerprint TEXT NOT NULL, answer BLOB, expires REAL NOT NULL, "
                           "owner TEXT)")
                if "owner" not in {row[1] for row in db.execute("PRAGMA table_info(idempotency)")}:
                    db.execute("ALTER TABLE idempotency ADD COLUMN owner TEXT")
                db.execute("CREATE INDEX IF NOT EXISTS idempotency_expires "
                           "ON idempotency (expires)")
                db.execute("COMMIT")
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _claim(self, key: str, fingerprint: str, token: str) -> tuple[str, Answer | None]:
        """("owner", None) | ("done", answer) | ("pending", None); raises on mismatch and
        when a new key does not fit."""
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        ok = False
        try:
            now = time.time()
            # Expired answers and the claims of dead workers (cheap: indexed).
            db.execute("DELETE FROM idempotency WHERE expires < ?", (now,))
            row = db.execute("SELECT fingerprint, answer FROM idempotency WHERE key = ?",
                             (key,)).fetchone()
            result: tuple[str, Answer | None]
            if row is None:
                (count,) = db.execute("SELECT COUNT(*) FROM idempotency").fetchone()
                if count >= self.max_keys:
                    oldest = db.execute("SELECT expires FROM idempotency WHERE answer IS NOT "
                                        "NULL ORDER BY expires LIMIT 1").fetchone()
                    raise _full(self.max_keys, self.window_s,
                                self.window_s if oldest is None else oldest[0] - now)
                db.execute("INSERT INTO idempotency (key, fingerprint, answer, expires, owner) "
                           "VALUES (?, ?, NULL, ?, ?)",
                           (key, fingerprint, now + self.pending_timeout_s, token))
                result = ("owner", None)
            elif row[0] != fingerprint:
                raise HttpError(422, _MISMATCH)
            else:
                result = ("pending", None) if row[1] is None else ("done", _decode(row[1]))
            ok = True
            return result
        finally:
            db.execute("COMMIT" if ok else "ROLLBACK")

    def _renew_row(self, key: str, token: str) -> bool:
        """Push the claim's expiry on; False when it is no longer this process's claim."""
        cursor = self._conn().execute(
            "UPDATE idempotency SET expires = ? WHERE key = ? AND owner = ? AND answer IS NULL",
            (time.time() + self.pending_timeout_s, key, token))
        return cursor.rowcount == 1

    def _finish(self, claim: _Claim, answer: Answer | None) -> None:
        db = self._conn()
        if answer is None or not _final(answer):
            db.execute("DELETE FROM idempotency WHERE key = ? AND owner = ?",
                       (claim.key, claim.token))
            return
        blob, expires = _encode(answer), time.time() + self.window_s
        cursor = db.execute("UPDATE idempotency SET answer = ?, expires = ? WHERE key = ? AND "
                            "owner = ?", (blob, expires, claim.key, claim.token))
        if cursor.rowcount == 0:
            # The claim lapsed (not renewed in time) and was swept: keep the answer unless
            # another worker claimed the key meanwhile.
            db.execute("INSERT OR IGNORE INTO idempotency (key, fingerprint, answer, expires, "
                       "owner) VALUES (?, ?, ?, ?, ?)",
                       (claim.key, claim.fingerprint, blob, expires, claim.token))

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def _renew(self, claim: _Claim) -> None:
        interval = self.pending_timeout_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                held: bool = await self._call(self._renew_row, claim.key, claim.token)
            except Exception:
                log.exception("renewing the claim on an Idempotency-Key in %s failed; trying "
                              "again in %g s", self.path, interval)
                continue
            if not held:
                log.warning("the claim on an Idempotency-Key in %s lapsed (not renewed within "
                            "%g s): another worker may produce the request again",
                            self.path, self.pending_timeout_s)
                return

    async def claim(self, key: str, fingerprint: str) -> Answer | _Claim:
        """A ``_Claim`` when this process now owns the key (it must call ``finish``), else
        the answer of the worker that does, waiting as long as that worker renews its
        claim; when it stops (died), this process takes the key over."""
        token = uuid.uuid4().hex
        delay = 0.02
        while True:
            result: tuple[str, Answer | None] = await self._call(
                self._claim, key, fingerprint, token)
            state, answer = result
            if state == "owner":
                claim = _Claim(key, fingerprint, token)
                claim.renewal = asyncio.get_running_loop().create_task(self._renew(claim))
                self._claims.add(claim)
                return claim
            if answer is not None:
                return answer
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25, self.pending_timeout_s / 4)

    async def finish(self, claim: _Claim, answer: Answer | None) -> None:
        """Stop renewing; keep a final ``answer``, or release the key (None: failed)."""
        self._claims.discard(claim)
        if claim.renewal is not None:
            claim.renewal.cancel()
        await self._call(self._finish, claim, answer)

    def _stop_renewals(self) -> None:
        for claim in self._claims:
            if claim.renewal is not None:
                claim.renewal.cancel()
        self._claims.clear()

    async def aclose(self) -> None:
        """Close the database in the helper thread, without blocking the event loop."""
        if self._closed:
            return
        self._closed = True
        self._stop_renewals()
        try:
            await self._call(self._close_db)
        finally:
            self._executor.shutdown(wait=False)

    def close(self) -> None:
        """Like ``aclose``, for callers without an event loop (blocks until closed)."""
        if self._closed:
            return
        self._closed = True
        self._stop_renewals()
        try:
            self._executor.submit(self._close_db).result()
        finally:
            self._executor.shutdown()


class IdempotencyStore:
    def __init__(self, window_s: float, max_keys: int, *, shared_path: str | None = None,
                 pending_timeout_s: float = PENDING_TIMEOUT_S) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        #: Every live key: running (future not done) or answered within the window.
        self._entries: dict[str, _Entry] = {}
        #: The answered keys, oldest first, with their monotonic expiry.
        self._expiry: OrderedDict[str, float] = OrderedDict()
        self._shared = (None if shared_path is None
                        else _SharedKeys(shared_path, window_s, max_keys, pending_timeout_s))

    async def aclose(self) -> None:
        """Close the shared file without blocking the event loop."""
        if self._shared is not None:
            await self._shared.aclose()

    def close(self) -> None:
        """Close the shared file, blocking (for callers without an event loop)."""
        if self._shared is not None:
            self._shared.close()

    def _expire(self, now: float) -> None:
        while self._expiry:
            key, expires = next(iter(self._expiry.items()))
            if expires > now:
                break
            del self._expiry[key]
            self._entries.pop(key, None)

    def _keep(self, key: str, entry: _Entry) -> None:
        if self._entries.get(key) is entry:
            self._expiry.pop(key, None)
            self._expiry[key] = time.monotonic() + self.window_s

    def _drop(self, key: str, entry: _Entry) -> None:
        if self._entries.get(key) is entry:
            del self._entries[key]
            self._expiry.pop(key, None)

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
        if len(self._entries) >= self.max_keys:
            oldest = next(iter(self._expiry.values()), None)
            raise _full(self.max_keys, self.window_s,
                        self.window_s if oldest is None else oldest - now)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        entry = _Entry(fingerprint, future)
        self._entries[key] = entry
        claim: _Claim | None = None
        try:
            if self._shared is not None:
                got = await self._shared.claim(key, fingerprint)
                if isinstance(got, Answer):
                    self._keep(key, entry)
                    future.set_result(got)
                    return got, True
                claim = got
            answer = await compute()
        except BaseException as exc:
            self._drop(key, entry)
            future.set_exception(exc)
            future.exception()  # retrieved: waiting retries get it, nobody else must
            if claim is not None and self._shared is not None:
                try:
                    await asyncio.shield(self._shared.finish(claim, None))
                except Exception:
                    log.exception("releasing an Idempotency-Key in %s failed",
                                  self._shared.path)
            raise
        try:
            if claim is not None and self._shared is not None:
                await asyncio.shield(self._shared.finish(claim, answer))
        except Exception:
            log.exception("storing the answer for an Idempotency-Key in %s failed",
                          self._shared.path if self._shared is not None else "")
        finally:
            if _final(answer):
                self._keep(key, entry)
            else:
                # Not final: nothing was written, or nobody knows (a 503 after the send);
                # a retry must run again rather than get this answer replayed.
                self._drop(key, entry)
            future.set_result(answer)
        return answer, False
