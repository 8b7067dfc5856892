"""An exactly-once consume-transform-produce job as an OS process (issue [3.3] section 4).

    python -m tests.support.ctp_job --bootstrap B --input IN --output OUT --group G \\
        [--pause-s S]

The loop docs/transactions.md shows users: a read_committed ``Consumer`` in group ``G``
(static member ``G-0``, so a restarted job takes its partitions back at once) with
auto-commit off, and a ``Producer`` with transactional id ``G-out``. For every poll
that returned records: begin a transaction, write each record's value upper-cased to
OUT (same partition), add the consumer's next offsets with
``send_offsets_to_transaction``, commit. An abortable error aborts and rewinds to the
last committed offsets; a fatal one ends the process (exit 3). After each commit it
prints ``committed N`` (records in all) and sleeps ``--pause-s``, so a nemesis has time
to SIGKILL it between and inside transactions. SIGTERM ends it after the current
transaction (exit 0).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence

from strata.client import (
    AbortableTransactionError,
    Consumer,
    FatalTransactionError,
    Producer,
    TopicPartition,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.ctp_job")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--pause-s", type=float, default=0.05)
    args = parser.parse_args(argv)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    consumer = Consumer(args.bootstrap, group_id=args.group, group_instance_id=f"{args.group}-0",
                        enable_auto_commit=False, auto_offset_reset="earliest",
                        isolation_level="read_committed", max_poll_records=40,
                        session_timeout_ms=10_000)
    producer = Producer(args.bootstrap, transactional_id=f"{args.group}-out",
                        transaction_timeout_ms=10_000)
    done = 0
    try:
        consumer.subscribe([args.input])
        producer.init_transactions()
        print("ready", flush=True)
        while not stopping.is_set():
            records = consumer.poll(timeout_ms=200)
            if not records:
                continue
            producer.begin_transaction()
            offsets: dict[TopicPartition, int] = {}
            try:
                for r in records:
                    producer.send(args.output, (r.value or b"").upper(), key=r.key,
                                  partition=r.partition)
                for r in records:
                    offsets[TopicPartition(r.topic, r.partition)] = r.offset + 1
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
            except AbortableTransactionError as err:
                print(f"abort: {err}", flush=True)
                producer.abort_transaction()
                # Rewind to what the group committed: the aborted output is gone, so the
                # same input is processed again.
                tps = list({TopicPartition(r.topic, r.partition) for r in records})
                for tp, offset in consumer.committed(tps).items():
                    consumer.seek(tp, offset or 0)
                continue
            done += len(records)
            print(f"committed {done}", flush=True)
            time.sleep(args.pause_s)
    except FatalTransactionError as err:
        print(f"fatal: {err}", flush=True)
        return 3
    finally:
        for close in (producer.close, consumer.close):
            try:
                close()
            except Exception as err:  # report, then close the other
                print(f"close: {err}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
