"""The `materialize-cdc` data source and the CLI's Spark decode job, against the local engine."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from changelake.errors import InputError, ProtocolError
from changelake.formats.materialize import (
    CdcSchema,
    read_all,
    write_json_lines,
    write_ocf,
)
from changelake.local import decode_local, frontier_line
from changelake.protocol import Antichain, collect
from changelake.simulate import write_log_files
from changelake.spark.decode_files import decode_files, read_messages_frame
from changelake.spark.decoder import decode, split_messages
from changelake.spark.encoder import encode
from changelake.spark.source import register
from conftest import seeded
from spark_helpers import FIELDS, canonical, rows_of, write

pytestmark = pytest.mark.spark

SCHEMA = CdcSchema.for_fields(
    [{"name": "k", "type": "long"}, {"name": "v", "type": ["null", "long"]}]
)


def _history(seed: int, n: int = 60) -> list[tuple[dict, int, int]]:
    rng = seeded(seed)
    return [
        ({"k": rng.randrange(8), "v": rng.choice([None, 1, 2])}, rng.randrange(10),
         rng.choice([-1, 1, 2]))
        for _ in range(n)
    ]


def _log_dir(root: Path, *, close: bool = True) -> Path:
    """Two writers' output over many files, OCF and JSON lines, one file delivered twice."""
    changes = _history(7)
    first = write(changes, [1, 3, 6], close, 4)
    second = write(changes, [2, 6], close, 3)
    rng = seeded(3)
    messages = [*first, *second]
    rng.shuffle(messages)
    out = root / "log"
    paths = write_log_files(out, [messages[i : i + 3] for i in range(0, len(messages), 3)],
                            SCHEMA)
    shutil.copy(paths[1], out / f"redelivered-{paths[1].name}")
    return out


@pytest.fixture()
def log_dir(tmp_path: Path) -> Path:
    return _log_dir(tmp_path)


def test_directory_of_mixed_files_decodes_like_the_reader(spark, log_dir: Path) -> None:
    register(spark)
    messages = (
        spark.read.format("materialize-cdc").option("avroSchema", _schema_text()).load(
            str(log_dir)
        )
    )
    assert messages.schema["updates"].dataType.elementType["data"].dataType.simpleString() == (
        "struct<k:bigint,v:bigint>"
    )
    got = decode(*split_messages(messages))
    expected = collect(read_all([log_dir], schema=SCHEMA))
    try:
        assert got.frontier == expected.frontier == Antichain()
        assert canonical(rows_of(got.updates)) == canonical(expected.updates)
    finally:
        got.unpersist()


def test_the_schema_option_takes_a_file_of_the_union_or_of_the_rows_record(
        spark, log_dir: Path, tmp_path: Path) -> None:
    register(spark)
    record = tmp_path / "record.json"
    record.write_text(_schema_text())
    union_rows = spark.read.format("materialize-cdc").option("schema", str(record)).load(
        str(log_dir)).collect()
    import orjson

    record.write_bytes(orjson.dumps(SCHEMA.avro[0]["items"]["fields"][0]["type"]))
    record_rows = spark.read.format("materialize-cdc").option("schema", str(record)).load(
        str(log_dir)).collect()
    def plain(rows: list) -> list[str]:
        return sorted(str(r.asDict(recursive=True)) for r in rows)

    assert plain(record_rows) == plain(union_rows) and len(union_rows) > 10


def test_ocf_schema_is_taken_from_the_file_when_no_option(spark, tmp_path: Path) -> None:
    register(spark)
    with (tmp_path / "a.avro").open("wb") as fo:
        write_ocf(fo, write([({"k": 1, "v": 2}, 0, 1)], [0], False, 2), SCHEMA)
    rows = spark.read.format("materialize-cdc").load(str(tmp_path)).collect()
    updates = [u for r in rows if r["updates"] for u in r["updates"]]
    assert [(u["data"]["k"], u["data"]["v"], u["time"], u["diff"]) for u in updates] == [
        (1, 2, 0, 1)
    ]


def test_cli_job_prints_the_local_engines_bytes(spark, log_dir: Path, tmp_path: Path) -> None:
    # An unfinished stream too: the frontier stops where updates go missing.
    (tmp_path / "partial").mkdir()
    partial = _log_dir(tmp_path / "partial", close=False)
    (partial / "part-000.jsonl").unlink()
    for directory in (log_dir, partial):
        local = io.BytesIO()
        report = decode_local([str(directory)], local, schema=SCHEMA)
        result = decode_files(spark, [directory], schema=SCHEMA)
        try:
            lines = [*result.lines(), frontier_line(result.frontier)]
        finally:
            result.close()
        assert result.frontier == report.frontier
        local_lines = [x for x in local.getvalue().splitlines() if not x.startswith(b'{"fr')]
        spark_lines = [x for x in lines if not x.startswith(b'{"fr')]
        assert spark_lines == local_lines
        assert lines[-1] == local.getvalue().splitlines()[-1]


def test_unreadable_input_is_an_input_error_or_set_aside(spark, tmp_path: Path) -> None:
    (tmp_path / "ok.jsonl").write_bytes(
        b'{"array":[{"data":{"k":1,"v":null},"time":0,"diff":1}]}\n'
        b'{"com.materialize.cdc.progress":{"lower":[0],"upper":[1],"counts":[{"time":0,"count":1}]}}\n'
    )
    (tmp_path / "bad.jsonl").write_bytes(b"{not json\n")
    with pytest.raises(InputError, match=r"bad.jsonl, line 1: not valid JSON"):
        decode_files(spark, [tmp_path], schema=SCHEMA)
    result = decode_files(spark, [tmp_path], schema=SCHEMA, strict=False)
    try:
        assert [str(s.location) for s in result.set_aside] == [f"{tmp_path}/bad.jsonl, line 1"]
        assert list(result.updates()) == [{"data": {"k": 1, "v": None}, "time": 0, "diff": 1}]
        assert result.frontier == Antichain([1])
    finally:
        result.close()


def test_protocol_error_names_file_and_line(spark, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(
        b'{"array":[{"data":{"k":1,"v":null},"time":0,"diff":1}]}\n'
        b'{"array":[{"data":{"k":1,"v":null},"time":0,"diff":3}]}\n'
    )
    with pytest.raises(ProtocolError) as caught:
        decode_files(spark, [tmp_path], schema=SCHEMA)
    assert caught.value.rule == "conflicting-diff"
    assert caught.value.location is not None
    assert caught.value.location.file == str(tmp_path / "a.jsonl")
    assert caught.value.location.line == 2


def test_encoded_messages_written_as_avro_and_json_read_back(spark, tmp_path: Path) -> None:
    changes = _history(11, 40)
    df = spark.createDataFrame(changes, "data struct<k:bigint,v:bigint>, time bigint, diff bigint")
    messages = encode(df, None, batch_size=5).repartition(3)
    register(spark)
    for fmt in ("avro", "json"):
        target = tmp_path / fmt
        (
            messages.write.format("materialize-cdc")
            .mode("append")
            .option("format", fmt)
            .option("avroSchema", _schema_text())
            .save(str(target))
        )
        files = sorted(p.name for p in target.iterdir())
        assert files and not any(name.startswith(".") for name in files)
        expected = collect(read_all([target], schema=SCHEMA))
        from changelake.protocol import consolidate
        from changelake.values import freeze

        history = consolidate((freeze(d, FIELDS), t, r) for d, t, r in changes)
        assert expected.frontier == Antichain()
        assert canonical(expected.updates) == canonical(history)


def _write(messages, target: Path, mode: str) -> None:
    (messages.write.format("materialize-cdc").mode(mode).option("format", "json")
     .option("avroSchema", _schema_text()).save(str(target)))


def _history_of(changes: list) -> list:
    from changelake.protocol import consolidate
    from changelake.values import freeze

    return canonical(consolidate((freeze(d, FIELDS), t, r) for d, t, r in changes))


def test_write_append_keeps_and_overwrite_replaces(spark, tmp_path: Path) -> None:
    """append adds files beside what is there; overwrite leaves only its own files (and hidden
    files, which no reader reads); both read back as exactly what was written."""
    register(spark)
    ddl = "data struct<k:bigint,v:bigint>, time bigint, diff bigint"
    first, second = _history(21, 30), _history(22, 30)
    first_messages = encode(spark.createDataFrame(first, ddl), None, batch_size=4).repartition(2)
    second_messages = encode(spark.createDataFrame(second, ddl), None, batch_size=4) \
        .repartition(3)
    target = tmp_path / "out"
    _write(first_messages, target, "append")
    before = set(target.iterdir())
    (target / ".hidden-in-progress").write_text("not a message")
    _write(first_messages, target, "append")
    appended = set(target.iterdir())
    assert before < appended  # the first files are still there, with new ones beside them
    # The same messages twice are a redelivery: read back, the history once.
    assert len([p for p in appended if not p.name.startswith(".")]) == 4
    twice = collect(read_all([target], schema=SCHEMA))
    assert canonical(twice.updates) == _history_of(first)

    _write(second_messages, target, "overwrite")
    kept = {p.name for p in target.iterdir()}
    assert not kept & {p.name for p in appended if not p.name.startswith(".")}
    assert ".hidden-in-progress" in kept
    assert not any(name.endswith(".tmp") for name in kept)
    replaced = collect(read_all([target], schema=SCHEMA))
    assert replaced.frontier == Antichain()
    assert canonical(replaced.updates) == _history_of(second)


def test_stream_reads_each_new_file_once(spark, tmp_path: Path) -> None:
    register(spark)
    source = tmp_path / "in"
    source.mkdir()
    messages = write(_history(5, 30), [2, 5], True, 4)
    for i, message in enumerate(messages):
        target = source / f"m{i:03d}.jsonl"
        with (source / f".m{i:03d}.tmp").open("wb") as fo:
            write_json_lines(fo, [message], SCHEMA)
        (source / f".m{i:03d}.tmp").rename(target)
        if i == len(messages) // 2:
            _drain(spark, source, tmp_path)
    _drain(spark, source, tmp_path)
    seen = spark.read.parquet(str(tmp_path / "sink"))
    assert seen.select("_file").distinct().count() == len(messages)
    assert seen.count() == len(messages)  # no file read twice across the two runs


def _drain(spark, source: Path, root: Path) -> None:
    query = (
        spark.readStream.format("materialize-cdc")
        .option("avroSchema", _schema_text())
        .load(str(source))
        .writeStream.format("parquet")
        .option("path", str(root / "sink"))
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_read_messages_frame_has_location_columns(spark, log_dir: Path) -> None:
    df = read_messages_frame(spark, [str(p) for p in sorted(log_dir.iterdir())], schema=SCHEMA)
    row = df.where("_line is not null").first()
    assert row is not None and row["_file"].endswith(".jsonl")


def _schema_text() -> str:
    import orjson

    return orjson.dumps(SCHEMA.avro).decode()


def test_a_corrupt_container_header_is_one_planning_error_naming_the_file(tmp_path):
    """The schema is taken from the first container file's checked header while Spark plans
    the read: a damaged header is one located line, never fastavro's own exception."""
    from changelake.formats.materialize import OCF_MAGIC
    from changelake.spark.source import NAME, _first_ocf_schema

    bad = tmp_path / "bad.avro"
    bad.write_bytes(OCF_MAGIC + b"\x02\x16avro.schema\xff\xff\xff\xff\x0f")
    with pytest.raises(ValueError, match=rf"^{NAME}: {bad}, offset 0: ") as raised:
        _first_ocf_schema([str(bad)])
    assert "\n" not in str(raised.value)
