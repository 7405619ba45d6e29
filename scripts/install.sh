#!/usr/bin/env bash
# Set up changelake in .venv inside this checkout. Fails early, in one line, without a JDK 17+.
set -euo pipefail
cd "$(dirname "$0")/.."

java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "changelake setup: a JDK 17 or newer is required for Spark and was not found." >&2
  echo "  Install it (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME." >&2
  exit 1
fi
java_version=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ -z "$java_version" ] || [ "$java_version" -lt 17 ]; then
  echo "changelake setup: Java 17 or newer is required for Spark; found version '${java_version:-unknown}'." >&2
  exit 1
fi
javac_bin="${JAVA_HOME:+$JAVA_HOME/bin/}javac"
if ! command -v "$javac_bin" >/dev/null 2>&1; then
  echo "changelake setup: a JDK 17+ (javac) is required to build changelake's Java code; found a JRE only (apt-get install openjdk-17-jdk-headless)." >&2
  exit 1
fi

if ! command -v mvn >/dev/null 2>&1; then
  echo "changelake setup: Maven (mvn) is required to build changelake's Java code and the Debezium runner and was not found (apt-get install maven)." >&2
  exit 1
fi

python_bin="${PYTHON:-python3}"
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "changelake setup: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)." >&2
  exit 1
fi

[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,docs]'
# Delta Lake's Spark jars from Maven Central, once, into .venv (src/changelake/spark/maven.py).
.venv/bin/python -m changelake.spark.maven
# Apache Kafka's broker (KRaft, one node) that the tests and the demo start
# (src/changelake/kafka/broker.py): its jars copied once by Maven from Maven Central (or
# CHANGELAKE_MAVEN_REPO) into .venv, and its class archive (half its start). Nothing to do when
# they are there; one line when Maven is missing or cannot reach the repository.
.venv/bin/python -m changelake.kafka.broker jvm/kafka-broker/pom.xml
# The project's Java code (src/changelake/spark/jvm), which Spark sessions need: the Maven
# module jvm/spark-rules, built with its JUnit tests (`mvn -q -B package`) into the package as
# changelake-spark-rules.jar, its manifest recording the sources' digest. Skipped when the jar
# is of the same sources.
.venv/bin/python -m changelake.spark.jvm
# changelake's Debezium runner (jvm/debezium-runner): Debezium's embedded PostgreSQL connector
# writing to Kafka, with every jar it needs, into .venv (changelake.capture.debezium). Needs
# Maven; skipped when already built from the same sources.
bash scripts/build-debezium-runner.sh
# The classes Spark loads, archived once for every later JVM to map instead of loading them
# (src/changelake/spark/class_archive.py): seconds off each Spark command's start. Made again
# only when Java or pyspark changed. Without it everything works, only slower to start.
if ! .venv/bin/changelake jvm-archive --if-changed; then
  echo "changelake setup: warning: no class archive made (see above); Spark commands will" \
       "start a few seconds slower" >&2
fi
echo "changelake installed in .venv (Java $java_version, $(.venv/bin/python --version))"
