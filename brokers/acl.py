"""Authorization: ACL bindings and the decision a broker makes for every request.

An ACL binding says *principal* may (ALLOW) or may not (DENY) do *operation* on
resources of one *type* (TOPIC, GROUP, CLUSTER) named by a *pattern* (LITERAL: that
name, ``*`` for every name; PREFIXED: every name starting with it), from *host* (``*``:
anywhere). Kafka's rules decide:

1. a principal in ``super.users`` may do everything;
2. a matching DENY refuses, whatever ALLOW says;
3. a matching ALLOW permits. READ, WRITE, DELETE and ALTER imply DESCRIBE;
   ALTER_CONFIGS implies DESCRIBE_CONFIGS; ALL matches every operation;
4. no binding at all for the resource: ``allow.everyone.if.no.acl.found`` decides
   (false by default: a secured cluster refuses what nobody allowed).

``AclCache`` holds every binding as last read from ZooKeeper (one znode per resource
pattern, updated by watch, so a change applies on every broker within a watch's delay)
and answers ``authorize`` from memory with an index by resource type and name, so a
produce to one topic looks at that topic's bindings only.

Thread-safety: the event loop only (``replace`` swaps the whole index at once).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from wire.errors import InvalidRequestError

__all__ = ["OPERATIONS", "PATTERN_TYPES", "PERMISSIONS", "RESOURCE_TYPES", "AclBinding",
           "AclCache", "AclFilter", "RefusalLog"]

RESOURCE_TYPES: Final = ("TOPIC", "GROUP", "CLUSTER")
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


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: str
    pattern_type: str
    resource_name: str
    principal: str
    host: str
    operation: str
    permission: str

    def __post_init__(self) -> None:
        problems = []
        if self.resource_type not in RESOURCE_TYPES:
            problems.append(f"resource type {self.resource_type!r} (use "
                            f"{', '.join(RESOURCE_TYPES)})")
        if self.pattern_type not in PATTERN_TYPES:
            problems.append(f"pattern type {self.pattern_type!r} (use LITERAL or PREFIXED)")
        if self.operation not in OPERATIONS:
            problems.append(f"operation {self.operation!r} (use {', '.join(OPERATIONS)})")
        if self.permission not in PERMISSIONS:
            problems.append(f"permission {self.permission!r} (use ALLOW or DENY)")
        if not self.resource_name or "/" in self.resource_name:
            problems.append(f"resource name {self.resource_name!r} (non-empty, no '/')")
        if not self.principal.startswith("User:") or len(self.principal) == 5:
            problems.append(f"principal {self.principal!r} (use User:<name> or User:*)")
        if not self.host:
            problems.append("host (use * for any)")
        if self.pattern_type == "PREFIXED" and self.resource_name == "*":
            problems.append("PREFIXED pattern '*' (use LITERAL '*' for every name)")
        if self.resource_type == "CLUSTER" and self.resource_name != CLUSTER_NAME:
            problems.append(f"CLUSTER resource name {self.resource_name!r} (it is "
                            f"{CLUSTER_NAME!r})")
        if problems:
            raise InvalidRequestError("ACL binding has a bad " + "; bad ".join(problems))

    @property
    def pattern_key(self) -> tuple[str, str, str]:
        return self.resource_type, self.pattern_type, self.resource_name

    def matches_resource(self, resource_type: str, name: str) -> bool:
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == "PREFIXED":
            return name.startswith(self.resource_name)
        return self.resource_name in ("*", name)

    def grants(self, principal: str, host: str, operation: str) -> bool:
        """Whether this binding speaks for ``principal`` doing ``operation`` from ``host``
        (ALLOW bindings also speak for the operations they imply)."""
        if self.principal not in (principal, "User:*") or self.host not in (host, "*"):
            return False
        if self.operation in ("ALL", operation):
            return True
        return self.permission == "ALLOW" and self.operation in _IMPLIED.get(operation, ())


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings a DescribeAcls or DeleteAcls means; None matches anything. A
    pattern type of ``MATCH`` (Kafka's) takes every pattern that applies to the name."""

    resource_type: str | None = None
    pattern_type: str | None = None
    resource_name: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None

    def matches(self, binding: AclBinding) -> bool:
        if self.pattern_type == "MATCH":
            if self.resource_name is not None and not binding.matches_resource(
                    binding.resource_type, self.resource_name):
                return False
        elif self.pattern_type not in (None, binding.pattern_type) or \
                self.resource_name not in (None, binding.resource_name):
            return False
        return all(want in (None, have) for want, have in (
            (self.resource_type, binding.resource_type), (self.principal, binding.principal),
            (self.host, binding.host), (self.operation, binding.operation),
            (self.permission, binding.permission)))


class AclCache:
    """Every binding, indexed for ``authorize`` (see the module docstring)."""

    def __init__(self, *, super_users: Iterable[str] = (), allow_if_no_acl: bool = False
                 ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self.bindings: list[AclBinding] = []
        self._literal: dict[tuple[str, str], list[AclBinding]] = {}
        self._other: dict[str, list[AclBinding]] = {}  # PREFIXED and '*', by type

    def replace(self, bindings: Iterable[AclBinding]) -> None:
        literal: dict[tuple[str, str], list[AclBinding]] = {}
        other: dict[str, list[AclBinding]] = {}
        every = list(bindings)
        for binding in every:
            if binding.pattern_type == "LITERAL" and binding.resource_name != "*":
                literal.setdefault((binding.resource_type, binding.resource_name),
                                   []).append(binding)
            else:
                other.setdefault(binding.resource_type, []).append(binding)
        self.bindings, self._literal, self._other = every, literal, other

    def _for(self, resource_type: str, name: str) -> list[AclBinding]:
        return [*self._literal.get((resource_type, name), ()),
                *(b for b in self._other.get(resource_type, ())
                  if b.matches_resource(resource_type, name))]

    def authorize(self, principal: str, host: str, operation: str, resource_type: str,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        bindings = self._for(resource_type, name)
        if not bindings:
            return self.allow_if_no_acl
        speaking = [b for b in bindings if b.grants(principal, host, operation)]
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
                   and b.grants(principal, host, operation) for b in self.bindings)


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
