"""Schema evolution over the life of a feed.

Sources change their schemas (an Avro schema version, a Debezium schema change, a YDB
`ADD/DROP COLUMN`). The lake keeps every version, with the time it took effect, and never
rewrites a file to follow one: old files are projected onto the current schema when read.

* An added column reads as null in rows written before it existed.
* A removed column stays in the table: `AS OF` a time before the removal shows its values;
  rows written after the removal hold null. A keyed table's rows written before keep their
  values (a key's latest version is read whole). An unkeyed table shows the column null in
  every row read at a time after the removal: it matches a row's retraction on the columns
  live at the time read, since a retraction written after the removal cannot name the removed
  value (see `sql.py`), so a row's removed value is not known to be its own any more.
* Widening a type is accepted: integral types to wider integral types, float to double.
  Narrower input than the table's type is cast up.
* A column name that is not an identifier (`[A-Za-z_][A-Za-z0-9_]*`, nested names too) is a
  `SchemaError`.
* Anything else (a narrowing, a change of kind such as int to string, a change inside a nested
  type, a key column removed) is a `SchemaError` raised before anything is written, so the
  rejected commit loses nothing and the table stays at its last commit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from changelake.errors import SchemaError
from changelake.lake.identifier import check_name
from changelake.lake.layout import SchemaVersion
from changelake.spark_arrow import WIDENINGS

META_COLUMNS = ("_time", "_diff", "_bucket")


def parse_struct(text: str) -> StructType:
    return StructType.fromJson(json.loads(text))


def struct_json(struct: StructType) -> str:
    """Canonical JSON: every field nullable (a lake column can always be null in some
    version), so two schemas that differ only in nullability are one schema."""
    fields = [StructField(f.name, f.dataType, True) for f in struct.fields]
    return StructType(fields).json()


def check_column_names(dt: DataType, table: str, prefix: str = "") -> None:
    """Every column name, nested ones included, an identifier (see `identifier.py`): names
    reach SQL text and Parquet schemas. A SchemaError naming the first that is not."""
    if isinstance(dt, StructType):
        for f in dt.fields:
            what = f"table {table}: column" + (f" in {prefix[:-1]}" if prefix else "")
            check_name(f.name, what, SchemaError)
            check_column_names(f.dataType, table, f"{prefix}{f.name}.")
    elif isinstance(dt, ArrayType):
        check_column_names(dt.elementType, table, prefix)
    elif isinstance(dt, MapType):
        check_column_names(dt.valueType, table, prefix)


def wider(old: DataType, new: DataType, column: str, table: str) -> DataType:
    """The type that holds both, or a SchemaError naming the column and both types."""
    if old == new:
        return old
    pair = (old.typeName(), new.typeName())
    if pair in WIDENINGS:
        return new
    if (pair[1], pair[0]) in WIDENINGS:
        return old
    raise SchemaError(
        f"table {table}: column {column!r} changes type from {old.simpleString()} to "
        f"{new.simpleString()}; only widening (int to long, float to double) is accepted, "
        "nothing was written"
    )


def logical_schema(versions: Sequence[SchemaVersion]) -> StructType:
    """Every column any version had, in order of first appearance, at its widest type."""
    order: list[str] = []
    types: dict[str, DataType] = {}
    for version in versions:
        for f in parse_struct(version.struct).fields:
            if f.name not in types:
                order.append(f.name)
                types[f.name] = f.dataType
            else:
                types[f.name] = wider(types[f.name], f.dataType, f.name, "?")
    return StructType([StructField(n, types[n], True) for n in order])


def live_columns(versions: Sequence[SchemaVersion], at: int | None = None) -> list[str]:
    """The source's columns at time `at` (None: now)."""
    chosen = versions[0]
    for version in versions:
        if at is None or version.from_time <= at:
            chosen = version
    return [f.name for f in parse_struct(chosen.struct).fields]


@dataclass(frozen=True, slots=True)
class Evolution:
    """What a commit's schema does to the table: the versions after it, and the physical
    schema to write the commit's files with (incoming columns, at the table's types)."""

    versions: tuple[SchemaVersion, ...]
    write_struct: StructType
    changed: bool


def evolve(
    versions: Sequence[SchemaVersion],
    incoming: StructType,
    at: int,
    *,
    key: Sequence[str],
    table: str,
) -> Evolution:
    """Check `incoming` against the table and say how the table's schema changes at `at`."""
    check_column_names(incoming, table)
    names = [f.name for f in incoming.fields]
    for reserved in META_COLUMNS:
        if reserved in names:
            raise SchemaError(f"table {table}: column name {reserved!r} is reserved")
    lowered = [n.lower() for n in names]
    if len(set(lowered)) != len(lowered):
        raise SchemaError(f"table {table}: column names differ only in case: {names}")
    missing_key = [k for k in key if k not in names]
    if missing_key:
        raise SchemaError(
            f"table {table}: key column(s) {missing_key} are missing from the input "
            f"(columns: {names}); nothing was written"
        )
    logical = logical_schema(versions) if versions else StructType([])
    known = {f.name: f.dataType for f in logical.fields}
    known_lower = {n.lower(): n for n in known}
    fields: list[StructField] = []
    for f in incoming.fields:
        if f.name not in known and f.name.lower() in known_lower:
            raise SchemaError(
                f"table {table}: column {f.name!r} differs only in case from existing column "
                f"{known_lower[f.name.lower()]!r}; nothing was written"
            )
        target = wider(known[f.name], f.dataType, f.name, table) if f.name in known \
            else f.dataType
        fields.append(StructField(f.name, target, True))
    write_struct = StructType(fields)
    new_version = SchemaVersion(at, struct_json(StructType(
        [StructField(f.name, f.dataType, True) for f in incoming.fields]
    )))
    if versions:
        last = versions[-1]
        latest = parse_struct(last.struct)
        same = [f.name for f in latest.fields] == names and all(
            wider(known[f.name], f.dataType, f.name, table) == known[f.name]
            for f in incoming.fields
        )
        if same:
            return Evolution(tuple(versions), write_struct, False)
        if last.from_time == at:  # two changes at one time: the later one stands
            return Evolution((*versions[:-1], new_version), write_struct, True)
        if last.from_time > at:
            raise SchemaError(
                f"table {table}: schema change at time {at} is older than the change at "
                f"{last.from_time}"
            )
        return Evolution((*versions, new_version), write_struct, True)
    return Evolution((new_version,), write_struct, True)
