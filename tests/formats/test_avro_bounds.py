"""An Avro "bomb" (issue 67): a few bytes whose counts claim more than memory holds.

The first: a data column `{"type": "array", "items": "null"}` (0 bytes an item) and one update
whose array claims 2^40 items, in a container file of about 800 bytes. Its schema is refused
wherever a Materialize CDC schema is taken (`formats/avro_bounds.py`): a container file's
header (`decode`, the Spark source), a registry's answer (`decode --kafka`), a schema file.
The commands run as real processes under an address-space cap, so a bomb that gets through
fails the test (MemoryError, exit not 2, or the wrong reason) instead of taking the machine.
"""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest

from changelake.errors import InputError, SchemaError
from changelake.formats import avro_bounds, ocf
from changelake.formats.materialize import CdcSchema, cdc_schema, cdc_schema_around, read_all
from changelake.kafka import MockCluster, RegistryServer
from tests.support.kafka_helpers import cluster, new_topic, produce_raw, registry

__all__ = ["cluster", "registry"]  # fixtures

CLI = [str(Path(sys.executable).parent / "changelake")]
#: The address space a command may take: far below a bomb's gigabytes, far above a decode's
#: needs (the same cap runs the controls).
CAP = 1024 * 2**20
BOMB_ITEMS = 2**40
SYNC = b"S" * 16
L = ocf.encode_long

NULLS = {"type": "array", "items": "null"}


def capped(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """The console script under the `CAP` address-space limit (glibc's per-thread arenas
    kept few: each reserves 64 MiB of address space)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    return subprocess.run([*CLI, *args], capture_output=True, timeout=timeout,
                          preexec_fn=limit, env=env)


def one_line_exit_2(result: subprocess.CompletedProcess, *names: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("changelake: error: "), err
    assert "MemoryError" not in err and "Traceback" not in err, err
    for name in names:
        assert name in err, err
    return err


def bomb_schema(column: Any = NULLS) -> list:
    return cdc_schema([{"name": "id", "type": "long"}, {"name": "xs", "type": column}])


def bomb_datum(items: int = BOMB_ITEMS) -> bytes:
    """One update `{id: 0, xs: [items nulls], time: 0, diff: 1}`: union branch 0, an array
    block of 1 update, its data (id, the xs block claiming `items`, its end), time, diff, the
    updates' end."""
    return L(0) + L(1) + L(0) + L(items) + L(0) + L(0) + L(1) + L(0)


def container(schema: Any, *datums: bytes) -> bytes:
    """A container file: fastavro writes the header (it takes the schema as it is), the one
    block is framed by hand."""
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), [], codec="null", sync_marker=SYNC)
    data = b"".join(datums)
    return out.getvalue() + L(len(datums)) + L(len(data)) + data + SYNC


#: The progress statement `[0, 1)` counting one update at 0.
PROGRESS = L(1) + L(1) + L(0) + L(0) + L(1) + L(1) + L(0) + L(1) + L(0) + L(1) + L(0)


@pytest.fixture()
def bomb(tmp_path: Path) -> Path:
    path = tmp_path / "f.avro"
    path.write_bytes(container(bomb_schema(), bomb_datum()))
    return path


RULE = "an array of null items, which take no bytes"


def test_the_bomb_is_a_small_file(bomb: Path) -> None:
    assert bomb.stat().st_size < 1000


def test_decode_refuses_the_bomb_in_one_line_in_bounded_memory(bomb: Path) -> None:
    started = time.monotonic()
    err = one_line_exit_2(capped("decode", str(bomb)), f"{bomb}, offset 0: ",
                          "updates[].data.xs", RULE)
    assert "zero-width" in err
    assert time.monotonic() - started < 60


def test_decode_of_the_same_file_with_few_items_runs_under_the_cap(tmp_path: Path) -> None:
    """Control: the cap lets a decode run, and the array type itself is what is refused (the
    same file with 3 items is refused just the same: the schema, not the count, says it)."""
    path = tmp_path / "three.avro"
    path.write_bytes(container(bomb_schema(), bomb_datum(3)))
    one_line_exit_2(capped("decode", str(path)), f"{path}, offset 0: ", RULE)
    fine = tmp_path / "fine.avro"
    fine.write_bytes(container(bomb_schema({"type": "array", "items": "boolean"}),
                               L(0) + L(1) + L(0) + L(3) + b"\x01\x00\x01" + L(0)
                               + L(0) + L(1) + L(0), PROGRESS))
    result = capped("decode", str(fine))
    assert result.returncode == 0, result.stderr.decode()
    assert orjson.loads(result.stdout.splitlines()[0]) == {
        "data": {"id": 0, "xs": [True, False, True]}, "time": 0, "diff": 1}


@pytest.mark.parametrize("column, item", [
    (NULLS, "null"),
    ({"type": "array", "items": {"type": "record", "name": "nothing", "fields": []}},
     "nothing"),
    ({"type": "array", "items": {"type": "fixed", "name": "none", "size": 0}}, "none"),
    ({"type": "array", "items": {"type": "record", "name": "nulls", "fields": [
        {"name": "a", "type": "null"},
        {"name": "b", "type": {"type": "record", "name": "empty", "fields": []}}]}}, "nulls"),
    (["null", {"type": "map", "values": {"type": "array", "items": "null"}}], "null"),
    ({"type": "array", "items": {"type": "array", "items": "null"}}, "null"),
])
def test_every_zero_width_item_type_is_refused(column: Any, item: str) -> None:
    with pytest.raises(SchemaError, match=rf"updates\[\]\.data\.xs.* an array of {item} items"
                                          r".*zero-width"):
        CdcSchema.from_json(bomb_schema(column))


@pytest.mark.parametrize("column", [
    {"type": "array", "items": {"type": "enum", "name": "one", "symbols": ["A"]}},
    {"type": "array", "items": ["null"]},  # a union: its branch index takes a byte
    {"type": "map", "values": "null"},  # each entry's key takes a byte
    {"type": "array", "items": {"type": "fixed", "name": "f1", "size": 1}},
    {"type": "array", "items": {"type": "record", "name": "r", "fields": [
        {"name": "a", "type": "null"}, {"name": "b", "type": "boolean"}]}},
])
def test_item_types_of_at_least_a_byte_are_taken(column: Any) -> None:
    assert CdcSchema.from_json(bomb_schema(column)).data_fields == ("id", "xs")


def test_the_cdc_frame_itself_is_checked() -> None:
    """A registry's schema may give the frame's own fields other types: an update of no
    bytes (time and diff null, data an empty record) makes the updates array the bomb, and
    a progress statement's `lower` may be an array of nulls."""
    schema = cdc_schema_around({"type": "record", "name": "data", "fields": []})
    update = schema[0]["items"]
    for field in update["fields"]:
        if field["name"] in ("time", "diff"):
            field["type"] = "null"
    with pytest.raises(SchemaError, match=r": updates is an array of com\.materialize\.cdc"
                                          r"\.update items"):
        CdcSchema.from_json(schema)
    schema = cdc_schema([{"name": "id", "type": "long"}])
    schema[1]["fields"][0]["type"] = NULLS
    with pytest.raises(SchemaError, match=r": progress\.lower is an array of null items"):
        CdcSchema.from_json(schema)


def test_min_width_of_a_record_that_contains_itself_is_unbounded() -> None:
    loop = {"type": "record", "name": "loop", "fields": [{"name": "next", "type": "loop"}]}
    assert avro_bounds.min_width(loop, {"loop": loop}) == float("inf")


def test_the_spark_source_reads_through_the_same_check(bomb: Path) -> None:
    """The `materialize-cdc` data source's executors read a file with `read_file` (no
    SparkSession needed to run it): the same refusal, at the same place."""
    from changelake.spark import source

    options = source.Options.parse({"path": str(bomb), "dataAs": "json"})
    with pytest.raises(RuntimeError, match=rf"{source.INPUT_ERROR_MARK}<<.*f\.avro, offset 0: "
                                           rf".*{RULE}"):
        list(source.read_file(options, str(bomb)))
    with pytest.raises(InputError, match=rf"f\.avro, offset 0: .*{RULE}"):
        list(read_all([bomb]))


def _register_raw(registry: RegistryServer, subject: str, schema: Any) -> int:
    """A schema registered as it is (the client's `register` takes only a `CdcSchema`, which
    refuses this one): what another producer could have registered."""
    from changelake.kafka.registry import CONTENT_TYPE

    body = orjson.dumps({"schema": orjson.dumps(schema).decode()})
    request = urllib.request.Request(f"{registry.url}/subjects/{subject}/versions", data=body,
                                     method="POST", headers={"Content-Type": CONTENT_TYPE})
    with urllib.request.urlopen(request, timeout=10) as response:
        return orjson.loads(response.read())["id"]


def test_decode_kafka_refuses_the_bomb_of_a_registry_schema(cluster: MockCluster,
                                                           registry: RegistryServer) -> None:
    from changelake.formats.materialize import confluent_header

    topic = new_topic(cluster, partitions=1)
    schema_id = _register_raw(registry, f"{topic}-value", bomb_schema())
    produce_raw(cluster, topic, [(0, confluent_header(schema_id) + bomb_datum())])
    result = capped("decode", "--kafka", cluster.bootstrap, "--topic", topic,
                    "--schema-registry", registry.url)
    one_line_exit_2(result, f"topic {topic} partition 0, offset 0: ", f"schema id {schema_id}",
                    RULE)


NODE = ["null", {"type": "record", "name": "node", "fields": [
    {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "node"]}]}]


def test_a_recursive_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    """A type that contains itself (found by the fuzz campaign): compiling its converters
    recursed without end (RecursionError, 'internal error'), and a datum of it may nest as
    deep as it has bytes. Refused as the schema, like the bomb."""
    with pytest.raises(SchemaError, match=r"type node contains itself: recursive types are "
                                          "not supported"):
        CdcSchema.from_json(bomb_schema(NODE))
    path = tmp_path / "list.avro"
    path.write_bytes(container(bomb_schema(NODE), L(0) + L(1) + L(0) + L(1) * 5000 + L(0)
                               + L(0) + L(1) + L(0)))
    one_line_exit_2(capped("decode", str(path)), f"{path}, offset 0: ", "contains itself")


@pytest.mark.parametrize("column, value", [
    ({"type": "int", "logicalType": "date"}, L(2**31 - 1)),  # a day beyond year 9999
    ({"type": "long", "logicalType": "timestamp-micros"}, L(2**62)),
])
def test_a_framed_value_fastavro_overflows_on_is_an_input_error(column: Any, value: bytes
                                                                ) -> None:
    """Found by the slow fuzz campaign: fastavro raises OverflowError for these, which the
    framed reader let through (the container reader already named them)."""
    from changelake.errors import Location
    from changelake.formats.materialize import confluent_header, decode_framed

    schema = CdcSchema.from_json(cdc_schema([{"name": "c", "type": column}]))
    payload = confluent_header(3) + L(0) + L(1) + value + L(0) + L(1) + L(0)
    with pytest.raises(InputError, match=r"^topic t partition 0, offset 7: truncated or corrupt "
                                         r"Avro message .*OverflowError"):
        decode_framed(payload, {3: schema}, Location("topic t partition 0", offset=7))
