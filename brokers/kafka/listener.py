"""The Kafka listener's side of a connection: ``KafkaCodec`` plugs Kafka's headers and
answers into the broker's connection loop (``brokers/network.py``: framing, in-flight
limits, TLS, the SASL login timeout and the metrics are shared with Strata's listeners).

A request that fails as a whole gets Kafka's answer where Kafka has one: an API key this
listener does not serve gets a response header and UNSUPPORTED_VERSION (35), a known API
at a version outside the served range gets its response at that version with 35 in its
top-level error code (KIP-511's v0 format for ApiVersions); a body that does not decode
closes the connection, as Kafka's broker does.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from brokers.kafka.apis import KafkaApis, request_level_code
from brokers.kafka.codec import API_TYPES, KafkaHeader, encode_answer, read_header
from wire.errors import StrataError, UnsupportedVersionError
from wire.protocol.codec import Chunk

if TYPE_CHECKING:
    from brokers.security import Session

__all__ = ["KafkaCodec"]

log = logging.getLogger("strata.brokers.kafka")


class KafkaCodec:
    """``brokers.network.FrameCodec`` for Kafka's protocol (see the module docstring)."""

    #: Kafka's clients take answers in the requests' order (the Java client fails a
    #: connection whose next answer is not for its oldest request).
    ordered = True

    def __init__(self, apis: KafkaApis) -> None:
        self.apis = apis

    def read_header(self, frame: bytes) -> tuple[KafkaHeader, memoryview]:
        return read_header(frame)

    def api_name(self, header: KafkaHeader) -> str:
        types = API_TYPES.get(header.api_key)
        return f"KAFKA_{types[0].__name__.removesuffix('Request')}" if types \
            else "KAFKA_UNKNOWN"

    async def answer(self, header: KafkaHeader, body: memoryview,
                     session: Session) -> list[Chunk] | None:
        return await self.apis.answer(header, body, session)

    def answer_error(self, header: KafkaHeader, err: StrataError | None) -> list[Chunk] | None:
        if not isinstance(err, UnsupportedVersionError):
            return None  # Kafka closes the connection
        types = API_TYPES.get(header.api_key)
        if types is None or not 0 <= header.api_version <= types[1].max_version:
            # No schema to answer in: the response header and the error code alone.
            return [struct.pack(">iih", 6, header.correlation_id, request_level_code(err))]
        response_type = types[1]
        response = response_type()
        if "error_code" in response_type._struct.fields:
            response.error_code = request_level_code(err)
        try:
            return encode_answer(header, response)
        except Exception:  # a response without defaults for every field
            log.info("no %s v%d error answer; closing", response_type.__name__,
                     header.api_version)
            return None
