"""Capture into a lake across runs, against the embedded PostgreSQL: a slot dropped between runs
and tables the capture cannot key are named; an unchanged TOAST value is taken from the lake
after a restart; streamed transactions (committed, aborted, with a rolled-back savepoint)
arrive whole through the replication connection; the snapshot reads values as pgoutput sends
them. Each run is `LakeCapture.run` in this process (the CLI's own code without its Spark
start-up); `test_capture_pg_cli_errors.py` runs the command line. A restart of the server
itself, under a running capture: `test_capture_pg_server_restart.py`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import psycopg2
import pytest

from changelake.capture.postgres import pgoutput as po
from changelake.capture.postgres.capture import Capture
from changelake.capture.postgres.rows import CaptureError
from changelake.capture.postgres.source import Idle, Source, SourceError
from changelake.capture.postgres.to_lake import CaptureOptions, LakeCapture
from changelake.capture.postgres.to_log import LogSink
from changelake.lake.catalog import Lake
from tests.capture.test_capture_pg_log import decoded
from tests.support.pg_workload import database_rows, drop_slot, lake_rows


@pytest.fixture
def sql(pg_dsn: str) -> Iterator[psycopg2.extensions.cursor]:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        yield c
    conn.close()


def capture(lake: Lake, dsn: str, *, create: bool = False, publication: str = "p",
            slot: str, idle: float = 0.5):
    return LakeCapture(lake, CaptureOptions(dsn, publication, slot, create_slot=create,
                                            until_idle=idle, heartbeat_seconds=0.5)).run()


def slots(sql) -> list[str]:
    sql.execute("SELECT slot_name FROM pg_replication_slots ORDER BY 1")
    return [r[0] for r in sql.fetchall()]


def assert_lake_is_database(lake: Lake, dsn: str, tables: tuple[str, ...]) -> None:
    assert lake_rows(lake, tables) == database_rows(dsn, tables)


# -- errors ------------------------------------------------------------------------------------

def test_a_slot_dropped_between_runs_is_named_and_not_made_again(spark, pg_dsn, sql,
                                                                 tmp_path) -> None:
    sql.execute("CREATE TABLE dropped (id int PRIMARY KEY, s text)")
    sql.execute("CREATE PUBLICATION p FOR TABLE dropped")
    sql.execute("INSERT INTO dropped VALUES (1, 'a')")
    lake = Lake(spark, tmp_path / "lake")
    capture(lake, pg_dsn, create=True, slot="dropped")
    drop_slot(pg_dsn, "dropped")
    sql.execute("INSERT INTO dropped VALUES (2, 'lost to the lake')")
    for create in (False, True):
        with pytest.raises(SourceError, match=r"tables public\.dropped already hold a capture, "
                           r"but replication slot 'dropped' does not exist \(dropped since "
                           "their last run"):
            capture(lake, pg_dsn, create=create, slot="dropped")
        # A new slot would stream from now on into tables that miss what came before it.
        assert slots(sql) == []


def test_two_tables_one_lake_name_would_hold_are_refused_before_anything(spark, pg_dsn, sql,
                                                                           tmp_path) -> None:
    """`"Foo"` and `foo` are two PostgreSQL tables and one lake name (lake names compare
    case-insensitively): refused before the slot is made, where the first had been committed
    into `public.foo` and the second refused only then."""
    sql.execute('CREATE TABLE "Foo" (id int PRIMARY KEY)')
    sql.execute("CREATE TABLE foo (id int PRIMARY KEY)")
    sql.execute('INSERT INTO "Foo" VALUES (1)')
    sql.execute("INSERT INTO foo VALUES (2)")
    sql.execute("CREATE PUBLICATION p FOR ALL TABLES")
    lake = Lake(spark, tmp_path / "lake")
    with pytest.raises(CaptureError, match=r"tables public\.(Foo|foo) and public\.(Foo|foo) "
                                           r"would both be lake table public\.foo"):
        capture(lake, pg_dsn, create=True, slot="foo")
    assert slots(sql) == [] and not lake.exists("public.foo")


def test_a_slot_of_another_kind_is_named(spark, pg_dsn, sql, tmp_path) -> None:
    sql.execute("CREATE TABLE otherkind (id int PRIMARY KEY)")
    sql.execute("CREATE PUBLICATION p FOR TABLE otherkind")
    sql.execute("SELECT pg_create_physical_replication_slot('phys')")  # of no database
    try:
        with pytest.raises(SourceError, match="replication slot 'phys' belongs to plugin None"):
            capture(Lake(spark, tmp_path / "lake"), pg_dsn, slot="phys")
    finally:
        drop_slot(pg_dsn, "phys")


@pytest.mark.parametrize(("table", "good"), [
    ("CREATE TABLE bad (a int, b text)", "keyed1"),
    ("CREATE TABLE bad (a int PRIMARY KEY, b text); ALTER TABLE bad REPLICA IDENTITY NOTHING",
     "keyed2"),
    # PostgreSQL logs no old key by a deferrable primary key: it is no replica identity.
    ("CREATE TABLE bad (a int PRIMARY KEY DEFERRABLE, b text)", "keyed3"),
])
def test_a_table_without_key_or_replica_identity_is_named(spark, pg_dsn, sql, tmp_path,
                                                          table: str, good: str) -> None:
    sql.execute(table)
    sql.execute(f"CREATE TABLE {good} (id int PRIMARY KEY)")
    sql.execute(f"CREATE PUBLICATION p FOR TABLE {good}, bad")
    with pytest.raises(SourceError, match=r"table public\.bad has no primary key or replica "
                       "identity"):
        capture(Lake(spark, tmp_path / "lake"), pg_dsn, create=True, slot=good)
    assert slots(sql) == []  # refused before anything was made
    # The other tables of the publication can still be captured on their own.
    report = LakeCapture(Lake(spark, tmp_path / "lake"), CaptureOptions(
        pg_dsn, "p", good, tables=(good,), create_slot=True, until_idle=0.3)).run()
    assert report.tables == (f"public.{good}",)


def test_tables_are_looked_up_by_their_own_names_not_as_sql(pg_dsn, sql, tmp_path) -> None:
    """`"Bad"` (no key) was checked as `bad` (keyed) and accepted: a name is never read as
    SQL. A table named `a.b` cannot be named `schema.table` without being taken for another
    (`public.a.b`): it is refused in one line, naming it."""
    sql.execute('CREATE TABLE "Bad" (a int, b text)')
    sql.execute("CREATE TABLE bad (id int PRIMARY KEY)")
    sql.execute("INSERT INTO bad VALUES (1)")
    sql.execute('CREATE TABLE "a.b" (id int PRIMARY KEY, v text)')
    sql.execute('CREATE PUBLICATION p FOR TABLE "Bad", bad')
    sql.execute('CREATE PUBLICATION dotted FOR TABLE bad, "a.b"')
    out = tmp_path / "out"
    options = CaptureOptions(pg_dsn, "p", "names", create_slot=True, until_idle=0.3)
    with pytest.raises(SourceError, match=r"table public\.Bad has no primary key"):
        Capture(LogSink(out, options), options).run()
    options = replace(options, tables=("public.bad",))
    Capture(LogSink(out, options), options).run()
    rows, _ = decoded(out / "public.bad", ("id",))
    assert rows == Counter({(1,): 1})
    dotted = replace(options, publication="dotted", slot="dotted", tables=None)
    with pytest.raises(SourceError, match=r'"a\.b" of publication .* has a dot') as no:
        Capture(LogSink(tmp_path / "out2", dotted), dotted).run()
    assert "\n" not in str(no.value)


# -- TOAST across a restart --------------------------------------------------------------------

def test_unchanged_toast_is_taken_from_the_lake_after_a_restart(spark, pg_dsn, sql,
                                                                tmp_path) -> None:
    sql.execute("CREATE TABLE toastdocs (id int PRIMARY KEY, version int, body text)")
    sql.execute("ALTER TABLE toastdocs ALTER COLUMN body SET STORAGE EXTERNAL")  # out of line
    sql.execute("CREATE PUBLICATION p FOR TABLE toastdocs")
    lake = Lake(spark, tmp_path / "lake")
    capture(lake, pg_dsn, create=True, slot="toast")
    sql.execute("INSERT INTO toastdocs SELECT g, 1, repeat(g::text || 'abcdefgh', 1000) "
                "FROM generate_series(1, 3) g")
    capture(lake, pg_dsn, slot="toast")  # the bodies are in the lake; the capture stops
    sql.execute("UPDATE toastdocs SET version = 2 WHERE id = 1")
    sql.execute("UPDATE toastdocs SET id = 30, version = 3 WHERE id = 3")  # a new key, same body
    # The server sends those bodies as unchanged: only the lake has them.
    sql.execute("SELECT data FROM pg_logical_slot_peek_binary_changes('toast', NULL, NULL, "
                "'proto_version', '1', 'publication_names', 'p')")
    decoder = po.Decoder()
    updates = [m for m in (decoder.decode(bytes(r[0]), 0) for r in sql.fetchall())
               if isinstance(m, po.Update)]
    assert len(updates) == 2 and all(m.new[2] is po.UNCHANGED for m in updates)
    capture(lake, pg_dsn, slot="toast")
    assert_lake_is_database(lake, pg_dsn, ("public.toastdocs",))
    bodies = lake.table("public.toastdocs").current().collect()
    assert {r["id"]: len(r["body"]) for r in bodies} == {1: 9000, 2: 9000, 30: 9000}


# -- streamed transactions ---------------------------------------------------------------------

def test_streamed_transactions_through_the_replication_connection(spark, pg_dsn, sql,
                                                                  tmp_path) -> None:
    sql.execute("CREATE TABLE st (id int PRIMARY KEY, s text, n int)")
    sql.execute("CREATE TABLE su (id int PRIMARY KEY, s text)")
    sql.execute("CREATE PUBLICATION p FOR TABLE st, su")
    sql.execute("INSERT INTO st SELECT g, 'snap', 0 FROM generate_series(1, 50) g")
    lake = Lake(spark, tmp_path / "lake")
    capture(lake, pg_dsn, create=True, slot="streamed")
    sql.execute("SELECT pg_create_logical_replication_slot('peek', 'pgoutput')")
    big, small = psycopg2.connect(pg_dsn), psycopg2.connect(pg_dsn)
    small.autocommit = True
    pad = "x" * 150
    with big.cursor() as b, small.cursor() as s:
        # Committed, with a rolled-back savepoint, interleaved with small transactions: the
        # server streams it in blocks (each insert batch is past 64kB of changes).
        b.execute(f"INSERT INTO st SELECT g, '{pad}', 1 FROM generate_series(100, 1599) g")
        s.execute("UPDATE st SET n = n + 10 WHERE id <= 10")
        b.execute("SAVEPOINT a")
        b.execute(f"INSERT INTO st SELECT g, '{pad}', 2 FROM generate_series(2000, 3499) g")
        b.execute("DELETE FROM st WHERE id <= 5")
        b.execute("ROLLBACK TO SAVEPOINT a")
        s.execute("INSERT INTO su VALUES (1, 'between')")
        b.execute("SAVEPOINT b")
        b.execute("UPDATE st SET n = 3 WHERE id BETWEEN 100 AND 199")
        b.execute("RELEASE SAVEPOINT b")
        b.execute(f"INSERT INTO su SELECT g, '{pad}' FROM generate_series(10, 1509) g")
        big.commit()
        # Streamed, then rolled back whole.
        b.execute(f"INSERT INTO st SELECT g, '{pad}', 4 FROM generate_series(5000, 6499) g")
        s.execute("DELETE FROM st WHERE id = 50")
        b.execute("UPDATE st SET s = 'gone' WHERE id <= 20")
        big.rollback()
        s.execute("UPDATE su SET s = 'after' WHERE id = 1")
    big.close()
    small.close()
    report = capture(lake, pg_dsn, slot="streamed", idle=1.5)
    assert report.transactions == 5  # the rolled-back one is not among them
    assert_lake_is_database(lake, pg_dsn, ("public.st", "public.su"))

    # The same changes, as the server sends them: Stream Abort of a whole transaction and of a
    # subtransaction; through the replication connection, the committed one arrives streamed.
    sql.execute("SELECT data FROM pg_logical_slot_peek_binary_changes('peek', NULL, NULL, "
                "'proto_version', '2', 'publication_names', 'p', 'streaming', 'on')")
    decoder = po.Decoder()
    aborts = [m for m in (decoder.decode(bytes(r[0]), 0) for r in sql.fetchall())
              if isinstance(m, po.StreamAbort)]
    assert any(m.subxid == m.xid for m in aborts) and any(m.subxid != m.xid for m in aborts)
    with Source(pg_dsn, "p", "peek") as source:
        source.open_slot(create=False)
        received = []
        for event in source.stream(0, memory_limit=100 * 400, idle_every=0.5):
            if isinstance(event, Idle):
                break
            received.append((event.streamed, len(event)))
            event.spool.close()
    assert [streamed for streamed, _ in received] == [False, False, True, False, False]
    assert received[2][1] == 1500 + 100 + 1500  # its inserts and updates, not the rolled back


# -- the snapshot reads values as pgoutput sends them -------------------------------------------

def test_snapshot_and_stream_agree_on_value_texts(spark, pg_dsn, sql, tmp_path) -> None:
    sql.execute("CREATE TABLE texts (code char(4) PRIMARY KEY, flag boolean, names varchar(9)[])")
    sql.execute("CREATE PUBLICATION p FOR TABLE texts")
    sql.execute("INSERT INTO texts VALUES ('a', true, '{x}'), ('bb', false, NULL), ('c', NULL, "
                "'{\"y z\",NULL}')")
    lake = Lake(spark, tmp_path / "lake")
    capture(lake, pg_dsn, create=True, slot="texts")
    # pgoutput sends char(n) padded and booleans as t/f: the rows the snapshot read must be
    # the same values, or these updates and deletes would not find them.
    sql.execute("UPDATE texts SET flag = NOT flag WHERE code = 'a'")
    sql.execute("DELETE FROM texts WHERE code = 'bb'")
    sql.execute("INSERT INTO texts VALUES ('d', true, '{}')")
    capture(lake, pg_dsn, slot="texts")
    assert_lake_is_database(lake, pg_dsn, ("public.texts",))
    assert sorted(r["code"] for r in lake.table("public.texts").current().collect()) == \
        ["a   ", "c   ", "d   "]
