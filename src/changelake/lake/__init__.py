"""Lake tables on Spark: exactly-once commits of CDC updates, merge-on-read, AS OF, compaction.

Layers, each importing only those above it: `identifier` (names, checked once), `layout`
(files and manifests) and `schema` (evolution) are values; `sql` and `scd2` turn a manifest
into the SQL of its views; `commit` is the one commit path (manifest, views, garbage
collection) and the writer lock; `table` and `compact` are the operations, and `changes` reads
a table out as a CDCv2 stream (its change feed); `catalog` ties a lake directory to a metastore;
`sources` groups captured tables by their source database (one time domain, one consistent
frontier); `commands` are what the CLI runs, and `report` renders them; `sql_endpoint`
serves the tables over JDBC (`changelake sql`), with AS OF functions.
"""

from changelake.lake.catalog import Lake, lake_session
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import FileSet, SchemaVersion, TableState
from changelake.lake.table import DEFAULT_BUCKETS, CommitResult, Table

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
