#!/usr/bin/env bash
# `make bench`: the benchmark figures of docs/benchmarks.md, on a throw-away local stack.
# Starts ZooKeeper + one broker on free ports in a temp data dir, runs the storage,
# produce, consume, end-to-end latency and Spark benchmarks, and stops exactly that stack.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=.venv/bin/strata
DATA=$(mktemp -d /tmp/strata-bench.XXXXXX)
BASE=$(.venv/bin/python - <<'PY'
import random, socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port)); return True
        except OSError:
            return False
while True:
    base = random.randrange(30000, 60000)
    if all(free(base + off) for off in (0, 10, 40)):
        print(base); break
PY
)
cleanup() { "$STRATA" down --data-dir "$DATA" >/dev/null 2>&1 || true; rm -rf "$DATA"; }
trap cleanup EXIT

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "== strata perf log (storage engine, in-process)"
"$STRATA" perf log

"$STRATA" up --data-dir "$DATA" --base-port "$BASE" --brokers 1 >/dev/null
export STRATA_BOOTSTRAP="127.0.0.1:$((BASE + 10))"
"$STRATA" topic create bench-100 -p 8 >/dev/null
"$STRATA" topic create bench-1k -p 8 >/dev/null
"$STRATA" topic create bench-e2e -p 8 >/dev/null

echo "== one broker, 8 partitions, acks=1, 100-byte records"
"$STRATA" perf produce --topic bench-100 --num-records 5000000 --record-size 100 --acks 1
"$STRATA" perf consume --topic bench-100 --num-records 5000000
echo "== per-record send() API, 100-byte records, acks=1"
"$STRATA" perf produce --topic bench-100 --num-records 300000 --record-size 100 --acks 1 --api send
echo "== one broker, 8 partitions, acks=1, 1 KiB records"
"$STRATA" perf produce --topic bench-1k --num-records 1000000 --record-size 1024 --acks 1
"$STRATA" perf consume --topic bench-1k --num-records 1000000
echo "== end to end at 100,000 records/s (consumer latency = record age when consumed)"
"$STRATA" perf consume --topic bench-e2e --num-records 1000000 > "$DATA/e2e-consume.txt" &
CONSUMER=$!
sleep 2
"$STRATA" perf produce --topic bench-e2e --num-records 1000000 --record-size 100 --acks 1 \
  --throughput 100000 --chunk-records 100 --linger-ms 1
wait "$CONSUMER"
cat "$DATA/e2e-consume.txt"

echo "== Spark (local[2]): streaming read of 5,000,000 100-byte records, 8 partitions, noop sink"
"$STRATA" perf spark-read --topic bench-spark-read --num-records 5000000 --partitions 8
echo "== Spark (local[2]): batch write of 4,000,000 100-byte records into 8 partitions"
"$STRATA" perf spark-write --num-records 4000000 --partitions 8
echo "== Spark (local[2]): produce -> Spark (processingTime=0) -> sink topic -> consume, 5,000 records/s"
"$STRATA" perf spark-e2e --rate 5000 --seconds 30
"$STRATA" perf spark-e2e --rate 5000 --seconds 30 --at-least-once
