#!/usr/bin/env bash
# Fetches the JVM jars of a pom from Maven Central into a directory:
#   scripts/fetch-jars.sh [OUT [POM]]
# jars/pom.xml (the Iceberg Spark runtime) into .venv/jars by default: where icelog looks for them
# (icelog.lake.catalog.jars_dir; ICELOG_JARS_DIR overrides). jars/kafka/pom.xml (Kafka's client, tools, Streams and
# Connect, for the tests) goes into .venv/kafka-jars. Whether a pom's dependencies come along is the pom's own
# maven-dependency-plugin configuration. Maven keeps its own copy in ~/.m2/repository: a second fetch, into any
# directory, needs no network. Run by scripts/setup.sh; never at test or start time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.venv/jars}")
pom=${2:-jars/pom.xml}
mkdir -p "$out"
fetched=$(mktemp -d "$out/.fetch-XXXXXX")
trap 'rm -rf "$fetched"' EXIT
# (Maven's output only when it fails: even quiet, it prints terminal escapes)
if ! log=$(mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$fetched" 2>&1); then
  echo "$log" >&2
  echo "fetch-jars: mvn failed fetching $pom's jars into $out" >&2
  exit 1
fi
ls "$fetched"/*.jar >/dev/null
# The pom's jars only: a version it no longer names must not stay on a classpath. Each jar is renamed into place, so
# a JVM running meanwhile keeps reading the file it opened.
for jar in "$out"/*.jar; do
  if [ -e "$jar" ] && [ ! -e "$fetched/$(basename "$jar")" ]; then rm -f "$jar"; fi
done
mv -f "$fetched"/*.jar "$out"/
