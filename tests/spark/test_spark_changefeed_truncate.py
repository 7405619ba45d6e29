"""Debezium truncates on the Spark path: the same updates and frontier as `encode_changefeed`,
keyed (each truncate a delete of every key at its place, `KeyedConversion.java`) and without
keys (each update compensated at the next truncate, `unkeyed._compensated`), and never on the
Python path."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.convert import encode_changefeed
from changelake.spark.changefeed import debezium_path
from changelake.spark.changefeed.pipeline import convert_frames
from tests.convert.test_convert_history import (
    PG_TABLE,
    PgHistory,
    _json_row,
    pg_histories,
    write_full_images,
    write_pg,
)
from tests.spark.test_spark_changefeed_debezium import check
from tests.support.changefeed_cases import python_updates, spark_updates

pytestmark = pytest.mark.spark

#: Histories with truncates: several (one between two of a key's events), one first of all
#: (an empty snapshot), and with a connector restart that re-sends a truncate.
TRUNCATE_CASES = [
    PgHistory({1: ("ann", 150, "n1"), 2: ("bob", -3, "n2")},
              [[("update", 1, ("cy", 7, "n1"), True), ("insert", 101, ("dee", 0, "x"))],
               [("truncate",), ("insert", 102, ("bob", 4, "n2"))],
               [("update", 102, ("ann", 9, "n3"), True), ("truncate",)],
               [("insert", 103, ("cy", 1, "n4")), ("insert", 104, ("dee", 2, "n5"))],
               [("truncate",), ("truncate",)]],
              (0.9, 0.2), metadata, False, [0, 1, 2, 3] * 16)
    for metadata in (False, True)
] + [
    PgHistory({}, [[("truncate",), ("insert", 101, ("ann", 1, "n1"))],
                   [("update", 101, ("bob", 2, "n1"), True)],
                   [("truncate",)], [("insert", 102, ("cy", 3, "n2"))]],
              (1.0, 0.0), False, False, [0, 1, 2, 3] * 16),
]


@pytest.mark.parametrize("history", TRUNCATE_CASES)
@pytest.mark.parametrize("close", [False, True])
def test_keyed_truncates_match_the_encoder(spark: Any, tmp_path: Path, history: PgHistory,
                                           close: bool) -> None:
    paths, _, _ = write_pg(history, tmp_path)
    assert b'"op":"t"' in b"".join(p.read_bytes() for p in paths)
    updates = check(spark, paths, tmp_path, PG_TABLE, close)  # asserts the Spark path
    assert any(diff < 0 for diff in updates.values())


def test_a_truncate_retracts_rows_only_the_state_holds(spark: Any, tmp_path: Path) -> None:
    """Keys of the state that the batch has no event of, and keys it has events of before
    and after the truncate: retracted at the truncate's time, by the Spark path."""
    history = PgHistory({}, [[("insert", 101, ("ann", 1, "n1"))],
                             [("update", 7, ("cy", 5, "n7"), True), ("truncate",),
                              ("insert", 102, ("bob", 2, "n2"))]],
                        (1.0, 1.0), False, False, [0, 1, 2, 3] * 16)
    paths, _, _ = write_pg(history, tmp_path)
    rows = [{"id": 7, "name": "old", "amount": "1.00", "note": "n7"},
            {"id": 8, "name": "other", "amount": "2.00", "note": "n8"}]
    updates = check(spark, paths, tmp_path, PG_TABLE, True, rows)
    retracted = {dict(data)["id"] for (data, _), diff in updates.items() if diff < 0}
    assert retracted == {7, 8, 101}


@pytest.mark.slow
@settings(max_examples=4, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=pg_histories(truncates=True), close=st.booleans())
def test_generated_histories_with_truncates_match_the_encoder(
        spark: Any, tmp_path_factory: Any, history: PgHistory, close: bool) -> None:
    # The first line with its schema: a feed none of whose changes has one (and a table
    # schema with a Connect decimal) goes to the Python path, truncates or not.
    history = replace(history, shapes=[0, *history.shapes[1:]])
    directory = tmp_path_factory.mktemp("pg")
    paths, _, _ = write_pg(history, directory)
    check(spark, paths, directory, PG_TABLE, close)


# ---------------------------------------------------------------------------- without keys




@pytest.mark.parametrize("history", TRUNCATE_CASES)
@pytest.mark.parametrize("close", [False, True])
def test_truncates_without_keys_match_the_encoder(spark: Any, tmp_path: Path,
                                                  history: PgHistory, close: bool) -> None:
    path = write_full_images(history, tmp_path / "items.jsonl", one_event=True)[0]
    updates = check(spark, [path], tmp_path, None, close, keys=[])
    assert any(diff < 0 for diff in updates.values())
    if close:  # and the rows left are the history's
        final: Counter[Any] = Counter()
        for (data, _), diff in updates.items():
            final[data] += diff
        state = dict(history.snapshot)
        for ops in history.transactions:
            for op in ops:
                if op[0] == "truncate":
                    state.clear()
                elif op[0] in ("insert", "update"):
                    state[op[1]] = op[2]
                elif op[0] == "delete":
                    del state[op[1]]
                else:
                    state[op[2]] = state.pop(op[1])
        assert +final == Counter(_plain_row(k, v) for k, v in state.items())


def _plain_row(key: int, values: tuple[str, int, str]) -> tuple[tuple[str, Any], ...]:
    """A row as `spark_updates` gives it, read without a table schema (the amount as its
    base64 text)."""
    return tuple(_json_row(key, values).items())


@pytest.mark.slow
@settings(max_examples=4, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=pg_histories(truncates=True), close=st.booleans())
def test_generated_truncates_without_keys_match_the_encoder(
        spark: Any, tmp_path_factory: Any, history: PgHistory, close: bool) -> None:
    directory = tmp_path_factory.mktemp("full")
    path = write_full_images(history, directory / "items.jsonl", one_event=True)[0]
    check(spark, [path], directory, None, close, keys=[])


# ---------------------------------------------------------------------------- the bound


def test_more_truncates_than_the_bound_go_to_the_python_path(spark: Any, tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    monkeypatch.setattr(debezium_path, "MAX_TRUNCATES", 1)
    paths, _, _ = write_pg(TRUNCATE_CASES[0], tmp_path)
    table = tmp_path / "table.json"
    table.write_bytes(orjson.dumps(PG_TABLE))
    got = convert_frames(spark, paths, "debezium", ["id"], table, close=True)
    assert got.path == "python-udf"
    assert "more than 1 truncates" in (got.reason or "")
    expected = python_updates(encode_changefeed(paths, source="debezium", keys=["id"],
                                                table_schema=PG_TABLE, close=True,
                                                lenient=False))
    assert spark_updates(got.changes) == expected


def test_only_truncates_with_a_state_retract_its_rows(spark: Any, tmp_path: Path) -> None:
    """A batch of one truncate (no image to read the columns from): the state's columns."""
    line = {"op": "t", "source": {"connector": "postgresql", "lsn": 500, "txId": 9,
                                  "sequence": '["400","500"]', "snapshot": "false"}}
    path = tmp_path / "t.jsonl"
    path.write_bytes(orjson.dumps(line) + b"\n")
    rows = [{"id": 7, "name": "a", "amount": "1.00", "note": "n"}]
    state = spark.createDataFrame(rows, "id bigint, name string, amount string, note string")
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True, state=state)
    assert got.path == "jvm", got.reason
    assert spark_updates(got.changes) == Counter(
        {((("id", 7), ("name", "a"), ("amount", "1.00"), ("note", "n")), 400): -1})


# ---------------------------------------------------------------------------- the lake


def _split(path: Path, at: int) -> tuple[Path, Path]:
    """The feed's first `at` lines, and the whole feed (delivered again from the start)."""
    lines = path.read_bytes().splitlines()
    first = path.with_name("first.jsonl")
    first.write_bytes(b"\n".join(lines[:at]) + b"\n")
    return first, path


LAKE_HISTORY = PgHistory({1: ("ann", 150, "n1"), 2: ("bob", -3, "n2")},
                         [[("insert", 101, ("dee", 0, "x"))],
                          [("update", 1, ("cy", 7, "n1"), False)],
                          [("truncate",), ("insert", 102, ("bob", 4, "n2"))],
                          [("update", 102, ("ann", 9, "n3"), False), ("truncate",)],
                          [("insert", 103, ("cy", 1, "n4"))]],
                         (1.0, 0.5), False, False, [0, 1, 2, 3] * 16)


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_lake_ingest_across_a_truncate_equals_the_encoder_as_of_each_time(
        spark: Any, tmp_path: Path, caplog: Any, keyed: bool) -> None:
    """Rows; then a truncate and more rows (and the feed's replayed truncate) in a second
    ingest, over the first's table (its rows the conversion's state); then closed. The
    table's updates, its current rows and its rows as of each time are the encoder's (and,
    keyed, the history's), and no batch went to the Python path. Without keys the feed has
    complete before images (MySQL's FULL row images)."""
    import logging
    import uuid

    from changelake.lake import Lake, ingest

    key = ["id"] if keyed else []
    if keyed:
        paths, times, states = write_pg(LAKE_HISTORY, tmp_path)
        table: Path | None = tmp_path / "table.json"
        table.write_bytes(orjson.dumps(PG_TABLE))
        schema: dict[str, Any] | None = PG_TABLE
    else:
        paths = [write_full_images(LAKE_HISTORY, tmp_path / "items.jsonl", one_event=True)[0]]
        table = schema = None
    first, whole = _split(paths[0], 4)
    lake = Lake(spark, tmp_path / "lake")
    name = f"trunc_{uuid.uuid4().hex[:8]}.t"
    caplog.set_level(logging.INFO, logger="changelake.spark.changefeed.pipeline")
    one = ingest.ingest(lake, name, [first], key=key, source="debezium", schema=table)
    two = ingest.ingest(lake, name, [whole], key=key, source="debezium", schema=table)
    assert one.frontier[0] < two.frontier[0]
    ingest.ingest(lake, name, [whole], key=key, source="debezium", schema=table, close=True)
    assert "Python path" not in caplog.text
    columns = ["id", "name", "amount", "note"]
    handle = lake.table(name)
    got: Counter[Any] = Counter()
    for row in handle.updates().collect():
        got[(tuple((c, str(row[c])) for c in columns), row["_time"])] += row["_diff"]
    encoded = python_updates(encode_changefeed([whole], source="debezium", keys=key or None,
                                               table_schema=schema, close=True,
                                               lenient=False))
    expected = Counter({(tuple((k, str(v)) for k, v in data), time): diff
                        for (data, time), diff in encoded.items()})
    assert +got == +expected
    assert any(diff < 0 for diff in expected.values())

    def rows(frame: Any) -> Counter[Any]:
        return Counter(tuple(str(r[c]) for c in columns) for r in frame.collect())

    def encoded_at(time: int) -> Counter[Any]:
        out: Counter[Any] = Counter()
        for (data, t), diff in expected.items():
            if t <= time:
                out[tuple(v for _, v in data)] += diff
        return +out

    for time in sorted({t for _, t in expected}):
        assert rows(handle.as_of(time)) == encoded_at(time), time
    assert rows(handle.current()) == encoded_at(2**62)
    if keyed:  # and the history's own states
        for time, state in zip(times, states, strict=True):
            assert encoded_at(time) == Counter({
                tuple(str(dict(row)[c]) for c in columns): n for row, n in state.items()})
        assert not states[-2]  # the fourth transaction ends with a truncate
