"""The Java line reader (`spark/jvm/DebeziumLine.java`) reads each line as the specification does.

Every line Java reads gives the row the Python parser's item for it makes (`DebeziumParser`,
the specification: `debezium_items.spec_item`, `as_spec`); every line it leaves is one the
parser rejects or one the Java file lists as left (`debezium_items.left_as_documented`):
here on the format samples, generated histories, lines at each rule's edge, and random
mutations of connector lines. These tests also check that Java reads the lines in the shape
connectors write (else they would pass with Java reading nothing).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.convert.test_convert_history import write_pg
from tests.support.changefeed_cases import PG_CASES
from tests.support.debezium_items import aggregated_facts, as_spec, left_as_documented, spec_item
from tests.support.paths import SAMPLES

pytestmark = pytest.mark.spark

PG_SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg",
             "ts_ms": 1, "snapshot": "false", "db": "db", "schema": "public", "table": "t",
             "txId": 600, "lsn": 5000, "sequence": '["4000","5000"]', "xmin": None}
MY_SOURCE = {"version": "2.7.0.Final", "connector": "mysql", "name": "my", "ts_ms": 1,
             "snapshot": "false", "db": "inv", "table": "t", "server_id": 1, "gtid": "g:7",
             "file": "mysql-bin.000003", "pos": 154, "row": 0, "thread": 7}


def _change(source: dict[str, Any], op: str = "u", **extra: Any) -> dict[str, Any]:
    return {"before": None, "after": {"id": 1, "name": "x", "amount": 1.5}, "source": source,
            "op": op, "ts_ms": 2, "transaction": {"id": "600:5000", "total_order": 1,
                                                   "data_collection_order": 1}, **extra}


def _line(value: Any) -> bytes:
    return value if isinstance(value, bytes) else orjson.dumps(value)


def _java_reads(spark: Any, paths: list[Path]) -> int:
    """How many of the files' lines Java reads (does not leave to the Python path), once
    `_tasks_read_as_the_udf`."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.parse import JVM_LINE
    from changelake.spark.changefeed.read import read_lines

    read_from = read_lines(spark, list(map(str, paths)))
    _tasks_read_as_the_udf(read_from.bounded)
    read = F.call_function(JVM_LINE, F.col("value").cast("binary"))
    return read_from.frame.where(read.isNotNull()).count()


def _tasks_read_as_the_udf(lines: Any) -> list[Any]:
    """`java_items` (Java's pass over each task's lines, `DebeziumLines`) gives exactly the
    rows and schema of the UDF's plan (`udf=True`) over `lines`; its rows."""
    from changelake.spark.changefeed.parse import java_items

    tasks, planned = java_items(lines), java_items(lines, udf=True)
    assert tasks.schema == planned.schema
    rows = tasks.collect()
    assert sorted(rows, key=repr) == sorted(planned.collect(), key=repr)
    return rows


def _agree(spark: Any, *paths: Path) -> int:
    """Java's reading of the files held to the specification, line by line (see the module
    docstring); how many lines Java read."""
    from changelake.errors import ChangefeedError
    from changelake.spark.changefeed.read import read_lines

    rows = sorted(_tasks_read_as_the_udf(read_lines(spark, list(map(str, paths))).bounded),
                  key=lambda r: (r["file_index"], r["block"], r["row"]))
    texts = [line.removesuffix(b"\r") for path in paths
             for line in path.read_bytes().split(b"\n") if line.strip()]
    assert len(rows) == len(texts)
    read = 0
    for row, text in zip(rows, texts, strict=True):
        spec = spec_item(text)
        if row["_deferred"]:
            assert isinstance(spec, ChangefeedError) or left_as_documented(text, spec), \
                f"Java leaves a line the parser reads: {text!r} {spec}"
        else:
            assert not isinstance(spec, ChangefeedError), f"Java reads {text!r}: {spec}"
            assert as_spec(row) == spec, text
            read += 1
    return read


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"\n".join(map(_line, lines)) + b"\n")
    return path


@pytest.fixture(scope="module")
def java(spark: Any) -> None:
    """The session reads lines in Java: `build_session` put the jar on it."""
    from changelake.spark.changefeed.parse import JVM_LINE, JVM_LINE_CLASS, JVM_LINE_TYPE
    from changelake.spark.jvm import register

    register(spark, JVM_LINE, JVM_LINE_CLASS, JVM_LINE_TYPE)


def test_every_debezium_sample_reads_the_same(spark: Any, java: None, tmp_path: Path) -> None:
    samples = sorted(SAMPLES.glob("*dbz*.jsonl"))
    assert len(samples) >= 12
    assert _agree(spark, *samples) >= 15  # the samples' changes and transaction boundaries


def test_generated_histories_read_the_same(spark: Any, java: None, tmp_path: Path) -> None:
    for n, history in enumerate(PG_CASES):
        (tmp_path / str(n)).mkdir()
        paths, _, _ = write_pg(history, tmp_path / str(n))
        for path in paths:
            lines = sum(1 for line in path.read_bytes().splitlines() if line.strip())
            assert _agree(spark, path) == lines  # every line, the tombstones too


def _edges() -> list[Any]:
    """Lines at the edge of a rule, each one Java reads or leaves (no batch failure)."""
    pg, my = PG_SOURCE, MY_SOURCE
    return [
        _change(pg), _change(pg, "c"), _change({**pg, "snapshot": "true"}, "c"),
        _change({**pg, "snapshot": True}, "r"), _change({**pg, "snapshot": False}),
        _change({**pg, "snapshot": "last_in_data_collection"}, "r"),
        _change({**pg, "snapshot": "incremental"}), _change({**pg, "snapshot": "odd"}),
        _change({**pg, "sequence": '[null,"5000"]'}), _change({**pg, "sequence": None}),
        _change({**pg, "sequence": '["4000","5000"]\n'}), _change({**pg, "sequence": "[1,2]"}),
        _change({**pg, "sequence": '["12345678901234567890","1"]'}),
        # `DebeziumLine.sequence` reads by hand what `parse._SEQUENCE` matches: its edges.
        *(_change({**pg, "sequence": text}) for text in (
            '[null,null]', '["4000",null]', '["123456789012345678","1"]',
            '["1234567890123456789","1"]', '["1","1234567890123456789"]', '["","1"]',
            '["1",""]', '[ "1","2"]', '["1","2"] ', '["1","2"]x', '["1","2"', '"1","2"]',
            '["1";"2"]', '["1","2","3"]', '[nul,"2"]', '[nullx,"2"]', '["1",null ]',
            '["-1","2"]', '["1.0","2"]', '["\uff11","2"]', '["1","2"]]', '[]', '[', '')),
        {**_change({k: v for k, v in pg.items() if k not in ("lsn", "sequence")}),
         "transaction": None},
        _change({k: v for k, v in pg.items() if k != "sequence"}),
        _change({**pg, "lsn": None, "sequence": None}),
        _change({**pg, "lsn": -1}), _change({**pg, "txId": None}),
        {**_change(pg), "transaction": {"id": "12:34\n"}},
        {**_change(pg), "transaction": {"id": "tx-9"}},
        _change({**pg, "schema": ""}), _change({**pg, "schema": None, "db": ""}),
        _change({**pg, "table": ""}), _change({**pg, "table": "1"}),
        _change(my), _change({**my, "gtid": None}), _change({**my, "gtid": "g5"}),
        {**_change({**my, "gtid": None}), "transaction": {
            "id": "file=mysql-bin.000003,pos=154", "total_order": 2}},
        {**_change({**my, "gtid": None}), "transaction": {"id": "file=x,pos=154"}},
        _change({**my, "snapshot": "true"}, "r"), _change({**my, "pos": 2 ** 32}),
        _change({**my, "file": "mysql-bin"}), _change({**my, "file": "bin.000003\n"}),
        _change({**my, "file": None}), _change({**my, "row": None}),
        _change({**my, "file": "bin.99999999999999999999"}),
        _change({**my, "file": "bin.9999999999999999999"}),  # 19 digits: Java leaves it
        {**_change({**my, "gtid": None}), "transaction": {
            "id": "file=bin.000002,pos=99999999999999999999"}},
        _change({k: v for k, v in pg.items() if k not in ("lsn", "txId", "sequence")}),
        _change({**pg, "step": None}), _change({**pg, "connector": "ydb"}),
        _change(pg, "d"), {**_change(pg, "d"), "after": None, "before": {"id": 1}},
        {**_change(pg), "after": None}, _change(pg, "t"), _change(pg, "x"),
        # A truncate as connectors write it (no image): Java reads it; with an image it
        # leaves it.
        {**_change(pg, "t"), "after": None}, {**_change(my, "t"), "after": None},
        {**_change(pg, "t"), "after": None, "before": {"id": 1}},
        {**_change(pg), "source": None}, {**_change(pg), "status": "END"},
        {**_change(pg), "after": {"id": 1, "note": "a \"after\": \"b"}},
        {**_change(pg), "after": {"id": 1, "after": "text"}},
        {"schema": {"type": "struct", "fields": []}, "payload": _change(pg)},
        {"schema": None, "payload": _change(pg)}, {"payload": _change(pg)},
        {"schema": "text", "payload": _change(pg)}, {"payload": None},
        {"key": {"id": 1}, "value": {"payload": _change(pg)}},
        {"ts_ms": 1}, {"ddl": "CREATE TABLE t", "source": None},
        {"ts_ms": 1, "ts_ns": 2}, {"ts_ms": 1, "other": 2}, {}, {"tableChanges": []},
        {"schema": {"type": "struct"}, "payload": {"ts_ms": 1}}, {"payload": {}},
        {"schema": "text", "payload": None}, {"schema": {"type": "struct"}, "payload": None},
        {"payload": None, "op": "c"}, {"ts_ms": 1, "transaction": {"total_order": 4}},
        b"null ", b" null",
        {"status": "BEGIN", "id": "571", "event_count": None, "data_collections": None},
        {"status": "END", "id": "571:999", "event_count": 3, "data_collections": [
            {"data_collection": "public.t", "event_count": 3}]},
        {"status": "END", "id": "7", "event_count": 1, "data_collections": [
            {"data_collection": "public.t", "event_count": None}]},
        {"status": "END", "id": "7", "event_count": None},
        {"status": "MIDDLE", "id": "7"}, {"status": "BEGIN", "id": None},
        {"status": "BEGIN", "id": "7", "source": pg},
        b"null", b'{"op":"c","before":null,"after":{"id":1},"source":' + orjson.dumps(pg)
        + b',"op2":1}   ',
        b'{"op" : "u", "before":null, "after" : { "id" : 1, "f" : 1.50, "e": 1E+2, "u":'
        b' "\\u00e9\\/", "n": [1, 2.0e0] }, "source": ' + orjson.dumps(pg) + b"}",
        b'{"op":"u","after":{"id":1},"after":{"id":2},"source":' + orjson.dumps(pg) + b"}",
        # Images (and a schema) whose text Jackson writes otherwise than the line holds it,
        # one way each, and three it writes as they stand: Java's text must be Spark's.
        *(b'{"op":"u","before":null,"after":' + image + b',"source":' + orjson.dumps(pg) + b"}"
          for image in [b'{"id":1,"n":-0}', b'{"id":1,"e":1E2}', b'{"id":1,"e":2e-1}',
                        b'{"id":1,"f":0.5}', b'{"id":1,"s":"a\\"b"}', b'{"id":1,"a\\u0062":1}',
                        b'{"id":1,"o":{"a":[1 ,true]}}', b'{"id":1,"o":{"a":[1,\ttrue]}}',
                        b'{"id":-5,"t":true,"f":false,"z":null,"s":"","o":{"a":[1,"x"]}}',
                        '{"id":1,"s":"é ü","neg":-10}'.encode(), b'{"id":1}']),
        b'{"schema": {"type": "struct", "fields": []}, "payload":' + orjson.dumps(_change(pg))
        + b"}",
        b'{"op":"u","after":{"id":1},"source":' + orjson.dumps(pg) + b'},{"op":"c"}',
    ]


def test_lines_at_each_rules_edge_read_the_same(spark: Any, java: None, tmp_path: Path) -> None:
    edges = _edges()
    path = _write(tmp_path / "edges.jsonl", edges)
    read = _agree(spark, path)
    assert 20 <= read < len(edges)  # Java reads the connectors' shapes and leaves the rest


def test_a_truncate_is_read_by_java_and_one_with_an_image_left(spark: Any, java: None,
                                                               tmp_path: Path) -> None:
    plain = {**_change(PG_SOURCE, "t"), "after": None}
    path = _write(tmp_path / "t.jsonl", [plain, {"schema": None, "payload": plain}])
    assert _agree(spark, path) == 2
    imaged = _write(tmp_path / "ti.jsonl", [{**plain, "before": {"id": 1}}])
    assert _agree(spark, imaged) == 0


@pytest.mark.parametrize("bad", [
    {**_change(PG_SOURCE), "op": 5},  # a string field holding a number: text to Spark
    _change({**PG_SOURCE, "lsn": "5000"}),  # a bigint field holding a string: FAILFAST
    orjson.dumps(_change(PG_SOURCE)).replace(b'"lsn":5000', b'"lsn":18446744073709551616'),
    {**_change(PG_SOURCE), "source": "text"},
    b'{"op":"u","after":{"id":1},"source":' + orjson.dumps(PG_SOURCE) + b"} {}",
    b'{"op":"u","after":{"id":1},"source":' + orjson.dumps(PG_SOURCE) + b"",
    b"nul",
    # Valid UTF-8 (NUL is a character), which Jackson would read from bytes as UTF-16 text.
    orjson.dumps(_change(PG_SOURCE)).decode().encode("utf-16-le"),
])
def test_a_field_of_another_kind_is_left_by_java(spark: Any, java: None, tmp_path: Path,
                                                bad: Any) -> None:
    """A field of another JSON kind than Java reads it as, or a line that is not one JSON
    value: Java leaves the line (and the parser rejects it or it is one Java lists as left),
    and reads the connector line beside it."""
    assert _agree(spark, _write(tmp_path / "bad.jsonl", [_change(PG_SOURCE), bad])) == 1


def _twice(line: dict[str, Any], opening: bytes, name: bytes = b'"dup":1',
           times: int = 2) -> bytes:
    """`line` with `name` written `times` times right after `opening` (text that ends where
    an object's keys begin, or with a key's value, and is unique on the line)."""
    text = orjson.dumps(line)
    assert text.count(opening) == 1, (text, opening)
    pair = b",".join([name] * times)
    return text.replace(opening, opening + (pair + b"," if opening.endswith(b"{")
                                            else b"," + pair))


_WIDE = {f"c{i}": i for i in range(40)}  # more keys than `UniqueKeys` compares one by one


def test_a_key_twice_in_any_object_is_left_by_java(spark: Any, java: None,
                                                    tmp_path: Path) -> None:
    """Jackson's duplicate detection is `UniqueKeys` now: every object Java walks, or skips,
    or copies, holding a key twice, leaves its line (to the Python path); the same lines
    without the second key are Java's, as the parser reads them."""
    change = _change(PG_SOURCE)
    tx_end = {"status": "END", "id": "600:5000", "event_count": 1, "ts_ms": 1,
              "data_collections": [{"data_collection": "public.t", "event_count": 1}]}
    nested = {**change, "after": {"id": 1, "name": "x", "blob": {"k": [{"v": 1}]}},
              "extra": {"e": {"f": 1}}}
    wrapped = {"schema": {"type": "struct", "fields": []}, "payload": change}
    wide = {**change, "after": {"id": 1, **_WIDE}}
    twice = [
        _twice(change, b'"ts_ms":2'),  # the envelope
        _twice(change, b'"source":{'),
        _twice(change, b'"transaction":{'),
        _twice(change, b'"after":{'),
        _twice(nested, b'"blob":{'),  # an image's value, copied
        _twice(nested, b'[{', b'"w":1'),  # an object in an array in it
        _twice(nested, b'"e":{'),  # a field Java skips
        _twice(wrapped, b'"payload":{'),
        _twice(wrapped, b'"schema":{'),  # the schema, copied as text
        _twice(tx_end, b'"data_collections":[{'),
        _twice(wide, b'"after":{', b'"c39":0', times=1),  # the second past the linear scan
        _twice(wide, b'"c39":39', b'"new":0'),
    ]
    once = [change, tx_end, nested, wrapped, wide]
    assert _java_reads(spark, [_write(tmp_path / "once.jsonl", once)]) == len(once)
    # Java reads `change` and leaves every other line
    assert _agree(spark, _write(tmp_path / "twice.jsonl", [change, *twice])) == 1


_NUMBERS = ("lsn", "txId", "pos", "row")
_TEXTS = ("connector", "snapshot", "sequence", "file", "gtid", "step", "table", "schema", "db")
_TEXT_VALUES = st.one_of(st.none(), st.booleans(), st.sampled_from([
    "true", "false", "last", "incremental", "postgresql", "mysql", "ydb", "", "bin.000009",
    "bin.x", "g:1", "g1", '["10","20"]', '[null,"30"]', '["1",null]', "[1,2]",
    "file=bin.000002,pos=40", "5:6", "public", "x.y", "1"]))
_NUMBER_VALUES = st.one_of(st.none(), st.integers(-3, 2 ** 40))


@st.composite
def _mutated(draw: Any) -> bytes:
    """A PostgreSQL or MySQL change or a boundary, with a few fields set (to a value of the
    field's JSON kind, or a boolean into a text field: no batch fails) or removed."""
    base = copy.deepcopy(draw(st.sampled_from([
        _change(PG_SOURCE), _change(MY_SOURCE), _change(PG_SOURCE, "c"), _change(MY_SOURCE, "d"),
        {"status": "END", "id": "9", "event_count": 1,
         "data_collections": [{"data_collection": "public.t", "event_count": 1}]},
        {"ts_ms": 1}, {"ddl": "ALTER TABLE t", "tableChanges": []}])))
    source = base.get("source") or {}
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["text", "number", "body", "count", "drop"]))
        if where == "text":
            source[draw(st.sampled_from(_TEXTS))] = draw(_TEXT_VALUES)
        elif where == "number":
            source[draw(st.sampled_from(_NUMBERS))] = draw(_NUMBER_VALUES)
        elif where == "body":
            base[draw(st.sampled_from(["op", "status", "id"]))] = draw(
                st.one_of(st.none(), st.sampled_from(["c", "u", "d", "r", "t", "BEGIN", "END"])))
        elif where == "count":
            base["event_count"] = draw(_NUMBER_VALUES)
        else:
            for block in (base, source):
                block.pop(draw(st.sampled_from(sorted(block) or ["op"])), None)
    if draw(st.integers(0, 9)) == 0:
        return b"null"  # a tombstone
    value = {"schema": None, "payload": base} if draw(st.booleans()) else base
    return orjson.dumps(value)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_mutated(), min_size=5, max_size=40))
def test_mutated_connector_lines_read_the_same(spark: Any, java: None,
                                               tmp_path_factory: Any, lines: list[bytes]) -> None:
    directory = tmp_path_factory.mktemp("mutated")
    _agree(spark, _write(directory / "feed.jsonl", lines))


def test_the_tasks_hold_the_lines_to_the_bounds_as_spark_does(spark: Any, java: None,
                                                              tmp_path: Path) -> None:
    """`DebeziumLines.flaw` is `read.flaw`: a line at the bound (its newline counted) is 1,
    bytes that are not UTF-8 are 2 wherever they sit (in the word-at-a-time part of the ASCII
    test or in its tail), and UTF-8 beyond ASCII is no flaw (Java reads the line)."""
    from changelake.formats.lines import MAX_LINE_BYTES
    from changelake.spark.changefeed.read import read_lines

    good = orjson.dumps(_change(PG_SOURCE, after={"id": 1, "name": "é"}))
    lines = [good, orjson.dumps(_change(PG_SOURCE)),
             *(b'{"op":"c","a":12}'[:at] + bad + b'{"op":"c","a":12}'[at + 1:]
               for at in (0, 7, 8, 16) for bad in (b"\xff", b"\xc3")),  # 16: the tail
             b'{"x": "' + b"y" * (MAX_LINE_BYTES - 9) + b'"}',  # its newline reaches the bound
             b'{"x": "' + b"y" * (MAX_LINE_BYTES - 10) + b'"}']  # one byte below it
    rows = _tasks_read_as_the_udf(read_lines(spark, [str(_write(tmp_path / "b.jsonl",
                                                                lines))]).bounded)
    flaws = [r["flaw"] for r in sorted(rows, key=lambda r: r["row"])]
    assert flaws == [None, None, *[2] * 8, 1, None]
    assert [r["_deferred"] for r in sorted(rows, key=lambda r: r["row"])][:2] == [False, False]


def test_a_session_without_the_jar_is_told_what_to_add(spark: Any) -> None:
    """A class the session's JVM lacks (as all of the jar's are on a session the caller built
    without it): `register` and `java_class` name the jar to put on `spark.jars`."""
    from changelake.errors import ChangelakeError
    from changelake.spark import jvm
    from changelake.spark.changefeed.parse import JVM_LINE_TYPE

    with pytest.raises(ChangelakeError, match=r"spark\.jars=.*changelake-spark-rules.*\.jar"):
        jvm.register(spark, "changelake_no_such_class", "changelake.jvm.Nothing", JVM_LINE_TYPE)
    assert not spark.catalog.functionExists("changelake_no_such_class")
    with pytest.raises(ChangelakeError, match=r"has no changelake\.jvm\.Nothing"):
        jvm.java_class(spark, "changelake.jvm.Nothing")


def test_the_parse_step_is_java_alone_and_a_line_it_leaves_goes_to_the_python_path(
        spark: Any, java: None, tmp_path: Path) -> None:
    """`debezium_path._parsed` takes Java's reading for a batch of connector lines: the
    checkpoint is Java's rows and the facts are their aggregates. A batch with one line Java
    leaves (a key twice) is no batch of the Spark path (`Unsupported`, naming the count), and
    `convert_lines` converts it on the Python path, to the parser's reading of that line."""
    from changelake.spark.changefeed import debezium_path
    from changelake.spark.changefeed.dispatch import Unsupported
    from changelake.spark.changefeed.parse import java_items
    from changelake.spark.changefeed.pipeline import convert_lines
    from changelake.spark.changefeed.read import read_lines

    paths, _, _ = write_pg(PG_CASES[0], tmp_path)
    with open(paths[0], "ab") as fh:  # a tombstone, a heartbeat, a boundary
        fh.write(b'null\n{"ts_ms": 5}\n{"status": "BEGIN", "id": "7", "event_count": null}\n')
    lines = read_lines(spark, list(map(str, paths)))
    items, facts = debezium_path._parsed(lines)
    expected = java_items(lines.bounded, udf=True)
    assert facts.pop("shapes")  # the images' shapes
    facts.pop("chunks")  # `test_the_parse_step_collects_the_chunks_rows`
    assert facts == aggregated_facts(expected) and facts["_deferred"] == 0
    kept = expected.drop("_deferred", "shape", *debezium_path._FACTS_ONLY)
    assert items.columns == kept.columns
    assert items.exceptAll(kept).count() == 0 == kept.exceptAll(items).count()

    odd = _write(tmp_path / "odd.jsonl", [  # a duplicate key: Java leaves the line
        b'{"op":"c","before":null,"after":{"id":1,"id":2},"source":'
        + orjson.dumps({**PG_SOURCE, "table": "other"}) + b"}"])
    with_odd = read_lines(spark, list(map(str, [odd])))
    assert debezium_path._parsed(with_odd)[1]["_deferred"] == 1
    with pytest.raises(Unsupported, match=r"^unsupported: 1 line\(s\) the Java line reader"):
        debezium_path.debezium_timed(spark, with_odd)
    converted = convert_lines(spark, with_odd, "debezium", ["id"], None, close=True)
    assert converted.path == "python-udf"
    assert [r.asDict(recursive=True) for r in converted.changes.collect()] == [
        {"data": {"id": 2}, "time": 4000, "diff": 1}]  # orjson keeps the last of two keys


@pytest.mark.parametrize("bits", [1, 3, 16])
def test_the_parse_step_collects_the_chunks_rows(spark: Any, java: None, tmp_path: Path,
                                                 monkeypatch: Any, bits: int) -> None:
    """The `chunks` Java's parse job collects (`_chunk`, `DebeziumLines`) are the rows
    `times.chunks_of` aggregates over the changes at their `ptime`: the same earlier highs,
    windowed chunks and files' highest, over files of snapshot rows, streamed changes (some
    in one chunk with a snapshot row after them), tombstones, heartbeats and boundaries."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed import debezium_path, times
    from changelake.spark.changefeed.read import read_lines
    from tests.support.seeding import seeded

    monkeypatch.setattr(times, "CHUNK_BITS", bits)
    rng = seeded(20261128 + bits)
    files = []
    for n in range(3):
        lines: list[Any] = []
        for i in range(rng.randint(0, 40)):
            pick = rng.random()
            lsn = rng.randint(1, 10_000)
            source = {**PG_SOURCE, "lsn": lsn, "sequence": f'[null,"{lsn}"]'}
            if pick < 0.35:
                lines.append(_change({**source, "snapshot": "true"}, "r"))
            elif pick < 0.8:
                op = rng.choice("cud")
                lines.append(_change(source, op, transaction=None,
                                     **({"after": None, "before": {"id": i}}
                                        if op == "d" else {})))
            else:
                lines.append(rng.choice([b"null", b'{"ts_ms": 5}',
                                         b'{"status": "BEGIN", "id": "7", "event_count": null}']))
        files.append(_write(tmp_path / f"f{n}.jsonl", lines) if lines
                     else tmp_path / f"f{n}.jsonl")
        files[-1].touch()
    read_from = read_lines(spark, list(map(str, files)))
    items, facts = debezium_path._parsed(read_from)
    assert "chunks" in facts  # Java read every line
    changes = items.where(F.col("kind") == "change").withColumn("time", F.col("ptime"))
    narrow = changes.select("file_index", "block", "row", "time", F.col("time").alias("_m"))

    def chunks(rows: Any) -> Any:
        return times.chunks_of(spark, narrow, stream=("file_index", "block"), row="row",
                               moves=F.col("_m"), per_file=False,
                               wanted=F.col("time").isNull(), rows=rows)

    aggregated, collected = chunks(None), chunks(facts["chunks"])
    assert sorted(aggregated.earlier.collect()) == sorted(collected.earlier.collect())
    assert (aggregated.windowed, aggregated.highest) == (collected.windowed, collected.highest)
    assert len(facts["chunks"]) == aggregated.earlier.count() > (bits < 16)


def test_the_tasks_facts_are_the_aggregates_over_their_lines(spark: Any, java: None,
                                                             tmp_path: Path) -> None:
    """The facts the parse's job gathers from the tasks (`DebeziumLines.Facts`,
    `debezium_path._merged_facts`) are Spark's aggregates over the parsed lines
    (`debezium_items.aggregated_facts`): over each Debezium sample, and over the samples Java
    reads whole, and over those samples and changes of
    two tables together, in one task and in several. Among them are lines wrapped in a Connect
    schema, transaction metadata, a change at its transaction's time and two tables."""
    from changelake.spark.changefeed import debezium_path
    from changelake.spark.changefeed.read import read_lines

    two = _write(tmp_path / "two.jsonl", [
        _change({**PG_SOURCE, "table": "b"}), _change({**PG_SOURCE, "table": "a", "lsn": 7}),
        _change({**PG_SOURCE, "snapshot": "true"}, "r", after={"id": 3}),
        _change({**PG_SOURCE, "schema": "é"}, "d", after=None, before={"id": 2}),
        _change({**PG_SOURCE, "sequence": None}, "c")])  # at its transaction's time

    def facts(bounded: Any) -> tuple[dict[str, Any], int]:
        """The merged facts, or `{}` where Java left a line (they are still the aggregates);
        and how many tasks gave them."""
        rows = [r["_facts"] for r in debezium_path.java_items(bounded, chunk_bits=16)
                .where("_facts IS NOT NULL").select("_facts").collect()]
        found = debezium_path._merged_facts(rows)
        expected = aggregated_facts(debezium_path.java_items(bounded, udf=True))
        shapes = found.pop("shapes")
        assert found == expected
        assert shapes == sorted({r["shape"] for r in debezium_path.java_items(bounded).collect()
                                 if r["shape"] is not None})
        return ({} if found["_deferred"] else found), len(rows)

    whole = [p for p in sorted(SAMPLES.glob("*dbz*.jsonl"))
             if facts(read_lines(spark, [str(p)]).bounded)[0]]
    assert len(whole) >= 4
    lines = read_lines(spark, list(map(str, [*whole, two]))).bounded
    (several, tasks), (one, _) = facts(lines), facts(lines.coalesce(1))
    assert tasks > 1 and several == one
    assert several["schema"] is not None and several["metadata"] and several["by_tx"]
    assert several["table"] != several["other_table"]


# --------------------------------------------------------------------------- image shapes

_SHAPE_VALUES: list[Any] = [
    "", "x", "2026-11-27", "2026-11-27T10:00:00", "1", "true", "null", None, 0, -1, 2**63 - 1,
    -(2**63), 2**63, 1.5, -0.0, 1e300, True, False, {"nested": 1}, [1, 2], [],
]


def _shape_batches(count: int) -> list[list[dict[str, Any] | None]]:
    """Batches of images (after or before, each image a dict or None): a few names, each
    value of a random kind, so that kinds meet and widen within a batch."""
    from tests.support.seeding import seeded

    rng = seeded(20261127)
    batches = []
    for _ in range(count):
        names = rng.sample(["id", "name", "amount", "Note", "note", "é"], rng.randint(1, 4))
        kinds = {n: rng.sample(_SHAPE_VALUES, rng.randint(1, 3)) for n in names}
        batch: list[dict[str, Any] | None] = []
        for _ in range(rng.randint(1, 6)):
            batch.append(None if rng.random() < 0.15 else {
                n: rng.choice(kinds[n]) for n in names if rng.random() < 0.85})
        batches.append(batch)
    return batches


def test_the_image_shapes_infer_as_spark_infers(spark: Any, tmp_path: Path) -> None:
    """`types.inferred_from_shapes` over the shapes the line reader gives the changes of a
    batch is `infer_images` over their images, or None (then the pipeline runs it)."""
    from pyspark.sql import functions as F

    from changelake.spark.changefeed.parse import java_items
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.changefeed.types import infer_images, inferred_from_shapes

    edges: list[list[dict[str, Any] | None]] = [
        [{"a": ""}, {"a": 1}], [{"a": ""}], [{"a": "", "b": 1.5}, {"a": True, "b": 2}],
        [{"a": 1}, {"a": True}], [{"a": None}], [{"a": 1}, {"a": 1.5}], [{"a": -0.0}],
        [{"a": "1"}, {"a": 1}], [{"a": "2026-11-27"}], [{"a": False}, {"a": None}],
    ]
    said = 0
    batches = edges + _shape_batches(30)
    paths = []
    for n, batch in enumerate(batches):
        paths.append(tmp_path / f"b{n}.jsonl")
        lines = [orjson.dumps(_change(PG_SOURCE, op="c", after=image or {"id": 0},
                                      before=(batch[i - 1] if i else None)))
                 for i, image in enumerate(batch)]
        paths[-1].write_bytes(b"\n".join(lines) + b"\n")
    # Every batch read by Java in one job, a file each; each batch's shapes are its file's.
    items = java_items(read_lines(spark, [str(p) for p in paths]).bounded)
    read = items.select("file_index", "shape", "after_raw", "before_raw", "_deferred").collect()
    assert not any(r["_deferred"] for r in read)
    assert "*" not in {r["shape"] for r in read}  # no task passed on its bound of shapes
    for n, batch in enumerate(batches):
        rows = [r for r in read if r["file_index"] == n]
        assert len(rows) == len(batch)
        shapes = inferred_from_shapes([r["shape"] for r in rows])
        texts = [r[c] for r in rows for c in ("after_raw", "before_raw") if r[c] is not None]
        frame = spark.createDataFrame([(t,) for t in texts], "value string")
        spark_says = {f.name: f.dataType.simpleString()
                      for f in infer_images(spark, frame.where(F.col("value").isNotNull()))
                      .fields}
        if shapes is not None:
            said += 1
            assert shapes == spark_says, (batch, shapes, spark_says)
    assert said >= 20  # the shapes said it for most batches, not only the edges


def test_a_task_passes_on_a_bounded_number_of_shapes(spark: Any, tmp_path: Path) -> None:
    from changelake.spark.changefeed.parse import java_items
    from changelake.spark.changefeed.read import read_lines

    path = tmp_path / "many.jsonl"
    path.write_bytes(b"".join(orjson.dumps(_change(PG_SOURCE, after={f"c{i}": i})) + b"\n"
                              for i in range(400)))
    items = java_items(read_lines(spark, [str(path)]).bounded.coalesce(1))
    shapes = [r["shape"] for r in items.select("shape").collect()]
    assert len(set(shapes)) == 257 and shapes[256:] == ["*"] * 144
