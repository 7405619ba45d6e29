"""Ingest jobs end to end: Materialize CDC files decoded on Spark, and a Debezium changefeed
converted on Spark, committed exactly once; snapshot and status as the CLI prints them."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest

from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.lake import Lake, jobs
from changelake.values import freeze
from lake_history import keyed_history, messages, state_at

pytestmark = pytest.mark.spark

FIELDS = ("id", "name", "amount")
CDC = CdcSchema.for_fields([
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "amount", "type": "long"},
])


def write_cdc(path: Path, history: list, rng: random.Random, last_time: int) -> Path:
    frozen = [(freeze(dict(zip(FIELDS, row, strict=True)), FIELDS), t, d)
              for row, t, d in history]
    with open(path, "wb") as fo:
        write_json_lines(fo, messages(frozen, 3, rng, last_time), CDC)
    return path


@pytest.fixture
def lake(spark, tmp_path) -> Lake:
    return Lake(spark, tmp_path / "lake")


def test_ingest_materialize_exactly_once(spark, lake, tmp_path):
    rng = random.Random(11)
    history = keyed_history(rng, 12, 15, 4)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(CDC.avro))
    early = write_cdc(tmp_path / "early.jsonl", [u for u in history if u[1] < 6], rng, 5)
    full = write_cdc(tmp_path / "full.jsonl", history, rng, 11)
    name = f"in_{uuid.uuid4().hex[:8]}.t"

    first = jobs.ingest(lake, name, [early], key=["id"], schema=schema_file)
    assert first.created and first.frontier == [6]
    table = lake.table(name)
    assert Counter(tuple(r) for r in spark.table(name).collect()) == state_at(history, 5,
                                                                              keyed=True)
    # the early part again, then everything (overlapping): nothing doubled
    again = jobs.ingest(lake, name, [early], key=["id"], schema=schema_file)
    assert again.commit.skipped
    rest = jobs.ingest(lake, name, [early, full], key=["id"], schema=schema_file)
    assert rest.commit.lower == 6 and rest.frontier == [12]
    assert Counter(tuple(r) for r in spark.table(name).collect()) == state_at(history, 11,
                                                                              keyed=True)
    snap = list(jobs.snapshot(lake, name, as_of=5))
    assert Counter((r["id"], r["name"], r["amount"]) for r in snap) == state_at(history, 5,
                                                                               keyed=True)
    result = jobs.compact(lake, name)
    assert result.since == 11 and table.state().since == 11
    [status] = [s for s in jobs.status(lake) if s.name == name]
    assert (status.frontier, status.since, status.segments) == ([12], 11, 0)
    assert status.rows == len(state_at(history, 11, keyed=True)) and status.files > 0


def debezium_line(op: str, before: dict | None, after: dict | None, lsn: int, tx: int) -> str:
    source = {"version": "2.7", "connector": "postgresql", "name": "pg", "ts_ms": 1,
              "snapshot": False, "db": "postgres", "schema": "public", "table": "items",
              "txId": tx, "lsn": lsn, "xmin": None}
    return json.dumps({"before": before, "after": after, "source": source, "op": op,
                       "ts_ms": 1})


def test_ingest_debezium(spark, lake, tmp_path):
    lines = [
        debezium_line("c", None, {"id": 1, "name": "ann"}, 100, 1),
        debezium_line("c", None, {"id": 2, "name": "bob"}, 200, 2),
        debezium_line("u", {"id": 1, "name": "ann"}, {"id": 1, "name": "anne"}, 300, 3),
        debezium_line("d", {"id": 2, "name": "bob"}, None, 400, 4),
        debezium_line("c", None, {"id": 3, "name": "cy"}, 500, 5),
    ]
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(lines) + "\n")
    name = f"dbz_{uuid.uuid4().hex[:8]}.t"
    report = jobs.ingest(lake, name, [feed], key=["id"], source="debezium")
    # without transaction metadata the last position seen (500) is not known to be finished
    assert report.frontier == [500]
    assert {tuple(r) for r in spark.table(name).collect()} == {(1, "anne")}
    again = jobs.ingest(lake, name, [feed], key=["id"], source="debezium")
    assert again.commit.skipped
    # the feed goes on (delivered again from the start): position 500 is now finished
    more = tmp_path / "more.jsonl"
    more.write_text("\n".join([*lines, debezium_line("u", {"id": 3, "name": "cy"},
                                                      {"id": 3, "name": "cyd"}, 600, 6),
                               debezium_line("c", None, {"id": 4, "name": "di"}, 700, 7)])
                    + "\n")
    later = jobs.ingest(lake, name, [more], key=["id"], source="debezium")
    assert later.frontier == [700] and later.commit.lower == 500
    assert {tuple(r) for r in spark.table(name).collect()} == {(1, "anne"), (3, "cyd")}
