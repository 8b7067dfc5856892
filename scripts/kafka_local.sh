#!/usr/bin/env bash
# Apache Kafka on this machine for same-run comparisons with Strata (docs/kafka-local.md):
#   scripts/kafka_local.sh fetch | up --brokers N --data-dir DIR [--base-port P]
#                          | down --data-dir DIR | status --data-dir DIR
#                          | tool CLASS ARGS... | classpath
# The work is strata_tools/kafka_local.py (standard library and procs/ only); this wrapper
# puts this checkout first on the path so it runs from any work tree, with or without .venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=python3
[ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m strata_tools.kafka_local "$@"
