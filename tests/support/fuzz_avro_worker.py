"""The Avro fuzz campaign of `test_fuzz_avro.py`, run in a child process under a memory cap.

Hypothesis draws a Materialize CDC schema around an arbitrary data record (primitives, arrays,
maps, unions, enums, fixed, nested and recursive records, logical types, zero-width types
among them) and the bytes of a block: a valid datum's encoding cut and flipped, or arbitrary
bytes with hostile Avro longs (2^40, 2^62, -1) spliced in. Each goes through the container
reader (strict and lenient) and through Confluent framing (`decode_framed`). Every outcome
must be messages or a one-line `ChangelakeError` naming the place; anything else (KeyError,
RecursionError, a MemoryError, however it is wrapped) fails. Run as
`python fuzz_avro_worker.py container|framed EXAMPLES`: exit 0 when every example passed.
"""

from __future__ import annotations

import io
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

import fastavro
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.errors import ChangelakeError, Location
from changelake.formats import avro_bounds, ocf
from changelake.formats.materialize import (
    CdcSchema,
    cdc_schema_around,
    confluent_header,
    decode_framed,
    read_all,
)

L = ocf.encode_long
SYNC = b"\x5a" * 16
_names = itertools.count()

PRIMITIVE = st.sampled_from(["null", "boolean", "int", "long", "float", "double", "bytes",
                             "string"])
LOGICAL = st.sampled_from([
    {"type": "int", "logicalType": "date"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
    {"type": "string", "logicalType": "uuid"},
    {"type": "int", "logicalType": "time-millis"},
])


def _name() -> str:
    return f"t{next(_names)}"


def _types(leaf: st.SearchStrategy) -> st.SearchStrategy:
    def extend(inner: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(
            inner.map(lambda t: {"type": "array", "items": t}),
            inner.map(lambda t: {"type": "map", "values": t}),
            st.tuples(st.lists(inner, min_size=0, max_size=3),
                      st.sampled_from([None, None, "a", "a.b"])).map(_record),
            st.lists(st.one_of(PRIMITIVE, inner.filter(lambda t: isinstance(t, dict)
                                                      and t.get("type") == "record")),
                     min_size=1, max_size=3).map(_union),
        )
    return st.recursive(leaf, extend, max_leaves=8)


def _record(drawn: tuple[list, str | None]) -> dict:
    """A record of these field types, in a namespace of its own or its enclosing one."""
    types, namespace = drawn
    out = {"type": "record", "name": _name(),
           "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)]}
    if namespace is not None:
        out["namespace"] = namespace
    return out


def _union(branches: list) -> list:
    out, kinds = [], set()
    for branch in branches:
        kind = branch if isinstance(branch, str) else branch["name"]
        if kind not in kinds:
            kinds.add(kind)
            out.append(branch)
    return out


LEAF = st.one_of(
    PRIMITIVE, LOGICAL,
    st.integers(0, 3).map(lambda n: {"type": "fixed", "name": _name(), "size": n}),
    st.integers(1, 3).map(lambda n: {"type": "enum", "name": _name(),
                                     "symbols": [f"S{i}" for i in range(n)]}),
)


@st.composite
def schemas(draw: Any) -> list:
    fields = draw(st.lists(_types(LEAF), min_size=0, max_size=4))
    data: dict[str, Any] = {"type": "record", "name": "data",
                            "fields": [{"name": f"c{i}", "type": t} for i, t in enumerate(fields)]}
    if draw(st.booleans()):  # a recursive column: a linked list of nodes
        data["fields"].append({"name": "list", "type": ["null", {
            "type": "record", "name": "node", "fields": [
                {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "node"]}]}]})
    return cdc_schema_around(data)


HOSTILE = st.sampled_from([L(2**40), L(2**62), L(-1), L(-(2**40)), b"\xff" * 11, L(10**6)])


@st.composite
def block_bytes(draw: Any) -> bytes:
    """An updates datum's start, then arbitrary bytes with hostile longs spliced in."""
    parts = [L(0), L(draw(st.integers(0, 3)))]
    for _ in range(draw(st.integers(0, 6))):
        parts.append(draw(st.one_of(st.binary(max_size=40), HOSTILE,
                                    st.integers(-2**63, 2**63 - 1).map(L))))
    if draw(st.booleans()):  # a deep chain for the recursive column: 1 = the node branch
        parts.append(L(1) * draw(st.integers(1, 5000)))
    return b"".join(parts)


def container(schema: Any, datum: bytes, count: int) -> bytes:
    out = io.BytesIO()
    try:
        fastavro.writer(out, fastavro.parse_schema(schema), [], codec="null", sync_marker=SYNC)
    except Exception:  # a schema fastavro refuses: the header is written here then
        out = io.BytesIO()
        import orjson
        out.write(ocf.header_bytes({"avro.schema": orjson.dumps(schema),
                                    "avro.codec": b"null"}, SYNC))
    return out.getvalue() + L(count) + L(len(datum)) + datum + SYNC


def check_one_line(error: ChangelakeError, *names: str) -> None:
    text = str(error)
    assert "\n" not in text and len(text) < 2000, text
    for bad in ("MemoryError", "RecursionError", "Traceback"):
        assert bad not in text, text
    for name in names:
        assert name in text, text


SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def container_campaign(examples: int) -> None:
    work = Path(tempfile.mkdtemp())

    @settings(SETTINGS, max_examples=examples)
    @given(schemas(), block_bytes(), st.integers(0, 3), st.booleans())
    def case(schema: Any, datum: bytes, count: int, lenient: bool) -> None:
        path = work / "f.avro"
        path.write_bytes(container(schema, datum, count))
        aside: list = []
        try:
            list(read_all([path], set_aside=aside.append if lenient else None))
        except ChangelakeError as error:
            check_one_line(error, str(path), ", offset ")
        for item in aside:
            assert "\n" not in item.reason and "MemoryError" not in item.reason, item.reason
            assert "RecursionError" not in item.reason, item.reason

    case()


def framed_campaign(examples: int) -> None:
    @settings(SETTINGS, max_examples=examples)
    @given(schemas(), block_bytes(), st.sampled_from([b"", b"\x00", b"\x00\x00\x00\x00",
                                                      b"\xc3\x01"]))
    def case(schema: Any, datum: bytes, cut: bytes) -> None:
        where = Location("topic t partition 0", offset=7)
        try:
            cdc = CdcSchema.from_json(schema)
        except ChangelakeError as error:
            check_one_line(error)
            return
        for payload in (confluent_header(3) + datum, cut + datum[:5]):
            try:
                decode_framed(payload, {3: cdc}, where)
            except ChangelakeError as error:
                check_one_line(error, str(where))
        same_as_fastavro(cdc, datum)

    case()


def same_as_fastavro(cdc: CdcSchema, datum: bytes) -> None:
    """The budgeted reader (`avro_bounds.Cost.read`, which a block beyond the budget's worst
    case goes through) reads what fastavro reads, to the same byte; where fastavro fails, it
    fails too, with an exception `_datums` and `decode_framed` turn into one line."""
    try:
        fo = io.BytesIO(datum)
        expected: Any = fastavro.schemaless_reader(fo, cdc.parsed)
        end = fo.tell()
    except Exception:
        expected, end = None, -1
    fo = io.BytesIO(datum)
    try:
        got = cdc.cost.read(fo, [float(avro_bounds.BLOCK_BUDGET)])
    except (avro_bounds.OverBudget, EOFError, IndexError, ValueError, KeyError, TypeError,
            OverflowError, UnicodeDecodeError, AttributeError) as error:
        assert end == -1 or isinstance(error, avro_bounds.OverBudget), (error, expected)
        return
    if end != -1:
        assert got == expected or repr(got) == repr(expected), (got, expected)
        assert fo.tell() == end, (fo.tell(), end)


if __name__ == "__main__":
    campaign = {"container": container_campaign, "framed": framed_campaign}[sys.argv[1]]
    campaign(int(sys.argv[2]))
