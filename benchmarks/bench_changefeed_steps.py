"""Where a Debezium ingest's time goes: the JVM path's heavy steps timed apart, against the
plain Parquet write of the same feed, in one Spark session.

The feed is `bench_ingest.py`'s (PostgreSQL, `--events` events over `events // 6` keys). Each
step is run `--rounds` times (the first round pays the JIT's warm-up) and printed with its
seconds and its ratio to the plain write of that round:

* `plain write`: `bench_ingest.plain_write`, Spark's JSON reader with an explicit schema, the
  `after` images to Parquet;
* `parse`: `parse.parse_items` over the lines, to Spark's `noop` sink (nothing stored);
* `parse + facts, stored`: `pipeline._parsed`, the parse checkpointed with its facts
  observed (what the ingest's first step does);
* `convert`: `keyed.convert` of the events, already typed, shuffled by key and checkpointed
  by the ingest's own steps (`pipeline.debezium_timed`, `pipeline.checked_events`), to the
  `noop` sink (the windows and the consolidation of the ingest's last job, without the lake's
  write).

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

from bench_ingest import in_child, plain_write, write_feed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    from pyspark.sql import DataFrame

    from changelake.spark.changefeed import keyed, pipeline
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
            shutil.rmtree(work / "plain.parquet", ignore_errors=True)  # the last round's
            plain_write(spark, [feed], "debezium", work / "plain.parquet")

        # The events `convert` reads, made once, by the ingest's own steps.
        batch = pipeline.debezium_timed(spark, read_lines(spark, [str(feed)]))
        events_frame = pipeline.checked_events(
            keyed.typed_events(batch.changes, batch.columns, ["id"]), 1, batch.size)
        columns = batch.columns

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
