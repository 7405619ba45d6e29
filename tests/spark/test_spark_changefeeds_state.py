"""Changefeeds on Spark with a state table, and bad input on Spark.

Differential: the same lines and the same initial rows go through `encode_changefeed(...,
state=MemoryState(...))` and through `changefeed_changes(..., state=<DataFrame>)`; the changes
must be identical. Bad lines must come out as one `ChangefeedError` naming the line (strict) or
as `rejected` with everything else converted exactly as the sequential encoder does (lenient).
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.convert import MemoryState, encode_changefeed
from changelake.errors import ChangefeedError
from changelake.formats.change import NAN
from changelake.formats.materialize import SetAside
from changelake.protocol import collect
from changelake.spark.changefeed.python_path import changefeed_changes
from changelake.values import thaw
from tests.convert.test_convert_history import PG_COLUMNS, PG_TABLE, YDB_TABLE, write_pg, write_ydb
from tests.spark.test_spark_changefeeds import (  # noqa: F401 - python_workers is an autouse fixture
    PG_CASES,
    lines_frame,
    python_updates,
    python_workers,
    spark_updates,
)

pytestmark = pytest.mark.spark

PG_DDL = "id bigint, name string, amount string, note string"


def _without_snapshot(paths: list[Path]) -> None:
    """Drop the snapshot rows: the state table stands in for them."""
    for path in paths:
        kept = [line for line in path.read_bytes().splitlines() if b'"op":"r"' not in line]
        path.write_bytes(b"\n".join(kept) + b"\n")


@pytest.mark.parametrize(("history", "close"), [(PG_CASES[0], False), (PG_CASES[1], True)])
def test_state_on_spark_matches_the_encoder_with_a_memory_state(
        spark: Any, tmp_path: Path, history: Any, close: bool) -> None:
    paths, _, _ = write_pg(history, tmp_path)
    full = list(encode_changefeed(paths, source="debezium", keys=["id"], table_schema=PG_TABLE,
                                  close=close, lenient=False))
    snapshot = [data for data, time, diff in collect(full).updates if time == 0]
    assert snapshot and all(diff == 1 for _, time, diff in collect(full).updates if time == 0)
    _without_snapshot(paths)
    rows = [thaw(data) for data in snapshot]

    state = MemoryState.from_rows(rows, ["id"], PG_COLUMNS)
    messages = list(encode_changefeed(paths, source="debezium", keys=["id"],
                                      table_schema=PG_TABLE, close=close, lenient=False,
                                      state=state))
    frames = changefeed_changes(lines_frame(spark, paths), source="debezium", keys=["id"],
                                table_schema=PG_TABLE, close=close,
                                state=spark.createDataFrame(rows, PG_DDL))
    got = spark_updates(frames.changes)
    assert got == python_updates(messages)
    # And the state stood in for the snapshot exactly: the full feed less its snapshot rows.
    expected = python_updates(full)
    for data, time in list(expected):
        if time == 0:
            del expected[(data, time)]
    assert got == expected
    assert any(diff < 0 for diff in got.values())  # retractions of rows only the state held
    assert frames.frontier == (None if close else collect(messages).frontier.elements[0])


def test_a_column_the_table_lacks_is_null_in_its_rows_on_both_paths(spark: Any,
                                                                   tmp_path: Path) -> None:
    """The feed brings a column (`note`) the table does not have yet, a column the source
    added: the table's rows read it as null (`lake/schema.py`), as the encoder reads a state
    row without the field. Both Spark paths retract a key's previous row with it null; they
    refused the batch before (the Python path's "the state has no columns", the Spark path's
    unresolved column)."""
    from changelake.spark.changefeed.pipeline import convert_frames

    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    full = list(encode_changefeed(paths, source="debezium", keys=["id"], table_schema=PG_TABLE,
                                  close=True, lenient=False))
    snapshot = [thaw(data) for data, time, _ in collect(full).updates if time == 0]
    _without_snapshot(paths)
    rows = [{k: v for k, v in row.items() if k != "note"} for row in snapshot]
    messages = list(encode_changefeed(
        paths, source="debezium", keys=["id"], table_schema=PG_TABLE, close=True, lenient=False,
        state=MemoryState.from_rows(rows, ["id"], PG_COLUMNS)))
    expected = python_updates(messages)
    assert any(diff < 0 and ("note", None) in data for (data, _), diff in expected.items())
    table = tmp_path / "table.json"
    table.write_text(orjson.dumps(PG_TABLE).decode())
    # A column of the state in another case is that column, as Spark's resolver finds it.
    lower = spark.createDataFrame(rows, "id bigint, name string, amount string")
    for state in (lower, lower.withColumnRenamed("name", "NAME")):
        for jvm in (True, False):
            got = convert_frames(spark, paths, "debezium", ["id"], table, close=True,
                                 state=state, python_path=not jvm)
            assert (got.path == "jvm") == jvm, got.reason
            assert spark_updates(got.changes) == expected, (state.columns, jvm)


def test_ydb_state_with_uint64_keys_nan_and_partial_updates(spark: Any, tmp_path: Path) -> None:
    big = 2**63 + 1
    history = {"scan": {},
               "txs": [(1, [("update", 1, {"name": "c"}), ("erase", big, {}),
                            ("update", 2**64 - 1, {"score": 2.0})], True),
                       (1, [("update", 3, {"name": "new"}), ("update", 5, {"score": "nan"})],
                        False)],
               "seed": 3}
    paths, _, _ = write_ydb(history, tmp_path)
    rows = [{"id": 1, "name": "a", "score": 0.5}, {"id": big, "name": "b", "score": NAN},
            {"id": 2**64 - 1, "name": None, "score": float("inf")},
            {"id": 5, "name": "keep", "score": 1.0}, {"id": 7, "name": "untouched",
                                                      "score": None}]
    state = MemoryState.from_rows(rows, ["id"], ("id", "name", "score"))
    messages = list(encode_changefeed(paths, source="ydb", keys=None, table_schema=YDB_TABLE,
                                      close=True, lenient=False, state=state))
    frame = spark.createDataFrame([(Decimal(r["id"]), r["name"], r["score"]) for r in rows],
                                  "id decimal(20,0), name string, score double")
    frames = changefeed_changes(lines_frame(spark, paths), source="ydb", table_schema=YDB_TABLE,
                                close=True, state=frame)
    got = spark_updates(frames.changes)
    assert got == python_updates(messages)
    # The update of key 1 kept the state's score; erasing `big` retracted its NaN row.
    assert got[((("id", 1), ("name", "a"), ("score", 0.5)), 101)] == -1
    assert got[((("id", 1), ("name", "c"), ("score", 0.5)), 101)] == 1
    assert got[((("id", big), ("name", "b"), ("score", "NaN")), 101)] == -1
    assert got[((("id", 5), ("name", "keep"), ("score", "NaN")), 103)] == 1


def _mysql(op: str, pos: int, before: Any = None, after: Any = None) -> bytes:
    source = {"connector": "mysql", "file": "bin.000001", "pos": pos, "row": 0,
              "table": "t", "db": "d"}
    return orjson.dumps({"op": op, "before": before, "after": after, "source": source})


def test_state_with_deletes_replays_and_a_truncate(spark: Any, tmp_path: Path) -> None:
    rows = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}]
    path = tmp_path / "t.jsonl"
    update_2 = _mysql("u", 25, after={"id": 2, "v": "b2"})
    path.write_bytes(b"\n".join([
        _mysql("u", 20, after={"id": 1, "v": "a2"}),  # no before-image: the state's row goes
        update_2,
        _mysql("d", 30, before={"id": 2, "v": None}),
        update_2,  # a restart re-sends it after the delete: it must not resurrect key 2
        _mysql("t", 40),  # retracts key 1's new row and key 3, which only the state holds
        _mysql("c", 50, after={"id": 4, "v": "d"}),
    ]) + b"\n")
    messages = list(encode_changefeed(
        [path], source="debezium", keys=["id"], table_schema=None, close=True, lenient=False,
        state=MemoryState.from_rows(rows, ["id"], ("id", "v"))))
    frames = changefeed_changes(lines_frame(spark, [path]), source="debezium", keys=["id"],
                                close=True, state=spark.createDataFrame(rows, "id long, v string"))

    def at(pos: int) -> int:
        return 1 << 32 | pos

    expected = Counter({
        ((("id", 1), ("v", "a")), at(20)): -1, ((("id", 1), ("v", "a2")), at(20)): 1,
        ((("id", 2), ("v", "b")), at(25)): -1, ((("id", 2), ("v", "b2")), at(25)): 1,
        ((("id", 2), ("v", "b2")), at(30)): -1,
        ((("id", 1), ("v", "a2")), at(40)): -1, ((("id", 3), ("v", "c")), at(40)): -1,
        ((("id", 4), ("v", "d")), at(50)): 1})
    assert python_updates(messages) == expected
    assert spark_updates(frames.changes) == expected


def _bad_pg_feed(tmp_path: Path) -> tuple[list[Path], list[int]]:
    """A generated feed with bad lines of three kinds put in: one the parser refuses, one whose
    key cannot be told, and one whose columns drift (found only by the converter, in a
    worker)."""
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    path = paths[0]
    lines = path.read_bytes().splitlines()
    event = orjson.loads(lines[3])
    payload = event.get("payload", event)
    keyless = {**payload, "after": {k: v for k, v in payload["after"].items() if k != "id"}}
    drift = {**payload, "after": {**payload["after"], "extra": 1}}
    bad = {5: b"{not json", 8: orjson.dumps(keyless), 11: orjson.dumps(drift)}
    for index in sorted(bad):
        lines.insert(index - 1, bad[index])
    path.write_bytes(b"\n".join(lines) + b"\n")
    return paths, sorted(bad)


def test_bad_lines_strict_and_lenient_agree_with_the_encoder(spark: Any, tmp_path: Path) -> None:
    paths, bad = _bad_pg_feed(tmp_path)
    lines = lines_frame(spark, paths)
    with pytest.raises(ChangefeedError) as python_error:
        list(encode_changefeed(paths, source="debezium", keys=["id"], table_schema=PG_TABLE,
                               close=True, lenient=False))
    with pytest.raises(ChangefeedError, match=r"\(and 1 more bad line found\)") as spark_error:
        changefeed_changes(lines, source="debezium", keys=["id"], table_schema=PG_TABLE,
                           close=True)
    assert spark_error.value.location == python_error.value.location
    assert str(spark_error.value).startswith(f"{paths[0]}, line {bad[0]}: not valid JSON")

    aside: list[SetAside] = []
    messages = list(encode_changefeed(paths, source="debezium", keys=["id"],
                                      table_schema=PG_TABLE, close=True, lenient=True,
                                      set_aside=aside.append))
    frames = changefeed_changes(lines, source="debezium", keys=["id"], table_schema=PG_TABLE,
                                close=True, strict=False)
    rejected = sorted((r["file"], r["line"], r["reason"]) for r in frames.rejected.collect())
    assert rejected == sorted((a.location.file, a.location.line, a.reason) for a in aside)
    assert [line for _, line, _ in rejected] == bad
    # Nothing accepted is lost: every other line converts as the sequential encoder has it.
    assert spark_updates(frames.changes) == python_updates(messages)
    assert spark_updates(frames.changes)


def test_worker_side_failures_name_their_line(spark: Any, tmp_path: Path) -> None:
    """Failures only a worker can find (a value that does not fit its column's type, a
    truncate without keys) come back as errors naming the line, not as a PythonException."""
    path = tmp_path / "my.jsonl"
    path.write_bytes(b"\n".join([_mysql("c", 10, after={"id": 1, "v": "a"}),
                                 _mysql("c", 20, after={"id": "two", "v": "b"}),
                                 _mysql("t", 30)]) + b"\n")
    lines = lines_frame(spark, [path])
    with pytest.raises(ChangefeedError, match=r"line 2: column id of the after image is 'two', "
                                              r"not a bigint .*\(and 1 more bad line found\)"):
        changefeed_changes(lines, source="debezium", close=True)
    frames = changefeed_changes(lines, source="debezium", close=True, strict=False)
    assert [(r["line"], r["reason"][:24]) for r in frames.rejected.orderBy("line").collect()] \
        == [(2, "column id of the after i"), (3, "a truncate needs key col")]
    assert spark_updates(frames.changes) == Counter({((("id", 1), ("v", "a")), 1 << 32 | 10): 1})
    keyed = changefeed_changes(lines, source="debezium", keys=["id"], close=True, strict=False,
                               state=spark.createDataFrame([(9, "z")], "id long, v string"))
    assert [r["line"] for r in keyed.rejected.collect()] == [2]
    assert spark_updates(keyed.changes) == Counter({((("id", 1), ("v", "a")), 1 << 32 | 10): 1,
                                            ((("id", 1), ("v", "a")), 1 << 32 | 30): -1,
                                            ((("id", 9), ("v", "z")), 1 << 32 | 30): -1})


def test_since_skips_what_the_state_already_holds(spark: Any, tmp_path: Path) -> None:
    """A batch re-delivered from before the table's frontier (a connector restart, a re-run)
    over the state at that frontier converts to exactly the rest of the full history."""
    paths, times, _ = write_pg(PG_CASES[1], tmp_path)
    full = python_updates(encode_changefeed(paths, source="debezium", keys=["id"],
                                            table_schema=PG_TABLE, close=True, lenient=False))
    cut = times[2]
    held: Counter[Any] = Counter()
    for (data, time), diff in full.items():
        if time < cut:
            held[data] += diff
    rows = [dict(data) for data, count in held.items() if count > 0]
    assert len(rows) == sum(held.values()) > 0
    frames = changefeed_changes(lines_frame(spark, paths), source="debezium", keys=["id"],
                                table_schema=PG_TABLE, close=True, since=cut,
                                state=spark.createDataFrame(rows, PG_DDL))
    rest = Counter({(data, time): diff for (data, time), diff in full.items() if time >= cut})
    assert rest and spark_updates(frames.changes) == rest


def test_column_types_hold_every_value_of_the_batch(spark: Any, tmp_path: Path) -> None:
    """A column null in the first several hundred rows is not a string, and a column of ints
    and floats is a double: the types come from every value, not from the first rows."""
    path = tmp_path / "types.jsonl"
    events = [_mysql("c", 10 + i, after={"id": i, "n": None, "x": 1}) for i in range(600)]
    events.append(_mysql("c", 700, after={"id": 600, "n": 2**63 + 5, "x": 1.5}))
    events.append(_mysql("c", 701, after={"id": 601, "n": 7, "x": 2}))
    path.write_bytes(b"\n".join(events) + b"\n")
    frames = changefeed_changes(lines_frame(spark, [path]), source="debezium", keys=["id"],
                                close=True, strict=True)
    assert frames.changes.schema["data"].dataType.simpleString() \
        == "struct<id:bigint,n:decimal(20,0),x:double>"
    got = {row["data"]["id"]: row["data"] for row in frames.changes.where("data.id >= 599")
           .collect()}
    assert (got[600]["n"], got[600]["x"], got[601]["n"], got[599]["x"]) \
        == (Decimal(2**63 + 5), 1.5, Decimal(7), 1.0)
