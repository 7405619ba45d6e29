"""Capture into Materialize CDC logs (`--out`) against the embedded PostgreSQL: the snapshot
and the stream (unchanged TOAST values, updates, deletes, a truncate) decoded and ingested back
equal the database; restarts resume from the log's frontier with nothing lost or doubled; the
slot is never confirmed past what the log holds; the CLI's `--out` runs without Spark."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from changelake.capture.postgres.capture import Capture, CaptureOptions, CaptureReport, Rows
from changelake.capture.postgres.pgoutput import parse_lsn
from changelake.capture.postgres.rows import Table, Values
from changelake.capture.postgres.source import SourceError, connect
from changelake.capture.postgres.to_log import LogSink, segment_name
from changelake.capture.postgres.types import catalog
from changelake.errors import SchemaError
from changelake.formats.avro_values import python_to_plain
from changelake.formats.materialize import read_all
from changelake.lake.catalog import Lake
from changelake.lake.ingest import ingest
from changelake.local import decode_local
from changelake.protocol import Progress

CLI = [str(Path(sys.executable).parent / "changelake")]
ITEM_COLUMNS = ("id", "name", "price", "qty", "ratio", "big", "tags", "at", "day", "raw")
BIG = "".join(f"{i:05d}" for i in range(2000))  # 10 kB, stored out of line (TOAST)


@pytest.fixture
def shop(pg_dsn: str) -> Iterator[str]:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), "
                  "qty int, ratio double precision, big text, tags text[], at timestamptz, "
                  "day date, raw bytea)")
        c.execute("ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL")
        c.execute("CREATE TABLE notes (id bigserial PRIMARY KEY, body text)")
        c.execute("CREATE TABLE other (id int PRIMARY KEY, v int)")
        c.execute("CREATE PUBLICATION shop FOR TABLE items, notes, other")
        c.execute("INSERT INTO items VALUES (1, 'apple', 1.50, 10, 0.5, %s, '{a,NULL,\"b,c\"}',"
                  " '2024-01-02 03:04:05+00', '2024-02-29', '\\x00ff'), "
                  "(2, 'pear', 2.00, 5, 'NaN', 'small', NULL, NULL, NULL, NULL), "
                  "(3, 'fig', 3.25, 1, '-Infinity', NULL, '{}', NULL, '0001-01-01', '')",
                  (BIG,))
        c.execute("INSERT INTO notes (body) SELECT 'note ' || g FROM generate_series(1, 5) g")
        c.execute("INSERT INTO other VALUES (1, 1), (2, 2)")
    conn.close()
    yield pg_dsn


def execute(dsn: str, *statements: str) -> None:
    """Each statement its own transaction."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        for statement in statements:
            c.execute(statement)
    conn.close()


def database(dsn: str, table: str) -> Counter[Values]:
    """The table's rows now, typed as the capture types them."""
    conn = connect(dsn)
    with conn.cursor() as c:
        shape = Table.from_catalog(c, table, catalog(conn.cursor()))
        quoted = ", ".join(f'"{col}"::text' for col in shape.columns)
        c.execute(f"SELECT {quoted} FROM {table}")
        rows = Counter(tuple(None if v is None else kind.read(v)
                             for kind, v in zip(shape.types, raw, strict=True))
                       for raw in c.fetchall())
    conn.close()
    return rows


def plain(rows: Counter[Values]) -> Counter[tuple]:
    """Typed rows in the plain form a decode prints (and ingest lands): ISO and decimal text,
    bytes as code points 0-255."""
    return Counter({tuple(_hashable(python_to_plain(_listed(v))) for v in row): n
                    for row, n in rows.items()})


def as_landed(rows: Counter[Values]) -> Counter[tuple]:
    """Typed rows as an ingest of the log lands them: timestamps as microseconds since the
    epoch, bytes as code points 0-255 (the plain form), the rest as the capture types them."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

    def landed(value: object) -> object:
        if isinstance(value, dt.datetime):
            return (value - epoch) // dt.timedelta(microseconds=1)
        if isinstance(value, bytes):
            return python_to_plain(value)
        return _hashable(_listed(value))

    return Counter({tuple(landed(v) for v in row): n for row, n in rows.items()})


def _listed(value: object) -> object:
    return [_listed(v) for v in value] if isinstance(value, tuple) else value


def _hashable(value: object) -> object:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def decoded(log: Path, columns: tuple[str, ...]) -> tuple[Counter[tuple], list]:
    """The log's final state and frontier, through `changelake decode`'s local engine."""
    out = io.BytesIO()
    decode_local([str(log)], out)
    state: Counter[tuple] = Counter()
    frontier: list = []
    for line in out.getvalue().splitlines():
        item = json.loads(line)
        if "frontier" in item:
            frontier = item["frontier"]
            continue
        data = item["data"]
        state[tuple(_hashable(data[c]) for c in columns)] += item["diff"]
    return +state, frontier


def _nan_free(rows: Counter[tuple]) -> Counter[tuple]:
    """JSON spells NaN as text; compare floats that way."""
    def fix(v: object) -> object:
        if isinstance(v, float) and v != v:
            return "NaN"
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    return Counter({tuple(fix(v) for v in row): n for row, n in rows.items()})


def segments(log: Path) -> list[tuple[int, int]]:
    return sorted(tuple(int(t) for t in f.name.removesuffix(".avro").split("-"))  # type: ignore[misc]
                  for f in log.iterdir())


def slot_confirmed(dsn: str, slot: str) -> int:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                  "WHERE slot_name = %s", (slot,))
        (lsn,) = c.fetchone()
    conn.close()
    return parse_lsn(lsn)


class CheckedSink(LogSink):
    """The log sink, checking as each batch arrives that the slot is not yet confirmed past
    any transaction of the batch (the confirmation must wait until the batch is durable)."""

    seen: list[tuple[int, int]]

    def commit_batch(self, tables: dict[str, Table], rows: dict[str, Rows], lower: int,
                     upper: int, emptied: dict[str, int] | None = None) -> None:
        times = [at for batch in rows.values() for (_, at), d in batch.items() if d]
        confirmed = slot_confirmed(self.options.dsn, self.options.slot)
        for at in times:
            assert confirmed <= at, (confirmed, at)
        self.seen = [*getattr(self, "seen", []), (confirmed, lower)]
        super().commit_batch(tables, rows, lower, upper, emptied)


def released(dsn: str) -> None:
    """Wait until no slot of the database is active: the server's walsender has read all the
    capture sent (its last confirmation) and gone, so the slot can be read, or dropped."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        for _ in range(600):
            with conn.cursor() as c:
                c.execute("SELECT count(*) FROM pg_replication_slots WHERE active AND "
                          "database = current_database()")
                if c.fetchone() == (0,):
                    return
            time.sleep(0.05)
        raise AssertionError("a replication slot stayed active after the capture ended")
    finally:
        conn.close()


@pytest.fixture(autouse=True)
def slots_released(pg_dsn: str) -> Iterator[None]:
    yield
    released(pg_dsn)


def capture(dsn: str, out: Path, **options: object) -> tuple[CaptureReport, int]:
    """A capture run, and the slot's confirmed position once it has ended."""
    o = CaptureOptions(dsn, "shop", "log_slot", tables=("items", "notes"),
                       **options)  # type: ignore[arg-type]
    report = Capture(CheckedSink(out, o), o).run()
    released(dsn)
    return report, slot_confirmed(dsn, "log_slot")


def log_times(log: Path) -> set[int]:
    out = io.BytesIO()
    decode_local([str(log)], out)
    return {json.loads(line)["time"] for line in out.getvalue().splitlines()
            if b'"time"' in line}


def test_snapshot_stream_restart_round_trip(spark, shop: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first, confirmed = capture(shop, out, create_slot=True, until_idle=0.5)
    assert first.snapshot_rows == {"public.items": 3, "public.notes": 5}
    assert sorted(p.name for p in out.iterdir()) == ["public.items", "public.notes"]
    runs = [(first.frontier, confirmed)]
    execute(shop,
            "UPDATE items SET qty = 11 WHERE id = 1",  # big is unchanged TOAST: 'u'
            "UPDATE items SET price = 2.10, ratio = 'Infinity' WHERE id = 2",
            "DELETE FROM items WHERE id = 3",
            "UPDATE other SET v = 3 WHERE id = 1",  # not captured (--tables)
            "DELETE FROM other WHERE id = 2",
            "INSERT INTO notes (body) VALUES ('six')",
            "TRUNCATE notes",
            "INSERT INTO notes (body) VALUES ('after')",
            "UPDATE items SET id = 4 WHERE id = 1",  # a key change, big unchanged again
            "INSERT INTO items (id, name, tags) VALUES (5, 'kiwi', '{x}')")
    second, confirmed = capture(shop, out, max_txns=3, batch_seconds=0.0)
    assert second.transactions == 3 and second.stopped == "3 transactions"
    runs.append((second.frontier, confirmed))
    third, confirmed = capture(shop, out, until_idle=1.0)
    runs.append((third.frontier, confirmed))
    assert second.transactions + third.transactions == 10  # `other`'s count, not logged
    for name, columns in (("public.items", ITEM_COLUMNS), ("public.notes", ("id", "body"))):
        log = out / name
        truth = database(shop, name)
        state, frontier = decoded(log, columns)
        assert state == _nan_free(plain(truth)), name
        assert frontier == [third.frontier], name
        # Read back as the capture reads it on a restart: typed rows equal the database's.
        o = CaptureOptions(shop, "shop", "log_slot")
        conn = connect(shop)
        table = Table.from_catalog(conn.cursor(), name, catalog(conn.cursor()))
        conn.close()
        upper, current = LogSink(out, o).read_log(table)
        assert upper == third.frontier and Counter(current.values()) == truth, name
        # The segments tile [0, frontier): nothing written twice, no gap.
        spans = segments(log)
        assert spans[0][0] == 0 and spans[-1][1] == third.frontier
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
        # No run confirmed the slot past a transaction its log did not hold yet.
        times = log_times(log)
        for frontier_then, confirmed_then in runs:
            assert not [t for t in times if frontier_then <= t < confirmed_then]
    items = {row[0]: row for row in database(shop, "public.items")}
    assert items[4][5] == BIG and items[4][3] == 11  # the TOASTed value survived twice
    # `ingest --from materialize` lands the log as a lake table equal to the database.
    lake = Lake(spark, tmp_path / "lake")
    report = ingest(lake, "public.items", [out / "public.items"], key=["id"])
    assert report.frontier == [third.frontier]
    # Typed as `capture --lake` types them (numeric as decimal, date, timestamptz as the
    # instant: compared as microseconds, in the JVM), bytea as its code points.
    current = lake.table("public.items").current()
    assert [current.schema[c].dataType.simpleString() for c in ("price", "at", "day")] == [
        "decimal(10,2)", "timestamp", "date"]
    landed = Counter(tuple(_hashable(v) for v in row) for row in current.selectExpr(
        *[f"unix_micros({c}) AS {c}" if c == "at" else c for c in ITEM_COLUMNS]).collect())
    assert _nan_free(landed) == _nan_free(as_landed(database(shop, "public.items")))


class Crash(Exception):
    pass


class CrashingSink(LogSink):
    """Dies in its `crash_at`-th batch after writing the first table's segment only: the
    other table is behind, and the slot is not confirmed for the batch."""

    crash_at = 2
    batches = 0

    def commit_batch(self, tables: dict[str, Table], rows: dict[str, Rows], lower: int,
                     upper: int, emptied: dict[str, int] | None = None) -> None:
        self.batches += 1
        if self.batches < self.crash_at:
            return super().commit_batch(tables, rows, lower, upper, emptied)
        first = next(iter(tables))
        super().commit_batch({first: tables[first]}, rows, lower, upper, emptied)
        raise Crash(first)


def test_a_crash_between_tables_resumes_with_nothing_lost_or_doubled(shop: str,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    capture(shop, out, create_slot=True, until_idle=0.5)
    execute(shop, "INSERT INTO notes (body) VALUES ('one')",
            "UPDATE items SET qty = 20 WHERE id = 1",  # unchanged TOAST
            "INSERT INTO notes (body) VALUES ('two')",
            "DELETE FROM items WHERE id = 2",
            "UPDATE items SET qty = 21, name = 'green apple' WHERE id = 1")
    o = CaptureOptions(shop, "shop", "log_slot", tables=("items", "notes"), batch_seconds=0.0,
                       until_idle=1.0)
    with pytest.raises(Crash, match=r"public\.items"):
        Capture(CrashingSink(out, o), o).run()
    items, notes = (segments(out / n)[-1][1] for n in ("public.items", "public.notes"))
    assert items > notes  # items holds a batch that notes does not, and the slot neither
    report, _ = capture(shop, out, until_idle=1.0)
    assert report.frontier is not None and report.frontier > items
    for name, columns in (("public.items", ITEM_COLUMNS), ("public.notes", ("id", "body"))):
        state, frontier = decoded(out / name, columns)
        assert state == _nan_free(plain(database(shop, name))), name
        assert frontier == [report.frontier]
        spans = segments(out / name)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans


def cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, reporting on its last line whether Spark was started."""
    code = ("import sys\nfrom changelake.cli import main\ntry:\n"
            "    main(sys.argv[1:], prog_name='changelake')\nfinally:\n"
            "    from pyspark import SparkContext\n"
            "    print('spark started:', SparkContext._gateway is not None)\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          timeout=300, text=True)


def test_cli_out_writes_logs_decode_reads_without_spark(shop: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["capture", "postgres", "--dsn", shop, "--publication", "shop", "--slot", "cli"]
    done = cli(*base, "--out", str(out), "--create-slot", "--until-idle", "0.5")
    assert done.returncode == 0, done.stderr
    assert "spark started: False" in done.stdout
    assert "into 3 logs under" in done.stderr and "10 snapshot rows" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["public.items", "public.notes",
                                                     "public.other"]
    execute(shop, "DELETE FROM notes WHERE id = 1", "UPDATE other SET v = 9 WHERE id = 2")
    again = cli(*base, "--out", str(out), "--until-idle", "0.5")
    assert again.returncode == 0, again.stderr
    assert "captured 2 transactions" in again.stderr
    decode = subprocess.run([*CLI, "decode", *sorted(str(f) for f in
                                                      (out / "public.other").iterdir())],
                            capture_output=True, timeout=120, text=True)
    assert decode.returncode == 0, decode.stderr
    lines = [json.loads(line) for line in decode.stdout.splitlines()]
    changes = Counter((tuple(sorted(x["data"].items())), x["diff"]) for x in lines
                      if "data" in x)
    assert changes == Counter({((("id", 1), ("v", 1)), 1): 1, ((("id", 2), ("v", 2)), 1): 1,
                               ((("id", 2), ("v", 2)), -1): 1, ((("id", 2), ("v", 9)), 1): 1})
    assert lines[-1] == {"frontier": [segments(out / "public.other")[-1][1]]}


@pytest.mark.parametrize("outputs", [[], ["--lake", "L", "--out", "O"]])
def test_cli_needs_exactly_one_of_lake_and_out(outputs: list[str], tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "capture", "postgres", "--dsn", "host=nowhere",
                           "--publication", "p", "--slot", "s", *outputs],
                          capture_output=True, timeout=120, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert "exactly one of --lake DIR (lake tables) and --out DIR" in done.stderr
    assert not any(tmp_path.iterdir())


def test_logs_and_slot_must_belong_together(shop: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    capture(shop, out, create_slot=True, until_idle=0.1)
    o = CaptureOptions(shop, "shop", "fresh", tables=("items", "notes"), create_slot=True)
    with pytest.raises(SourceError, match=r"tables public\.items, public\.notes already hold "
                                          r"a capture, but replication slot 'fresh' does "
                                          "not exist"):
        Capture(LogSink(out, o), o).run()
    o = CaptureOptions(shop, "shop", "log_slot", tables=("items", "notes"))
    with pytest.raises(SourceError, match=r"slot 'log_slot' exists but tables public\.items, "
                                          r"public\.notes hold no capture"):
        Capture(LogSink(tmp_path / "elsewhere", o), o).run()


def test_a_column_name_avro_cannot_hold_is_refused_before_the_slot(shop: str,
                                                                   tmp_path: Path) -> None:
    execute(shop, 'CREATE TABLE odd (id int PRIMARY KEY, "unit price" int)',
            "CREATE PUBLICATION odd FOR TABLE odd")
    o = CaptureOptions(shop, "odd", "odd_slot", create_slot=True)
    with pytest.raises(SchemaError, match=r"table public\.odd, column unit price: not an Avro "
                                          "field name"):
        Capture(LogSink(tmp_path / "out", o), o).run()
    assert not (tmp_path / "out").exists()
    conn = psycopg2.connect(shop)
    with conn.cursor() as c:
        c.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'odd_slot'")
        assert c.fetchone() == (0,)
    conn.close()


def test_heartbeats_move_the_logs_frontier_while_quiet(shop: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first, _ = capture(shop, out, create_slot=True, until_idle=0.1)
    before = {n: segments(out / n) for n in ("public.items", "public.notes")}
    # WAL that carries no captured transaction (pgoutput sends no logical messages unless
    # asked): only keepalives tell the capture that the server has moved on.
    execute(shop, *["SELECT pg_logical_emit_message(false, 'changelake', 'tick')"] * 3)
    quiet, confirmed = capture(shop, out, until_idle=0.5)
    assert quiet.transactions == 0 and quiet.batches >= 1
    assert quiet.frontier is not None and first.frontier is not None
    assert quiet.frontier > first.frontier and confirmed == quiet.frontier
    for name, spans in before.items():
        new = [s for s in segments(out / name) if s not in spans]
        assert new and new[0][0] == spans[-1][1] and new[-1][1] == quiet.frontier
        for lower, upper in new:  # progress only: no updates, no counts
            (progress,) = list(read_all([out / name / segment_name(lower, upper)]))
            assert progress == Progress.make([lower], [upper])


def test_snapshot_never_starts_the_logs_empty_at_the_consistent_point(shop: str,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    first, _ = capture(shop, out, create_slot=True, snapshot="never", until_idle=0.1)
    assert first.snapshot_rows == {}
    spans = segments(out / "public.notes")  # [0, consistent point), then any heartbeat
    assert spans[0][0] == 0 and spans[-1][1] == first.frontier
    assert decoded(out / "public.notes", ("id", "body")) == (Counter(), [first.frontier])
    execute(shop, "INSERT INTO notes (body) VALUES ('new')")
    second, _ = capture(shop, out, until_idle=0.5)
    state, frontier = decoded(out / "public.notes", ("id", "body"))
    assert state == Counter({(6, "new"): 1}) and frontier == [second.frontier]


class SlowSink(LogSink):
    """The log sink, taking `pause` seconds over each batch's commit (a commit on a loaded
    machine, a large lake commit)."""

    pause = 0.0

    def commit_batch(self, tables: dict[str, Table], rows: dict[str, Rows], lower: int,
                     upper: int, emptied: dict[str, int] | None = None) -> None:
        time.sleep(self.pause)
        super().commit_batch(tables, rows, lower, upper, emptied)


@pytest.mark.parametrize("keepalive", [True, False], ids=["keepalive", "without"])
def test_a_commit_longer_than_the_servers_timeout_keeps_the_stream(
        shop: str, tmp_path: Path, monkeypatch, keepalive: bool) -> None:
    """The server ends a replication connection that says nothing for `wal_sender_timeout`:
    while a batch commits the capture reads nothing, so it sends keepalives meanwhile
    (`Source.keepalive`). Without them (the control case), the same capture is cut off."""
    from changelake.capture.postgres import source as source_module

    execute(shop, "ALTER SYSTEM SET wal_sender_timeout = '2s'", "SELECT pg_reload_conf()")
    try:
        out = tmp_path / "out"
        capture(shop, out, create_slot=True, until_idle=0.5)
        execute(shop, "UPDATE items SET qty = 12 WHERE id = 1")
        monkeypatch.setattr(source_module, "KEEPALIVE_SECONDS", 0.5 if keepalive else 60.0)
        o = CaptureOptions(shop, "shop", "log_slot", tables=("items", "notes"), until_idle=3.0)
        sink = SlowSink(out, o)
        sink.pause = 5.0
        if keepalive:
            report = Capture(sink, o).run()
            assert report.transactions == 1
        else:
            with pytest.raises(Exception, match=r"(?i)connection|server|terminat|closed"):
                Capture(sink, o).run()
        released(shop)
    finally:
        execute(shop, "ALTER SYSTEM RESET wal_sender_timeout", "SELECT pg_reload_conf()")
