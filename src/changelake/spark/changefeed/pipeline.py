"""The changefeed path on Spark, step by step: read, parse, types, times, keyed, progress.

`debezium_changes` converts a Debezium batch (PostgreSQL or MySQL payloads, with or without
the schema wrapper) wholly in the JVM: the files are read on the executors (`read.py`), parsed
(`parse.py`: by the project's Java line reader where the session has its jar, else with one
`from_json` per line; `_parsed`) into a local checkpoint, and aggregates observed by
the same job (`_facts`, no pass of their own) hold the lines to UTF-8 and the line bound
(`read.flaw`) and tell the later steps what they need of the batch. The changes are timed
with windows by transaction and by file block (`times.py`); the columns' types are decided
(`types.py`: the table schema, the state, the Debezium schema, else what Spark's JSON inference
over every image finds; that is found in any case, as it also finds image columns beyond the
table's: from the images' shapes, which the Java line reader gives and the parse's job
collects, `types.inferred_from_shapes`, else by the inference itself, one more pass) and
each image read against them once (`keyed.typed_images`: in Java where the
session has the jar and the image is plain, else `from_json`); keyed events are
shuffled by key once and converted, joined with the table's rows (`keyed.py`: by the
project's Java conversion, one pass over each key's events, where the session has the jar,
else with windows by key) and checked for key problems and ties by the job that reads them
(`checked_conversion`): one that writes a local checkpoint, or, for `lake.commands.ingest`,
the commit's write of the table's files, which are removed where a check fails
(`DeferredChecks`); without keys,
converted by their images (`unkeyed.py`); the frontier comes from aggregates
(`progress.py`). The driver sees one row per chunk of 2**16 lines (only when snapshot rows
need the current time: `times.py`), a handful of aggregate rows, and the images' distinct
shapes (at most `DebeziumLine.SHAPES` a task; a few in a feed of one table).
Each step's seconds and Spark jobs (Debezium and YDB) are logged at debug level (`_Steps`).

What it does not cover raises `Unsupported` before anything is returned (checked by aggregates
over the parsed batch, and by Spark refusing a value; with `defer`, the keyed conversion's
checks when its updates are written), and `convert_frames` then holds the lines
to the bounds (`read.Lines.check`, naming the first line out of them as the encoder does) and
hands the batch to the old path, `spark.changefeed.udf.changefeed_changes`, on the same
executor-read lines, which names bad lines as `encode_changefeed` does (with the differences its
docstring lists). A YDB batch's parse holds its lines to the bounds as Debezium's does.
Not covered yet: non-default `UpsertOptions`, any bad line, truncates, logical messages,
Kafka record dumps, Debezium key records, changes without a position (incremental snapshots),
two writes of one key with different rows at the greatest position it has reached (told
apart by a 64-bit hash of the row: `keyed.convert`), null keys, nested Connect types and
logical types other than Decimal and the temporal ones (`temporal.py`), a Debezium schema
that differs between lines, and the lenient mode (`strict=False`).

Where a covered batch may still differ from `encode_changefeed` (each shared with the old path
unless said): a snapshot row read after a transaction that metadata finished is placed at that
transaction's time, not one above (`times.py`); a change arriving after a later time was
finished is converted, not refused; the table's rows are not checked for one row per key (the
old path checks). This path only: a number beyond a double in a field no step reads
(`ts_ms`) is accepted, which orjson refuses. An image value of another JSON kind than its
column's, a number beyond a double or an integer beyond 64 bits in an image goes to the old
path (`keyed._refused`), which holds the first value's kind to be the column's.

`ydb_changes` converts a keyed YDB JSON batch the same way: parsed by the project's Java in
the tasks where the session has the jar and Java reads every line of the batch (the records
YDB writes, with nothing the typed parse would find a problem in: `ydb.java_items`,
`_ydb_parsed_by_java`), else with one typed `from_json` against the table schema's types
where a line is provably simple (in Java where the line is plainly so), with the VARIANT parse
otherwise (`ydb.py`, which says what it covers: records with virtual timestamps and barriers,
or a batch without either; Bool, integer, Float/Double, Utf8 and Uuid columns; the primary key
as key), checkpointed once by a job that also observes the checks' aggregates (the lines'
bounds among them: a flawed line is counted, not parsed); shuffled by key, converted and
checked as the Debezium events are (`checked_conversion`); its steps are logged as the
Debezium ones are. Where Java parsed the batch, the parse's job shuffles the rows by key
instead of checkpointing them (`session.kept_shuffle`, into partitions foreseen from the
files' size: `_parse_partitions`), and the conversion is that shuffle's reduce side: the
rows are written and read once, not stored and read back and then shuffled.
The barrier rule (`barriers.py`): where Java parsed the batch, its tasks
mark each record below a barrier of its block's earlier lines and report each block's highest
barrier, the driver marks those below an earlier block's (`barriers.Blocks`), and the
conversion checks that each record below repeats an earlier one (the few outside the times it
converts, it counts, and a join looks them up after it); elsewhere, one Java pass over each
block of lines in read order (a window by chunk of lines where that does not apply) and a
join of the few records below a barrier. The frontier comes from each file's highest barrier,
found by the same steps. The rule in the conversion saves the scan, its rescan and the lookup
(5.4 s of task time at 1.1M records, 21 s at 11M), less what the marking adds to the
conversion (benchmarks/README.md).
Where it may differ from `encode_changefeed` (shared with the old path): a record below its
partition's barrier is a replay only if it repeats an earlier record of its file (the encoder
also skips one older than what its key already has applied, and refuses a repeat of a record
it has not applied yet, one at or past the frontier). This path only: the repeat's op and
images are compared by a 64-bit hash (`barriers.identity`), as two rows of a key at a
position are.

`convert_frames` is what `lake.commands.ingest` converts a changefeed with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import orjson
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F

from changelake.errors import ChangelakeError
from changelake.formats.lines import TOO_LONG
from changelake.formats.tableschema import TableSchema, read_table_json
from changelake.spark.changefeed import times, ydb
from changelake.spark.changefeed.barriers import (
    Blocks,
    LineFacts,
    barrier_frontier,
    barrier_rule,
    identity,
    marked_below,
    unrepeated_outside,
)
from changelake.spark.changefeed.keyed import (
    ColumnSpec,
    by_key,
    checkpoint,
    convert,
    java_convert,
    java_ready,
    key_names,
    partitions_for,
    problem_of,
    typed_events,
)
from changelake.spark.changefeed.parse import (
    ENVELOPE,
    java_items,
    odd_name_lines,
    odd_names,
    parse_items,
)
from changelake.spark.changefeed.progress import debezium_frontier
from changelake.spark.changefeed.read import Lines, flaw, read_lines
from changelake.spark.changefeed.times import assign_times
from changelake.spark.changefeed.types import (
    SUPPORTED,
    Decoder,
    Unsupported,
    connect_decoder,
    image_fields,
    infer_images,
    inferred_from_shapes,
    spark_type,
)
from changelake.spark.changefeed.unkeyed import convert_images, image_events
from changelake.spark.changefeed.ydb import (
    untimed_positions,
    with_content,
    ydb_columns,
    ydb_items,
)
from changelake.spark.errors import input_error
from changelake.spark.expressions import per_jvm
from changelake.spark.session import NOT_ADAPTIVE, UNKNOWN_SIZE, kept_shuffle, settings, stored

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Converted:
    changes: DataFrame  # (data struct, time long, diff long), consolidated
    frontier: int | None  # None: closed
    path: str  # "jvm" or "python-udf" (the old path)
    reason: str | None = None  # why the old path was taken
    # The JVM path's lines that say where a re-read must start (`lake.kafka_changefeed`):
    # file_index, row, kind and time of every change (time: its CDCv2 time), of every
    # Debezium BEGIN/END (with its `tx`; time null), of every YDB barrier (time: its step).
    marks: DataFrame | None = None
    # Not None: `changes` are not checked yet (`convert_lines`' `defer`); the job that reads
    # them whole must be run by `checks.write`, and its result undone where that raises.
    checks: DeferredChecks | None = None


class _Steps:
    """Seconds and Spark jobs per step, logged at debug level (`benchmarks/bench_ingest.py`
    prints them). Nothing is asked of Spark without it: the job ids come to Python one round
    trip each, up to a thousand (the jobs Spark keeps) per step in a long-lived session."""

    def __init__(self, spark: SparkSession) -> None:
        self._on = log.isEnabledFor(logging.DEBUG)
        self._tracker = spark.sparkContext.statusTracker()
        self._at = time.perf_counter()
        self._job = self._last_job()

    def _last_job(self) -> int:
        return max(self._tracker.getJobIdsForGroup(), default=-1) if self._on else -1

    def done(self, step: str) -> None:
        if not self._on:
            return
        now, job = time.perf_counter(), self._last_job()
        log.debug("step %-22s %6.2f s %2d jobs", step, now - self._at, job - self._job)
        self._at, self._job = now, job


#: What in a failed job's text says that Spark ran short of memory or disk (or went down
#: after that), which no other path would fare better with.
_SHORT_OF = ("OutOfMemoryError", "No space left on device", "SparkContext was shut down")


def _guard(action: Any) -> Any:
    """Run one of the checking actions. A failure in it is a value Spark refuses (`from_json`
    in FAILFAST mode, a cast, base64, a decimal wider than 8 bytes): `Unsupported`, so that the
    old path converts the batch or names the bad line. The parsed lines and the typed events
    (YDB's: their conversion) are checkpointed by these actions, so the final job parses
    nothing again (a state whose values do not cast to the columns' types is the one failure
    left to a Debezium batch's).

    Spark short of memory or disk is no refusal: the old path holds more of the batch at once
    (and a JVM out of memory in local mode is going down), so that is a `ChangelakeError`
    saying so, not a switch to the old path that would hide it."""
    try:
        return action()
    except (Py4JJavaError, PySparkException) as error:
        raise _failure(error) from None


def _failure(error: Exception) -> Exception:
    """What a failed checking action means (see `_guard`)."""
    unreadable = input_error(error)  # a file Spark's reader cannot read: no path reads it
    if unreadable is not None:
        return unreadable
    lines = [line.strip() for line in str(error).strip().splitlines()]
    short = next((line for line in lines if any(m in line for m in _SHORT_OF)), None)
    if short is not None:
        return ChangelakeError(
            f"Spark ran short converting the changefeed ({short[:200]}); not a problem of the "
            "input: give Spark more memory (`--conf spark.driver.memory=4g`) or disk, or "
            "convert fewer files at once")
    first = lines[0][:200] if lines else ""
    return Unsupported(f"bad: a value Spark refuses ({first})")


def _first_problem(frame: DataFrame) -> str | None:
    row = _guard(lambda: frame.where(F.col("problem").isNotNull())
                 .agg(F.min("problem")).first())
    return row[0] if row is not None else None


@per_jvm
def _facts() -> list[Column]:
    """What the later steps need to know about the batch: aggregates over the parsed lines,
    observed while they are checkpointed (`DataFrame.observe`), so that no pass of its own
    reads them again for it. Built once per JVM (`expressions.per_jvm`). Where Java reads the
    lines in the tasks (`parse.java_items`), each task counts them itself and the
    observation gathers one row a task (`_merged_facts`): Spark's aggregates, evaluated for
    every line, were about 6% of a warm ingest's executor time (a profile,
    benchmarks/README.md). The two give the same facts (`tests/test_spark_changefeed_jvm.py`,
    `tests/test_spark_changefeed_debezium.py`)."""
    change = F.col("kind") == "change"
    return [
        F.count("flaw").alias("flawed"), F.min("problem").alias("problem"),
        F.count(F.when(change, 1)).alias("changes"),
        # Two tables or one: the least and the greatest name differ or not (a distinct count
        # is no aggregate an observation can run).
        F.min(F.when(change, F.col("table"))).alias("table"),
        F.max(F.when(change, F.col("table"))).alias("other_table"),
        F.count(F.when(change & F.col("ptime").isNull(), 1)).alias("untimed"),
        F.count(F.when(change & F.col("tx_min"), 1)).alias("by_tx"),
        F.count(F.when(F.col("kind").isin("BEGIN", "END") | F.col("tx_order").isNotNull(), 1))
        .alias("metadata"),
        F.max(F.when(change, F.col("ptime"))).alias("high"),
        F.min("schema").alias("schema"), F.max("schema").alias("other_schema"),
        F.count(F.when(change & F.col("schema").isNull(), 1)).alias("schemaless"),
        F.min_by(F.when(change, F.struct("after_raw", "before_raw", "schema")),
                 F.when(change & (F.col("after_raw").isNotNull()
                                  | F.col("before_raw").isNotNull()),
                        F.struct("file_index", "block", "row"))).alias("first")]


def _merged_facts(tasks: Sequence[Any]) -> dict[str, Any]:
    """`_facts` (and `_deferred`, `shapes`) from the tasks' `parse.TASK_FACTS` rows: what the
    aggregates give over all of their lines."""
    def pick(choose: Callable[..., Any], name: str) -> Any:
        values = [t[name] for t in tasks if t[name] is not None]
        return choose(values) if values else None

    first = min((t for t in tasks if t["first_row"] is not None), default=None,
                key=lambda t: (t["first_file_index"], t["first_block"], t["first_row"]))
    counts = ("flawed", "changes", "untimed", "by_tx", "metadata", "schemaless", "_deferred")
    total = {n: sum(t[n] for t in tasks) for n in counts}
    return {
        "flawed": total["flawed"], "problem": None, "changes": total["changes"],
        "table": pick(min, "table"), "other_table": pick(max, "other_table"),
        "untimed": total["untimed"], "by_tx": total["by_tx"], "metadata": total["metadata"],
        "high": pick(max, "high"), "schema": pick(min, "schema"),
        "other_schema": pick(max, "other_schema"), "schemaless": total["schemaless"],
        "first": None if first is None else Row(after_raw=first["first_after"],
                                                 before_raw=first["first_before"],
                                                 schema=first["first_schema"]),
        "_deferred": total["_deferred"],
        "shapes": sorted({s for t in tasks for s in t["shapes"]})}


#: The parsed lines' columns that only `_facts` reads: not stored in the checkpoint (the
#: file's name is `Lines.files[file_index]`), which is then a line's path and three fields
#: smaller on the executors' disk. The parse's job alone, warm, at 1.1M lines: about 4% less
#: time; end to end within the noise (benchmarks/README.md).
_FACTS_ONLY = ("file", "flaw", "problem", "table")


def _parsed(lines: Lines) -> tuple[DataFrame, dict[str, Any]]:
    """The parsed lines, checkpointed (`session.stored`) without `_FACTS_ONLY`, and their
    `_facts`, observed by the same job.

    With the project's jar, Java alone reads the lines first (`parse.java_items`); where it
    read every one (a batch of the shapes connectors write: changes, transaction boundaries,
    tombstones, heartbeats), that is the parse, without any of the Spark functions'
    expressions (which cost even over the lines Java read: `parse_items`). Where it left some,
    that job's work is dropped and `parse_items` reads the batch again, Java's lines and the
    rest. Java's job also collects the rows `times.chunks_of` would aggregate (`chunks`, one
    per chunk of lines that has a change), so that placing snapshot rows in time reads the
    checkpoint no more (`times.assign_times`' `chunk_rows`)."""
    java = java_items(lines.bounded, chunk_bits=times.CHUNK_BITS)
    if java is not None:
        observed = Observation()
        tasks = F.collect_list("_facts").alias("tasks")  # one a task
        chunks = F.collect_list("_chunk").alias("chunks")  # one per chunk of 2**16 lines
        items = _guard(lambda: stored(java.observe(observed, tasks, chunks).drop(
            "_deferred", "shape", "_chunk", "_facts", *_FACTS_ONLY)))
        found = _merged_facts(observed.get["tasks"])
        if not found.pop("_deferred"):
            return items, {**found, "chunks": observed.get["chunks"]}
    facts = Observation()
    items = _guard(lambda: stored(parse_items(lines.bounded).observe(facts, *_facts())
                                  .drop(*_FACTS_ONLY)))
    return items, facts.get


def _column_names(first: Any, schema: TableSchema | None) -> list[str]:
    if schema is not None:
        return list(schema.names)
    image = first["after_raw"] if first["after_raw"] is not None else first["before_raw"]
    raw = list(orjson.loads(image))
    fields = image_fields(first["schema"]) or {}
    return [*(n for n in fields if n in raw), *(n for n in raw if n not in fields)]


def _columns(spark: SparkSession, changes: DataFrame, facts: Any, schema: TableSchema | None,
             state: DataFrame | None) -> list[ColumnSpec]:
    """Names and types (see `types.py`); drift (an image column beyond them) is a bad line."""
    if facts["first"] is None:  # changes, none with an image (a batch of none returns before)
        raise Unsupported("no row images in the batch")
    names = _column_names(facts["first"], schema)
    if facts["schema"] != facts["other_schema"] and \
            image_fields(facts["schema"]) != image_fields(facts["other_schema"]):
        raise Unsupported("Debezium schemas that differ between lines")
    connect = image_fields(facts["schema"])
    inferred = inferred_from_shapes(facts["shapes"]) if "shapes" in facts else None
    if inferred is None:
        images = changes.select(F.col("after_raw").alias("value")).where("value IS NOT NULL") \
            .unionByName(changes.select(F.col("before_raw").alias("value"))
                         .where("value IS NOT NULL"))
        inferred = {f.name: f.dataType.simpleString() for f in
                    _guard(lambda: infer_images(spark, images)).fields}
    drift = [n for n in inferred if n not in names]
    if drift:
        raise Unsupported(f"bad: columns {drift} beyond the table's (schema drift)")
    stated = {f.name: f.dataType.simpleString() for f in state.schema.fields} \
        if state is not None else {}
    out = []
    for n in names:
        column = schema.column(n) if schema is not None else None
        with_schema, t1 = connect_decoder((connect or {}).get(n))
        without, t2 = connect_decoder(column.debezium if column is not None else None)
        if not facts["schemaless"] and column is None:
            without = with_schema  # every change carries its schema: nothing reads without
        if column is not None and column.type:
            kind = spark_type(column.type)
        elif stated.get(n) in SUPPORTED:
            kind = stated[n]
        elif connect is not None and t1 is not None and (t2 is None or t1 == t2):
            kind = t1
        elif t2 is not None and connect is None:
            kind = t2
        else:
            kind = inferred.get(n, "string")
        if kind not in SUPPORTED:
            raise Unsupported(f"column {n} of type {kind}")
        decoders = {d.kind for d in (with_schema, without)}
        raws = {d.raw_type for d in (with_schema, without)} - {None}
        if len(raws) > 1:
            raise Unsupported(f"column {n}: decoded two ways")
        raw = raws.pop() if raws else kind
        if raw != kind and kind != "string":
            raise Unsupported(f"column {n}: a {kind} decoded from text")
        if decoders != {"plain"} and Decoder() in (with_schema, without):
            raise Unsupported(f"column {n}: decoded on some lines only")
        out.append(ColumnSpec(n, kind, raw, with_schema, without))
    return out


#: The keyed events' columns that the checks and the conversion read, besides the key's.
_WANTED = ("time", "pos", "rank", "is_delete", "a", "ua", "b", "ub", "content", "problem")


#: The columns the barrier rule in the conversion reads, besides `_WANTED`
#: (`keyed.java_convert`'s `barriers`).
_BARRIERS_WANTED = ("_below", "_same", "_outside")


def _by_key(events: DataFrame, keys: int, size: int, *, barriers: bool = False,
            partitions: int | None = None) -> DataFrame:
    """The keyed events' key and `_WANTED` columns (and `_BARRIERS_WANTED`, with
    `barriers`), shuffled by key (`by_key`) into partitions for about `size` events
    (`partitions_for`); where the session has the Java conversion, with the keys and
    positions it reads (`java_ready`) made before the shuffle. `partitions`: those the
    events already come in by key (`_ydb_parsed_by_java`), kept where they are at least as
    many: Spark then plans no shuffle here (the one asked for is the partitioning they have)."""
    wanted = (*_WANTED, *_BARRIERS_WANTED) if barriers else _WANTED
    if "ub" not in events.columns:  # all false (YDB's): made again after the shuffle
        wanted = tuple(c for c in wanted if c != "ub")
    events = events.select(*key_names(events.columns, keys), *wanted)
    ready = java_ready(events, keys)
    needed = partitions_for(events.sparkSession, size)
    if partitions is not None and partitions >= needed:
        needed = partitions
    return by_key(events if ready is None else ready, keys, needed)


def checked_conversion(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
                       state: DataFrame | None, size: int, *, defer: bool = False,
                       barriers: bool = False,
                       after: Callable[[dict[str, Any]], str | None] | None = None,
                       partitions: int | None = None
                       ) -> tuple[DataFrame, DeferredChecks | None]:
    """Keyed events shuffled by key once (`by_key`, into partitions for about `size` events:
    `partitions_for`; only the columns the conversion reads, `_WANTED`: the lines' places
    are `marks`') and converted (`keyed.java_convert`, else `keyed.convert`), and checked
    (`convert`'s `checks`: a key problem, or two writes of one key at one position with
    different rows where the order would need their text; the Java conversion's report rows,
    observed the same way) by the job that reads them: a problem is `Unsupported`, once that
    job is done.

    That job writes a checkpoint, and its checks are settled here, unless `defer`: then the
    updates come back unread, with the `DeferredChecks` the job that writes them must settle
    (the lake commit's, which writes the table's files straight from the conversion, instead of
    from a checkpoint written and read again for it: YDB's ingest took 0.91x the time at 1.1M
    and 11M events, Debezium's no measurable difference; one copy of the updates on disk
    fewer for both: benchmarks/README.md). Before the checkpoint, the events were
    checkpointed, an aggregate by key and position read them back for the check, and the
    lake's write converted them.

    `barriers`: the Java conversion checks YDB's barrier rule over the events too (they have
    `_below`, `_same` and `_outside`: `keyed.java_convert`); `after`, a check of the job's
    settling that follows its own (`DeferredChecks.after`); `partitions`, those the events
    already come in by key (see `_by_key`)."""
    checks = Observation()
    shuffled = _by_key(events, len(keys), size, barriers=barriers, partitions=partitions)

    def converted() -> DataFrame:
        with settings(events.sparkSession, NOT_ADAPTIVE):  # see `keyed.java_convert`
            java = java_convert(shuffled, columns, keys, state, barriers=barriers)
            if java is None:
                if barriers:
                    raise Unsupported("the barrier rule in a conversion without Java")
                return convert(shuffled, columns, keys, state, checks=checks)
            return (java.observe(checks, F.min("problem").alias("problem"),
                                 F.max("tied").alias("tied"),
                                 F.max("unrepeated").alias("unrepeated"),
                                 F.sum("outside").alias("outside"))
                    .where(F.col("diff") != 0).select("data", "time", "diff"))

    updates = _guard(converted)  # planned here (`keyed.java_convert`): a failure is a refusal
    deferred = DeferredChecks(checks, updates, after)
    if defer:
        return updates, deferred
    stored_updates = _guard(lambda: checkpoint(updates))
    deferred.settle()
    return stored_updates, None


@dataclass(frozen=True)
class DeferredChecks:
    """The checks of a conversion whose updates no job has read yet (`checked_conversion`'s
    `defer`): Spark observes them (`DataFrame.observe`) in the job that reads the updates
    whole, and `settle` says how they came out. A caller that relies on the updates before
    they are settled must be able to undo that: the lake commit writes the table's files, and
    removes them again where `write` raises."""

    observation: Observation
    updates: DataFrame
    # A check that needs the job's observation first (and may run jobs of its own): given
    # what was observed, the problem it finds, or None.
    after: Callable[[dict[str, Any]], str | None] | None = None

    def write(self, action: Callable[[], None]) -> None:
        """Run `action`, the job that reads the updates whole (a write of them, filtered or
        cast above the observation), then `settle`. A value Spark refuses in that job is
        `Unsupported`, as in the steps before it (`_guard`)."""
        _guard(action)
        self.settle()

    def settle(self, *, read: bool = True) -> None:
        """Raise `Unsupported` where the checks found a problem. Without `read` (no job has
        read the updates: a commit with nothing new to write), a job reads them first, to
        Spark's `noop` sink: an observation is only made by a job that runs it, and is waited
        for forever otherwise."""
        if not read:
            _guard(lambda: self.updates.write.format("noop").mode("overwrite").save())
        found = self.observation.get
        problem = problem_of(found["problem"], found["tied"])
        if problem is None and found.get("unrepeated"):
            problem = BELOW_UNREPEATED
        if problem is None and self.after is not None:
            after = self.after
            problem = _guard(lambda: after(found))
        if problem is not None:
            raise Unsupported(problem)


@dataclass(frozen=True)
class Timed:
    """A Debezium batch up to its conversion: what `debezium_changes` converts."""

    changes: DataFrame  # the changes with their times, below the frontier, from `since` on
    columns: list[ColumnSpec]  # the table's columns and how each image value is read
    frontier: int | None  # None: closed
    marks: DataFrame  # see `Converted.marks`
    size: int  # the changes parsed: the most `changes` can hold, before keys move


def debezium_timed(spark: SparkSession, lines: Lines, *,
                   table_schema: TableSchema | None = None, close: bool = False,
                   state: DataFrame | None = None, since: int | None = None,
                   steps: _Steps | None = None) -> Timed:
    """Read, parse, facts, times, frontier and columns of a Debezium batch (see the module
    docstring), or `Unsupported`. Where the files are Kafka partitions (`lines.per_file`) and
    no transaction metadata is read, the high-water rule holds per partition: see
    `_partition_cap`."""
    steps = steps or _Steps(spark)
    items, facts = _parsed(lines)
    steps.done("read + parse + facts")
    if facts["flawed"]:
        raise Unsupported("a line over the bound or not UTF-8")  # `convert_frames` names it
    if facts["problem"] is not None:
        raise Unsupported(facts["problem"])
    if facts["table"] != facts["other_table"]:
        raise Unsupported("bad: events of two tables")
    if odd_names(facts["table"]) and \
            _guard(lambda: odd_name_lines(lines.bounded).first()) is not None:
        raise Unsupported("unsupported: a source table, schema or db that may not be text")
    changes = items.where(F.col("kind") == "change")
    timed = assign_times(spark, changes, by_tx=bool(facts["by_tx"]),
                         untimed=int(facts["untimed"]), per_file=lines.per_file,
                         chunk_rows=facts.get("chunks"))
    frontier = None if close else debezium_frontier(timed, items, facts["high"],
                                                    bool(facts["metadata"]), facts["table"])
    if frontier is not None and lines.per_file and not facts["metadata"]:
        frontier = _partition_cap(timed, frontier)
    marks = timed.select("file_index", "row", "kind", "time", "tx").unionByName(
        items.where(F.col("kind").isin("BEGIN", "END"))
        .select("file_index", "row", "kind", F.lit(None).cast("long").alias("time"), "tx"))
    steps.done("times + frontier")
    if not facts["changes"]:  # nothing to read columns from, nor to convert
        return Timed(timed, [], frontier, marks, 0)
    columns = _columns(spark, changes, facts, table_schema, state)
    steps.done("columns")
    if frontier is not None:
        timed = timed.where(F.col("time") < frontier)
    if since is not None:
        timed = timed.where(F.col("time") >= since)
    return Timed(timed, columns, frontier, marks, int(facts["changes"]))


def debezium_changes(spark: SparkSession, lines: Lines, *, keys: Sequence[str],
                     table_schema: TableSchema | None = None, close: bool = False,
                     state: DataFrame | None = None, since: int | None = None,
                     defer: bool = False) -> Converted:
    """A Debezium batch on the JVM path, or `Unsupported`. Without `keys`, the images are
    converted as they are (`unkeyed.py`). `defer`: see `checked_conversion`."""
    steps = _Steps(spark)
    batch = debezium_timed(spark, lines, table_schema=table_schema, close=close, state=state,
                           since=since, steps=steps)
    if not batch.size:
        return Converted(_no_updates(spark, table_schema), batch.frontier, "jvm",
                         marks=batch.marks)
    if not keys:
        events = _guard(lambda: stored(image_events(batch.changes, batch.columns)))
        problem = _first_problem(events)
        if problem is not None:
            raise Unsupported(problem)
        return Converted(convert_images(events.where(F.col("problem").isNull())),
                         batch.frontier, "jvm", marks=batch.marks)
    converted, checks = checked_conversion(typed_events(batch.changes, batch.columns, keys),
                                           batch.columns, keys, state, batch.size, defer=defer)
    steps.done("events, ties, conversion")
    return Converted(converted, batch.frontier, "jvm", marks=batch.marks, checks=checks)


def _no_updates(spark: SparkSession, table_schema: TableSchema | None) -> DataFrame:
    """The updates of a batch without changes (heartbeats, tombstones, transaction lines), as
    the old path gives them: none, of the table schema's columns (each of its stated type,
    else text), or of none without it (`lake.commands.check_columns` then makes no table of
    it)."""
    fields = [] if table_schema is None else [
        f"`{c.name}`: {spark_type(c.type)}" for c in table_schema.columns]
    return spark.createDataFrame([], f"data struct<{', '.join(fields)}>, time bigint, "
                                     "diff bigint")


def _partition_cap(timed: DataFrame, frontier: int) -> int:
    """The high-water rule per Kafka partition. Debezium writes each partition in log order,
    so a partition whose highest time read is `h` has delivered everything it will hold below
    `h`; but the partitions are written independently, so an event below another partition's
    highest may still be on its way to this one. The batch's frontier is therefore at most the
    least of the partitions' highest times (of the partitions read from: one that brought
    nothing holds nothing back). With transaction metadata the ENDs count each transaction's
    events, wherever they are, and no cap is needed."""
    row = timed.groupBy("file_index").agg(F.max("time").alias("h")).agg(F.min("h")).first()
    return frontier if row is None or row[0] is None else min(frontier, int(row[0]))


#: A YDB batch's parsed columns not checkpointed (as `_FACTS_ONLY`): `file`, which no step
#: after the parse reads (the file's path is `Lines.files[file_index]`), and `ub`, all false
#: on every YDB record (no before image leaves a column UNCHANGED), which the conversion
#: makes again after its shuffle (`keyed.unchanged_before`) rather than store and move it.
_YDB_NOT_STORED = ("file", "ub")


#: YDB's barrier rule broken (`barriers.py`): the old path names the line.
BELOW_UNREPEATED = "bad: a record below its partition's barrier"


def _named_flaw(read: Lines) -> NoReturn:
    """A line of `read` was counted out of its bounds (`read.flaw`): `Lines.check` names the
    first one as the encoder does."""
    read.check()
    raise Unsupported("a line out of bounds that the check did not find")


def _ydb_parsed_by_java(read: Lines, schema: TableSchema, columns: Sequence[ColumnSpec]
                        ) -> tuple[DataFrame, LineFacts, Blocks | None, int] | None:
    """A YDB batch's parsed lines as Java alone reads them (`ydb.java_items`), shuffled by
    key (without `_YDB_NOT_STORED`; see below), and their facts, counted by the tasks and
    observed by the same job: where Java read every line (the records YDB writes, without a
    problem), that is the typed parse's result without its expressions over every line, with
    `_below` (see `YdbLines.java`), and the barrier rule across its blocks (`barriers.Blocks`:
    None where the tasks could not tell it). None where it left a line (or has no jar): the caller
    parses the batch the typed way, which reads the lines Java leaves and names the problems.
    A flawed line is named by `Lines.check`.

    The parse's job shuffles the rows by key (`session.kept_shuffle`), into the partitions
    `_parse_partitions` foresees (the last item returned), so the conversion reads them as
    its reduce side: they are written and read once, as the shuffle's files, not also as a
    checkpoint of their own."""
    java = ydb.java_items(read.bounded, schema, columns)
    if java is None:
        return None
    observed = Observation()
    parsed = java.observe(observed, F.collect_list("_facts").alias("tasks")) \
        .drop("_deferred", "_facts", *_YDB_NOT_STORED)
    partitions = _parse_partitions(read)
    keys = len(schema.primary_key)
    items = _guard(lambda: kept_shuffle(by_key(parsed, keys, partitions)))
    if items is None:  # no jar: `java_items` was None already
        return None
    tasks = observed.get["tasks"]
    count = {name: sum(t[name] for t in tasks) for name in ydb.TASK_COUNTS}
    if count["flawed"]:
        _named_flaw(read)
    if count["deferred"]:
        return None
    return (items, LineFacts(None, 0, count["timed"], count["untimed"], count["barriers"]),
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
    """A YDB JSON batch on the JVM path (`ydb.py`, `barriers.py`), or `Unsupported` (see
    `ydb.py` for what is covered). Every file of `read` is a partition stream, a file without
    lines too. `defer`: see `checked_conversion`."""
    steps = _Steps(spark)
    columns = ydb_columns(table_schema, keys)
    marked = flaw(F.col("value"))

    def parsed(careful: bool) -> tuple[DataFrame, LineFacts]:
        # The lines are held to their bounds by the parse's own job (`read.flaw`, counted as
        # they pass), not by a pass of their own: a flawed line never reaches the parse, and
        # `Lines.check` names it afterwards.
        observed, flaws = Observation(), Observation()
        lines = read.bounded.select("*", marked.alias("_flaw")) \
            .observe(flaws, F.count("_flaw").alias("flawed")) \
            .where(F.col("_flaw").isNull()).drop("_flaw")
        items = _guard(lambda: stored(ydb_items(lines, table_schema, columns, careful=careful)
                                      .observe(observed, *LineFacts.aggregates())
                                      .drop(*_YDB_NOT_STORED)))
        if flaws.get["flawed"]:
            _named_flaw(read)
        return items, LineFacts.of(observed.get)

    by_java = _ydb_parsed_by_java(read, table_schema, columns)
    blocks: Blocks | None = None
    partitions: int | None = None  # the parse's shuffle's, where the parse shuffled by key
    if by_java is not None:
        items, facts, blocks, partitions = by_java
    else:
        items, facts = parsed(careful=False)
        if facts.careful:
            items, facts = parsed(careful=True)
    steps.done("read + parse + facts")
    if facts.problem is not None:
        raise Unsupported(facts.problem)
    if facts.untimed and (facts.timed or facts.barriers):
        raise Unsupported("records without ts beside records with ts or barriers")
    size = facts.timed + facts.untimed
    # The barrier rule: checked by the conversion where the parse's tasks found it within
    # their blocks (the records it does not see, by a lookup after it), else on its own. The
    # tasks are the project's Java, whose jar holds the conversion too.
    in_conversion = bool(facts.barriers) and blocks is not None
    last: dict[int, Any] = {}  # each file's highest barrier: none without barriers
    if in_conversion:
        assert blocks is not None
        items, last = marked_below(items, blocks), blocks.last
    elif facts.barriers:
        rule = _guard(lambda: barrier_rule(items, len(keys), size + facts.barriers,
                                           read_order=partitions is None))
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


def convert_frames(spark: SparkSession, inputs: Sequence[str | Path], source: str,
                   key: Sequence[str], schema_file: Path | None, *,
                   state: DataFrame | None = None, since: int | None = None,
                   close: bool = False, jvm: bool = True, defer: bool = False,
                   reason: str | None = None) -> Converted:
    """Debezium or YDB JSON lines converted on Spark: consolidated updates and the frontier,
    by the JVM path where it applies, else the old path on the same lines (see above).
    `jvm=False` takes the old path whatever the batch (to compare the two: benchmarks), and so
    does a `reason` (why: a deferred check failed, `defer`, see `checked_conversion`).
    `lake.commands.ingest` converts with `defer`, the checks settled by its commit's write,
    and again with the `reason` they give where they fail.

    `state` holds the table's current rows (one per key): a keyed conversion takes a key's
    previous row from it, so an update or delete of a row committed earlier retracts it.
    `since` is the table's committed frontier: changes before it are already in `state`.
    `close`: the input is the whole feed, so every time in it is finished (the frontier is
    None); without it, the times the feed cannot show complete stay open."""
    from changelake.formats.materialize import expand_paths

    files = [str(p) for p in expand_paths([str(p) for p in inputs])]
    table_json = read_table_json(schema_file) if schema_file else None
    return convert_lines(spark, read_lines(spark, files), source, key, table_json,
                         state=state, since=since, close=close, jvm=jvm, defer=defer,
                         reason=reason)


def convert_lines(spark: SparkSession, lines: Lines, source: str, key: Sequence[str],
                  table_json: dict[str, Any] | None, *, state: DataFrame | None = None,
                  since: int | None = None, close: bool = False,
                  old_path: bool = True, jvm: bool = True, defer: bool = False,
                  reason: str | None = None) -> Converted:
    """`convert_frames` on lines already read. Without `old_path`, a batch the JVM path does
    not cover is only read by the old path to name its first bad line (`ChangefeedError`);
    one without a bad line raises `Unsupported`: for Kafka partitions (`read.record_lines`),
    whose order across partitions the old path, reading file after file, does not keep.
    Without `jvm`, or with a `reason`, the old path converts the batch, whatever it holds.
    `defer`: the JVM path's keyed conversion is checked by the job that reads it
    (`Converted.checks`), not before it is returned."""
    schema = TableSchema.from_json(table_json) if table_json is not None else None
    keys = list(key) or (list(schema.primary_key) if schema is not None else [])
    if reason is None and not jvm:
        reason = "the old path was asked for"
    if source == "ydb":
        if schema is None:
            reason = "unsupported: YDB without a table schema"
        elif not keys:
            reason = "unsupported: YDB without key columns"
    if reason is None:
        try:
            if source == "ydb":
                assert schema is not None
                return ydb_changes(spark, lines, keys=keys, table_schema=schema, close=close,
                                   state=state, since=since, defer=defer)
            return debezium_changes(spark, lines, keys=keys, table_schema=schema, close=close,
                                    state=state, since=since, defer=defer)
        except Unsupported as why:
            reason = str(why)
    log.info("changefeed conversion on the Python path: %s", reason)
    # The JVM path's parse checks the bounds of a batch it converts; one it gives up on (for
    # whatever reason, a bad line included), or never reads, is checked here.
    lines.check()
    from changelake.spark.changefeed.udf import changefeed_changes

    numbered = lines.numbered().select("value", "file", "line")
    frames = changefeed_changes(numbered, source=source,  # type: ignore[arg-type]
                                keys=list(key) or None, table_schema=table_json, state=state,
                                since=since, close=close)
    changes = (frames.changes.groupBy("data", "time").agg(F.sum("diff").alias("diff"))
               .where(F.col("diff") != 0))
    if not old_path:
        changes.count()  # the old path names the first bad line, if there is one
        raise Unsupported(str(reason))
    return Converted(changes, frames.frontier, "python-udf", reason)


def bad_lines(lines: Lines, source: str, table_json: dict[str, Any] | None,
              key: Sequence[str]) -> DataFrame:
    """The lines a lenient read sets aside before converting the rest: `file`, `file_index`,
    `row` and `reason`. A line over the bound or not UTF-8, one that is not a JSON object, and
    one the parse marks bad (its problem starts with "bad"; `parse.py`, `ydb.py`). What the
    conversion refuses later (a value Spark cannot read into the envelope, an image column
    beyond the table's) still stops the read: it is `Unsupported`. Checkpointed: few rows in
    a good feed, read by the caller twice (to drop them, to report them)."""
    value = F.col("value")
    flawed = flaw(value)
    shape = (F.when(flawed == 1, F.lit(TOO_LONG)).when(flawed == 2, F.lit("not UTF-8 text"))
             .when((F.trim(value) != "null") & F.json_object_keys(value).isNull(),
                   F.lit("not a JSON object")))
    first = lines.bounded.select("file", "file_index", "row", shape.alias("reason")) \
        .where(F.col("reason").isNotNull())
    rest = lines.frame.join(first.select("file_index", "row"), ["file_index", "row"],
                            "left_anti")
    if source == "ydb":
        schema = TableSchema.from_json(table_json) if table_json is not None else None
        if schema is None:
            raise Unsupported("unsupported: YDB without a table schema")
        keys = list(key) or list(schema.primary_key)
        items = ydb_items(rest, schema, ydb_columns(schema, keys), careful=True)
    else:
        # what the parse's FAILFAST envelope would stop the whole read at: a field of the
        # wrong JSON kind (a text `source`, say), found here line by line
        corrupt = F.from_json("value", f"{ENVELOPE}, _corrupt string", {
            "mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})["_corrupt"]
        kinds = rest.select("file", "file_index", "row", F.when(
            corrupt.isNotNull() & (F.trim("value") != "null"),
            F.lit("not a Debezium event: a field of the wrong JSON kind")).alias("reason")) \
            .where(F.col("reason").isNotNull())
        first = first.unionByName(kinds)
        items = parse_items(rest.join(kinds.select("file_index", "row"),
                                      ["file_index", "row"], "left_anti"))
    parsed = items.where(F.col("problem").startswith("bad")) \
        .select("file", "file_index", "row", F.col("problem").alias("reason"))
    return _guard(lambda: first.unionByName(parsed).localCheckpoint())

