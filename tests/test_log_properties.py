"""Property test: random operation sequences on a real ``PartitionLog`` agree with a model.

The model is a list of segments, each a list of batches (base offset, record count,
stored bytes, timestamps), plus the log start offset. It encodes the documented
rules: a segment rolls when the next batch would take it past ``segment.bytes``;
truncation removes whole batches and whole later segments; retention by size deletes
the oldest closed segments while the log stays at or above ``retention.bytes`` and
never the active one; delete-records moves the log start and drops whole segments
below it; a clean reopen changes nothing; an unclean reopen (the old object is simply
dropped, its page-cache writes survive) also loses nothing and drops only a trailing
empty segment.

``ClockedPartitionLogMachine`` puts the log's clock in play (``clock=``): records carry
timestamps just behind the clock, a rule moves the clock forward, segments also roll
once ``segment.ms`` passed since their roll time (the clock at their first append; the
first batch's max timestamp after a reopen or a truncation), and retention also deletes
the oldest closed segments whose newest record is older than ``retention.ms``.

After every step the log must match the model: start/end offsets, segment bases and
sizes, every batch's bytes, and every index entry (offset index entries point at a
batch header with the right base offset; time index entries name a batch whose max
timestamp is the entry's timestamp).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from brokers.log import LogConfig, PartitionLog
from wire.errors import OffsetOutOfRangeError
from wire.record_batch import HEADER_SIZE, build_batch, iter_batches, peek_header

pytestmark = pytest.mark.unit

BIG = 10**9
T0 = 1_700_000_000_000


@dataclass
class Batch:
    base: int
    count: int
    data: bytes  # as stored: offsets assigned, leader epoch 0
    timestamps: list[int]

    @property
    def next(self) -> int:
        return self.base + self.count


@dataclass
class Segment:
    base: int
    batches: list[Batch] = field(default_factory=list)
    rolled_at: int = -1  # the roll time segment.ms counts from (meaningful once non-empty)

    @property
    def size(self) -> int:
        return sum(len(b.data) for b in self.batches)

    @property
    def next(self) -> int:
        return self.batches[-1].next if self.batches else self.base


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # ``reopen_unclean`` collects garbage to drop the old log's files at once; a full
        # collection walks every object of the process (pytest's, Hypothesis's: ~1 s
        # each, up to 187 s a run). Objects that exist now are not this example's log:
        # frozen, the collection only walks what the example made (unfrozen in teardown).
        gc.freeze()
        self.directory = Path(tempfile.mkdtemp(prefix="strata-prop-"))
        self.clock = Clock()
        self.log: PartitionLog | None = None
        self.segments: list[Segment] = [Segment(0)]
        self.start = 0
        self.timestamp = T0 - 10_000_000
        self.sequence = 0

    # ------------------------------------------------------------------ model helpers
    @property
    def end(self) -> int:
        return self.segments[-1].next

    def _batches(self) -> list[Batch]:
        return [b for s in self.segments for b in s.batches]

    def _containing(self, offset: int) -> Batch:
        return next(b for b in self._batches() if b.base <= offset < b.next)

    def _open(self) -> PartitionLog:
        return PartitionLog(self.directory, self.config, clock=self.clock)

    # ------------------------------------------------------------------ rules
    @initialize(
        segment_bytes=st.integers(4096, 20_000),
        interval=st.sampled_from([1, 700, 2000, 4096]),
        retention_bytes=st.integers(0, 40_000),
    )
    def start_log(self, segment_bytes: int, interval: int, retention_bytes: int) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval,
                                retention_bytes=retention_bytes, retention_ms=-1,
                                segment_ms=2**62)
        self.log = self._open()

    @rule(count=st.integers(1, 20), pad=st.integers(0, 400),
          compression=st.sampled_from(["none", "none", "zstd"]))
    def append(self, count: int, pad: int, compression: str) -> None:
        assert self.log is not None
        timestamps = []
        for _ in range(count):
            self.timestamp += 7
            timestamps.append(self.timestamp)
        values = [f"{self.sequence}:{i}:".encode() + b"v" * pad for i in range(count)]
        self.sequence += 1
        batch = build_batch(values, timestamps=timestamps, compression=compression)
        self._append(batch, timestamps)

    def _rolls(self, active: Segment, size: int) -> bool:
        """Whether appending ``size`` bytes rolls the non-empty active segment first."""
        return (active.size + size > self.config.segment_bytes
                or self.clock.now - active.rolled_at >= self.config.segment_ms)

    def _append(self, batch: bytes, timestamps: list[int]) -> None:
        assert self.log is not None
        count = len(timestamps)
        active = self.segments[-1]
        if active.batches and self._rolls(active, len(batch)):
            if active.size + len(batch) <= self.config.segment_bytes:
                event("segment rolled by segment.ms")
            active = Segment(self.end)
            self.segments.append(active)
        if not active.batches:
            active.rolled_at = self.clock.now
        info = self.log.append(batch)
        assert (info.first_offset, info.last_offset) == (self.end, self.end + count - 1)
        stored = bytearray(batch)
        stored[0:8] = self.end.to_bytes(8, "big")
        stored[12:16] = (0).to_bytes(4, "big")
        active.batches.append(Batch(self.end, count, bytes(stored), timestamps))

    @rule(data=st.data(), max_bytes=st.sampled_from([1, 3000, 12_000, BIG]))
    def read_at(self, data: st.DataObject, max_bytes: int) -> None:
        assert self.log is not None
        if self.start == self.end:
            assert self.log.read(self.end, max_bytes) is None
            return
        offset = data.draw(st.integers(self.start, self.end - 1), label="offset")
        found = self.log.read(offset, max_bytes)
        assert found is not None
        want = self._containing(offset)
        got = [bytes(v) for _, v in iter_batches(found.read_bytes(), allow_partial_tail=False)]
        assert got[0] == want.data
        assert found.first_offset == want.base
        assert len(got) == 1 or found.length <= max_bytes
        # The following batches are the model's next ones, all from one segment.
        segment = next(s for s in self.segments if want in s.batches)
        i = segment.batches.index(want)
        assert got == [b.data for b in segment.batches[i:i + len(got)]]
        assert found.next_offset == segment.batches[i + len(got) - 1].next

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        assert self.log is not None
        offset = data.draw(st.one_of(st.integers(self.end + 1, self.end + 100),
                                     st.integers(-5, self.start - 1)), label="offset")
        try:
            self.log.read(offset, BIG)
        except OffsetOutOfRangeError as err:
            assert (err.log_start_offset, err.log_end_offset) == (self.start, self.end)
        else:
            raise AssertionError(f"read({offset}) outside [{self.start}, {self.end}] worked")

    @rule()
    def roll(self) -> None:
        assert self.log is not None
        self.log.roll()
        if self.segments[-1].batches:
            self.segments.append(Segment(self.end))

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        assert self.log is not None
        offset = data.draw(st.integers(self.start, self.end + 2), label="truncate offset")
        new_end = self.log.truncate_to(offset)
        if offset >= self.end:
            pass
        elif offset <= self.start:
            self.segments = [Segment(offset)]
            self.start = offset
        else:
            while len(self.segments) > 1 and self.segments[-1].base >= offset:
                self.segments.pop()
            active = self.segments[-1]
            kept = [b for b in active.batches if b.next - 1 < offset]
            if kept and len(kept) < len(active.batches):  # the segment was rebuilt
                active.rolled_at = min(active.rolled_at, max(kept[0].timestamps))
            active.batches = kept
            if self.end < self.start:
                # The batch holding offset began below a mid-batch log start: nothing
                # readable is left, and the log restarts empty at offset.
                self.segments = [Segment(offset)]
                self.start = offset
        assert new_end == self.end

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        assert self.log is not None
        offset = data.draw(st.integers(self.start, self.end), label="new log start")
        assert self.log.delete_records(offset) == offset
        self.start = offset
        while len(self.segments) > 1 and self.segments[0].next <= offset:
            self.segments.pop(0)

    @rule()
    def apply_retention(self) -> None:
        assert self.log is not None
        closed = self.segments[:-1]
        doomed = 0
        if self.config.retention_ms >= 0:
            cutoff = self.clock.now - self.config.retention_ms
            while doomed < len(closed) and max(
                    ts for b in closed[doomed].batches for ts in b.timestamps) < cutoff:
                doomed += 1
            if doomed:
                event("segments deleted by retention.ms")
        if self.config.retention_bytes >= 0:
            excess = sum(s.size for s in self.segments) - self.config.retention_bytes
            removed = sum(s.size for s in closed[:doomed])
            while doomed < len(closed) and excess - removed >= closed[doomed].size:
                removed += closed[doomed].size
                doomed += 1
        expected: list[int] = []
        if doomed:
            new_start = closed[doomed - 1].next
            self.start = max(self.start, new_start)
            while len(self.segments) > 1 and self.segments[0].next <= new_start:
                expected.append(self.segments.pop(0).base)
        assert self.log.apply_retention() == expected

    @rule()
    def flush(self) -> None:
        assert self.log is not None
        self.log.flush()
        assert self.log.recovery_point == self.end

    @rule()
    def reopen_clean(self) -> None:
        assert self.log is not None
        self.log.close()
        self.log = self._open()
        assert self.log.opened_cleanly
        assert self.log.recovered_bytes_truncated == 0
        self._roll_times_after_reopen()

    def _roll_times_after_reopen(self) -> None:
        """A reopened segment's roll time is its first batch's max timestamp."""
        for segment in self.segments:
            if segment.batches:
                segment.rolled_at = max(segment.batches[0].timestamps)

    @rule()
    def reopen_unclean(self) -> None:
        # Drop the object without close: no clean-shutdown marker, unflushed indexes.
        assert self.log is not None
        dropped = weakref.ref(self.log)
        self.log = None
        gc.collect()
        assert dropped() is None, "the dropped log outlived the collection"
        self.log = self._open()
        assert not self.log.opened_cleanly
        assert self.log.recovered_bytes_truncated == 0
        assert self.log.set_aside == []
        if len(self.segments) > 1 and not self.segments[-1].batches:
            self.segments.pop()
        self._roll_times_after_reopen()

    @rule(data=st.data())
    def offset_for_timestamp(self, data: st.DataObject) -> None:
        assert self.log is not None
        records = [(b.base + i, ts) for b in self._batches() for i, ts in enumerate(b.timestamps)
                   if b.base + i >= self.start]
        if records:
            stamps = [ts for _, ts in records]  # not monotonic: producers' clocks differ
            target = data.draw(st.integers(min(stamps) - 5, max(stamps) + 5), label="ts")
        else:
            target = self.timestamp
        expected = next((o for o, ts in records if ts >= target), None)
        assert self.log.offset_for_timestamp(target) == expected

    # ------------------------------------------------------------------ invariants
    @invariant()
    def agrees_with_model(self) -> None:
        log = self.log
        if log is None:
            return
        assert (log.log_start_offset, log.log_end_offset) == (self.start, self.end)
        segments = log.segments
        assert [s.base_offset for s in segments] == [s.base for s in self.segments]
        assert [s.size for s in segments] == [s.size for s in self.segments]
        assert [s.next_offset for s in segments] == [s.next for s in self.segments]
        assert sorted(p.name for p in self.directory.glob("*.log")) == \
            [f"{s.base:020d}.log" for s in self.segments]
        # Every batch from the one holding the log start, byte for byte, in order.
        expected = [b.data for b in self._batches() if b.next > self.start]
        got: list[bytes] = []
        offset = self.start
        while (found := log.read(offset, BIG)) is not None:
            got.extend(bytes(v) for _, v in iter_batches(found.read_bytes(),
                                                          allow_partial_tail=False))
            offset = found.next_offset
        assert got == expected
        assert offset == self.end
        # Offsets are contiguous across the whole model.
        previous = self.segments[0].base
        for model_segment in self.segments:
            assert model_segment.base == previous
            for b in model_segment.batches:
                assert b.base == previous
                previous = b.next

    @invariant()
    def roll_times_agree(self) -> None:
        if self.log is None:
            return
        for segment, model in zip(self.log.segments, self.segments, strict=True):
            if model.batches:
                assert segment.rolled_at_ms == model.rolled_at, segment

    @invariant()
    def indexes_agree_with_the_log(self) -> None:
        if self.log is None:
            return
        for segment, model in zip(self.log.segments, self.segments, strict=True):
            positions: dict[int, Batch] = {}
            at = 0
            for b in model.batches:
                positions[at] = b
                at += len(b.data)
            by_relative = {b.base - model.base: b for b in model.batches}
            for relative, position in zip(segment.offset_index.keys,
                                          segment.offset_index.values, strict=True):
                assert position in positions, f"index entry at {position} is not a batch start"
                assert positions[position].base == model.base + relative
                header = peek_header(os.pread(segment.file.fd, HEADER_SIZE, position))
                assert header.base_offset == model.base + relative
            for timestamp, relative in zip(segment.time_index.keys, segment.time_index.values,
                                           strict=True):
                assert relative in by_relative, "time index names no batch"
                assert max(by_relative[relative].timestamps) == timestamp

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        gc.unfreeze()


class ClockedPartitionLogMachine(PartitionLogMachine):
    """The model with time in play: ``segment.ms`` rolls and ``retention.ms``."""

    @initialize(
        segment_bytes=st.integers(2048, 20_000),
        interval=st.sampled_from([1, 2000, 4096]),
        retention_bytes=st.sampled_from([-1, -1, 15_000]),
        retention_ms=st.sampled_from([-1, 0, 5_000, 5_000, 60_000]),
        segment_ms=st.sampled_from([1, 1, 3_000, 30_000]),
    )
    def start_log(self, segment_bytes: int, interval: int, retention_bytes: int,
                  retention_ms: int, segment_ms: int) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval,
                                retention_bytes=retention_bytes, retention_ms=retention_ms,
                                segment_ms=segment_ms)
        self.log = self._open()

    # Ages and clock steps line up with segment.ms and retention.ms, so records land
    # exactly on the boundaries (off-by-one comparisons) often.
    @rule(ages=st.lists(st.sampled_from([0, 1, 999, 1_000, 2_000, 4_999, 5_000, 20_000]),
                        min_size=1, max_size=8),
          pad=st.integers(0, 300), elapsed=st.sampled_from([0, 0, 1_000, 3_000, 5_000, 20_000]))
    def append(self, ages: list[int], pad: int, elapsed: int) -> None:
        self.clock.now += elapsed  # time passes between appends, as it does
        timestamps = [self.clock.now - age for age in ages]  # producers' clocks lag a bit
        values = [f"{self.sequence}:{i}:".encode() + b"v" * pad for i in range(len(ages))]
        self.sequence += 1
        self._append(build_batch(values, timestamps=timestamps), timestamps)

    @rule(ms=st.sampled_from([0, 1, 999, 1_000, 2_999, 3_000, 5_000, 60_000, 70_000]))
    def advance_clock(self, ms: int) -> None:
        """Time passes and the broker's periodic retention check runs."""
        self.clock.now += ms
        self.apply_retention()

    @rule(retention_ms=st.sampled_from([-1, 0, 1, 1_000, 3_000, 5_000]))
    def alter_retention_ms(self, retention_ms: int) -> None:
        """An operator changes retention.ms (the broker assigns ``log.config``)."""
        assert self.log is not None
        self.config = dataclasses.replace(self.config, retention_ms=retention_ms)
        self.log.config = self.config
        self.apply_retention()


def _settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples, stateful_step_count=35, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


PartitionLogMachine.TestCase.settings = _settings(25)
ClockedPartitionLogMachine.TestCase.settings = _settings(20)  # the suite's 20-minute budget
TestPartitionLogModel = pytest.mark.timeout(120)(PartitionLogMachine.TestCase)
TestClockedPartitionLogModel = pytest.mark.timeout(120)(ClockedPartitionLogMachine.TestCase)
