"""The runnable examples of the docs, run as they are written against a real broker.

A Python block in ``docs/*.md`` marked by an ``<!-- example: NAME -->`` line just above
it is an example a test here runs: the block is read from the doc (never copied into the
test), executed with ``STRATA_BOOTSTRAP`` pointing at the module's broker, and its effect
checked. So the docs cannot show code that does not work.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from strata.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from tests.support.broker_process import BrokerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DOCS = Path(__file__).resolve().parents[1] / "docs"


def example(doc: str, name: str) -> str:
    """The Python block right after ``<!-- example: name -->`` in ``docs/doc``."""
    text = (DOCS / doc).read_text()
    found = re.search(rf"<!-- example: {re.escape(name)} -->\n```python\n(.*?)\n```\n",
                      text, re.DOTALL)
    assert found, f"docs/{doc} has no example {name!r} (an `<!-- example: {name} -->` " \
        "line right above a ```python block)"
    return found.group(1)


def test_every_marked_example_is_run_by_a_test() -> None:
    here = Path(__file__).read_text()
    for doc in sorted(DOCS.glob("*.md")):
        for name in re.findall(r"<!-- example: ([\w-]+) -->", doc.read_text()):
            assert f'example("{doc.name}", "{name}")' in here, \
                f"docs/{doc.name} marks example {name!r}, which no test here runs"


def test_consume_transform_produce(broker: BrokerProcess,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/transactions.md: every input record once in the output at read_committed,
    and the group's committed offsets at the end of the input."""
    code = example("transactions.md", "consume-transform-produce")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics([NewTopic("orders", 2, 1), NewTopic("orders-upper", 2, 1)])
    inputs = [f"order-{i}".encode() for i in range(40)]
    with Producer(broker.bootstrap) as producer:
        for i, value in enumerate(inputs):
            producer.send("orders", value, partition=i % 2)
    # Last in partition 0, an aborted transaction: read_committed never hands it over.
    with Producer(broker.bootstrap, transactional_id="upstream") as upstream:
        upstream.init_transactions()
        upstream.begin_transaction()
        upstream.send("orders", b"never", partition=0)
        upstream.flush()
        upstream.abort_transaction()

    monkeypatch.setenv("STRATA_BOOTSTRAP", broker.bootstrap)
    exec(compile(code, "docs/transactions.md#consume-transform-produce", "exec"), {})

    out: list[bytes] = []
    with Consumer(broker.bootstrap, isolation_level="read_committed",
                  auto_offset_reset="earliest") as reader:
        reader.assign([TopicPartition("orders-upper", p) for p in range(2)])
        deadline = time.monotonic() + 10
        while len(out) < len(inputs) and time.monotonic() < deadline:
            out += [r.value or b"" for r in reader.poll(timeout_ms=300)]
        out += [r.value or b"" for r in reader.poll(timeout_ms=1000)]  # nothing more
    assert sorted(out) == sorted(v.upper() for v in inputs)
    with Consumer(broker.bootstrap, group_id="upper-casing",
                  isolation_level="read_committed") as group:
        committed = group.committed([TopicPartition("orders", p) for p in range(2)])
    with Admin(broker.bootstrap) as admin:
        ends = admin.list_offsets({TopicPartition("orders", p): "latest" for p in range(2)})
        # The last commit returned once PrepareCommit was durable; the markers follow.
        state = wait_for("the last commit to complete", lambda: admin.describe_transactions(
            ["upper-casing-0"])["upper-casing-0"].state, lambda s: s != "PrepareCommit", 30)
    # Each partition's last record processed, committed with the output; in partition 0
    # the aborted record and its marker follow it, never handed over.
    assert committed == {TopicPartition("orders", 0): ends[TopicPartition("orders", 0)].offset
                         - 2,
                         TopicPartition("orders", 1): ends[TopicPartition("orders", 1)].offset}
    assert state == "CompleteCommit"
