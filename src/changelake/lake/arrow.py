"""Reading a lake table without a JVM: the committed manifest's files, merged on read in Arrow.

Why one module of over 500 lines: the whole read without a JVM, which must equal Spark's view:
the merge stays beside what it merges.

`status`, `snapshot` and `snapshot --as-of` of a table that fits one machine need no Spark: the
manifest of the committed version names every file set, and the merge on read (`sql.py`) is a
sort and a group-by. This module does both with pyarrow and imports no pyspark, so a read
answers in a fraction of a second instead of the seconds a JVM and the metastore take to start.

The promise: a read here sees exactly the rows Spark's view shows for the same committed version
(the same file sets, old files projected onto today's schema, the same merge), or it does not
answer (`ArrowUnavailable`, and `auto` hands the read to Spark). It never reads a version that is
not committed.

What it tracks, without the metastore, to know the committed version: the commit pointer
`_state/COMMITTED` (see `layout.py`), written by every commit after its commit point (the
metastore's view naming version N, `commit.py`). Let P be the pointer, read first, and M the
newest manifest `_state/v{M}.json`, listed after it.

* P was committed (the pointer is written only after the commit point) and versions commit in
  order, so the committed version is at least P when the listing starts.
* A version commits only after its manifest is written. If M == P, no manifest beyond P existed
  when the listing ran, so nothing beyond P was committed then: P *is* the committed version.
* If M > P, version M is either in flight (manifest written, view not yet changed), crashed
  before its commit point (never committed), or crashed between the view change and the
  pointer (committed). These cannot be told apart without the metastore: `ArrowUnavailable`.
  The next commit, or a Spark-side read (`commit.repair_pointer`, under the writer lock),
  repairs it.
* No pointer (a table from before pointers, or a creation that has not reached it):
  `ArrowUnavailable`; the next commit or a Spark-side read writes it.

Committed manifests are never rewritten, and garbage collection keeps the committed version's
file sets, and a replaced version's for `commit.DEFAULT_GRACE_SECONDS` after it was replaced,
as it does for Spark readers: a read that takes longer than that while commits go on can fail
with a missing file, never return wrong rows.

The merge on read, as `sql.state_sql` does it (`AS OF T` keeps updates at `_time <= T`):

* keyed: per key (nulls are one key, as in SQL's PARTITION BY), the update at the latest time,
  an insertion before a retraction at the same time; the key exists if that update inserts;
* unkeyed: `_diff` summed per row over the columns live at the time read (the others null),
  and a row of multiplicity n is n rows;
* `--history` (SCD type 2, `scd2.py`): every insertion is a version from its time to the key's
  next time with an update, ordered by key (nulls first) and `valid_from`, as Spark orders it.

Grouping is by sorting and finding runs of equal values (null equals null, NaN equals NaN, as
SQL groups), with pyarrow.compute and numpy: pyarrow's hash group-by (acero) would import
pyarrow.dataset, which costs the CLI more start-up time than the whole read of a small table.

Spark takes over (`auto`) when the manifest says the table is large (`ARROW_MAX_BYTES`,
`ARROW_MAX_ROWS`: more than one process's memory should hold), a column's type has no Arrow
reading here (intervals, variants, ...), or an unkeyed table groups on a nested column.
Values are turned into Python as PySpark hands them to `snapshot` (`plain`), so both engines
print the same.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset
import pyarrow.parquet as pq

from changelake.errors import LakeError
from changelake.lake.files import delta_uri, lake_root, parquet_source, storage_options
from changelake.lake.follow_lag import follow_status
from changelake.lake.identifier import IDENTIFIER, TableIdentifier
from changelake.lake.layout import (
    DELTA_APP_ID,
    DELTA_UPDATES,
    SEGMENT,
    FileSet,
    SchemaVersion,
    TableState,
    check_as_of_time,
    manifest_versions,
    read_manifest,
    read_pointer,
)
from changelake.spark_arrow import WIDENINGS, NoArrowType, arrow_of
from changelake.values import float32_value

ARROW_MAX_BYTES = 256 * 2**20
"""`auto` reads a table with Arrow when its committed files hold at most this many bytes..."""

ARROW_MAX_ROWS = 4_000_000
"""... and at most this many updates (Parquet rows); beyond either, Spark reads it."""

class ArrowUnavailable(LakeError):
    """The Arrow path cannot answer this read (it cannot tell the committed version, or the
    table has what it does not read); with `auto` Spark answers instead."""


# ------------------------------------------------------------------------ committed state


def lake_tables_dir(lake: Path | str) -> Path:
    return lake_root(lake) / "tables"


def committed_state(lake: Path | str, ident: TableIdentifier) -> TableState:
    """The committed manifest of a table, known from the commit pointer (see the module
    docstring): a LakeError if the table does not exist, `ArrowUnavailable` if the pointer
    cannot be trusted now."""
    root = lake_root(lake)
    directory = ident.directory(root / "tables")
    if not (directory / "_state").is_dir():
        raise LakeError(f"table {ident.display} does not exist in lake {root}")
    if (directory / DELTA_UPDATES / "_delta_log").is_dir():
        # A Delta table's committed version is in Delta's log (`delta_storage`): no pointer.
        from deltalake.exceptions import TableNotFoundError

        try:
            version = _delta(directory / DELTA_UPDATES).transaction_version(DELTA_APP_ID)
        except TableNotFoundError:  # a creation in flight: its log has no commit yet
            version = None
        if version is None:
            raise LakeError(f"table {ident.display} does not exist in lake {root}")
        return read_manifest(directory, version)
    pointer = read_pointer(directory)  # first the pointer, then the listing
    newest = manifest_versions(directory)
    if pointer is None:
        raise ArrowUnavailable(
            f"table {ident.display}: no commit pointer (committed before pointers existed, or "
            "not created yet); the committed version is known only to the metastore")
    if not newest or newest[-1] != pointer:
        raise ArrowUnavailable(
            f"table {ident.display}: manifest v{newest[-1] if newest else '?'} is newer than "
            f"the commit pointer (v{pointer}): a commit in flight, or one that crashed; the "
            "committed version is known only to the metastore")
    return read_manifest(directory, pointer)


def table_names(lake: Path | str) -> list[TableIdentifier]:
    """Every table directory of the lake (`tables/DB/NAME/_state`), sorted as `Lake.tables`
    sorts them (by the name users write)."""
    top = lake_tables_dir(lake)
    found: list[TableIdentifier] = []
    for db in sorted(top.glob("*")) if top.is_dir() else []:
        if not db.is_dir() or IDENTIFIER.fullmatch(db.name) is None or db.name != db.name.lower():
            continue
        for table in db.iterdir():
            if (table.is_dir() and IDENTIFIER.fullmatch(table.name) is not None
                    and table.name == table.name.lower() and (table / "_state").is_dir()):
                found.append(TableIdentifier(db.name, table.name))
    return sorted(found, key=lambda ident: ident.display)


def lake_states(lake: Path | str) -> list[TableState]:
    """The committed state of every table of the lake (`ArrowUnavailable` if one cannot be
    known without the metastore)."""
    return [committed_state(lake, ident) for ident in table_names(lake)]


def within_limits(state: TableState, lake: Path | str | None = None) -> bool:
    """Whether `auto` reads the table with Arrow (see `ARROW_MAX_BYTES`, `ARROW_MAX_ROWS`).
    A Delta table's size is its updates table's, from Delta's log (`lake` locates it;
    without it, a Delta table is left to Spark)."""
    if state.storage == "delta":
        if lake is None:
            return False
        rows, size, _ = delta_size(table_directory(lake, state))
        return size <= ARROW_MAX_BYTES and rows <= ARROW_MAX_ROWS
    return (sum(f.bytes for f in state.files) <= ARROW_MAX_BYTES
            and sum(f.rows for f in state.files) <= ARROW_MAX_ROWS)


def _delta(path: Path) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(delta_uri(path), storage_options=storage_options(path))


def table_directory(lake: Path | str, state: TableState) -> Path:
    return TableIdentifier.parse(state.name).directory(lake_tables_dir(lake))


def delta_size(directory: Path) -> tuple[int, int, int]:
    """Rows, bytes and data files of a Delta table's updates table, from its log's add
    actions."""
    actions = _delta(directory / DELTA_UPDATES).get_add_actions(flatten=True)
    names = actions.schema.names
    size = sum(v or 0 for v in actions.column("size_bytes").to_pylist())
    rows = sum(v or 0 for v in actions.column("num_records").to_pylist()) \
        if "num_records" in names else 0
    return rows, size, actions.num_rows


# ------------------------------------------------------------------------------- schemas


def arrow_type(spark_type: Any, table: str) -> pa.DataType:
    """`arrow_of` for a read: a type it does not map is one Spark reads instead."""
    try:
        return arrow_of(spark_type, f"table {table}")
    except NoArrowType:
        raise ArrowUnavailable(f"table {table}: column type {json.dumps(spark_type)} is read "
                               "on Spark only") from None


def struct_fields(struct_text: str) -> list[tuple[str, Any]]:
    """(name, Spark type JSON) of a struct as a manifest stores it."""
    return [(f["name"], f["type"]) for f in json.loads(struct_text)["fields"]]


def _wider(old: Any, new: Any) -> Any:
    if old == new:
        return old
    if (old, new) in WIDENINGS:
        return new
    return old  # the other way round (evolution refuses anything that is not a widening)


def logical_fields(versions: Sequence[SchemaVersion]) -> list[tuple[str, Any]]:
    """Every column any version had, in order of first appearance, at its widest type (as
    `schema.logical_schema`)."""
    types: dict[str, Any] = {}
    for version in versions:
        for name, kind in struct_fields(version.struct):
            types[name] = _wider(types[name], kind) if name in types else kind
    return list(types.items())


def live_columns(versions: Sequence[SchemaVersion], at: int | None = None) -> list[str]:
    """The source's columns at time `at` (None: now), as `schema.live_columns`."""
    chosen = versions[0]
    for version in versions:
        if at is None or version.from_time <= at:
            chosen = version
    return [name for name, _ in struct_fields(chosen.struct)]


def arrow_schema(state: TableState) -> pa.Schema:
    return pa.schema([pa.field(name, arrow_type(kind, state.name))
                      for name, kind in logical_fields(state.versions)])


# ------------------------------------------------------------------------------- reading


def parquet_files(directory: Path) -> list[Path]:
    """The data files of a file set as Spark lists them: hidden (`.`, `_`) names skipped,
    except partition directories (`_bucket=k`)."""
    return [p for p in sorted(directory.rglob("*.parquet"))
            if not any(part.startswith((".", "_")) and "=" not in part
                       for part in p.relative_to(directory).parts)]


def _column(array: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if array.type == target:
        return array
    if pa.types.is_timestamp(array.type) and pa.types.is_timestamp(target):
        # INT96 (Spark's default for timestamps) reads as naive nanoseconds of UTC time.
        array = array.cast(pa.timestamp("us", tz=array.type.tz))
        if array.type.tz is None and target.tz is not None:
            array = pc.assume_timezone(array, "UTC")
    return array.cast(target)


def read_file_set(fs: FileSet, state: TableState, directory: Path, schema: pa.Schema
                  ) -> pa.Table:
    """One file set's updates on the logical schema, with `_time` and `_diff` (as
    `sql.project_file_set`: columns the files lack are typed nulls, narrower ones cast up)."""
    physical = {name for name, _ in struct_fields(state.structs[fs.struct])}
    wanted = [f.name for f in schema if f.name in physical] + ["_time", "_diff"]
    parts = []
    for path in parquet_files(directory / fs.path):
        # ParquetFile, not read_table: that goes through pyarrow.dataset, which imports pandas
        with parquet_source(path) as source, \
                pq.ParquetFile(source, coerce_int96_timestamp_unit="us") as parquet:
            data = parquet.read(columns=wanted)
        columns = []
        for field in schema:
            if field.name in physical:
                columns.append(_column(data.column(field.name), field.type))
            else:
                columns.append(pa.nulls(data.num_rows, field.type))
        columns += [data.column("_time").cast(pa.int64()), data.column("_diff").cast(pa.int64())]
        parts.append(pa.Table.from_arrays(columns, schema=_with_meta(schema)))
    if not parts:
        return _with_meta(schema).empty_table()
    return pa.concat_tables(parts)


def delta_updates(state: TableState, directory: Path, schema: pa.Schema) -> pa.Table:
    """A Delta table's committed updates (`sql.union_sql`'s, through delta-rs): the updates
    table's rows before the state's frontier, on the logical schema."""
    # Spark writes timestamps as Parquet INT96, which Arrow reads as nanoseconds unless told:
    # an instant outside 1677-2262 would overflow. Read them as microseconds, as Spark does.
    options = pyarrow.dataset.ParquetReadOptions(coerce_int96_timestamp_unit="us")
    data = _delta(directory / DELTA_UPDATES).to_pyarrow_dataset(
        parquet_read_options=options).to_table()
    if state.upper is not None:
        data = data.filter(pc.less(data.column("_time"), pa.scalar(state.upper, pa.int64())))
    present = set(data.schema.names)
    columns = [_column(data.column(f.name), f.type) if f.name in present
               else pa.nulls(data.num_rows, f.type) for f in schema]
    columns += [data.column("_time").cast(pa.int64()), data.column("_diff").cast(pa.int64())]
    return pa.Table.from_arrays(columns, schema=_with_meta(schema))


def _with_meta(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field("_time", pa.int64())).append(pa.field("_diff", pa.int64()))


def updates(state: TableState, directory: Path) -> pa.Table:
    """Every committed update of the table, on the logical schema with `_time` and `_diff`."""
    schema = arrow_schema(state)
    if state.storage == "delta":
        return delta_updates(state, directory, schema)
    tables = [read_file_set(fs, state, directory, schema) for fs in state.files]
    return pa.concat_tables(tables) if tables else _with_meta(schema).empty_table()


@dataclass(frozen=True, slots=True)
class Merged:
    """A table's rows, merged on read: `rows` distinct rows (the logical columns), each
    `counts[i]` times (all ones for a keyed table)."""

    rows: pa.Table
    counts: pa.Array

    @classmethod
    def once(cls, rows: pa.Table) -> Merged:
        """Each row once."""
        import numpy as np

        return cls(rows, pa.array(np.ones(rows.num_rows, np.int64)))

    @property
    def total(self) -> int:
        return int(pc.sum(self.counts).as_py() or 0) if len(self.counts) else 0

    def expanded(self) -> pa.Table:
        """Each row as many times as its multiplicity."""
        if len(self.counts) == 0 or pc.all(pc.equal(self.counts, 1)).as_py():
            return self.rows
        import numpy as np

        index = np.repeat(np.arange(len(self.counts)), self.counts.to_numpy())
        return self.rows.take(pa.array(index))


def _differs(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> Any:
    """Row by row, whether `a` and `b` are distinct as SQL's grouping sees it (null equals
    null, NaN equals NaN)."""
    a_null, b_null = pc.is_null(a), pc.is_null(b)
    same = pc.fill_null(pc.equal(a, b), False)
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return pc.if_else(pc.or_(a_null, b_null), pc.xor(a_null, b_null), pc.invert(same))


def _run_starts(data: pa.Table, columns: Sequence[str], table: str) -> Any:
    """For a table sorted on `columns`, the indices of the first row of each run of equal
    values (a hash group-by without pyarrow.acero, which imports pandas: see `merge`)."""
    import numpy as np

    n = data.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for name in columns:
        column = data.column(name).combine_chunks()
        if pa.types.is_nested(column.type):
            raise ArrowUnavailable(f"table {table}: column {name} is nested; grouping on it "
                                   "is Spark's")
        starts[1:] |= _differs(column.slice(1), column.slice(0, n - 1)).to_numpy(
            zero_copy_only=False)
    return np.flatnonzero(starts)


def merge(state: TableState, data: pa.Table, as_of: int | None = None) -> Merged:
    """The merge on read of `sql.state_sql` (see the module docstring), by sorting and runs of
    equal values: plain pyarrow.compute and numpy, so that a CLI read imports neither pandas
    nor Spark."""
    import numpy as np

    names = [n for n in data.column_names if n not in ("_time", "_diff")]
    if as_of is not None:
        data = data.filter(pc.less_equal(data.column("_time"), int(as_of)))
    group = list(state.key) if state.keyed else [
        n for n in names if n in set(live_columns(state.versions, as_of))]
    order = [(k, "ascending") for k in group]
    if state.keyed:  # a key's first row is then its latest update, an insertion first
        order += [("_time", "descending"), ("_diff", "descending")]
    try:
        data = data.take(pc.sort_indices(data, sort_keys=order))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ArrowUnavailable(f"table {state.name}: its rows cannot be sorted in Arrow "
                               f"({error})") from None
    starts = _run_starts(data, group, state.name)
    if state.keyed:
        chosen = data.take(pa.array(starts, pa.int64()))
        chosen = chosen.filter(pc.greater(chosen.column("_diff"), 0))
        return Merged(chosen.select(names), pa.array(np.ones(chosen.num_rows, np.int64)))
    diffs = data.column("_diff").to_numpy()
    sums = np.add.reduceat(diffs, starts) if len(starts) else np.zeros(0, np.int64)
    keep = starts[sums > 0]
    chosen = data.take(pa.array(keep, pa.int64()))
    live = set(group)
    columns = [chosen.column(n) if n in live else pa.nulls(len(keep), data.schema.field(n).type)
               for n in names]
    rows = pa.Table.from_arrays(columns, schema=pa.schema([data.schema.field(n) for n in names]))
    return Merged(rows, pa.array(sums[sums > 0], pa.int64()))


def _sort_nulls_first(data: pa.Table, columns: Sequence[str]) -> Any:
    """Sort indices, ascending with nulls first (Spark's ORDER BY ... ASC)."""
    if tuple(int(p) for p in pa.__version__.split(".")[:2]) >= (25, 0):  # per key since 25
        return pc.sort_indices(data, sort_keys=[(c, "ascending", "at_start") for c in columns])
    return pc.sort_indices(data, sort_keys=[(c, "ascending") for c in columns],
                           null_placement="at_start")


def history(state: TableState, data: pa.Table) -> pa.Table:
    """The SCD type 2 history of a keyed table (as `scd2.scd2_sql`), ordered by key and
    `valid_from` as `snapshot --history` prints it: every insertion is a version from its
    time (`valid_from`) to the key's next time with an update (`valid_to`, null: current)."""
    import numpy as np

    if not state.keyed:
        raise LakeError(f"table {state.name} has no key: SCD type 2 history needs one")
    names = [n for n in data.column_names if n not in ("_time", "_diff")]
    key = list(state.key)
    try:
        data = data.take(_sort_nulls_first(data, [*key, "_time"]))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ArrowUnavailable(f"table {state.name}: its rows cannot be sorted in Arrow "
                               f"({error})") from None
    n = data.num_rows
    key_starts = np.zeros(n, dtype=bool)
    key_starts[_run_starts(data, key, state.name)] = True
    time_starts = _run_starts(data, [*key, "_time"], state.name)  # (key, time) runs
    times = data.column("_time").to_numpy()
    # each (key, time) run's successor's time, when the successor is of the same key
    following = np.full(len(time_starts), -1, dtype=np.int64)
    if len(time_starts) > 1:
        same_key = ~key_starts[time_starts[1:]]
        following[:-1] = np.where(same_key, times[time_starts[1:]], -1)
    run_of_row = np.cumsum(np.isin(np.arange(n), time_starts)) - 1
    valid_to = following[run_of_row] if n else following[:0]
    inserted = data.column("_diff").to_numpy() > 0
    rows = data.filter(pa.array(inserted)).select(names)
    ends = valid_to[inserted]
    return rows.append_column("valid_from", pa.array(times[inserted], pa.int64())) \
        .append_column("valid_to", pa.array(ends, pa.int64(), mask=ends < 0))


def read_history(lake: Path | str, ident: TableIdentifier, *,
                 state: TableState | None = None) -> pa.Table:
    """`history` of the table's committed state (read here unless given)."""
    state = state if state is not None else committed_state(lake, ident)
    return history(state, updates(state, ident.directory(lake_tables_dir(lake))))


def merged(lake: Path | str, ident: TableIdentifier, as_of: int | None = None, *,
           state: TableState | None = None) -> Merged:
    """The table now or AS OF `as_of`, merged on read (its committed state read here unless
    given)."""
    state = state if state is not None else committed_state(lake, ident)
    if as_of is not None:
        check_as_of_time(state, ident.display, as_of)
    directory = ident.directory(lake_tables_dir(lake))
    return merge(state, updates(state, directory), as_of)


def read_table(lake: Path | str, name: str | TableIdentifier, as_of: int | None = None
               ) -> pa.Table:
    """The table's rows now, or AS OF `as_of` (from its `since` to before its frontier), as a
    pyarrow Table: one row per key, or each row of an unkeyed table as many times as its
    multiplicity; the same rows as `spark.table(name)` (or `Table.as_of`). Needs no Spark, and
    raises `ArrowUnavailable` when the committed version cannot be known without the
    metastore (see the module docstring). A captured table is read up to its own frontier (the
    consistent-frontier check across its database is `snapshot`'s)."""
    return merged(lake, TableIdentifier.parse(name), as_of).expanded()


def duckdb_relation(lake: Path | str, name: str | TableIdentifier, as_of: int | None = None,
                    connection: Any = None) -> Any:
    """`read_table` as a DuckDB relation, on `connection` (default: DuckDB's own in-memory
    connection)."""
    import duckdb

    table = read_table(lake, name, as_of)
    con = connection if connection is not None else duckdb.default_connection()
    return con.from_arrow(table)


# ------------------------------------------------------------------------ Python values


def plain(value: Any) -> Any:
    """A value as plain JSON (dates and timestamps ISO, decimals as strings, bytes as hex), as
    `snapshot --format jsonl` prints it."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return value


def _as_snapshot_value(value: Any, kind: pa.DataType) -> Any:
    """A value from Arrow's `to_pylist` as `api.snapshot` yields it from Spark's rows:
    a timestamp as the UTC instant, a timestamp without a time zone as its wall-clock time,
    maps as dicts, a float (32-bit) as the double of its shortest text (see
    `values.float32_value`), not widened."""
    if value is None:
        return None
    if pa.types.is_float32(kind):
        return float32_value(value)
    if pa.types.is_timestamp(kind):
        micros = (value - dt.datetime(1970, 1, 1, tzinfo=value.tzinfo)) // dt.timedelta(
            microseconds=1)
        if kind.tz is None:  # TimestampNTZ: the wall-clock time as written
            return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    if pa.types.is_struct(kind):
        return {kind.field(i).name: _as_snapshot_value(value[kind.field(i).name],
                                                       kind.field(i).type)
                for i in range(kind.num_fields)}
    if pa.types.is_map(kind):
        return {_as_snapshot_value(k, kind.key_type): _as_snapshot_value(v, kind.item_type)
                for k, v in value}
    if pa.types.is_list(kind):
        return [_as_snapshot_value(v, kind.value_type) for v in value]
    return value


def _needs_conversion(kind: pa.DataType) -> bool:
    if pa.types.is_timestamp(kind) or pa.types.is_map(kind) or pa.types.is_float32(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_needs_conversion(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind):
        return _needs_conversion(kind.value_type)
    return False


def plain_rows(result: Merged, batch_rows: int = 65536) -> Iterator[dict[str, Any]]:
    """The rows as `api.snapshot` yields them (plain dicts), each as many times as its
    multiplicity."""
    schema = result.rows.schema
    convert = [f for f in schema if _needs_conversion(f.type)]
    counts = result.counts.to_pylist()
    offset = 0
    for batch in result.rows.to_batches(max_chunksize=batch_rows):
        for row in batch.to_pylist():
            for f in convert:
                row[f.name] = _as_snapshot_value(row[f.name], f.type)
            out = plain(row)
            for _ in range(counts[offset]):
                yield out
            offset += 1


# ---------------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class TableStatus:
    name: str
    key: list[str]
    frontier: list  # Antichain JSON: [t], or [] once the feed is closed
    since: int
    rows: int
    segments: int
    files: int
    bytes: int
    version: int
    last_operation: str
    last_commit: str  # ISO 8601, UTC
    source: str | None = None  # the source database's identity, for a captured table
    offsets: list[dict[str, Any]] | None = None
    """For a table ingested from Kafka topics: per partition its topic, partition, committed
    offset (where the next ingest starts), the partition's end now and the lag between them
    (None, with `error`, when the cluster was not or could not be asked; see `kafka.lag`)."""
    follow: dict[str, Any] | None = None
    """For a table following a directory or topics (`ingest --follow`): the source, the last
    committed micro-batch, the files (records) not yet committed and the age of the oldest of
    them in seconds (see `follow_lag`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class LakeStatus:
    """`changelake status`: per table, and per source database of captured tables
    (`sources.SourceStatus`, which needs the capture's modules)."""

    tables: list[TableStatus]
    sources: list


def status_of(state: TableState, directory: Path, name: str, rows: int, *,
              offsets: list[dict[str, Any]] | None = None, live: bool = True) -> TableStatus:
    """A table's status line from its committed `state`, its row count, its Kafka lag, and a
    followed directory's lag (followed topics' only when `live`)."""
    files = sum(1 for fs in state.files for _ in (directory / fs.path).glob("*.parquet"))
    size = sum(f.bytes for f in state.files)
    if state.storage == "delta":  # the updates table's data files
        _, size, files = delta_size(directory)
    when = dt.datetime.fromtimestamp(state.committed_at, dt.UTC).isoformat(timespec="seconds")
    return TableStatus(
        name=name, key=list(state.key), frontier=list(state.frontier), since=state.since,
        rows=rows, segments=sum(1 for f in state.files if f.kind == SEGMENT), files=files,
        bytes=size, version=state.version,
        last_operation=state.operation, last_commit=when,
        source=None if state.origin is None else state.origin.source, offsets=offsets,
        follow=follow_status(state.offsets, live=live),
    )


def table_status(lake: Path | str, state: TableState, *,
                 offsets: list[dict[str, Any]] | None = None, live: bool = True
                 ) -> TableStatus:
    """`status` of one table from its committed state, its rows counted in Arrow."""
    ident = TableIdentifier.parse(state.name)
    directory = ident.directory(lake_tables_dir(lake))
    return status_of(state, directory, ident.display,
                     merged(lake, ident, state=state).total, offsets=offsets, live=live)
