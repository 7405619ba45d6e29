"""Step 1, read: changefeed files into rows `(value, file, file_index, line)` on the executors.

The promise: every non-blank line of every file, once, with the file as the caller named it and
its 1-based line number counted as `convert.feed.read_lines` counts it (blank lines count, and
are then dropped: a line is blank when it is only whitespace, `bytes.strip()`'s set).

Nothing of the input goes through the driver. `spark.read.text` splits files into blocks that
the executors read in parallel; a block lies in one Spark partition, in which
`monotonically_increasing_id` is consecutive. So a line's number is the lines of the file's
earlier blocks plus its place in its block, and the only rows the driver sees are one per
block (first id, line count): a few per file, whatever the input's size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from changelake.errors import InputError

LINES_DDL = "value string, file string, file_index int, line long"


@dataclass(frozen=True)
class Lines:
    frame: DataFrame  # value, file, file_index, line: non-blank lines only
    files: tuple[str, ...]  # in the caller's order: `file_index` indexes this


def _local(uri: str) -> str:
    parsed = urlparse(uri)
    return os.path.abspath(unquote(parsed.path)) if parsed.scheme in ("", "file") else uri


def read_lines(spark: SparkSession, files: Sequence[str]) -> Lines:
    """The non-blank lines of `files` (already expanded, in the order the encoder reads them)."""
    if not files:
        raise InputError("no input files")
    index = {_local(str(f)) if "://" not in str(f) else str(f): i for i, f in enumerate(files)}
    raw = spark.read.text([str(f) for f in files]).select(
        "value", F.col("_metadata.file_path").alias("_uri"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_id"))
    blocks = raw.groupBy("_uri", "_block").agg(F.min("_id").alias("_first"),
                                               F.count(F.lit(1)).alias("_n")).collect()
    rows = []
    done: dict[str, int] = {}
    for b in sorted(blocks, key=lambda r: (r["_uri"], r["_block"])):
        key = _local(b["_uri"])
        if key not in index:
            raise InputError(f"Spark read a file that was not named: {b['_uri']}")
        before = done.get(key, 0)
        rows.append((b["_uri"], b["_block"], b["_first"], before, files[index[key]],
                     index[key]))
        done[key] = before + b["_n"]
    offsets = spark.createDataFrame(
        rows, "_uri string, _block long, _first long, _before long, file string, "
              "file_index int")
    frame = (raw.join(F.broadcast(offsets), ["_uri", "_block"])
             .select("value", "file", "file_index",
                     (F.col("_before") + F.col("_id") - F.col("_first") + 1).alias("line"))
             .where(~F.col("value").rlike(r"^\s*$")))
    return Lines(frame, tuple(str(f) for f in files))
