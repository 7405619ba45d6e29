"""Lake tables on Spark: exactly-once commits of CDC updates, merge-on-read, AS OF, compaction.

Layers, each importing only those above it: `files` (the driver's own file operations, on
a local directory or any Hadoop FileSystem URI), `identifier` (names, checked once), `layout`
(files, manifests and the commit pointer) and `schema` (evolution) are values; `follow_lag`
says how far a followed source is ahead of its table; `arrow` reads a
committed state without a JVM (merge-on-read in pyarrow, for `status` and `snapshot`); `sql`
and `scd2` turn a manifest into the SQL of its views; `delta_storage` is the Delta Lake back
end, and `current_follower` brings its `current` tables up to their commits in a thread of its
own; `commit` is the one commit path
(manifest, views, pointer, garbage collection) and the writer lock; `key_rule` is the rule
a keyed table's commits keep (one row per key); `table` and `compact` are the operations, and
`changes` reads a table out as a CDCv2 stream (its change feed); `catalog` ties a lake
directory to a metastore; `sources` groups captured tables by their source database
(one time domain, one consistent frontier); `api` holds the lake's commands as functions
(open a lake, snapshot, compact, status), `ingest` is the ingest core, and the ingests from
Kafka build on it (`kafka_ingest`
from topics of Materialize CDC messages, `kafka_changefeed` from Debezium and YDB topics,
`follow` a streaming query over a directory or topics, `follow_changefeed` rounds of
`kafka_changefeed` ingests), and `report`
renders them; `sql_endpoint` serves the tables over JDBC (`changelake sql`), with AS
OF functions.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from changelake.lake.catalog import Lake, lake_session
    from changelake.lake.identifier import TableIdentifier
    from changelake.lake.layout import FileSet, SchemaVersion, TableState
    from changelake.lake.table import DEFAULT_BUCKETS, CommitResult, Table

# Imported when first asked for, so that `changelake.lake.arrow` (reads without a JVM) can be
# imported without importing pyspark through this package.
_EXPORTS = {
    "DEFAULT_BUCKETS": "table", "CommitResult": "table", "FileSet": "layout", "Lake": "catalog",
    "SchemaVersion": "layout", "Table": "table", "TableIdentifier": "identifier",
    "TableState": "layout", "lake_session": "catalog",
}

__all__ = [
    "DEFAULT_BUCKETS",
    "CommitResult",
    "FileSet",
    "Lake",
    "SchemaVersion",
    "Table",
    "TableIdentifier",
    "TableState",
    "lake_session",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"changelake.lake.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
