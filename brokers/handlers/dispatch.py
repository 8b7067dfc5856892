"""The dispatcher: decode one request, check it may be sent, and hand it to the handler of
its API.

:class:`RequestHandlers` builds the shared :class:`~brokers.handlers.context.ApiContext`
and one object per API family, and collects their handlers into one table (every API
answered by exactly one family). Request-level failures (an unknown API, an unsupported
version, a malformed body, a request before the SASL login finished) raise, and the
network layer answers with the error in the response header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from brokers.handlers.admin import AdminApis
from brokers.handlers.context import (
    BEFORE_LOGIN,
    INTERNAL_SESSION,
    ApiContext,
    ApiFamily,
    Handler,
    bind_session,
)
from brokers.handlers.fetch import FetchApis
from brokers.handlers.groups import GroupApis
from brokers.handlers.produce import ProduceApis
from brokers.handlers.schemas import SchemaRegistryApis
from brokers.handlers.security import SecurityApis
from brokers.handlers.tier import TierApis
from brokers.handlers.transactions import TransactionApis
from wire.errors import IllegalSaslStateError, UnsupportedVersionError
from wire.protocol import (
    API_VERSIONS,
    REQUEST_TYPES,
    ApiKey,
    Message,
    Reader,
    RequestHeader,
    decode,
)

if TYPE_CHECKING:
    from brokers.acl import AclCache
    from brokers.config import BrokerConfig
    from brokers.controller import Controller
    from brokers.coordination import ZooKeeperClient
    from brokers.group_coordinator import GroupCoordinator
    from brokers.quotas import QuotaManager
    from brokers.replica_manager import ReplicaManager
    from brokers.schema_registry import SchemaRegistry
    from brokers.security import SaslAuthenticator, Session
    from brokers.services import HandlerHost, MetadataCache, PartitionRegistry
    from brokers.transaction_coordinator import TransactionCoordinator

__all__ = ["RequestHandlers"]


class RequestHandlers:
    """What each API does: decode, check, hand to its family's handler, answer.

    Built from the parts it uses (``brokers/services.py``), never the whole broker, so
    the handlers run without a broker process in ``tests/test_handlers_unit.py``. The
    families are attributes (``admin``, ``produce``, ``fetch``, ``groups``,
    ``security``, ``tier``, ``schemas``) for in-process callers.
    """

    def __init__(self, config: BrokerConfig, cluster: MetadataCache,
                 registry: PartitionRegistry, zookeeper: ZooKeeperClient, *,
                 controller: Controller, replicas: ReplicaManager, groups: GroupCoordinator,
                 host: HandlerHost, authenticator: SaslAuthenticator | None = None,
                 acls: AclCache | None = None, quotas: QuotaManager | None = None,
                 schemas: SchemaRegistry | None = None,
                 transactions: TransactionCoordinator | None = None) -> None:
        """``acls`` None: no authorization (every principal may do everything).
        ``schemas`` None: no schema registry (typed topics refuse every write).
        ``transactions`` None: no transaction coordinator (transactional APIs refused)."""
        self.context = context = ApiContext(
            config, cluster, registry, zookeeper, controller=controller, replicas=replicas,
            groups=groups, host=host, authenticator=authenticator, acls=acls, quotas=quotas,
            schemas=schemas, transactions=transactions)
        self.admin = AdminApis(context)
        self.produce = ProduceApis(context)
        self.fetch = FetchApis(context)
        self.groups = GroupApis(context)
        self.security = SecurityApis(context)
        self.tier = TierApis(context)
        self.schemas = SchemaRegistryApis(context)
        self.transactions = TransactionApis(context)
        families: tuple[ApiFamily, ...] = (self.admin, self.produce, self.fetch, self.groups,
                                           self.security, self.tier, self.schemas,
                                           self.transactions)
        self._table: dict[ApiKey, Handler] = {}
        for family in families:
            for api, handler in family.apis().items():
                assert api not in self._table, f"{api.name} is answered twice"
                self._table[api] = handler
        missing = set(ApiKey) - set(self._table)
        assert not missing, f"no family answers {sorted(a.name for a in missing)}"
        self._throttle = context.throttle

    async def dispatch(self, header: RequestHeader, body: Reader,
                       session: Session | None = None) -> Message | None:
        """Decode and run one request; ``session`` (None: an in-process caller with
        every right) is available to the handlers as ``current_session()``."""
        session = session or INTERNAL_SESSION
        bind_session(session)
        session.client_id = header.client_id or ""
        try:
            api = ApiKey(header.api_key)
        except ValueError:
            if not session.authenticated:
                session.close_after_answer = True
            raise UnsupportedVersionError(
                f"unknown api key {header.api_key}; this broker speaks "
                f"{sorted(int(k) for k in ApiKey)}") from None
        _require_login(api, session)
        low, high = API_VERSIONS[api]
        if not low <= header.api_version <= high:
            raise UnsupportedVersionError(
                f"{api.name} version {header.api_version} is not supported (supported: "
                f"{low}..{high}); upgrade the broker or downgrade the client")
        return await self._run(api, decode(REQUEST_TYPES[api], body, header.api_version))

    async def handle(self, api: ApiKey, request: Message, session: Session,
                     client_id: str | None = None) -> Message | None:
        """Run one already decoded request as ``session`` (the Kafka listener's way in:
        it decodes Kafka's encoding itself, then every check and handler is the one
        Strata's own protocol uses). Raises what ``dispatch`` raises."""
        bind_session(session)
        session.client_id = client_id or ""
        _require_login(api, session)
        return await self._run(api, request)

    async def _run(self, api: ApiKey, request: Message) -> Message | None:
        # Replication is never throttled: a quota must not slow the brokers' own copies.
        if api not in BEFORE_LOGIN and getattr(request, "replica_id", -1) < 0:
            self._throttle("request_rate", 1)
        return await self._table[api](request)


def _require_login(api: ApiKey, session: Session) -> None:
    """A request other than the login's own on a session that has not logged in fails
    (and the connection closes after the answer)."""
    if not session.authenticated and api not in BEFORE_LOGIN:
        session.close_after_answer = True
        raise IllegalSaslStateError(
            f"{api.name} before the SASL login finished: listener "
            f"{session.listener.name} is {session.listener.protocol}; send SaslHandshake "
            "and SaslAuthenticate first (set the client's security protocol, SASL "
            "mechanism and credentials)")
