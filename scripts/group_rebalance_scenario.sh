#!/usr/bin/env bash
# Issue [2.1] section 1, as a new user meets it: one 3-broker stack, topic `fan` with
# 6 partitions and RF 3, three `strata consume --group` processes started together (one
# in group A, two in group B: B's first member owns all six partitions until the second
# one arrives and cooperative-sticky revokes three of them), 12 s later 12,000 keyed
# records (`k<i mod 41>:f<i>`, acks=all). Each group must print all 12,000. Prints one
# line per run and exits non-zero if any run lost records (their output is kept then).
#
# As [2.1] first ran it (and as a user piping `strata consume` into another program
# does), each consumer writes to a pipe, and one reader drains the pipes one after
# another: A's until A exits, then B's first member's, then the second's. So B's
# members sit blocked in a print, on a full pipe, for longer than --timeout-ms (issue
# [3.1]: before, that counted as silence and they exited with records waiting).
#
#   bash scripts/group_rebalance_scenario.sh [RUNS]      (default 1)
#
# Variants (environment):
#   STRATA_SCENARIO_SLICES=N  produce in N slices 0.5 s apart, so rebalances can happen
#                             while records flow;
#   STRATA_SCENARIO_LATE=1    start B's second member only after the first slice;
#   STRATA_SCENARIO_BUSY=N    N background `strata perf produce` processes (acks=all,
#                             per-record sends) load the brokers and the CPU meanwhile;
#   STRATA_SCENARIO_FILES=1   consumers write to files instead of pipes read in turn.
#
# Every run has its own stack in a temp dir on free ports; it is stopped (`strata down`,
# and the processes this script started by PID) when the run ends, failed or not.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-1}
STRATA=${STRATA:-.venv/bin/strata}
PYTHON=${PYTHON:-.venv/bin/python}
RECORDS=12000
failed=0

free_base_port() {
  # 110 consecutive free ports (the stack uses P .. P+109).
  "$PYTHON" - <<'EOF'
import random, socket
for _ in range(200):
    base = random.randrange(20000, 60000, 100)
    try:
        for port in range(base, base + 110):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(base)
    break
EOF
}

pids=()
dir=""
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  pids=()
  if [ -n "$dir" ]; then
    "$STRATA" down --data-dir "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
    dir=""
  fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

pipes=()
start_consumer() {
  local name="$dir/consume-$1-${#pids[@]}"
  if [ -n "${STRATA_SCENARIO_FILES:-}" ]; then
    "$STRATA" consume fan --group "$1" -n "$RECORDS" --timeout-ms 40000 --format json \
      >"$name.out" 2>"$name.err" &
    pids+=($!)
    return 0
  fi
  # The consumer writes to a pipe whose reader holds it open from the start but reads
  # only when its turn comes (then until the consumer exits): the consumer runs, joins
  # and prints until the pipe is full, then blocks in its print.
  mkfifo "$name.fifo"
  (exec 3<"$name.fifo"; until [ -e "$name.turn" ]; do sleep 0.2; done
   cat <&3 >"$name.out"; touch "$name.done") &
  pids+=($!)
  "$STRATA" consume fan --group "$1" -n "$RECORDS" --timeout-ms 40000 --format json \
    >"$name.fifo" 2>"$name.err" &
  pids+=($!)
  pipes+=("$name")
}

# Gives the pipes their turns, one after another, in the order the consumers started.
read_pipes_in_turn() {
  [ -z "${STRATA_SCENARIO_FILES:-}" ] || return 0
  (for name in "$@"; do
     touch "$name.turn"
     until [ -e "$name.done" ]; do sleep 0.2; done
   done) &
  pids+=($!)
}

for run in $(seq 1 "$RUNS"); do
  dir=$(mktemp -d /tmp/strata-scenario.XXXXXX)
  # Another process may take one of the free ports before the stack binds it: move on.
  for attempt in 1 2 3 4 5; do
    base=$(free_base_port)
    if "$STRATA" up --data-dir "$dir" --base-port "$base" --no-tier --format json \
        >"$dir/up.json" 2>"$dir/up.err"; then
      break
    fi
    grep -q "already in use" "$dir/up.err" && [ "$attempt" -lt 5 ] || { cat "$dir/up.err" >&2; exit 1; }
    "$STRATA" down --data-dir "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"; dir=$(mktemp -d /tmp/strata-scenario.XXXXXX)
  done
  export STRATA_BOOTSTRAP="127.0.0.1:$((base + 10))"
  "$STRATA" topic create fan -p 6 -r 3 >/dev/null
  busy=()
  if [ "${STRATA_SCENARIO_BUSY:-0}" -gt 0 ]; then
    "$STRATA" topic create busy -p 3 -r 3 >/dev/null
    for _ in $(seq 1 "$STRATA_SCENARIO_BUSY"); do
      "$STRATA" perf produce --topic busy --num-records 100000000 --acks all --api send \
        >/dev/null 2>&1 &
      pids+=($!); busy+=($!)
      disown $!  # killed at the end of the run: no job-status noise
    done
  fi
  consumers=("${#pids[@]}")
  pipes=()
  start_consumer A
  start_consumer B
  [ -n "${STRATA_SCENARIO_LATE:-}" ] || start_consumer B
  # (the late member's pipe is read last: the turns start once it has started)
  [ -n "${STRATA_SCENARIO_LATE:-}" ] || read_pipes_in_turn "${pipes[@]}"
  sleep 12
  slices=${STRATA_SCENARIO_SLICES:-1}
  for s in $(seq 0 $((slices - 1))); do
    "$PYTHON" -c "
import sys
for i in range($s * $RECORDS // $slices, ($s + 1) * $RECORDS // $slices):
    sys.stdout.write(f'k{i % 41}:f{i}\n')
" | "$STRATA" produce fan --key-separator : --acks all >/dev/null
    if [ "$s" = 0 ] && [ -n "${STRATA_SCENARIO_LATE:-}" ]; then
      start_consumer B
      read_pipes_in_turn "${pipes[@]}"
    fi
    [ "$slices" = 1 ] || sleep 0.5
  done
  for pid in "${pids[@]:${consumers[0]}}"; do wait "$pid" || true; done
  for pid in "${busy[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  a=$(cat "$dir"/consume-A-*.out | grep -c '"offset"' || true)
  b=$(cat "$dir"/consume-B-*.out | grep -c '"offset"' || true)
  b_distinct=$(cat "$dir"/consume-B-*.out | "$PYTHON" -c "
import json, sys
print(len({(r['partition'], r['offset']) for r in map(json.loads, sys.stdin) if 'offset' in r}))")
  status=ok
  if [ "$a" -ne "$RECORDS" ] || [ "$b_distinct" -ne "$RECORDS" ]; then
    status=LOST; failed=1
    "$STRATA" group describe B || true
    keep=/tmp/strata-scenario-failed-$run-$$
    mkdir -p "$keep" && cp "$dir"/consume-*.out "$dir"/consume-*.err "$keep"/ && echo "consumer output kept in $keep"
  fi
  echo "run $run: group A printed $a, group B printed $b ($b_distinct distinct) of $RECORDS: $status"
  cleanup
done
exit $failed
