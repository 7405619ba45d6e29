"""`expressions.per_jvm`: column expressions built once per JVM and arguments, and the same
objects giving each DataFrame its own result."""

from __future__ import annotations

from typing import Any

import pytest

from changelake.spark import expressions
from changelake.spark.expressions import per_jvm


def test_built_once_per_arguments_and_again_for_another_jvm(monkeypatch: Any) -> None:
    calls: list[tuple[Any, ...]] = []

    @per_jvm
    def build(*args: Any) -> list[Any]:
        calls.append(args)
        return [object()]

    gateway = object()
    monkeypatch.setattr(expressions, "_gateway", lambda: gateway)
    first = build("a", 1)
    assert build("a", 1) is first and build("b", 1) is not first
    assert calls == [("a", 1), ("b", 1)]
    # Arguments that cannot be a key (a dict) are built anew each time, never shared.
    assert build({"x": 1}) is not build({"x": 1})
    assert len(calls) == 4
    # Another JVM: the objects of the first are not used there.
    other = object()
    monkeypatch.setattr(expressions, "_gateway", lambda: other)
    again = build("a", 1)
    assert again is not first and build("a", 1) is again
    expressions.forget()
    assert build("a", 1) is not again


@pytest.mark.spark
def test_one_built_expression_serves_every_dataframe(spark: Any) -> None:
    from pyspark.sql import functions as F

    @per_jvm
    def doubled(name: str) -> list[Any]:
        return ["id", (F.col(name) * 2).alias("twice")]

    small = spark.range(3).select("id", (F.col("id") + 10).alias("v"))
    large = spark.range(5).select("id", (F.col("id") - 1).alias("v"))
    assert [r.twice for r in small.select(*doubled("v")).orderBy("id").collect()] == [20, 22, 24]
    assert [r.twice for r in large.select(*doubled("v")).orderBy("id").collect()] == \
        [-2, 0, 2, 4, 6]
