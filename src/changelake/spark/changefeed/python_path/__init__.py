"""The changefeed's Python path: raw Debezium / YDB lines into CDCv2 changes and a frontier, with
the pure-Python parsers and converters running inside Spark's Python workers.

The Spark path (`changefeed.pipeline`) converts what it covers with column expressions and hands
a batch it does not cover here, on the same executor-read lines. This path covers every line
`encode_changefeed` accepts, at the price of a Python call per line and per key group. Its
modules, a step each: `parse` (1, and the batch's columns), `progress` (2's barrier rule, 3),
`run_converters` (4, 5), and `values` (a value's Spark and Arrow form); this module runs them.

Input: a DataFrame of raw lines with `value` (the JSON text), `file` and `line` (as
`spark.read.text` plus `input_file_name()` and a line number give them; one file = one topic
partition, as for `encode --from`). Output (`ChangefeedFrames`): `changes` as `(data struct,
time long, diff long)` for the finished times, the `frontier` (times below it are finished;
None = closed), and `rejected` lines with the reason. The changes feed `changelake.spark.encoder`.

On this path the rules are the Python specification's own: the pure-Python pieces run inside
Spark, and the few rules that must be column expressions are written beside the Python rule
they restate, in `changelake.convert`, where a test compares the two on generated feeds
(`tests/convert/test_convert_spark_rules.py`). The Spark path states the rules again, in the
project's Java and column expressions; tests compare both paths with `encode_changefeed`
(`tests/spark/test_spark_changefeeds.py`) and the Java line readers with the parser
(`tests/spark/test_spark_changefeed_jvm.py`):

1. *Parse* (`parse.py`, `mapInPandas`, fully parallel): each line through `DebeziumParser` /
   `YdbParser`, into one row per item. Images, keys and positions travel pickled, so
   `UNCHANGED`, Uint64 beyond a long and NaN survive exactly. A line that does not parse, or a
   keyed event whose key cannot be told, becomes an error row; an update that moves its key
   becomes two rows (`split_moved_key`), one for each key's group; the key is `key_of`'s, and
   replays are told by `event_identity`.
2. *Times* that the sequential encoder derives from what came before are derived with windows
   in `(file, line)` order: an event the parser timed by its transaction (`Change.tx_timed`:
   MySQL GTIDs, PostgreSQL without `sequence`) takes the time of the transaction's first such
   event (`convert.base.spark_transaction_time`); a change without a time of its own
   (snapshot rows) takes the highest time before it, or 0 (the converters' `time_of`:
   `spark.changefeed.times.current_times`, over chunks of lines rather than one window).
   Each runs only when the batch has such a change. A YDB record below its partition's last
   barrier (ydb#6985) is rejected, unless it repeats an earlier event of its file
   (`event_identity`): each file's lines go through `PartitionFrontiers.check`
   (`convert.progress.barrier_violations`).
3. *Progress* (`progress.py`) is small and resolved on the driver with the encoder's own rules
   (`convert.progress.frontier_from` for Debezium, where a transaction before `since` holds
   nothing back; for YDB `PartitionFrontiers.frontier` over each file's last barrier,
   `convert.progress.ydb_frontier`).
4. *Convert* (`run_converters.py`): with keys, `groupBy(key)` — cogrouped with the `state`
   table's rows of the keys the batch touches, when one is given — and `applyInArrow`: each
   key's changes go through a fresh `KeyedConverter` whose `State` holds that key's row, which
   orders them, drops replays and stale events, resolves UNCHANGED from the state's row, and
   emits the updates at times below the frontier. Truncates reach every key's group, and the
   state rows of keys the batch does not touch (`mapInArrow`, no shuffle). A key move's create
   (`convert.upsert.key_moves`, found with column expressions) meets its delete in no group:
   the old keys' groups go first and give the rows their deletes removed, which the creates'
   groups take as their before-images (`run_converters._with_moves`). The state is joined
   by key in Spark (the batch's keys typed like the table's columns), so only the touched rows
   reach Python. Without keys, an `ImageConverter` per Arrow batch of distinct events.
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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from changelake.convert.base import SPARK_ORDER, spark_transaction_time
from changelake.convert.upsert import UpsertOptions
from changelake.errors import ChangefeedError, Location, SchemaError
from changelake.formats.change import Op
from changelake.formats.tableschema import TableSchema
from changelake.spark.changefeed.python_path.parse import PARSED_DDL, batch_columns, parse_partition
from changelake.spark.changefeed.python_path.progress import (
    barrier_check,
    debezium_frontier,
    ydb_frontier,
)
from changelake.spark.changefeed.python_path.run_converters import (
    as_data,
    convert_images,
    convert_keyed,
)
from changelake.spark.changefeed.times import current_times
from changelake.spark.checkpoint import stored

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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


def changes_in_time(spark: SparkSession, changes: DataFrame, *, by_tx: bool,
                    untimed: int) -> DataFrame:
    """Step 2's times, over parsed changes (`file`, `line`, `tx`, `time`, `op`, `tx_timed`):
    `by_tx` says some change is timed by its transaction, `untimed` how many have no time."""
    from pyspark.sql import functions as F

    if by_tx:
        changes = changes.withColumn("time", spark_transaction_time())
    return current_times(spark, changes, untimed=untimed, stream=SPARK_ORDER[:1],
                         row=SPARK_ORDER[1], one_per_row=False,
                         moves=F.when(F.col("op") != Op.MESSAGE.value, F.col("time")))


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
        lambda frames: parse_partition(source, schema, key_names, frames), PARSED_DDL)
    parsed = stored(parsed)  # parse once; everything below reads it several times
    errors = parsed.where(F.col("kind") == "error").select("file", "line", "error")

    changes = parsed.where(F.col("kind") == "change")
    # Which windows the batch needs, from the stored parse: most batches need neither. And
    # the table of the first change, where changes name more than one.
    needs = changes.agg(
        F.max(F.coalesce(F.col("tx_timed"), F.lit(False)) & F.col("tx").isNotNull())
        .alias("by_tx"),
        F.count(F.when(F.col("time").isNull(), 1)).alias("untimed"),
        F.count_distinct("tbl").alias("tables"),
        F.min_by("tbl", F.when(F.col("tbl").isNotNull(), F.struct("file", "line")))
        .alias("table")).first()
    if needs is not None and needs["tables"] > 1:
        changes, other = _one_table(changes, needs["table"])
        errors = errors.unionByName(other)
    if needs is not None:
        changes = changes_in_time(lines.sparkSession, changes, by_tx=bool(needs["by_tx"]),
                                  untimed=needs["untimed"])

    if source == "ydb":
        changes, late = barrier_check(parsed, changes)
        errors = errors.unionByName(late)
        frontier = ydb_frontier(parsed, lines)
    else:
        frontier = debezium_frontier(parsed, changes, since)
    if close:
        frontier = None
    if strict:
        _raise_first(errors)  # before converting: a bad line stops the batch anyway

    if since is not None:
        changes = changes.where(F.col("time") >= since)
    columns = batch_columns(schema, parsed, state)
    if options is not None:
        out = convert_keyed(changes, options, columns, frontier, state)
    else:
        out = convert_images(changes, columns, frontier)
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
    return ChangefeedFrames(as_data(data, columns), frontier, rejected)


def _one_table(changes: DataFrame, table: str) -> tuple[DataFrame, DataFrame]:
    """The changes of `table` (the first change's, in (file, line) order), and the others as
    errors: `encode_changefeed` refuses a change of a second table, one table a feed."""
    from pyspark.sql import functions as F

    other = F.col("tbl").isNotNull() & (F.col("tbl") != F.lit(table))
    reason = F.concat(F.lit(f"events of two tables, {table} and "), F.col("tbl"),
                      F.lit(": encode one table at a time"))
    return changes.where(~other), changes.where(other).select(
        "file", "line", reason.alias("error"))


def _raise_first(errors: DataFrame) -> None:
    """The first error by (file, line) as one `ChangefeedError`, saying how many more there
    are; an error of no line (a bad state) first of all."""
    from pyspark.sql import functions as F

    first = errors.orderBy(F.col("file").asc_nulls_first(), "line").limit(1).collect()
    if not first:
        return
    row = first[0]
    more = errors.count() - 1
    reason = row["error"] + (f" (and {more} more bad line{'s' * (more > 1)} found)"
                             if more else "")
    location = Location(row["file"], row["line"]) if row["file"] is not None else None
    raise ChangefeedError(reason, location)
