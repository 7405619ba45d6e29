"""`changes`: a lake table's history as CDCv2, read back with the pure-Python decode.

Tables are built from generated histories delivered in mangled, overlapping increments (as the
other lake tests do), with a compaction in between; every check compares what the reference
decode recovers from the `changes` output with the truth computed in Python.
"""

from __future__ import annotations

import io
import random
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from time import tzset

import orjson
import pytest
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from changelake.errors import LakeError, SchemaError
from changelake.formats.materialize import load_schema
from changelake.lake import Lake, Table
from changelake.lake.changes import cdc_schema_of, write_changes
from changelake.lake.compact import compact
from changelake.lake.ingest import ingest
from changelake.local import decode_local
from changelake.protocol import Antichain
from changelake.spark.instants import with_instants
from tests.support.decoded import decoded_history
from tests.support.lake_history import (
    SCHEMA,
    Update,
    keyed_history,
    rows_of,
    state_at,
    to_df,
    unkeyed_history,
)
from tests.support.paths import SAMPLES

pytestmark = pytest.mark.spark

TIMES = 12
COMPACT_TO = 5


def unique(name: str) -> str:
    return f"ch_{uuid.uuid4().hex[:10]}.{name}"


def consolidated(history: Sequence[Update], lo: int, hi: int | None) -> Counter:
    """The truth: one diff per (row, time) at times in [lo, hi), zeros dropped."""
    acc: Counter = Counter()
    for row, time, diff in history:
        if time >= lo and (hi is None or time < hi):
            acc[(row, time)] += diff
    return Counter({k: v for k, v in acc.items() if v})


def build(spark, lake: Lake, history: list[Update], *, keyed: bool, compact_to: int | None,
          close: bool = False) -> Table:
    """A table holding `history`, committed in four commits, the second overlapping the first
    (a replay, which must not double anything), with a compaction to `compact_to` once the
    table is committed past it."""
    table = lake.create_table(unique("keyed" if keyed else "unkeyed"), SCHEMA,
                              key=["id"] if keyed else (), buckets=2)
    cuts = [(0, 4), (2, 7), (7, 9), (9, TIMES)]
    for lo, hi in cuts:
        part = [u for u in history if lo <= u[1] < hi]
        table.commit(to_df(spark, part), lo, hi)
        if compact_to is not None and lo <= compact_to < hi:
            compact(table, compact_to)
    assert table.state().frontier == (TIMES,)
    if close:
        table.commit(to_df(spark, []), TIMES, Antichain())
    return table


def decoded(path: Path, since: int) -> tuple[Counter, list]:
    """`changelake decode` (the local engine) of a changes output: (row, time) -> diff, and
    the frontier it reports."""
    out = io.BytesIO()
    decode_local([str(path)], out, since=Antichain([since]))
    found: Counter = Counter()
    frontier = None
    for line in out.getvalue().splitlines():
        obj = orjson.loads(line)
        if "frontier" in obj:
            frontier = obj["frontier"]
            continue
        d = obj["data"]
        key = ((d["id"], d["name"], d["amount"]), obj["time"])
        assert key not in found  # exactly once
        found[key] = obj["diff"]
    return found, frontier


def changes_file(table: Table, tmp_path: Path, *, avro: bool = False, **options) -> Path:
    path = tmp_path / f"changes-{uuid.uuid4().hex[:6]}.{'avro' if avro else 'jsonl'}"
    if avro:
        write_changes(table, io.BytesIO(), avro=path, **options)
    else:
        with path.open("wb") as fo:
            write_changes(table, fo, **options)
    return path


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def test_changes_of_a_compacted_keyed_table(spark, lake, tmp_path):
    history = keyed_history(random.Random(11), TIMES, 20, 5)
    table = build(spark, lake, history, keyed=True, compact_to=COMPACT_TO)
    assert table.since == COMPACT_TO

    # plain changes, to the frontier and inside it, small batches: many progress statements
    for since, until, batch in [(COMPACT_TO + 1, None, 1024), (7, 10, 3)]:
        path = changes_file(table, tmp_path, since=since, until=until, batch_size=batch)
        found, frontier = decoded(path, since)
        assert found == consolidated(history, since, until or TIMES)
        assert frontier == [until or TIMES]
        if batch == 3:
            progress = [m["com.materialize.cdc.progress"]
                        for m in map(orjson.loads, path.read_bytes().splitlines())
                        if "array" not in m]
            assert len(progress) > 2  # the statements tile [7, 10)
            assert progress[0]["lower"] == [7] and progress[-1]["upper"] == [10]
            # --history prints what `decode --since 7 --schema` prints of the messages, byte
            # for byte (the table's column order; without a schema decode sorts the names)
            printed, decoded_file = io.BytesIO(), io.BytesIO()
            write_changes(table, printed, since=7, until=10, batch_size=3, history=True)
            decode_local([str(path)], decoded_file, since=Antichain([7]),
                         schema=cdc_schema_of(table))
            assert printed.getvalue() == decoded_file.getvalue()

    # --snapshot at the table's since: the state there at one time, then the changes; from 0
    path = changes_file(table, tmp_path, avro=True, since=COMPACT_TO, snapshot=True)
    found, frontier = decoded(path, 0)
    assert frontier == [TIMES]
    assert {t for _, t in found} <= set(range(COMPACT_TO, TIMES))
    for at in range(COMPACT_TO, TIMES):
        acc: Counter = Counter()
        for (row, time), diff in found.items():
            if time <= at:
                acc[row] += diff
        assert +acc == state_at(history, at, keyed=True)
        assert all(v >= 0 for v in acc.values())

    # ... which an ingest takes into an empty table: equal from the since on
    copy = ingest(lake, unique("copy"), [path], key=["id"])
    assert copy.commit.upper == TIMES
    copied = lake.table(copy.table)
    for at in (COMPACT_TO, TIMES - 1):
        assert rows_of(copied.as_of(at)) == rows_of(table.as_of(at))

    # the rules
    rules = [
        (dict(since=COMPACT_TO - 1), f"--since {COMPACT_TO - 1} is before the table's since"),
        (dict(since=COMPACT_TO), "use --snapshot"),
        (dict(since=6, until=TIMES + 1), f"beyond the table's frontier ([{TIMES}])"),
        (dict(since=8, until=7), "--until 7 is before --since 8"),
        (dict(since=TIMES + 1), f"--since {TIMES + 1} is beyond the table's frontier"),
        (dict(since=TIMES, snapshot=True), "needs --until after it"),
    ]
    for options, message in rules:
        with pytest.raises(LakeError, match=message.replace("[", r"\[").replace("(", r"\(")
                           .replace(")", r"\)")):
            write_changes(table, io.BytesIO(), **options)
    # an empty interval at the frontier is fine: nothing, and the reader is at the frontier
    path = changes_file(table, tmp_path, since=TIMES)
    assert decoded(path, TIMES) == (Counter(), [TIMES])


def test_changes_since_0_round_trip_of_a_closed_unkeyed_table(spark, lake, tmp_path):
    history = unkeyed_history(random.Random(12), TIMES, 5, 5)
    table = build(spark, lake, history, keyed=False, compact_to=None, close=True)
    path = changes_file(table, tmp_path, avro=True, since=0, batch_size=7)
    found, frontier = decoded(path, 0)
    assert found == consolidated(history, 0, None)
    assert frontier == []  # the table is closed, and so is its change stream

    copy = ingest(lake, unique("copy"), [path])
    assert copy.commit.upper is None
    copied = lake.table(copy.table)
    for at in (0, 6):
        assert rows_of(copied.as_of(at)) == rows_of(table.as_of(at))
    assert rows_of(copied.current()) == rows_of(table.current())
    assert rows_of(copied.updates()) == rows_of(table.updates())  # the same history, exactly


def test_changes_refuses_column_types_the_writers_cannot_carry(lake):
    schema = StructType([StructField("id", LongType()),
                         StructField("tags", MapType(LongType(), StringType()))])
    refused = r"column tags: type map<bigint,string> cannot be written as Materialize CDC"
    table = lake.create_table(unique("refused"), schema, key=["id"])
    out = io.BytesIO()
    with pytest.raises(SchemaError, match=refused):
        write_changes(table, out, since=0)
    assert out.getvalue() == b""


def test_changes_carry_structs_and_maps_and_ingest_back_to_the_same_table(spark, lake,
                                                                          tmp_path):
    """Structs (Avro records) and maps with string keys, nested in each other and in arrays,
    timestamps at any depth among their values: `changes` (an Avro file, which holds its
    schema) decodes to the table's rows exactly, and an `ingest` of it makes a table that
    reads as this one at every time."""
    rows = spark.sql("""
        SELECT * FROM VALUES
          (1, named_struct('when', timestamp_micros(1730611800000000), 'note', 'x',
                           'deep', named_struct('n', 7L)),
           map('a', timestamp_micros(-62135596800000000), 'b', NULL),
           array(named_struct('k', 'p', 'v', map('q', 1L)), NULL), 1L, 1L),
          (2, named_struct('when', CAST(NULL AS TIMESTAMP), 'note', CAST(NULL AS STRING),
                           'deep', CAST(NULL AS STRUCT<n: BIGINT>)),
           NULL, array(), 1L, 1L),
          (1, named_struct('when', timestamp_micros(1730611800000000), 'note', 'x',
                           'deep', named_struct('n', 7L)),
           map('a', timestamp_micros(-62135596800000000), 'b', NULL),
           array(named_struct('k', 'p', 'v', map('q', 1L)), NULL), 2L, -1L),
          (3, NULL, map(), NULL, 2L, 1L)
        AS t(id, inner, stamps, pairs, _time, _diff)""")
    table = lake.create_table(unique("nested"), rows.drop("_time", "_diff").schema,
                              key=["id"])
    table.commit(rows, 0, 3)
    path = changes_file(table, tmp_path, avro=True, since=0)
    out = io.BytesIO()
    decode_local([str(path)], out, since=Antichain([0]))
    lines = [orjson.loads(x) for x in out.getvalue().splitlines()]
    assert lines[-1] == {"frontier": [3]}
    first = {"id": 1, "inner": {"when": "2024-11-03T05:30:00+00:00", "note": "x",
                                "deep": {"n": 7}},
             "stamps": {"a": "0001-01-01T00:00:00+00:00", "b": None},
             "pairs": [{"k": "p", "v": {"q": 1}}, None]}
    assert sorted((orjson.dumps(x["data"], option=orjson.OPT_SORT_KEYS), x["time"], x["diff"])
                  for x in lines if "data" in x) == sorted(
        (orjson.dumps(data, option=orjson.OPT_SORT_KEYS), time, diff) for data, time, diff in [
            (first, 1, 1), (first, 2, -1),
            ({"id": 2, "inner": {"when": None, "note": None, "deep": None}, "stamps": None,
              "pairs": []}, 1, 1),
            ({"id": 3, "inner": None, "stamps": {}, "pairs": None}, 2, 1)])

    copy = ingest(lake, unique("copy"), [path], key=["id"])
    copied = lake.table(copy.table)
    assert copied.schema.simpleString() == table.schema.simpleString()

    def rows(frame) -> list[str]:  # the instants exactly (PySpark's own cannot hold year 1)
        frame, instants = with_instants(frame)
        return sorted(repr(instants(r.asDict(recursive=True))) for r in frame.collect())

    for at in (0, 1, 2):
        assert rows(copied.as_of(at)) == rows(table.as_of(at)), at
    assert len(rows(table.as_of(1))) == 2


@pytest.fixture
def driver_in_new_york(monkeypatch):
    """The driver's local time zone is not UTC (PySpark turns a timestamp into a datetime in
    it): a timestamp's instant must not move with it."""
    monkeypatch.setenv("TZ", "America/New_York")
    tzset()
    yield
    monkeypatch.undo()
    tzset()


def test_changes_carry_decimals_dates_and_timestamps_exactly(spark, lake, tmp_path,
                                                           driver_in_new_york):
    schema = StructType([
        StructField("id", DecimalType(20, 0)),  # YDB's Uint64
        StructField("price", DecimalType(10, 2)),
        StructField("day", DateType()),
        StructField("at", TimestampType()),
        StructField("wall", TimestampNTZType()),
        StructField("days", ArrayType(DateType())),
        StructField("ats", ArrayType(TimestampType())),
    ])
    table = lake.create_table(unique("typed"), schema, key=["id"])
    # 2024-03-10 07:30 UTC is 03:30 in New York, an hour after its clocks sprang forward;
    # 2024-11-03 05:30 and 06:30 UTC are both 01:30 there, its clocks set back in between
    version = ("CAST('18446744073709551615' AS DECIMAL(20,0)) AS id, CAST({price} AS "
               "DECIMAL(10,2)) AS price, DATE'2024-01-02' AS day, "
               "timestamp_micros(1710055800000001) AS at, "
               "TIMESTAMP_NTZ'2024-03-10 02:30:00' AS wall, "
               "array(DATE'0001-01-01', NULL, DATE'9999-12-31') AS days, "
               "array(timestamp_micros(1730611800000000), timestamp_micros(1730615400000000),"
               " timestamp_micros(-1), NULL) AS ats")
    updates = spark.sql(
        f"SELECT {version.format(price='12.5')}, 1L AS _time, 1L AS _diff UNION ALL "
        f"SELECT {version.format(price='12.5')}, 2L AS _time, -1L AS _diff UNION ALL "
        f"SELECT {version.format(price='-0.05')}, 2L AS _time, 1L AS _diff")
    table.commit(updates, 0, 3)

    row = {"id": "18446744073709551615", "day": "2024-01-02",
           "at": "2024-03-10T07:30:00.000001+00:00", "wall": "2024-03-10T02:30:00",
           "days": ["0001-01-01", None, "9999-12-31"],
           "ats": ["2024-11-03T05:30:00+00:00", "2024-11-03T06:30:00+00:00",
                   "1969-12-31T23:59:59.999999+00:00", None]}
    expected = [({**row, "price": "12.50"}, 1, 1), ({**row, "price": "12.50"}, 2, -1),
                ({**row, "price": "-0.05"}, 2, 1)]
    for avro in (False, True):
        schema_file = tmp_path / f"schema-{avro}.json"
        path = changes_file(table, tmp_path, avro=avro, since=0, schema_out=schema_file)
        out = io.BytesIO()  # JSON lines carry no schema: the reader brings the one written
        decode_local([str(path)], out, since=Antichain([0]),
                     schema=None if avro else load_schema(schema_file))
        lines = [orjson.loads(x) for x in out.getvalue().splitlines()]
        assert lines[-1] == {"frontier": [3]}
        got = sorted(((x["data"], x["time"], x["diff"]) for x in lines if "data" in x),
                     key=lambda u: (u[1], u[2]))
        assert got == sorted(expected, key=lambda u: (u[1], u[2])), avro


CLI = [str(Path(sys.executable).parent / "changelake")]


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=600, **kwargs)


def cli_changes(tmp_path: Path, lake_root: Path | str, *, avro: bool) -> None:
    """The console script: a changefeed ingested, then `changes --since 0` as JSON lines (or
    an Avro file); `decode` of it prints the history `decode` of the original feed prints."""
    sample = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
    encoded = run("encode", "--from", "debezium", "--key", "order_id", "--close", str(sample))
    assert encoded.returncode == 0, encoded.stderr
    feed = tmp_path / "orders.cdc.jsonl"
    feed.write_bytes(encoded.stdout)
    lake = ["--lake", str(lake_root), "--master", "local[1]", "--table", "orders"]
    ingested = run("ingest", *lake, "--key", "order_id", str(feed))
    assert ingested.returncode == 0, ingested.stderr

    if avro:
        path = tmp_path / "changes.avro"
        out = run("changes", *lake, "--since", "0", "--avro", str(path))
        assert out.returncode == 0 and out.stdout == b"", out.stderr
    else:
        path = tmp_path / "changes.jsonl"
        out = run("changes", *lake, "--since", "0")
        assert out.returncode == 0, out.stderr
        path.write_bytes(out.stdout)
    assert out.stderr.decode().startswith("changes orders: the changes in [0, the end (closed))")

    truth = run("decode", str(feed))
    assert truth.returncode == 0, truth.stderr
    updates, last = decoded_history(truth.stdout)
    assert last == b'{"frontier":[]}' and updates
    again = run("decode", str(path))
    assert again.returncode == 0, again.stderr
    assert decoded_history(again.stdout) == decoded_history(truth.stdout)

    bad = run("changes", *lake, "--since", "0", "--history", "--avro", str(path))
    assert bad.returncode == 2 and b"does not go with --avro" in bad.stderr


@pytest.mark.slow  # three Spark processes; the in-process tests above run by default
def test_cli_changes_decode_to_the_ingested_history(tmp_path, lake_root):
    cli_changes(tmp_path, lake_root, avro=False)


@pytest.mark.slow
def test_cli_changes_avro(tmp_path, lake_root):
    cli_changes(tmp_path, lake_root, avro=True)


def test_changes_of_many_times_hold_no_collection_of_them_in_the_driver(spark, lake):
    """A window of 200,000 times, one update each: the driver's memory while the messages
    stream stays that of a partition's batch of rows, not of the times (a dict of every time's
    count, collected before the first message, held them all: a peak of 75 MB here, 16 MB
    without it)."""
    import tracemalloc

    from pyspark.sql import functions as F

    from changelake.lake.changes import change_messages, plan_changes
    from changelake.protocol import Progress, Updates

    times = 200_000
    table = lake.create_table(unique("times"), StructType([StructField("id", LongType())]),
                              buckets=2)
    table.commit(spark.range(times).select(F.col("id"), F.col("id").alias("_time"),
                                           F.lit(1).cast("long").alias("_diff")), 0, times)
    tracemalloc.start()
    try:
        updates = counted = 0
        for message in change_messages(table, plan_changes(table, 0), batch_size=1000):
            if isinstance(message, Updates):
                updates += len(message.updates)
            elif isinstance(message, Progress):
                counted += sum(c for _, c in message.counts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert updates == counted == times
    assert peak < 40 << 20, peak
