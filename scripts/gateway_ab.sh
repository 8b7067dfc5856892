#!/usr/bin/env bash
# Single-record POSTs through `strata gateway`, two source trees alternated (issue [3.7]
# item 3): for each of ROUNDS rounds and each tree, a throw-away one-broker stack of that
# tree (`strata up --brokers 1 --no-tier`; older trees without --no-tier get their
# default), an 8-partition topic, `strata gateway --no-auth --workers 2`, 3 s of warm-up,
# then `wrk -t1 -c64 -d10s` with load_tests/wrk_produce.lua (100-byte records, acks=all).
# Prints "<commit> <requests/s> <non-2xx lines> <workers' CPU us per request>" per run
# (the CPU from /proc/<worker>/stat over the 10 s run); stops exactly what it started.
#
#   git worktree add /tmp/old <commit>; ln -s "$PWD/.venv" /tmp/old/.venv
#   scripts/gateway_ab.sh /tmp/old . 2
#
# Each tree runs its own CLI (`python -m strata_tools.cli`, or `strata.cli` in trees
# from before 2026-11-26) from its own directory, so its brokers and gateway are its code.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
LUA=$HERE/load_tests/wrk_produce.lua
command -v wrk >/dev/null || { echo "gateway_ab: wrk is not installed (make setup)" >&2; exit 1; }

# User + system CPU ticks of the gateway's worker processes (children of pid $1).
worker_ticks() {
  local sum=0 pid f
  for pid in $(pgrep -P "$1"); do
    f=$(cut -d')' -f2 "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $f
    sum=$(( sum + ${12} + ${13} ))
  done
  echo "$sum"
}

one() {
  local tree strata data base bootstrap gw url cluster out
  tree=$(cd "$1" && pwd)
  if [[ -d $tree/strata_tools ]]; then strata=(python -m strata_tools.cli)
  else strata=(python -m strata.cli); fi
  cd "$tree" || return 1
  PYTHON=$tree/.venv/bin/python
  strata=("$PYTHON" "${strata[@]:1}")
  # shellcheck source=scripts/free_base.sh
  . "$HERE/scripts/free_base.sh"
  data=$(mktemp -d /tmp/strata-gateway-ab.XXXXXX)
  base=$(free_base 0 9 10 40 70 80)
  "${strata[@]}" up --data-dir "$data" --base-port "$base" --brokers 1 --no-tier >/dev/null 2>&1 \
    || "${strata[@]}" up --data-dir "$data" --base-port "$base" --brokers 1 >/dev/null
  bootstrap="127.0.0.1:$((base + 10))"
  "${strata[@]}" topic create bench-gw -p 8 --bootstrap "$bootstrap" >/dev/null
  local port
  port=$(free_base 0)
  "${strata[@]}" gateway --bootstrap "$bootstrap" --port "$port" --no-auth --workers 2 \
    --log-level warning >"$data/gateway.log" 2>&1 &
  gw=$!
  url="http://127.0.0.1:$port"
  for _ in $(seq 1 120); do curl -sf "$url/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
  cluster=$(curl -sf "$url/v3/clusters" |
    "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["cluster_id"])')
  wrk -t1 -c8 -d3s -s "$LUA" "$url" -- "$cluster" bench-gw 1 100 >/dev/null
  local before after
  before=$(worker_ticks "$gw")
  out=$(wrk -t1 -c64 -d10s --latency -s "$LUA" "$url" -- "$cluster" bench-gw 1 100)
  after=$(worker_ticks "$gw")
  local rps total
  rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
  total=$(echo "$out" | awk '/requests in/{print $1}')
  # commit, requests/s, non-2xx lines, the gateway workers' CPU (us) per request
  echo "$(git -C "$tree" rev-parse --short HEAD) $rps $(echo "$out" | grep -c Non-2xx)" \
    "$(( (after - before) * 1000000 / $(getconf CLK_TCK) / total ))us/req"
  kill -TERM "$gw" 2>/dev/null; wait "$gw" 2>/dev/null
  "${strata[@]}" down --data-dir "$data" >/dev/null 2>&1
  rm -rf "$data"
  cd "$HERE" || return 1
}

OLD=${1:?usage: scripts/gateway_ab.sh OLD_TREE NEW_TREE [ROUNDS]}
NEW=${2:?usage: scripts/gateway_ab.sh OLD_TREE NEW_TREE [ROUNDS]}
for _ in $(seq 1 "${3:-2}"); do
  one "$OLD"
  one "$NEW"
done
