"""What each API does: decode the body, act on partitions or ZooKeeper, build the answer.

Per-partition failures are reported in the partition's ``error_code`` and
``error_message`` (the rest of the request still succeeds), as in Kafka. Request-level
failures (unsupported version, malformed body) raise, and the network layer answers
with the error in the response header.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from brokers.acl import (
    CLUSTER_NAME,
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    RESOURCE_TYPES,
    AclBinding,
    AclCache,
    AclFilter,
    RefusalLog,
)
from brokers.answers import answer_each, error_fields
from brokers.controller import assign_replicas
from brokers.coordination import ConcurrentUpdateError, TierProgress, TopicDefinition
from brokers.log import LogConfig
from brokers.log.config import TOPIC_CONFIG_KEYS
from brokers.quotas import QUOTA_KEYS, QuotaManager
from brokers.schema_registry import SchemaCheck, SchemaRegistry
from brokers.security import Authenticator, CredentialCache, Listener, Session
from wire.errors import (
    BrokerNotAvailableError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    PolicyViolationError,
    RequestTimedOutError,
    ResourceNotFoundError,
    SchemaMismatchError,
    StrataError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedSaslMechanismError,
    UnsupportedVersionError,
    error_for_code,
)
from wire.protocol import (
    API_VERSIONS,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    REQUEST_TYPES,
    AbortPartition,
    AbortPartitionResponse,
    AbortStagedRequest,
    AbortStagedResponse,
    AbortTopicResponse,
    AclEntry,
    AclFilterEntry,
    AclResult,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    ApiKey,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerInfo,
    CommitStagedRequest,
    CommitStagedResponse,
    CompactionProgress,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteAclsResult,
    DeleteGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribedConfig,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeTierPartitionResponse,
    DescribeTierRequest,
    DescribeTierResponse,
    DescribeTierTopicResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectionPartitionResult,
    ElectionTopic,
    ElectionTopicResult,
    ElectLeadersRequest,
    ElectLeadersResponse,
    FetchRequest,
    FetchResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochPartition,
    OffsetForLeaderEpochPartitionResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderEpochTopicResponse,
    OngoingReassignment,
    PartitionMetadata,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    QuotaEntry,
    QuotaValue,
    Reader,
    ReassignablePartition,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    SchemaRegistryRequest,
    SchemaRegistryResponse,
    ScramCredentialDeletion,
    ScramCredentialInfo,
    ScramCredentialUpsertion,
    StagePartition,
    StagePartitionResponse,
    StageRecordsRequest,
    StageRecordsResponse,
    StageTopic,
    StageTopicResponse,
    TierLeaseRequest,
    TierLeaseResponse,
    TierProgressUpdate,
    TierSegment,
    TopicConfigs,
    TopicMetadata,
    TopicResult,
    UpdateTierRequest,
    UpdateTierResponse,
    UserScramCredentials,
    decode,
)
from wire.sasl import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    credential_from_salted,
)
from wire.schema import subject_topic

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.controller import Controller
    from brokers.coordination import Coordinator
    from brokers.group_coordinator import GroupCoordinator
    from brokers.replica_manager import ReplicaManager
    from brokers.services import HandlerHost, MetadataCache, PartitionRegistry

__all__ = ["RequestHandlers", "current_session"]

log = logging.getLogger("strata.brokers.handlers")

# Partitions of one topic: its metadata goes to ZooKeeper in one multi-op, and ZooKeeper
# refuses requests above jute.maxbuffer (1 MiB); 4,096 partitions stay well below it.
MAX_PARTITIONS = 4096
#: What a connection on a SASL listener may send before its login finished.
_BEFORE_LOGIN = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                           ApiKey.SASL_AUTHENTICATE})
#: The session of the request being handled (each request runs as its own task).
_SESSION: contextvars.ContextVar[Session] = contextvars.ContextVar("strata_session")
#: Requests from inside the broker process (tests, tools): authenticated, every right.
_INTERNAL = Session(Listener("INTERNAL", "PLAINTEXT", "", 0, "", 0), "in-process",
                    principal="User:ANONYMOUS", authenticated=True)


def current_session() -> Session:
    """The session of the request being handled (``dispatch`` sets it)."""
    return _SESSION.get(_INTERNAL)
# A tier lease's TTL: long enough to ride out a GC pause or a ZooKeeper election between
# renewals, short enough that a dead job frees its topics soon.
_MIN_TIER_LEASE_MS = 1_000
_MAX_TIER_LEASE_MS = 600_000
# Topics whose names start with this are the brokers' own (``__consumer_offsets``):
# clients may read them but not create, write, delete or un-compact them.
INTERNAL_PREFIX = "__"


def _binding(entry: AclEntry) -> AclBinding:
    """A wire ACL entry as a checked binding (``InvalidRequestError`` says what is bad)."""
    return AclBinding(entry.resource_type.upper(), entry.pattern_type.upper(),
                      entry.resource_name, entry.principal, entry.host,
                      entry.operation.upper(), entry.permission.upper())


def _acl_entry(binding: AclBinding) -> AclEntry:
    return AclEntry(binding.resource_type, binding.pattern_type, binding.resource_name,
                    binding.principal, binding.host, binding.operation, binding.permission)


def _acl_filter(entry: AclFilterEntry) -> AclFilter:
    def upper(value: str | None) -> str | None:
        return None if value is None else value.upper()

    checks = (("resource type", upper(entry.resource_type), RESOURCE_TYPES),
              ("pattern type", upper(entry.pattern_type), (*PATTERN_TYPES, "MATCH")),
              ("operation", upper(entry.operation), OPERATIONS),
              ("permission", upper(entry.permission), PERMISSIONS))
    for what, value, allowed in checks:
        if value is not None and value not in allowed:
            raise InvalidRequestError(f"ACL filter: {what} {value!r} is not one of "
                                      f"{', '.join(allowed)}")
    return AclFilter(upper(entry.resource_type), upper(entry.pattern_type),
                     entry.resource_name, entry.principal, entry.host,
                     upper(entry.operation), upper(entry.permission))


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


class RequestHandlers:
    """What each API does: decode, act on partitions or ZooKeeper, answer.

    Built from the parts it uses (``brokers/services.py``), never the whole broker, so
    the handlers run without a broker process in ``tests/test_handlers_unit.py``.
    """

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, coordinator: Coordinator, *,
                 controller: Controller, replicas: ReplicaManager, groups: GroupCoordinator,
                 host: HandlerHost, authenticator: Authenticator | None = None,
                 acls: AclCache | None = None, quotas: QuotaManager | None = None,
                 schemas: SchemaRegistry | None = None) -> None:
        """``acls`` None: no authorization (every principal may do everything).
        ``schemas`` None: no schema registry (typed topics refuse every write)."""
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.coordinator = coordinator
        self.controller = controller
        self.replicas = replicas
        self.groups = groups
        self.host = host
        self.acls = acls
        self.quotas = quotas or QuotaManager()
        self.schemas = schemas
        self.schema_check = SchemaCheck(schemas) if schemas is not None else None
        self._refusals = RefusalLog(logging.getLogger("strata.brokers.audit"))
        self.authenticator = authenticator or Authenticator(
            CredentialCache(), list(MECHANISMS), plain_over_plaintext=False, reauth_ms=0)
        # The checks and quotas the replica manager is given, bound once.
        self._admit_produce = self._admit_write
        self._admit_commit = self._admit_commit_staged
        self._authorize_read = self._authorize_fetch
        self._produce_quota = self._quota_produced
        self._fetch_quota = self._quota_fetched
        self._schema_checks = self._schema_refusals
        self._table: dict[ApiKey, Callable[[Any], Awaitable[Message | None]]] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.ALTER_CONFIGS: self.alter_configs,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            ApiKey.STAGE_RECORDS: self.stage_records,
            ApiKey.COMMIT_STAGED: self.commit_staged,
            ApiKey.ABORT_STAGED: self.abort_staged,
            ApiKey.ELECT_LEADERS: self.elect_leaders,
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            ApiKey.LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
            ApiKey.DESCRIBE_TIER: self.describe_tier,
            ApiKey.TIER_LEASE: self.tier_lease,
            ApiKey.UPDATE_TIER: self.update_tier,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
            ApiKey.SASL_HANDSHAKE: self.sasl_handshake,
            ApiKey.SASL_AUTHENTICATE: self.sasl_authenticate,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
            ApiKey.CREATE_ACLS: self.create_acls,
            ApiKey.DESCRIBE_ACLS: self.describe_acls,
            ApiKey.DELETE_ACLS: self.delete_acls,
            ApiKey.DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
            ApiKey.ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
            ApiKey.SCHEMA_REGISTRY: self.schema_registry,
        }

    async def dispatch(self, header: RequestHeader, body: Reader,
                       session: Session | None = None) -> Message | None:
        """Decode and run one request; ``session`` (None: an in-process caller with
        every right) is available to the handlers as ``current_session()``."""
        session = session or _INTERNAL
        _SESSION.set(session)
        session.client_id = header.client_id or ""
        try:
            api = ApiKey(header.api_key)
        except ValueError:
            if not session.authenticated:
                session.close_after_answer = True
            raise UnsupportedVersionError(
                f"unknown api key {header.api_key}; this broker speaks "
                f"{sorted(int(k) for k in ApiKey)}") from None
        if not session.authenticated and api not in _BEFORE_LOGIN:
            session.close_after_answer = True
            raise IllegalSaslStateError(
                f"{api.name} before the SASL login finished: listener "
                f"{session.listener.name} is {session.listener.protocol}; send SaslHandshake "
                "and SaslAuthenticate first (set security_protocol, sasl_mechanism and the "
                "credentials in the client)")
        low, high = API_VERSIONS[api]
        if not low <= header.api_version <= high:
            raise UnsupportedVersionError(
                f"{api.name} version {header.api_version} is not supported (supported: "
                f"{low}..{high}); upgrade the broker or downgrade the client")
        request = decode(REQUEST_TYPES[api], body, header.api_version)
        # Replication is never throttled: a quota must not slow the brokers' own copies.
        if api not in _BEFORE_LOGIN and getattr(request, "replica_id", -1) < 0:
            self._throttle("request_rate", 1)
        if api is ApiKey.CONSUMER_GROUP_HEARTBEAT:  # the only handler that needs the header
            assert isinstance(request, ConsumerGroupHeartbeatRequest)
            refused = self._refusal("READ", "GROUP", request.group_id)
            if refused is not None:
                return ConsumerGroupHeartbeatResponse(*error_fields(refused))
            return await self.groups.heartbeat(request, header.client_id or "")
        return await self._table[api](request)

    # ------------------------------------------------------------------ authorization
    def _allowed(self, operation: str, resource_type: str, name: str, *,
                 audit: bool = True) -> bool:
        """Whether the current session's principal may do ``operation`` on the resource
        (always, without an authorizer or for in-process callers); a refusal is logged
        to the audit log unless ``audit`` is false."""
        session = current_session()
        if self.acls is None or session is _INTERNAL:
            return True
        if self.acls.authorize(session.principal, session.host, operation, resource_type,
                               name):
            return True
        if audit:
            self._refusals.refused(session.principal, session.peer, operation, resource_type,
                                   name)
        return False

    def _require(self, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> None:
        """Raise TOPIC/GROUP/CLUSTER_AUTHORIZATION_FAILED unless ``_allowed``."""
        if self._allowed(operation, resource_type, name):
            return
        principal = current_session().principal
        error = {"TOPIC": TopicAuthorizationFailedError, "GROUP": GroupAuthorizationFailedError,
                 "CLUSTER": ClusterAuthorizationFailedError}[resource_type]
        where = "the cluster" if resource_type == "CLUSTER" else \
            f"{resource_type.lower()} {name!r}"
        flag = "--cluster" if resource_type == "CLUSTER" else \
            f"--{resource_type.lower()} {name}"
        raise error(f"{principal} may not {operation} {where}; an administrator can allow it "
                    f"with `strata acl add --allow-principal {principal} --operation "
                    f"{operation} {flag}`")

    # ------------------------------------------------------------------ quotas
    def _throttle(self, key: str, amount: float) -> int:
        """Count ``amount`` against the session's quota; when over it, mute the
        connection for the throttle and return it (ms; 0: within the quota)."""
        session = current_session()
        if session is _INTERNAL:
            return 0
        throttle = self.quotas.record(key, session.principal, session.client_id, amount)
        if throttle:
            session.mute_until = max(session.mute_until, time.monotonic() + throttle / 1000)
        return throttle

    async def describe_client_quotas(self, request: DescribeClientQuotasRequest
                                     ) -> DescribeClientQuotasResponse:
        try:
            self._require("DESCRIBE", "CLUSTER")
            stored = await asyncio.to_thread(self.coordinator.client_quotas)
        except StrataError as err:
            return DescribeClientQuotasResponse(*error_fields(err))
        return DescribeClientQuotasResponse(0, None, [
            QuotaEntry(user, client_id, [QuotaValue(k, int(v)) for k, v in sorted(q.items())])
            for (user, client_id), q in sorted(stored.items(), key=str)])

    async def alter_client_quotas(self, request: AlterClientQuotasRequest
                                  ) -> AlterClientQuotasResponse:
        try:
            self._require("ALTER", "CLUSTER")
            changes: dict[tuple[str | None, str | None], dict[str, float | None]] = {}
            for change in request.alterations:
                if (change.user is None) == (change.client_id is None) or \
                        not (change.user or change.client_id):
                    raise InvalidRequestError(
                        "a quota names exactly one of a user or a client id (or <default>)")
                if change.key not in QUOTA_KEYS:
                    raise InvalidRequestError(
                        f"quota key {change.key!r} is not one of {', '.join(QUOTA_KEYS)}")
                if not change.remove and change.value <= 0:
                    raise InvalidRequestError(
                        f"{change.key}={change.value} is not valid: use a number above 0 "
                        "(remove the quota for no limit)")
                changes.setdefault((change.user, change.client_id), {})[change.key] = \
                    None if change.remove else float(change.value)
            for (user, client_id), values in changes.items():
                await asyncio.to_thread(self.coordinator.alter_client_quota, user, client_id,
                                        values)
        except StrataError as err:
            return AlterClientQuotasResponse(*error_fields(err))
        return AlterClientQuotasResponse(0)

    # ------------------------------------------------------------------ ACL admin
    async def create_acls(self, request: CreateAclsRequest) -> CreateAclsResponse:
        refused = self._refusal("ALTER", "CLUSTER", CLUSTER_NAME)
        if refused is not None:
            return CreateAclsResponse([AclResult(*error_fields(refused))
                                       for _ in request.creations])
        results: list[AclResult] = []
        good: list[AclBinding] = []
        for entry in request.creations:
            try:
                good.append(_binding(entry))
                results.append(AclResult(0))
            except StrataError as err:
                results.append(AclResult(*error_fields(err)))
        if good:
            try:
                await asyncio.to_thread(self.coordinator.add_acls, good)
            except StrataError as err:
                results = [r if r.error_code else AclResult(*error_fields(err)) for r in results]
        return CreateAclsResponse(results)

    async def describe_acls(self, request: DescribeAclsRequest) -> DescribeAclsResponse:
        try:
            self._require("DESCRIBE", "CLUSTER")
            wanted = _acl_filter(request.filter)
            bindings = await asyncio.to_thread(self.coordinator.acl_bindings)
        except StrataError as err:
            return DescribeAclsResponse(*error_fields(err))
        return DescribeAclsResponse(0, None, [_acl_entry(b) for b in bindings
                                              if wanted.matches(b)])

    async def delete_acls(self, request: DeleteAclsRequest) -> DeleteAclsResponse:
        refused = self._refusal("ALTER", "CLUSTER", CLUSTER_NAME)
        if refused is not None:
            return DeleteAclsResponse([DeleteAclsResult(*error_fields(refused))
                                       for _ in request.filters])
        results = []
        for entry in request.filters:
            try:
                wanted = _acl_filter(entry)
                removed = await asyncio.to_thread(self.coordinator.remove_acls, wanted.matches)
                results.append(DeleteAclsResult(0, None, [_acl_entry(b) for b in removed]))
            except StrataError as err:
                results.append(DeleteAclsResult(*error_fields(err)))
        return DeleteAclsResponse(results)

    # ------------------------------------------------------------------ SASL
    async def sasl_handshake(self, request: SaslHandshakeRequest) -> SaslHandshakeResponse:
        session = current_session()
        try:
            self.authenticator.handshake(session, request.mechanism)
        except StrataError as err:
            session.close_after_answer = True
            return SaslHandshakeResponse(err.code, self.authenticator.offered(session),
                                         err.message)
        return SaslHandshakeResponse(0, self.authenticator.offered(session))

    async def sasl_authenticate(self, request: SaslAuthenticateRequest
                                ) -> SaslAuthenticateResponse:
        session = current_session()
        try:
            if session.mechanism == "PLAIN":  # a PBKDF2 hash: off the event loop
                answer = await asyncio.to_thread(self.authenticator.authenticate, session,
                                                 bytes(request.auth_bytes))
            else:
                answer = self.authenticator.authenticate(session, bytes(request.auth_bytes))
        except StrataError as err:
            session.close_after_answer = True
            log.info("SASL login from %s on %s refused: %s", session.peer,
                     session.listener.name, err.message)
            return SaslAuthenticateResponse(err.code, err.message)
        lifetime = int(max(session.expires_at - time.monotonic(), 0) * 1000) \
            if session.expires_at else 0
        return SaslAuthenticateResponse(0, None, answer, lifetime)

    async def describe_user_scram_credentials(
            self, request: DescribeUserScramCredentialsRequest
    ) -> DescribeUserScramCredentialsResponse:
        try:
            self._require("DESCRIBE", "CLUSTER")
            stored = await asyncio.to_thread(self.coordinator.scram_credentials)
        except StrataError as err:
            return DescribeUserScramCredentialsResponse(
                [UserScramCredentials(u, *error_fields(err)) for u in request.users or []])
        names = sorted(stored) if request.users is None else request.users
        out = []
        for name in names:
            credentials = stored.get(name)
            if not credentials:
                missing = ResourceNotFoundError(
                    f"user {name!r} has no SCRAM credential; create one with `strata user "
                    "create`")
                out.append(UserScramCredentials(name, *error_fields(missing)))
                continue
            out.append(UserScramCredentials(name, 0, None, [
                ScramCredentialInfo(m, c.iterations) for m, c in sorted(credentials.items())]))
        return DescribeUserScramCredentialsResponse(out)

    async def alter_user_scram_credentials(
            self, request: AlterUserScramCredentialsRequest
    ) -> AlterUserScramCredentialsResponse:
        """Validate everything first; then write each user's changes. A user named twice
        for one mechanism is refused (as in Kafka). Needs ALTER on the cluster."""
        refused = self._refusal("ALTER", "CLUSTER", CLUSTER_NAME)
        if refused is not None:
            users = dict.fromkeys([*(d.user for d in request.deletions),
                                   *(u.user for u in request.upsertions)])
            return AlterUserScramCredentialsResponse(
                [AlterUserScramCredentialsResult(u, *error_fields(refused)) for u in users])
        errors: dict[str, StrataError] = {}
        seen: set[tuple[str, str]] = set()
        order: list[str] = []
        items: list[ScramCredentialDeletion | ScramCredentialUpsertion] = [
            *request.deletions, *request.upsertions]
        for item in items:
            if item.user not in order:
                order.append(item.user)
            try:
                if not item.user or len(item.user) > 255 or any(c in item.user for c in "/\0"):
                    raise InvalidRequestError(
                        f"user name {item.user!r} is not valid: 1-255 characters, no '/'")
                if item.mechanism not in SCRAM_MECHANISMS:
                    raise UnsupportedSaslMechanismError(
                        f"{item.mechanism!r} is not a SCRAM mechanism; use "
                        f"{' or '.join(SCRAM_MECHANISMS)}")
                if (item.user, item.mechanism) in seen:
                    raise InvalidRequestError(
                        f"user {item.user!r} and {item.mechanism} are named twice in one "
                        "request")
                seen.add((item.user, item.mechanism))
                if isinstance(item, ScramCredentialUpsertion) and not (
                        MIN_ITERATIONS <= item.iterations <= MAX_ITERATIONS
                        and item.salt and item.salted_password):
                    raise InvalidRequestError(
                        f"{item.mechanism} credential of {item.user!r}: iterations must be "
                        f"{MIN_ITERATIONS}..{MAX_ITERATIONS}, with a salt and a salted "
                        "password")
            except StrataError as err:
                errors.setdefault(item.user, err)

        def write(user: str) -> None:
            for deletion in request.deletions:
                if deletion.user == user and not self.coordinator.delete_scram_credential(
                        user, deletion.mechanism):
                    raise ResourceNotFoundError(
                        f"user {user!r} has no {deletion.mechanism} credential to delete")
            for upsert in request.upsertions:
                if upsert.user == user:
                    self.coordinator.put_scram_credential(user, credential_from_salted(
                        upsert.mechanism, bytes(upsert.salt), upsert.iterations,
                        bytes(upsert.salted_password)))

        results = []
        for user in order:
            if user in errors:
                results.append(AlterUserScramCredentialsResult(user, *error_fields(errors[user])))
                continue
            try:
                await asyncio.to_thread(write, user)
                results.append(AlterUserScramCredentialsResult(user, 0))
            except StrataError as err:
                results.append(AlterUserScramCredentialsResult(user, *error_fields(err)))
        return AlterUserScramCredentialsResponse(results)

    # ------------------------------------------------------------------ helpers
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

    # ------------------------------------------------------------------ ApiVersions
    async def api_versions(self, request: ApiVersionsRequest) -> ApiVersionsResponse:
        return ApiVersionsResponse(0, [ApiVersionRange(int(k), lo, hi)
                                       for k, (lo, hi) in API_VERSIONS.items()])

    # ------------------------------------------------------------------ Metadata
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

    # ------------------------------------------------------------------ topics admin
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
            asyncio.to_thread(self.coordinator.create_topic, definition, overrides)
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
                await asyncio.to_thread(self.coordinator.delete_topic, name)
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
                        self.coordinator.topic_configs, topic.name)
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
                        await asyncio.to_thread(self.coordinator.set_topic_configs,
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

    # ------------------------------------------------------------------ Produce
    def produce(self, request: ProduceRequest) -> Awaitable[ProduceResponse | None]:
        return self.replicas.append_records(
            request.acks, request.timeout_ms, request.topics, admit=self._admit_produce,
            refusals=self._schema_checks, quota=self._produce_quota)

    def _admit_write(self, topic: str, part: ProducePartition) -> None:
        self._require("WRITE", "TOPIC", topic)
        self._check_write(topic, part.records)

    def _quota_produced(self, size: int) -> int:
        return self._throttle("producer_byte_rate", size)

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

    # ------------------------------------------------------------------ sink commits
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
        return self.replicas.commit_staged(request, admit=self._admit_commit)

    def _admit_commit_staged(self, topic: str) -> None:
        self._require("WRITE", "TOPIC", topic)

    async def abort_staged(self, request: AbortStagedRequest) -> AbortStagedResponse:
        def abort(topic: str, part: AbortPartition, answer: AbortPartitionResponse) -> None:
            self._require("WRITE", "TOPIC", topic)
            partition = self.replicas.leader_partition(topic, part.partition)
            answer.discarded = partition.abort_staged(list(part.staging_ids))

        answered = answer_each(request.topics, lambda p: AbortPartitionResponse(p, 0), abort)
        return AbortStagedResponse([AbortTopicResponse(t, a) for t, a in answered])

    # ------------------------------------------------------------------ Fetch
    def fetch(self, request: FetchRequest) -> Awaitable[FetchResponse]:
        if request.replica_id >= 0:  # only brokers replicate
            self._require("CLUSTER_ACTION", "CLUSTER")
        return self.replicas.fetch_records(request, authorize=self._authorize_read,
                                           quota=self._fetch_quota)

    def _authorize_fetch(self, topic: str) -> None:
        self._require("READ", "TOPIC", topic)

    def _quota_fetched(self, size: int) -> int:
        return self._throttle("consumer_byte_rate", size)

    # ------------------------------------------------------------------ ListOffsets
    async def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        def find(topic: str, part: ListOffsetsPartition,
                 answer: ListOffsetsPartitionResponse) -> None:
            self._require("DESCRIBE", "TOPIC", topic)
            partition = self.replicas.leader_partition(topic, part.partition)
            answer.leader_epoch = partition.leader_epoch
            if part.timestamp == EARLIEST_TIMESTAMP:
                answer.offset = partition.log.log_start_offset
            elif part.timestamp == LATEST_TIMESTAMP:
                answer.offset = partition.high_watermark
            elif part.timestamp < 0:
                raise InvalidRequestError(
                    f"timestamp {part.timestamp} is not valid: use -2 (earliest), -1 "
                    "(latest) or milliseconds since the epoch")
            else:
                found = partition.log.find_by_timestamp(part.timestamp)
                if found is not None and found[0] < partition.high_watermark:
                    answer.offset, answer.timestamp = found

        answered = answer_each(request.topics, lambda p: ListOffsetsPartitionResponse(p, 0),
                                find)
        return ListOffsetsResponse([ListOffsetsTopicResponse(t, a) for t, a in answered])

    # ------------------------------------------------------------------ DescribeTier
    async def describe_tier(self, request: DescribeTierRequest) -> DescribeTierResponse:
        """Closed segments and tier progress of the partitions this broker leads.

        The segment list comes from the leader's log (under its lock, one snapshot per
        partition); the table and progress from ZooKeeper, read once per topic.
        """
        topics = []
        for topic in request.topics:
            definition = self.cluster.topics.get(topic.name)
            try:
                self._require("DESCRIBE", "TOPIC", topic.name)
                if definition is None:
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic.name!r} does not exist; check the name (strata topic "
                        "list)")
                config = self.host.log_config_for(topic.name)
                table, progress = await asyncio.to_thread(self._tier_records, topic.name)
            except StrataError as err:
                topics.append(DescribeTierTopicResponse(topic.name, *error_fields(err)))
                continue
            partitions = topic.partitions or list(definition.assignment)
            topics.append(DescribeTierTopicResponse(
                topic.name, 0, None, config.tier_enable, config.tier_after_ms, table,
                [self._describe_tier_partition(topic.name, p, progress.get(p))
                 for p in partitions]))
        return DescribeTierResponse(topics)

    def _tier_records(self, topic: str) -> tuple[str | None, dict[int, TierProgress]]:
        coordinator = self.coordinator
        return coordinator.tier_table(topic), coordinator.tier_progress(topic)

    def _describe_tier_partition(self, topic: str, p: int, progress: TierProgress | None
                                 ) -> DescribeTierPartitionResponse:
        answer = DescribeTierPartitionResponse(p, 0)
        try:
            partition = self.replicas.leader_partition(topic, p)
            high_watermark = partition.high_watermark
            # Closed segments only, and only below the high watermark: a segment a
            # follower could still lose (or the active one, still growing) is never
            # offered for tiering.
            answer.segments = [
                TierSegment(s.base_offset, s.next_offset, s.max_timestamp, s.size_bytes)
                for s in partition.log.closed_segments() if s.next_offset <= high_watermark]
            answer.log_start_offset = partition.log.log_start_offset
            answer.high_watermark = high_watermark
            if progress is not None:
                answer.tiered_up_to = progress.tiered_up_to
                answer.tier_start_offset = progress.tier_start
        except StrataError as err:
            answer.error_code, answer.error_message = error_fields(err)
        return answer

    # ------------------------------------------------------------------ tier lease, progress
    async def tier_lease(self, request: TierLeaseRequest) -> TierLeaseResponse:
        """Take, renew or give up a tiering job's lease (kept in ZooKeeper, any broker)."""
        try:
            self._require("ALTER", "TOPIC", request.topic)
            if request.release:
                if request.lease_id is None:
                    raise InvalidRequestError("release needs the lease_id being given up")
                await asyncio.to_thread(self.coordinator.release_tier_lease, request.topic,
                                        request.lease_id)
                return TierLeaseResponse(0)
            if not _MIN_TIER_LEASE_MS <= request.ttl_ms <= _MAX_TIER_LEASE_MS:
                raise InvalidRequestError(
                    f"ttl_ms={request.ttl_ms} is out of range; use {_MIN_TIER_LEASE_MS}.."
                    f"{_MAX_TIER_LEASE_MS} ms and renew well within it")
            if request.lease_id is None:
                lease_id, topic_id, compacted = await asyncio.to_thread(
                    self.coordinator.acquire_tier_lease, request.topic, request.owner,
                    request.ttl_ms)
                return TierLeaseResponse(0, None, lease_id, topic_id, [
                    CompactionProgress(p, merged) for p, merged in sorted(compacted.items())])
            await asyncio.to_thread(self.coordinator.renew_tier_lease, request.topic,
                                    request.lease_id, request.ttl_ms)
            return TierLeaseResponse(0, None, request.lease_id)
        except StrataError as err:
            return TierLeaseResponse(*error_fields(err))

    async def update_tier(self, request: UpdateTierRequest) -> UpdateTierResponse:
        """Record a job's progress, every write fenced by its lease (see the request)."""
        try:
            self._require("ALTER", "TOPIC", request.topic)
            definition = self.cluster.topics.get(request.topic)
            for update in request.partitions:
                if definition is not None and update.partition not in definition.assignment:
                    raise InvalidRequestError(
                        f"{request.topic} has no partition {update.partition}")
                touched = update.tiered_up_to >= 0 or update.tier_start >= 0
                if touched and not 0 <= update.tier_start <= update.tiered_up_to:
                    raise InvalidRequestError(
                        f"{request.topic}-{update.partition}: tier progress needs 0 <= "
                        f"tier_start ({update.tier_start}) <= tiered_up_to "
                        f"({update.tiered_up_to})")
                if update.merged_up_to < -1:
                    raise InvalidRequestError(
                        f"{request.topic}-{update.partition}: merged_up_to "
                        f"{update.merged_up_to} is negative (-1: leave it)")
            stored = await asyncio.to_thread(self._write_tier, request)
        except StrataError as err:
            return UpdateTierResponse(*error_fields(err))
        return UpdateTierResponse(0, None, stored)

    def _write_tier(self, request: UpdateTierRequest) -> list[TierProgressUpdate]:
        coordinator, topic, lease = self.coordinator, request.topic, request.lease_id
        if request.table is not None:
            coordinator.set_tier_table(topic, request.table, lease_id=lease)
        out = []
        for update in request.partitions:
            answer = TierProgressUpdate(update.partition)
            if update.tiered_up_to >= 0:
                saved = coordinator.advance_tier_progress(
                    topic, update.partition, tiered_up_to=update.tiered_up_to,
                    tier_start=update.tier_start, topic_id=request.topic_id, lease_id=lease)
                answer.tiered_up_to, answer.tier_start = saved.tiered_up_to, saved.tier_start
            if update.merged_up_to >= 0:
                answer.merged_up_to = coordinator.advance_compaction_progress(
                    topic, update.partition, update.merged_up_to, lease_id=lease)
            out.append(answer)
        return out

    # ------------------------------------------------------------------ OffsetForLeaderEpoch
    async def offset_for_leader_epoch(
            self, request: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
        if request.replica_id >= 0:
            self._require("CLUSTER_ACTION", "CLUSTER")

        def end_of_epoch(topic: str, part: OffsetForLeaderEpochPartition,
                         answer: OffsetForLeaderEpochPartitionResponse) -> None:
            if request.replica_id < 0:
                self._require("DESCRIBE", "TOPIC", topic)
            partition = self.replicas.leader_partition(topic, part.partition)
            self.replicas.check_epoch(partition, part.current_leader_epoch)
            answer.leader_epoch, answer.end_offset = \
                partition.log.end_offset_for_epoch(part.leader_epoch)

        answered = answer_each(request.topics,
                                lambda p: OffsetForLeaderEpochPartitionResponse(p, 0),
                                end_of_epoch)
        return OffsetForLeaderEpochResponse(
            [OffsetForLeaderEpochTopicResponse(t, a) for t, a in answered])

    # ------------------------------------------------------------------ cluster admin
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
        coordinator = self.coordinator
        by_topic: dict[str, list[ElectionPartitionResult]] = {}
        failure: StrataError | None = None
        if known:
            try:
                await asyncio.to_thread(coordinator.request_preferred_election,
                                        None if request.topics is None else known)
                deadline = time.monotonic() + max(request.timeout_ms, 1) / 1000
                while await asyncio.to_thread(coordinator.preferred_election_pending):
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
                state = await asyncio.to_thread(coordinator.partition_state, topic, p)
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
            coordinator = self.coordinator
            try:
                for _ in range(10):
                    pending, version = await asyncio.to_thread(coordinator.reassignments)
                    pending.update(wanted)
                    try:
                        await asyncio.to_thread(coordinator.write_reassignments, pending,
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
        coordinator = self.coordinator
        pending, _ = await asyncio.to_thread(coordinator.reassignments)
        out = []
        for (topic, p), target in sorted(pending.items()):
            definition = self.cluster.topics.get(topic)
            current = definition.assignment.get(p, []) if definition else []
            try:
                isr = (await asyncio.to_thread(coordinator.partition_state, topic, p)).isr
            except StrataError:
                isr = []
            # Joining: a target replica not in the replica set yet, or still copying.
            out.append(OngoingReassignment(
                topic, p, list(current), [b for b in target if b not in current or b not in isr],
                [b for b in current if b not in target]))
        return ListPartitionReassignmentsResponse(out)

    # ------------------------------------------------------------------ InitProducerId
    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResponse:
        session = current_session()
        if self.acls is not None and session is not _INTERNAL and not (
                self._allowed("IDEMPOTENT_WRITE", "CLUSTER", CLUSTER_NAME, audit=False)
                or self.acls.allows_any(session.principal, session.host, "WRITE", "TOPIC")):
            # Kafka's rule: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic.
            refused = self._refusal("IDEMPOTENT_WRITE", "CLUSTER", CLUSTER_NAME)
            if refused is not None:
                return InitProducerIdResponse(refused.code, error_message=refused.message)
        if request.transactional_id is not None:
            err = InvalidRequestError("transactions are not supported yet; use "
                                      "transactional_id = null for an idempotent producer")
            return InitProducerIdResponse(err.code, error_message=err.message)
        if request.producer_id != -1 or request.producer_epoch != -1:
            # Bumping the epoch of an existing id would let any client fence any other;
            # that needs a transactional id, which does not exist yet.
            err = InvalidRequestError(
                "an idempotent producer asks for a new id: send producer_id=-1 and "
                "producer_epoch=-1 (epoch bumps need transactions, not supported yet)")
            return InitProducerIdResponse(err.code, error_message=err.message)
        try:
            return InitProducerIdResponse(0, await self.host.next_producer_id(), 0)
        except StrataError as err:  # ZooKeeperUnavailableError: retriable
            return InitProducerIdResponse(err.code, error_message=err.message)

    # ------------------------------------------------------------------ consumer groups
    async def find_coordinator(self, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
        try:
            self._require("DESCRIBE", "GROUP", request.key)
            node, host, port = await self.groups.find(request.key)
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

    def _refusal(self, operation: str, resource_type: str, name: str) -> StrataError | None:
        try:
            self._require(operation, resource_type, name)
        except StrataError as err:
            return err
        return None

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

    # ------------------------------------------------------------------ schema registry
    async def schema_registry(self, request: SchemaRegistryRequest) -> SchemaRegistryResponse:
        writes = request.operation in ("register", "delete_subject", "delete_version",
                                       "set_config", "delete_config")
        operation = "ALTER" if writes else "DESCRIBE"
        topic = subject_topic(request.subject) if request.subject else None
        if not ((topic is not None and self._allowed(operation, "TOPIC", topic, audit=False))
                or self._allowed(operation, "CLUSTER", CLUSTER_NAME, audit=topic is None)):
            if topic is not None:
                self._allowed(operation, "TOPIC", topic)  # writes the audit line
            principal = current_session().principal
            err = TopicAuthorizationFailedError(
                f"{principal} may not {operation} subject {request.subject!r}: allow "
                f"{operation} on topic {topic!r} or on the cluster (`strata acl add`)"
            ) if topic is not None else ClusterAuthorizationFailedError(
                f"{principal} may not {operation} the schema registry: allow {operation} "
                "on the cluster (`strata acl add ... --cluster`)")
            return SchemaRegistryResponse(err.code, err.message, 40301)
        if self.schemas is None:
            err2 = InvalidRequestError("this broker has no schema registry; upgrade it")
            return SchemaRegistryResponse(err2.code, err2.message, 50001)
        answer = await self.schemas.handle(request, client_id=current_session().client_id)
        if writes and answer.error_code == 0 and self.schema_check is not None:
            self.schema_check.forget()
        return answer


_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def valid_topic_name(name: str) -> bool:
    return bool(_TOPIC_NAME.match(name)) and name not in (".", "..")
