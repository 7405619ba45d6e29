"""The embedded PostgreSQL in a folder whose name a shell would read: a space, `$(...)` and
backquotes. pg_ctl starts the server through `/bin/sh -c`; no part of the name may run, and
the server must start there (`demo --workdir '/tmp/a b'`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psycopg2

from changelake.capture.postgres.server import EmbeddedPostgres


def test_a_folder_name_with_shell_syntax_starts_the_server_and_runs_nothing() -> None:
    # not under pytest's private (mode 700) root: as root, the server's account must reach it
    root = Path(tempfile.mkdtemp(prefix="changelake-test-pgpath-"))
    root.chmod(0o777)  # so that a `touch` run as the server's account would succeed
    folder = root / "a b $(touch PLANTED) `touch PLANTED2`"
    server = EmbeddedPostgres(folder)
    try:
        server.start()
        conn = psycopg2.connect(server.dsn)
        with conn, conn.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            assert cursor.fetchone()[0] == str(folder / "data")
        conn.close()
        server.stop()
        server.start()  # a second start, of the cluster the first made
        server.stop()
        made = sorted(p.name for p in root.rglob("PLANTED*"))
        cwd_made = [p for p in ("PLANTED", "PLANTED2") if os.path.exists(p)]
        assert made == [] and cwd_made == []
        assert (folder / "server.log").is_file()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
