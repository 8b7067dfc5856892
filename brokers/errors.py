"""Typed errors shared by the log, the broker and the clients.

Every error a user can hit has a stable numeric ``code`` (sent on the wire by the
protocol), a symbolic ``name`` and a message that says what happened *and what to
do*. Codes never change meaning once released; new errors take new codes.

The numbering follows Kafka's where an equivalent exists, so operators who know
Kafka's error table can read ours.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "CorruptRecordError",
    "InvalidRecordBatchError",
    "InvalidConfigError",
    "LogStorageError",
    "LogClosedError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "StrataError",
    "error_for_code",
]


class StrataError(Exception):
    """Base class: ``code`` and ``name`` identify the error on the wire and in logs."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.name}] {self.message}"


class OffsetOutOfRangeError(StrataError):
    """An offset outside ``[log_start_offset, log_end_offset]`` was asked for.

    Carries the valid range so a caller can reset to one of its ends.
    """

    code = 1
    name = "OFFSET_OUT_OF_RANGE"

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        super().__init__(
            f"offset {offset} is outside the log's range [{log_start_offset}, {log_end_offset}]; "
            f"seek to an offset in that range (earliest={log_start_offset}, "
            f"latest={log_end_offset})"
        )


class CorruptRecordError(StrataError):
    """Bytes already in the log fail validation (bad CRC, bad length, broken offsets).

    Raised when stored data is found damaged: names the segment file and byte
    position so an operator can inspect it or restore the replica.
    """

    code = 2
    name = "CORRUPT_MESSAGE"

    def __init__(self, message: str, *, segment: str | None = None, position: int | None = None,
                 offset: int | None = None) -> None:
        self.segment = segment
        self.position = position
        self.offset = offset
        where = ""
        if segment is not None:
            where = f" in segment {segment} at byte {position}"
            if offset is not None:
                where += f" (batch base offset {offset})"
        super().__init__(
            f"{message}{where}; the stored data is damaged: restore this partition from a "
            "replica or truncate the log at that position"
        )


class InvalidRecordBatchError(StrataError):
    """A batch offered for append or decoding is malformed; nothing was written."""

    code = 87
    name = "INVALID_RECORD"


class RecordTooLargeError(StrataError):
    """A batch is larger than the configured ``max.message.bytes``; nothing was written."""

    code = 10
    name = "MESSAGE_TOO_LARGE"


class InvalidConfigError(StrataError):
    """A configuration key is unknown or its value is out of range."""

    code = 40
    name = "INVALID_CONFIG"


class LogStorageError(StrataError):
    """The disk failed under the log (write or fsync error); the log refuses further writes."""

    code = 56
    name = "STORAGE_ERROR"


class LogClosedError(StrataError):
    """The log was closed (shutdown or deletion) while an operation was pending."""

    code = 57
    name = "LOG_DIR_NOT_FOUND"


_BY_CODE: dict[int, type[StrataError]] = {
    cls.code: cls
    for cls in (
        StrataError,
        OffsetOutOfRangeError,
        CorruptRecordError,
        InvalidRecordBatchError,
        RecordTooLargeError,
        InvalidConfigError,
        LogStorageError,
        LogClosedError,
    )
}


def error_for_code(code: int) -> type[StrataError]:
    """The error class for a wire code (``StrataError`` for codes this build does not know)."""
    return _BY_CODE.get(code, StrataError)
