"""Stock Kafka clients on a secured Kafka listener (issue [3.6], item 1).

A secured cluster (``Cluster(secure=True)``, as ``strata up --secure``: SASL_SSL, SCRAM
users, the authorizer on) whose broker also opens a KAFKA_SASL_SSL listener. librdkafka
logs in with SCRAM-SHA-512 and SCRAM-SHA-256 over TLS, checking the broker's certificate
against the cluster's CA; the principals, ACLs and errors are Strata's own:

* ``admin`` (a super user) creates a topic; ``app`` writes idempotently and reads the
  ``faults-*`` topics its ACLs allow;
* ``app`` writing to a topic outside its ACLs gets TOPIC_AUTHORIZATION_FAILED;
* a wrong password fails the login (and nothing is written);
* plaintext to the TLS port does not get a session.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as KConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as KProducer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import Cluster, ClusterSecurity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kafka-secure"), brokers=1, secure=True,
                 kafka=True) as c:
        yield c


def settings(cluster: Cluster, user: str, mechanism: str = "SCRAM-SHA-512",
             password: str | None = None) -> dict[str, Any]:
    assert cluster.security is not None
    return {"bootstrap.servers": cluster.kafka_bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanisms": mechanism, "sasl.username": user,
            "sasl.password": password or ClusterSecurity.USERS[user],
            "ssl.ca.location": str(cluster.security.ca.certfile)}


def test_scram_users_write_and_read_within_their_acls(cluster: Cluster) -> None:
    admin = AdminClient(settings(cluster, "admin"))
    for name in ("faults-kafka", "private"):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    producer = KProducer({**settings(cluster, "app", "SCRAM-SHA-256"), "acks": "all",
                          "enable.idempotence": True})
    delivered: list[Any] = []
    for i in range(20):
        producer.produce("faults-kafka", value=b"s%d" % i,
                         on_delivery=lambda err, msg: delivered.append(err or msg.offset()))
    assert producer.flush(30) == 0
    assert delivered == list(range(20))
    refused: list[Any] = []
    producer.produce("private", value=b"no", on_delivery=lambda err, msg: refused.append(err))
    producer.flush(30)
    assert [e.code() for e in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    consumer = KConsumer({**settings(cluster, "app"), "group.id": "faults-readers",
                          "enable.auto.commit": False})
    consumer.assign([TopicPartition("faults-kafka", 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(read) < 20 and time.monotonic() < deadline:
        read += [m.value() for m in consumer.consume(20, 1.0) if m.error() is None]
    consumer.close()
    assert read == [b"s%d" % i for i in range(20)]


def test_a_wrong_password_gets_no_session(cluster: Cluster) -> None:
    errors: list[Any] = []
    admin = AdminClient({**settings(cluster, "app", password="not-the-password"),
                         "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(0.5)
    # librdkafka reports Strata's own sentence with Kafka's error code.
    assert any(e.code() == KafkaError._AUTHENTICATION
               and "wrong user name or password" in e.str() for e in errors), errors[:3]


def test_plaintext_to_the_tls_port_gets_nothing(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)


def test_kafka_admin_manages_acls_and_scram_users(cluster: Cluster) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(settings(cluster, "admin"))
    admin.create_topics([NewTopic("acl-kafka", 1, 1)])["acl-kafka"].result(30)
    # A new SCRAM user, made by a Kafka admin client, logs in over the Kafka listener.
    upsert = UserScramCredentialUpsertion(
        "kafka-made", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"s3cret")
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(30)
    described = admin.describe_user_scram_credentials(["kafka-made"])["kafka-made"].result(30)
    assert [(c.mechanism, c.iterations) for c in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 8192)]
    binding = AclBinding(ResourceType.TOPIC, "acl-", ResourcePatternType.PREFIXED,
                         "User:kafka-made", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding]).values():
        future.result(30)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,
                                  "User:kafka-made", None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    assert admin.describe_acls(everything).result(30) == [binding]

    def write(password: str = "s3cret") -> list[Any]:
        outcome: list[Any] = []
        producer = KProducer({**settings(cluster, "kafka-made", password=password),
                              "acks": "all", "enable.idempotence": False,
                              "message.timeout.ms": 5000})
        producer.produce("acl-kafka", value=b"x",
                         on_delivery=lambda err, msg: outcome.append(err or msg.offset()))
        producer.flush(10)
        return outcome

    assert write() == [0]
    for future in admin.delete_acls([everything]).values():
        assert future.result(30) == [binding]
    assert [e.code() for e in write()] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
