"""`Lake`: a lake directory and the Hive metastore that names its tables.

    LAKE/
      metastore/metastore_db    embedded Derby (default; one JVM at a time)
      metastore/conf            hive-site.xml of `changelake metastore` (the shared service)
      warehouse/                Spark's warehouse directory (databases)
      tables/DB/NAME/           one directory per table (see `layout.py`)

The metastore holds one view per table, the commit point; everything else is in the table
directory. Any metastore works (`metastore_uri`, or whatever the session was built with), as
long as it is always used with the same lake directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from changelake.errors import LakeError
from changelake.lake.commit import load_state, publish, split_name
from changelake.lake.layout import SchemaVersion, TableState
from changelake.lake.schema import evolve, struct_json
from changelake.lake.sql import path_literal
from changelake.lake.table import Table

DEFAULT_BUCKETS = 8


def lake_session(lake: Path | str, master: str = "local[*]", *, metastore_uri: str | None = None,
                 app_name: str = "changelake", conf: dict[str, str] | None = None
                 ) -> SparkSession:
    """A session on the lake's metastore: the service at `metastore_uri` if given (several
    processes at once), else the embedded Derby under the lake directory (one process)."""
    from changelake.spark.session import build_session

    root = Path(lake).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if metastore_uri:
        return build_session(master, app_name=app_name, conf=conf, metastore_uri=metastore_uri,
                             warehouse_dir=root / "warehouse")
    return build_session(master, app_name=app_name, conf=conf,
                         hive_metastore_dir=root / "metastore", warehouse_dir=root / "warehouse")


class Lake:
    """The tables of one lake directory, through a SparkSession on its metastore."""

    def __init__(self, spark: SparkSession, root: Path | str) -> None:
        self.spark = spark
        self.root = Path(root).resolve()
        path_literal(self.root)  # refuse glob characters early, with a clear message

    def table_dir(self, name: str) -> Path:
        db, table = split_name(name)
        return self.root / "tables" / db / table

    def exists(self, name: str) -> bool:
        return load_state(self.spark, name, self.table_dir(name)) is not None

    def table(self, name: str) -> Table:
        table = Table(self.spark, name, self.table_dir(name))
        if not self.exists(name):
            raise LakeError(f"table {name} does not exist in lake {self.root}")
        return table

    def create_table(self, name: str, schema: StructType, *, key: Sequence[str] = (),
                     buckets: int = DEFAULT_BUCKETS, since: int = 0, scd2: bool = False,
                     exist_ok: bool = False) -> Table:
        """Create an empty table committed through `since` (its history starts there)."""
        directory = self.table_dir(name)
        if self.exists(name):
            if exist_ok:
                return Table(self.spark, name, directory)
            raise LakeError(f"table {name} already exists in lake {self.root}")
        if buckets < 1:
            raise LakeError("a table needs at least one bucket")
        evolution = evolve((), schema, since, key=key, table=name)
        logical = evolution.write_struct
        state = TableState(
            name=name, version=0, key=tuple(key), buckets=buckets, since=since,
            frontier=(since,), versions=(SchemaVersion(since, struct_json(logical)),),
            structs=(), bucket_columns=tuple(key) or tuple(logical.fieldNames()), scd2=scd2,
        )
        publish(self.spark, directory, state, expected=None)
        if scd2:
            from changelake.lake.scd2 import publish_history

            publish_history(Table(self.spark, name, directory))
        return Table(self.spark, name, directory)

    def open_or_create(self, name: str, schema: StructType, *, key: Sequence[str] = (),
                       buckets: int = DEFAULT_BUCKETS, since: int = 0) -> Table:
        if self.exists(name):
            table = Table(self.spark, name, self.table_dir(name))
            have = table.state().key
            if key and tuple(key) != have:
                raise LakeError(f"table {name} is keyed by {list(have)}, not {list(key)}")
            return table
        return self.create_table(name, schema, key=key, buckets=buckets, since=since)

    def tables(self) -> list[str]:
        """The lake's tables: views in the metastore whose data lives under this lake."""
        found: list[str] = []
        for db in sorted(d.name for d in (self.root / "tables").glob("*") if d.is_dir()):
            if not self.spark.catalog.databaseExists(db):
                continue
            for t in self.spark.catalog.listTables(db):
                name = f"{db}.{t.name}" if db != "default" else t.name
                if (self.table_dir(name) / "_state").is_dir() and self.exists(name):
                    found.append(name)
        return sorted(found)

