"""Transactions and the Delta tier (docs/spark.md, "Transactions and the tier") with a
real broker, real transactional producers, the real tiering job on Spark and Delta.

One partition receives committed and aborted transactions, plain records, and a
transaction left open, with aborted and committed ones after its first record; every
record is a batch (and a segment) of its own, so ranges end on markers too. Checked:
the job copies only below the last stable offset and only committed records (the table
holds exactly the rows a read_committed read of the log gives there, markers and
aborted records leaving gaps); once the open transaction commits, a read across the
tier and the hot log at read_committed (the Spark source's executor read, tier ranges
from Delta and log ranges through a read_committed consumer) equals a read_committed
read of the log alone; and after a second pass, a Spark query over both tiers gives the
same rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest

from spark_jobs import TierJob, TierSettings
from spark_source._options import parse_source_options
from spark_source._read import read_range
from spark_source._reader import StrataBatchReader
from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.system, pytest.mark.spark, pytest.mark.timeout(420)]

Row = tuple[int, bytes, bytes]  # offset, key, value


def read_log(bootstrap: str, topic: str, start: int, end: int,
             isolation: Literal["read_committed", "read_uncommitted"] = "read_committed"
             ) -> list[Row]:
    """A consumer's records of ``[start, end)`` (at read_committed its position moves
    past markers and aborted records, which give no record)."""
    tp = TopicPartition(topic, 0)
    out: list[Row] = []
    with Consumer(bootstrap, isolation_level=isolation,
                  auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, start)

        def step() -> int:
            out.extend((r.offset, r.key or b"", r.value or b"")
                       for r in consumer.poll(timeout_ms=200) if r.offset < end)
            return consumer.position(tp)

        wait_for(f"a {isolation} read of {topic} up to {end}", step,
                 lambda position: position >= end, timeout=60)
    return out


def delta_rows(spark: Any, table: str) -> list[Row]:
    rows = spark.read.format("delta").load(table).where("partition = 0") \
        .select("offset", "key", "value").orderBy("offset").collect()
    return [(r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows]


def log_start(admin: Admin, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    return admin.list_offsets({tp: "earliest"})[tp].offset


def high_watermark(admin: Admin, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    return admin.list_offsets({tp: "latest"})[tp].offset


def tier_of(admin: Admin, topic: str) -> tuple[str, int]:
    tier = admin.describe_tier([topic])[topic]
    assert tier.table is not None
    return tier.table, tier.partitions[0].tiered_up_to


def test_the_tier_holds_committed_records_below_the_lso_and_replays_read_committed(
        broker_factory: Callable[..., BrokerProcess], spark: Any, tmp_path: Path) -> None:
    broker = broker_factory(0, {"log.retention.check.interval.ms": "200",
                                "transaction.state.log.num.partitions": "1"})
    bootstrap = broker.bootstrap
    topic = f"tier-txn-{uuid.uuid4().hex[:6]}"
    admin = Admin(bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1, {
        "tier.enable": "true", "tier.after.ms": "0", "segment.bytes": "1024",
        "local.retention.ms": "0"})])
    writer = Producer(bootstrap, transactional_id=f"tier-writer-{uuid.uuid4().hex}")
    # Its transaction stays open across Spark jobs: far past the default 60 s timeout.
    holder = Producer(bootstrap, transactional_id=f"tier-holder-{uuid.uuid4().hex}",
                      transaction_timeout_ms=600_000)
    plain = Producer(bootstrap, acks="all")
    sent: dict[bytes, str] = {}  # value -> what became of it

    def send(producer: Producer, value: str, fate: str) -> int:
        future = producer.send(topic, value.encode(), key=f"key-{value}".encode(),
                               partition=0)
        producer.flush()
        sent[value.encode()] = fate
        return future.result(timeout=30).offset

    def transaction(name: str, count: int, *, commit: bool) -> None:
        writer.begin_transaction()
        for i in range(count):
            send(writer, f"{name}-{i}", "committed" if commit else "aborted")
        if commit:
            writer.commit_transaction()
        else:
            writer.abort_transaction()

    try:
        writer.init_transactions()
        holder.init_transactions()
        transaction("c1", 3, commit=True)
        transaction("a2", 3, commit=False)
        send(plain, "p1", "committed")
        transaction("c3", 2, commit=True)
        transaction("a4", 2, commit=False)
        send(plain, "p2", "committed")
        # A transaction left open; after its first record, more of every kind.
        holder.begin_transaction()
        lso = send(holder, "o5-0", "committed")  # it commits later
        transaction("a6", 2, commit=False)
        transaction("c7", 2, commit=True)
        send(plain, "p3", "committed")
        assert high_watermark(admin, topic) > lso

        # The log alone, at read_committed, up to the LSO (nothing deleted yet).
        before_lso = read_log(bootstrap, topic, 0, lso)
        assert [v for _, _, v in before_lso] == [
            v for v, fate in sent.items() if fate == "committed"][:len(before_lso)]
        assert not any(sent[v] == "aborted" for _, _, v in before_lso)

        # --- the tiering job while the transaction is open: it stops at the LSO.
        warehouse = tmp_path / "warehouse"
        with TierJob(spark, TierSettings(bootstrap, warehouse, lease_wait_s=30.0)) as job:
            job.run_once([topic])
            table, tiered = tier_of(admin, topic)
            assert 0 < tiered <= lso
            rows = delta_rows(spark, table)
            # Exactly the committed records below it: no aborted record, no row at a
            # marker's offset (the gaps a read_committed consumer sees too).
            assert rows == [r for r in before_lso if r[0] < tiered]
            assert not any(sent[v] == "aborted" for _, _, v in rows)
            job.run_once([topic])  # nothing more is due while it is open
            assert tier_of(admin, topic)[1] == tiered
            wait_for("local retention of the tiered segments",
                     lambda: log_start(admin, topic), lambda start: start == tiered)
            # A Spark query up to the LSO: from Delta (and the hot log from the tier's end).
            frame = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
                .option("subscribe", topic).option("startingOffsets", "earliest") \
                .option("endingOffsets", json.dumps({topic: {"0": lso}})).load()
            got = [(r["offset"], bytes(r["key"]), bytes(r["value"]))
                   for r in frame.orderBy("offset").collect()]
            assert got == before_lso

            # --- the open transaction commits: the hot log now holds aborted records
            # and markers after the tier's end.
            holder.commit_transaction()
            send(plain, "p4", "committed")
            end = high_watermark(admin, topic)
            reference = before_lso + read_log(bootstrap, topic, lso, end)
            assert [v for _, _, v in reference] == \
                [v for v, fate in sent.items() if fate == "committed"]
            # The hot log past the tier's end really holds aborted records to skip.
            hot = read_log(bootstrap, topic, tiered, end, "read_uncommitted")
            assert any(sent[v] == "aborted" for _, _, v in hot)

            # The source's plan and executor read across both tiers, the log ranges
            # through a read_committed consumer: each range filtered (or not) by its
            # own source.
            options = parse_source_options({"bootstrap.servers": bootstrap,
                                            "subscribe": topic,
                                            "endingOffsets": json.dumps({topic: {"0": end}})},
                                           streaming=False)
            ranges = StrataBatchReader(options).partitions()
            assert {r.source for r in ranges} == {"tier", "log"}
            read: list[Row] = []
            with Consumer(bootstrap, isolation_level="read_committed",
                          auto_offset_reset="none") as consumer:
                for rng in sorted(ranges, key=lambda r: r.start):
                    shared = consumer if rng.source == "log" else None
                    for batch in read_range(options, rng, shared):
                        read += zip(batch.column("offset").to_pylist(),
                                    batch.column("key").to_pylist(),
                                    batch.column("value").to_pylist(), strict=True)
            assert read == reference

            # --- a second pass copies the rest: the aborted records written after the
            # open transaction's first record stay out of the table too.
            job.run_once([topic])
            table, tiered = tier_of(admin, topic)
            assert tiered > lso
            rows = delta_rows(spark, table)
            assert rows == [r for r in reference if r[0] < tiered]
            wait_for("local retention of the newly tiered segments",
                     lambda: log_start(admin, topic), lambda start: start == tiered)
        # A Spark query over both tiers (Delta, then the log's last segment: p4).
        frame = spark.read.format("strata").option("bootstrap.servers", bootstrap) \
            .option("subscribe", topic).option("startingOffsets", "earliest") \
            .option("endingOffsets", json.dumps({topic: {"0": end}})).load()
        got = [(r["offset"], bytes(r["key"]), bytes(r["value"]))
               for r in frame.orderBy("offset").collect()]
        assert got == reference
    finally:
        for producer in (writer, holder, plain):
            producer.close()
        admin.close()
