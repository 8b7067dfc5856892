"""``strata schema register|list|get|check|delete|config``: the schema registry
(Confluent's ``/subjects`` API, kept by the brokers; docs/typed-topics.md).

    strata schema register SUBJECT (--file F | --schema TEXT) [--type AVRO|JSON]
    strata schema list [SUBJECT] [--deleted]
    strata schema get (SUBJECT [--version N|latest] | --id N)
    strata schema check SUBJECT (--file F | --schema TEXT) [--type AVRO|JSON]
                        [--version N|latest]
    strata schema delete SUBJECT [--version N|latest] [--permanent]
    strata schema config [SUBJECT] [--set LEVEL]

``check`` exits 1 when the schema could not be registered, printing each reason.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from strata.client import Admin, Compatibility
from strata_tools.commands.common import (
    CommandError,
    add_bootstrap,
    add_format,
    bootstrap_of,
    emit_json,
    security_of_args,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    schema = sub.add_parser("schema", help="the schema registry: subjects, versions, ids")
    actions = schema.add_subparsers(dest="schema_command", metavar="ACTION", required=True)
    reg = actions.add_parser("register", help="register a schema version under a subject")
    listing = actions.add_parser("list", help="subjects, or one subject's versions")
    get = actions.add_parser("get", help="one version of a subject, or a schema by id")
    check = actions.add_parser("check", help="could this schema be registered?")
    delete = actions.add_parser("delete", help="soft-delete (or remove) a subject or version")
    config = actions.add_parser("config", help="show or set a compatibility level")
    for parser in (reg, check):
        parser.add_argument("subject", help="e.g. orders-value (TopicNameStrategy)")
        text = parser.add_mutually_exclusive_group(required=True)
        text.add_argument("--file", type=Path, help="a file holding the schema")
        text.add_argument("--schema", help="the schema text")
        parser.add_argument("--type", default="AVRO", choices=("AVRO", "JSON"),
                            help="schema type (default AVRO)")
    check.add_argument("--version", default="latest",
                       help="compare with this version (default: as registering would)")
    listing.add_argument("subject", nargs="?", help="list this subject's versions")
    listing.add_argument("--deleted", action="store_true", help="include soft-deleted ones")
    get.add_argument("subject", nargs="?")
    get.add_argument("--version", default="latest")
    get.add_argument("--id", type=int, default=None, help="a schema id instead of a subject")
    delete.add_argument("subject")
    delete.add_argument("--version", default=None, help="one version (default: every one)")
    delete.add_argument("--permanent", action="store_true",
                        help="remove soft-deleted versions for good")
    config.add_argument("subject", nargs="?", help="default: the global level")
    config.add_argument("--set", default=None, metavar="LEVEL",
                        choices=[c.value for c in Compatibility],
                        help="set the level: " + ", ".join(c.value for c in Compatibility))
    for parser, handler in ((reg, _register), (listing, _list), (get, _get), (check, _check),
                            (delete, _delete), (config, _config)):
        parser.set_defaults(handler=handler)
        add_bootstrap(parser)
        add_format(parser)


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(bootstrap_of(args), security=security_of_args(args))


def _text(args: argparse.Namespace) -> str:
    if args.schema is not None:
        return str(args.schema)
    try:
        return Path(args.file).read_text(encoding="utf-8")
    except OSError as err:
        raise CommandError(f"cannot read --file {args.file}: {err.strerror}") from None


def _version(text: str) -> int | Literal["latest"]:
    if text == "latest":
        return "latest"
    if not text.isdigit() or int(text) < 1:
        raise CommandError(f"--version {text}: use a number >= 1 or latest")
    return int(text)


def _register(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        schema_id = admin.register_schema(args.subject, _text(args), args.type)
        version = admin.get_schema(args.subject).version
    if args.format == "json":
        emit_json({"subject": args.subject, "id": schema_id, "version": version})
    else:
        print(f"{args.subject}: schema id {schema_id} (latest version {version})")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        if args.subject is None:
            out: Any = admin.list_subjects(include_deleted=args.deleted)
        else:
            out = admin.list_schema_versions(args.subject, include_deleted=args.deleted)
    if args.format == "json":
        emit_json(out)
    else:
        for item in out:
            print(item)
    return 0


def _get(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.subject is None):
        raise CommandError("give a SUBJECT or --id N (not both)")
    with _admin(args) as admin:
        found = admin.schema_by_id(args.id) if args.id is not None else \
            admin.get_schema(args.subject, _version(args.version))
    body = {"subject": found.subject, "version": found.version, "id": found.schema_id,
            "schemaType": found.schema_type, "schema": found.schema}
    if args.format == "json":
        emit_json(body)
    else:
        where = f"{found.subject} version {found.version}, " if found.subject else ""
        print(f"# {where}schema id {found.schema_id} ({found.schema_type})")
        try:
            print(json.dumps(json.loads(found.schema), indent=2))
        except ValueError:
            print(found.schema)
    return 0


def _check(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        reasons = admin.check_schema_compatibility(args.subject, _text(args), args.type,
                                                   _version(args.version))
        level = admin.get_compatibility(args.subject)
    if args.format == "json":
        emit_json({"is_compatible": not reasons, "compatibility": level,
                   "messages": reasons})
    elif reasons:
        print(f"{args.subject}: NOT compatible under {level}:")
        for reason in reasons:
            print(f"  - {reason}")
    else:
        print(f"{args.subject}: compatible under {level}")
    return 1 if reasons else 0


def _delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        if args.version is None:
            versions = admin.delete_subject(args.subject, permanent=args.permanent)
        else:
            versions = [admin.delete_schema_version(args.subject, _version(args.version),
                                                    permanent=args.permanent)]
    how = "removed" if args.permanent else "soft-deleted"
    if args.format == "json":
        emit_json({"subject": args.subject, how: versions})
    else:
        print(f"{args.subject}: {how} version(s) {', '.join(map(str, versions))}")
    return 0


def _config(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        level = admin.set_compatibility(args.set, args.subject) if args.set else \
            admin.get_compatibility(args.subject)
    where = args.subject or "global"
    if args.format == "json":
        emit_json({"subject": args.subject, "compatibilityLevel": level})
    else:
        print(f"{where}: {level}")
    return 0
