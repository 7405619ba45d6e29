"""Changefeed lines converted on Spark: by the Spark path where it covers the batch, else by the
Python path on the same lines. `convert_frames` is what `lake.ingest.ingest` converts with.

The promise: the consolidated updates and the frontier `encode_changefeed` gives for the same
lines (with the differences the two paths' modules list), or the first bad line named as the
encoder names it. The Spark path is one module per format, each a sequence of steps that are
modules of their own, every import pointing down (`tests/spark/test_spark_changefeed_imports.py`):

* `debezium_path.py` and `ydb_path.py`: a batch of one format, step by step;
* `conversion.py`: the keyed conversion both end in, checked by the job that reads it;
* `moves.py`: Debezium's key moves, each create given the row its delete removed, before it;
* the steps: `read.py` (the files, read on the executors), `parse.py` and `ydb.py` (the
  lines parsed by Java), `types.py` (the columns' types), `times.py`, `barriers.py` (YDB's barrier
  rule), `keyed.py` (the conversion), `unkeyed.py`, `progress.py` (the frontier);
* `steps.py`: what a failed step means, and each step's time.

Which batches the Spark path takes, and why the others go to the Python path, is
`dispatch.py`. What the Spark path does not cover raises `Unsupported` before anything is
returned (checked by aggregates over the parsed batch, and by Spark refusing a value; with
`defer`, the keyed conversion's checks when its updates are written), and `convert_lines`
then holds the lines
to the bounds (`read.Lines.check`, naming the first line out of them as the encoder does) and
hands the batch to the Python path, `spark.changefeed.python_path.changefeed_changes`, on the same
executor-read lines, which names bad lines as `encode_changefeed` does (with the differences
its docstring lists).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from changelake.formats.lines import TOO_LONG
from changelake.formats.tableschema import TableSchema, read_table_json
from changelake.spark.changefeed.conversion import Converted
from changelake.spark.changefeed.debezium_path import debezium_changes
from changelake.spark.changefeed.dispatch import Unsupported, choose, reason_before_reading
from changelake.spark.changefeed.parse import deferred_lines
from changelake.spark.changefeed.python_path.parse import rejected_lines
from changelake.spark.changefeed.read import Lines, flaw, read_lines
from changelake.spark.changefeed.steps import guard
from changelake.spark.changefeed.ydb import deferred_lines as ydb_deferred_lines
from changelake.spark.changefeed.ydb import ydb_columns
from changelake.spark.changefeed.ydb_path import ydb_changes


def convert_frames(spark: SparkSession, inputs: Sequence[str | Path], source: str,
                   key: Sequence[str], schema_file: Path | None, *,
                   state: DataFrame | None = None, since: int | None = None,
                   close: bool = False, python_path: bool = False, defer: bool = False,
                   reason: str | None = None) -> Converted:
    """Debezium or YDB JSON lines converted on Spark: consolidated updates and the frontier,
    by the Spark path where it applies, else the Python path on the same lines (see above).
    `python_path` takes the Python path whatever the batch (to compare the two: tests,
    benchmarks), and so does a `reason` (why: a deferred check failed, `defer`, see
    `checked_conversion`).
    `lake.ingest.ingest` converts with `defer`, the checks settled by its commit's write,
    and again with the `reason` they give where they fail.

    `state` holds the table's current rows (one per key): a keyed conversion takes a key's
    previous row from it, so an update or delete of a row committed earlier retracts it.
    Without keys (one row per copy), the Spark path retracts them at a truncate.
    `since` is the table's committed frontier: changes before it are already in `state`.
    `close`: the input is the whole feed, so every time in it is finished (the frontier is
    None); without it, the times the feed cannot show complete stay open."""
    from changelake.formats.materialize import expand_paths

    files = [str(p) for p in expand_paths([str(p) for p in inputs])]
    table_json = read_table_json(schema_file) if schema_file else None
    return convert_lines(spark, read_lines(spark, files), source, key, table_json,
                         state=state, since=since, close=close, python_path=python_path,
                         defer=defer, reason=reason)


def convert_lines(spark: SparkSession, lines: Lines, source: str, key: Sequence[str],
                  table_json: dict[str, Any] | None, *, state: DataFrame | None = None,
                  since: int | None = None, close: bool = False,
                  python_fallback: bool = True, python_path: bool = False, defer: bool = False,
                  reason: str | None = None) -> Converted:
    """`convert_frames` on lines already read. Without `python_fallback`, a batch the Spark
    path does not cover is only read by the Python path to name its first bad line
    (`ChangefeedError`);
    one without a bad line raises `Unsupported`: for Kafka partitions (`read.record_lines`),
    whose order across partitions the Python path, reading file after file, does not keep.
    With `python_path`, or a `reason`, the Python path converts the batch, whatever it holds.
    `defer`: the Spark path's keyed conversion is checked by the job that reads it
    (`Converted.checks`), not before it is returned."""
    schema = TableSchema.from_json(table_json) if table_json is not None else None
    keys = list(key) or (list(schema.primary_key) if schema is not None else [])
    if schema is not None:
        schema.check_keys(keys)  # as the encoder does, before a line is read

    def spark_path() -> Converted:
        if source == "ydb":
            assert schema is not None
            return ydb_changes(spark, lines, keys=keys, table_schema=schema, close=close,
                               state=state, since=since, defer=defer)
        return debezium_changes(spark, lines, keys=keys, table_schema=schema, close=close,
                                state=state, since=since, defer=defer)

    def on_python_path(why: str) -> Converted:
        # The Spark path's parse checks the bounds of a batch it converts; one it gives up on
        # (for whatever reason, a bad line included), or never reads, is checked here.
        lines.check()
        from changelake.spark.changefeed.python_path import changefeed_changes

        numbered = lines.numbered().select("value", "file", "line")
        frames = changefeed_changes(numbered, source=source,  # type: ignore[arg-type]
                                    keys=list(key) or None, table_schema=table_json,
                                    # without keys the Python path takes no state (a
                                    # truncate without keys it refuses)
                                    state=state if keys else None,
                                    since=since, close=close)
        changes = (frames.changes.groupBy("data", "time").agg(F.sum("diff").alias("diff"))
                   .where(F.col("diff") != 0))
        if not python_fallback:
            changes.count()  # the Python path names the first bad line, if there is one
            raise Unsupported(why)
        return Converted(changes, frames.frontier, "python-udf", why)

    return choose(spark_path, on_python_path, reason_before_reading(
        source, schema, keys, python_path=python_path, reason=reason))


def bad_lines(lines: Lines, source: str, table_json: dict[str, Any] | None,
              key: Sequence[str]) -> DataFrame:
    """The lines a lenient read sets aside before converting the rest: `file`, `file_index`,
    `row` and `reason`. A line over the bound or not UTF-8; and every line the Java line reader
    leaves (`parse.deferred_lines`, `ydb.deferred_lines`: few in a feed of the records the
    tools write) that the Python parser (`DebeziumParser`, `YdbParser`: the specification, in
    `mapInPandas`) rejects, with the reason the Python path gives it. What the conversion
    refuses later (a line Java leaves that the parser accepts, a value Spark cannot read, an
    image column beyond the table's) still stops the read: it is `Unsupported`, as is a YDB
    table the Spark path does not read (`ydb.ydb_columns`). Checkpointed: few rows in a good
    feed, read by the caller twice (to drop them, to report them)."""
    flawed = flaw(F.col("value"))
    schema = TableSchema.from_json(table_json) if table_json is not None else None
    shape = F.when(flawed == 1, F.lit(TOO_LONG)).when(flawed == 2, F.lit("not UTF-8 text"))
    first = lines.bounded.select("file", "file_index", "row", shape.alias("reason")) \
        .where(F.col("reason").isNotNull())
    if source == "ydb":
        if schema is None:
            raise Unsupported("unsupported: YDB without a table schema")
        keys = list(key) or list(schema.primary_key)
        deferred = ydb_deferred_lines(lines.frame, schema, ydb_columns(schema, keys))
    else:
        deferred = deferred_lines(lines.frame)
    deferred = deferred.select("file", "file_index", "row", "value")
    out = T.StructType([*deferred.drop("value").schema.fields,
                        T.StructField("reason", T.StringType())])
    parsed = deferred.mapInPandas(partial(rejected_lines, source, schema), out)
    return guard(lambda: first.unionByName(parsed).localCheckpoint())
