"""The ingest gateway under a broker crash (issue [5/7] section 4): a broker killed mid-load
yields 503s or successes, never a false success.

Three brokers, a topic with RF=3 and min.insync.replicas=2, one real `strata gateway`
process. Sixteen concurrent HTTP clients post single records and batches, every payload
unique, for ~15 s while the test SIGKILLs the leader of partition 0. Every answer is
recorded; each must be a success (200, or 207 with per-record 200s) or a 503 with
Retry-After (per record in a 207), nothing else. Then every partition is read back with
the real consumer: each acknowledged (partition, offset) must hold exactly the payload
the gateway reported there, so no acknowledged record is missing or misplaced.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.cluster import Cluster
from tests.support.gateway import Gateway, running_gateway
from tests.support.nemesis import read_partitions
from tests.support.waiting import wait_for

TOPIC = "gw-faults"
PARTITIONS = 3
CLIENTS = 16
LOAD_S = 15.0
KILL_AFTER_S = 4.0
KILLED_PARTITION = 0

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]


@dataclass
class Outcome:
    """Every answer of the load, and what it acknowledged."""

    #: (partition, offset) -> the payload the gateway reported written there.
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    #: acknowledgements at a (partition, offset) already acknowledged for another payload.
    double_acks: list[str] = field(default_factory=list)
    #: answers that are neither a success nor a retriable 503.
    bad: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    sent: set[bytes] = field(default_factory=set)
    acked_after_kill: int = 0
    unavailable_messages: Counter[str] = field(default_factory=Counter)
    killed_at: float | None = None

    def ack(self, report: dict[str, Any], payload: bytes, what: str) -> None:
        if report.get("error_code") != 200 or not isinstance(report.get("offset"), int) \
                or report["offset"] < 0 or report.get("topic_name") != TOPIC:
            self.bad.append(f"{what}: success report {report}")
            return
        key = (int(report["partition_id"]), int(report["offset"]))
        if key in self.acked and self.acked[key] != payload:
            self.double_acks.append(f"{what}: {key} acknowledged for {self.acked[key]!r} "
                                    f"and {payload!r}")
        self.acked[key] = payload
        if self.killed_at is not None:
            self.acked_after_kill += 1

    def unavailable(self, body: Any, what: str, headers: httpx.Headers | None) -> None:
        if not (isinstance(body, dict) and body.get("error_code") == 503
                and isinstance(body.get("message"), str)):
            self.bad.append(f"{what}: 503 with body {body!r}")
        else:
            self.unavailable_messages[body["message"].split(":", 1)[0]] += 1
        if headers is not None and headers.get("Retry-After") is None:
            self.bad.append(f"{what}: 503 without Retry-After")


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[Cluster]:
    with Cluster(tmp_path, brokers=3) as c:
        c.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        c.wait_until_healthy(TOPIC)
        yield c


def _record(payload: bytes, rng: random.Random) -> dict[str, Any]:
    record: dict[str, Any] = {"value": {"type": "STRING", "data": payload.decode()}}
    if rng.random() < 0.5:
        record["partition_id"] = rng.randrange(PARTITIONS)
    elif rng.random() < 0.5:
        record["key"] = {"type": "STRING", "data": f"k{rng.randrange(100)}"}
    return record


async def _client(n: int, url: str, stop: float, outcome: Outcome,
                  counter: Iterator[int]) -> None:
    rng = random.Random(n)
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() < stop:
            if rng.random() < 0.5:
                payload = f"c{n}-m{next(counter)}".encode()
                outcome.sent.add(payload)
                what = f"POST records {payload!r}"
                try:
                    answer = await http.post(f"{url}/records", json=_record(payload, rng))
                except httpx.HTTPError as err:
                    outcome.bad.append(f"{what}: no answer: {err!r}")
                    continue
                outcome.statuses[f"single {answer.status_code}"] += 1
                if answer.status_code == 200:
                    outcome.ack(answer.json(), payload, what)
                elif answer.status_code == 503:
                    outcome.unavailable(answer.json(), what, answer.headers)
                else:
                    outcome.bad.append(f"{what}: {answer.status_code} {answer.text}")
            else:
                payloads = [f"c{n}-b{next(counter)}".encode()
                            for _ in range(rng.randint(2, 6))]
                outcome.sent.update(payloads)
                entries = [{"id": p.decode(), **_record(p, rng)} for p in payloads]
                what = f"POST records:batch {[p.decode() for p in payloads]}"
                try:
                    answer = await http.post(f"{url}/records:batch", json={"entries": entries})
                except httpx.HTTPError as err:
                    outcome.bad.append(f"{what}: no answer: {err!r}")
                    continue
                outcome.statuses[f"batch {answer.status_code}"] += 1
                if answer.status_code == 503:
                    outcome.unavailable(answer.json(), what, answer.headers)
                    continue
                if answer.status_code != 207:
                    outcome.bad.append(f"{what}: {answer.status_code} {answer.text}")
                    continue
                body = answer.json()
                seen = [s.get("id") for s in body["successes"]] + \
                    [f.get("id") for f in body["failures"]]
                if sorted(seen) != sorted(p.decode() for p in payloads):
                    outcome.bad.append(f"{what}: 207 reports ids {seen}")
                for success in body["successes"]:
                    outcome.statuses["batch entry 200"] += 1
                    outcome.ack(success, str(success["id"]).encode(), what)
                for failure in body["failures"]:
                    outcome.statuses[f"batch entry {failure.get('error_code')}"] += 1
                    if failure.get("error_code") != 503:
                        outcome.bad.append(f"{what}: entry failure {failure}")


async def _load(gateway: Gateway, cluster_id: str, cluster: Cluster, outcome: Outcome
                ) -> int:
    url = f"{gateway.url}/v3/clusters/{cluster_id}/topics/{TOPIC}"
    started = time.monotonic()
    counter = itertools.count()
    clients = [asyncio.create_task(_client(n, url, started + LOAD_S, outcome, counter))
               for n in range(CLIENTS)]
    await asyncio.sleep(KILL_AFTER_S)
    victim = cluster.leader_of(TOPIC, KILLED_PARTITION)
    await asyncio.to_thread(cluster.kill, victim)
    outcome.killed_at = time.monotonic() - started
    await asyncio.gather(*clients)
    return victim


def test_broker_killed_mid_load_gives_503_or_true_success(cluster: Cluster) -> None:
    with running_gateway(cluster.bootstrap, "--no-auth") as gateway:
        with httpx.Client(timeout=10) as http:
            wait_for("gateway ready", lambda: http.get(f"{gateway.url}/readyz").status_code,
                     lambda s: s == 200, timeout=30)
            cluster_id = http.get(f"{gateway.url}/v3/clusters").json()["data"][0]["cluster_id"]
        outcome = Outcome()
        victim = asyncio.run(_load(gateway, cluster_id, cluster, outcome))
        log = "".join(gateway.output)
    print(f"killed broker {victim} at {outcome.killed_at:.1f}s; answers "
          f"{dict(outcome.statuses)}; {len(outcome.acked)} acknowledged, "
          f"{outcome.acked_after_kill} after the kill; 503s: {dict(outcome.unavailable_messages)}")
    assert not outcome.bad, "\n".join(outcome.bad[:20]) + "\n--- gateway log:\n" + log[-4000:]
    assert not outcome.double_acks, "\n".join(outcome.double_acks[:20])
    assert outcome.acked_after_kill > 0, f"nothing acknowledged after the kill: {outcome}"

    high_watermarks = cluster.high_watermarks(TOPIC)
    records = read_partitions(cluster.bootstrap, TOPIC, high_watermarks)
    stored = {(p, offset): value for p, rows in records.items() for offset, value in rows}
    missing = [(key, payload) for key, payload in sorted(outcome.acked.items())
               if key not in stored]
    wrong = [(key, payload, stored[key]) for key, payload in sorted(outcome.acked.items())
             if key in stored and stored[key] != payload]
    assert not missing, f"{len(missing)} acknowledged records missing: {missing[:20]}"
    assert not wrong, f"{len(wrong)} offsets hold another payload: {wrong[:20]}"
    strangers = [v for v in stored.values() if v not in outcome.sent]
    assert not strangers, f"records nobody sent: {strangers[:20]}"
