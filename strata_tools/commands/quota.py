"""``strata quota set|remove|list``: client quotas (Kafka's ``kafka-configs --entity-type
users|clients --alter --add-config producer_byte_rate=...``; docs/security.md).

    strata quota set (--user U | --client-id C) [--producer-byte-rate N]
                     [--consumer-byte-rate N] [--request-rate N]
    strata quota remove (--user U | --client-id C) KEY...
    strata quota list

``--user '<default>'`` (or ``--client-id '<default>'``) sets the default.
"""

from __future__ import annotations

import argparse
from typing import Any

from strata.client import Admin
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    security_of_args,
)

__all__ = ["register"]

KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_rate")


def register(sub: Any) -> None:
    quota = sub.add_parser("quota", help="produce/fetch byte-rate and request-rate quotas")
    actions = quota.add_subparsers(dest="quota_command", metavar="ACTION", required=True)
    set_ = actions.add_parser("set", help="set quotas of a user or client id")
    remove = actions.add_parser("remove", help="remove quotas of a user or client id")
    listing = actions.add_parser("list", help="every quota set")
    for parser in (set_, remove):
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", help="a user name (or '<default>')")
        who.add_argument("--client-id", help="a client id (or '<default>')")
    for key in KEYS:
        set_.add_argument("--" + key.replace("_", "-"), type=int, default=None,
                          metavar="N", dest=key,
                          help="requests/s" if key == "request_rate" else "bytes/s")
    remove.add_argument("keys", nargs="+", choices=KEYS)
    set_.set_defaults(handler=_set)
    remove.set_defaults(handler=_remove)
    listing.set_defaults(handler=_list)
    for parser in (set_, remove, listing):
        add_bootstrap(parser)
        add_format(parser)


def _set(args: argparse.Namespace) -> int:
    values = {k: getattr(args, k) for k in KEYS if getattr(args, k) is not None}
    if not values:
        raise CommandError("give at least one of --producer-byte-rate, --consumer-byte-rate, "
                           "--request-rate")
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in values.items() if v <= 0]
    if bad:
        raise CommandError(f"{', '.join(bad)}: use a number above 0 (strata quota remove "
                           "for no limit)")
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        admin.alter_client_quotas(user=args.user, client_id=args.client_id, set=values)
    _print(args, {(args.user, args.client_id): values})
    return 0


def _remove(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        admin.alter_client_quotas(user=args.user, client_id=args.client_id, remove=args.keys)
    if args.format == "json":
        emit_json({"removed": args.keys})
    else:
        print(f"removed {', '.join(args.keys)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        _print(args, admin.describe_client_quotas())
    return 0


def _print(args: argparse.Namespace, quotas: dict[tuple[str | None, str | None],
                                                  dict[str, int]]) -> None:
    rows = [{"user": u, "client_id": c, **v} for (u, c), v in sorted(quotas.items(), key=str)]
    if args.format == "json":
        emit_json(rows)
        return
    for row in rows:
        entity = f"user={row['user']}" if row["user"] is not None else \
            f"client-id={row['client_id']}"
        values = ", ".join(f"{k}={row[k]}" for k in KEYS if k in row)
        print(f"{entity:<40} {values}")
