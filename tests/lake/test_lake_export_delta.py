"""`export --to delta`: a lake table kept as a Delta table, read back with delta-rs and DuckDB.

Every round commits generated changes to a lake table (inserts, updates, deletes; duplicates
in an unkeyed table; a column added), exports, and checks the Delta table against the truth
kept in Python and against `snapshot` (the committed view) at the frontier the export
recorded, read twice: `DeltaTable.to_pyarrow_table()` and DuckDB over the Arrow dataset.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import duckdb
import orjson
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from changelake.errors import LakeError, SchemaError
from changelake.lake import Lake, Table
from changelake.lake.arrow import plain
from changelake.lake.compact import compact
from changelake.lake.export import export_table, export_to_delta
from changelake.lake.export.changes import pin
from changelake.lake.export.delta import APP_PREFIX
from tests.support.lake_history import SCHEMA, rows_of, to_df
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark

WIDE = StructType([*SCHEMA.fields, StructField("note", StringType())])
KEYS = 12


def unique(name: str) -> str:
    return f"ex_{uuid.uuid4().hex[:10]}.{name}"


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def pad(row: tuple, width: int) -> tuple:
    return row + (None,) * (width - len(row))


def delta_rows(path: Path, columns: list[str]) -> Counter:
    table = DeltaTable(str(path)).to_pyarrow_table()
    assert table.schema.names == columns
    return Counter(tuple(r[c] for c in columns) for r in table.to_pylist())


def duckdb_rows(path: Path, columns: list[str]) -> Counter:
    dataset = DeltaTable(str(path)).to_pyarrow_dataset()
    relation = duckdb.connect().from_arrow(dataset)
    return Counter(relation.select(", ".join(f'"{c}"' for c in columns)).fetchall())


def check(table: Table, path: Path, truth: Counter) -> None:
    """The Delta table equals the truth and the table's snapshot, read both ways, and records
    the table's frontier as its last export."""
    columns = table.schema.fieldNames()
    snapshot = Counter(pad(r, len(columns)) for r in rows_of(table.current()).elements())
    assert snapshot == truth
    assert delta_rows(path, columns) == truth
    assert duckdb_rows(path, columns) == truth
    delta = DeltaTable(str(path))
    frontier = table.state().upper
    assert delta.history(1)[0]["changelake.frontier"] == json.dumps([frontier])
    assert delta.transaction_version(APP_PREFIX + pin(table).identity) == frontier


def frontiers(path: Path) -> list[str]:
    """The frontier each Delta version recorded, oldest first."""
    return [h["changelake.frontier"] for h in reversed(DeltaTable(str(path)).history())]


# ------------------------------------------------------------------------- histories


def keyed_round(rng: random.Random, live: dict, t0: int, t1: int, width: int) -> list:
    """Inserts, updates and deletes of random keys at times [t0, t1), rows `width` wide; a
    key's old row is retracted as it was (padded with nulls for columns added since)."""
    out = []
    for t in range(t0, t1):
        for k in rng.sample(range(KEYS), 4):
            old = live.get(k)
            if old is not None and rng.random() < 0.25:
                out.append((pad(old, width), t, -1))
                del live[k]
                continue
            new = (k, rng.choice(["ann", "bob", None]), rng.randrange(100))
            if width == 4:
                new += (rng.choice(["n1", "n2", None]),)
            if pad(new, width) == pad(old or (), width):
                continue
            if old is not None:
                out.append((pad(old, width), t, -1))
            out.append((new, t, 1))
            live[k] = new
    return out


def unkeyed_round(rng: random.Random, live: Counter, t0: int, t1: int, width: int,
                  seen: Counter) -> list:
    """A multiset from a small domain of rows, so copies are common: inserts of 1-2 copies,
    retractions of some of a row's copies (`seen` counts retractions that leave copies)."""
    for row in [r for r in live if len(r) < width]:  # rows from before a column was added
        live[pad(row, width)] += live.pop(row)
    out = []
    for t in range(t0, t1):
        for _ in range(5):
            present = sorted((r for r, n in live.items() if n > 0), key=repr)
            if present and rng.random() < 0.4:
                row = rng.choice(present)
                n = rng.randint(1, live[row])
                if n < live[row]:
                    seen["partial"] += 1
                out.append((row, t, -n))
                live[row] -= n
            else:
                row = (rng.randrange(3), rng.choice(["x", "y"]), 7)
                if width == 4:
                    row += (rng.choice(["n1", None]),)
                row = pad(row, width)
                n = rng.choice([1, 2])
                out.append((row, t, n))
                live[row] += n
    return out


def truth_of(live: dict | Counter, width: int) -> Counter:
    if isinstance(live, Counter):
        return Counter({pad(r, width): n for r, n in live.items() if n > 0})
    return Counter(pad(r, width) for r in live.values())


# --------------------------------------------------------------------------- rounds


def test_keyed_table_exported_incrementally_with_a_column_added(spark, lake, tmp_path):
    rng = seeded(5)
    table = lake.create_table(unique("keyed"), SCHEMA, key=["id"], buckets=2)
    path = tmp_path / "delta"
    live: dict = {}

    table.commit(to_df(spark, keyed_round(rng, live, 0, 4, 3)), 0, 4)
    first = export_to_delta(lake, table.name, path)
    assert (first.mode, first.before, first.after, first.version) == ("full", None, [4], 0)
    assert first.inserted == len(live)
    check(table, path, truth_of(live, 3))

    # updates, deletes, inserts, and a column added in the lake (added to the Delta table)
    table.commit(to_df(spark, keyed_round(rng, live, 4, 8, 4), WIDE), 4, 8)
    second = export_to_delta(lake, table.name, path)
    assert (second.mode, second.before, second.after, second.version) == \
        ("incremental", [4], [8], 1)
    assert second.inserted and second.updated and second.deleted
    assert DeltaTable(str(path)).schema().to_arrow().names == ["id", "name", "amount", "note"]
    check(table, path, truth_of(live, 4))

    again = export_to_delta(lake, table.name, path)  # nothing new: no Delta version
    assert (again.mode, again.version) == ("none", 1)
    assert frontiers(path) == [json.dumps([t]) for t in (4, 8)]


@pytest.mark.slow
def test_keyed_export_after_an_empty_commit_and_a_compaction(spark, lake, tmp_path):
    rng = seeded(6)
    table = lake.create_table(unique("keyed"), SCHEMA, key=["id"], buckets=2)
    path = tmp_path / "delta"
    live: dict = {}
    table.commit(to_df(spark, keyed_round(rng, live, 0, 4, 3)), 0, 4)
    export_to_delta(lake, table.name, path)

    # the frontier moves with no change: the new frontier is recorded, no row changes
    table.commit(to_df(spark, []), 4, 5)
    empty = export_to_delta(lake, table.name, path)
    assert (empty.mode, empty.after, empty.inserted + empty.updated + empty.deleted) == \
        ("incremental", [5], 0)
    check(table, path, truth_of(live, 3))

    # compaction folds the changes after the exported frontier: the export starts over
    table.commit(to_df(spark, keyed_round(rng, live, 5, 9, 3)), 5, 9)
    compact(table, 7)
    folded = export_to_delta(lake, table.name, path)
    assert (folded.mode, folded.before, folded.after) == ("full", [5], [9])
    check(table, path, truth_of(live, 3))

    table.commit(to_df(spark, keyed_round(rng, live, 9, 11, 3)), 9, 11)
    assert export_to_delta(lake, table.name, path).mode == "incremental"
    check(table, path, truth_of(live, 3))
    assert frontiers(path) == [json.dumps([t]) for t in (4, 5, 9, 11)]


def test_unkeyed_table_with_copies_exported_by_multiplicity(spark, lake, tmp_path):
    rng = seeded(8)
    table = lake.create_table(unique("multiset"), SCHEMA, buckets=2)
    path = tmp_path / "delta"
    live: Counter = Counter()
    seen: Counter = Counter()
    table.commit(to_df(spark, unkeyed_round(rng, live, 0, 3, 3, seen)), 0, 3)
    assert export_to_delta(lake, table.name, path).mode == "full"
    check(table, path, truth_of(live, 3))
    for t0, t1, width in [(3, 6, 3), (6, 9, 4)]:
        schema = WIDE if width == 4 else SCHEMA
        table.commit(to_df(spark, unkeyed_round(rng, live, t0, t1, width, seen), schema),
                     t0, t1)
        result = export_to_delta(lake, table.name, path)
        assert (result.mode, result.after) == ("incremental", [t1])
        check(table, path, truth_of(live, width))
    # the history did what the test is about: rows with copies, copies partly retracted
    assert max(truth_of(live, 4).values()) > 1 and seen["partial"] > 0
    assert DeltaTable(str(path)).version() == 2


def test_column_types_carry_over(spark, lake, tmp_path):
    schema = StructType([
        StructField("id", IntegerType()), StructField("flag", BooleanType()),
        StructField("tiny", ByteType()), StructField("small", ShortType()),
        StructField("big", LongType()), StructField("real", FloatType()),
        StructField("dbl", DoubleType()), StructField("text", StringType()),
        StructField("price", DecimalType(12, 3)), StructField("day", DateType()),
        StructField("at", TimestampType()), StructField("raw", BinaryType()),
        StructField("tags", ArrayType(IntegerType())),
    ])
    utc = dt.UTC

    def row(i: int, text: str | None) -> tuple:
        return (i, i % 2 == 0, i, i * 100, i * 10**12, 1.5, i / 3, text,
                decimal.Decimal(f"{i}.125"), dt.date(2024, 1, i + 1),
                dt.datetime(2024, 5, 1, 12, i, 30, 250000, tzinfo=utc), bytes([i, 255]),
                [i, i + 1])

    table = lake.create_table(unique("typed"), schema, key=["id"], buckets=2)
    path = tmp_path / "delta"
    table.commit(to_df(spark, [(row(1, "a"), 0, 1), (row(2, "b"), 0, 1)], schema), 0, 1)
    export_to_delta(lake, table.name, path)
    updates = [(row(1, "a"), 1, -1), (row(1, "é"), 1, 1), (row(2, "b"), 1, -1),
               (row(3, None), 1, 1)]
    table.commit(to_df(spark, updates, schema), 1, 2)
    assert export_to_delta(lake, table.name, path).mode == "incremental"

    delta = DeltaTable(str(path))
    types = {f.name: str(f.type) for f in delta.schema().fields}
    assert types == {
        "id": 'PrimitiveType("integer")', "flag": 'PrimitiveType("boolean")',
        "tiny": 'PrimitiveType("byte")', "small": 'PrimitiveType("short")',
        "big": 'PrimitiveType("long")', "real": 'PrimitiveType("float")',
        "dbl": 'PrimitiveType("double")', "text": 'PrimitiveType("string")',
        "price": 'PrimitiveType("decimal(12,3)")', "day": 'PrimitiveType("date")',
        "at": 'PrimitiveType("timestamp")', "raw": 'PrimitiveType("binary")',
        "tags": 'ArrayType(PrimitiveType("integer"), contains_null=True)',
    }
    got = sorted(delta.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    want = [dict(zip(schema.fieldNames(), row(i, t), strict=True)) for i, t in [(1, "é"),
                                                                                 (3, None)]]
    assert got == want


# --------------------------------------------------------------------------- refusals


def assert_unchanged(path: Path, version: int) -> None:
    assert DeltaTable(str(path)).version() == version


def test_a_target_holding_another_export_or_other_files_is_refused(spark, lake, tmp_path):
    one = lake.create_table(unique("one"), SCHEMA, key=["id"], buckets=1)
    two = lake.create_table(unique("two"), SCHEMA, key=["id"], buckets=1)
    for t in (one, two):
        t.commit(to_df(spark, [((1, "a", 1), 0, 1)]), 0, 1)
    path = tmp_path / "delta"
    export_to_delta(lake, one.name, path)
    with pytest.raises(LakeError, match=rf"holds the Delta export of lake table {one.name}@"):
        export_to_delta(lake, two.name, path)
    assert_unchanged(path, 0)

    foreign = tmp_path / "foreign"
    write_deltalake(str(foreign), delta_source())
    with pytest.raises(LakeError, match="is not an export of lake table"):
        export_to_delta(lake, one.name, foreign)
    assert_unchanged(foreign, 0)

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(LakeError, match=r"is not a Delta table and holds other files \(notes"):
        export_to_delta(lake, one.name, other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]

    # what a first export killed before its commit leaves: data files, no committed log
    left = tmp_path / "left"
    (left / "_delta_log").mkdir(parents=True)
    (left / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet").write_bytes(b"PAR1")
    assert export_to_delta(lake, one.name, left).mode == "full"
    assert delta_rows(left, ["id", "name", "amount"]) == Counter([(1, "a", 1)])

    with pytest.raises(LakeError, match="unknown export target kind 'csv'"):
        export_table(lake, one.name, "csv", tmp_path / "x")


def delta_source():
    import pyarrow as pa

    return pa.table({"id": [1], "name": ["a"], "amount": [1]})


def test_a_widened_or_dropped_column_is_refused_and_changes_nothing(spark, lake, tmp_path):
    narrow = StructType([StructField("id", LongType()), StructField("n", IntegerType()),
                         StructField("s", StringType())])
    table = lake.create_table(unique("evolving"), narrow, key=["id"], buckets=1)
    table.commit(to_df(spark, [((1, 5, "a"), 0, 1)], narrow), 0, 1)
    path = tmp_path / "delta"
    export_to_delta(lake, table.name, path)

    wide = StructType([StructField("id", LongType()), StructField("n", LongType()),
                       StructField("s", StringType())])
    table.commit(to_df(spark, [((1, 5, "a"), 1, -1), ((1, 6, "b"), 1, 1)], wide), 1, 2)
    with pytest.raises(SchemaError, match=r"table \S+: column 'n' is bigint in the lake but "
                                          r"integer in the Delta table"):
        export_to_delta(lake, table.name, path)
    assert_unchanged(path, 0)
    assert delta_rows(path, ["id", "n", "s"]) == Counter([(1, 5, "a")])

    other = lake.create_table(unique("dropping"), narrow, key=["id"], buckets=1)
    other.commit(to_df(spark, [((1, 5, "a"), 0, 1)], narrow), 0, 1)
    path2 = tmp_path / "delta2"
    export_to_delta(lake, other.name, path2)
    fewer = StructType([StructField("id", LongType()), StructField("n", IntegerType())])
    other.commit(to_df(spark, [((1, 5), 1, -1), ((1, 6), 1, 1)], fewer), 1, 2)
    with pytest.raises(SchemaError, match=r"column 's' was dropped from the lake table"):
        export_to_delta(lake, other.name, path2)
    assert_unchanged(path2, 0)


# ------------------------------------------------------------------------------- CLI

CLI = [str(Path(sys.executable).parent / "changelake")]


def test_cli_to_takes_a_kind_and_a_target(tmp_path):
    lake = ["--lake", str(tmp_path / "lake"), "--table", "t"]
    bad = subprocess.run([*CLI, "export", *lake, "--to", "csv", str(tmp_path / "x")],
                         capture_output=True, timeout=60)
    assert bad.returncode == 2 and b"'csv' is not one of 'delta', 'iceberg'" in bad.stderr
    short = subprocess.run([*CLI, "export", *lake, "--to", "delta"], capture_output=True,
                           timeout=60)
    assert short.returncode == 2 and b"requires 2 arguments" in short.stderr
    iceberg_only = subprocess.run([*CLI, "export", *lake, "--to", "delta", str(tmp_path / "x"),
                                   "--catalog", "c"], capture_output=True, timeout=60)
    assert iceberg_only.returncode == 2 and b"--catalog: for --to iceberg only" in \
        iceberg_only.stderr
    assert not (tmp_path / "lake").exists()


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=timeout)


def kill_during(args: list[str], delay: float) -> None:
    """Start a CLI run in its own process group and kill -9 the group (its Spark JVM too)
    `delay` seconds in, or let it finish if it is done by then."""
    process = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.slow  # five Spark processes
def test_cli_export_killed_and_run_again_is_exactly_once(tmp_path, lake_root):
    from tests.support.lake_history import write_parts

    seed = random.randrange(1000)  # a new kill moment each run, printed to reproduce it
    print(f"seed {seed}")
    rng = seeded(seed)
    feed, parts = write_parts(tmp_path, rng)
    lake = ["--lake", str(lake_root), "--master", "local[1]", "--table", "shop.orders"]
    path = tmp_path / "orders.delta"
    export = ["export", *lake, "--to", "delta", str(path)]
    compared = 0
    for n, part in enumerate(parts):
        close = ["--close"] if n == len(parts) - 1 else []
        done = run_cli("ingest", *lake, "--key", "id", "--from", "debezium", *close, part)
        assert done.returncode == 0, done.stderr
        if n == 1:
            continue  # two ingests between exports: the next export spans both
        kill_during(export, rng.uniform(2.0, 25.0))
        finished = run_cli(*export)
        assert finished.returncode == 0, finished.stderr
        line = finished.stderr.decode()
        assert line.startswith("export shop.orders to delta"), line
        snapshot = run_cli("snapshot", *lake, "--format", "jsonl")
        assert snapshot.returncode == 0, snapshot.stderr
        want = Counter(snapshot.stdout.decode().splitlines())
        exported = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        assert Counter(orjson.dumps(plain(r)).decode() for r in exported) == want
        # A first part may finish no time (seed 875: four snapshot rows, all at the time no
        # later event has finished yet), so its table and export are empty; a test that
        # compares only empty tables would prove nothing.
        compared += sum(want.values())
    # each recorded frontier once: a killed run committed all of its export or nothing
    recorded = frontiers(path)
    assert recorded[-1] == "[]" and len(set(recorded)) == len(recorded) <= 2
    assert len(feed.events) > 0 and compared > 0
