"""The gateway's one HTTP error type, in the Confluent REST Proxy v3 shape, and the
``wire.errors`` mapping.

Every error body is ``{"error_code": <int>, "message": "<what happened and what to do>"}``;
``error_code`` is the HTTP status (as Confluent v3 does for these cases), except for the
auth refusals, which subclass ``HttpError`` in ``_auth`` with their own codes (40101,
40301, 42901).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.client import BufferFullError, DeliveryTimeoutError, ProducerClosedError
from wire import errors as be

__all__ = ["RETRY_AFTER_S", "HttpError", "from_strata_error", "unavailable"]

#: Seconds a 503 asks the client to wait before retrying.
RETRY_AFTER_S = 1

_UNAVAILABLE: tuple[type[be.StrataError], ...] = (
    be.NetworkError, be.BrokerNotAvailableError, be.NotEnoughReplicasError,
    be.NotEnoughReplicasAfterAppendError, be.RequestTimedOutError, be.NotLeaderError,
    be.LogClosedError, be.ConcurrentUpdateError, be.ControllerMovedError,
    be.FencedLeaderEpochError, be.UnknownLeaderEpochError, BufferFullError,
    ProducerClosedError,
    # the schema registry (a typed topic's schema) moving or loading
    be.CoordinatorNotAvailableError, be.CoordinatorLoadInProgressError, be.NotCoordinatorError,
)
_BAD_ADMIN_REQUEST: tuple[type[be.StrataError], ...] = (
    be.InvalidTopicError, be.InvalidPartitionsError, be.InvalidReplicationFactorError,
    be.InvalidConfigError, be.PolicyViolationError,
)


class HttpError(Exception):
    """An answer other than success: ``status``, v3 ``error_code``, ``message``, headers.

    ``not_written`` is True when the record certainly did not reach a broker, so an
    idempotent retry may produce it again instead of replaying this answer.
    """

    def __init__(self, status: int, message: str, *, error_code: int | None = None,
                 headers: Mapping[str, str] | None = None, not_written: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = status if error_code is None else error_code
        self.message = message
        self.headers = dict(headers or {})
        self.not_written = not_written

    def body(self) -> dict[str, Any]:
        return {"error_code": self.error_code, "message": self.message}


def unavailable(message: str, *, not_written: bool = False) -> HttpError:
    return HttpError(503, message, headers={"Retry-After": str(RETRY_AFTER_S)},
                     not_written=not_written)


def from_strata_error(err: BaseException, *, topic: str | None = None,
                      record: str | None = None, sent: bool = True) -> HttpError:
    """Map a client/broker error to an ``HttpError``.

    ``record`` names the record (e.g. ``"entries[3]"``) in messages; ``sent`` is False
    when ``send`` refused the record before it was queued (so nothing was written).
    """
    where = f" ({record})" if record else ""
    if isinstance(err, DeliveryTimeoutError):
        last = err.last_error
        why = f"; last error: {last}" if last is not None else ""
        return unavailable(
            f"the record{where} was not acknowledged in time{why}. It may or may not have "
            f"been written: retry after {RETRY_AFTER_S} s and accept a possible duplicate "
            "(a retry is produced again, also with the same Idempotency-Key)",
            not_written=False)
    if not isinstance(err, be.StrataError):
        return HttpError(500, f"internal error{where}: {type(err).__name__}: {err}; "
                              "see the gateway log")
    if isinstance(err, be.UnknownTopicOrPartitionError):
        name = f"topic {topic!r}" if topic else "the topic or partition"
        return HttpError(404, f"{name} does not exist{where}: create it first "
                              f"(POST /v3/clusters/{{cluster_id}}/topics) or fix the name",
                         not_written=True)
    if isinstance(err, be.RecordTooLargeError):
        return HttpError(413, f"record{where} is too large: {err.message}", not_written=True)
    if isinstance(err, _UNAVAILABLE):
        written = "" if not sent else " It may or may not have been written."
        return unavailable(f"brokers unavailable{where}: [{err.name}] {err.message}.{written} "
                           f"Retry after {RETRY_AFTER_S} s", not_written=not sent)
    if isinstance(err, be.TopicAlreadyExistsError):
        return HttpError(409, err.message)
    if isinstance(err, _BAD_ADMIN_REQUEST):
        return HttpError(400, f"[{err.name}] {err.message}")
    if isinstance(err, be.SchemaNotFoundError):
        return HttpError(404, f"the schema{where} was not found: [{err.name}] {err.message}; "
                              "register the topic's value schema (POST /subjects/"
                              "<topic>-value/versions) and send again", not_written=True)
    if isinstance(err, be.InvalidRecordBatchError):
        return HttpError(422, f"record{where} was rejected: [{err.name}] {err.message}",
                         not_written=True)
    return HttpError(500, f"broker error{where}: [{err.name}] {err.message}")
