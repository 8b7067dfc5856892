"""API-key authentication, per-key topic ACLs and per-key rate limits for the ingest gateway.

This module is the gateway's security and limits (docs/gateway.md: "Running it", "Errors",
"Rate limits"; the auth file's format is below). It has no FastAPI dependency: the app calls
:meth:`HttpAuthenticator.authenticate` with the raw ``Authorization`` header,
:meth:`HttpAuthenticator.authorize` with the action and topic of the request, and
:meth:`RateLimiter.check`, and turns their errors (``HttpError`` subclasses from
``ingest_gateway._errors``, the gateway's one HTTP error type) into a response with
``status``, ``headers`` and ``body()``. Keeping it framework-free keeps it unit-testable
without a server and lets the app choose where in the request path each check runs.

Credentials
-----------
An API key is a *key id* (public, shows up in logs and 403 messages) plus a *secret*
(private, shown once when the key is made). Two header forms are accepted:

* ``Authorization: Bearer <key_id>.<secret>`` -- the token is the key id, one ``.`` and the
  secret. ``<key_id>:<secret>`` is accepted too. Key ids may only use ``[A-Za-z0-9_-]``, so
  the first ``.`` or ``:`` always ends the key id and the secret may contain anything.
  A bare ``Bearer <secret>`` is *not* accepted: finding its key would mean hashing it
  against every key.
* ``Authorization: Basic base64(<key_id>:<secret>)`` -- HTTP Basic with the key id as user
  name and the secret as password, for tools that only speak Basic (curl ``-u``, browsers).

Only a hash of each secret is stored: ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>``
(standard base64 with padding), made by :func:`hash_secret` or by
``python -m ingest_gateway._auth hash-secret``. PBKDF2 is slow on purpose, so a stolen config
file does not give the secrets away cheaply; the :class:`HttpAuthenticator` therefore remembers
successful verifications (a small LRU of ``(key_id, sha256(secret))``) so a hot key costs one
PBKDF2 run, not one per request. Failures are never cached.

Config file (TOML, read by :func:`load_auth_config`)
----------------------------------------------------
::

    enabled = true            # required; write `enabled = false` to switch auth off

    [[keys]]
    id = "ingest-service"                     # [A-Za-z0-9_-]{1,64}, unique
    secret_hash = "pbkdf2_sha256$200000$...$..."
    rate_limit_per_s = 1000                   # optional: requests (cost units) per second
    burst = 2000                              # optional: bucket size; needs rate_limit_per_s
    acls = [
      { action = "produce", topic = "orders" },     # exactly this topic
      { action = "consume", prefix = "orders-" },   # every topic starting with "orders-"
      { action = "admin", prefix = "*" },           # every topic, and cluster-level admin
    ]

``enabled`` has no default: a config that forgets it is an error rather than silently open.
Every bad input raises :class:`GatewayConfigError` naming the file, the key and the fix.

ACL decisions (:meth:`Principal.allows`)
----------------------------------------
* A rule matches a topic if it names it exactly (``topic = "x"``), or its ``prefix`` starts
  the topic name, or it is ``prefix = "*"`` (all topics).
* The three actions are independent: ``admin`` does not imply ``produce`` or ``consume``.
  Grant each one you mean.
* ``topic=None`` is a cluster-level request (listing or creating topics, cluster metadata).
  It is allowed only by a rule for the same action on ``prefix = "*"``: for the usual
  ``Action.ADMIN`` that is ``{ action = "admin", prefix = "*" }``. A key whose rights stop
  at ``orders-*`` can not list the cluster's topics.
* With auth disabled every request gets :data:`ANONYMOUS`, which allows everything and is
  not rate limited.

Errors follow Confluent REST Proxy v3: ``{"error_code": <int>, "message": "<what to do>"}``
with 40101 (401), 40301 (403) and 42901 (429, with ``Retry-After``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import os
import re
import secrets
import sys
import time
import tomllib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from ingest_gateway._errors import HttpError

__all__ = [
    "ALL_ACCESS",
    "ANONYMOUS",
    "DEFAULT_ITERATIONS",
    "DEV_KEY_ID",
    "MIN_CONFIG_ITERATIONS",
    "AclRule",
    "Action",
    "ApiKeyCredential",
    "AuthConfig",
    "HttpAuthenticator",
    "ForbiddenError",
    "GatewayConfigError",
    "Principal",
    "RateLimitedError",
    "RateLimiter",
    "UnauthorizedError",
    "generate_dev_key",
    "hash_secret",
    "load_auth_config",
    "verify_secret",
]

#: PBKDF2 rounds :func:`hash_secret` uses by default.
DEFAULT_ITERATIONS: Final = 200_000
#: A config file's hashes must use at least this many rounds (weaker hashes are rejected).
MIN_CONFIG_ITERATIONS: Final = 100_000
#: :func:`verify_secret` refuses encodings above this, so a typo can not stall the gateway.
_MAX_ITERATIONS: Final = 10_000_000
_ALGORITHM: Final = "pbkdf2_sha256"
_SALT_BYTES: Final = 16
_HASH_BYTES: Final = 32
#: Key id of the local stack's development key (see :func:`generate_dev_key`).
DEV_KEY_ID: Final = "dev"

_KEY_ID_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOPIC_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HEADER_HELP: Final = (
    "send `Authorization: Bearer <key_id>.<secret>` or HTTP Basic with the key id as "
    "user name and the secret as password"
)
_HASH_HELP: Final = "make one with `python -m ingest_gateway._auth hash-secret`"


# --------------------------------------------------------------------------- hashing


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_secret(secret: str, *, iterations: int = DEFAULT_ITERATIONS) -> str:
    """Return ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>`` for ``secret``.

    A fresh 16-byte random salt each call, so hashing the same secret twice gives two
    different strings that both verify.
    """
    if not 1 <= iterations <= _MAX_ITERATIONS:
        raise ValueError(f"iterations must be 1..{_MAX_ITERATIONS}, got {iterations}")
    salt = os.urandom(_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), salt, iterations)
    return f"{_ALGORITHM}${iterations}${_b64(salt)}${_b64(digest)}"


def _parse_hash(encoded: str) -> tuple[int, bytes, bytes] | None:
    """``(iterations, salt, digest)`` of a well-formed encoding, else None."""
    parts = encoded.split("$")
    if len(parts) != 4 or parts[0] != _ALGORITHM:
        return None
    rounds, salt_b64, digest_b64 = parts[1:]
    if not rounds.isascii() or not rounds.isdigit() or rounds.startswith("0"):
        return None
    iterations = int(rounds)
    if iterations > _MAX_ITERATIONS:
        return None
    try:
        salt = base64.b64decode(salt_b64, validate=True)
        digest = base64.b64decode(digest_b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not salt or not digest:
        return None
    return iterations, salt, digest


def verify_secret(secret: str, encoded: str) -> bool:
    """True if ``secret`` hashes to ``encoded``; False for a wrong secret or any malformed
    encoding (never raises). The comparison is constant-time (``hmac.compare_digest``)."""
    try:
        parsed = _parse_hash(encoded)
        if parsed is None:
            return False
        iterations, salt, expected = parsed
        actual = hashlib.pbkdf2_hmac(
            "sha256", secret.encode("utf-8"), salt, iterations, dklen=len(expected)
        )
        return hmac.compare_digest(actual, expected)
    except (TypeError, ValueError, AttributeError, OverflowError):
        # UnicodeEncodeError (lone surrogates) is a ValueError; non-str input is TypeError
        # or AttributeError.
        return False


# --------------------------------------------------------------------------- model


class Action(StrEnum):
    """What a request does to a topic (or, with no topic, to the cluster)."""

    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


@dataclass(frozen=True)
class AclRule:
    """Allows ``action`` on ``topic`` (``prefix=False``) or on every topic starting with
    ``topic`` (``prefix=True``). ``AclRule(action, "*", prefix=True)`` means all topics."""

    action: Action
    topic: str
    prefix: bool

    def matches(self, action: Action, topic: str | None) -> bool:
        """True if this rule allows ``action`` on ``topic`` (None: cluster-level)."""
        if action != self.action:
            return False
        if self.prefix and self.topic == "*":
            return True
        if topic is None:
            return False
        return topic.startswith(self.topic) if self.prefix else topic == self.topic


#: Every action on every topic and the cluster (the development key's rights).
ALL_ACCESS: Final[tuple[AclRule, ...]] = tuple(AclRule(a, "*", True) for a in Action)


@dataclass(frozen=True)
class ApiKeyCredential:
    """One configured HTTP API key, a credential: its id, the hash of its secret, its ACLs
    and rate limit (not ``wire.protocol.ApiKey``, the broker protocol's request types).
    ``rate_limit_per_s=None`` means unlimited; ``burst=None`` with a rate means a bucket of
    ``max(1, ceil(rate_limit_per_s))``."""

    key_id: str
    secret_hash: str = field(repr=False)
    acls: tuple[AclRule, ...]
    rate_limit_per_s: float | None = None
    burst: int | None = None


@dataclass(frozen=True)
class Principal:
    """Who a request is. ``allow_all`` is only set on :data:`ANONYMOUS` (auth disabled)."""

    key_id: str
    acls: tuple[AclRule, ...] = ()
    allow_all: bool = False

    def allows(self, action: Action, topic: str | None) -> bool:
        """True if some rule allows ``action`` on ``topic``; ``topic=None`` is a cluster-level
        request and needs a rule for ``action`` on ``prefix = "*"`` (see the module doc)."""
        return self.allow_all or any(rule.matches(action, topic) for rule in self.acls)

    @classmethod
    def anonymous(cls) -> Principal:
        """The principal of every request when auth is explicitly disabled."""
        return cls(key_id="anonymous", acls=(), allow_all=True)


ANONYMOUS: Final = Principal.anonymous()


@dataclass(frozen=True)
class AuthConfig:
    """``enabled=False`` turns authentication, ACLs and rate limits off (every request is
    :data:`ANONYMOUS`); keys listed in a disabled config are validated but not used."""

    enabled: bool
    keys: tuple[ApiKeyCredential, ...] = ()

    @classmethod
    def disabled(cls) -> AuthConfig:
        """The explicit off switch (e.g. a ``--no-auth`` flag); there is no implicit one."""
        return cls(enabled=False, keys=())


# --------------------------------------------------------------------------- errors


class GatewayConfigError(Exception):
    """The auth config file is missing or wrong; the message names the file, the key and
    what to change."""


# The refusals below are ``HttpError``s (``_errors``): a request refused here produced
# nothing, so they are ``not_written`` (a streamed record refused by the rate limit is
# answered in its line, and an idempotent retry may produce it).


class UnauthorizedError(HttpError):
    """401 / 40101: no usable credentials. Carries ``WWW-Authenticate`` for both schemes."""

    def __init__(self, message: str) -> None:
        super().__init__(
            401,
            message,
            error_code=40101,
            headers={"WWW-Authenticate": 'Bearer realm="strata", Basic realm="strata"'},
            not_written=True,
        )


class ForbiddenError(HttpError):
    """403 / 40301: the key is valid but its ACLs do not allow the request."""

    def __init__(self, message: str) -> None:
        super().__init__(403, message, error_code=40301, not_written=True)


class RateLimitedError(HttpError):
    """429 / 42901 with ``Retry-After`` in whole seconds (at least 1, rounded up)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        seconds = max(1, math.ceil(retry_after_s)) if math.isfinite(retry_after_s) else 1
        super().__init__(429, message, error_code=42901,
                         headers={"Retry-After": str(seconds)}, not_written=True)
        self.retry_after_s = seconds


# --------------------------------------------------------------------------- config


def _fail(path: Path, where: str, what: str) -> GatewayConfigError:
    return GatewayConfigError(f"auth config {path}: {where}: {what}")


def _check_keys(path: Path, where: str, table: dict[str, Any], allowed: Sequence[str]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise _fail(
            path,
            where,
            f"unknown setting(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}",
        )


def _parse_acl(path: Path, where: str, raw: object) -> AclRule:
    if not isinstance(raw, dict):
        raise _fail(
            path, where, 'each ACL must be a table like { action = "produce", topic = "t" }'
        )
    _check_keys(path, where, raw, ("action", "topic", "prefix"))
    action_raw = raw.get("action")
    choices = ", ".join(a.value for a in Action)
    if not isinstance(action_raw, str) or action_raw not in {a.value for a in Action}:
        raise _fail(path, where, f"action {action_raw!r} is not valid; use one of {choices}")
    action = Action(action_raw)
    has_topic, has_prefix = "topic" in raw, "prefix" in raw
    if has_topic == has_prefix:
        raise _fail(
            path,
            where,
            'give exactly one of topic = "<name>" (one topic) or prefix = "<start>" '
            '(topics starting with it; prefix = "*" for all topics)',
        )
    if has_topic:
        topic = raw["topic"]
        if topic == "*":
            raise _fail(path, where, 'topic = "*" is not a wildcard; write prefix = "*"')
        if not isinstance(topic, str) or not _TOPIC_RE.match(topic) or topic in (".", ".."):
            raise _fail(
                path,
                where,
                f"topic {topic!r} is not valid: use 1-249 characters from [a-zA-Z0-9._-]",
            )
        return AclRule(action, topic, prefix=False)
    prefix = raw["prefix"]
    if prefix != "*" and (not isinstance(prefix, str) or not _TOPIC_RE.match(prefix)):
        raise _fail(
            path,
            where,
            f'prefix {prefix!r} is not valid: use "*" or 1-249 characters from [a-zA-Z0-9._-]',
        )
    return AclRule(action, prefix, prefix=True)


def _parse_key(path: Path, index: int, raw: object) -> ApiKeyCredential:
    where = f"keys[{index}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "each key must be a [[keys]] table")
    key_id = raw.get("id")
    if not isinstance(key_id, str) or not _KEY_ID_RE.match(key_id):
        raise _fail(
            path,
            where,
            f"id {key_id!r} is missing or not valid: use 1-64 characters from [A-Za-z0-9_-] "
            "(the Bearer token is '<id>.<secret>', so no '.' or ':')",
        )
    where = f"{where} (id {key_id!r})"
    _check_keys(path, where, raw, ("id", "secret_hash", "acls", "rate_limit_per_s", "burst"))

    secret_hash = raw.get("secret_hash")
    # Never echo the value: it may be a plaintext secret pasted by mistake.
    if not isinstance(secret_hash, str) or not secret_hash:
        raise _fail(path, where, f"secret_hash is missing; {_HASH_HELP}")
    if not secret_hash.startswith(_ALGORITHM + "$"):
        raise _fail(
            path,
            where,
            "secret_hash is not a pbkdf2_sha256 hash (a plaintext secret?); store only the "
            f"hash of the secret: {_HASH_HELP}",
        )
    parsed = _parse_hash(secret_hash)
    if parsed is None:
        raise _fail(
            path,
            where,
            "secret_hash is malformed (expected pbkdf2_sha256$<iterations>$<salt b64>$"
            f"<hash b64>); {_HASH_HELP}",
        )
    if parsed[0] < MIN_CONFIG_ITERATIONS:
        raise _fail(
            path,
            where,
            f"secret_hash uses {parsed[0]} iterations, fewer than {MIN_CONFIG_ITERATIONS}; "
            f"rehash the secret: {_HASH_HELP}",
        )

    acls_raw = raw.get("acls", [])
    if not isinstance(acls_raw, list):
        raise _fail(path, where, "acls must be a list of tables")
    acls = tuple(_parse_acl(path, f"{where} acls[{i}]", a) for i, a in enumerate(acls_raw))

    rate = raw.get("rate_limit_per_s")
    if rate is not None and (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not math.isfinite(rate)
        or rate <= 0
    ):
        raise _fail(
            path,
            where,
            f"rate_limit_per_s {rate!r} must be a positive number (leave it out for no limit)",
        )
    burst = raw.get("burst")
    if burst is not None:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise _fail(path, where, f"burst {burst!r} must be a positive integer")
        if rate is None:
            raise _fail(path, where, "burst needs rate_limit_per_s; set both or neither")
    return ApiKeyCredential(
        key_id=key_id,
        secret_hash=secret_hash,
        acls=acls,
        rate_limit_per_s=None if rate is None else float(rate),
        burst=burst,
    )


def load_auth_config(path: Path) -> AuthConfig:
    """Read and validate the TOML auth config at ``path`` (format in the module doc).

    Raises :class:`GatewayConfigError` for a missing/unreadable file, bad TOML, unknown
    settings, a missing or non-boolean ``enabled``, an enabled config with no keys, bad or
    duplicate key ids, a missing/plaintext/weak ``secret_hash``, bad ACLs or bad limits.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise GatewayConfigError(
            f"auth config {path}: file not found; create it (see "
            "ingest_gateway/auth.example.toml) or switch auth off explicitly"
        ) from None
    except OSError as e:
        raise GatewayConfigError(f"auth config {path}: can not read it: {e}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise GatewayConfigError(f"auth config {path}: not valid TOML: {e}; fix the syntax") from e

    _check_keys(path, "top level", data, ("enabled", "keys"))
    if "enabled" not in data:
        raise _fail(
            path,
            "enabled",
            "missing; write `enabled = true` (or `enabled = false` to switch auth off on purpose)",
        )
    enabled = data["enabled"]
    if not isinstance(enabled, bool):
        raise _fail(path, "enabled", f"{enabled!r} must be true or false (unquoted)")
    keys_raw = data.get("keys", [])
    if not isinstance(keys_raw, list):
        raise _fail(path, "keys", "must be an array of [[keys]] tables")
    keys = tuple(_parse_key(path, i, raw) for i, raw in enumerate(keys_raw))
    seen: set[str] = set()
    for i, key in enumerate(keys):
        if key.key_id in seen:
            raise _fail(
                path, f"keys[{i}] (id {key.key_id!r})", "duplicate id; give every key its own id"
            )
        seen.add(key.key_id)
    if enabled and not keys:
        raise _fail(
            path,
            "keys",
            "auth is enabled but no [[keys]] are defined, so every request would get 401; "
            "add a key or set `enabled = false`",
        )
    return AuthConfig(enabled=enabled, keys=keys)


# --------------------------------------------------------------------------- authentication


def _split_token(token: str) -> tuple[str, str] | None:
    """``<key_id>.<secret>`` or ``<key_id>:<secret>`` -> (key_id, secret)."""
    match = re.match(r"^([A-Za-z0-9_-]{1,64})[.:](.+)$", token, re.DOTALL)
    return (match.group(1), match.group(2)) if match else None


class HttpAuthenticator:
    """Turns an HTTP ``Authorization`` header into a :class:`Principal` and checks ACLs
    (the brokers' SASL authentication, ``brokers/security.py``, is another thing).

    Successful verifications are kept in an LRU of ``cache_size`` entries keyed by
    ``(key_id, sha256(secret))``: a hit skips PBKDF2. The plaintext secret is never kept.
    """

    def __init__(self, config: AuthConfig, *, cache_size: int = 1024) -> None:
        self._config = config
        self._keys = {k.key_id: k for k in config.keys}
        self._principals = {k.key_id: Principal(k.key_id, k.acls) for k in config.keys}
        self._cache: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._cache_size = max(0, cache_size)

    @property
    def enabled(self) -> bool:
        """False when the config switched auth off (every request is :data:`ANONYMOUS`)."""
        return self._config.enabled

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal for an ``Authorization`` header value, or :class:`UnauthorizedError`.

        With auth disabled this returns :data:`ANONYMOUS` whatever the header says.
        """
        if not self._config.enabled:
            return ANONYMOUS
        key_id, secret = self._credentials(authorization)
        if not self._verify(key_id, secret):
            raise UnauthorizedError(
                "Unknown API key id or wrong secret; check both, or ask an operator for a key."
            )
        return self._principals[key_id]

    def cached(self, authorization: str | None) -> Principal | None:
        """The principal when this exact key and secret were verified before (no PBKDF2:
        cheap enough for the event loop), None when ``authenticate`` must run; raises
        :class:`UnauthorizedError` for a missing or malformed header."""
        if not self._config.enabled:
            return ANONYMOUS
        key_id, secret = self._credentials(authorization)
        if key_id not in self._keys:
            return None
        try:
            fingerprint = hashlib.sha256(secret.encode("utf-8")).digest()
        except UnicodeEncodeError:
            return None
        return self._principals[key_id] if (key_id, fingerprint) in self._cache else None

    def _credentials(self, authorization: str | None) -> tuple[str, str]:
        """``(key_id, secret)`` of a Bearer or Basic header, or :class:`UnauthorizedError`."""
        if authorization is None or not authorization.strip():
            raise UnauthorizedError(f"Missing Authorization header; {_HEADER_HELP}.")
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        scheme = scheme.lower()
        if scheme == "bearer":
            pair = _split_token(credentials)
            if pair is None:
                raise UnauthorizedError(
                    "Malformed Bearer token: expected `Authorization: Bearer <key_id>.<secret>`."
                )
        elif scheme == "basic":
            pair = self._parse_basic(credentials)
        else:
            raise UnauthorizedError(f"Unsupported Authorization scheme; {_HEADER_HELP}.")
        return pair

    @staticmethod
    def _parse_basic(credentials: str) -> tuple[str, str]:
        bad = UnauthorizedError(
            "Malformed Basic credentials: expected `Authorization: Basic "
            "base64(<key_id>:<secret>)` (curl -u <key_id>:<secret>)."
        )
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise bad from None
        key_id, sep, secret = decoded.partition(":")
        if not sep or not key_id or not secret:
            raise bad
        return key_id, secret

    def _verify(self, key_id: str, secret: str) -> bool:
        key = self._keys.get(key_id)
        if key is None:
            return False
        try:
            fingerprint = hashlib.sha256(secret.encode("utf-8")).digest()
        except UnicodeEncodeError:
            return False
        cache_key = (key_id, fingerprint)
        if cache_key in self._cache:
            self._cache.move_to_end(cache_key)
            return True
        if not verify_secret(secret, key.secret_hash):
            return False
        if self._cache_size:
            self._cache[cache_key] = None
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return True

    def authorize(self, principal: Principal, action: Action, topic: str | None) -> None:
        """Return if ``principal`` may do ``action`` on ``topic`` (None: cluster-level),
        else raise :class:`ForbiddenError` naming the key, the action and the topic."""
        if principal.allows(action, topic):
            return
        if topic is None:
            raise ForbiddenError(
                f"API key '{principal.key_id}' may not perform cluster-level {action} "
                f'requests; an operator must grant it {{ action = "{action}", prefix = "*" }} '
                "in the gateway auth config."
            )
        raise ForbiddenError(
            f"API key '{principal.key_id}' may not {action} on topic '{topic}'; an operator "
            f'must grant it {{ action = "{action}", topic = "{topic}" }} (or a matching '
            "prefix) in the gateway auth config."
        )


# --------------------------------------------------------------------------- rate limits


class RateLimiter:
    """A token bucket per key id: ``rate_limit_per_s`` tokens per second, up to ``burst``.

    Each bucket starts full. ``check(principal, cost)`` takes ``cost`` tokens or raises
    :class:`RateLimitedError` with the wait until enough are back. A request costing more than
    the whole bucket is let through when the bucket is full and leaves it in debt, so big
    batches are never refused for ever and the long-run rate still holds. Keys without a
    limit, keys not in the config and :data:`ANONYMOUS` are unlimited.

    No locks: ``check`` never awaits, so on one asyncio event loop each call is atomic. Calls
    from several threads could lose an update (a little over-admission), never crash.
    """

    def __init__(self, config: AuthConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._limits: dict[str, tuple[float, float]] = {}
        if config.enabled:
            for key in config.keys:
                if key.rate_limit_per_s is not None:
                    capacity = (
                        key.burst
                        if key.burst is not None
                        else max(1, math.ceil(key.rate_limit_per_s))
                    )
                    self._limits[key.key_id] = (key.rate_limit_per_s, float(capacity))
        # key id -> [tokens, time of last refill]
        self._buckets: dict[str, list[float]] = {}

    def check(self, principal: Principal, cost: int = 1) -> None:
        """Admit a request of ``cost`` tokens for ``principal`` or raise the 429 error."""
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        if cost == 0:
            return
        limit = self._limits.get(principal.key_id)
        if limit is None or principal.allow_all:
            return
        rate, capacity = limit
        now = self._clock()
        bucket = self._buckets.get(principal.key_id)
        if bucket is None:
            bucket = self._buckets[principal.key_id] = [capacity, now]
        tokens = min(capacity, bucket[0] + max(0.0, now - bucket[1]) * rate)
        bucket[1] = now
        needed = min(float(cost), capacity)
        if tokens >= needed:
            bucket[0] = tokens - cost
            return
        bucket[0] = tokens
        wait = (needed - tokens) / rate
        raise RateLimitedError(
            f"API key '{principal.key_id}' is over its rate limit of {rate:g}/s "
            f"(burst {capacity:g}); retry after the Retry-After delay or ask an operator for "
            "a higher limit.",
            wait,
        )


# --------------------------------------------------------------------------- dev key


def generate_dev_key(key_id: str = DEV_KEY_ID) -> tuple[str, str]:
    """A fresh random development key: ``(bearer token, secret_hash)``.

    The local stack prints the token at start and configures
    ``ApiKeyCredential(key_id, secret_hash, ALL_ACCESS)``; the secret exists only in that printout.
    The token is ``<key_id>.<secret>`` (send it as ``Authorization: Bearer <token>``).
    """
    if not _KEY_ID_RE.match(key_id):
        raise ValueError(f"key id {key_id!r} must be 1-64 characters from [A-Za-z0-9_-]")
    secret = secrets.token_urlsafe(32)
    return f"{key_id}.{secret}", hash_secret(secret)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ingest_gateway._auth hash-secret`` (reads the secret from stdin, or
    prompts on a terminal) prints its ``secret_hash``; ``new-key <id>`` prints a random
    secret, its Bearer token and the hash to paste into the config."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["hash-secret"]:
        if sys.stdin.isatty():
            import getpass

            secret = getpass.getpass("secret: ")
        else:
            secret = sys.stdin.readline().rstrip("\r\n")
        if not secret:
            print("empty secret", file=sys.stderr)
            return 2
        print(hash_secret(secret))
        return 0
    if len(args) == 2 and args[0] == "new-key" and _KEY_ID_RE.match(args[1]):
        secret = secrets.token_urlsafe(32)
        print(f"secret:      {secret}")
        print(f"bearer:      {args[1]}.{secret}")
        print(f'secret_hash: "{hash_secret(secret)}"')
        return 0
    print(
        "usage: python -m ingest_gateway._auth hash-secret | new-key <id>  "
        "(key ids: 1-64 characters from [A-Za-z0-9_-])",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
