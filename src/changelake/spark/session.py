"""Building a SparkSession suited to this project: the one place a session is created.

Library functions take a SparkSession (or DataFrames) as arguments; only the edges (the CLI, the
test fixture, benchmarks) call `build_session`. The defaults suit a small machine (2 cores):
few shuffle partitions, adaptive execution, Arrow for Python UDFs, Kryo for what Spark
serializes (`spark.settings`), and a local JVM's collector chosen for throughput
(`LOCAL_GARBAGE_COLLECTOR`). Every default can be overridden with `conf`. A new JVM maps
the classes Spark loads from the setup's archive (`class_archive`), where there is one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from changelake.errors import ChangelakeError
from changelake.redact import redact
from changelake.spark.class_archive import archive_options, quoted_option
from changelake.spark.settings import DEFAULT_CONF, LOCAL_CONF

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def check_java() -> str:
    """Fail early, in one line, when no Java 17+ is available for Spark."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ChangelakeError(
            "Java 17 or newer is needed for Spark, and none was found "
            "(install e.g. openjdk-17-jre-headless, or set JAVA_HOME)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    version = out.split('"')[1] if '"' in out else ""
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < 17:
        raise ChangelakeError(f"Java 17 or newer is needed for Spark; {java} is {version!r}")
    return java


def build_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "changelake",
    conf: Mapping[str, str] | None = None,
    hive_metastore_dir: Path | None = None,
    metastore_uri: str | None = None,
    warehouse_dir: Path | None = None,
    object_store: bool = False,
) -> SparkSession:
    """A SparkSession with the project's defaults.

    With `hive_metastore_dir`, Hive support uses an embedded Derby metastore in that directory
    (one JVM at a time); with `metastore_uri`, a Hive metastore service (any number of JVMs).
    With `object_store`, Hadoop's S3A connector is on the classpath (`s3a://` paths: a lake
    on object storage, `lake/files.py`).
    """
    check_java()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(DEFAULT_CONF)
    derby_home = ""
    if master.startswith("local"):
        settings.update(LOCAL_CONF)
    if warehouse_dir is not None:
        settings["spark.sql.warehouse.dir"] = str(Path(warehouse_dir).resolve())
    if metastore_uri is not None:
        settings["spark.hadoop.hive.metastore.uris"] = metastore_uri
        builder = builder.enableHiveSupport()
    elif hive_metastore_dir is not None:
        path = Path(hive_metastore_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        settings["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={path / 'metastore_db'};create=true"
        )
        derby_home = java_property("derby.system.home", str(path))
        builder = builder.enableHiveSupport()
    settings.update(conf or {})
    options = driver_java_options(master, derby_home, (conf or {}).get(JAVA_OPTIONS, ""))
    if options:
        settings[JAVA_OPTIONS] = options
    _add_project_jar(settings)
    _add_delta(settings)
    _add_kafka(settings)
    if object_store:
        _add_object_store(settings)
    for key, value in settings.items():
        builder = builder.config(key, value)
    log = os.environ.get(JVM_LOG_ENV)
    target = open_log(Path(log)) if log else None  # a folder refused: its own error line
    start = os.fstat(target).st_size if target is not None else 0
    try:
        with _launch_environment():
            spark = builder.getOrCreate() if target is None else _with_stderr_to(
                target, builder.getOrCreate)
    except Exception as error:  # a master or setting the JVM refuses: its reason, one line
        raise SparkStartError(
            f"Spark did not start (--master {master}"
            + redact("".join(f", --conf {k}={v}" for k, v in (conf or {}).items()))
            + f"): {start_failure(error, Path(log) if log else None, start)}"
            + (f" (the JVM's log: {log})" if log else "")) from None
    quiet_glob_metadata_check(spark)
    return spark


class SparkStartError(ChangelakeError):
    """The JVM or the SparkContext would not start: a master URL or a setting it refuses."""


def start_failure(error: BaseException, log: Path | None, start: int) -> str:
    """Why Spark did not start, in one line: the JVM's own words from its log (what it wrote
    from byte `start` on: a `SparkException` of the main thread, or the line before "Could
    not create the Java Virtual Machine"), else the Python side's exception."""
    lines: list[str] = []
    if log is not None:
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(start)
            lines = [x.strip() for x in f.read(1 << 20).decode("utf-8", "replace")
                     .splitlines() if x.strip()]
    for i, line in enumerate(lines):
        found = re.search(r'Exception in thread "main" [\w.$]+: (.+)', line)
        if found:
            return found[1]
        if line.startswith("Error: Could not create the Java Virtual Machine") and i:
            return lines[i - 1]
    java = getattr(error, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            return str(java.getMessage()).splitlines()[0]
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


GLOB_METADATA_CHECK = "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink"
"""The logger of Spark's check, when it reads a path, for a streaming sink's `_spark_metadata`
beneath it. The check takes the path literally, so a glob (a lake table's segments are read as
one: `lake/sql.py`, `group_sources`) is a file that does not exist, and it logs a warning with
the exception's stack trace each time a query over the table is resolved, then reads the path
as it would have. Sessions built here, and any session a `Lake` is opened on, log that
logger's errors only; another session can do the same with `quiet_glob_metadata_check`."""


def quiet_glob_metadata_check(spark: SparkSession) -> None:
    """Set `GLOB_METADATA_CHECK`'s level to ERROR in the session's JVM (log4j 2)."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(GLOB_METADATA_CHECK, log4j.Level.ERROR)


SPARK_ERROR_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")
"""PySpark's loggers that write every exception PySpark raises, with its query context and
Java stack trace, as JSON to stderr when it is raised: also the ones changelake catches and
handles (a batch handed to the Python path), and before the one line the CLI prints."""


def quiet_spark(spark: SparkSession) -> None:
    """A command says what went wrong in one line: Spark's log below ERROR, and PySpark's
    exception log (`SPARK_ERROR_LOGGERS`), are off unless CHANGELAKE_DEBUG."""
    import logging

    spark.sparkContext.setLogLevel("ERROR")
    if not os.environ.get("CHANGELAKE_DEBUG"):
        from pyspark.logger import PySparkLogger

        for name in SPARK_ERROR_LOGGERS:
            PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


JAVA_OPTIONS = "spark.driver.extraJavaOptions"

LOCAL_GARBAGE_COLLECTOR = "-XX:+UseParallelGC"
"""The collector of a local session's JVM, which runs the tasks as well as the driver. The
JVM's own choice on these machines is G1, which spends its cycles keeping pauses short, for
a server that answers requests; a batch job wants the most work done between pauses, which
is the parallel collector's aim. Measured with `bench_ingest.py`, a Debezium ingest was
faster with it, at 1.1M and 11M events, and so was Spark's plain Parquet write of the same
lines (benchmarks/README.md, "The floor of a keyed conversion")."""

_NAMES_A_COLLECTOR = re.compile(r"-XX:[+-]Use\w*GC\b")
_JVM_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
"""Where else a JVM takes options from: a collector named there is the user's choice too."""


def driver_java_options(master: str, derby_home: str, given: str) -> str:
    """`spark.driver.extraJavaOptions` for a session: the project's (a local session's
    collector, the class archive if there is one, an embedded metastore's Derby home), then
    the caller's `given` ones, which win where they set the same thing. The collector is left
    out when `given`, or one of the variables the JVM reads options from, names one: the JVM
    refuses to start with two; so is the archive when they name one (`class_archive`)."""
    options = []
    named = " ".join([given, *(os.environ.get(v, "") for v in _JVM_OPTION_VARIABLES)])
    if master.startswith("local") and not _NAMES_A_COLLECTOR.search(named):
        options.append(LOCAL_GARBAGE_COLLECTOR)
    options += archive_options(named)
    return " ".join(o for o in (*options, derby_home, given) if o)


def _add_project_jar(settings: dict[str, str]) -> None:
    """The project's jar (`spark.jvm`) on `spark.jars`, after any the caller named: the
    changefeed path's Java, which a session needs (`jar()` raises where it is stale and cannot
    be built)."""
    from changelake.spark.jvm import jar

    jars = [j for j in settings.get("spark.jars", "").split(",") if j]
    settings["spark.jars"] = ",".join([*jars, str(jar())])


def _add_delta(settings: dict[str, str]) -> None:
    """Delta Lake's jars (`spark.maven`) on `spark.jars` and its SQL extension and catalog,
    where the setup fetched them; a caller's own extensions or catalog are kept. Without
    them a session reads and writes the Hive-format tables only."""
    from changelake.spark.maven import DELTA_CONF, jars

    found = jars()
    if found is None:
        return
    named = [j for j in settings.get("spark.jars", "").split(",") if j]
    settings["spark.jars"] = ",".join([*named, *(str(j) for j in found)])
    for key, value in DELTA_CONF.items():
        settings.setdefault(key, value)


def _add_kafka(settings: dict[str, str]) -> None:
    """Spark's Kafka connector and spark-avro (`spark.maven.kafka_jars`) on `spark.jars`,
    where the setup fetched them, and Spark's redaction of options extended to the
    connector's security settings (`KAFKA_REDACTION`). On every session: their classes load
    only when a query uses them (spark.jars joins the driver's class loader), and adding them
    costs no measurable start time (docs/platform-notes.md)."""
    from changelake.spark.maven import kafka_jars

    found = kafka_jars()
    if found is not None:
        named = [j for j in settings.get("spark.jars", "").split(",") if j]
        settings["spark.jars"] = ",".join([*named, *(str(j) for j in found)])
    settings.setdefault(OPTIONS_REDACTION, KAFKA_REDACTION)


OPTIONS_REDACTION = "spark.sql.redaction.options.regex"

KAFKA_REDACTION = r"(?i)url|jaas|password|secret|token|ssl\.key|credential"
"""Spark's `spark.sql.redaction.options.regex` (default `(?i)url`): a data source option
whose key or value matches is shown masked wherever Spark shows options (a streaming
source's description, a scan's). A batch read of the `kafka` source shows no option in its
plans (tested: the SASL password is in no plan text), so this is the guard for the rest: the
Kafka connector's `kafka.sasl.jaas.config` (its value holds `password=`), `kafka.ssl.key.*`,
and any `*password*` option; `spark.redaction.regex`'s default already masks settings and
environment values of that kind. A session's own setting wins."""


def _add_object_store(settings: dict[str, str]) -> None:
    """S3A's jars (`spark.maven.object_store_jars`) on `spark.jars`, or a ChangelakeError in
    one line where the setup did not fetch them."""
    from changelake.spark.maven import jar_dir, object_store_jars

    found = object_store_jars()
    if found is None:
        raise ChangelakeError(
            f"Hadoop's S3A jars are not in {jar_dir()}: run scripts/install.sh (or "
            "`python -m changelake.spark.maven`) with access to Maven Central")
    named = [j for j in settings.get("spark.jars", "").split(",") if j]
    settings["spark.jars"] = ",".join([*named, *(str(j) for j in found)])


def java_property(name: str, value: str) -> str:
    """`-Dname=value` as one word of `spark.driver.extraJavaOptions`, which the launcher splits
    at white space outside quotes: quoted, so that a lake under a path with a space (or a
    quote) starts its JVM."""
    return quoted_option(f"-D{name}=", value)


LAUNCH_ENVIRONMENT = {
    "SPARK_LOCAL_IP": "127.0.0.1",  # halves start-up; loopback only
    # Python workers must run this interpreter (the one with changelake and pyspark), not
    # whatever `python3` is first on the PATH. PySpark reads it when the context starts.
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
}
"""Set (unless the user set them) only while a session starts: the JVM and the context read
them then. The caller's `os.environ` is left as it was."""


@contextmanager
def _launch_environment() -> Iterator[None]:
    added = [k for k in LAUNCH_ENVIRONMENT if k not in os.environ]
    for key in added:
        os.environ[key] = LAUNCH_ENVIRONMENT[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


JVM_LOG_ENV = "CHANGELAKE_JVM_LOG"
"""If set, the JVM that a new session starts writes its stderr (start-up notices, log4j) to
this file instead of the terminal. The CLI sets it, so its stderr holds only its own lines."""


def open_log(path: Path) -> int:
    """A descriptor appending to the JVM's log `path`, mode 0600, never through a symbolic
    link. A log in the machine's temporary folder must be in a folder private to this user
    (`changelake.private`: it holds Spark's messages, which quote input), where the old logs
    of gone processes are swept; elsewhere the folder is the user's choice, made if need be."""
    from changelake.private import open_private, private_folder, sweep_logs

    folder = path.parent
    shared, above = Path(tempfile.gettempdir()).resolve(), folder.parent.resolve()
    if above == shared or shared in above.parents:
        private_folder(folder)
        sweep_logs(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    return open_private(path)


def _with_stderr_to(target: int, start: Any) -> Any:
    """Run `start` with file descriptor 2 pointing at `target` (a descriptor, closed here): a
    JVM launched meanwhile inherits it for life, while this process gets its own stderr back
    afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(target, 2)
        return start()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)
