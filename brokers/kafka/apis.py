"""The Kafka listener's APIs: each Kafka request translated into Strata's, answered by
Strata's own handler, and the answer translated back.

Why translation rather than a second broker: every check (ACLs, quotas, typed-topic
schemas, idempotence, transactions, the internal-topic guard) and every service (the
replica manager, the group and transaction coordinators) stays the one Strata's own
protocol uses, so a Kafka client and a Strata client see the same topic, the same
offsets and the same group state. What is Kafka's alone lives here: record batches
(``records.py``), the classic consumer-group protocol (``groups.py``), and the fields
Strata has no use for (answered with Kafka's neutral values).

Errors: Strata's error codes are Kafka's below 1000; the few of Strata's own map to the
nearest Kafka code (``kafka_code``). A request that fails as a whole (authorization of
the cluster, a request before the SASL login) is answered with that code in every
error field the response has, as Kafka's ``getErrorResponse`` does.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

from brokers.kafka.admin import KafkaAdmin
from brokers.kafka.codec import (
    API_TYPES,
    VERSIONS,
    KafkaHeader,
    encode_answer,
    unsupported_api_versions,
)
from brokers.kafka.fetch_answer import Aborted, FetchAnswer
from brokers.kafka.fetch_answer import FetchPartition as FetchAnswerPartition
from brokers.kafka.fetch_answer import FetchTopic as FetchAnswerTopic
from brokers.kafka.fetch_cache import ConvertedBatches
from brokers.kafka.groups import ClassicGroups
from brokers.kafka.records import as_stored, from_kafka, iter_strata_batches, to_kafka
from brokers.kafka.typed import to_framed, to_typed
from brokers.log.segment import FileSlice
from wire.errors import (
    IllegalSaslStateError,
    InvalidRecordBatchError,
    InvalidRequestError,
    SchemaMismatchError,
    StrataError,
    UnsupportedVersionError,
)
from wire.protocol import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    ApiKey,
    ConfigEntry,
    CreatableTopic,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    EndTxnRequest,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    FindCoordinatorRequest,
    GroupTopicPartitions,
    InitProducerIdRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetForLeaderEpochPartition,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochTopic,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    ReplicaAssignment,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    TxnOffsetCommitPartition,
    TxnOffsetCommitRequest,
    TxnOffsetCommitTopic,
    TxnTopic,
)
from wire.protocol.codec import Chunk

if TYPE_CHECKING:
    from brokers.handlers.dispatch import RequestHandlers
    from brokers.schema_registry import SchemaCheck
    from brokers.security import Session

__all__ = ["KafkaApis", "kafka_code"]

log = logging.getLogger("strata.brokers.kafka")

_CORRUPT_MESSAGE: Final = 2
_UNSUPPORTED_VERSION: Final = 35
_INVALID_REQUEST: Final = 42
_INVALID_RECORD: Final = 87
_UNKNOWN_SERVER_ERROR: Final = -1
#: Strata's own codes (1000 and up) as the Kafka code a Kafka client understands.
_STRATA_TO_KAFKA: Final = {1503: 87}  # SchemaMismatch: INVALID_RECORD


def kafka_code(code: int) -> int:
    """A Strata error code as a Kafka client reads it."""
    if code < 1000:
        return code
    return _STRATA_TO_KAFKA.get(code, _UNKNOWN_SERVER_ERROR)


Translator = Callable[[Any, KafkaHeader, "Session"], Coroutine[Any, Any, Any]]


#: Stored bytes read for a Kafka fetch per byte of its limits: enough for two 500 KB
#: v2 batches of 100-byte records under a 1 MiB limit, little read and not sent.
_WIDEN: Final = 1.25


def _widened(limit: int) -> int:
    """A client's fetch byte limit as the limit on the stored batches read for it."""
    return min(int(max(limit, 0) * _WIDEN), 0x7FFFFFFF)


def _within(batches: Sequence[bytes | bytearray | memoryview], limit: int, *,
            first: bool) -> Sequence[bytes | bytearray | memoryview]:
    """The leading v2 batches that fit ``limit`` bytes; at least one when ``first``
    (KIP-74: the answer's first non-empty partition brings at least one whole batch, so
    a consumer always gets past a batch larger than its limits)."""
    size = 0
    for i, batch in enumerate(batches):
        size += len(batch)
        if size > limit and (i or not first):
            return batches[:i]
    return batches


def _anyone(_topic: str) -> None:
    """The read-ahead's ACL check: none (see ``KafkaApis._read_ahead``)."""


def _free(_size: int) -> int:
    """The read-ahead's quota: none (see ``KafkaApis._read_ahead``)."""
    return 0


def _last_offset(batch: bytes | bytearray | memoryview) -> int:
    """The last offset of a v2 batch (base offset + last offset delta)."""
    base, = struct.unpack_from(">q", batch, 0)
    delta, = struct.unpack_from(">i", batch, 23)
    return int(base) + int(delta)


class KafkaApis:
    """One per broker: Kafka requests in, Kafka answers out (see the module docstring)."""

    def __init__(self, handlers: RequestHandlers, *, max_record_bytes: int,
                 fetch_cache_bytes: int = 0) -> None:
        self.handlers = handlers
        self.max_record_bytes = max_record_bytes
        #: Batches converted for earlier fetches (fetch_cache.py: later readers of the
        #: same recent data skip the conversion).
        self.converted = ConvertedBatches(fetch_cache_bytes)
        #: Partitions whose next batches are being converted ahead of their Kafka
        #: reader (``_read_ahead``), and those tasks (kept so none is collected early).
        self._ahead: set[tuple[str, int]] = set()
        self._ahead_tasks: set[asyncio.Task[None]] = set()
        self.groups = ClassicGroups(self._strata)
        self.admin = KafkaAdmin(self._strata)
        self._table: dict[int, Translator] = {
            0: self.produce, 1: self.fetch, 2: self.list_offsets, 3: self.metadata,
            8: self.offset_commit, 9: self.offset_fetch, 10: self.find_coordinator,
            11: self.groups.join_group, 12: self.groups.heartbeat,
            13: self.groups.leave_group, 14: self.groups.sync_group,
            15: self.groups.describe_groups, 16: self.groups.list_groups,
            17: self.sasl_handshake, 18: self.api_versions, 19: self.create_topics,
            20: self.delete_topics,
            22: self.init_producer_id, 23: self.offset_for_leader_epoch,
            24: self.add_partitions_to_txn, 25: self.add_offsets_to_txn, 26: self.end_txn,
            28: self.txn_offset_commit, 29: self.admin.describe_acls,
            30: self.admin.create_acls, 31: self.admin.delete_acls,
            32: self.describe_configs, 36: self.sasl_authenticate,
            42: self.groups.delete_groups, 44: self.admin.incremental_alter_configs,
            50: self.admin.describe_user_scram_credentials,
            51: self.admin.alter_user_scram_credentials,
            65: self.admin.describe_transactions, 66: self.admin.list_transactions,
            60: self.describe_cluster,
        }
        # docs/kafka-compatibility.md's table is VERSIONS: every key in it is answered.
        assert set(VERSIONS) == set(self._table), set(VERSIONS) ^ set(self._table)
        self._served = dict(VERSIONS)

    def _subject(self, topic: str, partition: int) -> str:
        """The value subject of a typed topic's partition hosted here ("" otherwise)."""
        hosted = self.handlers.context.registry.hosted.get((topic, partition))
        return hosted.config.value_schema_subject if hosted is not None else ""

    def _schema_check(self) -> SchemaCheck:
        check = self.handlers.context.schema_check
        if check is None:
            raise SchemaMismatchError("this broker has no schema registry; typed topics "
                                      "cannot be written or read through it")
        return check

    async def _strata(self, api: ApiKey, request: Any, session: Session,
                      header: KafkaHeader) -> Any:
        return await self.handlers.handle(api, request, session, header.client_id)

    # ------------------------------------------------------------------ the entry
    async def answer(self, header: KafkaHeader, body: memoryview,
                     session: Session) -> list[Chunk] | None:
        """The framed answer to one request, or None (acks=0)."""
        api = header.api_key
        served = self._served.get(api)
        if api == 18 and (served is None or header.api_version > served[1]):
            return [unsupported_api_versions(header)]
        if served is None:
            # No response schema to answer in: the listener answers the header and 35.
            raise UnsupportedVersionError(
                f"API key {api} is not served on this Kafka listener "
                "(docs/kafka-compatibility.md lists what is)")
        _low, high, accepted = served
        request_type, _response_type = API_TYPES[api]
        if api == 0 and 0 <= header.api_version < accepted:
            # Advertised (KAFKA-18659) but refused, partition by partition, as Kafka 4.
            return encode_answer(header, self._refuse_old_produce(body, header))
        if not accepted <= header.api_version <= high:
            log.info("%s v%d from %s is not served (%d..%d)", request_type.__name__,
                     header.api_version, session.peer, accepted, high)
            raise UnsupportedVersionError(
                f"{request_type.__name__} version {header.api_version} is not served "
                f"({accepted}..{high})")
        try:
            request = request_type.decode(body, version=header.api_version)
        except Exception as err:  # the generated decoder raises many kinds
            raise InvalidRequestError(
                f"{request_type.__name__} v{header.api_version} does not decode: {err}"
            ) from None
        if not session.authenticated and api not in (17, 18, 36):
            session.close_after_answer = True
            raise IllegalSaslStateError(
                f"{request_type.__name__} before the SASL login finished")
        response = await self._table[api](request, header, session)
        if response is None:
            return None
        return encode_answer(header, response)

    @staticmethod
    def _refuse_old_produce(body: memoryview, header: KafkaHeader) -> Any:
        request_type, r = API_TYPES[0]
        try:
            request = request_type.decode(body, version=header.api_version)
        except Exception as err:
            raise InvalidRequestError(f"ProduceRequest v{header.api_version} does not "
                                      f"decode: {err}") from None
        message = (f"Produce v{header.api_version} (message format v0/v1) is not served; "
                   f"use a client that sends v{VERSIONS[0][2]}+ (Kafka 0.11 or later)")
        return r(responses=[r.TopicProduceResponse(name=t.name, partition_responses=[
            r.TopicProduceResponse.PartitionProduceResponse(
                index=p.index, error_code=_UNSUPPORTED_VERSION, base_offset=-1,
                error_message=message) for p in t.partition_data]) for t in request.topic_data],
            throttle_time_ms=0)

    # ------------------------------------------------------------------ handshake
    async def api_versions(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        _, response_type = API_TYPES[18]
        keys = [response_type.ApiVersion(api_key=k, min_version=v[0], max_version=v[1])
                for k, v in sorted(self._served.items())]
        return response_type(error_code=0, api_keys=keys, throttle_time_ms=0)

    async def sasl_handshake(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        answer = await self._strata(ApiKey.SASL_HANDSHAKE,
                                    SaslHandshakeRequest(request.mechanism), session, header)
        return API_TYPES[17][1](error_code=kafka_code(answer.error_code),
                                mechanisms=list(answer.mechanisms))

    async def sasl_authenticate(self, request: Any, header: KafkaHeader,
                                session: Session) -> Any:
        answer = await self._strata(ApiKey.SASL_AUTHENTICATE,
                                    SaslAuthenticateRequest(bytes(request.auth_bytes)),
                                    session, header)
        return API_TYPES[36][1](error_code=kafka_code(answer.error_code),
                                error_message=answer.error_message,
                                auth_bytes=answer.auth_bytes,
                                session_lifetime_ms=answer.session_lifetime_ms)

    async def metadata(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        topics = None if request.topics is None else [t.name for t in request.topics]
        answer = await self._strata(ApiKey.METADATA, MetadataRequest(topics), session, header)
        r = API_TYPES[3][1]
        brokers = [r.MetadataResponseBroker(node_id=b.node_id, host=b.host, port=b.port)
                   for b in answer.brokers]
        out_topics = []
        for t in answer.topics:
            parts = [r.MetadataResponseTopic.MetadataResponsePartition(
                error_code=kafka_code(p.error_code), partition_index=p.partition,
                leader_id=p.leader, leader_epoch=p.leader_epoch, replica_nodes=p.replicas,
                isr_nodes=p.isr, offline_replicas=[]) for p in t.partitions]
            out_topics.append(r.MetadataResponseTopic(
                error_code=kafka_code(t.error_code), name=t.name,
                is_internal=t.name.startswith("__"), partitions=parts))
        return r(throttle_time_ms=0, brokers=brokers, cluster_id=answer.cluster_id,
                 controller_id=answer.controller_id, topics=out_topics)

    # ------------------------------------------------------------------ records
    async def produce(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[0][1]
        refused: dict[str, list[Any]] = {}
        topics: list[ProduceTopic] = []
        # Batches to remember as their client sent them, for Kafka readers (fetch_cache.py).
        keep = self.converted.enabled and request.acks != 0
        produced: dict[tuple[str, int], tuple[bytearray, bytes]] = {}
        for t in request.topic_data:
            parts: list[ProducePartition] = []
            for p in t.partition_data:
                try:
                    if p.records is None:
                        raise InvalidRecordBatchError("records are null")
                    batch = from_kafka(p.records, max_bytes=self.max_record_bytes)
                    subject = self._subject(t.name, p.index)
                    if subject:
                        batch = await to_typed(batch, t.name, subject, self._schema_check())
                    elif keep:  # a copy: the request's buffer is not ours after an await
                        produced[(t.name, p.index)] = (bytearray(p.records), batch)
                except Exception as err:
                    # A conversion bug must fail this partition, not the connection
                    # (librdkafka would resend the same request for ever).
                    if isinstance(err, StrataError):
                        code = _CORRUPT_MESSAGE if type(err) is InvalidRecordBatchError \
                            else kafka_code(err.code)
                        message = err.message
                    else:
                        log.exception("converting a Kafka batch for %s-%d failed", t.name,
                                      p.index)
                        code, message = _UNKNOWN_SERVER_ERROR, f"internal error: {err!r}"
                    refused.setdefault(t.name, []).append(
                        r.TopicProduceResponse.PartitionProduceResponse(
                            index=p.index, error_code=code, base_offset=-1,
                            log_append_time_ms=-1, log_start_offset=-1,
                            error_message=message))
                    continue
                parts.append(ProducePartition(p.index, batch))
            if parts:
                topics.append(ProduceTopic(t.name, parts))
        answers: dict[str, list[Any]] = {}
        if topics:
            answer = await self._strata(
                ApiKey.PRODUCE, ProduceRequest(request.acks, request.timeout_ms, topics,
                                               request.transactional_id), session, header)
            if answer is None:
                return None
            for t in answer.topics:
                for p in t.partitions:
                    pair = produced.get((t.name, p.partition))
                    if pair is not None and p.error_code == 0 and p.base_offset >= 0 \
                            and p.log_append_time < 0:
                        self._keep_produced(t.name, p.partition, p.base_offset, *pair)
                answers[t.name] = [r.TopicProduceResponse.PartitionProduceResponse(
                    index=p.partition, error_code=kafka_code(p.error_code),
                    base_offset=p.base_offset, log_append_time_ms=p.log_append_time,
                    log_start_offset=p.log_start_offset, error_message=p.error_message)
                    for p in t.partitions]
        elif request.acks == 0:
            return None
        for name, parts in refused.items():
            answers.setdefault(name, []).extend(parts)
        return r(responses=[r.TopicProduceResponse(name=n, partition_responses=ps)
                            for n, ps in answers.items()], throttle_time_ms=0)

    def _keep_produced(self, topic: str, partition: int, base_offset: int, sent: bytearray,
                       stored: bytes) -> None:
        """Remember ``sent`` (a copy of a client's v2 batch, appended at ``base_offset``
        as ``stored``) as the v2 form of the stored batch, when ``records.as_stored``
        says the conversion would write the same header. The leader epoch is the
        partition's now, which is the one the append used unless leadership moved
        meanwhile (then the key names no stored batch: never served)."""
        hosted = self.handlers.context.registry.hosted.get((topic, partition))
        if hosted is None:
            return
        head = as_stored(sent, stored, base_offset, hosted.leader_epoch)
        if head is not None:
            self.converted.keep(topic, partition, head, sent)

    async def fetch(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        # The client's byte limits are about the RecordBatch v2 it receives; the log's
        # uncompressed Arrow batches are larger (about 1.15x for 100-byte records:
        # fixed-width offsets and timestamps where v2 has varints; more for smaller
        # records). Read with the limits widened by ``_WIDEN``, then keep what fits the
        # client's limits once converted (``_within``; a compressed batch read beyond
        # them is cut there too). With the limits applied to the stored bytes a 1 MiB
        # partition limit brought one 500 KB batch a fetch where Kafka sends two, and
        # consumers made twice the round trips. What is read and not sent is converted
        # once and cached. The consumer byte quota counts the stored bytes read, so a
        # catching-up Kafka consumer is counted up to _WIDEN / 1.15 of what it gets
        # (docs/security.md).
        topics = [FetchTopic(t.topic, [FetchPartition(
            p.partition, p.fetch_offset, _widened(p.partition_max_bytes),
            p.current_leader_epoch if header.api_version >= 9 else -1)
            for p in t.partitions]) for t in request.topics]
        # Consumer fetch sessions (KIP-227) are declined: every answer carries session id
        # 0, which tells the client to send full fetches (Strata's sessions are its
        # followers'). Forgotten topics only mean something inside a session.
        strata = FetchRequest(
            topics, max_wait_ms=request.max_wait_ms, min_bytes=request.min_bytes,
            max_bytes=_widened(request.max_bytes), replica_id=-1,
            isolation_level=request.isolation_level)
        answer = await self._strata(ApiKey.FETCH, strata, session, header)
        limits = {(t.topic, p.partition): p.partition_max_bytes
                  for t in request.topics for p in t.partitions}
        budget = request.max_bytes
        sent_any = False
        out = []
        ahead: list[tuple[str, int, int, int]] = []
        for t in answer.topics:
            parts = []
            for p in t.partitions:
                error_code = kafka_code(p.error_code)
                try:
                    records = await self._v2_records(t.name, p.partition, p.records)
                except Exception as err:
                    # A typed value that cannot be framed (its schema is gone), or a
                    # conversion bug: the partition fails, the rest of the answer stands.
                    if isinstance(err, StrataError):
                        log.info("fetch of %s-%d from %s: %s", t.name, p.partition,
                                 session.peer, err.message)
                        error_code = _INVALID_RECORD
                    else:
                        log.exception("converting %s-%d for a Kafka fetch failed", t.name,
                                      p.partition)
                        error_code = _UNKNOWN_SERVER_ERROR
                    records = ()
                records = _within(records, min(limits.get((t.name, p.partition), 0),
                                               budget), first=not sent_any)
                if records:
                    sent_any = True
                    budget -= sum(len(r) for r in records)
                    following = _last_offset(records[-1]) + 1
                    limit = _widened(limits.get((t.name, p.partition), 0))
                    if following < p.high_watermark and limit > 0 \
                            and isinstance(p.records, FileSlice):
                        ahead.append((t.name, p.partition, following, limit))
                aborted = [Aborted(a.producer_id, a.first_offset)
                           for a in p.aborted_transactions
                           if records and a.first_offset <= _last_offset(records[-1])] \
                    if request.isolation_level == 1 else None
                parts.append(FetchAnswerPartition(
                    p.partition, error_code, p.high_watermark,
                    p.last_stable_offset if p.last_stable_offset >= 0 else p.high_watermark,
                    p.log_start_offset, aborted, records))
            out.append(FetchAnswerTopic(t.name, parts))
        if ahead and self.converted.enabled:
            self._read_ahead(ahead, request.isolation_level)
        return FetchAnswer(answer.throttle_time_ms, kafka_code(answer.error_code), 0, out)

    def _read_ahead(self, partitions: list[tuple[str, int, int, int]],
                    isolation_level: int) -> None:
        """Convert, into the cache, what a Kafka reader of each ``(topic, partition,
        offset, byte limit)`` will fetch next, while it takes in what it was just sent.

        Why: a consumer fetches a partition again only once it has used what it got, so
        a fetch that converts its batches (data Strata's own clients or Spark wrote) made
        the consumer wait for the conversion on every round trip. Converted here (the
        task runs on the loop's next turn, after the connection has written this answer
        unless an earlier answer on it is still pending), the next fetch finds its
        batches in the cache. Measured (docs/benchmarks.md, fourteenth run): +4 % for
        ConsumerPerformance reading one partition, where it waits for each answer; no
        change on eight partitions over three brokers, where the consumer already worked
        through one broker's answer while another converted.

        Bounds: only partitions whose answer was cut short of the high watermark (a
        reader at the log end costs nothing), one read-ahead per partition at a time,
        at most the reader's own widened limit, and never for typed topics (whose
        framed values are not cached). The read is the leader's as for a fetch, without
        the quota (nothing is sent: the reader's own fetch is counted when it comes) and
        without an ACL check (the reader's fetch of these partitions just passed it, and
        its next one must pass it again to get anything). A failure (the partition
        moved, the segment was deleted) only leaves the batches to be converted by the
        fetch that needs them."""
        todo = [entry for entry in partitions if entry[:2] not in self._ahead
                and not self._subject(entry[0], entry[1])]
        if not todo:
            return
        self._ahead.update(entry[:2] for entry in todo)
        task = asyncio.get_running_loop().create_task(
            self._convert_ahead(todo, isolation_level))
        self._ahead_tasks.add(task)
        task.add_done_callback(self._ahead_tasks.discard)

    async def _convert_ahead(self, todo: list[tuple[str, int, int, int]],
                             isolation_level: int) -> None:
        replicas = self.handlers.context.replicas
        cache = self.converted
        try:
            for index, (topic, partition, offset, limit) in enumerate(todo):
                if index:
                    await asyncio.sleep(0)  # one partition a turn: requests go between
                try:
                    answer = await replicas.fetch_records(FetchRequest(
                        [FetchTopic(topic, [FetchPartition(partition, offset, limit, -1)])],
                        max_wait_ms=0, min_bytes=0, max_bytes=limit, replica_id=-1,
                        isolation_level=isolation_level), authorize=_anyone, quota=_free)
                    for t in answer.topics:
                        for p in t.partitions:
                            if p.error_code == 0 and isinstance(p.records, FileSlice):
                                misses = cache.misses
                                cache.from_slice(t.name, p.partition, p.records, to_kafka)
                                cache.ahead += cache.misses - misses
                except Exception as err:  # the reader's own fetch will say what is wrong
                    log.debug("reading %s-%d ahead from %d: %r", topic, partition, offset,
                              err)
                finally:
                    self._ahead.discard((topic, partition))
        finally:
            for topic, partition, _, _ in todo:
                self._ahead.discard((topic, partition))

    async def _v2_records(self, topic: str, partition: int,
                          records: object) -> Sequence[bytes | bytearray | memoryview]:
        """A fetch answer's ``records`` (a file slice of Strata batches, or bytes) as
        RecordBatch v2 batches: typed topics' values framed (never cached), the rest
        through the converted-batch cache (fetch_cache.py). From a file slice only the
        21 bytes that name a batch are read when the cache has it."""
        if records is None:
            return []
        subject = self._subject(topic, partition)
        cache = self.converted
        if subject or not cache.enabled or not isinstance(records, FileSlice):
            batches = list(iter_strata_batches(records))
            if subject and batches:
                check = self._schema_check()
                framed = [await to_framed(b, topic, subject, check) for b in batches]
                return [to_kafka(b) for b in framed]
            return [cache.converted(topic, partition, b, to_kafka) for b in batches]
        return cache.from_slice(topic, partition, records, to_kafka)

    async def list_offsets(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        strata = ListOffsetsRequest(
            [ListOffsetsTopic(t.name, [ListOffsetsPartition(p.partition_index, p.timestamp)
                                       for p in t.partitions]) for t in request.topics],
            replica_id=-1, isolation_level=request.isolation_level
            if header.api_version >= 2 else 0)
        answer = await self._strata(ApiKey.LIST_OFFSETS, strata, session, header)
        r = API_TYPES[2][1]
        T = r.ListOffsetsTopicResponse
        return r(throttle_time_ms=0, topics=[T(name=t.name, partitions=[
            T.ListOffsetsPartitionResponse(
                partition_index=p.partition, error_code=kafka_code(p.error_code),
                timestamp=p.timestamp, offset=p.offset, leader_epoch=p.leader_epoch)
            for p in t.partitions]) for t in answer.topics])

    async def offset_for_leader_epoch(self, request: Any, header: KafkaHeader,
                                      session: Session) -> Any:
        strata = OffsetForLeaderEpochRequest([OffsetForLeaderEpochTopic(t.topic, [
            OffsetForLeaderEpochPartition(p.partition, p.current_leader_epoch, p.leader_epoch)
            for p in t.partitions]) for t in request.topics], replica_id=-1)
        answer = await self._strata(ApiKey.OFFSET_FOR_LEADER_EPOCH, strata, session, header)
        r = API_TYPES[23][1]
        T = r.OffsetForLeaderTopicResult
        return r(throttle_time_ms=0, topics=[T(topic=t.name, partitions=[
            T.EpochEndOffset(error_code=kafka_code(p.error_code), partition=p.partition,
                             leader_epoch=p.leader_epoch, end_offset=p.end_offset)
            for p in t.partitions]) for t in answer.topics])

    async def init_producer_id(self, request: Any, header: KafkaHeader,
                               session: Session) -> Any:
        strata = InitProducerIdRequest(
            request.transactional_id, request.transaction_timeout_ms,
            request.producer_id if header.api_version >= 3 else -1,
            request.producer_epoch if header.api_version >= 3 else -1)
        answer = await self._strata(ApiKey.INIT_PRODUCER_ID, strata, session, header)
        return API_TYPES[22][1](throttle_time_ms=0, error_code=kafka_code(answer.error_code),
                                producer_id=answer.producer_id,
                                producer_epoch=answer.producer_epoch)

    # ------------------------------------------------------------------ transactions
    async def add_partitions_to_txn(self, request: Any, header: KafkaHeader,
                                    session: Session) -> Any:
        answer = await self._strata(ApiKey.ADD_PARTITIONS_TO_TXN, AddPartitionsToTxnRequest(
            request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            [TxnTopic(t.name, list(t.partitions)) for t in request.v3_and_below_topics]),
            session, header)
        r = API_TYPES[24][1]
        T = r.AddPartitionsToTxnTopicResult
        return r(throttle_time_ms=0, results_by_topic_v3_and_below=[T(
            name=t.name, results_by_partition=[T.AddPartitionsToTxnPartitionResult(
                partition_index=p.partition, partition_error_code=kafka_code(p.error_code))
                for p in t.partitions]) for t in answer.topics])

    async def add_offsets_to_txn(self, request: Any, header: KafkaHeader,
                                 session: Session) -> Any:
        answer = await self._strata(ApiKey.ADD_OFFSETS_TO_TXN, AddOffsetsToTxnRequest(
            request.transactional_id, request.producer_id, request.producer_epoch,
            request.group_id), session, header)
        return API_TYPES[25][1](throttle_time_ms=0, error_code=kafka_code(answer.error_code))

    async def end_txn(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        answer = await self._strata(ApiKey.END_TXN, EndTxnRequest(
            request.transactional_id, request.producer_id, request.producer_epoch,
            bool(request.committed)), session, header)
        return API_TYPES[26][1](throttle_time_ms=0, error_code=kafka_code(answer.error_code))

    async def txn_offset_commit(self, request: Any, header: KafkaHeader,
                                session: Session) -> Any:
        if header.api_version >= 3:
            member_id, member_epoch = self.groups.committer(
                request.group_id, request.member_id, request.generation_id)
            instance_id = request.group_instance_id
        else:
            member_id, member_epoch, instance_id = None, -1, None
        answer = await self._strata(ApiKey.TXN_OFFSET_COMMIT, TxnOffsetCommitRequest(
            request.transactional_id, request.group_id, request.producer_id,
            request.producer_epoch, member_id, member_epoch, instance_id,
            [TxnOffsetCommitTopic(t.name, [TxnOffsetCommitPartition(
                p.partition_index, p.committed_offset, p.committed_metadata)
                for p in t.partitions]) for t in request.topics]), session, header)
        r = API_TYPES[28][1]
        T = r.TxnOffsetCommitResponseTopic
        return r(throttle_time_ms=0, topics=[T(name=t.name, partitions=[
            T.TxnOffsetCommitResponsePartition(
                partition_index=p.partition, error_code=self.groups.commit_code(p.error_code))
            for p in t.partitions]) for t in answer.topics])

    # ------------------------------------------------------------------ groups' offsets
    async def find_coordinator(self, request: Any, header: KafkaHeader,
                               session: Session) -> Any:
        r = API_TYPES[10][1]
        keys = list(request.coordinator_keys) if header.api_version >= 4 else [request.key]
        key_type = request.key_type if header.api_version >= 1 else 0
        found = []
        for key in keys:
            answer = await self._strata(ApiKey.FIND_COORDINATOR,
                                        FindCoordinatorRequest(key, key_type), session, header)
            found.append((key, answer))
        if header.api_version >= 4:
            return r(throttle_time_ms=0, coordinators=[r.Coordinator(
                key=k, node_id=a.node_id, host=a.host, port=a.port,
                error_code=kafka_code(a.error_code), error_message=a.error_message)
                for k, a in found])
        _, a = found[0]
        return r(throttle_time_ms=0, error_code=kafka_code(a.error_code),
                 error_message=a.error_message, node_id=a.node_id, host=a.host, port=a.port)

    async def offset_commit(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        member_id, member_epoch = self.groups.committer(
            request.group_id, request.member_id, request.generation_id_or_member_epoch)
        strata = OffsetCommitRequest(request.group_id, member_id, member_epoch, [
            OffsetCommitTopic(t.name, [OffsetCommitPartition(
                p.partition_index, p.committed_offset, p.committed_metadata)
                for p in t.partitions]) for t in request.topics])
        answer = await self._strata(ApiKey.OFFSET_COMMIT, strata, session, header)
        r = API_TYPES[8][1]
        T = r.OffsetCommitResponseTopic
        return r(throttle_time_ms=0, topics=[T(name=t.name, partitions=[
            T.OffsetCommitResponsePartition(partition_index=p.partition,
                                            error_code=self.groups.commit_code(p.error_code))
            for p in t.partitions]) for t in answer.topics])

    async def offset_fetch(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[9][1]
        if header.api_version >= 8:
            groups = [(g.group_id, g.topics) for g in request.groups]
        else:
            groups = [(request.group_id, request.topics)]
        results = []
        for group_id, topics in groups:
            wanted = None if topics is None else [
                GroupTopicPartitions(t.name, list(t.partition_indexes)) for t in topics]
            answer = await self._strata(
                ApiKey.OFFSET_FETCH, OffsetFetchRequest(
                    group_id, wanted, require_stable=bool(
                        getattr(request, "require_stable", False))), session, header)
            results.append((group_id, answer))
        if header.api_version >= 8:
            G = r.OffsetFetchResponseGroup
            T = G.OffsetFetchResponseTopics
            return r(throttle_time_ms=0, groups=[G(
                group_id=g, error_code=kafka_code(a.error_code), topics=[T(
                    name=t.name, partitions=[T.OffsetFetchResponsePartitions(
                        partition_index=p.partition, committed_offset=p.offset,
                        committed_leader_epoch=-1, metadata=p.metadata or "",
                        error_code=kafka_code(p.error_code)) for p in t.partitions])
                    for t in a.topics]) for g, a in results])
        _, a = results[0]
        T = r.OffsetFetchResponseTopic
        return r(throttle_time_ms=0, error_code=kafka_code(a.error_code), topics=[T(
            name=t.name, partitions=[T.OffsetFetchResponsePartition(
                partition_index=p.partition, committed_offset=p.offset,
                committed_leader_epoch=-1, metadata=p.metadata or "",
                error_code=kafka_code(p.error_code)) for p in t.partitions])
            for t in a.topics])

    # ------------------------------------------------------------------ admin
    async def create_topics(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        strata = CreateTopicsRequest([CreatableTopic(
            t.name, t.num_partitions, t.replication_factor,
            [ConfigEntry(c.name, c.value) for c in t.configs],
            [ReplicaAssignment(a.partition_index, list(a.broker_ids)) for a in t.assignments])
            for t in request.topics], timeout_ms=request.timeout_ms,
            validate_only=request.validate_only)
        answer = await self._strata(ApiKey.CREATE_TOPICS, strata, session, header)
        r = API_TYPES[19][1]
        asked = {t.name: t for t in request.topics}
        out = []
        for t in answer.topics:
            spec = asked.get(t.name)
            out.append(r.CreatableTopicResult(
                name=t.name, error_code=kafka_code(t.error_code), error_message=t.error_message,
                num_partitions=spec.num_partitions if spec else -1,
                replication_factor=spec.replication_factor if spec else -1, configs=None))
        return r(throttle_time_ms=0, topics=out)

    async def delete_topics(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        names = [t.name for t in request.topics] if header.api_version >= 6 \
            else list(request.topic_names)
        answer = await self._strata(ApiKey.DELETE_TOPICS,
                                    DeleteTopicsRequest(names, request.timeout_ms), session,
                                    header)
        r = API_TYPES[20][1]
        return r(throttle_time_ms=0, responses=[r.DeletableTopicResult(
            name=t.name, error_code=kafka_code(t.error_code), error_message=t.error_message)
            for t in answer.topics])

    async def describe_configs(self, request: Any, header: KafkaHeader,
                               session: Session) -> Any:
        r = API_TYPES[32][1]
        R = r.DescribeConfigsResult
        results = []
        topics = [res for res in request.resources if res.resource_type == 2]
        if topics:
            answer = await self._strata(
                ApiKey.DESCRIBE_CONFIGS,
                DescribeConfigsRequest([res.resource_name for res in topics]), session, header)
            for t in answer.topics:
                results.append(R(
                    error_code=kafka_code(t.error_code), error_message=t.error_message,
                    resource_type=2, resource_name=t.name, configs=[
                        R.DescribeConfigsResourceResult(
                            name=c.name, value=c.value, read_only=False,
                            config_source=5 if c.is_default else 1, is_sensitive=False,
                            synonyms=[], config_type=0, documentation=None)
                        for c in t.configs]))
        for res in request.resources:
            if res.resource_type != 2:  # brokers and others: nothing to describe yet
                results.append(R(error_code=0, error_message=None,
                                 resource_type=res.resource_type,
                                 resource_name=res.resource_name, configs=[]))
        return r(throttle_time_ms=0, results=results)

    async def describe_cluster(self, request: Any, header: KafkaHeader,
                               session: Session) -> Any:
        answer = await self._strata(ApiKey.METADATA, MetadataRequest([]), session, header)
        r = API_TYPES[60][1]
        return r(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1,
                 cluster_id=answer.cluster_id or "", controller_id=answer.controller_id,
                 brokers=[r.DescribeClusterBroker(broker_id=b.node_id, host=b.host,
                                                  port=b.port, rack=None)
                          for b in answer.brokers])


def request_level_code(err: StrataError) -> int:
    """The Kafka code for a request that failed as a whole."""
    if isinstance(err, UnsupportedVersionError):
        return _UNSUPPORTED_VERSION
    if isinstance(err, InvalidRequestError):
        return _INVALID_REQUEST
    return kafka_code(err.code)
