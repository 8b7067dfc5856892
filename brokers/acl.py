"""Authorization: ACL bindings and the decision a broker makes for every request.

An ACL binding says *principal* may (ALLOW) or may not (DENY) do *operation* on
resources of one *type* (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID) named by a *pattern*
(LITERAL: that name, ``*`` for every name; PREFIXED: every name starting with it), from
*host* (``*``: anywhere). Kafka's rules decide:

1. a principal in ``super.users`` may do everything;
2. a matching DENY refuses, whatever ALLOW says;
3. a matching ALLOW permits. READ, WRITE, DELETE and ALTER imply DESCRIBE;
   ALTER_CONFIGS implies DESCRIBE_CONFIGS; ALL matches every operation;
4. no binding at all for the resource: ``allow.everyone.if.no.acl.found`` decides
   (false by default: a secured cluster refuses what nobody allowed).

A binding is the wire's :class:`wire.protocol.AclEntry`, the one ACL type the client,
the protocol, ZooKeeper and the authorizer share; a DescribeAcls or DeleteAcls filter is
the wire's :class:`wire.protocol.AclFilterEntry`. This module holds the rules over them:
``check_binding`` (what may be stored), ``matches_resource``, ``grants`` and
``filter_matches``.

``AclCache`` holds every binding as last read from ZooKeeper (one znode per resource
pattern, updated by watch, so a change applies on every broker within a watch's delay)
and answers ``authorize`` from memory with an index by resource type and name, so a
produce to one topic looks at that topic's bindings only.

Thread-safety: the event loop only (``replace`` swaps the whole index at once).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

from wire.errors import InvalidRequestError
from wire.protocol import AclEntry, AclFilterEntry

__all__ = ["CLUSTER_NAME", "OPERATIONS", "PATTERN_TYPES", "PERMISSIONS", "RESOURCE_TYPES",
           "AclCache", "RefusalLog", "check_binding", "filter_matches", "grants",
           "matches_resource", "pattern_key"]

RESOURCE_TYPES: Final = ("TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID")
PATTERN_TYPES: Final = ("LITERAL", "PREFIXED")
OPERATIONS: Final = ("ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE",
                     "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE")
PERMISSIONS: Final = ("ALLOW", "DENY")
#: The name of the one CLUSTER resource (Kafka's ``kafka-cluster``).
CLUSTER_NAME: Final = "strata-cluster"
#: Operations an ALLOW of the key also grants.
_IMPLIED: Final = {
    "DESCRIBE": {"READ", "WRITE", "DELETE", "ALTER", "DESCRIBE"},
    "DESCRIBE_CONFIGS": {"ALTER_CONFIGS", "DESCRIBE_CONFIGS"},
}


def check_binding(entry: AclEntry) -> AclEntry:
    """``entry`` if it is a binding the broker can store and apply; otherwise
    ``InvalidRequestError`` saying every field that is wrong."""
    problems = []
    if entry.resource_type not in RESOURCE_TYPES:
        problems.append(f"resource type {entry.resource_type!r} (use "
                        f"{', '.join(RESOURCE_TYPES)})")
    if entry.pattern_type not in PATTERN_TYPES:
        problems.append(f"pattern type {entry.pattern_type!r} (use LITERAL or PREFIXED)")
    if entry.operation not in OPERATIONS:
        problems.append(f"operation {entry.operation!r} (use {', '.join(OPERATIONS)})")
    if entry.permission not in PERMISSIONS:
        problems.append(f"permission {entry.permission!r} (use ALLOW or DENY)")
    if not entry.resource_name or "/" in entry.resource_name:
        problems.append(f"resource name {entry.resource_name!r} (non-empty, no '/')")
    if not entry.principal.startswith("User:") or len(entry.principal) == 5:
        problems.append(f"principal {entry.principal!r} (use User:<name> or User:*)")
    if not entry.host:
        problems.append("host (use * for any)")
    if entry.pattern_type == "PREFIXED" and entry.resource_name == "*":
        problems.append("PREFIXED pattern '*' (use LITERAL '*' for every name)")
    if entry.resource_type == "CLUSTER" and entry.resource_name != CLUSTER_NAME:
        problems.append(f"CLUSTER resource name {entry.resource_name!r} (it is "
                        f"{CLUSTER_NAME!r})")
    if problems:
        raise InvalidRequestError("ACL binding has a bad " + "; bad ".join(problems))
    return entry


def pattern_key(entry: AclEntry) -> tuple[str, str, str]:
    """The resource pattern a binding is stored under (one znode per pattern)."""
    return entry.resource_type, entry.pattern_type, entry.resource_name


def matches_resource(entry: AclEntry, resource_type: str, name: str) -> bool:
    """Whether the binding's pattern covers resource ``name`` of ``resource_type``."""
    if resource_type != entry.resource_type:
        return False
    if entry.pattern_type == "PREFIXED":
        return name.startswith(entry.resource_name)
    return entry.resource_name in ("*", name)


def grants(entry: AclEntry, principal: str, host: str, operation: str) -> bool:
    """Whether the binding speaks for ``principal`` doing ``operation`` from ``host``
    (ALLOW bindings also speak for the operations they imply)."""
    if entry.principal not in (principal, "User:*") or entry.host not in (host, "*"):
        return False
    if entry.operation in ("ALL", operation):
        return True
    return entry.permission == "ALLOW" and entry.operation in _IMPLIED.get(operation, ())


def filter_matches(wanted: AclFilterEntry, entry: AclEntry) -> bool:
    """Whether DescribeAcls' or DeleteAcls' filter ``wanted`` takes the binding: a None
    field matches anything; a pattern type of ``MATCH`` (Kafka's) takes every pattern
    that applies to the name."""
    if wanted.pattern_type == "MATCH":
        if wanted.resource_name is not None and not matches_resource(
                entry, entry.resource_type, wanted.resource_name):
            return False
    elif wanted.pattern_type not in (None, entry.pattern_type) or \
            wanted.resource_name not in (None, entry.resource_name):
        return False
    return all(want in (None, have) for want, have in (
        (wanted.resource_type, entry.resource_type), (wanted.principal, entry.principal),
        (wanted.host, entry.host), (wanted.operation, entry.operation),
        (wanted.permission, entry.permission)))


class AclCache:
    """Every binding, indexed for ``authorize`` (see the module docstring)."""

    def __init__(self, *, super_users: Iterable[str] = (), allow_if_no_acl: bool = False
                 ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self.bindings: list[AclEntry] = []
        self._literal: dict[tuple[str, str], list[AclEntry]] = {}
        self._other: dict[str, list[AclEntry]] = {}  # PREFIXED and '*', by type

    def replace(self, bindings: Iterable[AclEntry]) -> None:
        literal: dict[tuple[str, str], list[AclEntry]] = {}
        other: dict[str, list[AclEntry]] = {}
        every = list(bindings)
        for binding in every:
            if binding.pattern_type == "LITERAL" and binding.resource_name != "*":
                literal.setdefault((binding.resource_type, binding.resource_name),
                                   []).append(binding)
            else:
                other.setdefault(binding.resource_type, []).append(binding)
        self.bindings, self._literal, self._other = every, literal, other

    def _for(self, resource_type: str, name: str) -> list[AclEntry]:
        return [*self._literal.get((resource_type, name), ()),
                *(b for b in self._other.get(resource_type, ())
                  if matches_resource(b, resource_type, name))]

    def authorize(self, principal: str, host: str, operation: str, resource_type: str,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        bindings = self._for(resource_type, name)
        if not bindings:
            return self.allow_if_no_acl
        speaking = [b for b in bindings if grants(b, principal, host, operation)]
        if any(b.permission == "DENY" for b in speaking):
            return False
        return bool(speaking)

    def allows_any(self, principal: str, host: str, operation: str, resource_type: str
                   ) -> bool:
        """Whether some ALLOW lets ``principal`` do ``operation`` on some resource of the
        type (Kafka's test for idempotent producers: WRITE on any topic)."""
        if principal in self.super_users:
            return True
        return any(b.permission == "ALLOW" and b.resource_type == resource_type
                   and grants(b, principal, host, operation) for b in self.bindings)


class RefusalLog:
    """One audit line per refused request, at most ``per_second`` lines a second; the
    lines held back are counted in the next one written."""

    def __init__(self, log: object, per_second: int = 20) -> None:
        self._log = log
        self._per_second = per_second
        self._window = 0
        self._written = 0
        self._held_back = 0

    def refused(self, principal: str, peer: str, operation: str, resource_type: str,
                name: str) -> None:
        now = int(time.monotonic())
        if now != self._window:
            self._window, self._written = now, 0
        if self._written >= self._per_second:
            self._held_back += 1
            return
        self._written += 1
        extra = f" ({self._held_back} more refusals not logged)" if self._held_back else ""
        self._held_back = 0
        self._log.warning(  # type: ignore[attr-defined]
            "refused: principal=%s client=%s operation=%s resource=%s:%s%s", principal, peer,
            operation, resource_type, name, extra)
