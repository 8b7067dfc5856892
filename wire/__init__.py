"""The wire: what brokers and clients share, and nothing else.

Both sides of a connection import this package; it imports neither (checked by the
import contracts in ``pyproject.toml``, ``make lint``). Its modules:

- ``wire.record_batch``: the record batch format (header + Arrow IPC payload), its
  codec and validation;
- ``wire.protocol``: request and response messages, their codec and the frame layout;
- ``wire.errors``: the error hierarchy with the protocol's error codes;
- ``wire.connection``: one client connection (framing and correlation ids);
- ``wire.partitioner``: the default partitioner (murmur2 of the key, as Kafka's).

Dependencies: the standard library, pyarrow and crc32c. See wire/README.md.
"""
