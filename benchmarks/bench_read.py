"""`changelake snapshot` and `status` on the Arrow path against the Spark path (issue 12).

One keyed lake table of `--rows` keys: inserted at times [0, 10), then a tenth of the keys
updated (retraction + insertion) at times [10, 20), as two commits made through the library on
the lake's embedded metastore. Then, as a user runs them, each a fresh process: `snapshot`
(now), `snapshot --as-of 9` and `status`, with `--engine arrow` and `--engine spark`; the
figure is the wall time of each, and the ratio spark/arrow (what a user waits, JVM and
metastore start-up included). Both engines' snapshots are checked to print the same rows.

The baseline of the JVM-free reads is a process that only imports `pyarrow.parquet` (the
least a Python reader of Parquet pays): `arrow/import` is each Arrow read's median over that
process's median, measured in the same run (issue 65's aim: within 4x, on either format).

    .venv/bin/python benchmarks/bench_read.py [--rows N] [--repeat R] [--workdir DIR]
        [--format hive|delta] [--no-spark]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

CLI = [sys.executable, "-m", "changelake"]


TABLE = "bench.orders"


def make_lake(lake: Path, rows: int, storage: str) -> None:
    from pyspark.sql import functions as F

    from changelake.lake import Lake, lake_session

    spark = lake_session(lake, "local[2]")
    try:
        spark.sparkContext.setLogLevel("ERROR")
        table = Lake(spark, lake, storage=storage).create_table(
            TABLE, spark.range(0).select(
                F.col("id"), F.lit(0).cast("long").alias("v"),
                F.lit("x").alias("note")).schema, key=["id"], buckets=4)
        first = spark.range(rows).select(
            "id", (F.col("id") * 7 % 1000).alias("v"), F.concat(F.lit("n"), F.col("id") % 13)
            .alias("note"), (F.col("id") % 10).alias("_time"), F.lit(1).cast("long")
            .alias("_diff"))
        table.commit(first, 0, 10)
        touched = first.where(F.col("id") % 10 == 0)
        second = touched.select("id", "v", "note", (F.col("_time") + 10).alias("_time"),
                                F.lit(-1).cast("long").alias("_diff")).unionByName(
            touched.select("id", (F.col("v") + 1).alias("v"), "note",
                           (F.col("_time") + 10).alias("_time"), F.col("_diff")))
        table.commit(second, 10, 20)
    finally:
        spark.stop()


def run(args: list[str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    done = subprocess.run([*CLI, *args], capture_output=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--format", choices=("hive", "delta"), default="hive",
                        help="the table's format")
    parser.add_argument("--no-spark", action="store_true",
                        help="the Arrow reads and their baseline only")
    parser.add_argument("--make-lake", type=Path, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.make_lake is not None:  # the child process that makes the lake
        make_lake(options.make_lake, options.rows, options.format)
        return
    root = options.workdir or Path(tempfile.mkdtemp(prefix="bench-read-"))
    lake = root / "lake"
    started = time.perf_counter()
    # In a process of its own: its JVM holds the embedded metastore until it exits.
    subprocess.run([sys.executable, __file__, "--rows", str(options.rows), "--format",
                    options.format, "--make-lake", str(lake)], check=True, timeout=3600)
    table = TABLE
    print(f"table {table} ({options.format}): {options.rows:,} keys, 2 commits "
          f"(made in {time.perf_counter() - started:.1f} s); median of {options.repeat}")
    imports = []
    for _ in range(options.repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import pyarrow.parquet"], check=True)
        imports.append(time.perf_counter() - start)
    baseline = statistics.median(imports)
    print(f"{'import pyarrow.parquet':<20} {baseline:7.2f} s (a process that only imports it)")
    engines = ("arrow",) if options.no_spark else ("arrow", "spark")
    base = ["--lake", str(lake)]
    reads = {
        "snapshot": ["snapshot", *base, "--table", table, "--format", "jsonl"],
        "snapshot --as-of 9": ["snapshot", *base, "--table", table, "--as-of", "9",
                               "--format", "jsonl"],
        "status": ["status", *base, "--format", "jsonl"],
    }
    for what, args in reads.items():
        times: dict[str, list[float]] = {e: [] for e in engines}
        outputs: dict[str, bytes] = {}
        for _ in range(options.repeat):
            for engine in engines:
                elapsed, out = run([*args, "--engine", engine])
                times[engine].append(elapsed)
                outputs[engine] = out
        a = statistics.median(times["arrow"])
        line = f"{what:<20} arrow {a:7.2f} s   arrow/import {a / baseline:5.1f}x"
        if "spark" in engines:
            arrow_out, spark_out = (Counter(outputs[e].splitlines()) for e in engines)
            assert arrow_out == spark_out, f"{what}: the engines printed different rows"
            s = statistics.median(times["spark"])
            line += f"   spark {s:7.2f} s   spark/arrow {s / a:6.1f}x"
        print(line)


if __name__ == "__main__":
    main()
