"""The orders both halves of ``strata perf typed`` write (``perf_typed`` produces them,
``perf_typed_spark`` fills and reads the topics with them): the ``ORDER_SCHEMA`` struct,
built column by column, and the same orders as JSON documents.

Its own module so that ``perf_typed`` imports ``perf_typed_spark`` (for ``--spark``) and
neither imports the other back.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

__all__ = ["ORDER_SCHEMA", "json_values", "order_table"]

ORDER_SCHEMA = json.dumps({
    "type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "status", "type": {"type": "enum", "name": "Status",
                                    "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ]})


def order_table(start: int, n: int) -> pa.Table:
    """``n`` orders from id ``start``, built column by column (no Python per record)."""
    import pyarrow.compute as pc

    from wire.schema import parse_schema

    ids = pa.array(range(start, start + n), pa.int64())
    customers = pc.binary_join_element_wise(
        "customer-", pc.cast(pc.bit_wise_and(ids, pa.scalar(1023, pa.int64())), pa.string()),
        "")
    amounts = pc.divide(pc.cast(pc.bit_wise_and(ids, pa.scalar(65535, pa.int64())),
                                pa.float64()), pa.scalar(100.0))
    quantities = pc.cast(pc.add(pc.bit_wise_and(ids, pa.scalar(7, pa.int64())),
                                pa.scalar(1, pa.int64())), pa.int32())
    status = pc.take(pa.array(["NEW", "PAID", "SHIPPED"]),
                     pc.bit_wise_and(ids, pa.scalar(1, pa.int64())))
    base = int(datetime(2026, 11, 1, tzinfo=UTC).timestamp() * 1000)
    at = pc.cast(pc.add(ids, pa.scalar(base, pa.int64())), pa.timestamp("ms", tz="UTC"))
    schema = pa.schema(parse_schema(ORDER_SCHEMA).arrow_type)
    return pa.Table.from_arrays([ids, customers, amounts, quantities, status, at],
                                schema=schema)


def json_values(table: pa.Table) -> pa.Array:
    """The same orders as JSON documents (what a bytes topic carries)."""
    from wire.schema import to_json_values

    return pa.array(to_json_values(table.to_struct_array().combine_chunks()), pa.binary())
