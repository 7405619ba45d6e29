"""Lake tables in Delta Lake's format (`lake/delta_storage.py`): the current rows are a Delta
table every Delta reader reads, the history is exact at every time, and commits are exactly
once through Delta's own log.

Every check compares against the truth computed in Python from the generated history.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections import Counter

import pytest

from changelake.lake import Lake
from changelake.lake.delta_storage import APP_ID, current_path, updates_path
from tests.support.lake_history import (
    SCHEMA,
    increments,
    keyed_history,
    messages,
    rows_of,
    state_at,
    to_df,
    unkeyed_history,
)
from tests.support.lake_roots import local_only

pytestmark = pytest.mark.spark


def unique(name: str) -> str:
    return f"dl_{uuid.uuid4().hex[:10]}.{name}"


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def delta_table(path):
    """delta-rs's handle on the Delta table at `path` (local, or on the run's S3 server)."""
    from deltalake import DeltaTable

    from changelake.lake.files import delta_uri, storage_options

    return DeltaTable(delta_uri(path), storage_options=storage_options(path))


def arrow_rows(table) -> Counter:
    """The rows of an Arrow table as `rows_of` counts a DataFrame's."""
    names = SCHEMA.fieldNames()
    return Counter(tuple(r[n] for n in names) for r in table.to_pylist())


def deliver(spark, lake: Lake, *, keyed: bool, seed: int, times: int = 8):
    rng = random.Random(seed)
    history = (keyed_history(rng, times, 20, 5) if keyed
               else unkeyed_history(rng, times, 5, 4))
    name = unique("keyed" if keyed else "unkeyed")
    table = lake.create_table(name, SCHEMA, key=["id"] if keyed else (), storage="delta")
    msgs = messages(history, finish_every=2, rng=rng, last_time=times - 1)
    for inc in increments(msgs, rng):
        table.commit(to_df(spark, inc.updates), inc.lower, inc.upper)
    return history, name, table


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_every_reader_sees_the_rows_and_as_of_is_exact_at_every_time(spark, lake, keyed):
    import duckdb

    times = 8
    history, name, table = deliver(spark, lake, keyed=keyed, seed=7 if keyed else 8,
                                   times=times)
    state = table.state()
    assert state.storage == "delta"
    assert state.frontier == (times,)
    truth = state_at(history, times - 1, keyed=keyed)
    # The metastore's table, Spark's Delta reader by path, delta-rs, and DuckDB over Arrow.
    assert rows_of(spark.table(name)) == truth
    path = str(current_path(table.directory))
    assert rows_of(spark.read.format("delta").load(path)) == truth
    delta = delta_table(current_path(table.directory))
    assert arrow_rows(delta.to_pyarrow_table()) == truth
    dataset = delta.to_pyarrow_dataset()  # noqa: F841 (DuckDB reads it by its name)
    names = ", ".join(SCHEMA.fieldNames())
    fetched = duckdb.sql(f"SELECT {names} FROM dataset").fetchall()
    assert Counter(fetched) == truth
    for at in range(state.since, times):
        assert rows_of(table.as_of(at)) == state_at(history, at, keyed=keyed), at
    # Both Delta tables record the committed version as the application's transaction.
    assert delta.transaction_version(APP_ID) == state.version
    assert delta_table(updates_path(table.directory)).transaction_version(APP_ID) \
        == state.version


@pytest.mark.parametrize("layout", ["by_key", "shuffled"])
def test_a_first_commit_of_a_whole_history_lands_each_keys_latest_row(spark, lake, layout):
    """`current`'s first rows (`delta_storage._first_rows`: each run of one key's updates
    reduced to its latest, then the window by key) equal the truth whatever order the
    commit's files hold the updates in: each key's updates together, as a conversion writes
    them, or spread over the files in a random order, where no run reduces."""
    rng = random.Random(11)
    times = 12
    history = keyed_history(rng, times, 60, 25)
    ordered = sorted(history, key=lambda u: (u[0][0], u[1], u[2]))  # by key, time, diff
    if layout == "shuffled":
        rng.shuffle(ordered)
    name = unique(f"first_{layout}")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    # By key: runs of each key's updates in three files; shuffled: over four, in any order.
    frame = to_df(spark, ordered)
    updates = frame.coalesce(3) if layout == "by_key" else frame.repartition(4)
    table.commit(updates, 0, times)
    truth = state_at(history, times - 1, keyed=True)
    assert sum(1 for _, _, diff in history if diff < 0) > 0  # some retractions
    assert rows_of(spark.table(name)) == truth
    assert arrow_rows(delta_table(current_path(table.directory)).to_pyarrow_table()) == truth
    # `updates` keeps file statistics of `_time` alone (`UPDATES_PROPERTIES`).
    import pyarrow as pa

    updates = delta_table(updates_path(table.directory))
    assert updates.metadata().configuration["delta.dataSkippingStatsColumns"] == "_time"
    adds = pa.table(updates.get_add_actions(flatten=True)).to_pydict()
    assert adds["min._time"] and None not in adds["min._time"], adds.keys()
    assert all(v is None for v in adds.get("min.name", [])), adds["min.name"]


PLAIN_READER = """
import json, sys
from pyspark.sql import SparkSession
jars, path = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]").config("spark.jars", jars)
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog",
                 "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config("spark.ui.enabled", "false").getOrCreate())
rows = [list(r) for r in spark.read.format("delta").load(path).collect()]
print(json.dumps(rows))
"""


@pytest.mark.slow  # a second JVM: 40 s of the default run's 20 minutes
@local_only("a plain PySpark session with only Delta's jars has no S3A connector to read by")
def test_a_plain_pyspark_session_with_only_deltas_jars_reads_the_rows(spark, lake, tmp_path):
    """No changelake code or settings: the table is Delta's own format."""
    from changelake.spark.maven import jars

    history, _name, table = deliver(spark, lake, keyed=True, seed=5, times=4)
    delta_jars = [str(j) for j in jars() or () if j.name.startswith("delta-")]
    assert len(delta_jars) == 2, delta_jars
    run = subprocess.run(
        [sys.executable, "-c", PLAIN_READER, ",".join(delta_jars),
         str(current_path(table.directory))],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={k: v for k, v in os.environ.items()
             if not k.startswith(("CHANGELAKE", "PYSPARK_SUBMIT"))})
    assert run.returncode == 0, run.stderr[-2000:]
    rows = Counter(tuple(r) for r in json.loads(run.stdout.strip().splitlines()[-1]))
    assert rows == state_at(history, 3, keyed=True)


def test_a_replayed_commit_changes_nothing_and_a_gap_is_refused(spark, lake):
    from changelake.errors import LakeError

    name = unique("replay")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    first = [((1, "a", 10), 0, 1), ((2, "b", 20), 1, 1)]
    second = [((1, "a", 10), 2, -1), ((1, "c", 11), 2, 1), ((3, "d", 30), 3, 1)]
    table.commit(to_df(spark, first), 0, 2)
    table.commit(to_df(spark, first + second), 0, 4)  # overlaps: only times >= 2 are new
    again = table.commit(to_df(spark, first + second), 0, 4)
    assert again.skipped
    assert rows_of(spark.table(name)) == Counter({(1, "c", 11): 1, (2, "b", 20): 1,
                                                  (3, "d", 30): 1})
    assert rows_of(table.updates().drop("_time", "_diff")) == Counter(
        {(1, "a", 10): 2, (2, "b", 20): 1, (1, "c", 11): 1, (3, "d", 30): 1})
    with pytest.raises(LakeError, match="missing"):
        table.commit(to_df(spark, [((4, "e", 1), 6, 1)]), 5, 7)
    assert table.state().frontier == (4,)


def rows_in_files(directory) -> int:
    """How many rows the Parquet files in `directory` (a local or a remote path) hold, whether
    or not a log names them."""
    import io

    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(io.BytesIO(p.read_bytes())).metadata.num_rows
               for p in directory.glob("*.parquet"))


def test_a_commit_whose_checks_fail_leaves_no_row_and_no_version(spark, lake):
    """A commit's rows are written once, inside an open Delta transaction, before its checks
    settle (`delta_txn`): where they fail, the files are deleted and no version is made; a
    commit after it writes the same interval whole."""
    name = unique("checks")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    table.commit(to_df(spark, [((1, "a", 1), 0, 1)]), 0, 1)
    updates = updates_path(table.directory)
    before = rows_in_files(updates)
    version = delta_table(updates).version()
    wrote = []

    def failing(action):
        action()
        wrote.append(rows_in_files(updates))
        raise RuntimeError("a check failed")

    later = [((1, "a", 1), 1, -1), ((2, "b", 2), 1, 1)]
    with pytest.raises(RuntimeError, match="a check failed"), table.writer() as writer:
        writer.commit(to_df(spark, later), 1, 2, write=failing)
    assert wrote == [before + 2]  # the rows were written before the checks settled
    assert rows_in_files(updates) == before
    assert delta_table(updates).version() == version
    assert table.state().frontier == (1,)
    table.commit(to_df(spark, later), 1, 2)
    assert rows_of(spark.table(name)) == Counter({(2, "b", 2): 1})
    assert rows_of(table.as_of(0)) == Counter({(1, "a", 1): 1})


def test_a_staged_commit_fails_when_another_writer_committed_first(spark, lake):
    """Two writers that began from the same committed version: the second's commit fails on
    Delta's transaction conflict, and its files are not in the table."""
    from changelake.errors import LakeError
    from changelake.lake import delta_storage

    name = unique("race")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    rows = to_df(spark, [((1, "a", 1), 0, 1)])
    late = delta_storage.stage(spark, table.directory, table.updates().schema)
    assert late is not None
    table.commit(rows, 0, 1)  # the other writer
    updates = updates_path(table.directory)
    before = rows_in_files(updates)
    late.write(table.updates().limit(1))
    assert late.files and rows_in_files(updates) == before + 1
    # Its version was computed before the other writer's commit: Delta's check refuses it.
    with pytest.raises(LakeError, match="another writer"):
        delta_storage.commit(spark, table.ident, table.directory, table.state(), late)
    late.abort()
    assert rows_in_files(updates) == before
    assert rows_of(spark.table(name)) == Counter({(1, "a", 1): 1})
    assert rows_of(table.updates().drop("_time", "_diff")) == Counter({(1, "a", 1): 1})


def test_current_catches_up_after_a_crash_between_the_two_tables(spark, lake):
    """A commit whose append reached `updates` but whose MERGE into `current` never ran (the
    process died between them): the next commit applies both intervals to `current`."""
    from changelake.lake import delta_storage

    name = unique("crash")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    table.commit(to_df(spark, [((1, "a", 1), 0, 1)]), 0, 1)
    real = delta_storage.catch_up
    delta_storage.catch_up = lambda *args, **kwargs: None  # the MERGE never runs
    try:
        table.commit(to_df(spark, [((1, "a", 1), 1, -1), ((2, "b", 2), 1, 1)]), 1, 2)
    finally:
        delta_storage.catch_up = real
    assert table.state().frontier == (2,)
    assert rows_of(spark.table(name)) == Counter({(1, "a", 1): 1})  # behind, not wrong
    table.commit(to_df(spark, [((3, "c", 3), 2, 1)]), 2, 3)
    assert rows_of(spark.table(name)) == Counter({(2, "b", 2): 1, (3, "c", 3): 1})


def test_a_writer_reads_previous_rows_from_current_not_every_update(spark, lake):
    """A keyed table's rows at the writer's committed state (where a conversion takes each
    key's previous row) are read from `current`'s files, not from every file of `updates`:
    a commit reads what the table holds now, not what it was ever given (on S3 a GET per
    file of `updates`, per commit: `benchmarks/bench_s3.py`). Where `current` trails (the
    MERGE never ran) they are merged on read from `updates`, and equal."""
    from changelake.lake import delta_storage

    name = unique("previous")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    for t in range(4):
        table.commit(to_df(spark, [((t, f"r{t}", t), t, 1)]), t, t + 1)
    table.commit(to_df(spark, [((0, "r0", 0), 4, -1), ((0, "new", 9), 4, 1)]), 4, 5)
    want = Counter({(0, "new", 9): 1, (1, "r1", 1): 1, (2, "r2", 2): 1, (3, "r3", 3): 1})
    with table.writer() as writer:
        now = writer.current()
        assert rows_of(now) == want
        read = now.inputFiles()
    assert read and all("/current/" in f and "/updates/" not in f for f in read), read
    real = delta_storage.catch_up
    delta_storage.catch_up = lambda *args, **kwargs: None  # `current` left behind
    try:
        table.commit(to_df(spark, [((5, "r5", 5), 5, 1)]), 5, 6)
    finally:
        delta_storage.catch_up = real
    with table.writer() as writer:
        behind = writer.current()
        assert rows_of(behind) == want + Counter({(5, "r5", 5): 1})
        assert any("/updates/" in f for f in behind.inputFiles())


def test_history_view_and_added_column(spark, lake):
    from pyspark.sql.types import LongType, StructField, StructType

    name = unique("scd")
    table = lake.create_table(name, SCHEMA, key=["id"], scd2=True, storage="delta")
    table.commit(to_df(spark, [((1, "a", 1), 0, 1), ((2, "b", 2), 0, 1)]), 0, 1)
    wide = StructType([*SCHEMA.fields, StructField("extra", LongType())])
    rows = [((1, "a", 1, None), 1, -1), ((1, "z", 5, 9), 1, 1)]
    table.commit(to_df(spark, rows, wide), 1, 2)
    assert rows_of(spark.table(name)) == Counter({(1, "z", 5, 9): 1, (2, "b", 2, None): 1})
    history = {(r["id"], r["valid_from"], r["valid_to"])
               for r in spark.table(f"{name}_history").collect()}
    assert history == {(1, 0, 1), (1, 1, None), (2, 0, None)}


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_compaction_folds_history_and_keeps_every_later_time_exact(spark, lake, keyed):
    from changelake.lake.compact import CompactionPolicy, compact

    rng = random.Random(11 if keyed else 12)
    times = 8
    history = (keyed_history(rng, times, 15, 4) if keyed
               else unkeyed_history(rng, times, 4, 3))
    name = unique("compacted")
    table = lake.create_table(name, SCHEMA, key=["id"] if keyed else (), storage="delta")
    msgs = messages(history, finish_every=2, rng=rng, last_time=times - 1)
    for n, inc in enumerate(increments(msgs, rng)):
        table.commit(to_df(spark, inc.updates), inc.lower, inc.upper)
        state = table.state()
        if n % 3 == 2 and state.upper is not None and state.upper > state.since + 1:
            compact(table, rng.randint(state.since, state.upper - 1))
    target = max(table.state().since, times - 3)
    compact(table, target, policy=CompactionPolicy(fold_fraction=0))  # fold whatever there is
    state = table.state()
    assert state.since == target and state.folded
    assert rows_of(spark.table(name)) == state_at(history, times - 1, keyed=keyed)
    for at in range(state.since, times):
        assert rows_of(table.as_of(at)) == state_at(history, at, keyed=keyed), at
    # Only the folded state and the updates after `since` are left.
    # (a keyed table's rows one each, an unkeyed table's distinct rows with their count)
    kept = table.updates().where(f"_time <= {state.since}").count()
    assert kept == len(state_at(history, state.since, keyed=keyed))
    again = compact(table, target)
    assert again.version is None


def test_compaction_folds_only_once_the_changes_reach_a_fraction_of_the_base(spark, lake):
    """A fold rewrites the table's state, so it waits for changes worth a fraction of it:
    until then compaction moves `since` and writes no row; every read stays exact."""
    from pyspark.sql import functions as F

    from changelake.lake.compact import CompactionPolicy, compact

    name = unique("lazy")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    truth = {i: (i, f"n{i}", 0) for i in range(40)}
    table.commit(to_df(spark, [(row, 0, 1) for row in truth.values()]), [0], [1])
    policy = CompactionPolicy(fold_fraction=0.25)
    states = {0: dict(truth)}
    for t in range(1, 5):  # 4 changed keys a time: 8 updates (a retraction and an insertion)
        changed = [(i, f"n{i}", t) for i in range(4 * t, 4 * t + 4)]
        updates = [(truth[r[0]], t, -1) for r in changed] + [(r, t, 1) for r in changed]
        truth.update({r[0]: r for r in changed})
        states[t] = dict(truth)
        table.commit(to_df(spark, updates), [t], [t + 1])
        result = compact(table, t, policy=policy)
        state = table.state()
        held = table.updates().where(F.col("_time") <= t).count()
        assert state.since == t
        if t < 2:  # 8 updates after a base of 40 rows: under a quarter, nothing rewritten
            assert not state.folded and held == 40 + 8 * t
        if t == 2:  # 16 of 40: folded into the 40 rows of the state at 2
            assert state.folded and held == 40 and result.changes == 56
        for at in range(state.since, t + 1):
            assert rows_of(table.as_of(at)) == Counter(states[at].values()), (t, at)
        assert rows_of(spark.table(name)) == Counter(truth.values())
    # After the fold the base is the 40 rows at 2: 16 updates at 3 and 4 make it fold again.
    assert state.folded and table.updates().where(F.col("_time") <= 4).count() == 40


def test_a_hive_lake_keeps_its_tables_and_makes_new_ones_in_delta(spark, lake_root,
                                                                  monkeypatch):
    """A lake whose tables were made in the Hive format (by a release before Delta was the
    default, or with `--format hive`) keeps reading and ingesting them as they are; a table
    it gains later is a Delta table, the default."""
    monkeypatch.delenv("CHANGELAKE_TABLE_FORMAT", raising=False)
    root = lake_root
    old = Lake(spark, root, storage="hive")
    name, new_name = unique("old"), unique("new")
    old.create_table(name, SCHEMA, key=["id"]).commit(
        to_df(spark, [((1, "a", 1), 0, 1)]), 0, 1)
    lake = Lake(spark, root)  # opened as a later command opens it: no format named
    table = lake.table(name)
    table.commit(to_df(spark, [((1, "a", 1), 1, -1), ((2, "b", 2), 1, 1)]), 1, 2)
    assert table.state().storage == "hive"
    assert rows_of(spark.table(name)) == Counter({(2, "b", 2): 1})
    assert rows_of(table.as_of(0)) == Counter({(1, "a", 1): 1})
    fresh = lake.create_table(new_name, SCHEMA, key=["id"])
    fresh.commit(to_df(spark, [((7, "g", 7), 0, 1)]), 0, 1)
    assert fresh.state().storage == "delta"
    assert rows_of(spark.table(new_name)) == Counter({(7, "g", 7): 1})


def test_a_creation_killed_before_deltas_first_commit_is_made_again(spark, lake):
    """A first ingest killed before Delta's first commit on `current` leaves files there but
    no Delta log (seen: `_delta_log/_staged_commits`), over which Delta refuses to create a
    table; the next creation removes them and makes the table (the manifest written before
    the commit point is replaced as any uncommitted one is)."""
    name = unique("killed")
    log = current_path(lake.handle(name).directory) / "_delta_log"
    (log / "_staged_commits").mkdir(parents=True)
    (log / ".00000000000000000000.json.tmp").write_text("{}")
    table = lake.create_table(name, SCHEMA, key=["id"], storage="delta")
    table.commit(to_df(spark, [((1, "a", 5), 0, 1)]), 0, 1)
    assert rows_of(spark.table(name)) == Counter({(1, "a", 5): 1})
    assert not (log / ".00000000000000000000.json.tmp").exists()
