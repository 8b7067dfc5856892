"""Every Strata request and response, as plain dataclasses with their wire schema.

``docs/protocol.md`` renders the same schemas byte by byte. A frame on the wire is::

    int32   size of what follows
    ...     RequestHeader + request body   (client -> broker)
            ResponseHeader + response body (broker -> client)

Requests on one connection may be pipelined; the broker may answer them in any order
and the client matches answers to requests by ``correlation_id``. Produce with
``acks=0`` gets no response at all.

The classes live in one module per API family under ``wire/protocol/apis/``:
``headers`` (frame headers, ApiVersions), ``metadata``, ``topics`` (topic admin and
configs), ``produce`` (and InitProducerId), ``fetch`` (and ListOffsets,
OffsetForLeaderEpoch), ``sink`` (the Spark sink's staged commits), ``cluster``
(elections, reassignments), ``tier``, ``security`` (SASL, SCRAM, ACLs, quotas),
``groups``, ``schema_registry`` and ``transactions``. This module keeps the API keys,
each key's request and response class and the versions this build speaks, and
re-exports every class:
``from wire.protocol.messages import X`` and ``from wire.protocol import X`` both work.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from wire.protocol.apis import (
    cluster,
    fetch,
    groups,
    headers,
    metadata,
    produce,
    schema_registry,
    security,
    sink,
    tier,
    topics,
    transactions,
)
from wire.protocol.apis.cluster import *
from wire.protocol.apis.fetch import *
from wire.protocol.apis.groups import *
from wire.protocol.apis.headers import *
from wire.protocol.apis.metadata import *
from wire.protocol.apis.produce import *
from wire.protocol.apis.schema_registry import *
from wire.protocol.apis.security import *
from wire.protocol.apis.sink import *
from wire.protocol.apis.tier import *
from wire.protocol.apis.topics import *
from wire.protocol.apis.transactions import *
from wire.protocol.codec import Message

# Every name of every family (tests/test_docs.py checks this list against them).
__all__ = [
    "StagePartition",
    "StageTopic",
    "StageRecordsRequest",
    "StagePartitionResponse",
    "StageTopicResponse",
    "StageRecordsResponse",
    "StagedPartEntry",
    "CommitPartition",
    "CommitTopic",
    "CommitStagedRequest",
    "CommitPartitionResponse",
    "CommitTopicResponse",
    "CommitStagedResponse",
    "AbortPartition",
    "AbortTopic",
    "AlterPartitionReassignmentsRequest",
    "AlterPartitionReassignmentsResponse",
    "ElectLeadersRequest",
    "ElectLeadersResponse",
    "ElectionPartitionResult",
    "ElectionTopic",
    "ElectionTopicResult",
    "ListPartitionReassignmentsRequest",
    "ListPartitionReassignmentsResponse",
    "OngoingReassignment",
    "ReassignablePartition",
    "ReassignableTopic",
    "AbortStagedRequest",
    "AbortPartitionResponse",
    "AbortTopicResponse",
    "AbortStagedResponse",
    "API_VERSIONS",
    "ApiKey",
    "ApiVersionRange",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "BrokerInfo",
    "ConfigEntry",
    "CreatableTopic",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
    "DescribeConfigsRequest",
    "DescribeConfigsResponse",
    "DescribedConfig",
    "DescribeTierPartitionResponse",
    "DescribeTierRequest",
    "DescribeTierResponse",
    "DescribeTierTopic",
    "DescribeTierTopicResponse",
    "TierSegment",
    "ErrorResponse",
    "FetchPartition",
    "AbortedTransactionEntry",
    "FetchPartitionResponse",
    "FetchRequest",
    "ForgottenTopic",
    "FetchResponse",
    "FetchTopic",
    "FetchTopicResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "AlterConfigsRequest",
    "AlterConfigsResponse",
    "AlterConfigsTopic",
    "MetadataRequest",
    "OffsetForLeaderEpochPartition",
    "OffsetForLeaderEpochPartitionResponse",
    "OffsetForLeaderEpochRequest",
    "OffsetForLeaderEpochResponse",
    "OffsetForLeaderEpochTopic",
    "OffsetForLeaderEpochTopicResponse",
    "MetadataResponse",
    "PartitionMetadata",
    "ProducePartition",
    "ProducePartitionResponse",
    "ProduceRequest",
    "ProduceResponse",
    "ProduceTopic",
    "ProduceTopicResponse",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "ReplicaAssignment",
    "RequestHeader",
    "ResponseHeader",
    "TopicConfigs",
    "TopicMetadata",
    "TopicResult",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "NO_MEMBER_EPOCH",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "GroupTopicPartitions",
    "group_by_topic",
    "group_topic_partitions",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
    "OffsetCommitPartition",
    "OffsetCommitTopic",
    "OffsetCommitRequest",
    "OffsetCommitPartitionResponse",
    "OffsetCommitTopicResponse",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchPartitionResponse",
    "OffsetFetchTopicResponse",
    "OffsetFetchResponse",
    "ListGroupsRequest",
    "ListedGroup",
    "ListGroupsResponse",
    "DescribeGroupsRequest",
    "DescribedMember",
    "DescribedGroup",
    "DescribeGroupsResponse",
    "DeleteGroupsRequest",
    "DeleteGroupResult",
    "DeleteGroupsResponse",
    "CompactionProgress",
    "TierLeaseRequest",
    "TierLeaseResponse",
    "TierProgressUpdate",
    "UpdateTierRequest",
    "UpdateTierResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "ScramCredentialInfo",
    "DescribeUserScramCredentialsRequest",
    "UserScramCredentials",
    "DescribeUserScramCredentialsResponse",
    "ScramCredentialDeletion",
    "ScramCredentialUpsertion",
    "AlterUserScramCredentialsRequest",
    "AlterUserScramCredentialsResult",
    "AlterUserScramCredentialsResponse",
    "AclEntry",
    "AclFilterEntry",
    "AclResult",
    "CreateAclsRequest",
    "CreateAclsResponse",
    "DescribeAclsRequest",
    "DescribeAclsResponse",
    "DeleteAclsRequest",
    "DeleteAclsResult",
    "DeleteAclsResponse",
    "QuotaValue",
    "QuotaEntry",
    "DescribeClientQuotasRequest",
    "DescribeClientQuotasResponse",
    "QuotaAlteration",
    "AlterClientQuotasRequest",
    "AlterClientQuotasResponse",
    "SCHEMA_OPERATIONS",
    "SCHEMAS_TOPIC",
    "SchemaRegistryRequest",
    "SchemaRegistryResponse",
    "TxnTopic",
    "TxnPartitionResult",
    "TxnTopicResult",
    "AddPartitionsToTxnRequest",
    "AddPartitionsToTxnResponse",
    "AddOffsetsToTxnRequest",
    "AddOffsetsToTxnResponse",
    "EndTxnRequest",
    "EndTxnResponse",
    "TxnMarker",
    "WriteTxnMarkersRequest",
    "TxnMarkerResult",
    "WriteTxnMarkersResponse",
    "TxnOffsetCommitPartition",
    "TxnOffsetCommitTopic",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitResponse",
    "DescribeTransactionsRequest",
    "DescribedTransaction",
    "DescribeTransactionsResponse",
    "ListTransactionsRequest",
    "ListedTransaction",
    "ListTransactionsResponse",
    "DescribeProducersRequest",
    "ActiveProducer",
    "ProducersPartitionResult",
    "ProducersTopicResult",
    "DescribeProducersResponse",
]


class ApiKey(IntEnum):
    API_VERSIONS = 0
    METADATA = 1
    CREATE_TOPICS = 2
    DELETE_TOPICS = 3
    DESCRIBE_CONFIGS = 4
    ALTER_CONFIGS = 5
    PRODUCE = 6
    FETCH = 7
    LIST_OFFSETS = 8
    INIT_PRODUCER_ID = 9
    OFFSET_FOR_LEADER_EPOCH = 10
    STAGE_RECORDS = 11
    COMMIT_STAGED = 12
    ABORT_STAGED = 13
    ELECT_LEADERS = 14
    ALTER_PARTITION_REASSIGNMENTS = 15
    LIST_PARTITION_REASSIGNMENTS = 16
    DESCRIBE_TIER = 17
    FIND_COORDINATOR = 18
    CONSUMER_GROUP_HEARTBEAT = 19
    OFFSET_COMMIT = 20
    OFFSET_FETCH = 21
    LIST_GROUPS = 22
    DESCRIBE_GROUPS = 23
    DELETE_GROUPS = 24
    TIER_LEASE = 25
    UPDATE_TIER = 26
    SASL_HANDSHAKE = 27
    SASL_AUTHENTICATE = 28
    DESCRIBE_USER_SCRAM_CREDENTIALS = 29
    ALTER_USER_SCRAM_CREDENTIALS = 30
    CREATE_ACLS = 31
    DESCRIBE_ACLS = 32
    DELETE_ACLS = 33
    DESCRIBE_CLIENT_QUOTAS = 34
    ALTER_CLIENT_QUOTAS = 35
    SCHEMA_REGISTRY = 36
    ADD_PARTITIONS_TO_TXN = 37
    ADD_OFFSETS_TO_TXN = 38
    END_TXN = 39
    WRITE_TXN_MARKERS = 40
    TXN_OFFSET_COMMIT = 41
    DESCRIBE_TRANSACTIONS = 42
    LIST_TRANSACTIONS = 43
    DESCRIBE_PRODUCERS = 44


# ----------------------------------------------------------------------------- registry

REQUEST_TYPES: Final[dict[ApiKey, type[Message]]] = {
    ApiKey.API_VERSIONS: headers.ApiVersionsRequest,
    ApiKey.METADATA: metadata.MetadataRequest,
    ApiKey.CREATE_TOPICS: topics.CreateTopicsRequest,
    ApiKey.DELETE_TOPICS: topics.DeleteTopicsRequest,
    ApiKey.DESCRIBE_CONFIGS: topics.DescribeConfigsRequest,
    ApiKey.ALTER_CONFIGS: topics.AlterConfigsRequest,
    ApiKey.PRODUCE: produce.ProduceRequest,
    ApiKey.FETCH: fetch.FetchRequest,
    ApiKey.LIST_OFFSETS: fetch.ListOffsetsRequest,
    ApiKey.INIT_PRODUCER_ID: produce.InitProducerIdRequest,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: fetch.OffsetForLeaderEpochRequest,
    ApiKey.STAGE_RECORDS: sink.StageRecordsRequest,
    ApiKey.COMMIT_STAGED: sink.CommitStagedRequest,
    ApiKey.ABORT_STAGED: sink.AbortStagedRequest,
    ApiKey.ELECT_LEADERS: cluster.ElectLeadersRequest,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: cluster.AlterPartitionReassignmentsRequest,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: cluster.ListPartitionReassignmentsRequest,
    ApiKey.DESCRIBE_TIER: tier.DescribeTierRequest,
    ApiKey.TIER_LEASE: tier.TierLeaseRequest,
    ApiKey.UPDATE_TIER: tier.UpdateTierRequest,
    ApiKey.SASL_HANDSHAKE: security.SaslHandshakeRequest,
    ApiKey.SASL_AUTHENTICATE: security.SaslAuthenticateRequest,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: security.DescribeUserScramCredentialsRequest,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: security.AlterUserScramCredentialsRequest,
    ApiKey.CREATE_ACLS: security.CreateAclsRequest,
    ApiKey.DESCRIBE_ACLS: security.DescribeAclsRequest,
    ApiKey.DELETE_ACLS: security.DeleteAclsRequest,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: security.DescribeClientQuotasRequest,
    ApiKey.ALTER_CLIENT_QUOTAS: security.AlterClientQuotasRequest,
    ApiKey.FIND_COORDINATOR: groups.FindCoordinatorRequest,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: groups.ConsumerGroupHeartbeatRequest,
    ApiKey.OFFSET_COMMIT: groups.OffsetCommitRequest,
    ApiKey.OFFSET_FETCH: groups.OffsetFetchRequest,
    ApiKey.LIST_GROUPS: groups.ListGroupsRequest,
    ApiKey.DESCRIBE_GROUPS: groups.DescribeGroupsRequest,
    ApiKey.DELETE_GROUPS: groups.DeleteGroupsRequest,
    ApiKey.SCHEMA_REGISTRY: schema_registry.SchemaRegistryRequest,
    ApiKey.ADD_PARTITIONS_TO_TXN: transactions.AddPartitionsToTxnRequest,
    ApiKey.ADD_OFFSETS_TO_TXN: transactions.AddOffsetsToTxnRequest,
    ApiKey.END_TXN: transactions.EndTxnRequest,
    ApiKey.WRITE_TXN_MARKERS: transactions.WriteTxnMarkersRequest,
    ApiKey.TXN_OFFSET_COMMIT: transactions.TxnOffsetCommitRequest,
    ApiKey.DESCRIBE_TRANSACTIONS: transactions.DescribeTransactionsRequest,
    ApiKey.LIST_TRANSACTIONS: transactions.ListTransactionsRequest,
    ApiKey.DESCRIBE_PRODUCERS: transactions.DescribeProducersRequest,
}

RESPONSE_TYPES: Final[dict[ApiKey, type[Message]]] = {
    ApiKey.API_VERSIONS: headers.ApiVersionsResponse,
    ApiKey.METADATA: metadata.MetadataResponse,
    ApiKey.CREATE_TOPICS: topics.CreateTopicsResponse,
    ApiKey.DELETE_TOPICS: topics.DeleteTopicsResponse,
    ApiKey.DESCRIBE_CONFIGS: topics.DescribeConfigsResponse,
    ApiKey.ALTER_CONFIGS: topics.AlterConfigsResponse,
    ApiKey.PRODUCE: produce.ProduceResponse,
    ApiKey.FETCH: fetch.FetchResponse,
    ApiKey.LIST_OFFSETS: fetch.ListOffsetsResponse,
    ApiKey.INIT_PRODUCER_ID: produce.InitProducerIdResponse,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: fetch.OffsetForLeaderEpochResponse,
    ApiKey.STAGE_RECORDS: sink.StageRecordsResponse,
    ApiKey.COMMIT_STAGED: sink.CommitStagedResponse,
    ApiKey.ABORT_STAGED: sink.AbortStagedResponse,
    ApiKey.ELECT_LEADERS: cluster.ElectLeadersResponse,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: cluster.AlterPartitionReassignmentsResponse,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: cluster.ListPartitionReassignmentsResponse,
    ApiKey.DESCRIBE_TIER: tier.DescribeTierResponse,
    ApiKey.TIER_LEASE: tier.TierLeaseResponse,
    ApiKey.UPDATE_TIER: tier.UpdateTierResponse,
    ApiKey.SASL_HANDSHAKE: security.SaslHandshakeResponse,
    ApiKey.SASL_AUTHENTICATE: security.SaslAuthenticateResponse,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: security.DescribeUserScramCredentialsResponse,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: security.AlterUserScramCredentialsResponse,
    ApiKey.CREATE_ACLS: security.CreateAclsResponse,
    ApiKey.DESCRIBE_ACLS: security.DescribeAclsResponse,
    ApiKey.DELETE_ACLS: security.DeleteAclsResponse,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: security.DescribeClientQuotasResponse,
    ApiKey.ALTER_CLIENT_QUOTAS: security.AlterClientQuotasResponse,
    ApiKey.FIND_COORDINATOR: groups.FindCoordinatorResponse,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: groups.ConsumerGroupHeartbeatResponse,
    ApiKey.OFFSET_COMMIT: groups.OffsetCommitResponse,
    ApiKey.OFFSET_FETCH: groups.OffsetFetchResponse,
    ApiKey.LIST_GROUPS: groups.ListGroupsResponse,
    ApiKey.DESCRIBE_GROUPS: groups.DescribeGroupsResponse,
    ApiKey.DELETE_GROUPS: groups.DeleteGroupsResponse,
    ApiKey.SCHEMA_REGISTRY: schema_registry.SchemaRegistryResponse,
    ApiKey.ADD_PARTITIONS_TO_TXN: transactions.AddPartitionsToTxnResponse,
    ApiKey.ADD_OFFSETS_TO_TXN: transactions.AddOffsetsToTxnResponse,
    ApiKey.END_TXN: transactions.EndTxnResponse,
    ApiKey.WRITE_TXN_MARKERS: transactions.WriteTxnMarkersResponse,
    ApiKey.TXN_OFFSET_COMMIT: transactions.TxnOffsetCommitResponse,
    ApiKey.DESCRIBE_TRANSACTIONS: transactions.DescribeTransactionsResponse,
    ApiKey.LIST_TRANSACTIONS: transactions.ListTransactionsResponse,
    ApiKey.DESCRIBE_PRODUCERS: transactions.DescribeProducersResponse,
}

# Versions this build speaks, per API: (min, max). Bump max when a field is added.
API_VERSIONS: Final[dict[ApiKey, tuple[int, int]]] = {
    **{key: (0, 0) for key in ApiKey},
    ApiKey.FETCH: (0, 2),  # 1: fetch sessions; 2: last stable offset, aborted transactions
    ApiKey.METADATA: (0, 1),  # 1: a topic's value subject
    ApiKey.PRODUCE: (0, 1),  # 1: transactional_id
    ApiKey.INIT_PRODUCER_ID: (0, 1),  # 1: two-phase transactions
    ApiKey.FIND_COORDINATOR: (0, 1),  # 1: key_type (transactions)
    ApiKey.OFFSET_FETCH: (0, 1),  # 1: require_stable
    ApiKey.COMMIT_STAGED: (0, 1),  # 1: a commit inside a transaction
}
