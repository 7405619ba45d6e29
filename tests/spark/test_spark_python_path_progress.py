"""The old (UDF) path's Debezium frontier as JVM aggregates: the encoder's rule
(`frontier_from`) on random transactions, and a batch of many transactions without one row per
transaction in the driver."""

from __future__ import annotations

import pickle
import tracemalloc

import orjson
import pytest
from pyspark.sql import functions as F

from changelake.convert.progress import frontier_from
from changelake.convert.progress import ydb_frontier as frontier_of_barriers
from changelake.spark.changefeed.python_path.progress import debezium_frontier, ydb_frontier
from tests.support.seeding import seeded

CHANGES = "time long, tx string, tx_order long, tbl string"
PARSED = "kind string, tx string, end_count long, end_collections string"
BARRIERS = "kind string, file string, barrier long, pos binary"


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_frontier_is_the_encoders_rule(spark, seed: int) -> None:
    rng = seeded(seed)
    changes, parsed, txs = [], [], []
    for i in range(rng.randrange(1, 12)):
        tx, time, table = f"tx{i}", rng.randrange(10, 20), rng.choice(["a", "b", None])
        seen = rng.randrange(0, 4)
        for order in range(seen):
            changes.append((time, tx, order, table))
        expected = None
        if rng.random() < 0.7:
            total = rng.randrange(0, 5)
            per = rng.choice([[], [["a", rng.randrange(0, 4)]], [["b", 1], ["a", 2]]])
            parsed.append(("END", tx, total, orjson.dumps(per).decode() if per or
                           rng.random() < 0.5 else None))
            expected = dict(per).get(table, total) if table is not None and per else total
        txs.append((time if seen else None, seen, expected))
    changes.append((rng.randrange(10, 21), None, None, None))  # an event without a tx
    high = max(c[0] for c in changes)
    since = rng.choice([None, 12, 15])
    frame = spark.createDataFrame(changes, CHANGES)
    ends = spark.createDataFrame(parsed, PARSED)
    assert debezium_frontier(ends, frame, since) == frontier_from(high, txs, since)


def test_many_transactions_are_not_collected(spark) -> None:
    """200,000 complete transactions: the driver's memory stays that of a few rows (each
    transaction's row collected took a peak of 70 MB or more)."""
    n = 200_000
    ids = spark.range(n)
    changes = ids.select(F.col("id").alias("time"), F.col("id").cast("string").alias("tx"),
                         F.lit(0).cast("long").alias("tx_order"), F.lit("t").alias("tbl"))
    parsed = ids.select(F.lit("END").alias("kind"), F.col("id").cast("string").alias("tx"),
                        F.lit(1).cast("long").alias("end_count"),
                        F.lit('[["t", 1]]').alias("end_collections"))
    tracemalloc.start()
    try:
        frontier = debezium_frontier(parsed, changes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frontier == n
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_ydb_frontier_is_the_encoders_rule(spark, seed: int) -> None:
    """Each file's barriers (positions [step, tx], some re-read lower) against
    `PartitionFrontiers` over each file's last one."""
    rng = seeded(seed)
    files = [f"f{i}" for i in range(rng.randrange(1, 5))]
    parsed, last = [], {}
    for name in files:
        if rng.random() < 0.2 and len(files) > 1:
            parsed.append(("change", name, None, None))  # a file without a barrier
            continue
        for _ in range(rng.randrange(1, 5)):
            position = (rng.randrange(0, 30), rng.randrange(0, 3))
            parsed.append(("resolved", name, position[0], pickle.dumps(position)))
            last[name] = max(last.get(name, position), position)
    lines = spark.createDataFrame([(f,) for f in files], "file string")
    expected = frontier_of_barriers([last[f] for f in files if f in last], len(files))
    assert ydb_frontier(spark.createDataFrame(parsed, BARRIERS), lines) == expected


def test_many_files_are_not_collected(spark) -> None:
    """200,000 files (partitions), each with a barrier: the driver's memory stays that of a
    few rows (a row a file collected took a peak of 60 MB or more)."""
    n = 200_000
    ids = spark.range(n)
    lines = ids.select(F.col("id").cast("string").alias("file"))
    parsed = ids.select(F.lit("resolved").alias("kind"), F.col("id").cast("string").alias("file"),
                        F.lit(5).cast("long").alias("barrier"),
                        F.lit(pickle.dumps((5, 0))).cast("binary").alias("pos"))
    tracemalloc.start()
    try:
        frontier = ydb_frontier(parsed, lines)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frontier == 5
    assert peak < 8 << 20, peak
