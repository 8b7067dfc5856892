#!/usr/bin/env bash
# Before/after on one machine in one session: `make bench`'s one-broker and RF 3
# sections run on several checkouts of the code, alternated (A, B, ..., A, B, ...).
#
#   scripts/ab_bench.sh ROUNDS DIR...      e.g. git worktree add /tmp/before <commit>
#                                          scripts/ab_bench.sh 2 /tmp/before .
#   AB_CASES=transactions scripts/ab_bench.sh ROUNDS DIR...
#
# AB_CASES=transactions instead runs, per round and DIR on a fresh 3-broker stack
# (1 KiB records, acks=all, RF 3): the idempotent producer (300,000 records), a
# transaction every 100 ms (300,000), transactions of 100 records (30,000).
#
# Each DIR is a checkout (a `git worktree` of the commit to compare); they all run on
# this checkout's venv, with PYTHONPATH=DIR, so `strata up` starts brokers of that
# tree's code. Per round and DIR: a fresh one-broker stack, 5,000,000 100-byte records
# produced (acks=1, 8 partitions) and consumed three times; then a fresh 3-broker stack
# and 3,000,000 records produced with acks=all (RF 3, min.insync.replicas=2). One line
# per DIR and round, records/s. Each stack lives in a temp dir and is stopped with
# `strata down` (only the PIDs it recorded).
set -uo pipefail
ROUNDS=${1:?usage: scripts/ab_bench.sh ROUNDS DIR...}
shift
[[ $# -ge 1 ]] || { echo "usage: scripts/ab_bench.sh ROUNDS DIR..." >&2; exit 2; }
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=$HERE/.venv/bin/python
. "$HERE/scripts/free_base.sh"
rps() { "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["records_per_sec"])'; }
side() {
  local dir data base bs S
  dir=$(cd "$1" && pwd)
  S="$PYTHON -m strata_tools.cli"
  export PYTHONPATH=$dir
  data=$(mktemp -d /tmp/strata-ab.XXXXXX); base=$(free_base 0 9 10 40 70 80)
  (cd "$dir" && $S up --data-dir "$data" --base-port "$base" --brokers 1 --no-tier >/dev/null 2>&1)
  bs=127.0.0.1:$((base + 10))
  (cd "$dir" && $S topic create ab-100 -p 8 --bootstrap "$bs" >/dev/null
   p=$($S perf produce --bootstrap "$bs" --topic ab-100 --num-records 5000000 --record-size 100 --acks 1 --format json | rps)
   c=""
   for _ in 1 2 3; do
     c="$c $($S perf consume --bootstrap "$bs" --topic ab-100 --num-records 5000000 --format json | rps)"
   done
   echo "$1 round $2: one broker produce $p consume$c")
  (cd "$dir" && $S down --data-dir "$data" >/dev/null); rm -rf "$data"
  data=$(mktemp -d /tmp/strata-ab.XXXXXX); base=$(free_base 0 9 10 11 12 40 41 42 70 80 81 82)
  (cd "$dir" && $S up --data-dir "$data" --base-port "$base" --brokers 3 --no-tier >/dev/null 2>&1)
  bs=127.0.0.1:$((base + 10)),127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))
  (cd "$dir" && $S topic create ab-rf3 -p 8 -r 3 -c min.insync.replicas=2 --bootstrap "$bs" >/dev/null
   p=$($S perf produce --bootstrap "$bs" --topic ab-rf3 --num-records 3000000 --record-size 100 --acks all --format json | rps)
   echo "$1 round $2: RF 3 produce acks=all $p")
  (cd "$dir" && $S down --data-dir "$data" >/dev/null); rm -rf "$data"
  unset PYTHONPATH
}
transactions() {
  local dir data base bs S
  dir=$(cd "$1" && pwd)
  S="$PYTHON -m strata_tools.cli"
  export PYTHONPATH=$dir
  data=$(mktemp -d /tmp/strata-ab.XXXXXX); base=$(free_base 0 9 10 11 12 40 41 42 70 80 81 82)
  (cd "$dir" && $S up --data-dir "$data" --base-port "$base" --brokers 3 --no-tier >/dev/null 2>&1)
  bs=127.0.0.1:$((base + 10)),127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))
  (cd "$dir" && $S topic create ab-txn -p 8 -r 3 -c min.insync.replicas=2 --bootstrap "$bs" >/dev/null
   echo "$1 round $2 idempotent: $($S perf produce --bootstrap "$bs" --topic ab-txn --num-records 300000 --record-size 1024 --acks all)"
   echo "$1 round $2 every 100 ms: $($S perf produce --bootstrap "$bs" --topic ab-txn --num-records 300000 --record-size 1024 --transactional-id "ab-$2-ms" --transaction-duration-ms 100)"
   echo "$1 round $2 100 records: $($S perf produce --bootstrap "$bs" --topic ab-txn --num-records 30000 --record-size 1024 --transactional-id "ab-$2-rec" --transaction-records 100)")
  (cd "$dir" && $S down --data-dir "$data" >/dev/null); rm -rf "$data"
  unset PYTHONPATH
}
for round in $(seq 1 "$ROUNDS"); do
  for dir in "$@"; do
    if [[ "${AB_CASES:-throughput}" == transactions ]]; then
      transactions "$dir" "$round"
    else
      side "$dir" "$round"
    fi
  done
done
