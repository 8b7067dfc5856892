"""``strata topic create|list|describe|alter-config|delete``."""

from __future__ import annotations

import argparse
from typing import Any

from strata.client import Admin, NewTopic
from strata.commands.common import (
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    parse_key_values,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, list, describe, alter and delete topics")
    actions = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("-p", "--partitions", type=int, default=-1,
                        help="partition count (default: the broker's num.partitions)")
    create.add_argument("-r", "--replicas", type=int, default=-1,
                        help="replication factor (default: default.replication.factor)")
    create.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config, repeatable (see docs/configuration.md)")
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

    for parser in (create, listing, describe, alter, delete):
        add_bootstrap(parser)
        add_format(parser)


def _create(args: argparse.Namespace) -> int:
    configs = parse_key_values(args.config, "--config")
    with Admin(bootstrap_of(args)) as admin:
        admin.create_topics([NewTopic(args.name, args.partitions, args.replicas, configs)])
        description = admin.describe_topics([args.name])[args.name]
    if args.format == "json":
        emit_json({"created": args.name, "partitions": description.num_partitions})
    else:
        print(f"Created topic {args.name} with {description.num_partitions} partition(s).")
    return 0


def _list(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args)) as admin:
        names = admin.list_topics()
    if args.format == "json":
        emit_json(names)
    else:
        for name in names:
            print(name)
    return 0


def _describe(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args)) as admin:
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
    with Admin(bootstrap_of(args)) as admin:
        admin.alter_configs(args.name, set=updates, delete=args.delete)
    if args.format == "json":
        emit_json({"altered": args.name, "set": updates, "deleted": args.delete})
    else:
        print(f"Updated configs of {args.name}.")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args)) as admin:
        admin.delete_topics([args.name])
    if args.format == "json":
        emit_json({"deleted": args.name})
    else:
        print(f"Deleted topic {args.name}.")
    return 0
