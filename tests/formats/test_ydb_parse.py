"""YDB JSON records: keys through the table schema, modes, types, barriers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from changelake.errors import ChangefeedError, Location, SchemaError
from changelake.formats.change import NAN, UNCHANGED, Op, Resolved
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser, decode_value

SCHEMA = TableSchema.from_json({
    "columns": [{"name": "id", "type": "Uint64"}, {"name": "part", "type": "Utf8"},
                {"name": "name", "type": "Optional<Utf8>"}, {"name": "score", "type": "Double"},
                {"name": "blob", "type": "String"}],
    "primary_key": ["id", "part"],
})
HERE = Location("p0.jsonl", 3)


def parse(value: Any) -> Any:
    return YdbParser(SCHEMA).parse_line(orjson.dumps(value), HERE)


def test_updates_mode_is_partial_and_reset_is_complete() -> None:
    upd = parse({"update": {"name": "a"}, "key": [2**64 - 1, "x"], "ts": [10, 2**64 - 1]})
    assert upd.op is Op.UPSERT
    assert upd.key == {"id": 2**64 - 1, "part": "x"}
    assert upd.after == {"id": 2**64 - 1, "part": "x", "name": "a", "score": UNCHANGED,
                         "blob": UNCHANGED}
    assert upd.position == (10, 2**64 - 1) and upd.time == 10
    reset = parse({"reset": {"name": "a"}, "key": [1, "x"]})
    assert reset.after == {"id": 1, "part": "x", "name": "a", "score": None, "blob": None}
    assert reset.time is None and reset.position is None


def test_images() -> None:
    both = parse({"update": {}, "key": [1, "x"], "newImage": {"name": "n", "score": 1.5,
                                                              "blob": None},
                  "oldImage": {"name": "o", "score": "nan", "blob": "AAE="}})
    assert both.op is Op.UPDATE
    assert both.before == {"id": 1, "part": "x", "name": "o", "score": NAN, "blob": "\x00\x01"}
    assert both.after == {"id": 1, "part": "x", "name": "n", "score": 1.5, "blob": None}
    old_only = parse({"update": {}, "key": [1, "x"], "oldImage": {"name": "o"}})
    assert old_only.op is Op.UPDATE and old_only.after is None
    erase = parse({"erase": {}, "key": [1, "x"]})
    assert erase.op is Op.DELETE and erase.before is None


def test_resolved() -> None:
    assert parse({"resolved": [1670792500000, 0]}) == Resolved((1670792500000, 0))
    assert Resolved((5, 0)).frontier == 5 and Resolved((5, 3)).frontier == 5


@pytest.mark.parametrize(("value", "message"), [
    ({"update": {}, "key": [1]}, "key has 1 values, the table's primary key"),
    ({"update": {}, "erase": {}, "key": [1, "x"]}, "exactly one of update, reset, erase"),
    ({"update": {"nope": 1}, "key": [1, "x"]}, "columns ['nope']"),
    ({"update": {}, "key": [1, "x"], "ts": [1]}, "ts must be [step, txId]"),
    ({"update": {}, "key": [-1, "x"], "ts": [1, 2]}, "column id: Uint64"),
    ({"update": {"score": "NaN"}, "key": [1, "x"]}, "column score: Double"),
    ({"resolved": [1, 0], "key": [1]}, "must hold nothing else"),
    ({"update": {}, "key": [1, "x"], "extra": 1}, "unknown fields ['extra']"),
    ({"update": {"blob": "%%%"}, "key": [1, "x"]}, "column blob"),
])
def test_bad_records_name_the_line(value: Any, message: str) -> None:
    with pytest.raises(ChangefeedError) as caught:
        parse(value)
    assert str(caught.value).startswith("p0.jsonl, line 3: ")
    assert message in str(caught.value)


@pytest.mark.parametrize(("value", "kind", "expected"), [
    ("2022-06-24T00:00:00.000000Z", "Date", "2022-06-24"),
    ("2022-06-24T11:35:00.000000Z", "Timestamp", "2022-06-24T11:35:00.000000Z"),
    (19167, "Date32", "2022-06-24"),
    (1656070500, "Datetime64", "2022-06-24T11:35:00Z"),
    ("12.345", "Decimal(22,9)", "12.345"),
    ({"b": [1, 2], "a": None}, "JsonDocument", '{"a":null,"b":[1,2]}'),
    ("inf", "Float", float("inf")),
    (-5, "Interval", -5),
    (18446744073709551615, "Uint64", 18446744073709551615),
])
def test_value_encodings(value: Any, kind: str, expected: Any) -> None:
    assert decode_value(value, kind) == expected


def test_schema_errors() -> None:
    with pytest.raises(SchemaError, match="primary_key columns"):
        TableSchema.from_json({"columns": [{"name": "a"}], "primary_key": ["b"]})
    with pytest.raises(SchemaError, match="duplicate column"):
        TableSchema.from_json({"columns": ["a", "a"], "primary_key": []})
    with pytest.raises(ChangefeedError, match="needs its primary_key"):
        YdbParser(TableSchema.from_json({"columns": ["a"], "primary_key": []}))
