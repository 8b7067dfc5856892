"""The produce route: the two produce endpoints as plain ASGI, in front of FastAPI.

Job: answer ``POST /v3/clusters/{cluster_id}/topics/{topic_name}/records`` and
``…/records:batch``, which carry nearly all of the gateway's traffic, so they skip
Starlette's routing, FastAPI's dependency resolution and the per-request middleware tasks
(profiles showed those at ~80 % of a request's CPU): :class:`GatewayApp` matches the two
paths itself and hands every other request to FastAPI, whose produce routes stay for the
OpenAPI schema and delegate here (``serve_produce``). One request: authenticate and
authorize, check the query and headers, plan the body (``_plan``), charge the rate limit
(one per record), produce the plan (``Produce``), and answer per record, byte for byte
the v3 shape, with the access log line and metrics; an ``Idempotency-Key`` wraps
everything after the plan.

Records take one of two ways to the brokers:

- **Coalesced** (records without headers and without their own timestamp, the common
  case): the ``Coalescer`` (``_coalescer``) gathers the records of concurrent requests
  per ``(acks, topic, partition)`` and sends them with one ``AsyncProducer.send_batch``.
  Keyed records get their partition here (Kafka's murmur2, as the producer would), so
  each gathering keeps its records' order and each record's offset is its gathering's
  base offset plus its index.
- **One by one** (any record of the request has headers or a timestamp, and streaming
  mode): ``AsyncProducer.send`` per record.

Invariants: a record is reported written only after the brokers acknowledged it with the
request's ``acks`` (``acks=0``: answered 202, "sent, not acknowledged", offset ``null``);
every other outcome is an error report naming the record, never a silent drop. A 503
after the record was queued says it may or may not have been written.

Thread-safety: event loop only; the shared producers and the coalescer live in
``GatewayState`` (one per worker process).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa

from ingest_gateway._access import AccessRecorder
from ingest_gateway._auth import Action, Principal
from ingest_gateway._coalescer import Gathering, Part, SendFailed, byte_slices, locate, part_of
from ingest_gateway._codec import DecodedRecord, decode_record, iso_timestamp
from ingest_gateway._errors import HttpError, from_strata_error
from ingest_gateway._idempotency import Answer
from ingest_gateway._plan import (
    INDEX_ID_SUFFIXES,
    Plan,
    append_failed,
    append_record,
    batch_plan,
    body_chunks,
    check_length,
    check_media,
    parse_acks,
    read_body,
    records_plan,
    stream_objects,
)
from strata.client import (
    RECORD_OVERHEAD,
    AsyncProducer,
    BatchMetadata,
    BufferFullError,
    RecordMetadata,
    TypedValue,
)
from wire.errors import SchemaMismatchError, StrataError
from wire.partitioner import partition_for_key
from wire.record_batch import MAX_RECORDS_PER_BATCH
from wire.schema import ParsedSchema, records_to_arrow

if TYPE_CHECKING:
    from ingest_gateway._state import GatewayState

__all__ = ["BATCH_ROUTE", "RECORDS_ROUTE", "GatewayApp", "Produce", "match_produce",
           "serve_produce"]

log = logging.getLogger("strata.gateway.produce")

RECORDS_ROUTE = "/v3/clusters/{cluster_id}/topics/{topic_name}/records"
BATCH_ROUTE = RECORDS_ROUTE + ":batch"
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

    def report(self, plan: Plan, i: int) -> dict[str, Any]:
        return _report(self.code, self.cluster_id, self.topic, self.partition,
                       None if self.first is None else self.first + i, self.timestamp,
                       plan, i)

    def encoded(self, plan: Plan, suffixes: list[str], separator: str) -> bytes:
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
            timestamp: str | None, plan: Plan, i: int) -> dict[str, Any]:
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
    #: The topic's value subject: a typed topic (docs/typed-topics.md); None: bytes.
    subject: str | None = None


class Produce:
    """Produces a plan's records and turns the outcomes into per-record reports."""

    def __init__(self, state: GatewayState, target: _Target, recorder: AccessRecorder) -> None:
        self.state = state
        self.target = target
        self.recorder = recorder

    def _report_ok(self, plan: Plan, i: int, partition: int, offset: int,
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

    def _check_sizes(self, plan: Plan) -> None:
        if max(plan.sizes, default=0) <= self.target.limit:
            return
        for i, size in enumerate(plan.sizes):
            if plan.errors[i] is None:
                plan.errors[i] = self.size_error(plan.labels[i], size)

    async def run(self, plan: Plan) -> list[Outcome] | _Uniform:
        """Produce every valid record of ``plan``: one (status, report, error) each, or a
        ``_Uniform`` when all were acknowledged together."""
        self._check_sizes(plan)
        if plan.decoded is not None:
            return await self._one_by_one(plan)
        if self.target.subject is not None:
            return await self._typed(plan)
        return await self._coalesced(plan)

    async def _writer_schema(self) -> tuple[int, ParsedSchema]:
        assert self.target.subject is not None
        try:
            return await self.state.admin.schemas.latest(self.target.subject)
        except StrataError as err:
            raise from_strata_error(err, topic=self.target.topic, sent=False) from err

    def _typed_refusal(self, label: str, value_type: str | None) -> HttpError | None:
        if value_type == "JSON":
            return None
        return HttpError(422, f"{label}.value: topic {self.target.topic!r} is typed (subject "
                              f"{self.target.subject!r}): send the value as "
                              '{"type": "JSON", "data": {...}} with the schema\'s fields',
                         not_written=True)

    def _mismatch(self, label: str, err: SchemaMismatchError, schema_id: int) -> HttpError:
        field = getattr(err, "field", None)
        where = f"{label}.value.{field}" if field else f"{label}.value"
        reason = err.message.split(": ", 1)[1] if err.message.startswith("record ") \
            else err.message
        return HttpError(422, f"{where}: {reason} (schema id {schema_id} of subject "
                              f"{self.target.subject!r}); nothing was written for this "
                              "record", not_written=True)

    async def _typed(self, plan: Plan) -> list[Outcome] | _Uniform:
        """A typed topic's records: their JSON values checked and converted together
        into the schema's columns (off the event loop; a record that does not match is
        refused alone, 422 naming it and the field), then produced as whole columns."""
        schema_id, schema = await self._writer_schema()
        objects: dict[int, Any] = {}
        for i in range(len(plan)):
            if plan.errors[i] is not None:
                continue
            info = plan.value_info[i]
            refusal = self._typed_refusal(plan.labels[i], None if info is None
                                          else info.get("type"))
            if refusal is not None:
                plan.errors[i] = refusal
                continue
            objects[i] = json.loads(plan.values[i] or b"null")
        indexes = list(objects)
        column, refused = await asyncio.to_thread(
            _convert_typed, [objects[i] for i in indexes], schema)
        for position, err in refused.items():
            plan.errors[indexes[position]] = self._mismatch(plan.labels[indexes[position]],
                                                            err, schema_id)
        good = [i for position, i in enumerate(indexes) if position not in refused]
        if column is None or not good:
            return [self._report_error(error or HttpError(500, "internal error: record lost"))
                    for error in plan.errors]
        return await self._typed_columns(plan, good, TypedValue(schema_id, schema, column))

    async def _typed_columns(self, plan: Plan, indexes: list[int], typed: TypedValue
                             ) -> list[Outcome] | _Uniform:
        """Produce ``typed`` (its row ``r`` is record ``indexes[r]`` of ``plan``): rows
        grouped by target partition (explicit, by key, or sticky), each group cut into
        slices of one wire batch, every slice queued (in order per partition; a slice that
        cannot be queued stops the group's later ones) before any is awaited. A failure
        is reported for its slice's records only, "not written" only when nothing of the
        slice was queued."""
        t = self.target
        column = typed.row
        try:
            producer = await self.state.producer(t.acks)
            partitions = await producer.partitions_for(t.topic)
        except StrataError as err:
            raise from_strata_error(err, topic=t.topic, sent=False) from err
        groups: dict[int | None, list[int]] = {}
        for row, i in enumerate(indexes):
            p = plan.partitions[i]
            if p is not None and p >= partitions:
                plan.errors[i] = HttpError(
                    404, f"{plan.labels[i]}: partition_id {p} does not exist in topic "
                         f"{t.topic!r} (partitions 0..{partitions - 1})", not_written=True)
                continue
            if p is None and plan.keys[i] is not None:
                p = partition_for_key(plan.keys[i], partitions)  # type: ignore[arg-type]
            groups.setdefault(p, []).append(row)
        timestamp = time.time_ns() // 1_000_000
        # Per record: (wire batch, position in it), or why it was not written.
        placed: dict[int, tuple[BatchMetadata, int] | HttpError] = {}
        refused_by_broker = False

        def fail(rows: list[int], err: BaseException, sent: bool) -> None:
            nonlocal refused_by_broker
            refused_by_broker |= isinstance(err, SchemaMismatchError)
            for r in rows:
                placed[indexes[r]] = from_strata_error(
                    err, topic=t.topic, record=plan.labels[indexes[r]], sent=sent)

        queued: list[tuple[list[int], asyncio.Future[list[BatchMetadata]]]] = []
        limit = self.state.config.batch_size
        for p, rows in groups.items():
            values = column if len(rows) == len(column) else column.take(pa.array(rows))
            keys = [plan.keys[indexes[r]] for r in rows]
            for start, end in _typed_slices(values, keys, limit):
                piece = rows[start:end]
                piece_keys = keys[start:end]
                try:
                    queued.append((piece, await producer.send_batch(
                        t.topic, TypedValue(typed.schema_id, typed.schema,
                                            values.slice(start, end - start)),
                        keys=None if piece_keys.count(None) == len(piece_keys)
                        else piece_keys, partition=p, timestamp_ms=timestamp)))
                except BufferFullError as err:
                    accepted = err.records_accepted
                    if accepted and err.accepted is not None:
                        queued.append((piece[:accepted], err.accepted))
                    # the rest stays unsent: sent later, it would land before them
                    fail(piece[accepted:] + rows[end:], err, False)
                    break
                except Exception as err:
                    if not isinstance(err, StrataError):
                        log.exception("queueing %d typed record(s) failed", end - start)
                    fail(rows[start:], err, False)
                    break
                self.state.metrics.batch(end - start)
        batches: list[list[BatchMetadata]] = []
        for piece, future in queued:
            try:
                metas = await asyncio.shield(future)
            except Exception as err:
                fail(piece, err, True)
                continue
            batches.append(metas)
            walk = iter(piece)
            for meta in metas:
                for within, r in zip(range(meta.record_count), walk, strict=False):
                    placed[indexes[r]] = (meta, within)
        if refused_by_broker and self.target.subject is not None:
            # The cached latest version may be deleted: look it up again next time.
            self.state.admin.schemas.forget_latest(self.target.subject)
        acked = t.acks != "0"
        code = 200 if acked else 202
        if len(batches) == 1 and len(batches[0]) == 1 \
                and batches[0][0].record_count == len(plan) == len(indexes):
            meta = batches[0][0]  # the usual request: every record in one wire batch
            stamp = meta.log_append_time if meta.log_append_time >= 0 else timestamp
            if acked:
                self.recorder.records += len(plan)
                self.state.metrics.record_topic(t.topic, sum(plan.sizes), len(plan))
            return _Uniform(code, t.cluster_id, t.topic, meta.partition,
                            meta.base_offset if acked else None, iso_timestamp(stamp))
        out: list[Outcome] = []
        for i in range(len(plan)):
            where = placed.get(i)
            if isinstance(where, tuple):
                meta, within = where
                stamp = meta.log_append_time if meta.log_append_time >= 0 else timestamp
                out.append(self._report_ok(plan, i, meta.partition, meta.base_offset + within,
                                           stamp))
                continue
            error = where if where is not None else plan.errors[i]
            out.append(self._report_error(error or HttpError(
                500, f"{plan.labels[i]}: the producer reported fewer records than were "
                     "sent; see the log")))
        return out

    async def _coalesced(self, plan: Plan) -> list[Outcome] | _Uniform:
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
        placements: list[tuple[Gathering, int, list[int]]] = []
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
        sent: dict[int, tuple[list[Part], int]] = {}
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
        placed: list[tuple[Gathering, int] | None] = [None] * n
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
                outcome, index = part_of(parts, where[1])
                if isinstance(outcome, SendFailed):
                    error = from_strata_error(outcome.error, topic=t.topic,
                                              record=plan.labels[i], sent=outcome.sent)
                else:
                    found = locate(outcome, index)
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

    def _uniform(self, sent: tuple[list[Part], int], start: int, n: int, code: int
                 ) -> _Uniform | None:
        """A ``_Uniform`` if records ``start .. start+n-1`` of a gathering were
        acknowledged in one wire batch."""
        parts, timestamp = sent
        outcome, index = part_of(parts, start)
        if isinstance(outcome, SendFailed) or part_of(parts, start + n - 1)[0] is not outcome:
            return None
        first, last = locate(outcome, index), locate(outcome, index + n - 1)
        if first is None or last is None or first[0] is not last[0]:
            return None
        meta, within = first
        stamp = meta.log_append_time if meta.log_append_time >= 0 else timestamp
        return _Uniform(code, self.target.cluster_id, self.target.topic, meta.partition,
                        meta.base_offset + within if code == 200 else None,
                        iso_timestamp(stamp) if stamp >= 0 else None)

    async def _one_by_one(self, plan: Plan) -> list[tuple[int, dict[str, Any], HttpError | None]]:
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
            value: Any = record.value
            if t.subject is not None:
                refusal = self._typed_refusal(label, record.value_type)
                if refusal is not None:
                    return refusal
                schema_id, schema = await self._writer_schema()
                try:
                    value = TypedValue(schema_id, schema, records_to_arrow(
                        [json.loads(record.value or b"null")], schema))
                except SchemaMismatchError as err:
                    return self._mismatch(label, err, schema_id)
        except HttpError as err:
            return err
        except StrataError as err:
            return from_strata_error(err, topic=t.topic, record=label, sent=False)
        return await self._send(producer, label, value, record.key, record.headers or None,
                                record.partition, record.timestamp_ms)

    async def _send(self, producer: AsyncProducer, label: str, value: Any, key: bytes | None,
                    headers: list[tuple[str, bytes | None]] | None, partition: int | None,
                    timestamp_ms: int | None) -> asyncio.Future[RecordMetadata] | HttpError:
        t = self.target
        try:
            return await producer.send(t.topic, value, key=key, headers=headers,
                                       partition=partition, timestamp_ms=timestamp_ms)
        except HttpError as err:
            return err
        except ValueError as err:
            return HttpError(404, f"{label}: partition_id {partition} does not exist "
                                  f"in topic {t.topic!r} ({err})", not_written=True)
        except StrataError as err:
            return from_strata_error(err, topic=t.topic, record=label, sent=False)
        except Exception as err:  # never a 500 for the whole request: this record only
            log.exception("%s: producing failed", label)
            return from_strata_error(err, topic=t.topic, record=label, sent=False)

    async def outcome(self, plan: Plan, i: int,
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


#: Records converted together after a request turned out to hold a bad one: a block
#: that fails is converted record by record (linear however many records are bad).
_TYPED_BLOCK = 256


def _convert_typed(rows: list[Any], schema: ParsedSchema
                   ) -> tuple[pa.StructArray | None, dict[int, SchemaMismatchError]]:
    """``rows`` (JSON values) as the schema's struct column, leaving out those that do
    not match: (the column of the good ones in order, the refusals by position). Runs in
    a worker thread: a large request's conversion must not hold the event loop."""
    try:
        return records_to_arrow(rows, schema), {}
    except SchemaMismatchError:
        pass
    parts: list[pa.StructArray] = []
    refused: dict[int, SchemaMismatchError] = {}
    for start in range(0, len(rows), _TYPED_BLOCK):
        block = rows[start:start + _TYPED_BLOCK]
        try:
            parts.append(records_to_arrow(block, schema))
            continue
        except SchemaMismatchError:
            pass
        for position, row in enumerate(block, start):
            try:
                parts.append(records_to_arrow([row], schema))
            except SchemaMismatchError as err:
                refused[position] = err
    return (pa.concat_arrays(parts) if parts else None), refused


def _typed_slices(values: pa.StructArray, keys: list[bytes | None], limit: int
                  ) -> list[tuple[int, int]]:
    """Row ranges of ``values`` that ``send_batch`` sends as one wire batch each: at most
    ``limit`` bytes as it estimates typed rows (their average Arrow size, the key, the
    timestamp and ``RECORD_OVERHEAD`` each; a sixteenth kept spare for the bitmaps) and
    at most ``MAX_RECORDS_PER_BATCH`` rows."""
    n = len(values)
    per_row = -(-values.nbytes // n) + 12  # + timestamp and the key's offset
    sizes = [per_row + (len(k) if k else 0) for k in keys]
    out = []
    for start, end in byte_slices(sizes, sum(sizes), limit - limit // 16, RECORD_OVERHEAD):
        out += [(s, min(s + MAX_RECORDS_PER_BATCH, end))
                for s in range(start, end, MAX_RECORDS_PER_BATCH)]
    return out


# ---------------------------------------------------------------------------- answers
def _single_answer(outcome: Outcome) -> Answer:
    status, report, error = outcome
    return Answer(status, _encode(report), headers=error.headers if error is not None else {},
                  not_written=error is not None and error.not_written)


def _lines_answer(plan: Plan, outcomes: list[Outcome] | _Uniform) -> Answer:
    if isinstance(outcomes, _Uniform):
        return Answer(200, outcomes.encoded(plan, ["}\n"] * len(plan), ""),
                      media_type="application/x-ndjson")
    return Answer(200, b"".join(_encode(report) + b"\n" for _, report, _ in outcomes),
                  media_type="application/x-ndjson",
                  not_written=all(e is not None and e.not_written for _, _, e in outcomes))


def _batch_answer(plan: Plan, outcomes: list[Outcome] | _Uniform) -> Answer:
    assert plan.ids is not None
    if isinstance(outcomes, _Uniform):
        if plan.index_ids:
            ids = INDEX_ID_SUFFIXES.first(len(plan.ids))
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
        acks = parse_acks(scope.get("query_string", b""))
        limit = state.config.max_request_bytes
        check_length(headers.content_length, limit)
        if not batch and headers.content_length is None and headers.idempotency_key is None:
            await _serve_stream(state, scope, receive, send, recorder, principal,
                                _Target(cluster_id, topic, acks, 0))
            return
        body = await read_body(receive, limit, recorder)
        plan = batch_plan(body) if batch else records_plan(body)
        _charge(state, principal, len(plan))

        async def compute() -> Answer:
            cid = await state.check_cluster(cluster_id)
            target = _Target(cid, topic, acks, await state.max_message_bytes(topic),
                             state.value_subject(topic))
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
    except HttpError as err:
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
    target.subject = state.value_subject(target.topic)
    producing = Produce(state, target, recorder)
    plan = Plan([], decoded=[])
    items: list[asyncio.Future[RecordMetadata] | HttpError] = []

    async def take(obj: Any, label: str, path: str) -> None:
        try:
            _charge(state, principal, 1)
            record = decode_record(obj, path)
        except HttpError as err:
            append_failed(plan, label, err)
            items.append(err)
            return
        append_record(plan, label, record)
        error = plan.errors[-1] = producing.size_error(label, record.size)
        items.append(error if error is not None else await producing.submit(record, label))

    # The first record waits for the second (or the end of the body): only then is it
    # known whether this is one record (fields named "value.data") or a stream
    # ("records[0].value.data").
    held: list[Any] = []
    limit = state.config.max_request_bytes
    async for value in stream_objects(body_chunks(receive, recorder), limit):
        if held:
            await take(held.pop(), "records[0]", "records[0]")
        label = f"records[{len(items)}]"
        if isinstance(value, HttpError):
            append_failed(plan, label, value)
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
