"""Small pieces shared by the consumer, the group machinery and the admin client."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from wire.errors import NetworkError, RequestTimedOutError, StrataError, raise_for_code

__all__ = ["TopicPartition", "as_strata_error", "error_from_code", "is_transient",
           "topic_partitions"]


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
