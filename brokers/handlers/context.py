"""What every API family stands on: the broker's services, the one ACL check and the one
quota path, and the session of the request being handled.

:class:`ApiContext` holds the services the handlers are thin over (the replica manager
for the log, the group coordinator, the schema registry, the controller, the metadata
cache, the partition registry, the ZooKeeper client, the broker-process host) and the
two checks every request goes through: ``allowed``/``require`` (the ACLs, with one audit
line per refusal) and ``throttle`` (the client quotas). A listener for another wire
protocol (Kafka's) would be built over this same context, so it would share one log,
one group coordinator, one ACL check and one quota path with this one.

The session of the request being handled is a context variable set by the dispatcher
(each request runs as its own task): :func:`current_session`. Requests made in-process
(tests, tools) run as :data:`INTERNAL_SESSION`, which is authenticated and may do
everything.

Thread-safety: the broker's event loop only.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from brokers.acl import CLUSTER_NAME, AclCache, RefusalLog
from brokers.quotas import QuotaManager
from brokers.schema_registry import SchemaCheck, SchemaRegistry
from brokers.security import CredentialCache, Listener, SaslAuthenticator, Session
from wire.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    StrataError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from wire.protocol import ApiKey, Message
from wire.sasl import MECHANISMS

if TYPE_CHECKING:
    from brokers.config import BrokerConfig
    from brokers.controller import Controller
    from brokers.coordination import ZooKeeperClient
    from brokers.group_coordinator import GroupCoordinator
    from brokers.replica_manager import ReplicaManager
    from brokers.services import HandlerHost, MetadataCache, PartitionRegistry
    from brokers.transaction_coordinator import TransactionCoordinator

__all__ = ["BEFORE_LOGIN", "INTERNAL_PREFIX", "INTERNAL_SESSION", "ApiContext", "ApiFamily",
           "Handler", "answered", "bind_session", "current_session"]

#: One API's handler: the decoded request in, the answer out (None: no answer, acks=0).
Handler = Callable[[Any], Awaitable[Message | None]]

#: What a connection on a SASL listener may send before its login finished.
BEFORE_LOGIN = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                          ApiKey.SASL_AUTHENTICATE})
# Topics whose names start with this are the brokers' own (``__consumer_offsets``):
# clients may read them but not create, write, delete or un-compact them.
INTERNAL_PREFIX = "__"

#: The session of the request being handled (each request runs as its own task).
_SESSION: contextvars.ContextVar[Session] = contextvars.ContextVar("strata_session")
#: Requests from inside the broker process (tests, tools): authenticated, every right.
INTERNAL_SESSION = Session(Listener("INTERNAL", "PLAINTEXT", "", 0, "", 0), "in-process",
                           principal="User:ANONYMOUS", authenticated=True)

_T = TypeVar("_T")


def current_session() -> Session:
    """The session of the request being handled (``dispatch`` sets it)."""
    return _SESSION.get(INTERNAL_SESSION)


#: Make a session the current one for the rest of this request's task (the context
#: variable's own ``set``, so binding costs no call of its own).
bind_session: Final = _SESSION.set


async def answered(answer: _T) -> _T:
    """An answer known at once, for a handler that otherwise returns a service's
    awaitable as it is (no coroutine of its own on the hot path)."""
    return answer


class ApiContext:
    """The services the API families are thin over, and the checks they share."""

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
        self.config = config
        self.broker_id = config.broker_id
        self.cluster = cluster
        self.registry = registry
        self.zookeeper = zookeeper
        self.controller = controller
        self.replicas = replicas
        self.groups = groups
        self.host = host
        self.acls = acls
        self.quotas = quotas or QuotaManager()
        self.schemas = schemas
        self.transactions = transactions
        self.schema_check = SchemaCheck(schemas) if schemas is not None else None
        self._refusals = RefusalLog(logging.getLogger("strata.brokers.audit"))
        self.authenticator = authenticator or SaslAuthenticator(
            CredentialCache(), list(MECHANISMS), plain_over_plaintext=False, reauth_ms=0)

    # ------------------------------------------------------------------ authorization
    def allowed(self, operation: str, resource_type: str, name: str, *,
                audit: bool = True) -> bool:
        """Whether the current session's principal may do ``operation`` on the resource
        (always, without an authorizer or for in-process callers); a refusal is logged
        to the audit log unless ``audit`` is false."""
        session = current_session()
        if self.acls is None or session is INTERNAL_SESSION:
            return True
        if self.acls.authorize(session.principal, session.host, operation, resource_type,
                               name):
            return True
        if audit:
            self._refusals.refused(session.principal, session.peer, operation, resource_type,
                                   name)
        return False

    def require(self, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> None:
        """Raise TOPIC/GROUP/CLUSTER/TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless
        ``allowed``."""
        if self.allowed(operation, resource_type, name):
            return
        principal = current_session().principal
        error = {"TOPIC": TopicAuthorizationFailedError, "GROUP": GroupAuthorizationFailedError,
                 "CLUSTER": ClusterAuthorizationFailedError,
                 "TRANSACTIONAL_ID": TransactionalIdAuthorizationFailedError}[resource_type]
        where = "the cluster" if resource_type == "CLUSTER" else \
            f"{resource_type.lower().replace('_', ' ')} {name!r}"
        flag = "--cluster" if resource_type == "CLUSTER" else \
            f"--{resource_type.lower().replace('_', '-')} {name}"
        # A transactional producer is refused DESCRIBE first (FindCoordinator), but
        # DESCRIBE alone would only get it refused again at InitProducerId.
        note = " (a transactional producer needs WRITE, which implies DESCRIBE)" if \
            resource_type == "TRANSACTIONAL_ID" and operation == "DESCRIBE" else ""
        raise error(f"{principal} may not {operation} {where}; an administrator can allow it "
                    f"with `strata acl add --allow-principal {principal} --operation "
                    f"{operation} {flag}`{note}")

    def refusal(self, operation: str, resource_type: str, name: str) -> StrataError | None:
        """The error ``require`` would raise, or None."""
        try:
            self.require(operation, resource_type, name)
        except StrataError as err:
            return err
        return None

    # ------------------------------------------------------------------ quotas
    def throttle(self, key: str, amount: float) -> int:
        """Count ``amount`` against the session's quota; when over it, mute the
        connection for the throttle and return it (ms; 0: within the quota)."""
        session = current_session()
        if session is INTERNAL_SESSION:
            return 0
        throttle = self.quotas.record(key, session.principal, session.client_id, amount)
        if throttle:
            session.mute_until = max(session.mute_until, time.monotonic() + throttle / 1000)
        return throttle


class ApiFamily:
    """A family of APIs (one module of ``brokers/handlers/``): the handlers of related
    APIs over the shared :class:`ApiContext`. ``apis`` says which API each one answers;
    the dispatcher collects them."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context
        self.config = context.config
        self.broker_id = context.broker_id
        self.cluster = context.cluster
        self.registry = context.registry
        self.zookeeper = context.zookeeper
        self.host = context.host
        # The shared checks, bound once.
        self._allowed = context.allowed
        self._require = context.require
        self._refusal = context.refusal
        self._throttle = context.throttle

    def apis(self) -> Mapping[ApiKey, Handler]:
        """The handler of each API this family answers."""
        raise NotImplementedError
