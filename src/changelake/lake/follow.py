"""`changelake ingest --follow`: a growing source of Materialize CDC messages committed to a
lake table by a long-lived Structured Streaming query, each micro-batch exactly once, across
SIGKILL and restart from the checkpoint.

Why one module of over 500 lines: the streaming query, its checkpoint and its stop control
share one exactly-once argument.

The source is a parameter: a function that returns the streaming DataFrame of messages (the
`materialize-cdc` source's shape, see `spark/source.py`); `directory_source` is the one for a
directory of files, `topic_source` the one for Kafka topics (`kafka-cdc`, whose offsets Spark
logs in the checkpoint as it logs a directory's file list). Each micro-batch runs
`CommitBatches` (`foreachBatch`), which decodes with the state `lake/follow_state.py` keeps,
the lake table as the output and the frontier's keeper:

* Batch `n` decodes (the pending updates and statements kept after the previous batch, plus
  batch `n`'s messages) from the table's committed frontier F, under the table's writer lock.
* It writes what stays unfinished (the distinct updates at or beyond the new frontier, the
  statements not wholly behind it) to `state/<id>/<n>` in the checkpoint (locally: hidden
  name, synced, then renamed; on a remote store, where a directory's rename is not atomic:
  in place, its `state.json` last, which marks it whole), before the lake commit; `<id>` is
  the identity of Spark's checkpoint (`metadata`), new whenever Spark's checkpoint is new and
  its batch ids start again at 0. The checkpoint is a local directory or a URI on any Hadoop
  FileSystem (`files.RemotePath`): by default on the lake's store, beside the table.
* It commits the finished updates with `commit_input`, the same commit recording the batch
  (`layout.StreamMark`: the checkpoint's identity, its directory and `n`), so every batch makes
  one table version, possibly with no rows. Then the states before `n` are removed.

The state a batch starts from is the latest `state/<id>/<m>` with `m < n`: Spark runs batch `n`
only after batch `m`'s function returned, so that state belongs to a batch that finished (its
lake commit made, or skipped because the table could not be created yet: no rows have columns).

Crash windows (`kill -9` anywhere; Spark logs batch `n`'s offsets, its file list, before
running it, and replays exactly that batch on restart):

* before `state/<n>` is in place (or whole), or after it and before the lake commit: the
  replay starts from the same `state/<m>` with the same messages and the same committed
  frontier, so it computes the same result, replaces `state/<n>` (identical) and commits:
  nothing lost;
* after the lake commit (before Spark logged the batch as done): the table's mark names this
  checkpoint and batch `n`, so the replay commits nothing and returns.

Even without the mark a replay could not double anything: the table takes only updates at or
beyond its frontier (see `table.py`), which the first attempt moved past what it committed; the
mark makes "commits nothing the second time" literal and skips the work. So a new checkpoint
(the old one deleted) is safe too: it has a new identity and no state, it re-reads every file,
and what the table holds is skipped.

A clean stop (`FollowControl.stop`, which the CLI calls on SIGTERM and SIGINT) lets the batch in
flight commit, and a batch that starts after the stop was asked fails before it does anything
(so Spark replays it on the next run); then the query stops. `until_idle` stops the same way
once no batch has run for that many seconds.

Data without a schema (JSON lines, no `--schema`, no Avro container file when the query
starts) is read as JSON text and typed per batch by Spark's JSON inference over the batch's
updates, as `ingest` types a whole input; a table created this way takes its columns from the
first batch with updates.

A lenient topic follow (`topic_source(lenient=True)`) gets an `_error` row for each bad record,
which the decode drops; `set_aside` (`spark.kafka_set_aside.FollowSetAside`) reports them and
produces them to a dead-letter topic, in the batch, before its state and its lake commit. The
table stays exactly once; the dead-letter topic is at least once (a replay of a batch that did
not commit produces them again; a replay of a committed one is skipped before it).
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from changelake.durable import fsync_directory, sync_tree
from changelake.errors import LakeError
from changelake.formats.materialize import load_schema_text
from changelake.lake.catalog import Lake
from changelake.lake.current_follower import following
from changelake.lake.files import (
    RemotePath,
    lake_root,
    parquet_source,
    remove_tree,
    replace_whole,
)
from changelake.lake.follow_lag import KIND, TOPICS
from changelake.lake.follow_state import (
    PENDING,
    STATE_FILE,
    FollowState,
    latest_state,
    state_name,
)
from changelake.lake.identifier import TableIdentifier, check_name
from changelake.lake.ingest import DecodedInput, commit_input, flatten
from changelake.lake.layout import SourceOffsets, StreamMark, TableState
from changelake.lake.table import DEFAULT_BUCKETS, CommitResult, ingest_key
from changelake.protocol import Antichain
from changelake.spark.json_schema import infer_json_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from changelake.spark.kafka_source import LossReport

FORMAT = "materialize"
FOLLOW_DIR = "_follow"
"""The default checkpoint, inside the table's directory."""
OWNER = "follow.json"
SPARK_DIR = "spark"
STATE_DIR = "state"

MessagesSource = Callable[["SparkSession"], "DataFrame"]
"""Returns the streaming DataFrame of messages (`materialize-cdc`'s row shape)."""
BatchSetAside = Callable[[int, "DataFrame"], None]
"""`follow(..., set_aside=)`: set_aside(batch id, the batch's messages), called once per batch
that is not a replay of a committed one, before its state and its lake commit, to handle what a
lenient source set aside (`_error` rows, which the decode drops):
`spark.kafka_set_aside.FollowSetAside` reports them and produces them to a dead-letter topic."""
BatchProgress = Callable[[int, str, "CommitResult | None"], None]
"""progress(batch id, step, commit result): steps `started`, `state` (the pending state is
durable), `committed` (with the lake commit's result; None when it recorded the batch only),
`skipped` (a replay of a committed batch), `waiting` (no table yet and nothing to create it
with)."""


Checkpoint = Path | RemotePath
"""A follow's checkpoint: a local directory, or a URI on any Hadoop FileSystem (`s3a://`)."""


def default_checkpoint(lake: Lake, table: str | TableIdentifier) -> Checkpoint:
    return lake.handle(table).directory / FOLLOW_DIR


def checkpoint_root(checkpoint: str | Path | RemotePath) -> Checkpoint:
    """A checkpoint as given (`--checkpoint`): a local directory resolved, or a remote URI
    (never through `Path`, which would fold `s3a://b` into `s3a:/b`)."""
    return lake_root(checkpoint)


def check_checkpoint(checkpoint: Checkpoint, table: str, address: str) -> None:
    """Record what the checkpoint follows at its first use; a checkpoint made for another table
    or source is refused (its offsets belong to that source)."""
    checkpoint = checkpoint_root(checkpoint)
    path = checkpoint / OWNER
    if path.exists():
        raw = json.loads(path.read_text())
        if raw.get("table") != table or raw.get("source") != address:
            raise LakeError(f"checkpoint {checkpoint} follows {raw.get('source')} into table "
                            f"{raw.get('table')}, not {address} into {table}: use another "
                            "--checkpoint")
        return
    checkpoint.mkdir(parents=True, exist_ok=True)
    # locally: beside it, synced, renamed, the directory synced; remotely: one whole PUT
    replace_whole(path, json.dumps({"table": table, "source": address}))


def spark_checkpoint_id(checkpoint: Checkpoint) -> str:
    """The identity of Spark's checkpoint (its `metadata`, written when the query starts): a
    new one when the old was deleted, whose batch ids start again at 0."""
    return str(json.loads((checkpoint / SPARK_DIR / "metadata").read_text())["id"])


def directory_source(directory: Path, *, schema: Path | None = None,
                     max_files_per_trigger: int | None = None) -> MessagesSource:
    """The files that appear in `directory` (atomically: hidden name, then rename), as
    `materialize-cdc` streams them. Rows are typed by `schema`, else by the first Avro
    container file present when the query starts, else read as JSON text."""
    from changelake.formats.materialize import OCF_MAGIC, expand_paths, load_schema_text

    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise LakeError(f"--follow {directory}: not a directory")
    # The union's text, from a file of the union or of the rows' record (as `ingest` takes
    # it); a bad file is its one-line error here, not the data source's on the executor.
    avro = load_schema_text(schema) if schema is not None else None

    def messages(spark: SparkSession) -> DataFrame:
        from changelake.spark.source import register

        register(spark)
        reader = spark.readStream.format("materialize-cdc")
        if avro is not None:
            reader = reader.option("avroSchema", avro)
        else:
            typed = False
            for path in expand_paths([directory]):
                with open(path, "rb") as fo:
                    if fo.read(len(OCF_MAGIC)) == OCF_MAGIC:
                        typed = True
                        break
            if not typed:
                reader = reader.option("dataAs", "json")
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
        return reader.load(str(directory))

    return messages


def topics_address(bootstrap: str, topics: Sequence[str]) -> str:
    """How followed topics are named in the commits and the checkpoint: `kafka://B/t1,t2`."""
    return f"kafka://{bootstrap}/{','.join(topics)}"


def topic_source(bootstrap: str, topics: Sequence[str], *, schema: Path | None = None,
                 schema_registry: str | None = None, max_records_per_trigger: int | None = None,
                 config: Mapping[str, Any] | None = None,
                 fail_on_data_loss: bool = True,
                 lenient: bool = False,
                 losses: LossReport | None = None) -> MessagesSource:
    """Records of Materialize CDC messages as they arrive in `topics`, read on the executors
    by the `kafka-cdc` streaming source; its offsets live in the follow's checkpoint, so a
    restart reads only what no committed batch read. Records gone before they were read
    (deleted by retention, or the topic recreated) stop the follow with an `InputError`
    naming topic, partition and offsets; `fail_on_data_loss=False` (`ingest --follow --kafka
    --no-fail-on-data-loss`) logs a warning and goes on from the first record still held (the
    source's `failOnDataLoss`, see `spark/kafka_source.py`); with `losses` (given to `follow`
    too) the warnings also reach this process, which the log does not. `lenient`: bad records
    become `_error` rows instead of failing the batch (`follow`'s `set_aside` handles them)."""
    if schema is None and schema_registry is None:
        raise LakeError("following Kafka topics needs the messages' schema: --schema FILE or "
                        "--schema-registry URL")
    # The union, as `ingest --kafka` takes it: the file may hold the rows' record alone.
    avro_schema = load_schema_text(schema) if schema is not None else None

    def messages(spark: SparkSession) -> DataFrame:
        from changelake.spark import kafka_source

        kafka_source.register(spark)
        options = kafka_source.reader_options(
            bootstrap, topics, avro_schema=avro_schema,
            schema_registry=schema_registry, config=config)
        options["startingOffsets"] = "earliest"
        if max_records_per_trigger:
            options["maxRecordsPerTrigger"] = str(max_records_per_trigger)
        options["failOnDataLoss"] = "true" if fail_on_data_loss else "false"
        if losses is not None:
            options["lossReport"] = losses.option
        if lenient:
            options["lenient"] = "true"
        return spark.readStream.format(kafka_source.NAME).options(**options).load()

    return messages


def _rows(directory: Checkpoint) -> int:
    """Rows in a directory of Parquet files, from their footers."""
    import pyarrow.parquet as pq

    rows = 0
    for path in directory.glob("*.parquet"):
        with parquet_source(path) as source:
            rows += pq.ParquetFile(source).metadata.num_rows
    return rows


def _states_before(states: Checkpoint, batch: int) -> None:
    """Forget the states a committed batch `batch` has replaced, leftovers of crashed
    attempts, and the states of a Spark checkpoint that was replaced."""
    for other in states.parent.iterdir():
        if other != states:
            remove_tree(other)
    for path in states.iterdir():
        if path.name.startswith(".") or (path.name.isdigit() and int(path.name) < batch):
            remove_tree(path)


@dataclass
class FollowControl:
    """Between the query's batches and whoever stops it: `stop()` asks for a clean stop."""

    stopping: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: bool = False
    last_batch_end: float = field(default_factory=time.monotonic)
    batches: int = 0
    committed: int = 0
    failure: BaseException | None = None

    def stop(self) -> None:
        self.stopping.set()


class StopRequested(Exception):
    """Raised by a batch that starts after a stop was asked: Spark keeps it for the next run."""


class CommitBatches:
    """The `foreachBatch` function: one micro-batch of messages in, one table version out."""

    def __init__(self, lake: Lake, table: str | TableIdentifier,
                 checkpoint: str | Path | RemotePath,
                 identity: str | None, address: str, control: FollowControl, *,
                 key: Sequence[str] = (), buckets: int = DEFAULT_BUCKETS,
                 scd2: bool = False, progress: BatchProgress | None = None,
                 kind: str = KIND, set_aside: BatchSetAside | None = None,
                 losses: LossReport | None = None) -> None:
        self.lake = lake
        self.handle = lake.handle(table)
        self.checkpoint = checkpoint_root(checkpoint)
        self._identity = identity
        self.address = address
        self.control = control
        self.key = tuple(key)
        self.buckets = buckets
        self.scd2 = scd2
        self.progress = progress or (lambda _batch, _step, _result: None)
        self.kind = kind
        self.set_aside = set_aside
        self.losses = losses

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        control = self.control
        if self.losses is not None:
            self.losses.drain()  # the batch's planning: told before the batch's lines
        with control.lock:
            if control.stopping.is_set():
                raise StopRequested(f"stop asked before batch {batch_id}")
            control.in_flight = True
        try:
            if self._commit(batch, batch_id):
                control.committed += 1
            control.batches += 1
        except BaseException as error:
            control.failure = error
            raise
        finally:
            if self.losses is not None:
                self.losses.drain()  # found by the batch's reads
            with control.lock:
                control.in_flight = False
                control.last_batch_end = time.monotonic()

    @property
    def identity(self) -> str:
        """The checkpoint's identity (Spark's, unless given), read once."""
        if self._identity is None:
            self._identity = spark_checkpoint_id(self.checkpoint)
        return self._identity

    @property
    def states(self) -> Checkpoint:
        """Where this checkpoint's batches keep their pending state."""
        return self.checkpoint / STATE_DIR / self.identity

    def _mark(self, state: TableState | None) -> StreamMark | None:
        offsets = state.offsets if state is not None else None
        if offsets is None:
            return None
        if offsets.kind != self.kind or offsets.stream is None:
            raise LakeError(f"table {self.handle.name} records offsets of a {offsets.kind} "
                            f"source, not of a followed {self.kind} source ({self.address})")
        return offsets.stream

    def _commit(self, batch: DataFrame, batch_id: int) -> bool:
        """Decode and commit batch `batch_id`; False when the table already has it."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from changelake.spark.decoder import (
            collect_statements,
            decode_statements,
            locate_key,
            split_messages,
        )
        from changelake.spark.errors import translate_errors

        spark = batch.sparkSession
        with self.handle.writer() as writer, ExitStack() as cleanup:
            state = writer.state
            mark = self._mark(state)
            if mark is not None and mark.checkpoint == self.identity and mark.batch >= batch_id:
                self.progress(batch_id, "skipped", None)
                return False  # committed before a crash: the replay commits nothing
            self.progress(batch_id, "started", None)
            committed = state.upper if state is not None else 0
            previous = latest_state(self.states, before=batch_id)
            messages = batch.persist(StorageLevel.MEMORY_AND_DISK)
            cleanup.callback(messages.unpersist)
            if self.set_aside is not None:
                self.set_aside(batch_id, messages)
            located, progress = split_messages(messages)  # with the files' lines
            updates = located.selectExpr("data", "time", "diff")
            if previous is not None and previous[0].has_pending:
                pending = spark.read.schema(updates.schema).parquet(str(previous[1] / PENDING))
                updates = updates.unionByName(pending)
            kept = list(previous[0].statements) if previous is not None else []
            statements = list(dict.fromkeys([*kept, *translate_errors(collect_statements,
                                                                      progress, kept)]))
            since = Antichain([committed]) if committed is not None else Antichain()
            temporary = self._temporary(batch_id)
            if committed is None:  # closed: nothing can be added; record the batch only
                frontier, still, finished, has_pending = Antichain(), (), None, False
                temporary.mkdir(parents=True)
            else:
                decoded = translate_errors(
                    decode_statements, updates, statements, since=since,
                    partitions=spark.sparkContext.defaultParallelism)
                cleanup.callback(decoded.unpersist)
                frontier = decoded.frontier
                still = tuple(p for p in statements if not p.upper.le(frontier))
                assert decoded.pending is not None
                translate_errors(decoded.pending.write.parquet, str(temporary / PENDING))
                has_pending = _rows(temporary / PENDING) > 0
                if not has_pending:
                    remove_tree(temporary / PENDING)
                finished = decoded.updates
            keep = FollowState(batch_id, frontier, still, has_pending)
            self._keep(temporary, keep)
            self.progress(batch_id, "state", None)
            rows = None
            if finished is not None:
                data_type = updates.schema["data"].dataType
                if data_type.typeName() == "string":  # JSON text: type it (module docstring)
                    inferred = translate_errors(lambda: infer_json_schema(updates.select("data")))
                    if inferred.fields:
                        finished = finished.withColumn("data", F.from_json("data", inferred))
                    else:
                        finished = None
                if finished is not None:
                    rows = flatten(finished)
            if state is None and rows is None:
                self.progress(batch_id, "waiting", None)
                return False  # no columns to create the table with: the state holds it all
            offsets = SourceOffsets(self.kind, FORMAT, self.address,
                                    stream=StreamMark(self.identity, str(self.checkpoint),
                                                      batch_id))
            if rows is None:  # closed, or nothing typed: the version records the batch only
                assert state is not None
                writer.publish(state.next("offsets", offsets=offsets))
                result = None
            else:
                result = translate_errors(
                    commit_input, writer,
                    DecodedInput(rows, since, frontier, None,
                                 locate=functools.partial(locate_key, located)),
                    key=self.key, buckets=self.buckets, scd2=self.scd2, offsets=offsets)
        self.progress(batch_id, "committed", result)
        _states_before(self.states, batch_id)
        return True

    def _temporary(self, batch_id: int) -> Checkpoint:
        """Where batch `batch_id`'s state is written. Locally a hidden name, renamed to the
        final one once whole (`_keep`). On a remote store, where a directory's rename is no
        atomic step (a copy of each object, then a delete), the final name itself, emptied
        first (a crashed attempt's leftovers): its `state.json`, written last, marks it whole
        (`latest_state` passes over a state without one)."""
        if isinstance(self.states, RemotePath):
            final = self.states / state_name(batch_id)
            remove_tree(final)
            return final
        self.states.mkdir(parents=True, exist_ok=True)
        return self.states / f".{state_name(batch_id)}-{uuid.uuid4().hex}"

    def _keep(self, temporary: Checkpoint, keep: FollowState) -> None:
        """Make batch `keep.batch`'s state, written at `temporary` but for its `state.json`,
        the one the next batch finds, whole and durable, before the lake commit records the
        batch: the next batch starts from it (a lost one would lose its pending updates for
        good)."""
        text = json.dumps(keep.to_json())
        if isinstance(temporary, RemotePath):  # an acknowledged PUT is durable and whole
            (temporary / STATE_FILE).write_text(text)
            return
        (temporary / STATE_FILE).write_text(text)
        final = self.states / state_name(keep.batch)
        if final.exists():
            remove_tree(final)
        sync_tree(temporary, self.checkpoint)
        temporary.replace(final)
        fsync_directory(self.states)


@dataclass(frozen=True, slots=True)
class FollowReport:
    """What a follow run did: micro-batches run, and how many of them committed a version."""

    table: str
    batches: int
    committed: int
    checkpoint: str


def follow(lake: Lake, table: str | TableIdentifier, source: MessagesSource, address: str, *,
           checkpoint: str | Path | RemotePath | None = None, key: Sequence[str] = (),
           buckets: int = DEFAULT_BUCKETS, scd2: bool = False, trigger_seconds: float = 2.0,
           until_idle: float | None = None, control: FollowControl | None = None,
           progress: BatchProgress | None = None, kind: str = KIND,
           poll_seconds: float = 0.2, set_aside: BatchSetAside | None = None,
           losses: LossReport | None = None) -> FollowReport:
    """Follow `source` (its messages, named `address`) into `table` until `control.stop()`
    is called, or (`until_idle`) no batch has run for that many seconds: see the module
    docstring. `checkpoint` defaults to `_follow` in the table's directory. `kind` names the
    source's kind in the commits' `SourceOffsets` (`status` computes a `files` source's lag;
    another source, such as topics, brings its own). An error the source raises (planning a
    micro-batch, or reading it on an executor) comes back as its one-line `InputError`.
    `losses`: the `LossReport` given to the source (`topic_source`), drained before and after
    each batch and at the end, so that its warnings reach this process's `tell` in order."""
    from changelake.spark.errors import input_error, translate_errors

    handle = lake.handle(table)
    for column in key:
        check_name(column, f"table {handle.name}: key column")
    if trigger_seconds <= 0:
        raise LakeError(f"trigger interval {trigger_seconds} s: it must be positive")
    checkpoint = checkpoint_root(checkpoint if checkpoint is not None
                                 else default_checkpoint(lake, handle.ident))
    existing = handle.load()
    if existing is not None and existing.offsets is not None and (
            existing.offsets.kind != kind or existing.offsets.stream is None):
        raise LakeError(f"table {handle.name} is ingested from a {existing.offsets.kind} "
                        f"source ({existing.offsets.address}): it cannot follow {address}")
    key = ingest_key(handle.name, existing, key)  # refused now, not at the first batch
    check_checkpoint(checkpoint, handle.name, address)
    control = control or FollowControl()
    # A Delta table's MERGE into `current` runs beside the batches (`current_follower.py`).
    with following(lake):
        sink = CommitBatches(lake, handle.ident, checkpoint, None, address, control, key=key,
                             buckets=buckets, scd2=scd2, progress=progress, kind=kind,
                             set_aside=set_aside, losses=losses)
        query = (
            source(lake.spark).writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint / SPARK_DIR))
            .trigger(processingTime=f"{int(trigger_seconds * 1000)} milliseconds")
            .queryName(f"changelake-follow-{uuid.uuid4().hex[:8]}")
            .start()
        )
        waiting_since: float | None = None  # when the first trigger was seen done
        try:
            while query.isActive:
                if translate_errors(query.awaitTermination, poll_seconds):
                    break
                if until_idle is not None and waiting_since is None and \
                        str(query.status.get("message", "")).startswith("Waiting"):
                    waiting_since = time.monotonic()
                with control.lock:
                    idle = (waiting_since is not None and not control.in_flight
                            and time.monotonic() - max(waiting_since, control.last_batch_end)
                            >= until_idle)
                    if idle:
                        control.stopping.set()
                    done = control.stopping.is_set() and not control.in_flight
                if done:
                    query.stop()
                    break
        except Exception:
            if not control.stopping.is_set() and control.failure is None:
                raise
        finally:
            if query.isActive:
                query.stop()
            if losses is not None:
                losses.drain()  # planned while no batch ran (a stop, a failure)
        failure = control.failure
        if failure is not None and not isinstance(failure, StopRequested):
            raise failure
        if query.exception() is not None and control.failure is None \
                and not control.stopping.is_set():
            found = input_error(query.exception())  # the source's own line, if it is one
            if found is not None:
                raise found
            raise LakeError(f"follow {address}: the streaming query failed: {query.exception()}")
        return FollowReport(handle.name, control.batches, control.committed, str(checkpoint))


__all__ = ["TOPICS", "FollowControl", "FollowReport", "directory_source", "follow",
           "topic_source", "topics_address"]
