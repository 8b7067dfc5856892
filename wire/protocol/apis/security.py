"""Security: SASL login, SCRAM users, ACLs and client quotas.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from wire.protocol.codec import (
    BOOL,
    BYTES,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    Array,
    Field,
    Message,
    Struct,
)

__all__ = [
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "ScramCredentialInfo",
    "DescribeUserScramCredentialsRequest",
    "UserScramCredentials",
    "DescribeUserScramCredentialsResponse",
    "ScramCredentialDeletion",
    "ScramCredentialUpsertion",
    "AlterUserScramCredentialsRequest",
    "AlterUserScramCredentialsResult",
    "AlterUserScramCredentialsResponse",
    "AclEntry",
    "AclFilterEntry",
    "AclResult",
    "CreateAclsRequest",
    "CreateAclsResponse",
    "DescribeAclsRequest",
    "DescribeAclsResponse",
    "DeleteAclsRequest",
    "DeleteAclsResult",
    "DeleteAclsResponse",
    "QuotaValue",
    "QuotaEntry",
    "DescribeClientQuotasRequest",
    "DescribeClientQuotasResponse",
    "QuotaAlteration",
    "AlterClientQuotasRequest",
    "AlterClientQuotasResponse",
]


# ----------------------------------------------------------------------------- SASL
#
# Kafka's flow: on a SASL_PLAINTEXT or SASL_SSL listener a connection may send only
# ApiVersions, SaslHandshake and SaslAuthenticate until it is authenticated; anything
# else, or a handshake after authentication, is ILLEGAL_SASL_STATE and the broker closes
# the connection. SaslHandshake picks the mechanism; SaslAuthenticate carries the
# mechanism's messages (one for PLAIN, two for SCRAM).


@dataclass(slots=True)
class SaslHandshakeRequest(Message):
    """``mechanism``: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""

    mechanism: str
    FIELDS: ClassVar = (Field("mechanism", STRING),)


@dataclass(slots=True)
class SaslHandshakeResponse(Message):
    """``mechanisms``: what this listener offers (also on UNSUPPORTED_SASL_MECHANISM)."""

    error_code: int
    mechanisms: list[str] = field(default_factory=list)
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("mechanisms", Array(STRING)),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class SaslAuthenticateRequest(Message):
    """One message of the mechanism chosen by SaslHandshake."""

    auth_bytes: bytes
    FIELDS: ClassVar = (Field("auth_bytes", BYTES),)


@dataclass(slots=True)
class SaslAuthenticateResponse(Message):
    """The mechanism's answer. ``session_lifetime_ms`` (once authenticated, 0: none):
    the broker closes the connection after that long (``connections.max.reauth.ms``),
    so a deleted user or changed password takes effect on open connections too.
    Errors: SASL_AUTHENTICATION_FAILED (the connection is closed after the answer),
    ILLEGAL_SASL_STATE."""

    error_code: int
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("auth_bytes", BYTES),
        Field("session_lifetime_ms", INT64),
    )


@dataclass(slots=True)
class ScramCredentialInfo(Message):
    mechanism: str
    iterations: int
    FIELDS: ClassVar = (Field("mechanism", STRING), Field("iterations", INT32))


@dataclass(slots=True)
class DescribeUserScramCredentialsRequest(Message):
    """``users`` null: every user with a SCRAM credential."""

    users: list[str] | None
    FIELDS: ClassVar = (Field("users", Array(STRING, nullable=True)),)


@dataclass(slots=True)
class UserScramCredentials(Message):
    """One user's credentials (mechanism and iterations only: never a key or salt).
    RESOURCE_NOT_FOUND (91) when the user has none."""

    user: str
    error_code: int
    error_message: str | None = None
    credentials: list[ScramCredentialInfo] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("user", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("credentials", Array(Struct(ScramCredentialInfo))),
    )


@dataclass(slots=True)
class DescribeUserScramCredentialsResponse(Message):
    users: list[UserScramCredentials]
    FIELDS: ClassVar = (Field("users", Array(Struct(UserScramCredentials))),)


@dataclass(slots=True)
class ScramCredentialDeletion(Message):
    user: str
    mechanism: str
    FIELDS: ClassVar = (Field("user", STRING), Field("mechanism", STRING))


@dataclass(slots=True)
class ScramCredentialUpsertion(Message):
    """As Kafka's AlterUserScramCredentials: the client sends the salt and the salted
    password (PBKDF2 of the password), never the password; the broker derives and
    stores StoredKey and ServerKey from it."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes
    FIELDS: ClassVar = (
        Field("user", STRING),
        Field("mechanism", STRING),
        Field("iterations", INT32),
        Field("salt", BYTES),
        Field("salted_password", BYTES),
    )


@dataclass(slots=True)
class AlterUserScramCredentialsRequest(Message):
    deletions: list[ScramCredentialDeletion] = field(default_factory=list)
    upsertions: list[ScramCredentialUpsertion] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("deletions", Array(Struct(ScramCredentialDeletion))),
        Field("upsertions", Array(Struct(ScramCredentialUpsertion))),
    )


@dataclass(slots=True)
class AlterUserScramCredentialsResult(Message):
    user: str
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (
        Field("user", STRING),
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
    )


@dataclass(slots=True)
class AlterUserScramCredentialsResponse(Message):
    """One result per user named (deletions and upsertions of one user share it)."""

    results: list[AlterUserScramCredentialsResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(AlterUserScramCredentialsResult))),)


# ----------------------------------------------------------------------------- ACLs


@dataclass(slots=True)
class AclEntry(Message):
    """One ACL binding (Kafka's names): ``resource_type`` TOPIC, GROUP or CLUSTER;
    ``pattern_type`` LITERAL or PREFIXED; ``principal`` ``User:<name>`` or ``User:*``;
    ``host`` an address or ``*``; ``operation`` ALL, READ, WRITE, CREATE, DELETE, ALTER,
    DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS or IDEMPOTENT_WRITE;
    ``permission`` ALLOW or DENY."""

    resource_type: str
    pattern_type: str
    resource_name: str
    principal: str
    host: str
    operation: str
    permission: str
    FIELDS: ClassVar = (
        Field("resource_type", STRING),
        Field("pattern_type", STRING),
        Field("resource_name", STRING),
        Field("principal", STRING),
        Field("host", STRING),
        Field("operation", STRING),
        Field("permission", STRING),
    )


@dataclass(slots=True)
class AclFilterEntry(Message):
    """Which bindings: a null field matches any value; ``pattern_type`` MATCH takes every
    pattern that applies to ``resource_name`` (LITERAL, ``*`` and PREFIXED)."""

    resource_type: str | None = None
    pattern_type: str | None = None
    resource_name: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None
    FIELDS: ClassVar = (
        Field("resource_type", NULLABLE_STRING),
        Field("pattern_type", NULLABLE_STRING),
        Field("resource_name", NULLABLE_STRING),
        Field("principal", NULLABLE_STRING),
        Field("host", NULLABLE_STRING),
        Field("operation", NULLABLE_STRING),
        Field("permission", NULLABLE_STRING),
    )


@dataclass(slots=True)
class CreateAclsRequest(Message):
    """Needs ALTER on the CLUSTER. Every binding is checked first; a bad one is refused
    (INVALID_REQUEST) and only the good ones are added."""

    creations: list[AclEntry]
    FIELDS: ClassVar = (Field("creations", Array(Struct(AclEntry))),)


@dataclass(slots=True)
class AclResult(Message):
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_code", INT16), Field("error_message", NULLABLE_STRING))


@dataclass(slots=True)
class CreateAclsResponse(Message):
    """One result per creation, in order."""

    results: list[AclResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(AclResult))),)


@dataclass(slots=True)
class DescribeAclsRequest(Message):
    """Needs DESCRIBE on the CLUSTER."""

    filter: AclFilterEntry
    FIELDS: ClassVar = (Field("filter", Struct(AclFilterEntry)),)


@dataclass(slots=True)
class DescribeAclsResponse(Message):
    error_code: int
    error_message: str | None = None
    acls: list[AclEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("acls", Array(Struct(AclEntry))),
    )


@dataclass(slots=True)
class DeleteAclsRequest(Message):
    """Needs ALTER on the CLUSTER; each filter removes every binding it matches."""

    filters: list[AclFilterEntry]
    FIELDS: ClassVar = (Field("filters", Array(Struct(AclFilterEntry))),)


@dataclass(slots=True)
class DeleteAclsResult(Message):
    error_code: int
    error_message: str | None = None
    deleted: list[AclEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("deleted", Array(Struct(AclEntry))),
    )


@dataclass(slots=True)
class DeleteAclsResponse(Message):
    results: list[DeleteAclsResult]
    FIELDS: ClassVar = (Field("results", Array(Struct(DeleteAclsResult))),)


# ----------------------------------------------------------------------------- client quotas


@dataclass(slots=True)
class QuotaValue(Message):
    """``key``: producer_byte_rate, consumer_byte_rate (bytes/s) or request_rate
    (requests/s)."""

    key: str
    value: int
    FIELDS: ClassVar = (Field("key", STRING), Field("value", INT64))


@dataclass(slots=True)
class QuotaEntry(Message):
    """The quotas of one entity: ``user`` or ``client_id`` (the other null);
    ``<default>`` is the default for every user or client id."""

    user: str | None
    client_id: str | None
    values: list[QuotaValue]
    FIELDS: ClassVar = (
        Field("user", NULLABLE_STRING),
        Field("client_id", NULLABLE_STRING),
        Field("values", Array(Struct(QuotaValue))),
    )


@dataclass(slots=True)
class DescribeClientQuotasRequest(Message):
    """Every quota set; needs DESCRIBE on the cluster."""

    FIELDS: ClassVar = ()


@dataclass(slots=True)
class DescribeClientQuotasResponse(Message):
    error_code: int
    error_message: str | None = None
    entries: list[QuotaEntry] = field(default_factory=list)
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("entries", Array(Struct(QuotaEntry))),
    )


@dataclass(slots=True)
class QuotaAlteration(Message):
    """Set ``key`` of the entity to ``value`` (``remove``: drop it)."""

    user: str | None
    client_id: str | None
    key: str
    value: int = 0
    remove: bool = False
    FIELDS: ClassVar = (
        Field("user", NULLABLE_STRING),
        Field("client_id", NULLABLE_STRING),
        Field("key", STRING),
        Field("value", INT64),
        Field("remove", BOOL),
    )


@dataclass(slots=True)
class AlterClientQuotasRequest(Message):
    """Needs ALTER on the cluster; every alteration is checked before any is stored."""

    alterations: list[QuotaAlteration]
    FIELDS: ClassVar = (Field("alterations", Array(Struct(QuotaAlteration))),)


@dataclass(slots=True)
class AlterClientQuotasResponse(Message):
    error_code: int
    error_message: str | None = None
    FIELDS: ClassVar = (Field("error_code", INT16), Field("error_message", NULLABLE_STRING))
