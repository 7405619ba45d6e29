"""A published table whose schema or table name holds a dot (`"a.b".c`, `a."b.c"`) has no
`schema.table` name of its own: `capture postgres` refuses it with one line naming it, before
anything is made, where it had captured it under another table's name (or failed inside)."""

from __future__ import annotations

import psycopg2
import pytest
from click.testing import CliRunner

from changelake.capture.postgres.source import Source, SourceError
from changelake.cli import main


@pytest.mark.parametrize(("create", "shown"), [
    ('CREATE SCHEMA "a.b"; CREATE TABLE "a.b".c (id int PRIMARY KEY)', '"a.b"."c"'),
    ('CREATE SCHEMA a; CREATE TABLE a."b.c" (id int PRIMARY KEY)', '"a"."b.c"'),
])
def test_a_dotted_name_is_refused(pg_dsn: str, tmp_path, create: str, shown: str) -> None:
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute(create)
        c.execute("CREATE PUBLICATION p FOR ALL TABLES")
    conn.close()
    with pytest.raises(SourceError, match=f"table {shown} of publication 'p' has a dot"):
        Source(pg_dsn, "p", "s")
    result = CliRunner().invoke(main, ["capture", "postgres", "--out", str(tmp_path / "out"),
                                       "--dsn", pg_dsn, "--publication", "p", "--slot", "s",
                                       "--create-slot"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("changelake: error: table ") and "has a dot" in line
    assert not (tmp_path / "out").exists()
    conn = psycopg2.connect(pg_dsn)
    with conn.cursor() as c:
        c.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's'")
        assert c.fetchone()[0] == 0
    conn.close()
