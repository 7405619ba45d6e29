"""Timestamps out of the JVM as the instants they are, whatever the driver's time zone.

PySpark gives a `timestamp` to Python as a naive datetime in the driver's local time
(`datetime.fromtimestamp`), which a reader elsewhere cannot place. Worse, Python cannot
make one for an instant near either end of the calendar in a zone east or west of UTC, nor
take one near the start back to UTC: `0001-01-01T00:00:00Z` is in year 0 in New York, and a
`snapshot` of it failed with "year 0 is out of range", in any zone.

So where rows come to the driver (`snapshot`, `changes`), every timestamp in them, at any
depth (arrays, structs, maps), leaves the JVM as its microseconds since the epoch
(`micros_sql`, `unix_micros`), and the driver makes the UTC instant of those (`instants`):
exact for every instant Spark holds, in any zone, without asking the local time zone
anything. A timestamp without a time zone (`timestamp_ntz`) is left to PySpark, which makes
its wall-clock time without one.

Decimals are mended on the way too: PySpark's rows carry a decimal in a BigDecimal's
engineering notation, so -0.0000000001 of a `decimal(20, 10)` arrives as `Decimal('-1.00E-10')`
(scale 12), whose text is not the one Arrow (`snapshot --engine arrow`) or `decode` gives. The
converter sets each decimal at its type's scale again: the same value, the same text. And
a `float` (32-bit) reaches Python widened to a double, whose text (`1.100000023841858`) is the
float32's binary value, not the number written (`1.1`): the converter makes it the double
of the float32's shortest text (`values.float32_value`), as `show()`, Arrow's path and `decode`
print it; it is still the same float32.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql import types as T

from changelake.spark.expressions import quote
from changelake.values import float32_value

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def micros_sql(kind: T.DataType, expr: str, depth: int = 0) -> str | None:
    """`expr` (of type `kind`) with every timestamp in it as its microseconds since the
    epoch, in the JVM; None when it holds no timestamp. A struct keeps its fields' names."""
    if isinstance(kind, T.TimestampType):
        return f"unix_micros({expr})"
    if isinstance(kind, T.ArrayType):
        inner = micros_sql(kind.elementType, f"x{depth}", depth + 1)
        return None if inner is None else f"transform({expr}, x{depth} -> {inner})"
    if isinstance(kind, T.StructType):
        fields = [(f, micros_sql(f.dataType, f"{expr}.{quote(f.name)}", depth + 1))
                  for f in kind.fields]
        if all(inner is None for _, inner in fields):
            return None
        made = ", ".join(f"{inner or f'{expr}.{quote(f.name)}'} AS {quote(f.name)}"
                         for f, inner in fields)
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE struct({made}) END"
    if isinstance(kind, T.MapType):
        key = micros_sql(kind.keyType, f"k{depth}", depth + 1)
        value = micros_sql(kind.valueType, f"v{depth}", depth + 1)
        if key is not None:
            expr = f"transform_keys({expr}, (k{depth}, v{depth}) -> {key})"
        if value is not None:
            expr = f"transform_values({expr}, (k{depth}, v{depth}) -> {value})"
        return None if key is None and value is None else expr
    return None


def instants(kind: T.DataType) -> Callable[[Any], Any] | None:
    """A converter of a value of type `kind` as it reaches Python after `micros_sql` (with
    `Row.asDict(recursive=True)`: structs as dicts) that makes each timestamp's microseconds
    the UTC instant, each decimal one of its type's scale, and each float (32-bit) the double
    of its shortest text; None when `kind` holds none of them. Null stays null at every
    depth."""
    if isinstance(kind, T.TimestampType):
        return lambda micros: EPOCH + dt.timedelta(microseconds=micros)
    if isinstance(kind, T.FloatType):
        return float32_value
    if isinstance(kind, T.DecimalType):
        exponent = decimal.Decimal(1).scaleb(-kind.scale)
        exact = decimal.Context(prec=kind.precision)
        return lambda value: value.quantize(exponent, context=exact)
    if isinstance(kind, T.ArrayType):
        element = instants(kind.elementType)
        return None if element is None else (
            lambda v: [None if x is None else element(x) for x in v])
    if isinstance(kind, T.StructType):
        inner = [(f.name, c) for f in kind.fields if (c := instants(f.dataType)) is not None]
        if not inner:
            return None
        return lambda v: {**v, **{name: None if v[name] is None else convert(v[name])
                                  for name, convert in inner}}
    if isinstance(kind, T.MapType):
        key, value = instants(kind.keyType), instants(kind.valueType)
        if key is None and value is None:
            return None
        return lambda v: {(k if key is None else key(k)):
                          (x if value is None or x is None else value(x)) for k, x in v.items()}
    return None


def with_instants(frame: DataFrame
                  ) -> tuple[DataFrame, Callable[[dict[str, Any]], dict[str, Any]]]:
    """`frame` with its timestamps as microseconds (`micros_sql`), and the converter of its
    rows (`Row.asDict(recursive=True)`) that makes them the UTC instants again."""
    converters = {f.name: c for f in frame.schema.fields if (c := instants(f.dataType))}
    if not converters:
        return frame, lambda values: values
    fields = {f.name: f.dataType for f in frame.schema.fields}
    micros = {name: micros_sql(fields[name], quote(name)) for name in converters}
    selected = frame.selectExpr(*[
        f"{micros[name]} AS {quote(name)}" if micros.get(name) is not None else quote(name)
        for name in frame.columns])

    def convert(values: dict[str, Any]) -> dict[str, Any]:
        for name, converter in converters.items():
            if values[name] is not None:
                values[name] = converter(values[name])
        return values

    return selected, convert
