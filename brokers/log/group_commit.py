"""Group commit: many appending threads, one fsync.

With ``flush.policy=always`` an append may not return before its bytes are on disk.
An fsync costs about 0.5 ms here whatever it covers, so appends that arrive while one
is running wait for the *next* one, which then covers all of them: N concurrent
appends cost two fsyncs, not N.

Protocol: ``wait_durable(offset)`` returns once ``durable_offset >= offset``. The first
waiter that finds no flush running becomes the flusher: it calls ``flush()`` (which
snapshots the log end offset *before* syncing and returns it) outside the condition's
lock, publishes the result and wakes everybody; the others wait.

Truncation: ``reset(offset, truncated_to=end)`` moves the durable point (down, after a
truncation) and starts a new reset generation. A flush that began in an older
generation snapshotted a log end that may name truncated offsets, which later appends
reuse; its result is discarded, so ``durable_offset`` never rises above a reset value
on the strength of a flush that predates the reset. A waiter whose offsets were
truncated away (its target is above ``truncated_to``) raises ``OffsetsTruncatedError``:
its records are gone, and neither acknowledging them nor waiting for the log to grow
back past them would be right. ``advance(offset)`` only raises the durable point (after
a full flush of the log) and starts no generation.

Thread-safety: fully thread-safe. An exception from ``flush()`` is raised in the
flusher and in every waiter that was waiting on that flush.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

__all__ = ["GroupCommit", "OffsetsTruncatedError"]


class OffsetsTruncatedError(Exception):
    """The offsets a waiter waited for were truncated from the log before being synced."""

    def __init__(self, offset: int, truncated_to: int) -> None:
        super().__init__(f"offsets below {offset} were truncated (the log now ends at "
                         f"{truncated_to}) before they were fsynced")
        self.offset = offset
        self.truncated_to = truncated_to


class GroupCommit:
    def __init__(self, flush: Callable[[], int], durable_offset: int) -> None:
        self._flush = flush
        self._cond = threading.Condition()
        self._flushing = False
        self._error: BaseException | None = None
        self._error_generation = -1
        self._generation = 0  # completed flushes (successful or not)
        self._reset_generation = 0  # resets so far
        self._tokens = itertools.count()
        self._waiting: dict[int, int] = {}  # waiter token -> offset it waits for
        self._voided: dict[int, int] = {}  # waiter token -> end its offsets were cut to
        self.durable_offset = durable_offset
        self.flush_count = 0
        self.discarded_flushes = 0  # flushes that completed across a reset

    def wait_durable(self, offset: int) -> None:
        with self._cond:
            if self.durable_offset >= offset:
                return
            token = next(self._tokens)
            self._waiting[token] = offset
            try:
                self._wait(token, offset)
            finally:
                del self._waiting[token]
                self._voided.pop(token, None)

    def _wait(self, token: int, offset: int) -> None:
        """Wait (as flusher or not) until ``offset`` is durable; the condition is held."""
        while True:
            truncated_to = self._voided.get(token)
            if truncated_to is not None:
                raise OffsetsTruncatedError(offset, truncated_to)
            if self.durable_offset >= offset:
                return
            if self._flushing:
                generation = self._generation
                self._cond.wait()
                if self._error is not None and self._error_generation == generation:
                    raise self._error
                continue
            self._flushing = True
            reset_generation = self._reset_generation
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
                    self.flush_count += 1
                    if self._reset_generation == reset_generation:
                        self.durable_offset = max(self.durable_offset, durable)
                    else:
                        self.discarded_flushes += 1
                else:
                    self._error = error
                    self._error_generation = self._generation
                self._generation += 1
                self._cond.notify_all()
            if error is not None:
                raise error

    def reset(self, durable_offset: int, *, truncated_to: int | None = None) -> None:
        """Move the durable point (down, after a truncation); in-flight flushes are void.

        With ``truncated_to`` (the log end after a truncation), waiters for offsets
        above it raise ``OffsetsTruncatedError``.
        """
        with self._cond:
            self.durable_offset = durable_offset
            self._reset_generation += 1
            if truncated_to is not None:
                for token, offset in self._waiting.items():
                    if offset > truncated_to:
                        self._voided[token] = truncated_to
            self._cond.notify_all()

    def advance(self, durable_offset: int) -> None:
        """Everything below ``durable_offset`` was fsynced (a full flush of the log)."""
        with self._cond:
            if durable_offset > self.durable_offset:
                self.durable_offset = durable_offset
                self._cond.notify_all()
