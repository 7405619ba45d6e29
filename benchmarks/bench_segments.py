"""What a lake table's segments cost the commit after them and a read, as they accumulate
before a compaction, in one process on the embedded metastore.

The committed view reads each file set as a `parquet.`dir`` source of its own (`lake/sql.py`),
and Spark infers each source's schema with a job of its own whenever it resolves the view:
at every commit (`ALTER VIEW`) and every read. This measures how that grows: a keyed table
takes commits of `--rows` rows each, one segment each, and at each count in `--at` the next
commit and a `spark.table(...).count()` are timed (medians of `--repeat` runs, the Spark
jobs each ran counted; each timed commit adds a segment, so a count's figures are over that
many to `--repeat` - 1 more), as ratios to the first count's figures in the same run.

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

    from changelake.lake.catalog import Lake, lake_session
    from changelake.protocol import Antichain

    root = Path(tempfile.mkdtemp(prefix="bench-segments-")) / "lake"
    spark = lake_session(root, "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(spark, root)
    schema = "id bigint, name string"
    table = lake.create_table("bench.items", spark.createDataFrame([], schema).schema,
                              key=["id"])
    # The next job's id: jobs are numbered in order (the UI's job list keeps only the last
    # thousand).
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()  # type: ignore[union-attr]

    def batch(time_: int) -> object:
        return spark.range(time_ * args.rows, (time_ + 1) * args.rows).select(
            "id", F.lit("x").alias("name"), F.lit(time_).cast("long").alias("_time"),
            F.lit(1).cast("long").alias("_diff"))

    def commit(time_: int) -> None:
        table.commit(batch(time_), Antichain([time_]), Antichain([time_ + 1]))  # type: ignore[arg-type]

    def timed(action) -> tuple[float, int]:  # type: ignore[no-untyped-def]
        jobs = scheduler.nextJobId()
        start = time.perf_counter()
        action()
        return time.perf_counter() - start, scheduler.nextJobId() - jobs

    at = sorted(int(n) for n in args.at.split(","))
    figures: dict[int, tuple[float, int, float, int]] = {}
    committed = 0
    commit(committed)  # the JVM's first commit and read are not measured
    spark.table("bench.items").count()
    committed += 1
    for count in at:
        while committed < count:
            commit(committed)
            committed += 1
        commits, reads = [], []
        for _ in range(args.repeat):
            commits.append(timed(lambda at_=committed: commit(at_)))
            committed += 1
            reads.append(timed(lambda: spark.table("bench.items").count()))
        figures[count] = (statistics.median(s for s, _ in commits), commits[-1][1],
                          statistics.median(s for s, _ in reads), reads[-1][1])
        print(f"at {count:4} segments: commit {figures[count][0]:6.3f} s "
              f"({figures[count][1]} jobs), read {figures[count][2]:6.3f} s "
              f"({figures[count][3]} jobs)", flush=True)
    first = figures[min(figures)]
    print(f"\nRatios to {min(figures)} segment(s) (commit, read):")
    for count, (c, _, r, _) in figures.items():
        print(f"  {count:4} segments   {c / first[0]:5.2f}x   {r / first[2]:5.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
