"""The schema tree the other modules work on, and the public value types.

Both parsers (``_avro``, ``_jsonschema``) produce the same tree of ``Node``s, so that
compatibility, conversion and resolution are written once. A ``Node`` is immutable and
carries its Arrow type, its nesting height and the number of fields below it, so that
the limits can be checked where a named type or a ``$ref`` is reused, without walking it
again. Everything here is immutable: thread-safe.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from functools import cached_property
from typing import Any

import pyarrow as pa

from wire.errors import InvalidSchemaError, SchemaMismatchError

MAX_SCHEMA_BYTES = 256 * 1024
"""Longest schema text accepted, in UTF-8 bytes."""
MAX_DEPTH = 32
"""Most levels of nested records (objects), arrays and maps; the top-level record is one."""
MAX_FIELDS = 10_000
"""Most record fields (object properties) in total, counting every level and every reuse
of a named type or ``$ref`` (each reuse is a new Arrow column)."""


class SchemaType(StrEnum):
    AVRO = "AVRO"
    JSON = "JSON"


class Compatibility(StrEnum):
    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"


class Kind(Enum):
    """What a value is, independently of the schema language it was written in."""

    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    BYTES = "bytes"
    STRING = "string"
    RECORD = "record"
    ENUM = "enum"
    ARRAY = "array"
    MAP = "map"
    FIXED = "fixed"
    DATE = "date"
    TIME_MILLIS = "time-millis"
    TIME_MICROS = "time-micros"
    TIMESTAMP_MILLIS = "timestamp-millis"
    TIMESTAMP_MICROS = "timestamp-micros"
    LOCAL_TIMESTAMP_MILLIS = "local-timestamp-millis"
    LOCAL_TIMESTAMP_MICROS = "local-timestamp-micros"
    DECIMAL = "decimal"
    UUID = "uuid"


@dataclass(frozen=True, eq=False)
class Field:
    """A record field (object property). ``default`` is in the form ``records_to_arrow``
    accepts (Avro's latin-1 byte strings are already bytes), and only meaningful when
    ``has_default``."""

    name: str
    node: Node
    nullable: bool
    has_default: bool = False
    default: Any = None


@dataclass(frozen=True, eq=False)
class Node:
    """One type. ``label`` names it in messages in the schema's own words ("long",
    "record Address", "integer"). ``element``: an array's items or a map's values."""

    kind: Kind
    label: str
    arrow: pa.DataType
    fields: tuple[Field, ...] = ()
    symbols: tuple[str, ...] = ()
    element: Node | None = None
    element_nullable: bool = False
    height: int = 0
    field_count: int = 0

    @cached_property
    def by_name(self) -> Mapping[str, Field]:
        return {f.name: f for f in self.fields}

    @cached_property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)


def leaf(kind: Kind, label: str, arrow: pa.DataType) -> Node:
    return Node(kind, label, arrow)


def record(label: str, fields: tuple[Field, ...]) -> Node:
    arrow = pa.struct([pa.field(f.name, f.node.arrow, nullable=f.nullable) for f in fields])
    return Node(Kind.RECORD, label, arrow, fields=fields,
                height=1 + max((f.node.height for f in fields), default=0),
                field_count=len(fields) + sum(f.node.field_count for f in fields))


def array(element: Node, element_nullable: bool, label: str | None = None) -> Node:
    arrow = pa.list_(pa.field("item", element.arrow, nullable=element_nullable))
    return Node(Kind.ARRAY, label or f"array<{element.label}>", arrow, element=element,
                element_nullable=element_nullable, height=1 + element.height,
                field_count=element.field_count)


def map_of(element: Node, element_nullable: bool, label: str | None = None) -> Node:
    arrow = pa.map_(pa.string(), pa.field("value", element.arrow, nullable=element_nullable))
    return Node(Kind.MAP, label or f"map<{element.label}>", arrow, element=element,
                element_nullable=element_nullable, height=1 + element.height,
                field_count=element.field_count)


def join(path: str, name: str) -> str:
    """Field paths: ``a.b`` for record fields, ``a[]`` for array items, ``a{}`` for map
    values (``[]``/``{}`` are appended by the callers)."""
    return f"{path}.{name}" if path else name


def where(path: str) -> str:
    return f"field '{path}'" if path else "the top level"


def schema_error(path: str, reason: str) -> InvalidSchemaError:
    return InvalidSchemaError(f"{where(path)}: {reason}")


Locate = Callable[[int], int]
"""Maps a position in a (possibly flattened, nested) column to the record it belongs to."""


def identity(position: int) -> int:
    return position


def mismatch(record_index: int | None, path: str, reason: str) -> SchemaMismatchError:
    """The one way data errors are made: ``.record`` and ``.field`` let a caller point at
    the offending value (``record`` is None when no single record is at fault);
    ``.reason`` is the message without the record and field."""
    prefix = "" if record_index is None else f"record {record_index}: "
    error = SchemaMismatchError(f"{prefix}{where(path)}: {reason}")
    # SchemaMismatchError (wire.errors) declares no attributes; these are documented here.
    vars(error).update(record=record_index, field=path, reason=reason)
    return error


@dataclass(frozen=True)
class ParsedSchema:
    """A parsed, limited, Arrow-mapped schema. Equal schemas have equal ``canonical``
    text and ``fingerprint`` (sha256 hex of ``canonical``). Immutable, thread-safe."""

    schema_type: SchemaType
    canonical: str
    arrow_type: pa.StructType
    fingerprint: str
    root: Node = field(repr=False, compare=False)
    avro: Any = field(default=None, repr=False, compare=False)
    """fastavro's parsed schema (Avro only), for the Avro body codec."""

    def defaults(self) -> dict[str, Any]:
        """The top-level fields' declared defaults, by name."""
        return {f.name: f.default for f in self.root.fields if f.has_default}


def fingerprint_of(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
