"""The local decode's fast paths give exactly what the general code they shortcut gives."""

from __future__ import annotations

import io
import math
from typing import Any

import orjson
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from changelake.errors import Location
from changelake.formats import avro_values as av
from changelake.formats.materialize.values import (
    _schemaless_row,
    _updates_fast,
    _updates_fast_schemaless,
)
from changelake.local import frontier_line, update_line, update_lines, write_history
from changelake.protocol import Antichain, Updates
from changelake.values import NAN, freeze, thaw

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False),
)
wrapped = st.builds(lambda k, v: {k: v}, st.sampled_from(["int", "string", "double", "x"]),
                    scalars)
values = st.recursive(
    st.one_of(scalars, wrapped),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)
rows = st.dictionaries(st.text(max_size=4), values, max_size=4)
updates = st.lists(
    st.fixed_dictionaries({"data": rows, "time": st.integers(-1, 2**63),
                           "diff": st.integers(-(2**63), 2**63 - 1)}),
    max_size=4,
)

#: Messages whose rows have the same fields (the common case, which is frozen a column at a
#: time), with plain, primitive-wrapped and odd values.
column_values = st.one_of(scalars, wrapped, st.just({}), st.just({"int": {"long": 3}}),
                          st.just({"null": None}), st.just([1, {"int": 2}]))
same_fields = st.integers(1, 6).flatmap(lambda n: st.lists(
    st.fixed_dictionaries({
        "data": st.fixed_dictionaries({k: column_values for k in ["b", "a", "c"][:n % 3 + 1]}),
        "time": st.integers(0, 3), "diff": st.sampled_from([-1, 1, 2]),
    }), min_size=1, max_size=n))


def _row_by_row(value: Any, origin: Location, data: Any) -> Updates:
    """The checks of `updates_from_plain` update by update, each row frozen by `data`: what
    `_updates_fast` did before it took a message's rows at once."""
    if type(value) is not list:
        raise av.Invalid
    out = []
    low, high = av.LONG_RANGE
    for u in value:
        if type(u) is not dict or len(u) != 3:
            raise av.Invalid
        time, diff = u["time"], u["diff"]
        if type(time) is not int or not 0 <= time <= high or type(diff) is not int \
                or not low <= diff <= high:
            raise av.Invalid
        out.append((data(u["data"]), time, diff))
    return Updates(out, origin)


def _outcome(convert: Any) -> Any:
    try:
        return [(tuple(d), t, r) for d, t, r in convert().updates]
    except (av.Invalid, KeyError, TypeError) as error:
        return type(error)


@seed(20261125)
@settings(max_examples=300, deadline=None)
@given(value=st.one_of(updates, same_fields, st.just({"not": "a list"}),
                       st.lists(st.just({"data": 1, "time": 0, "diff": 1}), max_size=1)))
def test_schemaless_fast_path_equals_the_general_one(value: Any) -> None:
    origin = Location("f", 1)
    fast = _outcome(lambda: _updates_fast_schemaless(value, origin))
    general = _outcome(lambda: _row_by_row(value, origin, _schemaless_row))
    assert fast == general
    assert fast is not av.Invalid or value == {"not": "a list"} or any(
        type(u["data"]) is not dict or not 0 <= u["time"] < 2**63 for u in value
    )


@seed(20261126)
@settings(max_examples=300, deadline=None)
@given(data=rows, special=st.sampled_from([None, NAN, math.inf, -math.inf]))
def test_update_line_equals_thawed_dump(data: dict[str, Any], special: float | None) -> None:
    row = freeze(av.unwrap_unions_heuristically({**data, "z": special}))
    expected = orjson.dumps({"data": thaw(row, json_safe=True), "time": 3, "diff": -1})
    assert update_line((row, 3, -1)) == expected


nested = st.recursive(
    st.one_of(scalars, st.sampled_from([NAN, math.inf, -math.inf]),
              st.text(alphabet=',\n{}[]"\\:null', max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)
frozen_updates = st.lists(
    st.tuples(st.dictionaries(st.text(max_size=4), nested, max_size=4).map(freeze),
              st.one_of(st.integers(0, 3), st.just(2**63 - 1)), st.integers(-3, 3)),
    max_size=12,
)


@seed(20261202)
@settings(max_examples=300, deadline=None)
@given(updates=frozen_updates)
def test_update_lines_equals_update_line_each(updates: list[Any]) -> None:
    assert update_lines(updates) == [update_line(u) for u in updates]


def _history_one_line_at_a_time(batches: list[Any], start: Antichain) -> bytes:
    """`write_history` as it was: a line per update, grouped by time in a dict."""
    out = bytearray()
    frontier, last_was_frontier = start, False
    for updates, new_frontier in batches:
        by_time: dict[Any, list[bytes]] = {}
        for update in updates:
            by_time.setdefault(update[1], []).append(update_line(update))
        for time in sorted(by_time):
            out += b"".join(line + b"\n" for line in sorted(by_time[time]))
        out += frontier_line(new_frontier) + b"\n"
        frontier, last_was_frontier = new_frontier, True
    if not last_was_frontier:
        out += frontier_line(frontier) + b"\n"
    return bytes(out)


@seed(20261203)
@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.tuples(frozen_updates, st.integers(0, 5).map(lambda t: Antichain([t]))),
                        max_size=3),
       ordered=st.booleans())
def test_write_history_equals_a_line_at_a_time(batches: list[Any], ordered: bool) -> None:
    if ordered:  # as the Reader hands them out; the other case takes the sorting branch
        batches = [(sorted(updates, key=lambda u: u[1]), f) for updates, f in batches]
    out = io.BytesIO()
    write_history(out, batches, Antichain([0]))
    assert out.getvalue() == _history_one_line_at_a_time(batches, Antichain([0]))


#: Avro types of a row's fields: what `compile_avro_json_rows` takes a column at a time, and
#: some it leaves to the value-by-value converter.
field_types = st.sampled_from([
    "long", "int", "string", "boolean", "double", "float", "null", "bytes",
    ["null", "long"], ["null", "int"], ["null", "string"], ["null", "double"],
    ["long", "null"], ["string", "long"], ["null", {"type": "array", "items": "long"}],
    {"type": "int", "logicalType": "date"},
])
#: Values for such fields: right and wrong types, wrapped and not, bounds, text numbers.
field_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63) - 1, 2**63), st.integers(-5, 5),
    st.floats(allow_nan=False), st.sampled_from(["NaN", "Infinity", "x", ""]),
    st.builds(lambda k, v: {k: v},
              st.sampled_from(["long", "int", "string", "double", "null", "array", "x"]),
              st.one_of(st.none(), st.integers(-(2**31) - 1, 2**31), st.text(max_size=2),
                        st.floats(allow_nan=False), st.lists(st.integers(0, 3), max_size=2))),
    st.just({}), st.just({"long": 1, "int": 2}),
)


def _good(avro_type: Any) -> Any:
    """Avro-JSON values of `avro_type` (of its simple kinds; others: any value)."""
    simple = {"long": st.integers(-(2**63), 2**63 - 1), "int": st.integers(-(2**31), 2**31 - 1),
              "string": st.text(max_size=3), "boolean": st.booleans(), "null": st.none(),
              "double": st.one_of(st.floats(allow_nan=False), st.integers(-9, 9)),
              "float": st.floats(allow_nan=False, width=32)}
    if isinstance(avro_type, str) and avro_type in simple:
        return simple[avro_type]
    if isinstance(avro_type, list):
        branches = [st.none() if t == "null" else _good(t).map(lambda v, t=t: {t: v})
                    for t in avro_type if isinstance(t, str)]
        return st.one_of(*branches)
    return field_values


@st.composite
def rows_of_a_schema(draw: Any) -> tuple[Any, list[Any]]:
    types = draw(st.lists(field_types, min_size=0, max_size=3))
    schema = {"type": "record", "name": "row",
              "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)]}
    names = [f"f{i}" for i in range(len(types))]
    if draw(st.booleans()):  # mostly values of the field's type: the columns taken at once
        values = {n: st.one_of(*[_good(t)] * 8, field_values)
                  for n, t in zip(names, types, strict=True)}
    else:
        values = {n: field_values for n in names}
    typical = draw(st.lists(st.fixed_dictionaries(values), max_size=5))
    odd = draw(st.lists(st.one_of(st.just({}), st.just(1), st.just({"zz": 1}),
                                  st.fixed_dictionaries({n: field_values for n in names[:1]})),
                        max_size=1))
    return schema, typical + odd


def _rows_outcome(convert: Any) -> Any:
    try:
        return [list(row) for row in convert()]
    except av.Invalid:
        return av.Invalid


@seed(20261204)
@settings(max_examples=500, deadline=None)
@given(case=rows_of_a_schema(), times=st.lists(st.integers(-1, 3), min_size=6, max_size=6))
def test_rows_at_once_equal_each_row_converted(case: tuple[Any, list[Any]],
                                               times: list[int]) -> None:
    schema, rows = case
    named = av.named_types(schema)
    each = av.compile_avro_json(schema, named)
    at_once = av.compile_avro_json_rows(schema, named)
    expected = _rows_outcome(lambda: list(map(each, rows)))
    got = _rows_outcome(lambda: at_once(rows))
    # NaN: the shared one on both sides, so rows compare equal by identity first
    assert got == expected
    # and whole messages: the checks of times and diffs at once, too
    message = [{"data": row, "time": t, "diff": 1} for row, t in zip(rows, times, strict=False)]
    origin = Location("f", 1)
    assert _outcome(lambda: _updates_fast(message, origin, at_once)) \
        == _outcome(lambda: _row_by_row(message, origin, each))
