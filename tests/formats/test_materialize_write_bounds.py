"""Our writers write only what our readers take: no Avro block over `ocf.MAX_BLOCK_BYTES`
(before or after compression), no JSON line over `lines.MAX_LINE_BYTES`. A message of updates
too large for one is cut into several (a progress statement counts updates, not messages, so
the history read back is the same), a progress statement too large into statements over parts
of its interval, and an update too large for any message is refused, naming it (in `encode`:
its input file and line), with no output file left behind."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import fastavro
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.errors import InputError, Location
from changelake.formats import lines as jsonl
from changelake.formats import ocf
from changelake.formats.materialize import (
    CdcSchema,
    UpdateTooLarge,
    avro_datums,
    json_lines,
    message_from_python,
    read_json_lines,
    read_stream,
    write_json_lines,
    write_ocf,
)
from changelake.protocol import Progress, Updates, Writer, collect
from changelake.values import Record

CLI = [str(Path(sys.executable).parent / "changelake")]
SCHEMA = CdcSchema.for_fields([{"name": "id", "type": "long"}, {"name": "v", "type": "string"}])
#: ~20 kB rows of hex (random: deflate halves them, no more): 1024 of them, one message of the
#: Writer's default batch, take ~20 MB, over the 16 MiB the readers take.
ROW_BYTES = 20_000
ROWS = 1100
#: One value over every bound alone.
HUGE = 17 * 2**20


def wide_messages(rows: int = ROWS) -> list:
    writer = Writer()  # batch_size 1024
    for i in range(rows):
        writer.push(Record((("id", i), ("v", os.urandom(ROW_BYTES // 2).hex()))), i % 2, 1)
    messages = writer.close()
    assert max(len(m.updates) for m in messages if isinstance(m, Updates)) == 1024
    return messages


def updates_of(messages) -> Counter:
    return Counter(u for m in messages if isinstance(m, Updates) for u in m.updates)


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_an_ocf_of_wide_rows_is_cut_into_blocks_the_readers_take(codec: str) -> None:
    messages = wide_messages()
    out = io.BytesIO()
    written = write_ocf(out, messages, SCHEMA, codec=codec)
    data = out.getvalue()
    header, stream = ocf.read_header(io.BytesIO(data), "written")
    blocks = list(ocf.read_blocks(stream, header, "written"))  # refuses a block over the bound
    assert max(len(b.data) for b in blocks) <= ocf.MAX_DATUM_BYTES  # decompressed
    assert written > len(messages)  # the message of 1024 updates took two datums
    back = list(read_stream(io.BufferedReader(io.BytesIO(data)), name="written", schema=SCHEMA))
    assert updates_of(back) == updates_of(messages)
    assert collect(back).updates == collect(messages).updates


def test_json_lines_of_wide_rows_are_cut_into_lines_the_readers_take() -> None:
    messages = wide_messages()
    out = io.BytesIO()
    written = write_json_lines(out, messages, SCHEMA)
    back = list(read_json_lines(io.BytesIO(out.getvalue()), name="written", schema=SCHEMA))
    lines = out.getvalue().splitlines(keepends=True)
    assert max(map(len, lines)) <= jsonl.MAX_LINE_BYTES
    assert len(lines) == written > len(messages)
    assert updates_of(back) == updates_of(messages)
    assert collect(back).updates == collect(messages).updates


def huge_message() -> Updates:
    return Updates([(Record((("id", 1), ("v", "a"))), 7, 1),
                    (Record((("id", 2), ("v", "x" * HUGE))), 7, 1)])


@pytest.mark.parametrize("carrier", ["avro", "json"])
def test_an_update_too_large_for_any_message_is_refused_before_its_message(
        carrier: str) -> None:
    first = Updates([(Record((("id", 0), ("v", "small"))), 7, 1)])
    out = io.BytesIO()
    with pytest.raises(UpdateTooLarge) as info:
        if carrier == "avro":
            write_ocf(out, [first, huge_message()], SCHEMA)
        else:
            write_json_lines(out, [first, huge_message()], SCHEMA)
    error = info.value
    assert isinstance(error, InputError)  # the CLI's one line and exit 2
    assert error.update == huge_message().updates[1]
    bound = ocf.MAX_DATUM_BYTES if carrier == "avro" else jsonl.MAX_LINE_BYTES - 1
    assert error.bound == bound and error.size > HUGE
    assert str(error).startswith(f"an update at time 7 takes {error.size} bytes as ")
    assert f"more than one message may hold ({bound} bytes" in str(error)
    if carrier == "json":  # the first message is written, nothing of the huge one
        assert out.getvalue().count(b"\n") == 1 and b'"a"' not in out.getvalue()


# ------------------------------------------------------------------------- the property


def _alone(update, carrier: str) -> int:
    """The bytes of a message of this update alone, as the carrier writes it."""
    if carrier == "avro":
        return len(next(avro_datums([Updates([update])], SCHEMA, bound=2**40)))
    return len(next(json_lines([Updates([update])], SCHEMA, bound=2**40))) - 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 150), min_size=10, max_size=60),
    times=st.lists(st.integers(0, 40), min_size=60, max_size=60),
    batch=st.integers(1, 80),
    bound=st.integers(150, 1500),
    carrier=st.sampled_from(["avro", "json"]),
)
def test_cutting_to_a_bound_keeps_the_history(sizes, times, batch, bound, carrier) -> None:
    """Any bound: every datum or line is within it, and the messages read back say the same
    history and frontier as the messages written (updates cut into runs, progress statements
    into parts of their intervals); or an update that alone is over it is refused."""
    writer = Writer(batch_size=batch)
    for i, size in enumerate(sizes):
        writer.push(Record((("id", i), ("v", "y" * size))), times[i], 1)
    messages = [*writer.finish_through(20), *writer.close()]
    try:
        if carrier == "avro":
            out = list(avro_datums(messages, SCHEMA, bound=bound))
            back = [message_from_python(fastavro.schemaless_reader(io.BytesIO(d), SCHEMA.parsed),
                                        SCHEMA, Location()) for d in out]
        else:
            out = list(json_lines(messages, SCHEMA, bound=bound))
            assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in out)
            back = list(read_json_lines(out, name="lines", schema=SCHEMA))
    except UpdateTooLarge as error:
        assert error.size > error.bound
        assert _alone(error.update, carrier) == error.size
        return
    assert all(len(x) <= bound for x in out)  # a line's newline counts
    assert all(_alone(u, carrier) <= (bound if carrier == "avro" else bound - 1)
               for m in messages if isinstance(m, Updates) for u in m.updates)
    assert updates_of(back) == updates_of(messages)
    expected, got = collect(messages), collect(back)
    assert got.frontier == expected.frontier
    assert Counter(got.updates) == Counter(expected.updates)
    if max(len(x) for x in map(_encoded_whole(carrier), messages)) > bound:
        assert len(out) > len(messages)


def _encoded_whole(carrier: str):
    if carrier == "avro":
        return lambda m: next(avro_datums([m], SCHEMA, bound=2**40))
    return lambda m: next(json_lines([m], SCHEMA, bound=2**40))


def test_a_progress_statement_of_many_times_is_cut_into_statements_that_tile_it() -> None:
    counts = tuple((t, 1 + t % 3) for t in range(5, 405, 2))
    statement = Progress.make([5], [500], counts)
    for carrier, pieces in (
            ("avro", list(avro_datums([statement], SCHEMA, bound=120))),
            ("json", list(json_lines([statement], SCHEMA, bound=400)))):
        if carrier == "avro":
            back = [message_from_python(fastavro.schemaless_reader(io.BytesIO(d), SCHEMA.parsed),
                                        SCHEMA, Location()) for d in pieces]
        else:
            back = list(read_json_lines(pieces, name="lines", schema=SCHEMA))
        assert len(back) > 2 and all(isinstance(p, Progress) for p in back)
        assert back[0].lower == statement.lower and back[-1].upper == statement.upper
        assert all(a.upper == b.lower for a, b in itertools.pairwise(back))
        assert tuple(c for p in back for c in p.counts) == counts


# ----------------------------------------------------------------------------- the CLI


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=120)


@pytest.fixture()
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.avsc"
    path.write_bytes(orjson.dumps({"type": "record", "name": "row", "fields": [
        {"name": "id", "type": "long"}, {"name": "v", "type": "string"}]}))
    return path


def test_encode_avro_of_wide_rows_decodes(schema_file: Path, tmp_path: Path) -> None:
    """The defect as a user met it: `encode --avro` succeeded, then `decode` refused the file."""
    changes = tmp_path / "changes.jsonl"
    with open(changes, "wb") as fo:
        for i in range(1030):
            fo.write(orjson.dumps({"data": {"id": i, "v": f"{i:06d}" * 2800}, "time": 1,
                                   "diff": 1}) + b"\n")
    out = tmp_path / "out.avro"
    encoded = run("encode", "--schema", str(schema_file), "--close", "--avro", str(out),
                  str(changes))
    assert encoded.returncode == 0, encoded.stderr
    decoded = run("decode", str(out))
    assert decoded.returncode == 0, decoded.stderr[-500:]
    lines = decoded.stdout.splitlines()
    assert len(lines) == 1030 + 1 and lines[-1] == b'{"frontier":[]}'


def test_encode_refuses_an_update_too_large_naming_its_line(schema_file: Path,
                                                            tmp_path: Path) -> None:
    """A line within the input's bound whose update takes more than an Avro block may hold:
    one line naming the input file and line, exit 2, and no output file, not even a partial
    one beside its place."""
    changes = tmp_path / "changes.jsonl"
    value = "z" * (jsonl.MAX_LINE_BYTES - 2**16)  # a line the reader takes; over a datum
    with open(changes, "wb") as fo:
        fo.write(b'{"data":{"id":1,"v":"small"},"time":1,"diff":1}\n')
        fo.write(orjson.dumps({"data": {"id": 2, "v": value}, "time": 1, "diff": 1}) + b"\n")
        fo.write(b'{"finished": 1}\n')
    out = tmp_path / "out.avro"
    result = run("encode", "--schema", str(schema_file), "--avro", str(out), str(changes))
    assert result.returncode == 2, result.stderr
    stderr = result.stderr.decode()
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"changelake: error: {changes}, line 2: an update at time 1 "
                             "takes "), stderr
    assert f"more than one message may hold ({ocf.MAX_DATUM_BYTES} bytes" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changes.jsonl", "rows.avsc"]
