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


def test_csv_has_a_header_and_quotes():
    out = io.BytesIO()
    write_snapshot(ROWS, ["id", "name"], "csv", out)
    assert out.getvalue().decode().splitlines() == ["id,name", "1,", '2,"b,c"']


def test_no_progress_bar_off_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=False)
    with progress_bar(console, "compact") as update:
        assert update is None
    console = Console(file=io.StringIO(), force_terminal=True)
    with progress_bar(console, "compact") as update:
        assert update is not None
        update("folding", 1, 3)
