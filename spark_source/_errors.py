"""Errors the Spark source raises, in the project's error convention.

Why typed errors with codes: a Spark query fails with the Python traceback text of
whatever the data source raised, wrapped in a ``PythonException``. A stable name in that
text (``[INVALID_SPARK_OPTION]``, ``[DATA_LOSS]``, ``[TIER_UNAVAILABLE]``) is what an
operator can grep for and what tests assert on, and the message says what to do, as
every ``StrataError`` does (``wire/errors.py``: numeric ``code``, symbolic ``name``,
``str(err)`` is ``"[NAME] message"``).

Codes 1200 and up belong to the Spark connector. Like the client's 1000-range codes they
are never sent on the wire.

``StrataError`` is imported from ``wire.errors``, the error table shared by the
protocol and the client (``strata.client`` re-exports this very class), rather than via
``strata.client``: Spark's data source lookup imports this package in every session, and
importing the whole client there would cost about 0.2 s each time.
"""

from __future__ import annotations

from wire.errors import StrataError

__all__ = ["StrataSparkDataLossError", "StrataSparkOptionError", "StrataSparkTierError"]


class StrataSparkOptionError(StrataError):
    """A source option is unknown, malformed or contradicts another one.

    Raised when the query starts (reader creation, ``initialOffset``, batch planning),
    before any data is read. ``option`` names the offending option as the user spells it
    in the docs (``startingOffsets``), so the message can be acted on directly.
    """

    code = 1200
    name = "INVALID_SPARK_OPTION"

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"option {option}: {message}")


class StrataSparkDataLossError(StrataError):
    """Records the query still had to read are gone, and ``failOnDataLoss`` is true.

    Retention (``retention.ms`` / ``retention.bytes``) deleted them, or their topic or
    partition was deleted (and maybe recreated, which resets its offsets). The message
    names the topic-partition and the offsets, and the two ways out: accept the loss with
    ``failOnDataLoss=false`` or start over from a new checkpoint.
    """

    code = 1201
    name = "DATA_LOSS"


class StrataSparkTierError(StrataError):
    """A topic's Delta tier table cannot be read, so offsets below a broker's log start
    cannot be replayed.

    Not data loss: the records may well be in the table, which is missing, unreadable
    from this executor, changed under the read (a data file vacuumed away) or not in the
    tier table's shape. Failing loudly, rather than skipping those offsets under
    ``failOnDataLoss=false``, keeps a storage or permission problem from silently
    dropping history. ``table`` is the table's URI as ZooKeeper records it.
    """

    code = 1202
    name = "TIER_UNAVAILABLE"

    def __init__(self, table: str, message: str) -> None:
        self.table = table
        super().__init__(f"Delta tier table {table}: {message}")
