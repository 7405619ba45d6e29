"""Bad input is never a traceback (issue 8, item 5), through the functions the CLI calls.

Mutated copies of real inputs (Materialize CDC Avro container files and JSON lines, the
changes `encode` takes, the shared Debezium and YDB samples, reader state files) go through
`decode_local`, `encode_local` and `encode_changefeed_job`. Each run either succeeds or raises
a `ChangelakeError` whose message is one line naming the file, and the line (JSON lines) or
byte offset (Avro); anything else (KeyError, struct or fastavro errors, RecursionError,
MemoryError ...) fails the test. A failed run commits nothing: a `--state` file keeps its
bytes, and an `--avro` output file is not created.

Mutations are drawn by hypothesis (derandomized: the same examples every run; a failure prints
the drawn mutation): byte flips, truncation, insertions of hostile Avro longs (2^62, -1,
over-long varints), and for JSON, values swapped for others of any type, huge integers and
deeply nested arrays. The hostile sizes of the issue have a test each below: a progress
statement claiming 10^8 counts, JSON nested 10^5 deep, an Avro block claiming 2^62 records or
bytes, and a 1 GB line (slow) with the 17 MiB line that crosses the same bound in the default
run. `-m slow` runs a longer decode campaign and the 1 GB line; CHANGELAKE_FUZZ_EXAMPLES=N
sets the examples per fuzz target.
"""

from __future__ import annotations

import io
import os
import random
import resource
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.errors import ChangelakeError, InputError, ProtocolError
from changelake.formats import lines as jsonl
from changelake.formats import ocf
from changelake.formats.materialize import CdcSchema, read_all, write_json_lines, write_ocf
from changelake.local import decode_local, encode_changefeed_job, encode_local, load_reader
from changelake.protocol import Progress, Updates, Writer
from changelake.simulate import mangle, random_history, write
from changelake.values import NAN, Record
from tests.convert.test_convert_samples import EXPECTED
from tests.support.paths import SAMPLES

# 150 examples per target in the default run (~30 s for the file); CHANGELAKE_FUZZ_EXAMPLES=N
# for a longer campaign, still derandomized (the same N examples on every machine).
FUZZ = settings(max_examples=int(os.environ.get("CHANGELAKE_FUZZ_EXAMPLES", "150")),
                deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
LONG_FUZZ = settings(FUZZ, max_examples=3000)

# ---------------------------------------------------------------------------------- inputs

RICH_FIELDS = [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "score", "type": "double"},
    {"name": "blob", "type": "bytes"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "int"}},
    {"name": "kind", "type": {"type": "enum", "name": "kind", "symbols": ["A", "B"]}},
    {"name": "inner", "type": ["null", {"type": "record", "name": "inner",
                                        "fields": [{"name": "x", "type": "float"}]}]},
]


@cache
def rich_schema() -> CdcSchema:
    return CdcSchema.for_fields(RICH_FIELDS)


@cache
def simple_schema() -> CdcSchema:
    return CdcSchema.for_fields([{"name": "id", "type": "long"},
                                 {"name": "v", "type": ["null", "long"]}])


@cache
def rich_messages() -> list:
    rng = random.Random(5)  # fixed: the corpus is the same every run
    writer = Writer(batch_size=3)
    messages: list = []
    for time in range(1, 7):
        for _ in range(4):
            i = rng.randrange(10)
            row = Record((("id", i), ("name", rng.choice([None, f"n{i}"])),
                          ("score", rng.choice([0.5, NAN, -2.0])),
                          ("blob", "\x00\xff"[: rng.randrange(3)]), ("tags", ("a", "b")[:i % 3]),
                          ("attrs", Record((("k", i),))), ("kind", "AB"[i % 2]),
                          ("inner", rng.choice([None, Record((("x", 1.5),))]))))
            writer.push(row, time, rng.choice([1, -1, 2]))
        if time % 2 == 0:
            messages += writer.finish_through(time)
    return messages + writer.close()


@cache
def simple_log() -> list:
    rng = random.Random(1)
    return mangle([write(random_history(rng, updates=40, times=6), batch_size=5)], rng)


def ocf_bytes(messages: list, schema: CdcSchema, codec: str = "null") -> bytes:
    out = io.BytesIO()
    write_ocf(out, messages, schema, codec=codec)
    return out.getvalue()


def jsonl_bytes(messages: list, schema: CdcSchema | None) -> bytes:
    out = io.BytesIO()
    write_json_lines(out, messages, schema)
    return out.getvalue()


@cache
def corpus() -> dict[str, bytes]:
    return {
        "rich.avro": ocf_bytes(rich_messages(), rich_schema()),
        "rich-deflate.avro": ocf_bytes(rich_messages(), rich_schema(), "deflate"),
        "simple.avro": ocf_bytes(simple_log(), simple_schema()),
        "rich.jsonl": jsonl_bytes(rich_messages(), rich_schema()),
        "schemaless.jsonl": jsonl_bytes(simple_log(), None),
    }


@cache
def state_bytes() -> bytes:
    """A reader state with pending updates, counts, incomplete times and queued statements."""
    import tempfile

    log = simple_log()
    with tempfile.TemporaryDirectory() as tmp:
        feed, state = Path(tmp) / "half.jsonl", Path(tmp) / "state.json"
        feed.write_bytes(jsonl_bytes(log[: len(log) // 2], simple_schema()))
        decode_local([str(feed)], io.BytesIO(), schema=simple_schema(), state=state)
        return state.read_bytes()


CHANGES = b"".join(
    orjson.dumps({"data": {"id": i % 4, "v": i}, "time": 1 + i // 5, "diff": (-1) ** i}) + b"\n"
    + (orjson.dumps({"finished": i // 5}) + b"\n" if i % 5 == 4 else b"")
    for i in range(20))

CHANGEFEEDS = sorted(EXPECTED)

# ------------------------------------------------------------------------------- mutations

HOSTILE_LONGS = [ocf._long(2**62), ocf._long(-1), ocf._long(2**63 - 1), b"\xff" * 11,
                 ocf._long(10**8), b"\x80"]
HOSTILE_TEXT = [b"[" * 300, b"1e999", b"-9223372036854775809", b"18446744073709551616",
                b"\xed\xa0\x80", b"\xff", b'"\\ud800"', b"\n", b"{}", b"null"]


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(out) - 1)))
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "copy"]))
        if kind == "flip" and out:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and out:
            out[at] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = draw(st.sampled_from(HOSTILE_LONGS + HOSTILE_TEXT))
        elif kind == "delete":
            del out[at:at + draw(st.integers(1, 16))]
        elif kind == "copy" and out:
            start = draw(st.integers(0, len(out) - 1))
            out[at:at] = out[start:start + draw(st.integers(1, 64))]
    return bytes(out)


def _nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
    | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["NaN", "Infinity", "c", "u", "d", "r", "BEGIN", "END", "2020-01-01",
                       "__debezium_unavailable_value", "AAAA", "[1,2]"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6,
) | st.sampled_from([100, 129, 200, 300, 1000]).map(_nested)


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


@st.composite
def json_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """Swap values in a few lines for others of any type (or drop object members)."""
    lines = data.split(b"\n")
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(0, len(lines) - 1))
        try:
            value = orjson.loads(lines[number])
        except orjson.JSONDecodeError:
            continue
        path = draw(st.sampled_from(_paths(value)))
        replacement = draw(JSON_VALUES)
        if not path:
            value = replacement
        else:
            parent = value
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict) and draw(st.booleans()):
                del parent[path[-1]]
            else:
                parent[path[-1]] = replacement
        lines[number] = _dumps(value)
    return b"\n".join(lines)


def _dumps(value: Any) -> bytes:
    """JSON, also for values nested too deep for orjson to write."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return b"[" * 300 + orjson.dumps(1) + b"]" * 300


def mutated(data: bytes, *, json: bool) -> st.SearchStrategy[bytes]:
    if json:
        return st.one_of(byte_mutation(data), json_mutation(data))
    return byte_mutation(data)


# ---------------------------------------------------------------------------------- checks


def only_located_errors(run: Callable[[], Any], path: Path, where: tuple[str, ...]) -> None:
    """`run` succeeds or raises a one-line ChangelakeError naming `path` and, if `where` is
    given, one of those words: "line" or "offset"."""
    try:
        run()
    except ChangelakeError as error:
        text = str(error)
        assert "\n" not in text and len(text) < 2000, text
        assert str(path) in text, text
        if where:
            assert any(f", {w} " in text for w in where), text


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _decode_case(work: Path, name: str, data: bytes, lenient: bool) -> None:
    path = work / name
    path.write_bytes(data)
    schema = rich_schema() if name == "rich.jsonl" else None
    only_located_errors(lambda: decode_local([str(path)], io.BytesIO(), schema=schema,
                                             lenient=lenient),
                        # a mutated magic number makes an Avro file JSON lines
                        path, ("offset", "line") if name.endswith(".avro") else ("line",))


@FUZZ
@given(st.sampled_from(["rich.avro", "rich-deflate.avro", "simple.avro"]).flatmap(
    lambda name: st.tuples(st.just(name), mutated(corpus()[name], json=False))),
    st.booleans())
def test_decode_mutated_avro(work: Path, case: tuple[str, bytes], lenient: bool) -> None:
    _decode_case(work, *case, lenient)


@FUZZ
@given(st.sampled_from(["rich.jsonl", "schemaless.jsonl"]).flatmap(
    lambda name: st.tuples(st.just(name), mutated(corpus()[name], json=True))),
    st.booleans())
def test_decode_mutated_json_lines(work: Path, case: tuple[str, bytes], lenient: bool) -> None:
    _decode_case(work, *case, lenient)


@FUZZ
@given(mutated(state_bytes(), json=True))
def test_decode_with_a_mutated_state_file_commits_nothing(work: Path, state: bytes) -> None:
    path, feed = work / "state.json", work / "rest.jsonl"
    path.write_bytes(state)
    log = simple_log()
    feed.write_bytes(jsonl_bytes(log[len(log) // 2:], simple_schema()))
    try:
        decode_local([str(feed)], io.BytesIO(), schema=simple_schema(), state=path)
    except ChangelakeError as error:
        text = str(error)
        assert "\n" not in text and (str(path) in text or str(feed) in text), text
        assert path.read_bytes() == state  # not saved: the next run starts where this did


@FUZZ
@given(mutated(CHANGES, json=True), st.booleans(), st.booleans(), st.booleans())
def test_encode_mutated_changes(work: Path, data: bytes, close: bool, lenient: bool,
                                to_avro: bool) -> None:
    path, avro = work / "changes.jsonl", work / "out.avro"
    path.write_bytes(data)
    avro.unlink(missing_ok=True)
    try:
        encode_local([str(path)], io.BytesIO(), schema=simple_schema(), close=close,
                     lenient=lenient, avro=avro if to_avro else None)
    except ChangelakeError as error:
        text = str(error)
        assert "\n" not in text and f"{path}, line " in text, text
        assert not avro.exists()


@FUZZ
@given(st.sampled_from(CHANGEFEEDS).flatmap(
    lambda name: st.tuples(st.just(name), mutated((SAMPLES / name).read_bytes(), json=True))),
    st.booleans(), st.booleans(), st.booleans())
def test_encode_mutated_changefeeds(work: Path, case: tuple[str, bytes], keyed: bool,
                                    close: bool, lenient: bool) -> None:
    name, data = case
    spec = EXPECTED[name][0]
    path = work / name
    path.write_bytes(data)
    table_schema = None
    if spec != "debezium":
        table_schema = work / "table.json"
        table_schema.write_bytes(orjson.dumps(spec))
    keys = ["id"] if keyed and spec == "debezium" else None
    only_located_errors(
        lambda: encode_changefeed_job([str(path)], io.BytesIO(),
                                      source="debezium" if spec == "debezium" else "ydb",
                                      keys=keys, table_schema=table_schema, close=close,
                                      lenient=lenient),
        path, ())


@pytest.mark.slow
@LONG_FUZZ
@given(st.sampled_from(sorted(corpus())).flatmap(
    lambda name: st.tuples(st.just(name),
                           mutated(corpus()[name], json=name.endswith(".jsonl")))),
    st.booleans())
def test_decode_mutated_inputs_long(work: Path, case: tuple[str, bytes], lenient: bool) -> None:
    _decode_case(work, *case, lenient)


# --------------------------------------------------------------------------- hostile sizes


def _peak_rss_growth(run: Callable[[], Any]) -> int:
    """How far `run` raises this process's peak resident size, in bytes (Linux: KiB units)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


def _framed(header: bytes, sync: bytes, count: int, body: bytes, length: int | None = None
            ) -> bytes:
    return header + ocf._long(count) + ocf._long(len(body) if length is None else length) \
        + body + sync


@cache
def _header() -> tuple[bytes, bytes]:
    data = corpus()["simple.avro"]
    header, _ = ocf.read_header(io.BytesIO(data), "x")
    return data[: header.size], header.sync


def test_a_statement_claiming_1e8_updates_at_a_time_holds_constant_memory(tmp_path: Path
                                                                           ) -> None:
    """A count is a number, not an allocation: 10^8 claimed updates hold the frontier back
    and are reported as missing."""
    path = tmp_path / "claims.jsonl"
    path.write_bytes(orjson.dumps({"com.materialize.cdc.progress": {
        "lower": [0], "upper": [5], "counts": [{"time": 1, "count": 10**8}]}}) + b"\n")
    out = io.BytesIO()
    report = decode_local([str(path)], out)
    assert out.getvalue() == b'{"frontier":[1]}\n'
    assert "1 (100000000 missing)" in (report.waiting_for or "")


def test_a_counts_array_claiming_1e8_entries_is_refused_before_allocating(tmp_path: Path
                                                                         ) -> None:
    """In Avro, an array block says how many items follow: 10^8 counts claimed in a block of
    a few bytes is refused at the block's offset (each item takes at least a byte)."""
    header, sync = _header()
    statement = (ocf._long(1)  # union branch 1: progress
                 + ocf._long(1) + ocf._long(0) + ocf._long(0)  # lower [0]
                 + ocf._long(1) + ocf._long(5) + ocf._long(0)  # upper [5]
                 + ocf._long(10**8) + ocf._long(1) + ocf._long(1))  # counts: 10^8 claimed
    path = tmp_path / "claims.avro"
    path.write_bytes(_framed(header, sync, 1, statement))
    with pytest.raises(InputError, match=rf"claims\.avro, offset {len(header)}, item 0: "
                                         "corrupt Avro datum 0"):
        list(read_all([path]))


@pytest.mark.parametrize("count, length, rule", [
    (2**62, 10, "claims 4611686018427387904 records in 10 bytes"),
    (1, 2**62, "the block's length is 4611686018427387904 bytes, more than the maximum"),
    (-5, 10, "the block's record count is negative"),
    (1, -5, "the block's length is negative"),
])
def test_an_avro_block_with_hostile_sizes_is_refused_at_its_offset(
        tmp_path: Path, count: int, length: int, rule: str) -> None:
    header, sync = _header()
    path = tmp_path / "hostile.avro"
    path.write_bytes(_framed(header, sync, count, b"\x00" * 10, length))

    def attempt() -> None:
        with pytest.raises(InputError, match=rf"hostile\.avro, offset {len(header)}: "
                                             rf"truncated or corrupt Avro block: .*{rule}"):
            list(read_all([path]))

    assert _peak_rss_growth(attempt) < 64 * 2**20


def test_an_avro_block_that_inflates_beyond_the_maximum_is_refused(tmp_path: Path) -> None:
    import zlib

    data = ocf_bytes(simple_log(), simple_schema(), "deflate")
    header, _ = ocf.read_header(io.BytesIO(data), "x")
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = squeeze.compress(b"\x00" * (ocf.MAX_BLOCK_BYTES + 1)) + squeeze.flush()
    path = tmp_path / "bomb.avro"
    path.write_bytes(_framed(data[: header.size], header.sync, 1, bomb))
    with pytest.raises(InputError, match=r"bomb\.avro, offset \d+: .*decompresses to more"):
        list(read_all([path]))


def test_avro_decodes_datums_at_their_block_and_rejects_leftover_bytes(tmp_path: Path) -> None:
    """Control: the hand-framed blocks above are read the way real ones are."""
    header, sync = _header()
    statement = (ocf._long(1) + ocf._long(1) + ocf._long(0) + ocf._long(0)
                 + ocf._long(1) + ocf._long(5) + ocf._long(0) + ocf._long(0))
    path = tmp_path / "ok.avro"
    path.write_bytes(_framed(header, sync, 1, statement))
    (message,) = read_all([path])
    assert isinstance(message, Progress) and message.upper.to_json() == [5]
    path.write_bytes(_framed(header, sync, 1, statement + b"\x00"))
    with pytest.raises(InputError, match=r"1 bytes left over after the block's 1 records"):
        list(read_all([path]))


@pytest.mark.parametrize("depth", [10**5, 1025, 200, 129])
def test_json_nested_too_deep_is_an_input_error_at_its_line(tmp_path: Path, depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    ok = orjson.dumps({"array": []})
    feed = tmp_path / "deep.jsonl"
    feed.write_bytes(ok + b"\n" + b'{"array": ' + deep + b"}\n")
    with pytest.raises(InputError, match=r"deep\.jsonl, line 2: "):
        list(read_all([feed]))
    changes = tmp_path / "changes.jsonl"
    changes.write_bytes(b'{"finished": 1}\n{"data": {"id": 1, "v": ' + deep + b'}, "time": 2, '
                        b'"diff": 1}\n')
    with pytest.raises(InputError, match=r"changes\.jsonl, line 2: "):
        encode_local([str(changes)], io.BytesIO(), schema=simple_schema(), close=True)
    debezium = tmp_path / "dbz.jsonl"
    debezium.write_bytes(b'{"op": "c", "after": {"id": ' + deep + b"}}\n")
    with pytest.raises(InputError, match=r"dbz\.jsonl, line 1: "):
        encode_changefeed_job([str(debezium)], io.BytesIO(), source="debezium", keys=None,
                              table_schema=None, close=True, lenient=False)
    state = tmp_path / "state.json"
    state.write_bytes(deep)
    with pytest.raises(InputError, match=r"state\.json: not a reader state file"):
        load_reader(state, strict=True)


def test_json_at_the_maximum_depth_is_accepted(tmp_path: Path) -> None:
    """The bound is exact: 128 levels in all pass (the line's own object and array count)."""
    row = _nested(jsonl.MAX_DEPTH - 3)  # {"array": [ {data: row} ... ]}: 3 levels around it
    feed = tmp_path / "deep.jsonl"
    line = orjson.dumps({"array": [{"data": {"v": row}, "time": 1, "diff": 1}]})
    feed.write_bytes(line + b"\n")
    with pytest.raises(InputError, match="nested deeper"):
        list(read_all([feed]))
    feed.write_bytes(orjson.dumps({"array": [{"data": row, "time": 1, "diff": 1}]}) + b"\n"
                     + orjson.dumps({"progress": {"lower": [0], "upper": [],
                                                  "counts": [{"time": 1, "count": 1}]}}) + b"\n")
    message, _ = read_all([feed])
    assert isinstance(message, Updates) and len(message.updates) == 1
    out = io.BytesIO()
    decode_local([str(feed)], out)  # and it can be written back
    assert out.getvalue().startswith(b'{"data":')


def _long_line_file(path: Path, size: int) -> None:
    """A progress statement whose counts array runs on for `size` bytes (about size / 22
    counts), then a good line; written in chunks."""
    entry = b'{"time":1,"count":1},'
    chunk = entry * (2**20 // len(entry))
    with open(path, "wb") as fo:
        fo.write(b'{"com.materialize.cdc.progress":{"lower":[0],"upper":[2],"counts":[')
        for _ in range(size // len(chunk)):
            fo.write(chunk)
        fo.write(b'{"time":1,"count":1}]}}\n')
        fo.write(orjson.dumps({"com.materialize.cdc.progress": {
            "lower": [0], "upper": [2], "counts": []}}) + b"\n")


def _refuses_long_line(path: Path) -> None:
    with pytest.raises(InputError, match=rf"{path.name}, line 1: line longer than the maximum "
                                         f"of {jsonl.MAX_LINE_BYTES} bytes"):
        list(read_all([path]))
    out = io.BytesIO()
    decode_local([str(path)], out, lenient=True)  # lenient: skipped, the next line is read
    assert out.getvalue() == b'{"frontier":[2]}\n'
    changes = path.with_name("changes-" + path.name)
    changes.symlink_to(path)
    with pytest.raises(InputError, match=r"line 1: line longer than the maximum"):
        encode_local([str(changes)], io.BytesIO(), schema=simple_schema(), close=True)
    with pytest.raises(InputError, match=r"line 1: line longer than the maximum"):
        encode_changefeed_job([str(changes)], io.BytesIO(), source="debezium", keys=None,
                              table_schema=None, close=True, lenient=False)


def test_a_line_over_the_maximum_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    _long_line_file(path, jsonl.MAX_LINE_BYTES + 2**20)
    _refuses_long_line(path)


@pytest.mark.slow
def test_a_1gb_line_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    _long_line_file(path, 2**30)
    growth = _peak_rss_growth(lambda: _refuses_long_line(path))
    assert growth < 200 * 2**20, f"peak RSS grew by {growth / 2**20:.0f} MiB"


def test_protocol_errors_keep_their_rule_and_place(tmp_path: Path) -> None:
    """Control for the fuzz checks: a well-formed message that breaks a rule is a
    ProtocolError naming file and line, as before."""
    feed = tmp_path / "zero.jsonl"
    feed.write_bytes(orjson.dumps({"array": [{"data": {"id": 1}, "time": 1, "diff": 0}]})
                     + b"\n")
    with pytest.raises(ProtocolError, match=r"zero\.jsonl, line 1, item 0: \[zero-diff\]"):
        decode_local([str(feed)], io.BytesIO())


# ------------------------------------------------------------------ typed changefeed values

DEBEZIUM_TYPES = [
    {"type": "int64", "name": name} for name in (
        "io.debezium.time.Date", "io.debezium.time.Time", "io.debezium.time.MicroTime",
        "io.debezium.time.NanoTime", "io.debezium.time.Timestamp",
        "io.debezium.time.MicroTimestamp", "io.debezium.time.NanoTimestamp",
        "io.debezium.data.VariableScaleDecimal", "io.debezium.data.Bits")
] + [{"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": p}
     for p in ({"scale": "2"}, {"scale": "-1000000000"}, {"scale": "x"}, None, 5)] + [
    {"type": "bytes"}, {"type": "double"}, {"type": "array", "items": {"type": "bytes"}},
    {"type": "struct", "fields": [{"field": "a", "type": "float"}]}]
BIG_VALUES = st.sampled_from([10**10, -(10**12), 2**70, -(2**63), "AQ==", "////",
                              "AQ" * 5000 + "==", {"scale": -(10**6), "value": "AQ=="},
                              {"scale": 10**9, "value": "AQ=="}, {"scale": 2, "value": 5}])


@FUZZ
@given(st.sampled_from(DEBEZIUM_TYPES), JSON_VALUES | BIG_VALUES)
def test_debezium_values_by_connect_schema(field: dict, value: Any) -> None:
    """Every Connect logical type, any value: a row, or a ChangefeedError at the line."""
    from changelake.errors import ChangefeedError, Location
    from changelake.formats.debezium import DebeziumParser

    line = _dumps({
        "schema": {"type": "struct", "fields": [{"type": "struct", "field": "after",
                                                 "fields": [{**field, "field": "x"}]}]},
        "payload": {"op": "c", "after": {"x": value}, "source": {"lsn": 8, "txId": 1}}})
    try:
        DebeziumParser().parse_line(line, Location("feed.jsonl", 7))
    except ChangefeedError as error:
        assert str(error).startswith("feed.jsonl, line 7: ") and "\n" not in str(error)


YDB_TYPES = ["Bool", "Int8", "Uint64", "Int64", "Float", "Double", "Decimal(22,9)", "DyNumber",
             "String", "Json", "Date", "Datetime", "Timestamp", "Date32", "Datetime64",
             "Timestamp64", "Utf8", "Uuid", "Optional<Uint32>", "Interval"]


@FUZZ
@given(st.sampled_from(YDB_TYPES), JSON_VALUES | BIG_VALUES, st.booleans())
def test_ydb_values_by_column_type(kind: str, value: Any, as_key: bool) -> None:
    from changelake.errors import ChangefeedError, Location
    from changelake.formats.tableschema import TableSchema
    from changelake.formats.ydb import YdbParser

    schema = TableSchema.from_json({"columns": [{"name": "k", "type": "Uint64"},
                                                {"name": "x", "type": kind}],
                                    "primary_key": ["x" if as_key else "k"]})
    record = {"update": {} if as_key else {"x": value}, "key": [value if as_key else 1],
              "ts": [5, 1]}
    try:
        YdbParser(schema).parse_line(_dumps(record), Location("part.jsonl", 3))
    except ChangefeedError as error:
        assert str(error).startswith("part.jsonl, line 3: ") and "\n" not in str(error)


# ----------------------------------------------------------- schemas and framed messages


@FUZZ
@given(mutated(orjson.dumps(rich_schema().avro), json=True))
def test_mutated_cdc_schema_files(work: Path, data: bytes) -> None:
    """`--schema FILE`: a usable schema, or a ChangelakeError naming the file."""
    from changelake.formats.materialize import load_schema

    path = work / "schema.json"
    path.write_bytes(data)
    only_located_errors(lambda: load_schema(path), path, ())


@FUZZ
@given(mutated(orjson.dumps(EXPECTED["ydb-test-json-updates.jsonl"][0]), json=True))
def test_mutated_table_schema_files(work: Path, data: bytes) -> None:
    """`--table-schema FILE` for YDB: a usable schema, or a ChangelakeError."""
    path, table = work / "part.jsonl", work / "table-schema.json"
    path.write_bytes((SAMPLES / "ydb-test-json-updates.jsonl").read_bytes())
    table.write_bytes(data)
    try:
        encode_changefeed_job([str(path)], io.BytesIO(), source="ydb", keys=None,
                              table_schema=table, close=True, lenient=False)
    except ChangelakeError as error:
        assert "\n" not in str(error)


@FUZZ
@given(st.sampled_from(range(len(rich_messages()))).flatmap(
    lambda i: mutated(_framed_message(i), json=False)))
def test_mutated_framed_messages(payload: bytes) -> None:
    """Kafka message values (Confluent and single-object framing)."""
    from changelake.errors import Location
    from changelake.formats.materialize import decode_framed

    schema = rich_schema()
    schemas = {7: schema, schema.fingerprint(): schema}
    try:
        decode_framed(payload, schemas, Location("topic", offset=42))
    except ChangelakeError as error:
        assert str(error).startswith("topic, offset 42: ") and "\n" not in str(error)


def _framed_message(index: int) -> bytes:
    from changelake.formats.materialize import encode_confluent, encode_single_object

    message = rich_messages()[index]
    if index % 2:
        return encode_confluent(message, rich_schema(), 7)
    return encode_single_object(message, rich_schema())


@pytest.mark.parametrize("codec", ["null", "deflate", "bzip2", "xz"])
def test_container_files_of_every_supported_codec_read_back(tmp_path: Path, codec: str) -> None:
    """Control for the framing reader: what fastavro writes, with each codec, reads back."""
    path = tmp_path / f"{codec}.avro"
    path.write_bytes(ocf_bytes(rich_messages(), rich_schema(), codec))
    assert list(read_all([path])) == rich_messages()
    with open(path, "rb") as fo:
        header, _ = ocf.read_header(fo, str(path))
    assert header.codec == codec
