"""The ``strata`` command: run the local stack and the benchmarks.

    strata up     [--data-dir DIR] [--base-port P] [--format text|json]
    strata status [--data-dir DIR] [--format text|json]
    strata down   [--data-dir DIR]
    strata perf log [...]            (options come from strata.perf)

Exit codes: 0 success; 1 an expected problem, explained on stderr in one message that says
what to do (no traceback); 2 bad usage (argparse); 130 interrupted. ``status`` exits 1
when some recorded process is not running.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from strata.procs import PortInUseError
from strata.stack import DEFAULT_DATA_DIR, Stack, StackError, StackStatus
from zookeeper.launcher import ZooKeeperError

__all__ = ["build_parser", "main"]


class _PerfModule(Protocol):
    """What ``strata perf log`` needs from :mod:`strata.perf` (imported lazily)."""

    def add_log_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run_log(self, args: argparse.Namespace) -> int: ...


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
        help="first port of the stack; ZooKeeper listens on it, broker i on P+10+i, its "
        "metrics on P+40+i (default: the one recorded in the data dir, else 2181)",
    )
    up.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="number of brokers (default: as many as the data dir already has, else 1)",
    )
    _add_format(up)
    up.set_defaults(handler=_cmd_up)

    status = sub.add_parser("status", help="show the recorded processes and their health")
    _add_data_dir(status)
    _add_format(status)
    status.set_defaults(handler=_cmd_status)

    down = sub.add_parser("down", help="stop the processes recorded by `strata up`")
    _add_data_dir(down)
    down.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL"
    )
    down.set_defaults(handler=_cmd_down)

    perf = sub.add_parser("perf", help="benchmarks")
    perf_sub = perf.add_subparsers(dest="perf_command", metavar="BENCHMARK", required=True)
    # Registered for `strata --help` / `strata perf --help` only; main() hands
    # `strata perf log ...` to strata.perf's own parser (see _run_perf_log).
    perf_sub.add_parser(
        "log", help="partition log append/read throughput", add_help=False
    ).set_defaults(handler=None)
    return parser


def _print_status(status: StackStatus, fmt: str, headline: str) -> None:
    if fmt == "json":
        print(json.dumps(status.to_json(), indent=2))
        return
    print(headline)
    for p in status.processes:
        r = p.record
        print(f"  {r.name:<10} {r.endpoint:<22} pid {r.pid:<8} {p.state:<10} log {r.log}")
    if not status.processes:
        print("  (no processes recorded)")
    endpoints = status.endpoints()
    print(f"ZooKeeper: {endpoints['zookeeper'] or '-'}")
    print(f"Bootstrap: {endpoints['bootstrap'] or '-'}")
    print(f"Gateway:   {endpoints['gateway'] or '- (not part of the stack yet)'}")
    if endpoints["bootstrap"]:
        print(f"Use it:    export STRATA_BOOTSTRAP={endpoints['bootstrap']}")


def _cmd_up(args: argparse.Namespace) -> int:
    stack = Stack(args.data_dir, brokers=args.brokers)
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


def _cmd_down(args: argparse.Namespace) -> int:
    stack = Stack(args.data_dir)
    outcome = stack.down(grace=args.grace)
    if not outcome:
        print(f"Nothing to stop: no processes recorded in {stack.data_dir}")
        return 0
    for record, what in outcome:
        print(f"  {record.name:<10} pid {record.pid:<8} {what}")
    print(f"Stack stopped; data kept in {stack.data_dir}")
    return 0


def _run_perf_log(argv: Sequence[str]) -> int:
    """Dispatch to strata.perf, imported only here so the rest of the CLI never needs it."""
    try:
        perf = cast(_PerfModule, importlib.import_module("strata.perf"))
    except ModuleNotFoundError as exc:
        if exc.name != "strata.perf":
            raise
        raise _UserError(
            "`strata perf log` is not available: strata/perf.py is not in this checkout"
        ) from None
    parser = argparse.ArgumentParser(
        prog="strata perf log", description="Partition log append/read benchmark."
    )
    perf.add_log_arguments(parser)
    return perf.run_log(parser.parse_args(list(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``strata`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list[:2] == ["perf", "log"]:
            return _run_perf_log(args_list[2:])
        args = build_parser().parse_args(args_list)
        if args.handler is None:  # pragma: no cover - only `perf log`, dispatched above
            raise _UserError("unknown command")
        code: int = args.handler(args)
        return code
    except (StackError, PortInUseError, ZooKeeperError, _UserError) as exc:
        # Expected operational failures (port taken, no java, ZooKeeper did not start...):
        # their messages say what to do. Anything else is a bug and keeps its traceback.
        print(f"strata: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("strata: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
