"""``strata perf log``: how fast the partition log appends and reads on this machine.

For every record size and batch size asked for, one pre-built batch is appended again
and again to a fresh log (``flush.policy=none``: the page cache, as a replicated broker
runs) for ``--seconds``; then the whole log is read back from offset 0 through
``PartitionLog.read`` in 1 MiB fetches twice: ``read-sendfile`` hands each slice to
``os.sendfile`` (to ``/dev/null``: the broker's zero-copy fetch path, minus the socket),
``read-copy`` copies each slice into Python memory with ``os.pread`` (what a consumer
that decodes the bytes pays at least). Records/s and MB/s (10^6 bytes of record values) are printed
per case. Building batches is not timed: producers pay for that, not the log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from brokers.log import FileSlice, FlushPolicy, LogConfig, PartitionLog
from wire.record_batch import build_batch

__all__ = ["LogBenchResult", "add_log_arguments", "bench_log_case", "run_log"]


@dataclass(frozen=True, slots=True)
class LogBenchResult:
    operation: str
    record_size: int
    batch_records: int
    records: int
    seconds: float
    records_per_sec: float
    mb_per_sec: float


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record-sizes", type=_int_list, default=[100, 1024],
                        help="value sizes in bytes, comma-separated (default 100,1024)")
    parser.add_argument("--batch-sizes", type=_int_list, default=[1, 100, 1000],
                        help="records per batch, comma-separated (default 1,100,1000)")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="how long each append case runs (default 2)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the scratch logs go (default: a temp dir, removed after)")
    parser.add_argument("--format", choices=["text", "json"], default="text")


def bench_log_case(directory: Path, record_size: int, batch_records: int,
                   seconds: float) -> tuple[LogBenchResult, ...]:
    """Append for ``seconds``, then read everything back twice: via sendfile, via copy."""
    config = LogConfig(flush_policy=FlushPolicy.NONE, segment_bytes=1 << 30,
                       max_message_bytes=16 << 20)
    batch = build_batch([os.urandom(record_size)] * batch_records)
    log = PartitionLog(directory, config)
    try:
        appended = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(16):
                log.append(batch)
            appended += 16 * batch_records
            if time.perf_counter() >= deadline:
                break
        append_seconds = time.perf_counter() - start

        end = log.log_end_offset
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            sendfile_result = _timed_read(log, end, lambda found: _sendfile_all(devnull, found))
        finally:
            os.close(devnull)
        copy_result = _timed_read(log, end, lambda found: len(found.read_bytes()))
    finally:
        log.close()
    return (
        _result("append", record_size, batch_records, appended, append_seconds),
        _result("read-sendfile", record_size, batch_records, *sendfile_result),
        _result("read-copy", record_size, batch_records, *copy_result),
    )


def _sendfile_all(out_fd: int, found: FileSlice) -> int:
    sent = 0
    while sent < found.length:
        sent += os.sendfile(out_fd, found.fileno(), found.position + sent, found.length - sent)
    return sent


def _timed_read(log: PartitionLog, end: int, consume: Callable[[FileSlice], int]
                ) -> tuple[int, float]:
    """Read ``[0, end)`` in 1 MiB fetches, hand each slice to ``consume``; (records, s)."""
    records = 0
    offset = 0
    start = time.perf_counter()
    while offset < end:
        found = log.read(offset, 1 << 20)
        assert found is not None
        consume(found)
        records += found.next_offset - offset
        offset = found.next_offset
    return records, time.perf_counter() - start


def _result(operation: str, record_size: int, batch_records: int, records: int,
            seconds: float) -> LogBenchResult:
    return LogBenchResult(
        operation, record_size, batch_records, records, round(seconds, 3),
        round(records / seconds), round(records * record_size / seconds / 1e6, 1),
    )


def run_log(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="strata-perf-log-", dir=args.data_dir))
    results: list[LogBenchResult] = []
    try:
        for record_size in args.record_sizes:
            for batch_records in args.batch_sizes:
                case_dir = root / f"{record_size}-{batch_records}"
                results.extend(bench_log_case(case_dir, record_size, batch_records, args.seconds))
                shutil.rmtree(case_dir)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(),
               "platform": platform.platform()}
    if args.format == "json":
        print(json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=2))
        return 0
    print(f"strata perf log  ({machine['cpus']} cpus, Python {machine['python']}, "
          "flush.policy=none, 1 MiB reads)")
    print(f"{'operation':<13} {'record B':>8} {'batch':>6} {'records':>11} {'records/s':>12} "
          f"{'MB/s':>8}")
    for r in results:
        print(f"{r.operation:<13} {r.record_size:>8} {r.batch_records:>6} {r.records:>11} "
              f"{r.records_per_sec:>12,.0f} {r.mb_per_sec:>8.1f}")
    return 0
