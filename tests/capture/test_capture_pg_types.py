"""Every PostgreSQL type capture supports, through the real server's pgoutput text: the Spark
type it becomes and the value a row holds; and the types and values it refuses, by name."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import psycopg2
import pytest
from pyspark.sql import types as T

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.types import (
    SESSION_SETTINGS,
    PgValueError,
    catalog,
    parse_array,
    resolve,
)
from changelake.errors import SchemaError

UTC = dt.UTC

# (column type, literal, Spark type, value read); each case is one column of one table.
CASES = [
    ("boolean", "true", T.BooleanType(), True),
    ("smallint", "-32768", T.ShortType(), -32768),
    ("integer", "2147483647", T.IntegerType(), 2147483647),
    ("bigint", "-9223372036854775808", T.LongType(), -9223372036854775808),
    ("numeric(12,4)", "-12345678.0001", T.DecimalType(12, 4), Decimal("-12345678.0001")),
    ("numeric(38,0)", "9" * 38, T.DecimalType(38, 0), Decimal("9" * 38)),
    ("numeric", "1e-30", T.StringType(), "0.000000000000000000000000000001"),
    ("numeric(50,2)", "1.5", T.StringType(), "1.50"),
    ("text", "E'multi\\nline ''quoted'' \\u00e9'", T.StringType(), "multi\nline 'quoted' é"),
    ("varchar(5)", "'abc'", T.StringType(), "abc"),
    ("char(4)", "'ab'", T.StringType(), "ab  "),
    ("real", "'NaN'", T.FloatType(), math.nan),
    ("real", "1.1", T.FloatType(), 1.1),
    ("double precision", "'-Infinity'", T.DoubleType(), -math.inf),
    ("double precision", "0.1", T.DoubleType(), 0.1),
    ("date", "'2024-02-29'", T.DateType(), dt.date(2024, 2, 29)),
    ("time", "'23:59:59.999999'", T.StringType(), "23:59:59.999999"),
    ("timestamp", "'2024-01-02 03:04:05.678'", T.TimestampNTZType(),
     dt.datetime(2024, 1, 2, 3, 4, 5, 678000)),
    ("timestamptz", "'2024-01-02 03:04:05+05:30'", T.TimestampType(),
     dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)),
    ("uuid", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", T.StringType(),
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("json", """'{"b": 1,  "a": [true]}'""", T.StringType(), '{"b": 1,  "a": [true]}'),
    ("jsonb", """'{"b": 1,  "a": [true]}'""", T.StringType(), '{"a": [true], "b": 1}'),
    ("bytea", "'\\x00ff10'::bytea", T.BinaryType(), b"\x00\xff\x10"),
    ("integer[]", "'{1,NULL,3}'", T.ArrayType(T.IntegerType()), (1, None, 3)),
    ("text[]", """ARRAY['a,b', 'NULL', NULL, 'q"uote\\', '']""", T.ArrayType(T.StringType()),
     ("a,b", "NULL", None, 'q"uote\\', "")),
    ("numeric(5,1)[]", "'{1.5,-2}'", T.ArrayType(T.DecimalType(5, 1)),
     (Decimal("1.5"), Decimal("-2.0"))),
    ("mood", "'happy'", T.StringType(), "happy"),
    ("mood[]", "'{sad,happy}'", T.ArrayType(T.StringType()), ("sad", "happy")),
    ("positive", "7", T.IntegerType(), 7),
    ("price", "12.5", T.DecimalType(10, 2), Decimal("12.50")),  # the domain's precision
    ("interval", "'1 day 2 hours'", T.StringType(), "P1DT2H"),
    ("integer", "NULL", T.IntegerType(), None),
]


def connect(dsn: str) -> psycopg2.extensions.connection:
    options = " ".join(f"-c {k.replace(' ', '')}={v.replace(' ', '')}"
                       for k, v in SESSION_SETTINGS.items())
    conn = psycopg2.connect(dsn, options=options)
    conn.autocommit = True
    return conn


def captured(dsn: str, ddl: list[str], columns: list[str], values: list[str]
             ) -> tuple[po.Relation, po.Row]:
    conn = connect(dsn)
    with conn.cursor() as c:
        for statement in ddl:
            c.execute(statement)
        c.execute("CREATE TABLE t (" + ", ".join(f"c{i} {kind}" for i, kind in
                                                 enumerate(columns)) + ")")
        c.execute("CREATE PUBLICATION pub FOR TABLE t")
        c.execute("SELECT pg_create_logical_replication_slot('slot', 'pgoutput')")
        c.execute("INSERT INTO t VALUES (" + ", ".join(values) + ")")
        c.execute("SELECT data FROM pg_logical_slot_get_binary_changes('slot', NULL, NULL, "
                  "'proto_version', '1', 'publication_names', 'pub')")
        decoder = po.Decoder()
        messages = [decoder.decode(bytes(d)) for d, in c.fetchall()]
    relation = next(m for m in messages if isinstance(m, po.Relation))
    insert = next(m for m in messages if isinstance(m, po.Insert))
    return relation, insert.new


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b and type(a) is type(b)


def test_every_supported_type(pg_dsn: str) -> None:
    relation, row = captured(
        pg_dsn, ["CREATE TYPE mood AS ENUM ('sad', 'happy')",
                 "CREATE DOMAIN positive AS integer CHECK (VALUE > 0)",
                 "CREATE DOMAIN price AS numeric(10,2)"],
        [c[0] for c in CASES], [c[1] for c in CASES])
    conn = connect(pg_dsn)
    lookup = catalog(conn.cursor())
    for column, text, (kind, literal, spark, expected) in zip(relation.columns, row, CASES,
                                                              strict=True):
        pg = resolve(column.type_oid, column.type_modifier, lookup)
        value = None if text is None else pg.read(text)
        assert pg.spark == spark, (kind, pg)
        assert same(value, expected), (kind, literal, text, value)


@pytest.mark.parametrize(("kind", "literal", "error"), [
    ("numeric(5,2)", "'NaN'", "numeric NaN has no Spark decimal counterpart"),
    ("date", "'infinity'", "date 'infinity' is outside what Spark holds"),
    ("date", "'0044-03-15 BC'", "date '0044-03-15 BC' is outside"),
    ("timestamp", "'-infinity'", "timestamp '-infinity' is outside"),
    ("integer[]", "'{{1,2},{3,4}}'", "multi-dimensional arrays are not supported"),
])
def test_a_value_spark_cannot_hold_is_refused_by_name(pg_dsn: str, kind: str, literal: str,
                                                      error: str) -> None:
    relation, (text,) = captured(pg_dsn, [], [kind], [literal])
    pg = resolve(relation.columns[0].type_oid, relation.columns[0].type_modifier,
                 catalog(connect(pg_dsn).cursor()))
    with pytest.raises(PgValueError, match=error):
        pg.read(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "name"), [
    ("point", "point"), ("pair", "pair"), ("int4range", "int4range"), ("money", "money")])
def test_an_unsupported_type_is_refused_by_name(pg_dsn: str, kind: str, name: str) -> None:
    conn = connect(pg_dsn)
    with conn.cursor() as c:
        c.execute("CREATE TYPE pair AS (a int, b int)")
        c.execute("SELECT %s::regtype::oid", (kind,))
        oid, = c.fetchone()
        with pytest.raises(SchemaError, match=f"type {name} is not supported"):
            resolve(oid, -1, catalog(c))


def test_array_text_quoting() -> None:
    assert parse_array("{}") == []
    assert parse_array('{"",NULL,"NULL","a\\\\b","c\\"d"}') == ["", None, "NULL", "a\\b", 'c"d']
    assert parse_array("[0:1]={x,y}") == ["x", "y"]
    with pytest.raises(PgValueError, match="not an array"):
        parse_array("1,2")
