"""Where a Debezium ingest's time goes: the Spark path's heavy steps timed apart, against the
plain Parquet write of the same feed, in one Spark session.

The feed is `bench_ingest.py`'s (PostgreSQL, `--events` events over `events // 6` keys). Each
step is run `--rounds` times (the first round pays the JIT's warm-up) and printed with its
seconds and its ratio to the plain write of that round:

* `plain write`: `bench_ingest.plain_write`, Spark's JSON reader with an explicit schema, the
  `after` images to Parquet;
* `parse`: `parse.java_items` over the lines, to Spark's `noop` sink (nothing stored);
* `parse + facts, stored`: `debezium_path._parsed`, the parse checkpointed with its facts
  observed (what the ingest's first step does);
* `convert`: `keyed.java_convert` of the events, already typed, made `java_ready`, shuffled
  by key and checkpointed (`debezium_path.debezium_timed`, `keyed.typed_events`,
  `keyed.by_key`), to the `noop` sink: the Java pass of the ingest's conversion step
  (`conversion.checked_conversion`), without the image parse, the shuffle and the checkpoint
  written.

And the one-parse alternative for the images (`--images`), on the line text cached: the
envelope parsed with the images as text (today's `parse`, which `keyed.typed_images` then parses
again, and the inference again) or as VARIANT (parsed once: cast to the columns' types,
`schema_of_variant_agg` for the inference), each alone, with the images typed, and with the
inference, to the `noop` sink:

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import in_child, plain_write, write_feed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--images", action="store_true",
                        help="also time the images parsed once, as VARIANT")
    args = parser.parse_args()

    from pyspark.sql import DataFrame

    from changelake.spark.changefeed import debezium_path, keyed
    from changelake.spark.changefeed.parse import java_items
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

        # The events `java_convert` reads, made once, by the ingest's own steps.
        batch = debezium_path.debezium_timed(spark, read_lines(spark, [str(feed)]))
        events_frame = keyed.checkpoint(keyed.by_key(keyed.java_ready(
            keyed.typed_events(batch.changes, batch.columns, ["id"]), 1), 1,
            keyed.partitions_for(spark, batch.size)))
        columns = batch.columns

        steps: list[tuple[str, Callable[[], object]]] = [
            ("parse", lambda: noop(java_items(read_lines(spark, [str(feed)]).bounded))),
            ("parse + facts, stored",
             lambda: debezium_path._parsed(read_lines(spark, [str(feed)]))),
            ("convert", lambda: noop(keyed.java_convert(events_frame, columns, ["id"], None))),
        ]
        if args.images:
            steps += image_steps(spark, feed, noop)
        print(f"{events:,} Debezium lines, {feed.stat().st_size / 2**20:.0f} MiB, "
              f"master {args.master}")
        for n in range(args.rounds):
            start = time.perf_counter()
            plain()
            base = time.perf_counter() - start
            print(f"round {n + 1}: {'plain write':28} {base:7.2f} s   1.00x plain")
            for name, step in steps:
                start = time.perf_counter()
                step()
                took = time.perf_counter() - start
                print(f"round {n + 1}: {name:28} {took:7.2f} s {took / base:6.2f}x plain")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def image_steps(spark: Any, feed: Path,
                noop: Callable[[Any], None]) -> list[tuple[str, Callable[[], object]]]:
    """The `--images` steps (see the module docstring), over the feed's text cached."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.types import infer_images

    text = spark.read.text(str(feed)).cache()
    text.count()
    source = "source struct<connector string, snapshot string, lsn bigint, sequence string>"
    typed = "struct<id bigint, name string, amount bigint, note string>"

    def envelope(kind: str) -> Any:
        return text.select(F.from_json("value", f"op string, before {kind}, after {kind}, "
                                                f"{source}").alias("e")).select("e.*")

    def as_text_typed() -> None:
        noop(envelope("string").select(F.from_json("after", typed).alias("a"),
                                       F.from_json("before", typed).alias("b"), "op", "source"))

    def as_variant_typed() -> None:
        noop(envelope("variant").select(F.col("after").cast(typed).alias("a"),
                                        F.col("before").cast(typed).alias("b"), "op", "source"))

    return [
        ("images as text", lambda: noop(envelope("string"))),
        ("images as text, typed", as_text_typed),
        ("images as text, inferred", lambda: infer_images(
            spark, envelope("string").select(F.col("after").alias("value"))
            .where("value IS NOT NULL"))),
        ("images as VARIANT", lambda: noop(envelope("variant"))),
        ("images as VARIANT, typed", as_variant_typed),
        ("images as VARIANT, inferred", lambda: envelope("variant")
         .select(F.schema_of_variant_agg("after")).first()),
    ]


if __name__ == "__main__":
    main()
