"""``strata cluster describe|elect-preferred-leaders|rolling-restart``.

``rolling-restart`` restarts the brokers of a ``strata up`` stack one at a time
(:meth:`strata_tools.stack.Stack.rolling_restart`): progress on stderr, one line per
broker on stdout (or JSON), exit 1 with what to do when a broker does not come back or
the partitions do not get back in sync.

``elect-preferred-leaders`` exits 1 when some partition is still not led by its
preferred replica afterwards (that replica is down or not in sync), like Kafka's
``kafka-leader-election.sh``: the table is printed first, then one error line naming
those partitions.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from strata.client import Admin, TopicPartition
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    parse_non_negative_int,
    security_of_args,
)
from strata_tools.stack import (
    DEFAULT_DATA_DIR,
    ROLLING_RESTART_GRACE_S,
    SYNC_TIMEOUT_S,
    Stack,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    cluster = sub.add_parser("cluster", help="the cluster: controller, live brokers, "
                             "preferred-leader election")
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    describe = actions.add_parser("describe", help="cluster id, controller and live brokers")
    describe.set_defaults(handler=_describe)

    elect = actions.add_parser(
        "elect-preferred-leaders",
        help="move leadership back to each partition's preferred replica (its first "
        "replica) where that replica is alive and in sync")
    elect.add_argument("--topic", default=None,
                       help="only this topic's partitions (default: every partition)")
    elect.add_argument("--partition", action="append", default=[], metavar="P",
                       help="only this partition of --topic; repeatable")
    elect.set_defaults(handler=_elect)

    for parser in (describe, elect):
        add_bootstrap(parser)
        add_format(parser)

    rolling = actions.add_parser(
        "rolling-restart",
        help="restart the brokers of a `strata up` stack one at a time (the controller's "
        "last), each after every partition is back in sync")
    rolling.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                         help=f"the stack's data dir (default: {DEFAULT_DATA_DIR})")
    rolling.add_argument("--grace", type=float, default=ROLLING_RESTART_GRACE_S, metavar="S",
                         help="seconds between a broker's SIGTERM and SIGKILL (default "
                         f"{ROLLING_RESTART_GRACE_S:.0f})")
    rolling.add_argument("--sync-timeout", type=float, default=SYNC_TIMEOUT_S, metavar="S",
                         help="how long to wait for every partition to be back in sync "
                         f"before the next broker (default {SYNC_TIMEOUT_S:.0f})")
    add_format(rolling)
    rolling.set_defaults(handler=_rolling_restart)


def _rolling_restart(args: argparse.Namespace) -> int:
    if args.grace < 0 or args.sync_timeout <= 0:
        raise CommandError("--grace must be >= 0 and --sync-timeout > 0 seconds")
    stack = Stack(args.data_dir, progress=lambda m: print(m, file=sys.stderr, flush=True))
    started = time.monotonic()
    steps = stack.rolling_restart(grace=args.grace, sync_timeout=args.sync_timeout)
    if args.format == "json":
        emit_json({"brokers": [
            {"name": s.name, "old_pid": s.old_pid, "new_pid": s.new_pid,
             "stop_s": round(s.stop_s, 3), "start_s": round(s.start_s, 3),
             "total_s": round(s.total_s, 3)} for s in steps],
            "total_s": round(time.monotonic() - started, 3)})
        return 0
    for s in steps:
        print(f"  {s.name:<10} pid {s.old_pid} -> {s.new_pid}: stopped in {s.stop_s:.1f} s, "
              f"answered {s.start_s:.1f} s later, in sync after {s.total_s:.1f} s")
    print(f"Rolling restart done: {len(steps)} broker(s) in "
          f"{time.monotonic() - started:.1f} s")
    return 0


def _describe(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        cluster = admin.describe_cluster()
    brokers = [{"id": node, "host": host, "port": port}
               for node, (host, port) in sorted(cluster.brokers.items())]
    if args.format == "json":
        emit_json({"cluster_id": cluster.cluster_id, "controller_id": cluster.controller_id,
                   "brokers": brokers})
        return 0
    print(f"Cluster id: {cluster.cluster_id or '-'}")
    if cluster.controller_id < 0:
        print("Controller: none (no broker holds the role right now; leader elections and "
              "reassignments wait for one)")
    else:
        address = cluster.brokers.get(cluster.controller_id)
        where = f" ({address[0]}:{address[1]})" if address else ""
        print(f"Controller: broker {cluster.controller_id}{where}")
    print(f"Live brokers: {len(brokers)}")
    print(f"{'ID':>6}  ADDRESS")
    for b in brokers:
        mark = "  (controller)" if b["id"] == cluster.controller_id else ""
        print(f"{b['id']:>6}  {b['host']}:{b['port']}{mark}")
    return 0


def _elect(args: argparse.Namespace) -> int:
    partitions: list[int] = []
    for text in args.partition:
        value = parse_non_negative_int(text.strip())
        if value is None:
            raise CommandError(f"--partition expects a partition number (0, 1, ...), "
                               f"got {text!r}")
        if value not in partitions:
            partitions.append(value)
    if partitions and args.topic is None:
        raise CommandError("--partition needs --topic: name the topic the partitions "
                           "belong to")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        before = admin.describe_topics(None if args.topic is None else [args.topic])
        wanted: list[TopicPartition] | None = None
        if args.topic is not None:
            known = [p.partition for p in before[args.topic].partitions]
            missing = sorted(set(partitions) - set(known))
            if missing:
                raise CommandError(
                    f"topic {args.topic} has no partition "
                    f"{', '.join(str(p) for p in missing)} (it has partitions "
                    f"0-{len(known) - 1}); check `strata topic describe {args.topic}`")
            wanted = [TopicPartition(args.topic, p) for p in (partitions or known)]
        results = admin.elect_preferred_leaders(wanted)
    previous = {TopicPartition(t.name, p.partition): p
                for t in before.values() for p in t.partitions}
    rows: list[dict[str, Any]] = []
    for tp, result in results.items():
        old = previous.get(tp)
        was = old.leader if old is not None else -1
        preferred = old.replicas[0] if old is not None and old.replicas else -1
        rows.append({"topic": tp.topic, "partition": tp.partition, "preferred": preferred,
                     "previous_leader": was, "leader": result.leader,
                     "moved": result.leader != was,
                     "preferred_leads": result.preferred_leads,
                     "message": result.message})
    if args.format == "json":
        emit_json(rows)
    else:
        _print_election(rows)
    stuck = [r for r in rows if not r["preferred_leads"]]
    if stuck:
        raise CommandError(
            f"{len(stuck)} partition(s) not led by their preferred replica: "
            + "; ".join(f"{r['topic']}-{r['partition']}: {r['message']}" for r in stuck)
            + "; bring those brokers back and in sync (`strata topic describe`), then retry")
    return 0


def _print_election(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("No partitions.")
        return
    width = max(5, *(len(r["topic"]) for r in rows))
    print(f"{'TOPIC':<{width}} {'PARTITION':>9} {'PREFERRED':>9} {'LEADER':>6}  RESULT")
    for r in rows:
        if not r["preferred_leads"]:
            outcome = f"not moved: {r['message']}"
        elif r["moved"]:
            outcome = f"moved (was {r['previous_leader']})"
        else:
            outcome = "unchanged: already led by its preferred replica"
        print(f"{r['topic']:<{width}} {r['partition']:>9} {r['preferred']:>9} "
              f"{r['leader']:>6}  {outcome}")
    moved = sum(1 for r in rows if r["moved"] and r["preferred_leads"])
    already = sum(1 for r in rows if not r["moved"] and r["preferred_leads"])
    print(f"{moved} moved to their preferred replica, {already} already there, "
          f"{len(rows) - moved - already} could not move.")
