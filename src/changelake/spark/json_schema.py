"""Spark's JSON schema inference over a column of JSON texts, run where the texts are.

`spark.read.json` of classic PySpark takes the texts as an RDD of Python strings: a DataFrame's
column gets there through `.rdd.map(...)`, one Python call per row in Python workers, before
the JVM infers anything. The JVM's own reader takes a `Dataset[String]`: the column as it is,
inferred on the executors, with the same rules and the same result.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def infer_json_schema(texts: DataFrame, *, failfast: bool = False) -> StructType:
    """The schema `spark.read.json` infers from `texts` (a DataFrame of one string column).
    With `failfast`, a text that is not JSON fails the job (Spark's `FAILFAST` mode) instead of
    adding Spark's `_corrupt_record` column (`PERMISSIVE`, its default)."""
    spark = texts.sparkSession
    jvm = spark.sparkContext._jvm
    assert jvm is not None and len(texts.columns) == 1
    dataset = getattr(texts._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
    reader = spark._jsparkSession.read()
    if failfast:
        reader = reader.option("mode", "FAILFAST")
    inferred = StructType.fromJson(json.loads(reader.json(dataset).schema().json()))
    assert isinstance(inferred, StructType)
    return inferred
