"""Transactional writers and read_committed readers for the transaction nemesis
(issue [3.3] section 4, tests/test_txn_faults.py); the checker is
tests/support/txn_checker.py.

A writer is an OS process (so the nemesis can SIGKILL, SIGSTOP and SIGCONT it)::

    python -m tests.support.txn_workload writer --bootstrap B --topic T --partitions N \\
        --writer NAME --transactional-id ID --log DIR [--timeout-ms MS] [--seed S] \\
        [--abort-ratio R] [--pause-s S]

It runs transactions with the real ``strata.client.Producer`` until SIGTERM (then it
ends the transaction it is in and exits 0). Each transaction writes 1-4 records to each
of 1-3 random partitions; every record's value says writer, transaction number,
partition, index and the transaction's manifest (``txn_checker.encode_value``), so the
checker proves all-or-nothing from reads alone. About ``--abort-ratio`` of them are
aborted on purpose.

What it believes of each transaction goes to ``DIR/txns-NAME.jsonl``, one JSON line per
change, each written with one ``write`` on an ``O_APPEND`` descriptor before the step it
describes, so a SIGKILL leaves a true record (a later line replaces an earlier one):

``aborted`` before the first record is sent
    until ``commit_transaction`` is called the transaction cannot commit: a writer killed
    or fenced before it is aborted by the coordinator (fence or timeout) for sure;
``unknown`` just before ``commit_transaction``
    the commit may or may not have happened if the call does not return;
``committed`` / ``aborted`` after ``commit_transaction`` / ``abort_transaction`` returned.

Transaction numbers go on across restarts of a writer (read back from its log), so a
restarted writer's transactions still follow its earlier ones (ORDER). Two writer
processes given the same ``--transactional-id`` are zombies of each other: each
``init_transactions`` fences the other, which then sees its commit refused, closes its
producer (a fatal error) and starts a new one after ``--pause-s``.

``LiveReader`` (a thread of the test process) is a read_committed consumer polling every
partition from offset 0 while the writers run; ``final_reads`` reads every partition to
its end once every transaction is decided.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from strata.client import (
    AbortableTransactionError,
    Consumer,
    FatalTransactionError,
    Producer,
    TopicPartition,
)
from tests.support.txn_checker import Read, encode_value
from wire.errors import StrataError

__all__ = ["LiveReader", "final_reads", "main", "wait_until_stable", "writer_command"]


# ----------------------------------------------------------------------------- writer


class _Log:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **fields: Any) -> None:
        os.write(self.fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())


def _next_txn(path: Path) -> int:
    last = 0
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                last = max(last, int(json.loads(line)["txn"]))
    return last + 1


def run_writer(args: argparse.Namespace) -> int:
    path = Path(args.log) / f"txns-{args.writer}.jsonl"
    txn = _next_txn(path)
    rng = random.Random(args.seed * 1_000_003 + txn)
    log = _Log(path)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    producer: Producer | None = None
    print(f"writer {args.writer} pid {os.getpid()} from txn {txn}", flush=True)
    while not stopping.is_set():
        if producer is None:
            producer = Producer(args.bootstrap, transactional_id=args.transactional_id,
                                transaction_timeout_ms=args.timeout_ms, max_block_ms=20_000,
                                request_timeout_ms=10_000, linger_ms=2)
            try:
                producer.init_transactions()
            except StrataError as err:
                print(f"init_transactions: {err}", flush=True)
                _close(producer)
                producer = None
                time.sleep(args.pause_s)
                continue
        partitions = rng.sample(range(args.partitions), rng.randint(1, min(3, args.partitions)))
        manifest = {p: rng.randint(1, 4) for p in partitions}
        abort = rng.random() < args.abort_ratio
        fields = {"writer": args.writer, "txn": txn, "manifest": manifest,
                  "started": time.monotonic()}
        log.write(**fields, outcome="aborted")  # cannot commit before commit_transaction
        committing = False
        try:
            producer.begin_transaction()
            for p, count in manifest.items():
                for index in range(count):
                    producer.send(args.topic, encode_value(args.writer, txn, p, index, manifest),
                                  partition=p)
            if abort:
                producer.flush()  # in the log first: a reader must skip it, not miss it
                producer.abort_transaction()
                log.write(**fields, outcome="aborted", ended=time.monotonic())
            else:
                log.write(**fields, outcome="unknown")
                committing = True
                producer.commit_transaction()
                log.write(**fields, outcome="committed", ended=time.monotonic())
        except AbortableTransactionError as err:
            print(f"txn {txn}: abortable {err}", flush=True)
            try:
                producer.abort_transaction()
                if not committing:
                    log.write(**fields, outcome="aborted", ended=time.monotonic())
            except StrataError as abort_err:
                print(f"txn {txn}: abort failed {abort_err}", flush=True)
                _close(producer)
                producer = None
        except (FatalTransactionError, StrataError) as err:
            # Fenced by a zombie twin, or a coordinator that stayed away past max_block_ms:
            # a new producer (a new incarnation) goes on.
            print(f"txn {txn}: {type(err).__name__} {err}", flush=True)
            _close(producer)
            producer = None
            time.sleep(args.pause_s)
        txn += 1
    if producer is not None:
        _close(producer)
    print(f"writer {args.writer} stopped before txn {txn}", flush=True)
    return 0


def _close(producer: Producer) -> None:
    with contextlib.suppress(Exception):
        producer.close(timeout=5)


# ----------------------------------------------------------------------------- readers


class LiveReader(threading.Thread):
    """A read_committed consumer reading every partition once, in order, from offset 0
    while the writers run (the checker's LIVE reads). Never seeks back."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, name: str = "live") -> None:
        super().__init__(name=f"txn-{name}", daemon=True)
        self.bootstrap, self.topic, self.partitions, self.reader = (bootstrap, topic,
                                                                     partitions, name)
        self.reads: list[Read] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with Consumer(self.bootstrap, isolation_level="read_committed",
                      auto_offset_reset="earliest", request_timeout_ms=10_000) as consumer:
            consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
            while not self._stop_event.is_set():
                try:
                    records = consumer.poll(timeout_ms=200)
                except StrataError as err:  # a broker restarting: the consumer retries
                    self.errors.append(f"{type(err).__name__}: {err}")
                    time.sleep(0.2)
                    continue
                now = time.monotonic()
                self.reads += [Read(self.reader, r.partition, r.offset,
                                    None if r.value is None else r.value.decode(errors="replace"),
                                    now) for r in records]

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


def _ends(bootstrap: str, topic: str, partitions: int) -> tuple[dict[int, int], dict[int, int]]:
    """(high watermarks, last stable offsets) per partition."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[dict[int, int]] = []
    for isolation in ("read_uncommitted", "read_committed"):
        with Consumer(bootstrap, isolation_level=isolation, request_timeout_ms=10_000) as c:
            c.assign(tps)
            out.append({tp.partition: offset for tp, offset in c.seek_to_end(tps).items()})
    return out[0], out[1]


def wait_until_stable(bootstrap: str, topic: str, partitions: int,
                      timeout: float) -> dict[int, int]:
    """Wait until no transaction is open on any partition (last stable offset = high
    watermark; a killed writer's transaction waits for its timeout); the high watermarks."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            hw, lso = _ends(bootstrap, topic, partitions)
            if hw == lso:
                return hw
            waiting: dict[Any, Any] = {p: (lso[p], hw[p]) for p in hw if lso[p] != hw[p]}
        except StrataError as err:  # a broker still coming back
            waiting = {"error": str(err)}
        if time.monotonic() >= deadline:
            raise AssertionError(f"transactions still open after {timeout:.0f}s: "
                                 f"(lso, hw) per partition {waiting}")
        time.sleep(0.5)


def final_reads(bootstrap: str, topic: str, ends: dict[int, int], *,
                timeout: float = 60.0) -> list[Read]:
    """read_committed reads of every partition from offset 0 up to ``ends``."""
    out: list[Read] = []
    tps = [TopicPartition(topic, p) for p in ends]
    with Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest",
                  request_timeout_ms=10_000) as consumer:
        consumer.assign(tps)
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            if time.monotonic() >= deadline:
                positions = {tp.partition: consumer.position(tp) for tp in tps}
                raise AssertionError(f"final read stuck at {positions}, ends {ends}")
            out += [Read("final", r.partition, r.offset,
                         None if r.value is None else r.value.decode(errors="replace"))
                    for r in consumer.poll(timeout_ms=200)]
    return out


# ----------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.support.txn_workload")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--bootstrap", required=True)
    w.add_argument("--topic", required=True)
    w.add_argument("--partitions", type=int, required=True)
    w.add_argument("--writer", required=True)
    w.add_argument("--transactional-id", required=True)
    w.add_argument("--log", required=True)
    w.add_argument("--timeout-ms", type=int, default=6000)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--abort-ratio", type=float, default=0.2)
    w.add_argument("--pause-s", type=float, default=0.5)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_writer(args)


def writer_command(bootstrap: str, topic: str, partitions: int, writer: str,
                   transactional_id: str, log: Path, *, seed: int, timeout_ms: int = 6000,
                   abort_ratio: float = 0.2, pause_s: float = 0.5) -> list[str]:
    return [sys.executable, "-m", "tests.support.txn_workload", "writer",
            "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions),
            "--writer", writer, "--transactional-id", transactional_id, "--log", str(log),
            "--seed", str(seed), "--timeout-ms", str(timeout_ms),
            "--abort-ratio", str(abort_ratio), "--pause-s", str(pause_s)]


if __name__ == "__main__":
    sys.exit(main())
