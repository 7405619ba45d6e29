"""The ingest core: what `changelake ingest` runs on files, and what the ingests from Kafka
topics and `--follow` build on (`decode_materialize`, `commit_input`). The lake's other
commands as functions are `api.py`.

    ingest(lake, table, inputs, key=..., source=..., schema=...)  -> IngestReport

Ingest reads the input, decodes it with the Spark decoder (Materialize CDC) or converts it with
the Spark changefeed converter (Debezium, YDB), and commits the updates between the table's
committed frontier and the input's (see `Table.commit`), so running it again on the same or
overlapping input changes nothing. A changefeed's keyed conversion is checked by the commit's
own write (`conversion.DeferredChecks`), not by a checkpoint of its updates before it; where a
check fails, that write's files are removed and the Python path converts the batch and commits
(a table the first attempt created keeps its columns: the two paths decide them alike).
`kafka_ingest.ingest_topics` is the same from Kafka
topics (`ingest --kafka`), through `decode_materialize` and `commit_input` here, with the
topics' offsets recorded by the commit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.convert.progress import changefeed_waiting_reason
from changelake.errors import InputError, LakeError, SchemaError
from changelake.formats.tableschema import read_table_json
from changelake.lake.catalog import Lake
from changelake.lake.identifier import TableIdentifier, check_name
from changelake.lake.key_rule import KeyRuleError, Locate, check_one_row_per_key
from changelake.lake.layout import SourceOffsets
from changelake.lake.schema import META_COLUMNS
from changelake.lake.table import (
    DEFAULT_BUCKETS,
    CommitResult,
    ProgressFn,
    TableWriter,
    frontier_int,
)
from changelake.protocol import Antichain
from changelake.protocol.reader import waiting_reason
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.pipeline import Converted, convert_frames
from changelake.spark.errors import translate_errors

# ---------------------------------------------------------------------------------- ingest


@dataclass(frozen=True, slots=True)
class IngestReport:
    table: str
    created: bool
    commit: CommitResult
    frontier: list  # the input's frontier (Antichain JSON)
    waiting_for: str | None = None
    """Why the input's frontier stops where it does (None: the input closed the stream):
    updates at and beyond it stay uncommitted until more input, or `close`, finishes them."""
    rejected: int = 0


def _starts_with(path: str, magic: bytes) -> bool:
    with open(path, "rb") as fo:
        return fo.read(len(magic)) == magic


def materialize_frames(spark: SparkSession, inputs: Sequence[str | Path],
                       schema_file: Path | None) -> tuple[DataFrame, DataFrame, str | None]:
    """(updates, progress) DataFrames of Materialize CDC files, as `decode` takes them, and,
    unless `schema_file` typed them, where their columns came from (for a refusal of them).

    The executors parse the files (the `materialize-cdc` data source); nothing is collected.
    The Avro schema is the `schema_file`, else the first container file's own. JSON lines with
    neither are read as canonical JSON text and typed by Spark's JSON schema inference over the
    rows (field names sorted, as the schemaless codec orders them).
    """
    from changelake.formats.materialize import OCF_MAGIC, expand_paths, load_schema
    from changelake.spark.decode_files import read_messages_frame
    from changelake.spark.decoder import split_messages
    from changelake.spark.json_schema import infer_json_schema

    cdc = load_schema(Path(schema_file)) if schema_file else None
    files = [str(p) for p in expand_paths([str(p) for p in inputs])]
    if not files:
        raise InputError("no input files")
    first_avro = next((f for f in files if _starts_with(f, OCF_MAGIC)), None)
    typed = cdc is not None or first_avro is not None
    messages = read_messages_frame(spark, files, schema=cdc,
                                   data_as="struct" if typed else "json")
    updates, progress = split_messages(messages)
    if typed:
        return updates, progress, None if cdc is not None else (
            f"the input's columns are those of its first Avro file's own schema: {first_avro}")
    inferred = translate_errors(lambda: infer_json_schema(updates.select("data")))
    if not inferred.fields:
        raise InputError("no updates with columns in the input, and no --schema to type them")
    return updates.withColumn("data", F.from_json("data", inferred)), progress, (
        "the input's columns were inferred from its JSON values, which carry no schema: give "
        "the log's Avro schema with --schema; `changelake changes --schema-out FILE` writes "
        "the table's")


def flatten(updates: DataFrame) -> DataFrame:
    """(data struct, time, diff) -> the table's columns, `_time`, `_diff`. A data column
    named as one of the lake's own (`schema.META_COLUMNS`) is refused, naming it: it would
    be a second `_time` or `_diff` beside the row's time and diff."""
    for name in updates.schema["data"].dataType.fieldNames():
        if name.lower() in META_COLUMNS:
            raise SchemaError(
                f"the input has a data column named {name!r}, a name the lake keeps for its "
                f"own columns ({', '.join(META_COLUMNS)}); rename the column at the source "
                "(or in the feed's schema) before ingesting it")
    return updates.select("data.*", F.col("time").alias("_time"), F.col("diff").alias("_diff"))


def check_columns(changes: DataFrame, existing: bool, schema_option: str, read: str) -> None:
    """A new table is created with the columns of the changes' rows: a changefeed batch
    without row images (heartbeats, tombstones, transaction lines; an empty file) has none,
    unless the table schema (`schema_option`) named them, and no table is made of it.
    `read` names what was read, for the refusal."""
    if not existing and not changes.schema["data"].dataType.fields:
        raise InputError(f"no row images in {read} (only heartbeats, tombstones or "
                         f"transaction boundaries, or nothing), and no {schema_option} to "
                         "type the table's columns")


def named(inputs: Sequence[str | Path], shown: int = 3) -> str:
    """The inputs as a refusal names them: the first few, and how many more."""
    names = [str(i) for i in inputs]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def ingest(lake: Lake, table: str | TableIdentifier, inputs: Sequence[str | Path], *,
           key: Sequence[str] = (), source: str = "materialize", schema: Path | None = None,
           buckets: int = DEFAULT_BUCKETS, progress: ProgressFn | None = None,
           scd2: bool = False, close: bool = False) -> IngestReport:
    """Decode or convert `inputs` and commit what is new to `table` (created if missing, keyed
    by `key`, with an SCD type 2 history view if `scd2`). Exactly once: see the module
    docstring.

    What is committed stops at the input's frontier, and the report says why it stops there
    (`IngestReport.waiting_for`). A changefeed cannot show its last transaction complete, so
    that one waits for more input, unless `close` says the input is the whole feed (as
    `encode --from ... --close` does). A Materialize CDC log says for itself when it closes:
    `close` is refused for it.

    One writer at a time, end to end: the table's writer lock is held from reading the
    committed state, through the conversion (which takes a key's previous row from that state)
    and the creation of a missing table, to the commit; so two ingests at once, or an ingest
    and a compaction, commit one after the other, each on what the other committed."""
    if source not in ("materialize", "debezium", "ydb"):
        raise LakeError(f"unknown input kind {source!r}: materialize, debezium or ydb")
    if close and source == "materialize":
        raise LakeError("close is for changefeeds (debezium, ydb): a Materialize CDC log "
                        "closes itself with a progress statement whose upper is []")
    handle = lake.handle(table)
    for column in key:
        check_name(column, f"table {handle.name}: key column")
    spark = lake.spark
    step = progress or (lambda _d, _i, _n: None)
    step("waiting for the table's writer lock", 0, 3)
    with handle.writer() as writer, ExitStack() as cleanup:
        key = writer.ingest_key(key) if source == "materialize" else writer.changefeed_key(
            key, read_table_json(schema) if schema is not None else None)
        existing = writer.state is not None
        committed = writer.state.upper if writer.state is not None else 0
        step("reading input", 1, 3)
        if source == "materialize":
            updates_df, progress_df, typed_by = materialize_frames(spark, inputs, schema)
            start = Antichain([committed]) if committed is not None else Antichain([0])
            decoded = decode_materialize(updates_df, progress_df, start, cleanup)
            step("committing", 2, 3)
            try:
                result = commit_input(writer, decoded, key=key, buckets=buckets, scd2=scd2)
            except (SchemaError, LakeError) as error:  # the input's columns refused
                if existing and typed_by and not isinstance(error, KeyRuleError):
                    raise type(error)(f"{error.reason} ({typed_by})", error.location) from None
                raise
        else:
            # The table's previous rows come from the table itself (a keyed table's upserts
            # by key; any table's truncate), at the state read under the lock.
            state = writer.current() if existing else None
            since = committed if existing else None

            def convert_and_commit(reason: str | None) -> tuple[DecodedInput, CommitResult]:
                converted = translate_errors(convert_frames, spark, inputs, source, key,
                                             schema, state=state, since=since, close=close,
                                             defer=reason is None, reason=reason)
                check_columns(converted.changes, existing, "--schema", named(inputs))
                decoded = changefeed_input(converted, source, committed)
                step("committing", 2, 3)
                checks = converted.checks
                result = commit_input(writer, decoded, key=key, buckets=buckets, scd2=scd2,
                                      write=None if checks is None else checks.write)
                if checks is not None and result.skipped:
                    checks.settle(read=False)
                return decoded, result

            try:
                decoded, result = convert_and_commit(None)
            except Unsupported as why:
                # A check the commit's write settled failed (its files are removed, nothing
                # committed): the Python path converts the batch, as it would have before.
                decoded, result = convert_and_commit(str(why))
    step("done", 3, 3)
    return IngestReport(handle.name, not existing, result, decoded.upper.to_json(),
                        decoded.waiting)


@dataclass(frozen=True, slots=True)
class DecodedInput:
    """An input decoded (or converted) against a table: its `rows` (the table's columns,
    `_time`, `_diff`) of the frontier interval `[lower, upper)`, and why `upper` stops where
    it does (None: the input closed the stream)."""

    rows: DataFrame
    lower: Antichain
    upper: Antichain
    waiting: str | None
    one_row_per_key: bool = False
    """The rows are built one per key and time (a changefeed's conversion): a keyed table's
    commit need not check them (`key_rule.py`)."""
    locate: Locate | None = None
    """Where an update of the input is, for the key check's error."""


def changefeed_input(converted: Converted, source: str, committed: int | None) -> DecodedInput:
    """A converted changefeed against a table committed through `committed` (None: closed).
    Changefeed times are log positions (sparse), so no gap can be told from the times; the
    input is taken to continue the committed history (Debezium re-delivers from the committed
    offset), and what is before the committed frontier is skipped."""
    frontier = converted.frontier
    return DecodedInput(
        flatten(converted.changes), Antichain([committed if committed is not None else 0]),
        Antichain() if frontier is None else Antichain([frontier]),
        None if frontier is None else changefeed_waiting_reason(source, frontier),
        one_row_per_key=True)


def decode_materialize(updates: DataFrame, progress: DataFrame, since: Antichain,
                       cleanup: ExitStack) -> DecodedInput:
    """Decode Materialize CDC messages on Spark from the table's committed frontier `since`;
    the decode's cached aggregate is released when `cleanup` closes (after the commit)."""
    from changelake.spark.decoder import decode, locate_key

    decoded = translate_errors(decode, updates, progress, since=since)
    cleanup.callback(decoded.unpersist)
    waiting = None if decoded.frontier.is_closed else waiting_reason(
        dict(decoded.missing), decoded.progress_frontier)
    return DecodedInput(flatten(decoded.updates), since, decoded.frontier, waiting,
                        locate=functools.partial(locate_key, updates))


def frontier_after(committed: int | None, upper: Antichain) -> int | None:
    """The table's frontier once an input reaching `upper` is committed over a table committed
    through `committed` (None: closed)."""
    if committed is None:
        return None
    reached = frontier_int(upper, "input")
    return None if reached is None else max(committed, reached)


def commit_input(writer: TableWriter, decoded: DecodedInput, *, key: Sequence[str] = (),
                 buckets: int = DEFAULT_BUCKETS, scd2: bool = False,
                 offsets: SourceOffsets | None = None,
                 write: Callable[[Callable[[], None]], None] | None = None) -> CommitResult:
    """Commit a decoded input under the writer lock, creating the table (with the input's
    columns, keyed by `key`) if it does not exist; `offsets` are recorded by the same commit,
    and `write` runs its write (`TableWriter.commit`).
    An existing table keeps its key: another is refused (`TableWriter.ingest_key`)."""
    key = writer.ingest_key(key)
    committed = writer.state.upper if writer.state is not None else 0
    lower, upper = decoded.lower, decoded.upper
    input_upper = frontier_int(upper, "input")
    if committed is not None and input_upper is not None and input_upper < committed:
        lower = upper  # the input ends before the committed frontier: nothing new in it
    if key and not decoded.one_row_per_key and committed is not None and lower != upper:
        # Checked here, before a missing table is created: a refused input leaves none.
        check_one_row_per_key(decoded.rows.where(f"_diff != 0 AND _time >= {committed}"),
                              key, writer.name, decoded.locate)
    if writer.state is None:
        data = StructType([f for f in decoded.rows.schema.fields
                           if f.name not in ("_time", "_diff")])
        writer.create(data, key=key, buckets=buckets, scd2=scd2,
                      storage=writer.table.storage)
    return writer.commit(decoded.rows, lower, upper, offsets=offsets, write=write,
                         check_key=False)
