"""The HTTP ingest gateway end to end: `strata gateway` (real uvicorn) against a real
broker, driven with httpx. One cluster and one gateway process per module; the test
that kills the broker runs last."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_gateway import GatewayConfig
from ingest_gateway._auth import hash_secret
from procs import free_port
from strata.client import Admin, Consumer, NewTopic, TopicPartition
from tests.support.cluster import Cluster
from tests.support.gateway import MAX_REQUEST_BYTES, Gateway, running_gateway, stop_child
from tests.support.waiting import wait_for
from wire.partitioner import partition_for_key

pytestmark = pytest.mark.integration

SMALL_LIMIT = 2000  # max.message.bytes of the "gw-small" topic


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("gateway-cluster"), brokers=1) as c:
        with Admin(c.bootstrap) as admin:
            admin.create_topics([
                NewTopic("gw-events", num_partitions=3, replication_factor=1),
                NewTopic("gw-stream", num_partitions=1, replication_factor=1),
                NewTopic("gw-small", num_partitions=1, replication_factor=1,
                         configs={"max.message.bytes": SMALL_LIMIT}),
            ])
        yield c


@pytest.fixture(scope="module")
def gateway(cluster: Cluster) -> Iterator[Gateway]:
    with running_gateway(cluster.bootstrap, "--no-auth") as gw:
        wait_for("gateway ready", lambda: httpx.get(f"{gw.url}/readyz").status_code,
                 lambda s: s == 200, timeout=30)
        gw.cluster_id = httpx.get(f"{gw.url}/v3/clusters").json()["data"][0]["cluster_id"]
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


@contextlib.contextmanager
def config_gateway(bootstrap: str, cluster_id: str, **settings: Any) -> Iterator[Gateway]:
    """A gateway started from a ``GatewayConfig`` (settings the CLI has no flag for), in
    its own process, ready; stopped by its Popen handle like ``running_gateway``'s."""
    config = GatewayConfig(bootstrap=bootstrap, port=free_port(), no_auth=True,
                           delivery_timeout_ms=4000, shutdown_grace_s=5, access_log=False,
                           **settings)
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from ingest_gateway import GatewayConfig, run; "
         "run(GatewayConfig.from_json(sys.argv[1]), log_level='warning')", config.to_json()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    url = f"http://127.0.0.1:{config.port}"

    def ready() -> int:
        assert process.poll() is None, "the gateway exited"
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code
        except httpx.HTTPError:
            return -1

    try:
        wait_for("gateway ready", ready, lambda s: s == 200, timeout=30)
        yield Gateway(url, cluster_id, bootstrap, process, deque())
    finally:
        stop_child(process)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def read_back(bootstrap: str, topic: str, partition: int, offset: int, count: int = 1
              ) -> list[Any]:
    with Consumer(bootstrap, auto_offset_reset="none") as consumer:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        out: list[Any] = []
        deadline = time.monotonic() + 10
        while len(out) < count and time.monotonic() < deadline:
            out += consumer.poll(timeout_ms=500, max_records=count - len(out))
        return out


def high_watermark(client: httpx.Client, gateway: Gateway, topic: str, partition: int) -> int:
    parts = client.get(gateway.topic_url(topic) + "/partitions").json()["data"]
    return int(parts[partition]["high_watermark"])


# ------------------------------------------------------------------------ health, admin
def test_health_ready_metrics_docs(client: httpx.Client, gateway: Gateway) -> None:
    assert client.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    ready = client.get(f"{gateway.url}/readyz").json()
    assert ready["status"] == "ready" and ready["brokers"] == [0]
    assert client.get(f"{gateway.url}/docs").status_code == 200
    paths = client.get(f"{gateway.url}/openapi.json").json()["paths"]
    assert "/v3/clusters/{cluster_id}/topics/{topic_name}/records:batch" in paths
    metrics = client.get(f"{gateway.url}/metrics").text
    assert 'strata_gateway_requests_total{method="GET",route="/readyz",status="200"}' in metrics
    assert "strata_gateway_request_seconds_bucket" in metrics
    missing = client.get(f"{gateway.url}/v3/nothing")
    assert missing.status_code == 404 and missing.json()["error_code"] == 404


def test_clusters_and_topic_admin(client: httpx.Client, gateway: Gateway) -> None:
    clusters = client.get(f"{gateway.url}/v3/clusters").json()
    assert clusters["data"][0]["brokers"][0]["broker_id"] == 0
    base = f"{gateway.url}/v3/clusters/{gateway.cluster_id}/topics"
    created = client.post(base, json={"topic_name": "gw-admin", "partitions_count": 2,
                                      "replication_factor": 1,
                                      "configs": [{"name": "retention.ms", "value": "60000"}]})
    assert created.status_code == 201, created.text
    assert created.json()["partitions_count"] == 2
    again = client.post(base, json={"topic_name": "gw-admin", "partitions_count": 2,
                                    "replication_factor": 1})
    assert again.status_code == 409 and again.json()["error_code"] == 409
    bad = client.post(base, json={"topic_name": "gw-bad", "partitions_count": "two"})
    assert bad.status_code == 422 and "partitions_count" in bad.json()["message"]
    names = [t["topic_name"] for t in client.get(base).json()["data"]]
    assert {"gw-admin", "gw-events"} <= set(names)
    topic = client.get(f"{base}/gw-admin").json()
    assert topic["replication_factor"] == 1 and topic["cluster_id"] == gateway.cluster_id
    parts = client.get(f"{base}/gw-admin/partitions").json()["data"]
    assert [p["partition_id"] for p in parts] == [0, 1]
    assert all(p["leader"] == {"broker_id": 0} and p["log_start_offset"] == 0
               and p["log_end_offset"] == 0 for p in parts)
    assert client.delete(f"{base}/gw-admin").status_code == 204
    gone = client.get(f"{base}/gw-admin")
    assert gone.status_code == 404 and "gw-admin" in gone.json()["message"]
    wrong = client.get(f"{gateway.url}/v3/clusters/not-this-one/topics")
    assert wrong.status_code == 404 and gateway.cluster_id in wrong.json()["message"]


# ------------------------------------------------------------------------ produce
def test_produce_one_record_then_read_it_back(client: httpx.Client, gateway: Gateway) -> None:
    record = {"partition_id": 1, "key": {"type": "STRING", "data": "user-1"},
              "value": {"type": "JSON", "data": {"clicks": 3}},
              "headers": [{"name": "source", "value": b64(b"web")}],
              "timestamp": "2026-01-31T12:00:00.250Z"}
    answer = client.post(gateway.topic_url("gw-events") + "/records", json=record)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["error_code"] == 200 and body["topic_name"] == "gw-events"
    assert body["partition_id"] == 1 and body["cluster_id"] == gateway.cluster_id
    assert body["timestamp"] == "2026-01-31T12:00:00.250Z"
    assert body["key"] == {"size": 6, "type": "STRING"}
    assert body["value"] == {"size": len(b'{"clicks":3}'), "type": "JSON"}
    [read] = read_back(gateway.bootstrap, "gw-events", 1, body["offset"])
    assert read.offset == body["offset"] and read.key == b"user-1"
    assert json.loads(read.value) == {"clicks": 3}
    assert read.headers == [("source", b"web")]
    # the gateway's own read endpoint sees the same record
    page = client.get(gateway.topic_url("gw-events") + "/partitions/1/records",
                      params={"offset": body["offset"], "max_records": 5}).json()
    assert page["data"][0]["offset"] == body["offset"]
    assert base64.b64decode(page["data"][0]["key"]["data"]) == b"user-1"
    assert page["data"][0]["headers"] == [{"name": "source", "value": b64(b"web")}]
    assert page["next_offset"] == body["offset"] + 1
    beyond = client.get(gateway.topic_url("gw-events") + "/partitions/1/records",
                        params={"offset": 10_000})
    assert beyond.status_code == 416 and "range" in beyond.json()["message"]
    assert client.get(gateway.topic_url("gw-events") + "/partitions/9/records").status_code == 404


def test_produce_binary_and_acks(client: httpx.Client, gateway: Gateway) -> None:
    url = gateway.topic_url("gw-events") + "/records"
    payload = bytes(range(256))
    one = client.post(url, params={"acks": "1"},
                      json={"partition_id": 0, "value": {"type": "BINARY", "data": b64(payload)}})
    assert one.status_code == 200 and one.json()["offset"] >= 0
    [read] = read_back(gateway.bootstrap, "gw-events", 0, one.json()["offset"])
    assert read.value == payload and read.key is None
    # acks=0: sent, not acknowledged: 202 and no offset, never "200 written"
    before = high_watermark(client, gateway, "gw-events", 2)
    zero = client.post(url, params={"acks": "0"},
                       json={"partition_id": 2, "value": {"type": "STRING", "data": "x"}})
    assert zero.status_code == 202, zero.text
    assert zero.json()["error_code"] == 202 and zero.json()["offset"] is None
    batch = client.post(url + ":batch", params={"acks": "0"}, json={"entries": [
        {"id": "z", "partition_id": 2, "value": {"type": "STRING", "data": "y"}}]})
    assert batch.status_code == 207
    [sent] = batch.json()["successes"]
    assert sent["id"] == "z" and sent["error_code"] == 202 and sent["offset"] is None
    # streaming mode: every line says 202, none claims an offset
    stream = client.post(url, params={"acks": "0"}, headers={"Content-Type": "application/json"},
                         content=iter([json.dumps({"partition_id": 2, "value": None}).encode()
                                       for _ in range(2)]))
    assert stream.status_code == 200, stream.text
    lines = [json.loads(line) for line in stream.text.splitlines()]
    assert [(r["error_code"], r["offset"]) for r in lines] == [(202, None)] * 2
    wait_for("acks=0 records arrive", lambda: high_watermark(client, gateway, "gw-events", 2),
             lambda hw: hw == before + 4, timeout=10)


def test_streaming_mode_reports_in_order(client: httpx.Client, gateway: Gateway) -> None:
    url = gateway.topic_url("gw-stream") + "/records"

    def chunks() -> Iterator[bytes]:
        for i in range(30):
            record = {"value": {"type": "STRING", "data": f"m{i}"}}
            if i == 7:
                record = {"value": {"type": "BINARY", "data": "!!not base64"}}
            yield json.dumps(record).encode() + b"\n"

    answer = client.post(url, content=chunks(), headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    reports = [json.loads(line) for line in answer.text.splitlines()]
    assert len(reports) == 30
    assert reports[7]["error_code"] == 422 and "records[7].value.data" in reports[7]["message"]
    good = [r for i, r in enumerate(reports) if i != 7]
    offsets = [r["offset"] for r in good]
    assert offsets == list(range(offsets[0], offsets[0] + 29))
    read = read_back(gateway.bootstrap, "gw-stream", 0, offsets[0], 29)
    assert [r.value for r in read] == [f"m{i}".encode() for i in range(30) if i != 7]


def test_records_batch(client: httpx.Client, gateway: Gateway) -> None:
    entries = [{"id": f"e{i}", "partition_id": 2, "value": {"type": "STRING", "data": f"b{i}"}}
               for i in range(4)]
    entries[2]["value"] = {"type": "TEXT", "data": "x"}
    answer = client.post(gateway.topic_url("gw-events") + "/records:batch",
                         json={"entries": entries})
    assert answer.status_code == 207, answer.text
    body = answer.json()
    assert [s["id"] for s in body["successes"]] == ["e0", "e1", "e3"]
    [failure] = body["failures"]
    assert failure["id"] == "e2" and failure["error_code"] == 422
    assert "entries[2].value.type" in failure["message"]
    first = body["successes"][0]["offset"]
    assert [s["offset"] for s in body["successes"]] == [first, first + 1, first + 2]
    read = read_back(gateway.bootstrap, "gw-events", 2, first, 3)
    assert [r.value for r in read] == [b"b0", b"b1", b"b3"]


# ------------------------------------------------------------------------ errors
def test_error_answers(client: httpx.Client, gateway: Gateway) -> None:
    url = gateway.topic_url("gw-events") + "/records"

    def check(response: httpx.Response, status: int, *words: str) -> None:
        assert response.status_code == status, response.text
        body = response.json()
        assert body["error_code"] == status
        for word in words:
            assert word in body["message"], body["message"]

    check(client.post(gateway.topic_url("gw-nope") + "/records", json={"value": None}),
          404, "gw-nope")
    check(client.post(url, json={"partition_id": 99, "value": None}), 404, "partition_id 99")
    check(client.post(url, content=b"hello", headers={"Content-Type": "text/plain"}),
          415, "application/json")
    check(client.post(url, json={"value": {"type": "BINARY", "data": "%%%"}}), 422,
          "value.data", "base64")
    check(client.post(url, json={"key": {"type": "XML", "data": "x"}}), 422, "key.type")
    check(client.post(url, json={"headers": [{"name": "h", "value": 5}]}), 422,
          "headers[0].value")
    check(client.post(url, json={"valu": {"type": "STRING", "data": "x"}}), 422, "valu")
    check(client.post(url, json={"timestamp": "yesterday"}), 422, "timestamp")
    # JSON may carry a lone surrogate (\ud800): not text a record can hold, 422 not 500
    check(client.post(url, content=b'{"value": {"type": "STRING", "data": "\\ud800"}}',
                      headers={"Content-Type": "application/json"}), 422, "value.data",
          "Unicode")
    odd_id = client.post(url + ":batch", content=b'{"entries": [{"id": "\\udc00", '
                         b'"value": null}]}', headers={"Content-Type": "application/json"})
    assert odd_id.status_code == 207 and odd_id.json()["successes"][0]["id"] == "\udc00"
    # Past an int64 it would poison the shared batch of other requests: refused alone.
    check(client.post(url, json={"timestamp": 10**20, "value": {"data": 1}}), 422,
          "timestamp")
    check(client.post(url, content=b'{"value": ', headers={"Content-Type": "application/json"}),
          422, "not valid JSON")
    check(client.post(url, params={"acks": "7"}, json={"value": None}), 422, "acks")
    # An unknown (or misspelt) query parameter is refused, never silently ignored.
    check(client.post(url, params={"ack": "0"}, json={"value": None}), 422, "'ack'")
    check(client.get(gateway.topic_url("gw-events") + "/partitions/0/records",
                     params={"max_record": "1"}), 422, "'max_record'", "max_records")
    big = {"value": {"type": "STRING", "data": "x" * (MAX_REQUEST_BYTES + 10)}}
    check(client.post(url, json=big), 413, "limit")
    batch = {"entries": [{"value": {"type": "STRING", "data": "x" * 1000}}] * 80}
    check(client.post(url + ":batch", json=batch), 413, "limit")
    small = gateway.topic_url("gw-small") + "/records"
    check(client.post(small, json={"value": {"type": "STRING", "data": "y" * 3000}}), 413,
          "record", "max.message.bytes=2000")
    sized = client.post(small + ":batch", json={"entries": [
        {"id": "fits", "value": {"type": "STRING", "data": "y"}},
        {"id": "big", "value": {"type": "STRING", "data": "y" * 3000}}]}).json()
    assert [s["id"] for s in sized["successes"]] == ["fits"]
    assert sized["failures"][0]["error_code"] == 413 and "entries[1]" in sized["failures"][0][
        "message"]
    ok = client.post(small, json={"value": {"type": "STRING", "data": "y" * 100}})
    assert ok.status_code == 200
    metrics = client.get(f"{gateway.url}/metrics").text
    assert 'strata_gateway_errors_total{error_code="422"}' in metrics
    assert 'strata_gateway_records_produced_total{topic="gw-small"} 2.0' in metrics


def test_idempotency_key_produces_once(client: httpx.Client, gateway: Gateway) -> None:
    url = gateway.topic_url("gw-events") + "/records"
    record = {"partition_id": 0, "value": {"type": "STRING", "data": "once"}}
    before = high_watermark(client, gateway, "gw-events", 0)
    headers = {"Idempotency-Key": "order-42"}
    first = client.post(url, json=record, headers=headers)
    second = client.post(url, json=record, headers=headers)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert high_watermark(client, gateway, "gw-events", 0) == before + 1
    other = client.post(url, json={"partition_id": 0, "value": None}, headers=headers)
    assert other.status_code == 422 and "Idempotency-Key" in other.json()["message"]
    # batches too
    batch = {"entries": [{"id": "a", "partition_id": 0, "value": {"type": "STRING",
                                                                     "data": "b"}}]}
    one = client.post(url + ":batch", json=batch, headers={"Idempotency-Key": "batch-1"})
    two = client.post(url + ":batch", json=batch, headers={"Idempotency-Key": "batch-1"})
    assert one.json() == two.json() and one.status_code == 207
    assert high_watermark(client, gateway, "gw-events", 0) == before + 2


def test_tail_server_sent_events(client: httpx.Client, gateway: Gateway) -> None:
    tail_url = gateway.topic_url("gw-events") + "/tail"
    with httpx.Client(timeout=20) as reader, reader.stream("GET", tail_url) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        event = None
        for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            if event == "ready" and line.startswith("data: "):
                break
        produced = client.post(gateway.topic_url("gw-events") + "/records",
                               json={"value": {"type": "STRING", "data": "tailed"}}).json()
        for line in lines:
            if line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["offset"] == produced["offset"]
                assert base64.b64decode(data["value"]["data"]) == b"tailed"
                break


def test_concurrent_retries_with_one_key_produce_once(gateway: Gateway) -> None:
    url = gateway.topic_url("gw-stream") + "/records"
    with httpx.Client(timeout=20) as client:
        before = high_watermark(client, gateway, "gw-stream", 0)
    record = {"value": {"type": "STRING", "data": "racing"}}
    answers: list[httpx.Response] = []

    def post() -> None:
        with httpx.Client(timeout=20) as c:
            answers.append(c.post(url, json=record, headers={"Idempotency-Key": "race-1"}))

    threads = [threading.Thread(target=post) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 5 and all(a.status_code == 200 for a in answers)
    assert len({a.json()["offset"] for a in answers}) == 1
    with httpx.Client(timeout=20) as client:
        assert high_watermark(client, gateway, "gw-stream", 0) == before + 1


def gathered_in_order(gateway: Gateway, bootstrap: str) -> None:
    url = gateway.topic_url("gw-events") + "/records"
    answers: dict[int, list[dict[str, Any]]] = {}

    def client_run(n: int) -> None:
        with httpx.Client(timeout=20) as c:
            answers[n] = [c.post(url, json={"key": {"type": "STRING", "data": f"key-{n}"},
                                           "value": {"type": "STRING", "data": f"{n}:{i}"}}
                                 ).json() for i in range(25)]

    threads = [threading.Thread(target=client_run, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers) == list(range(16))
    for n, reports in answers.items():
        assert all(r["error_code"] == 200 for r in reports), reports
        partitions = {r["partition_id"] for r in reports}
        assert partitions == {partition_for_key(f"key-{n}".encode(), 3)}
        offsets = [r["offset"] for r in reports]
        assert offsets == sorted(offsets) and len(set(offsets)) == 25
        read = read_back(bootstrap, "gw-events", partitions.pop(), offsets[0],
                         offsets[-1] - offsets[0] + 1)
        mine = [r.value for r in read if r.key == f"key-{n}".encode()]
        assert mine == [f"{n}:{i}".encode() for i in range(25)]
    metrics = httpx.get(f"{gateway.url}/metrics").text
    count = float(metrics.split("strata_gateway_batch_records_count ")[1].split()[0])
    total = float(metrics.split("strata_gateway_batch_records_sum ")[1].split()[0])
    assert total >= 400 and total / count > 1.5, (total, count)


def test_concurrent_requests_are_gathered_and_keep_order(gateway: Gateway) -> None:
    """16 clients at once: their records travel in shared batches (the batch-size metric
    says several records per producer send; --linger-ms 50 so that this holds on a slow
    machine too), each keyed client stays on Kafka's murmur2 partition of its key, and
    every client's records are read back in its order."""
    with running_gateway(gateway.bootstrap, "--no-auth", "--linger-ms", "50") as lingering:
        lingering.cluster_id = gateway.cluster_id
        gathered_in_order(lingering, gateway.bootstrap)
    url = gateway.topic_url("gw-events") + "/records"
    # one batch request mixing an explicit partition, keys and sticky records
    mixed = httpx.post(url + ":batch", json={"entries": [
        {"id": "p", "partition_id": 2, "value": {"type": "STRING", "data": "to-2"}},
        {"id": "k", "key": {"type": "BINARY", "data": b64(b"kk")}, "value": None},
        {"id": "s1", "value": {"type": "STRING", "data": "sticky-1"}},
        {"id": "s2", "value": {"type": "STRING", "data": "sticky-2"}},
        {"id": "j", "value": {"type": "JSON", "data": {"a": [1, 2.5, None]}}}]}).json()
    by_id = {r["id"]: r for r in mixed["successes"]}
    assert sorted(by_id) == ["j", "k", "p", "s1", "s2"] and mixed["failures"] == []
    assert by_id["p"]["partition_id"] == 2
    assert by_id["k"]["partition_id"] == partition_for_key(b"kk", 3)
    s1, s2, j = by_id["s1"], by_id["s2"], by_id["j"]
    assert s1["partition_id"] == s2["partition_id"] == j["partition_id"]
    assert [s2["offset"], j["offset"]] == [s1["offset"] + 1, s1["offset"] + 2]
    [rj] = read_back(gateway.bootstrap, "gw-events", j["partition_id"], j["offset"])
    assert rj.value == b'{"a":[1,2.5,null]}' and j["value"] == {"size": 18, "type": "JSON"}


def test_workers_and_graceful_shutdown_drain(gateway: Gateway) -> None:
    """Two uvicorn workers: an Idempotency-Key is honoured across them. SIGTERM while a
    record waits in the producer's linger: the request is still answered with its
    acknowledged offset, and the process exits 0."""
    with running_gateway(gateway.bootstrap, "--no-auth", "--workers", "2",
                         "--linger-ms", "1500") as multi:
        url = f"{multi.url}/v3/clusters/{gateway.cluster_id}/topics/gw-stream/records"
        with httpx.Client(timeout=20) as client:
            before = high_watermark(client, gateway, "gw-stream", 0)
        # retries on fresh connections land on either worker: still produced once
        retries: list[httpx.Response] = []

        def retry() -> None:
            with httpx.Client(timeout=20) as c:
                retries.append(c.post(url, json={"value": {"type": "STRING", "data": "w"}},
                                      headers={"Idempotency-Key": "workers-1"}))

        threads = [threading.Thread(target=retry) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in retries] == [200] * 8
        assert len({r.json()["offset"] for r in retries}) == 1
        with httpx.Client(timeout=20) as client:
            assert high_watermark(client, gateway, "gw-stream", 0) == before + 1
        # each worker listens on its own SO_REUSEPORT socket: the kernel spreads new
        # connections over both (the X-Request-ID prefix is the worker's pid)
        children = sorted(worker_pids(multi.process.pid))
        assert answering_workers(multi.url) == {f"{pid:x}" for pid in children}
        assert len(children) == 2
        # the config (SASL password included, when set) reaches the workers in a file
        # only this user can read, never in their inherited environments
        environ = dict(item.split(b"=", 1) for item in
                       Path(f"/proc/{children[0]}/environ").read_bytes().split(b"\0") if item)
        assert not any(b'"security"' in value for value in environ.values())
        config_file = Path(environ[b"STRATA_GATEWAY_CONFIG_FILE"].decode())
        assert config_file.stat().st_mode & 0o777 == 0o600
        assert config_file.parent.stat().st_mode & 0o777 == 0o700
        assert json.loads(config_file.read_text())["bootstrap"] == gateway.bootstrap
        # /metrics sums every worker's numbers, whichever worker answers it
        totals = {
            httpx.get(f"{multi.url}/metrics").text.split(
                'strata_gateway_records_produced_total{topic="gw-stream"} ')[1].split()[0]
            for _ in range(12)}
        assert totals == {"1.0"}, totals
        # a worker killed -9 is replaced; the gateway keeps answering
        os.kill(children[0], 9)
        now = wait_for("a new worker", lambda: sorted(worker_pids(multi.process.pid)),
                       lambda pids: len(pids) == 2 and children[0] not in pids, timeout=30)
        wait_for("both workers answer", lambda: answering_workers(multi.url),
                 lambda seen: seen == {f"{pid:x}" for pid in now}, timeout=30)
        answers: list[httpx.Response] = []

        def post() -> None:
            with httpx.Client(timeout=20) as c:
                answers.append(c.post(url, json={"value": {"type": "STRING", "data": "drain"}}))

        thread = threading.Thread(target=post)
        thread.start()
        time.sleep(0.5)
        multi.process.terminate()
        thread.join(20)
        assert multi.process.wait(20) == 0
        [answer] = answers
        assert answer.status_code == 200, answer.text
        [read] = read_back(gateway.bootstrap, "gw-stream", 0, answer.json()["offset"])
        assert read.value == b"drain"


def test_readyz_is_503_from_the_moment_the_drain_starts(gateway: Gateway) -> None:
    """SIGTERM: /readyz answers 503 at once, while the gateway still serves (for
    ``drain_delay_s``, so a load balancer stops sending first); then it exits."""
    with config_gateway(gateway.bootstrap, gateway.cluster_id, drain_delay_s=2.0) as gw, \
            httpx.Client(timeout=10) as client:
        url = gw.topic_url("gw-stream") + "/records"
        record = {"value": {"type": "STRING", "data": "lame duck"}}
        assert client.get(f"{gw.url}/readyz").status_code == 200
        gw.process.terminate()
        ready = client.get(f"{gw.url}/readyz")
        assert ready.status_code == 503, ready.text
        assert "shutting down" in ready.json()["message"] and ready.headers["Retry-After"]
        served = client.post(url, json=record)  # still served while draining
        assert served.status_code == 200, served.text
        assert gw.process.wait(20) in (0, -15)
        [read] = read_back(gateway.bootstrap, "gw-stream", 0, served.json()["offset"])
        assert read.value == b"lame duck"


def test_auth_401_403_429(gateway: Gateway, tmp_path: Path) -> None:
    config = tmp_path / "auth.toml"
    writer_hash, admin_hash = hash_secret("writer-secret"), hash_secret("admin-secret")
    config.write_text(f"""enabled = true
[[keys]]
id = "writer"
secret_hash = "{writer_hash}"
rate_limit_per_s = 0.1
burst = 2
acls = [{{ action = "produce", prefix = "gw-ev" }}]
[[keys]]
id = "ops"
secret_hash = "{admin_hash}"
acls = [{{ action = "admin", prefix = "*" }}]
[[keys]]
id = "batcher"
secret_hash = "{writer_hash}"
rate_limit_per_s = 0.1
burst = 5
acls = [{{ action = "produce", prefix = "gw-ev" }}]
[[keys]]
id = "streamer"
secret_hash = "{writer_hash}"
rate_limit_per_s = 0.1
burst = 3
acls = [{{ action = "produce", prefix = "gw-ev" }}]
""")
    with running_gateway(gateway.bootstrap, "--auth-config", str(config)) as secured, \
            httpx.Client(timeout=20) as client:
        url = f"{secured.url}/v3/clusters/{gateway.cluster_id}/topics/gw-events/records"
        record = {"partition_id": 0, "value": {"type": "STRING", "data": "auth"}}
        # marks where this test's lines start (the start-up health probes come before;
        # the log is written in groups, so counting lines now would be too early)
        anonymous = client.post(url, json=record, headers={"X-Request-ID": "auth-test-1"})
        assert anonymous.status_code == 401 and anonymous.json()["error_code"] == 40101
        wrong = client.post(url, json=record, headers={"Authorization": "Bearer writer.nope"})
        assert wrong.status_code == 401
        writer_auth = {"Authorization": "Bearer writer.writer-secret"}
        assert client.post(url, json=record, headers=writer_auth).status_code == 200
        other = client.post(url.replace("gw-events", "gw-stream"), json=record,
                            headers=writer_auth)
        assert other.status_code == 403 and "gw-stream" in other.json()["message"]
        listing = client.get(f"{secured.url}/v3/clusters", headers=writer_auth)
        assert listing.status_code == 403 and listing.json()["error_code"] == 40301
        # burst 2: the 403s above cost nothing (authorize runs before the rate limit)
        assert client.post(url, json=record, headers=writer_auth).status_code == 200
        limited = client.post(url, json=record, headers=writer_auth)
        assert limited.status_code == 429 and "Retry-After" in limited.headers
        ops = client.get(f"{secured.url}/v3/clusters", auth=("ops", "admin-secret"))
        assert ops.status_code == 200
        traced = client.get(f"{secured.url}/healthz", headers={"X-Request-ID": "trace-1"})
        assert traced.status_code == 200 and traced.headers["x-request-id"] == "trace-1"
        # The JSON access log: one parseable line per request, written once it completed.
        def ours() -> list[dict[str, Any]]:
            found = access_lines(secured)
            starts = [i for i, line in enumerate(found) if line["request_id"] == "auth-test-1"]
            return found[starts[0]:] if starts else []

        lines = wait_for("access log lines", ours, lambda found: len(found) >= 9, timeout=10)
        # the rate limit counts records: burst 5 is three records in a batch plus two
        batcher = {"Authorization": "Bearer batcher.writer-secret"}
        three = {"entries": [record] * 3}
        assert client.post(url + ":batch", json=three, headers=batcher).status_code == 207
        assert client.post(url + ":batch", json={"entries": [record] * 2},
                           headers=batcher).status_code == 207
        over = client.post(url, json=record, headers=batcher)
        assert over.status_code == 429 and over.json()["error_code"] == 42901
        # streaming mode pays per record as they arrive: burst 3 lets 3 of 4 through
        streamer = {"Authorization": "Bearer streamer.writer-secret",
                    "Content-Type": "application/json"}
        streamed = client.post(url, headers=streamer,
                               content=iter([json.dumps(record).encode()] * 4))
        assert streamed.status_code == 200, streamed.text
        codes = [json.loads(line)["error_code"] for line in streamed.text.splitlines()]
        assert codes == [200, 200, 200, 42901] and int(streamed.headers["Retry-After"]) >= 1
    assert [(line["method"], line["status"], line["key_id"]) for line in lines] == [
        ("POST", 401, "-"), ("POST", 401, "-"), ("POST", 200, "writer"),
        ("POST", 403, "writer"), ("GET", 403, "writer"), ("POST", 200, "writer"),
        ("POST", 429, "writer"), ("GET", 200, "ops"), ("GET", 200, "-")]
    first_ok = lines[2]
    assert first_ok["path"] == url.removeprefix(secured.url) and first_ok["records"] == 1
    assert first_ok["bytes_in"] == len(httpx.Request("POST", url, json=record).content)
    assert first_ok["bytes_out"] > 0 and first_ok["duration_ms"] >= 0
    assert lines[-1]["request_id"] == "trace-1" and lines[-1]["records"] == 0
    assert len({line["request_id"] for line in lines}) == len(lines)
    assert set(lines[0]) == {"time", "request_id", "method", "path", "status", "duration_ms",
                             "key_id", "bytes_in", "bytes_out", "records"}


def test_workers_end_with_a_killed_supervisor(gateway: Gateway) -> None:
    """SIGKILL of the supervisor (no chance to stop anything) still ends its workers:
    nothing is left serving the port."""
    with running_gateway(gateway.bootstrap, "--no-auth", "--workers", "2") as multi:
        workers = wait_for("two workers", lambda: worker_pids(multi.process.pid),
                           lambda pids: len(pids) == 2, timeout=30)
        multi.process.kill()
        multi.process.wait(10)

        def alive() -> list[int]:
            return [pid for pid in workers if Path(f"/proc/{pid}").exists()
                    and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]

        try:
            wait_for("workers gone", alive, lambda pids: pids == [], timeout=30)
        finally:
            for pid in alive():
                os.kill(pid, 9)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{multi.url}/healthz", timeout=2)


def answering_workers(url: str, connections: int = 24) -> set[str]:
    """The workers (pids in hex, the X-Request-ID prefix) that answered ``connections``
    requests, each on a new connection."""
    return {httpx.get(f"{url}/healthz").headers["x-request-id"].split("-")[0]
            for _ in range(connections)}


def worker_pids(parent: int) -> list[int]:
    """The gateway supervisor's live worker processes."""
    found = []
    for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError):  # ended since the listing
            if b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


def access_lines(gateway: Gateway) -> list[dict[str, Any]]:
    """The access-log lines (JSON objects with a request_id) the gateway printed so far."""
    found = []
    for line in list(gateway.output):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and "request_id" in entry:
                    found.append(entry)
    return found


def test_brokers_gone_is_503(client: httpx.Client, gateway: Gateway, cluster: Cluster) -> None:
    """Runs last: kills the broker. Nothing unacknowledged is reported as written, and an
    Idempotency-Key retry still gets its stored first answer: the key is looked up before
    any broker is asked (this gateway caches no metadata, so any broker call would 503)."""
    with config_gateway(gateway.bootstrap, gateway.cluster_id, metadata_ttl_s=0.0) as uncached:
        url = uncached.topic_url("gw-events") + "/records"
        record = {"partition_id": 1, "value": {"type": "STRING", "data": "kept"}}
        key = {"Idempotency-Key": "outage-1"}
        first = client.post(url, json=record, headers=key)
        assert first.status_code == 200, first.text
        batch = client.post(url + ":batch", json={"entries": [record]}, headers=key)
        assert batch.status_code == 207, batch.text
        cluster.kill(0)
        retry = client.post(url, json=record, headers=key)
        assert (retry.status_code, retry.content) == (200, first.content), retry.text
        assert retry.headers["Idempotent-Replayed"] == "true"
        batch_retry = client.post(url + ":batch", json={"entries": [record]}, headers=key)
        assert (batch_retry.status_code, batch_retry.content) == (207, batch.content)
        fresh = client.post(url, json=record, headers={"Idempotency-Key": "outage-2"})
        assert fresh.status_code == 503, fresh.text  # a new key needs the brokers
    answer = client.post(gateway.topic_url("gw-events") + "/records",
                         json={"partition_id": 0, "value": {"type": "STRING", "data": "lost"}})
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert answer.json()["error_code"] == 503
    assert "retry" in answer.json()["message"].lower()
    assert client.get(f"{gateway.url}/readyz").status_code == 503
    assert client.get(f"{gateway.url}/healthz").status_code == 200
