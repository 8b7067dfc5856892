"""The leader's side of followers' incremental fetch sessions (``FetchRequest`` version 1).

A follower opens one session per leader broker (``session_epoch`` 0) listing every
partition it follows there; after that each request lists only the partitions whose
fetch offset changed (and forgets the ones it stopped following), and each answer lists
only the partitions that changed here: new records, a moved high watermark, log start
or log end, or an error. A round then costs a comparison per changed partition instead
of decoding, reading and encoding each of the thousands of idle ones.

A moved high watermark alone does not end a parked fetch: it is *held* and travels with
the next answer (new records, an error, or the long poll's end, ``replica.fetch.wait.max.ms``),
as in Kafka, where only bytes to send (or an error) complete a follower's delayed fetch.
Nor does a request that lists a partition only because the follower appended what it
got (a new fetch offset, same epoch): what the session last told it still stands.
Answering both at once cost every produce at ``acks=all`` up to two more round trips to
each follower (the follower reports the records it got, then the HW moves when the last
in-sync follower has reported): the three brokers' CPU at 100,000 records/s fell from
11.4-11.6 to 9.4-9.7 s per million records without them (docs/benchmarks.md). A
follower's HW therefore lags the leader's by up to one round; nothing reads a follower's
HW but the follower itself (consumers and acknowledgements use the leader's, which is
unchanged), and a follower that becomes leader starts from its own HW and moves it as
its followers report, as in Kafka.

This module owns what a session holds (:class:`FetchSession`: per partition the fetch
offset, its limit and leader epoch, and what was last answered) and the sessions by
follower (:class:`FetchSessionCache`: one per follower broker, a new one replaces it, a
request with an unknown id or an out-of-step epoch ends it). Reading the records,
recording the follower's positions and the ISR belong to the replica manager
(``brokers/replica_manager.py``), which drives a session round.

Crash behaviour: sessions live in memory only. After a leader restart a follower's next
request gets FETCH_SESSION_ID_NOT_FOUND and it opens a new session; a lost answer needs
no resend either, because the follower opens a new session after any failed request.

Thread-safety: the broker's event loop only.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping

from brokers.partition import FetchSessionClock, Partition
from wire.errors import (
    FetchSessionIdNotFoundError,
    InvalidFetchSessionEpochError,
    StrataError,
)
from wire.protocol import FetchPartition, FetchRequest, FetchResponse

__all__ = ["FetchSession", "FetchSessionCache", "SessionPartition"]

PartitionKey = tuple[str, int]


class SessionPartition:
    """What a follower's fetch session holds for one partition."""

    __slots__ = ("answered", "fetch_offset", "leader_epoch", "partition_max_bytes")

    def __init__(self, part: FetchPartition) -> None:
        self.fetch_offset = part.fetch_offset
        self.partition_max_bytes = part.partition_max_bytes
        self.leader_epoch = part.current_leader_epoch
        # (HW, log start, log end) as last answered; None: answer it next time.
        self.answered: tuple[int, int, int] | None = None


class FetchSession:
    """A follower's incremental fetch session: one per follower broker at this leader;
    a new one replaces it.

    The session listens to each of its partitions (``Partition.add_change_listener``),
    so a round looks only at the partitions that changed since the last one (``dirty``)
    and wakes a parked fetch through one future: its cost follows the changes, not the
    thousands of idle partitions a follower may have here.
    """

    __slots__ = ("clock", "dirty", "epoch", "held", "partitions", "session_id", "swept_ms",
                 "watched", "woken")

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.epoch = 0  # the epoch the next request must carry
        # Ticks at every request: the follower is still where it last said on every
        # partition it did not list (``FollowerPosition.caught_up_ms``).
        self.clock = FetchSessionClock()
        self.partitions: dict[PartitionKey, SessionPartition] = {}
        self.swept_ms = 0
        self.dirty: set[PartitionKey] = set()
        # Partitions whose high watermark alone moved: told with the next answer.
        self.held: set[PartitionKey] = set()
        self.watched: dict[PartitionKey, Partition] = {}
        self.woken: asyncio.Future[None] | None = None

    def mark(self, partition: Partition) -> None:
        self.dirty.add((partition.topic, partition.partition))
        if self.woken is not None and not self.woken.done():
            self.woken.set_result(None)

    def listen(self, key: PartitionKey, partition: Partition | None) -> bool:
        """Follow ``partition`` for ``key`` (None: stop); False if it already did."""
        old = self.watched.get(key)
        if old is partition:
            return False
        if old is not None:
            old.remove_change_listener(self)
            del self.watched[key]
        if partition is not None:
            partition.add_change_listener(self, self.mark)
            self.watched[key] = partition
        return True

    def close(self) -> None:
        self.clock.stop()
        for partition in self.watched.values():
            partition.remove_change_listener(self)
        self.watched.clear()

    def update(self, request: FetchRequest, hosted: Mapping[PartitionKey, Partition]
               ) -> list[PartitionKey]:
        """Take what ``request`` changes: the partitions it forgets and the ones it lists
        (new fetch offsets); returns the listed ones."""
        replica = request.replica_id
        for forgotten in request.forgotten_topics:
            for p in forgotten.partitions:
                self.partitions.pop((forgotten.name, p), None)
                self.listen((forgotten.name, p), None)
                self.dirty.discard((forgotten.name, p))
                self.held.discard((forgotten.name, p))
                if (partition := hosted.get((forgotten.name, p))) is not None:
                    partition.forget_follower_session(replica)
        listed: list[PartitionKey] = []
        for topic in request.topics:
            for part in topic.partitions:
                key = (topic.name, part.partition)
                entry = SessionPartition(part)
                before = self.partitions.get(key)
                if before is not None and before.leader_epoch == entry.leader_epoch:
                    # What the follower was told still stands: a new fetch offset alone
                    # (it appended what it got) is not a reason to answer at once.
                    entry.answered = before.answered
                self.partitions[key] = entry
                self.listen(key, hosted.get(key))
                self.dirty.add(key)
                listed.append(key)
        return listed

    def candidates(self, changed: set[PartitionKey], hosted: Mapping[PartitionKey, Partition]
                   ) -> tuple[dict[str, list[FetchPartition]], bool]:
        """Of the session's partitions that ``changed``, those worth answering: records
        to send, offsets the follower has not been told, or an error; and whether any of
        them must be answered now (anything but a high watermark that alone moved: see
        the module docstring)."""
        wanted: dict[str, list[FetchPartition]] = {}
        urgent = False
        for key in changed:
            entry = self.partitions.get(key)
            if entry is None:
                continue
            partition = hosted.get(key)
            told = entry.answered
            if partition is not None and told is not None \
                    and partition.is_leader \
                    and entry.leader_epoch in (-1, partition.leader_epoch):
                lg = partition.log
                end = lg.log_end_offset
                if entry.fetch_offset == end and told[2] == end \
                        and told[1] == lg.log_start_offset:
                    if told[0] == partition.high_watermark:
                        continue  # idle and already told
                else:
                    urgent = True
            else:
                urgent = True
            wanted.setdefault(key[0], []).append(FetchPartition(
                key[1], entry.fetch_offset, entry.partition_max_bytes, entry.leader_epoch))
        return wanted, urgent

    def answered(self, response: FetchResponse) -> None:
        """Remember what ``response`` tells the follower; a partition left out by
        ``max_bytes`` is looked at again next round."""
        for topic_answer in response.topics:
            for answer in topic_answer.partitions:
                key = (topic_answer.name, answer.partition)
                entry = self.partitions.get(key)
                if entry is None:
                    continue
                entry.answered = (answer.high_watermark, answer.log_start_offset,
                                  answer.log_end_offset)
                if answer.records is None and entry.fetch_offset < answer.log_end_offset:
                    self.dirty.add(key)  # left out by max_bytes: next round
        response.session_id = self.session_id


class FetchSessionCache:
    """The fetch sessions of the followers of this leader, by follower broker id."""

    def __init__(self) -> None:
        self._sessions: dict[int, FetchSession] = {}

    def begin(self, request: FetchRequest) -> FetchSession | StrataError:
        """The session ``request`` (of a follower, ``session_epoch`` >= 0) continues or
        opens, at its next epoch, its clock ticked; or the error that ends it
        (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH)."""
        replica = request.replica_id
        session = self._sessions.get(replica)
        if request.session_epoch == 0:
            if session is not None:
                session.close()
            session = self._sessions[replica] = FetchSession(random.randrange(1, 2**31))
        elif session is None or session.session_id != request.session_id:
            return FetchSessionIdNotFoundError(
                f"fetch session {request.session_id} of broker {replica} is not known here "
                "(this broker restarted, or the session was replaced); open a new one")
        elif request.session_epoch != session.epoch:
            del self._sessions[replica]
            session.close()
            return InvalidFetchSessionEpochError(
                f"fetch session {session.session_id} expected epoch {session.epoch}, got "
                f"{request.session_epoch}; open a new one")
        session.epoch = request.session_epoch + 1
        session.clock.tick()
        return session
