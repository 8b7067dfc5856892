"""The clients' settings: one options type per client, shared by both of its faces.

Job: turn what a caller passes (keyword options, ``ProducerOptions`` / ``ConsumerOptions``)
into one validated, immutable settings object (``ProducerConfig`` / ``ConsumerConfig``)
that the blocking and the asyncio face both build the same way (``config_of``), or take
ready-made as their first argument. Nothing here does I/O.

Invariants:

- A config that exists was validated: its ``__post_init__`` (and, for the producer,
  ``from_options``) raises ``ValueError`` naming the option and what to use instead, so
  a bad value never reaches a connection.
- Defaults follow Kafka's clients where Kafka has the knob (``docs/client.md`` lists them).
- The bootstrap servers are ``bootstrap_servers`` on every client; they are parsed (and a
  malformed one reported) when the client builds its ``Cluster``, as before.

Thread-safety: configs are frozen dataclasses, shared freely between threads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, TypedDict, TypeVar

from wire.errors import InvalidRecordBatchError
from wire.record_batch import Compression
from wire.security import PLAINTEXT, SECURITY_OPTIONS, ClientSecurity

__all__ = [
    "ASSIGNORS",
    "ConsumerConfig",
    "ConsumerOptions",
    "OffsetResetStrategy",
    "ProducerConfig",
    "ProducerOptions",
    "SecurityOptions",
    "config_of",
    "security_of",
]

#: Ceiling of the producer's exponential retry backoff (Kafka's ``retry.backoff.max.ms``).
RETRY_BACKOFF_MAX_MS: Final = 1000
_INT32_MAX: Final = 2**31 - 1
_ACKS_ALL: Final = -1

#: The assignors the group coordinator runs: "range" is eager (every member gives up
#: everything on a change), "cooperative-sticky" moves only the partitions that must move.
ASSIGNORS: Final = ("cooperative-sticky", "range")

OffsetResetStrategy: TypeAlias = Literal["earliest", "latest", "none"]
_RESET_STRATEGIES: Final = ("earliest", "latest", "none")


# --------------------------------------------------------------------------- security


class SecurityOptions(TypedDict, total=False):
    """How every client secures its connections (``wire.security.ClientSecurity``):
    either ``security`` (a ``ClientSecurity``) or kafka-python's option names."""

    security: ClientSecurity
    security_protocol: str
    sasl_mechanism: str
    sasl_plain_username: str
    sasl_plain_password: str
    ssl_cafile: str
    ssl_certfile: str
    ssl_keyfile: str
    ssl_check_hostname: bool


def security_of(options: Mapping[str, Any]) -> tuple[ClientSecurity, dict[str, Any]]:
    """The ``ClientSecurity`` the options describe, and the other options."""
    rest = {k: v for k, v in options.items()
            if k not in SECURITY_OPTIONS and k != "security"}
    named = {k: v for k, v in options.items() if k in SECURITY_OPTIONS}
    given = options.get("security")
    if given is not None:
        if named:
            raise ValueError(f"pass either security= or {sorted(named)}, not both")
        if not isinstance(given, ClientSecurity):
            raise ValueError(f"security={given!r} is not a wire.security.ClientSecurity")
        return given, rest
    return ClientSecurity.from_options(named), rest


# --------------------------------------------------------------------------- producer


class ProducerOptions(SecurityOptions, total=False):
    """Keyword options shared by ``Producer`` and ``AsyncProducer`` (see ``ProducerConfig``)."""

    acks: int | str
    batch_size: int
    linger_ms: float
    compression: str | None
    enable_idempotence: bool | None
    max_in_flight: int
    buffer_memory: int
    on_buffer_full: Literal["block", "raise"]
    max_block_ms: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    retries: int
    retry_backoff_ms: int
    client_id: str
    transactional_id: str | None
    transaction_timeout_ms: int


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Validated producer settings; defaults follow Kafka's producer where one exists.

    Built from keyword options by ``from_options`` (what ``Producer(bootstrap_servers,
    **options)`` does), or constructed directly with resolved values (``acks`` as an int,
    ``compression`` a ``Compression``, ``idempotent`` a bool) and passed to either face.

    - ``acks``: 0 (fire and forget), 1 (leader wrote it), ``"all"``/-1 (every in-sync
      replica has it; the default).
    - ``batch_size``: bytes per batch (estimate in ``strata.client.producer``'s docstring),
      default 128 KiB. Larger than Kafka's 16 KiB because a Python producer pays a fixed
      cost per batch.
    - ``linger_ms``: how long a batch waits for more records after its first (default 5).
    - ``compression``: ``"none"`` (default), ``"lz4"`` or ``"zstd"`` (Arrow IPC buffer
      compression; the broker stores the batch as is).
    - ``enable_idempotence``: ``None`` = on unless acks is 0/1 or ``retries`` is 0.
    - ``max_in_flight``: produce requests outstanding per broker (default 5); per
      partition it is always one batch.
    - ``buffer_memory``: bytes of unacknowledged records (default 32 MiB);
      ``on_buffer_full``: ``"block"`` (default, up to ``max_block_ms``) or ``"raise"``.
    - ``max_block_ms``: longest ``send`` blocks for buffer space or metadata (60 s).
    - ``request_timeout_ms``: wait for one produce response (30 s); also the broker's
      replication wait.
    - ``delivery_timeout_ms``: give up on a batch this long after it was created (120 s).
    - ``retries``: resend attempts per batch (default unbounded; the delivery timeout
      bounds them). ``retry_backoff_ms``: first backoff (100 ms), doubling up to 1 s.
    - ``transactional_id``: makes the producer transactional (docs/transactions.md):
      ``init_transactions()`` once, then each ``begin_transaction()`` ...
      ``commit_transaction()`` writes atomically across partitions. Implies idempotence
      and ``acks='all'`` (contradicting settings are refused). One live producer per id:
      a new one fences the old. ``transaction_timeout_ms`` (default 60,000): the
      coordinator aborts a transaction left open longer (within the broker's
      ``transaction.max.timeout.ms``).
    """

    bootstrap_servers: str | list[str]
    acks: int = _ACKS_ALL
    batch_size: int = 128 * 1024
    linger_ms: float = 5.0
    compression: Compression = Compression.NONE
    idempotent: bool = True
    max_in_flight: int = 5
    buffer_memory: int = 32 * 1024 * 1024
    on_buffer_full: Literal["block", "raise"] = "block"
    max_block_ms: int = 60_000
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    retries: int = _INT32_MAX
    retry_backoff_ms: int = 100
    client_id: str = "strata-producer"
    security: ClientSecurity = PLAINTEXT
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.transactional_id is not None:
            if not isinstance(self.transactional_id, str) or not self.transactional_id.strip():
                raise ValueError(f"transactional_id={self.transactional_id!r} is not valid; "
                                 "give a non-empty name, one per live producer")
            if not self.idempotent or self.acks != _ACKS_ALL:
                raise ValueError(
                    "a transactional producer is idempotent with acks='all': drop "
                    "enable_idempotence=False / acks=0|1, or drop transactional_id")
            if isinstance(self.transaction_timeout_ms, bool) or \
                    not isinstance(self.transaction_timeout_ms, int) or \
                    self.transaction_timeout_ms < 1:
                raise ValueError(f"transaction_timeout_ms={self.transaction_timeout_ms!r} is "
                                 "not valid; use ms >= 1 (at most the broker's "
                                 "transaction.max.timeout.ms)")
        if isinstance(self.acks, bool) or self.acks not in (_ACKS_ALL, 0, 1):
            raise ValueError(f"acks={self.acks!r} is not valid; a ProducerConfig holds 0, 1 "
                             "or -1 (all); from_options also takes 'all'")
        if not isinstance(self.compression, Compression):
            raise ValueError(f"compression={self.compression!r} is not valid; a "
                             "ProducerConfig holds a wire.record_batch.Compression; "
                             "from_options takes 'none', 'lz4' or 'zstd'")
        if self.idempotent:
            _check_idempotence(self.acks, self.retries)
        if self.on_buffer_full not in ("block", "raise"):
            raise ValueError(f"on_buffer_full={self.on_buffer_full!r}: use 'block' or 'raise'")
        for name, minimum in (("batch_size", 1), ("max_in_flight", 1), ("buffer_memory", 1),
                              ("request_timeout_ms", 1), ("delivery_timeout_ms", 1),
                              ("linger_ms", 0), ("max_block_ms", 0), ("retries", 0),
                              ("retry_backoff_ms", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
                raise ValueError(f"{name}={value!r} is not valid; use a number >= {minimum}")

    @classmethod
    def from_options(cls, bootstrap_servers: str | list[str],
                     options: ProducerOptions) -> ProducerConfig:
        """Check every option and resolve idempotence; a ``ValueError`` says what is wrong."""
        known = set(ProducerOptions.__annotations__) | set(SecurityOptions.__annotations__)
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown producer option(s) {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        security, options = security_of(options)  # type: ignore[assignment]
        acks = _parse_acks(options.get("acks", "all"))
        retries = options.get("retries", _INT32_MAX)
        explicit = options.get("enable_idempotence")
        if options.get("transactional_id") is not None:
            if explicit is False or acks != _ACKS_ALL:
                raise ValueError(
                    "a transactional producer is idempotent with acks='all': drop "
                    "enable_idempotence=False / acks=0|1, or drop transactional_id")
            explicit = True
        if explicit is True:
            _check_idempotence(acks, retries)
        idempotent = acks == _ACKS_ALL and retries > 0 if explicit is None else explicit
        compression_name = options.get("compression")
        try:
            compression = Compression.parse(compression_name)
        except InvalidRecordBatchError:
            raise ValueError(f"compression={compression_name!r} is not supported; use "
                             "'none', 'lz4' or 'zstd'") from None
        plain: dict[str, Any] = {
            name: value for name, value in options.items()
            if name not in ("acks", "compression", "enable_idempotence", "retries")}
        return cls(bootstrap_servers=bootstrap_servers, acks=acks, compression=compression,
                   idempotent=idempotent, retries=retries, security=security, **plain)

    def backoff_s(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (1, 2, ...): ``retry_backoff_ms``
        doubling per attempt up to ``RETRY_BACKOFF_MAX_MS`` (or ``retry_backoff_ms`` if
        larger), times a random factor in [0.8, 1.0]."""
        base: float = self.retry_backoff_ms * (2 ** min(max(attempt - 1, 0), 10))
        ceiling = max(RETRY_BACKOFF_MAX_MS, self.retry_backoff_ms)
        return min(base, ceiling) / 1000 * random.uniform(0.8, 1.0)


def _parse_acks(acks: int | str) -> int:
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return _ACKS_ALL
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"acks={acks!r} is not valid; use 0, 1 or 'all' (-1)")


def _check_idempotence(acks: int, retries: int) -> None:
    """``ValueError`` unless idempotence can work with ``acks`` and ``retries``."""
    if acks != _ACKS_ALL:
        raise ValueError(
            f"enable_idempotence=True requires acks='all' (got acks={acks}): the "
            "broker can only deduplicate retries of writes every in-sync replica has; "
            "use acks='all' or enable_idempotence=False")
    if retries == 0:
        raise ValueError("enable_idempotence=True requires retries > 0")


# --------------------------------------------------------------------------- consumer


class ConsumerOptions(SecurityOptions, total=False):
    """Keyword options shared by ``Consumer`` and ``AsyncConsumer`` (see ``ConsumerConfig``)."""

    client_id: str
    auto_offset_reset: OffsetResetStrategy
    fetch_min_bytes: int
    fetch_max_wait_ms: int
    max_partition_fetch_bytes: int
    fetch_max_bytes: int
    max_poll_records: int
    request_timeout_ms: int
    retry_backoff_ms: int
    group_id: str | None
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    max_poll_interval_ms: int
    assignor: str
    enable_auto_commit: bool
    auto_commit_interval_ms: int
    value_format: ValueFormat
    value_schema_version: int | str
    isolation_level: IsolationLevel


#: ``read_uncommitted`` (Kafka's default) or ``read_committed`` (docs/transactions.md).
IsolationLevel: TypeAlias = Literal["read_uncommitted", "read_committed"]
_ISOLATION_LEVELS: Final = ("read_uncommitted", "read_committed")

#: How a typed topic's values reach the caller (docs/typed-topics.md).
ValueFormat: TypeAlias = Literal["arrow", "json", "confluent"]
_VALUE_FORMATS: Final = ("arrow", "json", "confluent")


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """Validated consumer settings (Kafka's names where Kafka has the knob).

    ``bootstrap_servers``: ``"host:port[,host:port]"`` or a list of them.
    ``auto_offset_reset``: where to start when a partition has no position yet or its
    position is out of range: ``"earliest"``, ``"latest"`` (default, as in Kafka) or
    ``"none"`` (raise ``OffsetOutOfRangeError`` with the valid range).
    ``fetch_min_bytes`` / ``fetch_max_wait_ms``: the broker holds a fetch until this many
    bytes are available or this long has passed (long poll; it wakes as soon as data
    arrives). ``max_partition_fetch_bytes`` / ``fetch_max_bytes``: per-partition and
    per-request response size limits (the broker always returns at least one whole
    batch, so an oversized batch cannot stall the consumer). ``max_poll_records``: the
    default ``max_records`` of ``poll``. ``request_timeout_ms``: how long a request may
    go unanswered (a fetch gets ``fetch_max_wait_ms`` on top). ``retry_backoff_ms``:
    pause before retrying a partition after a transient error.

    Groups (``subscribe``; see ``docs/consumer-groups.md``): ``group_id`` names the
    group; ``group_instance_id`` makes the member static (a restart within the session
    timeout keeps its partitions, no rebalance); ``session_timeout_ms`` (-1: the
    broker's ``group.session.timeout.ms``) is how long the coordinator waits for a
    heartbeat before it gives the member's partitions away; ``rebalance_timeout_ms``
    bounds how long ``on_revoke`` may take; ``max_poll_interval_ms`` (default 300,000,
    as Kafka's ``max.poll.interval.ms``, KIP-62) is how long the application may go
    without calling ``poll``: heartbeats run in the background, so a member whose
    processing is stuck would otherwise keep its partitions for ever; past it the member
    leaves the group (a warning names the setting), its partitions go to the others,
    and its next ``poll`` runs ``on_lost`` and rejoins. ``assignor``:
    ``"cooperative-sticky"`` (default: only moving partitions are revoked) or
    ``"range"`` (eager).
    ``enable_auto_commit`` (default on, with a ``group_id``) commits, every
    ``auto_commit_interval_ms`` inside ``poll`` and before partitions are revoked or the
    consumer closes, the positions of the records ``poll`` has returned: processing a
    poll's records must be finished before the next ``poll``.

    Typed topics (docs/typed-topics.md): ``value_format`` ``"arrow"`` (default) gives
    the value as the schema's struct (dicts per record, a struct column in
    ``poll_arrow``); ``"json"`` as one JSON document per record and ``"confluent"`` as
    Confluent's wire format (magic byte 0, the 4-byte schema id, the Avro body), both
    bytes, for Kafka-style tools downstream. Every value is read under one reader
    schema per topic: ``value_schema_version`` of the topic's subject (``"latest"``,
    the default: the latest version when the consumer first meets the topic).

    Transactions (docs/transactions.md): ``isolation_level`` ``"read_uncommitted"``
    (default, as Kafka: every record, aborted ones included, up to the high watermark)
    or ``"read_committed"`` (only committed transactions' records, and none past the
    first offset of a transaction still open; markers and aborted batches are skipped
    batch by batch).
    """

    bootstrap_servers: str | list[str]
    client_id: str = "strata-consumer"
    auto_offset_reset: OffsetResetStrategy = "latest"
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    max_partition_fetch_bytes: int = 1 << 20
    fetch_max_bytes: int = 50 << 20
    max_poll_records: int = 500
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    group_id: str | None = None
    group_instance_id: str | None = None
    session_timeout_ms: int = -1
    rebalance_timeout_ms: int = 60_000
    max_poll_interval_ms: int = 300_000
    assignor: str = "cooperative-sticky"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    value_format: ValueFormat = "arrow"
    value_schema_version: int | str = "latest"
    security: ClientSecurity = PLAINTEXT
    isolation_level: IsolationLevel = "read_uncommitted"

    def __post_init__(self) -> None:
        """``ValueError`` naming the option, before anything is sent."""
        _check_group_options(self)
        if self.isolation_level not in _ISOLATION_LEVELS:
            raise ValueError(f"isolation_level={self.isolation_level!r} is not valid; use "
                             "'read_uncommitted' or 'read_committed'")
        if self.value_format not in _VALUE_FORMATS:
            raise ValueError(f"value_format={self.value_format!r} is not valid; use one of "
                             f"{', '.join(_VALUE_FORMATS)}")
        version = self.value_schema_version
        if version != "latest" and not (isinstance(version, int) and version >= 1):
            raise ValueError(f"value_schema_version={version!r} is not valid; use 'latest' "
                             "or a version number >= 1")
        if self.auto_offset_reset not in _RESET_STRATEGIES:
            raise ValueError(f"auto_offset_reset={self.auto_offset_reset!r} is not valid; use "
                             f"one of {', '.join(_RESET_STRATEGIES)}")
        for name, low in (("fetch_min_bytes", 0), ("fetch_max_wait_ms", 0),
                          ("max_partition_fetch_bytes", 1), ("fetch_max_bytes", 1),
                          ("max_poll_records", 1), ("request_timeout_ms", 1),
                          ("retry_backoff_ms", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is not valid; use an integer >= {low}")

    @classmethod
    def from_options(cls, bootstrap_servers: str | list[str],
                     options: ConsumerOptions) -> ConsumerConfig:
        """The config of ``Consumer(bootstrap_servers, **options)`` (an unknown option is
        a ``TypeError``, as an unknown keyword argument is)."""
        security, rest = security_of(options)
        return cls(bootstrap_servers, security=security, **rest)

    @property
    def auto_commit(self) -> bool:
        """Whether the consumer commits by itself: ``enable_auto_commit`` with a group."""
        return self.enable_auto_commit and self.group_id is not None


def _check_group_options(config: ConsumerConfig) -> None:
    group_id, instance_id = config.group_id, config.group_instance_id
    if group_id is not None and (not isinstance(group_id, str) or not group_id.strip()):
        raise ValueError(f"group_id={group_id!r} is not valid; give a non-empty name")
    if instance_id is not None:
        if group_id is None:
            raise ValueError("group_instance_id needs a group_id: it names this member "
                             "inside a group")
        if not isinstance(instance_id, str) or not instance_id.strip():
            raise ValueError(f"group_instance_id={instance_id!r} is not valid; give a "
                             "non-empty name, unique per consumer of the group")
    session = config.session_timeout_ms
    if not isinstance(session, int) or (session != -1 and session < 1):
        raise ValueError(f"session_timeout_ms={session!r} is not valid; use ms "
                         ">= 1, or -1 for the broker's group.session.timeout.ms")
    _check_positive_ms("rebalance_timeout_ms", config.rebalance_timeout_ms)
    _check_positive_ms("max_poll_interval_ms", config.max_poll_interval_ms)
    if config.assignor not in ASSIGNORS:
        raise ValueError(f"assignor={config.assignor!r} is not valid; use one of "
                         f"{', '.join(ASSIGNORS)}")
    if not isinstance(config.enable_auto_commit, bool):
        raise ValueError(f"enable_auto_commit={config.enable_auto_commit!r} is not valid; "
                         "use True or False")
    _check_positive_ms("auto_commit_interval_ms", config.auto_commit_interval_ms)


def _check_positive_ms(name: str, value: object) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not valid; use ms >= 1")


# --------------------------------------------------------------------------- both faces

_Config = TypeVar("_Config", ProducerConfig, ConsumerConfig)


def config_of(kind: type[_Config], first: str | list[str] | _Config,
              options: Mapping[str, Any]) -> _Config:
    """What a face's ``__init__(first, **options)`` runs on: ``first`` itself when it is
    already a config of ``kind`` (then no keyword option may be given), else the config
    built and validated from ``first`` (the bootstrap servers) and ``options``."""
    if isinstance(first, kind):
        if options:
            raise TypeError(f"pass either a {kind.__name__} or keyword options, not both "
                            f"(got {sorted(options)})")
        return first
    if isinstance(first, ProducerConfig | ConsumerConfig):
        raise TypeError(f"a {type(first).__name__} was given where a {kind.__name__} (or "
                        "the bootstrap servers) belongs")
    return kind.from_options(first, options)  # type: ignore[arg-type]
