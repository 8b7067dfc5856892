"""The ``strata`` command: run the local stack and the benchmarks.

    strata up     [--brokers N] [--zookeeper-nodes 1|3] [--data-dir DIR] [--base-port P]
                  [--no-tier] [--format text|json]
    strata status [--data-dir DIR] [--format text|json]
    strata down   [--data-dir DIR]
    strata broker start [--config FILE] [--broker-id N] [--port P] [--override K=V ...]
    strata topic create|list|describe|alter-config|delete|reassign|reassignments ...
    strata cluster describe|elect-preferred-leaders [--topic T [--partition P ...]]
    strata produce TOPIC [--key-separator SEP] [--acks 0|1|all] [--partition P]
    strata consume TOPIC [--from-beginning|--offset N|--timestamp MS] [--partition P]
                         [-n COUNT] [--timeout-ms MS] [--group G]
                         [--value-format json|confluent]
                         [--isolation-level read_uncommitted|read_committed]
    strata group list|describe G|delete G ...
    strata group reset-offsets G --topic T (--to-earliest|--to-latest|--to-offset N|
                               --to-datetime ISO) [--partition P ...] [--execute]
    strata transactions list [--state S ...] [--producer-id ID ...] [--duration-filter MS]
    strata transactions describe ID
    strata transactions describe-producers --topic T --partition P
    strata transactions abort --topic T --partition P --start-offset O
    strata transactions find-hanging [--topic T [--partition P]]
                                     [--max-transaction-timeout MIN]
    strata gateway [--bootstrap ...] [--host H] [--port P] [--workers N]
                   (--auth-config FILE | --no-auth) [--tls-cert FILE --tls-key FILE]
    strata tier run [--topic T ...] [--once | --every SECONDS] [--warehouse DIR]
                    [--lease-ttl-s S]
    strata user create|delete|list ...      strata acl add|remove|list ...
    strata quota set|list ...
    strata schema register|list|get|check|delete|config ...
    strata zookeeper-acls secure|unsecure --zookeeper HOST:PORT --digest-username U
    strata perf log|produce|consume|failover|spark-read|spark-write|spark-e2e|tier|group|scale|
                security|propagation|typed
                [...]

Client commands take ``--bootstrap HOST:PORT[,...]`` (default ``$STRATA_BOOTSTRAP``) and
``--format text|json``.

Exit codes: 0 success; 1 an expected problem, explained on stderr in one message that says
what to do (no traceback); 2 bad usage (argparse); 130 interrupted. ``status`` exits 1
when some recorded process is not running.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from procs import PortInUseError
from strata_tools.commands.common import CommandError
from strata_tools.extras import MissingExtraError, extra_for_missing_module, require
from strata_tools.secure import SecureStack
from strata_tools.stack import (
    DEFAULT_DATA_DIR,
    SHUTDOWN_WAIT_S,
    ZOOKEEPER_NODE_CHOICES,
    Stack,
    StackError,
    StackStatus,
)
from wire.errors import StrataError
from zookeeper.launcher import ZooKeeperError

__all__ = ["build_parser", "main"]


class _UserError(Exception):
    """Raised by handlers for problems the user can fix; printed without a traceback."""


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 1-65535")
    return value


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"where the stack keeps data, logs, pids and stack.json (default: {DEFAULT_DATA_DIR})",
    )


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata", description="Strata: a Spark-native streaming platform (local tools)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser("up", help="start the local stack in the background")
    _add_data_dir(up)
    up.add_argument(
        "--base-port",
        type=_port,
        default=None,
        help="first port of the stack: ZooKeeper listens on P (ensemble node k on P+k, its "
        "quorum port P+3+k, election port P+6+k), the HTTP ingest gateway on P+9, broker i "
        "on P+10+i, its metrics on P+40+i (default: the one recorded in the data dir, "
        "else 2181)",
    )
    up.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="number of brokers (default: as many as the data dir already has, else 3; "
        "topics are then created with replication factor min(brokers, 3), and with 3 or "
        "more brokers min.insync.replicas=2)",
    )
    up.add_argument(
        "--zookeeper-nodes",
        type=int,
        choices=ZOOKEEPER_NODE_CHOICES,
        default=None,
        help="ZooKeeper servers: 1 (one server, in DIR/zookeeper) or 3 (an ensemble that "
        "survives the loss of one node, in DIR/zookeeper-0..2) (default: as many as the "
        "data dir already has, else 1; it cannot be changed on an existing data dir)",
    )
    up.add_argument(
        "--secure", action="store_true",
        help="secure the stack (docs/security.md): a private CA and certificates, SASL_SSL "
        "listeners, SCRAM users admin/broker/gateway/tier, ACLs, ZooKeeper ACLs; prints "
        "the client config to use. A data dir secured once stays secured")
    up.add_argument(
        "--warehouse", default=None, metavar="LOCATION",
        help="where the tiering job keeps the Delta tables: a directory, file:///path or "
        "s3://bucket[/prefix] (credentials and an S3-compatible endpoint come from the "
        "AWS environment of `strata up`, never from here; default: the one the data dir "
        "recorded, else DIR/warehouse)",
    )
    up.add_argument(
        "--no-tier", dest="tier", action="store_false",
        help="do not start the tiering job (a running one is left running); e.g. for a "
        "benchmark that runs its own",
    )
    up.add_argument(
        "--shutdown-wait", type=float, default=SHUTDOWN_WAIT_S, metavar="S",
        help="a broker still shutting down (SIGTERMed a moment ago, e.g. by hand or by "
        "`strata down` in another shell) is waited for up to S seconds, then started "
        f"again (default {SHUTDOWN_WAIT_S:.0f})")
    _add_format(up)
    up.set_defaults(handler=_cmd_up)

    status = sub.add_parser("status", help="show the recorded processes and their health")
    _add_data_dir(status)
    _add_format(status)
    status.set_defaults(handler=_cmd_status)

    down = sub.add_parser("down", help="stop the processes recorded by `strata up`")
    _add_data_dir(down)
    down.add_argument(
        "--grace", type=float, default=30.0,
        help="seconds between SIGTERM and SIGKILL (default 30: above a broker's "
        "shutdown.timeout.ms of 10 s, so a clean shutdown is never cut short)"
    )
    down.set_defaults(handler=_cmd_down)

    from strata_tools.commands import (
        acl,
        broker,
        cluster,
        consume,
        gateway,
        group,
        produce,
        quota,
        schema,
        tier,
        topic,
        transactions,
        user,
        zookeeper_acls,
    )

    for module in (broker, topic, cluster, produce, consume, group, transactions, gateway,
                   tier, user, acl, quota, schema, zookeeper_acls):
        module.register(sub)

    perf = sub.add_parser("perf", help="benchmarks")
    perf_sub = perf.add_subparsers(dest="perf_command", metavar="BENCHMARK", required=True)
    from strata_tools import perf as perf_log
    from strata_tools import perf_client

    log = perf_sub.add_parser("log", help="partition log append/read throughput")
    perf_log.add_log_arguments(log)
    log.set_defaults(handler=perf_log.run_log)
    produce_perf = perf_sub.add_parser("produce", help="producer throughput and latency")
    perf_client.add_produce_arguments(produce_perf)
    produce_perf.set_defaults(handler=perf_client.run_produce)
    consume_perf = perf_sub.add_parser("consume", help="consumer throughput (and e2e latency)")
    perf_client.add_consume_arguments(consume_perf)
    consume_perf.set_defaults(handler=perf_client.run_consume)
    from strata_tools import perf_failover

    failover = perf_sub.add_parser(
        "failover", help="SIGKILL a partition leader: time until acks=all writes succeed")
    perf_failover.add_failover_arguments(failover)
    failover.set_defaults(handler=perf_failover.run_failover)
    # The Spark benchmarks import pyspark only when they run (it is slow to import).
    from strata_tools import perf_spark, perf_spark_sink

    spark_read = perf_sub.add_parser(
        "spark-read", help="Spark streaming read of a topic into the noop sink")
    perf_spark.add_spark_read_arguments(spark_read)
    spark_read.set_defaults(handler=perf_spark.run_spark_read)
    spark_write = perf_sub.add_parser(
        "spark-write", help="Spark batch write into a topic (exactly- and at-least-once)")
    perf_spark_sink.add_spark_write_arguments(spark_write)
    spark_write.set_defaults(handler=perf_spark_sink.run_spark_write)
    spark_e2e = perf_sub.add_parser(
        "spark-e2e", help="latency of produce -> Spark (processingTime=0) -> topic -> consume")
    perf_spark_sink.add_spark_e2e_arguments(spark_e2e)
    spark_e2e.set_defaults(handler=perf_spark_sink.run_spark_e2e)
    from strata_tools import perf_tier

    tier_bench = perf_sub.add_parser(
        "tier", help="tiering into Delta: records/s, bytes/record, replay hot vs tiered")
    perf_tier.add_tier_arguments(tier_bench)
    tier_bench.set_defaults(handler=perf_tier.run_tier)
    from strata_tools import perf_security

    security_bench = perf_sub.add_parser(
        "security", help="PLAINTEXT vs SASL_SSL produce and consume, one broker of its own")
    perf_security.add_security_arguments(security_bench)
    security_bench.set_defaults(handler=perf_security.run_security)
    from strata_tools import perf_propagation

    propagation_bench = perf_sub.add_parser(
        "propagation", help="how long an ACL or SCRAM-user change takes to reach every "
        "broker (a secured cluster)")
    perf_propagation.add_propagation_arguments(propagation_bench)
    propagation_bench.set_defaults(handler=perf_propagation.run_propagation)
    from strata_tools import perf_groups

    group_bench = perf_sub.add_parser(
        "group", help="consumer group rebalance pauses and group consume throughput")
    perf_groups.add_group_arguments(group_bench)
    group_bench.set_defaults(handler=perf_groups.run_group)
    from strata_tools import perf_typed

    typed_bench = perf_sub.add_parser(
        "typed", help="typed topics: produce overhead, bytes per record, Spark typed vs "
        "from_json (--spark)")
    perf_typed.add_typed_arguments(typed_bench)
    typed_bench.set_defaults(handler=perf_typed.run_typed)
    from strata_tools import perf_scale

    scale_bench = perf_sub.add_parser(
        "scale", help="many partitions: creation, broker shutdown/kill/restart, broker "
        "memory and files, idle connections, group balance (JSON on stdout)")
    perf_scale.add_scale_arguments(scale_bench)
    scale_bench.set_defaults(handler=perf_scale.run_scale)
    return parser


def _print_status(status: StackStatus, fmt: str, headline: str) -> None:
    secure = SecureStack(status.data_dir)
    if fmt == "json":
        described = status.to_json()
        if secure.enabled:
            described["security"] = secure.describe()
        print(json.dumps(described, indent=2))
        return
    print(headline)
    for p in status.processes:
        r = p.record
        print(f"  {r.name:<12} {r.endpoint:<22} pid {r.pid:<8} {p.state:<10} log {r.log}")
    if not status.processes:
        print("  (no processes recorded)")
    endpoints = status.endpoints()
    print(f"ZooKeeper: {endpoints['zookeeper'] or '-'}")
    print(f"Bootstrap: {endpoints['bootstrap'] or '-'}")
    print(f"Kafka:     {endpoints['kafka_bootstrap'] or '-'}  (stock Kafka clients, kcat, "
          "Spark's format(\"kafka\"): bootstrap.servers)")
    print(f"Gateway:   {endpoints['gateway'] or '-'}")
    print(f"Warehouse: {status.warehouse or status.data_dir / 'warehouse'}  (Delta tables of "
          "tiered topics; "
          f"tier job metrics {endpoints['tier_metrics'] or '-'})")
    if status.gateway_api_key:
        print(f"API key:   {status.gateway_api_key}  (development key, all access; send "
              "`Authorization: Bearer <key>`)")
    if endpoints["bootstrap"]:
        print(f"Use it:    export STRATA_BOOTSTRAP={endpoints['bootstrap']}")
    if secure.enabled:
        print(f"Secured:   SASL_SSL, CA {secure.ca_file}; as admin: export "
              f"STRATA_COMMAND_CONFIG={secure.config_file('admin')}  (user admin, password "
              "in that file; Python clients: security_protocol='SASL_SSL', "
              "ssl_cafile=<CA>, sasl_plain_username/sasl_plain_password)")


def _cmd_up(args: argparse.Namespace) -> int:
    # ZooKeeper's jars ship inside the pyspark wheel; the gateway is always part of it.
    require("spark", "`strata up` (its ZooKeeper comes with pyspark, its tiering job "
            "runs Spark)")
    require("gateway", "`strata up` (it runs the HTTP ingest gateway)")
    stack = Stack(args.data_dir, brokers=args.brokers, zookeeper_nodes=args.zookeeper_nodes,
                  tier=args.tier, secure=args.secure, progress=progress_to_stderr,
                  shutdown_wait=args.shutdown_wait, warehouse=args.warehouse)
    status = stack.up(base_port=args.base_port)
    _print_status(status, args.format, f"Strata stack is up (data dir {stack.data_dir})")
    if args.format == "text":
        print(f"Stop it with: strata down --data-dir {args.data_dir}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    stack = Stack(args.data_dir)
    status = stack.status()
    if status.all_up:
        headline = f"Strata stack is up (data dir {stack.data_dir})"
    elif status.processes:
        headline = f"Strata stack is NOT fully up (data dir {stack.data_dir}); `strata up` fixes it"
    else:
        headline = f"No Strata stack running in {stack.data_dir}; start one with `strata up`"
    _print_status(status, args.format, headline)
    return 0 if status.all_up else 1


def progress_to_stderr(message: str) -> None:
    """Progress of a long stack operation: stderr, so stdout stays the result."""
    print(message, file=sys.stderr, flush=True)


def _cmd_down(args: argparse.Namespace) -> int:
    stack = Stack(args.data_dir)
    outcome = stack.down(grace=args.grace)
    if not outcome:
        print(f"Nothing to stop: no processes recorded in {stack.data_dir}")
        return 0
    for record, what in outcome:
        print(f"  {record.name:<12} pid {record.pid:<8} {what}")
    print(f"Stack stopped; data kept in {stack.data_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``strata`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
        code: int = args.handler(args)
        return code
    except (StackError, PortInUseError, ZooKeeperError, _UserError, CommandError,
            StrataError, ValueError, MissingExtraError) as exc:
        # Expected operational failures (port taken, no java, ZooKeeper did not start...):
        # their messages say what to do. Anything else is a bug and keeps its traceback.
        print(f"strata: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        advice = extra_for_missing_module(exc)
        if advice is None:  # not an optional part: a bug, keep the traceback
            raise
        print(f"strata: error: {advice}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("strata: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
