"""Names cannot escape: table, database, key and column names are identifiers, checked where
they enter (the CLI before Spark starts, and the Python API); anything else is one line, exit 2,
with nothing created, written or deleted, inside the lake or outside it."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from changelake.errors import LakeError, SchemaError
from changelake.lake import Lake, TableIdentifier, ingest
from changelake.protocol import Antichain

CLI = [str(Path(sys.executable).parent / "changelake")]

BAD_TABLES = [
    "/tmp/x", "db./etc/x", "../x", "x; DROP TABLE y", "a`b", "a'b", "*/x", "a b", "", ".x",
    "x.", "a.b.c", "1x", "x/*", "db.x*/", "é",
]
BAD_COLUMNS = ["a`b", "a'b", "a b", "*/", "1a", ""]


def sentinel(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A directory outside the lake, and its contents to compare with afterwards."""
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "keep.txt").write_bytes(b"keep")
    return outside, snapshot_tree(outside)


def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(root.rglob("*"))}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=120, cwd=cwd)


def assert_refused(result: subprocess.CompletedProcess, *needles: str) -> None:
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("changelake: error: "), err
    assert "is not a valid name" in err or "must be NAME or DATABASE.NAME" in err, err
    for needle in needles:
        assert needle in err, err
    assert result.stdout == b""


# ------------------------------------------------------------------ the CLI, before Spark


@pytest.mark.parametrize("name", BAD_TABLES)
def test_cli_refuses_a_bad_table_name_before_anything_is_created(tmp_path, name):
    outside, before = sentinel(tmp_path)
    feed = tmp_path / "feed.jsonl"
    feed.write_text("")
    lake = tmp_path / "lake"
    # run from inside `outside`, so that a relative name would land in it
    result = cli("ingest", "--lake", str(lake), "--table", name, str(feed), cwd=outside / "x")
    assert_refused(result)
    assert not lake.exists()  # refused before Spark started: not even the lake directory
    assert snapshot_tree(outside) == before


@pytest.mark.parametrize("command", ["snapshot", "compact"])
def test_cli_read_and_compact_refuse_bad_names_too(tmp_path, command):
    outside, before = sentinel(tmp_path)
    lake = tmp_path / "lake"
    for name in ["../x", "db./etc/x", "x; DROP TABLE y", str(outside / "x")]:
        assert_refused(cli(command, "--lake", str(lake), "--table", name, cwd=outside))
    assert not lake.exists()
    assert snapshot_tree(outside) == before


@pytest.mark.parametrize("key", ["a`b", "a'b", "a b", "id,", "id,x y"])
def test_cli_refuses_a_bad_key_column(tmp_path, key):
    outside, before = sentinel(tmp_path)
    feed = tmp_path / "feed.jsonl"
    feed.write_text("")
    lake = tmp_path / "lake"
    result = cli("ingest", "--lake", str(lake), "--table", "shop.orders", "--key", key,
                 str(feed), cwd=outside)
    assert_refused(result, "key column")
    assert not lake.exists()
    assert snapshot_tree(outside) == before


def test_cli_refuses_a_lake_path_spark_would_misread(tmp_path):
    feed = tmp_path / "feed.jsonl"
    feed.write_text("")
    result = cli("ingest", "--lake", str(tmp_path / "la*ke"), "--table", "t", str(feed),
                 cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.decode().count("\n") == 1
    assert "glob" in result.stderr.decode()
    assert not (tmp_path / "la*ke").exists()


def test_cli_runs_on_a_lake_and_an_input_under_odd_paths(tmp_path):
    """Spaces, quotes and `+` in the lake's path (the embedded metastore's home is a JVM
    option, split at spaces unless quoted) and in the input's (Spark names a file as a URI,
    in which a form decoder reads `+` as a space): the JVM starts and no line is lost."""
    lake = tmp_path / "it's a \"lake\" +1"
    feed = tmp_path / "in+put dir" / "feed a+b.jsonl"
    feed.parent.mkdir()
    feed.write_text("".join(
        f'{{"op": "c", "before": null, "after": {{"id": {i}, "v": "x{i}"}}, "source": '
        f'{{"lsn": {100 + i}, "txId": {i}, "table": "t", "schema": "public"}}}}\n'
        for i in range(1, 4)))
    ingested = cli("ingest", "--lake", str(lake), "--table", "t", "--key", "id",
                 "--from", "debezium", "--close", str(feed), cwd=tmp_path)
    assert ingested.returncode == 0, ingested.stderr.decode()[-2000:]
    assert "committed 3 updates" in ingested.stdout.decode() + ingested.stderr.decode()
    assert (lake / "metastore" / "derby.log").exists()  # Derby's home is the lake's
    snapshot = cli("snapshot", "--lake", str(lake), "--table", "t", cwd=tmp_path)
    assert snapshot.returncode == 0, snapshot.stderr.decode()[-2000:]
    assert sorted(snapshot.stdout.decode().split()) == [
        '{"id":1,"v":"x1"}', '{"id":2,"v":"x2"}', '{"id":3,"v":"x3"}']


# ---------------------------------------------------------------------- the identifier


def test_parse_normalizes_case_and_gives_every_form(tmp_path):
    ident = TableIdentifier.parse("Shop.Orders")
    assert ident == TableIdentifier.parse("shop.ORDERS") == TableIdentifier("shop", "orders")
    assert ident.quoted == "`shop`.`orders`" and ident.display == "shop.orders"
    assert TableIdentifier.parse("T1").display == "t1"
    assert TableIdentifier.parse("t1").database == "default"
    assert TableIdentifier.parse(ident) is ident
    assert ident.history() == TableIdentifier("shop", "orders_history")
    tables = tmp_path / "tables"
    assert ident.directory(tables) == tables.resolve() / "shop" / "orders"


@pytest.mark.parametrize("name", BAD_TABLES)
def test_parse_refuses(name):
    with pytest.raises(LakeError, match=r"valid name|NAME or DATABASE\.NAME"):
        TableIdentifier.parse(name)


def test_identifier_values_are_checked_too():
    with pytest.raises(LakeError):
        TableIdentifier("db", "../x")
    with pytest.raises(LakeError):
        TableIdentifier("Db", "x")  # not normalized: parse() lower-cases


def test_directory_behind_a_symlink_out_of_the_lake_is_refused(tmp_path):
    outside, before = sentinel(tmp_path)
    tables = tmp_path / "lake" / "tables"
    tables.mkdir(parents=True)
    (tables / "evil").symlink_to(outside)
    with pytest.raises(LakeError, match="not inside the lake"):
        TableIdentifier.parse("evil.x").directory(tables)
    assert snapshot_tree(outside) == before


# ---------------------------------------------------------------------- the Python API

spark_test = pytest.mark.spark
SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def unique_db() -> str:
    return f"nm_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def lake(spark, tmp_path: Path) -> Lake:
    return Lake(spark, tmp_path / "lake")


def rows(spark, schema: StructType, data: list[tuple]):
    fields = [*schema.fields, StructField("_time", LongType()), StructField("_diff", LongType())]
    return spark.createDataFrame(data, StructType(fields))


@spark_test
def test_api_refuses_bad_table_names_with_nothing_created(spark, lake, tmp_path):
    outside, before = sentinel(tmp_path)
    feed = tmp_path / "feed.jsonl"
    feed.write_text("")
    databases = {d.name for d in spark.catalog.listDatabases()}
    for name in BAD_TABLES:
        with pytest.raises(LakeError):
            lake.create_table(name, SCHEMA)
        with pytest.raises(LakeError):
            lake.table(name)
        with pytest.raises(LakeError):
            lake.exists(name)
        with pytest.raises(LakeError):
            ingest.ingest(lake, name, [feed])
    assert not (lake.root / "tables").exists()
    assert {d.name for d in spark.catalog.listDatabases()} == databases
    assert snapshot_tree(outside) == before


@spark_test
@pytest.mark.parametrize("column", BAD_COLUMNS)
def test_api_refuses_bad_column_and_key_names(spark, lake, column):
    db = unique_db()
    bad = StructType([StructField("id", LongType()), StructField(column, StringType())])
    with pytest.raises(SchemaError, match="is not a valid name"):
        lake.create_table(f"{db}.t", bad)
    nested = StructType([StructField("id", LongType()), StructField(
        "inner", StructType([StructField(column, StringType())]))])
    with pytest.raises(SchemaError, match="column in inner"):
        lake.create_table(f"{db}.t", nested)
    with pytest.raises(LakeError, match="key column"):
        lake.create_table(f"{db}.t", SCHEMA, key=[column])
    assert not lake.exists(f"{db}.t")
    # an existing table refuses a commit bringing such a column, and stays as it was
    table = lake.create_table(f"{db}.t", SCHEMA, key=["id"])
    before = table.state()
    with pytest.raises(SchemaError, match="is not a valid name"):
        table.commit(rows(spark, bad, [(1, "a", 0, 1)]), Antichain([0]), Antichain([1]))
    assert table.state() == before
    assert not (table.directory / "seg").exists()


@spark_test
def test_names_are_case_insensitive_one_table_one_directory(spark, lake):
    db = unique_db()
    table = lake.create_table(f"{db.upper()}.Orders", SCHEMA, key=["id"])
    assert table.name == f"{db}.orders"
    assert lake.exists(f"{db}.ORDERS") and lake.table(f"{db}.orders").name == f"{db}.orders"
    with pytest.raises(LakeError, match="already exists"):
        lake.create_table(f"{db}.orders", SCHEMA)
    assert [p.name for p in (lake.root / "tables").iterdir()] == [db]
    assert [p.name for p in (lake.root / "tables" / db).iterdir()] == ["orders"]
    table.commit(rows(spark, SCHEMA, [(1, "a", 0, 1)]), Antichain([0]), Antichain([1]))
    assert [tuple(r) for r in spark.table(f"{db}.Orders").collect()] == [(1, "a")]
    assert f"{db}.orders" in lake.tables()


@spark_test
def test_a_lake_root_with_a_quote_and_spaces_works(spark, tmp_path):
    lake = Lake(spark, tmp_path / "it's a 'lake'")
    db = unique_db()
    table = lake.create_table(f"{db}.t", SCHEMA, key=["id"], scd2=True)
    table.commit(rows(spark, SCHEMA, [(1, "a", 0, 1), (2, "b", 0, 1)]),
                 Antichain([0]), Antichain([1]))
    assert sorted(tuple(r) for r in spark.table(f"{db}.t").collect()) == [(1, "a"), (2, "b")]
    assert len(spark.table(f"{db}.t_history").collect()) == 2
    props = {r[0]: r[1] for r in spark.sql(f"SHOW TBLPROPERTIES `{db}`.`t`").collect()}
    assert props["changelake.key"] == "id"
    if table.state().storage == "hive":  # its view names the directory and the version
        assert props["changelake.location"] == str(table.directory)
        text = spark.sql(f"SHOW CREATE TABLE `{db}`.`t`").collect()[0][0]
        assert "/* changelake version=1 */" in text and "t version" not in text
    else:  # a Delta table: registered at its `current` table, under the quoted root
        assert str(table.directory) in spark.sql(
            f"DESCRIBE DETAIL `{db}`.`t`").collect()[0]["location"]


@spark_test
def test_writes_into_a_directory_moved_out_of_the_lake_are_refused(spark, lake, tmp_path):
    outside, before = sentinel(tmp_path)
    db = unique_db()
    table = lake.create_table(f"{db}.t", SCHEMA, key=["id"])
    state = table.state()
    # someone replaces the database directory with a symlink to elsewhere
    moved = tmp_path / "moved"
    (lake.root / "tables" / db).rename(moved)
    (lake.root / "tables" / db).symlink_to(outside)
    with pytest.raises(LakeError, match="not inside the lake"):
        table.commit(rows(spark, SCHEMA, [(1, "a", 0, 1)]), Antichain([0]), Antichain([1]))
    assert snapshot_tree(outside) == before
    (lake.root / "tables" / db).unlink()
    moved.rename(lake.root / "tables" / db)
    assert table.state() == state
