"""The transaction checker (tests/support/txn_checker.py) catches what it must.

A checker that never fails proves nothing, so every check is shown failing on a
hand-made history, with no broker: an aborted read (final and live), a lost committed
write, a torn transaction (a committed one read in part, an unknown one read in part),
a record read twice and an offset read as two records, a writer's records out of order,
a live read_committed reader served past an open transaction (it skips a committed
record), and a value no writer wrote. The clean history passes, so each check fails for
the planted reason only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.txn_checker import (
    Read,
    Txn,
    TxnHistory,
    check,
    decode_value,
    encode_value,
    exactly_once,
    load,
)

pytestmark = pytest.mark.unit


def _txn(writer: str, n: int, manifest: dict[int, int], outcome: str) -> Txn:
    return Txn(writer, n, tuple(sorted(manifest.items())), outcome)  # type: ignore[arg-type]


class Log:
    """Builds the final read of two partitions by appending records at the next offset."""

    def __init__(self) -> None:
        self.next = {0: 0, 1: 0}
        self.final: list[Read] = []
        self.where: dict[tuple[str, int, int, int], tuple[int, int]] = {}

    def write(self, txn: Txn, *, only: set[int] | None = None,
              control: bool = True) -> None:
        """Append the transaction's records (``only``: just these partitions), then a
        marker's offset (a control record reads as nothing)."""
        manifest = dict(txn.manifest)
        for p, n in txn.manifest:
            if only is not None and p not in only:
                continue
            for i in range(n):
                value = encode_value(txn.writer, txn.txn, p, i, manifest).decode()
                self.where[(txn.writer, txn.txn, p, i)] = (p, self.next[p])
                self.final.append(Read("final", p, self.next[p], value))
                self.next[p] += 1
            if control:
                self.next[p] += 1  # the marker's offset: no record


def _clean() -> tuple[list[Txn], Log]:
    txns = [_txn("w1", 0, {0: 2, 1: 1}, "committed"),
            _txn("w2", 0, {0: 1}, "aborted"),
            _txn("w1", 1, {1: 2}, "committed"),
            _txn("w2", 1, {0: 1, 1: 1}, "unknown"),  # read whole: it committed
            _txn("w2", 2, {1: 1}, "unknown")]  # not read: it aborted
    log = Log()
    log.write(txns[0])
    log.write(txns[2])
    log.write(txns[3])
    return txns, log


def test_values_round_trip() -> None:
    value = encode_value("w7", 12, 3, 4, {3: 5, 0: 1})
    assert value == b"w7|12|3|4|0:1,3:5"
    record = decode_value(value)
    assert record is not None and (record.writer, record.txn, record.partition,
                                   record.index, record.manifest) == \
        ("w7", 12, 3, 4, ((0, 1), (3, 5)))
    assert decode_value(b"garbage") is None and decode_value(None) is None


def test_a_clean_history_passes() -> None:
    txns, log = _clean()
    live = [Read("live-a", r.partition, r.offset, r.value) for r in log.final]
    report = check(TxnHistory(txns, log.final, live))
    assert report.ok, report.render()
    assert (report.committed, report.aborted, report.unknown, report.unknown_committed) == \
        (2, 1, 2, 1)


def test_an_aborted_transaction_read_is_reported() -> None:
    txns, _ = _clean()
    log = Log()
    for txn in (txns[0], txns[1], txns[2], txns[3]):  # the aborted one shows up
        log.write(txn)
    report = check(TxnHistory(txns, log.final))
    assert report.checks() == ["ABORTED-READ"], report.render()
    violation = report.violations[0]
    assert (violation.writer, violation.txn) == ("w2", 0)
    assert f"partition 0 offsets {log.where[('w2', 0, 0, 0)][1]}" in violation.detail


def test_a_lost_committed_transaction_is_reported() -> None:
    txns = [_txn("w1", 0, {0: 2, 1: 1}, "committed"), _txn("w1", 1, {1: 2}, "committed")]
    log = Log()
    log.write(txns[0])
    report = check(TxnHistory(txns, log.final))
    assert report.checks() == ["LOST-WRITE"], report.render()
    assert (report.violations[0].writer, report.violations[0].txn) == ("w1", 1)


def test_a_transaction_read_in_part_is_torn_whatever_its_writer_saw() -> None:
    for outcome in ("committed", "unknown"):
        txns = [_txn("w1", 0, {0: 2, 1: 3}, outcome)]
        log = Log()
        log.write(txns[0], only={0})  # partition 1's part never became visible
        report = check(TxnHistory(txns, log.final))
        assert report.checks() == ["TORN"], report.render()
        assert "2 of 5 records" in report.violations[0].detail
        assert "partition 1 index 0..2" in report.violations[0].detail
    # A record missing inside one partition is torn too.
    txns = [_txn("w1", 0, {0: 3}, "committed")]
    log = Log()
    log.write(txns[0])
    del log.final[1]
    assert check(TxnHistory(txns, log.final)).checks() == ["TORN"]


def test_a_record_read_twice_or_an_offset_read_as_two_records_is_reported() -> None:
    txns, log = _clean()
    again = log.final[0]
    log.final.append(Read("final", again.partition, 99, again.value))
    report = check(TxnHistory(txns, log.final))
    assert report.checks() == ["DUPLICATE"], report.render()
    txns, log = _clean()
    other = log.final[1]
    log.final.append(Read("final-b", log.final[0].partition, log.final[0].offset,
                          other.value))
    assert "DUPLICATE" in check(TxnHistory(txns, log.final)).checks()


def test_a_writers_records_out_of_order_are_reported() -> None:
    txns = [_txn("w1", 0, {0: 1}, "committed"), _txn("w1", 1, {0: 1}, "committed")]
    log = Log()
    log.write(txns[1])
    log.write(txns[0])  # txn 0 lands after txn 1
    report = check(TxnHistory(txns, log.final))
    assert report.checks() == ["ORDER"], report.render()
    assert "txn 0 index 0 at offset 2 follows txn 1 index 0 at offset 0" in \
        report.violations[0].detail


def test_a_live_reader_served_past_an_open_transaction_is_reported() -> None:
    """w1's transaction 0 was open (offsets 0..1 of partition 0) when the reader was
    served w2's later records: it never returns to them, though they committed."""
    txns = [_txn("w1", 0, {0: 2}, "committed"), _txn("w2", 0, {0: 1}, "committed")]
    log = Log()
    log.write(txns[0])
    log.write(txns[1])
    live = [Read("live-a", 0, r.offset, r.value) for r in log.final[2:]]
    report = check(TxnHistory(txns, log.final, live))
    assert report.checks() == ["LIVE"], report.render()
    assert "skipped committed offsets 0..1" in report.violations[0].detail
    # A live reader that saw an aborted record (the final read shows it aborted).
    txns.append(_txn("w3", 0, {0: 1}, "aborted"))
    aborted = Read("live-b", 0, 5, encode_value("w3", 0, 0, 0, {0: 1}).decode())
    live = [Read("live-b", 0, r.offset, r.value) for r in log.final] + [aborted]
    report = check(TxnHistory(txns, log.final, live))
    assert report.checks() == ["ABORTED-READ", "LIVE"], report.render()
    # A reader that stopped early is fine: it only has to agree up to where it got.
    live = [Read("live-c", 0, r.offset, r.value) for r in log.final[:2]]
    assert check(TxnHistory(txns[:2], log.final, live)).ok


def test_a_value_no_writer_wrote_is_reported() -> None:
    txns, log = _clean()
    log.final.append(Read("final", 0, 50, "not a record"))
    log.final.append(Read("final", 1, 51, encode_value("w9", 0, 1, 0, {1: 1}).decode()))
    report = check(TxnHistory(txns, log.final))
    assert report.checks() == ["FOREIGN"] and len(report.violations) == 2, report.render()


def test_load_reads_a_directory_and_takes_the_last_outcome(tmp_path: Path) -> None:
    (tmp_path / "txns-w1.jsonl").write_text(
        json.dumps({"writer": "w1", "txn": 0, "manifest": {"0": 1}, "outcome": "unknown"})
        + "\n" + json.dumps({"writer": "w1", "txn": 0, "manifest": {"0": 1},
                             "outcome": "committed", "started": 1.0, "ended": 2.0})
        + "\n{\"writer\": \"w1\", \"tx")  # torn last line: skipped
    value = encode_value("w1", 0, 0, 0, {0: 1}).decode()
    (tmp_path / "final.jsonl").write_text(
        json.dumps({"reader": "final", "p": 0, "o": 0, "v": value}) + "\n")
    (tmp_path / "live-a.jsonl").write_text(
        json.dumps({"reader": "live-a", "p": 0, "o": 0, "v": value, "t": 3.0}) + "\n")
    history = load(tmp_path)
    assert [t.outcome for t in history.txns] == ["committed"]
    report = check(history)
    assert report.ok and report.live_reads == 1, report.render()


def test_exactly_once_passes_a_clean_output_and_names_each_bad_one() -> None:
    inputs = [b"a", b"b", b"c"]
    assert exactly_once(inputs, [b"C", b"A", b"B"]) == []
    assert [v.check for v in exactly_once(inputs, [b"A", b"B"])] == ["LOST-WRITE"]
    assert [v.check for v in exactly_once(inputs, [b"A", b"B", b"C", b"B"])] == ["DUPLICATE"]
    assert [v.check for v in exactly_once(inputs, [b"A", b"B", b"C", b"x"])] == ["FOREIGN"]
    bad = exactly_once(inputs, [b"A", b"A", None])
    assert [v.check for v in bad] == ["LOST-WRITE", "DUPLICATE", "FOREIGN"]
    assert "e.g. [b'B', b'C']" in bad[0].detail
