"""Compaction: advance `since`, folding change segments into per-bucket deltas and bases.

Seed 004 rewrites the whole table with `row_number()` over base + increments each time, so its
cost grows with the table. Here the work is proportional to the changes, in three tiers:

1. **Segments to a run.** The updates at times <= `since` in the committed segments (the part
   of a segment beyond `since` is rewritten as a smaller segment) are consolidated and written
   as one *run* per bucket they touch, times advanced to `since`. Keyed: the latest version of
   each touched key, or a tombstone (`_diff` -1) if it was deleted. Unkeyed: diffs summed per
   row. Cost: the changes.
2. **Runs to one delta.** When a bucket has more than `max_runs` runs, they are merged into one.
   Cost: that bucket's delta, bounded by `fold_fraction` of its base.
3. **Delta into the base.** When a bucket's deltas hold at least `fold_fraction` of its base's
   rows (or it has no base yet), base and deltas are merged into a new base. Cost: the base, but
   only after a `fold_fraction` of it has arrived as changes, so per change it is constant.

Buckets without changes are not read or written. The new state is committed like any other (see
`commit.py`), so a reader sees the old state or the new; replaced files are removed only when no
retained state refers to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.durable import sync_tree
from changelake.errors import LakeError
from changelake.lake.commit import DEFAULT_RETAIN
from changelake.lake.delta_storage import optimize
from changelake.lake.layout import (
    BASE,
    DELTA,
    SEGMENT,
    FileSet,
    TableState,
    bucket_path,
    parquet_stats,
    run_root,
    segment_path,
)
from changelake.lake.schema import logical_schema, struct_json
from changelake.lake.sql import quote, union_sql
from changelake.lake.table import (
    DELTA_STORAGE,
    ProgressFn,
    Table,
    TableWriter,
    clear_dir,
    write_segment,
)
from changelake.spark.map_grouping import groupable, restored


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When the higher tiers run; see the module docstring."""

    fold_fraction: float = 0.25
    max_runs: int = 4


@dataclass(frozen=True, slots=True)
class CompactionResult:
    table: str
    version: int | None  # None: nothing to do, nothing committed
    since_before: int
    since: int
    segments: int = 0
    changes: int = 0
    buckets_touched: tuple[int, ...] = ()
    merged: tuple[int, ...] = ()
    folded: tuple[int, ...] = ()
    rows_written: int = 0
    files_removed: int = 0
    detail: dict = field(default_factory=dict)


def bucket_of(columns: Sequence[str], buckets: int) -> Column:
    """A key's bucket. Hashes the columns' string forms, so widening a key column's type
    (int to long) does not move its rows to other buckets."""
    parts = [F.col(quote(c)).cast("string") for c in columns]
    return F.pmod(F.xxhash64(*parts), F.lit(buckets)).cast("int")


def latest_per_key(df: DataFrame, key: Sequence[str]) -> DataFrame:
    """Per key, the update at the latest time, an insertion before a retraction at one time:
    the key's state after these updates (a row, or a tombstone if `_diff` < 0)."""
    order = Window.partitionBy(*[quote(k) for k in key]).orderBy(
        F.col("_time").desc(), F.col("_diff").desc())
    return (df.withColumn("_rank", F.row_number().over(order))
            .where(F.col("_rank") == 1).drop("_rank"))


def consolidate_rows(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Unkeyed: sum diffs per (row, bucket), drop zeros. A map column is grouped as its
    sorted entries (`spark.map_grouping`: Spark's own grouping loses its null values)."""
    group = [quote(c) for c in columns] + ["_bucket"]
    return restored(groupable(df).groupBy(*group).agg(F.sum("_diff").alias("_diff"))
                    .where(F.col("_diff") != 0), df.schema)


def _write_buckets(df: DataFrame, table_dir: Path, root: str) -> dict[int, tuple[int, int]]:
    """Write `df` partitioned by bucket under `root`; rows and bytes per bucket written."""
    target = table_dir / root
    clear_dir(target)
    df.repartition("_bucket").write.partitionBy("_bucket").parquet(str(target))
    sync_tree(target, table_dir)  # on the disk before the commit point names them
    out: dict[int, tuple[int, int]] = {}
    if not target.is_dir():
        return out
    for child in sorted(target.iterdir()):
        if child.is_dir() and child.name.startswith("_bucket="):
            rows, size, _, _ = parquet_stats(child)
            if rows:
                out[int(child.name.split("=", 1)[1])] = (rows, size)
    return out


def _finish(df: DataFrame, logical: StructType, since: int, *, keep_time: bool = False
            ) -> DataFrame:
    cols = [F.col(quote(f.name)) for f in logical.fields]
    time = F.col("_time") if keep_time else F.lit(since).cast("long")
    return df.select(*cols, time.alias("_time"), F.col("_diff").cast("long").alias("_diff"),
                     F.col("_bucket"))


def compact(table: Table, since: int | None = None, *,
            policy: CompactionPolicy | None = None, retain: int = DEFAULT_RETAIN,
            progress: ProgressFn | None = None) -> CompactionResult:
    """Compact `table` to `since` (default: the last finished time). See the module docstring.

    Running it again after a crash finishes the job: output names depend only on the
    committed version being replaced, and nothing is visible before the commit.
    """
    policy = policy or CompactionPolicy()
    with table.writer() as writer:
        return _compact_locked(writer, since, policy, retain, progress)


def _compact_locked(writer: TableWriter, since: int | None, policy: CompactionPolicy,
                    retain: int, progress: ProgressFn | None) -> CompactionResult:
    table, state = writer.table, writer.committed()
    spark, directory = table.spark, table.directory
    upper = state.upper
    segments = state.segments()
    if since is None:
        if upper is not None:
            if upper <= state.since:  # nothing committed past `since`: nothing to do
                return CompactionResult(state.name, None, state.since, state.since)
            since = upper - 1  # default: as far as is committed
        elif state.storage == DELTA_STORAGE:
            last = spark.sql(union_sql(state, directory)).agg(F.max("_time")).first()[0]
            since = state.since if last is None else max(int(last), state.since)
        else:
            since = max([s.max_time for s in segments if s.max_time is not None]
                        + [state.since])
    if since < state.since:
        raise LakeError(f"table {state.name}: cannot compact to {since}, the table is already "
                        f"compacted to {state.since}")
    if upper is not None and since >= upper:
        raise LakeError(f"table {state.name}: cannot compact to {since}: only times before "
                        f"{upper} are committed")
    if state.storage == DELTA_STORAGE:
        return _compact_delta(writer, state, since, policy, progress)
    chosen = [s for s in segments if s.min_time is not None and s.min_time <= since]
    if not chosen and since == state.since:
        return CompactionResult(state.name, None, state.since, since)

    steps = 5
    def step(description: str, done: int) -> None:
        if progress is not None:
            progress(description, done, steps)

    version = state.version + 1
    logical = logical_schema(state.versions)
    names = logical.fieldNames()
    new, struct = state.struct_id(struct_json(logical))
    files = [f for f in state.files if f not in chosen]
    written = 0

    # -- segments beyond `since` keep their updates after it, as a smaller segment
    step("splitting segments", 0)
    for seg in chosen:
        if seg.max_time is not None and seg.max_time > since:
            rel = segment_path(since + 1, seg.upper, version)
            target = directory / rel
            clear_dir(target)
            write_segment(spark.sql(union_sql(state, directory, [seg], logical)).where(
                F.col("_time") > since), target)
            sync_tree(target, directory)
            rows, size, t_min, t_max = parquet_stats(target)
            written += rows
            files.append(FileSet(rel, SEGMENT, struct, rows, size, lower=since + 1,
                                 upper=seg.upper, min_time=t_min, max_time=t_max))

    # -- tier 1: segments to one run per touched bucket
    step("folding segments into bucket runs", 1)
    changes = (spark.sql(union_sql(state, directory, chosen, logical))
               .where(F.col("_time") <= since)
               .withColumn("_bucket", bucket_of(state.bucket_columns, state.buckets)))
    if state.keyed:
        run = _finish(latest_per_key(changes, state.key)
                      .withColumn("_diff", F.signum("_diff")), logical, since)
    else:
        run = _finish(consolidate_rows(changes, names), logical, since)
    run_stats = _write_buckets(run, directory, run_root(DELTA, version))
    written += sum(r for r, _ in run_stats.values())
    change_count = sum(s.rows for s in chosen)
    for bucket, (rows, size) in run_stats.items():
        files.append(FileSet(bucket_path(DELTA, version, bucket), DELTA, struct, rows, size,
                             bucket=bucket, min_time=since, max_time=since))

    # -- plan tiers 2 and 3 for the touched buckets
    fold: list[int] = []
    merge: list[int] = []
    for bucket in sorted(run_stats):
        runs = [f for f in files if f.kind == DELTA and f.bucket == bucket]
        base_rows = sum(f.rows for f in files if f.kind == BASE and f.bucket == bucket)
        delta_rows = sum(f.rows for f in runs)
        if base_rows == 0 or delta_rows >= policy.fold_fraction * base_rows:
            fold.append(bucket)
        elif len(runs) > policy.max_runs:
            merge.append(bucket)

    # -- tier 3: fold deltas into bases
    step(f"folding {len(fold)} bucket(s) into their base", 2)
    if fold:
        inputs = [f for f in files if f.kind in (BASE, DELTA) and f.bucket in fold]
        merged = _merge(table, new, inputs, logical, since, keep_tombstones=False)
        stats = _write_buckets(merged, directory, run_root(BASE, version))
        written += sum(r for r, _ in stats.values())
        files = [f for f in files if f not in inputs]
        for bucket, (rows, size) in stats.items():
            files.append(FileSet(bucket_path(BASE, version, bucket), BASE, struct, rows, size,
                                 bucket=bucket, min_time=since, max_time=since))

    # -- tier 2: merge many runs into one delta
    step(f"merging runs of {len(merge)} bucket(s)", 3)
    if merge:
        inputs = [f for f in files if f.kind == DELTA and f.bucket in merge]
        merged = _merge(table, new, inputs, logical, since, keep_tombstones=True)
        stats = _write_buckets(merged, directory, run_root(DELTA, version, merged=True))
        written += sum(r for r, _ in stats.values())
        files = [f for f in files if f not in inputs]
        for bucket, (rows, size) in stats.items():
            files.append(FileSet(bucket_path(DELTA, version, bucket, merged=True), DELTA,
                                 struct, rows, size, bucket=bucket, min_time=since,
                                 max_time=since))

    step("committing", 4)
    result = new.next("compact", since=since, files=tuple(files))
    result = replace(result, detail={
        "since_before": state.since, "segments": len(chosen), "changes": change_count,
        "touched": len(run_stats), "folded": len(fold), "merged": len(merge),
        "rows_written": written,
    })
    removed = writer.publish(result, retain=retain)
    step("done", 5)
    return CompactionResult(
        state.name, result.version, state.since, since, len(chosen), change_count,
        tuple(sorted(run_stats)), tuple(merge), tuple(fold), written, removed,
    )


def _compact_delta(writer: TableWriter, state: TableState, since: int, policy: CompactionPolicy,
                   progress: ProgressFn | None) -> CompactionResult:
    """Compaction of a Delta table: `since` moves to `since`, and the updates at times <= it
    are replaced by their consolidation at `since` (a keyed table's row of each key that has
    one then, an unkeyed table's rows with their multiplicity) once they are worth it; then
    both Delta tables are `OPTIMIZE`d.

    The fold rewrites the table's state (the base: the rows at the earliest time held, a fold's
    result or the first load), so, as the Hive format folds a bucket's deltas into its base
    (tier 3), it runs only when the updates after the base reach `policy.fold_fraction` of the
    base's rows: a fold of n rows follows at least n x fold_fraction changes, and its cost per
    change stays flat as the table grows. Until then only `since` moves (a version that
    records no rows): every read at a time >= since consolidates the updates as it does after
    a fold. Nothing is done where `since` stays and its updates are folded already, or there
    are none at times <= `since`."""
    table = writer.table
    spark, directory = table.spark, table.directory
    logical = logical_schema(state.versions)
    names = logical.fieldNames()
    old = spark.sql(union_sql(state, directory, logical=logical)).where(F.col("_time") <= since)
    if since == state.since and state.folded:
        return CompactionResult(state.name, None, state.since, since)
    base, after = _base_and_after(old)
    if since == state.since and base + after == 0:
        return CompactionResult(state.name, None, state.since, since)
    result = state.next("compact", since=since)
    if after < policy.fold_fraction * max(base, 1):
        result = replace(result, folded=False,
                         detail={"since_before": state.since, "changes": 0,
                                 "base_rows": base, "unfolded": after})
        writer.publish(result)
    else:
        if progress is not None:
            progress("folding updates", 0, 2)
        if state.keyed:
            kept = latest_per_key(old, state.key).where(F.col("_diff") > 0) \
                .withColumn("_diff", F.lit(1).cast("long"))
        else:
            kept = consolidate_rows(old.withColumn("_bucket", F.lit(0)), names).drop("_bucket")
        folded = kept.select(*[F.col(quote(n)) for n in names],
                             F.lit(since).cast("long").alias("_time"),
                             F.col("_diff").cast("long").alias("_diff"))
        result = replace(result, folded=True,
                         detail={"since_before": state.since, "changes": base + after})
        writer.publish(result, rows=folded, replace_where=f"_time <= {int(since)}")
    if progress is not None:
        progress("optimizing", 1, 2)
    optimize(spark, directory, None)
    if progress is not None:
        progress("done", 2, 2)
    return CompactionResult(state.name, result.version, state.since, since,
                            changes=result.detail["changes"])


def _base_and_after(old: DataFrame) -> tuple[int, int]:
    """How many of the updates `old` are at its earliest time (the base), and how many after:
    one aggregate over the `_time` column alone."""
    first = old.agg(F.min("_time")).first()[0]
    if first is None:
        return 0, 0
    row = old.agg(F.count_if(F.col("_time") == first).alias("base"),
                  F.count_if(F.col("_time") > first).alias("after")).first()
    return int(row["base"]), int(row["after"])


def _merge(table: Table, state: TableState, inputs: Sequence[FileSet], logical: StructType,
           since: int, *, keep_tombstones: bool) -> DataFrame:
    """Merge base and delta file sets bucket by bucket (the bucket rides along as a column)."""
    df = table.spark.sql(union_sql(state, table.directory, inputs, logical, with_bucket=True))
    if state.keyed:
        latest = latest_per_key(df, state.key)
        if not keep_tombstones:
            return _finish(latest.where(F.col("_diff") > 0).withColumn("_diff", F.lit(1)),
                           logical, since)
        return _finish(latest.withColumn("_diff", F.signum("_diff")), logical, since,
                       keep_time=True)
    return _finish(consolidate_rows(df, logical.fieldNames()), logical, since)
