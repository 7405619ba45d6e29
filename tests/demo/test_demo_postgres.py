"""The PostgreSQL part of the demo against the embedded server: its checks pass on a capture
that ran while the workload did, and fail when the database and the lake differ."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest

from changelake.demo.postgres import capture_in_process, check, run_postgres_capture


@pytest.mark.slow
@pytest.mark.usefixtures("no_public_views")
def test_postgres_demo_checks_pass_and_can_fail(spark, pg_dsn: str, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    demo = run_postgres_capture(pg_dsn, lake, capture_in_process(spark), seed=3,
                                transactions=160)
    counts = demo.counts
    assert counts.transfers and counts.unchanged_bodies and counts.truncates == 1
    assert counts.streamed_rows >= 3000
    checks = check(spark, pg_dsn, lake, times=5)
    failed = [c.name for c in checks if not c.passed]
    assert not failed and len(checks) == 6
    # A change the capture has not seen: the table check must say so.
    conn = psycopg2.connect(pg_dsn)
    with conn, conn.cursor() as cursor:
        cursor.execute("UPDATE accounts SET owner = 'someone else' WHERE id = 1")
    conn.close()
    failed = [c.name for c in check(spark, pg_dsn, lake, times=3) if not c.passed]
    assert len(failed) == 1 and failed[0].startswith("public.accounts")


def test_the_demo_refuses_a_database_holding_its_objects_and_cleans_up(pg_dsn: str) -> None:
    """`changelake demo --dsn` on a user's database: it never touches their objects, and it
    leaves no slot behind, the capture's nor Debezium's (a slot holds the server's WAL
    forever)."""
    from changelake.demo.postgres import DemoDatabaseError, clean_up, prepare

    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as cursor:
        cursor.execute("CREATE TABLE ledger (mine int)")
        with pytest.raises(DemoDatabaseError, match="already has table ledger"):
            prepare(pg_dsn)
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname = 'accounts'")
        assert cursor.fetchone()[0] == 0  # nothing was created
        cursor.execute("DROP TABLE ledger")
        prepare(pg_dsn)
        cursor.execute("SELECT pg_create_logical_replication_slot('changelake_demo', "
                       "'pgoutput')")
        # Debezium's, of the demo's Debezium part, made by Debezium itself.
        cursor.execute("SELECT pg_create_logical_replication_slot('changelake_demo_dbz', "
                       "'pgoutput')")
        with pytest.raises(DemoDatabaseError, match="publication changelake_demo, "
                           "replication slot changelake_demo, replication slot "
                           "changelake_demo_dbz, table accounts"):
            prepare(pg_dsn)
        clean_up(pg_dsn, tables=False)
        cursor.execute("SELECT count(*) FROM pg_replication_slots")
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname = 'accounts'")
        assert cursor.fetchone()[0] == 1
        clean_up(pg_dsn, tables=True)
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname IN ('accounts', 'ledger')")
        assert cursor.fetchone()[0] == 0
    conn.close()
