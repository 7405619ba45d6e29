"""Step 6 for YDB: the barrier rule (in the keyed conversion, or by a scan of each block of
lines), and the frontier.

One input file is one topic partition (`encode_changefeed`). The rules are
`convert.progress.PartitionFrontiers`, as the Python path applies them
(`convert.progress.barrier_violations`, `ydb_frontier`):

* *Barriers*: a record whose position `[step, txId]` is below the highest barrier read before
  it in its file breaks the partition's guarantee (ydb#6985) and is a bad line, unless it
  repeats an earlier event of its file (`convert.images.event_identity`: position, op, key and
  images), a replay after a consumer restart. Where the conversion is not told the rule (see
  below), the running highest barrier of each file finds the records below it:
  `times.highest_before`, a window by chunk of lines, the earlier chunks' highest carried by
  the driver (one window by file held a whole file in one task's buffer, and the driver's JVM
  grew with the file: benchmarks/README.md, "Figures moved out of docstrings"). The parse's
  job shuffles the records by key (`checkpoint.kept_shuffle`), so no partition holds a block
  in read order for a scan to follow.
  Only the records below, few in a good feed (the replays), are then looked up among the
  earlier records of their file by their identity (`barrier_rule`: a join on the key, the
  position and a 64-bit hash of the op and images, `identity`).
* *In the conversion*: where the project's Java parsed the batch (`ydb.java_items`), its tasks
  already mark each record below a barrier of its block's earlier lines (`_below`) and report
  each block's highest barrier; the driver gives each block its file's earlier blocks' highest
  (`Blocks`), which marks the rest (`marked_below`), and the keyed conversion, which reads each
  key's events in order anyway, finds each record below repeated among its key's events at
  its position (`keyed.java_convert`'s `barriers`). The records below at times it does not
  convert, it only counts, and they are looked up as above (`unrepeated_outside`). No window
  or lookup of every record (benchmarks/README.md, "YDB's barrier rule checked by the
  conversion").
* *Frontier*: each file's highest barrier (from what finds the records below: the blocks'
  reports, or the window's aggregate rows by chunk of lines:
  `Barriers.last`); 0 while some file has none, else the least of their steps.

What the steps need to know of the parsed lines as a whole (`LineFacts`) is observed while the
parse's job checkpoints them, not read back from the checkpoint by a job of its own (a job
that cost a YDB ingest time of its own: benchmarks/README.md, "Figures moved out of docstrings").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.spark.changefeed.keyed import (
    flipped,
    key_names,
    long_positions,
    partitions_for,
    uint64_positions,
)
from changelake.spark.changefeed.times import Chunks, chunks_of, highest_before
from changelake.spark.driver_rows import driver_rows

#: Up to this many records below a barrier are broadcast to the join that looks them up: their
#: narrow identity (places, key, position, a hash; about 130 bytes each in Spark's rows, so
#: 65 MB at most pass through the driver). Broadcast, the join was faster than shuffled at
#: 11M events with 2% replayed (benchmarks/README.md, "Figures moved out of docstrings").
BROADCAST_BELOW = 500_000

#: The problem of a batch that breaks the rule (a record below its partition's barrier that
#: repeats no earlier record of its file): the Python path then names the line.
BELOW_UNREPEATED = "bad: a record below its partition's barrier"


@dataclass(frozen=True)
class LineFacts:
    """What the later steps need to know about a batch's parsed lines (`ydb.java_items`),
    counted by its tasks (`ydb.TASK_COUNTS`)."""

    timed: int  # records with `ts`
    untimed: int  # records without
    barriers: int


@dataclass(frozen=True)
class Barriers:
    """The barrier rule's findings (`barrier_rule`)."""

    unrepeated: bool  # some record below its file's barrier repeats no earlier one: bad
    last: dict[int, Any]  # file_index: its highest barrier's position, for files with one


def barrier_frontier(last: dict[int, Any], files: int) -> int:
    """`PartitionFrontiers.frontier` over `files` partitions whose highest barriers are
    `last` (file_index: position): 0 while one has none, else the least of their steps."""
    if len(last) < files:
        return 0
    return int(min(position[0] for position in last.values()))


def identity(content: Column | None = None) -> Column:
    """What makes two records of one key at one position one event (`event_identity`): their
    op and images, compared by a 64-bit hash (as `keyed.convert`'s `checks` tell two rows of a
    key at a position apart), so that the joins that look the records below a barrier up
    shuffle a hash, not the images. Each image's absence is hashed too (a hash skips a null).
    The after image is hashed as `content` (`ydb.with_content`), which a caller that has it
    passes, so that the conversion's events hash it once."""
    after = F.xxhash64("a", "ua") if content is None else content
    return F.xxhash64(after, "op", F.col("a").isNull(), F.col("b").isNull(), "b")


def _narrow(items: DataFrame, keep: Sequence[str]) -> DataFrame:
    """The columns the barrier window reads, `keep`, and `_barrier`: a barrier's position.
    The records' positions must be Uint64s as the barriers' are (`keyed.uint64_positions`)."""
    kinds = [items.schema[c].dataType.simpleString() for c in ("pos", "rpos")]
    if kinds[0] != kinds[1]:
        raise TypeError(f"records' positions and barriers of two types: {kinds}")
    return items.select("file_index", "block", "row", "kind", "pos", *keep,
                        F.when(F.col("kind") == "resolved", F.col("rpos")).alias("_barrier"))


def _barrier_chunks(items: DataFrame, keep: Sequence[str]) -> Chunks:
    """`times.highest_before`'s aggregate rows by chunk of lines, for `_below`: each file's
    highest barrier is among them (`Chunks.highest`)."""
    return chunks_of(items.sparkSession, _narrow(items, keep), stream=("file_index", "block"),
                     row="row", moves=F.col("_barrier"), per_file=True)


def _below(items: DataFrame, keep: Sequence[str], partitions: int | None = None,
           chunks: Chunks | None = None) -> DataFrame:
    """(file_index, block, row, pos, *keep) of each record below the highest barrier read
    before it in its file (`times.highest_before`: chunks of lines, not one window by file,
    whose buffer held a whole file; `partitions` bounds each task's share; `chunks`:
    `_barrier_chunks` of the same `keep`, where the caller has them)."""
    return highest_before(items.sparkSession, _narrow(items, keep),
                          stream=("file_index", "block"), row="row", moves=F.col("_barrier"),
                          per_file=True, partitions=partitions, chunks=chunks) \
        .where((F.col("kind") == "change") & (F.col("pos") < F.col("_high"))) \
        .select("file_index", "block", "row", "pos", *keep)


@dataclass(frozen=True)
class Below:
    """The records below their file's running highest barrier, as `_below` finds them."""

    frame: DataFrame  # file_index, block, row, pos, *keep; checkpointed
    count: int
    last: dict[int, Any]  # file_index: its highest barrier's position, for files with one


def _window_below(items: DataFrame, keep: Sequence[str], size: int | None) -> Below:
    """The records below their file's running highest barrier, by `_below`'s window, and
    each file's highest barrier."""
    partitions = None if size is None else partitions_for(items.sparkSession, size)
    chunks = _barrier_chunks(items, keep)
    last = {file: high for file, high in chunks.highest.items() if high is not None}
    counted = Observation()  # counted as they are checkpointed: no job of its own
    below = _below(items, keep=keep, partitions=partitions, chunks=chunks) \
        .observe(counted, F.count(F.lit(1)).alias("n")).localCheckpoint()
    return Below(below, int(counted.get["n"]), last)


def unrepeated_below(items: DataFrame, keys: int, size: int | None = None) -> bool:
    """Whether some record below its file's barrier repeats no earlier record of its file."""
    return barrier_rule(items, keys, size).unrepeated


def barrier_rule(items: DataFrame, keys: int, size: int | None = None) -> Barriers:
    """Whether some record below its file's barrier repeats no earlier record of its file (a
    bad line), and each file's highest barrier. The records below are found by `_below`'s
    window, each with its identity (the key, the position and `identity`), and kept; in a
    good feed they are few (the replays), and are then broadcast to the join that looks each
    one up among the earlier records of its file by its identity (many are joined without
    broadcasting). Only the identity's narrow columns are shuffled or broadcast, never the
    images: faster than when a join fetched each one's images and a second shuffled every
    record's (benchmarks/README.md, "YDB's steps, and the barrier rule's lookup without the
    images"). `size`, the batch's lines about, spreads the window over partitions by it
    (`keyed.partitions_for`)."""
    key = key_names(items.columns, keys)
    items = uint64_positions(items).withColumn("_same", identity())
    scanned = _window_below(items, (*key, "_same"), size)
    below, count, last = scanned.frame, scanned.count, scanned.last
    if count == 0:
        return Barriers(False, last)
    return Barriers(_unrepeated(items, below, count, keys), last)


def _unrepeated(lines: DataFrame, below: DataFrame, count: int, keys: int) -> bool:
    """Whether one of the `count` records `below` (file_index, block, row, pos, the key's
    columns, `_same`: `identity`) repeats no earlier record of its file among `lines` (with
    `_same`)."""
    key = key_names(lines.columns, keys)
    small: Callable[[DataFrame], DataFrame] = \
        F.broadcast if count <= BROADCAST_BELOW else lambda frame: frame
    identical = ["file_index", *key, "pos", "_same"]
    earlier = lines.where(F.col("kind") == "change").select(
        *[F.col(c).alias(f"_{c}") for c in ("block", "row", *identical)])
    same = F.lit(True)
    for c in identical:
        same = same & F.col(c).eqNullSafe(F.col(f"_{c}"))
    before = (F.col("_block") < F.col("block")) \
        | ((F.col("_block") == F.col("block")) & (F.col("_row") < F.col("row")))
    repeats = earlier.join(small(below), same & before).select("file_index", "block", "row") \
        .distinct().count()
    return repeats < count


@dataclass(frozen=True)
class Blocks:
    """The barrier rule across a YDB batch's blocks of lines, from what the parse's tasks
    found within each (`ydb.TASK_FACTS`, `YdbLines.Blocks`): each record already says
    whether it lies below the barriers of its block's earlier lines (`_below`); here each
    block gets the highest barrier of its file's earlier blocks (`prior`), which
    `marked_below` compares the block's records with."""

    prior: list[tuple[int, int, Any]]  # (file_index, block, earlier blocks' highest barrier)
    last: dict[int, Any]  # file_index: its highest barrier's position, for files with one

    @staticmethod
    def of(tasks: Sequence[Any]) -> Blocks | None:
        """From the tasks' facts; None where a block's rows were out of order or split
        between tasks (the caller takes `barrier_rule`)."""
        if any(t["disorder"] for t in tasks):
            return None
        blocks = sorted(((b["file_index"], b["block"], b["high"]) for t in tasks
                         for b in t["blocks"]), key=lambda b: (b[0], b[1]))
        across = _across_blocks(blocks)
        if across is None:
            return None
        earlier_highest, last = across
        return Blocks([(file, block, earlier) for (file, block, _), earlier
                       in zip(blocks, earlier_highest, strict=True) if earlier is not None],
                      last)


def _across_blocks(blocks: Sequence[tuple[int, int, Any]]
                   ) -> tuple[list[Any], dict[int, Any]] | None:
    """What each block owes to its file's earlier ones, for blocks `(file_index, block, its
    highest barrier or None)` sorted by file and block: the highest barrier of each one's
    file's earlier blocks (None: none has one), and each file's highest barrier (for files
    with one). None where a block is listed twice (its rows were split between tasks) or a
    barrier holds a null (Python would not order it as Spark does)."""
    places = [(file, block) for file, block, _ in blocks]
    if len(set(places)) < len(places) \
            or any(high is not None and None in high for _, _, high in blocks):
        return None
    last: dict[int, Any] = {}
    earlier_highest = []
    for file, _, high in blocks:
        earlier = last.get(file)
        earlier_highest.append(earlier)
        if high is not None and (earlier is None or list(high) > list(earlier)):
            last[file] = high
    return earlier_highest, last


def marked_below(items: DataFrame, blocks: Blocks) -> DataFrame:
    """`items` (with `_below` from the parse: below a barrier of its block's earlier lines)
    with `_below` true also on each record below its file's earlier blocks' highest barrier:
    on every record below the highest barrier read before it in its file.

    A record's `time` is its position's step (`ydb.py`), so the step decides, as a long, and
    the positions are compared only where the steps are equal: the whole comparison, of
    positions read as Uint64 decimals (each through a `BigDecimal`), was a seventh of the
    conversion's map side. The positions come as the parse made them: Uint64s, or as the Java
    conversion reads them (`keyed.java_ready_schema`), longs, the barriers' made so here."""
    if not blocks.prior:
        return items
    position = items.schema["pos"].dataType
    if long_positions(items):
        rows = [(f, b, [flipped(int(p)) for p in high], _step(high))
                for f, b, high in blocks.prior]
    else:
        rows = [(*b, _step(b[2])) for b in blocks.prior]
    prior = driver_rows(items.sparkSession, rows,
                        T.StructType([
                            T.StructField("file_index", T.IntegerType()),
                            T.StructField("block", T.LongType()),
                            T.StructField("_prior", position),
                            T.StructField("_prior_step", T.LongType())]))
    time, step = F.col("time"), F.col("_prior_step")
    earlier = F.when(step.isNull(), F.col("pos") < F.col("_prior")) \
        .otherwise((time < step) | ((time == step) & (F.col("pos") < F.col("_prior"))))
    below = F.col("_below") | F.coalesce((F.col("kind") == "change") & earlier, F.lit(False))
    return items.join(F.broadcast(prior), ["file_index", "block"], "left") \
        .withColumn("_below", below).select(*items.columns)


def _step(barrier: Any) -> int | None:
    """A barrier's step where a long holds it (a record's `time` is its step as a long), else
    None: compared as a position only."""
    step = int(barrier[0])
    return step if -(2**63) <= step < 2**63 else None


def unrepeated_outside(items: DataFrame, outside: Column, count: int, keys: int) -> bool:
    """Whether one of the `count` records below (`marked_below`'s `items`) that `outside`
    marks (those the conversion does not see, which checks the others: `keyed.java_convert`'s
    `barriers`) repeats no earlier record of its file."""
    items = items.withColumn("_same", identity())
    below = items.where((F.col("kind") == "change") & F.col("_below") & outside).select(
        "file_index", "block", "row", "pos", *key_names(items.columns, keys), "_same")
    return _unrepeated(items, below, count, keys)

