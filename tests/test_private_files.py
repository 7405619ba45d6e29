"""changelake's files under the machine's shared temporary folder are this user's alone: the
built jar's fallback folder (a jar planted there would be loaded into every session) and
the JVM's log (Spark's messages, which quote input). Folders mode 0700, owned by the user,
refused otherwise; files mode 0600, never through a link; logs removed."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from changelake.private import (
    KEEP_LOGS_SECONDS,
    PrivateFolderError,
    open_private,
    private_folder,
    sweep_logs,
)
from tests.support.paths import SAMPLES

CLI = [str(Path(sys.executable).parent / "changelake")]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to another account")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_folder_is_0700_and_an_open_one_is_narrowed(tmp_path: Path) -> None:
    made = private_folder(tmp_path / "new")
    assert mode(made) == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    assert mode(private_folder(tmp_path / "open")) == 0o700


def test_a_link_a_file_or_a_writable_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PrivateFolderError, match=r"link: .* is a symbolic link; remove it"):
        private_folder(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(PrivateFolderError, match="is not a folder"):
        private_folder(tmp_path / "file")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o1777)
    with pytest.raises(PrivateFolderError, match=r"writable by others \(mode 1777\)"):
        private_folder(tmp_path / "shared")
    assert mode(tmp_path / "shared") == 0o1777  # refused, not changed


@as_root
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)
    with pytest.raises(PrivateFolderError, match="owned by uid 65534, not by you"):
        private_folder(planted)


def test_a_file_is_0600_and_never_opened_through_a_link(tmp_path: Path) -> None:
    fd = open_private(tmp_path / "log")
    os.close(fd)
    assert mode(tmp_path / "log") == 0o600
    (tmp_path / "victim").write_text("mine")
    (tmp_path / "trap").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        open_private(tmp_path / "trap")
    assert (tmp_path / "victim").read_text() == "mine"


def test_old_logs_of_gone_processes_are_swept(tmp_path: Path) -> None:
    gone = _a_gone_pid()
    old = time.time() - KEEP_LOGS_SECONDS - 60
    names = {"old_gone": f"spark-{gone}.log", "old_alive": f"spark-{os.getpid()}.log",
             "new_gone": f"spark-{gone + 1}.log", "other": "notes.txt"}
    for key, name in names.items():
        (tmp_path / name).write_text("x")
        if key.startswith("old") or key == "other":
            os.utime(tmp_path / name, (old, old))
    removed = sweep_logs(tmp_path)
    assert removed == [tmp_path / names["old_gone"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for k, n in names.items() if k != "old_gone")


def _a_gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# -- the jar's folder ---------------------------------------------------------------------


@as_root
def test_the_jar_is_never_taken_from_a_planted_folder(tmp_path: Path, monkeypatch) -> None:
    """An environment this user cannot keep to themselves (here: its folder is another
    account's) sends the jar to the temporary folder, where a folder of another account's,
    with a jar in it, is refused, not loaded."""
    from changelake.spark import jvm

    prefix = tmp_path / "env"
    (prefix / "share" / "changelake").mkdir(parents=True)
    os.chown(prefix / "share" / "changelake", 65534, 65534)
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setattr(jvm, "PACKAGED", tmp_path / "missing.jar")  # a jar must be built
    planted = shared / f"changelake-jvm-{os.geteuid()}"
    planted.mkdir(mode=0o755)
    (planted / f"changelake-spark-rules-{jvm._digest()}.jar").write_bytes(b"PK")
    os.chown(planted, 65534, 65534)
    with pytest.raises(PrivateFolderError,
                       match=rf"{re.escape(str(planted))}: .* owned by uid 65534"):
        jvm.jar()
    os.chown(planted, 0, 0)  # the same folder, ours but open to others: narrowed, then used
    assert jvm._folder() == planted and mode(planted) == 0o700


# -- the JVM's log ------------------------------------------------------------------------


def test_the_jvm_log_is_private_and_a_planted_link_refused(tmp_path: Path) -> None:
    """A failed Spark start keeps its log (the error line names it) in a 0700 folder, mode
    0600; a link planted in the folder's place is refused in one line, nothing written."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"data": {"a": 1}, "time": 0, "diff": 1}\n')
    shared = tmp_path / "tmp"
    shared.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_JVM_LOG"}
    env["TMPDIR"] = str(shared)
    args = [*CLI, "ingest", "--lake", str(tmp_path / "lake"), "--table", "t", "--master",
            "local[1]", "--conf", "spark.driver.memory=lots", str(source)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    folder = shared / f"changelake-{os.geteuid()}"
    (log,) = folder.iterdir()
    assert f"the JVM's log: {log})" in done.stderr
    assert mode(folder) == 0o700 and mode(log) == 0o600

    log.unlink()
    folder.rmdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    folder.symlink_to(victim)
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"changelake: error: {folder}: changelake keeps private files in this folder, but it "
        "is a symbolic link; remove it (or set TMPDIR to a folder of your own)"]
    assert not any(victim.iterdir())
    assert not (tmp_path / "lake").exists()


def test_a_command_that_succeeds_removes_its_jvm_log(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    encoded = subprocess.run([*CLI, "encode", "--from", "debezium", "--key", "order_id",
                              "--close", str(SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
                                             )], capture_output=True, timeout=300)
    assert encoded.returncode == 0, encoded.stderr
    source.write_bytes(encoded.stdout)
    shared = tmp_path / "tmp"
    shared.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_JVM_LOG"}
    env["TMPDIR"] = str(shared)
    done = subprocess.run([*CLI, "ingest", "--lake", str(tmp_path / "lake"), "--table", "t",
                           "--key", "order_id", "--master", "local[1]", str(source)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    folder = shared / f"changelake-{os.geteuid()}"
    assert mode(folder) == 0o700 and list(folder.iterdir()) == []
