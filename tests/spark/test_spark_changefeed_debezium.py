"""The JVM changefeed path agrees with `encode_changefeed` on generated Debezium histories."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.convert import MemoryState, encode_changefeed
from changelake.errors import ChangefeedError
from changelake.formats.lines import MAX_LINE_BYTES
from changelake.protocol import collect
from changelake.spark.changefeed import times
from changelake.spark.changefeed.keyed import TIED
from changelake.spark.changefeed.pipeline import convert_frames
from tests.convert.test_convert_history import (
    PG_COLUMNS,
    PG_TABLE,
    PgHistory,
    _json_row,
    pg_histories,
    write_pg,
)
from tests.support.changefeed_cases import (
    FLOAT_KEYS_FINAL,
    PG_CASES,
    final_rows,
    python_updates,
    spark_updates,
    write_float_keys,
)
from tests.support.paths import SAMPLES

pytestmark = pytest.mark.spark


def _slow(*values: Any) -> list[Any]:
    """More cases of an edge the default run already covers with one or two: the slow tier
    runs them (each is a Spark conversion, and the Python path's, of a feed of its own)."""
    return [pytest.param(v, marks=pytest.mark.slow) for v in values]


def check(spark: Any, paths: list[Path], tmp_path: Path, table: dict[str, Any] | None,
          close: bool, rows: list[dict[str, Any]] | None = None,
          keys: list[str] | None = None) -> Counter[Any]:
    """The Spark path and the encoder on the same files (and the same initial rows): the same
    updates and frontier. Returns the updates. `keys`: ["id"] unless given ([] for none)."""
    keys = ["id"] if keys is None else keys
    schema_file = None
    if table is not None:
        schema_file = tmp_path / "table.json"
        schema_file.write_text(json.dumps(table))
    state = None
    if rows is not None:
        state = spark.createDataFrame(rows, "id bigint, name string, amount string, note string")
    got = convert_frames(spark, paths, "debezium", keys, schema_file, close=close,
                         state=state)
    assert got.path == "jvm", got.reason
    memory = MemoryState.from_rows(rows, ["id"], PG_COLUMNS) if rows is not None else None
    messages = list(encode_changefeed(paths, source="debezium", keys=keys or None,
                                      table_schema=table,
                                      close=close, lenient=False, state=memory))
    expected = collect(messages)
    assert got.frontier == (None if close else expected.frontier.elements[0])
    updates = spark_updates(got.changes)
    assert updates == python_updates(messages)
    return updates


@pytest.mark.parametrize("history", PG_CASES)
@pytest.mark.parametrize("close", [False, True])
def test_pg_history_matches_the_encoder(spark: Any, tmp_path: Path, history: PgHistory,
                                        close: bool) -> None:
    paths, _, _ = write_pg(history, tmp_path)
    check(spark, paths, tmp_path, PG_TABLE, close)


@pytest.mark.parametrize("history", [PG_CASES[0], *_slow(*PG_CASES[1:])])
def test_pg_history_matches_the_encoder_with_from_json_reading_every_image(
        spark: Any, tmp_path: Path, history: PgHistory, monkeypatch: Any) -> None:
    """The images as a session without the project's jar reads them (`from_json`, and the
    refusal checks on every value): the Java image reader is what the other tests run."""
    from changelake.spark.changefeed import keyed

    monkeypatch.setattr(keyed, "java_image_reader", lambda *_: None)
    paths, _, _ = write_pg(history, tmp_path)
    check(spark, paths, tmp_path, PG_TABLE, True)


@pytest.mark.slow
@settings(max_examples=3, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=pg_histories(), close=st.booleans())
def test_generated_pg_histories_match_the_encoder(spark: Any, tmp_path_factory: Any,
                                                  history: PgHistory, close: bool) -> None:
    """Snapshot rows, replays after a restart, tombstones, key changes, TOAST, metadata."""
    directory = tmp_path_factory.mktemp("pg")
    paths, _, _ = write_pg(history, directory)
    check(spark, paths, directory, PG_TABLE, close)


def test_snapshot_rows_timed_in_chunks_and_by_a_shuffle_join(spark: Any, tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    """A block cut into chunks of two rows (`CHUNK_BITS`), and, as above `BROADCAST_UNTIMED`
    snapshot rows, their times joined to the changes by a shuffle: the same updates."""
    monkeypatch.setattr(times, "CHUNK_BITS", 1)
    monkeypatch.setattr(times, "BROADCAST_UNTIMED", 0)
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    assert b'"op":"r"' in paths[0].read_bytes()
    check(spark, paths, tmp_path, PG_TABLE, False)


def test_state_stands_in_for_the_snapshot(spark: Any, tmp_path: Path) -> None:
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    rows = [{"id": 1, "name": "ann", "amount": "1.50", "note": "n1"},
            {"id": 2, "name": "bob", "amount": "-0.03", "note": "n2"}]
    for path in paths:
        kept = [line for line in path.read_bytes().splitlines() if b'"op":"r"' not in line]
        path.write_bytes(b"\n".join(kept) + b"\n")
    updates = check(spark, paths, tmp_path, PG_TABLE, False, rows)
    assert any(diff < 0 for diff in updates.values())  # rows only the state held, retracted


@pytest.mark.parametrize("keys", [["id"], []], ids=["keyed", "unkeyed"])
def test_mysql_full_images_with_gtids_and_a_moved_key(spark: Any, tmp_path: Path,
                                                      keys: list[str]) -> None:
    """MySQL positions and GTID times, an update that moves its key (two events at one
    position), a replayed tail, and the column order of the first image; with keys, and
    without (complete images, `unkeyed.py`)."""
    source = {"connector": "mysql", "db": "inv", "table": "items", "server_id": 1}
    rows = {1: ("ann", 150, "a"), 2: ("bob", 7, "b")}
    lines = [orjson.dumps({"op": "r", "after": _json_row(k, v), "source": {
        **source, "snapshot": "true", "file": "bin.000001", "pos": 4, "row": 0}})
        for k, v in rows.items()]
    events = [("c", None, (3, ("cy", 1, "c"))), ("u", (1, rows[1]), (1, ("ann", 9, "a"))),
              ("u", (2, rows[2]), (12, ("bob", 7, "b"))), ("d", (3, ("cy", 1, "c")), None)]
    for n, (op, before, after) in enumerate(events):
        src = {**source, "snapshot": "false", "file": "bin.000002", "pos": 100 + 10 * (n // 2),
               "row": n % 2, "gtid": f"g:{n // 2}"}
        lines.append(orjson.dumps({
            "op": op, "before": _json_row(*before) if before else None,
            "after": _json_row(*after) if after else None, "source": src}))
    path = tmp_path / "my.jsonl"
    path.write_bytes(b"\n".join(lines + lines[-3:]) + b"\n")
    updates = check(spark, [path], tmp_path, None, True, keys=keys)
    assert [k for k, _ in next(iter(updates))[0]] == ["id", "name", "amount", "note"]
    assert sum(1 for diff in updates.values() if diff < 0) >= 2  # updates retract


def test_a_file_named_twice_is_read_twice(spark: Any, tmp_path: Path) -> None:
    from changelake.spark.changefeed.read import read_lines

    path = tmp_path / "f.jsonl"
    path.write_bytes(b"a\n\n  \nb\n")
    lines = read_lines(spark, [str(path), str(path)])
    assert sorted((r["file_index"], r["line"], r["value"]) for r in lines.numbered().collect()) \
        == [(0, 1, "a"), (0, 4, "b"), (1, 1, "a"), (1, 4, "b")]


def test_a_bad_line_goes_to_the_python_path_with_its_error(spark: Any, tmp_path: Path) -> None:
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    with open(paths[0], "ab") as fh:
        fh.write(b'{"op": "u", "after": {"id": "x"}, "source": {"lsn": -1}}\n')
    with pytest.raises(ChangefeedError, match=r"items.jsonl, line \d+: source.lsn must be"):
        convert_frames(spark, paths, "debezium", ["id"], None)


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"caf\xc3", b" " * MAX_LINE_BYTES,
                                 b'{"x": "' + b"y" * MAX_LINE_BYTES + b'"}'],
                         ids=["utf8", "utf8-cut", "long-blank", "long"])
def test_a_line_out_of_bounds_is_named_as_the_encoder_names_it(spark: Any, tmp_path: Path,
                                                               bad: bytes) -> None:
    """The Debezium path checks the line bounds in its own aggregate (no pass of its own over
    the text): a batch with a line over the bound or not UTF-8 is refused with the encoder's
    message, blank over-long lines included."""
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    with open(paths[0], "ab") as fh:
        fh.write(bad + b"\n")
    with pytest.raises(ChangefeedError) as encoder:
        list(encode_changefeed(paths, source="debezium", keys=["id"], table_schema=None,
                               close=True, lenient=False))
    with pytest.raises(ChangefeedError) as spark_error:
        convert_frames(spark, paths, "debezium", ["id"], None, close=True)
    if len(bad) < MAX_LINE_BYTES:  # not UTF-8: the encoder leaves the words to orjson
        assert str(spark_error.value).startswith(str(encoder.value).split(": ")[0])
        assert "not UTF-8 text" in str(spark_error.value)
    else:
        assert str(spark_error.value) == str(encoder.value)


def test_without_keys_a_missing_before_image_is_the_encoders_error(spark: Any,
                                                                   tmp_path: Path) -> None:
    """PostgreSQL's default replica identity sends updates without before-images: without
    keys the Spark path hands the batch over, and the error names the encoder's line."""
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    with pytest.raises(ChangefeedError) as encoder:
        list(encode_changefeed(paths, source="debezium", keys=None, table_schema=None,
                               close=True, lenient=False))
    with pytest.raises(ChangefeedError) as spark_error:
        convert_frames(spark, paths, "debezium", [], None, close=True)
    # The Spark path looks at the whole batch, so it adds how many more lines are bad.
    assert str(spark_error.value).startswith(str(encoder.value))
    assert "without a before-image" in str(encoder.value)


@pytest.mark.parametrize("keys", [["id"], ["ORDER_ID"], ["order_id", "nope"]])
def test_a_key_no_image_has_is_the_encoders_error(spark: Any, keys: list[str]) -> None:
    """`--key` naming a column the images do not have (a typo, the wrong table): the Spark path
    hands the batch over, and the error names the encoder's line and rule, not Spark's
    missing struct field. A column of the same name in another case is not the key either
    (the encoder's names are exact; Spark's struct fields are found in any case)."""
    paths = [SAMPLES / "derived-rw-debezium-postgres-values.jsonl"]
    with pytest.raises(ChangefeedError) as encoder:
        list(encode_changefeed(paths, source="debezium", keys=keys, table_schema=None,
                               close=True, lenient=False))
    with pytest.raises(ChangefeedError) as spark_error:
        convert_frames(spark, paths, "debezium", keys, None, close=True)
    # The Python path looks at the whole batch, so it adds how many more lines are bad.
    assert str(spark_error.value).startswith(str(encoder.value))
    assert f"line 1: cannot tell the key {keys}" in str(encoder.value)


def _feed_of(tmp_path: Path, images: list[tuple[str, dict[str, Any]]]) -> Path:
    """A PostgreSQL feed of one change per transaction: `(op, after image)` each."""
    source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg", "db": "db",
              "schema": "public", "table": "t", "xmin": None, "snapshot": "false"}
    lines = [orjson.dumps({"before": None, "after": after, "op": op,
                           "source": {**source, "lsn": 100 * n, "txId": n,
                                      "sequence": f'[null,"{100 * n}"]'}})
             for n, (op, after) in enumerate(images, 1)]
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_columns_that_differ_only_in_case_are_the_encoders_rows(spark: Any,
                                                                tmp_path: Path) -> None:
    """Images with `id` and `ID`: two columns to the encoder, one ambiguous field to Spark's
    resolver. The Spark path hands the batch over (it was an internal error), and the Python path
    gives the encoder's updates; a lake table refuses such columns with its own error."""
    path = _feed_of(tmp_path, [("c", {"id": 1, "ID": 10, "name": "a"}),
                               ("c", {"id": 2, "ID": 20, "name": "b"}),
                               ("u", {"id": 1, "ID": 11, "name": "c"})])
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert got.path != "jvm" and "differ only in case" in str(got.reason)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)


@pytest.mark.parametrize("name", ["a`b", "a.b", "my col", "имя", "`"])
def test_a_column_name_spark_must_quote_is_converted_on_the_jvm(spark: Any, tmp_path: Path,
                                                                name: str) -> None:
    """A column name is quoted wherever it reaches a type's text (`expressions.quote`): a
    backtick in it was a syntax error in the images' struct (an internal error)."""
    path = _feed_of(tmp_path, [("c", {"id": 1, name: "x"}), ("c", {"id": 2, name: "y"}),
                               ("u", {"id": 1, name: "z"})])
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert got.path == "jvm", got.reason
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)


def _with_source_fields(path: Path, fields: dict[str, Any]) -> None:
    """Rewrite a feed file with `fields` added to every line's source block."""
    out = []
    for line in path.read_bytes().splitlines():
        event = orjson.loads(line) if line.strip() not in (b"", b"null") else None
        body = event.get("payload", event) if isinstance(event, dict) else None
        if isinstance(body, dict) and isinstance(body.get("source"), dict):
            body["source"].update(fields)
            line = orjson.dumps(event)
        out.append(line)
    path.write_bytes(b"\n".join(out) + b"\n")


def test_null_fields_of_another_connector_change_nothing(spark: Any, tmp_path: Path) -> None:
    """A PostgreSQL source that also holds MySQL's `file` and `pos`, null: PostgreSQL by its
    values, as the Python parser decides by presence, on the Spark path."""
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    _with_source_fields(paths[0], {"file": None, "pos": None, "row": None})
    check(spark, paths, tmp_path, PG_TABLE, True)


def test_a_null_postgresql_field_is_postgresql_beside_mysql_positions(spark: Any,
                                                                      tmp_path: Path) -> None:
    """`"lsn": null` makes a source PostgreSQL to the Python parser even with MySQL's `file`
    and `pos`: a change without a PostgreSQL position, which the Java line reader leaves, to
    the Python path (it would be a MySQL position if null fields were taken as absent)."""
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    _with_source_fields(paths[0], {"lsn": None, "txId": None, "sequence": None,
                                   "file": "mysql-bin.000003", "pos": 154})
    table = tmp_path / "table.json"
    table.write_text(json.dumps(PG_TABLE))
    got = convert_frames(spark, paths, "debezium", ["id"], table, close=True)
    assert got.path == "python-udf"
    assert "the Java line reader leaves" in str(got.reason)  # as it does a change without one
    messages = list(encode_changefeed(paths, source="debezium", keys=["id"],
                                      table_schema=PG_TABLE, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)


def test_two_rows_for_one_key_at_one_position_go_to_the_python_path(spark: Any,
                                                                  tmp_path: Path) -> None:
    """A change re-sent with another row at its position: the Spark path cannot order the two
    as the Python converter does (by their text), so it hands the batch to the Python path,
    which gives the encoder's updates."""
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    lines = paths[0].read_bytes().splitlines()
    for line in reversed(lines):
        event = orjson.loads(line) if line.strip() not in (b"", b"null") else None
        body = event.get("payload", event) if isinstance(event, dict) else None
        if isinstance(body, dict) and body.get("op") in ("c", "u") and body.get("after"):
            body["after"]["name"] = "another row"
            break
    paths[0].write_bytes(b"\n".join([*lines, orjson.dumps(event)]) + b"\n")
    table = tmp_path / "table.json"
    table.write_text(json.dumps(PG_TABLE))
    got = convert_frames(spark, paths, "debezium", ["id"], table, close=True)
    assert (got.path, got.reason) == ("python-udf", TIED)
    messages = list(encode_changefeed(paths, source="debezium", keys=["id"],
                                      table_schema=PG_TABLE, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)


@pytest.mark.parametrize("late", ["another row", "the same row"])
def test_a_write_at_a_position_its_key_has_passed_is_no_tie(spark: Any, tmp_path: Path,
                                                             late: str) -> None:
    """A snapshot row read again after a later change of its key (with its own row or
    another; it takes the time of the line before it, above the change's) is stale to the
    encoder whatever its row, so the Spark path converts the batch: only writes at the greatest
    position a key has reached must hold one row (`keyed.java_convert`'s tie check)."""
    name = "a" if late == "the same row" else "z"
    path = tmp_path / "late-snapshot.jsonl"
    path.write_bytes(b"\n".join([
        _change_line(100, 1, "a", "r", "true"), _change_line(100, 2, "b", "r", "true"),
        _change_line(200, 1, "c", "u"), _change_line(300, 3, "d"),
        _change_line(100, 1, name, "r", "last")]) + b"\n")
    updates = check(spark, [path], tmp_path, None, close=True)
    assert sorted(tuple(v for _, v in row) for row in final_rows(updates)) == [
        (1, "c"), (2, "b"), (3, "d")]


def test_keys_equal_in_python_are_one_key_in_spark(spark: Any, tmp_path: Path) -> None:
    """`1` and `1.0`, `0.0` and `-0.0` are one key to the Python converter: typed key columns
    (double here) group them as one in Spark too, so the update and the delete find their row."""
    path = write_float_keys(tmp_path / "floats.jsonl")
    updates = check(spark, [path], tmp_path, None, True)
    assert final_rows(updates) == FLOAT_KEYS_FINAL


def test_temporal_columns_convert_in_the_jvm(spark: Any, tmp_path: Path) -> None:
    """Dates, times and timestamps by their Connect schema: decoded to the encoder's ISO text
    on the Spark path (`temporal.py`), updates and a replay included."""
    fields = [{"field": "id", "type": "int32"},
              {"field": "day", "type": "int32", "name": "io.debezium.time.Date",
               "optional": True},
              {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp",
               "optional": True},
              {"field": "clock", "type": "int64", "name": "io.debezium.time.NanoTime",
               "optional": True}]
    schema = {"type": "struct", "fields": [
        {"field": image, "type": "struct", "optional": True, "fields": fields}
        for image in ("before", "after")]}
    rows = [(1, 19000, 1_700_000_000_123_456, 3_600_000_000_001),
            (2, -719162, -1, 0), (1, 2932896, 9223372036825200000, 86_399_999_999_999)]
    lines = [orjson.dumps({"schema": schema, "payload": {
        "op": "c" if n < 2 else "u", "before": None,
        "after": {"id": k, "day": d, "at": t, "clock": c},
        "source": {"connector": "postgresql", "lsn": 100 + n, "txId": 100 + n,
                   "snapshot": "false"}}}) for n, (k, d, t, c) in enumerate(rows)]
    path = tmp_path / "temporal.jsonl"
    path.write_bytes(b"\n".join([*lines, lines[-1]]) + b"\n")
    updates = check(spark, [path], tmp_path, None, True)
    assert (("id", 2), ("day", "0001-01-01"), ("at", "1969-12-31T23:59:59.999999"),
            ("clock", "00:00:00")) in final_rows(updates)


def test_a_decimal_written_as_a_json_number_is_not_read_as_base64(spark: Any,
                                                                  tmp_path: Path) -> None:
    """`decimal.format=NUMERIC` writes a Connect Decimal as a number, whose text base64 would
    misread (`1234` is valid base64): the batch goes to the Python path and agrees."""
    decimal = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "2"}, "optional": True, "field": "amount"}
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "optional": True,
                                            "fields": [{"field": "id", "type": "int32"},
                                                       decimal]}]}
    path = tmp_path / "numeric.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps({"schema": schema, "payload": {
        "op": "c", "before": None, "after": {"id": 1, "amount": value},
        "source": {"connector": "postgresql", "lsn": 100 + n, "txId": 100 + n,
                   "snapshot": "false"}}}) for n, value in enumerate([12.5, 1234, "AQ=="])))
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert got.path == "python-udf" and "JSON number" in (got.reason or "")
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)


def _other_table_in_every_transaction(paths: list[Path]) -> None:
    """Each END also counts one event of another table, which `data_collections` lists: this
    table's feed holds only its own events (a table's topic beside the transaction topic)."""
    (tx,) = [p for p in paths if p.name == "transactions.jsonl"]
    lines = []
    for line in tx.read_bytes().splitlines():
        event = orjson.loads(line)
        if event["status"] == "END":
            event["event_count"] += 1
            event["data_collections"].append({"data_collection": "public.other",
                                              "event_count": 1})
        lines.append(orjson.dumps(event))
    tx.write_bytes(b"\n".join(lines) + b"\n")


def test_end_counts_the_tables_own_events_on_both_paths(spark: Any, tmp_path: Path) -> None:
    from changelake.spark.changefeed.python_path import changefeed_changes
    from tests.spark.test_spark_changefeeds import lines_frame, python_workers

    python_workers.__wrapped__(spark)  # the Python path's Python workers: this interpreter
    history = PG_CASES[1]
    assert history.metadata
    paths, times, _ = write_pg(history, tmp_path)
    _other_table_in_every_transaction(paths)
    check(spark, paths, tmp_path, PG_TABLE, close=False)
    expected = collect(encode_changefeed(paths, source="debezium", keys=["id"],
                                         table_schema=PG_TABLE, close=False, lenient=False))
    assert expected.frontier.elements == (times[-1] + 1,)  # the last transaction is complete
    old = changefeed_changes(lines_frame(spark, paths), source="debezium", keys=["id"],
                             table_schema=PG_TABLE)
    assert old.frontier == times[-1] + 1


def test_the_python_path_on_request_converts_what_the_spark_path_does(spark: Any,
                                                                 tmp_path: Path) -> None:
    """`python_path` (the benchmark's comparison) really takes the Python path, and it agrees."""
    from tests.spark.test_spark_changefeeds import python_workers

    python_workers.__wrapped__(spark)  # the Python path's Python workers: this interpreter
    paths, _, _ = write_pg(PG_CASES[1], tmp_path)
    table = tmp_path / "table.json"
    table.write_text(json.dumps(PG_TABLE))
    jvm = convert_frames(spark, paths, "debezium", ["id"], table, close=False)
    old = convert_frames(spark, paths, "debezium", ["id"], table, close=False,
                         python_path=True)
    assert (jvm.path, old.path) == ("jvm", "python-udf")
    assert old.reason == "the Python path was asked for"
    assert old.frontier == jvm.frontier
    assert spark_updates(old.changes) == spark_updates(jvm.changes)


def test_spark_short_of_memory_is_said_not_hidden_by_the_python_path(spark: Any) -> None:
    """A value Spark refuses sends the batch to the Python path; Spark short of memory does not
    (the Python path would hold more of the batch at once): it is an error that says so."""
    from pyspark.sql import functions as F

    from changelake.errors import ChangelakeError
    from changelake.spark.changefeed.dispatch import Unsupported
    from changelake.spark.changefeed.steps import guard

    def failing(message: str) -> Any:
        return lambda: spark.range(1).select(F.raise_error(F.lit(message))).collect()

    with pytest.raises(Unsupported, match=r"^bad: a value Spark refuses"):
        guard(lambda: spark.range(1).select(F.lit("x").cast("int")).collect())
    with pytest.raises(Unsupported, match=r"^bad: a value Spark refuses"):
        guard(failing("not a number: 12x"))
    with pytest.raises(ChangelakeError, match=r"Spark ran short converting the changefeed "
                       r"\(.*java.lang.OutOfMemoryError: Java heap space.*spark.driver.memory"):
        guard(failing("java.lang.OutOfMemoryError: Java heap space"))
    with pytest.raises(ChangelakeError, match="No space left on device"):
        guard(failing("java.io.IOException: No space left on device"))


def test_the_facts_observed_are_the_aggregates_over_every_parsed_line(spark: Any,
                                                                      tmp_path: Path) -> None:
    """The facts come from an observation of the parse's checkpoint job, not from a pass of
    their own: they must be exactly what an aggregate over the parsed lines gives (no line
    missed or counted twice), and an observation of no lines must answer too. The checkpoint
    holds every parsed line, without the columns only the facts read."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.debezium_path import _FACTS_ONLY, _parsed
    from changelake.spark.changefeed.parse import java_items
    from changelake.spark.changefeed.read import read_lines
    from tests.support.debezium_items import aggregated_facts

    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    with open(paths[0], "ab") as fh:  # a tombstone, a blank line, a transaction boundary
        fh.write(b'null\n\n{"status": "BEGIN", "id": "7", "event_count": null}\n')
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n  \n")
    for files in ([str(p) for p in paths], [str(blank)]):
        lines = read_lines(spark, files)
        items, observed = _parsed(lines)
        parsed = java_items(lines.bounded, udf=True)
        aggregated = aggregated_facts(parsed)
        observed = dict(observed)
        shapes = observed.pop("shapes")  # Java read every line: the images' shapes too
        observed.pop("chunks")  # and the chunks' rows (`test_spark_changefeed_jvm.py`)
        assert all(s.startswith("[[") for s in shapes) and (shapes != []) == (files != [
            str(blank)])
        assert observed == aggregated
        assert not set(_FACTS_ONLY) & set(items.columns)
        kept = parsed.drop("_deferred", "shape", *_FACTS_ONLY)
        assert items.exceptAll(kept).count() == 0
        assert kept.exceptAll(items).count() == 0
        assert observed["flawed"] == 0
    assert observed["first"] is None and observed["untimed"] == 0
    assert items.count() == 0
    items, observed = _parsed(read_lines(spark, [str(p) for p in paths]))
    assert observed["metadata"] == 1 and observed["first"] is not None
    assert items.where(F.col("kind") == "change").count() > observed["untimed"] > 0


def test_a_large_batch_is_spread_over_more_key_partitions(spark: Any, tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    """The keyed events go into as many partitions as keep each near `EVENTS_PER_PARTITION`
    (else the windows' sorts grow with the batch), never fewer than the session's; spread
    thin, they still convert to the encoder's updates. Those come in fewer partitions, the
    files the lake's write makes of them (`files_for`: one per `EVENTS_PER_FILE` events, in
    whole waves of the session's default parallelism)."""
    from changelake.formats.tableschema import TableSchema
    from changelake.spark.changefeed import conversion, keyed
    from changelake.spark.changefeed.debezium_path import debezium_timed
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.settings import NOT_ADAPTIVE, settings

    cores = spark.sparkContext.defaultParallelism
    per_file = conversion.EVENTS_PER_FILE
    assert conversion.files_for(spark, 0, 8) == min(8, cores)
    assert conversion.files_for(spark, per_file * cores, 4 * cores) == cores
    # One event more than a wave of files holds: a whole second wave, not one file alone.
    assert conversion.files_for(spark, per_file * cores + 1, 4 * cores) == 2 * cores
    assert conversion.files_for(spark, per_file * 3 * cores, 4 * cores) == 3 * cores
    assert conversion.files_for(spark, per_file * 50 * cores, 8) == 8
    assert conversion.files_for(spark, per_file * 50, 1) == 1
    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    with settings(spark, {"spark.sql.shuffle.partitions": "3"}):
        assert keyed.partitions_for(spark, 0) == 3
        assert keyed.partitions_for(spark, keyed.EVENTS_PER_PARTITION * 3) == 3
        assert keyed.partitions_for(spark, keyed.EVENTS_PER_PARTITION * 3 + 1) == 4
        monkeypatch.setattr(keyed, "EVENTS_PER_PARTITION", 1)
        monkeypatch.setattr(conversion, "EVENTS_PER_FILE", 2)
        batch = debezium_timed(spark, read_lines(spark, [str(p) for p in paths]),
                               table_schema=TableSchema.from_json(PG_TABLE))
        assert batch.size >= batch.changes.count() and batch.size > 2 * cores
        events = keyed.typed_events(batch.changes, batch.columns, ["id"])
        with settings(spark, NOT_ADAPTIVE):
            shuffled = conversion._by_key(
                events, 1, conversion._partitions(spark, batch.size, None))
            assert shuffled.rdd.getNumPartitions() == batch.size
        converted, deferred = conversion.checked_conversion(events, batch.columns, ["id"],
                                                            None, batch.size)
        assert deferred is None  # settled: the updates are checkpointed
        files = -(-batch.size // (2 * cores)) * cores  # whole waves of two events a file
        assert converted.rdd.getNumPartitions() == files < batch.size
        check(spark, paths, tmp_path, PG_TABLE, close=False)


def _change_line(lsn: int, key: int, name: str, op: str = "c",
                 snapshot: str = "false") -> bytes:
    return orjson.dumps({"op": op, "before": None, "after": {"id": key, "name": name},
                         "source": {"connector": "postgresql", "lsn": lsn, "txId": lsn,
                                    "snapshot": snapshot}})


@pytest.mark.parametrize("bad", [
    _change_line(130, 3, "c") + b" x", _change_line(130, 3, "c") + b"}",
    _change_line(130, 3, "c") + _change_line(140, 4, "d"),
    _change_line(130, 3, "c") + b"\r" + _change_line(140, 4, "d"),
    _change_line(130, 3, "c") + b"," + _change_line(140, 4, "d"),
    _change_line(130, 3, "c").replace(b'"name"', b"'name'"),
    _change_line(130, 3, "c").replace(b'"c"}', b'NaN}'),
    _change_line(130, 3, "c").replace(b'"lsn":130', b'"lsn":130,"x":Infinity'),
    _change_line(130, 3, "c").replace(b'"op"', b"op")],
    ids=["garbage", "brace", "two-values", "lone-cr", "comma", "single-quotes", "nan",
         "infinity", "unquoted-name"])
def test_json_orjson_refuses_is_refused_at_its_line(spark: Any, tmp_path: Path,
                                                    bad: bytes) -> None:
    """Spark's JSON functions read leniently by default (single quotes, NaN, and nothing
    after the line's first value is looked at): the Spark path must refuse what the encoder
    refuses, with the encoder's message naming the line, not convert it."""
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join([_change_line(110, 1, "a"), _change_line(120, 2, "b"), bad,
                                 _change_line(150, 5, "e")]) + b"\n")
    _both_refuse(spark, path, "feed.jsonl, line 3: ")


def _sequence_feed(path: Path, sequence: str) -> Path:
    """Three inserts at increasing times; the second's `source.sequence` is `sequence`, a text
    that reads as `[5, 130]` where it reads at all."""
    def line(seq: str, lsn: int, key: int) -> bytes:
        return orjson.dumps({"op": "c", "before": None, "after": {"id": key, "name": "n"},
                             "source": {"connector": "postgresql", "lsn": lsn, "txId": lsn,
                                        "snapshot": "false", "sequence": seq}})
    path.write_bytes(b"\n".join([line('["0","110"]', 110, 1), line(sequence, 130, 2),
                                 line('["130","140"]', 140, 3)]) + b"\n")
    return path


@pytest.mark.parametrize("sequence", ['["-5","130"]', '[5.5,130]', *_slow(
    '[" 5","130"]', '["+5","130"]', '["5","130","7"]', '["","130"]')])
def test_a_sequence_the_encoder_refuses_is_refused_at_its_line(spark: Any, tmp_path: Path,
                                                               sequence: str) -> None:
    """A cast reads `"-5"`, `" 5"` and `"+5"` as numbers; the encoder reads an LSN as
    digits only. The Spark path converted such a line (at time -5, for the first)."""
    _both_refuse(spark, _sequence_feed(tmp_path / "feed.jsonl", sequence),
                 "feed.jsonl, line 2: ")


@pytest.mark.parametrize("sequence", ['[5,130]', '["\\u0035","130"]', '[null,null]',
                                      *_slow('[ "5" , "130" ]', '["005","130"]')])
def test_a_sequence_in_another_shape_converts_as_the_encoder_reads_it(
        spark: Any, tmp_path: Path, sequence: str) -> None:
    """Numbers, whitespace and escapes are JSON the encoder reads: the batch converts to its
    updates, on whichever path reads that shape."""
    path = _sequence_feed(tmp_path / "feed.jsonl", sequence)
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=False)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=False, lenient=False))
    expected = python_updates(messages)
    assert spark_updates(got.changes) == expected
    assert len(expected) == (1 if sequence == "[null,null]" else 2)  # time 130 is open
    assert got.frontier == collect(iter(messages)).frontier.elements[0]


@pytest.mark.parametrize("second", [
    b'"step":null', b'"\\u0073tep":null', b'"st\\u0065p":"1"', b'"\\u006csn":130',
    b'"first_step":null'], ids=["null-step", "escaped-step", "escaped-step-value",
                                "escaped-lsn", "name-ending-in-step"])
def test_source_keys_only_an_exact_reading_finds_agree_with_the_encoder(
        spark: Any, tmp_path: Path, second: bytes) -> None:
    """A source key whose presence decides a rule (`step`: YDB's Debezium JSON) while its
    value is null, or spelled with escapes: the parse scans the line for such names
    (`parse._source_keys`) and reads the source's keys exactly there. Either both paths
    refuse the line with the same words, or they convert it to the same updates."""
    path = _sequence_feed(tmp_path / "feed.jsonl", '["120","130"]')
    lines = path.read_bytes().splitlines()
    assert b'"snapshot":"false",' in lines[1]
    lines[1] = lines[1].replace(b'"snapshot":"false",', b'"snapshot":"false",' + second + b",")
    if second == b'"\\u006csn":130':  # the key spelled with an escape is the only lsn
        lines[1] = lines[1].replace(b'"lsn":130,', b"")
    path.write_bytes(b"\n".join(lines) + b"\n")
    updates = _both_agree(spark, path)
    assert updates is None or len(updates) == 3


@pytest.mark.parametrize("value", [b"1", b'{"a":1}', b"true", b'"something"', *_slow(
    b"0", b"1.5", b"[true]", b'"1"', b'"incremental"', b'"last"')])
def test_a_snapshot_flag_of_any_json_kind_converts_or_is_refused_as_the_encoder_does(
        spark: Any, tmp_path: Path, value: bytes) -> None:
    """`source.snapshot` is a string or a boolean; the encoder refuses a line with any other
    kind there. Spark reads a number, an object or an array into the string field as its
    text, so the Spark path took `"snapshot": 1` for a row that is not a snapshot's."""
    path = _sequence_feed(tmp_path / "feed.jsonl", '["120","130"]')
    lines = path.read_bytes().splitlines()
    assert b'"snapshot":"false",' in lines[1]
    lines[1] = lines[1].replace(b'"snapshot":"false",', b'"snapshot":' + value + b",")
    path.write_bytes(b"\n".join(lines) + b"\n")
    updates = _both_agree(spark, path)
    assert (updates is None) == (value[:1] not in b'"t')


@pytest.mark.parametrize("gtid", [b"5", b'{"g":5}', b'"g:5"', *_slow(b'"g5"')])
def test_a_gtid_of_another_json_kind_converts_as_the_encoder_reads_it(
        spark: Any, tmp_path: Path, gtid: bytes) -> None:
    """The encoder takes a MySQL gtid for the transaction only when it is a string. Spark
    reads a number into the string field as its text: the Spark path put two changes at
    different binlog positions into one transaction, at one time."""
    def line(pos: int, key: int) -> bytes:
        return orjson.dumps({"op": "c", "before": None, "after": {"id": key, "name": "n"},
                             "source": {"connector": "mysql", "db": "inv", "table": "items",
                                        "snapshot": "false", "file": "bin.000002",
                                        "pos": pos, "row": 0, "gtid": "GTID"}})
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join([line(100, 1), line(110, 2), line(120, 3)])
                     .replace(b'"GTID"', gtid) + b"\n")
    updates = _both_agree(spark, path)
    assert updates is not None and len(updates) == 3
    times = {time for (_, time) in updates}
    assert len(times) == (1 if gtid.startswith(b'"') else 3)


def test_data_collections_written_as_text_is_refused_at_its_line(spark: Any,
                                                                  tmp_path: Path) -> None:
    """An END whose `data_collections` is a JSON string holding the array: the encoder wants
    the array itself; the Spark path used to parse the text and read the counts from it."""
    def change(lsn: int, key: int, tx: int) -> bytes:
        return orjson.dumps({
            "op": "c", "before": None, "after": {"id": key, "name": "n"},
            "source": {"connector": "postgresql", "lsn": lsn, "txId": tx, "snapshot": "false",
                       "sequence": f'["{lsn - 5}","{lsn}"]'},
            "transaction": {"id": f"{tx}:{lsn}", "total_order": 1}})
    collections = [{"data_collection": "public.items", "event_count": 1}]
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join([
        orjson.dumps({"status": "BEGIN", "id": "7", "event_count": None}), change(110, 1, 7),
        orjson.dumps({"status": "END", "id": "7", "event_count": 1,
                      "data_collections": orjson.dumps(collections).decode()}),
        change(130, 2, 8)]) + b"\n")
    _both_refuse(spark, path, "feed.jsonl, line 3: data_collections must be an array")


@pytest.mark.parametrize("case", [
    # (the source's names as written, the name Spark's text of them gave the table, whether
    # the encoder's name is that one, so that its entry finishes the transaction, whether the
    # Spark path converts the batch, whether the events carry their Connect schema)
    (b'"schema":"public","table":false', "public.false", False, False, False),
    # a string that looks like a number's text: the lines are looked at, and it stays a name
    (b'"schema":"public","table":"2024"', "public.2024", True, True, False),
    # the same on wrapped lines, whose envelope's `"schema": {` is not the table's name
    (b'"schema":"public","table":"2024"', "public.2024", True, True, True),
    # an empty schema falls to the db, in Python's `schema or db`
    (b'"schema":"","db":"inv","table":"items"', "items", False, True, False),
    *_slow((b'"schema":"public","table":true', "public.true", False, False, False),
           (b'"schema":5,"table":"items"', "5.items", True, False, False),
           (b'"schema":"public","table":"items"', "public.items", True, True, False),
           (b'"schema":"public","table":0', "public.0", False, False, False),
           (b'"schema":"public","table":1.50', "public.1.50", False, False, False),
           (b'"schema":"public","table":{"t":1}', 'public.{"t":1}', False, False, False),
           (b'"db":false,"table":"items"', "false.items", False, False, False),
           (b'"schema":"public","table":false', "public.false", False, False, True),
           # a schema that looks like a number's text, on a wrapped line: the envelope's
           # `"schema": {` pairs with it, and the batch goes to the Python path for nothing
           (b'"schema":"2024","table":"items"', "2024.items", True, False, True))])
def test_a_table_name_of_another_json_kind_is_read_as_the_encoder_reads_it(
        spark: Any, tmp_path: Path, case: tuple[bytes, str, bool, bool, bool]) -> None:
    """The encoder names a change's table with Python's reading of `source.table` and of
    `schema or db`: `false` or `0` is no table (nor prefix), `true` is `True`. Spark reads
    them into the string fields as their text, so the Spark path named the table `public.false`
    and matched it with an END's `data_collections` entry of that name: its count (2, all
    seen) finished the transaction where the encoder expects the END's `event_count` (3)."""
    names, text, finished, jvm, wrapped = case
    connect = {"type": "struct", "fields": [
        {"field": "after", "type": "struct", "optional": True, "fields": [
            {"field": "id", "type": "int32"},
            {"field": "name", "type": "string", "optional": True}]}]}

    def change(lsn: int, key: int) -> bytes:
        source = {"connector": "postgresql", "lsn": lsn, "txId": 7, "snapshot": "false",
                  "sequence": f'["100","{lsn}"]', "schema": "NAMES"}
        event = {"op": "c", "before": None, "after": {"id": key, "name": "n"},
                 "source": source, "transaction": {"id": f"7:{lsn}", "total_order": key}}
        return orjson.dumps({"schema": connect, "payload": event} if wrapped else event
                            ).replace(b'"schema":"NAMES"', names)
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join([
        orjson.dumps({"status": "BEGIN", "id": "7", "event_count": None}),
        change(110, 1), change(120, 2),
        orjson.dumps({"status": "END", "id": "7", "event_count": 3, "data_collections": [
            {"data_collection": text, "event_count": 2}]})]) + b"\n")
    got = convert_frames(spark, [path], "debezium", ["id"], None)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=False, lenient=False))
    assert got.frontier == collect(messages).frontier.elements[0]
    assert spark_updates(got.changes) == python_updates(messages)
    # The transaction (at 100, the commit before it) finishes by the entry of the name, or
    # waits for the END's count of 3, one more than it holds.
    assert got.frontier == (101 if finished else 100)
    assert (got.path == "jvm") == jvm, got.reason


@pytest.mark.parametrize("jvm", [True, False])
def test_a_transaction_whose_events_disagree_on_sequence_is_timed_as_the_encoder_times_it(
        spark: Any, tmp_path: Path, jvm: bool) -> None:
    """The encoder times a PostgreSQL event with `sequence` by its own `sequence[0]`, even in
    a transaction whose events disagree on it (no connector writes one). The Python path gave
    every event of a transaction its first event's time: both changes at 105, and the
    frontier 106 where the encoder's is 115."""
    def change(lsn: int, key: int) -> bytes:
        source = {"connector": "postgresql", "lsn": lsn, "txId": 7, "snapshot": "false",
                  "sequence": f'["{lsn - 5}","{lsn}"]', "schema": "public", "table": "items"}
        return orjson.dumps({"op": "c", "before": None, "after": {"id": key, "name": "n"},
                             "source": source,
                             "transaction": {"id": f"7:{lsn}", "total_order": key}})
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join([
        orjson.dumps({"status": "BEGIN", "id": "7", "event_count": None}),
        change(110, 1), change(120, 2),
        orjson.dumps({"status": "END", "id": "7", "event_count": 2})]) + b"\n")
    got = convert_frames(spark, [path], "debezium", ["id"], None, python_path=not jvm)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=False, lenient=False))
    assert got.path == ("jvm" if jvm else "python-udf")
    assert got.frontier == collect(messages).frontier.elements[0] == 115
    assert spark_updates(got.changes) == python_updates(messages)
    assert [time for (_, time) in python_updates(messages)] == [105]


def _image_feed(path: Path, second: dict[str, Any]) -> Path:
    """Three inserts of `id`, `name`; the second's envelope fields are `second`'s."""
    def line(lsn: int, fields: dict[str, Any]) -> bytes:
        return orjson.dumps({"op": "c", "before": None, **fields, "source": {
            "connector": "postgresql", "lsn": lsn, "txId": lsn, "snapshot": "false",
            "sequence": f'["{lsn - 5}","{lsn}"]'}})
    path.write_bytes(b"\n".join([line(110, {"after": {"id": 1, "name": "a"}}),
                                 line(120, second),
                                 line(130, {"after": {"id": 3, "name": "c"}})]) + b"\n")
    return path


@pytest.mark.parametrize("second", [
    {"after": orjson.dumps({"id": 2, "name": "b"}).decode()},
    {"op": "u", "before": orjson.dumps({"id": 2, "name": "a"}).decode(),
     "after": {"id": 2, "name": "b"}},
    # A string holding an object with no key: no escaped quote on the line.
    {"after": "{}"}, {"after": "{ }"}], ids=["after", "before", "empty", "empty-spaced"])
def test_an_image_written_as_a_json_string_is_refused_at_its_line(
        spark: Any, tmp_path: Path, second: dict[str, Any]) -> None:
    """JSON written into a string twice: Spark reads an object into a text field as its text
    and a string as its content, so the Spark path read `"after": "{..}"` as the object."""
    _both_refuse(spark, _image_feed(tmp_path / "feed.jsonl", second), "feed.jsonl, line 2: ")


def test_a_column_named_after_holding_text_converts_as_the_encoder_does(
        spark: Any, tmp_path: Path) -> None:
    """What the look for a string image also finds: a column named `after` with a string
    value. The batch converts to the encoder's updates (on the Python path)."""
    path = _image_feed(tmp_path / "feed.jsonl", {"after": {"id": 2, "name": "b"}})
    path.write_bytes(path.read_bytes().replace(b'"name"', b'"after"'))
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)
    assert len(python_updates(messages)) == 3


def _both_agree(spark: Any, path: Path) -> list[Any] | None:
    """The encoder's updates of `path` (closed), which the Spark path must give too; or None
    when the encoder refuses it, and the Spark path then with the same words."""
    try:
        messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                          table_schema=None, close=True, lenient=False))
    except ChangefeedError as encoder:
        with pytest.raises(ChangefeedError) as spark_error:
            convert_frames(spark, [path], "debezium", ["id"], None, close=True)
        assert str(spark_error.value) == str(encoder)
        return None
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    expected = python_updates(messages)
    assert spark_updates(got.changes) == expected
    return expected


def _both_refuse(spark: Any, path: Path, place: str) -> None:
    """The encoder refuses `path` naming `place`, and the Spark path with the same words."""
    with pytest.raises(ChangefeedError) as encoder:
        list(encode_changefeed([path], source="debezium", keys=["id"], table_schema=None,
                               close=True, lenient=False))
    assert place in str(encoder.value)
    with pytest.raises(ChangefeedError) as spark_error:
        convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert str(spark_error.value) == str(encoder.value)


def test_a_byte_order_mark_opening_a_file_is_dropped_by_both_paths(spark: Any,
                                                                   tmp_path: Path) -> None:
    """Spark's text reader (Hadoop's line reader) drops a UTF-8 BOM that opens a file; the
    encoder's reader does too, so both convert the file, and a BOM anywhere else is bad JSON
    on both."""
    lines = [_change_line(110, 1, "a"), _change_line(120, 2, "b"), _change_line(130, 3, "c")]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert got.path == "jvm", got.reason
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages)
    assert len(python_updates(messages)) == 3
    inner = tmp_path / "inner.jsonl"
    inner.write_bytes(b"\n".join([lines[0], b"\xef\xbb\xbf" + lines[1], lines[2]]) + b"\n")
    _both_refuse(spark, inner, "inner.jsonl, line 2: ")


@pytest.mark.parametrize("close", [False, *_slow(True)])
def test_a_batch_without_row_images_converts_to_nothing_as_the_encoder_does(
        spark: Any, tmp_path: Path, close: bool) -> None:
    """Heartbeats, tombstones, transaction boundaries, blank lines: no columns to check the
    key against, and nothing to convert (the Python path used to refuse the key). The Spark path
    converts it (the Kafka ingest has no other), to no updates of the table schema's columns,
    or of none without one, as the Python path does."""
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b'{"ts_ms": 5}\nnull\n\n'
                     b'{"status": "BEGIN", "id": "9", "event_count": null}\n')
    expected = collect(encode_changefeed([path], source="debezium", keys=["id"],
                                         table_schema=None, close=close, lenient=False))
    schema_file = tmp_path / "table.json"
    schema_file.write_text(json.dumps({"columns": [{"name": "id", "type": "Int64"},
                                                   {"name": "name"}], "primary_key": ["id"]}))
    for schema, fields in [(None, ""), (schema_file, "id:bigint,name:string")]:
        for jvm in (True, False):
            got = convert_frames(spark, [path], "debezium", ["id"], schema, close=close,
                                 python_path=not jvm)
            assert got.path == ("jvm" if jvm else "python-udf"), got.reason
            assert got.changes.count() == 0 and not expected.updates
            assert got.changes.schema["data"].dataType.simpleString() == f"struct<{fields}>"
            assert got.frontier == (None if close else expected.frontier.elements[0])


def _amounts(path: Path, values: Sequence[str]) -> Path:
    """A feed of inserts whose `amount` values are the JSON texts `values`, one a line."""
    source = '{"connector":"postgresql","lsn":%d,"txId":%d,"snapshot":"false"}'
    path.write_bytes(b"\n".join(
        f'{{"op":"c","before":null,"after":{{"id":{i},"amount":{v}}},"source":{source}}}'
        .replace("%d", str(100 + i)).encode() for i, v in enumerate(values)) + b"\n")
    return path


@pytest.mark.parametrize("value", ["1e400", "99999999999999999999", "-0.0", *_slow(
    "-1e400", "-9223372036854775809", "18446744073709551615", "1E2")])
def test_numbers_at_the_edges_convert_as_the_encoder_converts_them(spark: Any, tmp_path: Path,
                                                                   value: str) -> None:
    """orjson refuses a number beyond a double and reads an integer beyond 64 bits as a
    float; `from_json` reads the one as an infinity and the other exactly: the Spark path
    must give the encoder's updates, or its refusal."""
    _both_agree(spark, _amounts(tmp_path / "feed.jsonl", ["1", value, "2"]))


@pytest.mark.parametrize("values", [("1", '"x"', "2"), ('"a"', "1.5", '"b"'),
                                    ('"a"', '{"b": 1}', '"c"'), *_slow(
                                        ("1", "true", "2"), ('"a"', "[1]", '"b"'),
                                        ('"a"', '"b","amount":5', '"c"'))])
def test_a_column_of_two_json_kinds_is_refused_at_its_line_not_read_as_text(
        spark: Any, tmp_path: Path, values: tuple[str, ...]) -> None:
    """A lake column has one type. `from_json` reads a number into a string column as its
    text (and Spark's inference makes a column of numbers and strings a string one), so `1`
    became "1"; the Python path's rule holds instead: the first value's kind is the column's, and
    another is a bad line."""
    path = _amounts(tmp_path / "feed.jsonl", values)
    with pytest.raises(ChangefeedError,
                       match=r"feed.jsonl, line 2: column amount of the after image is .*, not a"):
        convert_frames(spark, [path], "debezium", ["id"], None, close=True)


@pytest.mark.parametrize(("file", "tx"), [
    ("bin.99999999999999999999", None),  # a binlog number too large for a long
    ("bin.000002", "file=bin.000002,pos=99999999999999999999"),  # ... in the transaction id
    ("bin.000002", "file=bin.,pos=5"),  # no number in the transaction id
])
def test_a_binlog_number_spark_cannot_cast_converts_as_the_encoder_does(
        spark: Any, tmp_path: Path, file: str, tx: str | None) -> None:
    """A cast of such digits failed the Spark parse's job (ANSI mode); now the line is a
    `problem` there, and the batch converts or is refused as the encoder does it."""
    source = {"connector": "mysql", "db": "inv", "table": "items", "snapshot": "false",
              "file": file, "pos": 100, "row": 0}
    lines = [orjson.dumps({"op": "c", "before": None, "after": {"id": 1, "name": "a"},
                           "source": source,
                           "transaction": None if tx is None else {"id": tx}})]
    path = tmp_path / "my.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    _both_agree(spark, path)
