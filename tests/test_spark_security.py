"""The Spark source, the exactly-once sink and the tiering job on a secured broker:
SASL_SSL with SCRAM, the authorizer on, the Spark principal allowed only what it needs
(READ on the source topic; WRITE on the target topic and on the PREFIXED transactional
id ``strata-sink:``, under which the exactly-once sink commits).

The options are Kafka's names (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config``) plus the CA file; what a wrong or missing setting gives is
checked without Spark at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokers.coordination import ZooKeeperClient
from spark_source._errors import StrataSparkOptionError
from spark_source._options import parse_source_options
from strata.client import AclEntry, Admin, Consumer, NewTopic, Producer, TopicPartition
from strata_tools.certs import CertificateAuthority
from tests.support.broker_process import BrokerProcess
from wire.sasl import scram_credential
from wire.security import ClientSecurity
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(300)]


class Secured:
    def __init__(self, broker: BrokerProcess, ca: Path) -> None:
        self.broker, self.ca = broker, ca
        self.bootstrap = broker.address("SASL_SSL")

    def security(self, user: str, password: str) -> ClientSecurity:
        return ClientSecurity("SASL_SSL", "SCRAM-SHA-256", user, password,
                              ssl_cafile=str(self.ca))

    def spark_options(self, user: str, password: str) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-256",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule"
                                      f' required username="{user}" password="{password}";',
            "ssl.ca.location": str(self.ca),
        }


@pytest.fixture(scope="module")
def secured(zookeeper_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("spark-pki")
    ca = CertificateAuthority.create(root / "ca")
    cert = ca.issue(root, "broker")
    coordinator = ZooKeeperClient(zookeeper_server.connect_string)
    coordinator.start()
    try:
        for user, password in (("admin", "admin-pw"), ("spark", "spark-pw")):
            coordinator.put_scram_credential(user, scram_credential("SCRAM-SHA-256", password))
    finally:
        coordinator.stop()
    broker = BrokerProcess(zookeeper_server.connect_string, tmp_path_factory.mktemp("sb"), 7,
                           listeners=("SASL_SSL",), overrides={
                               "ssl.certfile": str(cert.certfile),
                               "ssl.keyfile": str(cert.keyfile),
                               "inter.broker.sasl.username": "admin",
                               "inter.broker.sasl.password": "admin-pw",
                               "authorizer.enable": "true",
                               "super.users": "User:admin"})
    broker.start()
    try:
        yield Secured(broker, ca.certfile)
    finally:
        broker.kill()


def test_source_and_exactly_once_sink_on_a_secured_broker(spark: Any,
                                                          secured: Secured) -> None:
    source, target = f"sec-in-{uuid.uuid4().hex[:6]}", f"sec-out-{uuid.uuid4().hex[:6]}"
    admin_security = secured.security("admin", "admin-pw")
    with Admin(secured.bootstrap, security=admin_security) as admin:
        admin.create_topics([NewTopic(source, 2, 1), NewTopic(target, 2, 1)])
        admin.create_acls([
            AclEntry("TOPIC", "LITERAL", source, "User:spark", "*", "READ", "ALLOW"),
            AclEntry("TOPIC", "LITERAL", target, "User:spark", "*", "WRITE", "ALLOW"),
            AclEntry("TOPIC", "LITERAL", target, "User:spark", "*", "DESCRIBE", "ALLOW")])
    with Producer(secured.bootstrap, security=admin_security) as producer:
        for i in range(500):
            producer.send(source, f"r{i}".encode(), partition=i % 2)
        producer.flush()
    options = secured.spark_options("spark", "spark-pw")
    frame = spark.read.format("strata").options(**options).option("subscribe", source).load()
    assert frame.count() == 500
    # The exactly-once sink (stage, then commit through the driver's committer) commits
    # in a transaction: without WRITE on its transactional id it is refused, with
    # Kafka's code, and nothing is written.
    with pytest.raises(Exception, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        (frame.select("value").write.format("strata").options(**options)
         .option("topic", target).mode("append").save())
    with Admin(secured.bootstrap, security=admin_security) as admin:
        admin.create_acls([AclEntry("TRANSACTIONAL_ID", "PREFIXED", "strata-sink:",
                                    "User:spark", "*", "WRITE", "ALLOW")])
    (frame.select("value").write.format("strata").options(**options)
     .option("topic", target).mode("append").save())
    with Consumer(secured.bootstrap, security=admin_security,
                  auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(target, 0), TopicPartition(target, 1)])
        got: list[bytes] = []
        for _ in range(40):
            got.extend(r.value for r in consumer.poll(timeout_ms=250))
            if len(got) >= 500:
                break
    assert sorted(got) == sorted(f"r{i}".encode() for i in range(500))
    # Without READ on the topic the same read is refused, with Kafka's code.
    with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED"):
        spark.read.format("strata").options(**options).option("subscribe", target) \
            .load().count()


def test_security_options_are_checked_before_anything_connects() -> None:
    base = {"bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    parsed = parse_source_options({**base, "security.protocol": "sasl_ssl",
                                   "sasl.username": "u", "sasl.password": "p",
                                   "ssl.ca.location": "/ca.pem"}, streaming=False)
    assert parsed.security.protocol == "SASL_SSL" and parsed.security.username == "u"
    with pytest.raises(StrataSparkOptionError, match=r"kafka\.security\.protocol"):
        parse_source_options({**base, "kafka.security.protocol": "KERBEROS"}, streaming=False)
    with pytest.raises(StrataSparkOptionError, match="sasl_plain_username"):
        parse_source_options({**base, "kafka.security.protocol": "SASL_SSL"}, streaming=False)
    with pytest.raises(StrataSparkOptionError, match="security options"):
        parse_source_options({**base, "kafka.sasl.kerberos.service.name": "x"},
                             streaming=False)


def test_the_notebooks_read_a_secured_stack_with_its_admin_credentials(tmp_path: Path) -> None:
    """``find_stack`` keeps ``strata status``'s security object; the options the notebooks
    pass to ``format("strata")`` then carry SASL_SSL and the admin login."""
    from strata_tools.notebook import Stack

    stack = Stack(tmp_path, "127.0.0.1:1", None, None, tmp_path / "w", None, security={
        "security_protocol": "SASL_SSL", "ca": "/ca.crt", "admin_user": "admin",
        "admin_password": "pw", "client_config": "/admin.properties"})
    parsed = parse_source_options({**stack.source_options, "subscribe": "t"},
                                  streaming=True)
    assert parsed.security == stack.client_security
    assert (parsed.security.protocol, parsed.security.username,
            parsed.security.ssl_cafile) == ("SASL_SSL", "admin", "/ca.crt")
    plain = Stack(tmp_path, "127.0.0.1:1", None, None, tmp_path / "w", None)
    assert plain.source_options == {"bootstrap.servers": "127.0.0.1:1"}
    # What the tiering job hands its Spark reads: every configuration survives the trip.
    for security in (ClientSecurity("SSL", ssl_cafile="/ca", ssl_certfile="/c",
                                    ssl_keyfile="/k", ssl_check_hostname=False),
                     ClientSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", "u", "p")):
        assert ClientSecurity.from_properties(security.to_properties()) == security
