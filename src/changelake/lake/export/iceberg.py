"""Incremental export of a lake table to an Iceberg table (pyiceberg, a SQL catalog).

    export_to_iceberg(spark, lake, "shop.orders", "sqlite:////abs/catalog.db")

What the Iceberg table holds: the lake table's state at its committed frontier F, that is what
`changelake snapshot --as-of F-1` prints (every update at a time < F, merged on read as the
table's view merges: a key's latest update wins, an unkeyed row appears as often as its
multiplicity); a closed table: its final state. Each run exports up to the frontier F it
reads when it starts.

* First run (no Iceberg table yet): the Iceberg table is created, with the state at F, in ONE
  catalog commit (`create_table_transaction`): a run killed before it leaves no table at all.
* Later runs: only the changes in `[E, F)`, E the frontier the last run exported (read back
  from the Iceberg table's properties). They come from `changes.changes_frame` (what
  `changelake changes --since E --until F` streams) and are applied in one transaction:
  - keyed tables, by key: per key the latest change in `[E, F)` (an insertion over a
    retraction at the same time, as the view merges); every touched key's row is deleted
    (`In` / equality filter on the key) and the key's new row, if it still exists, appended;
  - unkeyed tables, by multiplicity: each distinct row's net diff n over `[E, F)`; n > 0
    appends n copies; n < 0 deletes every copy of the row (an equality filter on all
    columns, `IS NULL` for nulls) and appends its remaining count, read from the Iceberg
    table (old count + n; a negative result means the Iceberg table was changed outside the
    export, an error).
  - When compaction moved the lake table's `since` past E (the changes at `[E, since]` were
    folded away), the run rewrites the table instead: delete everything and append the state
    at F, still one transaction.
* Exactly once: the frontier F goes into the same commit as the data, as the table property
  `changelake.frontier` (and `changelake.table`, the lake table's name) and into the summary
  of every snapshot the commit makes, so each Iceberg snapshot names the changelake frontier
  it holds. The catalog's commit (a compare-and-swap of the metadata pointer) is the commit
  point: a run killed before it leaves only unreferenced data files (orphans, never read) and
  the table at E, so the next run exports `[E, F')` again; a run killed after it leaves F,
  and the next run starts there. A run where E == F commits nothing. A commit that loses a
  race with another writer of the Iceberg table fails (a `LakeError`, nothing committed; run
  again): every export sets `commit.retry.num-retries = 0` on the table, as pyiceberg would
  otherwise rebase the commit onto the other writer's snapshot. An existing Iceberg
  table that is not a changelake export of this lake table is refused.

Columns and types (`iceberg_type`): byte/short/int -> int, long -> long, float, double,
string, boolean, binary, decimal(p, s), date, timestamp -> timestamptz (an instant, stored
in UTC), timestamp_ntz -> timestamp; every column optional, field ids 1..n in the lake
table's column order. Arrays, maps and structs are refused, naming the column. Schema
evolution: a column added to the lake table is added to the Iceberg table (a new field id;
older rows read null, as in the lake); int -> long and float -> double widenings promote the
Iceberg column. A column dropped from the lake table (not live in its latest schema version),
an Iceberg column the lake table lacks, or any other type change is a `SchemaError` naming the
table and column, raised before anything is written: the Iceberg table stays as it was.

Catalog and warehouse (`open_catalog`): `uri` is a SQLAlchemy URL for pyiceberg's
`SqlCatalog`. For `sqlite:///PATH`, the warehouse (where the Iceberg data and metadata files
go) is the directory `<PATH without its suffix>-warehouse` next to the database file, unless
`warehouse` is given; any other URL needs `warehouse`. The Iceberg table is `identifier`
("namespace.name"), by default the lake table's `database.name`.

What goes through the driver (honestly): never Python rows of the table's data, but Arrow.
The first export (and a rewrite) has Spark write the state as Parquet into a staging directory
under the lake (`LAKE/.export-staging/TABLE/`, removed afterwards, and by the
next such run of the table if a run was killed), which the driver reads back with
`pyarrow.dataset` batch by batch and streams into pyiceberg's writer (`append` of a
`RecordBatchReader`), so driver memory is bounded by a batch and a target file, not by the
table; the bytes do pass through the driver process, which writes the Iceberg data files.
An incremental run collects the consolidated changes as one Arrow table (`DataFrame.toArrow`):
driver memory grows with the changes of `[E, F)`, not with the table. The delete filters are
built from Python values: the changed keys of a keyed table, the distinct retracted rows of an
unkeyed table (and the rows' old copies read back from Iceberg to count them). Applying a
delete rewrites the Iceberg data files holding a deleted row (pyiceberg's copy-on-write).
Not done: captured tables are exported to their own frontier, not their source database's
consistent frontier (`snapshot --as-of` refuses beyond it; see `sources.py`); NaN values in
an unkeyed table's float columns cannot be matched by a delete filter.
"""

from __future__ import annotations

import json
import shutil
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.errors import LakeError, SchemaError
from changelake.lake.catalog import Lake
from changelake.lake.changes import changes_frame, plan_changes
from changelake.lake.layout import SEGMENT, TableState
from changelake.lake.schema import live_columns, logical_schema
from changelake.lake.sql import state_sql
from changelake.lake.table import Table

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table as IcebergTable
    from pyiceberg.table import Transaction
    from pyiceberg.types import IcebergType

FRONTIER_PROPERTY = "changelake.frontier"
"""Table property and snapshot summary key: the lake frontier the Iceberg table holds, as the
JSON of an antichain (`[12]`; `[]` once the lake table is closed)."""
TABLE_PROPERTY = "changelake.table"
"""Table property and snapshot summary key: the lake table the Iceberg table exports."""
NO_RETRIES = "commit.retry.num-retries"
"""Set to 0 on every exported table: pyiceberg retries a commit that lost a race by rebasing
it on the new snapshot, which would apply changes computed against the older state (twice,
if the winner was another export). A lost race fails the run instead; nothing is committed."""
STAGING = ".export-staging"
BATCH_ROWS = 65536


@dataclass(frozen=True, slots=True)
class IcebergExport:
    """What one export run did. Frontiers are antichain elements: `(12,)`, `()` for a closed
    table; `frontier_before` is None when the run created the Iceberg table."""

    table: str
    target: str  # the Iceberg identifier, "namespace.name"
    frontier_before: tuple[int, ...] | None
    frontier_after: tuple[int, ...]
    mode: str  # "create", "changes", "rewrite" (compaction passed the export) or "nothing"
    rows_inserted: int  # rows appended to the Iceberg table
    rows_deleted: int  # rows removed from it (an updated key counts once in each)
    snapshot_id: int | None  # the Iceberg table's current snapshot after the run

    @property
    def committed(self) -> bool:
        return self.mode != "nothing"

    def line(self) -> str:
        before = "none" if self.frontier_before is None else json.dumps(list(self.frontier_before))
        after = json.dumps(list(self.frontier_after))
        if not self.committed:
            return (f"export {self.table} to iceberg {self.target}: nothing new (frontier "
                    f"{after} already exported)")
        return (f"export {self.table} to iceberg {self.target} ({self.mode}): frontier {before} "
                f"-> {after}, {self.rows_inserted} row(s) inserted, {self.rows_deleted} deleted, "
                f"snapshot {self.snapshot_id}")


# ------------------------------------------------------------------------------ catalog


def warehouse_for(uri: str) -> Path:
    """The default warehouse of a SQLite catalog: `<database file without suffix>-warehouse`,
    next to the database file."""
    if not uri.startswith("sqlite:///"):
        raise LakeError(f"iceberg catalog {uri!r}: only a sqlite:/// catalog has a default "
                        "warehouse; pass warehouse=... (a directory or file:// URL)")
    path = Path(uri[len("sqlite:///"):])
    if not path.name or path.name == ":memory:":
        raise LakeError(f"iceberg catalog {uri!r}: needs a database file")
    path = path.resolve()
    return path.with_name(f"{path.stem}-warehouse")


def open_catalog(uri: str, *, catalog: str = "changelake",
                 warehouse: str | Path | None = None) -> Catalog:
    """pyiceberg's `SqlCatalog` named `catalog` at the SQLAlchemy URL `uri`; the warehouse is
    `warehouse`, or for SQLite the directory next to the database file (`warehouse_for`)."""
    from pyiceberg.catalog.sql import SqlCatalog

    if warehouse is None:
        location = warehouse_for(uri)
        location.parent.mkdir(parents=True, exist_ok=True)
        location.mkdir(exist_ok=True)
        url = location.as_uri()
    elif isinstance(warehouse, Path) or "://" not in str(warehouse):
        location = Path(warehouse).resolve()
        location.mkdir(parents=True, exist_ok=True)
        url = location.as_uri()
    else:
        url = str(warehouse)
    return SqlCatalog(catalog, uri=uri, warehouse=url)


# -------------------------------------------------------------------------------- types


def iceberg_type(kind: T.DataType, where: str) -> IcebergType:
    """The Iceberg type of a lake column's Spark type (see the module docstring)."""
    from pyiceberg import types as it

    simple: dict[type, Any] = {
        T.ByteType: it.IntegerType, T.ShortType: it.IntegerType, T.IntegerType: it.IntegerType,
        T.LongType: it.LongType, T.FloatType: it.FloatType, T.DoubleType: it.DoubleType,
        T.StringType: it.StringType, T.BooleanType: it.BooleanType,
        T.BinaryType: it.BinaryType, T.DateType: it.DateType,
        T.TimestampType: it.TimestamptzType, T.TimestampNTZType: it.TimestampType,
    }
    if isinstance(kind, T.DecimalType):
        return it.DecimalType(kind.precision, kind.scale)
    for spark_type, ice in simple.items():
        if type(kind) is spark_type:
            return ice()
    raise SchemaError(f"{where}: type {kind.simpleString()} has no Iceberg mapping in the "
                      "export (integers, float, double, string, boolean, binary, decimal, "
                      "date and timestamps do); nothing was exported")


def iceberg_schema(struct: T.StructType, table: str) -> Schema:
    """The Iceberg schema of the lake table's columns: field ids 1..n in column order, every
    field optional (a lake column can always be null in some version)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    return Schema(*[
        NestedField(i + 1, f.name, iceberg_type(f.dataType, f"table {table}, column {f.name!r}"),
                    required=False)
        for i, f in enumerate(struct.fields)
    ])


@dataclass(frozen=True, slots=True)
class SchemaPlan:
    """How the Iceberg schema follows the lake table's: columns to add, columns to promote."""

    added: tuple[tuple[str, Any], ...]
    promoted: tuple[tuple[str, Any], ...]

    @property
    def changed(self) -> bool:
        return bool(self.added or self.promoted)


def check_live(state: TableState, table: str) -> T.StructType:
    """The lake table's columns, all live in its latest schema version, or a SchemaError
    naming a dropped one (the export does not drop Iceberg columns)."""
    logical = logical_schema(state.versions)
    live = set(live_columns(state.versions))
    for f in logical.fields:
        if f.name not in live:
            raise SchemaError(f"table {table}: column {f.name!r} was dropped from the lake "
                              "table; the Iceberg export does not drop columns, nothing was "
                              "exported")
    return logical


def plan_schema(logical: T.StructType, current: Schema, table: str, target: str) -> SchemaPlan:
    """Check the Iceberg table's columns against the lake table's (see the module docstring)."""
    from pyiceberg import types as it

    wanted = {f.name: iceberg_type(f.dataType, f"table {table}, column {f.name!r}")
              for f in logical.fields}
    present = {f.name: f.field_type for f in current.fields}
    for name in present:
        if name not in wanted:
            raise SchemaError(f"table {table}: Iceberg table {target} has column {name!r}, which "
                              "the lake table lacks; nothing was exported")
    promotions = {(it.IntegerType(), it.LongType()), (it.FloatType(), it.DoubleType())}
    added, promoted = [], []
    for name, kind in wanted.items():
        if name not in present:
            added.append((name, kind))
        elif present[name] != kind:
            if (present[name], kind) not in promotions:
                raise SchemaError(f"table {table}: column {name!r} is {kind} in the lake table "
                                  f"but {present[name]} in Iceberg table {target}; only int to "
                                  "long and float to double are promoted, nothing was exported")
            promoted.append((name, kind))
    return SchemaPlan(tuple(added), tuple(promoted))


def apply_schema(tx: Transaction, plan: SchemaPlan) -> None:
    if not plan.changed:
        return
    with tx.update_schema() as update:
        for name, kind in plan.promoted:
            update.update_column(name, field_type=kind)
        for name, kind in plan.added:
            update.add_column(name, kind, required=False)


def conform(data: pa.Table | pa.RecordBatch, target: pa.Schema) -> pa.Table:
    """`data`'s columns, in the Iceberg schema's order and types (Spark's session time zone
    becomes UTC, smaller integers int, ...); a value that does not fit is an Arrow error."""
    arrays = [data.column(f.name).cast(f.type) for f in target]
    return pa.Table.from_arrays(arrays, schema=target)


def arrow_schema(schema: Schema) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(schema)


# ------------------------------------------------------------------------------ filters


def value_predicate(column: str, value: Any) -> BooleanExpression:
    from pyiceberg.expressions import EqualTo, IsNaN, IsNull

    if value is None:
        return IsNull(column)
    if isinstance(value, float) and value != value:
        return IsNaN(column)
    return EqualTo(column, value)


def any_of(terms: Sequence[BooleanExpression]) -> BooleanExpression:
    """The disjunction of `terms` as a balanced tree (a long left-deep chain would exhaust
    the recursion of pyiceberg's expression visitors)."""
    from pyiceberg.expressions import AlwaysFalse, Or

    if not terms:
        return AlwaysFalse()
    if len(terms) == 1:
        return terms[0]
    middle = len(terms) // 2
    return Or(any_of(terms[:middle]), any_of(terms[middle:]))


def rows_filter(rows: pa.Table, columns: Sequence[str]) -> BooleanExpression:
    """Matches every Iceberg row equal (nulls equal) to one of `rows` on `columns`."""
    from pyiceberg.expressions import And, In, IsNull

    if len(columns) == 1:
        values = rows.column(columns[0]).to_pylist()
        present = sorted({v for v in values if v is not None}, key=repr)
        terms: list[BooleanExpression] = [In(columns[0], present)] if present else []
        if any(v is None for v in values):
            terms.append(IsNull(columns[0]))
        return any_of(terms)
    terms = []
    for row in rows.select(list(columns)).to_pylist():
        term = value_predicate(columns[0], row[columns[0]])
        for c in columns[1:]:
            term = And(term, value_predicate(c, row[c]))
        terms.append(term)
    return any_of(terms)


def repeat_rows(rows: pa.Table, counts: Sequence[int]) -> pa.Table:
    """Each row of `rows` as many times as its count (unkeyed multiplicities)."""
    indices = [i for i, n in enumerate(counts) for _ in range(n)]
    return rows.take(pa.array(indices, pa.int64()))


# -------------------------------------------------------------------------------- export


def parse_frontier(text: str, target: str) -> tuple[int, ...]:
    try:
        value = json.loads(text)
        if isinstance(value, list) and len(value) <= 1 and all(type(v) is int for v in value):
            return tuple(value)
    except ValueError:
        pass
    raise LakeError(f"Iceberg table {target}: property {FRONTIER_PROPERTY} is {text!r}, not a "
                    "lake frontier")


def state_frame(table: Table, state: TableState) -> DataFrame:
    """The lake table's rows at its committed frontier F (`snapshot --as-of F-1`; a closed
    table: its final state), read from the manifest `state` (not re-read)."""
    frontier = state.upper
    if frontier is not None and frontier - 1 < state.since:  # nothing committed yet
        logical = logical_schema(state.versions)
        return table.spark.createDataFrame([], logical)
    as_of = None if frontier is None else frontier - 1
    return table.spark.sql(state_sql(state, table.directory, as_of=as_of, marker=False))


def incremental(state: TableState, exported: int) -> bool:
    """Whether the changes at `[exported, F)` are still in the lake table: compaction folds
    the history at and before its `since` S into S, so only `exported > S` qualifies, or
    `exported == S` while nothing has been compacted (`changes.plan_changes`'s rule)."""
    if exported > state.since:
        return True
    return exported == state.since and all(fs.kind == SEGMENT for fs in state.files)


def staged_batches(spark: SparkSession, frame: DataFrame, staging: Path,
                   target: pa.Schema) -> pa.RecordBatchReader:
    """`frame` written as Parquet by Spark into `staging`, read back as a stream of Arrow
    batches in the Iceberg schema."""
    import pyarrow.dataset as ds

    frame.write.mode("overwrite").parquet(str(staging))
    files = sorted(str(p) for p in staging.rglob("*.parquet"))

    def batches() -> Iterator[pa.RecordBatch]:
        if not files:
            return
        dataset = ds.dataset(files, format="parquet")
        for batch in dataset.to_batches(batch_size=BATCH_ROWS):
            yield from conform(batch, target).to_batches()

    return pa.RecordBatchReader.from_batches(target, batches())


def keyed_changes(changes: DataFrame, key: Sequence[str], columns: Sequence[str]) -> DataFrame:
    """Per changed key its latest change (an insertion over a retraction at the same time),
    as the table's view merges; `_diff > 0` where the key has a row afterwards."""
    order = Window.partitionBy(*[F.col(f"`{k}`") for k in key]).orderBy(
        F.col("_time").desc(), F.col("_diff").desc())
    return (changes.withColumn("_rank", F.row_number().over(order)).where("_rank = 1")
            .select(*[F.col(f"`{c}`") for c in columns], "_diff"))


def unkeyed_changes(changes: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Each changed distinct row's net diff over the interval (zeros dropped)."""
    return (changes.groupBy(*[F.col(f"`{c}`") for c in columns])
            .agg(F.sum("_diff").alias("_diff")).where(F.col("_diff") != 0))


def _snapshot_records(table: IcebergTable) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("total-records", 0))


def export_to_iceberg(spark: SparkSession, lake: Lake, table: str, uri: str, *,
                      catalog: str = "changelake", identifier: str | None = None,
                      warehouse: str | Path | None = None) -> IcebergExport:
    """Export the lake table `table` to the Iceberg table `identifier` (default: the lake
    table's `database.name`) of the SQL catalog at `uri`: the first run its state at its
    frontier, every later run the changes since the frontier the last one exported, exactly
    once (see the module docstring for the rules, the warehouse and what passes the driver)."""
    from pyiceberg.exceptions import NoSuchTableError

    handle = lake.table(table)
    name = handle.name
    ice_catalog = open_catalog(uri, catalog=catalog, warehouse=warehouse)
    ident = handle.ident
    target = identifier or f"{ident.database}.{ident.name}"
    if "." not in target:
        raise LakeError(f"Iceberg identifier {target!r} needs a namespace: NAMESPACE.NAME")
    state = handle.state()
    after = state.frontier
    logical = check_live(state, name)
    columns = logical.fieldNames()
    props = {FRONTIER_PROPERTY: json.dumps(list(after)), TABLE_PROPERTY: name}
    table_props = {**props, NO_RETRIES: "0"}

    try:
        ice = ice_catalog.load_table(target)
    except NoSuchTableError:
        ice = None

    if ice is None:
        schema = iceberg_schema(logical, name)
        namespace = target.rsplit(".", 1)[0]
        ice_catalog.create_namespace_if_not_exists(namespace)
        with _staging(lake, name) as staging:
            tx = ice_catalog.create_table_transaction(target, schema,
                                                         properties=table_props)
            reader = staged_batches(spark, state_frame(handle, state), staging,
                                    arrow_schema(tx.table_metadata.schema()))
            counted = _Counted(reader)
            tx.append(counted.reader(), snapshot_properties=props)
            _commit(tx, target, name)
        ice = ice_catalog.load_table(target)
        return IcebergExport(name, target, None, after, "create", counted.rows, 0,
                             _snapshot_id(ice))

    source = ice.properties.get(TABLE_PROPERTY)
    if source != name or FRONTIER_PROPERTY not in ice.properties:
        raise LakeError(f"Iceberg table {target} is not a changelake export of table {name} "
                        f"(its {TABLE_PROPERTY} property is {source!r}); nothing was exported")
    before = parse_frontier(ice.properties[FRONTIER_PROPERTY], target)
    if before == after:
        return IcebergExport(name, target, before, after, "nothing", 0, 0, _snapshot_id(ice))
    if not before or (after and after[0] < before[0]):
        raise LakeError(f"table {name}: Iceberg table {target} holds frontier {list(before)}, "
                        f"beyond the lake table's {list(after)}: it was exported from another "
                        "history; nothing was exported")
    plan = plan_schema(logical, ice.schema(), name, target)
    records_before = _snapshot_records(ice)
    tx = ice.transaction()
    apply_schema(tx, plan)
    target_arrow = arrow_schema(tx.table_metadata.schema())

    if not incremental(state, before[0]):
        from pyiceberg.expressions import AlwaysTrue

        with _staging(lake, name) as staging:
            reader = staged_batches(spark, state_frame(handle, state), staging, target_arrow)
            counted = _Counted(reader)
            _delete(tx, AlwaysTrue(), props)
            tx.append(counted.reader(), snapshot_properties=props)
            tx.set_properties(table_props)
            _commit(tx, target, name)
        return _finish(ice_catalog, target, name, before, after, "rewrite", counted.rows,
                       records_before)

    changes = changes_frame(handle, plan_changes(handle, before[0],
                                                 after[0] if after else None))
    if state.keyed:
        latest = keyed_changes(changes, state.key, columns).toArrow()
        rows = conform(latest, target_arrow)
        delete = rows_filter(rows, state.key) if len(rows) else None
        append = rows.filter(pc.greater(latest.column("_diff"), 0))
    else:
        net = unkeyed_changes(changes, columns).toArrow()
        rows = conform(net, target_arrow)
        diffs = net.column("_diff").to_pylist()
        grown = [i for i, d in enumerate(diffs) if d > 0]
        shrunk = [i for i, d in enumerate(diffs) if d < 0]
        parts = [repeat_rows(rows.take(pa.array(grown, pa.int64())), [diffs[i] for i in grown])]
        delete = None
        if shrunk:
            retracted = rows.take(pa.array(shrunk, pa.int64()))
            delete = rows_filter(retracted, columns)
            remaining = _remaining(tx, delete, retracted, [diffs[i] for i in shrunk],
                                   columns, name, target)
            parts.append(repeat_rows(retracted, remaining))
        append = pa.concat_tables(parts)
    if delete is not None:
        _delete(tx, delete, props)
    tx.append(append, snapshot_properties=props)
    tx.set_properties(table_props)
    _commit(tx, target, name)
    return _finish(ice_catalog, target, name, before, after, "changes", len(append),
                   records_before)


def _remaining(tx: Transaction, delete: BooleanExpression, retracted: pa.Table,
               diffs: Sequence[int], columns: Sequence[str], table: str,
               target: str) -> list[int]:
    """The count each retracted row keeps: its copies in the Iceberg table plus its (negative)
    net diff. Read through the transaction (`_scan`, what pyiceberg's own `delete` reads
    with), so a column this run adds is in the schema the filter is bound to (null in every
    row written before)."""
    old = tx._scan(row_filter=delete).to_arrow()
    held = Counter(tuple(r[c] for c in columns) for r in old.select(list(columns)).to_pylist())
    out = []
    for row, diff in zip(retracted.to_pylist(), diffs, strict=True):
        values = tuple(row[c] for c in columns)
        count = held[values] + diff
        if count < 0:
            raise LakeError(f"table {table}: the changes retract {-diff} cop(ies) of a row of "
                            f"which Iceberg table {target} holds {held[values]}: it was changed "
                            "outside the export; nothing was exported")
        out.append(count)
    return out


def _commit(tx: Transaction, target: str, table: str) -> None:
    """The commit point: one catalog commit of the data and the frontier. Another writer's
    commit to the Iceberg table in between is refused by the catalog (pyiceberg's
    requirements on the table's current snapshot), and nothing of this run is visible."""
    from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

    try:
        tx.commit_transaction()
    except (CommitFailedException, TableAlreadyExistsError) as error:
        raise LakeError(f"table {table}: Iceberg table {target} was changed by another writer "
                        f"during the export ({error}); nothing was exported, run it again"
                        ) from None


def _delete(tx: Transaction, expression: BooleanExpression, props: dict[str, str]) -> None:
    with warnings.catch_warnings():  # "did not match any records": a key that is new
        warnings.simplefilter("ignore", UserWarning)
        tx.delete(expression, snapshot_properties=props)


def _snapshot_id(ice: IcebergTable) -> int | None:
    snapshot = ice.current_snapshot()
    return None if snapshot is None else snapshot.snapshot_id


def _finish(ice_catalog: Catalog, target: str, name: str, before: tuple[int, ...],
            after: tuple[int, ...], mode: str, inserted: int,
            records_before: int) -> IcebergExport:
    ice = ice_catalog.load_table(target)
    deleted = records_before + inserted - _snapshot_records(ice)
    return IcebergExport(name, target, before, after, mode, inserted, deleted, _snapshot_id(ice))


class _Counted:
    """Counts the rows of a record batch stream as pyiceberg consumes it."""

    def __init__(self, reader: pa.RecordBatchReader) -> None:
        self._reader = reader
        self.rows = 0

    def reader(self) -> pa.RecordBatchReader:
        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self._reader:
                self.rows += batch.num_rows
                yield batch

        return pa.RecordBatchReader.from_batches(self._reader.schema, batches())


class _staging:
    """A fresh staging directory under the lake for Spark's Parquet (`LAKE/.export-staging/
    TABLE/RUN`), removed afterwards; what a killed run of the same table left is removed
    first."""

    def __init__(self, lake: Lake, table: str) -> None:
        self.table_dir = lake.root / STAGING / table
        self.path = self.table_dir / uuid.uuid4().hex

    def __enter__(self) -> Path:
        shutil.rmtree(self.table_dir, ignore_errors=True)
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


__all__ = [
    "FRONTIER_PROPERTY",
    "TABLE_PROPERTY",
    "IcebergExport",
    "export_to_iceberg",
    "iceberg_schema",
    "iceberg_type",
    "open_catalog",
    "warehouse_for",
]
