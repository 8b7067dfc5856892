"""The consumer's offsets: where each partition reads from, and what the group has committed.

Job: positions and commits. Positions: a partition without one is resolved from the
group's committed offset (with a ``group_id``), else by ``auto_offset_reset`` with
``ListOffsets`` (``"earliest"`` / ``"latest"``; ``"none"`` raises
``OffsetOutOfRangeError`` carrying the valid range); ``seek`` and the ``seek_to_*``
lookups set them. Commits (with a ``group_id``): ``commit`` (synchronous, or asynchronous
with merged sends), auto-commit inside ``poll`` every ``auto_commit_interval_ms``, before a
revocation and at close, and the committed-offset lookup. ``list_offsets`` /
``list_offsets_once`` are shared with the admin client.

Invariants:

- At-least-once: a commit without explicit offsets commits only positions after records
  ``poll`` already returned (once ``abandon_last_poll`` was called, the positions from
  before the last poll), so nothing the caller did not process is committed.
- Commits stay in order: at most one asynchronous commit is on its way (requests made
  meanwhile are merged, newest offset per partition winning) and a synchronous commit
  waits for them, so a committed offset never goes backwards.
- A position found by a lookup is applied only if the partition was not repositioned
  (``seek``, a new generation) while the lookup ran: the seek wins.

Thread-safety: event loop only, like the rest of an ``AsyncConsumer``; commit callbacks
are queued here and run by the consumer on the caller's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pyarrow as pa

from strata.client._cluster import Cluster
from strata.client._common import (
    TopicPartition,
    as_strata_error,
    error_from_code,
    is_transient,
    topic_partitions,
)
from strata.client._config import ConsumerConfig
from strata.client._fetcher import Fetcher
from strata.client._group import AutoCommitTimer, CommitFailedError, GroupMember
from strata.client._subscription import PartitionState, Subscription
from wire.errors import (
    NetworkError,
    OffsetOutOfRangeError,
    StrataError,
    UnknownTopicOrPartitionError,
)
from wire.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ApiKey,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    group_by_topic,
)

__all__ = ["CommitCallback", "Offsets", "OffsetsToCommit", "list_offsets", "list_offsets_once"]

log = logging.getLogger("strata.client.consumer")

#: ``commit(offsets)``: per partition, the offset of the next record to process.
OffsetsToCommit: TypeAlias = Mapping[TopicPartition, int] | Mapping[tuple[str, int], int]
#: ``commit(asynchronous=True, callback=...)``: ``callback(offsets, error)``, error None
#: on success.
CommitCallback: TypeAlias = Callable[[dict[TopicPartition, int], StrataError | None], Any]


# ----------------------------------------------------------------------------- ListOffsets


async def list_offsets_once(
    cluster: Cluster, specs: Mapping[TopicPartition, int], timeout_s: float, *,
    isolation_level: int = 0
) -> dict[TopicPartition, ListOffsetsPartitionResponse | StrataError]:
    """One ``ListOffsets`` round per leader, in parallel; per-partition answer or error.

    ``specs`` maps a partition to ``EARLIEST_TIMESTAMP``, ``LATEST_TIMESTAMP`` or a
    timestamp in ms. ``isolation_level`` 1 (read_committed): "latest" is the last stable
    offset. Nothing is retried here: callers decide what is transient.
    """
    out: dict[TopicPartition, ListOffsetsPartitionResponse | StrataError] = {}
    by_leader: dict[int, list[TopicPartition]] = {}
    for tp in specs:
        try:
            leader = await cluster.leader_for(tp.topic, tp.partition)
        except StrataError as err:
            out[tp] = err
            continue
        by_leader.setdefault(leader, []).append(tp)

    async def ask(node: int, tps: list[TopicPartition]) -> None:
        topics = group_by_topic((tp.topic, ListOffsetsPartition(tp.partition, specs[tp]))
                                for tp in tps)
        request = ListOffsetsRequest([ListOffsetsTopic(t, ps) for t, ps in topics.items()],
                                     isolation_level=isolation_level)
        try:
            connection = await cluster.connection(node)
            response = await asyncio.wait_for(
                connection.request(ApiKey.LIST_OFFSETS, request), timeout_s)
        except (StrataError, TimeoutError) as err:
            for tp in tps:
                out[tp] = as_strata_error(err)
            return
        assert isinstance(response, ListOffsetsResponse)
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                if tp in specs:
                    out[tp] = answer if answer.error_code == 0 else \
                        error_from_code(answer.error_code, answer.error_message)
        for tp in tps:
            out.setdefault(tp, NetworkError(f"{tp}: the broker's answer left it out"))

    await asyncio.gather(*(ask(node, tps) for node, tps in by_leader.items()))
    return out


async def list_offsets(
    cluster: Cluster, specs: Mapping[TopicPartition, int], *, timeout_s: float,
    isolation_level: int = 0
) -> dict[TopicPartition, ListOffsetsPartitionResponse]:
    """``ListOffsets`` with retries: transient errors (leader moved, connection lost,
    broker still loading the partition) are retried with a metadata refresh and back-off
    until ``timeout_s``; a topic or partition missing from the cluster's metadata and any
    non-retriable error are raised at once, typed."""
    deadline = time.monotonic() + timeout_s
    pending = dict(specs)
    results: dict[TopicPartition, ListOffsetsPartitionResponse] = {}
    attempt = 0
    refreshed = False
    while pending:
        remaining = max(deadline - time.monotonic(), 0.001)
        answers = await list_offsets_once(cluster, pending, remaining,
                                          isolation_level=isolation_level)
        last_error: StrataError | None = None
        for tp, answer in answers.items():
            if isinstance(answer, ListOffsetsPartitionResponse):
                results[tp] = answer
                del pending[tp]
                continue
            if not is_transient(answer):
                raise answer
            if isinstance(answer, UnknownTopicOrPartitionError) and refreshed and \
                    tp.partition not in cluster.topics.get(tp.topic, {}):
                raise answer  # fresh metadata agrees: the topic or partition does not exist
            last_error = answer
        if not pending:
            break
        if time.monotonic() >= deadline:
            assert last_error is not None
            raise last_error
        if attempt:  # the first retry only refreshes metadata; later ones back off too
            await cluster.backoff(attempt)
        attempt += 1
        with contextlib.suppress(StrataError, TimeoutError):
            await cluster.refresh(sorted({tp.topic for tp in pending}))
            refreshed = True
    return results


# ----------------------------------------------------------------------------- offsets


@dataclass(slots=True, eq=False)
class _MergedCommit:
    """Asynchronous commits asked for while another was on its way, sent as one."""

    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    outcome: asyncio.Future[dict[TopicPartition, int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def __post_init__(self) -> None:
        self.outcome.add_done_callback(lambda f: f.cancelled() or f.exception())


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (it is reported another way)."""
    if not task.cancelled():
        task.exception()


class Offsets:
    """Positions (resolution, seeks, rewinds) and the group's commits of one consumer."""

    def __init__(self, config: ConsumerConfig, cluster: Cluster, subscription: Subscription,
                 fetcher: Fetcher, group: GroupMember | None) -> None:
        self._config = config
        self._cluster = cluster
        self._subscription = subscription
        self._fetcher = fetcher
        self._group = group
        self.auto_commit_timer = AutoCommitTimer(config.auto_commit_interval_ms)
        self._auto_commit_task: asyncio.Task[None] | None = None
        self._last_committed: dict[TopicPartition, int] = {}
        self.async_commit_errors: list[StrataError] = []
        self._async_commits: set[asyncio.Task[dict[TopicPartition, int]]] = set()
        self._async_next: _MergedCommit | None = None  # not sent yet (see _commit_in_background)
        self._async_sender: asyncio.Task[None] | None = None
        self.commit_callbacks: deque[tuple[CommitCallback, dict[TopicPartition, int],
                                           StrataError | None]] = deque()
        self._before_drain: dict[TopicPartition, int] = {}  # positions before the last poll
        self._last_poll_abandoned = False

    @property
    def _timeout_s(self) -> float:
        return self._config.request_timeout_ms / 1000

    @property
    def _read_committed(self) -> bool:
        """A read_committed consumer waits for offsets an open transaction commits."""
        return self._config.isolation_level == "read_committed"

    @property
    def _isolation(self) -> int:
        """ListOffsets' isolation: a read_committed consumer's end is the last stable
        offset (``seek_to_end``, ``auto_offset_reset="latest"``)."""
        return 1 if self._read_committed else 0

    # ------------------------------------------------------------------ positions
    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Make ``offset`` the next record ``poll`` returns for ``partition``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset {offset!r} is not valid; use an integer >= 0")
        tp = TopicPartition(*partition)
        state = self._subscription.state(tp)
        state.reposition(offset)
        state.use_committed = False
        self._fetcher.cancel({tp})

    async def offsets_for(self, specs: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, int]:
        """What ``ListOffsets`` finds for each partition's timestamp spec (a timestamp
        past the last record: the end), for the ``seek_to_*`` methods."""
        answers = await list_offsets(self._cluster, specs, timeout_s=self._timeout_s,
                                     isolation_level=self._isolation)
        offsets = {tp: a.offset for tp, a in answers.items()}
        past_end = [tp for tp, offset in offsets.items() if offset < 0]
        if past_end:
            ends = await list_offsets(self._cluster, dict.fromkeys(past_end, LATEST_TIMESTAMP),
                                      timeout_s=self._timeout_s,
                                      isolation_level=self._isolation)
            offsets.update({tp: a.offset for tp, a in ends.items()})
        return offsets

    async def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` returns, resolved first if unknown."""
        tp = TopicPartition(*partition)
        while True:
            # re-read: an assign() meanwhile may drop the partition
            state = self._subscription.state(tp)
            if state.position is not None:
                return state.position
            await self.resolve_positions({tp: state}, retry=True)

    async def resolve_positions(self, states: dict[TopicPartition, PartitionState], *,
                                retry: bool) -> None:
        """Give partitions without a position one, per ``auto_offset_reset``.

        With ``retry`` (an explicit ``position()``), transient errors are retried until
        the request timeout; from ``poll`` they only back the partition off.
        """
        now = time.monotonic()
        todo = {tp: s for tp, s in states.items() if retry or s.retry_at <= now}
        if not todo:
            return
        lookup = {tp: s for tp, s in todo.items() if s.use_committed}
        if lookup:
            await self._position_at_committed(lookup, retry)
            current = self._subscription.states
            todo = {tp: s for tp, s in todo.items()
                    if s.position is None and not s.use_committed and current.get(tp) is s}
            if not todo:
                return
        generations = {tp: s.generation for tp, s in todo.items()}
        reset = self._config.auto_offset_reset
        if reset == "none":
            earliest, latest = await asyncio.gather(
                self._list(dict.fromkeys(todo, EARLIEST_TIMESTAMP), retry),
                self._list(dict.fromkeys(todo, LATEST_TIMESTAMP), retry))
            for tp in todo:
                start, end = earliest.get(tp), latest.get(tp)
                if start is not None and end is not None:
                    err = OffsetOutOfRangeError(-1, start, end)
                    group_id = self._config.group_id
                    committed = "" if group_id is None else \
                        f" and group {group_id!r} has no committed offset for it"
                    StrataError.__init__(
                        err, f"{tp} has no position{committed} and auto_offset_reset='none'; "
                        f"seek to an offset in [{start}, {end}] (earliest={start}, "
                        f"latest={end})")
                    raise err
            return
        spec = EARLIEST_TIMESTAMP if reset == "earliest" else LATEST_TIMESTAMP
        found = await self._list(dict.fromkeys(todo, spec), retry)
        for tp, offset in found.items():
            state = self._subscription.states.get(tp)
            if state is not None and state.generation == generations[tp] \
                    and state.position is None:
                state.reposition(offset)

    async def _position_at_committed(self, lookup: dict[TopicPartition, PartitionState],
                                     retry: bool) -> None:
        """Position partitions at the group's committed offsets; the ones with none go on
        to ``auto_offset_reset``. From ``poll`` (no ``retry``) a failed lookup only backs
        the partitions off."""
        assert self._group is not None
        generations = {tp: s.generation for tp, s in lookup.items()}
        try:
            found = await self._group.link.committed(
                list(lookup), timeout_s=self._timeout_s if retry
                else self._config.retry_backoff_ms / 1000 + 1.0,
                require_stable=self._read_committed)
        except StrataError as err:
            if retry or not is_transient(err):
                raise
            log.debug("group %s: committed offsets not fetched yet: %s", self._config.group_id,
                      err)
            # Back off without a metadata refresh: the coordinator did not answer, the
            # partitions' leaders are not in question (in a large group's rebalance every
            # member would re-read the whole topic's metadata for nothing).
            retry_at = time.monotonic() + self._config.retry_backoff_ms / 1000
            for tp in lookup:
                state = self._subscription.states.get(tp)
                if state is not None:
                    state.retry_at = retry_at
            return
        for tp, offset in found.items():
            state = self._subscription.states.get(tp)
            if state is not lookup[tp] or state.generation != generations[tp] \
                    or state.position is not None:
                continue  # dropped, or seek()ed meanwhile: the seek wins
            state.use_committed = False
            if offset is not None:
                state.reposition(offset)
                self._last_committed[tp] = offset

    async def _list(self, specs: dict[TopicPartition, int], retry: bool
                    ) -> dict[TopicPartition, int]:
        if retry:
            answers = await list_offsets(self._cluster, specs, timeout_s=self._timeout_s,
                                         isolation_level=self._isolation)
            return {tp: a.offset for tp, a in answers.items()}
        found: dict[TopicPartition, int] = {}
        raw = await list_offsets_once(self._cluster, specs, self._timeout_s,
                                      isolation_level=self._isolation)
        for tp, answer in raw.items():
            if isinstance(answer, ListOffsetsPartitionResponse):
                found[tp] = answer.offset
            elif is_transient(answer):
                self._fetcher.back_off(tp)
            else:
                raise answer
        return found

    def remember_positions(self) -> None:
        """Just before ``poll`` hands records out: the positions its records start at."""
        self._before_drain = {tp: st.position for tp, st in self._subscription.states.items()
                              if st.position is not None}

    def rewind(self, table: pa.Table) -> None:
        """Put records a caller never received back: each partition's position returns
        to the first of them (a blocking poll interrupted by Ctrl-C)."""
        if table.num_rows == 0:
            return
        firsts: dict[TopicPartition, int] = {}
        for topic, partition, offset in zip(table.column("topic").to_pylist(),
                                            table.column("partition").to_pylist(),
                                            table.column("offset").to_pylist(), strict=True):
            tp = TopicPartition(topic, partition)
            firsts[tp] = min(offset, firsts.get(tp, offset))
        for tp, offset in firsts.items():
            state = self._subscription.states.get(tp)
            if state is not None:
                state.reposition(offset)
                state.use_committed = False
        self._fetcher.cancel(set(firsts))

    # ------------------------------------------------------------------ commits
    def require_group(self, what: str) -> GroupMember:
        if self._group is None:
            raise ValueError(f"{what} needs a consumer group: create the consumer with "
                             "group_id=\"...\"")
        return self._group

    def _offsets_to_commit(self, offsets: OffsetsToCommit | None
                           ) -> dict[TopicPartition, int]:
        if offsets is None:
            return self._commit_positions(None, changed_only=False)
        out: dict[TopicPartition, int] = {}
        for tp, offset in offsets.items():
            [key] = topic_partitions([tp])
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset {offset!r} for {key} is not valid; commit the offset "
                                 "of the next record to process (an integer >= 0)")
            out[key] = offset
        return out

    async def commit(self, offsets: OffsetsToCommit | None, *, asynchronous: bool,
                     callback: CommitCallback | None
                     ) -> dict[TopicPartition, int] | asyncio.Task[dict[TopicPartition, int]]:
        """``AsyncConsumer.commit`` once the group and the consumer were checked."""
        wanted = self._offsets_to_commit(offsets)
        if asynchronous:
            return self._commit_in_background(wanted, callback)
        await self.run_commit_callbacks()
        self.raise_async_commit_error()
        return await self.commit_now(wanted)

    def raise_async_commit_error(self) -> None:
        if self.async_commit_errors:
            error, self.async_commit_errors = self.async_commit_errors[0], []
            raise error

    async def commit_now(self, offsets: dict[TopicPartition, int]
                         ) -> dict[TopicPartition, int]:
        """Commit now (commit(), auto-commit, before a revocation, at close), after the
        asynchronous commits asked for earlier, so a committed offset never goes back."""
        await self._async_commits_sent()
        return await self._send_commit(offsets)

    async def _send_commit(self, offsets: dict[TopicPartition, int]
                           ) -> dict[TopicPartition, int]:
        group = self.require_group("commit()")
        try:
            done = await group.commit(offsets, member=self._subscription.mode == "subscribe",
                                      timeout_s=self._timeout_s)
        except CommitFailedError as err:
            self._last_committed.update(err.committed)
            raise
        self._last_committed.update(done)
        return done

    def _commit_in_background(self, offsets: dict[TopicPartition, int],
                              callback: CommitCallback | None
                              ) -> asyncio.Task[dict[TopicPartition, int]]:
        """Queue an asynchronous commit. At most one is sent at a time: requests made
        while one is on its way are merged (the newest offset per partition wins) and go
        out together next, so a caller committing after every poll cannot build a queue
        at the coordinator that later commits (a revocation's) wait behind. Each call
        still gets its own task and callback, with its own partitions' outcome."""
        if self._async_next is None:
            self._async_next = _MergedCommit()
        batch = self._async_next
        batch.offsets.update(offsets)
        group_id = self._config.group_id
        if self._async_sender is None or self._async_sender.done():
            self._async_sender = asyncio.create_task(self._send_async_commits(),
                                                     name=f"strata-commit-{group_id}")
            self._async_sender.add_done_callback(_retrieve)

        async def run() -> dict[TopicPartition, int]:
            try:
                done = await asyncio.shield(batch.outcome)
            except StrataError as err:
                if callback is not None:
                    self.commit_callbacks.append((callback, offsets, err))
                else:
                    self.async_commit_errors.append(err)
                raise
            mine = {tp: done[tp] for tp in offsets if tp in done}
            if callback is not None:
                self.commit_callbacks.append((callback, mine, None))
            return mine

        task = asyncio.create_task(run(), name=f"strata-commit-{group_id}")
        task.add_done_callback(_retrieve)
        self._async_commits.add(task)  # close() waits for it, then cancels it
        task.add_done_callback(self._async_commits.discard)
        return task

    async def _send_async_commits(self) -> None:
        """Send the merged asynchronous commits one after the other, in order."""
        group_id = self._config.group_id
        while (batch := self._async_next) is not None:
            self._async_next = None
            try:
                done = await self._send_commit(batch.offsets)
            except StrataError as err:
                log.warning("group %s: asynchronous commit failed: %s", group_id, err)
                batch.outcome.set_exception(err)
            except BaseException:  # cancelled by close(): nobody may wait for ever
                closed = NetworkError(
                    f"group {group_id!r}: the consumer closed before the commit was "
                    "confirmed; it may or may not have been stored")
                for unsent in (batch, self._async_next):
                    if unsent is not None and not unsent.outcome.done():
                        unsent.outcome.set_exception(closed)
                self._async_next = None
                raise
            else:
                batch.outcome.set_result(done)

    async def _async_commits_sent(self) -> None:
        """Wait until every asynchronous commit asked for so far was answered (a
        synchronous commit goes after them, so commits stay in order)."""
        sender = self._async_sender
        if sender is not None and not sender.done():
            await asyncio.wait({sender})

    async def run_commit_callbacks(self) -> None:
        while self.commit_callbacks:
            callback, offsets, error = self.commit_callbacks.popleft()
            result = callback(offsets, error)
            if inspect.isawaitable(result):
                await result

    async def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]]
                        ) -> dict[TopicPartition, int | None]:
        """The group's committed offset per partition (None: nothing committed)."""
        group = self.require_group("committed()")
        return await group.link.committed(topic_partitions(partitions),
                                          timeout_s=self._timeout_s,
                                          require_stable=self._read_committed)

    def changed_positions(self, partitions: Iterable[TopicPartition] | None = None
                          ) -> dict[TopicPartition, int]:
        """Positions of owned partitions that differ from what was last committed (see
        ``_commit_positions``)."""
        return self._commit_positions(partitions, changed_only=True)

    def _commit_positions(self, partitions: Iterable[TopicPartition] | None, *,
                          changed_only: bool) -> dict[TopicPartition, int]:
        """The positions a commit without explicit offsets commits: owned partitions'
        positions (``changed_only``: those that differ from the last commit). After
        ``abandon_last_poll`` (a ``with`` block left by an exception) a partition's
        position is taken from before the last poll: its records may be unprocessed.
        Shared by auto-commit and ``commit()`` (e.g. from ``on_revoke`` during close),
        so neither commits records the caller never processed."""
        owned = self._subscription.owned()
        wanted = owned if partitions is None else owned & set(partitions)
        out: dict[TopicPartition, int] = {}
        for tp, state in self._subscription.states.items():
            position = state.position
            if tp not in wanted or position is None:
                continue
            if self._last_poll_abandoned and tp in self._before_drain:
                position = min(position, self._before_drain[tp])
            if not changed_only or self._last_committed.get(tp) != position:
                out[tp] = position
        return out

    def abandon_last_poll(self) -> None:
        """The caller failed while processing the last poll's records: commits from now
        on (``close``) stop before them."""
        self._last_poll_abandoned = True

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions that went away: what was committed for them is no longer ours."""
        for tp in partitions:
            self._last_committed.pop(tp, None)

    def maybe_auto_commit(self) -> None:
        """Inside poll, before records are handed out: commit, in the background, the
        positions reached by the previous polls (records the caller has processed)."""
        mode = self._subscription.mode
        if not self._config.auto_commit or mode is None or not self.auto_commit_timer.due():
            return
        if self._auto_commit_task is not None and not self._auto_commit_task.done():
            return
        self.auto_commit_timer.reset()
        if mode == "subscribe" and (self._group is None or not self._group.membership.joined):
            return
        offsets = self.changed_positions()
        if offsets:
            self._auto_commit_task = asyncio.create_task(self.auto_commit_now(offsets),
                                                         name="strata-auto-commit")

    async def auto_commit_now(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await self.commit_now(offsets)
        except StrataError as err:
            log.warning("group %s: auto-commit failed: %s", self._config.group_id, err)

    async def commit_before_revoke(self, partitions: Iterable[TopicPartition]) -> None:
        offsets = self.changed_positions(partitions)
        if not offsets:
            return
        try:
            await self.commit_now(offsets)
        except StrataError as err:
            log.warning("group %s: auto-commit before revoking %s failed: %s",
                        self._config.group_id,
                        ", ".join(str(tp) for tp in sorted(offsets)), err)

    async def shutdown(self) -> None:
        """Commits still under way (auto-commit, commit(asynchronous=True)) may finish
        within the request timeout; what is left is cancelled, so nobody waits on it
        forever and nothing reopens a connection once the cluster is closed."""
        commits: set[asyncio.Task[Any]] = set(self._async_commits)
        if self._async_sender is not None:
            commits.add(self._async_sender)
        if self._auto_commit_task is not None:
            commits.add(self._auto_commit_task)
        commits = {task for task in commits if not task.done()}
        if commits:
            with contextlib.suppress(BaseException):
                await asyncio.wait(commits, timeout=self._timeout_s)
            for task in commits:
                task.cancel()
            await asyncio.gather(*commits, return_exceptions=True)
