"""Avro logical types: one plain form whatever carries the value, and every writer takes it.

The reference is fastavro writing its own Python values into a container file; the plain form
is what reading that file gives. The JSON encoding (Avro JSON lines) and both writers must
agree with it value for value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
from typing import Any

import fastavro
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from changelake.errors import SchemaError
from changelake.formats.avro_logical import logical
from changelake.formats.materialize import (
    CdcSchema,
    read_json_lines,
    read_ocf,
    write_json_lines,
    write_ocf,
)
from changelake.protocol import Progress, Updates, collect
from changelake.values import Record

UTC = dt.UTC

TYPES: dict[str, tuple[Any, st.SearchStrategy]] = {
    "decimal": (
        {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        st.integers(-(10**10) + 1, 10**10 - 1).map(lambda n: decimal.Decimal(n).scaleb(-2)),
    ),
    "fixed_decimal": (
        {"type": "fixed", "name": "u64", "size": 9, "logicalType": "decimal",
         "precision": 20, "scale": 0},
        st.integers(0, 2**64 - 1).map(decimal.Decimal),
    ),
    "date": ({"type": "int", "logicalType": "date"}, st.dates()),
    "time_millis": (
        {"type": "int", "logicalType": "time-millis"},
        st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)),
    ),
    "time_micros": ({"type": "long", "logicalType": "time-micros"}, st.times()),
    "timestamp_micros": (
        {"type": "long", "logicalType": "timestamp-micros"},
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)).map(
            lambda d: d.replace(tzinfo=UTC)),
    ),
    "timestamp_millis": (
        {"type": "long", "logicalType": "timestamp-millis"},
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)).map(
            lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000, tzinfo=UTC)),
    ),
    "local_timestamp_micros": (
        {"type": "long", "logicalType": "local-timestamp-micros"},
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)),
    ),
    "uuid": ({"type": "string", "logicalType": "uuid"}, st.uuids()),
}

SCHEMA = CdcSchema.for_fields(
    [{"name": "id", "type": "long"}]
    + [{"name": name, "type": ["null", avro]} for name, (avro, _) in TYPES.items()]
)
ROWS = st.lists(st.fixed_dictionaries({name: values for name, (_, values) in TYPES.items()}),
                min_size=1, max_size=4)


def _reference(rows: list[dict[str, Any]]) -> bytes:
    """fastavro's own container file of the rows (Python values), at time 1, closed."""
    records = [[{"data": {"id": i, **row}, "time": 1, "diff": 1} for i, row in enumerate(rows)],
               {"lower": [0], "upper": [], "counts": [{"time": 1, "count": len(rows)}]}]
    out = io.BytesIO()
    fastavro.writer(out, SCHEMA.parsed, records)
    return out.getvalue()


def _history(messages: Any) -> list[tuple[Record, int, int]]:
    result = collect(list(messages))
    assert result.frontier.is_closed
    return sorted(result.updates, key=lambda u: u[0].get("id"))


def _messages(history: list[tuple[Record, int, int]]) -> list[Any]:
    return [Updates(history), Progress.make([0], [], [(1, len(history))])]


@settings(max_examples=60, deadline=None)
@given(ROWS)
def test_every_carrier_and_writer_gives_the_container_files_plain_form(rows):
    plain = _history(read_ocf(io.BytesIO(_reference(rows)), name="ref.avro"))
    for name in TYPES:  # logical values are text, never the underlying bytes or counts
        assert all(isinstance(d.get(name), str) for d, _, _ in plain)

    text = io.BytesIO()
    write_json_lines(text, _messages(plain), SCHEMA)
    assert _history(read_json_lines(io.BytesIO(text.getvalue()), name="j", schema=SCHEMA)) \
        == plain

    container = io.BytesIO()
    write_ocf(container, _messages(plain), SCHEMA)
    assert _history(read_ocf(io.BytesIO(container.getvalue()), name="w.avro")) == plain

    # A reader's text parses back, unchecked (`from_plain`, the Spark source's way), to the
    # value the checked parse gives and to the value fastavro wrote.
    for (data, _, _), row in zip(plain, rows, strict=True):
        for name, (avro, _) in TYPES.items():
            kind = logical(avro, {})
            assert kind is not None
            back = kind.from_plain(data.get(name))
            assert back == kind.to_python(data.get(name)) == row[name]
            assert type(back) is type(row[name])


def test_avro_json_values_read_as_their_text():
    line = (b'{"array":[{"data":{"id":1,"decimal":{"bytes":"\\u0004\\u00e2"},'
            b'"date":{"int":19724},"timestamp_micros":{"long":1704164645000006},'
            b'"uuid":{"string":"6BA7B810-9DAD-11D1-80B4-00C04FD430C8"}},"time":1,"diff":1}]}\n'
            b'{"com.materialize.cdc.progress":{"lower":[0],"upper":[],'
            b'"counts":[{"time":1,"count":1}]}}\n')
    schema = CdcSchema.for_fields([
        {"name": "id", "type": "long"},
        {"name": "decimal", "type": ["null", TYPES["decimal"][0]]},
        {"name": "date", "type": ["null", TYPES["date"][0]]},
        {"name": "timestamp_micros", "type": ["null", TYPES["timestamp_micros"][0]]},
        {"name": "uuid", "type": ["null", TYPES["uuid"][0]]},
    ])
    ((data, _, _),) = _history(read_json_lines(io.BytesIO(line), name="j", schema=schema))
    assert dict(data) == {"id": 1, "decimal": "12.50", "date": "2024-01-02",
                          "timestamp_micros": "2024-01-02T03:04:05.000006+00:00",
                          "uuid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"}


@pytest.mark.parametrize(("column", "value", "message"), [
    ("decimal", "12.555", "more digits after the point than decimal\\(10, 2\\)"),
    ("decimal", "123456789012", "more digits than decimal\\(10, 2\\) holds"),
    ("decimal", "NaN", "not a finite decimal"),
    ("date", "2024-13-01", "is not a date"),
    ("uuid", "not-a-uuid", "is not a uuid"),
    ("date", 19724, "expected date text"),
])
def test_text_no_value_of_the_type_has_is_refused_by_both_writers(column, value, message):
    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": column, "type": TYPES[column][0]}])
    messages = _messages([(Record((("id", 1), (column, value))), 1, 1)])
    with pytest.raises(ValueError, match=message):
        write_json_lines(io.BytesIO(), messages, schema)
    with pytest.raises(SchemaError, match=message):
        write_ocf(io.BytesIO(), messages, schema)


def test_a_union_takes_text_in_the_branch_whose_type_holds_it():
    schema = CdcSchema.for_fields([{"name": "v", "type": [TYPES["decimal"][0], "string"]}])
    text = io.BytesIO()
    history = [(Record((("v", "12.50"),)), 1, 1), (Record((("v", "twelve"),)), 1, 1)]
    write_json_lines(text, _messages(history), schema)
    updates = orjson.loads(text.getvalue().splitlines()[0])["array"]
    assert [u["data"]["v"] for u in updates] == [{"bytes": "\x04\xe2"}, {"string": "twelve"}]


def test_other_annotations_are_their_underlying_type():
    schema = CdcSchema.for_fields([
        {"name": "a", "type": {"type": "long", "logicalType": "date"}},  # date is on int
        {"name": "b", "type": {"type": "bytes", "logicalType": "decimal"}},  # no precision
        {"name": "c", "type": {"type": "string", "logicalType": "made-up"}},
    ])
    line = (b'{"array":[{"data":{"a":5,"b":"\\u0001","c":"x"},"time":1,"diff":1}]}\n'
            b'{"com.materialize.cdc.progress":{"lower":[0],"upper":[],'
            b'"counts":[{"time":1,"count":1}]}}\n')
    ((data, _, _),) = _history(read_json_lines(io.BytesIO(line), name="j", schema=schema))
    assert dict(data) == {"a": 5, "b": "\x01", "c": "x"}


def test_a_value_for_a_nullable_type_is_refused_with_that_types_reason():
    schema = CdcSchema.for_fields([{"name": "p", "type": ["null", TYPES["decimal"][0]]}])
    messages = _messages([(Record((("p", "1.234"),)), 1, 1)])
    with pytest.raises(ValueError, match=r"data\.p: '1\.234' has more digits after the point"):
        write_json_lines(io.BytesIO(), messages, schema)


def test_an_instant_without_an_offset_is_utc_whatever_the_local_time_zone(monkeypatch):
    """fastavro's writer takes a naive datetime for a `timestamp-*` in the local time zone;
    the text of an instant without an offset is UTC's, on every machine."""
    from time import tzset

    schema = CdcSchema.for_fields([{"name": "at", "type": TYPES["timestamp_micros"][0]}])
    messages = _messages([(Record((("at", "2024-01-01T00:00:00"),)), 1, 1)])
    monkeypatch.setenv("TZ", "America/New_York")
    tzset()
    try:
        container, text = io.BytesIO(), io.BytesIO()
        write_ocf(container, messages, schema)
        write_json_lines(text, messages, schema)
    finally:
        monkeypatch.undo()
        tzset()
    for got in (read_ocf(io.BytesIO(container.getvalue()), name="o"),
                read_json_lines(io.BytesIO(text.getvalue()), name="j", schema=schema)):
        ((data, _, _),) = _history(got)
        assert data.get("at") == "2024-01-01T00:00:00+00:00"
