"""Step 6 for YDB: the barrier rule with windows by file, and the frontier from aggregates.

One input file is one topic partition (`encode_changefeed`). The rules are
`convert.progress.PartitionFrontiers`, as the old path applies them
(`convert.progress.barrier_violations`, `ydb_frontier`):

* *Barriers*: a record whose position `[step, txId]` is below the highest barrier read before
  it in its file breaks the partition's guarantee (ydb#6985) and is a bad line, unless it
  repeats an earlier event of its file (`convert.images.event_identity`: position, op, key and
  images), a replay after a consumer restart. Two windows partitioned by file (the running
  highest barrier) and by file and event (the first occurrence).
* *Frontier*: each file's highest barrier (one aggregate row per file reaches the driver); 0
  while some file has none, else the least of their steps.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

#: What makes two records one event (`event_identity`).
IDENTITY = ("pos", "op", "a", "ua", "b")


def barrier_problems(items: DataFrame, keys: int) -> DataFrame:
    """`items` (see `ydb.ydb_items`) with `problem` set on each record below its file's
    highest earlier barrier that is not a repeat of an earlier record of its file."""
    ordered = Window.partitionBy("file_index").orderBy("block", "row") \
        .rowsBetween(Window.unboundedPreceding, -1)
    last = F.max(F.when(F.col("kind") == "resolved", F.col("rpos"))).over(ordered)
    identity = F.struct(*[F.col(f"k{i}") for i in range(keys)], *map(F.col, IDENTITY))
    first = Window.partitionBy("file_index", identity).orderBy("block", "row")
    change = F.col("kind") == "change"
    replay = F.when(change, F.row_number().over(first) > 1)
    below = change & F.col("pos").isNotNull() & (F.col("pos") < last) & ~replay
    return items.withColumn("problem", F.coalesce(
        "problem", F.when(below, F.lit("bad: a record below its partition's barrier"))))


def ydb_frontier(items: DataFrame, files: int) -> int:
    """`PartitionFrontiers.frontier` over `files` partitions from their barriers."""
    last = items.where(F.col("kind") == "resolved").groupBy("file_index") \
        .agg(F.max("rpos").alias("rpos")).collect()
    if len(last) < files:
        return 0
    return int(min(r["rpos"][0] for r in last))
