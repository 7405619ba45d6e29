"""What a lake table's segments cost the commit after them and a read, as they accumulate
before a compaction, in one process on the embedded metastore.

Spark resolves each `parquet.`path`` source of the committed view with a listing, a footer
read and a schema-inference job of its own, whenever it resolves the view: at every commit
(`ALTER VIEW`) and every read. The view reads the segments of one physical schema as one
source, a glob of their names (`lake/sql.py`, `group_sources`); until 2026-11-29 it read
each segment as a source of its own, a job each. This measures how a commit and a read grow
with the segments: a keyed table takes commits of `--rows` rows each, one segment each, and
at each count in `--at` the next commit and a `spark.table(...).count()` are timed (medians
of `--repeat` runs, the Spark jobs each ran counted; each timed commit adds a segment, so a
count's figures are over that many to `--repeat` - 1 more), as ratios to the first count's
figures in the same run, and both ways alternated: the glob against a source per segment
(the view as it was, `--at` segments each).

    python benchmarks/bench_segments.py --at 1,11,21,41
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", default="1,11,21,41", help="segment counts to time at")
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from changelake.lake import sql
    from changelake.lake.catalog import Lake, lake_session
    from changelake.protocol import Antichain

    root = Path(tempfile.mkdtemp(prefix="bench-segments-")) / "lake"
    spark = lake_session(root, "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(spark, root)
    schema = spark.createDataFrame([], "id bigint, name string").schema
    # The next job's id: jobs are numbered in order (the UI's job list keeps only the last
    # thousand).
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()  # type: ignore[union-attr]
    grouped_segments = sql._segments

    def apart(files: object, table_dir: object) -> object:  # the view as it was: a source
        return list(files)  # type: ignore[call-overload]                    # per segment

    ways = {"glob": grouped_segments, "apart": apart}
    tables = {way: lake.create_table(f"bench.items_{way}", schema, key=["id"])
              for way in ways}
    committed = dict.fromkeys(ways, 0)

    def batch(time_: int) -> object:
        return spark.range(time_ * args.rows, (time_ + 1) * args.rows).select(
            "id", F.lit("x").alias("name"), F.lit(time_).cast("long").alias("_time"),
            F.lit(1).cast("long").alias("_diff"))

    def commit(way: str) -> None:
        sql._segments = ways[way]  # type: ignore[assignment]
        try:
            at = committed[way]
            tables[way].commit(batch(at), Antichain([at]), Antichain([at + 1]))  # type: ignore[arg-type]
            committed[way] += 1
        finally:
            sql._segments = grouped_segments

    def read(way: str) -> None:
        spark.table(f"bench.items_{way}").count()

    def timed(action, way: str) -> tuple[float, int]:  # type: ignore[no-untyped-def]
        jobs = scheduler.nextJobId()
        start = time.perf_counter()
        action(way)
        return time.perf_counter() - start, scheduler.nextJobId() - jobs

    for way in ways:  # the JVM's first commit and read are not measured
        commit(way)
        read(way)
    at = sorted(int(n) for n in args.at.split(","))
    figures: dict[tuple[int, str], tuple[float, int, float, int]] = {}
    for count in at:
        for way in ways:
            while committed[way] < count:
                commit(way)
        commits: dict[str, list[tuple[float, int]]] = {way: [] for way in ways}
        reads: dict[str, list[tuple[float, int]]] = {way: [] for way in ways}
        for _ in range(args.repeat):  # the two ways alternated
            for way in ways:
                commits[way].append(timed(commit, way))
                reads[way].append(timed(read, way))
        for way in ways:
            figures[count, way] = (statistics.median(s for s, _ in commits[way]),
                                   commits[way][-1][1],
                                   statistics.median(s for s, _ in reads[way]),
                                   reads[way][-1][1])
            c, cj, r, rj = figures[count, way]
            print(f"at {count:4} segments, {way:5}: commit {c:6.3f} s ({cj} jobs), "
                  f"read {r:6.3f} s ({rj} jobs)", flush=True)
    first = min(at)
    print(f"\nRatios (commit, read): to {first} segment(s) the same way; glob to apart")
    for count in at:
        glob, apart_ = figures[count, "glob"], figures[count, "apart"]
        line = "  ".join(
            f"{way} {figures[count, way][0] / figures[first, way][0]:5.2f}x "
            f"{figures[count, way][2] / figures[first, way][2]:5.2f}x" for way in ways)
        print(f"  {count:4} segments   {line}   glob/apart {glob[0] / apart_[0]:5.2f}x "
              f"{glob[2] / apart_[2]:5.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
