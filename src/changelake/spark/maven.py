"""The JVM libraries changelake's Spark sessions load from Maven Central: Delta Lake's.

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

`CHANGELAKE_MAVEN_REPO` names another repository (a mirror or a proxy that serves Maven
Central's layout); the default is Maven Central.
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

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("io.delta", "delta-spark_4.2_2.13", DELTA_VERSION),
    Artifact("io.delta", "delta-storage", DELTA_VERSION),
)

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
    """The fetched jars, or None where any is missing (`fetch` has not run here)."""
    found = [jar_dir() / a.file for a in ARTIFACTS]
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
