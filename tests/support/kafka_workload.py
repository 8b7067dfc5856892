"""The nemesis workload and reader with a stock Kafka client on both ends (issue [3.6]).

``KafkaWorkload`` is ``tests.support.nemesis.Workload`` whose producers are
confluent-kafka (librdkafka) ``Producer``s, idempotent with acks=all, writing through the
brokers' Kafka listeners; every record's outcome (acknowledged at an offset, or failed)
is recorded exactly as the Strata producers' are, so the same checker
(``nemesis.check``) judges the history. ``read_partitions_kafka`` reads every partition
from offset 0 to its high watermark with a confluent-kafka ``Consumer`` (assigned, no
group), the other end of the same check.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from tests.support.nemesis import Outcome, Workload

__all__ = ["KafkaWorkload", "read_partitions_kafka"]


class KafkaWorkload(Workload):
    """``Workload`` with librdkafka producers on ``kafka_bootstrap``."""

    def __init__(self, kafka_bootstrap: str, topic: str, partitions: int, **kw: Any) -> None:
        super().__init__(kafka_bootstrap, topic, partitions, **kw)

    def _open(self, index: int) -> Any:
        from confluent_kafka import Producer

        return Producer({
            "bootstrap.servers": self.bootstrap, "client.id": f"kafka-nemesis-{index}",
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            # As the Strata workload: a request stuck on a dead or paused leader is given
            # up after 5 s and retried elsewhere; a record fails only after 90 s.
            "request.timeout.ms": 5000, "message.timeout.ms": 90_000,
            "retry.backoff.ms": 100})

    def _send(self, producer: Any, outcome: Outcome, value: Any, key: bytes | None,
              room: threading.Semaphore) -> None:
        producer.produce(self.topic, value, key=key, partition=outcome.partition,
                         on_delivery=functools.partial(self._delivered, outcome, room))

    def _serve(self, producer: Any) -> None:
        producer.poll(0)  # delivery reports run here, on the producing thread

    def _close(self, producer: Any) -> None:
        producer.flush(self._drain_timeout)

    def _delivered(self, outcome: Outcome, room: threading.Semaphore, err: Any,
                   msg: Any) -> None:
        self._settle(outcome, room, None if err is None else str(err),
                     msg.offset() if err is None else None)


def read_partitions_kafka(kafka_bootstrap: str, topic: str, high_watermarks: dict[int, int],
                          timeout: float = 60.0) -> dict[int, list[tuple[int, bytes | None]]]:
    """Every record from offset 0 to each high watermark, as ``(offset, value)``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    out: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in high_watermarks}
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "nemesis-reader",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(high_watermarks)])
        todo = {p for p, hw in high_watermarks.items() if hw > 0}
        positions = dict.fromkeys(high_watermarks, 0)
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} with librdkafka did not reach the high "
                                     f"watermarks {high_watermarks}: {positions}")
            for m in consumer.consume(5000, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(f"reading {topic}: {m.error()}")
                p = m.partition()
                if m.offset() < high_watermarks[p]:
                    out[p].append((m.offset(), m.value()))
                positions[p] = m.offset() + 1
                if positions[p] >= high_watermarks[p]:
                    todo.discard(p)
    finally:
        consumer.close()
    return out
