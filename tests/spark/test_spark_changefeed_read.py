"""Reading changefeed files on the executors keeps the bounds the encoder's reader keeps.

`read_lines(...).check()` must refuse the line `encode_changefeed` refuses, naming the same
file and line: invalid UTF-8 (with Python's reason and byte offset: the encoder leaves that
to orjson, whose words differ) and over-long lines (the same message). Blank lines, CRLF line
ends and a lone CR inside a line are numbered and kept as the encoder's reader keeps them.
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from changelake.errors import ChangefeedError
from changelake.formats.lines import MAX_LINE_BYTES
from changelake.local import encode_changefeed_job
from changelake.spark.changefeed.read import read_lines

pytestmark = pytest.mark.spark

GOOD = b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 10, "txId": 5}}'


def encoder_error(path: Path) -> str:
    with pytest.raises(ChangefeedError) as caught:
        encode_changefeed_job([str(path)], io.BytesIO(), source="debezium", keys=["id"],
                              table_schema=None, close=True, lenient=False)
    return str(caught.value)


def spark_error(spark: Any, path: Path) -> str:
    with pytest.raises(ChangefeedError) as caught:
        read_lines(spark, [str(path)]).check()
    return str(caught.value)


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"caf\xc3", b"\xed\xa0\x80", b"ok \xc0\xaf"])
def test_invalid_utf8_is_named_as_the_encoder_names_it(spark: Any, tmp_path: Path,
                                                       bad: bytes) -> None:
    path = tmp_path / "feed.jsonl"
    path.write_bytes(GOOD + b"\n\n   \r\n" + GOOD.replace(b'"id": 1', b'"id": "' + bad + b'"')
                     + b"\n" + GOOD + b"\n")
    message = spark_error(spark, path)
    assert encoder_error(path).startswith(f"{path}, line 4: ")
    line = path.read_bytes().splitlines()[3]
    with pytest.raises(UnicodeDecodeError) as python:
        line.decode("utf-8")
    assert message == (f"{path}, line 4: not UTF-8 text: {python.value.reason} at byte "
                       f"{python.value.start}")


def test_a_line_over_the_bound_is_named_as_the_encoder_names_it(spark: Any,
                                                                tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    with open(path, "wb") as fh:
        fh.write(GOOD + b"\n" + GOOD + b"\n")
        fh.write(b'{"op": "c", "after": {"id": "' + b"x" * MAX_LINE_BYTES + b'"}}\n')
        fh.write(b"\xff\n")  # later: the first flaw is named
    message = spark_error(spark, path)
    assert message == encoder_error(path)
    assert message.startswith(f"{path}, line 3: line longer than the maximum")


def test_a_line_just_within_the_bound_passes(spark: Any, tmp_path: Path) -> None:
    """Control: the bound counts the newline, as the encoder's reader does."""
    path = tmp_path / "edge.jsonl"
    path.write_bytes(b" " * (MAX_LINE_BYTES - 1 - len(GOOD)) + GOOD + b"\n")
    read_lines(spark, [str(path)]).check()
    path.write_bytes(b" " * (MAX_LINE_BYTES - len(GOOD)) + GOOD + b"\n")
    assert spark_error(spark, path) == encoder_error(path)


def test_line_ends_are_the_encoders(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b"a\r\n\r\n b\rc \r\r\nd")
    lines = read_lines(spark, [str(path)])
    lines.check()
    assert sorted((r["line"], r["value"]) for r in lines.numbered().collect()) == \
        [(1, "a"), (3, " b\rc "), (4, "d")]


@pytest.mark.parametrize("name", ["x+y.jsonl", "a b%20c.jsonl", "caf\u00e9 100%.jsonl",
                                  "plus+and%2B.jsonl"])
def test_every_file_name_keeps_its_lines(spark: Any, tmp_path: Path, name: str) -> None:
    """Spark names a line's file as a URI (`_metadata.file_path`), and the caller's name is
    found again by decoding it: a `+` must stay a `+` (a form decoder reads it as a space, and
    the file's lines were then dropped), a `%` and a space must come back as themselves."""
    folder = tmp_path / "a+b dir"
    folder.mkdir()
    path = folder / name
    path.write_bytes(GOOD + b"\n" + GOOD + b"\n")
    lines = read_lines(spark, [str(path), str(tmp_path / "a+b dir" / ".." / "a+b dir" / name)])
    got = sorted((r["file"], r["line"]) for r in lines.numbered().collect())
    second = str(tmp_path / "a+b dir" / ".." / "a+b dir" / name)
    assert got == sorted([(str(path), 1), (str(path), 2), (second, 1), (second, 2)])


def test_a_line_of_a_file_no_input_names_fails_loudly(spark: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Were Spark's name of a file and the caller's ever to differ again (as a `+` once made
    them), its lines must stop the read, not vanish from it."""
    from changelake.spark.changefeed import read
    from changelake.spark.uris import local_path

    path = tmp_path / "f.jsonl"
    path.write_bytes(GOOD + b"\n")
    monkeypatch.setattr(read, "local_path", lambda uri: local_path(uri) + "-elsewhere")
    with pytest.raises(Exception, match=r"named by none of the inputs: file:.*/f\.jsonl"):
        read_lines(spark, [str(path)]).frame.collect()


def _feed(events: int) -> bytes:
    return b"".join(
        b'{"op": "c", "before": null, "after": {"id": %d, "v": "x%d"}, "source": {"lsn": %d, '
        b'"txId": %d, "table": "t", "schema": "public"}}\n\n' % (i, i, 100 + i, i)
        for i in range(1, events + 1))


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_a_compressed_feed_is_read_as_the_encoder_reads_it(spark: Any, tmp_path: Path,
                                                           suffix: str) -> None:
    """Spark's text reader decompresses `.gz` and `.bz2` by the name; so does the encoder's
    reader: the same lines, numbers and updates."""
    import bz2
    import gzip

    from changelake.convert import encode_changefeed
    from changelake.convert.feed import read_lines as encoder_lines
    from changelake.spark.changefeed.pipeline import convert_frames
    from tests.support.changefeed_cases import python_updates, spark_updates

    path = tmp_path / f"feed.jsonl{suffix}"
    path.write_bytes((gzip.compress if suffix == ".gz" else bz2.compress)(_feed(40)))
    spark_lines = sorted((r["line"], r["value"])
                         for r in read_lines(spark, [str(path)]).numbered().collect())
    assert spark_lines == [(n, line.decode().rstrip("\n")) for n, line in encoder_lines(path)]
    assert len(spark_lines) == 40 and spark_lines[-1][0] == 79  # blank lines counted
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    assert spark_updates(got.changes) == python_updates(messages) != Counter()


def test_a_codec_only_spark_reads_is_refused_by_both_and_a_broken_gz_is_named(
        spark: Any, tmp_path: Path) -> None:
    import gzip

    from changelake.errors import InputError
    from changelake.spark.changefeed.pipeline import convert_frames

    zst = tmp_path / "feed.jsonl.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd")
    _both_refuse(spark, zst, f"{zst}: compressed as .zst")

    broken = tmp_path / "feed.jsonl.gz"
    broken.write_bytes(gzip.compress(_feed(200))[:300])
    with pytest.raises(InputError, match=rf"^{broken}: cannot read: "):
        encode_changefeed_job([str(broken)], io.BytesIO(), source="debezium", keys=["id"],
                              table_schema=None, close=True, lenient=False)
    with pytest.raises(InputError, match=rf"^{broken}: cannot read: "):
        convert_frames(spark, [broken], "debezium", ["id"], None, close=True)


def test_a_file_spark_would_skip_by_its_name_is_refused_when_named(spark: Any,
                                                                   tmp_path: Path) -> None:
    """Spark's listing skips a file named `.x` or `_x` even when it is named itself, so its
    lines would be lost without a word where the encoder reads them. Spark 4.3 could be told
    not to skip it; Spark 4.2 (which Delta Lake needs) cannot, so such a file is refused by
    name (a file inside a directory so named is read, when named itself)."""
    from changelake.errors import InputError

    hidden, staged = tmp_path / ".feed.jsonl", tmp_path / "_feed.jsonl"
    inner = tmp_path / "_staging" / "feed.jsonl"
    inner.parent.mkdir()
    for i, path in enumerate([hidden, staged, inner]):
        path.write_bytes(GOOD + b"\n" * (i + 1) + GOOD + b"\n")
    for path in (hidden, staged):
        with pytest.raises(InputError, match="rename it") as refused:
            read_lines(spark, [str(inner), str(path)])
        assert str(path) in str(refused.value)
    lines = read_lines(spark, [str(inner)])
    assert sorted((r["file"], r["line"]) for r in lines.numbered().collect()) == [
        (str(inner), 1), (str(inner), 4)]


def test_a_copy_in_progress_is_refused_by_both_paths(spark: Any, tmp_path: Path) -> None:
    """A name ending `._COPYING_` Spark skips whatever it is told: both paths refuse it by
    name, rather than the Spark path reading nothing of it."""
    copying = tmp_path / "feed.jsonl._COPYING_"
    copying.write_bytes(_feed(20))
    _both_refuse(spark, copying, f"{copying}: named ._COPYING_, a copy in progress")


def _both_refuse(spark: Any, path: Path, start: str) -> None:
    """The local encoder and the Spark path refuse `path` with one message, starting so."""
    from changelake.errors import InputError
    from changelake.spark.changefeed.pipeline import convert_frames

    with pytest.raises(InputError) as local:
        encode_changefeed_job([str(path)], io.BytesIO(), source="debezium", keys=["id"],
                              table_schema=None, close=True, lenient=False)
    with pytest.raises(InputError) as on_spark:
        convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert str(local.value) == str(on_spark.value)
    assert str(local.value).startswith(start)


def test_a_name_spark_would_take_for_a_glob_pattern_is_that_file(spark: Any,
                                                                 tmp_path: Path) -> None:
    """Spark globs the paths it is given: `x*.jsonl` also read `xy.jsonl` (whose lines then
    stopped the read), and `q[1].jsonl` or a name with a backslash were not found. The caller
    names files, so each name is the one file."""
    names = ["x*.jsonl", "q[1].jsonl", "b{a,b}.jsonl", "back\\slash.jsonl", "what?.jsonl"]
    for name in [*names, "xy.jsonl", "q1.jsonl", "ba.jsonl", "whatX.jsonl"]:
        (tmp_path / name).write_bytes(GOOD + b"\n")
    lines = read_lines(spark, [str(tmp_path / name) for name in names])
    assert sorted((r["file"], r["line"]) for r in lines.numbered().collect()) == \
        sorted((str(tmp_path / name), 1) for name in names)
