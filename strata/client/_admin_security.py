"""Admin API family: ACLs, SCRAM users and client quotas.

Part of the admin client (``strata.client.admin`` is the face). Every call goes to any
broker (the first that answers): the brokers keep these in ZooKeeper. Passwords never
leave this process: ``upsert_scram_credential`` sends only a salted hash.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

from strata.client._admin_common import AdminContext
from strata.client._common import error_from_code
from wire.protocol import (
    AclEntry,
    AclFilterEntry,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    ApiKey,
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    QuotaAlteration,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from wire.sasl import MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_MECHANISMS, salted_password

__all__ = [
    "SecurityAdmin",
]


class SecurityAdmin:
    """ACL bindings, SCRAM credentials and client quotas."""

    def __init__(self, context: AdminContext) -> None:
        self.context = context
        self._cluster = context.cluster

    async def create_acls(self, acls: Iterable[AclEntry]) -> None:
        entries = list(acls)
        response = await self._cluster.send_any(ApiKey.CREATE_ACLS, CreateAclsRequest(entries))
        assert isinstance(response, CreateAclsResponse)
        for result in response.results:
            if result.error_code:
                raise error_from_code(result.error_code, result.error_message)

    async def describe_acls(self, acl_filter: AclFilterEntry | None = None) -> list[AclEntry]:
        response = await self._cluster.send_any(
            ApiKey.DESCRIBE_ACLS, DescribeAclsRequest(acl_filter or AclFilterEntry()))
        assert isinstance(response, DescribeAclsResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        return list(response.acls)

    async def delete_acls(self, filters: Iterable[AclFilterEntry]) -> list[AclEntry]:
        response = await self._cluster.send_any(ApiKey.DELETE_ACLS,
                                                DeleteAclsRequest(list(filters)))
        assert isinstance(response, DeleteAclsResponse)
        removed: list[AclEntry] = []
        for result in response.results:
            if result.error_code:
                raise error_from_code(result.error_code, result.error_message)
            removed.extend(result.deleted)
        return removed

    async def upsert_scram_credential(self, user: str, password: str, *,
                                      mechanism: str = "SCRAM-SHA-256",
                                      iterations: int = MIN_ITERATIONS) -> None:
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"mechanism={mechanism!r} is not valid; use "
                             f"{' or '.join(SCRAM_MECHANISMS)}")
        if not password:
            raise ValueError("the password is empty")
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"iterations={iterations} is not valid; use "
                             f"{MIN_ITERATIONS}..{MAX_ITERATIONS}")
        salt = secrets.token_bytes(32)
        upsert = ScramCredentialUpsertion(user, mechanism, iterations, salt,
                                          salted_password(mechanism, password, salt,
                                                          iterations))
        await self._alter_scram(AlterUserScramCredentialsRequest([], [upsert]))

    async def delete_scram_credential(self, user: str, mechanism: str = "SCRAM-SHA-256"
                                      ) -> None:
        await self._alter_scram(AlterUserScramCredentialsRequest(
            [ScramCredentialDeletion(user, mechanism)], []))

    async def _alter_scram(self, request: AlterUserScramCredentialsRequest) -> None:
        response = await self._cluster.send_any(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, request)
        assert isinstance(response, AlterUserScramCredentialsResponse)
        for result in response.results:
            if result.error_code:
                raise error_from_code(result.error_code, result.error_message)

    async def describe_scram_credentials(self, users: Iterable[str] | None = None
                                         ) -> dict[str, dict[str, int]]:
        response = await self._cluster.send_any(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            DescribeUserScramCredentialsRequest(None if users is None else list(users)))
        assert isinstance(response, DescribeUserScramCredentialsResponse)
        out: dict[str, dict[str, int]] = {}
        for user in response.users:
            if user.error_code:
                raise error_from_code(user.error_code, user.error_message)
            out[user.user] = {c.mechanism: c.iterations for c in user.credentials}
        return out

    async def describe_client_quotas(self) -> dict[tuple[str | None, str | None],
                                                   dict[str, int]]:
        response = await self._cluster.send_any(ApiKey.DESCRIBE_CLIENT_QUOTAS,
                                                DescribeClientQuotasRequest())
        assert isinstance(response, DescribeClientQuotasResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
        return {(e.user, e.client_id): {v.key: v.value for v in e.values}
                for e in response.entries}

    async def alter_client_quotas(self, *, user: str | None = None,
                                  client_id: str | None = None,
                                  set: Mapping[str, int] | None = None,
                                  remove: Iterable[str] = ()) -> None:
        alterations = [QuotaAlteration(user, client_id, k, int(v))
                       for k, v in (set or {}).items()]
        alterations += [QuotaAlteration(user, client_id, k, 0, True) for k in remove]
        response = await self._cluster.send_any(ApiKey.ALTER_CLIENT_QUOTAS,
                                                AlterClientQuotasRequest(alterations))
        assert isinstance(response, AlterClientQuotasResponse)
        if response.error_code:
            raise error_from_code(response.error_code, response.error_message)
