"""`infer_json_schema` infers what `spark.read.json` infers from the same texts (its RDD of
Python strings being the way it replaced), without a Python call per text."""

from __future__ import annotations

import pytest

from changelake.spark.json_schema import infer_json_schema

pytestmark = pytest.mark.spark

TEXTS = [
    ['{"a": 1, "b": "x"}', '{"a": 2.5, "c": [1, 2]}', '{"d": {"e": null, "f": true}}'],
    ['{"id": 9223372036854775807}', '{"id": 92233720368547758070}', '{"n": null}'],
    ['{"s": "2026-11-27"}', '{"s": 1}', '{"A": 1, "b": []}'],
    ['not json', '{"a": 1}'],
    ['{"a": 1}', None],
]


@pytest.mark.parametrize("texts", TEXTS)
def test_the_schema_is_the_one_spark_read_json_infers(spark, texts) -> None:
    frame = spark.createDataFrame([(t,) for t in texts], "data string")
    expected = spark.read.json(frame.rdd.map(lambda row: row[0])).schema
    assert infer_json_schema(frame) == expected


def test_failfast_refuses_a_text_that_is_not_json(spark) -> None:
    frame = spark.createDataFrame([("{]",)], "value string")
    assert "_corrupt_record" in infer_json_schema(frame).fieldNames()
    with pytest.raises(Exception, match=r"(?i)malformed"):
        infer_json_schema(frame, failfast=True)
