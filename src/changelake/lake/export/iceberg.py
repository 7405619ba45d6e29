"""Incremental export of a lake table to an Iceberg table (pyiceberg, a SQL catalog).

Why one module of over 500 lines: one export's plan, schema mapping and commit, whose exactly-
once argument spans them.

    export_to_iceberg(lake, "shop.orders", "sqlite:////abs/catalog.db")  -> ExportResult

What the Iceberg table holds: the lake table's state at its committed frontier F, that is what
`changelake snapshot --as-of F-1` prints (every update at a time < F, merged on read as the
table's view merges: a key's latest update wins, an unkeyed row appears as often as its
multiplicity); a closed table: its final state. Each run exports up to the frontier F of the
state it pins when it starts (`changes.pin`); every frame it reads comes from that state.
What the lake side reads (the full state, the changes, when they are exact) is `changes.py`'s,
shared with the Delta export; how rows leave Spark is `arrow.py`'s; this module holds what is
Iceberg's: types and field ids, schema evolution, delete filters, the catalog commit.

* First run (no Iceberg table yet): the Iceberg table is created, with the state at F, in ONE
  catalog commit (`create_table_transaction`): a run killed before it leaves no table at all.
* Later runs: only the changes in `[E, F)`, E the frontier the last run exported (read back
  from the Iceberg table's properties), as `changes.keyed_changes` / `unkeyed_changes` give
  them for a merge, applied in one transaction (a delete by filter, then an append):
  - keyed tables, by key: per key touched in `[E, F)` its latest update (as the view
    merges); every touched key's row is deleted (`In` / equality filter on the key) and the
    key's row at F, if it still exists, appended;
  - unkeyed tables, by multiplicity: per distinct row whose multiplicity grew, the copies to
    append; per row whose multiplicity shrank, a delete marker (an equality filter on all
    columns, `IS NULL` for nulls, removes every copy) and the copies it keeps at F (its
    multiplicity summed by Spark over the lake table), appended again.
  - When the changes at `[E, F)` are not exact (`changes.exact_from`: compaction folded them
    into the table's `since`), the run rewrites the table instead: delete everything and
    append the state at F, still one transaction.
* Exactly once: the frontier F goes into the same commit as the data, as the table property
  `changelake.frontier` (and `changelake.table`, the lake table's name) and into the summary
  of every snapshot the commit makes, so each Iceberg snapshot names the changelake frontier
  it holds. The catalog's commit (a compare-and-swap of the metadata pointer) is the commit
  point: a run killed before it leaves only unreferenced data files (orphans, never read) and
  the table at E, so the next run exports `[E, F')` again; a run killed after it leaves F,
  and the next run starts there. A run where E == F commits nothing. One export to a catalog's
  Iceberg table at a time from one lake: a run holds the exclusive lock
  (`arrow.export_lock`, released by the kernel if the run dies) named after the catalog URI
  (a SQLite catalog by its file's absolute path) and the identifier. A commit that loses a
  race with another writer of the Iceberg table fails (a `LakeError`, nothing committed; run
  again): every export sets `commit.retry.num-retries = 0` on the table, as pyiceberg would
  otherwise rebase the commit onto the other writer's snapshot. An existing Iceberg
  table that is not a changelake export of this lake table is refused.

The run is reported as every export kind reports (`result.ExportResult`, kind "iceberg",
target the identifier): mode "full" (created or rewritten), "incremental" or "none";
`inserted` the rows appended, `deleted` the rows the commit removed (the snapshots' record
counts; an updated key counts once in each, `updated` stays 0), `version` the Iceberg
table's current snapshot id.

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
under the lake (`LAKE/_export/PID-RANDOM/`, removed afterwards, and by the next export that
stages if the run that made it is dead: `arrow.staging_dir`), which the driver reads back
file by file, batch by batch (`arrow.staged_batches`) and streams into pyiceberg's writer
(`append` of a `RecordBatchReader`), so driver memory is bounded by a batch and a target
file, not by the table; the bytes do pass through the driver process, which writes the
Iceberg data files. An incremental run collects the changes as one Arrow table
(`arrow.frame_to_arrow`): driver memory grows with the changes of `[E, F)` (for a shrunk
unkeyed row, with the copies it keeps), not with the table; Spark reads the segments holding
`[E, F)`, and for an unkeyed table with retractions sums the retracted rows' multiplicity
over all of the table's files. The delete filters are built from Python values: the changed
keys of a keyed table, the distinct retracted rows of an unkeyed table. Applying a delete
rewrites the Iceberg data files holding a deleted row (pyiceberg's copy-on-write).
Not done: captured tables are exported to their own frontier, not their source database's
consistent frontier (`snapshot --as-of` refuses beyond it; see `sources.py`); NaN values in
an unkeyed table's float columns cannot be matched by a delete filter.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from changelake.errors import LakeError, SchemaError
from changelake.lake.catalog import Lake
from changelake.lake.export.arrow import export_lock, frame_to_arrow, staged_batches, staging_dir
from changelake.lake.export.changes import (
    Pinned,
    exact_from,
    frontier_json,
    full_state,
    keyed_changes,
    pin,
    unkeyed_changes,
)
from changelake.lake.export.result import ExportResult
from changelake.lake.identifier import TableIdentifier
from changelake.lake.schema import live_columns
from changelake.redact import redact

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
KIND = "iceberg"


# ------------------------------------------------------------------------------ catalog


def warehouse_for(uri: str) -> Path:
    """The default warehouse of a SQLite catalog: `<database file without suffix>-warehouse`,
    next to the database file."""
    if not uri.startswith("sqlite:///"):
        raise LakeError(f"iceberg catalog {redact(uri)!r}: only a sqlite:/// catalog has a "
                        "default warehouse; pass warehouse=... (a directory or file:// URL)")
    path = Path(uri[len("sqlite:///"):])
    if not path.name or path.name == ":memory:":
        raise LakeError(f"iceberg catalog {redact(uri)!r}: needs a database file")
    path = path.resolve()
    return path.with_name(f"{path.stem}-warehouse")


def check_catalog(uri: str, warehouse: str | Path | None = None) -> None:
    """Refuse, before anything is opened or made, a catalog URI SQLAlchemy cannot read, and
    one without a default warehouse when none is given (`warehouse_for`)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(uri)
    except ArgumentError:  # not shown: text that is no URL may be a password in a typo
        raise LakeError("the iceberg catalog is not a SQLAlchemy URL (not shown, lest it hold "
                        "a password): give sqlite:////ABS/PATH.db, or DIALECT://USER@HOST/"
                        "DATABASE with its password in the environment") from None
    except ValueError as error:  # a URL, with a part SQLAlchemy cannot read (a port)
        raise LakeError(f"iceberg catalog {redact(uri)!r} is not a SQLAlchemy URL it can "
                        f"read: {redact(str(error), known=uri)}") from None
    if warehouse is None:
        warehouse_for(uri)
    else:
        check_warehouse(warehouse)


def check_warehouse(warehouse: str | Path) -> None:
    """Refuse, before anything is made, a warehouse URL pyiceberg cannot write to: a scheme
    it has no file system for, a `file://` URL naming another host, a password in the URL
    (pyiceberg does not take one there, and an error would quote it: credentials come from
    the file system's own environment, `AWS_ACCESS_KEY_ID` and the like). A path, or text
    without `://`, is a local directory."""
    import urllib.parse

    from pyiceberg.io import SCHEMA_TO_FILE_IO

    text = str(warehouse)
    if isinstance(warehouse, Path) or "://" not in text:
        return
    shown = redact(text)
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMA_TO_FILE_IO:
        raise LakeError(f"iceberg warehouse {shown!r}: pyiceberg has no file system for "
                        f"{scheme or 'its'}:// URLs (it has {', '.join(sorted(SCHEMA_TO_FILE_IO))}"
                        "; a local directory is a path)")
    try:
        password = parts.password
    except ValueError:  # a port that is no number: urlsplit reads it lazily
        password = None
    if password is not None:
        raise LakeError(f"iceberg warehouse {shown!r}: a password in the URL is not taken; "
                        "give the file system's credentials in its environment "
                        "(AWS_ACCESS_KEY_ID, ...) and the URL without them")
    if scheme == "file" and parts.netloc not in ("", "localhost"):
        raise LakeError(f"iceberg warehouse {shown!r}: a file:// warehouse is a directory of "
                        "this machine: file:///ABS/PATH, or the path itself")


def open_catalog(uri: str, *, catalog: str = "changelake",
                 warehouse: str | Path | None = None) -> Catalog:
    """pyiceberg's `SqlCatalog` named `catalog` at the SQLAlchemy URL `uri`; the warehouse is
    `warehouse`, or for SQLite the directory next to the database file (`warehouse_for`)."""
    from pyiceberg.catalog.sql import SqlCatalog

    if warehouse is not None:
        check_warehouse(warehouse)
    location = warehouse_for(uri) if warehouse is None else \
        Path(warehouse).resolve() if isinstance(warehouse, Path) or "://" not in str(warehouse) \
        else None
    if location is not None:
        try:
            location.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise LakeError(f"iceberg warehouse {location}: cannot be made: {error.strerror}"
                            ) from None
        url = _file_location(location)
    else:
        url = str(warehouse)
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return SqlCatalog(catalog, uri=uri, warehouse=url)
    except (SQLAlchemyError, ImportError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if isinstance(error, ImportError):
            reason += " (the SQLAlchemy dialect's driver is not installed)"
        raise LakeError(f"iceberg catalog {redact(uri)!r} cannot be opened: "
                        f"{redact(reason, known=uri)}") from None


def _file_location(path: Path) -> str:
    """An Iceberg location of a local directory: `file://` and the path as it is. Iceberg's
    locations are not percent-encoded (pyiceberg and Hadoop's `Path` take them verbatim), so
    `Path.as_uri()`'s `%20` and `%2B` would name other directories than this one."""
    return f"file://{path}"


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


def check_live(pinned: Pinned) -> T.StructType:
    """The lake table's columns, all live in its latest schema version, or a SchemaError
    naming a dropped one (the export does not drop Iceberg columns, whenever the lake dropped
    it: stricter than `changes.dropped_columns`, which only looks after the last export)."""
    logical = pinned.logical
    live = set(live_columns(pinned.state.versions))
    for f in logical.fields:
        if f.name not in live:
            raise SchemaError(f"table {pinned.name}: column {f.name!r} was dropped from the lake "
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


def iceberg_arrow(schema: Schema) -> pa.Schema:
    """The Arrow schema pyiceberg writes `schema` with (field ids in the metadata): the rows
    leave Spark cast to it (`arrow.cast_batch`)."""
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


# -------------------------------------------------------------------------------- export


def parse_frontier(text: str, target: str) -> list[int]:
    try:
        value = json.loads(text)
        if isinstance(value, list) and len(value) <= 1 and all(type(v) is int for v in value):
            return value
    except ValueError:
        pass
    raise LakeError(f"Iceberg table {target}: property {FRONTIER_PROPERTY} is {text!r}, not a "
                    "lake frontier")


def lock_key(uri: str, target: str) -> str:
    """What the export lock is named after: the catalog and the Iceberg table (a SQLite
    catalog by its database file's absolute path, however the URL spells it)."""
    if uri.startswith("sqlite:///") and uri[len("sqlite:///"):] not in ("", ":memory:"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return f"iceberg {uri} {target}"


def _snapshot_records(table: IcebergTable) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("total-records", 0))


def export_to_iceberg(lake: Lake, table: str | TableIdentifier, uri: str, *,
                      catalog: str = "changelake", identifier: str | None = None,
                      warehouse: str | Path | None = None) -> ExportResult:
    """Export the lake table `table` to the Iceberg table `identifier` (default: the lake
    table's `database.name`) of the SQL catalog at `uri`: the first run its state at its
    frontier, every later run the changes since the frontier the last one exported, exactly
    once (see the module docstring for the rules, the warehouse and what passes the driver).
    One run per catalog and Iceberg table at a time from this lake (`arrow.export_lock`)."""
    handle = lake.table(table)
    ident = handle.ident
    target = identifier or f"{ident.database}.{ident.name}"
    if "." not in target:
        raise LakeError(f"Iceberg identifier {target!r} needs a namespace: NAMESPACE.NAME")
    check_catalog(uri, warehouse)
    with export_lock(lake.root, lock_key(uri, target)):
        pinned = pin(handle)
        # The columns are refused before the catalog is opened, which makes a SQLite
        # catalog's file: a refused first export leaves nothing behind.
        logical = check_live(pinned)
        schema = iceberg_schema(logical, pinned.name)
        ice_catalog = open_catalog(uri, catalog=catalog, warehouse=warehouse)
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return _export(lake, pinned, logical, schema, ice_catalog, target)
        except (OSError, SQLAlchemyError) as error:
            # The catalog's database or the warehouse's file system refusing (a server gone,
            # a file system pyarrow cannot reach): one line, neither URL's password in it.
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            for known in (uri, str(warehouse or "")):
                reason = redact(reason, known=known)
            where = "" if warehouse is None else f", warehouse {redact(str(warehouse))!r}"
            raise LakeError(f"table {pinned.name}: Iceberg table {target} (catalog "
                            f"{redact(uri)!r}{where}) cannot be written: {reason}; an "
                            "export commits whole or not at all: run it again once it can"
                            ) from None


def _export(lake: Lake, pinned: Pinned, logical: T.StructType, schema: Schema,
            ice_catalog: Catalog, target: str) -> ExportResult:
    from pyiceberg.exceptions import NoSuchTableError

    name = pinned.name
    after_text = frontier_json(pinned.frontier)
    after: list[int] = json.loads(after_text)
    props = {FRONTIER_PROPERTY: after_text, TABLE_PROPERTY: name}
    table_props = {**props, NO_RETRIES: "0"}

    try:
        ice = ice_catalog.load_table(target)
    except NoSuchTableError:
        ice = None

    if ice is None:
        namespace = target.rsplit(".", 1)[0]
        ice_catalog.create_namespace_if_not_exists(namespace)
        with staging_dir(lake.root) as staging:
            tx = ice_catalog.create_table_transaction(target, schema, properties=table_props)
            reader = staged_batches(full_state(pinned),
                                    iceberg_arrow(tx.table_metadata.schema()), staging)
            counted = _Counted(reader)
            tx.append(counted.reader(), snapshot_properties=props)
            _commit(tx, target, name)
        ice = ice_catalog.load_table(target)
        return ExportResult(name, KIND, target, None, after, "full", inserted=counted.rows,
                            version=_snapshot_id(ice))

    source = ice.properties.get(TABLE_PROPERTY)
    if source != name or FRONTIER_PROPERTY not in ice.properties:
        raise LakeError(f"Iceberg table {target} is not a changelake export of table {name} "
                        f"(its {TABLE_PROPERTY} property is {source!r}); nothing was exported")
    before = parse_frontier(ice.properties[FRONTIER_PROPERTY], target)
    if before == after:
        return ExportResult(name, KIND, target, before, after, "none",
                            version=_snapshot_id(ice))
    if not before or (after and after[0] < before[0]):
        raise LakeError(f"table {name}: Iceberg table {target} holds frontier {before}, "
                        f"beyond the lake table's {after}: it was exported from another "
                        "history; nothing was exported")
    lower = before[0]
    plan = plan_schema(logical, ice.schema(), name, target)
    records_before = _snapshot_records(ice)
    tx = ice.transaction()
    apply_schema(tx, plan)
    rows_schema = iceberg_arrow(tx.table_metadata.schema())

    if not exact_from(pinned, lower):  # compaction folded the changes: rewrite
        from pyiceberg.expressions import AlwaysTrue

        with staging_dir(lake.root) as staging:
            counted = _Counted(staged_batches(full_state(pinned), rows_schema, staging))
            _delete(tx, AlwaysTrue(), props)
            tx.append(counted.reader(), snapshot_properties=props)
            tx.set_properties(table_props)
            _commit(tx, target, name)
        return _finish(ice_catalog, target, name, before, after, "full", counted.rows,
                       records_before)

    keyed = pinned.state.keyed
    frame = keyed_changes(pinned, lower) if keyed else unkeyed_changes(pinned, lower)
    changes = frame_to_arrow(frame, rows_schema.append(pa.field("_diff", pa.int64())))
    diff = changes.column("_diff")
    if keyed:  # every touched key's row goes; the key's row at F, if any, comes back
        gone = changes
        columns: Sequence[str] = pinned.state.key
    else:  # delete markers remove every copy; copies (added or remaining) come back
        gone = changes.filter(pc.equal(diff, 0))
        columns = rows_schema.names
    append = changes.filter(pc.greater(diff, 0)).drop_columns(["_diff"])
    if len(gone):
        _delete(tx, rows_filter(gone, columns), props)
    tx.append(append, snapshot_properties=props)
    tx.set_properties(table_props)
    _commit(tx, target, name)
    return _finish(ice_catalog, target, name, before, after, "incremental", len(append),
                   records_before)


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


def _finish(ice_catalog: Catalog, target: str, name: str, before: list[int],
            after: list[int], mode: str, inserted: int, records_before: int) -> ExportResult:
    """The run's report: rows deleted are what the table's record count says went."""
    ice = ice_catalog.load_table(target)
    deleted = records_before + inserted - _snapshot_records(ice)
    return ExportResult(name, KIND, target, before, after, mode, inserted=inserted,
                        deleted=deleted, version=_snapshot_id(ice))


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


__all__ = [
    "FRONTIER_PROPERTY",
    "TABLE_PROPERTY",
    "export_to_iceberg",
    "iceberg_arrow",
    "iceberg_schema",
    "iceberg_type",
    "open_catalog",
    "warehouse_for",
]
