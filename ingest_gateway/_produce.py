"""The produce endpoints, served as plain ASGI in front of the FastAPI app.

``POST /v3/clusters/{cluster_id}/topics/{topic_name}/records`` and ``…/records:batch``
carry nearly all of the gateway's traffic, so they skip Starlette's routing, FastAPI's
dependency resolution and the per-request middleware tasks (profiles showed those at
~80 % of a request's CPU): :class:`GatewayApp` matches the two paths itself and hands
every other request to FastAPI, whose produce routes stay for the OpenAPI schema and
delegate here.

Records take one of two ways to the brokers:

- **Coalesced** (records without headers and without their own timestamp, the common
  case): :class:`Coalescer` gathers the records of concurrent requests per ``(acks, topic,
  partition)`` for ``linger_ms`` (or until ``batch_size`` bytes) and sends them with one
  columnar ``AsyncProducer.send_batch``, so the brokers see large batches and the gateway
  pays no Python future per record. Keyed records get their partition here (Kafka's
  murmur2, as the producer would), so each gathering keeps its records' order and each
  record's offset is its gathering's base offset plus its index.
- **One by one** (any record of the request has headers or a timestamp, and streaming
  mode): ``AsyncProducer.send`` per record, as before.

A record is reported written only after the brokers acknowledged it with the request's
``acks`` (``acks=0``: answered 202, "sent, not acknowledged", offset ``null``); every
other outcome is an error report naming the record.
"""

from __future__ import annotations

import asyncio
import bisect
import codecs
import contextlib
import hashlib
import itertools
import json
import logging
import operator
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl

import msgspec

from ingest_gateway._access import AccessRecorder
from ingest_gateway._auth import Action, GatewayHttpError, Principal
from ingest_gateway._codec import DecodedRecord, decode_base64, decode_record, iso_timestamp
from ingest_gateway._errors import HttpError, from_strata_error
from ingest_gateway._idempotency import Answer
from strata.client import BatchMetadata, BufferFullError, RecordMetadata
from strata.client.producer import RECORD_OVERHEAD
from wire.errors import StrataError
from wire.partitioner import partition_for_key

if TYPE_CHECKING:
    from ingest_gateway._app import GatewayState

__all__ = ["RECORDS_ROUTE", "BATCH_ROUTE", "Coalescer", "GatewayApp", "serve_produce"]

log = logging.getLogger("ingest_gateway")

RECORDS_ROUTE = "/v3/clusters/{cluster_id}/topics/{topic_name}/records"
BATCH_ROUTE = RECORDS_ROUTE + ":batch"
_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}
_JSON = [(b"content-type", b"application/json")]
_NDJSON = [(b"content-type", b"application/x-ndjson")]
_fast_encode = msgspec.json.Encoder().encode


def _encode(value: Any) -> bytes:
    """JSON bytes; strings that are not valid Unicode (lone surrogates, which JSON input
    may carry as ``\\ud800``) are written back escaped, as the standard library does."""
    try:
        return _fast_encode(value)
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()
#: Text that is its own JSON string body (no quote, backslash or control character).
_PLAIN_TEXT = re.compile(r'[^"\\\x00-\x1f\x7f-\uffff]*')


# ---------------------------------------------------------------------------- routing
def match_produce(path: str) -> tuple[str, str, bool] | None:
    """``(cluster_id, topic, is_batch)`` for a produce path, else None."""
    parts = path.split("/")
    if len(parts) != 7 or parts[1] != "v3" or parts[2] != "clusters" or parts[4] != "topics":
        return None
    if parts[6] == "records":
        batch = False
    elif parts[6] == "records:batch":
        batch = True
    else:
        return None
    if not parts[3] or not parts[5]:
        return None
    return parts[3], parts[5], batch


class GatewayApp:
    """The ASGI app uvicorn serves: produce requests here, everything else to FastAPI."""

    def __init__(self, app: Any, drain_delay_s: float = 0.0) -> None:
        #: The FastAPI app (its lifespan creates ``app.state.gateway``).
        self.app = app
        #: Seconds the server keeps serving after SIGTERM (``GatewayConfig.drain_delay_s``).
        self.drain_delay_s = drain_delay_s

    def drain(self) -> None:
        """The shutdown begins (SIGTERM/SIGINT): ``/readyz`` answers 503 from now on. Called
        from the server's signal handler, so it only sets a flag."""
        state = getattr(self.app.state, "gateway", None)
        if state is not None:
            state.draining = True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = match_produce(scope["path"])
            if route is not None:
                await serve_produce(self.app.state.gateway, scope, receive, send, *route)
                return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------------- decoding
class _DataIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: str = "JSON"
    data: Any = msgspec.UNSET


class _EntryIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A record without headers and timestamp (what can be coalesced); ``id`` only in
    batch entries. Anything else fails this decoder and takes the general path."""

    id: Any = msgspec.UNSET
    partition_id: int | None = None
    key: _DataIn | None = None
    value: _DataIn | None = None


class _BatchIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    entries: list[_EntryIn]


class _StringIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: Literal["STRING"]
    data: str


class _StringEntryIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The commonest record: a STRING value, no key, no partition (``null`` allowed for
    both, as in ``_EntryIn``), no headers or timestamp. A body of only these is planned
    without a check per record (the decoder made them); any other shape fails here."""

    value: _StringIn
    id: Any = msgspec.UNSET
    partition_id: None = None
    key: None = None


class _StringBatchIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    entries: list[_StringEntryIn]


_decode_batch = msgspec.json.Decoder(_BatchIn).decode
_decode_string_batch = msgspec.json.Decoder(_StringBatchIn).decode
_decode_string_entry = msgspec.json.Decoder(_StringEntryIn).decode
_decode_entry = msgspec.json.Decoder(_EntryIn).decode
_decode_any = msgspec.json.Decoder().decode


class _NotPlain(Exception):
    """The quick decoder cannot vouch for this body: decode it the general way."""


class _Numbered:
    """``["<name>[0]", "<name>[1]", ...]`` and friends, built once and sliced (a list
    slice is one copy in C; formatting a label per record showed in profiles)."""

    def __init__(self, make: Callable[[int], Any]) -> None:
        self._make = make
        self._items: list[Any] = []

    def first(self, n: int) -> list[Any]:
        if n > len(self._items):
            self._items += [self._make(i) for i in range(len(self._items), max(n, 128))]
        return self._items[:n]


_ENTRY_LABELS = _Numbered(lambda i: f"entries[{i}]")
_RECORD_LABELS = _Numbered(lambda i: f"records[{i}]")
_INDEX_IDS = _Numbered(str)
#: What closes a report in a 207 answer whose entry has no ``id`` of its own.
_INDEX_ID_SUFFIXES = _Numbered(lambda i: f',"id":"{i}"}}')


def _plain_data(data: _DataIn | None) -> tuple[bytes | None, str | None]:
    """What ``_codec._data`` makes of a valid BINARY/STRING/JSON value (byte-identical:
    JSON is re-encoded by the same ``json.dumps``); anything doubtful raises _NotPlain."""
    if data is None:
        return None, None
    kind, raw = data.type, data.data
    if kind == "STRING":
        if raw is None:
            return None, kind
        if type(raw) is str:
            return raw.encode("utf-8"), kind
    elif kind == "BINARY":
        if raw is None:
            return None, kind
        if type(raw) is str:
            try:
                return decode_base64(raw, "data"), kind
            except HttpError:
                pass
    elif kind == "JSON":
        if raw is msgspec.UNSET:
            return None, kind
        if isinstance(raw, str | int | float | bool | list | dict) or raw is None:
            return json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode(), kind
    raise _NotPlain


# ---------------------------------------------------------------------------- plan
@dataclass(slots=True)
class _Plan:
    """The records of one request, as columns; ``errors[i]`` set means record ``i`` is
    not produced and is reported with that error."""

    labels: list[str]
    ids: list[str] | None = None
    partitions: list[int | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    key_info: list[dict[str, Any] | None] = field(default_factory=list)
    value_info: list[dict[str, Any] | None] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    errors: list[HttpError | None] = field(default_factory=list)
    #: Records that need the one-by-one path (headers or own timestamps), if any.
    decoded: list[DecodedRecord | None] | None = None
    #: ``ids`` are the entries' indexes (no entry has an ``id``).
    index_ids: bool = False

    def __len__(self) -> int:
        return len(self.labels)


_INFO: dict[tuple[int, str], dict[str, Any]] = {}


def _info(data: bytes | None, kind: str | None) -> dict[str, Any] | None:
    """The report's ``{size, type}`` of a key or value; shared (never mutated) objects,
    since most records of a workload have the same few sizes."""
    if kind is None:
        return None
    return _info_of_size(0 if data is None else len(data), kind)


def _info_of_size(size: int, kind: str) -> dict[str, Any]:
    """``_info`` of a ``size``-byte key or value."""
    info = _INFO.get((size, kind))
    if info is None:
        if len(_INFO) > 4096:
            _INFO.clear()
        info = _INFO[size, kind] = {"size": size, "type": kind}
    return info


_get_partition = operator.attrgetter("partition_id")
_get_key = operator.attrgetter("key")
_get_value = operator.attrgetter("value")
_get_type = operator.attrgetter("type")
_get_data = operator.attrgetter("data")
_get_id = operator.attrgetter("id")


def _string_infos(sizes: list[int]) -> list[dict[str, Any] | None]:
    """The ``{size, type: STRING}`` infos of values of ``sizes`` bytes (shared objects)."""
    n = len(sizes)
    if not n:
        return []
    first = _info_of_size(sizes[0], "STRING")
    if sizes.count(sizes[0]) == n:
        return [first] * n
    infos = {size: _info_of_size(size, "STRING") for size in set(sizes)}
    return list(map(infos.__getitem__, sizes))


def _plan_ids(plan: _Plan, ids: list[Any]) -> None:
    """``plan.ids`` from the entries' ``id`` fields (UNSET: the entry's index); outside a
    batch there must be none."""
    unset = msgspec.UNSET
    n = len(ids)
    if plan.ids is not None:
        if ids.count(unset) == n:
            plan.ids = _INDEX_IDS.first(n)
            plan.index_ids = True
        else:
            plan.ids = [str(i) if e is unset else str(e) for i, e in enumerate(ids)]
    elif ids.count(unset) != n:
        raise _NotPlain  # "id" is a batch field only: let the codec name it


def plan_strings(entries: list[_StringEntryIn], labels: list[str], batch: bool) -> _Plan:
    """Columns of records the STRING decoder accepted: only the values need work."""
    n = len(entries)
    plan = _Plan(labels, ids=[] if batch else None)
    values: list[bytes | None] = [e.value.data.encode() for e in entries]
    plan.values = values
    plan.sizes = sizes = list(map(len, values))  # type: ignore[arg-type]
    plan.value_info = _string_infos(sizes)
    plan.partitions = [None] * n
    plan.keys = [None] * n
    plan.key_info = [None] * n
    _plan_ids(plan, list(map(_get_id, entries)))
    plan.errors = [None] * n
    return plan


def plan_quick(entries: list[_EntryIn], labels: list[str], batch: bool) -> _Plan:
    """Columns straight from the typed decoder (raises _NotPlain when in doubt).

    Column at a time (``map`` with attribute getters, ``list.count``): a generator or
    comprehension per check cost ~0.1 us per record each, most of a large batch's
    planning in profiles."""
    plan = _Plan(labels, ids=[] if batch else None)
    n = len(entries)
    partitions = plan.partitions = list(map(_get_partition, entries))
    if partitions.count(None) != n and any(p is not None and p < 0 for p in partitions):
        raise _NotPlain
    keys_in = list(map(_get_key, entries))
    values_in = list(map(_get_value, entries))
    datas: list[Any] = []
    if (n and keys_in.count(None) == n and None not in values_in
            and list(map(_get_type, values_in)).count("STRING") == n):
        datas = list(map(_get_data, values_in))
        if set(map(type, datas)) != {str}:
            datas = []
    if datas:
        # the common shape, column by column: STRING values, no keys
        values: list[bytes | None] = list(map(str.encode, datas))
        plan.values = values
        plan.sizes = sizes = list(map(len, values))  # type: ignore[arg-type]
        plan.value_info = _string_infos(sizes)
        plan.keys = [None] * n
        plan.key_info = [None] * n
    else:
        for key_in, value_in in zip(keys_in, values_in, strict=True):
            k, key_kind = _plain_data(key_in)
            v, value_kind = _plain_data(value_in)
            plan.keys.append(k)
            plan.values.append(v)
            plan.key_info.append(_info(k, key_kind))
            plan.value_info.append(_info(v, value_kind))
            plan.sizes.append((0 if k is None else len(k)) + (0 if v is None else len(v)))
    _plan_ids(plan, list(map(_get_id, entries)))
    plan.errors = [None] * n
    return plan


def plan_general(objs: list[Any], labels: list[str], paths: list[str], batch: bool,
                 trailing: HttpError | None = None) -> _Plan:
    """Columns through ``decode_record`` (every error named by its field path)."""
    plan = _Plan([], ids=[] if batch else None, decoded=[])
    assert plan.decoded is not None
    for i, (obj, label, path) in enumerate(zip(objs, labels, paths, strict=True)):
        if plan.ids is not None:
            plan.ids.append(str(obj.get("id", i)) if isinstance(obj, dict) else str(i))
        try:
            record = decode_record(obj, path)
        except HttpError as err:
            _append_failed(plan, label, err)
        else:
            _append_record(plan, label, record)
    if trailing is not None:
        if plan.ids is not None:
            plan.ids.append(str(len(objs)))
        _append_failed(plan, f"records[{len(objs)}]", trailing)
    if not any(r is not None and (r.headers or r.timestamp_ms is not None)
               for r in plan.decoded):
        plan.decoded = None  # all plain: coalesce
    return plan


# ---------------------------------------------------------------------------- coalescer
@dataclass(slots=True)
class _Gathering:
    """Records of concurrent requests bound for the producer together. Its future
    resolves to ``(parts, timestamp)``: each part ``(start, end, outcome)`` covers the
    records ``start .. end-1``, sent as one ``send_batch`` of at most ``batch_size``
    bytes, so a failure (a partition's leader down, a full buffer) is reported only for
    the records it concerns."""

    future: asyncio.Future[tuple[list[_Part], int]]
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    has_keys: bool = False
    size: int = 0
    timer: asyncio.TimerHandle | None = None


#: Bytes per record that ``send_batch`` adds to the key and value bytes when it checks
#: whether a chunk fits ``batch_size`` in one go: ``RECORD_OVERHEAD`` plus its Arrow
#: columns' nbytes (4-byte key and value offsets, 8-byte timestamp, validity bits).
#: Slices cut with this are taken whole; a slice over it sends the same records but
#: through the producer's slower per-chunk size computation (~2x the CPU per call).
SLICE_OVERHEAD = RECORD_OVERHEAD + 17


def _slices(sizes: list[int], total: int, limit: int,
            overhead: int = RECORD_OVERHEAD) -> list[tuple[int, int]]:
    """``(start, end)`` index ranges of at most ``limit`` bytes (with ``overhead`` bytes
    per record); at least one record each. Cut by bisection over the running total, not
    a Python step per record (a gathering can hold thousands)."""
    n = len(sizes)
    if total + n * overhead <= limit:
        return [(0, n)]
    costs = list(itertools.accumulate(map(overhead.__add__, sizes)))
    out = []
    start = 0
    while start < n:
        before = costs[start - 1] if start else 0
        end = max(start + 1, bisect.bisect_right(costs, before + limit, start))
        out.append((start, end))
        start = end
    return out


class SendFailed(Exception):
    """A gathering's ``send_batch`` failed; ``sent`` is False when nothing was queued."""

    def __init__(self, error: BaseException, sent: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.sent = sent


class Coalescer:
    """Gathers coalescable records of all requests of one process into ``send_batch``
    calls, one gathering per ``(acks, topic, partition or None)``.

    A gathering is sent ``linger_ms`` after its first record, as soon as it holds
    ``batch_size`` bytes (counted as ``send_batch`` counts them, ``SLICE_OVERHEAD``), or
    before a request's records that would take it past that (they open the next one), so
    a full gathering travels as one wire batch. Sends of one ``(acks, topic, partition)``
    enter the producer in gathering order (one lock each), so per-partition order is the
    order records arrived in. Runs on the event loop only (no locking beyond that).
    """

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.linger_s = state.config.linger_ms / 1000
        self.batch_size = state.config.batch_size
        self._open: dict[tuple[str, str, int | None], _Gathering] = {}
        self._order: dict[tuple[str, str, int | None], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, acks: str, topic: str, partition: int | None, keys: list[bytes | None],
            values: list[bytes | None], sizes: list[int]) -> tuple[_Gathering, int]:
        """Queue records; returns their gathering and the index of the first of them."""
        where = (acks, topic, partition)
        gathering = self._open.get(where)
        incoming = sum(sizes)
        if gathering is not None and gathering.values and (
                gathering.size + incoming + (len(gathering.values) + len(values))
                * SLICE_OVERHEAD > self.batch_size):
            # these records would take it past one wire batch: send it as it is
            self._close(where, gathering)
            gathering = None
        loop = asyncio.get_running_loop()
        if gathering is None:
            gathering = self._open[where] = _Gathering(loop.create_future())
            if self.linger_s > 0:
                gathering.timer = loop.call_later(self.linger_s, self._close, where, gathering)
            else:
                gathering.timer = loop.call_soon(self._close, where, gathering)  # type: ignore[assignment]
        start = len(gathering.values)
        gathering.values += values
        gathering.keys += keys
        gathering.sizes += sizes
        if not gathering.has_keys:
            gathering.has_keys = keys.count(None) != len(keys)
        gathering.size += incoming
        if gathering.size + len(gathering.values) * SLICE_OVERHEAD >= self.batch_size:
            self._close(where, gathering)
        return gathering, start

    def _close(self, where: tuple[str, str, int | None], gathering: _Gathering) -> None:
        if self._open.get(where) is not gathering:
            return
        del self._open[where]
        if gathering.timer is not None:
            gathering.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._send(where, gathering))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, where: tuple[str, str, int | None], gathering: _Gathering) -> None:
        acks, topic, partition = where
        values, keys = gathering.values, gathering.keys if gathering.has_keys else None
        slices = _slices(gathering.sizes, gathering.size, self.batch_size, SLICE_OVERHEAD)
        parts: list[_Part] = []
        queued: list[tuple[int, int, asyncio.Future[list[BatchMetadata]]]] = []
        timestamp = time.time_ns() // 1_000_000
        try:
            producer = await self.state.producer(acks)
            lock = self._order.get(where)
            if lock is None:
                lock = self._order[where] = asyncio.Lock()
            async with lock:
                for number, (start, end) in enumerate(slices):
                    try:
                        delivery = await producer.send_batch(
                            topic, values[start:end] if len(slices) > 1 else values,
                            keys=(keys[start:end] if len(slices) > 1 else keys)
                            if keys is not None else None,
                            partition=partition, timestamp_ms=timestamp)
                    except BufferFullError as err:
                        accepted = err.records_accepted
                        if accepted and err.accepted is not None:
                            queued.append((start, start + accepted, err.accepted))
                        parts.append((start + accepted, end, SendFailed(err, False)))
                        raise _Stop(slices[number + 1:], err) from None
                    except Exception as err:
                        parts.append((start, end, SendFailed(err, False)))
                        raise _Stop(slices[number + 1:], err) from None
                    queued.append((start, end, delivery))
                    self.state.metrics.batch_records.observe(end - start)
        except _Stop as stop:
            # later slices stay unsent: sending them would put them before the failed ones
            parts += [(start, end, SendFailed(stop.error, False)) for start, end in stop.rest]
        except Exception as err:  # no producer (shutting down, brokers unreachable)
            parts = [(start, end, SendFailed(err, False)) for start, end in slices]
        for start, end, delivery in queued:
            try:
                parts.append((start, end, await delivery))
            except Exception as err:
                parts.append((start, end, SendFailed(err, True)))
        if not gathering.future.done():
            gathering.future.set_result((sorted(parts, key=lambda part: part[0]), timestamp))

    async def close(self, timeout: float) -> None:
        """Send every open gathering now; wait up to ``timeout`` s for their outcomes
        (closing the producer afterwards delivers or fails whatever is still out)."""
        for where, gathering in list(self._open.items()):
            self._close(where, gathering)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


class _Stop(Exception):
    def __init__(self, rest: list[tuple[int, int]], error: BaseException) -> None:
        super().__init__(str(error))
        self.rest = rest
        self.error = error


#: ``(start, end, outcome)`` of one ``send_batch`` of a gathering.
_Part = tuple[int, int, "list[BatchMetadata] | SendFailed"]


def _part_of(parts: list[_Part], index: int) -> tuple[list[BatchMetadata] | SendFailed, int]:
    """The outcome covering record ``index`` of a gathering and the record's index in it."""
    for start, end, outcome in parts:
        if start <= index < end:
            return outcome, index - start
    raise LookupError(f"record {index} is in no part of its gathering")


def _locate(metas: list[BatchMetadata], index: int) -> tuple[BatchMetadata, int] | None:
    """The wire batch holding record ``index`` of a gathering, and the record's index
    within it (a gathering larger than ``batch_size`` travels as several batches)."""
    for meta in metas:
        if index < meta.record_count:
            return meta, index
        index -= meta.record_count
    return None


# ---------------------------------------------------------------------------- producing
Outcome = tuple[int, dict[str, Any], HttpError | None]


@dataclass(slots=True)
class _Uniform:
    """Every record of a request acknowledged in one wire batch, in order: record ``i``
    has offset ``first + i`` (None with acks=0). Answered without a report object per
    record (the common case, and most of a large batch's CPU otherwise)."""

    code: int
    cluster_id: str
    topic: str
    partition: int
    first: int | None
    timestamp: str | None

    def report(self, plan: _Plan, i: int) -> dict[str, Any]:
        return _report(self.code, self.cluster_id, self.topic, self.partition,
                       None if self.first is None else self.first + i, self.timestamp,
                       plan, i)

    def encoded(self, plan: _Plan, suffixes: list[str], separator: str) -> bytes:
        """The records' reports as JSON, ``suffixes[i]`` closing record ``i``'s (``}`` or
        ``,"id":…}``), joined by ``separator``: formatted as text and encoded once (an
        f-string per record costs half of a bytes ``%`` format; the JSON pieces are
        msgspec's UTF-8, so decoding and encoding them again gives the same bytes)."""
        head = _encode({"error_code": self.code, "cluster_id": self.cluster_id,
                        "topic_name": self.topic, "partition_id": self.partition}
                       )[:-1].decode()
        middle = ',"timestamp":' + _encode(self.timestamp).decode() + ',"key":'
        keys = _info_column(plan.key_info)
        values = _info_column(plan.value_info)
        n = len(plan)
        if self.first is not None and keys.count(keys[0]) == n and values.count(values[0]) == n:
            # the usual large batch: records alike but for offset and id, one format each
            head += ',"offset":'
            rest = middle + keys[0] + ',"value":' + values[0]
            return separator.join([
                f"{head}{offset}{rest}{suffix}"
                for offset, suffix in zip(range(self.first, self.first + n), suffixes,
                                          strict=True)]).encode()
        offsets: Iterable[int | str] = (
            ["null"] * n if self.first is None else range(self.first, self.first + n))
        return separator.join([
            f'{head},"offset":{offset}{middle}{key},"value":{value}{suffix}'
            for offset, key, value, suffix in zip(offsets, keys, values, suffixes,
                                                  strict=True)]).encode()


def _report(code: int, cluster_id: str, topic: str, partition: int, offset: int | None,
            timestamp: str | None, plan: _Plan, i: int) -> dict[str, Any]:
    """Record ``i``'s delivery report (the v3 produce answer; ``_Uniform.encoded`` writes
    the same fields in the same order as bytes)."""
    return {"error_code": code, "cluster_id": cluster_id, "topic_name": topic,
            "partition_id": partition, "offset": offset, "timestamp": timestamp,
            "key": plan.key_info[i], "value": plan.value_info[i]}


_INFO_JSON: dict[tuple[int, str], bytes] = {}


def _info_column(infos: list[dict[str, Any] | None]) -> list[str]:
    """``_info_json`` of each, as text, computed once per distinct (shared) info object."""
    if infos.count(None) == len(infos):
        return ["null"] * len(infos)
    if len(set(map(id, infos))) == 1:  # one shared info object: records of one size
        return [_info_json(infos[0]).decode()] * len(infos)
    distinct = {id(info): info for info in infos}
    encoded = {key: _info_json(info).decode() for key, info in distinct.items()}
    return [encoded[id(info)] for info in infos]


def _info_json(info: dict[str, Any] | None) -> bytes:
    if info is None:
        return b"null"
    key = (info["size"], info["type"])
    cached = _INFO_JSON.get(key)
    if cached is None:
        if len(_INFO_JSON) > 4096:
            _INFO_JSON.clear()
        cached = _INFO_JSON[key] = _encode(info)
    return cached


@dataclass(slots=True)
class _Target:
    cluster_id: str
    topic: str
    acks: str
    limit: int


class Produce:
    """Produces a plan's records and turns the outcomes into per-record reports."""

    def __init__(self, state: GatewayState, target: _Target, recorder: AccessRecorder) -> None:
        self.state = state
        self.target = target
        self.recorder = recorder

    def _report_ok(self, plan: _Plan, i: int, partition: int, offset: int,
                   timestamp: int) -> tuple[int, dict[str, Any], HttpError | None]:
        t = self.target
        acked = t.acks != "0"
        if acked:
            self.recorder.records += 1
            self.state.metrics.record_topic(t.topic, plan.sizes[i])
        code = 200 if acked else 202
        return code, _report(code, t.cluster_id, t.topic, partition,
                             offset if acked else None,
                             iso_timestamp(timestamp) if timestamp >= 0 else None, plan, i), None

    def _report_error(self, error: HttpError) -> tuple[int, dict[str, Any], HttpError]:
        self.state.metrics.error(error.error_code)
        if error.status >= 500:
            log.warning("%s", error.message)
        return error.status, error.body(), error

    def size_error(self, label: str, size: int) -> HttpError | None:
        limit = self.target.limit
        if size <= limit:
            return None
        return HttpError(413, f"{label}: {size} bytes of key, value and headers exceed the "
                              f"topic's max.message.bytes={limit}; send a smaller record or "
                              "raise the topic's limit", not_written=True)

    def _check_sizes(self, plan: _Plan) -> None:
        if max(plan.sizes, default=0) <= self.target.limit:
            return
        for i, size in enumerate(plan.sizes):
            if plan.errors[i] is None:
                plan.errors[i] = self.size_error(plan.labels[i], size)

    async def run(self, plan: _Plan) -> list[Outcome] | _Uniform:
        """Produce every valid record of ``plan``: one (status, report, error) each, or a
        ``_Uniform`` when all were acknowledged together."""
        self._check_sizes(plan)
        if plan.decoded is not None:
            return await self._one_by_one(plan)
        return await self._coalesced(plan)

    async def _coalesced(self, plan: _Plan) -> list[Outcome] | _Uniform:
        t = self.target
        state = self.state
        n = len(plan)
        if n == 0:
            return []
        try:
            producer = await state.producer(t.acks)
            partitions = await producer.partitions_for(t.topic)
        except StrataError as err:
            raise from_strata_error(err, topic=t.topic, sent=False) from err
        # target partition of each record: explicit, by key (murmur2), or sticky (None)
        groups: dict[int | None, list[int]] = {}
        if (plan.partitions.count(None) == n and plan.keys.count(None) == n
                and plan.errors.count(None) == n):
            groups[None] = list(range(n))  # no keys, no partitions: all sticky, in order
        for i in range(n if not groups else 0):
            if plan.errors[i] is not None:
                continue
            p = plan.partitions[i]
            if p is not None:
                if p >= partitions:
                    plan.errors[i] = HttpError(
                        404, f"{plan.labels[i]}: partition_id {p} does not exist in topic "
                             f"{t.topic!r} (partitions 0..{partitions - 1})", not_written=True)
                    continue
            elif plan.keys[i] is not None:
                p = partition_for_key(plan.keys[i], partitions)  # type: ignore[arg-type]
            group = groups.get(p)
            if group is None:
                groups[p] = [i]
            else:
                group.append(i)
        placements: list[tuple[_Gathering, int, list[int]]] = []
        coalescer = state.coalescer
        for p, members in groups.items():
            if len(members) == n:
                keys, values, sizes = plan.keys, plan.values, plan.sizes
            else:
                keys = [plan.keys[i] for i in members]
                values = [plan.values[i] for i in members]
                sizes = [plan.sizes[i] for i in members]
            gathering, start = coalescer.add(t.acks, t.topic, p, keys, values, sizes)
            placements.append((gathering, start, members))
        # One wait per gathering (usually one per request), not per record.
        sent: dict[int, tuple[list[_Part], int]] = {}
        for gathering, _, _ in placements:
            if id(gathering) not in sent:
                sent[id(gathering)] = await asyncio.shield(gathering.future)
        acked = t.acks != "0"
        code = 200 if acked else 202
        if len(placements) == 1 and len(placements[0][2]) == n:
            gathering, start, _ = placements[0]
            uniform = self._uniform(sent[id(gathering)], start, n, code)
            if uniform is not None:
                if acked:
                    self.recorder.records += n
                    state.metrics.record_topic(t.topic, sum(plan.sizes), n)
                return uniform
        placed: list[tuple[_Gathering, int] | None] = [None] * n
        for gathering, start, members in placements:
            for position, i in enumerate(members, start):
                placed[i] = (gathering, position)
        stamps: dict[int, str | None] = {}
        out: list[tuple[int, dict[str, Any], HttpError | None]] = []
        good = good_bytes = 0
        for i in range(n):
            error = plan.errors[i]
            where = placed[i]
            if error is None and where is not None:
                parts, timestamp = sent[id(where[0])]
                outcome, index = _part_of(parts, where[1])
                if isinstance(outcome, SendFailed):
                    error = from_strata_error(outcome.error, topic=t.topic,
                                              record=plan.labels[i], sent=outcome.sent)
                else:
                    found = _locate(outcome, index)
                    if found is None:
                        error = HttpError(500, f"{plan.labels[i]}: the producer reported "
                                               "fewer records than were sent; see the log")
                    else:
                        meta, within = found
                        stamp = meta.log_append_time if meta.log_append_time >= 0 else timestamp
                        text = stamps.get(stamp)
                        if text is None:
                            text = stamps[stamp] = iso_timestamp(stamp) if stamp >= 0 else None
                        good += 1
                        good_bytes += plan.sizes[i]
                        out.append((code, _report(
                            code, t.cluster_id, t.topic, meta.partition,
                            meta.base_offset + within if acked else None, text, plan, i), None))
                        continue
            out.append(self._report_error(error or HttpError(500, "internal error: record "
                                                                  "lost; see the log")))
        if acked and good:
            self.recorder.records += good
            state.metrics.record_topic(t.topic, good_bytes, good)
        return out

    def _uniform(self, sent: tuple[list[_Part], int], start: int, n: int, code: int
                 ) -> _Uniform | None:
        """A ``_Uniform`` if records ``start .. start+n-1`` of a gathering were
        acknowledged in one wire batch."""
        parts, timestamp = sent
        outcome, index = _part_of(parts, start)
        if isinstance(outcome, SendFailed) or _part_of(parts, start + n - 1)[0] is not outcome:
            return None
        first, last = _locate(outcome, index), _locate(outcome, index + n - 1)
        if first is None or last is None or first[0] is not last[0]:
            return None
        meta, within = first
        stamp = meta.log_append_time if meta.log_append_time >= 0 else timestamp
        return _Uniform(code, self.target.cluster_id, self.target.topic, meta.partition,
                        meta.base_offset + within if code == 200 else None,
                        iso_timestamp(stamp) if stamp >= 0 else None)

    async def _one_by_one(self, plan: _Plan) -> list[tuple[int, dict[str, Any], HttpError | None]]:
        assert plan.decoded is not None
        pending: list[asyncio.Future[RecordMetadata] | HttpError] = []
        for i, record in enumerate(plan.decoded):
            error = plan.errors[i]
            if error is not None or record is None:
                pending.append(error or HttpError(500, "internal error: record lost"))
                continue
            pending.append(await self.submit(record, plan.labels[i]))
        out = []
        for i, item in enumerate(pending):
            out.append(await self.outcome(plan, i, item))
        return out

    async def submit(self, record: DecodedRecord, label: str
                     ) -> asyncio.Future[RecordMetadata] | HttpError:
        """Queue one record with ``AsyncProducer.send``: its future, or why not."""
        t = self.target
        try:
            producer = await self.state.producer(t.acks)
            return await producer.send(
                t.topic, record.value, key=record.key, headers=record.headers or None,
                partition=record.partition, timestamp_ms=record.timestamp_ms)
        except HttpError as err:
            return err
        except ValueError as err:
            return HttpError(404, f"{label}: partition_id {record.partition} does not exist "
                                  f"in topic {t.topic!r} ({err})", not_written=True)
        except StrataError as err:
            return from_strata_error(err, topic=t.topic, record=label, sent=False)
        except Exception as err:  # never a 500 for the whole request: this record only
            log.exception("%s: producing failed", label)
            return from_strata_error(err, topic=t.topic, record=label, sent=False)

    async def outcome(self, plan: _Plan, i: int,
                      item: asyncio.Future[RecordMetadata] | HttpError
                      ) -> tuple[int, dict[str, Any], HttpError | None]:
        if isinstance(item, HttpError):
            return self._report_error(item)
        try:
            meta = await asyncio.shield(item)
        except StrataError as err:
            return self._report_error(from_strata_error(err, topic=self.target.topic,
                                                        record=plan.labels[i]))
        except Exception as err:
            log.exception("%s: unexpected delivery failure", plan.labels[i])
            return self._report_error(from_strata_error(err, record=plan.labels[i]))
        return self._report_ok(plan, i, meta.partition, meta.offset, meta.timestamp)


# ---------------------------------------------------------------------------- requests
def _acks(query: bytes) -> str:
    if not query:
        return "all"
    acks = "all"
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if name != "acks":
            raise HttpError(422, f"query parameter {name!r} is not known here: a produce "
                                 "request takes acks only")
        found = _ACKS.get(value.strip().lower())
        if found is None:
            raise HttpError(422, f"acks: must be all, -1, 1 or 0, got {value!r}")
        acks = found
    return acks


def check_media(content_type: str) -> None:
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in ("application/json", "application/x-ndjson") and not (
            media.startswith("application/") and media.endswith("+json")):
        raise HttpError(415, f"unsupported Content-Type {media or '(none)'!r}: send "
                             "records as Content-Type: application/json")


def check_length(length: str | None, limit: int) -> None:
    if length is not None and length.isdigit() and int(length) > limit:
        raise HttpError(413, f"request body of {length} bytes is larger than the gateway's "
                             f"limit of {limit} bytes; split it into several requests "
                             "(or stream the records with chunked transfer encoding)")


async def _chunks(receive: Any, recorder: AccessRecorder) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "the client closed the connection before the body ended",
                            not_written=True)
        body = message.get("body", b"")
        recorder.bytes_in += len(body)
        if body:
            yield body
        if not message.get("more_body", False):
            return


async def read_body(receive: Any, limit: int, recorder: AccessRecorder) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if message["type"] == "http.request" and not message.get("more_body", False):
        recorder.bytes_in += len(body)  # the common case: the whole body in one message
        if len(body) > limit:
            raise _body_too_large(limit)
        return bytes(body)
    if message["type"] == "http.disconnect":
        raise HttpError(400, "the client closed the connection before the body ended",
                        not_written=True)
    recorder.bytes_in += len(body)
    parts = [body]
    total = len(body)
    async for chunk in _chunks(receive, recorder):
        total += len(chunk)
        if total > limit:
            raise _body_too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def _body_too_large(limit: int) -> HttpError:
    return HttpError(413, f"request body is larger than the gateway's limit of {limit} "
                          "bytes; split it into several requests")


def parse_concatenated(text: str, first_index: int = 0) -> tuple[list[Any], HttpError | None]:
    """JSON values one after another (whitespace between); the error after the last.
    ``first_index`` numbers the values in error messages (``records[i]``)."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            return out, None
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            index = first_index + len(out)
            return out, HttpError(422, f"records[{index}]: not valid JSON ({err.msg})")
        out.append(value)


def _encoded_size(text: str, start: int, end: int) -> int:
    """UTF-8 size of ``text[start:end]`` (each character is 1 to 4 bytes)."""
    return end - start if text.isascii() else len(text[start:end].encode())


async def stream_objects(chunks: AsyncIterator[bytes], limit: int
                         ) -> AsyncIterator[Any | HttpError]:
    """Top-level JSON values of the body as they arrive (streaming mode); a value larger
    than ``limit`` bytes, or invalid JSON, ends the stream with an ``HttpError``.

    Linear in the body size: values are decoded in place from an index and the buffer is
    cut once per chunk. After a failed attempt (a value not complete yet) the next one
    waits until the text ends with ``}`` or ``]`` or the pending text has doubled, so a
    large record arriving in many chunks is not re-parsed for every chunk.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    buf = ""
    count = 0
    failed_at = 0  # length of the pending text at the last failed attempt
    async for chunk in chunks:
        try:
            buf += utf8.decode(chunk)
        except UnicodeDecodeError as err:
            yield HttpError(422, f"records[{count}]: not valid UTF-8 ({err})")
            return
        pos = 0
        if len(buf) >= 2 * failed_at or buf.rstrip(" \t\r\n")[-1:] in ("}", "]"):
            failed_at = 0
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos >= len(buf):
                    break
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    failed_at = len(buf) - pos  # incomplete (invalid: reported at the end)
                    break
                if end - pos > limit or (4 * (end - pos) > limit
                                         and _encoded_size(buf, pos, end) > limit):
                    yield _too_large_record(limit, count)
                    return
                pos = end
                count += 1
                yield value
        buf = buf[pos:]
        if len(buf) > limit or (4 * len(buf) > limit and _encoded_size(buf, 0, len(buf)) > limit):
            yield _too_large_record(limit, count)
            return
    try:
        buf += utf8.decode(b"", final=True)
    except UnicodeDecodeError as err:
        yield HttpError(422, f"records[{count}]: not valid UTF-8 ({err})")
        return
    values, error = parse_concatenated(buf, count)
    for value in values:
        yield value
    if error is not None:
        yield error


def _too_large_record(limit: int, index: int) -> HttpError:
    return HttpError(413, f"records[{index}] is larger than {limit} bytes, the gateway's "
                          "limit per record in streaming mode; send smaller records",
                     not_written=True)


def _records_plan(body: bytes) -> _Plan:
    """The plan of a ``…/records`` body: one record, or several concatenated."""
    with contextlib.suppress(msgspec.MsgspecError, _NotPlain, UnicodeDecodeError):
        return plan_strings([_decode_string_entry(body)], ["record"], batch=False)
    with contextlib.suppress(msgspec.MsgspecError, _NotPlain, UnicodeDecodeError):
        return plan_quick([_decode_entry(body)], ["record"], batch=False)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HttpError(422, f"body: not valid UTF-8 ({err})") from None
    values, error = parse_concatenated(text)
    if not values and error is None:
        raise HttpError(422, "body: expected a JSON record {key?, value?, ...}",
                        not_written=True)
    if len(values) == 1 and error is None:
        return plan_general(values, ["record"], [""], batch=False)
    if not values and error is not None:
        raise HttpError(422, error.message.replace("records[0]", "body", 1), not_written=True)
    labels = _RECORD_LABELS.first(len(values))
    return plan_general(values, labels, labels, batch=False, trailing=error)


def _batch_plan(body: bytes) -> _Plan:
    """The plan of a ``…/records:batch`` body ``{"entries": [...]}``."""
    with contextlib.suppress(msgspec.MsgspecError):
        strings = _decode_string_batch(body).entries
        return plan_strings(strings, _ENTRY_LABELS.first(len(strings)), batch=True)
    with contextlib.suppress(msgspec.MsgspecError, _NotPlain):
        entries = _decode_batch(body).entries
        return plan_quick(entries, _ENTRY_LABELS.first(len(entries)), batch=True)
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HttpError(422, f"body: not valid JSON ({err})", not_written=True) from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("entries"), list):
        raise HttpError(422, "entries: required, a list of records", not_written=True)
    extra = sorted(set(parsed) - {"entries"})
    if extra:
        raise HttpError(422, f"{extra[0]}: unknown field; expected only entries",
                        not_written=True)
    labels = _ENTRY_LABELS.first(len(parsed["entries"]))
    return plan_general(parsed["entries"], labels, labels, batch=True)


def _single_answer(outcome: Outcome) -> Answer:
    status, report, error = outcome
    return Answer(status, _encode(report), headers=error.headers if error is not None else {},
                  not_written=error is not None and error.not_written)


def _lines_answer(plan: _Plan, outcomes: list[Outcome] | _Uniform) -> Answer:
    if isinstance(outcomes, _Uniform):
        return Answer(200, outcomes.encoded(plan, ["}\n"] * len(plan), ""),
                      media_type="application/x-ndjson")
    return Answer(200, b"".join(_encode(report) + b"\n" for _, report, _ in outcomes),
                  media_type="application/x-ndjson",
                  not_written=all(e is not None and e.not_written for _, _, e in outcomes))


def _batch_answer(plan: _Plan, outcomes: list[Outcome] | _Uniform) -> Answer:
    assert plan.ids is not None
    if isinstance(outcomes, _Uniform):
        if plan.index_ids:
            ids = _INDEX_ID_SUFFIXES.first(len(plan.ids))
        elif _PLAIN_TEXT.fullmatch("".join(plan.ids)):  # nothing to escape: no encoder call
            ids = [f',"id":"{entry_id}"}}' for entry_id in plan.ids]
        else:
            ids = [',"id":' + _encode(entry_id).decode() + "}" for entry_id in plan.ids]
        return Answer(207, b'{"successes":[' + outcomes.encoded(plan, ids, ",")
                      + b'],"failures":[]}')
    successes: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for (status, report, _), entry_id in zip(outcomes, plan.ids, strict=True):
        report["id"] = entry_id
        (failures if status >= 300 else successes).append(report)
    return Answer(207, _encode({"successes": successes, "failures": failures}),
                  not_written=bool(outcomes) and all(e is not None and e.not_written
                                                     for _, _, e in outcomes))


class _Headers:
    __slots__ = ("authorization", "content_length", "content_type", "idempotency_key",
                 "request_id")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.authorization: str | None = None
        self.content_length: str | None = None
        self.content_type = ""
        self.idempotency_key: str | None = None
        self.request_id = ""
        for name, value in raw:
            if name == b"content-type":
                self.content_type = value.decode("latin-1")
            elif name == b"content-length":
                self.content_length = value.decode("latin-1")
            elif name == b"authorization":
                self.authorization = value.decode("latin-1")
            elif name == b"idempotency-key":
                self.idempotency_key = value.decode("latin-1")
            elif name == b"x-request-id":
                self.request_id = value.decode("latin-1")


async def _authenticate(state: GatewayState, headers: _Headers, topic: str,
                        recorder: AccessRecorder) -> Principal | None:
    auth = state.auth
    if auth is None:
        return None
    principal = auth.authenticator.cached(headers.authorization)
    if principal is None:
        # PBKDF2 is slow on purpose: a key not verified yet is checked off the loop.
        principal = await asyncio.get_running_loop().run_in_executor(
            auth.executor, auth.authenticator.authenticate, headers.authorization)
    recorder.key_id = principal.key_id
    auth.authenticator.authorize(principal, Action.PRODUCE, topic)
    return principal


def _charge(state: GatewayState, principal: Principal | None, records: int) -> None:
    """The key's rate limit counts records, so a batch costs what it carries."""
    if state.auth is not None and principal is not None:
        state.auth.rate_limiter.check(principal, max(1, records))


def idempotency_scope(principal: Principal | None, path: str, key: str) -> str:
    return f"{'-' if principal is None else principal.key_id}\x00{path}\x00{key}"


def _fingerprint(acks: str, body: bytes) -> str:
    return hashlib.sha256(acks.encode() + b"\x00" + body).hexdigest()


async def serve_produce(state: GatewayState, scope: dict[str, Any], receive: Any, send: Any,
                        cluster_id: str, topic: str, batch: bool) -> None:
    """Answer one produce request (the whole ASGI exchange, access log and metrics)."""
    headers = _Headers(scope["headers"])
    recorder = AccessRecorder(state.metrics, scope, headers.request_id,
                              BATCH_ROUTE if batch else RECORDS_ROUTE)
    try:
        principal = await _authenticate(state, headers, topic, recorder)
        check_media(headers.content_type)
        acks = _acks(scope.get("query_string", b""))
        limit = state.config.max_request_bytes
        check_length(headers.content_length, limit)
        if not batch and headers.content_length is None and headers.idempotency_key is None:
            await _serve_stream(state, scope, receive, send, recorder, principal,
                                _Target(cluster_id, topic, acks, 0))
            return
        body = await read_body(receive, limit, recorder)
        plan = _batch_plan(body) if batch else _records_plan(body)
        _charge(state, principal, len(plan))

        async def compute() -> Answer:
            cid = await state.check_cluster(cluster_id)
            target = _Target(cid, topic, acks, await state.max_message_bytes(topic))
            outcomes = await Produce(state, target, recorder).run(plan)
            if batch:
                return _batch_answer(plan, outcomes)
            if len(plan) == 1 and plan.labels[0] == "record":
                if isinstance(outcomes, _Uniform):
                    return _single_answer((outcomes.code, outcomes.report(plan, 0), None))
                return _single_answer(outcomes[0])
            return _lines_answer(plan, outcomes)

        if headers.idempotency_key:
            answer, replayed = await state.idempotency.run(
                idempotency_scope(principal, scope["path"], headers.idempotency_key),
                _fingerprint(acks, body), compute)
        else:
            answer, replayed = await compute(), False
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                 for k, v in answer.headers.items()]
        if replayed:
            extra.append((b"idempotent-replayed", b"true"))
        await recorder.respond(send, answer.status, answer.body,
                               [(b"content-type", answer.media_type.encode()), *extra])
    except (HttpError, GatewayHttpError) as err:
        state.metrics.error(err.error_code)
        if not recorder.started:
            await recorder.respond(send, err.status, _encode(err.body()), _JSON + [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in err.headers.items()])
    except Exception as err:
        log.exception("unexpected error on POST %s", scope["path"])
        if not recorder.started:
            error = HttpError(500, f"internal error ({type(err).__name__}); see the gateway log")
            state.metrics.error(500)
            await recorder.respond(send, 500, _encode(error.body()), list(_JSON))
    finally:
        recorder.finish()


async def _serve_stream(state: GatewayState, scope: dict[str, Any], receive: Any, send: Any,
                        recorder: AccessRecorder, principal: Principal | None,
                        target: _Target) -> None:
    """Streaming mode (a chunked body): records are produced one by one as they arrive;
    one report per record, in order. A body with a single record is answered like a
    plain request (its status is the record's)."""
    target.cluster_id = await state.check_cluster(target.cluster_id)
    target.limit = await state.max_message_bytes(target.topic)
    producing = Produce(state, target, recorder)
    plan = _Plan([], decoded=[])
    items: list[asyncio.Future[RecordMetadata] | HttpError] = []

    async def take(obj: Any, label: str, path: str) -> None:
        try:
            _charge(state, principal, 1)
            record = decode_record(obj, path)
        except (HttpError, GatewayHttpError) as err:
            _append_failed(plan, label, _as_http(err))
            items.append(_as_http(err))
            return
        _append_record(plan, label, record)
        error = plan.errors[-1] = producing.size_error(label, record.size)
        items.append(error if error is not None else await producing.submit(record, label))

    # The first record waits for the second (or the end of the body): only then is it
    # known whether this is one record (fields named "value.data") or a stream
    # ("records[0].value.data").
    held: list[Any] = []
    limit = state.config.max_request_bytes
    async for value in stream_objects(_chunks(receive, recorder), limit):
        if held:
            await take(held.pop(), "records[0]", "records[0]")
        label = f"records[{len(items)}]"
        if isinstance(value, HttpError):
            _append_failed(plan, label, value)
            items.append(value)
            break
        if not items:
            held.append(value)
        else:
            await take(value, label, label)
    if held:
        await take(held.pop(), "record", "")
    if not items:
        raise HttpError(422, "body: expected a JSON record {key?, value?, ...}",
                        not_written=True)
    if len(items) == 1:
        answer = _single_answer(await producing.outcome(plan, 0, items[0]))
        await recorder.respond(send, answer.status, answer.body, [
            (b"content-type", b"application/json"),
            *((k.lower().encode("latin-1"), v.encode("latin-1"))
              for k, v in answer.headers.items())])
        return
    # A record refused before it was sent (rate limit, ...) says when to retry in its
    # line; the longest such wait is also the answer's Retry-After.
    waits = [int(item.headers["Retry-After"]) for item in items
             if isinstance(item, HttpError) and item.headers.get("Retry-After", "").isdigit()]
    head = list(_NDJSON)
    if waits:
        head.append((b"retry-after", b"%d" % max(waits)))
    await recorder.start_response(send, 200, head)
    for i, item in enumerate(items):
        _, report, _ = await producing.outcome(plan, i, item)
        await recorder.body(send, _encode(report) + b"\n", more=True)
    await recorder.body(send, b"", more=False)


def _as_http(err: HttpError | GatewayHttpError) -> HttpError:
    if isinstance(err, HttpError):
        return err
    return HttpError(err.status, err.message, error_code=err.error_code, headers=err.headers,
                     not_written=True)


def _append_failed(plan: _Plan, label: str, error: HttpError) -> None:
    plan.labels.append(label)
    for column in (plan.partitions, plan.keys, plan.values, plan.key_info, plan.value_info):
        column.append(None)
    plan.sizes.append(0)
    plan.errors.append(error)
    assert plan.decoded is not None
    plan.decoded.append(None)


def _append_record(plan: _Plan, label: str, record: DecodedRecord) -> None:
    plan.labels.append(label)
    plan.partitions.append(record.partition)
    plan.keys.append(record.key)
    plan.values.append(record.value)
    plan.key_info.append(_info(record.key, record.key_type))
    plan.value_info.append(_info(record.value, record.value_type))
    plan.sizes.append(record.size)
    plan.errors.append(None)
    assert plan.decoded is not None
    plan.decoded.append(record)

