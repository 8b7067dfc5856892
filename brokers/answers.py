"""Answering each partition of a request on its own, Kafka's way.

Per-partition failures are reported in the partition's ``error_code`` and
``error_message`` (the rest of the request still succeeds); request-level failures
raise, and the network layer answers with the error in the response header. Both the
request handlers (``brokers/handlers/``) and the replica manager
(``brokers/replica_manager.py``) build their answers this way, so the helpers live
below both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from wire.errors import LogStorageError, StrataError

__all__ = ["PartitionAnswer", "answer_each", "error_fields"]


class PartitionAnswer(Protocol):
    """What every per-partition answer carries."""

    error_code: int
    error_message: str | None


_Answer = TypeVar("_Answer", bound=PartitionAnswer)


def error_fields(err: StrataError | None) -> tuple[int, str | None]:
    """``(error_code, error_message)`` of an answer: ``(0, None)`` without an error."""
    return (0, None) if err is None else (err.code, err.message)


def answer_each(topics: Iterable[Any], make: Callable[[int], _Answer],
                act: Callable[[str, Any, _Answer], None], *,
                disk_failure: str | None = None) -> list[tuple[str, list[_Answer]]]:
    """Answer every partition of every topic of a request on its own.

    ``make(partition)`` builds the partition's answer, ``act(topic, part, answer)`` does
    the work and fills it in. A ``StrataError`` from ``act`` becomes that answer's error
    (the other partitions go on), as does an ``OSError`` when ``disk_failure`` says what
    failed (a format string with ``{partition}`` and ``{err}``): a storage error.
    Returns ``(topic name, answers)`` in request order.
    """
    out = []
    for topic in topics:
        answers = []
        for part in topic.partitions:
            answer = make(part.partition)
            try:
                act(topic.name, part, answer)
            except StrataError as err:
                answer.error_code, answer.error_message = error_fields(err)
            except OSError as err:
                if disk_failure is None:
                    raise
                failure = LogStorageError(disk_failure.format(
                    partition=f"{topic.name}-{part.partition}", err=err))
                answer.error_code, answer.error_message = error_fields(failure)
            answers.append(answer)
        out.append((topic.name, answers))
    return out
