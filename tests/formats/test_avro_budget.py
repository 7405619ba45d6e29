"""The decoded-size budget of one Avro block or framed message (issue 67, avro_bounds.py).

Schemas without a zero-width array item still let a few bytes make many objects: an update of
two bytes (its time and diff) whose data is a record of hundreds of nulls is a dict of
hundreds of entries, about 10 KB. A block of a few hundred thousand such updates (under a
megabyte) decoded to several GB. Now a block that may decode beyond `BLOCK_BUDGET` is decoded
value by value with its cost counted, and refused in one line (file, offset, the datum, the
rule) as soon as it reaches the budget; a block within it, or one of few large values, reads
as before. The commands run under an address-space cap, so a block that gets through fails the
test, not the machine.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest

from changelake.errors import InputError, Location
from changelake.formats import avro_bounds, ocf
from changelake.formats.materialize import (
    CdcSchema,
    cdc_schema,
    confluent_header,
    decode_framed,
    read_all,
    read_ocf,
    write_ocf,
)
from changelake.protocol.messages import Updates
from tests.formats.test_avro_bounds import CAP, PROGRESS, capped, container, one_line_exit_2
from tests.support.paths import ROOT

L = ocf.encode_long
RULE = "a decoded-size budget per block or message"
WIDE = 300  # nulls a row


def wide_schema() -> list:
    """Rows of one record of `WIDE` nulls: zero bytes a row, a dict of `WIDE` entries."""
    nulls = {"type": "record", "name": "nulls",
             "fields": [{"name": f"n{i}", "type": "null"} for i in range(WIDE)]}
    return cdc_schema([{"name": "n", "type": nulls}])


def wide_updates(count: int) -> bytes:
    """One updates datum of `count` updates: each its (empty) data, time 0, diff 1."""
    return L(0) + L(count) + (L(0) + L(1)) * count + L(0)


def test_a_block_of_many_wide_rows_is_refused_in_one_line_under_the_cap(tmp_path: Path
                                                                         ) -> None:
    """800 KB of 400,000 updates: about 4 GB of dicts as fastavro decodes them (a
    MemoryError under the cap before the budget); now refused at the budget, in one line."""
    path = tmp_path / "wide.avro"
    path.write_bytes(container(wide_schema(), wide_updates(400_000), PROGRESS))
    assert path.stat().st_size < 1_000_000
    offset = len(container(wide_schema())) - len(L(0) + L(0) + b"S" * 16)
    err = one_line_exit_2(capped("decode", str(path)), f"{path}, offset {offset}, item 0: ",
                          RULE, f"more than {avro_bounds.BLOCK_BUDGET >> 20} MiB")
    assert "MemoryError" not in err


def test_a_block_of_a_few_wide_rows_decodes_under_the_cap(tmp_path: Path) -> None:
    """Control: the same rows, 1,000 of them, decode (fastavro at once: within the budget;
    identical, they are one distinct update)."""
    path = tmp_path / "few.avro"
    path.write_bytes(container(wide_schema(), wide_updates(1000),
                               L(1) + L(1) + L(0) + L(0) + L(1) + L(1) + L(0) + L(1)
                               + L(0) + L(1) + L(0)))
    result = capped("decode", str(path))
    assert result.returncode == 0, result.stderr.decode()
    assert orjson.loads(result.stdout.splitlines()[0])["time"] == 0


def test_a_block_of_one_large_value_is_read_value_by_value_and_taken(tmp_path: Path) -> None:
    """A 12 MiB string: a block that might decode beyond the budget (were it 12 MiB of
    one-byte rows), so it is read value by value, and taken: it costs about its bytes."""
    schema = cdc_schema([{"name": "s", "type": "string"}])
    text = "x" * (12 * 2**20)
    cdc = CdcSchema.from_json(schema)
    datum = io.BytesIO()
    fastavro.schemaless_writer(datum, cdc.parsed, [{"data": {"s": text}, "time": 0, "diff": 1}])
    assert cdc.cost.static(len(datum.getvalue()), 1) > avro_bounds.BLOCK_BUDGET
    path = tmp_path / "large.avro"
    path.write_bytes(container(schema, datum.getvalue(), PROGRESS))
    result = capped("decode", str(path))
    assert result.returncode == 0, result.stderr.decode()
    assert orjson.loads(result.stdout.splitlines()[0]) == {"data": {"s": text}, "time": 0,
                                                           "diff": 1}


FRAMED = """
import sys
from changelake.errors import ChangelakeError, Location
from changelake.formats.materialize import CdcSchema, confluent_header, decode_framed
from tests.formats.test_avro_budget import wide_schema, wide_updates
try:
    decode_framed(confluent_header(1) + wide_updates(400_000),
                  {1: CdcSchema.from_json(wide_schema())}, Location("topic t", offset=3))
except ChangelakeError as error:
    print(error)
    sys.exit(0)
sys.exit("decoded")
"""


def test_a_framed_message_of_many_wide_rows_is_refused_under_the_cap() -> None:
    """The Kafka path: the same updates as one Confluent-framed message."""
    import os
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    here = str(ROOT)
    env = {**os.environ, "MALLOC_ARENA_MAX": "2",
           "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", FRAMED], capture_output=True, timeout=300,
                            preexec_fn=limit, env=env)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    out = result.stdout.decode()
    assert out.startswith("topic t, offset 3: the message decodes to more than"), out
    assert RULE in out and out.count("\n") == 1, out


NODE = {"type": "record", "name": "p.node", "fields": [
    {"name": "v", "type": ["null", "long", {"type": "fixed", "name": "f2", "size": 2}]},
    {"name": "tags", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
]}
NAMESPACED = {"type": "record", "name": "R", "namespace": "x.y", "fields": [
    {"name": "n", "type": {"type": "record", "name": "N", "fields": [
        {"name": "v", "type": "long"}]}}]}
SCHEMAS: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    # A type named in another namespace than the one it is used in (x.y.N, defined inside
    # x.y.R, used from com.materialize.cdc): a part of the schema parsed alone keeps it.
    ([{"name": "u", "type": ["null", NAMESPACED]}, {"name": "w", "type": ["null", "x.y.N"]}],
     [{"u": {"n": {"v": 1}}, "w": {"v": 2}}, {"u": None, "w": None}]),
    ([{"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]}],
     [{"a": 1, "b": None}, {"a": -5, "b": "é"}]),
    ([{"name": "xs", "type": {"type": "array", "items": ["null", "double"]}},
      {"name": "d", "type": {"type": "int", "logicalType": "date"}},
      {"name": "e", "type": {"type": "enum", "name": "e", "symbols": ["A", "B"]}}],
     [{"xs": [None, 1.5], "d": 3, "e": "B"}, {"xs": [], "d": 0, "e": "A"}]),
    ([{"name": "n", "type": NODE}, {"name": "m", "type": ["null", "p.node"]},
      {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}}],
     [{"n": {"v": b"ab", "tags": {"k": ["x", "y"], "": []}}, "m": None, "t": 7},
      {"n": {"v": 3, "tags": {}}, "m": {"v": None, "tags": {"z": ["w"]}}, "t": 0}]),
]


@pytest.mark.parametrize("fields, rows", SCHEMAS)
def test_the_budgeted_reader_reads_what_fastavro_reads(fields: list, rows: list) -> None:
    cdc = CdcSchema.from_json(cdc_schema(fields))
    updates = [{"data": row, "time": i, "diff": 1} for i, row in enumerate(rows)]
    progress = {"lower": [0], "upper": [9], "counts": [{"time": 0, "count": 2}]}
    for datum in (updates, progress):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, cdc.parsed, datum)
        expected = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), cdc.parsed)
        fo = io.BytesIO(out.getvalue())
        budget = [float(avro_bounds.BLOCK_BUDGET)]
        assert cdc.cost.read(fo, budget) == expected
        assert fo.tell() == len(out.getvalue())
        assert 0 < avro_bounds.BLOCK_BUDGET - budget[0] <= cdc.cost.weigh(out.getvalue())


def test_the_cost_bound_is_above_what_decoding_takes() -> None:
    """The stated bound holds: tracemalloc's peak while a block of wide rows is read (fastavro
    values and frozen rows) is under what `Cost` charges for it."""
    import tracemalloc

    fo = io.BytesIO(container(wide_schema(), wide_updates(2000)))
    cdc = CdcSchema.from_json(wide_schema())
    tracemalloc.start()
    try:
        messages = list(read_ocf(fo, name="f"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(messages[0].updates) == 2000
    assert peak < cdc.cost.weigh(wide_updates(2000)), peak


def test_the_writer_cuts_a_message_to_the_budget(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A message of 2,000 wide updates (4 KB of Avro, several budgets' worth of dicts, the
    budget made 8 MiB to keep the test short): `write_ocf` cuts it into datums and blocks the
    reader takes, and all of it reads back."""
    monkeypatch.setattr(avro_bounds, "BLOCK_BUDGET", 8 * 2**20)
    cdc = CdcSchema.from_json(wide_schema())
    empty = {"n": {f"n{i}": None for i in range(WIDE)}}
    message = Updates([(cdc.python_data(empty), t, 1) for t in range(2000)], Location())
    assert cdc.cost.weigh(wide_updates(2000)) > 3 * avro_bounds.BLOCK_BUDGET
    path = tmp_path / "cut.avro"
    with open(path, "wb") as fo:
        written = write_ocf(fo, [message], cdc)
    assert written > 3
    back = list(read_all([path]))  # a block over the budget would be refused
    assert sum(len(m.updates) for m in back) == 2000


def test_a_framed_message_within_the_budget_decodes() -> None:
    cdc = CdcSchema.from_json(wide_schema())
    message = decode_framed(confluent_header(1) + wide_updates(3), {1: cdc}, Location("t"))
    assert isinstance(message, Updates) and len(message.updates) == 3
    with pytest.raises(InputError, match=RULE):
        decode_framed(confluent_header(1) + wide_updates(60_000), {1: cdc}, Location("t"))
