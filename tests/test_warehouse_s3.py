"""An object-store warehouse end to end, against a real S3 API server on 127.0.0.1
(moto's standalone server, ``tests/support/s3_server.py``): concurrent delta-rs
commits on the store lose nothing, which rests on the store's conditional writes
(``If-None-Match``), shown directly; the Spark source's tier reader replays a range
from the store. The tier job and Spark through S3A are tests/test_tier_s3.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from strata_spark import Warehouse
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.system

BUCKET = "strata-warehouse-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server.serving(tmp_path_factory.mktemp("s3"), BUCKET) as server:
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key, value in s3.environment().items():
        monkeypatch.setenv(key, value)
    return s3.environment()


def test_the_store_refuses_a_second_put_if_absent(s3: S3Server) -> None:
    """What delta-rs's commits rely on: ``If-None-Match: *`` succeeds once per key."""
    from botocore.exceptions import ClientError

    client = s3.client()
    key = "probe/_delta_log/00000000000000000000.json"
    client.put_object(Bucket=BUCKET, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"second", IfNoneMatch="*")
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"first"


_APPENDER = textwrap.dedent("""
    import sys, time
    import pyarrow as pa
    from deltalake import write_deltalake
    from strata_spark import Warehouse
    table, writer, start_at = Warehouse.parse(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    time.sleep(max(0.0, start_at - time.time()))  # every writer imported: go together
    for n in range(10):
        write_deltalake(table.delta_uri(), pa.table({"writer": [writer], "n": [n]}),
                        mode="append", storage_options=table.storage_options() or None)
""")


def test_concurrent_delta_rs_commits_lose_nothing(s3_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    """Four writer processes append at once, ten commits each: every commit gets its own
    version and every row is in the table (a store without put-if-absent would let two
    writers both write version N, and one commit would vanish). Processes, not threads:
    delta-rs holds the GIL while it commits, so threads would take turns."""
    from deltalake import DeltaTable, write_deltalake

    warehouse = Warehouse.parse(f"s3://{BUCKET}/concurrent")
    uri = warehouse.delta_uri("topics", "t")
    options = warehouse.storage_options()
    write_deltalake(uri, pa.table({"writer": pa.array([], pa.int64()),
                                   "n": pa.array([], pa.int64())}), storage_options=options)
    start_at = time.time() + 5
    env = {**os.environ, **s3_env}
    writers = [subprocess.Popen([sys.executable, "-c", _APPENDER, uri, str(w), str(start_at)],
                                env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
               for w in range(4)]
    for writer in writers:
        _, err = writer.communicate(timeout=180)
        assert writer.returncode == 0, err[-2000:]
    table = DeltaTable(uri, storage_options=options)
    rows = sorted(zip(*table.to_pyarrow_table().to_pydict().values(), strict=True))
    assert rows == [(w, n) for w in range(4) for n in range(10)]
    assert table.version() == 40  # the empty create, then one version per commit


def test_the_source_replays_a_tier_table_from_the_object_store(s3_env: dict[str, str]) -> None:
    """The Spark source's tier reader (what its Python workers run) opens an ``s3a://``
    table with the worker's AWS environment: the rows of a range come back in offset
    order with the gaps the table has, the same as from a local table."""
    import datetime as dt

    from deltalake import write_deltalake

    from spark_source._arrow import SPARK_ARROW_SCHEMA
    from spark_source._tier import read_tier_range

    offsets = [o for o in range(500) if o % 10 != 9]  # gaps, as control records leave
    rows = pa.Table.from_pydict({
        "key": [None if o % 4 == 0 else f"k{o}".encode() for o in offsets],
        "value": [f"v{o}".encode() for o in offsets],
        "topic": ["events"] * len(offsets),
        "partition": [2] * len(offsets),
        "offset": offsets,
        "timestamp": [dt.datetime.fromtimestamp(1_790_000_000 + o * 600, dt.UTC)
                      for o in offsets],
        "timestampType": [0] * len(offsets),
        "headers": [[] for _ in offsets],
    }, schema=SPARK_ARROW_SCHEMA)
    dated = rows.append_column("date", pa.compute.cast(rows.column("timestamp"), pa.date32()))
    warehouse = Warehouse.parse(f"s3://{BUCKET}/replay")
    for half in (dated.slice(300), dated.slice(0, 300)):  # two files, out of order
        write_deltalake(warehouse.delta_uri("topics", "events"), half, mode="append",
                        partition_by=["partition", "date"],
                        storage_options=warehouse.storage_options())
    batches = list(read_tier_range(warehouse.spark_uri("topics", "events"), "events", 2,
                                   95, 420, batch_rows=64))
    got = pa.Table.from_batches(batches, schema=SPARK_ARROW_SCHEMA)
    assert got.column("offset").to_pylist() == [o for o in offsets if 95 <= o < 420]
    assert got.column("value").to_pylist() == \
        [f"v{o}".encode() for o in offsets if 95 <= o < 420]
