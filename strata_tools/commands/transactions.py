"""``strata transactions list|describe|describe-producers|abort|find-hanging``: Kafka's
``kafka-transactions`` tool (docs/transactions.md).

``list`` and ``describe ID`` ask the transaction coordinators; ``describe-producers``
asks a partition's leader for the producers that wrote there and the first offset of
each one's open transaction; ``find-hanging`` lists the open transactions no coordinator
will ever end (their producer wrote nothing for longer than ``--max-transaction-timeout``
minutes, and no coordinator has that partition in an open transaction of theirs); and
``abort --topic T --partition P --start-offset O`` ends one of those with the ABORT
marker its coordinator would have written (it needs CLUSTER_ACTION on the cluster).

The text output has Kafka's columns (``TransactionalId``, ``ProducerId``,
``CurrentTransactionStartOffset``, ...), plus Strata's ``TwoPhase`` and ``Tag`` in
``describe`` and the reason in ``find-hanging``; ``--format json`` has every field. Every
argument is checked before anything is sent, and ``abort`` writes nothing unless an open
transaction starts exactly at ``--start-offset``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from strata.client import (
    TRANSACTION_STATES,
    Admin,
    HangingTransaction,
    ProducerState,
    TransactionalIdNotFoundError,
    TransactionDescription,
)
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    parse_non_negative_int,
    security_of_args,
)

__all__ = ["format_table", "register"]

#: Kafka's ``find-hanging --max-transaction-timeout`` default, in minutes (the brokers'
#: default ``transaction.max.timeout.ms``).
DEFAULT_MAX_TIMEOUT_MIN = 15


def register(sub: Any) -> None:
    transactions = sub.add_parser(
        "transactions", help="transactions: list, describe, producers of a partition, "
        "find and abort hanging ones (Kafka's kafka-transactions)")
    actions = transactions.add_subparsers(dest="transactions_command", metavar="ACTION",
                                          required=True)

    listing = actions.add_parser("list", help="every transactional id, its coordinator, "
                                 "producer id and state")
    listing.add_argument("--state", action="append", default=[], metavar="STATE",
                         help="only ids in this state; repeatable "
                         f"({', '.join(TRANSACTION_STATES)})")
    listing.add_argument("--producer-id", action="append", default=[], metavar="ID",
                         help="only ids held by this producer id; repeatable")
    listing.add_argument("--duration-filter", default=None, metavar="MS",
                         help="only transactions open for at least MS milliseconds")
    listing.set_defaults(handler=_list)

    describe = actions.add_parser("describe", help="one transactional id: state, producer, "
                                  "timeout, the open transaction's start and partitions")
    describe.add_argument("transactional_id", metavar="ID")
    describe.set_defaults(handler=_describe)

    producers = actions.add_parser(
        "describe-producers", help="the producers of one partition (from its leader) and "
        "the first offset of each one's open transaction")
    _add_partition(producers)
    producers.set_defaults(handler=_describe_producers)

    abort = actions.add_parser(
        "abort", help="abort a hanging transaction in one partition: the one that starts "
        "at --start-offset (needs CLUSTER_ACTION on the cluster)")
    _add_partition(abort)
    abort.add_argument("--start-offset", required=True, metavar="O",
                       help="the first offset of the transaction (describe-producers' "
                       "CurrentTransactionStartOffset, find-hanging's StartOffset)")
    abort.set_defaults(handler=_abort)

    hanging = actions.add_parser(
        "find-hanging", help="open transactions no coordinator will end (they hold back "
        "every read_committed reader of their partition)")
    hanging.add_argument("--topic", default=None, help="only this topic (default: every "
                         "topic)")
    hanging.add_argument("--partition", default=None, metavar="P",
                         help="only this partition (needs --topic)")
    hanging.add_argument("--max-transaction-timeout", default=None, metavar="MIN",
                         help="the brokers' transaction.max.timeout.ms in minutes: only "
                         "transactions whose producer wrote nothing for longer are "
                         f"candidates (default {DEFAULT_MAX_TIMEOUT_MIN})")
    hanging.set_defaults(handler=_find_hanging)

    for parser in (listing, describe, producers, abort, hanging):
        add_bootstrap(parser)
        add_format(parser)


def _add_partition(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", required=True, metavar="P")


# ---------------------------------------------------------------------- parsing
def _number(text: str, option: str, what: str) -> int:
    value = parse_non_negative_int(text.strip())
    if value is None:
        raise CommandError(f"{option} expects {what} (a whole number >= 0), got {text!r}")
    return value


def _topic(text: str | None) -> str:
    if text is None or not text.strip():
        raise CommandError("--topic is empty; give the topic's name (strata topic list)")
    return text


def _partition_of(args: argparse.Namespace) -> tuple[str, int]:
    return _topic(args.topic), _number(args.partition, "--partition", "a partition number")


def _check_partition(admin: Admin, topic: str, partition: int) -> None:
    """The topic exists and has the partition (UNKNOWN_TOPIC_OR_PARTITION otherwise)."""
    count = admin.describe_topics([topic])[topic].num_partitions
    if partition >= count:
        raise CommandError(f"[UNKNOWN_TOPIC_OR_PARTITION] {topic} has partitions "
                           f"0..{count - 1}; there is no partition {partition}")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Kafka's tools' table: left-aligned columns, each as wide as its widest cell."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _none(value: object) -> object:
    return "None" if value is None else value


# ---------------------------------------------------------------------- commands
def _list(args: argparse.Namespace) -> int:
    states = list(dict.fromkeys(args.state))
    by_lower = {s.lower(): s for s in TRANSACTION_STATES}
    unknown = [s for s in states if s.lower() not in by_lower]
    if unknown:
        raise CommandError(f"--state {unknown[0]!r} is not a transaction state; use one of "
                           f"{', '.join(TRANSACTION_STATES)}")
    states = [by_lower[s.lower()] for s in states]
    pids = [_number(p, "--producer-id", "a producer id") for p in args.producer_id]
    duration = None if args.duration_filter is None else \
        _number(args.duration_filter, "--duration-filter", "milliseconds")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        listed = admin.list_transactions(states or None, pids or None, duration)
    if args.format == "json":
        emit_json([{"transactional_id": t.transactional_id, "coordinator": t.coordinator,
                    "producer_id": t.producer_id, "state": t.state} for t in listed])
        return 0
    print(format_table(("TransactionalId", "Coordinator", "ProducerId", "TransactionState"),
                       [(t.transactional_id, t.coordinator, t.producer_id, t.state)
                        for t in listed]))
    return 0


def _describe(args: argparse.Namespace) -> int:
    txn_id = args.transactional_id
    if not txn_id.strip():
        raise CommandError("the transactional id is empty; give one (strata transactions "
                           "list shows them)")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        try:
            d = admin.describe_transactions([txn_id])[txn_id]
        except TransactionalIdNotFoundError as err:
            raise CommandError(f"[{err.name}] transactional id {txn_id!r} has no state at "
                               "its coordinator (never used, or expired after "
                               "transactional.id.expiration.ms); see `strata transactions "
                               "list`") from None
    now = time.time_ns() // 1_000_000
    duration = None if d.start_ms is None else now - d.start_ms
    if args.format == "json":
        emit_json(_description_json(d, duration))
        return 0
    print(format_table(
        ("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
         "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
         "TransactionDurationMs", "TopicPartitions", "TwoPhase", "Tag"),
        [(d.coordinator, d.transactional_id, d.producer_id, d.producer_epoch, d.state,
          d.timeout_ms, _none(d.start_ms), _none(duration),
          ",".join(str(tp) for tp in d.partitions), d.two_phase, _none(d.tag))]))
    return 0


def _description_json(d: TransactionDescription, duration: int | None) -> dict[str, Any]:
    return {"transactional_id": d.transactional_id, "coordinator": d.coordinator,
            "state": d.state, "producer_id": d.producer_id,
            "producer_epoch": d.producer_epoch, "timeout_ms": d.timeout_ms,
            "start_ms": d.start_ms, "duration_ms": duration,
            "partitions": [{"topic": tp.topic, "partition": tp.partition}
                           for tp in d.partitions],
            "two_phase": d.two_phase, "tag": d.tag}


def _describe_producers(args: argparse.Namespace) -> int:
    topic, partition = _partition_of(args)
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        _check_partition(admin, topic, partition)
        producers = admin.describe_producers(topic, partition)
    if args.format == "json":
        emit_json([_producer_json(p) for p in producers])
        return 0
    print(format_table(
        ("ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
         "LastTimestamp", "CurrentTransactionStartOffset"),
        [(p.producer_id, p.producer_epoch, p.coordinator_epoch, p.last_sequence,
          p.last_timestamp, _none(p.current_txn_start_offset)) for p in producers]))
    return 0


def _producer_json(p: ProducerState) -> dict[str, Any]:
    return {"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
            "coordinator_epoch": p.coordinator_epoch, "last_sequence": p.last_sequence,
            "last_timestamp": p.last_timestamp,
            "current_txn_start_offset": p.current_txn_start_offset}


def _abort(args: argparse.Namespace) -> int:
    topic, partition = _partition_of(args)
    start = _number(args.start_offset, "--start-offset", "the transaction's first offset")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        _check_partition(admin, topic, partition)
        spec = admin.abort_transaction(topic, partition, start)
    if args.format == "json":
        emit_json({"topic": spec.topic, "partition": spec.partition,
                   "producer_id": spec.producer_id, "producer_epoch": spec.producer_epoch,
                   "coordinator_epoch": spec.coordinator_epoch,
                   "start_offset": spec.start_offset})
        return 0
    print(f"Aborted the transaction of producer {spec.producer_id} (epoch "
          f"{spec.producer_epoch}) that started at offset {spec.start_offset} of "
          f"{spec.topic}-{spec.partition}: an ABORT marker was written with coordinator "
          f"epoch {spec.coordinator_epoch}; read_committed readers now skip its records.")
    return 0


def _find_hanging(args: argparse.Namespace) -> int:
    topic = None if args.topic is None else _topic(args.topic)
    partition = None
    if args.partition is not None:
        if topic is None:
            raise CommandError("--partition needs --topic: partitions are per topic")
        partition = _number(args.partition, "--partition", "a partition number")
    minutes = DEFAULT_MAX_TIMEOUT_MIN if args.max_transaction_timeout is None else \
        _number(args.max_transaction_timeout, "--max-transaction-timeout", "minutes")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        if topic is not None and partition is not None:
            _check_partition(admin, topic, partition)
        found = admin.find_hanging(None if topic is None else [topic], partition=partition,
                                   max_transaction_timeout_ms=minutes * 60_000)
    if args.format == "json":
        emit_json([_hanging_json(h) for h in found])
        return 0
    now = time.time_ns() // 1_000_000
    print(format_table(
        ("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
         "StartOffset", "LastTimestamp", "Duration(min)", "Reason"),
        [(h.topic, h.partition, h.producer_id, h.producer_epoch, h.coordinator_epoch,
          h.start_offset, h.last_timestamp, (now - h.last_timestamp) // 60_000, h.reason)
         for h in found]))
    if found:
        first = found[0]
        print(f"\nEach holds back every read_committed reader of its partition. End one "
              f"with: strata transactions abort --topic {first.topic} --partition "
              f"{first.partition} --start-offset {first.start_offset}")
    return 0


def _hanging_json(h: HangingTransaction) -> dict[str, Any]:
    return {"topic": h.topic, "partition": h.partition, "producer_id": h.producer_id,
            "producer_epoch": h.producer_epoch, "coordinator_epoch": h.coordinator_epoch,
            "start_offset": h.start_offset, "last_timestamp": h.last_timestamp,
            "transactional_id": h.transactional_id, "reason": h.reason}
