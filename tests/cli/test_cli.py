"""The CLI contract of `changelake decode`, `encode` and `demo`, through the real console
script (exit codes and stderr are part of the contract)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from changelake.formats.materialize import CdcSchema, write_json_lines, write_ocf
from changelake.simulate import mangle, random_history, write
from tests.support.paths import SAMPLES
from tests.support.seeding import seeded
from tests.support.seeds import (
    seed000_changefeed,
    seed000_schema,
    seed002_changefeed,
    seed002_schema,
)

CLI = [str(Path(sys.executable).parent / "changelake")]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=120)


def jsonl(out: bytes) -> list:
    return [orjson.loads(line) for line in out.splitlines()]


@pytest.fixture()
def seed000(tmp_path: Path) -> tuple[Path, Path]:
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(seed000_schema()))
    feed = tmp_path / "feed.jsonl"
    feed.write_text(seed000_changefeed())
    return schema, feed


def test_decode_seed000_strict_fails_with_one_line(seed000: tuple[Path, Path]) -> None:
    schema, feed = seed000
    result = run("decode", "--schema", str(schema), str(feed))
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"{feed}, line 1: not valid JSON" in err


def test_decode_seed000_lenient_reports_and_goes_on(seed000: tuple[Path, Path]) -> None:
    schema, feed = seed000
    result = run("decode", "--lenient", "--schema", str(schema), str(feed))
    assert result.returncode == 0
    assert jsonl(result.stdout)[-1] == {"frontier": [5]}
    assert "set aside" in result.stderr.decode() and "line 1" in result.stderr.decode()


def test_decode_seed000_fixed(seed000: tuple[Path, Path]) -> None:
    schema, feed = seed000
    feed.write_text(seed000_changefeed().replace("{{", "{", 1))
    result = run("decode", "--schema", str(schema), str(feed))
    assert result.returncode == 0, result.stderr
    assert jsonl(result.stdout) == [
        {"frontier": [3]},
        {"data": {"id": 5, "price": 12}, "time": 4, "diff": 1},
        {"data": {"id": 5, "price": 10}, "time": 5, "diff": 1},
        {"data": {"id": 5, "price": 12}, "time": 5, "diff": -1},
        {"data": {"id": 5, "price": 10}, "time": 6, "diff": -1},
        {"frontier": [10]},
    ]


def test_decode_seed002_from_its_lower_bound(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(seed002_schema()))
    feed = tmp_path / "feed.jsonl"
    feed.write_text(seed002_changefeed())
    result = run("decode", "--since", "1424849130110", "--schema", str(schema), str(feed))
    lines = jsonl(result.stdout)
    assert [u["time"] for u in lines if "data" in u] == [1424849130111] * 2 + [
        1424849130112, 1424849130113]
    assert lines[-1] == {"frontier": [1424849130116]}
    # without --since nothing can be claimed; the final frontier line is still printed
    result = run("decode", "--schema", str(schema), str(feed))
    assert jsonl(result.stdout) == [{"frontier": [0]}]
    assert "no progress statement covers times from [0]" in result.stderr.decode()


def test_decode_reads_stdin_and_directories_in_any_order(tmp_path: Path) -> None:
    rng = seeded(5)
    history = random_history(rng, updates=400, times=20)
    log = mangle([write(history), write(history, batch_size=3, finish_every=2)], rng)
    schema = CdcSchema.for_fields([{"name": "id", "type": "long"},
                                   {"name": "v", "type": ["null", "long"]}])
    (tmp_path / "logs").mkdir()
    half = len(log) // 2
    with open(tmp_path / "logs" / "a.avro", "wb") as fo:
        write_ocf(fo, log[:half], schema)
    with open(tmp_path / "logs" / "b.jsonl", "wb") as fo:
        write_json_lines(fo, log[half:], schema)
    result = run("decode", str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr
    lines = jsonl(result.stdout)
    updates = [(u["data"]["id"], u["data"]["v"], u["time"], u["diff"]) for u in lines
               if "data" in u]
    truth = [(d.get("id"), d.get("v"), t, r) for d, t, r in history.truth]
    assert sorted(updates) == sorted(truth) and len(updates) == len(set(updates))
    assert [t for _, _, t, _ in updates] == sorted(t for _, _, t, _ in updates)
    assert lines[-1] == {"frontier": []}
    frontiers = [line["frontier"][0] for line in lines[:-1] if "frontier" in line]
    assert frontiers == sorted(frontiers)
    # Standard input reads as the same file named does: the same lines, updates included.
    piped = run("decode", stdin=(tmp_path / "logs" / "b.jsonl").read_bytes())
    named = run("decode", str(tmp_path / "logs" / "b.jsonl"))
    assert piped.returncode == 0 and named.returncode == 0, piped.stderr + named.stderr
    assert jsonl(piped.stdout) == jsonl(named.stdout)
    assert any("data" in line for line in jsonl(piped.stdout))


def test_decode_protocol_error_exit_2(tmp_path: Path) -> None:
    feed = tmp_path / "bad.jsonl"
    feed.write_text('{"array":[{"data":{"a":1},"time":1,"diff":1}]}\n'
                    '{"array":[{"data":{"a":1},"time":1,"diff":2}]}\n')
    result = run("decode", str(feed))
    assert result.returncode == 2
    assert "line 2, item 0: [conflicting-diff]" in result.stderr.decode()
    assert run("decode", str(tmp_path / "missing.jsonl")).returncode == 2


def test_encode_then_decode_round_trip(seed000: tuple[Path, Path], tmp_path: Path) -> None:
    schema, _ = seed000
    changes = tmp_path / "changes.jsonl"
    changes.write_text(
        '{"data":{"id":1,"price":3},"time":1,"diff":1}\n'
        '{"data":{"id":1,"price":3},"time":1,"diff":1}\n'
        '{"data":{"id":2,"price":null},"time":1,"diff":1}\n'
        '{"data":{"id":2,"price":null},"time":1,"diff":-1}\n'
        '{"finished": 2}\n'
        '{"data":{"id":3,"price":4},"time":7,"diff":-1}\n'
    )
    encoded = run("encode", "--schema", str(schema), "--close", str(changes))
    assert encoded.returncode == 0, encoded.stderr
    assert b'"price":{"int":3}' in encoded.stdout  # Avro JSON: unions wrapped
    decoded = run("decode", "--schema", str(schema), stdin=encoded.stdout)
    assert jsonl(decoded.stdout) == [
        {"data": {"id": 1, "price": 3}, "time": 1, "diff": 2},
        {"frontier": [3]},
        {"data": {"id": 3, "price": 4}, "time": 7, "diff": -1},
        {"frontier": []},
    ]
    avro = tmp_path / "out.avro"
    assert run("encode", "--schema", str(schema), "--close", "--avro", str(avro),
               str(changes)).returncode == 0
    assert jsonl(run("decode", str(avro)).stdout) == jsonl(decoded.stdout)
    # without --close the change at time 7 is not final: kept back, and said so
    open_ = run("encode", "--schema", str(schema), str(changes))
    assert b"time\":7" not in open_.stdout and "1 change(s)" in open_.stderr.decode()


def test_encode_bad_line_names_it(seed000: tuple[Path, Path], tmp_path: Path) -> None:
    schema, _ = seed000
    changes = tmp_path / "changes.jsonl"
    changes.write_text('{"finished": 5}\n{"data":{"id":1,"price":"x"},"time":1,"diff":1}\n')
    result = run("encode", "--schema", str(schema), str(changes))
    assert result.returncode == 2
    assert f"{changes}, line 2: " in result.stderr.decode()
    changes.write_text('{"finished": 5}\n{"data":{"id":1,"price":1},"time":1,"diff":1}\n')
    result = run("encode", "--schema", str(schema), str(changes))
    assert result.returncode == 2 and "late-change" in result.stderr.decode()


def test_demo_checks_itself() -> None:
    result = run("demo", "--updates", "2000", "--protocol-only")
    assert result.returncode == 0, result.stderr
    assert b"OK" in result.stdout


@pytest.mark.slow
def test_the_whole_demo_as_a_newcomer_runs_it(tmp_path: Path) -> None:
    """Every part, the embedded PostgreSQL and the killed capture process included."""
    result = subprocess.run([*CLI, "demo", "--updates", "2000", "--rows", "40",
                             "--transactions", "60", "--workdir", str(tmp_path)],
                            capture_output=True, timeout=1200)
    out = result.stdout.decode()
    assert result.returncode == 0, (out, result.stderr.decode()[-3000:])
    assert "FAILED" not in out and "killed with SIGKILL" in out
    assert out.count("OK") >= 10, out


def test_encode_from_debezium_then_decode() -> None:
    sample = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
    encoded = run("encode", "--from", "debezium", "--key", "order_id", "--close", str(sample))
    assert encoded.returncode == 0, encoded.stderr
    lines = jsonl(run("decode", stdin=encoded.stdout).stdout)
    assert lines[-1] == {"frontier": []}
    final: dict = {}
    for u in (x for x in lines if "data" in x):
        key = (u["data"]["order_id"], u["data"]["product_id"])
        final[key] = final.get(key, 0) + u["diff"]
    # three snapshot rows, then order 1's product changes from 1 to 3
    assert {k for k, n in final.items() if n} == {(1, 3), (2, 2), (3, 2)}
    missing_key = run("encode", "--from", "debezium", "--close", str(sample))
    assert missing_key.returncode == 2
    assert "line 4" in missing_key.stderr.decode()


def test_decode_with_state_resumes_without_rereading(tmp_path: Path) -> None:
    rng = seeded(9)
    history = random_history(rng, updates=300, times=12)
    log = mangle([write(history, batch_size=5)], rng)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    with open(first, "wb") as fo:
        write_json_lines(fo, log[: len(log) // 2])
    with open(second, "wb") as fo:
        write_json_lines(fo, log[len(log) // 2 :])
    state = tmp_path / "reader.json"
    one = run("decode", "--state", str(state), str(first))
    two = run("decode", "--state", str(state), str(second))  # only the new files
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    resumed = [x for x in jsonl(one.stdout) + jsonl(two.stdout) if "data" in x]
    whole = [x for x in jsonl(run("decode", str(first), str(second)).stdout) if "data" in x]
    assert resumed == whole and len(whole) == len(history.truth)
    assert jsonl(two.stdout)[-1] == {"frontier": []}
    state.write_text("{nope")
    bad = run("decode", "--state", str(state), str(second))
    assert bad.returncode == 2 and "not a reader state file" in bad.stderr.decode()


@pytest.mark.spark
def test_a_command_keeps_pysparks_exception_log_off_stderr(spark, monkeypatch) -> None:
    """PySpark writes each exception it raises, as JSON with its Java stack trace, to stderr
    when it raises it, caught or not: a command's Spark session turns that log off (its
    errors are one line), unless CHANGELAKE_DEBUG asks for everything."""
    import logging

    from pyspark.errors import AnalysisException
    from pyspark.logger import PySparkLogger

    from changelake.spark.session import SPARK_ERROR_LOGGERS, quiet_spark

    loggers = [PySparkLogger.getLogger(n) for n in SPARK_ERROR_LOGGERS]
    levels = [logger.level for logger in loggers]
    # What the loggers let through, recorded beside their own handlers: those write to the
    # `sys.stderr` of the moment they were made, which an earlier test's capture may own.
    records: list[logging.LogRecord] = []
    recorder = logging.Handler()
    recorder.emit = records.append  # type: ignore[method-assign]
    for logger in loggers:
        logger.addHandler(recorder)
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger()
    spark_level = log4j.getLevel().toString()
    try:
        for debug in (True, False):
            if debug:
                monkeypatch.setenv("CHANGELAKE_DEBUG", "1")
            else:
                monkeypatch.delenv("CHANGELAKE_DEBUG", raising=False)
            quiet_spark(spark)
            records.clear()
            with pytest.raises(AnalysisException):
                spark.range(1).select("no_such_column")
            logged = any(r.name == "DataFrameQueryContextLogger" for r in records)
            assert logged == debug
    finally:
        for logger in loggers:
            logger.removeHandler(recorder)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level if level else logging.NOTSET)
        spark.sparkContext.setLogLevel(spark_level)


def test_encode_avro_writes_nan_and_the_infinities_given_as_text(tmp_path: Path) -> None:
    """JSON lines carry NaN and the infinities as "NaN", "Infinity", "-Infinity"; the Avro
    output writes them as doubles, as the JSON lines output writes them as that text. It had
    failed with a two-kilobyte message naming the whole datum and schema."""
    schema = tmp_path / "schema.json"
    schema.write_text('{"type":"record","name":"r","fields":[{"name":"id","type":"long"},'
                      '{"name":"x","type":["null","double"]},{"name":"y","type":"float"}]}')
    changes = tmp_path / "changes.jsonl"
    changes.write_text('{"data":{"id":1,"x":"NaN","y":"-Infinity"},"time":1,"diff":1}\n'
                       '{"data":{"id":2,"x":"Infinity","y":1.5},"time":1,"diff":1}\n')
    avro = tmp_path / "out.avro"
    result = run("encode", "--schema", str(schema), "--close", "--avro", str(avro), str(changes))
    assert result.returncode == 0, result.stderr
    assert jsonl(run("decode", str(avro)).stdout) == [
        {"data": {"id": 1, "x": "NaN", "y": "-Infinity"}, "time": 1, "diff": 1},
        {"data": {"id": 2, "x": "Infinity", "y": 1.5}, "time": 1, "diff": 1},
        {"frontier": []},
    ]


def test_encode_avro_into_a_fifo_writes_it_and_leaves_it_a_fifo(tmp_path: Path) -> None:
    """`--avro` replaces a file whole (written beside it, then renamed), but a path that is
    not a regular file is written in place: a rename over `/dev/null` (a user discarding the
    output) had put a regular file where the device was, for every process. A FIFO stands in
    for the device here."""
    import os
    import stat
    import threading

    schema = tmp_path / "schema.json"
    schema.write_text('{"type":"record","name":"r","fields":[{"name":"id","type":"long"}]}')
    changes = tmp_path / "changes.jsonl"
    changes.write_text('{"data":{"id":1},"time":1,"diff":1}\n')
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = run("encode", "--schema", str(schema), "--close", "--avro", str(fifo), str(changes))
    reader.join(10)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert received and received[0].startswith(b"Obj\x01")  # the container file came through


def test_an_os_error_with_a_message_alone_is_that_message(capsys):
    """delta-rs and pyarrow raise OSError("...") with no errno or strerror: its message is
    the line, not "None"."""
    from changelake.cli import user_errors

    @user_errors
    def failing() -> None:
        raise OSError("Generic S3 error: bucket not found")

    with pytest.raises(SystemExit) as exited:
        failing()
    assert exited.value.code == 2
    assert capsys.readouterr().err == "changelake: error: Generic S3 error: bucket not found\n"
