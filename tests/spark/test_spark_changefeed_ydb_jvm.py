"""YDB's Java line reader (`ydb.java_items`: `YdbLines.java`, `YdbLine.java`) held to the
specification, `formats.ydb.YdbParser`: every line Java reads is what a fresh parser makes of
it (`spec_item`, `as_spec`), and every line it leaves is one the parser refuses or one
`YdbLine.java` lists as left (`left_as_documented`). On the YDB samples of `tests/data`,
generated histories, each rule's edges (nulls, nan and infinities, escapes, big numbers) and
random mutations of records."""

from __future__ import annotations

import decimal
import json
import math
import re
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.errors import ChangefeedError, Location
from changelake.formats.change import UNCHANGED, Change, Op, Resolved
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from tests.convert.test_convert_history import YDB_TABLE, write_ydb, ydb_histories
from tests.convert.test_convert_samples import EXPECTED
from tests.spark.test_spark_changefeed_ydb import (
    ACCEPTED,
    CAREFUL,
    JVM_SAMPLES,
    LINE_TABLE,
    REFUSED,
    TYPED_AS_ORJSON,
)
from tests.support.paths import SAMPLES

_WHERE = Location("line", 1)
_OPS = {Op.DELETE: "d", Op.UPDATE: "u", Op.UPSERT: "w"}


def _value(value: Any) -> Any:
    """A value in a form both sides compare with `==`: a float by its `repr` (NaN equal to
    itself, -0.0 not 0.0), a Uint64 as an int."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, decimal.Decimal):
        return int(value)
    return value


def _image(image: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if image is None else {
        n: "UNCHANGED" if v is UNCHANGED else _value(v) for n, v in image.items()}


def spec_item(schema: TableSchema, line: bytes) -> dict[str, Any] | ChangefeedError:
    """A fresh parser's item for `line` as `as_spec` writes Java's rows, or its error."""
    try:
        item = YdbParser(schema).parse_line(line, _WHERE)
    except ChangefeedError as error:
        return error
    if isinstance(item, Resolved):
        return {"kind": "resolved", "rpos": list(item.position)}
    assert isinstance(item, Change), item
    return {"kind": "change", "op": _OPS.get(item.op, item.op.value),
            "key": {n: _value(v) for n, v in (item.key or {}).items()},
            "pos": None if item.position is None else list(item.position), "time": item.time,
            "before": _image(item.before), "after": _image(item.after)}


def _uint64(flipped: int) -> int:
    """A Uint64 as `YdbLines.flip` made it a long: its sign bit flipped back."""
    return (flipped + (1 << 63)) % (1 << 64)


def as_spec(schema: TableSchema, row: Any) -> dict[str, Any]:
    """A row of `java_items` in `spec_item`'s form."""
    if row["kind"] == "resolved":
        return {"kind": "resolved", "rpos": [int(v) for v in row["rpos"]]}
    names = list(schema.names)
    key = {}
    for i, name in enumerate(schema.primary_key):
        if f"k{i}_long" in row:
            assert row[f"k{i}_negative"] is False
            key[name] = _uint64(row[f"k{i}_long"])
        else:
            key[name] = _value(row[f"k{i}"])
    after = None
    if row["a"] is not None:
        after = {n: "UNCHANGED" if row["ua"][n] else _value(row["a"][n]) for n in names}
    assert not any(row["ub"])
    before = None if row["b"] is None else {n: _value(row["b"][n]) for n in names}
    pos = None if row["pos"] is None else [_uint64(v) for v in row["pos"]]
    assert row["has_ts"] == (pos is not None)
    assert row["is_delete"] == (row["op"] == "d") and row["rank"] == (0 if row["op"] == "d" else 1)
    return {"kind": "change", "op": row["op"], "key": key, "pos": pos, "time": row["time"],
            "before": before, "after": after}


def _pairs_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [n for n, _ in pairs]
    if len(names) != len(set(names)):
        raise _Twice
    return dict(pairs)


class _Twice(Exception):
    pass


#: An integer -0 as the value of a key, ts or resolved (no digit, point or exponent after).
_MINUS_ZERO = re.compile(rb'-0(?![0-9.eE])')
#: A number of more than 1000 characters (Jackson's limit).
_LONG_NUMBER = re.compile(rb'[-0-9.eE+]{1001}')


def left_as_documented(schema: TableSchema, line: bytes,
                       spec: dict[str, Any]) -> str | None:
    """Which of the lines `YdbLine.java` (and `YdbLines.problems`) lists as left though the
    parser accepts them `line` is; None where it is none of them."""
    text = line.decode("utf-8")
    if "\ufeff" in text:
        return "a byte-order mark"
    try:
        value = json.loads(text, object_pairs_hook=_pairs_twice)
    except _Twice:
        return "a name twice in one object"
    if "payload" in value or "value" in value:
        return "DEBEZIUM_JSON"
    if _LONG_NUMBER.search(line):
        return "beyond Jackson's limits"
    if spec["kind"] == "resolved":
        return "a barrier beyond a long" if spec["rpos"][0] >= 1 << 63 else None
    if isinstance(value.get("key"), list) and None in value["key"]:
        return "a null in the key"
    if _MINUS_ZERO.search(line) and ("Uint64" in {c.type for c in schema.columns}
                                     or "ts" in value):
        return "a Uint64 written -0"
    if spec["op"] == "u" and spec["after"] is None:
        return "an OLD_IMAGE record"
    if value.get("newImage") is not None or (value.get("oldImage") is not None
                                             and "erase" not in value):
        parser = YdbParser(schema)
        for body in ("update", "reset"):
            if isinstance(value.get(body), dict):
                try:
                    parser._columns(value[body], body, _WHERE, fill=None)
                except ChangefeedError:
                    return "an update or reset the parser does not read, beside an image"
    return None


def agree(spark: Any, table: dict[str, Any], *paths: Path) -> tuple[int, int]:
    """Java's reading of the files held to the specification, line by line (see the module
    docstring); how many lines Java read, and how many it left."""
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.changefeed.ydb import java_items, ydb_columns

    schema = TableSchema.from_json(table)
    columns = ydb_columns(schema, list(schema.primary_key))
    rows = sorted(java_items(read_lines(spark, list(map(str, paths))).bounded, schema,
                             columns).collect(),
                  key=lambda r: (r["file_index"], r["block"], r["row"]))
    texts = [line.removesuffix(b"\r") for path in paths
             for line in path.read_bytes().split(b"\n") if line.strip()]
    assert len(rows) == len(texts)
    read = 0
    for row, text in zip(rows, texts, strict=True):
        spec = spec_item(schema, text)
        if row["_deferred"]:
            assert row["kind"] == "left"
            assert isinstance(spec, ChangefeedError) \
                or left_as_documented(schema, text, spec), \
                f"Java leaves a line the parser reads: {text!r} {spec}"
        else:
            assert not isinstance(spec, ChangefeedError), f"Java reads {text!r}: {spec}"
            assert as_spec(schema, row) == spec, text
            read += 1
    return read, len(rows) - read


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _java_samples() -> list[tuple[str, dict[str, Any]]]:
    from changelake.spark.changefeed.dispatch import Unsupported
    from changelake.spark.changefeed.ydb import ydb_columns

    out = []
    for path in sorted([*SAMPLES.glob("ydb-*.jsonl"), *SAMPLES.glob("pattern-ydb-*.jsonl")]):
        table = EXPECTED.get(path.name, (None,))[0]
        if table is None:
            continue
        schema = TableSchema.from_json(table)
        try:
            ydb_columns(schema, list(schema.primary_key))
        except Unsupported:
            continue
        out.append((path.name, table))
    return out


def test_every_ydb_sample_reads_the_same(spark: Any) -> None:
    """Java reads every line of the JSON samples the Spark path converts (`JVM_SAMPLES`); the
    DEBEZIUM_JSON ones it leaves, as documented, and the others' bad lines."""
    samples = _java_samples()
    assert len(samples) >= 10
    for name, table in samples:
        read, left = agree(spark, table, SAMPLES / name)
        if "debezium" in name:
            assert not read, name
        elif name in JVM_SAMPLES:
            assert not left, name
    assert "ydb-test-json-nan-inf.jsonl" in dict(samples)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=ydb_histories())
def test_generated_histories_read_the_same(spark: Any, tmp_path_factory: Any,
                                           history: dict[str, Any]) -> None:
    """Histories of the encoder's tests (Uint64 keys beyond a long, NaN and infinities,
    nulls, barriers): Java reads every line."""
    paths, _, _ = write_ydb(history, tmp_path_factory.mktemp("history"))
    read, left = agree(spark, YDB_TABLE, *paths)
    assert read and not left


#: Each rule's edges, in the table of `LINE_TABLE` (k Uint64 key, v Uint32, s Utf8, d Double,
#: f Bool): Java reads the first list, leaves the second (the parser refuses each).
READ_EDGES = [
    b'{"key":[1],"update":{"s":null,"v":null,"d":null,"f":null}}',
    b'{"key":[1],"update":{"s":null},"ts":[5,6]}',
    b'{"key":[1],"reset":{"s":null}}', b'{"key":[1],"update":{},"newImage":{"s":null}}',
    b'{"key":[1],"erase":{},"oldImage":{"s":null,"d":null}}',
    b'{"key":[1],"update":{"d":"nan"}}', b'{"key":[1],"update":{"d":"inf"}}',
    b'{"key":[1],"update":{"d":"-inf"}}', b'{"key":[1],"reset":{"d":"nan"}}',
    b'{"key":[1],"erase":{},"oldImage":{"d":"-inf"}}',
    b'{"key":[1],"update":{},"newImage":{"d":"inf"},"oldImage":{"d":"nan"}}',
    b'{"key":[1],"update":{"s":"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t"}}',
    b'{"key":[1],"update":{"s":"\\u0041\\u00e9\\u4e2d\\ud83d\\ude00\\uD83D\\uDE00"}}',
    b'{"key":[1],"update":{"s":"\\u0000"}}', b'{"\\u006bey":[1],"upd\\u0061te":{"\\u0073":"x"}}',
    '{"key":[1],"update":{"s":"é\\"中\U0001F600"}}'.encode(),
    '{"key":[1],"update":{"s":"\ufffd"}}'.encode(),
    b'{"key":[18446744073709551615],"update":{"v":4294967295},"ts":[9223372036854775807,'
    b'18446744073709551615]}',
    b'{"key":[0],"update":{"v":0,"d":-0.0}}', b'{"key":[1],"update":{"d":-0}}',
    b'{"key":[1],"update":{"d":18446744073709551616}}',
    b'{"key":[1],"update":{"d":-100000000000000000000000000000}}',
    b'{"key":[1],"update":{"d":1e308,"v":-0}}', b'{"key":[1],"update":{"d":5e-324}}',
    b'{"key":[1],"update":{"d":1e-400}}', b'{"key":[1],"update":{"d":9007199254740993}}',
    b'{"key":[1],"erase":{"x":[1,{"y":null}],"s":1}}', b'{"key":[1],"erase":{"k":"?"}}',
    b'{"resolved":[0,0]}', b'{"resolved":[9223372036854775807,18446744073709551615]}',
    b' \t{"key":[1],"update":{}}\r',
]
LEFT_EDGES = [
    b'{"key":[1],"update":{"d":"NaN"}}', b'{"key":[1],"update":{"d":"Infinity"}}',
    b'{"key":[1],"update":{"d":"+inf"}}', b'{"key":[1],"update":{"d":"1.5"}}',
    b'{"key":[1],"update":{"v":"nan"}}', b'{"key":[1],"update":{"d":NaN}}',
    b'{"key":[1],"update":{"s":"\\ud800"}}', b'{"key":[1],"update":{"s":"\\udc00"}}',
    b'{"key":[1],"update":{"s":"\\ud83dx"}}', '{"key":[1],"update":{"s":"é\\ud83d"}}'.encode(),
    b'{"key":[1],"update":{"s":"\\a"}}', b'{"key":[1],"update":{"s":"\\u00"}}',
    b'{"key":[1],"update":{"d":1e400}}', b'{"key":[1],"update":{"d":-1e400}}',
    b'{"key":[1],"update":{"d":1' + b'0' * 400 + b'}}',
    b'{"key":[1],"update":{"v":4294967296}}', b'{"key":[18446744073709551616],"update":{}}',
    b'{"key":[1],"update":{},"ts":[18446744073709551616,0]}',
    b'{"key":[1],"update":{},"ts":[9223372036854775808,0]}',
    b'{"key":[1],"erase":null}', b'{"key":[1],"erase":[]}', b'{"key":[1],"update":null}',
    b'{"key":[1],"reset":{"k":null}}', b'{"key":[1],"update":{"x":null}}',
    b'null', b'{}', b'[]', b'"x"',
]
#: Lines the parser accepts that Java leaves, as `YdbLine.java` documents.
DOCUMENTED = [
    b'{"key":[null],"update":{}}', b'{"key":[-0],"update":{}}',
    b'{"key":[1],"update":{},"ts":[-0,1]}', b'{"key":[1],"update":{"s":"a","s":"b"}}',
    '{"key":[1],"update":{"s":"\ufeffé"}}'.encode(),
    b'{"key":[1],"update":{"x":1},"newImage":{"s":"a"}}',
    b'{"key":[1],"reset":{"s":1},"oldImage":{"s":"a"}}',
    b'{"key":[1],"update":{},"oldImage":{"s":"a"}}',
    b'{"resolved":[9223372036854775808,0]}',
]


def test_lines_at_each_rules_edge_read_the_same(spark: Any, tmp_path: Path) -> None:
    """The edges, and the parse step's lines of `test_spark_changefeed_ydb.py`: Java reads
    every line of `READ_EDGES` and leaves each of `LEFT_EDGES` and `DOCUMENTED`, all as the
    parser has them."""
    schema = TableSchema.from_json(LINE_TABLE)
    for line in LEFT_EDGES:
        assert isinstance(spec_item(schema, line), ChangefeedError), line
    for line in DOCUMENTED:
        spec = spec_item(schema, line)
        assert not isinstance(spec, ChangefeedError), (line, spec)
        assert left_as_documented(schema, line, spec), line
    read, left = agree(spark, LINE_TABLE, _write(tmp_path / "read.jsonl", READ_EDGES))
    assert (read, left) == (len(READ_EDGES), 0)
    lines = LEFT_EDGES + DOCUMENTED
    assert agree(spark, LINE_TABLE, _write(tmp_path / "left.jsonl", lines)) == (0, len(lines))
    others = REFUSED + ACCEPTED + TYPED_AS_ORJSON + CAREFUL
    read, left = agree(spark, LINE_TABLE, _write(tmp_path / "others.jsonl", others))
    assert read and left


def test_keys_of_two_types_read_the_same(spark: Any, tmp_path: Path) -> None:
    """A key of two columns, not in the table's order, of two YDB types."""
    table = {"columns": [{"name": "a", "type": "Int32"}, {"name": "v", "type": "Utf8"},
                         {"name": "b", "type": "Uint64"}], "primary_key": ["b", "a"]}
    lines = [b'{"key":[5,-1],"update":{"v":null},"ts":[3,1]}',
             b'{"key":[18446744073709551615,-2147483648],"erase":{},"oldImage":{"v":"y"}}',
             b'{"key":[1,2147483648],"reset":{}}', b'{"key":[1,2],"newImage":null,'
             b'"reset":{"v":null},"oldImage":{"v":"z"}}', b'{"resolved":[7,0]}']
    # the third's Int32 is beyond its type: the parser refuses it
    assert agree(spark, table, _write(tmp_path / "two.jsonl", lines)) == (3, 2)


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(allow_nan=False),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "", "x", "é\"\\", "\ud83d\ude00", "1"]),
    st.text(max_size=5))
_MEMBERS = ("key", "update", "reset", "erase", "newImage", "oldImage", "ts", "resolved")


@st.composite
def _mutated(draw: Any) -> bytes:
    """A record of `LINE_TABLE` as YDB writes it, with a few members or values set (to a value
    of any JSON kind), removed or spelled with escapes."""
    record: dict[str, Any] = draw(st.sampled_from([
        {"key": [1], "update": {"v": 1, "s": "a", "d": 1.5, "f": True}, "ts": [5, 6]},
        {"key": [2], "reset": {"s": None}, "ts": [5, 7]},
        {"key": [3], "erase": {}, "ts": [6, 0]},
        {"key": [4], "update": {}, "newImage": {"v": 2, "d": "nan"}, "oldImage": {"s": "b"}},
        {"resolved": [7, 0]}]))
    record = json.loads(json.dumps(record))
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["value", "member", "drop", "key", "ts"]))
        if where == "value":
            body = draw(st.sampled_from([m for m in _MEMBERS[1:6]
                                         if isinstance(record.get(m), dict)] or ["update"]))
            if not isinstance(record.get(body), dict):
                record[body] = {}
            record[body][draw(st.sampled_from(["v", "s", "d", "f", "k", "x"]))] = draw(_VALUES)
        elif where == "member":
            record[draw(st.sampled_from(_MEMBERS))] = draw(st.one_of(_VALUES, st.just({})))
        elif where == "drop" and record:
            record.pop(draw(st.sampled_from(sorted(record))))
        elif where == "key":
            record["key"] = draw(st.lists(_VALUES, max_size=2))
        else:
            record["ts"] = draw(st.lists(st.integers(-1, 2**65), max_size=3))
    line = orjson.dumps(record) if draw(st.booleans()) else \
        json.dumps(record, ensure_ascii=True).encode()  # non-ASCII text as escapes
    return line


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_mutated(), min_size=5, max_size=40))
def test_mutated_records_read_the_same(spark: Any, tmp_path_factory: Any,
                                       lines: list[bytes]) -> None:
    directory = tmp_path_factory.mktemp("mutated")
    agree(spark, LINE_TABLE, _write(directory / "feed.jsonl", lines))


def test_a_batch_with_a_line_java_leaves_goes_to_the_python_path(
        spark: Any, tmp_path: Path) -> None:
    """A batch of records Java reads (nulls in update, "nan") is converted on the Spark path;
    with a line it leaves (a name twice in an object, which the parser accepts: the last
    counts), by the Python path, which says why."""
    from changelake.spark.changefeed.pipeline import convert_frames

    table = tmp_path / "table.json"
    table.write_text(json.dumps(LINE_TABLE))
    good = [b'{"key":[1],"update":{"s":null,"d":"nan"},"ts":[5,0]}', b'{"resolved":[9,0]}']
    path = _write(tmp_path / "feed.jsonl", good)
    got = convert_frames(spark, [path], "ydb", [], table, close=True)
    assert got.path == "jvm", got.reason
    path = _write(tmp_path / "feed2.jsonl", [*good, b'{"key":[2],"update":{"s":"a","s":"b"},'
                                                    b'"ts":[9,0]}'])
    got = convert_frames(spark, [path], "ydb", [], table, close=True)
    assert got.path == "python-udf" and "Java line reader leaves" in (got.reason or "")


def test_lenient_reads_set_aside_the_python_paths_bad_lines(spark: Any, tmp_path: Path) -> None:
    """`pipeline.bad_lines` for YDB: the flawed lines, and each line Java leaves that the
    parser refuses, with the parser's own reason; not a line Java leaves that the parser
    accepts, nor one Java reads."""
    from changelake.spark.changefeed.pipeline import bad_lines
    from changelake.spark.changefeed.read import read_lines

    schema = TableSchema.from_json(LINE_TABLE)
    lines = [*READ_EDGES[:5], *LEFT_EDGES, *DOCUMENTED[:3], b'{"key":[1],"update":{"s":"\xff"}}']
    path = _write(tmp_path / "feed.jsonl", lines)
    got = {r["row"]: r["reason"] for r in bad_lines(
        read_lines(spark, [str(path)]), "ydb", LINE_TABLE, []).collect()}
    rows = sorted(r["row"] for r in read_lines(spark, [str(path)]).frame.collect())
    want = {}
    for row, line in zip(rows, lines, strict=True):
        spec = spec_item(schema, line) if b"\xff" not in line else None
        if isinstance(spec, ChangefeedError):
            want[row] = spec.reason
        elif spec is None:
            want[row] = "not UTF-8 text"
    assert got == want
