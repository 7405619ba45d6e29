"""Step 4, times: the CDCv2 time of every change, with windows by transaction and by file.

The sequential encoder derives two kinds of time from what came before a line; here each is a
window whose partitions are small, never one global window:

* A MySQL GTID, or a PostgreSQL transaction without `sequence`, takes the time of the first
  event the parser saw with that transaction id (`DebeziumParser._tx_time`). Here: the least
  over the transaction's events (`partitionBy(tx)`), which is the first's for a connector that
  emits in commit order. Only rows marked `tx_min` by the parser take part, and only they
  are gathered by transaction (a batch's snapshot rows have none: one partition of them
  all would be one task).
* A change without a time of its own (a snapshot row) is placed at the stream's current time
  (`WindowedConverter.current_time`): the highest time of the changes before it, in the order
  the encoder reads them (file by file, line by line), or 0. Here: within its file, the
  highest time of the earlier lines of its chunk of its block (`partitionBy(file, block,
  chunk)`, see `read.py`; a chunk is 2**`CHUNK_BITS` consecutive rows, so that the window runs
  in many small partitions), and of the earlier chunks and files (one aggregate row per
  chunk). Only the narrow `(file, block, row, time)` columns are shuffled, and only when the
  batch has such changes and one that moves the time comes before one of them in its chunk;
  the times found are broadcast back to the changes when they are few (`BROADCAST_UNTIMED`),
  else joined by a shuffle. Where no chunk needs the window (a batch's snapshot rows come
  before its streamed changes), the chunk rows alone are broadcast to the changes: no window,
  and no pass over the changes of its own. Where each file is a stream of its own
  (`per_file`: Kafka partitions, `read.record_lines`), the earlier files do not count: the
  highest time before the change in its own partition, as `kafka.changefeed` merges them.
  That running highest is `highest_before`, which YDB's barrier rule uses too (`barriers.py`).

As in the Python path (`spark/changefeed/python_path/`), the frontier is not part of the
current time: a snapshot row that the encoder reads after a transaction finished by its END
(frontier = its time + 1) is placed one below where the encoder places it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.spark.driver_rows import driver_rows

CHUNK_BITS = 16
"""Rows of a block are windowed in chunks of 2**CHUNK_BITS consecutive `row`s (see below)."""

BROADCAST_UNTIMED = 200_000
"""Up to this many changes without a time of their own, their times (four numbers each) are
broadcast to the changes rather than joined by a shuffle of every change."""


def assign_times(spark: SparkSession, changes: DataFrame, *, by_tx: bool,
                 untimed: int, per_file: bool = False,
                 chunk_rows: Sequence[Any] | None = None) -> DataFrame:
    """`changes` (kind change, with `ptime`, `tx_min`, `tx`, `file_index`, `block`, `row`)
    with `time`.
    `by_tx`: some change takes its transaction's time; `untimed`: how many changes have no
    time of their own (both known from the parse aggregates, so that no window runs for
    nothing, and so that a few untimed changes are placed without shuffling the others).
    `chunk_rows`: `chunks_of`'s aggregate rows where each change's time is its `ptime`, as
    the parse's job collected them (`parse.java_items`); used only without `by_tx`, where
    that is so."""
    if by_tx:
        # Only the marked changes are windowed by transaction: the rest (snapshot rows, which
        # have none) each make a partition of their own, not one of all of them.
        marked = F.coalesce(F.col("tx_min"), F.lit(False))
        per_tx = Window.partitionBy(F.when(marked, F.col("tx")), F.when(~marked, F.col("row")))
        first = F.min(F.when(marked, F.col("ptime"))).over(per_tx)
        changes = changes.withColumn("time", F.when(marked, first).otherwise(F.col("ptime")))
    else:
        changes = changes.withColumn("time", F.col("ptime"))
    return current_times(spark, changes, untimed=untimed, per_file=per_file,
                         chunk_rows=None if by_tx else chunk_rows)


def current_times(spark: SparkSession, changes: DataFrame, *, untimed: int,
                  stream: tuple[str, ...] = ("file_index", "block"), row: str = "row",
                  per_file: bool = False, moves: Column | None = None,
                  one_per_row: bool = True, chunk_rows: Sequence[Any] | None = None
                  ) -> DataFrame:
    """`changes` with each null `time` replaced by the stream's current time there: the
    highest time that `moves` (default: `time`) gives the changes before it, in the order of
    `stream` and then `row` (with `per_file`, only those of the same `stream[0]`), or 0.
    `untimed`: how many times are null (0 runs nothing). `(*stream, row)` names one change,
    unless not `one_per_row`: the Python path (`python_path/`) names its changes by `("file",)` and
    `line`, where an update that moves its key is two changes of one line (alike in time),
    and moves nothing by a logical message. `chunk_rows`: see `chunks_of`'s `rows`."""
    if not untimed:
        return changes
    narrow = changes.select(*stream, row, "time",
                            (F.col("time") if moves is None else moves).alias("_m"))
    chunks = chunks_of(spark, narrow, stream=stream, row=row, per_file=per_file,
                       moves=F.col("_m"), wanted=F.col("time").isNull(), rows=chunk_rows)
    if not chunks.windowed:
        # No change that moves the time comes before an untimed one in its chunk (a batch's
        # snapshot rows come first): each takes the earlier chunks' highest, a column of the
        # few chunk rows broadcast to the changes, with no window and no pass of its own.
        earlier = F.broadcast(chunks.earlier.select(
            *stream, F.col("chunk").alias("_chunk"), F.col("_earlier").alias("_now")))
        return (changes.withColumn("_chunk", F.shiftright(F.col(row), CHUNK_BITS))
                .join(earlier, [*stream, "_chunk"], "left")
                .withColumn("time", F.coalesce("time", "_now", F.lit(0)))
                .drop("_chunk", "_now"))
    now = highest_before(spark, narrow, stream=stream, row=row, per_file=per_file,
                         moves=F.col("_m"), wanted=F.col("time").isNull(), chunks=chunks) \
        .select(*stream, row, F.coalesce("_high", F.lit(0)).alias("_now"))
    if not one_per_row:
        now = now.dropDuplicates([*stream, row])
    if untimed <= BROADCAST_UNTIMED:
        now = F.broadcast(now)
    return (changes.join(now, [*stream, row], "left")
            .withColumn("time", F.coalesce("time", "_now")).drop("_now"))


def _merged(rows: Sequence[Any], place: Sequence[str]) -> list[dict[str, Any]]:
    """`chunks_of`'s aggregate over rows that may name a chunk more than once."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = tuple(r[c] for c in place)
        seen = out.get(key)
        if seen is None:
            out[key] = {**{c: r[c] for c in place}, "t": r["t"], "last_wanted": r["last_wanted"],
                        "first_moving": r["first_moving"]}
            continue
        for name, pick in (("t", max), ("last_wanted", max), ("first_moving", min)):
            values = [v for v in (seen[name], r[name]) if v is not None]
            seen[name] = pick(values) if values else None
    return list(out.values())


@dataclass(frozen=True)
class Chunks:
    """One row per chunk of `highest_before`'s order, as its window needs them."""

    narrow: DataFrame  # the frame with chunk, _moves (and _wanted) that they aggregate
    earlier: DataFrame  # the stream's columns, chunk, _earlier, _windowed
    place: list[str]  # the stream's columns and chunk
    windowed: bool  # some chunk needs the window
    # The highest value `moves` takes (null where it takes none) in each file (`per_file`:
    # keyed by the stream's first column), or in the whole order (keyed by None).
    highest: dict[Any, Any]


def chunks_of(spark: SparkSession, frame: DataFrame, *, stream: Sequence[str], row: str,
              moves: Column, per_file: bool, wanted: Column | None = None,
              rows: Sequence[Any] | None = None) -> Chunks:
    """The aggregate row per chunk that `highest_before` carries on the driver: the highest
    value `moves` takes in the earlier chunks (`_earlier`), and whether the chunk needs the
    window (`_windowed`: without `wanted`, every chunk).

    `rows`: the aggregate's rows (the stream's columns, `chunk`, `t`, `last_wanted`,
    `first_moving`; a chunk may come in more than one), where a job that read `frame`'s rows
    already found them (`parse.java_items`): then nothing runs for them here."""
    place = [*stream, "chunk"]
    narrow = frame.withColumns({"chunk": F.shiftright(row, CHUNK_BITS), "_moves": moves})
    aggregates = [F.max("_moves").alias("t")]
    if wanted is not None:
        narrow = narrow.withColumn("_wanted", wanted)
        aggregates += [F.max(F.when(F.col("_wanted"), F.col(row))).alias("last_wanted"),
                       F.min(F.when(F.col("_moves").isNotNull(), F.col(row)))
                       .alias("first_moving")]
    found = narrow.groupBy(*place).agg(*aggregates).collect() if rows is None \
        else _merged(rows, place)
    chunks = sorted(found, key=lambda r: tuple(r[c] for c in place))
    before: list[tuple[Any, ...]] = []
    highest: dict[Any, Any] = {}
    high: Any = None
    for r in chunks:
        if per_file and before and before[-1][0] != r[stream[0]]:
            high = None
        windowed = wanted is None or (
            r["last_wanted"] is not None and r["first_moving"] is not None
            and r["first_moving"] < r["last_wanted"])
        before.append((*(r[c] for c in place), high, windowed))
        if r["t"] is not None:
            high = r["t"] if high is None else max(high, r["t"])
        highest[r[stream[0]] if per_file else None] = high
    types = {f.name: f.dataType for f in narrow.schema.fields}
    earlier = driver_rows(spark, before, T.StructType(
        [*(T.StructField(c, types[c]) for c in place), T.StructField("_earlier", types["_moves"]),
         T.StructField("_windowed", T.BooleanType())]))
    return Chunks(narrow, earlier, place, any(b[-1] for b in before), highest)


def highest_before(spark: SparkSession, frame: DataFrame, *, stream: Sequence[str], row: str,
                   moves: Column, per_file: bool = False,
                   partitions: int | None = None, wanted: Column | None = None,
                   chunks: Chunks | None = None) -> DataFrame:
    """`frame` with `_high`: the highest value `moves` takes on the rows before each row, in
    the order of `stream` and then `row` (with `per_file`, only the rows of the same
    `stream[0]`), or null where none is before it (nulls are no values). With `wanted`, only
    the rows it holds are returned. `chunks`: `chunks_of` the same arguments, where the caller
    has them already.

    A running maximum over the whole order would be one window partition per stream, held by
    one task: its window buffer grows with the stream, and so did the driver's JVM for a large
    YDB partition file (benchmarks/README.md, "YDB's driver memory: the barrier window by
    chunks of lines", and "Figures moved out of docstrings"). So the order is cut into
    chunks of 2**`CHUNK_BITS` consecutive `row`s: one aggregate row per chunk reaches the
    driver, which carries the highest value of the earlier chunks (a few rows, broadcast
    back), and a window partitioned by chunk adds the highest of the earlier rows of the same
    chunk. `partitions` spreads the chunks over that many tasks (default: the session's
    shuffle partitions), so that a task's sort holds a bounded share of the rows.

    The window only runs over the chunks that need it: with `wanted`, a chunk in which no
    row that moves comes before the last wanted row (the aggregate row says so) gives each
    wanted row the earlier chunks' highest as it is, with no shuffle. A batch's snapshot rows
    come before its streamed changes, so their chunks need no window, a shuffle and sort of
    every change (benchmarks/README.md, "Figures moved out of docstrings")."""
    if chunks is None:
        chunks = chunks_of(spark, frame, stream=stream, row=row, moves=moves,
                           per_file=per_file, wanted=wanted)
    narrow, place, earlier = chunks.narrow, chunks.place, chunks.earlier
    done = ["chunk", "_moves", "_earlier", "_windowed"] + ([] if wanted is None else ["_wanted"])
    rows = narrow
    if wanted is not None:
        rows = narrow.join(F.broadcast(earlier.where("_windowed").select(*place)), place,
                           "left_semi")
    if partitions is not None:
        rows = rows.repartition(partitions, *place)
    in_chunk = Window.partitionBy(*place).orderBy(row) \
        .rowsBetween(Window.unboundedPreceding, -1)
    out = (rows.withColumn("_within", F.max("_moves").over(in_chunk))
           .join(F.broadcast(earlier), place)
           .withColumn("_high", F.greatest("_within", "_earlier"))
           .drop("_within"))
    if wanted is None:
        return out.drop(*done)
    plain = narrow.where(F.col("_wanted")).join(F.broadcast(earlier), place) \
        .where(~F.col("_windowed")).withColumn("_high", F.col("_earlier"))
    if chunks.windowed:
        plain = plain.unionByName(out.where(F.col("_wanted")))
    return plain.drop(*done)
