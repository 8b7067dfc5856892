"""Metadata and cluster administration: ApiVersions, Metadata, topics (create, delete,
describe and alter configs), leader elections and partition reassignments.

Thin over the metadata cache (answers), the ZooKeeper client (every change is a
ZooKeeper write, which reaches every broker through its watches; a change waits until
this broker's cache shows it, up to the request's timeout) and the controller (elections
and reassignments are requests it carries out).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterable

from brokers.acl import CLUSTER_NAME
from brokers.answers import answer_each, error_fields
from brokers.controller import assign_replicas
from brokers.coordination import ConcurrentUpdateError, TopicDefinition
from brokers.handlers.context import (
    INTERNAL_PREFIX,
    ApiContext,
    ApiFamily,
    Handler,
    current_session,
)
from brokers.log import LogConfig
from brokers.log.config import TOPIC_CONFIG_KEYS
from wire.errors import (
    BrokerNotAvailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    PolicyViolationError,
    RequestTimedOutError,
    StrataError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from wire.protocol import (
    API_VERSIONS,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ApiKey,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerInfo,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribedConfig,
    ElectionPartitionResult,
    ElectionTopic,
    ElectionTopicResult,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    MetadataRequest,
    MetadataResponse,
    OngoingReassignment,
    PartitionMetadata,
    ReassignablePartition,
    TopicConfigs,
    TopicMetadata,
    TopicResult,
)

__all__ = ["AdminApis", "MAX_PARTITIONS", "valid_topic_name"]

# Partitions of one topic: its metadata goes to ZooKeeper in one multi-op, and ZooKeeper
# refuses requests above jute.maxbuffer (1 MiB); 4,096 partitions stay well below it.
MAX_PARTITIONS = 4096
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def valid_topic_name(name: str) -> bool:
    return bool(_TOPIC_NAME.match(name)) and name not in (".", "..")


def _check_replica_list(where: str, replicas: list[int], live: Iterable[int]) -> None:
    """A replica list names each broker once, and only live ones (CreateTopics with
    explicit assignments, AlterPartitionReassignments)."""
    if len(set(replicas)) != len(replicas):
        raise InvalidReplicationFactorError(f"{where}: a broker is listed twice in {replicas}")
    live = sorted(live)
    dead = [b for b in replicas if b not in live]
    if dead:
        raise InvalidReplicationFactorError(
            f"{where}: brokers {dead} are not live (live: {live}); start them first")


class AdminApis(ApiFamily):
    """The metadata and administration APIs, over the cache, ZooKeeper and the controller."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.controller = context.controller

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.ALTER_CONFIGS: self.alter_configs,
            ApiKey.ELECT_LEADERS: self.elect_leaders,
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            ApiKey.LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
        }

    async def api_versions(self, request: ApiVersionsRequest) -> ApiVersionsResponse:
        return ApiVersionsResponse(0, [ApiVersionRange(int(k), lo, hi)
                                       for k, (lo, hi) in API_VERSIONS.items()])

    async def metadata(self, request: MetadataRequest) -> MetadataResponse:
        if self.host.cut_off_from_zookeeper:
            # Its cache stops at the moment it lost ZooKeeper (and still names it leader
            # of what the controller has moved since): clients must ask another broker.
            raise BrokerNotAvailableError(
                f"broker {self.config.broker_id} is cut off from ZooKeeper and its view of "
                "the cluster may be stale; ask another broker (the client does so by "
                "itself)")
        b = self.cluster
        listener = current_session().listener.name
        brokers = [BrokerInfo(r.broker_id, *r.endpoint(listener))
                   for r in sorted(b.live_brokers.values(), key=lambda r: r.broker_id)]
        if request.topics is None:  # only what the principal may describe, unannounced
            names = [t for t in sorted(b.topics) if self._allowed("DESCRIBE", "TOPIC", t,
                                                                   audit=False)]
        else:
            names = request.topics
        topics: list[TopicMetadata] = []
        for name in names:
            if request.topics is not None and not self._allowed("DESCRIBE", "TOPIC", name):
                # Refused whether or not it exists: the answer must not reveal that.
                denied = TopicAuthorizationFailedError(
                    f"{current_session().principal} may not describe topic {name!r}")
                topics.append(TopicMetadata(denied.code, name, []))
                continue
            definition = b.topics.get(name)
            if definition is None:
                err = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                topics.append(TopicMetadata(err.code, name, []))
                continue
            partitions = []
            for p, replicas in definition.assignment.items():
                state = b.partition_states.get((name, p))
                leader = state.leader if state else -1
                if leader not in b.live_brokers:
                    leader = -1
                partitions.append(PartitionMetadata(
                    0, p, leader, state.leader_epoch if state else -1, list(replicas),
                    list(state.isr) if state else []))
            # Set only at creation, so always an override (value.schema.subject).
            subject = b.topic_overrides.get(name, {}).get("value.schema.subject") or None
            topics.append(TopicMetadata(0, name, partitions, subject))
        current = self.controller.current
        return MetadataResponse(brokers, current[0] if current else -1, topics, b.cluster_id)

    async def create_topics(self, request: CreateTopicsRequest) -> CreateTopicsResponse:
        results: list[TopicResult] = []
        created: list[int] = []  # indexes into results, awaited together at the end
        writes: list[tuple[int, TopicDefinition, dict[str, str]]] = []
        may_create_any = self._allowed("CREATE", "CLUSTER", CLUSTER_NAME, audit=False)
        for topic in request.topics:
            try:
                if not may_create_any:
                    self._require("CREATE", "TOPIC", topic.name)
                named = {b for a in topic.assignments for b in a.broker_ids}
                live_now = set(self.cluster.live_brokers)
                if not named <= live_now or topic.replication_factor > len(live_now):
                    # The live view follows a ZooKeeper watch, which lags a registration
                    # by a moment: read ZooKeeper itself before refusing a new broker or
                    # a replication factor above the brokers seen so far.
                    await self.host.refresh_brokers()
                definition, overrides = self._plan_topic(
                    topic.name, topic.num_partitions, topic.replication_factor,
                    {c.name: c.value or "" for c in topic.configs},
                    {a.partition: list(a.broker_ids) for a in topic.assignments})
                if not request.validate_only:
                    writes.append((len(results), definition, overrides))
                results.append(TopicResult(topic.name, 0, None))
            except StrataError as err:
                results.append(TopicResult(topic.name, *error_fields(err)))
        # The ZooKeeper transactions of all of them at once: they pipeline on the one
        # session instead of costing a round trip (and a ZooKeeper fsync) each in turn.
        outcomes = await asyncio.gather(*(
            asyncio.to_thread(self.zookeeper.create_topic, definition, overrides)
            for _, definition, overrides in writes), return_exceptions=True)
        for (index, _, _), outcome in zip(writes, outcomes, strict=True):
            if isinstance(outcome, StrataError):
                results[index] = TopicResult(results[index].name, *error_fields(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                created.append(index)
        # One wait for all of them: the broker loads topics that arrive together in one
        # batch (pipelined reads, logs opened in parallel), not one after the other.
        for index in created:
            try:
                await self._await_topic(results[index].name, present=True,
                                        timeout_ms=request.timeout_ms)
            except StrataError as err:
                results[index] = TopicResult(results[index].name, *error_fields(err))
        return CreateTopicsResponse(results)

    def _plan_topic(self, name: str, partitions: int, replication: int,
                    configs: dict[str, str], explicit: dict[int, list[int]]
                    ) -> tuple[TopicDefinition, dict[str, str]]:
        if not valid_topic_name(name):
            raise InvalidTopicError(
                f"topic name {name!r} is not valid: use 1-249 characters from [a-zA-Z0-9._-], "
                "not '.' or '..'")
        if name.startswith(INTERNAL_PREFIX):
            raise PolicyViolationError(
                f"topic {name!r}: names starting with '__' are reserved for internal topics")
        if name in self.cluster.topics:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        live = sorted(self.cluster.live_brokers)
        LogConfig.from_mapping(configs, base=self.config.log_defaults)
        if explicit:
            return TopicDefinition(name, uuid.uuid4().hex,
                                   self._check_assignment(explicit, partitions, replication,
                                                          live)), dict(configs)
        partitions = self.config.num_partitions if partitions == -1 else partitions
        replication = self.config.default_replication_factor if replication == -1 \
            else replication
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"partition count {partitions} is not valid; use 1..{MAX_PARTITIONS} (the "
                "topic's metadata is written to ZooKeeper in one transaction)")
        if not 1 <= replication <= len(live):
            raise InvalidReplicationFactorError(
                f"replication factor {replication} is not valid with {len(live)} live "
                f"broker(s) {live}; use 1..{len(live)} or start more brokers")
        assignment = assign_replicas(live, partitions, replication)
        return TopicDefinition(name, uuid.uuid4().hex, assignment), dict(configs)

    @staticmethod
    def _check_assignment(explicit: dict[int, list[int]], partitions: int, replication: int,
                          live: list[int]) -> dict[int, list[int]]:
        if partitions != -1 or replication != -1:
            raise InvalidRequestError(
                "give either explicit replica assignments or partition count and replication "
                "factor, not both (set both counts to -1)")
        if len(explicit) > MAX_PARTITIONS:
            raise InvalidPartitionsError(
                f"{len(explicit)} partitions is more than {MAX_PARTITIONS}")
        if sorted(explicit) != list(range(len(explicit))):
            raise InvalidPartitionsError(
                f"assignments name partitions {sorted(explicit)}; they must be 0..n-1")
        sizes = {len(r) for r in explicit.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise InvalidReplicationFactorError(
                "every partition needs the same, non-zero number of replicas")
        for p, replicas in explicit.items():
            _check_replica_list(f"partition {p}", replicas, live)
        return dict(sorted(explicit.items()))

    async def _await_topic(self, name: str, *, present: bool, timeout_ms: int) -> None:
        """Wait until this broker's view of ``name`` matches (watches are asynchronous).

        ``timeout_ms <= 0`` does not wait: the change is made, as in Kafka.
        """
        if timeout_ms <= 0:
            return
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while (name in self.cluster.topics) != present:
            if time.monotonic() >= deadline:
                raise RequestTimedOutError(
                    f"topic {name!r} was {'created' if present else 'deleted'} in ZooKeeper "
                    "but this broker has not caught up yet; check again shortly")
            await self.host.sync_topics()
            if (name in self.cluster.topics) != present:
                await asyncio.sleep(0.02)

    async def delete_topics(self, request: DeleteTopicsRequest) -> DeleteTopicsResponse:
        results = []
        for name in request.topics:
            try:
                self._require("DELETE", "TOPIC", name)
                if name.startswith(INTERNAL_PREFIX):
                    raise PolicyViolationError(
                        f"topic {name!r} is internal (the consumer groups' offsets and "
                        "membership): it cannot be deleted; delete groups with DeleteGroups "
                        "(strata group delete)")
                await asyncio.to_thread(self.zookeeper.delete_topic, name)
                await self._await_topic(name, present=False, timeout_ms=request.timeout_ms)
                results.append(TopicResult(name, 0, None))
            except StrataError as err:
                results.append(TopicResult(name, *error_fields(err)))
        return DeleteTopicsResponse(results)

    async def describe_configs(self, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
        out = []
        defaults = self.config.log_defaults.to_mapping()
        for name in request.topics:
            refused = self._refusal("DESCRIBE_CONFIGS", "TOPIC", name)
            if refused is None and name not in self.cluster.topics:
                refused = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            if refused is not None:
                out.append(TopicConfigs(name, refused.code, refused.message, []))
                continue
            overrides = self.cluster.topic_overrides.get(name, {})
            effective = self.host.log_config_for(name).to_mapping()
            out.append(TopicConfigs(name, 0, None, [
                DescribedConfig(key, effective[key],
                                key not in overrides and effective[key] == defaults[key])
                for key in TOPIC_CONFIG_KEYS]))
        return DescribeConfigsResponse(out)

    async def alter_configs(self, request: AlterConfigsRequest) -> AlterConfigsResponse:
        results = []
        for topic in request.topics:
            try:
                self._require("ALTER_CONFIGS", "TOPIC", topic.name)
                if topic.name not in self.cluster.topics:
                    raise UnknownTopicOrPartitionError(f"topic {topic.name!r} does not exist")
                for _ in range(5):
                    current, version = await asyncio.to_thread(
                        self.zookeeper.topic_configs, topic.name)
                    updated = dict(current)
                    for key in topic.delete:
                        if key not in TOPIC_CONFIG_KEYS:
                            raise InvalidConfigError(f"unknown topic config {key!r}")
                        updated.pop(key, None)
                    for entry in topic.set:
                        updated[entry.name] = entry.value or ""
                    LogConfig.from_mapping(updated, base=self.config.log_defaults)
                    if updated.get("value.schema.subject", "") != \
                            current.get("value.schema.subject", ""):
                        raise PolicyViolationError(
                            f"value.schema.subject of topic {topic.name!r} is set when the "
                            "topic is created and never changes (its batches are all bytes "
                            "or all typed); create a new topic, or evolve the subject's "
                            "schema instead (strata schema register)")
                    if topic.name.startswith(INTERNAL_PREFIX) and \
                            updated.get("cleanup.policy", "compact") != "compact":
                        raise PolicyViolationError(
                            f"topic {topic.name!r} is internal and must stay "
                            "cleanup.policy=compact (its latest record per key is the "
                            "groups' state); other configs may change")
                    if request.validate_only:
                        break
                    try:
                        await asyncio.to_thread(self.zookeeper.set_topic_configs,
                                                topic.name, updated, version)
                        await self.host.on_configs_changed(topic.name, updated)
                        break
                    except ConcurrentUpdateError:
                        continue
                else:
                    raise RequestTimedOutError(
                        f"configs of {topic.name!r} kept changing concurrently; retry")
                results.append(TopicResult(topic.name, 0, None))
            except StrataError as err:
                results.append(TopicResult(topic.name, *error_fields(err)))
        return AlterConfigsResponse(results)

    def _known_partitions(self, topics: list[ElectionTopic] | None
                          ) -> tuple[list[tuple[str, int]], list[ElectionTopicResult]]:
        """The partitions a request names that exist, and error answers for the rest."""
        if topics is None:
            return [(t, p) for t, d in sorted(self.cluster.topics.items())
                    for p in d.assignment], []
        known: list[tuple[str, int]] = []
        errors: list[ElectionTopicResult] = []
        for topic in topics:
            definition = self.cluster.topics.get(topic.name)
            bad = []
            for p in topic.partitions:
                if definition is not None and p in definition.assignment:
                    known.append((topic.name, p))
                else:
                    err = UnknownTopicOrPartitionError(
                        f"{topic.name}-{p} does not exist; check `strata topic describe`")
                    bad.append(ElectionPartitionResult(p, err.code, -1, err.message))
            if bad:
                errors.append(ElectionTopicResult(topic.name, bad))
        return known, errors

    async def elect_leaders(self, request: ElectLeadersRequest) -> ElectLeadersResponse:
        self._require("ALTER", "CLUSTER")
        known, results = self._known_partitions(request.topics)
        zookeeper = self.zookeeper
        by_topic: dict[str, list[ElectionPartitionResult]] = {}
        failure: StrataError | None = None
        if known:
            try:
                await asyncio.to_thread(zookeeper.request_preferred_election,
                                        None if request.topics is None else known)
                deadline = time.monotonic() + max(request.timeout_ms, 1) / 1000
                while await asyncio.to_thread(zookeeper.preferred_election_pending):
                    if time.monotonic() >= deadline:
                        raise RequestTimedOutError(
                            f"the controller did not finish the election within "
                            f"{request.timeout_ms} ms (is a controller running? see "
                            "`strata cluster describe`); it may still happen")
                    await asyncio.sleep(0.05)
            except StrataError as err:
                code, message = error_fields(err)
                failure = error_for_code(code)(message or "")
        for topic, p in known:
            if failure is not None:
                answer = ElectionPartitionResult(p, failure.code, -1, failure.message)
            else:
                state = await asyncio.to_thread(zookeeper.partition_state, topic, p)
                preferred = self.cluster.topics[topic].assignment[p][0]
                answer = ElectionPartitionResult(p, 0, state.leader)
                if state.leader != preferred:
                    answer.error_message = (
                        f"preferred replica {preferred} is not alive or not in sync "
                        f"(ISR {state.isr}); leader stays {state.leader}")
            by_topic.setdefault(topic, []).append(answer)
        results += [ElectionTopicResult(t, ps) for t, ps in by_topic.items()]
        return ElectLeadersResponse(results)

    async def alter_partition_reassignments(self, request: AlterPartitionReassignmentsRequest
                                            ) -> AlterPartitionReassignmentsResponse:
        self._require("ALTER", "CLUSTER")
        wanted: dict[tuple[str, int], list[int]] = {}
        answers: dict[str, list[ElectionPartitionResult]] = {}
        named = {b for t in request.topics for part in t.partitions for b in part.replicas}
        if not named <= set(self.cluster.live_brokers):
            await self.host.refresh_brokers()  # the watched view may lag ZooKeeper
        live = set(self.cluster.live_brokers)

        def check(topic: str, part: ReassignablePartition,
                  answer: ElectionPartitionResult) -> None:
            definition = self.cluster.topics.get(topic)
            if definition is None or part.partition not in definition.assignment:
                raise UnknownTopicOrPartitionError(
                    f"{topic}-{part.partition} does not exist; check `strata topic describe`")
            replicas = list(part.replicas)
            if not replicas:
                raise InvalidReplicationFactorError(
                    f"{topic}-{part.partition}: give at least one replica (cancelling a "
                    "reassignment is not supported; reassign back to the old replicas "
                    "instead)")
            _check_replica_list(f"{topic}-{part.partition}", replicas, live)
            wanted[(topic, part.partition)] = replicas

        for name, checked in answer_each(
                request.topics, lambda p: ElectionPartitionResult(p, 0, -1), check):
            answers.setdefault(name, []).extend(checked)
        if wanted:
            zookeeper = self.zookeeper
            try:
                for _ in range(10):
                    pending, version = await asyncio.to_thread(zookeeper.reassignments)
                    pending.update(wanted)
                    try:
                        await asyncio.to_thread(zookeeper.write_reassignments, pending,
                                                version)
                        break
                    except ConcurrentUpdateError:
                        continue
                else:
                    raise RequestTimedOutError(
                        "other reassignments kept changing concurrently; retry")
            except StrataError as err:
                code, message = error_fields(err)
                for parts in answers.values():
                    for answer in parts:
                        if answer.error_code == 0:
                            answer.error_code, answer.error_message = code, message
        return AlterPartitionReassignmentsResponse(
            [ElectionTopicResult(t, ps) for t, ps in answers.items()])

    async def list_partition_reassignments(self, request: ListPartitionReassignmentsRequest
                                           ) -> ListPartitionReassignmentsResponse:
        self._require("DESCRIBE", "CLUSTER")
        zookeeper = self.zookeeper
        pending, _ = await asyncio.to_thread(zookeeper.reassignments)
        out = []
        for (topic, p), target in sorted(pending.items()):
            definition = self.cluster.topics.get(topic)
            current = definition.assignment.get(p, []) if definition else []
            try:
                isr = (await asyncio.to_thread(zookeeper.partition_state, topic, p)).isr
            except StrataError:
                isr = []
            # Joining: a target replica not in the replica set yet, or still copying.
            out.append(OngoingReassignment(
                topic, p, list(current), [b for b in target if b not in current or b not in isr],
                [b for b in current if b not in target]))
        return ListPartitionReassignmentsResponse(out)
