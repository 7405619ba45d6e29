"""The changefeed and pgoutput fuzz campaigns of `test_fuzz_lines.py`, run in a child process
under a memory cap (issue 67).

* `debezium`, `ydb`: lines cut from the shared samples, their JSON values swapped for hostile
  ones (any JSON kind, huge and negative numbers, Debezium's semantic type names with values
  that do not fit them, huge decimal scales, deep nesting, long strings), their bytes flipped
  and cut; each file goes through the parser and the converter (`encode_changefeed_job`,
  keyed and not, strict and lenient).
* `pgoutput`: one decoder's stream of messages of every kind, built field by field, with
  hostile counts and lengths (column counts, text lengths, truncate counts) and their bytes
  flipped and cut.

Every outcome must be a result or a one-line `ChangelakeError` (`PgOutputError` for pgoutput)
naming the file and line, or the WAL position and byte; anything else (KeyError, OverflowError,
RecursionError, a MemoryError however it is wrapped) fails. Run as
`python fuzz_lines_worker.py debezium|ydb|pgoutput EXAMPLES`: exit 0 when every example passed.
"""

from __future__ import annotations

import base64
import io
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.capture.postgres.pgoutput import Decoder, PgOutputError
from changelake.errors import ChangelakeError
from changelake.local import encode_changefeed_job
from tests.convert.test_convert_samples import EXPECTED
from tests.fuzz.test_fuzz_inputs import JSON_VALUES, _dumps, _paths, byte_mutation
from tests.support.paths import SAMPLES

SETTINGS = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

SEMANTIC = st.sampled_from([
    "org.apache.kafka.connect.data.Decimal", "io.debezium.data.VariableScaleDecimal",
    "io.debezium.time.Date", "io.debezium.time.MicroTime", "io.debezium.time.NanoTime",
    "io.debezium.time.Timestamp", "io.debezium.time.MicroTimestamp",
    "io.debezium.time.NanoTimestamp", "io.debezium.time.ZonedTimestamp",
    "io.debezium.time.ZonedTime", "io.debezium.data.Bits", "io.debezium.data.Json",
    "io.debezium.data.Uuid", "io.debezium.time.Year", "org.apache.kafka.connect.data.Time",
])
CONNECT_TYPES = st.sampled_from(["int8", "int16", "int32", "int64", "float32", "float64",
                                 "boolean", "string", "bytes", "struct", "array", "map"])
HOSTILE = st.one_of(
    JSON_VALUES,
    st.sampled_from([2**63, -(2**63) - 1, 10**30, -1, 9223372036825200000, 16383, 16384,
                     10**9, 1e308, -1e308, 5e-324, "9" * 400, "1e99999", "-0", "",
                     "\u0000", "\ud7ff" * 10, "+", "2019-13-45T25:61:61Z", "0000-00-00",
                     "99999-12-31T00:00:00Z", "9999-12-31T23:59:59.999999999+14:00"]),
    st.integers(0, 3).map(lambda n: base64.b64encode(b"\xff" * (4 ** (n + 2))).decode()),
    st.integers(1, 4).map(lambda n: base64.b64encode(b"\x7f" + b"\xff" * (10 ** n)).decode()),
    st.integers(2, 6).map(lambda n: "x" * 10 ** n),
    st.fixed_dictionaries({"scale": st.sampled_from([0, -1, 16383, 2**31, 2**63, "2"]),
                           "value": st.sampled_from(["AA==", "/////w==", "", "%%", 1])}),
)


@st.composite
def hostile_json(draw: Any, data: bytes) -> bytes:
    """A few lines of `data`, each value swapped (or a member dropped, or a schema field
    given a semantic type name or connect type) for a hostile one."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    start = draw(st.integers(0, len(lines) - 1))
    lines = lines[start:start + draw(st.integers(1, 3))]
    for _ in range(draw(st.integers(1, 4))):
        number = draw(st.integers(0, len(lines) - 1))
        try:
            value = orjson.loads(lines[number])
        except orjson.JSONDecodeError:
            continue
        path = draw(st.sampled_from(_paths(value)))
        if not path:
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        choice = draw(st.integers(0, 9))
        if choice == 0 and isinstance(parent, dict):
            del parent[key]
        elif choice == 1 and isinstance(parent, dict):
            parent["name"] = draw(SEMANTIC)
        elif choice == 2 and isinstance(parent, dict):
            parent["type"] = draw(CONNECT_TYPES)
        elif choice == 3 and isinstance(parent, dict):
            parent["parameters"] = {"scale": draw(st.sampled_from(["2", "-5", "99999", "x"]))}
        else:
            parent[key] = draw(HOSTILE)
        lines[number] = _dumps(value)
    out = b"\n".join(lines)
    if draw(st.integers(0, 4)) == 0:
        out = draw(byte_mutation(out))
    return out


def check_one_line(error: ChangelakeError, *names: str) -> None:
    text = str(error)
    assert "\n" not in text and len(text) < 2000, text
    for bad in ("MemoryError", "RecursionError", "Traceback"):
        assert bad not in text, text
    for name in names:
        assert name in text, text


def changefeed_campaign(source: str, examples: int) -> None:
    work = Path(tempfile.mkdtemp())
    names = sorted(n for n, (spec, _) in EXPECTED.items()
                   if (spec == "debezium") == (source == "debezium"))

    @settings(SETTINGS, max_examples=examples)
    @given(st.sampled_from(names).flatmap(
        lambda n: st.tuples(st.just(n), hostile_json((SAMPLES / n).read_bytes()))),
        st.booleans(), st.booleans(), st.booleans())
    def case(drawn: tuple[str, bytes], keyed: bool, close: bool, lenient: bool) -> None:
        name, data = drawn
        spec = EXPECTED[name][0]
        path = work / name
        path.write_bytes(data)
        table_schema = None
        if spec != "debezium":
            table_schema = work / "table.json"
            table_schema.write_bytes(orjson.dumps(spec))
        keys = (["id"] if spec == "debezium" else None) if keyed else None
        try:
            report = encode_changefeed_job([str(path)], io.BytesIO(), source=source, keys=keys,
                                           table_schema=table_schema, close=close,
                                           lenient=lenient)
        except ChangelakeError as error:
            check_one_line(error, str(path))
            assert ", line " in str(error) or "no line" in str(error), str(error)
            return
        for item in report.set_aside:
            assert "\n" not in item.reason and "Error" not in item.reason, item.reason

    case()


# --------------------------------------------------------------------------------- pgoutput


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


@st.composite
def tuple_data(draw: Any) -> bytes:
    n = draw(st.sampled_from([0, 1, 2, 3, 32767, -1, -32768]))
    out = struct.pack(">h", n)
    for _ in range(min(max(n, 0), 4)):
        kind = draw(st.sampled_from([b"n", b"u", b"t", b"b", b"x"]))
        out += kind
        if kind in (b"t", b"b"):
            body = draw(st.sampled_from([b"", b"42", "é".encode(), b"\xff\xfe", b"x" * 300]))
            length = draw(st.sampled_from([len(body), len(body), 2**31 - 1, -1, 0]))
            out += struct.pack(">i", length) + body
    return out


U32 = st.sampled_from([0, 1, 16384, 2**31, 2**32 - 1])
U64 = st.sampled_from([0, 1, 2**40, 2**63, 2**64 - 1])
I64 = st.sampled_from([0, -1, 2**62, -(2**63), 2**63 - 1])
TEXT = st.sampled_from(["", "public", "t", "é", "a" * 200]).map(_s) | st.just(b"no-nul")


@st.composite
def pgoutput_message(draw: Any, in_stream: bool) -> bytes:
    kind = draw(st.sampled_from(list(b"BCORYIUDTMSEcAKPbrpsxZ")))
    xid = struct.pack(">I", draw(U32)) if in_stream and kind in b"RYIUDTM" else b""
    k = bytes([kind])
    if kind == ord("B"):
        body = struct.pack(">Q", draw(U64)) + struct.pack(">q", draw(I64)) \
            + struct.pack(">I", draw(U32))
    elif kind == ord("C"):
        body = struct.pack(">b", draw(st.integers(-128, 127))) + struct.pack(">QQq", draw(U64),
                                                                             draw(U64),
                                                                             draw(I64))
    elif kind == ord("O"):
        body = struct.pack(">Q", draw(U64)) + draw(TEXT)
    elif kind == ord("R"):
        columns = draw(st.sampled_from([0, 1, 2, -1, 32767]))
        body = struct.pack(">I", draw(U32)) + draw(TEXT) + draw(TEXT) \
            + draw(st.sampled_from([b"d", b"n", b"f", b"i", b"\x00"])) + struct.pack(">h", columns)
        for _ in range(min(max(columns, 0), 3)):
            body += struct.pack(">b", draw(st.integers(-1, 1))) + draw(TEXT) \
                + struct.pack(">Ii", draw(U32), draw(st.integers(-2**31, 2**31 - 1)))
    elif kind == ord("Y"):
        body = struct.pack(">I", draw(U32)) + draw(TEXT) + draw(TEXT)
    elif kind == ord("I"):
        body = struct.pack(">I", draw(U32)) + draw(st.sampled_from([b"N", b"K"])) \
            + draw(tuple_data())
    elif kind == ord("U"):
        tag = draw(st.sampled_from([b"N", b"K", b"O", b"X"]))
        body = struct.pack(">I", draw(U32)) + tag + draw(tuple_data())
        if tag != b"N":
            body += draw(st.sampled_from([b"N", b"K"])) + draw(tuple_data())
    elif kind == ord("D"):
        body = struct.pack(">I", draw(U32)) + draw(st.sampled_from([b"K", b"O", b"N"])) \
            + draw(tuple_data())
    elif kind == ord("T"):
        count = draw(st.sampled_from([0, 1, 3, -1, 2**31 - 1]))
        body = struct.pack(">ib", count, draw(st.integers(-128, 127))) \
            + b"".join(struct.pack(">I", draw(U32)) for _ in range(min(max(count, 0), 3)))
    elif kind == ord("M"):
        payload = draw(st.binary(max_size=20))
        body = struct.pack(">bQ", draw(st.integers(-1, 1)), draw(U64)) + draw(TEXT) \
            + struct.pack(">i", draw(st.sampled_from([len(payload), 2**31 - 1, -1]))) + payload
    elif kind == ord("S"):
        body = struct.pack(">Ib", draw(U32), draw(st.integers(-1, 2)))
    elif kind == ord("c"):
        body = struct.pack(">IbQQq", draw(U32), draw(st.integers(-1, 1)), draw(U64), draw(U64),
                           draw(I64))
    elif kind == ord("A"):
        body = struct.pack(">II", draw(U32), draw(U32))
        if draw(st.booleans()):
            body += struct.pack(">Qq", draw(U64), draw(I64))
    else:  # E, two-phase kinds, unknown kinds
        body = draw(st.binary(max_size=8))
    out = k + xid + body
    if draw(st.integers(0, 3)) == 0:
        out = draw(byte_mutation(out))
    return out


def pgoutput_campaign(examples: int) -> None:
    @settings(SETTINGS, max_examples=examples)
    @given(st.data(), st.booleans(), st.integers(1, 8))
    def case(data: Any, parallel: bool, n: int) -> None:
        decoder = Decoder(streaming_parallel=parallel)
        for i in range(n):
            payload = data.draw(pgoutput_message(decoder.in_stream))
            lsn = data.draw(st.sampled_from([None, 0, 2**32 + i, 2**64 - 1]))
            try:
                decoder.decode(payload, lsn)
            except PgOutputError as error:
                check_one_line(error, "pgoutput message", ", byte ")
                if lsn is not None:
                    assert " at WAL " in str(error), str(error)

    case()


if __name__ == "__main__":
    kind, count = sys.argv[1], int(sys.argv[2])
    if kind == "pgoutput":
        pgoutput_campaign(count)
    else:
        changefeed_campaign(kind, count)
