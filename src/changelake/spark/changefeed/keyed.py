"""Step 5, keyed conversion: each key's events in order, and the table's row, in the JVM.

Why one module of over 500 lines: step 5 is one step: the images read against the columns'
types, the keyed events built from them and their conversion pass the same columns from one to
the next.

Mirrors `convert.upsert.KeyedConverter` with the default `UpsertOptions` (order by position,
tombstones ignored, deletes by op d), for the events at times in `[since, frontier)`:

* *Images* are read against the column types (`types.py`): by the project's Java image reader
  (`java_image_reader`), and by `from_json` where Java leaves an image (a value of another
  kind than its column's, say) or does not read a column's raw type; then decoded, and
  each value marked when it is Debezium's unavailable placeholder (`UNCHANGED`).
* *Key* (`_key`): from the after image, else the before image, skipping an image whose key
  holds UNCHANGED. An update whose before image names another key is two events at one
  position, a delete of the old key and a write of the new one without before image
  (`split_moved_key`).
* *Order* (`Pending.order`): per key, `(time, position, rank)`; rank 0 for a delete, 1 for a
  write (`_tiebreak`). An event is applied when its `(position, rank)` is above every earlier
  event's of its key (`_is_old`, `_apply_one`: the applied events of a key increase, so the
  running maximum over all earlier events is that of the applied ones). Equal: a replay; below:
  stale. Two writes of one key at one position with different rows would be ordered by their
  text (`repr`), which this path does not restate: `Unsupported`, where it matters (at the
  greatest position the key has reached; `java_convert`'s `tied`).
* *Rows* (`_merge`): a written column is the after image's value; an UNCHANGED one keeps the
  key's previous row's value, which is the last real value written since the key's last
  applied delete (`segment`), else the table's row (state) when no delete was applied yet, else
  the first write's before image value, else null. A key move's create comes with the row its
  delete removed as its before image (`moves.py`, `convert.upsert.key_moves`).
* *Updates*: each applied event retracts the key's previous row (the state's for the first)
  and inserts its own (a delete none), at its time; equal pairs cancel when consolidated.
* *Truncates* (a Debezium batch's few, `MAX_TRUNCATES`): to each key, a delete at the
  truncate's time and position, which `KeyedConverter._truncate` is, key by key (its floor
  then each key's own rule); a key only the state holds is retracted at the first truncate
  (`java_convert`).

The rules run in `java_convert`: one pass of `KeyedConversion.java` over each key's events,
sorted, in the tasks (`conversion.checked_conversion`), where Spark's windows (four window
operators, each copying every event into its buffer, an explode and an aggregate) were most of
the conversion's time; the pass holds nothing but one key's updates at one time
(benchmarks/README.md). The differential tests hold it to `convert.upsert.KeyedConverter`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.parse import FAILFAST
from changelake.spark.changefeed.types import (
    FLOAT_WORDS,
    Decoder,
    decimal_literal,
    decode,
    state_column,
    unchanged,
)
from changelake.spark.checkpoint import stored
from changelake.spark.expressions import per_jvm, quote, selected
from changelake.spark.jvm import register
from changelake.spark.settings import NOT_ADAPTIVE, settings


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    out_type: str  # the Spark type of the output column
    raw_type: str  # the type `from_json` reads
    with_schema: Decoder  # for lines that carry a Debezium schema
    without_schema: Decoder  # for lines that do not (the table schema's `debezium` field)


def _parsed(raw: Column, columns: Sequence[ColumnSpec]) -> Column:
    """An image's text read against the columns' raw types."""
    return F.from_json(raw, _raw_struct(columns), FAILFAST)


def _raw_struct(columns: Sequence[ColumnSpec]) -> str:
    return ", ".join(f"{quote(c.name)} {c.raw_type}" for c in columns)


JVM_IMAGE_CLASS = "changelake.jvm.DebeziumImage"

#: A decimal(20,0) holds what the encoder reads as an integer: from -2^63 to 2^64-1 (outside,
#: orjson reads a float).
_LEAST, _GREATEST = -(2**63), 2**64 - 1

#: A long with only its sign bit set (`_flipped`'s mask).
_SIGN_BIT = -(2**63)


def java_image_reader(spark: SparkSession, columns: Sequence[ColumnSpec]
                      ) -> tuple[str, str] | None:
    """The SQL function that reads an image as `_parsed` does, in Java (`DebeziumImage.java`:
    null where it leaves the image to `from_json`; given the image's text cast to binary, its
    bytes), and its second argument, the columns; None where a raw type is not one Java reads.
    One function per struct of raw types, named by a digest of it: its return type is the
    struct."""
    if any(c.raw_type not in _JAVA_RAW_TYPES for c in columns):
        return None
    struct = _raw_struct(columns)
    name = "changelake_debezium_image_" + hashlib.sha256(struct.encode()).hexdigest()[:16]
    register(spark, name, JVM_IMAGE_CLASS, f"struct<{struct}>")
    return name, json.dumps([[c.name, c.raw_type] for c in columns], ensure_ascii=False)


_JAVA_RAW_TYPES = frozenset({"string", "bigint", "double", "boolean", "decimal(20,0)"})


def _first_char(raw: Column, name: str) -> Column:
    """The first character of the value of field `name` in the image text `raw` (null when
    the image has no such field). `raw` is Spark's re-written text of the image, so the name
    is spelled as JSON escapes it and the value follows the colon at once; inside a string
    value the name's quotes are escaped, so every `"name":` is the field's, and the last one
    is the value `from_json` reads (and orjson: a repeated name's last value wins)."""
    field = '"' + json.dumps(name, ensure_ascii=False)[1:-1] + '":'
    return F.when(raw.contains(field), F.substring(F.substring_index(raw, field, -1), 1, 1))


def _refused(raw: Column, value: Column, c: ColumnSpec) -> Column | None:
    """What `from_json` reads into a plain column that the Python path and orjson refuse: a
    number, boolean, array or object read into a string column as its text (the Python path
    refuses a value of another kind than its column's), a number beyond a double read as an
    infinity (orjson refuses the line; the text "Infinity" is one), and an integer beyond 64
    bits read exactly (orjson reads it as a float); for a Connect float read as text, a
    string other than `FLOAT_WORDS`, a value of another JSON kind than a number, and a number
    beyond a double. None: nothing to refuse."""
    if c.with_schema.kind == "float" and c.without_schema.kind == "float":
        first = _first_char(raw, c.name)
        word = (first == '"') & (value.isin(*FLOAT_WORDS) | unchanged(value))
        number = first.isin("-", *"0123456789")
        infinite = F.abs(value.cast("double")) == F.lit(float("inf"))
        return F.when(first.isNotNull() & (first != "n") & ~word & ~number,
                      f"column {c.name}: a value that is not a number, nor one of "
                      f"{', '.join(FLOAT_WORDS)}") \
            .when(number & infinite, f"column {c.name}: a number beyond a double")
    if c.with_schema.kind != "plain" or c.without_schema.kind != "plain":
        return None
    if c.raw_type == "string":
        first = _first_char(raw, c.name)
        return F.when(first.isNotNull() & ~first.isin('"', "n"),
                      f"column {c.name}: a value that is not a JSON string")
    if c.raw_type == "double":
        infinite = (value == F.lit(float("inf"))) | (value == F.lit(float("-inf")))
        return F.when(infinite & (_first_char(raw, c.name) != '"'),
                      f"column {c.name}: a number beyond a double")
    if c.raw_type == "decimal(20,0)":  # orjson reads an integer outside these as a float
        outside = (value < decimal_literal(_LEAST)) | (value > decimal_literal(_GREATEST))
        return F.when(outside, f"column {c.name}: an integer beyond 64 bits")
    return None


def _image(raw: Column, parsed: Column, has_schema: Column,
           columns: Sequence[ColumnSpec], by_java: Column) -> list[Column]:
    """(value, unchanged flag) columns of one image (`raw`, and `parsed`: its `_parsed`
    column), in column order, flattened. Where `by_java` (Java read the image: every value of
    its column's own kind), no value is one the checks below refuse, and they are skipped."""
    out: list[Column] = []
    for c in columns:
        value = parsed[c.name]
        if c.with_schema == c.without_schema:
            decoded = decode(value, c.with_schema)
        else:
            decoded = F.when(has_schema, decode(value, c.with_schema)) \
                .otherwise(decode(value, c.without_schema))
        checked = decoded
        if "decimal" in (c.with_schema.kind, c.without_schema.kind):
            # A Connect Decimal written as a JSON number (decimal.format=NUMERIC) reads as its
            # text here, which base64 cannot tell from a string: the Python path decodes it.
            number = _first_char(raw, c.name).isin("-", *"0123456789")
            checked = F.when(number, F.raise_error(F.lit(
                f"column {c.name}: a decimal written as a JSON number"))).otherwise(checked)
        refused = _refused(raw, value, c)
        if refused is not None:
            checked = F.when(refused.isNotNull(), F.raise_error(refused)).otherwise(checked)
        if checked is not decoded and c.with_schema.kind == "float":
            decoded = checked  # Java reads a quoted word as any string: checked all the same
        elif checked is not decoded:
            decoded = F.when(by_java, decoded).otherwise(checked)
        flag = unchanged(value) if c.raw_type == "string" else F.lit(False)
        flag = F.coalesce(flag, F.lit(False))
        out += [F.when(~flag, decoded).cast(c.out_type), flag]
    return out


def typed_images(changes: DataFrame, columns: Sequence[ColumnSpec]) -> DataFrame:
    """One row per change: its place, `op`, `time`, `pos`, whether it has each image
    (`_has_a`, `_has_b`), the images' typed values (`a`, `b`) and UNCHANGED flags (`ua`, `ub`).
    The expressions are built once per JVM (`expressions.per_jvm`)."""
    java = java_image_reader(changes.sparkSession, columns)
    return selected(changes, _image_steps(tuple(columns), java))


@per_jvm
def _image_steps(columns: tuple[ColumnSpec, ...], java: tuple[str, str] | None
                 ) -> tuple[list[Column | str], ...]:
    """The selects of `typed_images`, in order; `java` is `java_image_reader`'s."""
    has_schema = F.col("schema").isNotNull()
    names = [c.name for c in columns]
    # Each image parsed once, in a column of its own, whatever the expressions around its
    # fields: Spark does not share an expression between the branches of a `when`. Java reads
    # it where it can (`java_image_reader`), `from_json` where Java leaves it.
    steps: list[list[Column | str]] = []
    if java is None:
        steps.append(["*", _parsed(F.col("after_raw"), columns).alias("_pa"),
                      _parsed(F.col("before_raw"), columns).alias("_pb")])
        by_java_a = by_java_b = F.lit(False)
    else:
        function, spec = java
        steps.append([
            "*",
            F.call_function(function, F.col("after_raw").cast("binary"), F.lit(spec))
            .alias("_ja"),
            F.call_function(function, F.col("before_raw").cast("binary"), F.lit(spec))
            .alias("_jb")])
        steps.append([
            "*", F.coalesce(F.col("_ja"), _parsed(F.col("after_raw"), columns)).alias("_pa"),
            F.coalesce(F.col("_jb"), _parsed(F.col("before_raw"), columns)).alias("_pb")])
        by_java_a, by_java_b = F.col("_ja").isNotNull(), F.col("_jb").isNotNull()
    after = _image(F.col("after_raw"), F.col("_pa"), has_schema, columns, by_java_a)
    before = _image(F.col("before_raw"), F.col("_pb"), has_schema, columns, by_java_b)

    def struct(values: list[Column], at: int) -> Column:
        return F.struct(*[values[2 * i + at].alias(n) for i, n in enumerate(names)])

    steps.append(["file_index", "block", "row", "op", "time", "pos",
                  F.col("after_raw").isNotNull().alias("_has_a"),
                  F.col("before_raw").isNotNull().alias("_has_b"),
                  struct(after, 0).alias("a"), struct(after, 1).alias("ua"),
                  struct(before, 0).alias("b"), struct(before, 1).alias("ub")])
    return tuple(steps)


def typed_events(changes: DataFrame, columns: Sequence[ColumnSpec],
                 keys: Sequence[str]) -> DataFrame:
    """One row per keyed event: `k0..`, `is_delete`, `rank`, `a`/`b` (values), `ua`/`ub`
    (UNCHANGED flags), `problem` (set when the key cannot be told the Python way), `create`
    (op c: what a key move's create is, `moves.py`). The
    expressions are built once per JVM (`expressions.per_jvm`)."""
    return selected(typed_images(changes, columns), _event_steps(tuple(columns), tuple(keys)))


@per_jvm
def _event_steps(columns: tuple[ColumnSpec, ...], keys: tuple[str, ...]
                 ) -> tuple[list[Column | str], ...]:
    """The selects of `typed_events` over `typed_images`' rows, in order."""
    names = [c.name for c in columns]
    a, ua, b, ub = F.col("a"), F.col("ua"), F.col("b"), F.col("ub")

    def key_state(img: Column, flags: Column, present: Column) -> tuple[Column, Column]:
        """(usable, holds a null): usable when present and no key column is UNCHANGED."""
        no_unchanged = F.lit(True)
        some_null = F.lit(False)
        for k in keys:
            no_unchanged = no_unchanged & ~flags[k]
            some_null = some_null | img[k].isNull()
        return present & no_unchanged, present & no_unchanged & some_null

    a_ok, a_null = key_state(a, ua, F.col("_has_a"))
    b_ok, b_null = key_state(b, ub, F.col("_has_b"))
    a_key = [a[k] for k in keys]
    b_key = [b[k] for k in keys]
    key = [F.when(a_ok, ak).otherwise(bk) for ak, bk in zip(a_key, b_key, strict=True)]
    # The keys' equality as plain ANDs: a higher-order function (`F.reduce` over an array)
    # is interpreted, and takes the explode below out of whole-stage code generation.
    same_key = functools.reduce(lambda acc, x: acc & x, [
        ak.eqNullSafe(bk) for ak, bk in zip(a_key, b_key, strict=True)], F.lit(True))
    moved = (F.col("op") == "u") & b_ok & ~b_null & a_ok & ~a_null & ~same_key
    problem = (F.when(a_ok & a_null, "unsupported: a null key")
               .when(~a_ok & b_ok & b_null, "unsupported: a null key")
               .when(~a_ok & ~b_ok, "bad: cannot tell the key"))
    no_before = F.struct(*[F.lit(None).cast(c.out_type).alias(c.name) for c in columns])
    no_flags = F.struct(*[F.lit(False).alias(n) for n in names])

    def event(key_values: list[Column], is_delete: Column, before_values: Column,
              before_flags: Column) -> Column:
        return F.struct(*[v.alias(f"k{i}") for i, v in enumerate(key_values)],
                        is_delete.alias("is_delete"), before_values.alias("b"),
                        before_flags.alias("ub"))

    events = F.when(moved, F.array(event(b_key, F.lit(True), b, ub),
                                   event(a_key, F.lit(False), no_before, no_flags))) \
        .otherwise(F.array(event(key, F.col("op") == "d", b, ub)))
    return (["file_index", "block", "row", "time", "pos", "a", "ua",
             (F.col("op") == "c").alias("create"), problem.alias("problem"),
             F.explode(events).alias("ev")],
            ["file_index", "block", "row", "time", "pos", "problem",
             *[F.col(f"ev.k{i}").alias(f"k{i}") for i in range(len(keys))],
             "ev.is_delete", F.when(F.col("ev.is_delete"), 0).otherwise(1).alias("rank"),
             "a", "ua", "ev.b", "ev.ub", F.xxhash64("a", "ua").alias("content"), "create"])


TIED = "unsupported: two rows for one key at one position"


#: The keyed events one partition holds, about, at most. The conversion sorts a partition's
#: events (`java_convert`), so with a fixed number of partitions each task's sort (its
#: memory, its spills) grew with the batch: 11M Debezium events in the session's 8
#: partitions are 1.4M events a task. Measured neither faster nor slower at 1.1M and 11M
#: (benchmarks/README.md).
EVENTS_PER_PARTITION = 200_000


def partitions_for(spark: SparkSession, events: int) -> int:
    """How many partitions `by_key` spreads `events` keyed events over: the session's
    `spark.sql.shuffle.partitions`, or more, so that none holds over `EVENTS_PER_PARTITION`."""
    configured = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    return max(configured, -(-events // EVENTS_PER_PARTITION))


def by_key(events: DataFrame, keys: int, partitions: int) -> DataFrame:
    """`events` hash-partitioned by their key columns `k0..` (or their longs, `java_ready`)
    into `partitions` (see `partitions_for`). `java_convert` reads each key's events in
    one partition, which this partitioning serves, so they are shuffled once, here, when the
    conversion runs in the same job (`conversion.checked_conversion`)."""
    return events.repartition(partitions, *key_names(events.columns, keys))


def key_names(columns: Sequence[str], keys: int) -> list[str]:
    """The key columns of a frame with these `columns`: `k0..`, each as it is or as its two
    longs (`_as_longs`: `java_ready`, or YDB's Java parse, `java_ready_schema`)."""
    return [name for i in range(keys) for name in
            ((f"k{i}_long", f"k{i}_negative") if f"k{i}_long" in columns else (f"k{i}",))]


def checkpoint(frame: DataFrame) -> DataFrame:
    """`frame` checkpointed (`checkpoint.stored`), planned without adaptive execution: its
    shuffles then keep the partitions asked for (`by_key`), none coalesced, and the map side
    runs in the job that writes the checkpoint, not in a job of its own."""
    with settings(frame.sparkSession, NOT_ADAPTIVE):
        return stored(frame)


def problem_of(least: str | None, tied: bool | None) -> str | None:
    """The events' problem from two aggregates of `java_convert`'s report rows: the
    least of their `problem`s, else `TIED` when two writes of one key at one position hold
    different rows where the order would need their text, else None."""
    return least if least is not None else TIED if tied else None


def _table_rows(state: DataFrame, events: DataFrame, columns: Sequence[ColumnSpec],
                keys: Sequence[str]) -> DataFrame:
    """`state`'s rows as the key columns of `events` (`key_names`: a decimal(20,0) key as
    its longs where `java_ready` made them) and `st`, the row's columns cast to the output
    types."""
    types = {c.name: c.out_type for c in columns}
    present = {c.lower() for c in state.columns}
    table_rows = state.select(*[F.col(k).cast(types[k]).alias(f"k{i}")
                                for i, k in enumerate(keys)],
                              F.struct(*[state_column(present, c.name, c.out_type)
                                         .alias(c.name) for c in columns]).alias("st"))
    names = key_names(events.columns, len(keys))
    if names != [f"k{i}" for i in range(len(keys))]:
        table_rows = table_rows.select(*_longs_of_keys(table_rows, len(keys)), "st")
    return table_rows


def _with_state(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
                state: DataFrame | None) -> DataFrame:
    """`events` with `st`, their key's row in `state` (the table's current rows, one per key:
    its columns cast to the output types), or null. Joined by the events' key columns as
    they are (`key_names`: a decimal(20,0) key as its longs where `java_ready` made them)."""
    if state is None:
        return events.withColumn("st", F.lit(None).cast(
            "struct<" + ", ".join(f"{quote(c.name)}: {c.out_type}" for c in columns) + ">"))
    return events.join(_table_rows(state, events, columns, keys),
                       key_names(events.columns, len(keys)), "left")


#: The most truncates one batch of the Spark path converts: they are collected to the driver
#: (`debezium_path.debezium_changes`) and handed to every task of the conversion, so their
#: number is bounded; a batch with more goes to the Python path (which has its own bound,
#: `udf.run_converters.MAX_TRUNCATES`).
MAX_TRUNCATES = 1000

#: A truncate: its time and its position (longs, as `java_ready` makes them).
Truncate = tuple[int, tuple[int, ...]]


def truncates_text(truncates: Sequence[Truncate]) -> str:
    """`truncates` as `KeyedConversion.convert` reads them: `time:p0,p1,..` each, `;` between,
    in `(time, pos)` order, each once."""
    return ";".join(f"{t}:{','.join(str(p) for p in pos)}" for t, pos in sorted(set(truncates)))


def unchanged_before(events: DataFrame, columns: Sequence[ColumnSpec]) -> DataFrame:
    """`events` with `ub` (which columns the before image leaves UNCHANGED) all false where
    they come without it (YDB's events: `ydb_path._YDB_NOT_STORED`), as they are where they
    come with it."""
    if "ub" in events.columns:
        return events
    return events.withColumn("ub", F.struct(*[F.lit(False).alias(c.name) for c in columns]))


JVM_CONVERSION_CLASS = "changelake.jvm.KeyedConversion"

#: The element types of `pos` the Java conversion compares (Debezium's positions are longs,
#: YDB's `ts` steps Uint64 decimals).
JAVA_POSITIONS = ("bigint", "decimal(20,0)")


def java_convert(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
                 state: DataFrame | None, *, barriers: bool = False,
                 truncates: Sequence[Truncate] = ()) -> DataFrame:
    """`(data struct, time, diff)` of the events (already limited to the times to convert;
    `state`: the table's current rows, one per key), by the project's Java
    (`KeyedConversion.java`: one pass over each key's events, in the tasks), as
    `(data, time, diff, problem, tied, unrepeated, outside)`: the updates (the last four
    null), and in a partition whose events had a problem or a tie, one row with no data and
    diff 0 that holds them (`problem_of`): `tied` where two writes of one key at one position
    hold different rows, which the Python converter orders by their text. `events` may come
    `java_ready`.

    With `barriers`, YDB's barrier rule is checked too, for the events given: each has
    `_below` (it lies below the highest barrier read before it in its file), `_same` (a hash
    of its identity, `barriers.identity`, and its file), and `_outside`: a record below that
    lies outside the times converted, which is only counted (`outside`; the caller looks it
    up). `unrepeated` says that one below repeats no earlier record of its file
    (`KeyedConversion.java`).

    Its plan is made here (Java takes its rows as Spark's internal rows, below a plan of its
    own): `events` must already be partitioned by key (`by_key`), and the caller makes it
    without adaptive execution (`settings.NOT_ADAPTIVE`), so that the shuffle runs in the job
    that reads the result (`checkpoint`, or the lake commit's write:
    `conversion.checked_conversion`) rather than here.

    `truncates` (a Debezium batch's, at times in `[since, frontier)`, at most
    `MAX_TRUNCATES`): each is a delete of every key at its time and position, in the Java
    pass for the keys that have events (`KeyedConversion.java`'s class comment), and here,
    for the keys that only `state` holds: their rows are retracted at the first truncate's
    time, as `KeyedConverter._truncate` retracts the state's rows of keys it has not seen.
    Those keys are found by an anti-join on the executors, none collected."""
    from changelake.spark.jvm import java_class

    converter = java_class(events.sparkSession, JVM_CONVERSION_CLASS)
    ready, ordered, kcols = _ordered(events, columns, keys, state, barriers=barriers)
    converted = DataFrame(converter.convert(ordered._jdf, kcols, barriers,
                                            truncates_text(truncates)),
                          events.sparkSession)
    if not truncates or state is None:
        return converted
    names = key_names(ready.columns, len(keys))
    first = min(truncates)[0]
    untouched = _table_rows(state, ready, columns, keys).join(
        ready.select(*names), names, "left_anti")
    return converted.unionByName(untouched.select(
        F.col("st").alias("data"), F.lit(first).cast("bigint").alias("time"),
        F.lit(-1).cast("bigint").alias("diff"), F.lit(None).cast("string").alias("problem"),
        F.lit(None).cast("boolean").alias("tied"),
        F.lit(None).cast("boolean").alias("unrepeated"),
        F.lit(None).cast("bigint").alias("outside")))


def _ordered(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
             state: DataFrame | None, *, barriers: bool = False
             ) -> tuple[DataFrame, DataFrame, int]:
    """`events` `java_ready`, and as `KeyedConversion.java` reads them: with their key's row
    in `state` (`st`), in its columns' order, sorted within their partitions by key, time,
    position and rank; and how many key columns they have."""
    ready = java_ready(events, len(keys))
    with_state = unchanged_before(_with_state(ready, columns, keys, state), columns)
    kcols = [F.col(name) for name in key_names(ready.columns, len(keys))]
    rule = [F.col("_below").cast("boolean"), F.col("_same").cast("bigint"),
            F.col("_outside").cast("boolean")] if barriers else []
    ordered = with_state.select(
        *kcols, F.col("time").cast("bigint"), "pos",
        F.col("rank").cast("int"), F.col("is_delete").cast("boolean"), "a", "ua", "b", "ub",
        F.col("content").cast("bigint"), F.col("problem").cast("string"), "st", *rule)
    order = ordered.columns[:len(kcols) + 3]
    return ready, ordered.sortWithinPartitions(*order), len(kcols)


def java_removed(events: DataFrame, columns: Sequence[ColumnSpec], keys: Sequence[str],
                 state: DataFrame | None, *, truncates: Sequence[Truncate] = ()) -> DataFrame:
    """`(data struct, time, pos)`: the row each applied delete of `events` removed, as it
    stood just before, where its key had one (`KeyedConversion.removed`: the rules of
    `java_convert`, which `events` come as to it, partitioned by key; no updates). Positions
    come as `java_ready` makes them. `moves.py` hands a key move's to its create."""
    from changelake.spark.jvm import java_class

    converter = java_class(events.sparkSession, JVM_CONVERSION_CLASS)
    _, ordered, kcols = _ordered(events, columns, keys, state)
    return DataFrame(converter.removed(ordered._jdf, kcols, truncates_text(truncates)),
                     events.sparkSession)


def java_ready(events: DataFrame, keys: int) -> DataFrame:
    """`events` with their key columns and positions as the Java conversion sorts and
    compares them: each decimal(20,0) key as its two longs (`_as_longs`), the positions as
    longs (`_positions_as_longs`), the other columns as they are; as they come where they are
    so already. Positions are arrays of longs (Debezium's) or of Uint64s (YDB's); another
    type is `Unsupported`.

    Made before the shuffle by key (`conversion.checked_conversion`), so that a decimal(20,0),
    which Spark reads through a `BigDecimal` wherever it hashes, compares or converts one, is
    read once: the shuffle then hashes, moves and sorts longs (the decimals' hashing in the map
    side and their conversion before the sort in the reduce side were both among a YDB
    conversion's costs in a profile: benchmarks/README.md, "Fewer decimals, no row checksums,
    lighter YDB items"). YDB's Java parse makes its rows so itself
    (`java_ready_schema`), and they pass here as they are."""
    from pyspark.sql.types import ArrayType

    position = events.schema["pos"].dataType
    if not isinstance(position, ArrayType) \
            or position.elementType.simpleString() not in JAVA_POSITIONS:
        raise Unsupported(f"positions of type {position.simpleString()}, which the Java "
                          f"conversion does not compare")
    longs = _longs_of_keys(events, keys)
    taken = {f"k{i}" for i in range(keys)} | {"pos"} | set(key_names(events.columns, keys))
    return events.select(*longs, _positions_as_longs(position.elementType),
                         *[c for c in events.columns if c not in taken])


def java_ready_schema(schema: T.StructType, keys: int) -> T.StructType:
    """`schema` (a frame's with key columns `k0..` and `pos`) as `java_ready` makes it, each
    column in its place: each decimal(20,0) key as `k<i>_long` and `k<i>_negative`, positions
    of Uint64s as longs. A reader that makes its rows in this form itself (YDB's Java parse,
    `ydb.java_items`) spares the decimals from the parse to the conversion: each is read
    through a `BigDecimal` wherever Spark converts or compares one (a large share of the
    conversion's map side in a profile: benchmarks/README.md, "YDB's keys and positions made
    as longs by the parse")."""
    decimals = {f"k{i}" for i in range(keys)
                if schema[f"k{i}"].dataType.simpleString() == "decimal(20,0)"}
    fields: list[T.StructField] = []
    for field in schema.fields:
        if field.name in decimals:
            fields += [T.StructField(f"{field.name}_long", T.LongType()),
                       T.StructField(f"{field.name}_negative", T.BooleanType())]
        elif field.name == "pos" and field.dataType.simpleString() == "array<decimal(20,0)>":
            fields.append(T.StructField("pos", T.ArrayType(T.LongType())))
        else:
            fields.append(field)
    return T.StructType(fields)


def _longs_of_keys(frame: DataFrame, keys: int) -> list[Column]:
    """`frame`'s key columns as `java_ready` makes them (`_as_longs`; as they are where they
    are so already)."""
    return [long for i in range(keys) for long in (
        [F.col(f"k{i}_long"), F.col(f"k{i}_negative")] if f"k{i}_long" in frame.columns
        else _as_longs(f"k{i}", frame.schema[f"k{i}"].dataType))]


def _as_longs(name: str, kind: Any) -> list[Column]:
    """A key column as the Java conversion reads it: as it is, or, a decimal(20,0), as two
    columns, a long and whether the decimal is negative, equal exactly when the decimals are
    (the long: a negative decimal's value, `_flipped` of one in [0, 2^64)). Spark sorts and
    compares a decimal wider than a long as a `BigDecimal` built from its bytes, a long as a
    long; the conversion only needs each key's events together, not the keys in order."""
    column = F.col(name)
    if kind.simpleString() != "decimal(20,0)":
        return [column.alias(name)]
    negative = column < decimal_literal(0)
    return [F.when(negative & (column >= decimal_literal(_LEAST)), column.cast("bigint"))
            .otherwise(_flipped(column, name)).alias(f"{name}_long"),
            negative.alias(f"{name}_negative")]


def _flipped(value: Column, what: str) -> Column:
    """A decimal(20,0) in [0, 2^64) as the long of its 64 bits with the sign bit flipped:
    longs in the decimals' order. Outside: an error (no caller passes one: a Uint64 is read
    within its range, a decimal(20,0) within `_LEAST` and `_GREATEST`). Below 2^63 (every
    step and key of a real feed) that is the value cast to a long with its sign bit flipped;
    only above it does Spark subtract as decimals, a `BigDecimal` each."""
    half = decimal_literal(2**63)
    return F.when((value >= decimal_literal(0)) & (value < half),
                  flipped_long(value.cast("bigint"))) \
        .when(value.between(half, decimal_literal(_GREATEST)), (value - half).cast("bigint")) \
        .when(value.isNotNull(), F.raise_error(F.lit(f"{what}: beyond a decimal(20,0)")))


def flipped(value: int) -> int:
    """A Uint64 as `_flipped` makes it: the long of its 64 bits with the sign bit flipped."""
    if not 0 <= value < 2**64:
        raise ValueError(f"not a Uint64: {value}")
    return value + _SIGN_BIT


def flipped_long(value: Column) -> Column:
    """A non-negative long as `_flipped` makes a Uint64 of its value (its sign bit flipped)."""
    return value.bitwiseXOR(F.lit(_SIGN_BIT))


def long_positions(frame: DataFrame) -> bool:
    """Whether `frame`'s positions come as longs, as the Java conversion reads them (YDB's
    Uint64s `_flipped`: `java_ready_schema`), rather than as Uint64s (decimal(20,0))."""
    return frame.schema["pos"].dataType.simpleString() == "array<bigint>"


def uint64_positions(frame: DataFrame) -> DataFrame:
    """`frame` with its positions as Uint64s (decimal(20,0)) again where they come as the Java
    conversion reads them (`java_ready_schema`), for a step that compares them with YDB's
    barriers, which are Uint64s (`barriers.barrier_rule`)."""
    if not long_positions(frame):
        return frame
    return frame.withColumn("pos", F.transform(
        "pos", lambda x: (x.cast("decimal(20,0)") - decimal_literal(_SIGN_BIT))
        .cast("decimal(20,0)")))


def _positions_as_longs(element: Any) -> Column:
    """`pos` as the Java conversion sorts and compares it: longs as they are, Uint64s (YDB's
    `[step, txId]`, or a line's place) `_flipped`, each to one long (see `_as_longs`)."""
    if element.simpleString() != "decimal(20,0)":
        return F.col("pos")
    return F.transform("pos", lambda x: _flipped(x, "a position")).alias("pos")
