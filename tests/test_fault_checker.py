"""The fault-test checker itself (tests/support/nemesis.py) catches what it must.

A checker that never fails proves nothing, so each anomaly the fault tests look for is
planted here by hand, without any broker: a lost acknowledged record, a duplicate, a
record nobody sent, a reordering, an offset gap, an acknowledged offset holding another
record, a zombie's acknowledgement, and replica files that differ by one byte or do not
reach the high watermark.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.nemesis import (
    PROBE_PRODUCER,
    CheckResult,
    Outcome,
    Workload,
    ZombieProbe,
    check,
    compare_replica_dirs,
    log_prefix,
)
from wire.record_batch import build_batch, set_base_offset

pytestmark = pytest.mark.unit

PARTITIONS = 2


def _workload(sent: dict[tuple[int, int], int | None]) -> Workload:
    """A workload that never ran: ``(producer, seq) -> acknowledged offset or None``."""
    workload = Workload("127.0.0.1:1", "t", PARTITIONS, producers=2)
    for (producer, seq), offset in sent.items():
        outcome = Outcome(producer, seq, workload.partition_of(producer, seq), 0.0)
        if offset is None:
            outcome.error = "DeliveryTimeoutError()"
        else:
            outcome.offset, outcome.acked_at = offset, 1.0
        workload.outcomes[(producer, seq)] = outcome
    return workload


def _clean() -> tuple[Workload, dict[int, list[tuple[int, bytes | None]]]]:
    """Producer 0 seqs 0,2,4 go to p0 and 1,3,5 to p1 (partition = (seq + producer) % 2);
    all acknowledged; read back exactly."""
    sent: dict[tuple[int, int], int | None] = {(0, s): s // 2 for s in range(6)}
    workload = _workload(sent)
    records: dict[int, list[tuple[int, bytes | None]]] = {
        p: [(s // 2, workload.value(0, s)) for s in range(p, 6, 2)] for p in range(PARTITIONS)}
    return workload, records


def _counts(result: CheckResult) -> dict[str, int]:
    return {name: getattr(result, name) for name in (
        "lost", "duplicated", "unexpected", "order_violations", "offset_gaps",
        "offset_mismatches", "zombie_acks")}


def test_a_clean_run_passes() -> None:
    workload, records = _clean()
    result = check(workload, records, {0: 3, 1: 3})
    assert result.ok, result.problems
    assert (result.acknowledged, result.read) == (6, 6)


def test_a_lost_acknowledged_record_is_counted() -> None:
    workload, records = _clean()
    records[0] = records[0][:2]  # seq 4 (p0@2) is gone
    result = check(workload, records, {0: 2, 1: 3})
    assert _counts(result)["lost"] == 1 and not result.ok
    assert any("seq 4" in p for p in result.problems)


def test_duplicates_unexpected_and_reordering_are_counted() -> None:
    workload, records = _clean()
    records[0] = [(0, workload.value(0, 0)), (1, workload.value(0, 4)),
                  (2, workload.value(0, 2)), (3, workload.value(0, 2)),
                  (4, b"someone-else:0:1"), (5, workload.value(0, 99))]
    result = check(workload, records, {0: 6, 1: 3})
    counts = _counts(result)
    assert counts["duplicated"] == 1
    assert counts["order_violations"] == 1  # seq 2 after seq 4
    assert counts["unexpected"] == 2  # a foreign value, a seq that was never sent
    assert counts["offset_mismatches"] == 2  # seq 4 acked at p0@2 read at @1, and seq 2


def test_offset_gaps_and_a_short_read_are_counted() -> None:
    workload, records = _clean()
    records[1] = [records[1][0], records[1][2]]  # offset 1 missing in p1
    result = check(workload, records, {0: 4, 1: 3})  # p0 stops one short of its HW
    assert result.offset_gaps == 2
    assert result.lost == 1  # seq 3 was acknowledged at p1@1


def test_a_failed_send_may_or_may_not_be_present() -> None:
    workload = _workload({(0, 0): 0, (0, 2): None, (0, 4): None})
    records: dict[int, list[tuple[int, bytes | None]]] = {
        0: [(0, workload.value(0, 0)), (1, workload.value(0, 4))], 1: []}
    result = check(workload, records, {0: 2, 1: 0})
    assert result.ok, result.problems
    assert (result.failed_sends, result.failed_but_present) == (2, 1)


def test_a_zombie_acknowledgement_fails_the_check() -> None:
    workload, records = _clean()
    outcome, value = workload.register_probe(0)
    outcome.offset = 3
    records[0].append((3, value))
    probe = ZombieProbe(1, 0, outcome, answer=0)
    result = check(workload, records, {0: 4, 1: 3}, [probe])
    assert outcome.producer == PROBE_PRODUCER
    assert result.lost == 0 and result.zombie_acks == 1 and not result.ok


def _write_log(directory: Path, batches: list[list[bytes]], segment_starts: set[int],
               epoch: int = 0) -> None:
    """Write ``batches`` (values per batch) as segments, a new one at each offset in
    ``segment_starts``."""
    directory.mkdir(parents=True)
    offset = 0
    current: Path | None = None
    for values in batches:
        if current is None or offset in segment_starts:
            current = directory / f"{offset:020d}.log"
            current.write_bytes(b"")
        batch = bytearray(build_batch(values, now_ms=1_700_000_000_000))
        set_base_offset(batch, offset, epoch)
        with current.open("ab") as f:
            f.write(batch)
        offset += len(values)
    (directory / "00000000000000000000.index").write_bytes(b"\0" * 8)  # ignored


BATCHES = [[b"a", b"b"], [b"c"], [b"d", b"e", b"f"], [b"g"]]


def test_replicas_with_other_segment_boundaries_are_identical(tmp_path: Path) -> None:
    _write_log(tmp_path / "r0", BATCHES, {3})
    _write_log(tmp_path / "r1", BATCHES, set())
    _write_log(tmp_path / "r2", [*BATCHES, [b"h"]], {2, 6})  # more above the HW is fine
    dirs = {b: tmp_path / f"r{b}" for b in range(3)}
    assert compare_replica_dirs(dirs, 7) == []
    assert compare_replica_dirs(dirs, 3) == []


def test_a_flipped_byte_or_another_epoch_is_a_divergence(tmp_path: Path) -> None:
    _write_log(tmp_path / "r0", BATCHES, set())
    _write_log(tmp_path / "r1", BATCHES, set(), epoch=1)
    _write_log(tmp_path / "r2", BATCHES, set())
    segment = tmp_path / "r2" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0x01
    segment.write_bytes(bytes(data))
    lines = compare_replica_dirs({b: tmp_path / f"r{b}" for b in range(3)}, 7)
    assert [line.split(" differs")[0] for line in lines] == ["broker 1", "broker 2"], lines
    assert "at byte 15 " in lines[0]  # the leader epoch (int32 at 12..15) of batch 1


@pytest.mark.parametrize(("high_watermark", "words"), [
    (4, "high watermark 4 is not a batch boundary"),
    (9, "log ends at offset 7, below the high watermark 9"),
])
def test_a_log_that_does_not_match_the_high_watermark_is_reported(
        tmp_path: Path, high_watermark: int, words: str) -> None:
    _write_log(tmp_path / "r0", BATCHES, set())
    data, problems = log_prefix(tmp_path / "r0", high_watermark)
    assert [words in p for p in problems] == [True], problems
    assert data


def test_a_missing_replica_directory_is_reported(tmp_path: Path) -> None:
    _write_log(tmp_path / "r0", BATCHES, set())
    lines = compare_replica_dirs({0: tmp_path / "r0", 1: tmp_path / "nope"}, 7)
    assert any("does not exist" in line for line in lines)
