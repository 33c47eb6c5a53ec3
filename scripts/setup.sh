#!/usr/bin/env bash
# Installs everything icelog and its tests need on a fresh Debian machine:
# system packages (JDK, Maven, kcat, JDBC driver jars, promtool, PostgreSQL) when missing, then a virtualenv at .venv
# the Iceberg Spark runtime jar from Maven Central in .venv/jars, and Kafka's Java client, tools, Streams and Connect
# (for the tests) in .venv/kafka-jars (scripts/fetch-jars.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
# javac: the tests compile their Java drivers of Kafka's client (tests/java/) against .venv/kafka-jars
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)  # fetches jars/pom.xml's and jars/kafka/pom.xml's jars
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
[ -f /usr/share/java/sqlite-jdbc.jar ] || need_apt+=(libxerial-sqlite-jdbc-java)
[ -f /usr/share/java/postgresql.jar ] || need_apt+=(libpostgresql-jdbc-java)
# promtool (Debian's prometheus package) checks the /metrics text in tests/system/test_metrics.py
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The tests start a throwaway PostgreSQL server (the metadata store's second backend): any installed version does.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
echo "setup: installing Python packages into .venv"
.venv/bin/pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
echo "setup: fetching jars/pom.xml's jars from Maven Central into .venv/jars"
scripts/fetch-jars.sh .venv/jars
# Kafka's own Java client, tools, Streams and Connect: the tests run them against icelog (tests/support/java.py).
echo "setup: fetching jars/kafka/pom.xml's jars from Maven Central into .venv/kafka-jars"
scripts/fetch-jars.sh .venv/kafka-jars jars/kafka/pom.xml
# The Go clients of tests/go (franz-go, IBM/sarama) into Go's module cache; the tests build them with the proxy off.
if command -v go >/dev/null 2>&1; then
  echo "setup: fetching tests/go's Go modules into the module cache, and compiling them into Go's build cache"
  (cd tests/go && go mod download)
  # (the tests' own `go build` then links in a second instead of compiling franz-go and sarama: ~60 s of CPU)
  (cd tests/go && GOPROXY=off GOFLAGS="-mod=readonly -buildvcs=false" go build -o /dev/null .)
else
  echo "setup: no Go toolchain: tests/go (franz-go, sarama) will fail until Go 1.26+ is installed" >&2
fi
# KafkaJS (tests/js) into tests/js/node_modules, at package-lock.json's versions.
if command -v npm >/dev/null 2>&1; then
  echo "setup: installing tests/js's npm packages (KafkaJS)"
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error >/dev/null
else
  echo "setup: no Node.js: tests/js (KafkaJS) will fail until node and npm are installed" >&2
fi
.venv/bin/python -c 'import icelog, kafka, confluent_kafka, aiokafka; from icelog.lake.catalog import iceberg_runtime_jar; iceberg_runtime_jar()'
echo "setup: done"
