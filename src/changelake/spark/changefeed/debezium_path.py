"""A Debezium batch on the Spark path (PostgreSQL or MySQL payloads, with or without the schema
wrapper): read, parse, facts, times, frontier, types, keyed conversion.

The files are read on the executors (`read.py`) and parsed (`parse.py`: by the project's Java
line reader; a batch with a line it leaves goes to the Python path; `_parsed`) into a
checkpoint on the executors' disk (`checkpoint.stored`), and what the tasks gather of their
lines, observed by the same job (`_merged_facts`, no pass of their own), holds the lines to
UTF-8 and the line bound (`read.flaw`) and tells the later steps what they need of the batch.
The changes are timed with windows by transaction and by file block (`times.py`); the columns'
types are decided (`types.py`: the table schema, the state, the Debezium schema, else what
Spark's JSON inference over every image finds; that is found in any case, as it also finds
image columns beyond the table's: from the images' shapes, which the Java line reader gives and
the parse's job collects, `types.inferred_from_shapes`, else by the inference itself, one more
pass) and each image read against them once (`keyed.typed_images`: in Java where the image is
plain, else `from_json`); the keyed events are converted and checked by
`conversion.checked_conversion`; without keys, converted by their images (`unkeyed.py`); the
frontier comes from aggregates (`progress.py`). The driver sees one row per chunk of 2**16
lines (only when snapshot rows need the current time: `times.py`), a handful of aggregate rows,
and the images' distinct shapes (at most `DebeziumLine.SHAPES` a task; a few in a feed of one
table).

Truncates (op t) are changes like any other up to the conversion (times, frontier, marks),
then collected (`_truncates`: at most `keyed.MAX_TRUNCATES`, 1000, a batch) and handed to it:
keyed, each is a delete of every key at its time and position (`keyed.java_convert`); without
keys, each update is compensated at the next truncate (`unkeyed._compensated`), and the
table's rows before the batch (`state`) are retracted at the first (`_truncated_rows`).

Key moves (`moves.py`): where the parse saw a create that may hold Debezium's unavailable
placeholder (`placeheld`), each create of a key move takes the row its delete removed as its
before-image before the conversion, as `convert.upsert.key_moves` states.

Not covered yet (`Unsupported`: the Python path converts the batch, `pipeline.py`): non-default
`UpsertOptions`, any line the Java line reader leaves (`DebeziumLine.java`: any bad line
among them, a truncate with an image, logical messages), a key column that no image has, more
than 1000 truncates, a truncate without keys over a table (`since`) whose rows are not given
(`state`; the Python path refuses it too),
Kafka record dumps, Debezium key records, changes without a position (incremental snapshots),
two writes of one key with different rows at the greatest position it has reached (told apart
by a 64-bit hash of the row: `keyed.java_convert`), null keys, nested Connect types and logical
types other than Decimal and the temporal ones (`temporal.py`), Debezium schemas that
differ between lines other than by columns added or dropped or a widening (`_merged_connect`),
and the lenient mode (`strict=False`).

Where a covered batch may still differ from `encode_changefeed` (each shared with the Python
path unless said): a snapshot row read after a transaction that metadata finished is placed at
that transaction's time, not one above (`times.py`); a change arriving after a later time was
finished is converted, not refused; the table's rows are not checked for one row per key (the
Python path checks). This path only: a number beyond a double in a field no step reads
(`ts_ms`) is accepted, which orjson refuses. An image value of another JSON kind than its
column's, a number beyond a double or an integer beyond 64 bits in an image goes to the Python
path (`keyed._refused`), which holds the first value's kind to be the column's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F

from changelake.formats.tableschema import TableSchema
from changelake.spark.changefeed import times
from changelake.spark.changefeed.conversion import Converted, checked_conversion
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.keyed import MAX_TRUNCATES, ColumnSpec, typed_events
from changelake.spark.changefeed.moves import with_moves
from changelake.spark.changefeed.parse import java_items
from changelake.spark.changefeed.progress import debezium_frontier
from changelake.spark.changefeed.read import Lines
from changelake.spark.changefeed.steps import Steps, guard
from changelake.spark.changefeed.times import assign_times
from changelake.spark.changefeed.types import (
    SUPPORTED,
    Decoder,
    connect_decoder,
    image_fields,
    infer_images,
    inferred_from_shapes,
    spark_type,
    state_column,
)
from changelake.spark.changefeed.unkeyed import convert_images, image_events
from changelake.spark.checkpoint import stored
from changelake.spark.expressions import quote


def _first_problem(frame: DataFrame) -> str | None:
    row = guard(lambda: frame.where(F.col("problem").isNotNull())
                 .agg(F.min("problem")).first())
    return row[0] if row is not None else None


def _merged_facts(tasks: Sequence[Any]) -> dict[str, Any]:
    """What the later steps need to know of the batch, from the tasks' `parse.TASK_FACTS`
    rows: what aggregates over all of the parsed lines give (`flawed`, `changes`, the least
    and greatest `table` and `schema` of a change, ...; `tests/spark/test_spark_changefeed_jvm.py`
    holds them to such aggregates), with `_deferred` (the lines Java left) and `shapes`."""
    def pick(choose: Callable[..., Any], name: str) -> Any:
        values = [t[name] for t in tasks if t[name] is not None]
        return choose(values) if values else None

    first = min((t for t in tasks if t["first_row"] is not None), default=None,
                key=lambda t: (t["first_file_index"], t["first_block"], t["first_row"]))
    counts = ("flawed", "changes", "untimed", "by_tx", "metadata", "schemaless", "_deferred",
              "truncates", "placeheld")
    total = {n: sum(t[n] for t in tasks) for n in counts}
    return {
        "flawed": total["flawed"], "changes": total["changes"],
        "table": pick(min, "table"), "other_table": pick(max, "other_table"),
        "untimed": total["untimed"], "by_tx": total["by_tx"], "metadata": total["metadata"],
        "high": pick(max, "high"), "schema": pick(min, "schema"),
        "other_schema": pick(max, "other_schema"), "schemaless": total["schemaless"],
        "first": None if first is None else Row(after_raw=first["first_after"],
                                                 before_raw=first["first_before"],
                                                 schema=first["first_schema"]),
        "_deferred": total["_deferred"], "truncates": total["truncates"],
        "placeheld": total["placeheld"],
        "shapes": sorted({s for t in tasks for s in t["shapes"]})}


#: The parsed lines' columns that only the facts read: not stored in the checkpoint (the
#: file's name is `Lines.files[file_index]`), which is then a line's path and three fields
#: smaller on the executors' disk. The parse's job alone is a little faster; end to end the
#: difference is within the noise (benchmarks/README.md, "The floor of a keyed conversion").
_FACTS_ONLY = ("file", "flaw", "problem", "table")


def _parsed(lines: Lines) -> tuple[DataFrame, dict[str, Any]]:
    """The lines as Java reads them (`parse.java_items`), checkpointed (`checkpoint.stored`)
    without `_FACTS_ONLY`, and the batch's facts (`_merged_facts`) gathered by the same job,
    with `chunks`: the rows `times.chunks_of` would aggregate (one per chunk of lines that has
    a change), so that placing snapshot rows in time reads the checkpoint no more
    (`times.assign_times`' `chunk_rows`). `_deferred` counts the lines Java left: the caller
    hands such a batch to the Python path."""
    java = java_items(lines.bounded, chunk_bits=times.CHUNK_BITS)
    observed = Observation()
    tasks = F.collect_list("_facts").alias("tasks")  # one a task
    chunks = F.collect_list("_chunk").alias("chunks")  # one per chunk of 2**16 lines
    items = guard(lambda: stored(java.observe(observed, tasks, chunks).drop(
        "_deferred", "shape", "_chunk", "_facts", *_FACTS_ONLY)))
    return items, {**_merged_facts(observed.get["tasks"]), "chunks": observed.get["chunks"]}


def _column_names(first: Any, schema: TableSchema | None) -> list[str]:
    if schema is not None:
        return list(schema.names)
    image = first["after_raw"] if first["after_raw"] is not None else first["before_raw"]
    return _image_names(orjson.loads(image), image_fields(first["schema"]) or {})


def _image_names(raw: Any, fields: dict[str, Any]) -> list[str]:
    """An image's columns in the order `DebeziumParser._image` gives them: the line's schema
    order first, then any field it does not list."""
    return [*(n for n in fields if n in raw), *(n for n in raw if n not in fields)]


#: The most distinct (schema, image names) pairs a batch whose columns change may have; more
#: goes to the Python path.
MAX_SHAPES = 10_000


def _union_names(changes: DataFrame) -> list[str]:
    """Every image's columns in line order, each where it first appears (the columns
    `WindowedConverter._check_columns` grows to: a column a source's `ALTER TABLE ... ADD
    COLUMN` added mid-batch comes after the others; one it dropped stays). Read only when an
    image has a column the first image lacks: one aggregate over the checkpoint, a row per
    distinct (schema, names) pair of the batch to the driver."""
    sides = [changes.where(F.col(raw).isNotNull()).select(
        F.struct("file_index", "block", "row", F.lit(side).alias("side")).alias("place"),
        "schema", F.expr(f"json_object_keys({raw})").alias("names"))
        for side, raw in enumerate(("after_raw", "before_raw"))]
    rows = guard(lambda: sides[0].unionByName(sides[1]).groupBy("schema", "names")
                 .agg(F.min("place").alias("place")).limit(MAX_SHAPES + 1).collect())
    if len(rows) > MAX_SHAPES:
        raise Unsupported(f"unsupported: more than {MAX_SHAPES} image shapes in one batch")
    names: list[str] = []
    for row in sorted(rows, key=lambda r: tuple(r["place"])):
        for n in _image_names(row["names"], image_fields(row["schema"]) or {}):
            if n not in names:
                names.append(n)
    return names


def _merged_connect(changes: DataFrame, facts: Any) -> dict[str, Any] | None:
    """The batch's Connect field schemas by column. Where the lines' schemas differ (a source's
    `ALTER TABLE` while it streams), each column's field must be one in every schema that has
    it, or ones a lake widens (int8 .. int64, float32 and float64, without a logical name: the
    widest);
    anything else goes to the Python path, which reads each line by its own schema."""
    if facts["schema"] == facts["other_schema"] or \
            image_fields(facts["schema"]) == image_fields(facts["other_schema"]):
        return image_fields(facts["schema"])
    texts = guard(lambda: changes.select("schema").distinct().limit(MAX_SHAPES + 1).collect())
    if len(texts) > MAX_SHAPES or any(t["schema"] is None for t in texts):
        raise Unsupported("Debezium schemas that differ between lines")
    merged: dict[str, Any] = {}
    for text in texts:
        for name, f in (image_fields(text["schema"]) or {}).items():
            if name not in merged or _read_alike(merged[name], f):
                merged[name] = f
                continue
            wider = _wider(merged[name], f)
            if wider is None:
                raise Unsupported(f"Debezium schemas that differ between lines on column {name}")
            merged[name] = wider
    return merged


#: What of a Connect field says nothing of how its values are read (`connect_decoder`).
_NOT_READ = ("optional", "default", "doc")


def _read_alike(old: Any, new: Any) -> bool:
    def read(f: Any) -> Any:
        return {k: v for k, v in f.items() if k not in _NOT_READ}
    return bool(read(old) == read(new))


#: Connect types a lake widens, each family narrowest first.
_WIDENING = (("int8", "int16", "int32", "int64"), ("float32", "float64"))


def _wider(old: Any, new: Any) -> Any:
    """The wider of two plain (no logical name) Connect fields of one family, else None."""
    if old.get("name") or new.get("name"):
        return None
    for family in _WIDENING:
        if old.get("type") in family and new.get("type") in family:
            return max(old, new, key=lambda g: family.index(g["type"]))
    return None


def _columns(spark: SparkSession, changes: DataFrame, facts: Any, schema: TableSchema | None,
             state: DataFrame | None) -> list[ColumnSpec]:
    """Names and types (see `types.py`). The names are the table schema's, where drift (an
    image column beyond them) is a bad line; else the first image's, grown by any column a
    later image adds (`_union_names`: a source's `ALTER TABLE` while it streams), as the
    specification grows them (`WindowedConverter._check_columns`)."""
    if facts["first"] is not None:
        names = _column_names(facts["first"], schema)
    elif schema is not None:  # changes, none with an image: truncates
        names = list(schema.names)
    elif state is not None:
        names = list(state.columns)
    else:  # (a batch of no changes returns before)
        raise Unsupported("no row images in the batch")
    if len({n.lower() for n in names}) != len(names):  # Spark finds fields in any case
        raise Unsupported("column names that differ only in case")
    connect = _merged_connect(changes, facts)
    inferred = inferred_from_shapes(facts["shapes"]) if "shapes" in facts else None
    if inferred is None:
        images = changes.select(F.col("after_raw").alias("value")).where("value IS NOT NULL") \
            .unionByName(changes.select(F.col("before_raw").alias("value"))
                         .where("value IS NOT NULL"))
        inferred = {f.name: f.dataType.simpleString() for f in
                    guard(lambda: infer_images(spark, images)).fields}
    drift = [n for n in inferred if n not in names]
    if drift and schema is None and facts["first"] is not None:
        names = _union_names(changes)  # the columns grew mid-batch: an ALTER TABLE
        if len({n.lower() for n in names}) != len(names):
            raise Unsupported("column names that differ only in case")
    elif drift:
        raise Unsupported(f"bad: columns {drift} beyond the table's (schema drift)")
    stated = {f.name: f.dataType.simpleString() for f in state.schema.fields} \
        if state is not None else {}
    out = []
    for n in names:
        column = schema.column(n) if schema is not None else None
        with_schema, t1 = connect_decoder((connect or {}).get(n))
        without, t2 = connect_decoder(column.debezium if column is not None else None)
        if not facts["schemaless"] and column is None:
            without = with_schema  # every change carries its schema: nothing reads without
        if column is not None and column.type:
            kind = spark_type(column.type)
        elif stated.get(n) in SUPPORTED:
            kind = stated[n]
        elif connect is not None and t1 is not None and (t2 is None or t1 == t2):
            kind = t1
        elif t2 is not None and connect is None:
            kind = t2
        else:
            kind = inferred.get(n, "string")
        if kind not in SUPPORTED:
            raise Unsupported(f"column {n} of type {kind}")
        decoders = {d.kind for d in (with_schema, without)}
        raws = {d.raw_type for d in (with_schema, without)} - {None}
        if len(raws) > 1:
            raise Unsupported(f"column {n}: decoded two ways")
        raw = raws.pop() if raws else kind
        if raw != kind and kind != "string" and decoders != {"float"}:
            raise Unsupported(f"column {n}: a {kind} decoded from text")
        if decoders != {"plain"} and Decoder() in (with_schema, without):
            raise Unsupported(f"column {n}: decoded on some lines only")
        out.append(ColumnSpec(n, kind, raw, with_schema, without))
    return out


@dataclass(frozen=True)
class Timed:
    """A Debezium batch up to its conversion: what `debezium_changes` converts."""

    changes: DataFrame  # the changes with their times, below the frontier, from `since` on
    columns: list[ColumnSpec]  # the table's columns and how each image value is read
    frontier: int | None  # None: closed
    marks: DataFrame  # see `Converted.marks`
    size: int  # the changes parsed: the most `changes` can hold, before keys move
    truncates: int = 0  # the truncates parsed, `changes` holds at most as many
    placeheld: int = 0  # the creates parsed that may hold the placeholder (`moves.py`)


def debezium_timed(spark: SparkSession, lines: Lines, *,
                   table_schema: TableSchema | None = None, close: bool = False,
                   state: DataFrame | None = None, since: int | None = None,
                   steps: Steps | None = None) -> Timed:
    """Read, parse, facts, times, frontier and columns of a Debezium batch (see the module
    docstring), or `Unsupported`. Where the files are Kafka partitions (`lines.per_file`) and
    no transaction metadata is read, the high-water rule holds per partition: see
    `_partition_cap`."""
    steps = steps or Steps(spark)
    items, facts = _parsed(lines)
    steps.done("read + parse + facts")
    if facts["flawed"]:
        raise Unsupported("a line over the bound or not UTF-8")  # `convert_frames` names it
    if facts["_deferred"]:
        raise Unsupported(f"unsupported: {facts['_deferred']} line(s) the Java line reader "
                          "leaves (a shape it does not read, a truncate, a logical message, "
                          "a bad line, ...: `DebeziumLine.java`)")
    if facts["table"] != facts["other_table"]:
        raise Unsupported("bad: events of two tables")
    changes = items.where(F.col("kind") == "change")
    timed = assign_times(spark, changes, by_tx=bool(facts["by_tx"]),
                         untimed=int(facts["untimed"]), per_file=lines.per_file,
                         chunk_rows=facts.get("chunks"))
    frontier = None if close else debezium_frontier(timed, items, facts["high"],
                                                    bool(facts["metadata"]), facts["table"],
                                                    since)
    if frontier is not None and lines.per_file and not facts["metadata"]:
        frontier = _partition_cap(timed, frontier)
    marks = timed.select("file_index", "row", "kind", "time", "tx").unionByName(
        items.where(F.col("kind").isin("BEGIN", "END"))
        .select("file_index", "row", "kind", F.lit(None).cast("long").alias("time"), "tx"))
    steps.done("times + frontier")
    if not facts["changes"]:  # nothing to read columns from, nor to convert
        return Timed(timed, [], frontier, marks, 0)
    columns = _columns(spark, changes, facts, table_schema, state)
    steps.done("columns")
    if frontier is not None:
        timed = timed.where(F.col("time") < frontier)
    if since is not None:
        timed = timed.where(F.col("time") >= since)
    return Timed(timed, columns, frontier, marks, int(facts["changes"]), int(facts["truncates"]),
                 int(facts["placeheld"]))


def debezium_changes(spark: SparkSession, lines: Lines, *, keys: Sequence[str],
                     table_schema: TableSchema | None = None, close: bool = False,
                     state: DataFrame | None = None, since: int | None = None,
                     defer: bool = False) -> Converted:
    """A Debezium batch on the Spark path, or `Unsupported`. Without `keys`, the images are
    converted as they are (`unkeyed.py`). `defer`: see `checked_conversion`."""
    steps = Steps(spark)
    batch = debezium_timed(spark, lines, table_schema=table_schema, close=close, state=state,
                           since=since, steps=steps)
    if not batch.size:
        return Converted(_no_updates(spark, table_schema), batch.frontier, "jvm",
                         marks=batch.marks)
    truncates = _truncates(batch.changes) if batch.truncates else []  # no job without one
    changes = batch.changes.where(F.col("op") != "t") if truncates else batch.changes
    if not keys:
        if truncates and state is None and since is not None:
            raise Unsupported("unsupported: a truncate without keys over a table's earlier "
                              "rows, without them (`state`)")
        events = guard(lambda: stored(image_events(changes, batch.columns)))
        problem = _first_problem(events)
        if problem is not None:
            raise Unsupported(problem)
        converted = convert_images(events.where(F.col("problem").isNull()), truncates)
        if truncates and state is not None:  # consolidated with the batch's own
            converted = (converted.unionByName(_truncated_rows(state, batch.columns,
                                                               truncates))
                         .groupBy("data", "time").agg(F.sum("diff").alias("diff"))
                         .where(F.col("diff") != 0))
        return Converted(converted, batch.frontier, "jvm", marks=batch.marks)
    absent = [k for k in keys if k not in {c.name for c in batch.columns}]
    if absent:  # the encoder may still tell them from the key records, or names the line
        raise Unsupported(f"key columns {absent} that no image has")
    events = typed_events(changes, batch.columns, keys)
    keyed_truncates = [(t, pos) for t, pos, _ in truncates]
    if batch.placeheld:  # a create that may be a key move's (`moves.py`)
        events = with_moves(events, batch.columns, keys, state, truncates=keyed_truncates)
    converted, checks = checked_conversion(events, batch.columns, keys, state, batch.size,
                                           defer=defer, truncates=keyed_truncates)
    steps.done("events, ties, conversion")
    return Converted(converted, batch.frontier, "jvm", marks=batch.marks, checks=checks)


def _truncates(changes: DataFrame) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """The batch's truncates (the changes of op t, at the times converted): each distinct
    `(time, pos)` and the place `(file_index, block, row)` of its first line, at most
    `keyed.MAX_TRUNCATES` of them (more: `Unsupported`, the Python path converts the batch).
    Collected, bounded: the conversion hands them to every task."""
    rows = guard(lambda: changes.where(F.col("op") == "t").groupBy("time", "pos")
                 .agg(F.min(F.struct("file_index", "block", "row")).alias("place"))
                 .limit(MAX_TRUNCATES + 1).collect())
    if len(rows) > MAX_TRUNCATES:
        raise Unsupported(f"unsupported: more than {MAX_TRUNCATES} truncates in one batch")
    return sorted((int(r["time"]), tuple(int(p) for p in r["pos"]), tuple(r["place"]))
                  for r in rows)


def _truncated_rows(state: DataFrame, columns: Sequence[ColumnSpec],
                   truncates: Sequence[tuple[int, tuple[int, ...], tuple[int, ...]]]
                   ) -> DataFrame:
    """Without keys: the table's rows before the batch (`state`, one row per copy), each
    retracted at the first truncate's time. They are what `ImageConverter` would hold live
    there had it converted the table's whole history (the table is the sum of its updates):
    the batch's own updates are compensated by `unkeyed._compensated`."""
    present = {c.lower() for c in state.columns}
    first = min(time for time, _, _ in truncates)
    return state.select(
        F.struct(*[state_column(present, c.name, c.out_type).alias(c.name)
                   for c in columns]).alias("data"),
        F.lit(first).cast("bigint").alias("time"), F.lit(-1).cast("bigint").alias("diff"))


def _no_updates(spark: SparkSession, table_schema: TableSchema | None) -> DataFrame:
    """The updates of a batch without changes (heartbeats, tombstones, transaction lines), as
    the Python path gives them: none, of the table schema's columns (each of its stated type,
    else text), or of none without it (`lake.ingest.check_columns` then makes no table of
    it)."""
    fields = [] if table_schema is None else [
        f"{quote(c.name)}: {spark_type(c.type)}" for c in table_schema.columns]
    return spark.createDataFrame([], f"data struct<{', '.join(fields)}>, time bigint, "
                                     "diff bigint")


def _partition_cap(timed: DataFrame, frontier: int) -> int:
    """The high-water rule per Kafka partition. Debezium writes each partition in log order,
    so a partition whose highest time read is `h` has delivered everything it will hold below
    `h`; but the partitions are written independently, so an event below another partition's
    highest may still be on its way to this one. The batch's frontier is therefore at most the
    least of the partitions' highest times (of the partitions read from: one that brought
    nothing holds nothing back). With transaction metadata the ENDs count each transaction's
    events, wherever they are, and no cap is needed."""
    row = timed.groupBy("file_index").agg(F.max("time").alias("h")).agg(F.min("h")).first()
    return frontier if row is None or row[0] is None else min(frontier, int(row[0]))
