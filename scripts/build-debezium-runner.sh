#!/usr/bin/env bash
# Build changelake's Debezium runner (jvm/debezium-runner) into TARGET (default: the folder
# `changelake.capture.debezium.runner.runner_dir()` names in .venv): its jar and every jar it
# needs, from Maven Central. Idempotent: skipped when TARGET was built from the same sources.
# scripts/install.sh runs it; run it alone after changing the runner.
set -euo pipefail
cd "$(dirname "$0")/.."
module=jvm/debezium-runner

if ! command -v mvn >/dev/null 2>&1; then
  echo "changelake setup: Maven (mvn) is required to build the Debezium runner and was not found (apt-get install maven)." >&2
  exit 1
fi
target="${1:-$(.venv/bin/python -c 'import sys; print(sys.prefix)')/share/changelake/debezium}"
stamp=$(cat "$module/pom.xml" $(find "$module/src" -type f | sort) | sha256sum | cut -c1-16)
if [ -f "$target/debezium-runner.jar" ] && [ "$(cat "$target/.built-from" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
# The module's own target/ stays out of the checkout: Maven builds in a copy.
cp -r "$module/." "$build/"
log="$build/maven.log"
if ! (cd "$build" && mvn -B -q package dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory=target/lib >"$log" 2>&1); then
  echo "changelake setup: building the Debezium runner failed (mvn package); its last lines:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
mkdir -p "$(dirname "$target")"
fresh="$target.new.$$"
rm -rf "$fresh"
mkdir -p "$fresh"
cp "$build/target/debezium-runner.jar" "$build"/target/lib/*.jar "$fresh/"
echo "$stamp" > "$fresh/.built-from"
rm -rf "$target.old"
[ -d "$target" ] && mv "$target" "$target.old"
mv "$fresh" "$target"
rm -rf "$target.old"
echo "changelake setup: Debezium runner built in $target ($(ls "$target" | wc -l) jars)"
