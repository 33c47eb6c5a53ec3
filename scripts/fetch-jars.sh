#!/usr/bin/env bash
# Fetches the JVM jars of jars/pom.xml (the Iceberg Spark runtime) from Maven Central into a directory, .venv/jars
# unless one is given: where icelog looks for them (icelog.lake.catalog.jars_dir; ICELOG_JARS_DIR overrides).
# Maven keeps its own copy in ~/.m2/repository: a second fetch, into any directory, needs no network.
# Run by scripts/setup.sh; never at test or start time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.venv/jars}")
mkdir -p "$out"
fetched=$(mktemp -d "$out/.fetch-XXXXXX")
trap 'rm -rf "$fetched"' EXIT
# (Maven's output only when it fails: even quiet, it prints terminal escapes)
if ! log=$(mvn -q -B -f jars/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
             -DoutputDirectory="$fetched" 2>&1); then
  echo "$log" >&2
  echo "fetch-jars: mvn failed fetching jars/pom.xml's jars into $out" >&2
  exit 1
fi
ls "$fetched"/*.jar >/dev/null
# The pom's jars only: a version it no longer names must not stay on Spark's classpath. Each jar is renamed into
# place, so a JVM running meanwhile keeps reading the file it opened.
for jar in "$out"/*.jar; do
  if [ -e "$jar" ] && [ ! -e "$fetched/$(basename "$jar")" ]; then rm -f "$jar"; fi
done
mv -f "$fetched"/*.jar "$out"/
