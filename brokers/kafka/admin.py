"""The Kafka listener's security and operations APIs: ACLs, SCRAM credentials, incremental
config changes and the transaction listings, translated to Strata's own.

Kafka encodes ACL resource types, pattern types, operations, permissions and SCRAM
mechanisms as small integers (``org.apache.kafka.common.acl``/``resource``); Strata's
messages carry their names. The tables below are Kafka's numbering; a value Strata has
no name for (a USER or DELEGATION_TOKEN resource, the token operations) is refused per
entry with INVALID_REQUEST and a sentence naming what is served. The CLUSTER resource is
``kafka-cluster`` in Kafka's clients and ``strata-cluster`` in Strata's: each side sees
its own name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from brokers.kafka.codec import API_TYPES
from wire.protocol import (
    AclEntry,
    AclFilterEntry,
    AlterConfigsRequest,
    AlterConfigsTopic,
    AlterUserScramCredentialsRequest,
    ApiKey,
    ConfigEntry,
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
    DescribeTransactionsRequest,
    DescribeUserScramCredentialsRequest,
    ListTransactionsRequest,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)

if TYPE_CHECKING:
    from brokers.kafka.codec import KafkaHeader
    from brokers.security import Session

__all__ = ["KafkaAdmin"]

_INVALID_REQUEST: Final = 42
RESOURCE_TYPES: Final = {2: "TOPIC", 3: "GROUP", 4: "CLUSTER", 5: "TRANSACTIONAL_ID"}
PATTERN_TYPES: Final = {3: "LITERAL", 4: "PREFIXED", 2: "MATCH"}
OPERATIONS: Final = {2: "ALL", 3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER",
                     8: "DESCRIBE", 9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS",
                     11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE"}
PERMISSIONS: Final = {2: "DENY", 3: "ALLOW"}
MECHANISMS: Final = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_ANY: Final = 1
_KAFKA_CLUSTER: Final = "kafka-cluster"
_STRATA_CLUSTER: Final = "strata-cluster"

Call = Callable[[ApiKey, Any, "Session", "KafkaHeader"], Awaitable[Any]]


class _Unserved(ValueError):
    pass


def _code_of(table: dict[int, str], name: str) -> int:
    for code, known in table.items():
        if known == name:
            return code
    return 0


def _name(table: dict[int, str], code: int, what: str) -> str:
    try:
        return table[code]
    except KeyError:
        raise _Unserved(f"{what} {code} is not served (served: "
                        f"{', '.join(f'{k} {v}' for k, v in table.items())})") from None


def _filter_name(table: dict[int, str], code: int, what: str) -> str | None:
    return None if code == _ANY else _name(table, code, what)


def _strata_resource(name: str | None) -> str | None:
    return _STRATA_CLUSTER if name == _KAFKA_CLUSTER else name


def _kafka_resource(name: str) -> str:
    return _KAFKA_CLUSTER if name == _STRATA_CLUSTER else name


class KafkaAdmin:
    """ACL, SCRAM, IncrementalAlterConfigs and transaction-listing translations."""

    def __init__(self, call: Call) -> None:
        self._call = call

    # ------------------------------------------------------------------ ACLs
    @staticmethod
    def _filter(f: Any) -> AclFilterEntry:
        return AclFilterEntry(
            _filter_name(RESOURCE_TYPES, f.resource_type_filter, "resource type"),
            _filter_name(PATTERN_TYPES, f.pattern_type_filter, "pattern type"),
            _strata_resource(f.resource_name_filter), f.principal_filter, f.host_filter,
            _filter_name(OPERATIONS, f.operation, "operation"),
            _filter_name(PERMISSIONS, f.permission_type, "permission"))

    async def create_acls(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[30][1]
        entries: list[AclEntry | str] = []
        for c in request.creations:
            try:
                entries.append(AclEntry(
                    _name(RESOURCE_TYPES, c.resource_type, "resource type"),
                    _name(PATTERN_TYPES, c.resource_pattern_type, "pattern type"),
                    _strata_resource(c.resource_name) or "", c.principal, c.host,
                    _name(OPERATIONS, c.operation, "operation"),
                    _name(PERMISSIONS, c.permission_type, "permission")))
            except _Unserved as err:
                entries.append(str(err))
        wanted = [e for e in entries if isinstance(e, AclEntry)]
        results: Iterator[Any] = iter([])
        if wanted:
            answer = await self._call(ApiKey.CREATE_ACLS, CreateAclsRequest(wanted), session,
                                      header)
            results = iter(answer.results)
        out = []
        for e in entries:
            if isinstance(e, str):
                out.append(r.AclCreationResult(error_code=_INVALID_REQUEST, error_message=e))
            else:
                a = next(results)
                out.append(r.AclCreationResult(error_code=a.error_code,
                                               error_message=a.error_message))
        return r(throttle_time_ms=0, results=out)

    async def describe_acls(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[29][1]
        try:
            wanted = self._filter(request)
        except _Unserved as err:
            return r(throttle_time_ms=0, error_code=_INVALID_REQUEST, error_message=str(err),
                     resources=[])
        answer = await self._call(ApiKey.DESCRIBE_ACLS, DescribeAclsRequest(wanted), session,
                                  header)
        grouped: dict[tuple[str, str, str], list[AclEntry]] = {}
        for a in answer.acls:
            grouped.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(a)
        R = r.DescribeAclsResource
        return r(throttle_time_ms=0, error_code=answer.error_code,
                 error_message=answer.error_message, resources=[R(
                     resource_type=_code_of(RESOURCE_TYPES, t),
                     resource_name=_kafka_resource(n),
                     pattern_type=_code_of(PATTERN_TYPES, p), acls=[R.AclDescription(
                         principal=a.principal, host=a.host,
                         operation=_code_of(OPERATIONS, a.operation),
                         permission_type=_code_of(PERMISSIONS, a.permission)) for a in acls])
                     for (t, n, p), acls in grouped.items()])

    async def delete_acls(self, request: Any, header: KafkaHeader, session: Session) -> Any:
        r = API_TYPES[31][1]
        R = r.DeleteAclsFilterResult
        out = []
        for f in request.filters:  # one at a time: a refused filter must not sink the rest
            try:
                wanted = self._filter(f)
            except _Unserved as err:
                out.append(R(error_code=_INVALID_REQUEST, error_message=str(err),
                             matching_acls=[]))
                continue
            answer = await self._call(ApiKey.DELETE_ACLS, DeleteAclsRequest([wanted]),
                                      session, header)
            (result,) = answer.results
            out.append(R(error_code=result.error_code, error_message=result.error_message,
                         matching_acls=[R.DeleteAclsMatchingAcl(
                             error_code=0, error_message=None,
                             resource_type=_code_of(RESOURCE_TYPES, a.resource_type),
                             resource_name=_kafka_resource(a.resource_name),
                             pattern_type=_code_of(PATTERN_TYPES, a.pattern_type),
                             principal=a.principal, host=a.host,
                             operation=_code_of(OPERATIONS, a.operation),
                             permission_type=_code_of(PERMISSIONS, a.permission))
                             for a in result.deleted]))
        return r(throttle_time_ms=0, filter_results=out)

    # ------------------------------------------------------------------ SCRAM
    async def describe_user_scram_credentials(self, request: Any, header: KafkaHeader,
                                              session: Session) -> Any:
        users = None if request.users is None else [u.name for u in request.users]
        answer = await self._call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                                  DescribeUserScramCredentialsRequest(users), session, header)
        r = API_TYPES[50][1]
        R = r.DescribeUserScramCredentialsResult
        return r(throttle_time_ms=0, error_code=0, error_message=None, results=[R(
            user=u.user, error_code=u.error_code, error_message=u.error_message,
            credential_infos=[R.CredentialInfo(
                mechanism=_code_of(MECHANISMS, c.mechanism), iterations=c.iterations)
                for c in u.credentials]) for u in answer.users])

    async def alter_user_scram_credentials(self, request: Any, header: KafkaHeader,
                                           session: Session) -> Any:
        r = API_TYPES[51][1]
        refused: list[Any] = []
        deletions, upsertions = [], []
        for d in request.deletions:
            if d.mechanism in MECHANISMS:
                deletions.append(ScramCredentialDeletion(d.name, MECHANISMS[d.mechanism]))
            else:
                refused.append(r.AlterUserScramCredentialsResult(
                    user=d.name, error_code=_INVALID_REQUEST,
                    error_message=f"SCRAM mechanism {d.mechanism} is not served (1 "
                                  "SCRAM-SHA-256, 2 SCRAM-SHA-512)"))
        for u in request.upsertions:
            if u.mechanism in MECHANISMS:
                upsertions.append(ScramCredentialUpsertion(
                    u.name, MECHANISMS[u.mechanism], u.iterations, bytes(u.salt),
                    bytes(u.salted_password)))
            else:
                refused.append(r.AlterUserScramCredentialsResult(
                    user=u.name, error_code=_INVALID_REQUEST,
                    error_message=f"SCRAM mechanism {u.mechanism} is not served (1 "
                                  "SCRAM-SHA-256, 2 SCRAM-SHA-512)"))
        results = []
        if deletions or upsertions:
            answer = await self._call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                                      AlterUserScramCredentialsRequest(deletions, upsertions),
                                      session, header)
            results = [r.AlterUserScramCredentialsResult(
                user=a.user, error_code=a.error_code, error_message=a.error_message)
                for a in answer.results]
        return r(throttle_time_ms=0, results=results + refused)

    # ------------------------------------------------------------------ configs
    async def incremental_alter_configs(self, request: Any, header: KafkaHeader,
                                        session: Session) -> Any:
        r = API_TYPES[44][1]
        R = r.AlterConfigsResourceResponse
        out = []
        topics: list[AlterConfigsTopic] = []
        for res in request.resources:
            problem = None
            if res.resource_type != 2:
                problem = (f"resource type {res.resource_type}: only topic configs (2) can be "
                           "changed here; broker settings are set in the broker's config")
            elif any(c.config_operation not in (0, 1) for c in res.configs):
                problem = ("only SET (0) and DELETE (1) are served; APPEND and SUBTRACT of "
                           "list configs are not")
            if problem:
                out.append(R(error_code=_INVALID_REQUEST, error_message=problem,
                             resource_type=res.resource_type, resource_name=res.resource_name))
                continue
            topics.append(AlterConfigsTopic(
                res.resource_name,
                [ConfigEntry(c.name, c.value) for c in res.configs if c.config_operation == 0],
                [c.name for c in res.configs if c.config_operation == 1]))
        if topics:
            answer = await self._call(ApiKey.ALTER_CONFIGS, AlterConfigsRequest(
                topics, validate_only=request.validate_only), session, header)
            out = [R(error_code=t.error_code, error_message=t.error_message, resource_type=2,
                     resource_name=t.name) for t in answer.topics] + out
        return r(throttle_time_ms=0, responses=out)

    # ------------------------------------------------------------------ transactions
    async def describe_transactions(self, request: Any, header: KafkaHeader,
                                    session: Session) -> Any:
        answer = await self._call(ApiKey.DESCRIBE_TRANSACTIONS, DescribeTransactionsRequest(
            list(request.transactional_ids)), session, header)
        r = API_TYPES[65][1]
        S = r.TransactionState
        return r(throttle_time_ms=0, transaction_states=[S(
            error_code=t.error_code, transactional_id=t.transactional_id,
            transaction_state=t.state, transaction_timeout_ms=t.timeout_ms,
            transaction_start_time_ms=t.start_ms, producer_id=t.producer_id,
            producer_epoch=t.producer_epoch,
            topics=[S.TopicData(topic=x.name, partitions=list(x.partitions))
                    for x in t.topics]) for t in answer.transactions])

    async def list_transactions(self, request: Any, header: KafkaHeader,
                                session: Session) -> Any:
        answer = await self._call(ApiKey.LIST_TRANSACTIONS, ListTransactionsRequest(
            list(request.state_filters), list(request.producer_id_filters),
            request.duration_filter if header.api_version >= 1 else -1), session, header)
        r = API_TYPES[66][1]
        return r(throttle_time_ms=0, error_code=answer.error_code, unknown_state_filters=[],
                 transaction_states=[r.TransactionState(
                     transactional_id=t.transactional_id, producer_id=t.producer_id,
                     transaction_state=t.state) for t in answer.transactions])
