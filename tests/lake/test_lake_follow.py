"""`ingest --follow`: a directory of Materialize CDC files followed into a lake table, each
micro-batch committed exactly once (see `changelake/lake/follow.py`).

Files appear while the query runs (written under a hidden name, then renamed), in mangled,
duplicated and reordered pieces of a generated history. The differential check: the followed
table holds the same consolidated updates (every `(row, time)` with its diff, so a doubled
update would show) and the same frontier as a one-shot `ingest` of all the files at once.
Processes are killed with SIGKILL at seeded points of a batch and restarted; SIGTERM lets the
batch in flight commit, and exits 0; `status` shows the files not yet committed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from changelake.errors import ChangelakeError, LakeError
from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.lake import Lake, arrow, ingest
from changelake.lake.files import remove_tree
from changelake.lake.follow import (
    CommitBatches,
    FollowControl,
    check_checkpoint,
    directory_source,
    follow,
)
from changelake.lake.identifier import TableIdentifier
from changelake.protocol import Progress
from changelake.values import freeze
from tests.support.lake_history import messages, unkeyed_history
from tests.support.paths import ROOT
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark

FIELDS = ("id", "name", "amount")
CDC = CdcSchema.for_fields([
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "amount", "type": "long"},
])
TIMES = 12


def pieces(rng: random.Random, count: int) -> list[list]:
    """An unkeyed history (multiplicities above one, so a doubled update shows) as CDC
    messages, mangled, cut into `count` pieces, each cut (as far as there are statements) just
    before a progress statement: the updates it counts are in an earlier file, so they wait in
    the pending state between batches."""
    history = unkeyed_history(rng, TIMES, 5, 4)
    frozen = [(freeze(dict(zip(FIELDS, row, strict=True)), FIELDS), t, d)
              for row, t, d in history]
    msgs = messages(frozen, 2, rng, TIMES - 1)
    statements = sorted({i for i, m in enumerate(msgs) if isinstance(m, Progress) and i > 0})
    cuts = rng.sample(statements, min(len(statements), count - 1))
    others = [i for i in range(1, len(msgs)) if i not in cuts]
    cuts = sorted(cuts + rng.sample(others, count - 1 - len(cuts)))
    return [msgs[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(msgs)], strict=True)]


def drop(directory: Path, number: int, piece: list) -> Path:
    """Write a piece as the source expects: under a hidden name, then renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    hidden = directory / f".part-{number:04d}.jsonl.tmp"
    with open(hidden, "wb") as fo:
        write_json_lines(fo, piece, CDC)
    final = directory / f"part-{number:04d}.jsonl"
    os.replace(hidden, final)
    return final


def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(CDC.avro))
    return path


def consolidated(lake_dir: Path | str, name: str) -> tuple[Counter, list]:
    """A table's committed updates, consolidated per (row, time), and its frontier: read from
    the files without Spark (`arrow.py`)."""
    ident = TableIdentifier.parse(name)
    state = arrow.committed_state(lake_dir, ident)
    rows = arrow.updates(state, ident.directory(arrow.lake_tables_dir(lake_dir))).to_pylist()
    out: Counter = Counter()
    for r in rows:
        out[(r["id"], r["name"], r["amount"], r["_time"])] += r["_diff"]
    return nonzero(out), list(state.frontier)


def one_shot(spark, lake_at, source: Path, schema: Path | None
             ) -> tuple[Counter, list]:
    """The differential reference: `ingest` of every file at once, in a lake of its own
    (`lake_at`, the `lake_at` fixture: where the test's other lakes are)."""
    lake_dir = lake_at(f"reference-{uuid.uuid4().hex[:6]}")
    name = f"ref_{uuid.uuid4().hex[:8]}"
    ingest.ingest(Lake(spark, lake_dir), name, [source], schema=schema)
    return consolidated(lake_dir, name)


def nonzero(counter: Counter) -> Counter:
    return Counter({k: v for k, v in counter.items() if v != 0})


# ----------------------------------------------------------------------------- in process


@pytest.mark.parametrize("typed", [True, False], ids=["schema", "json-inferred"])
def test_follow_equals_one_shot_ingest(spark, tmp_path, lake_at, typed):
    """Files appear while the query follows the directory (one per trigger at most); the
    table ends equal to a one-shot ingest of all of them, and each batch made one version.
    Without a schema, each batch types the JSON rows as the one-shot ingest types them all."""
    rng = seeded(41)
    parts = pieces(rng, 6 if typed else 3)
    source = tmp_path / "src"
    schema = schema_file(tmp_path) if typed else None
    lake_dir = lake_at("lake")
    for n, piece in enumerate(parts[:2]):
        drop(source, n, piece)
    lake = Lake(spark, lake_dir)
    name = f"f_{uuid.uuid4().hex[:8]}"
    steps: list[tuple[int, str]] = []

    def more_files() -> None:
        for n, piece in enumerate(parts[2:], start=2):
            while len([s for s in steps if s[1] == "committed"]) < n - 1:
                time.sleep(0.1)
            drop(source, n, piece)

    writer = threading.Thread(target=more_files, daemon=True)
    writer.start()
    report = follow(lake, name, directory_source(source, schema=schema,
                                                 max_files_per_trigger=1),
                    str(source.resolve()), trigger_seconds=0.5, until_idle=6,
                    progress=lambda b, step, _r: steps.append((b, step)))
    writer.join(timeout=5)
    assert report.batches == report.committed == len(parts)
    assert consolidated(lake_dir, name) == one_shot(spark, lake_at, source, schema)
    # one version per batch, each recording its batch id
    state = arrow.committed_state(lake_dir, TableIdentifier.parse(name))
    assert state.offsets.stream.batch == len(parts) - 1 and state.version == len(parts)


def test_a_schema_file_of_the_rows_record_types_the_follow_as_it_types_ingest(spark,
                                                                             tmp_path, lake_at):
    """`--schema` may be a file of the rows' record, as `ingest` takes it (the follow read the
    file as the union's text, and the data source failed with an internal error); a file
    that is no schema is its one-line error before the query starts."""
    source = tmp_path / "src"
    for n, piece in enumerate(pieces(seeded(5), 2)):
        drop(source, n, piece)
    record = tmp_path / "record.json"
    record.write_text(json.dumps(CDC.data_type))
    lake_dir = lake_at("lake")
    name = f"f_{uuid.uuid4().hex[:8]}"
    report = follow(Lake(spark, lake_dir), name, directory_source(source, schema=record),
                    str(source.resolve()), trigger_seconds=0.5, until_idle=3)
    assert report.committed >= 1
    assert consolidated(lake_dir, name) == one_shot(spark, lake_at, source, record)
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "record"}')
    with pytest.raises(ChangelakeError, match=r"bad\.json: not a valid Avro schema"):
        directory_source(source, schema=bad)


def test_new_spark_checkpoint_rereads_and_doubles_nothing(spark, tmp_path, lake_at):
    """Spark's checkpoint deleted between runs: its batch ids start again at 0 under a new
    identity, so the table's mark of the old one skips nothing; every file is read again and
    the table takes only what it lacks."""
    rng = seeded(23)
    parts = pieces(rng, 3)
    source, schema = tmp_path / "src", schema_file(tmp_path)
    lake_dir = lake_at("lake")
    lake = Lake(spark, lake_dir)
    name = f"n_{uuid.uuid4().hex[:8]}"
    drop(source, 0, parts[0])
    drop(source, 1, parts[1])

    def run(per_trigger: int | None) -> int:
        return follow(lake, name, directory_source(source, schema=schema,
                                                   max_files_per_trigger=per_trigger),
                      str(source.resolve()), trigger_seconds=0.5, until_idle=3).committed

    assert run(1) == 2  # batches 0 and 1
    checkpoint = lake.handle(name).directory / "_follow"
    remove_tree(checkpoint / "spark")
    drop(source, 2, parts[2])
    assert run(None) == 1  # batch 0 again: all three files, not skipped
    assert consolidated(lake_dir, name) == one_shot(spark, lake_at, source, schema)
    [states] = list((checkpoint / "state").iterdir())  # the old checkpoint's states are gone
    assert states.name == json.loads((checkpoint / "spark" / "metadata").read_text())["id"]


def _batch(spark, paths: list[Path]):
    """A micro-batch as the streaming source hands it: the files' messages."""
    from changelake.spark.source import register

    register(spark)
    return (spark.read.format("materialize-cdc").option("avroSchema", json.dumps(CDC.avro))
            .option("paths", json.dumps([str(p) for p in paths])).load())


def test_replayed_batch_commits_nothing_and_uncommitted_one_is_recomputed(spark, tmp_path,
                                                                          lake_at):
    """The crash windows, driven by hand: a batch replayed after its lake commit commits
    nothing; a batch whose state was written but not committed (the lake commit lost) is
    recomputed from the state before it, identically."""
    rng = seeded(7)
    parts = pieces(rng, 4)
    source, schema = tmp_path / "src", schema_file(tmp_path)
    files = [drop(source, n, piece) for n, piece in enumerate(parts)]
    lake_dir, checkpoint = lake_at("lake"), tmp_path / "checkpoint"
    lake = Lake(spark, lake_dir)
    name = f"r_{uuid.uuid4().hex[:8]}"
    identity = "by-hand"
    check_checkpoint(checkpoint, name, str(source))
    steps: list[tuple[int, str]] = []
    sink = CommitBatches(lake, name, checkpoint, identity, str(source), FollowControl(),
                         progress=lambda b, step, _r: steps.append((b, step)))
    ident = TableIdentifier.parse(name)

    sink(_batch(spark, files[:2]), 0)
    first = arrow.committed_state(lake_dir, ident)
    steps.clear()
    sink(_batch(spark, files[:2]), 0)  # Spark replays batch 0: committed, so nothing
    assert steps == [(0, "skipped")]
    assert arrow.committed_state(lake_dir, ident).version == first.version
    sink(_batch(spark, files[2:3]), 1)
    after_one = consolidated(lake_dir, name)
    states = checkpoint / "state" / identity
    kept = json.loads((states / f"{1:012d}" / "state.json").read_text())
    assert kept["has_pending"]  # updates whose statement is in a later file wait
    # Batch 2's state is written, then "the process dies" before the lake commit: simulated
    # by a sink whose table writer fails after the state is in place.
    failing = CommitBatches(lake, name, checkpoint, identity, str(source), FollowControl(),
                            progress=_fail_at("state"))
    with pytest.raises(RuntimeError, match="killed"):
        failing(_batch(spark, files[3:]), 2)
    assert consolidated(lake_dir, name) == after_one  # nothing of batch 2 committed
    assert (states / f"{2:012d}").is_dir()  # but its state is there
    sink(_batch(spark, files[3:]), 2)  # the replay
    assert consolidated(lake_dir, name) == one_shot(spark, lake_at, source, schema)
    assert sorted(p.name for p in states.iterdir()) == [f"{2:012d}"]


def _fail_at(step: str):
    def progress(_batch: int, at: str, _result: object) -> None:
        if at == step:
            raise RuntimeError(f"killed at {step}")
    return progress


def test_bad_file_stops_the_follow_naming_it(spark, tmp_path, lake_root):
    """A file that is not Materialize CDC stops the query with the input error (the CLI's
    one line and exit status 2), naming the file, and nothing is committed."""
    source, schema = tmp_path / "src", schema_file(tmp_path)
    drop(source, 0, pieces(seeded(3), 2)[0])
    (source / "part-0001.jsonl").write_text('{"updates": [{"data": 1, "time": "x"}]}\n')
    lake_dir = lake_root
    name = f"b_{uuid.uuid4().hex[:8]}"
    with pytest.raises(ChangelakeError, match=r"part-0001\.jsonl"):
        follow(Lake(spark, lake_dir), name, directory_source(source, schema=schema),
               str(source.resolve()), trigger_seconds=0.5, until_idle=30)
    assert not Lake(spark, lake_dir).exists(name)


def test_table_ingested_from_topics_is_refused(spark, tmp_path, lake_root):
    from pyspark.sql.types import LongType, StructField, StructType

    from changelake.lake.layout import SourceOffsets

    source = tmp_path / "src"
    source.mkdir()
    lake = Lake(spark, lake_root)
    name = f"k_{uuid.uuid4().hex[:8]}"
    with lake.handle(name).writer() as writer:
        writer.create(StructType([StructField("id", LongType())]))
        writer.publish(writer.state.next("offsets", offsets=SourceOffsets(
            "kafka", "materialize", "127.0.0.1:9092")))
    with pytest.raises(LakeError, match=r"from a kafka source \(127.0.0.1:9092\): it cannot "
                                        "follow"):
        follow(lake, name, directory_source(source), str(source), until_idle=1)


def test_checkpoint_of_another_source_is_refused(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    check_checkpoint(checkpoint, "t", "/data/a")
    check_checkpoint(checkpoint, "t", "/data/a")
    with pytest.raises(LakeError, match=r"checkpoint .* follows /data/a into table t"):
        check_checkpoint(checkpoint, "t", "/data/b")
    with pytest.raises(LakeError, match=r"follows /data/a into table t, not /data/a into u"):
        check_checkpoint(checkpoint, "u", "/data/a")
    with pytest.raises(LakeError, match="not a directory"):
        directory_source(tmp_path / "missing")


# --------------------------------------------------------------------------- the CLI


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "changelake", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CHANGELAKE_FOLLOW_STEPS": "1",
            "PYSPARK_PYTHON": sys.executable}


def follow_args(lake_dir: Path | str, name: str, source: Path, schema: Path, *extra: str
                ) -> list[str]:
    return cli("ingest", "--lake", str(lake_dir), "--table", name, "--schema", str(schema),
               "--follow", str(source), "--trigger-seconds", "0.5",
               "--max-files-per-trigger", "1", "--conf", "spark.sql.shuffle.partitions=2",
               "--master", "local[1]", *extra)


class Follower:
    """A `changelake ingest --follow` process, its stderr read line by line on a thread."""

    def __init__(self, args: list[str], environment: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        text=True, env=environment or env(), cwd=ROOT)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def steps(self) -> list[str]:
        return [line for line in self.lines if line.startswith("changelake: batch ")]

    def committed(self) -> int:
        return sum(": committed" in s for s in self.steps())

    def wait_for(self, count: int, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while len(self.steps()) < count:
            if self.process.poll() is not None:
                self.reader.join(timeout=5)
                if len(self.steps()) >= count:
                    return
                raise AssertionError(f"follow exited {self.process.returncode}: "
                                     + "\n".join(self.lines[-20:]))
            if time.monotonic() > deadline:
                raise AssertionError("no progress: " + "\n".join(self.lines[-20:]))
            time.sleep(0.05)

    def finish(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return code


def kill_mid_stream(first: Follower, rng, source: Path, parts: list) -> tuple[int, float]:
    """Feed `first` the files of `parts` and SIGKILL it, then drop the files it did not get.
    Each file after the first comes once the batch before it committed; the kill lands at a
    seeded step line (started, state, committed: before, inside and after a batch), a seeded
    moment later. Returns (the step, the moment)."""
    kill_at = rng.randrange(1, 3 * 3)
    delay = rng.choice([0.0, 0.05, 0.3])
    dropped = 1
    while len(first.steps()) < kill_at:
        first.wait_for(len(first.steps()) + 1)
        if first.committed() >= dropped and dropped < len(parts):
            drop(source, dropped, parts[dropped])
            dropped += 1
    time.sleep(delay)
    first.process.send_signal(signal.SIGKILL)
    first.finish()
    for n in range(dropped, len(parts)):
        drop(source, n, parts[n])
    return kill_at, delay


def run_kill_restart(spark, tmp_path: Path, lake_at, seed: int) -> None:
    rng = seeded(seed)
    parts = pieces(rng, 5)
    source, schema = tmp_path / "src", schema_file(tmp_path)
    lake_dir, name = lake_at("lake"), "followed"
    drop(source, 0, parts[0])
    first = Follower(follow_args(lake_dir, name, source, schema))
    kill_at, delay = kill_mid_stream(first, rng, source, parts)
    second = Follower(follow_args(lake_dir, name, source, schema, "--until-idle", "4"))
    assert second.finish() == 0, "\n".join(second.lines[-20:])
    assert consolidated(lake_dir, name) == one_shot(spark, lake_at, source, schema), (
        f"seed {seed}: killed at step {kill_at} + {delay}s\n" + "\n".join(
            first.lines[-8:] + second.lines[-10:]))


# Each process test starts Spark twice (about a minute on CI's two cores): they run in the
# slow tier (`.ci/slow`); the default run keeps the in-process crash windows above.
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_and_restart_nothing_lost_nothing_doubled(spark, tmp_path, lake_at, seed):
    run_kill_restart(spark, tmp_path, lake_at, seed)


@pytest.mark.slow
def test_sigterm_finishes_the_batch_and_status_shows_the_lag(spark, tmp_path, lake_at):
    """SIGTERM inside a batch (its state just written): the batch commits, the process exits
    0. Files added afterwards are behind in `status` (both engines' JVM-free path), with the
    age of the oldest; a restart catches up to zero."""
    rng = seeded(19)
    parts = pieces(rng, 4)
    source, schema = tmp_path / "src", schema_file(tmp_path)
    lake_dir, name = lake_at("lake"), "termed"
    drop(source, 0, parts[0])
    first = Follower(follow_args(lake_dir, name, source, schema))
    first.wait_for(2)  # batch 0 started, its state written: a batch in flight
    first.process.send_signal(signal.SIGTERM)
    assert first.finish() == 0, "\n".join(first.lines[-20:])
    assert first.steps()[:2] == ["changelake: batch 0: started", "changelake: batch 0: state"]
    assert any(line.startswith("changelake: batch 0: committed") for line in first.lines)
    state = arrow.committed_state(lake_dir, TableIdentifier.parse(name))
    assert state.offsets.stream.batch == 0

    old = time.time() - 120
    drop(source, 1, parts[1])
    for n in (2, 3):
        os.utime(drop(source, n, parts[n]), (old, old))
    lag = status_lag(lake_dir)
    assert lag["batch"] == 0 and lag["files_behind"] == 3
    assert lag["seconds_behind"] >= 120 and lag["error"] is None

    second = Follower(follow_args(lake_dir, name, source, schema, "--until-idle", "4"))
    assert second.finish() == 0, "\n".join(second.lines[-20:])
    lag = status_lag(lake_dir)
    assert (lag["files_behind"], lag["seconds_behind"]) == (0, 0.0)
    assert consolidated(lake_dir, name) == one_shot(spark, lake_at, source, schema)


def status_lag(lake_dir: Path | str) -> dict:
    done = subprocess.run(cli("status", "--lake", str(lake_dir), "--engine", "arrow",
                              "--format", "jsonl"), capture_output=True, text=True, env=env(),
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(line) for line in done.stdout.splitlines()]
    return line["follow"]


def test_follow_usage_errors(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for extra, message in [
        (["--follow", str(source), str(source)], "one INPUT directory"),
        (["--follow", str(source), "--from", "debezium"],
         "follows changefeed topics (--kafka --topic), not files"),
        (["--until-idle", "3", str(source)], "go with --follow"),
    ]:
        done = subprocess.run(cli("ingest", "--lake", str(tmp_path / "lake"), "--table", "t",
                                  *extra), capture_output=True, text=True, env=env(), cwd=ROOT,
                              timeout=120)
        assert done.returncode == 2 and message in done.stderr, done.stderr
