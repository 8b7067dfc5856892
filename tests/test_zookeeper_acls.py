"""Securing an existing cluster's znodes: `strata zookeeper-acls secure|unsecure`
(Kafka's zookeeper-security-migration; docs/security.md, "ZooKeeper").

A real broker first runs without ZooKeeper ACLs and leaves open znodes (a topic, a SCRAM
user); it is restarted with ``zookeeper.set.acl``, the command secures what exists, and
an anonymous ZooKeeper client can then read the cluster state but change nothing, and not
read the credentials, while the broker goes on working. ``unsecure`` opens it again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from brokers.coordination import ZooKeeperClient
from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.support.broker_process import REPO, BrokerProcess
from wire.sasl import scram_credential
from zookeeper.launcher import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DIGEST_USER, DIGEST_PASSWORD = "strata-zk", "zk-digest-secret"


def zookeeper_acls(zookeeper: str, action: str, user: str = DIGEST_USER,
                   password: str = DIGEST_PASSWORD) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata_tools.cli", "zookeeper-acls", action, "--zookeeper",
         zookeeper, "--digest-username", user], input=f"{password}\n", capture_output=True,
        text=True, timeout=60, check=False, env=dict(os.environ, PYTHONPATH=str(REPO)))


def round_trip(bootstrap: str, topic: str) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    with Producer(bootstrap, acks="all") as producer:
        producer.send(topic, b"still working").result(timeout=30)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records: list[Any] = []
        for _ in range(20):
            records += consumer.poll(timeout_ms=500)
            if records:
                break
        assert [r.value for r in records] == [b"still working"]


def test_secure_then_unsecure_an_existing_cluster(
        zookeeper_server: ZooKeeperServer, tmp_path: Path,
        kazoo_factory: Callable[[str], KazooClient]) -> None:
    zk = zookeeper_server.connect_string
    coordinator = ZooKeeperClient(zk)  # no digest: what an unsecured cluster writes
    coordinator.start()
    try:
        coordinator.put_scram_credential("alice", scram_credential("SCRAM-SHA-256", "pw"))
    finally:
        coordinator.stop()
    broker = BrokerProcess(zk, tmp_path / "broker").start()
    try:
        round_trip(broker.bootstrap, "before-acls")
        anonymous = kazoo_factory(zk)
        topic_node = "/strata/brokers/topics/before-acls"
        assert anonymous.get_acls(topic_node)[0] == OPEN_ACL_UNSAFE

        # Refused before anything changes: no identity (empty password) or the wrong one
        # once secured.
        empty = zookeeper_acls(zk, "secure", password="")
        assert empty.returncode == 1 and "no digest password given" in empty.stderr
        assert anonymous.get_acls(topic_node)[0] == OPEN_ACL_UNSAFE

        broker.stop()
        broker.overrides.update({"zookeeper.set.acl": "true",
                                 "zookeeper.digest.username": DIGEST_USER,
                                 "zookeeper.digest.password": DIGEST_PASSWORD})
        broker.start()
        secured = zookeeper_acls(zk, "secure")
        assert secured.returncode == 0, secured.stderr
        assert "znode(s) secured" in secured.stdout and not secured.stdout.startswith("0 ")

        with pytest.raises(NoAuthError):
            anonymous.set(topic_node, b"{}")
        with pytest.raises(NoAuthError):
            anonymous.delete("/strata/brokers/topics/before-acls", recursive=True)
        with pytest.raises(NoAuthError):
            anonymous.get("/strata/config/users/alice")
        assert anonymous.get(topic_node)[0]  # the cluster state stays readable
        round_trip(broker.bootstrap, "after-acls")  # the broker writes as the owner

        again = zookeeper_acls(zk, "secure")
        assert again.returncode == 0 and again.stdout.startswith("0 znode(s)"), again.stdout
        intruder = zookeeper_acls(zk, "unsecure", user="mallory", password="guess")
        assert intruder.returncode == 1 and "another identity" in intruder.stderr, \
            intruder.stderr
        with pytest.raises(NoAuthError):
            anonymous.set(topic_node, b"{}")

        opened = zookeeper_acls(zk, "unsecure")
        assert opened.returncode == 0 and "opened to everyone" in opened.stdout, opened.stderr
        assert anonymous.get_acls(topic_node)[0] == OPEN_ACL_UNSAFE
        assert anonymous.get("/strata/config/users/alice")[0]
    finally:
        broker.kill()
