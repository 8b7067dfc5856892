"""The schema registry: one SchemaRegistry API carrying Confluent's calls.

Part of ``wire.protocol.messages`` (one module per API family; that module keeps
the registry of API keys and versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from wire.protocol.codec import (
    BOOL,
    INT16,
    INT32,
    NULLABLE_LONG_STRING,
    NULLABLE_STRING,
    STRING,
    Field,
    Message,
)

__all__ = [
    "SCHEMA_OPERATIONS",
    "SCHEMAS_TOPIC",
    "SchemaRegistryRequest",
    "SchemaRegistryResponse",
]


#: The internal topic the schema registry is stored in (its partition 0's leader serves
#: it); brokers create it, clients look its leader up.
SCHEMAS_TOPIC: Final = "__schemas"

#: SchemaRegistryRequest.operation values, each one Confluent Schema Registry call (the
#: gateway's REST routes map onto them one to one; docs/typed-topics.md).
SCHEMA_OPERATIONS: Final = (
    "register",            # POST /subjects/{subject}/versions
    "lookup",              # POST /subjects/{subject}
    "list_subjects",       # GET /subjects
    "list_versions",       # GET /subjects/{subject}/versions
    "get_version",         # GET /subjects/{subject}/versions/{version}
    "delete_subject",      # DELETE /subjects/{subject}
    "delete_version",      # DELETE /subjects/{subject}/versions/{version}
    "get_by_id",           # GET /schemas/ids/{id}
    "id_versions",         # GET /schemas/ids/{id}/versions
    "check_compatibility",  # POST /compatibility/subjects/{subject}/versions/{version}
    "get_config",          # GET /config, GET /config/{subject}
    "set_config",          # PUT /config, PUT /config/{subject}
    "delete_config",       # DELETE /config/{subject}
    "subject_schemas",     # brokers and clients: every version of a subject, with its text
)


@dataclass(slots=True)
class SchemaRegistryRequest(Message):
    """One schema registry operation, answered by the broker that leads ``__schemas``
    partition 0 (any other broker answers NOT_COORDINATOR: look the leader up in the
    metadata of ``__schemas`` and retry there; COORDINATOR_NOT_AVAILABLE while the topic
    is being created).

    ``version``: -1 the latest, 0 not given. ``schema_id``: 0 not given. ``subject``
    null with get/set_config: the global setting. ``permanent``: a hard delete (the
    version must be soft-deleted first, as Confluent's). ``include_deleted``: list
    soft-deleted subjects and versions too. ``default_to_global``: get_config of a
    subject without its own setting answers the global one (else SCHEMA_NOT_FOUND, 40408).

    Errors: INVALID_SCHEMA, INCOMPATIBLE_SCHEMA, SCHEMA_NOT_FOUND, INVALID_REQUEST (an
    unknown operation or compatibility level), the coordinator errors, and
    TOPIC/CLUSTER_AUTHORIZATION_FAILED (reads need DESCRIBE and writes ALTER on the
    subject's topic, ``<topic>-value``/``<topic>-key``, or on the cluster).
    """

    operation: str
    subject: str | None = None
    version: int = 0
    schema_id: int = 0
    schema: str | None = None
    schema_type: str | None = None
    compatibility: str | None = None
    permanent: bool = False
    include_deleted: bool = False
    default_to_global: bool = False
    FIELDS: ClassVar = (
        Field("operation", STRING),
        Field("subject", NULLABLE_STRING),
        Field("version", INT32),
        Field("schema_id", INT32),
        Field("schema", NULLABLE_LONG_STRING),
        Field("schema_type", NULLABLE_STRING),
        Field("compatibility", NULLABLE_STRING),
        Field("permanent", BOOL),
        Field("include_deleted", BOOL),
        Field("default_to_global", BOOL),
    )


@dataclass(slots=True)
class SchemaRegistryResponse(Message):
    """``body``: the answer as the JSON Confluent's REST API returns for the operation.
    ``registry_code``: Confluent's error code on an error (40401 subject not found,
    40402 version not found, 40403 schema not found, 40404/40405/40406/40407 delete
    states, 40408 no subject config, 409 incompatible, 42201 invalid schema, 42202
    invalid version, 42203 invalid compatibility level), 0 otherwise; its first three
    digits are the HTTP status the gateway answers with."""

    error_code: int
    error_message: str | None = None
    registry_code: int = 0
    body: str | None = None
    FIELDS: ClassVar = (
        Field("error_code", INT16),
        Field("error_message", NULLABLE_STRING),
        Field("registry_code", INT32),
        Field("body", NULLABLE_LONG_STRING),
    )
