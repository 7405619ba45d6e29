"""Step 1, read: changefeed files into rows on the executors, in the order the encoder reads.

The promise: every non-blank line of every file, once (a line is blank when it is only
whitespace, `bytes.strip()`'s set), with the file as the caller named it (`file`, and its place
in the caller's list, `file_index`) and its place in the file: `block` (the byte offset of the
file split it was read in) and `row` (increasing within a split). `(file_index, block, row)`
orders the lines exactly as `convert.feed.read_lines` reads them, file after file.

Nothing of the input goes through the driver: `spark.read.text` splits files into blocks that
the executors read in parallel, a block lies in one Spark partition, and in it
`monotonically_increasing_id` increases line by line. The file names are joined on from the
caller's list (a few rows, broadcast).

`numbered` adds 1-based line numbers counted as `read_lines` counts them (blank lines count):
the lines of the file's earlier blocks plus the place in the block. That takes one aggregate
row per block to the driver and one more pass over the input, so only the old path, which
names lines in its messages, asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from changelake.errors import InputError


@dataclass(frozen=True)
class Lines:
    spark: SparkSession
    raw: DataFrame  # every line, blank ones too: value, file, file_index, block, row
    files: tuple[str, ...]  # in the caller's order: `file_index` indexes this

    @property
    def frame(self) -> DataFrame:
        """The non-blank lines: value, file, file_index, block, row."""
        return self.raw.where(~F.col("value").rlike(r"^\s*$"))

    def numbered(self) -> DataFrame:
        """The non-blank lines with `line`, their 1-based number in their file."""
        blocks = self.raw.groupBy("file_index", "block").agg(
            F.min("row").alias("_first"), F.count(F.lit(1)).alias("_n")).collect()
        rows = []
        done: dict[int, int] = {}
        for b in sorted(blocks, key=lambda r: (r["file_index"], r["block"])):
            before = done.get(b["file_index"], 0)
            rows.append((b["file_index"], b["block"], b["_first"] - before))
            done[b["file_index"]] = before + b["_n"]
        shift = self.spark.createDataFrame(rows, "file_index int, block long, _shift long")
        return (self.frame.join(F.broadcast(shift), ["file_index", "block"])
                .withColumn("line", F.col("row") - F.col("_shift") + 1).drop("_shift"))


def read_lines(spark: SparkSession, files: Sequence[str]) -> Lines:
    """The lines of `files` (already expanded, in the order the encoder reads them)."""
    if not files:
        raise InputError("no input files")
    names = spark.createDataFrame(
        [(os.path.abspath(str(f)), str(f), i) for i, f in enumerate(files)],
        "_path string, file string, file_index int")
    # Each file once (Spark reads a path named twice twice); a file named twice is then joined
    # to both of its names, so its lines come twice, as the encoder reads them.
    raw = spark.read.text(list(dict.fromkeys(str(f) for f in files))).select(
        "value", F.url_decode(F.regexp_replace(F.col("_metadata.file_path"), "^file:(//)?", ""))
        .alias("_path"), F.col("_metadata.file_block_start").alias("block"),
        F.monotonically_increasing_id().alias("row"))
    frame = raw.join(F.broadcast(names), "_path").drop("_path")
    return Lines(spark, frame, tuple(str(f) for f in files))
