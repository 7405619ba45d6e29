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
from changelake.formats.materialize import (
    _schemaless_row,
    _updates_fast,
    _updates_fast_schemaless,
)
from changelake.local import frontier_line, update_line, update_lines, write_history
from changelake.protocol import Antichain
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


def _outcome(convert: Any) -> Any:
    try:
        return [(tuple(d), t, r) for d, t, r in convert().updates]
    except (av.Invalid, KeyError, TypeError) as error:
        return type(error)


@seed(20261125)
@settings(max_examples=300, deadline=None)
@given(value=st.one_of(updates, st.just({"not": "a list"}),
                       st.lists(st.just({"data": 1, "time": 0, "diff": 1}), max_size=1)))
def test_schemaless_fast_path_equals_the_general_one(value: Any) -> None:
    origin = Location("f", 1)
    fast = _outcome(lambda: _updates_fast_schemaless(value, origin))
    general = _outcome(lambda: _updates_fast(value, origin, _schemaless_row))
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
