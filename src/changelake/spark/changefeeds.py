"""Changefeeds on Spark: raw Debezium / YDB lines into CDCv2 changes and a frontier.

Input: a DataFrame of raw lines with `value` (the JSON text), `file` and `line` (as
`spark.read.text` plus `input_file_name()` and a line number give them; one file = one topic
partition, as for `encode --from`). Output (`ChangefeedFrames`): `changes` as `(data struct,
time long, diff long)` for the finished times, the `frontier` (times below it are finished;
None = closed), and `rejected` lines with the reason. The changes feed `changelake.spark.encoder`.

Each rule is written once: the pure-Python pieces run inside Spark, and the few rules that
must be column expressions are written beside the Python rule they restate, in `convert`, where
a test compares the two on generated feeds (`tests/test_convert_spark_rules.py`):

1. *Parse* (`mapInPandas`, fully parallel): each line through `DebeziumParser` / `YdbParser`,
   into one row per item. Images, keys and positions travel pickled, so `UNCHANGED`, Uint64
   beyond a long and NaN survive exactly. A line that does not parse, or a keyed event whose
   key cannot be told, becomes an error row; an update that moves its key becomes two rows
   (`split_moved_key`), one for each key's group; the key is `key_of`'s, and replays are told
   by `event_identity`.
2. *Times* that the sequential encoder derives from what came before are derived with windows
   in `(file, line)` order: a transaction's time is that of its first event
   (`convert.base.spark_transaction_time`, the parser's rule for MySQL GTIDs and PostgreSQL
   without `sequence`); a change without a time of its own (snapshot rows) takes the highest
   time before it, or 0 (`convert.base.spark_current_time`, the converters' `time_of`). A YDB
   record below its partition's last barrier (ydb#6985) is rejected, unless it repeats an
   earlier event of its file (`event_identity`): each file's lines go through
   `PartitionFrontiers.check` (`convert.progress.barrier_violations`).
3. *Progress* is small and resolved on the driver with the encoder's own rules
   (`convert.progress.frontier_from` for Debezium; for YDB `PartitionFrontiers.frontier` over
   each file's last barrier, `convert.progress.ydb_frontier`).
4. *Convert*: with keys, `groupBy(key)` — cogrouped with the `state` table's rows of the keys
   the batch touches, when one is given — and `applyInArrow`: each key's changes go through a
   fresh `KeyedConverter` whose `State` holds that key's row, which orders them, drops replays
   and stale events, resolves UNCHANGED from the state's row, and emits the updates at times
   below the frontier. Truncates reach every key's group, and the state rows of keys the batch
   does not touch (`mapInArrow`, no shuffle). The state is joined by key in Spark (the batch's
   keys typed like the table's columns), so only the touched rows reach Python. Without keys,
   an `ImageConverter` per Arrow batch of distinct events.
5. *Failures* inside a worker (schema drift, a value that does not fit its column's Spark type,
   a truncate without keys, ...) are rows of the output with an `error`, never exceptions: the
   output is checkpointed once, and the driver raises the first as one `ChangefeedError`
   naming file and line (`strict`), or adds them to `rejected`. A problem with the state (two
   rows for a key) is raised either way: it is not a line that can be set aside.

Differences from `encode_changefeed`, from doing a batch at once:

* The state is the table's current rows only: a delete from before the batch is not
  remembered with its sequence, so the batch's events of a key apply over whatever the state
  holds (as `encode_changefeed` does with a `MemoryState` of the same rows). Events the state
  already reflects must be skipped by time: `since`.
* `strict=True` raises on the first bad line (lowest file, line), after the whole batch is
  parsed; lines that parse but fail conversion are only looked at when no line failed to
  parse. Nothing is returned then: nothing of the batch was consumed. `strict=False` converts
  everything else exactly as the encoder does in lenient mode.
* Columns are typed: a value that does not fit its column's type (the table schema's, else
  the state's, else the one number type that holds every number of the batch, else the kind
  of the column's first value) is a bad line here; the encoder, untyped, passes it through.
* Without a table schema the columns are those of the first image in `(file, line)` order;
  the encoder takes the first in the order its files were given. Likewise for a transaction's
  time: the first event's in `(file, line)` order here, the first parsed there.
* A change without a time of its own takes the highest time before it here; the encoder takes
  the frontier if that is later (a snapshot row after a transaction that its metadata
  completed, a YDB record without a virtual timestamp after barriers). YDB files are read one
  after another here, interleaved barrier by barrier there.
* A YDB record below its partition's last barrier is a replay here if it repeats an earlier
  event of its file; the encoder asks its converter (`is_replay`), which for keyed
  conversion also skips an event older than what its key already has.
* Times below the frontier are all emitted, the rest wait for a later batch; without keys a
  truncate is rejected (it needs the whole table's rows in one place).
* Not yet checked here: a change arriving after a later time was finished. The encoder refuses
  it (e.g. PostgreSQL without `sequence`, where a concurrent transaction's fallback time, its
  first LSN, is below that of one committed before it); here the whole batch is one window, so
  it is converted at its (wrong) time.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import orjson

from changelake.convert.base import spark_current_time, spark_transaction_time
from changelake.convert.images import ImageConverter, event_identity
from changelake.convert.progress import barrier_violations, frontier_from, ydb_frontier
from changelake.convert.upsert import (
    KeyedConverter,
    MemoryState,
    UpsertOptions,
    key_of,
    split_moved_key,
    unkeyed,
)
from changelake.errors import ChangefeedError, Location, SchemaError
from changelake.formats.change import (
    NAN,
    Change,
    Op,
    Resolved,
    Skipped,
    TxBoundary,
    _Unchanged,
)
from changelake.formats.debezium import DebeziumParser
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from changelake.spark.changefeed.types import spark_type
from changelake.spark.session import stored
from changelake.values import freeze

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame

PARSED_DDL = (
    "file string, line long, kind string, item binary, key binary, time long, tx string, "
    "tx_order long, end_count long, barrier long, pos binary, ident binary, op string, "
    "error string, tbl string, end_collections string"
)
#: Changes that carry no key and still mean something to keyed conversion (or nothing at all).
_KEYLESS = frozenset({Op.TRUNCATE, Op.MESSAGE, Op.TOMBSTONE})
REJECTED_DDL = "file string, line long, value string, reason string"


@dataclass(frozen=True)
class ChangefeedFrames:
    changes: DataFrame  # (data struct, time long, diff long), consolidated per (data, time)
    frontier: int | None  # times below it are finished; None: the stream is closed
    rejected: DataFrame  # (file, line, value, reason)

    @property
    def finished_through(self) -> int | None:
        """The argument `changelake.spark.encoder.encode` takes (-1: nothing finished yet)."""
        return None if self.frontier is None else self.frontier - 1


# --------------------------------------------------------------------------------- parsing


def _parser(source: str, schema: TableSchema | None) -> Any:
    return DebeziumParser(schema) if source == "debezium" else YdbParser(schema)  # type: ignore[arg-type]


def _parse_partition(source: str, schema: TableSchema | None, keys: Sequence[str] | None,
                     frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import pandas as pd

    parser = _parser(source, schema)
    names = [c.split()[0] for c in PARSED_DDL.split(", ")]
    seen = _Seen()
    for frame in frames:
        rows: list[dict[str, Any]] = []
        for value, file, line in zip(frame["value"], frame["file"], frame["line"], strict=True):
            base: dict[str, Any] = dict.fromkeys(names)
            base.update(file=file, line=int(line))
            try:
                item = parser.parse_line(value, Location(file, int(line)))
            except ChangefeedError as error:
                rows.append({**base, "kind": "error", "error": error.reason})
                continue
            if isinstance(item, Change):
                rows.extend(_change_rows(base, item, keys))
                seen.observe(item, file, int(line))
            elif isinstance(item, TxBoundary):
                rows.append({**base, "kind": item.status, "tx": item.id,
                             "end_count": item.event_count,
                             "end_collections": orjson.dumps(item.per_collection).decode()})
            elif isinstance(item, Resolved):
                rows.append({**base, "kind": "resolved", "barrier": item.frontier,
                             "pos": pickle.dumps(item.position)})
            else:
                assert isinstance(item, Skipped)
                rows.append({**base, "kind": "skipped"})
        yield pd.DataFrame(rows, columns=names)
    # What this partition saw of the columns: one row, merged on the driver (`_columns`).
    yield pd.DataFrame([{**dict.fromkeys(names), "kind": "columns",
                         "item": pickle.dumps(seen)}], columns=names)


@dataclass
class _Seen:
    """The columns of a partition's images: the first image's names (by file, line) and the
    kinds of every non-null value, so that a column's Spark type does not depend on which
    rows a sample happened to hold (a column null in the first rows is not a string)."""

    first: tuple[str, int, tuple[str, ...]] | None = None
    kinds: dict[str, set[str]] = field(default_factory=dict)
    firsts: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # by (file, line)

    def observe(self, change: Change, file: str, line: int) -> None:
        for image in (change.after, change.before):
            if image is None:
                continue
            if self.first is None or (file, line) < self.first[:2]:
                self.first = (file, line, tuple(image))
            for name, value in image.items():
                if value is not None and not isinstance(value, _Unchanged):
                    kind = _infer(value)
                    self.kinds.setdefault(name, set()).add(kind)
                    if name not in self.firsts or (file, line) < self.firsts[name][:2]:
                        self.firsts[name] = (file, line, kind)

    def merge(self, other: _Seen) -> None:
        if other.first is not None and (self.first is None or other.first < self.first):
            self.first = other.first
        for name, kinds in other.kinds.items():
            self.kinds.setdefault(name, set()).update(kinds)
        for name, first in other.firsts.items():
            if name not in self.firsts or first < self.firsts[name]:
                self.firsts[name] = first

    def kind(self, name: str) -> str | None:
        """The Spark type of a column (None: no value seen): the one numeric type that holds
        every number seen, else the kind of the first value (the odd values are bad lines)."""
        kinds = self.kinds.get(name)
        if not kinds:
            return None
        if len(kinds) > 1 and kinds <= {"bigint", "decimal(20,0)"}:
            return "decimal(20,0)"
        if len(kinds) > 1 and kinds <= {"bigint", "decimal(20,0)", "double"}:
            return "double"
        return self.firsts[name][2]


def _change_rows(base: dict[str, Any], change: Change,
                 keys: Sequence[str] | None) -> list[dict[str, Any]]:
    """One row per change; an update that moves its key is two (see `split_moved_key`), one
    for each key's group. A keyed event whose key cannot be told is an error row here, where
    its line is known, rather than a failure inside a group."""
    moved = split_moved_key(change, keys) if keys else None
    rows = []
    for part in moved or (change,):
        key = key_of(part, keys) if keys else None
        if keys and key is None and part.op not in _KEYLESS:
            return [{**base, "kind": "error", "error": unkeyed(part, keys).reason}]
        rows.append({**base, "kind": "change", "op": part.op.value, "item": pickle.dumps(part),
                     "key": pickle.dumps(_one_spelling(key)) if key is not None else None,
                     "time": part.time, "tx": part.transaction, "tx_order": part.tx_order,
                     "tbl": part.table, "pos": pickle.dumps(part.position),
                     "ident": pickle.dumps(event_identity(part))})
    return rows


def _one_spelling(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A key as the bytes Spark groups by: values Python holds equal (`1`, `1.0` and `True`;
    `0.0` and `-0.0`) pickle alike, so they reach one key's group, as they are one key to
    the converter's dicts."""
    def spell(value: Any) -> Any:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return tuple(spell(v) for v in key)


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
    state: DataFrame | None = None,
    since: int | None = None,
) -> ChangefeedFrames:
    """See the module docstring. `lines` needs `value`, `file` and `line` columns.

    `state`: the table's current rows (one per key, the table's columns by name), for keyed
    conversion: what `encode_changefeed(..., state=MemoryState(...))` gets from its `State`.
    `since`: the state already holds every change at times below it (a table committed up to
    that frontier), so those changes are replays and skipped. Without it, a re-delivered event
    would be applied over the state's newer row and the next change of its key would retract
    a row the table does not hold.
    Raises `ChangefeedError` naming file and line for the first bad line when `strict`;
    otherwise bad lines are in `rejected` and everything else is converted."""
    from pyspark.sql import functions as F

    schema = TableSchema.from_json(table_schema) if isinstance(table_schema, dict) \
        else table_schema
    if source not in ("debezium", "ydb"):
        raise SchemaError(f"unknown changefeed source {source!r}")
    if source == "ydb" and schema is None:
        raise SchemaError("YDB records name no columns: a table schema is required")
    if options is None:
        key_columns = tuple(keys) if keys else (schema.primary_key if schema else ())
        options = UpsertOptions(keys=key_columns) if key_columns else None
    if state is not None and options is None:
        raise SchemaError("a state is the current row of each key: give the key columns")
    key_names = options.keys if options is not None else None

    parsed = lines.select("value", "file", "line").mapInPandas(
        lambda frames: _parse_partition(source, schema, key_names, frames), PARSED_DDL)
    parsed = stored(parsed)  # parse once; everything below reads it several times
    errors = parsed.where(F.col("kind") == "error").select("file", "line", "error")

    changes = parsed.where(F.col("kind") == "change")
    changes = changes.withColumn("time", spark_transaction_time())
    changes = changes.withColumn("time", spark_current_time())

    if source == "ydb":
        changes, late = _barrier_check(parsed, changes)
        errors = errors.unionByName(late)
        frontier = _ydb_frontier(parsed, lines)
    else:
        frontier = _debezium_frontier(parsed, changes)
    if close:
        frontier = None
    if strict:
        _raise_first(errors)  # before converting: a bad line stops the batch anyway

    if since is not None:
        changes = changes.where(F.col("time") >= since)
    columns = _columns(schema, parsed, state)
    if options is not None:
        out = _convert_keyed(changes, options, columns, frontier, state)
    else:
        out = _convert_images(changes, columns, frontier)
    out = stored(out)  # converted once, so that its errors can be looked at
    failed = out.where(F.col("error").isNotNull()).select("file", "line", "error")
    if strict:
        _raise_first(failed)
    else:
        _raise_first(failed.where(F.col("file").isNull()))  # the state's, not a line's
        errors = errors.unionByName(failed)
    # One line, one reason (both halves of a moved key may fail).
    errors = errors.groupBy("file", "line").agg(F.min("error").alias("error"))
    data = out.where(F.col("error").isNull())
    if options is None:
        # Per-batch image converters: the same row may be inserted and retracted by two.
        data = data.groupBy(*[f"c{i}" for i in range(len(columns))], "time") \
            .agg(F.sum("diff").alias("diff")).where(F.col("diff") != 0)
    rejected = errors.join(lines.select("file", "line", "value"), ["file", "line"], "left") \
        .select("file", "line", "value", F.col("error").alias("reason"))
    return ChangefeedFrames(_as_data(data, columns), frontier, rejected)


def _raise_first(errors: DataFrame) -> None:
    """The first error by (file, line) as one `ChangefeedError`, saying how many more there
    are; an error of no line (a bad state) first of all."""
    from pyspark.sql import functions as F

    first = errors.orderBy(F.col("file").asc_nulls_first(), "line").limit(1).collect()
    if not first:
        return
    row = first[0]
    more = errors.count() - 1
    reason = row["error"] + (f" (and {more} more bad line{'s' * (more > 1)} found; "
                             "strict=False sets them aside)" if more else "")
    location = Location(row["file"], row["line"]) if row["file"] is not None else None
    raise ChangefeedError(reason, location)


def _debezium_frontier(parsed: DataFrame, changes: DataFrame) -> int | None:
    from pyspark.sql import functions as F

    high = changes.where(F.col("time").isNotNull()).agg(F.max("time")).first()[0]
    if high is None:
        return 0
    events = (changes.where(F.col("tx_order").isNotNull()).groupBy("tx")
              .agg(F.min("time").alias("time"), F.countDistinct("tx_order").alias("seen"),
                   F.first("tbl", ignorenulls=True).alias("tbl")))
    ends = (parsed.where(F.col("kind") == "END").groupBy("tx")
            .agg(F.first("end_count").alias("expected"),
                 F.first("end_collections").alias("collections")))
    txs = events.join(ends, "tx", "full_outer").collect()
    return frontier_from(high, ((r["time"], r["seen"] or 0, _expected(r)) for r in txs))


def _expected(row: Any) -> int | None:
    """END's count of the transaction's events of its table (`DebeziumProgress`'s rule)."""
    total = row["expected"]
    if total is None or row["tbl"] is None or not row["collections"]:
        return total
    per = dict(orjson.loads(row["collections"]))
    return per.get(row["tbl"], total)


def _ydb_frontier(parsed: DataFrame, lines: DataFrame) -> int:
    """`PartitionFrontiers.frontier` from each file's last barrier (`ydb_frontier`)."""
    from pyspark.sql import functions as F

    files = lines.select("file").distinct().count()
    last = parsed.where(F.col("kind") == "resolved").groupBy("file") \
        .agg(F.max_by("pos", "barrier").alias("pos")).collect()
    return ydb_frontier((pickle.loads(r["pos"]) for r in last), files)


def _barrier_check(parsed: DataFrame, changes: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Records below their partition's last barrier: `PartitionFrontiers.check`, per file
    (`barrier_violations`)."""
    import pandas as pd

    def check(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.sort_values("line", kind="stable")
        seen: set[bytes] = set()
        items = []
        for kind, ident, item, pos, line in zip(frame["kind"], frame["ident"], frame["item"],
                                                frame["pos"], frame["line"], strict=True):
            if kind == "resolved":
                items.append((line, Resolved(pickle.loads(pos)), False))
            else:
                items.append((line, pickle.loads(item), ident in seen))
                seen.add(ident)
        bad = barrier_violations(items)
        return pd.DataFrame({
            "file": pd.Series([frame["file"].iloc[0]] * len(bad), dtype=object),
            "line": pd.Series([b[0] for b in bad], dtype="int64"),
            "error": pd.Series([b[1] for b in bad], dtype=object)})

    from pyspark.sql import functions as F

    late = (parsed.where(F.col("kind").isin("resolved", "change"))
            .groupBy("file").applyInPandas(check, "file string, line long, error string"))
    kept = changes.join(late.select("file", "line"), ["file", "line"], "left_anti")
    return kept, late


def _columns(schema: TableSchema | None, parsed: DataFrame,
             state: DataFrame | None = None) -> list[tuple[str, str]]:
    """Column names and Spark types. The names are the table schema's, else those of the first
    image in (file, line) order, as the sequential encoder fixes them (a column beyond them is
    schema drift, an error at its line), else the state's. The types are the table schema's,
    else the state's (the table's, so that one batch's types cannot drift from the table's),
    else the one kind that holds every value of the batch (`_Seen.kind`)."""
    seen = _Seen()
    for row in parsed.where(parsed["kind"] == "columns").select("item").collect():
        seen.merge(pickle.loads(row["item"]))
    stated = {f.name: f.dataType.simpleString() for f in state.schema.fields} \
        if state is not None else {}
    if schema is not None:
        names = list(schema.names)
    elif seen.first is not None:
        names = list(seen.first[2])
    else:
        names = list(stated)
    typed = {c.name: c.type for c in schema.columns} if schema is not None else {}
    out = []
    for n in names:
        if typed.get(n):
            kind = spark_type(typed[n])
        elif stated.get(n) in _ARROW_TYPES:
            kind = stated[n]
        else:
            kind = seen.kind(n) or "string"
        out.append((n, kind))
    return out


def _infer(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint" if -(2**63) <= value < 2**63 else "decimal(20,0)"
    if isinstance(value, float):
        return "double"
    return "string"


def _fits(value: Any, kind: str) -> bool:
    """Can `value` (as parsed) go into a column of this Spark type? What Arrow would otherwise
    refuse inside a worker, with no line to name."""
    if value is None or isinstance(value, _Unchanged):
        return True
    if kind == "bigint":
        return type(value) is int and -(2**63) <= value < 2**63
    if kind == "decimal(20,0)":
        return type(value) is int and -(10**20) < value < 10**20
    if kind == "double":
        return type(value) in (int, float)
    if kind == "boolean":
        return type(value) is bool
    return isinstance(value, str)


def _misfit(change: Change, kinds: dict[str, str]) -> str | None:
    for what, image in (("after", change.after), ("before", change.before)):
        for name, value in (image or {}).items():
            kind = kinds.get(name)
            if kind is not None and not _fits(value, kind):
                return (f"column {name} of the {what} image is {value!r}, not a {kind} (the "
                        "column's type: the table schema's, the state's, or that of the "
                        "column's first value in the batch)")
    return None


def _from_spark(value: Any) -> Any:
    """A state value as the parsers give it: Uint64 columns are decimals in Spark."""
    import decimal

    return int(value) if isinstance(value, decimal.Decimal) else value


def _to_arrow(value: Any, kind: str) -> Any:
    import decimal

    if not _fits(value, kind):
        return None
    return decimal.Decimal(value) if kind.startswith("decimal") and value is not None else value


_OUTPUT_EXTRA = "time long, diff long, file string, line long, error string"


def _output(columns: list[tuple[str, str]]) -> str:
    fields = ", ".join(f"`c{i}` {kind}" for i, (_, kind) in enumerate(columns))
    return f"{fields}, {_OUTPUT_EXTRA}" if fields else _OUTPUT_EXTRA


def _as_data(frame: DataFrame, columns: list[tuple[str, str]]) -> DataFrame:
    from pyspark.sql import functions as F

    data = F.struct(*[F.col(f"c{i}").alias(name) for i, (name, _) in enumerate(columns)])
    return frame.select(data.alias("data"), "time", "diff")


def _arrow_type(kind: str) -> pa.DataType:
    import pyarrow as pa

    return {"bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
            "string": pa.string(), "decimal(20,0)": pa.decimal128(20, 0)}[kind]


_ARROW_TYPES = frozenset({"bigint", "double", "boolean", "string", "decimal(20,0)"})


@dataclass(frozen=True)
class _Failure:
    """A change that could not be converted: a row of the output with `error` set."""

    origin: Location | None
    reason: str


def _rows_table(updates: list[Any], columns: list[tuple[str, str]],
                failures: Sequence[_Failure] = ()) -> pa.Table:
    """Updates and failures as an Arrow table of flat columns. Arrow, not pandas: pandas would
    turn NaN into null on the way to Spark."""
    import pyarrow as pa

    n = len(updates) + len(failures)
    arrays = [pa.array([_to_arrow(data.get(name), kind) for data, _, _ in updates]
                       + [None] * len(failures), type=_arrow_type(kind))
              for name, kind in columns]
    origins = [f.origin or Location() for f in failures]
    arrays += [pa.array([t for _, t, _ in updates] + [None] * len(failures), type=pa.int64()),
               pa.array([d for _, _, d in updates] + [None] * len(failures), type=pa.int64()),
               pa.array([None] * len(updates) + [o.file for o in origins], type=pa.string()),
               pa.array([None] * len(updates) + [o.line for o in origins], type=pa.int64()),
               pa.array([None] * len(updates) + [f.reason for f in failures],
                        type=pa.string())]
    names = [*(f"c{i}" for i in range(len(columns))), "time", "diff", "file", "line", "error"]
    assert all(len(a) == n for a in arrays)
    return pa.Table.from_arrays(arrays, names=names)


def _change_at(item: bytes, time: Any) -> Change:
    """A parsed change with the time the windows gave it."""
    change = _restore(pickle.loads(item))
    return replace(change, time=int(time))


@dataclass(frozen=True)
class _KeyedJob:
    """Keyed conversion of one key's group, shipped to the workers: a fresh `KeyedConverter`
    per key, whose `State` holds the key's row from the state table (if any), so that the
    group converts exactly as the sequential encoder would with that state."""

    options: UpsertOptions
    columns: tuple[tuple[str, str], ...]
    stored: tuple[str, ...]  # the state columns, in order: the converter's output columns
    frontier: int | None
    truncates: tuple[Change, ...]

    def converter(self, rows: dict[Any, Any]) -> KeyedConverter:
        return KeyedConverter(self.options, columns=[n for n, _ in self.columns],
                              state=MemoryState(rows))

    def row(self, values: Sequence[Any]) -> Any:
        return freeze(dict(zip(self.stored, map(_from_spark, values), strict=True)),
                      fields=self.stored)

    def finish(self, converter: KeyedConverter, failures: list[_Failure]) -> pa.Table:
        try:
            for change in self.truncates:
                converter.push(change)
            updates = converter.advance(self.frontier)
        except ChangefeedError as error:
            updates = []
            failures.append(_Failure(error.location, error.reason))
        return _rows_table(updates, list(self.columns), failures)

    def group(self, changes: pa.Table, state: pa.Table | None) -> pa.Table:
        """One key: its changes and (cogrouped) its row in the state table."""
        key_column = changes.column("key") if changes.num_rows else state.column("key")
        key = pickle.loads(key_column[0].as_py())
        rows = {}
        if state is not None and state.num_rows:
            if state.num_rows > 1:
                return _rows_table([], list(self.columns), [_Failure(None, (
                    f"the state has {state.num_rows} rows for key {list(key)}: a table's "
                    "current state has one row per key"))])
            rows[key] = self.row([state.column(f"s{i}")[0].as_py()
                                  for i in range(len(self.stored))])
        converter = self.converter(rows)
        kinds = dict(self.columns)
        failures: list[_Failure] = []
        for item, time in zip(changes.column("item").to_pylist(),
                              changes.column("time").to_pylist(), strict=True):
            change = _change_at(item, time)
            misfit = _misfit(change, kinds)
            if misfit is not None:
                failures.append(_Failure(change.origin, misfit))
                continue
            try:
                converter.push(change)
            except ChangefeedError as error:
                failures.append(_Failure(error.location or change.origin, error.reason))
        return self.finish(converter, failures)

    def truncated(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """State rows of keys with no changes in the batch: only a truncate touches them."""
        index = [self.stored.index(k) for k in self.options.keys]
        for batch in batches:
            rows = {}
            for values in zip(*(batch.column(f"s{i}").to_pylist()
                                for i in range(len(self.stored))), strict=True):
                row = self.row(values)
                rows[tuple(freeze(_from_spark(values[i])) for i in index)] = row
            yield from self.finish(self.converter(rows), []).to_batches()


def _convert_keyed(changes: DataFrame, options: UpsertOptions, columns: list[tuple[str, str]],
                   frontier: int | None, state: DataFrame | None) -> DataFrame:
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]
    stored = KeyedConverter(options, columns=names).output_columns  # raises on bad key columns
    truncates = tuple(_change_at(r["item"], r["time"]) for r in
                      changes.where(F.col("op") == Op.TRUNCATE.value)
                      .select("item", "time").collect())
    job = _KeyedJob(options, tuple(columns), stored, frontier, truncates)
    keyed = changes.where(F.col("key").isNotNull()).select("key", "item", "time")
    if state is None:
        # Lambdas: Spark tells the kinds of grouped function apart by their parameters, and
        # counts a bound method's `self`.
        return keyed.groupBy("key").applyInArrow(lambda t: job.group(t, None),
                                                 _output(columns))

    kinds = dict(columns)
    missing = [n for n in stored if n not in state.columns]
    if missing:
        raise SchemaError(f"the state has no columns {missing} (it has {state.columns})")
    rows = state.select(*[F.col(n).cast(kinds[n]).alias(f"s{i}") for i, n in enumerate(stored)])
    # The batch's keys, typed like the state's columns, so the state is joined in Spark and
    # only the rows of keys the batch touches go through Python (unless there is a truncate).
    key_kinds = [kinds[k] for k in options.keys]
    key_ddl = ", ".join(f"k{i} {kind}" for i, kind in enumerate(key_kinds))

    def typed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            raw = batch.column("key").to_pylist()
            values = [pickle.loads(k) for k in raw]
            arrays = [pa.array(raw, type=pa.binary())]
            arrays += [pa.array([_to_arrow(v[i], kind) for v in values], type=_arrow_type(kind))
                       for i, kind in enumerate(key_kinds)]
            yield pa.RecordBatch.from_arrays(
                arrays, names=["key", *(f"k{i}" for i in range(len(key_kinds)))])

    batch_keys = keyed.select("key").distinct().mapInArrow(typed, f"key binary, {key_ddl}")
    on = [rows[f"s{stored.index(k)}"].eqNullSafe(batch_keys[f"k{i}"])
          for i, k in enumerate(options.keys)]
    matched = rows.join(batch_keys, on, "inner").select("key", *rows.columns)
    out = keyed.groupBy("key").cogroup(matched.groupBy("key")) \
        .applyInArrow(lambda t, s: job.group(t, s), _output(columns))
    if truncates:
        untouched = rows.join(batch_keys, on, "left_anti")
        out = out.unionByName(untouched.mapInArrow(job.truncated, _output(columns)))
    return out


def _convert_images(changes: DataFrame, columns: list[tuple[str, str]],
                    frontier: int | None) -> DataFrame:
    names = [n for n, _ in columns]
    kinds = dict(columns)

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            converter = ImageConverter(names)
            failures: list[_Failure] = []
            for item, time in zip(batch.column("item").to_pylist(),
                                  batch.column("time").to_pylist(), strict=True):
                change = _change_at(item, time)
                reason = _misfit(change, kinds)
                if reason is None and change.op is Op.TRUNCATE:
                    reason = "a truncate needs key columns on Spark"
                if reason is not None:
                    failures.append(_Failure(change.origin, reason))
                    continue
                try:
                    converter.push(change)
                except ChangefeedError as error:
                    failures.append(_Failure(error.location or change.origin, error.reason))
            try:
                updates = converter.advance(frontier)
            except ChangefeedError as error:
                updates = []
                failures.append(_Failure(error.location, error.reason))
            yield from _rows_table(updates, columns, failures).to_batches()

    # Identical events (replays) are one.
    return changes.dropDuplicates(["ident"]).select("item", "time") \
        .mapInArrow(convert, _output(columns))
