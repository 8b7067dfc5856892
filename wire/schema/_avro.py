"""Avro schema (already JSON-decoded) to the ``Node`` tree, with the limits.

Depth is checked before recursing into a record, array or map, so hostile nesting costs
at most ``MAX_DEPTH`` Python frames per level; a named type is built once and reused by
reference, its height and field count added where it is reused, so exponential reuse
(a type of two fields of a type of two fields ...) is refused by ``MAX_FIELDS`` without
being expanded. Pure functions of their input: thread-safe.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pyarrow as pa

from wire.schema._model import (
    MAX_DEPTH,
    MAX_FIELDS,
    Field,
    Kind,
    Node,
    array,
    join,
    leaf,
    map_of,
    record,
    schema_error,
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_DECIMAL_PRECISION = 38

_PRIMITIVES: dict[str, tuple[Kind, pa.DataType]] = {
    "boolean": (Kind.BOOLEAN, pa.bool_()),
    "int": (Kind.INT, pa.int32()),
    "long": (Kind.LONG, pa.int64()),
    "float": (Kind.FLOAT, pa.float32()),
    "double": (Kind.DOUBLE, pa.float64()),
    "bytes": (Kind.BYTES, pa.binary()),
    "string": (Kind.STRING, pa.string()),
}
# Logical types by (underlying type, logicalType). Any other pair is ignored, as the Avro
# specification (and fastavro) do: the value is read as its underlying type.
_LOGICAL: dict[tuple[str, str], tuple[Kind, pa.DataType]] = {
    ("int", "date"): (Kind.DATE, pa.date32()),
    ("int", "time-millis"): (Kind.TIME_MILLIS, pa.int32()),
    ("long", "time-micros"): (Kind.TIME_MICROS, pa.int64()),
    ("long", "timestamp-millis"): (Kind.TIMESTAMP_MILLIS, pa.timestamp("ms", "UTC")),
    ("long", "timestamp-micros"): (Kind.TIMESTAMP_MICROS, pa.timestamp("us", "UTC")),
    ("long", "local-timestamp-millis"): (Kind.LOCAL_TIMESTAMP_MILLIS, pa.timestamp("ms")),
    ("long", "local-timestamp-micros"): (Kind.LOCAL_TIMESTAMP_MICROS, pa.timestamp("us")),
    ("string", "uuid"): (Kind.UUID, pa.string()),
}
_NO_UNION = ("unions of several non-null types have no Arrow mapping; "
             "use a record with optional fields")


def parse_avro(schema: Any) -> Node:
    node, nullable = _Parser().type_(schema, "", 0, "")
    if node.kind is not Kind.RECORD or nullable:
        raise schema_error("", f"the schema is {'a nullable ' if nullable else ''}{node.label}; "
                               "a typed topic's value is a struct: make the top level a record")
    return node


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, Node] = {}
        self.being_defined: set[str] = set()
        self.total_fields = 0

    def type_(self, schema: Any, path: str, depth: int, namespace: str) -> tuple[Node, bool]:
        """The node for ``schema`` and whether it is nullable (a union with null)."""
        if not isinstance(schema, list):
            return self.single(schema, path, depth, namespace), False
        non_null = [b for b in schema if b != "null" and b != {"type": "null"}]
        nulls = len(schema) - len(non_null)
        if nulls > 1:
            raise schema_error(path, "the union lists null twice; list each type once")
        if not non_null:
            raise schema_error(path, "a union of only null has no Arrow mapping; give it a type")
        if len(non_null) > 1:
            raise schema_error(path, _NO_UNION)
        if isinstance(non_null[0], list):
            raise schema_error(path, "a union directly inside a union is not valid Avro; "
                                     "flatten it")
        return self.single(non_null[0], path, depth, namespace), nulls == 1

    def single(self, schema: Any, path: str, depth: int, namespace: str) -> Node:
        if isinstance(schema, str):
            return self.named_or_primitive(schema, path, depth, namespace)
        if not isinstance(schema, dict):
            raise schema_error(path, f"{_describe(schema)} is not an Avro type; use a type "
                                     "name, a union list or a type object")
        kind = schema.get("type")
        if isinstance(kind, list | dict):
            raise schema_error(path, "a type object's \"type\" must be a name; write the "
                                     "nested type directly instead")
        if not isinstance(kind, str):
            raise schema_error(path, "the type object has no \"type\" name; add one")
        if kind in ("record", "error"):
            return self.record(schema, path, depth, namespace)
        if kind == "enum":
            return self.enum(schema, path, namespace)
        if kind == "fixed":
            return self.fixed(schema, path, namespace)
        if kind in ("array", "map"):
            if depth + 1 > MAX_DEPTH:
                raise _too_deep(path)
            key = "items" if kind == "array" else "values"
            if key not in schema:
                raise schema_error(path, f"the {kind} has no \"{key}\"; add its {key} type")
            suffix = "[]" if kind == "array" else "{}"
            element, nullable = self.type_(schema[key], path + suffix, depth + 1, namespace)
            return (array if kind == "array" else map_of)(element, nullable)
        if kind in _PRIMITIVES:
            return self.primitive(kind, schema, path)
        raise schema_error(path, f"a type object's \"type\" must be a primitive, record, "
                                 f"enum, array, map or fixed, got {kind[:40]!r}; refer to a "
                                 "named type by its name alone")

    def primitive(self, kind: str, schema: dict[str, Any], path: str) -> Node:
        logical = schema.get("logicalType")
        if logical == "decimal" and kind == "bytes":
            return _decimal(schema, path, "bytes")
        if isinstance(logical, str) and (kind, logical) in _LOGICAL:
            node_kind, arrow = _LOGICAL[(kind, logical)]
            return leaf(node_kind, logical, arrow)
        return self.named_or_primitive(kind, path, 0, "")

    def named_or_primitive(self, name: str, path: str, depth: int, namespace: str) -> Node:
        if name in _PRIMITIVES:
            node_kind, arrow = _PRIMITIVES[name]
            return leaf(node_kind, name, arrow)
        if name == "null":
            raise schema_error(path, "a null type has no Arrow mapping; use a union "
                                     "[\"null\", T] for an optional field")
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        for candidate in (full, name):
            if candidate in self.being_defined:
                raise schema_error(path, f"type '{candidate}' refers to itself (a recursive "
                                         "type); Arrow has no recursive types: give the "
                                         "nested value a type of its own")
            if candidate in self.named:
                node = self.named[candidate]
                self.count_fields(path, node.field_count)
                if depth + node.height > MAX_DEPTH:
                    raise _too_deep(path)
                return node
        raise schema_error(path, f"unknown type '{name}'; define a named type before using "
                                 "it, or use a primitive type name")

    def define(self, schema: dict[str, Any], path: str, namespace: str) -> tuple[str, str]:
        """Checks and claims the named type's full name: (full name, its namespace)."""
        name = schema.get("name")
        if not isinstance(name, str) or not all(_NAME.fullmatch(p) for p in name.split(".")):
            raise schema_error(path, f"a named type needs a valid \"name\", got {name!r}; "
                                     "use letters, digits and _ (not first)")
        own = schema.get("namespace")
        if "." in name:
            full = name
        elif isinstance(own, str):
            full = f"{own}.{name}" if own else name
        else:
            full = f"{namespace}.{name}" if namespace else name
        if full in self.named or full in self.being_defined or full in _PRIMITIVES:
            raise schema_error(path, f"type '{full}' is defined twice; define it once and "
                                     "refer to it by name")
        return full, full.rpartition(".")[0]

    def record(self, schema: dict[str, Any], path: str, depth: int, namespace: str) -> Node:
        if depth + 1 > MAX_DEPTH:
            raise _too_deep(path)
        full, inner_namespace = self.define(schema, path, namespace)
        declared = schema.get("fields")
        if not isinstance(declared, list) or not declared:
            raise schema_error(path, f"record '{full}' needs a non-empty \"fields\" list; an "
                                     "empty struct has no column to store")
        self.being_defined.add(full)
        fields: list[Field] = []
        seen: set[str] = set()
        for entry in declared:
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise schema_error(path, f"record '{full}' has a field without a valid "
                                         f"name ({_describe(entry)}); name each field")
            assert isinstance(entry, dict)
            field_path = join(path, name)
            if name in seen:
                raise schema_error(field_path, "is declared twice; declare it once")
            seen.add(name)
            self.count_fields(field_path, 1)
            if "type" not in entry:
                raise schema_error(field_path, "has no \"type\"; give it one")
            node, nullable = self.type_(entry["type"], field_path, depth + 1, inner_namespace)
            has_default = "default" in entry
            default = (_python_default(entry["default"], node, nullable)
                       if has_default else None)
            fields.append(Field(name, node, nullable, has_default, default))
        self.being_defined.discard(full)
        node = record(f"record {full}", tuple(fields))
        self.named[full] = node
        return node

    def enum(self, schema: dict[str, Any], path: str, namespace: str) -> Node:
        full, _ = self.define(schema, path, namespace)
        symbols = schema.get("symbols")
        if (not isinstance(symbols, list) or not symbols
                or not all(isinstance(s, str) and _NAME.fullmatch(s) for s in symbols)
                or len(set(symbols)) != len(symbols)):
            raise schema_error(path, f"enum '{full}' needs a non-empty list of distinct "
                                     "\"symbols\" that are valid names")
        if "default" in schema and schema["default"] not in symbols:
            raise schema_error(path, f"enum '{full}' has a default that is not one of its "
                                     "symbols; use one of them")
        node = Node(Kind.ENUM, f"enum {full}", pa.string(), symbols=tuple(symbols))
        self.named[full] = node
        return node

    def fixed(self, schema: dict[str, Any], path: str, namespace: str) -> Node:
        full, _ = self.define(schema, path, namespace)
        size = schema.get("size")
        # Size 0 is refused: every Avro value must take at least one byte, so that a body's
        # length bounds the work of decoding it (an array of 2**62 empty items would not).
        if type(size) is not int or not 1 <= size <= 2**31 - 1:
            raise schema_error(path, f"fixed '{full}' needs a \"size\" from 1 to 2**31-1, "
                                     f"got {size!r}")
        if schema.get("logicalType") == "decimal":
            node = _decimal(schema, path, f"fixed {full}({size})")
            # The largest unscaled value that fits in `size` bytes, two's complement.
            if len(str(2 ** (8 * min(size, 17) - 1) - 1)) - 1 < node.arrow.precision:
                raise schema_error(path, f"decimal precision {node.arrow.precision} does not "
                                         f"fit in fixed '{full}' of {size} bytes; make it "
                                         "larger or lower the precision")
        else:
            node = leaf(Kind.FIXED, f"fixed {full}({size})", pa.binary(size))
        self.named[full] = node
        return node

    def count_fields(self, path: str, added: int) -> None:
        self.total_fields += added
        if self.total_fields > MAX_FIELDS:
            raise schema_error(path, f"the schema has more than MAX_FIELDS={MAX_FIELDS} fields "
                                     "in total (named types count once per use); split "
                                     "the record or store the rest as a map or bytes")


def _decimal(schema: dict[str, Any], path: str, on: str) -> Node:
    precision, scale = schema.get("precision"), schema.get("scale", 0)
    if type(precision) is not int or type(scale) is not int or precision < 1 \
            or not 0 <= scale <= precision:
        raise schema_error(path, f"decimal needs an integer precision >= 1 and a scale from "
                                 f"0 to the precision, got precision={precision!r}, "
                                 f"scale={scale!r}")
    if precision > MAX_DECIMAL_PRECISION:
        raise schema_error(path, f"decimal precision {precision} is over Arrow's decimal128 "
                                 f"limit of {MAX_DECIMAL_PRECISION}; lower the precision or "
                                 "store the value as a string")
    return leaf(Kind.DECIMAL, f"decimal({precision},{scale}) on {on}",
                pa.decimal128(precision, scale))


def _too_deep(path: str) -> Exception:
    return schema_error(path, f"nesting goes deeper than MAX_DEPTH={MAX_DEPTH} levels of "
                              "records, arrays and maps; flatten the schema")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _python_default(value: Any, node: Node, nullable: bool) -> Any:
    """Avro writes defaults in JSON's words; bytes and fixed (and decimals on them) are
    strings whose code points are the bytes. Turns those into what records_to_arrow
    takes; anything malformed is left as is for the default check to refuse."""
    if value is None:
        return None
    kind = node.kind
    if kind in (Kind.BYTES, Kind.FIXED, Kind.DECIMAL) and isinstance(value, str):
        try:
            raw = value.encode("latin-1")
        except UnicodeEncodeError:
            return value
        if kind is not Kind.DECIMAL:
            return raw
        scale = node.arrow.scale
        return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)
    if kind is Kind.RECORD and isinstance(value, dict):
        fields = node.by_name
        return {k: _python_default(v, fields[k].node, fields[k].nullable) if k in fields else v
                for k, v in value.items()}
    if kind is Kind.ARRAY and isinstance(value, list) and node.element is not None:
        return [_python_default(v, node.element, node.element_nullable) for v in value]
    if kind is Kind.MAP and isinstance(value, dict) and node.element is not None:
        return {k: _python_default(v, node.element, node.element_nullable)
                for k, v in value.items()}
    return value
