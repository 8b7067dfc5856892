"""A stock Kafka client (confluent-kafka, librdkafka) as one consumer-group member, in a
process of its own: ``python -m tests.support.kafka_member BOOTSTRAP TOPIC GROUP IDLE_S``.

It subscribes with the cooperative-sticky assignor, commits after each poll, and prints
one JSON line per event, each with its wall-clock time ``at``: ``{"assigned": [p, ...]}``,
``{"revoked": [p, ...]}``, ``{"read": [[p, offset, value], ...]}``, ``{"closing": true}``
once no record came for ``IDLE_S`` seconds (after it read at least one), just before it
closes (leaving the group), and ``{"done": true}`` after.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main(argv: list[str]) -> int:
    from confluent_kafka import Consumer

    bootstrap, topic, group, idle_s = argv[0], argv[1], argv[2], float(argv[3])

    def say(event: dict[str, Any]) -> None:
        print(json.dumps({**event, "at": time.time()}), flush=True)

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 10_000, "heartbeat.interval.ms": 500})
    consumer.subscribe(
        [topic],
        on_assign=lambda c, ps: say({"assigned": sorted(p.partition for p in ps)}),
        on_revoke=lambda c, ps: say({"revoked": sorted(p.partition for p in ps)}))
    last = time.monotonic()
    seen = False
    while not seen or time.monotonic() - last < idle_s:
        messages = consumer.consume(500, 0.5)
        read = []
        for m in messages:
            if m.error():
                say({"error": str(m.error())})
                continue
            read.append([m.partition(), m.offset(), (m.value() or b"").decode()])
        if read:
            say({"read": read})
            consumer.commit(asynchronous=False)
            last, seen = time.monotonic(), True
    say({"closing": True})  # its partitions may move only after this (LeaveGroup)
    consumer.close()
    say({"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
