"""SASL mechanisms both sides speak: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802,
RFC 7677), as Kafka uses them inside SaslAuthenticate requests.

Pure functions and two small state machines, no I/O: the broker drives
:class:`ScramServer` with the bytes of each SaslAuthenticate request, the client drives
:class:`ScramClient`. Passwords are never stored: a user's :class:`ScramCredential` holds
the salt, the iteration count and the two keys RFC 5802 derives (``StoredKey``,
``ServerKey``), which let a server check a proof but not recover the password or log in
as the user. PLAIN is checked against the same credential (the password is salted and
hashed the same way and compared in constant time), so one credential store serves both.

Thread-safety: the state machines are used by one connection at a time; the functions
are pure.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from wire.errors import (
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "SCRAM_MECHANISMS",
    "ScramClient",
    "ScramCredential",
    "ScramServer",
    "check_plain",
    "credential_from_salted",
    "parse_plain",
    "plain_message",
    "salted_password",
    "scram_credential",
]

#: SCRAM mechanism name -> hashlib name.
SCRAM_MECHANISMS: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS: Final = ("PLAIN", *SCRAM_MECHANISMS)
#: Kafka's bounds for a stored credential's iteration count.
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
_MAX_MESSAGE: Final = 4096  # bytes: no legitimate SASL message here is longer


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server keeps of a SCRAM password (RFC 5802 section 3)."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def _hash_name(mechanism: str) -> str:
    try:
        return SCRAM_MECHANISMS[mechanism]
    except KeyError:
        raise UnsupportedSaslMechanismError(
            f"{mechanism!r} is not a SCRAM mechanism; use one of "
            f"{', '.join(SCRAM_MECHANISMS)}") from None


def _hmac(hash_name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hash_name).digest()


def _keys(hash_name: str, salted: bytes) -> tuple[bytes, bytes, bytes]:
    """``(ClientKey, StoredKey, ServerKey)`` from a salted password."""
    client_key = _hmac(hash_name, salted, b"Client Key")
    return (client_key, hashlib.new(hash_name, client_key).digest(),
            _hmac(hash_name, salted, b"Server Key"))


def _salted(hash_name: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)


def scram_credential(mechanism: str, password: str, *, salt: bytes | None = None,
                     iterations: int = MIN_ITERATIONS) -> ScramCredential:
    """The credential a server stores for ``password`` (a random 32-byte salt)."""
    hash_name = _hash_name(mechanism)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, "
                         f"not {iterations}")
    if not password:
        raise ValueError("the password is empty")
    salt = secrets.token_bytes(32) if salt is None else salt
    _, stored, server = _keys(hash_name, _salted(hash_name, password, salt, iterations))
    return ScramCredential(mechanism, salt, iterations, stored, server)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """PBKDF2 of the password: what a client sends to set a credential (Kafka's
    AlterUserScramCredentials), so the broker never sees the password itself."""
    return _salted(_hash_name(mechanism), password, salt, iterations)


def credential_from_salted(mechanism: str, salt: bytes, iterations: int,
                           salted: bytes) -> ScramCredential:
    """The stored credential from a salted password (the broker's side of that)."""
    hash_name = _hash_name(mechanism)
    _, stored, server = _keys(hash_name, salted)
    return ScramCredential(mechanism, salt, iterations, stored, server)


# ----------------------------------------------------------------------------- PLAIN
def plain_message(username: str, password: str) -> bytes:
    """``authzid NUL authcid NUL passwd`` with an empty authorization id."""
    return b"\0" + username.encode() + b"\0" + password.encode()


def parse_plain(message: bytes) -> tuple[str, str]:
    """``(username, password)`` of a PLAIN message; the authorization id must be empty
    or the user itself (no acting as another principal)."""
    parts = message.split(b"\0")
    if len(parts) != 3 or not parts[1] or not parts[2] or len(message) > _MAX_MESSAGE:
        raise SaslAuthenticationFailedError(
            "malformed SASL/PLAIN message: send NUL user NUL password")
    try:
        authzid, user, password = (p.decode() for p in parts)
    except UnicodeDecodeError:
        raise SaslAuthenticationFailedError("SASL/PLAIN user and password must be UTF-8") \
            from None
    if authzid and authzid != user:
        raise SaslAuthenticationFailedError(
            "SASL/PLAIN: acting as another user (authorization id) is not supported")
    return user, password


def check_plain(credential: ScramCredential | None, password: str) -> bool:
    """Whether ``password`` matches the stored credential (constant-time compare)."""
    if credential is None:
        return False
    hash_name = _hash_name(credential.mechanism)
    _, stored, _ = _keys(hash_name, _salted(hash_name, password, credential.salt,
                                            credential.iterations))
    return hmac.compare_digest(stored, credential.stored_key)


# ----------------------------------------------------------------------------- SCRAM
def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    if "=" in name.replace("=3D", "").replace("=2C", ""):
        raise SaslAuthenticationFailedError("SCRAM user name has a bad '=' escape")
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str, expected: str) -> dict[str, str]:
    """``k=v,...`` with exactly the keys in ``expected`` order (extensions refused)."""
    out: dict[str, str] = {}
    for item in message.split(","):
        key, sep, value = item.partition("=")
        if not sep or len(key) != 1:
            raise SaslAuthenticationFailedError(f"malformed SCRAM message {message[:80]!r}")
        out[key] = value
    if "".join(out) != expected:
        raise SaslAuthenticationFailedError(
            f"SCRAM message {message[:80]!r}: expected attributes {','.join(expected)}")
    return out


class ScramServer:
    """The server side of one SCRAM exchange: ``step`` twice, then ``principal``.

    ``lookup(user)`` returns the user's credential for this mechanism, or None. An
    unknown user gets a made-up salt and fails at the proof, like a wrong password, so
    the exchange does not tell which users exist.
    """

    def __init__(self, mechanism: str, lookup: Callable[[str], ScramCredential | None],
                 *, secret: bytes) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        self._lookup = lookup
        self._secret = secret
        self._state = "first"
        self._user = ""
        self._credential: ScramCredential | None = None
        self._nonce = ""
        self._first_bare = ""
        self._server_first = ""
        self.principal: str | None = None

    def step(self, message: bytes) -> bytes:
        if len(message) > _MAX_MESSAGE:
            raise SaslAuthenticationFailedError("SCRAM message too long")
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise SaslAuthenticationFailedError("SCRAM messages must be UTF-8") from None
        if self._state == "first":
            return self._first(text).encode()
        if self._state == "final":
            return self._final(text).encode()
        raise IllegalSaslStateError("the SCRAM exchange is already complete")

    def _first(self, text: str) -> str:
        self._state = "failed"
        if not text.startswith("n,,"):
            raise SaslAuthenticationFailedError(
                "SCRAM client-first must start with 'n,,' (no channel binding, no "
                "authorization id)")
        self._first_bare = text[3:]
        attrs = _attributes(self._first_bare, "nr")
        self._user = _unescape(attrs["n"])
        client_nonce = attrs["r"]
        if not self._user or not client_nonce:
            raise SaslAuthenticationFailedError("SCRAM client-first lacks a user or nonce")
        credential = self._lookup(self._user)
        if credential is None:  # no such user: carry on with a credential nobody has
            fake = _hmac(self._hash, self._secret, self._user.encode())
            credential = ScramCredential(self.mechanism, fake[:32], MIN_ITERATIONS,
                                         b"\0" * len(fake), b"")
        self._credential = credential
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()}"
                              f",i={credential.iterations}")
        self._state = "final"
        return self._server_first

    def _final(self, text: str) -> str:
        self._state = "failed"
        attrs = _attributes(text, "crp")
        if attrs["c"] != "biws":  # base64 of "n,,"
            raise SaslAuthenticationFailedError("SCRAM channel binding must be 'biws'")
        if attrs["r"] != self._nonce:
            raise SaslAuthenticationFailedError("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(attrs["p"], validate=True)
        except ValueError:
            raise SaslAuthenticationFailedError("SCRAM proof is not base64") from None
        credential = self._credential
        assert credential is not None
        without_proof = text[:text.rindex(",p=")]
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._hash, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslAuthenticationFailedError(self._refusal())
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(),
                                   credential.stored_key):
            raise SaslAuthenticationFailedError(self._refusal())
        self._state = "done"
        self.principal = self._user
        server_signature = _hmac(self._hash, credential.server_key, auth_message)
        return "v=" + base64.b64encode(server_signature).decode()

    def _refusal(self) -> str:
        return (f"authentication failed with {self.mechanism}: wrong user name or password "
                "(create the user with `strata user create`)")


class ScramClient:
    """The client side: ``first()``, ``final(server_first)``, ``verify(server_final)``."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self._hash = _hash_name(mechanism)
        self._password = password
        self._nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        self._first_bare = f"n={_escape(username)},r={self._nonce}"
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        return ("n,," + self._first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = _attributes(text, "rsi")
        if not attrs["r"].startswith(self._nonce) or attrs["r"] == self._nonce:
            raise SaslAuthenticationFailedError("the server's SCRAM nonce is not ours")
        iterations = int(attrs["i"])
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise SaslAuthenticationFailedError(
                f"the server asks for {iterations} SCRAM iterations "
                f"(outside {MIN_ITERATIONS}..{MAX_ITERATIONS})")
        salted = _salted(self._hash, self._password, base64.b64decode(attrs["s"]), iterations)
        client_key, stored_key, self._server_key = _keys(self._hash, salted)
        without_proof = f"c=biws,r={attrs['r']}"
        self._auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = _hmac(self._hash, stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server knew the credential too (mutual authentication)."""
        expected = _hmac(self._hash, self._server_key, self._auth_message)
        text = server_final.decode(errors="replace")
        if not text.startswith("v=") or not hmac.compare_digest(
                base64.b64decode(text[2:] or "="), expected):
            raise SaslAuthenticationFailedError(
                "the broker's SCRAM signature is wrong: it does not hold this user's "
                "credential (a man in the middle, or another cluster)")
