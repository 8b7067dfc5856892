"""SASL PLAIN and SCRAM (wire/sasl.py) without a broker: RFC 7677's worked example,
both sides against each other, and malformed or forged messages refused."""

from __future__ import annotations

import base64

import pytest

from wire.errors import IllegalSaslStateError, SaslAuthenticationFailedError
from wire.sasl import (
    ScramClient,
    ScramCredential,
    ScramServer,
    check_plain,
    credential_from_salted,
    parse_plain,
    plain_message,
    salted_password,
    scram_credential,
)

pytestmark = pytest.mark.unit

SECRET = b"k" * 32


def test_rfc7677_example_verifies_on_both_sides() -> None:
    """RFC 7677 section 3: user "user", password "pencil", SCRAM-SHA-256."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = scram_credential("SCRAM-SHA-256", "pencil", salt=salt, iterations=4096)
    client = ScramClient("SCRAM-SHA-256", "user", "pencil")
    client._nonce = "rOprNGfwEbeRWgbNEkqO"  # the RFC's client nonce
    client._first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    # The stored credential is what the broker derives from the salted password alone.
    assert credential_from_salted("SCRAM-SHA-256", salt, 4096, salted_password(
        "SCRAM-SHA-256", "pencil", salt, 4096)) == credential


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_client_and_server_agree_and_the_server_learns_the_principal(mechanism: str) -> None:
    credential = scram_credential(mechanism, "s3cret,=")
    server = ScramServer(mechanism, {"a,b=c": credential}.get, secret=SECRET)
    client = ScramClient(mechanism, "a,b=c", "s3cret,=")  # names that need escaping
    client.verify(server.step(client.final(server.step(client.first()))))
    assert server.principal == "a,b=c"
    with pytest.raises(IllegalSaslStateError):
        server.step(b"n,,n=a,r=x")


def _exchange(credential: ScramCredential | None, user: str, password: str) -> str:
    server = ScramServer("SCRAM-SHA-256", lambda _: credential, secret=SECRET)
    client = ScramClient("SCRAM-SHA-256", user, password)
    with pytest.raises(SaslAuthenticationFailedError) as caught:
        server.step(client.final(server.step(client.first())))
    assert server.principal is None
    return caught.value.message


def test_wrong_password_and_unknown_user_fail_the_same_way() -> None:
    credential = scram_credential("SCRAM-SHA-256", "right")
    assert _exchange(credential, "u", "wrong") == _exchange(None, "ghost", "wrong")


@pytest.mark.parametrize("first", [
    b"p=tls-unique,,n=u,r=abc", b"n,a=other,n=u,r=abc", b"n,,n=u", b"n,,r=abc,n=u",
    b"n,,n=u,r=abc,x=ext", b"n,,n=bad=escape,r=abc", b"\xff\xfe", b"n,," + b"x" * 5000,
])
def test_malformed_client_first_messages_are_refused(first: bytes) -> None:
    server = ScramServer("SCRAM-SHA-256", lambda _: None, secret=SECRET)
    with pytest.raises(SaslAuthenticationFailedError):
        server.step(first)


def test_a_replayed_or_forged_final_message_is_refused() -> None:
    credential = scram_credential("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", lambda _: credential, secret=SECRET)
    client = ScramClient("SCRAM-SHA-256", "u", "pw")
    final = client.final(server.step(client.first()))
    forged = final.replace(b"c=biws", b"c=eSws")  # channel binding changed
    with pytest.raises(SaslAuthenticationFailedError, match="biws"):
        server.step(forged)
    # Another server's nonce: a final message from an earlier exchange does not fit.
    other = ScramServer("SCRAM-SHA-256", lambda _: credential, secret=SECRET)
    other.step(client.first())
    with pytest.raises(SaslAuthenticationFailedError, match="nonce"):
        other.step(final)


def test_plain_messages_and_checks() -> None:
    assert parse_plain(plain_message("alice", "pw")) == ("alice", "pw")
    assert parse_plain(b"alice\0alice\0pw") == ("alice", "pw")
    for bad in (b"alice\0pw", b"\0\0pw", b"bob\0alice\0pw", b"\0alice\0"):
        with pytest.raises(SaslAuthenticationFailedError):
            parse_plain(bad)
    credential = scram_credential("SCRAM-SHA-512", "pw")
    assert check_plain(credential, "pw") and not check_plain(credential, "pW")
    assert not check_plain(None, "pw")
