"""Step 2 for YDB: each changefeed JSON line into one item row, and each record into the event
row the keyed step converts (`keyed.convert`), read by the project's Java in the tasks
(`java_items`: `YdbLines.java`, `YdbLine.java`).

Held to `formats.ydb.YdbParser` (FORMAT = 'JSON'), the specification, for the columns whose
YDB types this path reads in the JVM (`COVERED`: Bool, the integer types, Float/Double, Utf8,
Uuid); a table with any other column type, with a key other than its primary key, or with two
column names that differ only in case (Spark resolves names without case), is `Unsupported`.

Java reads the records YDB writes (`YdbLine.java` lists them: the JSON records of every mode,
nulls, `"nan"` and `"inf"` floats, escapes) into the rows the parser's items give, and leaves
every other line: one the parser refuses, and the few it accepts that Java does not read
(DEBEZIUM_JSON, a null in a key, an OLD_IMAGE record, ...). A batch with a line Java leaves
goes to the Python path (`ydb_path.ydb_changes` raises `Unsupported`), which names a bad line
as `encode_changefeed` does; a lenient read asks the parser about those lines only
(`deferred_lines`, `pipeline.bad_lines`). `tests/spark/test_spark_changefeed_ydb_jvm.py` holds
every line Java reads to a fresh parser's item.

What a record becomes is `YdbParser._record`'s rule: `{"resolved": [step, txId]}` a barrier at
`rpos`; erase a delete, with before = key + oldImage; with newImage a write of key + newImage
(an UPDATE with oldImage, an UPSERT without); otherwise a write of key + the object's columns,
the others UNCHANGED (`update`) or null (`reset`). `ts` gives the position `pos` and the time
`step`.

Records without `ts` (no virtual timestamps) are placed by the encoder at the stream's current
time and ordered by arrival: covered only when no line of the batch has a `ts` or is a barrier,
where that is time 0 and the order of files and lines (`pos` = `[file_index, block, row]`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.formats.lines import MAX_LINE_BYTES
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import _base_type
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.keyed import (
    ColumnSpec,
    flipped_long,
    java_ready_schema,
    long_positions,
)
from changelake.spark.changefeed.read import flaw
from changelake.spark.changefeed.types import Decoder, spark_type
from changelake.spark.jvm import java_class

#: The integer types' ranges (Uint64 aside: beyond a long).
INTS = {f"Int{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)} | {
    f"Uint{b}": (0, (1 << b) - 1) for b in (8, 16, 32)} | {
    "Interval": (-(1 << 63), (1 << 63) - 1), "Interval64": (-(1 << 63), (1 << 63) - 1)}
#: The YDB types whose JSON values this path reads in the JVM.
COVERED = frozenset({"Bool", "Uint64", "Float", "Double", "Utf8", "Uuid", *INTS})
_NAME = re.compile(r"^[^'\\`]+$")


def ydb_columns(schema: TableSchema, keys: Sequence[str]) -> list[ColumnSpec]:
    """The table's columns with their Spark types (`types.spark_type`), or `Unsupported`."""
    if list(keys) != list(schema.primary_key):
        raise Unsupported("key columns other than the table's primary key")
    if len({n.lower() for n in schema.names}) != len(schema.names):
        raise Unsupported("column names that differ only in case")
    out = []
    for c in schema.columns:
        base = _base_type(c.type)
        if base not in COVERED:
            raise Unsupported(f"column {c.name} of YDB type {c.type}")
        if not _NAME.match(c.name):
            raise Unsupported(f"column name {c.name!r}")
        kind = spark_type(c.type)
        out.append(ColumnSpec(c.name, kind, kind, Decoder(), Decoder()))
    return out


#: The YDB integer types as wide as a long: a value Java reads as a long is in their range.
_LONG_RANGED = frozenset({"Int64", "Interval", "Interval64"})


#: The JSON kind each covered YDB type is read from, as `YdbLine.java` names them.
_JAVA_KINDS = {"Bool": "bool", "Uint64": "uint", "Float": "number", "Double": "number",
               "Utf8": "string", "Uuid": "string"} | {t: "int" for t in INTS}


def java_table(schema: TableSchema, columns: Sequence[ColumnSpec]) -> str:
    """The table as the Java readers take it (`YdbLine.Table`): per column in table order its
    name, Spark type, JSON kind, key index (-1: not a key), and its YDB type's range where
    that is narrower than a long (else nulls)."""
    typed = {c.name: c.out_type for c in columns}
    keys = list(schema.primary_key)

    def entry(name: str, base: str) -> list[Any]:
        low, high = INTS.get(base, (None, None)) if base not in _LONG_RANGED else (None, None)
        return [name, typed[name], _JAVA_KINDS[base], keys.index(name) if name in keys else -1,
                low, high]

    return json.dumps([entry(c.name, _base_type(c.type) or "") for c in schema.columns],
                      ensure_ascii=False)


JVM_LINES_CLASS = "changelake.jvm.YdbLines"

#: The counts among `_facts` of `java_items`: one task's.
TASK_COUNTS = ("flawed", "deferred", "timed", "untimed", "barriers")

#: `_facts` of `java_items`: one task's counts, then what it found of the barrier rule within
#: its blocks (`YdbLines.Blocks`): whether their rows were out of order, and each block's
#: highest barrier.
TASK_FACTS = T.StructType([
    *[T.StructField(n, T.LongType()) for n in TASK_COUNTS],
    T.StructField("disorder", T.BooleanType()),
    T.StructField("blocks", T.ArrayType(T.StructType([
        T.StructField("file_index", T.IntegerType()), T.StructField("block", T.LongType()),
        T.StructField("high", T.ArrayType(T.DecimalType(20, 0)))])))])


def item_schema(schema: TableSchema, columns: Sequence[ColumnSpec]) -> T.StructType:
    """The rows' columns (before `keyed.java_ready_schema` makes the Uint64 keys and the
    positions longs): file, file_index, block, row, kind ("resolved", "change", or "left"
    for a line Java leaves), problem (null), rpos (a barrier's position), has_ts, pos, time,
    the key columns k0.. (in key order), then for changes the event columns `keyed.convert`
    reads: is_delete, rank, op, a (the after image), ua (per column: whether `update` leaves
    it unchanged), b (the before image), ub. The columns `YdbLines` sets on every row (a
    line's place, and what it sets on a line it leaves too) are not nullable."""
    typed = {c.name: T._parse_datatype_string(c.out_type) for c in columns}
    pair = T.ArrayType(T.DecimalType(20, 0))

    def struct(kind: T.DataType | None) -> T.StructType:
        return T.StructType([T.StructField(c.name, kind or typed[c.name], kind is None)
                             for c in columns])

    always = {"block", "row", "kind", "has_ts", "is_delete", "rank", "op", "ua", "ub"}
    head = [("file", T.StringType()), ("file_index", T.IntegerType()), ("block", T.LongType()),
            ("row", T.LongType()), ("kind", T.StringType()), ("problem", T.StringType()),
            ("rpos", pair), ("has_ts", T.BooleanType()), ("pos", pair), ("time", T.LongType())]
    keys = [(f"k{i}", typed[k]) for i, k in enumerate(schema.primary_key)]
    rest = [("is_delete", T.BooleanType()), ("rank", T.IntegerType()), ("op", T.StringType()),
            ("a", struct(None)), ("ua", struct(T.BooleanType())), ("b", struct(None)),
            ("ub", struct(T.BooleanType()))]
    return T.StructType([T.StructField(n, t, n not in always) for n, t in head + keys + rest])


def java_items(lines: DataFrame, schema: TableSchema, columns: Sequence[ColumnSpec]
               ) -> DataFrame:
    """The rows of `item_schema`, as Java reads `lines` (`Lines.bounded`: every line `flaw`
    can mark) in the tasks (`YdbLines.java`), but for `file`, null (the caller names a file by
    its `file_index`, `Lines.files`), with the Uint64 key columns and the positions as the Java
    conversion reads them (`keyed.java_ready_schema`: made as longs here, they are never
    decimals on their way to it), `_below` (see `YdbLines.java`), `_deferred`, true on the
    lines it leaves (a flaw, a line the parser refuses, one Java does not read: of kind "left",
    their other columns meaningless), and `_facts` (`TASK_FACTS`, on each task's last line).
    A caller takes the rows only where Java read every line (`ydb_path.ydb_changes`)."""
    spark = lines.sparkSession
    reader = java_class(spark, JVM_LINES_CLASS)
    ready = java_ready_schema(item_schema(schema, columns), len(schema.primary_key))
    out = T.StructType([*ready.fields, T.StructField("_below", T.BooleanType()),
                        T.StructField("_deferred", T.BooleanType()),
                        T.StructField("_facts", TASK_FACTS)])
    places = lines.select(F.lit(None).cast("string").alias("file"),
                          F.col("file_index").cast("int"), F.col("block").cast("bigint"),
                          F.col("row").cast("bigint"), "value")
    return DataFrame(reader.read(places._jdf, out.json(), java_table(schema, columns),
                                 MAX_LINE_BYTES), spark)


def deferred_lines(lines: DataFrame, schema: TableSchema, columns: Sequence[ColumnSpec]
                   ) -> DataFrame:
    """`lines` (`Lines.frame`: file, file_index, row, value, ...) where Java leaves the line
    (`java_items`' `_deferred`) and it has no `flaw`: the lines only the Python path reads."""
    unflawed = lines.where(flaw(F.col("value")).isNull())
    left = java_items(unflawed.select("file_index", "block", "row", "value"), schema, columns) \
        .where("_deferred").select("file_index", "row")
    return unflawed.join(left, ["file_index", "row"], "left_semi")


def untimed_positions(events: DataFrame) -> DataFrame:
    """Records without `ts` in a batch that has none (see the module docstring): time 0, in
    the order of files and lines; the positions in the form `events` has them (Uint64s, or
    as the Java conversion reads them: `keyed.java_ready_schema`)."""
    places = [F.col(c).cast("decimal(20,0)") for c in ("file_index", "block", "row")]
    if long_positions(events):
        places = [flipped_long(F.col(c).cast("bigint")) for c in ("file_index", "block", "row")]
    return events.withColumn("time", F.lit(0).cast("bigint")).withColumn("pos", F.array(*places))


def with_content(events: DataFrame) -> DataFrame:
    """The row hash `keyed.convert`'s `checks` compare."""
    return events.withColumn("content", F.xxhash64("a", "ua"))
