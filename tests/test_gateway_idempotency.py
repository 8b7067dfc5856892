"""The gateway's Idempotency-Key store (``ingest_gateway._idempotency``) on its own: replay,
422, non-final answers, the ``max_keys`` bound (503 + Retry-After, never forgetting a key
inside its window), renewed claims across workers (two stores on one SQLite file, and a
real second process), the takeover of a dead worker's claim, and closing off the loop."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ingest_gateway._errors import HttpError
from ingest_gateway._idempotency import Answer, IdempotencyStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
#: Stops a hung test; not a speed target (the tests take a few seconds). Below the
#: stores' default 30 s pending timeout, so waiting out a claim left behind fails too.
TEST_TIMEOUT_S = 20.0
T = TypeVar("T")

#: A worker in another process: claims ``key`` in the shared file, touches ``marker`` once
#: its compute runs, holds for ``hold`` seconds, prints the result as JSON.
_WORKER = """
import asyncio, json, sys
from ingest_gateway._idempotency import Answer, IdempotencyStore

path, key, hold, marker, timeout = sys.argv[1:6]

async def main():
    store = IdempotencyStore(60.0, 100, shared_path=path, pending_timeout_s=float(timeout))

    async def compute():
        open(marker, "w").close()
        await asyncio.sleep(float(hold))
        return Answer(200, b'{"from": "other process"}')

    answer, replayed = await store.run(key, "fp", compute)
    await store.aclose()
    print(json.dumps({"body": answer.body.decode(), "replayed": replayed}))

asyncio.run(main())
"""


def _run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` with a deadline, so a test that would hang fails instead."""
    return asyncio.run(asyncio.wait_for(main, TEST_TIMEOUT_S))


def _counting(answer: Answer, delay: float = 0.0) -> tuple[list[int], Callable[[],
                                                                            Awaitable[Answer]]]:
    calls: list[int] = []

    async def compute() -> Answer:
        calls.append(1)
        if delay:
            await asyncio.sleep(delay)
        return answer

    return calls, compute


async def _never() -> Answer:
    raise AssertionError("compute must not run")


def _store(tmp_path: Path, shared: bool, **kwargs: Any) -> IdempotencyStore:
    window = kwargs.pop("window_s", 60.0)
    max_keys = kwargs.pop("max_keys", 100)
    return IdempotencyStore(window, max_keys,
                            shared_path=str(tmp_path / "keys.sqlite3") if shared else None,
                            **kwargs)


@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    return script


def _start_worker(script: Path, tmp_path: Path, hold: float,
                  timeout: float) -> tuple[subprocess.Popen[str], Path]:
    marker = tmp_path / "claimed"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "keys.sqlite3"), "k", str(hold),
         str(marker), str(timeout)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30.0
    while not marker.exists():
        assert proc.poll() is None, "the worker process died"
        assert time.monotonic() < deadline, "the worker process never claimed the key"
        time.sleep(0.02)
    return proc, marker


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=5)


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "sqlite"])
def test_stored_answer_is_replayed(tmp_path: Path, shared: bool) -> None:
    async def main() -> None:
        store = _store(tmp_path, shared)
        compute_answer = Answer(200, b'{"offset": 7}', headers={"X-A": "1"})
        calls, compute = _counting(compute_answer)
        assert await store.run("k", "fp", compute) == (compute_answer, False)
        answer, replayed = await store.run("k", "fp", compute)
        assert (answer, replayed) == (compute_answer, True) and calls == [1]
        if shared:  # another worker (a second store on the file) gets it from SQLite
            other = _store(tmp_path, shared)
            assert await other.run("k", "fp", _never) == (compute_answer, True)
            await other.aclose()
        await store.aclose()

    _run(main())


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "sqlite"])
def test_different_fingerprint_gets_422(tmp_path: Path, shared: bool) -> None:
    async def main() -> None:
        store = _store(tmp_path, shared)
        _, compute = _counting(Answer(200, b"{}"))
        await store.run("k", "fp-1", compute)
        with pytest.raises(HttpError) as err:
            await store.run("k", "fp-2", _never)
        assert err.value.status == 422 and "different request body" in err.value.message
        if shared:
            other = _store(tmp_path, shared)
            with pytest.raises(HttpError) as err:
                await other.run("k", "fp-2", _never)
            assert err.value.status == 422
            await other.aclose()
        await store.aclose()

    _run(main())


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "sqlite"])
@pytest.mark.parametrize("answer", [Answer(503, b"{}", not_written=True),
                                    Answer(500, b"{}"), Answer(207, b"{}", not_written=True)],
                         ids=["503-not-written", "500", "207-not-written"])
def test_non_final_answers_are_not_replayed(tmp_path: Path, shared: bool,
                                            answer: Answer) -> None:
    async def main() -> None:
        store = _store(tmp_path, shared)
        calls, compute = _counting(answer)
        assert await store.run("k", "fp", compute) == (answer, False)
        assert await store.run("k", "fp", compute) == (answer, False)
        assert calls == [1, 1]
        if shared:  # not kept in the file either: another worker runs it again
            other = _store(tmp_path, shared)
            other_calls, other_compute = _counting(Answer(200, b"{}"))
            assert (await other.run("k", "fp", other_compute))[1] is False
            assert other_calls == [1]
            await other.aclose()
        await store.aclose()

    _run(main())


def test_waiting_retry_in_process_shares_the_first_future() -> None:
    async def main() -> None:
        store = IdempotencyStore(60.0, 100)
        calls, compute = _counting(Answer(200, b'{"n": 1}'), delay=0.2)
        first, second = await asyncio.gather(store.run("k", "fp", compute),
                                             store.run("k", "fp", compute))
        assert calls == [1]
        assert first == (Answer(200, b'{"n": 1}'), False)
        assert second == (Answer(200, b'{"n": 1}'), True)

    _run(main())


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "sqlite"])
def test_exception_propagates_and_releases_the_key(tmp_path: Path, shared: bool) -> None:
    async def main() -> None:
        store = _store(tmp_path, shared, pending_timeout_s=30.0)
        started = asyncio.Event()

        async def failing() -> Answer:
            started.set()
            await asyncio.sleep(0.1)
            raise RuntimeError("boom")

        first = asyncio.ensure_future(store.run("k", "fp", failing))
        await started.wait()
        waiting = asyncio.ensure_future(store.run("k", "fp", _never))
        with pytest.raises(RuntimeError, match="boom"):
            await first
        with pytest.raises(RuntimeError, match="boom"):  # the waiting retry shares it
            await waiting
        # Released: nothing of the key is left, in memory nor in the file (where the
        # claim would block the key for its 30 s pending timeout) ...
        assert "k" not in store._entries
        if shared:
            with sqlite3.connect(tmp_path / "keys.sqlite3") as db:
                assert db.execute("SELECT COUNT(*) FROM idempotency WHERE key = 'k'"
                                  ).fetchone() == (0,)
        # ... so the next retry runs at once: far below those 30 s, however slow.
        runner = _store(tmp_path, shared) if shared else store
        calls, compute = _counting(Answer(200, b"{}"))
        began = time.monotonic()
        assert (await runner.run("k", "fp", compute))[1] is False
        assert calls == [1] and time.monotonic() - began < 10.0
        await runner.aclose()
        await store.aclose()

    _run(main())


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "sqlite"])
def test_max_keys_full_refuses_new_keys_until_the_oldest_expires(tmp_path: Path,
                                                                 shared: bool) -> None:
    async def main() -> None:
        store = _store(tmp_path, shared, window_s=0.3, max_keys=2)
        for key in ("a", "b"):
            await store.run(key, "fp", _counting(Answer(200, key.encode()))[1])
        calls, compute = _counting(Answer(200, b"c"))
        with pytest.raises(HttpError) as err:
            await store.run("c", "fp", compute)
        assert calls == []
        assert err.value.status == 503 and err.value.not_written
        assert err.value.headers == {"Retry-After": "1"}
        assert "maximum of 2 keys" in err.value.message
        assert "0.3 s window" in err.value.message
        assert "idempotency_max_keys" in err.value.message
        # Both keys are still known inside their window (the old code dropped "a" here).
        for key in ("a", "b"):
            assert await store.run(key, "fp", _never) == (Answer(200, key.encode()), True)
        await asyncio.sleep(0.4)
        assert await store.run("c", "fp", compute) == (Answer(200, b"c"), False)
        assert calls == [1]
        await store.aclose()

    _run(main())


def test_shared_table_full_refuses_a_new_key_in_another_worker(tmp_path: Path) -> None:
    async def main() -> None:
        first = _store(tmp_path, True, window_s=0.5, max_keys=2)
        # A running (claimed) key counts as live, as an answered one does.
        running = asyncio.ensure_future(
            first.run("a", "fp", _counting(Answer(200, b"a"), delay=0.2)[1]))
        await asyncio.sleep(0.05)
        await first.run("b", "fp", _counting(Answer(200, b"b"))[1])
        second = _store(tmp_path, True, window_s=0.5, max_keys=2)  # empty in memory
        calls, compute = _counting(Answer(200, b"c"))
        with pytest.raises(HttpError) as err:
            await second.run("c", "fp", compute)
        assert err.value.status == 503 and calls == []
        assert err.value.headers["Retry-After"] == "1"
        assert await second.run("b", "fp", _never) == (Answer(200, b"b"), True)
        await running
        await asyncio.sleep(0.8)  # "a" and "b" expired: swept, a new key fits
        assert await second.run("c", "fp", compute) == (Answer(200, b"c"), False)
        with sqlite3.connect(tmp_path / "keys.sqlite3") as db:
            assert [r[0] for r in db.execute("SELECT key FROM idempotency")] == ["c"]
        await first.aclose()
        await second.aclose()

    _run(main())


def test_renewed_claim_is_not_taken_over_by_another_worker(tmp_path: Path) -> None:
    """The owner's compute takes 3x pending_timeout_s: the other worker keeps waiting
    (the claim is renewed) and then gets the owner's answer; it never produces."""

    async def main() -> None:
        # A claim of 1.5 s renewed every 0.5 s: a loaded machine (a slow SQLite sync)
        # may stall the owner for a second without the claim lapsing.
        owner = _store(tmp_path, True, pending_timeout_s=1.5)
        other = _store(tmp_path, True, pending_timeout_s=1.5)
        calls, compute = _counting(Answer(200, b'{"from": "owner"}'), delay=4.5)
        began = time.monotonic()
        owning = asyncio.ensure_future(owner.run("k", "fp", compute))
        while not calls:
            await asyncio.sleep(0.01)
        assert not owning.done()  # the other worker comes while the owner computes
        answer, replayed = await other.run("k", "fp", _never)
        assert (answer.body, replayed) == (b'{"from": "owner"}', True)
        # The answer came after three pending timeouts of the claim: only its renewals
        # kept the other worker waiting (instead of taking over and running _never).
        assert time.monotonic() - began > 4.5
        assert await owning == (Answer(200, b'{"from": "owner"}'), False)
        assert calls == [1]
        await owner.aclose()
        await other.aclose()

    _run(main())


def test_renewed_claim_across_real_processes(tmp_path: Path, worker_script: Path,
                                             procs: list[subprocess.Popen[str]]) -> None:
    proc, _ = _start_worker(worker_script, tmp_path, hold=4.5, timeout=1.5)
    procs.append(proc)

    async def main() -> tuple[Answer, bool]:
        store = _store(tmp_path, True, pending_timeout_s=1.5)
        try:
            return await store.run("k", "fp", _never)
        finally:
            await store.aclose()

    answer, replayed = _run(main())
    assert (answer.body, replayed) == (b'{"from": "other process"}', True)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert json.loads(out) == {"body": '{"from": "other process"}', "replayed": False}


def test_claim_of_a_killed_worker_process_is_taken_over(
        tmp_path: Path, worker_script: Path, procs: list[subprocess.Popen[str]]) -> None:
    proc, _ = _start_worker(worker_script, tmp_path, hold=60.0, timeout=0.5)
    procs.append(proc)
    proc.kill()  # SIGKILL mid-compute: its claim is never renewed nor released
    proc.wait(timeout=5)

    async def main() -> None:
        store = _store(tmp_path, True, pending_timeout_s=0.5)
        calls, compute = _counting(Answer(200, b'{"from": "survivor"}'))
        began = time.monotonic()
        assert await store.run("k", "fp", compute) == (
            Answer(200, b'{"from": "survivor"}'), False)
        # The dead claim expires 0.5 s after its last renewal; never taken over, this
        # would hang (TEST_TIMEOUT_S). 10 s allows for a slow machine.
        assert calls == [1] and time.monotonic() - began < 10.0
        await store.aclose()

    _run(main())


def test_stale_claim_row_is_taken_over_after_the_timeout(tmp_path: Path) -> None:
    """A claim row nobody renews (its worker died) blocks its key only until it expires;
    a waiting worker then takes it over."""

    async def main() -> None:
        store = _store(tmp_path, True, pending_timeout_s=0.5)
        await store.run("warm-up", "fp", _counting(Answer(200, b"{}"))[1])  # creates table
        expires = time.time() + 0.5
        with sqlite3.connect(tmp_path / "keys.sqlite3") as db:
            db.execute("INSERT INTO idempotency (key, fingerprint, answer, expires, owner) "
                       "VALUES ('k', 'fp', NULL, ?, 'dead-worker')", (expires,))
        taken_at: list[float] = []

        async def compute() -> Answer:
            taken_at.append(time.time())
            return Answer(200, b'{"from": "taker"}')

        began = time.monotonic()
        assert await store.run("k", "fp", compute) == (Answer(200, b'{"from": "taker"}'), False)
        waited = time.monotonic() - began
        # Taken over only once the row expired (on the clock the rows use), and then
        # soon: 10 s allows for a slow machine; a claim never taken over hangs.
        assert len(taken_at) == 1 and taken_at[0] >= expires
        assert waited < 10.0
        await store.aclose()

    _run(main())


def test_cancelled_owner_releases_its_claim(tmp_path: Path) -> None:
    """An owner whose compute never finishes and is cancelled stops renewing and
    releases the key: another worker produces it at once."""

    async def main() -> None:
        owner = _store(tmp_path, True, pending_timeout_s=0.5)
        started = asyncio.Event()

        async def hang() -> Answer:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        owning = asyncio.ensure_future(owner.run("k", "fp", hang))
        await started.wait()
        owning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await owning
        await asyncio.sleep(0.05)
        other = _store(tmp_path, True, pending_timeout_s=0.5)
        calls, compute = _counting(Answer(200, b"{}"))
        assert (await other.run("k", "fp", compute))[1] is False and calls == [1]
        await owner.aclose()
        await other.aclose()

    _run(main())


def test_old_table_without_owner_column_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE idempotency (key TEXT PRIMARY KEY, fingerprint TEXT NOT "
                   "NULL, answer BLOB, expires REAL NOT NULL)")
        db.execute("INSERT INTO idempotency VALUES ('old', 'fp', ?, ?)",
                   (json.dumps({"status": 200, "body": "old", "media_type": "text/plain",
                                "headers": {}}).encode(), time.time() + 60))

    async def main() -> None:
        store = _store(tmp_path, True)
        assert await store.run("old", "fp", _never) == (
            Answer(200, b"old", "text/plain"), True)
        assert (await store.run("new", "fp", _counting(Answer(200, b"{}"))[1]))[1] is False
        await store.aclose()

    _run(main())


def test_database_opens_in_the_helper_thread_and_aclose_does_not_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keys.sqlite3"
    opened_in: list[str] = []
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened_in.append(threading.current_thread().name)
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)

    async def main() -> None:
        store = IdempotencyStore(60.0, 100, shared_path=str(path))
        assert not path.exists() and opened_in == []  # nothing opened on the loop
        await store.run("k", "fp", _counting(Answer(200, b"{}"))[1])
        assert path.exists()
        assert len(opened_in) == 1 and opened_in[0].startswith("gateway-idempotency")
        assert opened_in[0] != threading.current_thread().name

        shared = store._shared
        assert shared is not None
        real_close = shared._close_db
        closed_in: list[str] = []

        def slow_close() -> None:
            closed_in.append(threading.current_thread().name)
            time.sleep(0.5)
            real_close()

        monkeypatch.setattr(shared, "_close_db", slow_close)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        await store.aclose()
        ticking.cancel()
        assert ticks >= 10  # the loop ran during the 0.5 s close
        assert closed_in and closed_in[0].startswith("gateway-idempotency")
        assert shared._db is None
        await store.aclose()  # twice is fine
        store.close()

    _run(main())
    # The sync close still works for callers without a loop.
    sync_store = IdempotencyStore(60.0, 100, shared_path=str(path))
    sync_store.close()
