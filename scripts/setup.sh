#!/usr/bin/env bash
# Idempotent set-up: .venv with the package (editable) and its pinned tools, plus the
# Delta, S3A and Spark Kafka connector jars in ~/.m2 so Spark's spark.jars.packages resolver finds them with no
# network.
# A second run on a ready machine checks two stamps and exits: no pip, no mvn, no download.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.venv
# The Delta JVM artifact. delta-spark 4.4.1 on PyPI has no 4.4.1 jar on Maven Central
# (checked 2026-11-22: 404); 4.4.0 is the newest jar built for Spark 4.2 (docs/dependencies.md).
DELTA_ARTIFACT=io.delta:delta-spark_4.2_2.13:4.4.0
DELTA_JAR="$HOME/.m2/repository/io/delta/delta-spark_4.2_2.13/4.4.0/delta-spark_4.2_2.13-4.4.0.jar"
DELTA_STORAGE_JAR="$HOME/.m2/repository/io/delta/delta-storage/4.4.0/delta-storage-4.4.0.jar"
# The S3A connector for an object-store warehouse (strata_spark/_warehouse.py), matching
# pyspark 4.2.0's Hadoop 3.5.0 client jars; it brings the AWS SDK v2 bundle (~690 MB).
S3A_ARTIFACT=org.apache.hadoop:hadoop-aws:3.5.0
S3A_JAR="$HOME/.m2/repository/org/apache/hadoop/hadoop-aws/3.5.0/hadoop-aws-3.5.0.jar"
S3A_SDK_JAR="$HOME/.m2/repository/software/amazon/awssdk/bundle/2.35.4/bundle-2.35.4.jar"
# Spark's own Kafka connector (format("kafka") against the brokers' Kafka listeners;
# tests/test_spark_kafka.py, docs/kafka-compatibility.md); it brings kafka-clients 3.9.2.
KAFKA_CONNECTOR_ARTIFACT=org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0
KAFKA_CONNECTOR_JAR="$HOME/.m2/repository/org/apache/spark/spark-sql-kafka-0-10_2.13/4.2.0/spark-sql-kafka-0-10_2.13-4.2.0.jar"
KAFKA_CLIENTS_JAR="$HOME/.m2/repository/org/apache/kafka/kafka-clients/3.9.2/kafka-clients-3.9.2.jar"
# franz-go's own integration tests (pkg/kgo), compiled from the Go module proxy at the
# version tests/franz_go/go.mod pins, run by tests/test_franz_go.py against the brokers'
# Kafka listeners. Outside the checkout, like the jars; `source` names the module's
# directory in Go's module cache (some tests read their own sources).
FRANZ_GO_VERSION=$(sed -n 's|^require github.com/twmb/franz-go \(v[^ ]*\)$|\1|p' tests/franz_go/go.mod)
FRANZ_GO_TEST="$HOME/.cache/strata/franz-go-$FRANZ_GO_VERSION/kgo.test"
STAMP=$VENV/.strata-setup-stamp
# The C sources too: pip builds the extensions (pyproject's ext-modules) only here.
want=$(cat pyproject.toml scripts/setup.sh tests/franz_go/go.mod tests/franz_go/go.sum \
  brokers/kafka/_v2codec.c strata/client/_fastproduce.c | sha256sum | cut -d' ' -f1)

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
    && [ -f "$DELTA_JAR" ] && [ -f "$DELTA_STORAGE_JAR" ] && [ -f "$S3A_JAR" ] \
    && [ -f "$S3A_SDK_JAR" ] && [ -f "$KAFKA_CONNECTOR_JAR" ] && [ -f "$KAFKA_CLIENTS_JAR" ] \
    && command -v kcat >/dev/null && compgen -G "brokers/kafka/_v2codec*.so" >/dev/null \
    && compgen -G "strata/client/_fastproduce*.so" >/dev/null \
    && [ -x "$FRANZ_GO_TEST" ] && [ -f "$(dirname "$FRANZ_GO_TEST")/source" ]; then
  echo "setup: up to date (.venv, Delta, S3A and Spark Kafka connector jars, franz-go tests ready)"
  exit 0
fi

if ! command -v java >/dev/null; then
  echo "setup: Java 17 or newer is required (apt-get install openjdk-17-jdk-headless)" >&2; exit 1
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
  echo "setup: Java 17 or newer is required, found '${java_major:-unknown}' (apt-get install openjdk-17-jdk-headless)" >&2
  exit 1
fi
if ! command -v mvn >/dev/null; then
  echo "setup: installing maven from Debian packages"
  apt-get update -qq && apt-get install -y -qq maven >/dev/null
fi
if ! command -v kcat >/dev/null; then
  # A stock Kafka tool the tests run against the brokers' Kafka listeners
  # (tests/test_kafka_clients.py; docs/kafka-compatibility.md).
  echo "setup: installing kcat (the Kafka command-line client) from Debian packages"
  apt-get update -qq && apt-get install -y -qq kcat >/dev/null
fi
if ! command -v wrk >/dev/null; then
  echo "setup: installing wrk (HTTP load generator of scripts/bench_gateway.sh) from Debian packages"
  # Only the gateway benchmark needs it: a failed install must not stop `make test`.
  (apt-get update -qq && apt-get install -y -qq wrk >/dev/null) \
    || echo "setup: could not install wrk; scripts/bench_gateway.sh needs it (apt-get install wrk)" >&2
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
echo "setup: installing strata (editable) and its pinned dependencies"
# editable_mode=compat: a .pth path entry instead of setuptools' import hook, so
# pkgutil.iter_modules sees pyspark_strata.py and Spark registers format("strata") by
# itself (spark_source/README.md, "Registration").
"$VENV/bin/python" -m pip install -q -e ".[all,dev]" --config-settings editable_mode=compat

if [ ! -f "$DELTA_JAR" ] || [ ! -f "$DELTA_STORAGE_JAR" ]; then
  echo "setup: fetching $DELTA_ARTIFACT and its dependencies from Maven Central into ~/.m2"
  mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.6.1:get -Dartifact="$DELTA_ARTIFACT"
fi
if [ ! -f "$S3A_JAR" ] || [ ! -f "$S3A_SDK_JAR" ]; then
  echo "setup: fetching $S3A_ARTIFACT and the AWS SDK bundle from Maven Central into ~/.m2"
  mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.6.1:get -Dartifact="$S3A_ARTIFACT"
fi
if [ ! -f "$KAFKA_CONNECTOR_JAR" ] || [ ! -f "$KAFKA_CLIENTS_JAR" ]; then
  echo "setup: fetching $KAFKA_CONNECTOR_ARTIFACT and kafka-clients from Maven Central into ~/.m2"
  mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.6.1:get \
    -Dartifact="$KAFKA_CONNECTOR_ARTIFACT"
fi
if [ ! -x "$FRANZ_GO_TEST" ] || [ ! -f "$(dirname "$FRANZ_GO_TEST")/source" ]; then
  GO=$(command -v go || echo /usr/local/go/bin/go)
  if [ ! -x "$GO" ]; then
    echo "setup: Go 1.26 or newer is required to build franz-go's tests for tests/test_franz_go.py (https://go.dev/dl/)" >&2
    exit 1
  fi
  echo "setup: building franz-go $FRANZ_GO_VERSION's pkg/kgo tests (Go module proxy) into ${FRANZ_GO_TEST%/*}"
  mkdir -p "$(dirname "$FRANZ_GO_TEST")"
  (cd tests/franz_go \
    && GOFLAGS=-mod=readonly "$GO" test -c -o "$FRANZ_GO_TEST.part" github.com/twmb/franz-go/pkg/kgo \
    && GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Dir}}' github.com/twmb/franz-go \
      > "$(dirname "$FRANZ_GO_TEST")/source")
  mv "$FRANZ_GO_TEST.part" "$FRANZ_GO_TEST"
fi
echo "$want" > "$STAMP"
echo "setup: done"
