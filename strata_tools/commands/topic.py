"""``strata topic create|list|describe|alter-config|delete|reassign|reassignments``.

``reassign`` checks everything it can before writing anything (the ``--replicas``
syntax, that the topic and partitions exist, that every broker is live), because the
broker records every valid partition of a request even when another one is refused.

``create`` warns on stderr when the new topic's replication factor is below its
effective ``min.insync.replicas`` (the broker's ``log.min.insync.replicas`` unless the
topic overrides it): the broker accepts such a topic, as Kafka does, but no acks=all
write (the producers' default) can ever succeed on it (:func:`acks_all_problem`).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from strata.client import (
    Admin,
    NewTopic,
    PartitionDescription,
    StrataError,
    TopicPartition,
    UnknownTopicOrPartitionError,
)
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    parse_key_values,
    parse_non_negative_int,
    parse_seconds,
    security_of_args,
)

__all__ = ["acks_all_problem", "parse_replica_targets", "register"]

#: Seconds ``reassign --wait`` waits by default.
DEFAULT_WAIT_S = 300.0
#: Seconds between two looks at a reassignment in progress.
_POLL_S = 0.5
_TARGET_SYNTAX = ("PARTITION:BROKER[,BROKER...], such as 0:2,1 (partition 0 onto brokers "
                  "2 and 1, 2 the preferred leader)")


def register(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, list, describe, alter, delete and "
                           "reassign topics")
    actions = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("-p", "--partitions", type=int, default=-1,
                        help="partition count (default: the broker's num.partitions)")
    create.add_argument("-r", "--replicas", type=int, default=-1,
                        help="replication factor (default: default.replication.factor)")
    create.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config, repeatable (see docs/configuration.md)")
    typed = create.add_mutually_exclusive_group()
    typed.add_argument("--typed", action="store_true",
                       help="a typed topic whose values follow subject <name>-value "
                       "(docs/typed-topics.md)")
    typed.add_argument("--value-subject", default=None, metavar="SUBJECT",
                       help="a typed topic whose values follow SUBJECT")
    create.set_defaults(handler=_create)

    listing = actions.add_parser("list", help="list topic names")
    listing.set_defaults(handler=_list)

    describe = actions.add_parser(
        "describe", help="partitions (leader, replicas, ISR, offsets) and configs")
    describe.add_argument("name")
    describe.set_defaults(handler=_describe)

    alter = actions.add_parser("alter-config", help="set or delete topic config overrides")
    alter.add_argument("name")
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY")
    alter.set_defaults(handler=_alter)

    delete = actions.add_parser("delete", help="delete a topic and all its data")
    delete.add_argument("name")
    delete.set_defaults(handler=_delete)

    reassign = actions.add_parser(
        "reassign", help="move partitions onto other brokers (new replicas copy the data "
        "before the old ones are dropped)")
    reassign.add_argument("name")
    reassign.add_argument(
        "--replicas", action="append", required=True, metavar="P:B1,B2,...",
        help="partition P's new replica list, first = preferred leader, e.g. 0:2,1; "
        "repeatable, once per partition")
    reassign.add_argument("--wait", action="store_true",
                          help="wait until every target replica holds the data and is in "
                          "the ISR and the old replicas are gone, printing progress")
    reassign.add_argument("--timeout", default=None, metavar="SECONDS",
                          help=f"with --wait: give up waiting after this long (default "
                          f"{DEFAULT_WAIT_S:g}); the move continues in the background")
    reassign.set_defaults(handler=_reassign)

    reassignments = actions.add_parser(
        "reassignments", help="partition reassignments still in progress")
    reassignments.set_defaults(handler=_reassignments)

    for parser in (create, listing, describe, alter, delete, reassign, reassignments):
        add_bootstrap(parser)
        add_format(parser)


def acks_all_problem(admin: Admin, name: str, wait_s: float = 10.0) -> str | None:
    """Why no acks=all write to topic ``name`` can succeed, or None if one can.

    That is the case when a partition has fewer replicas than the topic's effective
    ``min.insync.replicas``: the ISR can never be large enough. The text says what to
    do. A topic created a moment ago may not be known yet to the broker that answers;
    it is asked again for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            partitions = admin.describe_topics([name])[name].partitions
            configs = admin.describe_configs([name])[name]
            break
        except UnknownTopicOrPartitionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    setting = configs.get("min.insync.replicas")
    if not partitions or setting is None or setting.value is None:
        return None
    min_isr = int(setting.value)
    factor = min(len(p.replicas) for p in partitions)
    if factor >= min_isr:
        return None
    where = "the topic's override" if not setting.is_default else \
        "the brokers' log.min.insync.replicas"
    return (f"topic {name!r} has replication factor {factor} but min.insync.replicas "
            f"{min_isr} ({where}), so no write with acks=all (the producers' default) can "
            f"succeed: each fails with NOT_ENOUGH_REPLICAS. Recreate it with at least "
            f"{min_isr} replicas (strata topic delete {name}; strata topic create {name} "
            f"-r {min_isr}, or without -r for the cluster's default), or lower its minimum "
            f"(strata topic alter-config {name} --set min.insync.replicas={factor})")


def _create(args: argparse.Namespace) -> int:
    configs = parse_key_values(args.config, "--config")
    if args.typed or args.value_subject:
        configs["value.schema.subject"] = args.value_subject or f"{args.name}-value"
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        admin.create_topics([NewTopic(args.name, args.partitions, args.replicas, configs)])
        description = admin.describe_topics([args.name])[args.name]
        problem = acks_all_problem(admin, args.name)
    if problem is not None:
        print(f"strata: warning: {problem}", file=sys.stderr)
    if args.format == "json":
        emit_json({"created": args.name, "partitions": description.num_partitions})
    else:
        print(f"Created topic {args.name} with {description.num_partitions} partition(s).")
    return 0


def _list(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        names = admin.list_topics()
    if args.format == "json":
        emit_json(names)
    else:
        for name in names:
            print(name)
    return 0


def _describe(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        description = admin.describe_topics([args.name])[args.name]
        configs = admin.describe_configs([args.name])[args.name]
    partitions: list[dict[str, Any]] = [{
        "partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
        "replicas": list(p.replicas), "isr": list(p.isr),
        "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
        "high_watermark": p.high_watermark,
    } for p in description.partitions]
    overrides = {name: c.value for name, c in configs.items() if not c.is_default}
    if args.format == "json":
        emit_json({"name": args.name, "partitions": partitions,
                   "configs": {name: c.value for name, c in configs.items()},
                   "overrides": overrides})
        return 0
    print(f"Topic {args.name}: {len(partitions)} partition(s); overrides: "
          + (", ".join(f"{k}={v}" for k, v in overrides.items()) or "none"))
    print(f"{'PARTITION':>9} {'LEADER':>6} {'REPLICAS':<12} {'ISR':<12} {'LOG-START':>10} "
          f"{'LOG-END':>10} {'HIGH-WATERMARK':>14}")
    for p in partitions:
        print(f"{p['partition']:>9} {p['leader']:>6} {_ids(p['replicas']):<12} "
              f"{_ids(p['isr']):<12} {p['log_start_offset']:>10} {p['log_end_offset']:>10} "
              f"{p['high_watermark']:>14}")
    return 0


def _ids(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


def _alter(args: argparse.Namespace) -> int:
    updates = parse_key_values(args.set, "--set")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        admin.alter_configs(args.name, set=updates, delete=args.delete)
    if args.format == "json":
        emit_json({"altered": args.name, "set": updates, "deleted": args.delete})
    else:
        print(f"Updated configs of {args.name}.")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        admin.delete_topics([args.name])
    if args.format == "json":
        emit_json({"deleted": args.name})
    else:
        print(f"Deleted topic {args.name}.")
    return 0


# ---------------------------------------------------------------------- reassign
def parse_replica_targets(items: list[str]) -> dict[int, list[int]]:
    """``["0:2,1", "1:1,2"]`` -> ``{0: [2, 1], 1: [1, 2]}``; ``CommandError`` for a
    malformed item, a partition given twice or a broker listed twice."""
    targets: dict[int, list[int]] = {}
    for item in items:
        text, sep, brokers = item.partition(":")
        partition = parse_non_negative_int(text.strip())
        ids = [parse_non_negative_int(b.strip()) for b in brokers.split(",")]
        if not sep or partition is None or any(b is None for b in ids):
            raise CommandError(f"--replicas expects {_TARGET_SYNTAX}; got {item!r}")
        replicas = [b for b in ids if b is not None]
        twice = sorted({b for b in replicas if replicas.count(b) > 1})
        if twice:
            raise CommandError(
                f"--replicas {item}: broker {_ids(twice)} is listed twice; a broker holds "
                "at most one replica of a partition")
        if partition in targets:
            raise CommandError(f"--replicas gives partition {partition} twice "
                               f"({partition}:{_ids(targets[partition])} and {item}); give "
                               "each partition once")
        targets[partition] = replicas
    return targets


def _check_targets(admin: Admin, name: str, targets: dict[int, list[int]]
                   ) -> dict[int, PartitionDescription]:
    """The topic's partitions now; ``CommandError`` (or the broker's typed error) for
    anything the broker would refuse, so that nothing is written unless all is valid."""
    described = {p.partition: p for p in admin.describe_topics([name])[name].partitions}
    missing = sorted(set(targets) - set(described))
    if missing:
        raise CommandError(
            f"topic {name} has no partition {_ids(missing)} (it has partitions "
            f"0-{len(described) - 1}); check `strata topic describe {name}`")
    live = set(admin.describe_cluster().brokers)
    dead = sorted({b for replicas in targets.values() for b in replicas} - live)
    if dead:
        raise CommandError(
            f"broker {_ids(dead)} is not live (live brokers: {_ids(sorted(live)) or 'none'}); "
            "start it first or choose live brokers (`strata cluster describe`)")
    return described


def _reassign(args: argparse.Namespace) -> int:
    targets = parse_replica_targets(args.replicas)
    if args.timeout is not None and not args.wait:
        raise CommandError("--timeout only applies to --wait; add --wait or drop --timeout")
    timeout = DEFAULT_WAIT_S if args.timeout is None else parse_seconds(args.timeout,
                                                                        "--timeout")
    name = args.name
    text = args.format == "text"
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        before = _check_targets(admin, name, targets)
        moving = admin.list_partition_reassignments()
        admin.alter_partition_reassignments(
            {TopicPartition(name, p): replicas for p, replicas in targets.items()})
        if text:
            for p, replicas in sorted(targets.items()):
                note = " (replaces the reassignment in progress)" \
                    if TopicPartition(name, p) in moving else \
                    " (already so)" if list(before[p].replicas) == replicas else ""
                print(f"{name}-{p}: replicas {_ids(list(before[p].replicas))} -> "
                      f"{_ids(replicas)}{note}")
            print("Reassignment recorded: the new replicas copy the data from the leader; "
                  "once they are in sync, leadership moves if needed and the old replicas "
                  "are dropped.")
        complete = None
        if args.wait:
            _wait_for_reassignment(admin, name, targets, timeout, text)
            complete = True
        elif text:
            print(f"Follow it with `strata topic reassignments`, or `strata topic describe "
                  f"{name}`.")
    if not text:
        emit_json({"topic": name, "complete": complete, "partitions": [
            {"partition": p, "from": list(before[p].replicas), "to": replicas}
            for p, replicas in sorted(targets.items())]})
    return 0


def _progress(name: str, p: int, target: list[int],
              now: PartitionDescription | None, listed: bool) -> tuple[bool, str]:
    """(complete, one line saying where the move of ``name-p`` stands)."""
    if now is None:
        return False, f"{name}-{p}: not in the metadata yet"
    replicas, isr = list(now.replicas), set(now.isr)
    state = (f"replicas {_ids(replicas)}, leader {now.leader}, "
             f"ISR {_ids(sorted(isr)) or 'empty'}")
    if replicas == target and isr == set(target) and now.leader in target and not listed:
        return True, f"{name}-{p}: done ({state})"
    catching_up = [b for b in target if b not in isr]
    leaving = [b for b in replicas if b not in target]
    still_in_sync = sorted(isr - set(target))
    if catching_up:
        step = f"waiting for {_ids(catching_up)} to copy the log and join the ISR"
    elif now.leader not in target:
        step = "moving leadership to a target replica"
    elif leaving:
        step = f"dropping {_ids(leaving)}"
    elif still_in_sync:
        step = f"waiting for {_ids(still_in_sync)} to leave the ISR"
    else:
        step = "finishing"
    return False, f"{name}-{p}: {step} ({state})"


def _wait_for_reassignment(admin: Admin, name: str, targets: dict[int, list[int]],
                           timeout: float, text: bool) -> None:
    """Until every partition has exactly its target replicas, led by one of them, with
    exactly them in the ISR, and is no longer listed as moving; prints a line whenever a
    partition's state changes. ``CommandError`` on timeout."""
    started = time.monotonic()
    shown: dict[int, str] = {}
    lines: dict[int, str] = {}
    while True:
        try:
            described = {p.partition: p
                         for p in admin.describe_topics([name])[name].partitions}
            pending = admin.list_partition_reassignments()
        except StrataError as err:
            if not err.retriable:
                raise
            described, pending = {}, {}  # a leader or controller is moving: look again
        else:
            done = True
            for p, target in sorted(targets.items()):
                complete, lines[p] = _progress(name, p, target, described.get(p),
                                               TopicPartition(name, p) in pending)
                done = done and complete
                if text and shown.get(p) != lines[p]:
                    print(f"[{time.monotonic() - started:5.1f}s] {lines[p]}", flush=True)
                    shown[p] = lines[p]
            if done:
                if text:
                    print(f"Reassignment of {name} complete.")
                return
        if time.monotonic() - started >= timeout:
            still = "; ".join(line for p, line in sorted(lines.items())
                              if not line.startswith(f"{name}-{p}: done"))
            raise CommandError(
                f"still moving after {timeout:g}s: {still or 'no answer from the brokers'}; "
                "the reassignment continues in the background, follow it with "
                "`strata topic reassignments`")
        time.sleep(_POLL_S)


def _reassignments(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        pending = admin.list_partition_reassignments()
        described: dict[str, dict[int, PartitionDescription]] = {}
        for topic in sorted({tp.topic for tp in pending}):
            try:
                described[topic] = {p.partition: p for p in
                                    admin.describe_topics([topic])[topic].partitions}
            except StrataError:
                described[topic] = {}  # deleted meanwhile: its move ends with it
    rows: list[dict[str, Any]] = []
    for tp, r in pending.items():
        now = described[tp.topic].get(tp.partition)
        rows.append({"topic": tp.topic, "partition": tp.partition,
                     "replicas": list(r.replicas), "adding": list(r.adding),
                     "removing": list(r.removing),
                     "leader": now.leader if now else -1,
                     "isr": list(now.isr) if now else []})
    if args.format == "json":
        emit_json(rows)
        return 0
    if not rows:
        print("No partition reassignments in progress.")
        return 0
    width = max(5, *(len(row["topic"]) for row in rows))
    print(f"{'TOPIC':<{width}} {'PARTITION':>9} {'REPLICAS':<12} {'ADDING':<10} "
          f"{'REMOVING':<10} {'LEADER':>6} ISR")
    for row in rows:
        print(f"{row['topic']:<{width}} {row['partition']:>9} {_ids(row['replicas']):<12} "
              f"{_ids(row['adding']) or '-':<10} {_ids(row['removing']) or '-':<10} "
              f"{row['leader']:>6} {_ids(row['isr']) or '-'}")
    return 0
