"""Set-up SQL for the tests that use a PostgreSQL server."""

from __future__ import annotations


def execute(dsn: str, *statements: str) -> None:
    """Run `statements` on the database at `dsn`, each committed (set-up SQL of the tests)."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    finally:
        conn.close()
