"""Typed errors shared by the log, the broker and the clients.

Every error a user can hit has a stable numeric ``code`` (sent on the wire by the
protocol), a symbolic ``name`` and a message that says what happened *and what to
do*. Codes never change meaning once released; new errors take new codes.

The numbering follows Kafka's where an equivalent exists, so operators who know
Kafka's error table can read ours.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ResourceNotFoundError",
    "UnsupportedSaslMechanismError",
    "TopicAuthorizationFailedError",
    "SaslAuthenticationFailedError",
    "IllegalSaslStateError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "BrokerIdInUseError",
    "BrokerNotAvailableError",
    "ClusterIdMismatchError",
    "ConcurrentUpdateError",
    "ControllerMovedError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "CorruptRecordError",
    "DataDirLockedError",
    "DuplicateSequenceError",
    "FencedLeaderEpochError",
    "FencedMemberEpochError",
    "GroupIdNotFoundError",
    "GroupMaxSizeReachedError",
    "InvalidConfigError",
    "InvalidGroupIdError",
    "InvalidPartitionsError",
    "InvalidProducerEpochError",
    "InvalidRecordBatchError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidRequiredAcksError",
    "InvalidSessionTimeoutError",
    "InvalidTopicError",
    "LogClosedError",
    "LogStorageError",
    "NONE_CODE",
    "NetworkError",
    "NonEmptyGroupError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "OffsetMetadataTooLargeError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PolicyViolationError",
    "PortInUseBrokerError",
    "RecordTooLargeError",
    "RequestTimedOutError",
    "StagedDataMissingError",
    "StaleMemberEpochError",
    "StrataError",
    "TierJobBusyError",
    "TierLeaseLostError",
    "TopicAlreadyExistsError",
    "UnknownLeaderEpochError",
    "UnknownMemberIdError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicOrPartitionError",
    "UnreleasedInstanceIdError",
    "FencedInstanceIdError",
    "InvalidTxnStateError",
    "InvalidProducerIdMappingError",
    "InvalidTransactionTimeoutError",
    "ConcurrentTransactionsError",
    "TransactionCoordinatorFencedError",
    "TransactionalIdAuthorizationFailedError",
    "OperationNotAttemptedError",
    "UnstableOffsetCommitError",
    "ProducerFencedError",
    "TransactionalIdNotFoundError",
    "TransactionAbortableError",
    "UnsupportedAssignorError",
    "UnsupportedVersionError",
    "error_for_code",
    "raise_for_code",
    "FetchSessionIdNotFoundError",
    "InvalidFetchSessionEpochError",
    "InvalidSchemaError",
    "IncompatibleSchemaError",
    "SchemaNotFoundError",
    "SchemaMismatchError",
]


class StrataError(Exception):
    """Base class: ``code`` and ``name`` identify the error on the wire and in logs."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.name}] {self.message}"


class OffsetOutOfRangeError(StrataError):
    """An offset outside ``[log_start_offset, log_end_offset]`` was asked for.

    Carries the valid range so a caller can reset to one of its ends.
    """

    code = 1
    name = "OFFSET_OUT_OF_RANGE"

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        super().__init__(
            f"offset {offset} is outside the log's range [{log_start_offset}, {log_end_offset}]; "
            f"seek to an offset in that range (earliest={log_start_offset}, "
            f"latest={log_end_offset})"
        )

    @classmethod
    def from_message(cls, message: str) -> OffsetOutOfRangeError:
        """Rebuild from a wire message when the range is not known."""
        error = cls.__new__(cls)
        error.offset = error.log_start_offset = error.log_end_offset = -1
        StrataError.__init__(error, message)
        return error


class InvalidRecordBatchError(StrataError):
    """A batch offered for append or decoding is malformed; nothing was written."""

    code = 87
    name = "INVALID_RECORD"


class CorruptRecordError(InvalidRecordBatchError):
    """Bytes fail their checksum or framing: damaged in transit or on disk.

    For stored data it names the segment file and byte position so an operator can
    inspect it or restore the replica; for a produced batch nothing was written.
    """

    code = 2
    name = "CORRUPT_MESSAGE"

    def __init__(self, message: str, *, segment: str | None = None, position: int | None = None,
                 offset: int | None = None) -> None:
        self.segment = segment
        self.position = position
        self.offset = offset
        where = ""
        if segment is not None:
            where = f" in segment {segment} at byte {position}"
            if offset is not None:
                where += f" (batch base offset {offset})"
        if segment is not None:
            message = (f"{message}{where}; the stored data is damaged: restore this partition "
                       "from a replica or truncate the log at that position")
        super().__init__(message)


class RecordTooLargeError(StrataError):
    """A batch is larger than the configured ``max.message.bytes``; nothing was written."""

    code = 10
    name = "MESSAGE_TOO_LARGE"


class InvalidConfigError(StrataError):
    """A configuration key is unknown or its value is out of range."""

    code = 40
    name = "INVALID_CONFIG"


class LogStorageError(StrataError):
    """The disk failed under the log (write or fsync error); the log refuses further writes."""

    code = 56
    name = "STORAGE_ERROR"


class LogClosedError(StrataError):
    """The log was closed (shutdown or deletion) while an operation was pending."""

    code = 57
    name = "LOG_CLOSED"
    retriable = True  # the partition is being shut down or moved: retry after metadata


class UnknownTopicOrPartitionError(StrataError):
    """The topic or partition does not exist on this cluster; create it or check the name."""

    code = 3
    name = "UNKNOWN_TOPIC_OR_PARTITION"
    retriable = True


class NotLeaderError(StrataError):
    """This broker does not lead the partition; refresh metadata and retry on the leader."""

    code = 6
    name = "NOT_LEADER_OR_FOLLOWER"
    retriable = True


class RequestTimedOutError(StrataError):
    """The request did not complete within its timeout; retry, or raise the timeout."""

    code = 7
    name = "REQUEST_TIMED_OUT"
    retriable = True


class BrokerNotAvailableError(StrataError):
    """The broker is not available (starting, stopping or unreachable); retry later."""

    code = 8
    name = "BROKER_NOT_AVAILABLE"
    retriable = True


class NetworkError(StrataError):
    """The connection to the broker failed; the client reconnects and retries."""

    code = 13
    name = "NETWORK_EXCEPTION"
    retriable = True


class InvalidTopicError(StrataError):
    """The topic name is not valid: use 1-249 characters from [a-zA-Z0-9._-]."""

    code = 17
    name = "INVALID_TOPIC_EXCEPTION"


class NotEnoughReplicasError(StrataError):
    """Fewer in-sync replicas than min.insync.replicas; retry when replicas catch up."""

    code = 19
    name = "NOT_ENOUGH_REPLICAS"
    retriable = True


class NotEnoughReplicasAfterAppendError(StrataError):
    """The write was appended, but the in-sync replica set shrank below min.insync.replicas
    before it was acknowledged; retry (an idempotent producer's retry is deduplicated,
    a non-idempotent one writes the record again)."""

    code = 20
    name = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    retriable = True


class InvalidRequiredAcksError(StrataError):
    """acks must be 0, 1 or -1 (all)."""

    code = 21
    name = "INVALID_REQUIRED_ACKS"


class UnsupportedVersionError(StrataError):
    """The broker does not support this API or version; call ApiVersions and downgrade."""

    code = 35
    name = "UNSUPPORTED_VERSION"


class TopicAlreadyExistsError(StrataError):
    """A topic with this name exists; pick another name or delete it first."""

    code = 36
    name = "TOPIC_ALREADY_EXISTS"


class InvalidPartitionsError(StrataError):
    """The partition count is not valid: use 1 or more."""

    code = 37
    name = "INVALID_PARTITIONS"


class InvalidReplicationFactorError(StrataError):
    """The replication factor must be between 1 and the number of live brokers."""

    code = 38
    name = "INVALID_REPLICATION_FACTOR"


class InvalidRequestError(StrataError):
    """The request is malformed; check the client against docs/protocol.md."""

    code = 42
    name = "INVALID_REQUEST"


class PolicyViolationError(StrataError):
    """The request breaks a cluster policy; see the message for which one."""

    code = 44
    name = "POLICY_VIOLATION"


class OutOfOrderSequenceError(StrataError):
    """The broker received a sequence number with a gap; the producer must reset its state."""

    code = 45
    name = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class DuplicateSequenceError(StrataError):
    """Not sent by this broker: a duplicate batch is answered with error 0 and the
    offset it was first written at."""

    code = 46
    name = "DUPLICATE_SEQUENCE_NUMBER"


class InvalidProducerEpochError(StrataError):
    """A newer producer with the same id fenced this one; stop using it."""

    code = 47
    name = "INVALID_PRODUCER_EPOCH"


class InvalidTxnStateError(StrataError):
    """The request does not fit the transaction's state (e.g. a commit with nothing
    open, a non-transactional write inside a transaction): the producer's view of its
    transaction is wrong. Fatal for the producer: close it and start a new one."""

    code = 48
    name = "INVALID_TXN_STATE"


class InvalidProducerIdMappingError(StrataError):
    """The producer id does not hold this transactional id (it expired, or another
    producer id took it over): call ``init_transactions()`` again."""

    code = 49
    name = "INVALID_PRODUCER_ID_MAPPING"


class InvalidTransactionTimeoutError(StrataError):
    """``transaction_timeout_ms`` is outside 1 .. the broker's
    ``transaction.max.timeout.ms``: choose a smaller timeout."""

    code = 50
    name = "INVALID_TRANSACTION_TIMEOUT"


class ConcurrentTransactionsError(StrataError):
    """The transactional id is between two states (a transaction completing, an abort
    in progress): retry after a short back-off (the client does)."""

    code = 51
    name = "CONCURRENT_TRANSACTIONS"
    retriable = True


class TransactionCoordinatorFencedError(StrataError):
    """A transaction marker came from a coordinator older than one this partition has
    already heard from: a newer coordinator owns the transaction; nothing was written."""

    code = 52
    name = "TRANSACTION_COORDINATOR_FENCED"


class TransactionalIdAuthorizationFailedError(StrataError):
    """The principal may not use this transactional id: grant WRITE (and DESCRIBE) on
    the TRANSACTIONAL_ID resource (`strata acl add --transactional-id ...`)."""

    code = 53
    name = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class OperationNotAttemptedError(StrataError):
    """Not done because another part of the same request failed (see its error); fix
    that and send the request again."""

    code = 55
    name = "OPERATION_NOT_ATTEMPTED"


class UnstableOffsetCommitError(StrataError):
    """A transaction that commits offsets for this partition is still open: the
    committed offset is not decided yet; retry shortly."""

    code = 88
    name = "UNSTABLE_OFFSET_COMMIT"
    retriable = True


class ProducerFencedError(StrataError):
    """A newer producer with the same transactional id took over (or the coordinator
    aborted this producer's transaction after its timeout and bumped its epoch): this
    producer is a zombie. Fatal: close it."""

    code = 90
    name = "PRODUCER_FENCED"


class TransactionalIdNotFoundError(StrataError):
    """No transaction state exists for this transactional id (never used, or expired
    after ``transactional.id.expiration.ms``)."""

    code = 105
    name = "TRANSACTIONAL_ID_NOT_FOUND"


class TransactionAbortableError(StrataError):
    """The transaction cannot go on (e.g. a write to a partition that was not added to
    it, or a timed-out request inside it): abort it and run it again; the producer
    stays usable."""

    code = 120
    name = "TRANSACTION_ABORTABLE"


class UnknownProducerIdError(StrataError):
    """The broker has no state for this producer id; call InitProducerId again."""

    code = 59
    name = "UNKNOWN_PRODUCER_ID"


class FencedLeaderEpochError(StrataError):
    """The leader epoch in the request is older than the broker's; refresh metadata."""

    code = 74
    name = "FENCED_LEADER_EPOCH"
    retriable = True


class UnknownLeaderEpochError(StrataError):
    """The leader epoch in the request is newer than the broker's; retry shortly."""

    code = 75
    name = "UNKNOWN_LEADER_EPOCH"
    retriable = True


class UnknownServerError(StrataError):
    """The broker failed unexpectedly; see its log."""

    code = -1
    name = "UNKNOWN_SERVER_ERROR"


# Codes 1100+: broker start-up and coordination errors. Only CONCURRENT_UPDATE can reach
# a client (from CreateTopics or AlterConfigs); the others stop a broker at start-up,
# except TIER_JOB_BUSY, which coordination.py raises to a tiering job.


class BrokerIdInUseError(StrataError):
    """Another live broker is registered with this id."""

    code = 1102
    name = "BROKER_ID_IN_USE"

class ConcurrentUpdateError(StrataError):
    """A conditional ZooKeeper write lost a race; re-read the state and decide again."""

    code = 1103
    name = "CONCURRENT_UPDATE"
    retriable = True

class ControllerMovedError(StrataError):
    """Another broker became controller since this lease was won; stop acting as one."""

    code = 1106
    name = "CONTROLLER_MOVED"

class DataDirLockedError(StrataError):
    """Another process holds the data directory."""

    code = 1101
    name = "DATA_DIR_LOCKED"

class ClusterIdMismatchError(StrataError):
    """The data dir was written for another cluster or broker id."""

    code = 1104
    name = "CLUSTER_ID_MISMATCH"

class PortInUseBrokerError(StrataError):
    """The broker's listen or metrics port is taken."""

    code = 1105
    name = "PORT_IN_USE"


class StagedDataMissingError(StrataError):
    """A sink commit named staged records the partition leader does not hold (exactly)."""

    code = 1107
    name = "STAGED_DATA_MISSING"


class TopicAuthorizationFailedError(StrataError):
    """The principal may not do this to the topic (an ACL is missing or denies it)."""

    code = 29
    name = "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(StrataError):
    """The principal may not do this to the consumer group (ACLs)."""

    code = 30
    name = "GROUP_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(StrataError):
    """The principal may not do this to the cluster (ACLs on CLUSTER)."""

    code = 31
    name = "CLUSTER_AUTHORIZATION_FAILED"


class UnsupportedSaslMechanismError(StrataError):
    """The broker's listener does not offer the SASL mechanism the client asked for."""

    code = 33
    name = "UNSUPPORTED_SASL_MECHANISM"


class IllegalSaslStateError(StrataError):
    """A request arrived out of order in the SASL exchange (or before it finished)."""

    code = 34
    name = "ILLEGAL_SASL_STATE"


class SaslAuthenticationFailedError(StrataError):
    """Wrong user name or password (or a malformed SASL message): not authenticated."""

    code = 58
    name = "SASL_AUTHENTICATION_FAILED"


class ResourceNotFoundError(StrataError):
    """The named resource (a user's SCRAM credential, an ACL, a quota) does not exist."""

    code = 91
    name = "RESOURCE_NOT_FOUND"


class TierJobBusyError(StrataError):
    """Another tiering job holds the topic's lease (TierLease): two jobs copying one
    topic would race for the same offset ranges in its Delta table."""

    code = 1108
    name = "TIER_JOB_BUSY"
    retriable = True


class TierLeaseLostError(StrataError):
    """The job's lease on a topic lapsed mid-pass, or another writer got ahead of it.

    Nothing more is written in the pass; the next one plans again from the table's
    ``txnVersion`` and the recorded progress, so no record is written twice.
    """

    code = 1404
    name = "TIER_LEASE_LOST"


class InvalidSchemaError(StrataError):
    """A schema text the registry cannot accept: not valid Avro or JSON Schema, a type
    with no Arrow mapping (docs/typed-topics.md), or over a limit (nesting depth, size,
    a recursive type). Nothing was registered. Confluent's 42201."""

    code = 1500
    name = "INVALID_SCHEMA"


class IncompatibleSchemaError(StrataError):
    """A new version breaks the subject's compatibility setting; the message gives each
    reason. Nothing was registered. Confluent's 409."""

    code = 1501
    name = "INCOMPATIBLE_SCHEMA"


class SchemaNotFoundError(StrataError):
    """No such subject, version or schema id (or it was deleted). Confluent's 40401,
    40402 and 40403: the message says which."""

    code = 1502
    name = "SCHEMA_NOT_FOUND"


class SchemaMismatchError(InvalidRecordBatchError):
    """Records offered to a typed topic do not match a registered version of its value
    subject; the message names the field. Nothing of the batch was written."""

    code = 1503
    name = "SCHEMA_MISMATCH"

    #: Which record (its index in what was converted; None: not one record's fault) and
    #: which field (dotted path) did not match, when the error is about data.
    record: int | None = None
    field: str | None = None


class OffsetMetadataTooLargeError(StrataError):
    """An OffsetCommit carried metadata longer than ``offset.metadata.max.bytes``."""

    code = 12
    name = "OFFSET_METADATA_TOO_LARGE"


class CoordinatorLoadInProgressError(StrataError):
    """The group's coordinator is still loading its state from ``__consumer_offsets``."""

    code = 14
    name = "COORDINATOR_LOAD_IN_PROGRESS"
    retriable = True


class CoordinatorNotAvailableError(StrataError):
    """No broker coordinates the group right now (its ``__consumer_offsets`` partition has
    no live leader, or the topic is being created)."""

    code = 15
    name = "COORDINATOR_NOT_AVAILABLE"
    retriable = True


class NotCoordinatorError(StrataError):
    """This broker does not coordinate the group: find the coordinator again."""

    code = 16
    name = "NOT_COORDINATOR"
    retriable = True


class InvalidGroupIdError(StrataError):
    """The group id is empty or too long."""

    code = 24
    name = "INVALID_GROUP_ID"


class UnknownMemberIdError(StrataError):
    """The member is not in the group (its session expired, it left, or a static member
    with the same instance id replaced it): its partitions are gone; rejoin."""

    code = 25
    name = "UNKNOWN_MEMBER_ID"


class InvalidSessionTimeoutError(StrataError):
    """The session timeout asked for is outside the broker's allowed range."""

    code = 26
    name = "INVALID_SESSION_TIMEOUT"


class NonEmptyGroupError(StrataError):
    """The group still has members; stop its consumers first."""

    code = 68
    name = "NON_EMPTY_GROUP"


class GroupIdNotFoundError(StrataError):
    """No such group: no members and no committed offsets."""

    code = 69
    name = "GROUP_ID_NOT_FOUND"


class FetchSessionIdNotFoundError(StrataError):
    """The fetch session is unknown here (the broker restarted, or the session was
    replaced): fetch again with a full request (session epoch 0)."""

    code = 70
    name = "FETCH_SESSION_ID_NOT_FOUND"
    retriable = True


class InvalidFetchSessionEpochError(StrataError):
    """The fetch session epoch is not the one expected (a request was lost or repeated):
    fetch again with a full request (session epoch 0)."""

    code = 71
    name = "INVALID_FETCH_SESSION_EPOCH"
    retriable = True


class GroupMaxSizeReachedError(StrataError):
    """The group already has ``group.max.size`` members."""

    code = 81
    name = "GROUP_MAX_SIZE_REACHED"


class FencedMemberEpochError(StrataError):
    """The member epoch is not one the coordinator gave this member: it was fenced and
    must rejoin (its partitions are gone)."""

    code = 110
    name = "FENCED_MEMBER_EPOCH"


class UnsupportedAssignorError(StrataError):
    """The assignor named is not one the broker has (range, cooperative-sticky)."""

    code = 112
    name = "UNSUPPORTED_ASSIGNOR"


class StaleMemberEpochError(StrataError):
    """The member committed a partition that is not assigned to it now (it moved):
    the commit is refused; heartbeat to learn the current assignment."""

    code = 113
    name = "STALE_MEMBER_EPOCH"
    retriable = True


class FencedInstanceIdError(StrataError):
    """Another consumer with this member's ``group_instance_id`` took its place: two
    processes share one instance id (or this one is a zombie of a restarted process).
    Fatal for this consumer: close it; give each process its own instance id."""

    code = 82
    name = "FENCED_INSTANCE_ID"


class UnreleasedInstanceIdError(StrataError):
    """A static member joined with a ``group.instance.id`` whose current holder is still
    heartbeating: two live processes share one instance id."""

    code = 111
    name = "UNRELEASED_INSTANCE_ID"
    retriable = True


_BY_CODE: dict[int, type[StrataError]] = {
    cls.code: cls
    for cls in (
        UnknownServerError,
        ConcurrentUpdateError,  # can reach the wire from CreateTopics
        StagedDataMissingError,
        UnknownTopicOrPartitionError,
        NotLeaderError,
        RequestTimedOutError,
        BrokerNotAvailableError,
        NetworkError,
        InvalidTopicError,
        NotEnoughReplicasError,
        NotEnoughReplicasAfterAppendError,
        InvalidRequiredAcksError,
        UnsupportedVersionError,
        TopicAlreadyExistsError,
        InvalidPartitionsError,
        InvalidReplicationFactorError,
        InvalidRequestError,
        PolicyViolationError,
        OutOfOrderSequenceError,
        DuplicateSequenceError,
        InvalidProducerEpochError,
        UnknownProducerIdError,
        FencedLeaderEpochError,
        UnknownLeaderEpochError,
        OffsetOutOfRangeError,
        CorruptRecordError,
        InvalidRecordBatchError,
        RecordTooLargeError,
        InvalidConfigError,
        LogStorageError,
        LogClosedError,
        OffsetMetadataTooLargeError,
        CoordinatorLoadInProgressError,
        CoordinatorNotAvailableError,
        NotCoordinatorError,
        InvalidGroupIdError,
        UnknownMemberIdError,
        InvalidSessionTimeoutError,
        NonEmptyGroupError,
        GroupIdNotFoundError,
        GroupMaxSizeReachedError,
        FetchSessionIdNotFoundError,
        InvalidFetchSessionEpochError,
        FencedMemberEpochError,
        UnsupportedAssignorError,
        StaleMemberEpochError,
        UnreleasedInstanceIdError,
        FencedInstanceIdError,
        InvalidTxnStateError,
        InvalidProducerIdMappingError,
        InvalidTransactionTimeoutError,
        ConcurrentTransactionsError,
        TransactionCoordinatorFencedError,
        TransactionalIdAuthorizationFailedError,
        OperationNotAttemptedError,
        UnstableOffsetCommitError,
        ProducerFencedError,
        TransactionalIdNotFoundError,
        TransactionAbortableError,
        TierJobBusyError,
        TierLeaseLostError,
        TopicAuthorizationFailedError,
        GroupAuthorizationFailedError,
        ClusterAuthorizationFailedError,
        UnsupportedSaslMechanismError,
        IllegalSaslStateError,
        SaslAuthenticationFailedError,
        ResourceNotFoundError,
        InvalidSchemaError,
        IncompatibleSchemaError,
        SchemaNotFoundError,
        SchemaMismatchError,
    )
}


NONE_CODE = 0


def error_for_code(code: int) -> type[StrataError]:
    """The error class for a wire code (``UnknownServerError`` for codes this build lacks)."""
    return _BY_CODE.get(code, UnknownServerError)


def raise_for_code(code: int, message: str | None) -> None:
    """Raise the error a response's ``error_code`` stands for (0: no error)."""
    if code == NONE_CODE:
        return
    cls = error_for_code(code)
    text = message or (cls.__doc__ or "").strip() or f"error code {code}"
    if cls is OffsetOutOfRangeError:
        raise OffsetOutOfRangeError.from_message(text)
    raise cls(text)
