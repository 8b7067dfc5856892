"""Admin API family: the cluster, preferred-leader elections and partition reassignments.

Part of the admin client (``strata.client.admin`` is the face).

The partition APIs (``elect_preferred_leaders``, ``alter_partition_reassignments``) are
answered per partition and raise the first failed partition's typed error
(``UnknownTopicOrPartitionError``, ``InvalidReplicationFactorError``, ...). As with the
topic APIs, the broker acted on every partition that did not fail, so a caller that
must not write anything unless every partition is valid checks the input first
(``describe_topics`` for partitions and replicas, ``describe_cluster`` for live brokers),
as ``strata topic reassign`` does. A preferred replica that cannot take over is not an
error: ``ElectionResult.message`` says why the leader stayed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from strata.client._admin_common import AdminContext
from strata.client._common import TopicPartition, error_from_code
from wire.protocol import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ApiKey,
    ElectionTopic,
    ElectionTopicResult,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    ReassignablePartition,
    ReassignableTopic,
    group_by_topic,
)

__all__ = [
    "ClusterAdmin",
    "ClusterDescription",
    "ElectionResult",
    "Reassignment",
]


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """``controller_id``: the broker acting as controller (``-1``: none right now);
    ``brokers``: the live brokers, ``{node_id: (host, port)}``."""

    cluster_id: str | None
    controller_id: int
    brokers: dict[int, tuple[str, int]]


@dataclass(frozen=True, slots=True)
class ElectionResult:
    """One partition after a preferred-leader election.

    ``leader``: the partition's leader once the controller acted (``-1``: none).
    ``message``: ``None`` when the preferred replica (the first assigned) leads;
    otherwise why the leader stayed (the preferred replica is not alive or not in sync).
    """

    leader: int
    message: str | None = None

    @property
    def preferred_leads(self) -> bool:
        """The preferred replica leads the partition now."""
        return self.message is None


@dataclass(frozen=True, slots=True)
class Reassignment:
    """A partition whose replicas are still moving.

    ``replicas``: the partition's replica set now (while it moves: the target replicas,
    then the leaving ones); ``adding`` / ``removing``: the brokers joining / leaving.
    """

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def _partition_results(topics: list[ElectionTopicResult]
                       ) -> dict[TopicPartition, tuple[int, int, str | None]]:
    """``{partition: (error code, leader, message)}`` of a per-partition answer."""
    return {TopicPartition(t.name, a.partition): (a.error_code, a.leader, a.error_message)
            for t in topics for a in t.partitions}


def _raise_first(results: dict[TopicPartition, tuple[int, int, str | None]]) -> None:
    for tp, (code, _, message) in results.items():
        if code:
            raise error_from_code(code, message or f"{tp} failed")


class ClusterAdmin:
    """The brokers, and where partitions and their leaders live."""

    def __init__(self, context: AdminContext) -> None:
        self.context = context
        self._cluster = context.cluster

    async def describe_cluster(self) -> ClusterDescription:
        response = await self._cluster.refresh([])
        return ClusterDescription(response.cluster_id, response.controller_id,
                                  dict(self._cluster.brokers))

    async def elect_preferred_leaders(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, ElectionResult]:
        request: list[ElectionTopic] | None = None
        if partitions is not None:
            request = [ElectionTopic(t, list(dict.fromkeys(ps)))  # each partition once
                       for t, ps in group_by_topic(partitions).items()]
            if not request:
                return {}
        response = await self._cluster.send_any(ApiKey.ELECT_LEADERS, ElectLeadersRequest(
            request, timeout_ms=self.context.operation_timeout_ms))
        assert isinstance(response, ElectLeadersResponse)
        results = _partition_results(response.topics)
        _raise_first(results)
        return {tp: ElectionResult(leader, message)
                for tp, (_, leader, message) in sorted(results.items())}

    async def alter_partition_reassignments(
            self, targets: Mapping[TopicPartition | tuple[str, int], Sequence[int]]) -> None:
        topics = group_by_topic(
            (topic, ReassignablePartition(partition, [int(b) for b in replicas]))
            for (topic, partition), replicas in targets.items())
        if not topics:
            return
        response = await self._cluster.send_any(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS, AlterPartitionReassignmentsRequest(
                [ReassignableTopic(t, ps) for t, ps in topics.items()],
                timeout_ms=self.context.operation_timeout_ms))
        assert isinstance(response, AlterPartitionReassignmentsResponse)
        _raise_first(_partition_results(response.topics))

    async def list_partition_reassignments(self) -> dict[TopicPartition, Reassignment]:
        response = await self._cluster.send_any(ApiKey.LIST_PARTITION_REASSIGNMENTS,
                                                ListPartitionReassignmentsRequest())
        assert isinstance(response, ListPartitionReassignmentsResponse)
        return {TopicPartition(r.topic, r.partition):
                Reassignment(tuple(r.replicas), tuple(r.adding), tuple(r.removing))
                for r in sorted(response.reassignments, key=lambda r: (r.topic, r.partition))}
