"""How a client (or a broker talking to another broker) secures its connections.

:class:`ClientSecurity` names the listener's security protocol (Kafka's names:
PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), the SASL mechanism and credentials, and the
TLS files. ``BrokerConnection`` applies it: TLS around the socket, then SaslHandshake and
SaslAuthenticate before any other request.

Invariants: a ``ClientSecurity`` that exists is valid (``__post_init__`` raises
``ValueError`` naming the option); the password never appears in ``repr``. TLS contexts
are built once per set of files (``ssl_context``) and shared: building one reads the CA
bundle from disk.

Thread-safety: frozen; ``ssl.SSLContext`` objects may be shared between threads.
"""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from wire.sasl import MECHANISMS

__all__ = ["PLAINTEXT", "SECURITY_OPTIONS", "SECURITY_PROPERTIES", "SECURITY_PROTOCOLS",
           "ClientSecurity", "HasSecurityProtocol"]

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

#: Keyword options of the clients that build a ``ClientSecurity`` (kafka-python's and
#: aiokafka's names), mapped to its fields.
SECURITY_OPTIONS: Final = {
    "security_protocol": "protocol",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_plain_username": "username",
    "sasl_plain_password": "password",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl_check_hostname": "ssl_check_hostname",
}


#: Client property names (Kafka's and librdkafka's, as in a ``--command-config`` file or
#: a Spark option, with or without a ``kafka.`` prefix) and the field each sets.
#: ``sasl.jaas.config`` (Kafka's ``... username="u" password="p";``) sets both credentials.
SECURITY_PROPERTIES: Final = {
    "security.protocol": "protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "username",
    "sasl.password": "password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
}
_JAAS_FIELD: Final = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class HasSecurityProtocol:
    """What a security protocol name (``protocol``, one of ``SECURITY_PROTOCOLS``) means
    for a connection. The one definition both ends use: ``ClientSecurity`` here and the
    brokers' ``Listener`` (``brokers/security.py``) inherit it."""

    __slots__ = ()
    protocol: str

    @property
    def uses_tls(self) -> bool:
        """SSL and SASL_SSL wrap the connection in TLS."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """SASL_PLAINTEXT and SASL_SSL log in before any other request."""
        return self.protocol.startswith("SASL_")


@dataclass(frozen=True, slots=True)
class ClientSecurity(HasSecurityProtocol):
    """``protocol``: PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL.
    ``sasl_mechanism``: PLAIN, SCRAM-SHA-256 (default) or SCRAM-SHA-512, with
    ``username`` / ``password``. ``ssl_cafile``: the CA bundle that signed the brokers'
    certificates (default: the system's); ``ssl_certfile`` / ``ssl_keyfile``: this
    client's certificate for mutual TLS; ``ssl_check_hostname``: the broker's
    certificate must name the host connected to (default true)."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-256"
    username: str = ""
    password: str = field(default="", repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"security_protocol={self.protocol!r} is not valid; use one of "
                             f"{', '.join(SECURITY_PROTOCOLS)}")
        if self.uses_sasl:
            if self.sasl_mechanism not in MECHANISMS:
                raise ValueError(f"sasl_mechanism={self.sasl_mechanism!r} is not valid; use "
                                 f"one of {', '.join(MECHANISMS)}")
            if not self.username or not self.password:
                raise ValueError(f"security_protocol={self.protocol} needs "
                                 "sasl_plain_username and sasl_plain_password")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("give ssl_certfile and ssl_keyfile together (mutual TLS)")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for this configuration (None on plaintext protocols)."""
        if not self.uses_tls:
            return None
        return _client_context(self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile,
                               self.ssl_check_hostname)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ClientSecurity:
        """Build from the clients' keyword options (``SECURITY_OPTIONS``); other keys
        are ignored."""
        values = {SECURITY_OPTIONS[k]: v for k, v in options.items() if k in SECURITY_OPTIONS}
        return cls(**values) if values else PLAINTEXT


    def to_properties(self) -> dict[str, str]:
        """The client properties (``SECURITY_PROPERTIES`` names) that ``from_properties``
        turns back into this configuration: what a Spark read or write is given."""
        if self.protocol == "PLAINTEXT":
            return {}
        out = {"security.protocol": self.protocol,
               "ssl.endpoint.identification.algorithm":
                   "https" if self.ssl_check_hostname else ""}
        if self.uses_sasl:
            out.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.username,
                        "sasl.password": self.password})
        for key, value in (("ssl.ca.location", self.ssl_cafile),
                           ("ssl.certificate.location", self.ssl_certfile),
                           ("ssl.key.location", self.ssl_keyfile)):
            if value:
                out[key] = value
        return out

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> ClientSecurity:
        """Build from client properties (``SECURITY_PROPERTIES`` plus
        ``sasl.jaas.config``, each optionally prefixed ``kafka.``); a key that is not one
        of them raises ``KeyError`` naming it, a bad value ``ValueError``."""
        values: dict[str, Any] = {}
        for raw_key, value in properties.items():
            key = raw_key.lower().removeprefix("kafka.")
            value = value.strip()
            if key == "sasl.jaas.config":
                for name, quoted in _JAAS_FIELD.findall(value):
                    values[name] = quoted.replace('\\"', '"')
                continue
            field_name = SECURITY_PROPERTIES.get(key)
            if field_name is None:
                raise KeyError(raw_key)
            if field_name == "ssl_check_hostname":
                values[field_name] = value.lower() not in ("", "none")
            elif field_name in ("protocol", "sasl_mechanism"):
                values[field_name] = value.upper()
            else:
                values[field_name] = value
        return cls(**values) if values else PLAINTEXT


PLAINTEXT: Final = ClientSecurity()



@functools.lru_cache(maxsize=16)
def _client_context(cafile: str | None, certfile: str | None, keyfile: str | None,
                    check_hostname: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    return context
