"""Small pieces shared by the consumer, the group machinery and the admin client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from wire.errors import NetworkError, RequestTimedOutError, StrataError, raise_for_code

__all__ = ["IdleTimer", "TopicPartition", "as_strata_error", "error_from_code",
           "is_transient", "topic_partitions"]


class TopicPartition(NamedTuple):
    """One partition of one topic; hashable, so it keys positions and offset maps."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def error_from_code(code: int, message: str | None) -> StrataError:
    """The typed error for a wire ``error_code`` (the same mapping ``raise_for_code`` uses)."""
    try:
        raise_for_code(code, message)
    except StrataError as err:
        return err
    raise ValueError("error code 0 is not an error")


def is_transient(err: BaseException) -> bool:
    """Worth retrying after a metadata refresh and a back-off.

    ``LOG_CLOSED`` (what a broker answers while it shuts a partition down) is retriable;
    ``TimeoutError`` is a request the broker did not answer.
    """
    if isinstance(err, StrataError):
        return err.retriable
    return isinstance(err, TimeoutError)


def as_strata_error(err: BaseException) -> StrataError:
    if isinstance(err, StrataError):
        return err
    if isinstance(err, TimeoutError):
        return RequestTimedOutError("the broker did not answer in time; retry")
    return NetworkError(f"request failed: {err!r}")


def topic_partitions(partitions: Iterable[TopicPartition | tuple[str, int]]
                     ) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    for item in partitions:
        topic, partition = item
        if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"{item!r} is not a (topic, partition) pair with partition >= 0")
        out.append(TopicPartition(topic, partition))
    return out


class IdleTimer:
    """How long polls have come back empty in a row, for loops that stop "once no record
    has arrived for N ms" (``strata consume --timeout-ms``, Kafka's console consumer).

    Only the time spent *inside* empty polls counts: the time the caller spends with the
    records of a poll (printing to a pipe nobody reads yet, writing a file, a Spark task
    consuming what a reader yielded) is not silence, however long it takes. So the loop
    ends only when polls that together waited ``limit_ms`` returned nothing, as Kafka's
    console consumer ends only when one poll that waited the whole interval came back
    empty::

        idle = IdleTimer(timeout_ms)
        while not idle.expired:
            idle.start()
            records = consumer.poll(timeout_ms=200)
            idle.stop(len(records))
            handle(records)        # however long this blocks, it is not silence

    ``limit_ms`` None never expires; 0 expires after the first empty poll. Not
    thread-safe: one loop owns it.
    """

    __slots__ = ("_empty", "_started", "clock", "idle_s", "limit_s")

    def __init__(self, limit_ms: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.limit_s = None if limit_ms is None else limit_ms / 1000
        self.idle_s = 0.0
        self._empty = False  # the last poll came back empty
        self._started: float | None = None

    def start(self) -> None:
        """A poll begins."""
        self._started = self.clock()

    def stop(self, records: int) -> None:
        """The poll that began at ``start`` returned ``records`` records."""
        started, self._started = self._started, None
        self._empty = not records
        if records:
            self.idle_s = 0.0
        elif started is not None:
            self.idle_s += self.clock() - started

    def progress(self) -> None:
        """Something other than a poll made progress (e.g. a read from another store):
        the silence starts again."""
        self.idle_s = 0.0
        self._empty = False

    @property
    def expired(self) -> bool:
        return self.limit_s is not None and self._empty and self.idle_s >= self.limit_s
