"""Broker security: listeners, TLS, and SASL authentication of one connection.

A broker serves one or more *listeners* (``listeners=NAME://host:port,...``), each with a
security protocol (Kafka's: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; a listener's name
is its protocol unless ``listener.security.protocol.map`` maps a custom name). Every
connection gets a :class:`Session`: the listener it came in on, the peer address and,
once known, the principal (``User:<name>``: the SASL user, or on SSL with a client
certificate the certificate's subject; ``User:ANONYMOUS`` otherwise).

On a SASL listener a session may send only ApiVersions, SaslHandshake and
SaslAuthenticate until :class:`SaslAuthenticator` has accepted its credentials; anything
else is ILLEGAL_SASL_STATE and the connection is closed after the answer, as is a failed
login. A session that has not authenticated within ``sasl.authentication.timeout.ms``
is closed, and unauthenticated frames are capped at ``_UNAUTHENTICATED_FRAME_BYTES``, so
a client without credentials can neither hold a connection nor make the broker buffer a
large frame.

Credentials (``CredentialCache``) come from ZooKeeper, salted (wire/sasl.py): the broker
never sees a stored password. When a user's credential changes or goes, the sessions
that logged in with the old one are closed (within a ZooKeeper watch's delay), and with
``connections.max.reauth.ms`` every SASL session ends after that long at most.

Thread-safety: everything here runs on the broker's event loop, except that PLAIN's
password hashing runs on a worker thread (it only reads an immutable credential).
"""

from __future__ import annotations

import logging
import secrets
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from wire.errors import (
    IllegalSaslStateError,
    InvalidConfigError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from wire.sasl import MECHANISMS, ScramCredential, ScramServer, check_plain, parse_plain
from wire.security import SECURITY_PROTOCOLS, HasSecurityProtocol

__all__ = ["ANONYMOUS", "CredentialCache", "Listener", "SaslAuthenticator", "Session",
           "check_mechanisms", "parse_listeners", "server_ssl_context"]

log = logging.getLogger("strata.brokers.security")

ANONYMOUS: Final = "User:ANONYMOUS"
#: Largest frame a connection may send before it has authenticated (Kafka's
#: ``sasl.server.max.receive.size`` default is 512 KiB; a SASL message is far smaller).
UNAUTHENTICATED_FRAME_BYTES: Final = 512 * 1024
_DEFAULT_MAP: Final = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)


@dataclass(frozen=True, slots=True)
class Listener(HasSecurityProtocol):
    """One listener: where it binds, what it tells clients, how it is secured."""

    name: str
    protocol: str
    host: str
    port: int
    advertised_host: str
    advertised_port: int  # 0: the port actually bound
    kafka: bool = False  # speaks Kafka's protocol (kafka.listeners), not Strata's


def _endpoints(text: str, key: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, address = item.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not name or not port.isdigit() or int(port) > 65535:
            raise InvalidConfigError(
                f"{key}: {item!r} is not NAME://host:port (e.g. SASL_SSL://0.0.0.0:9093)")
        out.append((name.upper(), host.strip("[]"), int(port)))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise InvalidConfigError(f"{key}: a listener name is given twice in {text!r}")
    return out


def parse_listeners(listeners: str, advertised: str, protocol_map: str, host: str, port: int,
                    advertised_host: str, kafka: str = "") -> list[Listener]:
    """The broker's listeners; ``listeners`` empty: one PLAINTEXT listener on
    ``host:port`` (the settings before listeners existed). ``kafka``: the listeners that
    speak Kafka's protocol, NAME://host:port,... (a name the map does not give a protocol
    is read as KAFKA[_PROTOCOL]: KAFKA is PLAINTEXT, KAFKA_SASL_SSL is SASL_SSL)."""
    mapping: dict[str, str] = {}
    for item in (i.strip() for i in (protocol_map or _DEFAULT_MAP).split(",") if i.strip()):
        name, sep, mapped = item.partition(":")
        if not sep or mapped.upper() not in SECURITY_PROTOCOLS:
            raise InvalidConfigError(
                f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL with a "
                f"protocol among {', '.join(SECURITY_PROTOCOLS)}")
        mapping[name.upper()] = mapped.upper()
    bound = _endpoints(listeners, "listeners") if listeners else [("PLAINTEXT", host, port)]
    kafka_bound = _endpoints(kafka, "kafka.listeners") if kafka else []
    clash = sorted({n for n, _, _ in bound} & {n for n, _, _ in kafka_bound})
    if clash:
        raise InvalidConfigError(
            f"listener name(s) {', '.join(clash)} are in both listeners and kafka.listeners: "
            "give the Kafka listeners their own names (e.g. KAFKA, KAFKA_SASL_SSL)")
    kafka_names = {n for n, _, _ in kafka_bound}
    for name in kafka_names - set(mapping):
        implied = "PLAINTEXT" if name == "KAFKA" else name.removeprefix("KAFKA_")
        if implied in SECURITY_PROTOCOLS:
            mapping[name] = implied
    bound = bound + kafka_bound
    told = {n: (h, p) for n, h, p in _endpoints(advertised, "advertised.listeners")}
    unknown = sorted(set(told) - {n for n, _, _ in bound})
    if unknown:
        raise InvalidConfigError(
            f"advertised.listeners names {', '.join(unknown)}, which listeners does not")
    out = []
    for name, bind_host, bind_port in bound:
        protocol = mapping.get(name)
        if protocol is None:
            raise InvalidConfigError(
                f"listener {name} has no security protocol: name it after one "
                f"({', '.join(SECURITY_PROTOCOLS)}) or map it in "
                "listener.security.protocol.map")
        shown_host, shown_port = told.get(name, (advertised_host or bind_host, 0))
        if shown_host in ("", "0.0.0.0", "::"):
            shown_host = "127.0.0.1" if bind_host in ("", "0.0.0.0", "::") else bind_host
        out.append(Listener(name, protocol, bind_host, bind_port, shown_host, shown_port,
                            kafka=name in kafka_names))
    return out


def server_ssl_context(certfile: str, keyfile: str, cafile: str, client_auth: str
                       ) -> ssl.SSLContext:
    """TLS 1.2 or later with the broker's certificate; ``client_auth`` none, requested
    or required (mutual TLS against ``cafile``)."""
    if not certfile or not keyfile:
        raise InvalidConfigError(
            "an SSL or SASL_SSL listener needs ssl.certfile and ssl.keyfile (PEM files)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
        if cafile:
            context.load_verify_locations(cafile)
    except (OSError, ssl.SSLError) as err:
        raise InvalidConfigError(
            f"cannot load the broker's TLS files (ssl.certfile={certfile}, ssl.keyfile="
            f"{keyfile}, ssl.cafile={cafile or '-'}): {err}; check the paths and that they "
            "are PEM files") from None
    if client_auth != "none" and not cafile:
        raise InvalidConfigError(
            f"ssl.client.auth={client_auth} needs ssl.cafile: the CA that signs client "
            "certificates")
    context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[client_auth]
    return context


_DN_NAMES: Final = {"commonName": "CN", "organizationName": "O",
                    "organizationalUnitName": "OU", "countryName": "C", "localityName": "L",
                    "stateOrProvinceName": "ST"}


def _certificate_principal(ssl_object: ssl.SSLObject | None) -> str | None:
    """``User:<subject DN>`` of a verified client certificate, most specific RDN first
    (RFC 4514 order, as Kafka's default ``ssl.principal.mapping.rules``)."""
    certificate = ssl_object.getpeercert() if ssl_object is not None else None
    if not certificate:
        return None
    dn = ",".join(f"{_DN_NAMES.get(key, key)}={value}"
                  for rdn in reversed(certificate.get("subject", ())) for key, value in rdn)
    return f"User:{dn}" if dn else None


@dataclass(slots=True)
class Session:
    """One connection's security state (see the module docstring)."""

    listener: Listener
    peer: str
    principal: str = ANONYMOUS
    authenticated: bool = False
    #: Set when the connection must be closed once the current answer is written.
    close_after_answer: bool = False
    mechanism: str | None = None
    #: (user, mechanism, stored key) the session logged in with: a change ends it.
    login: tuple[str, str, bytes] | None = None
    expires_at: float = 0.0  # monotonic; 0: never
    #: The client id of the latest request (quotas may be set per client id).
    client_id: str = ""
    #: Quota throttling (brokers/quotas.py): read no further request before this.
    mute_until: float = 0.0
    opened_at: float = field(default_factory=time.monotonic)
    scram: ScramServer | None = None

    @property
    def host(self) -> str:
        """The client's address without the port (what ACL hosts are matched against)."""
        return self.peer.rsplit(":", 1)[0]

    @classmethod
    def open(cls, listener: Listener, peer: str, ssl_object: ssl.SSLObject | None
             ) -> Session:
        session = cls(listener, peer)
        if not listener.uses_sasl:
            session.authenticated = True
            session.principal = _certificate_principal(ssl_object) or ANONYMOUS
        return session


class CredentialCache:
    """Every user's SCRAM credentials, as last read from ZooKeeper (by ``broker.py``)."""

    def __init__(self) -> None:
        self.users: dict[str, dict[str, ScramCredential]] = {}
        # Unknown users get answers derived from this, so they look like wrong passwords.
        self.secret = secrets.token_bytes(32)

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    def replace(self, users: Mapping[str, dict[str, ScramCredential]]) -> set[str]:
        """Take a fresh read; returns the users whose credentials changed or went."""
        changed = {u for u in self.users if self.users[u] != users.get(u)}
        self.users = dict(users)
        return changed


class SaslAuthenticator:
    """Authenticates a connection's SASL login (PLAIN or SCRAM) against the credentials
    in ZooKeeper: SaslHandshake and SaslAuthenticate for the sessions on one broker."""

    def __init__(self, credentials: CredentialCache, mechanisms: list[str], *,
                 plain_over_plaintext: bool, reauth_ms: int) -> None:
        self.credentials = credentials
        self.mechanisms = mechanisms
        self.plain_over_plaintext = plain_over_plaintext
        self.reauth_ms = reauth_ms

    def offered(self, session: Session) -> list[str]:
        if session.listener.protocol == "SASL_PLAINTEXT" and not self.plain_over_plaintext:
            return [m for m in self.mechanisms if m != "PLAIN"]
        return list(self.mechanisms)

    def handshake(self, session: Session, mechanism: str) -> None:
        if not session.listener.uses_sasl:
            raise IllegalSaslStateError(
                f"listener {session.listener.name} is {session.listener.protocol}: there is "
                "no SASL on it; connect to a SASL_PLAINTEXT or SASL_SSL listener")
        if session.authenticated or session.mechanism is not None:
            raise IllegalSaslStateError(
                "SaslHandshake was already sent on this connection; open a new one")
        offered = self.offered(session)
        if mechanism not in offered:
            why = (" (PLAIN sends the password itself: it is offered only over TLS unless "
                   "sasl.plain.allow.plaintext=true)") if mechanism == "PLAIN" else ""
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism {mechanism!r} is not offered on listener "
                f"{session.listener.name}{why}; use one of {', '.join(offered) or 'none'}")
        session.mechanism = mechanism
        if mechanism != "PLAIN":
            session.scram = ScramServer(
                mechanism, lambda user: self.credentials.lookup(user, mechanism),
                secret=self.credentials.secret)

    def authenticate(self, session: Session, message: bytes) -> bytes:
        """One SaslAuthenticate; the answer bytes. Raises (the connection then closes)."""
        if session.mechanism is None or session.authenticated:
            raise IllegalSaslStateError(
                "SaslAuthenticate must follow SaslHandshake and come before any other "
                "request; open a new connection")
        if session.mechanism == "PLAIN":
            user, password = parse_plain(message)
            credential = self.credentials.lookup(user, "SCRAM-SHA-256") or \
                self.credentials.lookup(user, "SCRAM-SHA-512")
            if not check_plain(credential, password):
                raise SaslAuthenticationFailedError(
                    "authentication failed with PLAIN: wrong user name or password "
                    "(create the user with `strata user create`)")
            assert credential is not None
            self._accept(session, user, credential)
            return b""
        assert session.scram is not None
        answer = session.scram.step(message)
        if session.scram.principal is not None:
            user = session.scram.principal
            credential = self.credentials.lookup(user, session.mechanism)
            assert credential is not None
            self._accept(session, user, credential)
        return answer

    def _accept(self, session: Session, user: str, credential: ScramCredential) -> None:
        session.authenticated = True
        session.principal = f"User:{user}"
        session.login = (user, credential.mechanism, credential.stored_key)
        session.scram = None
        if self.reauth_ms > 0:
            session.expires_at = time.monotonic() + self.reauth_ms / 1000
        log.debug("%s authenticated as %s with %s on %s", session.peer, session.principal,
                  session.mechanism, session.listener.name)

    def still_valid(self, session: Session) -> bool:
        """Whether the credential the session logged in with still stands."""
        if session.login is None:
            return True
        user, mechanism, stored_key = session.login
        credential = self.credentials.lookup(user, mechanism)
        return credential is not None and credential.stored_key == stored_key


def check_mechanisms(text: str) -> list[str]:
    mechanisms = [m.strip().upper() for m in text.split(",") if m.strip()]
    bad = [m for m in mechanisms if m not in MECHANISMS]
    if bad or not mechanisms:
        raise InvalidConfigError(
            f"sasl.enabled.mechanisms={text!r}: use one or more of {', '.join(MECHANISMS)}")
    return mechanisms
