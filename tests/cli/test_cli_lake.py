"""The lake commands through the real console script: ingest twice (exactly once), snapshot
now and AS OF, compact, status. Each command is its own Spark process on the lake's embedded
metastore, as a user would run them one after another."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.lake_roots import lake_exists
from tests.support.paths import SAMPLES

CLI = [str(Path(sys.executable).parent / "changelake")]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=600)


def orders_feed(tmp_path: Path) -> Path:
    sample = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
    feed = tmp_path / "orders.jsonl"
    encoded = run("encode", "--from", "debezium", "--key", "order_id", "--close", str(sample))
    assert encoded.returncode == 0, encoded.stderr
    feed.write_bytes(encoded.stdout)
    return feed


def ingest_twice_and_snapshot(tmp_path: Path, lake_root: Path | str) -> list[str]:
    """The essential sequence; returns the lake options for further commands."""
    feed = orders_feed(tmp_path)
    lake = ["--lake", str(lake_root), "--master", "local[1]"]
    first = run("ingest", *lake, "--table", "orders", "--key", "order_id", str(feed))
    assert first.returncode == 0, first.stderr
    assert first.stderr.decode().strip().splitlines() == [
        "orders: created, committed 5 updates at times [0, ∞) as version 1"]
    again = run("ingest", *lake, "--table", "orders", "--key", "order_id", str(feed))
    assert again.returncode == 0 and "orders: nothing new" in again.stderr.decode()
    now = run("snapshot", *lake, "--table", "orders", "--format", "jsonl")
    rows = sorted((r["order_id"], r["product_id"]) for r in map(orjson.loads,
                                                                now.stdout.splitlines()))
    assert rows == [(1, 3), (2, 2), (3, 2)]  # one row per key, order 1 moved to product 3
    return lake


@pytest.mark.slow  # about a minute of CLI processes; test_lake_names runs the CLI on a lake
def test_ingest_is_exactly_once_and_snapshot_reads_it(tmp_path: Path, lake_root) -> None:
    ingest_twice_and_snapshot(tmp_path, lake_root)


@pytest.mark.slow
def test_ingest_snapshot_compact_status(tmp_path: Path, lake_root) -> None:
    lake = ingest_twice_and_snapshot(tmp_path, lake_root)
    before = run("snapshot", *lake, "--table", "orders", "--as-of", "1", "--format", "csv")
    assert before.returncode == 0, before.stderr
    lines = before.stdout.decode().splitlines()
    rows = list(csv.DictReader(lines))
    assert set(lines[0].split(",")) == {"order_id", "order_date", "customer_name", "price",
                                        "product_id", "order_status"}
    # as of time 1: the snapshot, order 1 still on product 1
    assert sorted((r["order_id"], r["product_id"]) for r in rows) == [
        ("1", "1"), ("2", "2"), ("3", "2")]

    compacted = run("compact", *lake, "--table", "orders")
    assert compacted.returncode == 0 and "since 0 -> " in compacted.stderr.decode()
    status = run("status", *lake, "--format", "jsonl")
    (table,) = map(orjson.loads, status.stdout.splitlines())
    assert table["name"] == "orders" and table["rows"] == 3 and table["frontier"] == []
    missing = run("snapshot", *lake, "--table", "nope")
    assert missing.returncode == 2
    assert missing.stderr.decode().count("\n") == 1 and "nope" in missing.stderr.decode()


@pytest.mark.slow
def test_scd2_history_from_the_cli(tmp_path: Path, lake_root) -> None:
    feed = orders_feed(tmp_path)
    lake = ["--lake", str(lake_root), "--master", "local[1]"]
    assert run("ingest", *lake, "--table", "orders", "--key", "order_id", "--scd2",
               str(feed)).returncode == 0
    history = run("snapshot", *lake, "--table", "orders", "--history", "--format", "jsonl")
    versions = [(r["order_id"], r["product_id"], r["valid_from"], r["valid_to"])
                for r in map(orjson.loads, history.stdout.splitlines())]
    assert versions == [(1, 1, 0, 23911952), (1, 3, 23911952, None), (2, 2, 0, None),
                        (3, 2, 0, None)]


def test_a_command_that_reads_a_lake_refuses_a_path_that_holds_none(tmp_path: Path,
                                                                     lake_at) -> None:
    """A mistyped --lake is an error naming it, not an empty lake (status printed nothing,
    rc 0), and no command but ingest makes the directory (compact and snapshot did)."""
    missing = lake_at("no-such-lake")
    for command in (["status"], ["snapshot", "--table", "t"], ["compact", "--table", "t"],
                    ["changes", "--table", "t", "--since", "0"],
                    ["export", "--table", "t", "--to", "delta", str(tmp_path / "d")],
                    ["sql"]):
        done = run(*command, "--lake", str(missing))
        assert done.returncode == 2, (command, done.stderr)
        assert f"no lake at {missing}" in done.stderr.decode(), command
        assert not lake_exists(missing), command
