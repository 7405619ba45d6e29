"""A few rows the driver holds, as a DataFrame that the JVM alone reads.

The steps put small tables of their own into their plans: the caller's file names
(`read._names`), one row per chunk of lines (`times.chunks_of`), one per file block
(`Lines.numbered`). `spark.createDataFrame(rows)` of classic PySpark makes such a table an RDD of
pickled Python rows, which every job that reads it unpickles in Python workers: a worker start
in a process that had none (every one-shot CLI command on the Spark path) and a Python task per
partition in every job after. Here the rows travel as one JSON text literal in the plan, read
by `from_json` against their schema (`FAILFAST`: a value that does not fit its column fails the
job, never turns into a null), so no job that reads them starts Python.

Where a value has no exact JSON spelling that Spark reads back as the same value (a float that
is not finite, a date, bytes, ...), the rows go to `spark.createDataFrame` as before: the result
is the same, only the way differs.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import functions as F
from pyspark.sql import types as T

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class _NoJson(Exception):
    """A value this module does not spell in JSON (the rows take `createDataFrame`)."""


def _json_value(value: Any, kind: T.DataType) -> Any:
    """`value` of Spark type `kind`, as orjson writes what `from_json` reads back exactly."""
    if value is None:
        return None
    if isinstance(kind, T.StructType):
        if isinstance(value, dict):
            value = tuple(value.get(f.name) for f in kind.fields)
        if len(value) != len(kind.fields):
            raise _NoJson
        return {f.name: _json_value(v, f.dataType)
                for f, v in zip(kind.fields, value, strict=True)}
    if isinstance(kind, T.ArrayType) and isinstance(value, list | tuple):
        return [_json_value(v, kind.elementType) for v in value]
    if isinstance(kind, T.BooleanType) and type(value) is bool:
        return value
    if isinstance(kind, T.StringType) and type(value) is str:
        return value
    if isinstance(kind, T.IntegralType) and type(value) is int:
        return value
    if isinstance(kind, T.DecimalType) and type(value) in (int, decimal.Decimal):
        number = decimal.Decimal(value)
        if not number.is_finite():
            raise _NoJson
        return orjson.Fragment(str(number).encode())  # every digit, as Spark reads it
    raise _NoJson


def driver_rows(spark: SparkSession, rows: Iterable[Sequence[Any] | Mapping[str, Any]],
                schema: str | T.StructType, *, max_bytes: int | None = None) -> DataFrame:
    """`rows` (tuples or Rows in `schema`'s field order, or dicts by field name) as a
    DataFrame of `schema` (a `StructType` or its DDL, `"a int, b string"`), read in the JVM
    (see the module docstring). Every column is nullable, as `from_json` reads it.
    `max_bytes` bounds the JSON text the plan carries: longer (rows of a caller's data, a
    large value among them), the rows take `createDataFrame`."""
    struct = schema if isinstance(schema, T.StructType) else T._parse_datatype_string(schema)
    assert isinstance(struct, T.StructType)
    listed = list(rows)
    try:
        encoded = orjson.dumps([_json_value(r, struct) for r in listed])
    except (_NoJson, TypeError, orjson.JSONEncodeError):
        return spark.createDataFrame(listed, struct)
    if not struct.fields or (max_bytes is not None and len(encoded) > max_bytes):
        # No struct of no fields to read; or too much text for a plan.
        return spark.createDataFrame(listed, struct)
    text = encoded.decode()
    parsed = F.from_json(F.lit(text), T.ArrayType(struct, containsNull=False),
                         {"mode": "FAILFAST"})
    return spark.range(0, 1, numPartitions=1).select(F.inline(parsed))  # one task, not one per core
