"""Per-log (per-topic) configuration: keys, defaults, validation.

Keys use Kafka's dotted names so operators can carry their habits over. Every key
has a default; ``LogConfig.from_mapping`` rejects unknown keys and bad values with an
``InvalidConfigError`` that names the key and the accepted range, before anything is
applied.

Tiering (``tier.enable``): a Spark job copies closed segments into a Delta table per
topic and records in ZooKeeper how far it got. The broker then keeps only a local
window (``local.retention.ms`` / ``local.retention.bytes``, Kafka's KIP-405 names and
semantics, ``-2`` meaning "same as the total") and deletes a segment only once it is in
the table; ``retention.ms`` then applies to the table, not to the local copy
(``retention.bytes`` must stay -1: the table is trimmed by time only). Because the
local copy may never outlive the total, a tier-enabled config whose effective local
retention exceeds the total is rejected, as Kafka does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from wire.errors import InvalidConfigError

__all__ = [
    "CleanupPolicy", "FlushPolicy", "LogConfig", "SAME_AS_TOTAL", "TOPIC_CONFIG_KEYS",
    "TimestampTypeConfig",
]

_INT32_MAX: Final = 2**31 - 1
_INT64_MAX: Final = 2**63 - 1
#: ``local.retention.*`` value meaning "the same as ``retention.*``" (Kafka's -2).
SAME_AS_TOTAL: Final = -2


class FlushPolicy(StrEnum):
    """When appended bytes are forced to disk (``flush.policy``).

    ``none``: the page cache holds them, replication gives durability (Kafka's default);
    ``interval``: fsync at most every ``flush.ms``; ``always``: fsync before an append
    returns, with group commit so concurrent appends share one fsync.
    """

    NONE = "none"
    INTERVAL = "interval"
    ALWAYS = "always"


class CleanupPolicy(StrEnum):
    """What bounds a log (``cleanup.policy``).

    ``delete``: retention deletes whole old segments (``retention.ms`` / ``.bytes``);
    ``compact``: nothing is deleted by age or size, the broker's cleaner
    (``brokers/log/cleaner.py``) keeps the latest record per key; ``compact,delete``
    (Kafka's spelling; ``delete,compact`` is read as the same): both, so keys that
    stop being written eventually age out. ``compact,delete`` is refused with
    ``tier.enable=true``, where the tiering job owns the total retention.
    """

    DELETE = "delete"
    COMPACT = "compact"
    COMPACT_DELETE = "compact,delete"

    @classmethod
    def _missing_(cls, value: object) -> CleanupPolicy | None:
        if isinstance(value, str):
            parts = sorted(p.strip() for p in value.split(","))
            if parts == ["compact", "delete"]:
                return cls.COMPACT_DELETE
        return None

    @property
    def compacts(self) -> bool:
        return self is not CleanupPolicy.DELETE

    @property
    def deletes(self) -> bool:
        return self is not CleanupPolicy.COMPACT


class TimestampTypeConfig(StrEnum):
    CREATE_TIME = "CreateTime"
    LOG_APPEND_TIME = "LogAppendTime"


@dataclass(frozen=True, slots=True)
class _Key:
    attribute: str
    parse: Callable[[str], Any]
    check: Callable[[Any], bool]
    accepted: str
    doc: str


def _int(text: str) -> int:
    return int(text)


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise ValueError(text)
    return lowered == "true"


def _subject(text: str) -> str:
    if len(text) > 255 or not text.isprintable():
        raise ValueError(text)
    return text


def _enum(kind: type[StrEnum]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return kind(text)

    return parse


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition log; topic configs map onto these fields."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1 << 20
    flush_policy: FlushPolicy = FlushPolicy.NONE
    flush_ms: int = 1000
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    min_insync_replicas: int = 1
    message_timestamp_type: TimestampTypeConfig = TimestampTypeConfig.CREATE_TIME
    unclean_leader_election_enable: bool = False
    tier_enable: bool = False
    tier_after_ms: int = 600_000
    local_retention_ms: int = SAME_AS_TOTAL
    local_retention_bytes: int = SAME_AS_TOTAL
    delete_retention_ms: int = 24 * 3600 * 1000
    value_schema_subject: str = ""

    @property
    def effective_local_retention_ms(self) -> int:
        """``local.retention.ms`` with -2 resolved to ``retention.ms`` (-1: forever)."""
        return self.retention_ms if self.local_retention_ms == SAME_AS_TOTAL \
            else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """``local.retention.bytes`` with -2 resolved to ``retention.bytes`` (-1: no limit)."""
        return self.retention_bytes if self.local_retention_bytes == SAME_AS_TOTAL \
            else self.local_retention_bytes

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, str | int], base: LogConfig | None = None
    ) -> LogConfig:
        """Parse topic configs (``{"retention.ms": "1000", ...}``) over ``base`` (or defaults)."""
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            spec = TOPIC_CONFIG_KEYS.get(key)
            if spec is None:
                known = ", ".join(sorted(TOPIC_CONFIG_KEYS))
                raise InvalidConfigError(f"unknown topic config {key!r}; known keys: {known}")
            try:
                value = spec.parse(str(raw).strip())
            except ValueError:
                raise InvalidConfigError(
                    f"topic config {key}={raw!r} is not valid; accepted: {spec.accepted}"
                ) from None
            if not spec.check(value):
                raise InvalidConfigError(
                    f"topic config {key}={raw!r} is out of range; accepted: {spec.accepted}"
                )
            changes[spec.attribute] = value
        config = dataclasses.replace(base or cls(), **changes)
        config._check_tiering()
        return config

    def _check_tiering(self) -> None:
        """With tiering on, the local copy must not outlive the total retention.

        Otherwise the table (trimmed to ``retention.*`` by the tiering job) would lose
        records the broker still serves, and the two would disagree about the log start.
        Checked only with ``tier.enable=true``, so configs without tiering behave exactly
        as before.
        """
        if not self.tier_enable:
            return
        if self.cleanup_policy is CleanupPolicy.COMPACT_DELETE:
            raise InvalidConfigError(
                "topic config cleanup.policy=compact,delete is not supported with "
                "tier.enable=true: the tiering job owns the total retention (retention.ms "
                "on the Delta table) and keeps the compacted table for cleanup.policy="
                "compact; use compact or delete")
        if self.retention_bytes != -1:
            raise InvalidConfigError(
                f"topic config retention.bytes={self.retention_bytes} is not enforced on the "
                "Delta table, which tier.enable=true makes the total copy; use retention.ms "
                "for the table and local.retention.bytes for the brokers' copy, and leave "
                "retention.bytes at -1")
        for name, local, total in (
                ("ms", self.effective_local_retention_ms, self.retention_ms),
                ("bytes", self.effective_local_retention_bytes, self.retention_bytes)):
            if total != -1 and (local == -1 or local > total):
                shown = "-1 (unlimited)" if local == -1 else str(local)
                raise InvalidConfigError(
                    f"topic config local.retention.{name}={shown} exceeds "
                    f"retention.{name}={total}, which tier.enable=true does not allow (the "
                    f"broker would keep records the tiered table has already dropped); "
                    f"lower local.retention.{name} (-2: the same as retention.{name}) or "
                    f"raise retention.{name}")

    def to_mapping(self) -> dict[str, str]:
        """The config as topic-config strings (the inverse of ``from_mapping``)."""
        return {key: _text(getattr(self, spec.attribute))
                for key, spec in TOPIC_CONFIG_KEYS.items()}


TOPIC_CONFIG_KEYS: Final[dict[str, _Key]] = {
    "segment.bytes": _Key(
        "segment_bytes", _int, lambda v: 1024 <= v <= _INT32_MAX, f"1024..{_INT32_MAX}",
        "roll the active segment once it would grow past this many bytes"),
    "segment.ms": _Key(
        "segment_ms", _int, lambda v: 1 <= v <= _INT64_MAX, "a positive number of ms",
        "roll the active segment once its first record is this old"),
    "retention.ms": _Key(
        "retention_ms", _int, lambda v: v == -1 or 0 <= v <= _INT64_MAX, "-1 (forever) or ms >= 0",
        "delete closed segments whose newest record is older than this"),
    "retention.bytes": _Key(
        "retention_bytes", _int, lambda v: v == -1 or 0 <= v <= _INT64_MAX,
        "-1 (no limit) or bytes >= 0",
        "delete the oldest closed segments while the log is larger than this"),
    "index.interval.bytes": _Key(
        "index_interval_bytes", _int, lambda v: 1 <= v <= _INT32_MAX, f"1..{_INT32_MAX}",
        "bytes of log between two sparse index entries"),
    "max.message.bytes": _Key(
        "max_message_bytes", _int, lambda v: 64 <= v <= _INT32_MAX, f"64..{_INT32_MAX}",
        "largest batch (header + payload) accepted for append"),
    "flush.policy": _Key(
        "flush_policy", _enum(FlushPolicy), lambda v: True, "none, interval, always",
        "when appended bytes are fsynced"),
    "flush.ms": _Key(
        "flush_ms", _int, lambda v: 1 <= v <= _INT64_MAX, "a positive number of ms",
        "with flush.policy=interval, the longest time unflushed data may wait"),
    "cleanup.policy": _Key(
        "cleanup_policy", _enum(CleanupPolicy), lambda v: True,
        "delete, compact, compact,delete (not with tier.enable=true)",
        "delete: retention deletes old segments; compact: no retention by age or size, the "
        "broker's cleaner keeps the latest record per key on closed segments (records need "
        "a key) and, with tier.enable=true, the tiering job also keeps a Delta table of the "
        "latest record per key; compact,delete: both (docs/compaction.md)"),
    "delete.retention.ms": _Key(
        "delete_retention_ms", _int, lambda v: 0 <= v <= _INT64_MAX, f"0..{_INT64_MAX}",
        "with cleanup.policy=compact, how long a tombstone (null value) is kept by the "
        "cleaner after its timestamp (and stays in the tiered compacted table), and how "
        "long a transaction marker is kept once the cleaner found no record of its "
        "transaction left (docs/compaction.md)"),
    "min.insync.replicas": _Key(
        "min_insync_replicas", _int, lambda v: 1 <= v <= 1000, "1..1000",
        "with acks=all, the fewest in-sync replicas that must hold a write"),
    "message.timestamp.type": _Key(
        "message_timestamp_type", _enum(TimestampTypeConfig), lambda v: True,
        "CreateTime, LogAppendTime", "whose clock stamps records"),
    "unclean.leader.election.enable": _Key(
        "unclean_leader_election_enable", _bool, lambda v: True, "true, false",
        "when no in-sync replica is alive, let an out-of-sync replica lead (availability "
        "over durability: acknowledged records it lacks are lost)"),
    "tier.enable": _Key(
        "tier_enable", _bool, lambda v: True, "true, false",
        "the tiering job copies this topic's closed segments to a Delta table; the broker "
        "then deletes a local segment only once it is tiered (local.retention.*), and "
        "retention.ms applies to the table (retention.bytes must stay -1)"),
    "tier.after.ms": _Key(
        "tier_after_ms", _int, lambda v: 0 <= v <= _INT64_MAX, f"0..{_INT64_MAX}",
        "with tier.enable, a closed segment is tiered once its newest record is older than "
        "this"),
    "local.retention.ms": _Key(
        "local_retention_ms", _int, lambda v: v in (SAME_AS_TOTAL, -1) or 0 <= v <= _INT64_MAX,
        "-2 (same as retention.ms), -1 (forever) or ms >= 0",
        "with tier.enable, delete tiered local segments whose newest record is older than "
        "this; at most retention.ms"),
    "local.retention.bytes": _Key(
        "local_retention_bytes", _int,
        lambda v: v in (SAME_AS_TOTAL, -1) or 0 <= v <= _INT64_MAX,
        "-2 (same as retention.bytes), -1 (no limit) or bytes >= 0",
        "with tier.enable, delete the oldest tiered local segments while the log is larger "
        "than this; at most retention.bytes"),
    "value.schema.subject": _Key(
        "value_schema_subject", _subject, lambda v: True,
        "empty (bytes values) or a schema registry subject, 1..255 printable characters",
        "a typed topic: values are the subject's Arrow columns and the broker refuses a "
        "batch that does not match a live version of it (docs/typed-topics.md); "
        "Kafka's TopicNameStrategy names it <topic>-value. Set at creation only"),
}
