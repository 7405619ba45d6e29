"""Debezium's temporal types on Spark give, value for value, the text `decode_value` gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from changelake.formats.debezium import decode_value
from changelake.spark.changefeed.temporal import (
    FIRST_DAY,
    LAST_DAY,
    date_text,
    time_text,
    timestamp_text,
)

pytestmark = pytest.mark.spark

LONG = st.integers(-(2**63), 2**63 - 1)
EDGES = [0, -1, 1, 999, -999, 1000, 86_399_999, 86_400_000, 9223372036825200000,
         -9223372036832400000, 9223372036825200, -9223372036832400, 2**63 - 1, -(2**63),
         FIRST_DAY, LAST_DAY, FIRST_DAY * 86_400_000, LAST_DAY * 86_400_000_000 + 86_399_999_999]
#: (Connect schema name, Spark expression)
KINDS = [
    ("io.debezium.time.Date", date_text),
    ("io.debezium.time.Time", lambda c: time_text(c, 1000)),
    ("io.debezium.time.MicroTime", lambda c: time_text(c, 1_000_000)),
    ("io.debezium.time.NanoTime", lambda c: time_text(c, 1_000_000_000)),
    ("io.debezium.time.Timestamp", lambda c: timestamp_text(c, 1000)),
    ("io.debezium.time.MicroTimestamp", lambda c: timestamp_text(c, 1_000_000)),
    ("io.debezium.time.NanoTimestamp", lambda c: timestamp_text(c, 1_000_000_000)),
]


def python(value: int, name: str) -> str | None:
    try:
        return decode_value(value, {"type": "int64", "name": name})
    except ValueError:
        return None  # out of range: the Spark expression must refuse it too


def check(spark: Any, values: list[int]) -> None:
    frame = spark.createDataFrame([(v,) for v in values], "v long")
    for name, expression in KINDS:
        ok = [v for v in values if python(v, name) is not None]
        got = frame.where(F.col("v").isin(ok)).select("v", expression(F.col("v")).alias("t"))
        assert {r["v"]: r["t"] for r in got.collect()} == {v: python(v, name) for v in ok}, name
        for bad in sorted(set(values) - set(ok))[:2]:
            with pytest.raises(Exception, match="out of range"):
                frame.where(F.col("v") == bad).select(expression(F.col("v"))).collect()


def test_edges(spark: Any) -> None:
    check(spark, EDGES)


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(LONG, st.integers(-10**12, 10**12),
                                 st.integers(FIRST_DAY * 2, LAST_DAY * 2),
                                 st.integers(-(10**17), 10**17)), min_size=20, max_size=60))
def test_generated_values(spark: Any, values: list[int]) -> None:
    check(spark, values)


def test_null_stays_null(spark: Any) -> None:
    frame = spark.createDataFrame([(None,)], "v long")
    row = frame.select(*[e(F.col("v")).alias(n) for n, e in KINDS]).first()
    assert all(row[n] is None for n, _ in KINDS)
