"""Client quotas: produce and fetch byte rates and a request rate, per principal or
client id (Kafka's client quotas, with throttling as in KIP-219).

Quotas are set per *entity*: a user (the principal's name, ``User:`` dropped), a client
id, or the default for either (``<default>``). The quota that applies to a request is
the most specific one set: user, then client id, then the user default, then the
client-id default; none set means no limit.

Enforcement: each broker measures, per entity, the bytes produced, the bytes fetched and
the requests over a sliding window of ``_SAMPLES`` one-second samples. When a request
takes an entity's rate above its quota, the broker answers at once with
``throttle_time_ms`` (Produce and Fetch carry it) and stops reading that connection for
that long, so a client that does not honour the throttle gains nothing; the Strata
client waits it out before its next request to that broker. The delay is Kafka's:
``(rate - quota) / quota * window`` (the window measured so far, up to ``_SAMPLES``
seconds), capped at ``_MAX_THROTTLE_MS``: waiting that long brings the rate back to the
quota.

Thread-safety: the event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["QUOTA_KEYS", "DEFAULT", "QuotaManager"]

#: Quota keys (Kafka's names) and what each limits.
QUOTA_KEYS: Final = {
    "producer_byte_rate": "bytes/s of Produce and StageRecords record data",
    "consumer_byte_rate": "bytes/s of Fetch record data (consumers; not followers)",
    "request_rate": "requests/s of every API but ApiVersions and SASL",
}
DEFAULT: Final = "<default>"
_SAMPLES: Final = 11
_MAX_THROTTLE_MS: Final = 30_000


@dataclass(slots=True)
class _Rate:
    """Amounts per one-second sample over the last ``_SAMPLES`` seconds."""

    samples: dict[int, float] = field(default_factory=dict)
    first_second: int = -1

    def add(self, now: float, amount: float) -> tuple[float, float]:
        """Record ``amount`` at ``now``; the rate (per second) over the window, and the
        window's length in seconds."""
        second = int(now)
        if self.first_second < 0:
            self.first_second = second
        self.samples[second] = self.samples.get(second, 0.0) + amount
        oldest = second - _SAMPLES + 1
        for old in [s for s in self.samples if s < oldest]:
            del self.samples[old]
        # A new entity's window is as long as it has existed (at least one second), so
        # a burst at start-up is measured, not averaged away over empty seconds.
        elapsed = max(min(_SAMPLES - 1, second - self.first_second) + (now - second), 1.0)
        return sum(self.samples.values()) / elapsed, elapsed


class QuotaManager:
    """Quotas as last read from ZooKeeper, and the rates measured on this broker."""

    def __init__(self) -> None:
        #: ``(user, client_id)`` with one of them None -> {key: limit}.
        self.quotas: dict[tuple[str | None, str | None], dict[str, float]] = {}
        self._rates: dict[tuple[str, str, str], _Rate] = {}

    def replace(self, quotas: Mapping[tuple[str | None, str | None], dict[str, float]]
                ) -> None:
        self.quotas = {k: dict(v) for k, v in quotas.items()}

    def _limit(self, key: str, user: str, client_id: str
               ) -> tuple[float, tuple[str, str]] | None:
        for entity in ((user, None), (None, client_id), (DEFAULT, None), (None, DEFAULT)):
            limit = self.quotas.get(entity, {}).get(key)
            if limit is not None:
                name = ("user", user) if entity[0] is not None else ("client", client_id)
                return limit, name
        return None

    def record(self, key: str, principal: str, client_id: str, amount: float,
               now: float | None = None) -> int:
        """Count ``amount`` against the quota that applies; the throttle in ms (0: within
        the quota, or no quota set)."""
        if not self.quotas:
            return 0
        user = principal.removeprefix("User:")
        found = self._limit(key, user, client_id)
        if found is None:
            return 0
        limit, (kind, name) = found
        now = time.monotonic() if now is None else now
        rate, window = self._rates.setdefault((key, kind, name), _Rate()).add(now, amount)
        if rate <= limit:
            return 0
        if limit <= 0:
            return _MAX_THROTTLE_MS
        return int(min((rate - limit) / limit * window * 1000, _MAX_THROTTLE_MS))
