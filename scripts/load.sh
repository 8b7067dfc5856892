#!/usr/bin/env bash
# `make load`: a bounded headless locust run (load_tests/locustfile.py) against the local
# stack of `make up`. The gateway URL and API key come from `strata status --format json`
# ("gateway", "gateway_api_key"); GATEWAY_URL / GATEWAY_TOKEN override them (and are
# needed for a gateway outside the stack). CSV and HTML reports go to load_tests/reports/.
# Settings: LOAD_SECONDS (60), LOAD_USERS (20), LOAD_SPAWN_RATE (LOAD_USERS),
# LOAD_CLASSES (space-separated user classes; default all three), and the locustfile's
# own variables (GATEWAY_TOPIC, RECORD_SIZE, BATCH_SIZE, RATE_PER_USER, GATEWAY_ACKS).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-.strata}
LOAD_SECONDS=${LOAD_SECONDS:-60}
LOAD_USERS=${LOAD_USERS:-20}
LOAD_SPAWN_RATE=${LOAD_SPAWN_RATE:-$LOAD_USERS}
if [[ -z "${GATEWAY_URL:-}" || -z "${GATEWAY_TOKEN+set}" ]]; then
  status=$(.venv/bin/strata status --data-dir "$DATA_DIR" --format json 2>/dev/null || echo '{}')
  from_status() {
    echo "$status" | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin).get('$1') or '')"
  }
  GATEWAY_URL=${GATEWAY_URL:-$(from_status gateway)}
  GATEWAY_TOKEN=${GATEWAY_TOKEN-$(from_status gateway_api_key)}
fi
if [[ -z "$GATEWAY_URL" ]]; then
  echo "load: no gateway found: run 'make up' first (strata status --data-dir $DATA_DIR" \
       "reports none), or set GATEWAY_URL (and GATEWAY_TOKEN)" >&2
  exit 1
fi
[[ "$GATEWAY_URL" == http* ]] || GATEWAY_URL="http://$GATEWAY_URL"
export GATEWAY_URL GATEWAY_TOKEN
mkdir -p load_tests/reports
stamp=$(date -u +%Y%m%dT%H%M%SZ)
prefix=load_tests/reports/load-$stamp
echo "load: $LOAD_USERS users for ${LOAD_SECONDS}s against $GATEWAY_URL" \
     "(API key: ${GATEWAY_TOKEN:+set}${GATEWAY_TOKEN:-none}); reports: $prefix*"
# shellcheck disable=SC2086  # LOAD_CLASSES is a list of class names
exec .venv/bin/locust -f load_tests/locustfile.py --headless -u "$LOAD_USERS" \
  -r "$LOAD_SPAWN_RATE" -t "${LOAD_SECONDS}s" --host "$GATEWAY_URL" --stop-timeout 10 \
  --csv "$prefix" --html "$prefix.html" ${LOAD_CLASSES:-}
