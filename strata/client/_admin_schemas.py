"""Admin API family: the schema registry (Confluent's Schema Registry calls).

Part of the admin client (``strata.client.admin`` is the face). Each call is one
``SchemaRegistry`` request sent by the admin client's ``SchemaSource`` (to the registry's
broker, retried while it is unreachable) and raises the typed error of a refused call;
``schema_request`` returns the answer, errors inside, as the gateway's routes want it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from strata.client._admin_common import AdminContext
from strata.client._common import error_from_code
from strata.client._schemas import RegisteredSchema, RegistryAnswer, SchemaSource
from wire.protocol import SchemaRegistryRequest

__all__ = [
    "SchemaAdmin",
]


class SchemaAdmin:
    """Subjects, versions, compatibility; typed topics' value subjects."""

    def __init__(self, context: AdminContext, schemas: SchemaSource) -> None:
        self.context = context
        self._cluster = context.cluster
        self.schemas = schemas

    async def schema_request(self, request: SchemaRegistryRequest) -> RegistryAnswer:
        return await self.schemas.ask(request)

    async def register_schema(self, subject: str, schema: str, schema_type: str = "AVRO"
                              ) -> int:
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "register", subject, schema=schema, schema_type=schema_type))).result()
        return int(body["id"])

    async def get_schema(self, subject: str, version: int | Literal["latest"] = "latest",
                         *, include_deleted: bool = False) -> RegisteredSchema:
        number = -1 if version == "latest" else int(version)
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "get_version", subject, version=number, include_deleted=include_deleted))
        ).result()
        return RegisteredSchema(int(body["id"]), body["schema"],
                                body.get("schemaType", "AVRO"), body["subject"],
                                int(body["version"]))

    async def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "get_by_id", schema_id=schema_id))).result()
        return RegisteredSchema(schema_id, body["schema"], body.get("schemaType", "AVRO"))

    async def list_subjects(self, *, include_deleted: bool = False) -> list[str]:
        return list((await self.schemas.ask(SchemaRegistryRequest(
            "list_subjects", include_deleted=include_deleted))).result())

    async def list_schema_versions(self, subject: str, *, include_deleted: bool = False
                                   ) -> list[int]:
        return list((await self.schemas.ask(SchemaRegistryRequest(
            "list_versions", subject, include_deleted=include_deleted))).result())

    async def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        return list((await self.schemas.ask(SchemaRegistryRequest(
            "delete_subject", subject, permanent=permanent))).result())

    async def delete_schema_version(self, subject: str, version: int | Literal["latest"],
                                    *, permanent: bool = False) -> int:
        number = -1 if version == "latest" else int(version)
        return int((await self.schemas.ask(SchemaRegistryRequest(
            "delete_version", subject, version=number, permanent=permanent))).result())

    async def check_schema_compatibility(
            self, subject: str, schema: str, schema_type: str = "AVRO",
            version: int | Literal["latest"] = "latest") -> list[str]:
        number = -1 if version == "latest" else int(version)
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "check_compatibility", subject, version=number, schema=schema,
            schema_type=schema_type))).result()
        return list(body["messages"])

    async def value_subjects(self, names: Iterable[str]) -> dict[str, str | None]:
        wanted = list(names)
        if not wanted:
            return {}
        response = await self._cluster.refresh(wanted)
        out: dict[str, str | None] = {}
        for topic in response.topics:
            if topic.error_code:
                raise error_from_code(topic.error_code, f"topic {topic.name!r}: not "
                                      "described (it does not exist, or this principal "
                                      "may not DESCRIBE it)")
            out[topic.name] = topic.value_subject
        return out

    async def get_compatibility(self, subject: str | None = None) -> str:
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "get_config", subject, default_to_global=True))).result()
        return str(body["compatibilityLevel"])

    async def set_compatibility(self, level: str, subject: str | None = None) -> str:
        body = (await self.schemas.ask(SchemaRegistryRequest(
            "set_config", subject, compatibility=level))).result()
        return str(body["compatibility"])
