"""The Delta Lake back end of a lake table: two Delta tables and the manifests beside them.

Why one module of over 500 lines: the commit point in `updates`' log, `current` following it,
and the schema rules both obey are one protocol over two Delta logs; split, each half would
restate the other's invariants.

    tables/DB/NAME/current/     the table's rows now (one per key; an unkeyed table's multiset),
                                a Delta table registered in the metastore as DB.NAME, so that
                                `spark.table`, `spark.read.format("delta")`, delta-rs and DuckDB
                                read it with no changelake code; Change Data Feed on
    tables/DB/NAME/updates/     every retained update `(columns..., _time, _diff)`, a Delta
                                table only changelake reads: AS OF, history, the change feed
    tables/DB/NAME/_state/vN.json   the manifest of version N (`layout.TableState`, no files)

**The commit point is Delta's log.** Version N of the table is committed by the append to
`updates` that records the Delta transaction `(APP_ID, N)` (`txnAppId`/`txnVersion`): the
committed version is the `updates` table's transaction version for `APP_ID`, and its manifest
is `_state/vN.json`, written before the append (a manifest of a version no append recorded is
never read; the next writer, which computes the same N, overwrites it). Delta skips an append
whose transaction version is not above the recorded one, so a commit replayed after a crash
never writes its rows twice, and two writers that both read version N-1 cannot both commit N:
the second fails Delta's conflict check on the application's transaction.

**`current` follows `updates`.** After the append, the updates of the interval the commit
added are applied to `current` by one MERGE that records `(APP_ID, N)` in `current`'s log too
(`catch_up`): a keyed table takes each key's latest update in the interval (a retraction
last: the key is deleted), an unkeyed one replaces each changed row's copies by its new
multiplicity. A crash between the two leaves `current` at an earlier version: the next writer
applies what it misses first, and a replayed MERGE is skipped by the same transaction rule.
So `current` is never ahead of the committed version, and a reader of it sees one whole
committed version (Delta's snapshot isolation), possibly the one before the last. A writer that
commits often (a capture) leaves the MERGE to a thread of its own (`current_follower.py`) and
returns at the commit point; `current` then trails by the MERGEs still to run.

**A widened column type is a rewrite.** Delta changes a column's type in place only with its
`typeWidening` table feature, which delta-rs (the reads of `lake/arrow.py`) cannot read, and
its schema merge refuses a wider type without it. So the commit that widens a column (int to
bigint, float to double: `schema.py`) rewrites `updates` whole on the wider schema, in the
append that records `(APP_ID, N)`, and `current` is rewritten from `updates` in place of the
MERGE, recording the same; so is an unkeyed table's `current` when its live columns change
otherwise than by a new column (`_must_rewrite`). Both are O(table), once per such change.

Reads that are not "now" (`AS OF`, the history, the change feed) read `updates` through
`sql.delta_union_sql`, limited to the times the manifest's frontier covers, and merge on read
exactly as the Hive format does (`sql.state_sql`).

`current` has no deletion vectors, so every Delta reader (delta-rs's Arrow reader among them)
can read it; a MERGE rewrites the files holding the keys it changes.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.durable import SYNC_SLACK_SECONDS, sync_tree
from changelake.errors import LakeError
from changelake.lake.files import delta_uri, remove_tree, storage_options
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import (
    DELTA_APP_ID,
    TableState,
    current_path,
    read_manifest,
    updates_path,
)
from changelake.lake.schema import live_columns, logical_schema
from changelake.lake.sql import (
    delta_literal,
    delta_union_sql,
    path_literal,
    sql_type,
    state_sql,
    string_literal,
    unkeyed_columns,
)
from changelake.spark import delta_txn
from changelake.spark.delta_txn import StagedAppend
from changelake.spark.expressions import quote
from changelake.spark.map_grouping import has_map

STORAGE = "delta"
APP_ID = DELTA_APP_ID
LATEST_ROWS_CLASS = "changelake.jvm.LatestRows"

NO_CHECKPOINT_INTERVAL = str(2**31 - 1)
"""`delta.checkpointInterval` out of reach: no commit writes a checkpoint (a Spark job over the
table's state that the commit would wait for); `checkpoint_logs` writes them instead."""

CURRENT_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.enableDeletionVectors": "false",
    "delta.checkpointInterval": NO_CHECKPOINT_INTERVAL,
}
"""`current`'s table properties: Delta readers get its row-level changes (Change Data Feed);
no deletion vectors, which delta-rs's Arrow reader cannot read yet; no checkpoint written by
a MERGE (`checkpoint_logs` writes them, as `updates`')."""

UPDATES_PROPERTIES = {"delta.enableDeletionVectors": "false",
                      "delta.checkpointInterval": NO_CHECKPOINT_INTERVAL,
                      "delta.dataSkippingStatsColumns": "_time"}
"""`updates`' table properties: no deletion vectors; no checkpoint written by a commit (a
Spark job the commit point would wait for): `checkpoint_logs` writes them, after the
commit (a writer with a `current_follower` leaves them to its thread); and
file statistics of `_time` alone, the column every read of `updates` selects by (AS OF, an
interval, a fold), not of every column up to Delta's 32 (strings among them), which the
writer computes row by row."""


def sync(table_dir: Path, newer_than: float | None) -> None:
    """Sync what a commit wrote in both Delta tables (data files, `_delta_log` entries, their
    directories; those modified at or after `newer_than`, everything when None), which Delta's
    local log store leaves unsynced: after the append that is the commit point, before anyone
    is told (see `durable.py`)."""
    for path in (updates_path(table_dir), current_path(table_dir)):
        sync_tree(path, table_dir, newer_than=newer_than)


def transaction_version(spark: SparkSession, path: Path) -> int | None:
    """The version of `APP_ID`'s transaction that the Delta table at `path` recorded last, or
    None: no such table, or none recorded.

    Read by delta-rs from the log itself: Spark's `DeltaLog` answers the same from a
    snapshot whose transactions it computes with a Spark job, seconds on every commit."""
    del spark  # the log is read the same way whoever writes it
    if not (path / "_delta_log").is_dir():
        return None
    from deltalake.exceptions import TableNotFoundError

    try:
        return _delta_rs(path).transaction_version(APP_ID)
    except TableNotFoundError:  # a creation in flight: its log has no commit yet
        return None


def _delta_rs(path: Path, version: int | None = None):
    """delta-rs's handle on the Delta table at `path` (at `version`; None: the latest), local
    or on an object store (`files.storage_options`)."""
    from deltalake import DeltaTable

    return DeltaTable(delta_uri(path), version=version, storage_options=storage_options(path))


def current_at(spark: SparkSession, table_dir: Path, state: TableState) -> DataFrame | None:
    """A keyed table's rows at the committed `state`, read from `current` at the Delta
    version of it that recorded the changelake version it holds (pinned: a
    `current_follower` MERGE after it is not seen), on the logical schema. Where that
    version trails `state` (a follower's MERGE to come, or a crash between the two commits),
    the updates committed after it are folded in on read as `catch_up`'s MERGE would apply
    them: a key they touch has its latest row there (`_latest_rows`), or none. None where
    `current` holds no version yet.

    What a writer reads a key's previous row from (`TableWriter.current`): the rows now and
    the commits `current` has still to apply, not every retained update merged on read, so
    that a commit reads as much as the table holds now and what changed since, not as much
    as it has ever been given (every file of `updates` until a compaction folds them: on an
    object store, a GET each, per commit)."""
    if not state.keyed:
        return None
    path = current_path(table_dir)
    if not (path / "_delta_log").is_dir():
        return None
    from deltalake.exceptions import TableNotFoundError

    try:
        log = _delta_rs(path)
    except TableNotFoundError:
        return None
    applied = log.transaction_version(APP_ID)
    if applied is None or applied > state.version:
        return None
    frame = spark.read.format("delta").option("versionAsOf", log.version()).load(str(path))
    have = {c.lower(): c for c in frame.columns}
    logical = logical_schema(state.versions)
    rows = frame.select(*[
        (F.col(quote(have[f.name.lower()])) if f.name.lower() in have else F.lit(None))
        .cast(f.dataType).alias(f.name) for f in logical.fields])
    if applied == state.version:
        return rows
    lower = read_manifest(table_dir, applied).upper
    if lower is None or lower == state.upper:
        return rows  # nothing committed after it (a closed stream: nothing can be)
    # The keys the later updates touch take their latest row from them (or are gone); the
    # others keep `current`'s, found by an anti join on the keys (as the MERGE matches
    # them, null-safe), with no sort of the table's rows.
    after = spark.sql(interval_sql(state, table_dir, lower, state.upper))
    touched = functools.reduce(lambda a, b: a & b, (
        F.col(f"c.{quote(k)}").eqNullSafe(F.col(f"t.{quote(k)}")) for k in state.key))
    kept = rows.alias("c").join(after.alias("t"), touched, "left_anti")
    return kept.unionByName(_latest_rows(spark, state, logical, after))


def committed_version(spark: SparkSession, table_dir: Path) -> int | None:
    """The table's committed version (the commit point: see the module docstring)."""
    return transaction_version(spark, updates_path(table_dir))


def load(spark: SparkSession, table_dir: Path) -> TableState | None:
    version = committed_version(spark, table_dir)
    return None if version is None else read_manifest(table_dir, version)


def _properties(values: dict[str, str]) -> str:
    return ", ".join(f"{string_literal(k)} = {string_literal(v)}" for k, v in values.items())


def create(spark: SparkSession, ident: TableIdentifier, table_dir: Path,
           state: TableState, write_struct: StructType) -> None:
    """Create `current` (registered as `ident`) and `updates`, empty; the append that creates
    `updates` records version `state.version` (the commit point of the creation). A creation
    that crashed before it left a registered, empty `current`, which is reused, or files
    without a Delta log there, which are removed first."""
    logical = logical_schema(state.versions)
    columns = ", ".join(f"{quote(f.name)} {sql_type(f.dataType)}" for f in logical.fields)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{ident.database}`")
    if not _is_delta_table(spark, current_path(table_dir)):
        # No Delta log at `current`: nothing was ever committed there. What a creation killed
        # before Delta's first commit left (files Delta refuses to create a table over) is
        # removed, and a registration the lake no longer backs (a remote lake's metastore is
        # kept on this machine, `files.local_home`, and outlives the lake's objects) dropped,
        # from the metastore itself: Delta's DROP TABLE resolves the table, and finds no log.
        remove_tree(current_path(table_dir))
        session = spark._jsparkSession  # type: ignore[attr-defined]
        session.sharedState().externalCatalog().dropTable(ident.database, ident.name, True,
                                                          False)
        session.sessionState().catalog().invalidateAllCachedTables()
    key = ",".join(state.key)
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {ident.quoted} ({columns}) USING delta "
        f"LOCATION {string_literal(str(path_literal(current_path(table_dir))))} "
        f"TBLPROPERTIES ({_properties(CURRENT_PROPERTIES)}, "
        f"'changelake.key' = {string_literal(key)})")
    empty = spark.createDataFrame([], _with_meta(write_struct))
    _append(empty, updates_path(table_dir), state.version, create=True)


def _is_delta_table(spark: SparkSession, path: Path) -> bool:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    return bool(jvm.io.delta.tables.DeltaTable.isDeltaTable(
        spark._jsparkSession, str(path_literal(path))))  # type: ignore[attr-defined]


def register(spark: SparkSession, ident: TableIdentifier, table_dir: Path) -> None:
    """Register an existing table's `current` as `ident` in this session's metastore (a
    remote lake's table made on another machine, whose metastore is its own: `catalog`)."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{ident.database}`")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {ident.quoted} USING delta "
              f"LOCATION {string_literal(str(path_literal(current_path(table_dir))))}")


def _with_meta(struct: StructType) -> StructType:
    return StructType([*struct.fields]).add("_time", "long").add("_diff", "long")


def _append(rows: DataFrame, path: Path, version: int, *, create: bool = False,
            replace_where: str | None = None) -> None:
    """Append `rows` to the Delta table at `path` as the transaction `(APP_ID, version)`;
    with `replace_where`, the rows matching it are replaced by `rows` in the same commit."""
    writer = rows.write.format("delta").mode("append" if replace_where is None else "overwrite") \
        .option("txnAppId", APP_ID).option("txnVersion", str(version)) \
        .option("mergeSchema", "true")
    if replace_where is not None:
        writer = writer.option("replaceWhere", replace_where)
    if create:
        for key, value in UPDATES_PROPERTIES.items():
            writer = writer.option(key, value)
    writer.save(str(path))


def _begin(spark: SparkSession, path: Path, schema: StructType | None) -> StagedAppend | None:
    """`delta_txn.begin` on the Delta table at `path`, the recorded transaction read by
    delta-rs at the transaction's snapshot version."""

    def recorded_at(version: int) -> int:
        found = _delta_rs(path, version).transaction_version(APP_ID)
        return -1 if found is None else int(found)

    return delta_txn.begin(spark, str(path), APP_ID, schema, recorded_at)


def _append_once(spark: SparkSession, rows: DataFrame | None, path: Path, version: int
                 ) -> None:
    """`_append` (`rows` None: no rows, the version recorded alone), through an open
    transaction (`delta_txn`) where `rows` keep the table's schema: the DataFrame writer's
    `txnAppId` check computes the table's whole state first, a Spark job the transaction
    does without."""
    staged = _begin(spark, path, None if rows is None else rows.schema)
    if staged is None:
        assert rows is not None
        _append(rows, path, version)
        return
    try:
        if staged.recorded < version:  # a replay of a recorded version appends nothing
            if rows is not None:
                staged.write(rows)
            staged.commit(version)
    finally:
        staged.abort()  # nothing, once committed


def stage(spark: SparkSession, table_dir: Path, schema: StructType) -> StagedAppend | None:
    """An open transaction on `updates` to write a commit's rows (of `schema`: the write
    schema plus `_time`, `_diff`) before it is decided (`delta_txn`), or None where the rows
    change the table's schema: those are appended by `commit` from a DataFrame."""
    return _begin(spark, updates_path(table_dir), schema)


def commit(spark: SparkSession, ident: TableIdentifier, table_dir: Path, state: TableState,
           rows: DataFrame | StagedAppend | None, *, replace_where: str | None = None,
           with_current: bool = True, checkpoint: bool = True) -> None:
    """Append `rows` (the new updates, on the write schema plus `_time`, `_diff`; None: none)
    to `updates` as version `state.version` (the commit point), then (`with_current`) bring
    `current` to it, then (`checkpoint`) write the tables' checkpoints that are due.
    `replace_where`: the updates it matches are replaced by `rows` (compaction's fold).

    `rows` may be a `StagedAppend` whose files are written: they are synced, then committed
    (data before the log entry that names it); it fails if another writer committed since it
    began."""
    path = updates_path(table_dir)
    if rows is None and replace_where is None:  # a version of no updates: recorded alone
        rows = _begin(spark, path, None)
        assert rows is not None
    if isinstance(rows, StagedAppend):
        if replace_where is not None:
            raise LakeError(f"table {ident}: a staged append cannot replace updates")
        if rows.recorded != state.version - 1:
            raise LakeError(
                f"table {ident}: expected committed version {state.version - 1}, found "
                f"{rows.recorded}; another writer committed meanwhile, nothing was changed")
        sync_tree(path, table_dir, newer_than=rows.started - SYNC_SLACK_SECONDS)
        rows.commit(state.version)
    else:
        held = spark.read.format("delta").load(str(path))
        if rows is None:
            rows = held.limit(0)
        if _widened(held.schema, rows.schema):
            _rewrite_updates(held, rows, path, state.version, replace_where)
        else:
            _append(rows, path, state.version, replace_where=replace_where)
    if with_current:
        catch_up(spark, ident, table_dir, state)
    if checkpoint:
        checkpoint_logs(spark, table_dir)


def checkpoint_logs(spark: SparkSession, table_dir: Path) -> None:
    """A checkpoint of `updates` and of `current` every `delta_txn.CHECKPOINT_EVERY` versions
    of each (`UPDATES_PROPERTIES`, `CURRENT_PROPERTIES`), so their logs' readers replay a few
    commits at most. (A `current` created before it had the property is checkpointed by its
    MERGEs as well, and is seldom due here.)"""
    delta_txn.checkpoint_if_due(spark, str(updates_path(table_dir)))
    delta_txn.checkpoint_if_due(spark, str(current_path(table_dir)))


def _widened(held: StructType, new: StructType) -> list[str]:
    """The columns of `held` whose type `new` holds wider (`schema.wider`: int to bigint,
    float to double), which a Delta table takes only with its `typeWidening` feature: Delta's
    schema merge refuses them without it, and delta-rs (`lake/arrow.py`) cannot read a table
    that has it. Types compare by their SQL text, which leaves nullability out."""
    types = {f.name.lower(): sql_type(f.dataType) for f in new.fields}
    return [f.name for f in held.fields
            if types.get(f.name.lower(), sql_type(f.dataType)) != sql_type(f.dataType)]


def _rewrite_updates(held: DataFrame, rows: DataFrame, path: Path, version: int,
                     replace_where: str | None) -> None:
    """Commit `rows` to `updates` as `_append` does, where they widen a column's type: the
    table rewritten whole on the wider schema (its rows cast up, those `replace_where` matches
    left out, and `rows`), replacing its schema, in the one commit that records `(APP_ID,
    version)`. O(table), once per widening."""
    types = {f.name.lower(): f.dataType for f in rows.schema.fields}
    fields = [f.name for f in held.schema.fields]
    fields += [f.name for f in rows.schema.fields if f.name.lower() not in
               {n.lower() for n in fields}]
    target = {n: types.get(n.lower(), held.schema[n].dataType if n in held.columns else None)
              for n in fields}

    def on_target(frame: DataFrame) -> DataFrame:
        have = {c.lower() for c in frame.columns}
        return frame.select(*[
            (F.col(quote(n)) if n.lower() in have else F.lit(None)).cast(t).alias(n)
            for n, t in target.items()])

    kept = held if replace_where is None else held.where(f"NOT ({replace_where})")
    on_target(kept).unionByName(on_target(rows)).write.format("delta").mode("overwrite") \
        .option("overwriteSchema", "true") \
        .option("txnAppId", APP_ID).option("txnVersion", str(version)).save(str(path))


def catch_up(spark: SparkSession, ident: TableIdentifier, table_dir: Path,
             state: TableState) -> None:
    """Apply to `current` the updates between the version it holds and `state` (committed),
    as one MERGE that records `state.version` (see the module docstring)."""
    from changelake.spark.settings import settings

    applied = transaction_version(spark, current_path(table_dir))
    if applied is not None and applied >= state.version:
        return
    held = read_manifest(table_dir, 0 if applied is None else applied)
    lower, upper = held.upper, state.upper
    moved = lower is not None and lower != upper
    rows = interval_sql(state, table_dir, lower, upper) if moved else None
    logical = logical_schema(state.versions)
    have = spark.table(ident.quoted).schema
    if _must_rewrite(have, held, state):
        _rewrite_current(spark, table_dir, state)
        return
    _add_columns(spark, ident, have, logical)
    live = live_columns(state.versions)
    conf = {"spark.databricks.delta.write.txnAppId": APP_ID,
            "spark.databricks.delta.write.txnVersion": str(state.version)}
    target = delta_literal(current_path(table_dir))
    with settings(spark, conf):
        if rows is None:
            # Nothing to apply: a commit of no updates still records the version.
            _append_once(spark, None, current_path(table_dir), state.version)
        elif state.keyed and _is_empty(current_path(table_dir)):
            # Nothing to match (a table's first rows): the latest rows appended, no join.
            _append_once(spark, _first_rows(spark, state, logical, rows),
                         current_path(table_dir), state.version)
        elif state.keyed:
            spark.sql(_keyed_merge(state, logical, rows, target))
        else:
            spark.sql(_unkeyed_merge(logical, live, rows, target))


def _must_rewrite(have: StructType, held: TableState, state: TableState) -> bool:
    """Whether `current` (of schema `have`), as `held` left it, cannot follow `state` by
    added columns and a MERGE, and is rewritten instead (`_rewrite_current`):

    * a column's type was widened (see `_widened`: no `typeWidening` feature, so that
      delta-rs still reads `current`);
    * an unkeyed table's live columns changed otherwise than by a new column: a column
      removed is null in every row read after the removal (`schema.py`), and one that comes
      back is live again in rows written before it left, as the Hive format reads them
      (`sql.state_sql`)."""
    if _widened(have, logical_schema(state.versions)):
        return True
    if state.keyed:
        return False
    before, after = set(live_columns(held.versions)), set(live_columns(state.versions))
    known = {f.name for f in logical_schema(held.versions).fields}
    return bool(before - after or (after - before) & known)


def _rewrite_current(spark: SparkSession, table_dir: Path, state: TableState) -> None:
    """`current` rewritten whole as `state`'s rows, read from `updates` as the Hive format
    reads its files (`sql.state_sql`), on the logical schema (replacing its own), in one
    overwrite that records `(APP_ID, state.version)`. O(table): for the schema changes
    `_must_rewrite` names, which a MERGE cannot make."""
    rows = spark.sql(state_sql(state, table_dir, marker=False))
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true") \
        .option("txnAppId", APP_ID).option("txnVersion", str(state.version)) \
        .save(str(current_path(table_dir)))


def _is_empty(path: Path) -> bool:
    """Whether the Delta table at `path` holds no data file (read by delta-rs: milliseconds)."""
    return len(_delta_rs(path).file_uris()) == 0


def _add_columns(spark: SparkSession, ident: TableIdentifier, have: StructType,
                 logical: StructType) -> None:
    """Columns the source added since `current` (of schema `have`) was written, added to it
    (null in its rows)."""
    names = {f.name.lower() for f in have.fields}
    new = [f for f in logical.fields if f.name.lower() not in names]
    if new:
        spark.sql(f"ALTER TABLE {ident.quoted} ADD COLUMNS ("
                  + ", ".join(f"{quote(f.name)} {sql_type(f.dataType)}" for f in new) + ")")


def interval_sql(state: TableState, table_dir: Path, lower: int, upper: int | None) -> str:
    """The updates at times in `[lower, upper)` on the logical schema."""
    return delta_union_sql(state, table_dir, lower=lower, upper=upper)


def _latest_per_key(state: TableState, logical: StructType, rows: str) -> str:
    """Each key's latest update in `rows` (its last time; at one time the insertion over the
    retraction), with `_del`: the key is gone. (A window: `max_by` over the row's struct is
    a sort aggregate in Spark, no faster.)"""
    key = ", ".join(quote(k) for k in state.key)
    cols = [quote(f.name) for f in logical.fields]
    return (f"SELECT {', '.join(cols)}, _diff <= 0 AS _del FROM (SELECT *, row_number() "
            f"OVER (PARTITION BY {key} ORDER BY _time DESC, _diff DESC) AS _rank FROM "
            f"({rows}) u) r WHERE _rank = 1")


def _first_rows(spark: SparkSession, state: TableState, logical: StructType,
                rows: str) -> DataFrame:
    """A keyed table's rows after `rows` (SQL: updates on the logical schema) where it held
    none before: each key's latest update unless it is a retraction. The updates are first
    reduced to each run of one key's latest (`LatestRows.java`: a table's files hold each
    key's updates together, so a pass keeps about one row a key), then `_latest_per_key`'s
    window, unchanged, sorts what is left instead of every update."""
    from changelake.spark.jvm import java_class

    runs = java_class(spark, LATEST_ROWS_CLASS).ofRuns(
        spark.sql(rows)._jdf, list(state.key), "_time", "_diff")
    return _latest_rows(spark, state, logical, DataFrame(runs, spark))


def _latest_rows(spark: SparkSession, state: TableState, logical: StructType,
                 updates: DataFrame) -> DataFrame:
    """Each key's row after `updates` (on the logical schema, with `_time` and `_diff`):
    its latest update unless that is a retraction (`_latest_per_key`)."""
    view = f"changelake_rows_{uuid.uuid4().hex}"
    updates.createOrReplaceTempView(view)
    cols = ", ".join(quote(f.name) for f in logical.fields)
    latest = _latest_per_key(state, logical, f"SELECT * FROM {view}")
    try:
        return spark.sql(f"SELECT {cols} FROM ({latest}) s WHERE NOT _del")
    finally:
        # The plan is resolved: the frame reads what the view named without it.
        spark.catalog.dropTempView(view)


def _keyed_merge(state: TableState, logical: StructType, rows: str, target: str) -> str:
    cols = [quote(f.name) for f in logical.fields]
    source = _latest_per_key(state, logical, rows)
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in state.key)
    return (f"MERGE INTO {target} t USING ({source}) s ON {on} "
            f"WHEN MATCHED AND s._del THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{c} = s.{c}' for c in cols)} "
            f"WHEN NOT MATCHED AND NOT s._del THEN INSERT ({', '.join(cols)}) "
            f"VALUES ({', '.join(f's.{c}' for c in cols)})")


def _unkeyed_merge(logical: StructType, live: list[str], rows: str, target: str) -> str:
    """Each changed row's copies deleted (one marker row matches them all) and its new
    multiplicity inserted, in one MERGE; the old multiplicity is counted in `current`.
    Rows are matched on the `live` columns (the others are null in `current`'s rows and in
    the new ones: see `_must_rewrite`), as the Hive format groups them (`sql.state_sql`)."""
    if any(has_map(f.dataType) for f in logical.fields):
        raise LakeError("an unkeyed Delta table cannot hold a map column yet (rows are "
                        "matched whole, and Spark cannot compare maps); give the table a key")
    cols = [quote(f.name) for f in logical.fields]
    listed = ", ".join(cols)
    matched = [quote(f.name) for f in logical.fields if f.name in live]
    same = " AND ".join(f"a.{c} <=> b.{c}" for c in matched) or "TRUE"
    projected = ", ".join(unkeyed_columns(logical, set(live)))
    changed = (f"SELECT {listed}, SUM(_diff) AS _n FROM (SELECT {projected}, _diff FROM "
               f"({rows}) r) u GROUP BY {listed} HAVING SUM(_diff) <> 0")
    held = (f"SELECT {', '.join(f'b.{c}' for c in cols)}, COUNT(*) AS _m FROM {target} b "
            f"LEFT SEMI JOIN ({changed}) a ON {same} GROUP BY {', '.join(f'b.{c}' for c in cols)}")
    joined = (f"SELECT {', '.join(f'a.{c}' for c in cols)}, a._n + COALESCE(b._m, 0) AS _new "
              f"FROM ({changed}) a LEFT JOIN ({held}) b ON {same}")
    source = (f"WITH j AS ({joined}) SELECT {listed}, TRUE AS _del FROM j UNION ALL "
              f"SELECT {listed}, FALSE AS _del FROM (SELECT {listed}, "
              f"explode(array_repeat(0, CAST(_new AS INT))) AS _copy FROM j WHERE _new > 0) c")
    on = " AND ".join(f"t.{c} <=> s.{c}" for c in matched) or "TRUE"
    return (f"MERGE INTO {target} t USING ({source}) s "
            f"ON s._del AND {on} WHEN MATCHED THEN DELETE "
            f"WHEN NOT MATCHED AND NOT s._del THEN INSERT ({listed}) "
            f"VALUES ({', '.join(f's.{c}' for c in cols)})")


def optimize(spark: SparkSession, table_dir: Path, retain_hours: float | None) -> None:
    """Compact both Delta tables' small files (`OPTIMIZE`); with `retain_hours`, remove the
    files no version of the last `retain_hours` refers to (`VACUUM`: readers of an older
    version, and time travel to it, then fail). Neither changes any row: no transaction is
    recorded."""
    for path in (current_path(table_dir), updates_path(table_dir)):
        spark.sql(f"OPTIMIZE {delta_literal(path)}")
        if retain_hours is not None:
            spark.sql(f"VACUUM {delta_literal(path)} RETAIN {float(retain_hours)} HOURS")
