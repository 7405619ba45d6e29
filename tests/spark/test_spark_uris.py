"""The driver reads Spark's `file:` URIs back into paths, in both of Spark's spellings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from changelake.spark.uris import local_path

pytestmark = pytest.mark.spark

NAMES = ["plain.jsonl", "a b.jsonl", "a+b.jsonl", "100%.jsonl", "é ü.jsonl", "a%2Bb.jsonl",
         "x#y?.jsonl", "semi;colon=eq&amp.jsonl"]


def test_every_uri_spark_gives_reads_back_the_path_of_its_file(spark: Any,
                                                                tmp_path: Path) -> None:
    """Spark's own URIs of files with awkward names, on the lines (`_metadata.file_path`) and
    in its listing (`inputFiles`): each gives the path the file was written at."""
    for i, name in enumerate(NAMES):
        (tmp_path / name).write_text(f"{i}\n")
    text = spark.read.text(str(tmp_path))
    uris = text.select(F.col("value"), F.col("_metadata.file_path").alias("uri")).collect()
    assert len(uris) == len(NAMES)
    for row in uris:
        assert local_path(row["uri"]) == str(tmp_path / NAMES[int(row["value"])]), row["uri"]
    listed = text.inputFiles()
    assert sorted(map(local_path, listed)) == sorted(str(tmp_path / n) for n in NAMES)
    assert not set(listed) & {row["uri"] for row in uris}  # two spellings (`read._names`)
