"""A keyed table holds one row per key: a commit whose updates would give a key two rows at
one time (a row inserted with diff 2, two rows inserted or retracted for a key at one time) is
refused naming the key, the time and the input's line, with nothing written
(`lake/key_rule.py`)."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest

from changelake.errors import LakeError
from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.lake import Lake, ingest
from changelake.values import freeze
from tests.support.lake_history import messages

pytestmark = pytest.mark.spark

FIELDS = ("id", "name")
CDC = CdcSchema.for_fields([
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
])


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def write_log(path: Path, updates: list[tuple[tuple[int, str], int, int]], last_time: int
              ) -> Path:
    frozen = [(freeze(dict(zip(FIELDS, row, strict=True)), FIELDS), t, d)
              for row, t, d in updates]
    with open(path, "wb") as fo:
        write_json_lines(fo, messages(frozen, 2, random.Random(3), last_time), CDC)
    return path


def lines_of(path: Path, row: dict, time: int, sign: int) -> set[tuple[int, int]]:
    """Every (line, item) of `path` holding an update of `row` at `time` with a diff of
    `sign`: where the error may point (a log repeats its messages)."""
    found = set()
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        for item, u in enumerate(orjson.loads(line).get("array") or []):
            data = {k: (next(iter(v.values())) if isinstance(v, dict) else v)
                    for k, v in u["data"].items()}
            if data == row and u["time"] == time and (u["diff"] > 0) == (sign > 0):
                found.add((number, item))
    return found


def rows_of(spark, name: str) -> Counter:
    return Counter(tuple(r) for r in spark.table(name).collect())


def test_a_row_twice_in_a_keyed_table_is_refused_at_its_line_and_makes_no_table(
        spark, lake, tmp_path):
    log = write_log(tmp_path / "twice.jsonl",
                    [((1, "a"), 1, 2), ((2, "b"), 1, 1), ((3, "c"), 2, 1)], 3)
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    with pytest.raises(LakeError) as caught:
        ingest.ingest(lake, name, [log], key=["id"])
    error = caught.value
    assert "key (id=1) has an insertion with diff 2 at time 1;" in str(error)
    assert "one row per key" in str(error) and "Nothing was written" in str(error)
    assert error.location is not None and error.location.file == str(log)
    assert (error.location.line, error.location.index) in lines_of(
        log, {"id": 1, "name": "a"}, 1, 1)
    assert name not in [t.display for t in lake.tables()]
    # The same log is a fine multiset: an unkeyed table holds the row twice.
    ingest.ingest(lake, name, [log])
    assert rows_of(spark, name) == Counter({(1, "a"): 2, (2, "b"): 1, (3, "c"): 1})


def test_two_rows_for_a_key_at_one_time_are_refused_and_the_table_keeps_its_commit(
        spark, lake, tmp_path):
    name = f"k_{uuid.uuid4().hex[:8]}.t"
    # An update (a retraction and an insertion at one time) is what a key may have.
    first = write_log(tmp_path / "first.jsonl",
                      [((1, "a"), 0, 1), ((2, "b"), 0, 1), ((2, "b"), 1, -1), ((2, "B"), 1, 1)],
                      1)
    report = ingest.ingest(lake, name, [first], key=["id"])
    assert report.frontier == [2]
    version = lake.table(name).state().version
    both = write_log(tmp_path / "both.jsonl",
                     [((1, "a"), 0, 1), ((2, "b"), 0, 1), ((2, "b"), 1, -1), ((2, "B"), 1, 1),
                      ((3, "x"), 2, 1), ((3, "y"), 2, 1), ((1, "a"), 3, -1)], 3)
    with pytest.raises(LakeError) as caught:
        ingest.ingest(lake, name, [both])
    assert "key (id=3) has 2 insertions at time 2;" in str(caught.value)
    location = caught.value.location
    assert location is not None and location.file == str(both)
    assert (location.line, location.index) in (
        lines_of(both, {"id": 3, "name": "x"}, 2, 1) | lines_of(both, {"id": 3, "name": "y"}, 2, 1))
    table = lake.table(name)
    assert table.state().version == version and table.frontier.to_json() == [2]
    assert rows_of(spark, name) == Counter({(1, "a"): 1, (2, "B"): 1})

    gone = write_log(tmp_path / "gone.jsonl",
                     [((1, "a"), 0, 1), ((2, "b"), 0, 1), ((2, "b"), 1, -1), ((2, "B"), 1, 1),
                      ((2, "B"), 2, -1), ((2, "b"), 2, -1), ((4, "p"), 3, 1), ((4, "q"), 3, 1)],
                     3)
    with pytest.raises(LakeError, match=r"key \(id=2\) has 2 retractions at time 2 \(and 1 "
                                        r"more \(key, time\) pair\);"):
        ingest.ingest(lake, name, [gone])
    assert lake.table(name).state().version == version


def test_table_commit_checks_the_key_unless_told_the_updates_are_built_so(spark, lake):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    name = f"k_{uuid.uuid4().hex[:8]}.t"
    columns = StructType([StructField("id", LongType()), StructField("name", StringType())])
    with lake.handle(name).writer() as writer:
        writer.create(columns, key=["id"])
    table = lake.table(name)
    updates = spark.createDataFrame(
        [(1, "a", 0, 1), (2, "b", 0, -3)],
        columns.add("_time", LongType()).add("_diff", LongType()))
    with pytest.raises(LakeError, match=r"key \(id=2\) has a retraction with diff -3 at time 0"):
        table.commit(updates, 0, 1)
    assert table.state().version == 0 and table.frontier.to_json() == [0]
    table.commit(updates.where("id = 1"), 0, 1, check_key=False)
    assert rows_of(spark, name) == Counter({(1, "a"): 1})


def test_a_nan_key_is_shown_as_snapshot_prints_it_not_as_null(spark, lake):
    """orjson writes NaN as null, which would name a NULL key: the key is shown as "NaN",
    as `snapshot --format jsonl` and `decode` print it."""
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    name = f"k_{uuid.uuid4().hex[:8]}.t"
    columns = StructType([StructField("x", DoubleType()), StructField("name", StringType())])
    with lake.handle(name).writer() as writer:
        writer.create(columns, key=["x"])
    updates = spark.createDataFrame(
        [(float("nan"), "a", 0, 1), (float("nan"), "b", 0, 1), (float("-inf"), "c", 0, 1)],
        columns.add("_time", LongType()).add("_diff", LongType()))
    with pytest.raises(LakeError, match=r'key \(x="NaN"\) has 2 insertions at time 0;'):
        lake.table(name).commit(updates, 0, 1)


def test_the_command_line_says_it_in_one_line_with_the_keys_text(tmp_path, lake_root):
    """A timestamp key is shown as its instant, and found in the input, in any time zone."""
    import os
    import subprocess
    import sys

    from changelake.formats.materialize import cdc_schema_around, write_ocf
    from changelake.protocol import Writer

    row = {"type": "record", "name": "row", "fields": [
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "v", "type": "string"}]}
    writer = Writer(batch_size=2)
    for at, v in [("2024-01-02T03:04:05+00:00", "a"), ("2024-01-02T03:04:06+00:00", "b"),
                  ("2024-01-02T03:04:05+00:00", "c")]:
        writer.push(freeze({"at": at, "v": v}, ("at", "v")), 1, 1)
    log = tmp_path / "log.avro"
    with open(log, "wb") as fo:
        write_ocf(fo, writer.finish_through(1), CdcSchema.from_json(cdc_schema_around(row)))
    done = subprocess.run(
        [sys.executable, "-m", "changelake", "ingest", "--lake", str(lake_root),
         "--table", "t", "--key", "at", str(log)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TZ": "Asia/Tokyo"})
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"changelake: error: {log}, offset "), line
    assert 'key (at="2024-01-02T03:04:05+00:00") has 2 insertions at time 1;' in line


def test_a_follow_batch_that_breaks_the_key_is_refused_at_its_line(spark, lake, tmp_path):
    from changelake.lake.follow import CommitBatches, FollowControl, check_checkpoint
    from changelake.spark.source import register

    (tmp_path / "src").mkdir()
    log = write_log(tmp_path / "src" / "part-0000.jsonl",
                    [((1, "a"), 0, 1), ((5, "x"), 1, 1), ((5, "y"), 1, 1)], 1)
    name = f"k_{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"
    check_checkpoint(checkpoint, name, str(log.parent))
    sink = CommitBatches(lake, name, checkpoint, "by-hand", str(log.parent), FollowControl(),
                         key=["id"])
    register(spark)
    batch = (spark.read.format("materialize-cdc").option("avroSchema", json.dumps(CDC.avro))
             .option("paths", json.dumps([str(log)])).load())
    with pytest.raises(LakeError, match=r"key \(id=5\) has 2 insertions at time 1;") as caught:
        sink(batch, 0)
    location = caught.value.location
    assert location is not None and location.file == str(log)
    assert (location.line, location.index) in (
        lines_of(log, {"id": 5, "name": "x"}, 1, 1) | lines_of(log, {"id": 5, "name": "y"}, 1, 1))
    assert not lake.exists(name)
