"""`driver_rows`: a few driver rows as a DataFrame the JVM reads, the same rows that
`createDataFrame` gives, and no Python RDD under it where the values have a JSON spelling."""

from __future__ import annotations

import decimal
import math

import pytest
from pyspark.sql import types as T

from changelake.spark.driver_rows import driver_rows

pytestmark = pytest.mark.spark


def _python_rdd(frame) -> bool:
    """Whether the frame reads an RDD of Python rows (`createDataFrame`'s way)."""
    return "ExistingRDD" in frame._jdf.queryExecution().executedPlan().toString()


CASES = [
    ("file_index int, block bigint, chunk bigint, _earlier bigint, _windowed boolean",
     [(0, 0, 0, None, False), (1, 33554432, 2, 9_223_372_036_854_775_807, True)]),
    ("_uri string, file string, file_index int",
     [("file:/a b/ü\"x\\y\n", "a b/ü\"x\\y\n", 0), ("file:///c", "c", 1)]),
    ("p struct<step: decimal(20,0), tx: decimal(20,0)>, q array<bigint>",
     [((decimal.Decimal(2**64 - 1), decimal.Decimal(0)), [1, None, -(2**63)]), (None, []),
      ((decimal.Decimal(1), None), None)]),
    ("d decimal(10,3), n tinyint, s string", [(decimal.Decimal("-1234567.125"), -128, "")]),
    ("a int", []),
]


@pytest.mark.parametrize(("schema", "rows"), CASES)
def test_the_rows_are_those_create_dataframe_gives(spark, schema, rows) -> None:
    frame = driver_rows(spark, rows, schema)
    assert not _python_rdd(frame)
    expected = spark.createDataFrame(rows, schema)
    assert [f.dataType for f in frame.schema.fields] == \
        [f.dataType for f in expected.schema.fields]
    assert frame.columns == expected.columns
    assert frame.collect() == expected.collect() == [tuple(r) for r in rows]


def test_dicts_and_a_struct_type_are_taken(spark) -> None:
    schema = T.StructType([T.StructField("a", T.LongType()),
                           T.StructField("b", T.ArrayType(T.StringType()))])
    frame = driver_rows(spark, [{"b": ["x"], "a": 3}, {"a": None}], schema)
    assert [tuple(r) for r in frame.collect()] == [(3, ["x"]), (None, None)]


@pytest.mark.parametrize(("schema", "rows"), [
    ("x double", [(math.nan,), (1.5,)]),
    ("d date", [(__import__("datetime").date(2026, 11, 27),)]),
])
def test_values_without_a_json_spelling_take_create_dataframe(spark, schema, rows) -> None:
    frame = driver_rows(spark, rows, schema)
    assert _python_rdd(frame)
    assert repr(frame.collect()) == repr(spark.createDataFrame(rows, schema).collect())


def test_a_value_that_does_not_fit_its_column_fails_rather_than_turning_null(spark) -> None:
    with pytest.raises(Exception, match="MALFORMED_RECORD"):
        driver_rows(spark, [(2**40,)], "a int").collect()


def test_more_text_than_max_bytes_takes_create_dataframe(spark) -> None:
    """A caller's data (a capture's rows) may hold a large value: over `max_bytes` of JSON,
    the rows do not go into the plan."""
    rows = [(1, "x" * 1000), (2, "y")]
    assert not _python_rdd(driver_rows(spark, rows, "a bigint, s string", max_bytes=2000))
    frame = driver_rows(spark, rows, "a bigint, s string", max_bytes=1000)
    assert _python_rdd(frame)
    assert frame.collect() == spark.createDataFrame(rows, "a bigint, s string").collect()
