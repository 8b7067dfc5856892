"""The gateway's produce path in pieces (no server): the quick typed decoder must agree
byte for byte with the codec it stands in for, and the transport that sends a response
head with its body must never lose or reorder bytes."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_gateway._coalescer import SLICE_OVERHEAD, Coalescer, SendFailed, byte_slices, part_of
from ingest_gateway._plan import (
    _decode_batch,
    _decode_string_batch,
    _info,
    _NotPlain,
    batch_plan,
    plan_general,
    plan_quick,
    plan_strings,
    records_plan,
)
from ingest_gateway._route import (
    _batch_answer,
    _info_json,
    _lines_answer,
    _Uniform,
    match_produce,
)
from ingest_gateway._server import _HeldHeadersTransport

pytestmark = pytest.mark.integration

_text = st.text(max_size=12)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | _text
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6)
_data = st.one_of(
    st.none(),
    st.fixed_dictionaries({"type": st.just("STRING"), "data": _text | st.none()}),
    st.fixed_dictionaries({"type": st.just("BINARY"),
                           "data": st.binary(max_size=12).map(
                               lambda b: base64.b64encode(b).decode())}),
    st.fixed_dictionaries({"type": st.just("JSON")}, optional={"data": _json_value}),
    st.fixed_dictionaries({}, optional={"data": _json_value}),
    # doubtful shapes: the quick path must hand these to the codec
    st.fixed_dictionaries({"type": st.sampled_from(["XML", "string", ""]), "data": _text}),
    st.fixed_dictionaries({"type": st.just("BINARY"), "data": st.just("%%%")}),
    st.fixed_dictionaries({"type": st.just("STRING"), "data": st.integers()}),
)
_entry = st.fixed_dictionaries({}, optional={
    "id": _text | st.integers(),
    "partition_id": st.integers(-1, 5) | st.none(),
    "key": _data, "value": _data})


def _columns(plan: Any) -> tuple[Any, ...]:
    errors = [None if e is None else (e.status, e.message) for e in plan.errors]
    return (plan.labels, plan.ids, plan.partitions, plan.keys, plan.values, plan.key_info,
            plan.value_info, plan.sizes, errors)


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(_entry, max_size=6))
def test_quick_batch_decoding_agrees_with_the_codec(entries: list[dict[str, Any]]) -> None:
    body = json.dumps({"entries": entries}).encode()
    labels = [f"entries[{i}]" for i in range(len(entries))]
    general = plan_general(entries, labels, labels, batch=True)
    try:
        quick = plan_quick(_decode_batch(body).entries, labels, batch=True)
    except (msgspec.MsgspecError, _NotPlain):
        return  # the codec decides (what batch_plan does)
    assert all(e is None for e in general.errors), "quick path accepted an invalid entry"
    assert _columns(quick) == _columns(general)
    assert _columns(batch_plan(body)) == _columns(general)


def test_plain_shapes_take_the_quick_path() -> None:
    """The property above is not vacuous: these shapes decode without the codec."""
    body = json.dumps({"entries": [
        {"value": {"type": "STRING", "data": "a"}},
        {"id": 7, "partition_id": 1, "key": {"type": "BINARY", "data": "AAE="}, "value": None},
        {"key": {"type": "STRING", "data": "k"}, "value": {"data": {"x": [1, None]}}},
        {}]}).encode()
    quick = plan_quick(_decode_batch(body).entries, ["a", "b", "c", "d"], batch=True)
    assert quick.values == [b"a", None, b'{"x":[1,null]}', None]
    assert quick.keys == [None, b"\x00\x01", b"k", None]
    assert quick.ids == ["0", "7", "2", "3"] and quick.partitions == [None, 1, None, None]
    assert quick.sizes == [1, 2, 15, 0] and quick.decoded is None


@settings(max_examples=200, deadline=None)
@given(record=_entry.filter(lambda e: "id" not in e))
def test_quick_single_record_agrees_with_the_codec(record: dict[str, Any]) -> None:
    general = plan_general([record], ["record"], [""], batch=False)
    assert _columns(records_plan(json.dumps(record).encode())) == _columns(general)


def test_records_bodies_one_many_and_broken() -> None:
    two = records_plan(b'{"value": null} {"value": {"type": "STRING", "data": "b"}}')
    assert two.labels == ["records[0]", "records[1]"] and two.values == [None, b"b"]
    trailing = records_plan(b'{"value": null} {"val')
    assert trailing.labels == ["records[0]", "records[1]"]
    assert trailing.errors[1] is not None and trailing.errors[1].status == 422
    with pytest.raises(Exception, match="body: not valid JSON"):
        records_plan(b'{"value": ')
    with pytest.raises(Exception, match="expected a JSON record"):
        records_plan(b"  ")


@pytest.mark.parametrize(("path", "expected"), [
    ("/v3/clusters/c1/topics/t.x/records", ("c1", "t.x", False)),
    ("/v3/clusters/c1/topics/t/records:batch", ("c1", "t", True)),
    ("/v3/clusters/c1/topics/t/records/", None),
    ("/v3/clusters//topics/t/records", None),
    ("/v3/clusters/c1/topics/t/partitions", None),
    ("/v2/clusters/c1/topics/t/records", None),
])
def test_produce_paths(path: str, expected: tuple[str, str, bool] | None) -> None:
    assert match_produce(path) == expected


class _Wire:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


def test_response_head_goes_out_with_the_body() -> None:
    wire = _Wire()
    transport = _HeldHeadersTransport(wire)  # type: ignore[arg-type]
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    transport.write(head)
    assert wire.writes == []
    transport.write(b"{}")
    assert wire.writes == [head + b"{}"]
    # interim answers are not held; a head without a body is released at the end
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    transport.release()
    assert wire.writes[1:] == [b"HTTP/1.1 100 Continue\r\n\r\n",
                               b"HTTP/1.1 204 No Content\r\n\r\n"]
    # chunked bodies after the first go straight through; close flushes a held head
    transport.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    transport.close()
    assert wire.writes[-1].startswith(b"HTTP/1.1 200 OK") and wire.closed
    assert transport.get_extra_info("peername") == "extra:peername"


def test_report_sizes_stay_right_past_the_caches() -> None:
    """Many distinct record sizes (the info caches are cleared on the way): every
    encoded {size, type} is the record's own."""
    for size in range(0, 12_000, 7):
        info = _info(b"x" * size, "STRING")
        assert json.loads(_info_json(info)) == {"size": size, "type": "STRING"}


def test_a_gathering_is_sent_in_slices_of_batch_size() -> None:
    assert byte_slices([10] * 5, 50, 1000) == [(0, 5)]
    assert byte_slices([100] * 5, 500, 250) == [(0, 2), (2, 4), (4, 5)]
    assert byte_slices([1000, 1], 1001, 100) == [(0, 1), (1, 2)]  # one record over: alone
    failed = SendFailed(RuntimeError("leader gone"), sent=True)
    parts: list[Any] = [(0, 2, ["metas-a"]), (2, 4, failed), (4, 5, ["metas-c"])]
    assert part_of(parts, 1) == (["metas-a"], 1)
    assert part_of(parts, 3) == (failed, 1)
    assert part_of(parts, 4) == (["metas-c"], 0)
    with pytest.raises(LookupError):
        part_of(parts, 5)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 7, 100, 300, 2000]), max_size=40),
       limit=st.integers(1, 3000), overhead=st.sampled_from([0, 16, SLICE_OVERHEAD]))
def test_slices_are_the_greedy_cut(sizes: list[int], limit: int, overhead: int) -> None:
    """The bisection cuts where a record-by-record walk would: each slice is as long as
    fits in ``limit`` (a record alone may exceed it), slices cover every record in order."""
    expected: list[tuple[int, int]] = []
    start = used = 0
    for i, size in enumerate(sizes):
        if i > start and used + size + overhead > limit:
            expected.append((start, i))
            start, used = i, 0
        used += size + overhead
    expected.append((start, len(sizes)))
    assert byte_slices(sizes, sum(sizes), limit, overhead) == expected


def test_string_batch_columns_with_mixed_sizes_and_ids() -> None:
    """The STRING decoder's plan and the column-at-a-time quick path (STRING values, no
    keys): sizes, shared size/type infos, ids (given, partly given, none) and non-ASCII
    text, as the codec makes them."""
    for ids in ([None] * 4, ["a", 3, None, "é"]):
        entries: list[dict[str, Any]] = []
        for entry_id, data in zip(ids, ["", "x" * 100, "é€𝄞", "x" * 100], strict=True):
            entry: dict[str, Any] = {"value": {"type": "STRING", "data": data}}
            if entry_id is not None:
                entry["id"] = entry_id
            entries.append(entry)
        body = json.dumps({"entries": entries}).encode()
        labels = [f"entries[{i}]" for i in range(4)]
        quick = plan_quick(_decode_batch(body).entries, labels, batch=True)
        general = plan_general(entries, labels, labels, batch=True)
        assert _columns(quick) == _columns(general)
        strings = plan_strings(_decode_string_batch(body).entries, labels, batch=True)
        assert _columns(strings) == _columns(general) == _columns(batch_plan(body))
        assert quick.sizes == [0, 100, 9, 100]
        assert quick.value_info[1] is quick.value_info[3]  # one shared info per size


def _coalescer(batch_size: int) -> Coalescer:
    config = SimpleNamespace(linger_ms=1000.0, batch_size=batch_size)
    return Coalescer(SimpleNamespace(config=config))  # type: ignore[arg-type]


def test_a_gathering_is_sent_before_records_that_would_overflow_it() -> None:
    """Requests of 10 records of 100 bytes, batch_size for 25 such records: the third
    request opens a new gathering (the first two, 20 records, go as one wire batch);
    indices restart in the new gathering and nothing is lost or reordered."""
    async def scenario() -> None:
        coalescer = _coalescer(25 * (100 + SLICE_OVERHEAD))
        coalescer._close = lambda where, gathering: coalescer._open.pop(where)  # type: ignore[method-assign]
        values: list[bytes | None] = [b"x" * 100] * 10
        placed = [coalescer.add("all", "t", None, [None] * 10, values, [100] * 10)
                  for _ in range(3)]
        (first, start0), (same, start1), (second, start2) = placed
        assert same is first and second is not first
        assert (start0, start1, start2) == (0, 10, 0)
        assert len(first.values) == 20 and len(second.values) == 10
        # one request larger than a wire batch still goes whole (sliced when sent)
        big, start = coalescer.add("all", "t", None, [None] * 30, [b"x" * 100] * 30,
                                   [100] * 30)
        assert big is not second and start == 0 and "all" not in str(coalescer._open)
        for gathering in (first, second, big):
            gathering.timer.cancel()  # type: ignore[union-attr]

    asyncio.run(scenario())


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(_entry, max_size=6), first=st.none() | st.integers(0, 2**40),
       topic=st.sampled_from(["t", "tópico", 'a"b']),
       stamp=st.none() | st.just("2026-11-22T22:00:00.123Z"))
def test_uniform_answers_are_the_per_record_answers(
        entries: list[dict[str, Any]], first: int | None, topic: str,
        stamp: str | None) -> None:
    """A 207 (or NDJSON) answer formatted from a batch's base offset is byte for byte the
    answer built from one report per record: ids given or not, escaped or not, any sizes
    and types, acks=0 (no offsets)."""
    labels = [f"entries[{i}]" for i in range(len(entries))]
    plan = plan_general(entries, labels, labels, batch=True)
    if not entries or any(e is not None for e in plan.errors):
        return
    code = 200 if first is not None else 202
    uniform = _Uniform(code, "cluster-é", topic, 3, first, stamp)
    reports = [(code, uniform.report(plan, i), None) for i in range(len(entries))]
    assert _batch_answer(plan, uniform).body == _batch_answer(plan, reports).body
    body = json.dumps({"entries": entries}).encode()
    quick = batch_plan(body)
    assert _batch_answer(quick, uniform).body == _batch_answer(plan, reports).body
    plan.ids = None
    lines = [(code, uniform.report(plan, i), None) for i in range(len(entries))]
    assert _lines_answer(plan, uniform).body == _lines_answer(plan, lines).body
