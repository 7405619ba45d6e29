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
from tests.support.seeding import seeded
from tests.support.spark_helpers import FIELDS, canonical, rows_of, write

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


_TYPED_FIELDS = ("k", "price", "wide", "day", "at", "local", "clock", "id", "days")
_TYPED_RECORD = {
    "type": "record", "name": "row", "fields": [
        {"name": "k", "type": "long"},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                            "precision": 10, "scale": 2}]},
        {"name": "wide", "type": ["null", {"type": "fixed", "name": "wide_t", "size": 20,
                                           "logicalType": "decimal", "precision": 40}]},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "local", "type": ["null", {"type": "long",
                                            "logicalType": "local-timestamp-millis"}]},
        {"name": "clock", "type": ["null", {"type": "long", "logicalType": "time-micros"}]},
        {"name": "id", "type": ["null", {"type": "string", "logicalType": "uuid"}]},
        # An annotation readers ignore (`date` on a long): the value is the long.
        {"name": "days", "type": ["null", {"type": "long", "logicalType": "date"}]},
    ]}
_TYPED_ROWS = [
    {"k": 1, "price": "12.50", "wide": "1" * 40, "day": "2024-02-29",
     "at": "2024-11-03T05:30:00.000001+00:00", "local": "2024-11-03T01:30:00.250000",
     "clock": "03:04:05.000006", "id": "0c6f1f0e-8f3c-4b61-9d0a-3f1b2c4d5e6f", "days": 19000},
    {"k": 2, "price": "-0.01", "wide": "0", "day": "0001-01-01",
     "at": "2024-11-03T06:30:00+00:00", "local": "1969-12-31T23:59:59.999000",
     "clock": "00:00:00", "id": None, "days": None},
    {"k": 3, "price": None, "wide": None, "day": None, "at": None, "local": None,
     "clock": None, "id": None, "days": None},
]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_logical_types_read_as_the_spark_types_the_capture_writes_them_from(
        spark, tmp_path: Path, fmt: str) -> None:
    """Decimals (precision <= 38), dates, instants and local date-times come out as Spark's
    own types, from a container file and from JSON lines alike, exactly (the instants checked
    as epoch microseconds: no session time zone involved); times, uuids and wider decimals
    as their text; an ignored annotation as its underlying type. And they go back: Spark's
    `encode` of the decoded rows writes the same updates."""
    import datetime as dt
    import decimal

    import orjson
    from pyspark.sql import types as T

    from changelake.formats.materialize import cdc_schema_around
    from changelake.protocol import Writer
    from changelake.values import freeze

    schema = CdcSchema.from_json(cdc_schema_around(_TYPED_RECORD))
    writer = Writer(batch_size=2)
    for row in _TYPED_ROWS:
        writer.push(freeze(row, _TYPED_FIELDS), 5, 1)
    messages = [*writer.finish_through(5), *writer.close()]
    log = tmp_path / f"log.{'avro' if fmt == 'avro' else 'jsonl'}"
    with log.open("wb") as fo:
        (write_ocf if fmt == "avro" else write_json_lines)(fo, messages, schema)
    schema_file = tmp_path / "schema.json"
    schema_file.write_bytes(orjson.dumps(_TYPED_RECORD))

    register(spark)
    frame = spark.read.format("materialize-cdc").option("schema", str(schema_file)).load(
        str(log))
    updates, progress = split_messages(frame)
    types = {f.name: f.dataType for f in updates.schema["data"].dataType.fields}
    assert types == {
        "k": T.LongType(), "price": T.DecimalType(10, 2), "wide": T.StringType(),
        "day": T.DateType(), "at": T.TimestampType(), "local": T.TimestampNTZType(),
        "clock": T.StringType(), "id": T.StringType(), "days": T.LongType(),
    }
    with decode(updates, progress) as decoded:
        assert decoded.frontier == Antichain()
        got = {r["k"]: r for r in decoded.updates.selectExpr(
            "data.k AS k", "data.price AS price", "data.wide AS wide", "data.day AS day",
            "unix_micros(data.at) AS at", "data.local AS local",
            "data.clock AS clock", "data.id AS id", "data.days AS days").collect()}
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        for row in _TYPED_ROWS:
            r = got[row["k"]]
            assert r["price"] == (None if row["price"] is None
                                  else decimal.Decimal(row["price"]))
            assert r["wide"] == row["wide"] and r["clock"] == row["clock"]
            assert r["id"] == row["id"] and r["days"] == row["days"]
            assert r["day"] == (None if row["day"] is None
                                else dt.date.fromisoformat(row["day"]))
            assert r["at"] == (None if row["at"] is None else
                               (dt.datetime.fromisoformat(row["at"]) - epoch)
                               // dt.timedelta(microseconds=1))
            assert r["local"] == (None if row["local"] is None
                                  else dt.datetime.fromisoformat(row["local"]))
        # Back through Spark's encode and the writer: the same updates as were written.
        out = tmp_path / "again"
        (encode(decoded.updates, None).write.format("materialize-cdc").mode("append")
         .option("format", fmt).option("schema", str(schema_file)).save(str(out)))
    again = collect(read_all([out], schema=schema))
    first = collect(read_all([log], schema=schema))
    assert first.frontier == again.frontier == Antichain()
    assert sorted(map(repr, again.updates)) == sorted(map(repr, first.updates))
    assert len(first.updates) == len(_TYPED_ROWS)


def test_python_workers_run_in_utc(spark) -> None:
    """A Python writer gets each timestamp as a naive datetime in its worker's local time
    (PySpark's conversion): only in UTC is that the instant exactly, the hour that New York
    repeats in November included (the test above passes under `TZ=America/New_York` with
    it, and fails there without it)."""
    import os

    from pyspark.sql.functions import udf

    zone = udf(lambda: os.environ.get("TZ"), "string")
    assert spark.range(1).select(zone().alias("tz")).first()["tz"] == "UTC"


def test_wide_rows_are_written_in_messages_the_readers_take(spark, tmp_path: Path) -> None:
    """1,100 rows of ~16.6 kB in one partition: the encoder's message of 1024 updates takes
    ~17 MB, more than an Avro block or JSON line our readers take (16 MiB); the sink cuts
    it, and the files read back, through this source and the local reader alike."""
    import os as _os

    from changelake.formats import lines as jsonl
    from changelake.formats import ocf

    changes = [({"k": i, "v": None}, 5, 1) for i in range(1100)]  # one time: 1024 + 76
    wide = [(f"{i:05d}" + _os.urandom(8_300).hex(),) for i in range(len(changes))]
    df = spark.createDataFrame(
        [(d["k"], w[0], t, r) for (d, t, r), w in zip(changes, wide, strict=True)],
        "k bigint, w string, time bigint, diff bigint",
    ).selectExpr("named_struct('k', k, 'w', w) as data", "time", "diff")
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # all 1100 in one batch of 1024 + 76
    try:
        messages = encode(df, None).coalesce(1).cache()
        sizes = sorted(len(r["updates"]) for r in messages.select("updates").collect()
                       if r["updates"] is not None)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
    assert sizes == [76, 1024]  # the message the readers refused, before the fix
    schema = CdcSchema.for_fields([{"name": "k", "type": "long"},
                                   {"name": "w", "type": "string"}])
    text = orjson_dumps(schema.avro)
    register(spark)
    for fmt in ("avro", "json"):
        target = tmp_path / fmt
        (messages.write.format("materialize-cdc").mode("append").option("format", fmt)
         .option("avroSchema", text).save(str(target)))
        (path,) = [p for p in target.iterdir() if not p.name.startswith(".")]
        if fmt == "avro":
            with open(path, "rb") as fo:
                header, stream = ocf.read_header(fo, path.name)
                assert max(len(b.data) for b in ocf.read_blocks(stream, header, path.name)) \
                    <= ocf.MAX_DATUM_BYTES
        else:
            assert max(map(len, path.read_bytes().splitlines())) < jsonl.MAX_LINE_BYTES
        local = collect(read_all([target], schema=schema))
        assert local.frontier == Antichain() and len(local.updates) == len(changes)
        rows = (spark.read.format("materialize-cdc").option("avroSchema", text)
                .load(str(target)).collect())
        updates = sorted((u["data"]["k"], u["data"]["w"], u["time"], u["diff"])
                         for r in rows if r["updates"] for u in r["updates"])
        assert updates == sorted((d["k"], w[0], t, r) for (d, t, r), w
                                 in zip(changes, wide, strict=True))
        assert sum(1 for r in rows if r["updates"]) > 2  # 1024 (cut) + 76
    messages.unpersist()


def orjson_dumps(value) -> str:
    import orjson

    return orjson.dumps(value).decode()
