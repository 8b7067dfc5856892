"""``strata group list|describe|reset-offsets|delete``: consumer group administration.

``describe`` shows the members (what each may own now and, while partitions move, where
the assignor wants it to end up) and, per partition the group has committed or a member
owns, ``CURRENT-OFFSET`` (committed), ``LOG-END-OFFSET`` (high watermark), ``LAG`` and
the owning ``MEMBER``.

``reset-offsets`` checks everything before it writes: the target syntax, the topic and
partitions, and that the group has no members (their commits would overwrite the
reset). Without ``--execute`` it only prints the plan.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from strata.client import (
    Admin,
    GroupDescription,
    GroupIdNotFoundError,
    PartitionLag,
    ResetPlan,
    ResetTarget,
    TopicPartition,
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
from wire.protocol import group_by_topic

__all__ = ["format_partitions", "parse_datetime", "parse_reset_target", "register"]


def register(sub: Any) -> None:
    group = sub.add_parser("group", help="consumer groups: list, describe (members, lag), "
                           "reset offsets, delete")
    actions = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="every group, its state and member count")
    listing.set_defaults(handler=_list)

    describe = actions.add_parser(
        "describe", help="members and their assignment; per partition the committed "
        "offset, log end, lag and owning member")
    describe.add_argument("group")
    describe.set_defaults(handler=_describe)

    reset = actions.add_parser(
        "reset-offsets", help="move a group's committed offsets of a topic (prints the "
        "plan; --execute applies it)")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True, help="the topic whose offsets move")
    reset.add_argument("--partition", action="append", default=[], metavar="P",
                       help="only this partition; repeatable (default: every partition)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true",
                        help="to each partition's log start offset")
    target.add_argument("--to-latest", action="store_true",
                        help="to each partition's end (high watermark): skip everything")
    target.add_argument("--to-offset", default=None, metavar="N",
                        help="to offset N (clamped into each partition's valid range)")
    target.add_argument("--to-datetime", default=None, metavar="ISO",
                        help="to the first record at or after this time, e.g. "
                        "2026-11-22T10:00:00Z (no zone: UTC); the end if there is none")
    reset.add_argument("--execute", action="store_true",
                       help="commit the new offsets (the group must have no members); "
                       "without it nothing changes")
    reset.set_defaults(handler=_reset)

    delete = actions.add_parser("delete", help="delete groups with no members and their "
                                "committed offsets")
    delete.add_argument("group", nargs="+")
    delete.set_defaults(handler=_delete)

    for parser in (listing, describe, reset, delete):
        add_bootstrap(parser)
        add_format(parser)


# ---------------------------------------------------------------------- parsing
def _group_id(text: str) -> str:
    if not text.strip():
        raise CommandError("the group id is empty; give the group's name (strata group list)")
    return text


def parse_datetime(text: str) -> datetime:
    """ISO 8601 (``2026-11-22T10:00:00Z``, ``...+02:00``, a date alone); no zone: UTC."""
    raw = text.strip()
    try:
        when = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z"))
                                      else raw)
    except ValueError:
        raise CommandError(f"--to-datetime expects an ISO 8601 time such as "
                           f"2026-11-22T10:00:00Z, got {text!r}") from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    if when.timestamp() < 0:
        raise CommandError(f"--to-datetime {text} is before 1970; give a later time")
    return when


def parse_reset_target(args: argparse.Namespace) -> ResetTarget:
    if args.to_earliest:
        return "earliest"
    if args.to_latest:
        return "latest"
    if args.to_offset is not None:
        offset = parse_non_negative_int(args.to_offset.strip())
        if offset is None:
            raise CommandError(f"--to-offset expects an offset >= 0, got {args.to_offset!r}")
        return offset
    return parse_datetime(args.to_datetime)


def _partitions(items: list[str]) -> list[int] | None:
    if not items:
        return None
    out: list[int] = []
    for item in items:
        value = parse_non_negative_int(item.strip())
        if value is None:
            raise CommandError(f"--partition expects a partition number >= 0, got {item!r}")
        if value in out:
            raise CommandError(f"--partition {value} is given twice")
        out.append(value)
    return out


def format_partitions(partitions: tuple[TopicPartition, ...] | list[TopicPartition]) -> str:
    """``t:0,1 u:2``; ``-`` when empty."""
    by_topic = group_by_topic(sorted(partitions))
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items()) or "-"


def _tps_json(partitions: tuple[TopicPartition, ...]) -> list[dict[str, Any]]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in partitions]


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------- commands
def _list(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        groups = admin.list_groups()
    if args.format == "json":
        emit_json([{"group_id": g.group_id, "state": g.state, "assignor": g.assignor,
                    "members": g.members, "coordinator": g.coordinator} for g in groups])
        return 0
    if not groups:
        print("No consumer groups.")
        return 0
    width = max(5, *(len(g.group_id) for g in groups))
    print(f"{'GROUP':<{width}} {'STATE':<11} {'ASSIGNOR':<18} {'MEMBERS':>7} COORDINATOR")
    for g in groups:
        print(f"{g.group_id:<{width}} {g.state:<11} {g.assignor:<18} {g.members:>7} "
              f"{g.coordinator}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    group_id = _group_id(args.group)
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        try:
            description = admin.describe_group(group_id)
        except GroupIdNotFoundError:
            raise CommandError(f"group {group_id!r} does not exist (no members and no "
                               "committed offsets); see `strata group list`") from None
        lag = admin.group_lag(group_id)
    if args.format == "json":
        emit_json(_describe_json(description, lag))
        return 0
    _print_description(description, lag)
    return 0


def _describe_json(d: GroupDescription, lag: list[PartitionLag]) -> dict[str, Any]:
    return {
        "group_id": d.group_id, "state": d.state, "assignor": d.assignor,
        "group_epoch": d.group_epoch,
        "coordinator": {"id": d.coordinator.node_id, "host": d.coordinator.host,
                        "port": d.coordinator.port},
        "members": [{"member_id": m.member_id, "instance_id": m.instance_id,
                     "client_id": m.client_id, "member_epoch": m.member_epoch,
                     "subscribed_topics": list(m.subscribed_topics),
                     "assignment": _tps_json(m.assignment), "target": _tps_json(m.target)}
                    for m in d.members],
        "partitions": [{"topic": p.topic, "partition": p.partition,
                        "current_offset": p.current_offset,
                        "log_end_offset": p.log_end_offset, "lag": p.lag,
                        "member_id": p.member_id, "instance_id": p.instance_id,
                        "client_id": p.client_id} for p in lag],
        "total_lag": sum(p.lag for p in lag if p.lag is not None),
    }


def _print_description(d: GroupDescription, lag: list[PartitionLag]) -> None:
    c = d.coordinator
    print(f"Group {d.group_id}: state {d.state}, assignor {d.assignor}, epoch "
          f"{d.group_epoch}, coordinator {c.node_id} ({c.host}:{c.port}), "
          f"{len(d.members)} member(s)")
    if d.members:
        moving = any(m.assignment != m.target for m in d.members)
        id_width = max(9, *(len(m.member_id) for m in d.members))
        instance_width = max(11, *(len(_dash(m.instance_id)) for m in d.members))
        client_width = max(9, *(len(m.client_id) for m in d.members))
        print()
        print(f"{'MEMBER-ID':<{id_width}} {'INSTANCE-ID':<{instance_width}} "
              f"{'CLIENT-ID':<{client_width}} {'EPOCH':>5} ASSIGNMENT"
              + ("  -> TARGET" if moving else ""))
        for m in d.members:
            target = f"  -> {format_partitions(m.target)}" \
                if moving and m.target != m.assignment else ""
            print(f"{m.member_id:<{id_width}} {_dash(m.instance_id):<{instance_width}} "
                  f"{m.client_id:<{client_width}} {m.member_epoch:>5} "
                  f"{format_partitions(m.assignment)}{target}")
    print()
    if not lag:
        print("No committed offsets and no assigned partitions.")
        return
    width = max(5, *(len(p.topic) for p in lag))
    print(f"{'TOPIC':<{width}} {'PARTITION':>9} {'CURRENT-OFFSET':>14} {'LOG-END-OFFSET':>14} "
          f"{'LAG':>8} MEMBER")
    for p in lag:
        end = "-" if p.log_end_offset < 0 else str(p.log_end_offset)
        member = "-" if p.member_id is None else \
            p.member_id + (f" ({p.instance_id})" if p.instance_id else "")
        print(f"{p.topic:<{width}} {p.partition:>9} {_dash(p.current_offset):>14} {end:>14} "
              f"{_dash(p.lag):>8} {member}")


def _reset(args: argparse.Namespace) -> int:
    group_id = _group_id(args.group)
    target = parse_reset_target(args)
    partitions = _partitions(args.partition)
    bootstrap = bootstrap_of(args)
    with Admin(bootstrap, security=security_of_args(args)) as admin:
        plan = admin.reset_group_offsets(group_id, args.topic, target, partitions=partitions,
                                         execute=args.execute)
        members = 0
        if not args.execute:
            try:
                members = len(admin.describe_group(group_id).members)
            except GroupIdNotFoundError:
                members = 0
    if args.format == "json":
        emit_json(_plan_json(plan, members))
        return 0
    _print_plan(plan, members)
    return 0


def _plan_json(plan: ResetPlan, members: int) -> dict[str, Any]:
    return {"group_id": plan.group_id, "topic": plan.topic, "target": plan.target,
            "executed": plan.executed, "active_members": members,
            "partitions": [{"topic": r.topic, "partition": r.partition,
                            "current_offset": r.current_offset, "new_offset": r.new_offset,
                            "log_start_offset": r.log_start_offset,
                            "log_end_offset": r.log_end_offset} for r in plan.partitions]}


def _print_plan(plan: ResetPlan, members: int) -> None:
    width = max(5, len(plan.topic))
    print(f"{'TOPIC':<{width}} {'PARTITION':>9} {'CURRENT-OFFSET':>14} {'NEW-OFFSET':>10}")
    for r in plan.partitions:
        print(f"{r.topic:<{width}} {r.partition:>9} {_dash(r.current_offset):>14} "
              f"{r.new_offset:>10}")
    if plan.executed:
        print(f"Reset the offsets of group {plan.group_id} on {plan.topic} to {plan.target}.")
        return
    print(f"Dry run: nothing changed. Add --execute to commit these offsets for group "
          f"{plan.group_id}.")
    if members:
        print(f"Note: the group has {members} active member(s); --execute is refused until "
              "its consumers stop.")


def _delete(args: argparse.Namespace) -> int:
    groups = [_group_id(g) for g in dict.fromkeys(args.group)]
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        results = admin.delete_groups(groups, raise_errors=False)
    deleted = [g for g, error in results.items() if error is None]
    failed = {g: error for g, error in results.items() if error is not None}
    if args.format == "json":
        emit_json({"deleted": deleted,
                   "failed": {g: {"error": e.name, "message": e.message}
                              for g, e in failed.items()}})
    else:
        for g in deleted:
            print(f"Deleted group {g}.")
    if failed:
        raise CommandError("; ".join(f"group {g}: {e}" for g, e in failed.items()))
    return 0
