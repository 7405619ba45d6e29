"""The compiled converters accept exactly what the generic (explaining) converters accept."""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from changelake.formats import avro_values as av
from changelake.values import freeze

SCHEMA = {
    "type": "record", "name": "data", "fields": [
        {"name": "id", "type": "long"},
        {"name": "small", "type": "int"},
        {"name": "price", "type": ["null", "int", "string"]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "raw", "type": "bytes"},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
        {"name": "ok", "type": "boolean"},
    ],
}
NAMED = av.named_types(SCHEMA)
SCHEMA_FIELDS = [f["name"] for f in SCHEMA["fields"]]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(),
                    st.text(max_size=3), st.sampled_from(["A", "B", "\u0100"]))
wrapped = st.one_of(scalars, st.dictionaries(st.sampled_from(["int", "string", "double",
                                                               "long"]), scalars, max_size=2))
good = st.fixed_dictionaries({
    "id": st.integers(-(2**63), 2**63 - 1),
    "small": st.integers(-(2**31), 2**31 - 1),
    "price": st.one_of(st.none(), st.builds(lambda i: {"int": i}, st.integers(0, 9)),
                       st.builds(lambda t: {"string": t}, st.text(max_size=2))),
    "tags": st.lists(st.text(max_size=2), max_size=3),
    "attrs": st.dictionaries(st.text(max_size=2), st.one_of(
        st.none(), st.builds(lambda f: {"double": f}, st.floats(0, 1))), max_size=2),
    "raw": st.text(st.characters(max_codepoint=255), max_size=3),
    "kind": st.sampled_from(["A", "B"]),
    "ok": st.booleans(),
})
# a quarter of the examples get one field replaced by something arbitrary (or an extra field)
corruption = st.tuples(st.integers(0, 3), st.sampled_from([*SCHEMA_FIELDS, "extra"]), wrapped)


def apply(value: dict, damage: tuple) -> dict:
    roll, name, junk = damage
    return value if roll else {**value, name: junk}


values = st.builds(apply, good, corruption)


def outcome(fn: Any, value: Any) -> Any:
    try:
        return ("ok", fn(value))
    except (ValueError, av.Invalid, KeyError, TypeError):
        return ("invalid", None)


@settings(max_examples=400, deadline=None)
@given(values)
def test_compiled_json_converter_agrees_with_generic(value: dict) -> None:
    compiled = outcome(av.compile_avro_json(SCHEMA, NAMED), value)
    generic = outcome(lambda v: freeze(av.from_avro_json(v, SCHEMA, NAMED)), value)
    assert compiled == generic
    event("valid" if compiled[0] == "ok" else "invalid")


def test_round_trip_plain_and_avro_json() -> None:
    plain = {"id": 1, "small": 2, "price": "x", "tags": ["a"], "attrs": {"k": 1.5},
             "raw": "\x00\xff", "kind": "B", "ok": True}
    wrapped_value = av.to_avro_json(plain, SCHEMA, NAMED)
    assert wrapped_value["price"] == {"string": "x"}
    assert wrapped_value["attrs"] == {"k": {"double": 1.5}}
    assert av.from_avro_json(wrapped_value, SCHEMA, NAMED) == plain
    python = av.plain_to_python(plain, SCHEMA, NAMED)
    assert python["raw"] == b"\x00\xff"
    assert av.python_to_plain(python) == plain


WRITE_SCHEMA = {**SCHEMA, "fields": [
    *SCHEMA["fields"],
    {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                         "precision": 6, "scale": 2}, "string"]},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "x", "type": ["null", "double"]},
]}
WRITE_NAMED = av.named_types(WRITE_SCHEMA)
WRITE_FIELDS = [f["name"] for f in WRITE_SCHEMA["fields"]]
plain_good = st.builds(
    lambda v, amount, day, x: {**av.from_avro_json(v, SCHEMA, NAMED), "amount": amount,
                               "day": day, "x": x},
    good,
    st.one_of(st.none(), st.decimals(-9999, 9999, places=2).map(str), st.text(max_size=3)),
    st.dates().map(str),
    st.one_of(st.none(), st.floats(), st.integers(-5, 5)))
plain_corruption = st.tuples(st.integers(0, 3), st.sampled_from([*WRITE_FIELDS, "extra"]),
                             st.one_of(scalars, st.lists(scalars, max_size=2)))
plain_values = st.builds(apply, plain_good, plain_corruption)


@settings(max_examples=400, deadline=None)
@given(plain_values)
def test_compiled_writers_agree_with_generic(value: dict) -> None:
    """A writer takes the compiled conversion's result, or (on `Invalid`) the generic one's:
    so whatever the compiled one gives must be the generic one's."""
    compiled = outcome(av.compile_to_avro_json(WRITE_SCHEMA, WRITE_NAMED), value)
    generic = outcome(lambda v: av.to_avro_json(v, WRITE_SCHEMA, WRITE_NAMED), value)
    if compiled[0] == "ok":
        assert compiled == generic
    event("compiled" if compiled[0] == "ok" else f"generic {generic[0]}")
    if generic[0] == "ok":  # a value the JSON writer takes: fastavro's values agree too
        python = av.compile_plain_python(WRITE_SCHEMA, WRITE_NAMED)(value)
        assert python == av.plain_to_python(value, WRITE_SCHEMA, WRITE_NAMED)
