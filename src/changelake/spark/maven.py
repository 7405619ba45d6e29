"""The JVM libraries changelake's Spark sessions load from Maven Central: Delta Lake's,
Spark's own Kafka connector and Avro functions (`KAFKA_ARTIFACTS`), and Hadoop's S3A connector
with the AWS SDK modules it uses (for a lake on `s3a://`).

PySpark's own jars have no Delta Lake. `scripts/install.sh` fetches the artifacts of
`ARTIFACTS` once into this Python environment (`sys.prefix`, so `.venv` in a checkout:
`jar_dir()`), each checked against the SHA-1 the repository publishes beside it, and every
Spark session `build_session` starts puts them on `spark.jars` (`jars()`), with Delta's SQL
extension and catalog (`DELTA_CONF`).

Only the artifacts named here are fetched, not their dependency trees: `delta-spark`'s
declared dependencies (Hadoop 3.4, Jackson 2.13, Parquet 1.16, Scala, log4j) are older copies
of what PySpark's jars already hold, and on the classpath beside them they would only be
shadowed or conflict. Spark's `--packages` (Ivy) resolution takes the whole tree; so does
`mvn dependency:copy-dependencies` without `excludeTransitive` (PLATFORM.md).

S3A (`hadoop-aws`) is fetched at PySpark's Hadoop version (`hadoop-client-api-3.5.0` in
its jars) with the AWS SDK v2 release its pom was built against. Its pom names the SDK's
`bundle` (686 MB: every AWS service, with Netty, Jackson and HttpClient shaded inside); S3A
uses only S3, its transfer manager and STS, so `OBJECT_STORE_ARTIFACTS` names those modules
and the SDK modules they depend on (about 12 MB), and takes HttpClient, Netty, commons-codec
and SLF4J from PySpark's jars (docs/platform-notes.md). `object_store_jars()` is what a
session on a remote lake adds to `spark.jars`.

`CHANGELAKE_MAVEN_REPO` names another repository (a mirror or a proxy that serves Maven
Central's layout); the default is Maven Central.

Spark's Kafka connector (`spark-sql-kafka-0-10`, the `kafka` source) and `spark-avro`
(`from_avro`) are PySpark's version; the connector's pom (4.2.0) declares, besides
`spark-token-provider-kafka-0-10` of the same version, `kafka-clients` 3.9.2 and
`commons-pool2` 2.13.1 (`kafka.version` and `commons-pool2.version` of `spark-parent` 4.2.0),
fetched here; the rest of their trees (`zstd-jni`, `lz4-java`, `snappy-java`, `slf4j-api`,
`jsr305`, `scala-parallel-collections`, `spark-tags`, `hadoop-client-runtime`, and `avro`,
`xz` for spark-avro) are in PySpark's jars, at the versions Spark is built with.
`kafka_jars()` is what every session adds to `spark.jars` (`session.build_session`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from changelake.errors import ChangelakeError
from changelake.redact import redact


@dataclass(frozen=True, slots=True)
class Artifact:
    """One jar of a Maven repository: `group:name:version`."""

    group: str
    name: str
    version: str

    @property
    def file(self) -> str:
        return f"{self.name}-{self.version}.jar"

    def url(self, repository: str) -> str:
        return "/".join((repository.rstrip("/"), *self.group.split("."), self.name,
                         self.version, self.file))

    def __str__(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"


DELTA_VERSION = "4.4.0"
"""Delta Lake's release: the newest whose Spark jar (`delta-spark_4.2_2.13`) is on Maven
Central for the Spark that `pyproject.toml` pins (4.2.0), and the `delta-spark` Python
package of the same version."""

DELTA_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("io.delta", "delta-spark_4.2_2.13", DELTA_VERSION),
    Artifact("io.delta", "delta-storage", DELTA_VERSION),
)

HADOOP_AWS_VERSION = "3.5.0"
"""Hadoop's S3A connector: PySpark 4.2's Hadoop (`hadoop-client-api-3.5.0`)."""

AWS_SDK_VERSION = "2.35.4"
"""The AWS SDK v2 release `hadoop-aws` 3.5.0 was built with (`aws-java-sdk-v2.version` in
`hadoop-project` 3.5.0's pom)."""

AWS_SDK_MODULES = (
    "s3", "s3-transfer-manager", "sts", "aws-query-protocol", "aws-xml-protocol",
    "protocol-core", "arns", "profiles", "crt-core", "http-auth", "identity-spi",
    "http-auth-spi", "http-auth-aws", "http-auth-aws-eventstream", "checksums",
    "checksums-spi", "retries", "retries-spi", "sdk-core", "auth", "http-client-spi",
    "regions", "annotations", "utils", "utils-lite", "aws-core", "metrics-spi", "json-utils",
    "third-party-jackson-core", "endpoints-spi", "apache-client", "netty-nio-client",
)
"""The SDK modules S3A needs: `s3`, `s3-transfer-manager` (copies, so renames) and `sts`
(assumed roles), with their dependency tree in the SDK (`mvn dependency:tree` of the three).
Their third-party dependencies (HttpClient 4.5, Netty, commons-codec, SLF4J) are in
PySpark's jars, at versions they run with."""

OBJECT_STORE_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("org.apache.hadoop", "hadoop-aws", HADOOP_AWS_VERSION),
    *(Artifact("software.amazon.awssdk", name, AWS_SDK_VERSION) for name in AWS_SDK_MODULES),
    Artifact("software.amazon.eventstream", "eventstream", "1.0.1"),
    Artifact("org.reactivestreams", "reactive-streams", "1.0.4"),
    # S3A 3.5 links its optional "analytics" input stream's client at its first use of a
    # bucket, whichever stream is chosen: without it, NoClassDefFoundError. No dependencies.
    Artifact("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1"),
)

SPARK_VERSION = "4.2.0"
"""PySpark's version (`pyproject.toml`): Spark's Kafka connector and spark-avro are built
against one Spark release and must be the session's."""

KAFKA_CLIENTS_VERSION = "3.9.2"
"""The `kafka-clients` of `spark-sql-kafka-0-10_2.13` 4.2.0's pom (`kafka.version`)."""

COMMONS_POOL2_VERSION = "2.13.1"
"""The `commons-pool2` of that pom (`commons-pool2.version`): the connector's consumer pool."""

KAFKA_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION),
    Artifact("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", SPARK_VERSION),
    Artifact("org.apache.kafka", "kafka-clients", KAFKA_CLIENTS_VERSION),
    Artifact("org.apache.commons", "commons-pool2", COMMONS_POOL2_VERSION),
    Artifact("org.apache.spark", "spark-avro_2.13", SPARK_VERSION),
)
"""Spark's own `kafka` source (batch and streaming) with what it needs beyond PySpark's jars,
and `spark-avro` (`from_avro`, `to_avro`)."""

ARTIFACTS: tuple[Artifact, ...] = DELTA_ARTIFACTS + KAFKA_ARTIFACTS + OBJECT_STORE_ARTIFACTS
"""Everything the setup fetches."""

DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
}
"""What a session needs to read and write Delta tables by name and by path; and the
partitions of the job that rebuilds a table's state from its log (Delta's default, 50, is
for a cluster: on a small log each of its 50 tasks costs more than the work, and a commit's
`txnAppId` check runs that job; a session's own setting wins)."""

REPOSITORY_ENV = "CHANGELAKE_MAVEN_REPO"
CENTRAL = "https://repo.maven.apache.org/maven2"


def jar_dir() -> Path:
    """Where this environment keeps the fetched jars."""
    return Path(sys.prefix) / "share" / "changelake" / "jars"


def jars() -> list[Path] | None:
    """Delta Lake's fetched jars, or None where any is missing (`fetch` has not run here)."""
    return _present(DELTA_ARTIFACTS)


def kafka_jars() -> list[Path] | None:
    """Spark's Kafka connector's and spark-avro's fetched jars (`KAFKA_ARTIFACTS`), or None
    where any is missing."""
    return _present(KAFKA_ARTIFACTS)


def object_store_jars() -> list[Path] | None:
    """S3A's fetched jars (`OBJECT_STORE_ARTIFACTS`), or None where any is missing."""
    return _present(OBJECT_STORE_ARTIFACTS)


def _present(artifacts: tuple[Artifact, ...]) -> list[Path] | None:
    found = [jar_dir() / a.file for a in artifacts]
    return found if all(p.is_file() for p in found) else None


def require_jars() -> list[Path]:
    """`jars()`, or a ChangelakeError in one line saying how to fetch them."""
    found = jars()
    if found is None:
        raise ChangelakeError(
            f"Delta Lake's jars are not in {jar_dir()}: run scripts/install.sh (or "
            "`python -m changelake.spark.maven`) with access to Maven Central")
    return found


def fetch(repository: str | None = None, *, timeout: float = 60.0,
          target: Path | None = None) -> list[Path]:
    """Download every artifact not already in `target` (default `jar_dir()`), each checked
    against its published SHA-1 and put in place by a rename (so an interrupted fetch leaves
    no partial jar)."""
    repository = repository or os.environ.get(REPOSITORY_ENV) or CENTRAL
    target = jar_dir() if target is None else target
    target.mkdir(parents=True, exist_ok=True)
    out = []
    for artifact in ARTIFACTS:
        path = target / artifact.file
        if not path.is_file():
            url = artifact.url(repository)
            body = _get(url, timeout, artifact)
            expected = _get(url + ".sha1", timeout, artifact).decode().split()[0].strip()
            actual = hashlib.sha1(body).hexdigest()
            if actual != expected:
                raise ChangelakeError(
                    f"{artifact} from {redact(repository)}: its SHA-1 is {actual}, "
                    f"the repository says {expected}; nothing was installed")
            with tempfile.NamedTemporaryFile(dir=target, delete=False, suffix=".part") as f:
                f.write(body)
            os.replace(f.name, path)
        out.append(path)
    return out


def _get(url: str, timeout: float, artifact: Artifact) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", None) or error
        raise ChangelakeError(f"cannot fetch {artifact} from {redact(url)}: "
                              f"{redact(str(reason), known=url)} (set {REPOSITORY_ENV} to a "
                              "reachable Maven repository)") from None


def main() -> int:
    try:
        fetched = fetch()
    except ChangelakeError as error:
        print(f"changelake setup: {error}", file=sys.stderr)
        return 1
    print(f"changelake setup: {len(fetched)} jars in {jar_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
