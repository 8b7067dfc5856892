"""The Kafka listener's framing: request headers, the versions served, encoded answers.

Bodies are encoded and decoded by kafka-python's ``kafka.protocol`` (generated at import
from Apache Kafka's JSON message schemas, flexible versions and tagged fields included;
docs/dependencies.md says why that library). This module owns what the library leaves
to a server:

* ``VERSIONS``: the API keys and versions this listener serves (the library itself
  would decode any version from 0, so every request is checked against this table
  first). Produce is advertised from 0 but v0-2 are refused, as Kafka 4 does
  (KAFKA-18659: librdkafka turns compression off unless the advertised minimum is 0).
* Request headers: v1 (``client_id`` as a non-compact nullable string) or v2 (the same
  plus tagged fields) by the API's flexible versions; response headers v0 or v1, and
  always v0 for ApiVersions.
* KIP-511: an ApiVersions request of a version above ours is answered in the v0 format
  with UNSUPPORTED_VERSION and our range, which is how clients negotiate down.

Invariant: nothing here raises on bad bytes except ``StrataError`` (the connection then
closes, as Kafka's does on a header it cannot read).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

from kafka.protocol.admin import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from brokers.kafka.fetch_answer import FetchAnswer
from wire.errors import InvalidRequestError
from wire.protocol.codec import Chunk

__all__ = ["API_TYPES", "NOTES", "VERSIONS", "KafkaHeader", "encode_answer", "read_header",
           "unsupported_api_versions"]

#: api key -> (advertised min, advertised max, lowest accepted). Topic-id versions
#: (Produce 13, Fetch 13+, OffsetCommit/OffsetFetch 10) are not served yet: every client
#: negotiates down to the names versions.
VERSIONS: Final[dict[int, tuple[int, int, int]]] = {
    0: (0, 12, 3),  # Produce
    1: (4, 12, 4),  # Fetch
    2: (1, 10, 1),  # ListOffsets
    3: (0, 12, 0),  # Metadata
    8: (2, 9, 2),  # OffsetCommit
    9: (1, 9, 1),  # OffsetFetch
    10: (0, 6, 0),  # FindCoordinator
    11: (0, 9, 0),  # JoinGroup
    12: (0, 4, 0),  # Heartbeat
    13: (0, 5, 0),  # LeaveGroup
    14: (0, 5, 0),  # SyncGroup
    15: (0, 5, 0),  # DescribeGroups
    16: (0, 5, 0),  # ListGroups
    17: (1, 1, 1),  # SaslHandshake
    18: (0, 4, 0),  # ApiVersions
    19: (2, 7, 2),  # CreateTopics
    20: (1, 6, 1),  # DeleteTopics
    22: (0, 5, 0),  # InitProducerId
    23: (2, 4, 2),  # OffsetForLeaderEpoch
    24: (0, 3, 0),  # AddPartitionsToTxn
    25: (0, 3, 0),  # AddOffsetsToTxn
    26: (0, 3, 0),  # EndTxn
    28: (0, 3, 0),  # TxnOffsetCommit
    29: (1, 3, 1),  # DescribeAcls
    30: (1, 3, 1),  # CreateAcls
    31: (1, 3, 1),  # DeleteAcls
    32: (1, 4, 1),  # DescribeConfigs
    36: (0, 2, 0),  # SaslAuthenticate
    42: (0, 2, 0),  # DeleteGroups
    44: (0, 1, 0),  # IncrementalAlterConfigs
    50: (0, 0, 0),  # DescribeUserScramCredentials
    51: (0, 0, 0),  # AlterUserScramCredentials
    60: (0, 1, 0),  # DescribeCluster
    65: (0, 0, 0),  # DescribeTransactions
    66: (0, 1, 0),  # ListTransactions
}

#: What a client should know about an API's served range (docs/kafka-compatibility.md).
NOTES: Final[dict[int, str]] = {
    0: "advertised from v0 for librdkafka's compression check (KAFKA-18659), served from "
       "v3 (v0-2 get UNSUPPORTED_VERSION per partition); v13 (topic ids) not served",
    1: "v13+ (topic ids) not served; consumer fetch sessions (KIP-227) are declined: "
       "session id 0, full fetches",
    3: "v13 (top-level error code) not served; topic ids are not sent",
    8: "v10 (topic ids) not served",
    9: "v10 (topic ids) not served",
    11: "classic protocol on Strata's coordinator: the coordinator assigns (no leader "
        "member)",
    17: "v0's unframed tokens are not served",
    24: "v4+: brokers' batched verification",
    26: "v4+: KIP-890's epoch bump, not served",
    66: "v2's transactional-id pattern is not served",
}

#: api key -> (request class, response class) of kafka.protocol.
API_TYPES: Final[dict[int, tuple[Any, Any]]] = {
    0: (ProduceRequest, ProduceResponse),
    1: (FetchRequest, FetchResponse),
    2: (ListOffsetsRequest, ListOffsetsResponse),
    3: (MetadataRequest, MetadataResponse),
    8: (OffsetCommitRequest, OffsetCommitResponse),
    9: (OffsetFetchRequest, OffsetFetchResponse),
    10: (FindCoordinatorRequest, FindCoordinatorResponse),
    11: (JoinGroupRequest, JoinGroupResponse),
    12: (HeartbeatRequest, HeartbeatResponse),
    13: (LeaveGroupRequest, LeaveGroupResponse),
    14: (SyncGroupRequest, SyncGroupResponse),
    15: (DescribeGroupsRequest, DescribeGroupsResponse),
    16: (ListGroupsRequest, ListGroupsResponse),
    17: (SaslHandshakeRequest, SaslHandshakeResponse),
    18: (ApiVersionsRequest, ApiVersionsResponse),
    19: (CreateTopicsRequest, CreateTopicsResponse),
    20: (DeleteTopicsRequest, DeleteTopicsResponse),
    22: (InitProducerIdRequest, InitProducerIdResponse),
    23: (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
    24: (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),
    25: (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),
    26: (EndTxnRequest, EndTxnResponse),
    28: (TxnOffsetCommitRequest, TxnOffsetCommitResponse),
    29: (DescribeAclsRequest, DescribeAclsResponse),
    30: (CreateAclsRequest, CreateAclsResponse),
    31: (DeleteAclsRequest, DeleteAclsResponse),
    32: (DescribeConfigsRequest, DescribeConfigsResponse),
    36: (SaslAuthenticateRequest, SaslAuthenticateResponse),
    37: (CreatePartitionsRequest, CreatePartitionsResponse),
    42: (DeleteGroupsRequest, DeleteGroupsResponse),
    44: (IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse),
    50: (DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse),
    51: (AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse),
    60: (DescribeClusterRequest, DescribeClusterResponse),
    65: (DescribeTransactionsRequest, DescribeTransactionsResponse),
    66: (ListTransactionsRequest, ListTransactionsResponse),
}

_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_API_VERSIONS: Final = 18


@dataclass(slots=True)
class KafkaHeader:
    """A Kafka request header (v1/v2; tagged fields are read and dropped)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    flexible: bool  # the API's flexible versions: header v2, response header v1


def _uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise InvalidRequestError("request header: truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def read_header(frame: bytes) -> tuple[KafkaHeader, memoryview]:
    """(header, body) of one Kafka request frame (without its size prefix)."""
    data = memoryview(frame)
    if len(data) < _FIXED.size:
        raise InvalidRequestError(f"request header needs {_FIXED.size} bytes, got {len(data)}")
    api_key, api_version, correlation_id, n = _FIXED.unpack_from(data, 0)
    pos = _FIXED.size
    client_id = None
    if n >= 0:
        if pos + n > len(data):
            raise InvalidRequestError("request header: client id runs past the frame")
        try:
            client_id = bytes(data[pos:pos + n]).decode()
        except UnicodeDecodeError:
            raise InvalidRequestError("request header: client id is not UTF-8") from None
        pos += n
    elif n != -1:
        raise InvalidRequestError(f"request header: client id length {n}")
    types = API_TYPES.get(api_key)
    flexible = False
    if types is not None and 0 <= api_version <= types[0].max_version:
        flexible = bool(types[0].flexible_version_q(api_version))
    elif api_key == _API_VERSIONS:
        flexible = api_version >= 3  # a newer ApiVersions: header v2 from v3 on
    if flexible:
        count, pos = _uvarint(data, pos)
        for _ in range(count):
            _, pos = _uvarint(data, pos)
            size, pos = _uvarint(data, pos)
            pos += size
            if pos > len(data):
                raise InvalidRequestError("request header: a tagged field runs past the frame")
    return KafkaHeader(api_key, api_version, correlation_id, client_id, flexible), data[pos:]


def encode_answer(header: KafkaHeader, response: Any) -> list[Chunk]:
    """The framed answer as the chunks the connection writes: size and response header
    (v1 when flexible, v0 for ApiVersions), then the body at the request's version. A
    small answer is one chunk (each chunk is a ``send`` call of its own); a large one
    keeps its body apart rather than copying it behind the head. A ``FetchAnswer``
    (fetch_answer.py) brings its own chunks: its records are never copied here."""
    tagged = header.flexible and header.api_key != _API_VERSIONS
    if isinstance(response, FetchAnswer):
        chunks = response.chunks(header.api_version)
        size = sum(len(c) for c in chunks)
        head = struct.pack(">ii", 4 + size + (1 if tagged else 0), header.correlation_id)
        if tagged:
            head += b"\x00"
        return [head + chunks[0], *chunks[1:]]  # the first chunk is the fields' run
    body: bytes = response.encode(version=header.api_version)
    head = struct.pack(">ii", 4 + len(body) + (1 if tagged else 0), header.correlation_id)
    if tagged:
        head += b"\x00"
    if len(body) < _JOIN_BELOW:
        return [head + body]
    return [head, body]


#: Answers whose body is smaller than this are written as one chunk (a copy this size
#: costs less than a second ``send`` call).
_JOIN_BELOW: Final = 64 * 1024


def unsupported_api_versions(header: KafkaHeader) -> bytes:
    """KIP-511: the v0-format answer to an ApiVersions request of an unknown version."""
    low, high, _ = VERSIONS[_API_VERSIONS]
    body = struct.pack(">hihhh", 35, 1, _API_VERSIONS, low, high)
    return struct.pack(">ii", 4 + len(body), header.correlation_id) + body
