"""The keyed conversion, checked by the job that reads it: the step both formats end in.

A batch's keyed events (`keyed.typed_events` for Debezium's, `ydb.py`'s for YDB's) are shuffled
by key once (or come shuffled by YDB's parse: `ydb_path.py`), only the columns the conversion
reads (`_WANTED`), and converted in the tasks, joined with the table's rows, by the project's
Java (`keyed.java_convert`, one pass over each key's events). The updates come in fewer
partitions than the conversion's, each of them several of its partitions converted one after
another (`files_for`): the lake commit writes a file per partition.
The checks (a key problem; two writes of one key at one position with different rows; with
YDB's barriers, a record below its partition's barrier that repeats no earlier one) are
aggregates that the job reading the updates observes (`DataFrame.observe`), not a pass of
their own. That job writes a checkpoint here, or, with `defer`, it is the lake commit's
write of the table's files, which `DeferredChecks` settles and the commit undoes where a
check fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from changelake.spark.changefeed.barriers import BELOW_UNREPEATED
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.keyed import (
    ColumnSpec,
    Truncate,
    by_key,
    checkpoint,
    java_convert,
    java_ready,
    key_names,
    partitions_for,
    problem_of,
)
from changelake.spark.changefeed.steps import guard
from changelake.spark.settings import NOT_ADAPTIVE, settings


@dataclass(frozen=True)
class Converted:
    """A batch converted, by either path (`pipeline.convert_lines`): defined here, below the
    two formats' modules that make it."""

    changes: DataFrame  # (data struct, time long, diff long), consolidated
    frontier: int | None  # None: closed
    path: str  # "jvm" (the Spark path) or "python-udf" (the Python path)
    reason: str | None = None  # why the Python path was taken
    # The Spark path's lines that say where a re-read must start (`lake.kafka_changefeed`):
    # file_index, row, kind and time of every change (time: its CDCv2 time), of every
    # Debezium BEGIN/END (with its `tx`; time null), of every YDB barrier (time: its step).
    marks: DataFrame | None = None
    # Not None: `changes` are not checked yet (`convert_lines`' `defer`); the job that reads
    # them whole must be run by `checks.write`, and its result undone where that raises.
    checks: DeferredChecks | None = None


#: The keyed events' columns that the checks and the conversion read, besides the key's.
_WANTED = ("time", "pos", "rank", "is_delete", "a", "ua", "b", "ub", "content", "problem")


#: The columns the barrier rule in the conversion reads, besides `_WANTED`
#: (`keyed.java_convert`'s `barriers`).
_BARRIERS_WANTED = ("_below", "_same", "_outside")


def _by_key(events: DataFrame, keys: int, partitions: int, *,
            barriers: bool = False) -> DataFrame:
    """The keyed events' key and `_WANTED` columns (and `_BARRIERS_WANTED`, with `barriers`),
    shuffled by key (`by_key`) into `partitions` (`_partitions`' count), with the keys and
    positions the Java conversion reads (`java_ready`) made before the shuffle. Where the
    events already come in that many partitions by key (`_ydb_parsed_by_java`), Spark plans no
    shuffle here (the one asked for is the partitioning they have)."""
    wanted = (*_WANTED, *_BARRIERS_WANTED) if barriers else _WANTED
    if "ub" not in events.columns:  # all false (YDB's): made again after the shuffle
        wanted = tuple(c for c in wanted if c != "ub")
    events = events.select(*key_names(events.columns, keys), *wanted)
    return by_key(java_ready(events, keys), keys, partitions)


def _partitions(spark: SparkSession, size: int, partitions: int | None) -> int:
    """The partitions `_by_key` shuffles `size` events into: `partitions_for`'s, or the
    `partitions` they already come in by key where those are at least as many."""
    needed = partitions_for(spark, size)
    return partitions if partitions is not None and partitions >= needed else needed


#: The keyed events whose updates one task of the job that reads them converts, and so one
#: file of the lake commit's write holds, about, at most (`files_for`).
EVENTS_PER_FILE = 1_000_000


def files_for(spark: SparkSession, events: int, partitions: int) -> int:
    """How many partitions the updates of `events` keyed events, converted in `partitions`,
    are coalesced into: one per `EVENTS_PER_FILE` events, rounded up to a multiple of the
    session's default parallelism (its cores, or `spark.default.parallelism`: 4 in
    `settings.DEFAULT_CONF`), at most `partitions`. The tasks then come in whole waves: 11
    tasks of about 3 s each on 2 cores ran the last one alone (benchmarks/README.md, "the
    conversion's tasks in whole waves").

    The conversion's partitions are small (`keyed.EVENTS_PER_PARTITION`: its sorts' memory;
    and at least the session's shuffle partitions), and the job that reads the updates (the
    lake commit's write) writes a file per task. Each Parquet file starts its columns'
    dictionaries afresh, and a column of many distinct values that repeat within a key (the
    key, the values a key's updates share) fills its dictionary (up to
    `lake.table.SEGMENT_DICTIONARY_BYTES`) before Parquet drops it: with a file per
    conversion partition and Parquet's default 1 MiB dictionaries, Parquet's dictionary
    writer took a far larger share of the conversion's reduce side than of the plain Parquet
    write's, whose files are larger (a profile: benchmarks/README.md, "A change's `sequence`
    read by hand; fewer, larger files a commit"). Coalesced, a task converts several
    partitions one after another (each sort's memory is freed as it is read out) and writes
    one file. Fewer, larger files were
    written faster, and the conversion's job of a cold ingest was faster too
    (`benchmarks/bench_commit_files.py`; benchmarks/README.md, "A change's `sequence` read by
    hand; fewer, larger files a commit")."""
    cores = spark.sparkContext.defaultParallelism
    waves = max(1, -(-events // (EVENTS_PER_FILE * cores)))
    return min(partitions, waves * cores)


def checked_conversion(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
                       state: DataFrame | None, size: int, *, defer: bool = False,
                       barriers: bool = False,
                       after: Callable[[dict[str, Any]], str | None] | None = None,
                       partitions: int | None = None, truncates: Sequence[Truncate] = ()
                       ) -> tuple[DataFrame, DeferredChecks | None]:
    """Keyed events shuffled by key once (`by_key`, into partitions for about `size` events:
    `partitions_for`; only the columns the conversion reads, `_WANTED`: the lines' places
    are `marks`') and converted (`keyed.java_convert`) into fewer, larger partitions
    (`files_for`), and checked (the Java conversion's report rows: a key problem, or two
    writes of one key at one position with different rows where the order would need their
    text) by the job that reads them: a problem is `Unsupported`, once that
    job is done.

    That job writes a checkpoint, and its checks are settled here, unless `defer`: then the
    updates come back unread, with the `DeferredChecks` the job that writes them must settle
    (the lake commit's, which writes the table's files straight from the conversion, instead of
    from a checkpoint written and read again for it: faster for YDB's ingest, no measurable
    difference for Debezium's, and one copy of the updates on disk fewer for both:
    benchmarks/README.md, "Changefeed ingest on the JVM path"). Before the checkpoint, the
    events were checkpointed, an aggregate by key and position read them back for the check, and the
    lake's write converted them.

    `barriers`: the Java conversion checks YDB's barrier rule over the events too (they have
    `_below`, `_same` and `_outside`: `keyed.java_convert`); `after`, a check of the job's
    settling that follows its own (`DeferredChecks.after`); `partitions`, those the events
    already come in by key (see `_partitions`); `truncates`, a Debezium batch's (see
    `keyed.java_convert`)."""
    checks = Observation()
    spark = events.sparkSession
    into = _partitions(spark, size, partitions)
    shuffled = _by_key(events, len(keys), into, barriers=barriers)
    files = files_for(spark, size, into)

    def converted() -> DataFrame:
        with settings(spark, NOT_ADAPTIVE):  # see `keyed.java_convert`
            java = java_convert(shuffled, columns, keys, state, barriers=barriers,
                                truncates=truncates)
            return (java.observe(checks, F.min("problem").alias("problem"),
                                 F.max("tied").alias("tied"),
                                 F.max("unrepeated").alias("unrepeated"),
                                 F.sum("outside").alias("outside"))
                    .where(F.col("diff") != 0).select("data", "time", "diff"))

    # planned here (`keyed.java_convert`): a failure is a refusal
    updates = guard(lambda: converted().coalesce(files))
    deferred = DeferredChecks(checks, updates, after)
    if defer:
        return updates, deferred
    stored_updates = guard(lambda: checkpoint(updates))
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
        `Unsupported`, as in the steps before it (`guard`)."""
        guard(action)
        self.settle()

    def settle(self, *, read: bool = True) -> None:
        """Raise `Unsupported` where the checks found a problem. Without `read` (no job has
        read the updates: a commit with nothing new to write), a job reads them first, to
        Spark's `noop` sink: an observation is only made by a job that runs it, and is waited
        for forever otherwise."""
        if not read:
            guard(lambda: self.updates.write.format("noop").mode("overwrite").save())
        found = self.observation.get
        problem = problem_of(found["problem"], found["tied"])
        if problem is None and found.get("unrepeated"):
            problem = BELOW_UNREPEATED
        if problem is None and self.after is not None:
            after = self.after
            problem = guard(lambda: after(found))
        if problem is not None:
            raise Unsupported(problem)
