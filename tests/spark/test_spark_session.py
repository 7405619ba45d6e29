"""The session the project builds: its JVM's options, as the JVM took them."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelake.spark.class_archive import ARCHIVE_ENV
from changelake.spark.session import LOCAL_GARBAGE_COLLECTOR, driver_java_options


def test_the_local_test_session_runs_the_parallel_collector_and_keeps_the_derby_home(spark):
    """The collector and the embedded metastore's Derby home, both in one option string,
    reach the JVM (the Derby home was the whole option before the collector joined it)."""
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
    home = jvm.java.lang.System.getProperty("derby.system.home")
    assert home is not None and Path(home).name == "metastore"


def test_the_local_test_session_writes_no_row_checksums(spark):
    """Spark 4.3 sums a checksum of every row a shuffle writes where either setting is on
    (`settings.LOCAL_CONF`): a local session has both off, as Spark's SQL conf reads them."""
    conf = spark.sparkContext._jvm.org.apache.spark.sql.internal.SQLConf.get()
    assert not conf.shuffleOrderIndependentChecksumEnabled()
    assert not conf.shuffleChecksumMismatchFullRetryEnabled()


def test_generated_code_compiled_once_stays_compiled_past_sparks_default_cache(spark):
    """A query's generated classes are compiled once and found again after many other
    queries: the session's code cache holds more than Spark's default 100 classes
    (`spark.sql.codegen.cache.maxEntries`), which a follow's rounds outgrew, compiling most
    of their classes again every round. Here 150 queries of distinct code (each literal is
    written into the code), then the first again: Spark counts no new compilation."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    compiled = metrics.METRIC_COMPILATION_TIME()  # a histogram: one update per compilation

    def query(i: int) -> None:
        spark.range(3).selectExpr(f"id * {1000 + i} + {2000 + i} AS v").collect()

    query(0)
    before = compiled.getCount()
    for i in range(1, 151):
        query(i)
    assert compiled.getCount() - before >= 150  # each query compiled code of its own
    after = compiled.getCount()
    query(0)
    assert compiled.getCount() == after


def test_the_collector_is_a_local_sessions_own_and_yields_to_the_callers(monkeypatch):
    for variable in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(ARCHIVE_ENV, "")  # no class archive: test_class_archive has it
    assert driver_java_options("local[2]", "", "") == LOCAL_GARBAGE_COLLECTOR
    assert driver_java_options("spark://host:7077", "", "") == ""
    derby = "-Dderby.system.home='/lake/metastore'"
    assert driver_java_options("local[*]", derby, "-Xss4m") \
        == f"{LOCAL_GARBAGE_COLLECTOR} {derby} -Xss4m"
    # A collector the caller names is the only one: the JVM refuses two.
    assert driver_java_options("local[2]", derby, "-XX:+UseG1GC") == f"{derby} -XX:+UseG1GC"
    assert driver_java_options("local[2]", "", "-XX:-UseParallelGC") == "-XX:-UseParallelGC"


@pytest.mark.parametrize("variable", ["JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"])
def test_a_collector_named_in_the_jvms_environment_is_left_alone(monkeypatch, variable):
    monkeypatch.setenv(ARCHIVE_ENV, "")
    monkeypatch.setenv(variable, "-XX:+UseSerialGC")
    assert driver_java_options("local[2]", "", "") == ""


def test_stored_rows_come_back_whole_and_their_plan_never_runs_again(spark, tmp_path):
    """`stored`, by the project's `StoredRows.java`: every row and value back as it went in,
    rows of all sizes across the chunks (one bigger than a chunk, which starts one of its own),
    empty partitions, nulls, nested values and wide decimals; the observations of the stored
    plan made by its one job; and the plan never run again (its input files are gone when the
    rows are read the second time)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from changelake.spark.checkpoint import stored

    source = tmp_path / "rows"
    rows = 60_000
    spark.range(rows).selectExpr(
        "id",
        "CASE WHEN id % 7 = 0 THEN NULL ELSE concat('n', id) END AS name",
        # A row bigger than a chunk (1 MiB), and rows that fill chunks unevenly.
        "CASE WHEN id = 123 THEN repeat('x', 1500000) ELSE repeat('y', CAST(id % 300 AS INT)) "
        "END AS text",
        "named_struct('a', id * 2, 'b', CASE WHEN id % 3 = 0 THEN NULL ELSE array(id, -id) END)"
        " AS nested",
        "CAST(id AS DECIMAL(20,0)) * CAST(1000000000000 AS DECIMAL(20,0)) AS wide",
    ).repartition(7).write.parquet(str(source))
    frame = spark.read.parquet(str(source)).where("id % 5 != 1")
    # Partitions that hold no row: the second frame's, whose every row is filtered out.
    frame = frame.union(spark.read.parquet(str(source)).where("false"))
    observed = Observation()
    kept = stored(frame.observe(observed, F.count("*").alias("n"), F.max("id").alias("top")))
    expected = sorted(frame.collect())
    assert observed.get == {"n": len(expected), "top": rows - 1}
    for path in source.glob("*.parquet"):
        path.unlink()
    assert sorted(kept.collect()) == expected
    assert kept.schema == frame.schema
    assert kept.where("id = 123").select(F.length("text")).first()[0] == 1500000


def test_a_kept_shuffle_is_read_from_its_files_and_needs_no_shuffle_by_its_columns(
        spark, tmp_path):
    """`kept_shuffle`, by the project's `KeptShuffle.java`: its one job makes the plan's
    observations; the rows come back whole, each key in one of the partitions asked for,
    from the shuffle's files (the input is gone when they are read); a later `repartition`
    by the same columns into as many partitions and an aggregate by them plan no shuffle; a
    plan that does not end in a shuffle is refused, and a failing map side fails the call as
    an action would."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from changelake.spark.checkpoint import kept_shuffle
    from changelake.spark.settings import NOT_ADAPTIVE, settings

    refused = (Py4JJavaError, PySparkException)  # what the changefeed steps' `steps.guard` takes

    source = tmp_path / "rows"
    spark.range(20_000).selectExpr("id % 997 AS k", "id", "repeat('v', CAST(id % 50 AS INT)) AS t"
                                   ).repartition(5).write.parquet(str(source))
    frame = spark.read.parquet(str(source))
    expected = sorted(frame.collect())
    observed = Observation()
    kept = kept_shuffle(frame.observe(observed, F.count("*").alias("n")).repartition(6, "k"))
    assert observed.get == {"n": len(expected)}
    for path in source.glob("*.parquet"):
        path.unlink()
    assert sorted(kept.collect()) == expected
    assert kept.rdd.getNumPartitions() == 6
    placed = kept.select("k", F.spark_partition_id().alias("p")).distinct()
    assert placed.count() == placed.select("k").distinct().count() == 997
    with settings(spark, NOT_ADAPTIVE):
        later = kept.where("id > 3").select("k", "id").repartition(6, "k") \
            .groupBy("k").agg(F.sum("id").alias("s"))
        plan = later._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan, plan
    assert later.count() == 997

    with pytest.raises(refused, match="does not end in one shuffle"):
        kept_shuffle(spark.range(10).union(spark.range(10)))
    failing = spark.range(100).selectExpr(
        "id", "CASE WHEN id = 42 THEN raise_error('boom at 42') END AS x").repartition(3, "id")
    with pytest.raises(refused, match="boom at 42"):
        kept_shuffle(failing)


def test_a_session_built_here_logs_no_warning_for_a_glob_it_reads(spark):
    """`session.GLOB_METADATA_CHECK`: Spark's check for a streaming sink's metadata takes a
    glob literally and warns, stack trace and all, at each query over a lake table whose
    segments are read as one glob; sessions built here log that check's errors only."""
    from changelake.spark.session import GLOB_METADATA_CHECK

    logger = spark._jvm.org.apache.logging.log4j.LogManager.getLogger(GLOB_METADATA_CHECK)
    assert logger.getLevel().toString() == "ERROR"


def test_a_lake_opened_on_a_session_built_elsewhere_quiets_the_check(spark, tmp_path):
    from changelake.lake import Lake
    from changelake.spark.session import GLOB_METADATA_CHECK

    log4j = spark._jvm.org.apache.logging.log4j
    logger = log4j.LogManager.getLogger(GLOB_METADATA_CHECK)
    log4j.core.config.Configurator.setLevel(GLOB_METADATA_CHECK, log4j.Level.WARN)
    assert logger.getLevel().toString() == "WARN"  # as in a session Spark's defaults built
    Lake(spark, tmp_path / "lake")
    assert logger.getLevel().toString() == "ERROR"
