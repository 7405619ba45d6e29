"""Reading lake tables without a JVM (`changelake.lake.arrow`): the Arrow path against the
Spark path on the same committed states, the commit pointer that tells the Arrow path which
state is committed, and the CLI's `status` / `snapshot` on the Arrow path without pyspark.

The tables are made with the session's Spark (real commits, compactions and schema changes);
each check reads the same state both ways and compares what `snapshot` / `status` print."""

from __future__ import annotations

import datetime as dt
import decimal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from changelake.errors import LakeError
from changelake.lake import Lake, api, arrow
from changelake.lake.commit import repair_pointer, writer_lock
from changelake.lake.compact import CompactionPolicy, compact
from changelake.lake.layout import (
    manifest_versions,
    pointer_path,
    read_pointer,
    write_manifest,
    write_pointer,
)
from tests.support.lake_history import increments, keyed_history, messages, to_df, unkeyed_history
from tests.support.lake_roots import local_only
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark

BEFORE = StructType([StructField("id", LongType()), StructField("name", StringType()),
                     StructField("amount", IntegerType())])
AFTER = StructType([StructField("id", LongType()), StructField("name", StringType()),
                    StructField("amount", LongType()), StructField("extra", StringType())])


def unique(name: str) -> str:
    return f"ar_{uuid.uuid4().hex[:10]}.{name}"


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def printed(rows) -> Counter:
    """Rows as `snapshot --format jsonl` prints them, as a multiset (row order is free)."""
    return Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows)


def spark_snapshot(lake: Lake, name: str, as_of: int | None = None) -> Counter:
    return printed(api.snapshot(lake, name, as_of=as_of))


def arrow_snapshot(lake: Lake, name: str, as_of: int | None = None) -> Counter:
    from changelake.lake.identifier import TableIdentifier

    return printed(arrow.plain_rows(arrow.merged(lake.root, TableIdentifier.parse(name),
                                                 as_of)))


def assert_same(lake: Lake, name: str, times: list[int], *, flat: bool = True) -> Counter:
    """Both engines agree on the table now, at each of `times`, and on its status line."""
    now = spark_snapshot(lake, name)
    assert arrow_snapshot(lake, name) == now
    for at in times:
        assert arrow_snapshot(lake, name, at) == spark_snapshot(lake, name, at), at
    state = lake.table(name).state()
    assert arrow.committed_state(lake.root, lake.handle(name).ident) == state
    assert arrow.table_status(lake.root, state) == api.table_status(lake, name)
    # the Python helpers: the same multiset as a pyarrow Table, and through DuckDB
    table = arrow.read_table(lake.root, name)
    assert table.num_rows == sum(now.values())
    if flat:  # (Arrow's own Python values for timestamps and maps are not PySpark's)
        assert printed(arrow.plain(r) for r in table.to_pylist()) == now
        via_duckdb = arrow.duckdb_relation(lake.root, name).fetchall()
        assert Counter(via_duckdb) == Counter(tuple(r.values()) for r in table.to_pylist())
    return now


def with_extra(updates: list) -> list:
    """Updates of BEFORE's rows as AFTER's: the added column set on insertions."""
    return [((*row, None if d < 0 else f"e{row[2] % 3}"), t, d) for row, t, d in updates]


def build(spark, lake: Lake, *, keyed: bool, seed: int) -> tuple[str, int]:
    """A table of three commits: two on BEFORE, then one on AFTER (a column added, `amount`
    widened from int to long), compacted between them to a time inside a segment (base
    buckets, a split segment). Returns its name and the time of the schema change."""
    rng = seeded(seed)
    times = 8
    history = (keyed_history(rng, times, 10, 4) if keyed else unkeyed_history(rng, times, 3, 5))
    name = unique("keyed" if keyed else "unkeyed")
    table = lake.create_table(name, BEFORE, key=["id"] if keyed else (), buckets=2)
    for lower, upper in [(0, 3), (3, 5), (5, times)]:
        part = [u for u in history if lower <= u[1] < upper]
        if lower < 5:
            table.commit(to_df(spark, part, BEFORE), lower, upper)
        else:
            table.commit(to_df(spark, with_extra(part), AFTER), lower, upper)
        if upper == 5:
            compact(table, 4, policy=CompactionPolicy(fold_fraction=0.5, max_runs=2))
    return name, 5


def build_mangled(spark, lake: Lake, *, keyed: bool, seed: int, times: int = 14
                  ) -> tuple[str, int]:
    """As `build`, through mangled increments (duplicated, reordered messages) and two
    compactions on the way."""
    rng = seeded(seed)
    history = (keyed_history(rng, times, 12, 4) if keyed else unkeyed_history(rng, times, 4, 5))
    name = unique("keyed" if keyed else "unkeyed")
    table = lake.create_table(name, BEFORE, key=["id"] if keyed else (), buckets=2)
    policy = CompactionPolicy(fold_fraction=0.5, max_runs=2)
    incs = list(increments(messages(history, finish_every=2, rng=rng, last_time=times - 1),
                           rng, overlap=0.0))
    changed_at = None
    for n, inc in enumerate(incs):
        if n < len(incs) // 2:
            table.commit(to_df(spark, inc.updates, BEFORE), inc.lower, inc.upper)
        else:
            if changed_at is None:
                changed_at = table.state().upper
            table.commit(to_df(spark, with_extra(inc.updates), AFTER), inc.lower, inc.upper)
        if n in (len(incs) // 3, 2 * len(incs) // 3):
            state = table.state()
            compact(table, (state.since + state.upper) // 2, policy=policy)
    assert changed_at is not None
    return name, changed_at


def check_engines_agree(lake: Lake, name: str, changed_at: int, keyed: bool) -> None:
    state = lake.table(name).state()
    if state.storage == "hive":
        kinds = {f.kind for f in state.files}
        assert {"segment", "base"} <= kinds, kinds  # compacted: base buckets and segments
        assert len(state.structs) >= 2  # old files are projected
    assert len(state.versions) == 2
    upper = state.upper
    assert upper is not None
    times = sorted(t for t in {state.since, changed_at, upper - 1} if state.since <= t < upper)
    now = assert_same(lake, name, times)
    ident = lake.handle(name).ident
    if not keyed:
        assert max(now.values()) > 1  # rows with multiplicity are read as several rows
        with pytest.raises(LakeError, match="has no key") as on_arrow:
            arrow.read_history(lake.root, ident)
        with pytest.raises(LakeError) as on_spark:
            list(api.snapshot(lake, name, history=True))
        assert str(on_arrow.value) == str(on_spark.value)
    else:  # SCD type 2 history, in the order `snapshot --history` prints it
        on_arrow = list(arrow.plain_rows(arrow.Merged.once(arrow.read_history(lake.root,
                                                                              ident))))
        assert on_arrow == list(api.snapshot(lake, name, history=True))
        assert any(r["valid_to"] is not None for r in on_arrow)


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_arrow_and_spark_read_the_same_rows(spark, lake, keyed):
    name, changed_at = build(spark, lake, keyed=keyed, seed=41 if keyed else 42)
    check_engines_agree(lake, name, changed_at, keyed)


@pytest.mark.slow
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_arrow_and_spark_agree_on_mangled_deliveries(spark, lake, keyed):
    name, changed_at = build_mangled(spark, lake, keyed=keyed, seed=43 if keyed else 44)
    check_engines_agree(lake, name, changed_at, keyed)
    # one more compaction, to the frontier: base and deltas only
    compact(lake.table(name), policy=CompactionPolicy(fold_fraction=0.5, max_runs=2))
    assert_same(lake, name, [lake.table(name).state().since])


def test_types_read_as_spark_reads_them(spark, lake):
    schema = StructType([
        StructField("id", IntegerType()), StructField("d", DateType()),
        StructField("ts", TimestampType()), StructField("dec", DecimalType(12, 3)),
        StructField("x", DoubleType()), StructField("b", BinaryType()),
        StructField("tags", ArrayType(StringType())),
        StructField("inner", StructType([StructField("a", LongType()),
                                         StructField("s", StringType())])),
    ])
    name = unique("types")
    table = lake.create_table(name, schema, key=["id"])
    rows = [
        ((1, dt.date(2024, 2, 29), dt.datetime(2024, 3, 1, 12, 30, 5, 123456),
          decimal.Decimal("12.345"), 1.5, b"\x00\xff", ["a", None], (7, "x")), 0, 1),
        ((2, None, None, None, None, None, None, None), 0, 1),
        ((3, dt.date(1969, 12, 31), dt.datetime(1969, 7, 20, 20, 17, 40),
          decimal.Decimal("-0.001"), float("inf"), b"", [], (None, None)), 1, 1),
    ]
    fields = [*schema.fields, StructField("_time", LongType()), StructField("_diff", LongType())]
    table.commit(spark.createDataFrame([(*r, t, d) for r, t, d in rows], StructType(fields)),
                 0, 2)
    now = assert_same(lake, name, [0], flat=False)
    # A timestamp prints as the instant, in UTC with its offset (PySpark took the naive
    # datetimes above in the driver's local time).
    instant = dt.datetime(2024, 3, 1, 12, 30, 5, 123456).astimezone(dt.UTC).isoformat()
    assert instant.endswith("+00:00")
    assert any(f'"ts":"{instant}"'.encode() in line for line in now), now


def test_instants_at_the_calendars_ends_and_at_any_depth_print_exactly(spark, lake):
    """Every timestamp, in arrays, structs and maps too, prints as its instant in UTC on both
    engines, at the first and last microsecond Spark holds as well. Through PySpark's naive
    local datetimes, the first one failed the Spark engine in any time zone ("year 0 is out
    of range"); it leaves the JVM as microseconds instead (`spark/instants.py`). A timestamp
    without a time zone prints its wall-clock time at both ends."""
    first, last, moon = -62135596800000000, 253402300799999999, -14182940000000
    name = unique("instants")
    rows = spark.sql(f"""
        SELECT * FROM VALUES
          (1, timestamp_micros({first}), CAST(timestamp_micros({first}) AS TIMESTAMP_NTZ),
           array(timestamp_micros({last}), NULL),
           named_struct('when', timestamp_micros({moon}), 'note', 'x'),
           map('a', timestamp_micros({first}), 'b', NULL)),
          (2, timestamp_micros({last}), CAST(timestamp_micros({last}) AS TIMESTAMP_NTZ),
           NULL, named_struct('when', CAST(NULL AS TIMESTAMP), 'note', CAST(NULL AS STRING)),
           NULL),
          (3, NULL, NULL, array(), NULL, map())
        AS t(id, ts, ntz, many, inner, by)""")
    table = lake.create_table(name, rows.schema, key=["id"])
    table.commit(rows.selectExpr("*", "0L AS _time", "1L AS _diff"), 0, 1)
    now = assert_same(lake, name, [0], flat=False)

    def instant(micros: int) -> str:
        return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
                + dt.timedelta(microseconds=micros)).isoformat()

    assert now == printed([
        {"id": 1, "ts": instant(first), "ntz": "0001-01-01T00:00:00",
         "many": [instant(last), None], "inner": {"when": instant(moon), "note": "x"},
         "by": {"a": instant(first), "b": None}},
        {"id": 2, "ts": instant(last), "ntz": "9999-12-31T23:59:59.999999", "many": None,
         "inner": {"when": None, "note": None}, "by": None},
        {"id": 3, "ts": None, "ntz": None, "many": [], "inner": None, "by": {}},
    ])
    assert instant(first) == "0001-01-01T00:00:00+00:00"


def test_a_manifest_without_a_commit_is_never_read(spark, lake):
    """The crash windows of a commit: a manifest written before the view changed (in flight,
    or crashed there), and a view changed before the pointer. The Arrow path refuses both
    (the version is known only to the metastore); a Spark-side read repairs them."""
    name = unique("pointer")
    table = lake.create_table(name, BEFORE, key=["id"], buckets=2, storage="hive")
    table.commit(to_df(spark, [((1, "a", 1), 0, 1), ((2, "b", 2), 1, 1)], BEFORE), 0, 2)
    ident, directory = table.ident, table.directory
    state = table.state()
    assert read_pointer(directory) == state.version == 1
    before = arrow_snapshot(lake, name)
    assert before == spark_snapshot(lake, name)

    # a commit that wrote its file set and manifest, and not (yet) the view: rows doubled
    segment = state.segments()[0]
    spark.read.parquet(str(directory / segment.path)).write.parquet(str(directory / "seg/2-9"))
    ghost = state.next("commit", frontier=(9,),
                       files=(*state.files, replace(segment, path="seg/2-9", lower=2, upper=9)))
    write_manifest(directory, ghost)
    with pytest.raises(arrow.ArrowUnavailable, match="newer than the commit pointer"):
        arrow.committed_state(lake.root, ident)
    with pytest.raises(arrow.ArrowUnavailable):
        arrow.read_table(lake.root, name)
    with pytest.raises(arrow.ArrowUnavailable):
        arrow.lake_states(lake.root)
    assert table.state().version == 1  # Spark still reads the committed version

    # a writer in flight holds the lock: a Spark-side read leaves its manifest alone
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with writer_lock(directory):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(30)
        assert not repair_pointer(spark, ident, directory)
        assert manifest_versions(directory)[-1] == 2
    finally:
        release.set()
        thread.join()

    # the writer died without its commit: the next Spark-side read removes its manifest
    list(api.snapshot(lake, name))
    assert manifest_versions(directory) == [0, 1]
    assert arrow_snapshot(lake, name) == before

    # the view changed, the pointer did not (a crash between the two)
    write_pointer(directory, 0)
    with pytest.raises(arrow.ArrowUnavailable):
        arrow.committed_state(lake.root, ident)
    # the next commit writes the pointer
    table.commit(to_df(spark, [((3, "c", 3), 2, 1)], BEFORE), 2, 3)
    assert read_pointer(directory) == 2
    assert arrow_snapshot(lake, name) == spark_snapshot(lake, name) != before

    # a table from before pointers: none at all; `status` on Spark writes it
    pointer_path(directory).unlink()
    with pytest.raises(arrow.ArrowUnavailable, match="no commit pointer"):
        arrow.committed_state(lake.root, ident)
    api.lake_status(lake, live=False)
    assert read_pointer(directory) == 2
    assert arrow.committed_state(lake.root, ident) == table.state()


def test_as_of_outside_the_history_and_missing_tables_are_refused(spark, lake):
    name = unique("bounds")
    table = lake.create_table(name, BEFORE, since=3)
    table.commit(to_df(spark, [((1, "a", 1), 3, 2)], BEFORE), 3, 5)
    for at in (2, 5):
        with pytest.raises(LakeError) as on_spark:
            lake.table(name).as_of(at)
        with pytest.raises(LakeError) as on_arrow:
            arrow.read_table(lake.root, name, at)
        assert str(on_arrow.value) == str(on_spark.value)
    assert arrow.read_table(lake.root, name, 4).num_rows == 2  # multiplicity 2: two rows
    with pytest.raises(LakeError, match="does not exist"):
        arrow.read_table(lake.root, "ar_nowhere.nope")


CLI_PROBE = """
import sys
from changelake.cli import main
try:
    main(sys.argv[1:], prog_name="changelake")
except SystemExit as done:
    code = done.code or 0
else:
    code = 0
print("PYSPARK-IMPORTED" if "pyspark" in sys.modules else "NO-PYSPARK", file=sys.stderr)
sys.exit(code)
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter, reporting on stderr whether pyspark was imported (no
    pyspark, no JVM: Spark is started only through pyspark's launcher)."""
    return subprocess.run([sys.executable, "-c", CLI_PROBE, *args], capture_output=True,
                          timeout=300)


def test_cli_status_and_snapshot_need_no_jvm(spark, lake):
    name = unique("cli")
    table = lake.create_table(name, BEFORE)
    table.commit(to_df(spark, [((1, "a", 1), 0, 2), ((2, None, 5), 1, 1)], BEFORE), 0, 3)
    root = str(lake.root)

    status = cli("status", "--lake", root, "--format", "jsonl")
    assert status.returncode == 0, status.stderr
    assert status.stderr.decode().strip() == "NO-PYSPARK"
    expected = api.lake_status(lake, live=False).tables
    assert [orjson.loads(line) for line in status.stdout.splitlines()] == [
        t.to_json() for t in expected]

    for as_of in (None, "0", "2"):
        extra = () if as_of is None else ("--as-of", as_of)
        done = cli("snapshot", "--lake", root, "--table", name, "--format", "jsonl", *extra)
        assert done.returncode == 0, done.stderr
        assert done.stderr.decode().strip() == "NO-PYSPARK"
        assert Counter(done.stdout.splitlines()) == Counter(
            orjson.dumps(r) for r in api.snapshot(
                lake, name, as_of=None if as_of is None else int(as_of)))

    refused = cli("snapshot", "--lake", root, "--table", name, "--as-of", "3",
                  "--engine", "arrow")
    assert refused.returncode == 2 and b"not final yet" in refused.stderr
    if table.state().storage == "hive":  # a Delta table's commit point is Delta's log
        pointer_path(table.directory).unlink()  # no pointer: --engine arrow cannot tell
        unknown = cli("snapshot", "--lake", root, "--table", name, "--engine", "arrow")
        assert unknown.returncode == 2 and b"no commit pointer" in unknown.stderr


def test_the_cli_names_the_jvm_log_variable_spark_reads():
    from changelake.cli import JVM_LOG_ENV
    from changelake.spark.session import JVM_LOG_ENV as SESSION_JVM_LOG_ENV

    assert JVM_LOG_ENV == SESSION_JVM_LOG_ENV


@pytest.mark.slow
@local_only("a lake the CLI makes in tmp_path, whose files the test changes in place")
def test_auto_falls_back_to_spark_and_spark_repairs_the_pointer(tmp_path: Path):
    """A lake made by the CLI (its embedded metastore): with the pointer gone (a table from
    before pointers), `auto` reads on Spark, prints what the Arrow path prints, and writes the
    pointer, so the next read needs no JVM."""
    from tests.cli.test_cli_lake import orders_feed

    feed = orders_feed(tmp_path)
    lake = ["--lake", str(tmp_path / "lake"), "--master", "local[1]"]
    made = subprocess.run([*CLI_TOOL, "ingest", *lake, "--table", "orders", "--key", "order_id",
                           str(feed)], capture_output=True, timeout=600)
    assert made.returncode == 0, made.stderr
    directory = tmp_path / "lake" / "tables" / "default" / "orders"
    on_arrow = cli("snapshot", *lake, "--table", "orders", "--engine", "arrow")
    assert on_arrow.returncode == 0 and on_arrow.stderr.decode().strip() == "NO-PYSPARK"
    pointer_path(directory).unlink()
    on_spark = cli("snapshot", *lake, "--table", "orders")
    assert on_spark.returncode == 0, on_spark.stderr
    assert on_spark.stderr.decode().strip().endswith("PYSPARK-IMPORTED")  # the fall-back
    assert Counter(on_spark.stdout.splitlines()) == Counter(on_arrow.stdout.splitlines())
    assert read_pointer(directory) == 1
    again = cli("status", *lake, "--format", "jsonl")
    assert again.returncode == 0 and again.stderr.decode().strip() == "NO-PYSPARK"
    (line,) = again.stdout.splitlines()
    assert orjson.loads(line)["rows"] == 3


CLI_TOOL = [str(Path(sys.executable).parent / "changelake")]


def test_decimals_print_the_same_text_on_both_engines(spark, lake):
    """PySpark's rows carry a decimal in engineering notation (-0.0000000001 of a
    decimal(20, 10) arrived as Decimal('-1.00E-10'), which printed "-1.00E-10" where Arrow
    printed "-1E-10"); each is set at its type's scale (`spark/instants.py`), at any depth."""
    name = unique("decimals")
    rows = spark.sql("""
        SELECT * FROM VALUES
          (1, CAST('-0.0000000001' AS DECIMAL(20, 10)), array(CAST('1E-10' AS DECIMAL(20, 10))),
           CAST('12345678901234567890123456.789012345678' AS DECIMAL(38, 12))),
          (2, CAST('0.0000001' AS DECIMAL(20, 10)), NULL, CAST('-1E-12' AS DECIMAL(38, 12))),
          (3, CAST(0 AS DECIMAL(20, 10)), array(), NULL)
        AS t(id, v, many, wide)""")
    table = lake.create_table(name, rows.schema, key=["id"])
    table.commit(rows.selectExpr("*", "0L AS _time", "1L AS _diff"), 0, 1)
    now = assert_same(lake, name, [0], flat=False)
    assert now == printed([
        {"id": 1, "v": "-1E-10", "many": ["1E-10"],
         "wide": "12345678901234567890123456.789012345678"},
        {"id": 2, "v": "1.000E-7", "many": None, "wide": "-1E-12"},
        {"id": 3, "v": "0E-10", "many": [], "wide": None},
    ])
