"""Key moves on the Spark path: the row a move's delete removed, handed to its create.

`convert.upsert.key_moves` states the rule: PostgreSQL's `UPDATE items SET id = 10 WHERE id =
3` with a TOAST column unchanged reaches Debezium as one WAL record, sent as a delete of 3 and a
create of 10 at one position, the create's unchanged columns `__debezium_unavailable_value`. A
create (op c) that shares its time and position with the delete of exactly one other key (and
no other key created there) takes the row that delete removed (the old key's row as it stood
just before: from the batch's earlier events of the old key, else the table's row, `state`) as
its before-image; the conversion's rule for before-images (`keyed.py`, *Rows*) then fills its
UNCHANGED columns from it, as `KeyedConverter._merge` does. Where the old key had no row,
nothing is handed and the values stay null.

Each key's events are converted apart (`keyed.java_convert`), so the old key's row comes from
a pass of its own: `KeyedConversion.removed` over the events of the moves' old keys only,
with the table's rows, gives the row each of their applied deletes removed, joined to the
moves by time and position, then to the creates by time, position and key. A key moved again
in the same batch (3 to 10, then 10 to 20) needs 10's row, which is made of 3's: such chains
take one pass more per link (`chained`: the moves whose old key is another move's new key
bound them), up to `MAX_CHAINED`; beyond, `Unsupported`.

`debezium_path` runs this only where the parse saw a create that may hold the placeholder
(`placeheld`, `DebeziumLines.mayHoldPlaceholder`): a batch without one plans nothing here.
What is collected to the driver: whether there is a move, and one count.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from changelake.spark.changefeed.conversion import _by_key
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.keyed import (
    ColumnSpec,
    Truncate,
    checkpoint,
    java_removed,
    partitions_for,
)
from changelake.spark.changefeed.steps import guard
from changelake.spark.settings import NOT_ADAPTIVE, settings

#: The most moves of one batch whose old key another move of it made: each takes one more
#: pass over the moved keys' events (see the module docstring).
MAX_CHAINED = 16


def _any(flags: list[Column]) -> Column:
    return functools.reduce(lambda x, y: x | y, flags, F.lit(False))


def key_moves(events: DataFrame, columns: Sequence[ColumnSpec], keys: int) -> DataFrame:
    """`(time, pos, old, new)`: the key moves among `events` (`keyed.typed_events`' rows), as
    `convert.upsert.key_moves` finds them (`old` and `new` structs of the key columns
    `k0..`), those whose create holds an UNCHANGED value only (the others take nothing)."""
    key = F.struct(*[F.col(f"k{i}") for i in range(keys)])
    placeheld = F.col("create") & _any([F.col("ua")[c.name] for c in columns])
    deleted, created = F.col("is_delete"), F.col("create") & ~F.col("is_delete")
    marks = events.where(F.col("pos").isNotNull() & (deleted | created)).select(
        "time", "pos", deleted.alias("deleted"), key.alias("key"),
        placeheld.alias("placeheld"))
    grouped = marks.groupBy("time", "pos").agg(
        F.min(F.when(F.col("deleted"), F.col("key"))).alias("old"),
        F.max(F.when(F.col("deleted"), F.col("key"))).alias("old_last"),
        F.min(F.when(~F.col("deleted"), F.col("key"))).alias("new"),
        F.max(F.when(~F.col("deleted"), F.col("key"))).alias("new_last"),
        F.max("placeheld").alias("placeheld"))
    one = (F.col("old") == F.col("old_last")) & (F.col("new") == F.col("new_last"))
    return grouped.where(F.col("old").isNotNull() & F.col("new").isNotNull() & one
                         & (F.col("old") != F.col("new")) & F.col("placeheld")) \
        .select("time", "pos", "old", "new")


def _handed(events: DataFrame, handed: DataFrame | None, columns: Sequence[ColumnSpec],
            keys: int) -> DataFrame:
    """`events` with each create that `handed` (`(time, pos, k0.., moved)`) names taking
    `moved` as its before-image: `b` its values, `ub` none UNCHANGED."""
    if handed is None:
        return events
    names = [f"k{i}" for i in range(keys)]
    joined = events.join(handed, ["time", "pos", *names], "left")
    take = F.col("create") & F.col("moved").isNotNull()
    no_flags = F.struct(*[F.lit(False).alias(c.name) for c in columns])
    return joined.withColumn("b", F.when(take, F.col("moved")).otherwise(F.col("b"))) \
        .withColumn("ub", F.when(take, no_flags).otherwise(F.col("ub"))).drop("moved")


def with_moves(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
               state: DataFrame | None, *, truncates: Sequence[Truncate] = ()) -> DataFrame:
    """`events` (`keyed.typed_events`' rows, at the times converted) with each key move's
    create taking the row its delete removed as its before-image (see the module
    docstring)."""
    spark = events.sparkSession
    n = len(keys)
    names = [f"k{i}" for i in range(n)]
    events = guard(lambda: checkpoint(events))  # read again by each pass: made once
    moves = guard(lambda: checkpoint(key_moves(events, columns, n)))
    if guard(moves.isEmpty):
        return events
    chained = guard(lambda: moves.alias("m").join(
        moves.alias("o"), F.col("m.old") == F.col("o.new"), "left_semi").count())
    if chained > MAX_CHAINED:
        raise Unsupported(f"unsupported: more than {MAX_CHAINED} key moves of one batch whose "
                          "old key another move made")
    sources = events.join(moves.select(*[F.col(f"old.{k}").alias(k) for k in names])
                          .distinct(), names, "left_semi")
    targets = moves.select("time", "pos", *[F.col(f"new.{k}").alias(k) for k in names])
    handed: DataFrame | None = None
    for _ in range(chained + 1):
        current = _handed(sources, handed, columns, n)
        with settings(spark, NOT_ADAPTIVE):
            shuffled = _by_key(current, n, partitions_for(spark, 0))
            removed = java_removed(shuffled, columns, keys, state, truncates=truncates)
            rows = removed.join(targets, ["time", "pos"]).select(
                "time", "pos", *names, F.col("data").alias("moved"))
            handed = guard(lambda rows=rows: checkpoint(rows))
    return _handed(events, handed, columns, n)
