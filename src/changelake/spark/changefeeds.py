"""Changefeeds on Spark: raw Debezium / YDB lines into CDCv2 changes and a frontier.

Input: a DataFrame of raw lines with `value` (the JSON text), `file` and `line` (as
`spark.read.text` plus `input_file_name()` and a line number give them; one file = one topic
partition, as for `encode --from`). Output (`ChangefeedFrames`): `changes` as `(data struct,
time long, diff long)` for the finished times, the `frontier` (times below it are finished;
None = closed), and `rejected` lines with the reason. The changes feed `changelake.spark.encode`.

No rule is restated here; the pure-Python pieces run inside Spark:

1. *Parse* (`mapInPandas`, fully parallel): each line through `DebeziumParser` / `YdbParser`,
   into one row per item. Images, keys and positions travel pickled, so `UNCHANGED`, Uint64
   beyond a long and NaN survive exactly. A line that does not parse becomes a rejected row.
2. *Times* that the sequential encoder derives from what came before are derived with windows:
   a transaction's time is the minimum over its events (the first event's, for MySQL GTIDs and
   PostgreSQL without `sequence`); a change without a time of its own (snapshot rows) takes the
   highest time before it in `(file, line)` order, or 0. A YDB record below its partition's last
   barrier (ydb#6985) is rejected, unless it repeats an earlier line exactly.
3. *Progress* is small and resolved on the driver with the same rules as the encoder
   (`convert.progress.frontier_from` for Debezium, the minimum over files of the last barrier
   for YDB).
4. *Convert* (`groupBy(key).applyInPandas`): each key's changes go through a fresh
   `KeyedConverter` (or, without keys, through an `ImageConverter` per table-less group of
   identical events), which orders them, drops replays and stale events, resolves UNCHANGED,
   and emits the updates at times below the frontier. Truncates reach every key's group.

Differences from `encode_changefeed`, from doing a batch at once: there is no state from before
the batch (keyed conversion starts empty); `strict=True` raises on the first rejected line
(lowest file, line) only after the whole batch is parsed; times below the frontier are all
emitted, the rest wait for a later batch; without keys a truncate is rejected (it needs the
whole table's rows in one place).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from changelake.convert.images import ImageConverter
from changelake.convert.progress import frontier_from
from changelake.convert.upsert import KeyedConverter, UpsertOptions
from changelake.errors import ChangefeedError, Location, SchemaError
from changelake.formats.change import NAN, Change, Op, Resolved, Skipped, TxBoundary, _Unchanged
from changelake.formats.debezium import DebeziumParser
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from changelake.values import freeze

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame

PARSED_DDL = (
    "file string, line long, kind string, item binary, key binary, time long, tx string, "
    "tx_order long, end_count long, barrier long, pos binary, ident binary, error string"
)
REJECTED_DDL = "file string, line long, value string, reason string"
_SPARK_TYPES = {"Bool": "boolean", "Float": "double", "Double": "double", "Uint64":
                "decimal(20,0)"}
_LONGS = frozenset({"Int8", "Int16", "Int32", "Int64", "Uint8", "Uint16", "Uint32",
                    "Interval", "Interval64"})


@dataclass(frozen=True)
class ChangefeedFrames:
    changes: DataFrame  # (data struct, time long, diff long), consolidated per (data, time)
    frontier: int | None  # times below it are finished; None: the stream is closed
    rejected: DataFrame  # (file, line, value, reason)

    @property
    def finished_through(self) -> int | None:
        """The argument `changelake.spark.encode.encode` takes (-1: nothing finished yet)."""
        return None if self.frontier is None else self.frontier - 1


def spark_type(kind: str | None) -> str:
    """The Spark SQL type of a column by its YDB type name (plain JSON: strings otherwise)."""
    if kind is None:
        return "string"
    base = kind.removeprefix("Optional<").removesuffix(">").rstrip("?")
    if base in _LONGS:
        return "bigint"
    return _SPARK_TYPES.get(base, "string")


# --------------------------------------------------------------------------------- parsing


def _parser(source: str, schema: TableSchema | None) -> Any:
    return DebeziumParser(schema) if source == "debezium" else YdbParser(schema)  # type: ignore[arg-type]


def _key_of(change: Change, keys: Sequence[str] | None) -> Any:
    if not keys:
        return None
    for image in (change.key, change.after, change.before):
        if image is not None and all(k in image for k in keys):
            return tuple(freeze(image[k]) for k in keys)
    return None


def _parse_partition(source: str, schema: TableSchema | None, keys: Sequence[str] | None,
                     frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import pandas as pd

    parser = _parser(source, schema)
    for frame in frames:
        rows: list[dict[str, Any]] = []
        for value, file, line in zip(frame["value"], frame["file"], frame["line"], strict=True):
            row: dict[str, Any] = {"file": file, "line": int(line), "kind": None, "item": None,
                                   "key": None, "time": None, "tx": None, "tx_order": None,
                                   "end_count": None, "barrier": None, "pos": None,
                                   "ident": None, "error": None}
            try:
                item = parser.parse_line(value, Location(file, int(line)))
            except ChangefeedError as error:
                row["kind"], row["error"] = "error", error.reason
                rows.append(row)
                continue
            if isinstance(item, Change):
                row.update(kind="change", item=pickle.dumps(item), time=item.time,
                           tx=item.transaction, tx_order=item.tx_order,
                           pos=pickle.dumps(item.position),
                           ident=pickle.dumps((item.position, item.op.value, freeze(item.key),
                                               freeze(item.before), freeze(item.after))))
                key = _key_of(item, keys)
                row["key"] = pickle.dumps(key) if key is not None else None
            elif isinstance(item, TxBoundary):
                row.update(kind=item.status, tx=item.id, end_count=item.event_count)
            elif isinstance(item, Resolved):
                row.update(kind="resolved", barrier=item.frontier, pos=pickle.dumps(item.position))
            else:
                assert isinstance(item, Skipped)
                row["kind"] = "skipped"
            rows.append(row)
        yield pd.DataFrame(rows, columns=[c.split()[0] for c in PARSED_DDL.split(", ")])


def _restore(change: Change) -> Change:
    """Pickling turns the NAN singleton into a fresh NaN: bring the singleton back."""
    def fix(image: Any) -> Any:
        if image is None:
            return None
        return {k: NAN if isinstance(v, float) and v != v else v for k, v in image.items()}

    return Change(change.op, fix(change.key), fix(change.before), fix(change.after),
                  change.position, change.time, change.transaction, change.table,
                  change.origin, change.snapshot, change.tx_order, change.message)


# ---------------------------------------------------------------------------------- driver


def changefeed_changes(
    lines: DataFrame,
    *,
    source: Literal["debezium", "ydb"],
    keys: Sequence[str] | None = None,
    table_schema: TableSchema | dict[str, Any] | None = None,
    close: bool = False,
    strict: bool = True,
    options: UpsertOptions | None = None,
) -> ChangefeedFrames:
    """See the module docstring. `lines` needs `value`, `file` and `line` columns."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    schema = TableSchema.from_json(table_schema) if isinstance(table_schema, dict) \
        else table_schema
    if source == "ydb" and schema is None:
        raise SchemaError("YDB records name no columns: a table schema is required")
    if source not in ("debezium", "ydb"):
        raise SchemaError(f"unknown changefeed source {source!r}")
    if options is None:
        key_columns = tuple(keys) if keys else (schema.primary_key if schema else ())
        options = UpsertOptions(keys=key_columns) if key_columns else None
    key_names = options.keys if options is not None else None

    parsed = lines.select("value", "file", "line").mapInPandas(
        lambda frames: _parse_partition(source, schema, key_names, frames), PARSED_DDL)
    parsed = parsed.localCheckpoint()  # parse once; everything below reads it several times
    errors = parsed.where(F.col("kind") == "error").select("file", "line", "error")

    changes = parsed.where(F.col("kind") == "change")
    in_order = Window.orderBy("file", "line").rowsBetween(Window.unboundedPreceding, -1)
    by_tx = Window.partitionBy("tx")
    changes = changes.withColumn(
        "time", F.when(F.col("tx").isNotNull() & F.col("time").isNotNull(),
                       F.min("time").over(by_tx)).otherwise(F.col("time")))
    changes = changes.withColumn("_now", F.coalesce(F.max("time").over(in_order), F.lit(0)))
    changes = changes.withColumn("time", F.coalesce("time", "_now")).drop("_now")

    if source == "ydb":
        changes, late = _barrier_check(parsed, changes)
        errors = errors.unionByName(late)
        frontier = _ydb_frontier(parsed, lines)
    else:
        frontier = _debezium_frontier(parsed, changes)
    if close:
        frontier = None

    rejected = errors.join(lines.select("file", "line", "value"), ["file", "line"]) \
        .select("file", "line", "value", F.col("error").alias("reason"))
    if strict:
        first = rejected.orderBy("file", "line").limit(1).collect()
        if first:
            row = first[0]
            raise ChangefeedError(row["reason"], Location(row["file"], row["line"]))

    columns = _columns(schema, changes)
    if options is not None:
        data = _convert_keyed(changes, options, columns, frontier)
    else:
        data = _convert_images(changes, columns, frontier)
    return ChangefeedFrames(data, frontier, rejected)


def _debezium_frontier(parsed: DataFrame, changes: DataFrame) -> int | None:
    from pyspark.sql import functions as F

    high = changes.where(F.col("time").isNotNull()).agg(F.max("time")).first()[0]
    if high is None:
        return 0
    events = (changes.where(F.col("tx_order").isNotNull()).groupBy("tx")
              .agg(F.min("time").alias("time"), F.countDistinct("tx_order").alias("seen")))
    ends = (parsed.where(F.col("kind") == "END").groupBy("tx")
            .agg(F.first("end_count").alias("expected")))
    txs = events.join(ends, "tx", "full_outer").collect()
    return frontier_from(high, ((r["time"], r["seen"] or 0, r["expected"]) for r in txs))


def _ydb_frontier(parsed: DataFrame, lines: DataFrame) -> int:
    from pyspark.sql import functions as F

    files = lines.select("file").distinct().count()
    barriers = parsed.where(F.col("kind") == "resolved").groupBy("file") \
        .agg(F.max("barrier").alias("b")).collect()
    if len(barriers) < files:
        return 0
    return min(r["b"] for r in barriers)


def _barrier_check(parsed: DataFrame, changes: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Records below their partition's last barrier: the sequential check, per file."""
    import pandas as pd

    def check(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.sort_values("line")
        last: Any = None
        seen: set[bytes] = set()
        bad = []
        for kind, item, pos, line in zip(frame["kind"], frame["ident"], frame["pos"],
                                         frame["line"], strict=True):
            position = pickle.loads(pos) if pos is not None else None
            if kind == "resolved":
                last = position if last is None or position > last else last
            elif kind == "change":
                replay = item in seen
                seen.add(item)
                if (last is not None and position is not None and position < last
                        and not replay):
                    bad.append((line, f"record at ts {list(position)} arrives after resolved "
                                      f"{list(last)} in the same partition: the feed broke its "
                                      "barrier guarantee (see ydb#6985)"))
        return pd.DataFrame({
            "file": pd.Series([frame["file"].iloc[0]] * len(bad), dtype=object),
            "line": pd.Series([b[0] for b in bad], dtype="int64"),
            "error": pd.Series([b[1] for b in bad], dtype=object)})

    from pyspark.sql import functions as F

    late = (parsed.where(F.col("kind").isin("resolved", "change"))
            .groupBy("file").applyInPandas(check, "file string, line long, error string"))
    kept = changes.join(late.select("file", "line"), ["file", "line"], "left_anti")
    return kept, late


def _columns(schema: TableSchema | None, changes: DataFrame) -> list[tuple[str, str]]:
    """Column names and Spark types: the table schema's, else (and for untyped columns) the
    kind of the first value seen in a sample of images."""
    sample: dict[str, Any] = {}
    names: list[str] = list(schema.names) if schema is not None else []
    if schema is None or any(c.type is None for c in schema.columns):
        for row in changes.select("item").limit(500).collect():
            change = pickle.loads(row["item"])
            for image in (change.after, change.before):
                for name, value in (image or {}).items():
                    if name not in names:
                        names.append(name)
                    if sample.get(name) is None and value is not None \
                            and not isinstance(value, _Unchanged):
                        sample[name] = value
    typed = {c.name: c.type for c in schema.columns} if schema is not None else {}
    return [(n, spark_type(typed[n]) if typed.get(n) else _infer(sample.get(n))) for n in names]


def _infer(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint" if -(2**63) <= value < 2**63 else "decimal(20,0)"
    if isinstance(value, float):
        return "double"
    return "string"


def _output(columns: list[tuple[str, str]]) -> str:
    fields = ", ".join(f"`c{i}` {kind}" for i, (_, kind) in enumerate(columns))
    return f"{fields}, time long, diff long"


def _as_data(frame: DataFrame, columns: list[tuple[str, str]]) -> DataFrame:
    from pyspark.sql import functions as F

    data = F.struct(*[F.col(f"c{i}").alias(name) for i, (name, _) in enumerate(columns)])
    return frame.select(data.alias("data"), "time", "diff")


def _rows_table(updates: list[Any], columns: list[tuple[str, str]]) -> pa.Table:
    """Updates as an Arrow table of flat columns. Arrow, not pandas: pandas would turn NaN
    into null on the way to Spark."""
    import decimal

    import pyarrow as pa

    out: dict[str, list[Any]] = {f"c{i}": [] for i in range(len(columns))}
    out["time"], out["diff"] = [], []
    for data, time, diff in updates:
        for i, (name, kind) in enumerate(columns):
            value = data.get(name)
            if kind.startswith("decimal") and value is not None:
                value = decimal.Decimal(value)
            out[f"c{i}"].append(value)
        out["time"].append(time)
        out["diff"].append(diff)
    types = {"bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
             "string": pa.string(), "decimal(20,0)": pa.decimal128(20, 0)}
    arrays = [pa.array(out[f"c{i}"], type=types[kind]) for i, (_, kind) in enumerate(columns)]
    arrays += [pa.array(out["time"], type=pa.int64()), pa.array(out["diff"], type=pa.int64())]
    return pa.Table.from_arrays(arrays, names=[*(f"c{i}" for i in range(len(columns))),
                                               "time", "diff"])


def _convert_keyed(changes: DataFrame, options: UpsertOptions,
                   columns: list[tuple[str, str]], frontier: int | None) -> DataFrame:
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]
    truncates = [pickle.loads(r["item"]) for r in
                 changes.where(F.col("key").isNull()).select("item").collect()]
    truncates = [c for c in truncates if c.op is Op.TRUNCATE]
    keyless = changes.where(F.col("key").isNull())
    unkeyed = [pickle.loads(r["item"]) for r in keyless.select("item").limit(1).collect()]
    bad = [c for c in unkeyed if c.op not in (Op.TRUNCATE, Op.MESSAGE, Op.TOMBSTONE)]
    if bad:
        raise ChangefeedError(f"cannot tell the key {list(options.keys)} of this event",
                              bad[0].origin)

    def convert(table: pa.Table) -> pa.Table:
        converter = KeyedConverter(options, columns=names)
        for item, time in zip(table.column("item").to_pylist(),
                              table.column("time").to_pylist(), strict=True):
            change = _restore(pickle.loads(item))
            converter.push(Change(change.op, change.key, change.before, change.after,
                                  change.position, int(time), change.transaction, change.table,
                                  change.origin, change.snapshot, change.tx_order,
                                  change.message))
        for change in truncates:
            converter.push(change)
        return _rows_table(converter.advance(frontier), columns)

    out = (changes.where(F.col("key").isNotNull()).select("key", "item", "time")
           .groupBy("key").applyInArrow(convert, _output(columns)))
    return _as_data(out, columns)


def _convert_images(changes: DataFrame, columns: list[tuple[str, str]],
                    frontier: int | None) -> DataFrame:
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            converter = ImageConverter(names)
            for item, time in zip(batch.column("item").to_pylist(),
                                  batch.column("time").to_pylist(), strict=True):
                change = _restore(pickle.loads(item))
                if change.op is Op.TRUNCATE:
                    raise ChangefeedError("a truncate needs key columns on Spark",
                                          change.origin)
                converter.push(Change(change.op, change.key, change.before, change.after,
                                      change.position, int(time), origin=change.origin))
            yield from _rows_table(converter.advance(frontier), columns).to_batches()

    # Identical events (replays) are one.
    unique = changes.dropDuplicates(["ident"]).select("item", "time")
    out = unique.mapInArrow(convert, _output(columns))
    out = out.groupBy(*[f"c{i}" for i in range(len(columns))], "time") \
        .agg(F.sum("diff").alias("diff")).where(F.col("diff") != 0)
    return _as_data(out, columns)
