"""One consumer group member as an OS process, for tests/test_group_faults.py.

    python -m tests.support.group_member --bootstrap B --group G --topic T --member NAME \\
        --log FILE [--commit auto|sync|async] [--session-timeout-ms N] \\
        [--max-poll-interval-ms N] [--echo] [--stall-s S]

The member is the real ``strata.client.Consumer`` with ``group_id`` and ``subscribe()``,
processing records the way the docs tell users to (docs/consumer-groups.md):

``auto``
    auto-commit (every 500 ms inside ``poll``, on revocation and on ``close``);
``sync``
    ``commit()`` after every poll that returned records, and in ``on_revoke``;
``async``
    ``commit(asynchronous=True, callback=...)`` after every such poll, ``commit()`` in
    ``on_revoke``.

Two ways its application thread stops polling, as users' applications do (issue [3.1]):
``--echo`` prints every record it is handed to stdout (one line each, flushed per poll),
so a pipe its reader drains slowly, or stops reading, blocks it in the print, as
``strata consume ... | slow-program`` does; and SIGUSR1 makes it "stuck on one record":
after its next poll that returned records it sleeps ``--stall-s`` seconds before it
commits them. Either way its heartbeats go on (the consumer's loop thread), so only
``max_poll_interval_ms`` moves its partitions.

It appends one JSON line per event to ``--log``, each written with a single ``write``
on an ``O_APPEND`` descriptor, so a member that is SIGKILLed leaves every line it wrote
before the kill whole (at most the line being written is cut, which the checker
ignores). Every line has ``ev``, ``g`` (group), ``m`` (member name), ``t``
(``time.monotonic()``: one clock for every process of the machine) and ``w`` (wall time):

    start      pid, mode, session_ms
    assign     ps: partitions (on_assign), mid: member id, epoch
    revoke     ps (on_revoke)           lost  ps (on_lost)
    recv       r: [[partition, offset, value], ...] as one poll returned them
    commit     kind (sync|async|revoke|close), s: when it was sent (monotonic),
               ps: {partition: offset} committed, fail: {partition: error}, err: code
    busy       from, to: its application went that long without polling (the time
               from a poll's return to the next poll, logged when it is over 1 s):
               a slow or blocked stdout, or a stall; stall: 1 when SIGUSR1 caused it
    closing    SIGTERM seen: commit (unless auto) and close() follow
    closed     close() returned
    error      an exception escaped: text; the process exits 1

SIGTERM makes it leave cleanly; the harness SIGKILLs, SIGSTOPs and SIGCONTs it at will.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from strata.client import CommitFailedError, Consumer, StrataError, TopicPartition


class EventLog:
    """Append-only JSON lines, one ``os.write`` per line (see the module docstring)."""

    def __init__(self, path: str, group: str, member: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self.group, self.member = group, member

    def write(self, ev: str, **fields: Any) -> None:
        event = {"ev": ev, "g": self.group, "m": self.member, "t": time.monotonic(),
                 "w": time.time(), **fields}
        data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]

    def close(self) -> None:
        os.close(self._fd)


def _partitions(tps: Iterable[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in tps)


def _failed(err: CommitFailedError) -> dict[str, str]:
    return {str(tp.partition): e.name for tp, e in err.failed.items()}


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.group_member")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--member", required=True, help="the harness's name for this member")
    parser.add_argument("--log", required=True)
    parser.add_argument("--commit", choices=["auto", "sync", "async"], default="auto")
    parser.add_argument("--session-timeout-ms", type=int, default=-1)
    parser.add_argument("--max-poll-interval-ms", type=int, default=300_000)
    parser.add_argument("--echo", action="store_true",
                        help="print every record to stdout (a pipe the harness reads)")
    parser.add_argument("--stall-s", type=float, default=20.0,
                        help="how long SIGUSR1 makes the application stuck")
    args = parser.parse_args(argv)

    log = EventLog(args.log, args.group, args.member)
    stop = threading.Event()
    stall = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: stall.set())
    log.write("start", pid=os.getpid(), mode=args.commit, session_ms=args.session_timeout_ms,
              max_poll_ms=args.max_poll_interval_ms, echo=args.echo)
    consumer = Consumer(args.bootstrap, group_id=args.group, client_id=args.member,
                        session_timeout_ms=args.session_timeout_ms,
                        max_poll_interval_ms=args.max_poll_interval_ms,
                        auto_offset_reset="earliest",
                        enable_auto_commit=args.commit == "auto", auto_commit_interval_ms=500)

    def commit_now(kind: str) -> None:
        sent = time.monotonic()
        try:
            done = consumer.commit()
        except CommitFailedError as err:
            log.write("commit", kind=kind, s=sent, err=err.code, fail=_failed(err),
                      ps={str(tp.partition): o for tp, o in err.committed.items()})
        except StrataError as err:
            log.write("commit", kind=kind, s=sent, err=err.code, fail={}, ps={})
        else:
            log.write("commit", kind=kind, s=sent, err=None, fail={},
                      ps={str(tp.partition): o for tp, o in done.items()})

    def committed_async(sent: float) -> Any:
        def callback(offsets: dict[TopicPartition, int], error: StrataError | None) -> None:
            if error is None:
                log.write("commit", kind="async", s=sent, err=None, fail={},
                          ps={str(tp.partition): o for tp, o in offsets.items()})
            elif isinstance(error, CommitFailedError):
                log.write("commit", kind="async", s=sent, err=error.code, fail=_failed(error),
                          ps={str(tp.partition): o for tp, o in error.committed.items()})
            else:
                log.write("commit", kind="async", s=sent, err=error.code, fail={}, ps={})
        return callback

    def on_assign(tps: set[TopicPartition]) -> None:
        log.write("assign", ps=_partitions(tps), mid=consumer.member_id,
                  epoch=consumer.member_epoch)

    def on_revoke(tps: set[TopicPartition]) -> None:
        if args.commit != "auto":  # auto-commit committed them just before this call
            commit_now("revoke")
        log.write("revoke", ps=_partitions(tps))

    def on_lost(tps: set[TopicPartition]) -> None:
        log.write("lost", ps=_partitions(tps))  # others own them already: no commit

    try:
        consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke,
                           on_lost=on_lost)
        returned = time.monotonic()
        stalled = False
        while not stop.is_set():
            called = time.monotonic()
            if called - returned > 1.0:
                log.write("busy", **{"from": returned, "to": called, "stall": int(stalled)})
            stalled = False
            records = consumer.poll(timeout_ms=200)
            returned = time.monotonic()
            if not records:
                continue
            log.write("recv", r=[[r.partition, r.offset,
                                  r.value.decode(errors="replace") if r.value else None]
                                 for r in records])
            if args.echo:  # blocks while the pipe is full: the application is stuck
                for r in records:
                    sys.stdout.write(f"{r.partition} {r.offset} {r.value!r:>160}\n")
                sys.stdout.flush()
            if stall.is_set():
                stall.clear()
                stalled = True
                time.sleep(args.stall_s)  # stuck on a record; heartbeats go on
            if args.commit == "sync":
                commit_now("sync")
            elif args.commit == "async":
                consumer.commit(asynchronous=True, callback=committed_async(time.monotonic()))
        log.write("closing")
        if args.commit != "auto":
            commit_now("close")
        consumer.close()
        log.write("closed")
        return 0
    except BaseException as err:
        log.write("error", text="".join(traceback.format_exception(err))[-4000:])
        with contextlib.suppress(BaseException):
            consumer.close()
        return 1
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(run())
