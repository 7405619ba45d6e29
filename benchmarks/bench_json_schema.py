"""Typing schemaless Materialize CDC rows: Spark's JSON inference over the updates' `data` texts
(`lake.ingest.materialize_frames`, `lake follow`), the texts handed over as a Python RDD
(`.rdd.map(lambda row: row[0])`, the way it was) against the JVM's reader on the column itself
(`spark.json_schema.infer_json_schema`).

`--rows` JSON objects (generated in the JVM, a few columns of mixed types, cached first), then
`--rounds` rounds alternating the two; baseline in the same rounds: `count()` of the texts.
Printed: the median seconds of each, and as multiples of the baseline.

    python benchmarks/bench_json_schema.py --rows 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from changelake.spark.json_schema import infer_json_schema
    from changelake.spark.session import build_session

    spark = build_session("local[2]", warehouse_dir=Path(tempfile.mkdtemp()) / "warehouse")
    texts = spark.range(args.rows).select(F.to_json(F.struct(
        F.col("id").alias("id"), (F.col("id") * 0.5).alias("price"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        F.when(F.col("id") % 7 == 0, F.lit(None)).otherwise(F.col("id") % 3 == 0).alias("ok"),
    )).alias("data")).cache()
    texts.count()

    ways = {
        "count() of the texts": lambda: texts.count(),
        "Python RDD (before)": lambda: spark.read.json(
            texts.rdd.map(lambda row: row[0])).schema,
        "infer_json_schema": lambda: infer_json_schema(texts),
    }
    assert ways["Python RDD (before)"]() == ways["infer_json_schema"]()  # and warm both
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["count() of the texts"])
    print(f"{args.rows:,} JSON texts (cached), {args.rounds} rounds, medians, local[2]")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:22s} {median:7.2f} s  {median / base:6.1f}x count")
    spark.stop()


if __name__ == "__main__":
    main()
