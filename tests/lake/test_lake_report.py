"""Rendering of lake job results: snapshot formats and quiet progress off a terminal."""

from __future__ import annotations

import io

import orjson
from rich.console import Console

from changelake.lake.report import progress_bar, write_snapshot

ROWS = [{"id": 1, "name": None}, {"id": 2, "name": "b,c"}]


def test_jsonl_is_one_plain_object_per_row():
    out = io.BytesIO()
    assert write_snapshot(ROWS, ["id", "name"], "jsonl", out) == 2
    assert [orjson.loads(line) for line in out.getvalue().splitlines()] == ROWS


def test_jsonl_writes_nan_and_the_infinities_as_decode_does():
    """Not null, which is SQL NULL's spelling (orjson writes a non-finite float as null)."""
    rows = [{"x": float("nan"), "y": None, "nested": {"a": [float("inf"), 1.5]},
             "z": float("-inf")}]
    out = io.BytesIO()
    write_snapshot(rows, list(rows[0]), "jsonl", out)
    assert out.getvalue() == (b'{"x":"NaN","y":null,"nested":{"a":["Infinity",1.5]},'
                              b'"z":"-Infinity"}\n')


def test_csv_has_a_header_and_quotes():
    out = io.BytesIO()
    write_snapshot(ROWS, ["id", "name"], "csv", out)
    assert out.getvalue().decode().splitlines() == ["id,name", "1,", '2,"b,c"']


def test_csv_writes_nested_values_as_json():
    out = io.BytesIO()
    write_snapshot([{"id": 1, "inner": {"city": "Köln", "zip": None}, "tags": [None, 2.5]}],
                   ["id", "inner", "tags"], "csv", out)
    assert out.getvalue().decode().splitlines()[1] == \
        '1,"{""city"":""Köln"",""zip"":null}","[null,2.5]"'


def test_no_progress_bar_off_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=False)
    with progress_bar(console, "compact") as update:
        assert update is None
    console = Console(file=io.StringIO(), force_terminal=True)
    with progress_bar(console, "compact") as update:
        assert update is not None
        update("folding", 1, 3)


def test_a_table_off_a_terminal_is_not_cut_to_80_columns(capsys, monkeypatch):
    wide = {"id": 1, "name": "x" * 70, "last_commit": "2026-11-29T16:26:56+00:00"}
    monkeypatch.delenv("COLUMNS", raising=False)
    write_snapshot([wide], list(wide), "table", io.BytesIO())  # the table goes to stdout
    printed = capsys.readouterr().out
    assert "x" * 70 in printed and wide["last_commit"] in printed
    assert max(len(line) for line in printed.splitlines()) > 80

    monkeypatch.setenv("COLUMNS", "60")  # a width asked for is kept
    write_snapshot([wide], list(wide), "table", io.BytesIO())
    printed = capsys.readouterr().out
    assert "x" * 70 not in printed
    assert max(len(line) for line in printed.splitlines()) <= 60
