#!/usr/bin/env bash
# Issue [3.1] section 1, exactly as a user meets it: `strata consume --group` into a pipe
# that is not read for longer than --timeout-ms, while 12,000 records are produced. It
# must print 12000 (before the fix: what fit in the pipe, about 480). Its own stack in a
# temp dir on free ports, stopped at the end.
#
#   bash scripts/consume_slow_pipe.sh [RUNS]      (default 1; exits 1 if a run printed less)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-1}
STRATA=${STRATA:-.venv/bin/strata}
PYTHON=${PYTHON:-.venv/bin/python}
dir=""
cleanup() {
  [ -z "$dir" ] || { "$STRATA" down --data-dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"; }
  dir=""
}
trap cleanup EXIT
failed=0
for run in $(seq 1 "$RUNS"); do
  dir=$(mktemp -d /tmp/strata-slow-pipe.XXXXXX)
  base=$("$PYTHON" -c "
import random, socket
for _ in range(200):
    base = random.randrange(20000, 60000, 100)
    try:
        for port in range(base, base + 110):
            with socket.socket() as s:
                s.bind(('127.0.0.1', port))
    except OSError:
        continue
    print(base); break")
  "$STRATA" up --data-dir "$dir" --base-port "$base" --no-tier >/dev/null
  export STRATA_BOOTSTRAP="127.0.0.1:$((base + 10))"
  "$STRATA" topic create fan -p 6 -r 3 >/dev/null
  "$STRATA" consume fan --group B -n 12000 --timeout-ms 20000 --format json \
    2>"$dir/consume.err" | (sleep 45; cat) | wc -l >"$dir/count" &
  reader=$!
  sleep 6
  (for i in $(seq 0 11999); do echo "k$((i % 41)):f$i"; done) \
    | "$STRATA" produce fan --key-separator : --acks all >/dev/null
  wait "$reader"
  count=$(cat "$dir/count")
  lag=$("$STRATA" group describe B --format json | "$PYTHON" -c "import json,sys; print(json.load(sys.stdin)['total_lag'])")
  status=ok
  [ "$count" -eq 12000 ] && [ "$lag" -eq 0 ] || { status=LOST; failed=1; cat "$dir/consume.err" >&2; }
  echo "run $run: printed $count of 12000, group B lag $lag: $status"
  cleanup
done
exit $failed
