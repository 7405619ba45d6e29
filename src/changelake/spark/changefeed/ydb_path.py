"""A keyed YDB JSON batch on the Spark path: parse, barrier rule, frontier, keyed conversion.

`ydb_changes` parses the batch by the project's Java in the tasks (`ydb.java_items`,
`YdbLines.java`; `ydb.py` says what it covers: records with virtual timestamps and barriers,
or a batch without either; Bool, integer, Float/Double, Utf8 and Uuid columns; the primary
key as key). A batch with a line Java leaves (one the parser refuses, or one of the few it
accepts that Java does not read: `YdbLine.java`) is `Unsupported`: the Python path converts
it, or names its bad line. The parse's job also counts the checks' facts in the tasks (the
lines' bounds among them: a flawed line is counted, not parsed, and `Lines.check` names it),
and shuffles the rows by key (`checkpoint.kept_shuffle`, into partitions foreseen from the
files' size: `_parse_partitions`), and the conversion (`conversion.checked_conversion`) is
that shuffle's reduce side: the rows are written and read once.

The barrier rule (`barriers.py`): the parse's tasks mark each record below a barrier of its
block's earlier lines and report each block's highest barrier, the driver marks those below
an earlier block's (`barriers.Blocks`), and the conversion checks that each record below
repeats an earlier one (the few outside the times it converts, it counts, and a join looks
them up after it); where the tasks could not tell it (a block's rows out of order), a window
by chunk of lines and a join of the few records below a barrier. The frontier comes from each
file's highest barrier, found by the same steps. The rule in the conversion saves the window
and the lookup, less what the marking adds to the conversion (benchmarks/README.md, "YDB's
barrier rule checked by the conversion").

Where it may differ from `encode_changefeed` (shared with the Python path): a record below its
partition's barrier is a replay only if it repeats an earlier record of its file (the encoder
also skips one older than what its key already has applied, and refuses a repeat of a record
it has not applied yet, one at or past the frontier). This path only: the repeat's op and
images are compared by a 64-bit hash (`barriers.identity`), as two rows of a key at a
position are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from changelake.formats.tableschema import TableSchema
from changelake.spark.changefeed import ydb
from changelake.spark.changefeed.barriers import (
    BELOW_UNREPEATED,
    Blocks,
    LineFacts,
    barrier_frontier,
    barrier_rule,
    identity,
    marked_below,
    unrepeated_outside,
)
from changelake.spark.changefeed.conversion import Converted, checked_conversion
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.keyed import ColumnSpec, by_key, partitions_for
from changelake.spark.changefeed.read import Lines
from changelake.spark.changefeed.steps import Steps, guard
from changelake.spark.changefeed.ydb import untimed_positions, with_content, ydb_columns
from changelake.spark.checkpoint import kept_shuffle
from changelake.spark.settings import UNKNOWN_SIZE

#: A YDB batch's parsed columns not kept (as Debezium's `_FACTS_ONLY`): `file`, which no step
#: after the parse reads (the file's path is `Lines.files[file_index]`), and `ub`, all false
#: on every YDB record (no before image leaves a column UNCHANGED), which the conversion
#: makes again after its shuffle (`keyed.unchanged_before`) rather than store and move it.
_YDB_NOT_STORED = ("file", "ub")


def _named_flaw(read: Lines) -> NoReturn:
    """A line of `read` was counted out of its bounds (`read.flaw`): `Lines.check` names the
    first one as the encoder does."""
    read.check()
    raise Unsupported("a line out of bounds that the check did not find")


def _ydb_parsed_by_java(read: Lines, schema: TableSchema, columns: Sequence[ColumnSpec]
                        ) -> tuple[DataFrame, LineFacts, Blocks | None, int]:
    """A YDB batch's parsed lines as Java reads them (`ydb.java_items`), shuffled by key
    (without `_YDB_NOT_STORED`; see below), and their facts, counted by the tasks and observed
    by the same job, with `_below` (see `YdbLines.java`), and the barrier rule across its
    blocks (`barriers.Blocks`: None where the tasks could not tell it). A flawed line is named
    by `Lines.check`; a batch with a line Java leaves is `Unsupported`.

    The parse's job shuffles the rows by key (`checkpoint.kept_shuffle`), into the partitions
    `_parse_partitions` foresees (the last item returned), so the conversion reads them as
    its reduce side: they are written and read once, as the shuffle's files, not also as a
    checkpoint of their own."""
    java = ydb.java_items(read.bounded, schema, columns)
    observed = Observation()
    parsed = java.observe(observed, F.collect_list("_facts").alias("tasks")) \
        .drop("_deferred", "_facts", *_YDB_NOT_STORED)
    partitions = _parse_partitions(read)
    keys = len(schema.primary_key)
    items = guard(lambda: kept_shuffle(by_key(parsed, keys, partitions)))
    tasks = observed.get["tasks"]
    count = {name: sum(t[name] for t in tasks) for name in ydb.TASK_COUNTS}
    if count["flawed"]:
        _named_flaw(read)
    if count["deferred"]:
        raise Unsupported(f"unsupported: {count['deferred']} line(s) the Java line reader "
                          "leaves (a bad line, DEBEZIUM_JSON, an OLD_IMAGE record, a null in a "
                          "key, ...: `YdbLine.java`)")
    return (items, LineFacts(count["timed"], count["untimed"], count["barriers"]),
            Blocks.of(tasks), partitions)


#: The fewest bytes of input one YDB record takes (its JSON line, about, at the least), for
#: foreseeing a batch's records from its files' size before they are parsed
#: (`_parse_partitions`): an overestimate of the records makes partitions smaller than
#: `keyed.EVENTS_PER_PARTITION`, never larger.
BYTES_PER_RECORD = 48


def _parse_partitions(read: Lines) -> int:
    """The partitions a YDB batch's parsed rows are shuffled into by key: as `partitions_for`
    makes them for the records the files' size allows at most (`BYTES_PER_RECORD`), the
    session's shuffle partitions where Spark has no size (Kafka's records, stored). The
    conversion takes them where they hold its batch (`checked_conversion`'s `partitions`).

    The size is the sum of the plan's leaves' (for files, their lengths), not the plan's own
    estimate, which the lines' columns and the join with their names inflate threefold: more
    partitions than Spark writes without sorting (`spark.shuffle.sort.bypassMergeThreshold`,
    200) made the parse's map side sort and spill its whole output at 11M records."""
    leaves = read.bounded._jdf.queryExecution().optimizedPlan().collectLeaves()
    sizes = [int(leaves.apply(i).stats().sizeInBytes()) for i in range(leaves.size())]
    known = all(size < UNKNOWN_SIZE for size in sizes)
    return partitions_for(read.spark, sum(sizes) // BYTES_PER_RECORD if known else 0)


def ydb_changes(spark: SparkSession, read: Lines, *, keys: Sequence[str],
                table_schema: TableSchema, close: bool = False,
                state: DataFrame | None = None, since: int | None = None,
                defer: bool = False) -> Converted:
    """A YDB JSON batch on the Spark path (`ydb.py`, `barriers.py`), or `Unsupported` (see
    `ydb.py` for what is covered). Every file of `read` is a partition stream, a file without
    lines too. `defer`: see `checked_conversion`."""
    steps = Steps(spark)
    columns = ydb_columns(table_schema, keys)
    items, facts, blocks, partitions = _ydb_parsed_by_java(read, table_schema, columns)
    steps.done("read + parse + facts")
    if facts.untimed and (facts.timed or facts.barriers):
        raise Unsupported("records without ts beside records with ts or barriers")
    size = facts.timed + facts.untimed
    # The barrier rule: checked by the conversion where the parse's tasks found it within
    # their blocks (the records it does not see, by a lookup after it), else on its own.
    in_conversion = bool(facts.barriers) and blocks is not None
    last: dict[int, Any] = {}  # each file's highest barrier: none without barriers
    if in_conversion:
        assert blocks is not None
        items, last = marked_below(items, blocks), blocks.last
    elif facts.barriers:
        rule = guard(lambda: barrier_rule(items, len(keys), size + facts.barriers))
        if rule.unrepeated:
            raise Unsupported(BELOW_UNREPEATED)
        last = rule.last
    steps.done("barriers")
    events = items.where(F.col("kind") == "change")
    if facts.untimed:
        events = untimed_positions(events)
    frontier = None if close else barrier_frontier(last, len(read.files))
    marks = events.select("file_index", "row", "kind", "time",
                          F.lit(None).cast("string").alias("tx")).unionByName(
        items.where(F.col("kind") == "resolved").select(
            "file_index", "row", "kind", F.col("rpos")[0].cast("long").alias("time"),
            F.lit(None).cast("string").alias("tx")))
    window = F.lit(True)
    if frontier is not None:
        window = window & (F.col("time") < frontier)
    if since is not None:
        window = window & (F.col("time") >= since)
    after: Callable[[dict[str, Any]], str | None] | None = None
    events = with_content(events)
    if in_conversion:
        # The records below outside the window go to the conversion too, only to be counted
        # there (`KeyedConversion.java`), and looked up after it, as `barrier_rule` does.
        inside = window
        events = events.withColumns({"_same": F.xxhash64(identity(F.col("content")), "file_index"),
                                     "_outside": ~inside})
        window = inside | F.col("_below")

        def looked_up(found: dict[str, Any]) -> str | None:
            count = int(found.get("outside") or 0)
            if count and unrepeated_outside(items, ~inside, count, len(keys)):
                return BELOW_UNREPEATED
            return None
        after = looked_up
    converted, checks = checked_conversion(
        events.where(window), columns, keys, state, size, defer=defer,
        barriers=in_conversion, after=after, partitions=partitions)
    steps.done("events, ties, conversion")
    return Converted(converted, frontier, "jvm", marks=marks, checks=checks)
