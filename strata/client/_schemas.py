"""The client's side of the schema registry: routing its requests, caching schemas.

The registry lives on the broker that leads ``__schemas``-0 (``brokers/schema_registry.py``).
``SchemaSource`` finds that broker in the metadata, sends there, and on a moved leader,
a topic still being created or a lost connection looks it up again and retries until
the request timeout. Ids are immutable, so a schema fetched by id is cached for good;
a subject's latest version is cached for ``LATEST_TTL_S`` (a producer picks up a new
version that soon, or at once after the broker refuses its batch).

Thread-safety: one event loop (the client's); the synchronous faces run it on theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from strata.client._cluster import Cluster
from strata.client._common import as_strata_error, error_from_code, is_transient
from wire.errors import (
    CoordinatorNotAvailableError,
    InvalidRecordBatchError,
    InvalidSchemaError,
    StrataError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    SCHEMAS_TOPIC,
    ApiKey,
    SchemaRegistryRequest,
    SchemaRegistryResponse,
)
from wire.schema import (
    ParsedSchema,
    SchemaType,
    confluent_frame,
    parse_schema,
    records_to_arrow,
    resolve,
    table_to_arrow,
    to_avro_bodies,
    to_json_values,
)

__all__ = ["LATEST_TTL_S", "RegisteredSchema", "SchemaSource", "TopicSchemas",
           "TypedReader", "TypedValue", "MissingSchemas", "typed_column"]

LATEST_TTL_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """One version of a subject (``subject``/``version`` None for a look-up by id)."""

    schema_id: int
    schema: str
    schema_type: str
    subject: str | None = None
    version: int | None = None

    def parsed(self) -> ParsedSchema:
        return parse_schema(self.schema, self.schema_type)


class RegistryAnswer:
    """A registry answer: the JSON body, or the error with Confluent's code."""

    __slots__ = ("body", "error", "registry_code")

    def __init__(self, response: SchemaRegistryResponse) -> None:
        self.registry_code = response.registry_code
        self.error = None if response.error_code == 0 else \
            error_from_code(response.error_code, response.error_message)
        self.body: Any = None if response.body is None else json.loads(response.body)

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.body


class SchemaSource:
    """Sends registry requests to the registry's broker and caches what it answers."""

    def __init__(self, cluster: Cluster, *, request_timeout_ms: int,
                 retry_backoff_ms: int) -> None:
        self.cluster = cluster
        self.request_timeout_s = request_timeout_ms / 1000
        self.retry_backoff_ms = retry_backoff_ms
        self._by_id: dict[int, ParsedSchema] = {}
        self._latest: dict[str, tuple[float, int, ParsedSchema]] = {}

    async def ask(self, request: SchemaRegistryRequest) -> RegistryAnswer:
        """The registry's answer to ``request`` (errors inside it, not raised, except a
        registry that stays unreachable past the request timeout)."""
        deadline = time.monotonic() + self.request_timeout_s
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                response = await asyncio.wait_for(self._send(request), remaining)
                assert isinstance(response, SchemaRegistryResponse)
                answer = RegistryAnswer(response)
                if answer.error is None or not answer.error.retriable:
                    return answer
                error: StrataError = answer.error
            except (StrataError, TimeoutError) as err:
                error = as_strata_error(err)
                if not is_transient(error) and not isinstance(
                        error, UnknownTopicOrPartitionError):
                    raise error from None
                with contextlib.suppress(StrataError):  # the leader may have moved
                    await self.cluster.partitions_for(SCHEMAS_TOPIC, refresh=True)
            if time.monotonic() >= deadline:
                if isinstance(error, UnknownTopicOrPartitionError):
                    raise CoordinatorNotAvailableError(
                        f"the schema registry's topic {SCHEMAS_TOPIC} is not available "
                        f"({error.message}); check that the brokers are up") from None
                raise error
            await self.cluster.backoff(attempt)
            attempt += 1

    async def _send(self, request: SchemaRegistryRequest) -> object:
        try:
            leader = await self.cluster.leader_for(SCHEMAS_TOPIC, 0)
        except (UnknownTopicOrPartitionError, TopicAuthorizationFailedError):
            # Not created yet (any broker creates it on a registry request, answering
            # COORDINATOR_NOT_AVAILABLE meanwhile), or hidden from this principal: any
            # broker passes the request on to the registry's leader.
            return await self.cluster.send_any(ApiKey.SCHEMA_REGISTRY, request)
        connection = await self.cluster.connection(leader)
        response = await connection.request(ApiKey.SCHEMA_REGISTRY, request)
        if isinstance(response, SchemaRegistryResponse) and response.error_code and \
                error_from_code(response.error_code, None).retriable:
            await self.cluster.partitions_for(SCHEMAS_TOPIC, refresh=True)
        return response

    # ------------------------------------------------------------------ cached look-ups
    def cached(self, schema_id: int) -> ParsedSchema | None:
        """The schema of ``schema_id`` if it is cached (no request)."""
        return self._by_id.get(schema_id)

    async def by_id(self, schema_id: int) -> ParsedSchema:
        parsed = self._by_id.get(schema_id)
        if parsed is None:
            body = (await self.ask(SchemaRegistryRequest("get_by_id", schema_id=schema_id)
                                   )).result()
            parsed = self._by_id[schema_id] = parse_schema(
                body["schema"], body.get("schemaType", "AVRO"))
        return parsed

    async def learn_subject(self, subject: str) -> None:
        """Cache every version of ``subject`` by id, soft-deleted ones included (their
        data may still be in the log). Scoped to the subject, so DESCRIBE on its topic
        is enough, where a look-up by id needs DESCRIBE on the cluster."""
        body = (await self.ask(SchemaRegistryRequest("subject_schemas", subject,
                                                     include_deleted=True))).result()
        for entry in body:
            if int(entry["id"]) not in self._by_id:
                self._by_id[int(entry["id"])] = parse_schema(entry["schema"],
                                                             entry["schemaType"])

    async def latest(self, subject: str, *, refresh: bool = False
                     ) -> tuple[int, ParsedSchema]:
        """The subject's latest live version: (schema id, schema)."""
        cached = self._latest.get(subject)
        if cached is not None and not refresh and time.monotonic() - cached[0] < LATEST_TTL_S:
            return cached[1], cached[2]
        body = (await self.ask(SchemaRegistryRequest("get_version", subject, version=-1))
                ).result()
        schema_id = int(body["id"])
        parsed = self._by_id.get(schema_id) or parse_schema(body["schema"],
                                                             body.get("schemaType", "AVRO"))
        self._by_id[schema_id] = parsed
        self._latest[subject] = (time.monotonic(), schema_id, parsed)
        return schema_id, parsed

    def forget_latest(self, subject: str) -> None:
        """Fetch the subject's latest version again when next asked (a broker refused a
        batch written with the cached one: it may have been deleted or superseded)."""
        self._latest.pop(subject, None)

    async def version(self, subject: str, version: int) -> tuple[int, ParsedSchema]:
        """A given version of the subject (-1: the latest): (schema id, schema)."""
        if version == -1:
            return await self.latest(subject)
        body = (await self.ask(SchemaRegistryRequest("get_version", subject,
                                                     version=version))).result()
        schema_id = int(body["id"])
        parsed = self._by_id.get(schema_id) or parse_schema(body["schema"],
                                                             body.get("schemaType", "AVRO"))
        self._by_id[schema_id] = parsed
        return schema_id, parsed


class TypedValue:
    """Values for a typed topic, already converted: a StructArray of schema
    ``schema_id``. One row for ``send`` (what ``send`` of a dict makes; batches
    concatenate them when sealed), any number for ``send_batch``."""

    __slots__ = ("row", "schema", "schema_id", "size")

    def __init__(self, schema_id: int, schema: ParsedSchema, row: pa.StructArray) -> None:
        self.schema_id = schema_id
        self.schema = schema
        self.row = row
        self.size = int(row.nbytes)

    def __len__(self) -> int:
        """Its size estimate, in bytes (the accumulator sizes records with ``len``)."""
        return self.size


def typed_column(values: list[Any]) -> tuple[int, pa.StructArray]:
    """The value column of a batch of ``TypedValue`` records: (schema id, values).

    The accumulator gives every record of a batch the same schema id (a record
    converted under another version starts a new batch): a batch is never rewritten
    under another version, which could drop the fields of a newer one."""
    if not all(type(v) is TypedValue for v in values):
        raise InvalidRecordBatchError(
            "a batch mixes dict values with bytes values: a typed topic takes dicts (or "
            "send_batch of a pyarrow Table), a bytes topic takes bytes")
    schema_id = values[0].schema_id
    if any(v.schema_id != schema_id for v in values):
        raise InvalidRecordBatchError(
            f"internal error: one batch holds values of schema ids "
            f"{sorted({v.schema_id for v in values})}; report this as a Strata bug")
    return schema_id, pa.concat_arrays([v.row for v in values])


class TopicSchemas:
    """Which topics are typed, and their value schemas, for a producer or a consumer."""

    def __init__(self, source: SchemaSource) -> None:
        self.source = source

    async def value_subject(self, topic: str) -> str | None:
        """The topic's ``value.schema.subject`` (None: a bytes topic), from the topic's
        metadata, which any principal that may describe the topic sees. Fixed at the
        topic's creation."""
        cluster = self.source.cluster
        if topic not in cluster.value_subjects:
            await cluster.partitions_for(topic, refresh=True)
        return cluster.value_subjects.get(topic)

    def writer_refused(self, topic: str) -> None:
        """A broker refused a batch of ``topic`` (SCHEMA_MISMATCH): the next record is
        converted under the subject's latest version as the registry has it now."""
        subject = self.source.cluster.value_subjects.get(topic)
        if subject is not None:
            self.source.forget_latest(subject)

    async def writer(self, topic: str, *, refresh: bool = False
                     ) -> tuple[int, ParsedSchema]:
        """The schema a producer writes ``topic`` with: its subject's latest version."""
        subject = await self.value_subject(topic)
        if subject is None:
            raise InvalidRecordBatchError(
                f"topic {topic!r} is not typed (it has no value.schema.subject): send its "
                "values as bytes, or create a typed topic (strata topic create --typed)")
        return await self.source.latest(subject, refresh=refresh)

    async def to_column(self, topic: str, values: Any) -> tuple[int, pa.StructArray]:
        """``values`` (a pyarrow Table, RecordBatch or StructArray of the schema's fields,
        or a list of dicts) as the topic's typed value column, checked against the
        subject's latest version (``SchemaMismatchError`` naming the field and, for
        dicts, the record)."""
        schema_id, schema = await self.writer(topic)
        if isinstance(values, pa.Table | pa.RecordBatch | pa.StructArray | pa.ChunkedArray):
            return schema_id, table_to_arrow(values, schema)
        if isinstance(values, Mapping):
            raise TypeError("send_batch takes many records: a list of dicts or a pyarrow "
                            "Table (send() takes one dict)")
        return schema_id, records_to_arrow(list(values), schema)

    async def typed_value(self, topic: str, record: Mapping[str, Any]) -> TypedValue:
        schema_id, schema = await self.writer(topic)
        return TypedValue(schema_id, schema, records_to_arrow([record], schema))


class MissingSchemas(Exception):
    """A fetch holds typed batches whose schemas are not loaded yet: load them
    (``TypedReader.load``), then fetch the same offsets again."""


class TypedReader:
    """Reads typed topics' values under one reader schema per topic (the consumer's).

    ``resolver(topic)`` is what ``batches_to_table`` calls per typed batch; it runs on
    cached schemas only (it is synchronous) and raises ``MissingSchemas`` for the first
    batch of an unknown writer id or topic, after noting what to ``load``.
    """

    def __init__(self, topics: TopicSchemas, value_format: str,
                 reader_version: int | str) -> None:
        self.topics = topics
        self.value_format = value_format
        self.reader_version = -1 if reader_version == "latest" else int(reader_version)
        self.readers: dict[str, tuple[int, ParsedSchema]] = {}
        self._needed_topics: set[str] = set()
        # Unknown writer ids, by the topic they were met in: learned through the
        # topic's subject first (see ``SchemaSource.learn_subject``).
        self._ids_by_topic: dict[str, set[int]] = {}

    @property
    def pending(self) -> bool:
        return bool(self._needed_topics or self._ids_by_topic)

    def resolver(self, topic: str) -> Callable[[int, pa.StructArray], pa.Array]:
        known = self.topics.source.cached

        def resolve_value(schema_id: int, values: pa.StructArray) -> pa.Array:
            reader = self.readers.get(topic)
            writer = known(schema_id)
            if reader is None or writer is None:
                if reader is None:
                    self._needed_topics.add(topic)
                if writer is None:
                    self._ids_by_topic.setdefault(topic, set()).add(schema_id)
                raise MissingSchemas(topic)
            reader_id, reader_schema = reader
            out = values if schema_id == reader_id else resolve(values, writer, reader_schema)
            if self.value_format == "json":
                return _binary_keeping_nulls(out, to_json_values(out))
            if self.value_format == "confluent":
                if reader_schema.schema_type is not SchemaType.AVRO:
                    raise InvalidSchemaError(
                        f"topic {topic!r} has a JSON Schema subject, and Confluent's wire "
                        "format carries Avro bodies: read it with value_format='json' (or "
                        "'arrow'; Spark: valueFormat json or struct)")
                bodies = to_avro_bodies(out, reader_schema)
                return _binary_keeping_nulls(
                    out, [None if body is None else confluent_frame(reader_id, body)
                          for body in bodies])
            return out

        return resolve_value

    async def load(self) -> None:
        """Fetch what ``resolver`` found missing."""
        source = self.topics.source
        for topic in sorted(self._needed_topics | set(self._ids_by_topic)):
            subject = await self.topics.value_subject(topic)
            if subject is None:
                raise InvalidRecordBatchError(
                    f"topic {topic!r} holds typed batches but has no value.schema.subject")
            if topic in self._needed_topics:
                self.readers[topic] = await source.version(subject, self.reader_version)
            if any(source.cached(i) is None for i in self._ids_by_topic.get(topic, ())):
                await source.learn_subject(subject)
        for ids in self._ids_by_topic.values():
            for schema_id in sorted(ids):  # an id the subject does not list: by id
                if source.cached(schema_id) is None:
                    await source.by_id(schema_id)
        self._needed_topics.clear()
        self._ids_by_topic.clear()


def _binary_keeping_nulls(values: pa.Array, encoded: Sequence[bytes | None]) -> pa.Array:
    """``encoded`` as a binary column, null where ``values`` is (a tombstone)."""
    column = pa.array(encoded, pa.binary())
    if not values.null_count:
        return column
    return pc.if_else(values.is_valid(), column, pa.scalar(None, pa.binary()))
