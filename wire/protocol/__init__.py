"""The Strata wire protocol: frames, headers, and every request/response schema.

Shared by the broker and the clients; imports nothing but ``wire.errors``. The byte
layout of every message is in ``docs/protocol.md``.
"""

from wire.protocol.codec import Message, Reader, SendableRegion, decode, encode
from wire.protocol.framing import (
    FRAME_PREFIX,
    encode_request,
    encode_response,
    read_request_header,
    read_response_header,
)
from wire.protocol.messages import *  # noqa: F403
from wire.protocol.messages import __all__ as _messages_all

__all__ = [
    "FRAME_PREFIX",
    "Message",
    "Reader",
    "SendableRegion",
    "decode",
    "encode",
    "encode_request",
    "encode_response",
    "read_request_header",
    "read_response_header",
    *_messages_all,
]
