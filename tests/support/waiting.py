"""Polling with a deadline, for tests that wait on another process's state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], done: Callable[[T], bool],
             timeout: float = 60.0, interval: float = 0.1) -> T:
    """Poll ``probe`` every ``interval`` s until ``done(value)``; fail naming ``what`` and
    the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {timeout:.0f}s")
        time.sleep(interval)
