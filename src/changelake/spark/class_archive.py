"""The classes a Spark session loads, archived once, so that each new JVM maps them instead.

A command that runs Spark starts a JVM, which before its first job loads about 12,000 classes
(Spark, Hadoop, Hive's metastore client, Derby, Parquet), reading, parsing and verifying each.
That is seconds of every `ingest`, `compact` or `--engine spark` command, and of every test
that runs one. HotSpot's class-data sharing does that work once:

* a run started with `-XX:ArchiveClassesAtExit=FILE` writes, when its JVM exits, the classes
  it loaded from the class path into FILE (a dynamic archive, JDK 13 and later);
* a JVM started with `-XX:SharedArchiveFile=FILE` maps them from FILE, already parsed and
  verified (`archive_options`, which `session.build_session` adds to the driver's options).

An archive is never wrong, at worst of no use. The JVM maps one only if the same JVM build
made it over the same class path (Spark's jars, checked by path, size and time); otherwise it
starts as it would have without one. The warning it prints then is sent to the JVM's stderr
(`QUIET_JVM_WARNINGS`; the CLI's Spark log), never to stdout, where a command writes its data.
So an archive left from an older Java or pyspark costs nothing; it no longer saves anything
either, until it is made again.

`scripts/install.sh` makes it (`changelake jvm-archive`, which runs a small pipeline as the
training run, `make`); run that again after upgrading Java or pyspark. It lives in the
environment (`archive_path`); `CHANGELAKE_CLASS_ARCHIVE` names another file, or none when
set empty. `benchmarks/bench_startup.py` measures a command's time with and without it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from changelake.errors import ChangelakeError

ARCHIVE_ENV = "CHANGELAKE_CLASS_ARCHIVE"

QUIET_JVM_WARNINGS = ("-Xlog:disable", "-Xlog:all=warning:stderr")
"""The JVM's own warnings (the unified log's: an archive it cannot use, say) to stderr. By
default it prints them on stdout, where `decode` and `snapshot` print their rows."""

_NAMES_AN_ARCHIVE = re.compile(r"-XX:(SharedArchiveFile|ArchiveClassesAtExit)=|-Xshare:off")
"""An option that chooses an archive, or none: the caller's choice, left alone."""


def archive_path() -> Path | None:
    """Where the archive is: `CHANGELAKE_CLASS_ARCHIVE` if set (None if set empty), else in
    the environment changelake is installed in (a venv's `share/changelake/`)."""
    named = os.environ.get(ARCHIVE_ENV)
    if named is not None:
        return Path(named) if named else None
    return Path(sys.prefix) / "share" / "changelake" / "spark-classes.jsa"


def archive_options(named: str) -> list[str]:
    """The driver JVM's options that map the archive: none where there is no archive, or
    where `named` (the caller's options and the JVM's option variables) chooses one itself,
    or turns sharing off. The JVM's warnings go to stderr unless `named` sets up its log
    (`-Xlog`): `-Xlog:disable` would turn off what `JAVA_TOOL_OPTIONS` set up, which the JVM
    reads first."""
    path = archive_path()
    if path is None or not path.is_file() or _NAMES_AN_ARCHIVE.search(named):
        return []
    quiet = [] if "-Xlog" in named else list(QUIET_JVM_WARNINGS)
    return [quoted_option("-XX:SharedArchiveFile=", str(path)), *quiet]


def quoted_option(prefix: str, value: str) -> str:
    """`prefix` + `value` as one word of `spark.driver.extraJavaOptions`, which the launcher
    splits at white space outside quotes: quoted, so that a path with a space (or a quote)
    stays one option."""
    if "'" not in value:
        return f"{prefix}'{value}'"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{prefix}"{escaped}"'


def stamp(java: str) -> str:
    """What an archive was made for: the JVM build (of the `java` executable) and Spark's
    jars (by pyspark's version and place), as `make` writes it beside the archive
    (`_stamp_path`). The JVM checks more itself; this is only the setup's way to tell,
    without starting Spark, that an archive from an earlier setup still fits
    (`is_current`)."""
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    return json.dumps({"java": str(Path(java).resolve()), "java_version": version.strip(),
                       "pyspark": pyspark.__version__,
                       "spark_home": str(Path(_find_spark_home()).resolve())}, sort_keys=True)


def _stamp_path(archive: Path) -> Path:
    return archive.with_name(archive.name + ".stamp")


def is_current(archive: Path, java: str) -> bool:
    """Whether `archive` was made (by `make`) for this JVM and these Spark jars."""
    written = _stamp_path(archive)
    return archive.is_file() and written.is_file() and written.read_text() == stamp(java)


@dataclass(frozen=True, slots=True)
class Made:
    """An archive `make` wrote."""

    path: Path
    size: int  # bytes
    seconds: float


def make(target: Path, train: Callable[[Mapping[str, str]], object], java: str) -> Made:
    """Make the archive at `target` from a training run: `train` starts a session with the
    settings given (its JVM then archives what it loads) and runs a workload on it; `java`
    is the JVM it starts (for the stamp). Then the JVM is made to exit, which writes the
    archive, and the archive replaces `target` only once whole: a JVM starting meanwhile
    maps the old one, or none. A training run that fails leaves no archive behind: its JVM
    is ended here too, and what it wrote removed.

    The process must not have started a JVM yet: a session's JVM is started once, with the
    options of the first session."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None or SparkContext._gateway is not None:
        raise ChangelakeError("making the class archive needs a process with no Spark JVM")
    started = time.perf_counter()
    target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    options = " ".join([quoted_option("-XX:ArchiveClassesAtExit=", str(partial)),
                        *QUIET_JVM_WARNINGS])
    try:
        try:
            train({"spark.driver.extraJavaOptions": options})
        finally:
            _exit_jvm()
        if not partial.is_file():
            raise ChangelakeError(
                f"the training run's JVM wrote no class archive ({partial}); see its log")
        _stamp_path(target).unlink(missing_ok=True)  # no stamp for another's archive
        os.replace(partial, target)
        _stamp_path(target).write_text(stamp(java))
    finally:
        partial.unlink(missing_ok=True)
    return Made(target, target.stat().st_size, time.perf_counter() - started)


def _exit_jvm(timeout: float = 600) -> None:
    """Stop this process's Spark context, if any, and end the JVM it started, waiting until
    it has exited (and so written its archive). PySpark's JVM exits when its standard input
    closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        process.stdin.close()
        process.wait(timeout=timeout)
    SparkContext._gateway = None
    SparkContext._jvm = None
