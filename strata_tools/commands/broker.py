"""``strata broker start``: run one broker in the foreground (what `strata up` launches)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    from brokers.__main__ import add_broker_arguments

    broker = sub.add_parser("broker", help="run a broker in the foreground")
    actions = broker.add_subparsers(dest="broker_command", metavar="ACTION", required=True)
    start = actions.add_parser("start", help="start a broker and serve until SIGTERM")
    add_broker_arguments(start)
    start.set_defaults(handler=_start)


def _start(args: argparse.Namespace) -> int:
    from brokers.__main__ import run_from_args

    return run_from_args(args)
