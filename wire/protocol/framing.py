"""Frames: an int32 size prefix, then a header, then a body.

The client and the broker share these helpers; neither knows the other's internals.
``MAX_FRAME_BYTES`` defaults match ``socket.request.max.bytes`` (100 MiB): a size
prefix above the limit, or below the smallest header, is rejected before any
allocation for the frame is made.
"""

from __future__ import annotations

import struct
from typing import Final

from wire.errors import InvalidRequestError
from wire.protocol.codec import (
    Chunk,
    Message,
    Reader,
    Writer,
    decode,
    encode_chunks,
    join_chunks,
    write_message,
)
from wire.protocol.messages import RequestHeader, ResponseHeader

__all__ = [
    "FRAME_PREFIX",
    "MIN_REQUEST_FRAME",
    "encode_request",
    "encode_response",
    "read_request_header",
    "read_response_header",
]

FRAME_PREFIX: Final = struct.Struct(">i")
# api_key(2) + api_version(2) + correlation_id(4) + client_id length(2)
MIN_REQUEST_FRAME: Final = 10


def encode_request(header: RequestHeader, body: Message) -> bytes:
    """A whole request frame, size prefix included."""

    def prefix(w: Writer) -> None:
        write_message(w, header, 0)

    size, chunks = encode_chunks(prefix, body, header.api_version)
    return join_chunks([FRAME_PREFIX.pack(size), *chunks])


def encode_response(correlation_id: int, body: Message, version: int, error_code: int = 0
                    ) -> list[Chunk]:
    """A whole response frame as chunks (byte strings and file regions to sendfile)."""

    def prefix(w: Writer) -> None:
        w.write(FRAME_PREFIX.pack(0))  # patched below once the size is known
        write_message(w, ResponseHeader(correlation_id, error_code), 0)

    size, chunks = encode_chunks(prefix, body, version)
    first = chunks[0]
    assert isinstance(first, bytes)
    chunks[0] = FRAME_PREFIX.pack(size - FRAME_PREFIX.size) + first[FRAME_PREFIX.size:]
    return chunks


def read_request_header(frame: bytes | bytearray | memoryview) -> tuple[RequestHeader, Reader]:
    """Decode the header of a request frame (size prefix already removed)."""
    if len(frame) < MIN_REQUEST_FRAME:
        raise InvalidRequestError(f"request frame of {len(frame)} bytes is shorter than a header")
    reader = Reader(frame)
    header = decode(RequestHeader, reader, exact=False)
    return header, reader


def read_response_header(frame: bytes | bytearray | memoryview) -> tuple[ResponseHeader, Reader]:
    reader = Reader(frame)
    header = decode(ResponseHeader, reader, exact=False)
    return header, reader
