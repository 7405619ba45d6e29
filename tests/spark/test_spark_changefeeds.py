"""Changefeeds on Spark agree with `encode_changefeed` on the same generated histories."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.convert import encode_changefeed
from changelake.errors import ChangefeedError
from changelake.protocol import collect
from changelake.spark.changefeed.python_path import changefeed_changes
from tests.convert.test_convert_history import (
    PG_TABLE,
    YDB_TABLE,
    PgHistory,
    write_pg,
    write_ydb,
)
from tests.support.changefeed_cases import (
    FLOAT_KEYS_FINAL,
    PG_CASES,
    final_rows,
    python_updates,
    spark_updates,
    write_float_keys,
)
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def python_workers(spark: Any) -> None:
    """Python workers must run this interpreter (the one with changelake and pyspark).
    `build_session` points a session it starts at it; this also holds for a session started
    elsewhere (the context reads `pythonExec` whenever it ships a Python function)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark.sparkContext.pythonExec = sys.executable


def lines_frame(spark: Any, paths: list[Path]) -> Any:
    rows = [(line.decode(), str(path), number)
            for path in paths
            for number, line in enumerate(path.read_bytes().splitlines(), start=1)
            if line.strip()]
    return spark.createDataFrame(rows, "value string, file string, line long")


@pytest.mark.parametrize("history", PG_CASES)
@pytest.mark.parametrize("close", [False, True])
def test_debezium_on_spark_matches_the_encoder(spark: Any, tmp_path: Path, history: PgHistory,
                                               close: bool) -> None:
    paths, _, _ = write_pg(history, tmp_path)
    frames = changefeed_changes(lines_frame(spark, paths), source="debezium", keys=["id"],
                                table_schema=PG_TABLE, close=close)
    messages = list(encode_changefeed(paths, source="debezium", keys=["id"],
                                      table_schema=PG_TABLE, close=close, lenient=False))
    expected = collect(messages)
    assert frames.frontier == (None if close else expected.frontier.elements[0])
    assert spark_updates(frames.changes) == python_updates(messages)
    assert frames.rejected.count() == 0


def test_keys_equal_in_python_reach_one_group(spark: Any, tmp_path: Path) -> None:
    """The Python path groups by pickled keys: `1` and `1.0`, `0.0` and `-0.0` are spelled
    alike first (they were two groups, so the update and the delete missed their rows)."""
    path = write_float_keys(tmp_path / "floats.jsonl")
    frames = changefeed_changes(lines_frame(spark, [path]), source="debezium", keys=["id"],
                                close=True)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    updates = spark_updates(frames.changes)
    assert updates == python_updates(messages)
    assert final_rows(updates) == FLOAT_KEYS_FINAL


def test_frames_feed_spark_encode(spark: Any, tmp_path: Path) -> None:
    from changelake.spark.encoder import encode, to_messages

    paths, times, states = write_pg(PG_CASES[1], tmp_path)
    frames = changefeed_changes(lines_frame(spark, paths), source="debezium", keys=["id"],
                                table_schema=PG_TABLE, close=False)
    messages = list(to_messages(encode(frames.changes, frames.finished_through).collect(),
                                fields=("id", "name", "amount", "note")))
    got = collect(messages)
    assert got.frontier.elements == (frames.frontier,)
    assert any(time < frames.frontier for time in times)  # some time is checked below
    for time, expected in zip(times, states, strict=True):
        if time < frames.frontier:
            total: Counter[Any] = Counter()
            for data, t, diff in got.updates:
                if t <= time:
                    total[data] += diff
            assert +total == expected


def test_ydb_on_spark_matches_the_encoder(spark: Any, tmp_path: Path) -> None:
    rng = seeded(7)
    history = {"scan": {1: ("a", 0.5), 2**63 + 1: ("b", "nan")},
               "txs": [(rng.randint(0, 2), [("update", 1, {"name": "c"}),
                                            ("reset", 2**64 - 1, {"score": "inf"})], True),
                       (1, [("erase", 1, {}), ("update", 2**63 + 1, {"score": 2.0})], False),
                       (0, [("update", 3, {"name": None})], True),
                       (2, [("update", 2**64 - 1, {"name": "z"})], False)],
               "seed": 11}
    paths, _, _ = write_ydb(history, tmp_path)
    for close in (False, True):
        frames = changefeed_changes(lines_frame(spark, paths), source="ydb",
                                    table_schema=YDB_TABLE, close=close)
        messages = list(encode_changefeed(paths, source="ydb", keys=None,
                                          table_schema=YDB_TABLE, close=close, lenient=False))
        expected = collect(messages)
        assert frames.frontier == (None if close else expected.frontier.elements[0])
        assert spark_updates(frames.changes) == python_updates(messages)


def test_images_on_spark_and_bad_lines(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "my.jsonl"
    src = {"connector": "mysql", "file": "bin.000001", "table": "t", "db": "d"}
    a, b = {"id": 1, "v": "a"}, {"id": 1, "v": "b"}
    events = [{"op": "c", "after": a, "source": _src(src, 10)},
              {"op": "u", "before": a, "after": b, "source": _src(src, 20)},
              {"op": "u", "before": a, "after": b, "source": _src(src, 20)}]  # a replay
    path.write_bytes(b"\n".join([*map(orjson.dumps, events), b"{not json"]))
    lines = lines_frame(spark, [path])
    with pytest.raises(ChangefeedError, match=r"line 4: not valid JSON"):
        changefeed_changes(lines, source="debezium", close=True)
    frames = changefeed_changes(lines, source="debezium", close=True, strict=False)
    assert [(r["line"], r["reason"][:14]) for r in frames.rejected.collect()] == [
        (4, "not valid JSON")]
    assert spark_updates(frames.changes) == Counter({((("id", 1), ("v", "b")), 1 << 32 | 20): 1,
                                             ((("id", 1), ("v", "a")), 1 << 32 | 10): 1,
                                             ((("id", 1), ("v", "a")), 1 << 32 | 20): -1})


def _src(src: dict[str, Any], pos: int) -> dict[str, Any]:
    return {**src, "pos": pos, "row": 0}
