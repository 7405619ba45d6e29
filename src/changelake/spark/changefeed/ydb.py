"""Step 2 for YDB: each changefeed JSON line into one item row, and each record into the event
row the keyed step converts (`keyed.convert`).

Mirrors `formats.ydb.YdbParser` (FORMAT = 'JSON') for the columns whose YDB types this path
reads in the JVM (`COVERED`: Bool, the integer types, Float/Double, Utf8, Uuid); a table with
any other column type, with a key other than its primary key, or with two column names that
differ only in case (Spark resolves names without case), is `Unsupported`.

Each line takes one of two parses, chosen by one regular expression built from the table
schema (`_simple`), so that the expensive one is paid only by the lines that need it:

* *Typed* (the common case): one `from_json` against the table schema's types. `from_json`
  alone cannot read a line the Python way: it reads `1` into a string column as `"1"`, `1.0`
  and `"1"` into a decimal, ignores what follows the first value and names it does not know,
  and reads a column set to null as one that is absent. So it only reads the lines the
  expression proves simple: one JSON object, nothing after it, of YDB's shapes, every name a
  known one, every value of the JSON kind its column needs (a JSON string for Utf8/Uuid,
  `true`/`false` for Bool, an integer for the integer types, a number for Float/Double), no
  null in `update` (so a column `from_json` reads as null is one `update` leaves UNCHANGED),
  no escape but JSON's own and no surrogate escape, no byte-order mark or replacement
  character (orjson refuses what Spark would repair or skip), and shorter than the line limit.
  The shapes: `{"resolved": [step, txId]}`; or members `key` (an array of the key's values,
  no null), `update` (an object of non-key columns, no null), `reset`, `newImage`, `oldImage`
  (the same, null allowed; the images may be null), `erase` (`{}`) and `ts` (`[step, txId]`),
  in any order. A simple line can still be one the Python parser refuses (two bodies, a value
  beyond its type's range, a step beyond a long, an erase with a newImage, an OLD_IMAGE
  record): the typed parse names that in `problem` as the careful parse does.
  Java reads the lines that are plainly simple
  (`java_line_reader`, `YdbLine.java`: no escape anywhere, one JSON object of these shapes,
  every value of its column's kind and within what `from_json` reads it as) into the same
  struct in one pass, and the expression and `from_json` run only on the lines it leaves.
  And where Java reads every line of a batch without a problem, it reads them in the tasks
  into these rows itself (`java_items`, `YdbLines.java`), so that the batch takes none of the
  expressions: the caller keeps that only where no line was left (`ydb_path.ydb_changes`).
* *Careful* (`ydb_variant.py`): every other line is read as a VARIANT and the JSON kind of each
  of its values asked (`"nan"` and `"inf"` floats, nulls in `update`, DEBEZIUM_JSON, bad lines).

What a record becomes is `YdbParser._record`'s rule: `{"resolved": [step, txId]}` a barrier at
`rpos`; erase a delete, with before = key + oldImage; with newImage a write of key + newImage
(an UPDATE with oldImage, an UPSERT without); otherwise a write of key + the object's columns,
the others UNCHANGED (`update`) or null (`reset`). `ts` gives the position `pos` and the time
`step`. Names repeated in an object read as orjson reads them: the last one.

Every line the Python parser refuses, and every line this path cannot read the Python way,
sets `problem` (the caller hands the batch to the Python path, which names the line as
`encode_changefeed` does).

Records without `ts` (no virtual timestamps) are placed by the encoder at the stream's current
time and ordered by arrival: covered only when no line of the batch has a `ts` or is a barrier,
where that is time 0 and the order of files and lines (`pos` = `[file_index, block, row]`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.formats.lines import MAX_LINE_BYTES
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import _base_type
from changelake.protocol.time import MAX_TIME
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.keyed import (
    ColumnSpec,
    flipped_long,
    java_ready_schema,
    long_positions,
)
from changelake.spark.changefeed.parse import STRICT
from changelake.spark.changefeed.types import (
    Decoder,
    decimal_literal,
    spark_type,
)
from changelake.spark.changefeed.ydb_variant import INTS, problems, variant_items
from changelake.spark.expressions import per_jvm, selected
from changelake.spark.jvm import java_class, register

#: The YDB types whose JSON values this path reads in the JVM.
COVERED = frozenset({"Bool", "Uint64", "Float", "Double", "Utf8", "Uuid", *INTS})
_NAME = re.compile(r"^[^'\\`]+$")
_UINT64_MAX = (1 << 64) - 1

# The pieces of `_simple`: JSON's grammar, narrowed as the module docstring says.
_WS = r"[ \t\r\n]*+"
_STRING = (r'"(?:[^"\\\x00-\x1f\ufeff\ufffd]++|\\["\\/bfnrt]'
           r'|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4})*+"')
_UINT = r"(?:0|[1-9][0-9]*+)"
_INT = "-?" + _UINT
_NUMBER = _INT + r"(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?"
_PAIR = rf"\[{_WS}{_UINT}{_WS},{_WS}{_UINT}{_WS}\]"
#: The JSON kind each covered type reads (Uint64 non-negative: `-0` goes the careful way).
_KINDS = {"Bool": "(?:true|false)", "Uint64": _UINT, "Float": _NUMBER, "Double": _NUMBER,
          "Utf8": _STRING, "Uuid": _STRING} | {t: _INT for t in INTS}
#: The options that make `from_json` refuse what orjson refuses among the simple lines' values.
_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt", **STRICT}


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


def _name(name: str) -> str:
    """A member name as JSON spells it (`json.dumps`), every ASCII sign escaped for the regex."""
    spelled = json.dumps(name, ensure_ascii=False)
    return "".join(c if c.isalnum() or ord(c) > 127 else "\\" + c for c in spelled) \
        + _WS + ":" + _WS


def _object(members: Sequence[str]) -> str:
    """A JSON object whose members are each one of `members` (none: only `{}`)."""
    if not members:
        return rf"\{{{_WS}\}}"
    member = "(?:" + "|".join(members) + ")"
    return rf"\{{{_WS}(?:{member}(?:{_WS},{_WS}{member})*+)?{_WS}\}}"


def _simple(schema: TableSchema) -> Column:
    """The lines the typed parse reads (see the module docstring)."""
    kinds = {c.name: _KINDS[_base_type(c.type) or ""] for c in schema.columns}
    keys = list(schema.primary_key)
    non_key = [n for n in schema.names if n not in keys]
    written = _object([_name(n) + kinds[n] for n in non_key])
    nullable = _object([_name(n) + f"(?:{kinds[n]}|null)" for n in non_key])
    key = rf"\[{_WS}" + f"{_WS},{_WS}".join(kinds[k] for k in keys) + rf"{_WS}\]"
    member = "(?:" + "|".join([
        _name("key") + key, _name("update") + written, _name("reset") + nullable,
        _name("erase") + _object([]), _name("newImage") + f"(?:{nullable}|null)",
        _name("oldImage") + f"(?:{nullable}|null)", _name("ts") + _PAIR]) + ")"
    record = rf"(?:{_name('resolved')}{_PAIR}|{member}(?:{_WS},{_WS}{member})*+)"
    return (F.octet_length("value") < MAX_LINE_BYTES - 1) \
        & F.col("value").rlike(rf"^{_WS}\{{{_WS}{record}{_WS}\}}{_WS}$")


#: The YDB integer types as wide as a long: a value `from_json` reads is in their range.
_LONG_RANGED = frozenset({"Int64", "Interval", "Interval64"})


def _in_range(value: Column, base: str) -> Column:
    """A value the typed parse read is in its YDB type's range (null: yes). Uint64 is read
    non-negative (`_KINDS`); a Float/Double infinite here was a finite number beyond a double,
    which orjson refuses."""
    if base in INTS and base not in _LONG_RANGED:
        low, high = INTS[base]
        ok = value.between(low, high)
    elif base == "Uint64":
        ok = value <= decimal_literal(_UINT64_MAX)
    elif base in ("Float", "Double"):
        ok = F.abs(value) < float("inf")
    else:
        return F.lit(True)
    return F.coalesce(ok, F.lit(True))


def line_struct(schema: TableSchema, columns: Sequence[ColumnSpec]) -> str:
    """The struct the typed parse reads a line into (`from_json`'s schema)."""
    typed = {c.name: c.out_type for c in columns}
    keys = list(schema.primary_key)
    body = "struct<" + ", ".join(f"`{c.name}`: {c.out_type}" for c in columns
                                 if c.name not in keys) + ">"
    key_types = {typed[k] for k in keys}
    key_type = key_types.pop() if len(key_types) == 1 else "string"
    pair = "array<decimal(20,0)>"
    return (f"key array<{key_type}>, update {body}, reset {body}, erase {body}, "
            f"newImage {body}, oldImage {body}, ts {pair}, resolved {pair}, _corrupt string")


def _typed_items(lines: DataFrame, schema: TableSchema, columns: Sequence[ColumnSpec],
                 all_simple: bool) -> DataFrame:
    """The typed parse (see `ydb_items` for the columns); a line `_simple` does not hold for
    (unless `all_simple`) is a row of kind "careful" without a problem. The expressions are
    built once per JVM (`expressions.per_jvm`): they are thousands of round trips to the JVM."""
    ddl = line_struct(schema, columns)
    java = java_line_reader(lines.sparkSession, schema, columns, ddl)
    return selected(lines, _typed_steps(schema, tuple(columns), ddl, all_simple, java))


@per_jvm
def _typed_steps(schema: TableSchema, columns: tuple[ColumnSpec, ...], ddl: str,
                 all_simple: bool, java: tuple[str, str] | None
                 ) -> tuple[list[Column | str], ...]:
    """The selects of `_typed_items`, in order; `ddl` is `line_struct`'s, `java` is
    `java_line_reader`'s."""
    names = [c.name for c in columns]
    typed = {c.name: c.out_type for c in columns}
    bases = {c.name: _base_type(c.type) or "" for c in schema.columns}
    keys = list(schema.primary_key)
    non_key = [n for n in names if n not in keys]
    simple = F.lit(True) if all_simple else _simple(schema)
    parsed = F.from_json("value", ddl, _OPTIONS)
    steps: list[list[Column | str]] = []
    if java is not None:  # Java reads the lines it can (`java_line_reader`); `from_json` the rest
        function, spec = java
        bounded = F.when(F.octet_length("value") < MAX_LINE_BYTES - 1, F.col("value"))
        steps.append(["*", F.call_function(function, bounded, F.lit(spec)).alias("_j")])
        simple = F.col("_j").isNotNull() | simple
        parsed = F.coalesce(F.col("_j"), parsed)
    # Parsed once (a project over this is not collapsed into its many uses).
    steps.append(["file", "file_index", "block", "row", simple.alias("_simple"),
                  parsed.alias("_p")])
    p = F.col("_p")
    present = {f: p[f].isNotNull() for f in ("update", "reset", "erase", "newImage",
                                             "oldImage", "ts", "key", "resolved")}
    resolved = present["resolved"]
    erase, new_on, old_on = present["erase"], present["newImage"], present["oldImage"]
    written = F.when(present["update"], p["update"]).otherwise(p["reset"])
    uses_written = ~erase & ~new_on
    key_values = {k: p["key"][i].cast(typed[k]) for i, k in enumerate(keys)}

    def in_range(image: Column) -> Column:
        out = F.lit(True)
        for n in non_key:
            out = out & _in_range(image[n], bases[n])
        return out

    keys_in_range = F.lit(True)
    for k in keys:
        keys_in_range = keys_in_range & _in_range(key_values[k], bases[k])
    bodies = sum((present[f].cast("int") for f in ("update", "reset", "erase")), F.lit(0))
    uint64_max = decimal_literal(_UINT64_MAX)
    ts_ok = (p["ts"][0] <= uint64_max) & (p["ts"][1] <= uint64_max)
    data_problem = problems(
        (bodies != 1, "bad: not exactly one of update, reset, erase"),
        (~present["key"], "bad: key"),
        (~keys_in_range, "bad: a key value"),
        (present["ts"] & ~ts_ok, "bad: ts"),
        (present["ts"] & (p["ts"][0] > MAX_TIME), "bad: a step beyond a long"),
        (new_on & ~in_range(p["newImage"]), "bad: newImage"),
        (old_on & ~in_range(p["oldImage"]), "bad: oldImage"),
        (erase & new_on, "bad: an erase with a newImage"),
        (~erase & ~new_on & old_on, "bad: no after image (OLD_IMAGE)"),
        (uses_written & ~in_range(written), "bad: update or reset columns"),
    )
    rpos = p["resolved"]
    resolved_problem = problems(
        ((rpos[0] > uint64_max) | (rpos[1] > uint64_max), "bad: resolved"),
        (rpos[0] > MAX_TIME, "unsupported: a barrier beyond a long"),
    )
    problem = F.when(~F.col("_simple"), F.lit(None)).when(p["_corrupt"].isNotNull(),
                     F.lit("bad: an integer beyond its column's type")) \
        .when(resolved, resolved_problem).otherwise(data_problem)

    def row(image: Column) -> Column:
        return F.struct(*[(key_values[n] if n in key_values else image[n]).alias(n)
                          for n in names])

    def flags(values: dict[str, Column]) -> Column:
        return F.struct(*[values.get(n, F.lit(False)).alias(n) for n in names])

    no_row = F.lit(None).cast("struct<" + ", ".join(f"`{n}`: {typed[n]}" for n in names) + ">")
    a = F.when(erase, no_row).when(new_on, row(p["newImage"])).otherwise(row(written))
    unchanged = {n: present["update"] & p["update"][n].isNull() for n in non_key}
    none = flags({})
    ts = p["ts"]
    steps.append([
        "file", "file_index", "block", "row",
        F.when(~F.col("_simple"), "careful").when(resolved, "resolved").otherwise("change")
        .alias("kind"), problem.alias("problem"), F.when(resolved, rpos).alias("rpos"),
        present["ts"].alias("has_ts"), F.when(present["ts"], ts).alias("pos"),
        F.when(present["ts"], ts[0].cast("bigint")).alias("time"),
        *[key_values[k].alias(f"k{i}") for i, k in enumerate(keys)],
        erase.alias("is_delete"), F.when(erase, 0).otherwise(1).alias("rank"),
        F.when(erase, "d").when(new_on & old_on, "u").otherwise("w").alias("op"),
        a.alias("a"), F.when(new_on | erase, none).otherwise(flags(unchanged)).alias("ua"),
        F.when(old_on, row(p["oldImage"])).otherwise(no_row).alias("b"), none.alias("ub")])
    return tuple(steps)


JVM_LINE_CLASS = "changelake.jvm.YdbLine"

#: The JSON kind each covered YDB type is read from (`_KINDS`), as `YdbLine.java` names them.
_JAVA_KINDS = {"Bool": "bool", "Uint64": "uint", "Float": "number", "Double": "number",
               "Utf8": "string", "Uuid": "string"} | {t: "int" for t in INTS}


def java_line_reader(spark: SparkSession, schema: TableSchema, columns: Sequence[ColumnSpec],
                     ddl: str) -> tuple[str, str] | None:
    """The SQL function that reads a simple line into `from_json`'s struct (`ddl`) in Java
    (`YdbLine.java`: null where it leaves the line to `_simple` and `from_json`), and its
    second argument, the table; None where the key columns have more than one Spark type
    (`from_json` then reads the key as text). One function per struct, named by a digest of
    it: its return type is the struct."""
    typed = {c.name: c.out_type for c in columns}
    keys = list(schema.primary_key)
    if len({typed[k] for k in keys}) != 1:
        return None
    name = "changelake_ydb_line_" + hashlib.sha256(ddl.encode()).hexdigest()[:16]
    register(spark, name, JVM_LINE_CLASS, ddl)
    return name, java_table(schema, columns)


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


def java_items(lines: DataFrame, schema: TableSchema, columns: Sequence[ColumnSpec]
               ) -> DataFrame | None:
    """`ydb_items`' rows as Java alone reads `lines` (`Lines.bounded`: every line `flaw` can mark)
    in the tasks (`YdbLines.java`), but for `file`, null, with `_deferred`, true on the
    lines it leaves (a flaw, a line `YdbLine` leaves, one the typed parse finds a problem
    on: their columns are null but those the typed parse never makes null, which are as it
    makes them for a line it leaves to the careful parse, of kind "careful"), and `_facts`
    (`TASK_FACTS`, on each task's last line): for a caller that takes the rows only where
    Java read every line (`ydb_path.ydb_changes`). None where `java_line_reader` is None.

    The layout is the typed parse's, whose plan is made (not run) for its schema, with the
    Uint64 key columns and the positions as the Java conversion reads them
    (`keyed.java_ready_schema`): made as longs here, they are never decimals on their way to
    it. The two are compared in `tests/spark/test_spark_changefeed_ydb.py`."""
    spark = lines.sparkSession
    if java_line_reader(spark, schema, columns, line_struct(schema, columns)) is None:
        return None
    reader = java_class(spark, JVM_LINES_CLASS)
    planned = _typed_items(lines, schema, columns, all_simple=False)
    ready = java_ready_schema(planned.schema, len(schema.primary_key))
    out = T.StructType([*ready.fields, T.StructField("_below", T.BooleanType()),
                        T.StructField("_deferred", T.BooleanType()),
                        T.StructField("_facts", TASK_FACTS)])
    # `file` left null: the caller names a file by its `file_index` (`Lines.files`), and a
    # name per line would be copied through each row for nothing.
    places = lines.select(F.lit(None).cast("string").alias("file"),
                          F.col("file_index").cast("int"), F.col("block").cast("bigint"),
                          F.col("row").cast("bigint"), "value")
    return DataFrame(reader.read(places._jdf, out.json(), java_table(schema, columns),
                                 MAX_LINE_BYTES), spark)


def ydb_items(lines: DataFrame, schema: TableSchema, columns: Sequence[ColumnSpec], *,
              careful: bool = False) -> DataFrame:
    """One row per line: file, file_index, block, row, kind ("resolved", "change" or
    "careful"), problem, rpos (a barrier's position), has_ts, and for changes the event
    columns `keyed.convert` reads: k0.., is_delete, rank, op, pos, time, a, ua, b, ub.

    The lines `_simple` holds for take the typed parse. The others take the careful one
    (`ydb_variant.py`) with `careful`; without it they are rows of kind "careful" without a
    problem (their other columns mean nothing), so that a batch without such lines is read in
    one pass, and one with them is read again."""
    simple = _simple(schema)
    if not careful:
        return _typed_items(lines, schema, columns, all_simple=False)
    typed = _typed_items(lines.where(simple), schema, columns, all_simple=True)
    return typed.unionByName(variant_items(lines.where(~simple), schema, columns)
                             .select(*typed.columns))


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
