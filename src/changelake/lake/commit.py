"""The commit point, the writer lock, and garbage collection: every commit goes through
`commit_state` (table creation, ingest, compaction alike).

A commit is: write the new file sets, write the manifest `_state/v{N}.json`, then replace the
table's view with one whose text names version N and reads exactly N's file sets. Only that
last step is visible, and it is one metastore call (`ALTER VIEW ... AS`, a single
`alter_table`; `CREATE OR REPLACE VIEW` would drop and re-create, which a crash can split). So:

* a crash before it leaves version N-1 committed and readable; everything written is
  unreferenced and the next run (which computes the same version number and the same names)
  overwrites it;
* a crash after it leaves version N committed; the next run finds nothing left to do except
  garbage collection (and the SCD type 2 history view, which trails the table by one metastore
  call and is caught up by the next commit).

After the commit point the writer records N in the commit pointer `_state/COMMITTED` (see
`layout.write_pointer`), for readers that do not ask the metastore (`arrow.py`). A crash between
the view change and the pointer leaves the pointer one version behind the view, with a manifest
newer than the pointer: such a reader cannot tell that state from a commit in flight and hands
the read to Spark, until the next commit writes the pointer again, or a Spark-side read repairs
it (`repair_pointer`, which also removes manifests no commit reached, under the writer lock).

One writer per table at a time: writers hold an exclusive `flock` on `_lock` in the table
directory, which the kernel releases when the process dies (so kill -9 leaves no stale lock);
on a remote lake (`files.is_remote`) the lock is the object `_lock` itself, made by a
conditional PUT (`remote_writer_lock`), for both table formats. A Hive-format table's files
(manifests, pointer, file sets) go through `files.py` likewise, so it lives on a remote lake
as on a local one; its views are in the metastore of whoever committed, so several hosts
share one only through a shared metastore service (`--metastore-uri`; `load_state`).
A writer holds it from reading the committed state to its commit (see `Table.writer`).
Readers take no lock: the view they resolved names files that stay until no retained state
refers to them.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from changelake.durable import (
    SYNC_SLACK_SECONDS,
    exclusive_lock,
    sync_tree,
    try_exclusive_lock,
)
from changelake.errors import LakeError
from changelake.lake import delta_storage
from changelake.lake.files import StoreError, create_exclusive, is_remote, remove_tree
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import (
    TableState,
    file_set_leaves,
    manifest_path,
    manifest_versions,
    read_manifest,
    read_pointer,
    write_manifest,
    write_pointer,
)
from changelake.lake.scd2 import scd2_sql
from changelake.lake.schema import parse_struct
from changelake.lake.sql import read_marker, state_sql, string_literal
from changelake.private import process_alive
from changelake.redact import redact

DEFAULT_RETAIN = 2
"""States whose files survive garbage collection whatever their age: the current one and the
one before."""

DEFAULT_GRACE_SECONDS = 300.0
"""How long a replaced state's files stay, for readers that resolved its view just before it
was replaced (a query that takes longer than this on a table committed to meanwhile can fail
with a missing file, as on any lake format with vacuuming)."""


def view_text(spark: SparkSession, ident: TableIdentifier) -> str | None:
    """The committed view's SQL text, or None if there is no such table.

    Asked of the metastore directly (Spark's external catalog), not through `DESCRIBE TABLE
    EXTENDED`: every command and every committed batch reads it, and the statement's analysis
    made each read markedly slower (`benchmarks/bench_view_text.py`; the figures are in
    benchmarks/README.md, "The floor of a keyed conversion")."""
    catalog = spark._jsparkSession.sharedState().externalCatalog()  # type: ignore[union-attr]
    if not catalog.tableExists(ident.database, ident.name):
        return None
    text = catalog.getTable(ident.database, ident.name).viewText()
    if not text.isDefined():
        raise LakeError(f"{ident} exists in the metastore but is not a changelake table "
                        "(no view)")
    return str(text.get())


def committed_version(spark: SparkSession, ident: TableIdentifier) -> int | None:
    text = view_text(spark, ident)
    if text is None:
        return None
    version = read_marker(text)
    if version is None:
        raise LakeError(f"{ident} exists in the metastore but is not a changelake table")
    return version


def load_state(spark: SparkSession, ident: TableIdentifier, table_dir: Path
               ) -> TableState | None:
    """The committed manifest of the table, or None: no such table (or one whose creation
    never reached its commit point). A Delta table's committed version is in Delta's log
    (`delta_storage`); a Hive-format table's in its view's text.

    A remote lake's metastore may be another than the one its tables were committed in
    (each machine keeps its own unless given a service, `files.local_home`): a Delta table
    it lacks is registered at its first use; a Hive-format table whose commit point, the
    view, is in another metastore (its commit pointer says it was committed) is a LakeError,
    so that no writer takes it for a new table and overwrites it."""
    if is_delta(spark, ident):
        return delta_storage.load(spark, table_dir)
    if is_remote(table_dir) and view_text(spark, ident) is None:
        # A remote lake's metastore is this machine's: a table another machine made is
        # registered here at its first use (its commit point is Delta's log, on the store).
        state = delta_storage.load(spark, table_dir)
        if state is not None:
            delta_storage.register(spark, ident, table_dir)
            return state
        if read_pointer(table_dir) is None:
            return None
        # The pointer is written after the view: a first commit that made both since the view
        # was asked above (a writer racing this read, through this metastore) shows its
        # view now; none means the view is in another metastore.
        if view_text(spark, ident) is None:
            raise LakeError(
                f"table {ident} ({redact(str(table_dir))}) is a Hive-format table committed "
                "through another metastore (its views are there, not in this one): give "
                "every command on the lake the same metastore service (--metastore-uri)")
    version = committed_version(spark, ident)
    return None if version is None else read_manifest(table_dir, version)


def is_delta(spark: SparkSession, ident: TableIdentifier) -> bool:
    """Whether the metastore has `ident` as a Delta table (a changelake table's `current`)."""
    catalog = spark._jsparkSession.sharedState().externalCatalog()  # type: ignore[union-attr]
    if not catalog.tableExists(ident.database, ident.name):
        return False
    provider = catalog.getTable(ident.database, ident.name).provider()
    return bool(provider.isDefined() and str(provider.get()).lower() == "delta")


@contextmanager
def writer_lock(table_dir: Path) -> Iterator[None]:
    """Exclusive per-table writer lock; blocks until the previous writer is done or dead.

    `flock` belongs to an open file description, so taking it twice in one process (even on
    one thread) blocks forever: a writer takes it once (`Table.writer`) and passes the locked
    handle inward. A table on a remote lake (`files.is_remote`), of either format, has no
    `flock`: `remote_writer_lock` instead."""
    if is_remote(table_dir):
        with remote_writer_lock(table_dir):
            yield
        return
    table_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(table_dir / "_lock"):
        yield


LOCK_WAIT_ENV = "CHANGELAKE_LOCK_WAIT_SECONDS"
DEFAULT_LOCK_WAIT_SECONDS = 120.0
"""How long a writer on a remote lake waits for another's lock object to go before it
gives up (`CHANGELAKE_LOCK_WAIT_SECONDS` overrides it)."""


@contextmanager
def remote_writer_lock(table_dir: Path) -> Iterator[None]:
    """The writer lock of a table on a remote lake: the object `_lock` in its directory,
    created only where none is (`files.create_exclusive`: on S3 a conditional PUT,
    `If-None-Match: *`, so of two writers on any hosts exactly one creates it), holding who
    took it, and deleted when the writer is done. A writer that finds it waits for it to go
    (`LOCK_WAIT_ENV`), then fails in one line naming the holder, having written nothing.

    Unlike `flock`, nothing releases it when its holder dies: a holder on this host whose
    process is gone is recognised and its lock taken over; one left by a killed writer on
    another host stays until someone deletes the object (the message says so)."""
    lock = table_dir / "_lock"
    mine = _lock_record()
    wait = float(os.environ.get(LOCK_WAIT_ENV) or DEFAULT_LOCK_WAIT_SECONDS)
    deadline = time.monotonic() + wait
    while not _take_remote_lock(lock, mine):
        holder = _lock_holder(lock)
        if holder is None:
            continue  # released meanwhile: try again at once
        if time.monotonic() >= deadline:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                  time.gmtime(float(holder.get("since") or 0)))
            raise LakeError(
                f"table directory {table_dir}: another writer holds its lock {lock} (host "
                f"{holder.get('host')}, pid {holder.get('pid')}, since {since}); nothing was "
                "written. One writer per table at a time on a remote lake: if that writer is "
                "gone, delete the lock object")
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    try:
        yield
    finally:
        _release_remote_lock(lock, mine)


@contextmanager
def try_writer_lock(table_dir: Path) -> Iterator[bool]:
    """The writer lock if nobody holds it now: yields True with it held for the block, or
    False at once (nothing waited for, nothing taken), also where it cannot be taken at all
    (a lake directory this process may not write to). For work that may be left to a later
    writer (`repair_pointer`)."""
    if is_remote(table_dir):
        lock = table_dir / "_lock"
        mine = _lock_record()
        try:
            taken = _take_remote_lock(lock, mine)
        except StoreError:  # e.g. read-only credentials
            taken = False
        if not taken:
            yield False
            return
        try:
            yield True
        finally:
            _release_remote_lock(lock, mine)
        return
    with try_exclusive_lock(table_dir / "_lock") as held:
        yield held


def _lock_record() -> str:
    """What a remote lock object holds: who took it, when, and a token of this taking."""
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "since": time.time(), "token": uuid.uuid4().hex})


def _take_remote_lock(lock: Path, mine: str) -> bool:
    """One attempt at the lock object: created holding `mine`, or taken over from a holder
    on this host whose process is gone (then created again). False: someone else holds it."""
    while not create_exclusive(lock, mine):
        holder = _lock_holder(lock)
        if holder is None:
            continue  # released meanwhile: try again at once
        if holder.get("host") == socket.gethostname() and not _alive(holder.get("pid")):
            if _lock_holder(lock) == holder:  # still the dead one's: take it over
                lock.unlink(missing_ok=True)
            continue
        return False
    return True


def _release_remote_lock(lock: Path, mine: str) -> None:
    if _lock_holder(lock) == json.loads(mine):
        lock.unlink(missing_ok=True)


def _lock_holder(lock: Path) -> dict | None:
    try:
        raw = json.loads(lock.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return raw if isinstance(raw, dict) else {}


def _alive(pid: object) -> bool:
    """Whether the holder's process `pid` may still run: a lock whose pid is missing or
    malformed is not known to be gone."""
    return type(pid) is not int or pid <= 0 or process_alive(pid)


def commit_state(spark: SparkSession, ident: TableIdentifier, table_dir: Path,
                 state: TableState, *, expected: int | None,
                 retain: int = DEFAULT_RETAIN, rows: DataFrame | None = None,
                 write_struct: StructType | None = None,
                 replace_where: str | None = None, with_current: bool = True,
                 checkpoint: bool = True) -> int:
    """Make `state` the committed version of the table, with the writer lock held: write its
    manifest, replace the view (the commit point), replace the history view if the table keeps
    one, and collect garbage. Returns how many file sets garbage collection deleted.

    A Delta table (`state.storage`) commits by appending `rows` (its new updates, None: none)
    to its updates table instead (`delta_storage`), replacing those `replace_where` matches
    (compaction); `write_struct` is the physical schema a Delta table is created with;
    without `with_current`, its `current` is left behind the commit for the caller to catch up,
    and without `checkpoint` the logs' checkpoints that are due are left to it too
    (`current_follower.py`).

    `expected` is the version `state` was derived from (None: the table is being created);
    anything else committed meanwhile is an error, which the writer lock makes a sign of a
    second lake directory or a foreign writer.

    Durable before told (`durable.py`): a Hive-format table's file sets are synced by their
    writers before this is called, the manifest (and a new table's directories) before the
    commit point, the pointer after it (on a remote lake each is an object whose PUT is
    durable once acknowledged, and `sync_tree` has nothing to do). A Delta table's log store
    syncs nothing: what the append and the MERGE changed is synced after them, before this
    returns, so the caller acknowledges its source (a slot, group offsets) only after it."""
    started = time.time() - SYNC_SLACK_SECONDS
    write_manifest(table_dir, state)
    if expected is None:  # a new table: its directory in the lake before the view names it
        sync_tree(table_dir / "_state", _lake_root(table_dir))
    if state.storage == delta_storage.STORAGE:
        current = delta_storage.committed_version(spark, table_dir)
        if current != expected:
            raise LakeError(
                f"table {ident}: expected committed version {expected}, found {current}; "
                "another writer committed meanwhile, nothing was changed")
        if expected is None:
            delta_storage.create(spark, ident, table_dir, state,
                                 write_struct or parse_struct(state.versions[-1].struct))
        else:
            delta_storage.commit(spark, ident, table_dir, state, rows,
                                 replace_where=replace_where, with_current=with_current,
                                 checkpoint=checkpoint)
        delta_storage.sync(table_dir, None if expected is None else started)
        _history_view(spark, ident, table_dir, state)
        return 0
    sql = state_sql(state, table_dir)
    current = committed_version(spark, ident)
    if current != expected:
        raise LakeError(
            f"table {ident}: expected committed version {expected}, found {current}; "
            "another writer committed meanwhile, nothing was changed"
        )
    if expected is None:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{ident.database}`")
        spark.sql(
            f"CREATE VIEW {ident.quoted} TBLPROPERTIES ("
            f"'changelake.location' = {string_literal(str(table_dir))}, "
            f"'changelake.key' = {string_literal(','.join(state.key))}) AS {sql}"
        )
    else:
        spark.sql(f"ALTER VIEW {ident.quoted} AS {sql}")
    write_pointer(table_dir, state.version)  # after the commit point: it never runs ahead
    _history_view(spark, ident, table_dir, state)
    return collect_garbage(table_dir, state, retain)


def _lake_root(table_dir: Path) -> Path:
    """The lake directory above a table's (`tables/DB/NAME`), up to which a new table's
    directories are synced."""
    parents = table_dir.parents
    return parents[min(2, len(parents) - 1)]


def _history_view(spark: SparkSession, ident: TableIdentifier, table_dir: Path,
                  state: TableState) -> None:
    """The SCD type 2 view `NAME_history` of a table that keeps one, replaced."""
    if state.scd2:
        history = ident.history()
        verb = "ALTER" if spark.catalog.tableExists(history.quoted) else "CREATE"
        spark.sql(f"{verb} VIEW {history.quoted} AS {scd2_sql(state, table_dir)}")


def repair_pointer(spark: SparkSession, ident: TableIdentifier, table_dir: Path) -> bool:
    """Bring the commit pointer to the committed version, if no writer holds the table: for
    tables committed before pointers existed, and after a crash between a view change and its
    pointer. Manifests newer than the committed version (left by a run that crashed before its
    commit point; the next run would overwrite them) are removed, so a reader without the
    metastore can trust the pointer again. Returns whether anything changed.

    Only with the writer lock taken without waiting (`try_writer_lock`: a writer in flight is
    left alone, its own commit writes the pointer), and only when the lake directory is
    writable: a read must not fail because of it. On a local or a remote lake alike."""
    if not (table_dir / "_state").is_dir() or is_delta(spark, ident):
        return False  # a Delta table has no pointer: Delta's log is the commit point
    try:
        with try_writer_lock(table_dir) as held:
            if not held:
                return False
            version = committed_version(spark, ident)
            if version is None or not manifest_path(table_dir, version).exists():
                return False
            changed = False
            for newer in (v for v in manifest_versions(table_dir) if v > version):
                manifest_path(table_dir, newer).unlink(missing_ok=True)
                changed = True
            if read_pointer(table_dir) != version:
                write_pointer(table_dir, version)
                changed = True
            return changed
    except (OSError, StoreError):
        return False


def collect_garbage(table_dir: Path, state: TableState, retain: int = DEFAULT_RETAIN,
                    grace_seconds: float = DEFAULT_GRACE_SECONDS) -> int:
    """Delete file sets that no committed state a reader may still be using refers to; return
    how many were deleted.

    A state may be in use from its commit until `grace_seconds` after the next commit replaced
    it (a reader resolves the view, then lists and reads the files it names), and the last
    `retain` states are kept regardless. Call with the writer lock held and `state` just
    committed: every other file set on disk was then either superseded longer ago, or left by
    a run that crashed before its commit (never visible); both are garbage.
    """
    now = time.time()
    keep: set[str] = {f.path for f in state.files}
    replaced_at = state.committed_at  # when the state below `version` stopped being current
    version = state.version - 1
    while version >= 0:
        in_window = version > state.version - retain or now - replaced_at < grace_seconds
        if not in_window:
            break
        try:
            old = read_manifest(table_dir, version)
        except LakeError:
            break
        keep.update(f.path for f in old.files)
        replaced_at = old.committed_at
        version -= 1
    removed = 0
    for leaf in list(file_set_leaves(table_dir)):
        if leaf not in keep:
            remove_tree(table_dir / leaf)
            removed += 1
    for kind in ("delta", "base"):
        top = table_dir / kind
        if not top.is_dir():
            continue
        for run in top.iterdir():
            if run.is_dir() and not any(p.is_dir() for p in run.iterdir()):
                remove_tree(run)
    return removed
