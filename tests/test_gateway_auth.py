"""Unit tests for ingest_gateway._auth: hashing, config parsing, authentication, ACLs,
rate limits and error bodies. No network, no server; PBKDF2 runs with few iterations
except where a config file demands the real minimum."""

from __future__ import annotations

import base64
import hashlib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingest_gateway import _auth
from ingest_gateway._auth import (
    ALL_ACCESS,
    ANONYMOUS,
    MIN_CONFIG_ITERATIONS,
    AclRule,
    Action,
    ApiKeyCredential,
    AuthConfig,
    ForbiddenError,
    GatewayConfigError,
    HttpAuthenticator,
    Principal,
    RateLimitedError,
    RateLimiter,
    UnauthorizedError,
    generate_dev_key,
    hash_secret,
    load_auth_config,
    verify_secret,
)
from ingest_gateway._errors import HttpError

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[1] / "ingest_gateway" / "auth.example.toml"
FAST = 1_000  # iterations for hashes the tests verify
#: A hash strong enough for a config file (parsed, never verified in the config tests).
CONFIG_HASH = hash_secret("s3cret", iterations=MIN_CONFIG_ITERATIONS)


def basic(user_pass: str) -> str:
    return "Basic " + base64.b64encode(user_pass.encode()).decode()


# --------------------------------------------------------------------------- hashing


def test_hash_round_trip_and_format() -> None:
    encoded = hash_secret("correct horse", iterations=FAST)
    algo, rounds, salt, digest = encoded.split("$")
    assert (algo, rounds) == ("pbkdf2_sha256", str(FAST))
    assert len(base64.b64decode(salt)) == 16
    assert len(base64.b64decode(digest)) == 32
    assert verify_secret("correct horse", encoded)
    assert not verify_secret("correct horsE", encoded)
    assert not verify_secret("", encoded)


def test_hash_is_salted() -> None:
    a, b = hash_secret("x", iterations=FAST), hash_secret("x", iterations=FAST)
    assert a != b
    assert verify_secret("x", a) and verify_secret("x", b)


def test_hash_default_iterations() -> None:
    assert hash_secret("x").split("$")[1] == "200000"


def test_hash_rejects_bad_iterations() -> None:
    with pytest.raises(ValueError):
        hash_secret("x", iterations=0)


def _tampered(encoded: str) -> list[str]:
    algo, rounds, salt, digest = encoded.split("$")
    other_digest = base64.b64encode(bytes(32)).decode()
    other_salt = base64.b64encode(bytes(16)).decode()
    return [
        f"{algo}${rounds}${salt}${other_digest}",  # different hash
        f"{algo}${rounds}${other_salt}${digest}",  # different salt
        f"{algo}${int(rounds) + 1}${salt}${digest}",  # different iteration count
        f"pbkdf2_sha1${rounds}${salt}${digest}",  # different algorithm
    ]


def test_verify_rejects_tampered_hashes() -> None:
    encoded = hash_secret("secret", iterations=FAST)
    for bad in _tampered(encoded):
        assert not verify_secret("secret", bad), bad


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "secret",
        "pbkdf2_sha256",
        "pbkdf2_sha256$1000$abc",
        "pbkdf2_sha256$1000$AAAA$AAAA$extra",
        "pbkdf2_sha256$x$AAAA$AAAA",
        "pbkdf2_sha256$-1$AAAA$AAAA",
        "pbkdf2_sha256$0$AAAA$AAAA",
        "pbkdf2_sha256$0100$AAAA$AAAA",
        "pbkdf2_sha256$\u0661\u0660\u0660\u0660$AAAA$AAAA",  # non-ASCII (Arabic-Indic) digits
        "pbkdf2_sha256$99999999999$AAAA$AAAA",  # absurd iteration count
        "pbkdf2_sha256$1000$not base64!$AAAA",
        "pbkdf2_sha256$1000$AAAA$AAA",  # bad padding
        "pbkdf2_sha256$1000$$AAAA",  # empty salt
        "pbkdf2_sha256$1000$AAAA$",  # empty hash
    ],
)
def test_verify_never_raises_on_malformed(encoded: str) -> None:
    assert verify_secret("secret", encoded) is False


def test_verify_never_raises_on_odd_input() -> None:
    encoded = hash_secret("secret", iterations=FAST)
    assert verify_secret("\ud800", encoded) is False  # lone surrogate: not encodable
    assert verify_secret(None, encoded) is False  # type: ignore[arg-type]
    assert verify_secret("secret", None) is False  # type: ignore[arg-type]


# --------------------------------------------------------------------------- config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "auth.toml"
    path.write_text(text, encoding="utf-8")
    return path


def key_block(
    key_id: str = "ingest", secret_hash: str = CONFIG_HASH, extra: str = "", acls: str = ""
) -> str:
    acls = acls or '[ { action = "produce", topic = "orders" } ]'
    return f'[[keys]]\nid = "{key_id}"\nsecret_hash = "{secret_hash}"\nacls = {acls}\n{extra}\n'


def test_load_valid_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "enabled = true\n"
        + key_block(
            "ingest-service",
            extra="rate_limit_per_s = 1000\nburst = 2000",
            acls='[ { action = "produce", topic = "orders" }, '
            '{ action = "consume", prefix = "orders-" }, { action = "admin", prefix = "*" } ]',
        )
        + key_block("reader", extra="rate_limit_per_s = 2.5", acls="[]"),
    )
    config = load_auth_config(path)
    assert config.enabled is True
    first, second = config.keys
    assert first == ApiKeyCredential(
        key_id="ingest-service",
        secret_hash=CONFIG_HASH,
        acls=(
            AclRule(Action.PRODUCE, "orders", prefix=False),
            AclRule(Action.CONSUME, "orders-", prefix=True),
            AclRule(Action.ADMIN, "*", prefix=True),
        ),
        rate_limit_per_s=1000.0,
        burst=2000,
    )
    assert (second.key_id, second.acls, second.rate_limit_per_s, second.burst) == (
        "reader",
        (),
        2.5,
        None,
    )
    assert CONFIG_HASH not in repr(first)  # hashes stay out of logs


def test_load_disabled_config(tmp_path: Path) -> None:
    assert load_auth_config(write(tmp_path, "enabled = false\n")) == AuthConfig.disabled()
    with_keys = load_auth_config(write(tmp_path, "enabled = false\n" + key_block()))
    assert with_keys.enabled is False and len(with_keys.keys) == 1


def test_example_file_loads_and_its_documented_secrets_work() -> None:
    config = load_auth_config(EXAMPLE)
    assert config.enabled
    assert [k.key_id for k in config.keys] == ["ingest-service", "dashboards", "ops"]
    auth = HttpAuthenticator(config)
    ingest = auth.authenticate("Bearer ingest-service.example-ingest-secret-DO-NOT-USE")
    auth.authorize(ingest, Action.PRODUCE, "orders-eu")
    reader = auth.authenticate(basic("dashboards:example-reader-secret-DO-NOT-USE"))
    with pytest.raises(ForbiddenError):
        auth.authorize(reader, Action.PRODUCE, "orders")


BAD_CONFIGS: list[tuple[str, str, str]] = [
    # (name, file text, regex the message must match besides the file name)
    ("bad toml", "enabled = tru\n", r"not valid TOML.*fix the syntax"),
    ("enabled missing", key_block(), r"enabled: missing; write `enabled = true`"),
    ("enabled string", 'enabled = "false"\n', r"enabled: 'false' must be true or false"),
    ("unknown top-level", "enabled = true\nenable = false\n" + key_block(), r"'enable'"),
    ("no keys", "enabled = true\n", r"no \[\[keys\]\] are defined.*enabled = false"),
    ("keys not a list", "enabled = true\nkeys = 3\n", r"keys: must be an array"),
    (
        "duplicate ids",
        "enabled = true\n" + key_block("a") + key_block("b") + key_block("a"),
        r"keys\[2\] \(id 'a'\): duplicate id",
    ),
    (
        "unknown key setting",
        "enabled = true\n" + key_block(extra='secret = "x"'),
        r"keys\[0\] \(id 'ingest'\): unknown setting\(s\) 'secret'; allowed:",
    ),
    ("missing id", 'enabled = true\n[[keys]]\nsecret_hash = "x"\n', r"keys\[0\]: id None"),
    (
        "id with a dot",
        "enabled = true\n" + key_block("my.key"),
        r"id 'my.key' is missing or not valid.*no '\.' or ':'",
    ),
    (
        "missing secret_hash",
        'enabled = true\n[[keys]]\nid = "k"\n',
        r"\(id 'k'\): secret_hash is missing; make one with",
    ),
    (
        "plaintext secret",
        "enabled = true\n" + key_block(secret_hash="hunter2-plaintext"),
        r"\(id 'ingest'\): secret_hash is not a pbkdf2_sha256 hash \(a plaintext secret\?\)"
        r".*hash-secret",
    ),
    (
        "malformed hash",
        "enabled = true\n" + key_block(secret_hash="pbkdf2_sha256$200000$nope"),
        r"secret_hash is malformed",
    ),
    (
        "weak hash",
        "enabled = true\n" + key_block(secret_hash=hash_secret("x", iterations=FAST)),
        rf"uses {FAST} iterations, fewer than {MIN_CONFIG_ITERATIONS}; rehash",
    ),
    (
        "bad action",
        "enabled = true\n" + key_block(acls='[ { action = "write", topic = "t" } ]'),
        r"\(id 'ingest'\) acls\[0\]: action 'write' is not valid; "
        r"use one of produce, consume, admin",
    ),
    (
        "acl with topic and prefix",
        "enabled = true\n"
        + key_block(acls='[ { action = "produce", topic = "t", prefix = "t" } ]'),
        r"acls\[0\]: give exactly one of topic",
    ),
    (
        "acl with neither",
        "enabled = true\n" + key_block(acls='[ { action = "produce" } ]'),
        r"give exactly one of topic",
    ),
    (
        "acl topic star",
        "enabled = true\n" + key_block(acls='[ { action = "produce", topic = "*" } ]'),
        r'topic = "\*" is not a wildcard; write prefix = "\*"',
    ),
    (
        "acl bad topic",
        "enabled = true\n" + key_block(acls='[ { action = "produce", topic = "a b" } ]'),
        r"topic 'a b' is not valid",
    ),
    (
        "acl bad prefix",
        "enabled = true\n" + key_block(acls='[ { action = "produce", prefix = "" } ]'),
        r"prefix '' is not valid",
    ),
    (
        "acl unknown field",
        "enabled = true\n"
        + key_block(acls='[ { action = "produce", topic = "t", topics = "u" } ]'),
        r"acls\[0\]: unknown setting\(s\) 'topics'",
    ),
    (
        "acls not a list",
        "enabled = true\n" + key_block(acls='"produce"'),
        r"acls must be a list",
    ),
    (
        "negative rate",
        "enabled = true\n" + key_block(extra="rate_limit_per_s = -1"),
        r"rate_limit_per_s -1 must be a positive number",
    ),
    (
        "boolean rate",
        "enabled = true\n" + key_block(extra="rate_limit_per_s = true"),
        r"rate_limit_per_s True must be a positive number",
    ),
    (
        "float burst",
        "enabled = true\n" + key_block(extra="rate_limit_per_s = 5\nburst = 1.5"),
        r"burst 1.5 must be a positive integer",
    ),
    (
        "burst without rate",
        "enabled = true\n" + key_block(extra="burst = 10"),
        r"burst needs rate_limit_per_s",
    ),
]


@pytest.mark.parametrize(
    ("text", "pattern"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_is_rejected_with_a_clear_message(
    tmp_path: Path, text: str, pattern: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(GatewayConfigError) as info:
        load_auth_config(path)
    message = str(info.value)
    assert message.startswith(f"auth config {path}: "), message
    assert re.search(pattern, message), message


def test_plaintext_secret_is_not_echoed(tmp_path: Path) -> None:
    path = write(tmp_path, "enabled = true\n" + key_block(secret_hash="hunter2-plaintext"))
    with pytest.raises(GatewayConfigError) as info:
        load_auth_config(path)
    assert "hunter2" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(GatewayConfigError, match=r"nope\.toml: file not found; create it"):
        load_auth_config(path)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match="can not read it"):
        load_auth_config(tmp_path)  # a directory


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_bytes(b"enabled = true\n# \xff\n")
    with pytest.raises(GatewayConfigError, match="not valid TOML"):
        load_auth_config(path)


# --------------------------------------------------------------------------- authentication


def make_config(**limits: Any) -> AuthConfig:
    return AuthConfig(
        enabled=True,
        keys=(
            ApiKeyCredential(
                "ingest",
                hash_secret("s3cret.with:seps", iterations=FAST),
                (AclRule(Action.PRODUCE, "orders", False),),
                **limits,
            ),
            ApiKeyCredential("ops", hash_secret("ops-secret", iterations=FAST), ALL_ACCESS),
        ),
    )


@pytest.fixture
def auth() -> HttpAuthenticator:
    return HttpAuthenticator(make_config())


@pytest.mark.parametrize(
    "header",
    [
        "Bearer ingest.s3cret.with:seps",
        "Bearer ingest:s3cret.with:seps",
        "bearer ingest.s3cret.with:seps",
        "  Bearer   ingest.s3cret.with:seps  ",
        basic("ingest:s3cret.with:seps"),
        basic("ingest:s3cret.with:seps").replace("Basic", "BASIC"),
    ],
)
def test_good_credentials(auth: HttpAuthenticator, header: str) -> None:
    principal = auth.authenticate(header)
    assert principal.key_id == "ingest"
    assert principal.allows(Action.PRODUCE, "orders")


@pytest.mark.parametrize(
    "header",
    [
        "Bearer ingest.wrong",
        "Bearer ingest.s3cret.with:sep",
        "Bearer ops.s3cret.with:seps",  # another key's id
        "Bearer nobody.s3cret.with:seps",
        basic("ingest:wrong"),
        basic("nobody:s3cret.with:seps"),
    ],
)
def test_wrong_secret_or_unknown_key(auth: HttpAuthenticator, header: str) -> None:
    with pytest.raises(UnauthorizedError) as info:
        auth.authenticate(header)
    assert info.value.message == (
        "Unknown API key id or wrong secret; check both, or ask an operator for a key."
    )


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, "Missing Authorization header"),
        ("", "Missing Authorization header"),
        ("   ", "Missing Authorization header"),
        ("Bearer", "Malformed Bearer token: expected `Authorization: Bearer <key_id>.<secret>`"),
        ("Bearer s3cret", "Malformed Bearer token"),  # no key id
        ("Bearer ingest.", "Malformed Bearer token"),  # no secret
        ("Bearer .s3cret", "Malformed Bearer token"),
        ("Bearer bad/id.s3cret", "Malformed Bearer token"),
        ("Basic !!!notbase64", "Malformed Basic credentials: expected `Authorization: Basic"),
        ("Basic " + base64.b64encode(b"no-colon").decode(), "Malformed Basic credentials"),
        ("Basic " + base64.b64encode(b":s3cret").decode(), "Malformed Basic credentials"),
        ("Basic " + base64.b64encode(b"ingest:").decode(), "Malformed Basic credentials"),
        ("Basic " + base64.b64encode(b"\xff:\xfe").decode(), "Malformed Basic credentials"),
        ("Digest username=ingest", "Unsupported Authorization scheme; send `Authorization:"),
        ("ingest.s3cret", "Unsupported Authorization scheme"),
    ],
)
def test_malformed_or_missing_header(
    auth: HttpAuthenticator, header: str | None, expected: str
) -> None:
    with pytest.raises(UnauthorizedError) as info:
        auth.authenticate(header)
    assert info.value.message.startswith(expected), info.value.message


def test_401_body_and_headers(auth: HttpAuthenticator) -> None:
    with pytest.raises(HttpError) as info:
        auth.authenticate(None)
    err = info.value
    assert err.status == 401 and err.error_code == 40101
    assert err.headers == {"WWW-Authenticate": 'Bearer realm="strata", Basic realm="strata"'}
    assert err.body() == {
        "error_code": 40101,
        "message": "Missing Authorization header; send `Authorization: Bearer <key_id>.<secret>` "
        "or HTTP Basic with the key id as user name and the secret as password.",
    }


def test_disabled_auth_is_anonymous_and_allows_everything() -> None:
    auth = HttpAuthenticator(AuthConfig.disabled())
    assert not auth.enabled
    for header in (None, "garbage", "Bearer x.y"):
        assert auth.authenticate(header) is ANONYMOUS
    for action in Action:
        auth.authorize(ANONYMOUS, action, "any-topic")
        auth.authorize(ANONYMOUS, action, None)


def test_disabled_config_with_keys_still_anonymous() -> None:
    config = AuthConfig(enabled=False, keys=make_config().keys)
    assert HttpAuthenticator(config).authenticate("Bearer ingest.wrong") is ANONYMOUS


# --------------------------------------------------------------------------- verification cache


@pytest.fixture
def pbkdf2_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Counts PBKDF2 runs (by password) done after the fixture starts."""
    calls: list[bytes] = []
    real: Callable[..., bytes] = hashlib.pbkdf2_hmac

    def counting(name: str, password: bytes, *args: Any, **kwargs: Any) -> bytes:
        calls.append(password)
        return real(name, password, *args, **kwargs)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counting)
    return calls


def test_cache_hashes_once_per_key_and_secret(pbkdf2_calls: list[bytes]) -> None:
    auth = HttpAuthenticator(make_config())
    pbkdf2_calls.clear()  # building the config hashed the secrets
    for _ in range(5):
        auth.authenticate("Bearer ingest.s3cret.with:seps")
        auth.authenticate(basic("ingest:s3cret.with:seps"))  # same pair, other form
    assert pbkdf2_calls == [b"s3cret.with:seps"]
    for _ in range(3):
        auth.authenticate("Bearer ops.ops-secret")
    assert len(pbkdf2_calls) == 2


def test_failures_are_not_cached(pbkdf2_calls: list[bytes]) -> None:
    auth = HttpAuthenticator(make_config())
    pbkdf2_calls.clear()  # building the config hashed the secrets
    for _ in range(3):
        with pytest.raises(UnauthorizedError):
            auth.authenticate("Bearer ingest.wrong")
    assert len(pbkdf2_calls) == 3
    # A cached success for one secret does not let another secret in.
    auth.authenticate("Bearer ingest.s3cret.with:seps")
    with pytest.raises(UnauthorizedError):
        auth.authenticate("Bearer ingest.wrong")
    # An unknown key id costs no PBKDF2 at all.
    before = len(pbkdf2_calls)
    with pytest.raises(UnauthorizedError):
        auth.authenticate("Bearer nobody.x")
    assert len(pbkdf2_calls) == before


def test_cache_is_lru_bounded(pbkdf2_calls: list[bytes]) -> None:
    auth = HttpAuthenticator(make_config(), cache_size=1)
    pbkdf2_calls.clear()  # building the config hashed the secrets
    auth.authenticate("Bearer ingest.s3cret.with:seps")
    auth.authenticate("Bearer ops.ops-secret")  # evicts ingest
    auth.authenticate("Bearer ops.ops-secret")  # hit
    auth.authenticate("Bearer ingest.s3cret.with:seps")  # miss again
    assert pbkdf2_calls == [b"s3cret.with:seps", b"ops-secret", b"s3cret.with:seps"]


def test_cache_can_be_off(pbkdf2_calls: list[bytes]) -> None:
    auth = HttpAuthenticator(make_config(), cache_size=0)
    pbkdf2_calls.clear()  # building the config hashed the secrets
    auth.authenticate("Bearer ops.ops-secret")
    auth.authenticate("Bearer ops.ops-secret")
    assert len(pbkdf2_calls) == 2


# --------------------------------------------------------------------------- ACLs


def principal(*rules: tuple[Action, str, bool]) -> Principal:
    return Principal("k", tuple(AclRule(a, t, p) for a, t, p in rules))


def test_exact_rule() -> None:
    p = principal((Action.PRODUCE, "orders", False))
    assert p.allows(Action.PRODUCE, "orders")
    assert not p.allows(Action.PRODUCE, "orders-eu")
    assert not p.allows(Action.PRODUCE, "order")
    assert not p.allows(Action.CONSUME, "orders")
    assert not p.allows(Action.PRODUCE, None)


def test_prefix_rule() -> None:
    p = principal((Action.CONSUME, "orders-", True))
    assert p.allows(Action.CONSUME, "orders-eu")
    assert p.allows(Action.CONSUME, "orders-")
    assert not p.allows(Action.CONSUME, "orders")
    assert not p.allows(Action.CONSUME, "xorders-eu")
    assert not p.allows(Action.PRODUCE, "orders-eu")
    assert not p.allows(Action.CONSUME, None)


def test_wildcard_rule() -> None:
    p = principal((Action.PRODUCE, "*", True))
    assert p.allows(Action.PRODUCE, "anything")
    assert p.allows(Action.PRODUCE, None)
    assert not p.allows(Action.CONSUME, "anything")


def test_admin_is_independent_and_cluster_level_needs_wildcard() -> None:
    scoped = principal((Action.ADMIN, "orders-", True))
    assert scoped.allows(Action.ADMIN, "orders-eu")  # e.g. topic config of its own topics
    assert not scoped.allows(Action.ADMIN, None)  # but not listing/creating cluster-wide
    admin = principal((Action.ADMIN, "*", True))
    assert admin.allows(Action.ADMIN, None)
    assert admin.allows(Action.ADMIN, "x")
    assert not admin.allows(Action.PRODUCE, "x")  # admin does not imply produce
    assert not admin.allows(Action.CONSUME, "x")


def test_no_rules_allows_nothing() -> None:
    p = principal()
    assert not any(p.allows(a, t) for a in Action for t in ("x", None))


def test_all_access_and_anonymous() -> None:
    p = Principal("dev", ALL_ACCESS)
    assert all(p.allows(a, t) for a in Action for t in ("x", None))
    assert Principal.anonymous() == ANONYMOUS and ANONYMOUS.allow_all


def test_authorize_403_body(auth: HttpAuthenticator) -> None:
    ingest = auth.authenticate("Bearer ingest.s3cret.with:seps")
    auth.authorize(ingest, Action.PRODUCE, "orders")
    with pytest.raises(ForbiddenError) as info:
        auth.authorize(ingest, Action.CONSUME, "payments")
    err = info.value
    assert (err.status, err.error_code, err.headers) == (403, 40301, {})
    assert err.body() == {
        "error_code": 40301,
        "message": "API key 'ingest' may not consume on topic 'payments'; an operator must "
        'grant it { action = "consume", topic = "payments" } (or a matching prefix) in the '
        "gateway auth config.",
    }
    with pytest.raises(ForbiddenError) as info:
        auth.authorize(ingest, Action.ADMIN, None)
    assert info.value.message == (
        "API key 'ingest' may not perform cluster-level admin requests; an operator must "
        'grant it { action = "admin", prefix = "*" } in the gateway auth config.'
    )


# --------------------------------------------------------------------------- rate limits


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limiter(rate: float | None, burst: int | None) -> tuple[RateLimiter, FakeClock, Principal]:
    clock = FakeClock()
    config = make_config(rate_limit_per_s=rate, burst=burst)
    return RateLimiter(config, clock=clock), clock, Principal("ingest")


def test_bucket_allows_burst_then_429_then_refills() -> None:
    rl, clock, p = limiter(rate=2.0, burst=3)
    for _ in range(3):
        rl.check(p)
    with pytest.raises(RateLimitedError) as info:
        rl.check(p)
    err = info.value
    assert (err.status, err.error_code) == (429, 42901)
    assert err.headers == {"Retry-After": "1"}  # 0.5 s rounded up to the minimum 1
    assert err.body()["error_code"] == 42901
    assert "API key 'ingest' is over its rate limit of 2/s (burst 3)" in err.message
    assert "retry after the Retry-After delay" in err.message
    clock.now += 0.5  # one token back
    rl.check(p)
    with pytest.raises(RateLimitedError):
        rl.check(p)
    clock.now += 10  # refills, but only up to the burst
    for _ in range(3):
        rl.check(p)
    with pytest.raises(RateLimitedError):
        rl.check(p)


def test_retry_after_rounds_up() -> None:
    rl, clock, p = limiter(rate=0.4, burst=1)
    rl.check(p)
    with pytest.raises(RateLimitedError) as info:
        rl.check(p)
    assert info.value.headers["Retry-After"] == "3"  # 2.5 s
    assert info.value.retry_after_s == 3
    clock.now += 2.4
    with pytest.raises(RateLimitedError) as info:
        rl.check(p)
    assert info.value.headers["Retry-After"] == "1"  # 0.1 s -> at least 1
    clock.now += 0.1
    rl.check(p)


def test_rejected_requests_do_not_consume() -> None:
    rl, clock, p = limiter(rate=1.0, burst=1)
    rl.check(p)
    for _ in range(5):
        with pytest.raises(RateLimitedError):
            rl.check(p)
    clock.now += 1.0
    rl.check(p)


def test_cost_and_oversized_requests() -> None:
    rl, clock, p = limiter(rate=10.0, burst=10)
    rl.check(p, cost=4)
    rl.check(p, cost=6)
    with pytest.raises(RateLimitedError):
        rl.check(p, cost=1)
    rl.check(p, cost=0)  # free
    clock.now += 1.0  # full again
    rl.check(p, cost=25)  # bigger than the bucket: admitted when full, leaves a debt of 15
    with pytest.raises(RateLimitedError) as info:
        rl.check(p, cost=1)
    assert info.value.headers["Retry-After"] == "2"  # (1 + 15) / 10 = 1.6 s
    clock.now += 1.5
    with pytest.raises(RateLimitedError):
        rl.check(p, cost=1)
    clock.now += 0.2
    rl.check(p, cost=1)
    with pytest.raises(ValueError):
        rl.check(p, cost=-1)


def test_burst_defaults_to_rate() -> None:
    rl, _, p = limiter(rate=2.5, burst=None)
    for _ in range(3):
        rl.check(p)
    with pytest.raises(RateLimitedError):
        rl.check(p)


def test_unlimited_keys_and_anonymous() -> None:
    rl, _, p = limiter(rate=None, burst=None)
    for _ in range(10_000):
        rl.check(p)
    rl2, _, _ = limiter(rate=1.0, burst=1)
    for _ in range(100):
        rl2.check(Principal("ops", ALL_ACCESS))  # configured without a limit
        rl2.check(Principal("stranger"))  # not configured
        rl2.check(ANONYMOUS)


def test_disabled_config_has_no_limits() -> None:
    config = AuthConfig(enabled=False, keys=make_config(rate_limit_per_s=1.0, burst=1).keys)
    rl = RateLimiter(config, clock=FakeClock())
    for _ in range(10):
        rl.check(Principal("ingest"))


def test_buckets_are_per_key() -> None:
    clock = FakeClock()
    keys = tuple(
        ApiKeyCredential(k, hash_secret("x", iterations=FAST), (), rate_limit_per_s=1.0, burst=1)
        for k in ("a", "b")
    )
    rl = RateLimiter(AuthConfig(True, keys), clock=clock)
    rl.check(Principal("a"))
    rl.check(Principal("b"))
    with pytest.raises(RateLimitedError):
        rl.check(Principal("a"))


def test_clock_going_backwards_does_not_mint_tokens() -> None:
    rl, clock, p = limiter(rate=1.0, burst=1)
    rl.check(p)
    clock.now -= 50
    with pytest.raises(RateLimitedError):
        rl.check(p)


def test_rate_limited_error_odd_waits() -> None:
    assert RateLimitedError("m", 0.0).headers["Retry-After"] == "1"
    assert RateLimitedError("m", float("inf")).headers["Retry-After"] == "1"
    assert RateLimitedError("m", 61.2).headers["Retry-After"] == "62"


# --------------------------------------------------------------------------- dev key and CLI


def test_generate_dev_key(pbkdf2_calls: list[bytes]) -> None:
    token, secret_hash = generate_dev_key()
    key_id, _, secret = token.partition(".")
    assert key_id == "dev" and len(secret) >= 40
    assert secret_hash.startswith("pbkdf2_sha256$200000$")
    auth = HttpAuthenticator(AuthConfig(True, (ApiKeyCredential(key_id, secret_hash, ALL_ACCESS),)))
    p = auth.authenticate(f"Bearer {token}")
    auth.authorize(p, Action.ADMIN, None)
    assert generate_dev_key()[0] != token
    with pytest.raises(ValueError):
        generate_dev_key("bad.id")


def test_cli_hash_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("my secret\n"))
    assert _auth.main(["hash-secret"]) == 0
    assert verify_secret("my secret", capsys.readouterr().out.strip())


def test_cli_new_key_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert _auth.main(["new-key", "svc"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    secret = lines["secret"].strip()
    assert lines["bearer"].strip() == f"svc.{secret}"
    assert verify_secret(secret, lines["secret_hash"].strip().strip('"'))
    assert _auth.main(["new-key", "bad.id"]) == 2
    assert _auth.main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_public_names() -> None:
    for name in _auth.__all__:
        assert hasattr(_auth, name), name


def test_gateway_config_needs_auth_or_an_explicit_no_auth() -> None:
    """Used as a library (not through the CLI), the gateway does not default to open."""
    from ingest_gateway import GatewayConfig

    with pytest.raises(ValueError, match="no auth_config: pass the API key file"):
        GatewayConfig(bootstrap="127.0.0.1:9092")
    with pytest.raises(ValueError, match="contradict"):
        GatewayConfig(bootstrap="127.0.0.1:9092", auth_config="auth.toml", no_auth=True)
    assert GatewayConfig(bootstrap="127.0.0.1:9092", no_auth=True).auth_config is None
    assert GatewayConfig(bootstrap="h:1", auth_config="a.toml").no_auth is False
