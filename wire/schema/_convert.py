"""Data in and out of a schema's Arrow type: Python records, Arrow tables, Avro bodies,
JSON documents, and Avro schema resolution on columns.

How: records are converted column by column (one list per field, then one ``pa.array``
per leaf), because ``pa.array(records, type=struct)`` ignores unknown keys, cannot tell
a missing field (default) from an explicit null, turns ``1.5`` into ``1`` in an integer
column and takes a ``str`` as UTF-8 bytes in a binary one. Python only looks at a value
when its column is not already of the expected Python type. Constraints Arrow does not
carry (non-null children, enum symbols, UUID syntax, time-of-day ranges) are checked by
``check`` on the built columns, vectorized, for every entry point alike; the position of
a bad value is mapped back to its record through the list offsets.

Every data error is a ``SchemaMismatchError`` whose message starts with
``record {i}: field '{path}':`` and which carries ``.record`` (or None when no single
record is at fault) and ``.field``. Pure functions: thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import functools
import io
import json
import math
import uuid
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from itertools import accumulate, pairwise
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc

from wire.errors import InvalidSchemaError
from wire.schema._model import (
    Field,
    Kind,
    Locate,
    Node,
    ParsedSchema,
    SchemaType,
    identity,
    join,
    mismatch,
    where,
)

_MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "<missing>"})()
_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_DAY = date(1970, 1, 1)
_INT_RANGES = {Kind.INT: (-(2**31), 2**31 - 1), Kind.LONG: (-(2**63), 2**63 - 1),
               Kind.TIME_MILLIS: (0, 86_400_000 - 1), Kind.TIME_MICROS: (0, 86_400_000_000 - 1),
               Kind.DATE: (-(2**31), 2**31 - 1)}
_UNIT_MICROS = {Kind.TIMESTAMP_MILLIS: 1000, Kind.LOCAL_TIMESTAMP_MILLIS: 1000,
                Kind.TIMESTAMP_MICROS: 1, Kind.LOCAL_TIMESTAMP_MICROS: 1,
                Kind.TIME_MILLIS: 1000, Kind.TIME_MICROS: 1}
_UTC_KINDS = {Kind.TIMESTAMP_MILLIS, Kind.TIMESTAMP_MICROS}
_LOCAL_KINDS = {Kind.LOCAL_TIMESTAMP_MILLIS, Kind.LOCAL_TIMESTAMP_MICROS}
_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Python types pa.array converts exactly as the schema means them, per kind; a column of
# only these (and None) skips the per-value pass.
_EXACT: dict[Kind, frozenset[type]] = {
    Kind.BOOLEAN: frozenset({bool}), Kind.INT: frozenset({int}), Kind.LONG: frozenset({int}),
    Kind.FLOAT: frozenset({float, int}), Kind.DOUBLE: frozenset({float, int}),
    Kind.STRING: frozenset({str}), Kind.ENUM: frozenset({str}), Kind.UUID: frozenset({str}),
    Kind.BYTES: frozenset({bytes}), Kind.FIXED: frozenset({bytes}),
    Kind.DATE: frozenset({int}), Kind.TIME_MILLIS: frozenset({int}),
    Kind.TIME_MICROS: frozenset({int}), Kind.TIMESTAMP_MILLIS: frozenset({int}),
    Kind.TIMESTAMP_MICROS: frozenset({int}), Kind.LOCAL_TIMESTAMP_MILLIS: frozenset({int}),
    Kind.LOCAL_TIMESTAMP_MICROS: frozenset({int}),
    Kind.DECIMAL: frozenset({decimal.Decimal, int}),
}
# Writer kind -> reader kinds it is promoted to (Avro's schema resolution rules).
PROMOTIONS: dict[Kind, frozenset[Kind]] = {
    Kind.INT: frozenset({Kind.LONG, Kind.FLOAT, Kind.DOUBLE}),
    Kind.LONG: frozenset({Kind.FLOAT, Kind.DOUBLE}),
    Kind.FLOAT: frozenset({Kind.DOUBLE}),
    Kind.STRING: frozenset({Kind.BYTES}),
    Kind.BYTES: frozenset({Kind.STRING}),
}
_ARROW_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError)


class _Bad(Exception):
    """A value that does not fit; the message is the reason."""


# ----------------------------------------------------------------------- records in


def records_to_arrow(records: Sequence[Mapping[str, Any]], schema: ParsedSchema
                     ) -> pa.StructArray:
    rows = list(records)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise mismatch(i, "", f"expected an object, got {_describe(row)}")
    result = column(rows, schema.root, "", identity)
    check(result, schema.root, False, "", identity)
    return result


def column(values: list[Any], node: Node, path: str, locate: Locate) -> pa.Array:
    """Python values (None for null) to an Arrow array of ``node.arrow``; checks shapes
    and Python types. Nullability and value domains are ``check``'s."""
    if node.kind is Kind.RECORD:
        return _struct(values, node, path, locate)
    if node.kind in (Kind.ARRAY, Kind.MAP):
        return _nested(values, node, path, locate)
    return _leaf(values, node, path, locate)


def _struct(rows: list[Any], node: Node, path: str, locate: Locate) -> pa.StructArray:
    if None in rows:
        # Build the struct from its present rows only, then put the null rows back: a null
        # struct's required children are then not reported as missing.
        present = [i for i, row in enumerate(rows) if row is not None]
        inner = _struct([rows[i] for i in present], node, path, lambda p: locate(present[p]))
        positions: list[int | None] = [None] * len(rows)
        for j, i in enumerate(present):
            positions[i] = j
        return inner.take(pa.array(positions, pa.int64()))
    names = node.names
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise mismatch(locate(i), path, f"expected an object, got {_describe(row)}")
        if not names.issuperset(row):
            extra = next(key for key in row if key not in names)
            raise mismatch(locate(i), join(path, str(extra)),
                           "is not in the schema; remove it, or add the field to the schema")
    children = [_field_column(rows, f, path, locate) for f in node.fields]
    return pa.StructArray.from_arrays(children, fields=list(node.arrow))


def _field_column(rows: list[Mapping[str, Any]], field: Field, path: str, locate: Locate
                  ) -> pa.Array:
    field_path = join(path, field.name)
    values = [row.get(field.name, _MISSING) for row in rows]
    if any(v is _MISSING for v in values):
        if field.has_default:
            values = [field.default if v is _MISSING else v for v in values]
        elif field.nullable:
            values = [None if v is _MISSING else v for v in values]
        else:
            first = next(i for i, v in enumerate(values) if v is _MISSING)
            raise mismatch(locate(first), field_path, "is missing; it is required (no default, "
                                                      "not nullable): give it a value")
    return column(values, field.node, field_path, locate)


def _nested(values: list[Any], node: Node, path: str, locate: Locate) -> pa.Array:
    assert node.element is not None
    is_map = node.kind is Kind.MAP
    lengths: list[int] = []
    keys: list[Any] = []
    items: list[Any] = []
    for i, value in enumerate(values):
        if value is None:
            lengths.append(0)
        elif is_map and isinstance(value, Mapping):
            lengths.append(len(value))
            keys.extend(value.keys())
            items.extend(value.values())
        elif not is_map and isinstance(value, list | tuple):
            lengths.append(len(value))
            items.extend(value)
        else:
            wanted = "an object (a map)" if is_map else "an array"
            raise mismatch(locate(i), path, f"expected {wanted}, got {_describe(value)}")
    starts = list(accumulate(lengths, initial=0))

    def locate_item(position: int) -> int:
        return locate(bisect_right(starts, position) - 1)

    offsets = pa.array(starts, pa.int32())
    mask = pa.array([v is None for v in values]) if None in values else None
    element = column(items, node.element, path + ("{}" if is_map else "[]"), locate_item)
    if not is_map:
        return pa.ListArray.from_arrays(offsets, element, type=node.arrow, mask=mask)
    for j, key in enumerate(keys):
        if type(key) is not str:
            raise mismatch(locate_item(j), path, f"map key {_describe(key)} is not a string; "
                                                 "map keys must be strings")
    return pa.MapArray.from_arrays(offsets, pa.array(keys, pa.string()), element,
                                   type=node.arrow, mask=mask)


def _leaf(values: list[Any], node: Node, path: str, locate: Locate) -> pa.Array:
    seen = set(map(type, values))
    seen.discard(type(None))
    if seen <= _EXACT[node.kind]:
        try:
            return pa.array(values, type=node.arrow)
        except _ARROW_ERRORS:
            pass  # the per-value pass below finds the value and says why
    converted: list[Any] = []
    for i, value in enumerate(values):
        try:
            converted.append(None if value is None else _convert(value, node))
        except _Bad as bad:
            raise mismatch(locate(i), path, str(bad)) from None
    try:
        return pa.array(converted, type=node.arrow)
    except _ARROW_ERRORS:
        for i, value in enumerate(converted):
            try:
                pa.array([value], type=node.arrow)
            except _ARROW_ERRORS as error:
                raise mismatch(locate(i), path, f"{_describe(values[i])} does not fit "
                                                f"{node.label}: {error}") from None
        raise


def _convert(value: Any, node: Node) -> Any:
    """One value to what ``pa.array`` takes for ``node.arrow``, or ``_Bad``."""
    kind = node.kind
    if kind is Kind.BOOLEAN:
        if type(value) is bool:
            return value
    elif kind in (Kind.INT, Kind.LONG, Kind.TIME_MILLIS, Kind.TIME_MICROS):
        if kind in (Kind.TIME_MILLIS, Kind.TIME_MICROS) and isinstance(value, time | str):
            value = _time_of_day(value, kind)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and type(value) is not bool:
            low, high = _INT_RANGES[kind]
            if not low <= value <= high:
                raise _Bad(f"{value} is out of range for {node.label} ({low} to {high})")
            return value
    elif kind in (Kind.FLOAT, Kind.DOUBLE):
        if isinstance(value, int | float) and type(value) is not bool:
            return float(value)
        if isinstance(value, str) and value in _FLOATS:
            return _FLOATS[value]
    elif kind in (Kind.STRING, Kind.ENUM):
        if isinstance(value, str):
            return value
    elif kind is Kind.UUID:
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, str):
            return value
    elif kind in (Kind.BYTES, Kind.FIXED):
        return _bytes(value, node)
    elif kind is Kind.DATE:
        return _days(value)
    elif kind in _UNIT_MICROS:
        return _timestamp(value, kind)
    elif kind is Kind.DECIMAL:
        return _decimal(value, node)
    raise _Bad(f"expected {node.label}, got {_describe(value)}")


def _bytes(value: Any, node: Node) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
    elif isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _Bad(f"{_describe(value)} is not base64; give bytes, or base64 text") from None
    else:
        raise _Bad(f"expected {node.label} (bytes or base64 text), got {_describe(value)}")
    if node.kind is Kind.FIXED and len(raw) != node.arrow.byte_width:
        raise _Bad(f"has {len(raw)} bytes; {node.label} holds exactly {node.arrow.byte_width}")
    return raw


def _days(value: Any) -> int:
    if isinstance(value, datetime):
        raise _Bad(f"{value.isoformat()} is a date-time; give a date (e.g. its .date())")
    if isinstance(value, str):
        try:
            value = date.fromisoformat(value)
        except ValueError:
            raise _Bad(f"{_describe(value)} is not an ISO-8601 date (YYYY-MM-DD)") from None
    if isinstance(value, date):
        return (value - _EPOCH_DAY).days
    if isinstance(value, int) and type(value) is not bool:
        low, high = _INT_RANGES[Kind.DATE]
        if low <= value <= high:
            return value
        raise _Bad(f"{value} days is out of range for a date")
    raise _Bad(f"expected a date (date, ISO-8601 text or days since 1970-01-01), got "
               f"{_describe(value)}")


def _time_of_day(value: time | str, kind: Kind) -> int:
    if isinstance(value, str):
        try:
            value = time.fromisoformat(value)
        except ValueError:
            raise _Bad(f"{_describe(value)} is not an ISO-8601 time (HH:MM:SS)") from None
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 \
        + value.microsecond
    return micros // _UNIT_MICROS[kind]


def _timestamp(value: Any, kind: Kind) -> int:
    if isinstance(value, int) and type(value) is not bool:
        return value
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise _Bad(f"{_describe(value)} is not an ISO-8601 date-time") from None
    if not isinstance(value, datetime):
        raise _Bad(f"expected a timestamp (int in the field's unit, datetime or ISO-8601 "
                   f"text), got {_describe(value)}")
    aware = value.utcoffset() is not None
    if kind in _LOCAL_KINDS and aware:
        raise _Bad(f"{value.isoformat()} has a time zone, but {kind.value} is a wall-clock "
                   "time without one: drop the offset")
    # A naive datetime in a UTC field is taken as UTC, as pyarrow does. Sub-unit digits are
    # truncated toward the past, as fastavro does.
    delta = value - (_EPOCH if aware else _EPOCH_NAIVE)
    return delta // timedelta(microseconds=_UNIT_MICROS[kind])


_DECIMAL_CONTEXT = decimal.Context(prec=200)


def _decimal(value: Any, node: Node) -> decimal.Decimal:
    if isinstance(value, float):
        raise _Bad(f"{value!r} is a float, which is not exact; give a decimal string or a "
                   "Decimal")
    if isinstance(value, str | int) and type(value) is not bool:
        try:
            value = decimal.Decimal(value)
        except decimal.InvalidOperation:
            raise _Bad(f"{_describe(value)} is not a decimal number") from None
    if not isinstance(value, decimal.Decimal) or not value.is_finite():
        raise _Bad(f"expected {node.label} (Decimal, decimal text or int), got "
                   f"{_describe(value)}")
    precision, scale = node.arrow.precision, node.arrow.scale
    quantum = decimal.Decimal(1).scaleb(-scale)
    try:
        rounded = value.quantize(quantum, context=_DECIMAL_CONTEXT)
    except decimal.InvalidOperation:
        raise _Bad(f"{_describe(value)} has more than {precision} digits") from None
    if rounded != value:
        raise _Bad(f"{value} has more than {scale} decimal places")
    if len(rounded.as_tuple().digits) > precision:
        raise _Bad(f"{value} has more than {precision - scale} digits before the point")
    return rounded


# ------------------------------------------------------------------------- checking


@functools.lru_cache(maxsize=256)
def _symbol_set(symbols: tuple[str, ...]) -> pa.Array:
    """An enum's symbols as the Arrow array ``is_in`` wants (built once per enum)."""
    return pa.array(symbols, pa.string())


def check(array: pa.Array, node: Node, nullable: bool, path: str, locate: Locate) -> None:
    """What Arrow types do not say: nulls in non-nullable places, enum symbols, UUID
    syntax and time-of-day ranges. Vectorized; recursion bounded by the schema's depth."""
    if len(array) == 0:
        return
    if not nullable and array.null_count:
        first = _first_true(array.is_null())
        raise mismatch(locate(first), path, "is null, but the schema does not allow null: give "
                                            "it a value (or make the field optional)")
    kind = node.kind
    if kind is Kind.RECORD:
        if array.null_count:
            present = pc.indices_nonzero(array.is_valid())
            array = array.filter(array.is_valid())
            outer = locate

            def locate(position: int) -> int:
                return outer(present[position].as_py())

        for i, f in enumerate(node.fields):
            check(array.field(i), f.node, f.nullable, join(path, f.name), locate)
    elif kind in (Kind.ARRAY, Kind.MAP):
        assert node.element is not None
        offsets, items, _ = list_parts(array)
        if kind is Kind.MAP:
            items = items.field(1)

        def locate_item(position: int) -> int:
            # Only on an error: which list holds the item at this position.
            return locate(bisect_right(offsets.to_pylist(), position) - 1)

        check(items, node.element, node.element_nullable,
              path + ("{}" if kind is Kind.MAP else "[]"), locate_item)
    elif kind is Kind.ENUM:
        # Nulls stay null (``skip_nulls``) and ``all`` skips them: one kernel and one
        # reduction on the common, valid column; the slow search only on a refusal.
        known = pc.is_in(array, value_set=_symbol_set(node.symbols), skip_nulls=True)
        if not pc.all(known).as_py():
            bad = pc.and_(pc.invert(known), array.is_valid())
            first = _first_true(bad)
            raise mismatch(locate(first), path, f"{array[first].as_py()!r} is not a symbol of "
                                                f"{node.label}; use one of {list(node.symbols)}")
    elif kind is Kind.UUID:
        good = pc.match_substring_regex(array, _UUID)
        bad = pc.and_(pc.invert(good), array.is_valid())
        if pc.any(bad).as_py():
            first = _first_true(bad)
            raise mismatch(locate(first), path, f"{array[first].as_py()!r} is not a UUID; give "
                                                "the 8-4-4-4-12 hexadecimal form")
    elif kind in (Kind.TIME_MILLIS, Kind.TIME_MICROS):
        low, high = _INT_RANGES[kind]
        bad = pc.or_(pc.less(array, low), pc.greater(array, high))
        if pc.any(bad).as_py():
            first = _first_true(pc.fill_null(bad, False))
            raise mismatch(locate(first), path, f"{array[first].as_py()} is not a time of day "
                                                f"for {kind.value} ({low} to {high})")


def _first_true(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def _as_list(array: pa.Array) -> pa.Array:
    """A map as the list of its entries: list compute functions do not take maps."""
    if not pa.types.is_map(array.type):
        return array
    # A view, not ListArray.from_arrays: that refuses a null bitmap on a sliced map.
    # Nullable fields: ``check`` looks at maps whose values break a NOT NULL type.
    key, item = array.type.key_field, array.type.item_field
    return array.view(pa.list_(pa.struct([pa.field(key.name, key.type),
                                          pa.field(item.name, item.type)])))


def list_parts(array: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array | None]:
    """(offsets from 0, the items of the non-null lists, null mask) of a list, large list
    or map (items: its key/value entries), whatever its slice offset."""
    lists = _as_list(array)
    lengths = pc.fill_null(pc.list_value_length(lists), 0).cast(pa.int64())
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(lengths)])
    mask = array.is_null() if array.null_count else None
    return offsets.cast(pa.int32()), lists.flatten(), mask


# -------------------------------------------------------------------------- tables in


def table_to_arrow(table: pa.Table | pa.RecordBatch | pa.StructArray | pa.ChunkedArray,
                   schema: ParsedSchema) -> pa.StructArray:
    if isinstance(table, pa.ChunkedArray) and pa.types.is_struct(table.type):
        # e.g. poll_arrow(...).column("value"), sent on as it came
        table = table.combine_chunks() if table.num_chunks != 1 else table.chunk(0)
    if isinstance(table, pa.StructArray):
        source = table
    elif isinstance(table, pa.Table | pa.RecordBatch):
        names = table.schema.names
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise mismatch(None, duplicate, "is a column twice; keep one")
        # A one-chunk column (what a Table built from arrays has) is taken as it is;
        # combine_chunks would allocate a new array object for it all the same.
        columns = [(c.chunk(0) if c.num_chunks == 1 else c.combine_chunks())
                   if isinstance(c, pa.ChunkedArray) else c for c in table.columns]
        if not columns:
            raise mismatch(None, "", "the table has no columns; give it the schema's fields")
        fields = list(schema.arrow_type)
        if names == [f.name for f in fields] and all(
                c.type == f.type for c, f in zip(columns, fields, strict=True)):
            # The common case, a table built with the schema's types: no conversion,
            # only the checks Arrow types do not make (nulls, enum symbols, ...).
            result = pa.StructArray.from_arrays(columns, fields=fields)
            check(result, schema.root, False, "", identity)
            return result
        source = pa.StructArray.from_arrays(columns, names=names)
    else:
        raise mismatch(None, "", f"expected a pyarrow Table, RecordBatch or a struct column "
                                 f"(StructArray or ChunkedArray), got {type(table).__name__}")
    result = _conform(source, schema.root, "", identity)
    check(result, schema.root, False, "", identity)
    return result


def _conform(array: pa.Array, node: Node, path: str, locate: Locate) -> pa.Array:
    """``array`` as ``node.arrow`` by name, with only lossless, declared casts."""
    if array.type == node.arrow:
        return array
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
        if array.type == node.arrow:
            return array
    kind = node.kind
    if kind is Kind.RECORD and pa.types.is_struct(array.type):
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        for f in node.fields:
            if f.name not in names:
                raise mismatch(None, join(path, f.name), f"is missing; add a column of "
                                                         f"{f.node.label}")
        for name in names:
            if names.count(name) > 1:
                raise mismatch(None, join(path, name), "is a column twice; keep one")
            if name not in node.names:
                raise mismatch(None, join(path, name), "is not in the schema; drop the column, "
                                                       "or add the field to the schema")
        children = [_conform(array.field(f.name), f.node, join(path, f.name), locate)
                    for f in node.fields]
        return pa.StructArray.from_arrays(children, fields=list(node.arrow),
                                          mask=array.is_null() if array.null_count else None)
    is_list = pa.types.is_list(array.type) or pa.types.is_large_list(array.type)
    if (kind is Kind.ARRAY and is_list) or (kind is Kind.MAP and pa.types.is_map(array.type)):
        assert node.element is not None
        offsets, items, mask = list_parts(array)
        suffix = "[]" if kind is Kind.ARRAY else "{}"
        values = items if kind is Kind.ARRAY else items.field(1)
        element = _conform(values, node.element, path + suffix, locate)
        if kind is Kind.ARRAY:
            return pa.ListArray.from_arrays(offsets, element, type=node.arrow, mask=mask)
        keys = _conform(items.field(0), Node(Kind.STRING, "string", pa.string()),
                        path + "{}", locate)
        return pa.MapArray.from_arrays(offsets, keys, element, type=node.arrow, mask=mask)
    refusal = _cast_refusal(array.type, node)
    if refusal is not None:
        raise mismatch(None, path, f"expected {node.arrow} ({node.label}), got {array.type}; "
                                   f"{refusal}")
    try:
        return pc.cast(array, node.arrow, safe=True)
    except pa.ArrowInvalid as error:
        first = _first_failing(array, lambda part: pc.cast(part, node.arrow, safe=True))
        raise mismatch(locate(first), path, f"{array[first].as_py()!r} cannot be cast from "
                                            f"{array.type} to {node.arrow} without losing "
                                            f"data ({error}); fix the value or the "
                                            "column's type") from None


def _cast_refusal(source: pa.DataType, node: Node) -> str | None:
    """None when a cast from ``source`` to ``node.arrow`` is declared lossless (checked
    value by value by a safe cast); otherwise what to do instead."""
    kind, types = node.kind, pa.types
    if kind in (Kind.INT, Kind.LONG, Kind.TIME_MILLIS, Kind.TIME_MICROS) \
            and types.is_integer(source):
        return None
    if kind in (Kind.FLOAT, Kind.DOUBLE) and (types.is_integer(source)
                                             or source == pa.float32()):
        return None
    if kind in (Kind.STRING, Kind.ENUM, Kind.UUID) and (types.is_large_string(source)
                                                       or types.is_string_view(source)):
        return None
    if kind is Kind.BYTES and (types.is_large_binary(source) or types.is_binary_view(source)):
        return None
    if kind is Kind.FIXED and (types.is_binary(source) or types.is_large_binary(source)):
        return None  # Spark has no fixed type; the safe cast checks every value's width
    if kind is Kind.DATE and types.is_date64(source):
        return None
    if kind is Kind.DECIMAL and (types.is_decimal(source) or types.is_integer(source)):
        return None
    if kind in _UTC_KINDS and types.is_timestamp(source):
        return None if source.tz is not None else (
            "the column's timestamps have no time zone but the field's are UTC: attach "
            "one (e.g. pc.assume_timezone)")
    if kind in _LOCAL_KINDS and types.is_timestamp(source):
        return None if source.tz is None else (
            "the column's timestamps have a time zone but the field's are wall-clock "
            "times: drop it (e.g. pc.local_timestamp)")
    return "convert the column to the field's type first"


def _first_failing(array: pa.Array, operation: Callable[[pa.Array], object]) -> int:
    """The index of the first value ``operation`` fails on, by halving (O(n) in total)."""
    start, length = 0, len(array)
    while length > 1:
        half = length // 2
        try:
            operation(array.slice(start, half))
        except _ARROW_ERRORS:
            length = half
        else:
            start, length = start + half, length - half
    return start


# ------------------------------------------------------------------------ resolution


def resolve(values: pa.StructArray, writer: ParsedSchema, reader: ParsedSchema
            ) -> pa.StructArray:
    if writer.schema_type == reader.schema_type and writer.canonical == reader.canonical:
        return values
    if values.type != writer.arrow_type:
        raise mismatch(None, "", "the values are not of the writer schema's type ("
                                 f"{arrow_mismatch(values.type, writer)}); pass the schema "
                                 "they were written with")
    result = _resolve(values, writer.root, reader.root, "")
    check(result, reader.root, False, "", identity)
    return result


def _resolve(array: pa.Array, writer: Node, reader: Node, path: str) -> pa.Array:
    if writer.kind is reader.kind and writer.arrow == reader.arrow \
            and writer.kind not in (Kind.RECORD, Kind.ARRAY, Kind.MAP):
        return array  # enum symbols the reader lacks are found by check()
    if writer.kind is reader.kind is Kind.RECORD:
        children = []
        for f in reader.fields:
            source = writer.by_name.get(f.name)
            field_path = join(path, f.name)
            children.append(_default_column(f, len(array), field_path) if source is None
                            else _resolve(array.field(f.name), source.node, f.node, field_path))
        return pa.StructArray.from_arrays(children, fields=list(reader.arrow),
                                          mask=array.is_null() if array.null_count else None)
    if writer.kind is reader.kind and writer.kind in (Kind.ARRAY, Kind.MAP):
        assert writer.element is not None and reader.element is not None
        offsets, items, mask = list_parts(array)
        if writer.kind is Kind.ARRAY:
            element = _resolve(items, writer.element, reader.element, path + "[]")
            return pa.ListArray.from_arrays(offsets, element, type=reader.arrow, mask=mask)
        element = _resolve(items.field(1), writer.element, reader.element, path + "{}")
        return pa.MapArray.from_arrays(offsets, items.field(0), element, type=reader.arrow,
                                       mask=mask)
    if reader.kind in PROMOTIONS.get(writer.kind, frozenset()):
        # int/long to float/double may round, as Avro's promotion does; bytes to string
        # must be UTF-8, which the safe cast checks.
        exact = reader.kind not in (Kind.FLOAT, Kind.DOUBLE)
        try:
            return pc.cast(array, reader.arrow, safe=exact)
        except pa.ArrowInvalid:
            first = _first_failing(array, lambda part: pc.cast(part, reader.arrow, safe=exact))
            raise mismatch(first, path, f"the writer's {writer.label} value cannot be read as "
                                        f"the reader's {reader.label} (not UTF-8?)") from None
    raise mismatch(None, path, f"the writer's {writer.label} cannot be read as the reader's "
                               f"{reader.label}; check_compatibility refuses this pair")


def default_array(field: Field, path: str = "") -> pa.Array:
    """``field``'s default (``has_default``, not null) as a one-value array of the field's
    Arrow type; ``path`` names the field in a ``SchemaMismatchError``."""
    return column([field.default], field.node, path, identity)


def _default_column(field: Field, length: int, path: str) -> pa.Array:
    if field.has_default and field.default is not None:
        return default_array(field, path).take(pa.repeat(0, length))
    if field.nullable:
        return pa.nulls(length, field.node.arrow)
    raise mismatch(None, path, "is only in the reader's schema and has no default; give it "
                               "a default there (or make it optional)")


# ----------------------------------------------------------------- Avro and JSON out


def to_avro_bodies(values: pa.StructArray, schema: ParsedSchema) -> list[bytes | None]:
    if schema.schema_type is not SchemaType.AVRO:
        raise InvalidSchemaError("Avro bodies need an Avro schema and this one is JSON "
                                 "Schema; use to_json_values, or register an Avro schema")
    if values.type != schema.arrow_type:
        raise mismatch(None, "", f"the values are not of the schema's type "
                                 f"({arrow_mismatch(values.type, schema)}); convert them "
                                 "with table_to_arrow first")
    bodies: list[bytes | None] = []
    buffer = io.BytesIO()
    for i, row in enumerate(_python_values(values, for_json=False)):
        if row is None:  # a null value (a tombstone) has no body: it stays null
            bodies.append(None)
            continue
        buffer.seek(0)
        buffer.truncate()
        try:
            fastavro.schemaless_writer(buffer, schema.avro, row)
        except Exception as error:  # fastavro raises many types on a value it cannot write
            raise mismatch(i, "", f"cannot be written as Avro ({error})") from None
        bodies.append(buffer.getvalue())
    return bodies


def from_avro_bodies(bodies: Sequence[bytes], schema: ParsedSchema) -> pa.StructArray:
    if schema.schema_type is not SchemaType.AVRO:
        raise InvalidSchemaError("Avro bodies need an Avro schema and this one is JSON "
                                 "Schema; register an Avro schema for Avro data")
    rows: list[Any] = []
    for i, body in enumerate(bodies):
        stream = io.BytesIO(body)
        try:
            rows.append(fastavro.schemaless_reader(stream, schema.avro, None))
        except Exception as error:  # truncated or foreign bytes fail in many ways
            raise mismatch(i, "", f"is not an Avro body of this schema ({type(error).__name__}"
                                  f": {error}); check the schema id it was framed with") from None
        if stream.tell() != len(body):
            raise mismatch(i, "", f"has {len(body) - stream.tell()} bytes after its Avro value;"
                                  " check the schema id it was framed with")
    return records_to_arrow(rows, schema)


def to_json_values(values: pa.StructArray) -> list[bytes]:
    return [json.dumps(row, separators=(",", ":"), ensure_ascii=False,
                       allow_nan=False).encode("utf-8")
            for row in _python_values(values, for_json=True)]


def _python_values(array: pa.Array, for_json: bool) -> list[Any]:
    """Column by column (``Array.to_pylist`` on a struct, and its maps as dicts, are
    several times slower). ``for_json``: values are JSON's (ISO text for times, decimal
    text, base64 for bytes, strings for non-finite floats)."""
    t, types = array.type, pa.types
    if types.is_dictionary(t):
        return _python_values(array.dictionary_decode(), for_json)
    if types.is_struct(t):
        names = [f.name for f in t]
        children = [_python_values(array.field(i), for_json) for i in range(t.num_fields)]
        rows: list[Any] = [dict(zip(names, row, strict=True)) for row in zip(*children,
                                                                              strict=True)]
        if not children:
            rows = [{} for _ in range(len(array))]
    elif types.is_list(t) or types.is_large_list(t) or types.is_map(t):
        offsets, items, _ = list_parts(array)
        bounds = offsets.to_pylist()
        if types.is_map(t):
            keys = _python_values(items.field(0), for_json)
            entries = _python_values(items.field(1), for_json)
            rows = [dict(zip(keys[a:b], entries[a:b], strict=True))
                    for a, b in pairwise(bounds)]
        else:
            elements = _python_values(items, for_json)
            rows = [elements[a:b] for a, b in pairwise(bounds)]
    elif not for_json:
        # fastavro takes epoch numbers for timestamps and dates, and converting to those
        # in Arrow saves a datetime object per value.
        if types.is_timestamp(t):
            array = array.cast(pa.int64())
        elif types.is_date32(t):
            array = array.cast(pa.int32())
        return list(array.to_pylist())
    else:
        return _json_leaf(array)
    if array.null_count:
        rows = [row if valid else None
                for row, valid in zip(rows, array.is_valid().to_pylist(), strict=True)]
    return rows


def _json_leaf(array: pa.Array) -> list[Any]:
    t, types = array.type, pa.types
    if types.is_timestamp(t):
        if t.tz is None:
            return list(pc.strftime(array, "%Y-%m-%dT%H:%M:%S").to_pylist())
        utc = pc.strftime(array.cast(pa.timestamp(t.unit, "UTC")), "%Y-%m-%dT%H:%M:%S")
        return list(pc.binary_join_element_wise(utc, "Z", "").to_pylist())
    if types.is_date(t) or types.is_time(t) or types.is_decimal(t):
        return list(array.cast(pa.string()).to_pylist())
    if types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t):
        return [None if v is None else base64.b64encode(v).decode("ascii")
                for v in array.to_pylist()]
    if types.is_floating(t) and not pc.all(pc.is_finite(array)).as_py():
        return [_finite(v) for v in array.to_pylist()]
    if types.is_duration(t):
        return [None if v is None else str(v) for v in array.to_pylist()]
    return list(array.to_pylist())


def _finite(value: float | None) -> Any:
    """Non-finite floats as the strings records_to_arrow takes back."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


# --------------------------------------------------------------------- type compare


def arrow_mismatch(actual: pa.DataType, schema: ParsedSchema) -> str | None:
    if not pa.types.is_struct(actual):
        return f"the top level: expected a struct of the schema's fields, got {actual}"
    return _type_difference(schema.arrow_type, actual, "")


def _type_difference(expected: pa.DataType, actual: pa.DataType, path: str) -> str | None:
    if expected == actual:
        return None
    types = pa.types
    if types.is_struct(expected) and types.is_struct(actual):
        actual_names = [f.name for f in actual]
        expected_names = [f.name for f in expected]
        for position, wanted in enumerate(expected):
            field_path = join(path, wanted.name)
            if wanted.name not in actual_names:
                return f"{where(field_path)} is missing"
            found = actual.field(actual_names.index(wanted.name))
            if actual_names.index(wanted.name) != position:
                return (f"{where(field_path)} is at position "
                        f"{actual_names.index(wanted.name)}, expected {position}")
            # The type first: "expected string, got int64" says more than nullability.
            difference = _type_difference(wanted.type, found.type, field_path) or \
                _nullability(wanted, found, field_path)
            if difference:
                return difference
        for name in actual_names:
            if name not in expected_names:
                return f"{where(join(path, name))} is not in the schema"
        return None
    for is_kind, suffix, child in ((types.is_list, "[]", "value_field"),
                                   (types.is_map, "{}", "item_field")):
        if is_kind(expected) and is_kind(actual) and \
                types.is_map(expected) == types.is_map(actual):
            wanted, found = getattr(expected, child), getattr(actual, child)
            if types.is_map(expected) and expected.key_type != actual.key_type:
                return f"{where(path)}: expected map keys {expected.key_type}, " \
                       f"got {actual.key_type}"
            difference = _type_difference(wanted.type, found.type, path + suffix) or \
                _nullability(wanted, found, path + suffix)
            if difference or wanted.name == found.name:
                return difference
    return f"{where(path)}: expected {expected}, got {actual}"


def _nullability(expected: pa.Field, actual: pa.Field, path: str) -> str | None:
    if expected.nullable == actual.nullable:
        return None
    words = {True: "nullable", False: "not nullable"}
    return f"{where(path)}: expected {words[expected.nullable]}, got {words[actual.nullable]}"


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"

