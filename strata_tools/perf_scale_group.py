"""The group phase of ``strata perf scale`` with its members spread over processes
(``--group-processes P``), as real deployments run them: each process is
``python -m strata_tools.perf_scale_group worker`` and runs its share of the
``AsyncConsumer`` members in one event loop, every member polling in a loop.

A worker talks JSON lines. On stdout::

    {"ev": "subscribed", "t": <unix s>}            after its last member's subscribe
    {"ev": "owned", "owned": {"<member>": [p, ...], ...}}   whenever an assignment changed
    {"ev": "left", "member": "<member>"}           a member closed (it left the group)
    {"ev": "error", "message": ...}                a member's poll failed

Members are named ``<worker>-<i>``. On stdin: ``leave`` closes this worker's first member
(it leaves the group); ``stop`` (or the end of stdin) closes every member and exits.

Thread-safety: a worker is one event loop; nothing is shared across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

__all__ = ["main"]

_REPORT_S = 0.05  # how often a worker looks for changed assignments


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _worker(args: argparse.Namespace) -> int:
    from strata.client import AsyncConsumer

    names = [f"{args.name}-{i}" for i in range(args.members)]
    consumers = {name: AsyncConsumer(args.bootstrap, group_id=args.group,
                                     client_id=f"strata-perf-scale-{name}",
                                     enable_auto_commit=False) for name in names}
    stops = {name: asyncio.Event() for name in names}

    async def member(name: str) -> None:
        consumer = consumers[name]
        try:
            while not stops[name].is_set():
                await consumer.poll(timeout_ms=100)
        except Exception as err:  # reported; the parent fails the run
            _emit({"ev": "error", "message": f"member {name}: {err!r}"})

    tasks = {}
    for name in names:
        consumers[name].subscribe([args.topic])
        tasks[name] = asyncio.create_task(member(name))
    _emit({"ev": "subscribed", "t": time.time()})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    command = asyncio.create_task(reader.readline())
    last: dict[str, list[int]] = {}
    active = list(names)
    try:
        while True:
            owned = {name: sorted(p for _, p in consumers[name].assignment())
                     for name in active}
            if owned != last:
                _emit({"ev": "owned", "owned": owned})
                last = owned
            done, _ = await asyncio.wait({command}, timeout=_REPORT_S)
            if not done:
                continue
            line = command.result().decode().strip()
            if line == "leave" and active:
                name = active.pop(0)
                stops[name].set()
                await tasks[name]
                await consumers[name].close()
                _emit({"ev": "left", "member": name})
                command = asyncio.create_task(reader.readline())
                continue
            break  # "stop" or the end of stdin
    finally:
        for stop in stops.values():
            stop.set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.gather(*(asyncio.wait_for(c.close(), 30) for c in consumers.values()),
                             return_exceptions=True)
        if not command.done():
            command.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata_tools.perf_scale_group")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="run some members of the group")
    worker.add_argument("--bootstrap", required=True)
    worker.add_argument("--topic", required=True)
    worker.add_argument("--group", required=True)
    worker.add_argument("--name", required=True, help="prefix of the members' names")
    worker.add_argument("--members", type=int, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_worker(args))
    return 1


if __name__ == "__main__":
    sys.exit(main())
