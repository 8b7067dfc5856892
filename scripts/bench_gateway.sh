#!/usr/bin/env bash
# The HTTP ingest gateway figures of docs/benchmarks.md ("HTTP ingest gateway").
# Starts a throw-away stack (own temp data dir, free base port, `strata up --brokers 1`)
# and a `strata gateway --no-auth --workers 2` on a free port (the stack's own gateway,
# when `strata status --format json` reports one, is not used: its auth and workers are
# the operator's choice), then on an 8-partition topic with 100-byte records:
#   1. wrk, single-record requests, then 100-record records:batch requests (max rate);
#   2. locust (load_tests/locustfile.py, headless) with the same two request kinds;
#   3. load_tests/rate_client.py (open loop, fixed rate) at half the best wrk request
#      rate of each kind: p50/p99.
# Before each measurement it waits (up to 10 min) for a 1-minute load average <= 1.0.
# Stops exactly the processes it started. Also run by `scripts/bench.sh gateway`.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=.venv/bin/strata
PYTHON=.venv/bin/python
LOCUST=.venv/bin/locust
RUN_SECONDS=${GW_BENCH_SECONDS:-20}
WORKERS=${GW_BENCH_WORKERS:-2}
command -v wrk >/dev/null || { echo "bench_gateway: wrk is not installed; run make setup or apt-get install wrk" >&2; exit 1; }
DATA=$(mktemp -d /tmp/strata-bench-gw.XXXXXX)
GW_PID=""

cleanup() {
  if [[ -n "$GW_PID" ]] && grep -qa "strata.*gateway" "/proc/$GW_PID/cmdline" 2>/dev/null; then
    kill -TERM "$GW_PID" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$GW_PID" 2>/dev/null; then
      pkill -KILL -P "$GW_PID" 2>/dev/null || true
      kill -KILL "$GW_PID" 2>/dev/null || true
    fi
  fi
  "$STRATA" down --data-dir "$DATA" >/dev/null 2>&1 || true
  rm -rf "$DATA"
}
trap cleanup EXIT

. scripts/free_base.sh

# Wait until the 1-minute load average is <= 1.0 (other engineers share the cores).
quiet() {
  local waited=0 load
  load=$(cut -d' ' -f1 /proc/loadavg)
  while awk "BEGIN{exit !($load > 1.0)}" && ((waited < 600)); do
    echo "   (load $load > 1.0: waiting 30 s)"
    sleep 30; waited=$((waited + 30)); load=$(cut -d' ' -f1 /proc/loadavg)
  done
  echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
}

json_field() { "$PYTHON" -c "import json,sys; print(json.loads(sys.stdin.read().split(' ',1)[1])['$1'])"; }

acked_records() {  # sum of the topic's high watermarks
  curl -sf "$URL/v3/clusters/$CLUSTER/topics/$TOPIC/partitions" |
    "$PYTHON" -c 'import json,sys; print(sum(p["high_watermark"] for p in json.load(sys.stdin)["data"]))'
}

run_wrk() {  # run_wrk LABEL CONNECTIONS BATCH -> prints the WRK_JSON line, sets LAST
  local label=$1 conns=$2 batch=$3 before after out
  echo "== wrk: $label (-t1 -c$conns -d${RUN_SECONDS}s, 100-byte records)"
  quiet
  before=$(acked_records)
  # one wrk thread: it is enough for these rates, and a second one takes CPU from the
  # gateway on this 2-core machine
  out=$(wrk -t1 -c"$conns" -d"${RUN_SECONDS}s" --latency -s load_tests/wrk_produce.lua "$URL" \
    -- "$CLUSTER" "$TOPIC" "$batch" 100)
  after=$(acked_records)
  echo "$out" | sed -n '/Latency Distribution/,/Requests\/sec/p'
  LAST=$(echo "$out" | grep '^WRK_JSON')
  echo "$LAST"
  echo "   records/s (requests/s x $batch): $(( $(echo "$LAST" | json_field requests_per_sec) * batch ))"
  echo "   records acknowledged by the brokers during the run (high watermarks): $((after - before))"
}

run_locust() {  # run_locust LABEL USERS CLASS RECORDS_PER_REQUEST -> sets LAST
  local label=$1 users=$2 class=$3 batch=$4
  echo "== locust: $label ($users users, ${RUN_SECONDS}s, $class)"
  quiet
  "$LOCUST" -f load_tests/locustfile.py --headless -u "$users" -r "$users" -t "${RUN_SECONDS}s" \
    --host "$URL" --topic "$TOPIC" --batch-size 100 --record-size 100 \
    --csv "$DATA/locust-$class" --only-summary --stop-timeout 5 "$class" >/dev/null 2>&1 || true
  LAST=$("$PYTHON" - "$DATA/locust-${class}_stats.csv" "$batch" <<'PY'
import csv, json, sys
rows = {r["Name"]: r for r in csv.DictReader(open(sys.argv[1]))}
r, batch = rows["Aggregated"], int(sys.argv[2])
rps = float(r["Requests/s"])
print("LOCUST_JSON " + json.dumps({
    "requests": int(r["Request Count"]), "failures": int(r["Failure Count"]),
    "requests_per_sec": round(rps), "records_per_sec": round(rps * batch),
    "p50_ms": float(r["50%"]), "p99_ms": float(r["99%"]),
    "max_ms": round(float(r["Max Response Time"]), 1)}))
PY
)
  echo "$LAST"
}

run_rate() {  # run_rate LABEL RATE BATCH CONNECTIONS
  local label=$1 rate=$2 batch=$3 conns=$4
  echo "== fixed rate (load_tests/rate_client.py, open loop): $label at $rate requests/s, ${RUN_SECONDS}s"
  quiet
  "$PYTHON" load_tests/rate_client.py --url "$URL" --cluster-id "$CLUSTER" --topic "$TOPIC" \
    --rate "$rate" --seconds "$RUN_SECONDS" --batch-size "$batch" --connections "$conns"
}

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "== code: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- brokers strata ingest_gateway || echo ' + uncommitted changes'), $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2), locust $("$LOCUST" --version 2>&1 | awk '{print $2}')"
BASE=$(free_base 0 9 10 40 70 80)
"$STRATA" up --data-dir "$DATA" --base-port "$BASE" --brokers 1 >/dev/null
BOOTSTRAP="127.0.0.1:$((BASE + 10))"
TOPIC=bench-gw
"$STRATA" topic create "$TOPIC" -p 8 --bootstrap "$BOOTSTRAP" >/dev/null
GW_PORT=$(free_base 0)
"$STRATA" gateway --bootstrap "$BOOTSTRAP" --port "$GW_PORT" --no-auth --workers "$WORKERS" \
  --log-level warning >"$DATA/gateway.log" 2>&1 &
GW_PID=$!
URL="http://127.0.0.1:$GW_PORT"
for _ in $(seq 1 120); do
  curl -sf "$URL/readyz" >/dev/null 2>&1 && break
  kill -0 "$GW_PID" 2>/dev/null || { cat "$DATA/gateway.log"; exit 1; }
  sleep 0.5
done
CLUSTER=$(curl -sf "$URL/v3/clusters" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["cluster_id"])')
echo "== gateway: $URL, --workers $WORKERS, acks=all (the default), one broker, topic $TOPIC with 8 partitions"
# Warm-up (connections, producers, first batches): 3 s, not reported.
wrk -t1 -c8 -d3s -s load_tests/wrk_produce.lua "$URL" -- "$CLUSTER" "$TOPIC" 1 100 >/dev/null

run_wrk "single-record requests" 64 1
SINGLE_RPS=$(echo "$LAST" | json_field requests_per_sec)
run_wrk "100-record batches" 32 100
BATCH_RPS=$(echo "$LAST" | json_field requests_per_sec)
run_locust "single-record requests" 64 SingleRecordUser 1
SINGLE_RPS=$(( $(echo "$LAST" | json_field requests_per_sec) > SINGLE_RPS ? $(echo "$LAST" | json_field requests_per_sec) : SINGLE_RPS ))
run_locust "100-record batches" 32 BatchUser 100
BATCH_RPS=$(( $(echo "$LAST" | json_field requests_per_sec) > BATCH_RPS ? $(echo "$LAST" | json_field requests_per_sec) : BATCH_RPS ))
# Half the best request rate either generator reached.
run_rate "single-record requests, half the max rate" $((SINGLE_RPS / 2)) 1 64
run_rate "100-record batches, half the max rate" $((BATCH_RPS / 2)) 100 32
