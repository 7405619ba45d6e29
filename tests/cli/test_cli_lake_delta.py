"""A Delta-format lake through the real console script, as a user runs it: a Debezium feed
ingested (twice: exactly once) into a Delta table, read by every reader (the JVM-free engine,
Spark, delta-rs, DuckDB, and a plain PySpark session with nothing but Delta's jars), AS OF,
the change feed, compaction and status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.paths import SAMPLES

CLI = [str(Path(sys.executable).parent / "changelake")]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=600, env=env)


def orders(out: subprocess.CompletedProcess) -> list[tuple[int, int]]:
    assert out.returncode == 0, out.stderr
    return sorted((r["order_id"], r["product_id"])
                  for r in map(orjson.loads, out.stdout.splitlines()))


PLAIN_READER = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.jars", sys.argv[1])
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog",
                 "org.apache.spark.sql.delta.catalog.DeltaCatalog").getOrCreate())
for r in spark.read.format("delta").load(sys.argv[2]).collect():
    print(r["order_id"], r["product_id"])
"""


def ingest_orders(tmp_path: Path) -> list[str]:
    """A Delta table shop.orders from a Debezium sample, ingested twice (the second changes
    nothing); returns the lake options."""
    sample = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
    lake = ["--lake", str(tmp_path / "lake"), "--master", "local[1]"]
    first = run("ingest", *lake, "--table", "shop.orders", "--key", "order_id", "--from",
                "debezium", "--close", "--format", "delta", str(sample))
    assert first.returncode == 0, first.stderr
    again = run("ingest", *lake, "--table", "shop.orders", "--from", "debezium", "--close",
                str(sample))
    assert again.returncode == 0 and "nothing new" in again.stderr.decode(), again.stderr
    return lake


NOW = [(1, 3), (2, 2), (3, 2)]  # one row per key, order 1 moved to product 3
TABLE = ["--table", "shop.orders", "--format", "jsonl"]


def test_a_delta_table_every_reader_reads(tmp_path: Path) -> None:
    """Ingested by the CLI; read without a JVM (the Arrow engine, `status`), and by delta-rs
    and DuckDB with no changelake code."""
    import duckdb
    from deltalake import DeltaTable

    lake = ingest_orders(tmp_path)
    assert orders(run("snapshot", *lake, *TABLE, "--engine", "arrow")) == NOW
    current = tmp_path / "lake" / "tables" / "shop" / "orders" / "current"
    delta = DeltaTable(str(current))
    got = sorted((r["order_id"], r["product_id"]) for r in delta.to_pyarrow_table().to_pylist())
    assert got == NOW
    dataset = delta.to_pyarrow_dataset()  # noqa: F841 (DuckDB reads it by its name)
    assert sorted(duckdb.sql("SELECT order_id, product_id FROM dataset").fetchall()) == NOW
    assert delta.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    status = run("status", *lake, "--format", "jsonl", "--engine", "arrow")
    assert status.returncode == 0, status.stderr
    (row,) = map(orjson.loads, status.stdout.splitlines())
    assert row["name"] == "shop.orders" and row["rows"] == 3 and row["frontier"] == []


@pytest.mark.slow  # about three minutes of Spark processes
def test_a_delta_lake_from_ingest_to_compaction(tmp_path: Path) -> None:
    """Spark's reads (now, AS OF, the change feed), a plain PySpark session with nothing but
    Delta's jars, compaction and `status` on Spark."""
    from changelake.spark.maven import require_jars

    lake = ingest_orders(tmp_path)
    assert orders(run("snapshot", *lake, *TABLE, "--engine", "spark")) == NOW
    current = tmp_path / "lake" / "tables" / "shop" / "orders" / "current"
    jars = ",".join(str(j) for j in require_jars())
    plain = subprocess.run([sys.executable, "-c", PLAIN_READER, jars, str(current)],
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert sorted(tuple(map(int, line.split())) for line in plain.stdout.splitlines()) == NOW

    # AS OF the snapshot's time, before the update that moved order 1.
    history = run("changes", *lake, "--table", "shop.orders", "--since", "0", "--history")
    assert history.returncode == 0, history.stderr
    times = sorted({r["time"] for r in map(orjson.loads, history.stdout.splitlines())
                    if "time" in r})
    before = orders(run("snapshot", *lake, *TABLE, "--as-of", str(times[0])))
    assert (1, 1) in before and (1, 3) not in before

    compacted = run("compact", *lake, "--table", "shop.orders")
    assert compacted.returncode == 0, compacted.stderr
    assert orders(run("snapshot", *lake, *TABLE)) == NOW
    status = run("status", *lake, "--format", "jsonl", "--engine", "spark")
    assert status.returncode == 0, status.stderr
    (row,) = map(orjson.loads, status.stdout.splitlines())
    assert row["name"] == "shop.orders" and row["rows"] == 3 and row["frontier"] == []
