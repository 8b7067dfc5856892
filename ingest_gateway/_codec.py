"""Decoding of v3 produce records and encoding of read records.

A record is ``{partition_id?, headers?, key?, value?, timestamp?}``; ``key`` and
``value`` are ``{type: BINARY|JSON|STRING, data}`` (``type`` defaults to ``JSON``);
``headers`` is ``[{name, value}]`` with base64 values (``null`` allowed); ``timestamp``
is an ISO-8601 string or milliseconds since the epoch. Every problem raises a 422
``HttpError`` naming the JSON field path, e.g. ``entries[2].value.data``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ingest_gateway._errors import HttpError

__all__ = ["DecodedRecord", "as_int", "decode_base64", "decode_record", "encode_data",
           "iso_timestamp"]

_RECORD_FIELDS = frozenset({"partition_id", "headers", "key", "value", "timestamp"})
_DATA_FIELDS = frozenset({"type", "data"})
_TYPES = ("BINARY", "JSON", "STRING")


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int | None
    key_type: str | None
    value_type: str | None

    @property
    def size(self) -> int:
        """Bytes of key, value and headers (what ``max.message.bytes`` is compared with)."""
        return (len(self.key or b"") + len(self.value or b"")
                + sum(len(k.encode()) + len(v or b"") for k, v in self.headers))


def as_int(value: Any) -> int | None:
    """``value`` as an integer if JSON says it is one (``3`` and ``3.0``: JSON Schema's
    ``integer`` holds both), else None (booleans, fractions, strings, ...)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _bad(path: str, what: str) -> HttpError:
    return HttpError(422, f"{path}: {what}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def decode_base64(text: Any, path: str) -> bytes:
    if not isinstance(text, str):
        raise _bad(path, f"expected a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(path, "is not valid base64 (standard alphabet, with padding)") from None


def _data(obj: Any, path: str) -> tuple[bytes | None, str | None]:
    if obj is None:
        return None, None
    if not isinstance(obj, dict):
        raise _bad(path, f"expected an object {{type, data}}, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _DATA_FIELDS)
    if unknown:
        raise _bad(_join(path, unknown[0]), "unknown field; expected only `type` and `data` "
                   "(schema registry fields are not supported)")
    kind = obj.get("type", "JSON")
    if kind not in _TYPES:
        raise _bad(_join(path, "type"), f"must be one of {', '.join(_TYPES)}, got {kind!r}")
    data = obj.get("data")
    data_path = _join(path, "data")
    if kind == "BINARY":
        return (None if data is None else decode_base64(data, data_path)), kind
    if kind == "STRING":
        if data is None:
            return None, kind
        if not isinstance(data, str):
            raise _bad(data_path, f"type STRING needs a string, got {type(data).__name__}")
        return _utf8(data, data_path), kind
    if data is None and "data" not in obj:
        return None, kind
    return _utf8(json.dumps(data, separators=(",", ":"), ensure_ascii=False), data_path), kind


def _utf8(text: str, path: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(path, "is not valid Unicode text (a lone surrogate such as \\ud800); "
                         "send BINARY data for bytes that are not UTF-8") from None


#: 9999-12-31T23:59:59.999Z in milliseconds: what an ISO-8601 timestamp can say.
_MAX_TIMESTAMP_MS = 253_402_300_799_999


def _timestamp(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad(path, "expected an ISO-8601 string or milliseconds since the epoch")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise _bad(path, "must be >= 0 (milliseconds since the epoch)")
        if value > _MAX_TIMESTAMP_MS:
            # Past an int64 it would break the encoding of the whole shared batch, and
            # with it other clients' records.
            raise _bad(path, f"must be at most {_MAX_TIMESTAMP_MS} (the end of year 9999)")
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise _bad(path, f"{value!r} is not an ISO-8601 timestamp "
                             "(e.g. 2026-01-31T12:00:00.000Z)") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        ms = int(parsed.timestamp() * 1000)
        if ms < 0:
            raise _bad(path, "must not be before 1970-01-01")
        return ms
    raise _bad(path, "expected an ISO-8601 string or milliseconds since the epoch")


def decode_record(obj: Any, path: str = "") -> DecodedRecord:
    """Decode one v3 record; ``path`` prefixes field names in error messages."""
    if not isinstance(obj, dict):
        raise _bad(path or "body", f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _RECORD_FIELDS - ({"id"} if path.startswith("entries") else set()))
    if unknown:
        raise _bad(_join(path, unknown[0]),
                   f"unknown field; expected {', '.join(sorted(_RECORD_FIELDS))}")
    partition = obj.get("partition_id")
    if partition is not None:
        partition = as_int(partition)
        if partition is None or partition < 0:
            raise _bad(_join(path, "partition_id"), "must be an integer >= 0")
    headers: list[tuple[str, bytes | None]] = []
    raw_headers = obj.get("headers")
    hpath = _join(path, "headers")
    if raw_headers is not None:
        if not isinstance(raw_headers, list):
            raise _bad(hpath, "expected a list of {name, value}")
        for i, header in enumerate(raw_headers):
            here = f"{hpath}[{i}]"
            if not isinstance(header, dict):
                raise _bad(here, "expected an object {name, value}")
            name = header.get("name")
            if not isinstance(name, str) or not name:
                raise _bad(f"{here}.name", "must be a non-empty string")
            _utf8(name, f"{here}.name")
            extra = sorted(set(header) - {"name", "value"})
            if extra:
                raise _bad(f"{here}.{extra[0]}", "unknown field; expected name and value")
            raw = header.get("value")
            headers.append((name, None if raw is None else decode_base64(raw, f"{here}.value")))
    key, key_type = _data(obj.get("key"), _join(path, "key"))
    value, value_type = _data(obj.get("value"), _join(path, "value"))
    return DecodedRecord(partition=partition, key=key, value=value, headers=headers,
                         timestamp_ms=_timestamp(obj.get("timestamp"), _join(path, "timestamp")),
                         key_type=key_type, value_type=value_type)


def encode_data(data: bytes | None) -> dict[str, Any] | None:
    """Read side: bytes as ``{type: BINARY, data: base64}`` (``None`` stays ``None``)."""
    if data is None:
        return None
    return {"type": "BINARY", "data": base64.b64encode(data).decode("ascii")}


@functools.lru_cache(maxsize=64)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def iso_timestamp(ms: int) -> str:
    """``1700000000123`` -> ``"2023-11-14T22:13:20.123Z"`` (the seconds part is cached:
    every report of a produce answer formats a timestamp, mostly of the same second)."""
    return f"{_iso_second(ms // 1000)}{ms % 1000:03d}Z"
