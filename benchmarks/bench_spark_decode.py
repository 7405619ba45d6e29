"""Spark decode throughput against the least any decoder must do, measured in one run.

Input: `--rows` distinct updates (default 500k, i.e. 1M input rows; or `--input-rows`, twice
that) over `--files` Parquet files (default 20), each update delivered twice, shuffled, plus
the progress statements (each delivered twice). With `--together`, an update's copies are in
one file (shuffled within it) instead of anywhere; `--copies` delivers each update that many
times instead of twice (`--input-rows` is then `--copies` times `--rows`). Parquet, not the
Materialize CDC codecs: generating and reading millions of rows through fastavro in Python
would measure the codec, not the decoder.

The session is Spark's default as far as partitioning goes (`spark.sql.shuffle.partitions`
200, adaptive execution on), not the project's tuned one: `--shuffle-partitions` changes it.
After `--warmup` unmeasured rounds of each (default 12: the JVM's compiler goes on making
both faster over the first dozen, the decode, which plans more on the driver, the more; at 1M
input rows the ratio after 3 was 1.15-1.30x and after 12-15 1.04-1.05x: benchmarks/README.md,
2026-12-04 night), the pair below is measured `--repeat` times (default 3),
alternating, and the median of the per-round ratios is reported (rows/s count input rows):

* decode: `decode(updates, progress)` plus counting `Decoded.updates` (the result consumed
  once), then `unpersist()`; also printed, the time until `decode` returned (the frontier
  known, the result cached and not yet read) against the same round's (a);
* (a) `dropDuplicates().count()` of the same updates: the least any decoder must do;
* (b) a bare scan `count()`: the I/O floor (once);
* (d) after each round, one job of one row (`spark.range(1).count()`) against the round's
  (a): the least that reading a decode's result adds, whatever the decode;
* (c) the local `Reader` on a `--sample` of updates, delivered twice and shuffled, in-process.

It also prints how many Spark jobs one decode + count and one dropDuplicates().count() ran.

    .venv/bin/python benchmarks/bench_spark_decode.py [--input-rows 1000000] [--files 20]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from changelake.protocol import Antichain, Progress, Reader, Updates
from changelake.values import Record


def generate(spark, root: Path, rows: int, files: int, times: int, copies: int = 2,
             together: bool = False) -> tuple[str, str]:
    """Updates (each `copies` times, shuffled; in one file each `together`) and statements
    (each twice) as Parquet."""
    from pyspark.sql import functions as F

    base = spark.range(rows).select(
        F.struct(F.col("id").alias("k"), ((F.col("id") * 7919) % 100_003).alias("v")).alias(
            "data"
        ),
        (F.col("id") % times).alias("time"),
        F.when(F.col("id") % 3 == 0, F.lit(-1)).otherwise(F.lit(1)).cast("long").alias("diff"),
    )
    updates = str(root / "updates")
    delivered = base
    for _ in range(copies - 1):
        delivered = delivered.unionByName(base)
    placed = delivered.withColumn("_r", F.rand(7))
    placed = placed.repartition(files, "data") if together else placed.repartition(files)
    placed.sortWithinPartitions("_r").drop("_r").write.parquet(updates)
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
    parser.add_argument("--rows", type=int, default=500_000, help="distinct updates")
    parser.add_argument("--input-rows", type=int, default=None,
                        help="input rows (deliveries) instead: --rows is it over --copies")
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--times", type=int, default=1000)
    parser.add_argument("--copies", type=int, default=2, help="deliveries of each update")
    parser.add_argument("--together", action="store_true",
                        help="an update's copies in one file, not anywhere")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=12, help="unmeasured rounds first")
    parser.add_argument("--shuffle-partitions", type=int, default=200)
    parser.add_argument("--sample", type=int, default=1_000_000,
                        help="local Reader sample (0: skip)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--keep", type=Path, default=None, help="reuse/keep input here")
    args = parser.parse_args()
    if args.input_rows is not None:
        args.rows = args.input_rows // args.copies

    from changelake.spark.decoder import decode
    from changelake.spark.session import build_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cores = os.cpu_count() or 1
    spark = build_session(args.master, app_name="bench-spark-decode", conf={
        "spark.driver.memory": args.driver_memory,
        "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
        "spark.default.parallelism": str(cores),  # Spark's own default for local[*]
    })
    spark.sparkContext.setLogLevel("ERROR")
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-spark-decode-"))
    deliveries = args.copies * args.rows
    together = "(in one file each) " if args.together else ""
    print(f"Spark decode benchmark: {args.rows:,} distinct updates, each delivered "
          f"{args.copies} times {together}({deliveries:,} input rows), over {args.files} "
          f"Parquet files; {args.times} times; "
          f"master {args.master}, {cores} cores, shuffle partitions {args.shuffle_partitions}, "
          f"driver memory {args.driver_memory}", flush=True)
    try:
        if (root / "updates").exists():
            updates_path, progress_path = str(root / "updates"), str(root / "progress")
        else:
            _, (updates_path, progress_path) = timed(
                "generate input (not measured)",
                lambda: generate(spark, root, args.rows, args.files, args.times, args.copies,
                                 args.together),
            )

        def frames():
            return spark.read.parquet(updates_path), spark.read.parquet(progress_path)

        jobs: dict[str, int] = {}

        def counting_jobs(label: str, action):
            """Run `action` in a job group of its own and note how many Spark jobs it ran."""
            def run():
                context = spark.sparkContext
                group = f"{label}-{time.monotonic_ns()}"
                context.setJobGroup(group, label)
                try:
                    return action()
                finally:
                    jobs[label] = len(context.statusTracker().getJobIdsForGroup(group))
                    context.setLocalProperty("spark.jobGroup.id", None)
            return run

        decode_alone: list[float] = []  # per call: until `decode` returned

        def decode_and_count() -> int:
            start = time.perf_counter()
            with decode(*frames()) as decoded:
                decode_alone.append(time.perf_counter() - start)
                assert decoded.frontier == Antichain(), decoded.frontier
                return decoded.updates.count()

        run_decode = counting_jobs("decode + count", decode_and_count)
        run_dedup = counting_jobs("dropDuplicates", lambda: frames()[0].dropDuplicates().count())

        scan, n_scan = timed("(b) scan count()", lambda: frames()[0].count())
        assert n_scan == deliveries
        for _ in range(args.warmup):
            timed("warm-up: (a) (not measured)", run_dedup)
            timed("warm-up: decode (not measured)", run_decode)
        rounds: list[tuple[float, float]] = []
        alone: list[float] = []  # decode alone / dropDuplicates, per round
        smallest: list[float] = []  # one job of one row / dropDuplicates, per round
        for r in range(args.repeat):
            pair = [("(a) dropDuplicates().count()", run_dedup), ("decode + count", run_decode)]
            if r % 2:
                pair.reverse()
            measured = {}
            for label, action in pair:
                measured[label], n = timed(f"round {r + 1}: {label}", action)
                assert n == args.rows, n
            rounds.append((measured["decode + count"], measured["(a) dropDuplicates().count()"]))
            alone.append(decode_alone[-1] / measured["(a) dropDuplicates().count()"])
            one_job, _ = timed(f"round {r + 1}: (d) one small job", lambda: spark.range(1).count())
            smallest.append(one_job / measured["(a) dropDuplicates().count()"])
        ratios = sorted(d / a for d, a in rounds)
        decode_s = statistics.median(d for d, _ in rounds)
        dedup_s = statistics.median(a for _, a in rounds)

        local = local_reader(args.sample, args.times) if args.sample else None

        def rate(seconds: float, rows: int = deliveries) -> str:
            return f"{rows / seconds / 1e6:6.2f}M rows/s"

        print(f"\nResults (input rows = deliveries, {args.copies} per distinct update; median of "
              f"{args.repeat}):")
        print(f"  decode + count         {decode_s:8.2f} s  {rate(decode_s)}")
        print(f"  (a) dropDuplicates     {dedup_s:8.2f} s  {rate(dedup_s)}")
        print(f"  (b) scan count         {scan:8.2f} s  {rate(scan)}")
        if local is not None:
            print(f"  (c) local Reader       {local[0]:8.2f} s  {rate(*local)}  "
                  f"({args.sample:,} sample)")
        print("\nRatios (time / time):")
        print(f"  decode / dropDuplicates      {statistics.median(ratios):6.2f}x  (median; "
              f"rounds: {', '.join(f'{x:.2f}' for x in ratios)}; aim <= 1.10)")
        print(f"  decode alone / dropDup.      {statistics.median(alone):6.2f}x  (median; "
              f"rounds: {', '.join(f'{x:.2f}' for x in sorted(alone))}: until `decode` "
              "returned, the frontier known and the result cached, not yet read)")
        print(f"  one small job / dropDup.     {statistics.median(smallest):6.2f}x  (median: "
              "spark.range(1).count(), the least a read of the result adds to a decode as "
              "fast as the dedup)")
        print(f"  decode / scan                {decode_s / scan:6.2f}x")
        print(f"Spark jobs (last round): decode + count {jobs['decode + count']}, "
              f"dropDuplicates().count() {jobs['dropDuplicates']}")
        if local is not None:
            print(f"  local Reader / Spark per row "
                  f"{(local[0] / local[1]) / (decode_s / deliveries):6.2f}x")
    finally:
        spark.stop()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
