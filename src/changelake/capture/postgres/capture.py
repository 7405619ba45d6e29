"""The capture loop, one for every output: stream a database's transactions into a `Sink`,
batch them, and confirm the slot only once the sink says a batch is durable.

The promise, whatever the sink (lake tables, `to_lake.py`; a Materialize CDC log,
`to_log.py`): every transaction that commits in the database and touches a captured table
reaches the sink once, at its commit LSN, in commit order, each table's frontier moves
transaction by transaction, and after any crash and restart nothing is lost or doubled.

The two positions it keeps in step:

* the sink's: each table's frontier (`Sink.frontiers`), which moves only when `commit_batch`
  makes a batch durable (a lake commit; segment files written and fsync'd), and
* the slot's: its confirmed flush position, which tells PostgreSQL what WAL it may recycle.

A batch of transactions goes to every captured table (empty ones included, so all frontiers
move together), and only after `commit_batch` returns is the slot confirmed up to the batch's
upper frontier (its last commit's LSN + 1, not the end of that commit record: so the slot is
never confirmed beyond a table's frontier). A crash before the last table's commit leaves
some tables ahead of others: the restart resumes from the least frontier, and each table
skips the transactions it already holds (`Tables.floor`). A crash after the commits and
before the confirmation re-delivers transactions every table has: the source drops them.

A restart can resume no earlier than the slot's confirmed position: the server skips
whatever committed before it. So a table found behind that position (`_check_continuous`)
has missed transactions: the slot streamed on without it (a run whose `--tables` left it
out, or while it was out of the publication), or the slot was made again under its name.
Such tables are refused, naming them, where streaming would silently leave a gap in their
history.

How a sink starts: a new slot (`--create-slot`) has its snapshot taken by `Sink.start`, at
time 0 with the frontier at the slot's consistent point, where streaming starts (`snapshot =
"never"`: the tables start empty there); an existing slot resumes from the sink's frontiers,
and tables it holds when the slot is new are refused (their history would have a gap).

Tables the publication gained after the start *join*: `Sink.join` takes their snapshot from a
temporary slot's exported snapshot (`Source.exported_snapshot`), as of its consistent point C,
at time C - 1 with frontier C. The stream resumes at the least frontier, before C, and the
joining tables skip what it re-sends from before C (`Tables.floor`), exactly as a table that is
ahead of the others after a crash does: no gap, no overlap. Their history starts at C - 1 (a
lake table's `since`: AS OF an earlier time is refused). A crash while they join is covered by
a second marker (`.joining`, beside the start marker, naming them): a restart discards what
they hold and joins them again.
Tables the sink holds when the slot is gone (dropped between two runs) are refused before any
new slot is made. A crash while the snapshot is taken leaves a slot whose exported snapshot
died with the process, and perhaps some tables holding their part of it: the sink keeps a
marker (`Sink.start_marker`, written before the slot is created, removed once every table
holds its snapshot), and a run that finds it (with `--create-slot`) discards those tables
(`Sink.discard`) and the slot, and takes the start again.

The previous row of a key (for deletes and updates without before-images, unchanged TOAST
columns) comes from the sink's current state (`Sink.fetch`), so memory follows the batch here,
not the tables. A truncate's rows are never read here: the first truncate of a table in a
batch, at time T, retracts at T the batch's earlier updates of the table (summed per row, held
here) and, by the sink, the rows the sink holds as the batch starts (`commit_batch`'s
`emptied`): a lake table's current rows by a Spark job, in the same commit as the batch's other
updates of the table, so exactly-once and the slot's confirmation after it are unchanged.

A table's columns may change while it is captured (ALTER TABLE): each change carries the
relation that described the table when it was made, so a batch may hold rows of several
shapes. `Tables` keeps each table's rows in the shape of the last change it applied and
re-shapes them (by column name) at the change that brings a new one; the batch's rows are
committed in the table's last shape of the batch, which is what `commit_batch` is given (not
the catalog's shape when the run started). A sink refuses a change it cannot follow
(`Sink.check_change`: a log keeps one schema; a lake table follows columns added at the end)
when the batch is first read, and `commit_batch` refuses a shape it does not hold (a change
made while no capture ran) before it writes anything of the batch: one line naming the table
and both shapes, and every rerun stops there with nothing written.

Batches end when the stream goes idle, every `batch_seconds`, at `batch_updates` changes or
`batch_bytes` of them (`Transaction.bytes`: a few large rows fill a batch as many small ones
do), or at `max_txns`. `batch_seconds` counts from the start of the last commit, once the
stream has read every transaction committed before the batch became due (the server's WAL
position then, `Source.flushed`: a message or keepalive at or past it,
`Source.received_through`), and at the latest from its end: a commit that takes longer than
`batch_seconds` is followed by the next as soon as what arrived meanwhile is read, not
`batch_seconds` later (a transaction that arrived as a commit began used to wait for that
commit, `batch_seconds`, then its own commit: the tail of the time until a sink shows it,
`benchmarks/bench_capture_freshness.py`). `source.CaughtUp` events let it check while no
message comes. The
stream's transactions keep at most `spool_bytes` of changes in memory together, the open ones
and those of the batch (`transactions.Budget`; the rest waits in temporary files). While the
database is quiet, the last keepalive's position is committed to every table (progress with
no updates) and confirmed every `heartbeat_seconds` (and before stopping `until_idle`), so an
idle database does not hold WAL back.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import psycopg2

from changelake.capture.postgres.pgoutput import format_lsn
from changelake.capture.postgres.rows import Key, Table, Tables, Values, reshape
from changelake.capture.postgres.source import (
    Idle,
    Slot,
    Source,
    SourceError,
    connection_failed,
    lost_connection,
)
from changelake.capture.postgres.transactions import MEMORY_BYTES, Transaction
from changelake.capture.postgres.types import catalog
from changelake.lake.files import replace_whole

#: A table's updates in a batch: (row, time) -> diff.
Rows = Counter[tuple[Values, int]]


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
    batch_seconds: float = 2.0  # while transactions arrive, a commit this often (start to start)
    batch_updates: int = 100_000  # or once a batch holds this many changes
    batch_bytes: int = 64 << 20  # or this many bytes of changes (`Transaction.bytes`)
    spool_bytes: int = MEMORY_BYTES  # changes kept in memory, all transactions together
    heartbeat_seconds: float = 10.0  # while quiet, move the frontiers this often
    snapshot_batch_rows: int = 10_000  # initial snapshot rows the driver holds at a time


@dataclass
class CaptureReport:
    tables: tuple[str, ...] = ()
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    transactions: int = 0
    updates: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    joined: tuple[str, ...] = ()  # tables added to the publication, snapshotted this run
    frontier: int | None = None  # the least frontier of the captured tables
    stopped: str = ""


class Sink(Protocol):
    """Where a capture's tables go. `report` is the run's report (the sink adds its snapshot
    rows to it)."""

    report: CaptureReport

    def check(self, tables: dict[str, Table]) -> None:
        """Refuse tables it cannot hold, before the slot is opened (or created)."""
        ...

    def held(self, tables: dict[str, Table]) -> set[str]:
        """The tables that already hold a capture (checked after the slot is opened)."""
        ...

    def start(self, source: Source, slot: Slot, tables: dict[str, Table]) -> None:
        """A new slot: create the tables, with the snapshot at time 0 (or empty) and the
        frontier at the slot's consistent point."""
        ...

    def join(self, source: Source, snapshot: Slot, tables: dict[str, Table]) -> None:
        """Tables added to the publication after the start: create them with their rows in
        `snapshot` (a temporary slot's, see `Source.exported_snapshot`) at time C - 1, C its
        consistent point, and their frontier at C (`snapshot = "never"`: empty from C)."""
        ...

    def check_resume(self, source: Source, held: set[str]) -> None:
        """Refuse, on a restart from an existing slot, held tables that cannot continue from
        this database's slot (captured from another database, say)."""
        ...

    def frontiers(self, tables: dict[str, Table]) -> dict[str, int | None]:
        """Each table's durable frontier (None: closed)."""
        ...

    def start_marker(self, database: str, slot: str) -> Path:
        """Where the capture marks a start in progress (a file in the sink's own directory):
        written before the slot is created, removed once `start` returned."""
        ...

    def discard(self, tables: dict[str, Table]) -> None:
        """Remove what an interrupted `start` left of `tables` (held() is empty after)."""
        ...

    def fetch(self, table: Table, keys: set[Key]) -> Iterable[Values]:
        """The table's current rows of `keys`, typed as `types` reads them (never all of its
        rows: a truncate's are the sink's to retract, `commit_batch`'s `emptied`)."""
        ...

    def check_change(self, old: Table, new: Table) -> None:
        """Refuse (raise `CaptureError`, naming the table and the change) a change of a
        table's columns during the capture that it cannot follow. Called when a batch is
        first read, so before anything of it is written."""
        ...

    def commit_batch(self, tables: dict[str, Table], rows: dict[str, Rows], lower: int,
                     upper: int, emptied: dict[str, int] | None = None) -> None:
        """Make every table hold its `rows` and its frontier `upper`, durably, before
        returning (a table already at or beyond `lower` skips what it holds). A table in
        `emptied` was truncated at that time: the rows it held before the batch (at `lower`,
        or where it is ahead, at its own frontier) are retracted then too, besides `rows`
        (which retract the batch's own). `tables` is
        each table's shape at the end of the batch, the shape of its `rows`: the first
        shape of a run is the catalog's, not checked against the one the sink holds (a
        change made while no capture ran), so the sink refuses one it cannot follow before
        it writes anything of the batch."""
        ...


def marker_name(database: str, slot: str) -> str:
    """The start marker's file name: hidden, one per database and slot."""
    return "." + re.sub(r"[^\w.-]", "_", f"postgres.{database}.{slot}") + ".starting"


START_NOTE = ("a capture's initial snapshot is being taken: until every table holds it, a "
              "restart takes it again\n")


def _write_durably(path: Path, text: str = START_NOTE) -> None:
    """`text` in the file `path`, whole and on the disk (or, a sink on a remote lake giving a
    path of its store, in an acknowledged write) before this returns."""
    replace_whole(path, text)


class Capture:
    """One run of a capture into `sink` (see the module docstring)."""

    def __init__(self, sink: Sink, options: CaptureOptions) -> None:
        self.sink = sink
        self.options = options
        self.report = sink.report

    def run(self) -> CaptureReport:
        """The capture; a connection that fails on the way (the server restarted, say) is
        one `SourceError` saying how to go on (`source.lost_connection`)."""
        o = self.options
        try:
            source = Source(o.dsn, o.publication, o.slot, tables=o.tables)
        except psycopg2.Error as error:  # its first queries
            if not connection_failed(error):
                raise
            raise SourceError(lost_connection(error, o.dsn, o.slot, snapshot=False)) \
                from None
        with source:
            try:
                self._run(source)
            except psycopg2.Error as error:
                # Another error of a server that went away: the snapshot a restart ended
                # ("invalid snapshot identifier"), say. Its connection tells.
                if not connection_failed(error) and source.answers():
                    raise
                started = self.sink.start_marker(source.database, o.slot).exists()
                raise SourceError(lost_connection(error, o.dsn, o.slot, snapshot=started)) \
                    from None
        return self.report

    def _run(self, source: Source) -> None:
        o = self.options
        lookup = catalog(source.conn.cursor())
        tables = {name: Table.from_catalog(source.conn.cursor(), name, lookup)
                  for name in source.tables}
        self.report.tables = tuple(tables)
        self.sink.check(tables)
        # Present from before the slot is created until every table holds its snapshot.
        marker = self.sink.start_marker(source.database, o.slot)
        if marker.exists():  # a start of these tables from this slot did not finish
            if not o.create_slot:
                raise SourceError(f"the initial snapshot from slot {o.slot!r} did not "
                                  "finish: run again with --create-slot to take it again")
            self.sink.discard(tables)
            if source.has_slot():
                source.drop_slot()
        held = self.sink.held(tables)
        if held and not source.has_slot():
            # Checked before `open_slot` may create it: a new slot would start a gap.
            raise SourceError(f"tables {', '.join(sorted(held))} already hold a "
                              f"capture, but replication slot {o.slot!r} does not exist "
                              "(dropped since their last run, or never theirs): a new "
                              "slot would leave a gap in their history; capture into new "
                              "tables with --create-slot, or name their slot")
        if not held and o.create_slot and not source.has_slot():
            _write_durably(marker)
        slot = source.open_slot(create=o.create_slot)
        existing = self.sink.held(tables)
        if slot.created:
            if existing:
                raise SourceError(f"tables {', '.join(sorted(existing))} already hold a "
                                  f"capture, and slot {o.slot!r} is new: their history "
                                  "would have a gap; drop them or reuse their slot")
            self.sink.start(source, slot, tables)
            marker.unlink(missing_ok=True)
        else:
            if not existing:
                raise SourceError(f"slot {o.slot!r} exists but tables "
                                  f"{', '.join(sorted(tables))} hold no capture: the "
                                  "history before its position is gone (create a new "
                                  "slot with --create-slot, or name these tables' slot)")
            self.sink.check_resume(source, existing)
            self._join(source, tables, existing, marker.with_suffix(".joining"))
            self._check_continuous(source, tables)
        self._stream(source, tables, lookup)

    def _join(self, source: Source, tables: dict[str, Table], held: set[str],
              marker: Path) -> None:
        """Take the snapshot of tables the publication gained since the start (see the module
        docstring). The marker names them from before the first is created until the last
        holds its snapshot; a restart that finds it discards what they hold and joins them
        again."""
        if marker.exists():
            interrupted = set(marker.read_text().split())
            self.sink.discard({n: t for n, t in tables.items() if n in interrupted})
            held = held - interrupted
        joining = {n: t for n, t in tables.items() if n not in held}
        if not joining:
            marker.unlink(missing_ok=True)
            return
        _write_durably(marker, "".join(f"{name}\n" for name in joining))
        with source.exported_snapshot() as snapshot:
            self.sink.join(source, snapshot, joining)
        self.report.joined = tuple(joining)
        marker.unlink()

    def _check_continuous(self, source: Source, tables: dict[str, Table]) -> None:
        """Refuse tables whose frontier is behind the slot's confirmed position: the stream
        would start after transactions they never received (see the module docstring).
        Tables that just joined are at their snapshot's consistent point, never behind."""
        confirmed = source.confirmed()
        frontiers = self.sink.frontiers(tables)
        behind = {n: u for n, u in sorted(frontiers.items()) if u is not None and u < confirmed}
        if behind:
            at = ", ".join(f"{n} at {format_lsn(u)}" for n, u in behind.items())
            raise SourceError(
                f"tables {', '.join(behind)} stopped before slot {self.options.slot!r}'s "
                f"confirmed position {format_lsn(confirmed)} ({at}): the slot streamed on "
                "without them (a run whose --tables left them out, or while they were out "
                "of the publication), or was made again under this name, so the "
                "transactions between are gone from it and their history would have a gap. "
                "Capture them afresh: into new tables (another --lake or --out) with a new "
                "slot and --create-slot")

    def _stream(self, source: Source, tables: dict[str, Table], lookup) -> None:
        o = self.options
        uppers = self.sink.frontiers(tables)
        if any(u is None for u in uppers.values()):
            raise SourceError("a captured table is closed; nothing more can be added")
        resume = min(u for u in uppers.values() if u is not None)
        state = Tables(lookup, fetch=self.sink.fetch, captured=tables,
                       check_change=self.sink.check_change)
        state.floor = {n: u for n, u in uppers.items() if u is not None}
        batch: list[Transaction] = []
        batch_lower, started, last_tx = resume, time.monotonic(), time.monotonic()
        began = started  # when the last commit began (`started`: when it ended)
        target: int | None = None  # the server's WAL position when the batch became due
        pending = pending_bytes = 0
        for event in source.stream(resume, memory_limit=o.spool_bytes, caught_up=True):
            now = time.monotonic()
            if isinstance(event, Transaction):
                batch.append(event)
                pending += len(event)
                pending_bytes += event.bytes
                last_tx = now
                self.report.transactions += 1
            done = o.max_txns is not None and self.report.transactions >= o.max_txns
            idle = isinstance(event, Idle)
            due = now - started >= o.batch_seconds
            if batch and not due and now - began >= o.batch_seconds:
                if target is None:
                    target = source.flushed()
                due = target is not None and source.received_through(target)
            if batch and (idle or done or due or pending >= o.batch_updates
                          or pending_bytes >= o.batch_bytes):
                upper = batch[-1].commit_lsn + 1
                began, target = now, None
                with source.keepalive():
                    self._commit_batch(state, tables, batch, batch_lower, upper)
                source.confirm(upper)  # not the commit record's end: see the docstring
                batch_lower, batch, started = upper, [], time.monotonic()
                pending = pending_bytes = 0
            elif idle and not batch and event.lsn > batch_lower and (
                    now - started >= o.heartbeat_seconds or (o.until_idle is not None
                    and now - last_tx >= o.until_idle)):
                began = now
                with source.keepalive():
                    self._commit_batch(state, tables, [], batch_lower, event.lsn)
                source.confirm(event.lsn)
                batch_lower, started = event.lsn, time.monotonic()
            if done:
                self.report.stopped = f"{o.max_txns} transactions"
                break
            # At an `Idle` only (not `CaughtUp`): its heartbeat above commits the position
            # the stream reached first.
            if o.until_idle is not None and idle and not batch and now - last_tx >= o.until_idle:
                self.report.stopped = f"idle for {o.until_idle:g} s"
                break
        self.report.frontier = batch_lower

    def _commit_batch(self, state: Tables, tables: dict[str, Table],
                      batch: list[Transaction], lower: int, upper: int) -> None:
        state.prefetch(batch)
        by_table: dict[str, Rows] = {n: Counter() for n in tables}
        shapes = {n: state.shapes.get(n, t) for n, t in tables.items()}
        for tx in batch:
            for name, diffs in state.updates(tx).items():
                target = by_table.setdefault(name, Counter())
                _reshaped(target, shapes[name], state.shapes[name])
                shapes[name] = state.shapes[name]
                if state.emptied.get(name) == tx.commit_lsn:
                    _retract_earlier(target, tx.commit_lsn)
                for row, diff in diffs.items():
                    target[(row, tx.commit_lsn)] += diff
        self.sink.commit_batch(shapes, by_table, lower, upper, dict(state.emptied))
        for name in tables:
            self.report.updates[name] += len(by_table.get(name, ()))
            state.floor[name] = upper
        state.forget()
        self.report.batches += 1


def _reshaped(rows: Rows, old: Table, new: Table) -> None:
    """The batch's rows so far, made before a change of the table's shape, in the new shape
    (`rows.reshape`): a batch commits one shape per table, the last one (see the module
    docstring)."""
    if rows and old is not new and old.shape != new.shape:
        moved = Counter({(reshape(old, new, row), at): d for (row, at), d in rows.items()})
        rows.clear()
        rows.update(moved)


def _retract_earlier(rows: Rows, at: int) -> None:
    """The batch's updates of a table before `at`, summed per row, retracted at `at` (a
    truncate there; the sink retracts the rows it held before the batch)."""
    earlier: Counter[Values] = Counter()
    for (row, when), diff in rows.items():
        if when < at:
            earlier[row] += diff
    for row, diff in earlier.items():
        if diff:
            rows[(row, at)] -= diff
