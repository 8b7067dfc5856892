"""The Strata admin client: topics, configs and offsets; the cluster (preferred-leader
election, partition reassignment); consumer groups; ACLs, SCRAM users and quotas; the
tiering job's APIs; the schema registry; transactions.

Two faces over one implementation: ``AsyncAdmin`` (asyncio) and ``Admin`` (blocking, on a
private event-loop thread). This module keeps only the faces, and re-exports the result
types. Each family of APIs is one private module, as the producer and the consumer are
split, and says how its calls travel and fail:

- ``_admin_topics``: create, delete, list and describe topics; describe and alter
  configs; list offsets (``NewTopic``, ``TopicDescription``, ``ConfigValue``, ...).
- ``_admin_cluster``: ``describe_cluster``, preferred-leader elections, partition
  reassignments (``ClusterDescription``, ``ElectionResult``, ``Reassignment``).
- ``_admin_groups``: consumer groups, each asked of its coordinator (``GroupListing``,
  ``GroupDescription``, ``PartitionLag``, ``ResetPlan``, ...).
- ``_admin_security``: ACL bindings, SCRAM credentials, client quotas.
- ``_admin_tier``: what the Delta tiering job plans from (``describe_tier``), its lease
  and its progress (``TopicTier``, ``TierLease``, ...).
- ``_admin_schemas``: the schema registry and typed topics' value subjects.
- ``_admin_transactions``: transactional ids and open transactions: describe, list,
  the producers of a partition, aborting and finding hanging transactions
  (``TransactionDescription``, ``TransactionListing``, ``ProducerState``, ...).
- ``_admin_common``: ``AdminContext``, the cluster connection and timeouts they share.

Errors are the typed ``wire.errors`` classes. Calls on many topics or groups
(``create_topics``, ``delete_topics``, ``delete_groups``) raise the first failure, or
with ``raise_errors=False`` return every outcome; the broker acted on every item that did
not fail. Validation lives in the broker; the client sends what it is given.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar, Unpack

from strata.client._admin_cluster import (
    ClusterAdmin,
    ClusterDescription,
    ElectionResult,
    Reassignment,
)
from strata.client._admin_common import AdminContext
from strata.client._admin_groups import (
    CommittedOffset,
    GroupAdmin,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetReset,
    PartitionLag,
    ResetPlan,
    ResetTarget,
)
from strata.client._admin_schemas import SchemaAdmin
from strata.client._admin_security import SecurityAdmin
from strata.client._admin_tier import (
    PartitionTier,
    SegmentInfo,
    StoredTierProgress,
    TierAdmin,
    TierLease,
    TopicTier,
)
from strata.client._admin_topics import (
    ConfigValue,
    ListOffsetsResult,
    NewTopic,
    OffsetSpec,
    PartitionDescription,
    TopicAdmin,
    TopicDescription,
)
from strata.client._admin_transactions import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    TRANSACTION_STATES,
    AbortTransactionSpec,
    HangingTransaction,
    ProducerState,
    TransactionAdmin,
    TransactionDescription,
    TransactionListing,
)
from strata.client._cluster import Cluster
from strata.client._common import TopicPartition
from strata.client._config import IsolationLevel, SecurityOptions, security_of
from strata.client._group import CoordinatorAddress
from strata.client._schemas import RegisteredSchema, RegistryAnswer, SchemaSource
from strata.client._sync import EventLoopThread
from wire.errors import StrataError
from wire.protocol import AclEntry, AclFilterEntry, SchemaRegistryRequest
from wire.sasl import MIN_ITERATIONS

__all__ = [
    "AbortTransactionSpec",
    "Admin",
    "AsyncAdmin",
    "HangingTransaction",
    "ProducerState",
    "TRANSACTION_STATES",
    "TransactionDescription",
    "TransactionListing",
    "ClusterDescription",
    "CommittedOffset",
    "ConfigValue",
    "Coordinator",
    "CoordinatorAddress",
    "ElectionResult",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "OffsetReset",
    "PartitionLag",
    "ResetPlan",
    "ResetTarget",
    "ListOffsetsResult",
    "NewTopic",
    "OffsetSpec",
    "PartitionDescription",
    "PartitionTier",
    "Reassignment",
    "SegmentInfo",
    "StoredTierProgress",
    "TierLease",
    "TopicDescription",
    "TopicTier",
]

T = TypeVar("T")

#: The name ``CoordinatorAddress`` had before it said what it is (kept for existing code).
Coordinator: TypeAlias = CoordinatorAddress


class AsyncAdmin:
    """asyncio admin client. Requests that any broker can answer (topic admin, configs,
    metadata) go to the first broker that answers; offsets go to each partition's leader."""

    def __init__(self, bootstrap_servers: str | list[str], *, client_id: str = "strata-admin",
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 **security: Unpack[SecurityOptions]) -> None:
        """``security`` (or kafka-python's ``security_protocol``, ``sasl_mechanism``,
        ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_*``): how to reach the
        brokers' listener (``wire.security.ClientSecurity``)."""
        unknown = set(security) - set(SecurityOptions.__annotations__)
        if unknown:
            raise TypeError(f"unknown admin option(s) {sorted(unknown)}")
        client_security, _ = security_of(security)
        if request_timeout_ms < 1000:
            raise ValueError(f"request_timeout_ms={request_timeout_ms} is too small; "
                             "use 1000 or more")
        self._cluster = Cluster(bootstrap_servers, client_id=client_id,
                                request_timeout_ms=request_timeout_ms,
                                retry_backoff_ms=retry_backoff_ms, security=client_security)
        self._context = AdminContext(self._cluster, request_timeout_ms, retry_backoff_ms)
        self.schemas = SchemaSource(self._cluster, request_timeout_ms=request_timeout_ms,
                                    retry_backoff_ms=retry_backoff_ms)
        self._topic_admin = TopicAdmin(self._context)
        self._cluster_admin = ClusterAdmin(self._context)
        self._group_admin = GroupAdmin(self._context, self._topic_admin)
        self._security_admin = SecurityAdmin(self._context)
        self._tier_admin = TierAdmin(self._context)
        self._schema_admin = SchemaAdmin(self._context, self.schemas)
        self._transaction_admin = TransactionAdmin(self._context, self._topic_admin)

    @property
    def request_timeout_ms(self) -> int:
        return self._context.request_timeout_ms

    @request_timeout_ms.setter
    def request_timeout_ms(self, value: int) -> None:
        self._context.request_timeout_ms = value

    @property
    def retry_backoff_ms(self) -> int:
        return self._context.retry_backoff_ms

    @retry_backoff_ms.setter
    def retry_backoff_ms(self, value: int) -> None:
        self._context.retry_backoff_ms = value

    # ------------------------------------------------------------------ topics, configs, offsets
    async def create_topics(self, new_topics: Iterable[NewTopic], *, validate_only: bool = False,
                            raise_errors: bool = True) -> dict[str, StrataError | None]:
        """Create topics; returns once the broker that handled the request serves them.

        ``validate_only``: check names, counts and configs without creating anything.
        """
        return await self._topic_admin.create_topics(new_topics, validate_only=validate_only,
                                                      raise_errors=raise_errors)

    async def delete_topics(self, names: Iterable[str], *, raise_errors: bool = True
                            ) -> dict[str, StrataError | None]:
        """Delete topics and their data; returns once the answering broker dropped them."""
        return await self._topic_admin.delete_topics(names, raise_errors=raise_errors)

    async def list_topics(self) -> list[str]:
        """Every topic name, sorted."""
        return await self._topic_admin.list_topics()

    async def describe_topics(self, names: Iterable[str] | None = None, *,
                              offsets: bool = True) -> dict[str, TopicDescription]:
        """Per partition: leader, replicas, ISR, log start, log end and high watermark.

        ``names=None`` describes every topic. Raises ``UnknownTopicOrPartitionError`` for a
        topic that does not exist. ``offsets=False`` answers from one Metadata request
        (what every client sees of leaders and ISRs), without asking each leader for its
        offsets: the three offsets are then -1.
        """
        return await self._topic_admin.describe_topics(names, offsets=offsets)

    async def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, ConfigValue]]:
        """Every topic config key with its effective value, per topic."""
        return await self._topic_admin.describe_configs(names)

    async def alter_configs(self, name: str, set: Mapping[str, str | int] | None = None,
                            delete: Iterable[str] = (), *, validate_only: bool = False) -> None:
        """Set and/or remove config overrides of one topic, atomically.

        Keys in ``delete`` fall back to the broker default. The whole change is validated
        first; on any error nothing changes and the typed error is raised.
        """
        await self._topic_admin.alter_configs(name, set, delete, validate_only=validate_only)

    async def list_offsets(self, specs: Mapping[TopicPartition, OffsetSpec], *,
                           isolation_level: IsolationLevel = "read_uncommitted"
                           ) -> dict[TopicPartition, ListOffsetsResult]:
        """Offsets per partition: ``"earliest"`` (log start), ``"latest"`` (high
        watermark: the next committed offset) or the first offset whose timestamp is at or
        after a timestamp in ms (``-1`` when none is). ``isolation_level=
        "read_committed"``: ``"latest"`` is the last stable offset (the first offset of
        the oldest undecided transaction, at most the high watermark), and timestamps
        find only records below it, as a read_committed consumer would read."""
        return await self._topic_admin.list_offsets(specs, isolation_level=isolation_level)

    # ------------------------------------------------------------------ cluster, replicas
    async def describe_cluster(self) -> ClusterDescription:
        return await self._cluster_admin.describe_cluster()

    async def elect_preferred_leaders(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, ElectionResult]:
        """Move leadership back to each partition's preferred replica (its first assigned
        replica) where that replica is alive and in sync; ``None``: every partition.

        Returns once the controller acted, with each partition's leader after the
        election. A partition whose preferred replica could not take over keeps its
        leader; its ``ElectionResult.message`` says why (not an error). Raises the first
        failed partition's typed error (``UnknownTopicOrPartitionError`` for a partition
        that does not exist; ``RequestTimedOutError`` when the controller did not act in
        time, the election may still happen; ``ConcurrentUpdateError`` while another
        election runs); the broker still elected the other partitions.
        """
        return await self._cluster_admin.elect_preferred_leaders(partitions)

    async def alter_partition_reassignments(
            self, targets: Mapping[TopicPartition | tuple[str, int], Sequence[int]]) -> None:
        """Move partitions onto new replica lists (first = preferred leader).

        Returns as soon as the targets are recorded; the controller then moves each
        partition in the background: the new replicas copy the log from the leader, and
        once all of them are in the ISR leadership moves (if the leader is not kept) and
        the leaving replicas drop their copies. Follow it with
        ``list_partition_reassignments`` / ``describe_topics``. A new target for a
        partition still moving replaces the old one.

        Raises the first failed partition's typed error: ``UnknownTopicOrPartitionError``
        (no such partition), ``InvalidReplicationFactorError`` (empty list, a broker
        listed twice, a broker that is not live). The broker recorded every partition
        that did not fail.
        """
        await self._cluster_admin.alter_partition_reassignments(targets)

    async def list_partition_reassignments(self) -> dict[TopicPartition, Reassignment]:
        """The reassignments still in progress, every topic, sorted by partition."""
        return await self._cluster_admin.list_partition_reassignments()

    # ------------------------------------------------------------------ consumer groups
    async def find_coordinator(self, group_id: str) -> CoordinatorAddress:
        """The broker coordinating ``group_id`` now (node id, host, port)."""
        return await self._group_admin.find_coordinator(group_id)

    async def list_groups(self) -> list[GroupListing]:
        """Every group of the cluster, sorted by id: each live broker lists the groups it
        coordinates. A broker that does not answer within the request timeout makes
        this raise (a partial list would hide groups)."""
        return await self._group_admin.list_groups()

    async def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """State, assignor, epoch and members (assignment, target) of each group. Raises
        ``GroupIdNotFoundError`` for a group with no members and no committed offsets."""
        return await self._group_admin.describe_groups(group_ids)

    async def describe_group(self, group_id: str) -> GroupDescription:
        return await self._group_admin.describe_group(group_id)

    async def list_group_offsets(
            self, group_id: str,
            partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets (``None``: every committed partition), sorted;
        partitions with nothing committed are left out."""
        return await self._group_admin.list_group_offsets(group_id, partitions)

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Per partition the group has committed or a member owns: committed offset, log
        end (high watermark), lag and owning member; sorted by topic and partition.
        Raises ``GroupIdNotFoundError`` for an unknown group."""
        return await self._group_admin.group_lag(group_id)

    async def reset_group_offsets(
            self, group_id: str, topic: str, to: ResetTarget, *,
            partitions: Iterable[int] | None = None, execute: bool = False) -> ResetPlan:
        """Plan (and with ``execute``, commit) new offsets for ``topic``'s partitions
        (``None``: all of them) in ``group_id``.

        Everything is checked before anything is written: the target, the topic and
        partitions, and, to execute, that the group has no members (``NonEmptyGroupError``
        otherwise: a member's next commit would overwrite the reset). The commit is made
        outside any membership (member epoch -1).
        """
        return await self._group_admin.reset_group_offsets(group_id, topic, to,
                                                           partitions=partitions,
                                                           execute=execute)

    async def delete_groups(self, group_ids: Iterable[str], *, raise_errors: bool = True
                            ) -> dict[str, StrataError | None]:
        """Delete groups with no members and their committed offsets. Raises the first
        failure (``NonEmptyGroupError``: stop its consumers first; ``GroupIdNotFoundError``)
        unless ``raise_errors=False``, which returns ``{group: None | error}``."""
        return await self._group_admin.delete_groups(group_ids, raise_errors=raise_errors)

    async def delete_group(self, group_id: str) -> None:
        await self._group_admin.delete_group(group_id)

    # ------------------------------------------------------------------ ACLs, SCRAM, quotas
    async def create_acls(self, acls: Iterable[AclEntry]) -> None:
        """Add ACL bindings (Kafka's CreateAcls); needs ALTER on the cluster. A bad
        binding raises ``InvalidRequestError`` naming what is wrong (the good ones in the
        same call are added)."""
        await self._security_admin.create_acls(acls)

    async def describe_acls(self, acl_filter: AclFilterEntry | None = None) -> list[AclEntry]:
        """The bindings ``acl_filter`` matches (default: all); needs DESCRIBE on the
        cluster."""
        return await self._security_admin.describe_acls(acl_filter)

    async def delete_acls(self, filters: Iterable[AclFilterEntry]) -> list[AclEntry]:
        """Remove every binding each filter matches; returns the removed ones."""
        return await self._security_admin.delete_acls(filters)

    async def upsert_scram_credential(self, user: str, password: str, *,
                                      mechanism: str = "SCRAM-SHA-256",
                                      iterations: int = MIN_ITERATIONS) -> None:
        """Create ``user`` (or change its password) for ``mechanism``. Only a salted
        hash leaves this process (Kafka's AlterUserScramCredentials): the password is
        never sent, and never stored."""
        await self._security_admin.upsert_scram_credential(user, password, mechanism=mechanism,
                                                           iterations=iterations)

    async def delete_scram_credential(self, user: str, mechanism: str = "SCRAM-SHA-256"
                                      ) -> None:
        """Remove ``user``'s credential for ``mechanism`` (the user goes with its last
        one); brokers close the connections that logged in with it."""
        await self._security_admin.delete_scram_credential(user, mechanism)

    async def describe_scram_credentials(self, users: Iterable[str] | None = None
                                         ) -> dict[str, dict[str, int]]:
        """``{user: {mechanism: iterations}}`` (never a key or salt); ``users`` None:
        every user. A named user without a credential raises ``ResourceNotFoundError``."""
        return await self._security_admin.describe_scram_credentials(users)

    async def describe_client_quotas(self) -> dict[tuple[str | None, str | None],
                                                   dict[str, int]]:
        """Every quota: ``(user, None)`` or ``(None, client_id)`` (``"<default>"``: the
        default) -> ``{key: limit}``; needs DESCRIBE on the cluster."""
        return await self._security_admin.describe_client_quotas()

    async def alter_client_quotas(self, *, user: str | None = None,
                                  client_id: str | None = None,
                                  set: Mapping[str, int] | None = None,
                                  remove: Iterable[str] = ()) -> None:
        """Set and/or remove quota keys (``producer_byte_rate``, ``consumer_byte_rate``,
        ``request_rate``) of one user or one client id (``"<default>"`` for the
        default); needs ALTER on the cluster."""
        await self._security_admin.alter_client_quotas(user=user, client_id=client_id, set=set,
                                                       remove=remove)

    # ------------------------------------------------------------------ tiering
    async def describe_tier(self, names: Iterable[str]) -> dict[str, TopicTier]:
        """Closed segments and Delta tier progress of every partition of ``names``.

        Each partition is asked of its leader; leader moves are retried (see the module
        docstring) until the request timeout, then the last error is raised. Raises
        ``UnknownTopicOrPartitionError`` for a topic that does not exist. Works for
        topics without ``tier.enable`` too (``TopicTier.enabled`` is then false).
        """
        return await self._tier_admin.describe_tier(names)

    async def acquire_tier_lease(self, topic: str, owner: str, ttl_ms: int) -> TierLease:
        """Take ``topic``'s tiering lease for ``ttl_ms`` (renew it well within that).

        Raises ``TierJobBusyError`` while another job holds an unexpired lease,
        ``UnknownTopicOrPartitionError``, ``InvalidRequestError`` (``ttl_ms`` outside
        1 s..10 min) or ``BrokerNotAvailableError`` (ZooKeeper unreachable: retry).
        """
        return await self._tier_admin.acquire_tier_lease(topic, owner, ttl_ms)

    async def renew_tier_lease(self, topic: str, lease_id: str, ttl_ms: int) -> None:
        """Extend the lease by ``ttl_ms`` from now; ``TierLeaseLostError`` when it is
        gone (expired and taken by another job, or the topic was deleted)."""
        await self._tier_admin.renew_tier_lease(topic, lease_id, ttl_ms)

    async def release_tier_lease(self, topic: str, lease_id: str) -> None:
        """Give the lease up (nothing happens when it is no longer this one)."""
        await self._tier_admin.release_tier_lease(topic, lease_id)

    async def update_tier(self, topic: str, lease_id: str, topic_id: str, *,
                          table: str | None = None,
                          progress: Mapping[int, tuple[int, int]] | None = None,
                          merged: Mapping[int, int] | None = None
                          ) -> dict[int, StoredTierProgress]:
        """Record a tiering job's progress under its lease, in one request.

        ``table``: the topic's Delta table; ``progress``: ``{partition: (tiered_up_to,
        tier_start)}``; ``merged``: ``{partition: merged_up_to}`` of the compacted
        table. Offsets never move back (the stored value wins over a smaller one); the
        brokers check the lease and ``topic_id`` in each write's own ZooKeeper
        transaction. Returns what is stored afterwards per partition named. Raises
        ``TierLeaseLostError``, ``UnknownTopicOrPartitionError`` (deleted or re-created),
        ``InvalidRequestError`` (before anything is written) or
        ``BrokerNotAvailableError``.
        """
        return await self._tier_admin.update_tier(topic, lease_id, topic_id, table=table,
                                                  progress=progress, merged=merged)

    # ------------------------------------------------------------------ transactions
    async def describe_transactions(self, transactional_ids: Iterable[str]
                                    ) -> dict[str, TransactionDescription]:
        """State, producer id and epoch, timeout, start and partitions of each
        transactional id, from its coordinator. Raises ``TransactionalIdNotFoundError``
        for an id with no state (never used, or expired) and
        ``TransactionalIdAuthorizationFailedError`` without DESCRIBE on it."""
        return await self._transaction_admin.describe_transactions(transactional_ids)

    async def list_transactions(self, states: Iterable[str] | None = None,
                                producer_ids: Iterable[int] | None = None,
                                duration_ms: int | None = None) -> list[TransactionListing]:
        """Every transactional id of the cluster, sorted (each live broker lists those it
        coordinates), optionally only in ``states`` (``TRANSACTION_STATES``), of
        ``producer_ids``, or open at least ``duration_ms``. Without DESCRIBE on the
        cluster, only the ids the principal may describe are listed."""
        return await self._transaction_admin.list_transactions(states, producer_ids,
                                                               duration_ms)

    async def describe_producers(self, topic: str, partition: int) -> list[ProducerState]:
        """The producers with state in one partition, from its leader, each with the
        first offset of its open transaction there (None: none); needs READ on the
        topic."""
        return await self._transaction_admin.describe_producers(topic, partition)

    async def abort_transaction(self, topic: str, partition: int, start_offset: int
                                ) -> AbortTransactionSpec:
        """End a hanging transaction in one partition: the one whose first offset there
        is ``start_offset`` (``describe_producers``, ``find_hanging``) gets an ABORT
        marker, as its coordinator would have written; the last stable offset then moves
        past it and read_committed readers skip its records. Needs CLUSTER_ACTION on the
        cluster. Raises ``InvalidTxnStateError`` (nothing written) when no open
        transaction starts there; ``InvalidProducerEpochError`` /
        ``TransactionCoordinatorFencedError`` when the producer or a coordinator moved on
        meanwhile. Only for transactions their coordinator will never end: aborting one
        it still tracks ends it in this partition alone."""
        return await self._transaction_admin.abort_transaction(topic, partition,
                                                               start_offset)

    async def find_hanging(self, topics: Iterable[str] | None = None, *,
                           partition: int | None = None,
                           max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
                           ) -> list[HangingTransaction]:
        """Open transactions no coordinator will end (Kafka's ``find-hanging``): in the
        partitions of ``topics`` (None: every topic; ``partition``: one partition of
        one topic), those whose producer wrote nothing for longer than
        ``max_transaction_timeout_ms`` (the brokers' ``transaction.max.timeout.ms``;
        a coordinator aborts any transaction it knows of by then) and that no
        coordinator lists as open with that partition. End each with
        ``abort_transaction``."""
        return await self._transaction_admin.find_hanging(
            topics, partition=partition, max_transaction_timeout_ms=max_transaction_timeout_ms)

    # ------------------------------------------------------------------ schema registry
    async def schema_request(self, request: SchemaRegistryRequest) -> RegistryAnswer:
        """Any registry operation, answered as Confluent's REST API would (the gateway's
        routes pass these through); errors are in the answer, not raised."""
        return await self._schema_admin.schema_request(request)

    async def register_schema(self, subject: str, schema: str, schema_type: str = "AVRO"
                              ) -> int:
        """Register ``schema`` under ``subject`` (a new version unless it is already
        there); its global id. ``IncompatibleSchemaError`` lists each reason."""
        return await self._schema_admin.register_schema(subject, schema, schema_type)

    async def get_schema(self, subject: str, version: int | Literal["latest"] = "latest",
                         *, include_deleted: bool = False) -> RegisteredSchema:
        return await self._schema_admin.get_schema(subject, version,
                                                   include_deleted=include_deleted)

    async def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        return await self._schema_admin.schema_by_id(schema_id)

    async def list_subjects(self, *, include_deleted: bool = False) -> list[str]:
        return await self._schema_admin.list_subjects(include_deleted=include_deleted)

    async def list_schema_versions(self, subject: str, *, include_deleted: bool = False
                                   ) -> list[int]:
        return await self._schema_admin.list_schema_versions(subject,
                                                             include_deleted=include_deleted)

    async def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Soft-delete every version (``permanent``: remove soft-deleted ones for good)."""
        return await self._schema_admin.delete_subject(subject, permanent=permanent)

    async def delete_schema_version(self, subject: str, version: int | Literal["latest"],
                                    *, permanent: bool = False) -> int:
        return await self._schema_admin.delete_schema_version(subject, version, permanent=permanent)

    async def check_schema_compatibility(
            self, subject: str, schema: str, schema_type: str = "AVRO",
            version: int | Literal["latest"] = "latest") -> list[str]:
        """Why ``schema`` could not be registered under ``subject`` (empty: it could)."""
        return await self._schema_admin.check_schema_compatibility(subject, schema, schema_type,
                                                                   version)

    async def value_subjects(self, names: Iterable[str]) -> dict[str, str | None]:
        """Each topic's value subject (a typed topic's ``value.schema.subject``; None: a
        bytes topic), from the metadata: DESCRIBE on a topic is enough to see it."""
        return await self._schema_admin.value_subjects(names)

    async def get_compatibility(self, subject: str | None = None) -> str:
        """The level that applies to ``subject`` (None: the global level)."""
        return await self._schema_admin.get_compatibility(subject)

    async def set_compatibility(self, level: str, subject: str | None = None) -> str:
        return await self._schema_admin.set_compatibility(level, subject)

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        await self._cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Admin:
    """Blocking admin client: an ``AsyncAdmin`` on a private event-loop thread. Same
    arguments and methods as ``AsyncAdmin``."""

    def __init__(self, bootstrap_servers: str | list[str], *, client_id: str = "strata-admin",
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 **security: Unpack[SecurityOptions]) -> None:
        self._admin = AsyncAdmin(bootstrap_servers, client_id=client_id,
                                 request_timeout_ms=request_timeout_ms,
                                 retry_backoff_ms=retry_backoff_ms, **security)
        self._thread = EventLoopThread("strata-admin")

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._thread.run(coroutine)

    def create_topics(self, new_topics: Iterable[NewTopic], *, validate_only: bool = False,
                      raise_errors: bool = True) -> dict[str, StrataError | None]:
        return self._run(self._admin.create_topics(
            list(new_topics), validate_only=validate_only, raise_errors=raise_errors))

    def delete_topics(self, names: Iterable[str], *, raise_errors: bool = True
                      ) -> dict[str, StrataError | None]:
        return self._run(self._admin.delete_topics(list(names), raise_errors=raise_errors))

    def list_topics(self) -> list[str]:
        return self._run(self._admin.list_topics())

    def describe_cluster(self) -> ClusterDescription:
        return self._run(self._admin.describe_cluster())

    def describe_topics(self, names: Iterable[str] | None = None, *,
                        offsets: bool = True) -> dict[str, TopicDescription]:
        return self._run(self._admin.describe_topics(None if names is None else list(names),
                                                     offsets=offsets))

    def describe_tier(self, names: Iterable[str]) -> dict[str, TopicTier]:
        return self._run(self._admin.describe_tier(list(names)))

    def acquire_tier_lease(self, topic: str, owner: str, ttl_ms: int) -> TierLease:
        return self._run(self._admin.acquire_tier_lease(topic, owner, ttl_ms))

    def create_acls(self, acls: Iterable[AclEntry]) -> None:
        self._run(self._admin.create_acls(list(acls)))

    def describe_client_quotas(self) -> dict[tuple[str | None, str | None], dict[str, int]]:
        return self._run(self._admin.describe_client_quotas())

    def alter_client_quotas(self, *, user: str | None = None, client_id: str | None = None,
                            set: Mapping[str, int] | None = None,
                            remove: Iterable[str] = ()) -> None:
        self._run(self._admin.alter_client_quotas(user=user, client_id=client_id, set=set,
                                                  remove=list(remove)))

    def describe_acls(self, acl_filter: AclFilterEntry | None = None) -> list[AclEntry]:
        return self._run(self._admin.describe_acls(acl_filter))

    def delete_acls(self, filters: Iterable[AclFilterEntry]) -> list[AclEntry]:
        return self._run(self._admin.delete_acls(list(filters)))

    def upsert_scram_credential(self, user: str, password: str, *,
                                mechanism: str = "SCRAM-SHA-256",
                                iterations: int = MIN_ITERATIONS) -> None:
        self._run(self._admin.upsert_scram_credential(user, password, mechanism=mechanism,
                                                      iterations=iterations))

    def delete_scram_credential(self, user: str, mechanism: str = "SCRAM-SHA-256") -> None:
        self._run(self._admin.delete_scram_credential(user, mechanism))

    def describe_scram_credentials(self, users: Iterable[str] | None = None
                                   ) -> dict[str, dict[str, int]]:
        return self._run(self._admin.describe_scram_credentials(
            None if users is None else list(users)))

    def renew_tier_lease(self, topic: str, lease_id: str, ttl_ms: int) -> None:
        self._run(self._admin.renew_tier_lease(topic, lease_id, ttl_ms))

    def release_tier_lease(self, topic: str, lease_id: str) -> None:
        self._run(self._admin.release_tier_lease(topic, lease_id))

    def update_tier(self, topic: str, lease_id: str, topic_id: str, *,
                    table: str | None = None,
                    progress: Mapping[int, tuple[int, int]] | None = None,
                    merged: Mapping[int, int] | None = None) -> dict[int, StoredTierProgress]:
        return self._run(self._admin.update_tier(topic, lease_id, topic_id, table=table,
                                                 progress=progress, merged=merged))

    def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, ConfigValue]]:
        return self._run(self._admin.describe_configs(list(names)))

    def alter_configs(self, name: str, set: Mapping[str, str | int] | None = None,
                      delete: Iterable[str] = (), *, validate_only: bool = False) -> None:
        self._run(self._admin.alter_configs(name, set, list(delete),
                                            validate_only=validate_only))

    def elect_preferred_leaders(
            self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, ElectionResult]:
        return self._run(self._admin.elect_preferred_leaders(
            None if partitions is None else list(partitions)))

    def alter_partition_reassignments(
            self, targets: Mapping[TopicPartition | tuple[str, int], Sequence[int]]) -> None:
        self._run(self._admin.alter_partition_reassignments(targets))

    def list_partition_reassignments(self) -> dict[TopicPartition, Reassignment]:
        return self._run(self._admin.list_partition_reassignments())

    def list_offsets(self, specs: Mapping[TopicPartition, OffsetSpec], *,
                     isolation_level: IsolationLevel = "read_uncommitted"
                     ) -> dict[TopicPartition, ListOffsetsResult]:
        return self._run(self._admin.list_offsets(specs, isolation_level=isolation_level))

    def find_coordinator(self, group_id: str) -> CoordinatorAddress:
        return self._run(self._admin.find_coordinator(group_id))

    def list_groups(self) -> list[GroupListing]:
        return self._run(self._admin.list_groups())

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        return self._run(self._admin.describe_groups(list(group_ids)))

    def describe_group(self, group_id: str) -> GroupDescription:
        return self._run(self._admin.describe_group(group_id))

    def list_group_offsets(
            self, group_id: str,
            partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        return self._run(self._admin.list_group_offsets(
            group_id, None if partitions is None else list(partitions)))

    def group_lag(self, group_id: str) -> list[PartitionLag]:
        return self._run(self._admin.group_lag(group_id))

    def reset_group_offsets(self, group_id: str, topic: str, to: ResetTarget, *,
                            partitions: Iterable[int] | None = None,
                            execute: bool = False) -> ResetPlan:
        return self._run(self._admin.reset_group_offsets(
            group_id, topic, to, partitions=None if partitions is None else list(partitions),
            execute=execute))

    def delete_groups(self, group_ids: Iterable[str], *, raise_errors: bool = True
                      ) -> dict[str, StrataError | None]:
        return self._run(self._admin.delete_groups(list(group_ids), raise_errors=raise_errors))

    def delete_group(self, group_id: str) -> None:
        self._run(self._admin.delete_group(group_id))

    def describe_transactions(self, transactional_ids: Iterable[str]
                              ) -> dict[str, TransactionDescription]:
        return self._run(self._admin.describe_transactions(list(transactional_ids)))

    def list_transactions(self, states: Iterable[str] | None = None,
                          producer_ids: Iterable[int] | None = None,
                          duration_ms: int | None = None) -> list[TransactionListing]:
        return self._run(self._admin.list_transactions(
            None if states is None else list(states),
            None if producer_ids is None else list(producer_ids), duration_ms))

    def describe_producers(self, topic: str, partition: int) -> list[ProducerState]:
        return self._run(self._admin.describe_producers(topic, partition))

    def abort_transaction(self, topic: str, partition: int, start_offset: int
                          ) -> AbortTransactionSpec:
        return self._run(self._admin.abort_transaction(topic, partition, start_offset))

    def find_hanging(self, topics: Iterable[str] | None = None, *,
                     partition: int | None = None,
                     max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
                     ) -> list[HangingTransaction]:
        return self._run(self._admin.find_hanging(
            None if topics is None else list(topics), partition=partition,
            max_transaction_timeout_ms=max_transaction_timeout_ms))

    def register_schema(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        return self._run(self._admin.register_schema(subject, schema, schema_type))

    def get_schema(self, subject: str, version: int | Literal["latest"] = "latest", *,
                   include_deleted: bool = False) -> RegisteredSchema:
        return self._run(self._admin.get_schema(subject, version,
                                                include_deleted=include_deleted))

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        return self._run(self._admin.schema_by_id(schema_id))

    def list_subjects(self, *, include_deleted: bool = False) -> list[str]:
        return self._run(self._admin.list_subjects(include_deleted=include_deleted))

    def list_schema_versions(self, subject: str, *, include_deleted: bool = False
                             ) -> list[int]:
        return self._run(self._admin.list_schema_versions(subject,
                                                          include_deleted=include_deleted))

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        return self._run(self._admin.delete_subject(subject, permanent=permanent))

    def delete_schema_version(self, subject: str, version: int | Literal["latest"], *,
                              permanent: bool = False) -> int:
        return self._run(self._admin.delete_schema_version(subject, version,
                                                           permanent=permanent))

    def check_schema_compatibility(self, subject: str, schema: str,
                                   schema_type: str = "AVRO",
                                   version: int | Literal["latest"] = "latest") -> list[str]:
        return self._run(self._admin.check_schema_compatibility(subject, schema,
                                                                schema_type, version))

    def value_subjects(self, names: Iterable[str]) -> dict[str, str | None]:
        return self._run(self._admin.value_subjects(names))

    def get_compatibility(self, subject: str | None = None) -> str:
        return self._run(self._admin.get_compatibility(subject))

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        return self._run(self._admin.set_compatibility(level, subject))

    def close(self) -> None:
        if self._thread.loop.is_closed():
            return
        try:
            self._run(self._admin.close())
        finally:
            self._thread.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
