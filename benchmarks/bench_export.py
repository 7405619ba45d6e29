"""Incremental export to Delta: cost per changed row as the table grows 16x.

For each table size (1x, 4x, 16x of `--rows`) a lake table is filled in one commit and
exported whole (`export_to_delta`, first run), then `--rounds` rounds each commit the same
volume of changes (`--changes` changed rows: updates, a tenth inserts of new keys, a tenth
deletes) and export them incrementally. Workloads:

* keyed-recent: the updates and deletes are of keys inserted in the last rounds (a Delta MERGE
  on the key, which prunes the Delta files by their key ranges: the full export wrote them in
  key order, `--file-size` bytes each);
* keyed-uniform: of keys drawn uniformly from the whole table (every Delta file holds some:
  Delta is copy-on-write, so this rewrites the table, whatever the exporter does);
* unkeyed-uniform: a multiset, uniform changes (retractions need the rows' multiplicities,
  which Spark sums over the table's files).

Printed per size: the full first export in seconds, the incremental exports in seconds per
1,000 changed rows and their ratio to the 1x size (flat is ~1, growing with the table is ~4 and
~16), and from the Delta commits' own metrics the target files rewritten and the rows copied
per changed row (Delta rewrites every file that holds a changed row: copy-on-write).
`--file-size` is small by default so that the Delta tables of these sizes have several files.

    python benchmarks/bench_export.py                 # default sizes
    python benchmarks/bench_export.py --rows 2000     # a quick run
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import SparkSession

# The table and its first rows as the compaction benchmark makes them (run as a script, this
# folder is on the path).
from bench_compaction import SCHEMA, UPDATES, initial
from changelake.lake import Lake
from changelake.lake.export import export_to_delta


def round_changes(rng: random.Random, live: dict[int, tuple | None], next_id: int,
                  changes: int, t: int, low: int) -> tuple[list[tuple], int]:
    """`changes` changed rows: mostly updates of keys from `low` on (a retraction and an
    insertion), a tenth inserts of new keys and a tenth deletes."""
    out: list[tuple] = []
    done = 0
    while done < changes:
        roll = rng.random()
        if roll < 0.1:
            row = (next_id, f"n{next_id}", next_id % 997)
            live[next_id] = row
            next_id += 1
            out.append((*row, t, 1))
        else:
            key = rng.randrange(low, next_id)
            old = live.get(key, (key, f"n{key}", key % 997))
            if old is None:
                continue  # deleted earlier
            out.append((*old, t, -1))
            if roll < 0.2:
                live[key] = None
            else:
                new = (key, old[1], old[2] + 1)
                live[key] = new
                out.append((*new, t, 1))
        done += 1
    return out, next_id


def run_size(spark: SparkSession, lake: Lake, work: Path, workload: str, rows: int, args
             ) -> dict[str, float]:
    rng = random.Random(rows)
    keyed = workload.startswith("keyed")
    name = f"bench.{workload.replace('-', '_')}_{rows}"
    table = lake.create_table(name, SCHEMA, key=["id"] if keyed else (), buckets=args.buckets)
    table.commit(initial(spark, rows), 0, 1)
    path = work / f"{name}.delta"
    start = time.perf_counter()
    export_to_delta(lake, name, path, target_file_size=args.file_size)
    full = time.perf_counter() - start

    live: dict[int, tuple | None] = {}  # keys changed so far (None: deleted)
    next_id = rows
    seconds = 0.0
    changed = files = copied = 0
    for r in range(args.rounds):
        t = r + 1
        low = max(0, next_id - 3 * args.changes) if workload.endswith("recent") else 0
        batch, next_id = round_changes(rng, live, next_id, args.changes, t, low)
        table.commit(spark.createDataFrame(batch, UPDATES), t, t + 1)
        start = time.perf_counter()
        result = export_to_delta(lake, name, path)
        seconds += time.perf_counter() - start
        assert result.mode == "incremental", result
        changed += args.changes
        metrics = DeltaTable(str(path)).history(1)[0].get("operationMetrics", {})
        files += int(metrics.get("num_target_files_removed", 0))
        copied += int(metrics.get("num_target_rows_copied", 0))
    return {"full": full, "per_1k": seconds / changed * 1000, "files": files / args.rounds,
            "copied": copied / changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="table size at 1x")
    parser.add_argument("--changes", type=int, default=1_000, help="changed rows per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--workloads", default="keyed-recent,keyed-uniform,unkeyed-uniform",
                        help="comma-separated: keyed-recent, keyed-uniform, unkeyed-uniform")
    parser.add_argument("--file-size", type=int, default=1 << 20,
                        help="bytes per Delta file of the full export")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    args.changes = min(args.changes, max(10, args.rows // 10))

    from changelake.lake import lake_session

    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        spark = lake_session(work / "lake", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        lake = Lake(spark, work / "lake")
        print(f"rows at 1x: {args.rows:,}; {args.changes:,} changed rows per round, "
              f"{args.rounds} rounds; master {args.master}")
        for workload in args.workloads.split(","):
            print(f"\n{workload}")
            print(f"{'size':>5} {'rows':>10} | {'full s':>7} | {'incr s/1k':>9} {'ratio':>6} "
                  f"{'files/round':>11} {'copied/chg':>10}")
            first: dict[str, float] | None = None
            for factor in (1, 4, 16):
                res = run_size(spark, lake, work, workload, args.rows * factor, args)
                first = first or res
                print(f"{factor:>4}x {args.rows * factor:>10,} | {res['full']:>7.2f} | "
                      f"{res['per_1k']:>9.3f} {res['per_1k'] / first['per_1k']:>6.2f} "
                      f"{res['files']:>11.1f} {res['copied']:>10.1f}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
