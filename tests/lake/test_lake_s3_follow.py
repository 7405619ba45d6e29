"""`ingest --follow` of a local directory into a table of a lake on S3 (`--lake s3a://...`,
moto's server on loopback, see `test_lake_s3.py`), its checkpoint (`_follow` in the table's
directory) on S3 too: files appear between batches, one is a replay of an earlier one; the
table ends equal to a one-shot `ingest` of the same files into a local lake (every `(row,
time)` with its diff, so a doubled update would show), and a restart from the checkpoint on
S3 commits nothing. The slow tier kills the follow (SIGKILL) mid-stream and restarts it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lake.test_lake_follow import Follower, drop, kill_mid_stream, pieces, schema_file
from tests.lake.test_lake_s3 import CLI, environment, ok, run
from tests.support.paths import ROOT
from tests.support.s3_server import S3Server, s3_server
from tests.support.seeding import seeded


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def follow_env(s3: S3Server, tmp_path: Path) -> dict[str, str]:
    env = environment(s3, tmp_path)
    env["CHANGELAKE_FOLLOW_STEPS"] = "1"
    env["PYTHONPATH"] = str(ROOT / "src")
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def follow_args(lake: str, name: str, source: Path, schema: Path, *extra: str) -> list[str]:
    return [*CLI, "ingest", "--lake", lake, "--table", name, "--schema", str(schema),
            "--follow", str(source), "--trigger-seconds", "0.5", "--max-files-per-trigger",
            "1", "--conf", "spark.sql.shuffle.partitions=2", "--master", "local[1]", *extra]


CONSOLIDATED = """
import json, os, sys
sys.path.insert(0, sys.argv[3])
from tests.lake.test_lake_follow import consolidated
updates, frontier = consolidated(sys.argv[1], sys.argv[2])
print(json.dumps([sorted(([*k, v] for k, v in updates.items()), key=str), frontier]))
sys.stdout.flush()
os._exit(0)  # not the AWS SDK's teardown at exit, which has aborted ("terminate called")
"""


def consolidated(lake: str, name: str, env: dict[str, str]) -> list:
    """`test_lake_follow.consolidated` of a table (local or on S3), in a process without a
    JVM (the lake's JVM-free reads: pyarrow's S3 and delta-rs, with the environment's keys)."""
    done = subprocess.run([sys.executable, "-c", CONSOLIDATED, lake, name, str(ROOT)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def reference(tmp_path: Path, source: Path, schema: Path, env: dict[str, str]
              ) -> subprocess.Popen:
    """A one-shot `ingest` of every file of `source` into a local lake (started, not waited
    for: it runs beside the follow's restart)."""
    return subprocess.Popen([*CLI, "ingest", "--lake", str(tmp_path / "reference"),
                             "--table", "ref", "--schema", str(schema), "--master",
                             "local[1]", "--conf", "spark.sql.shuffle.partitions=2",
                             str(source)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**env, "CHANGELAKE_TABLE_FORMAT": "delta"}, cwd=ROOT)


def checked(process: subprocess.Popen) -> None:
    _out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err.decode()[-3000:]


@pytest.mark.timeout(600)
def test_follow_into_an_s3_lake_equals_one_shot_ingest(s3: S3Server, tmp_path: Path) -> None:
    """Files appear as batches commit (the last a replay of the first, under a new name);
    the follow stops once idle; its table on S3 equals a one-shot ingest of the same files
    into a local lake; a restart from the checkpoint on S3 commits nothing."""
    env = follow_env(s3, tmp_path)
    parts = pieces(seeded(31), 2)
    source, schema = tmp_path / "src", schema_file(tmp_path)
    lake, name = s3.lake("tailed"), "shop.followed"
    files = [*parts[1:], parts[0]]  # the last: a replay of file 0
    for n, piece in enumerate([parts[0], *files]):  # the reference's copy, all at once
        drop(tmp_path / "all", n, piece)
    one_shot = reference(tmp_path, tmp_path / "all", schema, env)
    drop(source, 0, parts[0])
    first = Follower(follow_args(lake, name, source, schema, "--until-idle", "2"), env)
    for n, piece in enumerate(files, start=1):
        while first.committed() < n:
            first.wait_for(len(first.steps()) + 1)
        drop(source, n, piece)
    assert first.finish() == 0, "\n".join(first.lines[-20:])
    assert first.committed() == len(files) + 1, "\n".join(first.lines[-20:])
    # the restart: Spark's checkpoint, the follow's state and the table's mark, all on S3
    second = ok(run(*follow_args(lake, name, source, schema, "--until-idle", "2")[1:],
                    env=env, cwd=ROOT))
    stderr = second.stderr.decode()
    assert ", 0 committed" in stderr and ": committed" not in stderr, stderr
    checked(one_shot)
    got = consolidated(lake, name, env)
    assert got == consolidated(str(tmp_path / "reference"), "ref", env)
    assert got[0], "nothing committed"
    keys = s3.keys("tailed/tables/shop/followed/_follow/")
    assert any("/_follow/spark/offsets/" in k for k in keys), keys
    assert any(k.endswith("/_follow/follow.json") for k in keys), keys
    states = {k.split("/_follow/state/", 1)[1].split("/")[1]
              for k in keys if "/_follow/state/" in k}
    assert states == {f"{len(files):012d}"}, keys  # only the last batch's state is kept
    assert not (tmp_path / "s3a:").exists() and not (ROOT / "s3a:").exists()


@pytest.mark.slow  # three Spark processes, one killed
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [3, 9])  # killed in a state write; after it
def test_sigkill_and_restart_on_s3_nothing_lost_nothing_doubled(s3: S3Server, tmp_path: Path,
                                                                seed: int) -> None:
    """`run_kill_restart` of `test_lake_follow.py` with the lake and the checkpoint on S3:
    SIGKILL at a seeded step of a batch, a restart until idle, and the table equals a one-shot
    ingest of every file."""
    env = follow_env(s3, tmp_path)
    rng = seeded(seed)
    parts = pieces(rng, 5)
    source, schema = tmp_path / "src", schema_file(tmp_path)
    lake, name = s3.lake(f"killed-{seed}"), "followed"
    drop(source, 0, parts[0])
    first = Follower(follow_args(lake, name, source, schema), env)
    kill_at, delay = kill_mid_stream(first, rng, source, parts)
    one_shot = reference(tmp_path, source, schema, env)
    second = Follower(follow_args(lake, name, source, schema, "--until-idle", "4"), env)
    assert second.finish() == 0, "\n".join(second.lines[-20:])
    checked(one_shot)
    assert consolidated(lake, name, env) == consolidated(
        str(tmp_path / "reference"), "ref", env), (
        f"seed {seed}: killed at step {kill_at} + {delay}s\n"
        + "\n".join(first.lines[-8:] + second.lines[-10:]))


def test_a_checkpoint_uri_is_not_taken_for_a_local_path(tmp_path: Path) -> None:
    """`--checkpoint s3a://...` stays a URI (a `Path` would fold it into `s3a:/...`); a local
    one is resolved as before."""
    from changelake.lake.files import RemotePath
    from changelake.lake.follow import checkpoint_root

    assert checkpoint_root("s3a://bucket/a/cp") == RemotePath("s3a://bucket/a/cp")
    assert checkpoint_root(str(tmp_path / "x" / ".." / "cp")) == (tmp_path / "cp").resolve()
    assert checkpoint_root(tmp_path / "cp") == (tmp_path / "cp").resolve()
    shutil.rmtree(tmp_path / "cp", ignore_errors=True)
    assert not os.path.exists("s3a:")


def test_a_state_without_its_state_json_is_passed_over(tmp_path: Path) -> None:
    """On a remote store a batch's state is written in place, `state.json` last: a state
    directory without one (a batch killed while writing it) is not whole, and the state
    before it is the latest."""
    from changelake.lake.follow_state import FollowState, latest_state, state_name
    from changelake.protocol import Antichain

    states = tmp_path / "states"
    whole = FollowState(3, Antichain([5]), (), True)
    (states / state_name(3) / "pending").mkdir(parents=True)
    (states / state_name(3) / "state.json").write_text(json.dumps(whole.to_json()))
    (states / state_name(4) / "pending").mkdir(parents=True)  # killed before its state.json
    found = latest_state(states)
    assert found is not None
    assert found[0].to_json() == whole.to_json() and found[1] == states / state_name(3)
    assert latest_state(states, before=3) is None
