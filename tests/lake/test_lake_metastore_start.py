"""A lake's embedded metastore survives a process killed while creating it.

Derby creates its database, and Hive its `default` database, in several steps; a process killed
in between left a directory that no later JVM could open ("Unable to instantiate
SessionHiveMetaStoreClient"), so a capture killed at its very first start broke the lake for
good. `lake_session` marks a creation in progress and starts over from such a mark.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from changelake.lake.catalog import CREATING

OPEN = ("import sys; from changelake.lake.catalog import lake_session; "
        "print(lake_session(sys.argv[1]).sql('SHOW DATABASES').collect())")


def _open(lake: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", OPEN, str(lake)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # a Spark process of its own (20 s on 2 cores), as the kill -9 cases
def test_an_interrupted_creation_is_started_over(tmp_path):
    lake = tmp_path / "lake"
    half = lake / "metastore" / "metastore_db"
    half.mkdir(parents=True)
    (half / "service.properties").write_text("a Derby database killed while being created\n")
    (lake / "metastore" / CREATING).touch()

    run = _open(lake)

    assert run.returncode == 0, run.stderr[-2000:]
    assert "default" in run.stdout
    assert not (lake / "metastore" / CREATING).exists()
    assert "killed while being created" not in (half / "service.properties").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.1, 0.3])
def test_kill9_while_the_metastore_is_created(tmp_path, delay):
    lake = tmp_path / "lake"
    proc = subprocess.Popen([sys.executable, "-c", OPEN, str(lake)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 300
        while not (lake / "metastore" / "metastore_db").exists() and proc.poll() is None:
            assert time.monotonic() < end
            time.sleep(0.01)
        time.sleep(delay)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    run = _open(lake)

    assert run.returncode == 0, run.stderr[-2000:]
    assert "default" in run.stdout
