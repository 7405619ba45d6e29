"""Step 6 for YDB: the barrier rule with one window by file, and the frontier from aggregates.

One input file is one topic partition (`encode_changefeed`). The rules are
`convert.progress.PartitionFrontiers`, as the old path applies them
(`convert.progress.barrier_violations`, `ydb_frontier`):

* *Barriers*: a record whose position `[step, txId]` is below the highest barrier read before
  it in its file breaks the partition's guarantee (ydb#6985) and is a bad line, unless it
  repeats an earlier event of its file (`convert.images.event_identity`: position, op, key and
  images), a replay after a consumer restart. When the batch has barriers, one window
  partitioned by file over a few columns of each line (the running highest barrier) finds the
  records below it; only those, few in a good feed (the replays), are then looked up among
  the earlier records of their file by their identity (`unrepeated_below`, joins).
* *Frontier*: each file's highest barrier (one aggregate row per file reaches the driver, in
  `PerFile`); 0 while some file has none, else the least of their steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

#: What makes two records of one key one event (`event_identity`), besides the key.
IDENTITY = ("pos", "op", "a", "ua", "b")
#: Up to this many records below a barrier are broadcast to the joins that look them up.
BROADCAST_BELOW = 100_000


@dataclass(frozen=True)
class PerFile:
    """What the later steps need to know about a batch, from one aggregate row per file."""

    problem: str | None  # the least of the lines' problems
    careful: int  # lines `ydb.ydb_items` left to the careful parse
    timed: int  # records with `ts`
    untimed: int  # records without
    barriers: int
    last: dict[int, Any]  # file_index: its highest barrier's position, for files with one

    @staticmethod
    def of(items: DataFrame) -> PerFile:
        change = F.col("kind") == "change"
        rows = items.groupBy("file_index").agg(
            F.min("problem").alias("problem"),
            F.count(F.when(F.col("kind") == "careful", 1)).alias("careful"),
            F.count(F.when(change & F.col("has_ts"), 1)).alias("timed"),
            F.count(F.when(change & ~F.col("has_ts"), 1)).alias("untimed"),
            F.count(F.when(F.col("kind") == "resolved", 1)).alias("barriers"),
            F.max(F.when(F.col("kind") == "resolved", F.col("rpos"))).alias("last")).collect()
        problems = [r["problem"] for r in rows if r["problem"] is not None]
        return PerFile(min(problems) if problems else None,
                       *(sum(r[c] for r in rows) for c in ("careful", "timed", "untimed",
                                                            "barriers")),
                       {r["file_index"]: r["last"] for r in rows if r["last"] is not None})

    def frontier(self, files: int) -> int:
        """`PartitionFrontiers.frontier` over `files` partitions from their barriers."""
        if len(self.last) < files:
            return 0
        return int(min(position[0] for position in self.last.values()))


def _below(items: DataFrame) -> DataFrame:
    """(file_index, block, row) of each record below the highest barrier read before it in
    its file: one window by file over these few columns of each line."""
    ordered = Window.partitionBy("file_index").orderBy("block", "row") \
        .rowsBetween(Window.unboundedPreceding, -1)
    last = F.max(F.when(F.col("kind") == "resolved", F.col("rpos"))).over(ordered)
    return items.select("file_index", "block", "row", "kind", "pos", last.alias("_last")) \
        .where((F.col("kind") == "change") & (F.col("pos") < F.col("_last"))) \
        .select("file_index", "block", "row")


def unrepeated_below(items: DataFrame, keys: int) -> bool:
    """Whether some record below its file's barrier repeats no earlier record of its file: a
    bad line. The records below are found with `_below` and kept; in a good feed they are
    few (the replays), and are then broadcast to the join that looks each one up among the
    earlier records of its file by its identity (many are joined without broadcasting)."""
    below = _below(items).localCheckpoint()
    count = below.count()
    if count == 0:
        return False
    small: Callable[[DataFrame], DataFrame] = \
        F.broadcast if count <= BROADCAST_BELOW else lambda frame: frame
    identity: Sequence[str] = [*(f"k{i}" for i in range(keys)), *IDENTITY]
    changes = items.where(F.col("kind") == "change")
    found = changes.join(small(below), ["file_index", "block", "row"]) \
        .select("file_index", "block", "row", *identity)
    earlier = changes.select(
        *[F.col(c).alias(f"_{c}") for c in ("file_index", "block", "row", *identity)])
    same = F.col("file_index") == F.col("_file_index")
    for c in identity:
        same = same & F.col(c).eqNullSafe(F.col(f"_{c}"))
    before = (F.col("_block") < F.col("block")) \
        | ((F.col("_block") == F.col("block")) & (F.col("_row") < F.col("row")))
    repeats = earlier.join(small(found), same & before).select("file_index", "block", "row") \
        .distinct().count()
    return repeats < count
