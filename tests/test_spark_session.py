"""The session the project builds: its JVM's options, as the JVM took them."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    (`session.LOCAL_CONF`): a local session has both off, as Spark's SQL conf reads them."""
    conf = spark.sparkContext._jvm.org.apache.spark.sql.internal.SQLConf.get()
    assert not conf.shuffleOrderIndependentChecksumEnabled()
    assert not conf.shuffleChecksumMismatchFullRetryEnabled()


def test_the_collector_is_a_local_sessions_own_and_yields_to_the_callers(monkeypatch):
    for variable in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(variable, raising=False)
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
    monkeypatch.setenv(variable, "-XX:+UseSerialGC")
    assert driver_java_options("local[2]", "", "") == ""
