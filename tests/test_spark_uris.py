"""The driver's and the executors' reading of Spark's `file:` URIs agree, on what Spark writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from changelake.spark.uris import local_path, local_path_column

pytestmark = pytest.mark.spark

NAMES = ["plain.jsonl", "a b.jsonl", "a+b.jsonl", "100%.jsonl", "é ü.jsonl", "a%2Bb.jsonl",
         "x#y?.jsonl", "semi;colon=eq&amp.jsonl"]


def test_both_rules_give_back_the_path_of_every_file_spark_reads(spark: Any,
                                                                 tmp_path: Path) -> None:
    """Spark's own URIs of files with awkward names (`_metadata.file_path`), read both ways:
    each gives the path the file was written at."""
    for i, name in enumerate(NAMES):
        (tmp_path / name).write_text(f"{i}\n")
    uris = spark.read.text(str(tmp_path)).select(
        F.col("value"), F.col("_metadata.file_path").alias("uri"),
        local_path_column(F.col("_metadata.file_path")).alias("path")).collect()
    assert len(uris) == len(NAMES)
    for row in uris:
        expected = str(tmp_path / NAMES[int(row["value"])])
        assert row["path"] == expected, row["uri"]
        assert local_path(row["uri"]) == expected, row["uri"]
