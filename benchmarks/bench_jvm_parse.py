"""The Debezium parse with the Java line reader against the Spark functions alone, in one run.

`parse.parse_items` reads each line in Java (`spark/jvm/DebeziumLine.java`, a UDF in the jar
`build_session` puts on the session), and leaves the lines Java does not read to the Spark
functions; `parse_items(..., jvm=False)` reads every line with the Spark functions. The script
times, to Spark's `noop` sink, `--rounds` rounds in one session (the first, the JIT's warm-up,
is not counted; medians of the rest):

* `text`: the lines as `read.read_lines` reads them, nothing parsed (the I/O floor);
* `reader`: Spark's JSON reader with the image's schema, as `bench_ingest.plain_write` reads;
* `parse, java alone`: `parse.java_items`, Java's reading with none of the Spark functions'
  (the ingest's parse where Java reads every line of the batch: `debezium_path._parsed`): Java's
  own pass over each task's lines (`DebeziumLines.java`);
* `java alone, as a UDF`: the same rows by `java_items(udf=True)`, the UDF's plan (the line
  cast to binary, `is_valid_utf8`, `DebeziumLine` returning a `Row`);
* `parse step`: the ingest's whole parse step, `debezium_path._parsed`: Java's reading in the
  tasks, each task's facts and chunk rows, checkpointed (`checkpoint.stored`);
* `parse step, UDF and aggregates`: the same step as it was before Java read the tasks'
  lines itself: the UDF's plan (`java_items(udf=True)`) with `debezium_path._facts` observed over
  every line, checkpointed;
* `parse, java`: `parse_items` with the jar (Java's lines and the Spark functions' for the
  rest: the ingest's parse where Java leaves a line);
* `parse, spark functions`: `parse_items(jvm=False)`.

The feed is `bench_ingest.py`'s (PostgreSQL, `--events` events). As a check, it prints how many
lines Java read and whether the parses give the same rows (`exceptAll` both ways).

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

    from pyspark.sql import DataFrame, Observation
    from pyspark.sql import functions as F

    from changelake.spark.changefeed import debezium_path
    from changelake.spark.changefeed.parse import (
        JVM_LINE,
        JVM_LINE_CLASS,
        JVM_LINE_TYPE,
        java_items,
        parse_items,
    )
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.checkpoint import stored
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

        def parse_step_before() -> DataFrame:
            observed = Observation()
            java = java_items(lines(), udf=True)
            left = F.count_if(F.col("_deferred")).alias("_deferred")
            stored(java.observe(observed, *debezium_path._facts(), left,
                                F.collect_set("shape").alias("shapes"))
                   .drop("_deferred", "shape", *debezium_path._FACTS_ONLY))
            assert not observed.get["_deferred"]
            return spark.range(0)

        steps: dict[str, Callable[[], DataFrame]] = {
            "text": lines, "reader": reader,
            "parse, java alone": lambda: java_items(lines()),
            "java alone, as a UDF": lambda: java_items(lines(), udf=True),
            "parse step": parse_step, "parse step, UDF and aggregates": parse_step_before,
            "parse, java": lambda: parse_items(lines()),
            "parse, spark functions": lambda: parse_items(lines(), jvm=False)}
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
        first = args.only[0] if args.only else "parse, spark functions"
        base = statistics.median(taken[first])
        for name, seconds in taken.items():
            median = statistics.median(seconds)
            print(f"{name:24} {median:7.2f} s  {median / base:5.2f}x {first}   rounds: "
                  f"{', '.join(f'{s:.2f}' for s in seconds)}")

        read = lines().where(F.call_function(JVM_LINE, F.col("value").cast("binary"))
                            .isNotNull()).count()
        alone = java_items(lines())
        assert alone is not None
        alone = alone.drop("_deferred").localCheckpoint()
        java = parse_items(lines()).localCheckpoint()
        functions = parse_items(lines(), jvm=False).localCheckpoint()
        same = java.exceptAll(functions).count() == 0 == functions.exceptAll(java).count()
        if read == lines().count():  # Java read every line: its reading alone is the parse
            bare = alone.drop("shape")  # the images' shapes: Java's reading alone has them
            same = same and bare.exceptAll(functions).count() == 0 \
                == functions.exceptAll(bare).count()
        as_udf = java_items(lines(), udf=True)
        assert as_udf is not None
        as_udf = as_udf.drop("_deferred").localCheckpoint()
        same = same and alone.exceptAll(as_udf).count() == 0 == as_udf.exceptAll(alone).count()
        print(f"lines Java read: {read:,} of {lines().count():,}; the parses "
              f"{'give the same rows' if same else 'DIFFER'} (Java alone too, where it read "
              "every line)")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
