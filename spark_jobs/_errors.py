"""Errors of the tiering job, in the project's error convention (``brokers/errors.py``).

Codes 1400 and up belong to the Spark jobs. Like the client's 1000-range codes they are
never sent on the wire; ``str(err)`` is ``"[NAME] message"`` and the message says what to do.
"""

from __future__ import annotations

from brokers.errors import StrataError

__all__ = ["TierConfigError", "TierNotEnabledError", "TierTableMismatchError"]


class TierConfigError(StrataError):
    """A job setting is missing or out of range (warehouse, interval, sizes)."""

    code = 1400
    name = "INVALID_TIER_SETTING"


class TierNotEnabledError(StrataError):
    """``--topic T`` names a topic whose ``tier.enable`` is false (or does not exist)."""

    code = 1401
    name = "TIER_NOT_ENABLED"


class TierTableMismatchError(StrataError):
    """ZooKeeper records another table for the topic than this job's warehouse gives.

    Tiering one topic into two tables would split its history: the source replays from the
    table recorded in ZooKeeper, so the job refuses instead of writing elsewhere.
    """

    code = 1402
    name = "TIER_TABLE_MISMATCH"
