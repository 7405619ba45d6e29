"""The Debezium parse by the Java line reader, against the I/O floor and Spark's JSON reader.

`parse.java_items` reads each line in Java (`spark/jvm/DebeziumLine.java`, in the jar
`build_session` puts on the session). The script times, to Spark's `noop` sink, `--rounds`
rounds in one session (the first, the JIT's warm-up, is not counted; medians of the rest):

* `text`: the lines as `read.read_lines` reads them, nothing parsed (the I/O floor);
* `reader`: Spark's JSON reader with the image's schema, as `bench_ingest.plain_write` reads;
* `parse, java alone`: `parse.java_items`, Java's own pass over each task's lines
  (`DebeziumLines.java`);
* `java alone, as a UDF`: the same rows by `java_items(udf=True)`, the UDF's plan (the line
  cast to binary, `is_valid_utf8`, `DebeziumLine` returning a `Row`);
* `parse step`: the ingest's whole parse step, `debezium_path._parsed`: Java's reading in the
  tasks, each task's facts and chunk rows, checkpointed (`checkpoint.stored`).

(The Spark-expression parse these were once timed against is gone: benchmarks/README.md keeps
its numbers.) The feed is `bench_ingest.py`'s (PostgreSQL, `--events` events). As a check, it
prints how many lines Java read and whether the tasks' rows are the UDF plan's.

    python benchmarks/bench_jvm_parse.py --events 1100000 --rounds 4
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import in_child, write_feed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--only", action="append", default=[],
                        help="time only this step (repeatable; the ratios are then to the "
                             "first one named)")
    args = parser.parse_args()

    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from changelake.spark.changefeed import debezium_path
    from changelake.spark.changefeed.parse import (
        JVM_LINE,
        JVM_LINE_CLASS,
        JVM_LINE_TYPE,
        java_items,
    )
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.jvm import register
    from changelake.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-jvm-parse-"))
    try:
        feed = work / "feed.jsonl"
        events = in_child(write_feed, feed, args.events)
        spark = build_session(args.master)
        spark.sparkContext.setLogLevel("ERROR")
        register(spark, JVM_LINE, JVM_LINE_CLASS, JVM_LINE_TYPE)

        def lines() -> DataFrame:
            return read_lines(spark, [str(feed)]).bounded

        def reader() -> DataFrame:
            return spark.read.schema(
                "after struct<id:bigint,name:string,amount:bigint,note:string>, op string"
            ).json(str(feed)).where("after IS NOT NULL").selectExpr("after.*")

        def parse_step() -> DataFrame:
            debezium_path._parsed(read_lines(spark, [str(feed)]))
            return spark.range(0)

        steps: dict[str, Callable[[], DataFrame]] = {
            "text": lines, "reader": reader,
            "parse, java alone": lambda: java_items(lines()),
            "java alone, as a UDF": lambda: java_items(lines(), udf=True),
            "parse step": parse_step}
        if args.only:
            steps = {name: steps[name] for name in args.only}
        taken: dict[str, list[float]] = {name: [] for name in steps}
        for n in range(args.rounds):
            for name, frame in steps.items():
                start = time.perf_counter()
                frame().write.format("noop").mode("overwrite").save()
                # The checkpoints of the parse steps: removed once the JVM collects them.
                spark.sparkContext._jvm.System.gc()  # type: ignore[union-attr]
                if n:
                    taken[name].append(time.perf_counter() - start)
        print(f"{events:,} Debezium lines, {feed.stat().st_size / 2**20:.0f} MiB, master "
              f"{args.master}; medians of rounds 2-{args.rounds}")
        first = args.only[0] if args.only else "text"
        base = statistics.median(taken[first])
        for name, seconds in taken.items():
            median = statistics.median(seconds)
            print(f"{name:24} {median:7.2f} s  {median / base:5.2f}x {first}   rounds: "
                  f"{', '.join(f'{s:.2f}' for s in seconds)}")

        read = lines().where(F.call_function(JVM_LINE, F.col("value").cast("binary"))
                            .isNotNull()).count()
        alone = java_items(lines()).drop("_deferred").localCheckpoint()
        as_udf = java_items(lines(), udf=True).drop("_deferred").localCheckpoint()
        same = alone.exceptAll(as_udf).count() == 0 == as_udf.exceptAll(alone).count()
        print(f"lines Java read: {read:,} of {lines().count():,}; the tasks' rows "
              f"{'are the UDF plan' + chr(39) + 's' if same else 'DIFFER from the UDF plan'}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
