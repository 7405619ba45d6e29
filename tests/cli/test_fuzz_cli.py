"""Bad input through the real console script: exit status 2, exactly one line on stderr naming
the place, no traceback, nothing committed (issue 8, item 5). The mutations are the hostile
cases of `test_fuzz_inputs.py`, a few per command; `ingest` starts Spark, so it has two cases
and they are marked slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from changelake.formats import ocf
from tests.fuzz.test_fuzz_inputs import (
    _framed,
    _header,
    corpus,
    jsonl_bytes,
    simple_log,
    simple_schema,
)
from tests.support.paths import SAMPLES

CLI = [str(Path(sys.executable).parent / "changelake")]


def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=timeout)


def one_line_exit_2(result: subprocess.CompletedProcess, *names: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("changelake: error: "), err
    assert "Traceback" not in err
    for name in names:
        assert name in err, err
    return err


@pytest.fixture()
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.json"
    path.write_bytes(orjson.dumps(simple_schema().avro))
    return path


def test_decode_refuses_an_avro_block_claiming_2_62_records(tmp_path: Path) -> None:
    header, sync = _header()
    path = tmp_path / "claims.avro"
    path.write_bytes(_framed(header, sync, 2**62, b"\x00" * 10))
    one_line_exit_2(run("decode", str(path)), f"{path}, offset {len(header)}: ")


def test_decode_refuses_a_truncated_avro_file_from_stdin(tmp_path: Path) -> None:
    data = corpus()["simple.avro"]
    result = subprocess.run([*CLI, "decode"], input=data[: len(data) - 30],
                            capture_output=True, timeout=120)
    one_line_exit_2(result, "<stdin>, offset ")


def test_decode_refuses_deep_json_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"array": []}\n{"array": ' + b"[" * 10**5 + b"]" * 10**5 + b"}\n")
    one_line_exit_2(run("decode", str(path)), f"{path}, line 2: ")


def test_decode_with_a_corrupt_state_file_keeps_it(tmp_path: Path, schema_file: Path) -> None:
    log = simple_log()
    feed, state = tmp_path / "feed.jsonl", tmp_path / "state.json"
    feed.write_bytes(jsonl_bytes(log[: len(log) // 2], simple_schema()))
    assert run("decode", "--schema", str(schema_file), "--state", str(state),
               str(feed)).returncode == 0
    saved = orjson.loads(state.read_bytes())
    saved["incomplete"].append(2**64 - 1)
    damaged = orjson.dumps(saved)
    state.write_bytes(damaged)
    one_line_exit_2(run("decode", "--schema", str(schema_file), "--state", str(state),
                        str(feed)), f"{state}: not a reader state file")
    assert state.read_bytes() == damaged


def test_encode_refuses_a_bad_change_and_writes_no_avro_file(tmp_path: Path,
                                                             schema_file: Path) -> None:
    changes, avro = tmp_path / "changes.jsonl", tmp_path / "out.avro"
    changes.write_bytes(b'{"data": {"id": 1, "v": 2}, "time": 1, "diff": 1}\n'
                        b'{"data": {"id": 1, "v": 2}, "time": 1, "diff": 9223372036854775807}\n')
    one_line_exit_2(run("encode", "--schema", str(schema_file), "--close", "--avro", str(avro),
                        str(changes)), f"{changes}, line 2: ", "diff-overflow")
    assert not avro.exists() and not list(tmp_path.glob(".*.tmp"))


def test_encode_from_debezium_refuses_a_corrupt_line(tmp_path: Path) -> None:
    sample = (SAMPLES / "derived-rw-debezium-postgres-values.jsonl").read_bytes()
    path = tmp_path / "feed.jsonl"
    lines = sample.splitlines()
    path.write_bytes(b"\n".join([*lines[:2], lines[2][: len(lines[2]) // 2], *lines[3:]]))
    one_line_exit_2(run("encode", "--from", "debezium", "--key", "order_id", "--close",
                        str(path)), f"{path}, line 3: ")


def test_encode_from_ydb_refuses_a_step_beyond_a_long(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_bytes(orjson.dumps({"columns": [{"name": "key", "type": "Uint64"},
                                                {"name": "value", "type": "Uint64"}],
                                    "primary_key": ["key"]}))
    path = tmp_path / "part-0.jsonl"
    path.write_bytes(b'{"update": {"value": 1}, "key": [1], "ts": [18446744073709551615, 1]}\n')
    one_line_exit_2(run("encode", "--from", "ydb", "--table-schema", str(table), "--close",
                        str(path)), f"{path}, line 1: ", "64-bit")


# ---------------------------------------------------------------------------------- ingest


def _no_table(lake: Path) -> None:
    if not lake.exists():  # refused before the lake was made
        return
    result = run("status", "--lake", str(lake), "--format", "jsonl", timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == b""


@pytest.mark.slow
def test_ingest_refuses_a_corrupt_debezium_file_and_commits_nothing(tmp_path: Path) -> None:
    path, lake = tmp_path / "feed.jsonl", tmp_path / "lake"
    sample = (SAMPLES / "derived-rw-debezium-postgres-values.jsonl").read_bytes().splitlines()
    path.write_bytes(b"\n".join([*sample[:3], b'{"op": "c", "after": {"order_id": 9}, '
                                              b'"source": {"lsn": "x"}}']) + b"\n")
    one_line_exit_2(run("ingest", "--lake", str(lake), "--table", "t", "--from", "debezium",
                        "--key", "order_id", str(path), timeout=600), f"{path}, line 4: ")
    _no_table(lake)


@pytest.mark.slow
def test_ingest_refuses_a_corrupt_avro_file_and_commits_nothing(tmp_path: Path) -> None:
    header, sync = _header()
    path, lake = tmp_path / "claims.avro", tmp_path / "lake"
    path.write_bytes(_framed(header, sync, 2**62, b"\x00" * 10))
    one_line_exit_2(run("ingest", "--lake", str(lake), "--table", "t", str(path), timeout=600),
                    f"{path}, offset {len(header)}: ")
    _no_table(lake)


def test_ocf_helpers_frame_a_valid_block(tmp_path: Path) -> None:
    """Control: the CLI decodes a hand-framed block like the hostile ones above."""
    header, sync = _header()
    statement = (ocf._long(1) + ocf._long(1) + ocf._long(0) + ocf._long(0) + ocf._long(0)
                 + ocf._long(0))
    path = tmp_path / "closed.avro"
    path.write_bytes(_framed(header, sync, 1, statement))
    result = run("decode", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == b'{"frontier":[]}\n'


def test_decode_reads_a_valid_avro_file_from_a_pipe() -> None:
    """Control for the truncated case (and a fixed bug: reading block offsets with `tell()`
    made any container file on a pipe fail with "Illegal seek")."""
    result = subprocess.run([*CLI, "decode"], input=corpus()["simple.avro"],
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(b'{"frontier":[]}\n')


@pytest.mark.slow
def test_ingest_refuses_invalid_utf8_in_a_changefeed(tmp_path: Path) -> None:
    path, lake = tmp_path / "feed.jsonl", tmp_path / "lake"
    path.write_bytes(b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 10, "txId": 5}}\n'
                     b'{"op": "c", "after": {"id": "\xff\xfe"}, "source": {"lsn": 12, '
                     b'"txId": 6}}\n')
    one_line_exit_2(run("ingest", "--lake", str(lake), "--table", "t", "--from", "debezium",
                        "--key", "id", str(path), timeout=600), f"{path}, line 2: ")
    _no_table(lake)


def test_an_unexpected_exception_is_one_internal_error_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The last resort of `user_errors`: a bug (not bad input) is exit 1 and one line, with
    the traceback only under CHANGELAKE_DEBUG."""
    from changelake.cli import user_errors
    from changelake.errors import InputError

    @user_errors
    def broken() -> None:
        raise KeyError("line\nbreak")

    monkeypatch.delenv("CHANGELAKE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        broken()
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.count("\n") == 1
    assert err.startswith("changelake: internal error: KeyError: ") and "CHANGELAKE_DEBUG" in err
    monkeypatch.setenv("CHANGELAKE_DEBUG", "1")
    with pytest.raises(KeyError):
        broken()

    @user_errors
    def bad_input() -> None:
        raise InputError("two\nlines")

    with pytest.raises(SystemExit) as exit_:
        bad_input()
    assert exit_.value.code == 2 and capsys.readouterr().err == "changelake: error: two lines\n"


def test_decode_refuses_a_since_beyond_a_long() -> None:
    result = subprocess.run([*CLI, "decode", "--since", str(2**64)], input=b"",
                            capture_output=True, timeout=120)
    one_line_exit_2(result, "--since: time 18446744073709551616 does not fit")


@pytest.mark.parametrize("command", [["snapshot", "--as-of"], ["compact", "--since"]])
def test_lake_times_beyond_a_long_are_refused_before_spark(tmp_path: Path,
                                                           command: list[str]) -> None:
    lake = tmp_path / "lake"
    result = subprocess.run([*CLI, command[0], "--lake", str(lake), "--table", "t",
                             command[1], str(2**63)], capture_output=True, timeout=120)
    one_line_exit_2(result, f"{command[1]}: time {2**63} does not fit")
    assert not lake.exists()  # refused before anything was opened
