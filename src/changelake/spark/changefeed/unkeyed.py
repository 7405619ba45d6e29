"""Step 5 without keys: complete before- and after-images, converted with no state, in the JVM.

Mirrors `convert.images.ImageConverter` for the changes at times in `[since, frontier)`: an
update or delete retracts its before-image, a create, read or update inserts its after-image,
each at the change's time, and a change that repeats an earlier one (`event_identity`:
position, op and images, as a connector restart re-sends them) counts once, at the time of its
first delivery in reading order (a re-sent snapshot row has no time of its own, and the
stream's time has moved on since the first). Here the repeats are one group of a `groupBy`
over those columns, keeping the time of the least `(file_index, block, row)`, and the diffs a
`groupBy(data, time)`.

Images are typed first (`keyed.typed_images`), so two texts of one value (`1` and `1.0` in a
double column) are one image, as they are one frozen row to the Python converter.

What the converter refuses sets `problem` on the change, so that the caller hands the batch to
the Python path, which names the line with the converter's own message: an update or delete
without a before-image, an image holding Debezium's unavailable placeholder (TOAST).

A truncate retracts, at its time, every row inserted and not yet retracted: each update is
compensated at the first truncate after it (`_compensated`), so between two truncates the
rows start from nothing, as `ImageConverter`'s live rows do. Only what this conversion
inserted: over a table's earlier rows (a batch with `since`) a truncate without keys is
`Unsupported` (`debezium_path.debezium_changes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from changelake.spark.changefeed.keyed import ColumnSpec, typed_images


def _any_flag(flags: Column, names: Sequence[str]) -> Column:
    out = F.lit(False)
    for n in names:
        out = out | flags[n]
    return out


def image_events(changes: DataFrame, columns: Sequence[ColumnSpec]) -> DataFrame:
    """The typed changes with `problem` set where `ImageConverter` would refuse one."""
    names = [c.name for c in columns]
    frame = typed_images(changes, columns)
    retracts = F.col("op").isin("u", "d")
    problem = (F.when(retracts & ~F.col("_has_b"), "bad: no before-image (needs keys)")
               .when((F.col("_has_a") & _any_flag(F.col("ua"), names))
                     | (F.col("_has_b") & _any_flag(F.col("ub"), names)),
                     "bad: an unavailable value (needs keys)"))
    return frame.withColumn("problem", problem)


def convert_images(events: DataFrame,
                   truncates: Sequence[tuple[int, tuple[int, ...], tuple[int, ...]]] = ()
                   ) -> DataFrame:
    """`(data struct, time, diff)`, consolidated, for `image_events` without a problem (and
    without truncates). `truncates`: the batch's, each `(time, pos, place of its first line)`
    (`debezium_path._truncates`); see `_compensated`."""
    distinct = events.groupBy("pos", "op", "_has_a", "a", "_has_b", "b").agg(
        F.min_by("time", F.struct("file_index", "block", "row")).alias("time"))
    retract = F.when(F.col("op").isin("u", "d"), F.col("b"))
    insert = F.when(F.col("_has_a"), F.col("a"))
    updates = distinct.select("time", "pos", F.explode(F.array(
        F.struct(retract.alias("data"), F.lit(-1).cast("long").alias("diff")),
        F.struct(insert.alias("data"), F.lit(1).cast("long").alias("diff")))).alias("u"))
    updates = updates.where(F.col("u.data").isNotNull()).select(
        F.col("u.data").alias("data"), "time", "pos", F.col("u.diff").alias("diff"))
    if truncates:
        updates = _compensated(updates, truncates)
    return (updates.groupBy("data", "time").agg(F.sum("diff").alias("diff"))
            .where(F.col("diff") != 0))


def _compensated(updates: DataFrame,
                 truncates: Sequence[tuple[int, tuple[int, ...], tuple[int, ...]]]
                 ) -> DataFrame:
    """`updates` (data, time, pos, diff) and, for each, its opposite at the time of the first
    truncate after it in `(time, pos)` order, as `ImageConverter` retracts at a truncate every
    row it inserted and not yet retracted (its count since the truncate before, which is the
    sum of those updates). A truncate is one event by its position (`event_identity`: a
    replay is the same truncate), at the time of its first line; an update at a truncate's
    very `(time, pos)` counts as after it."""
    first: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
    for time, pos, place in truncates:
        if pos not in first or place < first[pos][0]:
            first[pos] = (place, time)
    cuts = sorted((time, pos) for pos, (_, time) in first.items())
    cut_array = F.array(*[F.struct(F.lit(t).cast("bigint").alias("t"),
                                   F.array(*[F.lit(p).cast("bigint") for p in pos]).alias("p"))
                          for t, pos in cuts])
    here = F.struct(F.col("time").cast("bigint").alias("t"), F.col("pos").alias("p"))
    after = F.filter(cut_array, lambda c: c > here)
    at = F.when(F.size(after) > 0, after[0]["t"])
    compensation = updates.where(at.isNotNull()).select(
        "data", at.alias("time"), "pos", (-F.col("diff")).alias("diff"))
    return updates.unionByName(compensation)
