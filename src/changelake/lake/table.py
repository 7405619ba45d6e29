"""`Table`: a lake table's operations: commit (exactly once), read now or AS OF, compact, status.

Why one module of over 500 lines: the commit rule below, the checks that guard it and the
writer that applies them are one invariant (the committed frontier).

The core write is `Table.commit(updates, lower, upper)`: the updates of the frontier interval
`[lower, upper)`, as the table's columns plus `_time` and `_diff`. The table records the
frontier it has committed (F), and

* F == lower: everything is new;
* lower < F < upper: the input overlaps what is committed, and only updates at times >= F are
  written: replaying or re-batching a feed never doubles a row;
* F >= upper: nothing in the input is new, and nothing happens;
* F < lower: there would be a gap in the history, which is an error.

Updates at zero diff are dropped (they say nothing); an update at a time >= upper is an error,
raised before the commit point, so the table stays at its last commit.

Writers work inside `Table.writer()`: it takes the table's writer lock once and yields a
`TableWriter` holding the committed state read under it, so that whatever a writer derives from
that state (an ingest's conversion against the current rows, a compaction's plan) is committed
before anyone else can commit. `Table.commit` is the same for one commit. Every commit goes
through `commit.commit_state`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.durable import sync_tree
from changelake.errors import LakeError
from changelake.formats.tableschema import TableSchema
from changelake.lake import delta_storage
from changelake.lake.commit import DEFAULT_RETAIN, commit_state, load_state, writer_lock
from changelake.lake.files import remove_tree
from changelake.lake.identifier import TableIdentifier, check_name
from changelake.lake.key_rule import check_one_row_per_key
from changelake.lake.layout import (
    SEGMENT,
    FileSet,
    Origin,
    SchemaVersion,
    SourceOffsets,
    TableState,
    check_as_of_time,
    parquet_stats,
    segment_path,
)
from changelake.lake.scd2 import scd2_sql
from changelake.lake.schema import Evolution, evolve, logical_schema, struct_json
from changelake.lake.sql import state_sql, union_sql
from changelake.protocol import Antichain
from changelake.protocol.antichain import FrontierLike, as_frontier
from changelake.spark.delta_txn import StagedAppend
from changelake.spark.settings import settings

if TYPE_CHECKING:
    from changelake.lake.current_follower import CurrentFollower

DEFAULT_BUCKETS = 8

DELTA_STORAGE = "delta"
HIVE_STORAGE = "hive"
STORAGES = (DELTA_STORAGE, HIVE_STORAGE)
"""A table's back ends (`--format`): Delta Lake (`delta_storage.py`) or the Hive/Parquet
format of file sets under a view (`layout.py`, `commit.py`)."""

STORAGE_ENV = "CHANGELAKE_TABLE_FORMAT"


def default_storage() -> str:
    """The back end of a table created without one named: `CHANGELAKE_TABLE_FORMAT`, else
    Delta Lake. (A lake's existing tables keep their own: `TableState.storage`.)"""
    value = os.environ.get(STORAGE_ENV, "").strip().lower() or DELTA_STORAGE
    return check_storage(value, f"{STORAGE_ENV}={value!r}")


def check_storage(value: str, what: str = "table format") -> str:
    """`value` if it names a back end, else a LakeError saying which do."""
    if value not in STORAGES:
        raise LakeError(f"{what}: {value!r} is not a table format "
                        f"(one of {', '.join(STORAGES)})")
    return value

SEGMENT_DICTIONARY_BYTES = 256 * 1024
"""The most a column's Parquet dictionary holds in a segment file: past it, the rest
of the column is written plain (`parquet.dictionary.page.size`; Parquet's default is 1 MiB).

Parquet keeps a column's dictionary where the column's first page comes out smaller with it,
and then hashes every later value of the file's column into it until it passes this size. A
changefeed's updates come to the commit sorted by key (the conversion gives each key's updates
together), so the key and the columns a key's updates repeat (a retraction and the insertion
after it share most values) keep their dictionaries past the first page, and fill them with
every distinct value of the file: up to 128k longs hashed, per column and file, at 1 MiB. At
256 KiB that stops four times sooner, and a column of few distinct values (`_diff`, a status)
still keeps its whole dictionary. Every segment is written so (`write_segment`: a commit's,
and the part of a segment compaction keeps beyond `since`); compaction's runs, deltas and
bases (`compact.py`) are written with Parquet's defaults. Both feeds' updates were
written faster for about the same bytes (`benchmarks/bench_commit_files.py`; benchmarks/README.md,
"A commit's Parquet dictionaries stop at 256 KiB")."""


def write_segment(rows: DataFrame, target: Path) -> None:
    """Write `rows` as a segment's Parquet files in `target` (`SEGMENT_DICTIONARY_BYTES`).
    Spark's writer does not sync them: a writer that commits them calls `sync_tree` first."""
    rows.write.option("parquet.dictionary.page.size", SEGMENT_DICTIONARY_BYTES) \
        .parquet(str(target))


def write_staged(staged: StagedAppend, rows: DataFrame) -> None:
    """Write `rows` as the files of a Delta table's open transaction, with a segment's
    dictionary bound (`SEGMENT_DICTIONARY_BYTES`): Delta's writer takes Parquet's settings
    from the session's conf, not from options."""
    with settings(rows.sparkSession, {"parquet.dictionary.page.size":
                                      str(SEGMENT_DICTIONARY_BYTES)}):
        staged.write(rows)


ProgressFn = Callable[[str, int, int], None]
"""progress(step description, steps done, steps total): the commands layer draws bars with it."""


def _run(action: Callable[[], None]) -> None:
    """`TableWriter.commit`'s write, where the caller gives none of its own."""
    action()


def frontier_int(value: FrontierLike, what: str) -> int | None:
    """A lake frontier as an integer (None: closed). Lake tables have integer times; the
    argument may be an `Antichain`, a time (`4`) or a list of times (`[4]`, `[]`)."""
    try:
        frontier = as_frontier(value)
    except ValueError as error:
        raise LakeError(f"{what} frontier: {error}") from None
    if frontier.is_closed:
        return None
    if len(frontier) != 1 or type(frontier.elements[0]) is not int:
        raise LakeError(f"{what} frontier {frontier.to_json()} is not an integer time; "
                        "lake tables use integer times")
    return frontier.elements[0]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did: `written` updates from `lower` to `upper` (None: closed), or
    nothing if the table already had all of it."""

    table: str
    version: int
    lower: int | None
    upper: int | None
    written: int
    skipped: bool
    schema_changed: bool = False


def clear_dir(path: Path) -> None:
    """Remove an uncommitted leftover before writing to the same name."""
    if path.exists():
        remove_tree(path)


class Table:
    """A handle on one lake table, which may not exist yet (`Lake.table` checks that it does).
    Cheap: state is read from the metastore when needed."""

    def __init__(self, spark: SparkSession, ident: TableIdentifier, tables: Path, *,
                 storage: str | None = None, follower: CurrentFollower | None = None) -> None:
        self.spark = spark
        self.ident = ident
        self._tables = tables
        self.storage = storage
        """The back end the table is created with if a writer creates it (None: the
        default); an existing table keeps its own."""
        self.follower = follower
        """Where a Delta commit hands `current`'s catch-up (unless `follower.merges` is
        false) and its logs' checkpoints (None: the commit does both)."""

    def __repr__(self) -> str:
        return f"Table({self.ident.display!r}, {str(self._tables)!r})"

    @property
    def name(self) -> str:
        return self.ident.display

    @property
    def directory(self) -> Path:
        """The table's directory, verified to lie inside the lake each time it is asked for."""
        return self.ident.directory(self._tables)

    # ------------------------------------------------------------------------------ state

    def load(self) -> TableState | None:
        """The committed manifest (read fresh from the metastore), or None: no such table."""
        return load_state(self.spark, self.ident, self.directory)

    def state(self) -> TableState:
        """The committed manifest (read fresh from the metastore)."""
        state = self.load()
        if state is None:
            raise LakeError(f"table {self.name} does not exist")
        return state

    @property
    def frontier(self) -> Antichain:
        return self.state().frontier_antichain()

    @property
    def since(self) -> int:
        return self.state().since

    @property
    def schema(self) -> StructType:
        return logical_schema(self.state().versions)

    # ------------------------------------------------------------------------------ reads

    def current(self) -> DataFrame:
        """The current state through the metastore view, exactly as plain Spark SQL reads it."""
        return self.spark.table(self.ident.quoted)

    def latest(self) -> DataFrame:
        """The rows at the committed version: `current()` where it holds that version, else
        (a Delta table whose `current` trails its commits: `current_follower.py`) `current`
        with the commits it trails folded in (`delta_storage.current_at`), or, where it holds
        none, merged on read from the updates, as AS OF the frontier reads them."""
        state = self.state()
        if state.storage == delta_storage.STORAGE:
            applied = delta_storage.transaction_version(
                self.spark, delta_storage.current_path(self.directory))
            if applied is None or applied < state.version:
                held = delta_storage.current_at(self.spark, self.directory, state)
                if held is not None:
                    return held
                return self.spark.sql(state_sql(state, self.directory, marker=False))
        return self.current()

    def as_of(self, time: int) -> DataFrame:
        """The state at `time` (all updates at times <= `time`), for since <= time < frontier."""
        state = self.state()
        check_as_of_time(state, self.name, time)
        return self.spark.sql(state_sql(state, self.directory, as_of=time, marker=False))

    def updates(self) -> DataFrame:
        """Every retained update (base and deltas at their compacted times, then segments),
        on the logical schema with `_time` and `_diff`."""
        return self.spark.sql(union_sql(self.state(), self.directory))

    def history(self) -> DataFrame:
        """The SCD type 2 history (see `scd2.py`) of any keyed table, whether or not it keeps
        a history view."""
        return self.spark.sql(scd2_sql(self.state(), self.directory))

    # ----------------------------------------------------------------------------- writes

    @contextmanager
    def writer(self) -> Iterator[TableWriter]:
        """Hold the table's writer lock: the yielded writer has the committed state as read
        under the lock (None: the table does not exist yet), and commits through it are the
        only ones until the block ends."""
        directory = self.directory
        with writer_lock(directory):
            writer = TableWriter(self, self.load())
            try:
                yield writer
            finally:
                writer.closed = True

    def commit(self, updates: DataFrame, lower: FrontierLike, upper: FrontierLike, *,
               retain: int = DEFAULT_RETAIN, check_key: bool = True) -> CommitResult:
        """Commit the updates of `[lower, upper)` exactly once (see the module docstring;
        `check_key` as for `TableWriter.commit`)."""
        with self.writer() as writer:
            return writer.commit(updates, lower, upper, retain=retain, check_key=check_key)


def ingest_key(name: str, state: TableState | None, key: Sequence[str]) -> tuple[str, ...]:
    """The key an ingest converts and commits with. A new table (`state` None) takes the one
    given. An existing table keeps its own, whether the ingest names it again or leaves it
    out: a changefeed's upserts take a key's previous row from the table, and only the
    table's own key finds one row there (another key finds several, or none, and no key
    leaves an update without a before-image nothing to retract). Names compare in any case,
    as Spark's do: `--key id` is a table's key `ID`, and the table's spelling is kept."""
    if state is None:
        return tuple(key)
    own = state.key
    if key and tuple(k.lower() for k in key) != tuple(k.lower() for k in own):
        has = f"is keyed by {', '.join(own)}" if own else "has no key"
        raise LakeError(f"table {name} {has}, but the ingest gives the key {', '.join(key)}: "
                        "leave the key out, or give the table's")
    return own


def changefeed_key(name: str, state: TableState | None, key: Sequence[str],
                   table_json: dict[str, Any] | None) -> tuple[str, ...]:
    """`ingest_key` for a changefeed whose conversion may take its key from a table schema
    (YDB's `--schema`, `--table-schema`): the key given, else the table's own, else (a new
    table) the schema's primary key, which the conversion keys by anyway
    (`spark.changefeed.pipeline.convert_lines`). The table must
    be keyed by the same key: an update without a before-image (YDB's always) retracts its
    key's previous row, which the ingest takes from the table by the table's key, and a table
    without one gives none, so the old row would stay beside the new one. Such a table (made
    by an ingest that did not key it so) is refused, not silently duplicated into."""
    if key or table_json is None or (state is not None and state.key):
        return ingest_key(name, state, key)  # given, or the table's own
    primary = TableSchema.from_json(table_json).primary_key
    if primary and state is not None:  # an existing table without a key
        raise LakeError(f"table {name} has no key, but the changefeed is converted by its "
                        f"table schema's primary key ({', '.join(primary)}): each update "
                        "retracts its key's previous row, which only a table keyed by it "
                        "holds; ingest into a new table (it is created keyed so)")
    return ingest_key(name, state, primary)


class TableWriter:
    """A table under its writer lock (see `Table.writer`); `state` is its committed state."""

    def __init__(self, table: Table, state: TableState | None) -> None:
        self.table = table
        self.state = state
        self.closed = False

    @property
    def spark(self) -> SparkSession:
        return self.table.spark

    @property
    def name(self) -> str:
        return self.table.name

    def committed(self) -> TableState:
        """The committed state; a LakeError if the table does not exist (or the lock is gone)."""
        if self.closed:
            raise LakeError(f"table {self.name}: the writer lock was released")
        if self.state is None:
            raise LakeError(f"table {self.name} does not exist")
        return self.state

    def ingest_key(self, key: Sequence[str]) -> tuple[str, ...]:
        """`ingest_key` for this table, as committed when the lock was taken."""
        return ingest_key(self.name, self.state, key)

    def changefeed_key(self, key: Sequence[str],
                       table_json: dict[str, Any] | None) -> tuple[str, ...]:
        """`changefeed_key` for this table, as committed when the lock was taken."""
        return changefeed_key(self.name, self.state, key, table_json)

    def current(self) -> DataFrame:
        """The table's rows at the committed state held under the lock: a keyed Delta
        table's `current` where it holds that state (`delta_storage.current_at`), else merged
        on read from the state's updates."""
        state = self.committed()
        if state.storage == delta_storage.STORAGE:
            held = delta_storage.current_at(self.spark, self.table.directory, state)
            if held is not None:
                return held
        return self.spark.sql(state_sql(state, self.table.directory, marker=False))

    def publish(self, state: TableState, *, retain: int = DEFAULT_RETAIN,
                rows: DataFrame | None = None, write_struct: StructType | None = None,
                replace_where: str | None = None) -> int:
        """Commit `state` (derived from `self.state`) through `commit_state`; returns how many
        file sets garbage collection removed. `rows`, `write_struct`, `replace_where`: see
        `commit_state`."""
        if self.closed:
            raise LakeError(f"table {self.name}: the writer lock was released")
        expected = None if self.state is None else self.state.version
        follower = self.table.follower
        removed = commit_state(self.spark, self.table.ident, self.table.directory, state,
                               expected=expected, retain=retain, rows=rows,
                               write_struct=write_struct, replace_where=replace_where,
                               with_current=follower is None or not follower.merges,
                               checkpoint=follower is None)
        if follower is not None and expected is not None and state.storage == delta_storage.STORAGE:
            follower.request(self.table.ident, self.table.directory, state)
        self.state = state
        return removed

    def create(self, schema: StructType, *, key: Sequence[str] = (),
               buckets: int = DEFAULT_BUCKETS, since: int = 0, scd2: bool = False,
               origin: Origin | None = None, storage: str | None = None) -> TableState:
        """Create the table, empty and committed through `since` (its history starts there);
        `origin` is the source database a capture takes it from (kept by every version);
        `storage` its back end, "delta" or "hive" (default: `default_storage()`)."""
        if self.state is not None:
            raise LakeError(f"table {self.name} already exists")
        storage = storage or self.table.storage or default_storage()
        check_storage(storage, f"table {self.name}")
        for column in key:
            check_name(column, f"table {self.name}: key column")
        if buckets < 1:
            raise LakeError("a table needs at least one bucket")
        if scd2 and not key:
            raise LakeError(f"table {self.name} has no key: SCD type 2 history needs one")
        evolution = evolve((), schema, since, key=key, table=self.name)
        logical = evolution.write_struct
        state = TableState(
            name=self.name, version=0, key=tuple(key), buckets=buckets, since=since,
            frontier=(since,), versions=(SchemaVersion(since, struct_json(logical)),),
            structs=(), bucket_columns=tuple(key) or tuple(logical.fieldNames()), scd2=scd2,
            origin=origin, storage=storage,
        )
        self.publish(state, write_struct=logical)
        return state

    def commit(self, updates: DataFrame, lower: FrontierLike, upper: FrontierLike, *,
               retain: int = DEFAULT_RETAIN, offsets: SourceOffsets | None = None,
               write: Callable[[Callable[[], None]], None] | None = None,
               check_key: bool = True) -> CommitResult:
        """Commit the updates of `[lower, upper)` exactly once (see the module docstring).

        A keyed table's updates are first checked to keep one row per key (`key_rule.py`);
        `check_key=False` skips that, for updates built one per key and time or checked
        already.

        `offsets`: the source positions these updates were read up to, recorded by the same
        commit (so a crash either keeps both or neither). When nothing in the input is new but
        the offsets moved, a version that records only them is committed.

        `write` runs the job that writes the updates' files (for a changefeed conversion whose
        checks that job settles: `conversion.DeferredChecks.write`); where it raises, the files
        are removed and nothing is committed."""
        name = self.name
        for column in ("_time", "_diff"):
            if column not in updates.columns:
                raise LakeError(f"table {name}: updates have no {column} column "
                                f"(columns: {updates.columns})")
        lo = frontier_int(lower, "lower")
        up = frontier_int(upper, "upper")
        if lo is None:
            raise LakeError(f"table {name}: lower frontier of a commit cannot be closed")
        if up is not None and up < lo:
            raise LakeError(f"table {name}: upper {up} is before lower {lo}")
        state = self.committed()
        committed = state.upper
        if committed is None or (up is not None and committed >= up):
            if offsets is not None and offsets != state.offsets:
                self.publish(state.next("offsets", offsets=offsets), retain=retain)
            return CommitResult(name, self.committed().version, committed, up, 0, True)
        if committed < lo:
            raise LakeError(
                f"table {name}: the input starts at time {lo} but the table is "
                f"committed only through time {committed - 1}; updates at times "
                f"[{committed}, {lo}) are missing, nothing was written"
            )
        data = [f for f in updates.schema.fields if f.name not in ("_time", "_diff")]
        evolution = evolve(state.versions, StructType(data), committed, key=state.key,
                           table=name)
        rows = updates.where((F.col("_time") >= committed) & (F.col("_diff") != 0))
        rows = rows.select(
            *[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name)
              for f in evolution.write_struct.fields],
            F.col("_time").cast("long").alias("_time"),
            F.col("_diff").cast("long").alias("_diff"),
        )
        if state.key and check_key:
            check_one_row_per_key(rows, state.key, name)
        rel = segment_path(committed, up)
        if state.storage == DELTA_STORAGE:
            staged = delta_storage.stage(self.spark, self.table.directory, rows.schema)
            if staged is not None:
                return self._commit_staged(state, staged, rows, evolution, committed, up,
                                           offsets=offsets, retain=retain, write=write)
            rel = f"_staging/{rel}"  # a schema change: staged, checked, then appended
        target = self.table.directory / rel
        clear_dir(target)
        try:
            (write or _run)(lambda: write_segment(rows, target))
        except BaseException:
            remove_tree(target)
            raise
        if state.storage != DELTA_STORAGE:  # on the disk before the commit point names it
            sync_tree(target, self.table.directory)
        count, size, t_min, t_max = parquet_stats(target)
        try:
            _check_inside(name, t_max, lo, up)
        except LakeError:
            remove_tree(target)
            raise
        new, struct = state.struct_id(struct_json(evolution.write_struct))
        if state.storage == DELTA_STORAGE:
            # The staged segment is appended to the updates table by the commit itself (the
            # commit point: `delta_storage`), then removed.
            new = _committed(new, evolution, committed, up, offsets, count)
            try:
                staged = self.spark.read.parquet(str(target)) if count else None
                self.publish(new, retain=retain, rows=staged)
            finally:
                remove_tree(target)
            return CommitResult(name, new.version, committed, up, count, False,
                                evolution.changed)
        files = new.files
        if count:
            files = (*files, FileSet(rel, SEGMENT, struct, count, size, lower=committed,
                                     upper=up, min_time=t_min, max_time=t_max))
        else:
            remove_tree(target)
        new = _committed(replace(new, files=files), evolution, committed, up, offsets, count)
        self.publish(new, retain=retain)
        return CommitResult(name, new.version, committed, up, count, False, evolution.changed)

    def _commit_staged(self, state: TableState, staged: StagedAppend, rows: DataFrame,
                       evolution: Evolution, committed: int, up: int | None, *,
                       offsets: SourceOffsets | None, retain: int,
                       write: Callable[[Callable[[], None]], None] | None) -> CommitResult:
        """`commit` into a Delta table whose schema `rows` keep: the rows' files written once,
        by `staged`'s open Delta transaction, checked (`write`, and every time inside the
        interval), then committed by the commit point itself (`delta_storage.commit`); where
        anything fails first, the files are deleted and nothing is committed."""
        name = self.name
        seen = Observation()
        observed = rows.observe(seen, F.count(F.lit(1)).alias("rows"),
                                F.max("_time").alias("t_max"))
        try:
            (write or _run)(lambda: write_staged(staged, observed))
            count, t_max = int(seen.get["rows"]), seen.get["t_max"]
            _check_inside(name, t_max, committed, up)
            new, _struct = state.struct_id(struct_json(evolution.write_struct))
            new = _committed(new, evolution, committed, up, offsets, count)
            self.publish(new, retain=retain, rows=staged)
        finally:
            staged.abort()  # nothing, once committed
        return CommitResult(name, new.version, committed, up, count, False, evolution.changed)


def _check_inside(name: str, t_max: int | None, lower: int, upper: int | None) -> None:
    """A LakeError where a commit's latest update (at `t_max`) lies past its interval."""
    if upper is not None and t_max is not None and t_max >= upper:
        raise LakeError(
            f"table {name}: an update at time {t_max} is not inside the "
            f"committed interval [{lower}, {upper}); nothing was written")


def _committed(new: TableState, evolution: Evolution, committed: int, up: int | None,
               offsets: SourceOffsets | None, count: int) -> TableState:
    """The state a commit of `count` updates at `[committed, up)` makes of `new` (the
    committed state with the commit's struct): its frontier, schema versions, source offsets
    and the commit's detail."""
    new = new.next("commit", frontier=() if up is None else (up,),
                   versions=evolution.versions,
                   offsets=new.offsets if offsets is None else offsets)
    return replace(new, detail={"lower": committed, "upper": up, "rows": count})
