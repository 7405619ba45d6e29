"""Step 2, parse: each Debezium line into one item row, with Spark's JSON functions.

Mirrors `formats.debezium.DebeziumParser.parse` (envelopes, classification) and `_locate`
(positions and parser times), one rule per column expression:

* a line `null`, or an envelope whose `payload` is null: a tombstone (`_tombstone`);
* `{"schema": .., "payload": {..}}` (a `payload` key and none of op/before/after/status/source):
  the payload is the body, the schema text is kept for `types.image_fields`;
* a body with `op`: a change; with `status`: a transaction BEGIN/END (`_tx_boundary`); with
  `ddl`/`tableChanges`: a schema change; only `ts_*` keys: a heartbeat (both `skipped`);
* positions (`_locate_pg`, `_locate_mysql`): PostgreSQL `(sequence[0] or 0, sequence[1] else
  lsn else 0, lsn or 0)` and time `sequence[0]`, else the transaction's first LSN (`tx_min`);
  MySQL `(binlog number, pos, row)` and time `number << 32 | pos`, or the `file=..,pos=..` of the
  transaction id, else the transaction's first position (`tx_min`); snapshot rows no time.

A line in the shape connectors write is read by the project's Java instead (`JVM_LINE`,
`spark/jvm/DebeziumLine.java`): one Jackson pass that applies these rules to a line none of
them finds a `problem` on, and leaves every other line to the Spark functions. The two give the
same columns on every line (`tests/test_spark_changefeed_jvm.py`). Two ways to use it:

* `java_items`: Java's reading alone, with a flag on the lines it leaves. The ingest's parse
  step takes it where Java read every line of the batch (`debezium_path._parsed`). Java reads each
  task's lines itself (`JVM_LINES_CLASS`, `DebeziumLines.java`), into Spark's internal rows:
  the same rows as the UDF's plan (`_java_read`), without its conversions.
* `parse_items` (with `jvm`): Java's lines, and the Spark functions for the rest, which read
  Java's lines as null. A null costs each of their expressions little, but they are many, so
  this takes longer than Java alone (benchmarks/README.md). `jvm=False`: the Spark functions
  alone, which the tests compare Java's reading with.

Each line is parsed once against one schema (`ENVELOPE`): the envelope's fields, the `payload`
of a wrapped line as a struct of the same fields, and the `source` block as a typed struct. Only
`data_collections`, on transaction lines, is parsed again. The `sequence` text (a JSON string)
is taken apart with string functions, and only in the shape Debezium writes it (`_SEQUENCE`:
any other sends the batch to the old path, which reads it as the encoder does). Images stay
JSON text here (`before_raw`, `after_raw`), read against the decided column types next
(`keyed.typed_images`).

Mind the plan's shape when changing these expressions. A `from_json` is evaluated by
interpretation, which keeps its projection out of whole-stage code generation. Where the last
projection had none (`data_collections` typed in the envelope, or the sequence read by
`split`), Spark compiled the whole read and parse into one generated method, too long for the
JIT (HotSpot compiles none over 8,000 bytes), and the step was much slower (benchmarks/README.md,
"The parse's plan shape").

Where the Python parser asks whether a field is present (`in`), this step asks
`json_object_keys` of the line (the envelope's `payload`, and the keys of a body without
envelope fields). For the source fields whose presence decides a rule (`lsn`/`txId`/`sequence`:
PostgreSQL, `file`/`pos`: MySQL, `step`: YDB) a non-null value is presence; only where one is
null and the line holds its quoted name (or a `\\u` escape) are the source's keys read
(`_source_keys`, rare: a null field the connector writes). An image column that is absent and
one that is null both read as null (`keyed.py` hands a null key to the old path, where the two
differ).

Each row also carries `flaw` (`read.flaw`: the line is over the length bound or not UTF-8), so
that the caller's aggregate over the parsed lines holds them to the bounds without a pass of its
own over the text (`read.Lines.bounded`).

What this step does not do the Python way sets `problem` on the row: a line the Python parser
rejects (with its own message, which this path does not restate), and a line it accepts that
this path does not convert yet (Kafka record dumps, logical messages, YDB's
DEBEZIUM_JSON, changes without a position). `from_json` runs in FAILFAST mode, so a value of the
wrong JSON type fails the job instead of becoming null, and as strictly as orjson (`STRICT`:
no single quotes, no NaN, nothing after the line's value). A string field takes any JSON
value as its text, though, so where the kind decides (an image or `data_collections` written
as a string: `_string_valued`; a `snapshot` or `gtid` that is not one: `_not_text`) the line
is looked at, and a line that may hold such a value sets `problem` too. Either way the caller
hands the whole batch to the old path, which reports bad lines exactly as `encode_changefeed`
does. The source's `table`, `schema` and `db` are looked at once per batch, in the table name
the caller's facts give (`odd_names`), and on the lines only when it looks odd
(`odd_name_lines`).
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.spark.changefeed.read import MAX_LINE_BYTES, flaw
from changelake.spark.expressions import per_jvm, selected
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
SOURCE = (
    "connector string, snapshot string, lsn bigint, txId bigint, sequence string, "
    "file string, pos bigint, row bigint, gtid string, step string, table string, "
    "schema string, db string"
)
BODY = (
    "op string, before string, after string, status string, id string, event_count bigint, "
    f"data_collections string, source struct<{SOURCE}>, "
    "transaction struct<id: string, total_order: bigint>"
)
ENVELOPE = f"schema string, payload struct<{BODY}>, {BODY}"
COLLECTIONS = "array<struct<data_collection: string, event_count: bigint>>"
#: `changelake.jvm.DebeziumLine` (`spark/jvm/DebeziumLine.java`): the item columns of a line
#: Java reads, every one a line with no `problem`, or null for a line it leaves to the Spark
#: functions; it is given the line's bytes (`value` cast to binary). What it reads and what it
#: leaves are in that file; `_read_by_java` puts its columns in place of theirs.
JVM_LINE = "changelake_debezium_line"
JVM_LINE_CLASS = "changelake.jvm.DebeziumLine"
#: `changelake.jvm.DebeziumLines`: `DebeziumLine` over each task's lines, as `java_items`.
JVM_LINES_CLASS = "changelake.jvm.DebeziumLines"
#: `java_items`' `_chunk`: a row of `times.chunks_of`'s aggregate.
CHUNK = T.StructType([T.StructField("file_index", T.IntegerType()),
                      *(T.StructField(n, T.LongType())
                        for n in ("block", "chunk", "t", "last_wanted", "first_moving"))])
#: `java_items`' `_facts`: what `debezium_path._facts` aggregates over one task's lines (`first`
#: as its place and its three fields), the lines Java left and the shapes.
TASK_FACTS = T.StructType([
    *(T.StructField(n, T.LongType()) for n in ("flawed", "changes", "untimed", "by_tx",
                                               "metadata", "schemaless", "_deferred")),
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
_BODY_FIELDS = ("op", "before", "after", "status", "id", "event_count", "data_collections",
                "source", "transaction")
_ENVELOPE_FIELDS = ("op", "before", "after", "status", "source")
_KAFKA_FIELDS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")
#: The source fields whose presence (not only their value) decides a rule of the parser.
_PRESENCE = ("lsn", "txId", "sequence", "file", "pos", "step")
_SNAPSHOT_TRUE = ("true", "first", "last", "first_in_data_collection",
                  "last_in_data_collection")
#: The snapshot flags Debezium writes, and the booleans (read into the string field as text).
_SNAPSHOT_KNOWN = (*_SNAPSHOT_TRUE, "false", "incremental")
_HEARTBEAT = ("ts_ms", "ts_us", "ts_ns")
#: The source fields that name the table (`odd_names`).
NAME_FIELDS = ("table", "schema", "db")
#: A name (a part of a table name, `odd_names`; in Spark, one of a line's `NAME_FIELDS`,
#: `odd_name_lines`) that opens as a number, an object or an array does, or is `true` or
#: `false`: what Spark's text of another JSON kind than a string may be. Read by Python's `re`
#: and Java's alike.
_ODD_NAME = "^(?:[-{\\[0-9]|(?:true|false)$)"
#: What follows a key whose value is not a string.
_NOT_A_STRING = r'[^"\s]'
#: `source.sequence` as Debezium writes it: two LSNs as decimal strings, the first may be null.
#: At most 18 digits, so that each fits a long. The encoder also reads numbers, whitespace,
#: escapes and longer digit strings (and refuses a sign or a space inside the quotes); a
#: sequence of any other shape goes to the old path (`problem`), which reads it as it does.
#: It ends at `\z`, the text's end: Java's `$` also matches before a last newline, and a
#: sequence with one then failed the job at the cast of its digits.
_SEQUENCE = r'^\[(null|"[0-9]{1,18}"),(null|"[0-9]{1,18}")\]\z'


def _has(keys: Column, name: str) -> Column:
    return F.coalesce(F.array_contains(keys, name), F.lit(False))


def _only(keys: Column, names: tuple[str, ...]) -> Column:
    return F.size(F.array_except(keys, F.array(*map(F.lit, names)))) == 0


def _all_null(struct: Column, names: tuple[str, ...]) -> Column:
    out = F.lit(True)
    for name in names:
        out = out & struct[name].isNull()
    return out


def _problems(*cases: tuple[Column, str]) -> Column:
    out = F.lit(None).cast("string")
    for condition, reason in reversed(cases):
        out = F.when(condition, F.lit(reason)).otherwise(out)
    return out


def _sequence(raw: Column) -> tuple[Column, Column]:
    """Whether `source.sequence` is in Debezium's shape (`_SEQUENCE`), and its two entries as
    written (`["12"`, `null]`), split at the comma: in that shape the only comma is the one
    between them. No `from_json` here: each costs a Jackson parser and its 8 KiB buffer per
    line, which made the parse measurably slower (benchmarks/README.md, "The parse profiled")."""
    return raw.rlike(_SEQUENCE), F.split(raw, ",", 2)


def _lsn(ok: Column, entry: Column, i: int) -> Column:
    """Entry `i` of a sequence in Debezium's shape as a number: null for `null` (and where the
    sequence is not in that shape), else its at most 18 digits. In that shape the first entry
    is `[null` or `["digits"`, the second `null]` or `"digits"]`, so the digits are cut out
    by their place (a `btrim` of the brackets and quotes scanned every entry's bytes for each
    of them, which made the parse slower: benchmarks/README.md, "The parse profiled")."""
    digits = entry.substr(F.lit(3 - i), F.length(entry) - F.lit(3))
    return F.when(ok & (entry != F.lit(("[null", "null]")[i])), digits.cast("bigint"))


def _tx_id(raw: Column) -> Column:
    """`normalise_tx_id`: PostgreSQL `txId:LSN` keeps the txId; other ids stay whole."""
    return F.when(raw.rlike(r"^\d+:\d+$"), F.regexp_extract(raw, r"^(\d+):", 1)).otherwise(raw)


def _source_keys(value: Column, wrapped: Column, s: Column) -> Column:
    """The source's keys, read only where a null field may hide a present key that decides a
    rule: where the line holds the name, with its closing quote, of a null `step` (YDB), or,
    when none of the PostgreSQL fields has a value (one that has decides PostgreSQL whatever
    else is present), of a null one of `_PRESENCE`; or a `\\u` escape, which could spell any.
    Elsewhere null; `_present` then decides by the values alone. Each name is a scan of the
    line, so a PostgreSQL line is scanned twice (`step`, the escape), not four times.
    The scan looks for `step"`, not `"step"`: Spark's `contains` compares the whole name at
    every place the first byte matches, and a quote is a JSON line's most frequent byte (a
    name that only ends in `step` makes the exact reading run for nothing)."""

    def named(names: tuple[str, ...]) -> Column:
        out = F.lit(False)
        for name in names:
            out = out | (s[name].isNull() & value.contains(f'{name}"'))
        return out

    positionless = s["lsn"].isNull() & s["txId"].isNull() & s["sequence"].isNull()
    hidden = named(("step",)) | (positionless & named(_PRESENCE))
    hidden = s.isNotNull() & (value.contains("\\u") | hidden)
    text = F.when(wrapped, F.get_json_object(value, "$.payload.source")) \
        .otherwise(F.get_json_object(value, "$.source"))
    return F.when(hidden, F.json_object_keys(text))


def _string_valued(value: Column, *names: str) -> Column:
    """Whether a field read into a string field (an image, `data_collections`) may have been a
    JSON string: `from_json` reads an object or array into a string field as its text, and a
    string as its content, so `"after": "{..}"` (JSON written into a string twice) would read
    as the object, where the encoder refuses the line. The line is looked at for a key of one
    of `names` followed by a string (an image column of that name holding a string is one too,
    and sends the batch to the old path for nothing). Each pattern opens with a literal, which
    Java's regular expressions skip to (the images' two patterns still cost the parse time:
    benchmarks/README.md, "Source names of another JSON kind")."""
    out = F.lit(False)
    for name in names:
        out = out | _key_then(value, name, '"')
    return out


def _key_then(value: Column, name: str, first: str) -> Column:
    """Whether the line holds the key `name` with a value opening as the pattern `first`
    (the pattern opens with the literal name, which Java's matcher skips to)."""
    return value.rlike(f'"{name}"' + r"\s*:\s*" + first)


def _not_text(value: Column, s: Column) -> Column:
    """Whether a source field the encoder reads only as text may have held another JSON kind,
    which Spark reads into the string field as its text: `snapshot` (a string or a boolean;
    the encoder refuses any other kind) and `gtid` (the encoder ignores a gtid that is not a
    string; this path would take its text for the transaction). Only a value unlike the
    connector's (a snapshot flag not in `_SNAPSHOT_KNOWN`; a gtid without a colon, or opening
    as an object's or an array's text does) is looked at, on its line: for the key followed
    by anything but a string (an image column of that name is one too, and sends the batch
    to the old path for nothing). The table's names are looked at once per batch instead
    (`odd_names`)."""
    out = F.lit(False)
    for name, usual in (("snapshot", s["snapshot"].isin(*_SNAPSHOT_KNOWN)),
                        ("gtid", s["gtid"].contains(":") & ~s["gtid"].startswith("{")
                         & ~s["gtid"].startswith("["))):
        out = out | (s[name].isNotNull() & ~usual & _key_then(value, name, _NOT_A_STRING))
    return out


def odd_names(table: str | None) -> bool:
    """Whether the one table a batch's changes name (`[prefix.]table`, as `_classify` writes
    it: the facts' least and greatest agree, or the batch is the old path's) may hold Spark's
    text of another JSON kind than a string, in a part its dots separate (`_ODD_NAME`): then
    `odd_name_lines` looks at the lines. The encoder names the table with Python's reading of
    such a source `table`, `schema` or `db` (`false` or `0` is no table, `true` is `True`),
    where this path would write Spark's text (`false`, `true`) into the name; a field the
    name does not hold (`db` beside a `schema`) is one the encoder does not read either.

    Looked at once, on the driver: a per-line check of the three names lengthened the parse
    (more so with a check of its own for each, whose generated code was too long for the JIT:
    benchmarks/README.md, "Source names of another JSON kind: a per-line check is not free")."""
    return table is not None and any(re.match(_ODD_NAME, part) for part in table.split("."))


def odd_name_lines(lines: DataFrame) -> DataFrame:
    """The lines where a source `table`, `schema` or `db` may hold another JSON kind than a
    string: its value looks like Spark's text of one (`_ODD_NAME`), and the line holds that
    field's key followed by anything but a string (an image column of that name, or the
    envelope's `schema` on a wrapped line beside an odd-looking source `schema`, is one too,
    and sends the batch to the old path for nothing). A pass of its own over the text, made
    only when `odd_names` says so."""
    names = f"struct<{', '.join(f'{n}: string' for n in NAME_FIELDS)}>"
    envelope = F.from_json("value", f"source {names}, payload struct<source {names}>", FAILFAST)
    odd = F.lit(False)
    for name in NAME_FIELDS:
        looks = F.lit(False)
        for source in (F.col("e.source"), F.col("e.payload.source")):
            looks = looks | F.coalesce(source[name].rlike(_ODD_NAME), F.lit(False))
        odd = odd | (looks & _key_then(F.col("value"), name, _NOT_A_STRING))
    return lines.select("value", envelope.alias("e")).where(odd)


def _present(s: Column, skeys: Column, name: str) -> Column:
    """`name in source`: a non-null value, or a key the exact reading found."""
    return s[name].isNotNull() | _has(skeys, name)


def parse_items(lines: DataFrame, *, jvm: bool = True) -> DataFrame:
    """One row per line: see the module docstring for the columns' rules. With `jvm`, the
    lines Java reads (`JVM_LINE`) skip the Spark functions' reading; `jvm=False` is the Spark
    functions' way for every line (to compare the two: tests, benchmarks).

    The expressions are built once per JVM (`_steps`, `expressions.per_jvm`): built per call,
    they were about 8,000 round trips to the JVM, driver time before any job ran
    (`benchmarks/bench_fixed_cost.py`)."""
    carry: tuple[str, ...] = ()
    if jvm:
        register(lines.sparkSession, JVM_LINE, JVM_LINE_CLASS, JVM_LINE_TYPE)
        lines = _java_read(lines)
        # What Java read, the Spark functions read as null (each of them costs little there).
        lines = lines.withColumn("value", F.when(F.col("_j").isNull(), F.col("value")))
        carry = ("_j",)
    else:
        lines = lines.select("file", "file_index", "block", "row", "value",
                             flaw(F.col("value")).alias("flaw"))
    items = selected(lines, _steps(carry))
    return _read_by_java(items) if jvm else items


@per_jvm
def _steps(carry: tuple[str, ...]) -> tuple[list[Column | str], ...]:
    """The selects of `parse_items` after the lines' own columns, in order: each reads the
    columns the one before it made."""
    # A line that opens an object is no `null`: only the others are trimmed (a copy each).
    tombstone_line = ~F.col("value").startswith("{") & (F.trim(F.col("value")) == "null")
    # Jackson stops at the end of the line's first value, so `{..} x` would read as `{..}`
    # where orjson refuses the line. Read as a one-element array, anything after the value
    # either breaks the array (the job fails, as for any text that is not JSON) or is a
    # second element (`_many`).
    values = F.from_json(F.concat(F.lit("["), F.col("value"), F.lit("]")),
                         f"array<struct<{ENVELOPE}>>", FAILFAST)
    places = ["file", "file_index", "block", "row"]
    read = [*places, "value", "flaw", *carry, F.when(~tombstone_line, values).alias("_values")]
    envelope = [*places, "value", "flaw", *carry,
                F.coalesce(F.size("_values") != 1, F.lit(False)).alias("_many"),
                F.col("_values")[0].alias("e")]
    e = F.col("e")
    bare_fields_null = _all_null(e, _ENVELOPE_FIELDS)
    top = ["*", F.when(bare_fields_null, F.json_object_keys("value")).alias("_top")]
    kafka = bare_fields_null & _has(F.col("_top"), "value") & _only(F.col("_top"), _KAFKA_FIELDS)
    wrapped = bare_fields_null & _has(F.col("_top"), "payload")
    body = F.when(wrapped, e["payload"]) \
        .otherwise(F.struct(*[e[f].alias(f) for f in _BODY_FIELDS]))
    bodies = [*places, "value", "flaw", *carry, "_many", "_top",
              tombstone_line.alias("_null_line"), kafka.alias("_kafka"),
              wrapped.alias("_wrapped"), F.when(wrapped, e["schema"]).alias("schema"),
              body.alias("b")]
    b = F.col("b")
    body_null = F.col("_wrapped") & b.isNull()
    body_keys = F.when(_all_null(b, _ENVELOPE_FIELDS),
                       F.when(F.col("_wrapped"),
                              F.json_object_keys(F.get_json_object("value", "$.payload")))
                       .otherwise(F.col("_top")))
    items = [
        *places, "flaw", *carry, "schema", "_many", "_null_line", "_kafka", "_wrapped", "b",
        body_null.alias("_body_null"), body_keys.alias("_keys"),
        _source_keys(F.col("value"), F.col("_wrapped"), b["source"]).alias("_skeys"),
        _string_valued(F.col("value"), "after", "before").alias("_image_text"),
        (b["status"].isNotNull() & _string_valued(F.col("value"), "data_collections"))
        .alias("_collections_text"),
        _not_text(F.col("value"), b["source"]).alias("_not_text"),
        b["source"].alias("s")]
    return (read, envelope, top, bodies, items, *_classify(carry))


def java_items(lines: DataFrame, *, udf: bool = False, chunk_bits: int | None = None
               ) -> DataFrame:
    """`parse_items`' columns as Java alone reads the lines (`JVM_LINE`), `shape` (see
    `JVM_LINE_TYPE`), and `_deferred`,
    true on the lines Java leaves (their columns are then null and `problem` too): the parse
    without any of the Spark functions' expressions, for a caller that takes it only where
    Java read every line (`debezium_path._parsed`).

    The rows come from Java's own pass over each task's lines (`JVM_LINES_CLASS`), in the
    layout of the UDF's plan (`_java_read`, `_java_columns`), whose schema it is given: the
    two are compared in `tests/test_spark_changefeed_jvm.py`. `udf`: that plan instead.

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


def _read_by_java(items: DataFrame) -> DataFrame:
    """The item columns, Java's (`_j`) where Java read the line: every line it reads is one
    `_classify` finds no `problem` on (`JVM_LINE`), and one the Spark functions read as null."""
    never_null = frozenset(f.name for f in items.schema.fields if not f.nullable)
    return items.select(*_picks(never_null))


@per_jvm
def _picks(never_null: frozenset[str]) -> list[Column | str]:
    java = F.col("_j").isNotNull()

    def pick(name: str) -> Column:
        picked = F.when(java, F.col("_j")[name]).otherwise(F.col(name))
        if name in never_null:  # as it was: Java never gives null where Spark cannot
            picked = F.coalesce(picked, F.col(name))
        return picked.alias(name)

    return ["file", "file_index", "block", "row", "flaw", pick("schema"), pick("kind"),
            F.when(~java, F.col("problem")).alias("problem"), *map(pick, _JVM_COLUMNS[2:])]


def _classify(carry: tuple[str, ...] = ()) -> tuple[list[Column | str], ...]:
    """The selects that make the item columns. What several rules read, and is not cheap (the
    `sequence` parse, the regular expressions, the PostgreSQL/MySQL decision), is a column of
    its own first: Spark does not share an expression between the branches of a `when`, so a
    repeated one would be evaluated once per use."""
    b0, s0, skeys0 = F.col("b"), F.col("s"), F.col("_skeys")
    tx_raw0 = b0["transaction"]["id"]
    pg0 = (_present(s0, skeys0, "lsn") | _present(s0, skeys0, "txId")
           | _present(s0, skeys0, "sequence"))
    seq_ok, seq_entries = _sequence(s0["sequence"])
    shared = [
        "*", seq_ok.alias("_seq_ok"), seq_entries.alias("_seq_entries"),
        F.when(tx_raw0.isNotNull(), _tx_id(tx_raw0)).alias("_tx_id"), pg0.alias("_pg"),
        F.regexp_extract(s0["file"], r"\.([0-9]+)$", 1).alias("_file_no")]
    # The sequence's numbers once each: a cast in the branches of a `when` is made per use.
    numbers = ["*", *(_lsn(F.col("_seq_ok"), F.col("_seq_entries")[i], i).alias(f"_seq{i}")
                      for i in (0, 1))]
    b, s, skeys = F.col("b"), F.col("s"), F.col("_skeys")
    tombstone = F.col("_null_line") | F.col("_body_null")
    is_change = ~tombstone & b["op"].isNotNull()
    is_tx = ~tombstone & b["op"].isNull() & b["status"].isNotNull()
    keys = F.col("_keys")
    skipped = ~tombstone & ~is_change & ~is_tx & (
        keys.isNotNull() & (_has(keys, "ddl") | _has(keys, "tableChanges")
                            | ((F.size(keys) > 0) & _only(keys, _HEARTBEAT))))
    kind = (F.when(tombstone, "tombstone").when(is_change, "change")
            .when(is_tx, b["status"]).when(skipped, "skipped").otherwise(None))

    snapshot = F.coalesce(s["snapshot"].isin(*_SNAPSHOT_TRUE), F.lit(False))
    op = F.when((b["op"] == "c") & snapshot, "r").otherwise(b["op"])
    tx_id = F.col("_tx_id")
    ydb = (s["connector"] == "ydb") | _present(s, skeys, "step")
    pg = F.col("_pg")
    mysql = ~pg & (_present(s, skeys, "file") | _present(s, skeys, "pos"))
    # PostgreSQL
    seq0, seq1 = F.col("_seq0"), F.col("_seq1")
    lsn = s["lsn"]
    pg_tx = F.coalesce(tx_id, s["txId"].cast("string"))
    pg_none = seq0.isNull() & seq1.isNull() & lsn.isNull()
    pg_pos = F.when(~pg_none, F.array(F.coalesce(seq0, F.lit(0)),
                                      F.coalesce(seq1, lsn, F.lit(0)), F.coalesce(lsn, F.lit(0))))
    pg_own = F.coalesce(lsn, seq1)
    pg_time = F.when(pg_none | snapshot, None).when(seq0.isNotNull(), seq0).otherwise(pg_own)
    pg_tx_min = ~pg_none & ~snapshot & seq0.isNull() & pg_tx.isNotNull() & pg_own.isNotNull()
    # MySQL
    file_no = F.col("_file_no")
    file_ok = file_no != ""
    # `try_cast`: digits that are none (`""`) or too many for a long are a `problem` below
    # (the old path then reads them as the encoder does), not a failed job (ANSI mode fails a
    # `cast` of them)
    number = F.when(file_ok, file_no.try_cast("bigint"))
    row = F.coalesce(s["row"], F.lit(0))
    my_tx = F.coalesce(tx_id, s["gtid"])
    my_pos = F.array(number, s["pos"], row)
    tx_file = F.regexp_extract(my_tx, r"(?:^|,)file=[^,]*\.([0-9]+)(?:,|$)", 1)
    tx_at = F.regexp_extract(my_tx, r"(?:^|,)pos=([0-9]+)(?:,|$)", 1)
    by_tx_id = my_tx.startswith("file=")
    my_time = (F.when(snapshot, None)
               .when(by_tx_id, F.shiftleft(tx_file.try_cast("bigint"), 32).bitwiseOR(
                   tx_at.try_cast("bigint")))
               .otherwise(F.shiftleft(number, 32).bitwiseOR(s["pos"])))
    my_tx_min = ~snapshot & my_tx.isNotNull() & ~by_tx_id

    position = F.when(pg, pg_pos).when(mysql, my_pos)
    time = F.when(pg, pg_time).when(mysql, my_time)
    tx = F.when(pg, pg_tx).when(mysql, my_tx).otherwise(tx_id)
    tx_min = F.when(pg, pg_tx_min).when(mysql, my_tx_min).otherwise(False)
    # `schema or db`: an empty schema falls to the db, as a missing one does
    prefix = F.coalesce(F.nullif(s["schema"], F.lit("")), F.nullif(s["db"], F.lit("")))
    table = F.when(F.coalesce(s["table"], F.lit("")) != "",
                   F.when(prefix.isNotNull(), F.concat_ws(".", prefix, s["table"]))
                   .otherwise(s["table"]))
    collections = F.from_json(b["data_collections"], COLLECTIONS, FAILFAST)
    negative = F.coalesce(lsn < 0, F.lit(False)) | F.coalesce(s["txId"] < 0, F.lit(False)) | \
        F.coalesce(s["pos"] < 0, F.lit(False)) | F.coalesce(s["row"] < 0, F.lit(False))
    # An object comes back from `from_json` as its text re-written, which starts with `{`.
    image_not_object = (F.coalesce(~b["before"].startswith("{"), F.lit(False))
                        | F.coalesce(~b["after"].startswith("{"), F.lit(False)))
    change_problem = _problems(
        (F.col("_kafka"), "unsupported: a Kafka record dump"),
        (ydb, "unsupported: YDB's DEBEZIUM_JSON"),
        (b["op"] == "m", "unsupported: a logical message"),
        (~b["op"].isin("c", "r", "u", "d", "t"), "bad: unknown op"),
        (b["source"].isNull(), "bad: no source block"),
        (F.col("_not_text"), "unsupported: a source.snapshot or gtid that may not be text"),
        (negative, "bad: a negative position"),
        (pg & s["sequence"].isNotNull() & ~F.col("_seq_ok"),
         "unsupported: a source.sequence not in Debezium's shape"),
        (mysql & (~file_ok | s["pos"].isNull() | (s["pos"] >= 2 ** 32)), "bad: binlog position"),
        (mysql & by_tx_id & ((tx_file == "") | (tx_at == "")), "bad: transaction id"),
        (mysql & (number.isNull() | (by_tx_id & my_time.isNull() & ~snapshot)),
         "unsupported: a binlog number too large for a long"),
        (image_not_object, "bad: an image that is not an object"),
        ((b["op"] == "d") & b["after"].isNotNull(), "bad: a delete with an after image"),
        (op.isin("c", "r", "u") & b["after"].isNull(), "bad: no after image"),
        (F.col("_image_text"), "unsupported: an image that may be a JSON string"),
        (position.isNull(), "unsupported: a change without a position"),
    )
    tx_problem = _problems(
        (F.col("_collections_text"), "unsupported: data_collections that may be a JSON string"),
        (~b["status"].isin("BEGIN", "END"), "bad: transaction status"),
        (b["id"].isNull(), "bad: transaction without an id"),
        ((b["status"] == "END") & b["event_count"].isNull(), "bad: END without event_count"),
        (F.coalesce(F.exists(collections, lambda c: c["event_count"].isNull()), F.lit(False)),
         "bad: data_collections entry"),
    )
    problem = (F.when(F.col("_many"), "bad: more than one JSON value on the line")
               .when(F.col("_kafka"), "unsupported: a Kafka record dump")
               .when(is_change, change_problem).when(is_tx, tx_problem)
               .when(kind.isNull(), "bad: not a Debezium event"))
    return shared, numbers, [
        "file", "file_index", "block", "row", "flaw", *carry, "schema", kind.alias("kind"),
        problem.alias("problem"),
        op.alias("op"), time.alias("ptime"), tx_min.alias("tx_min"),
        F.when(is_change, tx).when(is_tx, _tx_id(b["id"])).alias("tx"),
        b["transaction"]["total_order"].alias("tx_order"),
        F.when(b["status"] == "END", b["event_count"]).alias("end_count"),
        F.when(b["status"] == "END", collections).alias("end_collections"),
        position.alias("pos"), table.alias("table"), snapshot.alias("snapshot"),
        b["before"].alias("before_raw"), b["after"].alias("after_raw")]
