"""Group commit: many appending threads, one fsync.

With ``flush.policy=always`` an append may not return before its bytes are on disk.
An fsync costs about 0.5 ms here whatever it covers, so appends that arrive while one
is running wait for the *next* one, which then covers all of them: N concurrent
appends cost two fsyncs, not N.

Protocol: ``wait_durable(offset)`` returns once ``durable_offset >= offset``. The first
waiter that finds no flush running becomes the flusher: it calls ``flush()`` (which
snapshots the log end offset *before* syncing and returns it) outside the condition's
lock, publishes the result and wakes everybody; the others wait.

Thread-safety: fully thread-safe. An exception from ``flush()`` is raised in the
flusher and in every waiter that was waiting on that flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["GroupCommit"]


class GroupCommit:
    def __init__(self, flush: Callable[[], int], durable_offset: int) -> None:
        self._flush = flush
        self._cond = threading.Condition()
        self._flushing = False
        self._error: BaseException | None = None
        self._error_generation = -1
        self._generation = 0
        self.durable_offset = durable_offset
        self.flush_count = 0

    def wait_durable(self, offset: int) -> None:
        with self._cond:
            while self.durable_offset < offset:
                if self._flushing:
                    generation = self._generation
                    self._cond.wait()
                    if self._error is not None and self._error_generation == generation:
                        raise self._error
                    continue
                self._flushing = True
                self._cond.release()
                error: BaseException | None = None
                durable = -1
                try:
                    durable = self._flush()
                except BaseException as exc:  # re-raised below, in every waiter too
                    error = exc
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    if error is None:
                        self.durable_offset = max(self.durable_offset, durable)
                        self.flush_count += 1
                    else:
                        self._error = error
                        self._error_generation = self._generation
                    self._generation += 1
                    self._cond.notify_all()
                if error is not None:
                    raise error

    def reset(self, durable_offset: int) -> None:
        """After a truncation the durable point can move down."""
        with self._cond:
            self.durable_offset = durable_offset
