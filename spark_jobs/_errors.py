"""Errors of the tiering job, in the project's error convention (``wire/errors.py``).

Codes 1400 and up belong to the Spark jobs. Like the client's 1000-range codes they are
never sent on the wire, except TIER_LEASE_LOST (1404), which the brokers answer to a job
whose lease lapsed and so lives in ``wire.errors``; ``str(err)`` is ``"[NAME] message"``
and the message says what to do.
"""

from __future__ import annotations

from wire.errors import StrataError, TierLeaseLostError

__all__ = ["TierConfigError", "TierGapError", "TierLeaseLostError", "TierNotEnabledError",
           "TierStoreUnreachableError", "TierTableMismatchError"]


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


class TierGapError(StrataError):
    """Records were deleted from the brokers before they were tiered.

    Copying on from the log start would leave a hole in the Delta history that readers
    could not tell from a control record, so the job stops tiering the topic instead.
    """

    code = 1403
    name = "TIER_GAP"


class TierStoreUnreachableError(StrataError):
    """The warehouse's object store did not answer during a pass (down, unreachable, or
    refusing the credentials).

    Nothing is lost: a Delta commit either happened or not, the recorded progress never
    runs ahead of the table, and brokers free local segments only below that progress,
    so they keep every record the store does not hold. The next pass catches up.
    """

    code = 1406
    name = "TIER_STORE_UNREACHABLE"
