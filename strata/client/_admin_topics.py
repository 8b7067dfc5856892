"""Admin API family: topics, their configs and their offsets.

Part of the admin client (``strata.client.admin`` is the face; ``_admin_common`` lists
the families). Requests that any broker can answer (topic admin, configs, metadata) go
to the first broker that answers; offsets go to each partition's leader.

Error reporting, and why: the topic APIs (``create_topics``, ``delete_topics``) take many
topics in one request and the broker answers per topic. By default the first failed
topic's typed error (``InvalidTopicError``, ``TopicAlreadyExistsError``,
``InvalidConfigError``, ...) is raised with the broker's message, which is what a script
creating one topic wants. The broker still acted on every other topic in the request, so
``raise_errors=False`` returns ``{name: None | error}`` for callers that create many topics
and want every outcome. Single-topic calls (``alter_configs``) and reads
(``describe_*``, ``list_offsets``) always raise.

Validation lives in the broker (one source of truth for names, counts and config values);
the client sends what it is given and turns the answer into typed errors.

Where each number in ``describe_topics`` comes from: leader, replicas and ISR from
``Metadata``; the high watermark from ``ListOffsets(latest)``; then one ``Fetch`` at the
high watermark with no wait (it carries no records) returns the log start offset, the log
end offset and a fresh high watermark in its partition answer. So no new API is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeAlias

from strata.client._admin_common import AdminContext
from strata.client._common import TopicPartition, error_from_code
from strata.client._config import IsolationLevel
from strata.client._offsets import list_offsets, list_offsets_once
from wire.errors import OffsetOutOfRangeError, StrataError
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterConfigsTopic,
    ApiKey,
    ConfigEntry,
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    TopicResult,
    group_by_topic,
)

__all__ = [
    "ConfigValue",
    "ListOffsetsResult",
    "NewTopic",
    "OffsetSpec",
    "PartitionDescription",
    "TopicAdmin",
    "TopicDescription",
    "topic_results",
]


#: ``"earliest"`` (log start offset), ``"latest"`` (high watermark) or a timestamp in ms.
OffsetSpec: TypeAlias = Literal["earliest", "latest"] | int


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. ``-1`` partitions / replication factor: the broker's defaults
    (``num.partitions``, ``default.replication.factor``). ``configs`` are per-topic
    overrides such as ``{"retention.ms": "86400000"}`` (values are sent as strings)."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition as ``describe_topics`` sees it. Offsets are ``-1`` when the leader
    could not be asked (no live leader, or it failed to answer)."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionDescription, ...]

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """A topic config's effective value; ``is_default``: no override is set for it."""

    name: str
    value: str | None
    is_default: bool


class ListOffsetsResult(NamedTuple):
    """``offset`` is ``-1`` for a timestamp after every record. ``timestamp`` is the found
    record's timestamp for a timestamp lookup (``-1`` for earliest/latest or no match)."""

    offset: int
    timestamp: int
    leader_epoch: int


def spec_timestamp(tp: TopicPartition, spec: OffsetSpec) -> int:
    if spec == "earliest":
        return EARLIEST_TIMESTAMP
    if spec == "latest":
        return LATEST_TIMESTAMP
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return spec
    raise ValueError(f"offset spec {spec!r} for {tp} is not valid; use 'earliest', 'latest' "
                     "or a timestamp in ms >= 0")


def topic_results(topics: list[TopicResult], raise_errors: bool) -> dict[str, StrataError | None]:
    out: dict[str, StrataError | None] = {}
    for result in topics:
        out[result.name] = None if result.error_code == 0 else \
            error_from_code(result.error_code, result.error_message)
    if raise_errors:
        for error in out.values():
            if error is not None:
                raise error
    return out


class TopicAdmin:
    """Topics, configs and offsets."""

    def __init__(self, context: AdminContext) -> None:
        self.context = context
        self._cluster = context.cluster

    async def create_topics(self, new_topics: Iterable[NewTopic], *, validate_only: bool = False,
                            raise_errors: bool = True) -> dict[str, StrataError | None]:
        topics = [CreatableTopic(t.name, t.num_partitions, t.replication_factor,
                                 [ConfigEntry(k, str(v)) for k, v in t.configs.items()])
                  for t in new_topics]
        if not topics:
            return {}
        response = await self._cluster.send_any(ApiKey.CREATE_TOPICS, CreateTopicsRequest(
            topics, timeout_ms=self.context.operation_timeout_ms, validate_only=validate_only))
        assert isinstance(response, CreateTopicsResponse)
        return topic_results(response.topics, raise_errors)

    async def delete_topics(self, names: Iterable[str], *, raise_errors: bool = True
                            ) -> dict[str, StrataError | None]:
        wanted = list(names)
        if not wanted:
            return {}
        response = await self._cluster.send_any(ApiKey.DELETE_TOPICS, DeleteTopicsRequest(
            wanted, timeout_ms=self.context.operation_timeout_ms))
        assert isinstance(response, DeleteTopicsResponse)
        for name in wanted:
            self._cluster.topics.pop(name, None)
        return topic_results(response.topics, raise_errors)

    async def list_topics(self) -> list[str]:
        response = await self._cluster.refresh()
        return sorted(t.name for t in response.topics if t.error_code == 0)

    async def describe_topics(self, names: Iterable[str] | None = None, *,
                              offsets: bool = True) -> dict[str, TopicDescription]:
        wanted = None if names is None else list(names)
        if wanted == []:
            return {}
        response = await self.context.existing_topics(wanted)
        by_leader: dict[int, list[TopicPartition]] = {}
        for topic in response.topics if offsets else ():
            for p in topic.partitions:
                if p.leader >= 0:
                    by_leader.setdefault(p.leader, []).append(TopicPartition(topic.name,
                                                                             p.partition))
        known: dict[TopicPartition, tuple[int, int, int]] = {}
        found = await asyncio.gather(*(self._log_offsets(node, tps)
                                       for node, tps in by_leader.items()))
        for part in found:
            known.update(part)
        out: dict[str, TopicDescription] = {}
        for topic in sorted(response.topics, key=lambda t: t.name):
            partitions = []
            for p in sorted(topic.partitions, key=lambda p: p.partition):
                start, end, hw = known.get(TopicPartition(topic.name, p.partition),
                                           (-1, -1, -1))
                partitions.append(PartitionDescription(
                    p.partition, p.leader, p.leader_epoch, tuple(p.replicas), tuple(p.isr),
                    start, end, hw))
            out[topic.name] = TopicDescription(topic.name, tuple(partitions))
        return out

    async def _log_offsets(self, node: int, tps: list[TopicPartition]
                           ) -> dict[TopicPartition, tuple[int, int, int]]:
        """(log start, log end, high watermark) per partition led by ``node``."""
        timeout = self.context.request_timeout_s
        latest = await list_offsets_once(self._cluster, dict.fromkeys(tps, LATEST_TIMESTAMP),
                                         timeout)
        hws = {tp: a.offset for tp, a in latest.items() if not isinstance(a, StrataError)}
        out: dict[TopicPartition, tuple[int, int, int]] = {}
        if not hws:
            return out
        topics = group_by_topic((tp.topic, FetchPartition(tp.partition, hw, 1))
                                for tp, hw in hws.items())
        request = FetchRequest([FetchTopic(t, ps) for t, ps in topics.items()],
                               max_wait_ms=0, min_bytes=1, max_bytes=1)
        with contextlib.suppress(StrataError, TimeoutError):
            connection = await self._cluster.connection(node)
            response = await asyncio.wait_for(connection.request(ApiKey.FETCH, request), timeout)
            assert isinstance(response, FetchResponse)
            for topic in response.topics:
                for a in topic.partitions:
                    tp = TopicPartition(topic.name, a.partition)
                    if a.error_code == 0:
                        out[tp] = (a.log_start_offset, a.log_end_offset, a.high_watermark)
                    elif a.error_code == OffsetOutOfRangeError.code:
                        out[tp] = (a.log_start_offset, -1, a.high_watermark)
        for tp, hw in hws.items():
            out.setdefault(tp, (-1, -1, hw))
        return out

    async def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, ConfigValue]]:
        wanted = list(names)
        if not wanted:
            return {}
        response = await self._cluster.send_any(ApiKey.DESCRIBE_CONFIGS,
                                                DescribeConfigsRequest(wanted))
        assert isinstance(response, DescribeConfigsResponse)
        out: dict[str, dict[str, ConfigValue]] = {}
        for topic in response.topics:
            if topic.error_code:
                raise error_from_code(topic.error_code, topic.error_message)
            out[topic.name] = {c.name: ConfigValue(c.name, c.value, c.is_default)
                               for c in topic.configs}
        return out

    async def alter_configs(self, name: str, set: Mapping[str, str | int] | None = None,
                            delete: Iterable[str] = (), *, validate_only: bool = False) -> None:
        entries = [ConfigEntry(k, str(v)) for k, v in (set or {}).items()]
        response = await self._cluster.send_any(ApiKey.ALTER_CONFIGS, AlterConfigsRequest(
            [AlterConfigsTopic(name, entries, list(delete))], validate_only=validate_only))
        assert isinstance(response, AlterConfigsResponse)
        topic_results(response.topics, raise_errors=True)

    async def list_offsets(self, specs: Mapping[TopicPartition, OffsetSpec], *,
                           isolation_level: IsolationLevel = "read_uncommitted"
                           ) -> dict[TopicPartition, ListOffsetsResult]:
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level {isolation_level!r} is not valid; use "
                             "read_uncommitted or read_committed")
        wanted = {TopicPartition(*tp): spec_timestamp(TopicPartition(*tp), spec)
                  for tp, spec in specs.items()}
        if not wanted:
            return {}
        answers = await list_offsets(self._cluster, wanted,
                                     timeout_s=self.context.request_timeout_s,
                                     isolation_level=int(isolation_level == "read_committed"))
        return {tp: ListOffsetsResult(a.offset, a.timestamp, a.leader_epoch)
                for tp, a in answers.items()}
