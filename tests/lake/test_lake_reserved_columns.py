"""A data column named as one of the lake's own (`_time`, `_diff`): one `changelake: error:`
line naming it and what to do, exit status 2, no table made (it was an internal error:
Spark's "Reference `_time` is ambiguous"). In `ingest`, and in `capture postgres --lake`
(naming the table too): before the slot is made, or, for a column added while the capture
runs, before the batch that brings it is written."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.postgres import execute

CLI = [str(Path(sys.executable).parent / "changelake")]


def test_ingest_of_a_cdc_log_with_a_time_column_is_one_line(tmp_path: Path) -> None:
    feed = tmp_path / "t.jsonl"
    feed.write_text(
        '{"array":[{"data":{"id":1,"_time":5},"time":0,"diff":1}]}\n'
        '{"com.materialize.cdc.progress":{"lower":[0],"upper":[1],"counts":[{"time":0,'
        '"count":1}]}}\n')
    lake = tmp_path / "lake"
    done = subprocess.run([*CLI, "ingest", "--lake", str(lake), "--table", "t", "--key", "id",
                           "--master", "local[1]", str(feed)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "changelake: error: the input has a data column named '_time', a name the lake keeps "
        "for its own columns (_time, _diff, _bucket); rename the column at the source (or in "
        "the feed's schema) before ingesting it"]
    made = [p.name for p in (lake / "tables").rglob("*")] if (lake / "tables").exists() else []
    assert set(made) <= {"default", "t", "_lock"}  # no table: at most the writer's lock


# -- capture postgres ----------------------------------------------------------------------------

def _capture(spark, dsn: str, lake_dir: Path | str, slot: str, until_idle: float = 0.3):
    from changelake.capture.postgres.to_lake import CaptureOptions, LakeCapture
    from changelake.lake.catalog import Lake

    lake = Lake(spark, lake_dir)
    options = CaptureOptions(dsn, "p", slot, create_slot=True, until_idle=until_idle)
    return lake, lambda: LakeCapture(lake, options).run()


def _streaming(dsn: str, slot: str) -> bool:
    """Whether a capture streams from `slot` (its snapshot taken, the slot active)."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = c.fetchone()
    conn.close()
    return bool(row and row[0])


def _slots(dsn: str) -> list[str]:
    import psycopg2

    conn = psycopg2.connect(dsn)
    with conn.cursor() as c:
        c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = "
                  "current_database()")
        names = [r[0] for r in c.fetchall()]
    conn.close()
    return names


@pytest.mark.parametrize("column", ["_time", "_DIFF"])
def test_capture_of_a_table_with_a_time_column_is_one_line_before_the_slot(
        spark, pg_dsn: str, no_public_views, lake_root, column: str) -> None:
    """Refused before the slot is made (a lake that compares names case-insensitively, as
    Spark reads them): it had been refused only when the lake created the table, after the
    slot and its start marker, or (`_DIFF`) taken as a second `_diff`."""
    from changelake.capture.postgres.rows import CaptureError

    execute(pg_dsn, "CREATE TABLE fine (id int PRIMARY KEY)",
            f'CREATE TABLE odd (id int PRIMARY KEY, "{column}" bigint)',
            "INSERT INTO odd VALUES (1, 2)", "CREATE PUBLICATION p FOR TABLE fine, odd")
    lake, run = _capture(spark, pg_dsn, lake_root, "reserved")
    with pytest.raises(CaptureError) as refused:
        run()
    assert str(refused.value) == (
        f"table public.odd has a column named {column!r}, a name the lake keeps for its own "
        "columns (_time, _diff, _bucket): rename the column, capture the publication's other "
        "tables (--tables), or capture it into Materialize CDC logs (--out)")
    assert _slots(pg_dsn) == []
    assert not lake.exists("public.fine") and not lake.exists("public.odd")


def test_capture_refuses_a_time_column_added_while_it_runs(spark, pg_dsn: str,
                                                           no_public_views,
                                                           lake_root) -> None:
    """ADD COLUMN is the one change a lake table follows, but not of a lake's own name: the
    batch that brings it is refused, naming the table and column, before it is written."""
    from changelake.capture.postgres.rows import CaptureError

    execute(pg_dsn, "CREATE TABLE grows (id int PRIMARY KEY, v text)",
            "INSERT INTO grows VALUES (1, 'a')", "CREATE PUBLICATION p FOR TABLE grows")
    lake, run = _capture(spark, pg_dsn, lake_root, "grows", until_idle=60)
    failed: list[BaseException] = []

    def capture() -> None:
        try:
            run()
        except BaseException as error:  # looked at below
            failed.append(error)

    # While it runs: the stream brings the new column (`Sink.check_change`).
    thread = threading.Thread(target=capture)
    thread.start()
    deadline = time.monotonic() + 300
    while not (lake.exists("public.grows") and _streaming(pg_dsn, "grows")):
        assert thread.is_alive() and time.monotonic() < deadline, failed
        time.sleep(0.05)
    execute(pg_dsn, 'ALTER TABLE grows ADD COLUMN "_time" bigint',
            "INSERT INTO grows VALUES (2, 'b', 7)")
    thread.join()
    # A rerun: the catalog has it from the start (`Sink.check`).
    with pytest.raises(CaptureError) as again:
        run()
    for error in (*failed, again.value):
        assert isinstance(error, CaptureError), error
        assert str(error).startswith("table public.grows has a column named '_time', a name "
                                     "the lake keeps for its own columns"), error
        assert "\n" not in str(error)
    # The batch was not written: the lake table holds its snapshot, in its columns.
    current = lake.table("public.grows").current()
    assert current.columns == ["id", "v"]
    assert [tuple(r) for r in current.collect()] == [(1, "a")]
