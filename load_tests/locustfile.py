"""Locust load tests for the HTTP ingest gateway (`strata gateway`, docs/gateway.md).

User classes (pick some by naming them after the options; default: all three, equal
weight):

- ``SingleRecordUser``: ``POST .../topics/{topic}/records``, one record per request.
- ``BatchUser``: ``POST .../topics/{topic}/records:batch`` with ``--batch-size`` records.
- ``MixedUser``: three single-record writes for every read; a read fetches, through
  ``GET .../partitions/{p}/records``, the record this user wrote last (read your write).

Settings (command-line option, or the environment variable in brackets):

- ``--host`` [``GATEWAY_URL``, or locust's ``LOCUST_HOST``]: the gateway, e.g.
  ``http://127.0.0.1:8082``
- ``--topic`` [``GATEWAY_TOPIC``, default ``load-test``]; created with
  ``--topic-partitions`` partitions [``GATEWAY_TOPIC_PARTITIONS``, 8] when missing
  (needs the cluster admin ACL with auth; otherwise create it beforehand)
- ``--record-size`` [``RECORD_SIZE``, 100]: value bytes per record
- ``--batch-size`` [``BATCH_SIZE``, 100]: records per ``records:batch`` request
- ``--api-key`` [``GATEWAY_TOKEN``]: sent as ``Authorization: Bearer <key>``; empty for
  a gateway started with ``--no-auth``
- ``--acks`` [``GATEWAY_ACKS``, ``all``]: the ``acks`` query parameter
- ``--rate-per-user`` [``RATE_PER_USER``, 0]: requests/s per user
  (``constant_throughput``); 0 sends the next request as soon as the answer is in

A request is a success only with the expected status (200 / 207) and, for a batch, no
entry in ``failures``.
"""

from __future__ import annotations

import json
import os
import random
import string
import types
from typing import Any

from locust import FastHttpUser, constant, constant_throughput, events, task
from locust.env import Environment

_ALPHABET = string.ascii_letters + string.digits


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("Strata gateway")
    group.add_argument("--topic", env_var="GATEWAY_TOPIC", default="load-test",
                       help="topic to write to and read from")
    group.add_argument("--topic-partitions", env_var="GATEWAY_TOPIC_PARTITIONS", type=int,
                       default=8, help="partitions when the topic has to be created")
    group.add_argument("--record-size", env_var="RECORD_SIZE", type=int, default=100,
                       help="value bytes per record")
    group.add_argument("--batch-size", env_var="BATCH_SIZE", type=int, default=100,
                       help="records per records:batch request")
    group.add_argument("--api-key", env_var="GATEWAY_TOKEN", default="",
                       help="API key, sent as 'Authorization: Bearer <key>'")
    group.add_argument("--acks", env_var="GATEWAY_ACKS", default="all",
                       choices=["all", "-1", "1", "0"], help="acks query parameter")
    group.add_argument("--rate-per-user", env_var="RATE_PER_USER", type=float, default=0.0,
                       help="requests/s per user (constant_throughput); 0 = no wait")


@events.init.add_listener
def _default_host(environment: Environment, **_: Any) -> None:
    if environment.parsed_options is not None and not environment.host:
        environment.host = os.environ.get("GATEWAY_URL") or environment.host


class _Settings:
    """Request bodies and headers, built once per process from the parsed options."""

    def __init__(self, environment: Environment) -> None:
        opts = environment.parsed_options
        self.topic: str = opts.topic if opts else "load-test"
        self.partitions: int = opts.topic_partitions if opts else 8
        self.record_size: int = opts.record_size if opts else 100
        self.batch_size: int = opts.batch_size if opts else 100
        self.acks: str = opts.acks if opts else "all"
        self.rate: float = opts.rate_per_user if opts else 0.0
        api_key: str = opts.api_key if opts else ""
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        # A few distinct values, so records are not all identical; made once, reused.
        self.values = ["".join(random.choices(_ALPHABET, k=self.record_size))
                       for _ in range(16)]
        self.single_bodies = [json.dumps({"value": {"type": "STRING", "data": v}}).encode()
                              for v in self.values]
        self.batch_bodies = [
            json.dumps({"entries": [{"value": {"type": "STRING",
                                               "data": self.values[(i + j) % 16]}}
                                    for j in range(self.batch_size)]}).encode()
            for i in range(4)]
        self.cluster_id: str | None = None


_settings: _Settings | None = None


def _get_settings(environment: Environment) -> _Settings:
    global _settings
    if _settings is None:
        _settings = _Settings(environment)
    return _settings


@events.test_start.add_listener
def _create_topic(environment: Environment, **_: Any) -> None:
    """Create the topic if it is missing (once, on the master or the local runner)."""
    if environment.host is None or type(environment.runner).__name__ == "WorkerRunner":
        return
    import httpx

    s = _get_settings(environment)
    try:
        with httpx.Client(base_url=environment.host, headers=s.headers, timeout=15) as c:
            cluster_id = c.get("/v3/clusters").raise_for_status().json()["data"][0]["cluster_id"]
            r = c.post(f"/v3/clusters/{cluster_id}/topics",
                       json={"topic_name": s.topic, "partitions_count": s.partitions})
            if r.status_code not in (201, 409):
                print(f"locustfile: could not create topic {s.topic!r}: "
                      f"{r.status_code} {r.text}")
    except httpx.HTTPError as exc:
        print(f"locustfile: could not reach {environment.host} to create the topic: {exc}")


class _GatewayUser(FastHttpUser):
    abstract = True
    # No wait by default; --rate-per-user switches to constant_throughput.
    wait_time = constant(0)

    def on_start(self) -> None:
        s = self.settings = _get_settings(self.environment)
        if s.rate > 0:
            self.wait_time = types.MethodType(constant_throughput(s.rate), self)  # type: ignore[method-assign]
        if s.cluster_id is None:
            with self.client.get("/v3/clusters", headers=s.headers, name="/v3/clusters",
                                 catch_response=True) as r:
                if r.status_code != 200:
                    r.failure(f"GET /v3/clusters: {r.status_code} {r.text}")
                    raise RuntimeError("cannot learn the cluster id")
                s.cluster_id = r.json()["data"][0]["cluster_id"]
        self.topic_path = f"/v3/clusters/{s.cluster_id}/topics/{s.topic}"
        self.last_written: tuple[int, int | None] | None = None

    def produce_one(self) -> None:
        s = self.settings
        with self.client.post(f"{self.topic_path}/records?acks={s.acks}",
                              data=random.choice(s.single_bodies), headers=s.headers,
                              name="produce 1 record", catch_response=True) as r:
            # acks=0 is answered 202 "sent, not acknowledged" with offset null
            if r.status_code != (202 if s.acks == "0" else 200):
                r.failure(f"{r.status_code} {r.text[:300]}")
                return
            body = r.json()
            self.last_written = (body["partition_id"], body["offset"])

    def produce_batch(self) -> None:
        s = self.settings
        with self.client.post(f"{self.topic_path}/records:batch?acks={s.acks}",
                              data=random.choice(s.batch_bodies), headers=s.headers,
                              name=f"produce batch of {s.batch_size}",
                              catch_response=True) as r:
            if r.status_code != 207:
                r.failure(f"{r.status_code} {r.text[:300]}")
                return
            failures = r.json().get("failures") or []
            if failures:
                r.failure(f"{len(failures)} of {s.batch_size} records failed, "
                          f"first: {failures[0]}")

    def read_back(self) -> None:
        if self.last_written is None or self.last_written[1] is None:  # acks=0: no offset
            self.produce_one()
            return
        s = self.settings
        partition, offset = self.last_written
        with self.client.get(f"{self.topic_path}/partitions/{partition}/records"
                             f"?offset={offset}&max_records=1&timeout_ms=1000",
                             headers=s.headers, name="read 1 record",
                             catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code} {r.text[:300]}")
                return
            data = r.json()["data"]
            if not data or data[0]["offset"] != offset:
                r.failure(f"offset {offset} of partition {partition} not read back: {data}")


class SingleRecordUser(_GatewayUser):
    @task
    def produce(self) -> None:
        self.produce_one()


class BatchUser(_GatewayUser):
    @task
    def produce(self) -> None:
        self.produce_batch()


class MixedUser(_GatewayUser):
    @task(3)
    def write(self) -> None:
        self.produce_one()

    @task(1)
    def read(self) -> None:
        self.read_back()
