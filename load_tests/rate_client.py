"""Fixed-rate (open-loop) HTTP load for latency at a given request rate.

wrk2 is not in Debian, and wrk and locust send the next request only when the previous
answer is in (closed loop), so a slow answer also delays the requests behind it and hides
from the percentiles ("coordinated omission"). This client schedules request i at
``start + i / rate`` whatever happened before; each of ``--connections`` keep-alive
HTTP/1.1 connections takes the next due request when it is free, and a request's latency
is counted from its *scheduled* time to the end of its answer, so queueing in the client
is part of the figure.

    python load_tests/rate_client.py --url http://127.0.0.1:8082 --cluster-id ID \\
        --topic bench-gw --rate 5000 --seconds 20 [--batch-size 1] [--record-size 100]

Prints one JSON line: achieved requests/s and records/s, latency percentiles in ms, and
the count of answers by status. Standard library only; one process, one event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from urllib.parse import urlsplit


def build_request(host: str, path: str, body: bytes, api_key: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json",
            f"Content-Length: {len(body)}"]
    if api_key:
        head.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def connection(host: str, port: int, request: bytes, due: asyncio.Queue[float | None],
                     latencies: list[float], statuses: collections.Counter[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while (scheduled := await due.get()) is not None:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - scheduled)
            statuses[status] += 1
    finally:
        writer.close()


async def run(args: argparse.Namespace) -> dict[str, object]:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    value = "x" * args.record_size
    record = {"value": {"type": "STRING", "data": value}}
    path = f"/v3/clusters/{args.cluster_id}/topics/{args.topic}/records"
    if args.batch_size > 1:
        path += ":batch"
        body = json.dumps({"entries": [record] * args.batch_size}).encode()
    else:
        body = json.dumps(record).encode()
    request = build_request(f"{host}:{port}", path + f"?acks={args.acks}", body, args.api_key)

    due: asyncio.Queue[float | None] = asyncio.Queue()
    latencies: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    workers = [asyncio.create_task(connection(host, port, request, due, latencies, statuses))
               for _ in range(args.connections)]
    await asyncio.sleep(0.2)  # connections open before the clock starts
    interval = 1.0 / args.rate
    total = int(args.rate * args.seconds)
    start = time.perf_counter()
    sent = 0
    while sent < total:
        now = time.perf_counter()
        while sent < total and start + sent * interval <= now:
            due.put_nowait(start + sent * interval)
            sent += 1
        await asyncio.sleep(0.0005)
    for _ in workers:
        due.put_nowait(None)
    await asyncio.wait_for(asyncio.gather(*workers), timeout=args.seconds + 60)
    elapsed = time.perf_counter() - start
    lat = sorted(latencies)

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(len(lat) * p / 100))] * 1000, 2) if lat else -1

    ok = sum(n for s, n in statuses.items() if 200 <= s < 300)
    return {"target_requests_per_sec": args.rate, "requests": len(lat),
            "requests_per_sec": round(len(lat) / elapsed),
            "records_per_sec": round(ok * args.batch_size / elapsed),
            "records_per_request": args.batch_size, "connections": args.connections,
            "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "p999_ms": pct(99.9),
            "max_ms": pct(100), "statuses": {str(k): v for k, v in sorted(statuses.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="gateway base URL")
    parser.add_argument("--cluster-id", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--acks", default="all")
    parser.add_argument("--api-key", default="")
    print("RATE_JSON " + json.dumps(asyncio.run(run(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
