"""JSON Schema (draft 7, 2019-09 and 2020-12; already JSON-decoded) to the ``Node`` tree.

Only the keywords that decide a value's shape are read; validation-only keywords
(``minimum``, ``maxLength``, ``pattern``, ...) and annotations are ignored here (they stay
in the canonical text). Keywords that would make a value one of several shapes have no
Arrow mapping and are refused. ``$ref`` is followed only into the document's own
``definitions``/``$defs``; a ``$ref`` cycle is a recursive type and is refused, and a
chain of ``$ref``s is bounded by ``MAX_DEPTH`` so recursion stays bounded. Pure
functions of their input: thread-safe.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

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

_UNMAPPABLE = {
    "oneOf": "use one type, or an object with optional properties",
    "anyOf": "use one type, or an object with optional properties",
    "allOf": "merge the schemas into one object",
    "not": "validate it before producing",
    "if": "validate it before producing",
    "then": "validate it before producing",
    "else": "validate it before producing",
    "patternProperties": "use properties, or additionalProperties for a map",
    "prefixItems": "use an array of one item type, or an object",
    "dependentSchemas": "use an object with optional properties",
    "$dynamicRef": "use $ref to #/$defs/...",
    "$recursiveRef": "use $ref to #/$defs/...",
}
_STRING_FORMATS: dict[str, tuple[Kind, pa.DataType]] = {
    "date-time": (Kind.TIMESTAMP_MICROS, pa.timestamp("us", "UTC")),
    "date": (Kind.DATE, pa.date32()),
    "uuid": (Kind.UUID, pa.string()),
    "byte": (Kind.BYTES, pa.binary()),
}
_REF = re.compile(r"#/(definitions|\$defs)/([^/]+)")


def parse_json_schema(schema: Any) -> Node:
    node, nullable = _Parser(schema).schema(schema, "", 0)
    if node.kind is not Kind.RECORD or nullable:
        raise schema_error("", f"the schema is {'a nullable ' if nullable else ''}{node.label};"
                               " a typed topic's value is a struct: make the top level "
                               "{\"type\": \"object\", \"properties\": {...}}")
    return node


class _Parser:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.ref_chain: list[str] = []
        self.total_fields = 0

    def schema(self, schema: Any, path: str, depth: int) -> tuple[Node, bool]:
        """The node for ``schema`` and whether ``null`` is one of its values."""
        if not isinstance(schema, dict):
            raise schema_error(path, f"the schema {str(schema)[:40]!s} has no Arrow mapping; "
                                     "give it an object with a \"type\"")
        for keyword, advice in _UNMAPPABLE.items():
            if keyword in schema:
                raise schema_error(path, f"\"{keyword}\" has no Arrow mapping; {advice}")
        if "$ref" in schema:
            return self.ref(schema["$ref"], path, depth)
        if "enum" in schema and (not isinstance(schema["enum"], list) or not schema["enum"]):
            raise schema_error(path, "\"enum\" must be a non-empty list of strings")
        types = schema.get("type")
        if types is None:
            if "enum" in schema:
                types = ["string", "null"] if None in schema["enum"] else "string"
            elif "properties" in schema or "additionalProperties" in schema:
                types = "object"
            else:
                raise schema_error(path, "has no \"type\"; give it one (an Arrow column has "
                                         "one type)")
        names = [types] if isinstance(types, str) else types
        if not isinstance(names, list) or not all(isinstance(t, str) for t in names):
            raise schema_error(path, f"\"type\" must be a name or a list of names, got "
                                     f"{types!r}")
        nullable = "null" in names
        non_null = sorted({t for t in names if t != "null"})
        if not non_null:
            raise schema_error(path, "a type of only null has no Arrow mapping; give it a type")
        if len(non_null) > 1:
            raise schema_error(path, f"several types {non_null} have no Arrow mapping; use one "
                                     "type (plus \"null\" for an optional value)")
        return self.typed(non_null[0], schema, path, depth), nullable

    def typed(self, kind: str, schema: dict[str, Any], path: str, depth: int) -> Node:
        if "enum" in schema:
            symbols = [v for v in schema["enum"] if v is not None]
            if kind != "string" or not symbols or not all(isinstance(v, str) for v in symbols):
                raise schema_error(path, "only a non-empty enum of strings has an Arrow "
                                         "mapping; use strings")
            unique = tuple(dict.fromkeys(symbols))
            return Node(Kind.ENUM, "string enum", pa.string(), symbols=unique)
        if kind == "boolean":
            return leaf(Kind.BOOLEAN, "boolean", pa.bool_())
        if kind == "integer":
            return leaf(Kind.LONG, "integer", pa.int64())
        if kind == "number":
            return leaf(Kind.DOUBLE, "number", pa.float64())
        if kind == "string":
            fmt = schema.get("format")
            if schema.get("contentEncoding") == "base64":
                fmt = "byte"
            if isinstance(fmt, str) and fmt in _STRING_FORMATS:
                node_kind, arrow = _STRING_FORMATS[fmt]
                return leaf(node_kind, f"string ({fmt})", arrow)
            return leaf(Kind.STRING, "string", pa.string())
        if kind == "object":
            return self.object(schema, path, depth)
        if kind == "array":
            items = schema.get("items")
            if isinstance(items, list):
                raise schema_error(path, "tuple \"items\" (a list of schemas) have no Arrow "
                                         "mapping; use one item schema, or an object")
            if items is None:
                raise schema_error(path, "the array has no \"items\" schema; give it one")
            if depth + 1 > MAX_DEPTH:
                raise _too_deep(path)
            element, nullable = self.schema(items, path + "[]", depth + 1)
            return array(element, nullable, f"array of {element.label}")
        raise schema_error(path, f"type {kind!r} is not a JSON Schema type; use boolean, "
                                 "integer, number, string, object or array")

    def object(self, schema: dict[str, Any], path: str, depth: int) -> Node:
        if depth + 1 > MAX_DEPTH:
            raise _too_deep(path)
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties is None:
            if not isinstance(extra, dict):
                raise schema_error(path, "an object without \"properties\" (or an "
                                         "\"additionalProperties\" schema for a map) has no "
                                         "Arrow mapping; list its properties")
            element, nullable = self.schema(extra, path + "{}", depth + 1)
            return map_of(element, nullable, f"object of {element.label}")
        if not isinstance(properties, dict) or not properties:
            raise schema_error(path, "\"properties\" must be a non-empty object; an empty "
                                     "struct has no column to store")
        if isinstance(extra, dict):
            raise schema_error(path, "an object with both \"properties\" and an "
                                     "\"additionalProperties\" schema has no Arrow mapping; "
                                     "move the extra keys into a map property")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise schema_error(path, "\"required\" must be a list of property names")
        for name in required:
            if name not in properties:
                raise schema_error(join(path, name), "is required but not a property; add it "
                                                     "to \"properties\" or drop it")
        fields: list[Field] = []
        for name, sub in properties.items():
            if not name:
                raise schema_error(path, "has a property with an empty name; name it")
            field_path = join(path, name)
            self.total_fields += 1
            if self.total_fields > MAX_FIELDS:
                raise schema_error(field_path, f"the schema has more than MAX_FIELDS="
                                               f"{MAX_FIELDS} properties in total ($refs count "
                                               "once per use); split the object or use a map")
            node, nullable = self.schema(sub, field_path, depth + 1)
            has_default = isinstance(sub, dict) and "default" in sub
            default = sub.get("default") if has_default else None
            fields.append(Field(name, node, nullable or name not in required, has_default,
                                default))
        return record("object", tuple(fields))

    def ref(self, target: Any, path: str, depth: int) -> tuple[Node, bool]:
        match = _REF.fullmatch(target) if isinstance(target, str) else None
        if match is None:
            raise schema_error(path, f"$ref {target!r} is not supported; only "
                                     "\"#/definitions/NAME\" and \"#/$defs/NAME\" are: move "
                                     "the type there")
        name = unquote(match[2]).replace("~1", "/").replace("~0", "~")
        container = self.root.get(match[1]) if isinstance(self.root, dict) else None
        if not isinstance(container, dict) or name not in container:
            raise schema_error(path, f"$ref {target!r} points to nothing; define it")
        if target in self.ref_chain:
            raise schema_error(path, f"$ref {target!r} refers back to itself (a recursive "
                                     "type); Arrow has no recursive types: give the nested "
                                     "value a type of its own")
        if len(self.ref_chain) >= MAX_DEPTH:
            raise schema_error(path, f"more than MAX_DEPTH={MAX_DEPTH} $refs are nested; "
                                     "inline some of them")
        self.ref_chain.append(target)
        try:
            return self.schema(container[name], path, depth)
        finally:
            self.ref_chain.pop()


def _too_deep(path: str) -> Exception:
    return schema_error(path, f"nesting goes deeper than MAX_DEPTH={MAX_DEPTH} levels of "
                              "objects and arrays; flatten the schema")
