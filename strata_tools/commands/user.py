"""``strata user create|delete|list``: SCRAM users (Kafka's ``kafka-configs --alter
--add-config SCRAM-SHA-256=[password=...] --entity-type users``).

The password is read from ``--password-file`` or, if absent, from standard input (one
line), never from the command line where other users could see it in ``ps``. Only a
salted hash is sent to the broker (docs/security.md).
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
    read_password,
    security_of_args,
)
from wire.sasl import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_MECHANISMS

__all__ = ["register"]


def register(sub: Any) -> None:
    user = sub.add_parser("user", help="SCRAM users the brokers authenticate")
    actions = user.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a user or set its password")
    create.add_argument("name")
    create.add_argument("--mechanism", action="append", choices=list(SCRAM_MECHANISMS),
                        help="SCRAM-SHA-256 and/or SCRAM-SHA-512 (default: both)")
    create.add_argument("--iterations", type=int, default=MIN_ITERATIONS,
                        help=f"PBKDF2 iterations, {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    create.add_argument("--password-file", default=None,
                        help="file holding the password (default: one line on stdin)")
    create.set_defaults(handler=_create)
    delete = actions.add_parser("delete", help="delete a user (its open sessions end)")
    delete.add_argument("name")
    delete.add_argument("--mechanism", action="append", choices=list(SCRAM_MECHANISMS),
                        help="only this mechanism's credential (default: every one it has)")
    delete.set_defaults(handler=_delete)
    listing = actions.add_parser("list", help="users and their mechanisms")
    listing.set_defaults(handler=_list)
    for parser in (create, delete, listing):
        add_bootstrap(parser)
        add_format(parser)


def _create(args: argparse.Namespace) -> int:
    if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
        raise CommandError(f"--iterations {args.iterations} is out of range; use "
                           f"{MIN_ITERATIONS}..{MAX_ITERATIONS}")
    password = read_password(args.password_file)
    mechanisms = args.mechanism or list(SCRAM_MECHANISMS)
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        for mechanism in mechanisms:
            admin.upsert_scram_credential(args.name, password, mechanism=mechanism,
                                          iterations=args.iterations)
    if args.format == "json":
        emit_json({"user": args.name, "mechanisms": mechanisms})
    else:
        print(f"user {args.name}: {', '.join(mechanisms)} set")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        mechanisms = args.mechanism or sorted(
            admin.describe_scram_credentials([args.name])[args.name])
        for mechanism in mechanisms:
            admin.delete_scram_credential(args.name, mechanism)
    if args.format == "json":
        emit_json({"user": args.name, "deleted": mechanisms})
    else:
        print(f"user {args.name}: {', '.join(mechanisms)} deleted")
    return 0


def _list(args: argparse.Namespace) -> int:
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        users = admin.describe_scram_credentials()
    if args.format == "json":
        emit_json([{"user": u, "mechanisms": m} for u, m in sorted(users.items())])
        return 0
    print(f"{'USER':<32} MECHANISMS (iterations)")
    for name, mechanisms in sorted(users.items()):
        print(f"{name:<32} " + ", ".join(f"{m} ({i})" for m, i in sorted(mechanisms.items())))
    return 0
