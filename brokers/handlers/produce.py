"""Writes: Produce, and the Spark sink's StageRecords, CommitStaged and AbortStaged.

Thin over the replica manager, which appends, waits for the acknowledgement ``acks``
asks for and answers (``ReplicaManager.append_records``, ``commit_staged``); this
family adds what it is given as checks: WRITE on the topic, records present, no client
writes to an internal topic, and typed topics' batches matching their value schema
(checked before anything of the request is written, docs/typed-topics.md), and counts
the bytes against the producer quota. A produce naming a transactional id also needs
WRITE on it, and its first transactional batch per partition is verified with the
transaction coordinator (``transactions.py`` answers the transaction APIs and
InitProducerId). So does a CommitStaged inside a transaction (version 1: the
exactly-once Spark sink's commit).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable

from brokers.answers import answer_each
from brokers.handlers.context import (
    INTERNAL_PREFIX,
    ApiContext,
    ApiFamily,
    Handler,
)
from wire.errors import (
    InvalidRequestError,
    PolicyViolationError,
    SchemaMismatchError,
    StrataError,
)
from wire.protocol import (
    AbortPartition,
    AbortPartitionResponse,
    AbortStagedRequest,
    AbortStagedResponse,
    AbortTopicResponse,
    ApiKey,
    CommitStagedRequest,
    CommitStagedResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    StagePartition,
    StagePartitionResponse,
    StageRecordsRequest,
    StageRecordsResponse,
    StageTopic,
    StageTopicResponse,
)

__all__ = ["ProduceApis"]


class ProduceApis(ApiFamily):
    """The write APIs, over the replica manager's appends."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.replicas = context.replicas
        self.schema_check = context.schema_check
        self.acls = context.acls
        # The checks and the quota the replica manager calls back, made once (not a
        # bound method per request).
        self._admit_produce = self._admit_write
        self._admit_commit = functools.partial(context.require, "WRITE", "TOPIC")
        self._produce_quota = functools.partial(context.throttle, "producer_byte_rate")
        self._schema_checks = self._schema_refusals

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.PRODUCE: self.produce,
            ApiKey.STAGE_RECORDS: self.stage_records,
            ApiKey.COMMIT_STAGED: self.commit_staged,
            ApiKey.ABORT_STAGED: self.abort_staged,
        }

    def produce(self, request: ProduceRequest) -> Awaitable[ProduceResponse | None]:
        if request.transactional_id is not None:
            return self._transactional_produce(request)
        return self.replicas.append_records(
            request.acks, request.timeout_ms, request.topics, admit=self._admit_produce,
            refusals=self._schema_checks, quota=self._produce_quota)

    async def _transactional_produce(self, request: ProduceRequest) -> ProduceResponse | None:
        """A produce naming a transactional id: WRITE on it, and the first transactional
        batch of a producer in a partition verified with its coordinator."""
        assert request.transactional_id is not None
        refused = self._refusal("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
        if refused is not None:
            def deny(topic: str, part: ProducePartition) -> None:
                raise refused
            admit = deny
        else:
            admit = self._admit_produce
        transactions = self.context.transactions
        return await self.replicas.append_records(
            request.acks, request.timeout_ms, request.topics, admit=admit,
            refusals=self._schema_checks, quota=self._produce_quota,
            transactional_id=request.transactional_id,
            verify=transactions.verify if transactions is not None else None)

    def _admit_write(self, topic: str, part: ProducePartition) -> None:
        self._require("WRITE", "TOPIC", topic)
        self._check_write(topic, part.records)

    async def _schema_refusals(self, topics: Iterable[ProduceTopic | StageTopic]
                               ) -> dict[tuple[str, int], StrataError]:
        """Typed topics' batches that do not match their value subject, checked before
        anything of the request is written (docs/typed-topics.md). Only batches the
        append would take otherwise are checked: a caller without WRITE, or a partition
        not led here, costs no schema work (and no registry round trip)."""
        refused: dict[tuple[str, int], StrataError] = {}
        for topic in topics:
            writable: bool | None = None
            for part in topic.partitions:
                hosted = self.registry.hosted.get((topic.name, part.partition))
                if hosted is None or part.records is None or not hosted.is_leader \
                        or hosted.fenced:
                    continue  # the append answers why
                subject = hosted.config.value_schema_subject
                if not subject:
                    continue
                if writable is None:
                    # audit=False: the append's own check writes the refusal's audit line
                    writable = self._allowed("WRITE", "TOPIC", topic.name, audit=False)
                if not writable:
                    continue  # the append refuses it
                if self.schema_check is None:
                    refused[(topic.name, part.partition)] = SchemaMismatchError(
                        f"topic {topic.name!r} is typed and this broker has no schema "
                        "registry; upgrade it")
                    continue
                try:
                    verdict = await self.schema_check.verdict(topic.name, subject,
                                                              part.records)
                except StrataError as err:  # the registry is unreachable: retriable
                    refused[(topic.name, part.partition)] = err
                    continue
                if verdict is not None:
                    refused[(topic.name, part.partition)] = SchemaMismatchError(
                        f"{verdict}; nothing of the batch was written")
        return refused

    @staticmethod
    def _check_write(topic: str, records: object) -> None:
        """What a client may write (Produce, StageRecords): records, and not to an
        internal topic."""
        if records is None:
            raise InvalidRequestError("records are null")
        if topic.startswith(INTERNAL_PREFIX):
            raise PolicyViolationError(
                f"topic {topic!r} is internal: only the group coordinator writes to it "
                "(commit offsets with OffsetCommit)")

    async def stage_records(self, request: StageRecordsRequest) -> StageRecordsResponse:
        refused = await self._schema_refusals(request.topics)

        def stage(topic: str, part: StagePartition, answer: StagePartitionResponse) -> None:
            self._require("WRITE", "TOPIC", topic)
            self._check_write(topic, part.records)
            partition = self.replicas.leader_partition(topic, part.partition)
            if refused and (topic, part.partition) in refused:
                raise refused[(topic, part.partition)]
            assert part.records is not None  # checked by _check_write
            answer.duplicate = partition.stage(request.staging_id, part.chunk_sequence,
                                               part.records)

        answered = answer_each(
            request.topics, lambda p: StagePartitionResponse(p, 0), stage,
            disk_failure="staging on {partition} failed: {err}; fix the disk, then re-run "
            "the task")
        return StageRecordsResponse([StageTopicResponse(t, a) for t, a in answered])

    def commit_staged(self, request: CommitStagedRequest) -> Awaitable[CommitStagedResponse]:
        if request.transactional_id is None:
            return self.replicas.commit_staged(request, admit=self._admit_commit)
        # A commit inside a transaction (the exactly-once Spark sink): WRITE on the
        # transactional id too, and its first write per partition verified with the
        # transaction coordinator, as for a transactional produce.
        refused = self._refusal("WRITE", "TRANSACTIONAL_ID", request.transactional_id)
        if refused is not None:
            def deny(topic: str) -> None:
                raise refused
            admit: Callable[[str], None] = deny
        else:
            admit = self._admit_commit
        transactions = self.context.transactions
        return self.replicas.commit_staged(
            request, admit=admit,
            verify=transactions.verify if transactions is not None else None)

    async def abort_staged(self, request: AbortStagedRequest) -> AbortStagedResponse:
        def abort(topic: str, part: AbortPartition, answer: AbortPartitionResponse) -> None:
            self._require("WRITE", "TOPIC", topic)
            partition = self.replicas.leader_partition(topic, part.partition)
            answer.discarded = partition.abort_staged(list(part.staging_ids))

        answered = answer_each(request.topics, lambda p: AbortPartitionResponse(p, 0), abort)
        return AbortStagedResponse([AbortTopicResponse(t, a) for t, a in answered])
