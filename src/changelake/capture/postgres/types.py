"""PostgreSQL column types: what Spark type each becomes, and how its pgoutput text is read.

pgoutput sends a value as the text of the type's output function (`capture` asks for text, not
binary, because text is stable across server versions). The text depends on settings of the
session that runs the output functions, the walsender's, so the capture connects with
`SESSION_SETTINGS`: ISO dates, UTC times, hexadecimal bytea, floats that round-trip.

Each `PgType` reads that text into the value a Spark row holds (`read`): `int`, `bool`,
`float` (NaN and the infinities included), `Decimal`, `str`, `bytes`, `date`, `datetime`
(`timestamp` without time zone as a naive value for `TimestampNTZType`, `timestamptz` in UTC
for `TimestampType`), or a tuple for an array (rows are hashable). The rules:

* `numeric(p, s)` with `p <= 38` is `DecimalType(p, s)`, its value kept exactly. A `numeric`
  without a precision, or wider than Spark's 38 digits, is its exact decimal text
  (`StringType`): Spark has no decimal that could hold every such value. `NaN` and the
  infinities of a numeric have no Spark decimal: reading one is an error naming the value.
* `time` and `timetz` are their ISO text (`StringType`): Spark has no time-of-day type in
  every version we support. `interval` is its ISO 8601 text.
* `json` and `jsonb` are their text, `uuid` its canonical text, enums their label.
* A date or timestamp Spark cannot hold (`infinity`, years before 1 or after 9999, `BC`) is an
  error naming the value, not a silent null.
* Arrays are `ArrayType` of their element (one dimension; a multi-dimensional array is an
  error), parsed from PostgreSQL's array text (`{1,NULL,"a,b"}`).
* A domain is its base type, with the domain's modifier (`numeric(10,2)`). Anything else
  (composite types, ranges, geometric types, money) is refused by `resolve` with the type's
  name, so a table is never captured half-typed.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from changelake.errors import SchemaError
from changelake.spark_arrow import SPARK_DECIMAL_DIGITS
from changelake.values import NONFINITE_TEXT

#: Set on the capture's connections so that every value's text has one known form.
SESSION_SETTINGS = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}


class PgValueError(ValueError):
    """A value whose text cannot be read as its column's type; the caller adds where."""


@dataclass(frozen=True, slots=True)
class PgType:
    name: str  # as PostgreSQL spells it, e.g. numeric(10,2), text[]
    spark: T.DataType
    read: Callable[[str], Any]


# -- readers of one value's text ---------------------------------------------------------------


def _bool(text: str) -> bool:
    if text in ("t", "f"):
        return text == "t"
    raise PgValueError(f"not a boolean: {text!r}")


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    """NaN is the one shared `values.NAN`, so that rows holding it compare and hash equal."""
    return NONFINITE_TEXT[text] if text in NONFINITE_TEXT else float(text)


def _decimal(text: str) -> decimal.Decimal:
    value = decimal.Decimal(text)
    if not value.is_finite():
        raise PgValueError(f"numeric {text} has no Spark decimal counterpart")
    return value


def _numeric_text(text: str) -> str:
    return text


def _in_spark_range(parse: Callable[[str], Any], kind: str) -> Callable[[str], Any]:
    """`parse`, with what Python's ISO reader refuses (infinity, BC, years past 9999) named
    as out of Spark's range."""
    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError:
            raise PgValueError(f"{kind} {text!r} is outside what Spark holds "
                               "(years 1-9999)") from None
    return read


_date = _in_spark_range(dt.date.fromisoformat, "date")
_timestamp = _in_spark_range(dt.datetime.fromisoformat, "timestamp")


def _timestamptz(text: str) -> dt.datetime:
    value = _timestamp(text)
    if value.tzinfo is None:
        raise PgValueError(f"timestamptz {text!r} has no offset")
    return value.astimezone(dt.UTC)


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise PgValueError("bytea is not in hex form (bytea_output = hex)")
    return bytes.fromhex(text[2:])


def _text(text: str) -> str:
    return text


def parse_array(text: str) -> list[str | None]:
    """The elements of a one-dimensional array's text, unquoted, NULL as None."""
    if text.startswith("["):  # explicit bounds, e.g. [0:1]={1,2}
        text = text[text.index("=") + 1:]
    if not (text.startswith("{") and text.endswith("}")):
        raise PgValueError(f"not an array: {text[:40]!r}")
    body, out, i = text[1:-1], [], 0
    if not body:
        return out
    while True:
        if i < len(body) and body[i] == "{":
            raise PgValueError("multi-dimensional arrays are not supported")
        if i < len(body) and body[i] == '"':
            i += 1
            chars = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i])
                i += 1
            out.append("".join(chars))
            i += 1
        else:
            end = body.find(",", i)
            end = len(body) if end < 0 else end
            raw = body[i:end]
            out.append(None if raw == "NULL" else raw)
            i = end
        if i >= len(body):
            return out
        if body[i] != ",":
            raise PgValueError(f"unexpected {body[i]!r} in array text")
        i += 1


def _array_of(read: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def read_array(text: str) -> tuple[Any, ...]:
        return tuple(None if e is None else read(e) for e in parse_array(text))
    return read_array


# -- the catalog -------------------------------------------------------------------------------

_BASE: dict[int, PgType] = {
    16: PgType("boolean", T.BooleanType(), _bool),
    17: PgType("bytea", T.BinaryType(), _bytea),
    18: PgType("char", T.StringType(), _text),
    19: PgType("name", T.StringType(), _text),
    20: PgType("bigint", T.LongType(), _int),
    21: PgType("smallint", T.ShortType(), _int),
    23: PgType("integer", T.IntegerType(), _int),
    25: PgType("text", T.StringType(), _text),
    26: PgType("oid", T.LongType(), _int),
    114: PgType("json", T.StringType(), _text),
    700: PgType("real", T.FloatType(), _float),
    701: PgType("double precision", T.DoubleType(), _float),
    1042: PgType("character", T.StringType(), _text),
    1043: PgType("character varying", T.StringType(), _text),
    1082: PgType("date", T.DateType(), _date),
    1083: PgType("time", T.StringType(), _text),
    1114: PgType("timestamp", T.TimestampNTZType(), _timestamp),
    1184: PgType("timestamptz", T.TimestampType(), _timestamptz),
    1186: PgType("interval", T.StringType(), _text),
    1266: PgType("timetz", T.StringType(), _text),
    2950: PgType("uuid", T.StringType(), _text),
    3802: PgType("jsonb", T.StringType(), _text),
}
NUMERIC = 1700

#: Array type OID -> element type OID, for the built-in element types above.
ARRAYS = {1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25,
          1028: 26, 199: 114, 1021: 700, 1022: 701, 1014: 1042, 1015: 1043, 1182: 1082,
          1183: 1083, 1115: 1114, 1185: 1184, 1187: 1186, 1270: 1266, 2951: 2950, 3807: 3802,
          1231: NUMERIC}


@dataclass(frozen=True, slots=True)
class CatalogType:
    """What `pg_type` says of a type that is not built in (asked once per type OID)."""

    name: str
    kind: str  # pg_type.typtype: b(ase), d(omain), e(num), c(omposite), r(ange), ...
    category: str  # pg_type.typcategory: A for arrays
    base: int  # a domain's base type OID, else 0
    element: int  # pg_type.typelem: an array's element type OID (or a fixed type's part)
    modifier: int = -1  # pg_type.typtypmod: a domain's modifier of its base (numeric(10,2))


Lookup = Callable[[int], CatalogType]


def numeric_type(modifier: int) -> PgType:
    if modifier < 4:
        return PgType("numeric", T.StringType(), _numeric_text)
    precision, scale = (modifier - 4) >> 16, (modifier - 4) & 0xFFFF
    if precision > SPARK_DECIMAL_DIGITS or scale > precision:
        return PgType(f"numeric({precision},{scale})", T.StringType(), _numeric_text)

    def read(text: str) -> decimal.Decimal:
        return _decimal(text)
    return PgType(f"numeric({precision},{scale})", T.DecimalType(precision, scale), read)


def resolve(oid: int, modifier: int, lookup: Lookup) -> PgType:
    """The type of a column: built in, a numeric with its precision, an array, an enum or a
    domain (through `lookup`, which reads `pg_type`). Unsupported types raise `SchemaError`."""
    if oid == NUMERIC:
        return numeric_type(modifier)
    if oid in _BASE:
        return _BASE[oid]
    element = ARRAYS.get(oid)
    info = None
    if element is None:
        info = lookup(oid)
        if info.kind == "d":  # a column of a domain has no modifier: the domain has it
            return resolve(info.base, modifier if modifier >= 0 else info.modifier, lookup)
        if info.kind == "e":
            return PgType(info.name, T.StringType(), _text)
        element = info.element if info.category == "A" and info.element else None
    if element is not None:
        inner = resolve(element, modifier, lookup)
        if isinstance(inner.spark, T.ArrayType):
            raise SchemaError(f"type {inner.name}[] (arrays of arrays) is not supported")
        return PgType(f"{inner.name}[]", T.ArrayType(inner.spark), _array_of(inner.read))
    name = info.name if info is not None else str(oid)
    raise SchemaError(f"type {name} is not supported (supported: the built-in scalar types, "
                      "numeric, arrays of them, enums and domains)")


def catalog(cursor: Any) -> Lookup:
    """A `Lookup` that reads `pg_type` through a DB-API cursor on the captured database,
    asking once per type."""
    known: dict[int, CatalogType] = {}

    def lookup(oid: int) -> CatalogType:
        if oid not in known:
            cursor.execute("SELECT format_type(oid, NULL), typtype, typcategory, typbasetype, "
                           "typelem, typtypmod FROM pg_type WHERE oid = %s", (oid,))
            row = cursor.fetchone()
            if row is None:
                raise SchemaError(f"type OID {oid} is not in pg_type")
            known[oid] = CatalogType(row[0], row[1], row[2], int(row[3]), int(row[4]),
                                     int(row[5]))
        return known[oid]
    return lookup


RELATION_OID = "(quote_ident(%s) || '.' || quote_ident(%s))::regclass"
"""SQL for a table's oid from its schema and its name (`relation_args`), each quoted: a cast
of the text `schema.name` reads it as SQL, where `"Foo"` is `foo` and `a.b` a name in another
database."""


def relation_args(qualified: str) -> tuple[str, str]:
    """`RELATION_OID`'s arguments for a table named `schema.table` (as the publication lists
    it: the table's own name may hold a dot, the schema's does not)."""
    schema, name = qualified.split(".", 1)
    return schema, name
