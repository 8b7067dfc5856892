"""Typed topics' schemas: Avro or JSON Schema text, parsed, limited, mapped to Arrow,
checked for compatibility, and used to validate and convert records.

This is the bottom layer of typed topics (docs/typed-topics.md): a schema the way a
Confluent Schema Registry holds it becomes a ``ParsedSchema`` whose ``arrow_type`` is
the struct every record of the topic has. It imports only the standard library,
pyarrow, fastavro and ``wire.errors``.

Invariants:

- ``parse_schema`` raises nothing but ``InvalidSchemaError``, whatever the text: it
  refuses text over ``MAX_SCHEMA_BYTES`` before decoding it, nesting over ``MAX_DEPTH``
  before recursing into it, more than ``MAX_FIELDS`` fields in total (reused named types
  and ``$ref`` targets count once per use), and recursive types (Arrow has none).
- The top level is a record (Avro) or an object with properties (JSON Schema): a typed
  topic's value is a struct, and ``arrow_type`` keeps the declared field order.
- ``canonical`` is compact JSON with object keys sorted, except a JSON Schema's
  ``properties`` (their order is the struct's) and with ``required`` sorted; texts that
  differ only in whitespace or key order have the same ``canonical`` and
  ``fingerprint`` (sha256 hex of ``canonical``). Annotations are kept in it.
- Every message names the field by its dotted path (``'address.zip'``; ``[]`` is an
  array's items, ``{}`` a map's values) and says what to do. Data errors are
  ``SchemaMismatchError`` with ``.record`` (the index of the record at fault, or None)
  and ``.field`` (the path), and messages ``record {i}: field '{path}': {reason}``.
- Every Avro value this mapping allows takes at least one byte (empty records and
  ``fixed`` of size 0 are refused), so decoding a body costs at most its length.

Limits (module constants): ``MAX_SCHEMA_BYTES`` = 256 KiB of UTF-8 text;
``MAX_DEPTH`` = 32 levels of records/objects, arrays and maps (the top level counts);
``MAX_FIELDS`` = 10,000 fields in total; and ``MAX_JSON_NESTING`` = 256 levels of JSON
in the text. Empty records/objects are refused too (no column to store).

Compatibility (``check_compatibility``) follows Avro's schema resolution, for JSON
Schema too: a reader-only field needs a default or must be nullable (optional); a
writer-nullable field must stay nullable; types must be equal or promotions (int to
long/float/double, long to float/double, float to double, string to/from bytes); reader
enums hold every writer symbol; records, arrays and maps recursively. BACKWARD: the new
schema reads the old data; FORWARD: the other way round; FULL: both; ``*_TRANSITIVE``
against every previous version, the others against the latest.

``table_to_arrow`` casts only when the cast is declared lossless and succeeds value by
value: wider or narrower integers (values must fit), integer or float32 to a float,
large/view strings and binaries, binary to fixed (each value of the size), dictionaries
(decoded), date64 to date32, timestamp units (no truncation) and zones (any zone to a
UTC field; only zone-less to a local one), decimals to decimals (no rounding).

Everything here is a pure function of its arguments, and every value immutable:
thread-safe.

Mapping (a field not in a union with null, or a required JSON property, is
``nullable=False``; ``[null, T]`` in either order, or ``"type": [T, "null"]``, is T with
``nullable=True``):

| Avro | JSON Schema | Arrow | Notes |
|---|---|---|---|
| `boolean` | `boolean` | `bool` | |
| `int` | | `int32` | |
| `long` | `integer` | `int64` | |
| `float` | | `float32` | |
| `double` | `number` | `float64` | |
| `bytes` | `string`, `format: byte` or `contentEncoding: base64` | `binary` | JSON: base64 |
| `string` | `string` (other formats ignored) | `string` | |
| `record` | `object` with `properties` | `struct` | field order kept |
| `enum` | `enum` of strings | `string` | values checked against the symbols |
| `array` | `array` with an `items` schema | `list<item>` | |
| `map` | `object` with only an `additionalProperties` schema | `map<string, value>` | |
| `fixed(n)` | | `fixed_size_binary(n)` | n >= 1 |
| union `[null, T]` | `"type": [T, "null"]` | T, nullable | other unions are refused |
| `int` `date` | `string` `format: date` | `date32` | |
| `int` `time-millis` | | `int32` | ms after midnight: Spark's Arrow interchange has no time type |
| `long` `time-micros` | | `int64` | µs after midnight |
| `long` `timestamp-millis` | | `timestamp("ms", "UTC")` | |
| `long` `timestamp-micros` | `string` `format: date-time` | `timestamp("us", "UTC")` | |
| `long` `local-timestamp-millis` | | `timestamp("ms")` | |
| `long` `local-timestamp-micros` | | `timestamp("us")` | |
| `bytes`/`fixed` `decimal(p, s)` | | `decimal128(p, s)` | p <= 38 |
| `string` `uuid` | `string` `format: uuid` | `string` | checked as a UUID |

Avro: named types may be reused by name, not recursively; ``default`` is kept (for
``resolve`` and for missing fields in ``records_to_arrow``); other logical types are
ignored as the Avro specification says (the value keeps its underlying type). JSON
Schema (draft 7, 2019-09, 2020-12): ``$ref`` to ``#/definitions/...`` or
``#/$defs/...`` (no cycles); ``default`` kept; ``oneOf``, ``anyOf``, ``allOf``, ``not``,
``if``/``then``/``else``, ``patternProperties``, tuple ``items``/``prefixItems`` are
refused (no Arrow mapping); validation keywords (``minimum``, ``maxLength``, ...) and
annotations are ignored by the mapping. Schema references (Confluent's ``references``)
are not supported yet.

Conversions accept, beyond the Python type of the Arrow type: int, datetime or ISO-8601
text for timestamps (a naive datetime in a UTC field is taken as UTC; digits finer than
the field's unit are truncated); date, ISO text or days for dates; int, ``time`` or ISO
text for times; Decimal, text or int (not float) for decimals; str or ``uuid.UUID`` for
uuids; bytes or base64 text for bytes and fixed; ``"NaN"``, ``"Infinity"``,
``"-Infinity"`` for floats (``to_json_values`` writes non-finite floats so).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import fastavro

from wire.errors import InvalidSchemaError, SchemaMismatchError
from wire.schema._avro import parse_avro
from wire.schema._compat import check_compatibility
from wire.schema._convert import (
    arrow_mismatch,
    check,
    column,
    default_array,
    from_avro_bodies,
    list_parts,
    records_to_arrow,
    resolve,
    table_to_arrow,
    to_avro_bodies,
    to_json_values,
)
from wire.schema._jsonschema import parse_json_schema
from wire.schema._model import MAX_DEPTH as MAX_DEPTH
from wire.schema._model import MAX_FIELDS as MAX_FIELDS
from wire.schema._model import MAX_SCHEMA_BYTES as MAX_SCHEMA_BYTES
from wire.schema._model import (
    Compatibility,
    Node,
    ParsedSchema,
    SchemaType,
    fingerprint_of,
    identity,
    join,
    where,
)

__all__ = [
    "Compatibility",
    "ParsedSchema",
    "SchemaType",
    "arrow_mismatch",
    "check_compatibility",
    "confluent_frame",
    "default_array",
    "from_avro_bodies",
    "list_parts",
    "parse_confluent_frame",
    "parse_schema",
    "records_to_arrow",
    "resolve",
    "subject_topic",
    "table_to_arrow",
    "to_avro_bodies",
    "to_json_values",
]

MAX_JSON_NESTING = 8 * MAX_DEPTH
"""Most nested JSON arrays/objects in a schema text: room for MAX_DEPTH levels of types
(a level of Avro record is three to five levels of JSON) and bounded so that nothing
recurses deeply on hostile text."""


def parse_schema(text: str, schema_type: str | SchemaType = "AVRO",
                 references: object = None) -> ParsedSchema:
    """Parses and maps ``text``; ``InvalidSchemaError`` (and nothing else) if it cannot."""
    try:
        return _parse(text, schema_type, references)
    except InvalidSchemaError:
        raise
    except RecursionError:
        raise InvalidSchemaError("the schema nests too deeply to parse; flatten it") from None
    except Exception as error:  # the promise is one error type whatever the text
        raise InvalidSchemaError(f"the schema could not be parsed ({type(error).__name__}: "
                                 f"{error}); check that it is valid") from None


def _parse(text: str, schema_type: str | SchemaType, references: object) -> ParsedSchema:
    try:
        kind = SchemaType(str(schema_type).upper())
    except ValueError:
        raise InvalidSchemaError(f"schema type {str(schema_type)[:40]!r} is not supported; use "
                                 f"one of {', '.join(SchemaType)}") from None
    if references:
        raise InvalidSchemaError("schema references are not supported yet; inline the "
                                 "referenced types into the schema")
    if not isinstance(text, str):
        raise InvalidSchemaError(f"the schema must be text, got {type(text).__name__}")
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) <= MAX_SCHEMA_BYTES \
        else len(text)
    if size > MAX_SCHEMA_BYTES:
        raise InvalidSchemaError(f"the schema text is {size} bytes, over MAX_SCHEMA_BYTES="
                                 f"{MAX_SCHEMA_BYTES}; split the record, or move parts into "
                                 "maps or bytes")
    document = _load_json(text)
    _check_nesting(document)
    root = parse_avro(document) if kind is SchemaType.AVRO else parse_json_schema(document)
    _check_defaults(root, "")
    canonical = json.dumps(_canonical(document, kind), separators=(",", ":"),
                           ensure_ascii=False)
    avro: Any = None
    if kind is SchemaType.AVRO:
        try:
            avro = fastavro.parse_schema(json.loads(canonical))
        except Exception as error:  # fastavro's checks go beyond the mapping's
            raise InvalidSchemaError(f"the Avro schema is not valid: {error}; fix it") from None
    return ParsedSchema(kind, canonical, root.arrow, fingerprint_of(canonical), root, avro)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"key {key!r} appears twice in one object; keep one")
            seen.add(key)
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; write a number")


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _DuplicateKey as error:
        raise InvalidSchemaError(f"the schema is not valid JSON: {error}") from None
    except json.JSONDecodeError as error:
        raise InvalidSchemaError(f"the schema is not valid JSON (line {error.lineno}, column "
                                 f"{error.colno}: {error.msg}); fix the text") from None
    except (ValueError, RecursionError) as error:
        raise InvalidSchemaError(f"the schema is not valid JSON ({error}); fix the "
                                 "text") from None


def _check_nesting(document: Any) -> None:
    """Without recursing: the walks after this one recurse, bounded by this."""
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_JSON_NESTING:
            raise InvalidSchemaError(f"the schema text nests JSON more than {MAX_JSON_NESTING} "
                                     f"levels deep, beyond what MAX_DEPTH={MAX_DEPTH} levels "
                                     "of types need; flatten the schema")
        if isinstance(value, dict):
            pending.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value)


def _canonical(value: Any, kind: SchemaType, in_properties: bool = False) -> Any:
    """Sorts what has no order. A JSON Schema's ``properties`` keep theirs (the struct's
    field order); anything in Avro that has an order is a list."""
    if isinstance(value, list):
        return [_canonical(v, kind) for v in value]
    if not isinstance(value, dict):
        return value
    keys = list(value) if in_properties else sorted(value)
    result = {}
    for key in keys:
        child = value[key]
        if kind is SchemaType.JSON and not in_properties and key == "required" \
                and isinstance(child, list) and all(isinstance(r, str) for r in child):
            result[key] = sorted(child)
            continue
        nested_properties = kind is SchemaType.JSON and not in_properties \
            and key == "properties" and isinstance(child, dict)
        result[key] = _canonical(child, kind, nested_properties)
    return result


def _check_defaults(node: Node, path: str) -> None:
    """A default is data: it must convert like a record's value would."""
    for field in node.fields:
        field_path = join(path, field.name)
        if field.has_default:
            try:
                values = column([field.default], field.node, field_path, identity)
                check(values, field.node, field.nullable, field_path, identity)
            except SchemaMismatchError as error:
                raise InvalidSchemaError(
                    f"{where(field_path)}: its default {str(field.default)[:40]} does not "
                    f"fit {field.node.label} ({where(vars(error)['field'])}: "
                    f"{vars(error)['reason']}); fix the default") from None
        child = field.node
        while child.element is not None:
            child = child.element
        if child.fields:
            _check_defaults(child, field_path)


_FRAME = struct.Struct(">bI")  # magic byte 0, then the schema id, big-endian


def confluent_frame(schema_id: int, body: bytes) -> bytes:
    """The Confluent wire format: magic byte 0, 4-byte big-endian schema id, body."""
    if not 0 <= schema_id <= 0x7FFFFFFF:
        raise ValueError(f"schema id {schema_id} is not a registry id (0 to 2**31-1)")
    return _FRAME.pack(0, schema_id) + bytes(body)


def parse_confluent_frame(data: bytes) -> tuple[int, bytes]:
    """(schema id, body) of a Confluent-framed value."""
    if len(data) < _FRAME.size:
        raise SchemaMismatchError(f"the value is {len(data)} bytes, shorter than the "
                                  f"{_FRAME.size}-byte Confluent header (magic 0, schema id); "
                                  "produce it with a schema-registry serializer")
    magic, schema_id = _FRAME.unpack_from(data)
    if magic != 0:
        raise SchemaMismatchError(f"the value starts with byte {magic & 0xFF}, not the "
                                  "Confluent magic byte 0; produce it with a schema-registry "
                                  "serializer")
    return schema_id, bytes(data[_FRAME.size:])


def subject_topic(subject: str | None) -> str | None:
    """The topic a TopicNameStrategy subject belongs to (``orders-value`` and
    ``orders-key`` → ``orders``), which authorization checks a subject against; None
    for other subject names (cluster-level)."""
    for suffix in ("-value", "-key"):
        if subject and subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return None
