"""Grouping rows that hold maps, without Spark's sort of a map.

Spark groups by a map, at any depth of a grouping expression, by sorting the map's entries
first (`MapSort`, which its optimizer inserts), and that sort turns a null value into its
type's zero: `{'y': null}` came out of a `GROUP BY` as `{'y': 0}` (Spark 4, checked with maps
read from Parquet, after a shuffle and from Python rows alike). A `decode`, an `ingest`, a
compaction and an unkeyed table's view all group whole rows, so each wrote or read such a
map wrong.

So where this project groups whole rows, each map in them is grouped as its entries sorted
by key (`array_sort(map_entries(m))`: an array of structs, which Spark groups exactly, null
values included; `grouping_sql`), and made the same map again in the aggregate's output
(`map_from_entries`; `restored_sql`). A row without a map is grouped as it is, at no cost.
Two maps with the same entries are one group, as Spark's own grouping means them to be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import types as T

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def has_map(kind: T.DataType) -> bool:
    if isinstance(kind, T.MapType):
        return True
    if isinstance(kind, T.ArrayType):
        return has_map(kind.elementType)
    if isinstance(kind, T.StructType):
        return any(has_map(f.dataType) for f in kind.fields)
    return False


def groupable(frame: DataFrame) -> DataFrame:
    """`frame` with every map in its columns as its sorted entries (`grouping_sql`): what to
    group whole rows of. A frame without a map is projected as it is."""
    from changelake.spark.expressions import quote

    return frame.selectExpr(*[f"{grouping_sql(f.dataType, quote(f.name))} AS {quote(f.name)}"
                              for f in frame.schema.fields])


def restored(frame: DataFrame, schema: T.StructType) -> DataFrame:
    """`frame`, grouped from `groupable` of a frame of `schema`, with its maps made again
    (`restored_sql`); a column `schema` lacks (an aggregate) stays as it is."""
    from changelake.spark.expressions import quote

    kinds = {f.name: f.dataType for f in schema.fields}
    return frame.selectExpr(*[
        f"{restored_sql(kinds[c], quote(c))} AS {quote(c)}" if c in kinds else quote(c)
        for c in frame.columns])


def grouping_sql(kind: T.DataType, expr: str, depth: int = 0) -> str:
    """`expr` (of type `kind`) with every map in it as its entries sorted by key: what to
    group by instead of `expr`. `expr` itself where it holds no map."""

    def entries(kind: T.MapType, expr: str, depth: int) -> str:
        if has_map(kind.valueType):
            value = grouping_sql(kind.valueType, f"v{depth}", depth + 1)
            expr = f"transform_values({expr}, (k{depth}, v{depth}) -> {value})"
        return f"array_sort(map_entries({expr}))"

    return _each_map(kind, expr, depth, entries)


def restored_sql(kind: T.DataType, expr: str, depth: int = 0) -> str:
    """The value of type `kind` again, from `expr`, its `grouping_sql` form."""

    def mapped(kind: T.MapType, expr: str, depth: int) -> str:
        if has_map(kind.valueType):
            value = restored_sql(kind.valueType, f"e{depth}.value", depth + 1)
            expr = f"transform({expr}, e{depth} -> struct(e{depth}.key AS key, {value} AS value))"
        return f"map_from_entries({expr})"

    return _each_map(kind, expr, depth, mapped)


def _each_map(kind: T.DataType, expr: str, depth: int,
              on_map: Callable[[T.MapType, str, int], str]) -> str:
    """`expr` with `on_map` applied to each map in it, through arrays and structs (a null
    struct stays null); `expr` itself where it holds no map."""
    from changelake.spark.expressions import quote

    if not has_map(kind):
        return expr
    if isinstance(kind, T.MapType):
        return on_map(kind, expr, depth)
    if isinstance(kind, T.ArrayType):
        inner = _each_map(kind.elementType, f"x{depth}", depth + 1, on_map)
        return f"transform({expr}, x{depth} -> {inner})"
    assert isinstance(kind, T.StructType)
    fields = ", ".join(
        f"{_each_map(f.dataType, f'{expr}.{quote(f.name)}', depth + 1, on_map)} "
        f"AS {quote(f.name)}" for f in kind.fields)
    return f"CASE WHEN {expr} IS NULL THEN NULL ELSE struct({fields}) END"
