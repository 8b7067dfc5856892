"""An object-store warehouse end to end, against a real S3 API server on 127.0.0.1
(moto's standalone server, ``tests/support/s3_server.py``): concurrent delta-rs
commits on the store lose nothing, which rests on the store's conditional writes
(``If-None-Match``), shown directly; the Spark source's tier reader replays a range
from the store. The tier job and Spark through S3A are tests/test_tier_s3.py's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------ a stalled job's late commit

_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()),
                     ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])


def _rows(offsets: range, *, day: int = 0, tombstones: bool = False) -> pa.Table:
    import datetime as dt

    at = dt.datetime.now(dt.UTC) - dt.timedelta(days=day)
    return pa.table({
        "key": [f"k{o % 7}".encode() for o in offsets],
        "value": [None if tombstones else f"v{o}".encode() for o in offsets],
        "partition": pa.array([0] * len(offsets), pa.int32()),
        "offset": pa.array(list(offsets), pa.int64()),
        "timestamp": pa.array([at] * len(offsets), pa.timestamp("us", tz="UTC"))},
        schema=_SCHEMA)


def _append(uri: str, options: dict[str, str], rows: pa.Table, app: str, end: int) -> None:
    """A copy commit as the tier job makes it: rows plus the partition's ``txn``."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    write_deltalake(uri, rows, mode="append", storage_options=options,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app, end)]))


def lost_commits(uri: str, options: dict[str, str], copies: dict[str, tuple[int, set[int]]],
                 deleted: set[int]) -> list[str]:
    """The checker: what the table lost of the copy commits ``copies`` (app id ->
    (txnVersion, offsets it added)), rows in ``deleted`` aside. A commit written over
    by another loses its ``txn`` and its rows; any such loss is named."""
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=options)
    have = set(table.to_pyarrow_table(columns=["offset"]).column("offset").to_pylist())
    problems = []
    for app, (version, offsets) in copies.items():
        if (table.transaction_version(app) or 0) < version:
            problems.append(f"{app}: txnVersion {table.transaction_version(app)} < {version}")
        missing = offsets - deleted - have
        if missing:
            problems.append(f"{app}: {len(missing)} rows missing, e.g. offset {min(missing)}")
    return problems


def _maintenance(name: str, location: Any) -> Callable[[], Any]:
    from spark_jobs import _commits

    late = {
        "retention DELETE": lambda: _commits.delete_rows(location, '"offset" < 50'),
        "OPTIMIZE": lambda: _commits.optimize(location),
        "VACUUM": lambda: _commits.vacuum(location, 0),
        "MERGE": lambda: _commits.merge_latest(location, _rows(range(100, 107)), 0),
        "tombstone DELETE": lambda: _commits.delete_tombstones(location, int(time.time() * 1000)),
        "ADD COLUMNS": lambda: _commits.add_fields(
            location, "extra", pa.struct([("a", pa.int32())])),
        "SET TBLPROPERTIES": lambda: _commits.set_properties(
            location, {"strata.valueSchemaVersion": "2"}),
    }
    return late[name]


@pytest.mark.parametrize("operation", ["retention DELETE", "OPTIMIZE", "VACUUM", "MERGE",
                                       "tombstone DELETE", "ADD COLUMNS", "SET TBLPROPERTIES"])
def test_a_stalled_jobs_late_commit_never_writes_over_another(
        s3: S3Server, s3_env: dict[str, str], operation: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """[3.5] item 2: is the tier lease enough? The race it cannot stop: job A reads the
    table at version N and stalls past its lease (GC, SIGSTOP, a slow store); job B takes
    the lease and commits a copy as N+1; A wakes and makes its maintenance commit from
    version N. Every commit of the job is delta-rs's (``spark_jobs._commits``), written
    put-if-absent: A's commit is rebased after B's or refused, and B's copy (its rows and
    its ``txnVersion``) is still in the table. The checker is shown to catch the loss
    when A's commit is written with a plain PUT, as Spark's ``S3SingleDriverLogStore``
    would."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from spark_jobs._tables import TableLocation

    warehouse = Warehouse.parse(f"s3://{BUCKET}/stalled-{operation.replace(' ', '-')}")
    location = TableLocation(warehouse, "compacted", "t")
    uri, options = location.uri, location.storage_options
    DeltaTable.create(uri, schema=_SCHEMA, partition_by=["partition"], storage_options=options)
    _append(uri, options, _rows(range(0, 60), day=3), "strata-tier/t/0", 60)
    _append(uri, options, _rows(range(60, 70), day=3, tombstones=True), "strata-tier/t/0", 70)
    copies = {"strata-tier/t/0": (70, set(range(60)))}
    stale = location.open()  # job A's view: version N, then A stalls
    version = stale.version()
    _append(uri, options, _rows(range(70, 90)), "strata-tier/t/1", 90)  # job B: N+1
    copies["strata-tier/t/1"] = (90, set(range(70, 90)))
    with monkeypatch.context() as patched:
        patched.setattr(TableLocation, "open", lambda self: stale)
        # A wakes and commits from version N; refused, its pass fails and the next one
        # starts from what the table holds.
        with contextlib.suppress(CommitFailedError):
            _maintenance(operation, location)()
    deleted = set(range(50)) | set(range(60, 70))  # what A's operation may delete
    assert lost_commits(uri, options, copies, deleted) == []
    table = DeltaTable(uri, storage_options=options)
    assert table.version() >= version + 1
    if operation == "retention DELETE" and table.version() > version + 1:
        offsets = table.to_pyarrow_table(columns=["offset"]).column("offset").to_pylist()
        assert min(offsets) == 50  # A's DELETE took effect, after B's copy

    # The checker on a bad history: B's commit N+1 replaced by a plain PUT (no
    # If-None-Match), as a log store that checks and then writes would do.
    key = f"{warehouse.prefix}/compacted/t/_delta_log/{version + 1:020d}.json".lstrip("/")
    s3.client().put_object(Bucket=BUCKET, Key=key,
                  Body=b'{"commitInfo":{"timestamp":0,"operation":"OPTIMIZE"}}\n')
    problems = lost_commits(uri, options, copies, deleted)
    assert any("strata-tier/t/1" in p for p in problems), problems
