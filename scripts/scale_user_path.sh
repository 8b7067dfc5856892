#!/usr/bin/env bash
# Issue [3.4]'s table through the user's own commands, on a stack of its own:
#
#   scripts/scale_user_path.sh [strata perf scale options...]
#
# `strata up --brokers 3 --no-tier` on free ports in a temp dir, 100 topics x 100
# partitions (RF 3) created with Admin.create_topics in groups of 10, one record to each
# new partition from a blocking Producer (send, then result), SIGTERM of the broker
# leading most (clients' metadata watched, `strata up` run as soon as it leads nothing,
# as a rolling restart does), SIGKILL of the controller's broker, `strata down` +
# `strata up`, the brokers' memory; `strata down` at the end. Leaderships are judged by
# the clients' metadata (a Metadata request to a broker), with ZooKeeper's view beside.
# The JSON of every figure goes to $SCALE_JSON (default: a temp file, named on stderr);
# the table to stdout. Options are passed on, e.g. `--partitions 2000 --topics 20`.
#
# Comparing runs (A/B): give each run a fresh `--data-dir DIR` and delete nothing until
# every run is done. On an ext4 without a journal (this project's VM) the inode
# allocator skips inodes freed in the last one to five minutes, and creating 30,000
# log directories right after a run removed its own (the temp dir's default) took 2-4x
# longer (docs/benchmarks.md, "Third pass").
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=$HERE/.venv/bin/python
cd "$HERE"
OUT=${SCALE_JSON:-$(mktemp --suffix=.json)}
"$PYTHON" -m strata_tools.cli perf scale --topics 100 --partitions 10000 \
  --skip idle-connections,group "$@" > "$OUT"
echo "every figure: $OUT" >&2
"$PYTHON" -c 'import json, sys
from strata_tools.perf_scale import user_path_table
print(user_path_table(json.load(open(sys.argv[1]))))' "$OUT"
echo
echo "machine: $(nproc) cores, $(free -g | awk "/Mem:/{print \$2}") GiB; $(date -u +%Y-%m-%dT%H:%MZ); commit $(git -C "$HERE" rev-parse --short HEAD)"
