"""Spark decode throughput against the least any decoder must do, measured in one run.

Input: `--rows` distinct updates (default 10M) over `--files` Parquet files (default 100), each
update delivered twice, shuffled, plus the progress statements (each delivered twice). Parquet,
not the Materialize CDC codecs: generating and reading 20M rows through fastavro in Python
(~0.7M records/s, PLATFORM.md) would measure the codec, not the decoder.

Figures (rows/s are input rows, i.e. deliveries, per second):

* decode: `decode(updates, progress)` plus counting `Decoded.updates` (the result consumed once);
* (a) `dropDuplicates().count()` of the same updates: the least any decoder must do;
* (b) a bare scan `count()`: the I/O floor;
* (c) the local `Reader` on a 1M-update sample, delivered twice and shuffled, in-process.

    .venv/bin/python benchmarks/bench_spark_decode.py [--rows 10000000] [--files 100]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from changelake.protocol import Antichain, Progress, Reader, Updates
from changelake.values import Record


def generate(spark, root: Path, rows: int, files: int, times: int) -> tuple[str, str]:
    """Updates (each twice, shuffled) and statements (each twice) as Parquet."""
    from pyspark.sql import functions as F

    base = spark.range(rows).select(
        F.struct(F.col("id").alias("k"), ((F.col("id") * 7919) % 100_003).alias("v")).alias(
            "data"
        ),
        (F.col("id") % times).alias("time"),
        F.when(F.col("id") % 3 == 0, F.lit(-1)).otherwise(F.lit(1)).cast("long").alias("diff"),
    )
    updates = str(root / "updates")
    (
        base.unionByName(base)
        .withColumn("_r", F.rand(7))
        .repartition(files)
        .sortWithinPartitions("_r")
        .drop("_r")
        .write.parquet(updates)
    )
    # Statements: intervals of 50 times with exact counts (every time has rows // times or +1).
    counts = {t: rows // times + (1 if t < rows % times else 0) for t in range(times)}
    statements = []
    for lower in range(0, times, 50):
        upper = min(lower + 50, times)
        statements.append(
            ([lower], [upper], [(t, counts[t]) for t in range(lower, upper) if counts[t]])
        )
    statements.append(([times], [], []))
    statements = statements * 2
    random.Random(3).shuffle(statements)
    progress = str(root / "progress")
    spark.createDataFrame(
        statements,
        "lower array<bigint>, upper array<bigint>, counts array<struct<time:bigint,count:bigint>>",
    ).coalesce(1).write.parquet(progress)
    return updates, progress


def timed(label: str, action) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - start
    print(f"  {label:<38} {seconds:8.2f} s", flush=True)
    return seconds, result


def local_reader(sample: int, times: int) -> tuple[float, int]:
    """The pure-Python Reader on `sample` updates delivered twice, shuffled, batches of 1000."""
    rng = random.Random(5)
    updates = [
        (Record((("k", i), ("v", i * 7919 % 100_003))), i % times, -1 if i % 3 == 0 else 1)
        for i in range(sample)
    ]
    deliveries = updates * 2
    rng.shuffle(deliveries)
    messages: list = [Updates(deliveries[i : i + 1000]) for i in range(0, len(deliveries), 1000)]
    counts: dict[int, int] = {}
    for _, t, _ in updates:
        counts[t] = counts.get(t, 0) + 1
    messages.append(Progress(Antichain([0]), Antichain(), tuple(sorted(counts.items()))))
    rng.shuffle(messages)
    start = time.perf_counter()
    reader = Reader()
    out = 0
    for message in messages:
        for batch, _ in reader.push(message):
            out += len(batch)
    seconds = time.perf_counter() - start
    assert out == sample and reader.is_closed
    return seconds, len(deliveries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="distinct updates")
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--times", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=1_000_000, help="local Reader sample")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--keep", type=Path, default=None, help="reuse/keep input here")
    args = parser.parse_args()

    from changelake.spark.decode import decode
    from changelake.spark.session import build_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = build_session(args.master, app_name="bench-spark-decode",
                          conf={"spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-spark-decode-"))
    cores = os.cpu_count()
    print(f"Spark decode benchmark: {args.rows:,} distinct updates, each delivered twice, "
          f"over {args.files} Parquet files; {args.times} times; master {args.master}, "
          f"{cores} cores, driver memory {args.driver_memory}", flush=True)
    try:
        if (root / "updates").exists():
            updates_path, progress_path = str(root / "updates"), str(root / "progress")
        else:
            _, (updates_path, progress_path) = timed(
                "generate input (not measured)",
                lambda: generate(spark, root, args.rows, args.files, args.times),
            )
        deliveries = 2 * args.rows

        def frames():
            return spark.read.parquet(updates_path), spark.read.parquet(progress_path)

        def run_decode(cache: bool) -> int:
            updates, progress = frames()
            decoded = decode(updates, progress, cache=cache)
            try:
                n = decoded.updates.count()
                assert decoded.frontier == Antichain(), decoded.frontier
                return n
            finally:
                decoded.unpersist()

        results: dict[str, float] = {}
        results["scan"], n_scan = timed("(b) scan count()", lambda: frames()[0].count())
        assert n_scan == deliveries
        results["dedup"], n_dedup = timed(
            "(a) dropDuplicates().count()", lambda: frames()[0].dropDuplicates().count()
        )
        assert n_dedup == args.rows
        results["decode"], n_decoded = timed("decode + count (cached aggregate)",
                                             lambda: run_decode(True))
        assert n_decoded == args.rows
        results["decode_nocache"], _ = timed("decode + count (no cache)",
                                             lambda: run_decode(False))
        # Timed inside, without generating the sample.
        local_seconds, local_deliveries = local_reader(args.sample, args.times)
        print(f"  {f'(c) local Reader, {args.sample:,} sample':<38} {local_seconds:8.2f} s")

        def rate(seconds: float, rows: int = deliveries) -> str:
            return f"{rows / seconds / 1e6:6.2f}M rows/s"

        print("\nResults (input rows = deliveries, 2 per distinct update):")
        print(f"  decode (cached)        {results['decode']:8.2f} s  {rate(results['decode'])}")
        print(f"  decode (no cache)      {results['decode_nocache']:8.2f} s  "
              f"{rate(results['decode_nocache'])}")
        print(f"  (a) dropDuplicates     {results['dedup']:8.2f} s  {rate(results['dedup'])}")
        print(f"  (b) scan count         {results['scan']:8.2f} s  {rate(results['scan'])}")
        print(f"  (c) local Reader (1M)  {local_seconds:8.2f} s  "
              f"{rate(local_seconds, local_deliveries)}")
        print("\nRatios (time / time):")
        print(f"  decode / dropDuplicates      {results['decode'] / results['dedup']:6.2f}x"
              f"   (no cache: {results['decode_nocache'] / results['dedup']:.2f}x)")
        print(f"  decode / scan                {results['decode'] / results['scan']:6.2f}x")
        per_row_spark = results["decode"] / deliveries
        per_row_local = local_seconds / local_deliveries
        print(f"  local Reader / Spark per row {per_row_local / per_row_spark:6.2f}x")
    finally:
        spark.stop()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
