"""YDB's barrier rule: the window (`barriers._below`) finds the records below an earlier
barrier of their file, and each file's highest barrier, across blocks; the parse's tasks and
the driver mark the same records (`YdbLines.java`'s blocks, `barriers.marked_below`); and a
real read of files cut into many blocks is checked by the conversion, or by the window where
the blocks are not told."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from changelake.spark.changefeed import barriers, ydb_path
from tests.convert.test_convert_history import write_ydb
from tests.spark.test_spark_changefeed_ydb import HISTORY, YDB_TABLE, compare, restarted

pytestmark = pytest.mark.spark

ITEMS = ("file_index int, block bigint, row bigint, kind string, pos array<decimal(20,0)>, "
         "rpos array<decimal(20,0)>, k0 bigint")


def generated(rng: random.Random) -> list[tuple[Any, ...]]:
    """Lines of two or three files, each of one to three blocks: records at positions that
    mostly rise, now and then one from before (a replay, or a late record), and barriers."""
    rows = []
    for file in range(rng.randint(2, 3)):
        step = 0
        for block in range(rng.randint(1, 3)):
            offset = block * 1000
            for row in range(offset, offset + rng.randint(0, 12)):
                step += rng.randint(0, 2)
                if rng.random() < 0.2:
                    rows.append((file, offset, row, "resolved", None,
                                 [Decimal(step), Decimal(0)], None))
                elif rng.random() < 0.1:
                    rows.append((file, offset, row, "careful", None, None, None))
                else:
                    back = rng.randint(0, 6) if rng.random() < 0.3 else 0
                    rows.append((file, offset, row, "change",
                                 [Decimal(max(step - back, 0)), Decimal(rng.randint(0, 2))],
                                 None, rng.randint(1, 4)))
    return rows


def by_block(spark: Any, rows: list[tuple[Any, ...]], partitions: int = 3) -> Any:
    """Each block's rows in one partition, in row order, as `read.py` reads a block; a
    checkpoint, as the parse's is."""
    return spark.createDataFrame(rows, ITEMS).repartition(partitions, "file_index", "block") \
        .sortWithinPartitions("file_index", "block", "row").localCheckpoint()


def found(frame: Any) -> set[tuple[int, int, int]]:
    return {(r[0], r[1], r[2]) for r in frame.select("file_index", "block", "row").collect()}


def below_in_python(rows: list[tuple[Any, ...]]) -> tuple[set[tuple[int, int, int]], dict]:
    """The rule read plainly: each file's lines in order (block, then row), the running
    highest barrier, and the changes whose position is below it; and each file's highest."""
    below, highest = set(), {}
    for file, block, row, kind, pos, rpos, _ in sorted(rows, key=lambda r: r[:3]):
        if kind == "resolved" and (file not in highest or rpos > highest[file]):
            highest[file] = rpos
        elif kind == "change" and file in highest and pos < highest[file]:
            below.add((file, block, row))
    return below, highest


@pytest.mark.parametrize("seed", range(6))
def test_the_window_finds_what_the_rule_says(spark: Any, seed: int) -> None:
    rows = generated(random.Random(seed))
    window = barriers._window_below(by_block(spark, rows), ("k0",), None)
    expected, highest = below_in_python(rows)
    assert found(window.frame) == expected and window.count == len(expected)
    assert window.last == highest
    # What it returns of each record is the record's own.
    own = {(r[0], r[2]): (r[4], r[6]) for r in rows}
    assert all(own[(r["file_index"], r["row"])] == (list(r["pos"]), r["k0"])
               for r in window.frame.collect())


def test_a_barrier_reaches_the_later_blocks_of_its_file_only(spark: Any) -> None:
    """A record in a later block below the barrier of an earlier one is found (and once,
    though it is also below a barrier of its own block); the other file's barrier does not
    reach it."""
    def at(step: int) -> list[Decimal]:
        return [Decimal(step), Decimal(0)]

    rows = [(0, 0, 0, "resolved", None, at(50), None),
            (0, 1000, 1000, "change", at(60), None, 1),
            (0, 1000, 1001, "change", at(10), None, 2),
            (0, 1000, 1002, "resolved", None, at(70), None),
            (0, 1000, 1003, "change", at(20), None, 3),
            (0, 1000, 1004, "change", at(55), None, 4),
            (1, 0, 0, "change", at(10), None, 5)]
    scanned = barriers._window_below(by_block(spark, rows), ("k0",), None)
    assert found(scanned.frame) == {(0, 1000, 1001), (0, 1000, 1003), (0, 1000, 1004)}
    assert scanned.count == 3 and scanned.last == {0: at(70)}


@pytest.mark.parametrize("form", ["uint64", "longs"])
def test_the_blocks_mark_by_step_then_by_position(spark: Any, form: str) -> None:
    """`marked_below` decides by the step (`time`, a long) and compares the positions only at
    the prior barrier's own step, where the transaction decides: below it at a lesser one,
    not at an equal or greater one; a barrier whose step no long holds is compared as a
    position. A barrier row is never marked, and a block with no prior keeps its marks. The
    same with the positions as the Java conversion reads them (`keyed.java_ready_schema`, as
    YDB's Java parse makes them), the barriers Uint64s as ever."""
    from changelake.spark.changefeed.keyed import flipped

    def position(v: int) -> Any:
        return Decimal(v) if form == "uint64" else flipped(v)
    kind = "decimal(20,0)" if form == "uint64" else "bigint"
    rows = [(0, 0, 0, "change", [5, 1], 5, False), (0, 0, 1, "change", [9, 9], 9, True),
            (0, 10, 0, "change", [5, 3], 5, False), (0, 10, 1, "change", [5, 7], 5, False),
            (0, 10, 2, "change", [5, 9], 5, False), (0, 10, 3, "change", [4, 99], 4, False),
            (0, 10, 4, "change", [6, 0], 6, False), (0, 10, 5, "resolved", None, None, False),
            (1, 0, 0, "change", [2**63 + 1, 0], None, False),
            (1, 0, 1, "change", [2**63 + 3, 0], None, False)]
    items = spark.createDataFrame(
        [(*r[:4], None if r[4] is None else [position(v) for v in r[4]], *r[5:])
         for r in rows], "file_index int, block bigint, row bigint, kind string, "
        f"pos array<{kind}>, time bigint, _below boolean")
    blocks = barriers.Blocks([(0, 10, [Decimal(5), Decimal(7)]),
                              (1, 0, [Decimal(2**63 + 2), Decimal(0)])], {})
    marked = barriers.marked_below(items, blocks)
    assert marked.columns == items.columns
    assert found(marked.where("_below")) == {(0, 0, 1), (0, 10, 0), (0, 10, 3), (1, 0, 0)}


#: A history with no nulls written, no NaN, no key beyond a long.
SIMPLE = {"scan": {1: ("a", 0.5), 2: ("b", 1.0)},
          "txs": [(1, [("update", 1, {"name": "c"}), ("reset", 2, {"score": 3.0})], True),
                  (1, [("erase", 1, {}), ("update", 2, {"score": 2.0})], False),
                  (0, [("update", 3, {"name": "y"}), ("update", 1, {"score": -1.5})], True),
                  (2, [("update", 3, {"name": "z"})], False)],
          "seed": 11}


@pytest.mark.parametrize("history, rule", [(SIMPLE, "conversion"), (SIMPLE, "untold"),
                                           (HISTORY, "conversion")],
                         ids=["simple", "simple-untold", "nan-and-nulls"])
def test_files_read_in_many_blocks(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   history: dict[str, Any], rule: str) -> None:
    """Files cut into blocks of a few lines each (`spark.sql.files.maxPartitionBytes`), with
    a restart's replays below a barrier: the result is the encoder's. Java reads the lines
    (nulls in update and NaN too), and the rule is checked by the conversion, the parse's
    tasks marking the records below their block's barriers and the driver those below an
    earlier block's (`barriers.Blocks`, `marked_below`); where that is not told (here made
    so), the window finds the replays."""
    windows: list[barriers.Below] = []
    marked: list[Any] = []

    def window(*args: Any) -> barriers.Below:
        windows.append(window_below(*args))
        return windows[-1]

    def mark(items: Any, blocks: barriers.Blocks) -> Any:
        assert blocks.prior  # a barrier reaches later blocks
        marked.append(barriers.marked_below(items, blocks))
        return marked[-1]

    window_below = barriers._window_below
    monkeypatch.setattr(barriers, "_window_below", window)
    monkeypatch.setattr(ydb_path, "marked_below", mark)
    if rule == "untold":
        monkeypatch.setattr(barriers.Blocks, "of", staticmethod(lambda tasks: None))
    paths, _, last = write_ydb(history, tmp_path)
    restarted(paths, 5)
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "200")
    try:
        got, _ = compare(spark, paths, tmp_path, YDB_TABLE, close=False)
        below = [m.where("_below").count() for m in marked]
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)
    assert got is not None and got.path == "jvm", got and got.reason
    assert got.frontier == last
    assert (len(marked), len(windows)) == {"conversion": (1, 0), "untold": (0, 1)}[rule]
    if rule == "conversion":
        assert below[0] > 0
    else:
        (found_below,) = windows
        assert found_below.count > 0


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_the_blocks_mark_what_the_window_finds(spark: Any, tmp_path: Path, seed: int) -> None:
    """The records below their file's running highest barrier, as the parse's tasks mark them
    within their blocks and the driver across them (`Blocks`, `marked_below`), are exactly
    those the window finds (`_below`), with each file's highest barrier, on files cut into
    blocks of a few lines, replayed from some line on, with a late record or two."""
    from changelake.formats.tableschema import TableSchema
    from changelake.spark.changefeed.keyed import uint64_positions
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.changefeed.ydb import ydb_columns
    from changelake.spark.changefeed.ydb_path import _ydb_parsed_by_java
    from tests.spark.test_spark_changefeed_ydb import late_record

    paths, _, _ = write_ydb(SIMPLE, tmp_path)
    restarted(paths, seed)
    assert late_record(paths, seed)
    schema = TableSchema.from_json(YDB_TABLE)
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "200")
    try:
        parsed = _ydb_parsed_by_java(read_lines(spark, [str(p) for p in paths]), schema,
                                     ydb_columns(schema, list(schema.primary_key)))
        assert parsed is not None
        items, _, blocks, _ = parsed
        assert blocks is not None and blocks.prior
        place = ("file_index", "block", "row")
        marked = sorted(tuple(r) for r in barriers.marked_below(items, blocks)
                        .where("_below").select(*place).collect())
        # the window compares the records' positions with the barriers as Uint64s
        uint64 = uint64_positions(items)
        found = sorted(tuple(r) for r in barriers._below(uint64, keep=()).select(*place)
                       .collect())
        within = items.where("_below").count()
        chunks = barriers._barrier_chunks(uint64, ())
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)
    assert marked == found
    assert 0 < within < len(found)  # below a barrier of its own block, and of an earlier one
    assert blocks.last == {f: h for f, h in chunks.highest.items() if h is not None}
