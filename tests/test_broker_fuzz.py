"""Random frames against a live broker: it survives, and other clients are unaffected.

Hypothesis generates frames of four kinds: pure garbage, a valid size prefix with random
bytes, a valid request header with a random body, and a valid request with random
bytes flipped. Each goes over its own connection. After every example a well-behaved
client on another connection produces and fetches a record, and at the end the
partition holds exactly the well-behaved records, so no garbage reached a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokers.protocol import (
    ApiKey,
    CreatableTopic,
    CreateTopicsRequest,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    MetadataRequest,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    ReplicaAssignment,
    RequestHeader,
    encode_request,
)
from brokers.record_batch import batches_to_table, build_batch
from strata.client._connection import BrokerConnection
from tests.support.broker_process import BrokerProcess

TOPIC = "fuzz-target"


def _send_raw(port: int, data: bytes) -> None:
    """Write ``data`` on a fresh connection, read whatever comes back briefly, close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            contextlib.suppress(OSError):
        sock.sendall(data)
        sock.settimeout(0.05)
        sock.recv(65536)


def _valid_request(api: ApiKey) -> bytes:
    bodies = {
        ApiKey.METADATA: MetadataRequest([TOPIC]),
        ApiKey.PRODUCE: ProduceRequest(1, 1000, [ProduceTopic(TOPIC, [
            ProducePartition(0, build_batch([b"fuzz"]))])]),
        ApiKey.FETCH: FetchRequest([FetchTopic(TOPIC, [FetchPartition(0, 0)])], max_wait_ms=0),
    }
    return encode_request(RequestHeader(int(api), 0, 1, "fuzz"), bodies[api])


frames = st.one_of(
    st.binary(min_size=0, max_size=300),
    st.binary(min_size=0, max_size=300).map(lambda b: struct.pack(">i", len(b)) + b),
    st.tuples(st.integers(-5, 30), st.integers(-2, 3), st.binary(max_size=200)).map(
        lambda t: struct.pack(">i", 10 + len(t[2])) + struct.pack(">hhih", t[0], t[1], 7, -1)
        + t[2]),
    st.tuples(st.sampled_from([ApiKey.METADATA, ApiKey.FETCH]),
              st.lists(st.tuples(st.integers(4, 400), st.integers(1, 255)), max_size=4)).map(
        lambda t: _flip(_valid_request(t[0]), t[1])),
    st.sampled_from([struct.pack(">i", 2**31 - 1), struct.pack(">i", -1),
                     struct.pack(">i", 500 * 1024 * 1024) + b"\x00" * 64]),
)


def _flip(frame: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(frame)
    for position, xor in edits:
        if position < len(out):
            out[position] ^= xor
    return bytes(out)


async def _good_client_round_trip(port: int, expected_offset: int) -> None:
    async with BrokerConnection("127.0.0.1", port) as connection:
        produced = await connection.request(ApiKey.PRODUCE, ProduceRequest(1, 5000, [
            ProduceTopic(TOPIC, [ProducePartition(0, build_batch([b"good"]))])]))
        answer = produced.topics[0].partitions[0]
        assert answer.error_code == 0 and answer.base_offset == expected_offset
        fetched = await connection.request(ApiKey.FETCH, FetchRequest(
            [FetchTopic(TOPIC, [FetchPartition(0, expected_offset)])], max_wait_ms=0))
        records = fetched.topics[0].partitions[0].records
        table = batches_to_table(records, topic=TOPIC, partition=0, start_offset=expected_offset)
        assert table.column("value").to_pylist() == [b"good"]


def test_random_frames_do_not_hurt_the_broker_or_other_clients(broker: BrokerProcess) -> None:
    async def create() -> None:
        async with BrokerConnection("127.0.0.1", broker.port) as connection:
            await connection.request(ApiKey.CREATE_TOPICS, CreateTopicsRequest([CreatableTopic(
                TOPIC, -1, -1, [], [ReplicaAssignment(0, [broker.broker_id])])]))

    asyncio.run(create())
    good_writes = [0]

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(frame=frames)
    def hit(frame: bytes) -> None:
        _send_raw(broker.port, frame)
        assert broker.process is not None and broker.process.poll() is None, \
            "broker died:\n" + broker.log_text()

    hit()
    # Produce/fetch between bursts of garbage on other connections.
    for _ in range(3):
        asyncio.run(_good_client_round_trip(broker.port, good_writes[0]))
        good_writes[0] += 1
        hit()

    async def final_state() -> None:
        async with BrokerConnection("127.0.0.1", broker.port) as connection:
            fetched = await connection.request(ApiKey.FETCH, FetchRequest(
                [FetchTopic(TOPIC, [FetchPartition(0, 0)])], max_wait_ms=0))
            table = batches_to_table(fetched.topics[0].partitions[0].records, topic=TOPIC,
                                     partition=0)
            values = table.column("value").to_pylist()
            # Flipped produce requests are not generated, so only the good client wrote.
            assert values == [b"good"] * good_writes[0]
            metadata = await connection.request(ApiKey.METADATA, MetadataRequest(None))
            assert TOPIC in [t.name for t in metadata.topics]

    asyncio.run(final_state())
    # Garbage must be refused by validation, never reach a handler as an internal error.
    assert "Traceback" not in broker.log_text(), broker.log_text()[-3000:]
