"""A second process on a lake's embedded (Derby) metastore: one `changelake: error:` line that
says what to do (`changelake metastore`, `--metastore-uri`), exit status 2, before Spark
starts; it was an internal error (Hive's "Unable to instantiate ... MetaStoreClient")."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = [str(Path(sys.executable).parent / "changelake")]
HOLD = """
import sys, time
from changelake.lake.catalog import lake_session
spark = lake_session(sys.argv[1], "local[1]")
spark.sql("SHOW DATABASES").collect()
print("READY", flush=True)
sys.stdin.read()
"""


def test_a_second_process_on_the_embedded_metastore_is_told_what_to_do(tmp_path: Path
                                                                        ) -> None:
    lake = tmp_path / "lake"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lake)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "READY"
        before = sorted(str(p) for p in lake.rglob("*") if "metastore_db" not in p.parts)
        feed = tmp_path / "feed.jsonl"
        feed.write_text("")
        started = time.monotonic()
        done = subprocess.run([*CLI, "ingest", "--lake", str(lake), "--table", "t",
                               "--master", "local[1]", str(feed)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"changelake: error: lake {lake}: its embedded metastore (Derby, under "
            f"{lake / 'metastore'}) is open in another process, and it admits one at a time; "
            f"to use the lake from several processes, run `changelake metastore --lake "
            f"{lake}` and pass --metastore-uri thrift://127.0.0.1:PORT to every command, or "
            "wait for the other one to end"]
        assert time.monotonic() - started < 60  # refused before a JVM started
        assert sorted(str(p) for p in lake.rglob("*")
                      if "metastore_db" not in p.parts) == before  # nothing made
    finally:
        holder.communicate("", timeout=120)


AGAIN = """
import sys
from changelake.lake.catalog import lake_session
for _ in range(2):
    spark = lake_session(sys.argv[1], "local[1]")
    spark.sql("SHOW DATABASES").collect()
    spark.stop()
print("AGAIN", flush=True)
"""


def test_a_process_that_stopped_its_session_opens_the_lake_again(tmp_path: Path) -> None:
    """Not a second process: PySpark keeps the stopped session's JVM for the next one, and
    Derby stays booted (its lock held) in it. That had been refused as "open in another
    process" (the kill tests' worker runs a capture, then reads the lake, so)."""
    done = subprocess.run([sys.executable, "-c", AGAIN, str(tmp_path / "lake")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["AGAIN"]


CHECK = """
import sys
from pathlib import Path
from changelake.errors import LakeError
from changelake.lake import catalog
catalog.BUSY_WAIT_SECONDS = float(sys.argv[2])
try:
    catalog._refuse_a_booted_metastore(Path(sys.argv[1]), Path(sys.argv[1]) / "metastore")
except LakeError as error:
    print(error)
    sys.exit(2)
"""

HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize(("held", "wait", "code"), [(2.0, 60.0, 0), (60.0, 1.0, 2)],
                         ids=["released-while-waiting", "held-past-the-wait"])
def test_a_hold_that_ends_meanwhile_is_waited_for(tmp_path: Path, held: float, wait: float,
                                                  code: int) -> None:
    """A command that has just ended holds the metastore until its JVM exits, a moment after
    its Python process: the next command waits for that (`BUSY_WAIT_SECONDS`) and refuses
    only a hold that outlasts the wait."""
    lock = tmp_path / "metastore" / "metastore_db" / "dbex.lck"
    lock.parent.mkdir(parents=True)
    lock.write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock), str(held)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        check = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path), str(wait)],
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == code, check.stderr
        assert ("open in another process" in check.stdout) == (code == 2)
    finally:
        holder.kill()
        holder.wait()
