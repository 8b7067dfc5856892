"""Typed topics end to end on a real two-broker cluster (docs/typed-topics.md): the
schema registry's API against Confluent's documented behaviour (through the client and
through the gateway's REST routes), typed produce and consume, the broker's refusal of
batches that do not match, evolution, and the Kafka-compatible value formats.

Two brokers, so that the broker leading a typed partition is, for one of the two
partitions, not the one leading ``__schemas``-0: its produce check then asks the
registry over the network.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from strata.client import (
    Admin,
    Consumer,
    IncompatibleSchemaError,
    InvalidSchemaError,
    NewTopic,
    Producer,
    SchemaMismatchError,
    SchemaNotFoundError,
    TopicPartition,
)
from tests.support.cluster import Cluster
from tests.support.gateway import Gateway, running_gateway
from tests.support.waiting import wait_for
from wire.connection import BrokerConnection
from wire.errors import InvalidRequestError, NotCoordinatorError
from wire.partitioner import partition_for_key
from wire.protocol import (
    SCHEMAS_TOPIC,
    ApiKey,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    SchemaRegistryRequest,
    SchemaRegistryResponse,
)
from wire.record_batch import build_batch
from wire.schema import parse_confluent_frame, parse_schema, records_to_arrow

pytestmark = pytest.mark.integration

ORDER_V1 = json.dumps({
    "type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 10, "scale": 2}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]})
# v2 adds a field with a default: BACKWARD-compatible.
ORDER_V2 = json.dumps({
    "type": "record", "name": "Order", "fields": [
        *json.loads(ORDER_V1)["fields"],
        {"name": "channel", "type": "string", "default": "web"},
    ]})
# A new field without a default: a v3 reader could not read v2 data.
ORDER_BAD = json.dumps({
    "type": "record", "name": "Order", "fields": [
        *json.loads(ORDER_V2)["fields"], {"name": "region", "type": "string"}]})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("typed"), brokers=2) as started:
        yield started


@pytest.fixture(scope="module")
def bootstrap(cluster: Cluster) -> str:
    """The shared ``admin`` fixture's address: this module's cluster."""
    return cluster.bootstrap


def _typed_topic(admin: Admin, name: str, partitions: int = 2) -> None:
    admin.create_topics([NewTopic(name, partitions, 2,
                                  {"value.schema.subject": f"{name}-value"})])


def _orders(start: int, n: int) -> list[dict[str, object]]:
    from decimal import Decimal

    return [{"id": i, "customer": f"c{i % 7}", "amount": Decimal(i) / 100,
             "note": None if i % 2 else f"n{i}"} for i in range(start, start + n)]


def _read_all(cluster: Cluster, topic: str, expected: int, **options: object
              ) -> pa.Table:
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest",
                  **options) as consumer:  # type: ignore[arg-type]
        consumer.assign([TopicPartition(topic, p) for p in range(2)])
        tables = []
        got = 0
        for _ in range(100):
            table = consumer.poll_arrow(timeout_ms=500)
            if table.num_rows:
                tables.append(table)
                got += table.num_rows
            if got >= expected:
                break
        assert got == expected, f"read {got} of {expected}"
        return pa.concat_tables(tables).sort_by([("partition", "ascending"),
                                                 ("offset", "ascending")])


# ----------------------------------------------------------------------------- registry
def test_registry_ids_versions_and_lookups(admin: Admin) -> None:
    first = admin.register_schema("reg-value", ORDER_V1)
    assert admin.register_schema("reg-value", ORDER_V1) == first  # same schema: same id
    # Whitespace is not a new schema.
    assert admin.register_schema("reg-value", json.dumps(json.loads(ORDER_V1), indent=4)) \
        == first
    # The same schema under another subject keeps its global id.
    assert admin.register_schema("other-value", ORDER_V1) == first
    second = admin.register_schema("reg-value", ORDER_V2)
    assert second != first
    assert admin.list_schema_versions("reg-value") == [1, 2]
    assert {"reg-value", "other-value"} <= set(admin.list_subjects())
    latest = admin.get_schema("reg-value")
    assert (latest.version, latest.schema_id) == (2, second)
    assert admin.get_schema("reg-value", 1).schema_id == first
    assert parse_schema(admin.schema_by_id(second).schema).fingerprint == \
        parse_schema(ORDER_V2).fingerprint
    with pytest.raises(SchemaNotFoundError, match="version 9"):
        admin.get_schema("reg-value", 9)
    with pytest.raises(SchemaNotFoundError, match="subject 'nope-value' not found"):
        admin.list_schema_versions("nope-value")
    with pytest.raises(SchemaNotFoundError, match="schema id 99999"):
        admin.schema_by_id(99999)


def test_compatibility_refusals_give_the_reason(admin: Admin) -> None:
    admin.register_schema("compat-value", ORDER_V1)
    admin.register_schema("compat-value", ORDER_V2)
    reasons = admin.check_schema_compatibility("compat-value", ORDER_BAD)
    assert reasons and any("region" in r for r in reasons), reasons
    with pytest.raises(IncompatibleSchemaError, match="region"):
        admin.register_schema("compat-value", ORDER_BAD)
    assert admin.list_schema_versions("compat-value") == [1, 2]  # nothing registered
    # NONE lets it through; the subject's own level wins over the global one.
    assert admin.get_compatibility("compat-value") == "BACKWARD"
    admin.set_compatibility("NONE", "compat-value")
    assert admin.get_compatibility("compat-value") == "NONE"
    assert admin.get_compatibility() == "BACKWARD"
    assert admin.check_schema_compatibility("compat-value", ORDER_BAD) == []
    admin.register_schema("compat-value", ORDER_BAD)
    with pytest.raises(InvalidRequestError, match="compatibility level 'SIDEWAYS'"):
        admin.set_compatibility("SIDEWAYS", "compat-value")
    # Reasons name the registry's version numbers, also when earlier ones are deleted.
    admin.set_compatibility("BACKWARD_TRANSITIVE", "compat-value")
    admin.delete_schema_version("compat-value", 1)
    no_region = json.loads(ORDER_BAD)
    no_region["fields"] = [{**f, "type": "int"} if f["name"] == "customer" else f
                           for f in no_region["fields"]]
    reasons = admin.check_schema_compatibility("compat-value", json.dumps(no_region))
    assert reasons and all(r.startswith(("version 2:", "version 3:")) for r in reasons), \
        reasons


def test_hostile_and_invalid_schemas_are_refused(admin: Admin) -> None:
    nested: dict[str, object] = {"type": "string"}
    for depth in range(40):
        nested = {"type": "record", "name": f"R{depth}",
                  "fields": [{"name": "f", "type": nested}]}
    recursive = json.dumps({"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]})
    huge = json.dumps({"type": "record", "name": "Wide", "fields": [
        {"name": f"f{i}", "type": "string", "doc": "x" * 40} for i in range(6000)]})
    for text, why in ((json.dumps(nested), "depth|nest"), (recursive, "recursive"),
                      (huge, "KiB|bytes|large|fields"), ("{not json", "JSON|json"),
                      (json.dumps({"type": "record", "name": "U", "fields": [
                          {"name": "u", "type": ["int", "string"]}]}), "union")):
        with pytest.raises(InvalidSchemaError, match=why):
            admin.register_schema("hostile-value", text)
    with pytest.raises(SchemaNotFoundError):
        admin.list_schema_versions("hostile-value")  # nothing was registered


def test_deletes_follow_confluents_rules(cluster: Cluster, admin: Admin) -> None:
    ids = {admin.register_schema("del-value", ORDER_V1),
           admin.register_schema("del-value", ORDER_V2)}
    with pytest.raises(InvalidRequestError, match="not soft-deleted"):
        admin.delete_schema_version("del-value", 1, permanent=True)
    assert admin.delete_schema_version("del-value", 1) == 1
    assert admin.list_schema_versions("del-value") == [2]
    assert admin.list_schema_versions("del-value", include_deleted=True) == [1, 2]
    admin.delete_schema_version("del-value", 1, permanent=True)
    assert admin.list_schema_versions("del-value", include_deleted=True) == [2]
    assert admin.delete_subject("del-value") == [2]
    assert "del-value" not in admin.list_subjects()
    assert admin.delete_subject("del-value", permanent=True) == [2]
    assert "del-value" not in admin.list_subjects(include_deleted=True)
    # Ids are never given out again, even once compaction drops the deleted versions'
    # records: the permanent deletes wrote the registry's next id beside them.
    fresh = admin.register_schema("del2-value", json.dumps({
        "type": "record", "name": "Fresh", "fields": [{"name": "f", "type": "int"}]}))
    assert fresh > max(ids)
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(SCHEMAS_TOPIC, 0)])
        keys: list[bytes] = []
        for _ in range(20):
            keys += [r.key for r in consumer.poll(timeout_ms=500) if r.key]
            if any(b'"IDS"' in k for k in keys):
                break
    assert any(b'"IDS"' in k for k in keys), keys


# ----------------------------------------------------------------------------- typed topics
def test_typed_topic_round_trip_and_refusals(cluster: Cluster, admin: Admin) -> None:
    topic = "orders"
    _typed_topic(admin, topic)
    schema_id = admin.register_schema(f"{topic}-value", ORDER_V1)
    with Producer(cluster.bootstrap, linger_ms=5) as producer:
        # Columns: a pyarrow Table, one batch per partition.
        table = pa.Table.from_pylist(_orders(0, 100),
                                     schema=pa.schema(parse_schema(ORDER_V1).arrow_type))
        for p in range(2):
            producer.send_batch(topic, table, partition=p).result(30)
        # Dicts, per batch and per record.
        producer.send_batch(topic, _orders(100, 50), partition=0).result(30)
        for record in _orders(150, 10):
            producer.send(topic, record, partition=1)
        producer.flush(30)
        # A dict that does not match is refused before anything is queued.
        with pytest.raises(SchemaMismatchError, match="customer"):
            producer.send(topic, {"id": 1, "customer": 5, "amount": 1, "note": None})
    rows = _read_all(cluster, topic, 260)
    assert rows.schema.field("value").type == parse_schema(ORDER_V1).arrow_type
    values = rows.column("value").to_pylist()
    assert sorted(v["id"] for v in values) == sorted([*range(100), *range(100), *range(100, 160)])
    # Per-record consumers get dicts.
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 1)])
        first = consumer.poll(timeout_ms=5000)[0]
        assert first.value == {**_orders(0, 1)[0]}
    # Kafka-compatible formats for byte-oriented tools.
    as_json = _read_all(cluster, topic, 260, value_format="json")
    assert as_json.schema.field("value").type == pa.binary()
    doc = json.loads(as_json.column("value")[0].as_py())
    assert doc["customer"] == "c0" and doc["amount"] == "0.00"
    framed = _read_all(cluster, topic, 260, value_format="confluent")
    framed_id, body = parse_confluent_frame(framed.column("value")[0].as_py())
    assert framed_id == schema_id and body


def test_the_broker_refuses_batches_that_do_not_match(cluster: Cluster,
                                                      admin: Admin) -> None:
    topic = "strict"
    _typed_topic(admin, topic)
    cluster.wait_until_healthy(topic)  # raw requests go straight to a leader: it must lead
    schema_id = admin.register_schema(f"{topic}-value", ORDER_V1)
    wrong = pa.array([{"id": 1, "customer": 7}], pa.struct([
        pa.field("id", pa.int64(), nullable=False), pa.field("customer", pa.int64())]))
    described = admin.describe_topics([topic])[topic]
    for partition in described.partitions:  # both brokers: registry leader or not
        host, port = admin.describe_cluster().brokers[partition.leader]
        for batch, why in (
                (build_batch([b"raw bytes"]), "is typed"),
                (build_batch(wrong, value_schema_id=schema_id), "customer"),
                (build_batch(wrong, value_schema_id=424242), "424242")):
            answer = asyncio.run(_produce_raw(host, port, topic, partition.partition, batch))
            assert answer.error_code == SchemaMismatchError.code, answer
            assert why in (answer.error_message or ""), answer.error_message
    offsets = admin.list_offsets({TopicPartition(topic, p): "latest" for p in range(2)})
    assert all(o.offset == 0 for o in offsets.values())  # nothing was written
    with pytest.raises(Exception, match="set when the topic is created"):
        admin.alter_configs(topic, {"value.schema.subject": "other-value"})


def test_a_refused_schema_id_is_accepted_once_registered(cluster: Cluster,
                                                         admin: Admin) -> None:
    """A refusal is remembered for a second only: an id that was not a version of the
    subject is accepted as soon as it is registered there, on the registry's broker and
    on the other one (which cached the refusal; versions are cached for 30 s)."""
    topic = "later"
    _typed_topic(admin, topic)
    cluster.wait_until_healthy(topic)  # raw requests go straight to a leader: it must lead
    admin.register_schema(f"{topic}-value", ORDER_V1)
    elsewhere = admin.register_schema("elsewhere-value", ORDER_V2)  # its id, not here
    values = records_to_arrow([{**o, "channel": "app"} for o in _orders(0, 3)],
                              parse_schema(ORDER_V2))
    batch = build_batch(values, value_schema_id=elsewhere)
    described = admin.describe_topics([topic])[topic]
    leaders = {p.partition: admin.describe_cluster().brokers[p.leader]
               for p in described.partitions}
    for partition, (host, port) in leaders.items():
        answer = asyncio.run(_produce_raw(host, port, topic, partition, batch))
        assert answer.error_code == SchemaMismatchError.code, answer
        assert "not a live version" in (answer.error_message or "")
    assert admin.register_schema(f"{topic}-value", ORDER_V2) == elsewhere  # same text
    for partition, (host, port) in leaders.items():
        wait_for(f"partition {partition} takes id {elsewhere}",
                 lambda h=host, o=port, p=partition: asyncio.run(  # type: ignore[misc]
                     _produce_raw(h, o, topic, p, batch)),
                 lambda answer: answer.error_code == 0, timeout=10)


def test_a_request_another_broker_passed_on_is_not_passed_on_again(
        cluster: Cluster, admin: Admin) -> None:
    """A broker that does not lead ``__schemas``-0 passes a client's request on to the
    one that does, but answers NOT_COORDINATOR to one a broker passed on: two brokers with
    different views of the leader never send a request back and forth."""
    admin.register_schema("passed-value", ORDER_V1)
    leader = cluster.partition_state(SCHEMAS_TOPIC, 0).leader
    other = next(b for b in cluster.brokers if b != leader)
    host, port = admin.describe_cluster().brokers[other]
    request = SchemaRegistryRequest("get_version", "passed-value", version=-1)

    async def ask(client_id: str) -> SchemaRegistryResponse:
        connection = BrokerConnection(host, port, client_id=client_id)
        await connection.connect(timeout=10)
        try:
            response = await connection.request(ApiKey.SCHEMA_REGISTRY, request)
        finally:
            await connection.close()
        assert isinstance(response, SchemaRegistryResponse)
        return response

    passed_on = asyncio.run(ask("strata-admin"))
    assert passed_on.error_code == 0 and json.loads(passed_on.body or "{}")["version"] == 1
    again = asyncio.run(ask(f"broker-{leader}-schemas"))
    assert again.error_code == NotCoordinatorError.code, again
    assert "passed on by another broker" in (again.error_message or "")


async def _produce_raw(host: str, port: int, topic: str, partition: int, batch: bytes
                       ) -> ProducePartitionResponse:
    """One Produce request with ``batch`` as it is, as a non-Strata client could send."""
    connection = BrokerConnection(host, port)
    await connection.connect(timeout=10)
    try:
        response = await connection.request(ApiKey.PRODUCE, ProduceRequest(
            -1, 10_000, [ProduceTopic(topic, [ProducePartition(partition, batch)])]))
    finally:
        await connection.close()
    assert isinstance(response, ProduceResponse)
    return response.topics[0].partitions[0]


def test_evolution_reads_old_batches_under_the_new_version(cluster: Cluster,
                                                           admin: Admin) -> None:
    topic = "evolving"
    _typed_topic(admin, topic)
    admin.register_schema(f"{topic}-value", ORDER_V1)
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch(topic, _orders(0, 20), partition=0).result(30)
    admin.register_schema(f"{topic}-value", ORDER_V2)
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch(topic, [{**o, "channel": "app"} for o in _orders(20, 20)],
                            partition=1).result(30)
    rows = _read_all(cluster, topic, 40)  # reader: the latest version, v2
    by_id = {v["id"]: v for v in rows.column("value").to_pylist()}
    assert by_id[0]["channel"] == "web"  # written with v1: the default
    assert by_id[25]["channel"] == "app"
    old_reader = _read_all(cluster, topic, 40, value_schema_version=1)
    assert "channel" not in old_reader.column("value").type.names
    with pytest.raises(IncompatibleSchemaError):
        admin.register_schema(f"{topic}-value", ORDER_BAD)
    # v3 removes a field that had a default (BACKWARD allows it): v3 readers no longer
    # see it; a v2 reader of v3 data gets the default back.
    v3 = json.loads(ORDER_V2)
    v3["fields"] = [f for f in v3["fields"] if f["name"] != "note"]
    admin.register_schema(f"{topic}-value", json.dumps(v3))
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch(topic, [{k: v for k, v in o.items() if k != "note"}
                                    for o in _orders(40, 10)], partition=0).result(30)
    latest = _read_all(cluster, topic, 50)
    assert "note" not in latest.column("value").type.names
    v2_reader = {v["id"]: v for v in _read_all(cluster, topic, 50, value_schema_version=2)
                 .column("value").to_pylist()}
    assert v2_reader[45]["note"] is None and v2_reader[2]["note"] == "n2"


def test_a_refused_batch_makes_the_producer_fetch_the_latest_version(
        cluster: Cluster, admin: Admin) -> None:
    """The producer caches the subject's latest version for 30 s; once a broker refuses
    a batch (the version was soft-deleted), the next record is converted under the
    latest version the registry has now, not the cached one for the rest of the 30 s."""
    topic = "refreshing"
    subject = f"{topic}-value"
    _typed_topic(admin, topic, partitions=4)
    admin.register_schema(subject, ORDER_V1)
    admin.register_schema(subject, ORDER_V2)
    # A partition led by the registry's broker: the delete clears that broker's verdicts
    # at once (other brokers within their 30 s TTL).
    registry_leader = cluster.partition_state(SCHEMAS_TOPIC, 0).leader
    described = admin.describe_topics([topic])[topic]
    p = next(d.partition for d in described.partitions if d.leader == registry_leader)
    order = _orders(0, 1)[0]
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        producer.send(topic, {**order, "id": 1}, partition=p).result(30)  # under v2
        admin.delete_schema_version(subject, 2)
        with pytest.raises(SchemaMismatchError, match="not a live version"):
            producer.send(topic, {**order, "id": 2}, partition=p).result(30)
        producer.send(topic, {**order, "id": 3}, partition=p).result(30)  # under v1
    rows = _read_all_partition(cluster, topic, p, 2)  # read under the latest: v1
    assert [v["id"] for v in rows] == [1, 3]


# ----------------------------------------------------------------------------- gateway
@pytest.fixture(scope="module")
def gateway(cluster: Cluster) -> Iterator[Gateway]:
    with running_gateway(cluster.bootstrap, "--no-auth") as gw:
        yield gw


def test_gateway_serves_the_registry_api(gateway: Gateway) -> None:
    url = gateway.url
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    made = httpx.post(f"{url}/subjects/gw-value/versions", headers=headers,
                      json={"schema": ORDER_V1}, timeout=30)
    assert made.status_code == 200, made.text
    schema_id = made.json()["id"]
    again = httpx.post(f"{url}/subjects/gw-value/versions", headers=headers,
                       json={"schema": ORDER_V1}, timeout=30)
    assert again.json() == {"id": schema_id}
    assert httpx.get(f"{url}/subjects/gw-value/versions", timeout=30).json() == [1]
    got = httpx.get(f"{url}/subjects/gw-value/versions/latest", timeout=30).json()
    assert (got["subject"], got["version"], got["id"]) == ("gw-value", 1, schema_id)
    assert "schemaType" not in got  # Confluent omits AVRO
    by_id = httpx.get(f"{url}/schemas/ids/{schema_id}", timeout=30)
    assert json.loads(by_id.json()["schema"]) == json.loads(ORDER_V1)
    missing = httpx.get(f"{url}/subjects/none-value/versions", timeout=30)
    assert missing.status_code == 404 and missing.json()["error_code"] == 40401
    check = httpx.post(f"{url}/compatibility/subjects/gw-value/versions/latest",
                       headers=headers, json={"schema": ORDER_BAD}, timeout=30).json()
    assert check["is_compatible"] is False and check["messages"]
    refused = httpx.post(f"{url}/subjects/gw-value/versions", headers=headers,
                         json={"schema": ORDER_BAD}, timeout=30)
    assert refused.status_code == 409 and refused.json()["error_code"] == 409
    bad = httpx.post(f"{url}/subjects/gw-value/versions", headers=headers,
                     json={"schema": "{nope"}, timeout=30)
    assert bad.status_code == 422 and bad.json()["error_code"] == 42201
    assert httpx.get(f"{url}/config", timeout=30).json() == {"compatibilityLevel": "BACKWARD"}
    put = httpx.put(f"{url}/config/gw-value", headers=headers,
                    json={"compatibility": "FULL"}, timeout=30)
    assert put.json() == {"compatibility": "FULL"}
    assert httpx.get(f"{url}/config/gw-value", timeout=30).json() == \
        {"compatibilityLevel": "FULL"}
    json_schema = json.dumps({"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["id"]})
    as_json = httpx.post(f"{url}/subjects/js-value/versions", headers=headers,
                         json={"schema": json_schema, "schemaType": "JSON"}, timeout=30)
    assert as_json.status_code == 200, as_json.text
    assert httpx.get(f"{url}/subjects/js-value/versions/1", timeout=30).json()[
        "schemaType"] == "JSON"


def test_gateway_validates_json_records_for_a_typed_topic(cluster: Cluster, admin: Admin,
                                                          gateway: Gateway) -> None:
    topic = "gw-orders"
    _typed_topic(admin, topic)
    admin.register_schema(f"{topic}-value", ORDER_V1)
    cid = admin.describe_cluster().cluster_id
    good = {"id": 1, "customer": "a", "amount": "1.50", "note": None}
    answer = httpx.post(
        f"{gateway.url}/v3/clusters/{cid}/topics/{topic}/records:batch",
        json={"entries": [
            {"id": "0", "partition_id": 0, "value": {"type": "JSON", "data": good}},
            {"id": "1", "partition_id": 0, "value": {"type": "JSON", "data": {
                **good, "id": "not a number"}}},
            {"id": "2", "partition_id": 0, "value": {"type": "BINARY", "data": "AAEC"}},
            {"id": "3", "partition_id": 0, "value": {"type": "JSON", "data": {
                **good, "id": 3}}},
        ]}, timeout=30)
    assert answer.status_code == 207, answer.text
    body = answer.json()
    assert sorted(r["id"] for r in body["successes"]) == ["0", "3"], body
    failures = {r["id"]: r for r in body["failures"]}
    assert sorted(failures) == ["1", "2"], body
    assert all(r["error_code"] == 422 for r in failures.values()), failures
    assert "entries[1].value.id" in failures["1"]["message"], failures["1"]
    assert "typed" in failures["2"]["message"]
    # One record with its own timestamp takes the one-by-one path: checked the same way.
    url = f"{gateway.url}/v3/clusters/{cid}/topics/{topic}/records"
    stamped = {"partition_id": 0, "timestamp": "2026-11-01T00:00:00Z",
               "value": {"type": "JSON", "data": {**good, "id": 4}}}
    assert httpx.post(url, json=stamped, timeout=30).status_code == 200
    refused = httpx.post(url, json={**stamped, "value": {"type": "JSON", "data": {
        **good, "amount": "lots"}}}, timeout=30)
    assert refused.status_code == 422 and "value.amount" in refused.json()["message"], \
        refused.text
    rows = _read_all_partition(cluster, topic, 0, 3)
    assert [v["id"] for v in rows] == [1, 3, 4]
    # Many records in one request are produced as columns, one send per target partition
    # (explicit, by key, or sticky): every report names where its own record is.
    mixed = [{"partition_id": i % 2, "value": {"type": "JSON", "data": {**good, "id": 10 + i}}}
             for i in range(4)]
    mixed += [{"key": {"type": "STRING", "data": f"k{i}"},
               "value": {"type": "JSON", "data": {**good, "id": 20 + i}}} for i in range(4)]
    mixed.insert(3, {"partition_id": 7, "value": {"type": "JSON", "data": {**good, "id": 99}}})
    plain = [{"value": {"type": "JSON", "data": {**good, "id": 30 + i}}} for i in range(5)]
    sent: dict[tuple[int, int], int] = {}
    for records in (mixed, plain):
        answer = httpx.post(url, content="".join(json.dumps(r) + "\n" for r in records),
                            headers={"Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == 200, answer.text
        reports = [json.loads(line) for line in answer.text.splitlines()]
        assert len(reports) == len(records)
        for record, report in zip(records, reports, strict=True):
            if record.get("partition_id") == 7:
                assert report["error_code"] == 404 and "partition_id 7" in report["message"]
                continue
            assert report["error_code"] == 200, report
            sent[(report["partition_id"], report["offset"])] = record["value"]["data"]["id"]
    assert len({p for p, _ in list(sent)[-5:]}) == 1  # keyless: one sticky partition
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(2)])
        stored: dict[tuple[int, int], int] = {}
        for _ in range(40):
            stored.update({(r.partition, r.offset): r.value["id"]
                           for r in consumer.poll(timeout_ms=500)})
            if len(stored) >= 3 + len(sent):
                break
    assert {k: v for k, v in stored.items() if v >= 10} == sent
    for i in range(4):  # keyed records went to their key's partition
        key = f"k{i}".encode()
        assert [p for (p, _), v in sent.items() if v == 20 + i] == \
            [partition_for_key(key, 2)]


def _stored_ids(cluster: Cluster, topic: str, partitions: int, n: int
                ) -> dict[tuple[int, int], int]:
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        stored: dict[tuple[int, int], int] = {}
        for _ in range(60):
            stored.update({(r.partition, r.offset): r.value["id"]
                           for r in consumer.poll(timeout_ms=500)})
            if len(stored) >= n:
                break
        return stored


def test_gateway_typed_requests_larger_than_a_batch_and_full_of_bad_records(
        cluster: Cluster, admin: Admin) -> None:
    """A typed request of several wire batches (128 KiB each) is cut into slices, each
    reported on its own, and every report names where its record is; a request where
    every other record is bad refuses just those, each naming its field; a version
    registered through the gateway is used by its next record."""
    topic = "gw-large"
    _typed_topic(admin, topic, partitions=3)
    admin.register_schema(f"{topic}-value", ORDER_V1)
    cid = admin.describe_cluster().cluster_id
    with running_gateway(cluster.bootstrap, "--no-auth", "--max-request-bytes",
                         str(4 << 20)) as gateway:
        _large_typed_requests(cluster, gateway, topic,
                              f"{gateway.url}/v3/clusters/{cid}/topics/{topic}/records")


def _large_typed_requests(cluster: Cluster, gateway: Gateway, topic: str, url: str) -> None:
    good = {"customer": "c", "amount": "1.00"}

    def post(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer = httpx.post(url, content="".join(json.dumps(r) + "\n" for r in records),
                            headers={"Content-Type": "application/json"}, timeout=60)
        assert answer.status_code == 200, answer.text[:500]
        return [json.loads(line) for line in answer.text.splitlines()]

    big = [{"value": {"type": "JSON", "data": {**good, "id": i, "note": "n" * 1000}}}
           for i in range(400)]  # about 400 KB of values: four or more wire batches
    reports = post(big)
    assert all(r["error_code"] == 200 for r in reports), reports[:3]
    sent = {(r["partition_id"], r["offset"]): i for i, r in enumerate(reports)}
    assert len(sent) == 400
    # several wire batches: the sticky partition moves on after each (to another one)
    assert len({p for p, _ in sent}) >= 2
    mixed = [{"value": {"type": "JSON", "data": {**good, "id": 1000 + i} if i % 2 else
                        {**good, "id": f"bad {i}"}}} for i in range(2000)]
    reports = post(mixed)
    assert [r["error_code"] for r in reports] == [422, 200] * 1000
    assert all(f"[{i}].value.id" in reports[i]["message"] for i in range(0, 2000, 2))
    sent.update({(r["partition_id"], r["offset"]): 1000 + i
                 for i, r in enumerate(reports) if r["error_code"] == 200})
    assert _stored_ids(cluster, topic, 3, len(sent)) == sent
    # A new version registered through the gateway: its next record may use the field.
    registry = httpx.post(f"{gateway.url}/subjects/{topic}-value/versions",
                          json={"schema": ORDER_V2}, timeout=30)
    assert registry.status_code == 200, registry.text
    [report] = post([{"partition_id": 0, "value": {"type": "JSON", "data": {
        **good, "id": 5000, "channel": "app"}}}])
    assert report["error_code"] == 200, report
    rows = _read_all_partition(cluster, topic, 0, len([k for k in sent if k[0] == 0]) + 1)
    assert rows[-1]["id"] == 5000 and rows[-1]["channel"] == "app"


def admin_id(cluster: Cluster, subject: str) -> int:
    with Admin(cluster.bootstrap) as admin:
        return admin.get_schema(subject).schema_id


def _read_all_partition(cluster: Cluster, topic: str, partition: int, n: int
                        ) -> list[dict[str, object]]:
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, partition)])
        out: list[dict[str, object]] = []
        for _ in range(40):
            out += [r.value for r in consumer.poll(timeout_ms=500)]
            if len(out) >= n:
                break
        return out


def test_cli_schema_commands(cluster: Cluster, tmp_path: Path) -> None:
    import subprocess
    import sys

    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(ORDER_V1)

    def strata(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "strata_tools.cli", *args,
                               "--bootstrap", cluster.bootstrap], capture_output=True,
                              text=True, timeout=120)

    made = strata("schema", "register", "cli-value", "--file", str(schema_file),
                  "--format", "json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["version"] == 1
    assert "cli-value" in strata("schema", "list").stdout.split()
    got = strata("schema", "get", "cli-value", "--format", "json")
    assert json.loads(json.loads(got.stdout)["schema"]) == json.loads(ORDER_V1)
    bad_file = tmp_path / "bad.avsc"
    bad_file.write_text(ORDER_BAD)
    ok = strata("schema", "check", "cli-value", "--file", str(schema_file))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    refused = strata("schema", "register", "cli-value", "--file", str(tmp_path / "nope"))
    assert refused.returncode == 1 and "cannot read" in refused.stderr
    incompatible = strata("schema", "check", "cli-value", "--file", str(bad_file))
    assert incompatible.returncode == 1 and "region" in incompatible.stdout, incompatible
    # A typed topic from the command line, read back as JSON and as Confluent frames.
    made = strata("topic", "create", "cli", "--partitions", "1", "--replicas", "1", "--typed")
    assert made.returncode == 0, made.stderr
    with Producer(cluster.bootstrap) as producer:
        producer.send("cli", _orders(7, 1)[0]).result(30)
    shown = strata("consume", "cli", "--from-beginning", "-n", "1", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    value = json.loads(json.loads(shown.stdout.splitlines()[0])["value"])
    assert value == {"id": 7, "customer": "c0", "amount": "0.07", "note": None}
    framed = strata("consume", "cli", "--from-beginning", "-n", "1", "--format", "json",
                    "--value-format", "confluent")
    record = json.loads(framed.stdout.splitlines()[0])
    raw = base64.b64decode(record["value"]) if record["value_encoding"] == "base64" \
        else record["value"].encode()
    assert parse_confluent_frame(raw)[0] == admin_id(cluster, "cli-value"), record


def test_registry_ids_survive_its_leader_being_killed(cluster: Cluster,
                                                      admin: Admin) -> None:
    """SIGKILL the broker leading ``__schemas``-0: the other replica takes over with
    every id it answered, and gives out no id twice."""
    before = {s: admin.get_schema(s).schema_id for s in ("reg-value", "other-value")}
    leader = admin.describe_topics(["__schemas"])["__schemas"].partitions[0].leader
    cluster.kill(leader)
    try:
        for subject, schema_id in before.items():
            assert admin.get_schema(subject).schema_id == schema_id
        fresh = admin.register_schema("after-failover-value", json.dumps({
            "type": "record", "name": "Fresh", "fields": [{"name": "x", "type": "int"}]}))
        every = [admin.schema_by_id(i).schema_id for i in before.values()]
        assert fresh not in every and fresh > max(every)
    finally:
        cluster.restart(leader)
