"""The project's own JVM code: Java sources shipped in this package, compiled into one jar.

What it holds: the Spark path's one implementation of the changefeed rules that run per line
or per key on the executors (the Python path, `changefeed/python_path`, runs the
specification itself for the batches this one refuses: `changefeed/dispatch.py`). The line
readers (`DebeziumLine.java`, `YdbLine.java`) read each line in one streaming pass of Jackson
into the specification's item, and leave what they do not read to the Python path; the tasks'
passes over them (`DebeziumLines.java`, `YdbLines.java`) make the parsed rows and the facts
the later steps need, and keep YDB's barrier rule within each block as they read. The row
images are read against the columns' types by `DebeziumImage.java`, and the keyed conversion
(`KeyedConversion.java`, called through Py4J, not a UDF) makes one pass over each key's
events. Why Java and not Spark's functions: the same rules as column expressions (`from_json`
against a wide nested schema, `json_object_keys`, regular expressions, window operators) were
most of an ingest's time (benchmarks/README.md, "Figures moved out of docstrings").
And a batch's checkpoints (`checkpoint.stored`) are kept as chunks of their rows' bytes
(`StoredRows.java`), where Spark's `localCheckpoint` serialized each row as an object of its
own; and a YDB batch's parsed rows are not stored at all, but kept as the shuffle by key that
the parse's job writes and the conversion reads (`KeptShuffle.java`, `checkpoint.kept_shuffle`),
which no DataFrame call can share between two jobs.

How it gets onto the JVM: the sources are the Maven module `jvm/spark-rules` (its
`pom.xml` compiles them in place, against the jars PySpark 4.2.0 bundles, and runs the JUnit
tests of their rules). `scripts/install.sh` builds it (`python -m changelake.spark.jvm`, which
runs `mvn -q -B package`) into this package, `changelake-spark-rules.jar`, package data that a
wheel ships; its manifest records the digest of the sources and the PySpark version it was
built from, and in a checkout of the module's `pom.xml` and JUnit sources (`_digest`).
`build_session` asks `jar()` for the jar and puts it on `spark.jars` before the JVM starts.
`jar()` takes the packaged jar where its digest is the sources' (read from the manifest: no
subprocess; `is_current`), else one built by Maven for these sources in a folder of this
Python environment (`sys.prefix`, so `.venv` in a checkout; else this user's private
temporary folder: `_folder`), named by the digest: a checkout whose Java, pom or JUnit tests
changed since the install builds it again, once, without the tests. The
jar is required on Spark: where it must be built and no Maven, no JDK 17+ (a JRE has no
`javac`) or no module (`jvm/spark-rules/pom.xml`, in a checkout only) is found, or Maven fails,
`jar()` raises a `ChangelakeError` saying so; and `register` and `java_class` raise one naming
the jar to add to `spark.jars` for a session built without it (one the caller built, not
`build_session`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from changelake.errors import ChangelakeError
from changelake.private import private_folder, temporary_folder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HERE = Path(__file__).resolve().parent
SOURCES = tuple(sorted(HERE.rglob("*.java")))
"""The Java sources: what the module's `pom.xml` compiles (`**/*.java` of this folder)."""

PACKAGED = HERE / "changelake-spark-rules.jar"
"""The jar `scripts/install.sh` builds into this package (package data: a wheel ships it)."""

MODULE = HERE.parents[2].parent / "jvm" / "spark-rules"
"""The Maven module that builds the jar: in a checkout, `jvm/spark-rules` beside `src/`."""

DIGEST_ATTRIBUTE = "Changelake-Digest"
"""The jar manifest's attribute holding the `_digest` of what it was built from."""

BUILT_NAME = "changelake-spark-rules.jar"
"""The jar's name in Maven's build folder (the pom's `finalName`)."""


def _module_files(module: Path) -> list[Path]:
    """What else the jar is built from, in `module`: its `pom.xml` (the dependencies'
    versions, the compiler's options) and its JUnit tests' sources (a jar the install built
    passed them)."""
    tests = module / "src" / "test"
    return [module / "pom.xml", *sorted(tests.rglob("*.java"))]


def _digest(module: Path | None = None) -> str:
    """The digest of what the jar is built from: a jar built from others is stale. The
    sources' and PySpark's version's (16 hex digits), then, in a checkout (where `module`,
    `MODULE` by default, has its `pom.xml`), `-` and the module's (`_module_files`, each
    named by its path in the module). An installed package has no module, and cannot build
    one: there the sources' digest is compared with the first part of the jar's
    (`is_current`)."""
    import pyspark

    module = MODULE if module is None else module
    h = hashlib.sha256(pyspark.__version__.encode())
    for source in SOURCES:
        h.update(source.read_bytes())
    digest = h.hexdigest()[:16]
    if not (module / "pom.xml").is_file():
        return digest
    m = hashlib.sha256()
    for path in _module_files(module):
        m.update(path.relative_to(module).as_posix().encode() + b"\0")
        m.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{digest}-{m.hexdigest()[:16]}"


def is_current(recorded: str | None, digest: str) -> bool:
    """Whether a jar that records `recorded` (`recorded_digest`) is of what `_digest` gives
    (`digest`): the same, or, without the module (no `-` in `digest`), the same sources."""
    if recorded is None:
        return False
    return recorded == digest or ("-" not in digest and recorded.split("-")[0] == digest)


def recorded_digest(path: Path) -> str | None:
    """The digest `path`'s manifest records (`DIGEST_ATTRIBUTE`); None where there is no such
    jar, or no digest in it."""
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = archive.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    prefix = f"{DIGEST_ATTRIBUTE}: "
    return next((line[len(prefix):].strip() for line in manifest.splitlines()
                 if line.startswith(prefix)), None)


def _trusted(folder: Path) -> bool:
    """Whether a jar in `folder` can only have been put there by this user or root: a real
    folder of theirs that no one else may write to."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid in (os.geteuid(), 0)
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _folder() -> Path:
    """Where a jar built after the install is kept: in this Python environment if this user
    can write there and no one else can, else in this user's private folder under the
    machine's temporary folder (`changelake.private`: a jar planted there would be loaded into
    every session)."""
    home = Path(sys.prefix) / "share" / "changelake"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK) and _trusted(home):
            return home
    except OSError:
        pass
    return private_folder(temporary_folder("changelake-jvm"))


def jar() -> Path:
    """The jar of these sources: the packaged one where its recorded digest is theirs (no
    subprocess), else one built for them by Maven now or before (`build`, without its tests);
    a `ChangelakeError` in one line where it cannot be built. Safe for processes starting at
    once: each builds in a folder of its own and renames the jar into place."""
    digest = _digest()
    if is_current(recorded_digest(PACKAGED), digest):
        return PACKAGED
    target = _folder() / f"changelake-spark-rules-{digest}.jar"
    if target.exists():
        _used(target)
        return target
    build(target, digest, tests=False)
    unused = time.time() - STALE_AFTER_SECONDS
    # of other sources, and those javac compiled before Maven built the jar
    olds = [*target.parent.glob("changelake-spark-rules-*.jar"),
            *target.parent.glob("changelake-jvm-*.jar")]
    for stale in olds:
        try:
            if stale != target and stale.stat().st_mtime < unused:
                stale.unlink(missing_ok=True)
        except OSError:
            pass
    return target


def build(target: Path, digest: str, *, tests: bool) -> Path:
    """Build the jar with Maven (`MODULE`'s `pom.xml`), its manifest recording `digest`, and
    rename it to `target`. With `tests`, Maven runs the JUnit tests (the install's build) and
    resolves online; without, it skips them and tries offline first (`~/.m2` has what the
    install fetched), then online where offline lacked an artifact. Maven builds in a
    temporary folder beside `target`, so that builds started at once share nothing but the
    rename. A `ChangelakeError` in one line where Maven, a JDK or the module is missing, or
    Maven fails."""
    mvn = shutil.which("mvn")
    pom = MODULE / "pom.xml"
    why = (f"changelake's Spark path needs its jar built from its Java sources (the packaged "
           f"one, {PACKAGED.name}, is {_state(PACKAGED)})")
    if not pom.is_file():
        raise ChangelakeError(f"{why}, and the Maven module that builds it ({pom}) is not "
                              f"there: reinstall changelake")
    if mvn is None:
        raise ChangelakeError(f"{why}, which needs Maven (`mvn`), and none was found on PATH "
                              f"(Debian/Ubuntu: apt-get install maven)")
    javac = _javac()
    if javac is None:
        java_home = os.environ.get("JAVA_HOME")
        raise ChangelakeError(f"{why}, which needs a JDK 17 or later (`javac`), and none was "
                              f"found on PATH or in JAVA_HOME ({java_home or 'unset'}); a JRE "
                              f"alone is not enough")
    from changelake.spark.maven import CENTRAL, REPOSITORY_ENV

    repository = os.environ.get(REPOSITORY_ENV) or CENTRAL
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        command = [mvn, "-q", "-B", "-f", str(pom), "package", f"-Dchangelake.digest={digest}",
                   f"-Dchangelake.build={Path(work) / 'target'}", f"-Dmaven.repo={repository}"]
        attempts = [command] if tests else [[*command, "-o", "-Dmaven.test.skip=true"],
                                            [*command, "-Dmaven.test.skip=true"]]
        for attempt in attempts:
            done = subprocess.run(attempt, capture_output=True, text=True,
                                  env={**os.environ, "JAVA_HOME": str(Path(javac).parents[1])})
            # online again only where offline lacked something, not for a compile error
            if done.returncode == 0 or "offline" not in done.stdout + done.stderr:
                break
        if done.returncode != 0:
            raise ChangelakeError(build_failed(done.stdout + done.stderr))
        os.replace(Path(work) / "target" / BUILT_NAME, target)
    return target


def _state(path: Path) -> str:
    """What is wrong with the packaged jar at `path`, in a few words."""
    recorded = recorded_digest(path)
    if recorded is None:
        return "missing" if not path.exists() else "without a recorded digest"
    return (f"of other sources, another pom.xml or JUnit tests, or another PySpark (digest "
            f"{recorded}, not {_digest()})")


def _javac() -> str | None:
    """The JDK's `javac` Maven compiles with: JAVA_HOME's, else the PATH's (resolved, so that
    its JDK's folder is two levels up); None where there is none."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").exists():
        return str(Path(java_home) / "bin" / "javac")
    found = shutil.which("javac")
    return str(Path(found).resolve()) if found else None


STALE_AFTER_SECONDS = 7 * 24 * 3600.0
"""A built jar of other sources is removed once no session has asked for it for this long:
one of another changelake in the same environment (a `--follow` still running the version an
upgrade replaced, two checkouts on one environment) is in use, and a session that starts
while its jar is removed fails (Spark serves `spark.jars` from their paths)."""


def _used(path: Path) -> None:
    """Mark the jar as asked for now (its modification time), for `STALE_AFTER_SECONDS`."""
    with contextlib.suppress(OSError):
        os.utime(path)


def build_failed(output: str) -> str:
    """The one line saying that Maven failed: its first error, and what that means."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines
              if line.startswith("[ERROR]") and line.removeprefix("[ERROR]").strip()]
    first = next((line for line in errors if ".java" in line),
                 errors[0] if errors else lines[0] if lines else "")
    first = first[:300] if first else "no output"
    return (f"changelake's Spark path needs its jar, and building it from its Java sources "
            f"with Maven failed: {first}")


def register(spark: SparkSession, name: str, class_name: str, return_type: str) -> None:
    """Registers the jar's class `class_name` as `spark`'s SQL function `name` (once: later
    calls find it); a `ChangelakeError` where `spark`'s JVM lacks the jar (`missing_jar`)."""
    if spark.catalog.functionExists(name):
        return
    try:
        spark.udf.registerJavaFunction(name, class_name, return_type)
    except Exception as e:  # the class is not on this JVM's class path
        if _found_class(spark, class_name) is None:
            raise missing_jar(class_name) from e
        raise


def java_class(spark: SparkSession, class_name: str) -> Any:
    """The jar's class `class_name` on `spark`'s JVM (its static methods callable through
    Py4J); a `ChangelakeError` where the JVM lacks the jar (`missing_jar`)."""
    found = _found_class(spark, class_name)
    if found is None:
        raise missing_jar(class_name)
    return found


def _found_class(spark: SparkSession, class_name: str) -> Any | None:
    """`java_class`, or None where `spark`'s JVM has no such class."""
    from py4j.java_gateway import JavaClass

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    found = jvm
    for part in class_name.split("."):
        found = getattr(found, part)
    return found if isinstance(found, JavaClass) else None


def missing_jar(class_name: str) -> ChangelakeError:
    """The error for a session built without the jar: what to add, and where it is."""
    return ChangelakeError(
        f"this SparkSession has no {class_name}: changelake's Spark path needs its jar on the "
        f"session's class path; build the session with changelake.spark.session.build_session, "
        f"or set spark.jars={jar()} (with any other jars) before the session starts")
