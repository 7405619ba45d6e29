"""Lake tables: exactly-once commits of mangled increments, merge-on-read, AS OF, compaction.

Every check compares against the truth computed in Python from the generated history.
"""

from __future__ import annotations

import random
import uuid

import pytest

from changelake.errors import LakeError
from changelake.lake import Lake
from changelake.lake.compact import CompactionPolicy, compact
from changelake.protocol import Antichain
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

pytestmark = pytest.mark.spark


def unique(name: str) -> str:
    return f"lk_{uuid.uuid4().hex[:10]}.{name}"


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def deliver_and_check(spark, lake: Lake, *, keyed: bool, seed: int, times: int = 18,
                      compact_every: int = 3, buckets: int = 4) -> None:
    rng = random.Random(seed)
    history = (keyed_history(rng, times, 30, 6) if keyed
               else unkeyed_history(rng, times, 6, 5))
    name = unique("keyed" if keyed else "unkeyed")
    table = lake.create_table(name, SCHEMA, key=["id"] if keyed else (), buckets=buckets)
    policy = CompactionPolicy(fold_fraction=0.5, max_runs=2)
    msgs = messages(history, finish_every=2, rng=rng, last_time=times - 1)
    for n, inc in enumerate(increments(msgs, rng)):
        table.commit(to_df(spark, inc.updates), inc.lower, inc.upper)
        if n % compact_every == compact_every - 1:
            state = table.state()
            upper = state.upper
            # sometimes compact to a time inside the committed range (splits a segment)
            target = None if rng.random() < 0.5 or upper is None else rng.randint(
                state.since, upper - 1)
            compact(table, target, policy=policy)
    state = table.state()
    assert state.frontier == (times,)
    assert rows_of(spark.table(name)) == state_at(history, times - 1, keyed=keyed)
    for at in sorted({state.since, times - 1, (state.since + times) // 2}):
        assert rows_of(table.as_of(at)) == state_at(history, at, keyed=keyed)
    compact(table, policy=policy)
    assert table.state().since == times - 1
    assert rows_of(spark.table(name)) == state_at(history, times - 1, keyed=keyed)


def test_keyed_mangled_increments_with_compactions(spark, lake):
    deliver_and_check(spark, lake, keyed=True, seed=1)


def test_unkeyed_mangled_increments_with_compactions(spark, lake):
    deliver_and_check(spark, lake, keyed=False, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4])
def test_more_histories(spark, lake, seed):
    deliver_and_check(spark, lake, keyed=seed % 2 == 0, seed=seed, times=40, compact_every=2)


def test_unkeyed_multiplicity_is_rows(spark, lake):
    name = unique("multi")
    table = lake.create_table(name, SCHEMA)
    row = (1, "a", 5)
    table.commit(to_df(spark, [(row, 0, 2), ((2, "b", 1), 1, 1)]), Antichain([0]), Antichain([2]))
    assert sorted(tuple(r) for r in spark.table(name).collect()) == [row, row, (2, "b", 1)]
    table.commit(to_df(spark, [(row, 2, -1)]), Antichain([2]), Antichain([3]))
    compact(table)
    assert sorted(tuple(r) for r in spark.table(name).collect()) == [row, (2, "b", 1)]
    assert sorted(tuple(r) for r in table.as_of(2).collect()) == [row, (2, "b", 1)]
    # Rows are not one per key here: an ingest by a key is refused, without one it is fine.
    with table.writer() as writer:
        with pytest.raises(LakeError, match=r"has no key, but the ingest gives the key id"):
            writer.ingest_key(["id"])
        assert writer.ingest_key([]) == ()


def test_exactly_once_rules(spark, lake):
    name = unique("once")
    table = lake.create_table(name, SCHEMA, key=["id"])
    first = [((1, "a", 1), 0, 1), ((2, "b", 2), 1, 1)]
    result = table.commit(to_df(spark, first), Antichain([0]), Antichain([2]))
    assert (result.written, result.version) == (2, 1)
    # the same input again: nothing new
    again = table.commit(to_df(spark, first), Antichain([0]), Antichain([2]))
    assert again.skipped and table.state().version == 1
    # overlapping input: only times from the committed frontier on are written
    overlap = [*first, ((1, "a", 1), 2, -1), ((1, "z", 9), 2, 1)]
    result = table.commit(to_df(spark, overlap), Antichain([0]), Antichain([3]))
    assert result.written == 2 and result.lower == 2
    assert rows_of(spark.table(name)) == {(1, "z", 9): 1, (2, "b", 2): 1}
    # a gap is an error and changes nothing
    with pytest.raises(LakeError, match="missing"):
        table.commit(to_df(spark, [((3, "c", 3), 5, 1)]), Antichain([5]), Antichain([6]))
    # an update outside the interval is an error and changes nothing
    with pytest.raises(LakeError, match="not inside"):
        table.commit(to_df(spark, [((3, "c", 3), 7, 1)]), Antichain([3]), Antichain([4]))
    assert table.state().version == 2
    assert rows_of(spark.table(name)) == {(1, "z", 9): 1, (2, "b", 2): 1}
    # AS OF outside [since, frontier) is refused
    with pytest.raises(LakeError, match="not final"):
        table.as_of(3)
    # closing the feed: the empty frontier; afterwards every input is old
    table.commit(to_df(spark, [((3, "c", 3), 7, 1)]), Antichain([3]), Antichain())
    assert table.state().frontier == ()
    assert table.commit(to_df(spark, first), Antichain([0]), Antichain()).skipped
    assert rows_of(table.as_of(100)) == {(1, "z", 9): 1, (2, "b", 2): 1, (3, "c", 3): 1}
    compact(table)
    assert table.state().since == 7
    # A table whose history starts at its since (a captured table that joined) is told so too.
    with pytest.raises(LakeError, match=r"before the table's since \(7\): its history starts "
                                        "there, or was compacted away up to there"):
        table.as_of(6)


def test_compaction_touches_only_changed_buckets(spark, lake):
    """The Hive format's buckets and bases (a Delta table has neither)."""
    name = unique("buckets")
    table = lake.create_table(name, SCHEMA, key=["id"], buckets=8, storage="hive")
    rows = [((k, "x", k), 0, 1) for k in range(64)]
    table.commit(to_df(spark, rows), Antichain([0]), Antichain([1]))
    first = compact(table)
    assert len(first.folded) == 8  # no base yet anywhere
    bases = {f.path for f in table.state().files if f.kind == "base"}
    table.commit(to_df(spark, [((5, "x", 5), 1, -1), ((5, "y", 6), 1, 1)]),
                 Antichain([1]), Antichain([2]))
    second = compact(table, policy=CompactionPolicy(fold_fraction=0.5))
    assert len(second.buckets_touched) == 1 and not second.folded
    assert {f.path for f in table.state().files if f.kind == "base"} == bases
    assert rows_of(spark.table(name))[(5, "y", 6)] == 1
    assert len(rows_of(spark.table(name))) == 64


def test_scd2_history_view(spark, lake):
    name = unique("scd")
    table = lake.create_table(name, SCHEMA, key=["id"], scd2=True)
    table.commit(to_df(spark, [((1, "a", 1), 0, 1), ((2, "b", 2), 0, 1)]),
                 Antichain([0]), Antichain([1]))
    table.commit(to_df(spark, [((1, "a", 1), 3, -1), ((1, "a", 5), 3, 1),
                               ((2, "b", 2), 4, -1)]), Antichain([1]), Antichain([5]))
    history = {tuple(r) for r in spark.table(f"{name}_history").collect()}
    assert history == {(1, "a", 1, 0, 3), (1, "a", 5, 3, None), (2, "b", 2, 0, 4)}
    # compacting to 3 folds history before it: versions from then on stay exact
    compact(table, 3)
    history = {tuple(r) for r in spark.table(f"{name}_history").collect()}
    assert history == {(1, "a", 5, 3, None), (2, "b", 2, 3, 4)}


def test_replaced_files_are_deleted_only_when_no_recent_state_refers_to_them(spark, lake):
    from changelake.lake.commit import collect_garbage
    from changelake.lake.layout import file_set_leaves

    """The Hive format's garbage collection of file sets (a Delta table's files are Delta's:
    `VACUUM`)."""
    name = unique("gc")
    table = lake.create_table(name, SCHEMA, key=["id"], buckets=2, storage="hive")
    table.commit(to_df(spark, [((1, "a", 1), 0, 1)]), Antichain([0]), Antichain([1]))
    table.commit(to_df(spark, [((2, "b", 1), 1, 1)]), Antichain([1]), Antichain([2]))
    compact(table)
    state = table.state()
    live = {f.path for f in state.files}
    on_disk = set(file_set_leaves(table.directory))
    assert {"seg/0-1", "seg/1-2"} <= on_disk - live  # replaced, but recently: still there
    assert collect_garbage(table.directory, state) == 0
    assert collect_garbage(table.directory, state, retain=1, grace_seconds=0) == 2
    assert set(file_set_leaves(table.directory)) == live
    assert rows_of(spark.table(name)) == {(1, "a", 1): 1, (2, "b", 1): 1}


def test_compaction_with_nothing_committed_past_since_is_a_no_op(spark, lake):
    name = unique("empty")
    table = lake.create_table(name, SCHEMA, key=["id"])
    assert compact(table).version is None  # nothing committed yet: nothing to do
    table.commit(to_df(spark, []), Antichain([0]), Antichain([1]))
    assert compact(table).version is None and table.state().since == 0


def test_a_metastore_object_that_is_no_changelake_table_is_refused(spark, lake):
    """A name the metastore holds as a plain table, or as a view without changelake's
    version marker, is refused by name, never read as a table with no history."""
    database = unique("x").split(".")[0]
    spark.sql(f"CREATE DATABASE {database}")
    spark.sql(f"CREATE TABLE {database}.plain (a INT) USING parquet")
    spark.sql(f"CREATE VIEW {database}.foreign AS SELECT a FROM {database}.plain")
    with pytest.raises(LakeError, match=rf"{database}\.plain exists in the metastore but is "
                                        r"not a changelake table \(no view\)"):
        lake.table(f"{database}.plain")
    with pytest.raises(LakeError, match=rf"{database}\.foreign exists in the metastore but is "
                                        "not a changelake table$"):
        lake.table(f"{database}.foreign")
    with pytest.raises(LakeError, match="does not exist"):
        lake.table(f"{database}.missing")


def test_a_segment_gives_up_a_dictionary_at_its_size(spark, lake, tmp_path):
    """`table.SEGMENT_DICTIONARY_BYTES`: a commit stops a column's Parquet dictionary at that
    size, where Parquet's default (1 MiB) holds every distinct value; a column of few values
    keeps its dictionary. The files are written uncompressed here, so that a dictionary
    page's length in the file is its entries' bytes."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from changelake.lake.files import parquet_source
    from changelake.lake.table import SEGMENT_DICTIONARY_BYTES
    from changelake.spark.settings import settings

    distinct = SEGMENT_DICTIONARY_BYTES // 8 + 8_000  # longs past it, within 1 MiB
    # Each value four times in a row: a dictionary that pays for itself on the first page.
    updates = spark.range(4 * distinct).select(
        "id", (F.col("id") % 3).cast("string").alias("name"),
        (F.col("id") / 4).cast("long").alias("amount"),
        F.lit(0).cast("long").alias("_time"), F.lit(1).cast("long").alias("_diff"),
    ).coalesce(1)

    def dictionary_bytes(files: list) -> dict[str, int]:
        """Each column's dictionary page's length (header included), 0 without one."""
        (file,) = files
        with parquet_source(file) as source:
            group = pq.ParquetFile(source).metadata.row_group(0)
        return {c.path_in_schema: c.data_page_offset - c.dictionary_page_offset
                if c.has_dictionary_page else 0
                for c in map(group.column, range(group.num_columns))}

    with settings(spark, {"spark.sql.parquet.compression.codec": "uncompressed"}):
        updates.write.parquet(str(tmp_path / "default"))
        name = unique("dictionary")
        table = lake.create_table(name, SCHEMA, key=["id"], storage="hive")
        assert table.commit(updates, Antichain([0]), Antichain([1])).written == 4 * distinct
    default = dictionary_bytes(list((tmp_path / "default").glob("*.parquet")))
    committed = dictionary_bytes([p for f in table.state().files if f.rows
                                  for p in (table.directory / f.path).rglob("*.parquet")])
    assert default["amount"] >= 8 * distinct > SEGMENT_DICTIONARY_BYTES
    assert 0 < committed["amount"] <= SEGMENT_DICTIONARY_BYTES + 256
    assert default["id"] == committed["id"] == 0  # distinct values: Parquet drops it anyway
    for few in ("name", "_time", "_diff"):
        assert 0 < committed[few] == default[few] < 256, few
    assert spark.table(name).count() == 4 * distinct

    # The part of a segment that compaction keeps beyond `since` is a segment again, written
    # the same way (`table.write_segment`).
    split = lake.create_table(unique("dictionary_split"), SCHEMA, key=["id"], storage="hive")
    earlier = updates.limit(1).selectExpr("-1 AS id", "name", "amount", "_time", "_diff")
    later = updates.withColumn("_time", F.lit(1).cast("long"))
    with settings(spark, {"spark.sql.parquet.compression.codec": "uncompressed"}):
        split.commit(earlier.unionByName(later).coalesce(1), Antichain([0]), Antichain([2]))
        compact(split, 0)
    (kept,) = [f for f in split.state().files if f.lower == 1]
    assert kept.rows == 4 * distinct
    assert 0 < dictionary_bytes(list((split.directory / kept.path).rglob("*.parquet")))[
        "amount"] <= SEGMENT_DICTIONARY_BYTES + 256
