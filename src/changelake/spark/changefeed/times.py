"""Step 4, times: the CDCv2 time of every change, with windows by transaction and by file.

The sequential encoder derives two kinds of time from what came before a line; here each is a
window whose partitions are small, never one global window:

* A MySQL GTID, or a PostgreSQL transaction without `sequence`, takes the time of the first
  event the parser saw with that transaction id (`DebeziumParser._tx_time`). Here: the least
  over the transaction's events (`partitionBy(tx)`), which is the first's for a connector that
  emits in commit order. Only rows marked `tx_min` by the parser take part.
* A change without a time of its own (a snapshot row) is placed at the stream's current time
  (`WindowedConverter.current_time`): the highest time of the changes before it, in the order
  the encoder reads them (file by file, line by line), or 0. Here: the highest time of the
  earlier files (one aggregate row per file), and within its file the highest time of the
  earlier lines of its block (`partitionBy(file, block)`, see `read.py`) and of the earlier
  blocks (one aggregate row per block). Only the narrow `(file, block, row, time)` columns are
  shuffled, and only when the batch has such changes. Where each file is a stream of its own
  (`per_file`: Kafka partitions, `read.record_lines`), the earlier files do not count: the
  highest time before the change in its own partition, as `kafka.changefeed` merges them.

As in the old path (`spark/changefeeds.py`), the frontier is not part of the current time: a
snapshot row that the encoder reads after a transaction finished by its END (frontier = its
time + 1) is placed one below where the encoder places it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F


def assign_times(spark: SparkSession, changes: DataFrame, *, by_tx: bool,
                 untimed: bool, per_file: bool = False) -> DataFrame:
    """`changes` (kind change, with `ptime`, `tx_min`, `tx`, `file_index`, `block`, `row`)
    with `time`.
    `by_tx`: some change takes its transaction's time; `untimed`: some change has no time of
    its own (both known from the parse aggregates, so that no window runs for nothing)."""
    if by_tx:
        first = F.min(F.when(F.col("tx_min"), F.col("ptime"))).over(Window.partitionBy("tx"))
        changes = changes.withColumn("time", F.when(F.col("tx_min"), first)
                                     .otherwise(F.col("ptime")))
    else:
        changes = changes.withColumn("time", F.col("ptime"))
    if not untimed:
        return changes
    narrow = changes.select("file_index", "block", "row", "time")
    blocks = sorted(narrow.groupBy("file_index", "block").agg(F.max("time").alias("t"))
                    .collect(), key=lambda r: (r["file_index"], r["block"]))
    before: list[tuple[int, int, int | None]] = []
    high: int | None = None
    for r in blocks:
        if per_file and before and before[-1][0] != r["file_index"]:
            high = None
        before.append((r["file_index"], r["block"], high))
        if r["t"] is not None:
            high = r["t"] if high is None else max(high, r["t"])
    earlier = spark.createDataFrame(before, "file_index int, block long, _earlier long")
    in_block = Window.partitionBy("file_index", "block").orderBy("row") \
        .rowsBetween(Window.unboundedPreceding, -1)
    now = (narrow.withColumn("_within", F.max("time").over(in_block))
           .where(F.col("time").isNull())
           .join(F.broadcast(earlier), ["file_index", "block"])
           .select("file_index", "block", "row",
                   F.coalesce(F.greatest("_within", "_earlier"), F.lit(0)).alias("_now")))
    return (changes.join(now, ["file_index", "block", "row"], "left")
            .withColumn("time", F.coalesce("time", "_now")).drop("_now"))
