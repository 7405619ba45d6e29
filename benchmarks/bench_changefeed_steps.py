"""Where a Debezium ingest's time goes: the JVM path's heavy steps timed apart, against the
plain Parquet write of the same feed, in one Spark session.

The feed is `bench_ingest.py`'s (PostgreSQL, `--events` events over `events // 6` keys). Each
step is run `--rounds` times (the first round pays the JIT's warm-up) and printed with its
seconds and its ratio to the plain write of that round:

* `plain write`: Spark's JSON reader with an explicit schema, the `after` images to Parquet;
* `parse`: `parse.parse_items` over the lines, to Spark's `noop` sink (nothing stored);
* `parse + facts, stored`: `pipeline._parsed`, the parse checkpointed with its facts
  observed (what the ingest's first step does);
* `convert`: `keyed.convert` of the events, already typed, shuffled by key and checkpointed,
  to the `noop` sink (the windows and the consolidation of the ingest's last job, without
  the lake's write).

    python benchmarks/bench_changefeed_steps.py --events 1100000 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
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
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from changelake.spark.changefeed import keyed, pipeline, times
    from changelake.spark.changefeed.parse import parse_items
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-steps-"))
    try:
        feed = work / "feed.jsonl"
        events = in_child(write_feed, feed, args.events)
        spark = build_session(args.master)
        spark.sparkContext.setLogLevel("ERROR")

        def noop(frame: DataFrame) -> None:
            frame.write.format("noop").mode("overwrite").save()

        def plain() -> None:
            spark.read.schema("after struct<id:bigint,name:string,amount:bigint,note:string>") \
                .json(str(feed)).where("after IS NOT NULL").select("after.*") \
                .write.mode("overwrite").parquet(str(work / "plain.parquet"))

        # The events `convert` reads, made once, as the ingest makes them.
        items, facts = pipeline._parsed(read_lines(spark, [str(feed)]))
        changes = items.where(F.col("kind") == "change")
        timed = times.assign_times(spark, changes, by_tx=bool(facts["by_tx"]),
                                   untimed=int(facts["untimed"]))
        columns = pipeline._columns(spark, changes, facts, None, None)
        wanted = ["k0", "time", "pos", "rank", "is_delete", "a", "ua", "b", "ub"]
        events_frame = keyed.checkpoint(keyed.by_key(
            keyed.typed_events(timed, columns, ["id"]).select(*wanted), 1))

        steps: list[tuple[str, Callable[[], object]]] = [
            ("parse", lambda: noop(parse_items(read_lines(spark, [str(feed)]).bounded))),
            ("parse + facts, stored", lambda: pipeline._parsed(read_lines(spark,
                                                                         [str(feed)]))),
            ("convert", lambda: noop(keyed.convert(events_frame, columns, ["id"], None))),
        ]
        print(f"{events:,} Debezium lines, {feed.stat().st_size / 2**20:.0f} MiB, "
              f"master {args.master}")
        for n in range(args.rounds):
            start = time.perf_counter()
            plain()
            base = time.perf_counter() - start
            print(f"round {n + 1}: {'plain write':24} {base:7.2f} s   1.00x plain")
            for name, step in steps:
                start = time.perf_counter()
                step()
                took = time.perf_counter() - start
                print(f"round {n + 1}: {name:24} {took:7.2f} s {took / base:6.2f}x plain")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
