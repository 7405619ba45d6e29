"""`changelake changes`: a lake table's history as a CDCv2 stream (its change data feed).

The lake becomes a change source for the next system: the table's updates in a time interval
`[since, until)`, consolidated, as Materialize CDC messages (update batches, then progress
statements with exact counts), which `decode`, `ingest` or Materialize itself read back.

Semantics (T = `since`, U = `until`, S = the table's `since`, F = its committed frontier):

* The stream covers exactly the times in `[T, U)`. U defaults to F (a closed table: the end of
  time, and the stream closes with `upper = []`). U beyond F is an error naming F: those times
  are not final yet. U < T is an error.
* T < S is an error: compaction folded the history before S into S, so the changes at earlier
  times no longer exist (as Delta refuses a change feed from vacuumed versions).
* Plain changes (the default, what a Delta change data feed from a version gives): the updates
  at the times of `[T, U)`, consolidated (one diff per `(row, time)`, never zero), exactly as
  they were committed. The first progress statement's `lower` is `[T]`: the stream says nothing
  about earlier times, so a reader starts at `since = T` (`decode --since T`); for T = 0 that is
  any reader. Accumulating the stream gives `state(t) - state(T - 1)` for t in `[T, U)`.
  When T = S and the table has been compacted, the updates at S hold the folded history, not
  the changes at S: refused, naming `--snapshot` and `--since S+1`.
* `snapshot=True` (`--snapshot`, what Materialize's `SUBSCRIBE ... AS OF T` gives): the state
  at T as updates at time T (each row with its multiplicity as its diff), then the exact
  changes at times in `(T, U)`. The progress statements start at `[0]` and count nothing
  before T: as a collection whose history starts at T, that is true, so any reader (and an
  `ingest` into an empty table) takes it, and accumulating it gives `state(t)` for every t
  in `[T, U)`. This works from any T in `[S, F)`, compacted or not.
* The updates are the table's committed updates (a keyed table's are consistent, each new
  version retracting the one before, when its commits were, as `ingest`'s are), on the table's
  current columns (a column added later is null in earlier rows, as every read shows them).
  Decimals, dates and timestamps are Avro logical types, as the capture writes them
  (`capture/postgres/avro.py`): a `decode` prints them as their text (`12.50`, `2024-01-02`,
  a timestamp in UTC with its offset, a timestamp without a time zone without one). A
  timestamp's instant is taken in the JVM (`unix_micros`, `spark/instants.py`), never from
  PySpark's local-time datetime, so no time zone of the driver can shift it. Arrays, structs
  (Avro records) and maps with string keys of these types are written too; other types, and
  struct fields that are not Avro names, are refused naming the column, before anything is
  written.
* Progress: statements tile `[lower, U)` (or `[lower, end of time)` when closed) with the
  exact number of distinct updates at each time, so a reader reports frontier U (or `[]`).

Where the work happens: Spark reads the retained files (`Table.updates()`, or the merge-on-read
state at T), filters the interval, consolidates (a group by row and time in the JVM) and counts
the updates per time (also in the JVM, each update carrying its time's count: nothing per time
is collected, so a window of millions of times costs the driver nothing more than one). The
updates then stream to the driver in time order through `toLocalIterator`, which holds one
partition of the sorted result at a time; the driver keeps one batch (`batch_size` updates)
and the counts of the times since the last progress statement (as many as the batch's at
most), so its memory is bounded by the largest partition plus one batch, not by the table or
the number of its times. Each progress statement is checked against the counts the JVM made,
and the end against the JVM's totals (times, updates: one row collected): a statement never
claims what was not written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.errors import LakeError, SchemaError
from changelake.formats.avro_values import python_to_plain
from changelake.formats.materialize import CdcSchema
from changelake.lake.layout import SEGMENT
from changelake.lake.table import Table
from changelake.protocol import Antichain, Message, Progress, Updates
from changelake.spark.expressions import quote
from changelake.spark.instants import with_instants
from changelake.spark.map_grouping import groupable, restored
from changelake.values import freeze

DEFAULT_BATCH = 1024
COUNT = "_changelake_count"  # an update's time's count, beside its columns (not written)


@dataclass(frozen=True, slots=True)
class ChangesPlan:
    """The interval a `changes` run covers, checked against the table's state."""

    table: str
    since: int  # T
    until: int | None  # U; None: to the end of time (a closed table)
    lower: int  # the first progress statement's lower: T, or 0 with a snapshot
    snapshot: bool
    table_since: int
    table_frontier: int | None


def plan_changes(table: Table, since: int, until: int | None = None, *,
                 snapshot: bool = False) -> ChangesPlan:
    """Check `[since, until)` against the table (see the module docstring for the rules)."""
    state = table.state()
    name, s, f = table.name, state.since, state.upper
    where = "closed" if f is None else f"[{f}]"
    if since < 0 or (until is not None and until < 0):
        raise LakeError(f"table {name}: times are not negative")
    if since < s:
        raise LakeError(f"table {name}: --since {since} is before the table's since ({s}): "
                        f"compaction folded the history before {s} into {s}, so the changes "
                        f"at earlier times are gone; use --since {s} or later")
    if until is None:
        if f is not None and since > f:
            raise LakeError(f"table {name}: --since {since} is beyond the table's frontier "
                            f"({where}): times from {f} on are not final yet")
        until = f
    elif f is not None and until > f:
        raise LakeError(f"table {name}: --until {until} is beyond the table's frontier "
                        f"({where}): times from {f} on are not final yet")
    if until is not None and until < since:
        raise LakeError(f"table {name}: --until {until} is before --since {since}")
    if snapshot:
        if until is not None and until <= since:
            raise LakeError(f"table {name}: --snapshot at {since} needs --until after it "
                            f"(got {until}): the snapshot's updates are at time {since}")
        if f is not None and since >= f:
            raise LakeError(f"table {name}: --snapshot at {since} needs a final state there, "
                            f"but the table's frontier is {where}")
    elif since == s and (state.folded or any(fs.kind != SEGMENT for fs in state.files)):
        raise LakeError(f"table {name}: the updates at time {s} (the table's since) hold the "
                        f"history compaction folded into it, not the changes at {s}: use "
                        f"--snapshot (the state at {s}, then the changes) or --since {s + 1}")
    return ChangesPlan(name, since, until, 0 if snapshot else since, snapshot, s, f)


def changes_frame(table: Table, plan: ChangesPlan) -> DataFrame:
    """The consolidated updates of the plan, as the table's columns plus `_time`, `_diff`.
    A map column is grouped as its sorted entries (`spark.map_grouping`: Spark's own grouping
    of a map loses its null values)."""
    schema = table.schema
    columns = [quote(c) for c in schema.fieldNames()]
    updates = table.updates()
    first = plan.since + 1 if plan.snapshot else plan.since
    cond = F.col("_time") >= first
    if plan.until is not None:
        cond = cond & (F.col("_time") < plan.until)
    changed = restored(groupable(updates.where(cond).selectExpr(*columns, "_time", "_diff"))
                       .groupBy(*columns, "_time").agg(F.sum("_diff").alias("_diff"))
                       .where(F.col("_diff") != 0), schema)
    if not plan.snapshot:
        return changed
    state = (restored(groupable(table.as_of(plan.since)).groupBy(*columns)
                      .agg(F.count(F.lit(1)).alias("_diff")), schema)
             .selectExpr(*columns, f"CAST({int(plan.since)} AS BIGINT) AS _time", "_diff"))
    return state.unionByName(changed)


def cdc_schema_of(table: Table) -> CdcSchema:
    """The Materialize CDC schema of the table's rows: every column nullable, each Spark type
    as the capture's Avro mapping has it (see `capture/postgres/avro.py`)."""
    from changelake.capture.postgres.avro import avro_type

    schema: StructType = table.schema
    fields = []
    for f in schema.fields:
        where = f"table {table.name}, column {f.name}"
        try:  # the mapping is what the writers carry: a type it lacks is refused, and why
            kind = avro_type(f.dataType, where)
        except SchemaError as error:
            raise SchemaError(f"{where}: type {f.dataType.simpleString()} cannot be written as "
                              f"Materialize CDC ({error}; boolean, integers, float, double, "
                              "string, binary, decimal, date, timestamps, and arrays, maps with "
                              "string keys and structs of Avro-named fields of them can)") \
                from None
        fields.append({"name": f.name, "type": ["null", kind]})
    return CdcSchema.for_fields(fields)


def change_messages(table: Table, plan: ChangesPlan, *, batch_size: int = DEFAULT_BATCH
                    ) -> Iterator[Message]:
    """The plan's CDCv2 messages, streamed: update batches in time order and, whenever at least
    `batch_size` updates were sent since the last one, a progress statement up to the next
    time; the last statement ends at `until` (or closes the stream)."""
    if batch_size < 1:
        raise LakeError("batch_size must be at least 1")
    frame = changes_frame(table, plan)
    names = table.schema.fieldNames()
    frame.cache()
    try:
        totals = frame.agg(F.countDistinct("_time").alias("times"),
                           F.count(F.lit(1)).alias("updates")).first()
        # Each update with its time's count, made in the JVM (see the module docstring).
        counted = frame.withColumn(
            COUNT, F.count(F.lit(1)).over(Window.partitionBy("_time")))
        # timestamps leave the JVM as microseconds (see the module docstring)
        ordered, instants = with_instants(counted.orderBy("_time"))
        lower = plan.lower
        batch: list[tuple[Any, int, int]] = []
        counts: dict[int, int] = {}  # the times since the last progress statement
        expected: dict[int, int] = {}  # the JVM's counts of those times
        sent = times = updates = 0

        def progress(upper: int | None) -> Progress:
            for time, count in counts.items():
                if expected.get(time) != count:
                    raise LakeError(f"table {plan.table}: {count} update(s) at time {time} "
                                    f"were read but the table counts {expected.get(time)}; "
                                    "its files changed during the read")
            return Progress(Antichain([lower]),
                            Antichain() if upper is None else Antichain([upper]),
                            tuple(sorted(counts.items())))

        for row in ordered.toLocalIterator():
            time = row["_time"]
            if sent >= batch_size and time not in counts:
                if batch:
                    yield Updates(batch)
                    batch = []
                yield progress(time)
                lower, counts, expected, sent = time, {}, {}, 0
            values = instants(row.asDict(recursive=True))
            data = freeze(python_to_plain({n: values[n] for n in names}), names)
            batch.append((data, time, row["_diff"]))
            if time not in counts:
                times += 1
            counts[time] = counts.get(time, 0) + 1
            expected[time] = row[COUNT]
            sent += 1
            updates += 1
            if len(batch) >= batch_size:
                yield Updates(batch)
                batch = []
        if batch:
            yield Updates(batch)
        if (times, updates) != (totals["times"], totals["updates"]):
            raise LakeError(f"table {plan.table}: {totals['updates']} update(s) at "
                            f"{totals['times']} time(s) were counted but {updates} at {times} "
                            "read; the table's files changed during the read")
        if plan.until is None or plan.until > lower:
            yield progress(plan.until)
    finally:
        frame.unpersist()


@dataclass(frozen=True, slots=True)
class ChangesReport:
    """What `changes` wrote: for the summary line on stderr."""

    plan: ChangesPlan
    written: int  # messages, or update lines with `history`
    unit: str
    frontier: list  # the frontier a reader of the stream reports (Antichain JSON)

    def line(self) -> str:
        p = self.plan
        until = "the end (closed)" if p.until is None else str(p.until)
        what = f"the state at {p.since}, then the changes" if p.snapshot else "the changes"
        return (f"changes {p.table}: {what} in [{p.since}, {until}): {self.written} "
                f"{self.unit}; a reader's frontier: {self.frontier}")


def write_changes(table: Table, out: IO[bytes], *, since: int, until: int | None = None,
                  snapshot: bool = False, avro: Path | None = None, history: bool = False,
                  batch_size: int = DEFAULT_BATCH, schema_out: Path | None = None
                  ) -> ChangesReport:
    """What `changelake changes` runs: the plan's messages as Materialize CDC Avro-JSON lines on
    `out` (`encode`'s output), an Avro container file `avro` (`encode --avro`), or (`history`)
    decoded, as `decode` prints a history. Every check of the plan happens before any output.
    `schema_out` also gets the stream's schema (JSON): JSON lines carry none, and without it
    a reader sees neither the columns' order nor the logical types' values."""
    from changelake.local import decode_messages, write_messages
    from changelake.protocol import Reader

    plan = plan_changes(table, since, until, snapshot=snapshot)
    schema = cdc_schema_of(table)  # unsupported column types: refused before any output
    if schema_out is not None:
        try:
            schema_out.write_bytes(orjson.dumps(schema.avro, option=orjson.OPT_INDENT_2))
        except OSError as error:
            raise LakeError(f"{schema_out}: cannot write the schema: {error.strerror}") \
                from None
    messages = change_messages(table, plan, batch_size=batch_size)
    frontier = Antichain() if plan.until is None else Antichain([plan.until])
    if history:
        if avro is not None:
            raise LakeError("--history prints decoded lines; it does not go with --avro")
        report = decode_messages(Reader(Antichain([plan.lower])), messages, out)
        return ChangesReport(plan, report.updates, "update line(s)", report.frontier.to_json())
    count = write_messages(messages, schema, avro=avro, out=out)
    return ChangesReport(plan, count, "message(s)", frontier.to_json())
