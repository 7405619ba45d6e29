"""Step 1, read: changefeed files into rows on the executors, in the order the encoder reads.

The promise: every non-blank line of every file, once, whatever the file's name (Spark's listing
would skip `.x` and `_x`, and take `*?[{\\` for a glob; a line is blank when it is only
whitespace, `bytes.strip()`'s set), with the file as the caller named it (`file`, and its place
in the caller's list, `file_index`) and its place in the file: `block` (the byte offset of the
file split it was read in) and `row` (increasing within a split). `(file_index, block, row)`
orders the lines exactly as `convert.feed.read_lines` reads them, file after file.

Nothing of the input goes through the driver: `spark.read.text` splits files into blocks that
the executors read in parallel, a block lies in one Spark partition, and in it
`monotonically_increasing_id` increases line by line. The file names are joined on from the
caller's list (a few rows, broadcast) by Spark's URI of the file, whose local path is read on
the driver (`uris.local_path`, `_names`); a line of a file that no name matches fails the job
that reads it rather than being dropped.

Lines end at `\n` only, as `formats.lines.numbered_lines` splits them (Hadoop's default would
also split at a lone `\r`), and a trailing `\r` is dropped, as the encoder's `rstrip` does, so
the two number the same lines.

`numbered` adds 1-based line numbers counted as `read_lines` counts them (blank lines count):
the lines of the file's earlier blocks plus the place in the block. That takes one aggregate
row per block to the driver and one more pass over the input, so only the Python path, which
names lines in its messages, asks for it.

Kafka records are lines too (`record_lines`): each topic-partition is one `file` (named as
`kafka.source.location` names it), read as one block, `row` is the record's offset (so `numbered`
gives the offset as the line: the caller names it an offset), and a record's value is one line
whatever it holds. Such files are independent streams (`per_file`): what a line's context is
(the current time of a snapshot row, `times.py`) comes from its own file, never from another
partition read before it, since Kafka keeps no order between partitions.

`check` holds the lines to the bounds every JSON-lines reader keeps (`formats.lines`): UTF-8
text, at most `MAX_LINE_BYTES` a line. One aggregate over the text finds the first line that
breaks one (in reading order); only then do two small jobs name its line and its bad byte. A
step that reads every line anyway can spare that pass: it reads `bounded` (the non-blank lines
and any line over the bound: no blank line is ever invalid UTF-8, `\\s` being ASCII), counts the
lines `flaw` marks in an aggregate of its own, and has `check` name the line only when there
is one (the Debezium and YDB paths: `debezium_path.py`, `ydb_path.py`). A
line over the bound is read whole on an executor before it is refused (the reader here cannot
skip it in chunks as `numbered_lines` does), so a line beyond the executor's memory fails the
job rather than being named.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from changelake.errors import ChangefeedError, InputError, Location
from changelake.formats.lines import MAX_LINE_BYTES, TOO_LONG, unreadable
from changelake.spark.checkpoint import stored
from changelake.spark.driver_rows import driver_rows
from changelake.spark.uris import FILE_SCHEME, local_path

_BLANK = r"^\s*$"


def _non_blank(value: Column) -> Column:
    """Not only whitespace. A line that opens an object is not blank, and is not decoded to a
    Java string for the regular expression (most lines are such)."""
    return value.startswith("{") | ~value.rlike(_BLANK)


def flaw(value: Column) -> Column:
    """1 for a line longer than `MAX_LINE_BYTES` (its newline counted, as `numbered_lines`
    counts it), else 2 for one that is not UTF-8, else null."""
    too_long = F.octet_length(value) >= MAX_LINE_BYTES
    return F.when(too_long, F.lit(1)).when(~F.is_valid_utf8(value), F.lit(2))


@dataclass(frozen=True)
class Lines:
    spark: SparkSession
    raw: DataFrame  # every line, blank ones too: value, file, file_index, block, row
    files: tuple[str, ...]  # in the caller's order: `file_index` indexes this
    per_file: bool = False  # each file is a stream of its own (Kafka partitions): see above

    @property
    def frame(self) -> DataFrame:
        """The non-blank lines: value, file, file_index, block, row."""
        return self.raw.where(_non_blank(F.col("value")))

    @property
    def bounded(self) -> DataFrame:
        """`frame`, and the blank lines over the bound: every line `flaw` can mark."""
        return self.raw.where(_non_blank(F.col("value"))
                              | (F.octet_length("value") >= MAX_LINE_BYTES))

    def numbered(self) -> DataFrame:
        """The non-blank lines with `line`, their 1-based number in their file (a record's
        offset)."""
        if self.per_file:
            return self.frame.withColumn("line", F.col("row"))
        blocks = self.raw.groupBy("file_index", "block").agg(
            F.min("row").alias("_first"), F.count(F.lit(1)).alias("_n")).collect()
        rows = []
        done: dict[int, int] = {}
        for b in sorted(blocks, key=lambda r: (r["file_index"], r["block"])):
            before = done.get(b["file_index"], 0)
            rows.append((b["file_index"], b["block"], b["_first"] - before))
            done[b["file_index"]] = before + b["_n"]
        shift = driver_rows(self.spark, rows, "file_index int, block long, _shift long")
        return (self.frame.join(F.broadcast(shift), ["file_index", "block"])
                .withColumn("line", F.col("row") - F.col("_shift") + 1).drop("_shift"))

    def line_number(self, file_index: int, block: int, row: int) -> int:
        """The 1-based number of one line in its file: the lines before it, plus one; a
        record's offset."""
        if self.per_file:
            return row
        before = (F.col("block") < block) | ((F.col("block") == block) & (F.col("row") < row))
        return self.raw.where((F.col("file_index") == file_index) & before).count() + 1

    def check(self) -> None:
        """Raise `ChangefeedError` naming file and line for the first line (in reading order)
        that is not UTF-8 or is longer than `MAX_LINE_BYTES` (its newline counted, as
        `numbered_lines` counts it)."""
        marked = flaw(F.col("value"))
        first = self.raw.where(marked.isNotNull()).agg(F.min(F.struct(
            "file_index", "block", "row", marked.alias("flaw")))).first()
        if first is None or first[0] is None:
            return
        at = first[0]
        where = Location(self.files[at["file_index"]],
                         self.line_number(at["file_index"], at["block"], at["row"]))
        if at["flaw"] == 1:
            raise ChangefeedError(TOO_LONG, where)
        raw = self.raw.where((F.col("file_index") == at["file_index"])
                             & (F.col("block") == at["block"]) & (F.col("row") == at["row"])) \
            .select(F.col("value").cast("binary")).first()[0]
        try:
            bytes(raw).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ChangefeedError(f"not UTF-8 text: {error.reason} at byte {error.start}",
                                  where) from None
        raise ChangefeedError("not UTF-8 text", where)  # Spark and Python disagree: say so


def _literal(path: str) -> str:
    """`path` as a Hadoop glob pattern that matches only itself. Spark globs the paths it
    reads, so `x*.jsonl` also read `xy.jsonl` and `q[1].jsonl` found no file, where the caller
    names one file. (Its internal `__globPaths__` option turns globbing off, but then reads
    every file once per path named.)"""
    return re.sub(r"([\\*?\[\]{}])", r"\\\1", path)


def _names(spark: SparkSession, listed: Sequence[str], files: Sequence[str]) -> DataFrame:
    """The caller's names of the files Spark listed (`listed`: their URIs), by the URI each
    line's `_metadata.file_path` gives: `_uri`, file, file_index. The URIs are read on the
    driver (`uris.local_path`), a few, rather than each line's on the executors. Spark spells
    a local file's URI `file:///p` in its listing and `file:/p` on the lines: both are here."""
    places: dict[str, list[tuple[str, int]]] = {}
    for i, f in enumerate(files):
        places.setdefault(os.path.abspath(str(f)), []).append((str(f), i))
    rows = [(scheme + re.sub(FILE_SCHEME, "", uri), name, i)
            for uri in dict.fromkeys(listed)
            for name, i in places.get(local_path(uri), ())
            for scheme in ("file:", "file://")]
    return driver_rows(spark, rows, "_uri string, file string, file_index int")


HIDDEN = ("_", ".")
"""How the names of the files Spark's file listing leaves out begin."""


def read_lines(spark: SparkSession, files: Sequence[str]) -> Lines:
    """The lines of `files` (already expanded, in the order the encoder reads them)."""
    if not files:
        raise InputError("no input files")
    for f in files:
        reason = unreadable(f)
        if reason is not None:  # the local encoder refuses it too (`formats.lines`)
            raise InputError(reason, Location(str(f)))
    # Each file once (Spark reads a path named twice twice, and `a/../a/f` and `a/f` are two
    # paths to it); a file named twice is then joined to both of its names, so its lines come
    # twice, as the encoder reads them.
        if Path(str(f)).name.startswith(HIDDEN):
            # Spark's listing skips such a file even when it is named itself, which would
            # lose its lines without a word (Spark 4.3's `ignoredPathSegmentRegex` reads it;
            # Delta Lake's newest release needs Spark 4.2, which has no such option).
            raise InputError(f"Spark skips a file whose name starts with {HIDDEN[0]!r} or "
                             f"{HIDDEN[1]!r}: rename it to read it here", Location(str(f)))
    # Spark takes each name for a glob pattern (`_literal`).
    text = spark.read.text([_literal(p) for p in dict.fromkeys(os.path.abspath(str(f))
                                                           for f in files)], lineSep="\n")
    raw = text.select(
        # Trimmed only where there is something to trim: TRIM copies every line it is given.
        F.expr("CASE WHEN endswith(value, '\\r') THEN TRIM(TRAILING '\\r' FROM value) "
               "ELSE value END").alias("value"),
        F.col("_metadata.file_path").alias("_uri"),
        F.col("_metadata.file_block_start").alias("block"),
        F.monotonically_increasing_id().alias("row"))
    # A line whose file matches no name would be dropped by an inner join without a word: the
    # join keeps it, and its `value` (which every step reads) fails the job, naming the file.
    unnamed = F.raise_error(F.concat(
        F.lit("read_lines: Spark read a file named by none of the inputs: "), F.col("_uri")))
    frame = raw.join(F.broadcast(_names(spark, text.inputFiles(), files)), "_uri", "left") \
        .select(F.when(F.col("file_index").isNull(), unnamed).otherwise(F.col("value"))
                .alias("value"), "file", "file_index", "block", "row")
    return Lines(spark, frame, tuple(str(f) for f in files))


def record_lines(spark: SparkSession, records: DataFrame,
                 partitions: Sequence[tuple[str, int]]) -> Lines:
    """Kafka `records` (the columns of Spark's `kafka` source, `kafka_source.RECORDS_SCHEMA`)
    of `partitions` (topic, partition), as lines (see the module docstring); tombstones (a null
    value) are no lines. Checkpointed: the steps read the lines several times, Kafka once."""
    from changelake.kafka.source import location

    files = [str(location(topic, partition, 0).file) for topic, partition in partitions]
    names = driver_rows(
        spark, [(topic, partition, files[i], i)
                for i, (topic, partition) in enumerate(partitions)],
        "topic string, partition int, file string, file_index int")
    raw = (records.where(F.col("value").isNotNull())
           .join(F.broadcast(names), ["topic", "partition"])
           .select(F.col("value").cast("string").alias("value"), "file", "file_index",
                   F.lit(0).cast("long").alias("block"), F.col("offset").alias("row")))
    return Lines(spark, stored(raw), tuple(files), per_file=True)
