"""`capture.debezium.runner`: the DSN's password goes to Debezium in a file only this user can
read, never on the command line nor in an error; Java reads that file as it was written."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from changelake.capture.debezium import DebeziumConfig, DebeziumError, DebeziumRunner
from changelake.capture.debezium.runner import properties_text, runner_dir

PASSWORD = "s3cret pw=:#!\\é"

needs_runner = pytest.mark.skipif(not (runner_dir() / "debezium-runner.jar").is_file(),
                                  reason="the Debezium runner is not built "
                                         "(scripts/build-debezium-runner.sh)")


def test_java_reads_the_properties_file_as_written(tmp_path: Path) -> None:
    props = {"database.password": " " + PASSWORD + "\u20ac\U0001d11e", "a key": "x=y:z #!",
             "table.include.list": "public\\.t"}
    (tmp_path / "p.properties").write_text(properties_text(props), encoding="ascii")
    (tmp_path / "Read.java").write_text(
        "import java.util.*; import java.io.*;\n"
        "public class Read { public static void main(String[] a) throws Exception {\n"
        "  Properties p = new Properties(); p.load(new FileInputStream(a[0]));\n"
        "  PrintStream out = new PrintStream(System.out, true, \"UTF-8\");\n"
        "  for (String k : new TreeSet<>(p.stringPropertyNames()))\n"
        "    out.println(k + \"\\t\" + p.getProperty(k)); } }\n")
    done = subprocess.run(["java", str(tmp_path / "Read.java"), str(tmp_path / "p.properties")],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    read = dict(line.split("\t", 1) for line in done.stdout.decode().splitlines())
    assert read == props


def test_the_command_line_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setattr("changelake.capture.debezium.runner.runner_classpath", lambda: "x/*")
    quoted = PASSWORD.replace("\\", "\\\\")  # libpq's escape in a quoted value
    config = DebeziumConfig(dsn=f"host=127.0.0.1 port=5 user=u password='{quoted}'",
                            bootstrap="127.0.0.1:9", state=tmp_path)
    assert not any("s3cret" in part for part in config.command())
    assert config.debezium_properties()["database.password"] == PASSWORD
    monkeypatch.setenv("PGPASSWORD", "from-env")
    without = DebeziumConfig(dsn="host=127.0.0.1 user=u", bootstrap="b", state=tmp_path)
    assert without.debezium_properties()["database.password"] == "from-env"


def test_truncates_are_written_unless_debeziums_default_is_asked_for(tmp_path: Path) -> None:
    on = DebeziumConfig(dsn="host=127.0.0.1 user=u", bootstrap="b", state=tmp_path)
    assert on.debezium_properties()["skipped.operations"] == "none"
    off = DebeziumConfig(dsn="host=127.0.0.1 user=u", bootstrap="b", state=tmp_path,
                         truncates=False)
    assert "skipped.operations" not in off.debezium_properties()  # Debezium's `t`
    given = DebeziumConfig(dsn="host=127.0.0.1 user=u", bootstrap="b", state=tmp_path,
                           properties={"skipped.operations": "t,d"})
    assert given.debezium_properties()["skipped.operations"] == "t,d"


@needs_runner
def test_a_runner_that_cannot_connect_says_so_without_the_password(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = DebeziumConfig(dsn=f"postgresql://u:{PASSWORD.replace(' ', '%20')}@127.0.0.1:"
                                f"{port}/db".replace("#", "%23").replace("\\", "%5C"),
                            bootstrap="127.0.0.1:9", state=tmp_path / "state")
    runner = DebeziumRunner(config)
    with pytest.raises(DebeziumError) as caught:
        runner.start(timeout=120)
    runner.kill()
    assert "s3cret" not in str(caught.value)
    props = tmp_path / "state" / "debezium.properties"
    assert stat.S_IMODE(os.stat(props).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700


@needs_runner
@pytest.mark.timeout(600)
def test_a_stop_once_kafka_holds_the_snapshot_stores_its_offsets(
        pg_dsn: str, broker: Any, tmp_path: Path) -> None:
    """`stop()` the moment Kafka holds the initial snapshot (its records sent, maybe not yet
    marked): the stop waits for the batch in flight, so its offsets are stored, and the next
    start streams on instead of taking the snapshot again: each row's snapshot read is in the
    topic once, then the change made while the runner was stopped."""
    from tests.support.debezium_real import execute, topic_records, wait_for_records

    prefix = f"stop{time.time_ns() % 10**9}"
    topic = f"{prefix}.public.items"
    execute(pg_dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)",
            "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 3) g")
    config = DebeziumConfig(dsn=pg_dsn, bootstrap=broker.bootstrap, state=tmp_path / "state",
                            topic_prefix=prefix, tables=("public.items",), slot=prefix,
                            publication=prefix, partitions=1)
    runner = DebeziumRunner(config)
    try:
        runner.start()
        wait_for_records(broker.bootstrap, topic, 3)
        assert runner.stop() == 0
        assert (tmp_path / "state" / "offsets.dat").stat().st_size > 0
        execute(pg_dsn, "UPDATE items SET v = 'changed' WHERE id = 2")
        runner.start()
        wait_for_records(broker.bootstrap, topic, 4)
        assert runner.stop() == 0
    finally:
        runner.kill()
    events = [(r["value"]["payload"]["op"], r["value"]["payload"]["after"]["id"])
              for r in topic_records(broker.bootstrap, topic, timeout=60)]
    assert events == [("r", 1), ("r", 2), ("r", 3), ("u", 2)], events
