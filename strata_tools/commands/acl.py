"""``strata acl add|remove|list``: ACL bindings (Kafka's ``kafka-acls``).

``add --allow-principal User:alice --operation READ --topic orders`` (or
``--deny-principal``; ``--group G``, ``--cluster``, ``--transactional-id ID``;
``--resource-pattern-type prefixed``; ``--host``). A transactional id takes WRITE (use it:
init, produce, add partitions and offsets, commit, abort), DESCRIBE (see it: describe,
list, find its coordinator) or ALL, as Kafka's model has it; other operations are refused
before anything is written. ``remove`` takes the same options as a filter and removes
every binding it matches (``--force`` needed when the filter names no principal and no
resource).
``list`` shows the bindings, optionally for one principal or resource.
"""

from __future__ import annotations

import argparse
from typing import Any

from brokers.acl import CLUSTER_NAME, OPERATIONS
from strata.client import AclEntry, AclFilterEntry, Admin
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    security_of_args,
)

__all__ = ["TRANSACTIONAL_ID_OPERATIONS", "register"]

#: What a TRANSACTIONAL_ID binding may name (Kafka's model).
TRANSACTIONAL_ID_OPERATIONS = ("WRITE", "DESCRIBE", "ALL")


def register(sub: Any) -> None:
    acl = sub.add_parser("acl", help="access control lists (authorizer.enable=true)")
    actions = acl.add_subparsers(dest="acl_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add bindings")
    remove = actions.add_parser("remove", help="remove the bindings a filter matches")
    listing = actions.add_parser("list", help="show bindings")
    for parser in (add, remove, listing):
        add_bootstrap(parser)
        add_format(parser)
        resource = parser.add_mutually_exclusive_group(required=parser is add)
        resource.add_argument("--topic", help="a topic (or '*': every topic)")
        resource.add_argument("--group", help="a consumer group (or '*')")
        resource.add_argument("--cluster", action="store_true", help="the cluster itself")
        resource.add_argument("--transactional-id", default=None, metavar="ID",
                              help="a transactional producer's id (or '*'); operations "
                              f"{', '.join(TRANSACTIONAL_ID_OPERATIONS)}")
        parser.add_argument("--resource-pattern-type", choices=("literal", "prefixed"),
                            default="literal" if parser is add else None,
                            help="prefixed: every name starting with the one given")
    for parser in (add, remove):
        parser.add_argument("--allow-principal", action="append", default=[],
                            metavar="User:NAME", help="repeatable")
        parser.add_argument("--deny-principal", action="append", default=[],
                            metavar="User:NAME", help="repeatable")
        parser.add_argument("--operation", action="append", default=[],
                            type=str.upper, choices=OPERATIONS, help="repeatable")
        parser.add_argument("--host", default="*", help="client address (default: any)")
    remove.add_argument("--force", action="store_true",
                        help="allow a filter that matches every principal and resource")
    listing.add_argument("--principal", default=None, metavar="User:NAME")
    add.set_defaults(handler=_add)
    remove.set_defaults(handler=_remove)
    listing.set_defaults(handler=_list)


def _resource(args: argparse.Namespace) -> tuple[str | None, str | None]:
    if args.cluster:
        return "CLUSTER", CLUSTER_NAME
    if args.topic is not None:
        return "TOPIC", args.topic
    if args.group is not None:
        return "GROUP", args.group
    if args.transactional_id is not None:
        return "TRANSACTIONAL_ID", args.transactional_id
    return None, None


def _check_operations(resource_type: str | None, operations: list[str]) -> None:
    """Kafka's model: a transactional id is used (WRITE) or seen (DESCRIBE), nothing
    else; refused here, before anything is written."""
    if resource_type != "TRANSACTIONAL_ID":
        return
    wrong = [op for op in operations if op not in TRANSACTIONAL_ID_OPERATIONS]
    if wrong:
        raise CommandError(
            f"--operation {wrong[0]} does not apply to a transactional id; use "
            f"{', '.join(TRANSACTIONAL_ID_OPERATIONS)} (WRITE: run transactions with it, "
            "DESCRIBE: see it)")


def _permissions(args: argparse.Namespace) -> list[tuple[str, str]]:
    return [*(("ALLOW", p) for p in args.allow_principal),
            *(("DENY", p) for p in args.deny_principal)]


def _add(args: argparse.Namespace) -> int:
    resource_type, name = _resource(args)
    assert resource_type is not None and name is not None
    if not _permissions(args) or not args.operation:
        raise CommandError("give at least one --allow-principal or --deny-principal and one "
                           "--operation")
    _check_operations(resource_type, args.operation)
    entries = [AclEntry(resource_type, args.resource_pattern_type.upper(), name, principal,
                        args.host, operation, permission)
               for permission, principal in _permissions(args) for operation in args.operation]
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        admin.create_acls(entries)
    _show(args, entries, "added")
    return 0


def _remove(args: argparse.Namespace) -> int:
    resource_type, name = _resource(args)
    pattern = args.resource_pattern_type.upper() if args.resource_pattern_type else None
    if resource_type is None and not _permissions(args) and not args.force:
        raise CommandError("this filter removes every binding of every principal; name a "
                           "principal or resource, or pass --force")
    _check_operations(resource_type, args.operation)
    who: list[tuple[str | None, str | None]] = [*_permissions(args)] or [(None, None)]
    filters = [AclFilterEntry(resource_type, pattern, name, principal, args.host
                              if args.host != "*" else None, operation, permission)
               for permission, principal in who
               for operation in (args.operation or [None])]
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        removed = admin.delete_acls(filters)
    _show(args, removed, "removed")
    return 0


def _list(args: argparse.Namespace) -> int:
    resource_type, name = _resource(args)
    pattern = args.resource_pattern_type.upper() if args.resource_pattern_type else \
        ("MATCH" if name is not None else None)
    with Admin(bootstrap_of(args), security=security_of_args(args)) as admin:
        found = admin.describe_acls(AclFilterEntry(resource_type, pattern, name,
                                                   args.principal))
    _show(args, found, None)
    return 0


def _show(args: argparse.Namespace, entries: list[AclEntry], verb: str | None) -> None:
    if args.format == "json":
        emit_json([{"resource_type": e.resource_type, "pattern_type": e.pattern_type,
                    "resource_name": e.resource_name, "principal": e.principal,
                    "host": e.host, "operation": e.operation, "permission": e.permission}
                   for e in entries])
        return
    if verb is not None:
        print(f"{len(entries)} binding(s) {verb}")
    for e in sorted(entries, key=lambda e: (e.resource_type, e.resource_name, e.principal,
                                            e.operation)):
        print(f"{e.permission:<5} {e.principal:<28} {e.operation:<16} "
              f"{e.resource_type}:{e.pattern_type}:{e.resource_name} from {e.host}")
