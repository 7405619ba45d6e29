"""`Lake`: a lake directory and the Hive metastore that names its tables.

    LAKE/
      metastore/metastore_db    embedded Derby (default; one JVM at a time)
      metastore/conf            hive-site.xml of `changelake metastore` (the shared service)
      warehouse/                Spark's warehouse directory (databases)
      tables/DB/NAME/           one directory per table (see `layout.py`); DB and NAME are
                                identifiers, lower-cased (see `identifier.py`)

The metastore holds one view per table, the commit point; everything else is in the table
directory. Any metastore works (`metastore_uri`, or whatever the session was built with), as
long as it is always used with the same lake directory.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from changelake.durable import fsync_directory
from changelake.errors import LakeError
from changelake.lake.files import (
    RemotePath,
    lake_root,
    local_home,
    object_store_conf,
    probe,
)
from changelake.lake.identifier import IDENTIFIER, TableIdentifier
from changelake.lake.layout import Origin
from changelake.lake.sql import path_literal
from changelake.lake.table import DEFAULT_BUCKETS, Table

if TYPE_CHECKING:
    from changelake.lake.current_follower import CurrentFollower


def lake_session(lake: Path | str, master: str = "local[*]", *, metastore_uri: str | None = None,
                 app_name: str = "changelake", conf: dict[str, str] | None = None
                 ) -> SparkSession:
    """A session on the lake's metastore: the service at `metastore_uri` if given (several
    processes at once), else the embedded Derby under the lake directory (one process)."""
    from changelake.private import PrivateFolderError
    from changelake.spark.session import SparkStartError, build_session

    root = lake_root(lake)
    if isinstance(root, RemotePath):
        return _remote_lake_session(root, master, metastore_uri=metastore_uri,
                                    app_name=app_name, conf=conf)
    new_root = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    metastore = root / "metastore"
    new_metastore = not metastore.exists()
    try:
        if metastore_uri:
            return build_session(master, app_name=app_name, conf=conf,
                                 metastore_uri=metastore_uri, warehouse_dir=root / "warehouse")
        _refuse_a_booted_metastore(root, metastore)
        fresh = _begin_embedded_metastore(metastore)
        spark = build_session(master, app_name=app_name, conf=conf,
                              hive_metastore_dir=metastore, warehouse_dir=root / "warehouse")
    except (SparkStartError, PrivateFolderError):  # a master, setting or folder refused:
        # leave nothing half-made behind
        if new_root:
            shutil.rmtree(root, ignore_errors=True)
        elif new_metastore:
            shutil.rmtree(metastore, ignore_errors=True)
        raise
    if fresh:
        # Creating the Derby database and the metastore's `default` database is not atomic: a
        # process killed meanwhile leaves a metastore that no later JVM can open. Until this
        # query has answered, the marker says the directory is a half-made one to start over.
        spark.sql("SHOW DATABASES").collect()
        (metastore / CREATING).unlink()
        fsync_directory(metastore)
    return spark


def _remote_lake_session(root: RemotePath, master: str, *, metastore_uri: str | None,
                         app_name: str, conf: dict[str, str] | None) -> SparkSession:
    """`lake_session` for a lake on a remote store (`s3a://bucket/prefix`, ...): S3A on the
    classpath and its settings from the environment (`files.object_store_conf`); the
    embedded metastore, which cannot live on an object store, in a local directory kept for
    that URI (`files.local_home`), as is Spark's warehouse directory; then the store asked
    once (`files.probe`), so that a lake that cannot be reached is one line naming it."""
    from changelake.spark.session import build_session

    settings = object_store_conf(conf)
    home = local_home(root)
    if metastore_uri:
        spark = build_session(master, app_name=app_name, conf=settings,
                              metastore_uri=metastore_uri, warehouse_dir=home / "warehouse",
                              object_store=True)
    else:
        metastore = home / "metastore"
        _refuse_a_booted_metastore(root, metastore)
        fresh = _begin_embedded_metastore(metastore)
        spark = build_session(master, app_name=app_name, conf=settings,
                              hive_metastore_dir=metastore, warehouse_dir=home / "warehouse",
                              object_store=True)
        if fresh:
            spark.sql("SHOW DATABASES").collect()
            (metastore / CREATING).unlink()
            fsync_directory(metastore)
    try:
        probe(root)
    except BaseException:
        spark.stop()
        raise
    return spark


CREATING = "metastore_db.creating"
"""Present while a lake's embedded metastore is being created, so a process killed in the
middle leaves a mark that the next start reads as "throw the half-made database away"."""


BUSY_WAIT_SECONDS = 15.0
"""How long a start waits for another process's hold on the embedded metastore to end before
it refuses the lake: a command that has just ended holds it until its JVM has exited, a moment
after its Python process (as when one command follows another in a script)."""


def _refuse_a_booted_metastore(root: Path, metastore: Path) -> None:
    """Refuse, before Spark starts, a lake whose embedded metastore another process has open:
    Derby admits one JVM, which holds a lock on `dbex.lck` (a POSIX lock, as `lockf` takes
    one) while it does, and a second JVM's sessions fail at their first use of the metastore
    with a long Hive exception. Taken and released at once to ask; a file this process may
    not write to is not asked about, nor is any where this process has a JVM already."""
    import errno
    import fcntl
    import os

    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        # This process's JVM, which the session will be built on, may be the one: a stopped
        # session's too (PySpark keeps its JVM for the next one, and Derby stays booted in it).
        return
    try:
        fd = os.open(metastore / "metastore_db" / "dbex.lck", os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return  # no metastore yet, or none booted since it was made, or not ours to lock
    try:
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        raise LakeError(
            f"lake {root}: its embedded metastore (Derby, under {metastore}) is open in "
            "another process, and it admits one at a time; to use the lake from several "
            f"processes, run `changelake metastore --lake {root}` and pass --metastore-uri "
            "thrift://127.0.0.1:PORT to every command, or wait for the other one to end"
        ) from None
    finally:
        os.close(fd)  # releases the lock, if it was taken


def _begin_embedded_metastore(metastore: Path) -> bool:
    """Whether the embedded metastore under `metastore` is to be created by this start: it is
    missing, or an earlier creation was interrupted (its marker is still there; no table can
    have been registered in it, as no session was handed out). Leaves the marker in place."""
    db = metastore / "metastore_db"
    marker = metastore / CREATING
    if marker.exists():
        shutil.rmtree(db, ignore_errors=True)
    elif db.exists():
        return False
    metastore.mkdir(parents=True, exist_ok=True)
    marker.touch()
    fsync_directory(metastore)
    return True


class Lake:
    """The tables of one lake directory, through a SparkSession on its metastore.

    Every method taking a table name takes the text (`NAME` or `DATABASE.NAME`, checked by
    `TableIdentifier.parse`) or a `TableIdentifier`."""

    def __init__(self, spark: SparkSession, root: Path | str, *,
                 storage: str | None = None) -> None:
        from changelake.spark.session import quiet_glob_metadata_check

        self.spark = spark
        self.storage = storage
        """The format of the tables this handle creates ("delta" or "hive"; None: the
        default, `table.default_storage()`); existing tables keep theirs."""
        self.current_follower: CurrentFollower | None = None
        """When set (`current_follower.following`), a Delta table's commit through this handle
        leaves bringing `current` up to date to it, and returns at the commit point."""
        self.root = lake_root(root)
        path_literal(self.root)  # refuse glob characters early, with a clear message
        # The tables' views read their segments as globs, at which Spark warns for nothing.
        quiet_glob_metadata_check(spark)

    @property
    def tables_dir(self) -> Path:
        return self.root / "tables"

    def handle(self, name: str | TableIdentifier) -> Table:
        """A handle on the table `name`, whether or not it exists (a writer creates it)."""
        return Table(self.spark, TableIdentifier.parse(name), self.tables_dir,
                     storage=self.storage, follower=self.current_follower)

    def exists(self, name: str | TableIdentifier) -> bool:
        return self.handle(name).load() is not None

    def table(self, name: str | TableIdentifier) -> Table:
        table = self.handle(name)
        if table.load() is None:
            raise LakeError(f"table {table.name} does not exist in lake {self.root}")
        return table

    def create_table(self, name: str | TableIdentifier, schema: StructType, *,
                     key: Sequence[str] = (), buckets: int = DEFAULT_BUCKETS, since: int = 0,
                     scd2: bool = False, exist_ok: bool = False,
                     origin: Origin | None = None, storage: str | None = None) -> Table:
        """Create an empty table committed through `since` (its history starts there), taken
        from the source `origin` if it is captured. Under the table's writer lock, so two
        creations at once make one table."""
        table = self.handle(name)
        with table.writer() as writer:
            if writer.state is not None:
                if exist_ok:
                    return table
                raise LakeError(f"table {table.name} already exists in lake {self.root}")
            writer.create(schema, key=key, buckets=buckets, since=since, scd2=scd2,
                          origin=origin, storage=storage)
        return table

    def tables(self) -> list[str]:
        """The lake's tables: views in the metastore whose data lives under this lake."""
        found: list[str] = []
        top = self.tables_dir
        if isinstance(self.root, RemotePath):  # tables other machines made: by the store's
            for db in sorted(d.name for d in top.glob("*") if d.is_dir()):
                if IDENTIFIER.fullmatch(db) is None or db != db.lower():
                    continue
                for t in sorted(t.name for t in (top / db).iterdir()):
                    if IDENTIFIER.fullmatch(t) is not None and t == t.lower() and \
                            self.handle(TableIdentifier(db, t)).load() is not None:
                        found.append(self.handle(TableIdentifier(db, t)).name)
            return sorted(found)
        for db in sorted(d.name for d in top.glob("*") if d.is_dir()):
            if IDENTIFIER.fullmatch(db) is None or db != db.lower() or \
                    not self.spark.catalog.databaseExists(db):
                continue
            for t in self.spark.catalog.listTables(db):
                if IDENTIFIER.fullmatch(t.name) is None:
                    continue
                table = self.handle(TableIdentifier(db, t.name.lower()))
                if (top / db / t.name.lower() / "_state").is_dir() and table.load() is not None:
                    found.append(table.name)
        return sorted(found)
