"""Capture a PostgreSQL database into lake tables, exactly once, consistent across tables.

The promise: each captured table `schema.table` becomes the lake table of the same name, keyed
by its replica identity, whose history holds every committed transaction at its commit LSN,
and all of one database's tables share that one time domain. After any crash and restart the
tables hold each transaction once.

The two positions it keeps in step:

* the lake's: each table's committed frontier (`Table.commit` moves it atomically with the
  batch's rows), and
* the slot's: its confirmed flush position, which tells PostgreSQL what WAL it may recycle.

A batch of transactions is committed to every captured table (empty commits included, so all
frontiers move together), and only then is the slot confirmed up to the batch's end. A crash
before the last table's commit leaves some tables ahead of others: the restart resumes from the
least frontier, and each table skips the transactions it already holds (`Tables.floor`). A
crash after the commits and before the confirmation re-delivers transactions every table has:
the source drops them. So the lake can always say, per database, up to which transaction every
table is complete: the least of their frontiers (`consistent_frontier`). Every table records
its database (`consistency.origin`) when it is created, so the lake knows which tables share
the time domain, and a restart refuses tables of another database (`consistency.check_tables`).

The initial snapshot (a new slot, `snapshot="initial"`) is committed at time 0 with frontier
at the slot's consistent point, where streaming starts; `snapshot="never"` creates the tables
empty from that point. The driver holds one batch of snapshot rows at a time
(`snapshot_batch_rows`): each batch is staged as Parquet in the table's directory, and the
staged whole is committed in one commit, so the table's frontier moves atomically; the stage is
removed after.

Limits of this version: a table added to the publication after the first run is refused
rather than snapshotted on its own.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.capture.postgres.consistency import check_tables, origin
from changelake.capture.postgres.consistency import (  # moved there; still importable here
    consistent_frontier as consistent_frontier,
)
from changelake.capture.postgres.rows import Key, Table, Tables, Values
from changelake.capture.postgres.source import Idle, Source, SourceError
from changelake.capture.postgres.transactions import Transaction
from changelake.capture.postgres.types import catalog
from changelake.lake.catalog import Lake
from changelake.lake.table import Table as LakeTable
from changelake.lake.table import clear_dir
from changelake.values import NAN


@dataclass(frozen=True)
class CaptureOptions:
    dsn: str
    publication: str
    slot: str
    tables: tuple[str, ...] | None = None
    create_slot: bool = False
    snapshot: Literal["initial", "never"] = "initial"
    until_idle: float | None = None  # stop once no transaction arrived for this long
    max_txns: int | None = None  # stop after this many transactions
    batch_seconds: float = 2.0  # commit at least this often while transactions arrive
    batch_updates: int = 100_000  # or once a batch holds this many changes
    heartbeat_seconds: float = 10.0  # while quiet, move the frontiers this often
    snapshot_batch_rows: int = 10_000  # initial snapshot rows the driver holds at a time


@dataclass
class CaptureReport:
    tables: tuple[str, ...] = ()
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    transactions: int = 0
    updates: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    frontier: int | None = None  # the least frontier of the captured tables
    stopped: str = ""


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


class LakeCapture:
    """One run of a capture into a lake (see the module docstring)."""

    def __init__(self, lake: Lake, options: CaptureOptions) -> None:
        self.lake = lake
        self.spark: SparkSession = lake.spark
        self.options = options
        self.report = CaptureReport()

    def run(self) -> CaptureReport:
        o = self.options
        with Source(o.dsn, o.publication, o.slot, tables=o.tables) as source:
            lookup = catalog(source.conn.cursor())
            tables = {name: Table.from_catalog(source.conn.cursor(), name, lookup)
                      for name in source.tables}
            handles = {name: self.lake.handle(name) for name in tables}
            self.report.tables = tuple(tables)
            slot = source.open_slot(create=o.create_slot)
            existing = [n for n, h in handles.items() if h.load() is not None]
            if not slot.created:
                check_tables(source, {n: handles[n].load() for n in existing})
            if slot.created:
                if existing:
                    raise SourceError(f"lake tables {', '.join(existing)} already hold a "
                                      f"capture, and slot {o.slot!r} is new: their history "
                                      "would have a gap; drop them or reuse their slot")
                self._start(source, slot, tables, handles)
            elif len(existing) != len(tables):
                missing = sorted(set(tables) - set(existing))
                raise SourceError(f"slot {o.slot!r} exists but lake tables "
                                  f"{', '.join(missing)} do not: their snapshot cannot be "
                                  "taken from an existing slot (create a new slot)")
            self._stream(source, tables, handles, lookup)
        return self.report

    # -- start ---------------------------------------------------------------------------------

    def _start(self, source: Source, slot, tables: dict[str, Table],
               handles: dict[str, LakeTable]) -> None:
        since = 0 if self.options.snapshot == "initial" else slot.consistent_point
        where = origin(source)
        for name, table in tables.items():
            self.lake.create_table(name, spark_schema(table), key=table.key_columns,
                                   since=since, origin=where)
            if self.options.snapshot == "initial":
                self.report.snapshot_rows[name] = self._snapshot(source, slot, table,
                                                                 handles[name])

    def _snapshot(self, source: Source, slot, table: Table, handle: LakeTable) -> int:
        """Commit the table's rows in the slot's snapshot at time 0, frontier the consistent
        point, in one commit; the driver holds one batch at a time (see the module
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
                           for i, kind in zip(order, table.types, strict=True)), 0, 1)
                        for raw in batch]
                self.spark.createDataFrame(rows, schema).write.mode("append") \
                    .parquet(str(stage))
                count += len(rows)
            staged = self.spark.read.schema(schema).parquet(str(stage)) if count else \
                self.spark.createDataFrame([], schema)
            handle.commit(staged, 0, slot.consistent_point)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return count

    # -- stream --------------------------------------------------------------------------------

    def _stream(self, source: Source, tables: dict[str, Table],
                handles: dict[str, LakeTable], lookup) -> None:
        o = self.options
        uppers = {name: handles[name].state().upper for name in tables}
        if any(u is None for u in uppers.values()):
            raise SourceError("a captured lake table is closed; nothing more can be added")
        resume = min(u for u in uppers.values() if u is not None)
        state = Tables(lookup, fetch=lambda table, keys: self._fetch(handles, table, keys))
        state.floor = {n: u for n, u in uppers.items() if u is not None}
        batch: list[Transaction] = []
        batch_lower, started, last_tx = resume, time.monotonic(), time.monotonic()
        pending = 0
        for event in source.stream(resume):
            now = time.monotonic()
            if isinstance(event, Transaction):
                batch.append(event)
                pending += len(event)
                last_tx = now
                self.report.transactions += 1
            done = o.max_txns is not None and self.report.transactions >= o.max_txns
            idle = isinstance(event, Idle)
            if batch and (idle or done or pending >= o.batch_updates
                          or now - started >= o.batch_seconds):
                upper = batch[-1].commit_lsn + 1
                self._commit_batch(state, tables, handles, batch, batch_lower, upper)
                source.confirm(batch[-1].end_lsn)
                batch_lower, batch, pending, started = upper, [], 0, time.monotonic()
            elif idle and not batch and event.lsn > batch_lower and (
                    now - started >= o.heartbeat_seconds or (o.until_idle is not None
                    and now - last_tx >= o.until_idle)):
                self._commit_batch(state, tables, handles, [], batch_lower, event.lsn)
                source.confirm(event.lsn)
                batch_lower, started = event.lsn, time.monotonic()
            if done:
                self.report.stopped = f"{o.max_txns} transactions"
                break
            if o.until_idle is not None and not batch and now - last_tx >= o.until_idle:
                self.report.stopped = f"idle for {o.until_idle:g} s"
                break
        self.report.frontier = batch_lower

    def _commit_batch(self, state: Tables, tables: dict[str, Table],
                      handles: dict[str, LakeTable], batch: list[Transaction], lower: int,
                      upper: int) -> None:
        state.prefetch(batch)
        by_table: dict[str, Counter[tuple[Values, int]]] = {n: Counter() for n in tables}
        for tx in batch:
            for name, diffs in state.updates(tx).items():
                target = by_table.setdefault(name, Counter())
                for row, diff in diffs.items():
                    target[(row, tx.commit_lsn)] += diff
        for name, table in tables.items():
            rows = by_table.get(name, Counter())
            self._commit_rows(handles[name], table, rows, lower, upper)
            self.report.updates[name] += len(rows)
            state.floor[name] = upper
        state.forget()
        self.report.batches += 1

    def _commit(self, handle: LakeTable, table: Table, updates: Counter[Values], at: int,
                lower: int, upper: int) -> None:
        self._commit_rows(handle, table, Counter({(r, at): d for r, d in updates.items()}),
                          lower, upper)

    def _commit_rows(self, handle: LakeTable, table: Table,
                     rows: Counter[tuple[Values, int]], lower: int, upper: int) -> None:
        schema = spark_schema(table).add("_time", T.LongType(), False) \
            .add("_diff", T.LongType(), False)
        data = [(*row, at, diff) for (row, at), diff in rows.items() if diff]
        frame = self.spark.createDataFrame(data, schema)
        handle.commit(frame, lower, upper)

    def _fetch(self, handles: dict[str, LakeTable], table: Table,
               keys: set[Key] | None) -> list[Values]:
        """The lake table's current rows of `keys` (None: all of them)."""
        current: DataFrame = handles[table.qualified].current().select(*table.columns)
        if keys is not None:
            if not keys:
                return []
            key_fields = [spark_schema(table)[c] for c in table.key_columns]
            wanted = self.spark.createDataFrame(list(keys), T.StructType(
                [T.StructField(f"_k{i}", f.dataType, True) for i, f in enumerate(key_fields)]))
            condition = None
            for i, column in enumerate(table.key_columns):
                clause = current[column].eqNullSafe(wanted[f"_k{i}"])
                condition = clause if condition is None else condition & clause
            current = current.join(F.broadcast(wanted), condition, "left_semi")
        kinds = [t.spark for t in table.types]
        return [tuple(_from_spark(k, v) for k, v in zip(kinds, row, strict=True))
                for row in current.collect()]
