"""A Delta append whose files are written before the decision to commit them.

Delta's DataFrame writer writes a table's new files and commits them in one call. A lake
commit needs a step between the two: a changefeed conversion's checks
(`conversion.DeferredChecks`) settle only once the job that writes its rows has run, and a
commit whose checks fail must leave nothing in the table. So `StagedAppend` splits Delta's own
write path (what its `WriteIntoDelta` command does) in two:

* `write(rows)` runs the job that writes the rows' Parquet files under the table's directory,
  inside an open Delta transaction (`OptimisticTransaction.writeFiles`). No log entry names
  them: no reader sees them.
* `commit(version)` commits those files with the application's transaction `(app_id,
  version)` (`SetTransaction`, what the writer's `txnAppId`/`txnVersion` options record), or
  `abort()` deletes them.

The transaction registers its read of the application's transaction when it starts, so
Delta's conflict check fails the commit if another writer recorded one for `app_id` meanwhile
(`ConcurrentTransactionException`): two writers cannot both commit version N. The version it
read is taken from the log at the transaction's own snapshot version by the caller's
`recorded_at` (the lake reads it with delta-rs): Delta's `txnVersion` computes it from the
snapshot's whole state, a Spark job of seconds on every commit, where delta-rs reads the log
in milliseconds.

It reaches Delta through its internal Scala API (py4j), which is why it is tied to the Delta
release `maven.py` fetches. Only an append to an existing table whose schema the rows match
column for column takes this path (`begin` returns None otherwise): a schema change or a
`replaceWhere` goes through the DataFrame writer, which handles them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from changelake.errors import LakeError


def _shape(struct: StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in struct.fields]


@dataclass
class StagedAppend:
    """An open Delta transaction on the table at `path` (see the module docstring)."""

    spark: SparkSession
    path: str
    app_id: str
    recorded: int
    """The application's transaction version the table held when the transaction began
    (-1: none)."""
    started: float = field(default_factory=time.time)
    """When it began (`time.time()`): the files it writes are modified at or after it."""
    _log: Any = None
    _txn: Any = None
    _actions: Any = None
    committed: bool = False

    def write(self, rows: DataFrame) -> None:
        """Write `rows` (on the table's schema) as files of the transaction: one Spark job."""
        if self._actions is not None:
            raise LakeError(f"Delta table {self.path}: this transaction wrote its files already")
        self._actions = self._txn.writeFiles(rows._jdf)

    @property
    def files(self) -> int:
        """How many files `write` wrote."""
        return 0 if self._actions is None else int(self._actions.size())

    def commit(self, version: int) -> int:
        """Commit the written files (none: a commit of none) recording the transaction
        `(app_id, version)`; returns the Delta table's new version. Fails (Delta's conflict
        check) if another writer recorded a transaction of `app_id` since `begin`."""
        jvm = self.spark._jvm
        assert jvm is not None
        convert = jvm.scala.jdk.javaapi.CollectionConverters
        option = jvm.scala.Option
        actions = jvm.java.util.ArrayList()
        if self._actions is not None:
            actions.addAll(convert.asJava(self._actions))
        now = int(time.time() * 1000)  # milliseconds: beyond 2^31, so py4j passes a Long
        actions.add(jvm.org.apache.spark.sql.delta.actions.SetTransaction(
            self.app_id, version, option.apply(now)))
        none = option.empty()
        operation = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
            jvm.org.apache.spark.sql.SaveMode.Append, none, none, none, none, none, none, none,
            none)
        try:
            table_version = int(self._txn.commit(convert.asScala(actions).toSeq(), operation))
        except Py4JJavaError as error:
            if "Concurrent" not in error.java_exception.getClass().getName():
                raise
            raise LakeError(
                f"Delta table {self.path}: another writer committed meanwhile "
                f"({error.java_exception.getClass().getSimpleName()}); nothing was "
                "changed") from None
        self.committed = True
        return table_version

    def abort(self) -> None:
        """Delete the files `write` wrote, unless they were committed."""
        if self._actions is None or self.committed:
            return
        conf = self.spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        for action in self.spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(  # type: ignore[union-attr]
                self._actions):
            target = action.absolutePath(self._log)
            target.getFileSystem(conf).delete(target, False)
        self._actions = None


def begin(spark: SparkSession, path: str, app_id: str, schema: StructType | None,
          recorded_at: Callable[[int], int]) -> StagedAppend | None:
    """A transaction appending rows of `schema` to the Delta table at `path`, or None where
    the table's schema is not `schema` (names and types, in order): the DataFrame writer's
    schema evolution is for that. `schema` None: a transaction that writes no rows (it only
    records a version), whatever the table's schema. `recorded_at(v)`: the transaction
    version of `app_id` that version `v` of the table holds (-1: none), read from its log."""
    jvm = spark._jvm
    assert jvm is not None
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    txn = log.startTransaction()
    if schema is not None:
        table = StructType.fromJson(json.loads(txn.metadata().schema().json()))
        if _shape(table) != _shape(schema):
            return None
    txn.readTxn().addOne(app_id)  # what `txn.txnVersion(app_id)` registers, without its job
    recorded = recorded_at(int(txn.snapshot().version()))
    return StagedAppend(spark, path, app_id, recorded, _log=log, _txn=txn)


CHECKPOINT_EVERY = 10
"""Delta's own default interval between checkpoints, for the tables whose checkpoints are
written by `checkpoint_if_due` instead of by their commits (`delta.checkpointInterval` set
beyond reach)."""


def checkpoint_if_due(spark: SparkSession, path: str, every: int | None = None) -> bool:
    """Write a checkpoint of the Delta table at `path` where its latest version is `every`
    (default `CHECKPOINT_EVERY`) or more past its last checkpoint (or its start). Delta
    writes one inside the commit that reaches its interval, a Spark job over the table's
    state that the writer waits for; a table that leaves it to this call is checkpointed
    where that wait costs no one (a thread of its own: `lake/current_follower.py`). Returns
    whether it wrote one."""
    every = CHECKPOINT_EVERY if every is None else every
    jvm = spark._jvm
    assert jvm is not None
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    snapshot = log.update(False, none, none)
    last = log.readLastCheckpointFile()
    done = int(last.get().version()) if last.isDefined() else 0
    if int(snapshot.version()) - done < every:
        return False
    log.checkpoint(snapshot, none)
    return True

