"""Progress statements on the driver (issue 67): `decode` streams them from the executors into
the protocol's reader, which keeps a count a covered time, not the statements; the streaming
decoders' `collect_statements` keeps a batch's within `MAX_STATEMENT_BYTES`, refusing more in
one line at the statement that crossed it."""

from __future__ import annotations

import tracemalloc

import pytest
from pyspark.sql import functions as F

from changelake.errors import InputError
from changelake.protocol import Antichain
from changelake.spark import decoder
from changelake.spark.decoder import collect_statements, decode

pytestmark = pytest.mark.spark

COUNTS = "array<struct<time: bigint, count: bigint>>"


def statements(spark, n: int, counts: int = 1):
    """`n` statements made in the JVM, each `[0, counts)` counting one update at each of its
    `counts` times (the same statement repeated, as a replayed log repeats it), with where
    they were read; in 10 partitions (the driver holds one at a time)."""
    return spark.range(0, n, 1, 10).select(
        F.array(F.lit(0).cast("long")).alias("lower"),
        F.array(F.lit(counts).cast("long")).alias("upper"),
        F.expr(f"transform(sequence(0L, {counts - 1}L), t -> named_struct('time', t, "
               "'count', 1L))").cast(COUNTS).alias("counts"),
        F.lit("log.avro").alias("_file"), (F.col("id") + 1).alias("_line"),
        F.lit(None).cast("long").alias("_offset"))


def test_decode_keeps_no_statement_on_the_driver(spark) -> None:
    """60,000 statements (a log replayed many times) and one update: the driver's peak is that
    of a partition's rows at most (about 2 MB), not of 60,000 statements (80 MB and more when
    they were collected)."""
    progress = statements(spark, 60_000)
    updates = spark.createDataFrame([({"k": 1}, 0, 1)], "data struct<k: long>, time long, "
                                                        "diff long")
    tracemalloc.start()
    try:
        with decode(updates, progress) as decoded:
            frontier = decoded.frontier
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frontier == Antichain([1])
    assert peak < 16 << 20, peak


def test_collect_statements_refuses_beyond_its_bound_in_one_line(
        spark, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound made 1 MiB (256 MiB is minutes of Spark rows): 2,000 statements of 100 counts
    each take about 26 MB; refused at the statement that crossed it, named by file and line."""
    monkeypatch.setattr(decoder, "MAX_STATEMENT_BYTES", 2**20)
    with pytest.raises(InputError) as caught:
        collect_statements(statements(spark, 2000, counts=100))
    text = str(caught.value)
    assert "\n" not in text, text
    assert text.startswith("log.avro, line 78: the progress statements of one batch take more "
                           "than 1 MiB"), text
    assert "rule: a batch's progress statements are held within a bound" in text, text


def test_collect_statements_within_its_bound_returns_them_in_order(spark) -> None:
    got = collect_statements(statements(spark, 5, counts=2))
    assert [s.origin.line for s in got] == [1, 2, 3, 4, 5]
    assert got[0].counts == ((0, 1), (1, 1)) and got[0].upper == Antichain([2])


def test_statements_kept_from_earlier_batches_count_toward_the_bound(
        spark, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streaming decoder whose frontier never advances keeps every statement: what it kept
    counts, so the bound holds across batches (the bound made 1 MiB)."""
    monkeypatch.setattr(decoder, "MAX_STATEMENT_BYTES", 2**20)
    kept = collect_statements(statements(spark, 70, counts=100))  # about 0.9 MiB
    with pytest.raises(InputError, match=r"^log\.avro, line 8: .* more than 1 MiB"):
        collect_statements(statements(spark, 10, counts=100), kept)
