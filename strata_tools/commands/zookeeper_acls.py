"""``strata zookeeper-acls secure|unsecure``: put ZooKeeper ACLs on an existing cluster's
znodes, or take them off (Kafka's ``zookeeper-security-migration``).

A cluster started with ``zookeeper.set.acl=true`` creates every znode with its ACL. One
that ran without it has open znodes; to secure it (docs/security.md, "ZooKeeper"):

1. restart the brokers one by one with ``zookeeper.set.acl=true`` and the digest
   identity (``zookeeper.digest.username`` / ``zookeeper.digest.password``);
2. run ``strata zookeeper-acls secure`` with the same identity: every znode under
   ``/strata`` becomes writable by it alone (SCRAM credentials readable by it alone).

``unsecure`` is the way back (run it first, then restart the brokers without
``zookeeper.set.acl``). This command talks to ZooKeeper itself, not to the brokers: it
needs the digest identity, which is the key to the whole cluster state. The password is
read from ``--password-file`` or one line of standard input, never the command line.
"""

from __future__ import annotations

import argparse
from typing import Any

from strata_tools.commands.common import CommandError, add_format, emit_json, read_password

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "zookeeper-acls", help="secure (or open) an existing cluster's znodes with "
        "ZooKeeper ACLs")
    actions = parser.add_subparsers(dest="zookeeper_acls_command", metavar="ACTION",
                                    required=True)
    for name, help_text in (
            ("secure", "every znode under /strata: writable only by the digest identity"),
            ("unsecure", "every znode under /strata: open to everyone again")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--zookeeper", required=True, metavar="HOST:PORT[,...]",
                            help="the cluster's zookeeper.connect")
        action.add_argument("--digest-username", required=True,
                            help="the brokers' zookeeper.digest.username")
        action.add_argument("--password-file", default=None,
                            help="file holding zookeeper.digest.password (default: one "
                            "line on stdin)")
        add_format(action)
        action.set_defaults(handler=_run, secure=name == "secure")


def _run(args: argparse.Namespace) -> int:
    from brokers.coordination import ZooKeeperClient, ZooKeeperUnavailableError

    password = read_password(args.password_file, "digest password")
    coordinator = ZooKeeperClient(args.zookeeper, digest=(args.digest_username, password))
    try:
        coordinator.start()
    except Exception as err:
        raise CommandError(str(err)) from None
    try:
        changed = coordinator.migrate_znode_acls(secure=args.secure)
    except ZooKeeperUnavailableError as err:
        raise CommandError(
            f"{err}; if the znodes are already secured with another identity, give that "
            "one (--digest-username and its password)") from None
    finally:
        coordinator.stop()
    what = "secured" if args.secure else "opened to everyone"
    if args.format == "json":
        emit_json({"changed": changed, "secure": args.secure})
    else:
        print(f"{changed} znode(s) {what} under /strata")
    return 0
