"""The Confluent Schema Registry REST API, served by the gateway (docs/typed-topics.md).

The routes are the subset Kafka clients and tools use (``/subjects``,
``/subjects/{subject}/versions``, ``/schemas/ids/{id}``, ``/compatibility/...``,
``/config``), with Confluent's request and response bodies and its error body
``{"error_code": 40401, "message": "..."}`` (the HTTP status is the code's first three
digits). Each route is one ``SchemaRegistry`` request to the broker leading
``__schemas``-0 (``brokers/schema_registry.py``), so every gateway process, and every
gateway of the cluster, sees the same ids.

Auth: the gateway's own (docs/gateway.md). Reading a subject needs ``consume`` on its
topic (TopicNameStrategy: ``orders-value`` belongs to ``orders``), changing it needs
``admin`` on it; global config and subjects outside the strategy are cluster-level.

Thread-safety: the worker's event loop.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ingest_gateway._auth import Action
from ingest_gateway._errors import RETRY_AFTER_S
from ingest_gateway._openapi import LEVEL_BODY, SCHEMA_BODY
from ingest_gateway._openapi import errors as _errors
from ingest_gateway._plan import check_length, check_media
from wire.errors import StrataError
from wire.protocol import SchemaRegistryRequest

if TYPE_CHECKING:  # pragma: no cover
    from ingest_gateway._state import GatewayState

__all__ = ["REGISTRY_MEDIA_TYPE", "install_registry_routes"]

#: Answers are ``application/json``, which Confluent's clients accept as well as its own
#: ``application/vnd.schemaregistry.v1+json`` (also accepted in requests).
REGISTRY_MEDIA_TYPE = "application/json"
_MAX_BODY = 1 << 20  # a schema text is at most 256 KiB (wire.schema); JSON escapes add some
_ERRORS = (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
_TAG: list[str | Enum] = ["schema registry"]
# Path parameters as the registry takes them: a printable subject (as the brokers
# check), a version number or "latest", a positive 32-bit id.
_SUBJECT = Path(pattern=r"^[ -~]{1,255}$", description="e.g. orders-value")
_VERSION = Path(pattern=r"^(latest|-1|[1-9][0-9]{0,8})$", description="a number, or latest (-1)")
_ID = Path(ge=1, le=2**31 - 1)


def _answer(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, media_type=REGISTRY_MEDIA_TYPE)


def _refusal(status: int, code: int, message: str) -> JSONResponse:
    answer = _answer({"error_code": code, "message": message}, status)
    if status == 503:
        answer.headers["Retry-After"] = str(RETRY_AFTER_S)
    return answer


def _version(text: str) -> int:
    """A path's version (``_VERSION`` has checked it): a number, or -1 for latest."""
    return -1 if text == "latest" else int(text)


async def _body(request: Request) -> dict[str, Any] | JSONResponse:
    try:
        check_media(request.headers.get("content-type", ""))
        check_length(request.headers.get("content-length"), _MAX_BODY)
    except Exception as err:  # HttpError: 415 or 413, with its sentence
        status = getattr(err, "status", 400)
        return _refusal(status, status * 100, str(getattr(err, "message", err)))
    raw = await request.body()
    if len(raw) > _MAX_BODY:
        return _refusal(413, 41300, f"the body is larger than {_MAX_BODY} bytes")
    try:
        body = json.loads(raw) if raw else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return _refusal(422, 42201, f"the body is not valid JSON ({err})")
    if not isinstance(body, dict):
        return _refusal(422, 42201, "the body must be a JSON object")
    return body


def install_registry_routes(app: FastAPI, guard: Callable[[Action, bool],
                                                          Callable[..., Awaitable[Any]]],
                            state_of: Callable[[Request], GatewayState]) -> None:
    """Add the registry routes. ``guard(action, by_subject)``: the auth dependency, on
    the subject's topic when ``by_subject`` (else cluster-level)."""
    read_subject = Depends(guard(Action.CONSUME, True))
    change_subject = Depends(guard(Action.ADMIN, True))
    read_cluster = Depends(guard(Action.CONSUME, False))
    change_cluster = Depends(guard(Action.ADMIN, False))

    async def ask(request: Request, registry_request: SchemaRegistryRequest,
                  shape: Callable[[Any], Response] | None = None) -> Response:
        try:
            answer = await state_of(request).admin.schema_request(registry_request)
        except StrataError as err:
            return _refusal(503, 50003, f"the schema registry is not reachable: "
                                        f"{err.message}; retry in {RETRY_AFTER_S} s")
        if answer.error is not None:
            code = answer.registry_code or 50001
            status = code if code < 1000 else int(str(code)[:3])
            if status >= 500:
                status, code = 503, 50003
            return _refusal(status, code, answer.error.message)
        if registry_request.subject is not None and registry_request.operation in (
                "register", "delete_subject", "delete_version"):
            # This process's producers convert under the subject's latest version: a
            # change made here is seen by its next record, not after the cache's TTL.
            state_of(request).admin.schemas.forget_latest(registry_request.subject)
        return shape(answer.body) if shape is not None else _answer(answer.body)

    def schema_request(op: str, subject: str | None, body: dict[str, Any], **extra: Any
                       ) -> SchemaRegistryRequest | JSONResponse:
        schema = body.get("schema")
        schema_type = body.get("schemaType", "AVRO")
        if not isinstance(schema, str) or not isinstance(schema_type, str):
            return _refusal(422, 42201, 'the body needs "schema" (the schema as a JSON '
                                        'string) and optionally "schemaType" (AVRO or JSON)')
        if body.get("references"):
            return _refusal(422, 42201, "schema references are not supported: inline the "
                                        "referenced types")
        return SchemaRegistryRequest(op, subject, schema=schema, schema_type=schema_type,
                                     **extra)

    @app.get("/subjects", tags=_TAG, dependencies=[read_cluster], responses=_errors(*_ERRORS))
    async def list_subjects(request: Request, deleted: bool = Query(False)) -> Response:
        """Every subject with a live version (``deleted=true``: soft-deleted ones too)."""
        return await ask(request, SchemaRegistryRequest("list_subjects",
                                                        include_deleted=deleted))

    @app.get("/subjects/{subject}/versions", tags=_TAG, dependencies=[read_subject],
             responses=_errors(*_ERRORS))
    async def list_versions(request: Request, subject: str = _SUBJECT,
                            deleted: bool = Query(False)) -> Response:
        return await ask(request, SchemaRegistryRequest("list_versions", subject,
                                                        include_deleted=deleted))

    @app.post("/subjects/{subject}/versions", tags=_TAG, dependencies=[change_subject],
              responses=_errors(*_ERRORS), openapi_extra=SCHEMA_BODY)
    async def register(request: Request, subject: str = _SUBJECT) -> Response:
        """Body ``{"schema": "...", "schemaType": "AVRO"|"JSON"}``; answers ``{"id"}``."""
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        built = schema_request("register", subject, body)
        return built if isinstance(built, JSONResponse) else await ask(request, built)

    @app.post("/subjects/{subject}", tags=_TAG, dependencies=[read_subject],
              responses=_errors(*_ERRORS), openapi_extra=SCHEMA_BODY)
    async def lookup(request: Request, subject: str = _SUBJECT, deleted: bool = Query(False)
                     ) -> Response:
        """Whether the schema is registered under the subject, and as which version."""
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        built = schema_request("lookup", subject, body, include_deleted=deleted)
        return built if isinstance(built, JSONResponse) else await ask(request, built)

    @app.get("/subjects/{subject}/versions/{version}", tags=_TAG,
             dependencies=[read_subject], responses=_errors(*_ERRORS))
    async def get_version(request: Request, subject: str = _SUBJECT,
                          version: str = _VERSION,
                          deleted: bool = Query(False)) -> Response:
        number = _version(version)
        return await ask(request, SchemaRegistryRequest("get_version", subject,
                                                        version=number,
                                                        include_deleted=deleted))

    @app.get("/subjects/{subject}/versions/{version}/schema", tags=_TAG,
             dependencies=[read_subject], responses=_errors(*_ERRORS))
    async def get_version_text(request: Request, subject: str = _SUBJECT,
                               version: str = _VERSION) -> Response:
        """The schema text alone."""
        number = _version(version)
        return await ask(request, SchemaRegistryRequest("get_version", subject,
                                                        version=number),
                         lambda body: PlainTextResponse(body["schema"],
                                                        media_type=REGISTRY_MEDIA_TYPE))

    @app.delete("/subjects/{subject}/versions/{version}", tags=_TAG,
                dependencies=[change_subject], responses=_errors(*_ERRORS))
    async def delete_version(request: Request, subject: str = _SUBJECT,
                             version: str = _VERSION,
                             permanent: bool = Query(False)) -> Response:
        number = _version(version)
        return await ask(request, SchemaRegistryRequest("delete_version", subject,
                                                        version=number,
                                                        permanent=permanent))

    @app.delete("/subjects/{subject}", tags=_TAG, dependencies=[change_subject],
                responses=_errors(*_ERRORS))
    async def delete_subject(request: Request, subject: str = _SUBJECT,
                             permanent: bool = Query(False)) -> Response:
        return await ask(request, SchemaRegistryRequest("delete_subject", subject,
                                                        permanent=permanent))

    @app.get("/schemas/ids/{schema_id}", tags=_TAG, dependencies=[read_cluster],
             responses=_errors(*_ERRORS))
    async def by_id(request: Request, schema_id: int = _ID) -> Response:
        return await ask(request, SchemaRegistryRequest("get_by_id", schema_id=schema_id))

    @app.get("/schemas/ids/{schema_id}/versions", tags=_TAG, dependencies=[read_cluster],
             responses=_errors(*_ERRORS))
    async def id_versions(request: Request, schema_id: int = _ID,
                          deleted: bool = Query(False)) -> Response:
        return await ask(request, SchemaRegistryRequest("id_versions", schema_id=schema_id,
                                                        include_deleted=deleted))

    @app.post("/compatibility/subjects/{subject}/versions/{version}", tags=_TAG,
              dependencies=[read_subject], responses=_errors(*_ERRORS),
              openapi_extra=SCHEMA_BODY)
    async def compatibility(request: Request, subject: str = _SUBJECT,
                            version: str = _VERSION,
                            verbose: bool = Query(True)) -> Response:
        """``{"is_compatible", "messages"}``: the messages give each reason."""
        number = _version(version)
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        built = schema_request("check_compatibility", subject, body, version=number)
        if isinstance(built, JSONResponse):
            return built

        def shape(answer: Any) -> Response:
            return _answer(answer if verbose else {"is_compatible": answer["is_compatible"]})

        return await ask(request, built, shape)

    @app.get("/config", tags=_TAG, dependencies=[read_cluster], responses=_errors(*_ERRORS))
    async def get_global_config(request: Request) -> Response:
        return await ask(request, SchemaRegistryRequest("get_config"))

    async def set_level(request: Request, subject: str | None) -> Response:
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        level = body.get("compatibility")
        if not isinstance(level, str):
            return _refusal(422, 42203, 'the body needs "compatibility": a level name')
        return await ask(request, SchemaRegistryRequest("set_config", subject,
                                                        compatibility=level))

    @app.put("/config", tags=_TAG, dependencies=[change_cluster], responses=_errors(*_ERRORS),
             openapi_extra=LEVEL_BODY)
    async def set_global_config(request: Request) -> Response:
        """Body ``{"compatibility": "NONE"|"BACKWARD"|...}``."""
        return await set_level(request, None)

    @app.get("/config/{subject}", tags=_TAG, dependencies=[read_subject],
             responses=_errors(*_ERRORS))
    async def get_subject_config(request: Request, subject: str = _SUBJECT,
                                 defaultToGlobal: bool = Query(False)) -> Response:
        return await ask(request, SchemaRegistryRequest("get_config", subject,
                                                        default_to_global=defaultToGlobal))

    @app.put("/config/{subject}", tags=_TAG, dependencies=[change_subject],
             responses=_errors(*_ERRORS), openapi_extra=LEVEL_BODY)
    async def set_subject_config(request: Request, subject: str = _SUBJECT) -> Response:
        return await set_level(request, subject)

    @app.delete("/config/{subject}", tags=_TAG, dependencies=[change_subject],
                responses=_errors(*_ERRORS))
    async def delete_subject_config(request: Request, subject: str = _SUBJECT) -> Response:
        return await ask(request, SchemaRegistryRequest("delete_config", subject))

