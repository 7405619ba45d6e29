"""Lake tables on Spark: exactly-once commits of CDC updates, merge-on-read, AS OF, compaction.

Layers: `layout` (files and manifests) and `schema` (evolution) are values; `sql` turns a
manifest into the SQL of its view; `commit` is the atomic commit point; `table` and `compact`
are the operations; `catalog` ties a lake directory to a metastore; `jobs` are what the CLI
runs.
"""

from changelake.lake.catalog import DEFAULT_BUCKETS, Lake, lake_session
from changelake.lake.layout import FileSet, SchemaVersion, TableState
from changelake.lake.table import CommitResult, Table

__all__ = [
    "DEFAULT_BUCKETS",
    "CommitResult",
    "FileSet",
    "Lake",
    "SchemaVersion",
    "Table",
    "TableState",
    "lake_session",
]
