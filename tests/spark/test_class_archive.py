"""The JVM's class archive (`spark.class_archive`): the options that map it, the archive the
setup makes as a command's JVM maps it, and the JVM's warnings kept off stdout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.protocol import Writer
from changelake.spark.class_archive import (
    ARCHIVE_ENV,
    QUIET_JVM_WARNINGS,
    archive_options,
    archive_path,
    make,
)
from changelake.spark.session import LOCAL_GARBAGE_COLLECTOR, check_java, driver_java_options
from changelake.values import Record

CLI = [str(Path(sys.executable).parent / "changelake")]
_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


def test_an_archive_is_mapped_where_there_is_one_and_the_caller_chose_none(tmp_path,
                                                                           monkeypatch):
    for variable in _VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    archive = tmp_path / "a b" / "classes.jsa"  # a space: the option stays one word
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    assert archive_path() == archive
    assert archive_options("") == []  # none made
    archive.parent.mkdir()
    archive.write_bytes(b"an archive")
    mapped = [f"-XX:SharedArchiveFile='{archive}'", *QUIET_JVM_WARNINGS]
    assert archive_options("") == mapped
    assert archive_options("-Xshare:on -Xss4m") == mapped  # sharing demanded: ours is used
    # The caller's own JVM log is left as they set it up.
    assert archive_options("-Xlog:gc:file=gc.log") == mapped[:1]
    for chosen in ("-XX:SharedArchiveFile=/other.jsa", "-XX:ArchiveClassesAtExit=/new.jsa",
                   "-Xshare:off"):
        assert archive_options(f"-Xss4m {chosen}") == [], chosen
    derby = "-Dderby.system.home='/lake/metastore'"
    assert driver_java_options("local[2]", derby, "-Xss4m") \
        == " ".join([LOCAL_GARBAGE_COLLECTOR, *mapped, derby, "-Xss4m"])
    assert driver_java_options("spark://host:7077", "", "") == " ".join(mapped)
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xshare:off")  # the JVM reads it too
    assert driver_java_options("spark://host:7077", "", "") == ""
    monkeypatch.delenv("JDK_JAVA_OPTIONS")
    monkeypatch.setenv(ARCHIVE_ENV, "")  # none at all
    assert archive_path() is None and archive_options("") == []


def test_making_an_archive_needs_a_process_without_a_jvm(spark, tmp_path):
    """This process's session already has its JVM, started without archiving: no archive
    could come of it, and nothing is written."""
    from changelake.errors import ChangelakeError

    with pytest.raises(ChangelakeError, match="no Spark JVM"):
        make(tmp_path / "classes.jsa", lambda conf: spark, check_java())
    assert list(tmp_path.iterdir()) == []


def _log(tmp_path: Path) -> Path:
    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": "name", "type": ["null", "string"]}])
    writer = Writer(batch_size=2)
    for i in range(5):
        writer.push(Record((("id", i), ("name", f"n{i}"))), i // 2, 1)
    path = tmp_path / "log.jsonl"
    with path.open("wb") as out:
        write_json_lines(out, [*writer.finish_through(2), *writer.close()], schema)
    return path


def test_the_setups_archive_is_mapped_by_a_commands_jvm(tmp_path):
    """With `-Xshare:on` a JVM that cannot map its archive does not start. So a Spark
    `decode` that prints what the local one prints shows that the archive the setup made
    (`changelake jvm-archive`) matches the JVM and Spark's class path, and is mapped."""
    archive = archive_path()
    assert archive is not None and archive.is_file(), \
        f"no class archive at {archive}: scripts/install.sh makes it (changelake jvm-archive)"
    log = _log(tmp_path)
    local = subprocess.run([*CLI, "decode", str(log)], capture_output=True, timeout=120)
    assert local.returncode == 0, local.stderr
    assert orjson.loads(local.stdout.splitlines()[-1]) == {"frontier": []}
    mapped = subprocess.run(
        [*CLI, "decode", "--engine", "spark", "--master", "local[1]",
         "--conf", "spark.driver.extraJavaOptions=-Xshare:on", str(log)],
        capture_output=True, timeout=300)
    assert mapped.returncode == 0, mapped.stderr
    # The same history and final frontier (the local engine also prints the frontier's
    # moves as the messages come: here [3], then []).
    assert mapped.stdout.splitlines() == [
        line for line in local.stdout.splitlines() if line != b'{"frontier":[3]}']
    assert len(mapped.stdout.splitlines()) == 6


def test_the_jvms_warning_about_an_archive_it_cannot_use_goes_to_stderr():
    """The archive was made over Spark's class path; a JVM on another one cannot use it and
    warns, by default on stdout (where `decode` prints its rows). With the options that map
    an archive, on stderr."""
    archive = archive_path()
    assert archive is not None and archive.is_file(), f"no class archive at {archive}"
    java = check_java()
    base = [java, f"-XX:SharedArchiveFile={archive}", "-cp", ".", "-version"]
    default = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert "Unable to use shared archive" in default.stdout, default  # the test can fail
    quiet = subprocess.run([base[0], *QUIET_JVM_WARNINGS, *base[1:]], capture_output=True,
                           text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stdout == "", quiet
    assert "Unable to use shared archive" in quiet.stderr


_FAILING_TRAINING = """
import sys
from pathlib import Path
from changelake.errors import ChangelakeError
from changelake.spark.class_archive import make
from changelake.spark.session import build_session, check_java

target = Path(sys.argv[1])
target.write_bytes(b"the archive before")

def train(conf):
    spark = build_session("local[1]", conf=dict(conf))
    assert spark.range(5).count() == 5  # classes loaded: the JVM has something to write
    raise ChangelakeError("the training failed")

try:
    make(target, train, check_java())
except ChangelakeError as error:
    print(error)
"""


def test_a_failing_training_run_leaves_the_archive_there_was_and_nothing_else(tmp_path):
    """Its JVM is ended (it would otherwise write its archive when the process exits, after
    the partial file was removed), what it wrote is removed, and the archive before stays."""
    target = tmp_path / "classes.jsa"
    done = subprocess.run([sys.executable, "-c", _FAILING_TRAINING, str(target)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "the training failed", done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classes.jsa"]
    assert target.read_bytes() == b"the archive before"
