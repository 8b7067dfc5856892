"""Frames' headers, and ApiVersions: what every connection speaks first.

A request frame is ``RequestHeader`` then the request body; a response frame is
``ResponseHeader`` then the response body, or an ``ErrorResponse`` when the request
failed as a whole. ``ApiVersions`` says which versions of each API a broker speaks.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from wire.protocol.codec import (
    INT16,
    INT32,
    NULLABLE_STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
    "ApiVersionRange",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "ErrorResponse",
    "RequestHeader",
    "ResponseHeader",
]


# ----------------------------------------------------------------------------- headers


@dataclass(slots=True)
class RequestHeader(Message):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    FIELDS: ClassVar = (
        Field("api_key", INT16),
        Field("api_version", INT16),
        Field("correlation_id", INT32),
        Field("client_id", NULLABLE_STRING),
    )


@dataclass(slots=True)
class ResponseHeader(Message):
    """``error_code`` 0: the API's response body follows. Otherwise the request failed as
    a whole (unsupported API or version, malformed body, or UNKNOWN_SERVER_ERROR for a
    broker fault) and an ``ErrorResponse`` follows."""

    correlation_id: int
    error_code: int = 0
    FIELDS: ClassVar = (Field("correlation_id", INT32), Field("error_code", INT16))


@dataclass(slots=True)
class ErrorResponse(Message):
    """Body after a ``ResponseHeader`` whose ``error_code`` is not 0."""

    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_message", NULLABLE_STRING),)


# ----------------------------------------------------------------------------- ApiVersions


@dataclass(slots=True)
class ApiVersionsRequest(Message):
    """Asks which API versions the broker speaks; the body is empty.

    A request whose version is outside a range in ``ApiVersionsResponse`` fails as a
    whole: the response header carries UNSUPPORTED_VERSION.
    """

    FIELDS: ClassVar = ()


@dataclass(slots=True)
class ApiVersionRange(Message):
    api_key: int
    min_version: int
    max_version: int
    FIELDS: ClassVar = (
        Field("api_key", INT16), Field("min_version", INT16), Field("max_version", INT16)
    )


@dataclass(slots=True)
class ApiVersionsResponse(Message):
    """``error_code`` is always 0; ``apis`` holds one range per API key this broker serves."""

    error_code: int = 0
    apis: list[ApiVersionRange] = field(default_factory=list)
    FIELDS: ClassVar = (Field("error_code", INT16), Field("apis", Array(Struct(ApiVersionRange))))
