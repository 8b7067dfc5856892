"""``strata perf propagation``: how long an ACL or SCRAM-user change takes to apply on
every broker of a running, secured cluster (docs/security.md bounds it at 2 s; figures in
docs/benchmarks.md, "Security: how fast ACL and user changes apply").

Each round, as the user of ``--command-config`` (who needs ALTER on the cluster: a super
user such as the secured stack's ``admin``):

1. *credential create*: a new SCRAM-SHA-256 user is created (AlterUserScramCredentials);
   the time until that user can log in to each broker;
2. *ACL grant*: ``ALLOW DESCRIBE`` on a topic of the benchmark's own is added for the
   user (CreateAcls); the time until each broker's Metadata shows the topic to the user's
   connection, which is already open;
3. *ACL revoke*: the binding is removed (DeleteAcls); the time until each broker refuses
   the topic again (TOPIC_AUTHORIZATION_FAILED);
4. *credential delete*: the user is deleted; the time until each broker has closed the
   user's open connection.

Every time runs from the moment the admin call returned (the change is in ZooKeeper) to
the first probe that sees it; probes go to every broker at once, every ``--poll-ms``.
Prints p50, p95 and max per kind (over rounds x brokers) and whether every one was within
``--bound-ms``. Brokers are found through Metadata, at the addresses they advertise, and
probed with the same protocol and TLS settings as the admin's config. The benchmark's
topic, ACLs and users are removed at the end, also after a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from wire.security import ClientSecurity

__all__ = ["add_propagation_arguments", "run_propagation"]

KINDS = ("credential_create", "acl_grant", "acl_revoke", "credential_delete")
_MECHANISM = "SCRAM-SHA-256"
#: A probe a broker does not answer within this long counts as an error.
_PROBE_TIMEOUT_S = 5.0


class PropagationError(RuntimeError):
    """The change did not reach a broker within the benchmark's give-up time."""


def add_propagation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT[,...]",
                        help="brokers (default: $STRATA_BOOTSTRAP)")
    parser.add_argument("--command-config", default=None, metavar="FILE",
                        help="a SASL config of a user with ALTER on the cluster "
                        "(the secured stack's admin.properties)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--bound-ms", type=float, default=2000.0,
                        help="the bound each change must meet (default 2000)")
    parser.add_argument("--give-up-s", type=float, default=30.0,
                        help="fail when a change has not reached a broker after this long")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def run_propagation(args: argparse.Namespace) -> int:
    from strata_tools.commands.common import CommandError, bootstrap_of, security_of_args

    if args.rounds <= 0 or args.poll_ms <= 0 or args.bound_ms <= 0 or args.give_up_s <= 0:
        raise CommandError("--rounds, --poll-ms, --bound-ms and --give-up-s must be positive")
    admin_security = security_of_args(args)
    if not admin_security.uses_sasl:
        raise CommandError(
            "strata perf propagation needs a SASL listener and an admin login: pass "
            "--command-config with security.protocol=SASL_SSL (or SASL_PLAINTEXT) and the "
            "credentials of a user with ALTER on the cluster (`strata up --secure` writes "
            "admin.properties)")
    try:
        result = asyncio.run(_measure(bootstrap_of(args), admin_security, args))
    except PropagationError as err:
        raise CommandError(str(err)) from None
    if args.format == "json":
        print(json.dumps(result))
    else:
        for kind in KINDS:
            figures = result[kind]
            print(f"{kind}: p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, max "
                  f"{figures['max_ms']} ms over {figures['samples']} (rounds x brokers)")
        verdict = "within" if result["within_bound"] else "NOT within"
        print(f"every change applied on every broker {verdict} {args.bound_ms:.0f} ms")
    return 0


def _stats(samples: list[float]) -> dict[str, Any]:
    from strata_tools.perf_client import percentile

    ordered = sorted(samples)
    return {"samples": len(ordered), "p50_ms": percentile(ordered, 0.5, 1),
            "p95_ms": percentile(ordered, 0.95, 1), "max_ms": round(ordered[-1], 1)}


async def _measure(bootstrap: str, admin_security: ClientSecurity,
                   args: argparse.Namespace) -> dict[str, Any]:
    from strata.client import AclEntry, AclFilterEntry, AsyncAdmin, NewTopic

    run = uuid.uuid4().hex[:8]
    topic, user = f"perf-propagation-{run}", f"perf-propagation-{run}"
    password = secrets.token_urlsafe(16)
    probe_security = replace(admin_security, sasl_mechanism=_MECHANISM, username=user,
                             password=password)
    binding = AclEntry("TOPIC", "LITERAL", topic, f"User:{user}", "*", "DESCRIBE", "ALLOW")
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    admin = AsyncAdmin(bootstrap, security=admin_security)
    try:
        addresses = sorted((await admin.describe_cluster()).brokers.values())
        await admin.create_topics([NewTopic(topic, 1, 1)])
        for _ in range(args.rounds):
            await _round(admin, addresses, topic, user, password, probe_security, binding,
                         samples, args)
    finally:
        await _clean_up(admin, topic, user, AclFilterEntry(resource_name=topic))
        await admin.close()
    result: dict[str, Any] = {"rounds": args.rounds, "brokers": len(addresses),
                              "poll_ms": args.poll_ms, "bound_ms": args.bound_ms}
    for kind in KINDS:
        result[kind] = _stats(samples[kind])
    result["within_bound"] = all(result[k]["max_ms"] <= args.bound_ms for k in KINDS)
    return result


async def _round(admin: Any, addresses: list[tuple[str, int]], topic: str, user: str,
                 password: str, security: ClientSecurity, binding: Any,
                 samples: dict[str, list[float]], args: argparse.Namespace) -> None:
    from strata.client import AclFilterEntry
    from wire.connection import BrokerConnection

    await admin.upsert_scram_credential(user, password, mechanism=_MECHANISM)
    changed = time.perf_counter()

    async def logged_in(address: tuple[str, int]) -> BrokerConnection | None:
        connection = BrokerConnection(*address, security=security)
        try:
            await connection.connect(timeout=_PROBE_TIMEOUT_S)
        except Exception:  # not known there yet: SASL_AUTHENTICATION_FAILED
            await connection.close()
            return None
        return connection

    connections = await _everywhere(addresses, logged_in, changed, samples["credential_create"],
                                    "the new user could log in", args)
    try:
        await admin.create_acls([binding])
        changed = time.perf_counter()
        await _everywhere(connections, _shows(topic, visible=True), changed,
                          samples["acl_grant"], "the granted topic was visible", args)
        await admin.delete_acls([AclFilterEntry(resource_name=topic,
                                                principal=f"User:{user}")])
        changed = time.perf_counter()
        await _everywhere(connections, _shows(topic, visible=False), changed,
                          samples["acl_revoke"], "the revoked topic was refused", args)
        await admin.delete_scram_credential(user, _MECHANISM)
        changed = time.perf_counter()
        await _everywhere(connections, _closed, changed, samples["credential_delete"],
                          "the deleted user's connection was closed", args)
    finally:
        for connection in connections:
            await connection.close()


def _shows(topic: str, *, visible: bool) -> Callable[[Any], Awaitable[Any]]:
    from wire.errors import TopicAuthorizationFailedError
    from wire.protocol import ApiKey, MetadataRequest, MetadataResponse

    async def probe(connection: Any) -> Any:
        answer = await asyncio.wait_for(
            connection.request(ApiKey.METADATA, MetadataRequest([topic])), _PROBE_TIMEOUT_S)
        assert isinstance(answer, MetadataResponse)
        codes = [t.error_code for t in answer.topics if t.name == topic]
        refused = codes == [TopicAuthorizationFailedError.code]
        seen = codes == [0]
        return connection if (seen if visible else refused) else None

    return probe


async def _closed(connection: Any) -> Any:
    from wire.protocol import ApiKey, MetadataRequest

    try:
        await asyncio.wait_for(connection.request(ApiKey.METADATA, MetadataRequest([])),
                               _PROBE_TIMEOUT_S)
    except Exception:  # closed by the broker: what the probe waits for
        return connection
    return None


async def _everywhere(targets: list[Any], probe: Callable[..., Awaitable[Any]],
                      changed: float, samples: list[float], what: str,
                      args: argparse.Namespace) -> list[Any]:
    """Probe every target concurrently until ``probe`` returns something; record each
    target's delay since ``changed`` in milliseconds; return what the probes returned."""
    async def until_seen(target: Any) -> Any:
        while True:
            outcome = await probe(target)
            now = time.perf_counter()
            if outcome is not None:
                samples.append((now - changed) * 1000)
                return outcome
            if now - changed > args.give_up_s:
                raise PropagationError(
                    f"{what} on {target!r} only after more than {args.give_up_s:.0f} s: "
                    "check that every broker is connected to ZooKeeper (strata status)")
            await asyncio.sleep(args.poll_ms / 1000)

    return list(await asyncio.gather(*(until_seen(t) for t in targets)))


async def _clean_up(admin: Any, topic: str, user: str, acl_filter: Any) -> None:
    for step in (admin.delete_acls([acl_filter]), admin.delete_topics([topic]),
                 admin.delete_scram_credential(user, _MECHANISM)):
        with contextlib.suppress(Exception):  # already gone: a round deletes the user
            await step
