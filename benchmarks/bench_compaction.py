"""Compaction cost per change as the table grows, against seed 004's full rewrite.

For each table size (1x, 4x, 16x of `--rows`) and each workload, the same volume of changes
(`--changes` per round, `--rounds` rounds) is committed and compacted after every round:

* (a) recent: inserts of new keys and updates of keys inserted in the last rounds;
* (b) uniform: updates of keys drawn uniformly from the whole table.

Ours: `changelake.lake` compaction (touched buckets only, tiered: runs, merged deltas, fold into
the base at `--fold` of its size). Seed 004: the whole table rewritten each round with
`row_number()` over base + increment (latest row per key). Both run on the same Spark session
and the same data. Printed per size: seconds per 1,000 changes (all rounds, folds included),
rows written per change, and the ratio to the 1x size: flat is ~1, growing with the table is
~4 and ~16.

With `--format delta` the tables are Delta tables, whose commit also brings `current` (the
table's rows now, read by every engine) up to date by a MERGE: the commit's time is printed
too (`commit s/1k`), and `total` is commit and compaction together, the cost of a round's
changes that a reader of either format sees applied.

    python benchmarks/bench_compaction.py                # default sizes
    python benchmarks/bench_compaction.py --scale 0.2    # a quick run
    python benchmarks/bench_compaction.py --format delta # Delta tables
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from changelake.lake import Lake
from changelake.lake.compact import CompactionPolicy, compact
from changelake.protocol import Antichain

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType()),
                     StructField("amount", LongType())])
UPDATES = StructType([*SCHEMA.fields, StructField("_time", LongType()),
                      StructField("_diff", LongType())])


def initial(spark: SparkSession, rows: int):
    return spark.range(rows).select(
        F.col("id"), F.concat(F.lit("n"), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 997).alias("amount"), F.lit(0).cast("long").alias("_time"),
        F.lit(1).cast("long").alias("_diff"))


def round_changes(rng: random.Random, workload: str, live: dict[int, tuple], next_id: int,
                  changes: int, t: int, recent_from: int) -> tuple[list[tuple], int]:
    """Half inserts, half updates of recent keys (a), or all updates of uniform keys (b).
    Each update is a retraction and an insertion (two changes)."""
    out: list[tuple] = []
    touched: set[int] = set()  # a key changes at most once a round (one row per key a time)
    while len(out) < changes:
        if workload == "recent" and rng.random() < 0.5:
            row = (next_id, f"n{next_id}", next_id % 997)
            next_id += 1
            live[row[0]] = row
            touched.add(row[0])
            out.append((*row, t, 1))
            continue
        low = recent_from if workload == "recent" else 0
        key = rng.randrange(low, next_id)
        if key in touched:
            continue
        touched.add(key)
        old = live.get(key) or (key, f"n{key}", key % 997)
        new = (key, old[1], old[2] + 1)
        live[key] = new
        out.append((*old, t, -1))
        out.append((*new, t, 1))
    return out, next_id


def full_rewrite(spark: SparkSession, base: Path, increment: Path, out: Path) -> None:
    """Seed 004's compaction: latest row per key over base + increment, the whole table
    written again."""
    union = spark.read.parquet(str(base)).unionByName(spark.read.parquet(str(increment)))
    latest = Window.partitionBy("id").orderBy(F.col("_time").desc(), F.col("_diff").desc())
    (union.withColumn("_rn", F.row_number().over(latest)).where("_rn = 1 AND _diff > 0")
     .drop("_rn").write.mode("overwrite").parquet(str(out)))


def run_size(spark: SparkSession, lake: Lake, work: Path, workload: str, rows: int, args
             ) -> dict[str, float]:
    rng = random.Random(rows)
    name = f"bench.{workload}_{rows}"
    table = lake.create_table(name, SCHEMA, key=["id"], buckets=args.buckets,
                              storage=args.format)
    table.commit(initial(spark, rows), Antichain([0]), Antichain([1]))
    policy = CompactionPolicy(fold_fraction=args.fold, max_runs=args.max_runs)
    compact(table, policy=policy)
    base = work / f"seed004_{workload}_{rows}" / "base0"
    initial(spark, rows).write.parquet(str(base))

    live: dict[int, tuple] = {}
    next_id = rows
    ours = theirs = committing = 0.0
    written = changes_total = folds = 0
    for r in range(args.rounds):
        t = r + 1
        recent_from = max(0, next_id - args.changes * 3)
        batch, next_id = round_changes(rng, workload, live, next_id, args.changes, t,
                                       recent_from)
        changes_total += len(batch)
        frame = spark.createDataFrame(batch, UPDATES)
        frame.cache().count()
        start = time.perf_counter()
        table.commit(frame, Antichain([t]), Antichain([t + 1]))
        committing += time.perf_counter() - start
        start = time.perf_counter()
        result = compact(table, policy=policy)
        ours += time.perf_counter() - start
        written += result.rows_written
        folds += len(result.folded)

        increment = work / f"seed004_{workload}_{rows}" / f"inc{t}"
        frame.write.parquet(str(increment))
        out = work / f"seed004_{workload}_{rows}" / f"base{t}"
        start = time.perf_counter()
        full_rewrite(spark, base, increment, out)
        theirs += time.perf_counter() - start
        base = out
        frame.unpersist()
    return {"ours": ours / changes_total * 1000, "theirs": theirs / changes_total * 1000,
            "commit": committing / changes_total * 1000,
            "total": (ours + committing) / changes_total * 1000,
            "written": written / changes_total, "folds": folds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000, help="table size at 1x")
    parser.add_argument("--changes", type=int, default=2_000, help="changes per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--fold", type=float, default=0.25)
    parser.add_argument("--max-runs", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply --rows and --changes")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--format", choices=("hive", "delta"), default="hive",
                        help="the lake tables' format")
    args = parser.parse_args()
    args.rows = max(100, int(args.rows * args.scale))
    args.changes = max(20, int(args.changes * args.scale))

    from changelake.lake import lake_session

    work = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    try:
        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake")
        print(f"rows at 1x: {args.rows:,}; {args.changes:,} changes per round, {args.rounds} "
              f"rounds; {args.buckets} buckets, fold at {args.fold}, master {args.master}, "
              f"format {args.format}")
        for workload in ("recent", "uniform"):
            print(f"\nworkload ({'a' if workload == 'recent' else 'b'}) {workload}")
            print(f"{'size':>5} {'rows':>10} | {'ours s/1k':>9} {'ratio':>6} {'written/chg':>11}"
                  f" {'folds':>5} | {'commit s/1k':>11} {'total s/1k':>10} {'ratio':>6}"
                  f" | {'seed004 s/1k':>12} {'ratio':>6}")
            first: dict[str, float] | None = None
            for factor in (1, 4, 16):
                res = run_size(spark, lake, work, workload, args.rows * factor, args)
                first = first or res
                print(f"{factor:>4}x {args.rows * factor:>10,} | {res['ours']:>9.3f} "
                      f"{res['ours'] / first['ours']:>6.2f} {res['written']:>11.2f} "
                      f"{int(res['folds']):>5} | {res['commit']:>11.3f} {res['total']:>10.3f} "
                      f"{res['total'] / first['total']:>6.2f} | {res['theirs']:>12.3f} "
                      f"{res['theirs'] / first['theirs']:>6.2f}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
