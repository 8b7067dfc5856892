"""Primitive wire types and the schema machinery every request and response uses.

Every message is a dataclass whose ``FIELDS`` tuple lists ``Field(name, type, since)``
in wire order. ``encode(message, version)`` and ``decode(cls, data, version)`` walk
that tuple; a field whose ``since`` is above the negotiated version is neither written
nor read (it keeps its default), which is how a later version adds a field without
breaking older clients.

Primitive encodings (big-endian):

    int8/int16/int32/int64   two's complement, 1/2/4/8 bytes
    bool                     int8, 0 or 1
    string                   int16 length n >= 0, then n bytes of UTF-8
    nullable string          int16 length, -1 for null
    bytes                    int32 length n >= 0, then n bytes
    nullable bytes           int32 length, -1 for null
    records                  nullable bytes holding whole record batches; on the
                             server side the value may be a ``FileSlice`` sent with
                             ``os.sendfile``
    array<T>                 int32 count n >= 0 (-1 for null when nullable), then n T

Decoding bounds every allocation by the bytes it was given: a length or count is
checked against the bytes that remain before anything is sliced or allocated (an
array element takes at least one byte), so a hostile frame cannot make the decoder
allocate more than the frame's own size. Any violation raises ``InvalidRequestError``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, TypeGuard, TypeVar, runtime_checkable

from wire.errors import InvalidRequestError

__all__ = [
    "BOOL",
    "BYTES",
    "Chunk",
    "is_region",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "NULLABLE_BYTES",
    "NULLABLE_LONG_STRING",
    "NULLABLE_STRING",
    "RECORDS",
    "STRING",
    "Array",
    "Field",
    "Message",
    "Reader",
    "SendableRegion",
    "Struct",
    "WireType",
    "Writer",
    "decode",
    "encode",
    "encode_chunks",
    "join_chunks",
    "write_message",
]


@runtime_checkable
class SendableRegion(Protocol):
    """A byte range of an open file (``FileSlice``): written with ``os.sendfile``."""

    length: int

    def fileno(self) -> int: ...

    position: int

    def read_bytes(self) -> bytes: ...


class Reader:
    """Cursor over a frame; every read checks the bytes that remain."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> memoryview:
        if n < 0 or n > self.remaining:
            raise InvalidRequestError(
                f"frame too short: need {n} bytes at position {self.pos}, {self.remaining} left"
            )
        view = self.data[self.pos:self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: struct.Struct) -> Any:
        if fmt.size > self.remaining:
            raise InvalidRequestError(
                f"frame too short: need {fmt.size} bytes at position {self.pos}, "
                f"{self.remaining} left"
            )
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return value


Chunk = bytes | bytearray | memoryview | SendableRegion

_IN_MEMORY: Final = (bytes, bytearray, memoryview)


def is_region(chunk: object) -> TypeGuard[SendableRegion]:
    """Whether a chunk is a file region (to ``sendfile``) rather than bytes in memory.

    Not ``isinstance(chunk, SendableRegion)``: a runtime-checkable Protocol check walks
    the protocol's members on every call, and this runs for every chunk of every
    response (it showed up in broker profiles under replication load).
    """
    return not isinstance(chunk, _IN_MEMORY)
_BLOB_MIN: Final = 4096  # byte fields at least this long are referenced, not copied


class Writer:
    """Accumulates a frame as chunks: byte strings, large blobs and sendfile regions.

    Small fields are packed into one buffer; a large byte field (a record batch) is
    kept as its own chunk so it is copied once, when the frame is sent, not on every
    layer of encoding.
    """

    __slots__ = ("buf", "chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.buf = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= _BLOB_MIN:
            self._flush_buf()
            self.chunks.append(data)
        else:
            self.buf += data
        self.size += len(data)

    def _flush_buf(self) -> None:
        if self.buf:
            self.chunks.append(bytes(self.buf))
            self.buf = bytearray()

    def pack(self, fmt: struct.Struct, value: Any) -> None:
        self.buf += fmt.pack(value)
        self.size += fmt.size

    def region(self, region: SendableRegion) -> None:
        self._flush_buf()
        self.chunks.append(region)
        self.size += region.length

    def finish(self) -> list[Chunk]:
        self._flush_buf()
        return self.chunks


def join_chunks(chunks: list[Chunk]) -> bytes:
    """One byte string for a frame (file regions are read); one copy of each chunk."""
    return b"".join(c if isinstance(c, _IN_MEMORY) else c.read_bytes() for c in chunks)


class WireType(Protocol):
    def write(self, w: Writer, value: Any, version: int) -> None: ...

    def read(self, r: Reader, version: int) -> Any: ...


@dataclass(frozen=True, slots=True)
class _Int:
    fmt: struct.Struct
    name: str

    def write(self, w: Writer, value: Any, version: int) -> None:
        try:
            w.pack(self.fmt, value)
        except struct.error as err:
            raise InvalidRequestError(f"{value!r} does not fit in {self.name}") from err

    def read(self, r: Reader, version: int) -> Any:
        return r.unpack(self.fmt)


@dataclass(frozen=True, slots=True)
class _Bool:
    def write(self, w: Writer, value: Any, version: int) -> None:
        w.pack(_I8, 1 if value else 0)

    def read(self, r: Reader, version: int) -> Any:
        raw = r.unpack(_I8)
        if raw not in (0, 1):
            raise InvalidRequestError(f"bool must be 0 or 1, got {raw}")
        return raw == 1


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class _String:
    """UTF-8 text after its length: int16 (STRING, Kafka's) or, for a schema text or a
    registry answer that can pass 32,767 bytes, int32 (LONG_STRING); the reader bounds
    it by the frame it was given."""

    nullable: bool
    length: struct.Struct = _I16

    def write(self, w: Writer, value: Any, version: int) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidRequestError("a non-nullable string field is null")
            w.pack(self.length, -1)
            return
        data = value.encode("utf-8")
        if self.length is _I16 and len(data) > 32767:
            raise InvalidRequestError(f"string of {len(data)} bytes exceeds 32767")
        w.pack(self.length, len(data))
        w.write(data)

    def read(self, r: Reader, version: int) -> Any:
        n = r.unpack(self.length)
        if n == -1 and self.nullable:
            return None
        if n < 0:
            raise InvalidRequestError(f"invalid string length {n}")
        try:
            return bytes(r.take(n)).decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidRequestError(f"string is not valid UTF-8: {err}") from err


@dataclass(frozen=True, slots=True)
class _Bytes:
    nullable: bool
    records: bool = False

    def write(self, w: Writer, value: Any, version: int) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidRequestError("a non-nullable bytes field is null")
            w.pack(_I32, -1)
            return
        if self.records and value is not None and is_region(value):
            w.pack(_I32, value.length)
            w.region(value)
            return
        w.pack(_I32, len(value))
        w.write(value)

    def read(self, r: Reader, version: int) -> Any:
        n = r.unpack(_I32)
        if n == -1 and self.nullable:
            return None
        if n < 0:
            raise InvalidRequestError(f"invalid bytes length {n}")
        return r.take(n)


@dataclass(frozen=True, slots=True)
class Array:
    item: WireType
    nullable: bool = False

    def write(self, w: Writer, value: Any, version: int) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidRequestError("a non-nullable array field is null")
            w.pack(_I32, -1)
            return
        w.pack(_I32, len(value))
        for item in value:
            self.item.write(w, item, version)

    def read(self, r: Reader, version: int) -> Any:
        n = r.unpack(_I32)
        if n == -1 and self.nullable:
            return None
        if n < 0 or n > r.remaining:
            raise InvalidRequestError(
                f"array count {n} is impossible with {r.remaining} bytes left"
            )
        return [self.item.read(r, version) for _ in range(n)]


INT8: WireType = _Int(_I8, "int8")
INT16: WireType = _Int(_I16, "int16")
INT32: WireType = _Int(_I32, "int32")
INT64: WireType = _Int(_I64, "int64")
BOOL: WireType = _Bool()
STRING: WireType = _String(nullable=False)
NULLABLE_STRING: WireType = _String(nullable=True)
NULLABLE_LONG_STRING: WireType = _String(nullable=True, length=_I32)
BYTES: WireType = _Bytes(nullable=False)
NULLABLE_BYTES: WireType = _Bytes(nullable=True)
RECORDS: WireType = _Bytes(nullable=True, records=True)


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: WireType
    since: int = 0


class Message:
    """Base of every wire struct: subclasses are dataclasses with a ``FIELDS`` tuple."""

    FIELDS: ClassVar[tuple[Field, ...]] = ()


M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Struct:
    """A nested struct type (an array item, for instance)."""

    cls: type[Message]

    def write(self, w: Writer, value: Any, version: int) -> None:
        write_message(w, value, version)

    def read(self, r: Reader, version: int) -> Any:
        return _read_fields(self.cls, r, version)


def write_message(w: Writer, message: Message, version: int) -> None:
    for field in message.FIELDS:
        if field.since <= version:
            field.type.write(w, getattr(message, field.name), version)


def _read_fields(cls: type[M], r: Reader, version: int) -> M:
    values = {f.name: f.type.read(r, version) for f in cls.FIELDS if f.since <= version}
    return cls(**values)


def encode(message: Message, version: int = 0) -> bytes:
    """The message's bytes (it must not contain sendfile regions)."""
    w = Writer()
    write_message(w, message, version)
    return join_chunks(w.finish())


def encode_chunks(write_prefix: Callable[[Writer], None], message: Message,
                  version: int = 0) -> tuple[int, list[Chunk]]:
    """Encode ``prefix + message`` as chunks; return (total size, chunks)."""
    w = Writer()
    write_prefix(w)
    write_message(w, message, version)
    size = w.size
    return size, w.finish()


def decode(cls: type[M], data: bytes | bytearray | memoryview | Reader, version: int = 0,
           *, exact: bool = True) -> M:
    """Decode ``cls`` from ``data``; with ``exact`` trailing bytes are an error."""
    r = data if isinstance(data, Reader) else Reader(data)
    message = _read_fields(cls, r, version)
    if exact and r.remaining:
        raise InvalidRequestError(f"{r.remaining} unexpected trailing bytes after {cls.__name__}")
    return message

