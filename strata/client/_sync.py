"""Run the asyncio client from synchronous code: one event loop in a daemon thread.

The sync faces (``Producer``, ``Consumer``, ``Admin``) each own an ``EventLoopThread``
and submit coroutines to it with ``run``; results and exceptions come back unchanged.

Stopping the loop leaves nothing pending: ``close`` (and, for a client its owner never
closed, a finalizer that runs when it is garbage-collected or the interpreter exits)
cancels every task still on the loop, e.g. a broker connection's read loop, and waits
for them before the loop is closed, so Python never reports "Task was destroyed but it
is pending!".
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["EventLoopThread"]

T = TypeVar("T")


#: Longest ``close`` waits for the loop's remaining tasks to finish their cancellation.
_CANCEL_TIMEOUT_S = 5.0


async def _cancel_pending() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what is left on ``loop``, stop it and close it (a module function, so the
    finalizer holds no reference to the ``EventLoopThread``)."""
    if loop.is_closed():
        return
    if thread.is_alive() and threading.current_thread() is not thread:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(_CANCEL_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    if not thread.is_alive():
        loop.close()


class EventLoopThread:
    def __init__(self, name: str = "strata-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        # A client nobody closed still stops cleanly when collected or at exit.
        self._finalizer = weakref.finalize(self, _stop, self.loop, self._thread)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def is_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coroutine`` on the loop; return a ``concurrent.futures.Future``."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("sync client method called from its own event loop thread")
        if self.loop.is_closed() or not self._thread.is_alive():
            coroutine.close()
            raise RuntimeError("this client is closed; create a new one")
        return self.submit(coroutine).result(timeout)

    def close(self) -> None:
        """Cancel the tasks still on the loop, stop it and close it (idempotent)."""
        self._finalizer()
