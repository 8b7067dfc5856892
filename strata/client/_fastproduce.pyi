"""Types of ``_fastproduce.c``, the blocking producer's C fast path (see its source)."""

import threading
from array import array
from collections.abc import Callable
from typing import Any

AVAILABLE: bool

class FastProduce:
    slow: Callable[..., None]

    def __init__(self, lock: threading.Lock, sticky_batches: dict[str, Any],
                 clock: Callable[[], int], stamps_type: type,
                 slow: Callable[..., None], /) -> None: ...
    def __call__(self, *args: object, **kwargs: object) -> None: ...

def binary_column(items: list[bytes | None], /) -> tuple[bytes, bytes, bytes | None] | None: ...

def millis(stamps: array[int], /) -> tuple[bytes, int, int]: ...
