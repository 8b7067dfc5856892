"""Log compaction of transactional data (``brokers/log/cleaner.py``, section 4 of its
docstring) on real ``Partition`` directories: a single-replica leader takes
transactional batches and COMMIT/ABORT markers as the broker does, and the cleaner runs
below its last stable offset with a fake clock.

Checked against a model: a read_committed read of the log (the partition's reads and
its aborted list, decoded as the client does) gives, below the cleaned end, the latest
committed or non-transactional record per key, and everything committed above it. Plus
Kafka's marker rules (a marker outlives its transaction's last record by
``delete.retention.ms``, an index entry lives exactly as long as its marker), the last
stable offset as the cleaner's bound, and crash safety of the ``.txnindex`` swap.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from brokers.log import LogConfig
from brokers.log.cleaner import LogCleaner
from brokers.partition import Partition
from wire.errors import InvalidRecordBatchError, LogStorageError
from wire.record_batch import (
    AbortedTransaction,
    BatchHeader,
    ControlType,
    batches_to_table,
    build_batch,
    build_control_batch,
    crc_of,
    iter_batches,
    parse_control,
    stamp_delete_horizon,
    validate,
)

pytestmark = pytest.mark.unit

Record = tuple[int, bytes, bytes | None]  # offset, key, value
RETENTION_MS = 1000


class FakeClock:
    def __init__(self, now: int = 10_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _config(**kw: object) -> LogConfig:
    values: dict[str, str] = {"cleanup.policy": "compact", "segment.bytes": "1500",
                              "index.interval.bytes": "300",
                              "delete.retention.ms": str(RETENTION_MS)}
    values.update({k.replace("_", "."): str(v) for k, v in kw.items()})
    return LogConfig.from_mapping(values)


def _partition(directory: Path, config: LogConfig | None = None) -> Partition:
    p = Partition("t", 0, "id", directory, config or _config(), broker_id=0)
    p.set_state(0, 0, [0], [0])
    return p


@dataclass
class Model:
    """What was written: every data record with its fate (``plain``: not
    transactional; ``open``, ``committed`` or ``aborted``)."""

    records: dict[int, tuple[bytes, bytes | None]] = field(default_factory=dict)
    fate: dict[int, str] = field(default_factory=dict)
    pending: dict[int, list[int]] = field(default_factory=dict)  # pid -> open offsets
    # ABORT markers of transactions with records here: each has an index entry.
    aborts: set[int] = field(default_factory=set)

    def committed(self) -> list[Record]:
        return [(o, *self.records[o]) for o in sorted(self.records)
                if self.fate[o] in ("plain", "committed")]


class Writer:
    """One producer id writing to the partition the way the broker's handlers do."""

    def __init__(self, p: Partition, model: Model, pid: int) -> None:
        self.p, self.model, self.pid = p, model, pid
        self.sequence = 0

    def send(self, rows: list[tuple[bytes, bytes | None]], *, transactional: bool) -> int:
        now = time.time_ns() // 1_000_000  # (retention by time must keep them)
        batch = build_batch([v for _, v in rows], keys=[k for k, _ in rows],
                            timestamps=[now] * len(rows), producer_id=self.pid,
                            producer_epoch=0, base_sequence=self.sequence,
                            transactional=transactional)
        appended = self.p.append_as_leader(batch, verified=True)
        self.sequence += len(rows)
        for i, row in enumerate(rows):
            offset = appended.first_offset + i
            self.model.records[offset] = row
            self.model.fate[offset] = "open" if transactional else "plain"
            if transactional:
                self.model.pending.setdefault(self.pid, []).append(offset)
        return appended.first_offset

    def end(self, commit: bool) -> int:
        control = ControlType.COMMIT if commit else ControlType.ABORT
        offset = self.p.append_marker(self.pid, 0, control, 0)
        assert offset is not None
        if not commit and self.pid in self.model.pending:
            self.model.aborts.add(offset)
        for o in self.model.pending.pop(self.pid, []):
            self.model.fate[o] = "committed" if commit else "aborted"
        return offset


def _read_committed(p: Partition) -> list[Record]:
    """What a read_committed consumer reads from the log start: each read with the
    aborted list of its own range, as the broker answers a fetch."""
    out: list[Record] = []
    offset = p.log.log_start_offset
    while True:
        found = p.read(offset, 4096, committed=True)
        if found is None:
            return out
        aborted = [AbortedTransaction(a.producer_id, a.first_offset)
                   for a in p.aborted_transactions(found.first_offset, found.next_offset)]
        table = batches_to_table(found.read_bytes(), topic="t", partition=0,
                                 start_offset=offset, aborted=aborted)
        out += zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
                   table.column("value").to_pylist(), strict=True)
        assert found.next_offset > offset
        offset = found.next_offset


def _batches(p: Partition) -> list[tuple[BatchHeader, bytes]]:
    out: list[tuple[BatchHeader, bytes]] = []
    for segment in p.log.segments:
        out += [(h, bytes(b)) for h, b in iter_batches(segment.log_path.read_bytes())]
    return out


def _markers(p: Partition) -> dict[int, tuple[int, ControlType, int | None]]:
    """offset -> (producer id, type, delete horizon) of every marker in the log."""
    return {h.base_offset: (h.producer_id, parse_control(b)[0], h.delete_horizon_ms)
            for h, b in _batches(p) if h.is_control}


def _index(p: Partition) -> list[tuple[int, int, int]]:
    return [(e.producer_id, e.first_offset, e.last_offset)
            for s in p.log.segments for e in s.txn_index.entries]


def _expected(model: Model, p: Partition, end: int) -> list[Record]:
    """The read_committed view after a pass over ``[.., end)``: below ``end`` the latest
    committed (or plain) record per key and the range's last record if it is one;
    above it every committed record below the last stable offset. (No tombstones in
    these workloads.)"""
    last = max(h.last_offset for h, _ in _batches(p) if h.base_offset < end)
    committed = model.committed()
    latest = {k: o for o, k, _ in committed if o < end}
    return [(o, k, v) for o, k, v in committed if o < p.last_stable_offset
            and (o >= end or o == last or latest[k] == o)]


def _check_index_matches_markers(p: Partition, model: Model | None = None) -> None:
    """Every index entry has its ABORT marker in the log, of its producer; with the
    model: and every ABORT marker left of a transaction that had records has its entry
    (an entry lives exactly as long as its marker)."""
    markers = _markers(p)
    for pid, _, last in _index(p):
        assert markers.get(last, (None, None, None))[:2] == (pid, ControlType.ABORT), \
            (pid, last, markers)
    if model is not None:
        assert sorted(last for _, _, last in _index(p)) == \
            sorted(o for o in markers if o in model.aborts)


def _clean(p: Partition, cleaner: LogCleaner) -> int:
    """One pass as the broker runs it: snapshot first, then up to the LSO."""
    p.snapshot_producer_state()
    stats = cleaner.clean(p.log, p.last_stable_offset, force=True)
    return -1 if stats is None else stats.cleaned_up_to


def _fill(writer: Writer, n: int, prefix: bytes = b"filler") -> None:
    """Plain records with keys of their own, so segments close."""
    for i in range(n):
        writer.send([(prefix + b"-%d" % i, b"f" * 200)], transactional=False)


# ----------------------------------------------------------------------- the rules

def test_aborted_records_go_then_their_marker_after_delete_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    model = Model()
    p = _partition(tmp_path)
    plain, committer, aborter = (Writer(p, model, pid) for pid in (1, 2, 3))
    plain.send([(b"k1", b"plain")], transactional=False)
    committer.send([(b"k1", b"committed"), (b"k2", b"c2")], transactional=True)
    aborter.send([(b"k1", b"aborted"), (b"k3", b"a3")], transactional=True)
    aborted_first = model.pending[3][0]
    committer.end(commit=True)
    abort_marker = aborter.end(commit=False)
    _fill(plain, 12)
    p.log.roll()
    assert _index(p) == [(3, aborted_first, abort_marker)]
    before = _read_committed(p)
    assert (1, b"k1", b"committed") in before and all(v != b"aborted" for _, _, v in before)

    cleaner = LogCleaner(clock=clock)
    end = _clean(p, cleaner)
    assert end == p.log.log_end_offset
    # The aborted write did not shadow the committed one: k1 is "committed", not gone.
    assert _read_committed(p) == _expected(model, p, end)
    assert (1, b"k1", b"committed") in _read_committed(p)
    data = [h for h, _ in _batches(p) if not h.is_control]
    assert not any(h.producer_id == 3 for h in data)  # the aborted records are gone
    # Its marker and index entry stay this pass (the pass read its records).
    markers = _markers(p)
    assert markers[abort_marker] == (3, ControlType.ABORT, None)
    assert _index(p) == [(3, aborted_first, abort_marker)]

    # The next pass finds no record of it: stamps the horizon, keeps the marker.
    assert cleaner.needs_cleaning(p.log, p.last_stable_offset) is False  # same clock
    clock.now += 1
    assert cleaner.needs_cleaning(p.log, p.last_stable_offset)
    _clean(p, cleaner)
    assert _markers(p)[abort_marker] == (3, ControlType.ABORT, clock.now + RETENTION_MS)
    assert _index(p) == [(3, aborted_first, abort_marker)]
    commit_marker = next(o for o, m in _markers(p).items() if m[0] == 2)
    assert _markers(p)[commit_marker][2] is None  # its records are still there

    # Not before the horizon...
    clock.now += RETENTION_MS
    assert not cleaner.needs_cleaning(p.log, p.last_stable_offset)
    _clean(p, cleaner)
    assert abort_marker in _markers(p)
    # ... but after it: the marker and its index entry go together.
    clock.now += 1
    assert cleaner.needs_cleaning(p.log, p.last_stable_offset)
    p.snapshot_producer_state()
    stats = cleaner.clean(p.log, p.last_stable_offset)
    assert stats is not None and stats.markers_removed == 1
    assert abort_marker not in _markers(p) and _index(p) == []
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    assert _read_committed(p) == _expected(model, p, end)
    p.close()
    # The rewritten .txnindex files are what a reopen finds.
    reopened = _partition(tmp_path)
    assert _index(reopened) == []
    assert _read_committed(reopened) == _expected(model, reopened, end)
    reopened.close()


def test_committed_transactional_records_compact_by_key_and_their_marker_follows(
        tmp_path: Path) -> None:
    clock = FakeClock()
    model = Model()
    p = _partition(tmp_path)
    plain, txn = Writer(p, model, 1), Writer(p, model, 2)
    txn.send([(b"a", b"1"), (b"b", b"1")], transactional=True)
    txn.send([(b"a", b"2")], transactional=True)
    marker = txn.end(commit=True)
    _fill(plain, 10)
    p.log.roll()
    cleaner = LogCleaner(clock=clock)
    end = _clean(p, cleaner)
    assert _read_committed(p) == _expected(model, p, end)
    survivors = {(k, v) for _, k, v in _read_committed(p)}
    assert {(b"a", b"2"), (b"b", b"1")} <= survivors and (b"a", b"1") not in survivors
    # The surviving transactional records keep their producer, epoch and bit; a record
    # cut out of a batch keeps the sequence of its position.
    kept = [h for h, _ in _batches(p) if h.producer_id == 2 and not h.is_control]
    assert all(h.is_transactional for h in kept)
    assert sorted(h.base_sequence for h in kept) == [1, 2]

    # Newer plain writes supersede every record of the transaction: the marker stays
    # for that pass, is stamped by the next and removed after delete.retention.ms.
    plain.send([(b"a", b"3"), (b"b", b"3")], transactional=False)
    _fill(plain, 10, b"more")
    p.log.roll()
    clock.now += 1
    end = _clean(p, cleaner)
    assert not [h for h, _ in _batches(p) if h.producer_id == 2 and not h.is_control]
    assert _markers(p)[marker][2] is None
    clock.now += 1
    assert cleaner.needs_cleaning(p.log, p.last_stable_offset)
    _clean(p, cleaner)
    assert _markers(p)[marker][2] == clock.now + RETENTION_MS
    clock.now += RETENTION_MS + 1
    assert cleaner.needs_cleaning(p.log, p.last_stable_offset)
    _clean(p, cleaner)
    assert marker not in _markers(p)
    assert _read_committed(p) == _expected(model, p, end)
    p.close()


def test_nothing_at_or_past_the_last_stable_offset_is_cleaned(tmp_path: Path) -> None:
    clock = FakeClock()
    model = Model()
    p = _partition(tmp_path)
    plain, open_txn, aborter = Writer(p, model, 1), Writer(p, model, 2), Writer(p, model, 3)
    plain.send([(b"k", b"old")], transactional=False)
    _fill(plain, 8)
    open_first = open_txn.send([(b"k", b"open")], transactional=True)
    # After the open transaction's first record: an aborted transaction, superseded
    # plain records, closed segments; all at or past the LSO.
    aborter.send([(b"x", b"aborted")], transactional=True)
    aborter.end(commit=False)
    plain.send([(b"k", b"newer")], transactional=False)
    _fill(plain, 8)
    plain.send([(b"k", b"newest")], transactional=False)
    p.log.roll()
    assert p.last_stable_offset == open_first < p.high_watermark
    untouchable = {s.log_path.name: s.log_path.read_bytes() for s in p.log.segments
                   if s.next_offset > open_first}
    cleaner = LogCleaner(clock=clock)
    end = _clean(p, cleaner)
    assert end <= open_first
    for name, data in untouchable.items():  # byte for byte as they were
        assert (tmp_path / name).read_bytes() == data
    assert _read_committed(p) == _expected(model, p, end)  # "old" still there: LSO bound
    assert any(v == b"old" for _, _, v in _read_committed(p))

    # The transaction commits: the LSO moves on and the next pass cleans it all.
    open_txn.end(commit=True)
    p.log.roll()
    end = _clean(p, cleaner)
    assert end == p.log.log_end_offset
    assert _read_committed(p) == _expected(model, p, end)
    assert [v for _, k, v in _read_committed(p) if k == b"k"] == [b"newest"]
    assert not [h for h, _ in _batches(p) if h.producer_id == 3 and not h.is_control]
    p.close()


def test_retention_moving_the_log_start_past_an_open_transaction(tmp_path: Path) -> None:
    model = Model()
    p = _partition(tmp_path, LogConfig.from_mapping({"segment.bytes": "1500"}))
    plain, txn, aborter = Writer(p, model, 1), Writer(p, model, 2), Writer(p, model, 3)
    aborter.send([(b"a", b"aborted-early")], transactional=True)
    txn_first = txn.send([(b"t", b"in-txn-1")], transactional=True)
    _fill(plain, 20)
    aborter.send([(b"a", b"aborted-late")], transactional=True)
    txn.send([(b"t", b"in-txn-2")], transactional=True)
    abort = aborter.end(commit=False)
    p.log.roll()
    # retention.bytes keeps the segments from the one with the late aborted record on.
    keep_from = max(s.base_offset for s in p.log.segments if s.base_offset <= abort - 1)
    kept = sum(s.size for s in p.log.segments if s.base_offset >= keep_from)
    p.set_config(LogConfig.from_mapping({"segment.bytes": "1500",
                                         "retention.bytes": str(kept)}))
    deleted = p.log.apply_retention(before_delete=p.snapshot_producer_state)
    assert deleted and p.log.log_start_offset > txn_first
    # The LSO is the log start (Kafka's clamp), and read_committed readers wait there.
    assert p.last_stable_offset == p.log.log_start_offset
    assert _read_committed(p) == []
    # The deleted segments' .txnindex files went with them; the aborted transaction's
    # entry (its marker survives) still names its first offset, below the log start.
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".txnindex")
                and int(f[:20]) < p.log.log_start_offset]
    assert _index(p) == [(3, 0, abort)]
    txn.end(commit=True)
    got = _read_committed(p)
    values = [v for _, _, v in got]
    # The rest of the committed transaction shows; nothing of the aborted one does.
    assert b"in-txn-2" in values and b"in-txn-1" not in values
    assert not any(v is not None and v.startswith(b"aborted") for v in values)
    p.close()


# ----------------------------------------------------------------------- model check

@pytest.mark.parametrize("seed", range(6))
def test_model_check_read_committed_view_and_index(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    model = Model()
    p = _partition(tmp_path)
    writers = [Writer(p, model, pid) for pid in range(1, 5)]
    cleaner = LogCleaner(clock=clock)
    end = -1
    for step in range(160):
        writer = rng.choice(writers)
        roll = rng.random()
        if writer.pid in model.pending and rng.random() < 0.3:
            writer.end(commit=rng.random() < 0.6)
        else:
            rows = [(f"k{rng.randrange(8)}".encode(), f"v{step}-{i}".encode() * 5)
                    for i in range(rng.randint(1, 4))]
            transactional = writer.pid != 1  # producer 1 writes plain records only
            writer.send(rows, transactional=transactional)
        if roll < 0.08:
            p.log.roll()
        if rng.random() < 0.12:
            clock.now += rng.choice([0, 400, RETENTION_MS + 1])
            lso_before = p.last_stable_offset
            frozen = {s.log_path.name: s.log_path.read_bytes() for s in p.log.segments
                      if s.next_offset > lso_before}
            cleaned = _clean(p, cleaner)
            if cleaned >= 0:
                end = max(end, cleaned)
                assert cleaned <= lso_before
            for name, data in frozen.items():
                assert (tmp_path / name).read_bytes() == data, name
            _check_index_matches_markers(p, model)
            # No aborted record is left below the cleaned end (but the range's last).
            if end >= 0:
                last = max(h.last_offset for h, _ in _batches(p) if h.base_offset < end)
                aborted_left = [o for h, _ in _batches(p) if not h.is_control
                                and h.base_offset < end
                                for o in range(h.base_offset, h.next_offset)
                                if model.fate.get(o) == "aborted" and o != last]
                assert aborted_left == []
        if end >= 0:
            assert _read_committed(p) == _expected(model, p, end)
    for writer in writers:  # everything decided; time passes; a few passes converge
        if writer.pid in model.pending:
            writer.end(commit=False)
    p.log.roll()
    for _ in range(4):
        clock.now += RETENTION_MS + 1
        end = max(end, _clean(p, cleaner))
    assert _read_committed(p) == _expected(model, p, end)
    _check_index_matches_markers(p, model)
    # Every marker left before the last one has transactional records left (or is
    # inside its horizon: none here, time moved past every one).
    markers = _markers(p)
    data_pids = {h.producer_id for h, _ in _batches(p) if not h.is_control}
    last_offset = max(h.last_offset for h, _ in _batches(p))
    assert all(pid in data_pids for o, (pid, _, _) in markers.items() if o != last_offset)
    p.close()
    reopened = _partition(tmp_path)
    assert _read_committed(reopened) == _expected(model, reopened, end)
    _check_index_matches_markers(reopened, model)
    reopened.close()


# ----------------------------------------------------------------------- crash safety

def _prepared(tmp_path: Path) -> tuple[Partition, Model, FakeClock]:
    """Two aborted and two committed transactions spread over closed segments, their
    aborted records removed by a first pass and their markers stamped by a second, so
    the third pass (the one crashed below) removes markers and rewrites .txnindex."""
    clock = FakeClock()
    model = Model()
    p = _partition(tmp_path, _config(segment_bytes=4000))  # markers share segments
    plain = Writer(p, model, 1)
    for round_ in range(2):
        for pid, commit in ((2, True), (3, False)):
            writer = Writer(p, model, pid)
            writer.sequence = round_ * 2
            writer.send([(b"t%d" % pid, b"r%d" % round_), (b"u", b"x" * 100)],
                        transactional=True)
            writer.end(commit)
            _fill(plain, 4, b"f%d-%d" % (round_, pid))
    _fill(plain, 4, b"tail")
    p.log.roll()
    cleaner = LogCleaner(clock=clock)
    _clean(p, cleaner)
    clock.now += 1
    _clean(p, cleaner)
    clock.now += RETENTION_MS + 1
    p.log.flush()
    return p, model, clock


@pytest.mark.parametrize("fail_at", range(22))
def test_a_crash_at_any_rename_leaves_a_consistent_aborted_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    p, model, clock = _prepared(tmp_path)
    before = _read_committed(p)
    index_before = _index(p)
    assert index_before and all(m[2] is not None for m in _markers(p).values()
                                if m[1] is ControlType.ABORT)
    real_replace = os.replace
    calls = [0]

    def replace(src: str | Path, dst: str | Path) -> None:
        if calls[0] == fail_at:
            raise OSError(5, "simulated crash")
        calls[0] += 1
        real_replace(src, dst)

    p.snapshot_producer_state()
    monkeypatch.setattr(os, "replace", replace)
    try:
        LogCleaner(clock=clock).clean(p.log, p.last_stable_offset)
        crashed = False
    except LogStorageError:
        crashed = True
    monkeypatch.setattr(os, "replace", real_replace)
    reopened = _partition(tmp_path)  # no close: a crash
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    # Whatever was swapped in, each segment's index matches its markers, and a
    # read_committed read gives what it gave before (the pass removed only markers).
    _check_index_matches_markers(reopened, model)
    assert _read_committed(reopened) == before
    if not crashed:
        assert _index(reopened) == []
    # Cleaning again after the crash finishes the job.
    reopened.snapshot_producer_state()
    LogCleaner(clock=clock).clean(reopened.log, reopened.last_stable_offset, force=True)
    clock.now += RETENTION_MS + 1
    LogCleaner(clock=clock).clean(reopened.log, reopened.last_stable_offset, force=True)
    assert _index(reopened) == []
    assert _read_committed(reopened) == before
    reopened.close()


def test_a_lost_txnindex_is_rebuilt_from_the_cleaned_log(tmp_path: Path) -> None:
    """A .txnindex that does not read back makes the partition replay its whole log.
    The replay finds the transactions that still have records; an entry whose records
    the cleaner already removed is not found again (its marker closes no open
    transaction), which no read can tell: no fetch returns a record it covers."""
    p, _, _ = _prepared(tmp_path)
    expected = _read_committed(p)
    p.close()
    for path in tmp_path.glob("*.txnindex"):
        path.write_bytes(path.read_bytes() + b"\0")  # torn: not a multiple of 34 bytes
    reopened = _partition(tmp_path)
    _check_index_matches_markers(reopened)
    assert _read_committed(reopened) == expected
    reopened.close()


def test_a_delete_horizon_is_stamped_on_markers_only() -> None:
    marker = bytearray(build_control_batch(7, 0, ControlType.ABORT, 3, 1_000))
    assert validate(bytes(marker)).delete_horizon_ms is None
    stamp_delete_horizon(marker, 5_000)
    header = validate(bytes(marker))  # CRC recomputed; first > max timestamp allowed
    assert header.delete_horizon_ms == 5_000 and header.max_timestamp == 1_000
    assert parse_control(marker) == (ControlType.ABORT, 3)
    data = bytearray(build_batch([b"v"], keys=[b"k"]))
    data[22] |= 0x80  # the attributes' low byte: bit 7
    data[17:21] = crc_of(data).to_bytes(4, "big")
    with pytest.raises(InvalidRecordBatchError, match="delete-horizon attribute bit"):
        validate(bytes(data))
