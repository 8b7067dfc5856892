"""Helpers for tests that use the Python client against a broker."""

from __future__ import annotations

import socket
from typing import Any

from strata.client import Producer, RecordMetadata


def produce(bootstrap: str, topic: str, count: int, partitions: int = 1, *, start: int = 0,
            value: str = "v{}", **options: Any) -> list[RecordMetadata]:
    """Records ``start`` .. ``start + count - 1`` through a ``Producer`` (``options`` are
    its options): record ``i`` has the value ``value.format(i)`` and goes to partition
    ``i % partitions``. Returns once every record is acknowledged (the first failure
    raises), with their metadata in the order they were sent."""
    with Producer(bootstrap, **options) as producer:
        futures = [producer.send(topic, value.format(i).encode(), partition=i % partitions)
                   for i in range(start, start + count)]
        producer.flush()
        return [future.result(30) for future in futures]


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock`` (a raw protocol test's read of one frame);
    ConnectionError if the peer closes the connection first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the peer closed the connection after {len(data)}/{n} bytes")
        data += chunk
    return data
