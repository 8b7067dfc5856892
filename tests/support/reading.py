"""Reading a topic back in tests: what a fresh consumer sees in a fixed time."""

from __future__ import annotations

import time

from strata.client import Consumer, TopicPartition


def read_for(bootstrap: str, topic: str, partitions: int, isolation: str,
             seconds: float) -> list[tuple[int, int, bytes]]:
    """``(partition, offset, value)`` of every record a fresh consumer at ``isolation``
    reads from the start of the topic's first ``partitions`` partitions in ``seconds``,
    in the order it returned them (a value of None reads as ``b""``)."""
    out: list[tuple[int, int, bytes]] = []
    with Consumer(bootstrap, isolation_level=isolation,  # type: ignore[arg-type]
                  auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            out += [(r.partition, r.offset, r.value or b"")
                    for r in consumer.poll(timeout_ms=200)]
    return out
