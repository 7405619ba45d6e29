"""The project's own JVM code: Java sources shipped in this package, compiled into one jar.

Why Java at all: the parse was the largest step of a Debezium ingest (about a third of its
time at 1.1M events), and most of it was Spark's JSON functions (`from_json` against a wide
nested schema, `json_object_keys`, regular expressions over the text) and the rules' column
expressions over their result. One streaming pass of Jackson over the line in a Java UDF
(`DebeziumLine.java`) applies the same rules with no Python on the executors, and the parse is
faster (benchmarks/README.md, "Figures moved out of docstrings"). The same goes for the row
images the conversion reads against the columns' types (`DebeziumImage.java`), which
`from_json` read through a char reader made for every image, and for the YDB lines the typed
parse reads (`YdbLine.java`), which a regular expression proved simple before `from_json` read
them; a YDB batch whose every line Java reads is read in the tasks into the parsed rows
(`YdbLines.java`, as `DebeziumLines.java` does for Debezium), with none of the expressions.
And the keyed conversion (`KeyedConversion.java`, called through Py4J, not a UDF) makes one
pass over each key's events where Spark's windows copied every event through four window
operators, an explode and an aggregate, and the conversion step is faster (benchmarks/README.md,
"Figures moved out of docstrings"). YDB's barrier rule (`BarrierScan.java`, also through Py4J)
is one pass over each block of lines in read order where a window shuffled and sorted every
record, and the step is faster (benchmarks/README.md, "Figures moved out of docstrings").
And a batch's checkpoints (`checkpoint.stored`) are kept as chunks of their rows' bytes
(`StoredRows.java`), where Spark's `localCheckpoint` serialized each row as an object of its
own; and a YDB batch's parsed rows are not stored at all, but kept as the shuffle by key that
the parse's job writes and the conversion reads (`KeptShuffle.java`, `checkpoint.kept_shuffle`),
which no DataFrame call can share between two jobs.

How it gets onto the JVM: `build_session` asks `jar()` for the jar and puts it on
`spark.jars` before the JVM starts. `jar()` compiles the sources with `javac` against
PySpark's own jars (Jackson, Spark's Java API) the first time, into a folder of this Python
environment (`sys.prefix`, so `.venv` in a checkout), named by a digest of the sources and
the PySpark version, so that a changed source or Spark is compiled again and an unchanged one
never is. The jar is required on Spark: where no JDK 17+ is found (a JRE has no `javac`) or
its compiler fails, `jar()` raises a `ChangelakeError` saying so; and `register` and
`java_class` raise one naming the jar to add to `spark.jars` for a session built without it
(one the caller built, not `build_session`).
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

SOURCES = tuple(Path(__file__).with_name(f"{name}.java")
                for name in ("DebeziumLine", "DebeziumLines", "DebeziumImage", "JsonBytes",
                             "UniqueKeys", "YdbLine", "YdbLines", "SparkType", "Positions",
                             "KeyedConversion", "BarrierScan", "StoredRows", "KeptShuffle",
                             "PasswordFile"))


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _digest() -> str:
    import pyspark

    h = hashlib.sha256(pyspark.__version__.encode())
    for source in SOURCES:
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


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
    """Where the jar is kept: in this Python environment if this user can write there and no
    one else can, else in this user's private folder under the machine's temporary folder
    (`changelake.private`: a jar planted there would be loaded into every session)."""
    home = Path(sys.prefix) / "share" / "changelake"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK) and _trusted(home):
            return home
    except OSError:
        pass
    return private_folder(temporary_folder("changelake-jvm"))


def jar() -> Path:
    """The compiled jar, compiled now if need be; a `ChangelakeError` where it cannot be (no
    `javac`, or it failed). Safe for processes starting at once: each compiles in a folder of
    its own and renames the jar into place."""
    target = _folder() / f"changelake-jvm-{_digest()}.jar"
    if target.exists():
        _used(target)
        return target
    javac = shutil.which("javac")
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").exists():
        javac = str(Path(java_home) / "bin" / "javac")
    if javac is None:
        raise ChangelakeError(f"changelake's Spark path needs a JDK 17 or later (`javac`), and "
                              f"none was found on PATH or in JAVA_HOME ({java_home or 'unset'}); "
                              f"a JRE alone is not enough")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        done = subprocess.run(
            [javac, "-nowarn", "--release", "17", "-cp", f"{_spark_jars()}/*",
             "-d", str(classes), *map(str, SOURCES)],
            capture_output=True, text=True)
        if done.returncode != 0:
            raise ChangelakeError(compile_failed(javac, done.stderr or done.stdout))
        built = Path(work) / "out.jar"
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as out:
            out.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
        os.replace(built, target)
    unused = time.time() - STALE_AFTER_SECONDS
    for stale in target.parent.glob("changelake-jvm-*.jar"):  # of earlier sources or Sparks
        try:
            if stale != target and stale.stat().st_mtime < unused:
                stale.unlink(missing_ok=True)
        except OSError:
            pass
    return target


STALE_AFTER_SECONDS = 7 * 24 * 3600.0
"""A jar of other sources is removed once no session has asked for it for this long: one of
another changelake in the same environment (a `--follow` still running the version an
upgrade replaced, two checkouts on one environment) is in use, and a session that starts
while its jar is removed fails (Spark serves `spark.jars` from their paths)."""


def _used(path: Path) -> None:
    """Mark the jar as asked for now (its modification time), for `STALE_AFTER_SECONDS`."""
    with contextlib.suppress(OSError):
        os.utime(path)


def compile_failed(javac: str, output: str) -> str:
    """The one line saying that `javac` failed: its first error, and what that means."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "")
    first = first[:300] if first else "no output"
    return (f"changelake's Spark path needs a JDK 17 or later (`javac`), and compiling its "
            f"Java code with {javac} failed: {first}")


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
