"""A captured table's columns change (ALTER TABLE) while it is captured: a lake table follows
an added column (rows from before it read it as null, as PostgreSQL says), in the shape each
row was made in, even with transactions of both shapes in one batch; a change it cannot
follow (a column dropped, renamed) and any change of a log's columns (one schema per log) is
refused with one line naming the table and the change, before anything is written, on every
rerun. Each run is in this process (`LakeCapture.run`, `Capture(LogSink(...))`)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg2
import pytest

from changelake.capture.postgres.capture import Capture, CaptureOptions
from changelake.capture.postgres.rows import CaptureError
from changelake.capture.postgres.to_lake import LakeCapture
from changelake.capture.postgres.to_log import LogSink
from changelake.lake.catalog import Lake
from tests.capture.test_capture_pg_log import decoded
from tests.support.pg_workload import database_rows, lake_rows
from tests.support.postgres import execute

SLOT = "ddl"
T = ("public.t",)
TWO = ("public.a", "public.t")


@pytest.fixture
def db(pg_dsn: str) -> str:
    """Tables `a` and `t` (captured in that order), two rows in `t`."""
    execute(pg_dsn, "CREATE TABLE a (id int PRIMARY KEY, v int)",
            "CREATE TABLE t (id int PRIMARY KEY, a int, b text)",
            "CREATE PUBLICATION p FOR TABLE a, t",
            "INSERT INTO t VALUES (1, 10, 'one'), (2, 20, 'two')")
    return pg_dsn


def options(dsn: str, **kw: object) -> CaptureOptions:
    """One batch for all that is waiting (`batch_seconds`): a batch holds both shapes."""
    return CaptureOptions(dsn, "p", SLOT, until_idle=0.5, heartbeat_seconds=0.5,
                          batch_seconds=30, **kw)  # type: ignore[arg-type]


def to_lake(lake: Lake, dsn: str, **kw: object) -> None:
    LakeCapture(lake, options(dsn, **kw)).run()


def to_log(out: Path, dsn: str, **kw: object) -> None:
    o = options(dsn, **kw)
    Capture(LogSink(out, o), o).run()


def streaming(dsn: str) -> bool:
    """Whether the capture streams from its slot (it read the tables' columns before)."""
    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
        row = c.fetchone()
    conn.close()
    return bool(row and row[0])


def assert_lake_is_database(lake: Lake, dsn: str, tables: tuple[str, ...] = TWO) -> None:
    assert lake_rows(lake, tables) == database_rows(dsn, tables)


# -- lake --------------------------------------------------------------------------------------

def test_an_added_column_then_an_update_of_an_older_row(spark, no_public_views, db,
                                                        tmp_path) -> None:
    lake = Lake(spark, tmp_path / "lake")
    to_lake(lake, db, create_slot=True)
    execute(db, "ALTER TABLE t ADD COLUMN c text", "UPDATE t SET a = 11 WHERE id = 1",
            "DELETE FROM t WHERE id = 2", "INSERT INTO t VALUES (3, 30, 'three', 'x')")
    to_lake(lake, db)
    assert lake.table("public.t").current().columns == ["id", "a", "b", "c"]
    assert_lake_is_database(lake, db)
    execute(db, "UPDATE t SET c = 'y' WHERE id = 1")  # and on, in the new shape
    to_lake(lake, db)
    assert_lake_is_database(lake, db)


def test_one_batch_and_one_transaction_with_both_shapes(spark, no_public_views, db,
                                                        tmp_path) -> None:
    """Rows from before the ALTER TABLE, then after it, in one batch; and one transaction
    that changes a row, adds a column and changes it again (a relation in its middle)."""
    lake = Lake(spark, tmp_path / "lake")
    to_lake(lake, db, create_slot=True)
    execute(db, "UPDATE t SET b = 'uno' WHERE id = 1", "INSERT INTO t VALUES (3, 30, 'three')",
            "ALTER TABLE t ADD COLUMN c text", "UPDATE t SET c = 'tres' WHERE id = 3",
            "INSERT INTO a VALUES (1, 1)",
            "BEGIN; UPDATE t SET a = 21 WHERE id = 2; ALTER TABLE t ADD COLUMN d int; "
            "UPDATE t SET d = 4 WHERE id = 2; INSERT INTO t VALUES (4, 40, 'four', 'x', 5); "
            "COMMIT")
    to_lake(lake, db)
    assert_lake_is_database(lake, db)


def test_a_restart_after_a_column_was_added_with_older_rows_to_come(
        spark, no_public_views, db, tmp_path) -> None:
    """The run starts with the table's new columns (the catalog's), and batches of one
    transaction: the first, of another table, must not give the lake table the new shape
    ahead of the older rows the next batches bring."""
    lake = Lake(spark, tmp_path / "lake")
    to_lake(lake, db, create_slot=True)
    execute(db, "INSERT INTO a VALUES (1, 1)", "UPDATE t SET a = 21 WHERE id = 2",
            "ALTER TABLE t ADD COLUMN c text", "INSERT INTO t VALUES (3, 30, 'three', 'x')")
    to_lake(lake, db, batch_updates=1)
    assert_lake_is_database(lake, db)


def while_running(run: Callable[[CaptureOptions], None], dsn: str, *statements: str,
                  batch_seconds: float = 0.2) -> None:
    """Run `statements` while a capture runs (`run`, started with the table's columns of
    before them), until it is idle."""
    failed: list[BaseException] = []

    def capture() -> None:
        try:
            run(CaptureOptions(dsn, "p", SLOT, until_idle=2.0, heartbeat_seconds=0.5,
                               batch_seconds=batch_seconds))
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=capture)
    thread.start()
    deadline = time.monotonic() + 60
    while not streaming(dsn) and time.monotonic() < deadline:  # its columns read
        time.sleep(0.05)
    execute(dsn, *statements)
    thread.join()
    if failed:
        raise failed[0]


@pytest.mark.parametrize("older", [(), ("UPDATE t SET a = 11 WHERE id = 1",
                                        "DELETE FROM t WHERE id = 2")])
def test_a_column_added_while_the_capture_runs(spark, no_public_views, db, tmp_path,
                                               older: tuple[str, ...]) -> None:
    """The run started with the table's old columns: the rows have the new ones, the added
    column's values land (inserts only), and rows from before it change (`older`)."""
    lake = Lake(spark, tmp_path / "lake")
    to_lake(lake, db, create_slot=True)
    while_running(lambda o: LakeCapture(lake, o).run() and None, db,
                  "INSERT INTO t VALUES (3, 30, 'three')",
                  "ALTER TABLE t ADD COLUMN c text", "INSERT INTO t VALUES (4, 40, 'four', 'x')",
                  *older)
    assert (4, 40, "four", "x") in lake_rows(lake, T)["public.t"]
    assert_lake_is_database(lake, db)


@pytest.mark.parametrize("change", ["ALTER TABLE t RENAME COLUMN b TO c",
                                    "ALTER TABLE t DROP COLUMN b",
                                    "ALTER TABLE t ALTER COLUMN a TYPE text"])
def test_a_change_a_lake_table_cannot_follow_is_refused(spark, no_public_views, db, tmp_path,
                                                        change: str) -> None:
    lake = Lake(spark, tmp_path / "lake")
    to_lake(lake, db, create_slot=True)
    execute(db, "INSERT INTO a VALUES (1, 1)", "UPDATE t SET b = 'uno' WHERE id = 1")
    to_lake(lake, db)
    before = database_rows(db, TWO)
    frontier = lake.table("public.a").state().upper
    # A batch with a change from before it (so seen as a change of the stream's shape).
    execute(db, "INSERT INTO a VALUES (2, 2)", "UPDATE t SET a = 21 WHERE id = 2", change,
            "UPDATE t SET a = 11 WHERE id = 1")
    for _ in range(2):  # and again on a rerun: the capture stops there, writes nothing
        with pytest.raises(CaptureError, match=r"^table public\.t: its columns changed since "
                           r".*, from \(id.*, a.*, b.*\) to \(.*\): a lake "
                           r"table follows only columns added at the end"):
            to_lake(lake, db)
        assert lake_rows(lake, TWO) == before
        assert lake.table("public.a").state().upper == frontier


# -- log ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    ("ALTER TABLE t RENAME COLUMN b TO c",),
    ("ALTER TABLE t DROP COLUMN b", "ALTER TABLE t ADD COLUMN c text"),
    ("ALTER TABLE t ALTER COLUMN a TYPE bigint",),
    ("ALTER TABLE t ADD COLUMN c text",),
])
def test_a_change_of_a_logs_columns_is_refused(db, tmp_path, change: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    to_log(out, db, create_slot=True)
    execute(db, "INSERT INTO a VALUES (1, 1)", "UPDATE t SET b = 'uno' WHERE id = 1")
    to_log(out, db)
    before = {n: decoded(out / n, ("id", "a", "b") if n == "public.t" else ("id", "v"))
              for n in TWO}
    execute(db, "INSERT INTO a VALUES (2, 2)", "UPDATE t SET a = 21 WHERE id = 2", *change,
            "UPDATE t SET a = 11 WHERE id = 1")
    for _ in range(2):  # and again on a rerun, with nothing of the batch written
        with pytest.raises(CaptureError, match=r"^table public\.t: its columns changed since "
                           r".*, from \(id.*, a.*, b.*\) to \(.*\): a log keeps one schema; "
                           r"restart into a new --out directory$"):
            to_log(out, db)
        assert {n: decoded(out / n, ("id", "a", "b") if n == "public.t" else ("id", "v"))
                for n in TWO} == before


LOGGED = {n: ("id", "a", "b") if n == "public.t" else ("id", "v") for n in TWO}


@pytest.mark.parametrize("batch_seconds", [0.0, 30.0])  # a batch per transaction; one batch
@pytest.mark.parametrize("change", [
    ("ALTER TABLE t RENAME COLUMN b TO c",),
    ("ALTER TABLE t DROP COLUMN b", "ALTER TABLE t ADD COLUMN c text"),
])
def test_a_change_of_a_logs_columns_while_it_runs_is_refused(
        db, tmp_path, change: tuple[str, ...], batch_seconds: float) -> None:
    """The run started with the log's columns: the change is seen in the stream, in the
    batch of the rows from before it, or in a batch of its own. For the one batch the
    statements are one transaction: separate ones may be cut into batches at the stream's
    idle moments (a second without a message), which a loaded machine makes."""
    out = tmp_path / "out"
    to_log(out, db, create_slot=True)
    before = {n: decoded(out / n, c) for n, c in LOGGED.items()}
    statements = ("INSERT INTO a VALUES (1, 1)", "UPDATE t SET a = 21 WHERE id = 2", *change,
                  "UPDATE t SET a = 11 WHERE id = 1")
    if batch_seconds:  # one query string of several statements: one transaction
        statements = ("; ".join(statements),)
    with pytest.raises(CaptureError, match=r"^table public\.t: its columns changed since the "
                       r"capture started, from \(id integer, a integer, b text\) to \(id "
                       r"integer, a integer, c text\): a log keeps one schema"):
        while_running(lambda o: Capture(LogSink(out, o), o).run() and None, db, *statements,
                      batch_seconds=batch_seconds)
    after = {n: decoded(out / n, c) for n, c in LOGGED.items()}
    if batch_seconds:  # nothing of the batch written
        assert after == before
    else:  # the batches before the change's
        assert {n: rows for n, (rows, _) in after.items()} == {
            "public.a": Counter({(1, 1): 1}),
            "public.t": Counter({(1, 10, "one"): 1, (2, 21, "two"): 1})}
