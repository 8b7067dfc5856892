#!/usr/bin/env bash
# `make bench`: the benchmark figures of docs/benchmarks.md, on throw-away local stacks.
# Starts ZooKeeper + one broker on free ports in a temp data dir, runs the storage,
# produce, consume, end-to-end latency and Spark benchmarks, then a second stack of
# three brokers for the replication benchmarks (acks=all throughput and latency, leader
# failover), and stops exactly those stacks.
# `scripts/bench.sh replication` runs only the three-broker section; `scripts/bench.sh
# gateway` only the HTTP ingest gateway section (scripts/bench_gateway.sh, its own stack),
# which `make bench` runs last; `scripts/bench.sh tier` (`tier-s3`: on an object store),
# `scripts/bench.sh groups` and
# `scripts/bench.sh scale` run only the tiering, the consumer group or the many-partitions
# section (`strata perf scale`: a three-broker stack of its own; SCALE_PARTITIONS,
# SCALE_TOPICS and SCALE_GROUP_MEMBERS change its size); `scripts/bench.sh security` the
# TLS/SASL cost and the ACL/user propagation delay; `scripts/bench.sh records` the
# per-record Python API next to the columnar one; `scripts/bench.sh cpu` the CPU per
# million records at fixed rates; `scripts/bench.sh transactions` the
# transactional producer and read_committed consumer; `scripts/bench.sh kafka` stock
# Kafka clients on Strata's Kafka listener beside Apache Kafka; `scripts/bench.sh standing`
# the same-run table of Strata beside Apache Kafka that opens docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=.venv/bin/strata
PYTHON=.venv/bin/python
DATA=$(mktemp -d /tmp/strata-bench.XXXXXX)
DATA3=$(mktemp -d /tmp/strata-bench-rf3.XXXXXX)
DATA_SECURE=$(mktemp -d /tmp/strata-bench-secure.XXXXXX)
. scripts/free_base.sh
cleanup() {
  if [[ -n "${MOTO_PID:-}" ]]; then kill "$MOTO_PID" 2>/dev/null || true; fi
  for dir in "$DATA" "$DATA3" "$DATA_SECURE"; do
    "$STRATA" down --data-dir "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
  done
}
trap cleanup EXIT

# Three brokers (RF=3, acks=all, min.insync.replicas=2, 8 partitions, 100-byte records):
# throughput at full speed, latency at half the measured rate, then leader failover.
bench_replication() {
  local base bootstrap full rate half
  base=$(free_base 0 10 11 12 40 41 42 70 80 81 82)
  "$STRATA" up --data-dir "$DATA3" --base-port "$base" --brokers 3 >/dev/null
  bootstrap="127.0.0.1:$((base + 10)),127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))"
  "$STRATA" topic create bench-rf3 -p 8 -r 3 -c min.insync.replicas=2 \
    --bootstrap "$bootstrap" >/dev/null
  "$STRATA" topic create bench-failover -p 8 -r 3 -c min.insync.replicas=2 \
    --bootstrap "$bootstrap" >/dev/null
  echo "== three brokers, RF=3, acks=all, min ISR 2, 8 partitions, 100-byte records: full speed"
  full=$("$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-rf3 \
    --num-records 3000000 --record-size 100 --acks all --format json)
  echo "$full"
  rate=$(echo "$full" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["records_per_sec"])')
  echo "== same, 4,000-record chunks (one batch per partition is in flight: bigger batches)"
  "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-rf3 \
    --num-records 3000000 --record-size 100 --acks all --chunk-records 4000
  half=$((rate / 2))
  echo "== same at half that rate ($half records/s, 20 s): latency"
  "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-rf3 \
    --num-records $((half * 20)) --record-size 100 --acks all --throughput "$half"
  echo "== same at 250,000 records/s (half the 500,000 target, 20 s): latency"
  "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-rf3 \
    --num-records 5000000 --record-size 100 --acks all --throughput 250000
  echo "== leader failover: SIGKILL a partition's leader, 20 times (default broker settings)"
  "$STRATA" perf failover --data-dir "$DATA3" --topic bench-failover --kills 20
  "$STRATA" down --data-dir "$DATA3" >/dev/null
}

# `scripts/bench.sh records`: the per-record Python API (issue [2.6] section 1) on its
# own one-broker stack: one million 100-byte records one call at a time each way, next
# to the columnar calls on the same topic.
bench_records() {
  local base
  base=$(free_base 0 10 40 70 80)
  "$STRATA" up --data-dir "$DATA" --base-port "$base" --brokers 1 --no-tier >/dev/null
  local bootstrap="127.0.0.1:$((base + 10))"
  "$STRATA" topic create bench-records -p 8 --bootstrap "$bootstrap" >/dev/null
  echo "== per-record produce, 100-byte records, acks=1, 8 partitions: produce() (no future), blocking send(), asyncio send(), then send_batch columns"
  for api in produce blocking-send send batch; do
    "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-records \
      --num-records 1000000 --record-size 100 --acks 1 --api "$api"
  done
  echo "== per-record consume of the same records: blocking poll(), asyncio poll(), then poll_arrow columns"
  for api in records async-records arrow; do
    "$STRATA" perf consume --bootstrap "$bootstrap" --topic bench-records \
      --num-records 2000000 --api "$api"
  done
  "$STRATA" down --data-dir "$DATA" >/dev/null
}

# `scripts/bench.sh tier`: only the tiering benchmark, on its own one-broker stack.
bench_tier() {
  local base
  base=$(free_base 0 10 40 70 80)
  STRATA_LOG_RETENTION_CHECK_INTERVAL_MS=1000 \
    "$STRATA" up --data-dir "$DATA" --base-port "$base" --brokers 1 --no-tier >/dev/null
  echo "== Delta tiering (local[2]): 4,000,000 100-byte random records, 4 partitions"
  "$STRATA" perf tier --bootstrap "127.0.0.1:$((base + 10))" \
    --num-records 4000000 --partitions 4
  "$STRATA" down --data-dir "$DATA" >/dev/null
}

# `scripts/bench.sh tier-s3`: the tier on an object store (issue [3.5]) beside a local
# warehouse, A, B, A, B on one stack: moto's S3 server (a Python process on these same
# cores, so the object-store figures are a lower bound) on a free port, the AWS variables
# exported as a user would; 100-byte records, then 1 MiB values.
bench_tier_s3() {
  local base s3port moto records big rounds
  records=${TIER_S3_RECORDS:-1000000}
  big=${TIER_S3_BIG_RECORDS:-200}
  rounds=${TIER_S3_ROUNDS:-2}
  base=$(free_base 0 10 40 70 80)
  s3port=$(free_base 0)
  STRATA_LOG_RETENTION_CHECK_INTERVAL_MS=1000 \
    "$STRATA" up --data-dir "$DATA" --base-port "$base" --brokers 1 --no-tier >/dev/null
  "$PYTHON" -m moto.server -H 127.0.0.1 -p "$s3port" >"$DATA/moto.log" 2>&1 &
  moto=$!
  MOTO_PID=$moto
  export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 \
    AWS_ENDPOINT_URL="http://127.0.0.1:$s3port"
  for _ in $(seq 50); do
    "$PYTHON" -c "import boto3; boto3.client('s3').create_bucket(Bucket='strata-bench')" \
      2>/dev/null && break
    sleep 0.2
  done
  for round in $(seq "$rounds"); do
    for where in local s3; do
      local wh=()
      [[ $where == s3 ]] && wh=(--warehouse "s3://strata-bench/r$round")
      echo "== round $round, $where warehouse: $records 100-byte records, 4 partitions"
      "$STRATA" perf tier --bootstrap "127.0.0.1:$((base + 10))" "${wh[@]}" \
        --topic "t-$where-$round" --num-records "$records" --partitions 4 --runs 1 \
        --segment-bytes 8388608 --format json
      echo "== round $round, $where warehouse: $big 1 MiB values, 4 partitions"
      "$STRATA" perf tier --bootstrap "127.0.0.1:$((base + 10))" "${wh[@]}" \
        --topic "big-$where-$round" --num-records "$big" --record-size 1048576 \
        --partitions 4 --runs 1 --segment-bytes 16777216 --format json
    done
  done
  kill "$moto"
  wait "$moto" 2>/dev/null || true
  MOTO_PID=
  "$STRATA" down --data-dir "$DATA" >/dev/null
}

# `scripts/bench.sh groups`: consumer group rebalance pauses and group throughput, on its
# own one-broker stack (every consumer a process of its own).
bench_groups() {
  local base
  base=$(free_base 0 10 40 70 80)
  "$STRATA" up --data-dir "$DATA" --base-port "$base" --brokers 1 --no-tier >/dev/null
  echo "== consumer groups: a 5th member joins 4 on 32 partitions (3,200 records/s produced), then 1 vs 4 members reading 1,000,000 records"
  "$STRATA" perf group --bootstrap "127.0.0.1:$((base + 10))" --partitions 32 --consumers 4 \
    --rate 3200 --records 1000000
  "$STRATA" down --data-dir "$DATA" >/dev/null
}

# `scripts/bench.sh scale`: many partitions on three brokers (issue [2.2]). `strata perf
# scale` starts its own stack on free ports in a temp dir and stops it (SCALE_GROUP_PROCESSES:
# the processes the group members are spread over, default 10); it prints one JSON
# object (progress goes to stderr). A phase that fails ends it with the figures so far and
# an "error" key; that is a finding for [2.2], so `make bench` goes on to the next section.
bench_scale() {
  local partitions=${SCALE_PARTITIONS:-10000} topics=${SCALE_TOPICS:-100}
  local members=${SCALE_GROUP_MEMBERS:-100} processes=${SCALE_GROUP_PROCESSES:-10}
  echo "== many partitions: $partitions partitions over $topics topics, RF 3, min ISR 2, three brokers; 1,000 idle connections; $members group members in $processes processes on 1,000 partitions"
  "$STRATA" perf scale --partitions "$partitions" --topics "$topics" \
    --idle-connections 1000 --group-members "$members" --group-partitions 1000 \
    --group-processes "$processes" \
    || echo "== strata perf scale FAILED (exit $?): its error is above"
}

# `scripts/bench.sh cpu`: CPU seconds per million records of the producer, the consumer
# and each broker at fixed rates (issue [3.7]; strata_tools/perf_cpu.py): acks=1 on one
# broker, then acks=all on three (RF 3, min ISR 2); 10 s of records a case.
bench_cpu() {
  local base
  base=$(free_base 0 10 40 70 80)
  "$STRATA" up --data-dir "$DATA" --base-port "$base" --brokers 1 --no-tier >/dev/null
  echo "== CPU per million records at fixed rates, one broker, acks=1, 8 partitions, 100-byte records"
  "$PYTHON" -m strata_tools.perf_cpu --data-dir "$DATA" --acks 1
  "$STRATA" down --data-dir "$DATA" >/dev/null
  base=$(free_base 0 10 11 12 40 41 42 70 80 81 82)
  "$STRATA" up --data-dir "$DATA3" --base-port "$base" --brokers 3 --no-tier >/dev/null
  echo "== the same, three brokers, RF 3, min ISR 2, acks=all"
  "$PYTHON" -m strata_tools.perf_cpu --data-dir "$DATA3" --acks all
  "$STRATA" down --data-dir "$DATA3" >/dev/null
}

echo "== machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "== code: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- brokers strata || echo ' + uncommitted changes'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ "${1:-}" == "replication" ]]; then
  bench_replication
  exit 0
fi
if [[ "${1:-}" == "records" ]]; then
  bench_records
  exit 0
fi
if [[ "${1:-}" == "tier" ]]; then
  bench_tier
  exit 0
fi
if [[ "${1:-}" == "tier-s3" ]]; then
  bench_tier_s3
  exit 0
fi
if [[ "${1:-}" == "groups" ]]; then
  bench_groups
  exit 0
fi
if [[ "${1:-}" == "scale" ]]; then
  bench_scale
  exit 0
fi
if [[ "${1:-}" == "cpu" ]]; then
  bench_cpu
  exit 0
fi

# `scripts/bench.sh security`: what TLS and SASL cost (one broker of its own), then how
# fast an ACL or user change reaches every broker of a secured three-broker stack.
bench_security() {
  local base
  echo "== PLAINTEXT vs SASL_SSL (SCRAM-SHA-256, TLS), one broker, 8 partitions, 100-byte records"
  "$STRATA" perf security
  base=$(free_base 0 9 10 11 12 40 41 42 70 80 81 82)
  "$STRATA" up --secure --data-dir "$DATA_SECURE" --base-port "$base" --brokers 3 \
    --no-tier >/dev/null
  echo "== ACL and SCRAM-user changes reaching each of three secured brokers (strata up --secure), 20 rounds"
  "$STRATA" perf propagation \
    --bootstrap "127.0.0.1:$((base + 10)),127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))" \
    --command-config "$DATA_SECURE/security/admin.properties" --rounds 20
  "$STRATA" down --data-dir "$DATA_SECURE" >/dev/null
}

if [[ "${1:-}" == "security" ]]; then
  bench_security
  exit 0
fi

# `scripts/bench.sh standing`: the table that opens docs/benchmarks.md, Strata beside
# Apache Kafka 4.1 (strata_tools/kafka_local.py: jars from Maven Central) on stacks of
# their own, case by case, A, B, A, B. Transactions: `strata perf produce
# --transactional-id` next to ProducerPerformance --transactional-id.
bench_standing() {
  echo "== today's standing: Strata beside Apache Kafka, same run (strata_tools/perf_standing.py)"
  "$PYTHON" -m strata_tools.perf_standing --rounds "${STANDING_ROUNDS:-2}"
}
if [[ "${1:-}" == "standing" ]]; then
  bench_standing
  exit 0
fi
# `scripts/bench.sh kafka`: stock Kafka clients (ProducerPerformance/ConsumerPerformance,
# confluent-kafka) against Strata's Kafka listener, against Apache Kafka, and Strata's own
# client against its own protocol, in turn (strata_tools/perf_kafka.py; issue [3.6]).
bench_kafka() {
  echo "== stock Kafka clients: Strata's Kafka listener, Apache Kafka, Strata's own protocol"
  "$PYTHON" -m strata_tools.perf_kafka --rounds "${KAFKA_ROUNDS:-2}"
}
if [[ "${1:-}" == "kafka" ]]; then
  bench_kafka
  exit 0
fi
# The [3.3] transaction figures: idempotent vs transactions of 100, 1,000 and 10,000
# records (1 KiB, acks=all, RF 3) and read_committed vs read_uncommitted consumption.
bench_transactions() {
  local base bootstrap
  base=$(free_base 0 10 11 12 40 41 42 70 80 81 82)
  "$STRATA" up --data-dir "$DATA3" --base-port "$base" --brokers 3 --no-tier >/dev/null
  bootstrap="127.0.0.1:$((base + 10)),127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))"
  "$STRATA" topic create bench-txn -p 8 -r 3 -c min.insync.replicas=2 \
    --bootstrap "$bootstrap" >/dev/null
  echo "== RF 3, acks=all, 1 KiB records, 8 partitions: idempotent, then transactions"
  for round in 1 2; do
    "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-txn --num-records 300000 \
      --record-size 1024 --acks all
    for per in 100 1000 10000; do
      "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-txn --num-records 300000 \
        --record-size 1024 --transactional-id "bench-$round-$per" --transaction-records "$per"
    done
    "$STRATA" perf produce --bootstrap "$bootstrap" --topic bench-txn --num-records 300000 \
      --record-size 1024 --transactional-id "bench-$round-100ms" --transaction-duration-ms 100
  done
  echo "== consume the same topic: read_uncommitted, read_committed, alternately"
  for round in 1 2; do
    for isolation in read_uncommitted read_committed; do
      "$STRATA" perf consume --bootstrap "$bootstrap" --topic bench-txn \
        --num-records 3000000 --isolation-level "$isolation"
    done
  done
  "$STRATA" down --data-dir "$DATA3" >/dev/null
}
if [[ "${1:-}" == "transactions" ]]; then
  bench_transactions
  exit 0
fi
if [[ "${1:-}" == "gateway" ]]; then
  bash scripts/bench_gateway.sh
  exit 0
fi
echo "== strata perf log (storage engine, in-process)"
"$STRATA" perf log

BASE=$(free_base 0 10 40 70 80)
# Retention every second (default 5 min) so the tier benchmark sees tiered segments
# leave the broker promptly; nothing else here relies on retention. --no-tier: the
# tier benchmark runs its own job, which the stack's must not race for its topic.
STRATA_LOG_RETENTION_CHECK_INTERVAL_MS=1000 \
  "$STRATA" up --data-dir "$DATA" --base-port "$BASE" --brokers 1 --no-tier >/dev/null
export STRATA_BOOTSTRAP="127.0.0.1:$((BASE + 10))"
"$STRATA" topic create bench-100 -p 8 >/dev/null
"$STRATA" topic create bench-1k -p 8 >/dev/null
"$STRATA" topic create bench-e2e -p 8 >/dev/null

echo "== one broker, 8 partitions, acks=1, 100-byte records"
"$STRATA" perf produce --topic bench-100 --num-records 5000000 --record-size 100 --acks 1
"$STRATA" perf consume --topic bench-100 --num-records 5000000
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
echo "== Delta tiering (local[2]): 4,000,000 100-byte random records, 4 partitions"
"$STRATA" perf tier --num-records 4000000 --partitions 4
"$STRATA" down --data-dir "$DATA" >/dev/null

bench_records
bench_cpu
bench_replication
bench_transactions
bench_groups
bench_scale
bench_security

echo "== HTTP ingest gateway (scripts/bench_gateway.sh: its own stack)"
bash scripts/bench_gateway.sh
bench_kafka
bench_standing
