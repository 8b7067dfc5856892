"""The schema registry: subjects, versions and ids, kept in the ``__schemas`` topic.

What Confluent's Schema Registry does, inside the brokers (docs/typed-topics.md): a
subject (``<topic>-value`` by Kafka's TopicNameStrategy) holds numbered versions of a
schema (Avro or JSON Schema); every distinct schema text has one global id, stable
forever; a new version must pass the subject's compatibility setting.

Storage: one compacted partition, ``__schemas``-0, the way Confluent keeps ``_schemas``.
Its leader is the registry's only writer; every write waits for the in-sync replicas
(acks=all) before it is answered, so a broker that becomes leader loads the partition
and knows every id ever answered: ids never move and are never given out twice.

Records (key and value JSON, the key's fields sorted, so compaction keeps one per key):

    key                                             value (null: a tombstone)
    {"keytype": "SCHEMA", "subject", "version"}     {"subject", "version", "id",
                                                     "schemaType", "schema", "deleted"}
    {"keytype": "CONFIG", "subject"}  ("" global)   {"compatibilityLevel"}
    {"keytype": "IDS", "subject": ""}               {"next_id"}

A soft delete rewrites a version with ``deleted: true``; a permanent delete writes its
tombstone, and with it the ``IDS`` record (never tombstoned): compaction may drop a
deleted version's records, and with them the highest id, which must still never be
given out again. Ids come from the highest id seen (or ``IDS``' next id) plus one; a
schema text already known (same type, same canonical form) reuses its id in any
subject. A record the loader cannot parse still counts for ids and version numbers.

Crash behaviour: a write whose replication fails (fenced leader, timeout) may still be
in the log and become committed, so the leader drops its in-memory state and reloads
the partition before its next answer; it never hands the same id out twice.

Produce-path checks (``SchemaCheck``): a typed topic's batches carry their schema id in
the Arrow schema message (``wire.record_batch.typed_payload_schema``). Every broker
keeps each subject's versions (fetched from the registry leader, or read locally when it
is the leader) and a verdict per distinct schema message, so a produce request costs one
dictionary look-up per batch after the first. Versions are re-read after
``CHECK_TTL_S``, and a verdict lasts no longer than the versions it was judged on, so a
deleted version stops being accepted within that time (refusals last a second).

Thread-safety: the broker's event loop owns everything here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from brokers.internal_topics import append_replicated, ask_broker, create_internal_topic
from wire.errors import (
    CoordinatorNotAvailableError,
    IncompatibleSchemaError,
    InvalidRequestError,
    InvalidSchemaError,
    NotCoordinatorError,
    SchemaNotFoundError,
    StrataError,
)
from wire.protocol import (
    SCHEMA_OPERATIONS,
    SCHEMAS_TOPIC,
    ApiKey,
    SchemaRegistryRequest,
    SchemaRegistryResponse,
)
from wire.record_batch import (
    batches_to_table,
    build_batch,
    payload_schema_of,
    schema_message,
    value_schema_id,
)
from wire.schema import (
    Compatibility,
    ParsedSchema,
    SchemaType,
    arrow_mismatch,
    check_compatibility,
    parse_schema,
)

if TYPE_CHECKING:  # pragma: no cover
    from brokers.config import BrokerConfig
    from brokers.coordination import ZooKeeperClient
    from brokers.partition import Partition
    from brokers.services import InternalTopicHost, MetadataCache, PartitionRegistry

__all__ = ["CHECK_TTL_S", "DEFAULT_COMPATIBILITY", "SchemaCheck", "SchemaRegistry"]

log = logging.getLogger("strata.brokers.schema_registry")

DEFAULT_COMPATIBILITY: Final = Compatibility.BACKWARD  # Confluent's default
CHECK_TTL_S: Final = 30.0
MAX_SUBJECT_LENGTH: Final = 255
_WRITE_TIMEOUT_S: Final = 30.0
_LOAD_READ_BYTES: Final = 4 << 20
_REMOTE_TIMEOUT_S: Final = 5.0
_MAX_VERDICTS: Final = 4096
_REFUSAL_TTL_S: Final = 1.0
#: ``ask_broker``'s purpose for requests passed to the registry leader (the client id
#: ``broker-<id>-schemas`` marks them).
_FORWARD_PURPOSE: Final = "schemas"


class _Refusal(Exception):
    """An error with Confluent's code (the gateway's HTTP status is its first digits)."""

    def __init__(self, error: StrataError, registry_code: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.registry_code = registry_code


def _refuse(cls: type[StrataError], registry_code: int, message: str) -> _Refusal:
    return _Refusal(cls(message), registry_code)


@dataclass(slots=True)
class _Version:
    subject: str
    version: int
    schema_id: int
    deleted: bool


@dataclass(slots=True)
class _Stored:
    schema_id: int
    text: str
    parsed: ParsedSchema


@dataclass
class _State:
    """The registry as loaded from ``__schemas``-0 at one leader epoch."""

    leader_epoch: int
    schemas: dict[int, _Stored] = field(default_factory=dict)
    ids: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, fingerprint)
    subjects: dict[str, dict[int, _Version]] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)  # "" the global setting
    next_id: int = 1
    #: Highest version number each subject's records named (parsed or not): a new
    #: version is numbered above it.
    last_version: dict[str, int] = field(default_factory=dict)

    def live(self, subject: str) -> list[_Version]:
        return sorted((v for v in self.subjects.get(subject, {}).values() if not v.deleted),
                      key=lambda v: v.version)

    def level(self, subject: str) -> Compatibility:
        return Compatibility(self.config.get(subject) or self.config.get("")
                             or DEFAULT_COMPATIBILITY)

    def apply(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        subject = str(key["subject"])
        if key["keytype"] == "IDS":
            if value is not None:
                self.next_id = max(self.next_id, int(value["next_id"]))
            return
        if key["keytype"] == "CONFIG":
            if value is None:
                self.config.pop(subject, None)
            else:
                self.config[subject] = str(value["compatibilityLevel"])
            return
        version = int(key["version"])
        if value is None:
            versions = self.subjects.get(subject, {})
            versions.pop(version, None)
            if not versions:
                self.subjects.pop(subject, None)
            return
        schema_id = int(value["id"])
        # Counted before parsing: a record this loader cannot read still holds its id
        # and version number.
        self.next_id = max(self.next_id, schema_id + 1)
        self.last_version[subject] = max(self.last_version.get(subject, 0), version)
        if schema_id not in self.schemas:
            parsed = parse_schema(value["schema"], value.get("schemaType") or "AVRO")
            self.schemas[schema_id] = _Stored(schema_id, value["schema"], parsed)
            self.ids.setdefault((parsed.schema_type.value, parsed.fingerprint), schema_id)
        self.subjects.setdefault(subject, {})[version] = _Version(
            subject, version, schema_id, bool(value.get("deleted")))


def _apply_chunk(state: _State, read_bytes: Callable[[], bytes], offset: int) -> int:
    """Apply one chunk of ``__schemas``-0 from ``offset`` to ``state`` (a worker thread;
    the state is not shared yet); return how many records it held. A record that cannot
    be read is logged and skipped (its id and version number still count)."""
    table = batches_to_table(read_bytes(), topic=SCHEMAS_TOPIC, partition=0,
                             start_offset=offset)
    keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
    for key, value in zip(keys, values, strict=True):
        try:
            state.apply(json.loads(key), None if value is None else json.loads(value))
        except (KeyError, TypeError, ValueError, StrataError) as err:
            log.error("%s-0: skipping an unreadable record %r: %r", SCHEMAS_TOPIC,
                      (key or b"")[:200], err)
    return len(keys)


def _key(keytype: str, subject: str, version: int | None = None) -> bytes:
    fields: dict[str, Any] = {"keytype": keytype, "subject": subject}
    if version is not None:
        fields["version"] = version
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _ids_record(state: _State) -> tuple[bytes, bytes]:
    """The record that keeps ``state.next_id`` past the compaction of deleted versions."""
    return _key("IDS", ""), json.dumps({"next_id": state.next_id}).encode()


def _schema_value(version: _Version, stored: _Stored) -> bytes:
    return json.dumps({
        "subject": version.subject, "version": version.version, "id": version.schema_id,
        "schemaType": stored.parsed.schema_type.value, "schema": stored.text,
        "deleted": version.deleted}, separators=(",", ":")).encode()


def _described(version: _Version, stored: _Stored) -> dict[str, Any]:
    body: dict[str, Any] = {"subject": version.subject, "version": version.version,
                            "id": version.schema_id, "schema": stored.text}
    if stored.parsed.schema_type is not SchemaType.AVRO:
        body["schemaType"] = stored.parsed.schema_type.value  # Confluent omits AVRO
    return body


def _check_subject(subject: str | None) -> str:
    if not subject or len(subject) > MAX_SUBJECT_LENGTH or not subject.isprintable():
        raise _refuse(InvalidRequestError, 42208,
                      f"subject {subject!r} is not valid: use 1..{MAX_SUBJECT_LENGTH} "
                      "printable characters (TopicNameStrategy: <topic>-value)")
    return subject


def _level(text: str | None) -> Compatibility:
    try:
        return Compatibility((text or "").upper())
    except ValueError:
        raise _refuse(InvalidRequestError, 42203,
                      f"compatibility level {text!r} is not valid; use one of "
                      f"{', '.join(c.value for c in Compatibility)}") from None


class SchemaRegistry:
    """The registry, served by the broker leading ``__schemas``-0 (any broker builds
    one; only the leader's answers anything but NOT_COORDINATOR)."""

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, zookeeper: ZooKeeperClient,
                 host: InternalTopicHost) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.zookeeper = zookeeper
        self.host = host
        self._state: _State | None = None
        self._loading = asyncio.Lock()
        self._writing = asyncio.Lock()
        self._creating: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ answering
    async def handle(self, request: SchemaRegistryRequest, *, client_id: str = ""
                     ) -> SchemaRegistryResponse:
        """Answer ``request`` here when this broker leads ``__schemas``-0, else pass it
        to the leader (the caller authorized it already): a client that may not see
        ``__schemas`` in its metadata cannot look the leader up itself. A request another
        broker passed on (``client_id``) is never passed on again: two brokers with
        different views of the leader would send it back and forth."""
        try:
            if request.operation not in SCHEMA_OPERATIONS:
                raise _refuse(InvalidRequestError, 40001,
                              f"unknown schema registry operation {request.operation!r}; "
                              f"use one of {', '.join(SCHEMA_OPERATIONS)}")
            if SCHEMAS_TOPIC in self.cluster.topics and not self._leads():
                if client_id.startswith("broker-") and client_id.endswith(
                        f"-{_FORWARD_PURPOSE}"):
                    raise NotCoordinatorError(
                        f"broker {self.broker_id} does not lead {SCHEMAS_TOPIC}-0 (a request "
                        "passed on by another broker); retry once the leader is known")
                return await self._ask_leader(request)
            state = await self._load()
            body = await getattr(self, f"_op_{request.operation}")(state, request)
        except _Refusal as refusal:
            return SchemaRegistryResponse(refusal.error.code, refusal.error.message,
                                          refusal.registry_code)
        except StrataError as err:
            return SchemaRegistryResponse(err.code, err.message, 50003 if err.retriable
                                          else 50001)
        return SchemaRegistryResponse(0, None, 0, json.dumps(body))

    def _leads(self) -> bool:
        partition = self.registry.hosted.get((SCHEMAS_TOPIC, 0))
        return partition is not None and partition.is_leader and not partition.fenced

    def _partition(self) -> Partition:
        partition = self.registry.hosted.get((SCHEMAS_TOPIC, 0))
        if partition is None or not partition.is_leader or partition.fenced:
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not lead {SCHEMAS_TOPIC}-0, where the schema "
                "registry lives; send the request to its leader (the client does)")
        return partition

    async def _load(self) -> _State:
        if SCHEMAS_TOPIC not in self.cluster.topics:
            if self._creating is None or self._creating.done():
                self._creating = asyncio.create_task(create_internal_topic(
                    SCHEMAS_TOPIC, 1, config=self.config, cluster=self.cluster,
                    zookeeper=self.zookeeper, host=self.host, topic_config={}))
            await asyncio.shield(self._creating)
            raise CoordinatorNotAvailableError(
                f"{SCHEMAS_TOPIC} is being created; retry in a moment")
        partition = self._partition()
        state = self._state
        if state is not None and state.leader_epoch == partition.leader_epoch:
            return state
        async with self._loading:
            partition = self._partition()
            if self._state is not None and self._state.leader_epoch == partition.leader_epoch:
                return self._state
            started = time.monotonic()
            state = _State(partition.leader_epoch)
            offset, end = partition.log.log_start_offset, partition.log.log_end_offset
            records = 0
            while offset < end:
                chunk = partition.log.read(offset, _LOAD_READ_BYTES)
                if chunk is None or chunk.next_offset <= offset:
                    break
                # Reading, decoding and parsing schemas: off the event loop (the state is
                # this loader's alone until it is published below).
                records += await asyncio.to_thread(_apply_chunk, state, chunk.read_bytes,
                                                   offset)
                offset = chunk.next_offset
            self._state = state
            log.info("loaded %s-0 at leader epoch %d: %d subjects, %d schemas from %d "
                     "records in %.3f s", SCHEMAS_TOPIC, state.leader_epoch,
                     len(state.subjects), len(state.schemas), records,
                     time.monotonic() - started)
            return state

    async def _write(self, state: _State,
                     records: list[tuple[bytes, bytes | None]]) -> None:
        partition = self._partition()
        if partition.leader_epoch != state.leader_epoch or self._state is not state:
            raise NotCoordinatorError(
                f"{SCHEMAS_TOPIC}-0 changed leader epoch; send the request again")
        batch = build_batch([v for _, v in records], keys=[k for k, _ in records])
        try:
            await append_replicated(partition, batch, what="the schema registry change",
                                    timeout_s=_WRITE_TIMEOUT_S)
        except BaseException:
            # The records may be in the log and still become committed: reload it
            # before the next answer rather than give their id or version out again.
            if self._state is state:
                self._state = None
            raise
        for key, value in records:
            state.apply(json.loads(key), None if value is None else json.loads(value))

    # ------------------------------------------------------------------ look-ups
    @staticmethod
    def _versions(state: _State, subject: str, include_deleted: bool) -> list[_Version]:
        versions = sorted(state.subjects.get(subject, {}).values(), key=lambda v: v.version)
        shown = versions if include_deleted else [v for v in versions if not v.deleted]
        if not shown:
            raise _refuse(SchemaNotFoundError, 40401, f"subject {subject!r} not found")
        return shown

    def _version(self, state: _State, subject: str, number: int,
                 include_deleted: bool = False) -> _Version:
        versions = self._versions(state, subject, include_deleted)
        if number == -1:
            return versions[-1]
        if number < 1:
            raise _refuse(InvalidRequestError, 42202,
                          f"version {number} is not valid: use a positive number or latest")
        for version in versions:
            if version.version == number:
                return version
        raise _refuse(SchemaNotFoundError, 40402,
                      f"version {number} of subject {subject!r} not found; list its "
                      f"versions (GET /subjects/{subject}/versions, strata schema list "
                      f"{subject})")

    @staticmethod
    def _parse(request: SchemaRegistryRequest) -> ParsedSchema:
        if not request.schema:
            raise _refuse(InvalidSchemaError, 42201, "the request has no schema text")
        try:
            return parse_schema(request.schema, request.schema_type or "AVRO")
        except InvalidSchemaError as err:
            raise _Refusal(err, 42201) from None

    @staticmethod
    def _same(state: _State, versions: Iterable[_Version], parsed: ParsedSchema
              ) -> _Version | None:
        for version in versions:
            known = state.schemas[version.schema_id].parsed
            if (known.schema_type, known.fingerprint) == (parsed.schema_type,
                                                          parsed.fingerprint):
                return version
        return None

    # ------------------------------------------------------------------ operations
    async def _op_register(self, state: _State, request: SchemaRegistryRequest) -> Any:
        subject = _check_subject(request.subject)
        parsed = self._parse(request)
        async with self._writing:
            live = state.live(subject)
            same = self._same(state, live, parsed)
            if same is not None:
                return {"id": same.schema_id}
            level = state.level(subject)
            reasons = check_compatibility(
                parsed, [state.schemas[v.schema_id].parsed for v in live], level,
                version_numbers=[v.version for v in live])
            if reasons:
                raise _refuse(IncompatibleSchemaError, 409,
                              f"the schema is incompatible with subject {subject!r} under "
                              f"{level.value}: " + "; ".join(reasons))
            schema_id = state.ids.get((parsed.schema_type.value, parsed.fingerprint),
                                      state.next_id)
            stored = state.schemas.get(schema_id) or _Stored(schema_id, request.schema or "",
                                                               parsed)
            number = max(max(state.subjects.get(subject, {}), default=0),
                         state.last_version.get(subject, 0)) + 1
            version = _Version(subject, number, schema_id, False)
            await self._write(state, [(_key("SCHEMA", subject, number),
                                       _schema_value(version, stored))])
            log.info("registered %s version %d: schema id %d", subject, number, schema_id)
            return {"id": schema_id}

    async def _op_lookup(self, state: _State, request: SchemaRegistryRequest) -> Any:
        subject = _check_subject(request.subject)
        parsed = self._parse(request)
        same = self._same(state, self._versions(state, subject, request.include_deleted),
                          parsed)
        if same is None:
            raise _refuse(SchemaNotFoundError, 40403,
                          f"the schema is not registered under subject {subject!r}; "
                          f"register it (POST /subjects/{subject}/versions, strata schema "
                          "register), or compare it with the registered versions")
        return _described(same, state.schemas[same.schema_id])

    async def _op_list_subjects(self, state: _State, request: SchemaRegistryRequest) -> Any:
        return sorted(s for s, versions in state.subjects.items()
                      if request.include_deleted or any(not v.deleted
                                                        for v in versions.values()))

    async def _op_list_versions(self, state: _State, request: SchemaRegistryRequest) -> Any:
        subject = _check_subject(request.subject)
        return [v.version for v in self._versions(state, subject, request.include_deleted)]

    async def _op_get_version(self, state: _State, request: SchemaRegistryRequest) -> Any:
        subject = _check_subject(request.subject)
        version = self._version(state, subject, request.version, request.include_deleted)
        return _described(version, state.schemas[version.schema_id])

    async def _op_subject_schemas(self, state: _State, request: SchemaRegistryRequest
                                  ) -> Any:
        subject = _check_subject(request.subject)
        versions = sorted(state.subjects.get(subject, {}).values(), key=lambda v: v.version) \
            if request.include_deleted else state.live(subject)
        return [{"version": v.version, "id": v.schema_id,
                 "schemaType": state.schemas[v.schema_id].parsed.schema_type.value,
                 "schema": state.schemas[v.schema_id].text} for v in versions]

    async def _op_get_by_id(self, state: _State, request: SchemaRegistryRequest) -> Any:
        stored = state.schemas.get(request.schema_id)
        in_use = any(v.schema_id == request.schema_id
                     for versions in state.subjects.values() for v in versions.values())
        if stored is None or not in_use:
            raise _refuse(SchemaNotFoundError, 40403,
                          f"schema id {request.schema_id} not found; ids come from "
                          "registering a schema (it is gone if every version using it "
                          "was deleted permanently)")
        body: dict[str, Any] = {"schema": stored.text}
        if stored.parsed.schema_type is not SchemaType.AVRO:
            body["schemaType"] = stored.parsed.schema_type.value
        return body

    async def _op_id_versions(self, state: _State, request: SchemaRegistryRequest) -> Any:
        found = [{"subject": v.subject, "version": v.version}
                 for subject in sorted(state.subjects)
                 for v in sorted(state.subjects[subject].values(), key=lambda v: v.version)
                 if v.schema_id == request.schema_id
                 and (request.include_deleted or not v.deleted)]
        if not found:
            raise _refuse(SchemaNotFoundError, 40403,
                          f"schema id {request.schema_id} not found; ids come from "
                          "registering a schema (it is gone if every version using it "
                          "was deleted permanently)")
        return found

    async def _op_delete_version(self, state: _State, request: SchemaRegistryRequest
                                 ) -> Any:
        subject = _check_subject(request.subject)
        async with self._writing:
            version = self._version(state, subject, request.version, include_deleted=True)
            if request.version == -1 and version.deleted and not request.permanent:
                live = state.live(subject)
                if not live:
                    raise _refuse(SchemaNotFoundError, 40401,
                                  f"subject {subject!r} not found")
                version = live[-1]
            stored = state.schemas[version.schema_id]
            key = _key("SCHEMA", subject, version.version)
            if request.permanent:
                if not version.deleted:
                    raise _refuse(InvalidRequestError, 40407,
                                  f"version {version.version} of subject {subject!r} was "
                                  "not soft-deleted: delete it without permanent=true first")
                await self._write(state, [(key, None), _ids_record(state)])
            else:
                if version.deleted:
                    raise _refuse(InvalidRequestError, 40406,
                                  f"version {version.version} of subject {subject!r} was "
                                  "soft-deleted; set permanent=true to delete it for good")
                deleted = _Version(subject, version.version, version.schema_id, True)
                await self._write(state, [(key, _schema_value(deleted, stored))])
            return version.version

    async def _op_delete_subject(self, state: _State, request: SchemaRegistryRequest
                                 ) -> Any:
        subject = _check_subject(request.subject)
        async with self._writing:
            every = self._versions(state, subject, include_deleted=True)
            live = [v for v in every if not v.deleted]
            if request.permanent:
                if live:
                    raise _refuse(InvalidRequestError, 40405,
                                  f"subject {subject!r} was not soft-deleted: delete it "
                                  "without permanent=true first")
                records: list[tuple[bytes, bytes | None]] = [
                    (_key("SCHEMA", subject, v.version), None) for v in every]
                if subject in state.config:
                    records.append((_key("CONFIG", subject), None))
                records.append(_ids_record(state))
                await self._write(state, records)
                return [v.version for v in every]
            if not live:
                raise _refuse(InvalidRequestError, 40404,
                              f"subject {subject!r} was soft-deleted; set permanent=true "
                              "to delete it for good")
            await self._write(state, [
                (_key("SCHEMA", subject, v.version),
                 _schema_value(_Version(subject, v.version, v.schema_id, True),
                               state.schemas[v.schema_id])) for v in live])
            return [v.version for v in live]

    async def _op_check_compatibility(self, state: _State, request: SchemaRegistryRequest
                                      ) -> Any:
        subject = _check_subject(request.subject)
        parsed = self._parse(request)
        level = state.level(subject)
        compared = state.live(subject) if request.version == -1 else \
            [self._version(state, subject, request.version)]
        messages = check_compatibility(
            parsed, [state.schemas[v.schema_id].parsed for v in compared], level,
            version_numbers=[v.version for v in compared])
        return {"is_compatible": not messages, "messages": messages}

    async def _op_get_config(self, state: _State, request: SchemaRegistryRequest) -> Any:
        if request.subject is None:
            return {"compatibilityLevel": state.level("").value}
        subject = _check_subject(request.subject)
        if subject not in state.config and not request.default_to_global:
            raise _refuse(SchemaNotFoundError, 40408,
                          f"subject {subject!r} has no compatibility level of its own (the "
                          f"global one, {state.level('').value}, applies)")
        return {"compatibilityLevel": state.level(subject).value}

    async def _op_set_config(self, state: _State, request: SchemaRegistryRequest) -> Any:
        subject = "" if request.subject is None else _check_subject(request.subject)
        level = _level(request.compatibility)
        async with self._writing:
            await self._write(state, [(_key("CONFIG", subject), json.dumps(
                {"compatibilityLevel": level.value}).encode())])
        return {"compatibility": level.value}

    async def _op_delete_config(self, state: _State, request: SchemaRegistryRequest) -> Any:
        subject = _check_subject(request.subject)
        async with self._writing:
            if subject not in state.config:
                raise _refuse(SchemaNotFoundError, 40408,
                              f"subject {subject!r} has no compatibility level of its own")
            old = state.config[subject]
            await self._write(state, [(_key("CONFIG", subject), None)])
        return {"compatibilityLevel": old}

    # ------------------------------------------------------------------ for the checks
    async def subject_versions(self, subject: str) -> dict[int, ParsedSchema]:
        """The live versions of ``subject`` by schema id: from this broker's state when it
        leads ``__schemas``-0, otherwise from the leader."""
        if self._leads():
            state = await self._load()
            return {v.schema_id: state.schemas[v.schema_id].parsed
                    for v in state.live(subject)}
        response = await self._ask_leader(SchemaRegistryRequest("subject_schemas", subject))
        if response.error_code:
            if response.registry_code == 40401:
                return {}
            raise CoordinatorNotAvailableError(
                f"the schema registry could not list subject {subject!r}: "
                f"{response.error_message}; retry in a moment")
        return {int(e["id"]): parse_schema(e["schema"], e["schemaType"])
                for e in json.loads(response.body or "[]")}

    async def _ask_leader(self, request: SchemaRegistryRequest) -> SchemaRegistryResponse:
        """``request`` answered by the broker leading ``__schemas``-0 (over the
        inter-broker listener); COORDINATOR_NOT_AVAILABLE when it cannot be reached."""
        leader_state = self.cluster.partition_states.get((SCHEMAS_TOPIC, 0))
        if leader_state is not None and leader_state.leader == self.broker_id:
            raise CoordinatorNotAvailableError(
                f"broker {self.broker_id} is named leader of {SCHEMAS_TOPIC}-0 but its "
                "replica is not serving yet (loading or fenced); retry in a moment")
        registration = None if leader_state is None else \
            self.cluster.live_brokers.get(leader_state.leader)
        if registration is None:
            raise CoordinatorNotAvailableError(
                f"{SCHEMAS_TOPIC}-0, where the schema registry lives, has no live leader "
                "right now; retry in a moment")
        try:
            response = await ask_broker(registration, self.config, ApiKey.SCHEMA_REGISTRY,
                                        request, purpose=_FORWARD_PURPOSE,
                                        timeout_s=_REMOTE_TIMEOUT_S)
        except (StrataError, OSError, TimeoutError) as err:
            raise CoordinatorNotAvailableError(
                f"the schema registry (broker {registration.broker_id}) did not answer "
                f"({err!r}); retry in a moment") from None
        assert isinstance(response, SchemaRegistryResponse)
        return response


class SchemaCheck:
    """Whether a batch offered to a typed topic matches a live version of its subject.

    ``verdict`` (async: it may ask the registry leader) runs before a produce request
    writes anything; it answers None for a match, else the sentence that refuses it.

    Caches: a subject's live versions, re-read after ``CHECK_TTL_S`` (or at once for an
    id they lack); a verdict per (subject, digest of the schema message), valid while the
    versions it was judged on are (``CHECK_TTL_S`` from their fetch), a refusal for
    ``_REFUSAL_TTL_S`` only (a version registered meanwhile is seen within it). So a
    deleted version stops being accepted within ``CHECK_TTL_S``, at once on the broker
    that handled the delete (``forget``).
    """

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        # (subject, digest of the schema message) -> (valid until, verdict)
        self._verdicts: dict[tuple[str, bytes], tuple[float, str | None]] = {}
        # subject -> (fetched at, live versions by schema id)
        self._versions: dict[str, tuple[float, dict[int, ParsedSchema]]] = {}
        # subject -> (started at, the fetch of its live versions)
        self._fetching: dict[str, tuple[float, asyncio.Task[dict[int, ParsedSchema]]]] = {}
        #: Bumped by ``forget``: a fetch started before it is not cached after it.
        self._generation = 0

    async def verdict(self, topic: str, subject: str, batch: bytes | memoryview
                      ) -> str | None:
        try:
            message = schema_message(batch)
        except StrataError as err:
            return err.message
        # A digest, not the message: a cache of hostile variety stays small.
        cache_key = (subject, hashlib.blake2b(message, digest_size=16).digest())
        now = time.monotonic()
        cached = self._verdicts.get(cache_key)
        if cached is not None and now < cached[0]:
            return cached[1]
        generation = self._generation
        judged_at, verdict = await self._judge(topic, subject, message, now)
        if generation == self._generation:
            if len(self._verdicts) >= _MAX_VERDICTS:
                self._verdicts.clear()  # hostile variety: start over rather than grow
            self._verdicts[cache_key] = (
                judged_at + (CHECK_TTL_S if verdict is None else _REFUSAL_TTL_S), verdict)
        return verdict

    async def _judge(self, topic: str, subject: str, message: bytes, now: float
                     ) -> tuple[float, str | None]:
        """(when the versions it relied on were fetched, the verdict)."""
        try:
            schema = payload_schema_of(message)
            schema_id = value_schema_id(schema)
        except StrataError as err:
            return now, err.message
        if schema_id is None:
            return now, (f"topic {topic!r} is typed (value.schema.subject={subject}): its "
                         "batches carry the value as the schema's Arrow columns and the "
                         "schema id; send records with the Strata producer, which converts "
                         "them")
        fetched_at, versions = await self._subject(subject, schema_id, now)
        parsed = versions.get(schema_id)
        if parsed is None:
            known = ", ".join(str(i) for i in sorted(versions)) or "none yet"
            return fetched_at, (
                f"schema id {schema_id} is not a live version of subject {subject!r} (its "
                f"schema ids: {known}); register the schema under the subject (strata "
                "schema register) and send again")
        mismatch = arrow_mismatch(schema.field("value").type, parsed)
        if mismatch is not None:
            return fetched_at, (f"topic {topic!r}: the batch does not match schema id "
                                f"{schema_id} of subject {subject!r}: {mismatch}")
        return fetched_at, None

    async def _subject(self, subject: str, schema_id: int, now: float
                       ) -> tuple[float, dict[int, ParsedSchema]]:
        cached = self._versions.get(subject)
        if cached is not None and now - cached[0] < CHECK_TTL_S and schema_id in cached[1]:
            return cached
        generation = self._generation
        fetching = self._fetching.get(subject)
        if fetching is None or fetching[1].done():
            # One fetch per subject at a time: a burst of produce requests waits for it.
            fetching = self._fetching[subject] = (time.monotonic(), asyncio.create_task(
                self.registry.subject_versions(subject)))
        started, task = fetching
        versions = await asyncio.shield(task)
        fetched = (started, versions)  # dated from the fetch's start: never too long
        if generation == self._generation:
            self._versions[subject] = fetched
        return fetched

    async def schema_of(self, subject: str, schema_id: int) -> ParsedSchema | None:
        """The schema of ``schema_id`` if it is a live version of ``subject`` (cached as
        ``verdict``'s lookups are; the Kafka listener's typed topics)."""
        _, versions = await self._subject(subject, schema_id, time.monotonic())
        return versions.get(schema_id)

    def forget(self) -> None:
        """Drop every cached verdict and version (a registry change was handled here, or
        tests); fetches in flight are not cached when they end."""
        self._generation += 1
        self._verdicts.clear()
        self._versions.clear()
        self._fetching.clear()
