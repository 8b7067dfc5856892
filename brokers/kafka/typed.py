"""Typed topics on the Kafka listener: Confluent's wire format in, typed columns stored,
Confluent's wire format out (docs/typed-topics.md, docs/kafka-compatibility.md).

A Kafka producer writes a typed topic the way it writes to a Confluent Schema Registry
topic: each value is framed (magic byte 0, a 4-byte schema id, then the body: Avro's
binary encoding, or JSON text for a JSON Schema subject). ``to_typed`` turns a batch of
such values (as ``records.from_kafka`` made it, values still bytes) into the typed batch
Strata's producer would have sent: the values decoded against that schema into its Arrow
columns, the schema id in the payload's metadata. The broker's usual check then accepts
it only if the id is a live version of the topic's subject. ``to_framed`` is the way
back for a Kafka consumer: each value encoded with the schema id its batch carries.

Refusals (``SchemaMismatchError``, INVALID_RECORD on the wire, for the partition only):
a value that is not framed, ids that differ within one batch (a Strata batch has one
schema; a serializer writes one id per schema, so a client sends one per batch unless
it switches schemas mid-batch), an id that is not a live version of the topic's subject,
a body that does not decode. A null value stays null (a tombstone).

Thread-safety: coroutines on the broker's loop; the schema lookups go through
``SchemaCheck``'s caches.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from wire.errors import SchemaMismatchError
from wire.record_batch import (
    PAYLOAD_SCHEMA,
    build_batch,
    crc_of,
    decode_batch,
    encode_record_batch,
    peek_header,
    value_schema_id,
)
from wire.schema import (
    SchemaType,
    confluent_frame,
    from_avro_bodies,
    records_to_arrow,
    to_avro_bodies,
    to_json_values,
)

if TYPE_CHECKING:
    from brokers.schema_registry import SchemaCheck
    from wire.schema import ParsedSchema

__all__ = ["to_framed", "to_typed"]

_FRAME = 5
_TO_THE_END = 2**31 - 1  # binary_slice's stop: pyarrow 26 has no open-ended form
_COMPRESSION_MASK = 0x07


async def _schema(check: SchemaCheck, topic: str, subject: str, schema_id: int
                  ) -> ParsedSchema:
    parsed = await check.schema_of(subject, schema_id)
    if parsed is None:
        raise SchemaMismatchError(
            f"topic {topic!r}: schema id {schema_id} is not a live version of subject "
            f"{subject!r}; register the schema under the subject and produce again")
    return parsed


async def to_typed(batch: bytes, topic: str, subject: str, check: SchemaCheck) -> bytes:
    """A batch of Confluent-framed values as the typed batch of the same records."""
    header, payload = decode_batch(batch, verify=False)
    values = payload.column("value")
    present = pc.invert(pc.is_null(values))
    framed = values.filter(present)
    if len(framed) == 0:
        raise SchemaMismatchError(f"topic {topic!r} is typed: a batch of only null values "
                                  "has no schema id; send tombstones with the Strata client")
    if pc.min(pc.binary_length(framed)).as_py() < _FRAME:
        raise SchemaMismatchError(
            f"topic {topic!r} is typed (value.schema.subject={subject}): every value must be "
            "in Confluent's wire format (magic byte 0, schema id, body); produce with a "
            "schema-registry serializer")
    prefixes = pc.unique(pc.binary_slice(framed, 0, _FRAME)).to_pylist()
    if len(prefixes) != 1 or prefixes[0][0] != 0:
        raise SchemaMismatchError(
            f"topic {topic!r}: the values of one batch carry {len(prefixes)} different "
            "Confluent headers (or a magic byte other than 0); one batch holds values of "
            "one schema id")
    schema_id = int.from_bytes(prefixes[0][1:], "big")
    parsed = await _schema(check, topic, subject, schema_id)
    bodies = pc.binary_slice(framed, _FRAME, _TO_THE_END).to_pylist()
    if parsed.schema_type is SchemaType.AVRO:
        decoded = from_avro_bodies(bodies, parsed)
    else:
        try:
            rows = [json.loads(body) for body in bodies]
        except ValueError as err:
            raise SchemaMismatchError(f"topic {topic!r}: a value is not JSON ({err})") from None
        decoded = records_to_arrow(rows, parsed)
    if len(decoded) != len(values):  # put the null values (tombstones) back
        positions = pc.subtract(pc.cumulative_sum(pc.cast(present, pa.int64())), 1)
        decoded = decoded.take(pc.if_else(present, positions, None))
    return build_batch(
        decoded, keys=payload.column("key"), timestamps=payload.column("timestamp"),
        headers=payload.column("headers"), producer_id=header.producer_id,
        producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
        value_schema_id=schema_id, transactional=header.is_transactional,
        timestamp_bounds=(header.first_timestamp, header.max_timestamp))


async def to_framed(batch: bytes | memoryview, topic: str, subject: str,
                    check: SchemaCheck) -> bytes | memoryview:
    """A typed batch (as the log holds it) with each value in Confluent's wire format;
    the header (offsets, producer fields, attributes) unchanged. Other batches as
    they are."""
    if peek_header(batch).is_control:  # a transaction marker: no payload to frame
        return batch
    header, payload = decode_batch(batch, verify=False)
    schema_id = value_schema_id(payload.schema)
    if schema_id is None:
        return batch
    parsed = await _schema(check, topic, subject, schema_id)
    values = payload.column("value")
    if parsed.schema_type is SchemaType.AVRO:
        bodies: list[bytes | None] = to_avro_bodies(values, parsed)
    else:
        valid = values.is_valid().to_pylist()
        bodies = [text if ok else None
                  for ok, text in zip(valid, to_json_values(values), strict=True)]
    # The 5-byte header joined to every body in one call; a null body stays null.
    framed = pc.binary_join_element_wise(
        pa.scalar(confluent_frame(schema_id, b""), pa.binary()), pa.array(bodies, pa.binary()),
        pa.scalar(b"", pa.binary()))
    plain = pa.RecordBatch.from_arrays(
        [payload.column("key"), framed, payload.column("timestamp"),
         payload.column("headers")], schema=PAYLOAD_SCHEMA)
    out = bytearray(encode_record_batch(
        plain, producer_id=header.producer_id, producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence, transactional=header.is_transactional,
        timestamp_bounds=(header.first_timestamp, header.max_timestamp)))
    # The log's own header fields: the leader's offset and epoch (outside the CRC) and the
    # attributes (timestamp type and the rest; the new payload is uncompressed).
    out[:8] = batch[:8]
    out[12:16] = batch[12:16]
    struct.pack_into(">h", out, 21, header.attributes & ~_COMPRESSION_MASK)
    struct.pack_into(">I", out, 17, crc_of(out))
    return bytes(out)
