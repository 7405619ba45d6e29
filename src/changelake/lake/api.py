"""The lake's commands as functions, for Python callers and the CLI: open a lake, read a
table now, AS OF a time or as its history, compact it, report the lake's status, serve its
metastore. Each takes a `Lake` (on a SparkSession: `open_lake` builds one on the lake's
metastore) and returns data; printing belongs to the CLI (`report.py` renders it). Ingest
is `ingest.py`.

    open_lake(lake, master=...)                                   -> Lake
    snapshot(lake, table, as_of=..., history=...)                 -> Iterator[dict]
    compact(lake, table, since=...)                               -> CompactionResult
    status(lake)                                                  -> list[TableStatus]
    lake_status(lake)                        -> LakeStatus: tables, and source databases
    metastore(lake, port=...)                                     -> exit status
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from changelake.lake.arrow import LakeStatus, TableStatus, plain, status_of
from changelake.lake.catalog import Lake, lake_session
from changelake.lake.commit import repair_pointer
from changelake.lake.compact import CompactionPolicy, CompactionResult
from changelake.lake.compact import compact as compact_table
from changelake.lake.files import lake_root
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import TableState
from changelake.lake.metastore import DEFAULT_PORT, serve
from changelake.lake.sources import DEFAULT_PROBE_SECONDS, check_as_of, lake_states, statuses
from changelake.lake.sql import path_literal
from changelake.lake.table import ProgressFn, check_storage
from changelake.spark.instants import with_instants


def open_lake(lake: Path | str, spark: SparkSession | None = None, *, master: str = "local[*]",
              metastore_uri: str | None = None, conf: dict[str, str] | None = None,
              storage: str | None = None) -> Lake:
    """The lake on `spark`, or on a session built for it (embedded Derby under the lake, or
    the metastore service at `metastore_uri`); `storage` is the format of the tables its
    commands create ("delta" or "hive"; default: `table.default_storage()`)."""
    path_literal(lake_root(lake))  # a lake path Spark would misread: before Spark starts
    if storage is not None:
        check_storage(storage)
    if spark is None:
        spark = lake_session(lake, master, metastore_uri=metastore_uri, conf=conf)
    return Lake(spark, lake, storage=storage)


# -------------------------------------------------------------------------------- snapshot


def snapshot(lake: Lake, table: str | TableIdentifier, *, as_of: int | None = None,
             history: bool = False) -> Iterator[dict[str, Any]]:
    """The rows of `table` now (through the metastore view, as any Spark SQL reader sees it,
    where it holds the committed version: `Table.latest`),
    AS OF a time, or (`history`) its SCD type 2 versions, as plain dicts, streamed.

    AS OF a captured table is refused beyond its source database's consistent frontier, where
    the database's other tables are not yet (see `sources.py`)."""
    handle = lake.table(table)
    repair_pointer(lake.spark, handle.ident, handle.directory)
    if history:
        frame = handle.history().orderBy(*handle.state().key, "valid_from")
    elif as_of is None:
        frame = handle.latest()
    else:
        check_as_of(handle.state(), as_of, lambda: lake_states(lake))
        frame = handle.as_of(as_of)
    frame, instants = with_instants(frame)  # not PySpark's local times: see spark/instants
    for row in frame.toLocalIterator():
        yield plain(instants(row.asDict(recursive=True)))


def snapshot_columns(lake: Lake, table: str | TableIdentifier, *, history: bool = False
                     ) -> list[str]:
    names = lake.table(table).schema.fieldNames()
    return [*names, "valid_from", "valid_to"] if history else names


# --------------------------------------------------------------------------------- compact


def compact(lake: Lake, table: str | TableIdentifier, *, since: int | None = None,
            policy: CompactionPolicy | None = None, progress: ProgressFn | None = None
            ) -> CompactionResult:
    return compact_table(lake.table(table), since, policy=policy, progress=progress)


# ---------------------------------------------------------------------------------- status


def table_status(lake: Lake, name: str | TableIdentifier, *, count_rows: bool = True,
                 state: TableState | None = None, live: bool = False,
                 timeout: float = DEFAULT_PROBE_SECONDS) -> TableStatus:
    """The table's status, from its committed `state` if the caller has just read it; `live`
    asks a Kafka source its partitions' ends (the lag), each within `timeout` seconds."""
    handle = lake.table(name) if state is None else lake.handle(name)
    state = state if state is not None else handle.state()
    rows = handle.latest().count() if count_rows else -1
    offsets = None
    if state.offsets is not None and state.offsets.kind == "kafka":
        from changelake.kafka.lag import offsets_status

        offsets = offsets_status(state.offsets, live=live, timeout=timeout,
                                 frontier=state.upper)
    return status_of(state, handle.directory, handle.name, rows, offsets=offsets, live=live)


def status(lake: Lake, *, count_rows: bool = True) -> list[TableStatus]:
    """Per table: frontier, since, rows (a count of the current state), segments, Parquet
    files, bytes, and the last commit."""
    return lake_status(lake, count_rows=count_rows, live=False).tables


def lake_status(lake: Lake, *, count_rows: bool = True, live: bool = True,
                timeout: float = DEFAULT_PROBE_SECONDS) -> LakeStatus:
    """`status`, and per source database of captured tables: its tables, their consistent
    frontier, and (`live`) its slots' lag asked of the database, each within `timeout`
    seconds (an unreachable database is reported, not an error). Each table's state is read
    once, for both."""
    handles = [lake.handle(name) for name in lake.tables()]
    states = [handle.state() for handle in handles]
    for handle in handles:  # so that the next read of the table needs no JVM (see arrow.py)
        repair_pointer(lake.spark, handle.ident, handle.directory)
    tables = [table_status(lake, s.name, count_rows=count_rows, state=s, live=live,
                           timeout=timeout) for s in states]
    return LakeStatus(tables, statuses(states, live=live, timeout=timeout))


# ------------------------------------------------------------------------------- metastore


def metastore(lake: Path | str, *, port: int | None = None) -> int:
    """Serve the lake's metastore until interrupted (see `metastore.py`); the exit status."""
    return serve(lake, port or DEFAULT_PORT)
