"""A partition replica hosted by this broker: its log, producer state, leadership and HW.

Sits between the request handlers and the log. Knows the partition's leader epoch and
in-sync replica set (from ZooKeeper, through the broker), keeps the high watermark, and
wakes long-polling fetches when data arrives.

High watermark (HW): the first offset not yet in every in-sync replica. A leader
computes it as the minimum log end offset over the ISR, from the positions its followers
report in their fetches (a follower whose position is unknown since this broker became
leader holds the HW where it is). It never moves backwards while this broker leads, and
consumers never read at or past it. A follower takes the leader's HW from each fetch
answer (capped by its own log end). The HW is checkpointed (the data directory's
``replication-offset-checkpoint``, written by the log manager) on close and
periodically, so a restarted replica does not expose records it cannot know were
committed.

ISR: the leader proposes changes (``isr_change``), the broker writes them to ZooKeeper
with a conditional write, and only a successful write changes ``isr`` here (via
``set_state``): a leader never advances the HW on an ISR that ZooKeeper does not hold.
A follower leaves the ISR once it has not caught up with the leader's log end for
``replica.lag.time.max.ms``; it joins again once it reaches the HW (and the current
leader epoch's start).

Thread-safety: every method runs on the broker's event loop, except the fsync wait
under ``flush.policy=always``, which ``wait_durable`` runs in a worker thread (the log's
group commit is thread-safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from brokers.log import AppendInfo, FileSlice, FlushPolicy, LogConfig, PartitionLog
from brokers.log.checkpoint import OffsetCheckpoint
from brokers.log.cleaner import require_keys
from brokers.log.txn_index import AbortedTxn
from brokers.producer_state import CompletedTxn, ProducerStateManager
from brokers.staging import StagedPart, StagingArea
from wire.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidRecordBatchError,
    InvalidRequestError,
    InvalidTxnStateError,
    NotLeaderError,
    OffsetOutOfRangeError,
    TransactionAbortableError,
)
from wire.record_batch import (
    BROKER_ONLY_ATTRIBUTE_BITS,
    SINK_PRODUCER_ID_BASE,
    BatchHeader,
    ControlType,
    build_control_batch,
    iter_batches,
    parse_control,
    peek_header,
    stamp_sink_commit,
)

__all__ = ["FetchSessionClock", "FollowerPosition", "LeaderAppend", "Partition", "SinkCommit"]

log = logging.getLogger("strata.brokers.partition")

METADATA_FILE: Final = "partition.metadata"
#: The per-partition HW file of versions before the data directory's checkpoint
#: (``brokers/log/checkpoint.py``, ``PartitionOffsetsCheckpoint``): read as a fallback.
LEGACY_HIGH_WATERMARK_FILE: Final = "high-watermark"

# Threads that wait for group-commit fsyncs (flush.policy=always). Separate from the
# default executor so slow disks never starve ZooKeeper calls made via to_thread.
_DURABILITY_WAITS: Final = ThreadPoolExecutor(max_workers=64,
                                              thread_name_prefix="strata-durability")


@dataclass(frozen=True, slots=True)
class LeaderAppend:
    """The outcome of a produce to this partition."""

    first_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """The outcome of a sink commit in this partition.

    ``duplicate``: the sink had already committed this batch id (or a later one) here;
    nothing was appended and ``first_offset``/``last_offset`` are -1.
    """

    first_offset: int
    last_offset: int
    duplicate: bool
    last_committed_batch: int


_INT32_MAX: Final = 2**31 - 1
# Attribute bits a produced batch may never carry (the transactional bit it may).
_CLIENT_FORBIDDEN_BITS: Final = BROKER_ONLY_ATTRIBUTE_BITS & ~0x10


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class FetchSessionClock:
    """When a follower's fetch session last asked this leader (monotonic ms).

    One per session, shared by the positions of every partition the session names: a
    session request lists only partitions whose fetch offset changed, so for all the
    others the follower is still where it last said, and the session's latest request
    says when it was there. Updating one number per request instead of ten thousand
    positions is what keeps idle, caught-up followers in the ISR at that scale. A
    replaced or closed session's clock stops (``stop``), so a follower that went away
    falls out of the ISR as it would without sessions.
    """

    __slots__ = ("last_fetch_ms", "stopped")

    def __init__(self) -> None:
        self.last_fetch_ms = -1
        self.stopped = False

    def tick(self) -> None:
        if not self.stopped:
            self.last_fetch_ms = _now_ms()

    def stop(self) -> None:
        self.stopped = True


@dataclass(slots=True)
class FollowerPosition:
    """What a leader knows of one follower since it became leader.

    ``log_end_offset`` -1: not reported yet in this leadership. ``last_caught_up_ms``:
    the last time (monotonic ms) the follower had everything the leader had, Kafka's
    ``lastCaughtUpTimeMs``: a fetch at or past the leader's log end at the time of the
    follower's previous fetch proves it was caught up then. ``session``: the fetch
    session that last reported this position, if any (see :meth:`caught_up_ms`).
    """

    log_end_offset: int = -1
    last_caught_up_ms: int = field(default_factory=_now_ms)
    last_fetch_ms: int = -1
    leader_end_at_last_fetch: int = -1
    session: FetchSessionClock | None = None

    def caught_up_ms(self, leader_end: int) -> int:
        """``last_caught_up_ms``, or the session's latest request if later: a follower
        whose session still names this partition at (or past) the leader's log end was
        caught up when it last asked, listed or not."""
        if self.session is not None and self.log_end_offset >= leader_end:
            return max(self.last_caught_up_ms, self.session.last_fetch_ms)
        return self.last_caught_up_ms


class Partition:
    def __init__(self, topic: str, partition: int, topic_id: str, directory: Path,
                 config: LogConfig, broker_id: int, *, new: bool = False,
                 recorded_high_watermark: int | None = None) -> None:
        """Open (or create) the replica's log in ``directory``. ``new``: the caller
        listed the data directory and ``directory`` is not there, so nothing is read
        back (``PartitionLog``'s ``new``); the log is created with its metadata file.
        ``recorded_high_watermark``: this replica's entry in the data directory's
        high-watermark checkpoint (``LogManager``), if it has one."""
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.directory = directory
        self.broker_id = broker_id
        self.leader_id = -1
        self.leader_epoch = 0
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self.state_version = -1  # ZooKeeper version of the partition state applied
        self.followers: dict[int, FollowerPosition] = {}
        # True from a lost ZooKeeper session until the state is re-read: ZooKeeper no
        # longer vouches for this broker, so it must not act as leader.
        self.fenced = False
        # An ISR grow written (or being written) to ZooKeeper but not applied here yet:
        # the HW counts its members too (Kafka's "maximal ISR"), so a replica that may
        # already be in the ISR in ZooKeeper, and so electable, has every record the HW
        # covers.
        self.pending_isr: list[int] | None = None
        # (first offset, end offset) of sink commit groups above the HW: the HW never
        # stops inside one, so consumers see a commit whole or not at all.
        self._open_groups: list[tuple[int, int]] = []
        self.log = PartitionLog(directory, config, new=new)
        new = self.log.created_new
        if new or read_topic_id(directory) != topic_id:  # a restart finds it written already
            _write_topic_id(directory, topic_id)
        self.producers = ProducerStateManager(directory)
        if not new:
            self._load_producer_state()
        # The HW is checkpointed for every hosted replica in one file per data
        # directory, every few rounds of ISR upkeep and at close (``LogManager``): a
        # machine crash can only leave a lower HW, which the leader moves up again.
        # Without an entry there, the per-partition file of earlier versions is read
        # (never written any more).
        recorded = recorded_high_watermark
        if recorded is None and not new:
            recorded = OffsetCheckpoint(directory / LEGACY_HIGH_WATERMARK_FILE).read()
        torn = self.producers.open_commit()
        if torn is not None and (recorded is None or torn >= recorded):
            # A crash in the middle of a sink commit's group append: the group must be
            # all or nothing, so its head goes too (the commit is re-run by its writer).
            # Never below the high watermark: what consumers may have read stays.
            log.warning("%s-%d: removing a torn sink commit from offset %d to the log end "
                        "%d", topic, partition, torn, self.log.log_end_offset)
            self.log.truncate_to(torn)
            self._load_producer_state()
        elif torn is not None:
            log.error("%s-%d: a sink commit from offset %d has no end batch but is below "
                      "the high watermark %d; keeping it", topic, partition, torn, recorded)
        self.staging = StagingArea(directory, new=new)
        self._high_watermark_cap: int | None = None
        # No checkpoint: a log from before replication existed (everything in it was
        # acknowledged by its only replica), or a brand-new empty one.
        self.high_watermark = self.log.log_end_offset if recorded is None \
            else max(self.log.log_start_offset, min(recorded, self.log.log_end_offset))
        # Transactions the replay completed below it are stable: without this the last
        # stable offset would stay at the first of them until the next write moved the
        # high watermark (the replay ran before the high watermark was known).
        self.producers.on_high_watermark(self.high_watermark)
        self._data_arrived = asyncio.Event()
        # Futures of long polls parked on many partitions at once (see ``watch_data``).
        self._data_watchers: set[asyncio.Future[None]] = set()
        # Followers' fetch sessions told of every change (see ``add_change_listener``).
        self._change_listeners: dict[object, Callable[[Partition], None]] = {}

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, leader={self.leader_id})"

    def _load_producer_state(self) -> None:
        """Producer state from its newest snapshot and the batches after it; the markers
        among them rebuild the aborted-transaction index (a segment whose index was lost
        has the whole log replayed)."""
        snapshot = 0 if self.log.txn_index_lost else self.producers.load(
            self.log.log_end_offset)
        if self.log.txn_index_lost:
            self.producers.clear()

        def items() -> Any:
            for header in self.log.batch_headers(max(snapshot, self.log.log_start_offset)):
                if header.is_control and header.producer_id < SINK_PRODUCER_ID_BASE:
                    control, coordinator_epoch = self.log.read_control(header.base_offset)
                    yield header, control, coordinator_epoch
                else:
                    yield header

        for done in self.producers.replay(items()):
            self._index_completed(done)
        self.producers.on_high_watermark(getattr(self, "high_watermark", 0))

    def _index_completed(self, done: CompletedTxn) -> None:
        if done.aborted:
            self.log.add_aborted(AbortedTxn(done.producer_id, done.first_offset,
                                            done.last_offset, self.last_stable_offset))

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def config(self) -> LogConfig:
        return self.log.config

    def set_config(self, config: LogConfig) -> None:
        self.log.config = config

    def set_state(self, leader: int, leader_epoch: int, isr: list[int], replicas: list[int],
                  version: int = -1) -> bool:
        """Apply the partition state from ZooKeeper (at load and on every change).

        Returns True when this broker just became leader or a follower of a new leader
        (the caller then starts or re-points replication). Becoming leader with a newer
        epoch records the epoch's start at the log end and forgets what it knew of the
        followers. Losing leadership takes effect at once: produce answers
        NOT_LEADER_OR_FOLLOWER and parked fetches are woken to notice.
        """
        changed = leader != self.leader_id or leader_epoch != self.leader_epoch
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.isr = list(isr)
        self.replicas = list(replicas)
        self.state_version = version
        self.fenced = False
        self.pending_isr = None  # ZooKeeper's word replaces whatever was proposed
        if changed:
            self._open_groups = []  # a new leader recomputes from its own appends
        if changed and self.is_leader and not self.log.is_offline:
            self._drop_torn_tail_group()
        if changed and self.is_leader:
            now = _now_ms()
            self.followers = {r: FollowerPosition(last_caught_up_ms=now)
                              for r in replicas if r != self.broker_id}
        elif self.is_leader:
            # Same leadership, new replica set (a reassignment): track who joined.
            self.followers = {r: self.followers.get(r) or FollowerPosition()
                              for r in replicas if r != self.broker_id}
        else:
            self.followers = {}
        if self.is_leader and not self.log.is_offline \
                and leader_epoch > self.log.latest_epoch:
            self.log.start_epoch(leader_epoch)
        self._advance_high_watermark()
        return changed

    def _drop_torn_tail_group(self) -> None:
        """A follower taking over may hold the head of a sink commit group whose end it
        never fetched: the group was never acknowledged (that needs every ISR member to
        hold all of it), so it goes, and the sink's re-run appends it whole."""
        torn = self.producers.open_commit()
        if torn is None or torn < self.high_watermark:
            return
        log.warning("%s: new leader removes the unfinished sink commit from offset %d",
                    self.name, torn)
        self.log.truncate_to(torn)
        self._load_producer_state()

    # ------------------------------------------------------------------ writes
    def needs_verification(self, batch: memoryview | bytes) -> BatchHeader | None:
        """The header of a transactional batch that would open its producer's transaction
        here: before appending it, the leader asks the transaction coordinator that this
        partition was added to that transaction (KIP-890 part 1). None: no need."""
        header = peek_header(batch)
        return header if self.producers.needs_verification(header) else None

    def append_as_leader(self, batch: memoryview | bytes, *, verified: bool = False,
                         coordinator: bool = False) -> LeaderAppend:
        """Validate, deduplicate and append one produced batch (no fsync wait).

        A transactional batch (the transactional bit and an ordinary producer id) that
        opens its producer's transaction here must be ``verified`` (see
        ``needs_verification``). ``coordinator``: a group coordinator's transactional
        write of a producer's offsets (TxnOffsetCommit), which carries no sequence: only
        the epoch fence applies. Raises the log's validation errors and the
        producer-state errors; nothing is written when one is raised.
        """
        self.check_leadership()
        header = self.log.validate(batch)
        if self.log.config.cleanup_policy.compacts:
            require_keys(batch, self.topic)  # docs/compaction.md: keyless records refused
        if header.attributes & _CLIENT_FORBIDDEN_BITS:
            raise InvalidRecordBatchError(
                "produced batches must not set the control, commit-end or delete-horizon "
                "attribute bits: only the brokers write transaction markers and sink "
                "commits")
        if header.is_transactional and (header.producer_id < 0 or
                                        (header.base_sequence < 0 and not coordinator)):
            raise InvalidRecordBatchError(
                "a transactional batch needs the producer id and sequence of a "
                "transactional producer (InitProducerId with a transactional id)")
        if header.is_transactional and not verified and \
                self.producers.needs_verification(header):
            raise TransactionAbortableError(
                f"{self.name}: the first transactional batch of producer "
                f"{header.producer_id} here was not verified with its coordinator; abort "
                "the transaction and retry")
        if header.producer_id >= SINK_PRODUCER_ID_BASE:
            raise InvalidRecordBatchError(
                f"producer id {header.producer_id} is in the range reserved for sinks "
                f"(>= {SINK_PRODUCER_ID_BASE}); use the id InitProducerId returned")
        if coordinator:
            self.producers.check_epoch(header)
            duplicate = None
        else:
            duplicate = self.producers.check(header)
        if duplicate is not None:
            return LeaderAppend(duplicate.first_offset, duplicate.last_offset, -1, True)
        self._vouch_caught_up_followers()
        info: AppendInfo = self.log.append(batch, leader_epoch=self.leader_epoch,
                                           validated=header, wait_for_flush=False)
        self.producers.update(header, info.first_offset)
        self._advance_high_watermark()
        return LeaderAppend(info.first_offset, info.last_offset, info.log_append_time, False)

    def append_marker(self, producer_id: int, producer_epoch: int, control: ControlType,
                      coordinator_epoch: int) -> int | None:
        """Append a transaction marker (WriteTxnMarkers) as the leader: end the
        producer's transaction here. Returns the marker's offset, or None for a repeat of
        a marker already written (nothing appended). Raises
        TRANSACTION_COORDINATOR_FENCED / INVALID_PRODUCER_EPOCH when the marker is
        stale."""
        self.check_leadership()
        batch = bytearray(build_control_batch(producer_id, producer_epoch, control,
                                              coordinator_epoch, _now_ms()))
        header = peek_header(batch)
        if not self.producers.check_marker(header, coordinator_epoch):
            return None
        self._vouch_caught_up_followers()
        info = self.log.append(batch, leader_epoch=self.leader_epoch, validated=header,
                               wait_for_flush=False)
        done = self.producers.complete(header, info.first_offset, control, coordinator_epoch)
        if done is not None:
            self._index_completed(done)
        self._advance_high_watermark()
        return info.first_offset

    @property
    def last_stable_offset(self) -> int:
        """What a read_committed consumer may read up to: the first offset of the oldest
        transaction not decided (and replicated) yet, at most the high watermark. The
        log cleaner never cleans at or past it, and the tiering job is offered only
        segments below it.

        Retention (and DeleteRecords) may move the log start past the first offset of a
        transaction still open, as Kafka allows: the records of it below the new start
        are simply gone. The LSO is then the log start (Kafka clamps it the same way):
        read_committed readers wait there until the transaction ends; if it commits
        they read the rest of it, if it aborts its index entry (whose ``first_offset``
        lies below the log start) still makes them skip the rest."""
        unstable = self.producers.first_unstable_offset()
        hw = getattr(self, "high_watermark", 0)
        if unstable is None:
            return hw
        return min(max(unstable, self.log.log_start_offset), hw)

    def stage(self, staging_id: str, chunk_sequence: int, batch: memoryview | bytes) -> bool:
        """Stage a sink writer's chunk (invisible until committed); True for a resend."""
        header = self.log.validate(batch)
        if self.log.config.cleanup_policy.compacts:
            require_keys(batch, self.topic)  # as for produce: docs/compaction.md
        return self.staging.stage(staging_id, chunk_sequence, batch, header)

    def needs_txn_verification(self, producer_id: int) -> bool:
        """A sink commit inside ``producer_id``'s transaction would open it here: the
        leader asks the coordinator first, as for a transactional produce (KIP-890)."""
        return not self.producers.in_transaction(producer_id)

    def commit_staged(self, producer_id: int, batch_id: int, parts: list[StagedPart], *,
                      txn: tuple[int, int] | None = None, verified: bool = False
                      ) -> SinkCommit:
        """Append the staged ``parts`` as sink ``producer_id``'s commit ``batch_id``.

        Exactly once per (sink, batch id, partition): a batch id at or below the sink's
        last commit here is a replay; its staged files are discarded and nothing is
        appended. Otherwise the files are checked against the writers' counts
        (``STAGED_DATA_MISSING`` if they differ; nothing is appended) and appended as one
        group whose last batch ends the commit. No fsync wait: the caller does that.

        ``txn``: (producer id, epoch) of the open transaction the commit belongs to. The
        group is stamped with them, so the transaction's marker decides it; a commit
        that would open the transaction here must be ``verified`` with its coordinator
        (``needs_txn_verification``). A partition whose open transaction already holds
        the group of ``batch_id`` answers ``duplicate`` (a resumed transaction re-runs
        its commit); one holding another batch id's group refuses (INVALID_TXN_STATE).
        """
        if producer_id < SINK_PRODUCER_ID_BASE:
            raise InvalidRequestError(
                f"sink producer id {producer_id} is below {SINK_PRODUCER_ID_BASE}; derive it "
                "from the sink id (strata.client.sink_producer_id)")
        if not 0 <= batch_id <= _INT32_MAX:
            raise InvalidRequestError(f"batch id {batch_id} is outside 0..{_INT32_MAX}")
        if not parts:
            raise InvalidRequestError("a commit names at least one staged part")
        last = self.producers.last_commit(producer_id)
        ids = [p.staging_id for p in parts]
        if batch_id <= last:
            self.staging.discard(ids)
            return SinkCommit(-1, -1, True, last)
        if txn is not None:
            self.check_leadership()
            self._check_txn_commit(txn, batch_id, verified)
            if self.producers.txn_sink_batch(*txn) == batch_id:
                self.staging.discard(ids)
                return SinkCommit(-1, -1, True, batch_id)
        if len(set(ids)) != len(ids):
            raise InvalidRequestError(
                f"a commit names a staging id twice in {self.name}; name each once")
        batches = self.staging.collect(parts)
        for i, data in enumerate(batches):
            if txn is None:
                stamp_sink_commit(data, producer_id, batch_id,
                                  ends_commit=i == len(batches) - 1)
            else:
                stamp_sink_commit(data, txn[0], batch_id, ends_commit=i == len(batches) - 1,
                                  producer_epoch=txn[1])
        group_start = self.log.log_end_offset
        self._vouch_caught_up_followers()
        try:
            info = self.log.append_group(batches, leader_epoch=self.leader_epoch)
        except Exception:
            # A disk error part-way may have left whole batches of an unfinished group:
            # they must never become readable (the log is offline; the partition's next
            # open truncates them).
            self._high_watermark_cap = group_start
            raise
        for data in batches:
            header = peek_header(data)
            self.producers.update(header, header.base_offset)
        self.staging.discard(ids)
        if len(batches) > 1:
            self._open_groups.append((info.first_offset, info.last_offset + 1))
        self._advance_high_watermark()
        if self.log.config.flush_policy is FlushPolicy.INTERVAL:
            self.log.flush_if_due()
        return SinkCommit(info.first_offset, info.last_offset, False, batch_id)

    def _check_txn_commit(self, txn: tuple[int, int], batch_id: int, verified: bool) -> None:
        """Refuse a sink commit inside transaction ``txn`` that must not be appended."""
        pid, epoch = txn
        if not 0 <= pid < SINK_PRODUCER_ID_BASE or epoch < 0:
            raise InvalidRequestError(
                f"producer {pid} epoch {epoch} is not a transactional producer's (use the "
                "id and epoch InitProducerId returned for the transactional id)")
        current = self.producers.producer_epoch(pid)
        if current is not None and epoch < current:
            raise InvalidProducerEpochError(
                f"{self.name}: producer {pid} epoch {epoch} is older than its epoch "
                f"{current} here: a newer instance of the transactional id fenced it")
        if not self.producers.in_transaction(pid):
            if not verified:
                raise TransactionAbortableError(
                    f"{self.name}: the first write of producer {pid}'s transaction here "
                    "was not verified with its coordinator; abort the transaction and "
                    "retry")
            return
        if current is not None and epoch > current:
            raise ConcurrentTransactionsError(
                f"{self.name}: producer {pid}'s previous transaction (epoch {current}) is "
                "not ended here yet (its marker is on its way); retry shortly")
        held = self.producers.txn_sink_batch(pid, epoch)
        if held is not None and held != batch_id:
            raise InvalidTxnStateError(
                f"{self.name}: the open transaction of producer {pid} already holds sink "
                f"batch {held}; one transaction commits one batch (commit or abort it "
                f"before committing batch {batch_id})")

    def abort_staged(self, staging_ids: list[str]) -> int:
        return self.staging.discard(staging_ids)

    def check_leadership(self) -> None:
        """Raise NOT_LEADER_OR_FOLLOWER unless this replica may act as leader now."""
        if not self.is_leader:
            raise NotLeaderError(
                f"broker {self.broker_id} is not the leader of {self.name} (leader is "
                f"{self.leader_id}); refresh metadata")
        if self.fenced:
            raise NotLeaderError(
                f"broker {self.broker_id} is cut off from ZooKeeper (its session lost or "
                f"presumed expired) and cannot vouch for its leadership of {self.name} until "
                "it reaches ZooKeeper again; refresh metadata and retry")

    # ------------------------------------------------------------------ replication
    def append_as_follower(self, records: bytes | bytearray | memoryview, leader_high_watermark: int
                           ) -> int:
        """Append the leader's batches unchanged; return how many were appended.

        Batches (or their parts) below the log end were already appended by an earlier
        fetch and are skipped. Producer state follows the log, so deduplication and sink
        commits survive a failover to this replica.
        """
        appended = 0
        view = memoryview(records)
        for header, batch in iter_batches(view):
            if header.last_offset < self.log.log_end_offset:
                continue
            info = self.log.append_as_follower(batch)
            if header.is_control and header.producer_id < SINK_PRODUCER_ID_BASE:
                control, coordinator_epoch = parse_control(batch)
                done = self.producers.complete(header, info.first_offset, control,
                                               coordinator_epoch)
                if done is not None:
                    self._index_completed(done)
            else:
                self.producers.update(header, info.first_offset)
            appended += 1
        self.update_follower_high_watermark(leader_high_watermark)
        if appended:
            self._notify()
        return appended

    def update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        new = min(leader_high_watermark, self.log.log_end_offset)
        if new > self.high_watermark:
            self.high_watermark = new
            self.producers.on_high_watermark(new)

    def truncate_divergent_tail(self, offset: int) -> int:
        """A follower drops what the leader does not have (KIP-279); returns the new end.

        Producer state is rebuilt from the log that is left.
        """
        if offset >= self.log.log_end_offset:
            return self.log.log_end_offset
        log.warning("%s: truncating the divergent tail %d..%d (the new leader does not have "
                    "it)", self.name, offset, self.log.log_end_offset)
        end = self.log.truncate_to(offset)
        self._load_producer_state()
        self.high_watermark = min(self.high_watermark, end)
        return end

    def restart_at(self, offset: int) -> None:
        """A follower whose whole log is below the leader's log start starts over there."""
        log.warning("%s: the leader's log starts at %d, past this replica's end %d: "
                    "starting the log over there", self.name, offset, self.log.log_end_offset)
        self.log.restart_at(offset)
        self.producers.reset()
        self.high_watermark = offset

    def record_follower_fetch(self, replica: int, fetch_offset: int,
                              session: FetchSessionClock | None = None) -> None:
        """A follower fetched from ``fetch_offset``: it has everything below it.
        ``session``: its fetch session, which reports it at that offset until it says
        otherwise (None: a sessionless fetch, which says nothing about later)."""
        position = self.followers.get(replica)
        if position is None:
            return
        position.session = session
        now = _now_ms()
        leader_end = self.log.log_end_offset
        if fetch_offset > leader_end:
            return  # a divergent follower: it truncates first, and holds nothing yet
        position.log_end_offset = fetch_offset
        if fetch_offset >= leader_end:
            position.last_caught_up_ms = now
        elif position.last_fetch_ms >= 0 and fetch_offset >= position.leader_end_at_last_fetch:
            position.last_caught_up_ms = max(position.last_caught_up_ms, position.last_fetch_ms)
        position.last_fetch_ms = now
        position.leader_end_at_last_fetch = leader_end
        self._advance_high_watermark()

    def _vouch_caught_up_followers(self) -> None:
        """Before the log end moves: a follower whose session has it at the current end
        was caught up at its session's latest request. Recorded now, because after the
        append its position is behind and the session vouches for it no longer (an idle
        partition's last listed fetch may be hours old)."""
        end = self.log.log_end_offset
        for position in self.followers.values():
            if position.session is not None and position.log_end_offset >= end:
                position.last_caught_up_ms = position.caught_up_ms(end)

    def forget_follower_session(self, replica: int) -> None:
        """The follower's session no longer names this partition: its position stops
        being refreshed by the session's requests."""
        position = self.followers.get(replica)
        if position is not None:
            position.session = None

    def isr_change(self, lag_time_max_ms: int, leaving: Collection[int] = ()
                   ) -> list[int] | None:
        """The ISR this leader should propose now, or None when it should stay.

        Shrink: followers in the ISR not caught up for ``lag_time_max_ms``. Grow: a
        follower outside it whose position reached the HW and this epoch's start (so it
        holds everything this leader acknowledged), unless it is ``leaving`` (in a
        controlled shutdown: the controller took it out, and it is about to stop).
        """
        if not self.is_leader or self.fenced:
            return None
        now = _now_ms()
        leader_end = self.log.log_end_offset
        followers = self.followers
        keep = [b for b in self.isr if b == self.broker_id or (
            b in followers
            and now - followers[b].caught_up_ms(leader_end) <= lag_time_max_ms)]
        if len(keep) == len(self.isr) and len(followers) + 1 == len(keep) \
                and not leaving:
            return None  # every replica in sync and staying: the common case, kept cheap
        epoch_start_offset = next((entry.start_offset for entry in self.log.leader_epochs
                                   if entry.epoch == self.leader_epoch), 0)
        joining = [b for b, pos in followers.items()
                   if b not in keep and b in self.replicas and b not in leaving
                   and pos.log_end_offset >= max(self.high_watermark, epoch_start_offset)
                   and now - pos.caught_up_ms(leader_end) <= lag_time_max_ms]
        if self.broker_id not in keep:
            keep.insert(0, self.broker_id)
        proposed = [b for b in self.replicas if b in keep or b in joining]
        proposed += [b for b in keep if b not in proposed]  # never drop ISR members by order
        return proposed if sorted(proposed) != sorted(self.isr) else None

    async def wait_durable(self, end_offset: int) -> None:
        if self.log.config.flush_policy is FlushPolicy.ALWAYS:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(_DURABILITY_WAITS, self.log.wait_durable, end_offset)

    def _advance_high_watermark(self) -> None:
        if self.is_leader:
            ends = [self.log.log_end_offset]
            members = list(self.isr) + [b for b in self.pending_isr or () if b not in self.isr]
            for replica in members:
                if replica == self.broker_id or replica not in self.replicas:
                    # Not a replica any more (a reassignment removed it; the ISR write
                    # that drops it is on its way): it holds nothing it must hold.
                    continue
                position = self.followers.get(replica)
                # A member not heard from in this leadership holds the HW where it is.
                ends.append(position.log_end_offset if position is not None else -1)
            new = min(ends)
            if self._high_watermark_cap is not None:
                new = min(new, self._high_watermark_cap)
            for start, end in self._open_groups:
                if start < new < end:
                    new = start
            if new > self.high_watermark:
                self.high_watermark = new
                self._open_groups = [g for g in self._open_groups if g[1] > new]
                self.producers.on_high_watermark(new)
        self._notify()

    def _notify(self) -> None:
        self._data_arrived.set()
        self._data_arrived = asyncio.Event()
        if self._data_watchers:
            watchers, self._data_watchers = self._data_watchers, set()
            for future in watchers:
                if not future.done():
                    future.set_result(None)
        for listener in list(self._change_listeners.values()):
            listener(self)

    def add_change_listener(self, owner: object, listener: Callable[[Partition], None]
                            ) -> None:
        """Call ``listener(self)`` at every append, HW move or state change until
        ``remove_change_listener(owner)``: how a follower's fetch session learns which
        of its thousands of partitions changed without looking at each one."""
        self._change_listeners[owner] = listener

    def remove_change_listener(self, owner: object) -> None:
        self._change_listeners.pop(owner, None)

    def watch_data(self, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` at the next append (or HW move), like ``wait_for_data``.

        One future shared by every partition of a fetch: a follower's fetch parked on
        thousands of partitions costs a set insertion per partition, not a task each.
        The caller removes it again with ``unwatch_data``."""
        self._data_watchers.add(future)

    def unwatch_data(self, future: asyncio.Future[None]) -> None:
        self._data_watchers.discard(future)

    def wake_waiters(self) -> None:
        """Answer every parked long poll now (shutdown)."""
        self._notify()

    async def wait_replicated(self, end_offset: int, timeout_s: float) -> bool:
        """Wait until the high watermark reaches ``end_offset`` (every in-sync replica has
        the records below it). False: this replica stopped leading, or was fenced, first
        (whether the records survive is up to the new leader). ``TimeoutError`` after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.high_watermark < end_offset:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if not self.is_leader or self.fenced:
                return False
            await asyncio.wait_for(self.wait_for_data(), remaining)
        return True

    def wait_for_data(self) -> Coroutine[Any, Any, bool]:
        """Complete when the next append (or HW move) happens; callers add the timeout.

        Not a coroutine function on purpose: the event is taken when this is *called*.
        Callers wrap the result in a task, and a task first runs a loop turn later; an
        append in between would replace the event and its wake-up would be lost (a
        parked follower fetch then slept its whole max wait).
        """
        return self._data_arrived.wait()

    # ------------------------------------------------------------------ reads
    def read(self, offset: int, max_bytes: int, *, for_follower: bool = False,
             committed: bool = False) -> FileSlice | None:
        """Whole batches from ``offset``; consumers see only committed data (< HW), and
        read_committed ones (``committed``) only stable data (< the last stable offset).

        A consumer offset between that bound and the log end is not out of range but not
        readable yet (after a failover the new leader's HW may trail what its
        predecessor had exposed until the followers report in): nothing is returned.
        """
        if offset > self.log.log_end_offset or offset < self.log.log_start_offset:
            raise OffsetOutOfRangeError(offset, self.log.log_start_offset,
                                        self.log.log_end_offset if for_follower
                                        else self.high_watermark)
        if for_follower:
            return self.log.read(offset, max_bytes)
        upper = self.last_stable_offset if committed else self.high_watermark
        if offset >= upper:
            return None
        return self.log.read(offset, max_bytes, upper_offset=upper)

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions a read_committed read of ``[start, end)`` needs."""
        return self.log.aborted_transactions(start, end)

    def snapshot_producer_state(self) -> None:
        """Snapshot the producer state as of the log end (at close, before retention
        deletes the segments whose headers are its only other record, and before each
        cleaner pass, so a restart never replays cleaned headers). The aborted-
        transaction entries are written (and fsynced) first: a replay starts after the
        snapshot."""
        self.log.persist_txn_indexes()
        self.producers.write_snapshot(self.log.log_end_offset)

    # ------------------------------------------------------------------ lifecycle
    def close(self, *, mark_clean: bool = True) -> None:
        """Snapshot the producer state and close the log (``PartitionLog.close``, whose
        ``mark_clean`` this passes on; :meth:`mark_clean` writes the marker later). The
        HW is the log manager's to checkpoint (``LogManager.close_logs``)."""
        # After a disk error the state in memory may not match what is on disk (a torn
        # sink group, a write that half failed): no snapshot, so the next open rebuilds
        # the state from the log itself.
        if not self.log.is_offline:
            self.snapshot_producer_state()
        self.log.close(mark_clean=mark_clean)

    def mark_clean(self) -> None:
        self.log.mark_clean()

    def delete(self) -> None:
        try:
            self.log.close()
        finally:  # a disk error while closing must not keep a deleted topic's files
            shutil.rmtree(self.directory, ignore_errors=True)


def _write_topic_id(directory: Path, topic_id: str) -> None:
    """``partition.metadata``: one ``open``/``write``/``close`` (a text-mode file object
    adds three more calls, which count when ten thousand logs are created at once)."""
    fd = os.open(directory / METADATA_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps({"version": 1, "topic_id": topic_id}).encode())
    finally:
        os.close(fd)


def read_topic_id(directory: Path) -> str | None:
    try:
        return str(json.loads((directory / METADATA_FILE).read_text())["topic_id"])
    except (OSError, ValueError, KeyError):
        return None
