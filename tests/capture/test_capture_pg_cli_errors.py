"""`changelake capture postgres` refuses what it cannot capture with exit status 2 and one line
naming the object: a DSN libpq cannot parse, a slot name PostgreSQL refuses or a slot another
capture streams from, a missing publication or slot, a slot dropped between two runs (the lake
holds a capture, the slot is gone), a table without a primary key or replica identity. What
the database alone refuses is refused before the lake opens: no Spark, no lake directory.
Other runs are a Spark start-up each, so only the first test is in the default run."""

from __future__ import annotations

import subprocess

import psycopg2
import pytest

from tests.support.pg_workload import CLI, drop_slot


def run(pg_dsn: str, lake, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "--lake", str(lake), "--master", "local[1]", "--dsn", pg_dsn,
                           *args], capture_output=True, timeout=600)


def refused(done: subprocess.CompletedProcess, message: str) -> None:
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    assert lines[-1].startswith("changelake: error: ") and message in lines[-1], lines[-1]


@pytest.fixture
def sql(pg_dsn: str):
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
        c.execute("CREATE PUBLICATION p FOR TABLE t")
        yield c
    conn.close()


def test_a_missing_publication_is_named(pg_dsn, sql, tmp_path) -> None:
    refused(run(pg_dsn, tmp_path / "lake", "--publication", "nope", "--slot", "s",
                "--create-slot"), "publication 'nope' does not exist in database")
    assert not (tmp_path / "lake").exists()  # refused before the lake (and Spark) started


@pytest.mark.slow
def test_a_missing_slot_and_a_table_without_key_are_named(pg_dsn, sql, tmp_path) -> None:
    refused(run(pg_dsn, tmp_path / "lake", "--publication", "p", "--slot", "nope"),
            "replication slot 'nope' does not exist (pass --create-slot")
    sql.execute("CREATE TABLE loose (a int, b text)")
    sql.execute("ALTER PUBLICATION p ADD TABLE loose")
    refused(run(pg_dsn, tmp_path / "other", "--publication", "p", "--slot", "s",
                "--create-slot"), "table public.loose has no primary key or replica identity")
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_a_slot_dropped_between_runs_is_named(pg_dsn, sql, tmp_path) -> None:
    lake = tmp_path / "lake"
    first = run(pg_dsn, lake, "--publication", "p", "--slot", "cli_dropped", "--create-slot",
                "--until-idle", "0.5")
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    drop_slot(pg_dsn, "cli_dropped")
    refused(run(pg_dsn, lake, "--publication", "p", "--slot", "cli_dropped", "--create-slot"),
            "tables public.t already hold a capture, but replication slot 'cli_dropped' does "
            "not exist (dropped since their last run")
    sql.execute("SELECT count(*) FROM pg_replication_slots")
    assert sql.fetchone()[0] == 0  # and no new slot was made


def test_a_dsn_libpq_cannot_parse_and_a_slot_name_postgres_refuses_are_named(pg_dsn, sql,
                                                                             tmp_path) -> None:
    """Both had been internal errors (exit 1); the bad slot name also left a start marker."""
    lake = tmp_path / "lake"
    refused(subprocess.run([*CLI, "--lake", str(lake), "--dsn", "not a dsn ===",
                            "--publication", "p", "--slot", "s"], capture_output=True,
                           timeout=600), "cannot connect to PostgreSQL (a DSN libpq cannot parse)")
    refused(run(pg_dsn, lake, "--publication", "p", "--slot", "bad-slot-Name", "--create-slot"),
            "replication slot name 'bad-slot-Name' is not valid")
    assert not lake.exists()


def test_a_slot_another_capture_streams_from_is_named(pg_dsn, sql) -> None:
    from changelake.capture.postgres.source import Source, SourceError

    with Source(pg_dsn, "p", "busy") as first:
        first.open_slot(create=True)
        next(first.stream(0))  # streaming: the slot is active
        with Source(pg_dsn, "p", "busy") as second:
            second.open_slot(create=False)
            with pytest.raises(SourceError, match="replication slot 'busy' is in use by another "
                                                  "process"):
                next(second.stream(0))
