"""What a small driver-made table costs a job that reads it: `spark.createDataFrame(rows)`
(classic PySpark: an RDD of pickled rows, unpickled by Python workers) against
`changelake.spark.driver_rows` (one JSON literal read by `from_json` in the JVM).

The steps of a changefeed conversion join such tables (the caller's file names, one row per
chunk of lines): the first job that reads one in a process starts Python's workers, and every
job after runs a Python task per partition of it. Measured both ways:

* *cold*: a fresh process (`--processes` of each, alternating), its session started and one
  job run first, then timed: a table of `--rows` rows built and broadcast-joined to a million
  generated rows, counted; what the first conversion of a one-shot CLI command pays;
* *warm*: the same in one process after that, `--rounds` alternating: what each later
  conversion (a `lake follow` micro-batch) pays.

Baseline, in the same runs: the same join with the table already in the JVM (a generated range).
Printed: the median seconds of each and the differences from the baseline.

    python benchmarks/bench_driver_rows.py --processes 3 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS_SCHEMA = "file_index int, chunk bigint, _earlier bigint"


def _one(way: str, rows: int, rounds: int) -> list[float]:
    """Seconds of `rounds` joins against a table built `way` in this process (the first is
    the cold one)."""
    from pyspark.sql import functions as F

    from changelake.spark.driver_rows import driver_rows
    from changelake.spark.session import build_session

    spark = build_session("local[2]", warehouse_dir=Path(tempfile.mkdtemp()) / "warehouse")
    spark.range(10).count()  # the session and its first job, not measured
    big = spark.range(1_000_000).select((F.col("id") % 2).cast("int").alias("file_index"),
                                        (F.col("id") % rows).alias("chunk"))
    table = [(i % 2, i, i * 7) for i in range(rows)]
    build = {"createDataFrame": lambda: spark.createDataFrame(table, ROWS_SCHEMA),
             "driver_rows": lambda: driver_rows(spark, table, ROWS_SCHEMA),
             "jvm": lambda: spark.range(rows).selectExpr(
                 "CAST(id % 2 AS INT) AS file_index", "id AS chunk", "id * 7 AS _earlier")}[way]
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        big.join(F.broadcast(build()), ["file_index", "chunk"]).count()
        seconds.append(time.perf_counter() - start)
    spark.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(" ".join(f"{s:.4f}" for s in _one(args.child, args.rows, args.rounds + 1)))
        return
    ways = ("createDataFrame", "driver_rows", "jvm")
    cold: dict[str, list[float]] = {w: [] for w in ways}
    warm: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(args.processes):
        for way in ways:
            out = subprocess.run([sys.executable, __file__, "--child", way, "--rows",
                                  str(args.rows), "--rounds", str(args.rounds)],
                                 capture_output=True, text=True, check=True).stdout
            first, *rest = (float(s) for s in out.split()[-(args.rounds + 1):])
            cold[way].append(first)
            warm[way].extend(rest)
    print(f"a {args.rows}-row driver table broadcast-joined to 1M rows, counted; "
          f"{args.processes} processes each, {args.rounds} warm rounds each; local[2]")
    base_cold, base_warm = (statistics.median(d["jvm"]) for d in (cold, warm))
    for way in ways:
        c, w = statistics.median(cold[way]), statistics.median(warm[way])
        print(f"  {way:16s} cold {c:6.3f} s ({c - base_cold:+.3f} s)   "
              f"warm {w:6.3f} s ({w - base_warm:+.3f} s)")


if __name__ == "__main__":
    main()
