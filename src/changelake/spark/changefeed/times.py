"""Step 4, times: the CDCv2 time of every change, with windows by transaction and by file.

The sequential encoder derives two kinds of time from what came before a line; here each is a
window whose partitions are small, never one global window:

* A MySQL GTID, or a PostgreSQL transaction without `sequence`, takes the time of the first
  event the parser saw with that transaction id (`DebeziumParser._tx_time`). Here: the least
  over the transaction's events (`partitionBy(tx)`), which is the first's for a connector that
  emits in commit order. Only rows marked `tx_min` by the parser take part.
* A change without a time of its own (a snapshot row) is placed at the stream's current time
  (`WindowedConverter.current_time`): the highest time of the changes before it, in the order
  the encoder reads them (file by file, line by line), or 0. Here: within its file, the
  highest time of the earlier lines of its chunk of its block (`partitionBy(file, block,
  chunk)`, see `read.py`; a chunk is 2**`CHUNK_BITS` consecutive rows, so that the window runs
  in many small partitions), and of the earlier chunks and files (one aggregate row per
  chunk). Only the narrow `(file, block, row, time)` columns are shuffled, and only when the
  batch has such changes; the times found are broadcast back to the changes when they are few
  (`BROADCAST_UNTIMED`), else joined by a shuffle. Where each file is a stream of its own
  (`per_file`: Kafka partitions, `read.record_lines`), the earlier files do not count: the
  highest time before the change in its own partition, as `kafka.changefeed` merges them.

As in the old path (`spark/changefeed/udf/`), the frontier is not part of the current time: a
snapshot row that the encoder reads after a transaction finished by its END (frontier = its
time + 1) is placed one below where the encoder places it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

CHUNK_BITS = 16
"""Rows of a block are windowed in chunks of 2**CHUNK_BITS consecutive `row`s (see below)."""

BROADCAST_UNTIMED = 200_000
"""Up to this many changes without a time of their own, their times (four numbers each) are
broadcast to the changes rather than joined by a shuffle of every change."""


def assign_times(spark: SparkSession, changes: DataFrame, *, by_tx: bool,
                 untimed: int, per_file: bool = False) -> DataFrame:
    """`changes` (kind change, with `ptime`, `tx_min`, `tx`, `file_index`, `block`, `row`)
    with `time`.
    `by_tx`: some change takes its transaction's time; `untimed`: how many changes have no
    time of their own (both known from the parse aggregates, so that no window runs for
    nothing, and so that a few untimed changes are placed without shuffling the others)."""
    if by_tx:
        first = F.min(F.when(F.col("tx_min"), F.col("ptime"))).over(Window.partitionBy("tx"))
        changes = changes.withColumn("time", F.when(F.col("tx_min"), first)
                                     .otherwise(F.col("ptime")))
    else:
        changes = changes.withColumn("time", F.col("ptime"))
    if not untimed:
        return changes
    narrow = changes.select("file_index", "block", F.shiftright("row", CHUNK_BITS)
                            .alias("chunk"), "row", "time")
    chunks = sorted(narrow.groupBy("file_index", "block", "chunk").agg(F.max("time").alias("t"))
                    .collect(), key=lambda r: (r["file_index"], r["block"], r["chunk"]))
    before: list[tuple[int, int, int, int | None]] = []
    high: int | None = None
    for r in chunks:
        if per_file and before and before[-1][0] != r["file_index"]:
            high = None
        before.append((r["file_index"], r["block"], r["chunk"], high))
        if r["t"] is not None:
            high = r["t"] if high is None else max(high, r["t"])
    earlier = spark.createDataFrame(before,
                                    "file_index int, block long, chunk long, _earlier long")
    in_chunk = Window.partitionBy("file_index", "block", "chunk").orderBy("row") \
        .rowsBetween(Window.unboundedPreceding, -1)
    now = (narrow.withColumn("_within", F.max("time").over(in_chunk))
           .where(F.col("time").isNull())
           .join(F.broadcast(earlier), ["file_index", "block", "chunk"])
           .select("file_index", "block", "row",
                   F.coalesce(F.greatest("_within", "_earlier"), F.lit(0)).alias("_now")))
    if untimed <= BROADCAST_UNTIMED:
        now = F.broadcast(now)
    return (changes.join(now, ["file_index", "block", "row"], "left")
            .withColumn("time", F.coalesce("time", "_now")).drop("_now"))
