"""A captured table's rows as Materialize CDC Avro: the `data` record's fields, each value as
fastavro writes it, and each value read back as `types` reads it from PostgreSQL.

Why a mapping of its own: `--out` logs are Avro object container files, self-describing (each
holds its schema), so `changelake decode` and `ingest --from materialize` read them with no
schema file, and any Avro reader (Materialize's included) sees the types the database has,
not text. Every column is nullable (`["null", T]`), and each Spark type of `types` has one
Avro type:

* boolean, int (smallint and integer), long, float, double, string, bytes as themselves;
* `DecimalType(p, s)` as `bytes` with logical type `decimal` (precision and scale kept);
* `DateType` as `int` / `date`, `TimestampType` (timestamptz, UTC) as `long` /
  `timestamp-micros`, `TimestampNTZType` (timestamp) as `long` / `local-timestamp-micros`;
* `ArrayType` as an array of nullable elements; `MapType` with string keys as a map of
  nullable values; `StructType` as a record of nullable fields (named for where it is: a
  name of its own), whose field names must be Avro names. (No captured column has a map or
  a struct; `lake/changes.py` writes a table's, which a Materialize CDC log with nested
  records or maps made.)

Reading back (`from_plain`) starts from the plain form the protocol layer hands out (logical
types as their ISO or decimal text, bytes as code points 0-255, see `formats.avro_values`),
so that a row read from the log equals the row the stream made (the capture's state for
deletes, updates without before-images and unchanged TOAST values comes from the log).

Column names must be Avro names (`[A-Za-z_][A-Za-z0-9_]*`): any other is refused naming the
table and column, before anything is written.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import re
from typing import Any

from pyspark.sql import types as T

from changelake.capture.postgres.rows import Table, Values
from changelake.errors import SchemaError
from changelake.formats.materialize import CdcSchema
from changelake.values import NAN

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_PRIMITIVE: dict[type, str] = {
    T.BooleanType: "boolean", T.ShortType: "int", T.IntegerType: "int", T.LongType: "long",
    T.FloatType: "float", T.DoubleType: "double", T.StringType: "string",
    T.BinaryType: "bytes",
}


def avro_type(kind: T.DataType, where: str) -> Any:
    """The (non-null) Avro type of a column of Spark type `kind`."""
    if type(kind) in _PRIMITIVE:
        return _PRIMITIVE[type(kind)]
    if isinstance(kind, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": kind.precision,
                "scale": kind.scale}
    if isinstance(kind, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(kind, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(kind, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(kind, T.ArrayType):
        return {"type": "array", "items": ["null", avro_type(kind.elementType, where)]}
    if isinstance(kind, T.MapType) and isinstance(kind.keyType, T.StringType):
        return {"type": "map", "values": ["null", avro_type(kind.valueType, where)]}
    if isinstance(kind, T.StructType):
        # A record type needs a name no other type in the schema has: one from where it is.
        name = "r" + hashlib.sha256(where.encode()).hexdigest()[:16]
        return {"type": "record", "name": name,
                "fields": [{"name": _avro_name(f.name, f"{where}, field {f.name}"),
                            "type": ["null", avro_type(f.dataType, f"{where}.{f.name}")]}
                           for f in kind.fields]}
    raise SchemaError(f"{where}: Spark type {kind.simpleString()} has no Avro type")


def _avro_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise SchemaError(f"{where}: not an Avro field name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def schema_for(table: Table) -> CdcSchema:
    """The Materialize CDC schema of the table's log."""
    fields = []
    for column, kind in zip(table.columns, table.types, strict=True):
        where = f"table {table.qualified}, column {column}"
        if not _NAME.match(column):
            raise SchemaError(f"{where}: not an Avro field name ([A-Za-z_][A-Za-z0-9_]*), so "
                              "it cannot be written to a Materialize CDC log (rename it, or "
                              "capture into a lake)")
        fields.append({"name": column, "type": ["null", avro_type(kind.spark, where)]})
    return CdcSchema.for_fields(fields)


def to_python(row: Values, columns: tuple[str, ...]) -> dict[str, Any]:
    """A typed row as the `data` record fastavro writes (arrays as lists)."""
    return {c: (_listed(v) if type(v) is tuple else v)
            for c, v in zip(columns, row, strict=True)}


def _listed(value: tuple[Any, ...]) -> list[Any]:
    return [_listed(v) if type(v) is tuple else v for v in value]


def from_plain(table: Table, data: Any) -> Values:
    """A row of the log (a `Record` in the plain form) as the stream types it."""
    return tuple(_typed(kind.spark, data.get(column))
                 for column, kind in zip(table.columns, table.types, strict=True))


def _typed(kind: T.DataType, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(kind, T.DecimalType):
        return decimal.Decimal(value)
    if isinstance(kind, T.DateType):
        return dt.date.fromisoformat(value)
    if isinstance(kind, T.TimestampType):
        return dt.datetime.fromisoformat(value).astimezone(dt.UTC)
    if isinstance(kind, T.TimestampNTZType):
        return dt.datetime.fromisoformat(value)
    if isinstance(kind, T.BinaryType):
        return value.encode("latin-1")
    if isinstance(kind, T.ArrayType):
        return tuple(_typed(kind.elementType, v) for v in value)
    if isinstance(kind, T.FloatType | T.DoubleType):
        return NAN if value != value else float(value)  # the one NaN rows hold
    return value
