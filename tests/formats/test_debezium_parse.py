"""Debezium JSON: envelopes, ops, positions, and value decoding by the Connect schema."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from changelake.errors import ChangefeedError, Location
from changelake.formats.change import NAN, UNCHANGED, Change, Op, Skipped, TxBoundary
from changelake.formats.debezium import PLACEHOLDER, DebeziumParser, decode_value
from changelake.formats.tableschema import TableSchema

HERE = Location("feed.jsonl", 7)
PG_SOURCE = {"connector": "postgresql", "snapshot": "false", "db": "db", "schema": "public",
             "table": "t", "txId": 600, "lsn": 5000, "sequence": '["4000","5000"]'}
ENVELOPE = {"op": "u", "before": None, "after": {"id": 1, "name": "x"}, "source": PG_SOURCE}


def parse(value: Any, parser: DebeziumParser | None = None) -> Any:
    return (parser or DebeziumParser()).parse_line(orjson.dumps(value), HERE)


@pytest.mark.parametrize("wrap", [
    lambda p: p,  # B: bare
    lambda p: {"schema": {"type": "struct", "fields": []}, "payload": p},  # A
    lambda p: {"schema": None, "payload": p},  # C
    lambda p: {"payload": p},  # D
    lambda p: {"key": {"payload": {"id": 1}}, "value": {"payload": p}},  # Kafka record dump
])
def test_every_envelope_gives_the_same_change(wrap: Any) -> None:
    change = parse(wrap(ENVELOPE))
    assert isinstance(change, Change)
    assert change.op is Op.UPDATE and change.after == {"id": 1, "name": "x"}
    assert change.position == (4000, 5000, 5000) and change.time == 4000
    assert change.transaction == "600" and change.table == "public.t"


@pytest.mark.parametrize("line", [b"null", b'{"schema":null,"payload":null}',
                                  b'{"payload":null}'])
def test_tombstones(line: bytes) -> None:
    item = DebeziumParser().parse_line(line, HERE)
    assert isinstance(item, Change) and item.op is Op.TOMBSTONE and item.key is None


def test_tombstone_in_a_kafka_dump_keeps_its_key() -> None:
    item = parse({"key": {"schema": None, "payload": {"id": 9}}, "value": None})
    assert item.op is Op.TOMBSTONE and item.key == {"id": 9}


def test_heartbeat_and_transaction_events() -> None:
    assert parse({"ts_ms": 1}) == Skipped("heartbeat")
    end = parse({"status": "END", "id": "571:999", "event_count": 3,
                 "data_collections": [{"data_collection": "public.t", "event_count": 3}]})
    assert end == TxBoundary("END", "571", 3, (("public.t", 3),))


@pytest.mark.parametrize(("value", "message"), [
    ({"op": "x", "source": PG_SOURCE}, "unknown op 'x'"),
    ({"op": "u", "after": {"id": 1}}, "without a source block"),
    ({"hello": 1}, "not a Debezium change event"),
    ([1, 2], "must be a JSON object or null"),
    ({**ENVELOPE, "source": {**PG_SOURCE, "sequence": "[1,"}}, "source.sequence"),
    ({**ENVELOPE, "source": {"connector": "ydb", "step": "***", "txId": 1}}, "source.step"),
    ({"op": "d", "before": {"id": 1}, "after": {"id": 1}, "source": PG_SOURCE},
     "must not have an after image"),
    ({"status": "END", "id": "1:2", "event_count": None}, "integer event_count"),
])
def test_bad_values_are_one_clear_error_at_the_line(value: Any, message: str) -> None:
    with pytest.raises(ChangefeedError) as caught:
        parse(value)
    assert str(caught.value).startswith("feed.jsonl, line 7: ")
    assert message in str(caught.value)


def test_not_json_names_the_line() -> None:
    with pytest.raises(ChangefeedError, match=r"^feed.jsonl, line 7: not valid JSON"):
        DebeziumParser().parse_line(b'{"op": ', HERE)


def test_snapshot_rows_have_no_time_of_their_own() -> None:
    for flag in ("true", "last", "first_in_data_collection", True):
        snap = parse({"op": "r", "after": {"id": 1}, "source": {**PG_SOURCE, "snapshot": flag}})
        assert snap.op is Op.READ and snap.snapshot and snap.time is None
    incremental = parse({"op": "r", "after": {"id": 1},
                         "source": {"connector": "postgresql", "snapshot": "incremental",
                                    "table": "t"}})
    assert not incremental.snapshot and incremental.position is None


def test_pg_without_sequence_gives_a_transaction_one_time() -> None:
    parser = DebeziumParser()
    source = {"connector": "postgresql", "txId": 7, "lsn": 100, "table": "t"}
    first = parse({"op": "c", "after": {"id": 1}, "source": source}, parser)
    second = parse({"op": "c", "after": {"id": 2}, "source": {**source, "lsn": 130}}, parser)
    assert first.time == second.time == 100
    assert first.position < second.position


def test_mysql_transaction_time_from_gtid_or_file_pos() -> None:
    parser = DebeziumParser()
    source = {"connector": "mysql", "file": "mysql-bin.000002", "pos": 400, "row": 0,
              "gtid": "u:5", "table": "t", "db": "d"}
    a = parse({"op": "c", "after": {"id": 1}, "source": source}, parser)
    b = parse({"op": "c", "after": {"id": 2}, "source": {**source, "pos": 520}}, parser)
    assert a.time == b.time == 2 << 32 | 400 and a.transaction == "u:5"
    c = parse({"op": "c", "after": {"id": 3}, "source": {**source, "gtid": None, "pos": 900},
               "transaction": {"id": "file=mysql-bin.000002,pos=880", "total_order": 1}}, parser)
    assert c.time == 2 << 32 | 880 and c.tx_order == 1


# ------------------------------------------------------------------------------ values


def _b64(unscaled: int, length: int = 2) -> str:
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


DECIMAL = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": "2"}}


@pytest.mark.parametrize(("value", "schema", "expected"), [
    ("AfM=", DECIMAL, "4.99"),
    ("CcM=", DECIMAL, "24.99"),
    ("BAg=", {**DECIMAL, "parameters": {"scale": "4"}}, "0.1032"),
    (_b64(-12345, 3), DECIMAL, "-123.45"),
    (12.5, DECIMAL, "12.5"),  # decimal.format=NUMERIC
    # NUMERIC(38, 2) at its widest: exact, not rounded to Python's default 28 digits
    (_b64(12345678901234567890123456789012345678, 16), DECIMAL,
     "123456789012345678901234567890123456.78"),
    ({"scale": 40, "value": _b64(-(10**39) - 1, 17)}, {
        "type": "struct", "name": "io.debezium.data.VariableScaleDecimal"},
     "-0.1000000000000000000000000000000000000001"),
    ({"scale": 3, "value": _b64(1234567, 4)}, {"type": "struct",
                                                "name": "io.debezium.data.VariableScaleDecimal"},
     "1234.567"),
    (17700, {"type": "int32", "name": "io.debezium.time.Date"}, "2018-06-18"),
    (3_723_004, {"type": "int32", "name": "io.debezium.time.Time"}, "01:02:03.004"),
    (3_723_000_005, {"type": "int64", "name": "io.debezium.time.MicroTime"}, "01:02:03.000005"),
    (1529507596945104, {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
     "2018-06-20T15:13:16.945104"),
    (1529507596945, {"type": "int64", "name": "io.debezium.time.Timestamp"},
     "2018-06-20T15:13:16.945"),
    (1529507596945104123, {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
     "2018-06-20T15:13:16.945104123"),
    (9223372036825200000, {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
     "infinity"),
    ("2018-06-20T13:13:16.945104Z", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
     "2018-06-20T13:13:16.945104Z"),
    ("AAEC/w==", {"type": "bytes"}, "\x00\x01\x02\xff"),
    ("NaN", {"type": "double"}, NAN),
    ('{"a": 1}', {"type": "string", "name": "io.debezium.data.Json"}, '{"a": 1}'),
    (9223372036854775807, {"type": "int64"}, 9223372036854775807),
])
def test_decode_by_connect_schema(value: Any, schema: dict[str, Any], expected: Any) -> None:
    got = decode_value(value, schema)
    assert got is expected if expected is NAN else got == expected


@pytest.mark.parametrize("value", [PLACEHOLDER, base64.b64encode(PLACEHOLDER.encode()).decode(),
                                   [PLACEHOLDER]])
def test_unavailable_placeholder_is_unchanged_not_null(value: Any) -> None:
    assert decode_value(value, None) is UNCHANGED
    assert decode_value(value, {"type": "bytes"}) is UNCHANGED


def test_schema_payload_decodes_the_after_image_in_schema_order() -> None:
    schema = {"type": "struct", "fields": [
        {"field": "after", "type": "struct", "fields": [
            {"field": "id", "type": "int32"}, {"field": "price", **DECIMAL}]}]}
    change = parse({"schema": schema, "payload": {**ENVELOPE, "after": {"price": "AfM=",
                                                                         "id": 3}}})
    assert list(change.after.items()) == [("id", 3), ("price", "4.99")]


def test_schemaless_decodes_with_the_table_schema_connect_types() -> None:
    table = TableSchema.from_json({"columns": [{"name": "id"},
                                               {"name": "price", "debezium": DECIMAL}],
                                   "primary_key": ["id"]})
    change = parse({**ENVELOPE, "after": {"id": 3, "price": "CcM="}}, DebeziumParser(table))
    assert change.after == {"id": 3, "price": "24.99"}


def test_bad_decimal_names_the_column() -> None:
    schema = {"type": "struct", "fields": [
        {"field": "after", "type": "struct", "fields": [{"field": "price", **DECIMAL}]}]}
    with pytest.raises(ChangefeedError, match=r"line 7: after.price: "):
        parse({"schema": schema, "payload": {**ENVELOPE, "after": {"price": "not base64!"}}})


LONG = "x" * 20_000


@pytest.mark.parametrize("value", [
    {"op": LONG, "after": {"id": 1}},
    {"status": LONG, "id": "1"},
    {"status": "END", "id": "1", "event_count": LONG},
    {"op": "c", "after": {"id": 1}, "source": {"connector": "postgresql", "sequence": LONG,
                                               "lsn": 1}},
    {"op": "c", "after": {"id": 1}, "source": {"snapshot": [LONG]}},
])
def test_a_long_value_is_named_in_a_short_line(value: Any) -> None:
    """A value the input makes 20 KB long is cut where an error names it (the fuzz campaign
    of test_fuzz_lines.py found whole values quoted)."""
    with pytest.raises(ChangefeedError) as caught:
        DebeziumParser().parse(value, Location("f.jsonl", 3))
    text = str(caught.value)
    assert text.startswith("f.jsonl, line 3: ") and len(text) < 400, text[:500]


def test_events_of_two_long_table_names_are_named_in_a_short_line(tmp_path) -> None:
    from changelake.convert import encode_changefeed

    lines = [orjson.dumps({"op": "c", "after": {"id": 1}, "source": {
        "connector": "mysql", "db": "d", "table": name, "file": "mysql-bin.000003", "pos": 1,
        "row": 0}})
        for name in (LONG, LONG + "y")]
    path = tmp_path / "two.jsonl"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ChangefeedError) as caught:
        list(encode_changefeed([path], source="debezium", keys=None, table_schema=None,
                               close=False, lenient=False))
    text = str(caught.value)
    assert "events of two tables" in text and len(text) < 400, text[:500]
