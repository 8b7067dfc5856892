"""The OpenAPI description of what the gateway's routes read and answer.

The produce routes and topic creation read their bodies themselves (streaming, per-record
errors), so FastAPI cannot infer the request bodies: they are declared here as JSON
schemas (``openapi_extra``), as are the answers the routes build by hand. A body the
schema accepts is one the handler accepts (``tests/test_gateway_schema.py`` holds the two
together with schemathesis); what only the cluster can judge (a partition that does not
exist, topic configs, a replication factor above the live brokers, an offset outside the
log) is answered with the documented 4xx.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BATCH_ANSWERS", "BATCH_BODY", "CREATE_TOPIC_BODY", "ERROR_SCHEMA", "LEVEL_BODY",
    "RECORDS_ANSWERS", "RECORD_BODY", "SCHEMA_BODY", "STATUS_TEXT", "errors",
]

#: The Confluent v3 error body every error status answers with.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error_code", "message"],
    "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}},
}

STATUS_TEXT = {
    400: "bad request (topic creation: the brokers refused the name, counts or configs)",
    401: "no or wrong credentials", 403: "the key may not do this",
    404: "unknown cluster id, topic or partition", 409: "the topic already exists",
    413: "request or record too large", 415: "unsupported Content-Type",
    416: "offset outside the partition's log", 422: "invalid field (named in message)",
    429: "rate limited (see Retry-After)",
    503: "brokers unavailable or the gateway is shutting down; retry (Retry-After)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the error statuses a route can answer (docs/gateway.md)."""
    return {status: {"description": STATUS_TEXT[status],
                     "content": {"application/json": {"schema": ERROR_SCHEMA}}}
            for status in statuses}


# ------------------------------------------------------------------------- request bodies
#: Standard base64 with padding (what ``base64.b64decode(validate=True)`` accepts).
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
#: ISO-8601 date-times the gateway accepts, from 1971 on (a conservative pattern: days
#: 01-28 of any month; the gateway also takes other ISO-8601 forms, see docs/gateway.md).
_ISO_TIME = (r"^(?:197[1-9]|19[89][0-9]|[2-9][0-9]{3})-(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
             r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
             r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$")
#: 9999-12-31T23:59:59.999Z in milliseconds (``_codec._MAX_TIMESTAMP_MS``).
_MAX_TIMESTAMP_MS = 253_402_300_799_999

_DATA: dict[str, Any] = {
    "description": "`{type, data}`: BINARY data is base64, STRING data text, JSON data any "
                   "JSON value (type defaults to JSON); null or absent: no key/value",
    "anyOf": [
        {"type": "null"},
        {"type": "object", "additionalProperties": False, "required": ["type"],
         "properties": {"type": {"const": "BINARY"},
                        "data": {"type": ["string", "null"], "pattern": _BASE64}}},
        {"type": "object", "additionalProperties": False, "required": ["type"],
         "properties": {"type": {"const": "STRING"}, "data": {"type": ["string", "null"]}}},
        {"type": "object", "additionalProperties": False,
         "properties": {"type": {"const": "JSON"}, "data": {}}},
    ],
}
_RECORD_PROPERTIES: dict[str, Any] = {
    "partition_id": {"type": ["integer", "null"], "minimum": 0,
                     "description": "default: by key (murmur2), else sticky"},
    "headers": {"type": ["array", "null"], "items": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1},
                       "value": {"type": ["string", "null"], "pattern": _BASE64,
                                 "description": "base64"}}}},
    "key": _DATA,
    "value": _DATA,
    "timestamp": {"description": "create time: ISO-8601 or milliseconds since the epoch "
                                 "(default: now)",
                  "anyOf": [{"type": "null"},
                            {"type": "integer", "minimum": 0, "maximum": _MAX_TIMESTAMP_MS},
                            {"type": "string", "pattern": _ISO_TIME}]},
}
_RECORD: dict[str, Any] = {"type": "object", "additionalProperties": False,
                           "properties": _RECORD_PROPERTIES}
_ENTRY: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {"id": {"type": ["string", "integer"],
                          "description": "echoed in the entry's answer (default: its index)"},
                   **_RECORD_PROPERTIES},
}


def _body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "description": description,
                            "content": {"application/json": {"schema": schema}}}}


RECORD_BODY = _body(_RECORD, "one v3 record; several concatenated in a chunked body is "
                             "streaming mode (docs/gateway.md), answered as NDJSON")
BATCH_BODY = _body({"type": "object", "additionalProperties": False, "required": ["entries"],
                    "properties": {"entries": {"type": "array", "items": {
                        "description": "a record with an optional id; an entry that is not "
                                       "one is answered in the 207's failures (422 naming "
                                       "the field), the others are still produced",
                        "anyOf": [_ENTRY, {}]}}}},
                   "`{entries: [record with an optional id]}`")
CREATE_TOPIC_BODY = _body({
    "type": "object", "required": ["topic_name"],
    "properties": {
        "topic_name": {"type": "string", "pattern": r"^[a-zA-Z0-9._-]{1,249}$",
                       "not": {"anyOf": [{"enum": [".", ".."]}, {"pattern": "^__"}]}},
        "partitions_count": {"type": "integer", "minimum": -1, "maximum": 2**31 - 1,
                             "not": {"const": 0}, "description": "-1: the broker default"},
        "replication_factor": {"type": "integer", "minimum": -1, "maximum": 32767,
                               "not": {"const": 0},
                               "description": "-1: the broker default; at most the live "
                                              "brokers (else 400)"},
        "configs": {"type": "array", "items": {
            "type": "object", "required": ["name", "value"],
            "properties": {"name": {"type": "string"},
                           "value": {"type": ["string", "integer"]}}},
            "description": "topic configs; the brokers judge names and values (else 400)"},
    },
}, "`{topic_name, partitions_count?, replication_factor?, configs?: [{name, value}]}`")

# ------------------------------------------------------------------------- answers
_INFO: dict[str, Any] = {
    "type": ["object", "null"], "required": ["size", "type"],
    "properties": {"size": {"type": "integer"}, "type": {"type": "string"}},
}
_REPORT: dict[str, Any] = {
    "type": "object",
    "required": ["error_code", "cluster_id", "topic_name", "partition_id", "offset",
                 "timestamp", "key", "value"],
    "properties": {
        "error_code": {"type": "integer", "description": "200 written, 202 sent (acks=0)"},
        "cluster_id": {"type": "string"}, "topic_name": {"type": "string"},
        "partition_id": {"type": "integer"},
        "offset": {"type": ["integer", "null"],
                   "description": "null with acks=0: sent, not acknowledged"},
        "timestamp": {"type": ["string", "null"]}, "key": _INFO, "value": _INFO,
    },
}
_NDJSON = {"application/x-ndjson": {"schema": {
    "type": "string", "description": "streaming mode: one delivery report (or v3 error "
                                     "body) per line, in request order"}}}

RECORDS_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "written: the brokers acknowledged the record with the requested "
                         "acks (streaming mode: NDJSON reports)",
          "content": {"application/json": {"schema": _REPORT}, **_NDJSON}},
    202: {"description": "acks=0: sent, NOT acknowledged (offset null); it may be lost",
          "content": {"application/json": {"schema": _REPORT}}},
    **errors(400, 401, 403, 404, 413, 415, 422, 429, 503),
}
BATCH_ANSWERS: dict[int | str, dict[str, Any]] = {
    207: {"description": "one answer per entry, with its id: written (error_code 200), "
                         "sent with acks=0 (202, offset null) or failed (v3 error body)",
          "content": {"application/json": {"schema": {
              "type": "object", "required": ["successes", "failures"],
              "properties": {
                  "successes": {"type": "array", "items": {
                      **_REPORT, "required": [*_REPORT["required"], "id"],
                      "properties": {**_REPORT["properties"], "id": {"type": "string"}}}},
                  "failures": {"type": "array", "items": {
                      **ERROR_SCHEMA, "required": ["error_code", "message", "id"],
                      "properties": {**ERROR_SCHEMA["properties"],
                                     "id": {"type": "string"}}}}}}}}},
    **errors(400, 401, 403, 404, 413, 415, 422, 429, 503),
}


#: Schema registry: a schema to register, look up or check (Confluent's body).
SCHEMA_BODY = _body({
    "type": "object", "required": ["schema"],
    "properties": {
        "schema": {"type": "string", "description": "the schema as JSON text"},
        "schemaType": {"type": "string", "enum": ["AVRO", "JSON"], "default": "AVRO"},
    },
}, "Confluent's body: the schema text (Avro or JSON Schema, docs/typed-topics.md)")
#: Schema registry: a compatibility level to set.
LEVEL_BODY = _body({
    "type": "object", "required": ["compatibility"],
    "properties": {"compatibility": {"type": "string", "enum": [
        "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
        "FULL_TRANSITIVE"]}},
}, "the compatibility level")

