"""The wire: what brokers and clients share, and nothing else.

Both sides of a connection import this package; it imports neither (checked by the
import contracts in ``pyproject.toml``, ``make lint``). Its modules:

- ``wire.record_batch``: the record batch format (header + Arrow IPC payload), its
  codec and validation;
- ``wire.protocol``: request and response messages, their codec and the frame layout;
- ``wire.errors``: the error hierarchy with the protocol's error codes;
- ``wire.connection``: one client connection (framing and correlation ids);
- ``wire.partitioner``: the default partitioner (murmur2 of the key, as Kafka's);
- ``wire.schema``: typed topics' schemas (Avro, JSON Schema) mapped to Arrow.

Dependencies: the standard library, pyarrow, crc32c and fastavro. See wire/README.md.
"""
