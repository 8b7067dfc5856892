"""The Kafka listener's fetch path: the converted-batch cache (brokers/kafka/fetch_cache.py)
on a real on-disk log, and the Fetch answer's own encoder (brokers/kafka/fetch_answer.py)
against kafka-python's generated one, byte for byte, at every version served.

The cache's guarantee: a reader never gets a stale conversion, even when the log is
truncated and another batch is written at the same offset with the same length and
leader epoch (a follower's log after a leader change). The checker is shown to catch a
cache whose key leaves out the CRC."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from brokers.kafka.codec import API_TYPES, VERSIONS, KafkaHeader, encode_answer
from brokers.kafka.fetch_answer import (
    MAX_VERSION,
    MIN_VERSION,
    Aborted,
    FetchAnswer,
    FetchPartition,
    FetchTopic,
)
from brokers.kafka.fetch_cache import KEY_BYTES, ConvertedBatches
from brokers.kafka.records import iter_strata_batches, to_kafka
from brokers.log import LogConfig
from brokers.log.partition_log import PartitionLog
from brokers.log.segment import FileSlice
from wire.record_batch import build_batch

pytestmark = pytest.mark.unit


def _log(path: Path) -> PartitionLog:
    return PartitionLog(path, LogConfig.from_mapping({"segment.bytes": 1 << 20}))


def _batch(tag: bytes, n: int = 5) -> bytes:
    return build_batch([tag + b"-%d" % i for i in range(n)], keys=[b"k%d" % i for i in range(n)],
                       timestamps=[1_000 + i for i in range(n)])


def _slices(log: PartitionLog) -> list[FileSlice]:
    """The whole log as fetches see it (a read stops at its segment's end)."""
    out, offset = [], 0
    while offset < log.log_end_offset:
        found = log.read(offset, 1 << 20)
        assert found is not None
        out.append(found)
        offset = found.next_offset
    return out


def _read(log: PartitionLog, cache: ConvertedBatches) -> list[bytes]:
    return [bytes(b) for found in _slices(log) for b in cache.from_slice("t", 0, found, to_kafka)]


def _truth(log: PartitionLog) -> list[bytes]:
    return [bytes(to_kafka(b)) for found in _slices(log) for b in iter_strata_batches(found)]


def test_hits_are_the_same_bytes_as_converting(tmp_path: Path) -> None:
    log = _log(tmp_path)
    for i in range(6):
        log.append(_batch(b"b%d" % i, n=1 + i * 40))
    cache = ConvertedBatches(1 << 20)
    first = _read(log, cache)
    assert (cache.hits, cache.misses) == (0, 6)
    assert first == _truth(log)
    again = _read(log, cache)
    assert (cache.hits, cache.misses) == (6, 6)
    assert again == first
    # Through ``converted`` (bytes records, not a file slice) the entries are shared.
    found = log.read(0, 1 << 20)
    assert found is not None
    assert [bytes(cache.converted("t", 0, b, to_kafka))
            for b in iter_strata_batches(found.read_bytes())] == first
    assert cache.hits == 12
    # Another partition's batch with the same offsets is another entry.
    assert [bytes(b) for b in cache.from_slice("t", 1, found, to_kafka)] == first
    assert cache.misses == 12


def test_a_partial_batch_at_the_slice_end_is_left_for_the_next_fetch(tmp_path: Path) -> None:
    log = _log(tmp_path)
    for i in range(3):
        log.append(_batch(b"p%d" % i))
    found = log.read(0, 1 << 20)
    assert found is not None
    cut = type(found)(found.file, found.position, found.length - 7, found.first_offset,
                      found.next_offset)
    cache = ConvertedBatches(1 << 20)
    assert [bytes(b) for b in cache.from_slice("t", 0, cut, to_kafka)] == _truth(log)[:2]
    # A slice that runs past the file's end (the file cut under it) ends where it does.
    past = type(found)(found.file, found.position, found.length + 500, found.first_offset,
                       found.next_offset)
    assert [bytes(b) for b in cache.from_slice("t", 0, past, to_kafka)] == _truth(log)


@pytest.mark.parametrize("key_bytes, stale_expected", [(KEY_BYTES, False), (16, True)])
def test_a_batch_rewritten_at_the_same_offset_is_never_served_stale(
        tmp_path: Path, key_bytes: int, stale_expected: bool) -> None:
    """Truncate and rewrite: same offsets, same length, same leader epoch, other
    records. The real key (with the CRC) serves the new batch; a key of the first 16
    bytes (offset, length, epoch: no CRC) serves the old one, which the check catches."""
    log = _log(tmp_path)
    log.append(_batch(b"keep"))
    log.append(_batch(b"AAAA"))
    cache = ConvertedBatches(1 << 20, key_bytes=key_bytes)
    before = _read(log, cache)
    log.truncate_to(5)
    log.append(_batch(b"BBBB"))  # the same length, offsets and epoch as AAAA's batch
    after = _read(log, cache)
    truth = _truth(log)
    assert len(after) == len(truth) == 2 and after[0] == before[0] == truth[0]
    assert len(truth[1]) == len(before[1]) and truth[1] != before[1]
    stale = after[1] != truth[1]
    assert stale is stale_expected


def test_a_kept_batch_is_served_only_for_the_stored_batch_it_names(tmp_path: Path) -> None:
    """``keep`` (a produced batch, as its client sent it): served for the stored batch
    whose head it was filed under, and for no other: not once that batch is rewritten
    at the same offset, not under a head with another leader epoch."""
    log = _log(tmp_path)
    log.append(_batch(b"one"))
    log.append(_batch(b"two"), leader_epoch=0)
    (found,) = _slices(log)
    stored = [bytes(b) for b in iter_strata_batches(found)]
    cache = ConvertedBatches(1 << 20)
    sent = b"as the producer sent it"
    cache.keep("t", 0, stored[1][:KEY_BYTES], sent)
    wrong_epoch = stored[0][:12] + (7).to_bytes(4, "big") + stored[0][16:KEY_BYTES]
    cache.keep("t", 0, wrong_epoch, b"never served")
    assert cache.kept == 2
    assert [bytes(b) for b in cache.from_slice("t", 0, found, to_kafka)] == \
        [_truth(log)[0], sent]
    assert (cache.hits, cache.misses) == (1, 1)
    # Kept again under the same head: replaced, counted once in the bytes.
    held = cache.bytes
    cache.keep("t", 0, stored[1][:KEY_BYTES], b"as the producer sent it!")
    assert cache.bytes == held + 1
    # Rewritten at the same offset (same length and epoch, other records): converted.
    log.truncate_to(5)
    log.append(_batch(b"TWO"))
    assert _read(log, cache) == _truth(log)


def test_the_cache_stays_within_its_bytes_and_forgets_the_oldest(tmp_path: Path) -> None:
    log = _log(tmp_path)
    for i in range(20):
        log.append(_batch(b"%02d" % i, n=50))
    found = log.read(0, 1 << 20)
    assert found is not None
    sizes = [len(to_kafka(b)) for b in iter_strata_batches(found)]
    limit = 5 * (max(sizes) + 200)
    cache = ConvertedBatches(limit)
    assert _read(log, cache) == _truth(log)
    assert cache.bytes <= limit and len(cache) == 5
    cache.hits = cache.misses = 0
    # The last five are kept: reading them again hits; the first ones were evicted.
    last = log.read(15 * 50, 1 << 20)
    assert last is not None
    cache.from_slice("t", 0, last, to_kafka)
    assert (cache.hits, cache.misses) == (5, 0)
    cache.from_slice("t", 0, found, to_kafka)
    assert cache.misses >= 15 and cache.bytes <= limit
    # A value larger than the whole cache is converted, not kept.
    tiny = ConvertedBatches(100)
    assert _read(log, tiny) == _truth(log) and len(tiny) == 0 and tiny.bytes == 0
    # 0 turns the cache off.
    off = ConvertedBatches(0)
    assert not off.enabled
    assert [bytes(off.converted("t", 0, b, to_kafka))
            for b in iter_strata_batches(found)] == _truth(log)
    assert len(off) == 0
    with pytest.raises(ValueError):
        ConvertedBatches(-1)


# ----------------------------------------------------------------------------- answers
def _reference(answer: FetchAnswer, version: int) -> bytes:
    r = API_TYPES[1][1]
    P = r.FetchableTopicResponse.PartitionData
    return bytes(r(throttle_time_ms=answer.throttle_time_ms, error_code=answer.error_code,
                   session_id=answer.session_id, responses=[
        r.FetchableTopicResponse(topic=t.name, partitions=[P(
            partition_index=p.index, error_code=p.error_code,
            high_watermark=p.high_watermark, last_stable_offset=p.last_stable_offset,
            log_start_offset=p.log_start_offset,
            aborted_transactions=None if p.aborted is None else [
                P.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                for a in p.aborted],
            preferred_read_replica=-1, records=b"".join(p.records))
            for p in t.partitions]) for t in answer.topics]).encode(version=version))


def _random_answer(rng: random.Random) -> FetchAnswer:
    topics = []
    for _ in range(rng.randint(0, 3)):
        parts = []
        for _ in range(rng.randint(0, 3)):
            records = [rng.randbytes(rng.choice([0, 7, 100, 16 * 1024, 70_000]))
                       for _ in range(rng.randint(0, 3))]
            aborted = None if rng.random() < 0.5 else [
                Aborted(rng.randint(0, 1 << 40), rng.randint(0, 1 << 40))
                for _ in range(rng.randint(0, 3))]
            parts.append(FetchPartition(
                rng.randint(0, (1 << 31) - 1), rng.choice([0, 1, 3, 6, 74, 87]),
                rng.randint(-1, 1 << 50), rng.randint(-1, 1 << 50), rng.randint(-1, 1 << 50),
                aborted, records))
        topics.append(FetchTopic(rng.choice(["t", "topic-é", "x" * 249]), parts))
    return FetchAnswer(rng.randint(0, 5_000), rng.choice([0, 0, 7]), 0, topics)


def test_fetch_answers_are_kafka_pythons_bytes_at_every_version_served() -> None:
    _low, high, accepted = VERSIONS[1]
    assert (accepted, high) == (MIN_VERSION, MAX_VERSION)
    rng = random.Random(20261130)
    for _ in range(150):
        answer = _random_answer(rng)
        for version in range(MIN_VERSION, MAX_VERSION + 1):
            if version < 7 and answer.error_code:
                continue  # a response-level error has no field before v7
            mine = b"".join(bytes(c) for c in answer.chunks(version))
            assert mine == _reference(answer, version), version
            # Framed: the size prefix counts the header and every chunk.
            header = KafkaHeader(1, version, 99, "c", version >= 12)
            framed = b"".join(bytes(c) for c in encode_answer(header, answer))
            assert int.from_bytes(framed[:4], "big") == len(framed) - 4
            assert framed.endswith(mine)
    with pytest.raises(ValueError):
        FetchAnswer(0, 0, 0, []).chunks(13)


def test_long_records_are_chunks_of_their_own_never_copied() -> None:
    big = os.urandom(100_000)
    answer = FetchAnswer(0, 0, 0, [FetchTopic("t", [
        FetchPartition(0, 0, 10, 10, 0, None, [b"short", big])])])
    chunks = answer.chunks(12)
    assert any(c is big for c in chunks)
    assert b"short" in bytes(chunks[0])


def test_the_broker_side_list_columns_never_import_pandas() -> None:
    """The coordinators write their records as Python lists: building those columns
    must not make pyarrow import pandas (0.3-1 s of a broker's CPU, 60 MB)."""
    code = ("import sys\n"
            "from wire.record_batch import build_batch, decode_batch\n"
            "b = build_batch([b'v', None], keys=[None, b'k'], timestamps=[1, 2])\n"
            "assert decode_batch(b)[1].to_pylist()[1]['key'] == b'k'\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"
