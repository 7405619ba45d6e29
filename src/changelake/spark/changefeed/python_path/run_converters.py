"""Step 4 of the Python path: the changes through the Python converters, keyed (`convert_keyed`:
a fresh `KeyedConverter` per key group, cogrouped with the state's rows of the keys the batch
touches; a key move's create given the row its delete removed, `_with_moves`) or by their
images (`convert_images`). A change that cannot be converted is a row
with an `error` (`Failure`, `rows_table`), never an exception inside a worker, so that the
driver can name its line.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from changelake.convert.images import ImageConverter
from changelake.convert.upsert import KeyedConverter, MemoryState, UpsertOptions
from changelake.errors import ChangefeedError, Location, SchemaError
from changelake.formats.change import Change, Op
from changelake.spark.changefeed.python_path.values import (
    arrow_type,
    change_at,
    from_spark,
    misfit,
    to_arrow,
)
from changelake.spark.changefeed.types import state_column
from changelake.spark.checkpoint import stored
from changelake.values import freeze

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


_OUTPUT_EXTRA = "time long, diff long, file string, line long, error string"


def output_ddl(columns: list[tuple[str, str]]) -> str:
    fields = ", ".join(f"`c{i}` {kind}" for i, (_, kind) in enumerate(columns))
    return f"{fields}, {_OUTPUT_EXTRA}" if fields else _OUTPUT_EXTRA


def as_data(frame: DataFrame, columns: list[tuple[str, str]]) -> DataFrame:
    from pyspark.sql import functions as F

    data = F.struct(*[F.col(f"c{i}").alias(name) for i, (name, _) in enumerate(columns)])
    return frame.select(data.alias("data"), "time", "diff")


@dataclass(frozen=True)
class Failure:
    """A change that could not be converted: a row of the output with `error` set."""

    origin: Location | None
    reason: str


def push(converter: KeyedConverter | ImageConverter, change: Change, refused: str | None,
         failures: list[Failure]) -> None:
    """`change` into `converter`, or, where it is `refused` (a reason found before) or the
    converter refuses it, a failure naming its line."""
    if refused is not None:
        failures.append(Failure(change.origin, refused))
        return
    try:
        converter.push(change)
    except ChangefeedError as error:
        failures.append(Failure(error.location or change.origin, error.reason))


def rows_table(updates: list[Any], columns: list[tuple[str, str]],
                failures: Sequence[Failure] = ()) -> pa.Table:
    """Updates and failures as an Arrow table of flat columns. Arrow, not pandas: pandas would
    turn NaN into null on the way to Spark."""
    import pyarrow as pa

    n = len(updates) + len(failures)
    arrays = [pa.array([to_arrow(data.get(name), kind) for data, _, _ in updates]
                       + [None] * len(failures), type=arrow_type(kind))
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


@dataclass(frozen=True)
class KeyedJob:
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
        return freeze(dict(zip(self.stored, map(from_spark, values), strict=True)),
                      fields=self.stored)

    def finish(self, converter: KeyedConverter, failures: list[Failure]) -> pa.Table:
        try:
            for change in self.truncates:
                converter.push(change)
            updates = converter.advance(self.frontier)
        except ChangefeedError as error:
            updates = []
            failures.append(Failure(error.location, error.reason))
        return rows_table(updates, list(self.columns), failures)

    def group(self, changes: pa.Table, state: pa.Table | None, *,
              removed: bool = False) -> pa.Table:
        """One key: its changes and (cogrouped) its row in the state table. A change with
        `moved` (a key move's create, `_with_moves`) takes that row as its before-image.
        `removed`: the rows the key's applied deletes removed (`REMOVED_DDL`), no updates."""
        key_column = changes.column("key") if changes.num_rows else state.column("key")
        key = pickle.loads(key_column[0].as_py())
        rows = {}
        if state is not None and state.num_rows:
            if state.num_rows > 1:
                if removed:  # the conversion's own pass reports it
                    return _removed_table({})
                return rows_table([], list(self.columns), [Failure(None, (
                    f"the state has {state.num_rows} rows for key {list(key)}: a table's "
                    "current state has one row per key"))])
            rows[key] = self.row([state.column(f"s{i}")[0].as_py()
                                  for i in range(len(self.stored))])
        converter = self.converter(rows)
        if removed:
            converter.removed = {}
        kinds = dict(self.columns)
        failures: list[Failure] = []
        moved = changes.column("moved").to_pylist() if "moved" in changes.column_names \
            else [None] * changes.num_rows
        for item, time, row in zip(changes.column("item").to_pylist(),
                                   changes.column("time").to_pylist(), moved, strict=True):
            change = change_at(item, time)
            refused = misfit(change, kinds)
            if row is not None and change.op is Op.CREATE:
                change = replace(change, before=dict(pickle.loads(row)))
            push(converter, change, refused, failures)
        if removed:
            try:
                for change in self.truncates:
                    converter.push(change)
                converter.advance(self.frontier)
            except ChangefeedError:
                pass  # the conversion's own pass names it
            return _removed_table(converter.removed or {})
        return self.finish(converter, failures)

    def truncated(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """State rows of keys with no changes in the batch: only a truncate touches them."""
        index = [self.stored.index(k) for k in self.options.keys]
        for batch in batches:
            rows = {}
            for values in zip(*(batch.column(f"s{i}").to_pylist()
                                for i in range(len(self.stored))), strict=True):
                row = self.row(values)
                rows[tuple(freeze(from_spark(values[i])) for i in index)] = row
            yield from self.finish(self.converter(rows), []).to_batches()


#: The rows a key's applied deletes removed (`KeyedJob.group`'s `removed`): at `time` and
#: `pos` (the position pickled, as the parse pickles it), `moved` the row pickled.
REMOVED_DDL = "time long, pos binary, moved binary"

#: The most key moves of one batch whose old key another move of it made: each takes one more
#: pass over the moved keys' groups (`_with_moves`).
MAX_CHAINED = 16


def _removed_table(removed: dict[Any, Any]) -> pa.Table:
    import pyarrow as pa

    at = list(removed)
    return pa.table({"time": pa.array([t for t, _ in at], type=pa.int64()),
                     "pos": pa.array([pickle.dumps(p) for _, p in at], type=pa.binary()),
                     "moved": pa.array([pickle.dumps(r) for r in removed.values()],
                                       type=pa.binary())})


def _key_moves(changes: DataFrame) -> DataFrame:
    """`(time, pos, old, new)`: the key moves among the keyed `changes` (`key`, `op`, `pos`,
    `time`: the parse's, pickled), as `convert.upsert.key_moves` finds them."""
    from pyspark.sql import functions as F

    deleted = F.col("op") == Op.DELETE.value
    marks = changes.where((F.col("pos") != F.lit(bytearray(pickle.dumps(None))))
                          & F.col("op").isin(Op.DELETE.value, Op.CREATE.value))
    grouped = marks.groupBy("time", "pos").agg(
        F.min(F.when(deleted, F.col("key"))).alias("old"),
        F.max(F.when(deleted, F.col("key"))).alias("old_last"),
        F.min(F.when(~deleted, F.col("key"))).alias("new"),
        F.max(F.when(~deleted, F.col("key"))).alias("new_last"))
    return grouped.where(F.col("old").isNotNull() & F.col("new").isNotNull()
                         & (F.col("old") == F.col("old_last"))
                         & (F.col("new") == F.col("new_last"))
                         & (F.col("old") != F.col("new"))).select("time", "pos", "old", "new")


def _with_moves(keyed: DataFrame, grouped: Any) -> DataFrame:
    """`keyed` (`key`, `item`, `time`, `op`, `pos`) with `moved`: for a key move's create,
    the row its delete removed (pickled), which `KeyedJob.group` takes as its before-image,
    as `KeyedConverter` does with both in one converter (`convert.upsert.key_moves`). The
    groups of each key are converted apart, so the old keys' groups go first, through
    `grouped(frame, removed=True)`, once more per move whose old key another move made (its
    row is made of that one's), up to `MAX_CHAINED`."""
    from pyspark.sql import functions as F

    moves = stored(_key_moves(keyed))
    if moves.isEmpty():
        return keyed
    chained = moves.alias("m").join(moves.alias("o"), F.col("m.old") == F.col("o.new"),
                                    "left_semi").count()
    if chained > MAX_CHAINED:
        raise ChangefeedError(
            f"more than {MAX_CHAINED} key moves of one batch whose old key another move made: "
            "each takes a pass of its own (rule: at most so many a batch); convert fewer "
            "files at once")
    sources = keyed.join(moves.select(F.col("old").alias("key")).distinct(), "key",
                         "left_semi")
    targets = moves.select("time", "pos", F.col("new").alias("key"))
    handed = None
    for _ in range(chained + 1):
        current = sources if handed is None else \
            sources.join(handed, ["time", "pos", "key"], "left")
        removed = grouped(current, removed=True)
        handed = stored(removed.join(targets, ["time", "pos"])
                        .select("time", "pos", "key", "moved"))
    assert handed is not None
    return keyed.join(handed, ["time", "pos", "key"], "left")


MAX_TRUNCATES = 10_000
"""The most truncates one batch of the Python path converts: each is collected to the driver and
shipped to every key's group (`KeyedJob.truncates`), so their number is bounded, not the
input's to decide; a batch with more is refused in one line at the first truncate beyond it
(a smaller batch is the way)."""


def _truncates(changes: DataFrame) -> tuple[Change, ...]:
    """The batch's truncates in (file, line) order, at most `MAX_TRUNCATES` of them collected
    (one more, to tell that there are more)."""
    from pyspark.sql import functions as F

    rows = (changes.where(F.col("op") == Op.TRUNCATE.value)
            .orderBy(F.col("file").asc_nulls_first(), "line")
            .select("item", "time", "file", "line").limit(MAX_TRUNCATES + 1).collect())
    if len(rows) > MAX_TRUNCATES:
        beyond = rows[-1]
        raise ChangefeedError(
            f"more than {MAX_TRUNCATES} truncates in one batch: each goes to every key's "
            "group, so their number is bounded (rule: at most so many truncates a batch); "
            "convert fewer files at once", Location(beyond["file"], beyond["line"]))
    return tuple(change_at(r["item"], r["time"]) for r in rows)


#: The columns of a key's changes that its group reads (and `moved`, where there is one).
_GROUPED = ("key", "item", "time")


def convert_keyed(changes: DataFrame, options: UpsertOptions, columns: list[tuple[str, str]],
                   frontier: int | None, state: DataFrame | None) -> DataFrame:
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]
    # Raises on bad key columns; a batch without a row image (heartbeats, tombstones) has no
    # columns to check, and nothing to convert, as for the encoder.
    stored = KeyedConverter(options, columns=names).output_columns if names else ()
    truncates = _truncates(changes)
    job = KeyedJob(options, tuple(columns), stored, frontier, truncates)
    keyed = changes.where(F.col("key").isNotNull()).select("key", "item", "time", "op", "pos")
    if state is None:
        # Lambdas: Spark tells the kinds of grouped function apart by their parameters, and
        # counts a bound method's `self`.
        def alone(frame: DataFrame, *, removed: bool = False) -> DataFrame:
            return frame.select(*_GROUPED, *(["moved"] if "moved" in frame.columns else [])) \
                .groupBy("key").applyInArrow(lambda t: job.group(t, None, removed=removed),
                                             REMOVED_DDL if removed else output_ddl(columns))

        return alone(_with_moves(keyed, alone))

    kinds = dict(columns)
    present = {c.lower() for c in state.columns}
    missing = [k for k in options.keys if k.lower() not in present]
    if missing:
        raise SchemaError(f"the state has no key columns {missing} (it has {state.columns})")
    rows = state.select(*[state_column(present, n, kinds[n]).alias(f"s{i}")
                          for i, n in enumerate(stored)])
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
            arrays += [pa.array([to_arrow(v[i], kind) for v in values], type=arrow_type(kind))
                       for i, kind in enumerate(key_kinds)]
            yield pa.RecordBatch.from_arrays(
                arrays, names=["key", *(f"k{i}" for i in range(len(key_kinds)))])

    batch_keys = keyed.select("key").distinct().mapInArrow(typed, f"key binary, {key_ddl}")
    on = [rows[f"s{stored.index(k)}"].eqNullSafe(batch_keys[f"k{i}"])
          for i, k in enumerate(options.keys)]
    matched = rows.join(batch_keys, on, "inner").select("key", *rows.columns)

    def with_state(frame: DataFrame, *, removed: bool = False) -> DataFrame:
        return frame.select(*_GROUPED, *(["moved"] if "moved" in frame.columns else [])) \
            .groupBy("key").cogroup(matched.groupBy("key")) \
            .applyInArrow(lambda t, s: job.group(t, s, removed=removed),
                          REMOVED_DDL if removed else output_ddl(columns))

    out = with_state(_with_moves(keyed, with_state))
    if truncates:
        untouched = rows.join(batch_keys, on, "left_anti")
        out = out.unionByName(untouched.mapInArrow(job.truncated, output_ddl(columns)))
    return out


def convert_images(changes: DataFrame, columns: list[tuple[str, str]],
                    frontier: int | None) -> DataFrame:
    names = [n for n, _ in columns]
    kinds = dict(columns)

    def convert(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            converter = ImageConverter(names)
            failures: list[Failure] = []
            for item, time in zip(batch.column("item").to_pylist(),
                                  batch.column("time").to_pylist(), strict=True):
                change = change_at(item, time)
                reason = misfit(change, kinds)
                if reason is None and change.op is Op.TRUNCATE:
                    reason = "a truncate needs key columns on Spark"
                push(converter, change, reason, failures)
            try:
                updates = converter.advance(frontier)
            except ChangefeedError as error:
                updates = []
                failures.append(Failure(error.location, error.reason))
            yield from rows_table(updates, columns, failures).to_batches()

    # Identical events (replays) are one.
    return changes.dropDuplicates(["ident"]).select("item", "time") \
        .mapInArrow(convert, output_ddl(columns))
