"""The local decode's fast paths give exactly what the general code they shortcut gives."""

from __future__ import annotations

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
from changelake.local import update_line
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
