"""Consumer groups: FindCoordinator (of a group, or of a transactional id: key_type 1),
ConsumerGroupHeartbeat, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups and
DeleteGroups.

Thin over the group coordinator (``brokers/group_coordinator.py``, docs/consumer-groups.md);
this family decides who may do what: READ on the group for a member, ALTER to move a
group's offsets outside any membership, DESCRIBE to see a group, READ or DESCRIBE on
each topic whose offsets are committed or fetched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable

from brokers.acl import CLUSTER_NAME
from brokers.answers import error_fields
from brokers.handlers.context import (
    ApiContext,
    ApiFamily,
    Handler,
    answered,
    current_session,
)
from wire.errors import CoordinatorNotAvailableError, InvalidRequestError, StrataError
from wire.protocol import (
    ApiKey,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    DeleteGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

__all__ = ["KEY_TYPE_GROUP", "KEY_TYPE_TRANSACTION", "GroupApis"]

#: FindCoordinator's ``key_type``: a consumer group, or a transactional id.
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


class GroupApis(ApiFamily):
    """The consumer-group APIs, over the group coordinator."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.groups = context.groups
        self.acls = context.acls

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
        }

    async def find_coordinator(self, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
        # The coordinator's address on the listener this request came in on (a client of
        # a SASL_SSL or Kafka listener must not be sent to another listener's port).
        listener = current_session().listener.name
        try:
            if request.key_type == KEY_TYPE_TRANSACTION:
                self._require("DESCRIBE", "TRANSACTIONAL_ID", request.key)
                transactions = self.context.transactions
                if transactions is None:
                    raise CoordinatorNotAvailableError(
                        "this broker has no transaction coordinator; upgrade it")
                node, host, port = await transactions.find(request.key, listener)
            elif request.key_type == KEY_TYPE_GROUP:
                self._require("DESCRIBE", "GROUP", request.key)
                node, host, port = await self.groups.find(request.key, listener)
            else:
                raise InvalidRequestError(
                    f"key_type {request.key_type} is not known: 0 a group, 1 a "
                    "transactional id")
        except StrataError as err:
            return FindCoordinatorResponse(*error_fields(err))
        return FindCoordinatorResponse(0, None, node, host, port)

    async def offset_commit(self, request: OffsetCommitRequest) -> OffsetCommitResponse:
        # A member commits with READ on the group; a commit outside any membership
        # (`strata group reset-offsets`) moves the group's position: ALTER.
        operation = "ALTER" if request.member_id is None else "READ"
        try:
            self._require(operation, "GROUP", request.group_id)
        except StrataError as err:
            return OffsetCommitResponse([OffsetCommitTopicResponse(t.name, [
                OffsetCommitPartitionResponse(p.partition, *error_fields(err))
                for p in t.partitions]) for t in request.topics])
        refused: dict[str, StrataError] = {}
        for topic in request.topics:
            topic_refusal = self._refusal("READ", "TOPIC", topic.name)
            if topic_refusal is not None:
                refused[topic.name] = topic_refusal
        if not refused:
            return await self.groups.commit(request)
        allowed = [t for t in request.topics if t.name not in refused]
        answered = await self.groups.commit(dataclasses.replace(request, topics=allowed)) \
            if allowed else OffsetCommitResponse([])
        return OffsetCommitResponse([*answered.topics, *(
            OffsetCommitTopicResponse(t.name, [
                OffsetCommitPartitionResponse(p.partition, *error_fields(refused[t.name]))
                for p in t.partitions]) for t in request.topics if t.name in refused)])

    async def offset_fetch(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        try:
            self._require("DESCRIBE", "GROUP", request.group_id)
        except StrataError as err:
            return OffsetFetchResponse(*error_fields(err))
        answer = await self.groups.fetch_offsets(request)
        if self.acls is None:
            return answer
        # Only the topics the principal may describe: the others are left out (a named
        # one is also written to the audit log), so their offsets do not leak.
        audit = request.topics is not None
        answer.topics = [t for t in answer.topics
                         if self._allowed("DESCRIBE", "TOPIC", t.name, audit=audit)]
        return answer

    async def list_groups(self, request: ListGroupsRequest) -> ListGroupsResponse:
        # DESCRIBE on the cluster lists every group; otherwise the describable ones.
        everything = self._allowed("DESCRIBE", "CLUSTER", CLUSTER_NAME, audit=False)
        return ListGroupsResponse(0, [
            g for g in self.groups.list_groups()
            if everything or self._allowed("DESCRIBE", "GROUP", g.group_id, audit=False)])

    async def describe_groups(self, request: DescribeGroupsRequest) -> DescribeGroupsResponse:
        out = []
        for group_id in request.group_ids:
            group_refusal = self._refusal("DESCRIBE", "GROUP", group_id)
            out.append(DescribedGroup(group_id, *error_fields(group_refusal))
                       if group_refusal is not None else await self.groups.describe(group_id))
        return DescribeGroupsResponse(out)

    async def delete_groups(self, request: DeleteGroupsRequest) -> DeleteGroupsResponse:
        results = []
        for group_id in request.group_ids:
            try:
                self._require("DELETE", "GROUP", group_id)
                await self.groups.delete(group_id)
                results.append(DeleteGroupResult(group_id, 0))
            except StrataError as err:
                results.append(DeleteGroupResult(group_id, *error_fields(err)))
        return DeleteGroupsResponse(results)

    def consumer_group_heartbeat(self, request: ConsumerGroupHeartbeatRequest
                                 ) -> Awaitable[ConsumerGroupHeartbeatResponse]:
        refused = self._refusal("READ", "GROUP", request.group_id)
        if refused is not None:
            return answered(ConsumerGroupHeartbeatResponse(*error_fields(refused)))
        # The client id of this request's header: the dispatcher sets it on the session
        # just before it calls the handler, with no await in between, so it is this
        # request's even when a connection pipelines requests.
        return self.groups.heartbeat(request, current_session().client_id)
