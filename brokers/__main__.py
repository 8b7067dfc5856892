"""``python -m brokers``: run one broker (``strata broker start`` calls the same code)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata broker start",
                                     description="Run one Strata broker in the foreground.")
    add_broker_arguments(parser)
    return parser


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="properties file (key=value lines)")
    parser.add_argument("--broker-id", type=int, help="broker.id")
    parser.add_argument("--host", help="host")
    parser.add_argument("--port", type=int, help="port")
    parser.add_argument("--data-dir", help="log.dirs")
    parser.add_argument("--zookeeper", help="zookeeper.connect")
    parser.add_argument("--metrics-port", type=int, help="metrics.port")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="any config key, e.g. --override log.flush.policy=always")
    parser.add_argument("--log-level", default="INFO")


def run_from_args(args: argparse.Namespace) -> int:
    # Imported here: `strata --help` and every client command build this parser, and the
    # broker's modules would add a quarter of a second to each of them.
    from brokers.broker import run_broker
    from brokers.config import load_broker_config
    from wire.errors import StrataError

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides: dict[str, str] = {}
    for item in args.override:
        if "=" not in item:
            print(f"error: --override expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        key, value = item.split("=", 1)
        overrides[key.strip()] = value.strip()
    for flag, key in (("broker_id", "broker.id"), ("host", "host"), ("port", "port"),
                      ("data_dir", "log.dirs"), ("zookeeper", "zookeeper.connect"),
                      ("metrics_port", "metrics.port")):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = str(value)
    try:
        config = load_broker_config(args.config, overrides)
    except StrataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return asyncio.run(run_broker(config))


def main(argv: list[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
