"""``strata consume TOPIC``: print records (manual assignment; groups come later).

Starts at the end of each partition unless told otherwise (``--from-beginning``,
``--offset N`` with ``--partition``, ``--timestamp MS``). Stops after ``-n COUNT``
records, or once no record has arrived for ``--timeout-ms``, or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from strata.client import Admin, Consumer, OffsetResetStrategy, TopicPartition
from strata.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    render_bytes,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    consume = sub.add_parser("consume", help="print records of a topic")
    consume.add_argument("topic")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at the earliest offset (default: the end)")
    start.add_argument("--offset", type=int, default=None,
                       help="start at this offset (needs --partition)")
    start.add_argument("--timestamp", type=int, default=None, metavar="MS",
                       help="start at the first record at or after this time (ms since epoch)")
    consume.add_argument("--partition", type=int, default=None,
                         help="read only this partition (default: all)")
    consume.add_argument("-n", "--count", type=int, default=None,
                         help="stop after this many records")
    consume.add_argument("--timeout-ms", type=int, default=None,
                         help="stop once no record has arrived for this long")
    consume.add_argument("--key-separator", default=None, metavar="SEP",
                         help="text output: print key SEP value")
    add_bootstrap(consume)
    add_format(consume)
    consume.set_defaults(handler=_consume)


def _consume(args: argparse.Namespace) -> int:
    if args.offset is not None and args.partition is None:
        raise CommandError("--offset needs --partition: offsets are per partition")
    if args.count is not None and args.count < 1:
        raise CommandError("-n/--count must be at least 1")
    bootstrap = bootstrap_of(args)
    with Admin(bootstrap) as admin:
        description = admin.describe_topics([args.topic])[args.topic]
    partitions = [p.partition for p in description.partitions]
    if args.partition is not None:
        if args.partition not in partitions:
            raise CommandError(f"{args.topic} has partitions {partitions[0]}.."
                               f"{partitions[-1]}; there is no partition {args.partition}")
        partitions = [args.partition]
    tps = [TopicPartition(args.topic, p) for p in partitions]
    printed = 0
    # An explicit --offset outside the log is an error to report, not to paper over.
    reset: OffsetResetStrategy = "none" if args.offset is not None else "earliest"
    with Consumer(bootstrap, auto_offset_reset=reset) as consumer:
        consumer.assign(tps)
        if args.from_beginning:
            consumer.seek_to_beginning(tps)
        elif args.offset is not None:
            consumer.seek(tps[0], args.offset)
        elif args.timestamp is not None:
            consumer.seek_to_timestamp(tps, args.timestamp)
        else:
            consumer.seek_to_end(tps)
        last_record = time.monotonic()
        try:
            while args.count is None or printed < args.count:
                wanted = None if args.count is None else args.count - printed
                records = consumer.poll(timeout_ms=200, max_records=wanted)
                if records:
                    last_record = time.monotonic()
                for record in records:
                    _print(record, args)
                printed += len(records)
                if args.timeout_ms is not None and \
                        (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
                    break
        except KeyboardInterrupt:
            pass
        sys.stdout.flush()
    print(f"{printed} record(s) consumed", file=sys.stderr)
    return 0


def _print(record: Any, args: argparse.Namespace) -> None:
    if args.format == "json":
        key, key_encoding = render_bytes(record.key)
        value, value_encoding = render_bytes(record.value)
        headers = []
        for name, data in record.headers or []:
            text, encoding = render_bytes(data)
            headers.append({"key": name, "value": text, "value_encoding": encoding})
        emit_json({"topic": record.topic, "partition": record.partition,
                   "offset": record.offset, "timestamp": record.timestamp,
                   "timestamp_type": int(record.timestamp_type), "key": key,
                   "key_encoding": key_encoding, "value": value,
                   "value_encoding": value_encoding, "headers": headers})
        return
    value_text, _ = render_bytes(record.value)
    if args.key_separator is not None:
        key_text, _ = render_bytes(record.key)
        print(f"{key_text if key_text is not None else ''}{args.key_separator}"
              f"{value_text if value_text is not None else ''}")
    else:
        print(value_text if value_text is not None else "")
