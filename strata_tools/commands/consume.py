"""``strata consume TOPIC``: print records, alone or as a member of a consumer group.

Alone (no ``--group``): every partition (or ``--partition``), starting at the end unless
told otherwise (``--from-beginning``, ``--offset N`` with ``--partition``,
``--timestamp MS``); nothing is committed.

``--group G``: joins G and prints only the partitions G gives this process, from G's
committed offsets (partitions with none start at the end, or at the beginning with
``--from-beginning``). It commits what it printed, at least once: a record's offset is
committed only after the record was written and stdout flushed (every second, before a
partition moves to another member, and on exit), so a crash can print a record twice
but never skips one. A partition it gives up before printing anything from it commits
the position it started at, so its next owner does not reset to the end again and skip
records produced in between (as Kafka's console consumer does). Ctrl-C or SIGTERM
commit and leave the group cleanly.

``--isolation-level read_committed`` prints only records of committed transactions (and
plain records), never reading past the first transaction still open; the offsets of
aborted records and of transaction markers are skipped, so printed offsets can have gaps
(docs/transactions.md). The default, ``read_uncommitted``, prints every record written.

Stops after ``-n COUNT`` records, or once polls that together waited ``--timeout-ms``
came back empty, or on Ctrl-C / SIGTERM. Only time spent waiting in polls counts, as in
Kafka's console consumer: time spent printing (a pipe whose reader is slow or not reading
yet blocks the print) is not silence, so records that are waiting are never left behind
because the output was slow. With ``--group``, neither is the time before the group
gives this member its first partitions (the join, or a previous member that still holds
them): on a busy machine a join can take longer than the timeout, and ending then would
leave every record waiting. A member the group gives no partition (more members than
partitions) starts counting after ``JOIN_GRACE_S`` (30 s).

A group member whose printing blocks for longer than ``--max-poll-interval-ms`` (default
300,000, as Kafka's ``max.poll.interval.ms``) leaves its group, so that the group's other
members take its partitions; it rejoins once the output moves again and prints from the
group's committed offsets (records it printed but could not commit may be printed twice).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from strata.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    IdleTimer,
    OffsetResetStrategy,
    StrataError,
    TopicPartition,
)
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    render_bytes,
    security_of_args,
)

__all__ = ["register"]

#: Seconds between two commits of what ``consume --group`` printed.
COMMIT_INTERVAL_S = 1.0

#: Seconds a ``--group`` consumer waits for its first partitions before empty polls count
#: towards ``--timeout-ms`` (see the module's docstring).
JOIN_GRACE_S = 30.0


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
                         help="stop once polls that together waited this long came back "
                         "empty (time spent printing, or with --group waiting for the "
                         "first partitions, does not count)")
    consume.add_argument("--key-separator", default=None, metavar="SEP",
                         help="text output: print key SEP value")
    consume.add_argument("--value-format", default="json", choices=("json", "confluent"),
                         help="a typed topic's values as JSON documents (default) or as "
                         "Confluent's wire format (magic 0, schema id, Avro body); bytes "
                         "topics print as they are")
    consume.add_argument("--isolation-level", default="read_uncommitted",
                         choices=("read_uncommitted", "read_committed"),
                         help="read_committed: only records of committed transactions, "
                         "and nothing past the first open one (the last stable offset); "
                         "read_uncommitted (default, as Kafka): every record written, "
                         "aborted ones included (docs/transactions.md)")
    consume.add_argument("--group", default=None, metavar="G",
                         help="join consumer group G: print the partitions it gives this "
                         "process, from its committed offsets, and commit what was printed")
    consume.add_argument("--max-poll-interval-ms", type=int, default=None, metavar="MS",
                         help="with --group: leave the group when printing blocks (e.g. a "
                         "full pipe) for longer than this, so other members take the "
                         "partitions; rejoin when it moves again (default 300000)")
    add_bootstrap(consume)
    add_format(consume)
    consume.set_defaults(handler=_consume)


def _consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise CommandError("-n/--count must be at least 1")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise CommandError("--timeout-ms must be 0 or more")
    if args.max_poll_interval_ms is not None:
        if args.group is None:
            raise CommandError("--max-poll-interval-ms needs --group: it is how long a group "
                               "member may go without polling before it leaves the group")
        if args.max_poll_interval_ms < 1:
            raise CommandError("--max-poll-interval-ms must be at least 1")
    if args.group is not None:
        return _consume_group(args)
    if args.offset is not None and args.partition is None:
        raise CommandError("--offset needs --partition: offsets are per partition")
    bootstrap = bootstrap_of(args)
    with Admin(bootstrap, security=security_of_args(args)) as admin:
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
    with Consumer(bootstrap, auto_offset_reset=reset, security=security_of_args(args),
                  value_format=args.value_format,
                  isolation_level=args.isolation_level) as consumer:
        consumer.assign(tps)
        if args.from_beginning:
            consumer.seek_to_beginning(tps)
        elif args.offset is not None:
            consumer.seek(tps[0], args.offset)
        elif args.timestamp is not None:
            consumer.seek_to_timestamp(tps, args.timestamp)
        else:
            consumer.seek_to_end(tps)
        idle = IdleTimer(args.timeout_ms)
        try:
            while (args.count is None or printed < args.count) and not idle.expired:
                wanted = None if args.count is None else args.count - printed
                idle.start()
                records = consumer.poll(timeout_ms=200, max_records=wanted)
                idle.stop(len(records))
                for record in records:
                    _print(record, args)  # may block on a full pipe: not silence
                printed += len(records)
        except KeyboardInterrupt:
            pass
        sys.stdout.flush()
    print(f"{printed} record(s) consumed", file=sys.stderr)
    return 0


class _Stop(BaseException):
    """SIGTERM: stop consuming, commit and leave the group (a ``BaseException``, like
    ``KeyboardInterrupt``, so a blocking poll it interrupts gives its records back)."""


class _SigtermStops:
    """While ``armed``, SIGTERM raises ``_Stop``; once disarmed (the final commit and
    close run, both bounded by timeouts) a SIGTERM is only noted: raising it there
    would escape ``cli.main`` as a traceback and exit 1 halfway through leaving."""

    def __init__(self) -> None:
        self.armed = True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False  # one _Stop: a second signal must not interrupt the exit
            raise _Stop()
        print("strata: finishing the last commit and leaving the group",
              file=sys.stderr)


@contextmanager
def _sigterm_stops() -> Iterator[_SigtermStops]:
    stops = _SigtermStops()
    previous = signal.signal(signal.SIGTERM, stops.handle)
    try:
        yield stops
    finally:
        signal.signal(signal.SIGTERM, previous)


def _consume_group(args: argparse.Namespace) -> int:
    for given, option in ((args.offset, "--offset"), (args.timestamp, "--timestamp"),
                          (args.partition, "--partition")):
        if given is not None:
            raise CommandError(
                f"{option} cannot be used with --group: the group assigns the partitions "
                "and they start at its committed offsets; move those with `strata group "
                f"reset-offsets {args.group} --topic {args.topic} ...` (or drop --group)")
    if not args.group.strip():
        raise CommandError("--group is empty; give the group's name")
    bootstrap = bootstrap_of(args)
    with Admin(bootstrap, security=security_of_args(args)) as admin:
        admin.describe_topics([args.topic])  # a clear error for a missing topic, now
    reset: OffsetResetStrategy = "earliest" if args.from_beginning else "latest"
    count = 0
    uncommitted = False  # records printed since the last commit
    options: dict[str, Any] = {}
    if args.max_poll_interval_ms is not None:
        options["max_poll_interval_ms"] = args.max_poll_interval_ms
    consumer = Consumer(bootstrap, group_id=args.group, auto_offset_reset=reset,
                        security=security_of_args(args), value_format=args.value_format,
                        enable_auto_commit=False, client_id="strata-console-consumer",
                        isolation_level=args.isolation_level, **options)

    def commit() -> None:
        """Commit the positions of this member's partitions. Every record a poll returned
        is printed (and stdout flushed) before the next poll or callback, and an
        interrupted print seeks back to the first record not printed, so a position is
        exactly what was printed; a partition with nothing printed yet commits where it
        starts (e.g. the end it was reset to), so that, as with Kafka's consumers, the
        next owner after a rebalance starts there instead of resetting to the end again
        and skipping what was produced in between."""
        nonlocal uncommitted
        sys.stdout.flush()
        try:
            consumer.commit()
            uncommitted = False
        except StrataError as err:
            print(f"strata: warning: {err}", file=sys.stderr)

    def revoked(partitions: set[TopicPartition]) -> None:
        commit()  # before the partitions move to another member

    def lost(partitions: set[TopicPartition]) -> None:
        pass  # already another member's: nothing may be committed for them

    def print_all(records: Sequence[ConsumerRecord]) -> None:
        nonlocal count, uncommitted
        done = 0
        try:
            for record in records:
                _print(record, args)
                done += 1
        except BaseException:
            # Ctrl-C / SIGTERM mid-way: what was not (wholly) printed is not committed.
            _seek_to_first(consumer, records[done:])
            raise
        finally:
            count += done
            uncommitted = uncommitted or done > 0

    with _sigterm_stops() as stops:
        try:
            try:
                consumer.subscribe([args.topic], on_revoke=revoked, on_lost=lost)
                last_commit = subscribed = time.monotonic()
                idle = IdleTimer(args.timeout_ms)
                joined = False  # the group has given this member partitions
                while (args.count is None or count < args.count) and not idle.expired:
                    wanted = None if args.count is None else args.count - count
                    idle.start()
                    records = consumer.poll(timeout_ms=200, max_records=wanted)
                    joined = joined or bool(records) or bool(consumer.assignment())
                    if joined or time.monotonic() - subscribed >= JOIN_GRACE_S:
                        idle.stop(len(records))
                    else:
                        idle.progress()  # still waiting for partitions: not silence
                    print_all(records)  # may block on a full pipe: not silence
                    if uncommitted and time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                        commit()
                        last_commit = time.monotonic()
            except (KeyboardInterrupt, _Stop):
                pass
            stops.armed = False  # from here on a SIGTERM must not interrupt the exit
            if uncommitted:
                commit()
        except _Stop:
            pass  # signalled just as the loop ended: close() still commits (on_revoke)
        finally:
            stops.armed = False
            consumer.close()  # on_revoke commits the positions, then the member leaves
    print(f"{count} record(s) consumed", file=sys.stderr)
    return 0


def _seek_to_first(consumer: Consumer, unprinted: Sequence[ConsumerRecord]) -> None:
    """Move each partition back to its first record in ``unprinted``."""
    first: dict[TopicPartition, int] = {}
    for record in unprinted:
        first.setdefault(TopicPartition(record.topic, record.partition), record.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)


def _print(record: ConsumerRecord, args: argparse.Namespace) -> None:
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
