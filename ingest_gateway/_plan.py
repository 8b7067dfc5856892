"""Produce requests parsed and planned: a body becomes a ``Plan``, its records as columns.

Job: everything between the bytes of a produce request and the records to send: the
query (``acks``), the ``Content-Type`` and ``Content-Length`` checks, reading the body
(whole, or streamed value by value for a chunked body), and decoding it into a ``Plan``:
labels, ids, partitions, keys, values, the report's ``{size, type}`` infos, and per record
either an error or (when it has headers or its own timestamp) the decoded record for the
one-by-one path. Nothing here talks to a broker.

Invariants:

- **The quick decoders only ever accept**: a body they cannot vouch for (first the
  STRING-values-only decoder, then the typed one; ``_NotPlain``) goes through
  ``_codec.decode_record``, which is the definition of a valid record, so all three
  paths make the same plan (hypothesis tests hold them equal).
- A plan keeps the request's record order; ``errors[i]`` set means record ``i`` is not
  produced and is answered with that error, naming its field path (``entries[2].value``).
- A body, and in streaming mode each record, larger than the limit is refused (413)
  without reading more of it than the limit.

Thread-safety: plain functions and per-request objects, used on the event loop; the
shared caches (``_INFO``, the label lists) are only ever grown with equal values.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import operator
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl

import msgspec

from ingest_gateway._access import AccessRecorder
from ingest_gateway._codec import DecodedRecord, decode_base64, decode_record
from ingest_gateway._errors import HttpError

__all__ = [
    "INDEX_ID_SUFFIXES",
    "Plan",
    "append_failed",
    "append_record",
    "batch_plan",
    "body_chunks",
    "check_length",
    "check_media",
    "parse_acks",
    "parse_concatenated",
    "plan_general",
    "plan_quick",
    "plan_strings",
    "read_body",
    "records_plan",
    "stream_objects",
]

_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}


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
INDEX_ID_SUFFIXES = _Numbered(lambda i: f',"id":"{i}"}}')


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
class Plan:
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


def _plan_ids(plan: Plan, ids: list[Any]) -> None:
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


def plan_strings(entries: list[_StringEntryIn], labels: list[str], batch: bool) -> Plan:
    """Columns of records the STRING decoder accepted: only the values need work."""
    n = len(entries)
    plan = Plan(labels, ids=[] if batch else None)
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


def plan_quick(entries: list[_EntryIn], labels: list[str], batch: bool) -> Plan:
    """Columns straight from the typed decoder (raises _NotPlain when in doubt).

    Column at a time (``map`` with attribute getters, ``list.count``): a generator or
    comprehension per check cost ~0.1 us per record each, most of a large batch's
    planning in profiles."""
    plan = Plan(labels, ids=[] if batch else None)
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
                 trailing: HttpError | None = None) -> Plan:
    """Columns through ``decode_record`` (every error named by its field path)."""
    plan = Plan([], ids=[] if batch else None, decoded=[])
    assert plan.decoded is not None
    for i, (obj, label, path) in enumerate(zip(objs, labels, paths, strict=True)):
        if plan.ids is not None:
            plan.ids.append(str(obj.get("id", i)) if isinstance(obj, dict) else str(i))
        try:
            record = decode_record(obj, path)
        except HttpError as err:
            append_failed(plan, label, err)
        else:
            append_record(plan, label, record)
    if trailing is not None:
        if plan.ids is not None:
            plan.ids.append(str(len(objs)))
        append_failed(plan, f"records[{len(objs)}]", trailing)
    if not any(r is not None and (r.headers or r.timestamp_ms is not None)
               for r in plan.decoded):
        plan.decoded = None  # all plain: coalesce
    return plan


# ---------------------------------------------------------------------------- requests
def parse_acks(query: bytes) -> str:
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


async def body_chunks(receive: Any, recorder: AccessRecorder) -> AsyncIterator[bytes]:
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
    async for chunk in body_chunks(receive, recorder):
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


def records_plan(body: bytes) -> Plan:
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


def batch_plan(body: bytes) -> Plan:
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



# ---------------------------------------------------------------------------- record by record
def append_failed(plan: Plan, label: str, error: HttpError) -> None:
    plan.labels.append(label)
    for column in (plan.partitions, plan.keys, plan.values, plan.key_info, plan.value_info):
        column.append(None)
    plan.sizes.append(0)
    plan.errors.append(error)
    assert plan.decoded is not None
    plan.decoded.append(None)


def append_record(plan: Plan, label: str, record: DecodedRecord) -> None:
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

