"""Step 2, parse: each Debezium line into one item row, by the project's Java line reader.

The promise: for every line it reads, the row holds what `formats.debezium.DebeziumParser`
(the specification) makes of the line, as columns (kind, op, time, transaction, position,
table, the images as JSON text); every other line it leaves (`_deferred`), and the caller
hands the batch to the Python path (`dispatch.py`), which reads it with that parser. The
reader is `spark/jvm/DebeziumLine.java` (what it reads and what it leaves are listed there);
`tests/spark/test_spark_changefeed_jvm.py` compares its rows with the parser's items on the format
samples, generated histories, each rule's edges and random mutations of connector lines.

`java_items` runs it over each task's lines (`JVM_LINES_CLASS`, `DebeziumLines.java`), into
Spark's internal rows; `java_items(udf=True)` is the same reading as a UDF (`JVM_LINE`) in a
plan of Spark's, which the tests hold the tasks' rows to, and `bad_lines` uses to find the
lines Java leaves. The tasks also gather what the later steps need to know of the batch
(`_facts`, `TASK_FACTS`) and the rows `times.chunks_of` would aggregate (`_chunk`).

Images stay JSON text here (`before_raw`, `after_raw`), read against the decided column types
next (`keyed.typed_images`). Each row also carries `flaw` (`read.flaw`: the line is over the
length bound or not UTF-8); a line with a flaw is never Java's.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.spark.changefeed.read import MAX_LINE_BYTES, flaw
from changelake.spark.expressions import per_jvm
from changelake.spark.jvm import java_class, register

#: Jackson's leniencies that Spark's JSON functions turn on by default (single quotes, NaN
#: and Infinity) or that an option could (comments, leading zeros, ...), all off: `from_json`
#: then refuses what orjson refuses.
STRICT = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false",
          "allowNumericLeadingZeros": "false", "allowUnquotedControlChars": "false",
          "allowBackslashEscapingAnyCharacter": "false", "allowComments": "false",
          "allowUnquotedFieldNames": "false"}
#: `STRICT`, and a value it refuses fails the job instead of reading as null.
FAILFAST = {"mode": "FAILFAST", **STRICT}
COLLECTIONS = "array<struct<data_collection: string, event_count: bigint>>"
#: `changelake.jvm.DebeziumLine` (`spark/jvm/DebeziumLine.java`): the item columns of a line
#: Java reads, or null for a line it leaves (to the Python path); it is given the line's bytes
#: (`value` cast to binary). What it reads and what it leaves are in that file.
JVM_LINE = "changelake_debezium_line"
JVM_LINE_CLASS = "changelake.jvm.DebeziumLine"
#: `changelake.jvm.DebeziumLines`: `DebeziumLine` over each task's lines, as `java_items`.
JVM_LINES_CLASS = "changelake.jvm.DebeziumLines"
#: `java_items`' `_chunk`: a row of `times.chunks_of`'s aggregate.
CHUNK = T.StructType([T.StructField("file_index", T.IntegerType()),
                      *(T.StructField(n, T.LongType())
                        for n in ("block", "chunk", "t", "last_wanted", "first_moving"))])
#: `java_items`' `_facts`: what the later steps need to know of one task's lines
#: (`debezium_path._merged_facts` merges the tasks'; `first`, the first change with an image,
#: as its place and its three fields), the lines Java left and the shapes.
TASK_FACTS = T.StructType([
    *(T.StructField(n, T.LongType()) for n in ("flawed", "changes", "untimed", "by_tx",
                                               "metadata", "schemaless", "_deferred",
                                               "truncates", "placeheld")),
    *(T.StructField(n, T.StringType()) for n in ("table", "other_table", "schema",
                                                 "other_schema")),
    T.StructField("high", T.LongType()), T.StructField("first_file_index", T.IntegerType()),
    T.StructField("first_block", T.LongType()), T.StructField("first_row", T.LongType()),
    *(T.StructField(n, T.StringType()) for n in ("first_after", "first_before",
                                                 "first_schema")),
    T.StructField("shapes", T.ArrayType(T.StringType()))])
_JVM_COLUMNS = ("schema", "kind", "op", "ptime", "tx_min", "tx", "tx_order", "end_count",
                "end_collections", "pos", "table", "snapshot", "before_raw", "after_raw")
_JVM_TYPES = ("string", "string", "string", "bigint", "boolean", "string", "bigint", "bigint",
              COLLECTIONS, "array<bigint>", "string", "boolean", "string", "string")
#: ... and last, `shape`: a change's images' field names and JSON kinds (`DebeziumLine.image`),
#: which `types.inferred_from_shapes` reads, as Spark's inference would read the images.
JVM_LINE_TYPE = ", ".join(f"`{n}` {t}" for n, t in zip(_JVM_COLUMNS, _JVM_TYPES, strict=True)) \
    + ", `shape` string"


def java_items(lines: DataFrame, *, udf: bool = False, chunk_bits: int | None = None
               ) -> DataFrame:
    """The item columns as Java reads the lines (`JVM_LINE`; `problem` is always null),
    `shape` (see `JVM_LINE_TYPE`), and `_deferred`, true on the lines Java leaves (their
    columns are then null): for a caller that takes it only where Java read every line
    (`debezium_path._parsed`).

    The rows come from Java's own pass over each task's lines (`JVM_LINES_CLASS`), in the
    layout of the UDF's plan (`_java_read`, `_java_columns`), whose schema it is given: the
    two are compared in `tests/spark/test_spark_changefeed_jvm.py`. `udf`: that plan instead.

    With `chunk_bits` (`times.CHUNK_BITS`, not with `udf`), also `_chunk`: on the last line of
    each chunk of lines that has a change, the row `times.chunks_of` aggregates for the chunk
    where no change takes its transaction's time (`DebeziumLines.read`), which the parse's job
    collects instead of a pass of its own; and `_facts` (`TASK_FACTS`), on each task's last
    line, which that job observes instead of aggregating every line."""
    spark = lines.sparkSession
    register(spark, JVM_LINE, JVM_LINE_CLASS, JVM_LINE_TYPE)
    planned = _java_read(lines).select(*_java_columns())
    if udf:
        return planned
    reader = java_class(spark, JVM_LINES_CLASS)
    places = lines.select("file", F.col("file_index").cast("int"), F.col("block").cast("bigint"),
                          F.col("row").cast("bigint"), "value")
    schema = T.StructType([*planned.schema.fields, T.StructField("_chunk", CHUNK),
                           T.StructField("_facts", TASK_FACTS)])
    read = DataFrame(reader.read(places._jdf, schema.json(), MAX_LINE_BYTES,
                                 -1 if chunk_bits is None else chunk_bits), spark)
    return read if chunk_bits is not None else read.drop("_chunk", "_facts")


@per_jvm
def _java_columns() -> list[Column | str]:
    j = F.col("_j")
    return ["file", "file_index", "block", "row", "flaw", j["schema"].alias("schema"),
            j["kind"].alias("kind"), F.lit(None).cast("string").alias("problem"),
            *((F.coalesce(j[name], F.lit(False)) if name == "snapshot" else j[name]).alias(name)
              for name in _JVM_COLUMNS[2:]),
            j["shape"].alias("shape"), j.isNull().alias("_deferred")]


def _java_read(lines: DataFrame) -> DataFrame:
    """The lines' places, `value`, `flaw`, and `_j`: Java's reading (`JVM_LINE`). A line with
    a flaw is never Java's: its text may not be what the bytes say."""
    lines = lines.select("file", "file_index", "block", "row", "value",
                         flaw(F.col("value")).alias("flaw"))
    read = F.call_function(JVM_LINE, F.when(F.col("flaw").isNull(),
                                            F.col("value").cast("binary")))
    return lines.select("*", read.alias("_j"))


def deferred_lines(lines: DataFrame) -> DataFrame:
    """`lines` (with `value`) where Java leaves the line (`JVM_LINE` gives null) and it has no
    `flaw` (as `_java_read` reads them): the lines only the Python path reads."""
    register(lines.sparkSession, JVM_LINE, JVM_LINE_CLASS, JVM_LINE_TYPE)
    unflawed = flaw(F.col("value")).isNull()
    read = F.call_function(JVM_LINE, F.when(unflawed, F.col("value").cast("binary")))
    return lines.where(unflawed & read.isNull())
