"""Incremental export of lake tables to Iceberg (pyiceberg's SQLite catalog), read back with
pyiceberg and compared with the lake table `AS OF` the exported frontier after every round."""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from changelake.errors import LakeError, SchemaError
from changelake.lake import Lake, Table
from changelake.lake.compact import compact
from changelake.lake.export.iceberg import (
    FRONTIER_PROPERTY,
    TABLE_PROPERTY,
    export_to_iceberg,
    open_catalog,
)
from changelake.lake.files import is_remote
from changelake.protocol import Antichain
from tests.support.lake_history import SCHEMA, state_at, to_df, unkeyed_history
from tests.support.paths import SUPPORT

pytestmark = pytest.mark.spark

TYPED = StructType([
    StructField("id", LongType()),
    StructField("name", StringType()),
    StructField("score", DoubleType()),
    StructField("price", DecimalType(10, 2)),
    StructField("day", DateType()),
    StructField("at", TimestampType()),
    StructField("blob", BinaryType()),
    StructField("flag", BooleanType()),
    StructField("small", IntegerType()),
])
WITH_NOTE = StructType([*TYPED.fields, StructField("note", StringType())])


def meta(struct: StructType) -> StructType:
    return StructType([*struct.fields, StructField("_time", LongType()),
                       StructField("_diff", LongType())])


def unique(name: str) -> str:
    return f"ice_{uuid.uuid4().hex[:8]}.{name}"


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'iceberg' / 'catalog.db'}"


def rows(arrow) -> Counter:
    """A multiset of row tuples (timestamps are aware datetimes on both sides, so the Spark
    session's time zone and Iceberg's UTC compare as instants)."""
    names = arrow.column_names
    return Counter(tuple(r[n] for n in names) for r in arrow.to_pylist())


def iceberg_rows(uri: str, target: str) -> Counter:
    return rows(open_catalog(uri).load_table(target).scan().to_arrow())


def lake_rows(table: Table) -> Counter:
    """What `snapshot --as-of F-1` shows, F the table's frontier."""
    return rows(table.as_of(table.state().upper - 1).toArrow())


def snapshots(uri: str, target: str) -> list:
    return open_catalog(uri).load_table(target).snapshots()


def typed_row(rng: random.Random, key: int, note: bool) -> tuple:
    row = (key, rng.choice(["ann", "bob", None]), rng.choice([0.5, -2.25, None]),
           Decimal(rng.randrange(-10**6, 10**6)) / 100, dt.date(2020, 1, 1 + rng.randrange(28)),
           dt.datetime(2024, 3, 1, rng.randrange(24), rng.randrange(60), 0, rng.randrange(10**6)),
           bytes([rng.randrange(256)]) * rng.randrange(3), rng.choice([True, False, None]),
           rng.randrange(-5, 5))
    return (*row, rng.choice(["x", None])) if note else row


def keyed_round(rng: random.Random, live: dict[int, tuple], time: int, keys: int,
                note: bool) -> list[tuple]:
    """Consistent keyed updates at `time`: inserts, updates and deletes of a few keys."""
    out = []
    for key in rng.sample(range(keys), 4):
        old = live.get(key)
        if old is not None:
            out.append((*old, time, -1))
            if len(old) < len(WITH_NOTE.fields) and note:  # retraction before the column
                out[-1] = (*old, None, time, -1)
        if old is not None and rng.random() < 0.3:
            del live[key]
            continue
        new = typed_row(rng, key, note)
        live[key] = new
        out.append((*new, time, 1))
    return out


class Crash(Exception):
    """The fault injected at the catalog commit: the process dies there."""


def crash_before(self, *args, **kwargs):
    raise Crash("killed after writing the data files, before the catalog commit")


def crash_after(original):
    def commit_then_crash(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise Crash("killed after the catalog commit, before returning")

    return commit_then_crash


def keyed_committer(spark, table: Table, rng: random.Random, live: dict[int, tuple]):
    def commit(lo: int, hi: int, note: bool) -> None:
        updates = [u for t in range(lo, hi) for u in keyed_round(rng, live, t, 8, note)]
        table.commit(spark.createDataFrame(updates, meta(WITH_NOTE if note else TYPED)), lo, hi)

    return commit


def test_a_warehouse_pyiceberg_cannot_write_is_one_error_and_no_table(spark, lake, uri,
                                                                    tmp_path):
    """A file system pyiceberg knows but cannot reach (HDFS: pyarrow's needs a JVM library
    and a name node, neither here) fails once the export writes: one `LakeError` naming the
    table, catalog and warehouse, where it had been an `OSError` of several lines ("internal
    error"); the catalog holds no table."""
    table = lake.create_table(unique("unwritable"), TYPED, key=["id"])
    table.commit(lake.spark.createDataFrame([], meta(TYPED)), 0, 3)
    target = f"{table.ident.database}.unwritable"
    (tmp_path / "iceberg").mkdir()  # the catalog's folder (a warehouse given: not made)
    with pytest.raises(LakeError, match=rf"table {table.name}: Iceberg table {target} \(catalog "
                       r"'sqlite:///.*', warehouse 'hdfs://127\.0\.0\.1:1/wh'\) cannot be "
                       "written: ") as error:
        export_to_iceberg(lake, table.name, uri, warehouse="hdfs://127.0.0.1:1/wh")
    assert "\n" not in str(error.value)
    assert not open_catalog(uri, warehouse=tmp_path / "wh").table_exists(target)


def test_keyed_types_an_added_column_and_a_crash_around_the_commit(spark, lake, uri,
                                                                    monkeypatch):
    from pyiceberg.catalog.sql import SqlCatalog

    table = lake.create_table(unique("orders"), TYPED, key=["id"], buckets=2)
    live: dict[int, tuple] = {}
    commit = keyed_committer(spark, table, random.Random(7), live)
    target = f"{table.ident.database}.orders"

    commit(0, 3, False)
    first = export_to_iceberg(lake, table.name, uri)
    assert (first.kind, first.mode, first.before, first.after) == ("iceberg", "full", None, [3])
    assert first.target == target and first.inserted == len(live)
    exported = iceberg_rows(uri, target)
    assert exported == lake_rows(table)
    held = open_catalog(uri).load_table(target)
    assert [(f.field_id, f.name, str(f.field_type)) for f in held.schema().fields] == [
        (1, "id", "long"), (2, "name", "string"), (3, "score", "double"),
        (4, "price", "decimal(10, 2)"), (5, "day", "date"), (6, "at", "timestamptz"),
        (7, "blob", "binary"), (8, "flag", "boolean"), (9, "small", "int")]

    # updates, deletes and a column added to the lake table (older rows: null)
    commit(3, 6, True)
    original = SqlCatalog.commit_table

    def another_writer_first(self, *args, **kwargs):  # commits between our read and commit
        monkeypatch.setattr(SqlCatalog, "commit_table", original)
        theirs = open_catalog(uri).load_table(target)
        theirs.append(theirs.scan(limit=0).to_arrow())  # a snapshot, no rows
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SqlCatalog, "commit_table", another_writer_first)
    with pytest.raises(LakeError, match="changed by another writer during the export"):
        export_to_iceberg(lake, table.name, uri)
    held = open_catalog(uri).load_table(target)
    assert held.properties[FRONTIER_PROPERTY] == "[3]" and len(held.snapshots()) == 2
    assert iceberg_rows(uri, target) == exported

    monkeypatch.setattr(SqlCatalog, "commit_table", crash_before)
    with pytest.raises(Crash):
        export_to_iceberg(lake, table.name, uri)
    now = open_catalog(uri).load_table(target)
    assert now.metadata_location == held.metadata_location
    assert now.properties[FRONTIER_PROPERTY] == "[3]"
    assert iceberg_rows(uri, target) == exported

    monkeypatch.setattr(SqlCatalog, "commit_table", crash_after(original))
    with pytest.raises(Crash):
        export_to_iceberg(lake, table.name, uri)
    monkeypatch.setattr(SqlCatalog, "commit_table", original)
    count = len(snapshots(uri, target))
    rerun = export_to_iceberg(lake, table.name, uri)
    assert rerun.mode == "none" and rerun.after == [6]
    assert len(snapshots(uri, target)) == count  # nothing new: no snapshot

    ice = open_catalog(uri).load_table(target)
    assert ice.schema().find_field("note").field_id == 10
    assert iceberg_rows(uri, target) == lake_rows(table)
    assert len(iceberg_rows(uri, target)) == len(live)
    assert ice.properties[FRONTIER_PROPERTY] == "[6]"
    assert ice.properties[TABLE_PROPERTY] == table.name
    # every snapshot names the changelake frontier it holds
    frontiers = [json.loads(s.summary[FRONTIER_PROPERTY]) for s in ice.snapshots()
                 if FRONTIER_PROPERTY in s.summary.additional_properties]
    assert len(frontiers) == len(ice.snapshots()) - 1  # all but the other writer's
    assert frontiers[0] == [3] and frontiers[-1] == [6] and {3, 6} == {f[0] for f in frontiers}


def test_unkeyed_multiplicities_and_an_added_column(spark, lake, uri):
    """Rows with multiplicity above one, retracted and added; then a column is added in the
    round that also retracts rows written before it (they read it as null)."""
    history = unkeyed_history(random.Random(3), 9, 4, 8)
    table = lake.create_table(unique("events"), SCHEMA, buckets=1)
    target = "exported.events"
    table.commit(to_df(spark, [u for u in history if u[1] < 5]), 0, 5)
    export_to_iceberg(lake, table.name, uri, identifier=target)
    truth = state_at(history, 4, keyed=False)
    assert max(truth.values()) > 1  # duplicates are exported as duplicates
    assert iceberg_rows(uri, target) == truth

    tagged = StructType([*SCHEMA.fields, StructField("tag", StringType())])
    later = [((*row, None), t, d) for row, t, d in history if t >= 5]
    later += [((9, "z", 1, "t"), 5, 3), ((9, "z", 1, "t"), 7, -1), ((8, "z", 0, "u"), 8, 1)]
    table.commit(to_df(spark, later, tagged), 5, 9)
    result = export_to_iceberg(lake, table.name, uri, identifier=target)
    assert result.mode == "incremental" and result.deleted > 0
    whole = [((*row, None), t, d) for row, t, d in history if t < 5] + later
    truth = state_at(whole, 8, keyed=False)
    assert truth[(9, "z", 1, "t")] == 2 and max(truth.values()) > 1
    assert any(d < 0 and t >= 5 for _, t, d in later[:-3])  # retractions of older rows
    assert iceberg_rows(uri, target) == lake_rows(table) == truth


@pytest.mark.slow
def test_keyed_rounds(spark, lake, uri):
    table = lake.create_table(unique("rounds"), TYPED, key=["id"], buckets=2)
    live: dict[int, tuple] = {}
    commit = keyed_committer(spark, table, random.Random(17), live)
    for i, (lo, hi) in enumerate([(0, 2), (2, 4), (4, 6), (6, 9)]):
        commit(lo, hi, i >= 2)
        result = export_to_iceberg(lake, table.name, uri)
        assert result.after == [hi]
        assert iceberg_rows(uri, f"{table.ident.database}.rounds") == lake_rows(table)


@pytest.mark.slow
def test_a_compaction_past_the_export_a_closed_table_and_a_crash_at_creation(
        spark, lake, uri, monkeypatch):
    from pyiceberg.catalog.sql import SqlCatalog

    history = unkeyed_history(random.Random(5), 12, 5, 8)
    table = lake.create_table(unique("folded"), SCHEMA, buckets=2)
    target = f"{table.ident.database}.folded"
    table.commit(to_df(spark, [u for u in history if u[1] < 4]), 0, 4)
    # killed during the first export: no table at all, and the re-run creates it
    monkeypatch.setattr(SqlCatalog, "commit_table", crash_before)
    with pytest.raises(Crash):
        export_to_iceberg(lake, table.name, uri)
    monkeypatch.undo()
    assert not open_catalog(uri).table_exists(target)
    export_to_iceberg(lake, table.name, uri)
    assert iceberg_rows(uri, target) == state_at(history, 3, keyed=False)
    # compaction folds the changes at [4, 10] away before they are exported: a rewrite
    table.commit(to_df(spark, [u for u in history if 4 <= u[1] < 12]), 4, 12)
    compact(table, 10)
    result = export_to_iceberg(lake, table.name, uri)
    assert (result.mode, result.after) == ("full", [12])
    assert iceberg_rows(uri, target) == lake_rows(table) == state_at(history, 11, keyed=False)
    # closed: the final state, frontier []
    table.commit(to_df(spark, []), 12, Antichain())
    closed = export_to_iceberg(lake, table.name, uri)
    assert closed.after == [] and closed.inserted == closed.deleted == 0
    assert iceberg_rows(uri, target) == state_at(history, 11, keyed=False)
    assert export_to_iceberg(lake, table.name, uri).mode == "none"


def test_a_catalog_under_a_path_with_spaces_and_plus_keeps_its_files_there(spark, lake,
                                                                         tmp_path):
    """The warehouse is the directory beside the catalog's file, verbatim: a percent-encoded
    location (`%20`, `%2B`) would put the files in a directory named with the escapes, where
    no other engine looks."""
    uri = f"sqlite:///{tmp_path / 'ice+berg dir' / 'cat a+b.db'}"
    table = lake.create_table(unique("events"), SCHEMA, buckets=1)
    history = unkeyed_history(random.Random(5), 6, 3, 4)
    table.commit(to_df(spark, history), 0, 6)
    export_to_iceberg(lake, table.name, uri, identifier="exported.odd")
    assert iceberg_rows(uri, "exported.odd") == state_at(history, 5, keyed=False)
    warehouse = tmp_path / "ice+berg dir" / "cat a+b-warehouse"
    assert list(warehouse.rglob("*.parquet")) and list(warehouse.rglob("*.metadata.json"))
    beside = [] if is_remote(lake.root) else ["lake"]  # a lake on S3 is not in tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ice+berg dir", *beside]


def test_a_dropped_or_unexportable_column_fails_and_changes_nothing(spark, lake, uri):
    table = lake.create_table(unique("people"), SCHEMA, key=["id"], buckets=1)
    target = f"{table.ident.database}.people"
    table.commit(to_df(spark, [((1, "ann", 5), 0, 1), ((2, "bob", 7), 0, 1)]), 0, 1)
    export_to_iceberg(lake, table.name, uri)
    before = open_catalog(uri).load_table(target)

    def unchanged() -> None:
        now = open_catalog(uri).load_table(target)
        assert now.metadata_location == before.metadata_location
        assert iceberg_rows(uri, target) == Counter({(1, "ann", 5): 1, (2, "bob", 7): 1})

    # a column of a type the export cannot map (an array) is added
    tags = StructType([*SCHEMA.fields, StructField("tags", ArrayType(StringType()))])
    table.commit(spark.createDataFrame([(2, "bob", 7, None, 1, -1), (2, "bob", 8, ["a"], 1, 1)],
                                       meta(tags)), 1, 2)
    with pytest.raises(SchemaError, match=r"table .*people, column 'tags'.*array<string>"):
        export_to_iceberg(lake, table.name, uri)
    unchanged()

    # a column is dropped (`amount`, `tags` not in the latest version)
    dropped = StructType(SCHEMA.fields[:2])
    table.commit(spark.createDataFrame([(1, "ann", 2, -1), (1, "cy", 2, 1)], meta(dropped)),
                 2, 3)
    with pytest.raises(SchemaError, match=r"table .*people: column 'amount' was dropped"):
        export_to_iceberg(lake, table.name, uri)
    unchanged()

    # an Iceberg table that is another table's export is refused
    other = lake.create_table(unique("other"), SCHEMA, buckets=1)
    with pytest.raises(LakeError, match="not a changelake export of table"):
        export_to_iceberg(lake, other.name, uri, identifier=target)
    unchanged()


def test_a_refused_first_export_leaves_no_catalog_file(spark, lake, tmp_path):
    """A table the export cannot take (a nested column, a dropped one) is refused before
    the catalog is opened: no empty SQLite catalog is left where the user pointed."""
    tags = StructType([*SCHEMA.fields, StructField("tags", ArrayType(StringType()))])
    table = lake.create_table(unique("nested"), tags, key=["id"], buckets=1)
    table.commit(spark.createDataFrame([(1, "ann", 5, ["a"], 0, 1)], meta(tags)), 0, 1)
    catalog = tmp_path / "new" / "catalog.db"
    with pytest.raises(SchemaError, match=r"column 'tags'.*array<string>"):
        export_to_iceberg(lake, table.name, f"sqlite:///{catalog}")
    assert not catalog.exists() and not catalog.parent.exists()


WORKER = SUPPORT / "iceberg_export_worker.py"


def run_worker(args: list[str], kill_after: str | None = None, delay: float = 0.0
               ) -> tuple[int, list[str], str]:
    """Run the worker in its own process group; with `kill_after`, SIGKILL the group (the
    Python driver and its Spark JVM) `delay` seconds after that line."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    lines: list[str] = []
    errors: list[str] = []
    pumps = [threading.Thread(target=lambda s, into: into.extend(x.rstrip("\n") for x in s),
                              args=pair) for pair in ((process.stdout, lines),
                                                       (process.stderr, errors))]
    for pump in pumps:
        pump.start()
    if kill_after is not None:
        deadline = time.monotonic() + 400
        while kill_after not in lines and process.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert kill_after in lines, "\n".join(errors[-30:])
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(600)
    for pump in pumps:
        pump.join(10)
    return process.returncode, lines, "\n".join(errors[-30:])


@pytest.mark.slow
@pytest.mark.parametrize("keyed", [True, False])
def test_kill9_during_an_export_then_rerun(tmp_path, keyed):
    from tests.support.iceberg_export_worker import TABLE, TIMES, history

    seed = random.randrange(1000)  # a new kill point each run; printed to reproduce it
    print(f"seed {seed}")
    rng = random.Random(seed)
    uri = f"sqlite:///{tmp_path / 'iceberg' / 'catalog.db'}"
    args = ["--lake", str(tmp_path / "lake"), "--catalog", uri, "--seed", str(seed),
            *(["--keyed"] if keyed else [])]
    marker = f"EXPORT {rng.choice([4, 8, 12])}"
    code, lines, errors = run_worker(args, marker, rng.uniform(0, 4))
    assert code != 0 or any(line.startswith("RESULT") for line in lines), errors
    code, lines, errors = run_worker(args)
    assert code == 0, errors
    found = [line.split() for line in lines if line.startswith("FOUND")]
    assert all(ok == "true" for _, _, ok in found), lines  # the killed run: all or nothing
    assert json.loads(lines[-1][len("RESULT "):])["frontier"] == [TIMES]
    truth = state_at(history(seed, keyed), TIMES - 1, keyed=keyed)
    assert iceberg_rows(uri, TABLE) == truth
    assert not list((tmp_path / "lake" / "_export").rglob("*.parquet"))


def held_elsewhere(lake: Lake, key: str) -> bool:
    """Whether another open file holds the export lock named `key` (`arrow.export_lock`), or
    on a remote lake whether its lock object is there."""
    import fcntl
    import hashlib
    import os

    from changelake.lake.files import is_remote

    path = lake.root / "_export" / "locks" / hashlib.sha256(key.encode()).hexdigest()[:32]
    if is_remote(path):  # a remote lake's lock: the object a conditional PUT made
        return (path / "_lock").exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_export_table_reports_an_iceberg_run_as_every_kind(spark, lake, uri, monkeypatch):
    """`changelake export --to iceberg URI` goes through `export_table`: the run reported in
    the one shape every target kind has; the run holds the export lock named after the
    catalog (however its SQLite path is spelled) and the Iceberg table while it commits."""
    from pyiceberg.catalog.sql import SqlCatalog

    from changelake.lake.export import export_table
    from changelake.lake.export.iceberg import lock_key

    history = unkeyed_history(random.Random(5), 6, 3, 6)
    table = lake.create_table(unique("wired"), SCHEMA, buckets=1)
    table.commit(to_df(spark, [u for u in history if u[1] < 4]), 0, 4)
    path = Path(uri[len("sqlite:///"):])
    spelled = f"sqlite:///{path.parent / '..' / path.parent.name / path.name}"
    key = lock_key(spelled, "exported.wired")
    assert key == lock_key(uri, "exported.wired") != lock_key(uri, "exported.other")
    original, held = SqlCatalog.commit_table, []

    def commit_checking_the_lock(self, *args, **kwargs):
        held.append(held_elsewhere(lake, key))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SqlCatalog, "commit_table", commit_checking_the_lock)
    first = export_table(lake, table.name, "iceberg", uri, identifier="exported.wired")
    monkeypatch.undo()
    assert held == [True] and not held_elsewhere(lake, key)
    assert (first.kind, first.mode, first.before, first.after) == ("iceberg", "full", None, [4])
    assert first.inserted == sum(state_at(history, 3, keyed=False).values())
    assert iceberg_rows(uri, "exported.wired") == state_at(history, 3, keyed=False)
    again = export_table(lake, table.name, "iceberg", uri, identifier="exported.wired")
    assert (again.mode, again.version) == ("none", first.version)
    with pytest.raises(LakeError, match="takes catalog, identifier and warehouse"):
        export_table(lake, table.name, "iceberg", uri, path="x")
