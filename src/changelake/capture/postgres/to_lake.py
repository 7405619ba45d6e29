"""Capture a PostgreSQL database into lake tables, exactly once, consistent across tables.

The promise: each captured table `schema.table` becomes the lake table of the same name, keyed
by its replica identity, whose history holds every committed transaction at its commit LSN,
and all of one database's tables share that one time domain. After any crash and restart the
tables hold each transaction once.

The streaming loop (batching, confirming the slot only after a batch is durable, heartbeats,
`until_idle`, `max_txns`, the restart from the least frontier) is `capture.Capture`, shared
with `--out` (`to_log.py`); this module is its `Sink` for lake tables (`LakeSink`), and
`LakeCapture` runs the loop on one. What the sink does:

* `commit_batch` commits the batch to every captured table (empty commits included, so all
  frontiers move together): `Table.commit` moves a table's committed frontier atomically with
  the batch's rows, and skips what a table already holds, so a crash that committed some
  tables of a batch and not others costs nothing on the restart. So the lake can always say,
  per database, up to which transaction every table is complete: the least of their
  frontiers (`consistent_frontier`).
* `check_resume` refuses, on a restart, tables captured from another database (each table
  records its database, `consistency.origin`, when it is created: the lake knows which tables
  share the time domain) and tables whose snapshot never committed.
* `fetch` reads a key's previous row (deletes and updates without before-images, unchanged
  TOAST values) from the lake table's current state.
* A truncate (`emptied`) is a Spark job, nothing of it collected: the lake table's current rows
  as committed (read under its writer lock, `TableWriter.current`) are retracted at the
  truncate's time, consolidated with the batch's updates (`_consolidated`), by the commit that
  writes the batch's other updates of the table, so the
  table's frontier moves with them atomically, and a table already past that time (a restart)
  skips them as it skips the rest (`Table.commit`).
* `start` (a new slot) commits the initial snapshot (`snapshot="initial"`) at time 0 with
  frontier at the slot's consistent point, where streaming starts; `snapshot="never"` creates
  the tables empty from that point. The driver holds one batch of snapshot rows at a time
  (`snapshot_batch_rows`): each batch is staged as Parquet in the table's directory, and the
  staged whole is consolidated and committed in one commit, so the table's frontier moves
  atomically; the stage is removed after. The consolidation (identical rows of a table keyed
  by REPLICA IDENTITY FULL made one update, which the commit refuses) groups whole rows, and
  Spark gives a group of a float column its normalized value (-0.0 made 0.0): a float
  column's value is taken from the group's rows instead (`_consolidated`), so a snapshot's
  `-0` stays `-0`, as the stream's does.

* `join` (a table added to the publication after the start) does the same from a temporary
  slot's snapshot, as of its consistent point C: the rows at time C - 1, `since` C - 1 (AS OF
  an earlier time is refused: the table's history there is not known), frontier C.

* A column added to a source table during the capture (ALTER TABLE ... ADD COLUMN) is added
  to the lake table (`lake.schema`: older rows read it as null, as PostgreSQL says of rows
  from before it when the column has no default); `check_change` and `commit_batch` refuse
  any other change of a table's columns (dropped, renamed, of another type, another key) by
  name before anything is written: pgoutput's relation names the columns only, so a rename
  cannot be told from a drop and an add.

Limits of this version: a column added with a default (`ADD COLUMN c text DEFAULT 'x'`) gives
the rows it had that value in PostgreSQL without a change in the WAL: the lake reads it as
null in those rows until they change. A table removed from the publication keeps its lake
table at the frontier it reached, and, being of the same database, holds that database's
consistent frontier there until it is dropped from the lake.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.capture.postgres.capture import (
    Capture,
    CaptureOptions,
    CaptureReport,
    Rows,
    marker_name,
)
from changelake.capture.postgres.consistency import check_tables, origin
from changelake.capture.postgres.consistency import (  # moved there; still importable here
    consistent_frontier as consistent_frontier,
)
from changelake.capture.postgres.rows import CaptureError, Key, Table, Values
from changelake.capture.postgres.source import Slot, Source, SourceError
from changelake.lake.catalog import Lake
from changelake.lake.current_follower import following
from changelake.lake.identifier import TableIdentifier
from changelake.lake.key_rule import KeyRuleError
from changelake.lake.schema import META_COLUMNS, live_columns, logical_schema
from changelake.lake.table import Table as LakeTable
from changelake.lake.table import clear_dir
from changelake.spark.driver_rows import driver_rows
from changelake.spark.expressions import quote
from changelake.values import NAN

#: Up to this many rows and bytes of JSON, a commit's rows or the keys a batch looks up travel
#: in the plan as one JSON text (`driver_rows`), read by the JVM alone; more (or a large value
#: among them) go through `createDataFrame`, whose jobs unpickle them in Python tasks.
IN_PLAN_ROWS = 10_000
IN_PLAN_BYTES = 4 << 20


def spark_schema(table: Table) -> T.StructType:
    return T.StructType([T.StructField(c, t.spark, True)
                         for c, t in zip(table.columns, table.types, strict=True)])


def _from_spark(kind: T.DataType, value: object) -> object:
    """A value collected from Spark as `types` reads it from PostgreSQL, so that rows from
    the lake and rows from the stream compare equal."""
    if value is None:
        return None
    if isinstance(kind, T.TimestampType):
        assert isinstance(value, dt.datetime)
        return value.astimezone(dt.UTC)
    if isinstance(kind, T.ArrayType):
        return tuple(_from_spark(kind.elementType, v) for v in value)  # type: ignore[attr-defined]
    if isinstance(kind, T.BinaryType):
        return bytes(value)  # type: ignore[arg-type]
    if isinstance(value, float) and value != value:
        return NAN
    return value


class LakeSink:
    """Lake tables as a capture's `Sink` (see the module docstring)."""

    def __init__(self, lake: Lake, options: CaptureOptions) -> None:
        self.lake = lake
        self.spark: SparkSession = lake.spark
        self.options = options
        self.report = CaptureReport()
        self.handles: dict[str, LakeTable] = {}

    def check(self, tables: dict[str, Table]) -> None:
        """Refuse, before the slot is opened, names the lake cannot hold, and two tables that
        one lake table would hold (`"Foo"` and `foo`: lake names compare case-insensitively),
        which had committed one into the other before the second was refused, and a column
        named as one of the lake's own (`_reserved`). Other column rules are checked when the
        lake creates a table."""
        seen: dict[TableIdentifier, str] = {}
        for name, table in tables.items():
            _reserved(table)
            ident = TableIdentifier.parse(name)
            if ident in seen:
                raise CaptureError(f"tables {seen[ident]} and {name} would both be lake table "
                                   f"{ident.database}.{ident.name} (lake names compare "
                                   "case-insensitively): capture one of them (--tables), or "
                                   "rename one in the database")
            seen[ident] = name

    def held(self, tables: dict[str, Table]) -> set[str]:
        self.handles = {name: self.lake.handle(name) for name in tables}
        return {n for n, h in self.handles.items() if h.load() is not None}

    def start(self, source: Source, slot: Slot, tables: dict[str, Table]) -> None:
        self._start(source, slot, tables, self.handles, at=0)

    def join(self, source: Source, snapshot: Slot, tables: dict[str, Table]) -> None:
        self._start(source, snapshot, tables, self.handles, at=snapshot.consistent_point - 1)

    def check_resume(self, source: Source, held: set[str]) -> None:
        check_tables(source, {name: self.handles[name].load() for name in held})

    def frontiers(self, tables: dict[str, Table]) -> dict[str, int | None]:
        return {name: self.handles[name].state().upper for name in tables}

    def fetch(self, table: Table, keys: set[Key]) -> list[Values]:
        return self._fetch(self.handles, table, keys)

    def start_marker(self, database: str, slot: str) -> Path:
        return self.lake.root / "capture" / marker_name(database, slot)

    def discard(self, tables: dict[str, Table]) -> None:
        """Remove the lake tables of an interrupted start: the view (the commit point) goes
        first; its files (the lock aside) are garbage after it. `start` leaves a table at
        version 1 at most; a later one is not the start's, and is refused."""
        for name in tables:
            handle = self.lake.handle(name)
            with handle.writer() as writer:
                if writer.state is None:
                    continue
                if writer.state.version > 1:
                    raise SourceError(f"lake table {name} holds more than an interrupted "
                                      "initial snapshot; not discarding it")
                self.spark.sql(f"DROP VIEW IF EXISTS {handle.ident.quoted}")
                for leftover in handle.directory.iterdir():
                    if leftover.is_dir():
                        shutil.rmtree(leftover, ignore_errors=True)
                    elif leftover.name != "_lock":
                        leftover.unlink(missing_ok=True)

    def check_change(self, old: Table, new: Table) -> None:
        if not _adds_columns(old.columns, spark_schema(old), old.key_columns, new):
            raise _changed(new.qualified, old.describe(), new.describe())

    def commit_batch(self, tables: dict[str, Table], rows: dict[str, Rows], lower: int,
                     upper: int, emptied: dict[str, int] | None = None) -> None:
        emptied = emptied or {}
        for name, table in tables.items():  # all checked before any is written
            if not any(rows.get(name, {}).values()) and name not in emptied:
                continue  # committed in the lake table's own shape: a change waits for a row
            _reserved(table)  # ADD COLUMN "_time": the batch's shape, before any is written
            state = self.handles[name].state()
            live = live_columns(state.versions)
            if not _adds_columns(live, logical_schema(state.versions), state.key, table):
                raise _changed(name, "(" + ", ".join(live) + ")", table.describe(),
                               since="its lake table was written")
        for name, table in tables.items():
            self._commit_rows(self.handles[name], table, rows.get(name, Counter()), lower,
                              upper, emptied.get(name))

    # -- start ---------------------------------------------------------------------------------

    def _start(self, source: Source, slot, tables: dict[str, Table],
               handles: dict[str, LakeTable], *, at: int) -> None:
        """Create `tables` with their history from `at` (the snapshot's rows at that time) to
        the slot's consistent point; `snapshot="never"`: empty from the consistent point."""
        since = at if self.options.snapshot == "initial" else slot.consistent_point
        where = origin(source)
        for name, table in tables.items():
            self.lake.create_table(name, spark_schema(table), key=table.key_columns,
                                   since=since, origin=where)
            if self.options.snapshot == "initial":
                self.report.snapshot_rows[name] = self._snapshot(source, slot, table,
                                                                 handles[name], at)

    def _snapshot(self, source: Source, slot, table: Table, handle: LakeTable, at: int) -> int:
        """Commit the table's rows in the slot's snapshot at time `at`, frontier the
        consistent point, in one commit; the driver holds one batch at a time (see the module
        docstring). Returns the number of rows."""
        schema = spark_schema(table).add("_time", T.LongType(), False) \
            .add("_diff", T.LongType(), False)
        stage = handle.directory / "_snapshot_stage"
        clear_dir(stage)  # left by a run that stopped while taking the snapshot
        count = 0
        try:
            for columns, batch in source.snapshot_rows(slot, table.qualified,
                                                       batch=self.options.snapshot_batch_rows):
                order = [columns.index(c) for c in table.columns]
                rows = [(*(None if raw[i] is None else kind.read(raw[i])
                           for i, kind in zip(order, table.types, strict=True)), at, 1)
                        for raw in batch]
                self.spark.createDataFrame(rows, schema).write.mode("append") \
                    .parquet(str(stage))
                count += len(rows)
            staged = self.spark.read.schema(schema).parquet(str(stage)) if count else \
                self.spark.createDataFrame([], schema)
            staged = _consolidated(staged, table.columns)
            try:
                handle.commit(staged, at, slot.consistent_point)
            except KeyRuleError as error:
                raise CaptureError(
                    f"{error.reason}. The source table has no primary key: REPLICA IDENTITY "
                    "FULL keys it by every column, and it holds this row more than once. Give "
                    "it a primary key, or remove the copies") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return count

    def _commit_rows(self, handle: LakeTable, table: Table,
                     rows: Counter[tuple[Values, int]], lower: int, upper: int,
                     emptied: int | None = None) -> None:
        """Commit the batch's `rows` of the table; `emptied`: the time of a truncate, where
        the rows it holds (as committed, under its writer lock) are retracted by the same
        commit, read and written by Spark (see the module docstring)."""
        data = [(*row, at, diff) for (row, at), diff in rows.items() if diff]
        if data or emptied is not None:
            fields = spark_schema(table)
        else:
            # No row: the table's shape is perhaps only the catalog's when the run started,
            # ahead of rows from before an ALTER TABLE still to come (`Sink.commit_batch`).
            versions = handle.state().versions
            kinds = {f.name: f.dataType for f in logical_schema(versions).fields}
            fields = T.StructType([T.StructField(c, kinds[c], True)
                                   for c in live_columns(versions)])
        schema = fields.add("_time", T.LongType(), False).add("_diff", T.LongType(), False)
        # Not checked for one row per key (`lake.key_rule`): `rows.Tables` makes the changes
        # one per key, from each key's current row.
        with handle.writer() as writer:
            updates = self._frame(data, schema)
            committed = None if writer.state is None else writer.state.upper
            if emptied is not None and committed is not None and committed <= emptied:
                # Consolidated: the batch's earlier updates are retracted at that time too
                # (`capture.Capture`), and a row the batch deleted before it is retracted by
                # both; a keyed table's read takes one update per key and time.
                updates = _consolidated(updates.unionByName(
                    _retracted(writer.current(), spark_schema(table), emptied)), table.columns)
            writer.commit(updates, lower, upper, check_key=False)

    def _frame(self, rows: list[tuple], schema: T.StructType) -> DataFrame:
        """`rows` as a DataFrame: in the plan where they are few (`driver_rows`: no Python
        task in the jobs that read them, a commit's or a lookup's), else `createDataFrame`."""
        if len(rows) <= IN_PLAN_ROWS:
            return driver_rows(self.spark, rows, schema, max_bytes=IN_PLAN_BYTES)
        return self.spark.createDataFrame(rows, schema)

    def _fetch(self, handles: dict[str, LakeTable], table: Table,
               keys: set[Key]) -> list[Values]:
        """The lake table's current rows of `keys`, in `table`'s shape: a column it has and
        the lake table not yet (added since the last commit) is null. Only keys: a truncate's
        rows are retracted by a Spark job, never collected (`commit_batch`'s `emptied`)."""
        if not keys:
            return []
        if self.lake.current_follower is not None:  # `current` as of the last commit
            self.lake.current_follower.flush()
        # `latest`: a run killed before its MERGE left `current` behind its commits.
        current: DataFrame = handles[table.qualified].latest()
        current = current.select(*(
            current[quote(c)] if c in current.columns else F.lit(None).cast(f.dataType)
            .alias(c) for c, f in zip(table.columns, spark_schema(table), strict=True)))
        key_fields = [spark_schema(table)[c] for c in table.key_columns]
        wanted = self._frame(list(keys), T.StructType(
            [T.StructField(f"_k{i}", f.dataType, True) for i, f in enumerate(key_fields)]))
        condition = None
        for i, column in enumerate(table.key_columns):
            clause = current[column].eqNullSafe(wanted[f"_k{i}"])
            condition = clause if condition is None else condition & clause
        current = current.join(F.broadcast(wanted), condition, "left_semi")
        kinds = [t.spark for t in table.types]
        return [tuple(_from_spark(k, v) for k, v in zip(kinds, row, strict=True))
                for row in current.collect()]


def _retracted(current: DataFrame, fields: T.StructType, at: int) -> DataFrame:
    """A lake table's `current` rows retracted at `at`, in the batch's columns (`fields`):
    a column the lake table has not yet (added since its last commit) is null."""
    return current.select(
        *(current[quote(f.name)].cast(f.dataType).alias(f.name) if f.name in current.columns
          else F.lit(None).cast(f.dataType).alias(f.name) for f in fields.fields),
        F.lit(at).cast(T.LongType()).alias("_time"), F.lit(-1).cast(T.LongType()).alias("_diff"))


def _holds_float(kind: T.DataType) -> bool:
    if isinstance(kind, T.ArrayType):
        return _holds_float(kind.elementType)
    return isinstance(kind, (T.FloatType, T.DoubleType))


def _consolidated(staged: DataFrame, columns: Sequence[str]) -> DataFrame:
    """The snapshot's rows with identical rows made one update: a table keyed by REPLICA
    IDENTITY FULL may hold a row twice, which the commit then refuses as an insertion with
    diff 2 (a keyed table holds one row per key, `lake.key_rule`), as the stream refuses a
    second identical row (`rows.Tables`).

    Spark makes a grouping key's -0.0 a 0.0 (its `NormalizeFloatingNumbers`, so that the
    two, equal as numbers, are one group), and gives the group that normalized value: a
    snapshot's `-0` (which PostgreSQL stores and prints as such) came into the lake as `0`,
    where the stream's kept its sign. So a column holding floats (a real, a double, an
    array of them) is still grouped by, but its value is taken from the group's rows
    (`first`): in a group of one row, the row's own. Only a group of several rows differs
    from them, and that is a table holding a row twice, refused by the commit whichever of
    its zeros is shown."""
    kinds = {f.name: f.dataType for f in staged.schema.fields}
    carried = [c for c in columns if _holds_float(kinds[c])]
    grouped = staged.groupBy(*(F.col(quote(c)) for c in columns), "_time").agg(
        F.sum("_diff").alias("_diff"),
        *(F.first(F.col(quote(c))).alias(f"_value{i}") for i, c in enumerate(carried)))
    values = {c: F.col(f"_value{i}").alias(c) for i, c in enumerate(carried)}
    return grouped.select(*(values.get(c, F.col(quote(c))) for c in columns), "_time",
                          "_diff")


def _adds_columns(held: Sequence[str], types: T.StructType, key: Sequence[str],
                  table: Table) -> bool:
    """Whether `table` is the `held` columns (of `types`, keyed by `key`), the same types,
    and perhaps some added after them: the one change a lake table follows during a capture
    (older files read the new columns as null, `lake.schema`), what ADD COLUMN does."""
    new = spark_schema(table)
    kinds = {f.name: f.dataType for f in types.fields}
    return table.columns[:len(held)] == tuple(held) and table.key_columns == tuple(key) \
        and all(kinds[c] == new[c].dataType for c in held)


def _reserved(table: Table) -> None:
    """Refuse a column named as one of the lake's own (`_time`, `_diff`, `_bucket`, in any
    case: Spark compares names case-insensitively), naming the table and column: it would be
    a second `_time` beside the row's time (had been an internal error, Spark's "Reference
    `_time` is ambiguous", or the table's creation refusing it after the slot was made)."""
    for column in table.columns:
        if column.lower() in META_COLUMNS:
            raise CaptureError(
                f"table {table.qualified} has a column named {column!r}, a name the lake keeps "
                f"for its own columns ({', '.join(META_COLUMNS)}): rename the column, capture "
                "the publication's other tables (--tables), or capture it into Materialize "
                "CDC logs (--out)")


def _changed(name: str, old: str, new: str, since: str = "the capture started") -> CaptureError:
    return CaptureError(
        f"table {name}: its columns changed since {since}, from {old} to {new}: a lake "
        "table follows only columns added at the end (ADD COLUMN); a column dropped, renamed "
        "or of another type needs a new capture (into new lake tables, with --create-slot)")


class LakeCapture:
    """One run of a capture into a lake: the shared loop (`capture.Capture`) on a `LakeSink`."""

    def __init__(self, lake: Lake, options: CaptureOptions) -> None:
        self.sink = LakeSink(lake, options)
        self.options = options
        self.report = self.sink.report

    def run(self) -> CaptureReport:
        """The capture, its Delta tables' `current` caught up in a thread of its own
        (`current_follower.py`): a batch's commit does not wait for the MERGE of the one
        before, and when the run returns every table's `current` holds its last commit."""
        with following(self.sink.lake):
            return Capture(self.sink, self.options).run()
