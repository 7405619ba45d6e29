"""Materialize CDC codecs: the seed examples, every carrier, and clear errors for bad input."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from changelake.errors import InputError, Location, SchemaError
from changelake.formats.materialize import (
    CdcSchema,
    decode_framed,
    encode_confluent,
    encode_single_object,
    read_all,
    read_json_lines,
    read_ocf,
    write_json_lines,
    write_ocf,
)
from changelake.protocol import Antichain, Progress, Updates, collect
from changelake.values import Record
from tests.support.seeds import (
    seed000_changefeed,
    seed000_schema,
    seed002_changefeed,
    seed002_schema,
)

SEED000_HISTORY = [
    (Record((("id", 5), ("price", 12))), 4, 1),
    (Record((("id", 5), ("price", 10))), 5, 1),
    (Record((("id", 5), ("price", 12))), 5, -1),
    (Record((("id", 5), ("price", 10))), 6, -1),
]


def lines(text: str) -> io.BytesIO:
    return io.BytesIO(text.encode())


def test_seed000_doubled_brace_is_an_error_naming_the_line() -> None:
    schema = CdcSchema.from_json(seed000_schema())
    with pytest.raises(InputError) as info:
        list(read_json_lines(lines(seed000_changefeed()), name="seed000.jsonl", schema=schema))
    assert info.value.location == Location("seed000.jsonl", 1)
    assert "not valid JSON" in str(info.value)


def test_seed000_lenient_sets_the_line_aside_and_keeps_the_rest() -> None:
    schema = CdcSchema.from_json(seed000_schema())
    aside: list = []
    messages = list(read_json_lines(lines(seed000_changefeed()), name="s", schema=schema,
                                    set_aside=aside.append))
    assert [a.location.line for a in aside] == [1] and len(messages) == 5
    got = collect(messages)
    # the missing update at time 5 holds the frontier at 5: nothing after it is reported
    assert got.updates == SEED000_HISTORY[:1] and got.frontier == Antichain([5])


def test_a_byte_order_mark_opening_a_file_is_dropped_and_elsewhere_is_bad_json() -> None:
    """A file may open with a UTF-8 BOM (Spark's text reader drops it there too); on any other
    line, or as a record of an iterable (Kafka values are not files), it is bad JSON."""
    schema = CdcSchema.from_json(seed002_schema())
    text = seed002_changefeed().encode()
    plain = list(read_json_lines(io.BytesIO(text), name="f", schema=schema))
    assert list(read_json_lines(io.BytesIO(b"\xef\xbb\xbf" + text), name="f",
                                schema=schema)) == plain
    first, rest = text.split(b"\n", 1)
    for source, line in [(io.BytesIO(first + b"\n\xef\xbb\xbf" + rest), 2),
                         ([b"\xef\xbb\xbf" + first], 1)]:
        with pytest.raises(InputError) as info:
            list(read_json_lines(source, name="f", schema=schema))
        assert info.value.location == Location("f", line)
        assert "byte order mark" in str(info.value)


def test_seed000_decodes_to_the_history_it_describes() -> None:
    schema = CdcSchema.from_json(seed000_schema())
    text = seed000_changefeed().replace("{{", "{", 1)
    got = collect(read_json_lines(lines(text), name="s", schema=schema))
    assert sorted(got.updates, key=lambda u: (u[1], -u[2])) == SEED000_HISTORY
    assert got.frontier == Antichain([10])


def test_seed002_decodes_to_the_history_it_describes() -> None:
    """Its progress statement starts at 1424849130110, so the reader starts there."""
    schema = CdcSchema.from_json(seed002_schema())
    messages = list(read_json_lines(lines(seed002_changefeed()), name="s", schema=schema))
    assert len(messages) == 5
    start = Antichain([1424849130110])
    got = collect(messages, since=start)
    row = lambda price: Record((("id", 5), ("price", price)))  # noqa: E731
    assert sorted(got.updates, key=lambda u: (u[1], -u[2])) == [
        (row(10), 1424849130111, 1),
        (row(12), 1424849130111, -1),
        (row(12), 1424849130112, 1),
        (row(10), 1424849130113, -1),
    ]
    assert got.frontier == Antichain([1424849130116])
    # from 0, the statement cannot be grafted: nothing is claimed about [0, ...110)
    assert collect(messages).frontier == Antichain([0])


def test_without_a_schema_primitive_unions_are_unwrapped() -> None:
    text = seed000_changefeed().replace("{{", "{", 1)
    got = collect(read_json_lines(lines(text), name="s"))
    assert got.updates[0] == (Record((("id", 5), ("price", 12))), 4, 1)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"array":[{"data":{"id":"5","price":null},"time":1,"diff":1}]}',
         "data.id: expected long"),
        ('{"array":[{"data":{"id":5,"price":{"string":"x"}},"time":1,"diff":1}]}',
         "union branch 'string'"),
        ('{"array":[{"data":{"id":5,"price":7},"time":1,"diff":1}]}', "union value"),
        ('{"array":[{"data":{"id":5},"time":1,"diff":1}]}', "data.price: missing field"),
        ('{"array":[{"data":{"id":5,"price":null},"time":-1,"diff":1}]}', "negative"),
        ('{"array":[{"data":{"id":5,"price":null},"time":1}]}', "missing field"),
        ('{"com.materialize.cdc.progress":{"lower":[0],"upper":[1]}}', "missing field"),
        ('{"updates":[]}', "branch 'updates'"),
        ("[1,2]", "expected {\"array\""),
    ],
)
def test_wrong_types_and_shapes_name_the_line_and_field(line: str, message: str) -> None:
    schema = CdcSchema.from_json(seed000_schema())
    text = '{"com.materialize.cdc.progress":{"lower":[0],"upper":[1],"counts":[]}}\n' + line
    with pytest.raises(InputError) as info:
        list(read_json_lines(lines(text), name="in.jsonl", schema=schema))
    assert info.value.location == Location("in.jsonl", 2)
    assert message in str(info.value)


def test_unknown_shape_without_schema() -> None:
    with pytest.raises(InputError, match=r"line 1: .*unknown message branch"):
        list(read_json_lines(lines('{"nope": 1}\n'), name="x"))
    with pytest.raises(InputError, match="diff must be an integer"):
        list(read_json_lines(lines('{"array":[{"data":{},"time":1,"diff":"1"}]}'), name="x"))


def _some_messages() -> list:
    schema_rows = [Record((("id", i), ("price", None if i % 3 else i))) for i in range(50)]
    return [
        Updates([(r, 1 + i % 4, 1) for i, r in enumerate(schema_rows)]),
        Progress.make([0], [5], [(1, 13), (2, 13), (3, 12), (4, 12)]),
        Progress.make([5], []),
    ]


def test_ocf_and_json_lines_round_trip() -> None:
    schema = CdcSchema.from_json(seed000_schema())
    messages = _some_messages()
    ocf = io.BytesIO()
    write_ocf(ocf, messages, schema)
    ocf.seek(0)
    assert [m for m in read_ocf(ocf, name="x")] == messages
    text = io.BytesIO()
    write_json_lines(text, messages, schema)
    text.seek(0)
    assert list(read_json_lines(text, name="x", schema=schema)) == messages


def test_truncated_avro_names_the_offset_and_keeps_earlier_blocks(tmp_path: Path) -> None:
    schema = CdcSchema.from_json(seed000_schema())
    messages = _some_messages() * 200
    ocf = io.BytesIO()
    import fastavro

    fastavro.writer(ocf, schema.parsed,
                    [m for m in _python_records(messages, schema)], sync_interval=500)
    data = ocf.getvalue()
    path = tmp_path / "cut.avro"
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(InputError, match=r"cut.avro, offset \d+: truncated or corrupt"):
        list(read_all([path]))
    aside: list = []
    kept = list(read_all([path], set_aside=aside.append))
    assert 0 < len(kept) < len(messages) and kept == messages[: len(kept)]
    assert len(aside) == 1 and aside[0].location.offset is not None


def _python_records(messages: list, schema: CdcSchema) -> list:
    from changelake.formats.materialize.write import _python_datum

    return [_python_datum(m, schema) for m in messages]


def test_not_an_avro_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.avro"
    path.write_bytes(b"Obj\x01garbage")
    with pytest.raises(InputError, match=r"bad\.avro, offset 0: not a readable Avro"):
        list(read_all([path]))


def test_framed_messages_round_trip_and_fail_clearly() -> None:
    schema = CdcSchema.from_json(seed000_schema())
    where = Location("topic", offset=42)
    for message in _some_messages():
        assert decode_framed(encode_confluent(message, schema, 7), {7: schema}, where) == message
        framed = encode_single_object(message, schema)
        assert decode_framed(framed, {schema.fingerprint(): schema}, where) == message
    good = encode_confluent(_some_messages()[0], schema, 7)
    with pytest.raises(InputError, match="topic, offset 42: unknown schema id 8"):
        decode_framed(encode_confluent(_some_messages()[0], schema, 8), {7: schema}, where)
    with pytest.raises(InputError, match=r"truncated or corrupt Avro message \(\d+ bytes after "
                                         "the schema id 7\\): it ends before the datum does"):
        decode_framed(good[:5], {7: schema}, where)  # fastavro's own reason was empty
    with pytest.raises(InputError, match="truncated or corrupt"):
        decode_framed(good[:-7], {7: schema}, where)
    # Branch 9 of a two-branch union: fastavro's reason was "list index out of range".
    with pytest.raises(InputError, match="an index beyond the schema's union branches"):
        decode_framed(good[:5] + b"\x12" + good[6:], {7: schema}, where)
    with pytest.raises(InputError, match="not a Confluent-framed"):
        decode_framed(b"{}", {7: schema}, where)


# ----------------------------------------------------------- framings against known bytes

# The Avro specification's reference CRC-64-AVRO ("Rabin") fingerprint, written out here so
# that the codecs are checked against the spec, not against fastavro's implementation.
_EMPTY64 = 0xC15D213AA4D7A795


def _rabin(data: bytes) -> int:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_reference_fingerprint_matches_published_vectors() -> None:
    """Apache Avro's published vectors (share/test/data/schema-tests.txt), as signed longs."""
    for canonical, published in [
        ('"null"', 7195948357588979594),
        ('"int"', 8247732601305521295),
        ('{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}',
         7843277075252814651),
    ]:
        assert _rabin(canonical.encode()) == published % 2**64, canonical


# The CDC schema of one `long` column in Parsing Canonical Form, written by hand from the
# spec's rules (full names, attributes in name/type/fields/items order, no whitespace).
_TINY_CANONICAL = (
    '[{"type":"array","items":{"name":"com.materialize.cdc.update","type":"record","fields":['
    '{"name":"data","type":{"name":"com.materialize.cdc.data","type":"record","fields":['
    '{"name":"id","type":"long"}]}},{"name":"time","type":"long"},{"name":"diff","type":"long"}'
    ']}},{"name":"com.materialize.cdc.progress","type":"record","fields":['
    '{"name":"lower","type":{"type":"array","items":"long"}},'
    '{"name":"upper","type":{"type":"array","items":"long"}},'
    '{"name":"counts","type":{"type":"array","items":{"name":"com.materialize.cdc.counts",'
    '"type":"record","fields":[{"name":"time","type":"long"},{"name":"count","type":"long"}]}}}'
    ']}]'
)
_TINY = CdcSchema.for_fields([{"name": "id", "type": "long"}])
# Avro binary by hand: union branch (zig-zag varint), array blocks (count, items, 0), longs.
_TINY_MESSAGES = [
    (Updates([(Record((("id", 5),)), 4, 1), (Record((("id", -1),)), 300, -1)]),
     bytes([0x00,                     # branch 0: the array of updates
            0x04,                     # a block of 2 items
            0x0A, 0x08, 0x02,         # id 5, time 4, diff 1
            0x01, 0xD8, 0x04, 0x01,   # id -1, time 300 (varint d8 04), diff -1
            0x00])),                  # end of the array
    (Progress.make([0], [5], [(1, 2)]),
     bytes([0x02,                     # branch 1: progress
            0x02, 0x00, 0x00,         # lower [0]
            0x02, 0x0A, 0x00,         # upper [5]
            0x02, 0x02, 0x04, 0x00])),  # counts [(time 1, count 2)]
]




def test_tiny_schema_canonical_form() -> None:
    from fastavro.schema import to_parsing_canonical_form

    assert to_parsing_canonical_form(_TINY.avro) == _TINY_CANONICAL


def test_tiny_schema_fingerprint_is_little_endian_crc64_avro() -> None:
    expected = _rabin(_TINY_CANONICAL.encode()).to_bytes(8, "little")
    assert _TINY.fingerprint() == expected


def test_confluent_frame_is_the_specified_bytes() -> None:
    """Confluent wire format: magic 0x00, the schema id as 4 bytes big-endian, Avro binary."""
    where = Location("topic", offset=0)
    for message, body in _TINY_MESSAGES:
        framed = encode_confluent(message, _TINY, 0x01020304)
        assert framed == b"\x00\x01\x02\x03\x04" + body
        assert decode_framed(framed, {0x01020304: _TINY}, where) == message


def test_single_object_frame_is_the_specified_bytes() -> None:
    """Avro single-object encoding: C3 01, the CRC-64-AVRO fingerprint of the canonical form
    as 8 bytes little-endian, Avro binary."""
    where = Location("topic", offset=0)
    fingerprint = _rabin(_TINY_CANONICAL.encode()).to_bytes(8, "little")
    for message, body in _TINY_MESSAGES:
        framed = encode_single_object(message, _TINY)
        assert framed == b"\xc3\x01" + fingerprint + body
        assert decode_framed(framed, {fingerprint: _TINY}, where) == message


def test_schema_validation() -> None:
    with pytest.raises(SchemaError, match="union of two branches"):
        CdcSchema.from_json({"type": "record", "name": "x", "fields": []})
    with pytest.raises(SchemaError, match="not a valid Avro schema"):
        CdcSchema.from_json([{"type": "nonsense"}])
    built = CdcSchema.for_fields([{"name": "id", "type": "long"}])
    assert built.data_fields == ("id",)
    # The fingerprint is of the canonical form: names, types and order, not layout or docs.
    seed = seed000_schema()
    import orjson

    relaid = orjson.loads(orjson.dumps(seed, option=orjson.OPT_INDENT_2))
    relaid[1]["doc"] = "documentation is not part of the canonical form"
    assert CdcSchema.from_json(relaid).fingerprint() == CdcSchema.from_json(seed).fingerprint()
    renamed = orjson.loads(orjson.dumps(seed).replace(b'"price"', b'"cost"'))
    assert CdcSchema.from_json(renamed).fingerprint() != CdcSchema.from_json(seed).fingerprint()


def test_nan_and_infinities_survive_every_carrier_and_deduplicate() -> None:
    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": "x", "type": ["null", "double"]}])
    rows = [Record((("id", i), ("x", v))) for i, v in
            enumerate([float("nan"), float("inf"), float("-inf"), 1.5])]
    messages = [Updates([(r, 1, 1) for r in rows]), Progress.make([0], [], [(1, 4)])]
    text = io.BytesIO()
    write_json_lines(text, messages, schema)
    assert b'{"double":"NaN"}' in text.getvalue() and b'"Infinity"' in text.getvalue()
    ocf = io.BytesIO()
    write_ocf(ocf, messages, schema)
    for carrier in (lambda: read_json_lines(io.BytesIO(text.getvalue()), name="j", schema=schema),
                    lambda: read_ocf(io.BytesIO(ocf.getvalue()), name="o")):
        decoded = list(carrier()) + list(carrier())  # every message twice
        got = collect(decoded)
        assert got.frontier.is_closed and len(got.updates) == 4  # NaN rows deduplicate
        values = sorted(str(d.get("x")) for d, _, _ in got.updates)
        assert values == ["-inf", "1.5", "inf", "nan"]


def test_a_schema_file_may_hold_the_rows_record_alone(tmp_path: Path) -> None:
    """`--schema FILE` takes the union, or the record of the rows that the union would hold:
    both read seed 000's changefeed to the same history."""
    import orjson

    from changelake.formats.materialize import load_schema

    union = seed000_schema()
    record = union[0]["items"]["fields"][0]["type"]
    assert record["type"] == "record"
    files = {}
    for name, value in (("union", union), ("record", record)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_bytes(orjson.dumps(value))
    histories = []
    for name in files:
        schema = load_schema(files[name])
        assert schema.data_fields == ("id", "price")
        messages = read_json_lines(io.BytesIO(seed000_changefeed().replace("{{", "{", 1).encode()),
                                   name="feed", schema=schema)
        histories.append(sorted(collect(messages).updates, key=repr))
    assert histories[0] == histories[1] and len(histories[0]) == len(SEED000_HISTORY)

    # its names resolve as they did: a named type defined in one field, referred to in another
    nested = {"type": "record", "name": "Row", "namespace": "com.example", "fields": [
        {"name": "home", "type": {"type": "record", "name": "Addr",
                                  "fields": [{"name": "city", "type": "string"}]}},
        {"name": "work", "type": ["null", "com.example.Addr"]}]}
    path = tmp_path / "nested.json"
    path.write_bytes(orjson.dumps(nested))
    assert load_schema(path).data_fields == ("home", "work")

    path.write_bytes(orjson.dumps({"type": "record", "name": "Row"}))
    with pytest.raises(SchemaError, match=r"nested\.json: not a valid Avro schema: a record needs"):
        load_schema(path)
