"""Unit tests of the segment index files: ``OffsetIndex``, ``TimeIndex`` and the aborted-
transaction index ``TransactionIndex``.

Real files in ``tmp_path``; the on-disk bytes are read back with ``struct`` using the
layouts documented in ``brokers/log/offset_index.py`` and ``time_index.py``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from brokers.log.index_file import IndexCorruptError
from brokers.log.offset_index import OffsetIndex
from brokers.log.time_index import TimeIndex
from brokers.log.txn_index import AbortedTxn, TransactionIndex

pytestmark = pytest.mark.unit

LIMIT = 2**32


def _offset_index(tmp_path: Path, entries: list[tuple[int, int]]) -> OffsetIndex:
    index = OffsetIndex(tmp_path / "00000000000000000000.index")
    for key, value in entries:
        index.append(key, value)
    return index


# ----------------------------------------------------------------------- offset index

def test_offset_index_persist_layout_and_load(tmp_path: Path) -> None:
    entries = [(0, 0), (5, 4096), (17, 9000), (40_000, 2**32 - 2)]
    index = _offset_index(tmp_path, entries)
    assert not index.path.exists() or index.path.stat().st_size == 0  # lazily written
    index.persist(fsync=False)
    raw = index.path.read_bytes()
    assert len(raw) == 8 * len(entries)
    assert list(struct.iter_unpack(">II", raw)) == entries  # big-endian uint32 pairs

    loaded = OffsetIndex(index.path)
    loaded.load()
    assert list(zip(loaded.keys, loaded.values, strict=True)) == entries
    assert len(loaded) == 4
    loaded.check(LIMIT, LIMIT)


def test_offset_index_persist_appends_only_new_entries(tmp_path: Path) -> None:
    index = _offset_index(tmp_path, [(0, 0), (3, 100)])
    index.persist(fsync=True)
    index.persist(fsync=False)  # nothing new: file unchanged
    assert index.path.stat().st_size == 16
    index.append(9, 250)
    index.persist(fsync=True)
    assert list(struct.iter_unpack(">II", index.path.read_bytes())) == [(0, 0), (3, 100), (9, 250)]
    reloaded = OffsetIndex(index.path)
    reloaded.load()
    reloaded.append(12, 400)
    reloaded.persist(fsync=False)  # a loaded index only appends what it did not load
    assert index.path.stat().st_size == 32


def test_offset_index_clear_and_missing_file(tmp_path: Path) -> None:
    index = _offset_index(tmp_path, [(0, 0), (3, 100)])
    index.persist(fsync=False)
    index.clear()
    assert len(index) == 0
    assert not index.path.exists()  # made again by the next persist
    index.delete()  # deleting a missing index is fine
    assert not index.path.exists()
    index.load()  # a missing file loads as empty
    assert len(index) == 0
    index.append(5, 10)
    index.persist(fsync=False)
    assert index.path.stat().st_size == index.entry.size
    index.clear()
    index.persist(fsync=True)  # nothing to write, but fsync asked: the file exists, empty
    assert index.path.read_bytes() == b""
    index.load()
    assert len(index) == 0
    assert index.lookup(123) == (0, 0)


def test_offset_index_lookup_is_floor(tmp_path: Path) -> None:
    index = _offset_index(tmp_path, [(4, 100), (10, 300), (25, 900)])
    assert index.lookup(0) == (0, 0)  # before every entry: scan from the segment start
    assert index.lookup(3) == (0, 0)
    assert index.lookup(4) == (4, 100)
    assert index.lookup(9) == (4, 100)
    assert index.lookup(10) == (10, 300)
    assert index.lookup(24) == (10, 300)
    assert index.lookup(25) == (25, 900)
    assert index.lookup(2**32 - 1) == (25, 900)


@pytest.mark.parametrize(
    ("entries", "what"),
    [
        ([(0, 0), (5, 100), (3, 200)], "keys out of order"),
        ([(0, 0), (5, 100), (8, 50)], "positions out of order"),
        ([(0, 0), (5, 100), (5, 200)], "duplicate key"),
        ([(0, 0), (5, 100), (7, 100)], "duplicate position"),
    ],
)
def test_offset_index_check_detects_disorder(tmp_path: Path, entries: list[tuple[int, int]],
                                             what: str) -> None:
    index = _offset_index(tmp_path, entries)
    index.persist(fsync=False)
    loaded = OffsetIndex(index.path)
    loaded.load()
    with pytest.raises(IndexCorruptError, match="out of order"):
        loaded.check(LIMIT, LIMIT)


def test_offset_index_check_detects_entries_past_the_log(tmp_path: Path) -> None:
    index = _offset_index(tmp_path, [(0, 0), (5, 100), (9, 2000)])
    index.check(10, 2001)  # within limits
    with pytest.raises(IndexCorruptError, match="past the log"):
        index.check(10, 2000)  # position == log size: points past the last byte
    with pytest.raises(IndexCorruptError, match="past the log"):
        index.check(9, 5000)  # relative offset beyond the key limit


@pytest.mark.parametrize("extra", [1, 3, 7])
def test_offset_index_load_rejects_partial_entry(tmp_path: Path, extra: int) -> None:
    index = _offset_index(tmp_path, [(0, 0), (5, 100)])
    index.persist(fsync=False)
    with open(index.path, "ab") as f:
        f.write(b"\x01" * extra)
    with pytest.raises(IndexCorruptError, match="not a multiple of 8"):
        OffsetIndex(index.path).load()


# ----------------------------------------------------------------------- time index

def _time_index(tmp_path: Path, entries: list[tuple[int, int]]) -> TimeIndex:
    index = TimeIndex(tmp_path / "00000000000000000000.timeindex")
    for key, value in entries:
        index.append(key, value)
    return index


def test_time_index_persist_layout_and_load(tmp_path: Path) -> None:
    entries = [(0, 0), (1_700_000_000_000, 3), (2**62, 2**32 - 1)]
    index = _time_index(tmp_path, entries)
    index.persist(fsync=True)
    raw = index.path.read_bytes()
    assert len(raw) == 12 * len(entries)
    assert list(struct.iter_unpack(">qI", raw)) == entries
    loaded = TimeIndex(index.path)
    loaded.load()
    assert list(zip(loaded.keys, loaded.values, strict=True)) == entries
    assert loaded.last_timestamp == 2**62
    loaded.check(2**63 - 1, LIMIT)


def test_time_index_start_for(tmp_path: Path) -> None:
    index = _time_index(tmp_path, [(100, 0), (200, 7), (300, 20)])
    # The search for the first record >= T may start at the batch of the last entry < T.
    assert index.start_for(50) == 0
    assert index.start_for(100) == 0  # no entry strictly below 100
    assert index.start_for(101) == 0
    assert index.start_for(200) == 0
    assert index.start_for(201) == 7
    assert index.start_for(300) == 7
    assert index.start_for(10**15) == 20
    assert TimeIndex(tmp_path / "empty.timeindex").start_for(5) == 0
    assert TimeIndex(tmp_path / "empty.timeindex").last_timestamp == -1


def test_time_index_check_and_partial_entry(tmp_path: Path) -> None:
    with pytest.raises(IndexCorruptError, match="out of order"):
        _time_index(tmp_path, [(100, 0), (90, 5)]).check(2**63 - 1, LIMIT)
    with pytest.raises(IndexCorruptError, match="out of order"):
        _time_index(tmp_path, [(100, 5), (200, 5)]).check(2**63 - 1, LIMIT)
    with pytest.raises(IndexCorruptError, match="past the log"):
        _time_index(tmp_path, [(100, 0), (200, 50)]).check(2**63 - 1, 50)
    index = _time_index(tmp_path, [(100, 0), (200, 5)])
    index.persist(fsync=False)
    with open(index.path, "ab") as f:
        f.write(b"\x00" * 8)  # 32 bytes: not a multiple of 12
    with pytest.raises(IndexCorruptError, match="not a multiple of 12"):
        TimeIndex(index.path).load()


# ----------------------------------------------------------------------------- txn index


def test_txn_index_appends_persists_lazily_and_reloads(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000100.txnindex")
    index.persist(fsync=True)
    assert not index.path.exists()  # created lazily: most segments never hold one
    index.append(AbortedTxn(7, 90, 105, 90))
    index.append(AbortedTxn(8, 104, 110, 104))
    with pytest.raises(ValueError, match="offset order"):
        index.append(AbortedTxn(9, 100, 108))
    index.persist(fsync=False)
    assert index.path.stat().st_size == 2 * 34
    again = TransactionIndex(index.path)
    again.load()
    again.check(100, 200)
    assert again.entries == index.entries
    # Overlap with a fetched range [start, end): entry 7 covers 90..105.
    assert [e.producer_id for e in again.aborted_in(100, 104)] == [7]
    assert [e.producer_id for e in again.aborted_in(106, 300)] == [8]
    assert [e.producer_id for e in again.aborted_in(0, 90)] == []
    assert [e.producer_id for e in again.aborted_in(0, 91)] == [7]


def test_txn_index_truncates_and_rejects_corrupt_files(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    for pid, (first, last) in enumerate([(0, 3), (2, 5), (6, 9)]):
        index.append(AbortedTxn(pid, first, last))
    index.persist(fsync=False)
    index.truncate_to(5)  # the marker at 5 is gone with the log's tail
    assert [e.last_offset for e in index.entries] == [3]
    reloaded = TransactionIndex(index.path)
    reloaded.load()
    assert [e.last_offset for e in reloaded.entries] == [3]
    reloaded.truncate_to(0)
    assert not index.path.exists()
    index.path.write_bytes(b"\x00" * 33)
    with pytest.raises(IndexCorruptError, match="multiple of 34"):
        TransactionIndex(index.path).load()
    index.path.write_bytes(b"\x00\x05" + b"\x00" * 32)
    with pytest.raises(IndexCorruptError, match="version"):
        TransactionIndex(index.path).load()
    bad = TransactionIndex(index.path)
    bad.entries = [AbortedTxn(1, 5, 50)]
    with pytest.raises(IndexCorruptError, match="outside the segment"):
        bad.check(0, 10)
