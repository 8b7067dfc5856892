"""``strata produce TOPIC``: send standard-input lines as records.

Each line (without its newline) is one record; with ``--key-separator`` the text before
the first separator is the key. Exits 1 if any record was not acknowledged, after
reporting how many were and the first error.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import Future
from typing import Any

from strata.client import Producer
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    security_of_args,
)
from wire.errors import StrataError

__all__ = ["register"]


def register(sub: Any) -> None:
    produce = sub.add_parser("produce", help="send stdin lines to a topic")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", default=None, metavar="SEP",
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--acks", choices=("0", "1", "all"), default="all")
    produce.add_argument("--partition", type=int, default=None,
                         help="send every record to this partition")
    produce.add_argument("--compression", choices=("none", "lz4", "zstd"), default="none")
    produce.add_argument("--linger-ms", type=float, default=5.0)
    add_bootstrap(produce)
    add_format(produce)
    produce.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    acks: int | str = "all" if args.acks == "all" else int(args.acks)
    futures: list[Future[Any]] = []
    send_errors: list[BaseException] = []
    with Producer(bootstrap_of(args), security=security_of_args(args), acks=acks,
                  linger_ms=args.linger_ms, compression=args.compression,
                  enable_idempotence=None if args.acks == "all" else False) as producer:
        for line in sys.stdin.buffer:
            record = line[:-1] if line.endswith(b"\n") else line
            key: bytes | None = None
            if args.key_separator is not None:
                separator = args.key_separator.encode()
                if separator not in record:
                    raise CommandError(
                        f"line {len(futures) + 1} has no key separator {args.key_separator!r}")
                key, record = record.split(separator, 1)
            try:
                futures.append(producer.send(args.topic, record, key=key,
                                             partition=args.partition))
            except StrataError as err:  # refused before sending: stop reading input
                send_errors.append(err)
                break
        producer.flush()
    delivery_errors = [e for e in (f.exception() for f in futures) if e is not None]
    errors = send_errors + delivery_errors
    acknowledged = len(futures) - len(delivery_errors)
    failed = len(errors)
    if args.format == "json":
        emit_json({"acknowledged": acknowledged, "failed": failed,
                   "error": str(errors[0]) if errors else None})
    else:
        print(f"{acknowledged} record(s) acknowledged" +
              (f", {failed} failed: {errors[0]}" if errors else ""), file=sys.stderr)
    return 1 if errors else 0
