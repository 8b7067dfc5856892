"""The authorizer's decisions (brokers/acl.py) without a broker: Kafka's rules for
super users, DENY over ALLOW, implied operations, patterns, wildcards and filters, over
the one ACL type (the wire's AclEntry and AclFilterEntry)."""

from __future__ import annotations

import pytest

from brokers.acl import CLUSTER_NAME, AclCache, check_binding, filter_matches
from wire.errors import InvalidRequestError
from wire.protocol import AclEntry, AclFilterEntry

pytestmark = pytest.mark.unit


def acl(name: str, operation: str, permission: str = "ALLOW", *, principal: str = "User:a",
        resource_type: str = "TOPIC", pattern: str = "LITERAL", host: str = "*"
        ) -> AclEntry:
    return check_binding(AclEntry(resource_type, pattern, name, principal, host, operation,
                                  permission))


def cache(*bindings: AclEntry, **kw: object) -> AclCache:
    made = AclCache(**kw)  # type: ignore[arg-type]
    made.replace(bindings)
    return made


def test_nothing_is_allowed_without_an_acl_unless_configured() -> None:
    assert not cache().authorize("User:a", "h", "READ", "TOPIC", "t")
    assert cache(allow_if_no_acl=True).authorize("User:a", "h", "READ", "TOPIC", "t")
    # An ACL for someone else on the resource: the resource is no longer "without ACLs".
    assert not cache(acl("t", "READ", principal="User:b"), allow_if_no_acl=True).authorize(
        "User:a", "h", "READ", "TOPIC", "t")


def test_super_users_may_do_everything() -> None:
    assert cache(acl("t", "ALL", "DENY", principal="User:root"),
                 super_users=["User:root"]).authorize("User:root", "h", "DELETE", "TOPIC", "t")


def test_deny_wins_and_allow_implies_describe_only_for_allow() -> None:
    rules = cache(acl("t", "READ"), acl("t", "WRITE"), acl("t", "WRITE", "DENY"))
    assert rules.authorize("User:a", "h", "READ", "TOPIC", "t")
    assert not rules.authorize("User:a", "h", "WRITE", "TOPIC", "t")
    assert rules.authorize("User:a", "h", "DESCRIBE", "TOPIC", "t")  # READ implies it
    assert not rules.authorize("User:a", "h", "ALTER", "TOPIC", "t")
    # DENY READ does not deny DESCRIBE (Kafka's rule).
    assert cache(acl("t", "DESCRIBE"), acl("t", "READ", "DENY")).authorize(
        "User:a", "h", "DESCRIBE", "TOPIC", "t")
    assert cache(acl("t", "ALTER_CONFIGS")).authorize("User:a", "h", "DESCRIBE_CONFIGS",
                                                      "TOPIC", "t")
    assert cache(acl("t", "ALL")).authorize("User:a", "h", "DELETE", "TOPIC", "t")


def test_patterns_and_wildcards() -> None:
    rules = cache(acl("logs-", "WRITE", pattern="PREFIXED"), acl("*", "READ"),
                  acl("g", "READ", resource_type="GROUP", principal="User:*"),
                  acl("x", "WRITE", host="10.0.0.1"))
    assert rules.authorize("User:a", "h", "WRITE", "TOPIC", "logs-app")
    assert not rules.authorize("User:a", "h", "WRITE", "TOPIC", "log")
    assert rules.authorize("User:a", "h", "READ", "TOPIC", "anything")
    assert rules.authorize("User:zed", "h", "READ", "GROUP", "g")
    assert not rules.authorize("User:zed", "h", "READ", "TOPIC", "g")  # types differ
    assert rules.authorize("User:a", "10.0.0.1", "WRITE", "TOPIC", "x")
    assert not rules.authorize("User:a", "10.0.0.2", "WRITE", "TOPIC", "x")
    assert rules.allows_any("User:a", "h", "WRITE", "TOPIC")
    assert not rules.allows_any("User:b", "h", "WRITE", "TOPIC")


@pytest.mark.parametrize(("binding", "words"), [
    (("TABLE", "LITERAL", "t", "User:a", "*", "READ", "ALLOW"), "resource type"),
    (("TOPIC", "GLOB", "t", "User:a", "*", "READ", "ALLOW"), "pattern type"),
    (("TOPIC", "LITERAL", "t", "alice", "*", "READ", "ALLOW"), "principal"),
    (("TOPIC", "LITERAL", "t", "User:a", "*", "FLY", "ALLOW"), "operation"),
    (("TOPIC", "LITERAL", "t", "User:a", "*", "READ", "MAYBE"), "permission"),
    (("TOPIC", "PREFIXED", "*", "User:a", "*", "READ", "ALLOW"), "PREFIXED pattern"),
    (("CLUSTER", "LITERAL", "other", "User:a", "*", "ALTER", "ALLOW"), CLUSTER_NAME),
    (("TOPIC", "LITERAL", "", "User:a", "*", "READ", "ALLOW"), "resource name"),
])
def test_bad_bindings_are_refused_with_what_is_wrong(binding: tuple[str, ...],
                                                      words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words):
        check_binding(AclEntry(*binding))


def test_filters_match_fields_and_every_pattern_for_a_name() -> None:
    bindings = [acl("logs-", "WRITE", pattern="PREFIXED"), acl("logs-app", "READ"),
                acl("*", "READ"), acl("other", "READ", principal="User:b")]

    def names(wanted: AclFilterEntry) -> list[str]:
        return [b.resource_name for b in bindings if filter_matches(wanted, b)]

    assert names(AclFilterEntry(pattern_type="MATCH", resource_name="logs-app")) == \
        ["logs-", "logs-app", "*"]
    assert names(AclFilterEntry(principal="User:b")) == ["other"]
    assert names(AclFilterEntry(pattern_type="LITERAL", operation="READ",
                                resource_name="logs-app")) == ["logs-app"]
