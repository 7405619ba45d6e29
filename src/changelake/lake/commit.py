"""The commit point, the writer lock, and garbage collection.

A commit is: write the new file sets, write the manifest `_state/v{N}.json`, then replace the
table's view with one whose text names version N and reads exactly N's file sets. Only that
last step is visible, and it is one metastore call (`ALTER VIEW ... AS`, a single
`alter_table`; `CREATE OR REPLACE VIEW` would drop and re-create, which a crash can split). So:

* a crash before it leaves version N-1 committed and readable; everything written is
  unreferenced and the next run (which computes the same version number and the same names)
  overwrites it;
* a crash after it leaves version N committed; the next run finds nothing left to do except
  garbage collection.

One writer per table at a time: writers hold an exclusive `flock` on `_lock` in the table
directory, which the kernel releases when the process dies (so kill -9 leaves no stale lock).
Readers take no lock: the view they resolved names files that stay until no retained state
refers to them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from changelake.errors import LakeError
from changelake.lake.layout import TableState, file_set_leaves, read_manifest, write_manifest
from changelake.lake.sql import quote, read_marker, state_sql

DEFAULT_RETAIN = 2
"""States whose files survive garbage collection whatever their age: the current one and the
one before."""

DEFAULT_GRACE_SECONDS = 300.0
"""How long a replaced state's files stay, for readers that resolved its view just before it
was replaced (a query that takes longer than this on a table committed to meanwhile can fail
with a missing file, as on any lake format with vacuuming)."""


def split_name(name: str) -> tuple[str, str]:
    parts = name.split(".")
    if len(parts) == 1:
        return "default", parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise LakeError(f"table name {name!r} must be NAME or DATABASE.NAME")


def qualified(name: str) -> str:
    db, table = split_name(name)
    return f"{quote(db)}.{quote(table)}"


def view_text(spark: SparkSession, name: str) -> str | None:
    """The committed view's SQL text, or None if there is no such table."""
    db, table = split_name(name)
    if not spark.catalog.tableExists(f"{quote(db)}.{quote(table)}"):
        return None
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(name)}").collect():
        if row[0] == "View Text":
            return str(row[1])
    raise LakeError(f"{name} exists in the metastore but is not a changelake table (no view)")


def committed_version(spark: SparkSession, name: str) -> int | None:
    text = view_text(spark, name)
    if text is None:
        return None
    marker = read_marker(text)
    if marker is None:
        raise LakeError(f"{name} exists in the metastore but is not a changelake table")
    return marker[1]


def load_state(spark: SparkSession, name: str, table_dir: Path) -> TableState | None:
    version = committed_version(spark, name)
    return None if version is None else read_manifest(table_dir, version)


@contextmanager
def writer_lock(table_dir: Path) -> Iterator[None]:
    """Exclusive per-table writer lock; blocks until the previous writer is done or dead."""
    table_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(table_dir / "_lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def publish(spark: SparkSession, table_dir: Path, state: TableState, *,
            expected: int | None) -> None:
    """Make `state` the committed version. `expected` is the version it was derived from
    (None: the table is being created); anything else committed meanwhile is an error, which
    the writer lock makes a sign of a second lake directory or a foreign writer."""
    write_manifest(table_dir, state)
    sql = state_sql(state, table_dir)
    current = committed_version(spark, state.name)
    if current != expected:
        raise LakeError(
            f"table {state.name}: expected committed version {expected}, found {current}; "
            "another writer committed meanwhile, nothing was changed"
        )
    if expected is None:
        db, _ = split_name(state.name)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote(db)}")
        spark.sql(
            f"CREATE VIEW {qualified(state.name)} TBLPROPERTIES ("
            f"'changelake.location' = '{table_dir}', 'changelake.key' = '{','.join(state.key)}')"
            f" AS {sql}"
        )
    else:
        spark.sql(f"ALTER VIEW {qualified(state.name)} AS {sql}")


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
            shutil.rmtree(table_dir / leaf, ignore_errors=True)
            removed += 1
    for kind in ("delta", "base"):
        top = table_dir / kind
        if not top.is_dir():
            continue
        for run in top.iterdir():
            if run.is_dir() and not any(p.is_dir() for p in run.iterdir()):
                shutil.rmtree(run, ignore_errors=True)
    return removed
