"""wire.schema: Avro and JSON Schema parsing, limits, the Arrow mapping table,
compatibility levels, record/table conversion, resolution, Avro bodies, JSON values and
the Spark helpers. Pure logic (unit tier); deterministic (the one fuzz test has a fixed
seed)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from strata_spark import spark_arrow_type, spark_ddl
from wire.errors import (
    IncompatibleSchemaError,
    InvalidConfigError,
    InvalidRecordBatchError,
    InvalidSchemaError,
    SchemaMismatchError,
)
from wire.schema import (
    Compatibility,
    ParsedSchema,
    SchemaType,
    arrow_mismatch,
    check_compatibility,
    confluent_frame,
    from_avro_bodies,
    parse_confluent_frame,
    parse_schema,
    records_to_arrow,
    resolve,
    table_to_arrow,
    to_avro_bodies,
    to_json_values,
)

pytestmark = pytest.mark.unit

UUID_TEXT = "123e4567-e89b-12d3-a456-426614174000"


def avro(*fields: dict[str, Any], name: str = "Row") -> ParsedSchema:
    return parse_schema(json.dumps({"type": "record", "name": name, "fields": list(fields)}))


def json_schema(properties: dict[str, Any], required: list[str] | None = None,
                **extra: Any) -> ParsedSchema:
    document = {"type": "object", "properties": properties, "required": required or [],
                **extra}
    return parse_schema(json.dumps(document), "JSON")


def mismatch_of(call: Any) -> SchemaMismatchError:
    with pytest.raises(SchemaMismatchError) as caught:
        call()
    return caught.value


# ------------------------------------------------------------------ the mapping table

# (Avro type, Arrow type, a Python value, the value in to_json_values' document)
AVRO_ROWS: list[tuple[Any, pa.DataType, Any, Any]] = [
    ("boolean", pa.bool_(), True, True),
    ("int", pa.int32(), -5, -5),
    ("long", pa.int64(), 2**40, 2**40),
    ("float", pa.float32(), 1.5, 1.5),
    ("double", pa.float64(), 2.25, 2.25),
    ("bytes", pa.binary(), b"\x00\xff", "AP8="),
    ("string", pa.string(), "héllo", "héllo"),
    ({"type": "record", "name": "Address", "fields": [{"name": "zip", "type": "string"}]},
     pa.struct([pa.field("zip", pa.string(), nullable=False)]), {"zip": "75001"},
     {"zip": "75001"}),
    ({"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}, pa.string(), "GREEN",
     "GREEN"),
    ({"type": "array", "items": "long"}, pa.list_(pa.field("item", pa.int64(), nullable=False)),
     [1, 2], [1, 2]),
    ({"type": "map", "values": "int"},
     pa.map_(pa.string(), pa.field("value", pa.int32(), nullable=False)), {"a": 1, "b": 2},
     {"a": 1, "b": 2}),
    ({"type": "fixed", "name": "Four", "size": 4}, pa.binary(4), b"abcd", "YWJjZA=="),
    ({"type": "int", "logicalType": "date"}, pa.date32(), date(2024, 2, 29), "2024-02-29"),
    ({"type": "int", "logicalType": "time-millis"}, pa.int32(), 3_723_004, 3_723_004),
    ({"type": "long", "logicalType": "time-micros"}, pa.int64(), 3_723_000_004, 3_723_000_004),
    ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("ms", "UTC"),
     datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), "2024-01-02T03:04:05.006Z"),
    ({"type": "long", "logicalType": "timestamp-micros"}, pa.timestamp("us", "UTC"),
     datetime(2024, 1, 2, 3, 4, 5, 7, tzinfo=UTC), "2024-01-02T03:04:05.000007Z"),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("ms"),
     datetime(2024, 1, 2, 3, 4, 5, 6000), "2024-01-02T03:04:05.006"),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us"),
     datetime(2024, 1, 2, 3, 4, 5, 7), "2024-01-02T03:04:05.000007"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
     pa.decimal128(10, 2), Decimal("-12.34"), "-12.34"),
    ({"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal", "precision": 18,
      "scale": 4}, pa.decimal128(18, 4), Decimal("1.5000"), "1.5000"),
    ({"type": "string", "logicalType": "uuid"}, pa.string(), UUID_TEXT, UUID_TEXT),
]


@pytest.mark.parametrize(("avro_type", "arrow_type", "value", "json_value"), AVRO_ROWS,
                         ids=[json.dumps(row[0])[:50] for row in AVRO_ROWS])
def test_avro_mapping_row(avro_type: Any, arrow_type: pa.DataType, value: Any,
                          json_value: Any) -> None:
    schema = avro({"name": "v", "type": avro_type})
    assert schema.schema_type is SchemaType.AVRO
    assert schema.arrow_type == pa.struct([pa.field("v", arrow_type, nullable=False)])
    values = records_to_arrow([{"v": value}, {"v": value}], schema)
    assert values.type == schema.arrow_type
    assert from_avro_bodies(to_avro_bodies(values, schema), schema).equals(values)
    documents = to_json_values(values)
    assert [json.loads(d) for d in documents] == [{"v": json_value}] * 2
    # What to_json_values writes, records_to_arrow takes back.
    assert records_to_arrow([json.loads(d) for d in documents], schema).equals(values)


@pytest.mark.parametrize("union", [["null", "string"], ["string", "null"]])
def test_avro_union_with_null_is_a_nullable_field(union: list[str]) -> None:
    schema = avro({"name": "v", "type": union}, {"name": "n", "type": "long"})
    assert schema.arrow_type == pa.struct([pa.field("v", pa.string(), nullable=True),
                                           pa.field("n", pa.int64(), nullable=False)])
    values = records_to_arrow([{"v": "x", "n": 1}, {"v": None, "n": 2}, {"n": 3}], schema)
    assert values.field("v").to_pylist() == ["x", None, None]
    assert from_avro_bodies(to_avro_bodies(values, schema), schema).equals(values)
    assert json.loads(to_json_values(values)[1]) == {"v": None, "n": 2}


def test_avro_nullable_items_values_and_records() -> None:
    schema = avro(
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {"name": "m", "type": ["null", {"type": "map", "values": ["null", "long"]}]},
        {"name": "a", "type": ["null", {"type": "record", "name": "A",
                                        "fields": [{"name": "zip", "type": "string"}]}]})
    assert schema.arrow_type.field("tags").type == pa.list_(pa.string())
    assert schema.arrow_type.field("m").nullable
    values = records_to_arrow([
        {"tags": ["x", None], "m": {"k": None}, "a": None},
        {"tags": [], "m": None, "a": {"zip": "1"}},
    ], schema)
    assert values.field("a").to_pylist() == [None, {"zip": "1"}]
    assert from_avro_bodies(to_avro_bodies(values, schema), schema).equals(values)
    assert json.loads(to_json_values(values)[0]) == {"tags": ["x", None], "m": {"k": None},
                                                     "a": None}


def test_avro_named_type_reused_by_name_and_namespaces() -> None:
    schema = parse_schema(json.dumps({
        "type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "ship", "type": {"type": "record", "name": "Address",
                                      "fields": [{"name": "zip", "type": "string"}]}},
            {"name": "bill", "type": "Address"},
            {"name": "gift", "type": ["null", "shop.Address"], "default": None},
        ]}))
    address = pa.struct([pa.field("zip", pa.string(), nullable=False)])
    assert schema.arrow_type == pa.struct([pa.field("ship", address, nullable=False),
                                           pa.field("bill", address, nullable=False),
                                           pa.field("gift", address)])


def test_avro_unions_of_several_types_are_refused() -> None:
    with pytest.raises(InvalidSchemaError, match=r"field 'v': unions of several non-null "
                                                 r"types have no Arrow mapping; use a record "
                                                 r"with optional fields"):
        avro({"name": "v", "type": ["null", "string", "long"]})
    with pytest.raises(InvalidSchemaError, match="unions of several non-null types"):
        avro({"name": "v", "type": ["string", "long"]})


def test_avro_decimal_precision_over_38_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match=r"field 'price': decimal precision 39 .*38"):
        avro({"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                        "precision": 39, "scale": 2}})


def test_avro_unknown_logical_type_keeps_the_underlying_type() -> None:
    schema = avro({"name": "v", "type": {"type": "long", "logicalType": "no-such-thing"}})
    assert schema.arrow_type.field("v").type == pa.int64()


# (JSON Schema, Arrow type, a JSON value: both what records_to_arrow takes and what
# to_json_values writes)
JSON_ROWS: list[tuple[dict[str, Any], pa.DataType, Any]] = [
    ({"type": "boolean"}, pa.bool_(), True),
    ({"type": "integer"}, pa.int64(), -7),
    ({"type": "number"}, pa.float64(), 0.5),
    ({"type": "string"}, pa.string(), "x"),
    ({"type": "string", "format": "email", "maxLength": 9}, pa.string(), "a@b.c"),
    ({"type": "string", "format": "date-time"}, pa.timestamp("us", "UTC"),
     "2024-01-02T03:04:05.000007Z"),
    ({"type": "string", "format": "date"}, pa.date32(), "2024-02-29"),
    ({"type": "string", "format": "uuid"}, pa.string(), UUID_TEXT),
    ({"type": "string", "format": "byte"}, pa.binary(), "AP8="),
    ({"type": "string", "contentEncoding": "base64"}, pa.binary(), "AP8="),
    ({"type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}},
      "required": ["zip"]},
     pa.struct([pa.field("zip", pa.string(), nullable=False), pa.field("n", pa.int64())]),
     {"zip": "1", "n": None}),
    ({"type": "object", "additionalProperties": {"type": "integer"}},
     pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False)), {"a": 1}),
    ({"type": "array", "items": {"type": "string"}},
     pa.list_(pa.field("item", pa.string(), nullable=False)), ["a", "b"]),
    ({"type": "array", "items": {"type": ["integer", "null"]}}, pa.list_(pa.int64()), [1, None]),
    ({"enum": ["RED", "GREEN"]}, pa.string(), "RED"),
    ({"type": "string", "enum": ["RED", "GREEN"]}, pa.string(), "GREEN"),
    ({"$ref": "#/definitions/Address"},
     pa.struct([pa.field("zip", pa.string(), nullable=False)]), {"zip": "9"}),
    ({"$ref": "#/$defs/Point"},
     pa.struct([pa.field("x", pa.float64(), nullable=False)]), {"x": 1.5}),
]
DEFINITIONS = {
    "definitions": {"Address": {"type": "object", "properties": {"zip": {"type": "string"}},
                                "required": ["zip"]}},
    "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}},
                        "required": ["x"]}},
}


@pytest.mark.parametrize(("property_schema", "arrow_type", "value"), JSON_ROWS,
                         ids=[json.dumps(row[0])[:50] for row in JSON_ROWS])
def test_json_schema_mapping_row(property_schema: dict[str, Any], arrow_type: pa.DataType,
                                 value: Any) -> None:
    schema = json_schema({"v": property_schema}, ["v"], **DEFINITIONS)
    assert schema.schema_type is SchemaType.JSON
    assert schema.arrow_type == pa.struct([pa.field("v", arrow_type, nullable=False)])
    values = records_to_arrow([{"v": value}], schema)
    assert [json.loads(d) for d in to_json_values(values)] == [{"v": value}]
    with pytest.raises(InvalidSchemaError, match="Avro bodies need an Avro schema"):
        to_avro_bodies(values, schema)


def test_json_schema_optional_and_nullable_properties() -> None:
    schema = json_schema({"a": {"type": "integer"}, "b": {"type": ["string", "null"]},
                          "c": {"type": "boolean", "default": True}}, ["a", "b"])
    assert schema.arrow_type == pa.struct([pa.field("a", pa.int64(), nullable=False),
                                           pa.field("b", pa.string()),
                                           pa.field("c", pa.bool_())])
    values = records_to_arrow([{"a": 1, "b": None}], schema)
    assert values.to_pylist() == [{"a": 1, "b": None, "c": True}]


@pytest.mark.parametrize(("keyword", "value"), [
    ("oneOf", [{"type": "string"}, {"type": "integer"}]),
    ("anyOf", [{"type": "string"}, {"type": "integer"}]),
    ("allOf", [{"type": "string"}]),
    ("if", {"type": "string"}),
    ("then", {"type": "string"}),
    ("patternProperties", {"^x": {"type": "string"}}),
    ("items", [{"type": "string"}, {"type": "integer"}]),
    ("prefixItems", [{"type": "string"}]),
])
def test_json_schema_keywords_without_arrow_mapping_are_refused(keyword: str,
                                                                 value: Any) -> None:
    property_schema = {"type": "array"} if keyword in ("items", "prefixItems") else {}
    property_schema[keyword] = value
    with pytest.raises(InvalidSchemaError, match=r"field 'v': .*no Arrow mapping"):
        json_schema({"v": property_schema})


def test_json_schema_several_types_and_untyped_properties_are_refused() -> None:
    with pytest.raises(InvalidSchemaError, match=r"field 'v': several types"):
        json_schema({"v": {"type": ["string", "integer"]}})
    with pytest.raises(InvalidSchemaError, match=r"field 'v': has no \"type\""):
        json_schema({"v": {"description": "anything"}})
    with pytest.raises(InvalidSchemaError, match=r"field 'ghost': is required but not a "
                                                 r"property"):
        json_schema({"v": {"type": "string"}}, ["ghost"])


def test_top_level_must_be_a_record_or_an_object() -> None:
    with pytest.raises(InvalidSchemaError, match="make the top level a record"):
        parse_schema('"string"')
    with pytest.raises(InvalidSchemaError, match="make the top level"):
        parse_schema('{"type": "array", "items": {"type": "string"}}', "JSON")


def test_schema_type_is_case_insensitive() -> None:
    text = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    assert parse_schema(text, "json") == parse_schema(text, SchemaType.JSON)


# ------------------------------------------------------------ canonical and fingerprint


def test_avro_canonical_is_stable_under_whitespace_and_key_order() -> None:
    compact = ('{"type":"record","name":"R","fields":[{"name":"a","type":"long"},'
               '{"name":"b","type":["null","string"],"default":null}]}')
    pretty = """
    {
        "fields": [
            {"type": "long",   "name": "a"},
            {"default": null, "name": "b", "type": ["null", "string"]}
        ],
        "name": "R",
        "type": "record"
    }"""
    first, second = parse_schema(compact), parse_schema(pretty)
    assert first.canonical == second.canonical
    assert first.fingerprint == second.fingerprint
    assert first.fingerprint == hashlib.sha256(first.canonical.encode()).hexdigest()
    assert first == second
    assert " " not in first.canonical and "\n" not in first.canonical
    # A different default is a different schema.
    changed = parse_schema(compact.replace('"default":null', '"default":null,"doc":"x"'))
    assert changed.fingerprint != first.fingerprint


def test_json_schema_canonical_sorts_keys_but_keeps_property_order() -> None:
    first = parse_schema(json.dumps({
        "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "T",
        "type": "object", "required": ["a", "b"],
        "properties": {"b": {"type": "integer", "minimum": 0}, "a": {"type": "string"}}}),
        "JSON")
    shuffled = parse_schema(json.dumps({
        "properties": {"b": {"minimum": 0, "type": "integer"}, "a": {"type": "string"}},
        "required": ["b", "a"], "type": "object", "title": "T",
        "$schema": "https://json-schema.org/draft/2020-12/schema"}, indent=4), "JSON")
    assert first.canonical == shuffled.canonical
    assert first.fingerprint == shuffled.fingerprint
    assert '"title":"T"' in first.canonical and '"minimum":0' in first.canonical
    assert first.arrow_type.names == ["b", "a"]
    reordered = parse_schema(json.dumps({
        "type": "object", "required": ["a", "b"],
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}), "JSON")
    assert reordered.arrow_type.names == ["a", "b"]
    assert reordered.fingerprint != first.fingerprint


def test_defaults_are_kept() -> None:
    schema = avro({"name": "a", "type": "long", "default": 3},
                  {"name": "b", "type": "bytes", "default": "\u00ff"},
                  {"name": "c", "type": "string"})
    assert schema.defaults() == {"a": 3, "b": b"\xff"}


def test_a_default_that_does_not_fit_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match=r"field 'a': its default .* does not fit"):
        avro({"name": "a", "type": "int", "default": "seven"})
    with pytest.raises(InvalidSchemaError, match=r"field 'e': its default .* does not fit"):
        avro({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]},
              "default": "Y"})


# ---------------------------------------------------------------------- compatibility

BASE = [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]


def version(*fields: dict[str, Any]) -> ParsedSchema:
    return avro(*fields)


def compatible(new: ParsedSchema, old: list[ParsedSchema], level: str) -> bool:
    return not check_compatibility(new, old, level)


CASES: dict[str, tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "added optional field": (
        [BASE], [*BASE, {"name": "email", "type": ["null", "string"], "default": None}]),
    "added field with default": (
        [BASE], [*BASE, {"name": "email", "type": "string", "default": ""}]),
    "added required field without default": (
        [BASE], [*BASE, {"name": "email", "type": "string"}]),
    "removed field with default": (
        [[BASE[0], {"name": "name", "type": "string", "default": "?"}]], [BASE[0]]),
    "removed field without default": ([BASE], [BASE[0]]),
    "int to long": ([[{"name": "n", "type": "int"}]], [{"name": "n", "type": "long"}]),
    "long to int": ([[{"name": "n", "type": "long"}]], [{"name": "n", "type": "int"}]),
    "string to long": ([[{"name": "n", "type": "string"}]], [{"name": "n", "type": "long"}]),
}
# For each case: compatible under (BACKWARD, FORWARD, FULL)?
EXPECTED = {
    "added optional field": (True, True, True),
    "added field with default": (True, True, True),
    "added required field without default": (False, True, False),
    "removed field with default": (True, True, True),
    "removed field without default": (True, False, False),
    "int to long": (True, False, False),
    "long to int": (False, True, False),
    "string to long": (False, False, False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("level", ["BACKWARD", "FORWARD", "FULL", "BACKWARD_TRANSITIVE",
                                   "FORWARD_TRANSITIVE", "FULL_TRANSITIVE", "NONE"])
def test_compatibility_levels(case: str, level: str) -> None:
    olds, new = CASES[case]
    old_versions = [version(*fields) for fields in olds]
    backward, forward, full = EXPECTED[case]
    expected = {"BACKWARD": backward, "FORWARD": forward, "FULL": full,
                "NONE": True}[level.removesuffix("_TRANSITIVE")]
    reasons = check_compatibility(version(*new), old_versions, level)
    assert (not reasons) == expected, reasons


def test_compatibility_reasons_name_the_field_and_version() -> None:
    v1 = version(*BASE)
    added = version(*BASE, {"name": "email", "type": "string"})
    [reason] = check_compatibility(added, [v1], Compatibility.BACKWARD)
    assert reason.startswith("version 1: field 'email' is new and has no default")
    assert "give it a default or make it optional" in reason
    [reason] = check_compatibility(version(BASE[0]), [v1], Compatibility.FORWARD)
    assert reason.startswith("version 1: field 'name' is removed")
    price_string = version({"name": "price", "type": "string"})
    price_long = version({"name": "price", "type": "long"})
    [reason] = check_compatibility(price_long, [price_string, price_string], "backward")
    assert reason.startswith("version 2: field 'price' changed type from string to long")
    assert len(check_compatibility(price_long, [price_string], "FULL")) == 2
    assert check_compatibility(price_long, [price_string, price_string], "BACKWARD",
                               version_numbers=[4, 7])[0].startswith("version 7: ")


def test_compatibility_nested_records_arrays_and_enums() -> None:
    def order(zip_type: str, symbols: list[str], item: Any) -> ParsedSchema:
        return version(
            {"name": "address", "type": {"type": "record", "name": "A",
                                         "fields": [{"name": "zip", "type": zip_type}]}},
            {"name": "status", "type": {"type": "enum", "name": "S", "symbols": symbols}},
            {"name": "lines", "type": {"type": "array", "items": item}})

    old = order("string", ["NEW", "PAID"], "int")
    assert not check_compatibility(order("bytes", ["NEW", "PAID", "SENT"], "long"), [old],
                                   "BACKWARD")
    reasons = check_compatibility(order("long", ["NEW"], ["null", "int"]), [old], "FULL")
    text = "\n".join(reasons)
    assert "field 'address.zip' changed type from string to long" in text
    assert "field 'status' drops enum symbols ['PAID']" in text
    assert "field 'lines[]' becomes nullable" in text


def test_compatibility_nullability() -> None:
    optional = version({"name": "a", "type": ["null", "string"], "default": None})
    required = version({"name": "a", "type": "string"})
    [reason] = check_compatibility(required, [optional], "BACKWARD")
    assert "field 'a' is no longer nullable" in reason
    assert not check_compatibility(optional, [required], "BACKWARD")
    assert check_compatibility(optional, [required], "FORWARD")


def test_transitive_levels_compare_with_every_version() -> None:
    # FORWARD: only the oldest version lacks a default for the removed field.
    v1 = version(BASE[0], {"name": "name", "type": "string"})
    v2 = version(BASE[0], {"name": "name", "type": "string", "default": "?"})
    v3 = version(BASE[0])
    assert check_compatibility(v3, [v1, v2], "FORWARD") == []
    [reason] = check_compatibility(v3, [v1, v2], "FORWARD_TRANSITIVE")
    assert reason.startswith("version 1: field 'name' is removed")
    assert check_compatibility(v3, [v1, v2], "FULL") == []
    assert check_compatibility(v3, [v1, v2], "FULL_TRANSITIVE")
    # BACKWARD: only the oldest version lacks the field the new one requires.
    w1 = version(BASE[0])
    w2 = version(BASE[0], {"name": "email", "type": "string", "default": ""})
    w3 = version(BASE[0], {"name": "email", "type": "string"})
    assert check_compatibility(w3, [w1, w2], "BACKWARD") == []
    [reason] = check_compatibility(w3, [w1, w2], "BACKWARD_TRANSITIVE")
    assert reason.startswith("version 1: field 'email' is new")


def test_compatibility_json_schema_and_mixed_types() -> None:
    old = json_schema({"id": {"type": "integer"}}, ["id"])
    assert not check_compatibility(
        json_schema({"id": {"type": "integer"}, "note": {"type": "string"}}, ["id"]), [old],
        "FULL")
    [reason] = check_compatibility(
        json_schema({"id": {"type": "integer"}, "note": {"type": "string"}}, ["id", "note"]),
        [old], "BACKWARD")
    assert reason.startswith("version 1: field 'note' is new and has no default")
    widened = json_schema({"id": {"type": "number"}}, ["id"])
    assert not check_compatibility(widened, [old], "BACKWARD")
    assert check_compatibility(widened, [old], "FORWARD")
    [reason] = check_compatibility(version(*BASE), [old], "BACKWARD")
    assert "schema type changes from JSON to AVRO" in reason


def test_compatibility_none_empty_history_and_bad_level() -> None:
    v1 = version(*BASE)
    assert check_compatibility(version(BASE[0], {"name": "name", "type": "long"}), [v1],
                               "NONE") == []
    assert check_compatibility(v1, [], "FULL_TRANSITIVE") == []
    with pytest.raises(InvalidConfigError, match="'SIDEWAYS' is not one of NONE, BACKWARD"):
        check_compatibility(v1, [v1], "SIDEWAYS")
    assert IncompatibleSchemaError.code == 1501  # what the registry raises with the reasons


# ------------------------------------------------------------------- hostile schemas


def nested_records(levels: int) -> str:
    inner: dict[str, Any] = {"type": "record", "name": f"R{levels}",
                             "fields": [{"name": "leaf", "type": "long"}]}
    for level in range(levels - 1, 0, -1):
        inner = {"type": "record", "name": f"R{level}", "fields": [{"name": "f", "type": inner}]}
    return json.dumps(inner)


def nested_objects(levels: int) -> str:
    inner: dict[str, Any] = {"type": "object", "properties": {"leaf": {"type": "integer"}}}
    for _ in range(levels - 1):
        inner = {"type": "object", "properties": {"f": inner}}
    return json.dumps(inner)


def test_depth_limit() -> None:
    assert parse_schema(nested_records(32)).arrow_type.names == ["f"]
    with pytest.raises(InvalidSchemaError, match=r"field 'f(\.f){31}': nesting goes deeper "
                                                 r"than MAX_DEPTH=32"):
        parse_schema(nested_records(33))
    parse_schema(nested_objects(32), "JSON")
    with pytest.raises(InvalidSchemaError, match=r"field 'f(\.f){31}': .*MAX_DEPTH=32"):
        parse_schema(nested_objects(33), "JSON")


def test_text_size_limit() -> None:
    text = json.dumps({"type": "record", "name": "R", "doc": "x" * (300 * 1024),
                       "fields": [{"name": "a", "type": "long"}]})
    with pytest.raises(InvalidSchemaError, match=r"over MAX_SCHEMA_BYTES=262144"):
        parse_schema(text)


def test_field_count_limit_counts_every_reuse() -> None:
    inner = {"type": "record", "name": "Inner",
             "fields": [{"name": f"a{i}", "type": "int"} for i in range(100)]}
    fields = [{"name": "f0", "type": inner}] + [{"name": f"f{i}", "type": "Inner"}
                                                for i in range(1, 101)]
    text = json.dumps({"type": "record", "name": "R", "fields": fields})
    assert len(text) < 64 * 1024
    with pytest.raises(InvalidSchemaError, match=r"field 'f\d+': the schema has more than "
                                                 r"MAX_FIELDS=10000 fields"):
        parse_schema(text)
    # Doubling at each level would be 2**25 fields if expanded: refused as fast.
    levels: list[dict[str, Any]] = [{"type": "record", "name": "T0", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": "long"}]}]
    for i in range(1, 25):
        levels.append({"type": "record", "name": f"T{i}", "fields": [
            {"name": "a", "type": levels[-1] if i == 1 else f"T{i - 1}"},
            {"name": "b", "type": f"T{i - 1}"}]})
    doubling = levels[1]
    for i in range(2, 25):
        levels[i]["fields"][0]["type"] = doubling
        doubling = levels[i]
    with pytest.raises(InvalidSchemaError, match="MAX_FIELDS=10000"):
        parse_schema(json.dumps(doubling))


def test_flat_10001_fields_are_refused() -> None:
    properties = {f"p{i}": {"enum": ["a"]} for i in range(10_001)}
    text = json.dumps({"type": "object", "properties": properties}, separators=(",", ":"))
    assert len(text) < 256 * 1024
    with pytest.raises(InvalidSchemaError, match=r"field 'p10000': .*MAX_FIELDS=10000"):
        parse_schema(text, "JSON")


def test_recursive_types_are_refused() -> None:
    with pytest.raises(InvalidSchemaError, match=r"field 'next': type 'Node' refers to itself "
                                                 r"\(a recursive type\)"):
        parse_schema(json.dumps({"type": "record", "name": "Node", "fields": [
            {"name": "value", "type": "long"},
            {"name": "next", "type": ["null", "Node"], "default": None}]}))
    with pytest.raises(InvalidSchemaError, match=r"field 'b\.a': type 'x\.A' refers to itself"):
        parse_schema(json.dumps({"type": "record", "name": "A", "namespace": "x", "fields": [
            {"name": "b", "type": {"type": "record", "name": "B", "fields": [
                {"name": "a", "type": ["null", "A"]}]}}]}))
    with pytest.raises(InvalidSchemaError, match=r"field 'n\.child': \$ref '#/\$defs/N' refers "
                                                 r"back to itself"):
        parse_schema(json.dumps({
            "type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
            "$defs": {"N": {"type": "object",
                            "properties": {"child": {"$ref": "#/$defs/N"}}}}}), "JSON")
    with pytest.raises(InvalidSchemaError, match="refers back to itself"):
        parse_schema(json.dumps({"type": "object", "properties": {"n": {"$ref": "#/$defs/A"}},
                                 "$defs": {"A": {"$ref": "#/$defs/B"},
                                           "B": {"$ref": "#/$defs/A"}}}), "JSON")


@pytest.mark.parametrize(("text", "schema_type", "message"), [
    ("{not json", "AVRO", r"not valid JSON \(line 1, column 2"),
    ("", "JSON", "not valid JSON"),
    ('{"type": "record", "name": "R", "name": "S", "fields": []}', "AVRO", "appears twice"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long", '
     '"default": NaN}]}', "AVRO", "NaN is not JSON"),
    ("[" * 100_000, "AVRO", "JSON"),
    ('{"a":' * 300 + "1" + "}" * 300, "JSON", "nests JSON more than 256 levels"),
    ('{"type": "object", "properties": {"a": {"type": "integer"}}}', "PROTOBUF",
     r"schema type 'PROTOBUF' is not supported; use one of AVRO, JSON"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Missing"}]}', "AVRO",
     r"field 'a': unknown type 'Missing'"),
    ('{"type": "record", "name": "R", "fields": []}', "AVRO", "non-empty \"fields\""),
    ('{"type": "record", "name": "R", "fields": [{"name": "f", "type": '
     '{"type": "fixed", "name": "F", "size": 0}}]}', "AVRO", r"field 'f': fixed 'F' needs"),
    ('{"type": "object", "properties": {"a": {"$ref": "https://x/y.json"}}}', "JSON",
     r"field 'a': \$ref 'https://x/y.json' is not supported"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "null"}]}', "AVRO",
     "field 'a': a null type has no Arrow mapping"),
])
def test_bad_schema_texts(text: str, schema_type: str, message: str) -> None:
    with pytest.raises(InvalidSchemaError, match=message):
        parse_schema(text, schema_type)


def test_references_are_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="schema references are not supported"):
        parse_schema(nested_records(1), "AVRO", [{"name": "x", "subject": "s", "version": 1}])


def test_mutated_schema_texts_raise_only_invalid_schema_error() -> None:
    seeds = [nested_records(3), nested_objects(3),
             json.dumps({"type": "record", "name": "R", "fields": [
                 {"name": r[0] if isinstance(r[0], str) else f"f{i}", "type": r[0]}
                 for i, r in enumerate(AVRO_ROWS)]})]
    rng = random.Random(20240607)
    alphabet = '{}[]",:0123456789abcdefnulltrue\\ -.eE'
    for attempt in range(600):
        text = list(seeds[attempt % len(seeds)])
        for _ in range(rng.randint(1, 6)):
            position = rng.randrange(len(text))
            action = rng.random()
            if action < 0.4:
                del text[position]
            elif action < 0.7:
                text.insert(position, rng.choice(alphabet))
            else:
                text[position] = rng.choice(alphabet)
        with contextlib.suppress(InvalidSchemaError):
            parse_schema("".join(text), "JSON" if attempt % 3 == 1 else "AVRO")


# ---------------------------------------------------------------------- arrow_mismatch

PERSON = json_schema({"email": {"type": "string"},
                      "address": {"type": "object", "properties": {"zip": {"type": "integer"}},
                                  "required": ["zip"]}}, ["email", "address"])


def test_arrow_mismatch_messages() -> None:
    address = pa.struct([pa.field("zip", pa.int64(), nullable=False)])
    assert arrow_mismatch(PERSON.arrow_type, PERSON) is None
    assert arrow_mismatch(pa.struct([pa.field("email", pa.string(), nullable=False),
                                     pa.field("address", address, nullable=False)]),
                          PERSON) is None
    assert arrow_mismatch(
        pa.struct([pa.field("email", pa.string(), nullable=False),
                   pa.field("address", pa.struct([pa.field("zip", pa.string(), nullable=False)]),
                            nullable=False)]), PERSON) == \
        "field 'address.zip': expected int64, got string"
    assert arrow_mismatch(pa.struct([pa.field("address", address, nullable=False)]),
                          PERSON) == "field 'email' is missing"
    assert arrow_mismatch(pa.struct([pa.field("email", pa.string(), nullable=False),
                                     pa.field("address", address, nullable=False),
                                     pa.field("extra", pa.int8())]),
                          PERSON) == "field 'extra' is not in the schema"
    assert arrow_mismatch(pa.struct([pa.field("email", pa.string()),
                                     pa.field("address", address, nullable=False)]),
                          PERSON) == "field 'email': expected not nullable, got nullable"
    assert arrow_mismatch(pa.struct([pa.field("address", address, nullable=False),
                                     pa.field("email", pa.string(), nullable=False)]),
                          PERSON) == "field 'email' is at position 1, expected 0"
    assert arrow_mismatch(pa.int64(), PERSON) == \
        "the top level: expected a struct of the schema's fields, got int64"
    tags = json_schema({"tags": {"type": "array", "items": {"type": "integer"}}}, ["tags"])
    assert arrow_mismatch(pa.struct([pa.field("tags", pa.list_(pa.int64()), nullable=False)]),
                          tags) == "field 'tags[]': expected not nullable, got nullable"


# -------------------------------------------------------------------- records_to_arrow

ORDER = avro(
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "country", "type": "string", "default": "FR"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]},
     "default": "NEW"},
    {"name": "items", "type": {"type": "array", "items": {
        "type": "record", "name": "Item", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}},
     "default": []},
    {"name": "ref", "type": ["null", {"type": "string", "logicalType": "uuid"}],
     "default": None},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
     "default": None},
    {"name": "local", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}],
     "default": None},
    {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                        "precision": 6, "scale": 2}], "default": None},
    {"name": "blob", "type": ["null", {"type": "fixed", "name": "Two", "size": 2}],
     "default": None},
    {"name": "small", "type": ["null", "int"], "default": None},
    name="Order")


def good(**changes: Any) -> dict[str, Any]:
    return {"id": 1, "name": "a", **changes}


def test_records_to_arrow_fills_defaults_and_nulls() -> None:
    values = records_to_arrow([good(), good(email="e", country="DE", items=[
        {"sku": "x", "qty": 2}])], ORDER)
    rows = values.to_pylist()
    assert rows[0]["email"] is None and rows[0]["country"] == "FR"
    assert rows[0]["status"] == "NEW" and rows[0]["items"] == []
    assert rows[1]["items"] == [{"sku": "x", "qty": 2}] and rows[1]["country"] == "DE"
    assert records_to_arrow([], ORDER).type == ORDER.arrow_type


def test_records_to_arrow_accepts_the_documented_forms() -> None:
    values = records_to_arrow([
        good(at=1_700_000_000_123, local="2024-01-02T03:04:05.123456", price="12.30",
             blob=base64.b64encode(b"hi").decode(), id=2.0),
        good(at="2023-11-14T22:13:20.123+00:00", price=Decimal("1.5"), blob=bytearray(b"yo")),
        good(at=datetime(2023, 11, 14, 23, 13, 20, 123999, tzinfo=UTC).astimezone(),
             price=7),
    ], ORDER)
    at = values.field("at").cast(pa.int64()).to_pylist()
    assert at[:2] == [1_700_000_000_123, 1_700_000_000_123]
    assert at[2] == 1_700_003_600_123  # truncated to the field's millisecond
    assert values.field("price").to_pylist() == [Decimal("12.30"), Decimal("1.50"),
                                                 Decimal("7.00")]
    assert values.field("blob").to_pylist()[:2] == [b"hi", b"yo"]
    assert values.field("id").to_pylist()[0] == 2


@pytest.mark.parametrize(("records", "record", "field", "reason"), [
    ([good(), {"id": 2}], 1, "name", "is missing; it is required"),
    ([good(extra=1)], 0, "extra", "is not in the schema"),
    ([good(), good(), good(items=[{"sku": "a", "qty": 1}, {"sku": "b", "qty": "x"}])], 2,
     "items[].qty", "expected int, got str 'x'"),
    ([good(), good(items=[{"sku": "a", "qty": 1, "colour": "red"}])], 1, "items[].colour",
     "is not in the schema"),
    ([good(), good(items=[{"sku": "a"}])], 1, "items[].qty", "is missing"),
    ([good(name=None)], 0, "name", "is null, but the schema does not allow null"),
    ([good(), good(id=True)], 1, "id", "expected long, got bool True"),
    ([good(id=1.5)], 0, "id", "expected long, got float 1.5"),
    ([good(small=2**31)], 0, "small", "out of range for int"),
    ([good(), good(status="LOST")], 1, "status", "'LOST' is not a symbol of enum Status"),
    ([good(), good(), good(ref="not-a-uuid")], 2, "ref", "is not a UUID"),
    ([good(price=1.5)], 0, "price", "is a float, which is not exact"),
    ([good(price="1.234")], 0, "price", "more than 2 decimal places"),
    ([good(price="12345.6")], 0, "price", "more than 4 digits before the point"),
    ([good(at="yesterday")], 0, "at", "is not an ISO-8601 date-time"),
    ([good(local="2024-01-02T03:04:05+02:00")], 0, "local", "has a time zone"),
    ([good(blob="***")], 0, "blob", "is not base64"),
    ([good(blob=b"abc")], 0, "blob", "has 3 bytes; fixed Two(2) holds exactly 2"),
    ([good(items="none")], 0, "items", "expected an array, got str"),
    ([good(), "not a record"], 1, "", "expected an object"),
])
def test_records_to_arrow_errors(records: list[Any], record: int, field: str,
                                 reason: str) -> None:
    error = mismatch_of(lambda: records_to_arrow(records, ORDER))
    assert isinstance(error, InvalidRecordBatchError) and error.code == 1503
    assert error.record == record  # type: ignore[attr-defined]
    assert error.field == field  # type: ignore[attr-defined]
    where = f"field '{field}'" if field else "the top level"
    assert error.message.startswith(f"record {record}: {where}: ")
    assert reason in error.message


def test_records_to_arrow_map_and_nested_null_struct() -> None:
    schema = json_schema({
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "address": {"type": ["object", "null"], "properties": {"zip": {"type": "string"}},
                    "required": ["zip"]}})
    values = records_to_arrow([{"attrs": {"a": 1}, "address": None},
                               {"address": {"zip": "1"}}], schema)
    assert values.field("address").to_pylist() == [None, {"zip": "1"}]
    error = mismatch_of(lambda: records_to_arrow([{"attrs": {"a": 1}}, {"attrs": {"b": "x"}}],
                                                 schema))
    assert (error.record, error.field) == (1, "attrs{}")  # type: ignore[attr-defined]
    error = mismatch_of(lambda: records_to_arrow([{"attrs": {"a": None}}], schema))
    assert (error.record, error.field) == (0, "attrs{}")  # type: ignore[attr-defined]
    error = mismatch_of(lambda: records_to_arrow([{}, {"address": {}}], schema))
    assert (error.record, error.field) == (1, "address.zip")  # type: ignore[attr-defined]


def test_json_values_write_non_finite_floats_as_text() -> None:
    schema = json_schema({"x": {"type": "number"}}, ["x"])
    values = records_to_arrow([{"x": "NaN"}, {"x": "-Infinity"}, {"x": 1}], schema)
    documents = to_json_values(values)
    assert documents == [b'{"x":"NaN"}', b'{"x":"-Infinity"}', b'{"x":1.0}']
    assert to_json_values(records_to_arrow([json.loads(d) for d in documents], schema)) == \
        documents


# ---------------------------------------------------------------------- table_to_arrow

TYPED = avro({"name": "id", "type": "int"},
             {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
             {"name": "name", "type": ["null", "string"]},
             {"name": "tags", "type": {"type": "array", "items": "string"}})


def typed_table(**columns: pa.Array) -> pa.Table:
    base = {"name": pa.array(["a", None]),
            "at": pa.array([0, 1_000], pa.timestamp("ms", "UTC")),
            "id": pa.array([1, 2], pa.int64()),
            "tags": pa.array([["x"], []], pa.large_list(pa.large_string()))}
    base.update(columns)
    return pa.table({k: v for k, v in base.items() if v is not None})


def test_table_to_arrow_reorders_and_casts_losslessly() -> None:
    values = table_to_arrow(typed_table(), TYPED)
    assert values.type == TYPED.arrow_type
    assert values.to_pylist()[1] == {"id": 2, "at": datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
                                     "name": None, "tags": []}
    batch = typed_table(name=pa.array(["a", "b"]).dictionary_encode()).to_batches()[0]
    assert table_to_arrow(batch, TYPED).field("name").to_pylist() == ["a", "b"]
    assert table_to_arrow(values, TYPED).equals(values)
    chunked = pa.concat_tables([typed_table(), typed_table()])
    assert len(table_to_arrow(chunked, TYPED)) == 4


@pytest.mark.parametrize(("columns", "field", "record", "reason"), [
    ({"id": pa.array([1, 2**40])}, "id", 1, "cannot be cast from int64 to int32 without losing"),
    ({"id": None}, "id", None, "is missing"),
    ({"extra": pa.array([1, 2])}, "extra", None, "is not in the schema"),
    ({"id": pa.array([1, None])}, "id", 1, "is null, but the schema does not allow null"),
    ({"at": pa.array([0, 1], pa.timestamp("ms"))}, "at", None, "have no time zone"),
    ({"at": pa.array([0, 1], pa.timestamp("ns", "UTC"))}, "at", 1, "without losing data"),
    ({"id": pa.array([1.0, 2.0])}, "id", None, "expected int32 (int), got double"),
    ({"tags": pa.array([["x"], [None]])}, "tags[]", 1, "is null"),
])
def test_table_to_arrow_errors(columns: dict[str, Any], field: str, record: int | None,
                               reason: str) -> None:
    error = mismatch_of(lambda: table_to_arrow(typed_table(**columns), TYPED))
    assert (error.record, error.field) == (record, field)  # type: ignore[attr-defined]
    assert f"field '{field}'" in error.message and reason in error.message


# ----------------------------------------------------------------------------- resolve

WRITER = avro(
    {"name": "id", "type": "int"},
    {"name": "gone", "type": "string"},
    {"name": "lines", "type": {"type": "array", "items": {
        "type": "record", "name": "Line", "fields": [{"name": "qty", "type": "int"}]}}},
    {"name": "attrs", "type": {"type": "map", "values": "float"}},
    {"name": "note", "type": "bytes"},
    name="R")
READER = avro(
    {"name": "id", "type": "long"},
    {"name": "lines", "type": {"type": "array", "items": {
        "type": "record", "name": "Line", "fields": [
            {"name": "qty", "type": "long"},
            {"name": "unit", "type": "string", "default": "pcs"}]}}},
    {"name": "added", "type": "string", "default": "n/a"},
    {"name": "maybe", "type": ["null", "long"]},
    {"name": "attrs", "type": {"type": "map", "values": "double"}},
    {"name": "note", "type": "string"},
    name="R")


def test_resolve_defaults_drops_promotes_and_recurses() -> None:
    assert not check_compatibility(READER, [WRITER], "BACKWARD")
    written = records_to_arrow([
        {"id": 1, "gone": "x", "lines": [{"qty": 2}, {"qty": 3}], "attrs": {"a": 0.5},
         "note": b"hi"},
        {"id": 2, "gone": "y", "lines": [], "attrs": {}, "note": b""},
    ], WRITER)
    read = resolve(written.slice(0), WRITER, READER)
    assert read.type == READER.arrow_type
    assert read.to_pylist() == [
        {"id": 1, "lines": [{"qty": 2, "unit": "pcs"}, {"qty": 3, "unit": "pcs"}],
         "added": "n/a", "maybe": None, "attrs": [("a", 0.5)], "note": "hi"},
        {"id": 2, "lines": [], "added": "n/a", "maybe": None, "attrs": [], "note": ""},
    ]
    assert resolve(written.slice(1), WRITER, READER).to_pylist()[0]["id"] == 2
    assert resolve(written, WRITER, WRITER) is written


def test_resolve_refuses_what_cannot_be_read() -> None:
    required = avro({"name": "id", "type": "int"}, {"name": "must", "type": "string"}, name="R")
    written = records_to_arrow([{"id": 1, "gone": "x", "lines": [], "attrs": {}, "note": b""}],
                               WRITER)
    error = mismatch_of(lambda: resolve(written, WRITER, required))
    assert error.field == "must" and "has no default" in error.message  # type: ignore[attr-defined]
    narrower = avro({"name": "id", "type": "string"}, name="R")
    error = mismatch_of(lambda: resolve(written, WRITER, narrower))
    assert error.field == "id"  # type: ignore[attr-defined]
    assert "writer's int cannot be read as the reader's string" in error.message
    nullable = avro({"name": "v", "type": ["null", "int"]}, name="N")
    strict = avro({"name": "v", "type": "int"}, name="N")
    error = mismatch_of(lambda: resolve(records_to_arrow([{"v": 1}, {"v": None}], nullable),
                                        nullable, strict))
    assert (error.record, error.field) == (1, "v")  # type: ignore[attr-defined]


# ------------------------------------------------------------------ bodies and frames


def test_avro_bodies_and_confluent_frames() -> None:
    values = records_to_arrow([good(items=[{"sku": "s", "qty": 1}]), good(id=2)], ORDER)
    bodies = to_avro_bodies(values, ORDER)
    framed = [confluent_frame(42, body) for body in bodies]
    assert framed[0][:5] == b"\x00\x00\x00\x00\x2a"
    unframed = [parse_confluent_frame(f) for f in framed]
    assert [schema_id for schema_id, _ in unframed] == [42, 42]
    assert from_avro_bodies([body for _, body in unframed], ORDER).equals(values)
    with pytest.raises(SchemaMismatchError, match="shorter than the 5-byte"):
        parse_confluent_frame(b"\x00\x01")
    with pytest.raises(SchemaMismatchError, match="not the Confluent magic byte"):
        parse_confluent_frame(b"\x01\x00\x00\x00\x01body")
    error = mismatch_of(lambda: from_avro_bodies([bodies[0], bodies[1][:3]], ORDER))
    assert error.record == 1  # type: ignore[attr-defined]
    error = mismatch_of(lambda: from_avro_bodies([bodies[0] + b"\x00"], ORDER))
    assert "1 bytes after its Avro value" in error.message
    error = mismatch_of(lambda: to_avro_bodies(values.field("id"), ORDER))
    assert "table_to_arrow" in error.message


# ------------------------------------------------------------------------------ Spark


def test_spark_ddl() -> None:
    struct = pa.struct([
        pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
        pa.field("tags", pa.list_(pa.string())), pa.field("price", pa.decimal128(10, 2)),
        pa.field("at", pa.timestamp("ms", "UTC")), pa.field("day", pa.date32()),
        pa.field("m", pa.map_(pa.string(), pa.int32())),
        pa.field("addr", pa.struct([pa.field("zip", pa.string())])),
        pa.field("wall", pa.timestamp("us")), pa.field("odd`name", pa.bool_()),
    ])
    assert spark_ddl(struct) == (
        "`id` BIGINT NOT NULL, `name` STRING, `tags` ARRAY<STRING>, `price` DECIMAL(10,2), "
        "`at` TIMESTAMP, `day` DATE, `m` MAP<STRING, INT>, `addr` STRUCT<`zip`: STRING>, "
        "`wall` TIMESTAMP_NTZ, `odd``name` BOOLEAN")
    assert spark_ddl(ORDER.arrow_type).startswith("`id` BIGINT NOT NULL, `name` STRING NOT NULL")
    # For Delta tables: nothing NOT NULL at any depth (records in arrays included).
    lines = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field(
        "lines", pa.list_(pa.struct([pa.field("sku", pa.string(), nullable=False)])))])
    assert spark_ddl(lines) == "`id` BIGINT NOT NULL, `lines` ARRAY<STRUCT<`sku`: STRING NOT NULL>>"
    assert spark_ddl(lines, not_null=False) == "`id` BIGINT, `lines` ARRAY<STRUCT<`sku`: STRING>>"
    with pytest.raises(InvalidSchemaError, match="has no Spark type"):
        spark_ddl(pa.struct([pa.field("u", pa.uint64())]))


def test_spark_arrow_type() -> None:
    source = pa.struct([
        pa.field("at", pa.timestamp("ms", "UTC"), nullable=False),
        pa.field("wall", pa.timestamp("ns")),
        pa.field("t", pa.time32("ms")),
        pa.field("u", pa.time64("us")),
        pa.field("d", pa.dictionary(pa.int32(), pa.string())),
        pa.field("l", pa.list_(pa.timestamp("s", "Europe/Paris"))),
        pa.field("m", pa.map_(pa.string(), pa.timestamp("ms"))),
        pa.field("n", pa.int32()),
    ])
    assert spark_arrow_type(source) == pa.struct([
        pa.field("at", pa.timestamp("us", "UTC"), nullable=False),
        pa.field("wall", pa.timestamp("us")),
        pa.field("t", pa.int32()),
        pa.field("u", pa.int64()),
        pa.field("d", pa.string()),
        pa.field("l", pa.list_(pa.timestamp("us", "Europe/Paris"))),
        pa.field("m", pa.map_(pa.string(), pa.timestamp("us"))),
        pa.field("n", pa.int32()),
    ])
    assert spark_arrow_type(ORDER.arrow_type.field("at").type) == pa.timestamp("us", "UTC")


def test_sliced_columns_with_nulls_convert_like_whole_ones() -> None:
    """A batch cut out of a bigger column (``to_batches``, ``slice``) keeps an offset into
    its children: every conversion must read from it, with null maps, lists and rows."""
    schema = parse_schema(json.dumps({"type": "record", "name": "S", "fields": [
        {"name": "m", "type": ["null", {"type": "map", "values": "int"}]},
        {"name": "l", "type": ["null", {"type": "array", "items": "long"}]},
        {"name": "s", "type": "string"}]}))
    rows = [{"m": {"a": 1}, "l": [1], "s": "x"}, {"m": None, "l": None, "s": "y"},
            {"m": {"c": 3, "d": 4}, "l": [2, 3], "s": "z"}, {"m": None, "l": [], "s": "w"},
            {"m": {}, "l": [4], "s": "v"}]
    whole = records_to_arrow(rows, schema)
    with_null_row = pa.StructArray.from_arrays(
        [whole.field(i) for i in range(3)], fields=list(whole.type),
        mask=pa.array([False, False, True, False, False]))
    bodies, texts = to_avro_bodies(with_null_row, schema), to_json_values(with_null_row)
    assert bodies[2] is None and bodies[0] is not None
    # A column as a poll hands it out (chunked) is taken as it is.
    chunked = pa.chunked_array([whole.slice(0, 2), whole.slice(2)])
    assert table_to_arrow(chunked, schema).equals(whole)
    for start in range(5):
        for length in range(1, 6 - start):
            part = whole.slice(start, length)
            expected = whole.to_pylist(maps_as_pydicts="strict")[start:start + length]
            assert table_to_arrow(part, schema).to_pylist(maps_as_pydicts="strict") == \
                expected
            table = pa.Table.from_batches(
                pa.Table.from_arrays([part.field(i) for i in range(3)],
                                     names=["m", "l", "s"]).to_batches(max_chunksize=2))
            assert table_to_arrow(table, schema).to_pylist(maps_as_pydicts="strict") == \
                expected
            nulls = with_null_row.slice(start, length)
            assert to_avro_bodies(nulls, schema) == bodies[start:start + length]
            assert to_json_values(nulls) == texts[start:start + length]


def test_the_tier_reader_conforms_sliced_maps_and_lists() -> None:
    """The tier reader widens a data file's value to the query's type (int to long
    here): a sliced column with null maps and lists keeps every row's own entries."""
    from spark_source._tier import _ValueConformer

    source = pa.StructArray.from_arrays([
        pa.array([{"a": 1}, {"b": 2}, None, {"c": 3, "d": 4}, {"e": 5}],
                 pa.map_(pa.string(), pa.int32())),
        pa.array([[1], [2, 3], None, [4], [5, 6]], pa.list_(pa.int32()))], names=["m", "l"])
    target = pa.struct([("m", pa.map_(pa.string(), pa.int64())),
                        ("l", pa.list_(pa.int64()))])
    conformer = _ValueConformer("file:///t", target, None)
    for start, length in ((0, 5), (1, 3), (2, 2), (3, 2)):
        part = source.slice(start, length)
        table = pa.table({"value": part})
        conformed = conformer.conform(table).column("value")
        assert conformed.type == target
        assert conformed.to_pylist(maps_as_pydicts="strict") == \
            part.to_pylist(maps_as_pydicts="strict")
    # Only schema resolution's promotions, as on the log path: not double to long, not
    # a number to a string (Arrow would cast both).
    from spark_source import StrataSparkTierError

    for source_type, target_type in ((pa.float64(), pa.int64()), (pa.int32(), pa.string())):
        conformer = _ValueConformer("file:///t", pa.struct([("x", target_type)]), None)
        table = pa.table({"value": pa.StructArray.from_arrays(
            [pa.array([1, 2], source_type)], names=["x"])})
        with pytest.raises(StrataSparkTierError, match="not a promotion"):
            conformer.conform(table)
