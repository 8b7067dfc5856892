"""Security: SASL (SaslHandshake, SaslAuthenticate), SCRAM credentials, ACLs and client
quotas (docs/security.md).

Thin over the broker's authenticator (``brokers/security.py``) for logins, and over
ZooKeeper for credentials, ACLs and quotas: every change is a ZooKeeper write that
reaches every broker's caches through its watches. Changing any of them needs ALTER on
the cluster, reading them DESCRIBE.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from brokers.acl import (
    CLUSTER_NAME,
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    RESOURCE_TYPES,
    check_binding,
    filter_matches,
)
from brokers.answers import error_fields
from brokers.handlers.context import (
    ApiContext,
    ApiFamily,
    Handler,
    current_session,
)
from brokers.quotas import QUOTA_KEYS
from wire.errors import (
    InvalidRequestError,
    ResourceNotFoundError,
    StrataError,
    UnsupportedSaslMechanismError,
)
from wire.protocol import (
    AclEntry,
    AclFilterEntry,
    AclResult,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    ApiKey,
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteAclsResult,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    QuotaEntry,
    QuotaValue,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    ScramCredentialDeletion,
    ScramCredentialInfo,
    ScramCredentialUpsertion,
    UserScramCredentials,
)
from wire.sasl import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    credential_from_salted,
)

__all__ = ["SecurityApis"]

# The SASL login lines keep the logger they have always had.
log = logging.getLogger("strata.brokers.handlers")


def _binding(entry: AclEntry) -> AclEntry:
    """A wire ACL entry with its keywords upper-cased, checked (``InvalidRequestError``
    says what is bad)."""
    return check_binding(AclEntry(entry.resource_type.upper(), entry.pattern_type.upper(),
                                  entry.resource_name, entry.principal, entry.host,
                                  entry.operation.upper(), entry.permission.upper()))


def _acl_filter(entry: AclFilterEntry) -> AclFilterEntry:
    """A wire ACL filter with its keywords upper-cased, checked."""
    def upper(value: str | None) -> str | None:
        return None if value is None else value.upper()

    checks = (("resource type", upper(entry.resource_type), RESOURCE_TYPES),
              ("pattern type", upper(entry.pattern_type), (*PATTERN_TYPES, "MATCH")),
              ("operation", upper(entry.operation), OPERATIONS),
              ("permission", upper(entry.permission), PERMISSIONS))
    for what, value, allowed in checks:
        if value is not None and value not in allowed:
            raise InvalidRequestError(f"ACL filter: {what} {value!r} is not one of "
                                      f"{', '.join(allowed)}")
    return AclFilterEntry(upper(entry.resource_type), upper(entry.pattern_type),
                          entry.resource_name, entry.principal, entry.host,
                          upper(entry.operation), upper(entry.permission))


class SecurityApis(ApiFamily):
    """The SASL, SCRAM, ACL and quota APIs."""

    def __init__(self, context: ApiContext) -> None:
        super().__init__(context)
        self.authenticator = context.authenticator

    def apis(self) -> dict[ApiKey, Handler]:
        return {
            ApiKey.SASL_HANDSHAKE: self.sasl_handshake,
            ApiKey.SASL_AUTHENTICATE: self.sasl_authenticate,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
            ApiKey.CREATE_ACLS: self.create_acls,
            ApiKey.DESCRIBE_ACLS: self.describe_acls,
            ApiKey.DELETE_ACLS: self.delete_acls,
            ApiKey.DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
            ApiKey.ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
        }

    async def sasl_handshake(self, request: SaslHandshakeRequest) -> SaslHandshakeResponse:
        session = current_session()
        try:
            self.authenticator.handshake(session, request.mechanism)
        except StrataError as err:
            session.close_after_answer = True
            return SaslHandshakeResponse(err.code, self.authenticator.offered(session),
                                         err.message)
        return SaslHandshakeResponse(0, self.authenticator.offered(session))

    async def sasl_authenticate(self, request: SaslAuthenticateRequest
                                ) -> SaslAuthenticateResponse:
        session = current_session()
        try:
            if session.mechanism == "PLAIN":  # a PBKDF2 hash: off the event loop
                answer = await asyncio.to_thread(self.authenticator.authenticate, session,
                                                 bytes(request.auth_bytes))
            else:
                answer = self.authenticator.authenticate(session, bytes(request.auth_bytes))
        except StrataError as err:
            session.close_after_answer = True
            log.info("SASL login from %s on %s refused: %s", session.peer,
                     session.listener.name, err.message)
            return SaslAuthenticateResponse(err.code, err.message)
        lifetime = int(max(session.expires_at - time.monotonic(), 0) * 1000) \
            if session.expires_at else 0
        return SaslAuthenticateResponse(0, None, answer, lifetime)

    async def describe_user_scram_credentials(
            self, request: DescribeUserScramCredentialsRequest
    ) -> DescribeUserScramCredentialsResponse:
        try:
            self._require("DESCRIBE", "CLUSTER")
            stored = await asyncio.to_thread(self.zookeeper.scram_credentials)
        except StrataError as err:
            return DescribeUserScramCredentialsResponse(
                [UserScramCredentials(u, *error_fields(err)) for u in request.users or []])
        names = sorted(stored) if request.users is None else request.users
        out = []
        for name in names:
            credentials = stored.get(name)
            if not credentials:
                missing = ResourceNotFoundError(
                    f"user {name!r} has no SCRAM credential; create one with `strata user "
                    "create`")
                out.append(UserScramCredentials(name, *error_fields(missing)))
                continue
            out.append(UserScramCredentials(name, 0, None, [
                ScramCredentialInfo(m, c.iterations) for m, c in sorted(credentials.items())]))
        return DescribeUserScramCredentialsResponse(out)

    async def alter_user_scram_credentials(
            self, request: AlterUserScramCredentialsRequest
    ) -> AlterUserScramCredentialsResponse:
        """Validate everything first; then write each user's changes. A user named twice
        for one mechanism is refused (as in Kafka). Needs ALTER on the cluster."""
        refused = self._refusal("ALTER", "CLUSTER", CLUSTER_NAME)
        if refused is not None:
            users = dict.fromkeys([*(d.user for d in request.deletions),
                                   *(u.user for u in request.upsertions)])
            return AlterUserScramCredentialsResponse(
                [AlterUserScramCredentialsResult(u, *error_fields(refused)) for u in users])
        errors: dict[str, StrataError] = {}
        seen: set[tuple[str, str]] = set()
        order: list[str] = []
        items: list[ScramCredentialDeletion | ScramCredentialUpsertion] = [
            *request.deletions, *request.upsertions]
        for item in items:
            if item.user not in order:
                order.append(item.user)
            try:
                if not item.user or len(item.user) > 255 or any(c in item.user for c in "/\0"):
                    raise InvalidRequestError(
                        f"user name {item.user!r} is not valid: 1-255 characters, no '/'")
                if item.mechanism not in SCRAM_MECHANISMS:
                    raise UnsupportedSaslMechanismError(
                        f"{item.mechanism!r} is not a SCRAM mechanism; use "
                        f"{' or '.join(SCRAM_MECHANISMS)}")
                if (item.user, item.mechanism) in seen:
                    raise InvalidRequestError(
                        f"user {item.user!r} and {item.mechanism} are named twice in one "
                        "request")
                seen.add((item.user, item.mechanism))
                if isinstance(item, ScramCredentialUpsertion) and not (
                        MIN_ITERATIONS <= item.iterations <= MAX_ITERATIONS
                        and item.salt and item.salted_password):
                    raise InvalidRequestError(
                        f"{item.mechanism} credential of {item.user!r}: iterations must be "
                        f"{MIN_ITERATIONS}..{MAX_ITERATIONS}, with a salt and a salted "
                        "password")
            except StrataError as err:
                errors.setdefault(item.user, err)

        def write(user: str) -> None:
            for deletion in request.deletions:
                if deletion.user == user and not self.zookeeper.delete_scram_credential(
                        user, deletion.mechanism):
                    raise ResourceNotFoundError(
                        f"user {user!r} has no {deletion.mechanism} credential to delete")
            for upsert in request.upsertions:
                if upsert.user == user:
                    self.zookeeper.put_scram_credential(user, credential_from_salted(
                        upsert.mechanism, bytes(upsert.salt), upsert.iterations,
                        bytes(upsert.salted_password)))

        results = []
        for user in order:
            if user in errors:
                results.append(AlterUserScramCredentialsResult(user, *error_fields(errors[user])))
                continue
            try:
                await asyncio.to_thread(write, user)
                results.append(AlterUserScramCredentialsResult(user, 0))
            except StrataError as err:
                results.append(AlterUserScramCredentialsResult(user, *error_fields(err)))
        return AlterUserScramCredentialsResponse(results)

    async def create_acls(self, request: CreateAclsRequest) -> CreateAclsResponse:
        refused = self._refusal("ALTER", "CLUSTER", CLUSTER_NAME)
        if refused is not None:
            return CreateAclsResponse([AclResult(*error_fields(refused))
                                       for _ in request.creations])
        results: list[AclResult] = []
        good: list[AclEntry] = []
        for entry in request.creations:
            try:
                good.append(_binding(entry))
                results.append(AclResult(0))
            except StrataError as err:
                results.append(AclResult(*error_fields(err)))
        if good:
            try:
                await asyncio.to_thread(self.zookeeper.add_acls, good)
            except StrataError as err:
                results = [r if r.error_code else AclResult(*error_fields(err)) for r in results]
        return CreateAclsResponse(results)

    async def describe_acls(self, request: DescribeAclsRequest) -> DescribeAclsResponse:
        try:
            self._require("DESCRIBE", "CLUSTER")
            wanted = _acl_filter(request.filter)
            bindings = await asyncio.to_thread(self.zookeeper.acl_bindings)
        except StrataError as err:
            return DescribeAclsResponse(*error_fields(err))
        return DescribeAclsResponse(0, None, [b for b in bindings
                                              if filter_matches(wanted, b)])

    async def delete_acls(self, request: DeleteAclsRequest) -> DeleteAclsResponse:
        refused = self._refusal("ALTER", "CLUSTER", CLUSTER_NAME)
        if refused is not None:
            return DeleteAclsResponse([DeleteAclsResult(*error_fields(refused))
                                       for _ in request.filters])
        results = []
        for entry in request.filters:
            try:
                wanted = _acl_filter(entry)
                removed = await asyncio.to_thread(self.zookeeper.remove_acls,
                                                  functools.partial(filter_matches, wanted))
                results.append(DeleteAclsResult(0, None, removed))
            except StrataError as err:
                results.append(DeleteAclsResult(*error_fields(err)))
        return DeleteAclsResponse(results)

    async def describe_client_quotas(self, request: DescribeClientQuotasRequest
                                     ) -> DescribeClientQuotasResponse:
        try:
            self._require("DESCRIBE", "CLUSTER")
            stored = await asyncio.to_thread(self.zookeeper.client_quotas)
        except StrataError as err:
            return DescribeClientQuotasResponse(*error_fields(err))
        return DescribeClientQuotasResponse(0, None, [
            QuotaEntry(user, client_id, [QuotaValue(k, int(v)) for k, v in sorted(q.items())])
            for (user, client_id), q in sorted(stored.items(), key=str)])

    async def alter_client_quotas(self, request: AlterClientQuotasRequest
                                  ) -> AlterClientQuotasResponse:
        try:
            self._require("ALTER", "CLUSTER")
            changes: dict[tuple[str | None, str | None], dict[str, float | None]] = {}
            for change in request.alterations:
                if (change.user is None) == (change.client_id is None) or \
                        not (change.user or change.client_id):
                    raise InvalidRequestError(
                        "a quota names exactly one of a user or a client id (or <default>)")
                if change.key not in QUOTA_KEYS:
                    raise InvalidRequestError(
                        f"quota key {change.key!r} is not one of {', '.join(QUOTA_KEYS)}")
                if not change.remove and change.value <= 0:
                    raise InvalidRequestError(
                        f"{change.key}={change.value} is not valid: use a number above 0 "
                        "(remove the quota for no limit)")
                changes.setdefault((change.user, change.client_id), {})[change.key] = \
                    None if change.remove else float(change.value)
            for (user, client_id), values in changes.items():
                await asyncio.to_thread(self.zookeeper.alter_client_quota, user, client_id,
                                        values)
        except StrataError as err:
            return AlterClientQuotasResponse(*error_fields(err))
        return AlterClientQuotasResponse(0)
