"""Decode on a real Spark standalone cluster (a master and two workers, separate JVMs, started
here from PySpark's own jars on 127.0.0.1) prints what the local engine prints.

The decode runs as `changelake decode --engine spark --master spark://...` in a subprocess, so
the driver, the two executors and their Python workers are all different processes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from changelake.formats.materialize import CdcSchema
from changelake.simulate import write_log_files
from tests.support.decoded import decoded_history
from tests.support.seeding import seeded
from tests.support.spark_helpers import write

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = CdcSchema.for_fields(
    [{"name": "k", "type": "long"}, {"name": "v", "type": ["null", "string"]}]
)
VENV_BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _wait_for(predicate, what: str, bound: float = 90.0) -> None:
    """Poll for readiness, with a bound (no blind sleeps)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def standalone(root: Path, environment: dict[str, str] | None = None, *, memory: str = "1g"
               ) -> Iterator[tuple[str, list[Path]]]:
    """A master and two workers (one core, `memory` for executors each) on 127.0.0.1, their
    logs and work directories under `root`, their environment `environment` (default this
    process's): (the master's URL, the workers' work directories); stopped on exit."""
    home = _spark_home()
    # Without SPARK_SCALA_VERSION a worker looks for a source build and cannot launch
    # executors ("Cannot find any build directories"): PySpark ships no RELEASE layout.
    (library,) = (home / "jars").glob("scala-library-*.jar")
    scala = ".".join(library.stem.split("-")[-1].split(".")[:2])
    env = dict(os.environ if environment is None else environment, SPARK_HOME=str(home),
               SPARK_LOCAL_IP="127.0.0.1", SPARK_SCALA_VERSION=scala,
               PYSPARK_PYTHON=sys.executable)
    java = shutil.which("java") or "/usr/bin/java"
    classpath = f"{home / 'jars'}/*"
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> Path:
        log = root / f"{name}.log"
        with log.open("wb") as out:
            processes.append(subprocess.Popen(
                [java, "-Xmx512m", "-cp", classpath, *args],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            ))
        return log

    work_dirs = [root / "worker-1", root / "worker-2"]
    try:
        master_log = start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(_free_port()),
        )
        _wait_for(lambda: b"I have been elected leader" in master_log.read_bytes(),
                  "the master")
        for i, work in enumerate(work_dirs, start=1):
            work.mkdir()
            start(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", "1", "--memory", memory, "--work-dir", str(work),
                "--webui-port", str(_free_port()), url,
            )
        _wait_for(lambda: master_log.read_bytes().count(b"Registering worker") >= 2,
                  "two workers")
        yield url, work_dirs
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    with standalone(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def _log(root: Path) -> Path:
    rng = seeded(42)
    changes = [
        ({"k": rng.randrange(50), "v": rng.choice([None, "a", "é", "b\"c"])},
         rng.randrange(30), rng.choice([-1, 1, 3]))
        for _ in range(600)
    ]
    messages = [*write(changes, [5, 12, 20], True, 16), *write(changes, [9, 25], True, 7)]
    rng.shuffle(messages)
    out = root / "log"
    paths = write_log_files(out, [messages[i : i + 4] for i in range(0, len(messages), 4)],
                            SCHEMA)
    shutil.copy(paths[1], out / f"again-{paths[1].name}")
    return out


def test_standalone_cluster_decode_matches_local(cluster, tmp_path: Path) -> None:
    url, work_dirs = cluster
    log = _log(tmp_path)
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(SCHEMA.avro))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    command = [str(VENV_BIN / "changelake"), "decode", "--schema", str(schema), str(log)]

    local = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert local.returncode == 0, local.stderr.decode()
    on_cluster = subprocess.run(
        [*command[:2], "--engine", "spark", "--master", url,
         "--conf", "spark.executor.memory=768m", "--conf", "spark.executor.cores=1",
         *command[2:]],
        capture_output=True, env=env, timeout=600,
    )
    assert on_cluster.returncode == 0, on_cluster.stderr.decode()[-3000:]

    assert decoded_history(on_cluster.stdout)[0] == decoded_history(local.stdout)[0]
    assert len(decoded_history(local.stdout)[0]) > 100
    assert on_cluster.stdout.splitlines()[-1] == local.stdout.splitlines()[-1] == (
        b'{"frontier":[]}'
    )
    # The work really ran in the workers' executors, not in the driver's process.
    executors = [d for w in work_dirs for d in w.glob("app-*/*") if d.is_dir()]
    assert len(executors) >= 2
