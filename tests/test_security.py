"""Broker security over real TCP: TLS listeners, SASL PLAIN and SCRAM logins, SCRAM users
kept in ZooKeeper, ACLs deciding every request, and hostile handshakes
(docs/security.md).

Two real brokers share one ZooKeeper. Each serves four listeners: SASL_SSL (the
inter-broker one: the brokers log in to each other as user ``broker``), PLAINTEXT, SSL
(client certificates requested) and SASL_PLAINTEXT. The certificates come from a private
CA made for the module (strata_tools/certs.py); a second CA, and a certificate that
expired yesterday, stand for what must be refused.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokers.config import BrokerConfig
from brokers.coordination import ZooKeeperClient
from procs import free_port
from strata.client import (
    AclEntry,
    AclFilterEntry,
    Admin,
    Consumer,
    FatalTransactionError,
    NewTopic,
    Producer,
    TopicPartition,
    TransactionalIdAuthorizationFailedError,
)
from strata_tools.certs import CertificateAuthority
from tests.support.broker_process import REPO, BrokerProcess
from wire.connection import BrokerConnection
from wire.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    InvalidConfigError,
    NetworkError,
    ResourceNotFoundError,
    SaslAuthenticationFailedError,
    StrataError,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
from wire.protocol import ApiKey, MetadataRequest, MetadataResponse
from wire.sasl import scram_credential
from wire.security import ClientSecurity
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LISTENERS = ("SASL_SSL", "PLAINTEXT", "SSL", "SASL_PLAINTEXT")
ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = CertificateAuthority.create(root / "ca")
        self.broker = self.ca.issue(root / "certs", "broker")
        self.client = self.ca.issue(root / "certs", "alice-client", hosts=())
        self.expired = self.ca.issue(
            root / "certs", "expired-client", hosts=(),
            validity=(datetime.timedelta(days=-10), datetime.timedelta(days=-1)))
        self.rogue_ca = CertificateAuthority.create(root / "rogue", "rogue CA")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def brokers(zookeeper_server: ZooKeeperServer, pki: Pki,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    coordinator = ZooKeeperClient(zookeeper_server.connect_string)
    coordinator.start()
    try:  # the first users go straight to ZooKeeper, as Kafka's bootstrap credentials do
        for user, password in ((ADMIN, ADMIN_PASSWORD), ("broker", "broker-secret")):
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                coordinator.put_scram_credential(user, scram_credential(mechanism, password))
    finally:
        coordinator.stop()
    started: list[BrokerProcess] = []
    try:
        for broker_id in (1, 2):
            started.append(BrokerProcess(
                zookeeper_server.connect_string, tmp_path_factory.mktemp(f"sec{broker_id}"),
                broker_id, listeners=LISTENERS, overrides={
                    "ssl.certfile": str(pki.broker.certfile),
                    "ssl.keyfile": str(pki.broker.keyfile),
                    "ssl.cafile": str(pki.ca.certfile),
                    "ssl.client.auth": "requested",
                    "inter.broker.sasl.username": "broker",
                    "inter.broker.sasl.password": "broker-secret",
                    "sasl.authentication.timeout.ms": "1500",
                    "authorizer.enable": "true",
                    "super.users": "User:admin;User:broker",
                }).start())
        yield started
    finally:
        for broker in started:
            broker.kill()


def sasl(protocol: str, pki: Pki, user: str = ADMIN, password: str = ADMIN_PASSWORD,
         mechanism: str = "SCRAM-SHA-256") -> ClientSecurity:
    return ClientSecurity(protocol, mechanism, user, password,
                          ssl_cafile=str(pki.ca.certfile) if "SSL" in protocol else None)


def bootstrap(brokers: list[BrokerProcess], listener: str) -> str:
    return ",".join(b.address(listener) for b in brokers)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def metadata(broker: BrokerProcess, listener: str, security: ClientSecurity
             ) -> MetadataResponse:
    async def ask() -> MetadataResponse:
        async with BrokerConnection("127.0.0.1", broker.ports[listener],
                                    security=security) as connection:
            answer = await connection.request(ApiKey.METADATA, MetadataRequest(None))
            assert isinstance(answer, MetadataResponse)
            return answer

    return asyncio.run(asyncio.wait_for(ask(), 30))


def login_eventually(broker: BrokerProcess, security: ClientSecurity) -> None:
    """Log in on the SASL_PLAINTEXT listener, waiting for a new user to reach the broker."""
    deadline = time.monotonic() + 10
    while True:
        try:
            metadata(broker, "SASL_PLAINTEXT", security)
            return
        except SaslAuthenticationFailedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ----------------------------------------------------------------------------- happy paths


def test_records_travel_over_sasl_ssl_and_replicate_between_secured_brokers(
        brokers: list[BrokerProcess], pki: Pki) -> None:
    """Two replicas, acks=all: the follower fetches over the SASL_SSL inter-broker
    listener, so an acknowledged write proves broker-to-broker TLS and SCRAM work; the
    consumer's fetches go through the TLS copying path (no sendfile)."""
    security = sasl("SASL_SSL", pki)
    topic = _name("secure")
    with Admin(bootstrap(brokers, "SASL_SSL"), security=security) as admin:
        # min.insync.replicas=2: no write is acknowledged unless the follower, fetching
        # over the SASL_SSL inter-broker listener, has it too.
        admin.create_topics([NewTopic(topic, 2, 2, {"min.insync.replicas": "2"})])
    values = [f"v{i}".encode() * 50 for i in range(2_000)]
    # Requests of several MiB too: the client hands them to TLS in 64 KiB pieces.
    bulk = [os.urandom(100) + i.to_bytes(4, "big") for i in range(60_000)]
    with Producer(bootstrap(brokers, "SASL_SSL"), acks="all", security=security) as producer:
        futures = [producer.send(topic, value) for value in values]
        bulk_sent = producer.send_batch(topic, bulk, partition=0)
        producer.flush()
    assert all(f.result(timeout=0).offset >= 0 for f in futures)
    assert sum(b.record_count for b in bulk_sent.result(timeout=0)) == len(bulk)
    values += bulk
    with Admin(bootstrap(brokers, "SASL_SSL"), security=security) as admin:
        described = admin.describe_topics([topic])[topic]
        assert [len(p.isr) for p in described.partitions] == [2, 2]
    got: list[bytes] = []
    with Consumer(bootstrap(brokers, "SASL_SSL"), security=security,
                  auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            got.extend(r.value for r in consumer.poll(timeout_ms=500))
    assert sorted(got) == sorted(values)


def test_metadata_names_the_listener_the_client_came_in_on(
        brokers: list[BrokerProcess], pki: Pki) -> None:
    for listener, security in (("PLAINTEXT", ClientSecurity()),
                               ("SASL_PLAINTEXT", sasl("SASL_PLAINTEXT", pki)),
                               ("SSL", ClientSecurity("SSL", ssl_cafile=str(pki.ca.certfile)))):
        answer = metadata(brokers[0], listener, security)
        ports = {b.node_id: b.port for b in answer.brokers}
        assert ports == {b.broker_id: b.ports[listener] for b in brokers}, listener


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_each_mechanism_logs_in_over_tls(brokers: list[BrokerProcess], pki: Pki,
                                         mechanism: str) -> None:
    answer = metadata(brokers[0], "SASL_SSL", sasl("SASL_SSL", pki, mechanism=mechanism))
    assert {b.node_id for b in answer.brokers} == {1, 2}


def test_mutual_tls_with_a_client_certificate(brokers: list[BrokerProcess], pki: Pki) -> None:
    security = ClientSecurity("SSL", ssl_cafile=str(pki.ca.certfile),
                              ssl_certfile=str(pki.client.certfile),
                              ssl_keyfile=str(pki.client.keyfile))
    assert metadata(brokers[0], "SSL", security).brokers


# ----------------------------------------------------------------------------- refusals


def test_wrong_password_and_unknown_user_are_refused_alike(
        brokers: list[BrokerProcess], pki: Pki) -> None:
    messages = []
    for user, password in ((ADMIN, "not-the-password"), ("nobody", "whatever")):
        with pytest.raises(SaslAuthenticationFailedError) as caught:
            metadata(brokers[0], "SASL_PLAINTEXT",
                     sasl("SASL_PLAINTEXT", pki, user=user, password=password))
        assert caught.value.code == 58
        assert "strata user create" in caught.value.message
        messages.append(caught.value.message)
    # The answer does not tell which users exist.
    assert messages[0] == messages[1]


def test_plain_is_not_offered_without_tls(brokers: list[BrokerProcess], pki: Pki) -> None:
    with pytest.raises(UnsupportedSaslMechanismError, match="only over TLS") as caught:
        metadata(brokers[0], "SASL_PLAINTEXT", sasl("SASL_PLAINTEXT", pki, mechanism="PLAIN"))
    assert caught.value.code == 33


def test_requests_before_the_login_are_refused_and_the_connection_closed(
        brokers: list[BrokerProcess]) -> None:
    async def attempt() -> None:
        async with BrokerConnection("127.0.0.1", brokers[0].ports["SASL_PLAINTEXT"]) as conn:
            with pytest.raises(IllegalSaslStateError, match="SaslHandshake") as caught:
                await conn.request(ApiKey.METADATA, MetadataRequest(None))
            assert caught.value.code == 34
            await asyncio.sleep(0.3)
            assert not conn.is_open, "the broker must close the connection"

    asyncio.run(asyncio.wait_for(attempt(), 30))


def test_plaintext_client_on_a_tls_listener_gets_nothing(brokers: list[BrokerProcess]) -> None:
    with pytest.raises(NetworkError):
        metadata(brokers[0], "SSL", ClientSecurity())


def test_untrusted_and_expired_certificates_are_refused(brokers: list[BrokerProcess],
                                                        pki: Pki) -> None:
    # The client does not trust a broker signed by another CA ...
    with pytest.raises(NetworkError, match="TLS to broker"):
        metadata(brokers[0], "SSL", ClientSecurity("SSL", ssl_cafile=str(pki.rogue_ca.certfile)))
    # ... and the broker refuses a client certificate that has expired.
    expired = ClientSecurity("SSL", ssl_cafile=str(pki.ca.certfile),
                             ssl_certfile=str(pki.expired.certfile),
                             ssl_keyfile=str(pki.expired.keyfile))
    with pytest.raises(NetworkError):
        metadata(brokers[0], "SSL", expired)
    rogue_client = pki.rogue_ca.issue(pki.rogue_ca.certfile.parent, "rogue-client", hosts=())
    with pytest.raises(NetworkError):
        metadata(brokers[0], "SSL", ClientSecurity(
            "SSL", ssl_cafile=str(pki.ca.certfile), ssl_certfile=str(rogue_client.certfile),
            ssl_keyfile=str(rogue_client.keyfile)))


# ----------------------------------------------------------------------------- users


def test_users_are_created_described_and_deleted_through_the_brokers(
        brokers: list[BrokerProcess], pki: Pki) -> None:
    user = _name("carol")
    with Admin(bootstrap(brokers, "SASL_SSL"), security=sasl("SASL_SSL", pki)) as admin:
        admin.upsert_scram_credential(user, "carol-pw")
        admin.upsert_scram_credential(user, "carol-pw-512", mechanism="SCRAM-SHA-512",
                                      iterations=8192)
        assert admin.describe_scram_credentials([user]) == {
            user: {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 8192}}
        login_eventually(brokers[1], sasl("SASL_PLAINTEXT", pki, user, "carol-pw"))
        admin.delete_scram_credential(user, "SCRAM-SHA-512")
        admin.delete_scram_credential(user, "SCRAM-SHA-256")
        with pytest.raises(ResourceNotFoundError, match="strata user create"):
            admin.describe_scram_credentials([user])
        with pytest.raises(ResourceNotFoundError):
            admin.delete_scram_credential(user)
        with pytest.raises(ValueError, match="iterations"):
            admin.upsert_scram_credential(user, "pw", iterations=10)
        with pytest.raises(StrataError, match="not a SCRAM mechanism"):
            admin.delete_scram_credential(user, "PLAIN")


def test_a_deleted_users_open_connections_stop_working(brokers: list[BrokerProcess],
                                                       pki: Pki) -> None:
    user = _name("dave")
    with Admin(bootstrap(brokers, "SASL_SSL"), security=sasl("SASL_SSL", pki)) as admin:
        admin.upsert_scram_credential(user, "dave-pw")

        async def logged_in_then_deleted() -> float:
            # A new credential reaches each broker through its ZooKeeper watch, a moment
            # after the broker that wrote it (as in Kafka).
            deadline = time.monotonic() + 10
            while True:
                conn = BrokerConnection("127.0.0.1", brokers[0].ports["SASL_PLAINTEXT"],
                                        security=sasl("SASL_PLAINTEXT", pki, user, "dave-pw"))
                try:
                    await conn.connect()
                    break
                except SaslAuthenticationFailedError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            await conn.request(ApiKey.METADATA, MetadataRequest(None))
            await asyncio.to_thread(admin.delete_scram_credential, user)
            began = time.monotonic()
            while conn.is_open and time.monotonic() - began < 10:
                await asyncio.sleep(0.05)
            assert not conn.is_open, "the deleted user's connection is still open"
            await conn.close()
            return time.monotonic() - began

        asyncio.run(logged_in_then_deleted())
    with pytest.raises(SaslAuthenticationFailedError):
        metadata(brokers[0], "SASL_PLAINTEXT", sasl("SASL_PLAINTEXT", pki, user, "dave-pw"))


# ----------------------------------------------------------------------------- hostile peers


def _raw(port: int, payload: bytes, *, tls: ssl.SSLContext | None = None,
         wait_s: float = 5.0) -> bytes:
    """Send ``payload`` and read until the broker closes (or ``wait_s`` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as raw:
        sock: Any = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw
        sock.sendall(payload)
        received = b""
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    return received
                received += chunk
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            return received
        raise AssertionError(f"port {port} kept the connection open for {wait_s} s")


def test_hostile_handshakes_never_crash_or_hang_a_broker(brokers: list[BrokerProcess],
                                                         pki: Pki) -> None:
    broker = brokers[0]
    tls = ssl.create_default_context(cafile=str(pki.ca.certfile))
    garbage = bytes(range(256)) * 4
    # Random bytes where a TLS ClientHello belongs, and a truncated ClientHello.
    _raw(broker.ports["SSL"], garbage)
    _raw(broker.ports["SASL_SSL"], b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    # SASL listeners: a huge frame before logging in; a handshake cut off mid-frame; a
    # SaslAuthenticate before any SaslHandshake; random bytes.
    _raw(broker.ports["SASL_PLAINTEXT"], struct.pack(">i", 50 << 20) + b"x" * 100)
    _raw(broker.ports["SASL_PLAINTEXT"], struct.pack(">i", 60) + b"\x00\x1b\x00")
    auth_first = struct.pack(">hhi", int(ApiKey.SASL_AUTHENTICATE), 0, 7) + \
        struct.pack(">h", 4) + b"evil" + struct.pack(">i", 3) + b"abc"
    answer = _raw(broker.ports["SASL_PLAINTEXT"],
                  struct.pack(">i", len(auth_first)) + auth_first)
    assert answer, "an out-of-order SaslAuthenticate gets an answer before the close"
    _raw(broker.ports["SASL_SSL"], garbage, tls=tls)
    # A peer that connects and says nothing is dropped after the login timeout (1.5 s).
    began = time.monotonic()
    _raw(broker.ports["SASL_PLAINTEXT"], b"", wait_s=10)
    assert time.monotonic() - began < 5
    # The broker still serves every listener.
    assert metadata(broker, "SASL_SSL", sasl("SASL_SSL", pki)).brokers
    assert metadata(broker, "PLAINTEXT", ClientSecurity()).brokers
    assert broker.process is not None and broker.process.poll() is None


# ----------------------------------------------------------------------------- ACLs


def _allow(principal: str, operation: str, resource_type: str, name: str,
           pattern: str = "LITERAL", permission: str = "ALLOW") -> AclEntry:
    return AclEntry(resource_type, pattern, name, principal, "*", operation, permission)


def _eventually(check: Any, timeout: float = 15.0) -> float:
    """Run ``check`` until it stops raising; the seconds it took. ACL changes reach each
    broker through a ZooKeeper watch, well within a second on a quiet machine; the bound
    here is generous because a loaded test machine must not fail the test (how fast a
    change applies is a figure, not an assertion)."""
    began = time.monotonic()
    while True:
        try:
            check()
            return time.monotonic() - began
        except (StrataError, AssertionError):
            if time.monotonic() - began > timeout:
                raise
            time.sleep(0.05)


def test_acls_decide_what_a_principal_may_do(brokers: list[BrokerProcess], pki: Pki) -> None:
    user = _name("erin")
    principal = f"User:{user}"
    topic, other, group = _name("acl"), _name("hidden"), _name("acl-group")
    admin_security = sasl("SASL_SSL", pki)
    erin = sasl("SASL_SSL", pki, user=user, password="erin-pw")
    servers = bootstrap(brokers, "SASL_SSL")
    with Admin(servers, security=admin_security) as admin:
        admin.upsert_scram_credential(user, "erin-pw")
        admin.create_topics([NewTopic(topic, 1, 2), NewTopic(other, 1, 2)])
        _eventually(lambda: metadata(brokers[0], "SASL_SSL", erin), timeout=10)

        def produce_one(name: str) -> None:
            with Producer(servers, security=erin, acks=1, enable_idempotence=False,
                          delivery_timeout_ms=5000, request_timeout_ms=3000) as producer:
                producer.send(name, b"x").result(timeout=10)

        # Nothing is allowed yet (allow.everyone.if.no.acl.found=false).
        with pytest.raises(TopicAuthorizationFailedError, match="strata acl add") as caught:
            produce_one(topic)
        assert caught.value.code == 29
        with Admin(servers, security=erin) as as_erin:
            with pytest.raises(TopicAuthorizationFailedError):
                as_erin.create_topics([NewTopic(_name("mine"), 1, 1)])
            with pytest.raises(TopicAuthorizationFailedError):
                as_erin.delete_topics([other])
            with pytest.raises(ClusterAuthorizationFailedError) as cluster:
                as_erin.upsert_scram_credential(user, "new-password")
            assert cluster.value.code == 31
            # Metadata does not even reveal that the topics exist.
            assert as_erin.list_topics() == []

        # WRITE on the topic: produce works, within the 2 s an ACL change may take.
        admin.create_acls([_allow(principal, "WRITE", "TOPIC", topic)])
        _eventually(lambda: produce_one(topic))
        with pytest.raises(TopicAuthorizationFailedError):
            produce_one(other)

        # READ on the topic and the group: a group member consumes what was written.
        def consume_as_member() -> list[bytes]:
            with Consumer(servers, security=erin, group_id=group,
                          auto_offset_reset="earliest") as consumer:
                consumer.subscribe([topic])
                deadline = time.monotonic() + 15
                got: list[bytes] = []
                while not got and time.monotonic() < deadline:
                    got = [r.value for r in consumer.poll(timeout_ms=500)]
                return got

        admin.create_acls([_allow(principal, "READ", "TOPIC", topic)])
        with pytest.raises(GroupAuthorizationFailedError) as grouped:
            consume_as_member()  # FindCoordinator needs DESCRIBE on the group first
        assert grouped.value.code == 30
        admin.create_acls([_allow(principal, "READ", "GROUP", group)])
        assert _eventually(consume_as_member, timeout=20)
        # Resetting the group's offsets takes ALTER on the group, not READ.
        with Admin(servers, security=erin) as as_erin, \
                pytest.raises(GroupAuthorizationFailedError):
            as_erin.reset_group_offsets(group, topic, "earliest", execute=True)

        # DENY wins over ALLOW.
        admin.create_acls([_allow(principal, "WRITE", "TOPIC", topic, permission="DENY")])
        def refused(name: str) -> None:
            try:
                produce_one(name)
            except TopicAuthorizationFailedError:
                return
            raise AssertionError(f"writing {name} is still allowed")

        _eventually(lambda: refused(topic))
        # A PREFIXED ALLOW covers every topic whose name starts with it.
        prefixed = f"{user}-"
        admin.create_topics([NewTopic(prefixed + "a", 1, 2)])
        admin.create_acls([_allow(principal, "WRITE", "TOPIC", prefixed, pattern="PREFIXED")])
        _eventually(lambda: produce_one(prefixed + "a"))

        listed = admin.describe_acls(AclFilterEntry(principal=principal))
        assert {(a.operation, a.resource_name, a.permission) for a in listed} == {
            ("WRITE", topic, "ALLOW"), ("READ", topic, "ALLOW"), ("READ", group, "ALLOW"),
            ("WRITE", topic, "DENY"), ("WRITE", prefixed, "ALLOW")}
        removed = admin.delete_acls([AclFilterEntry(principal=principal)])
        assert len(removed) == 5 and admin.describe_acls(
            AclFilterEntry(principal=principal)) == []
        with pytest.raises(StrataError, match="bad operation 'FLY'"):
            admin.create_acls([_allow(principal, "FLY", "TOPIC", topic)])
    # Every refusal left one line in the audit log, with principal, resource and client.
    refusals = [line for b in brokers for line in b.output
                if "refused: principal=" + principal in line]
    assert any(f"resource=TOPIC:{topic}" in line and "operation=WRITE" in line
               and "client=127.0.0.1:" in line for line in refusals), refusals[-5:]


# ----------------------------------------------------------------------------- the CLI


def _strata(*args: str, stdin: str | None = None, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "strata_tools.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_users_and_acls_from_the_command_line(brokers: list[BrokerProcess], pki: Pki,
                                              tmp_path: Path) -> None:
    config = tmp_path / "admin.properties"
    config.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
        f'username="{ADMIN}" password="{ADMIN_PASSWORD}";\n'
        f"ssl.ca.location={pki.ca.certfile}\n")
    common = ["--bootstrap", bootstrap(brokers, "SASL_SSL"), "--command-config", str(config)]
    user = _name("frank")
    made = _strata("user", "create", user, *common, stdin="frank-pw\n")
    assert made.returncode == 0, made.stderr
    listed = _strata("user", "list", *common, "--format", "json")
    assert {"user": user, "mechanisms": {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 4096}} in \
        json.loads(listed.stdout)
    added = _strata("acl", "add", *common, "--allow-principal", f"User:{user}",
                    "--operation", "read", "--operation", "describe", "--topic", "orders-",
                    "--resource-pattern-type", "prefixed")
    assert added.returncode == 0 and "2 binding(s) added" in added.stdout, added.stderr
    shown = _strata("acl", "list", *common, "--topic", "orders-eu", "--format", "json")
    assert {(a["operation"], a["pattern_type"]) for a in json.loads(shown.stdout)} >= {
        ("READ", "PREFIXED"), ("DESCRIBE", "PREFIXED")}
    refused = _strata("acl", "remove", *common)
    assert refused.returncode == 1 and "--force" in refused.stderr
    removed = _strata("acl", "remove", *common, "--allow-principal", f"User:{user}")
    assert removed.returncode == 0 and "2 binding(s) removed" in removed.stdout
    deleted = _strata("user", "delete", user, *common)
    assert deleted.returncode == 0, deleted.stderr
    # The same file through $STRATA_COMMAND_CONFIG; a plaintext client is refused there.
    via_env = _strata("topic", "list", "--bootstrap", bootstrap(brokers, "SASL_SSL"),
                      env={"STRATA_COMMAND_CONFIG": str(config)})
    assert via_env.returncode == 0, via_env.stderr
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\nsasl.kerberos=yes\n")
    wrong = _strata("topic", "list", "--bootstrap", bootstrap(brokers, "SASL_SSL"),
                    "--command-config", str(bad))
    assert wrong.returncode == 1 and "unknown key 'sasl.kerberos'" in wrong.stderr
    no_password = _strata("user", "create", _name("x"), *common, stdin="")
    assert no_password.returncode == 1 and "no password given" in no_password.stderr


def test_transactional_ids_need_their_own_acls(brokers: list[BrokerProcess], pki: Pki,
                                               tmp_path: Path) -> None:
    """Kafka's model: a transactional producer needs WRITE on its TRANSACTIONAL_ID (and on
    the topics); DESCRIBE on the id governs describing and listing it; aborting another
    producer's transaction is a coordinator's act (CLUSTER_ACTION)."""
    tina, dora = _name("tina"), _name("dora")
    topic, txn_id = _name("txn-acl"), f"{tina}-orders"
    servers = bootstrap(brokers, "SASL_SSL")
    as_tina = sasl("SASL_SSL", pki, user=tina, password="tina-pw")
    as_dora = sasl("SASL_SSL", pki, user=dora, password="dora-pw")
    config = tmp_path / "admin.properties"
    config.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                      f"sasl.username={ADMIN}\nsasl.password={ADMIN_PASSWORD}\n"
                      f"ssl.ca.location={pki.ca.certfile}\n")
    common = ["--bootstrap", servers, "--command-config", str(config)]
    with Admin(servers, security=sasl("SASL_SSL", pki)) as admin:
        admin.upsert_scram_credential(tina, "tina-pw")
        admin.upsert_scram_credential(dora, "dora-pw")
        admin.create_topics([NewTopic(topic, 2, 2)])
        admin.create_acls([_allow(f"User:{tina}", "WRITE", "TOPIC", topic),
                           _allow(f"User:{dora}", "READ", "TOPIC", topic)])
        _eventually(lambda: metadata(brokers[0], "SASL_SSL", as_tina), timeout=10)
        _eventually(lambda: metadata(brokers[0], "SASL_SSL", as_dora), timeout=10)

        def commit_one(value: bytes) -> None:
            """One transaction over both partitions: their leaders are the two brokers,
            so one is the coordinator's own (it writes that marker locally, as itself)."""
            with Producer(servers, security=as_tina, transactional_id=txn_id,
                          max_block_ms=5000) as producer:
                producer.init_transactions()
                with producer.transaction():
                    producer.send(topic, value, partition=0)
                    producer.send(topic, value, partition=1)

        # WRITE on the topic is not enough: the id itself must be allowed.
        with pytest.raises(FatalTransactionError) as fatal:
            commit_one(b"refused")
        cause = fatal.value.cause
        assert isinstance(cause, TransactionalIdAuthorizationFailedError) and cause.code == 53
        assert f"strata acl add --allow-principal User:{tina}" in str(cause)
        assert f"--transactional-id {txn_id}" in str(cause) and "needs WRITE" in str(cause)

        # WRITE on the id (every id starting with the user's name), from the command line.
        added = _strata("acl", "add", *common, "--allow-principal", f"User:{tina}",
                        "--operation", "write", "--transactional-id", f"{tina}-",
                        "--resource-pattern-type", "prefixed")
        assert added.returncode == 0 and "1 binding(s) added" in added.stdout, added.stderr
        shown = _strata("acl", "list", *common, "--transactional-id", txn_id,
                        "--format", "json")
        assert [(a["resource_type"], a["pattern_type"], a["operation"])
                for a in json.loads(shown.stdout)] == [("TRANSACTIONAL_ID", "PREFIXED",
                                                        "WRITE")]
        wrong = _strata("acl", "add", *common, "--allow-principal", f"User:{tina}",
                        "--operation", "READ", "--transactional-id", txn_id)
        assert wrong.returncode == 1 and "use WRITE, DESCRIBE, ALL" in wrong.stderr
        _eventually(lambda: commit_one(b"committed"), timeout=20)
        with Consumer(servers, security=sasl("SASL_SSL", pki), auto_offset_reset="earliest",
                      isolation_level="read_committed") as consumer:
            consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
            got: list[bytes | None] = []
            deadline = time.monotonic() + 15
            while len(got) < 2 and time.monotonic() < deadline:
                got += [r.value for r in consumer.poll(timeout_ms=500)]
        assert got == [b"committed", b"committed"]
        leaders = {p.leader for p in admin.describe_topics([topic])[topic].partitions}
        assert leaders == {b.broker_id for b in brokers}
        _eventually(lambda: _assert(admin.describe_transactions([txn_id])[txn_id].state
                                    == "CompleteCommit"))

        # DESCRIBE governs describe and list: nothing for dora until she has it.
        with Admin(servers, security=as_dora) as as_dora_admin:
            with pytest.raises(TransactionalIdAuthorizationFailedError) as hidden:
                as_dora_admin.describe_transactions([txn_id])
            assert hidden.value.code == 53
            assert txn_id not in {t.transactional_id
                                  for t in as_dora_admin.list_transactions()}
            admin.create_acls([_allow(f"User:{dora}", "DESCRIBE", "TRANSACTIONAL_ID",
                                      txn_id)])
            _eventually(lambda: as_dora_admin.describe_transactions([txn_id]))
            assert txn_id in {t.transactional_id for t in as_dora_admin.list_transactions()}
            # DESCRIBE does not let her use the id.
            with pytest.raises(FatalTransactionError) as not_hers, \
                    Producer(servers, security=as_dora, transactional_id=txn_id,
                             max_block_ms=5000) as producer:
                producer.init_transactions()
            assert not_hers.value.cause is not None and not_hers.value.cause.code == 53
            assert "--operation WRITE" in str(not_hers.value.cause)
            # READ on the topic shows its producers; aborting is a coordinator's act.
            opener = Producer(servers, security=as_tina, transactional_id=f"{tina}-open")
            try:
                opener.init_transactions()
                opener.begin_transaction()
                opener.send(topic, b"open", partition=1)
                opener.flush()
                open_at = [p.current_txn_start_offset
                           for p in as_dora_admin.describe_producers(topic, 1)
                           if p.current_txn_start_offset is not None]
                assert len(open_at) == 1
                with pytest.raises(ClusterAuthorizationFailedError, match="CLUSTER_ACTION"):
                    as_dora_admin.abort_transaction(topic, 1, open_at[0])
                opener.abort_transaction()
            finally:
                opener.close()


# ----------------------------------------------------------------------------- ZooKeeper


def test_zookeeper_acls_keep_other_clients_from_changing_cluster_state(
        tmp_path: Path, kazoo_factory: Any) -> None:
    """With zookeeper.set.acl the broker logs in to ZooKeeper (digest) and what it
    creates is writable by it only; the SCRAM credentials are not even readable."""
    from kazoo.exceptions import NoAuthError

    server = ZooKeeperServer(tmp_path / "zk", free_port(), start_timeout=60)
    server.start()
    broker = BrokerProcess(server.connect_string, tmp_path / "b", 3, overrides={
        "zookeeper.set.acl": "true", "zookeeper.digest.username": "strata-brokers",
        "zookeeper.digest.password": "zk-secret"})
    try:
        broker.start()
        with Admin(broker.bootstrap) as admin:
            admin.create_topics([NewTopic("guarded", 1, 1)])
            admin.upsert_scram_credential("gina", "gina-pw")
        intruder = kazoo_factory(server.connect_string)
        path = "/strata/brokers/topics/guarded"
        assert intruder.get(path)[0]  # readable ...
        with pytest.raises(NoAuthError):  # ... but not writable
            intruder.set(path, b"{}")
        with pytest.raises(NoAuthError):
            intruder.delete(path + "/partitions/0/state")
        with pytest.raises(NoAuthError):
            intruder.create("/strata/brokers/topics/planted", b"{}")
        with pytest.raises(NoAuthError):
            intruder.get("/strata/config/users/gina")
        # The broker itself still works with everything it created.
        with Producer(broker.bootstrap) as producer:
            assert producer.send("guarded", b"ok").result(timeout=30).offset == 0
    finally:
        broker.kill()
        server.stop(grace=5.0)
    with pytest.raises(InvalidConfigError, match=r"zookeeper\.digest\.username"):
        BrokerConfig.from_mapping({"zookeeper.set.acl": "true"})


# ----------------------------------------------------------------------------- quotas


def test_quotas_throttle_produce_fetch_and_requests(brokers: list[BrokerProcess], pki: Pki,
                                                    tmp_path: Path) -> None:
    """Over its byte-rate quota a principal's Produce and Fetch answers carry
    throttle_time_ms, and its next request waits that long (the broker stops reading the
    connection and the client holds back); a request-rate quota per client id throttles
    too. Only lower bounds on time are asserted: a slow machine cannot make them fail."""
    from wire.protocol import (
        FetchPartition,
        FetchRequest,
        FetchResponse,
        FetchTopic,
        ProducePartition,
        ProduceRequest,
        ProduceResponse,
        ProduceTopic,
    )
    from wire.record_batch import build_batch

    user, topic = _name("quinn"), _name("quota")
    servers = bootstrap(brokers, "SASL_SSL")
    with Admin(servers, security=sasl("SASL_SSL", pki)) as admin:
        admin.upsert_scram_credential(user, "quinn-pw")
        admin.create_topics([NewTopic(topic, 1, 1)])
        admin.create_acls([_allow(f"User:{user}", op, "TOPIC", topic)
                           for op in ("WRITE", "READ")])
        admin.alter_client_quotas(user=user, set={"producer_byte_rate": 100_000,
                                                  "consumer_byte_rate": 100_000})
        admin.alter_client_quotas(client_id="chatty", set={"request_rate": 5})
        assert admin.describe_client_quotas()[(user, None)] == {
            "producer_byte_rate": 100_000, "consumer_byte_rate": 100_000}
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    broker = next(b for b in brokers if b.broker_id == leader)
    batch = build_batch([bytes(1000)] * 300)  # 300 KB: three seconds' worth of quota

    async def exercise() -> tuple[int, float, int]:
        deadline = time.monotonic() + 10
        while True:  # the quota and the new user reach the broker by watch
            try:
                conn = BrokerConnection("127.0.0.1", broker.ports["SASL_PLAINTEXT"],
                                        security=sasl("SASL_PLAINTEXT", pki, user, "quinn-pw"))
                await conn.connect()
            except SaslAuthenticationFailedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            produced = await conn.request(ApiKey.PRODUCE, ProduceRequest(
                1, 10_000, [ProduceTopic(topic, [ProducePartition(0, batch)])]))
            assert isinstance(produced, ProduceResponse)
            assert produced.topics[0].partitions[0].error_code == 0
            if produced.throttle_time_ms > 0 or time.monotonic() > deadline:
                break
            await conn.close()
        began = time.monotonic()
        fetched = await conn.request(ApiKey.FETCH, FetchRequest(
            [FetchTopic(topic, [FetchPartition(0, 0, 1 << 20)])], max_wait_ms=0,
            min_bytes=1, max_bytes=1 << 20))
        waited = time.monotonic() - began
        assert isinstance(fetched, FetchResponse)
        assert fetched.topics[0].partitions[0].error_code == 0
        await conn.close()
        return produced.throttle_time_ms, waited, fetched.throttle_time_ms

    produce_throttle, waited, fetch_throttle = asyncio.run(asyncio.wait_for(exercise(), 60))
    assert produce_throttle >= 1000, produce_throttle  # ~2 s over a 1 s window
    assert waited >= produce_throttle / 1000 * 0.9  # the next request waited it out
    assert fetch_throttle >= 1000, fetch_throttle

    async def chatter() -> float:
        async with BrokerConnection("127.0.0.1", broker.ports["PLAINTEXT"],
                                    client_id="chatty") as conn:
            began = time.monotonic()
            for _ in range(20):
                await conn.request(ApiKey.METADATA, MetadataRequest([]))
            return time.monotonic() - began

    # 20 requests at 5 a second: at least two seconds however fast the machine is.
    assert asyncio.run(asyncio.wait_for(chatter(), 60)) >= 2.0
    with Admin(servers, security=sasl("SASL_SSL", pki)) as admin:
        admin.alter_client_quotas(client_id="chatty", remove=["request_rate"])
        with pytest.raises(StrataError, match="is not one of"):
            admin.alter_client_quotas(user=user, set={"bytes_per_fortnight": 1})
    config = tmp_path / "admin.properties"
    config.write_text(f"security.protocol=SASL_SSL\nsasl.username={ADMIN}\n"
                      f"sasl.password={ADMIN_PASSWORD}\nssl.ca.location={pki.ca.certfile}\n")
    common = ["--bootstrap", servers, "--command-config", str(config)]
    assert _strata("quota", "set", "--user", "<default>", "--request-rate", "1000",
                   *common).returncode == 0
    listed = _strata("quota", "list", *common, "--format", "json")
    assert {"user": "<default>", "client_id": None, "request_rate": 1000} in \
        json.loads(listed.stdout), listed.stderr
    assert _strata("quota", "remove", "--user", "<default>", "request_rate",
                   *common).returncode == 0
    bad = _strata("quota", "set", "--user", user, "--producer-byte-rate", "0", *common)
    assert bad.returncode == 1 and "above 0" in bad.stderr


def test_a_client_certificate_is_the_principal_acls_see(brokers: list[BrokerProcess],
                                                        pki: Pki) -> None:
    topic = _name("mtls")
    with Admin(bootstrap(brokers, "SASL_SSL"), security=sasl("SASL_SSL", pki)) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
        admin.create_acls([_allow("User:CN=alice-client", "DESCRIBE", "TOPIC", topic)])
    with_cert = ClientSecurity("SSL", ssl_cafile=str(pki.ca.certfile),
                               ssl_certfile=str(pki.client.certfile),
                               ssl_keyfile=str(pki.client.keyfile))
    without = ClientSecurity("SSL", ssl_cafile=str(pki.ca.certfile))

    def visible(security: ClientSecurity) -> set[str]:
        return {t.name for t in metadata(brokers[0], "SSL", security).topics}

    _eventually(lambda: _assert(topic in visible(with_cert)))
    assert topic not in visible(without)  # User:ANONYMOUS may not describe it


def _assert(condition: bool) -> None:
    assert condition


def test_sessions_end_after_connections_max_reauth_ms_and_plain_can_be_allowed(
        tmp_path: Path) -> None:
    """A ZooKeeper and broker of their own: SASL sessions last one second, and PLAIN is
    allowed on the SASL_PLAINTEXT listener because the broker says so."""
    server = ZooKeeperServer(tmp_path / "zk", free_port(), start_timeout=60)
    server.start()
    broker = BrokerProcess(server.connect_string, tmp_path / "reauth", 9,
                           listeners=("SASL_PLAINTEXT",), overrides={
                               "inter.broker.sasl.username": ADMIN,
                               "inter.broker.sasl.password": ADMIN_PASSWORD,
                               "connections.max.reauth.ms": "1000",
                               "sasl.plain.allow.plaintext": "true"})
    try:
        coordinator = ZooKeeperClient(server.connect_string)
        coordinator.start()
        try:
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                coordinator.put_scram_credential(
                    ADMIN, scram_credential(mechanism, ADMIN_PASSWORD))
        finally:
            coordinator.stop()
        broker.start()

        async def session() -> tuple[float, bool]:
            conn = BrokerConnection("127.0.0.1", broker.port, security=ClientSecurity(
                "SASL_PLAINTEXT", "PLAIN", ADMIN, ADMIN_PASSWORD))
            began = time.monotonic()
            await conn.connect()
            await conn.request(ApiKey.METADATA, MetadataRequest(None))
            while conn.is_open and time.monotonic() - began < 10:
                await asyncio.sleep(0.05)
            open_after = conn.is_open
            await conn.close()
            return time.monotonic() - began, open_after

        lasted, still_open = asyncio.run(asyncio.wait_for(session(), 30))
        assert not still_open and lasted >= 1.0
        # A new connection logs in again and works.
        async def again() -> int:
            async with BrokerConnection("127.0.0.1", broker.port, security=ClientSecurity(
                    "SASL_PLAINTEXT", "SCRAM-SHA-512", ADMIN, ADMIN_PASSWORD)) as conn:
                answer = await conn.request(ApiKey.METADATA, MetadataRequest(None))
                assert isinstance(answer, MetadataResponse)
                return len(answer.brokers)

        assert asyncio.run(asyncio.wait_for(again(), 30)) >= 1
    finally:
        broker.kill()
        server.stop(grace=5.0)


# ----------------------------------------------------------------------------- faults


def test_a_secured_cluster_fails_over_and_the_killed_broker_catches_up(
        brokers: list[BrokerProcess], pki: Pki) -> None:
    """SIGKILL the leader of a two-replica topic: the other broker takes over, writes go
    on over SASL_SSL, and the restarted broker copies what it missed over the SASL_SSL
    inter-broker listener until it is back in the ISR. Runs last in the module: it
    restarts a shared broker."""
    security = sasl("SASL_SSL", pki)
    servers = bootstrap(brokers, "SASL_SSL")
    topic = _name("failover")
    with Admin(servers, security=security) as admin:
        admin.create_topics([NewTopic(topic, 1, 2)])
        leader_id = admin.describe_topics([topic])[topic].partitions[0].leader
    victim = next(b for b in brokers if b.broker_id == leader_id)
    with Producer(servers, security=security, acks="all") as producer:
        before = [producer.send(topic, f"a{i}".encode()) for i in range(200)]
        producer.flush()
        assert all(f.result(timeout=0).offset >= 0 for f in before)
        victim.kill()
        after = [producer.send(topic, f"b{i}".encode()) for i in range(200)]
        producer.flush()
        assert all(f.result(timeout=0).offset >= 0 for f in after)
    victim.restart()

    def back_in_sync() -> None:
        with Admin(servers, security=security) as admin:
            partition = admin.describe_topics([topic])[topic].partitions[0]
            assert sorted(partition.isr) == sorted(b.broker_id for b in brokers)

    _eventually(back_in_sync, timeout=60)
    with Consumer(servers, security=security, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 400 and time.monotonic() < deadline:
            got.extend(r.value for r in consumer.poll(timeout_ms=500))
    assert got == [f"a{i}".encode() for i in range(200)] + [f"b{i}".encode() for i in range(200)]


def test_acls_decide_who_may_use_the_schema_registry(brokers: list[BrokerProcess],
                                                      pki: Pki) -> None:
    """Registry reads need DESCRIBE and changes ALTER, on the subject's topic or the
    cluster. A user who may not see ``__schemas`` in its metadata still reaches the
    registry: any broker passes the request on to the registry's leader."""
    user = _name("gus")
    topic = _name("typed")
    subject = f"{topic}-value"
    schema = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "x", "type": "long"}]})
    servers = bootstrap(brokers, "SASL_SSL")
    gus = sasl("SASL_SSL", pki, user=user, password="gus-pw")
    with Admin(servers, security=sasl("SASL_SSL", pki)) as admin:
        admin.upsert_scram_credential(user, "gus-pw")
        admin.create_topics([NewTopic(topic, 1, 2, {"value.schema.subject": subject})])
        admin.register_schema(subject, schema)
        _eventually(lambda: metadata(brokers[0], "SASL_SSL", gus), timeout=10)
        with Admin(servers, security=gus, request_timeout_ms=10_000) as as_gus:
            with pytest.raises(TopicAuthorizationFailedError, match="DESCRIBE"):
                as_gus.get_schema(subject)
            with pytest.raises(ClusterAuthorizationFailedError):
                as_gus.list_subjects()
            admin.create_acls([_allow(f"User:{user}", "DESCRIBE", "TOPIC", topic)])
            _eventually(lambda: as_gus.get_schema(subject))
            assert as_gus.get_schema(subject).version == 1
            with pytest.raises(TopicAuthorizationFailedError, match="ALTER"):
                as_gus.register_schema(subject, schema.replace('"R"', '"R2"'))
            admin.create_acls([_allow(f"User:{user}", "ALTER", "TOPIC", topic)])
            _eventually(lambda: as_gus.set_compatibility("FULL", subject))
            assert as_gus.get_compatibility(subject) == "FULL"
        # READ on the topic is enough to consume its typed values: the subject comes in
        # the metadata and the schemas through the subject, not by id (cluster-level).
        with Producer(servers, security=sasl("SASL_SSL", pki)) as producer:
            producer.send(topic, {"x": 42}).result(timeout=30)
        admin.create_acls([_allow(f"User:{user}", "READ", "TOPIC", topic)])

        def consume_typed() -> list[object]:
            with Consumer(servers, security=gus, auto_offset_reset="earliest") as consumer:
                consumer.assign([TopicPartition(topic, 0)])
                return [r.value for r in consumer.poll(timeout_ms=5000)]

        _eventually(lambda: _nonempty(consume_typed()))
        assert consume_typed() == [{"x": 42}]


def _nonempty(values: list[object]) -> None:
    assert values
