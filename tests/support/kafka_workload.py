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

    def _run(self, index: int) -> None:
        from confluent_kafka import Producer

        room = threading.Semaphore(self.max_pending)
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "client.id": f"kafka-nemesis-{index}",
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            # As the Strata workload: a request stuck on a dead or paused leader is given
            # up after 5 s and retried elsewhere; a record fails only after 90 s.
            "request.timeout.ms": 5000, "message.timeout.ms": 90_000,
            "retry.backoff.ms": 100})
        try:
            seq = 0
            interval = 1.0 / self.rate
            next_at = time.monotonic()
            while not self._stop.is_set():
                producer.poll(0)  # delivery reports run here, on this thread
                if not room.acquire(timeout=0.2):
                    continue
                partition = self.partition_of(index, seq)
                outcome = Outcome(index, seq, partition, time.monotonic())
                try:
                    producer.produce(self.topic, self.value(index, seq),
                                     key=self.key(index, seq), partition=partition,
                                     on_delivery=functools.partial(self._delivered, outcome,
                                                                   room))
                except Exception as err:  # not handed over: it must never show up
                    with self._lock:
                        self.refused[(index, seq)] = repr(err)
                    room.release()
                else:
                    with self._lock:
                        self.outcomes[(index, seq)] = outcome
                seq += 1
                next_at += interval
                pause = next_at - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
                elif pause < -1.0:
                    next_at = time.monotonic()
        finally:
            producer.flush(self._drain_timeout)

    def _delivered(self, outcome: Outcome, room: threading.Semaphore, err: Any,
                   msg: Any) -> None:
        try:
            if err is None:
                with self._lock:
                    outcome.offset = msg.offset()
                    outcome.acked_at = time.monotonic()
                    self._ack_times[outcome.partition].append(outcome.acked_at)
            else:
                outcome.error = str(err)
        finally:
            room.release()


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
