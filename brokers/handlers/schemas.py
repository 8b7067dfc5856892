"""The schema registry API (SchemaRegistry, docs/typed-topics.md).

Thin over ``brokers/schema_registry.py``, which answers on the broker leading
``__schemas``-0 (and passes the request there from any other); this family checks the
rights: ALTER (writes) or DESCRIBE (reads) on the subject's topic or on the cluster, and
forgets the produce path's cached verdicts after a write.
"""

from __future__ import annotations

from brokers.acl import CLUSTER_NAME
from brokers.handlers.context import (
    ApiContext,
    ApiFamily,
    Handler,
    current_session,
)
from wire.errors import (
    ClusterAuthorizationFailedError,
    InvalidRequestError,
    TopicAuthorizationFailedError,
)
from wire.protocol import (
    ApiKey,
    SchemaRegistryRequest,
    SchemaRegistryResponse,
)
from wire.schema import subject_topic

__all__ = ["SchemaRegistryApis"]


class SchemaRegistryApis(ApiFamily):
    """The schema registry API, over the broker's registry."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.schemas = context.schemas
        self.schema_check = context.schema_check

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.SCHEMA_REGISTRY: self.schema_registry,
        }

    async def schema_registry(self, request: SchemaRegistryRequest) -> SchemaRegistryResponse:
        writes = request.operation in ("register", "delete_subject", "delete_version",
                                       "set_config", "delete_config")
        operation = "ALTER" if writes else "DESCRIBE"
        topic = subject_topic(request.subject) if request.subject else None
        if not ((topic is not None and self._allowed(operation, "TOPIC", topic, audit=False))
                or self._allowed(operation, "CLUSTER", CLUSTER_NAME, audit=topic is None)):
            if topic is not None:
                self._allowed(operation, "TOPIC", topic)  # writes the audit line
            principal = current_session().principal
            err = TopicAuthorizationFailedError(
                f"{principal} may not {operation} subject {request.subject!r}: allow "
                f"{operation} on topic {topic!r} or on the cluster (`strata acl add`)"
            ) if topic is not None else ClusterAuthorizationFailedError(
                f"{principal} may not {operation} the schema registry: allow {operation} "
                "on the cluster (`strata acl add ... --cluster`)")
            return SchemaRegistryResponse(err.code, err.message, 40301)
        if self.schemas is None:
            err2 = InvalidRequestError("this broker has no schema registry; upgrade it")
            return SchemaRegistryResponse(err2.code, err2.message, 50001)
        answer = await self.schemas.handle(request, client_id=current_session().client_id)
        if writes and answer.error_code == 0 and self.schema_check is not None:
            self.schema_check.forget()
        return answer
